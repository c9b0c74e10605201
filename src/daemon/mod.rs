//! The daemon loop: cycles when the schedule says ([`Schedule`]: at start,
//! every `gc.interval`, when usage crosses the high threshold between
//! cycles; the one `simulate` replays), usage tracking between cycles
//! (container events where the runtime streams them, polling otherwise),
//! configuration reloads, and graceful shutdown.
//!
//! [`Daemon`] is the composition root `imagegc run` and the tests share: it
//! serves the HTTP endpoint on a listener it is handed, finds the runtime
//! (with the loop's backoff), builds the collector and runs the loop.
//! Everything from outside comes in as an argument — the listener, the
//! filesystem probe, the shutdown token and the reload channel — so tests
//! drive it with a fake runtime, port 0 and their own token.
//! One cycle runs at a time. Shutdown is honoured between removals; state is
//! saved before returning.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::{Config, Order};
use crate::cri::{Runtime, RuntimeError};
use crate::engine::report::Outcome;
use crate::engine::{Collector, Settings, Tracking, UsageTracker};
use crate::store::state::StartOnly;
use crate::time::sleep_until_some;

pub mod auto;
mod start;

pub use crate::outputs::health::Health;
pub use start::Daemon;

/// How long an in-flight cycle may take to reach its next stopping point
/// after shutdown was requested: well inside the 30 s a DaemonSet pod gets.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);
pub use crate::policy::schedule::CROSSING_SPACING;
use crate::policy::schedule::{Ended, Measured, Schedule, Start};

/// The node's name for `imagegc_node_info`: `NODE_NAME` (the DaemonSet sets
/// it from `spec.nodeName`), else the host name from `gethostname(2)` (a
/// systemd install: its unit's `ProcSubset=pid` hides
/// `/proc/sys/kernel/hostname`, the system call needs no file).
fn node_name() -> String {
    std::env::var("NODE_NAME")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .or_else(host_name)
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The host name (`gethostname(2)`), when it has one.
fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at
    // most that many bytes, NUL-terminated when it fits.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..len]).trim().to_owned();
    (!name.is_empty()).then_some(name)
}

