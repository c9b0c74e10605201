//! The registry every metric imagegc exports is registered in
//! ([`Metrics`]), and its encoding for `/metrics` (OpenMetrics, or the
//! classic text format).
//!
//! Each sink registers and updates its own families (`engine::sinks`: a
//! group of families is a [`Families`], registered once per registry),
//! so a metric's name, unit, help text and label values live beside the
//! events that set it. Label values come only from small closed enums,
//! never from image names or any other data a user or the runtime
//! controls, so the number of series is fixed. The Kubernetes families
//! are still registered here and set by the `kubernetes` module.
//!
//! This module does no IO and serves nothing; `http` encodes it on scrape.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub use crate::model::Reason;

impl EncodeLabelValue for Reason {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// A Kubernetes event imagegc posts on its Node (see
/// `crate::kubernetes`): the reason, a closed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeEventReason {
    /// Images cannot bring usage to the low threshold (the kubelet's
    /// reason for the same).
    FreeDiskSpaceFailed,
    /// Cycles fail (the kubelet's reason for a failed image GC).
    ImageGCFailed,
    /// Images imagegc removed are pulled again within the thrash window.
    ImageRepullThrash,
    /// No source names the runtime's sandbox image, or the configured one
    /// matches no image.
    SandboxImageUnknown,
    /// Someone else (the kubelet's image GC, another collector) removes
    /// images imagegc did not ask to remove.
    ImagesRemovedByOthers,
}

impl NodeEventReason {
    /// Every reason, in a fixed order.
    pub const ALL: [NodeEventReason; 5] = [
        NodeEventReason::FreeDiskSpaceFailed,
        NodeEventReason::ImageGCFailed,
        NodeEventReason::ImageRepullThrash,
        NodeEventReason::SandboxImageUnknown,
        NodeEventReason::ImagesRemovedByOthers,
    ];

    /// The event's `reason`, as `kubectl get events` shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeEventReason::FreeDiskSpaceFailed => "FreeDiskSpaceFailed",
            NodeEventReason::ImageGCFailed => "ImageGCFailed",
            NodeEventReason::ImageRepullThrash => "ImageRepullThrash",
            NodeEventReason::SandboxImageUnknown => "SandboxImageUnknown",
            NodeEventReason::ImagesRemovedByOthers => "ImagesRemovedByOthers",
        }
    }
}

impl EncodeLabelValue for NodeEventReason {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// What became of a node event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeEventResult {
    /// Created, or an earlier one of the same reason updated.
    Posted,
    /// The API server refused it or did not answer.
    Failed,
    /// Not sent: the queue to the poster was full.
    Dropped,
}

