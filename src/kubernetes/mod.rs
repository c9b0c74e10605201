//! What imagegc reads from and tells the cluster (`[kubernetes]`, off unless
//! enabled: imagegc is otherwise a pure CRI agent).
//!
//! - [`pods`]: the pods bound to this node, watched; the images they name
//!   are kept (reason `pod`), through the engine's protections input.
//! - [`node_events`]: events on this node's Node object, through the
//!   engine's event sinks.
//!
//! The cycle never waits on the API server: the watch and the event poster
//! run in tasks of their own and hand over what they have.

#[cfg(test)]
mod fake_api;
pub mod node_events;
pub mod pods;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config as ClientConfig};
use tokio_util::sync::CancellationToken;

use crate::config::{ConfigError, KubernetesConfig, Problem};
use crate::metrics::Metrics;

pub use node_events::NodeEventSink;
pub use pods::PodWatch;

/// How long connecting to the API server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A client of the API server for this node.
pub struct Cluster {
    client: Client,
    node: String,
    config: KubernetesConfig,
}

/// What a started [`Cluster`] hands the engine.
pub struct Started {
    /// The pods' keep rules, when `protect_pods` is on.
    pub pods: Option<PodWatch>,
    /// The node events' sink, when `node_events` is on.
    pub events: Option<NodeEventSink>,
}

impl Cluster {
    /// The node's name and credentials, from `config` and the environment:
    /// `kubernetes.node_name` or `NODE_NAME`; `kubernetes.kubeconfig` or the
    /// pod's service account. What is missing or unreadable is a
    /// configuration problem, named by its key.
    pub async fn connect(config: &KubernetesConfig, file: &str) -> Result<Cluster, ConfigError> {
        let problem = |key: &str, message: String| ConfigError {
            problems: vec![Problem {
                file: file.to_owned(),
                key: key.to_owned(),
                message,
            }],
        };
        let node = config
            .node_name
            .clone()
            .or_else(|| {
                std::env::var("NODE_NAME")
                    .ok()
                    .map(|n| n.trim().to_owned())
                    .filter(|n| !n.is_empty())
            })
            .ok_or_else(|| {
                problem(
                    "kubernetes.node_name",
                    "not set, and NODE_NAME is empty: set it, or NODE_NAME from the pod's spec.nodeName".to_owned(),
                )
            })?;
        let client_config = match &config.kubeconfig {
            Some(path) => from_kubeconfig(path)
                .await
                .map_err(|err| problem("kubernetes.kubeconfig", format!("{}: {err}", path.display())))?,
            None => ClientConfig::incluster().map_err(|err| {
                problem(
                    "kubernetes.kubeconfig",
                    format!(
                        "not set, and this is not a pod with a service account token ({err}): set it on a node \
                         outside the cluster's pods, or give the pod a token (automountServiceAccountToken)"
                    ),
                )
            })?,
        };
        let client = client(client_config)
            .map_err(|err| problem("kubernetes.kubeconfig", format!("cannot make a client: {err}")))?;
        Ok(Cluster {
            client,
            node,
            config: config.clone(),
        })
    }

    /// The node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The pods bound to this node now, listed once (`once`, `plan`), as
    /// keep rules; `None` when `protect_pods` is off.
    pub async fn list_pods(&self) -> Result<Option<crate::policy::Protections>, kube::Error> {
        if !self.config.protect_pods {
            return Ok(None);
        }
        pods::list(self.client.clone(), &self.node).await.map(Some)
    }

    /// Starts the pod watch and the event poster (each when configured),
    /// until `shutdown`.
    pub fn start(self, metrics: &Arc<Metrics>, shutdown: &CancellationToken) -> Started {
        let pods = self.config.protect_pods.then(|| {
            pods::spawn(
                self.client.clone(),
                &self.node,
                self.config.pods_stale_after,
                Arc::clone(metrics),
                shutdown.clone(),
            )
        });
        let events = self
            .config
            .node_events
            .then(|| node_events::spawn(self.client, &self.node, Arc::clone(metrics), shutdown.clone()));
        Started { pods, events }
    }
}

/// A client as imagegc uses one. Connecting gives up after
/// [`CONNECT_TIMEOUT`], and a request the API server refuses (429, 503, 504)
/// fails at once instead of being retried inside the client: the watch and
/// the event poster back off on their own, and the client's retries (up to
/// 15, their delays doubling) would hold the watch down long after the API
/// server is back.
pub(crate) fn client(mut config: ClientConfig) -> Result<Client, kube::Error> {
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.default_retry = false;
    Client::try_from(config)
}

async fn from_kubeconfig(path: &Path) -> Result<ClientConfig, String> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|err| err.to_string())?;
    ClientConfig::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|err| err.to_string())
}
