//! The engine: what happens between the runtime's answers and the removals,
//! each part in its own module.
//!
//! - `observe`: reading the runtime (images, containers and their
//!   mounts, sandbox images from every source, the image filesystem, the
//!   runtime's [`crate::model::Dialect`]). A call a runtime answers its own
//!   way goes there; what a runtime does where the CRI leaves it open is a
//!   fact of the dialect.
//! - `cycle`: one cycle: observe, plan ([`crate::policy`]), the age
//!   pass, then the space pass driven by the policy's [`crate::policy::Walk`].
//! - `removal`: one removal's lifecycle: re-check, pending note,
//!   `RemoveImage`, measuring what came back, settling what the runtime did
//!   not tell (`crate::store::pending`).
//! - `thrash`: the memory of recent removals (re-pulls) and of the
//!   episode in which images cannot reach low. Pure.
//! - `usage`: marking images used between cycles (polls and container
//!   events).
//! - [`events`]: what the engine reports, typed, and the [`Sink`]s that
//!   turn it into logs, metrics and health. A new metric or log line is a
//!   sink's business, not the engine's.
//! - [`sinks`]: the outputs, one to a file (the CRI client's call
//!   metrics among them).
//! - [`report`]: what a cycle did ([`CycleReport`]).
//! - `settings`: what the engine reads of the configuration
//!   ([`Settings`]: the policy and a few settings of how it runs), made
//!   once per configuration; no other engine code reads `Config`.
//! - `inventory`: what the node holds as the listings found it
//!   (`Inventory`: the records and their saves, the image filesystem, the
//!   sandbox image, the runtime's dialect and footprint, the layers, the
//!   pulls that came and are coming), and [`Restored`], what a collector
//!   starts from (the only IO of a start).
//! - `others`: images removed by someone else, watched from the listing
//!   that omits them until `ImageStatus` settles it.
//!
//! [`Collector`] coordinates the cycle's script: the runtime, its settings
//! and the outputs, with its `Inventory` (listings go in through its
//! methods) and its `removal::Remover` (pending notes, journal, re-pull
//! memory, the removal in flight, the images a listing omitted). Both keep
//! their fields private: the rest of the engine asks them. One cycle's
//! removals share a `removal::CycleContext` (the listing, the disk,
//! shutdown, the report).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::cri::Runtime;

use crate::fs::{FsProbe, FsStats};
use crate::model::Image;
use crate::outputs::metrics::Metrics;
use crate::policy::{ComingPull, CyclePlan, DiskFootprint, Protections, PullRoom};
use crate::records::Records;
use crate::time::Clock;
use tokio::sync::watch;

mod cycle;
pub mod events;
mod inventory;
mod observe;
mod others;
mod removal;
mod restored;
pub mod report;
mod settings;
pub mod sinks;
mod thrash;
mod usage;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;

pub use events::{Event, Sink};
use inventory::Inventory;
pub use observe::{ImageFs, Observer, RuntimeRead};
pub use removal::RemovalInFlight;
use removal::Remover;
pub use report::{CycleError, CycleReport, Outcome, Removal};
pub use restored::Restored;
pub use settings::Settings;
pub use sinks::{HealthSink, LogSink, MetricsSink, Sinks};
pub use usage::{NodeView, Tracking, UsageTracker};

/// The longest the state file goes unsaved while only last-used times of
/// images in use move: it bounds how late age removals can come after a
/// crash (see `Collector::save_if_due`).
pub const STATE_REFRESH: Duration = Duration::from_secs(30 * 60);

/// The event that says `settings` are in force.
fn configured(settings: &Settings) -> Event<'static> {
    Event::Configured {
        dry_run: settings.dry_run,
        high: settings.policy.target.high_percent(),
        low: settings.policy.target.low_percent(),
        kubelet: settings.kubelet,
    }
}

/// What is said once per episode or once per process.
#[derive(Debug, Default)]
struct Said {
    /// A container's mounted images could not be read at the last listing.
    mounts_unread: bool,
    /// A pod's sandbox image could not be read at the last listing.
    sandbox_pods_unread: bool,
    /// The missing sandbox image (once per process).
    sandbox_unnamed: bool,
    /// `runtime.sandbox_image` naming no listed image (once per process).
    sandbox_configured: bool,
    /// The kubelet-eviction check against the measured capacity (once).
    eviction_checked: bool,
    /// The separate container filesystem last said (a split store).
    container_fs: Option<std::path::PathBuf>,
}

