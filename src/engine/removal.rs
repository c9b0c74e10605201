//! One removal's lifecycle: re-check right before it (the image as the
//! runtime holds it now, against every keep rule), a pending note written
//! before `RemoveImage`, the call, what the filesystem gained back, and
//! settling what the runtime did not tell.
//!
//! **The re-check a removal relies on answered at most [`RECHECK_FRESH`]
//! before `RemoveImage` is sent**, whatever happens around it. Removals
//! follow one another without waiting on what they need not: when a
//! removal's space is back as the call returns, the short look that
//! confirms it ([`Remover::confirm`]) is made while the next candidate
//! is re-checked. That re-check ahead is used only when it is still that
//! fresh as the call is about to be sent; a confirming look that took
//! longer (a disk where something else writes keeps it watching for up to
//! [`SETTLE_TIMEOUT`]), a slow journal or a slow log make it stale, and
//! the image is re-checked again right before the call. The pending note
//! (an fsync) is written before the re-check it precedes, never between
//! the re-check and the call. The re-check's containers are those of a
//! `ListContainers` followed by no other call (containers it shows for the
//! first time are asked about, then listed again: see
//! `observe::MountCache::list_fresh`). What no CRI client can close
//! remains: the re-check's own round trip, plus those few milliseconds.
//!
//! Every removal known to have happened, at once or settled later (by this
//! process or the next), goes through [`Remover::removed`]: one event,
//! one journal line, the record dropped, the re-pull memory fed.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use crate::cri::{Removed, Runtime, RuntimeError};
use crate::fs::{FsError, FsProbe, FsStats};
use crate::model::matching;
use crate::model::names::Names;
use crate::model::{Container, Image, Snapshot};
use crate::model::{Reason, Removal};
use crate::policy::{Candidate, KeepReason, SpaceOutlook, Uses};
use crate::records::{History, Unlisted};
use crate::store::journal::{Journal, JournalEntry};
use crate::store::pending::{Pending, Seen, Settled};

use super::inventory::Inventory;
use super::others::GONE_CONFIRMED;
use super::report::{CycleError, CycleReport};
use super::{Collector, Event, Settings, Sinks};
use crate::policy::Protections;
use crate::time::Clock;
use tokio::sync::watch;

/// What every removal of one cycle works with: the cycle's listing, its
/// image filesystem, shutdown, and the report the removals go to.
pub(super) struct CycleContext<'a> {
    snapshot: &'a Snapshot,
    disk: &'a Disk,
    cancel: &'a CancellationToken,
    report: &'a mut CycleReport,
    /// Past the kubelet's eviction line: a removal's space is not waited
    /// for (see [`crate::policy::Walk::hurry`]); what it freed is not
    /// measured, and its journal line says so (no `freed_bytes`).
    hurried: bool,
    /// The pulls coming for pods bound to the node that this cycle makes
    /// room for (see [`crate::policy::coming`]): a reading from which
    /// they would cross the eviction line counts as past it.
    coming: &'a [crate::policy::ComingPull],
    /// What those pulls, and the ones room was made for before that are
    /// still to land, take on disk.
    coming_bytes: u64,
}

impl<'a> CycleContext<'a> {
    /// The removals of the cycle over `snapshot` and `disk`, reporting to
    /// `report`, making room for the pulls `coming` (`coming_bytes` on
    /// disk with those still to land).
    pub(super) fn new(
        snapshot: &'a Snapshot,
        disk: &'a Disk,
        cancel: &'a CancellationToken,
        report: &'a mut CycleReport,
        (coming, coming_bytes): (&'a [crate::policy::ComingPull], u64),
    ) -> Self {
        CycleContext {
            snapshot,
            disk,
            cancel,
            report,
            hurried: false,
            coming,
            coming_bytes,
        }
    }

    pub(super) fn snapshot(&self) -> &'a Snapshot {
        self.snapshot
    }

    pub(super) fn disk(&self) -> &'a Disk {
        self.disk
    }

    pub(super) fn cancel(&self) -> &'a CancellationToken {
        self.cancel
    }

    pub(super) fn report(&mut self) -> &mut CycleReport {
        self.report
    }

    /// Whether the removals are hurried now: past the kubelet's eviction
    /// line, a removal's space is not waited for.
    pub(super) fn set_hurried(&mut self, hurried: bool) {
        self.hurried = hurried;
    }

    pub(super) fn coming(&self) -> &'a [crate::policy::ComingPull] {
        self.coming
    }

    pub(super) fn coming_bytes(&self) -> u64 {
        self.coming_bytes
    }
}

/// What became of one candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fate {
    /// Removed (or, in dry run, would have been).
    Removed,
    /// Kept: in use, already gone, or the removal failed.
    Kept,
    /// The runtime did not tell whether it removed the image, and the
    /// image is still listed: the space pass stops here, so that a removal
    /// the runtime finishes later does not add to the ones after it.
    Unknown,
}

/// How long the outcome of a `RemoveImage` that timed out or broke is
/// watched for (`ImageStatus` every [`UNSETTLED_STEP`]), at most.
const UNSETTLED_WATCH: Duration = Duration::from_secs(30);
const UNSETTLED_STEP: Duration = Duration::from_millis(250);

/// How long the filesystem is watched after a removal for the space to come
/// back: containerd 2.x deletes an image's content and snapshots in the
/// background after `RemoveImage` returns, a few milliseconds later.
pub(super) const SETTLE_TIMEOUT: Duration = Duration::from_secs(1);
/// Between two readings while the space comes back.
pub(super) const SETTLE_STEP: Duration = Duration::from_millis(20);
/// The second look when the space was already back as `RemoveImage`
/// returned (containerd 1.x and CRI-O delete before they answer): enough to
/// see a deletion still under way, without making every removal wait a
/// [`SETTLE_STEP`].
pub(super) const SETTLE_CONFIRM: Duration = Duration::from_millis(2);

/// The filesystem as a removal returned.
pub(super) enum Returned {
    /// Measured once the space came back (or stopped waiting for it).
    Settled(FsStats),
    /// Grown already at the first reading: one short look
    /// ([`Disk::confirm`]) is left to make.
    Back { before: FsStats, first: FsStats },
}

/// [`Returned::Back`] when the space grew from `before` to `first`.
fn back(before: FsStats, first: FsStats) -> Option<Returned> {
    (first.available() > before.available()).then_some(Returned::Back { before, first })
}

