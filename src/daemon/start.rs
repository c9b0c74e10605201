//! The daemon's composition root: from a validated configuration and the
//! edges handed in (an already bound listener, a filesystem probe, a
//! shutdown token, a reload channel) to a running loop. Signals, the state
//! lock and the configuration file stay with the caller (`imagegc run`).

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Health;
use crate::config::Config;
use crate::cri::{self, CriClient};
#[cfg(feature = "kubernetes")]
use crate::engine::sinks::KubernetesMetrics;
use crate::engine::sinks::{CriCallMetrics, MetricsSink, register_every_family};
use crate::engine::{Collector, Event, Settings, Sink as _};
use crate::fs::{FsProbe, Statvfs};
use crate::outputs::metrics::Metrics;
use crate::policy::schedule::{RETRY_CAP, RETRY_FIRST};
use crate::time::Clock;
use crate::usage_log::UsageLog;

/// The daemon, assembled: what `imagegc run` starts, and what tests start
/// with a fake runtime and a simulated disk.
pub struct Daemon {
    config: Config,
    listener: Option<TcpListener>,
    probe: Arc<dyn FsProbe>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    #[cfg(feature = "kubernetes")]
    cluster: Option<crate::kubernetes::Cluster>,
}

/// How long the first cycle waits for the first listing of the pods bound
/// to this node (`[kubernetes]`): a cycle that ran before it would not know
/// which images starting pods are about to run. Later cycles never wait;
/// the listing usually takes well under a second.
#[cfg(feature = "kubernetes")]
const FIRST_PODS_LISTING_WAIT: Duration = Duration::from_secs(10);

impl Daemon {
    /// A daemon measuring the real filesystem, with fresh metrics and a
    /// liveness window fit for the configuration, serving no HTTP.
    pub fn new(config: Config) -> Self {
        let health = Arc::new(Health::new(liveness_window(&config)));
        let metrics = Arc::new(Metrics::new());
        register_every_family(&metrics);
        Daemon {
            config,
            listener: None,
            probe: Arc::new(Statvfs),
            metrics,
            health,
            #[cfg(feature = "kubernetes")]
            cluster: None,
        }
    }

    /// Reads the pods bound to this node and posts events on its Node
    /// (`[kubernetes]`), through `cluster`.
    #[cfg(feature = "kubernetes")]
    pub fn cluster(mut self, cluster: crate::kubernetes::Cluster) -> Self {
        self.cluster = Some(cluster);
        self
    }

    /// Serves `/metrics`, `/healthz` and `/readyz` on `listener` (bound by
    /// the caller: the configured address, or port 0 in tests).
    pub fn listener(mut self, listener: TcpListener) -> Self {
        self.listener = Some(listener);
        self
    }

    /// Measures the image filesystem with `probe` instead of `statvfs(2)`.
    pub fn probe(mut self, probe: Arc<dyn FsProbe>) -> Self {
        self.probe = probe;
        self
    }

    /// Reports liveness and readiness to `health`.
    pub fn health(mut self, health: Arc<Health>) -> Self {
        self.health = health;
        self
    }

