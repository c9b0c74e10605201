//! The policy, pure (no IO, no clock reads): [`GcPolicy`], the narrow
//! policy made once from the configuration; [`keep`], the one home of every
//! keep rule ([`Rules::why_kept`]), which the planner and the re-check
//! before each removal both ask; [`mod@plan`], which images a cycle may
//! remove, and why every other image is kept; [`order`], one file per
//! `gc.order`, the order of the space candidates; [`space`],
//! when a space pass is due and done, and the walk over the space
//! candidates ([`Walk`]); [`layers`], what a removal frees when images
//! share layers ([`Freeing`]); [`cycle`], one cycle's script over them
//! ([`CyclePlan`]), which the daemon's cycle, the dry run, `plan` and
//! `simulate` all run; [`schedule`], when cycles and usage checks come
//! ([`Schedule`]), which the daemon's loop and `simulate`'s replay both
//! follow.
//!
//! A new keep rule goes in [`Rules::why_kept`] (with its [`KeepReason`]);
//! one that comes from outside the runtime's listing (the pods bound to the
//! node) comes in through [`Protections`].

use std::time::Duration;

use crate::config::{Config, EvictionThreshold, Order};

pub mod candidate;
pub mod coming;
pub mod cycle;
pub mod footprint;
pub mod headroom;
pub mod keep;
pub mod layers;
pub mod order;
pub mod plan;
pub mod schedule;
pub mod space;

pub use coming::{ComingPull, ManifestScale, PullRoom, RepoSizes, RoomMade};
pub use cycle::{AgePass, CyclePlan, KeptImages, SpacePass};
pub use headroom::{Headroom, LargestPull};
pub use keep::{KeepReason, Rules, Uses};
pub use layers::{Freeing, LayerBook};
pub use plan::{Candidate, Kept, KeptTally, Plan, Protections, Reason, plan, plan_counting_kept, plan_listed};
pub use schedule::Schedule;
pub use space::{
    DiskFootprint, Forecast, ImageBytes, ImageBytesSource, SpaceOutlook, SpaceTarget, Step, Walk, total_size,
};

/// What the planner and the space pass need of the configuration, made
/// once from it (and again at each reload): the thresholds, the ages, the
/// order and the keep rules, their globs compiled. Nothing in the policy
/// reads the whole configuration.
#[derive(Debug, Clone)]
pub struct GcPolicy {
    /// When a space pass is due and when it is done: `gc.*_percent`.
    pub target: SpaceTarget,
    /// `gc.max_age`: an image unused for longer is removed whatever the
    /// usage; zero: never.
    pub max_age: Duration,
    /// The order of the space candidates in force: `gc.order`, or when
    /// that is `auto`, the order it chose (never [`Order::Auto`] itself:
    /// [`Order::PRIOR`] until it has chosen).
    pub order: Order,
    /// Whether `gc.order` is `auto`: the order in force is chosen from the
    /// node's usage (see [`GcPolicy::with_order`]).
    pub auto: bool,
    /// Why an image is kept: `protect`, `gc.min_age`.
    pub keep: Rules,
    /// The kubelet's hard eviction line on the image filesystem
    /// (`evictionHard["imagefs.available"]`, or its default).
    pub eviction: EvictionThreshold,
    /// `gc.headroom`: keep room above the line for the largest recent pull.
    pub headroom: bool,
    /// `kubernetes.room_before_pulls` (with the pods watched): make room
    /// for the pulls coming for pods bound to the node.
    pub room_before_pulls: bool,
}

impl GcPolicy {
    /// The headroom for `pull`, the largest recent pull, when `gc.headroom`
    /// is on, and for `coming` bytes on disk, what the pulls coming for
    /// pods bound to the node need (see [`GcPolicy::room_for_pulls`];
    /// `footprint` says what the recent pull takes on disk).
    pub fn headroom_for(&self, pull: Option<&LargestPull>, coming: u64, footprint: DiskFootprint) -> Option<Headroom> {
        let recent = pull
            .filter(|_| self.headroom)
            .map_or(0, |pull| footprint.on_disk(pull.size_bytes));
        Headroom::new(self.eviction, recent, coming)
    }