/// What the re-check right before a removal found: the image as the
/// runtime holds it now, `None` to keep it.
pub(super) type Rechecked = Result<Option<Image>, CycleError>;

/// What `ImageStatus` answered.
type Status = Result<Option<Image>, RuntimeError>;

/// How old the re-check a removal relies on may be when `RemoveImage` is
/// sent, counted from its answer (tokio's clock): a few milliseconds, the
/// time of a reading of the filesystem and a log line. An older one (made
/// ahead, while a previous removal's space was watched) is made again.
pub const RECHECK_FRESH: Duration = Duration::from_millis(5);

/// How many times a re-check that went stale before its call (something
/// between them took longer than [`RECHECK_FRESH`]) is made again before
/// the image is kept for this cycle: when in doubt, keep.
const RECHECK_ATTEMPTS: usize = 3;

/// How long a re-check made ahead of time, beside the previous removal's
/// confirming look, may hold up that removal's journal line: past it, the
/// re-check is dropped (it changes nothing until both its calls answer)
/// and made again right before the removal.
const RECHECK_AHEAD_LIMIT: Duration = Duration::from_millis(250);

/// A re-check made ahead of its removal, beside the removal before it:
/// what it found, and when it answered. Its pending note was written
/// before it was made.
pub(super) struct Ahead {
    found: Rechecked,
    answered: tokio::time::Instant,
}

/// A removal the runtime made, with its space back as the call returned:
/// the confirming look is still to make, then [`Remover::confirm`]
/// journals it. The cycle makes that look beside the next candidate's
/// re-check, which it has to make anyway.
pub(super) struct Confirming {
    removal: Removal,
    before: FsStats,
    first: FsStats,
    in_flight: InFlight,
    /// Whether the runtime is still to be asked if the image really went
    /// (see [`Remover::confirm`]).
    unverified: bool,
}

impl Confirming {
    /// The reading as the call returned.
    pub(super) fn first(&self) -> FsStats {
        self.first
    }

    /// The image's reported size.
    pub(super) fn size(&self) -> u64 {
        self.removal.size
    }
}

/// What a call to [`Remover::remove`] came to.
pub(super) enum Removing {
    /// Done with the candidate.
    Finished(Fate),
    /// Removed; its space is still to confirm.
    Confirming(Box<Confirming>),
}

/// A view of the filesystem for one cycle: where it is and how to measure it.
pub(super) struct Disk {
    probe: Arc<dyn FsProbe>,
    path: Option<PathBuf>,
    /// What the runtime says images use of it (`ImageFsInfo`), when it says.
    image_bytes: Option<u64>,
}

impl Disk {
    /// The filesystem at `path` (`None`: the runtime did not say where it
    /// is), measured by `probe`; `image_bytes`: what the runtime says
    /// images use of it.
    pub(super) fn new(probe: Arc<dyn FsProbe>, path: Option<PathBuf>, image_bytes: Option<u64>) -> Self {
        Disk {
            probe,
            path,
            image_bytes,
        }
    }

    /// What the runtime says images use of it, when it says.
    pub(super) fn image_bytes(&self) -> Option<u64> {
        self.image_bytes
    }

    /// The filesystem once a removal's space has come back: re-measured
    /// until available space has grown and then held still for one step,
    /// for at most [`SETTLE_TIMEOUT`] (an image whose layers are all shared
    /// frees nothing). Stopping at the first reading would undercount what
    /// the removal freed and remove images beyond the low threshold. The
    /// step is [`SETTLE_CONFIRM`] when the space had already grown as the
    /// call returned, [`SETTLE_STEP`] once it grows after it.
    pub(super) async fn settled(&self, before: Option<FsStats>) -> Result<FsStats, FsError> {
        match self.returned(before).await? {
            Returned::Settled(stats) => Ok(stats),
            Returned::Back { before, first } => self.confirm(before, first).await,
        }
    }

    /// [`Disk::settled`] but for its last look when the space was already
    /// back as the call returned: that short look is the caller's to make
    /// ([`Disk::confirm`]), beside other work.
    pub(super) async fn returned(&self, before: Option<FsStats>) -> Result<Returned, FsError> {
        let first = self.measure()?;
        let Some(before) = before else {
            return Ok(Returned::Settled(first));
        };
        if let Some(back) = back(before, first) {
            return Ok(back);
        }
        self.watch(before, first, SETTLE_STEP).await.map(Returned::Settled)
    }

    /// [`Returned::Back`] when one reading now finds the space back
    /// already; `None` when it does not, or cannot tell.
    pub(super) fn back_at_once(&self, before: Option<FsStats>) -> Option<Returned> {
        back(before?, self.measure().ok()?)
    }

    /// The look that confirms a removal's space, back at `first` as the
    /// call returned, is not still coming back.
    pub(super) async fn confirm(&self, before: FsStats, first: FsStats) -> Result<FsStats, FsError> {
        self.watch(before, first, SETTLE_CONFIRM).await
    }

    /// [`Disk::confirm`] when other work took the place of its wait: one
    /// reading now, watched on while the space is still coming back.
    pub(super) async fn confirm_now(&self, before: FsStats, first: FsStats) -> Result<FsStats, FsError> {
        let now = self.measure()?;
        if now.available() == first.available() {
            return Ok(now);
        }
        self.watch(before, now, SETTLE_STEP).await
    }

    /// Re-measures every `step` from `last` until available space is above
    /// `before` and holds still, for at most [`SETTLE_TIMEOUT`].
    async fn watch(&self, before: FsStats, mut last: FsStats, mut step: Duration) -> Result<FsStats, FsError> {
        let deadline = tokio::time::Instant::now() + SETTLE_TIMEOUT;
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(step).await;
            let now = self.measure()?;
            if now.available() > before.available() && now.available() == last.available() {
                return Ok(now);
            }
            if now.available() != last.available() {
                // Still coming back after the call returned: the runtime
                // deletes in the background.
                step = SETTLE_STEP;
            }
            last = now;
        }
        Ok(last)
    }

    pub(super) fn measure(&self) -> Result<FsStats, FsError> {
        match &self.path {
            Some(path) => self.probe.stats(path),
            None => Err(FsError::Io {
                path: "(unknown)".to_string(),
                source: std::io::Error::other("the runtime reported no image filesystem"),
            }),
        }
    }

    /// Bytes that came back between two readings.
    fn freed(before: Option<FsStats>, after: Option<FsStats>) -> Option<u64> {
        before
            .zip(after)
            .map(|(b, a)| a.available().saturating_sub(b.available()))
    }
}

