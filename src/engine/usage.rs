//! Every listing, in a cycle or between cycles, marks the images in use
//! now, gives images first seen their record, notices re-pulls and settles
//! pending removals; container events mark use between listings, and
//! [`UsageTracker`] decides when to list between cycles: every
//! `gc.usage_poll_interval`, or, while the runtime streams container events,
//! shortly after each burst of them.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_stream::StreamExt as _;
use tracing::{debug, info, warn};

use crate::cri::{ContainerEvent, EventStream, Runtime, RuntimeError};
use crate::fs::FsStats;
use crate::model::matching::InUse;
use crate::model::{Image, Snapshot};
use crate::policy::{CyclePlan, KeptImages, Protections};
use crate::records::{ImageFacts, RecordChanges};

use super::inventory::MismatchChange;
use super::observe::{ImageFs, RuntimeRead};
use super::{Collector, Event};

/// The node as one listing found it, with all a plan reads ([`Collector::observe`]):
/// the listing ([`Snapshot`]), what the records know of each of its images
/// ([`ImageFacts`]), the image filesystem and the keep rules from outside it.
#[derive(Debug)]
pub struct NodeView {
    /// What the runtime listed.
    pub snapshot: Snapshot,
    /// What the records made of it, by each image's place in the listing.
    pub listed: ImageFacts,
    /// The image filesystem (see [`ImageFs`]), or why it is unknown.
    pub image_fs: Result<ImageFs, RuntimeError>,
    /// The keep rules from outside the listing as they were when it was
    /// made (see [`Collector::protections_from`]).
    pub protections: Arc<Protections>,
}

impl<R: Runtime> Collector<R> {
    /// Asks the runtime for the layers of listed images whose layers are
    /// not known yet (see [`crate::policy::layers`]), at most
    /// [`LAYERS_PER_LISTING`]; forgets those of images no longer listed.
    /// An image the runtime says nothing of is not asked about again; a
    /// failed call ends the asking until the next listing.
    async fn learn_layers(&mut self, images: &[Image]) {
        let Some((unknown, mut all_asked)) = self.inventory.layers_to_learn(images) else {
            return;
        };
        for image in unknown {
            match self.runtime.image_layers(&image.id).await {
                Ok(layers) => {
                    if self.inventory.learnt_layers(&image.id, layers.as_deref()).is_break() {
                        return;
                    }
                }
                Err(err) => {
                    debug!(image = %image.id, error = %err, "the runtime did not tell the image's layers");
                    all_asked = false;
                    break;
                }
            }
        }
        if all_asked {
            self.inventory.all_layers_asked();
        }
    }

    /// Lists images, containers and the sandbox image, and updates the
    /// records. Also returns the image filesystem (see [`ImageFs`]).
    pub async fn observe(&mut self) -> Result<NodeView, RuntimeError> {
        let settings = &self.settings;
        let observation = self
            .inventory
            .observer()
            .observe(
                &self.runtime,
                settings.image_fs_path.as_deref(),
                settings.sandbox_image.as_deref(),
            )
            .await;
        self.sinks.emit(&Event::RuntimeUp(observation.is_ok()));
        if observation.is_err() {
            self.inventory.observation_broken();
        }
        let RuntimeRead {
            snapshot,
            image_fs,
            sandbox_unknown,
            sandbox_configured_unmatched,
            mounts_unread,
            dialect,
        } = observation?;
        self.inventory.observed_sandbox(sandbox_unknown);
        self.inventory.observed_runtime(dialect);
        self.note_image_fs(image_fs.as_ref().ok());
        self.note_sources(&snapshot, sandbox_configured_unmatched, mounts_unread.as_deref());
        self.sinks.emit(&Event::Seen {
            images: &snapshot.images,
            containers: &snapshot.containers,
        });
        let (observed, listed) = self.inventory.observed_snapshot(&snapshot, self.clock.now());
        self.note_listing(&observed, &snapshot.images).await;
        Ok(NodeView {
            snapshot,
            listed,
            image_fs,
            protections: self.protections(),
        })
    }

