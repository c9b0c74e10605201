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
pub mod node_events;
pub mod pods;

use std::future::Future;
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
    config: KubernetesConfig,
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
            config: config.clone(),
        })
    }

    /// The node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The pods bound to this node now, listed once (`once`, `plan`), as
    /// keep rules; `None` when `protect_pods` is off. Gives up after
    /// [`REQUEST_TIMEOUT`].
    pub async fn list_pods(&self) -> Result<Option<crate::policy::Protections>, ApiError> {
        if !self.config.protect_pods {
            return Ok(None);
        }
        self.bounded(pods::list(self.client.clone(), &self.node))
            .await
            .map(Some)
    }

    /// `call`, given up after [`REQUEST_TIMEOUT`], its error naming the API
    /// server.
    async fn bounded<T>(&self, call: impl Future<Output = Result<T, kube::Error>>) -> Result<T, ApiError> {
        let no_answer = || ApiError::NoAnswer {
            server: self.server.clone(),
            within: REQUEST_TIMEOUT,
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, call).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(kube::Error::Service(err))) if err.is::<answer::NoAnswer>() => Err(no_answer()),
            Ok(Err(error)) => Err(ApiError::Failed {
                server: self.server.clone(),
                error,
            }),
            Err(_) => Err(no_answer()),
        }
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