/// This process's removals: the pending notes written before each call,
/// the journal they end in, the one in flight, the memory of recent ones
/// (re-pulls), and images a listing omitted that no removal of this
/// process explains yet; and each removal's script (note, re-check,
/// `RemoveImage`, settle, journal: see the module's doc), run with what
/// the collector lends it for the step ([`Lent`]).
pub(super) struct Remover {
    pending: Pending,
    journal: Journal,
    thrash: super::thrash::Thrash,
    /// The removal in flight: shutdown waits for it, and for nothing else.
    in_flight: RemovalInFlight,
    /// Images a listing omitted, not yet known removed by someone else.
    others: super::others::Unconfirmed,
    /// The candidate whose pending note was written beside the call before
    /// its removal (see [`Remover::remove`]), until its removal uses it.
    noted_ahead: Option<String>,
    /// A runtime that answered OK to `RemoveImage` and kept the image was
    /// said (once per process).
    said_lying: bool,
}

/// What the collector lends its remover for one step of a removal: the
/// runtime it asks, the settings and the clock its re-check goes by, the
/// keep rules from outside the listing (the latest, read at each
/// re-check), the sinks it tells, and the inventory whose records a
/// removal changes.
pub(super) struct Lent<'c, R> {
    runtime: &'c R,
    settings: &'c Settings,
    clock: &'c Clock,
    sinks: &'c Sinks,
    protections: &'c watch::Receiver<Arc<Protections>>,
    inventory: &'c mut Inventory,
}

impl<R> Collector<R> {
    /// The remover, with what it borrows of the rest of the collector for
    /// a step of a removal.
    pub(super) fn removing(&mut self) -> (&mut Remover, Lent<'_, R>) {
        let lent = Lent {
            runtime: &self.runtime,
            settings: &self.settings,
            clock: &self.clock,
            sinks: &self.sinks,
            protections: &self.protections,
            inventory: &mut self.inventory,
        };
        (&mut self.remover, lent)
    }
}

impl<R> Lent<'_, R> {
    /// The keep rules from outside the listing, as they are now.
    fn protections(&self) -> Arc<Protections> {
        Arc::clone(&self.protections.borrow())
    }
}

impl Remover {
    /// `recent`: the journal's recent removals; those since `since` (the
    /// thrash window) are remembered, so that a re-pull right after a
    /// restart is still noticed.
    pub(super) fn new(
        pending: Pending,
        journal: Journal,
        recent: Vec<JournalEntry>,
        since: Option<SystemTime>,
    ) -> Self {
        let mut thrash = super::thrash::Thrash::default();
        for entry in recent {
            if let Some(at) = entry.timestamp()
                && since.is_none_or(|since| at >= since)
            {
                thrash.remember(at, entry.image, entry.digests);
            }
        }
        Remover {
            pending,
            journal,
            thrash,
            in_flight: RemovalInFlight::default(),
            others: super::others::Unconfirmed::default(),
            noted_ahead: None,
            said_lying: false,
        }
    }

    /// The removal in flight, as it goes.
    pub(super) fn in_flight(&self) -> RemovalInFlight {
        self.in_flight.clone()
    }

    /// The removals noted as pending (this process's, or an earlier one's
    /// not settled yet).
    #[cfg(test)]
    pub(super) fn pending(&self) -> &[crate::store::pending::PendingRemoval] {
        self.pending.entries()
    }

    /// The images of the pending removals.
    pub(super) fn pending_images(&self) -> HashSet<String> {
        self.pending.entries().iter().map(|p| p.entry.image.clone()).collect()
    }

    /// The journal removals end in.
    pub(super) fn journal(&self) -> Journal {
        self.journal.clone()
    }

    /// The episode in which images cannot bring usage to low, when one is
    /// on (see [`super::thrash::Thrash`]).
    pub(super) fn unreachable(&self) -> Option<SpaceOutlook> {
        self.thrash.unreachable()
    }

    /// Whether `id` (`digests`) is held back: this process removed it
    /// within `window` before `now` while images cannot bring usage to
    /// low (removing it again would only have it pulled again).
    pub(super) fn holds_back(&self, now: SystemTime, window: Duration, id: &str, digests: &Names) -> bool {
        self.thrash.unreachable().is_some() && self.thrash.removed_recently(now, window, id, digests)
    }

    /// Whether this process (or one before it, by the journal) removed
    /// `id` within `window` before `now`.
    #[cfg(test)]
    pub(super) fn removed_recently(&self, now: SystemTime, window: Duration, id: &str, digests: &Names) -> bool {
        self.thrash.removed_recently(now, window, id, digests)
    }

    /// Notes a space pass's outlook (`None`: low was reached, or no pass
    /// was due); the change of episode, when there is one.
    pub(super) fn note_outlook(&mut self, outlook: Option<SpaceOutlook>) -> Option<Option<SpaceOutlook>> {
        self.thrash.note_outlook(outlook)
    }

    /// The images of `new` (places in `images`, first seen now) that this
    /// process removed within `window` before `now`: re-pulls.
    pub(super) fn repulls(
        &mut self,
        now: SystemTime,
        window: Duration,
        images: &[Image],
        new: &[usize],
    ) -> Vec<super::thrash::Repull> {
        self.thrash.repulls(now, window, images, new)
    }

    /// Images a listing omitted (`unlisted`; `images`: what it listed),
    /// watched with those omitted before until they are known removed by
    /// someone else or still there: the ones to ask the runtime about now.
    /// The removals imagegc asked for never count: those pending before
    /// the listing (`asked`) and now.
    pub(super) fn watch_unlisted(
        &mut self,
        unlisted: &[Unlisted],
        images: &[Image],
        asked: &HashSet<String>,
        now: SystemTime,
    ) -> Vec<String> {
        let pending_now: HashSet<&str> = self.pending.entries().iter().map(|p| p.entry.image.as_str()).collect();
        let fresh = unlisted
            .iter()
            .filter(|u| !asked.contains(&u.id) && !pending_now.contains(u.id.as_str()));
        self.others.watch(fresh, images, now)
    }

