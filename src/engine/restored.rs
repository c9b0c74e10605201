//! What a collector starts from ([`Restored`]: the state directory as it
//! was found, the only IO of a start), and the inventory and remover made
//! from it.

use std::path::Path;
use std::time::{Duration, SystemTime};

use tracing::{info, warn};

use crate::records::Records;
use crate::store::journal::{Journal, JournalEntry};
use crate::store::pending::Pending;
use crate::store::state::{Loaded, StateStore};
use crate::time::{Clock, rfc3339};

use super::Settings;
use super::inventory::Inventory;
use super::removal::Remover;

/// What a collector starts from: the state directory as it was found (the
/// records and the last successful cycle of the process that saved them,
/// the pending removals, and the journal's recent removals, which re-pulls
/// are counted against). [`Restored::load`] is the only IO of a start:
/// [`super::Collector::new`] does none.
pub struct Restored {
    records: Records,
    /// The last successful cycle of the process that saved the records.
    last_success: Option<SystemTime>,
    store: StateStore,
    journal: Journal,
    pending: Pending,
    /// The journal's removals (not dry runs) within the thrash window, or
    /// the headroom's when that is on and longer.
    recent: Vec<JournalEntry>,
    /// `gc.thrash_window`: how far back `recent` counts for re-pulls.
    thrash_window: Duration,
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

    /// The collector's inventory and remover at `now`, from what was
    /// loaded.
    pub(super) fn into_parts(self, now: SystemTime) -> (Inventory, Remover) {
        let Restored {
            records,
            last_success,
            store,
            journal,
            pending,
            recent,
            thrash_window,
        } = self;
        let inventory = Inventory::new(records, store, &recent, now).with_last_success(last_success);
        let remover = Remover::new(pending, journal, recent, now.checked_sub(thrash_window));
        (inventory, remover)
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
