//! The replay: a [`Trace`] played against a simulated node, with simulated
//! time, under one collection policy, counting what matters: the bytes the
//! node pulls again because a removed image was needed.
//!
//! The node ([`Node`]) stores layers once, however many images share them;
//! a container start pulls the layers of its image the disk lacks (a
//! **re-pull** when a layer was on disk before, a first pull otherwise); an
//! image in use by a container cannot be removed; removing an image frees
//! the layers no other image on disk holds. The disk's used bytes are the
//! layers plus a fixed amount of other data. Pulls are instant and never
//! fail: a pull past the capacity is counted (`full_pulls`) and the usage
//! goes past 100%.
//!
//! The policies:
//! - [`Imagegc`]: the daemon's own rules, not a copy: the records
//!   ([`crate::records::Records`]) updated from a listing, the cycle's
//!   script ([`crate::policy::CyclePlan`]: the planner, the room the
//!   coming pulls get, and the space walk [`crate::policy::Walk`] measured
//!   after each removal). Cycles and usage checks come when the daemon's
//!   own schedule ([`crate::policy::Schedule`], which `daemon::run`
//!   follows) says: every `gc.interval`, at the first usage check after
//!   usage crosses the high threshold, at once when a pod bound brings a
//!   pull that needs room, and when a space pass that stopped above low
//!   for images too young can go on; containers mark their image used
//!   when they start and when they go (the daemon's polls and events see
//!   them in between). Images are first seen by the cycles' listings (the
//!   daemon's usage polls, which may see them sooner, are not simulated),
//!   and the runtime never fails. The thrash hold-back
//!   (`gc.thrash_window`) is not simulated.
//! - [`Kubelet`]: the kubelet's image GC (docs/kubelet.md): every 5 minutes
//!   it detects images and the containers using them, and when usage is at
//!   or above high, removes unused images in its order (never used first,
//!   then least recently used, ties by first detected) crediting each
//!   image's reported size (shared layers counted in every image) until
//!   the credit covers what reaching low needs. Its eviction manager's
//!   removal of every unused image is not simulated.
//! - [`Belady`]: an offline policy that knows when each image is needed
//!   next (an achievable schedule, not a bound; see [`super::bound`]).
//!
//! Between two events, the wakes of a policy in which nothing can change
//! are counted without being run ([`Policy::quiet_until`]): a gap in a
//! trace costs a few steps however long it is, with the same result.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use crate::config::Order;
use crate::engine::Settings;
use crate::fs::FsStats;
use crate::model::{Container, ContainerState, Image, Snapshot};
use crate::policy::cycle::USAGE_CHECK_INTERVAL;
use crate::policy::schedule::{Ended, Measured, Schedule};
use crate::policy::{
    AgePass, ComingPull, CyclePlan, DiskFootprint, GcPolicy, Headroom, KeptImages, LargestPull, LayerBook, Protections,
    RepoSizes, SpaceTarget, Step,
};
use crate::records::Records;

use super::trace::{Action, Seconds, Trace};

/// The sandbox image the simulated runtime names (never listed: the
/// planner then knows no listed image is the sandbox image).
const SANDBOX_IMAGE: &str = "registry.k8s.io/pause:3.10";

/// How often the daemon measures usage between cycles
/// ([`USAGE_CHECK_INTERVAL`]): a cycle starts this long after usage crosses
/// the high threshold.
const USAGE_CHECK: Seconds = USAGE_CHECK_INTERVAL.as_secs();

/// The kubelet's image GC period.
const KUBELET_PERIOD: Seconds = 300;

/// What one policy did over a replay.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Tally {
    /// The policy's name.
    pub policy: String,
    /// Bytes of layers pulled again: on disk before, removed, needed again.
    pub repulled_bytes: u64,
    /// Container starts that pulled an image the node had held before.
    pub repulled_images: u64,
    /// Bytes of layers pulled for the first time (the same for every policy).
    pub first_pull_bytes: u64,
    /// Images removed.
    pub removals: u64,
    /// Collection cycles run.
    pub cycles: u64,
    /// Cycles that found usage at or above the high threshold.
    pub space_passes: u64,
    /// Space passes that ended above the low threshold.
    pub passes_short: u64,
    /// The highest usage reached, in percent of the capacity (above 100
    /// when pulls overflowed the disk).
    pub peak_usage_percent: f64,
    /// Hours with usage at or above the high threshold.
    pub hours_above_high: f64,
    /// Hours with available bytes below the kubelet's eviction line
    /// (`imagefs.available`, 15% unless configured).
    pub hours_above_eviction: f64,
    /// Pulls that did not fit on the disk.
    pub full_pulls: u64,
    /// Pulls that took available bytes from the kubelet's eviction line or
    /// above to below it in one step: the kubelet's eviction manager, which
    /// looks every 10 s, evicts a pod unless a collector frees space first.
    pub pulls_past_eviction: u64,
    /// The images' bytes on disk, averaged over time (rounded up).
    pub mean_image_bytes: u64,
    /// The most the images' bytes on disk ever were.
    pub peak_image_bytes: u64,
    /// The images removed, in order (tests compare it with the daemon's).
    #[cfg(test)]
    #[serde(skip)]
    pub removed: Vec<u32>,
    /// When imagegc's cycles started, skipped ones included, as runs
    /// (first, period, how many): tests compare them with the daemon's.
    #[cfg(test)]
    #[serde(skip)]
    pub cycle_starts: Vec<(Seconds, Seconds, u64)>,
}

/// The simulated node: layers on disk, images, containers.
pub struct Node<'t> {
    trace: &'t Trace,
    capacity: u64,
    other: u64,
    high: u8,
    eviction_available: u64,
    layer_refs: Vec<u32>,
    layer_seen: Vec<bool>,
    present: Vec<bool>,
    was_present: Vec<bool>,
    users: Vec<u32>,
    containers: BTreeMap<u64, u32>,
    image_bytes: u64,
    clock: Seconds,
    image_byte_seconds: u128,
    /// Seconds at or above high, and below the eviction line: counted in
    /// whole seconds, so that the figures do not depend on how time was
    /// split into steps (see [`replay`]).
    seconds_above_high: u64,
    seconds_above_eviction: u64,
    tally: Tally,
}

