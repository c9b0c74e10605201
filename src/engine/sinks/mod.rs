//! What becomes of what imagegc does, one output to a file: each turns
//! the facts it cares about into its own form.
//!
//! - `log`: the log lines ([`LogSink`]).
//! - `metrics`: the metrics the engine's events set ([`MetricsSink`]).
//! - `health`: liveness ([`HealthSink`]).
//! - `cri_calls`: every call to the runtime, counted and timed
//!   ([`CriCallMetrics`], the CRI client's [`crate::cri::CallObserver`]).
//!
//! [`Sinks`] is the list a collector reports to.

use std::sync::Arc;

use crate::engine::events::{Event, Sink};
use crate::outputs::metrics::Metrics;

mod cri_calls;
mod health;
mod log;
mod metrics;

pub use cri_calls::CriCallMetrics;
pub use health::HealthSink;
pub use log::LogSink;
pub use metrics::MetricsSink;

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
