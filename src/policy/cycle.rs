//! One cycle's script, pure: what the daemon's cycle, `imagegc plan` and
//! `imagegc simulate` each run, so that what `plan` shows and what
//! `simulate` replays is what the daemon does.
//!
//! 1. [`CyclePlan::new`]: from one listing (what the records made of it),
//!    the policy, the keep rules from outside the listing and the time, the
//!    age removals and the space candidates in order ([`Plan`]).
//! 2. The age pass: the caller removes [`CyclePlan::age`] (the daemon with a
//!    re-check before each), or only counts them ([`AgePass::Counted`]: a
//!    dry run, `plan`).
//! 3. [`CyclePlan::space`]: at the usage measured after the age pass,
//!    whether a space pass is due, what it must free, whether the
//!    candidates can ([`SpaceOutlook`]), and the [`Walk`] that drives it:
//!    measured after each removal, or by the estimate when nothing is
//!    removed ([`SpacePass::forecast`]).
//! 4. [`CyclePlan::look_again`]: when the next cycle comes.

use std::time::{Duration, SystemTime};

use crate::fs::FsStats;
use crate::model::Snapshot;
use crate::records::ImageFacts;

use super::layers::LayerBook;
use super::space::{DiskFootprint, Forecast, SpaceOutlook, SpaceTarget, Walk};
use super::{Candidate, GcPolicy, Plan, Protections, plan};

/// How often usage is measured between cycles (statvfs, no call to the
/// runtime), at most: a space pass starts this soon after usage crosses the
/// high threshold, well before the kubelet's eviction manager, which looks
/// every 10 s, sees usage reach its eviction line. The daemon's loop and the
/// simulator's.
pub const USAGE_CHECK_INTERVAL: Duration = Duration::from_secs(2);

/// After the first image kept for being too young becomes removable, how
/// long the next cycle waits: its first sighting and the clock it is
/// measured against may differ by a few milliseconds.
pub const YOUNG_MARGIN: Duration = Duration::from_millis(500);

/// Whether a cycle lists the images it keeps or only counts them: `plan`
/// shows each; a cycle needs only the counts (on a node of 100,000 images
/// the list alone is 10 MiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeptImages {
    /// Each kept image in [`Plan::kept`], with why.
    Listed,
    /// Only counted ([`Plan::tally`]).
    Counted,
}

/// What happened to the age candidates before the space pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgePass<'x> {
    /// Removed (or tried): the usage measured after them says what they
    /// freed.
    Removed,
    /// Only counted (a dry run, `plan`): they are still on disk. Each by
    /// id and reported size; what they would free first is estimated as
    /// the space walk's removals are (see [`crate::policy::Freeing`]).
    Counted(Vec<(&'x str, u64)>),
}

/// One cycle's plan (see the module docs).
#[derive(Debug)]
pub struct CyclePlan<'a> {
    /// The age removals, the space candidates, and the kept images.
    pub plan: Plan<'a>,
    snapshot: &'a Snapshot,
    policy: &'a GcPolicy,
    /// The policy's thresholds, with the headroom when given.
    target: SpaceTarget,
}

/// A space pass that is due (see [`CyclePlan::space`]).
#[derive(Debug)]
pub struct SpacePass<'p, 'a> {
    /// The usage it starts from.
    pub stats: FsStats,
    /// What reaching the low threshold needs.
    pub to_free: u64,
    /// Whether the candidates can free it.
    pub outlook: SpaceOutlook,
    /// The walk over the space candidates.
    pub walk: Walk<'p, 'a>,
}

impl<'a> CyclePlan<'a> {
    /// Plans a cycle on `snapshot`, from what the records made of it
    /// (`listed`), at `now`; `running_since` is when this process started
    /// observing (the kubelet's guard on age removals).
    pub fn new(
        snapshot: &'a Snapshot,
        listed: &ImageFacts,
        policy: &'a GcPolicy,
        protections: &'a Protections,
        (now, running_since): (SystemTime, SystemTime),
        kept: KeptImages,
    ) -> Self {
        let plan = match kept {
            KeptImages::Listed => plan::plan_listed(snapshot, listed, policy, protections, now, running_since),
            KeptImages::Counted => plan::plan_counting_kept(snapshot, listed, policy, protections, now, running_since),
        };
        CyclePlan {
            plan,
            snapshot,
            policy,
            target: policy.target,
        }
    }