impl<'t> Node<'t> {
    /// An empty node: `capacity` bytes of disk, `other` of them taken by
    /// data that is not images.
    pub fn new(trace: &'t Trace, capacity: u64, other: u64, settings: &Settings) -> Self {
        let eviction_available = settings.policy.eviction.min_available_bytes(capacity);
        Node {
            trace,
            capacity,
            other,
            high: settings.policy.target.high_percent(),
            eviction_available,
            layer_refs: vec![0; trace.layers.len()],
            layer_seen: vec![false; trace.layers.len()],
            present: vec![false; trace.images.len()],
            was_present: vec![false; trace.images.len()],
            users: vec![0; trace.images.len()],
            containers: BTreeMap::new(),
            image_bytes: 0,
            clock: 0,
            image_byte_seconds: 0,
            seconds_above_high: 0,
            seconds_above_eviction: 0,
            tally: Tally::default(),
        }
    }

    /// The disk's capacity, and the bytes of it that are not images.
    pub fn disk(&self) -> (u64, u64) {
        (self.capacity, self.other)
    }

    /// Used bytes: the images' layers and the other data.
    pub fn used(&self) -> u64 {
        self.other.saturating_add(self.image_bytes)
    }

    /// The disk as `statvfs` would give it.
    pub fn stats(&self) -> FsStats {
        let available = self.capacity.saturating_sub(self.used());
        FsStats {
            capacity_bytes: self.capacity,
            available_bytes: available,
            free_bytes: available,
            ..FsStats::default()
        }
    }

    /// Whether the image is on disk.
    pub fn has(&self, image: u32) -> bool {
        self.present[image as usize]
    }

    /// How many containers use the image now.
    pub fn users(&self, image: u32) -> u32 {
        self.users[image as usize]
    }

    /// The images on disk, by index.
    pub fn images_on_disk(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.present.len() as u32).filter(|&i| self.present[i as usize])
    }

    /// Time passes to `t`: the time-weighted figures move on.
    fn advance(&mut self, t: Seconds) {
        if t <= self.clock {
            return;
        }
        let span = t - self.clock;
        self.image_byte_seconds += u128::from(self.image_bytes) * u128::from(span);
        let stats = self.stats();
        if stats.usage_percent() >= u64::from(self.high) {
            self.seconds_above_high = self.seconds_above_high.saturating_add(span);
        }
        if self.past_eviction() {
            self.seconds_above_eviction = self.seconds_above_eviction.saturating_add(span);
        }
        self.clock = t;
    }

    /// Whether available bytes are below the kubelet's eviction line.
    fn past_eviction(&self) -> bool {
        self.capacity.saturating_sub(self.used()) < self.eviction_available
    }

    fn note_peak(&mut self) {
        self.tally.peak_image_bytes = self.tally.peak_image_bytes.max(self.image_bytes);
        if self.capacity > 0 {
            let percent = self.used() as f64 * 100.0 / self.capacity as f64;
            self.tally.peak_usage_percent = self.tally.peak_usage_percent.max(percent);
        }
    }

    /// A container starts: the image's missing layers are pulled first.
    fn start(&mut self, container: u64, image: u32) {
        let i = image as usize;
        if !self.present[i] {
            let was_clear = !self.past_eviction();
            let mut again = false;
            for &layer in &self.trace.images[i].layers {
                let l = layer as usize;
                if self.layer_refs[l] == 0 {
                    let bytes = self.trace.layers[l];
                    if std::mem::replace(&mut self.layer_seen[l], true) {
                        self.tally.repulled_bytes = self.tally.repulled_bytes.saturating_add(bytes);
                        again = true;
                    } else {
                        self.tally.first_pull_bytes = self.tally.first_pull_bytes.saturating_add(bytes);
                    }
                    self.image_bytes = self.image_bytes.saturating_add(bytes);
                }
                self.layer_refs[l] += 1;
            }
            if std::mem::replace(&mut self.was_present[i], true) || again {
                self.tally.repulled_images += 1;
            }
            self.present[i] = true;
            if self.used() > self.capacity {
                self.tally.full_pulls += 1;
            }
            if was_clear && self.past_eviction() {
                self.tally.pulls_past_eviction += 1;
            }
            self.note_peak();
        }
        self.users[i] += 1;
        self.containers.insert(container, image);
    }

    /// A container goes; the image it used, when known.
    fn stop(&mut self, container: u64) -> Option<u32> {
        let image = self.containers.remove(&container)?;
        self.users[image as usize] -= 1;
        Some(image)
    }

    /// Removes an image when it is on disk and unused; true when it went.
    pub fn remove(&mut self, image: u32) -> bool {
        let i = image as usize;
        if !self.present[i] || self.users[i] > 0 {
            return false;
        }
        for &layer in &self.trace.images[i].layers {
            let l = layer as usize;
            self.layer_refs[l] -= 1;
            if self.layer_refs[l] == 0 {
                self.image_bytes = self.image_bytes.saturating_sub(self.trace.layers[l]);
            }
        }
        self.present[i] = false;
        self.tally.removals += 1;
        #[cfg(test)]
        self.tally.removed.push(image);
        true
    }

    /// The runtime's listing: images on disk (each with its size as a
    /// runtime reports it, shared layers counted in each), containers.
    fn snapshot(&self, images: &[Image]) -> Snapshot {
        Snapshot {
            images: self.images_on_disk().map(|i| images[i as usize].clone()).collect(),
            containers: self
                .containers
                .iter()
                .map(|(&id, &image)| {
                    let listed = &images[image as usize];
                    Container {
                        id: format!("c{id}"),
                        image: listed.repo_tags.first().unwrap_or_default().to_owned(),
                        image_ref: listed.id.clone(),
                        image_id: listed.id.clone(),
                        state: Some(ContainerState::Running),
                        ..Container::default()
                    }
                })
                .collect(),
            sandbox_images: vec![SANDBOX_IMAGE.to_string()],
            sandbox_pods_unread: None,
        }
    }
}

