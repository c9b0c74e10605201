//! The command line: subcommands and flags, the errors that end a command
//! and their exit codes, and the dispatch to each command's module. What a
//! command prints lives with the command (`images`, `plan`, `once`,
//! `history`, `run`, `simulate`); how tables and sizes are drawn in [`table`]. Every
//! command writes through one locked, buffered stdout (`out`).
//!
//! Exit codes, for every subcommand: 0 success; 1 runtime or IO failure;
//! 2 configuration or usage error (an unsafe state directory included);
//! 3 (`once`) a cycle ran but could not reach the low threshold; 4 (`run`,
//! `once`) another imagegc holds the state directory's lock.
//!
//! `run` and `once` hold the state directory's exclusive lock for their
//! whole life; `plan` and `history` take no lock and write nothing.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::config::{self, Config, ConfigError, Overrides};
use crate::cri::{self, CriClient, Runtime, RuntimeError};
use crate::store::state::{StateError, StateLock, StateStore};

mod history;
mod images;
mod once;
mod plan;
mod run;
mod simulate;
pub mod table;

pub use run::run_daemon;
pub use simulate::SimulateArgs;
pub use table::{human_bytes, printable, short_id};

/// The command line: global flags and one subcommand.
#[derive(Debug, Parser)]
#[command(
    name = "imagegc",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("IMAGEGC_COMMIT"), ")"),
    about = "A node-level container image garbage collector for CRI runtimes"
)]
pub struct Cli {
    /// Configuration file: imagegc TOML or YAML, or a KubeletConfiguration YAML.
    #[arg(long, global = true, value_name = "FILE", env = "IMAGEGC_CONFIG")]
    pub config: Option<PathBuf>,
    /// CRI endpoint, e.g. unix:///run/containerd/containerd.sock (default: discover).
    #[arg(long, global = true, value_name = "ENDPOINT", env = "IMAGEGC_RUNTIME_ENDPOINT")]
    pub runtime_endpoint: Option<String>,
    /// The node's KubeletConfiguration, to check the hand-over against
    /// (replaces kubelet.config).
    #[arg(long, global = true, value_name = "FILE", env = "IMAGEGC_KUBELET_CONFIG")]
    pub kubelet_config: Option<PathBuf>,
    /// The kubelet's drop-in directory (its --config-dir), whose .conf
    /// files are merged over the kubelet's file (replaces
    /// kubelet.config_dir).
    #[arg(long, global = true, value_name = "DIR", env = "IMAGEGC_KUBELET_CONFIG_DIR")]
    pub kubelet_config_dir: Option<PathBuf>,
    /// A file of the kubelet's flags (MicroK8s: /var/snap/microk8s/current/args/kubelet),
    /// whose image GC and eviction flags apply over its files (replaces kubelet.args_file).
    #[arg(long, global = true, value_name = "FILE", env = "IMAGEGC_KUBELET_ARGS_FILE")]
    pub kubelet_args_file: Option<PathBuf>,
    /// Read this node's pods and post events on its Node (turns
    /// kubernetes.enabled on; IMAGEGC_KUBERNETES=false leaves the file's).
    #[arg(long, global = true, env = "IMAGEGC_KUBERNETES")]
    pub kubernetes: bool,
    /// Size coming pulls of repositories this node never had by their
    /// registry's manifest (turns kubernetes.registry_manifests on;
    /// IMAGEGC_REGISTRY_MANIFESTS=false leaves the file's).
    #[arg(long, global = true, env = "IMAGEGC_REGISTRY_MANIFESTS")]
    pub registry_manifests: bool,
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
    /// The subcommand to run.
    #[command(subcommand)]
    pub command: Command,
}

/// How log lines are written to stderr (`--log-format`).
// `help = None`: the variant docs are for readers of the code; `--help` keeps
// listing the values on one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event, control characters escaped.
    #[value(help = None::<&str>)]
    Text,
    /// One JSON object per event, its fields flattened, for log collectors.
    #[value(help = None::<&str>)]
    Json,
}

/// How a command prints its result on stdout (`--output`).
// `help = None`: the variant docs are for readers of the code; `--help` keeps
// listing the values on one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Output {
    /// Aligned columns for a person (the default).
    #[default]
    #[value(help = None::<&str>)]
    Table,
    /// One JSON document for scripts; fields are only ever added.
    #[value(help = None::<&str>)]
    Json,
}

