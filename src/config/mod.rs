//! Configuration: a raw serde form that rejects unknown keys, converted into
//! a validated [`Config`] that every other module reads. Nothing downstream
//! sees the raw form.
//!
//! Three inputs are accepted by `--config FILE`: imagegc's TOML schema, the
//! same schema in YAML, and a kubelet `KubeletConfiguration` YAML whose image
//! GC fields are honoured (other kubelet fields are ignored).
//!
//! Loading never stops at the first mistake. The file is parsed into a
//! generic tree, then every key is deserialized on its own into the raw
//! section it belongs to, so each unknown key and each value of the wrong
//! type becomes its own [`Problem`]; the values that passed are then checked
//! against each other. Every problem names the file and the key as the user
//! wrote it (`gc.high_threshold_percent`, or `imageGCHighThresholdPercent` in
//! a kubelet file). This module reads files and nothing else: it does not
//! touch the runtime, the image filesystem or the state directory.
//!
//! This file owns the validated types, their defaults, the effective
//! configuration printed by `check-config`, and [`load`], which runs the
//! steps below in order; it holds no parsing or checking rule of its own.
//! - `parse`: text to a generic tree (TOML or YAML), with its cost bounded
//!   (`yaml_depth`: YAML's nesting, read as its parser reads it);
//! - `raw`: the raw serde forms, read one key at a time;
//! - `kubelet`: the KubeletConfiguration reader and its cross-checks;
//! - `validate`: raw values to a validated [`Config`], every rule checked.
//!
//! Durations are read and written by [`crate::time`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

mod kubelet;
pub(crate) use kubelet::parse_quantity;
mod parse;
mod protect;
mod raw;
mod scalar;
#[cfg(test)]
mod tests_support;
mod validate;
mod yaml_depth;

pub use crate::time::{format_duration, parse_duration};
pub use parse::{MAX_FILE_BYTES, MAX_NESTING};
pub use protect::ProtectConfig;
pub use validate::{MAX_AGE, MAX_PERIOD};

/// The kubelet's period between image GC runs.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(300);
/// How often containers are polled between cycles when the runtime does not
/// stream container events.
pub const DEFAULT_USAGE_POLL_INTERVAL: Duration = Duration::from_secs(30);
/// Per CRI call deadline: the kubelet's default runtime request timeout.
pub const DEFAULT_RUNTIME_TIMEOUT: Duration = Duration::from_secs(120);
/// Space collection starts at this usage of the image filesystem, in
/// percent: below the kubelet's default eviction line (`evictionHard`
/// `imagefs.available` 15%: pods are evicted above 85% usage) and below its
/// image GC default (85), so that beside a kubelet left at its defaults the
/// kubelet finds nothing to do.
pub const DEFAULT_HIGH_THRESHOLD_PERCENT: u8 = 80;
/// A space pass frees down to this usage, in percent.
pub const DEFAULT_LOW_THRESHOLD_PERCENT: u8 = 75;
/// The kubelet's own `imageGCHighThresholdPercent` and
/// `imageGCLowThresholdPercent` defaults, which a KubeletConfiguration that
/// sets neither means: the file is read as the kubelet reads it.
pub const KUBELET_DEFAULT_THRESHOLDS_PERCENT: (u8, u8) = (85, 80);
/// The kubelet's `imageMinimumGCAge` default.
pub const DEFAULT_MIN_AGE: Duration = Duration::from_secs(120);
/// A removed image that comes back within this window counts as a re-pull.
pub const DEFAULT_THRASH_WINDOW: Duration = Duration::from_secs(3600);

/// How long pods last seen bound to the node keep protecting their images
/// while the API server is unreachable: an hour covers an API server's
/// upgrade or restart, and bounds what a pod deleted meanwhile holds.
pub const DEFAULT_PODS_STALE_AFTER: Duration = Duration::from_secs(3600);
/// The `file` of problems found in command-line overrides.
const COMMAND_LINE: &str = "command line";

/// The validated configuration every other module reads: the file's values (TOML,
/// YAML or a KubeletConfiguration) with the defaults filled in and the
/// command-line overrides applied. Built only by [`load`] (or [`Config::default`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The `[runtime]` section: which CRI endpoint to talk to and how long to wait.
    pub runtime: RuntimeConfig,
    /// The `[gc]` section (or a KubeletConfiguration's image GC fields): when
    /// cycles run and what they may remove.
    pub gc: GcConfig,
    /// The `[protect]` section: images that are never removed.
    pub protect: ProtectConfig,
    /// The `[state]` section: where image history and the removal journal live.
    pub state: StateConfig,
    /// The `[metrics]` section: the HTTP endpoint for `/metrics`, `/healthz`
    /// and `/readyz`.
    pub metrics: MetricsConfig,
    /// The kubelet's hard eviction threshold for the image filesystem
    /// (`evictionHard["imagefs.available"]`), when read from a
    /// KubeletConfiguration.
    pub eviction_imagefs_available: Option<EvictionThreshold>,
    /// The node's KubeletConfiguration (`kubelet.config`), read only to check
    /// that the kubelet's own image GC is off and that its eviction threshold
    /// leaves room for imagegc's high threshold.
    pub kubelet_config: Option<PathBuf>,
    /// The kubelet's drop-in directory (`kubelet.config_dir`, the kubelet's
    /// `--config-dir`): its `.conf` files merged over `kubelet.config`.
    pub kubelet_config_dir: Option<PathBuf>,
    /// A file of the kubelet's command-line flags (`kubelet.args_file`, e.g.
    /// MicroK8s's /var/snap/microk8s/current/args/kubelet, or AKS's
    /// environment file /etc/default/kubelet): its image GC and eviction
    /// flags, over the files, as the kubelet applies them.
    pub kubelet_args_file: Option<PathBuf>,
    /// What the kubelet's configuration says of living beside it, as read,
    /// or as assumed (the kubelet's defaults) when none was read.
    pub kubelet: KubeletView,
    /// The `[kubernetes]` section.
    pub kubernetes: KubernetesConfig,
    /// The file this configuration was read from, if any.
    pub source: Option<PathBuf>,
    /// Non-fatal findings (for example: the kubelet would evict before the
    /// high threshold is reached). Printed by `check-config`, logged by `run`.
    pub warnings: Vec<String>,
}