/// A collection policy, driven by the replay at the times it asks for.
pub trait Policy {
    /// The name reports give it.
    fn name(&self) -> String;
    /// When it next wants to run.
    fn next_wake(&self) -> Seconds;
    /// Runs at `t`.
    fn wake(&mut self, t: Seconds, node: &mut Node<'_>);
    /// A container is about to start at `t` on `image`, which the node
    /// lacks: the pull is known before it is made (a pod bound to the
    /// node names it).
    fn coming(&mut self, _t: Seconds, _image: u32, _node: &mut Node<'_>) {}
    /// A container started (`started`) or went at `t`, using `image`.
    fn used(&mut self, _t: Seconds, _image: u32, _started: bool, _node: &Node<'_>) {}
    /// Called right after a wake that removed nothing: the time before
    /// which, as long as the node does not change (no trace event), each of
    /// its wakes would again remove nothing and leave it as this one did,
    /// counting the same (`None`: no such promise). [`replay`] then skips
    /// to the last such wake before the next event ([`Policy::skip_to`]).
    fn quiet_until(&self, _node: &Node<'_>) -> Option<Seconds> {
        None
    }
    /// The wakes after this one and before `to` are skipped (the last of
    /// them would have been at `last_skipped`): bring what the policy
    /// learns at each wake up to that time, and wake next at `to`.
    fn skip_to(&mut self, _last_skipped: Seconds, _to: Seconds, _node: &Node<'_>) {}
}

/// Replays `trace` on a node of `capacity` bytes, `other` of them not
/// images, under `policy`. Between two events, wakes in which nothing can
/// change (see [`Policy::quiet_until`]) are counted without being run: a
/// gap of any length in a trace costs a few steps, and the result is the
/// one every wake would give.
pub fn replay(trace: &Trace, capacity: u64, other: u64, settings: &Settings, policy: &mut dyn Policy) -> Tally {
    replay_steps(trace, capacity, other, settings, policy).0
}

/// [`replay`], and how many wakes it ran.
fn replay_steps(
    trace: &Trace,
    capacity: u64,
    other: u64,
    settings: &Settings,
    policy: &mut dyn Policy,
) -> (Tally, u64) {
    let mut node = Node::new(trace, capacity, other, settings);
    let mut steps = 0u64;
    for event in &trace.events {
        while policy.next_wake() <= event.at {
            let t = policy.next_wake();
            node.advance(t);
            let before = node.tally.clone();
            policy.wake(t, &mut node);
            steps += 1;
            if policy.next_wake() <= t {
                break;
            }
            if node.tally.removals == before.removals {
                skip_quiet_wakes(t, event.at, &before, &mut node, policy);
            }
        }
        node.advance(event.at);
        match event.action {
            Action::Start { container, image } => {
                if !node.has(image) {
                    policy.coming(event.at, image, &mut node);
                }
                node.start(container, image);
                policy.used(event.at, image, true, &node);
            }
            Action::Stop { container } => {
                if let Some(image) = node.stop(container) {
                    policy.used(event.at, image, false, &node);
                }
            }
        }
    }
    let end = trace.duration();
    node.advance(end);
    let mut tally = node.tally;
    tally.policy = policy.name();
    tally.hours_above_high = node.seconds_above_high as f64 / 3600.0;
    tally.hours_above_eviction = node.seconds_above_eviction as f64 / 3600.0;
    tally.mean_image_bytes = if end == 0 {
        node.image_bytes
    } else {
        // Rounded up: a budget of this much holds what the policy held.
        u64::try_from(node.image_byte_seconds.div_ceil(u128::from(end))).unwrap_or(u64::MAX)
    };
    (tally, steps)
}

/// After a wake at `t` that removed nothing (`before`: the tally before
/// it), skips the policy's wakes that would repeat it, up to the last one
/// at or before `next_event` and before its [`Policy::quiet_until`]: each
/// skipped wake counts as the one at `t` did, and the last runs for real.
fn skip_quiet_wakes(t: Seconds, next_event: Seconds, before: &Tally, node: &mut Node<'_>, policy: &mut dyn Policy) {
    let Some(until) = policy.quiet_until(node) else {
        return;
    };
    let period = policy.next_wake() - t;
    // Wakes at t + k * period, k >= 1: at or before the event, before `until`.
    let limit = until.min(next_event.saturating_add(1));
    let Some(last) = limit.checked_sub(t + 1).map(|span| span / period) else {
        return;
    };
    if last < 2 {
        return;
    }
    let skipped = last - 1;
    let tally = &mut node.tally;
    #[cfg(test)]
    if tally.cycles > before.cycles {
        tally.cycle_starts.push((t + period, period, skipped));
    }
    let times = |now: u64, then: u64| now.saturating_sub(then).saturating_mul(skipped);
    tally.cycles = tally.cycles.saturating_add(times(tally.cycles, before.cycles));
    tally.space_passes = tally
        .space_passes
        .saturating_add(times(tally.space_passes, before.space_passes));
    tally.passes_short = tally
        .passes_short
        .saturating_add(times(tally.passes_short, before.passes_short));
    policy.skip_to(t + skipped * period, t + last * period, node);
}

/// The instant the simulation's second 0 stands for (any will do; the
/// planner only compares instants).
fn instant(t: Seconds) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + t)
}

/// imagegc's own rules: records, planner and space walk (see the module
/// docs for what is simulated around them).
pub struct Imagegc<'c> {
    settings: &'c Settings,
    /// The planner's policy: the settings', with the order `auto` chose.
    policy: GcPolicy,
    label: String,
    records: Records,
    /// The trace's images as the runtime lists them, by index.
    listed: Vec<Image>,
    by_id: HashMap<String, u32>,
    /// When cycles and usage checks come: the daemon's own schedule.
    schedule: Schedule,
    /// The node changed since usage was last measured: the daemon's next
    /// usage check would find it (checks that cannot find anything are
    /// not run).
    changed: bool,
    /// How many cycles' listings showed images first seen then (the
    /// daemon's `Collector::arrivals`; its polls are not simulated).
    arrivals: u64,
    /// See [`Policy::quiet_until`], as the last cycle found it.
    quiet_until: Option<Seconds>,
    /// The largest image that arrived lately, as the daemon's inventory
    /// keeps it (see [`crate::policy::Headroom`]).
    largest_pull: Option<LargestPull>,
    /// The largest image of each repository, as the daemon's inventory
    /// keeps it (see [`crate::policy::coming`]).
    repo_sizes: RepoSizes,
}

impl<'c> Imagegc<'c> {
    /// imagegc with `config`, named `label` in reports, over `trace`'s images.
    pub fn new(settings: &'c Settings, label: impl Into<String>, trace: &Trace) -> Self {
        let listed: Vec<Image> = trace
            .images
            .iter()
            .enumerate()
            .map(|(i, image)| Image {
                id: image.id.clone(),
                repo_tags: vec![image.name.clone()].into(),
                repo_digests: Vec::new().into(),
                size: trace.image_bytes(i as u32),
                pinned: false,
            })
            .collect();
        let by_id = listed
            .iter()
            .enumerate()
            .map(|(i, image)| (image.id.clone(), i as u32))
            .collect();
        Imagegc {
            settings,
            policy: GcPolicy::clone(&settings.policy),
            label: label.into(),
            records: Records::new(),
            listed,
            by_id,
            schedule: Schedule::new(Duration::ZERO, interval(settings), settings.usage_poll_interval, 0),
            changed: false,
            arrivals: 0,
            quiet_until: None,
            largest_pull: None,
            repo_sizes: RepoSizes::default(),
        }
    }

