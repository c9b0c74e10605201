//! What imagegc reads from and tells the cluster (`[kubernetes]`, off unless
//! enabled: imagegc is otherwise a pure CRI agent).
//!
//! - [`pods`]: the pods bound to this node, watched; the images they name
//!   are kept (reason `pod`), through the engine's protections input.
//! - [`node_events`]: events on this node's Node object, through the
//!   engine's event sinks.
//! - [`node`]: whether `kubernetes.node_name` is this node's name (its Node
//!   exists; imagegc's own pod is among the node's pods), said once.
//!
//! The cycle never waits on the API server: the watch and the event poster
//! run in tasks of their own and hand over what they have.
//!
//! Every call is bounded: the API server must answer each request (its
//! status line and headers) within [`REQUEST_TIMEOUT`], and no read from
//! its connection waits longer than [`READ_TIMEOUT`], which is longer than
//! a quiet watch legitimately stays open ([`WATCH_TIMEOUT`], the
//! `timeoutSeconds` the watch asks for). An API server that accepts and
//! never answers costs `plan` and `once` at most [`REQUEST_TIMEOUT`], and the
//! daemon's watch a relisting (see [`pods`]).

#[cfg(test)]
pub(crate) mod fake_api;
pub mod node;
pub mod node_events;
pub mod pods;
pub mod registry;

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config as ClientConfig};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::{ConfigError, KubernetesConfig, Problem};
use crate::engine::sinks::KubernetesMetrics;

pub use node_events::NodeEventSink;
pub use pods::PodWatch;

/// How long connecting to the API server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the API server may take to answer one request (its status and
/// headers; a listing, its body too), and `plan`, `once` and `check-config`
/// all their calls together. The API server gives up on a request after
/// 60 s itself (`--request-timeout`); one node's pods answer in well under
/// a second.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the API server holds a watch open before it ends it
/// (`timeoutSeconds`; kube's default, made explicit here because
/// [`READ_TIMEOUT`] must exceed it). The watch is then resumed from where it
/// was, without a relisting.
pub const WATCH_TIMEOUT: Duration = Duration::from_secs(290);

/// The longest any read from the API server's connection may wait: past a
/// quiet watch's [`WATCH_TIMEOUT`] (the API server ends it then, which is a
/// read), with room to spare. A connection that goes silent for longer is
/// dead: the call fails and is made again on a new one.
const READ_TIMEOUT: Duration = Duration::from_secs(WATCH_TIMEOUT.as_secs() + 30);

/// A client of the API server for this node.
pub struct Cluster {
    client: Client,
    node: String,
    /// The API server's URL, for messages.
    server: String,
    /// imagegc's own pod (`namespace/name`), in a pod.
    own_pod: Option<String>,
    config: KubernetesConfig,
}

/// What `plan`, `once` and `check-config` learn from the API server.
pub struct Survey {
    /// The keep rules of the pods bound to this node; `None` when
    /// `protect_pods` is off.
    pub pods: Option<crate::policy::Protections>,
    /// What a person must know: the node's name is wrong, or could not be
    /// checked (see [`node`]).
    pub warnings: Vec<String>,
}

/// A call to the API server that failed, naming the API server.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No answer within the bound ([`REQUEST_TIMEOUT`]).
    #[error("the API server at {server} did not answer within {}", humantime::format_duration(*within))]
    NoAnswer {
        /// The API server's URL.
        server: String,
        /// How long it was given.
        within: Duration,
    },
    /// An answer that is an error, or no connection.
    #[error("the API server at {server}: {error}")]
    Failed {
        /// The API server's URL.
        server: String,
        /// What the client says.
        error: kube::Error,
    },
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
        let server = client_config.cluster_url.to_string();
        let client = client(client_config)
            .map_err(|err| problem("kubernetes.kubeconfig", format!("cannot make a client: {err}")))?;
        Ok(Cluster {
            client,
            node,
            server,
            own_pod: node::own_pod_from_env(),
            config: config.clone(),
        })
    }

    /// The node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The pods bound to this node now, listed once, and whether the
    /// node's name is right (`once`, `plan`, `check-config`): the Node
    /// looked up and the pods listed side by side, each given up after
    /// [`REQUEST_TIMEOUT`]. A listing that fails is the error; a lookup
    /// that fails, a warning.
    pub async fn survey(&self) -> Result<Survey, ApiError> {
        let pods = async {
            if self.config.protect_pods {
                bounded(&self.server, pods::list(self.client.clone(), &self.node))
                    .await
                    .map(Some)
            } else {
                Ok(None)
            }
        };
        let lookup = bounded(&self.server, node::lookup(self.client.clone(), &self.node));
        let (pods, lookup) = tokio::join!(pods, lookup);
        let pods = pods?;
        let verdict = node::Verdict {
            node: lookup.unwrap_or_else(|err| node::NodeLookup::Unchecked(err.to_string())),
            own_pod: match &pods {
                Some(pods) => node::own_pod(self.own_pod.as_deref(), pods.keys()),
                None => node::OwnPod::Unchecked,
            },
        };
        Ok(Survey {
            pods: pods.map(|pods| pods.protections()),
            warnings: verdict.warnings(&self.node),
        })
    }

    /// Starts the pod watch and the event poster (each when configured),
    /// until `shutdown`.
    pub fn start(self, metrics: &KubernetesMetrics, shutdown: &CancellationToken) -> Started {
        let pods = self.config.protect_pods.then(|| {
            pods::spawn(
                self.client.clone(),
                &self.node,
                self.config.pods_stale_after,
                metrics.clone(),
                shutdown.clone(),
            )
        });
        tokio::spawn(check_node(
            self.client.clone(),
            self.node.clone(),
            self.server.clone(),
            self.own_pod.clone(),
            pods.as_ref().map(|pods| pods.listed.clone()),
            metrics.clone(),
            shutdown.clone(),
        ));
        let events = self
            .config
            .node_events
            .then(|| node_events::spawn(self.client, &self.node, metrics.clone(), shutdown.clone()));
        Started { pods, events }
    }
}