/// The collector: it coordinates the runtime, the policy and the outputs
/// with its two parts, the [`Inventory`] (what the node holds, as the
/// listings found it) and the [`Remover`] (this process's removals).
pub struct Collector<R> {
    runtime: R,
    /// What it reads of the configuration, the policy included (its keep
    /// rules compiled once), made when the configuration came.
    settings: Settings,
    probe: Arc<dyn FsProbe>,
    metrics: Arc<Metrics>,
    sinks: Sinks,
    clock: Clock,
    inventory: Inventory,
    remover: Remover,
    said: Said,
    /// Keep rules from outside the listing (pods bound to this node), the
    /// latest of which is read at each plan and each re-check.
    protections: watch::Receiver<Arc<Protections>>,
    /// When the last cycle ended above low: when the next one comes
    /// ([`crate::policy::CyclePlan::look_again`]).
    look_again_at: Option<tokio::time::Instant>,
    /// Sizes of coming pulls the node's history cannot size
    /// (`kubernetes.registry_manifests`).
    pull_sizes: Option<Arc<dyn PullSizes>>,
}

/// Sizes of images the node never had a repository of, from elsewhere than
/// the node's history (their registry's manifest, see
/// `crate::kubernetes::registry`), for room before the pull.
pub trait PullSizes: Send + Sync {
    /// The size `reference` will be reported at once pulled, when known;
    /// otherwise asks for it (never waiting), so that a later call may
    /// know it.
    fn size_of(&self, reference: &str) -> Option<u64>;

    /// The size read for a reference that names `image`, when one was
    /// read; never asks.
    fn read_for(&self, image: &Image) -> Option<u64>;

    /// A receiver that changes when a size asked for is known (or given
    /// up on): the daemon checks usage again then.
    fn answers(&self) -> Option<watch::Receiver<u64>>;
}

impl<R: Runtime> Collector<R> {
    /// Loads what a collector starts from from `state_dir` (see
    /// [`Restored`]), then creates it.
    pub fn load(
        runtime: R,
        settings: Settings,
        state_dir: &Path,
        probe: Arc<dyn FsProbe>,
        metrics: Arc<Metrics>,
        clock: Clock,
    ) -> Self {
        let restored = Restored::load(state_dir, &clock, &settings);
        Self::new(runtime, settings, restored, probe, metrics, clock)
    }

    /// Creates a collector from what was loaded: no IO.
    pub fn new(
        runtime: R,
        settings: Settings,
        restored: Restored,
        probe: Arc<dyn FsProbe>,
        metrics: Arc<Metrics>,
        clock: Clock,
    ) -> Self {
        let sinks = Sinks::standard(&metrics);
        let (inventory, remover) = restored.into_parts(clock.now());
        sinks.emit(&Event::HistoryLoaded {
            last_success: inventory.last_success(),
        });
        sinks.emit(&configured(&settings));
        Collector {
            runtime,
            settings,
            probe,
            metrics,
            sinks,
            clock,
            inventory,
            remover,
            said: Said::default(),
            look_again_at: None,
            protections: watch::channel(Arc::default()).1,
            pull_sizes: None,
        }
    }

    /// Sizes the coming pulls of repositories the node never had by
    /// `sizes` (`kubernetes.registry_manifests`).
    pub fn with_pull_sizes(mut self, sizes: Arc<dyn PullSizes>) -> Self {
        self.pull_sizes = Some(sizes);
        self
    }

    /// A receiver that changes when a coming pull's size asked for is
    /// known, when pulls are sized that way.
    pub fn pull_size_answers(&self) -> Option<watch::Receiver<u64>> {
        self.pull_sizes.as_ref().and_then(|sizes| sizes.answers())
    }

    /// Adds an output for the engine's events (see [`events`]).
    pub fn with_sink(mut self, sink: Arc<dyn Sink>) -> Self {
        self.sinks.push(sink);
        self
    }

    /// Reports progress (liveness) to the health endpoint while cycles run.
    pub fn with_health(self, health: Arc<crate::outputs::health::Health>) -> Self {
        self.with_sink(Arc::new(HealthSink(health)))
    }

    /// Sets the keep rules from outside the runtime's listing (the pods
    /// bound to this node): they hold from the next plan and re-check on.
    pub fn set_protections(&mut self, protections: Protections) {
        self.protections = watch::channel(Arc::new(protections)).1;
    }