    /// The order of space removals in force.
    pub fn order(&self) -> Order {
        self.policy.order
    }

    /// Puts `order` in force from the next cycle on, with `gc.order =
    /// "auto"` (see [`GcPolicy::with_order`]).
    pub fn set_order(&mut self, order: Order) {
        self.policy = self.policy.with_order(order);
    }

    /// Until when cycles that remove nothing go on removing nothing while
    /// the node stays as it is: the first time an image not in use becomes
    /// an age candidate (`gc.max_age`), old enough for space (`gc.min_age`)
    /// or no longer used "at this instant", or the age guard opens. `None`
    /// when a cycle would learn something at each wake: an image in use
    /// seen again after `MIN_BREAK` (an interval that long).
    fn quiet_until(&self, t: Seconds, node: &Node<'_>) -> Option<Seconds> {
        let in_use = node.images_on_disk().any(|i| node.users(i) > 0);
        if in_use && self.settings.interval >= crate::records::MIN_BREAK {
            return None;
        }
        let secs = |at: SystemTime| at.duration_since(instant(0)).map_or(0, |d| d.as_secs());
        let max_age = self.policy.max_age.as_secs();
        let min_age = self.policy.min_age().as_secs();
        let mut until = Seconds::MAX;
        let mut note = |at: Seconds| {
            if at > t {
                until = until.min(at);
            }
        };
        if max_age > 0 {
            note(max_age);
        }
        for image in node.images_on_disk().filter(|&i| node.users(i) == 0) {
            let record = self.records.get(&self.listed[image as usize].id)?;
            let (first_seen, last_used) = (secs(record.first_seen), secs(record.last_used));
            note(first_seen.saturating_add(min_age));
            note(last_used.saturating_add(1));
            if max_age > 0 {
                note(last_used.saturating_add(max_age));
            }
        }
        Some(until)
    }

    /// One cycle at `t`: observe, plan, age pass, space pass; `coming`:
    /// the pulls it makes room for.
    fn cycle(&mut self, t: Seconds, node: &mut Node<'_>, coming: &[ComingPull]) {
        let now = instant(t);
        node.tally.cycles += 1;
        #[cfg(test)]
        node.tally.cycle_starts.push((t, 0, 1));
        let snapshot = node.snapshot(&self.listed);
        let (observed, listed) = self.records.observe_snapshot(&snapshot, now);
        self.arrivals += u64::from(!observed.new.is_empty());
        for image in observed.new.iter().filter_map(|&i| snapshot.images.get(i)) {
            LargestPull::note(&mut self.largest_pull, LargestPull::of(image, now), now);
            self.repo_sizes.note_image(image, now);
        }
        // The daemon's script (policy::cycle), with the simulated node's
        // removals: a removal frees what no image left on disk shares.
        let cycle = CyclePlan::new(
            &snapshot,
            &listed,
            &self.policy,
            Protections::none(),
            (now, instant(0)),
            KeptImages::Counted,
        )
        .with_room_for(
            self.largest_pull.as_ref(),
            (coming, 0),
            DiskFootprint::default(),
            Some(&node.stats()),
        )
        .0;
        for candidate in cycle.age() {
            if node.remove(self.by_id[candidate.id]) {
                self.records.remove(candidate.id, now);
            }
        }
        let target = cycle.target();
        let mut low_reached = true;
        if let Some(pass) = cycle.space(
            node.stats(),
            AgePass::Removed,
            DiskFootprint::default(),
            &LayerBook::default(),
            None,
        ) {
            node.tally.space_passes += 1;
            let mut walk = pass.walk;
            loop {
                match walk.next(|_| false) {
                    Step::Remove(candidate) => {
                        if node.remove(self.by_id[candidate.id]) {
                            self.records.remove(candidate.id, now);
                            walk.removed(candidate.size, Some(node.stats()));
                        } else {
                            walk.kept(Some(node.stats()));
                        }
                    }
                    Step::HoldBack(_) => {}
                    Step::Done | Step::LowNotReached { .. } => break,
                }
            }
            low_reached = walk.reached();
            if !low_reached {
                node.tally.passes_short += 1;
            }
        }
        // When the daemon comes back: the interval, or sooner when the
        // first image kept for being too young may go.
        let interval = interval(self.settings);
        let look = cycle.look_again(interval, low_reached);
        let ended = Ended::Ran {
            look_again: (look < interval).then(|| at(t) + look),
        };
        let due = target.due(&node.stats());
        self.schedule.cycle_ended(at(t), ended, self.arrivals, Some(due));
        self.changed = false;
        self.quiet_until = self.quiet_until(t, node);
    }
}

impl Imagegc<'_> {
    /// The headroom for the largest recent pull and `coming` bytes on
    /// disk, as the daemon's.
    fn headroom(&self, coming: u64) -> Option<Headroom> {
        self.policy
            .headroom_for(self.largest_pull.as_ref(), coming, DiskFootprint::default())
    }
}