/// `[runtime]`: how imagegc reaches the container runtime.
#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeConfig {
    /// `None`: discover among the default endpoints.
    pub endpoint: Option<String>,
    /// Deadline of each CRI call (`runtime.timeout`, default 2m, the
    /// kubelet's runtime request timeout); a call that passes it fails the cycle.
    pub timeout: Duration,
    /// Follow `GetContainerEvents` between cycles instead of polling
    /// `ListContainers`. Off by default: containerd 1.7 and CRI-O 1.26 split
    /// one event queue between subscribers, so a second subscriber takes
    /// events away from the kubelet's Evented PLEG.
    pub container_events: bool,
    /// The sandbox (pause) image, named outright: protected whatever the
    /// runtime reports (`None`: learnt from the runtime).
    pub sandbox_image: Option<String>,
}

/// The order in which a space pass walks its candidates (`gc.order`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// The kubelet's: least recently used first, ties by first seen.
    Lru,
    /// Images whose repository ran a newer image since they last ran first
    /// (an older tag after a rollout), each group least recently used
    /// first.
    SupersededFirst,
    /// As `SupersededFirst`, then each group by when each image is expected
    /// back, farthest first: an image used again after breaks
    /// ([`crate::records::Record::usual_break`]) one usual break after its
    /// last use (one usual break from now, when that is past; as `Lru`
    /// guesses, once it is twice past), any other as long from now as it
    /// has been unused (`Lru`'s guess); one whose breaks stray as a random
    /// use's do, about one usual break from now. It keeps a periodic job's
    /// image that is due soon over one used more recently but not needed
    /// for longer.
    /// The default: of the fixed orders, it pulled least again over the
    /// simulated workloads, and was behind the kubelet or `Lru` on fewest
    /// of them; `Auto` choosing among the three did no better
    /// (BENCHMARKS.md).
    #[default]
    Reuse,
    /// Whichever of the others would have pulled least again over the
    /// node's own recent usage, replayed at its capacity and thresholds
    /// each day (see `crate::sim::choose`); [`Order::PRIOR`] until there
    /// is usage to replay.
    Auto,
}

impl Order {
    /// Every order, the kubelet's first.
    pub const ALL: [Order; 4] = [Order::Lru, Order::SupersededFirst, Order::Reuse, Order::Auto];

    /// The orders `auto` chooses from, the kubelet's first.
    pub const FIXED: [Order; 3] = [Order::Lru, Order::SupersededFirst, Order::Reuse];

    /// The order `auto` runs before it has usage to judge by: of the
    /// fixed orders, the one that pulled least again over the simulated
    /// workloads (BENCHMARKS.md).
    pub const PRIOR: Order = Order::Reuse;

    /// The value as the configuration writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Order::Lru => "lru",
            Order::SupersededFirst => "superseded-first",
            Order::Reuse => "reuse",
            Order::Auto => "auto",
        }
    }

    /// The order a configuration names, if any.
    pub fn parse(text: &str) -> Option<Self> {
        Order::ALL.into_iter().find(|order| order.as_str() == text)
    }
}

/// `[gc]`: when collection runs and what it may remove. A KubeletConfiguration
/// sets the thresholds and the ages from its `imageGC*` fields instead.
#[derive(Debug, Clone, PartialEq)]
pub struct GcConfig {
    /// Time between cycles (`gc.interval`, default 5m, at least 1s).
    pub interval: Duration,
    /// How often containers are listed between cycles to keep last-used times
    /// current (`gc.usage_poll_interval`, default 30s, at most `interval`).
    pub usage_poll_interval: Duration,
    /// Disk usage of the image filesystem, in percent of its capacity, at which
    /// a space pass starts (`gc.high_threshold_percent` or
    /// `imageGCHighThresholdPercent`, default 80, the kubelet's 85 in a
    /// KubeletConfiguration, 0..=100; 100 with a zero `max_age` disables
    /// collection).
    pub high_threshold_percent: u8,
    /// Disk usage, in percent of capacity, that a space pass frees down to
    /// (`gc.low_threshold_percent` or `imageGCLowThresholdPercent`, default 75,
    /// the kubelet's 80 in a KubeletConfiguration; below
    /// `high_threshold_percent`).
    pub low_threshold_percent: u8,
    /// Unused images first seen less than this long ago are kept by the space
    /// pass (`gc.min_age` or `imageMinimumGCAge`, default 2m).
    pub min_age: Duration,
    /// Zero disables age-based removal.
    pub max_age: Duration,
    /// Plan, log and journal, but remove nothing (`gc.dry_run`, default false;
    /// also set by `--dry-run`).
    pub dry_run: bool,
    /// `None`: the runtime's ImageFsInfo mount point.
    pub image_fs_path: Option<PathBuf>,
    /// An image removed and pulled again within this window counts as a re-pull
    /// (`gc.thrash_window`, default 1h).
    pub thrash_window: Duration,
    /// The order of the space candidates (`gc.order`, default `reuse`).
    pub order: Order,
    /// Keep room above the kubelet's eviction line for the largest recent
    /// pull (`gc.headroom`, default false: it costs re-pulls; see
    /// [`crate::policy::Headroom`]).
    pub headroom: bool,
    /// Inode usage of the image filesystem, in percent, at which a space pass
    /// also starts (`gc.high_inodes_percent`, 1..=100; `None` when unset or 0:
    /// inodes are not watched). Set together with `low_inodes_percent`.
    pub high_inodes_percent: Option<u8>,
    /// Inode usage, in percent, that a space pass started by either threshold
    /// goes on freeing down to, beside the byte low mark
    /// (`gc.low_inodes_percent`, below the high one; `None` when unset or 0).
    pub low_inodes_percent: Option<u8>,
}

