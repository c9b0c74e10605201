//! The runtime's calls, counted and timed: the CRI client tells each
//! call's end to a [`CallObserver`] (it alone sees the call's status
//! code), and this one counts it in `imagegc_cri_requests_total{method,code}`
//! and times it in `imagegc_cri_request_duration_seconds{method}`, families
//! it registers itself. The client knows nothing of metrics.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::cri::CallObserver;
use crate::outputs::metrics::{Families, Metrics};

/// Upper bounds, in seconds, of the CRI request duration histogram. A listing
/// of a few hundred images answers in a millisecond or two; `RemoveImage` of a
/// large image can take seconds; the default call deadline is two minutes.
const CRI_REQUEST_BUCKETS_SECONDS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 10.0, 120.0,
];

/// One CRI call: its method (a literal of the CRI client's) and the gRPC
/// status code it ended with (a closed set: gRPC's own).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CriCallLabels {
    method: &'static str,
    code: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CriMethodLabels {
    method: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// What imagegc asks of the runtime: every CRI call, counted and timed.
#[derive(Debug)]
struct CriFamilies {
    requests: Family<CriCallLabels, Counter>,
    duration: HistogramFamily<CriMethodLabels>,
}

impl Families for CriFamilies {
    fn register(registry: &mut Registry) -> Self {
        let requests = Family::<CriCallLabels, Counter>::default();
        registry.register(
            "imagegc_cri_requests",
            "CRI calls made to the container runtime, by method and gRPC status code \
             (GetContainerEvents counts the opening of the stream)",
            requests.clone(),
        );
        let duration: HistogramFamily<CriMethodLabels> =
            Family::new_with_constructor(|| Histogram::new(CRI_REQUEST_BUCKETS_SECONDS));
        registry.register_with_unit(
            "imagegc_cri_request_duration",
            "Time from sending a CRI call to its answer (or its deadline), by method",
            Unit::Seconds,
            duration.clone(),
        );
        CriFamilies { requests, duration }
    }
}

/// Counts and times every call the CRI client makes.
pub struct CriCallMetrics {
    cri: Arc<CriFamilies>,
}

impl CriCallMetrics {
    /// Counts into `metrics` (registering the families there if no one has
    /// yet).
    pub fn new(metrics: &Metrics) -> Self {
        CriCallMetrics {
            cri: metrics.families(),
        }
    }
}

impl CallObserver for CriCallMetrics {
    fn call_ended(&self, method: &'static str, code: &'static str, took: Duration) {
        self.cri.requests.get_or_create(&CriCallLabels { method, code }).inc();
        self.cri
            .duration
            .get_or_create(&CriMethodLabels { method })
            .observe(took.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sinks::testing::assert_has;

    #[test]
    fn cri_calls_are_counted_by_method_and_code_and_timed_by_method() {
        let metrics = Metrics::new();
        let calls = CriCallMetrics::new(&metrics);
        calls.call_ended("ListImages", "OK", Duration::from_millis(2));
        calls.call_ended("ListImages", "OK", Duration::from_millis(3));
        calls.call_ended("ListImages", "Unavailable", Duration::from_millis(1));
        calls.call_ended("Status", "OK", Duration::from_millis(1));

        assert_has(
            &metrics,
            r#"imagegc_cri_requests_total{method="ListImages",code="OK"} 2"#,
        );
        assert_has(
            &metrics,
            r#"imagegc_cri_requests_total{method="ListImages",code="Unavailable"} 1"#,
        );
        assert_has(&metrics, r#"imagegc_cri_requests_total{method="Status",code="OK"} 1"#);
        assert_has(
            &metrics,
            r#"imagegc_cri_request_duration_seconds_count{method="ListImages"} 3"#,
        );
        assert_has(
            &metrics,
            r#"imagegc_cri_request_duration_seconds_count{method="Status"} 1"#,
        );
    }
}
