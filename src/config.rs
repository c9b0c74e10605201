//! Configuration: a raw serde form that rejects unknown keys, converted into
//! a validated [`Config`] that every other module reads. Nothing downstream
//! sees the raw form.
//!
//! Three inputs are accepted by `--config FILE`: imagegc's TOML schema, the
//! same schema in YAML, and a kubelet `KubeletConfiguration` YAML whose image
//! GC fields are honoured (other kubelet fields are ignored).
//!
//! Loading never stops at the first mistake. The file is parsed into a
//! generic tree, then every key is deserialized on its own into the raw
//! section it belongs to, so each unknown key and each value of the wrong
//! type becomes its own [`Problem`]; the values that passed are then checked
//! against each other. Every problem names the file and the key as the user
//! wrote it (`gc.high_threshold_percent`, or `imageGCHighThresholdPercent` in
//! a kubelet file). This module reads files and nothing else: it does not
//! touch the runtime, the image filesystem or the state directory.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};
use serde_json::{Map, Value};

use crate::time::NEGATIVE_DURATION;
pub use crate::time::{format_duration, parse_duration};

/// The kubelet's period between image GC runs.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(300);
/// How often containers are polled between cycles when the runtime does not
/// stream container events.
pub const DEFAULT_USAGE_POLL_INTERVAL: Duration = Duration::from_secs(30);
/// What `check-config` and `run` say when container events are on.
const CONTAINER_EVENTS_WARNING: &str = "runtime.container_events is on: containerd 1.7 and CRI-O 1.26/1.27 hand each \
     container event to one subscriber only, so imagegc would take events away from the kubelet's Evented PLEG \
     there (containerd 2.x and CRI-O 1.36 give every subscriber every event); CRI-O sends events only with \
     enable_pod_events = true. Polling (the default) takes nothing from anyone";

/// Per CRI call deadline: the kubelet's default runtime request timeout.
pub const DEFAULT_RUNTIME_TIMEOUT: Duration = Duration::from_secs(120);
/// The kubelet's `imageMinimumGCAge` default.
pub const DEFAULT_MIN_AGE: Duration = Duration::from_secs(120);
/// A removed image that comes back within this window counts as a re-pull.
pub const DEFAULT_THRASH_WINDOW: Duration = Duration::from_secs(3600);
/// The shortest interval, poll interval and CRI timeout accepted: anything
/// shorter would keep the runtime busy for nothing.
const MIN_PERIOD: Duration = Duration::from_secs(1);
/// The longest interval, poll interval and CRI timeout accepted: a day
/// between cycles is already far longer than any node should wait, and a
/// bound keeps every deadline computed from them (liveness window, next
/// cycle) far from overflowing.
pub const MAX_PERIOD: Duration = Duration::from_secs(86_400);
/// The longest age or window accepted (`gc.min_age`, `gc.max_age`,
/// `gc.thrash_window`): a year, beyond which no image history is kept
/// meaningfully and clock arithmetic on it could overflow.
pub const MAX_AGE: Duration = Duration::from_secs(365 * 86_400);

/// The largest configuration file parsed, in bytes: real ones are a few
/// kilobytes, and parsing cost must stay small whatever the file holds.
pub const MAX_FILE_BYTES: usize = 1024 * 1024;
/// The deepest nesting of `[` and `{` parsed: real files nest a few levels,
/// and YAML and TOML parsers spend time quadratic in the depth.
pub const MAX_NESTING: usize = 32;

/// The `kind` that marks a kubelet configuration file.
const KUBELET_KIND: &str = "KubeletConfiguration";
/// The kubelet configuration API version whose fields imagegc knows.
const KUBELET_API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// The `file` of problems found in command-line overrides.
const COMMAND_LINE: &str = "command line";

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub runtime: RuntimeConfig,
    pub gc: GcConfig,
    pub protect: ProtectConfig,
    pub state: StateConfig,
    pub metrics: MetricsConfig,
    /// The kubelet's hard eviction threshold for the image filesystem
    /// (`evictionHard["imagefs.available"]`), when read from a
    /// KubeletConfiguration.
    pub eviction_imagefs_available: Option<EvictionThreshold>,
    /// The node's KubeletConfiguration (`kubelet.config`), read only to check
    /// that the kubelet's own image GC is off and that its eviction threshold
    /// leaves room for imagegc's high threshold.
    pub kubelet_config: Option<PathBuf>,
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
    /// Follow `GetContainerEvents` between cycles instead of polling
    /// `ListContainers`. Off by default: containerd 1.7 and CRI-O 1.26 split
    /// one event queue between subscribers, so a second subscriber takes
    /// events away from the kubelet's Evented PLEG.
    pub container_events: bool,
    /// The sandbox (pause) image, named outright: protected whatever the
    /// runtime reports (`None`: learnt from the runtime).
    pub sandbox_image: Option<String>,
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

/// A kubelet hard eviction threshold on available space: the kubelet evicts
/// pods when less than this is available.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EvictionThreshold {
    /// Percent of the filesystem's capacity (`"15%"`).
    Percent(f64),
    /// An absolute quantity (`"10Gi"`), in bytes.
    Bytes(u64),
}

impl EvictionThreshold {
    /// The bytes that must stay available on a filesystem of
    /// `capacity_bytes` (a percentage is truncated to whole bytes, as the
    /// kubelet does).
    pub fn min_available_bytes(&self, capacity_bytes: u64) -> u64 {
        match *self {
            EvictionThreshold::Percent(percent) => (capacity_bytes as f64 * percent / 100.0) as u64,
            EvictionThreshold::Bytes(bytes) => bytes,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            runtime: RuntimeConfig {
                endpoint: None,
                timeout: DEFAULT_RUNTIME_TIMEOUT,
                container_events: false,
                sandbox_image: None,
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
            eviction_imagefs_available: None,
            kubelet_config: None,
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

    /// The effective configuration in imagegc's TOML schema: every key, with
    /// the defaults filled in. Loading the text back gives an equal `Config`
    /// (apart from `source`, `warnings` and `eviction_imagefs_available`,
    /// which the schema does not carry).
    pub fn to_toml_string(&self) -> String {
        let runtime = &self.runtime;
        let gc = &self.gc;
        let protect = &self.protect;
        let images: Vec<String> = protect.images.iter().map(|image| toml_string(image)).collect();
        let path = |path: Option<&Path>| toml_string(&path.map(|p| p.to_string_lossy()).unwrap_or_default());
        format!(
            r#"[runtime]
endpoint = {endpoint}
timeout = "{timeout}"
container_events = {container_events}
sandbox_image = {sandbox_image}

[gc]
interval = "{interval}"
usage_poll_interval = "{usage_poll_interval}"
high_threshold_percent = {high}
low_threshold_percent = {low}
min_age = "{min_age}"
max_age = "{max_age}"
dry_run = {dry_run}
image_fs_path = {image_fs_path}
thrash_window = "{thrash_window}"
high_inodes_percent = {high_inodes}
low_inodes_percent = {low_inodes}

[protect]
images = [{images}]
keep_recent_per_repository = {keep_recent}

[state]
dir = {state_dir}

[metrics]
listen = {listen}

[kubelet]
config = {kubelet_config}
"#,
            endpoint = toml_string(runtime.endpoint.as_deref().unwrap_or("")),
            timeout = format_duration(runtime.timeout),
            container_events = runtime.container_events,
            sandbox_image = toml_string(runtime.sandbox_image.as_deref().unwrap_or("")),
            interval = format_duration(gc.interval),
            usage_poll_interval = format_duration(gc.usage_poll_interval),
            high = gc.high_threshold_percent,
            low = gc.low_threshold_percent,
            min_age = format_duration(gc.min_age),
            max_age = format_duration(gc.max_age),
            dry_run = gc.dry_run,
            image_fs_path = path(gc.image_fs_path.as_deref()),
            thrash_window = format_duration(gc.thrash_window),
            high_inodes = gc.high_inodes_percent.unwrap_or(0),
            low_inodes = gc.low_inodes_percent.unwrap_or(0),
            images = images.join(", "),
            keep_recent = protect.keep_recent_per_repository,
            state_dir = path(Some(&self.state.dir)),
            listen = toml_string(&self.metrics.listen.map(|addr| addr.to_string()).unwrap_or_default()),
            kubelet_config = path(self.kubelet_config.as_deref()),
        )
    }
}

/// A TOML basic string, quoted and escaped.
fn toml_string(text: &str) -> String {
    toml::Value::String(text.to_owned()).to_string()
}

/// Command-line values that override the file. Problems with them are
/// reported with the file `command line` and the flag as the key
/// (`--runtime-endpoint`, `--state-dir`).
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
/// (with overrides applied and validated). Every problem in the file and in
/// the overrides is returned at once.
pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
    let mut problems = Vec::new();
    let mut config = match path {
        None => Config::default(),
        Some(path) => {
            let mut found = Problems::new(path.display().to_string());
            let config = read_file(path, &mut found);
            // By key, so that the problems of one section read together.
            found.list.sort_by(|a, b| a.key.cmp(&b.key));
            problems.extend(found.list);
            config
        }
    };
    let mut found = Problems::new(COMMAND_LINE);
    apply_overrides(&mut config, overrides, &mut found);
    problems.extend(found.list);
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError { problems })
    }
}

/// The problems found in one source, each tagged with its name.
struct Problems {
    file: String,
    list: Vec<Problem>,
}

impl Problems {
    fn new(file: impl Into<String>) -> Self {
        Problems {
            file: file.into(),
            list: Vec::new(),
        }
    }

    fn push(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.list.push(Problem {
            file: self.file.clone(),
            key: key.into(),
            message: message.into(),
        });
    }

    /// True when `key` already has a problem: rules that compare it with
    /// another key are then skipped rather than reported twice.
    fn has(&self, key: &str) -> bool {
        self.list.iter().any(|problem| problem.key == key)
    }
}

/// The most a configuration file may hold: far beyond any real one, and
/// small enough that a wrong path (a log, a device) costs nothing.
const MAX_CONFIG_BYTES: u64 = 4 * 1024 * 1024;

/// A configuration file's text: a regular file only (a FIFO or a device
/// such as /dev/zero is refused without blocking; links are followed, as a
/// mounted ConfigMap is one), at most [`MAX_CONFIG_BYTES`], UTF-8.
fn read_text(path: &Path) -> std::io::Result<String> {
    let bytes = crate::safe_file::read_bounded(path, crate::safe_file::Links::Follow, MAX_CONFIG_BYTES)?;
    String::from_utf8(bytes).map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "it is not UTF-8 text"))
}