/// `[state]`: where imagegc keeps what it must remember across restarts.
#[derive(Debug, Clone, PartialEq)]
pub struct StateConfig {
    /// The state directory (`state.dir` or `--state-dir`, default
    /// `/var/lib/imagegc`, an absolute path): image history and the removal
    /// journal; `run` and `once` hold its lock.
    pub dir: PathBuf,
    /// `state.usage_log` (default true): `run` records what it observes
    /// of the node's images and containers in `<dir>/usage.jsonl`, bounded
    /// by rotation, for `imagegc simulate --log` (see [`crate::usage_log`]).
    pub usage_log: bool,
}

/// `[metrics]`: the HTTP endpoint serving `/metrics`, `/healthz` and `/readyz`.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsConfig {
    /// `None`: the HTTP endpoint is disabled.
    pub listen: Option<SocketAddr>,
}

/// `[kubernetes]`: what imagegc reads from and tells the cluster, off
/// unless `enabled` (imagegc is then a pure CRI agent).
#[derive(Debug, Clone, PartialEq)]
pub struct KubernetesConfig {
    /// Whether imagegc talks to the API server at all.
    pub enabled: bool,
    /// This node's name (`spec.nodeName` of its pods, the Node object's
    /// name); `None`: the `NODE_NAME` environment variable, which the
    /// DaemonSet sets from the downward API.
    pub node_name: Option<String>,
    /// A kubeconfig file (a systemd install); `None`: the pod's in-cluster
    /// service account.
    pub kubeconfig: Option<PathBuf>,
    /// Keep every image that a pod bound to this node names.
    pub protect_pods: bool,
    /// Make room before the pull of an image a pod bound to this node names
    /// and the node lacks, when it would cross the kubelet's eviction line
    /// (with `protect_pods`, which watches the pods).
    pub room_before_pulls: bool,
    /// Post events on this node's Node object.
    pub node_events: bool,
    /// How long the last known pods keep protecting their images while the
    /// API server cannot be watched.
    pub pods_stale_after: Duration,
    /// Size a coming pull of a repository the node never had by its
    /// registry's manifest (anonymous access; off: Docker Hub counts a
    /// manifest GET against the node's pull limit).
    pub registry_manifests: bool,
    /// Where a registry's manifests are read instead of
    /// `https://<registry>` (a mirror, a registry on the node's loopback):
    /// registry as image names write it (`localhost:5001`) → its address
    /// (`http://kind-registry:5000`), validated.
    pub registry_endpoints: std::collections::BTreeMap<String, String>,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        KubernetesConfig {
            enabled: false,
            node_name: None,
            kubeconfig: None,
            protect_pods: true,
            room_before_pulls: true,
            node_events: true,
            pods_stale_after: DEFAULT_PODS_STALE_AFTER,
            registry_manifests: false,
            registry_endpoints: std::collections::BTreeMap::new(),
        }
    }
}

/// What imagegc knows of the kubelet's image GC and eviction lines, for
/// `imagegc_kubelet_config_read`, `imagegc_kubelet_image_gc_enabled` and
/// `imagegc_high_threshold_above_eviction`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KubeletView {
    /// The kubelet's configuration was read (`kubelet.config`,
    /// `kubelet.config_dir`); otherwise the rest is assumed from its
    /// defaults.
    pub read: bool,
    /// The kubelet's own image GC is on (its default).
    pub image_gc_enabled: bool,
    /// `gc.high_threshold_percent` is at or above one of the kubelet's
    /// percentage eviction lines on the image filesystem.
    pub high_above_eviction: bool,
}

impl KubeletView {
    /// Nothing read: the kubelet's defaults (image GC on at 85/80, pods
    /// evicted below 15 % available on the image filesystem) against
    /// imagegc's high threshold.
    pub fn assumed(high: u8) -> Self {
        KubeletView {
            read: false,
            image_gc_enabled: true,
            high_above_eviction: f64::from(high) >= 100.0 - kubelet::DEFAULT_IMAGEFS_AVAILABLE_PERCENT,
        }
    }
}

/// A kubelet hard eviction threshold on available space: the kubelet evicts
/// pods when less than this is available.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EvictionThreshold {
    /// Percent of the filesystem's capacity (`"15%"`).
    Percent(f64),
    /// An absolute quantity (`"10Gi"`), in bytes.
    Bytes(u64),
}

impl Config {
    /// The kubelet's hard eviction line on the image filesystem: as read
    /// from its configuration, or its default when none was read.
    pub fn eviction_line(&self) -> EvictionThreshold {
        self.eviction_imagefs_available
            .unwrap_or(EvictionThreshold::Percent(kubelet::DEFAULT_IMAGEFS_AVAILABLE_PERCENT))
    }
}