    /// The same plan, its thresholds lowered for the headroom (see
    /// [`crate::policy::Headroom`]) that `largest`, the largest recent pull,
    /// and the pulls coming for pods bound to the node need: those of
    /// `waiting` that removing every candidate can make room for at
    /// `stats`, beside `landing`, what the pulls room was made for still
    /// have to bring (see [`GcPolicy::room_for_pulls`]). Returns which
    /// pulls fit and which cannot.
    pub fn with_room_for(
        mut self,
        largest: Option<&crate::policy::LargestPull>,
        (waiting, landing): (&[crate::policy::ComingPull], u64),
        footprint: DiskFootprint,
        stats: Option<&FsStats>,
    ) -> (Self, crate::policy::PullRoom) {
        let room =
            stats.map(|stats| super::coming::room_above_line(stats, self.freeable(footprint), self.policy.eviction));
        let pulls = self.policy.room_for_pulls(waiting, landing, footprint, room);
        let headroom = self.policy.headroom_for(largest, pulls.bytes, footprint);
        self.target = self.policy.target.with_headroom(headroom);
        (self, pulls)
    }

    /// What removing every candidate, age and space, would free at most,
    /// by `footprint`; a size not known counts nothing (room is not made
    /// on a guess).
    pub fn freeable(&self, footprint: DiskFootprint) -> u64 {
        self.plan
            .age
            .iter()
            .chain(&self.plan.space)
            .fold(0u64, |sum, c| sum.saturating_add(footprint.on_disk(c.size)))
    }

    /// The thresholds this plan goes by.
    pub fn target(&self) -> SpaceTarget {
        self.target
    }

    /// The age pass: removed whatever the usage, oldest use first.
    pub fn age(&self) -> &[Candidate<'a>] {
        &self.plan.age
    }

    /// The space pass at `stats`, measured after the age pass: `None` when
    /// usage is below the high threshold. `footprint` and `reported` (what
    /// the runtime says its images take) size what the candidates could
    /// free. When the age candidates were only counted, they count as
    /// candidates of the outlook, and the walk goes by the estimate from
    /// what they would free, shared layers counted once where `layers`
    /// knows them.
    pub fn space<'p>(
        &'p self,
        stats: FsStats,
        age: AgePass<'_>,
        footprint: DiskFootprint,
        layers: &LayerBook,
        reported: Option<u64>,
    ) -> Option<SpacePass<'p, 'a>> {
        let target = self.target;
        if !target.due(&stats) {
            return None;
        }
        let still_on_disk: &[Candidate<'a>] = match age {
            AgePass::Removed => &[],
            AgePass::Counted(_) => &self.plan.age,
        };
        let outlook = SpaceOutlook::new(
            &stats,
            target.in_force(stats.capacity_bytes).1,
            still_on_disk.iter().chain(&self.plan.space),
            &self.plan.tally,
            &self.snapshot.images,
            footprint,
            reported,
        );
        let walk = match age {
            AgePass::Removed => Walk::measured(target, stats, &self.plan.space),
            AgePass::Counted(counted) => {
                let mut freeing = layers.freeing(&self.snapshot.images, footprint);
                let would_free = counted
                    .iter()
                    .fold(0u64, |sum, (id, size)| sum.saturating_add(freeing.release(id, *size)));
                Walk::estimated(target, stats, &self.plan.space, would_free, freeing)
            }
        };
        Some(SpacePass {
            stats,
            to_free: target.bytes_to_free(&stats),
            outlook,
            walk,
        })
    }

    /// The age pass only counted, every age candidate: `plan`'s
    /// [`AgePass::Counted`].
    pub fn age_would_free(&self) -> AgePass<'_> {
        AgePass::Counted(self.plan.age.iter().map(|c| (c.id, c.size)).collect())
    }

    /// How long after a cycle the next one comes: `interval`, or, when the
    /// space pass did not reach the low threshold while images too young to
    /// remove were kept, as soon as the first of them may go (and
    /// [`YOUNG_MARGIN`]).
    pub fn look_again(&self, interval: Duration, low_reached: bool) -> Duration {
        match self.plan.tally.first_young_removable_after {
            Some(after) if !low_reached => interval.min(after + YOUNG_MARGIN),
            _ => interval,
        }
    }
}

