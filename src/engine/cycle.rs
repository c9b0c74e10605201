//! One collection cycle, executed.
//!
//! 1. List images, containers (all states) and the sandbox image; update the
//!    records; plan. When `Status` fails before the sandbox image was ever
//!    learnt, the cycle ends here: that image could not be told from an
//!    unused one.
//! 2. Age pass: remove every age candidate (reason `age`).
//! 3. Measure the image filesystem. When usage is at or above the high
//!    threshold, walk the space candidates in order (reason `space`) with
//!    the policy's [`Walk`]: **re-measuring after each removal and stopping
//!    as soon as usage is at or below the low threshold**, so one cycle
//!    reaches the target even when images share layers, and no image is
//!    removed beyond the one that crossed it.
//!
//! Right before each removal the image is re-checked (see
//! [`super::removal`]; the next candidate's re-check is made while the
//! removal before it is confirmed). A failed removal is logged and the walk goes on.
//! Cancellation is honoured between removals, never inside one. In dry run
//! everything happens except the removals; the walk then goes by what
//! each removal is expected to free (`crate::policy::Freeing`), as
//! `plan`'s forecast does.

use std::ops::ControlFlow;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::cri::Runtime;

use crate::fs::FsStats;
use crate::model::Reason;
use crate::model::Snapshot;
use crate::policy::{AgePass, Candidate, CyclePlan, KeptImages, SpaceOutlook, SpaceTarget, Step as WalkStep, Walk};
use crate::records::ImageFacts;

use super::observe::ImageFs;
use super::removal::{Ahead, Confirming, CycleContext, Disk, Fate, Removing};
use super::report::{CycleError, CycleReport, Outcome};
use super::usage::NodeView;
use super::{Collector, Event};

impl<R: Runtime> Collector<R> {
    /// Runs one cycle. Never panics on runtime or filesystem errors: they end
    /// the cycle with [`Outcome::Failed`].
    pub async fn cycle(&mut self, cancel: &CancellationToken) -> CycleReport {
        self.look_again_at = None;
        self.sinks.emit(&Event::CycleStarted);
        let started = std::time::Instant::now();
        let dry_run = self.settings.dry_run;
        let mut report = CycleReport::new(dry_run);
        let span = tracing::info_span!("cycle", dry_run);
        let _enter = span.enter();
        if let Err(err) = self.run_cycle(cancel, &mut report).await {
            report.outcome = Outcome::Failed(Arc::new(err));
        }
        self.remover.settle_notes();
        self.save_if_due().await;
        report.duration = started.elapsed();
        if report.succeeded() {
            self.inventory.cycle_succeeded(self.clock.now());
        }
        self.sinks.emit(&Event::CycleFinished(&report));
        report
    }

    async fn run_cycle(&mut self, cancel: &CancellationToken, report: &mut CycleReport) -> Result<(), CycleError> {
        // The last listing goes before the new one is made: two listings of
        // a big node at once would double the daemon's memory. (Container
        // events until the next listing that answers find no image to mark:
        // the runtime is down, or that listing comes within the call.)
        self.inventory.listing_started();
        let NodeView {
            snapshot,
            listed,
            image_fs,
            ..
        } = self.observe().await.map_err(CycleError::Listing)?;
        let result = self.execute(&snapshot, &listed, image_fs, cancel, report).await;
        // Kept for matching container events and polls until the next
        // cycle: moved, not copied.
        self.inventory.keep_images(snapshot.images);
        result
    }

