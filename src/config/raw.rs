//! The raw form: what each key of imagegc's schema, and each KubeletConfiguration
//! field imagegc reads, may hold, before values are compared with each other.
//!
//! It owns the serde forms (each section rejects unknown keys; absent keys
//! are `None`), how an integer or a duration is read from a file, and the
//! walk that deserializes a tree one key at a time so that every unknown key
//! and every value of the wrong type becomes its own problem. It must not
//! check ranges or compare keys: that is `validate`'s work, done on what
//! passed here.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};
use serde_json::{Map, Value};

use super::Problems;
use super::parse::join_key;
use super::protect::RawProtect;
pub(super) use super::scalar::RawInt;
use crate::time::{NEGATIVE_DURATION, parse_duration};

/// The `kind` of a KubeletConfiguration file, which imagegc also reads.
pub(super) const KUBELET_KIND: &str = "KubeletConfiguration";

/// imagegc's schema, one section at a time. Each section rejects unknown
/// keys; absent keys are `None`.
#[derive(Debug, Default)]
pub(super) struct RawConfig {
    pub(super) runtime: RawRuntime,
    pub(super) gc: RawGc,
    pub(super) protect: RawProtect,
    pub(super) state: RawState,
    pub(super) metrics: RawMetrics,
    pub(super) kubelet: RawKubeletRef,
    pub(super) kubernetes: RawKubernetes,
}

/// The sections of imagegc's schema, in the order of the example file.
const SECTIONS: [&str; 7] = ["runtime", "gc", "protect", "state", "metrics", "kubelet", "kubernetes"];

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRuntime {
    pub(super) endpoint: Option<String>,
    pub(super) timeout: Option<RawDuration>,
    pub(super) container_events: Option<bool>,
    pub(super) sandbox_image: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGc {
    pub(super) interval: Option<RawDuration>,
    pub(super) usage_poll_interval: Option<RawDuration>,
    pub(super) high_threshold_percent: Option<RawInt>,
    pub(super) low_threshold_percent: Option<RawInt>,
    pub(super) min_age: Option<RawDuration>,
    pub(super) max_age: Option<RawDuration>,
    pub(super) dry_run: Option<bool>,
    pub(super) image_fs_path: Option<String>,
    pub(super) thrash_window: Option<RawDuration>,
    pub(super) order: Option<String>,
    pub(super) headroom: Option<bool>,
    pub(super) high_inodes_percent: Option<RawInt>,
    pub(super) low_inodes_percent: Option<RawInt>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawState {
    pub(super) dir: Option<String>,
    pub(super) usage_log: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMetrics {
    pub(super) listen: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawKubeletRef {
    pub(super) config: Option<String>,
    pub(super) config_dir: Option<String>,
    pub(super) args_file: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawKubernetes {
    pub(super) enabled: Option<bool>,
    pub(super) node_name: Option<String>,
    pub(super) kubeconfig: Option<String>,
    pub(super) protect_pods: Option<bool>,
    pub(super) room_before_pulls: Option<bool>,
    pub(super) node_events: Option<bool>,
    pub(super) pods_stale_after: Option<RawDuration>,
    pub(super) registry_manifests: Option<bool>,
    pub(super) registry_endpoints: Option<std::collections::BTreeMap<String, String>>,
}

/// The fields of a KubeletConfiguration that imagegc reads; every other
/// kubelet field is ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawKubelet {
    pub(super) api_version: Option<String>,
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub(super) image_gc_high_threshold_percent: Option<RawInt>,
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub(super) image_gc_low_threshold_percent: Option<RawInt>,
    #[serde(rename = "imageMinimumGCAge")]
    pub(super) image_minimum_gc_age: Option<RawDuration>,
    #[serde(rename = "imageMaximumGCAge")]
    pub(super) image_maximum_gc_age: Option<RawDuration>,
    pub(super) eviction_hard: Option<BTreeMap<String, String>>,
    /// Soft eviction thresholds: pods are evicted after a grace period;
    /// the lower of the two lines binds.
    pub(super) eviction_soft: Option<BTreeMap<String, String>>,
    /// Whether the kubelet's default eviction thresholds fill in the signals
    /// `evictionHard` leaves out (Kubernetes 1.33+); without it a partial
    /// `evictionHard` turns every other signal off.
    pub(super) merge_default_eviction_settings: Option<bool>,
    /// Read only for the gates of the fields above; the others are the
    /// kubelet's business and are ignored whatever they hold.
    pub(super) feature_gates: Option<Map<String, Value>>,
}

/// A duration as written in a file: a string with units (`"5m"`, `"1h30m"`,
/// Go's `"2m0s"`), or the bare integer 0.
#[derive(Debug, Clone, Copy)]
pub(super) struct RawDuration(pub(super) Duration);

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
pub(super) fn read_keys<T: DeserializeOwned + Default>(
    prefix: &str,
    table: Map<String, Value>,
    problems: &mut Problems,
) -> T {
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
pub(super) fn read_imagegc(document: Map<String, Value>, problems: &mut Problems) -> RawConfig {
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
            "kubernetes" => raw.kubernetes = read_keys(&name, table, problems),
            _ => raw.metrics = read_keys(&name, table, problems),
        }
    }
    raw
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests_support::*;

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
        assert_eq!(problem.message, "unknown key; expected dir or usage_log");
        let problem = &rejected("a.toml", "[metric]\n")[0];
        assert_eq!(
            problem.message,
            "unknown key; expected one of runtime, gc, protect, state, metrics, kubelet, kubernetes"
        );
        let problem = &rejected("a.toml", "[runtime]\nsocket = \"x\"\n")[0];
        assert_eq!(
            problem.message,
            "unknown key; expected one of endpoint, timeout, container_events, sandbox_image"
        );
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
    fn a_duration_behind_a_million_minus_signs_is_a_problem_named_by_its_key_not_a_crash() {
        let text = format!("[gc]\nmin_age = \"{}1m\"\n", "-".repeat(1_000_000));
        let problems = rejected("a.toml", &text);
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].key, "gc.min_age");
        assert!(problems[0].message.starts_with("must not be negative"));
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
}