fn read_file(path: &Path, problems: &mut Problems) -> Config {
    let unread = Config {
        source: Some(path.to_path_buf()),
        ..Config::default()
    };
    let text = match read_text(path) {
        Ok(text) => text,
        Err(err) => {
            problems.push("", format!("cannot read the file: {err}"));
            return unread;
        }
    };
    let Some(document) = parse(detect_format(path, &text), &text, problems) else {
        return unread;
    };
    let mut config = if document.get("kind").and_then(Value::as_str) == Some(KUBELET_KIND) {
        read_kubelet(document, problems)
    } else {
        let raw = read_imagegc(document, problems);
        let mut config = build(raw, &IMAGEGC_KEYS, problems);
        if let Some(kubelet_path) = config.kubelet_config.clone() {
            cross_check_kubelet(&mut config, &kubelet_path, problems);
        }
        config
    };
    config.source = Some(path.to_path_buf());
    config
}

/// Reads the node's KubeletConfiguration named by `kubelet.config` and warns
/// when the kubelet would collect images too, or would evict pods before
/// imagegc's high threshold is reached. The kubelet file's own problems are
/// reported against that file.
fn cross_check_kubelet(config: &mut Config, kubelet_path: &Path, problems: &mut Problems) {
    let mut found = Problems::new(kubelet_path.display().to_string());
    let text = match read_text(kubelet_path) {
        Ok(text) => text,
        Err(err) => {
            problems.push(
                "kubelet.config",
                format!("cannot read {}: {err}", kubelet_path.display()),
            );
            return;
        }
    };
    let Some(document) = parse(Format::Yaml, &text, &mut found) else {
        problems.list.extend(found.list);
        return;
    };
    if document.get("kind").and_then(Value::as_str) != Some(KUBELET_KIND) {
        problems.push(
            "kubelet.config",
            format!("{} is not a {KUBELET_KIND}", kubelet_path.display()),
        );
        return;
    }
    let kubelet = read_kubelet(document, &mut found);
    problems.list.extend(found.list);
    let file = kubelet_path.display();
    if !kubelet.collection_disabled() {
        config.warnings.push(format!(
            "{file}: the kubelet's own image GC is enabled (imageGCHighThresholdPercent {}, imageMaximumGCAge {}): \
             both the kubelet and imagegc would remove images; set imageGCHighThresholdPercent: 100 and \
             imageMaximumGCAge: 0s there",
            kubelet.gc.high_threshold_percent,
            format_duration(kubelet.gc.max_age),
        ));
    }
    config.eviction_imagefs_available = kubelet.eviction_imagefs_available;
    config.warnings.extend(eviction_warning(
        "gc.high_threshold_percent",
        config.gc.high_threshold_percent,
        kubelet.eviction_imagefs_available,
        &format!("evictionHard imagefs.available in {file}:"),
    ));
}

fn apply_overrides(config: &mut Config, overrides: &Overrides, problems: &mut Problems) {
    if let Some(endpoint) = &overrides.runtime_endpoint {
        config.runtime.endpoint = check_endpoint("--runtime-endpoint", endpoint, problems);
    }
    if let Some(dir) = &overrides.state_dir {
        check_absolute("--state-dir", dir, problems);
        config.state.dir = dir.clone();
    }
    config.gc.dry_run |= overrides.dry_run;
}

// ---------------------------------------------------------------------------
// Parsing: text to a generic tree.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Toml,
    Yaml,
}

/// `.toml` is TOML; `.yaml`, `.yml` and `.json` (JSON is YAML) are YAML.
/// Any other name is TOML unless it fails to parse as TOML and reads like
/// YAML.
fn detect_format(path: &Path, text: &str) -> Format {
    let extension = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    match extension.as_deref() {
        Some("toml") => Format::Toml,
        Some("yaml" | "yml" | "json") => Format::Yaml,
        // Sniffing parses: input refused before parsing stays TOML, whose
        // parse then reports the refusal.
        _ if check_cost(text).is_ok() && toml::from_str::<toml::Table>(text).is_err() && looks_like_yaml(text) => {
            Format::Yaml
        }
        _ => Format::Toml,
    }
}

/// True when the first line that is neither blank nor a comment reads like
/// YAML (`key: value`, a `---` document start, a JSON object) rather than
/// TOML (`[section]`, `key = value`).
fn looks_like_yaml(text: &str) -> bool {
    let Some(line) = text
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with('#'))
    else {
        return false;
    };
    if line.starts_with("---") || line.starts_with('{') {
        return true;
    }
    match line.split_once(':') {
        Some((key, rest)) => !key.contains(['=', '[', ' ']) && (rest.is_empty() || rest.starts_with([' ', '\t'])),
        None => false,
    }
}

/// Parses the text into a mapping of keys; a syntax error becomes one
/// problem with its line and column.
fn parse(format: Format, text: &str, problems: &mut Problems) -> Option<Map<String, Value>> {
    if let Err(message) = check_cost(text) {
        problems.push("", message);
        return None;
    }
    let parsed = match format {
        Format::Toml => toml::from_str::<Value>(text).map_err(|err| toml_syntax_error(text, &err)),
        Format::Yaml => serde_yaml_ng::from_str::<Tree>(text)
            .map(|Tree(tree)| tree)
            .map_err(|err| yaml_syntax_error(text, &err)),
    };
    match parsed {
        Ok(Value::Object(map)) => Some(map),
        // A YAML file holding nothing but comments.
        Ok(Value::Null) => Some(Map::new()),
        Ok(other) => {
            problems.push(
                "",
                format!("expected a mapping of keys at the top level, found {other}"),
            );
            None
        }
        Err(message) => {
            problems.push("", message);
            None
        }
    }
}

/// Refuses, in one linear pass and before any parser sees it, text that
/// would cost a parser far more than a configuration file should: more than
/// [`MAX_FILE_BYTES`], or `[` / `{` nested deeper than [`MAX_NESTING`]
/// outside strings and comments (a daemon reloading on SIGHUP must not spend
/// seconds on a file of `[` characters).
fn check_cost(text: &str) -> Result<(), String> {
    if text.len() > MAX_FILE_BYTES {
        return Err(format!(
            "the file is {} bytes, more than the maximum of {MAX_FILE_BYTES} (1 MiB)",
            text.len()
        ));
    }
    let (mut depth, mut line, mut column) = (0usize, 1usize, 0usize);
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut comment = false;
    let mut previous = '\n';
    for c in text.chars() {
        column += 1;
        if c == '\n' {
            (line, column, comment) = (line + 1, 0, false);
        }
        match quote {
            _ if comment => {}
            Some('"') if escaped => escaped = false,
            Some('"') if c == '\\' => escaped = true,
            Some(open) if c == open => quote = None,
            Some(_) => {}
            None => match c {
                '#' if previous.is_whitespace() => comment = true,
                '"' => quote = Some('"'),
                // An apostrophe inside a word (YAML's `it's`) opens nothing.
                '\'' if previous.is_whitespace() || "[{,:=".contains(previous) => quote = Some('\''),
                '[' | '{' => {
                    depth += 1;
                    if depth > MAX_NESTING {
                        return Err(format!(
                            "line {line}, column {column}: more than {MAX_NESTING} levels of nesting ([ and {{)"
                        ));
                    }
                }
                ']' | '}' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
        previous = c;
    }
    Ok(())
}

fn toml_syntax_error(text: &str, err: &toml::de::Error) -> String {
    let mut message = err.message().trim().replace('\n', "; ");
    match err.span() {
        Some(span) => {
            let before = text.get(..span.start).unwrap_or(text);
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
            if message == "duplicate key"
                && let Some(key) = toml_duplicate_key(text, span)
            {
                message = format!("duplicate key {key}");
            }
            format!("line {line}, column {column}: {message}")
        }
        None => message,
    }
}

/// The full name of the key a TOML "duplicate key" error points at: the
/// key as written, under the `[table]` header above it (a repeated header
/// is named by itself).
fn toml_duplicate_key(text: &str, span: std::ops::Range<usize>) -> Option<String> {
    let key = text.get(span.clone())?.trim();
    let line_start = text.get(..span.start)?.rfind('\n').map_or(0, |at| at + 1);
    let line = text.get(line_start..)?.lines().next()?.trim_start();
    let header = |line: &str| -> Option<String> {
        let inner = line.trim().strip_prefix('[')?;
        let inner = inner.strip_prefix('[').unwrap_or(inner);
        let end = inner.find(']')?;
        Some(inner[..end].trim().to_string())
    };
    if line.starts_with('[') {
        return header(line);
    }
    let table = text
        .get(..line_start)?
        .lines()
        .rev()
        .find(|line| line.trim_start().starts_with('['))
        .and_then(header);
    Some(match table {
        Some(table) => format!("{table}.{key}"),
        None => key.to_string(),
    })
}

/// A YAML document as a JSON tree, refusing a key that appears twice in
/// one mapping (plain deserialization keeps the last silently).
struct Tree(Value);

/// Deserializes a [`Tree`] under `path`, the dotted name of its mapping.
struct TreeSeed<'a>(&'a str);

impl<'de> Deserialize<'de> for Tree {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        de::DeserializeSeed::deserialize(TreeSeed(""), deserializer)
    }
}

impl<'de> de::DeserializeSeed<'de> for TreeSeed<'_> {
    type Value = Tree;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Tree, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TreeSeed<'_> {
    type Value = Tree;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_bool<E: de::Error>(self, value: bool) -> Result<Tree, E> {
        Ok(Tree(Value::Bool(value)))
    }
    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Tree, E> {
        Ok(Tree(Value::from(value)))
    }
    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Tree, E> {
        Ok(Tree(Value::from(value)))
    }
    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Tree, E> {
        Ok(Tree(
            serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number),
        ))
    }
    fn visit_str<E: de::Error>(self, value: &str) -> Result<Tree, E> {
        Ok(Tree(Value::String(value.to_owned())))
    }
    fn visit_string<E: de::Error>(self, value: String) -> Result<Tree, E> {
        Ok(Tree(Value::String(value)))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Tree, E> {
        Ok(Tree(Value::Null))
    }
    fn visit_none<E: de::Error>(self) -> Result<Tree, E> {
        Ok(Tree(Value::Null))
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Tree, D::Error> {
        de::DeserializeSeed::deserialize(self, deserializer)
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
        let mut list = Vec::new();
        let mut index = 0;
        while let Some(Tree(item)) = seq.next_element_seed(TreeSeed(&format!("{}[{index}]", self.0)))? {
            list.push(item);
            index += 1;
        }
        Ok(Tree(Value::Array(list)))
    }
    fn visit_map<A: de::MapAccess<'de>>(self, mut access: A) -> Result<Tree, A::Error> {
        let mut map = Map::new();
        while let Some(key) = access.next_key::<String>()? {
            let path = join_key(self.0, &key);
            if map.contains_key(&key) {
                return Err(de::Error::custom(format!("{DUPLICATE_KEY}{path}")));
            }
            let Tree(value) = access.next_value_seed(TreeSeed(&path))?;
            map.insert(key, value);
        }
        Ok(Tree(Value::Object(map)))
    }
}

