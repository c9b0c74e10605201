//! What imagegc knows of the cluster (`[kubernetes]`), as metrics: the
//! pod watch, the node's name, the events posted on the Node. The
//! `kubernetes` module measures them and sets them here; the families are
//! registered whether or not it is compiled in or configured (at zero when
//! off).

use std::fmt::Write as _;
use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::outputs::metrics::{Families, Metrics};

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

/// The Kubernetes families, set by the pod watch, the node's check and
/// the Node's event poster.
#[derive(Debug, Clone)]
pub struct KubernetesMetrics {
    families: Arc<KubernetesFamilies>,
}

impl KubernetesMetrics {
    /// Sets its families in `metrics` (registering them there if no one
    /// has yet).
    pub fn new(metrics: &Metrics) -> Self {
        KubernetesMetrics {
            families: metrics.families(),
        }
    }

    /// Whether `kubernetes.node_name` is confirmed as this node's name.
    pub fn set_node_found(&self, found: bool) {
        self.families.node_found.set(i64::from(found));
    }

    /// The watch of this node's pods runs (set once, when it starts).
    pub fn set_pods_watch_enabled(&self) {
        self.families.watch_enabled.set(1);
    }

    /// The watch of this node's pods: whether it is current, how many pods
    /// it holds, and whether they were dropped as stale.
    pub fn set_pods_watch(&self, up: bool, pods: usize, stale: bool) {
        let k = &self.families;
        k.watch_up.set(i64::from(up));
        k.pods.set(i64::try_from(pods).unwrap_or(i64::MAX));
        k.pods_stale.set(i64::from(stale));
    }

    /// A node event was posted, failed, or was dropped.
    pub fn node_event(&self, reason: NodeEventReason, result: NodeEventResult) {
        self.families
            .node_events
            .get_or_create(&NodeEventLabels { reason, result })
            .inc();
    }
}