    /// What `ImageStatus` twice said of `id`, an image watched since a
    /// listing omitted it: the image, when it is gone.
    pub(super) fn unlisted_seen(&mut self, id: &str, seen: Seen) -> Option<Unlisted> {
        self.others.seen(id, seen)
    }
}

/// The one removal in flight, shared with the daemon's shutdown (which
/// waits for it, and names its image when it gives up): the image whose
/// removal is under way, from the `RemoveImage` call until the removal is
/// measured, recorded and journaled; none between removals.
#[derive(Debug, Clone, Default)]
pub struct RemovalInFlight(Arc<std::sync::Mutex<Option<String>>>);

impl RemovalInFlight {
    /// The image whose removal is in flight, if one is.
    pub fn image(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Marks `id`'s removal in flight until the guard is dropped.
    fn start(&self, id: &str) -> InFlight {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(id.to_string());
        InFlight(self.clone())
    }
}

/// Marks a removal in flight until dropped.
struct InFlight(RemovalInFlight);

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.0.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }
}

impl Remover {
    /// The re-check right before a removal: the image as the runtime holds
    /// it now, when no keep rule holds for it ([`Rules::why_kept`], the
    /// planner's rules, asked of the image as it is now: under every name it
    /// has now, with the containers and pods that name it now, and its pin);
    /// `None` when it is to be kept (or is gone already). An error means the
    /// check could not be made.
    ///
    /// [`Rules::why_kept`]: crate::policy::Rules::why_kept
    async fn recheck<R: Runtime>(
        &mut self,
        with: &mut Lent<'_, R>,
        candidate: &Candidate<'_>,
        cx: &mut CycleContext<'_>,
    ) -> Rechecked {
        self.recheck_and_ask(with, candidate, None, cx).await.0
    }

    /// [`Remover::recheck`], with `ImageStatus` of `also` asked beside
    /// it (a removal before, to verify; see [`Remover::confirm`]).
    async fn recheck_and_ask<R: Runtime>(
        &mut self,
        with: &mut Lent<'_, R>,
        candidate: &Candidate<'_>,
        also: Option<&str>,
        cx: &mut CycleContext<'_>,
    ) -> (Rechecked, Option<Status>) {
        let snapshot = cx.snapshot;
        let images = &snapshot.images;
        with.sinks.emit(&Event::Rechecking(candidate.id));
        // Both at once: each reads the runtime as it is now, and a
        // container is created only from an image already pulled (and
        // tagged), so neither order sees more than the other.
        let runtime = with.runtime;
        let (containers, current, also) = tokio::join!(
            with.inventory.observer().containers(runtime, images),
            runtime.image_status(candidate.id),
            async {
                match also {
                    Some(id) => Some(runtime.image_status(id).await),
                    None => None,
                }
            }
        );
        (self.rechecked(with, candidate, containers, current, cx), also)
    }

    /// What the re-check's answers come to.
    fn rechecked<R: Runtime>(
        &mut self,
        with: &mut Lent<'_, R>,
        candidate: &Candidate<'_>,
        containers: Result<Vec<Container>, RuntimeError>,
        current: Status,
        cx: &mut CycleContext<'_>,
    ) -> Rechecked {
        let snapshot = cx.snapshot;
        let recheck_error = |what, source| CycleError::Recheck {
            what,
            image: candidate.id.to_string(),
            source,
        };
        let containers = containers.map_err(|source| recheck_error("containers", source))?;
        let current = current.map_err(|source| recheck_error("the image", source))?;
        let Some(current) = current else {
            gone_already(with.sinks, candidate);
            return Ok(None);
        };
        // Every name the image had in the listing counts beside those it
        // has now: a container or a pod naming it by a name `ImageStatus`
        // no longer gives (one of an id listed twice, a tag moved since)
        // may still use it.
        let current = with_listed_names(current, snapshot);
        let uses = uses_now(&current, &containers, snapshot);
        // The latest: a pod bound since the listing protects too.
        let protections = with.protections();
        let pod = protections
            .pods_naming(std::slice::from_ref(&current))
            .first()
            .map(|&(_, pod)| pod);
        let history = with.inventory.records().get(candidate.id).map(History::of);
        let now = with.clock.now();
        let policy = Arc::clone(&with.settings.policy);
        let why = policy
            .keep
            .why_kept(&current, uses, history, pod, now)
            .filter(|why| why.holds_against(candidate.reason));
        let Some(why) = why else {
            return Ok(Some(current));
        };
        if let KeepReason::InUse { containers } = &why
            && !containers.is_empty()
        {
            with.inventory.mark_used([candidate.id], now);
            cx.report.became_in_use.push(candidate.id.to_string());
        }
        with.sinks.emit(&Event::Kept {
            id: candidate.id,
            tags: &current.repo_tags,
            why,
        });
        Ok(None)
    }

