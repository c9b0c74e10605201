//! Time as the collector sees it.
//!
//! While the daemon runs, elapsed time is measured with the monotonic clock:
//! [`Clock::now`] is the wall-clock time at start plus the monotonic time
//! since, so a jump of the system clock cannot make images look old (or
//! young) by itself. Wall-clock timestamps are what gets persisted, so that
//! the next process can continue from them.
//!
//! Durations are written here too, for people: [`parse_duration`] reads
//! what a configuration file or a flag says (humantime or Go style), and
//! [`format_duration`] writes a duration so that it reads back equal;
//! [`short`] and [`ago`] are for tables, in at most two units. Nothing here
//! reads a file or knows a configuration key.

use std::time::{Duration, Instant, SystemTime};

/// A wall clock that advances with the monotonic clock.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    wall_at_start: SystemTime,
    mono_at_start: Instant,
    /// In unit tests that pause tokio's clock: that clock instead, so that
    /// the collector's time and the daemon's timers advance together.
    #[cfg(test)]
    tokio_at_start: Option<tokio::time::Instant>,
}

impl Clock {
    /// Starts the clock at the current wall-clock time.
    #[expect(
        clippy::disallowed_methods,
        reason = "the wall-clock time at start, which the monotonic clock then advances"
    )]
    pub fn start() -> Self {
        Clock {
            wall_at_start: SystemTime::now(),
            mono_at_start: Instant::now(),
            #[cfg(test)]
            tokio_at_start: None,
        }
    }

    /// Starts the clock at a given wall-clock time (tests).
    pub fn starting_at(wall: SystemTime) -> Self {
        Clock {
            wall_at_start: wall,
            mono_at_start: Instant::now(),
            #[cfg(test)]
            tokio_at_start: None,
        }
    }

    /// A clock at `wall` now that advances with tokio's clock (paused or
    /// not) rather than the monotonic one.
    #[cfg(test)]
    pub fn following_tokio(wall: SystemTime) -> Self {
        Clock {
            tokio_at_start: Some(tokio::time::Instant::now()),
            ..Self::starting_at(wall)
        }
    }

    /// When this clock started: when this process began observing.
    pub fn started(&self) -> SystemTime {
        self.wall_at_start
    }

    /// The start time plus the monotonic time elapsed since.
    pub fn now(&self) -> SystemTime {
        self.wall_at_start + self.elapsed()
    }

    /// Monotonic time since the start.
    pub fn elapsed(&self) -> Duration {
        #[cfg(test)]
        if let Some(start) = self.tokio_at_start {
            return start.elapsed();
        }
        self.mono_at_start.elapsed()
    }

    /// A time another party stamped with its wall clock (a runtime's event),
    /// on this clock: as long before [`Clock::now`] as it is before the
    /// wall clock now. A stamp in the future is now: nothing is used later
    /// than it is seen.
    #[expect(
        clippy::disallowed_methods,
        reason = "how long ago another party's stamp was, by the wall clock it was stamped with"
    )]
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

/// The time `ms` milliseconds after the Unix epoch (the inverse of
/// [`to_unix_millis`] for times after it).
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

// Durations as people write them: in configuration files and flags.

/// The error [`parse_duration`] gives for a negative duration, so that
/// callers can say so rather than "invalid".
pub(crate) const NEGATIVE_DURATION: &str = "must not be negative";

/// Parses a duration written humantime style (`90s`, `5m`, `1h30m`,
/// `1h 30m`, `14d`, `2w`) or Go style (`2m0s`, `1h0m0s`, `1.5h`, `300ms`,
/// `10us`, `10µs`, `5ns`), or a plain `0`. A negative duration (`-1s`) gives
/// the error `"must not be negative"`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    // Every leading minus sign is read in this loop, not by recursion: a
    // file may hold a megabyte of them, and a frame each would overflow
    // the stack.
    let mut text = text.trim();
    let mut negative = false;
    while let Some(rest) = text.strip_prefix('-') {
        negative = true;
        text = rest.trim();
    }
    match parse_magnitude(text)? {
        nonzero if negative && !nonzero.is_zero() => Err(NEGATIVE_DURATION.to_owned()),
        duration => Ok(duration),
    }
}