    /// Takes the keep rules from outside the runtime's listing from
    /// `source`, which a watch of the pods bound to this node updates: each
    /// plan and each re-check reads its latest value, never waiting.
    pub fn protections_from(&mut self, source: watch::Receiver<Arc<Protections>>) {
        self.protections = source;
    }

    /// The keep rules from outside the listing, as they are now.
    fn protections(&self) -> Arc<Protections> {
        Arc::clone(&self.protections.borrow())
    }

    /// The settings in force: the ones given at start, or the last reload
    /// (see [`Collector::set_settings`]).
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Applies the settings of a reloaded configuration from the next
    /// cycle on.
    pub fn set_settings(&mut self, settings: Settings) {
        self.sinks.emit(&configured(&settings));
        self.settings = settings;
    }

    /// The per-image records as of the last listing (saved to the state file).
    pub fn records(&self) -> &Records {
        self.inventory.records()
    }

    /// The runtime the collector talks to.
    pub fn runtime(&self) -> &R {
        &self.runtime
    }

    /// The clock the collector reads `now` from.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The metric families this collector updates.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// When the last successful cycle ended: this process's, or the one
    /// the state file remembers (what the next save keeps).
    pub fn last_success(&self) -> Option<std::time::SystemTime> {
        self.inventory.last_success()
    }

    /// The removal in flight, as it goes (see [`crate::daemon`]'s shutdown).
    pub fn removal_in_flight(&self) -> RemovalInFlight {
        self.remover.in_flight()
    }

    /// Why the measured filesystem is not the runtime's image filesystem,
    /// as the last listing found it.
    pub fn image_fs_mismatch(&self) -> Option<&str> {
        self.inventory.image_fs_mismatch()
    }

    /// When the last cycle could not reach low: when the next one comes, by
    /// the cycle's plan ([`crate::policy::CyclePlan::look_again`]: sooner
    /// than the interval when images it kept only for being younger than
    /// `gc.min_age` become removable, since usage that stays above high is
    /// not a crossing).
    pub fn look_again_at(&self) -> Option<tokio::time::Instant> {
        self.look_again_at
    }

    /// How many listings (a cycle's or a poll's) showed images first seen
    /// then: grows when images arrive on the node. A cycle that could not
    /// bring usage below high is worth running again once it did, since
    /// the new images may be removable (or may go once older than
    /// `gc.min_age`).
    pub fn arrivals(&self) -> u64 {
        self.inventory.arrivals()
    }

    /// The images' layers and the measured layers, as this collector knows
    /// them (see [`crate::policy::layers`]).
    pub fn layers(&self) -> &crate::policy::LayerBook {
        self.inventory.layers()
    }

    /// What an image takes on disk per reported byte, as this collector
    /// knows it.
    pub fn footprint(&self) -> DiskFootprint {
        self.inventory.footprint()
    }