/// Runs the collector until `shutdown` is cancelled. Returns after the state
/// was saved.
// Long on purpose: one `select!` over every source of work (shutdown,
// reloads, cycles, polls, events, reconnects), so that what may wait on
// what is read in one place; its steps are the functions below.
pub async fn run<R: Runtime>(
    mut collector: Collector<R>,
    mut config: Arc<Config>,
    health: Arc<Health>,
    shutdown: CancellationToken,
    mut reloads: mpsc::UnboundedReceiver<Arc<Config>>,
) {
    if config.collection_disabled() {
        info!(
            "gc.high_threshold_percent is 100 and gc.max_age is 0: nothing will ever be removed; \
             imagegc still tracks image use and serves metrics"
        );
    }
    crate::engine::MetricsSink::new(collector.metrics()).set_node(&node_name());
    sd_notify("READY=1");
    // When cycles and usage checks come (see `Schedule`, which `simulate`
    // runs too), in time since `origin`.
    let origin = Instant::now();
    let since = |at: Instant| at.saturating_duration_since(origin);
    let mut schedule = Schedule::new(
        Duration::ZERO,
        config.gc.interval,
        config.gc.usage_poll_interval,
        collector.arrivals(),
    );
    let mut runtime_up: Option<bool> = None;
    let mut usage = UsageTracker::new(tracking(&config));
    // A pod bound to the node may bring a pull: usage is checked against
    // the room it needs at once (see `kubernetes.room_before_pulls`).
    let mut pods = collector.protections_changes();
    // A coming pull's size read from its registry (see
    // `kubernetes.registry_manifests`): usage is checked against it at once.
    let mut sized = collector.pull_size_answers();
    // `gc.order = "auto"`: the order judged from the usage log (see
    // `auto`), in force from the start when one was judged before.
    let mut auto = auto::Auto::start(&config.state.dir, collector.clock().now());
    apply_order(&mut collector, &auto);

    loop {
        health.heartbeat();
        if runtime_up == Some(true) {
            usage.open_stream_if_due(collector.runtime());
        }
        let poll_at = usage.poll_at();
        let reopen_at = usage.reopen_at().filter(|_| runtime_up == Some(true));
        let heartbeat_at = Instant::now() + Duration::from_secs(10);
        let next_cycle = origin + schedule.next_cycle();
        let next_check = origin + schedule.next_check();

        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            Some(new_config) = reloads.recv() => {
                apply_reload(&mut collector, &health, &mut config, new_config);
                apply_order(&mut collector, &auto);
                if schedule.reconfigure(config.gc.interval, config.gc.usage_poll_interval) {
                    debug!(next_in_ms = next_in_ms(origin + schedule.next_cycle()), "next cycle rescheduled for the new interval");
                }
                usage.reconfigure(tracking(&config));
            }
            () = sleep_until(next_cycle) => {
                let ok = run_cycle(&mut collector, &shutdown).await;
                if shutdown.is_cancelled() {
                    break;
                }
                let reached = *ok.as_ref().unwrap_or(&false);
                note_runtime(&mut runtime_up, ok.as_ref().err(), &health, collector.runtime().endpoint());
                let ended = if ok.is_ok() {
                    // Low not reached while images too young to remove were
                    // kept: again as soon as the first of them may go.
                    Ended::Ran { look_again: collector.look_again_at().map(since) }
                } else {
                    Ended::Failed
                };
                let arrivals = collector.arrivals();
                let due = collector.check_usage();
                schedule.cycle_ended(since(Instant::now()), ended, arrivals, due);
                debug!(reached, next_in_ms = next_in_ms(origin + schedule.next_cycle()), "next cycle scheduled");
            }
            () = sleep_until_some(poll_at), if runtime_up == Some(true) => {
                let polled = tokio::select! {
                    polled = poll(&mut collector, &mut runtime_up, &health) => polled,
                    () = shutdown.cancelled() => break,
                };
                if !polled {
                    schedule.poll_failed(since(Instant::now()));
                }
                usage.polled();
            }
            event = usage.next_event() => {
                if let Some(event) = usage.received(event) {
                    collector.mark_used_by_event(&event);
                }
            }
            () = sleep_until(next_check) => {
                let measured = collector.check_usage().map(|due| Measured {
                    due,
                    arrivals: collector.arrivals(),
                    thresholds_moved: collector.thresholds_moved(),
                });
                let now = since(Instant::now());
                match schedule.measured(now, measured) {
                    Some(Start::Arrived { .. }) => info!(
                        high_threshold_percent = config.gc.high_threshold_percent,
                        "images arrived, or a coming pull lowered the thresholds in force, since the \
                         last cycle while usage is at or above the high \
                         threshold: starting a cycle"
                    ),
                    Some(Start::Crossing { at }) => info!(
                        high_threshold_percent = config.gc.high_threshold_percent,
                        starts_in_ms = (at - now).as_millis() as u64,
                        "image filesystem usage crossed the high threshold: starting a cycle (while cycles \
                         cannot bring usage below high and no image arrives, crossings start at most one \
                         every 30s)"
                    ),
                    None => {}
                }
            }
            Ok(()) = pods.changed(), if collector.makes_room_before_pulls() => {
                schedule.look_now(since(Instant::now()));
            }
            Some(Ok(())) = changed(sized.as_mut()) => {
                schedule.look_now(since(Instant::now()));
            }
            () = sleep_until_some(auto.due()), if config.gc.order == Order::Auto && config.state.usage_log => {
                auto.begin(&config, collector.records().len());
            }
            judged = auto.finished(collector.clock().now()) => {
                match judged {
                    Ok(saved) => info!(order = saved.judgement.order.as_str(), "gc.order = \"auto\": {}", saved.judgement.describe()),
                    Err(e) => warn!("gc.order = \"auto\": no judgement ({e}); the order in force stays, and the next try is in an hour"),
                }
                apply_order(&mut collector, &auto);
            }
            // Wakes the loop to open the event stream (at its top).
            () = sleep_until_some(reopen_at) => {}
            () = sleep_until(heartbeat_at) => {}
        }
    }
    sd_notify("STOPPING=1");
    info!("shutting down: saving state");
    collector.save().await;
}

/// Puts the order `auto` chose in force, when `gc.order` is `auto` and it
/// chose one other than the order in force, and says which order is in
/// force (`imagegc_gc_order`).
fn apply_order<R: Runtime>(collector: &mut Collector<R>, auto: &auto::Auto) {
    let policy = &collector.settings().policy;
    if let Some(order) = auto.order().filter(|&order| policy.auto && order != policy.order) {
        let mut settings = collector.settings().clone();
        settings.policy = Arc::new(settings.policy.with_order(order));
        collector.set_settings(settings);
    }
    let policy = &collector.settings().policy;
    crate::engine::MetricsSink::new(collector.metrics()).set_order(policy.order.as_str(), policy.auto);
}

