//! The space pass's arithmetic, pure: whether a pass is due and when it
//! is done ([`SpaceTarget`]), what an image takes on disk
//! ([`DiskFootprint`]), whether images can reach low at all
//! ([`SpaceOutlook`]), and the walk over the space candidates ([`Walk`])
//! that the cycle drives with measurements and `plan` and the dry run drive
//! with the estimate: one stopping rule for all three.

use crate::fs::FsStats;
use crate::model::Image;
use crate::policy::headroom::Headroom;

use std::time::Duration;

pub use super::footprint::DiskFootprint;
use super::layers::Freeing;
use super::plan::{Candidate, KeptTally};

/// Whether a space pass is due, what it must free and when it is done: the
/// one answer the collector, its dry-run estimate and `plan` share. Bytes
/// use the kubelet's arithmetic (usage rounded up, see [`FsStats`]); inode
/// thresholds, when configured, start a pass too and must be met as well.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpaceTarget {
    high: u8,
    low: u8,
    /// `gc.high_inodes_percent` and `gc.low_inodes_percent`, when set.
    inodes: Option<(u8, u8)>,
    /// Free space kept above the kubelet's eviction line for the largest
    /// recent pull, when known (see [`Headroom`]).
    headroom: Option<Headroom>,
}

impl SpaceTarget {
    /// The thresholds: high and low percent of bytes
    /// (`gc.high_threshold_percent`, `gc.low_threshold_percent`), and of
    /// inodes when both are set (`gc.high_inodes_percent`,
    /// `gc.low_inodes_percent`).
    pub fn new(high: u8, low: u8, inodes: Option<(u8, u8)>) -> Self {
        SpaceTarget {
            high,
            low,
            inodes,
            headroom: None,
        }
    }

    /// The same thresholds, lowered where `headroom` needs it (see
    /// [`Headroom::thresholds`]).
    pub fn with_headroom(self, headroom: Option<Headroom>) -> Self {
        SpaceTarget { headroom, ..self }
    }

    /// The headroom these thresholds keep, if any.
    pub fn headroom(&self) -> Option<Headroom> {
        self.headroom
    }

    /// The byte thresholds `(high, low)` in force on a filesystem of
    /// `capacity` bytes: the configured ones, or lower for the headroom.
    pub fn in_force(&self, capacity: u64) -> (u8, u8) {
        match self.headroom {
            Some(headroom) => headroom.thresholds(self.high, self.low, capacity),
            None => (self.high, self.low),
        }
    }

    /// The disk usage, in percent of capacity, at which a space pass starts
    /// (`gc.high_threshold_percent`).
    pub fn high_percent(&self) -> u8 {
        self.high
    }

    /// The disk usage, in percent of capacity, that a space pass frees down to
    /// (`gc.low_threshold_percent`).
    pub fn low_percent(&self) -> u8 {
        self.low
    }

    /// True when usage (bytes, or inodes when configured) is at or above
    /// the high threshold.
    pub fn due(&self, stats: &FsStats) -> bool {
        stats.usage_percent() >= u64::from(self.in_force(stats.capacity_bytes).0)
            || self
                .inodes
                .is_some_and(|(high, _)| stats.inode_usage_percent().is_some_and(|u| u >= u64::from(high)))
    }

    /// Bytes to free to bring usage to the low threshold.
    pub fn bytes_to_free(&self, stats: &FsStats) -> u64 {
        stats.bytes_to_free(self.in_force(stats.capacity_bytes).1)
    }

    /// True when usage is at or below low, in bytes and (when configured)
    /// in inodes.
    pub fn reached(&self, stats: &FsStats) -> bool {
        self.bytes_to_free(stats) == 0 && self.inodes.is_none_or(|(_, low)| stats.inodes_to_free(low) == 0)
    }
}

