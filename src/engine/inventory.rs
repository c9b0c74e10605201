//! What the node holds, as the listings found it ([`Inventory`]).

use std::collections::HashSet;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use tracing::debug;

use crate::model::matching;
use crate::model::{Container, Dialect, Image, Snapshot};
use crate::policy::{
    ComingPull, DiskFootprint, LargestPull, LayerBook, ManifestScale, Protections, RepoSizes, RoomMade,
};
use crate::records::{ImageFacts, RecordChanges, Records};
use crate::store::journal::JournalEntry;
use crate::store::state::StateStore;

use super::PullSizes;
use super::observe;

/// How many images' layers one listing asks the runtime for at most (a
/// verbose `ImageStatus` each, in turn): a node of 10,000 images has them
/// all within 40 listings, and no listing costs the runtime more than
/// that.
const LAYERS_PER_LISTING: usize = 256;

/// How many images' layers `plan` asks for at most (about a second of
/// calls); on a bigger node the rest count whole in its estimate.
const LAYERS_FOR_PLAN: usize = 4_096;

/// After this many images in a row whose layers the runtime did not name
/// (and none it did), it is not asked again: a runtime that names none
/// costs a call and an id's memory per image otherwise.
const LAYERS_UNTOLD_MAX: usize = 16;

/// The collector's knowledge of the node: the records and their saves,
/// the last listing, the image filesystem and the sandbox image, what an
/// image takes on disk, and the pulls that came and are coming. Listings
/// come in through its `observed*` methods, removals through
/// [`Inventory::removed`]; the rest of the engine reads it.
pub(super) struct Inventory {
    /// Shared with a save in progress only: the save is awaited before the
    /// records change again, so `Arc::make_mut` never copies them (a copy
    /// of 100,000 records would double their memory for the save).
    records: Arc<Records>,
    store: StateStore,
    /// When the records were last saved by this process.
    last_saved: Option<SystemTime>,
    /// When the last successful cycle ended, this process's or, until it
    /// has one, the one the state file remembers: saved with the records.
    last_success: Option<SystemTime>,
    observer: observe::Observer,
    /// Images of the last listing, to resolve container references between cycles.
    last_images: Vec<Image>,
    /// What an image takes on disk per reported byte, from the runtime's
    /// name and this process's measured removals.
    footprint: DiskFootprint,
    /// The images' layers, where the runtime names them, and the layers
    /// measured removals sized (see [`crate::policy::layers`]).
    layers: LayerBook,
    /// Listed images whose layers the runtime did not tell: not asked again.
    layers_untold: HashSet<String>,
    /// The runtime names no image's layers: not asked.
    layers_unsupported: bool,
    /// What the runtime reports per byte of a registry's manifest, from
    /// its name and the images manifests sized once they arrived.
    manifest_scale: ManifestScale,
    /// How the runtime speaks, once its `Version` answered.
    dialect: Option<Dialect>,
    /// The footprint an earlier process learnt (the state file), taken
    /// back once the runtime is named (see [`DiskFootprint::restore`]).
    restored_footprint: Option<(u64, u64)>,
    /// Why the measured filesystem is not the runtime's image filesystem,
    /// while it is not (see [`super::ImageFs::mismatch`]): no space pass runs.
    image_fs_mismatch: Option<String>,
    /// The image filesystem as the last listing found it, when it can be
    /// trusted: what [`super::Collector::check_usage`] measures between cycles.
    disk_path: Option<PathBuf>,
    /// Why `Status` failed while no sandbox image was known yet: the sandbox
    /// image cannot be told from an unused image then, so nothing is removed.
    sandbox_unknown: Option<String>,
    /// The largest image that arrived lately (see [`crate::policy::Headroom`]):
    /// from the records and the journal at start, then from each listing's
    /// new images. Kept when the image goes: it may be pulled again.
    largest_pull: Option<LargestPull>,
    /// The largest image of each repository the node had (see
    /// [`crate::policy::coming`]): from the records and the journal at
    /// start, then from each listing's new images.
    repo_sizes: RepoSizes,
    /// The coming pulls room was made for (or found), with what they
    /// still have to bring (see [`crate::policy::RoomMade`]).
    room_made: RoomMade,
    /// The thresholds in force at the last measurement, and whether they
    /// moved since the daemon last asked (a pull sized, a pod bound or
    /// gone): a new crossing.
    in_force: Option<(u8, u8)>,
    thresholds_moved: bool,
    /// The coming pulls last said to not fit.
    cannot_fit: Vec<String>,
    /// How many listings showed images first seen then (see
    /// [`super::Collector::arrivals`]).
    arrivals: u64,
}