/// What to run: one variant per `imagegc` subcommand, with its own flags.
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
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// Show what a cycle would do now, and why. Removes nothing.
    Plan {
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// List images with their use and the image filesystem.
    Images {
        /// Output format.
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
        /// Output format.
        #[arg(long, value_enum, default_value_t)]
        output: Output,
    },
    /// Replay a node's image usage (a synthetic workload or a trace file)
    /// under imagegc, the kubelet's algorithm and the offline bound, and
    /// compare the bytes each pulls again. Talks to no runtime.
    Simulate(SimulateArgs),
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
    /// The configuration is invalid: every problem, each naming file and key
    /// (exit status 2).
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// A flag or argument is invalid (exit status 2).
    #[error("{0}")]
    Usage(String),
    /// The runtime could not be reached or refused a call (exit status 1).
    #[error("{0}")]
    Runtime(#[from] RuntimeError),
    /// The state directory is unusable: unsafe (2), locked by another imagegc
    /// (4), or failing (1).
    #[error("{0}")]
    State(#[from] StateError),
    /// Anything else (exit status 1).
    #[error("{0}")]
    Other(#[from] anyhow::Error),
}

impl CliError {
    /// The process exit status for this error: 2 for configuration and usage
    /// errors (an unsafe state directory included), 4 when another imagegc
    /// holds the state directory, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Config(_) | CliError::Usage(_) => exit::CONFIG,
            CliError::State(StateError::Unsafe { .. }) => exit::CONFIG,
            CliError::State(StateError::Locked { .. }) => exit::LOCKED,
            CliError::Runtime(_) | CliError::State(_) | CliError::Other(_) => exit::FAILED,
        }
    }
}

/// What a successful command asks the process to exit with.
pub type ExitStatus = u8;

/// The exit statuses imagegc uses (README's "Exit codes" table is checked
/// against [`exit::ALL`]).
pub mod exit {
    /// Success.
    pub const OK: u8 = 0;
    /// The runtime could not be reached or answered with an error, or a
    /// file could not be read or written.
    pub const FAILED: u8 = 1;
    /// A configuration or usage error, or an unsafe state directory.
    pub const CONFIG: u8 = 2;
    /// `once`: the cycle ran but could not bring usage to the low threshold.
    pub const LOW_NOT_REACHED: u8 = 3;
    /// `run`, `once`: another imagegc holds the state directory's lock.
    pub const LOCKED: u8 = 4;
    /// Every status, in order.
    pub const ALL: [u8; 5] = [OK, FAILED, CONFIG, LOW_NOT_REACHED, LOCKED];
}

/// Loads the configuration from the flags.
pub fn load_config(cli: &Cli) -> Result<Config, ConfigError> {
    config::load(cli.config.as_deref(), &overrides(cli))
}

/// What the flags (and their environment variables) override of the file;
/// a reload applies them again.
pub fn overrides(cli: &Cli) -> Overrides {
    let dry_run = matches!(
        cli.command,
        Command::Run { dry_run: true } | Command::Once { dry_run: true, .. }
    );
    Overrides {
        runtime_endpoint: cli.runtime_endpoint.clone(),
        state_dir: cli.state_dir.clone(),
        dry_run,
        kubelet_config: cli.kubelet_config.clone(),
        kubelet_config_dir: cli.kubelet_config_dir.clone(),
        kubelet_args_file: cli.kubelet_args_file.clone(),
        kubernetes: cli.kubernetes,
        registry_manifests: cli.registry_manifests,
    }
}

/// Runs a command other than `run` (the daemon lives in [`crate::daemon`]).
pub async fn execute(cli: &Cli, config: Config) -> Result<ExitStatus, CliError> {
    match &cli.command {
        Command::CheckConfig => check_config(&config).await,
        Command::History { since, output } => history::history(&config, since.as_deref(), *output),
        Command::Images { output } => {
            let runtime = runtime_client(&config).await?;
            images::images(&runtime, &config, *output).await
        }
        Command::Plan { output } => {
            StateStore::new(&config.state.dir).check_dir()?;
            let cluster = PodSource::connect(&config).await?;
            let runtime = runtime_client(&config).await?;
            let (pods, warnings) = cluster.list().await?;
            plan::plan(runtime, config, (&pods, &warnings), *output).await
        }
        Command::Once { output, .. } => {
            let _lock = lock_state(&config)?;
            let cluster = PodSource::connect(&config).await?;
            let runtime = runtime_client(&config).await?;
            let (pods, _) = cluster.list().await?;
            once::once(runtime, config, pods, *output).await
        }
        Command::Simulate(args) => simulate::simulate(&config, args),
        Command::Run { .. } => unreachable!("run is handled by the daemon"),
    }
}

/// Where `once` and `plan` learn which images the pods bound to this node
/// name, when `[kubernetes]` asks for it: connected (its configuration
/// checked) before anything else, listed once right after the runtime
/// answers, as the daemon keeps them.
struct PodSource {
    #[cfg(feature = "kubernetes")]
    cluster: Option<crate::kubernetes::Cluster>,
}

impl PodSource {
    async fn connect(config: &Config) -> Result<PodSource, CliError> {
        #[cfg(feature = "kubernetes")]
        {
            let cluster = if config.kubernetes.enabled && config.kubernetes.protect_pods {
                let file = config
                    .source
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default();
                Some(crate::kubernetes::Cluster::connect(&config.kubernetes, &file).await?)
            } else {
                None
            };
            Ok(PodSource { cluster })
        }
        #[cfg(not(feature = "kubernetes"))]
        {
            let _ = config;
            Ok(PodSource {})
        }
    }

    /// The pods' keep rules, and what looks wrong (a node name that names
    /// no node, see [`crate::kubernetes::node`]): said on stderr, and
    /// returned for the output that carries it. A listing that fails stops
    /// the command: it could not tell which images a starting pod is about
    /// to run.
    async fn list(&self) -> Result<(crate::policy::Protections, Vec<String>), CliError> {
        #[cfg(feature = "kubernetes")]
        if let Some(cluster) = &self.cluster {
            return match cluster.survey().await {
                Ok(survey) => {
                    for warning in &survey.warnings {
                        eprintln!("warning: {warning}");
                    }
                    Ok((survey.pods.unwrap_or_default(), survey.warnings))
                }
                Err(err) => Err(CliError::Other(anyhow::anyhow!(
                    "cannot list the pods bound to node {} ({err}): nothing was done; set kubernetes.enabled = \
                     false to act on what the runtime says alone",
                    cluster.node()
                ))),
            };
        }
        Ok((crate::policy::Protections::default(), Vec::new()))
    }
}

/// With `[kubernetes]` on, what `check-config` says of the node's name (see
/// [`crate::kubernetes::node`]), asking the API server as `run` would
/// (at most [`crate::kubernetes::REQUEST_TIMEOUT`]). Where `run` could not
/// connect (no token outside a pod) that is said too, as a warning: the
/// file may be checked away from the node it is for.
#[cfg(feature = "kubernetes")]
async fn kubernetes_warnings(config: &Config) -> Vec<String> {
    if !config.kubernetes.enabled {
        return Vec::new();
    }
    let file = config
        .source
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let cluster = match crate::kubernetes::Cluster::connect(&config.kubernetes, &file).await {
        Ok(cluster) => cluster,
        Err(err) => return vec![format!("cannot check the node's name from here: {err}")],
    };
    match cluster.survey().await {
        Ok(survey) => survey.warnings,
        Err(err) => vec![format!(
            "cannot check the node's name: cannot list the pods bound to node {}: {err}",
            cluster.node()
        )],
    }
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

async fn check_config(config: &Config) -> Result<ExitStatus, CliError> {
    for warning in &config.warnings {
        eprintln!("warning: {warning}");
    }
    #[cfg(feature = "kubernetes")]
    for warning in kubernetes_warnings(config).await {
        eprintln!("warning: {warning}");
    }
    // Against the `imagegc run` on this state directory, if one runs: what
    // a reload (SIGHUP) would not apply, as the reload itself says.
    if let Some(running) = crate::store::state::Running::read(&config.state.dir) {
        let keys = running.keys.restart_keys(&crate::store::state::StartOnly::of(config));
        if keys.is_empty() {
            eprintln!(
                "imagegc runs on this state directory (pid {}): a reload (SIGHUP) applies every change of this file",
                running.pid
            );
        } else {
            eprintln!(
                "warning: imagegc runs on this state directory (pid {}): these keys take effect only after a \
                 restart, a reload (SIGHUP) keeps the running values: {}",
                running.pid,
                keys.join(", ")
            );
        }
    }
    // What the daemon's usage log saw others remove, when it can be read.
    if config.state.dir.join(crate::usage_log::FILE_NAME).exists() {
        match table::removed_by_others_line(&config.state.dir, crate::time::Clock::start().now()) {
            Ok(Some(line)) => eprint!("warning: {line}"),
            Ok(None) => eprintln!("no image was removed by another collector in the last 24 h (the usage log)"),
            Err(_) => {}
        }
    }
    out::text(&config.to_toml_string())?;
    Ok(0)
}

/// Standard output for every command: locked once and buffered, so a large
/// answer (`plan --output json` over 10,000 images) is a few large writes,
/// not one per value. A closed pipe (`imagegc images | head`) is an error
/// like any other write error.
mod out {
    use std::io::{BufWriter, Write};

    use super::CliError;

    /// Writes `value` as pretty JSON and a newline.
    pub fn json(value: &impl serde::Serialize) -> Result<(), CliError> {
        let mut out = BufWriter::with_capacity(64 * 1024, std::io::stdout().lock());
        serde_json::to_writer_pretty(&mut out, value).map_err(anyhow::Error::from)?;
        writeln!(out).map_err(anyhow::Error::from)?;
        out.flush().map_err(anyhow::Error::from)?;
        Ok(())
    }

    /// Writes `text` as it is.
    pub fn text(text: &str) -> Result<(), CliError> {
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes()).map_err(anyhow::Error::from)?;
        out.flush().map_err(anyhow::Error::from)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn readme_lists_every_exit_status_and_no_other() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
        let listed: Vec<String> = crate::testing::readme_table_under(&readme, "#### Exit codes");
        let codes: Vec<String> = super::exit::ALL.iter().map(u8::to_string).collect();
        assert_eq!(listed, codes, "README's exit codes table");
    }

    use super::*;

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

    /// A kubeconfig for the API server at `url`, and a configuration with
    /// `[kubernetes]` on for node `node-1` that reads it.
    #[cfg(feature = "kubernetes")]
    fn kubernetes_config(dir: &std::path::Path, url: &str) -> Config {
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"{url}\"}}}}]\n\
                 users: [{{name: u, user: {{}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\n\
                 current-context: x\n"
            ),
        )
        .unwrap();
        let mut config = Config::default();
        config.kubernetes.enabled = true;
        config.kubernetes.node_name = Some("node-1".to_owned());
        config.kubernetes.kubeconfig = Some(kubeconfig);
        config
    }

    /// `plan` and `once` against an API server that accepts and never
    /// answers: they give up after the documented 30 s, saying which API
    /// server did not answer and for how long, instead of hanging (`once`
    /// with the state directory locked).
    #[cfg(feature = "kubernetes")]
    #[tokio::test(start_paused = true)]
    async fn plan_and_once_give_up_on_an_api_server_that_never_answers() {
        use crate::kubernetes::fake_api;

        let url = fake_api::serve(|_| fake_api::Reply::Never).await;
        fake_api::keep_time_moving();
        let dir = tempfile::tempdir().unwrap();
        let config = kubernetes_config(dir.path(), &url);
        let started = tokio::time::Instant::now();
        let listed = tokio::time::timeout(std::time::Duration::from_secs(600), async {
            PodSource::connect(&config).await.unwrap().list().await
        })
        .await
        .expect("the listing gave up rather than hang");
        let err = listed.expect_err("no pods without an answer").to_string();
        assert!(
            err.contains(&format!("the API server at {url}/ did not answer within 30s")),
            "{err}"
        );
        assert!(err.contains("nothing was done"), "{err}");
        assert!(started.elapsed() <= crate::kubernetes::REQUEST_TIMEOUT + std::time::Duration::from_secs(1));
    }

    /// `check-config` with `kubernetes.node_name` a host name where the
    /// Node is `node-1`: it says so, naming the key.
    #[cfg(feature = "kubernetes")]
    #[tokio::test]
    async fn check_config_says_a_node_name_names_no_node() {
        use crate::kubernetes::fake_api;

        let api = std::sync::Arc::new(fake_api::cluster::FakeApi::default());
        api.nodes.lock().unwrap().push("node-1");
        let url = api.serve().await;
        let dir = tempfile::tempdir().unwrap();
        let mut config = kubernetes_config(dir.path(), &url);
        assert!(kubernetes_warnings(&config).await.is_empty());
        config.kubernetes.node_name = Some("ip-10-0-0-1".to_owned());
        let warnings = kubernetes_warnings(&config).await;
        assert!(
            warnings.iter().any(|w| w.starts_with(
                r#"the API server has no Node named "ip-10-0-0-1": kubernetes.node_name (or NODE_NAME) is not this node's name"#
            )),
            "{warnings:?}"
        );
        config.kubernetes.enabled = false;
        assert!(kubernetes_warnings(&config).await.is_empty());
    }
}
