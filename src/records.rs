//! Per-image records (first seen, last used, size, pinned, names) and how a
//! snapshot of the runtime updates them, following the kubelet's rules:
//!
//! - every listed container, in any state, keeps its image in use and moves
//!   the image's last-used time to now;
//! - an image seen for the first time gets first seen = now, and counts as
//!   last used when first seen until a container uses it;
//! - records of images the runtime no longer lists are dropped.
//!
//! Records are persisted by [`crate::state`]; a record loaded from disk is
//! marked `from_history` so the planner knows its times were observed, not
//! invented at start-up.

use std::collections::HashMap;
use std::time::SystemTime;

use crate::cri::{Container, Image};
use crate::reference;

/// What imagegc knows about one image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub first_seen: SystemTime,
    pub last_used: SystemTime,
    pub size: u64,
    pub pinned: bool,
    pub tags: Vec<String>,
    pub digests: Vec<String>,
    /// True when the record came from the state file (or survived a cycle
    /// that was itself loaded from it): its times span a previous process.
    pub from_history: bool,
}

/// All records, keyed by image id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Records {
    map: HashMap<String, Record>,
}

impl Records {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn from_map(map: HashMap<String, Record>) -> Self {
        Records { map }
    }

    pub fn get(&self, id: &str) -> Option<&Record> {
        self.map.get(id)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Record)> {
        self.map.iter()
    }

    /// Updates the records from a full listing of images and containers.
    /// Returns the ids of images seen for the first time.
    pub fn observe(&mut self, images: &[Image], containers: &[Container], now: SystemTime) -> Vec<String> {
        let mut new_ids = Vec::new();
        let in_use = InUse::new(images, containers);
        let mut listed: HashMap<&str, ()> = HashMap::with_capacity(images.len());
        for image in images {
            listed.insert(image.id.as_str(), ());
            let used = in_use.is_used(&image.id);
            let record = self.map.entry(image.id.clone()).or_insert_with(|| {
                new_ids.push(image.id.clone());
                Record {
                    first_seen: now,
                    last_used: now,
                    size: image.size,
                    pinned: image.pinned,
                    tags: Vec::new(),
                    digests: Vec::new(),
                    from_history: false,
                }
            });
            if used {
                record.last_used = record.last_used.max(now);
            }
            record.size = image.size;
            record.pinned = image.pinned;
            if record.tags != image.repo_tags {
                record.tags.clone_from(&image.repo_tags);
            }
            if record.digests != image.repo_digests {
                record.digests.clone_from(&image.repo_digests);
            }
        }
        self.map.retain(|id, _| listed.contains_key(id.as_str()));
        new_ids
    }

    /// Forgets an image (after it was removed).
    pub fn remove(&mut self, id: &str) {
        self.map.remove(id);
    }

    /// Marks images used now, from a container listing or events between
    /// cycles; images without a record are left for the next full listing.
    pub fn mark_used<'a>(&mut self, ids: impl IntoIterator<Item = &'a str>, now: SystemTime) {
        for id in ids {
            if let Some(record) = self.map.get_mut(id) {
                record.last_used = record.last_used.max(now);
            }
        }
    }
}

/// Which images are referenced by which containers.
///
/// A container names its image in up to three places (`image_id`,
/// `image_ref`, the spec `image`); each is matched against every image's id,
/// tags and digests, with and without normalization. Any match counts: when
/// in doubt, an image is in use.
#[derive(Debug, Default)]
pub struct InUse {
    /// Image id → ids of the containers that use it.
    by_image: HashMap<String, Vec<String>>,
}

impl InUse {
    pub fn new(images: &[Image], containers: &[Container]) -> Self {
        let index = ReferenceIndex::new(images);
        let mut by_image: HashMap<String, Vec<String>> = HashMap::new();
        for container in containers {
            let mut matched: Vec<&str> = Vec::new();
            for reference in [&container.image_id, &container.image_ref, &container.image] {
                index.lookup(reference, &mut matched);
            }
            matched.sort_unstable();
            matched.dedup();
            for image_id in matched {
                by_image
                    .entry(image_id.to_string())
                    .or_default()
                    .push(container.id.clone());
            }
        }
        InUse { by_image }
    }

    pub fn is_used(&self, image_id: &str) -> bool {
        self.by_image.contains_key(image_id)
    }

    /// The containers using an image (empty when unused).
    pub fn containers(&self, image_id: &str) -> &[String] {
        self.by_image.get(image_id).map_or(&[], Vec::as_slice)
    }

    pub fn image_ids(&self) -> impl Iterator<Item = &str> {
        self.by_image.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.by_image.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_image.is_empty()
    }
}

/// Every way an image can be named, mapped to the image ids it names.
pub struct ReferenceIndex<'a> {
    names: HashMap<String, Vec<&'a str>>,
}

impl<'a> ReferenceIndex<'a> {
    pub fn new(images: &'a [Image]) -> Self {
        let mut names: HashMap<String, Vec<&'a str>> = HashMap::with_capacity(images.len() * 3);
        for image in images {
            let id = image.id.as_str();
            let mut add = |name: String| {
                let ids = names.entry(name).or_default();
                if !ids.contains(&id) {
                    ids.push(id);
                }
            };
            if !id.is_empty() {
                add(id.to_string());
                add(reference::bare_id(id).to_string());
            }
            for name in image.repo_tags.iter().chain(&image.repo_digests) {
                add(name.clone());
                add(reference::normalize(name));
            }
        }
        ReferenceIndex { names }
    }