impl Imagegc<'_> {
    /// The daemon's usage check at `t`; `bound`: the room a pod just bound
    /// needs for its pull, which moves the thresholds in force.
    fn check(&mut self, t: Seconds, node: &Node<'_>, bound: Option<u64>) {
        let coming = bound.unwrap_or(0);
        let due = self
            .policy
            .target
            .with_headroom(self.headroom(coming))
            .due(&node.stats());
        self.changed = false;
        // A check is no cycle: what the last cycle found quiet may not be.
        self.quiet_until = None;
        self.schedule.measured(
            at(t),
            Some(Measured {
                due,
                arrivals: self.arrivals,
                thresholds_moved: bound.is_some(),
            }),
        );
    }
}

/// `gc.interval` as the replay runs it: a second at least.
fn interval(settings: &Settings) -> Duration {
    settings.interval.max(Duration::from_secs(1))
}

/// Second `t` of the simulation, as the schedule counts time.
fn at(t: Seconds) -> Duration {
    Duration::from_secs(t)
}

/// The first whole second at or after `d`.
fn secs_up(d: Duration) -> Seconds {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

impl Policy for Imagegc<'_> {
    fn name(&self) -> String {
        self.label.clone()
    }

    fn next_wake(&self) -> Seconds {
        let cycle = secs_up(self.schedule.next_cycle());
        if self.changed {
            cycle.min(secs_up(self.schedule.next_check()))
        } else {
            cycle
        }
    }

    fn wake(&mut self, t: Seconds, node: &mut Node<'_>) {
        // A check first, unless a cycle is due with it (the daemon's loop
        // asks for the cycle first, which measures usage after it); a check
        // that finds usage crossing starts the cycle at once.
        if secs_up(self.schedule.next_cycle()) > t {
            self.check(t, node, None);
        }
        if secs_up(self.schedule.next_cycle()) <= t {
            self.cycle(t, node, &[]);
        }
    }

    fn coming(&mut self, t: Seconds, image: u32, node: &mut Node<'_>) {
        // The daemon's `kubernetes.room_before_pulls`: a cycle as soon as
        // the pod is seen, when the pull, sized by its repository's
        // largest image, would take usage past the line.
        if !self.policy.room_before_pulls {
            return;
        }
        let Some(tag) = self.listed[image as usize].repo_tags.first() else {
            return;
        };
        let Some(like) = self.repo_sizes.of(tag).cloned() else {
            return;
        };
        let pull = [ComingPull {
            image: tag.to_string(),
            pod: String::new(),
            like: Some(like),
        }];
        // The pod bound moves the thresholds in force: usage is measured
        // at once against them, and a cycle starts at once when due.
        let room = self
            .policy
            .room_for_pulls(&pull, 0, DiskFootprint::default(), None)
            .bytes;
        self.schedule.look_now(at(t));
        self.check(t, node, Some(room));
        if secs_up(self.schedule.next_cycle()) <= t {
            self.cycle(t, node, &pull);
        }
    }

    fn quiet_until(&self, _node: &Node<'_>) -> Option<Seconds> {
        self.quiet_until
    }

    fn skip_to(&mut self, last_skipped: Seconds, to: Seconds, node: &Node<'_>) {
        // The skipped cycles saw the images in use used, each at its time:
        // the cycle at `to` sees them one interval after the last.
        let in_use = node.images_on_disk().filter(|&i| node.users(i) > 0);
        let ids: Vec<&str> = in_use.map(|i| self.listed[i as usize].id.as_str()).collect();
        self.records.mark_still_used(ids, instant(last_skipped));
        self.schedule.skipped_cycles(at(last_skipped), at(to));
    }

    fn used(&mut self, t: Seconds, image: u32, started: bool, _node: &Node<'_>) {
        let listed = &self.listed[image as usize];
        if self.records.get(&listed.id).is_none() {
            // Pulled since the last listing: the daemon's next poll sees it.
            LargestPull::note(&mut self.largest_pull, LargestPull::of(listed, instant(t)), instant(t));
            self.repo_sizes.note_image(listed, instant(t));
        }
        let id = [listed.id.as_str()];
        if started {
            self.records.mark_used(id, instant(t));
        } else {
            // In use since it started: the daemon's polls would have seen
            // it all along, so this is no break.
            self.records.mark_still_used(id, instant(t));
        }
        // A pull changes usage: the daemon's next usage check finds it
        // (the checks before it found nothing new).
        if started && !self.changed {
            self.schedule.checks_found_nothing_until(at(t));
            self.changed = true;
        }
    }
}

/// The kubelet's image GC (see the module docs).
pub struct Kubelet {
    high: u8,
    low: u8,
    min_age: Seconds,
    /// Per image: first detected, last seen in use (`None`: never).
    records: HashMap<u32, (Seconds, Option<Seconds>)>,
    next: Seconds,
}

