//! Validation: the raw values that passed `raw` to a validated [`Config`],
//! with the defaults filled in and every rule checked.
//!
//! It owns the bounds of each value (periods, ages, percentages, paths,
//! endpoints, the metrics address), the rules that compare keys (low below
//! high, maximum age above minimum age, the poll no longer than the cycle),
//! and the warnings about values that are allowed but risky. It reports
//! every broken rule rather than stopping at the first, and a key that
//! already has a problem keeps its default and is left out of the rules
//! comparing it with other keys, so one mistake is reported once. It must
//! not read files or know the file's format.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::raw::{
    RawConfig, RawDuration, RawGc, RawInt, RawKubeletRef, RawKubernetes, RawMetrics, RawRuntime, RawState,
};
use super::{
    Config, DEFAULT_HIGH_THRESHOLD_PERCENT, DEFAULT_LOW_THRESHOLD_PERCENT, GcConfig,
    KUBELET_DEFAULT_THRESHOLDS_PERCENT, KubernetesConfig, MetricsConfig, Order, Problems, ProtectConfig, RuntimeConfig,
    StateConfig,
};
use crate::time::format_duration;

/// What `check-config` and `run` say when container events are on.
const CONTAINER_EVENTS_WARNING: &str = "runtime.container_events is on: containerd 1.7 and CRI-O 1.26/1.27 hand each \
     container event to one subscriber only, so imagegc would take events away from the kubelet's Evented PLEG \
     there (containerd 2.x and CRI-O 1.36 give every subscriber every event); CRI-O sends events only with \
     enable_pod_events = true. Polling (the default) takes nothing from anyone";

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

/// The names, as the user wrote them, of the keys a KubeletConfiguration can
/// also set. Every other key only exists in imagegc's schema.
pub(super) struct KeyNames {
    pub(super) high_threshold_percent: &'static str,
    pub(super) low_threshold_percent: &'static str,
    pub(super) min_age: &'static str,
    pub(super) max_age: &'static str,
    /// The high and low thresholds a file that sets neither means: imagegc's
    /// own defaults, or the kubelet's in a KubeletConfiguration, which is
    /// read as the kubelet reads it.
    pub(super) default_thresholds: (u8, u8),
}

pub(super) const IMAGEGC_KEYS: KeyNames = KeyNames {
    high_threshold_percent: "gc.high_threshold_percent",
    low_threshold_percent: "gc.low_threshold_percent",
    min_age: "gc.min_age",
    max_age: "gc.max_age",
    default_thresholds: (DEFAULT_HIGH_THRESHOLD_PERCENT, DEFAULT_LOW_THRESHOLD_PERCENT),
};

pub(super) const KUBELET_KEYS: KeyNames = KeyNames {
    high_threshold_percent: "imageGCHighThresholdPercent",
    low_threshold_percent: "imageGCLowThresholdPercent",
    min_age: "imageMinimumGCAge",
    max_age: "imageMaximumGCAge",
    default_thresholds: KUBELET_DEFAULT_THRESHOLDS_PERCENT,
};

/// Fills in the defaults and checks every rule, section by section,
/// reporting each broken one.
pub(super) fn build(raw: RawConfig, keys: &KeyNames, problems: &mut Problems) -> Config {
    let defaults = Config::default();
    let mut warnings = Vec::new();
    let runtime = runtime_section(&raw.runtime, &defaults.runtime, &mut warnings, problems);
    let gc = gc_section(raw.gc, &defaults.gc, keys, problems);
    let protect = ProtectConfig::validate(raw.protect, &mut warnings, problems);
    let state = state_section(raw.state, &defaults.state, problems);
    let metrics = metrics_section(&raw.metrics, &defaults.metrics, problems);
    let (kubelet_config, kubelet_config_dir, kubelet_args_file) = kubelet_section(raw.kubelet, problems);
    let kubernetes = kubernetes_section(raw.kubernetes, problems);
    if gc.order == Order::Auto && !state.usage_log {
        warnings.push(format!(
            "gc.order = \"auto\" judges the orders on the usage log, which state.usage_log = false turns off: \
             \"{}\" runs",
            Order::PRIOR.as_str()
        ));
    }
    Config {
        runtime,
        gc,
        protect,
        state,
        metrics,
        kubelet_config,
        kubelet_config_dir,
        kubelet_args_file,
        kubernetes,
        warnings,
        ..defaults
    }
}