impl EvictionThreshold {
    /// The bytes that must stay available on a filesystem of
    /// `capacity_bytes` (a percentage is truncated to whole bytes, as the
    /// kubelet does).
    pub fn min_available_bytes(&self, capacity_bytes: u64) -> u64 {
        match *self {
            EvictionThreshold::Percent(percent) => (capacity_bytes as f64 * percent / 100.0) as u64,
            EvictionThreshold::Bytes(bytes) => bytes,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            runtime: RuntimeConfig {
                endpoint: None,
                timeout: DEFAULT_RUNTIME_TIMEOUT,
                container_events: false,
                sandbox_image: None,
            },
            gc: GcConfig {
                interval: DEFAULT_INTERVAL,
                usage_poll_interval: DEFAULT_USAGE_POLL_INTERVAL,
                high_threshold_percent: DEFAULT_HIGH_THRESHOLD_PERCENT,
                low_threshold_percent: DEFAULT_LOW_THRESHOLD_PERCENT,
                min_age: DEFAULT_MIN_AGE,
                max_age: Duration::ZERO,
                dry_run: false,
                image_fs_path: None,
                thrash_window: DEFAULT_THRASH_WINDOW,
                order: Order::Reuse,
                headroom: false,
                high_inodes_percent: None,
                low_inodes_percent: None,
            },
            protect: ProtectConfig::default(),
            state: StateConfig {
                dir: PathBuf::from("/var/lib/imagegc"),
                usage_log: true,
            },
            metrics: MetricsConfig {
                listen: Some(SocketAddr::from(([127, 0, 0, 1], 9105))),
            },
            eviction_imagefs_available: None,
            kubelet_config: None,
            kubelet_config_dir: None,
            kubelet_args_file: None,
            kubelet: KubeletView::assumed(DEFAULT_HIGH_THRESHOLD_PERCENT),
            kubernetes: KubernetesConfig::default(),
            source: None,
            warnings: Vec::new(),
        }
    }
}

impl Config {
    /// True when neither space nor age collection can ever remove anything
    /// (the kubelet's "disabled": high = 100 and max age 0).
    pub fn collection_disabled(&self) -> bool {
        self.gc.high_threshold_percent >= 100 && self.gc.max_age.is_zero() && self.gc.high_inodes_percent.is_none()
    }

    /// The effective configuration in imagegc's TOML schema: every key, with
    /// the defaults filled in. Loading the text back gives an equal `Config`
    /// (apart from `source`, `warnings` and `eviction_imagefs_available`,
    /// which the schema does not carry).
    pub fn to_toml_string(&self) -> String {
        let runtime = &self.runtime;
        let gc = &self.gc;
        let path = |path: Option<&Path>| toml_string(&path.map(|p| p.to_string_lossy()).unwrap_or_default());
        format!(
            r#"[runtime]
endpoint = {endpoint}
timeout = "{timeout}"
container_events = {container_events}
sandbox_image = {sandbox_image}

[gc]
interval = "{interval}"
usage_poll_interval = "{usage_poll_interval}"
high_threshold_percent = {high}
low_threshold_percent = {low}
min_age = "{min_age}"
max_age = "{max_age}"
dry_run = {dry_run}
image_fs_path = {image_fs_path}
thrash_window = "{thrash_window}"
order = "{order}"
headroom = {headroom}
high_inodes_percent = {high_inodes}
low_inodes_percent = {low_inodes}

{protect}
[state]
dir = {state_dir}
usage_log = {usage_log}

[metrics]
listen = {listen}

[kubelet]
config = {kubelet_config}
config_dir = {kubelet_config_dir}
args_file = {kubelet_args_file}

[kubernetes]
enabled = {kube_enabled}
node_name = {kube_node}
kubeconfig = {kubeconfig}
protect_pods = {protect_pods}
room_before_pulls = {room_before_pulls}
node_events = {node_events}
pods_stale_after = "{pods_stale_after}"
registry_manifests = {registry_manifests}
registry_endpoints = {registry_endpoints}
"#,
            endpoint = toml_string(runtime.endpoint.as_deref().unwrap_or("")),
            timeout = format_duration(runtime.timeout),
            container_events = runtime.container_events,
            sandbox_image = toml_string(runtime.sandbox_image.as_deref().unwrap_or("")),
            interval = format_duration(gc.interval),
            usage_poll_interval = format_duration(gc.usage_poll_interval),
            high = gc.high_threshold_percent,
            low = gc.low_threshold_percent,
            min_age = format_duration(gc.min_age),
            max_age = format_duration(gc.max_age),
            dry_run = gc.dry_run,
            image_fs_path = path(gc.image_fs_path.as_deref()),
            thrash_window = format_duration(gc.thrash_window),
            order = gc.order.as_str(),
            headroom = gc.headroom,
            high_inodes = gc.high_inodes_percent.unwrap_or(0),
            low_inodes = gc.low_inodes_percent.unwrap_or(0),
            protect = self.protect.to_toml(),
            state_dir = path(Some(&self.state.dir)),
            usage_log = self.state.usage_log,
            listen = toml_string(&self.metrics.listen.map(|addr| addr.to_string()).unwrap_or_default()),
            kubelet_config = path(self.kubelet_config.as_deref()),
            kubelet_config_dir = path(self.kubelet_config_dir.as_deref()),
            kubelet_args_file = path(self.kubelet_args_file.as_deref()),
            kube_enabled = self.kubernetes.enabled,
            kube_node = toml_string(self.kubernetes.node_name.as_deref().unwrap_or("")),
            kubeconfig = path(self.kubernetes.kubeconfig.as_deref()),
            protect_pods = self.kubernetes.protect_pods,
            room_before_pulls = self.kubernetes.room_before_pulls,
            node_events = self.kubernetes.node_events,
            pods_stale_after = format_duration(self.kubernetes.pods_stale_after),
            registry_manifests = self.kubernetes.registry_manifests,
            registry_endpoints = inline_table(&self.kubernetes.registry_endpoints),
        )
    }
}

