//! When the next cycle and the next usage check come ([`Schedule`]): the one
//! schedule that `daemon::run` follows in real time and `simulate`'s replay
//! follows in simulated time, so that what the replay measures between
//! cycles is what the daemon does.
//!
//! Pure: every instant is a [`Duration`] since an origin the caller picks
//! (the daemon's start, the trace's second 0), and what happened (a cycle
//! ended, usage was measured, a poll failed, a pod was bound, a pull's
//! size was read, the configuration changed) comes in as a call. The
//! schedule reads no clock and sleeps on nothing.

use std::time::Duration;

use super::cycle::USAGE_CHECK_INTERVAL;

/// The least time between two cycles that usage crossing the high threshold
/// starts, while the last of them left usage at or above high and no image
/// arrived since: usage oscillating around high that images cannot bring
/// down (another writer filling and freeing the disk) starts at most one
/// cycle per spacing, and a crossing inside it schedules a cycle at its end
/// rather than being dropped. A cycle that brought usage below high
/// answered its crossing: the next crossing is a new fill, answered at
/// once (a disk filling in steps must not wait while eviction nears).
/// Images listed since the last cycle are something it did not see: at or
/// above high, they start a cycle at once, crossing or not (at most one per
/// listing that shows new images). Three times the kubelet's eviction
/// period.
pub const CROSSING_SPACING: Duration = Duration::from_secs(30);

/// Retry delays after the runtime could not be reached (at start, and for
/// cycles and event streams later): doubling from the first to the cap (and
/// never beyond the interval).
pub const RETRY_FIRST: Duration = Duration::from_secs(1);
/// See [`RETRY_FIRST`].
pub const RETRY_CAP: Duration = Duration::from_secs(60);

/// How a cycle ended, for the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// It ran (whatever it removed).
    Ran {
        /// When a space pass that stopped above low for images too young
        /// comes back, when sooner than the interval.
        look_again: Option<Duration>,
    },
    /// The runtime could not be reached: retried with backoff.
    Failed,
}

/// A usage measurement between cycles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Measured {
    /// Usage is at or above the high threshold in force.
    pub due: bool,
    /// How many listings so far showed images first seen then.
    pub arrivals: u64,
    /// The thresholds in force moved since the last measurement (a coming
    /// pull sized, a pod bound or gone).
    pub thresholds_moved: bool,
}

/// Why a measurement moved the next cycle earlier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Usage crossed the high threshold.
    Crossing {
        /// When the cycle starts: now, or the end of the
        /// [`CROSSING_SPACING`] of the last crossing's cycle.
        at: Duration,
    },
    /// Usage stayed at or above high, and images arrived or the thresholds
    /// moved since the last cycle.
    Arrived {
        /// When the cycle starts: now.
        at: Duration,
    },
}

impl Start {
    /// When the cycle starts.
    pub fn at(self) -> Duration {
        match self {
            Start::Crossing { at } | Start::Arrived { at } => at,
        }
    }
}

/// The schedule of cycles and usage checks: a cycle at the start and one
/// `gc.interval` after each cycle's end, sooner when a space pass comes
/// back for images too young or usage crosses the high threshold between
/// cycles (measured every [`USAGE_CHECK_INTERVAL`], and at once when a pod
/// is bound or a pull's size is read); after a failure, retries with
/// backoff.
#[derive(Debug, Clone)]
pub struct Schedule {
    interval: Duration,
    check_every: Duration,
    next_cycle: Duration,
    next_check: Duration,
    /// Whether usage was at or above high at the last measurement: a space
    /// pass starts early only when usage crosses high, not while it stays
    /// above after a cycle that could not bring it down.
    space_due: bool,
    /// When the last cycle a crossing started was due to start.
    crossing_cycle: Option<Duration>,
    /// Arrivals when the last cycle ended: more since means images arrived
    /// that no cycle has seen.
    arrivals_seen: u64,
    retry: Duration,
    /// When the last cycle ended, while the next one is scheduled one
    /// interval after it: a new interval reschedules it.
    interval_from: Option<Duration>,
}