/// `[runtime]`.
fn runtime_section(
    raw: &RawRuntime,
    defaults: &RuntimeConfig,
    warnings: &mut Vec<String>,
    problems: &mut Problems,
) -> RuntimeConfig {
    let endpoint = match &raw.endpoint {
        Some(endpoint) => check_endpoint("runtime.endpoint", endpoint, problems),
        None => defaults.endpoint.clone(),
    };
    let timeout = period("runtime.timeout", raw.timeout, defaults.timeout, problems);
    let container_events = raw.container_events.unwrap_or(false);
    if container_events {
        warnings.push(CONTAINER_EVENTS_WARNING.to_string());
    }
    RuntimeConfig {
        endpoint,
        timeout,
        container_events,
        sandbox_image: sandbox_image(raw.sandbox_image.as_deref(), problems),
    }
}

/// `runtime.sandbox_image`: `None` when absent or blank (learnt from the
/// runtime), or when it cannot be an image reference (which is reported).
fn sandbox_image(image: Option<&str>, problems: &mut Problems) -> Option<String> {
    match image.map(str::trim) {
        None | Some("") => None,
        Some(image) if image.chars().any(|c| c.is_whitespace() || c.is_control()) => {
            problems.push(
                "runtime.sandbox_image",
                format!("{image:?} is not an image reference (no spaces or control characters)"),
            );
            None
        }
        Some(image) => Some(image.to_string()),
    }
}

/// `[gc]`, or a KubeletConfiguration's image GC fields (named by `keys`).
fn gc_section(raw: RawGc, defaults: &GcConfig, keys: &KeyNames, problems: &mut Problems) -> GcConfig {
    let (interval, usage_poll_interval) = intervals(raw.interval, raw.usage_poll_interval, defaults, problems);
    let (high_threshold_percent, low_threshold_percent) =
        thresholds(raw.high_threshold_percent, raw.low_threshold_percent, keys, problems);
    let (min_age, max_age) = ages(raw.min_age, raw.max_age, defaults, keys, problems);
    let image_fs_path = raw
        .image_fs_path
        .filter(|path| !path.is_empty())
        .map(PathBuf::from)
        .filter(|path| check_absolute("gc.image_fs_path", path, problems));
    let thrash_window = age("gc.thrash_window", raw.thrash_window, defaults.thrash_window, problems);
    let order = match raw.order.as_deref().map(str::trim) {
        None => defaults.order,
        Some(text) => Order::parse(text).unwrap_or_else(|| {
            problems.push(
                "gc.order",
                format!("must be \"auto\", \"lru\", \"superseded-first\" or \"reuse\", got {text:?}"),
            );
            defaults.order
        }),
    };
    let (high_inodes_percent, low_inodes_percent) =
        inode_thresholds(raw.high_inodes_percent, raw.low_inodes_percent, problems);
    GcConfig {
        interval,
        usage_poll_interval,
        high_threshold_percent,
        low_threshold_percent,
        min_age,
        max_age,
        dry_run: raw.dry_run.unwrap_or(defaults.dry_run),
        image_fs_path,
        thrash_window,
        order,
        headroom: raw.headroom.unwrap_or(defaults.headroom),
        high_inodes_percent,
        low_inodes_percent,
    }
}

/// `gc.interval`, and `gc.usage_poll_interval`, which must not be longer.
fn intervals(
    interval: Option<RawDuration>,
    poll: Option<RawDuration>,
    defaults: &GcConfig,
    problems: &mut Problems,
) -> (Duration, Duration) {
    let interval = period("gc.interval", interval, defaults.interval, problems);
    let poll = match poll {
        // Polling less often than collecting would make the poll pointless.
        None => defaults.usage_poll_interval.min(interval),
        Some(poll) => {
            let poll = period(
                "gc.usage_poll_interval",
                Some(poll),
                defaults.usage_poll_interval,
                problems,
            );
            if !problems.has("gc.usage_poll_interval") && !problems.has("gc.interval") && poll > interval {
                problems.push(
                    "gc.usage_poll_interval",
                    format!(
                        "{} must not be longer than gc.interval ({})",
                        format_duration(poll),
                        format_duration(interval)
                    ),
                );
            }
            poll
        }
    };
    (interval, poll)
}

