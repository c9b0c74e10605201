//! The daemon loop: a cycle at start and every `gc.interval`, usage tracking
//! between cycles (container events where the runtime streams them, polling
//! otherwise), configuration reloads, and graceful shutdown.
//!
//! Everything from outside comes in as an argument — the collector (with its
//! runtime), the health flags, the shutdown token and the reload channel —
//! so tests drive the loop with a fake runtime and their own token.
//! One cycle runs at a time. Shutdown is honoured between removals; state is
//! saved before returning.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::collector::{Collector, Outcome};
use crate::config::Config;
use crate::cri::{EventStream, Runtime};
use crate::http::Health;

/// How long an in-flight cycle may take to reach its next stopping point
/// after shutdown was requested: well inside the 30 s a DaemonSet pod gets.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);
/// Retry delays after the runtime could not be reached: doubling from the
/// first to the cap (and never beyond the interval).
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_CAP: Duration = Duration::from_secs(60);

/// How the loop learns about container use between cycles.
enum UsageSource {
    /// Not yet known: try the event stream.
    Unknown,
    /// The runtime streams container events.
    Events(EventStream),
    /// The stream broke; retry it at this time, polling meanwhile.
    Reconnect(Instant, Duration),
    /// The runtime does not implement events: poll for good.
    Polling,
}

/// Runs the collector until `shutdown` is cancelled. Returns after the state
/// was saved.
pub async fn run<R: Runtime>(
    mut collector: Collector<R>,
    health: Arc<Health>,
    shutdown: CancellationToken,
    mut reloads: mpsc::UnboundedReceiver<Arc<Config>>,
) {
    let config = Arc::clone(collector.config());
    if config.collection_disabled() {
        info!(
            "gc.high_threshold_percent is 100 and gc.max_age is 0: nothing will ever be removed; \
             imagegc still tracks image use and serves metrics"
        );
    }
    sd_notify("READY=1");
    let mut next_cycle = Instant::now();
    let mut next_poll = Instant::now() + config.gc.usage_poll_interval;
    let mut retry = RETRY_FIRST;
    let mut runtime_up: Option<bool> = None;
    let mut usage = UsageSource::Unknown;

    loop {
        health.heartbeat();
        let config = Arc::clone(collector.config());
        if matches!(usage, UsageSource::Unknown) && runtime_up == Some(true) {
            usage = open_events(&collector).await;
        }
        if let UsageSource::Reconnect(at, delay) = usage
            && Instant::now() >= at
        {
            usage = match open_events(&collector).await {
                UsageSource::Reconnect(..) => {
                    let delay = (delay * 2).min(RETRY_CAP);
                    UsageSource::Reconnect(Instant::now() + delay, delay)
                }
                other => other,
            };
        }
        let polling = !matches!(usage, UsageSource::Events(_));
        let heartbeat_at = Instant::now() + Duration::from_secs(10);

        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            Some(new_config) = reloads.recv() => {
                apply_reload(&mut collector, new_config);
                next_poll = Instant::now() + collector.config().gc.usage_poll_interval;
            }
            () = sleep_until(next_cycle) => {
                let ok = run_cycle(&mut collector, &shutdown).await;
                if shutdown.is_cancelled() {
                    break;
                }
                let reached = ok.unwrap_or(false);
                note_runtime(&mut runtime_up, ok.is_some(), &health, collector.runtime().endpoint());
                if ok.is_some() {
                    retry = RETRY_FIRST;
                    next_cycle = Instant::now() + config.gc.interval;
                } else {
                    next_cycle = Instant::now() + retry.min(config.gc.interval);
                    retry = (retry * 2).min(RETRY_CAP);
                }
                debug!(reached, next_in_ms = (next_cycle - Instant::now()).as_millis() as u64, "next cycle scheduled");
            }
            () = sleep_until(next_poll), if polling && runtime_up == Some(true) => {
                if !poll(&mut collector, &mut runtime_up, &health).await {
                    next_cycle = next_cycle.min(Instant::now() + retry);
                }
                next_poll = Instant::now() + config.gc.usage_poll_interval;
            }
            event = next_event(&mut usage) => {
                match event {
                    Some(Ok(_)) => {
                        if !poll(&mut collector, &mut runtime_up, &health).await {
                            next_cycle = next_cycle.min(Instant::now() + retry);
                        }
                    }
                    Some(Err(err)) => {
                        debug!(error = %err, "container event stream broke; polling until it is back");
                        usage = UsageSource::Reconnect(Instant::now() + RETRY_FIRST, RETRY_FIRST);
                    }
                    None => {
                        debug!("container event stream ended; polling until it is back");
                        usage = UsageSource::Reconnect(Instant::now() + RETRY_FIRST, RETRY_FIRST);
                    }
                }
            }
            () = sleep_until(heartbeat_at) => {}
        }
    }
    sd_notify("STOPPING=1");
    info!("shutting down: saving state");
    collector.save().await;
}