/// Whether removing images can bring usage down to the low threshold
/// (kubernetes#71869: a disk full of logs, volumes or other data is not
/// fixed by removing images, only by removing every image again each time
/// the node pulls it back). Images kept only for being younger than
/// `gc.min_age` count as removable later: when they would suffice, low is
/// reachable once they age ([`SpaceOutlook::reached_once_aged`]), which is
/// no episode of thrash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SpaceOutlook {
    /// What reaching the low threshold needs.
    pub bytes_to_free: u64,
    /// What the candidates could free at most: their reported sizes times
    /// the runtime's [`DiskFootprint`]; `u64::MAX` when a candidate's size
    /// is unknown (reported as 0, as mid-pull), which can free anything.
    pub could_free: u64,
    /// What the images kept only for being younger than `gc.min_age` could
    /// free once they age, by the same arithmetic.
    pub could_free_once_aged: u64,
    /// How long until the first of those may go.
    #[serde(skip)]
    pub first_aged_after: Option<Duration>,
    /// Used bytes of the image filesystem that are not images: used minus
    /// [`SpaceOutlook::image_bytes`].
    pub not_image_bytes: u64,
    /// What the images take on the filesystem, and where that comes from.
    pub image_bytes: ImageBytes,
}

/// Where the figure of what images take on disk comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ImageBytesSource {
    /// The runtime's `ImageFsInfo` used bytes, found plausible.
    Runtime,
    /// The listed images' reported sizes times the runtime's
    /// [`DiskFootprint`] (shared layers counted in each image, which errs on
    /// the side of counting too much as images): the runtime reports none,
    /// a figure the listing contradicts (containerd 1.6 reports 0, or half
    /// the listed sizes), or a smaller one.
    Listing,
}

/// What the images take on the image filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ImageBytes {
    /// Bytes.
    pub bytes: u64,
    /// Where the figure comes from.
    pub source: ImageBytesSource,
}

impl ImageBytes {
    /// The larger of the listing's estimate (reported sizes times the
    /// footprint) and the runtime's figure (`reported`) when that is
    /// plausible: at least what the listing's reported sizes add up to
    /// (each image's content is on the filesystem) and at most the
    /// filesystem's `used` bytes. The larger: the figure errs on the side
    /// of counting too much as images, so that "images cannot fix this" is
    /// said only when even it says so.
    pub fn new(reported: Option<u64>, images: &[Image], footprint: DiskFootprint, used: u64) -> Self {
        let listed = images.iter().fold(0u64, |sum, i| sum.saturating_add(i.size));
        let estimate = images
            .iter()
            .fold(0u64, |sum, i| sum.saturating_add(footprint.on_disk(i.size)));
        match reported {
            Some(bytes) if bytes > 0 && bytes >= listed && bytes <= used && bytes > estimate => ImageBytes {
                bytes,
                source: ImageBytesSource::Runtime,
            },
            _ => ImageBytes {
                bytes: estimate,
                source: ImageBytesSource::Listing,
            },
        }
    }
}