    /// The cycle's plan over a listing from [`Collector::observe`], its
    /// kept images listed, without removing anything, at `stats` (the
    /// image filesystem read after the listing): what `imagegc plan`
    /// shows. Beside it, the room the coming pulls get: those that fit and
    /// those that cannot, as the daemon's cycle weighs them.
    pub fn cycle_plan<'a>(
        &'a self,
        listing: &'a NodeView,
        stats: Option<&FsStats>,
    ) -> (CyclePlan<'a>, crate::policy::PullRoom) {
        let coming = self.coming_pulls(&listing.snapshot.images, &listing.protections);
        let cycle = CyclePlan::new(
            &listing.snapshot,
            &listing.listed,
            &self.settings.policy,
            &listing.protections,
            (self.clock.now(), self.clock.started()),
            KeptImages::Listed,
        );
        self.with_room(cycle, &coming, stats)
    }

    /// The pulls the pods of `listing` are about to make that room is not
    /// made for yet (see [`crate::policy::coming`]), when
    /// `kubernetes.room_before_pulls` is on.
    pub fn pulls_waiting(&self, listing: &NodeView) -> Vec<crate::policy::ComingPull> {
        self.inventory
            .waiting(&self.coming_pulls(&listing.snapshot.images, &listing.protections))
    }

    /// The largest recent pull, when `gc.headroom` keeps room for it.
    pub fn largest_recent_pull(&self) -> Option<&crate::policy::LargestPull> {
        self.inventory.largest_pull().filter(|_| self.settings.policy.headroom)
    }

    /// Lists images and containers between cycles: images first seen now
    /// get their record now (min age counts from when an image appeared,
    /// not from the next cycle), and the images containers use are marked
    /// used now. Like a cycle's listing, it tells whether the runtime
    /// answered: between cycles the poll is what notices an outage.
    pub async fn poll_usage(&mut self) -> Result<usize, RuntimeError> {
        // Not held beside the new listing (see the cycle).
        self.inventory.listing_started();
        let listings = self.inventory.observer().list(&self.runtime).await;
        self.sinks.emit(&Event::RuntimeUp(listings.is_ok()));
        if listings.is_err() {
            self.inventory.observation_broken();
        }
        let (images, containers) = listings?;
        self.sinks.emit(&Event::Seen {
            images: &images,
            containers: &containers,
        });
        let observed = self.inventory.observed(&images, &containers, self.clock.now());
        self.note_listing(&observed, &images).await;
        let in_use = InUse::new(&images, &containers).len();
        self.inventory.keep_images(images);
        Ok(in_use)
    }

    /// Marks the images a container event names used now. A container that
    /// is created and deleted between two listings is known only from its
    /// events; images without a record are left for the next full listing.
    /// A replayed event (containerd replays recent events to a new
    /// subscriber) counts at its own time, not at its arrival.
    pub fn mark_used_by_event(&mut self, event: &ContainerEvent) {
        let at = event
            .created_at
            .map_or_else(|| self.clock.now(), |stamped| self.clock.from_wall(stamped));
        self.inventory
            .mark_named_used(event.images.iter().map(String::as_str), at);
    }

    /// What a listing did beyond last-used times: the records' changes,
    /// re-pulls, and the pending removals it settles.
    async fn note_listing(&mut self, observed: &RecordChanges, images: &[Image]) {
        self.inventory.note_pulls(images, &observed.new, self.clock.now());
        self.learn_layers(images).await;
        if let Some(sizes) = &self.pull_sizes {
            // Images a registry's manifest sized, arrived: what the runtime
            // reports per manifest byte.
            for image in observed.new.iter().filter_map(|&i| images.get(i)) {
                if let Some(manifest) = sizes.read_for(image) {
                    self.inventory.learn_manifest(manifest, image.size);
                    tracing::debug!(image = %image.id, manifest_bytes = manifest, reported_bytes = image.size, factor = self.inventory.manifest_scale().factor(), "a pull a manifest sized arrived");
                }
            }
        }
        self.sinks.emit(&Event::Listed {
            observed,
            images: images.len(),
        });
        if self.inventory.read_only() {
            // `plan`: the daemon settles, journals and counts these.
            return;
        }
        let window = self.settings.thrash_window;
        let unreachable = self.remover.unreachable();
        for repull in self.remover.repulls(self.clock.now(), window, images, &observed.new) {
            self.sinks.emit(&Event::Repulled {
                image: &images[repull.index],
                removed_ago: repull.removed_ago,
                unreachable,
                thrash_window: window,
            });
        }
        // The removals imagegc asked for, before settling moves them on.
        let asked = self.remover.pending_images();
        let (remover, mut with) = self.removing();
        remover.settle_pending(&mut with, images).await;
        self.find_removed_by_others(&observed.unlisted, images, &asked).await;
    }

    /// Checks the image filesystem a listing found: starts or ends an
    /// episode in which the measured filesystem is not the runtime's, and
    /// notes the path the usage checks between cycles measure.
    fn note_image_fs(&mut self, image_fs: Option<&ImageFs>) {
        let mismatch = image_fs.and_then(|fs| fs.mismatch(self.probe.as_ref()));
        match self
            .inventory
            .observed_image_fs(image_fs.map(|fs| fs.path.as_path()), mismatch)
        {
            Some(MismatchChange::Started(why)) => self.sinks.emit(&Event::ImageFsMismatch(Some(&why))),
            Some(MismatchChange::Ended) => self.sinks.emit(&Event::ImageFsMismatch(None)),
            None => {}
        }
        let container_fs = image_fs.and_then(|fs| fs.container_fs(self.probe.as_ref()));
        self.sinks.emit(&Event::ContainerFsUsage(
            container_fs.as_ref().map(|(path, stats)| (path.as_path(), stats)),
        ));
        let container_path = container_fs.map(|(path, _)| path);
        if let (Some(fs), Some(path)) = (image_fs, &container_path)
            && self.said.container_fs.as_ref() != Some(path)
        {
            self.sinks.emit(&Event::SplitStore {
                image_fs: &fs.path,
                container_fs: path,
            });
        }
        if image_fs.is_some() {
            self.said.container_fs = container_path;
        }
    }

    /// Says, once per episode, that a container's mounts or a pod's sandbox
    /// image could not be read (images are kept meanwhile), and once per
    /// process that the sandbox image is named by no source, or that
    /// `runtime.sandbox_image` names no listed image.
    fn note_sources(&mut self, snapshot: &Snapshot, configured_unmatched: bool, mounts_unread: Option<&str>) {
        if self.said.mounts_unread != mounts_unread.is_some() {
            self.said.mounts_unread = mounts_unread.is_some();
            self.sinks.emit(&Event::MountsUnread(mounts_unread));
        }
        let pods_unread = snapshot.sandbox_pods_unread.as_deref();
        if self.said.sandbox_pods_unread != pods_unread.is_some() {
            self.said.sandbox_pods_unread = pods_unread.is_some();
            self.sinks.emit(&Event::SandboxPodsUnread(pods_unread));
        }
        if configured_unmatched && !std::mem::replace(&mut self.said.sandbox_configured, true) {
            let configured = self.settings.sandbox_image.as_deref().unwrap_or_default();
            self.sinks.emit(&Event::SandboxConfiguredUnmatched(configured));
        }
        if snapshot.sandbox_unknown()
            && pods_unread.is_none()
            && !std::mem::replace(&mut self.said.sandbox_unnamed, true)
        {
            self.sinks.emit(&Event::SandboxUnnamed);
        }
    }
}