/// Whether the measured filesystem stopped or started being the runtime's
/// image filesystem at a listing (see [`Inventory::observed_image_fs`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum MismatchChange {
    /// It is not, since this listing: why.
    Started(String),
    /// It is again.
    Ended,
}

impl Inventory {
    pub(super) fn new(records: Records, store: StateStore, recent: &[JournalEntry], now: SystemTime) -> Self {
        let largest_pull = largest_pull(&records, recent, now);
        let repo_sizes = repo_sizes(&records, recent);
        let restored_footprint = records.footprint();
        let layers = LayerBook::restored(&records, now);
        Inventory {
            largest_pull,
            repo_sizes,
            room_made: RoomMade::default(),
            in_force: None,
            thresholds_moved: false,
            cannot_fit: Vec::new(),
            arrivals: 0,
            records: Arc::new(records),
            store,
            last_saved: None,
            last_success: None,
            observer: observe::Observer::default(),
            last_images: Vec::new(),
            footprint: DiskFootprint::default(),
            layers,
            layers_untold: HashSet::new(),
            layers_unsupported: false,
            manifest_scale: ManifestScale::default(),
            dialect: None,
            restored_footprint,
            image_fs_mismatch: None,
            disk_path: None,
            sandbox_unknown: None,
        }
    }

    /// The last successful cycle the state file remembers.
    pub(super) fn with_last_success(mut self, last_success: Option<SystemTime>) -> Self {
        self.last_success = last_success;
        self
    }

    /// The same, knowing what `known` notes of containers and pods (see
    /// [`crate::store::state::Known`]).
    pub(super) fn knowing(mut self, known: crate::store::state::Known) -> Self {
        self.observer = observe::Observer::knowing(known);
        self
    }

    // What it knows.

    pub(super) fn records(&self) -> &Records {
        &self.records
    }

    #[cfg(test)]
    pub(super) fn store(&self) -> &StateStore {
        &self.store
    }

    /// Whether this inventory writes nothing (`imagegc plan`).
    pub(super) fn read_only(&self) -> bool {
        self.store.is_read_only()
    }

    pub(super) fn footprint(&self) -> DiskFootprint {
        self.footprint
    }

    pub(super) fn layers(&self) -> &LayerBook {
        &self.layers
    }

    pub(super) fn manifest_scale(&self) -> &ManifestScale {
        &self.manifest_scale
    }

    /// The images of the last listing (empty while a listing is made).
    pub(super) fn last_images(&self) -> &[Image] {
        &self.last_images
    }

    pub(super) fn largest_pull(&self) -> Option<&LargestPull> {
        self.largest_pull.as_ref()
    }

    pub(super) fn image_fs_mismatch(&self) -> Option<&str> {
        self.image_fs_mismatch.as_deref()
    }

    /// The image filesystem usage checks measure, when it can be trusted.
    pub(super) fn disk_path(&self) -> Option<&Path> {
        self.disk_path.as_deref()
    }

    pub(super) fn sandbox_unknown(&self) -> Option<&str> {
        self.sandbox_unknown.as_deref()
    }

    pub(super) fn arrivals(&self) -> u64 {
        self.arrivals
    }

    pub(super) fn last_success(&self) -> Option<SystemTime> {
        self.last_success
    }

    /// The thresholds in force at the last usage check.
    #[cfg(test)]
    pub(super) fn in_force(&self) -> Option<(u8, u8)> {
        self.in_force
    }

