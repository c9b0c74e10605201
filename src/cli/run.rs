//! `imagegc run`: the daemon's edges that belong to a process. It takes the
//! state directory's lock, binds the metrics listener (health answers while
//! the runtime is still being found), turns SIGTERM/SIGINT into shutdown
//! (a second one exits at once) and SIGHUP into reloads, and hands all of it
//! to [`Daemon`].

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Cli, CliError, ExitStatus, lock_state};
use crate::config::{self, Config, Overrides};
use crate::daemon::Daemon;
use crate::store::state::Running;

/// `run`: the daemon, until a signal stops it.
pub async fn run_daemon(cli: &Cli, config: Config) -> Result<ExitStatus, CliError> {
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    if !config.kubelet.read {
        tracing::info!(
            "no kubelet configuration read (kubelet.config, kubelet.config_dir): assuming the kubelet's defaults, \
             its own image GC on at 85/80 and pods evicted below imagefs.available 15%"
        );
    }
    let _lock = lock_state(&config)?;
    // For `check-config`: what only a restart changes, as read now.
    Running::write(&config);
    #[allow(unused_mut)] // only the `kubernetes` feature changes it
    let mut daemon = Daemon::new(config.clone());
    #[cfg(feature = "kubernetes")]
    if config.kubernetes.enabled {
        let file = config
            .source
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let cluster = crate::kubernetes::Cluster::connect(&config.kubernetes, &file).await?;
        tracing::info!(
            node = cluster.node(),
            protect_pods = config.kubernetes.protect_pods,
            node_events = config.kubernetes.node_events,
            "Kubernetes: reading this node's pods and posting its events"
        );
        daemon = daemon.cluster(cluster);
    }
    if let Some(addr) = config.metrics.listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (metrics.listen): {e}"))?;
        daemon = daemon.listener(listener);
    }
    let shutdown = CancellationToken::new();
    let (reload_tx, reload_rx) = mpsc::unbounded_channel();
    let overrides = super::overrides(cli);
    let signals = handle_signals(shutdown.clone(), cli.config.clone(), overrides, reload_tx)?;
    daemon.run(shutdown, reload_rx).await;
    signals.abort();
    Running::remove(&config.state.dir);
    tracing::info!("stopped");
    Ok(0)
}

/// SIGTERM and SIGINT cancel `shutdown` (a second one exits at once);
/// SIGHUP reloads the configuration.
fn handle_signals(
    shutdown: CancellationToken,
    config_path: Option<PathBuf>,
    overrides: Overrides,
    reloads: mpsc::UnboundedSender<Arc<Config>>,
) -> Result<tokio::task::JoinHandle<()>, CliError> {
    let signal_error = |e: std::io::Error| anyhow::anyhow!("cannot install signal handlers: {e}");
    let mut term = signal(SignalKind::terminate()).map_err(signal_error)?;
    let mut int = signal(SignalKind::interrupt()).map_err(signal_error)?;
    let mut hup = signal(SignalKind::hangup()).map_err(signal_error)?;
    let reloading = Arc::new(AtomicBool::new(false));
    Ok(tokio::spawn(async move {
        loop {
            let code = tokio::select! {
                _ = term.recv() => 128 + libc::SIGTERM,
                _ = int.recv() => 128 + libc::SIGINT,
                _ = hup.recv() => {
                    reload(config_path.clone(), overrides.clone(), reloads.clone(), &reloading);
                    continue;
                }
            };
            if shutdown.is_cancelled() {
                tracing::warn!("second signal: exiting at once");
                std::process::exit(code);
            }
            tracing::info!("signal received: finishing the current removal, then stopping");
            shutdown.cancel();
        }
    }))
}

/// Reloads the configuration for SIGHUP on a blocking thread, and hands a
/// valid one to the daemon loop through `reloads`. Reading and parsing never
/// run on the runtime thread: a file that is slow to read (a hung network
/// mount) or to parse must not stop cycles, probes or shutdown. One reload
/// at a time: a SIGHUP during a reload is ignored with a warning.
fn reload(
    path: Option<PathBuf>,
    overrides: Overrides,
    reloads: mpsc::UnboundedSender<Arc<Config>>,
    reloading: &Arc<AtomicBool>,
) {
    if reloading.swap(true, Ordering::SeqCst) {
        tracing::warn!("SIGHUP ignored: the previous configuration reload is still reading the file");
        return;
    }
    let reloading = Arc::clone(reloading);
    tokio::spawn(async move {
        let file = path.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
        tracing::info!(file, "SIGHUP: reloading the configuration");
        let loaded = tokio::task::spawn_blocking(move || config::load(path.as_deref(), &overrides)).await;
        reloading.store(false, Ordering::SeqCst);
        match loaded {
            Ok(Ok(new)) => {
                let _ = reloads.send(Arc::new(new));
            }
            Ok(Err(err)) => {
                for problem in &err.problems {
                    tracing::error!(%problem, "configuration reload rejected; keeping the running configuration");
                }
            }
            Err(err) => tracing::error!(error = %err, "configuration reload failed; keeping the running configuration"),
        }
    });
}
