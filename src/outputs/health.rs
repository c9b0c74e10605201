//! Liveness and readiness: the two facts the probes report, set by the daemon
//! loop and read by the HTTP endpoint. No IO.

use std::sync::Mutex;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Liveness and readiness, shared as `Arc<Health>` between the daemon loop,
/// which reports, and the HTTP endpoint, which answers probes.
#[derive(Debug)]
pub struct Health {
    ready: AtomicBool,
    last_heartbeat: Mutex<Instant>,
    /// In nanoseconds: a reload that changes `gc.interval` or
    /// `runtime.timeout` changes it (see [`Health::set_liveness_window`]).
    liveness_window_nanos: AtomicU64,
}

impl Health {
    /// Starts not ready and alive: construction counts as the first heartbeat,
    /// so the daemon has one `liveness_window` to reach its first iteration.
    pub fn new(liveness_window: Duration) -> Health {
        Health {
            ready: AtomicBool::new(false),
            last_heartbeat: Mutex::new(Instant::now()),
            liveness_window_nanos: AtomicU64::new(nanos(liveness_window)),
        }
    }

    /// How long the loop may go without a heartbeat before `/healthz` fails.
    pub fn liveness_window(&self) -> Duration {
        Duration::from_nanos(self.liveness_window_nanos.load(Ordering::Relaxed))
    }

    /// Changes the liveness window, for a reloaded configuration whose cycles
    /// may take longer (or must take less) than the one the daemon started with.
    pub fn set_liveness_window(&self, window: Duration) {
        self.liveness_window_nanos.store(nanos(window), Ordering::Relaxed);
    }

    /// Set to true only when the last contact with the runtime succeeded.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// True when the last contact with the runtime succeeded: `/readyz`
    /// answers 200 then, 503 otherwise.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// The daemon loop calls this on every iteration.
    pub fn heartbeat(&self) {
        *self.lock_heartbeat() = Instant::now();
    }

    /// True while the last heartbeat is less than the liveness window old. Uses
    /// the monotonic clock, so wall clock jumps neither kill nor revive the daemon.
    pub fn is_alive(&self) -> bool {
        self.is_alive_at(Instant::now())
    }

    fn is_alive_at(&self, now: Instant) -> bool {
        now.saturating_duration_since(*self.lock_heartbeat()) < self.liveness_window()
    }

    fn lock_heartbeat(&self) -> std::sync::MutexGuard<'_, Instant> {
        // The guarded value is a plain Instant, valid even if a holder panicked.
        self.last_heartbeat.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A duration in nanoseconds, saturating (`u64` holds 584 years).
fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alive_from_construction_until_the_window_passes() {
        let health = Health::new(Duration::from_secs(60));
        let start = *health.lock_heartbeat();
        assert!(health.is_alive_at(start + Duration::from_secs(59)));
        assert!(!health.is_alive_at(start + Duration::from_secs(60)));
    }

    #[test]
    fn a_heartbeat_restarts_the_window() {
        let health = Health::new(Duration::from_secs(60));
        health.heartbeat();
        let beat = *health.lock_heartbeat();
        assert!(health.is_alive_at(beat + Duration::from_secs(59)));
        assert!(!health.is_alive_at(beat + Duration::from_secs(61)));
    }

    #[test]
    fn a_new_window_applies_to_the_last_heartbeat() {
        let health = Health::new(Duration::from_secs(60));
        let beat = *health.lock_heartbeat();
        health.set_liveness_window(Duration::from_secs(3600));
        assert_eq!(health.liveness_window(), Duration::from_secs(3600));
        assert!(health.is_alive_at(beat + Duration::from_secs(61)));
        assert!(!health.is_alive_at(beat + Duration::from_secs(3600)));
    }

    #[test]
    fn a_zero_window_is_never_alive() {
        assert!(!Health::new(Duration::ZERO).is_alive());
    }

    #[test]
    fn not_ready_until_told() {
        let health = Health::new(Duration::from_secs(60));
        assert!(!health.is_ready());
        health.set_ready(true);
        assert!(health.is_ready());
        health.set_ready(false);
        assert!(!health.is_ready());
    }
}
