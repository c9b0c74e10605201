//! Room before the pull: a pod bound to the node that names an image the
//! node does not have is a pull the kubelet is about to make. Its likely
//! size is what the node's earlier images of the same repository took (the
//! previous tags of a workload that rolls out a new one); when that pull
//! would take the image filesystem past the kubelet's eviction line,
//! imagegc frees the room first (see [`super::Headroom`]: the thresholds in
//! force move down by it). Nothing waits on this: the kubelet pulls as it
//! always does.
//!
//! A pull is made room for once: while its blobs arrive the image is still
//! not listed, and counting it again would remove images for the bytes it
//! already brought.

use std::collections::HashMap;
use std::time::SystemTime;

use serde::Serialize;

use crate::model::matching;

use crate::model::Image;
use crate::model::reference;
use crate::policy::footprint::{permille_of, times_permille};
use crate::policy::{DiskFootprint, Protections};

/// How many repositories [`RepoSizes`] remembers: a node that has seen more
/// forgets the one seen longest ago (about 100 bytes each).
pub const MAX_REPOSITORIES: usize = 4096;

/// The size of the largest image of each repository the node has had, by
/// its normalized repository (`docker.io/library/nginx`).
#[derive(Debug, Clone, Default)]
pub struct RepoSizes {
    by_repository: HashMap<String, PullSize>,
}

/// What a coming pull is sized by: an image of the same repository the
/// node had, or the manifest its registry gave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PullSize {
    /// The node's image's tag, as listed; for a manifest, the reference
    /// itself.
    pub tag: String,
    /// Its reported size (for a manifest, what containerd reports once
    /// the image is pulled: config and layers as stored).
    pub size_bytes: u64,
    /// When it was first seen, or the manifest read.
    #[serde(serialize_with = "crate::time::serialize")]
    pub at: SystemTime,
    /// Where the size comes from.
    pub from: SizedBy,
    /// For a manifest, the bytes it gives (what the runtime reports at
    /// least: layers never take less than their compressed size), where
    /// [`PullSize::size_bytes`] is the estimate scaled by the compression
    /// this node's pulls showed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manifest_bytes: Option<u64>,
}

/// Where a coming pull's size comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SizedBy {
    /// The node's largest image of the same repository.
    History,
    /// The registry's manifest (`kubernetes.registry_manifests`).
    Manifest,
}

impl PullSize {
    /// What `plan` and the logs say of it: "like registry.test/app:1" or
    /// "by its registry's manifest".
    pub fn says(&self) -> String {
        match self.from {
            SizedBy::History => format!("like {}", self.tag),
            SizedBy::Manifest => "by its registry's manifest".to_owned(),
        }
    }
}

impl RepoSizes {
    /// Notes an image of `size` bytes tagged `tags`, first seen `at`: each
    /// tag's repository keeps the larger of what it had and this.
    pub fn note<'t>(&mut self, tags: impl IntoIterator<Item = &'t str>, size: u64, at: SystemTime) {
        for tag in tags {
            let Some(repository) = reference::repository_of(tag) else {
                continue;
            };
            let seen = PullSize {
                tag: tag.to_owned(),
                size_bytes: size,
                at,
                from: SizedBy::History,
                manifest_bytes: None,
            };
            match self.by_repository.get_mut(&repository) {
                Some(known) if known.size_bytes >= size => {}
                Some(known) => *known = seen,
                None => {
                    if self.by_repository.len() >= MAX_REPOSITORIES {
                        self.forget_oldest();
                    }
                    self.by_repository.insert(repository, seen);
                }
            }
        }
    }

    /// Notes every tag of `image`, first seen `at`.
    pub fn note_image(&mut self, image: &Image, at: SystemTime) {
        self.note(image.repo_tags.iter(), image.size, at);
    }

    /// The largest image of the repository `reference` names, when the
    /// node had one.
    pub fn of(&self, reference: &str) -> Option<&PullSize> {
        self.by_repository.get(&reference::repository_of(reference)?)
    }

    /// How many repositories are remembered.
    pub fn len(&self) -> usize {
        self.by_repository.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.by_repository.is_empty()
    }

    fn forget_oldest(&mut self) {
        if let Some(oldest) = self
            .by_repository
            .iter()
            .min_by_key(|(_, seen)| seen.at)
            .map(|(repository, _)| repository.clone())
        {
            self.by_repository.remove(&oldest);
        }
    }
}

