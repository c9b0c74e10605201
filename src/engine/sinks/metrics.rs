//! The metrics the engine's events set: their families (names, units,
//! help texts, label values: README's table is checked against them),
//! registered in the one registry ([`crate::outputs::metrics::Metrics`]),
//! and the sink that sets them, one arm per event that moves a metric. A
//! new metric is a family here and the arm that sets it.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::engine::events::{Event, Sink};
use crate::model::Reason;
use crate::outputs::metrics::{Families, Metrics, unix_now_seconds};

/// Upper bounds, in seconds, of the cycle duration histogram. A cycle that finds
/// nothing to do takes tens of milliseconds; one that removes many large images on
/// a slow disk can take minutes, and ten minutes is longer than any sane interval.
const CYCLE_DURATION_BUCKETS_SECONDS: [f64; 15] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum CycleResult {
    Success,
    Failure,
}

impl EncodeLabelValue for CycleResult {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(match self {
            CycleResult::Success => "success",
            CycleResult::Failure => "failure",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ImageState {
    InUse,
    Unused,
    Protected,
}

impl EncodeLabelValue for ImageState {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(match self {
            ImageState::InUse => "in_use",
            ImageState::Unused => "unused",
            ImageState::Protected => "protected",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: Reason,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    result: CycleResult,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StateLabels {
    state: ImageState,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    commit: &'static str,
}

/// The container filesystem of a split store, by the mount point the
/// runtime names (one series at a time).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct MountLabels {
    mount_point: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct NodeLabels {
    node: String,
}

/// The order in force, and whether `auto` chose it (`"true"`, `"false"`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OrderLabels {
    order: &'static str,
    auto: &'static str,
}

type GaugeF64 = Gauge<f64, AtomicU64>;

/// Living beside the kubelet's own image GC: what someone else removed, and
/// what the kubelet's configuration says (see [`crate::config`]'s kubelet
/// reader).
#[derive(Debug)]
struct BesideFamilies {
    removed_by_others: Counter,
    removed_by_others_bytes: Counter,
    last_removal_by_others: GaugeF64,
    kubelet_config_read: Gauge,
    kubelet_image_gc_enabled: Gauge,
    high_above_eviction: Gauge,
}

impl Families for BesideFamilies {
    fn register(registry: &mut Registry) -> Self {
        let removed_by_others = Counter::default();
        registry.register(
            "imagegc_images_removed_by_others",
            "Images that went without imagegc asking (the kubelet's image GC, another collector, crictl rmi): \
             omitted by a listing and not found by ImageStatus, never a removal imagegc asked for",
            removed_by_others.clone(),
        );
        let removed_by_others_bytes = Counter::default();
        registry.register_with_unit(
            "imagegc_removed_by_others",
            "The last known sizes, as the runtime reported them, of the images counted in \
             imagegc_images_removed_by_others_total",
            Unit::Bytes,
            removed_by_others_bytes.clone(),
        );
        let last_removal_by_others = GaugeF64::default();
        registry.register_with_unit(
            "imagegc_last_removal_by_others_timestamp",
            "When imagegc last found an image removed by someone else (Unix time; 0 when never, in this process)",
            Unit::Seconds,
            last_removal_by_others.clone(),
        );
        let kubelet_config_read = Gauge::default();
        registry.register(
            "imagegc_kubelet_config_read",
            "1 when the kubelet's configuration (kubelet.config, kubelet.config_dir) was read; 0 when none is \
             configured or it could not be read, and the kubelet's defaults are assumed",
            kubelet_config_read.clone(),
        );
        let kubelet_image_gc_enabled = Gauge::default();
        registry.register(
            "imagegc_kubelet_image_gc_enabled",
            "1 when the kubelet's own image GC is on, as its configuration says, or as assumed when none was \
             read (the kubelet's default: on, 85/80); 0 when it is off (imageGCHighThresholdPercent 100, \
             imageMaximumGCAge 0)",
            kubelet_image_gc_enabled.clone(),
        );
        let high_above_eviction = Gauge::default();
        registry.register(
            "imagegc_high_threshold_above_eviction",
            "1 when gc.high_threshold_percent is at or above a kubelet eviction line on the image filesystem \
             (evictionHard or evictionSoft as read, or the kubelet's default imagefs.available 15% when none \
             is read): the kubelet evicts pods before imagegc collects",
            high_above_eviction.clone(),
        );
        // Assumed until a configuration says otherwise: the kubelet's
        // default is on.
        kubelet_image_gc_enabled.set(1);
        BesideFamilies {
            removed_by_others,
            removed_by_others_bytes,
            last_removal_by_others,
            kubelet_config_read,
            kubelet_image_gc_enabled,
            high_above_eviction,
        }
    }
}

/// What removals did: counted, measured, refused, undone by a re-pull.
#[derive(Debug)]
struct RemovalFamilies {
    removed: Family<ReasonLabels, Counter>,
    freed_bytes: Family<ReasonLabels, Counter>,
    removal_failures: Counter,
    repulled: Counter,
    hurried: Counter,
    made_room: Counter,
    cannot_fit: Gauge,
}

/// The image filesystem, the thresholds and what the collector decides on.
#[derive(Debug)]
struct FilesystemFamilies {
    usage_ratio: GaugeF64,
    capacity_bytes: Gauge,
    available_bytes: Gauge,
    high_threshold_ratio: GaugeF64,
    low_threshold_ratio: GaugeF64,
    space_unreachable: Gauge,
    image_fs_mismatch: Gauge,
    /// Empty unless the runtime names a separate container filesystem: a
    /// family, so that no sample is exported while there is none.
    container_fs_capacity_bytes: Family<MountLabels, Gauge>,
    container_fs_available_bytes: Family<MountLabels, Gauge>,
    container_fs_usage_ratio: Family<MountLabels, GaugeF64>,
    container_mounts_unknown: Gauge,
    space_pass_due: Gauge,
}

/// The node's images, the runtime, and this process.
#[derive(Debug)]
struct NodeFamilies {
    images: Family<StateLabels, Gauge>,
    runtime_up: Gauge,
    dry_run: Gauge,
    candidates: Gauge,
    node_info: Family<NodeLabels, Gauge>,
    order: Family<OrderLabels, Gauge>,
}

/// The families a finished cycle updates, kept together so a [`CycleTimer`] can
/// own clones of them (they are shared handles) and outlive any borrow.
#[derive(Debug, Clone)]
struct CycleFamilies {
    total: Family<ResultLabels, Counter>,
    duration: Histogram,
    last_success: GaugeF64,
    consecutive_failures: Gauge,
}

impl CycleFamilies {
    fn record(&self, success: bool, duration: Duration) {
        let result = if success {
            CycleResult::Success
        } else {
            CycleResult::Failure
        };
        self.total.get_or_create(&ResultLabels { result }).inc();
        self.duration.observe(duration.as_secs_f64());
        if success {
            self.last_success.set(unix_now_seconds());
            self.consecutive_failures.set(0);
        } else {
            self.consecutive_failures.inc();
        }
    }
}

impl Families for RemovalFamilies {
    fn register(registry: &mut Registry) -> Self {
        let removed = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "image_garbage_collected",
            "Images removed by garbage collection, by reason (age or space): what the kubelet counts \
             as kubelet_image_garbage_collected_total{reason}, under that name without its kubelet_ prefix",
            removed.clone(),
        );
        let freed_bytes = Family::<ReasonLabels, Counter>::default();
        registry.register_with_unit(
            "imagegc_freed",
            "Image filesystem space freed by removals, measured before and after each removal, by reason",
            Unit::Bytes,
            freed_bytes.clone(),
        );
        for reason in [Reason::Age, Reason::Space] {
            removed.get_or_create(&ReasonLabels { reason }).inc_by(0);
            freed_bytes.get_or_create(&ReasonLabels { reason }).inc_by(0);
        }

        let removal_failures = Counter::default();
        registry.register(
            "imagegc_removal_failures",
            "Image removals the runtime refused or that failed",
            removal_failures.clone(),
        );

        let repulled = Counter::default();
        registry.register(
            "imagegc_repulled_after_removal",
            "Images pulled again soon after imagegc removed them (a sign of thrashing)",
            repulled.clone(),
        );
        let hurried = Counter::default();
        registry.register(
            "imagegc_hurried_space_passes",
            "Space passes that found usage past the kubelet's eviction line and removed by estimate, \
             without waiting for each removal's space to come back",
            hurried.clone(),
        );
        let made_room = Counter::default();
        registry.register(
            "imagegc_room_before_pulls",
            "Pulls coming for pods bound to the node that a space pass made room for before the kubelet pulled \
             them (they would have taken the image filesystem past the kubelet's eviction line)",
            made_room.clone(),
        );
        let cannot_fit = Gauge::default();
        registry.register(
            "imagegc_coming_pulls_cannot_fit",
            "Pulls coming for pods bound to the node that would not fit above the kubelet's eviction line even \
             with every removable image gone: no room is made for them",
            cannot_fit.clone(),
        );
        RemovalFamilies {
            removed,
            freed_bytes,
            removal_failures,
            repulled,
            hurried,
            made_room,
            cannot_fit,
        }
    }
}

impl Families for CycleFamilies {
    /// The cycle families, and the process start time beside them (what
    /// restart-aware alerts compare the last success with).
    fn register(registry: &mut Registry) -> Self {
        let cycles = CycleFamilies {
            total: Family::default(),
            duration: Histogram::new(CYCLE_DURATION_BUCKETS_SECONDS),
            last_success: GaugeF64::default(),
            consecutive_failures: Gauge::default(),
        };
        registry.register(
            "imagegc_cycles",
            "Garbage collection cycles finished, by result",
            cycles.total.clone(),
        );
        for result in [CycleResult::Success, CycleResult::Failure] {
            cycles.total.get_or_create(&ResultLabels { result }).inc_by(0);
        }
        registry.register_with_unit(
            "imagegc_cycle_duration",
            "Wall time of one garbage collection cycle, successful or not",
            Unit::Seconds,
            cycles.duration.clone(),
        );
        registry.register_with_unit(
            "imagegc_last_success_timestamp",
            "Unix time at which the last successful cycle finished, restored from the state file \
             at start (0 before the first success this state directory has seen)",
            Unit::Seconds,
            cycles.last_success.clone(),
        );
        registry.register(
            "imagegc_consecutive_failed_cycles",
            "Cycles that failed in a row since the last successful one (0 after a success)",
            cycles.consecutive_failures.clone(),
        );
        let start_time = GaugeF64::default();
        registry.register_with_unit(
            "imagegc_start_time",
            "Unix time at which this imagegc process started",
            Unit::Seconds,
            start_time.clone(),
        );
        start_time.set(unix_now_seconds());

        cycles
    }
}

impl Families for FilesystemFamilies {
    fn register(registry: &mut Registry) -> Self {
        let usage_ratio = GaugeF64::default();
        registry.register_with_unit(
            "imagegc_image_filesystem_usage",
            "Used fraction of the image filesystem (0 to 1) at the last measurement",
            Unit::Other("ratio".to_owned()),
            usage_ratio.clone(),
        );
        let capacity_bytes = Gauge::default();
        registry.register_with_unit(
            "imagegc_image_filesystem_capacity",
            "Size of the image filesystem at the last measurement",
            Unit::Bytes,
            capacity_bytes.clone(),
        );
        let available_bytes = Gauge::default();
        registry.register_with_unit(
            "imagegc_image_filesystem_available",
            "Space available to unprivileged users on the image filesystem at the last measurement",
            Unit::Bytes,
            available_bytes.clone(),
        );
        let high_threshold_ratio = GaugeF64::default();
        registry.register_with_unit(
            "imagegc_high_threshold",
            "Usage above which space-based removal starts, as a fraction (0 to 1)",
            Unit::Other("ratio".to_owned()),
            high_threshold_ratio.clone(),
        );
        let low_threshold_ratio = GaugeF64::default();
        registry.register_with_unit(
            "imagegc_low_threshold",
            "Usage down to which space-based removal frees, as a fraction (0 to 1)",
            Unit::Other("ratio".to_owned()),
            low_threshold_ratio.clone(),
        );

        let space_unreachable = Gauge::default();
        registry.register(
            "imagegc_space_unreachable",
            "1 while removing every removable image could not bring usage to the low threshold \
             (the image filesystem is full of data that is not images), 0 otherwise",
            space_unreachable.clone(),
        );
        let space_pass_due = Gauge::default();
        registry.register(
            "imagegc_space_pass_due",
            "1 while image filesystem usage, rounded up to a whole percent as the kubelet does, \
             is at or above the high threshold (bytes or inodes), so a cycle removes images for space; \
             0 otherwise",
            space_pass_due.clone(),
        );
        let container_mounts_unknown = Gauge::default();
        registry.register(
            "imagegc_container_mounts_unknown",
            "1 while a container's mounted images cannot be read (its ContainerStatus fails), so no image \
             is removed; 0 otherwise",
            container_mounts_unknown.clone(),
        );
        let image_fs_mismatch = Gauge::default();
        registry.register(
            "imagegc_image_fs_mismatch",
            "1 while the filesystem imagegc measures (gc.image_fs_path) is not the image filesystem \
             the runtime names, so no space pass runs on its figures; 0 otherwise",
            image_fs_mismatch.clone(),
        );
        let container_fs_capacity_bytes = Family::<MountLabels, Gauge>::default();
        registry.register_with_unit(
            "imagegc_container_filesystem_capacity",
            "Size of the filesystem the runtime keeps containers' writable layers on, when it is another \
             than the image filesystem (a split store); removing images frees nothing there",
            Unit::Bytes,
            container_fs_capacity_bytes.clone(),
        );
        let container_fs_available_bytes = Family::<MountLabels, Gauge>::default();
        registry.register_with_unit(
            "imagegc_container_filesystem_available",
            "Space available to unprivileged users on the container filesystem of a split store",
            Unit::Bytes,
            container_fs_available_bytes.clone(),
        );
        let container_fs_usage_ratio = Family::<MountLabels, GaugeF64>::default();
        registry.register_with_unit(
            "imagegc_container_filesystem_usage",
            "Used fraction of the container filesystem of a split store (0 to 1)",
            Unit::Other("ratio".to_owned()),
            container_fs_usage_ratio.clone(),
        );
        FilesystemFamilies {
            container_fs_capacity_bytes,
            container_fs_available_bytes,
            container_fs_usage_ratio,
            container_mounts_unknown,
            image_fs_mismatch,
            usage_ratio,
            capacity_bytes,
            available_bytes,
            high_threshold_ratio,
            low_threshold_ratio,
            space_unreachable,
            space_pass_due,
        }
    }
}

impl Families for NodeFamilies {
    /// The node's families, and `imagegc_build_info`.
    fn register(registry: &mut Registry) -> Self {
        let images = Family::<StateLabels, Gauge>::default();
        registry.register(
            "imagegc_images",
            "Images on the node at the last cycle, by state",
            images.clone(),
        );
        for state in [ImageState::InUse, ImageState::Unused, ImageState::Protected] {
            images.get_or_create(&StateLabels { state }).set(0);
        }

        let runtime_up = Gauge::default();
        registry.register(
            "imagegc_runtime_up",
            "1 if the last call to the container runtime succeeded, 0 otherwise",
            runtime_up.clone(),
        );
        let dry_run = Gauge::default();
        registry.register(
            "imagegc_dry_run",
            "1 if imagegc only reports what it would remove, 0 if it removes",
            dry_run.clone(),
        );
        let candidates = Gauge::default();
        registry.register(
            "imagegc_removal_candidates",
            "Unused images the last plan found removable: old enough for removal by age, or \
             removable for space should usage reach the high threshold (not all are removed)",
            candidates.clone(),
        );
        let node_info = Family::<NodeLabels, Gauge>::default();
        registry.register(
            "imagegc_node_info",
            "Always 1; the node label names the node imagegc runs on (NODE_NAME, else the host name)",
            node_info.clone(),
        );

        let order = Family::<OrderLabels, Gauge>::default();
        registry.register(
            "imagegc_gc_order",
            "Always 1; the order label names the order of space removals in force, the auto label whether \
             gc.order = \"auto\" chose it from the node's usage",
            order.clone(),
        );

        let build_info = Family::<BuildLabels, Gauge>::default();
        registry.register(
            "imagegc_build_info",
            "Always 1; the version and commit labels say which imagegc is running",
            build_info.clone(),
        );
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
                commit: env!("IMAGEGC_COMMIT"),
            })
            .set(1);

        NodeFamilies {
            images,
            runtime_up,
            dry_run,
            candidates,
            node_info,
            order,
        }
    }
}

/// The metrics the engine's events set (the families above, registered in
/// the shared registry on first use).
pub struct MetricsSink {
    removals: Arc<RemovalFamilies>,
    cycles: Arc<CycleFamilies>,
    filesystem: Arc<FilesystemFamilies>,
    node: Arc<NodeFamilies>,
    beside: Arc<BesideFamilies>,
    /// The cycle being timed: one dropped unfinished (abandoned at
    /// shutdown) records a failed cycle.
    timer: Mutex<Option<CycleTimer>>,
}

impl MetricsSink {
    /// A sink updating its families in `metrics` (registering them there
    /// if no sink has yet).
    pub fn new(metrics: &Metrics) -> Self {
        MetricsSink {
            removals: metrics.families(),
            cycles: metrics.families(),
            filesystem: metrics.families(),
            node: metrics.families(),
            beside: metrics.families(),
            timer: Mutex::new(None),
        }
    }

    /// Someone else removed `images` images whose last known sizes add up
    /// to `bytes`, found at `at`.
    pub fn removed_by_others(&self, images: usize, bytes: u64, at: SystemTime) {
        let b = &self.beside;
        b.removed_by_others.inc_by(images as u64);
        b.removed_by_others_bytes.inc_by(bytes);
        b.last_removal_by_others
            .set(at.duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()));
    }

    /// What the kubelet's configuration says, as read (or assumed when
    /// `read` is false): whether its image GC is on, and whether imagegc's
    /// high threshold is at or above one of its eviction lines.
    pub fn set_kubelet(&self, read: bool, image_gc_enabled: bool, high_above_eviction: bool) {
        let b = &self.beside;
        b.kubelet_config_read.set(i64::from(read));
        b.kubelet_image_gc_enabled.set(i64::from(image_gc_enabled));
        b.high_above_eviction.set(i64::from(high_above_eviction));
    }

    /// An image was removed for `reason`, freeing `freed_bytes` as measured on the
    /// image filesystem.
    pub fn removed(&self, reason: Reason, freed_bytes: u64) {
        let labels = ReasonLabels { reason };
        self.removals.removed.get_or_create(&labels).inc();
        self.removals.freed_bytes.get_or_create(&labels).inc_by(freed_bytes);
    }

    /// The runtime failed to remove an image.
    pub fn removal_failed(&self) {
        self.removals.removal_failures.inc();
    }

    /// A cycle ended. Prefer [`MetricsSink::cycle_timer`], which cannot forget to call this.
    pub fn cycle_finished(&self, success: bool, duration: Duration) {
        self.cycles.record(success, duration);
    }

    /// Starts timing a cycle. Call [`CycleTimer::finish`] at the end; a timer
    /// dropped without it (the cycle returned early with an error, or unwound)
    /// records a failed cycle.
    pub fn cycle_timer(&self) -> CycleTimer {
        CycleTimer {
            started: Instant::now(),
            cycles: Some(self.cycles.clone()),
        }
    }

    /// Used fraction of the image filesystem, 0 to 1.
    pub fn set_usage_ratio(&self, ratio: f64) {
        self.filesystem.usage_ratio.set(ratio);
    }

    /// Capacity and available bytes of the image filesystem.
    pub fn set_filesystem(&self, capacity_bytes: u64, available_bytes: u64) {
        self.filesystem.capacity_bytes.set(saturating_i64(capacity_bytes));
        self.filesystem.available_bytes.set(saturating_i64(available_bytes));
    }

    /// The configured thresholds, in percent as in the configuration; exported as
    /// ratios so they share an axis with the usage ratio.
    pub fn set_thresholds(&self, high_percent: u8, low_percent: u8) {
        self.filesystem
            .high_threshold_ratio
            .set(f64::from(high_percent) / 100.0);
        self.filesystem.low_threshold_ratio.set(f64::from(low_percent) / 100.0);
    }

    /// How many images the last snapshot had in each state.
    pub fn set_images(&self, in_use: usize, unused: usize, protected: usize) {
        for (state, count) in [
            (ImageState::InUse, in_use),
            (ImageState::Unused, unused),
            (ImageState::Protected, protected),
        ] {
            self.node
                .images
                .get_or_create(&StateLabels { state })
                .set(saturating_i64(count as u64));
        }
    }

    /// Whether the last call to the runtime succeeded.
    pub fn set_runtime_up(&self, up: bool) {
        self.node.runtime_up.set(i64::from(up));
    }

    /// Whether imagegc runs in dry-run mode.
    pub fn set_dry_run(&self, dry_run: bool) {
        self.node.dry_run.set(i64::from(dry_run));
    }

    /// An image imagegc removed was pulled again.
    pub fn repulled(&self) {
        self.removals.repulled.inc();
    }

    /// A space pass found usage past the kubelet's eviction line.
    pub fn hurried(&self) {
        self.removals.hurried.inc();
    }

    /// A space pass makes room for `pulls` coming pulls.
    pub fn made_room(&self, pulls: usize) {
        self.removals.made_room.inc_by(pulls as u64);
    }

    /// How many coming pulls cannot fit, now.
    pub fn set_cannot_fit(&self, pulls: usize) {
        self.removals.cannot_fit.set(pulls as i64);
    }

    /// Whether images can bring usage to the low threshold.
    pub fn set_space_unreachable(&self, unreachable: bool) {
        self.filesystem.space_unreachable.set(i64::from(unreachable));
    }

    /// Whether a container's mounted images cannot be read.
    pub fn set_container_mounts_unknown(&self, unknown: bool) {
        self.filesystem.container_mounts_unknown.set(i64::from(unknown));
    }

    /// Whether the measured filesystem is not the runtime's image filesystem.
    pub fn set_image_fs_mismatch(&self, mismatch: bool) {
        self.filesystem.image_fs_mismatch.set(i64::from(mismatch));
    }

    /// Mount point, capacity and available bytes of the container
    /// filesystem of a split store; `None` (no separate one) exports no sample.
    pub fn set_container_filesystem(&self, measured: Option<(&Path, u64, u64)>) {
        let fs = &self.filesystem;
        let labels = measured.map(|(path, _, _)| MountLabels {
            mount_point: path.display().to_string(),
        });
        let current = labels
            .as_ref()
            .is_some_and(|labels| fs.container_fs_capacity_bytes.get(labels).is_some());
        if !current {
            // Only one series: the one the runtime names now.
            fs.container_fs_capacity_bytes.clear();
            fs.container_fs_available_bytes.clear();
            fs.container_fs_usage_ratio.clear();
        }
        if let (Some((_, capacity, available)), Some(labels)) = (measured, labels) {
            let available = available.min(capacity);
            fs.container_fs_capacity_bytes
                .get_or_create(&labels)
                .set(saturating_i64(capacity));
            fs.container_fs_available_bytes
                .get_or_create(&labels)
                .set(saturating_i64(available));
            let ratio = if capacity == 0 {
                0.0
            } else {
                (capacity - available) as f64 / capacity as f64
            };
            fs.container_fs_usage_ratio.get_or_create(&labels).set(ratio);
        }
    }

    /// Whether usage, as the kubelet rounds it, is at or above the high
    /// threshold: what decides that a cycle runs the space pass.
    pub fn set_space_pass_due(&self, due: bool) {
        self.filesystem.space_pass_due.set(i64::from(due));
    }

    /// The node imagegc runs on, as `imagegc_node_info{node}`. Only the last
    /// name set is exported.
    pub fn set_node(&self, node: &str) {
        self.node.node_info.clear();
        self.node
            .node_info
            .get_or_create(&NodeLabels { node: node.to_owned() })
            .set(1);
    }

    /// The order of space removals in force, as `imagegc_gc_order{order,
    /// auto}`. Only the last set is exported.
    pub fn set_order(&self, order: &'static str, auto: bool) {
        self.node.order.clear();
        self.node
            .order
            .get_or_create(&OrderLabels {
                order,
                auto: if auto { "true" } else { "false" },
            })
            .set(1);
    }

    /// The last successful cycle as the state file remembers it, from before
    /// this process started. Ignored when the gauge already holds a later
    /// time (a success of this process).
    pub fn restore_last_success(&self, at: SystemTime) {
        let seconds = at.duration_since(UNIX_EPOCH).map_or(0.0, |since| since.as_secs_f64());
        if seconds > self.cycles.last_success.get() {
            self.cycles.last_success.set(seconds);
        }
    }

    /// How many unused images the last plan found removable.
    pub fn set_candidates(&self, candidates: usize) {
        self.node.candidates.set(saturating_i64(candidates as u64));
    }
}

impl Sink for MetricsSink {
    fn emit(&self, event: &Event<'_>) {
        let m = self;
        match event {
            Event::Configured {
                dry_run,
                high,
                low,
                kubelet,
            } => {
                m.set_dry_run(*dry_run);
                m.set_thresholds(*high, *low);
                m.set_kubelet(kubelet.read, kubelet.image_gc_enabled, kubelet.high_above_eviction);
            }
            Event::HistoryLoaded { last_success: Some(at) } => m.restore_last_success(*at),
            Event::RuntimeUp(up) => m.set_runtime_up(*up),
            Event::ImageFsMismatch(why) => m.set_image_fs_mismatch(why.is_some()),
            Event::ContainerFsUsage(measured) => {
                m.set_container_filesystem(measured.map(|(path, s)| (path, s.capacity_bytes, s.available())));
            }
            Event::MountsUnread(why) => m.set_container_mounts_unknown(why.is_some()),
            Event::Repulled { .. } => m.repulled(),
            Event::Hurrying { .. } => m.hurried(),
            Event::MakingRoom { pulls, .. } => m.made_room(pulls.len()),
            Event::PullsCannotFit { pulls, .. } => m.set_cannot_fit(pulls.len()),
            Event::Planned {
                in_use,
                unused,
                protected,
                candidates,
                ..
            } => {
                m.set_images(*in_use, *unused, *protected);
                m.set_candidates(*candidates);
            }
            Event::Usage { stats, due } => {
                m.set_usage_ratio(stats.usage_ratio());
                m.set_filesystem(stats.capacity_bytes, stats.available());
                m.set_space_pass_due(*due);
            }
            Event::UsageUnmeasured => m.set_usage_ratio(0.0),
            Event::SpacePassSkipped(_) => m.set_space_pass_due(false),
            Event::SpaceUnreachable { outlook, .. } => m.set_space_unreachable(outlook.is_some()),
            Event::Removed(removal) if !removal.dry_run => m.removed(removal.reason, removal.freed_bytes.unwrap_or(0)),
            Event::RemovedByOthers { images, at } => {
                m.removed_by_others(images.len(), images.iter().map(|i| i.size).sum(), *at);
            }
            Event::RemovalFailed { .. } | Event::RemovalNotDone { .. } => m.removal_failed(),
            Event::CycleStarted => {
                *self.timer.lock().unwrap_or_else(PoisonError::into_inner) = Some(m.cycle_timer());
            }
            Event::CycleFinished(report) => {
                if let Some(timer) = self.timer.lock().unwrap_or_else(PoisonError::into_inner).take() {
                    timer.finish(report.succeeded());
                }
            }
            _ => {}
        }
    }
}

/// Measures one cycle from [`MetricsSink::cycle_timer`] until [`CycleTimer::finish`],
/// or until it is dropped, which counts as a failure.
#[derive(Debug)]
#[must_use = "a timer dropped at once records a failed cycle of zero length"]
pub struct CycleTimer {
    started: Instant,
    cycles: Option<Arc<CycleFamilies>>,
}

impl CycleTimer {
    /// Records the cycle as finished with the given result.
    pub fn finish(mut self, success: bool) {
        self.record(success);
    }