    /// The room the pulls coming for pods bound to the node get, when
    /// `kubernetes.room_before_pulls` is on: of `waiting` (not made room
    /// for yet), those that fit in `room` (what the image filesystem can
    /// have above the eviction line once every removable image is gone;
    /// `None`: not measured, every pull counts) beside `landing` (what the
    /// pulls room was made for still have to bring), and the bytes that
    /// come to, never more than `room` (see [`coming::that_fit`]).
    pub fn room_for_pulls(
        &self,
        waiting: &[ComingPull],
        landing: u64,
        footprint: DiskFootprint,
        room: Option<u64>,
    ) -> PullRoom {
        if !self.room_before_pulls {
            return PullRoom::default();
        }
        let room = room.unwrap_or(u64::MAX);
        let mut pulls = coming::that_fit(waiting, room.saturating_sub(landing), footprint);
        pulls.bytes = pulls.bytes.saturating_add(landing).min(room);
        pulls
    }

    /// The policy with `order` in force, when `gc.order` is `auto` and
    /// `order` is one it chooses from (else as it is).
    pub fn with_order(&self, order: Order) -> Self {
        let mut policy = self.clone();
        if self.auto && order != Order::Auto {
            policy.order = order;
        }
        policy
    }

    /// The policy with the fixed `order` in force, whatever `gc.order`
    /// says (`simulate`'s side-by-side orders, `auto`'s judgements).
    pub fn fixed(&self, order: Order) -> Self {
        let mut policy = self.clone();
        if order != Order::Auto {
            policy.order = order;
            policy.auto = false;
        }
        policy
    }

    /// `gc.min_age`: an image first seen less long ago is kept from a
    /// space pass.
    pub fn min_age(&self) -> Duration {
        self.keep.min_age()
    }

    /// Whether pulls are sized from the journal's removals of the last
    /// [`headroom::HEADROOM_WINDOW`] (for `gc.headroom` or
    /// `kubernetes.room_before_pulls`).
    pub fn pull_history(&self) -> bool {
        self.headroom || self.room_before_pulls
    }

    /// Whether `stats` is past the kubelet's eviction line, or will be
    /// once `coming` bytes more arrive (the pulls coming for pods bound to
    /// the node): less available than it keeps, so that its eviction
    /// manager evicts pods at its next look unless space comes back first.
    pub fn past_eviction_line(&self, stats: &crate::fs::FsStats, coming: u64) -> bool {
        stats.available() < self.eviction_line(stats.capacity_bytes, coming)
    }

    /// The bytes a filesystem of `capacity` must keep available not to be
    /// past the kubelet's eviction line once `coming` bytes more arrive
    /// (see [`GcPolicy::past_eviction_line`]).
    pub fn eviction_line(&self, capacity: u64, coming: u64) -> u64 {
        self.eviction.min_available_bytes(capacity).saturating_add(coming)
    }
}

impl From<&Config> for GcPolicy {
    fn from(config: &Config) -> Self {
        let gc = &config.gc;
        GcPolicy {
            target: SpaceTarget::new(
                gc.high_threshold_percent,
                gc.low_threshold_percent,
                gc.high_inodes_percent.zip(gc.low_inodes_percent),
            ),
            max_age: config.gc.max_age,
            order: match config.gc.order {
                Order::Auto => Order::PRIOR,
                order => order,
            },
            auto: config.gc.order == Order::Auto,
            keep: Rules::from(config),
            eviction: config.eviction_line(),
            headroom: config.gc.headroom,
            room_before_pulls: config.kubernetes.enabled
                && config.kubernetes.protect_pods
                && config.kubernetes.room_before_pulls,
        }
    }
}