/// Runs one cycle; on shutdown gives it [`SHUTDOWN_GRACE`] to reach its next
/// stopping point. Returns None when the runtime could not be reached,
/// Some(low threshold reached or not needed) otherwise.
async fn run_cycle<R: Runtime>(collector: &mut Collector<R>, shutdown: &CancellationToken) -> Option<bool> {
    let report = {
        let cycle = collector.cycle(shutdown);
        tokio::pin!(cycle);
        tokio::select! {
            report = &mut cycle => Some(report),
            () = shutdown.cancelled() => tokio::time::timeout(SHUTDOWN_GRACE, &mut cycle).await.ok(),
        }
    };
    let Some(report) = report else {
        warn!("the cycle did not stop within the shutdown grace period; abandoning it");
        return Some(false);
    };
    if !report.runtime_reached {
        return None;
    }
    Some(!matches!(
        report.outcome,
        Outcome::LowNotReached { .. } | Outcome::Failed(_)
    ))
}

/// Logs runtime reachability once per change, and sets readiness.
fn note_runtime(state: &mut Option<bool>, up: bool, health: &Health, endpoint: &str) {
    health.set_ready(up);
    if *state == Some(up) {
        return;
    }
    match (up, *state) {
        (true, Some(false)) => info!(endpoint, "container runtime is reachable again; collecting"),
        (true, _) => info!(endpoint, "connected to the container runtime"),
        (false, _) => warn!(endpoint, "container runtime is not reachable; retrying with backoff"),
    }
    *state = Some(up);
}

/// Polls container use between cycles. Returns whether the runtime
/// answered; when it did not, the caller brings the next cycle forward to
/// the retry delay: polls pause while the runtime is down, and cycles are
/// what notice it is back.
async fn poll<R: Runtime>(collector: &mut Collector<R>, runtime_up: &mut Option<bool>, health: &Health) -> bool {
    match collector.poll_usage().await {
        Ok(images) => {
            debug!(images_in_use = images, "container usage polled");
            note_runtime(runtime_up, true, health, collector.runtime().endpoint());
            true
        }
        Err(err) => {
            debug!(error = %err, "container poll failed");
            note_runtime(runtime_up, false, health, collector.runtime().endpoint());
            false
        }
    }
}

async fn open_events<R: Runtime>(collector: &Collector<R>) -> UsageSource {
    match collector.runtime().container_events().await {
        Ok(stream) => {
            info!("following container events to track image use between cycles");
            UsageSource::Events(stream)
        }
        Err(err) if err.is_unimplemented() => {
            info!(
                poll_interval = %crate::time::short(collector.config().gc.usage_poll_interval),
                "the runtime does not stream container events; polling containers to track image use"
            );
            UsageSource::Polling
        }
        Err(err) => {
            debug!(error = %err, "cannot open the container event stream; polling meanwhile");
            UsageSource::Reconnect(Instant::now() + RETRY_FIRST, RETRY_FIRST)
        }
    }
}

async fn next_event(usage: &mut UsageSource) -> Option<Result<crate::cri::ContainerEvent, crate::cri::RuntimeError>> {
    match usage {
        UsageSource::Events(stream) => stream.next().await,
        _ => std::future::pending().await,
    }
}

fn apply_reload<R: Runtime>(collector: &mut Collector<R>, new: Arc<Config>) {
    let old = collector.config();
    if old.runtime.endpoint != new.runtime.endpoint {
        warn!("runtime.endpoint changed: it takes effect after a restart");
    }
    if old.state.dir != new.state.dir {
        warn!("state.dir changed: it takes effect after a restart");
    }
    if old.metrics.listen != new.metrics.listen {
        warn!("metrics.listen changed: it takes effect after a restart");
    }
    info!("configuration reloaded; it applies from the next cycle");
    collector.set_config(new);
}

/// Tells systemd (Type=notify) about readiness and shutdown, when started
/// by it: a datagram to `$NOTIFY_SOCKET`. A no-op elsewhere.
pub fn sd_notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let socket = match std::os::unix::net::UnixDatagram::unbound() {
        Ok(s) => s,
        Err(err) => {
            debug!(error = %err, "cannot create the sd_notify socket");
            return;
        }
    };
    let bytes = path.as_encoded_bytes();
    let result = if let Some(abstract_name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(abstract_name)
            .and_then(|addr| socket.send_to_addr(state.as_bytes(), &addr))
    } else {
        socket.send_to(state.as_bytes(), &path)
    };
    if let Err(err) = result {
        debug!(error = %err, "sd_notify failed");
    }
}