/// How a duplicate YAML key is reported; serde_yaml_ng puts its own path
/// before it, which [`yaml_syntax_error`] drops.
const DUPLICATE_KEY: &str = "duplicate key ";

fn yaml_syntax_error(text: &str, err: &serde_yaml_ng::Error) -> String {
    let mut message = err.to_string().replace('\n', "; ");
    let duplicate = message.find(DUPLICATE_KEY);
    if let Some(at) = duplicate {
        message.drain(..at);
    }
    match err.location() {
        Some(at) => {
            let (line, column) = (at.line(), at.column());
            // libyaml repeats the location in its message.
            let message = message.replacen(&format!(" at line {line} column {column}"), "", 1);
            // A duplicate is reported at the start of its mapping: point at
            // the second occurrence instead, when it can be found.
            let (line, column) = match message.strip_prefix(DUPLICATE_KEY) {
                Some(path) if duplicate.is_some() => {
                    second_occurrence(text, line, column, path).unwrap_or((line, column))
                }
                _ => (line, column),
            };
            format!("line {line}, column {column}: {message}")
        }
        None => message,
    }
}

/// Where a key of the block mapping that starts at `line`, `column` appears
/// for the second time. The key is the end of `path` (a key may itself hold
/// dots, so every suffix is tried). `None` for flow mappings and anything
/// this plain reading of the lines cannot follow.
fn second_occurrence(text: &str, line: usize, column: usize, path: &str) -> Option<(usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let indent = column.checked_sub(1)?;
    let mut suffixes: Vec<&str> = path.match_indices('.').map(|(at, _)| &path[at + 1..]).collect();
    suffixes.push(path);
    for key in suffixes {
        let forms = [format!("{key}:"), format!("\"{key}\":"), format!("'{key}':")];
        let mut seen = 0;
        for (index, text_line) in lines.iter().enumerate().skip(line.checked_sub(1)?) {
            let content = text_line.trim_start();
            let this_indent = text_line.len() - content.len();
            if content.is_empty() || content.starts_with('#') {
                continue;
            }
            if this_indent < indent && index >= line {
                break;
            }
            if this_indent == indent && forms.iter().any(|form| content.starts_with(form.as_str())) {
                seen += 1;
                if seen == 2 {
                    return Some((index + 1, column));
                }
            }
        }
    }
    None
}

// ---------------------------------------------------------------------------
// The raw form: what each key may hold, before values are compared.

/// imagegc's schema, one section at a time. Each section rejects unknown
/// keys; absent keys are `None`.
#[derive(Debug, Default)]
struct RawConfig {
    runtime: RawRuntime,
    gc: RawGc,
    protect: RawProtect,
    state: RawState,
    metrics: RawMetrics,
    kubelet: RawKubeletRef,
}

/// The sections of imagegc's schema, in the order of the example file.
const SECTIONS: [&str; 6] = ["runtime", "gc", "protect", "state", "metrics", "kubelet"];

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRuntime {
    endpoint: Option<String>,
    timeout: Option<RawDuration>,
    container_events: Option<bool>,
    sandbox_image: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGc {
    interval: Option<RawDuration>,
    usage_poll_interval: Option<RawDuration>,
    high_threshold_percent: Option<RawInt>,
    low_threshold_percent: Option<RawInt>,
    min_age: Option<RawDuration>,
    max_age: Option<RawDuration>,
    dry_run: Option<bool>,
    image_fs_path: Option<String>,
    thrash_window: Option<RawDuration>,
    high_inodes_percent: Option<RawInt>,
    low_inodes_percent: Option<RawInt>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProtect {
    images: Option<Vec<String>>,
    keep_recent_per_repository: Option<RawInt>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawState {
    dir: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    listen: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKubeletRef {
    config: Option<String>,
}

/// The fields of a KubeletConfiguration that imagegc reads; every other
/// kubelet field is ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawKubelet {
    api_version: Option<String>,
    #[serde(rename = "imageGCHighThresholdPercent")]
    image_gc_high_threshold_percent: Option<RawInt>,
    #[serde(rename = "imageGCLowThresholdPercent")]
    image_gc_low_threshold_percent: Option<RawInt>,
    #[serde(rename = "imageMinimumGCAge")]
    image_minimum_gc_age: Option<RawDuration>,
    #[serde(rename = "imageMaximumGCAge")]
    image_maximum_gc_age: Option<RawDuration>,
    eviction_hard: Option<BTreeMap<String, String>>,
    /// Read only for the gates of the fields above; the others are the
    /// kubelet's business and are ignored whatever they hold.
    feature_gates: Option<Map<String, Value>>,
}

/// The kubelet feature gate without which `imageMaximumGCAge` must be unset
/// or zero (beta, on by default, since Kubernetes 1.30).
const IMAGE_MAXIMUM_GC_AGE_GATE: &str = "ImageMaximumGCAge";

/// An integer of any size; ranges are checked when building the `Config`,
/// so that `-1` and `101` get "must be within" rather than a type error.
#[derive(Debug, Clone, Copy)]
struct RawInt(i64);

impl<'de> Deserialize<'de> for RawInt {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct IntVisitor;
        impl Visitor<'_> for IntVisitor {
            type Value = RawInt;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer")
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<RawInt, E> {
                Ok(RawInt(value))
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<RawInt, E> {
                Ok(RawInt(i64::try_from(value).unwrap_or(i64::MAX)))
            }
        }
        deserializer.deserialize_any(IntVisitor)
    }
}

/// A duration as written in a file: a string with units (`"5m"`, `"1h30m"`,
/// Go's `"2m0s"`), or the bare integer 0.
#[derive(Debug, Clone, Copy)]
struct RawDuration(Duration);

impl<'de> Deserialize<'de> for RawDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct DurationVisitor;
        impl DurationVisitor {
            fn bare_number<E: de::Error>(number: impl fmt::Display) -> E {
                E::custom(format!(
                    "expected a duration such as \"5m\", got the number {number}: write it with a unit, as in \"{number}s\""
                ))
            }
        }
        impl Visitor<'_> for DurationVisitor {
            type Value = RawDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as \"5m\"")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<RawDuration, E> {
                match parse_duration(text) {
                    Ok(duration) => Ok(RawDuration(duration)),
                    Err(err) if err == NEGATIVE_DURATION => {
                        Err(E::custom(format!("must not be negative, got {text:?}")))
                    }
                    Err(err) => Err(E::custom(format!("invalid duration {text:?}: {err}"))),
                }
            }
            fn visit_i64<E: de::Error>(self, value: i64) -> Result<RawDuration, E> {
                if value == 0 {
                    Ok(RawDuration(Duration::ZERO))
                } else {
                    Err(Self::bare_number(value))
                }
            }
            fn visit_u64<E: de::Error>(self, value: u64) -> Result<RawDuration, E> {
                if value == 0 {
                    Ok(RawDuration(Duration::ZERO))
                } else {
                    Err(Self::bare_number(value))
                }
            }
            fn visit_f64<E: de::Error>(self, value: f64) -> Result<RawDuration, E> {
                Err(Self::bare_number(value))
            }
        }
        deserializer.deserialize_any(DurationVisitor)
    }
}

/// Deserializes `table` into the raw section `T` one key at a time, so that
/// every unknown key and every value of the wrong type is reported under its
/// own name (`prefix.key`); the keys that passed are then deserialized
/// together.
fn read_keys<T: DeserializeOwned + Default>(prefix: &str, table: Map<String, Value>, problems: &mut Problems) -> T {
    let mut passed = Map::new();
    for (key, value) in table {
        let single = Map::from_iter([(key, value)]);
        match serde_json::from_value::<T>(Value::Object(single.clone())) {
            Ok(_) => passed.extend(single),
            Err(err) => {
                let key = single.keys().next().map(String::as_str).unwrap_or_default();
                problems.push(join_key(prefix, key), describe(&err));
            }
        }
    }
    serde_json::from_value(Value::Object(passed)).unwrap_or_else(|err| {
        problems.push(prefix, describe(&err));
        T::default()
    })
}

fn join_key(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

/// serde's message, with "unknown field `x`, expected one of `a`, `b`" said
/// as "unknown key; expected one of a, b".
fn describe(err: &serde_json::Error) -> String {
    let message = err.to_string();
    match message
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split_once("`, "))
    {
        Some((_, expected)) => format!("unknown key; {}", expected.replace('`', "")),
        None => message,
    }
}

/// Walks imagegc's schema: each top-level key must name a section holding a
/// table.
fn read_imagegc(document: Map<String, Value>, problems: &mut Problems) -> RawConfig {
    let mut raw = RawConfig::default();
    for (name, value) in document {
        if !SECTIONS.contains(&name.as_str()) {
            let message = match (name.as_str(), value.as_str()) {
                ("kind", Some(kind)) => {
                    format!("unsupported kind {kind:?}: expected imagegc's own schema (no kind) or {KUBELET_KIND}")
                }
                _ => format!("unknown key; expected one of {}", SECTIONS.join(", ")),
            };
            problems.push(&name, message);
            continue;
        }
        let table = match value {
            Value::Object(table) => table,
            Value::Null => Map::new(),
            other => {
                problems.push(
                    &name,
                    format!("must be a table of keys ([{name}] in TOML), found {other}"),
                );
                continue;
            }
        };
        match name.as_str() {
            "runtime" => raw.runtime = read_keys(&name, table, problems),
            "gc" => raw.gc = read_keys(&name, table, problems),
            "protect" => raw.protect = read_keys(&name, table, problems),
            "state" => raw.state = read_keys(&name, table, problems),
            "kubelet" => raw.kubelet = read_keys(&name, table, problems),
            _ => raw.metrics = read_keys(&name, table, problems),
        }
    }
    raw
}

