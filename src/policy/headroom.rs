//! Headroom: free space kept above the kubelet's eviction line for the
//! largest pull this node has seen lately, so that one pull cannot take the
//! image filesystem from below the high threshold past the line before any
//! collector can react (a 200 MiB image lands in seconds: its blobs, then
//! its unpack in one step; the kubelet's eviction manager looks every
//! 10 s). Where that pull would not fit between the high threshold and the
//! line, the thresholds move down for it: the space pass starts earlier and
//! frees as far below as the configured gap between high and low. A node
//! whose pulls fit keeps its thresholds.

use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::config::EvictionThreshold;
use crate::model::Image;

/// How long a pull counts for the headroom: a week, which covers the
/// weekly jobs and releases that bring the biggest images back.
pub const HEADROOM_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

/// The most headroom asks for, in percent of the filesystem's capacity: a
/// pull larger than a quarter of the disk is not made safe by emptying it,
/// and the thresholds must not sink to where every image goes. (With the
/// line below high, they sink by less than this many points.)
const MAX_SHARE_PERCENT: u64 = 25;

/// The largest image that arrived on the node within [`HEADROOM_WINDOW`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LargestPull {
    /// Its first tag (or id).
    pub image: String,
    /// Its reported size.
    pub size_bytes: u64,
    /// When it was first seen.
    #[serde(serialize_with = "crate::time::serialize")]
    pub at: SystemTime,
}

impl LargestPull {
    /// `image` arriving at `at`, named by its first tag (or its id).
    pub fn of(image: &Image, at: SystemTime) -> Self {
        LargestPull {
            image: image.repo_tags.first().map_or_else(|| image.id.clone(), str::to_string),
            size_bytes: image.size,
            at,
        }
    }

    /// Keeps in `largest` the larger of it and `pull` (see
    /// [`LargestPull::larger`]).
    pub fn note(largest: &mut Option<LargestPull>, pull: LargestPull, now: SystemTime) {
        *largest = Self::larger(largest.take(), Some(pull), now);
    }

    /// The larger of two pulls, either of which may be older than the
    /// window at `now` (and then does not count).
    pub fn larger(a: Option<LargestPull>, b: Option<LargestPull>, now: SystemTime) -> Option<LargestPull> {
        let recent = |p: &LargestPull| now.duration_since(p.at).map_or(true, |ago| ago <= HEADROOM_WINDOW);
        match (a.filter(recent), b.filter(recent)) {
            (Some(a), Some(b)) => Some(if b.size_bytes > a.size_bytes { b } else { a }),
            (a, b) => a.or(b),
        }
    }
}

/// What the headroom asks of the thresholds (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Headroom {
    /// The kubelet's eviction line.
    pub line: EvictionThreshold,
    /// What the largest recent pull takes on disk (`gc.headroom`; at most
    /// a quarter of the disk counts).
    pub recent: u64,
    /// What the pulls coming for pods bound to the node take on disk
    /// (`kubernetes.room_before_pulls`, see [`super::coming`]): known pulls,
    /// so all of it counts.
    pub coming: u64,
}

impl Headroom {
    /// The headroom for a recent pull of `recent` bytes on disk and coming
    /// pulls of `coming` bytes on disk below the line `line`: none when
    /// both are 0 or the kubelet keeps no space on the image filesystem.
    pub fn new(line: EvictionThreshold, recent: u64, coming: u64) -> Option<Headroom> {
        let keeps = match line {
            EvictionThreshold::Percent(p) => p > 0.0,
            EvictionThreshold::Bytes(b) => b > 0,
        };
        (keeps && (recent > 0 || coming > 0)).then_some(Headroom { line, recent, coming })
    }

    /// The bytes to keep available on a filesystem of `capacity` bytes:
    /// the eviction line's, and the larger of the recent pull's (at most a
    /// quarter of the disk) and the coming pulls'.
    pub fn min_available(&self, capacity: u64) -> u64 {
        let recent = self.recent.min(capacity / 100 * MAX_SHARE_PERCENT);
        self.line
            .min_available_bytes(capacity)
            .saturating_add(recent.max(self.coming))
    }

