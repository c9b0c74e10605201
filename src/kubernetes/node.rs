//! Whether `kubernetes.node_name` is this node's name.
//!
//! A wrong name (a host name where the Node is `node-1.ec2.internal`) fails
//! silently otherwise: no pod is bound to a node of that name, so none is
//! protected, and events name a Node that does not exist. Two signs, each
//! enough: the API server has no Node of that name (`get` on nodes), and,
//! in a pod (`POD_NAME`, `POD_NAMESPACE` from the downward API), imagegc's
//! own pod is not among the pods listed for the node. `plan`, `once` and
//! `check-config` print what they find; the daemon logs it once and sets
//! `imagegc_kubernetes_node_found`. Nothing else changes: a wrong name stops
//! nothing, as a missing Node may also be one being registered.

use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};

/// What the API server says of the Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeLookup {
    /// A Node of that name exists.
    Found,
    /// No Node has that name.
    Missing,
    /// Could not be asked (why).
    Unchecked(String),
}

/// Whether imagegc's own pod is among the pods listed for the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnPod {
    /// It is.
    Listed,
    /// It is not: `pod` (`namespace/name`), among `listed` pods.
    NotListed {
        /// imagegc's pod.
        pod: String,
        /// How many pods were listed for the node.
        listed: usize,
    },
    /// Not in a pod, or the pods were not listed.
    Unchecked,
}

/// imagegc's own pod, `namespace/name`, from the downward API's
/// `POD_NAMESPACE` and `POD_NAME`; `None` outside a pod (or a pod without
/// them).
pub fn own_pod_from_env() -> Option<String> {
    let var = |name| {
        std::env::var(name)
            .ok()
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    Some(format!("{}/{}", var("POD_NAMESPACE")?, var("POD_NAME")?))
}

/// Asks the API server for the Node named `node`. Forbidden (an install
/// without `get` on nodes) is [`NodeLookup::Unchecked`]; other failures are
/// errors, for the caller to retry or report.
pub async fn lookup(client: Client, node: &str) -> Result<NodeLookup, kube::Error> {
    match Api::<Node>::all(client).get_opt(node).await {
        Ok(Some(_)) => Ok(NodeLookup::Found),
        Ok(None) => Ok(NodeLookup::Missing),
        Err(kube::Error::Api(status)) if status.code == 403 => Ok(NodeLookup::Unchecked(format!(
            "forbidden: grant get on nodes ({})",
            status.message
        ))),
        Err(err) => Err(err),
    }
}

/// Whether `own` is among `listed` (pod keys, `namespace/name`).
pub fn own_pod<'a>(own: Option<&str>, mut listed: impl ExactSizeIterator<Item = &'a str>) -> OwnPod {
    let Some(own) = own else {
        return OwnPod::Unchecked;
    };
    let count = listed.len();
    if listed.any(|pod| pod == own) {
        OwnPod::Listed
    } else {
        OwnPod::NotListed {
            pod: own.to_owned(),
            listed: count,
        }
    }
}

/// What is known of the node's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The Node's lookup.
    pub node: NodeLookup,
    /// The own pod's check.
    pub own_pod: OwnPod,
}

impl Verdict {
    /// Whether the name is confirmed: a sign for it and none against it
    /// (`imagegc_kubernetes_node_found`).
    pub fn found(&self) -> bool {
        let against = self.node == NodeLookup::Missing || matches!(self.own_pod, OwnPod::NotListed { .. });
        let for_it = self.node == NodeLookup::Found || self.own_pod == OwnPod::Listed;
        for_it && !against
    }

    /// What to tell a person about `node`, one line each: empty when the
    /// name is confirmed.
    pub fn warnings(&self, node: &str) -> Vec<String> {
        let mut warnings = Vec::new();
        match &self.node {
            NodeLookup::Missing => warnings.push(format!(
                "the API server has no Node named {node:?}: kubernetes.node_name (or NODE_NAME) is not this node's \
                 name, so no pod is found bound to it (their images are not kept for them) and node events name \
                 a Node that does not exist; set it to the Node's name (kubectl get nodes), in a DaemonSet from \
                 the pod's spec.nodeName"
            )),
            NodeLookup::Unchecked(why) if self.own_pod != OwnPod::Listed => {
                warnings.push(format!("cannot check that a Node named {node:?} exists: {why}"));
            }
            NodeLookup::Found | NodeLookup::Unchecked(_) => {}
        }
        if let OwnPod::NotListed { pod, listed } = &self.own_pod {
            warnings.push(format!(
                "imagegc's own pod {pod} is not among the {listed} pods bound to node {node:?}: \
                 kubernetes.node_name (or NODE_NAME) is not the name of the node imagegc runs on, and the pods \
                 whose images it keeps are another node's, or none"
            ));
        }
        warnings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(node: NodeLookup, own_pod: OwnPod) -> Verdict {
        Verdict { node, own_pod }
    }

    #[test]
    fn a_name_is_confirmed_by_one_sign_and_refuted_by_any() {
        let not_listed = || OwnPod::NotListed {
            pod: "imagegc/imagegc-x".to_owned(),
            listed: 0,
        };
        let unchecked = || NodeLookup::Unchecked("forbidden".to_owned());
        let cases = [
            (NodeLookup::Found, OwnPod::Listed, true, 0),
            (NodeLookup::Found, OwnPod::Unchecked, true, 0),
            (unchecked(), OwnPod::Listed, true, 0),
            (NodeLookup::Missing, OwnPod::Unchecked, false, 1),
            (NodeLookup::Missing, not_listed(), false, 2),
            (NodeLookup::Found, not_listed(), false, 1),
            (unchecked(), OwnPod::Unchecked, false, 1),
            (unchecked(), not_listed(), false, 2),
        ];
        for (node, own, found, warnings) in cases {
            let v = verdict(node, own);
            assert_eq!(v.found(), found, "{v:?}");
            assert_eq!(v.warnings("node-1").len(), warnings, "{v:?}");
        }
    }

    #[test]
    fn the_own_pod_is_looked_for_by_namespace_and_name() {
        let listed = ["kube-system/kube-proxy-a", "imagegc/imagegc-x"];
        assert_eq!(own_pod(Some("imagegc/imagegc-x"), listed.into_iter()), OwnPod::Listed);
        assert_eq!(
            own_pod(Some("other/imagegc-x"), listed.into_iter()),
            OwnPod::NotListed {
                pod: "other/imagegc-x".to_owned(),
                listed: 2
            }
        );
        assert_eq!(own_pod(None, listed.into_iter()), OwnPod::Unchecked);
    }
}