/// The next change of `receiver`; never, without one.
async fn changed(
    receiver: Option<&mut tokio::sync::watch::Receiver<u64>>,
) -> Option<Result<(), tokio::sync::watch::error::RecvError>> {
    match receiver {
        Some(receiver) => Some(receiver.changed().await),
        None => std::future::pending().await,
    }
}

/// What the usage tracker follows of `config`.
fn tracking(config: &Config) -> Tracking {
    Tracking {
        poll_interval: config.gc.usage_poll_interval,
        container_events: config.runtime.container_events,
    }
}

/// Milliseconds from now to `at` (for the logs).
fn next_in_ms(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(Instant::now()).as_millis()).unwrap_or(u64::MAX)
}

/// How a cycle was abandoned at shutdown.
enum Abandoned {
    /// No removal was in flight.
    BetweenRemovals,
    /// Its removal was still in flight after [`SHUTDOWN_GRACE`].
    InRemoval(String),
    /// Its removal finished within the grace, the cycle did not.
    AfterRemoval,
}

/// Runs one cycle. On shutdown, a cycle with no removal in flight is
/// abandoned at once (a runtime call it waits for may hang for the whole
/// `runtime.timeout`); a removal in flight gets [`SHUTDOWN_GRACE`] to
/// finish. Returns the runtime's error when it could not be reached (or
/// refused the listing), Ok(low threshold reached or not needed) otherwise.
async fn run_cycle<R: Runtime>(collector: &mut Collector<R>, shutdown: &CancellationToken) -> Result<bool, Down> {
    let in_flight = collector.removal_in_flight();
    let report = {
        let cycle = collector.cycle(shutdown);
        tokio::pin!(cycle);
        tokio::select! {
            report = &mut cycle => Ok(report),
            () = shutdown.cancelled() => match in_flight.image() {
                Some(image) => {
                    info!(image = %image, "shutdown requested during a removal: letting it finish");
                    match tokio::time::timeout(SHUTDOWN_GRACE, &mut cycle).await {
                        Ok(report) => Ok(report),
                        // Read while the cycle lives: its guard clears it
                        // when dropped.
                        Err(_) => Err(match in_flight.image() {
                            Some(image) => Abandoned::InRemoval(image),
                            None => Abandoned::AfterRemoval,
                        }),
                    }
                }
                None => Err(Abandoned::BetweenRemovals),
            },
        }
    };
    let report = match report {
        Ok(report) => report,
        Err(Abandoned::AfterRemoval) => {
            warn!("the cycle did not end within the shutdown grace period after its removal; abandoning it");
            return Ok(false);
        }
        Err(Abandoned::InRemoval(image)) => {
            warn!(
                image = %image,
                grace = %crate::time::short(SHUTDOWN_GRACE),
                "the removal in flight did not finish within the shutdown grace period; abandoning it \
                 (the next start journals it if the runtime completes it)"
            );
            return Ok(false);
        }
        Err(Abandoned::BetweenRemovals) => {
            info!("shutdown requested: the cycle in progress is abandoned (no removal was in flight)");
            return Ok(false);
        }
    };
    if !report.runtime_reached {
        return Err(match &report.outcome {
            Outcome::Failed(err) => Down {
                message: err.to_string(),
                answered: err.runtime_error().is_some_and(runtime_answered),
            },
            _ => Down {
                message: "the runtime did not answer the listing".to_string(),
                answered: false,
            },
        });
    }
    Ok(!matches!(
        report.outcome,
        Outcome::LowNotReached { .. } | Outcome::Failed(_)
    ))
}

/// Why the runtime is taken to be down: its error as it is, and whether it
/// was the runtime's own answer (a refusal) rather than no answer.
#[derive(Debug)]
struct Down {
    message: String,
    answered: bool,
}

impl Down {
    fn of(err: &RuntimeError) -> Self {
        Down {
            message: err.to_string(),
            answered: runtime_answered(err),
        }
    }
}

/// Logs runtime reachability once per change, and sets readiness. `error`
/// says why the runtime is down: logged as it is, and said to be a refusal
/// rather than unreachability when the runtime answered.
fn note_runtime(state: &mut Option<bool>, error: Option<&Down>, health: &Health, endpoint: &str) {
    let up = error.is_none();
    health.set_ready(up);
    if *state == Some(up) {
        return;
    }
    match (error, *state) {
        (None, Some(false)) => info!(endpoint, "container runtime is reachable again; collecting"),
        (None, _) => info!(endpoint, "connected to the container runtime"),
        (
            Some(Down {
                message,
                answered: true,
            }),
            _,
        ) => warn!(
            endpoint,
            error = message,
            "container runtime refused the request; retrying with backoff"
        ),
        (Some(Down { message, .. }), _) => warn!(
            endpoint,
            error = message,
            "container runtime is not reachable; retrying with backoff"
        ),
    }
    *state = Some(up);
}