/// A TOML inline table of strings: `{ "a" = "b" }`.
fn inline_table(map: &std::collections::BTreeMap<String, String>) -> String {
    if map.is_empty() {
        return "{}".to_owned();
    }
    let pairs: Vec<String> = map
        .iter()
        .map(|(key, value)| format!("{} = {}", toml_string(key), toml_string(value)))
        .collect();
    format!("{{ {} }}", pairs.join(", "))
}

/// A TOML basic string, quoted and escaped.
fn toml_string(text: &str) -> String {
    toml::Value::String(text.to_owned()).to_string()
}

/// Command-line values that override the file. Problems with them are
/// reported with the file `command line` and the flag as the key
/// (`--runtime-endpoint`, `--state-dir`).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--runtime-endpoint`: replaces `runtime.endpoint` (`unix:///absolute/path`;
    /// `""` discovers the runtime).
    pub runtime_endpoint: Option<String>,
    /// `--state-dir`: replaces `state.dir` (an absolute path).
    pub state_dir: Option<PathBuf>,
    /// `--dry-run` of `run` or `once`: forces `gc.dry_run` on (false leaves the
    /// file's value).
    pub dry_run: bool,
    /// `--kubelet-config` (`IMAGEGC_KUBELET_CONFIG`): replaces `kubelet.config`,
    /// the node's KubeletConfiguration to check the hand-over against (an
    /// absolute path). The DaemonSet sets it where it mounts the kubelet's
    /// file, so the ConfigMap need not change.
    pub kubelet_config: Option<PathBuf>,
    /// `--kubelet-config-dir` (`IMAGEGC_KUBELET_CONFIG_DIR`): replaces
    /// `kubelet.config_dir`, the kubelet's drop-in directory (an absolute
    /// path).
    pub kubelet_config_dir: Option<PathBuf>,
    /// `--kubelet-args-file` (`IMAGEGC_KUBELET_ARGS_FILE`): replaces
    /// `kubelet.args_file`, a file of the kubelet's flags (an absolute path).
    pub kubelet_args_file: Option<PathBuf>,
    /// `--kubernetes` (`IMAGEGC_KUBERNETES`): turns `kubernetes.enabled` on
    /// (false leaves the file's value). The kustomize component and the
    /// chart set it with the RBAC they add.
    pub kubernetes: bool,
    /// `--registry-manifests` (`IMAGEGC_REGISTRY_MANIFESTS`): turns
    /// `kubernetes.registry_manifests` on (false leaves the file's value).
    /// deploy/components/registry-manifests sets it with the egress and the
    /// certificates it adds.
    pub registry_manifests: bool,
}

/// One configuration problem: the file, the key as the user wrote it, and
/// what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Where the problem is: the configuration file's path as given, or
    /// `command line` for an override.
    pub file: String,
    /// The key as the user wrote it (`gc.high_threshold_percent`,
    /// `imageGCHighThresholdPercent`, `--state-dir`); empty when the problem is
    /// the whole file (unreadable, a syntax error, too large or too deep, not a
    /// mapping of keys).
    pub key: String,
    /// What is wrong, for a person: the expected form and the value found.
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(f, "{}: {}: {}", self.file, self.key, self.message)
        }
    }
}

/// Every problem found, reported together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct ConfigError {
    /// Every problem, the file's sorted by key, then the command line's; never
    /// empty.
    pub problems: Vec<Problem>,
}

/// Reads, validates and applies overrides. `path = None` gives the defaults
/// (with overrides applied and validated). Every problem in the file and in
/// the overrides is returned at once.
pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
    let mut problems = Vec::new();
    let mut config = match path {
        None => Config::default(),
        Some(path) => {
            let mut found = Problems::new(path.display().to_string());
            let config = read_file(path, &mut found);
            // By key, so that the problems of one section read together.
            found.list.sort_by(|a, b| a.key.cmp(&b.key));
            problems.extend(found.list);
            config
        }
    };
    let mut found = Problems::new(COMMAND_LINE);
    apply_overrides(&mut config, overrides, &mut found);
    problems.extend(found.list);
    // The node's KubeletConfiguration, from the file's `kubelet.config` or
    // `--kubelet-config`; its problems are the kubelet file's, or filed
    // under the key that named it.
    let named_by = |flag: bool, flag_key: &'static str, file_key: &'static str| match (flag, &path) {
        (true, _) => (COMMAND_LINE.to_owned(), flag_key),
        (false, Some(path)) => (path.display().to_string(), file_key),
        (false, None) => (COMMAND_LINE.to_owned(), file_key),
    };
    // Each kubelet path with the file and key its problems are filed under.
    let source = |path: &Option<PathBuf>, flag: bool, flag_key: &'static str, file_key: &'static str| {
        path.clone().map(|p| {
            let (file, key) = named_by(flag, flag_key, file_key);
            (p, file, key)
        })
    };
    let main = source(
        &config.kubelet_config,
        overrides.kubelet_config.is_some(),
        "--kubelet-config",
        "kubelet.config",
    );
    let dir = source(
        &config.kubelet_config_dir,
        overrides.kubelet_config_dir.is_some(),
        "--kubelet-config-dir",
        "kubelet.config_dir",
    );
    let args = source(
        &config.kubelet_args_file,
        overrides.kubelet_args_file.is_some(),
        "--kubelet-args-file",
        "kubelet.args_file",
    );
    config.kubelet = KubeletView::assumed(config.gc.high_threshold_percent);
    if main.is_some() || dir.is_some() || args.is_some() {
        let mut found = Vec::new();
        let sources = kubelet::Sources {
            main: main.as_ref(),
            dir: dir.as_ref(),
            args: args.as_ref(),
        };
        kubelet::cross_check_kubelet(&mut config, &sources, &mut found);
        problems.extend(found);
    }
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError { problems })
    }
}

