//! The kubelet reader: a KubeletConfiguration's image GC fields read as
//! imagegc's configuration, and the node's KubeletConfiguration named by
//! `kubelet.config` cross-checked against imagegc's own.
//!
//! It owns what an operator should hear about running beside the kubelet
//! (the kubelet still collecting, evicting before imagegc's high threshold,
//! another API version), the `ImageMaximumGCAge` feature gate, and reading
//! the kubelet's eviction thresholds and resource quantities. It must not
//! honour any other kubelet field: the runtime endpoint, the pod limits and
//! the rest are the kubelet's business.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::{Map, Value};

use super::parse::{self, Format};
use super::raw::{RawConfig, RawGc, RawKubelet, read_keys};
use super::validate::{self, KUBELET_KEYS};
use super::{Config, EvictionThreshold, Problems, read_text};
use crate::time::format_duration;

/// The `kind` that marks a kubelet configuration file.
pub(super) use super::raw::KUBELET_KIND;
/// The kubelet configuration API version whose fields imagegc knows.
const KUBELET_API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// The kubelet feature gate without which `imageMaximumGCAge` must be unset
/// or zero (beta, on by default, since Kubernetes 1.30).
const IMAGE_MAXIMUM_GC_AGE_GATE: &str = "ImageMaximumGCAge";

/// The kubelet's hard eviction thresholds on available disk when its file
/// sets no `evictionHard` (Kubernetes `DefaultEvictionHard`, Linux): pods
/// are evicted above 85 % usage of the image filesystem and above 90 % of
/// the kubelet's root filesystem.
const DEFAULT_IMAGEFS_AVAILABLE: EvictionThreshold = EvictionThreshold::Percent(15.0);
/// See [`DEFAULT_IMAGEFS_AVAILABLE`].
const DEFAULT_NODEFS_AVAILABLE: EvictionThreshold = EvictionThreshold::Percent(10.0);

/// What imagegc reads from a KubeletConfiguration: its image GC fields as a
/// `Config`, and the eviction lines that bound where imagegc's high
/// threshold may sit.
struct KubeletFile {
    config: Config,
    api_version: Option<String>,
    eviction: Eviction,
}

/// The kubelet's hard eviction thresholds on available disk, as the kubelet
/// will apply them: written in the file, or its defaults when the file sets
/// no `evictionHard` (or asks for them with `mergeDefaultEvictionSettings`).
/// A signal a partial `evictionHard` leaves out is off, as in the kubelet.
#[derive(Debug, Default, Clone, Copy)]
struct Eviction {
    imagefs_available: Option<EvictionThreshold>,
    nodefs_available: Option<EvictionThreshold>,
    /// The thresholds above are the kubelet's defaults, not the file's.
    defaulted: bool,
}

/// Reads the node's KubeletConfiguration named by `kubelet.config` (or
/// `--kubelet-config`, the `key` problems are filed under) and warns when
/// the kubelet would collect images too, or would evict pods before
/// imagegc's high threshold is reached. A file that cannot be read is a
/// warning, not an error: it only serves this check, and a collector that
/// refuses to start for want of it leaves the node with none. The kubelet
/// file's own problems are reported against that file.
pub(super) fn cross_check_kubelet(config: &mut Config, kubelet_path: &Path, key: &str, problems: &mut Problems) {
    let mut found = Problems::new(kubelet_path.display().to_string());
    let text = match read_text(kubelet_path) {
        Ok(text) => text,
        Err(err) => {
            config.warnings.push(format!(
                "{key}: cannot read {}: {err}; the hand-over from the kubelet is not checked (in a pod, mount the \
                 kubelet's file read-only at that path: deploy/components/kubelet-config, or the chart's \
                 kubelet.configPath)",
                kubelet_path.display()
            ));
            return;
        }
    };
    let Some(document) = parse::parse(Format::Yaml, &text, &mut found) else {
        problems.list.extend(found.list);
        return;
    };
    if document.get("kind").and_then(Value::as_str) != Some(KUBELET_KIND) {
        problems.push(key, format!("{} is not a {KUBELET_KIND}", kubelet_path.display()));
        return;
    }
    let kubelet = read_kubelet_file(document, &mut found);
    problems.list.extend(found.list);
    let file = kubelet_path.display();
    if !kubelet.config.collection_disabled() {
        config.warnings.push(format!(
            "{file}: the kubelet's own image GC is enabled (imageGCHighThresholdPercent {}, imageMaximumGCAge {}): \
             both the kubelet and imagegc would remove images; set imageGCHighThresholdPercent: 100 and \
             imageMaximumGCAge: 0s there",
            kubelet.config.gc.high_threshold_percent,
            format_duration(kubelet.config.gc.max_age),
        ));
    }
    config.eviction_imagefs_available = kubelet.eviction.imagefs_available;
    let default_note = format!(" (the kubelet's default: {file} sets no evictionHard)");
    config.warnings.extend(eviction_warnings(
        "gc.high_threshold_percent",
        config.gc.high_threshold_percent,
        kubelet.eviction,
        &format!(" in {file}"),
        &default_note,
    ));
}