/// Reads the image GC fields of a KubeletConfiguration, then builds the
/// `Config` and adds what an operator should know about running imagegc from
/// the kubelet's own file.
fn read_kubelet(document: Map<String, Value>, problems: &mut Problems) -> Config {
    let kubelet: RawKubelet = read_keys("", document, problems);
    let raw = RawConfig {
        gc: RawGc {
            high_threshold_percent: kubelet.image_gc_high_threshold_percent,
            low_threshold_percent: kubelet.image_gc_low_threshold_percent,
            min_age: kubelet.image_minimum_gc_age,
            max_age: kubelet.image_maximum_gc_age,
            ..RawGc::default()
        },
        ..RawConfig::default()
    };
    let mut config = build(raw, &KUBELET_KEYS, problems);
    let max_age_gate = match kubelet
        .feature_gates
        .as_ref()
        .and_then(|gates| gates.get(IMAGE_MAXIMUM_GC_AGE_GATE))
    {
        None => true,
        Some(Value::Bool(enabled)) => *enabled,
        Some(other) => {
            problems.push(
                format!("featureGates.{IMAGE_MAXIMUM_GC_AGE_GATE}"),
                format!("invalid type: {other}, expected true or false"),
            );
            true
        }
    };
    // As the kubelet's own validation: a maximum age needs its gate.
    if !max_age_gate && !config.gc.max_age.is_zero() && !problems.has(KUBELET_KEYS.max_age) {
        problems.push(
            KUBELET_KEYS.max_age,
            format!(
                "{} requires the {IMAGE_MAXIMUM_GC_AGE_GATE} feature gate, which featureGates turns off: the kubelet \
                 refuses this file (\"{IMAGE_MAXIMUM_GC_AGE_GATE} feature gate is required\"); set it to 0s or \
                 enable the gate",
                format_duration(config.gc.max_age)
            ),
        );
        config.gc.max_age = Duration::ZERO;
    }
    let imagefs_available = kubelet
        .eviction_hard
        .as_ref()
        .and_then(|hard| hard.get("imagefs.available"));
    if let Some(text) = imagefs_available {
        match parse_eviction_threshold(text) {
            Ok(threshold) => config.eviction_imagefs_available = Some(threshold),
            Err(message) => problems.push("evictionHard.imagefs.available", message),
        }
    }
    config.warnings = kubelet_warnings(&config, kubelet.api_version.as_deref());
    config
}

fn kubelet_warnings(config: &Config, api_version: Option<&str>) -> Vec<String> {
    let mut warnings = Vec::new();
    if let Some(version) = api_version.filter(|v| *v != KUBELET_API_VERSION) {
        warnings.push(format!(
            "apiVersion {version:?} is not {KUBELET_API_VERSION:?}; its image GC fields are read as if it were"
        ));
    }
    if config.collection_disabled() {
        warnings.push(
            "imageGCHighThresholdPercent 100 with imageMaximumGCAge 0 disables collection: imagegc will remove nothing"
                .to_owned(),
        );
        return warnings;
    }
    warnings.push(
        "this KubeletConfiguration leaves the kubelet's own image GC enabled with these settings, so both would \
         remove images; disable it in the kubelet (imageGCHighThresholdPercent: 100, imageMaximumGCAge: 0s) and \
         give imagegc its own configuration"
            .to_owned(),
    );
    warnings.extend(eviction_warning(
        "imageGCHighThresholdPercent",
        config.gc.high_threshold_percent,
        config.eviction_imagefs_available,
        "evictionHard imagefs.available",
    ));
    warnings
}

/// The warning due when collection would only start after the kubelet's
/// percentage eviction threshold for the image filesystem (sizes need the
/// measured capacity; the collector checks those).
fn eviction_warning(key: &str, high: u8, eviction: Option<EvictionThreshold>, source: &str) -> Option<String> {
    let Some(EvictionThreshold::Percent(available)) = eviction else {
        return None;
    };
    let evicts_at = 100.0 - available;
    (available > 0.0 && f64::from(high) >= evicts_at).then(|| {
        format!(
            "{key} {high}: space collection starts at {high}% usage, but {source} {available}% makes the kubelet \
             evict pods above {evicts_at}% usage; set it below {evicts_at}"
        )
    })
}

/// A kubelet eviction threshold value: a percentage (`"15%"`) or a
/// quantity (`"10Gi"`, `"500Mi"`, `"10G"`).
fn parse_eviction_threshold(text: &str) -> Result<EvictionThreshold, String> {
    let text = text.trim();
    let Some(number) = text.strip_suffix('%') else {
        return parse_quantity(text).map(EvictionThreshold::Bytes);
    };
    match number.trim().parse::<f64>() {
        Ok(percent) if (0.0..=100.0).contains(&percent) => Ok(EvictionThreshold::Percent(percent)),
        Ok(_) => Err(format!("must be within 0%..=100%, got {text:?}")),
        Err(_) => Err(format!("invalid percentage {text:?}")),
    }
}

/// A Kubernetes resource quantity in bytes: a decimal number with an
/// optional binary (`Ki` .. `Ei`), decimal (`k` .. `E`) or exponent (`e3`)
/// suffix. Fractional bytes round up, as Kubernetes does.
fn parse_quantity(text: &str) -> Result<u64, String> {
    let invalid =
        || format!("invalid quantity {text:?}: expected a percentage such as \"15%\" or a size such as \"10Gi\"");
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let value: f64 = number.parse().map_err(|_| invalid())?;
    let multiplier = match suffix {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "m" => 1e-3,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        _ => match suffix.strip_prefix(['e', 'E']).map(str::parse::<i32>) {
            Some(Ok(exponent)) => 10f64.powi(exponent),
            _ => return Err(invalid()),
        },
    };
    let bytes = (value * multiplier).ceil();
    if bytes >= u64::MAX as f64 {
        return Err(format!("quantity {text:?} is too large"));
    }
    Ok(bytes as u64)
}

// ---------------------------------------------------------------------------
// Building: raw values to a validated Config.

/// The names, as the user wrote them, of the keys a KubeletConfiguration can
/// also set. Every other key only exists in imagegc's schema.
struct KeyNames {
    high_threshold_percent: &'static str,
    low_threshold_percent: &'static str,
    min_age: &'static str,
    max_age: &'static str,
}

const IMAGEGC_KEYS: KeyNames = KeyNames {
    high_threshold_percent: "gc.high_threshold_percent",
    low_threshold_percent: "gc.low_threshold_percent",
    min_age: "gc.min_age",
    max_age: "gc.max_age",
};

const KUBELET_KEYS: KeyNames = KeyNames {
    high_threshold_percent: "imageGCHighThresholdPercent",
    low_threshold_percent: "imageGCLowThresholdPercent",
    min_age: "imageMinimumGCAge",
    max_age: "imageMaximumGCAge",
};

/// Fills in the defaults and checks every rule, reporting each broken one.
/// A key that already has a problem keeps its default and is left out of the
/// rules comparing it with other keys.
fn build(raw: RawConfig, keys: &KeyNames, problems: &mut Problems) -> Config {
    let defaults = Config::default();
    let mut config = Config::default();

    // [runtime]
    if let Some(endpoint) = &raw.runtime.endpoint {
        config.runtime.endpoint = check_endpoint("runtime.endpoint", endpoint, problems);
    }
    config.runtime.timeout = period(
        "runtime.timeout",
        raw.runtime.timeout,
        defaults.runtime.timeout,
        problems,
    );
    config.runtime.container_events = raw.runtime.container_events.unwrap_or(false);
    if config.runtime.container_events {
        config.warnings.push(CONTAINER_EVENTS_WARNING.to_string());
    }
    config.runtime.sandbox_image = match raw.runtime.sandbox_image.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(image) if image.chars().any(|c| c.is_whitespace() || c.is_control()) => {
            problems.push(
                "runtime.sandbox_image",
                format!("{image:?} is not an image reference (no spaces or control characters)"),
            );
            None
        }
        Some(image) => Some(image.to_string()),
    };

    // [gc]
    let gc = raw.gc;
    config.gc.interval = period("gc.interval", gc.interval, defaults.gc.interval, problems);
    config.gc.usage_poll_interval = match gc.usage_poll_interval {
        // Polling less often than collecting would make the poll pointless.
        None => defaults.gc.usage_poll_interval.min(config.gc.interval),
        Some(poll) => {
            let poll = period(
                "gc.usage_poll_interval",
                Some(poll),
                defaults.gc.usage_poll_interval,
                problems,
            );
            if !problems.has("gc.usage_poll_interval") && !problems.has("gc.interval") && poll > config.gc.interval {
                problems.push(
                    "gc.usage_poll_interval",
                    format!(
                        "{} must not be longer than gc.interval ({})",
                        format_duration(poll),
                        format_duration(config.gc.interval)
                    ),
                );
            }
            poll
        }
    };

    let high = percent(keys.high_threshold_percent, gc.high_threshold_percent, problems);
    let low = percent(keys.low_threshold_percent, gc.low_threshold_percent, problems);
    config.gc.high_threshold_percent = high.unwrap_or(defaults.gc.high_threshold_percent);
    config.gc.low_threshold_percent = low.unwrap_or(defaults.gc.low_threshold_percent);
    let (high, low) = (config.gc.high_threshold_percent, config.gc.low_threshold_percent);
    if !problems.has(keys.low_threshold_percent) && !problems.has(keys.high_threshold_percent) && low >= high {
        problems.push(
            keys.low_threshold_percent,
            format!("{low} must be less than {} ({high})", keys.high_threshold_percent),
        );
    }

    config.gc.min_age = age(keys.min_age, gc.min_age, defaults.gc.min_age, problems);
    config.gc.max_age = age(keys.max_age, gc.max_age, defaults.gc.max_age, problems);
    let (min_age, max_age) = (config.gc.min_age, config.gc.max_age);
    let ages_readable = !problems.has(keys.min_age) && !problems.has(keys.max_age);
    if ages_readable && !max_age.is_zero() && max_age <= min_age {
        problems.push(
            keys.max_age,
            format!(
                "{} must be greater than {} ({}), or 0s to disable age-based removal",
                format_duration(max_age),
                keys.min_age,
                format_duration(min_age)
            ),
        );
    }

    config.gc.dry_run = gc.dry_run.unwrap_or(defaults.gc.dry_run);
    config.gc.image_fs_path = gc
        .image_fs_path
        .filter(|path| !path.is_empty())
        .map(PathBuf::from)
        .filter(|path| check_absolute("gc.image_fs_path", path, problems));
    config.gc.thrash_window = age(
        "gc.thrash_window",
        gc.thrash_window,
        defaults.gc.thrash_window,
        problems,
    );
    (config.gc.high_inodes_percent, config.gc.low_inodes_percent) =
        inode_thresholds(gc.high_inodes_percent, gc.low_inodes_percent, problems);

    // [protect]
    let images = raw.protect.images.unwrap_or_default();
    for (index, image) in images.iter().enumerate() {
        if image.trim().is_empty() {
            problems.push(format!("protect.images[{index}]"), "must not be empty");
        } else if let Some(problem) = crate::reference::ProtectPattern::problem(image) {
            config
                .warnings
                .push(format!("protect.images[{index}] {image:?}: {problem}"));
        }
    }
    config.protect.images = images;
    if let Some(RawInt(keep)) = raw.protect.keep_recent_per_repository {
        const KEY: &str = "protect.keep_recent_per_repository";
        match u32::try_from(keep) {
            Ok(keep) => config.protect.keep_recent_per_repository = keep,
            Err(_) if keep < 0 => problems.push(KEY, format!("must not be negative, got {keep}")),
            Err(_) => problems.push(KEY, format!("must be at most {}, got {keep}", u32::MAX)),
        }
    }

    // [state]
    if let Some(dir) = raw.state.dir {
        let dir = PathBuf::from(dir);
        if check_absolute("state.dir", &dir, problems) {
            config.state.dir = dir;
        }
    }

    // [metrics]
    if let Some(listen) = raw.metrics.listen {
        config.metrics.listen = match listen.as_str() {
            "" => None,
            text => match parse_listen(text) {
                Some(addr) => Some(addr),
                None => {
                    problems.push(
                        "metrics.listen",
                        format!(
                            "expected an address such as \"127.0.0.1:9105\", \"[::1]:9105\", \"localhost:9105\" or \
                             \":9105\" (all interfaces), or \"\" to disable, got {text:?}"
                        ),
                    );
                    defaults.metrics.listen
                }
            },
        };
    }

    // [kubelet]
    if let Some(path) = raw.kubelet.config.filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        if check_absolute("kubelet.config", &path, problems) {
            config.kubelet_config = Some(path);
        }
    }

    config
}