    /// The listings of containers and pods, with what they know of mounts.
    pub(super) fn observer(&mut self) -> &mut observe::Observer {
        &mut self.observer
    }

    // Listings.

    /// A listing is about to be made: the last one's images go first (two
    /// listings of a big node at once would double the daemon's memory).
    pub(super) fn listing_started(&mut self) {
        self.last_images = Vec::new();
    }

    /// The listing failed: last-used times cannot be trusted to be
    /// current until one answers again.
    pub(super) fn observation_broken(&mut self) {
        self.records_mut().observation_broken();
    }

    /// A cycle's listing: the records updated from it.
    pub(super) fn observed_snapshot(&mut self, snapshot: &Snapshot, now: SystemTime) -> (RecordChanges, ImageFacts) {
        self.records_mut().observe_snapshot(snapshot, now)
    }

    /// A listing between cycles: the records updated from it.
    pub(super) fn observed(&mut self, images: &[Image], containers: &[Container], now: SystemTime) -> RecordChanges {
        self.records_mut().observe(images, containers, now)
    }

    /// Keeps the images of a listing (moved, not copied) for container
    /// events and polls until the next one.
    pub(super) fn keep_images(&mut self, images: Vec<Image>) {
        self.last_images = images;
    }

    /// What a listing's `Status` answer said of the sandbox image: why it
    /// is unknown, if it is.
    pub(super) fn observed_sandbox(&mut self, unknown: Option<String>) {
        self.sandbox_unknown = unknown;
    }

    /// The runtime named itself (`dialect`): what an image takes on disk
    /// per reported byte follows, raised by what an earlier process
    /// measured for a runtime of the same kind. Learnt once.
    pub(super) fn observed_runtime(&mut self, dialect: Option<Dialect>) {
        let Some(dialect) = dialect.filter(|_| self.dialect.is_none()) else {
            return;
        };
        debug!(
            runtime = dialect.name(),
            reports_compressed = dialect.reports_compressed(),
            "the runtime's dialect"
        );
        // Measured removals raise it from here on (an earlier process's
        // too, for a runtime of the same kind).
        let mut footprint = DiskFootprint::for_dialect(&dialect);
        self.dialect = Some(dialect);
        if let Some(restored) = self.restored_footprint {
            footprint.restore(restored);
        }
        self.footprint = footprint;
        self.manifest_scale = ManifestScale::for_footprint(footprint);
    }