impl Schedule {
    /// A schedule starting at `now`, with its first cycle then: cycles
    /// every `interval`, usage checked every `usage_poll_interval` or
    /// [`USAGE_CHECK_INTERVAL`], whichever is shorter; `arrivals`: the
    /// arrivals counted so far.
    pub fn new(now: Duration, interval: Duration, usage_poll_interval: Duration, arrivals: u64) -> Self {
        let check_every = check_every(usage_poll_interval);
        Schedule {
            interval,
            check_every,
            next_cycle: now,
            next_check: now + check_every,
            space_due: false,
            crossing_cycle: None,
            arrivals_seen: arrivals,
            retry: RETRY_FIRST,
            interval_from: None,
        }
    }

    /// When the next cycle is due.
    pub fn next_cycle(&self) -> Duration {
        self.next_cycle
    }

    /// When usage is next measured.
    pub fn next_check(&self) -> Duration {
        self.next_check
    }

    /// The configuration changed: a new interval reschedules a cycle that
    /// was one interval after the last one's end. Returns whether it did.
    pub fn reconfigure(&mut self, interval: Duration, usage_poll_interval: Duration) -> bool {
        let old = std::mem::replace(&mut self.interval, interval);
        self.check_every = check_every(usage_poll_interval);
        match self.interval_from {
            Some(ended) if interval != old => {
                self.next_cycle = ended + interval;
                true
            }
            _ => false,
        }
    }

    /// A cycle ended at `now`; `arrivals`: the arrivals counted by then;
    /// `due`: whether usage measured right after is at or above high
    /// (`None`: it could not be measured).
    pub fn cycle_ended(&mut self, now: Duration, ended: Ended, arrivals: u64, due: Option<bool>) {
        self.arrivals_seen = arrivals;
        match ended {
            Ended::Ran { look_again } => {
                self.retry = RETRY_FIRST;
                self.next_cycle = now + self.interval;
                self.interval_from = Some(now);
                if let Some(at) = look_again {
                    self.next_cycle = self.next_cycle.min(at);
                }
            }
            Ended::Failed => {
                self.next_cycle = now + self.retry.min(self.interval);
                self.retry = (self.retry * 2).min(RETRY_CAP);
                self.interval_from = None;
            }
        }
        self.space_due = due.unwrap_or(false);
        if !self.space_due {
            // Usage below high: the crossing was answered, and the next one
            // is a new fill (see CROSSING_SPACING).
            self.crossing_cycle = None;
        }
        self.next_check = now + self.check_every;
    }

    /// A usage poll failed at `now`: the runtime is down, the next cycle
    /// comes at the retry delay at the latest.
    pub fn poll_failed(&mut self, now: Duration) {
        self.next_cycle = self.next_cycle.min(now + self.retry);
        self.interval_from = None;
    }

    /// Something that may move the thresholds in force happened at `now`
    /// (a pod bound, a coming pull's size read): usage is measured at once.
    pub fn look_now(&mut self, now: Duration) {
        self.next_check = self.next_check.min(now);
    }

    /// Usage was measured at `now` (`None`: it could not be). Returns the
    /// start it moved the next cycle to, if it did.
    pub fn measured(&mut self, now: Duration, measured: Option<Measured>) -> Option<Start> {
        self.next_check = now + self.check_every;
        let measured = measured?;
        let arrived = measured.arrivals != self.arrivals_seen || measured.thresholds_moved;
        let at = if arrived {
            now
        } else {
            self.crossing_cycle
                .map_or(now, |last| (last + CROSSING_SPACING).max(now))
        };
        let was_due = std::mem::replace(&mut self.space_due, measured.due);
        if !(measured.due && (!was_due || arrived) && self.next_cycle > at) {
            return None;
        }
        self.next_cycle = at;
        self.crossing_cycle = Some(at);
        self.interval_from = None;
        Some(if was_due {
            Start::Arrived { at }
        } else {
            Start::Crossing { at }
        })
    }

