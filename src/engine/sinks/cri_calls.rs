//! The runtime's calls, counted and timed: the CRI client tells each
//! call's end to a [`CallObserver`] (it alone sees the call's status
//! code), and this one counts it in `imagegc_cri_requests_total{method,code}`
//! and times it in `imagegc_cri_request_duration_seconds{method}`. The
//! client knows nothing of metrics.

use std::sync::Arc;
use std::time::Duration;

use crate::cri::CallObserver;
use crate::outputs::metrics::Metrics;

/// Counts and times every call the CRI client makes.
pub struct CriCallMetrics(Arc<Metrics>);

impl CriCallMetrics {
    /// Counts into `metrics`.
    pub fn new(metrics: &Arc<Metrics>) -> Self {
        CriCallMetrics(Arc::clone(metrics))
    }
}

impl CallObserver for CriCallMetrics {
    fn call_ended(&self, method: &'static str, code: &'static str, took: Duration) {
        self.0.cri_request(method, code, took);
    }
}