    /// Removes one candidate after re-checking that it is not in use
    /// (`ahead`: the re-check, when made ahead of time, see
    /// [`Remover::confirm`]; used only while fresh, see
    /// [`Remover::recheck_fresh`]). A runtime error while re-checking ends the
    /// cycle: when in doubt, keep.
    ///
    /// The re-check lists the containers and asks the runtime for the
    /// image as it is now: a name it gained since the cycle's listing (a
    /// pull, a tag) counts, so a container created under that name keeps
    /// it. Only what really went is counted and journaled: `NotFound` (a
    /// second collector, `crictl rmi`) is not this collector's removal, a
    /// runtime that answers OK and still lists the image did not remove it,
    /// and a call that timed out or broke is watched until the image is gone
    /// or the outcome stays unknown (see [`Fate::Unknown`]), and then stays
    /// pending (see [`crate::store::pending`]) until a listing settles it.
    ///
    /// `next`, the candidate removed next whatever this removal comes to
    /// (the age pass's), has its pending note written beside this call, off
    /// the runtime's thread: the fsync costs no time of its own, and it is
    /// still made before that candidate's re-check.
    pub(super) async fn remove<R: Runtime>(
        &mut self,
        with: &mut Lent<'_, R>,
        candidate: &Candidate<'_>,
        ahead: Option<Ahead>,
        next: Option<&Candidate<'_>>,
        cx: &mut CycleContext<'_>,
    ) -> Result<Removing, CycleError> {
        // Noted before the re-check it relies on (the note is an fsync, and
        // nothing slow may come between the re-check and the call),
        // forgotten once journaled or failed: a process that ends in
        // between leaves it for the next one to settle (as not done, when
        // the image is still there). A re-check made ahead was noted
        // before it was made, and a note written ahead (beside the call
        // before this one) is on disk already.
        if !cx.report.dry_run && ahead.is_none() && !self.noted_ahead_for(candidate.id) {
            self.note_pending(with.clock, candidate);
        }
        let checked = self.recheck_fresh(with, candidate, ahead, cx).await;
        let (current, before) = match checked {
            Ok(Some(fresh)) => fresh,
            Ok(None) => {
                self.pending.forget(candidate.id);
                return Ok(Removing::Finished(Fate::Kept));
            }
            Err(err) => {
                self.pending.forget(candidate.id);
                return Err(err);
            }
        };
        let mut removal = Removal {
            id: candidate.id.to_string(),
            tags: current.repo_tags.to_vec(),
            digests: current.repo_digests.to_vec(),
            reason: candidate.reason,
            size: candidate.size,
            freed_bytes: None,
            first_seen: candidate.first_seen,
            last_used: candidate.last_used,
            dry_run: cx.report.dry_run,
        };
        if cx.report.dry_run {
            self.removed(with, removal, None, cx.report).await;
            return Ok(Removing::Finished(Fate::Removed));
        }
        // From the call until the removal is measured, recorded and
        // journaled: shutdown waits for all of it.
        let in_flight = self.in_flight.start(candidate.id);
        let result = match next {
            Some(next) => {
                let write = self.pending.request_ahead(pending_entry(with.clock, next));
                let (result, written) = tokio::join!(
                    with.runtime.remove_image(candidate.id),
                    tokio::task::spawn_blocking(move || write.run())
                );
                if written.is_ok() {
                    self.noted_ahead = Some(next.id.to_string());
                } else {
                    self.pending.forget(next.id);
                }
                result
            }
            None => with.runtime.remove_image(candidate.id).await,
        };
        let (step, after, unverified) = self.outcome(with, candidate, result, before, next.is_some(), cx).await;
        match (step, after) {
            (Fate::Removed, Some(Returned::Back { before, first })) => {
                return Ok(Removing::Confirming(Box::new(Confirming {
                    removal,
                    before,
                    first,
                    in_flight,
                    unverified,
                })));
            }
            (Fate::Removed, after) => {
                // Settled, or not measured (a confirm went to the arm above).
                let after = after.map(|(Returned::Settled(stats) | Returned::Back { first: stats, .. })| stats);
                removal.freed_bytes = Disk::freed(before, after);
                self.journal_removal(with, removal, cx.report).await;
            }
            (Fate::Kept, _) => self.pending.forget(candidate.id),
            (Fate::Unknown, _) => self.pending.mark_unknown(candidate.id),
        }
        drop(in_flight);
        Ok(Removing::Finished(step))
    }

    /// The pending note of a removal about to be asked for (durable).
    fn note_pending(&mut self, clock: &Clock, candidate: &Candidate<'_>) {
        let entry = pending_entry(clock, candidate);
        self.pending.request(entry);
    }

    /// Whether the pending note of `id`'s removal was written ahead, beside
    /// the call before (see [`Remover::remove`]). A note written ahead
    /// for another image, which no removal will use, goes.
    fn noted_ahead_for(&mut self, id: &str) -> bool {
        match self.noted_ahead.take() {
            Some(noted) if noted == id => true,
            Some(noted) => {
                self.drop_ahead(&noted);
                false
            }
            None => false,
        }
    }

    /// At the end of a cycle: a note written ahead that no removal used
    /// goes, and the file follows what was journaled.
    pub(super) fn settle_notes(&mut self) {
        if let Some(noted) = self.noted_ahead.take() {
            self.drop_ahead(&noted);
        }
        self.pending.flush();
    }

    /// The re-check `RemoveImage` may be sent on at once: the image as the
    /// runtime holds it, and the filesystem's reading before the call
    /// (`None` in dry run, or when it cannot be read), from a re-check that
    /// answered at most [`RECHECK_FRESH`] before that reading. `ahead` is
    /// used when still that fresh; a re-check that went stale is made
    /// again, up to [`RECHECK_ATTEMPTS`] times, then the image is kept for
    /// this cycle. `None`: keep it.
    async fn recheck_fresh<R: Runtime>(
        &mut self,
        with: &mut Lent<'_, R>,
        candidate: &Candidate<'_>,
        mut ahead: Option<Ahead>,
        cx: &mut CycleContext<'_>,
    ) -> Result<Option<(Image, Option<FsStats>)>, CycleError> {
        let mut age = Duration::ZERO;
        for _ in 0..RECHECK_ATTEMPTS {
            let (found, answered) = match ahead.take() {
                Some(Ahead { found, answered }) => (found, answered),
                None => {
                    let found = self.recheck(with, candidate, cx).await;
                    (found, tokio::time::Instant::now())
                }
            };
            let Some(current) = found? else {
                return Ok(None);
            };
            let removing = Event::Removing {
                id: candidate.id,
                reason: candidate.reason,
                dry_run: cx.report.dry_run,
            };
            if cx.report.dry_run {
                with.sinks.emit(&removing);
                return Ok(Some((current, None)));
            }
            // The note says the call is sent from here on (a rename, not
            // synced), within the re-check's freshness: a process killed
            // before leaves a note of a call never sent, which the next
            // start does not claim. When that write made the re-check
            // stale (a filesystem slow under other writes), the note stays
            // as it is for the re-check made again, which then has nothing
            // slow between its answer and the call: on that path only, a
            // process killed during the re-check leaves a note that may
            // claim an image someone else removes before the next start.
            self.pending.sending(candidate.id);
            let before = cx.disk.measure().ok();
            age = answered.elapsed();
            if age <= RECHECK_FRESH {
                // Said only of a removal that is sent (a debug line).
                with.sinks.emit(&removing);
                return Ok(Some((current, before)));
            }
            with.sinks.emit(&Event::RecheckStale {
                id: candidate.id,
                age,
                gave_up: false,
            });
        }
        with.sinks.emit(&Event::RecheckStale {
            id: candidate.id,
            age,
            gave_up: true,
        });
        Ok(None)
    }