/// The high and low space thresholds: low must be less than high. Unset,
/// they are `keys`' defaults (imagegc's, or the kubelet's).
fn thresholds(high: Option<RawInt>, low: Option<RawInt>, keys: &KeyNames, problems: &mut Problems) -> (u8, u8) {
    let high = percent(keys.high_threshold_percent, high, problems);
    let low = percent(keys.low_threshold_percent, low, problems);
    let (default_high, default_low) = keys.default_thresholds;
    let high = high.unwrap_or(default_high);
    let low = low.unwrap_or(default_low);
    if !problems.has(keys.low_threshold_percent) && !problems.has(keys.high_threshold_percent) && low >= high {
        problems.push(
            keys.low_threshold_percent,
            format!("{low} must be less than {} ({high})", keys.high_threshold_percent),
        );
    }
    (high, low)
}

/// The minimum and maximum ages: a maximum, unless 0 (off), must be greater
/// than the minimum.
fn ages(
    min_age: Option<RawDuration>,
    max_age: Option<RawDuration>,
    defaults: &GcConfig,
    keys: &KeyNames,
    problems: &mut Problems,
) -> (Duration, Duration) {
    let min_age = age(keys.min_age, min_age, defaults.min_age, problems);
    let max_age = age(keys.max_age, max_age, defaults.max_age, problems);
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
    (min_age, max_age)
}

/// `[state]`: an absolute directory, and whether the usage log is kept.
fn state_section(raw: RawState, defaults: &StateConfig, problems: &mut Problems) -> StateConfig {
    let dir = match raw.dir.map(PathBuf::from) {
        Some(dir) if check_absolute("state.dir", &dir, problems) => dir,
        _ => defaults.dir.clone(),
    };
    StateConfig {
        dir,
        usage_log: raw.usage_log.unwrap_or(defaults.usage_log),
    }
}

/// `[metrics]`: an address to listen on, or `""` for none.
fn metrics_section(raw: &RawMetrics, defaults: &MetricsConfig, problems: &mut Problems) -> MetricsConfig {
    let listen = match raw.listen.as_deref() {
        None => defaults.listen,
        Some("") => None,
        Some(text) => match parse_listen(text) {
            Some(addr) => Some(addr),
            None => {
                problems.push(
                    "metrics.listen",
                    format!(
                        "expected an address such as \"127.0.0.1:9105\", \"[::1]:9105\", \"localhost:9105\" or \
                         \":9105\" (all interfaces), or \"\" to disable, got {text:?}"
                    ),
                );
                defaults.listen
            }
        },
    };
    MetricsConfig { listen }
}

/// `[kubelet]`: the node's KubeletConfiguration, the kubelet's drop-in
/// directory and a file of its flags, absolute paths.
type KubeletPaths = (Option<PathBuf>, Option<PathBuf>, Option<PathBuf>);

fn kubelet_section(raw: RawKubeletRef, problems: &mut Problems) -> KubeletPaths {
    let mut absolute = |key: &str, path: Option<String>| {
        let path = PathBuf::from(path.filter(|p| !p.is_empty())?);
        check_absolute(key, &path, problems).then_some(path)
    };
    (
        absolute("kubelet.config", raw.config),
        absolute("kubelet.config_dir", raw.config_dir),
        absolute("kubelet.args_file", raw.args_file),
    )
}