/// A period that must be at least [`MIN_PERIOD`] and at most [`MAX_PERIOD`].
fn period(key: &str, value: Option<RawDuration>, default: Duration, problems: &mut Problems) -> Duration {
    match value {
        None => default,
        Some(RawDuration(d)) if d > MAX_PERIOD => {
            problems.push(key, too_long(d, MAX_PERIOD));
            default
        }
        Some(RawDuration(d)) if d >= MIN_PERIOD => d,
        Some(RawDuration(d)) => {
            problems.push(
                key,
                format!(
                    "must be at least {}, got {}",
                    format_duration(MIN_PERIOD),
                    format_duration(d)
                ),
            );
            default
        }
    }
}

/// An age or window, at most [`MAX_AGE`]; the default when absent or too
/// long (which is reported).
fn age(key: &str, value: Option<RawDuration>, default: Duration, problems: &mut Problems) -> Duration {
    match value {
        None => default,
        Some(RawDuration(d)) if d > MAX_AGE => {
            problems.push(key, too_long(d, MAX_AGE));
            default
        }
        Some(RawDuration(d)) => d,
    }
}

fn too_long(value: Duration, max: Duration) -> String {
    format!(
        "{} is more than the maximum of {}",
        format_duration(value),
        format_duration(max)
    )
}

/// A percentage within 0..=100; `None` when absent or out of range (which
/// is reported).
fn percent(key: &str, value: Option<RawInt>, problems: &mut Problems) -> Option<u8> {
    let RawInt(value) = value?;
    match u8::try_from(value) {
        Ok(percent) if percent <= 100 => Some(percent),
        _ => {
            problems.push(key, format!("must be within 0..=100, got {value}"));
            None
        }
    }
}

/// The optional inode thresholds: 0 or absent is off; when on, both must
/// be set and low must be less than high.
fn inode_thresholds(high: Option<RawInt>, low: Option<RawInt>, problems: &mut Problems) -> (Option<u8>, Option<u8>) {
    const HIGH: &str = "gc.high_inodes_percent";
    const LOW: &str = "gc.low_inodes_percent";
    let high = percent(HIGH, high, problems).filter(|p| *p > 0);
    let low = percent(LOW, low, problems).filter(|p| *p > 0);
    match (high, low) {
        (Some(high), Some(low)) if low >= high => {
            problems.push(LOW, format!("{low} must be less than {HIGH} ({high})"));
            (None, None)
        }
        (Some(_), Some(_)) => (high, low),
        (Some(_), None) if !problems.has(LOW) => {
            problems.push(LOW, format!("must be set (1..=100) when {HIGH} is set"));
            (None, None)
        }
        (None, Some(_)) if !problems.has(HIGH) => {
            problems.push(HIGH, format!("must be set (1..=100) when {LOW} is set"));
            (None, None)
        }
        _ => (None, None),
    }
}

/// `""` discovers the runtime; otherwise only `unix:///absolute/path`.
fn check_endpoint(key: &str, endpoint: &str, problems: &mut Problems) -> Option<String> {
    if endpoint.is_empty() {
        return None;
    }
    let message = match endpoint.strip_prefix("unix://") {
        Some(path) if path.len() > 1 && path.starts_with('/') => return Some(endpoint.to_owned()),
        Some(_) => format!(
            "expected unix:// followed by an absolute path, such as \"unix:///run/containerd/containerd.sock\", got \
             {endpoint:?}"
        ),
        None if endpoint.starts_with('/') => {
            format!("only unix:// endpoints are supported; write \"unix://{endpoint}\"")
        }
        None => format!("only unix:// endpoints are supported, got {endpoint:?}"),
    };
    problems.push(key, message);
    None
}

/// Reports a path that is empty or relative; true when it is absolute.
fn check_absolute(key: &str, path: &Path, problems: &mut Problems) -> bool {
    if path.as_os_str().is_empty() {
        problems.push(key, "must not be empty");
        false
    } else if !path.is_absolute() {
        problems.push(
            key,
            format!("must be an absolute path, got {:?}", path.display().to_string()),
        );
        false
    } else {
        true
    }
}