/// How long after a container event the containers are listed: events
/// come in bursts (a pod's containers, a replayed backlog), and one listing
/// serves the whole burst.
const EVENT_POLL_DELAY: Duration = Duration::from_secs(1);
/// Event streams that end with no event, in a row, after which the runtime
/// is taken not to stream events (CRI-O with `enable_pod_events = false`
/// ends the stream at once) and containers are polled for good.
const EMPTY_STREAMS_BEFORE_POLLING: u32 = 3;
/// Delays before reopening a broken stream: doubling from the first to the
/// cap, back to the first only after a healthy stream.
const REOPEN_FIRST: Duration = Duration::from_secs(1);
const REOPEN_CAP: Duration = Duration::from_secs(60);
/// How long a stream must stay open, when it delivers no event, to count as
/// healthy (the reopen delay starts again from [`REOPEN_FIRST`]): a stream
/// that breaks sooner is reopened after twice the delay before it. As long
/// as the cap: an idle node's stream may rightly carry no event for that long.
const HEALTHY_AFTER: Duration = REOPEN_CAP;

/// How the loop learns about container use between cycles.
enum Source {
    /// NodeView containers every `gc.usage_poll_interval`: the default, and
    /// what a runtime without events gets.
    Polling,
    /// Following the runtime's container events. The stream opens when it
    /// is first polled, inside the loop's `select!`: runtimes answer the
    /// open only with the first event.
    Events {
        stream: EventStream,
        received: u64,
        /// When it was opened.
        opened: Instant,
        /// The reopen delay that led to it.
        delay: Duration,
    },
    /// The stream broke (or is yet to be opened): open it at this time,
    /// polling meanwhile.
    Reopen(Instant, Duration),
}

