//! What the node holds, as the listings found it ([`Inventory`]), and what
//! a collector starts from ([`Restored`]: the state directory as it was
//! found, the only IO of a start).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tracing::{info, warn};

use crate::model::Image;
use crate::policy::{DiskFootprint, LargestPull, RepoSizes};
use crate::records::Records;
use crate::store::journal::{Journal, JournalEntry};
use crate::store::pending::Pending;
use crate::store::state::{Loaded, StateStore};
use crate::time::{Clock, rfc3339};

use super::Settings;
use super::observe;

/// The collector's knowledge of the node: the records and their saves,
/// the last listing, the image filesystem and the sandbox image, and what
/// an image takes on disk.
pub(super) struct Inventory {
    /// Shared with a save in progress only: the save is awaited before the
    /// records change again, so `Arc::make_mut` never copies them (a copy
    /// of 100,000 records would double their memory for the save).
    pub(super) records: Arc<Records>,
    pub(super) store: StateStore,
    /// When the records were last saved by this process.
    pub(super) last_saved: Option<SystemTime>,
    /// When the last successful cycle ended, this process's or, until it
    /// has one, the one the state file remembers: saved with the records.
    pub(super) last_success: Option<SystemTime>,
    pub(super) observer: observe::Observer,
    /// Images of the last listing, to resolve container references between cycles.
    pub(super) last_images: Vec<Image>,
    /// What an image takes on disk per reported byte, from the runtime's
    /// name and this process's measured removals.
    pub(super) footprint: DiskFootprint,
    /// The images' layers, where the runtime names them, and the layers
    /// measured removals sized (see [`crate::policy::layers`]).
    pub(super) layers: crate::policy::LayerBook,
    /// Listed images whose layers the runtime did not tell: not asked again.
    pub(super) layers_untold: std::collections::HashSet<String>,
    /// The runtime names no image's layers: not asked.
    pub(super) layers_unsupported: bool,
    /// What the runtime reports per byte of a registry's manifest, from
    /// its name and the images manifests sized once they arrived.
    pub(super) manifest_scale: crate::policy::ManifestScale,
    /// Whether the runtime's name was learnt (for [`DiskFootprint`]).
    pub(super) runtime_named: bool,
    /// The footprint an earlier process learnt (the state file), taken
    /// back once the runtime is named (see [`DiskFootprint::restore`]).
    pub(super) restored_footprint: Option<(u64, u64)>,
    /// Why the measured filesystem is not the runtime's image filesystem,
    /// while it is not (see [`super::ImageFs::mismatch`]): no space pass runs.
    pub(super) image_fs_mismatch: Option<String>,
    /// The image filesystem as the last listing found it, when it can be
    /// trusted: what [`super::Collector::check_usage`] measures between cycles.
    pub(super) disk_path: Option<PathBuf>,
    /// Why `Status` failed while no sandbox image was known yet: the sandbox
    /// image cannot be told from an unused image then, so nothing is removed.
    pub(super) sandbox_unknown: Option<String>,
    /// The largest image that arrived lately (see [`crate::policy::Headroom`]):
    /// from the records and the journal at start, then from each listing's
    /// new images. Kept when the image goes: it may be pulled again.
    pub(super) largest_pull: Option<LargestPull>,
    /// The largest image of each repository the node had (see
    /// [`crate::policy::coming`]): from the records and the journal at
    /// start, then from each listing's new images.
    pub(super) repo_sizes: RepoSizes,
    /// The coming pulls room was made for (or found), with what they
    /// still have to bring (see [`crate::policy::RoomMade`]).
    pub(super) room_made: crate::policy::RoomMade,
    /// The thresholds in force at the last measurement, and whether they
    /// moved since the daemon last asked (a pull sized, a pod bound or
    /// gone): a new crossing.
    pub(super) in_force: Option<(u8, u8)>,
    pub(super) thresholds_moved: bool,
    /// The coming pulls last said to not fit.
    pub(super) cannot_fit: Vec<String>,
    /// How many listings showed images first seen then (see
    /// [`super::Collector::arrivals`]).
    pub(super) arrivals: u64,
}

impl Inventory {
    pub(super) fn new(records: Records, store: StateStore, recent: &[JournalEntry], now: SystemTime) -> Self {
        let largest_pull = largest_pull(&records, recent, now);
        let repo_sizes = repo_sizes(&records, recent);
        let restored_footprint = records.footprint();
        let layers = crate::policy::LayerBook::restored(&records, now);
        Inventory {
            largest_pull,
            repo_sizes,
            room_made: crate::policy::RoomMade::default(),
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
            layers_untold: std::collections::HashSet::new(),
            layers_unsupported: false,
            manifest_scale: crate::policy::ManifestScale::default(),
            runtime_named: false,
            restored_footprint,
            image_fs_mismatch: None,
            disk_path: None,
            sandbox_unknown: None,
        }
    }
}