    /// The image filesystem a listing found: its path when it is the
    /// runtime's (`mismatch`: why it is not). Returns how the mismatch
    /// changed, when it did. A listing that found none (`path` `None`,
    /// no mismatch) leaves the episode as it was.
    pub(super) fn observed_image_fs(
        &mut self,
        path: Option<&Path>,
        mismatch: Option<String>,
    ) -> Option<MismatchChange> {
        let mut change = None;
        if path.is_some() || mismatch.is_some() {
            change = match (&mismatch, &self.image_fs_mismatch) {
                (Some(why), None) => Some(MismatchChange::Started(why.clone())),
                (None, Some(_)) => Some(MismatchChange::Ended),
                _ => None,
            };
            self.image_fs_mismatch = mismatch;
        }
        self.disk_path = path
            .filter(|_| self.image_fs_mismatch.is_none())
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf);
        change
    }

    /// Notes the images a listing found for the first time (`new`, their
    /// places in `images`) as pulls at `now`.
    pub(super) fn note_pulls(&mut self, images: &[Image], new: &[usize], now: SystemTime) {
        if !new.is_empty() {
            self.arrivals += 1;
        }
        for image in new.iter().filter_map(|&i| images.get(i)) {
            LargestPull::note(&mut self.largest_pull, LargestPull::of(image, now), now);
            self.repo_sizes.note_image(image, now);
        }
    }

    /// An image a registry's manifest sized (`manifest` bytes) arrived,
    /// reported at `reported` bytes.
    pub(super) fn learn_manifest(&mut self, manifest: u64, reported: u64) {
        self.manifest_scale.learn(manifest, reported);
    }

    /// Marks the images `ids` used at `at`.
    pub(super) fn mark_used<'i>(&mut self, ids: impl IntoIterator<Item = &'i str>, at: SystemTime) {
        self.records_mut().mark_used(ids, at);
    }

    /// Marks the images of the last listing that `names` name (a
    /// container event's references) used at `at`.
    pub(super) fn mark_named_used<'n>(&mut self, names: impl Iterator<Item = &'n str>, at: SystemTime) {
        let ids = matching::images_named(&self.last_images, names);
        Arc::make_mut(&mut self.records).mark_used(ids, at);
    }

    // Layers.

    /// The listed images whose layers to ask the runtime for: those not
    /// known yet, at most [`LAYERS_PER_LISTING`] ([`LAYERS_FOR_PLAN`] for
    /// `plan`); those of images no longer listed are forgotten first.
    /// `None` when the runtime names no image's layers; beside them,
    /// whether they are all the listed images whose layers are not known.
    pub(super) fn layers_to_learn<'i>(&mut self, images: &'i [Image]) -> Option<(Vec<&'i Image>, bool)> {
        if self.layers_unsupported {
            return None;
        }
        if !self.layers.is_empty() {
            self.layers.retain(images.iter().map(|i| i.id.as_str()));
        }
        if !self.layers_untold.is_empty() {
            let listed: crate::collections::HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
            self.layers_untold.retain(|id| listed.contains(id.as_str()));
        }
        let limit = if self.read_only() {
            LAYERS_FOR_PLAN
        } else {
            LAYERS_PER_LISTING
        };
        let unknown: Vec<&Image> = images
            .iter()
            .filter(|i| !self.layers.knows(&i.id) && !self.layers_untold.contains(&i.id))
            .take(limit)
            .collect();
        // Fewer than the limit: these are all the images not known.
        let all = unknown.len() < limit;
        Some((unknown, all))
    }

    /// What the runtime told of `id`'s layers (`None`: nothing). Breaks
    /// when the runtime turns out to name no image's layers: it is not
    /// asked again.
    pub(super) fn learnt_layers(&mut self, id: &str, layers: Option<&[String]>) -> ControlFlow<()> {
        match layers {
            Some(layers) => self.layers.insert(id, layers),
            None => {
                self.layers_untold.insert(id.to_string());
                if self.layers.is_empty() && self.layers_untold.len() >= LAYERS_UNTOLD_MAX {
                    debug!("the runtime names no image's layers: each image counts whole");
                    self.layers_unsupported = true;
                    self.layers_untold = HashSet::new();
                    return ControlFlow::Break(());
                }
            }
        }
        ControlFlow::Continue(())
    }

    /// Every listed image's layers were asked for: layers measured for
    /// images no longer there are let go when idle.
    pub(super) fn all_layers_asked(&mut self) {
        self.layers.drop_idle_ghosts();
    }

    // Removals.

    /// This process removed `id` (`size` bytes as reported) at `now`; the
    /// filesystem measured `freed` bytes more after it, when it was
    /// measured (which sizes the layers it freed; else they are forgotten).
    pub(super) fn removed(&mut self, id: &str, size: u64, freed: Option<u64>, now: SystemTime) {
        match freed {
            Some(freed) => self.layers.removed(id, size, freed, now),
            None => self.layers.forget(id),
        }
        self.records_mut().remove(id, now);
    }

    /// A record only: `id` is gone (removed by someone else).
    pub(super) fn forget(&mut self, id: &str, now: SystemTime) {
        self.records_mut().remove(id, now);
    }

    /// A measured removal: `size` reported bytes freed `freed` on disk.
    pub(super) fn learn_footprint(&mut self, size: u64, freed: u64) {
        self.footprint.learn(size, freed);
    }

    // Coming pulls.

    /// The pulls that pods bound to the node (`protections`) are about to
    /// make of images not among `images`, sized by the node's largest image
    /// of their repository, else by `sizes` (a registry's manifest, scaled
    /// to what the runtime reports; `capacity`: the image filesystem's
    /// size, past which a registry is not believed); those sized by
    /// neither are left out.
    pub(super) fn coming_pulls(
        &self,
        images: &[Image],
        protections: &Protections,
        sizes: Option<&dyn PullSizes>,
        capacity: impl Fn() -> Option<u64>,
        now: SystemTime,
    ) -> Vec<ComingPull> {
        let mut coming = crate::policy::coming::coming_pulls(images, protections, &self.repo_sizes);
        if let Some(sizes) = sizes {
            // Measured once, at the first pull a manifest sizes.
            let mut total = None;
            for pull in coming.iter_mut().filter(|pull| pull.like.is_none()) {
                let Some(size) = sizes.size_of(&pull.image) else {
                    continue;
                };
                // A pull larger than the whole image filesystem cannot be
                // made room for: a registry that says so is not believed.
                if total
                    .get_or_insert_with(&capacity)
                    .is_some_and(|total| self.footprint.on_disk(size) > total)
                {
                    debug!(image = %pull.image, size_bytes = size, "a manifest's size larger than the image filesystem is not believed");
                    continue;
                }
                pull.like = Some(crate::policy::coming::PullSize {
                    tag: pull.image.clone(),
                    // What the runtime will report for it (see ManifestScale).
                    size_bytes: self.manifest_scale.reported(size),
                    at: now,
                    from: crate::policy::coming::SizedBy::Manifest,
                    manifest_bytes: Some(size),
                });
            }
        }
        coming.retain(|pull| pull.like.is_some());
        coming
    }

    /// Of `coming`, the pulls room is not made for yet.
    pub(super) fn waiting(&self, coming: &[ComingPull]) -> Vec<ComingPull> {
        self.room_made.waiting(coming)
    }

    /// What the coming pulls room was made for still have to bring, with
    /// `available` bytes free (`None`: unread, all of it).
    pub(super) fn landing(&self, coming: &[ComingPull], available: Option<u64>) -> u64 {
        self.room_made.still_to_land(coming, available.unwrap_or(u64::MAX))
    }

    /// Usage was below high with room for the pulls `fit` of `coming`
    /// (weighed with `footprint`): room is made for them.
    pub(super) fn room_made(
        &mut self,
        coming: &[ComingPull],
        fit: &[ComingPull],
        available: u64,
        footprint: DiskFootprint,
    ) {
        self.room_made.made(coming, fit, available, footprint);
    }

    /// The coming pulls that cannot fit are `images`: whether that changed.
    pub(super) fn note_cannot_fit(&mut self, images: Vec<String>) -> bool {
        if images == self.cannot_fit {
            return false;
        }
        self.cannot_fit = images;
        true
    }

    /// Notes the thresholds in force at a usage check: high lowered since
    /// the last (more room needed) is a new crossing (see
    /// [`Inventory::take_thresholds_moved`]); raised, as a pull's blobs
    /// land, it is none.
    pub(super) fn note_in_force(&mut self, in_force: (u8, u8)) {
        if self.in_force.is_some_and(|before| in_force.0 < before.0) {
            self.thresholds_moved = true;
        }
        self.in_force = Some(in_force);
    }

    /// Whether the thresholds in force went down since this was last asked.
    pub(super) fn take_thresholds_moved(&mut self) -> bool {
        std::mem::take(&mut self.thresholds_moved)
    }

    // Saving.

    /// A cycle succeeded at `now`.
    pub(super) fn cycle_succeeded(&mut self, now: SystemTime) {
        self.last_success = Some(now);
    }

    /// Whether the records are to be saved at `now`: something other than
    /// the last-used times of images in use changed, or the last save by
    /// this process is [`super::STATE_REFRESH`] old (or there was none).
    pub(super) fn save_due(&self, now: SystemTime) -> bool {
        let stale = self
            .last_saved
            .is_none_or(|at| now.duration_since(at).map_or(true, |d| d >= super::STATE_REFRESH));
        self.records.changed() || stale
    }

    /// Saves the records with what was learnt of the footprint and the
    /// layers, at `now`, off the async threads. The records saved, or why
    /// not.
    pub(super) async fn save(&mut self, now: SystemTime) -> Result<usize, String> {
        if self.dialect.is_some() && self.footprint.learnt() != self.records.footprint() {
            let learnt = self.footprint.learnt();
            self.records_mut().set_footprint(learnt);
        }
        if self.layers.learned_changed() {
            self.layers.save_into(Arc::make_mut(&mut self.records));
        }
        let store = self.store.clone();
        let records = Arc::clone(&self.records);
        let last_success = self.last_success;
        let result =
            tokio::task::spawn_blocking(move || store.save_with_last_success(&records, now, last_success)).await;
        match result {
            Ok(Ok(())) => {
                self.records_mut().saved();
                self.last_saved = Some(now);
                Ok(self.records.len())
            }
            Ok(Err(err)) => Err(err.to_string()),
            Err(err) => Err(err.to_string()),
        }
    }

    /// Writes what the listings learnt of containers and pods, for `plan`
    /// and `images` (they need not ask about those): best effort.
    pub(super) async fn save_known(&mut self) {
        let Some(known) = self.observer.learnt() else {
            return;
        };
        let dir = self.store.dir().to_path_buf();
        match tokio::task::spawn_blocking(move || known.write(&dir)).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => debug!(error = %err, "could not note the containers' mounts for plan"),
            Err(err) => debug!(error = %err, "could not note the containers' mounts for plan"),
        }
    }

    fn records_mut(&mut self) -> &mut Records {
        Arc::make_mut(&mut self.records)
    }
}