/// `[kubernetes]`: off unless `enabled`; a node name as Kubernetes spells
/// one, an absolute kubeconfig path, a bounded staleness.
fn kubernetes_section(raw: RawKubernetes, problems: &mut Problems) -> KubernetesConfig {
    let defaults = KubernetesConfig::default();
    let enabled = raw.enabled.unwrap_or(defaults.enabled);
    if enabled && !cfg!(feature = "kubernetes") {
        problems.push(
            "kubernetes.enabled",
            "this imagegc was built without Kubernetes support (cargo feature `kubernetes`)",
        );
    }
    let node_name = raw.node_name.filter(|name| !name.is_empty());
    if let Some(name) = &node_name
        && !is_dns_subdomain(name)
    {
        problems.push(
            "kubernetes.node_name",
            format!("must be a node name (lower-case letters, digits, '-' and '.', at most 253), got {name:?}"),
        );
    }
    let kubeconfig = raw
        .kubeconfig
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .filter(|path| check_absolute("kubernetes.kubeconfig", path, problems));
    let pods_stale_after = match raw.pods_stale_after {
        Some(RawDuration(d)) if d.is_zero() => {
            problems.push(
                "kubernetes.pods_stale_after",
                "must be more than 0: the last known pods would protect nothing while the API server is away",
            );
            defaults.pods_stale_after
        }
        other => age(
            "kubernetes.pods_stale_after",
            other,
            defaults.pods_stale_after,
            problems,
        ),
    };
    KubernetesConfig {
        enabled,
        node_name,
        kubeconfig,
        protect_pods: raw.protect_pods.unwrap_or(defaults.protect_pods),
        room_before_pulls: raw.room_before_pulls.unwrap_or(defaults.room_before_pulls),
        node_events: raw.node_events.unwrap_or(defaults.node_events),
        pods_stale_after,
        registry_manifests: raw.registry_manifests.unwrap_or(defaults.registry_manifests),
        registry_endpoints: registry_endpoints(raw.registry_endpoints.unwrap_or_default(), problems),
    }
}

/// `kubernetes.registry_endpoints`: each key a registry as image names
/// write it (`host` or `host:port`), each value an `http://` or
/// `https://` address with no path, query or credentials.
fn registry_endpoints(
    endpoints: std::collections::BTreeMap<String, String>,
    problems: &mut Problems,
) -> std::collections::BTreeMap<String, String> {
    let mut valid = std::collections::BTreeMap::new();
    for (registry, address) in endpoints {
        let field = format!("kubernetes.registry_endpoints.\"{registry}\"");
        let host_like = !registry.is_empty()
            && registry.len() <= 255
            && registry
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b));
        if !host_like {
            problems.push(
                &field,
                "the key must be a registry as image names write it (`registry.example` or `localhost:5001`)",
            );
            continue;
        }
        match endpoint_problem(&address) {
            Some(problem) => problems.push(&field, &problem),
            None => {
                valid.insert(registry, address.trim_end_matches('/').to_owned());
            }
        }
    }
    valid
}

/// What is wrong with a registry's address, if anything.
fn endpoint_problem(address: &str) -> Option<String> {
    let uri: hyper::Uri = match address.parse() {
        Ok(uri) => uri,
        Err(e) => return Some(format!("{address:?} is not an address: {e}")),
    };
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Some(format!("{address:?} must start with http:// or https://"));
    }
    let Some(authority) = uri.authority() else {
        return Some(format!("{address:?} names no host"));
    };
    if authority.as_str().contains('@') {
        return Some(format!(
            "{address:?} must not carry credentials (only anonymous access is used)"
        ));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Some(format!(
            "{address:?} must be the registry's address alone (its /v2/ API is read there), without a path"
        ));
    }
    None
}