impl Inventory {
    /// Notes the images a listing found for the first time (`new`, their
    /// places in `images`) as pulls at `now`.
    /// The last successful cycle the state file remembers.
    pub(super) fn with_last_success(mut self, last_success: Option<SystemTime>) -> Self {
        self.last_success = last_success;
        self
    }

    pub(super) fn note_pulls(&mut self, images: &[Image], new: &[usize], now: SystemTime) {
        if !new.is_empty() {
            self.arrivals += 1;
        }
        for image in new.iter().filter_map(|&i| images.get(i)) {
            LargestPull::note(&mut self.largest_pull, LargestPull::of(image, now), now);
            self.repo_sizes.note_image(image, now);
        }
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

/// What a collector starts from: the state directory as it was found (the
/// records and the last successful cycle of the process that saved them,
/// the pending removals, and the journal's recent removals, which re-pulls
/// are counted against). [`Restored::load`] is the only IO of a start:
/// [`super::Collector::new`] does none.
pub struct Restored {
    pub(super) records: Records,
    /// The last successful cycle of the process that saved the records.
    pub(super) last_success: Option<SystemTime>,
    pub(super) store: StateStore,
    pub(super) journal: Journal,
    pub(super) pending: Pending,
    /// The journal's removals (not dry runs) within the thrash window, or
    /// the headroom's when that is on and longer.
    pub(super) recent: Vec<JournalEntry>,
    /// `gc.thrash_window`: how far back `recent` counts for re-pulls.
    pub(super) thrash_window: Duration,
}

impl Restored {
    /// Loads the state directory `dir` (`interval`: `gc.interval`, which
    /// moves last-used times forward over the time the node went
    /// unwatched; `thrash_window`: how far back the journal's removals
    /// count for re-pulls; `pull_history`: `gc.headroom` or
    /// `kubernetes.room_before_pulls`, with which they count for the sizes
    /// of pulls too, over [`crate::policy::headroom::HEADROOM_WINDOW`]).
    pub fn load(dir: &Path, clock: &Clock, settings: &Settings) -> Self {
        Self::load_from(StateStore::new(dir), dir, clock, settings)
    }

    /// [`Restored::load`] from `store` (a read-only one for a collector
    /// that writes nothing, `imagegc plan`: a corrupt state file is left
    /// where it is, and the collector saves, settles and journals nothing,
    /// see [`super::Collector::observe`]).
    pub fn load_from(store: StateStore, dir: &Path, clock: &Clock, settings: &Settings) -> Self {
        let (records, last_success) = load_records(&store, clock, settings.interval);
        let journal = Journal::new(dir);
        let thrash_window = settings.thrash_window;
        let window = if settings.policy.pull_history() {
            thrash_window.max(crate::policy::headroom::HEADROOM_WINDOW)
        } else {
            thrash_window
        };
        let since = clock.now().checked_sub(window);
        let recent = journal
            .read(since)
            .map(|entries| entries.into_iter().filter(|e| !e.dry_run).collect())
            .unwrap_or_default();
        Restored {
            records,
            last_success,
            store,
            journal,
            pending: Pending::load(dir),
            recent,
            thrash_window,
        }
    }

    /// The same, with `records` in place of the ones loaded.
    pub fn with_records(mut self, records: Records) -> Self {
        self.records = records;
        self
    }
}

/// The records of the state directory, and the last successful cycle of
/// the process that saved them (`interval`: `gc.interval`).
pub(crate) fn load_records(store: &StateStore, clock: &Clock, interval: Duration) -> (Records, Option<SystemTime>) {
    match store.load(clock.now(), interval) {
        Loaded::Fresh => {
            info!(path = %store.path().display(), "no state file: starting with no history");
            (Records::new(), None)
        }
        Loaded::Records {
            records,
            saved_at,
            last_success,
        } => {
            info!(
                path = %store.path().display(),
                records = records.len(),
                saved_at = %rfc3339(saved_at),
                "loaded image history"
            );
            (records, last_success)
        }
        Loaded::Corrupt { reason, .. } if store.is_read_only() => {
            warn!(
                path = %store.path().display(),
                %reason,
                "state file is corrupt: left where it is (this command writes nothing), planning with no history"
            );
            (Records::new(), None)
        }
        Loaded::Corrupt { reason, moved_to } => {
            warn!(
                path = %store.path().display(),
                %reason,
                moved_to = %moved_to.as_ref().map_or("(could not be moved)".to_string(), |p| p.display().to_string()),
                "state file is corrupt: set aside, starting with no history (no age-based removal until max age has passed)"
            );
            (Records::new(), None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::STATE_REFRESH;

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