impl SpaceOutlook {
    /// `candidates`: every image the pass may still remove; `young`: the
    /// plan's count of the images kept only for being younger than
    /// `gc.min_age`; `images`: every listed image; `reported`: what the
    /// runtime says images use (see [`ImageBytes::new`]).
    pub fn new<'c>(
        stats: &FsStats,
        low_percent: u8,
        candidates: impl IntoIterator<Item = &'c Candidate<'c>>,
        young: &KeptTally,
        images: &[Image],
        footprint: DiskFootprint,
        reported: Option<u64>,
    ) -> Self {
        let mut could_free = 0u64;
        for candidate in candidates {
            if candidate.size == 0 {
                could_free = u64::MAX;
                break;
            }
            could_free = could_free.saturating_add(footprint.on_disk(candidate.size));
        }
        let used = stats.capacity_bytes.saturating_sub(stats.available());
        let image_bytes = ImageBytes::new(reported, images, footprint, used);
        SpaceOutlook {
            bytes_to_free: stats.bytes_to_free(low_percent),
            could_free,
            could_free_once_aged: footprint.on_disk(young.young_bytes),
            first_aged_after: young.first_young_removable_after,
            not_image_bytes: used.saturating_sub(image_bytes.bytes),
            image_bytes,
        }
    }

    /// True when the candidates cannot free what reaching low needs, not
    /// even with the images that only need to age.
    pub fn unreachable(&self) -> bool {
        self.could_free.saturating_add(self.could_free_once_aged) < self.bytes_to_free
    }

    /// What stands between usage and low when the candidates cannot free
    /// what reaching it needs: data that is not images, or images kept
    /// (in use, pinned, protected, named by pods), and the images only too
    /// young to go yet, with when the first of them may.
    pub fn what_stands_in_the_way(&self) -> String {
        let short = self.bytes_to_free.saturating_sub(self.could_free);
        let mut said = if self.not_image_bytes >= short {
            format!(
                "the image filesystem holds data that is not images ({} bytes)",
                self.not_image_bytes
            )
        } else {
            format!(
                "images imagegc keeps (in use, pinned, protected or named by pods) hold the rest, and {} bytes \
                 are not images",
                self.not_image_bytes
            )
        };
        if self.could_free_once_aged > 0 {
            said.push_str(&format!(
                "; images younger than gc.min_age could free {} bytes once they age",
                self.could_free_once_aged
            ));
            if let Some(after) = self.first_aged_after {
                said.push_str(&format!(", the first in {}", crate::time::short(after)));
            }
        }
        said
    }

    /// When the candidates cannot free what reaching low needs now, but
    /// can with the images kept only for being younger than `gc.min_age`:
    /// how long until the first of those may go.
    pub fn reached_once_aged(&self) -> Option<Duration> {
        if self.could_free >= self.bytes_to_free || self.unreachable() {
            return None;
        }
        self.first_aged_after
    }
}

/// What a [`Walk`] says to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step<'w, 'a> {
    /// Remove this candidate, then tell the walk what came of it
    /// ([`Walk::removed`] or [`Walk::kept`]).
    Remove(&'w Candidate<'a>),
    /// Leave this candidate: imagegc removed it within `gc.thrash_window`
    /// while images cannot bring usage to low.
    HoldBack(&'w Candidate<'a>),
    /// Usage is at or below low: measured, or by the estimate.
    Done,
    /// No candidate is left and usage is still above low.
    LowNotReached {
        /// Bytes still to free to reach low (measured, or by the estimate).
        remaining: u64,
    },
}

/// The space pass over the space candidates, in order, with the one
/// stopping rule the cycle, its dry run and `plan` share: stop as soon as
/// usage is at or below low, by measurement after each removal when the
/// filesystem can be measured (the cycle), else by the estimate of what
/// each removal frees ([`Freeing`]: shared layers once; dry run and
/// `plan`, or a cycle whose statvfs starts failing midway: it falls back to
/// the estimate from the last reading).
/// Pure: whoever drives it does the removals and the measuring.
#[derive(Debug, Clone)]
pub struct Walk<'w, 'a> {
    target: SpaceTarget,
    candidates: &'w [Candidate<'a>],
    next: usize,
    /// The last reading.
    stats: FsStats,
    /// Bytes still to free by the estimate, once the walk estimates.
    estimate: Option<u64>,
    /// While the walk hurries (see [`Walk::hurry`]).
    hurry: Option<Hurry>,
    /// What each removal frees by the estimate, shared layers once.
    freeing: Freeing,
}

/// A walk in a hurry: usage is past the kubelet's eviction line, and each
/// removal counts by what it is expected to free on disk, without waiting
/// for its space to come back, until [`Walk::corrected`].
#[derive(Debug, Clone, Copy)]
struct Hurry {
    /// The reading the hurry started from.
    from: FsStats,
    /// On-disk bytes expected back since, by the walk's [`Freeing`].
    expected: u64,
    /// The last reading taken meanwhile, not waited for: what a runtime
    /// that deletes before it answers (CRI-O, containerd 1.x) or someone
    /// else freed shows at once, images of unknown size included.
    seen: Option<FsStats>,
    /// The bytes available past which the hurry is over: the kubelet's
    /// eviction line (and what the coming pulls need). Past it, the walk
    /// is measured again.
    line: u64,
}