/// True when a runtime error is the runtime's own answer (a gRPC status
/// such as PermissionDenied) rather than no answer: no connection, a
/// timeout, or the transport's Unavailable.
fn runtime_answered(error: &RuntimeError) -> bool {
    error.code().is_some_and(|code| {
        !matches!(
            code,
            tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::DeadlineExceeded
        )
    })
}

/// Lists containers between cycles. Returns false when the runtime did not
/// answer: polling stops while it is down, so the caller brings the next
/// cycle forward to retry it with the cycles' backoff.
async fn poll<R: Runtime>(collector: &mut Collector<R>, runtime_up: &mut Option<bool>, health: &Health) -> bool {
    match collector.poll_usage().await {
        Ok(images) => {
            debug!(images_in_use = images, "container usage polled");
            note_runtime(runtime_up, None, health, collector.runtime().endpoint());
            true
        }
        Err(err) => {
            debug!(error = %err, "container poll failed");
            note_runtime(
                runtime_up,
                Some(&Down::of(&err)),
                health,
                collector.runtime().endpoint(),
            );
            false
        }
    }
}

/// Applies a reloaded configuration. Every key takes effect at once or from
/// the next cycle on, except the few that only a restart can change (see
/// [`restart_keys`]): those are named in one warning, and the running
/// values stay. `runtime.timeout` reaches the runtime client's deadline and
/// the liveness window at once; the interval is rescheduled by the caller.
fn apply_reload<R: Runtime>(collector: &mut Collector<R>, health: &Health, config: &mut Arc<Config>, new: Arc<Config>) {
    let restart = restart_keys(config, &new);
    if !restart.is_empty() {
        warn!(
            keys = %restart.join(", "),
            "configuration reloaded, but these keys take effect only after a restart: the running values stay until then"
        );
    }
    for warning in &new.warnings {
        warn!("{warning}");
    }
    collector.runtime().set_timeout(new.runtime.timeout);
    health.set_liveness_window(start::liveness_window(&new));
    info!("configuration reloaded; it applies from the next cycle");
    collector.set_settings(Settings::from(&*new));
    *config = new;
}