/// The problems found in one source, each tagged with its name.
struct Problems {
    file: String,
    list: Vec<Problem>,
}

impl Problems {
    fn new(file: impl Into<String>) -> Self {
        Problems {
            file: file.into(),
            list: Vec::new(),
        }
    }

    fn push(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.list.push(Problem {
            file: self.file.clone(),
            key: key.into(),
            message: message.into(),
        });
    }

    /// True when `key` already has a problem: rules that compare it with
    /// another key are then skipped rather than reported twice.
    fn has(&self, key: &str) -> bool {
        self.list.iter().any(|problem| problem.key == key)
    }
}

/// The most a configuration file may hold: far beyond any real one, and
/// small enough that a wrong path (a log, a device) costs nothing.
const MAX_CONFIG_BYTES: u64 = 4 * 1024 * 1024;

/// A configuration file's text: a regular file only (a FIFO or a device
/// such as /dev/zero is refused without blocking; links are followed, as a
/// mounted ConfigMap is one), at most [`MAX_CONFIG_BYTES`], UTF-8.
fn read_text(path: &Path) -> std::io::Result<String> {
    let bytes = crate::safe_file::read_bounded(path, crate::safe_file::Links::Follow, MAX_CONFIG_BYTES)?;
    String::from_utf8(bytes).map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "it is not UTF-8 text"))
}

/// The configuration in the file at `path`: its own schema, or a
/// KubeletConfiguration (the kubelet file `kubelet.config` names is read by
/// [`load`], once the command line has had its say).
fn read_file(path: &Path, problems: &mut Problems) -> Config {
    let unread = Config {
        source: Some(path.to_path_buf()),
        ..Config::default()
    };
    let text = match read_text(path) {
        Ok(text) => text,
        Err(err) => {
            problems.push("", format!("cannot read the file: {err}"));
            return unread;
        }
    };
    let Some(document) = parse::parse(parse::detect_format(path, &text), &text, problems) else {
        return unread;
    };
    let mut config = if document.get("kind").and_then(Value::as_str) == Some(kubelet::KUBELET_KIND) {
        kubelet::read_kubelet(document, problems)
    } else {
        let raw = raw::read_imagegc(document, problems);
        validate::build(raw, &validate::IMAGEGC_KEYS, problems)
    };
    config.source = Some(path.to_path_buf());
    config
}