/// A DNS subdomain (RFC 1123), what Kubernetes requires of a node's name.
fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
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
pub(super) fn check_endpoint(key: &str, endpoint: &str, problems: &mut Problems) -> Option<String> {
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
pub(super) fn check_absolute(key: &str, path: &Path, problems: &mut Problems) -> bool {
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
    use crate::config::tests_support::*;
    use crate::config::{GcConfig, Overrides};

    #[test]
    fn the_kubernetes_section_is_off_by_default_and_read_when_given() {
        let config = load_ok("k.toml", "");
        assert_eq!(config.kubernetes, KubernetesConfig::default());
        assert!(!config.kubernetes.enabled);
        let config = load_ok(
            "k.toml",
            "[kubernetes]\nenabled = true\nnode_name = \"node-1.example\"\nkubeconfig = \"/etc/imagegc/kubeconfig\"\n\
             protect_pods = false\nnode_events = true\npods_stale_after = \"15m\"\n",
        );
        let k = &config.kubernetes;
        assert!(k.enabled && !k.protect_pods && k.node_events);
        assert_eq!(k.node_name.as_deref(), Some("node-1.example"));
        assert_eq!(k.kubeconfig.as_deref(), Some(Path::new("/etc/imagegc/kubeconfig")));
        assert_eq!(k.pods_stale_after, Duration::from_secs(900));
        // The effective file reads back the same.
        assert_eq!(
            load_ok("k.toml", &config.to_toml_string()).kubernetes,
            config.kubernetes
        );
    }

    #[test]
    fn the_usage_log_is_on_by_default_and_switched_off_by_its_key() {
        assert!(load_ok("s.toml", "").state.usage_log);
        // `auto` judges the log: without it, said.
        let config = load_ok("s.toml", "[gc]\norder = \"auto\"\n[state]\nusage_log = false\n");
        assert!(
            config.warnings[0].starts_with("gc.order = \"auto\" judges"),
            "{:?}",
            config.warnings
        );
        assert!(load_ok("s.toml", "[gc]\norder = \"auto\"\n").warnings.is_empty());
        let config = load_ok("s.toml", "[state]\ndir = \"/srv/imagegc\"\nusage_log = false\n");
        assert!(!config.state.usage_log);
        assert_eq!(config.state.dir, PathBuf::from("/srv/imagegc"));
        assert_eq!(
            problem_keys("s.toml", "[state]\nusage_log = \"yes\"\n"),
            ["state.usage_log"]
        );
    }

    #[test]
    fn a_bad_kubernetes_section_names_each_key() {
        let keys = problem_keys(
            "k.toml",
            "[kubernetes]\nnode_name = \"Node_1\"\nkubeconfig = \"kubeconfig\"\npods_stale_after = \"0s\"\nwatch = true\n",
        );
        assert_eq!(
            keys,
            [
                "kubernetes.kubeconfig",
                "kubernetes.node_name",
                "kubernetes.pods_stale_after",
                "kubernetes.watch"
            ]
        );
        assert_eq!(
            problem_keys("k.toml", "[kubernetes]\nenabled = \"yes\"\n"),
            ["kubernetes.enabled"]
        );
    }

    #[test]
    fn registry_endpoints_are_registries_and_bare_http_addresses() {
        let config = load_ok(
            "k.toml",
            "[kubernetes]\nregistry_manifests = true\n[kubernetes.registry_endpoints]\n\
             \"localhost:5001\" = \"http://kind-registry:5000/\"\n\"registry.example\" = \"https://mirror.example\"\n",
        );
        assert!(config.kubernetes.registry_manifests);
        assert_eq!(
            config.kubernetes.registry_endpoints.iter().collect::<Vec<_>>(),
            [
                (&"localhost:5001".to_string(), &"http://kind-registry:5000".to_string()),
                (&"registry.example".to_string(), &"https://mirror.example".to_string()),
            ]
        );
        let problems = |body: &str| {
            rejected("k.toml", &format!("[kubernetes.registry_endpoints]\n{body}\n"))
                .iter()
                .map(|p| format!("{}: {}", p.key, p.message))
                .collect::<Vec<_>>()
                .join("\n")
        };
        for (body, says) in [
            (
                "\"r.example\" = \"ftp://mirror\"",
                "must start with http:// or https://",
            ),
            ("\"r.example\" = \"https://mirror/v2/\"", "without a path"),
            ("\"r.example\" = \"https://u:p@mirror\"", "must not carry credentials"),
            (
                "\"r.example\" = \"mirror.example\"",
                "must start with http:// or https://",
            ),
            ("\"r.example\" = \"https://mirror?x=1\"", "without a path"),
            ("\"r example\" = \"https://mirror\"", "the key must be a registry"),
            ("\"r.example\" = 5", "invalid type"),
        ] {
            let text = problems(body);
            assert!(text.contains("kubernetes.registry_endpoints"), "{body}: {text}");
            assert!(text.contains(says), "{body}: {text}");
        }
    }

    #[test]
    fn node_names_are_dns_subdomains() {
        for good in ["localhost", "ip-10-0-0-1.ec2.internal", "a", "n1"] {
            assert!(is_dns_subdomain(good), "{good}");
        }
        for bad in ["", "-a", "a-", "A", "a..b", "a_b", &"a".repeat(64), "a/b"] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
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

    // The kubelet's validation scenarios (docs/kubelet.md, scenario 14), in both
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
}
