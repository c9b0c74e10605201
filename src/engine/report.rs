//! What a cycle did, as the collector reports it and everything downstream
//! reads it: each removal ([`Removal`], also what the journal records), how
//! the cycle ended ([`Outcome`]) and why one could not run ([`CycleError`]).
//! Data only: no IO.

use std::sync::Arc;
use std::time::Duration;

use crate::cri::RuntimeError;
use crate::fs::{FsError, FsStats};
pub use crate::model::{Reason, Removal};
use crate::policy::SpaceOutlook;

/// How a cycle ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Usage is at or below the low threshold, or was below the high one.
    Success,
    /// The space pass ran out of candidates above the low threshold.
    LowNotReached {
        /// Bytes the filesystem gained back during the cycle, measured.
        freed_bytes: u64,
        /// Bytes that still had to go to reach the low threshold.
        remaining_bytes: u64,
    },
    /// The cycle could not run to its end (runtime or filesystem error),
    /// typed: the daemon tells a runtime that did not answer from one that
    /// refused by the error itself, not its text.
    Failed(Arc<CycleError>),
    /// Shutdown was requested between removals.
    Interrupted,
}

impl PartialEq for Outcome {
    /// Failures are equal when they say the same.
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Outcome::Success, Outcome::Success) | (Outcome::Interrupted, Outcome::Interrupted) => true,
            (
                Outcome::LowNotReached {
                    freed_bytes: a,
                    remaining_bytes: b,
                },
                Outcome::LowNotReached {
                    freed_bytes: c,
                    remaining_bytes: d,
                },
            ) => a == c && b == d,
            (Outcome::Failed(a), Outcome::Failed(b)) => a.to_string() == b.to_string(),
            _ => false,
        }
    }
}

impl Eq for Outcome {}

/// What one cycle did.
#[derive(Debug, Clone)]
pub struct CycleReport {
    /// How the cycle ended.
    pub outcome: Outcome,
    /// The images removed (or, in dry run, that would have been), in order.
    pub removed: Vec<Removal>,
    /// Removals that failed: `(image id, error message)`; the image stays.
    pub failed: Vec<(String, String)>,
    /// Images skipped because they came into use right before removal.
    pub became_in_use: Vec<String>,
    /// The image filesystem measured at the start of the cycle; `None` when it
    /// could not be measured.
    pub before: Option<FsStats>,
    /// The image filesystem as last measured: after the age pass, then after
    /// each space removal; `None` when it could not be measured.
    pub after: Option<FsStats>,
    /// True when usage reached the high threshold and the space pass ran.
    pub space_pass: bool,
    /// True when the space pass found usage past the kubelet's eviction
    /// line and removed by estimate, without waiting for each removal's
    /// space (see [`crate::policy::Walk::hurry`]).
    pub hurried: bool,
    /// Set when the space pass ran and images could not bring usage to the
    /// low threshold.
    pub space_unreachable: Option<SpaceOutlook>,
    /// Why no space pass ran: the measured filesystem is not the runtime's
    /// image filesystem (see [`super::ImageFs::mismatch`]).
    pub image_fs_mismatch: Option<String>,
    /// Candidates the space pass left because imagegc removed them within
    /// `gc.thrash_window` while images cannot bring usage to low.
    pub held_back: Vec<String>,
    /// Removals whose outcome the runtime did not tell, still listed at the
    /// end of the walk.
    pub unsettled: Vec<String>,
    /// True when the runtime answered the cycle's listing.
    pub runtime_reached: bool,
    /// How long the cycle took (wall-clock time).
    pub duration: Duration,
    /// True when the cycle removed nothing by configuration (`gc.dry_run` or
    /// `--dry-run`).
    pub dry_run: bool,
}

impl CycleReport {
    pub(crate) fn new(dry_run: bool) -> Self {
        CycleReport {
            outcome: Outcome::Success,
            removed: Vec::new(),
            failed: Vec::new(),
            became_in_use: Vec::new(),
            before: None,
            after: None,
            space_pass: false,
            hurried: false,
            space_unreachable: None,
            image_fs_mismatch: None,
            held_back: Vec::new(),
            unsettled: Vec::new(),
            runtime_reached: false,
            duration: Duration::ZERO,
            dry_run,
        }
    }

    /// True when the outcome is [`Outcome::Success`].
    pub fn succeeded(&self) -> bool {
        matches!(self.outcome, Outcome::Success)
    }

    /// Bytes the filesystem gained back over all removals, as measured around
    /// each; removals that could not be measured count nothing.
    pub fn freed_bytes(&self) -> u64 {
        self.removed.iter().filter_map(|r| r.freed_bytes).sum()
    }
}

/// Why a cycle could not run to its end ([`Outcome::Failed`]).
#[derive(Debug, thiserror::Error)]
pub enum CycleError {
    /// The listing failed: the runtime is down or refused.
    #[error("{0}")]
    Listing(RuntimeError),
    /// `Status` failed before the sandbox image was ever learnt: it could
    /// not be told from an unused image, so nothing is removed.
    #[error("cannot learn the runtime's sandbox image ({0}); nothing is removed until Status answers")]
    SandboxUnknown(String),
    /// The containers or the image could not be re-checked right before a
    /// removal: when in doubt, keep.
    #[error("cannot re-check {what} before removing {image}: {source}")]
    Recheck {
        /// What was re-checked: `containers` or `the image`.
        what: &'static str,
        /// The image about to be removed.
        image: String,
        /// The runtime's error.
        source: RuntimeError,
    },
    /// The image filesystem could not be measured.
    #[error("{0}; space-based collection skipped this cycle")]
    Filesystem(FsError),
}

impl CycleError {
    /// The runtime's error, when the cycle failed on a runtime call.
    pub fn runtime_error(&self) -> Option<&RuntimeError> {
        match self {
            CycleError::Listing(err) | CycleError::Recheck { source: err, .. } => Some(err),
            CycleError::SandboxUnknown(_) | CycleError::Filesystem(_) => None,
        }
    }
}