    /// The thresholds `(high, low)` in force on a filesystem of `capacity`
    /// bytes: `high` lowered to where the headroom is still free (usage
    /// rounded up, as the kubelet rounds it), and `low` as far below it as
    /// configured; unchanged where the pull fits under the configured high.
    pub fn thresholds(&self, high: u8, low: u8, capacity: u64) -> (u8, u8) {
        let line_percent =
            (u128::from(self.line.min_available_bytes(capacity)) * 100).div_ceil(u128::from(capacity.max(1)));
        if capacity == 0 || u128::from(high) + line_percent >= 100 {
            // High at or above the line: the configuration's thresholds.
            return (high, low);
        }
        let keep = u128::from(self.min_available(capacity)).min(u128::from(capacity));
        // The highest usage percent at which `keep` bytes are still
        // available: usage u% leaves (100 - u)% at least.
        let kept_percent = (keep * 100).div_ceil(u128::from(capacity));
        let fits = 100u128.saturating_sub(kept_percent) as u8;
        if fits >= high {
            return (high, low);
        }
        let gap = high.saturating_sub(low);
        (fits, fits.saturating_sub(gap).min(low))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    #[test]
    fn a_pull_that_fits_between_high_and_the_line_leaves_the_thresholds_alone() {
        // 100 GiB, the kubelet's 15 %, high 80: 5 GiB between high and the line.
        let headroom = Headroom {
            line: EvictionThreshold::Percent(15.0),
            recent: 4 * GIB,
            coming: 0,
        };
        assert_eq!(headroom.thresholds(80, 75, 100 * GIB), (80, 75));
    }

    #[test]
    fn a_bigger_pull_lowers_both_thresholds_by_what_it_needs() {
        // 10 GiB to keep above the line: 25 % free, high 75, low 70.
        let headroom = Headroom {
            line: EvictionThreshold::Percent(15.0),
            recent: 10 * GIB,
            coming: 0,
        };
        assert_eq!(headroom.thresholds(80, 75, 100 * GIB), (75, 70));
        // A bit more than a whole percent rounds the threshold down.
        let headroom = Headroom {
            line: EvictionThreshold::Percent(15.0),
            recent: 10 * GIB + 1,
            coming: 0,
        };
        assert_eq!(headroom.thresholds(80, 75, 100 * GIB), (74, 69));
        // An absolute line.
        let headroom = Headroom {
            line: EvictionThreshold::Bytes(20 * GIB),
            recent: 10 * GIB,
            coming: 0,
        };
        assert_eq!(headroom.thresholds(75, 70, 100 * GIB), (70, 65));
        // High at or above the line: the configuration accepts crossing it.
        assert_eq!(headroom.thresholds(80, 75, 100 * GIB), (80, 75));
    }

    #[test]
    fn a_pull_larger_than_a_quarter_of_the_disk_asks_only_a_quarter() {
        let headroom = Headroom {
            line: EvictionThreshold::Percent(15.0),
            recent: 80 * GIB,
            coming: 0,
        };
        assert_eq!(headroom.thresholds(80, 75, 100 * GIB), (60, 55));
        // Nothing overflows, nothing divides by zero.
        let huge = Headroom {
            line: EvictionThreshold::Bytes(u64::MAX),
            recent: u64::MAX,
            coming: 0,
        };
        assert_eq!(
            huge.thresholds(80, 75, u64::MAX),
            (80, 75),
            "a line above the whole disk"
        );
        assert_eq!(huge.thresholds(80, 75, 0), (80, 75));
    }

    #[test]
    fn only_pulls_within_the_window_count_and_the_larger_wins() {
        let pull = |size, at| LargestPull {
            image: "x".into(),
            size_bytes: size,
            at,
        };
        let now = t(HEADROOM_WINDOW.as_secs() + 100);
        let old = Some(pull(9, t(0)));
        let recent = Some(pull(3, t(HEADROOM_WINDOW.as_secs())));
        assert_eq!(LargestPull::larger(old.clone(), recent.clone(), now), recent);
        let bigger = Some(pull(5, now));
        assert_eq!(LargestPull::larger(recent, bigger.clone(), now), bigger);
        assert_eq!(LargestPull::larger(old, None, now), None);
    }
}