/// `call`, given up after [`REQUEST_TIMEOUT`], its error naming the API
/// server.
async fn bounded<T>(server: &str, call: impl Future<Output = Result<T, kube::Error>>) -> Result<T, ApiError> {
    let no_answer = || ApiError::NoAnswer {
        server: server.to_owned(),
        within: REQUEST_TIMEOUT,
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, call).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(kube::Error::Service(err))) if err.is::<answer::NoAnswer>() => Err(no_answer()),
        Ok(Err(error)) => Err(ApiError::Failed {
            server: server.to_owned(),
            error,
        }),
        Err(_) => Err(no_answer()),
    }
}

/// The longest wait between two lookups of the Node while the API server
/// cannot answer.
const NODE_LOOKUP_RETRY_MAX: Duration = Duration::from_secs(60);

/// The daemon's check of the node's name (see [`node`]), once: the Node
/// looked up (again, with a doubling delay, until the API server answers),
/// then, in a pod, its own pod looked for in the watch's first listing.
/// Says what it finds once, and sets `imagegc_kubernetes_node_found`.
/// Returns what it found; `None` on shutdown.
async fn check_node(
    client: Client,
    node: String,
    server: String,
    own_pod: Option<String>,
    listed: Option<tokio::sync::watch::Receiver<Option<Vec<String>>>>,
    metrics: KubernetesMetrics,
    shutdown: CancellationToken,
) -> Option<node::Verdict> {
    let mut delay = Duration::from_secs(1);
    let lookup = loop {
        let error = tokio::select! {
            () = shutdown.cancelled() => return None,
            lookup = bounded(&server, node::lookup(client.clone(), &node)) => match lookup {
                Ok(lookup) => break lookup,
                Err(err) => err,
            },
        };
        debug!(node, error = %error, "cannot look up this node's Node yet");
        tokio::select! {
            () = shutdown.cancelled() => return None,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(NODE_LOOKUP_RETRY_MAX);
    };
    let own_pod = match (own_pod.as_deref(), listed) {
        (Some(own), Some(mut listed)) => tokio::select! {
            () = shutdown.cancelled() => return None,
            first = listed.wait_for(Option::is_some) => match first {
                Ok(pods) => node::own_pod(
                    Some(own),
                    pods.as_deref().unwrap_or_default().iter().map(String::as_str),
                ),
                Err(_) => return None,
            },
        },
        _ => node::OwnPod::Unchecked,
    };
    let verdict = node::Verdict { node: lookup, own_pod };
    metrics.set_node_found(verdict.found());
    let warnings = verdict.warnings(&node);
    if warnings.is_empty() {
        info!(node, "this node's Node found: kubernetes.node_name is right");
    }
    for warning in warnings {
        warn!(node, "{warning}");
    }
    Some(verdict)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outputs::metrics::Metrics;
    use fake_api::cluster::FakeApi;
    use std::sync::Arc;

    /// The fake API server, with Node `node-1` and its pod `default/p0`
    /// (image `web:1`).
    async fn api() -> (Arc<FakeApi>, String) {
        let api = Arc::new(FakeApi::default());
        api.nodes.lock().unwrap().push("node-1");
        api.images.lock().unwrap().push("web:1");
        let url = api.serve().await;
        (api, url)
    }

    /// A cluster of `url` for the node named `node`, imagegc's own pod
    /// being `own_pod`.
    fn cluster(url: &str, node: &str, own_pod: Option<&str>) -> Cluster {
        let config = KubernetesConfig {
            enabled: true,
            node_name: Some(node.to_owned()),
            ..KubernetesConfig::default()
        };
        Cluster {
            client: client(ClientConfig::new(url.parse().unwrap())).unwrap(),
            node: node.to_owned(),
            server: url.to_owned(),
            own_pod: own_pod.map(str::to_owned),
            config,
        }
    }

    /// `plan`, `once` and `check-config` with a host name where the Node
    /// is `node-1`: no pod is bound to it, and they say why.
    #[tokio::test]
    async fn a_wrong_node_name_is_said_with_the_pods() {
        let (_api, url) = api().await;
        let wrong = cluster(&url, "ip-10-0-0-1", Some("default/p0")).survey().await.unwrap();
        assert!(wrong.pods.unwrap().references.is_empty());
        assert_eq!(wrong.warnings.len(), 2, "{:?}", wrong.warnings);
        assert!(
            wrong.warnings[0].starts_with(r#"the API server has no Node named "ip-10-0-0-1": kubernetes.node_name"#),
            "{:?}",
            wrong.warnings
        );
        assert!(
            wrong.warnings[1]
                .starts_with(r#"imagegc's own pod default/p0 is not among the 0 pods bound to node "ip-10-0-0-1""#),
            "{:?}",
            wrong.warnings
        );

        let right = cluster(&url, "node-1", Some("default/p0")).survey().await.unwrap();
        assert_eq!(right.pods.unwrap().references.len(), 1);
        assert!(right.warnings.is_empty(), "{:?}", right.warnings);
    }

    /// The daemon with the wrong name: its own pod is not among the pods
    /// its watch lists (a Node of that name exists: another node's), and
    /// `imagegc_kubernetes_node_found` stays 0; with the right one it is 1.
    #[tokio::test]
    async fn the_daemon_says_whether_the_node_name_is_right() {
        let (api, url) = api().await;
        api.nodes.lock().unwrap().push("node-2");
        let metrics = Arc::new(Metrics::new());
        let shutdown = CancellationToken::new();
        let found = |metrics: &Metrics| {
            let text = metrics.encode();
            text.lines()
                .find_map(|l| l.strip_prefix("imagegc_kubernetes_node_found "))
                .map(str::to_owned)
        };

        let wrong = cluster(&url, "node-2", Some("imagegc/imagegc-x"));
        let watch = pods::spawn(
            wrong.client.clone(),
            "node-2",
            Duration::from_secs(3600),
            KubernetesMetrics::new(&metrics),
            shutdown.clone(),
        );
        let verdict = check_node(
            wrong.client.clone(),
            "node-2".to_owned(),
            url.clone(),
            Some("imagegc/imagegc-x".to_owned()),
            Some(watch.listed.clone()),
            KubernetesMetrics::new(&metrics),
            shutdown.clone(),
        )
        .await
        .unwrap();
        assert_eq!(verdict.node, node::NodeLookup::Found);
        assert_eq!(
            verdict.own_pod,
            node::OwnPod::NotListed {
                pod: "imagegc/imagegc-x".to_owned(),
                listed: 0
            }
        );
        assert_eq!(found(&metrics).as_deref(), Some("0"));

        let metrics = Arc::new(Metrics::new());
        let _started = cluster(&url, "node-1", Some("default/p0")).start(&KubernetesMetrics::new(&metrics), &shutdown);
        fake_api::wait_until("the node's name confirmed", || found(&metrics).as_deref() == Some("1")).await;
        shutdown.cancel();
    }
}

/// A client as imagegc uses one. Connecting gives up after
/// [`CONNECT_TIMEOUT`], each request after [`REQUEST_TIMEOUT`] without an
/// answer, each read after [`READ_TIMEOUT`]; and a request the API server
/// refuses (429, 503, 504) fails at once instead of being retried inside the
/// client: the watch and the event poster back off on their own, and the
/// client's retries (up to 15, their delays doubling) would hold the watch
/// down long after the API server is back.
pub(crate) fn client(mut config: ClientConfig) -> Result<Client, kube::Error> {
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(READ_TIMEOUT);
    config.default_retry = false;
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(builder.with_layer(&answer::Within(REQUEST_TIMEOUT)).build())
}

/// A request the API server does not answer in time fails (a tower layer
/// under the client): a watch request too, whose answer (its headers) comes
/// at once, while its events come for as long as it stays open.
mod answer {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use tower::{BoxError, Layer, Service};

    /// No answer within this long fails the request.
    #[derive(Debug, Clone, Copy)]
    pub struct Within(pub Duration);

    /// The error of a request without an answer.
    #[derive(Debug, thiserror::Error)]
    #[error("no answer within {}", humantime::format_duration(*.0))]
    pub struct NoAnswer(pub Duration);

    impl<S> Layer<S> for Within {
        type Service = Bounded<S>;
        fn layer(&self, inner: S) -> Bounded<S> {
            Bounded { inner, within: self.0 }
        }
    }

    #[derive(Debug, Clone)]
    pub struct Bounded<S> {
        inner: S,
        within: Duration,
    }

    impl<S, R> Service<R> for Bounded<S>
    where
        S: Service<R>,
        S::Error: Into<BoxError>,
        S::Future: Send + 'static,
    {
        type Response = S::Response;
        type Error = BoxError;
        type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            self.inner.poll_ready(cx).map_err(Into::into)
        }

        fn call(&mut self, request: R) -> Self::Future {
            let answer = self.inner.call(request);
            let within = self.within;
            Box::pin(async move {
                match tokio::time::timeout(within, answer).await {
                    Ok(answer) => answer.map_err(Into::into),
                    Err(_) => Err(NoAnswer(within).into()),
                }
            })
        }
    }
}

async fn from_kubeconfig(path: &Path) -> Result<ClientConfig, String> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|err| err.to_string())?;
    ClientConfig::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|err| err.to_string())
}
