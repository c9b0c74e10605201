//! What imagegc says to the outside, apart from its commands' output: the
//! log's format ([`log`]), the metric families and their registry
//! ([`metrics`]), liveness and readiness ([`health`]), and the listener
//! that serves them ([`http`]: `/metrics`, `/healthz`, `/readyz`). The
//! engine's events reach them through its sinks (`engine::events`).

pub mod health;
pub mod http;
pub mod log;
pub mod metrics;