/// What the usage tracker follows of the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tracking {
    /// `gc.usage_poll_interval`: how often containers are listed while
    /// polling.
    pub poll_interval: Duration,
    /// `runtime.container_events`: follow the runtime's container events.
    pub container_events: bool,
}

/// When to list between cycles, and the container event stream.
pub struct UsageTracker {
    tracking: Tracking,
    source: Source,
    /// When the next poll is due while polling.
    next_poll: Instant,
    /// A listing asked for by container events, coalesced.
    poll_soon: Option<Instant>,
    /// Streams that ended with no event, in a row; past the limit, events
    /// are given up on for the life of the process.
    empty_streams: u32,
    given_up: bool,
}

impl UsageTracker {
    /// Polling, or events when `runtime.container_events` asks for them.
    pub fn new(tracking: Tracking) -> Self {
        UsageTracker {
            tracking,
            source: source(tracking, false),
            next_poll: Instant::now() + tracking.poll_interval,
            poll_soon: None,
            empty_streams: 0,
            given_up: false,
        }
    }

    /// Follows a reloaded configuration: the poll interval, and events
    /// switched on or off.
    pub fn reconfigure(&mut self, tracking: Tracking) {
        self.tracking = tracking;
        self.next_poll = Instant::now() + tracking.poll_interval;
        if tracking.container_events != !matches!(self.source, Source::Polling) {
            self.source = source(tracking, self.given_up);
        }
    }

    /// Opens the event stream when it is due (call while the runtime is up).
    pub fn open_stream_if_due<R: Runtime>(&mut self, runtime: &R) {
        if let Source::Reopen(at, delay) = self.source
            && Instant::now() >= at
        {
            debug!(
                retry_in_ms = delay.as_millis() as u64,
                "opening the container event stream"
            );
            self.source = Source::Events {
                stream: runtime.container_events(),
                received: 0,
                opened: Instant::now(),
                delay,
            };
        }
    }

    /// When to list containers next: the poll while polling, soon after
    /// events while following them.
    pub fn poll_at(&self) -> Option<Instant> {
        match self.source {
            Source::Events { .. } => self.poll_soon,
            _ => Some(self.next_poll),
        }
    }

    /// When the event stream is to be reopened.
    pub fn reopen_at(&self) -> Option<Instant> {
        match self.source {
            Source::Reopen(at, _) => Some(at),
            _ => None,
        }
    }

    /// A listing was made (or tried).
    pub fn polled(&mut self) {
        self.poll_soon = None;
        self.next_poll = Instant::now() + self.tracking.poll_interval;
    }

    /// The next container event; pending forever while not following them.
    pub async fn next_event(&mut self) -> Option<Result<ContainerEvent, RuntimeError>> {
        match &mut self.source {
            Source::Events { stream, .. } => stream.next().await,
            _ => std::future::pending().await,
        }
    }

    /// Handles what [`UsageTracker::next_event`] gave: an event to mark use
    /// from, or a stream that ended or broke (reopened with backoff, or
    /// given up on for polling).
    pub fn received(&mut self, event: Option<Result<ContainerEvent, RuntimeError>>) -> Option<ContainerEvent> {
        let poll_interval = crate::time::short(self.tracking.poll_interval);
        match event {
            Some(Ok(event)) => {
                if let Source::Events { received, .. } = &mut self.source {
                    *received += 1;
                }
                self.empty_streams = 0;
                self.poll_soon.get_or_insert(Instant::now() + EVENT_POLL_DELAY);
                return Some(event);
            }
            Some(Err(err)) if err.is_unimplemented() => {
                info!(
                    %poll_interval,
                    "the runtime does not stream container events; polling containers to track image use"
                );
                self.give_up();
            }
            Some(Err(err)) => {
                debug!(error = %err, "container event stream broke; polling until it is back");
                self.reopen();
            }
            None => {
                let received = matches!(self.source, Source::Events { received, .. } if received > 0);
                self.empty_streams = if received { 0 } else { self.empty_streams + 1 };
                if self.empty_streams >= EMPTY_STREAMS_BEFORE_POLLING {
                    warn!(
                        %poll_interval,
                        "the runtime ends the container event stream as soon as it is opened \
                         (CRI-O does with enable_pod_events = false, its default): polling containers instead"
                    );
                    self.give_up();
                } else {
                    debug!(received, "container event stream ended; polling until it is back");
                    self.reopen();
                }
            }
        }
        None
    }