impl Kubelet {
    /// The kubelet with the thresholds and minimum age of `settings`.
    pub fn new(settings: &Settings) -> Self {
        let policy = &settings.policy;
        Kubelet {
            high: policy.target.high_percent(),
            low: policy.target.low_percent(),
            min_age: policy.min_age().as_secs(),
            records: HashMap::new(),
            next: 0,
        }
    }
}

impl Policy for Kubelet {
    fn name(&self) -> String {
        "kubelet".to_string()
    }

    fn next_wake(&self) -> Seconds {
        self.next
    }

    fn quiet_until(&self, node: &Node<'_>) -> Option<Seconds> {
        // Nothing removed: below high, or every unused image too young.
        let t = self.next - KUBELET_PERIOD;
        let young = node
            .images_on_disk()
            .filter(|&image| node.users(image) == 0)
            .filter_map(|image| self.records.get(&image))
            .map(|&(first, _)| first.saturating_add(self.min_age))
            .filter(|&at| at > t)
            .min();
        Some(young.unwrap_or(Seconds::MAX))
    }

    fn skip_to(&mut self, _last_skipped: Seconds, to: Seconds, _node: &Node<'_>) {
        // The wake at `to` marks the images in use used at its time, as
        // the skipped ones would have.
        self.next = to;
    }

    fn wake(&mut self, t: Seconds, node: &mut Node<'_>) {
        self.next = t + KUBELET_PERIOD;
        node.tally.cycles += 1;
        // detectImages: records of listed images, last used for those in use.
        let on_disk: Vec<u32> = node.images_on_disk().collect();
        self.records.retain(|image, _| node.has(*image));
        for &image in &on_disk {
            let record = self.records.entry(image).or_insert((t, None));
            if node.users(image) > 0 {
                record.1 = Some(t);
            }
        }
        let stats = node.stats();
        if stats.usage_percent() < u64::from(self.high) {
            return;
        }
        node.tally.space_passes += 1;
        let to_free = stats.bytes_to_free(self.low);
        let trace = node.trace;
        let mut candidates: Vec<(Option<Seconds>, Seconds, &str, u32)> = on_disk
            .iter()
            .filter(|&&image| node.users(image) == 0)
            .map(|&image| {
                let (first, last) = self.records[&image];
                (last, first, trace.images[image as usize].id.as_str(), image)
            })
            .collect();
        // Ties (the kubelet's sort leaves them to chance) by id.
        candidates.sort_unstable();
        let mut freed = 0u64;
        for (last, first, _, image) in candidates {
            if last.is_some_and(|l| l >= t) || t.saturating_sub(first) < self.min_age {
                continue;
            }
            if node.remove(image) {
                self.records.remove(&image);
                freed = freed.saturating_add(node.trace.image_bytes(image));
                if freed >= to_free {
                    break;
                }
            }
        }
        if node.stats().bytes_to_free(self.low) > 0 {
            node.tally.passes_short += 1;
        }
    }
}

/// An offline policy that knows the future (size-blind Belady at image
/// granularity): imagegc's schedule and thresholds, but each pass first
/// removes every unused image never needed again, then the unused images
/// needed furthest in the future, until usage is at or below low. Not a
/// bound: an achievable schedule, so the optimum lies between the bound
/// and it.
pub struct Belady {
    /// `gc.interval`.
    interval: Seconds,
    /// When a space pass is due and done, as the settings say.
    target: SpaceTarget,
    /// When each image is needed, in time order.
    starts: Vec<Vec<Seconds>>,
    next_cycle: Seconds,
}

impl Belady {
    /// Over `trace`, with the thresholds and interval of `settings`.
    pub fn new(settings: &Settings, trace: &Trace) -> Self {
        let mut starts = vec![Vec::new(); trace.images.len()];
        for event in &trace.events {
            if let Action::Start { image, .. } = event.action {
                starts[image as usize].push(event.at);
            }
        }
        Belady {
            interval: settings.interval.as_secs().max(1),
            target: settings.policy.target,
            starts,
            next_cycle: 0,
        }
    }

    /// When `image` is next needed after `t` (`Seconds::MAX`: never).
    fn next_use(&self, image: u32, t: Seconds) -> Seconds {
        let starts = &self.starts[image as usize];
        starts
            .get(starts.partition_point(|&s| s <= t))
            .copied()
            .unwrap_or(Seconds::MAX)
    }
}

impl Policy for Belady {
    fn name(&self) -> String {
        "offline".to_string()
    }

    fn next_wake(&self) -> Seconds {
        self.next_cycle
    }

    fn wake(&mut self, t: Seconds, node: &mut Node<'_>) {
        node.tally.cycles += 1;
        self.next_cycle = t + self.interval;
        let target = self.target;
        if !target.due(&node.stats()) {
            return;
        }
        node.tally.space_passes += 1;
        let trace = node.trace;
        let mut candidates: Vec<(Seconds, &str, u32)> = node
            .images_on_disk()
            .filter(|&image| node.users(image) == 0)
            .map(|image| (self.next_use(image, t), trace.images[image as usize].id.as_str(), image))
            .collect();
        // Furthest next use first (ties by id).
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        for (next, _, image) in candidates {
            if next != Seconds::MAX && target.reached(&node.stats()) {
                break;
            }
            node.remove(image);
        }
        if !target.reached(&node.stats()) {
            node.tally.passes_short += 1;
        }
    }

    fn quiet_until(&self, _node: &Node<'_>) -> Option<Seconds> {
        // Nothing removed: below high, or no unused image on disk; either
        // holds until the node changes.
        Some(Seconds::MAX)
    }

    fn skip_to(&mut self, _last_skipped: Seconds, to: Seconds, _node: &Node<'_>) {
        self.next_cycle = to;
    }