/// Reads the image GC fields of a KubeletConfiguration as imagegc's own
/// configuration, with what an operator should know about running imagegc
/// from the kubelet's own file.
pub(super) fn read_kubelet(document: Map<String, Value>, problems: &mut Problems) -> Config {
    let kubelet = read_kubelet_file(document, problems);
    let mut config = kubelet.config;
    config.eviction_imagefs_available = kubelet.eviction.imagefs_available;
    config.warnings = kubelet_warnings(&config, kubelet.api_version.as_deref(), kubelet.eviction);
    config
}

/// The image GC fields of a KubeletConfiguration, validated as the kubelet
/// does, and its eviction thresholds on disk.
fn read_kubelet_file(document: Map<String, Value>, problems: &mut Problems) -> KubeletFile {
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
    let mut config = validate::build(raw, &KUBELET_KEYS, problems);
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
    let eviction = read_eviction(
        kubelet.eviction_hard.as_ref(),
        kubelet.merge_default_eviction_settings.unwrap_or(false),
        problems,
    );
    KubeletFile {
        config,
        api_version: kubelet.api_version,
        eviction,
    }
}

/// The disk eviction thresholds the kubelet applies: with no `evictionHard`
/// its defaults; with one, what it says, the signals it leaves out off
/// (kubernetes#112057) unless `mergeDefaultEvictionSettings` fills them in
/// with the defaults.
fn read_eviction(hard: Option<&BTreeMap<String, String>>, merge_defaults: bool, problems: &mut Problems) -> Eviction {
    let Some(hard) = hard else {
        return Eviction {
            imagefs_available: Some(DEFAULT_IMAGEFS_AVAILABLE),
            nodefs_available: Some(DEFAULT_NODEFS_AVAILABLE),
            defaulted: true,
        };
    };
    let mut read = |signal: &str, default: EvictionThreshold| match hard.get(signal) {
        Some(text) => match parse_eviction_threshold(text) {
            Ok(threshold) => Some(threshold),
            Err(message) => {
                problems.push(format!("evictionHard.{signal}"), message);
                None
            }
        },
        None => merge_defaults.then_some(default),
    };
    Eviction {
        imagefs_available: read("imagefs.available", DEFAULT_IMAGEFS_AVAILABLE),
        nodefs_available: read("nodefs.available", DEFAULT_NODEFS_AVAILABLE),
        defaulted: false,
    }
}

fn kubelet_warnings(config: &Config, api_version: Option<&str>, eviction: Eviction) -> Vec<String> {
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
    warnings.extend(eviction_warnings(
        "imageGCHighThresholdPercent",
        config.gc.high_threshold_percent,
        eviction,
        "",
        " (the kubelet's default: this file sets no evictionHard)",
    ));
    warnings
}