/// The keys changed from `old` to `new` that apply only at start: the
/// runtime endpoint (the client is made for it), the state directory (its
/// lock is held and its records loaded) and the metrics address (the
/// listener is bound). Every other key applies live. The destructuring
/// names every field, so a key added to [`Config`] does not compile until
/// it is placed on one side or the other.
fn restart_keys(old: &Config, new: &Config) -> Vec<&'static str> {
    use crate::config::{GcConfig, MetricsConfig, RuntimeConfig, StateConfig};
    let Config {
        runtime:
            RuntimeConfig {
                // Start-only (see `StartOnly`).
                endpoint: _,
                // The client's deadline (`Runtime::set_timeout`).
                timeout: _,
                // The loop switches between events and polling.
                container_events: _,
                sandbox_image: _,
            },
        gc:
            GcConfig {
                // Rescheduled by the loop.
                interval: _,
                usage_poll_interval: _,
                high_threshold_percent: _,
                low_threshold_percent: _,
                min_age: _,
                max_age: _,
                dry_run: _,
                // Read at every cycle's listing.
                image_fs_path: _,
                thrash_window: _,
                // Read at every cycle's plan.
                order: _,
                headroom: _,
                high_inodes_percent: _,
                low_inodes_percent: _,
            },
        // Every key read at every cycle's plan (config/protect.rs).
        protect: _,
        // Start-only (see `StartOnly`).
        state: StateConfig { dir: _, usage_log: _ },
        metrics: MetricsConfig { listen: _ },
        // Read again by the reload, with the file that names it.
        eviction_imagefs_available: _,
        kubelet_config: _,
        kubelet_config_dir: _,
        kubelet_args_file: _,
        kubelet: _,
        // Start-only (see `StartOnly`).
        kubernetes: _,
        source: _,
        warnings: _,
    } = new;
    StartOnly::of(old).restart_keys(&StartOnly::of(new))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::RuntimeError;

    fn rpc_error(status: tonic::Status) -> RuntimeError {
        RuntimeError::Rpc {
            rpc: "ListImages",
            endpoint: "unix:///run/containerd/containerd.sock".to_string(),
            status: Box::new(status),
        }
    }

    #[test]
    fn only_the_endpoint_the_state_directory_and_the_metrics_address_need_a_restart() {
        let old = Config::default();
        let mut live = old.clone();
        live.runtime.timeout = Duration::from_secs(1);
        live.runtime.container_events = true;
        live.runtime.sandbox_image = Some("registry.k8s.io/pause:3.10".to_string());
        live.gc.interval = Duration::from_secs(60);
        live.gc.usage_poll_interval = Duration::from_secs(5);
        live.gc.high_threshold_percent = 70;
        live.gc.low_threshold_percent = 60;
        live.gc.max_age = Duration::from_secs(86_400);
        live.gc.dry_run = true;
        live.gc.image_fs_path = Some("/var/lib/containerd".into());
        live.protect.images = vec!["nginx".to_string()];
        live.protect.keep_recent_per_repository = 2;
        assert!(restart_keys(&old, &live).is_empty());

        let mut restart = live.clone();
        restart.runtime.endpoint = Some("unix:///run/crio/crio.sock".to_string());
        restart.state.dir = "/var/lib/imagegc-2".into();
        restart.metrics.listen = None;
        restart.kubernetes.enabled = true;
        restart.kubernetes.pods_stale_after = Duration::from_secs(60);
        assert_eq!(
            restart_keys(&old, &restart),
            ["runtime.endpoint", "state.dir", "metrics.listen", "kubernetes"]
        );
    }

    /// The host name as `uname -n` prints it.
    fn uname_n() -> String {
        let out = std::process::Command::new("uname")
            .arg("-n")
            .output()
            .expect("uname runs");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    #[test]
    fn the_host_name_is_the_systems() {
        assert_eq!(host_name().as_deref(), Some(uname_n().as_str()));
    }

    /// systemd's `ProcSubset=pid` (imagegc.service) mounts a procfs that
    /// has only the processes' directories: `/proc/sys/kernel/hostname`
    /// is gone, and the node's name must still be the host's, not
    /// "unknown". Reproduced in a private mount namespace with
    /// `mount -t proc -o subset=pid`, in a child process (this test
    /// binary again, running only the part below).
    #[test]
    #[ignore = "needs root: mounts a private procfs with subset=pid, as the systemd unit's ProcSubset=pid does"]
    fn the_node_name_is_the_hosts_under_the_units_proc_subset_pid() {
        const CHILD: &str = "IMAGEGC_TEST_PROC_SUBSET_CHILD";
        if std::env::var_os(CHILD).is_some() {
            // SAFETY: plain system calls on this process's own namespaces,
            // made before anything else runs in it (one test, one thread
            // that matters: the harness waits).
            unsafe {
                assert_eq!(
                    libc::unshare(libc::CLONE_NEWNS),
                    0,
                    "unshare: {}",
                    std::io::Error::last_os_error()
                );
                let none = std::ptr::null();
                assert_eq!(
                    libc::mount(
                        c"none".as_ptr(),
                        c"/".as_ptr(),
                        none,
                        libc::MS_REC | libc::MS_PRIVATE,
                        none.cast()
                    ),
                    0
                );
                assert_eq!(
                    libc::mount(
                        c"proc".as_ptr(),
                        c"/proc".as_ptr(),
                        c"proc".as_ptr(),
                        0,
                        c"subset=pid".as_ptr().cast()
                    ),
                    0,
                    "mount proc subset=pid: {}",
                    std::io::Error::last_os_error()
                );
            }
            assert!(
                std::fs::read_to_string("/proc/sys/kernel/hostname").is_err(),
                "procfs with subset=pid still shows sys/"
            );
            assert_eq!(node_name(), std::env::var("EXPECTED_NODE").unwrap());
            return;
        }
        let expected = uname_n();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "daemon::tests::the_node_name_is_the_hosts_under_the_units_proc_subset_pid",
                "--include-ignored",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .env("EXPECTED_NODE", &expected)
            .env_remove("NODE_NAME")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
    }

    #[test]
    fn a_refusal_is_an_answer_and_a_lost_connection_is_not() {
        assert!(runtime_answered(&rpc_error(tonic::Status::permission_denied("no"))));
        assert!(runtime_answered(&rpc_error(tonic::Status::internal("boom"))));
        assert!(!runtime_answered(&rpc_error(tonic::Status::unavailable(
            "transport error"
        ))));
        assert!(!runtime_answered(&rpc_error(tonic::Status::deadline_exceeded("late"))));
        let timeout = RuntimeError::Timeout {
            rpc: "ListImages",
            endpoint: "unix:///x".to_string(),
            timeout: Duration::from_secs(2),
        };
        assert!(!runtime_answered(&timeout));
    }
}