    /// The cycle after the listing: plan, then the age and space passes.
    async fn execute(
        &mut self,
        snapshot: &Snapshot,
        listed: &ImageFacts,
        image_fs: Result<ImageFs, crate::cri::RuntimeError>,
        cancel: &CancellationToken,
        report: &mut CycleReport,
    ) -> Result<(), CycleError> {
        report.runtime_reached = true;
        self.sinks.emit(&Event::Progress);
        if let Some(err) = self.inventory.sandbox_unknown() {
            // containerd 1.6 neither pins its pause image nor lists it under a
            // container: without Status it would look unused.
            return Err(CycleError::SandboxUnknown(err.to_string()));
        }
        // The latest; shared, not borrowed: the plan holds on to it through
        // removals.
        let protections = self.protections();
        let gc_policy = Arc::clone(&self.settings.policy);
        // The pulls pods bound to the node are about to make.
        let coming = self.coming_pulls(&snapshot.images, &protections);
        let disk = self.disk(image_fs);
        // Usage before the cycle removes anything: what the summary's
        // `usage_before` reports, also when the age pass frees space.
        report.before = disk.measure().ok();
        let footprint = self.inventory.footprint();
        // The kept images counted, not listed: a big node's list is 10 MiB.
        let cycle = CyclePlan::new(
            snapshot,
            listed,
            &gc_policy,
            &protections,
            (self.clock.now(), self.clock.started()),
            KeptImages::Counted,
        );
        let (cycle, pulls) = self.with_room(cycle, &coming, report.before.as_ref());
        self.note_cannot_fit(&pulls.cannot_fit);
        let plan = &cycle.plan;
        self.sinks.emit(&Event::Planned {
            in_use: plan.in_use_count(),
            unused: snapshot.images.len() - plan.in_use_count() - plan.protected_count(),
            protected: plan.protected_count(),
            candidates: plan.age.len() + plan.space.len(),
            age_guarded: plan.age_guarded,
            max_age: gc_policy.max_age,
        });
        let mut cx = CycleContext::new(snapshot, &disk, cancel, report, (&pulls.fit, pulls.bytes));
        if self.age_pass(&plan.age, &mut cx).await?.is_break() {
            return Ok(());
        }
        if !plan.age.is_empty() {
            self.save_if_due().await;
        }
        if let Some(why) = self.inventory.image_fs_mismatch() {
            self.sinks.emit(&Event::SpacePassSkipped(why));
            cx.report().image_fs_mismatch = Some(why.to_string());
            return Ok(());
        }
        self.space_pass(&cycle, &mut cx).await?;
        // Made, or there already, for the pulls that fit.
        if let Ok(after) = disk.measure() {
            self.inventory
                .room_made(&coming, &pulls.fit, after.available(), footprint);
        }
        Ok(())
    }

    /// The image filesystem a listing found, to measure (nothing to
    /// measure when the runtime did not say where it is).
    fn disk(&self, image_fs: Result<ImageFs, crate::cri::RuntimeError>) -> Disk {
        let (path, image_bytes) = match image_fs {
            Ok(fs) => (Some(fs.path).filter(|p| !p.as_os_str().is_empty()), fs.image_bytes),
            Err(err) => {
                self.sinks.emit(&Event::ImageFsUnknown(&err.to_string()));
                (None, None)
            }
        };
        Disk::new(Arc::clone(&self.probe), path, image_bytes)
    }