/// The warnings due when collection would only start after one of the
/// kubelet's percentage eviction lines on the image filesystem:
/// `imagefs.available`, and `nodefs.available` where it is stricter, for a
/// node whose image filesystem is also the kubelet's root filesystem (one
/// disk, the usual node; the kubelet then applies both to that disk). Sizes
/// need the measured capacity; the collector checks those.
fn eviction_warnings(key: &str, high: u8, eviction: Eviction, source: &str, default_note: &str) -> Vec<String> {
    let note = if eviction.defaulted { default_note } else { "" };
    let evicts_at = |threshold| match threshold {
        Some(EvictionThreshold::Percent(available)) if available > 0.0 => Some((available, 100.0 - available)),
        _ => None,
    };
    let warning = |signal: &str, available: f64, line: f64, condition: &str| {
        format!(
            "{key} {high}: space collection starts at {high}% usage, but evictionHard {signal} {available}%{source} \
             makes the kubelet evict pods above {line}% usage{condition}{note}; set it below {line}"
        )
    };
    let mut warnings = Vec::new();
    let imagefs = evicts_at(eviction.imagefs_available);
    if let Some((available, line)) = imagefs.filter(|(_, line)| f64::from(high) >= *line) {
        warnings.push(warning("imagefs.available", available, line, ""));
    }
    let nodefs = evicts_at(eviction.nodefs_available);
    if let Some((available, line)) = nodefs.filter(|(_, line)| f64::from(high) >= *line)
        && imagefs.is_none_or(|(_, image_line)| line < image_line)
    {
        warnings.push(warning(
            "nodefs.available",
            available,
            line,
            " where the image filesystem is also the kubelet's root filesystem (one disk for both)",
        ));
    }
    warnings
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
pub(crate) fn parse_quantity(text: &str) -> Result<u64, String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests_support::*;
    use crate::config::{Overrides, load};

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
    }

    /// A kubelet file the pod was not given (the DaemonSet does not mount
    /// it) costs a warning naming the fix, not the collector: a pod that
    /// exits 2 for it leaves the node with no image GC at all.
    #[test]
    fn a_kubelet_file_that_cannot_be_read_is_a_warning_naming_the_mount() {
        let dir = tempfile::tempdir().unwrap();
        let imagegc = dir.path().join("imagegc.toml");
        std::fs::write(&imagegc, "[kubelet]\nconfig = \"/nonexistent/kubelet/config.yaml\"\n").unwrap();
        let config = load(Some(&imagegc), &Overrides::default()).unwrap();
        assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
        let warning = &config.warnings[0];
        assert!(
            warning.starts_with("kubelet.config: cannot read /nonexistent/kubelet/config.yaml"),
            "{warning}"
        );
        assert!(warning.contains("deploy/components/kubelet-config"), "{warning}");
        assert!(warning.contains("kubelet.configPath"), "{warning}");
    }

    /// `--kubelet-config` (`IMAGEGC_KUBELET_CONFIG`, which the DaemonSet's
    /// kubelet-config component sets) names the kubelet's file without
    /// touching imagegc's own.
    #[test]
    fn the_kubelet_file_named_on_the_command_line_is_cross_checked() {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = dir.path().join("config.yaml");
        std::fs::write(&kubelet, "kind: KubeletConfiguration\n").unwrap();
        let imagegc = dir.path().join("imagegc.toml");
        std::fs::write(
            &imagegc,
            "[gc]\nhigh_threshold_percent = 80\nlow_threshold_percent = 75\n",
        )
        .unwrap();
        let overrides = Overrides {
            kubelet_config: Some(kubelet.clone()),
            ..Overrides::default()
        };
        let config = load(Some(&imagegc), &overrides).unwrap();
        assert_eq!(config.kubelet_config.as_deref(), Some(kubelet.as_path()));
        assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
        assert!(config.warnings[0].contains("the kubelet's own image GC is enabled"));
        let relative = Overrides {
            kubelet_config: Some("config.yaml".into()),
            ..Overrides::default()
        };
        let err = load(Some(&imagegc), &relative).unwrap_err();
        assert_eq!(err.problems[0].key, "--kubelet-config");
    }

    /// The warnings `kubelet.config` gives for a kubelet file whose image
    /// GC is off, with `evictionHard` as written (or absent).
    fn handover_warnings(eviction: &str, high: u8) -> (Config, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = dir.path().join("config.yaml");
        std::fs::write(
            &kubelet,
            format!("kind: KubeletConfiguration\nimageGCHighThresholdPercent: 100\nimageMaximumGCAge: 0s\n{eviction}"),
        )
        .unwrap();
        let imagegc = dir.path().join("imagegc.toml");
        std::fs::write(
            &imagegc,
            format!(
                "[gc]\nhigh_threshold_percent = {high}\nlow_threshold_percent = 50\n[kubelet]\nconfig = {:?}\n",
                kubelet.display().to_string()
            ),
        )
        .unwrap();
        let config = load(Some(&imagegc), &Overrides::default()).unwrap();
        let warnings = config.warnings.clone();
        (config, warnings)
    }

    /// A kubelet file that sets no `evictionHard` evicts at the kubelet's
    /// defaults (imagefs.available 15%: above 85% usage): the shipped high
    /// of 85 gets a warning, 80 none.
    #[test]
    fn a_kubelet_file_without_eviction_hard_is_checked_against_the_kubelets_defaults() {
        let (config, warnings) = handover_warnings("", 85);
        assert_eq!(
            config.eviction_imagefs_available,
            Some(EvictionThreshold::Percent(15.0))
        );
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].starts_with(
                "gc.high_threshold_percent 85: space collection starts at 85% usage, but evictionHard \
                 imagefs.available 15% in "
            ),
            "{}",
            warnings[0]
        );
        assert!(
            warnings[0].contains("evict pods above 85% usage (the kubelet's default: "),
            "{}",
            warnings[0]
        );
        assert!(
            warnings[0].ends_with("sets no evictionHard); set it below 85"),
            "{}",
            warnings[0]
        );
        assert_eq!(handover_warnings("", 80).1, Vec::<String>::new());
    }

    /// A partial `evictionHard` turns the signals it leaves out off, as the
    /// kubelet does (kubernetes#112057), unless `mergeDefaultEvictionSettings`
    /// asks for the defaults.
    #[test]
    fn a_partial_eviction_hard_leaves_the_other_disk_signals_off_unless_defaults_are_merged() {
        let partial = "evictionHard:\n  memory.available: 100Mi\n";
        let (config, warnings) = handover_warnings(partial, 95);
        assert_eq!(config.eviction_imagefs_available, None);
        assert!(warnings.is_empty(), "{warnings:?}");
        let merged = format!("{partial}mergeDefaultEvictionSettings: true\n");
        let (config, warnings) = handover_warnings(&merged, 85);
        assert_eq!(
            config.eviction_imagefs_available,
            Some(EvictionThreshold::Percent(15.0))
        );
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("imagefs.available 15%"), "{}", warnings[0]);
        assert!(!warnings[0].contains("the kubelet's default"), "{}", warnings[0]);
    }

    /// On one disk the kubelet applies `nodefs.available` to the image
    /// filesystem too: where it is the stricter line, it is named.
    #[test]
    fn nodefs_available_is_named_where_it_is_the_stricter_line_on_one_disk() {
        let eviction = "evictionHard:\n  imagefs.available: 5%\n  nodefs.available: 10%\n";
        let (_, warnings) = handover_warnings(eviction, 92);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("evictionHard nodefs.available 10% in "),
            "{}",
            warnings[0]
        );
        assert!(
            warnings[0].contains("above 90% usage where the image filesystem is also the kubelet's root filesystem"),
            "{}",
            warnings[0]
        );
        assert!(handover_warnings(eviction, 89).1.is_empty());
        // Both lines crossed: imagefs.available is the stricter, named alone.
        let (_, warnings) = handover_warnings("evictionHard:\n  imagefs.available: 15%\n  nodefs.available: 10%\n", 92);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("imagefs.available 15%"), "{}", warnings[0]);
    }

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
        let kubelets = crate::config::GcConfig {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            ..defaults.gc
        };
        assert_eq!(config.gc, kubelets);
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
}