/// A pull the kubelet is about to make: an image a pod bound to the node
/// names and the node does not have.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ComingPull {
    /// The image, as the pod names it.
    pub image: String,
    /// The pod, `namespace/name`.
    pub pod: String,
    /// What the node's largest image of the same repository was, when it
    /// had one: the estimate of this pull's size.
    pub like: Option<PullSize>,
}

impl ComingPull {
    /// What the pull will likely take on disk: its repository's largest
    /// image, by `footprint`; 0 when the node never had one.
    pub fn bytes_on_disk(&self, footprint: DiskFootprint) -> u64 {
        self.like.as_ref().map_or(0, |seen| footprint.on_disk(seen.size_bytes))
    }

    /// The least the pull can take on disk: what its estimate is, or for a
    /// manifest, its bytes uncompressed by nothing.
    pub fn least_on_disk(&self, footprint: DiskFootprint) -> u64 {
        self.like.as_ref().map_or(0, |seen| {
            footprint.on_disk(seen.manifest_bytes.unwrap_or(seen.size_bytes).min(seen.size_bytes))
        })
    }
}

/// What a runtime reports for an image, per byte its registry's manifest
/// gives (config, layers as stored, manifests: compressed). containerd
/// reports its compressed content: the same. CRI-O and cri-dockerd report
/// the unpacked layers they store: the manifest's bytes times the layers'
/// compression ratio, 2.6 at the median of Docker Hub's layers (Zhao et
/// al., 2019), until this node's own pulls show theirs: each image a
/// manifest sized, once it arrives, moves the ratio halfway to what it
/// showed. [`DiskFootprint`] then gives what the reported size takes on
/// disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ManifestScale {
    /// Reported bytes per manifest byte, in thousandths.
    permille: u64,
}

/// The median compression ratio of Docker Hub's layers, in thousandths.
const MEDIAN_COMPRESSION_PERMILLE: u64 = 2_600;

/// The most a pull may show (8 reported bytes per manifest byte): text
/// compresses about that well, and a wrong match must not make every
/// manifest look huge.
const SCALE_CAP_PERMILLE: u64 = 8_000;

impl ManifestScale {
    /// The ratio for a runtime whose footprint is `footprint` (see
    /// [`DiskFootprint::reports_compressed`]).
    pub fn for_footprint(footprint: DiskFootprint) -> Self {
        let permille = if footprint.reports_compressed() {
            1_000
        } else {
            MEDIAN_COMPRESSION_PERMILLE
        };
        ManifestScale { permille }
    }

    /// An image its manifest gave `manifest` bytes arrived, reported at
    /// `reported`: the ratio moves halfway to what it showed.
    pub fn learn(&mut self, manifest: u64, reported: u64) {
        let Some(seen) = permille_of(reported, manifest) else {
            return;
        };
        self.permille = (self.permille + seen.clamp(1_000, SCALE_CAP_PERMILLE)) / 2;
    }

    /// What an image its manifest gives `manifest` bytes will be reported at.
    pub fn reported(&self, manifest: u64) -> u64 {
        times_permille(manifest, self.permille)
    }

    /// Reported bytes per manifest byte.
    pub fn factor(&self) -> f64 {
        self.permille as f64 / 1000.0
    }
}

impl Default for ManifestScale {
    fn default() -> Self {
        ManifestScale::for_footprint(DiskFootprint::default())
    }
}