    /// Finishes a removal whose space was back as the call returned: the
    /// confirming look, then the journal line. `next` is the candidate
    /// that comes next if this removal does not end the pass: its pending
    /// note is written and it is re-checked meanwhile, and what the
    /// re-check found comes back, for [`Remover::remove`], which uses it
    /// only if it is still fresh then (`None` when there is no next
    /// candidate, or the re-check took longer than
    /// [`RECHECK_AHEAD_LIMIT`]). The cycle hands an unused one to
    /// [`Remover::drop_ahead`].
    ///
    /// When the look `decides` whether the pass goes on (the space walk),
    /// it waits its full [`SETTLE_CONFIRM`] beside the re-check. When
    /// nothing hangs on it but the count of what this removal freed (the
    /// age pass, which removes every candidate), the re-check's time is
    /// the look's: one reading after it. Either way, space still coming
    /// back is watched until it holds still (and the re-check made ahead
    /// then goes stale, and is made again). A candidate re-checked for a
    /// walk that ends after all (this removal freed more than its first
    /// reading said) is not removed; what the re-check learnt (an image in
    /// use again, or gone) stays true.
    pub(super) async fn confirm<R: Runtime>(
        &mut self,
        with: &mut Lent<'_, R>,
        confirming: Box<Confirming>,
        next: Option<&Candidate<'_>>,
        decides: bool,
        cx: &mut CycleContext<'_>,
    ) -> Option<Ahead> {
        let disk = cx.disk;
        let Confirming {
            mut removal,
            before,
            first,
            in_flight,
            unverified,
        } = *confirming;
        let verify = unverified.then_some(removal.id.as_str());
        let (after, ahead, status) = match next {
            None => match verify {
                Some(id) => {
                    let (after, status) = tokio::join!(disk.confirm(before, first), with.runtime.image_status(id));
                    (after, None, Some(status))
                }
                None => (disk.confirm(before, first).await, None, None),
            },
            Some(next) => {
                // Noted before its re-check, as in [`Remover::remove`].
                if !cx.report.dry_run && !self.noted_ahead_for(next.id) {
                    self.note_pending(with.clock, next);
                }
                let ahead = tokio::time::timeout(RECHECK_AHEAD_LIMIT, async {
                    let (found, status) = self.recheck_and_ask(with, next, verify, cx).await;
                    let answered = tokio::time::Instant::now();
                    (Ahead { found, answered }, status)
                });
                let (after, ahead) = if decides {
                    tokio::join!(disk.confirm(before, first), ahead)
                } else {
                    let ahead = ahead.await;
                    (disk.confirm_now(before, first).await, ahead)
                };
                match ahead {
                    Ok((ahead, status)) => (after, Some(ahead), status),
                    Err(_) => (after, None, None),
                }
            }
        };
        // Asked as the call returned, or beside the next re-check; once
        // more when that re-check ran out of time.
        let status = match (verify, status) {
            (Some(id), None) => Some(with.runtime.image_status(id).await),
            (_, status) => status,
        };
        if let Some(status) = status
            && self.still_there(with, &removal.id, &status, cx.report)
        {
            self.pending.forget(&removal.id);
        } else {
            removal.freed_bytes = Disk::freed(Some(before), after.ok());
            self.journal_removal(with, removal, cx.report).await;
        }
        drop(in_flight);
        if ahead.is_none()
            && let Some(next) = next
        {
            // The re-check timed out: [`Remover::remove`] notes the
            // removal again before the re-check it makes.
            self.drop_ahead(next.id);
        }
        ahead
    }

    /// A re-check made ahead for `id` that no removal will use (the walk
    /// ended, or went on to another candidate): its pending note goes.
    pub(super) fn drop_ahead(&mut self, id: &str) {
        self.pending.forget(id);
    }

    /// A removal made, measured: what it freed teaches the footprint, and
    /// it is journaled.
    async fn journal_removal<R: Runtime>(
        &mut self,
        with: &mut Lent<'_, R>,
        removal: Removal,
        report: &mut CycleReport,
    ) {
        if let Some(freed) = removal.freed_bytes {
            with.inventory.learn_footprint(removal.size, freed);
        }
        self.removed(with, removal, None, report).await;
    }

    /// What `RemoveImage` answered comes to: removed (with the filesystem
    /// once its space came back, or as it returned, to confirm; `None`
    /// when it could not be measured), kept (refused, gone already, or OK
    /// but still listed), or unknown. With `verify_later` (a next removal
    /// follows whatever this one comes to), a removal whose space was back
    /// as the call returned is not yet asked about (the third value):
    /// [`Remover::confirm`] asks beside the next re-check.
    async fn outcome<R: Runtime>(
        &mut self,
        with: &mut Lent<'_, R>,
        candidate: &Candidate<'_>,
        result: Result<Removed, RuntimeError>,
        before: Option<FsStats>,
        verify_later: bool,
        cx: &mut CycleContext<'_>,
    ) -> (Fate, Option<Returned>, bool) {
        let (disk, cancel) = (cx.disk, cx.cancel);
        let step = match result {
            Ok(Removed::AlreadyGone) => {
                gone_already(with.sinks, candidate);
                Fate::Kept
            }
            Ok(Removed::Done) => {
                // Whether the image is really gone is asked while the
                // space comes back, not after; in a hurry, not waited for.
                let hurried = cx.hurried;
                // Back already at the first reading, with a next removal
                // to come: asked beside its re-check instead.
                if verify_later
                    && !hurried
                    && let Some(back) = disk.back_at_once(before)
                {
                    return (Fate::Removed, Some(back), true);
                }
                let returned = async {
                    if hurried {
                        None
                    } else {
                        disk.returned(before).await.ok()
                    }
                };
                let (returned, status) = tokio::join!(returned, with.runtime.image_status(candidate.id));
                if self.still_there(with, candidate.id, &status, cx.report) {
                    return (Fate::Kept, None, false);
                }
                return (Fate::Removed, returned, false);
            }
            // The call failed, but the runtime may have removed the image
            // all the same (a deadline that passed while it worked, a
            // connection that broke): ask it.
            Err(err) => match Self::watch_unsettled(with, candidate.id, &err, cancel).await {
                Some(true) => {
                    let error = err.to_string();
                    with.sinks.emit(&Event::RemovedDespiteError {
                        id: candidate.id,
                        error: &error,
                    });
                    return (
                        Fate::Removed,
                        disk.settled(before).await.ok().map(Returned::Settled),
                        false,
                    );
                }
                Some(false) => {
                    let error = err.to_string();
                    with.sinks.emit(&Event::RemovalFailed {
                        id: candidate.id,
                        tags: candidate.tags,
                        reason: candidate.reason,
                        error: &error,
                    });
                    cx.report.failed.push((candidate.id.to_string(), error));
                    Fate::Kept
                }
                None => {
                    let error = err.to_string();
                    with.sinks.emit(&Event::RemovalUnsettled {
                        id: candidate.id,
                        error: &error,
                    });
                    cx.report.unsettled.push(candidate.id.to_string());
                    Fate::Unknown
                }
            },
        };
        (step, None, false)
    }