/// `IP:PORT`, `[IPv6]:PORT`, `localhost:PORT` (127.0.0.1) or `:PORT` (every
/// IPv4 interface).
fn parse_listen(text: &str) -> Option<SocketAddr> {
    if let Ok(addr) = text.parse() {
        return Some(addr);
    }
    let (host, port) = text.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    match host {
        "" => Some(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))),
        "localhost" => Some(SocketAddr::from((Ipv4Addr::LOCALHOST, port))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `text` to a file called `name` in a fresh directory and loads
    /// it; returns the path as problems print it, and the result.
    fn load_named(name: &str, text: &str, overrides: &Overrides) -> (String, Result<Config, ConfigError>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        (path.display().to_string(), load(Some(&path), overrides))
    }

    fn load_ok(name: &str, text: &str) -> Config {
        match load_named(name, text, &Overrides::default()) {
            (_, Ok(config)) => config,
            (_, Err(err)) => panic!("expected {name} to load, got:\n{err}"),
        }
    }

    fn rejected(name: &str, text: &str) -> Vec<Problem> {
        match load_named(name, text, &Overrides::default()) {
            (_, Ok(config)) => panic!("expected {name} to be rejected, got {config:?}"),
            (_, Err(err)) => err.problems,
        }
    }

    /// `kubelet.config` points at the node's KubeletConfiguration: imagegc
    /// warns while the kubelet still collects, and when it would evict first.
    #[test]
    fn kubelet_config_is_cross_checked() {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = dir.path().join("kubelet.yaml");
        let imagegc = dir.path().join("imagegc.toml");
        let write = |kubelet_text: &str, high: u8| {
            std::fs::write(&kubelet, kubelet_text).unwrap();
            std::fs::write(
                &imagegc,
                format!(
                    "[gc]\nhigh_threshold_percent = {high}\nlow_threshold_percent = 50\n[kubelet]\nconfig = {:?}\n",
                    kubelet.display().to_string()
                ),
            )
            .unwrap();
            load(Some(&imagegc), &Overrides::default())
        };
        let enabled = "kind: KubeletConfiguration\nevictionHard:\n  imagefs.available: 10%\n";
        let config = write(enabled, 92).unwrap();
        assert_eq!(config.warnings.len(), 2, "{:?}", config.warnings);
        assert!(config.warnings[0].contains("both the kubelet and imagegc would remove images"));
        assert!(config.warnings[1].contains("evict pods above 90% usage"));
        assert_eq!(config.kubelet_config.as_deref(), Some(kubelet.as_path()));
        let handed_over = "kind: KubeletConfiguration\nimageGCHighThresholdPercent: 100\nimageMaximumGCAge: 0s\n\
                           evictionHard:\n  imagefs.available: 10%\n";
        let config = write(handed_over, 85).unwrap();
        assert!(config.warnings.is_empty(), "{:?}", config.warnings);
        // The kubelet file's own problems name that file and its field.
        let err = write("kind: KubeletConfiguration\nimageGCHighThresholdPercent: 101\n", 85).unwrap_err();
        assert_eq!(err.problems[0].file, kubelet.display().to_string());
        assert_eq!(err.problems[0].key, "imageGCHighThresholdPercent");
        let err = write("kind: Pod\n", 85).unwrap_err();
        assert_eq!(err.problems[0].key, "kubelet.config");
        std::fs::remove_file(&kubelet).unwrap();
        let err = load(Some(&imagegc), &Overrides::default()).unwrap_err();
        assert_eq!(err.problems[0].key, "kubelet.config");
    }

    /// The keys named by the problems of a file, in the order reported.
    fn problem_keys(name: &str, text: &str) -> Vec<String> {
        rejected(name, text).into_iter().map(|p| p.key).collect()
    }

    fn without_source(mut config: Config) -> Config {
        config.source = None;
        config
    }

    fn kubelet(body: &str) -> String {
        format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{body}")
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    // Defaults.

    #[test]
    fn every_default() {
        let config = load(None, &Overrides::default()).unwrap();
        assert_eq!(config, Config::default());
        assert_eq!(config.runtime.endpoint, None);
        assert_eq!(config.runtime.timeout, secs(120));
        assert_eq!(config.gc.interval, secs(300));
        assert_eq!(config.gc.usage_poll_interval, secs(30));
        assert_eq!(config.gc.high_threshold_percent, 85);
        assert_eq!(config.gc.low_threshold_percent, 80);
        assert_eq!(config.gc.min_age, secs(120));
        assert_eq!(config.gc.max_age, Duration::ZERO);
        assert!(!config.gc.dry_run);
        assert_eq!(config.gc.image_fs_path, None);
        assert_eq!(config.gc.thrash_window, secs(3600));
        assert_eq!(config.gc.high_inodes_percent, None);
        assert_eq!(config.gc.low_inodes_percent, None);
        assert!(config.protect.images.is_empty());
        assert_eq!(config.protect.keep_recent_per_repository, 0);
        assert_eq!(config.state.dir, PathBuf::from("/var/lib/imagegc"));
        assert_eq!(config.metrics.listen, Some("127.0.0.1:9105".parse().unwrap()));
        assert_eq!(config.eviction_imagefs_available, None);
        assert_eq!(config.source, None);
        assert!(config.warnings.is_empty());
        assert!(!config.collection_disabled());
    }

    #[test]
    fn a_protect_pattern_that_can_match_no_image_is_warned_about_by_key() {
        let config = load_ok(
            "p.toml",
            "[protect]\nimages = [\"nginx\", \"sha256:xyz*\", \"Bitnami/Redis:*\"]\n",
        );
        assert_eq!(config.warnings.len(), 2, "{:?}", config.warnings);
        assert!(
            config.warnings[0].starts_with("protect.images[1] \"sha256:xyz*\""),
            "{:?}",
            config.warnings
        );
        assert!(
            config.warnings[1].starts_with("protect.images[2]"),
            "{:?}",
            config.warnings
        );
    }

    #[test]
    fn empty_files_give_the_defaults_and_remember_their_source() {
        for (name, text) in [
            ("a.toml", ""),
            ("b.yaml", ""),
            ("c.yaml", "# nothing here\n"),
            ("d", "\n"),
        ] {
            let config = load_ok(name, text);
            assert!(config.source.as_ref().unwrap().ends_with(name));
            assert_eq!(without_source(config), Config::default(), "{name}");
        }
    }

    const EVERY_KEY_TOML: &str = r#"
[runtime]
endpoint = "unix:///run/crio/crio.sock"
timeout = "30s"

[gc]
interval = "10m"
usage_poll_interval = "1m"
high_threshold_percent = 70
low_threshold_percent = 50
min_age = "1h"
max_age = "14d"
dry_run = true
image_fs_path = "/var/lib/containers"
thrash_window = "2h"
high_inodes_percent = 90
low_inodes_percent = 85

[protect]
images = ["registry.k8s.io/pause:*", "sha256:abc*"]
keep_recent_per_repository = 2

[state]
dir = "/run/imagegc"

[metrics]
listen = ":9200"
"#;

    const EVERY_KEY_YAML: &str = r#"
runtime:
  endpoint: unix:///run/crio/crio.sock
  timeout: 30s
gc:
  interval: 10m
  usage_poll_interval: 1m
  high_threshold_percent: 70
  low_threshold_percent: 50
  min_age: 1h
  max_age: 2w
  dry_run: true
  image_fs_path: /var/lib/containers
  thrash_window: 2h
  high_inodes_percent: 90
  low_inodes_percent: 85
protect:
  images: ["registry.k8s.io/pause:*", "sha256:abc*"]
  keep_recent_per_repository: 2
state:
  dir: /run/imagegc
metrics:
  listen: ":9200"
"#;

    #[test]
    fn every_key_is_read_from_toml() {
        let config = load_ok("imagegc.toml", EVERY_KEY_TOML);
        assert_eq!(config.runtime.endpoint.as_deref(), Some("unix:///run/crio/crio.sock"));
        assert_eq!(config.runtime.timeout, secs(30));
        assert_eq!(config.gc.interval, secs(600));
        assert_eq!(config.gc.usage_poll_interval, secs(60));
        assert_eq!(config.gc.high_threshold_percent, 70);
        assert_eq!(config.gc.low_threshold_percent, 50);
        assert_eq!(config.gc.min_age, secs(3600));
        assert_eq!(config.gc.max_age, secs(14 * 86_400));
        assert!(config.gc.dry_run);
        assert_eq!(config.gc.image_fs_path, Some(PathBuf::from("/var/lib/containers")));
        assert_eq!(config.gc.thrash_window, secs(7200));
        assert_eq!(config.gc.high_inodes_percent, Some(90));
        assert_eq!(config.gc.low_inodes_percent, Some(85));
        assert_eq!(config.protect.images, ["registry.k8s.io/pause:*", "sha256:abc*"]);
        assert_eq!(config.protect.keep_recent_per_repository, 2);
        assert_eq!(config.state.dir, PathBuf::from("/run/imagegc"));
        assert_eq!(config.metrics.listen, Some("0.0.0.0:9200".parse().unwrap()));
        assert!(config.warnings.is_empty());
    }

    #[test]
    fn the_same_schema_in_yaml_gives_the_same_config() {
        let toml = load_ok("imagegc.toml", EVERY_KEY_TOML);
        let yaml = load_ok("imagegc.yaml", EVERY_KEY_YAML);
        assert_eq!(without_source(yaml), without_source(toml));
    }

    #[test]
    fn the_format_is_sniffed_when_the_extension_does_not_tell() {
        let toml = load_ok("imagegc.conf", EVERY_KEY_TOML);
        let yaml = load_ok("imagegc", EVERY_KEY_YAML);
        assert_eq!(without_source(yaml), without_source(toml));
        let kubelet = load_ok(
            "config",
            &kubelet("imageGCHighThresholdPercent: 70\nimageGCLowThresholdPercent: 60\n"),
        );
        assert_eq!(kubelet.gc.high_threshold_percent, 70);
        let json = load_ok(
            "kubelet.json",
            r#"{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration", "imageGCLowThresholdPercent": 60}"#,
        );
        assert_eq!(json.gc.low_threshold_percent, 60);
    }

    #[test]
    fn a_short_interval_also_shortens_the_default_poll() {
        let config = load_ok("a.toml", "[gc]\ninterval = \"10s\"\n");
        assert_eq!(config.gc.usage_poll_interval, secs(10));
        let config = load_ok("b.toml", "[gc]\ninterval = \"1m\"\n");
        assert_eq!(config.gc.usage_poll_interval, secs(30));
        let config = load_ok("c.toml", "[gc]\ninterval = \"1m\"\nusage_poll_interval = \"1m\"\n");
        assert_eq!(config.gc.usage_poll_interval, secs(60));
    }

    #[test]
    fn metrics_listen_forms() {
        let cases = [
            ("", None),
            (":9105", Some("0.0.0.0:9105")),
            ("localhost:9106", Some("127.0.0.1:9106")),
            ("0.0.0.0:80", Some("0.0.0.0:80")),
            ("[::1]:9105", Some("[::1]:9105")),
            ("10.1.2.3:0", Some("10.1.2.3:0")),
        ];
        for (listen, expected) in cases {
            let config = load_ok("a.toml", &format!("[metrics]\nlisten = {listen:?}\n"));
            let expected: Option<SocketAddr> = expected.map(|addr| addr.parse().unwrap());
            assert_eq!(config.metrics.listen, expected, "{listen:?}");
        }
        for listen in [
            "localhost",
            "9105",
            "example.com:9105",
            ":99999",
            "127.0.0.1:",
            "::1:9105",
        ] {
            let keys = problem_keys("a.toml", &format!("[metrics]\nlisten = {listen:?}\n"));
            assert_eq!(keys, ["metrics.listen"], "{listen:?}");
        }
    }

    #[test]
    fn endpoints() {
        assert_eq!(load_ok("a.toml", "[runtime]\nendpoint = \"\"\n").runtime.endpoint, None);
        let problem = &rejected("a.toml", "[runtime]\nendpoint = \"/run/containerd/containerd.sock\"\n")[0];
        assert_eq!(problem.key, "runtime.endpoint");
        assert_eq!(
            problem.message,
            "only unix:// endpoints are supported; write \"unix:///run/containerd/containerd.sock\""
        );
        for endpoint in [
            "tcp://localhost:1234",
            "npipe:////./pipe/containerd",
            "unix://",
            "unix:///",
            "unix://run/x",
        ] {
            let keys = problem_keys("a.toml", &format!("[runtime]\nendpoint = {endpoint:?}\n"));
            assert_eq!(keys, ["runtime.endpoint"], "{endpoint:?}");
        }
    }

    #[test]
    fn inode_thresholds_are_off_at_zero_and_on_in_pairs() {
        let config = load_ok("a.toml", "[gc]\nhigh_inodes_percent = 0\nlow_inodes_percent = 0\n");
        assert_eq!(
            (config.gc.high_inodes_percent, config.gc.low_inodes_percent),
            (None, None)
        );
        let config = load_ok("b.toml", "[gc]\nhigh_inodes_percent = 100\nlow_inodes_percent = 1\n");
        assert_eq!(
            (config.gc.high_inodes_percent, config.gc.low_inodes_percent),
            (Some(100), Some(1))
        );
        assert!(
            !Config {
                gc: GcConfig {
                    high_threshold_percent: 100,
                    ..config.gc
                },
                ..config
            }
            .collection_disabled()
        );
        let keys = problem_keys("c.toml", "[gc]\nhigh_inodes_percent = 90\nlow_inodes_percent = 0\n");
        assert_eq!(keys, ["gc.low_inodes_percent"]);
    }

    #[test]
    fn protect_patterns_must_not_be_blank() {
        let problems = rejected("a.toml", "[protect]\nimages = [\"ok\", \" \", \"\"]\n");
        let keys: Vec<_> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["protect.images[1]", "protect.images[2]"]);
    }

    // Overrides.

    #[test]
    fn flags_override_the_file() {
        let overrides = Overrides {
            runtime_endpoint: Some("unix:///run/other.sock".to_owned()),
            state_dir: Some(PathBuf::from("/tmp/state")),
            dry_run: true,
        };
        let (_, config) = load_named("a.toml", EVERY_KEY_TOML, &overrides);
        let config = config.unwrap();
        assert_eq!(config.runtime.endpoint.as_deref(), Some("unix:///run/other.sock"));
        assert_eq!(config.state.dir, PathBuf::from("/tmp/state"));
        assert!(config.gc.dry_run);

        let no_dry_run = Overrides::default();
        let (_, config) = load_named("a.toml", EVERY_KEY_TOML, &no_dry_run);
        assert!(config.unwrap().gc.dry_run, "dry_run from the file stays on");

        let without_file = load(None, &overrides).unwrap();
        assert_eq!(without_file.runtime.endpoint.as_deref(), Some("unix:///run/other.sock"));
        assert!(without_file.gc.dry_run);
    }

    #[test]
    fn bad_flags_are_reported_with_the_file_problems() {
        let overrides = Overrides {
            runtime_endpoint: Some("tcp://10.0.0.1:1234".to_owned()),
            state_dir: Some(PathBuf::from("state")),
            dry_run: false,
        };
        let (file, result) = load_named("a.toml", "[gc]\ninterval = \"0s\"\n", &overrides);
        let lines: Vec<String> = result.unwrap_err().problems.iter().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            [
                format!("{file}: gc.interval: must be at least 1s, got 0s"),
                "command line: --runtime-endpoint: only unix:// endpoints are supported, got \"tcp://10.0.0.1:1234\""
                    .to_owned(),
                "command line: --state-dir: must be an absolute path, got \"state\"".to_owned(),
            ]
        );
    }

    // The kubelet's validation scenarios (KUBELET.md, scenario 14), in both
    // schemas.

    #[test]
    fn high_2_low_1_is_accepted() {
        let config = load_ok(
            "a.toml",
            "[gc]\nhigh_threshold_percent = 2\nlow_threshold_percent = 1\n",
        );
        assert_eq!(
            (config.gc.high_threshold_percent, config.gc.low_threshold_percent),
            (2, 1)
        );
        let config = load_ok(
            "k.yaml",
            &kubelet("imageGCHighThresholdPercent: 2\nimageGCLowThresholdPercent: 1\n"),
        );
        assert_eq!(
            (config.gc.high_threshold_percent, config.gc.low_threshold_percent),
            (2, 1)
        );
    }

    #[test]
    fn thresholds_out_of_range_are_rejected_naming_the_field() {
        for value in [-1, 101] {
            for (toml_key, kubelet_key) in [
                ("high_threshold_percent", "imageGCHighThresholdPercent"),
                ("low_threshold_percent", "imageGCLowThresholdPercent"),
            ] {
                let problems = rejected("a.toml", &format!("[gc]\n{toml_key} = {value}\n"));
                assert_eq!(problems.len(), 1, "{problems:?}");
                assert_eq!(problems[0].key, format!("gc.{toml_key}"));
                assert_eq!(problems[0].message, format!("must be within 0..=100, got {value}"));

                let problems = rejected("k.yaml", &kubelet(&format!("{kubelet_key}: {value}\n")));
                assert_eq!(problems.len(), 1, "{problems:?}");
                assert_eq!(problems[0].key, kubelet_key);
            }
        }
    }

    #[test]
    fn low_above_high_is_rejected_naming_the_field() {
        let (file, result) = load_named(
            "imagegc.toml",
            "[gc]\nhigh_threshold_percent = 85\nlow_threshold_percent = 90\n",
            &Overrides::default(),
        );
        assert_eq!(
            result.unwrap_err().to_string(),
            format!("{file}: gc.low_threshold_percent: 90 must be less than gc.high_threshold_percent (85)")
        );
        let keys = problem_keys(
            "k.yaml",
            &kubelet("imageGCHighThresholdPercent: 10\nimageGCLowThresholdPercent: 20\n"),
        );
        assert_eq!(keys, ["imageGCLowThresholdPercent"]);
    }

    #[test]
    fn a_bad_threshold_is_not_also_compared_with_the_other() {
        let keys = problem_keys(
            "a.toml",
            "[gc]\nhigh_threshold_percent = -1\nlow_threshold_percent = 80\n",
        );
        assert_eq!(keys, ["gc.high_threshold_percent"]);
        let keys = problem_keys(
            "b.toml",
            "[gc]\nhigh_threshold_percent = \"50\"\nlow_threshold_percent = 80\n",
        );
        assert_eq!(keys, ["gc.high_threshold_percent"]);
        let keys = problem_keys("c.toml", "[gc]\nmin_age = \"1x\"\nmax_age = \"1m\"\n");
        assert_eq!(keys, ["gc.min_age"]);
    }

    #[test]
    fn max_age_rules() {
        assert_eq!(
            load_ok("a.toml", "[gc]\nmin_age = \"2m\"\nmax_age = \"0s\"\n")
                .gc
                .max_age,
            Duration::ZERO
        );
        assert_eq!(
            load_ok("b.toml", "[gc]\nmin_age = \"2m\"\nmax_age = \"2m1s\"\n")
                .gc
                .max_age,
            secs(121)
        );
        assert_eq!(
            load_ok("c.toml", "[gc]\nmin_age = 0\nmax_age = \"1s\"\n").gc.min_age,
            Duration::ZERO
        );
        let problems = rejected("d.toml", "[gc]\nmin_age = \"1h\"\nmax_age = \"30m\"\n");
        assert_eq!(problems[0].key, "gc.max_age");
        assert_eq!(
            problems[0].message,
            "30m must be greater than gc.min_age (1h), or 0s to disable age-based removal"
        );
    }

    // KubeletConfiguration.

    const KUBELET_FILE: &str = r#"
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
cgroupDriver: systemd
clusterDNS:
- 10.96.0.10
containerRuntimeEndpoint: unix:///var/run/containerd/containerd.sock
evictionHard:
  memory.available: 100Mi
  nodefs.available: 10%
  imagefs.available: 10%
