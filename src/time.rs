//! Time as the collector sees it.
//!
//! While the daemon runs, elapsed time is measured with the monotonic clock:
//! [`Clock::now`] is the wall-clock time at start plus the monotonic time
//! since, so a jump of the system clock cannot make images look old (or
//! young) by itself. Wall-clock timestamps are what gets persisted, so that
//! the next process can continue from them.

use std::time::{Duration, Instant, SystemTime};

/// A wall clock that advances with the monotonic clock.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    wall_at_start: SystemTime,
    mono_at_start: Instant,
}

impl Clock {
    /// Starts the clock at the current wall-clock time.
    pub fn start() -> Self {
        Clock {
            wall_at_start: SystemTime::now(),
            mono_at_start: Instant::now(),
        }
    }

    /// Starts the clock at a given wall-clock time (tests).
    pub fn starting_at(wall: SystemTime) -> Self {
        Clock {
            wall_at_start: wall,
            mono_at_start: Instant::now(),
        }
    }

    /// When this clock started: when this process began observing.
    pub fn started(&self) -> SystemTime {
        self.wall_at_start
    }

    /// The start time plus the monotonic time elapsed since.
    pub fn now(&self) -> SystemTime {
        self.wall_at_start + self.mono_at_start.elapsed()
    }

    /// Monotonic time since the start.
    pub fn elapsed(&self) -> Duration {
        self.mono_at_start.elapsed()
    }

    /// A time another party stamped with its wall clock (a runtime's event),
    /// on this clock: as long before [`Clock::now`] as it is before the
    /// wall clock now. A stamp in the future is now: nothing is used later
    /// than it is seen.
    pub fn from_wall(&self, stamped: SystemTime) -> SystemTime {
        let ago = SystemTime::now().duration_since(stamped).unwrap_or_default();
        let now = self.now();
        now.checked_sub(ago).unwrap_or(now)
    }
}

/// Milliseconds since the Unix epoch (0 for times before it).
pub fn to_unix_millis(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis().min(u64::MAX as u128) as u64)
}

pub fn from_unix_millis(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

/// RFC 3339 in UTC with seconds precision, for people and JSON.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Serializes a `SystemTime` as RFC 3339 (serde `serialize_with`).
pub fn serialize<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&rfc3339(*t))
}

/// "3m ago", "2h ago", "just now": how long before `now` a time was.
pub fn ago(t: SystemTime, now: SystemTime) -> String {
    match now.duration_since(t) {
        Ok(d) if d.as_secs() > 0 => format!("{} ago", short(d)),
        _ => "just now".to_string(),
    }
}

/// A compact duration with at most two units: `45s`, `3m`, `2h5m`, `3d4h`.
pub fn short(d: Duration) -> String {
    let s = d.as_secs();
    let (days, hours, mins, secs) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    match (days, hours, mins) {
        (0, 0, 0) => format!("{secs}s"),
        (0, 0, m) if secs == 0 => format!("{m}m"),
        (0, 0, m) => format!("{m}m{secs}s"),
        (0, h, 0) => format!("{h}h"),
        (0, h, m) => format!("{h}h{m}m"),
        (d, 0, _) => format!("{d}d"),
        (d, h, _) => format!("{d}d{h}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_advances_monotonically_from_its_start() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
        let clock = Clock::starting_at(start);
        let a = clock.now();
        let b = clock.now();
        assert!(a >= start && b >= a);
        assert_eq!(clock.started(), start);
    }

    #[test]
    fn millis_round_trip() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(from_unix_millis(to_unix_millis(t)), t);
    }

    #[test]
    fn short_durations() {
        assert_eq!(short(Duration::from_secs(45)), "45s");
        assert_eq!(short(Duration::from_secs(180)), "3m");
        assert_eq!(short(Duration::from_secs(185)), "3m5s");
        assert_eq!(short(Duration::from_secs(7500)), "2h5m");
        assert_eq!(short(Duration::from_secs(3 * 86_400 + 4 * 3600)), "3d4h");
    }
}