/// The largest image that arrived within
/// [`crate::policy::headroom::HEADROOM_WINDOW`] before `now`, by the records
/// (images still there) and the journal's removals (`recent`).
pub fn largest_pull(records: &Records, recent: &[JournalEntry], now: SystemTime) -> Option<LargestPull> {
    let from_records = records.iter().map(|(id, r)| LargestPull {
        image: r.tags.first().map_or_else(|| id.clone(), str::to_string),
        size_bytes: r.size,
        at: r.first_seen,
    });
    let from_journal = recent.iter().filter(|e| !e.dry_run).filter_map(|e| {
        Some(LargestPull {
            image: e.tags.first().cloned().unwrap_or_else(|| e.image.clone()),
            size_bytes: e.size_bytes,
            at: humantime::parse_rfc3339(&e.first_seen).ok()?,
        })
    });
    from_records
        .chain(from_journal)
        .fold(None, |largest, pull| LargestPull::larger(largest, Some(pull), now))
}

/// The largest image of each repository, by the records (images still
/// there) and the journal's removals (`recent`).
pub fn repo_sizes(records: &Records, recent: &[JournalEntry]) -> RepoSizes {
    let mut sizes = RepoSizes::default();
    for (_, record) in records.iter() {
        sizes.note(record.tags.iter(), record.size, record.first_seen);
    }
    for entry in recent.iter().filter(|e| !e.dry_run) {
        let at = humantime::parse_rfc3339(&entry.first_seen).unwrap_or(SystemTime::UNIX_EPOCH);
        sizes.note(entry.tags.iter().map(String::as_str), entry.size_bytes, at);
    }
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::STATE_REFRESH;
    use std::time::Duration;

    #[test]
    fn records_that_only_aged_are_saved_again_once_the_last_save_is_as_old_as_the_refresh_period() {
        let dir = tempfile::tempdir().unwrap();
        let mut inventory = Inventory::new(Records::new(), StateStore::new(dir.path()), &[], SystemTime::now());
        let now = SystemTime::now();
        assert!(inventory.save_due(now), "never saved by this process");
        inventory.last_saved = Some(now);
        assert!(!inventory.save_due(now + STATE_REFRESH - Duration::from_secs(1)));
        assert!(inventory.save_due(now + STATE_REFRESH));
        // A clock that went back: saved, when in doubt.
        assert!(inventory.save_due(now - Duration::from_secs(1)));
    }
}