    /// Appends the ids of the images `reference` names.
    pub fn lookup(&self, reference: &str, out: &mut Vec<&'a str>) {
        if reference.is_empty() {
            return;
        }
        for key in [reference, reference::bare_id(reference)] {
            if let Some(ids) = self.names.get(key) {
                out.extend(ids);
            }
        }
        if let Some(ids) = self.names.get(&reference::normalize(reference)) {
            out.extend(ids);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::time::Duration;

    pub fn image(id: &str, size: u64) -> Image {
        Image {
            id: id.to_string(),
            repo_tags: vec![format!("docker.io/library/{id}:latest")],
            repo_digests: Vec::new(),
            size,
            pinned: false,
        }
    }

    pub fn container(id: &str, image_ref: &str) -> Container {
        Container {
            id: id.to_string(),
            image: image_ref.to_string(),
            image_ref: image_ref.to_string(),
            ..Default::default()
        }
    }

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    // KUBELET.md scenario 1: initial detection.
    #[test]
    fn initial_detection() {
        let images = [image("0", 1024), image("1", 2048), image("2", 2048)];
        let containers = [container("c1", "1"), container("c2", "2")];
        let mut records = Records::new();
        records.observe(&images, &containers, t(0));
        assert_eq!(records.len(), 3);
        for id in ["0", "1", "2"] {
            let r = records.get(id).unwrap();
            assert_eq!(r.first_seen, t(0));
            assert_eq!(r.last_used, t(0));
        }
        let in_use = InUse::new(&images, &containers);
        assert!(!in_use.is_used("0"));
        assert!(in_use.is_used("1") && in_use.is_used("2"));
    }

    // Scenario 2: a new image appears in a later pass.
    #[test]
    fn new_image_gets_its_own_first_seen() {
        let mut records = Records::new();
        records.observe(&[image("0", 1)], &[], t(0));
        records.observe(&[image("0", 1), image("1", 1)], &[], t(60));
        assert_eq!(records.get("0").unwrap().first_seen, t(0));
        assert_eq!(records.get("1").unwrap().first_seen, t(60));
    }

    // Scenario 3: a container goes away; last used stays.
    #[test]
    fn last_used_stays_when_the_container_goes() {
        let mut records = Records::new();
        let images = [image("0", 1)];
        records.observe(&images, &[container("c", "0")], t(0));
        records.observe(&images, &[container("c", "0")], t(10));
        records.observe(&images, &[], t(20));
        assert_eq!(records.get("0").unwrap().last_used, t(10));
        assert_eq!(records.get("0").unwrap().first_seen, t(0));
    }

    // Scenario 4: an image disappears; its record is dropped.
    #[test]
    fn records_of_vanished_images_are_dropped() {
        let mut records = Records::new();
        records.observe(&[image("0", 1), image("1", 1)], &[], t(0));
        records.observe(&[image("1", 1)], &[], t(10));
        assert!(records.get("0").is_none());
        assert!(records.get("1").is_some());
    }

    #[test]
    fn containers_match_by_id_ref_digest_or_familiar_tag() {
        let id = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
        let img = Image {
            id: id.to_string(),
            repo_tags: vec!["docker.io/library/nginx:1.27".to_string()],
            repo_digests: vec![
                "docker.io/library/nginx@sha256:2222222222222222222222222222222222222222222222222222222222222222"
                    .to_string(),
            ],
            size: 1,
            pinned: false,
        };
        let images = [img];
        let by = |c: Container| InUse::new(&images, &[c]).is_used(id);
        assert!(by(Container {
            image_id: id.to_string(),
            ..Default::default()
        }));
        assert!(by(Container {
            image_ref: id.to_string(),
            ..Default::default()
        }));
        // CRI-O style bare id.
        assert!(by(Container {
            image_ref: reference::bare_id(id).to_string(),
            ..Default::default()
        }));
        // CRI-O style digest in image_ref.
        assert!(by(Container {
            image_ref:
                "docker.io/library/nginx@sha256:2222222222222222222222222222222222222222222222222222222222222222"
                    .to_string(),
            ..Default::default()
        }));
        // The familiar tag in the spec.
        assert!(by(Container {
            image: "nginx:1.27".to_string(),
            ..Default::default()
        }));
        assert!(!by(Container {
            image: "nginx:1.28".to_string(),
            image_ref: "sha256:3333333333333333333333333333333333333333333333333333333333333333".to_string(),
            ..Default::default()
        }));
    }

    #[test]
    fn mark_used_moves_last_used_forward_only() {
        let mut records = Records::new();
        records.observe(&[image("0", 1)], &[], t(100));
        records.mark_used(["0", "unknown"], t(200));
        assert_eq!(records.get("0").unwrap().last_used, t(200));
        records.mark_used(["0"], t(150));
        assert_eq!(records.get("0").unwrap().last_used, t(200));
        assert_eq!(records.len(), 1);
    }
}