    fn used(&mut self, t: Seconds, _image: u32, _started: bool, node: &Node<'_>) {
        if self.target.due(&node.stats()) && self.next_cycle > t + USAGE_CHECK {
            self.next_cycle = t + USAGE_CHECK;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::Config;
    use crate::sim::trace::{TraceEvent, TraceImage};

    const MB: u64 = 1_000_000;

    /// Images of one layer each, plus `shared`: a base under images 0 and 1.
    fn trace(sizes: &[u64], events: &[(Seconds, Action)]) -> Trace {
        Trace {
            layers: sizes.to_vec(),
            images: (0..sizes.len())
                .map(|i| TraceImage {
                    id: format!("sha256:{i:064x}"),
                    name: image_name(i as u32),
                    layers: vec![i as u32],
                })
                .collect(),
            events: events.iter().map(|&(at, action)| TraceEvent { at, action }).collect(),
            capacity: None,
        }
    }

    fn start(container: u64, image: u32) -> Action {
        Action::Start { container, image }
    }

    fn stop(container: u64) -> Action {
        Action::Stop { container }
    }

    /// When imagegc's cycles start under `config` on a node of `capacity`
    /// bytes whose containers start and stop as `events` say (second,
    /// container, image, started) over images of `sizes`, until the last
    /// event (`engine::tests` compares them with the daemon's).
    pub(crate) fn cycle_starts(
        sizes: &[u64],
        events: &[(Seconds, u64, u32, bool)],
        capacity: u64,
        config: &Config,
    ) -> Vec<Seconds> {
        let events: Vec<_> = events
            .iter()
            .map(|&(at, container, image, started)| {
                (
                    at,
                    if started {
                        start(container, image)
                    } else {
                        stop(container)
                    },
                )
            })
            .collect();
        let trace = trace(sizes, &events);
        let settings = Settings::from(config);
        let runs = replay(
            &trace,
            capacity,
            0,
            &settings,
            &mut Imagegc::new(&settings, "imagegc", &trace),
        )
        .cycle_starts;
        runs.into_iter()
            .flat_map(|(first, period, n)| (0..n).map(move |k| first + k * period))
            .collect()
    }

    /// The name of image `i` in a trace made by [`trace`].
    pub(crate) fn image_name(i: u32) -> String {
        format!("app-{i}:1")
    }

    fn config(high: u8, low: u8) -> Config {
        let mut config = Config::default();
        config.gc.high_threshold_percent = high;
        config.gc.low_threshold_percent = low;
        config
    }

    /// A node for comparing the simulator's cycle with the daemon's and
    /// `plan`'s (`engine::tests`): images of one layer each, containers
    /// started at 0, one per image, stopped at the times given (`None`:
    /// kept running), then at `pull_at` image `pulled` pulled and run for a
    /// minute. Returns the images imagegc removed under `config`, in order.
    pub(crate) fn removals_after_a_pull(
        sizes: &[u64],
        stops: &[Option<Seconds>],
        (pulled, pull_at): (u32, Seconds),
        capacity: u64,
        config: &Config,
    ) -> Vec<u32> {
        let mut events = Vec::new();
        for (i, stop_at) in stops.iter().enumerate() {
            events.push((0, start(i as u64, i as u32)));
            events.extend(stop_at.map(|at| (at, stop(i as u64))));
        }
        let container = stops.len() as u64;
        events.extend([(pull_at, start(container, pulled)), (pull_at + 60, stop(container))]);
        events.sort_by_key(|&(at, _)| at);
        let trace = trace(sizes, &events);
        let settings = Settings::from(config);
        replay(
            &trace,
            capacity,
            0,
            &settings,
            &mut Imagegc::new(&settings, "imagegc", &trace),
        )
        .removed
    }

    #[test]
    fn room_before_pulls_keeps_a_known_repositorys_next_tag_from_crossing_the_eviction_line() {
        // 1000 MB, the line at 15 % available, high 80 / low 70. `app:1`
        // (400 MB) runs a minute; five 50 MB images run a minute. A day later
        // `app:2` (400 MB) arrives at 65 %: past the line (and the disk) in
        // one pull, unless room is made before it.
        let mut sizes = vec![400 * MB, 400 * MB];
        sizes.extend([50 * MB; 5]);
        let mut trace = trace(&sizes, &[]);
        trace.images[0].name = "registry.test/app:1".into();
        trace.images[1].name = "registry.test/app:2".into();
        let mut events = vec![(0, start(0, 0)), (60, stop(0))];
        events.extend((2..7).map(|i| (120, start(i, i as u32))));
        events.extend((2..7).map(|i| (180, stop(i))));
        events.extend([(86_400, start(1, 1)), (86_460, stop(1))]);
        trace.events = events.iter().map(|&(at, action)| TraceEvent { at, action }).collect();
        let mut config = config(80, 70);
        config.eviction_imagefs_available = Some(crate::config::EvictionThreshold::Percent(15.0));
        let run = |room: bool| {
            let mut config = config.clone();
            config.kubernetes.enabled = room;
            let settings = Settings::from(&config);
            replay(
                &trace,
                1000 * MB,
                0,
                &settings,
                &mut Imagegc::new(&settings, "imagegc", &trace),
            )
        };
        let reacting = run(false);
        assert_eq!(reacting.pulls_past_eviction, 1, "{reacting:?}");
        let ahead = run(true);
        assert_eq!(ahead.pulls_past_eviction, 0, "{ahead:?}");
        assert!(ahead.peak_usage_percent <= 85.0, "{ahead:?}");
    }

    #[test]
    fn a_gap_of_any_length_in_a_trace_costs_a_few_steps_and_counts_every_cycle() {
        // Three lines: a container runs for a minute, then another on the
        // same image after a gap of 10^12 s, while a third runs throughout.
        const GAP: Seconds = 1_000_000_000_000;
        let events = [(0, start(1, 0)), (0, start(2, 1)), (60, stop(1)), (GAP, start(3, 0))];
        let trace = trace(&[400 * MB, 100 * MB], &events);
        let mut config = config(85, 50);
        config.gc.max_age = Duration::from_secs(86_400);
        let interval = config.gc.interval.as_secs();
        let settings = Settings::from(&config);
        let mut imagegc = Imagegc::new(&settings, "imagegc", &trace);
        let (tally, steps) = replay_steps(&trace, 1000 * MB, 0, &settings, &mut imagegc);
        assert!(steps < 100, "{steps} steps for a trace of four events");
        // Every cycle of the gap counted; the unused image removed by age
        // a day after its last use, and pulled again after the gap.
        assert_eq!(tally.cycles, GAP / interval + 1, "{tally:?}");
        assert_eq!(tally.removals, 1);
        assert_eq!(tally.repulled_images, 1);
        // The image in use all along learnt no break from the skipped cycles.
        let running = imagegc.records.get(&trace.images[1].id).unwrap();
        assert_eq!(running.usual_break, None);
        assert_eq!(running.last_used, instant(GAP / interval * interval));
        let mut kubelet = Kubelet::new(&settings);
        let (tally, steps) = replay_steps(&trace, 1000 * MB, 0, &settings, &mut kubelet);
        assert!(steps < 100, "kubelet: {steps} steps");
        assert_eq!(tally.cycles, GAP / KUBELET_PERIOD + 1);
        let mut offline = Belady::new(&settings, &trace);
        let (tally, steps) = replay_steps(&trace, 1000 * MB, 0, &settings, &mut offline);
        assert!(steps < 100, "offline: {steps} steps");
        assert_eq!(tally.cycles, GAP / interval + 1);
    }

    #[test]
    fn an_image_needed_again_after_a_removal_is_a_repull_of_its_missing_layers() {
        // 1000 MB disk, high 85 / low 50. Images a (400), b (300), c (300),
        // each run for a minute, an hour apart; then a is needed again.
        let events = [
            (0, start(1, 0)),
            (60, stop(1)),
            (3600, start(2, 1)),
            (3660, stop(2)),
            (7200, start(3, 2)),
            (7260, stop(3)),
            (10_800, start(4, 0)),
            (10_860, stop(4)),
        ];
        let trace = trace(&[400 * MB, 300 * MB, 300 * MB], &events);
        let config = config(85, 50);
        let settings = Settings::from(&config);
        let mut imagegc = Imagegc::new(&settings, "imagegc", &trace);
        let tally = replay(&trace, 1000 * MB, 0, &settings, &mut imagegc);
        // Pulling c fills the disk to 100%: a cycle removes a (least
        // recently used), which reaches 60%... not low: then b too.
        assert_eq!(tally.first_pull_bytes, 1000 * MB);
        assert_eq!(tally.repulled_bytes, 400 * MB, "{tally:?}");
        assert_eq!(tally.repulled_images, 1);
        assert_eq!(tally.removals, 2);
        assert!(tally.space_passes >= 1);
        assert!((tally.peak_usage_percent - 100.0).abs() < 1e-9);
        assert_eq!(tally.full_pulls, 0);
    }

    #[test]
    fn a_shared_layer_stays_while_an_image_on_disk_holds_it() {
        // Images 0 and 1 share layer 2 (500 MB); each has 100 MB of its own.
        let mut trace = trace(&[100 * MB, 100 * MB, 500 * MB], &[]);
        trace.images[0].layers = vec![2, 0];
        trace.images[1].layers = vec![2, 1];
        trace.images.pop();
        trace.events = [(0, start(1, 0)), (10, start(2, 1)), (20, stop(1))]
            .iter()
            .map(|&(at, action)| TraceEvent { at, action })
            .collect();
        let config = config(85, 80);
        let settings = Settings::from(&config);
        let mut node = Node::new(&trace, 1000 * MB, 0, &settings);
        node.start(1, 0);
        node.start(2, 1);
        assert_eq!(node.used(), 700 * MB, "the base is stored once");
        assert!(!node.remove(0), "in use");
        node.stop(1);
        assert!(node.remove(0));
        assert_eq!(node.used(), 600 * MB, "only its own layer went");
        node.start(3, 0);
        assert_eq!(node.tally.repulled_bytes, 100 * MB);
    }

    #[test]
    fn the_kubelet_credits_reported_sizes_and_stops_early_on_shared_layers() {
        // Three images of a 300 MB base and 50 MB each: reported 350 MB
        // each, 450 MB on disk. Disk 500 MB with 50 MB of other data:
        // usage 100%, high 85, low 40 needs 200 MB freed.
        let mut trace = trace(&[50 * MB, 50 * MB, 50 * MB, 300 * MB], &[]);
        for image in &mut trace.images {
            image.layers.insert(0, 3);
        }
        trace.images.pop();
        let events = [
            (0, start(1, 0)),
            (0, start(2, 1)),
            (0, start(3, 2)),
            (100, stop(1)),
            (100, stop(2)),
            (100, stop(3)),
            (700, start(4, 0)),
        ];
        trace.events = events.iter().map(|&(at, action)| TraceEvent { at, action }).collect();
        let config = config(85, 40);
        let settings = Settings::from(&config);
        let mut kubelet = Kubelet::new(&settings);
        let tally = replay(&trace, 500 * MB, 50 * MB, &settings, &mut kubelet);
        // At 300 every image is too young (first detected then); at 600
        // the first removal credits 350 MB (freed 50): done, to its mind,
        // at 90%.
        assert_eq!(tally.removals, 1, "{tally:?}");
        assert_eq!((tally.space_passes, tally.passes_short), (2, 2));
        assert_eq!(tally.repulled_bytes, 50 * MB);
        assert!(
            tally.hours_above_high * 3600.0 > 699.0,
            "above high from 0 to the end: {tally:?}"
        );
        let mut imagegc = Imagegc::new(&settings, "imagegc", &trace);
        let tally = replay(&trace, 500 * MB, 50 * MB, &settings, &mut imagegc);
        // imagegc comes back as soon as the images are old enough (421 s)
        // and measures: all three go (the base with the last), then image
        // 0 is pulled again whole.
        assert_eq!(tally.removals, 3, "{tally:?}");
        assert_eq!((tally.space_passes, tally.passes_short), (2, 1));
        assert_eq!(tally.repulled_bytes, 350 * MB);
    }
}