    fn record(&mut self, success: bool) {
        if let Some(cycles) = self.cycles.take() {
            cycles.record(success, self.started.elapsed());
        }
    }
}

impl Drop for CycleTimer {
    fn drop(&mut self) {
        self.record(false);
    }
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sinks::testing::{assert_has, sample_lines};

    #[test]
    fn fresh_metrics_show_every_known_series_at_zero() {
        let metrics = Metrics::new();
        let _sink = MetricsSink::new(&metrics);
        for line in [
            r#"image_garbage_collected_total{reason="age"} 0"#,
            r#"image_garbage_collected_total{reason="space"} 0"#,
            r#"imagegc_freed_bytes_total{reason="age"} 0"#,
            r#"imagegc_freed_bytes_total{reason="space"} 0"#,
            "imagegc_removal_failures_total 0",
            r#"imagegc_cycles_total{result="success"} 0"#,
            r#"imagegc_cycles_total{result="failure"} 0"#,
            "imagegc_cycle_duration_seconds_count 0",
            "imagegc_last_success_timestamp_seconds 0.0",
            r#"imagegc_images{state="in_use"} 0"#,
            r#"imagegc_images{state="unused"} 0"#,
            r#"imagegc_images{state="protected"} 0"#,
            "imagegc_runtime_up 0",
            "imagegc_dry_run 0",
            "imagegc_repulled_after_removal_total 0",
            "imagegc_hurried_space_passes_total 0",
            "imagegc_room_before_pulls_total 0",
            "imagegc_coming_pulls_cannot_fit 0",
            "imagegc_removal_candidates 0",
            concat!(
                r#"imagegc_build_info{version=""#,
                env!("CARGO_PKG_VERSION"),
                r#"",commit=""#,
                env!("IMAGEGC_COMMIT"),
                r#""} 1"#
            ),
        ] {
            assert_has(&metrics, line);
        }
        assert!(metrics.encode().ends_with("# EOF\n"));
    }

