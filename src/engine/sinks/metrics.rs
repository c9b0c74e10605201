//! The metrics the engine's events set (see [`crate::outputs::metrics`]):
//! one arm per event that moves a metric.

use std::sync::{Arc, Mutex, PoisonError};

use crate::engine::events::{Event, Sink};
use crate::outputs::metrics::{CycleTimer, Metrics};

/// The metrics (see [`crate::outputs::metrics`]).
pub struct MetricsSink {
    metrics: Arc<Metrics>,
    /// The cycle being timed: one dropped unfinished (abandoned at
    /// shutdown) records a failed cycle.
    timer: Mutex<Option<CycleTimer>>,
}

impl MetricsSink {
    /// A sink updating `metrics`.
    pub fn new(metrics: &Arc<Metrics>) -> Self {
        MetricsSink {
            metrics: Arc::clone(metrics),
            timer: Mutex::new(None),
        }
    }
}

impl Sink for MetricsSink {
    fn emit(&self, event: &Event<'_>) {
        let m = &self.metrics;
        match event {
            Event::Configured {
                dry_run,
                high,
                low,
                kubelet,
            } => {
                m.set_dry_run(*dry_run);
                m.set_thresholds(*high, *low);
                m.set_kubelet(kubelet.read, kubelet.image_gc_enabled, kubelet.high_above_eviction);
            }
            Event::HistoryLoaded { last_success: Some(at) } => m.restore_last_success(*at),
            Event::RuntimeUp(up) => m.set_runtime_up(*up),
            Event::ImageFsMismatch(why) => m.set_image_fs_mismatch(why.is_some()),
            Event::ContainerFsUsage(measured) => {
                m.set_container_filesystem(measured.map(|(path, s)| (path, s.capacity_bytes, s.available())));
            }
            Event::MountsUnread(why) => m.set_container_mounts_unknown(why.is_some()),
            Event::Repulled { .. } => m.repulled(),
            Event::Hurrying { .. } => m.hurried(),
            Event::MakingRoom { pulls, .. } => m.made_room(pulls.len()),
            Event::PullsCannotFit { pulls, .. } => m.set_cannot_fit(pulls.len()),
            Event::Planned {
                in_use,
                unused,
                protected,
                candidates,
                ..
            } => {
                m.set_images(*in_use, *unused, *protected);
                m.set_candidates(*candidates);
            }
            Event::Usage { stats, due } => {
                m.set_usage_ratio(stats.usage_ratio());
                m.set_filesystem(stats.capacity_bytes, stats.available());
                m.set_space_pass_due(*due);
            }
            Event::UsageUnmeasured => m.set_usage_ratio(0.0),
            Event::SpacePassSkipped(_) => m.set_space_pass_due(false),
            Event::SpaceUnreachable { outlook, .. } => m.set_space_unreachable(outlook.is_some()),
            Event::Removed(removal) if !removal.dry_run => m.removed(removal.reason, removal.freed_bytes.unwrap_or(0)),
            Event::RemovedByOthers { images, at } => {
                m.removed_by_others(images.len(), images.iter().map(|i| i.size).sum(), *at);
            }
            Event::RemovalFailed { .. } | Event::RemovalNotDone { .. } => m.removal_failed(),
            Event::CycleStarted => {
                *self.timer.lock().unwrap_or_else(PoisonError::into_inner) = Some(m.cycle_timer());
            }
            Event::CycleFinished(report) => {
                if let Some(timer) = self.timer.lock().unwrap_or_else(PoisonError::into_inner).take() {
                    timer.finish(report.succeeded());
                }
            }
            _ => {}
        }
    }
}