    /// Whether `ImageStatus` (`status`), asked after `RemoveImage` of `id`
    /// answered OK, still finds the image: a runtime that says "removed"
    /// and keeps it is not believed (said once, and the removal counted as
    /// failed).
    fn still_there<R: Runtime>(
        &mut self,
        with: &mut Lent<'_, R>,
        id: &str,
        status: &Status,
        report: &mut CycleReport,
    ) -> bool {
        if !matches!(status, Ok(Some(_))) {
            return false;
        }
        let first = !std::mem::replace(&mut self.said_lying, true);
        with.sinks.emit(&Event::RemovalNotDone {
            id,
            endpoint: with.runtime.endpoint(),
            first,
        });
        report.failed.push((
            id.to_string(),
            "RemoveImage answered OK, but the image is still listed".to_string(),
        ));
        true
    }

    /// After a `RemoveImage` that failed with `err`: `Some(true)` when the
    /// image is gone all the same (the runtime said so twice, at least
    /// [`GONE_CONFIRMED`] apart), `Some(false)` when the runtime refused
    /// and still has it, `None` when the outcome is unknown (the call timed
    /// out or broke, and the image is still listed after watching it for up
    /// to [`UNSETTLED_WATCH`] or until shutdown).
    async fn watch_unsettled<R: Runtime>(
        with: &Lent<'_, R>,
        id: &str,
        err: &RuntimeError,
        cancel: &CancellationToken,
    ) -> Option<bool> {
        let unknown = err.outcome_unknown();
        let mut deadline = tokio::time::Instant::now() + UNSETTLED_WATCH.min(with.settings.runtime_timeout);
        // Gone once the runtime said so twice, GONE_CONFIRMED apart, and
        // never there in between: one wrong answer is no removal. (Found
        // gone within the watch, it is watched until it can be confirmed.)
        let mut gone_since: Option<tokio::time::Instant> = None;
        loop {
            match with.runtime.image_status(id).await {
                Ok(None) => {
                    let at = tokio::time::Instant::now();
                    match gone_since {
                        Some(first) if at.saturating_duration_since(first) >= GONE_CONFIRMED => return Some(true),
                        Some(_) => {}
                        None => {
                            gone_since = Some(at);
                            deadline = deadline.max(at + GONE_CONFIRMED);
                        }
                    }
                }
                Ok(Some(_)) if !unknown => return Some(false),
                // Still there, or the runtime cannot say yet.
                Ok(Some(_)) => gone_since = None,
                Err(_) => {}
            }
            if tokio::time::Instant::now() >= deadline || cancel.is_cancelled() {
                return None;
            }
            tokio::select! {
                () = tokio::time::sleep(UNSETTLED_STEP) => {}
                () = cancel.cancelled() => {}
            }
        }
    }

    /// A removal known to have happened (or, in dry run, that would have):
    /// reported, journaled (with `note` when learnt later than the call),
    /// its record dropped and its image remembered for re-pulls; and, in a
    /// cycle, added to the report.
    async fn removed<R: Runtime>(
        &mut self,
        with: &mut Lent<'_, R>,
        removal: Removal,
        note: Option<&str>,
        report: &mut CycleReport,
    ) {
        let asked = self.pending.asked(&removal.id).filter(|_| !removal.dry_run);
        self.account(with, &removal, note, asked).await;
        report.removed.push(removal);
    }

    /// Journals a removal that happened; `asked` is its pending note's
    /// time, which the journal line carries.
    async fn account<R: Runtime>(
        &mut self,
        with: &mut Lent<'_, R>,
        removal: &Removal,
        note: Option<&str>,
        asked: Option<String>,
    ) {
        with.sinks.emit(&Event::Removed(removal));
        let mut entry = JournalEntry::from_removal(removal, with.clock.now());
        entry.note = note.map(str::to_string);
        entry.asked = asked;
        let journal = self.journal.clone();
        // File IO stays off the runtime's thread (metrics and health answer
        // from it); awaited, so the journal keeps the removals' order.
        let _ = tokio::task::spawn_blocking(move || journal.append(&entry)).await;
        if !removal.dry_run {
            // What a measured removal freed sizes the layers it freed.
            with.inventory
                .removed(&removal.id, removal.size, removal.freed_bytes, with.clock.now());
            self.thrash
                .remember(with.clock.now(), removal.id.clone(), removal.digests.clone());
            self.pending.journaled(&removal.id);
        }
    }