    /// The metric families the daemon updates and serves on `/metrics` (shared:
    /// tests read them while it runs).
    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.metrics)
    }

    /// Runs until `shutdown` is cancelled: serves HTTP, waits for the
    /// runtime, then runs the loop, which saves the state before returning.
    pub async fn run(self, shutdown: CancellationToken, reloads: mpsc::UnboundedReceiver<Arc<Config>>) {
        let server = self.listener.map(|listener| {
            if let Ok(address) = listener.local_addr() {
                info!(%address, "serving /metrics, /healthz and /readyz");
            }
            tokio::spawn(crate::outputs::http::serve(
                listener,
                Arc::clone(&self.metrics),
                Arc::clone(&self.health),
                shutdown.clone(),
            ))
        });
        // Started before the runtime is found: the pods are listed meanwhile.
        #[cfg(feature = "kubernetes")]
        let started = self
            .cluster
            .map(|cluster| cluster.start(&KubernetesMetrics::new(&self.metrics), &shutdown));
        if let Some(runtime) = find_runtime(&self.config, &self.metrics, &self.health, &shutdown).await {
            let clock = Clock::start();
            let usage_log = self
                .config
                .state
                .usage_log
                .then(|| start_usage_log(&self.config.state.dir, clock))
                .flatten();
            // The state directory, read once, before anything else runs.
            let config = Arc::new(self.config);
            let mut collector = Collector::load(
                runtime,
                Settings::from(&*config),
                &config.state.dir,
                self.probe,
                Arc::clone(&self.metrics),
                clock,
            )
            .with_health(Arc::clone(&self.health));
            if let Some(log) = &usage_log {
                collector = collector.with_sink(Arc::clone(log) as Arc<dyn crate::engine::Sink>);
            }
            #[cfg(feature = "kubernetes")]
            if let Some(started) = started {
                if let Some(events) = started.events {
                    collector = collector.with_sink(Arc::new(events));
                }
                if let Some(mut pods) = started.pods {
                    collector.protections_from(pods.protections.clone());
                    if let Some(sizes) = crate::kubernetes::registry::start(&config.kubernetes, &shutdown) {
                        collector = collector.with_pull_sizes(sizes);
                    }
                    wait_for_pods(&mut pods, &shutdown).await;
                }
            }
            super::run(collector, config, self.health, shutdown.clone(), reloads).await;
            if let Some(log) = usage_log {
                log.close();
            }
        }
        shutdown.cancel();
        if let Some(server) = server {
            let _ = server.await;
        }
    }
}

/// Starts the usage log (`state.usage_log`); one that cannot start is
/// said and left off: collection does not depend on it.
fn start_usage_log(state_dir: &std::path::Path, clock: Clock) -> Option<Arc<UsageLog>> {
    match UsageLog::start(state_dir, crate::usage_log::ROTATE_BYTES, clock) {
        Ok(log) => {
            info!(path = %log.path().display(), "recording image usage (state.usage_log)");
            Some(log)
        }
        Err(err) => {
            warn!(
                path = %state_dir.join(crate::usage_log::FILE_NAME).display(),
                error = %err,
                "cannot record image usage: the usage log is off until a restart"
            );
            None
        }
    }
}

/// Waits for the first listing of the pods bound to this node, at most
/// [`FIRST_PODS_LISTING_WAIT`]: the first cycle then knows them.
#[cfg(feature = "kubernetes")]
async fn wait_for_pods(pods: &mut crate::kubernetes::PodWatch, shutdown: &CancellationToken) {
    let listed = tokio::select! {
        () = shutdown.cancelled() => return,
        listed = tokio::time::timeout(FIRST_PODS_LISTING_WAIT, pods.synced.wait_for(|synced| *synced)) => listed,
    };
    if !matches!(listed, Ok(Ok(_))) {
        warn!(
            waited_s = FIRST_PODS_LISTING_WAIT.as_secs(),
            "the pods bound to this node are not listed yet: cycles go on with what the runtime says, \
             and pods protect their images once the listing comes in"
        );
    }
}

/// Finds the runtime, retrying with the loop's backoff while it is not
/// there (a node agent may start before the runtime does). `None` when
/// shutdown came first.
async fn find_runtime(
    config: &Config,
    metrics: &Arc<Metrics>,
    health: &Health,
    shutdown: &CancellationToken,
) -> Option<CriClient> {
    let mut delay = RETRY_FIRST;
    let mut warned = false;
    loop {
        match cri::discover(config.runtime.endpoint.as_deref(), config.runtime.timeout).await {
            Ok(client) => return Some(client.observed_by(Arc::new(CriCallMetrics::new(metrics)))),
            Err(err) => {
                MetricsSink::new(metrics).emit(&Event::RuntimeUp(false));
                if !std::mem::replace(&mut warned, true) {
                    warn!(error = %err, "container runtime not found; retrying with backoff");
                }
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return None,
            () = tokio::time::sleep(delay) => {}
        }
        health.heartbeat();
        delay = (delay * 2).min(RETRY_CAP);
    }
}

/// How long the loop may go without a heartbeat before /healthz fails: a
/// cycle step is bounded by the runtime timeout, and the loop wakes at least
/// every interval.
pub(super) fn liveness_window(config: &Config) -> Duration {
    (config.gc.interval * 2 + config.runtime.timeout * 3).max(Duration::from_secs(600))
}