impl EncodeLabelValue for NodeEventResult {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(match self {
            NodeEventResult::Posted => "posted",
            NodeEventResult::Failed => "failed",
            NodeEventResult::Dropped => "dropped",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct NodeEventLabels {
    reason: NodeEventReason,
    result: NodeEventResult,
}

/// What imagegc knows of the cluster (`[kubernetes]`); zero when off.
#[derive(Debug)]
struct KubernetesFamilies {
    watch_enabled: Gauge,
    watch_up: Gauge,
    pods: Gauge,
    pods_stale: Gauge,
    node_found: Gauge,
    node_events: Family<NodeEventLabels, Counter>,
}

impl Families for KubernetesFamilies {
    fn register(registry: &mut Registry) -> Self {
        let watch_enabled = Gauge::default();
        registry.register(
            "imagegc_kubernetes_pods_watch_enabled",
            "1 when this imagegc watches the pods bound to its node ([kubernetes] with protect_pods), \
             0 otherwise: imagegc_kubernetes_pods_watch_up and imagegc_kubernetes_pods_stale mean \
             something only then",
            watch_enabled.clone(),
        );
        let watch_up = Gauge::default();
        registry.register(
            "imagegc_kubernetes_pods_watch_up",
            "1 while the watch of the pods bound to this node is listed and current, 0 while the API \
             server cannot be watched (or [kubernetes] is off)",
            watch_up.clone(),
        );
        let pods = Gauge::default();
        registry.register(
            "imagegc_kubernetes_pods",
            "Pods bound to this node whose images are kept with reason pod",
            pods.clone(),
        );
        let pods_stale = Gauge::default();
        registry.register(
            "imagegc_kubernetes_pods_stale",
            "1 when the last known pods were dropped after kubernetes.pods_stale_after without a watch: \
             only the runtime's containers protect images until the watch returns",
            pods_stale.clone(),
        );
        let node_found = Gauge::default();
        registry.register(
            "imagegc_kubernetes_node_found",
            "1 once kubernetes.node_name is confirmed as this node's name (its Node exists and, in a pod, \
             imagegc's own pod is among the pods listed for it); 0 when it is not, not yet known, or \
             [kubernetes] is off",
            node_found.clone(),
        );
        let node_events = Family::<NodeEventLabels, Counter>::default();
        registry.register(
            "imagegc_kubernetes_node_events",
            "Events on this node's Node object, by reason and result",
            node_events.clone(),
        );
        for reason in NodeEventReason::ALL {
            for result in [
                NodeEventResult::Posted,
                NodeEventResult::Failed,
                NodeEventResult::Dropped,
            ] {
                let _ = node_events.get_or_create(&NodeEventLabels { reason, result });
            }
        }
        KubernetesFamilies {
            watch_enabled,
            watch_up,
            pods,
            pods_stale,
            node_found,
            node_events,
        }
    }
}

/// The one registry every sink registers its metric families in, and
/// what `/metrics` encodes. Share it as `Arc<Metrics>`; every method takes
/// `&self`.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    /// Each group registered, by its type: registered once, on first use.
    groups: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

/// A group of metric families a sink registers and updates (its names,
/// units, help texts and label sets), registered once per registry
/// whichever sink asks first ([`Metrics::families`]).
pub trait Families: Send + Sync + 'static {
    /// Registers the group's families in `registry`, with the series known
    /// in advance at zero, so that `rate()` and absence alerts work before
    /// the first event.
    fn register(registry: &mut Registry) -> Self;
}

impl Metrics {
    /// A registry with the Kubernetes families in it (at zero when
    /// `[kubernetes]` is off); each sink registers its own (see
    /// `engine::sinks::register_every_family`).
    pub fn new() -> Metrics {
        let metrics = Metrics {
            registry: Mutex::new(Registry::default()),
            groups: Mutex::new(HashMap::new()),
        };
        let _ = metrics.families::<KubernetesFamilies>();
        metrics
    }

    /// The group `F`, registered on the first call: every later call, from
    /// any sink, gets the same families.
    pub fn families<F: Families>(&self) -> Arc<F> {
        let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        let group = groups.entry(TypeId::of::<F>()).or_insert_with(|| {
            let mut registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::new(F::register(&mut registry))
        });
        match Arc::clone(group).downcast::<F>() {
            Ok(group) => group,
            Err(_) => unreachable!("a group is kept under its own type"),
        }
    }

    /// Whether `kubernetes.node_name` is confirmed as this node's name.
    pub fn set_node_found(&self, found: bool) {
        self.families::<KubernetesFamilies>().node_found.set(i64::from(found));
    }

    /// The watch of this node's pods runs (set once, when it starts).
    pub fn set_pods_watch_enabled(&self) {
        self.families::<KubernetesFamilies>().watch_enabled.set(1);
    }

    /// The watch of this node's pods: whether it is current, how many pods
    /// it holds, and whether they were dropped as stale.
    pub fn set_pods_watch(&self, up: bool, pods: usize, stale: bool) {
        let k = self.families::<KubernetesFamilies>();
        k.watch_up.set(i64::from(up));
        k.pods.set(i64::try_from(pods).unwrap_or(i64::MAX));
        k.pods_stale.set(i64::from(stale));
    }

    /// A node event was posted, failed, or was dropped.
    pub fn node_event(&self, reason: NodeEventReason, result: NodeEventResult) {
        self.families::<KubernetesFamilies>()
            .node_events
            .get_or_create(&NodeEventLabels { reason, result })
            .inc();
    }

    /// The whole exposition in the OpenMetrics text format, `# EOF` included. Serve
    /// it with [`OPENMETRICS_CONTENT_TYPE`].
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail and every label value is a fixed
        // string, so an error here would be a bug in the encoder, not a state to
        // serve around.
        if let Err(error) = prometheus_client::encoding::text::encode(
            &mut out,
            &self.registry.lock().unwrap_or_else(PoisonError::into_inner),
        ) {
            tracing::error!(%error, "encoding metrics failed");
        }
        out
    }

    /// The whole exposition in Prometheus's classic text format 0.0.4, for
    /// clients that do not ask for OpenMetrics. Serve it with
    /// [`CLASSIC_CONTENT_TYPE`].
    pub fn encode_classic(&self) -> String {
        openmetrics_to_classic(&self.encode())
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Seconds since the Unix epoch, by the wall clock (this is what dashboards
/// compare with `time()`); 0 if the clock is before 1970. The one wall-clock
/// read of the metrics: the engine, which decides what is old, reads none.
#[expect(
    clippy::disallowed_methods,
    reason = "the last-success timestamp dashboards compare with time()"
)]
pub fn unix_now_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}

/// The content type of [`Metrics::encode`]'s output.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The content type of [`Metrics::encode_classic`]'s output: Prometheus's
/// classic text format.
pub const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Rewrites an OpenMetrics exposition in the classic text format 0.0.4: the
/// same samples, with the metadata of a counter under its `_total` name (the
/// name its samples carry), no `# UNIT` lines (the classic format has none)
/// and no `# EOF`. HELP texts are unescaped from OpenMetrics (`\"`) to the
/// classic escaping, which knows only `\\` and `\n`.
fn openmetrics_to_classic(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let metadata = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|prefix| line.strip_prefix(prefix).map(|rest| (prefix, rest)));
        match metadata {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let suffix = if counters.contains(name) { "_total" } else { "" };
                let tail = if prefix == "# HELP " {
                    tail.replace("\\\"", "\"")
                } else {
                    tail.to_owned()
                };
                let _ = writeln!(out, "{prefix}{name}{suffix} {tail}");
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_label_values_are_lowercase() {
        assert_eq!(Reason::Age.as_str(), "age");
        assert_eq!(Reason::Space.as_str(), "space");
    }
}