impl<'w, 'a> Walk<'w, 'a> {
    /// A walk that re-measures after each removal, from `stats`.
    pub fn measured(target: SpaceTarget, stats: FsStats, candidates: &'w [Candidate<'a>]) -> Self {
        Walk {
            target,
            candidates,
            next: 0,
            stats,
            estimate: None,
            hurry: None,
            freeing: Freeing::default(),
        }
    }

    /// A walk that removes nothing for real (dry run, `plan`): it estimates
    /// from `stats` by what `freeing` says each removal frees, after
    /// `freed_before` bytes (what the age removals before it free by the
    /// same estimate: a dry run does not make them either; `freeing` has
    /// released them).
    pub fn estimated(
        target: SpaceTarget,
        stats: FsStats,
        candidates: &'w [Candidate<'a>],
        freed_before: u64,
        freeing: Freeing,
    ) -> Self {
        Walk {
            target,
            candidates,
            next: 0,
            stats,
            estimate: Some(target.bytes_to_free(&stats).saturating_sub(freed_before)),
            hurry: None,
            freeing,
        }
    }

    /// From here on, until [`Walk::corrected`], each removal counts by what
    /// `freeing` expects it to free on disk, and readings taken meanwhile
    /// are not waited for: usage is past the kubelet's eviction line, where
    /// the kubelet evicts pods at its next look (every 10 s), and the
    /// removals must take no longer than their `RemoveImage` calls. The
    /// hurry removes only what the line needs by the estimate: once
    /// `line` bytes are available by it, the walk says
    /// [`Step::Done`] for the caller to measure ([`Walk::corrected`]) and
    /// go on measured (an estimate can be far off: layers that compress
    /// well take several times what the runtime reports). A walk by the
    /// estimate (dry run, `plan`) does not hurry: it waits on nothing.
    pub fn hurry(&mut self, freeing: Freeing, line: u64) {
        if self.estimate.is_none() && self.hurry.is_none() {
            self.freeing = freeing;
            self.hurry = Some(Hurry {
                from: self.stats,
                expected: 0,
                seen: None,
                line,
            });
        }
    }

    /// The reading a hurry started from, while the walk hurries.
    pub fn hurried_from(&self) -> Option<FsStats> {
        self.hurry.map(|h| h.from)
    }

    /// True while the walk hurries (see [`Walk::hurry`]).
    pub fn hurrying(&self) -> bool {
        self.hurry.is_some()
    }

    /// The hurry's estimate corrected by a reading once the space came back
    /// (`None`: it could not be measured, and the walk estimates from the
    /// hurry's estimate on). Returns the bytes the hurry expected back and
    /// the bytes that came back, when measured.
    pub fn corrected(&mut self, measured: Option<FsStats>) -> Option<(u64, Option<u64>)> {
        let by_estimate = self.current();
        let hurry = self.hurry.take()?;
        let expected = hurry.expected;
        match measured {
            Some(stats) => {
                self.stats = stats;
                Some((expected, Some(stats.available().saturating_sub(hurry.from.available()))))
            }
            None => {
                self.stats = hurry.from;
                self.estimate = Some(self.target.bytes_to_free(&by_estimate));
                Some((expected, None))
            }
        }
    }

    /// The filesystem as the walk counts it now: the last reading, or in a
    /// hurry, the reading it started from with the bytes expected back, or
    /// the last reading taken meanwhile when it shows more available.
    fn current(&self) -> FsStats {
        match self.hurry {
            Some(hurry) => {
                let mut stats = hurry.from;
                stats.available_bytes = stats
                    .available()
                    .saturating_add(hurry.expected)
                    .min(stats.capacity_bytes);
                stats.free_bytes = stats
                    .free_bytes
                    .saturating_add(hurry.expected)
                    .min(stats.capacity_bytes);
                match hurry.seen {
                    Some(seen) if seen.available() > stats.available() => seen,
                    _ => stats,
                }
            }
            None => self.stats,
        }
    }

    /// True when usage is at or below low; in a hurry, also once the
    /// eviction line is cleared by the estimate (see [`Walk::hurry`]).
    pub fn reached(&self) -> bool {
        match (self.estimate, self.hurry) {
            (Some(left), _) => left == 0,
            (None, Some(hurry)) => {
                let current = self.current();
                current.available() >= hurry.line || self.target.reached(&current)
            }
            (None, None) => self.target.reached(&self.current()),
        }
    }

    /// Bytes still to free to reach low.
    pub fn remaining(&self) -> u64 {
        self.estimate
            .unwrap_or_else(|| self.target.bytes_to_free(&self.current()))
    }

    /// The last reading of the filesystem (in a hurry: the one it started
    /// from, with the bytes expected back).
    pub fn stats(&self) -> FsStats {
        self.current()
    }

    /// True when the walk goes by the estimate rather than measurements.
    pub fn estimating(&self) -> bool {
        self.estimate.is_some()
    }

    /// The next step: `hold_back` says which candidates are left alone.
    pub fn next(&mut self, hold_back: impl Fn(&Candidate<'a>) -> bool) -> Step<'w, 'a> {
        if self.reached() {
            return Step::Done;
        }
        let Some(candidate) = self.candidates.get(self.next) else {
            return Step::LowNotReached {
                remaining: self.remaining(),
            };
        };
        self.next += 1;
        if hold_back(candidate) {
            Step::HoldBack(candidate)
        } else {
            Step::Remove(candidate)
        }
    }

    /// The candidate of the last [`Step::Remove`] went, reported at `size`
    /// bytes; `measured` is the filesystem after it, `None` when it could
    /// not be measured (the walk then estimates from the last reading on).
    /// In a hurry, `measured` is a reading not waited for: the removal
    /// counts by what it is expected to free, or by the reading when it
    /// shows more back. Returns what it is expected to free on disk (see
    /// [`Freeing::release`]).
    pub fn removed(&mut self, size: u64, measured: Option<FsStats>) -> u64 {
        let expected = match self.next.checked_sub(1).and_then(|i| self.candidates.get(i)) {
            Some(candidate) => self.freeing.release(candidate.id, size),
            None => self.freeing.release("", size),
        };
        if let Some(hurry) = &mut self.hurry {
            hurry.expected = hurry.expected.saturating_add(expected);
            hurry.seen = measured.or(hurry.seen);
            return expected;
        }
        match (&mut self.estimate, measured) {
            (Some(left), _) => *left = left.saturating_sub(expected),
            (None, Some(stats)) => self.stats = stats,
            (None, None) => {
                self.estimate = Some(self.target.bytes_to_free(&self.stats).saturating_sub(expected));
            }
        }
        expected
    }

    /// The candidate of the last [`Step::Remove`] was kept (in use now,
    /// gone already, or the removal failed); `measured`, when given, is a
    /// new reading: someone else may have freed space meanwhile.
    pub fn kept(&mut self, measured: Option<FsStats>) {
        if let Some(hurry) = &mut self.hurry {
            hurry.seen = measured.or(hurry.seen);
            return;
        }
        if self.estimate.is_none()
            && let Some(stats) = measured
        {
            self.stats = stats;
        }
    }
}