    #[test]
    fn removals_count_by_reason_and_add_up_freed_bytes() {
        let metrics = Metrics::new();
        let sink = MetricsSink::new(&metrics);
        sink.removed(Reason::Space, 1000);
        sink.removed(Reason::Space, 500);
        sink.removed(Reason::Age, 7);
        sink.removal_failed();

        assert_has(&metrics, r#"image_garbage_collected_total{reason="space"} 2"#);
        assert_has(&metrics, r#"image_garbage_collected_total{reason="age"} 1"#);
        assert_has(&metrics, r#"imagegc_freed_bytes_total{reason="space"} 1500"#);
        assert_has(&metrics, r#"imagegc_freed_bytes_total{reason="age"} 7"#);
        assert_has(&metrics, "imagegc_removal_failures_total 1");
    }

    #[test]
    fn finished_cycles_are_counted_timed_and_stamped() {
        let metrics = Metrics::new();
        let sink = MetricsSink::new(&metrics);
        sink.cycle_finished(true, Duration::from_millis(20));
        sink.cycle_finished(false, Duration::from_secs(700));

        assert_has(&metrics, r#"imagegc_cycles_total{result="success"} 1"#);
        assert_has(&metrics, r#"imagegc_cycles_total{result="failure"} 1"#);
        assert_has(&metrics, "imagegc_cycle_duration_seconds_count 2");
        assert_has(&metrics, r#"imagegc_cycle_duration_seconds_bucket{le="0.025"} 1"#);
        assert_has(&metrics, r#"imagegc_cycle_duration_seconds_bucket{le="600.0"} 1"#);
        assert_has(&metrics, r#"imagegc_cycle_duration_seconds_bucket{le="+Inf"} 2"#);

        let stamp = sample_lines(&metrics)
            .into_iter()
            .find_map(|l| {
                l.strip_prefix("imagegc_last_success_timestamp_seconds ")
                    .map(str::to_owned)
            })
            .expect("timestamp sample");
        let stamp: f64 = stamp.parse().expect("a number");
        assert!(stamp > 1_600_000_000.0, "not a Unix time: {stamp}");
    }

    #[test]
    fn a_failed_cycle_does_not_move_the_last_success_timestamp() {
        let metrics = Metrics::new();
        let sink = MetricsSink::new(&metrics);
        sink.cycle_finished(false, Duration::from_secs(1));
        assert_has(&metrics, "imagegc_last_success_timestamp_seconds 0.0");
    }

    #[test]
    fn a_finished_timer_records_its_result_once() {
        let metrics = Metrics::new();
        let sink = MetricsSink::new(&metrics);
        sink.cycle_timer().finish(true);

        assert_has(&metrics, r#"imagegc_cycles_total{result="success"} 1"#);
        assert_has(&metrics, r#"imagegc_cycles_total{result="failure"} 0"#);
        assert_has(&metrics, "imagegc_cycle_duration_seconds_count 1");
    }

    #[test]
    fn a_timer_dropped_without_finish_records_a_failure() {
        fn cycle(sink: &MetricsSink) -> Result<(), &'static str> {
            let _timer = sink.cycle_timer();
            Err("runtime unreachable")
        }
        let metrics = Metrics::new();
        let sink = MetricsSink::new(&metrics);
        assert!(cycle(&sink).is_err());

        assert_has(&metrics, r#"imagegc_cycles_total{result="failure"} 1"#);
        assert_has(&metrics, r#"imagegc_cycles_total{result="success"} 0"#);
        assert_has(&metrics, "imagegc_cycle_duration_seconds_count 1");
    }

    #[test]
    fn filesystem_and_thresholds_share_the_ratio_axis() {
        let metrics = Metrics::new();
        let sink = MetricsSink::new(&metrics);
        sink.set_usage_ratio(0.875);
        sink.set_filesystem(100 << 30, 12_345);
        sink.set_thresholds(85, 80);

        assert_has(&metrics, "imagegc_image_filesystem_usage_ratio 0.875");
        assert_has(&metrics, "imagegc_image_filesystem_capacity_bytes 107374182400");
        assert_has(&metrics, "imagegc_image_filesystem_available_bytes 12345");
        assert_has(&metrics, "imagegc_high_threshold_ratio 0.85");
        assert_has(&metrics, "imagegc_low_threshold_ratio 0.8");
    }

    #[test]
    fn the_container_filesystem_is_exported_only_while_the_runtime_names_a_separate_one() {
        let metrics = Metrics::new();
        let sink = MetricsSink::new(&metrics);
        let exported = |metrics: &Metrics| {
            sample_lines(metrics)
                .into_iter()
                .filter(|l| l.starts_with("imagegc_container_filesystem_"))
                .count()
        };
        assert_eq!(exported(&metrics), 0);

        sink.set_container_filesystem(Some((Path::new("/c/overlay-containers"), 1000, 250)));
        assert_has(
            &metrics,
            r#"imagegc_container_filesystem_capacity_bytes{mount_point="/c/overlay-containers"} 1000"#,
        );
        assert_has(
            &metrics,
            r#"imagegc_container_filesystem_available_bytes{mount_point="/c/overlay-containers"} 250"#,
        );
        assert_has(
            &metrics,
            r#"imagegc_container_filesystem_usage_ratio{mount_point="/c/overlay-containers"} 0.75"#,
        );
        // The runtime names another one: only that one is exported.
        sink.set_container_filesystem(Some((Path::new("/d"), 1000, 500)));
        assert_eq!(exported(&metrics), 3);
        assert_has(
            &metrics,
            r#"imagegc_container_filesystem_available_bytes{mount_point="/d"} 500"#,
        );

        sink.set_container_filesystem(None);
        assert_eq!(exported(&metrics), 0);
    }

    #[test]
    fn node_state_gauges_report_the_last_values_set() {
        let metrics = Metrics::new();
        let sink = MetricsSink::new(&metrics);
        sink.set_images(3, 10, 2);
        sink.set_runtime_up(true);
        sink.set_dry_run(true);
        sink.set_candidates(4);
        sink.repulled();
        sink.set_images(4, 9, 2);
        sink.set_runtime_up(false);

        assert_has(&metrics, r#"imagegc_images{state="in_use"} 4"#);
        assert_has(&metrics, r#"imagegc_images{state="unused"} 9"#);
        assert_has(&metrics, r#"imagegc_images{state="protected"} 2"#);
        assert_has(&metrics, "imagegc_runtime_up 0");
        assert_has(&metrics, "imagegc_dry_run 1");
        assert_has(&metrics, "imagegc_removal_candidates 4");
        assert_has(&metrics, "imagegc_repulled_after_removal_total 1");
    }

    #[test]
    fn failed_cycles_in_a_row_count_up_and_a_success_resets_them() {
        let metrics = Metrics::new();
        let sink = MetricsSink::new(&metrics);
        assert_has(&metrics, "imagegc_consecutive_failed_cycles 0");
        sink.cycle_finished(false, Duration::from_secs(1));
        sink.cycle_finished(false, Duration::from_secs(1));
        assert_has(&metrics, "imagegc_consecutive_failed_cycles 2");
        sink.cycle_finished(true, Duration::from_secs(1));
        assert_has(&metrics, "imagegc_consecutive_failed_cycles 0");
    }

    /// The last success the gauge shows, to the millisecond; `None` at 0.
    fn last_success(metrics: &Metrics) -> Option<SystemTime> {
        let seconds: f64 = sample_lines(metrics)
            .iter()
            .find_map(|l| l.strip_prefix("imagegc_last_success_timestamp_seconds "))
            .expect("the gauge")
            .parse()
            .expect("a number");
        let millis = (seconds * 1000.0).round();
        (millis > 0.0).then(|| UNIX_EPOCH + Duration::from_millis(millis as u64))
    }

    #[test]
    fn a_restored_last_success_shows_until_a_later_one() {
        let metrics = Metrics::new();
        let sink = MetricsSink::new(&metrics);
        assert_eq!(last_success(&metrics), None);
        sink.restore_last_success(UNIX_EPOCH + Duration::from_secs(1_700_000_000));
        assert_has(&metrics, "imagegc_last_success_timestamp_seconds 1700000000.0");
        sink.cycle_finished(true, Duration::from_secs(1));
        let now = last_success(&metrics).expect("a success");
        sink.restore_last_success(UNIX_EPOCH + Duration::from_secs(1_700_000_000));
        assert_eq!(last_success(&metrics), Some(now));
    }

    #[test]
    fn the_process_start_and_the_node_are_exported() {
        let metrics = Metrics::new();
        let sink = MetricsSink::new(&metrics);
        let start: f64 = sample_lines(&metrics)
            .iter()
            .find_map(|l| l.strip_prefix("imagegc_start_time_seconds "))
            .expect("start time")
            .parse()
            .expect("a number");
        assert!(start > 1_600_000_000.0, "not a Unix time: {start}");
        sink.set_node("node-a");
        sink.set_node("worker-1");
        assert_has(&metrics, r#"imagegc_node_info{node="worker-1"} 1"#);
        assert!(!metrics.encode().contains("node-a"));
    }

    #[test]
    fn the_classic_format_names_counters_with_total_and_has_no_openmetrics_lines() {
        let metrics = Metrics::new();
        let sink = MetricsSink::new(&metrics);
        sink.removed(Reason::Space, 10);
        let classic = metrics.encode_classic();
        let lines: Vec<&str> = classic.lines().collect();
        for line in [
            "# TYPE image_garbage_collected_total counter",
            "# TYPE imagegc_freed_bytes_total counter",
            "# TYPE imagegc_cycles_total counter",
            "# TYPE imagegc_cycle_duration_seconds histogram",
            "# TYPE imagegc_runtime_up gauge",
            r#"imagegc_freed_bytes_total{reason="space"} 10"#,
        ] {
            assert!(lines.contains(&line), "missing {line:?} in:\n{classic}");
        }
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("# HELP imagegc_removal_failures_total Image removals"))
        );
        assert!(!lines.iter().any(|l| l.starts_with("# UNIT ") || *l == "# EOF"));
        // Every sample of the OpenMetrics form is there, unchanged.
        let samples = |text: &str| -> Vec<String> {
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(samples(&classic), samples(&metrics.encode()));
    }

    #[test]
    fn units_are_declared_for_openmetrics() {
        let metrics = Metrics::new();
        let _sink = MetricsSink::new(&metrics);
        let text = metrics.encode();
        for line in [
            "# TYPE image_garbage_collected counter",
            "# UNIT imagegc_cycle_duration_seconds seconds",
            "# UNIT imagegc_freed_bytes bytes",
            "# UNIT imagegc_image_filesystem_usage_ratio ratio",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in:\n{text}");
        }
    }
}
