//! Liveness from the engine's events (see [`crate::outputs::health`]).

use std::sync::Arc;

use crate::engine::events::{Event, Sink};
use crate::outputs::health::Health;

/// Liveness: progress within a cycle counts as a heartbeat.
pub struct HealthSink(pub Arc<Health>);

impl Sink for HealthSink {
    fn emit(&self, event: &Event<'_>) {
        if matches!(event, Event::Progress | Event::Removed(_)) {
            self.0.heartbeat();
        }
    }
}
