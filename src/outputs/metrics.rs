//! The registry every metric imagegc exports is registered in
//! ([`Metrics`]), and its encoding for `/metrics` (OpenMetrics, or the
//! classic text format).
//!
//! Each sink registers and updates its own families (`engine::sinks`: a
//! group of families is a [`Families`], registered once per registry),
//! so a metric's name, unit, help text and label values live beside the
//! events that set it. Label values come only from small closed enums,
//! never from image names or any other data a user or the runtime
//! controls, so the number of series is fixed.
//!
//! This module does no IO and serves nothing; `http` encodes it on scrape.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};
use prometheus_client::registry::Registry;

pub use crate::model::Reason;

impl EncodeLabelValue for Reason {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

/// The one registry every sink registers its metric families in, and
/// what `/metrics` encodes. Share it as `Arc<Metrics>`; every method takes
/// `&self`.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    /// Each group registered, by its type: registered once, on first use.
    groups: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

/// A group of metric families a sink registers and updates (its names,
/// units, help texts and label sets), registered once per registry
/// whichever sink asks first ([`Metrics::families`]).
pub trait Families: Send + Sync + 'static {
    /// Registers the group's families in `registry`, with the series known
    /// in advance at zero, so that `rate()` and absence alerts work before
    /// the first event.
    fn register(registry: &mut Registry) -> Self;
}

impl Metrics {
    /// An empty registry: each sink registers its own families (see
    /// `engine::sinks::register_every_family`).
    pub fn new() -> Metrics {
        Metrics {
            registry: Mutex::new(Registry::default()),
            groups: Mutex::new(HashMap::new()),
        }
    }

    /// The group `F`, registered on the first call: every later call, from
    /// any sink, gets the same families.
    pub fn families<F: Families>(&self) -> Arc<F> {
        let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        let group = groups.entry(TypeId::of::<F>()).or_insert_with(|| {
            let mut registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::new(F::register(&mut registry))
        });
        match Arc::clone(group).downcast::<F>() {
            Ok(group) => group,
            Err(_) => unreachable!("a group is kept under its own type"),
        }
    }

    /// The whole exposition in the OpenMetrics text format, `# EOF` included. Serve
    /// it with [`OPENMETRICS_CONTENT_TYPE`].
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail and every label value is a fixed
        // string, so an error here would be a bug in the encoder, not a state to
        // serve around.
        if let Err(error) = prometheus_client::encoding::text::encode(
            &mut out,
            &self.registry.lock().unwrap_or_else(PoisonError::into_inner),
        ) {
            tracing::error!(%error, "encoding metrics failed");
        }
        out
    }

    /// The whole exposition in Prometheus's classic text format 0.0.4, for
    /// clients that do not ask for OpenMetrics. Serve it with
    /// [`CLASSIC_CONTENT_TYPE`].
    pub fn encode_classic(&self) -> String {
        openmetrics_to_classic(&self.encode())
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Seconds since the Unix epoch, by the wall clock (this is what dashboards
/// compare with `time()`); 0 if the clock is before 1970. The one wall-clock
/// read of the metrics: the engine, which decides what is old, reads none.
#[expect(
    clippy::disallowed_methods,
    reason = "the last-success timestamp dashboards compare with time()"
)]
pub fn unix_now_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}

/// The content type of [`Metrics::encode`]'s output.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The content type of [`Metrics::encode_classic`]'s output: Prometheus's
/// classic text format.
pub const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Rewrites an OpenMetrics exposition in the classic text format 0.0.4: the
/// same samples, with the metadata of a counter under its `_total` name (the
/// name its samples carry), no `# UNIT` lines (the classic format has none)
/// and no `# EOF`. HELP texts are unescaped from OpenMetrics (`\"`) to the
/// classic escaping, which knows only `\\` and `\n`.
fn openmetrics_to_classic(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let metadata = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|prefix| line.strip_prefix(prefix).map(|rest| (prefix, rest)));
        match metadata {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let suffix = if counters.contains(name) { "_total" } else { "" };
                let tail = if prefix == "# HELP " {
                    tail.replace("\\\"", "\"")
                } else {
                    tail.to_owned()
                };
                let _ = writeln!(out, "{prefix}{name}{suffix} {tail}");
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_label_values_are_lowercase() {
        assert_eq!(Reason::Age.as_str(), "age");
        assert_eq!(Reason::Space.as_str(), "space");
    }
}