/// The pulls `protections` (the images the pods bound to the node name)
/// imply: each image named that none of `images` is, once, with its first
/// pod. Image ids a pod's status reports are not pulls (the image it ran),
/// nor are images no pod will pull (`imagePullPolicy: Never`, or a pod that
/// ended).
pub fn coming_pulls(images: &[Image], protections: &Protections, sizes: &RepoSizes) -> Vec<ComingPull> {
    if protections.references.is_empty() {
        return Vec::new();
    }
    let references: Vec<&str> = protections
        .references
        .iter()
        .map(|(r, _)| r.as_str())
        .filter(|r| !reference::is_id(r) && !protections.never_pulled.contains(*r))
        .collect();
    let mut coming: Vec<ComingPull> = Vec::new();
    for place in matching::naming_none(images, &references) {
        let image = references[place];
        if coming.iter().any(|c| c.image == image) {
            continue;
        }
        let pod = protections
            .references
            .iter()
            .find(|(r, _)| r == image)
            .map_or_else(String::new, |(_, pod)| pod.clone());
        coming.push(ComingPull {
            image: image.to_owned(),
            pod,
            like: sizes.of(image).cloned(),
        });
    }
    coming
}

/// Which coming pulls room can be made for (see [`that_fit`]), and what
/// they take.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PullRoom {
    /// The pulls that fit once images are removed (or already do), in
    /// their order; pulls not sized yet are among them, at 0 bytes.
    pub fit: Vec<ComingPull>,
    /// The pulls that would not fit above the kubelet's eviction line even
    /// with every removable image gone: no room is made for them.
    pub cannot_fit: Vec<ComingPull>,
    /// The bytes on disk room is made for: the pulls that fit, and what
    /// the pulls room was made for before still have to bring.
    pub bytes: u64,
}

/// Which of `coming` room can be made for: `room` is what the image
/// filesystem can have available above the kubelet's eviction line once
/// every removable image is gone (see [`room_above_line`]), less what the
/// pulls already made room for still have to bring. Taken pull by pull in
/// order, each fits when its bytes on disk are within what is left; one
/// that is not cannot fit, and the next ones are weighed against what is
/// left. A pull sized by a manifest whose estimate does not fit, but whose
/// least size does (the estimate counts a compression its layers may not
/// have), gets what is left. Room is made only where it can help: a pull
/// that cannot fit is not answered by emptying the node.
pub fn that_fit(coming: &[ComingPull], room: u64, footprint: DiskFootprint) -> PullRoom {
    let mut left = room;
    let mut fitting = PullRoom::default();
    for pull in coming {
        let bytes = pull.bytes_on_disk(footprint);
        if pull.least_on_disk(footprint) <= left {
            let bytes = bytes.min(left);
            left -= bytes;
            fitting.bytes = fitting.bytes.saturating_add(bytes);
            fitting.fit.push(pull.clone());
        } else {
            fitting.cannot_fit.push(pull.clone());
        }
    }
    fitting
}

/// What the image filesystem at `stats` can have available above the
/// eviction line `line` once `freeable` bytes more are freed (every
/// removable image gone).
pub fn room_above_line(stats: &crate::fs::FsStats, freeable: u64, line: crate::config::EvictionThreshold) -> u64 {
    stats
        .available()
        .saturating_add(freeable)
        .saturating_sub(line.min_available_bytes(stats.capacity_bytes))
}

/// The coming pulls room was made for, while they are still coming: what
/// each had left to bring when the room was last made, and the bytes
/// available then. What the filesystem lost since is taken for their
/// blobs arriving, so a pull's own blobs do not count twice, and pulls
/// room was made for are weighed beside the ones sized later: all pulls
/// not yet landed are weighed together, as a new process (`plan`) weighs
/// them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoomMade {
    /// Each pull's image, as pods name it, and its bytes on disk still to
    /// come when the room was made.
    pulls: Vec<(String, u64)>,
    /// Bytes available when the room was made.
    available_then: u64,
}

impl RoomMade {
    /// Of `coming`, the pulls room is not made for yet.
    pub fn waiting(&self, coming: &[ComingPull]) -> Vec<ComingPull> {
        coming
            .iter()
            .filter(|pull| !self.pulls.iter().any(|(image, _)| *image == pull.image))
            .cloned()
            .collect()
    }