    /// The age pass: each age candidate re-checked and removed (in dry run,
    /// counted: what it would free counts against the space pass's
    /// estimate). `Break` when the cycle ends here: shutdown, or a removal
    /// the runtime did not tell the outcome of (what it is still doing may
    /// free what the rest of the cycle would: the next cycle sees).
    async fn age_pass(
        &mut self,
        age: &[Candidate<'_>],
        cx: &mut CycleContext<'_>,
    ) -> Result<ControlFlow<()>, CycleError> {
        let mut rechecked: Option<Ahead> = None;
        for (i, candidate) in age.iter().enumerate() {
            if cx.cancel().is_cancelled() {
                if rechecked.is_some() {
                    self.remover.drop_ahead(candidate.id);
                }
                cx.report().outcome = Outcome::Interrupted;
                return Ok(ControlFlow::Break(()));
            }
            let next = age.get(i + 1);
            let (remover, mut with) = self.removing();
            match remover.remove(&mut with, candidate, rechecked.take(), next, cx).await? {
                Removing::Finished(Fate::Unknown) => return Ok(ControlFlow::Break(())),
                Removing::Finished(_) => {}
                Removing::Confirming(confirming) => {
                    let next = next.filter(|_| !cx.cancel().is_cancelled());
                    let (remover, mut with) = self.removing();
                    rechecked = remover.confirm(&mut with, confirming, next, false, cx).await;
                }
            }
        }
        Ok(ControlFlow::Continue(()))
    }

    /// The space pass: when [`SpaceTarget::due`], the walk over the space
    /// candidates (see [`crate::policy::Walk`]), each removal re-measured.
    async fn space_pass(&mut self, cycle: &CyclePlan<'_>, cx: &mut CycleContext<'_>) -> Result<(), CycleError> {
        let disk = cx.disk();
        let stats = match disk.measure() {
            Ok(stats) => stats,
            Err(err) => {
                self.sinks.emit(&Event::UsageUnmeasured);
                return Err(CycleError::Filesystem(err));
            }
        };
        cx.report().before.get_or_insert(stats);
        cx.report().after = Some(stats);
        let target = cycle.target();
        self.publish_usage(&target, &stats);
        self.check_eviction_threshold(&stats);
        // In dry run the age removals were only counted: what they would
        // have freed (by the images that passed their re-check) counts
        // first, and the walk goes by the estimate.
        let age = if cx.report().dry_run {
            AgePass::Counted(
                cx.report()
                    .removed
                    .iter()
                    .filter(|r| r.reason == Reason::Age)
                    .map(|r| (r.id.as_str(), r.size))
                    .collect(),
            )
        } else {
            AgePass::Removed
        };
        let pass = cycle.space(
            stats,
            age,
            self.inventory.footprint(),
            self.inventory.layers(),
            disk.image_bytes(),
        );
        let Some(pass) = pass else {
            self.sinks.emit(&Event::SpacePassNotDue {
                usage_percent: stats.usage_percent(),
                high: target.in_force(stats.capacity_bytes).0,
            });
            self.note_outlook(None);
            return Ok(());
        };
        cx.report().space_pass = true;
        self.note_outlook(Some(pass.outlook));
        cx.report().space_unreachable = self.remover.unreachable();
        let (high, low) = target.in_force(stats.capacity_bytes);
        self.sinks.emit(&Event::SpacePassStarted {
            stats: &stats,
            high,
            low,
            to_free: pass.to_free,
        });
        if !cx.coming().is_empty() {
            self.sinks.emit(&Event::MakingRoom {
                pulls: cx.coming(),
                footprint: self.inventory.footprint(),
            });
        }
        let Some(walk) = self.walk(pass.walk, cx).await? else {
            return Ok(());
        };
        let stats = walk.stats();
        cx.report().after = Some(stats);
        self.publish_usage(&target, &stats);
        if walk.reached() {
            // Images brought usage to low after all: whatever the outlook
            // said, the episode is over.
            self.note_outlook(None);
            cx.report().space_unreachable = None;
        } else {
            self.look_again_at = Some(tokio::time::Instant::now() + cycle.look_again(self.settings.interval, false));
            let freed = cx
                .report()
                .before
                .map_or(0, |b| stats.available().saturating_sub(b.available()));
            cx.report().outcome = Outcome::LowNotReached {
                freed_bytes: freed,
                remaining_bytes: walk.remaining(),
            };
        }
        Ok(())
    }

    /// Drives the space walk: each candidate it names removed and the
    /// filesystem measured after it (by the estimate while the walk goes by
    /// it), the next candidate re-checked beside each removal's confirming
    /// look. The walk where it stopped; `None` at shutdown.
    async fn walk<'w, 'a>(
        &mut self,
        mut walk: Walk<'w, 'a>,
        cx: &mut CycleContext<'_>,
    ) -> Result<Option<Walk<'w, 'a>>, CycleError> {
        let (disk, cancel) = (cx.disk(), cx.cancel());
        let now = self.clock.now();
        self.hurry_if_past_the_line(&mut walk, cx);
        // The re-check of the candidate it names, made ahead of time.
        let mut rechecked: Option<(&str, Ahead)> = None;
        loop {
            cx.set_hurried(walk.hurrying());
            let step = walk.next(|c| self.holds_back(now, c));
            let unused = match (&rechecked, &step) {
                (None, _) | (Some(_), WalkStep::HoldBack(_)) => None,
                (Some((id, _)), WalkStep::Remove(c)) if c.id == *id && !cancel.is_cancelled() => None,
                // The walk went another way than the peek said.
                (Some((id, _)), _) => Some(*id),
            };
            if let Some(id) = unused {
                rechecked = None;
                self.remover.drop_ahead(id);
            }
            match step {
                WalkStep::Remove(candidate) => {
                    if cancel.is_cancelled() {
                        cx.report().outcome = Outcome::Interrupted;
                        return Ok(None);
                    }
                    let ahead = rechecked.take().map(|(_, r)| r);
                    let (remover, mut with) = self.removing();
                    let step = match remover.remove(&mut with, candidate, ahead, None, cx).await? {
                        Removing::Finished(step) => step,
                        Removing::Confirming(confirming) => {
                            let next = next_if_all_back(&walk, &confirming, |c| self.holds_back(now, c))
                                .filter(|_| !cancel.is_cancelled());
                            let (remover, mut with) = self.removing();
                            rechecked = remover
                                .confirm(&mut with, confirming, next, true, cx)
                                .await
                                .zip(next)
                                .map(|(r, c)| (c.id, r));
                            Fate::Removed
                        }
                    };
                    match step {
                        Fate::Removed if walk.estimating() => _ = walk.removed(candidate.size, None),
                        // One reading, not waited on.
                        Fate::Removed if walk.hurrying() => _ = walk.removed(candidate.size, disk.measure().ok()),
                        Fate::Removed => match disk.measure() {
                            Ok(stats) => _ = walk.removed(candidate.size, Some(stats)),
                            Err(err) => {
                                self.sinks.emit(&Event::MeasureFailedMidWalk(&err.to_string()));
                                walk.removed(candidate.size, None);
                            }
                        },
                        // Kept here, but someone else may have removed it
                        // (or something else freed space) meanwhile.
                        Fate::Kept => walk.kept(disk.measure().ok()),
                        Fate::Unknown => break,
                    }
                }
                WalkStep::HoldBack(candidate) => {
                    self.sinks.emit(&Event::HeldBack(candidate.id));
                    cx.report().held_back.push(candidate.id.to_string());
                }
                WalkStep::Done if walk.hurrying() => {
                    // Measure and correct: the walk goes on from what came
                    // back, in a hurry again while still past the line.
                    self.correct_hurry(&mut walk, cx).await;
                    if !walk.reached() {
                        self.hurry_if_past_the_line(&mut walk, cx);
                    }
                }
                // No candidate left: measured, the walk ends.
                WalkStep::LowNotReached { .. } if walk.hurrying() => self.correct_hurry(&mut walk, cx).await,
                WalkStep::Done | WalkStep::LowNotReached { .. } => break,
            }
        }
        if walk.hurrying() {
            self.correct_hurry(&mut walk, cx).await;
        }
        Ok(Some(walk))
    }

    /// Starts a hurry (see [`Walk::hurry`]) when the walk's reading is past
    /// the kubelet's eviction line and the cycle removes for real.
    fn hurry_if_past_the_line(&mut self, walk: &mut Walk<'_, '_>, cx: &mut CycleContext<'_>) {
        let stats = walk.stats();
        if walk.estimating()
            || cx.report().dry_run
            || !self.settings.policy.past_eviction_line(&stats, cx.coming_bytes())
        {
            return;
        }
        let line = self
            .settings
            .policy
            .eviction_line(stats.capacity_bytes, cx.coming_bytes());
        walk.hurry(
            self.inventory
                .layers()
                .freeing(&cx.snapshot().images, self.inventory.footprint()),
            line,
        );
        cx.report().hurried = true;
        self.sinks.emit(&Event::Hurrying {
            stats: &stats,
            evicts_below: self.settings.policy.eviction.min_available_bytes(stats.capacity_bytes),
        });
    }

    /// Ends a hurry: the filesystem measured once the space of its
    /// removals came back (watched as after any removal, from the reading
    /// the hurry started from), and the walk corrected by it.
    async fn correct_hurry(&mut self, walk: &mut Walk<'_, '_>, cx: &mut CycleContext<'_>) {
        let from = walk.hurried_from();
        let measured = cx.disk().settled(from).await.ok();
        if let Some((expected, came_back)) = walk.corrected(measured) {
            self.sinks.emit(&Event::HurryCorrected { expected, came_back });
        }
    }

    /// Whether the space walk leaves `candidate` alone at `now`: imagegc
    /// removed it within `gc.thrash_window` while images cannot bring usage
    /// to low.
    fn holds_back(&self, now: std::time::SystemTime, candidate: &Candidate<'_>) -> bool {
        self.remover
            .holds_back(now, self.settings.thrash_window, candidate.id, candidate.digests)
    }

    /// Starts or ends an episode in which images cannot bring usage to low
    /// (images that only need to age count: see [`SpaceOutlook`]).
    fn note_outlook(&mut self, outlook: Option<SpaceOutlook>) {
        if let Some((outlook, first_after)) = outlook.and_then(|o| Some((o, o.reached_once_aged()?))) {
            self.sinks.emit(&Event::SpaceReachedOnceAged { outlook, first_after });
        }
        if let Some(change) = self.remover.note_outlook(outlook) {
            self.sinks.emit(&Event::SpaceUnreachable {
                outlook: change,
                thrash_window: self.settings.thrash_window,
            });
        }
    }

    /// Warns once when the kubelet's `imagefs.available` eviction threshold
    /// (a size, which only the measured capacity turns into a percentage)
    /// would evict pods before usage reaches the high threshold.
    fn check_eviction_threshold(&mut self, stats: &FsStats) {
        let Some(threshold) = self.settings.eviction_imagefs_available else {
            return;
        };
        if std::mem::replace(&mut self.said.eviction_checked, true) {
            return;
        }
        let evicts_below = threshold.min_available_bytes(stats.capacity_bytes);
        let high = self.settings.policy.target.high_percent();
        let collects_below = stats.capacity_bytes as u128 * (100 - u128::from(high.min(100))) / 100;
        if collects_below <= u128::from(evicts_below) {
            self.sinks.emit(&Event::EvictionBeforeHigh {
                high,
                evicts_below,
                capacity: stats.capacity_bytes,
            });
        }
    }

    fn publish_usage(&self, target: &SpaceTarget, stats: &FsStats) {
        self.sinks.emit(&Event::Usage {
            stats,
            due: target.due(stats),
        });
    }
}

/// The candidate `walk` goes on to after the removal `confirming` is
/// finishing, if the space back as its call returned is all it frees.
fn next_if_all_back<'w, 'a>(
    walk: &Walk<'w, 'a>,
    confirming: &Confirming,
    hold_back: impl Fn(&Candidate<'a>) -> bool,
) -> Option<&'w Candidate<'a>> {
    let mut peek = walk.clone();
    peek.removed(confirming.size(), Some(confirming.first()));
    loop {
        match peek.next(&hold_back) {
            WalkStep::Remove(c) => return Some(c),
            WalkStep::HoldBack(_) => {}
            WalkStep::Done | WalkStep::LowNotReached { .. } => return None,
        }
    }
}