featureGates:
  ImageMaximumGCAge: true
imageGCHighThresholdPercent: 75
imageGCLowThresholdPercent: 60
imageMinimumGCAge: 5m0s
imageMaximumGCAge: 168h0m0s
maxPods: 110
rotateCertificates: true
staticPodPath: /etc/kubernetes/manifests
"#;

    #[test]
    fn kubelet_image_gc_fields_are_honoured_and_the_rest_ignored() {
        let config = load_ok("config.yaml", KUBELET_FILE);
        assert_eq!(config.gc.high_threshold_percent, 75);
        assert_eq!(config.gc.low_threshold_percent, 60);
        assert_eq!(config.gc.min_age, secs(300));
        assert_eq!(config.gc.max_age, secs(168 * 3600));
        assert_eq!(
            config.eviction_imagefs_available,
            Some(EvictionThreshold::Percent(10.0))
        );
        let defaults = Config::default();
        assert_eq!(
            config.runtime, defaults.runtime,
            "containerRuntimeEndpoint is the kubelet's, not imagegc's"
        );
        assert_eq!(config.gc.interval, defaults.gc.interval);
        assert_eq!(config.state, defaults.state);
        assert_eq!(config.metrics, defaults.metrics);
    }

    #[test]
    fn brackets_in_strings_and_comments_are_not_nesting() {
        let many = "[".repeat(MAX_NESTING * 2);
        let toml = format!("# {many}\n[protect]\nimages = [\"{many}\", '{many}'] # {many}\n");
        assert!(check_cost(&toml).is_ok());
        let yaml = format!("# {many}\nprotect:\n  images: [\"a\\\"{many}\", '{many}', it's]\n");
        assert!(check_cost(&yaml).is_ok());
        let nested = format!("a = {}{}", "[".repeat(MAX_NESTING), "]".repeat(MAX_NESTING));
        assert!(check_cost(&nested).is_ok(), "{MAX_NESTING} levels are allowed");
        assert!(check_cost(&format!("a = [{nested}]")).is_err());
    }

    #[test]
    fn feature_gates_are_read_as_the_kubelet_does() {
        // On by default (beta since 1.30), and other gates are the kubelet's business.
        let config = load_ok(
            "k.yaml",
            &kubelet("featureGates:\n  SomeFutureGate: true\n  Other: 3\nimageMaximumGCAge: 1h\n"),
        );
        assert_eq!(config.gc.max_age, secs(3600));
        let config = load_ok(
            "k.yaml",
            &kubelet("featureGates:\n  ImageMaximumGCAge: true\nimageMaximumGCAge: 1h\n"),
        );
        assert_eq!(config.gc.max_age, secs(3600));
        // Off, the kubelet only accepts an unset or zero maximum age.
        let config = load_ok(
            "k.yaml",
            &kubelet("featureGates:\n  ImageMaximumGCAge: false\nimageMaximumGCAge: 0s\n"),
        );
        assert_eq!(config.gc.max_age, Duration::ZERO);
        let problems = rejected(
            "k.yaml",
            &kubelet("featureGates:\n  ImageMaximumGCAge: false\nimageMaximumGCAge: 1h\n"),
        );
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].key, "imageMaximumGCAge");
        assert!(
            problems[0].message.contains("feature gate is required"),
            "{}",
            problems[0]
        );
    }

    #[test]
    fn a_kubelet_file_without_image_gc_fields_gives_the_kubelet_defaults() {
        let config = load_ok("config.yaml", &kubelet("maxPods: 110\n"));
        let defaults = Config::default();
        assert_eq!(config.gc, defaults.gc);
    }

    #[test]
    fn kubelet_fields_of_the_wrong_type_are_named() {
        let problems = rejected(
            "config.yaml",
            &kubelet("imageGCHighThresholdPercent: high\nimageMinimumGCAge: 120\nevictionHard: 15%\nmaxPods: lots\n"),
        );
        let keys: Vec<_> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            ["evictionHard", "imageGCHighThresholdPercent", "imageMinimumGCAge"]
        );
        assert!(
            problems[2].message.contains("expected a duration such as \"5m\""),
            "{}",
            problems[2]
        );
    }

    #[test]
    fn the_kubelet_still_collecting_is_a_warning() {
        let config = load_ok(
            "config.yaml",
            &kubelet("imageGCHighThresholdPercent: 80\nimageGCLowThresholdPercent: 70\n"),
        );
        assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
        assert!(
            config.warnings[0].contains("kubelet's own image GC enabled"),
            "{:?}",
            config.warnings
        );
    }

    #[test]
    fn a_kubelet_file_that_disables_collection_is_a_warning() {
        let config = load_ok(
            "config.yaml",
            &kubelet("imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 80\nimageMaximumGCAge: 0s\n"),
        );
        assert!(config.collection_disabled());
        assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
        assert!(
            config.warnings[0].contains("disables collection"),
            "{:?}",
            config.warnings
        );
    }

    #[test]
    fn eviction_before_the_high_threshold_is_a_warning() {
        let eviction_warnings = |high: u8, available: &str| {
            let body = format!(
                "imageGCHighThresholdPercent: {high}\nimageGCLowThresholdPercent: 50\nevictionHard:\n  imagefs.available: {available:?}\n"
            );
            let config = load_ok("config.yaml", &kubelet(&body));
            config
                .warnings
                .into_iter()
                .filter(|w| w.contains("evictionHard"))
                .collect::<Vec<_>>()
        };
        let warnings = eviction_warnings(85, "15%");
        assert_eq!(warnings.len(), 1);
        assert_eq!(
            warnings[0],
            "imageGCHighThresholdPercent 85: space collection starts at 85% usage, but evictionHard \
             imagefs.available 15% makes the kubelet evict pods above 85% usage; set it below 85"
        );
        assert_eq!(eviction_warnings(90, "15%").len(), 1);
        assert_eq!(eviction_warnings(84, "15%").len(), 0);
        assert_eq!(eviction_warnings(85, "10%").len(), 0);
        assert_eq!(
            eviction_warnings(95, "10Gi").len(),
            0,
            "a size cannot be compared without the capacity"
        );
    }

    #[test]
    fn an_eviction_size_is_kept_in_bytes() {
        let config = load_ok("config.yaml", &kubelet("evictionHard:\n  imagefs.available: 10Gi\n"));
        assert_eq!(
            config.eviction_imagefs_available,
            Some(EvictionThreshold::Bytes(10 << 30))
        );
    }

    #[test]
    fn eviction_threshold_values() {
        let cases = [
            ("15%", EvictionThreshold::Percent(15.0)),
            ("7.5%", EvictionThreshold::Percent(7.5)),
            ("0%", EvictionThreshold::Percent(0.0)),
            ("1Gi", EvictionThreshold::Bytes(1 << 30)),
            ("500Mi", EvictionThreshold::Bytes(500 << 20)),
            ("1.5Gi", EvictionThreshold::Bytes(3 << 29)),
            ("10G", EvictionThreshold::Bytes(10_000_000_000)),
            ("2k", EvictionThreshold::Bytes(2_000)),
            ("1Ki", EvictionThreshold::Bytes(1_024)),
            ("1e9", EvictionThreshold::Bytes(1_000_000_000)),
            ("1E3", EvictionThreshold::Bytes(1_000)),
            ("1Ti", EvictionThreshold::Bytes(1 << 40)),
            ("12345", EvictionThreshold::Bytes(12_345)),
            ("1500m", EvictionThreshold::Bytes(2)),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_eviction_threshold(text), Ok(expected), "{text}");
        }
        for text in ["", "lots", "-1Gi", "10GB", "150%", "-5%", "abc%", "1.2.3Gi", "20Ei"] {
            assert!(parse_eviction_threshold(text).is_err(), "{text}");
        }
        assert_eq!(EvictionThreshold::Percent(10.0).min_available_bytes(1000), 100);
        assert_eq!(EvictionThreshold::Bytes(42).min_available_bytes(1000), 42);
    }

    #[test]
    fn another_kubelet_api_version_is_a_warning() {
        let config = load_ok(
            "config.yaml",
            "apiVersion: kubelet.config.k8s.io/v1alpha9\nkind: KubeletConfiguration\nimageGCHighThresholdPercent: 90\n",
        );
        assert!(config.warnings[0].contains("v1alpha9"), "{:?}", config.warnings);
        assert_eq!(config.gc.high_threshold_percent, 90);
    }

    // All problems at once, named as written.

    #[test]
    fn every_problem_is_reported_at_once() {
        let text = "[gc]\nhigh_threshold_percent = 101\nmin_age = \"soon\"\n[metrics]\nlisten = \"nowhere\"\n";
        let keys = problem_keys("a.toml", text);
        assert_eq!(keys, ["gc.high_threshold_percent", "gc.min_age", "metrics.listen"]);
    }

    #[test]
    fn every_unknown_key_is_reported_at_once() {
        let text = "[gc]\nhihg_threshold_percent = 90\nlow = 1\n[runtime]\nsocket = \"x\"\n[garbage]\n";
        let keys = problem_keys("a.toml", text);
        assert_eq!(
            keys,
            ["garbage", "gc.hihg_threshold_percent", "gc.low", "runtime.socket"]
        );
    }

    #[test]
    fn unknown_keys_list_the_known_ones() {
        let problem = &rejected("a.toml", "[state]\ndirectory = \"/x\"\n")[0];
        assert_eq!(problem.key, "state.directory");
        assert_eq!(problem.message, "unknown key; expected dir");
        let problem = &rejected("a.toml", "[metric]\n")[0];
        assert_eq!(
            problem.message,
            "unknown key; expected one of runtime, gc, protect, state, metrics, kubelet"
        );
        let problem = &rejected("a.toml", "[runtime]\nsocket = \"x\"\n")[0];
        assert_eq!(
            problem.message,
            "unknown key; expected one of endpoint, timeout, container_events, sandbox_image"
        );
    }

    #[test]
    fn container_events_are_off_unless_asked_for_and_then_warned_about() {
        let config = load_ok("c.toml", "");
        assert!(!config.runtime.container_events);
        assert!(config.warnings.is_empty(), "{:?}", config.warnings);
        let config = load_ok("c.toml", "[runtime]\ncontainer_events = true\n");
        assert!(config.runtime.container_events);
        assert!(
            config
                .warnings
                .iter()
                .any(|w| w.contains("containerd 1.7") && w.contains("CRI-O 1.26")),
            "{:?}",
            config.warnings
        );
    }

    #[test]
    fn the_sandbox_image_can_be_named_outright() {
        let config = load_ok("c.toml", "[runtime]\nsandbox_image = \"registry.k8s.io/pause:3.10\"\n");
        assert_eq!(
            config.runtime.sandbox_image.as_deref(),
            Some("registry.k8s.io/pause:3.10")
        );
        assert_eq!(
            load_ok("c.toml", "[runtime]\nsandbox_image = \"\"\n")
                .runtime
                .sandbox_image,
            None
        );
        let problem = &rejected("c.toml", "[runtime]\nsandbox_image = \"pause 3\"\n")[0];
        assert_eq!(problem.key, "runtime.sandbox_image");
    }

    #[test]
    fn values_that_passed_are_kept_beside_bad_ones() {
        let keys = problem_keys(
            "a.toml",
            "[gc]\nhigh_threshold_percent = 90\nlow_threshold_percent = 95\nbogus = 1\n",
        );
        assert_eq!(keys, ["gc.bogus", "gc.low_threshold_percent"]);
    }

    #[test]
    fn syntax_errors_give_line_and_column() {
        let problems = rejected("a.toml", "[gc]\ndry_run = true\nmin_age = \"2m\n");
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].key, "");
        assert!(
            problems[0].message.starts_with("line 3, column 14: "),
            "{}",
            problems[0]
        );
        assert!(!problems[0].message.contains('\n'));

        let problems = rejected("a.yaml", "gc:\n  dry_run: true\n   min_age: 2m\n");
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].message.starts_with("line 3, column 11: "),
            "{}",
            problems[0]
        );
        assert!(!problems[0].message.contains('\n'));
    }

    #[test]
    fn durations_in_files() {
        let config = load_ok("a.toml", "[gc]\nmin_age = 0\nmax_age = \"1h0m0s\"\n");
        assert_eq!((config.gc.min_age, config.gc.max_age), (Duration::ZERO, secs(3600)));
        let problem = &rejected("a.toml", "[gc]\ninterval = 300\n")[0];
        assert_eq!(problem.key, "gc.interval");
        assert_eq!(
            problem.message,
            "expected a duration such as \"5m\", got the number 300: write it with a unit, as in \"300s\""
        );
        let problem = &rejected("a.toml", "[gc]\nmin_age = \"-1m\"\n")[0];
        assert_eq!(problem.message, "must not be negative, got \"-1m\"");
        let problem = &rejected("a.yaml", "gc:\n  min_age: abc\n")[0];
        assert_eq!(
            problem.message,
            "invalid duration \"abc\": expected a number at \"abc\""
        );
        let config = load_ok("k.yaml", &kubelet("imageMinimumGCAge: 0\nimageMaximumGCAge: 0s\n"));
        assert_eq!(config.gc.min_age, Duration::ZERO);
    }

    // The effective configuration.

    #[test]
    fn the_effective_configuration_loads_back_equal() {
        let mut custom = load_ok("imagegc.toml", EVERY_KEY_TOML);
        custom.protect.images.push("quote \" and backslash \\".to_owned());
        custom.gc.min_age = Duration::from_millis(1500);
        custom.metrics.listen = Some("[::1]:9105".parse().unwrap());
        let mut off = Config::default();
        off.metrics.listen = None;
        for config in [Config::default(), without_source(custom), off] {
            let text = config.to_toml_string();
            let mut loaded = load_ok("effective.toml", &text);
            // The odd pattern is warned about (it can match no image); the
            // warnings are not part of the effective configuration.
            loaded.warnings.clear();
            assert_eq!(without_source(loaded), config, "{text}");
        }
    }

    #[test]
    fn the_effective_configuration_names_every_key() {
        let text = Config::default().to_toml_string();
        let table: toml::Table = toml::from_str(&text).unwrap();
        let mut keys = Vec::new();
        for (section, value) in &table {
            for key in value.as_table().unwrap().keys() {
                keys.push(format!("{section}.{key}"));
            }
        }
        assert_eq!(keys.len(), 20, "{keys:?}");
        assert!(text.contains("container_events = false\n"));
        assert!(text.contains("sandbox_image = \"\"\n"));
        assert!(text.contains("endpoint = \"\"\n"));
        assert!(text.contains("max_age = \"0s\"\n"));
        assert!(text.contains("high_inodes_percent = 0\n"));
        assert!(text.contains("listen = \"127.0.0.1:9105\"\n"));
    }

    #[test]
    fn a_kubelet_configuration_prints_in_imagegc_schema() {
        let config = load_ok("config.yaml", KUBELET_FILE);
        let loaded = load_ok("effective.toml", &config.to_toml_string());
        assert_eq!(loaded.gc, config.gc);
    }

    // The example files.

    fn example(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("config").join(name)
    }

    #[test]
    fn the_example_imagegc_toml_holds_the_defaults() {
        let path = example("imagegc.toml");
        let config = load(Some(&path), &Overrides::default()).unwrap();
        assert_eq!(config.source.as_deref(), Some(path.as_path()));
        assert_eq!(without_source(config), Config::default());
    }

    #[test]
    fn the_example_kubelet_config_loads() {
        let path = example("kubelet-config.yaml");
        let config = load(Some(&path), &Overrides::default()).unwrap();
        assert_eq!(config.gc.high_threshold_percent, 85);
        assert_eq!(config.gc.low_threshold_percent, 80);
        assert_eq!(
            config.eviction_imagefs_available,
            Some(EvictionThreshold::Percent(10.0))
        );
        assert_eq!(
            config.warnings.len(),
            1,
            "only the kubelet still collecting: {:?}",
            config.warnings
        );
    }
}