    /// What the pulls room was made for, those still `coming`, have yet to
    /// bring when `available` bytes are available. Those no longer coming
    /// are taken to have landed: what the filesystem lost goes to them
    /// first.
    pub fn still_to_land(&self, coming: &[ComingPull], available: u64) -> u64 {
        let (still, gone) = self.noted(coming);
        let arrived = self.available_then.saturating_sub(available);
        still.saturating_sub(arrived.saturating_sub(gone))
    }

    /// The bytes noted for the pulls still `coming`, and for those no
    /// longer coming.
    fn noted(&self, coming: &[ComingPull]) -> (u64, u64) {
        let (mut still, mut gone) = (0u64, 0u64);
        for (image, bytes) in &self.pulls {
            if coming.iter().any(|pull| pull.image == *image) {
                still = still.saturating_add(*bytes);
            } else {
                gone = gone.saturating_add(*bytes);
            }
        }
        (still, gone)
    }

    /// Room is there at `available` bytes for the pulls room was made for
    /// that are still `coming` and for those of `fit` that are sized:
    /// each noted with what it still has to bring. Pulls no longer coming
    /// (their pods went, their images landed) are forgotten; pulls not
    /// sized yet are not noted, so that room is made for them once sized.
    pub fn made(&mut self, coming: &[ComingPull], fit: &[ComingPull], available: u64, footprint: DiskFootprint) {
        let still_coming = |image: &str| coming.iter().any(|pull| pull.image == image);
        let (total, _) = self.noted(coming);
        let left = self.still_to_land(coming, available);
        let mut pulls: Vec<(String, u64)> = self
            .pulls
            .drain(..)
            .filter(|(image, _)| still_coming(image))
            .map(|(image, bytes)| {
                // What arrived is shared out in proportion.
                let share = u128::from(bytes) * u128::from(left) / u128::from(total.max(1));
                (image, share as u64)
            })
            .collect();
        for pull in fit {
            if pull.like.is_some() && !pulls.iter().any(|(image, _)| *image == pull.image) {
                pulls.push((pull.image.clone(), pull.bytes_on_disk(footprint)));
            }
        }
        *self = RoomMade {
            pulls,
            available_then: available,
        };
    }

