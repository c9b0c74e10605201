//! What the engine tells the world, typed: each [`Event`] is one fact (an
//! image removed, an episode of unreadable mounts starting, a cycle
//! finished), and every output is a [`Sink`] that turns the facts it cares
//! about into its own form. The sinks live in [`super::sinks`], one to a
//! file (the logs, the metrics, health); a new output (Kubernetes node
//! events) is one more, with no call site to edit. Episodes (an unreadable
//! container, a filesystem that is not the runtime's) are sent once when
//! they start and once when they end.

use std::path::Path;
use std::time::Duration;

use super::report::CycleReport;
use crate::fs::FsStats;
use crate::model::names::Names;
use crate::model::{Container, Image};
use crate::model::{Reason, Removal};
use crate::policy::{KeepReason, SpaceOutlook};
use crate::records::{RecordChanges, Unlisted};
use crate::store::pending::Settled;

/// One fact the engine reports.
#[derive(Debug)]
pub enum Event<'a> {
    /// A configuration is in force (at start, and after each reload).
    Configured {
        /// Whether removals are only reported.
        dry_run: bool,
        /// `gc.high_threshold_percent`.
        high: u8,
        /// `gc.low_threshold_percent`.
        low: u8,
        /// What the kubelet's configuration says (or what is assumed).
        kubelet: crate::config::KubeletView,
    },
    /// The state directory's history was loaded, with the last successful
    /// cycle of the process before.
    HistoryLoaded {
        /// When that cycle ended.
        last_success: Option<std::time::SystemTime>,
    },
    /// Whether the runtime answered a listing.
    RuntimeUp(bool),
    /// What the runtime listed, a cycle's listing or a poll between cycles
    /// (each container with the images it mounts filled in): what a usage
    /// log records.
    Seen {
        /// Every image listed.
        images: &'a [Image],
        /// Every container listed, in every state.
        containers: &'a [Container],
    },
    /// What a listing did to the records beyond last-used times.
    Listed {
        /// The changes.
        observed: &'a RecordChanges,
        /// How many images the runtime listed.
        images: usize,
    },
    /// The measured filesystem is not the runtime's image filesystem
    /// (`Some`, why) or is again (`None`).
    ImageFsMismatch(Option<&'a str>),
    /// The container filesystem of a split store (KEP-4191), measured at a
    /// listing (`Some`), or none separate from the image filesystem (`None`).
    ContainerFsUsage(Option<(&'a Path, &'a FsStats)>),
    /// The runtime keeps containers' writable layers on another filesystem
    /// than its images (said when first seen, and when it moves).
    SplitStore {
        /// The image filesystem, measured and freed.
        image_fs: &'a Path,
        /// The container filesystem, reported only.
        container_fs: &'a Path,
    },
    /// A container's mounted images cannot be read (`Some`, why) or can
    /// again (`None`).
    MountsUnread(Option<&'a str>),
    /// A pod's sandbox image cannot be read (`Some`, why) or can again.
    SandboxPodsUnread(Option<&'a str>),
    /// `runtime.sandbox_image` names no listed image (said once).
    SandboxConfiguredUnmatched(&'a str),
    /// No source names the sandbox image: never-used images are kept
    /// (said once).
    SandboxUnnamed,
    /// An image imagegc removed came back.
    Repulled {
        /// The image as listed now.
        image: &'a Image,
        /// How long after its removal.
        removed_ago: Duration,
        /// The episode of images that cannot reach low, when one is on.
        unreachable: Option<SpaceOutlook>,
        /// `gc.thrash_window`.
        thrash_window: Duration,
    },
    /// Work is progressing (liveness).
    Progress,
    /// The plan of a cycle.
    Planned {
        /// Images in use.
        in_use: usize,
        /// Images neither in use nor protected.
        unused: usize,
        /// Images kept whatever the usage.
        protected: usize,
        /// Age and space candidates.
        candidates: usize,
        /// Images without history held back from age removal.
        age_guarded: usize,
        /// `gc.max_age`.
        max_age: Duration,
    },
    /// The image filesystem could not be found from the runtime's answer.
    ImageFsUnknown(&'a str),
    /// The image filesystem measured.
    Usage {
        /// The reading.
        stats: &'a FsStats,
        /// Whether a space pass is due at it.
        due: bool,
    },
    /// The image filesystem could not be measured at the cycle's start.
    UsageUnmeasured,
    /// The kubelet evicts pods before usage reaches the high threshold
    /// (said once).
    EvictionBeforeHigh {
        /// `gc.high_threshold_percent`.
        high: u8,
        /// Available bytes under which the kubelet evicts.
        evicts_below: u64,
        /// The filesystem's capacity.
        capacity: u64,
    },
    /// No space pass: usage is below high.
    SpacePassNotDue {
        /// Usage in percent.
        usage_percent: u64,
        /// `gc.high_threshold_percent`.
        high: u8,
    },
    /// No space pass: the measured filesystem is not the runtime's.
    SpacePassSkipped(&'a str),
    /// The space pass found usage past the kubelet's eviction line: its
    /// removals do not wait for their space (see [`crate::policy::Walk::hurry`]).
    Hurrying {
        /// The reading past the line.
        stats: &'a FsStats,
        /// The bytes the kubelet keeps available (its eviction line).
        evicts_below: u64,
    },
    /// A space pass makes room for pulls coming for pods bound to the node
    /// (see [`crate::policy::coming`]).
    MakingRoom {
        /// The pulls, each sized by its repository's largest image.
        pulls: &'a [crate::policy::ComingPull],
        /// What an image takes on disk per reported byte.
        footprint: crate::policy::DiskFootprint,
    },
    /// The coming pulls that would not fit above the kubelet's eviction
    /// line even with every removable image gone, when they change: no
    /// room is made for them.
    PullsCannotFit {
        /// The pulls (none: the last ones fit or went).
        pulls: &'a [crate::policy::ComingPull],
        /// What an image takes on disk per reported byte.
        footprint: crate::policy::DiskFootprint,
    },
    /// A hurry ended, its removals measured.
    HurryCorrected {
        /// What its removals were expected to free on disk.
        expected: u64,
        /// What came back once measured (`None`: not measured).
        came_back: Option<u64>,
    },
    /// A space pass starts.
    SpacePassStarted {
        /// The reading that started it.
        stats: &'a FsStats,
        /// `gc.high_threshold_percent`.
        high: u8,
        /// `gc.low_threshold_percent`.
        low: u8,
        /// Bytes to free to reach low.
        to_free: u64,
    },
    /// Images cannot bring usage to low (`Some`, the outlook) or can again.
    SpaceUnreachable {
        /// The outlook, while the episode lasts.
        outlook: Option<SpaceOutlook>,
        /// `gc.thrash_window`.
        thrash_window: Duration,
    },
    /// The space candidates cannot bring usage to low now, but can with the
    /// images kept only for being younger than `gc.min_age` once they age
    /// (no episode: see [`SpaceOutlook::reached_once_aged`]).
    SpaceReachedOnceAged {
        /// The outlook.
        outlook: SpaceOutlook,
        /// How long until the first of the young images may go.
        first_after: Duration,
    },
    /// Statvfs failed during the walk: the rest goes by reported sizes.
    MeasureFailedMidWalk(&'a str),
    /// A space candidate left alone: removed within the thrash window.
    HeldBack(&'a str),
    /// The re-check before a removal starts (debug).
    Rechecking(&'a str),
    /// A re-check answered longer than [`super::removal::RECHECK_FRESH`]
    /// before its `RemoveImage` would have been sent: made again, or, when
    /// `gave_up`, the image kept for this cycle.
    RecheckStale {
        /// The image id.
        id: &'a str,
        /// How long ago the re-check answered.
        age: std::time::Duration,
        /// Whether the image is kept for this cycle (the re-check went
        /// stale every time it was made).
        gave_up: bool,
    },
    /// A candidate kept at the re-check before its removal: a keep rule
    /// holds for the image as the runtime holds it now.
    Kept {
        /// The image id.
        id: &'a str,
        /// Its tags now.
        tags: &'a Names,
        /// Why.
        why: KeepReason<'a>,
    },
    /// A candidate found gone at the re-check before its removal, or by its
    /// `RemoveImage` (`NotFound`): someone else may have removed it
    /// (another collector, `crictl rmi`); the next listings tell.
    GoneAlready {
        /// The image id.
        id: &'a str,
        /// Its tags as the cycle's listing had them.
        tags: &'a Names,
    },
    /// A removal about to be asked (debug).
    Removing {
        /// The image id.
        id: &'a str,
        /// Age or space.
        reason: Reason,
        /// Whether only reported.
        dry_run: bool,
    },
    /// An image removed (or, in dry run, that would have been).
    Removed(&'a Removal),
    /// Images someone else removed (the kubelet's image GC, another
    /// collector, `crictl rmi`), found at one listing or re-check: see
    /// `engine::others`.
    RemovedByOthers {
        /// The images, as their records knew them.
        images: &'a [Unlisted],
        /// When it was found.
        at: std::time::SystemTime,
    },
    /// A removal the runtime refused.
    RemovalFailed {
        /// The image id.
        id: &'a str,
        /// Its tags.
        tags: &'a Names,
        /// Age or space.
        reason: Reason,
        /// The runtime's error.
        error: &'a str,
    },
    /// The runtime answered OK to `RemoveImage` and still lists the image.
    RemovalNotDone {
        /// The image id.
        id: &'a str,
        /// The runtime's endpoint.
        endpoint: &'a str,
        /// Whether this is the first time this process saw it.
        first: bool,
    },
    /// `RemoveImage` failed but the image went all the same.
    RemovedDespiteError {
        /// The image id.
        id: &'a str,
        /// The call's error.
        error: &'a str,
    },
    /// `RemoveImage` failed without saying whether it removed the image,
    /// which is still listed: pending until a listing settles it.
    RemovalUnsettled {
        /// The image id.
        id: &'a str,
        /// The call's error.
        error: &'a str,
    },
    /// A pending removal settled by a listing (before it is journaled,
    /// when it went).
    PendingSettled {
        /// The image id.
        id: &'a str,
        /// Its tags when removal was asked.
        tags: &'a [String],
        /// Why it was to go (`age`, `space`).
        reason: &'a str,
        /// Whether an earlier process asked for it.
        earlier_process: bool,
        /// How it settled.
        how: Settled,
    },
    /// The records were saved, or could not be.
    Saved(Result<usize, &'a str>),
    /// A cycle starts.
    CycleStarted,
    /// A cycle ended.
    CycleFinished(&'a CycleReport),
}

/// An output of the engine's events.
pub trait Sink: Send + Sync {
    /// Handles one event; must not block (a sink that does IO hands it off).
    fn emit(&self, event: &Event<'_>);
}