    fn give_up(&mut self) {
        self.given_up = true;
        self.source = Source::Polling;
    }

    /// The next attempt to open the stream: after [`REOPEN_FIRST`] when the
    /// stream was healthy (it delivered an event, or stayed open for
    /// [`HEALTHY_AFTER`]), else after twice the delay before it, up to
    /// [`REOPEN_CAP`]: a stream that breaks as soon as it opens is not
    /// reopened every second forever.
    fn reopen(&mut self) {
        let delay = match self.source {
            Source::Events {
                received,
                opened,
                delay,
                ..
            } if received == 0 && opened.elapsed() < HEALTHY_AFTER => (delay * 2).min(REOPEN_CAP),
            Source::Reopen(_, delay) => (delay * 2).min(REOPEN_CAP),
            _ => REOPEN_FIRST,
        };
        self.source = Source::Reopen(Instant::now() + delay, delay);
    }
}

/// How usage is tracked: events when configured (and not given up on),
/// polling otherwise.
fn source(tracking: Tracking, given_up: bool) -> Source {
    if tracking.container_events && !given_up {
        info!("following container events to track image use between cycles (runtime.container_events)");
        Source::Reopen(Instant::now(), REOPEN_FIRST)
    } else {
        Source::Polling
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::fake::SimHandle;

    /// A runtime whose event stream breaks as soon as it is opened (a
    /// runtime that accepts the call and fails it at once).
    fn breaks_at_once() -> SimHandle {
        let sim = SimHandle::default();
        sim.with(|s| s.events_break = true);
        sim
    }

    fn opens(runtime: &SimHandle) -> usize {
        runtime.0.lock().unwrap().event_opens
    }

    /// Container events followed, polling every 30 s meanwhile.
    const EVENTS: Tracking = Tracking {
        poll_interval: Duration::from_secs(30),
        container_events: true,
    };

    /// Drives the tracker as the daemon loop does, for `span` of tokio's
    /// paused clock: returns the delays between one open and the next.
    async fn reopen_gaps(runtime: &SimHandle, span: Duration) -> Vec<Duration> {
        let mut tracker = UsageTracker::new(EVENTS);
        let start = Instant::now();
        let mut opened_at = Vec::new();
        while start.elapsed() < span {
            let before = opens(runtime);
            tracker.open_stream_if_due(runtime);
            if opens(runtime) > before {
                opened_at.push(Instant::now());
                let event = tracker.next_event().await;
                assert!(tracker.received(event).is_none());
            }
            let Some(at) = tracker.reopen_at() else { break };
            tokio::time::sleep_until(at).await;
        }
        opened_at.windows(2).map(|w| w[1] - w[0]).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_breaks_as_soon_as_it_opens_is_reopened_ever_later_up_to_the_cap() {
        let runtime = breaks_at_once();
        let gaps = reopen_gaps(&runtime, Duration::from_secs(600)).await;
        let secs: Vec<u64> = gaps.iter().map(Duration::as_secs).collect();
        assert_eq!(secs[..7], [2, 4, 8, 16, 32, 60, 60], "{secs:?}");
        assert!(opens(&runtime) < 20, "{} opens in 10 minutes", opens(&runtime));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_stayed_open_long_enough_is_reopened_at_once() {
        let runtime = breaks_at_once();
        let mut tracker = UsageTracker::new(EVENTS);
        // Two quick breaks: the delay doubled twice.
        for _ in 0..2 {
            tokio::time::sleep_until(tracker.reopen_at().unwrap()).await;
            tracker.open_stream_if_due(&runtime);
            let event = tracker.next_event().await;
            tracker.received(event);
        }
        assert_eq!(tracker.reopen_at().unwrap() - Instant::now(), Duration::from_secs(4));
        // Then one that lived past HEALTHY_AFTER: back to the first delay.
        tokio::time::sleep_until(tracker.reopen_at().unwrap()).await;
        tracker.open_stream_if_due(&runtime);
        tokio::time::advance(HEALTHY_AFTER).await;
        let event = tracker.next_event().await;
        tracker.received(event);
        assert_eq!(tracker.reopen_at().unwrap() - Instant::now(), REOPEN_FIRST);
    }
}