    /// Settles the pending removals (this process's or an earlier one's)
    /// against a listing: an image the listing omits is gone only when
    /// `ImageStatus` agrees (a listing may be partial), and a removal known
    /// gone goes through the same path as any removal. `ImageStatus` is
    /// asked about [`PENDING_ASKED_PER_LISTING`] images at most; an image
    /// it still finds is still there (the listing was partial), and one it
    /// cannot answer about stays unsure. See [`crate::store::pending`].
    pub(super) async fn settle_pending<R: Runtime>(&mut self, with: &mut Lent<'_, R>, images: &[Image]) {
        if self.pending.entries().is_empty() {
            return;
        }
        let listed: crate::collections::HashMap<&str, ()> = images.iter().map(|i| (i.id.as_str(), ())).collect();
        let listed = |id: &str| listed.contains_key(id);
        let asked = if images.is_empty() {
            Vec::new()
        } else {
            self.pending.next_to_ask(listed, PENDING_ASKED_PER_LISTING)
        };
        let answers = super::others::seen_twice(with.runtime, &asked).await;
        let answered: crate::collections::HashMap<&str, Seen> = asked.iter().map(String::as_str).zip(answers).collect();
        let seen = |id: &str| {
            if listed(id) {
                Seen::There
            } else {
                answered.get(id).copied().unwrap_or(Seen::Unsure)
            }
        };
        let settled = self.pending.settle(images.is_empty(), with.clock.now(), seen);
        for (pending, how) in settled {
            let entry = pending.entry;
            with.sinks.emit(&Event::PendingSettled {
                id: &entry.image,
                tags: &entry.tags,
                reason: &entry.reason,
                earlier_process: !pending.this_process,
                how,
            });
            if how != Settled::Gone {
                continue;
            }
            let note = if pending.this_process {
                "completed after RemoveImage failed"
            } else if self.journaled_already(&entry).await {
                // The process before journaled it and ended before it could
                // forget the note (forgetting is not synced): once is enough.
                self.pending.journaled(&entry.image);
                continue;
            } else {
                "completed after shutdown"
            };
            self.account(with, &removal_of(&entry), Some(note), Some(entry.time.clone()))
                .await;
        }
        self.pending.flush();
    }

    /// Whether the journal has the line of the removal `entry` notes: one
    /// for its image that says it was asked at the note's time.
    async fn journaled_already(&self, entry: &JournalEntry) -> bool {
        // Journal lines are stamped to the second, after the note.
        let since = entry
            .timestamp()
            .and_then(|t| t.checked_sub(std::time::Duration::from_secs(1)));
        let journal = self.journal.clone();
        let (image, asked) = (entry.image.clone(), entry.time.clone());
        tokio::task::spawn_blocking(move || {
            journal.read(since).is_ok_and(|lines| {
                lines
                    .iter()
                    .any(|line| line.image == image && line.asked.as_deref() == Some(asked.as_str()))
            })
        })
        .await
        .unwrap_or(false)
    }
}

/// The runtime said it does not have the candidate (`ImageStatus` or
/// `RemoveImage` answered `NotFound`): kept, and nothing more is
/// concluded from one answer. Whether someone else removed it is told
/// by the rule removals by others go by (a listing omits it **and**
/// `ImageStatus` says so; see [`super::others`]): its record stays
/// until then, so an image a runtime wrongly said it did not have keeps
/// its history, and none is counted removed.
fn gone_already(sinks: &Sinks, candidate: &Candidate<'_>) {
    sinks.emit(&Event::GoneAlready {
        id: candidate.id,
        tags: candidate.tags,
    });
}

/// The pending note of `candidate`'s removal, as written before it is
/// asked for.
fn pending_entry(clock: &Clock, candidate: &Candidate<'_>) -> JournalEntry {
    let removal = Removal {
        id: candidate.id.to_string(),
        tags: candidate.tags.to_vec(),
        digests: candidate.digests.to_vec(),
        reason: candidate.reason,
        size: candidate.size,
        freed_bytes: None,
        first_seen: candidate.first_seen,
        last_used: candidate.last_used,
        dry_run: false,
    };
    let mut entry = JournalEntry::from_removal(&removal, clock.now());
    // Its own time, to the nanosecond: what names this removal in the
    // journal line it becomes (see `JournalEntry::asked`).
    entry.time = humantime::format_rfc3339_nanos(clock.now()).to_string();
    entry
}

/// How many images of pending removals that a listing omits are asked
/// about (`ImageStatus`, all at once) at one listing: a listing may omit
/// many, and a few calls per listing settle the usual one or two pending
/// removals at once; the others are asked about at the next listings.
const PENDING_ASKED_PER_LISTING: usize = 4;

/// What the runtime says now of the use of `current` (the image as it is
/// now), for the keep rules: the containers listed now that name it under
/// the names it has now, and whether a sandbox image's name does. The
/// listing's other images tell which containers' ids and digests name an
/// image exactly (a container whose digest names another image does not use
/// every image its tag names).
fn uses_now<'c>(current: &Image, containers: &'c [Container], snapshot: &Snapshot) -> Uses<'c> {
    let listing: Vec<&Image> = snapshot
        .images
        .iter()
        .filter(|i| i.id != current.id)
        .chain(std::iter::once(current))
        .collect();
    let matches = matching::References::new(containers, &[]).matches(listing.iter().copied());
    Uses {
        containers: matches
            .users(listing.len() - 1)
            .iter()
            .map(|&c| containers[c as usize].id.as_str())
            .collect(),
        sandbox: matching::References::new(&[], &sandbox_names(snapshot))
            .matches(std::iter::once(current))
            .sandbox(0),
        pinned: current.pinned,
        // The ranks of the cycle's listing, in which the candidate is among
        // no repository's newest.
        newest: None,
        mounts_unknown: containers.iter().any(|c| c.mounts_unknown),
        sandbox_unknown: snapshot.sandbox_unknown(),
    }
}

/// The image as `ImageStatus` gave it, with the names the listing gave it
/// too (each once; `ImageStatus`'s first).
fn with_listed_names(current: Image, snapshot: &Snapshot) -> Image {
    match snapshot.images.iter().find(|listed| listed.id == current.id) {
        Some(listed) => crate::cri::merge_listings(vec![current, listed.clone()])
            .pop()
            .expect("one image"),
        None => current,
    }
}

/// The sandbox images' names, borrowed.
fn sandbox_names(snapshot: &Snapshot) -> Vec<&str> {
    snapshot.sandbox_images.iter().map(String::as_str).collect()
}

/// The removal a journal entry describes (times that do not parse read as
/// the epoch: they are only reported).
pub(super) fn removal_of(entry: &JournalEntry) -> Removal {
    let time = |t: &str| humantime::parse_rfc3339(t).unwrap_or(std::time::SystemTime::UNIX_EPOCH);
    Removal {
        id: entry.image.clone(),
        tags: entry.tags.clone(),
        digests: entry.digests.clone(),
        reason: if entry.reason == Reason::Age.as_str() {
            Reason::Age
        } else {
            Reason::Space
        },
        size: entry.size_bytes,
        freed_bytes: None,
        first_seen: time(&entry.first_seen),
        last_used: time(&entry.last_used),
        dry_run: false,
    }
}