    /// Whether room was made for `image`.
    pub fn contains(&self, image: &str) -> bool {
        self.pulls.iter().any(|(made, _)| made == image)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Dialect;
    use std::time::Duration;

    fn image(id: &str, tags: &[&str], size: u64) -> Image {
        Image {
            id: id.to_string(),
            repo_tags: tags.iter().map(ToString::to_string).collect::<Vec<_>>().into(),
            repo_digests: Vec::<String>::new().into(),
            size,
            pinned: false,
        }
    }

    fn pods(references: &[(&str, &str)]) -> Protections {
        Protections {
            references: references.iter().map(|(r, p)| (r.to_string(), p.to_string())).collect(),
            ..Default::default()
        }
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    #[test]
    fn an_image_a_pod_names_that_the_node_lacks_is_a_pull_sized_by_its_repository() {
        let mut sizes = RepoSizes::default();
        sizes.note(["registry.example/app:1"], 200, at(0));
        sizes.note(["nginx:1.26"], 50, at(0));
        let images = [
            image("sha256:a", &["registry.example/app:1"], 200),
            image("sha256:b", &["docker.io/library/busybox:1"], 5),
        ];
        let coming = coming_pulls(
            &images,
            &pods(&[
                ("registry.example/app:1", "default/old"),
                ("registry.example/app:2", "default/new"),
                ("registry.example/app:2", "default/new-too"),
                // A familiar name, normalized on both sides.
                ("docker.io/library/nginx:1.27", "default/web"),
                // On the node by its familiar name.
                ("busybox:1", "default/sh"),
                ("never.example/seen:1", "default/unknown"),
                // The image a status reports is on the node or gone with its container.
                (
                    "sha256:cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc",
                    "default/ran",
                ),
            ]),
            &sizes,
        );
        let found: Vec<(&str, &str, Option<u64>)> = coming
            .iter()
            .map(|c| (c.image.as_str(), c.pod.as_str(), c.like.as_ref().map(|s| s.size_bytes)))
            .collect();
        assert_eq!(
            found,
            [
                ("registry.example/app:2", "default/new", Some(200)),
                ("docker.io/library/nginx:1.27", "default/web", Some(50)),
                ("never.example/seen:1", "default/unknown", None),
            ]
        );
        let footprint = DiskFootprint::for_dialect(&Dialect::of("containerd"));
        assert_eq!(
            that_fit(&coming, u64::MAX, footprint).bytes,
            500,
            "twice the reported sizes; unknown counts 0"
        );
        assert!(coming_pulls(&images, Protections::none(), &sizes).is_empty());
    }

    #[test]
    fn a_manifest_is_read_as_the_runtime_reports_and_learnt_from_what_arrives() {
        let containerd = ManifestScale::for_footprint(DiskFootprint::for_dialect(&Dialect::of("containerd")));
        assert_eq!(containerd.reported(100), 100, "containerd reports compressed content");
        let mut crio = ManifestScale::for_footprint(DiskFootprint::for_dialect(&Dialect::of("cri-o")));
        assert_eq!(crio.reported(100), 260, "the median compression ratio");
        // Halfway to each arrival: 3.0 shown, then 1.0 (incompressible).
        crio.learn(100, 300);
        assert_eq!(crio.reported(1000), 2800);
        crio.learn(100, 100);
        assert_eq!(crio.reported(1000), 1900);
        // Less than its manifest (a wrong match) counts as 1; 80 as 8.
        crio.learn(100, 10);
        assert_eq!(crio.reported(1000), 1450);
        crio.learn(100, 8_000);
        assert_eq!(crio.reported(1000), 4725);
        crio.learn(0, 100);
        assert_eq!(crio.reported(1000), 4725, "no manifest size, nothing learnt");
        assert_eq!(
            ManifestScale::default(),
            ManifestScale::for_footprint(DiskFootprint::default())
        );
    }

    fn sized(image: &str, bytes: u64) -> ComingPull {
        ComingPull {
            image: image.to_string(),
            pod: format!("default/{image}"),
            like: Some(PullSize {
                tag: image.to_string(),
                size_bytes: bytes,
                at: at(0),
                from: SizedBy::History,
                manifest_bytes: None,
            }),
        }
    }

    #[test]
    fn only_the_pulls_that_removing_images_can_make_room_for_get_it() {
        let footprint = DiskFootprint::default();
        let not_sized = ComingPull {
            like: None,
            ..sized("u", 0)
        };
        let coming = [
            sized("a", 60),
            sized("huge", 500),
            not_sized.clone(),
            sized("b", 30),
            sized("c", 20),
        ];
        let room = that_fit(&coming, 100, footprint);
        let names = |pulls: &[ComingPull]| pulls.iter().map(|p| p.image.clone()).collect::<Vec<_>>();
        assert_eq!(names(&room.fit), ["a", "u", "b"]);
        assert_eq!(names(&room.cannot_fit), ["huge", "c"]);
        assert_eq!(room.bytes, 90);
        assert_eq!(that_fit(&coming, u64::MAX, footprint).bytes, 610);
        // Sized by a manifest of 40 bytes, estimated at 104: room for what
        // is left when the estimate does not fit but 40 does.
        let mut manifest = sized("m", 104);
        if let Some(seen) = &mut manifest.like {
            seen.from = SizedBy::Manifest;
            seen.manifest_bytes = Some(40);
        }
        let room = that_fit(&[manifest.clone()], 60, footprint);
        assert_eq!((room.fit.len(), room.bytes), (1, 60));
        assert_eq!(that_fit(&[manifest], 30, footprint).cannot_fit.len(), 1);
        // The room: available above the line once every removable image
        // is gone, never below zero.
        let stats = crate::fs::FsStats {
            capacity_bytes: 1000,
            available_bytes: 300,
            ..Default::default()
        };
        let line = crate::config::EvictionThreshold::Percent(15.0);
        assert_eq!(room_above_line(&stats, 200, line), 350);
        assert_eq!(
            room_above_line(&stats, 0, crate::config::EvictionThreshold::Bytes(900)),
            0
        );
        assert_eq!(room_above_line(&stats, u64::MAX, line), u64::MAX - 150);
    }

    #[test]
    fn pulls_room_was_made_for_count_until_their_blobs_arrive_and_go_when_they_land() {
        let footprint = DiskFootprint::default();
        let not_sized = ComingPull {
            like: None,
            ..sized("u", 0)
        };
        let only_a = [sized("a", 100)];
        let a_and_u = [sized("a", 100), not_sized.clone()];
        let both = [sized("a", 100), sized("b", 50)];
        let only_b = [sized("b", 50)];
        let mut made = RoomMade::default();
        assert_eq!(made.waiting(&only_a), only_a);
        // Room made for `a` at 500 available; a pull not sized is not noted.
        made.made(&a_and_u, &a_and_u, 500, footprint);
        assert!(made.contains("a") && !made.contains("u"));
        assert_eq!(made.waiting(&a_and_u), [not_sized]);
        assert_eq!(made.still_to_land(&only_a, 500), 100, "nothing arrived");
        assert_eq!(made.still_to_land(&only_a, 460), 60, "40 bytes of its blobs arrived");
        assert_eq!(made.still_to_land(&only_a, 100), 0);
        assert_eq!(made.still_to_land(&[], 500), 0, "landed, or its pod went");
        // `b` sized later, 40 of `a` arrived: both noted, `a` at what it
        // still has to bring.
        made.made(&both, &only_b, 460, footprint);
        assert_eq!(made.still_to_land(&both, 460), 110);
        assert_eq!(made.still_to_land(&only_b, 460), 50);
        // `a` landed: what went is its, and it is forgotten.
        assert_eq!(made.still_to_land(&only_b, 400), 50);
        made.made(&only_b, &[], 400, footprint);
        assert!(!made.contains("a"));
        assert_eq!(made.still_to_land(&only_b, 400), 50);
    }

    #[test]
    fn an_image_no_pod_will_pull_is_no_coming_pull() {
        let mut sizes = RepoSizes::default();
        sizes.note(["registry.example/app:1"], 200, at(0));
        let mut protections = pods(&[
            ("registry.example/app:2", "default/never"),
            ("registry.example/app:3", "default/pulls"),
        ]);
        protections.never_pulled.insert("registry.example/app:2".to_owned());
        let coming = coming_pulls(&[], &protections, &sizes);
        let found: Vec<&str> = coming.iter().map(|c| c.image.as_str()).collect();
        assert_eq!(found, ["registry.example/app:3"]);
    }

    #[test]
    fn a_repository_remembers_its_largest_image_and_the_oldest_is_forgotten_first() {
        let mut sizes = RepoSizes::default();
        sizes.note(["r.example/a:1"], 300, at(0));
        sizes.note(["r.example/a:2"], 100, at(10));
        assert_eq!(
            sizes.of("r.example/a:3").map(|s| (s.tag.as_str(), s.size_bytes)),
            Some(("r.example/a:1", 300))
        );
        sizes.note(["r.example/a:4"], 400, at(20));
        assert_eq!(sizes.of("r.example/a@sha256:00").map(|s| s.size_bytes), Some(400));
        assert_eq!(
            sizes.of("sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"),
            None
        );
        for i in 1..MAX_REPOSITORIES as u64 {
            sizes.note([format!("r.example/b{i}:1").as_str()], 1, at(100 + i));
        }
        assert_eq!(sizes.len(), MAX_REPOSITORIES);
        sizes.note(["r.example/last:1"], 1, at(100_000));
        assert_eq!(sizes.len(), MAX_REPOSITORIES, "bounded");
        assert!(sizes.of("r.example/a:1").is_none(), "the one seen longest ago goes");
        assert!(sizes.of("r.example/b1:1").is_some());
    }
}