/// What a walk by the estimate removes when no candidate is kept on the
/// way: `plan`'s forecast, and what a dry-run cycle reports when nothing
/// changes between the two.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forecast<'w, 'a> {
    /// The space candidates the walk removes, in order.
    pub removals: Vec<&'w Candidate<'a>>,
    /// The ones it holds back (see [`Step::HoldBack`]).
    pub held_back: Vec<&'w Candidate<'a>>,
    /// Bytes still to free when the walk ends (0 when it reaches low).
    pub remaining: u64,
    /// What each removal is expected to free on disk, in the order of
    /// [`Forecast::removals`] (shared layers counted once).
    pub frees: Vec<u64>,
}

impl<'w, 'a> Forecast<'w, 'a> {
    /// Runs `walk` (by the estimate: [`Walk::estimated`]) to its end.
    pub fn of(mut walk: Walk<'w, 'a>, hold_back: impl Fn(&Candidate<'a>) -> bool) -> Self {
        let mut forecast = Forecast {
            removals: Vec::new(),
            held_back: Vec::new(),
            remaining: 0,
            frees: Vec::new(),
        };
        loop {
            match walk.next(&hold_back) {
                Step::Remove(candidate) => {
                    forecast.removals.push(candidate);
                    forecast.frees.push(walk.removed(candidate.size, None));
                }
                Step::HoldBack(candidate) => forecast.held_back.push(candidate),
                Step::Done => return forecast,
                Step::LowNotReached { remaining } => {
                    forecast.remaining = remaining;
                    return forecast;
                }
            }
        }
    }
}

/// Reported sizes added up; sizes are the runtime's word, so absurd ones
/// saturate rather than overflow.
pub fn total_size<'c, 'a: 'c>(candidates: impl IntoIterator<Item = &'c Candidate<'a>>) -> u64 {
    candidates.into_iter().fold(0u64, |sum, c| sum.saturating_add(c.size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Dialect;
    use crate::policy::Reason;
    use crate::testing::library_image as image;
    use std::time::{Duration, SystemTime};

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    /// A space candidate of `image`, first seen and last used at `t(0)`.
    fn candidate(image: &Image) -> Candidate<'_> {
        Candidate {
            id: &image.id,
            tags: &image.repo_tags,
            digests: &image.repo_digests,
            size: image.size,
            first_seen: t(0),
            last_used: t(0),
            reason: Reason::Space,
            usual_break: None,
        }
    }

    #[test]
    fn containerd_images_take_at_least_twice_their_reported_size_and_measured_removals_raise_it() {
        let mut containerd = DiskFootprint::for_dialect(&Dialect::of("containerd"));
        assert_eq!(containerd.on_disk(100), 200);
        assert_eq!(DiskFootprint::for_dialect(&Dialect::of("cri-o")).on_disk(100), 100);
        // A removal that freed less (shared layers) never lowers it.
        containerd.learn(100, 50);
        assert_eq!(containerd.on_disk(100), 200);
        containerd.learn(100, 350);
        assert_eq!(containerd.on_disk(100), 350);
        // Nor does one that freed far more (someone else deleted data) make
        // every image look huge.
        containerd.learn(1, u64::MAX);
        assert_eq!(containerd.on_disk(100), 800);
        containerd.learn(0, 1000);
        assert_eq!(containerd.on_disk(u64::MAX), u64::MAX, "no overflow");
    }

    #[test]
    fn an_outlook_on_containerd_counts_content_and_snapshot_as_images() {
        // 1000 bytes, 800 used, all of it four 100-byte (compressed) images
        // taking 200 each; low 40 needs 400 freed, which two candidates do.
        let stats = FsStats {
            capacity_bytes: 1000,
            available_bytes: 200,
            free_bytes: 200,
            ..FsStats::default()
        };
        let images: Vec<Image> = ["a", "b", "c", "d"].iter().map(|n| image(n, 100)).collect();
        let candidates = [candidate(&images[0]), candidate(&images[1])];
        let outlook = SpaceOutlook::new(
            &stats,
            40,
            &candidates,
            &KeptTally::default(),
            &images,
            DiskFootprint::for_dialect(&Dialect::of("containerd")),
            None,
        );
        assert!(!outlook.unreachable(), "{outlook:?}");
        assert_eq!(outlook.not_image_bytes, 0);
        // Sizes taken as the whole image on disk: a false "cannot".
        let naive = SpaceOutlook::new(
            &stats,
            40,
            &candidates,
            &KeptTally::default(),
            &images,
            DiskFootprint::for_dialect(&Dialect::of("cri-o")),
            None,
        );
        assert!(naive.unreachable());
        assert_eq!(naive.not_image_bytes, 400);
        // A candidate of unknown size can free anything.
        let unknown = image("e", 0);
        let outlook = SpaceOutlook::new(
            &stats,
            40,
            &[candidate(&unknown)],
            &KeptTally::default(),
            &images,
            DiskFootprint::default(),
            None,
        );
        assert!(!outlook.unreachable());
    }

    #[test]
    fn images_that_only_need_to_age_make_low_reachable_later_not_unreachable() {
        // 1000 bytes, 800 used; low 40 needs 400 freed. The one candidate
        // frees 100; two images of 150 are kept only for gc.min_age.
        let stats = FsStats {
            capacity_bytes: 1000,
            available_bytes: 200,
            free_bytes: 200,
            ..FsStats::default()
        };
        let images: Vec<Image> = ["a", "b", "c"].iter().map(|n| image(n, 100)).collect();
        let old = Candidate {
            id: &images[0].id,
            tags: &images[0].repo_tags,
            digests: &images[0].repo_digests,
            size: 100,
            first_seen: t(0),
            last_used: t(0),
            reason: Reason::Space,
            usual_break: None,
        };
        let young = |bytes| KeptTally {
            first_young_removable_after: Some(Duration::from_secs(240)),
            young_bytes: bytes,
            ..KeptTally::default()
        };
        let outlook =
            |tally: &KeptTally| SpaceOutlook::new(&stats, 40, [&old], tally, &images, DiskFootprint::default(), None);
        let later = outlook(&young(300));
        assert!(!later.unreachable(), "{later:?}");
        assert_eq!(later.reached_once_aged(), Some(Duration::from_secs(240)));
        // Not enough even once they age: unreachable, as before.
        let never = outlook(&young(200));
        assert!(never.unreachable());
        assert_eq!(never.reached_once_aged(), None);
        // Enough now: nothing to wait for.
        let big = Candidate { size: 500, ..old };
        let now = SpaceOutlook::new(&stats, 40, [&big], &young(300), &images, DiskFootprint::default(), None);
        assert_eq!(now.reached_once_aged(), None);
    }

    #[test]
    fn the_runtimes_image_bytes_count_only_when_the_listing_does_not_contradict_them() {
        let images: Vec<Image> = ["a", "b"].iter().map(|n| image(n, 100)).collect();
        let containerd = DiskFootprint::for_dialect(&Dialect::of("containerd"));
        let from = |reported| ImageBytes::new(reported, &images, containerd, 800);
        // Plausible and more than the estimate: used.
        assert_eq!(from(Some(500)).source, ImageBytesSource::Runtime);
        assert_eq!(from(Some(500)).bytes, 500);
        // containerd 1.6: 0, or half the listed sizes; or more than is
        // used; or less than the estimate, which is kept as the larger.
        for implausible in [None, Some(0), Some(100), Some(900), Some(300)] {
            let bytes = from(implausible);
            assert_eq!(bytes.source, ImageBytesSource::Listing, "{implausible:?}");
            assert_eq!(bytes.bytes, 400, "the listing's sizes times the footprint");
        }
    }

    #[test]
    fn what_stands_between_usage_and_low_is_named() {
        let outlook = |not_image_bytes, once_aged| SpaceOutlook {
            bytes_to_free: 500,
            could_free: 100,
            could_free_once_aged: once_aged,
            first_aged_after: Some(Duration::from_secs(7)),
            not_image_bytes,
            image_bytes: ImageBytes {
                bytes: 0,
                source: ImageBytesSource::Listing,
            },
        };
        assert_eq!(
            outlook(450, 0).what_stands_in_the_way(),
            "the image filesystem holds data that is not images (450 bytes)"
        );
        // An image just pulled and in use, old ones seconds short of
        // gc.min_age: images, not other data.
        let said = outlook(50, 200).what_stands_in_the_way();
        assert!(said.starts_with("images imagegc keeps"), "{said}");
        assert!(
            said.ends_with("images younger than gc.min_age could free 200 bytes once they age, the first in 7s"),
            "{said}"
        );
    }

    #[test]
    fn a_walk_in_a_hurry_counts_removals_by_footprint_and_is_corrected_by_a_reading() {
        let full = FsStats {
            capacity_bytes: 1000,
            available_bytes: 0,
            free_bytes: 0,
            ..FsStats::default()
        };
        let images: Vec<Image> = ["a", "b", "c"].iter().map(|n| image(n, 50)).collect();
        let candidates: Vec<Candidate<'_>> = images.iter().map(candidate).collect();
        // Low 80 %: 200 to free; containerd's footprint counts 100 a removal.
        let target = SpaceTarget::new(90, 80, None);
        let mut walk = Walk::measured(target, full, &candidates);
        walk.hurry(
            Freeing::whole(DiskFootprint::for_dialect(&Dialect::of("containerd"))),
            1000,
        );
        assert!(matches!(walk.next(|_| false), Step::Remove(c) if c.id == "a"));
        // A reading taken meanwhile (nothing back yet) changes nothing.
        walk.removed(50, Some(full));
        assert_eq!(walk.remaining(), 100);
        assert!(matches!(walk.next(|_| false), Step::Remove(c) if c.id == "b"));
        walk.removed(50, None);
        assert_eq!(walk.next(|_| false), Step::Done, "low by the estimate");
        // Measured: only 150 came back.
        let after = FsStats {
            available_bytes: 150,
            free_bytes: 150,
            ..full
        };
        assert_eq!(walk.corrected(Some(after)), Some((200, Some(150))));
        assert!(!walk.hurrying());
        assert_eq!(walk.remaining(), 50);
        assert!(matches!(walk.next(|_| false), Step::Remove(c) if c.id == "c"));
        // A reading taken meanwhile that shows more back than expected (a
        // runtime that deletes before it answers) counts.
        let mut walk = Walk::measured(target, full, &candidates);
        walk.hurry(
            Freeing::whole(DiskFootprint::for_dialect(&Dialect::of("containerd"))),
            1000,
        );
        let _ = walk.next(|_| false);
        walk.removed(50, Some(after));
        assert_eq!(walk.remaining(), 50, "150 seen back, not the 100 expected");
        // Not measurable: the walk estimates from the hurry's estimate on.
        let mut walk = Walk::measured(target, full, &candidates);
        walk.hurry(
            Freeing::whole(DiskFootprint::for_dialect(&Dialect::of("containerd"))),
            1000,
        );
        let _ = walk.next(|_| false);
        walk.removed(50, None);
        assert_eq!(walk.corrected(None), Some((100, None)));
        assert!(walk.estimating());
        assert_eq!(walk.remaining(), 100);
        // A walk by the estimate (dry run, `plan`) never hurries.
        let mut estimated = Walk::estimated(target, full, &candidates, 0, Default::default());
        estimated.hurry(Freeing::default(), 1000);
        assert!(!estimated.hurrying());
        // The hurry ends where the line is cleared by the estimate (100
        // available: one removal), not at low: the walk measures then.
        let mut walk = Walk::measured(target, full, &candidates);
        walk.hurry(
            Freeing::whole(DiskFootprint::for_dialect(&Dialect::of("containerd"))),
            100,
        );
        assert!(matches!(walk.next(|_| false), Step::Remove(c) if c.id == "a"));
        walk.removed(50, None);
        assert_eq!(walk.next(|_| false), Step::Done, "past the line by the estimate");
        // Six times what was expected came back: low is reached, and no
        // more goes.
        let six = FsStats {
            available_bytes: 600,
            free_bytes: 600,
            ..full
        };
        assert_eq!(walk.corrected(Some(six)), Some((100, Some(600))));
        assert!(walk.reached());
        assert_eq!(walk.next(|_| false), Step::Done);
    }
}
