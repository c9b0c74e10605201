//! What becomes of what imagegc does, one output to a file: each turns
//! the facts it cares about into its own form.
//!
//! - `log`: the log lines ([`LogSink`]).
//! - `metrics`: the metrics the engine's events set ([`MetricsSink`]).
//! - `health`: liveness ([`HealthSink`]).
//! - `kubernetes`: what imagegc knows of the cluster ([`KubernetesMetrics`],
//!   set by the `kubernetes` module).
//! - `cri_calls`: every call to the runtime, counted and timed
//!   ([`CriCallMetrics`], the CRI client's [`crate::cri::CallObserver`]).
//!
//! [`Sinks`] is the list a collector reports to.

use std::sync::Arc;

use crate::engine::events::{Event, Sink};
use crate::outputs::metrics::Metrics;

mod cri_calls;
mod health;
mod kubernetes;
mod log;
mod metrics;

pub use cri_calls::CriCallMetrics;
pub use health::HealthSink;
pub use kubernetes::{KubernetesMetrics, NodeEventReason, NodeEventResult};
pub use log::LogSink;
pub use metrics::MetricsSink;

/// Registers every metric family imagegc exports in `metrics`, so that a
/// scrape shows each from the start: the daemon's registry, and the one
/// README's table is checked against.
pub fn register_every_family(metrics: &Metrics) {
    let _ = MetricsSink::new(metrics);
    let _ = CriCallMetrics::new(metrics);
    let _ = KubernetesMetrics::new(metrics);
}

/// Every sink the engine reports to, in order.
#[derive(Clone, Default)]
pub struct Sinks(Vec<Arc<dyn Sink>>);

impl Sinks {
    /// The logs and the metrics: what every collector reports to.
    pub fn standard(metrics: &Arc<Metrics>) -> Self {
        Sinks(vec![Arc::new(LogSink), Arc::new(MetricsSink::new(metrics))])
    }

    /// Adds a sink.
    pub fn push(&mut self, sink: Arc<dyn Sink>) {
        self.0.push(sink);
    }

    /// Sends `event` to every sink.
    pub fn emit(&self, event: &Event<'_>) {
        for sink in &self.0 {
            sink.emit(event);
        }
    }
}

impl std::fmt::Debug for Sinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sinks({})", self.0.len())
    }
}

/// README's table of metrics is the registry's: a family registered and
/// not documented, or documented and gone, fails here.
/// What the sinks' tests read of an encoded registry.
#[cfg(test)]
pub(super) mod testing {
    use crate::outputs::metrics::Metrics;

    /// The sample lines of `metrics`' exposition, comments left out.
    pub fn sample_lines(metrics: &Metrics) -> Vec<String> {
        metrics
            .encode()
            .lines()
            .filter(|line| !line.starts_with('#'))
            .map(str::to_owned)
            .collect()
    }

    /// Fails naming `line` and every sample when `metrics` lacks it.
    pub fn assert_has(metrics: &Metrics, line: &str) {
        let lines = sample_lines(metrics);
        assert!(
            lines.iter().any(|l| l == line),
            "missing sample line {line:?} in:\n{}",
            lines.join("\n")
        );
    }
}

#[cfg(test)]
mod reference {
    use super::{Metrics, register_every_family};

    /// The metric names the registry exports (counters with `_total`).
    fn registered() -> std::collections::BTreeSet<String> {
        let metrics = Metrics::new();
        register_every_family(&metrics);
        metrics
            .encode()
            .lines()
            .filter_map(|line| line.strip_prefix("# TYPE "))
            .filter_map(|rest| {
                let (name, kind) = rest.split_once(' ')?;
                Some(if kind == "counter" {
                    format!("{name}_total")
                } else {
                    name.to_string()
                })
            })
            .collect()
    }

    /// The names README's metrics table gives, labels left out.
    fn documented() -> std::collections::BTreeSet<String> {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
        crate::testing::readme_table_names(&readme)
            .into_iter()
            .filter(|name| name.starts_with("imagegc_") || name.starts_with("image_garbage_collected"))
            .map(|name| name.split('{').next().unwrap_or(&name).to_string())
            .collect()
    }

    #[test]
    fn readme_lists_every_node_event_reason_and_no_other() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
        let listed = crate::testing::readme_table_under(&readme, "#### Node events");
        let reasons: Vec<&str> = super::NodeEventReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(listed, reasons, "README's Node events table");
        // The metric's row names every reason too.
        let row = readme
            .lines()
            .find(|line| line.starts_with("| `imagegc_kubernetes_node_events_total"))
            .unwrap();
        for reason in reasons {
            assert!(row.contains(&format!("`{reason}`")), "{reason} missing from {row}");
        }
    }

    #[test]
    fn readme_documents_every_metric_the_registry_exports_and_no_other() {
        let (registered, documented) = (registered(), documented());
        let undocumented: Vec<&String> = registered.difference(&documented).collect();
        let gone: Vec<&String> = documented.difference(&registered).collect();
        assert!(
            undocumented.is_empty() && gone.is_empty(),
            "README's metrics table lacks {undocumented:?} and documents {gone:?}, which the registry does not export"
        );
    }
}