    /// `cycle` with its thresholds lowered for the room pulls need (see
    /// [`CyclePlan::with_room_for`]): the largest recent pull's, and that of
    /// the pulls of `coming` room is not made for yet, beside what those it
    /// was made for still have to bring when `stats` was read (all of it,
    /// unread). The daemon's cycle and `plan` both come here, so that they
    /// give a pull the same room.
    fn with_room<'a>(
        &self,
        cycle: CyclePlan<'a>,
        coming: &[ComingPull],
        stats: Option<&FsStats>,
    ) -> (CyclePlan<'a>, PullRoom) {
        cycle.with_room_for(
            self.inventory.largest_pull(),
            (
                &self.inventory.waiting(coming),
                self.inventory.landing(coming, stats.map(FsStats::available)),
            ),
            self.inventory.footprint(),
            stats,
        )
    }

    /// Says which coming pulls cannot fit, when that changed.
    fn note_cannot_fit(&mut self, pulls: &[ComingPull]) {
        let images: Vec<String> = pulls.iter().map(|pull| pull.image.clone()).collect();
        if self.inventory.note_cannot_fit(images) {
            self.sinks.emit(&Event::PullsCannotFit {
                pulls,
                footprint: self.inventory.footprint(),
            });
        }
    }

    /// Whether the thresholds in force went down since this was last
    /// asked (a coming pull sized, a pod bound to the node): for the
    /// daemon's loop, a new crossing of high, whatever usage was before.
    pub fn thresholds_moved(&mut self) -> bool {
        self.inventory.take_thresholds_moved()
    }

    /// The pulls that pods bound to the node (`protections`) are about to
    /// make of images not among `images`, each sized by the node's largest
    /// image of its repository or, for a repository the node never had, by
    /// its registry's manifest when `kubernetes.registry_manifests` is on
    /// (those sized by neither are not counted), when
    /// `kubernetes.room_before_pulls` is on.
    fn coming_pulls(&self, images: &[Image], protections: &Protections) -> Vec<ComingPull> {
        if !self.settings.policy.room_before_pulls {
            return Vec::new();
        }
        self.inventory.coming_pulls(
            images,
            protections,
            self.pull_sizes.as_deref(),
            || self.image_fs_bytes(),
            self.clock.now(),
        )
    }

    /// The image filesystem's size, when it can be measured.
    fn image_fs_bytes(&self) -> Option<u64> {
        let path = self.inventory.disk_path()?;
        self.probe.stats(path).ok().map(|stats| stats.capacity_bytes)
    }

    /// The same collector, knowing what `known` notes of containers and
    /// pods (see [`crate::store::state::Known`]): those cost no call.
    pub fn knowing(mut self, known: crate::store::state::Known) -> Self {
        self.inventory = self.inventory.knowing(known);
        self
    }

    /// Whether this collector makes room before the pulls of pods bound to
    /// the node (`kubernetes.room_before_pulls`, with the pods watched).
    pub fn makes_room_before_pulls(&self) -> bool {
        self.settings.policy.room_before_pulls
    }

    /// A receiver of the keep rules from outside the listing, to wake on
    /// their changes (a pod bound to the node may bring a pull).
    pub fn protections_changes(&self) -> watch::Receiver<Arc<Protections>> {
        self.protections.clone()
    }

    /// Measures the image filesystem between cycles (statvfs: no call to
    /// the runtime) and publishes usage. Returns whether a space pass is
    /// due; `None` when there is nothing to measure yet, or the measurement
    /// failed (the next cycle reports it).
    pub fn check_usage(&mut self) -> Option<bool> {
        let stats = self.probe.stats(self.inventory.disk_path()?).ok()?;
        let coming = self.coming_pulls(self.inventory.last_images(), &self.protections());
        let waiting = self.inventory.waiting(&coming);
        let landing = self.inventory.landing(&coming, Some(stats.available()));
        let policy = Arc::clone(&self.settings.policy);
        let footprint = self.inventory.footprint();
        // Not bounded by what images could free: that takes a plan, which
        // the cycle this starts makes from a fresh listing (a pull that
        // cannot fit gets no room there). Between cycles every pull
        // counts, so that no crossing is missed.
        let pulls = policy.room_for_pulls(&waiting, landing, footprint, None);
        let target =
            policy
                .target
                .with_headroom(policy.headroom_for(self.inventory.largest_pull(), pulls.bytes, footprint));
        let due = target.due(&stats);
        self.inventory.note_in_force(target.in_force(stats.capacity_bytes));
        if !due {
            // The room is there: a pull's own blobs must not start a pass.
            self.inventory
                .room_made(&coming, &pulls.fit, stats.available(), footprint);
        }
        self.sinks.emit(&Event::Usage { stats: &stats, due });
        Some(due)
    }

    /// Saves the records; a failure is logged, never fatal: the collector
    /// goes on and tries again at the next save.
    pub async fn save(&mut self) {
        match self.inventory.save(self.clock.now()).await {
            Ok(records) => self.sinks.emit(&Event::Saved(Ok(records))),
            Err(err) => self.sinks.emit(&Event::Saved(Err(&err))),
        }
        self.inventory.save_known().await;
    }

    /// Saves the records when something other than the last-used times of
    /// images in use changed, or when the last save is [`STATE_REFRESH`]
    /// old. Skipping the others loses nothing a restart needs: on load, the
    /// time since the save beyond one interval moves every last-used time
    /// forward, which covers the images still in use since (they are in
    /// use again at the first listing anyway); the cost falls on the safe
    /// side, age removals after a crash coming up to [`STATE_REFRESH`]
    /// late. A clean shutdown always saves.
    async fn save_if_due(&mut self) {
        if self.inventory.save_due(self.clock.now()) {
            self.save().await;
        } else {
            tracing::debug!("records unchanged but for last-used times: state save skipped");
        }
    }
}
