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

use std::borrow::Cow;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
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
pub struct InUse<'a> {
    /// Image id → ids of the containers that use it.
    by_image: HashMap<&'a str, Vec<&'a str>>,
    /// Ids of the images the runtime's sandbox image reference names.
    sandbox: Vec<&'a str>,
}

impl<'a> InUse<'a> {
    pub fn new(images: &'a [Image], containers: &'a [Container]) -> Self {
        Self::with_sandbox(images, containers, None)
    }

    /// The same, also noting which images the runtime's sandbox (pause)
    /// image reference names.
    pub fn with_sandbox(images: &'a [Image], containers: &'a [Container], sandbox: Option<&'a str>) -> Self {
        // The sandbox reference is one more owner, after the containers.
        let sandbox_owner = containers.len();
        let references = ReferenceSet::new(
            containers
                .iter()
                .enumerate()
                .flat_map(|(i, c)| {
                    [
                        (i, c.image_id.as_str()),
                        (i, c.image_ref.as_str()),
                        (i, c.image.as_str()),
                    ]
                })
                .chain(sandbox.map(|s| (sandbox_owner, s))),
        );
        let mut in_use = InUse::default();
        let mut owners = Vec::new();
        for image in images {
            owners.clear();
            references.owners(image, &mut owners);
            if owners.is_empty() {
                continue;
            }
            // In listing order, each container once.
            owners.sort_unstable();
            owners.dedup();
            if owners.last() == Some(&sandbox_owner) {
                owners.pop();
                if !in_use.sandbox.contains(&image.id.as_str()) {
                    in_use.sandbox.push(&image.id);
                }
            }
            if owners.is_empty() {
                continue;
            }
            let ids = owners.iter().map(|&i| containers[i].id.as_str());
            match in_use.by_image.entry(&image.id) {
                Entry::Vacant(entry) => {
                    entry.insert(ids.collect());
                }
                // The same id listed twice: the union of both.
                Entry::Occupied(mut entry) => {
                    let known = entry.get_mut();
                    known.extend(ids);
                    known.sort_unstable();
                    known.dedup();
                }
            }
        }
        in_use
    }

    pub fn is_used(&self, image_id: &str) -> bool {
        self.by_image.contains_key(image_id)
    }

    /// True when the sandbox reference given to [`InUse::with_sandbox`]
    /// names this image.
    pub fn is_sandbox(&self, image_id: &str) -> bool {
        self.sandbox.contains(&image_id)
    }

    /// The containers using an image (empty when unused).
    pub fn containers(&self, image_id: &str) -> &[&'a str] {
        self.by_image.get(image_id).map_or(&[], Vec::as_slice)
    }

    pub fn image_ids(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.by_image.keys().copied()
    }

    pub fn len(&self) -> usize {
        self.by_image.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_image.is_empty()
    }
}

/// The ids of the images any of `references` names (each once, in listing
/// order), matched the way [`InUse`] matches containers' references.
pub fn images_named<'a, 'r>(images: &'a [Image], references: impl IntoIterator<Item = &'r str>) -> Vec<&'a str> {
    let references = ReferenceSet::new(references.into_iter().map(|r| (0, r)));
    let mut owners = Vec::new();
    let mut ids: Vec<&'a str> = Vec::new();
    for image in images {
        owners.clear();
        references.owners(image, &mut owners);
        if !owners.is_empty() && !ids.contains(&image.id.as_str()) {
            ids.push(&image.id);
        }
    }
    ids
}

/// References to images made by some owners (containers, numbered), in
/// every form that can match: as written, without `sha256:`, normalized.
/// An image is named by a reference when one of its own forms (its id
/// without `sha256:`, each tag and digest as listed and normalized) is
/// among them.
///
/// The set is built from the references, not from the images: a node runs
/// far fewer containers than it holds images, so matching every image is a
/// few lookups in a small table rather than inserting every image's names
/// into a large one.
struct ReferenceSet<'a> {
    forms: HashMap<Cow<'a, str>, Owners>,
}

/// The owners of one form: nearly always one, kept without a `Vec`.
#[derive(Debug)]
struct Owners {
    first: usize,
    more: Vec<usize>,
}

impl<'a> ReferenceSet<'a> {
    /// From `(owner, reference)` pairs, owners in ascending order; empty
    /// references are skipped.
    fn new(references: impl Iterator<Item = (usize, &'a str)>) -> Self {
        let mut forms: HashMap<Cow<'a, str>, Owners> = HashMap::new();
        for (owner, reference) in references {
            if reference.is_empty() {
                continue;
            }
            let mut add = |form: Cow<'a, str>| match forms.entry(form) {
                Entry::Vacant(entry) => {
                    entry.insert(Owners {
                        first: owner,
                        more: Vec::new(),
                    });
                }
                Entry::Occupied(mut entry) => {
                    let owners = entry.get_mut();
                    if *owners.more.last().unwrap_or(&owners.first) != owner {
                        owners.more.push(owner);
                    }
                }
            };
            let bare = reference::bare_id(reference);
            let normalized = reference::normalized(reference);
            add(Cow::Borrowed(reference));
            if bare != reference {
                add(Cow::Borrowed(bare));
            }
            if normalized != reference && normalized != bare {
                add(normalized);
            }
        }
        ReferenceSet { forms }
    }

    /// Appends the owners of the references that name `image` (possibly
    /// more than once).
    fn owners(&self, image: &Image, out: &mut Vec<usize>) {
        if self.forms.is_empty() {
            return;
        }
        let mut check = |form: &str| {
            if let Some(owners) = self.forms.get(form) {
                out.push(owners.first);
                out.extend(&owners.more);
            }
        };
        if !image.id.is_empty() {
            check(reference::bare_id(&image.id));
        }
        for name in image.repo_tags.iter().chain(&image.repo_digests) {
            check(name);
            let normalized = reference::normalized(name);
            if normalized != name.as_str() {
                check(&normalized);
            }
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
    fn a_tag_moved_to_a_newer_image_keeps_both_in_use() {
        let id = |n: u8| format!("sha256:{}", n.to_string().repeat(64));
        let mut old = image("old", 1);
        old.id = id(1);
        old.repo_tags.clear();
        let mut new = image("new", 1);
        new.id = id(2);
        new.repo_tags = vec!["docker.io/library/app:1".to_string()];
        let images = [old, new, image("other", 1)];
        // Created from `app:1` when it was the old image; the tag has moved since.
        let containers = [Container {
            id: "c".to_string(),
            image: "app:1".to_string(),
            image_ref: id(1),
            ..Default::default()
        }];
        let in_use = InUse::new(&images, &containers);
        assert_eq!(in_use.containers(&id(1)), ["c"]);
        assert_eq!(in_use.containers(&id(2)), ["c"]);
        assert!(!in_use.is_used("other"));
        assert_eq!(in_use.len(), 2);
    }

    #[test]
    fn the_sandbox_reference_is_noted_apart_from_containers() {
        let images = [image("pause", 1), image("app", 1)];
        let containers = [container("c", "app")];
        let in_use = InUse::with_sandbox(&images, &containers, Some("pause"));
        assert!(in_use.is_sandbox("pause") && !in_use.is_used("pause"));
        assert!(in_use.is_used("app") && !in_use.is_sandbox("app"));
        // The same image listed twice: containers from both listings, once each.
        let images = [image("app", 1), image("app", 1)];
        let containers = [container("c1", "app"), container("c2", "docker.io/library/app:latest")];
        assert_eq!(InUse::new(&images, &containers).containers("app"), ["c1", "c2"]);
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
