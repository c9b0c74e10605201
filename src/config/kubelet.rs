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

/// Reads the node's KubeletConfiguration named by `kubelet.config` and warns
/// when the kubelet would collect images too, or would evict pods before
/// imagegc's high threshold is reached. The kubelet file's own problems are
/// reported against that file.
pub(super) fn cross_check_kubelet(config: &mut Config, kubelet_path: &Path, problems: &mut Problems) {
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
    let Some(document) = parse::parse(Format::Yaml, &text, &mut found) else {
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

/// Reads the image GC fields of a KubeletConfiguration, then builds the
/// `Config` and adds what an operator should know about running imagegc from
/// the kubelet's own file.
pub(super) fn read_kubelet(document: Map<String, Value>, problems: &mut Problems) -> Config {
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
        std::fs::remove_file(&kubelet).unwrap();
        let err = load(Some(&imagegc), &Overrides::default()).unwrap_err();
        assert_eq!(err.problems[0].key, "kubelet.config");
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
}
