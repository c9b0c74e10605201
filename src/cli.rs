//! The command line: subcommands, flags, and what each prints.
//!
//! Exit codes, for every subcommand: 0 success; 1 runtime or IO failure;
//! 2 configuration or usage error (an unsafe state directory included);
//! 3 (`once`) a cycle ran but could not reach the low threshold; 4 (`run`,
//! `once`) another imagegc holds the state directory's lock.
//!
//! `run` and `once` hold the state directory's exclusive lock for their
//! whole life; `plan` and `history` take no lock and write nothing.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use clap::{Parser, Subcommand, ValueEnum};

use crate::collector::{Collector, CycleReport, MountCache, Outcome, PodImages, sandbox_images};
use crate::config::{self, Config, ConfigError, Overrides};
use crate::cri::{self, CriClient, Runtime, RuntimeError};
use crate::fs::{FsProbe, FsStats, Statvfs};
use crate::http::Health;
use crate::journal::Journal;
use crate::metrics::Metrics;
use crate::policy::{KeepReason, Plan, Snapshot};
use crate::records::InUse;
use crate::state::{StateError, StateLock, StateStore};
use crate::time::{Clock, ago, rfc3339};

#[derive(Debug, Parser)]
#[command(
    name = "imagegc",
    version,
    about = "A node-level container image garbage collector for CRI runtimes"
)]
pub struct Cli {
    /// Configuration file: imagegc TOML or YAML, or a KubeletConfiguration YAML.
    #[arg(long, global = true, value_name = "FILE", env = "IMAGEGC_CONFIG")]
    pub config: Option<PathBuf>,
    /// CRI endpoint, e.g. unix:///run/containerd/containerd.sock (default: discover).
    #[arg(long, global = true, value_name = "ENDPOINT")]
    pub runtime_endpoint: Option<String>,
    /// Where image history and the removal journal are kept.
    #[arg(long, global = true, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log level or filter (error, warn, info, debug, trace). Default: info
    /// for `run` and `once`, warn otherwise.
    #[arg(long, global = true, value_name = "LEVEL")]
    pub log_level: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Output {
    #[default]
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the collector: a cycle at start, then every gc.interval.
    Run {
        /// Do everything except removing images.
        #[arg(long)]
        dry_run: bool,
    },
    /// Run one cycle and exit (0, or 3 when the low threshold was not reached).
    Once {
        /// Do everything except removing images.
        #[arg(long)]
        dry_run: bool,
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// Show what a cycle would do now, and why. Removes nothing.
    Plan {
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// List images with their use and the image filesystem.
    Images {
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// Validate the configuration and print it with defaults filled in.
    CheckConfig,
    /// Show removals from the audit journal.
    History {
        /// How far back, e.g. 24h or 7d (default: everything).
        #[arg(long, value_name = "DURATION")]
        since: Option<String>,
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
}

impl Command {
    /// The default log level: the long-running and removing commands say
    /// what they do; the read-only ones keep stderr quiet.
    pub fn default_log_level(&self) -> &'static str {
        match self {
            Command::Run { .. } | Command::Once { .. } => "info",
            _ => "warn",
        }
    }
}

/// Errors that end a command, each with its exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Runtime(#[from] RuntimeError),
    #[error("{0}")]
    State(#[from] StateError),
    #[error("{0}")]
    Other(#[from] anyhow::Error),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Config(_) | CliError::Usage(_) => 2,
            CliError::State(StateError::Unsafe { .. }) => 2,
            CliError::State(StateError::Locked { .. }) => 4,
            CliError::Runtime(_) | CliError::State(_) | CliError::Other(_) => 1,
        }
    }
}

/// What a successful command asks the process to exit with.
pub type ExitStatus = u8;

/// Loads the configuration from the flags.
pub fn load_config(cli: &Cli) -> Result<Config, ConfigError> {
    let dry_run = matches!(
        cli.command,
        Command::Run { dry_run: true } | Command::Once { dry_run: true, .. }
    );
    let overrides = Overrides {
        runtime_endpoint: cli.runtime_endpoint.clone(),
        state_dir: cli.state_dir.clone(),
        dry_run,
    };
    config::load(cli.config.as_deref(), &overrides)
}

/// Runs a command other than `run` (the daemon lives in [`crate::daemon`]).
pub async fn execute(cli: &Cli, config: Config) -> Result<ExitStatus, CliError> {
    match &cli.command {
        Command::CheckConfig => check_config(&config),
        Command::History { since, output } => history(&config, since.as_deref(), *output),
        Command::Images { output } => {
            let runtime = runtime_client(&config).await?;
            images(&runtime, &config, *output).await
        }
        Command::Plan { output } => {
            StateStore::new(&config.state.dir).check_dir()?;
            let runtime = runtime_client(&config).await?;
            plan(runtime, config, *output).await
        }
        Command::Once { output, .. } => {
            let _lock = lock_state(&config)?;
            let runtime = runtime_client(&config).await?;
            once(runtime, config, *output).await
        }
        Command::Run { .. } => unreachable!("run is handled by the daemon"),
    }
}

/// `run`: the daemon. Binds the HTTP endpoint first (health answers while
/// the runtime is still being found), handles signals, then loops.
pub async fn run_daemon(cli: &Cli, config: Config) -> Result<ExitStatus, CliError> {
    use tokio::signal::unix::{SignalKind, signal};
    use tokio_util::sync::CancellationToken;

    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    let _lock = lock_state(&config)?;
    let shutdown = CancellationToken::new();
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::new(liveness_window(&config)));
    let mut server = None;
    if let Some(addr) = config.metrics.listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (metrics.listen): {e}"))?;
        tracing::info!(address = %addr, "serving /metrics, /healthz and /readyz");
        server = Some(tokio::spawn(crate::http::serve(
            listener,
            Arc::clone(&metrics),
            Arc::clone(&health),
            shutdown.clone(),
        )));
    }

    let (reload_tx, reload_rx) = tokio::sync::mpsc::unbounded_channel();
    let signal_error = |e: std::io::Error| anyhow::anyhow!("cannot install signal handlers: {e}");
    let mut term = signal(SignalKind::terminate()).map_err(signal_error)?;
    let mut int = signal(SignalKind::interrupt()).map_err(signal_error)?;
    let mut hup = signal(SignalKind::hangup()).map_err(signal_error)?;
    let signals = {
        let shutdown = shutdown.clone();
        let config_path = cli.config.clone();
        let overrides = Overrides {
            runtime_endpoint: cli.runtime_endpoint.clone(),
            state_dir: cli.state_dir.clone(),
            dry_run: matches!(cli.command, Command::Run { dry_run: true }),
        };
        let reloading = Arc::new(std::sync::atomic::AtomicBool::new(false));
        tokio::spawn(async move {
            loop {
                let code = tokio::select! {
                    _ = term.recv() => 128 + libc::SIGTERM,
                    _ = int.recv() => 128 + libc::SIGINT,
                    _ = hup.recv() => {
                        reload(config_path.clone(), overrides.clone(), reload_tx.clone(), &reloading);
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
        })
    };

    // Find the runtime, retrying while it is not there (a node agent may
    // start before the runtime does).
    let mut delay = Duration::from_secs(1);
    let mut warned = false;
    let runtime = loop {
        match cri::discover(config.runtime.endpoint.as_deref(), config.runtime.timeout).await {
            Ok(client) => break client,
            Err(err) => {
                metrics.set_runtime_up(false);
                if !warned {
                    tracing::warn!(error = %err, "container runtime not found; retrying with backoff");
                    warned = true;
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => {
                signals.abort();
                return Ok(0);
            }
            _ = tokio::time::sleep(delay) => {}
        }
        health.heartbeat();
        delay = (delay * 2).min(Duration::from_secs(60));
    };
    let collector = Collector::new(
        runtime,
        Arc::new(config),
        Arc::new(Statvfs),
        Arc::clone(&metrics),
        Clock::start(),
    )
    .with_health(Arc::clone(&health));
    crate::daemon::run(collector, health, shutdown.clone(), reload_rx).await;
    shutdown.cancel();
    if let Some(server) = server {
        let _ = server.await;
    }
    signals.abort();
    tracing::info!("stopped");
    Ok(0)
}

/// Reloads the configuration for SIGHUP on a blocking thread, and hands a
/// valid one to the daemon loop through `reloads`. Reading and parsing never
/// run on the runtime thread: a file that is slow to read (a FIFO, a hung
/// network mount) or to parse must not stop cycles, probes or shutdown. One
/// reload at a time: a SIGHUP during a reload is ignored with a warning.
fn reload(
    path: Option<PathBuf>,
    overrides: Overrides,
    reloads: tokio::sync::mpsc::UnboundedSender<Arc<Config>>,
    reloading: &Arc<std::sync::atomic::AtomicBool>,
) {
    use std::sync::atomic::Ordering;
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

/// How long the loop may go without a heartbeat before /healthz fails: a
/// cycle step is bounded by the runtime timeout, and the loop wakes at least
/// every interval.
fn liveness_window(config: &Config) -> Duration {
    (config.gc.interval * 2 + config.runtime.timeout * 3).max(Duration::from_secs(600))
}

/// Takes the state directory's lock for `run` and `once` (see
/// [`StateStore::lock`]): before anything else, so a second imagegc or an
/// unsafe directory stops the command at start, never after it removed.
fn lock_state(config: &Config) -> Result<StateLock, CliError> {
    Ok(StateStore::new(&config.state.dir).lock()?)
}

/// Connects to the configured runtime or discovers one; checks it answers.
pub async fn runtime_client(config: &Config) -> Result<CriClient, RuntimeError> {
    let client = cri::discover(config.runtime.endpoint.as_deref(), config.runtime.timeout).await?;
    client.version().await?;
    Ok(client)
}

fn check_config(config: &Config) -> Result<ExitStatus, CliError> {
    for warning in &config.warnings {
        eprintln!("warning: {warning}");
    }
    print!("{}", config.to_toml_string());
    Ok(0)
}

fn print_json(value: &impl serde::Serialize) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value).map_err(anyhow::Error::from)?;
    writeln!(out).map_err(anyhow::Error::from)?;
    Ok(())
}

/// `images`: the inventory, with in-use marks and the filesystem.
async fn images(runtime: &CriClient, config: &Config, output: Output) -> Result<ExitStatus, CliError> {
    let version = runtime.version().await?;
    let images = runtime.list_images().await?;
    let containers = MountCache::default().list(runtime).await?;
    let from_status = runtime.status().await.ok().and_then(|s| s.sandbox_image);
    let sandbox_images = sandbox_images(runtime, config, from_status.as_deref(), &mut PodImages::default()).await;
    let mount_point = match &config.gc.image_fs_path {
        Some(p) => p.display().to_string(),
        None => runtime
            .image_fs_info()
            .await?
            .into_iter()
            .map(|f| f.mount_point)
            .find(|m| !m.is_empty())
            .unwrap_or_default(),
    };
    let fs = Statvfs.stats(std::path::Path::new(&mount_point));
    let in_use = InUse::new(&images, &containers);
    let fs_json = match &fs {
        Ok(s) => serde_json::json!({
            "mount_point": mount_point,
            "capacity_bytes": s.capacity_bytes,
            "used_bytes": s.used_bytes(),
            "available_bytes": s.available(),
            "usage_percent": s.usage_percent(),
            "inodes_total": s.inodes_total,
            "inodes_free": s.inodes_free,
        }),
        Err(err) => serde_json::json!({"mount_point": mount_point, "error": err.to_string()}),
    };
    if output == Output::Json {
        let list: Vec<_> = images
            .iter()
            .map(|i| {
                serde_json::json!({
                    "id": i.id,
                    "tags": i.repo_tags,
                    "digests": i.repo_digests,
                    "size_bytes": i.size,
                    "pinned": i.pinned,
                    "in_use": in_use.is_used(&i.id),
                    "containers": in_use.containers(&i.id),
                })
            })
            .collect();
        print_json(&serde_json::json!({
            "runtime": {
                "endpoint": runtime.endpoint(),
                "name": version.runtime_name,
                "version": version.runtime_version,
            },
            "sandbox_image": sandbox_images.first(),
            "sandbox_images": sandbox_images,
            "image_filesystem": fs_json,
            "images": list,
        }))?;
        return Ok(0);
    }
    let mut rows = vec![vec![
        "IMAGE ID".to_string(),
        "TAGS".to_string(),
        "SIZE".to_string(),
        "PINNED".to_string(),
        "IN USE".to_string(),
    ]];
    for i in &images {
        let used = in_use.containers(&i.id).len();
        rows.push(vec![
            short_id(&i.id),
            tags_cell(&i.repo_tags),
            human_bytes(i.size),
            yes_no(i.pinned),
            if used > 0 {
                format!("yes ({used})")
            } else {
                "no".to_string()
            },
        ]);
    }
    let mut out = String::new();
    out.push_str(&format!(
        "runtime: {} {} at {}\n",
        cell(&version.runtime_name),
        cell(&version.runtime_version),
        runtime.endpoint()
    ));
    out.push_str(&fs_line(&mount_point, fs.as_ref().ok(), config));
    out.push('\n');
    out.push_str(&table(&rows));
    print!("{out}");
    Ok(0)
}

fn fs_line(mount_point: &str, fs: Option<&FsStats>, config: &Config) -> String {
    let mount_point = cell(mount_point);
    match fs {
        Some(s) => format!(
            "image filesystem: {mount_point}: {} used of {} ({}%), {} available; high {}%, low {}%\n",
            human_bytes(s.used_bytes()),
            human_bytes(s.capacity_bytes),
            s.usage_percent(),
            human_bytes(s.available()),
            config.gc.high_threshold_percent,
            config.gc.low_threshold_percent
        ),
        None => format!("image filesystem: {mount_point}: cannot be measured\n"),
    }
}

fn new_collector(runtime: CriClient, config: Config) -> Collector<CriClient> {
    Collector::new(
        runtime,
        Arc::new(config),
        Arc::new(Statvfs),
        Arc::new(Metrics::new()),
        Clock::start(),
    )
}

/// `plan`: what a cycle would do now. Reads the state; removes and writes
/// nothing (a corrupt state file is reported and left where it is).
async fn plan(runtime: CriClient, config: Config, output: Output) -> Result<ExitStatus, CliError> {
    let mut collector = Collector::new_read_only(
        runtime,
        Arc::new(config.clone()),
        Arc::new(Statvfs),
        Arc::new(Metrics::new()),
        Clock::start(),
    );
    let (snapshot, image_fs) = collector.observe().await?;
    let image_fs = image_fs?;
    let fs_path = image_fs.path.clone();
    let fs = Statvfs.stats(&fs_path).ok();
    let now = collector.clock().now();
    let plan = collector.plan(&snapshot);
    let view = PlanView::new(&snapshot, &plan, fs.as_ref(), &config);
    let outlook = fs
        .as_ref()
        .filter(|_| view.space_pass)
        .map(|fs| {
            crate::policy::SpaceOutlook::new(
                fs,
                config.gc.low_threshold_percent,
                plan.age.iter().chain(&plan.space),
                &snapshot.images,
                image_fs.image_bytes,
            )
        })
        .filter(crate::policy::SpaceOutlook::unreachable);
    if output == Output::Json {
        print_json(&serde_json::json!({
            "time": rfc3339(now),
            "dry_run": config.gc.dry_run,
            "image_filesystem": fs.map(|s| serde_json::json!({
                "mount_point": fs_path,
                "capacity_bytes": s.capacity_bytes,
                "available_bytes": s.available(),
                "usage_percent": s.usage_percent(),
            })),
            "high_threshold_percent": config.gc.high_threshold_percent,
            "low_threshold_percent": config.gc.low_threshold_percent,
            "space_pass": view.space_pass,
            "bytes_to_free": view.bytes_to_free,
            "space_unreachable": outlook,
            "removals": plan.age.iter().chain(view.space_expected(&plan)).collect::<Vec<_>>(),
            "further_space_candidates": view.space_further(&plan),
            "kept": plan.kept.iter().map(|kept| kept_json(kept, now)).collect::<Vec<_>>(),
        }))?;
        return Ok(0);
    }
    let mut out = String::new();
    out.push_str(&fs_line(&fs_path.display().to_string(), fs.as_ref(), &config));
    if plan.age.is_empty() && !view.space_pass {
        out.push_str("nothing to remove now");
        if config.gc.max_age.is_zero() {
            out.push_str(" (usage below the high threshold; age-based removal is off)");
        } else {
            out.push_str(" (usage below the high threshold; no image unused for longer than max age)");
        }
        out.push('\n');
    }
    if view.space_pass {
        out.push_str(&format!(
            "usage is at or above the high threshold: {} to free to reach {}%\n",
            human_bytes(view.bytes_to_free),
            config.gc.low_threshold_percent
        ));
    }
    if let Some(outlook) = &outlook {
        out.push_str(&unreachable_text(outlook));
    }
    let mut rows = vec![vec![
        "#".to_string(),
        "IMAGE ID".to_string(),
        "TAGS".to_string(),
        "SIZE".to_string(),
        "REASON".to_string(),
        "LAST USED".to_string(),
    ]];
    let removals: Vec<_> = plan.age.iter().chain(view.space_expected(&plan)).collect();
    for (n, c) in removals.iter().enumerate() {
        rows.push(vec![
            (n + 1).to_string(),
            short_id(c.id),
            tags_cell(c.tags),
            human_bytes(c.size),
            c.reason.as_str().to_string(),
            ago(c.last_used, now),
        ]);
    }
    if rows.len() > 1 {
        out.push_str("\nwould remove, in this order:\n");
        out.push_str(&table(&rows));
        if view.space_pass {
            out.push_str(
                "(space removals stop as soon as the measured usage reaches the low threshold; \
                 the estimate above adds reported sizes, which overstate what shared layers free)\n",
            );
        }
    }
    let further = view.space_further(&plan);
    if view.space_pass && !further.is_empty() {
        out.push_str(&format!(
            "{} further candidate(s) if the estimate falls short\n",
            further.len()
        ));
    }
    let mut rows = vec![vec![
        "IMAGE ID".to_string(),
        "TAGS".to_string(),
        "SIZE".to_string(),
        "KEPT BECAUSE".to_string(),
    ]];
    for k in &plan.kept {
        rows.push(vec![
            short_id(k.id),
            tags_cell(k.tags),
            human_bytes(k.size),
            keep_text(&k.why),
        ]);
    }
    if rows.len() > 1 {
        out.push_str("\nkept:\n");
        out.push_str(&table(&rows));
    }
    let unused_later = if view.space_pass { 0 } else { plan.space.len() };
    if unused_later > 0 {
        out.push_str(&format!(
            "\n{unused_later} unused image(s) are candidates once usage reaches {}%\n",
            config.gc.high_threshold_percent
        ));
    }
    print!("{out}");
    Ok(0)
}

/// A kept image as JSON, with `removable_after` (for images too young to
/// remove) as the RFC 3339 time it becomes removable, like every other time
/// printed, rather than a serialized `Duration`.
fn kept_json(kept: &crate::policy::Kept<'_>, now: SystemTime) -> serde_json::Value {
    let mut value = serde_json::to_value(kept).unwrap_or_default();
    if let (KeepReason::TooYoung { removable_after }, Some(object)) = (&kept.why, value.as_object_mut()) {
        let at = now.checked_add(*removable_after).unwrap_or(now);
        object.insert("removable_after".to_string(), serde_json::json!(rfc3339(at)));
    }
    value
}

/// How a plan meets the current usage, for display.
struct PlanView {
    space_pass: bool,
    bytes_to_free: u64,
    /// How many space candidates the reported sizes say are needed.
    expected: usize,
}

impl PlanView {
    fn new(_snapshot: &Snapshot, plan: &Plan, fs: Option<&FsStats>, config: &Config) -> Self {
        let Some(fs) = fs else {
            return PlanView {
                space_pass: false,
                bytes_to_free: 0,
                expected: 0,
            };
        };
        let space_pass = fs.usage_percent() >= u64::from(config.gc.high_threshold_percent);
        let bytes_to_free = if space_pass {
            fs.bytes_to_free(config.gc.low_threshold_percent)
        } else {
            0
        };
        // Sizes are the runtime's word: absurd ones must not overflow.
        let age_freed = plan.age.iter().fold(0u64, |sum, c| sum.saturating_add(c.size));
        let mut left = bytes_to_free.saturating_sub(age_freed);
        let mut expected = 0;
        for c in &plan.space {
            if left == 0 {
                break;
            }
            left = left.saturating_sub(c.size);
            expected += 1;
        }
        PlanView {
            space_pass,
            bytes_to_free,
            expected,
        }
    }

    fn space_expected<'p, 'a>(
        &self,
        plan: &'p Plan<'a>,
    ) -> impl Iterator<Item = &'p crate::policy::Candidate<'a>> + use<'p, 'a> {
        plan.space.iter().take(self.expected)
    }

    fn space_further<'p, 'a>(&self, plan: &'p Plan<'a>) -> &'p [crate::policy::Candidate<'a>] {
        if self.space_pass {
            &plan.space[self.expected..]
        } else {
            &[]
        }
    }
}

fn keep_text(why: &KeepReason) -> String {
    match why {
        KeepReason::InUse { containers } if containers.is_empty() => "in use".to_string(),
        KeepReason::InUse { containers } => format!("in use by {} container(s)", containers.len()),
        KeepReason::Pinned => "pinned by the runtime".to_string(),
        KeepReason::Sandbox => "the runtime's sandbox image".to_string(),
        KeepReason::SandboxUnknown => {
            "never used, and the sandbox image is unknown (set runtime.sandbox_image)".to_string()
        }
        KeepReason::Protected { pattern } => format!("protected by {pattern:?}"),
        KeepReason::KeepRecent { repository, rank } => format!("newest #{rank} of {repository}"),
        KeepReason::TooYoung { removable_after } => {
            format!(
                "younger than min age (removable in {})",
                crate::time::short(*removable_after)
            )
        }
    }
}

/// `once`: one cycle.
async fn once(runtime: CriClient, config: Config, output: Output) -> Result<ExitStatus, CliError> {
    let mut collector = new_collector(runtime, config);
    let cancel = tokio_util::sync::CancellationToken::new();
    let report = collector.cycle(&cancel).await;
    if output == Output::Json {
        print_json(&report_json(&report))?;
    } else {
        print!("{}", report_text(&report));
    }
    match &report.outcome {
        Outcome::Success | Outcome::Interrupted => Ok(0),
        Outcome::LowNotReached { .. } => Ok(3),
        Outcome::Failed(err) => Err(CliError::Other(anyhow::anyhow!("{err}"))),
    }
}

fn report_json(report: &CycleReport) -> serde_json::Value {
    let (outcome, detail) = match &report.outcome {
        Outcome::Success => ("success", serde_json::Value::Null),
        Outcome::LowNotReached {
            freed_bytes,
            remaining_bytes,
        } => (
            "low_not_reached",
            serde_json::json!({"freed_bytes": freed_bytes, "remaining_bytes": remaining_bytes}),
        ),
        Outcome::Failed(e) => ("failure", serde_json::json!(e)),
        Outcome::Interrupted => ("interrupted", serde_json::Value::Null),
    };
    serde_json::json!({
        "outcome": outcome,
        "detail": detail,
        "dry_run": report.dry_run,
        "space_pass": report.space_pass,
        "usage_percent_before": report.before.map(|s| s.usage_percent()),
        "usage_percent_after": report.after.map(|s| s.usage_percent()),
        "available_bytes_before": report.before.map(|s| s.available()),
        "available_bytes_after": report.after.map(|s| s.available()),
        "removed": report.removed,
        "failed": report.failed.iter().map(|(id, e)| serde_json::json!({"id": id, "error": e})).collect::<Vec<_>>(),
        "kept_because_in_use_at_removal": report.became_in_use,
        "space_unreachable": report.space_unreachable,
        "held_back_after_recent_removal": report.held_back,
        "outcome_unknown": report.unsettled,
        "duration_seconds": report.duration.as_secs_f64(),
    })
}

fn report_text(report: &CycleReport) -> String {
    let mut out = String::new();
    if let (Some(b), Some(a)) = (report.before, report.after) {
        out.push_str(&format!(
            "usage: {}% before, {}% after ({} available before, {} after)\n",
            b.usage_percent(),
            a.usage_percent(),
            human_bytes(b.available()),
            human_bytes(a.available())
        ));
    }
    let mut rows = vec![vec![
        "IMAGE ID".to_string(),
        "TAGS".to_string(),
        "REASON".to_string(),
        "SIZE".to_string(),
        "FREED".to_string(),
    ]];
    for r in &report.removed {
        rows.push(vec![
            short_id(&r.id),
            tags_cell(&r.tags),
            r.reason.as_str().to_string(),
            human_bytes(r.size),
            r.freed_bytes.map_or("-".to_string(), human_bytes),
        ]);
    }
    if rows.len() > 1 {
        out.push_str(if report.dry_run {
            "would remove (dry run):\n"
        } else {
            "removed:\n"
        });
        out.push_str(&table(&rows));
    } else {
        out.push_str("removed nothing\n");
    }
    for (id, err) in &report.failed {
        out.push_str(&format!("failed to remove {}: {}\n", short_id(id), printable(err)));
    }
    for id in &report.unsettled {
        out.push_str(&format!(
            "the runtime did not say whether it removed {} (still listed): no further removal for space this cycle\n",
            short_id(id)
        ));
    }
    if let Some(outlook) = &report.space_unreachable {
        out.push_str(&unreachable_text(outlook));
        if !report.held_back.is_empty() {
            out.push_str(&format!(
                "{} image(s) removed within gc.thrash_window left alone\n",
                report.held_back.len()
            ));
        }
    }
    match &report.outcome {
        Outcome::Success => {}
        Outcome::LowNotReached {
            freed_bytes,
            remaining_bytes,
        } => out.push_str(&format!(
            "low threshold not reached: freed {}, {} more needed but no removable image is left\n",
            human_bytes(*freed_bytes),
            human_bytes(*remaining_bytes)
        )),
        Outcome::Failed(e) => out.push_str(&format!("cycle failed: {}\n", printable(e))),
        Outcome::Interrupted => out.push_str("interrupted\n"),
    }
    out
}

/// What `plan` and `once` say when images cannot bring usage to low.
fn unreachable_text(outlook: &crate::policy::SpaceOutlook) -> String {
    format!(
        "images cannot bring usage to the low threshold: {} to free, removable images hold at most {}; \
         {} of the filesystem is not images (logs, volumes, writable layers): removing images cannot fix that\n",
        human_bytes(outlook.bytes_to_free),
        human_bytes(outlook.could_free),
        human_bytes(outlook.not_image_bytes)
    )
}

/// `history`: removals from the journal.
fn history(config: &Config, since: Option<&str>, output: Output) -> Result<ExitStatus, CliError> {
    let since = match since {
        Some(s) => {
            let d = config::parse_duration(s).map_err(|e| CliError::Usage(format!("--since: {e}")))?;
            Some(SystemTime::now().checked_sub(d).unwrap_or(SystemTime::UNIX_EPOCH))
        }
        None => None,
    };
    StateStore::new(&config.state.dir).check_dir()?;
    let journal = Journal::new(&config.state.dir);
    let entries = journal.read(since).map_err(anyhow::Error::from)?;
    if output == Output::Json {
        print_json(&entries)?;
        return Ok(0);
    }
    let mut rows = vec![vec![
        "TIME".to_string(),
        "IMAGE ID".to_string(),
        "TAGS".to_string(),
        "REASON".to_string(),
        "FREED".to_string(),
        "LAST USED".to_string(),
    ]];
    for e in &entries {
        rows.push(vec![
            e.time.clone(),
            short_id(&e.image),
            tags_cell(&e.tags),
            if e.dry_run {
                format!("{} (dry run)", e.reason)
            } else {
                e.reason.clone()
            },
            e.freed_bytes.map_or("-".to_string(), human_bytes),
            e.last_used.clone(),
        ]);
    }
    if entries.is_empty() {
        println!("no removals recorded in {}", journal.path().display());
    } else {
        print!("{}", table(&rows));
    }
    Ok(0)
}

/// `sha256:0123456789ab…` → `0123456789ab`.
pub fn short_id(id: &str) -> String {
    crate::reference::bare_id(id).chars().take(12).collect()
}

fn tags_cell(tags: &[String]) -> String {
    match tags {
        [] => "<none>".to_string(),
        [one] => one.clone(),
        [first, rest @ ..] => format!("{first} (+{})", rest.len()),
    }
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.to_string()
}

/// Sizes for people: `512 B`, `1.5 KiB`, `230.0 MiB`, `1.2 GiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// The longest cell a table prints, in characters: every real tag, id and
/// time fits; a longer value (a runtime can report anything) is cut with an
/// ellipsis, and the whole value stays in `--output json`.
pub const MAX_CELL_CHARS: usize = 200;

/// `text` safe to print on a terminal: control characters (newlines, escape
/// codes) are written as escapes (`\n`, `\u{1b}`), so a runtime-supplied
/// name can neither forge a line nor drive the terminal.
pub fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

/// A table cell: printable, and at most [`MAX_CELL_CHARS`] characters.
fn cell(text: &str) -> String {
    let text = printable(text);
    if text.chars().count() <= MAX_CELL_CHARS {
        return text;
    }
    let mut cut: String = text.chars().take(MAX_CELL_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// Left-aligned columns separated by two spaces; the first row is the header.
/// Cells are made printable and cut to [`MAX_CELL_CHARS`].
fn table(rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows.iter().map(|row| row.iter().map(|c| cell(c)).collect()).collect();
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, cell)| format!("{cell:<width$}", width = widths[c]))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(230 * 1024 * 1024), "230.0 MiB");
    }

    #[test]
    fn plan_view_adds_absurd_sizes_without_overflow() {
        let candidate = |id: &'static str| crate::policy::Candidate {
            id,
            tags: &[],
            digests: &[],
            size: u64::MAX,
            first_seen: SystemTime::UNIX_EPOCH,
            last_used: SystemTime::UNIX_EPOCH,
            reason: crate::policy::Reason::Age,
        };
        let plan = Plan {
            age: vec![candidate("a"), candidate("b")],
            ..Default::default()
        };
        let fs = FsStats {
            capacity_bytes: 100,
            ..Default::default()
        };
        let view = PlanView::new(&Snapshot::default(), &plan, Some(&fs), &Config::default());
        assert!(view.space_pass);
        assert_eq!(view.expected, 0);
    }

    #[test]
    fn tables_align_columns() {
        let t = table(&[vec!["A".into(), "BB".into()], vec!["long".into(), "x".into()]]);
        assert_eq!(t, "A     BB\nlong  x\n");
    }

    #[test]
    fn a_cell_of_70000_characters_is_cut_with_an_ellipsis() {
        let tag = format!("registry.test/app:{}", "x".repeat(70_000));
        let t = table(&[vec!["TAGS".into(), "SIZE".into()], vec![tag, "1 KiB".into()]]);
        let row = t.lines().nth(1).unwrap();
        assert_eq!(row.chars().count(), MAX_CELL_CHARS + 2 + "1 KiB".len());
        assert!(row.starts_with("registry.test/app:xxx"));
        assert!(row.contains("x…  1 KiB"));
    }

    #[test]
    fn control_characters_in_cells_are_escaped() {
        let t = table(&[vec!["TAGS".into()], vec!["app:1\u{1b}[2J\nforged row".into()]]);
        assert_eq!(t, "TAGS\napp:1\\u{1b}[2J\\nforged row\n");
    }

    #[test]
    fn short_ids() {
        assert_eq!(
            short_id("sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"),
            "0123456789ab"
        );
    }

    #[test]
    fn cli_parses_global_flags_after_the_subcommand() {
        let cli = Cli::try_parse_from([
            "imagegc",
            "images",
            "--output",
            "json",
            "--runtime-endpoint",
            "unix:///x",
        ])
        .unwrap();
        assert_eq!(cli.runtime_endpoint.as_deref(), Some("unix:///x"));
        assert!(matches!(cli.command, Command::Images { output: Output::Json }));
    }
}