    /// Cycles that found the node as the last one did, and so did as it
    /// did, were skipped (`simulate`'s quiet stretches): the last of them
    /// ended at `last`, the next is due at `next`.
    pub fn skipped_cycles(&mut self, last: Duration, next: Duration) {
        self.next_cycle = next;
        self.interval_from = Some(last);
        self.next_check = last + self.check_every;
    }

    /// The checks due at or before `t`, when none of them can find anything
    /// new (nothing changed since the last measurement): skipped, the next
    /// one put where the daemon's would be, the first after `t`.
    pub fn checks_found_nothing_until(&mut self, t: Duration) {
        if self.next_check > t || self.check_every.is_zero() {
            return;
        }
        let behind = (t - self.next_check).as_nanos() / self.check_every.as_nanos() + 1;
        let step = self.check_every.as_nanos().saturating_mul(behind);
        self.next_check += Duration::from_nanos(u64::try_from(step).unwrap_or(u64::MAX));
    }
}

/// How often usage is measured between cycles: [`USAGE_CHECK_INTERVAL`],
/// or the usage poll interval when that is shorter.
fn check_every(usage_poll_interval: Duration) -> Duration {
    USAGE_CHECK_INTERVAL.min(usage_poll_interval)
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn schedule() -> Schedule {
        Schedule::new(secs(0), secs(300), secs(30), 0)
    }

    fn measured(due: bool, arrivals: u64) -> Option<Measured> {
        Some(Measured {
            due,
            arrivals,
            thresholds_moved: false,
        })
    }

    #[test]
    fn cycles_come_at_the_start_then_one_interval_after_each_end_and_usage_every_two_seconds() {
        let mut s = schedule();
        assert_eq!((s.next_cycle(), s.next_check()), (secs(0), secs(2)));
        s.cycle_ended(secs(3), Ended::Ran { look_again: None }, 0, Some(false));
        assert_eq!((s.next_cycle(), s.next_check()), (secs(303), secs(5)));
        // A usage poll interval shorter than two seconds measures as often.
        let s = Schedule::new(secs(0), secs(300), Duration::from_secs(1), 0);
        assert_eq!(s.next_check(), secs(1));
    }

    #[test]
    fn a_space_pass_short_of_low_for_young_images_comes_back_when_the_first_may_go() {
        let mut s = schedule();
        s.cycle_ended(
            secs(10),
            Ended::Ran {
                look_again: Some(secs(70)),
            },
            0,
            Some(true),
        );
        assert_eq!(s.next_cycle(), secs(70));
        // Never later than the interval.
        s.cycle_ended(
            secs(70),
            Ended::Ran {
                look_again: Some(secs(900)),
            },
            0,
            Some(true),
        );
        assert_eq!(s.next_cycle(), secs(370));
    }

    #[test]
    fn a_crossing_starts_a_cycle_at_once_and_staying_above_does_not() {
        let mut s = schedule();
        s.cycle_ended(secs(0), Ended::Ran { look_again: None }, 0, Some(false));
        assert_eq!(s.measured(secs(2), measured(false, 0)), None);
        assert_eq!(s.next_check(), secs(4));
        assert_eq!(
            s.measured(secs(4), measured(true, 0)),
            Some(Start::Crossing { at: secs(4) })
        );
        assert_eq!(s.next_cycle(), secs(4));
        s.cycle_ended(secs(4), Ended::Ran { look_again: None }, 0, Some(true));
        // Still above, nothing new: the interval.
        assert_eq!(s.measured(secs(6), measured(true, 0)), None);
        assert_eq!(s.next_cycle(), secs(304));
        // An image arrived: at once.
        assert_eq!(
            s.measured(secs(8), measured(true, 1)),
            Some(Start::Arrived { at: secs(8) })
        );
        assert_eq!(s.next_cycle(), secs(8));
    }

    #[test]
    fn crossings_while_cycles_cannot_bring_usage_down_come_at_most_one_per_spacing() {
        let mut s = schedule();
        s.cycle_ended(secs(0), Ended::Ran { look_again: None }, 0, Some(false));
        assert_eq!(
            s.measured(secs(2), measured(true, 0)),
            Some(Start::Crossing { at: secs(2) })
        );
        s.cycle_ended(secs(3), Ended::Ran { look_again: None }, 0, Some(true));
        // Another writer frees, then fills again: the second crossing waits
        // for the spacing from the first one's cycle.
        assert_eq!(s.measured(secs(5), measured(false, 0)), None);
        assert_eq!(
            s.measured(secs(7), measured(true, 0)),
            Some(Start::Crossing {
                at: secs(2) + CROSSING_SPACING
            })
        );
        assert_eq!(s.next_cycle(), secs(32));
        // A cycle that brings usage below high answered the crossing: the
        // next is a new fill, at once.
        s.cycle_ended(secs(32), Ended::Ran { look_again: None }, 0, Some(false));
        assert_eq!(
            s.measured(secs(34), measured(true, 0)),
            Some(Start::Crossing { at: secs(34) })
        );
    }

    #[test]
    fn failures_retry_with_backoff_capped_by_the_interval() {
        let mut s = Schedule::new(secs(0), secs(20), secs(30), 0);
        let mut at = secs(0);
        let mut delays = Vec::new();
        for _ in 0..7 {
            s.cycle_ended(at, Ended::Failed, 0, None);
            delays.push((s.next_cycle() - at).as_secs());
            at = s.next_cycle();
        }
        assert_eq!(delays, [1, 2, 4, 8, 16, 20, 20]);
        // A cycle that ran starts the backoff again.
        s.cycle_ended(at, Ended::Ran { look_again: None }, 0, None);
        s.cycle_ended(at, Ended::Failed, 0, None);
        assert_eq!(s.next_cycle() - at, secs(1));
        // A failed poll brings the next cycle to the retry delay.
        s.cycle_ended(at, Ended::Ran { look_again: None }, 0, None);
        s.poll_failed(at + secs(5));
        assert_eq!(s.next_cycle(), at + secs(6));
    }

    #[test]
    fn a_new_interval_reschedules_from_the_last_end_and_a_moved_threshold_looks_at_once() {
        let mut s = schedule();
        s.cycle_ended(secs(10), Ended::Ran { look_again: None }, 0, Some(false));
        assert!(s.reconfigure(secs(60), secs(30)));
        assert_eq!(s.next_cycle(), secs(70));
        assert!(!s.reconfigure(secs(60), secs(30)), "the same interval");
        s.look_now(secs(11));
        assert_eq!(s.next_check(), secs(11));
        let moved = Measured {
            due: true,
            arrivals: 0,
            thresholds_moved: true,
        };
        assert_eq!(
            s.measured(secs(11), Some(moved)),
            Some(Start::Crossing { at: secs(11) })
        );
        s.cycle_ended(secs(11), Ended::Ran { look_again: None }, 0, Some(true));
        // Above high, thresholds moved again (another pod): at once.
        assert_eq!(s.measured(secs(12), Some(moved)), Some(Start::Arrived { at: secs(12) }));
    }

    #[test]
    fn checks_that_find_nothing_are_skipped_to_where_the_daemons_next_one_is() {
        let mut s = schedule();
        s.cycle_ended(secs(1), Ended::Ran { look_again: None }, 0, Some(false));
        assert_eq!(s.next_check(), secs(3));
        s.checks_found_nothing_until(secs(2));
        assert_eq!(s.next_check(), secs(3));
        s.checks_found_nothing_until(secs(3));
        assert_eq!(s.next_check(), secs(5), "the check at 3 ran before what happened at 3");
        s.checks_found_nothing_until(secs(100));
        assert_eq!(s.next_check(), secs(101));
    }
}