/// A duration without its minus signs: an optional `+`, then numbers each
/// followed by a unit, or a plain `0`.
fn parse_magnitude(text: &str) -> Result<Duration, String> {
    let text = text.strip_prefix('+').unwrap_or(text);
    if text.is_empty() {
        return Err("empty duration".to_owned());
    }
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut nanos: u128 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_end);
        if number.is_empty() {
            return Err(format!("expected a number at {rest:?}"));
        }
        let after = after.trim_start();
        let unit_end = after.find(|c: char| !c.is_alphabetic()).unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        if unit.is_empty() {
            return Err(format!(
                "missing unit after {number:?} (use ns, us, ms, s, m, h, d or w)"
            ));
        }
        let unit_nanos =
            unit_nanos(unit).ok_or_else(|| format!("unknown unit {unit:?} (use ns, us, ms, s, m, h, d or w)"))?;
        nanos = scale(number, unit_nanos)
            .and_then(|part| nanos.checked_add(part))
            .ok_or_else(|| format!("{number:?} is not a number or is too large"))?;
        rest = after.trim_start();
    }
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| "duration is too large".to_owned())?;
    Ok(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// Nanoseconds in one `unit`.
fn unit_nanos(unit: &str) -> Option<u128> {
    const SECOND: u128 = 1_000_000_000;
    Some(match unit {
        "ns" | "nsec" | "nanos" => 1,
        "us" | "µs" | "μs" | "usec" | "micros" => 1_000,
        "ms" | "msec" | "millis" => 1_000_000,
        "s" | "sec" | "secs" | "second" | "seconds" => SECOND,
        "m" | "min" | "mins" | "minute" | "minutes" => 60 * SECOND,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3_600 * SECOND,
        "d" | "day" | "days" => 86_400 * SECOND,
        "w" | "week" | "weeks" => 7 * 86_400 * SECOND,
        _ => return None,
    })
}

/// `number` (digits with an optional fraction, as Go allows: `1.5`, `.5`,
/// `1.`) times `unit_nanos`, truncated to whole nanoseconds; `None` when it
/// is not a number or overflows.
fn scale(number: &str, unit_nanos: u128) -> Option<u128> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return None;
    }
    let whole: u128 = if whole.is_empty() { 0 } else { whole.parse().ok()? };
    // Digits past the 18th are far below a nanosecond for every unit.
    let fraction = &fraction[..fraction.len().min(18)];
    let fraction_nanos = if fraction.is_empty() {
        0
    } else {
        fraction.parse::<u128>().ok()? * unit_nanos / 10u128.pow(fraction.len() as u32)
    };
    whole.checked_mul(unit_nanos)?.checked_add(fraction_nanos)
}

/// A compact form of `duration` that [`parse_duration`] reads back:
/// `5m`, `1h30m`, `14d`, `1s500ms`, `0s`.
pub fn format_duration(duration: Duration) -> String {
    if duration.is_zero() {
        return "0s".to_owned();
    }
    let mut out = String::new();
    let mut secs = duration.as_secs();
    for (size, unit) in [(86_400, "d"), (3_600, "h"), (60, "m"), (1, "s")] {
        if secs >= size {
            out.push_str(&format!("{}{unit}", secs / size));
            secs %= size;
        }
    }
    let nanos = duration.subsec_nanos();
    if nanos == 0 {
        // Nothing below a second.
    } else if nanos.is_multiple_of(1_000_000) {
        out.push_str(&format!("{}ms", nanos / 1_000_000));
    } else if nanos.is_multiple_of(1_000) {
        out.push_str(&format!("{}us", nanos / 1_000));
    } else {
        out.push_str(&format!("{nanos}ns"));
    }
    out
}