impl<'p, 'a> SpacePass<'p, 'a> {
    /// What the walk removes by the estimate when nothing changes on the
    /// way (`plan`'s forecast; a dry run walks the same).
    pub fn forecast(self, hold_back: impl Fn(&Candidate<'a>) -> bool) -> Forecast<'p, 'a> {
        Forecast::of(self.walk, hold_back)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Image;
    use crate::records::Records;
    use crate::testing::{container_using, library_image};

    const MIB: u64 = 1 << 20;

    fn image(id: &str, size: u64) -> Image {
        library_image(id, size)
    }

    fn stats(used: u64) -> FsStats {
        FsStats {
            capacity_bytes: 1000 * MIB,
            available_bytes: (1000 * MIB).saturating_sub(used),
            ..FsStats::default()
        }
    }

    fn policy(high: u8, low: u8, max_age: Duration) -> GcPolicy {
        let mut config = crate::config::Config::default();
        config.gc.high_threshold_percent = high;
        config.gc.low_threshold_percent = low;
        config.gc.min_age = Duration::from_secs(60);
        config.gc.max_age = max_age;
        GcPolicy::from(&config)
    }

    /// A node: three old unused images, one in use, one first seen now.
    fn node(now: SystemTime) -> (Snapshot, Records) {
        let images = vec![
            image("old", 100 * MIB),
            image("a", 100 * MIB),
            image("b", 100 * MIB),
            image("used", 100 * MIB),
            image("new", 100 * MIB),
        ];
        let snapshot = Snapshot {
            containers: vec![container_using("c1", &images[3])],
            sandbox_images: vec!["registry.k8s.io/pause:3.10".to_string()],
            images,
            ..Snapshot::default()
        };
        let mut records = Records::new();
        let hour_ago = now - Duration::from_secs(3600);
        records.observe_snapshot(
            &Snapshot {
                images: snapshot.images[..4].to_vec(),
                ..Snapshot::default()
            },
            hour_ago - Duration::from_secs(3600),
        );
        records.mark_used(["a"], hour_ago);
        records.mark_used(["b"], hour_ago + Duration::from_secs(60));
        (snapshot, records)
    }

    #[test]
    fn a_counted_age_pass_counts_toward_the_space_pass_and_its_outlook() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let (snapshot, mut records) = node(now);
        let (_, listed) = records.observe_snapshot(&snapshot, now);
        let policy = policy(80, 60, Duration::from_secs(1800));
        let protections = Protections::default();
        let cycle = CyclePlan::new(
            &snapshot,
            &listed,
            &policy,
            &protections,
            (now, now - Duration::from_secs(7200)),
            KeptImages::Listed,
        );
        let ids = |c: &[Candidate<'_>]| c.iter().map(|c| c.id.to_string()).collect::<Vec<_>>();
        assert_eq!(ids(cycle.age()), ["old", "a", "b"]);
        assert!(
            cycle
                .space(
                    stats(700 * MIB),
                    AgePass::Removed,
                    DiskFootprint::default(),
                    &LayerBook::default(),
                    None
                )
                .is_none()
        );
        // At 90%: the age pass's 300 MiB, only counted, bring it to 60%.
        let pass = cycle
            .space(
                stats(900 * MIB),
                cycle.age_would_free(),
                DiskFootprint::default(),
                &LayerBook::default(),
                None,
            )
            .expect("due at 90%");
        assert_eq!(pass.to_free, 300 * MIB);
        assert!(!pass.outlook.unreachable());
        assert!(pass.forecast(|_| false).removals.is_empty());
        // Removed, they are no candidates: the young one is all there is,
        // and the next look comes when it may go.
        let pass = cycle
            .space(
                stats(900 * MIB),
                AgePass::Removed,
                DiskFootprint::default(),
                &LayerBook::default(),
                None,
            )
            .expect("due at 90%");
        assert_eq!(pass.outlook.could_free, 0);
        assert_eq!(pass.outlook.reached_once_aged(), None, "100 MiB young cannot free 300");
        let interval = Duration::from_secs(300);
        assert_eq!(cycle.look_again(interval, true), interval);
        assert_eq!(
            cycle.look_again(interval, false),
            Duration::from_secs(60) + YOUNG_MARGIN
        );
    }
}