/// The command-line flags, over whatever the file said.
fn apply_overrides(config: &mut Config, overrides: &Overrides, problems: &mut Problems) {
    if let Some(endpoint) = &overrides.runtime_endpoint {
        config.runtime.endpoint = validate::check_endpoint("--runtime-endpoint", endpoint, problems);
    }
    if let Some(dir) = &overrides.state_dir {
        validate::check_absolute("--state-dir", dir, problems);
        config.state.dir = dir.clone();
    }
    config.gc.dry_run |= overrides.dry_run;
    if let Some(path) = &overrides.kubelet_config
        && validate::check_absolute("--kubelet-config", path, problems)
    {
        config.kubelet_config = Some(path.clone());
    }
    if let Some(path) = &overrides.kubelet_config_dir
        && validate::check_absolute("--kubelet-config-dir", path, problems)
    {
        config.kubelet_config_dir = Some(path.clone());
    }
    if let Some(path) = &overrides.kubelet_args_file
        && validate::check_absolute("--kubelet-args-file", path, problems)
    {
        config.kubelet_args_file = Some(path.clone());
    }
    for (flag, on, key) in [
        ("--kubernetes", overrides.kubernetes, &mut config.kubernetes.enabled),
        (
            "--registry-manifests",
            overrides.registry_manifests,
            &mut config.kubernetes.registry_manifests,
        ),
    ] {
        if !on {
            continue;
        }
        if !cfg!(feature = "kubernetes") {
            problems.push(
                flag,
                "this imagegc was built without Kubernetes support (cargo feature `kubernetes`)",
            );
        }
        *key = true;
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::*;
    use super::*;

    #[test]
    fn every_default() {
        let config = load(None, &Overrides::default()).unwrap();
        assert_eq!(config, Config::default());
        assert_eq!(config.runtime.endpoint, None);
        assert_eq!(config.runtime.timeout, secs(120));
        assert_eq!(config.gc.interval, secs(300));
        assert_eq!(config.gc.usage_poll_interval, secs(30));
        // What every shipped configuration sets: below the kubelet's image GC
        // (85) and its default eviction line (85% usage).
        assert_eq!(config.gc.high_threshold_percent, 80);
        assert_eq!(config.gc.low_threshold_percent, 75);
        assert_eq!(config.gc.min_age, secs(120));
        assert_eq!(config.gc.max_age, Duration::ZERO);
        assert!(!config.gc.dry_run);
        assert_eq!(config.gc.image_fs_path, None);
        assert_eq!(config.gc.thrash_window, secs(3600));
        assert_eq!(config.gc.high_inodes_percent, None);
        assert_eq!(config.gc.low_inodes_percent, None);
        assert!(config.protect.images.is_empty());
        assert_eq!(config.protect.keep_recent_per_repository, 0);
        assert_eq!(config.state.dir, PathBuf::from("/var/lib/imagegc"));
        assert_eq!(config.metrics.listen, Some("127.0.0.1:9105".parse().unwrap()));
        assert_eq!(config.eviction_imagefs_available, None);
        assert_eq!(config.source, None);
        assert!(config.warnings.is_empty());
        assert!(!config.collection_disabled());
    }

    #[test]
    fn empty_files_give_the_defaults_and_remember_their_source() {
        for (name, text) in [
            ("a.toml", ""),
            ("b.yaml", ""),
            ("c.yaml", "# nothing here\n"),
            ("d", "\n"),
        ] {
            let config = load_ok(name, text);
            assert!(config.source.as_ref().unwrap().ends_with(name));
            assert_eq!(without_source(config), Config::default(), "{name}");
        }
    }

    #[test]
    fn every_key_is_read_from_toml() {
        let config = load_ok("imagegc.toml", EVERY_KEY_TOML);
        assert_eq!(config.runtime.endpoint.as_deref(), Some("unix:///run/crio/crio.sock"));
        assert_eq!(config.runtime.timeout, secs(30));
        assert_eq!(config.gc.interval, secs(600));
        assert_eq!(config.gc.usage_poll_interval, secs(60));
        assert_eq!(config.gc.high_threshold_percent, 70);
        assert_eq!(config.gc.low_threshold_percent, 50);
        assert_eq!(config.gc.min_age, secs(3600));
        assert_eq!(config.gc.max_age, secs(14 * 86_400));
        assert!(config.gc.dry_run);
        assert_eq!(config.gc.image_fs_path, Some(PathBuf::from("/var/lib/containers")));
        assert_eq!(config.gc.thrash_window, secs(7200));
        assert_eq!(config.gc.high_inodes_percent, Some(90));
        assert_eq!(config.gc.low_inodes_percent, Some(85));
        assert_eq!(config.protect.images, ["registry.k8s.io/pause:*", "sha256:abc*"]);
        assert_eq!(config.protect.keep_recent_per_repository, 2);
        assert_eq!(config.state.dir, PathBuf::from("/run/imagegc"));
        assert_eq!(config.metrics.listen, Some("0.0.0.0:9200".parse().unwrap()));
        assert!(config.warnings.is_empty());
    }

    #[test]
    fn the_same_schema_in_yaml_gives_the_same_config() {
        let toml = load_ok("imagegc.toml", EVERY_KEY_TOML);
        let yaml = load_ok("imagegc.yaml", EVERY_KEY_YAML);
        assert_eq!(without_source(yaml), without_source(toml));
    }

    #[test]
    fn flags_override_the_file() {
        let overrides = Overrides {
            runtime_endpoint: Some("unix:///run/other.sock".to_owned()),
            state_dir: Some(PathBuf::from("/tmp/state")),
            dry_run: true,
            ..Overrides::default()
        };
        let (_, config) = load_named("a.toml", EVERY_KEY_TOML, &overrides);
        let config = config.unwrap();
        assert_eq!(config.runtime.endpoint.as_deref(), Some("unix:///run/other.sock"));
        assert_eq!(config.state.dir, PathBuf::from("/tmp/state"));
        assert!(config.gc.dry_run);

        let no_dry_run = Overrides::default();
        let (_, config) = load_named("a.toml", EVERY_KEY_TOML, &no_dry_run);
        assert!(config.unwrap().gc.dry_run, "dry_run from the file stays on");

        let without_file = load(None, &overrides).unwrap();
        assert_eq!(without_file.runtime.endpoint.as_deref(), Some("unix:///run/other.sock"));
        assert!(without_file.gc.dry_run);
    }

    #[test]
    fn bad_flags_are_reported_with_the_file_problems() {
        let overrides = Overrides {
            runtime_endpoint: Some("tcp://10.0.0.1:1234".to_owned()),
            state_dir: Some(PathBuf::from("state")),
            dry_run: false,
            ..Overrides::default()
        };
        let (file, result) = load_named("a.toml", "[gc]\ninterval = \"0s\"\n", &overrides);
        let lines: Vec<String> = result.unwrap_err().problems.iter().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            [
                format!("{file}: gc.interval: must be at least 1s, got 0s"),
                "command line: --runtime-endpoint: only unix:// endpoints are supported, got \"tcp://10.0.0.1:1234\""
                    .to_owned(),
                "command line: --state-dir: must be an absolute path, got \"state\"".to_owned(),
            ]
        );
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let text = "[gc]\nhigh_threshold_percent = 101\nmin_age = \"soon\"\n[metrics]\nlisten = \"nowhere\"\n";
        let keys = problem_keys("a.toml", text);
        assert_eq!(keys, ["gc.high_threshold_percent", "gc.min_age", "metrics.listen"]);
    }

    #[test]
    fn the_effective_configuration_loads_back_equal() {
        let mut custom = load_ok("imagegc.toml", EVERY_KEY_TOML);
        custom.protect.images.push("quote \" and backslash \\".to_owned());
        custom.gc.min_age = Duration::from_millis(1500);
        custom.metrics.listen = Some("[::1]:9105".parse().unwrap());
        custom.kubernetes.registry_manifests = true;
        custom
            .kubernetes
            .registry_endpoints
            .insert("localhost:5001".to_owned(), "http://kind-registry:5000".to_owned());
        custom
            .kubernetes
            .registry_endpoints
            .insert("[fd00::1]:5000".to_owned(), "https://[fd00::1]:5443".to_owned());
        let mut off = Config::default();
        off.metrics.listen = None;
        for config in [Config::default(), without_source(custom), off] {
            let text = config.to_toml_string();
            let mut loaded = load_ok("effective.toml", &text);
            // The odd pattern is warned about (it can match no image); the
            // warnings are not part of the effective configuration.
            loaded.warnings.clear();
            assert_eq!(without_source(loaded), config, "{text}");
        }
    }

    #[test]
    fn an_unknown_order_is_named_with_the_orders_there_are() {
        let overrides = Overrides::default();
        let (file, result) = load_named("a.toml", "[gc]\norder = \"mru\"\n", &overrides);
        let problems: Vec<String> = result.unwrap_err().problems.iter().map(ToString::to_string).collect();
        assert_eq!(
            problems,
            [format!(
                "{file}: gc.order: must be \"auto\", \"lru\", \"superseded-first\" or \"reuse\", got \"mru\""
            )]
        );
        let (_, result) = load_named("b.toml", "[gc]\norder = \"superseded-first\"\n", &overrides);
        assert_eq!(result.unwrap().gc.order, Order::SupersededFirst);
        assert_eq!(Config::default().gc.order, Order::Reuse);
        let (_, result) = load_named("d.toml", "[gc]\norder = \"auto\"\n", &overrides);
        assert_eq!(result.unwrap().gc.order, Order::Auto);
        let (_, result) = load_named("c.toml", "[gc]\norder = \"reuse\"\n", &overrides);
        assert_eq!(result.unwrap().gc.order, Order::Reuse);
    }

    #[test]
    fn the_command_line_turns_kubernetes_and_registry_manifests_on_never_off() {
        let on = Overrides {
            kubernetes: true,
            registry_manifests: true,
            ..Overrides::default()
        };
        let (_, config) = load_named("a.toml", "", &on);
        let config = config.unwrap();
        assert!(config.kubernetes.enabled && config.kubernetes.registry_manifests);
        let file = "[kubernetes]\nenabled = true\nregistry_manifests = true\n";
        let (_, config) = load_named("b.toml", file, &Overrides::default());
        let config = config.unwrap();
        assert!(config.kubernetes.enabled && config.kubernetes.registry_manifests);
    }

    #[test]
    fn the_effective_configuration_names_every_key() {
        let text = Config::default().to_toml_string();
        let table: toml::Table = toml::from_str(&text).unwrap();
        let mut keys = Vec::new();
        for (section, value) in &table {
            for key in value.as_table().unwrap().keys() {
                keys.push(format!("{section}.{key}"));
            }
        }
        assert_eq!(keys.len(), 34, "{keys:?}");
        assert!(text.contains("container_events = false\n"));
        assert!(text.contains("sandbox_image = \"\"\n"));
        assert!(text.contains("endpoint = \"\"\n"));
        assert!(text.contains("max_age = \"0s\"\n"));
        assert!(text.contains("high_inodes_percent = 0\n"));
        assert!(text.contains("listen = \"127.0.0.1:9105\"\n"));
        assert!(text.contains("headroom = false\n"));
        assert!(text.contains("room_before_pulls = true\n"));
    }

    #[test]
    fn a_kubelet_configuration_prints_in_imagegc_schema() {
        let config = load_ok("config.yaml", KUBELET_FILE);
        let loaded = load_ok("effective.toml", &config.to_toml_string());
        assert_eq!(loaded.gc, config.gc);
    }

    fn example(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("config").join(name)
    }

    #[test]
    fn the_example_imagegc_toml_holds_the_defaults() {
        let path = example("imagegc.toml");
        let config = load(Some(&path), &Overrides::default()).unwrap();
        assert_eq!(config.source.as_deref(), Some(path.as_path()));
        assert_eq!(without_source(config), Config::default());
    }

    #[test]
    fn the_example_kubelet_config_loads() {
        let path = example("kubelet-config.yaml");
        let config = load(Some(&path), &Overrides::default()).unwrap();
        assert_eq!(config.gc.high_threshold_percent, 85);
        assert_eq!(config.gc.low_threshold_percent, 80);
        assert_eq!(
            config.eviction_imagefs_available,
            Some(EvictionThreshold::Percent(10.0))
        );
        assert_eq!(
            config.warnings.len(),
            1,
            "only the kubelet still collecting: {:?}",
            config.warnings
        );
    }

    /// A KubeletConfiguration read as the kubelet reads it: without its
    /// thresholds it means the kubelet's defaults, 85/80, not imagegc's.
    #[test]
    fn a_kubelet_configuration_without_thresholds_means_the_kubelets_defaults() {
        let config = load_ok("kubelet.yaml", &kubelet("imageMinimumGCAge: 5m\n"));
        assert_eq!(
            (config.gc.high_threshold_percent, config.gc.low_threshold_percent),
            (85, 80)
        );
        let only_high = load_ok("kubelet.yaml", &kubelet("imageGCHighThresholdPercent: 90\n"));
        assert_eq!(only_high.gc.low_threshold_percent, 80);
        let ours = load_ok("imagegc.yaml", "gc:\n  min_age: 5m\n");
        assert_eq!(
            (ours.gc.high_threshold_percent, ours.gc.low_threshold_percent),
            (80, 75)
        );
    }
}

/// README's table of configuration keys is the schema's: a key the
/// configuration has and README does not name, or the other way round,
/// fails here.
#[cfg(test)]
mod reference {
    use super::Config;

    #[test]
    fn readme_documents_every_configuration_key_and_no_other() {
        let schema: toml::Table = toml::from_str(&Config::default().to_toml_string()).unwrap();
        let keys: std::collections::BTreeSet<String> = schema
            .iter()
            .flat_map(|(section, table)| {
                table
                    .as_table()
                    .into_iter()
                    .flat_map(move |t| t.keys().map(move |key| format!("{section}.{key}")))
            })
            .collect();
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
        let documented: std::collections::BTreeSet<String> = crate::testing::readme_table_names(&readme)
            .into_iter()
            .filter(|key| key.contains('.') && keys.iter().any(|k| k.split('.').next() == key.split('.').next()))
            .collect();
        let undocumented: Vec<&String> = keys.difference(&documented).collect();
        let unknown: Vec<&String> = documented.difference(&keys).collect();
        assert!(
            undocumented.is_empty() && unknown.is_empty(),
            "README's configuration table lacks {undocumented:?} and names {unknown:?}, which the configuration does not have"
        );
    }
}