/// Sleeps until `at`, or forever when there is no `at`: a `select!` arm
/// for a wake-up that may not be scheduled.
pub async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
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

    #[test]
    fn durations_humantime_and_go_style() {
        let ms = Duration::from_millis;
        let cases = [
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("90s", secs(90)),
            ("5m", secs(300)),
            ("1h30m", secs(5400)),
            ("1h 30m", secs(5400)),
            (" 2m ", secs(120)),
            ("14d", secs(14 * 86_400)),
            ("2w", secs(14 * 86_400)),
            ("2m0s", secs(120)),
            ("1h0m0s", secs(3600)),
            ("168h0m0s", secs(168 * 3600)),
            ("1.5h", secs(5400)),
            (".5s", ms(500)),
            ("1.s", secs(1)),
            ("300ms", ms(300)),
            ("1s500ms", ms(1500)),
            ("10us", Duration::from_micros(10)),
            ("10µs", Duration::from_micros(10)),
            ("10μs", Duration::from_micros(10)),
            ("5ns", Duration::from_nanos(5)),
            ("1.000000001s", Duration::new(1, 1)),
            ("+5m", secs(300)),
            ("1 hour 2 minutes", secs(3720)),
            ("3 days", secs(3 * 86_400)),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_duration(text), Ok(expected), "{text:?}");
        }
    }

    #[test]
    fn durations_rejected() {
        for text in [
            "",
            " ",
            "abc",
            "5",
            "5x",
            "1..5s",
            "m",
            "1h-1m",
            "1 fortnight",
            "s5",
            "1.5.2s",
            "99999999999999999999999w",
            "5m10",
        ] {
            let err = parse_duration(text).expect_err(text);
            assert_ne!(err, NEGATIVE_DURATION, "{text:?}");
        }
        assert_eq!(parse_duration("-1s"), Err(NEGATIVE_DURATION.to_owned()));
        assert_eq!(parse_duration("-2m0s"), Err(NEGATIVE_DURATION.to_owned()));
        assert_eq!(parse_duration("-0s"), Ok(Duration::ZERO));
        assert_ne!(parse_duration("-abc"), Err(NEGATIVE_DURATION.to_owned()));
        assert!(parse_duration("5").unwrap_err().contains("missing unit"));
    }

    /// One sign at a time, a duration behind a megabyte of minus signs (as
    /// a configuration file may hold) would take a stack frame for each.
    #[test]
    fn a_duration_behind_a_million_minus_signs_is_negative_without_overflowing_the_stack() {
        let minus = "-".repeat(1_000_000);
        assert_eq!(parse_duration(&format!("{minus}1m")), Err(NEGATIVE_DURATION.to_owned()));
        assert_eq!(parse_duration(&format!("{minus}0s")), Ok(Duration::ZERO));
        assert_eq!(
            parse_duration(&format!("{minus} - 2m")),
            Err(NEGATIVE_DURATION.to_owned())
        );
        assert!(
            parse_duration(&format!("{minus}x"))
                .unwrap_err()
                .contains("expected a number")
        );
    }

    #[test]
    fn durations_formatted() {
        let cases = [
            (Duration::ZERO, "0s"),
            (secs(300), "5m"),
            (secs(120), "2m"),
            (secs(90), "1m30s"),
            (secs(5400), "1h30m"),
            (secs(14 * 86_400), "14d"),
            (secs(86_400 + 1), "1d1s"),
            (Duration::from_millis(1500), "1s500ms"),
            (Duration::from_micros(10), "10us"),
            (Duration::new(0, 5), "5ns"),
        ];
        for (duration, text) in cases {
            assert_eq!(format_duration(duration), text);
        }
    }

    #[test]
    fn formatted_durations_parse_back() {
        let mut n: u64 = 1;
        while n < u64::MAX / 7 {
            for duration in [
                Duration::from_secs(n),
                Duration::from_nanos(n),
                Duration::from_millis(n / 3 + 1),
            ] {
                assert_eq!(parse_duration(&format_duration(duration)), Ok(duration), "{duration:?}");
            }
            n = n * 7 + 3;
        }
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }
}
