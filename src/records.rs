//! Per-image records (first seen, last used, size, pinned, names) and how a
//! snapshot of the runtime updates them, following the kubelet's rules:
//!
//! - every listed container, in any state, keeps its image in use and moves
//!   the image's last-used time to now;
//! - an image seen for the first time gets first seen = now, and counts as
//!   last used when first seen until a container uses it;
//! - records of images the runtime no longer lists are dropped after
//!   [`VANISHED_GRACE`]: one empty or partial listing (a runtime restarting,
//!   a pull in progress) must not reset the ages of every image. An image
//!   listed again within the grace gets its history back.
//!
//! Records are persisted by [`crate::store::state`]; a record loaded from disk is
//! marked `from_history` so the planner knows its times were observed, not
//! invented at start-up.

use std::collections::hash_map::Entry;
use std::time::{Duration, SystemTime};

use crate::model::matching::{Matches, References};
/// A record's tags or digests: the listing's own, shared (see [`Names`]).
pub use crate::model::names::Names;
use crate::model::{Container, Image, Snapshot};

use crate::collections::HashMap;

/// How long the record of an image the runtime stopped listing is kept, in
/// case the listing was a hiccup: two default cycles. An image imagegc
/// removes itself is forgotten at once.
pub const VANISHED_GRACE: std::time::Duration = std::time::Duration::from_secs(10 * 60);

/// How many removed images' uses are remembered, at most: an image removed
/// and pulled again gets its usual break back, so a periodic job's image
/// keeps what was learnt of its period (about 100 bytes each).
pub const REMOVED_MEMORY: usize = 10_000;
/// How long a removed image's use is remembered.
pub const REMOVED_MEMORY_FOR: Duration = Duration::from_secs(30 * 24 * 3600);

/// The shortest time unused that counts as a break between two uses: three
/// default cycles. A container running all along is seen by every cycle
/// and every poll in between (every 30 s), so its image's last use never
/// falls this far behind while imagegc observes. A gap it did not observe
/// whole (its own downtime, a runtime outage) is no break, however long:
/// see [`Records::observation_broken`].
pub const MIN_BREAK: Duration = Duration::from_secs(15 * 60);

/// What imagegc knows about one image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// When imagegc first saw the image listed (kept across restarts by the
    /// state file).
    pub first_seen: SystemTime,
    /// When a container (any state) was last seen naming the image; equal to
    /// `first_seen` until one does.
    pub last_used: SystemTime,
    /// The size the runtime last reported, in bytes.
    pub size: u64,
    /// The runtime's pinned flag, as last listed.
    pub pinned: bool,
    /// The image's tags, as last listed (kept so the state file names an
    /// image after it is gone): the listing's copy, not one of its own.
    pub tags: Names,
    /// The image's repository digests, as last listed.
    pub digests: Names,
    /// True when the record came from the state file (or survived a cycle
    /// that was itself loaded from it): its times span a previous process.
    pub from_history: bool,
    /// Whether a container was ever seen using the image, by this process
    /// or an earlier one (kept in the state file: the times cannot tell,
    /// since loading moves last-used times forward past first sightings).
    pub ever_used: bool,
    /// The usual break between two uses of the image, and how far breaks
    /// stray from it: set when a container is seen using it again after at
    /// least [`MIN_BREAK`] unused, each new break then weighing half (so it
    /// follows a job whose period changes). Only a gap imagegc observed
    /// whole counts: not one that spans its start or the runtime coming
    /// back after an outage. What `gc.order = "reuse"` expects the next
    /// break to be.
    pub usual_break: Option<Break>,
}

/// A usual break between two uses, in whole seconds (at least one, at most
/// 136 years), and its spread: how far breaks stray from it, on average
/// (each new break's distance from the usual one weighing half, as the
/// break itself does). A periodic job's breaks hardly stray; those of an
/// image used at random stray by about their mean. One break alone tells
/// no spread. Eight bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Break {
    usual: std::num::NonZeroU32,
    /// Whole seconds, at most `u32::MAX - 1`; [`NO_SPREAD`] when not known.
    spread: u32,
}

/// [`Break::spread`] not known: one break seen.
const NO_SPREAD: u32 = u32::MAX;

impl Break {
    /// `d`, in whole seconds, at least one; its spread not known (the
    /// first break).
    pub fn from_duration(d: Duration) -> Self {
        let secs = u32::try_from(d.as_secs()).unwrap_or(u32::MAX).max(1);
        Break {
            usual: std::num::NonZeroU32::new(secs).unwrap_or(std::num::NonZeroU32::MIN),
            spread: NO_SPREAD,
        }
    }

    /// The same usual break, with this spread (in whole seconds).
    pub fn with_spread(self, spread: Option<Duration>) -> Self {
        Break {
            spread: spread.map_or(NO_SPREAD, |s| {
                u32::try_from(s.as_secs()).unwrap_or(NO_SPREAD - 1).min(NO_SPREAD - 1)
            }),
            ..self
        }
    }

    /// The usual break, as a duration.
    pub fn duration(self) -> Duration {
        Duration::from_secs(self.usual.get().into())
    }

    /// How far breaks stray from the usual one, once two were seen.
    pub fn spread(self) -> Option<Duration> {
        (self.spread != NO_SPREAD).then(|| Duration::from_secs(self.spread.into()))
    }

    /// After one more break of `unused`: the usual break and the spread
    /// each move halfway to what this break showed.
    pub fn after(self, unused: Duration) -> Self {
        let usual = self.duration();
        let strayed = usual.abs_diff(unused);
        let spread = self.spread().map_or(strayed, |s| (s + strayed) / 2);
        Break::from_duration((usual + unused) / 2).with_spread(Some(spread))
    }
}

impl Record {
    /// A container was seen using the image at `now`. When observation
    /// went on unbroken since `observed_since` (`None`: no break can be
    /// told, or none is wanted), the image was used before (not only
    /// pulled) no earlier than that, and unused for at least [`MIN_BREAK`],
    /// that time unused is a break between two uses. True when something
    /// the state file keeps changed, beyond the time.
    fn used_at(&mut self, now: SystemTime, observed_since: Option<SystemTime>) -> bool {
        let mut changed = false;
        if observed_since.is_some_and(|since| self.last_used >= since)
            && self.ever_used
            && let Ok(unused) = now.duration_since(self.last_used)
            && unused >= MIN_BREAK
        {
            self.usual_break = Some(
                self.usual_break
                    .map_or_else(|| Break::from_duration(unused), |b| b.after(unused)),
            );
            changed = true;
        }
        self.last_used = self.last_used.max(now);
        if !self.ever_used {
            self.ever_used = true;
            changed = true;
        }
        changed
    }
}

/// All records, keyed by image id.
#[derive(Debug, Clone, Default)]
pub struct Records {
    map: HashMap<String, Record>,
    /// Records of images the runtime stopped listing, with when it did:
    /// kept for [`VANISHED_GRACE`] and saved with the others, invisible to
    /// the planner.
    vanished: HashMap<String, (Record, SystemTime)>,
    /// Whether anything other than last-used times changed since the last
    /// save: an image appeared or went, or its size, pin or names changed.
    changed: bool,
    /// What was learnt of the use of images removed (by imagegc or anyone)
    /// that were ever used, for [`REMOVED_MEMORY_FOR`], at most
    /// [`REMOVED_MEMORY`] of them; saved with the records.
    removed: HashMap<String, Removed>,
    /// Since when this process has observed the runtime without a break:
    /// set by the first listing after the process started or after
    /// [`Records::observation_broken`]; `None` until then. A gap in an
    /// image's use that began before it was not observed whole.
    observed_since: Option<SystemTime>,
    /// What measured removals showed layers take on disk (see
    /// [`crate::policy::layers`]): digest, bytes, when; saved with the
    /// records.
    layer_sizes: Vec<(String, u64, SystemTime)>,
    /// What measured removals raised the on-disk bytes per reported byte
    /// to (see [`crate::policy::DiskFootprint::learnt`]); saved with the
    /// records.
    footprint: Option<(u64, u64)>,
    /// Removed images whose layers others still held (see
    /// [`crate::policy::layers::Ghost`]): layers, reported size, when;
    /// saved with the records.
    layer_ghosts: Vec<(Vec<String>, u64, SystemTime)>,
}

/// A removed image's use, remembered in case it is pulled again.
#[derive(Debug, Clone, Copy)]
struct Removed {
    usual_break: Option<Break>,
    last_used: SystemTime,
    removed_at: SystemTime,
}

/// What one listing did to the records, beyond last-used times.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RecordChanges {
    /// Images seen for the first time, by their place in the listing (not
    /// their ids: on a first cycle that would be a copy of every id).
    pub new: Vec<usize>,
    /// Images no longer listed whose records are kept for the grace.
    pub vanished: usize,
    /// Those images as their records knew them (the listing omits them:
    /// removed, or a partial listing; only `ImageStatus` can tell).
    pub unlisted: Vec<Unlisted>,
    /// Images listed again within the grace: their history is back.
    pub returned: usize,
    /// Records dropped because their image stayed unlisted past the grace.
    pub dropped: usize,
}

/// An image a listing omitted for the first time, as its record knew it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unlisted {
    /// Its id.
    pub id: String,
    /// Its tags as last listed.
    pub tags: Names,
    /// The size the runtime last reported, in bytes.
    pub size: u64,
    /// When imagegc first saw it listed.
    pub first_seen: SystemTime,
}

/// Equal records hold the same images with the same facts; what changed
/// since the last save is not part of them.
impl PartialEq for Records {
    fn eq(&self, other: &Self) -> bool {
        self.map == other.map
    }
}

impl Eq for Records {}

impl Records {
    /// No records: a fresh start.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records from `(image id, record)` pairs, all counted as listed now (none
    /// vanished, none known to be in use by this process).
    pub fn from_map(map: impl IntoIterator<Item = (String, Record)>) -> Self {
        Records {
            map: map.into_iter().collect(),
            ..Self::default()
        }
    }

    /// Records as the state file held them, in a map of the records' own
    /// kind (no rehashing of every id).
    pub(crate) fn from_loaded(map: HashMap<String, Record>) -> Self {
        Records { map, ..Self::default() }
    }

    /// What is remembered of the images removed after they were used (see
    /// [`Records::remove`]), for the state file: id, last used, removed at,
    /// usual break.
    pub fn removed_memory(&self) -> impl Iterator<Item = (&str, SystemTime, SystemTime, Option<Break>)> {
        self.removed
            .iter()
            .map(|(id, r)| (id.as_str(), r.last_used, r.removed_at, r.usual_break))
    }

    /// What measured removals showed layers take on disk, for the state
    /// file: digest, bytes, when measured.
    pub fn layer_sizes(&self) -> impl Iterator<Item = (&str, u64, SystemTime)> {
        self.layer_sizes
            .iter()
            .map(|(layer, bytes, at)| (layer.as_str(), *bytes, *at))
    }

    /// Removed images whose layers others still held, as saved: layers,
    /// reported size, when removed.
    pub fn layer_ghosts(&self) -> &[(Vec<String>, u64, SystemTime)] {
        &self.layer_ghosts
    }

    /// Replaces what is saved of them.
    pub fn set_layer_ghosts(&mut self, ghosts: Vec<(Vec<String>, u64, SystemTime)>) {
        self.layer_ghosts = ghosts;
        self.changed = true;
    }

    /// What measured removals raised the footprint to, as saved.
    pub fn footprint(&self) -> Option<(u64, u64)> {
        self.footprint
    }

    /// Replaces what is saved of the footprint.
    pub fn set_footprint(&mut self, footprint: Option<(u64, u64)>) {
        if self.footprint != footprint {
            self.footprint = footprint;
            self.changed = true;
        }
    }

    /// Replaces what is saved of the layers' measured sizes.
    pub fn set_layer_sizes(&mut self, sizes: impl IntoIterator<Item = (String, u64, SystemTime)>) {
        self.layer_sizes = sizes.into_iter().collect();
        self.changed = true;
    }

    /// Takes back what the state file remembered of removed images, as of
    /// `now`: entries older than [`REMOVED_MEMORY_FOR`] are dropped, at most
    /// [`REMOVED_MEMORY`] of the newest are kept, and an image with a
    /// record is not a removed one.
    pub(crate) fn restore_removed(
        &mut self,
        memory: impl IntoIterator<Item = (String, SystemTime, SystemTime, Option<Break>)>,
        now: SystemTime,
    ) {
        let mut memory: Vec<_> = memory
            .into_iter()
            .filter(|(id, ..)| !self.map.contains_key(id))
            .filter(|(_, _, removed_at, _)| now.duration_since(*removed_at).unwrap_or_default() < REMOVED_MEMORY_FOR)
            .collect();
        memory.sort_by_key(|(_, _, removed_at, _)| std::cmp::Reverse(*removed_at));
        memory.truncate(REMOVED_MEMORY);
        self.removed = memory
            .into_iter()
            .map(|(id, last_used, removed_at, usual_break)| {
                let removed_at = removed_at.min(now);
                (
                    id,
                    Removed {
                        usual_break,
                        last_used: last_used.min(removed_at),
                        removed_at,
                    },
                )
            })
            .collect();
    }

    /// The record of the image with this id, when it is listed (records of
    /// vanished images are not returned).
    pub fn get(&self, id: &str) -> Option<&Record> {
        self.map.get(id)
    }

    /// Whether any container is known to have used the image, in this
    /// process or an earlier one (see the planner's rule for a runtime that
    /// does not name its sandbox image).
    pub fn ever_used(&self, id: &str) -> bool {
        self.map.get(id).is_some_and(|r| r.ever_used)
    }

    /// How many listed images have a record (vanished ones not counted).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when no listed image has a record.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Every record, those of images not listed for less than the grace
    /// included: what the state file keeps.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Record)> {
        self.map
            .iter()
            .chain(self.vanished.iter().map(|(id, (record, _))| (id, record)))
    }

    /// Records of images the runtime stopped listing, kept for the grace.
    pub fn vanished_len(&self) -> usize {
        self.vanished.len()
    }

    /// Updates the records from a full listing of images and containers.
    pub fn observe(&mut self, images: &[Image], containers: &[Container], now: SystemTime) -> RecordChanges {
        let matches = References::new(containers, &[]).matches(images);
        self.observe_matched(images, matches, now).0
    }

    /// Updates the records from a snapshot (as [`Records::observe`]) and
    /// returns, beside what changed, what the planner needs of every listed
    /// image by its place in the listing ([`ImageFacts`]): the containers and
    /// sandbox references that name it, and its record's times. A cycle
    /// matches its listing once and looks every image up once.
    pub fn observe_snapshot(&mut self, snapshot: &Snapshot, now: SystemTime) -> (RecordChanges, ImageFacts) {
        self.observe_matched(&snapshot.images, matches(snapshot), now)
    }

    /// What the planner needs of every image of `snapshot` ([`ImageFacts`]), from
    /// the records as they are, without updating them.
    pub fn listed(&self, snapshot: &Snapshot) -> ImageFacts {
        let mut listed = ImageFacts::new(matches(snapshot), snapshot.images.len());
        let mut first: HashMap<&str, usize> =
            HashMap::with_capacity_and_hasher(snapshot.images.len(), Default::default());
        for (i, image) in snapshot.images.iter().enumerate() {
            let later = listed.note_listing(&mut first, &image.id, i);
            listed.places.push(self.place(&image.id, later));
        }
        listed
    }

    /// A listed image's [`Place`], from its record.
    fn place(&self, id: &str, later: bool) -> Place {
        Place {
            history: self.map.get(id).map(History::of),
            later,
        }
    }

    // Long on purpose: one pass over the listing updates each record and
    // notes its place, so the planner looks nothing up again.
    fn observe_matched(&mut self, images: &[Image], matches: Matches, now: SystemTime) -> (RecordChanges, ImageFacts) {
        let mut observed = RecordChanges::default();
        // The first listing after a break in observation resumes it: a gap
        // that began before it was not observed whole.
        let since = *self.observed_since.get_or_insert(now);
        // Grown once to the listing's size, not doubled as records come:
        // on a first cycle of 100,000 images the last doubling held the
        // old table beside the new.
        self.map.reserve(images.len().saturating_sub(self.map.len()));
        let mut out = ImageFacts::new(matches, images.len());
        let mut listed: HashMap<&str, usize> = HashMap::with_capacity_and_hasher(images.len(), Default::default());
        for (i, image) in images.iter().enumerate() {
            let later = out.note_listing(&mut listed, &image.id, i);
            // A listing of an id is enough to mark its one record used.
            let used = !out.matches.users(i).is_empty();
            // Looked up once when the record is there (nearly always); the
            // id is copied only for a new record, not for every image every
            // cycle.
            if !self.map.contains_key(image.id.as_str()) {
                self.changed = true;
                let record = match self.vanished.remove(image.id.as_str()) {
                    Some((record, _)) => {
                        observed.returned += 1;
                        record
                    }
                    None => {
                        observed.new.push(i);
                        let mut record = Record {
                            first_seen: now,
                            last_used: now,
                            size: image.size,
                            pinned: image.pinned,
                            tags: Names::default(),
                            digests: Names::default(),
                            from_history: false,
                            ever_used: false,
                            usual_break: None,
                        };
                        // Pulled again after a removal, for a container:
                        // the time since its last use before is a break,
                        // and what its uses taught comes back (its times
                        // do not: it is a new image to the planner).
                        if let Some(before) = self.removed.remove(image.id.as_str()) {
                            record.ever_used = true;
                            record.usual_break = before.usual_break;
                            record.last_used = before.last_used;
                            record.used_at(now, Some(since));
                            record.last_used = now;
                        }
                        record
                    }
                };
                self.map.insert(image.id.clone(), record);
            }
            let record = self.map.get_mut(image.id.as_str()).expect("inserted above");
            if used {
                self.changed |= record.used_at(now, Some(since));
            }
            if record.size != image.size || record.pinned != image.pinned {
                record.size = image.size;
                record.pinned = image.pinned;
                self.changed = true;
            }
            // The listing's names replace the record's, equal or not, so
            // that the two hold one copy.
            for (kept, listed) in [
                (&mut record.tags, &image.repo_tags),
                (&mut record.digests, &image.repo_digests),
            ] {
                if !kept.shares(listed) {
                    self.changed |= kept != listed;
                    *kept = listed.clone();
                }
            }
            out.places.push(Place {
                history: Some(History::of(record)),
                later,
            });
        }
        // An id listed more than once: its first place tells what its
        // record says after every listing of it.
        let repeated: Vec<usize> = out.repeated.keys().copied().collect();
        for first in repeated {
            out.places[first] = self.place(&images[first].id, false);
        }
        if self.map.len() > listed.len() {
            let gone: Vec<String> = self
                .map
                .keys()
                .filter(|id| !listed.contains_key(id.as_str()))
                .cloned()
                .collect();
            for id in gone {
                let record = self.map.remove(&id).expect("listed above");
                observed.unlisted.push(Unlisted {
                    id: id.clone(),
                    tags: record.tags.clone(),
                    size: record.size,
                    first_seen: record.first_seen,
                });
                self.vanished.insert(id, (record, now));
                observed.vanished += 1;
            }
            self.changed = true;
        }
        let before = self.vanished.len();
        self.vanished
            .retain(|_, (_, since)| now.duration_since(*since).unwrap_or_default() < VANISHED_GRACE);
        observed.dropped = before - self.vanished.len();
        self.changed |= observed.dropped > 0;
        (observed, out)
    }

    /// Forgets an image removed at `now` (by imagegc or anyone), but for
    /// its usual break, should it be pulled again.
    pub fn remove(&mut self, id: &str, now: SystemTime) {
        let record = self.map.remove(id).or_else(|| self.vanished.remove(id).map(|(r, _)| r));
        let Some(record) = record else {
            return;
        };
        self.changed = true;
        if !record.ever_used {
            return;
        }
        if self.removed.len() >= REMOVED_MEMORY {
            self.removed
                .retain(|_, r| now.duration_since(r.removed_at).unwrap_or_default() < REMOVED_MEMORY_FOR);
        }
        if self.removed.len() >= REMOVED_MEMORY
            && let Some(oldest) = self
                .removed
                .iter()
                .min_by_key(|(_, r)| r.removed_at)
                .map(|(id, _)| id.clone())
        {
            self.removed.remove(&oldest);
        }
        self.removed.insert(
            id.to_string(),
            Removed {
                usual_break: record.usual_break,
                last_used: record.last_used,
                removed_at: now,
            },
        );
    }

    /// Whether anything but last-used times changed since the last
    /// [`Records::saved`].
    pub fn changed(&self) -> bool {
        self.changed
    }

    /// Notes that the records as they are now were saved.
    pub fn saved(&mut self) {
        self.changed = false;
    }

    /// Marks images used now, from a container listing or events between
    /// cycles; images without a record are left for the next full listing.
    pub fn mark_used<'a>(&mut self, ids: impl IntoIterator<Item = &'a str>, now: SystemTime) {
        for id in ids {
            if let Some(record) = self.map.get_mut(id) {
                self.changed |= record.used_at(now, self.observed_since);
            }
        }
    }

    /// Since when the runtime has been observed without a break (see
    /// [`Records::observation_broken`]); `None` while it is broken.
    pub fn observed_since(&self) -> Option<SystemTime> {
        self.observed_since
    }

    /// The runtime could not be listed: observation is broken until the
    /// next listing, and no gap in an image's use that spans it is learnt
    /// as a break (the image may have been used meanwhile). The process's
    /// start is such a break too.
    pub fn observation_broken(&mut self) {
        self.observed_since = None;
    }

    /// Marks images used now by a use that went on since they were last
    /// marked (no break in between, however long ago that was): what the
    /// simulator knows when a container it saw start goes, where the
    /// daemon's polls would have seen it all along.
    pub fn mark_still_used<'a>(&mut self, ids: impl IntoIterator<Item = &'a str>, now: SystemTime) {
        for id in ids {
            if let Some(record) = self.map.get_mut(id) {
                self.changed |= record.used_at(now, None);
            }
        }
    }
}

/// Which containers and sandbox references name each image of a snapshot.
fn matches(snapshot: &Snapshot) -> Matches {
    let sandbox: Vec<&str> = snapshot.sandbox_images.iter().map(String::as_str).collect();
    References::new(&snapshot.containers, &sandbox).matches(&snapshot.images)
}

/// What the records know of each image of one listing that the planner
/// needs (its facts), by its place in the listing: made by
/// [`Records::observe_snapshot`] as it updates the records (or by
/// [`Records::listed`]), read by [`crate::policy::plan_listed`] without a
/// lookup.
#[derive(Debug, Default)]
pub struct ImageFacts {
    /// Which containers, and whether a sandbox reference, name each image.
    pub(crate) matches: Matches,
    /// One per image of the listing.
    pub(crate) places: Vec<Place>,
    /// For an id listed more than once (runtimes list each id once): its
    /// first place → every place of it. Empty otherwise.
    pub(crate) repeated: HashMap<usize, Vec<usize>>,
}

impl ImageFacts {
    fn new(matches: Matches, images: usize) -> Self {
        ImageFacts {
            matches,
            places: Vec::with_capacity(images),
            repeated: HashMap::default(),
        }
    }

    /// Notes the listing of `id` at place `i`; true when an earlier place
    /// listed the same id.
    fn note_listing<'a>(&mut self, first: &mut HashMap<&'a str, usize>, id: &'a str, i: usize) -> bool {
        match first.entry(id) {
            Entry::Vacant(entry) => {
                entry.insert(i);
                false
            }
            Entry::Occupied(entry) => {
                let f = *entry.get();
                self.repeated.entry(f).or_insert_with(|| vec![f]).push(i);
                true
            }
        }
    }

    /// How many places the listing had.
    pub fn len(&self) -> usize {
        self.places.len()
    }

    /// True for an empty listing.
    pub fn is_empty(&self) -> bool {
        self.places.is_empty()
    }
}

/// One image of a listing, as the records saw it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place {
    /// Its record's times; `None` when it has no record (listed after the
    /// records were updated).
    pub history: Option<History>,
    /// A later listing of an id an earlier place already listed.
    pub later: bool,
}

/// A record's times, as the planner reads them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct History {
    pub first_seen: SystemTime,
    pub last_used: SystemTime,
    pub from_history: bool,
    /// See [`Records::ever_used`].
    pub ever_used: bool,
    /// See [`Record::usual_break`].
    pub usual_break: Option<Break>,
}

impl History {
    /// A record's times, as the planner reads them.
    pub(crate) fn of(record: &Record) -> Self {
        History {
            first_seen: record.first_seen,
            last_used: record.last_used,
            from_history: record.from_history,
            ever_used: record.ever_used,
            usual_break: record.usual_break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{container_naming as container, library_image as image};
    use std::time::Duration;

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    // docs/kubelet.md scenario 1: initial detection.
    #[test]
    fn a_record_holds_the_listings_names_not_a_copy() {
        let listed = [image("0", 1)];
        let mut records = Records::new();
        records.observe(&listed, &[], t(0));
        records.saved();
        assert!(records.get("0").unwrap().tags.shares(&listed[0].repo_tags));
        // An equal listing of new copies: the record takes them, and that
        // is no change to save.
        let again = [image("0", 1)];
        assert!(!again[0].repo_tags.shares(&listed[0].repo_tags));
        records.observe(&again, &[], t(10));
        assert!(records.get("0").unwrap().tags.shares(&again[0].repo_tags));
        assert!(records.get("0").unwrap().digests.shares(&again[0].repo_digests));
        assert!(!records.changed());
        let mut moved = image("0", 1);
        moved.repo_tags = vec!["other:1".to_string()].into();
        records.observe(&[moved], &[], t(20));
        assert!(records.changed());
        assert_eq!(records.get("0").unwrap().tags, ["other:1"]);
    }

    #[test]
    fn initial_detection() {
        let images = [image("0", 1024), image("1", 2048), image("2", 2048)];
        let containers = [container("c1", "1"), container("c2", "2")];
        let mut records = Records::new();
        records.observe(&images, &containers, t(0));
        assert_eq!(records.len(), 3);
        for id in ["0", "1", "2"] {
            let r = records.get(id).unwrap();
            assert_eq!(r.first_seen, t(0));
            assert_eq!(r.last_used, t(0));
        }
        let in_use = crate::model::matching::InUse::new(&images, &containers);
        assert!(!in_use.is_used("0"));
        assert!(in_use.is_used("1") && in_use.is_used("2"));
    }

    // Scenario 2: a new image appears in a later pass.
    #[test]
    fn new_image_gets_its_own_first_seen() {
        let mut records = Records::new();
        records.observe(&[image("0", 1)], &[], t(0));
        records.observe(&[image("0", 1), image("1", 1)], &[], t(60));
        assert_eq!(records.get("0").unwrap().first_seen, t(0));
        assert_eq!(records.get("1").unwrap().first_seen, t(60));
    }

    // Scenario 3: a container goes away; last used stays.
    #[test]
    fn last_used_stays_when_the_container_goes() {
        let mut records = Records::new();
        let images = [image("0", 1)];
        records.observe(&images, &[container("c", "0")], t(0));
        records.observe(&images, &[container("c", "0")], t(10));
        records.observe(&images, &[], t(20));
        assert_eq!(records.get("0").unwrap().last_used, t(10));
        assert_eq!(records.get("0").unwrap().first_seen, t(0));
    }

    #[test]
    fn a_use_after_a_break_teaches_the_usual_break_and_continuous_use_does_not() {
        let minute = 60;
        let mut records = Records::new();
        let images = [image("0", 1)];
        // Pulled at 0, first used at 30 minutes: a pull is not a use.
        records.observe(&images, &[], t(0));
        records.mark_used(["0"], t(30 * minute));
        assert_eq!(records.get("0").unwrap().usual_break, None);
        // Running for two hours, seen every 30 s: no break.
        for s in (30 * minute..150 * minute).step_by(30) {
            records.mark_used(["0"], t(s));
        }
        assert_eq!(records.get("0").unwrap().usual_break, None);
        // Unused for an hour, then used again: a break of an hour.
        records.observe(&images, &[container("c", "0")], t(210 * minute - 30));
        assert_eq!(
            records.get("0").unwrap().usual_break.map(Break::duration),
            Some(Duration::from_secs(3600))
        );
        assert!(records.changed(), "a new break is saved");
        // A break of three hours weighs half.
        records.mark_used(["0"], t(390 * minute - 30));
        assert_eq!(
            records.get("0").unwrap().usual_break.map(Break::duration),
            Some(Duration::from_secs(2 * 3600))
        );
        // Less than MIN_BREAK unused (a cycle missed): no break.
        let short = 390 * minute - 30 + MIN_BREAK.as_secs() - 1;
        records.mark_used(["0"], t(short));
        assert_eq!(
            records.get("0").unwrap().usual_break.map(Break::duration),
            Some(Duration::from_secs(2 * 3600))
        );
        // A use the simulator knows went on all along is no break.
        records.mark_still_used(["0"], t(short + 10 * 3600));
        assert_eq!(
            records.get("0").unwrap().usual_break.map(Break::duration),
            Some(Duration::from_secs(2 * 3600))
        );
    }

    /// The spread says how far breaks stray from the usual one: nothing
    /// for one break, little for a periodic job, about the mean for an
    /// image used at random.
    #[test]
    fn the_breaks_spread_is_learnt_beside_the_usual_break() {
        let hour = 3600;
        let learn = |breaks: &[u64]| {
            let mut records = Records::new();
            let images = [image("0", 1)];
            records.observe(&images, &[container("c", "0")], t(0));
            let mut at = 0;
            for b in breaks {
                at += b;
                records.mark_used(["0"], t(at));
            }
            records.get("0").unwrap().usual_break.unwrap()
        };
        let one = learn(&[2 * hour]);
        assert_eq!((one.duration(), one.spread()), (Duration::from_secs(2 * hour), None));
        // Every 2 h: no spread.
        let periodic = learn(&[2 * hour, 2 * hour, 2 * hour]);
        assert_eq!(periodic.spread(), Some(Duration::ZERO));
        // 2 h, then 6 h: the usual break moves to 4 h, the spread to the
        // 4 h this break strayed; then 1 h: 2.5 h, and the spread halfway
        // to the 3 h it strayed, 3.5 h.
        let random = learn(&[2 * hour, 6 * hour]);
        assert_eq!(random.duration(), Duration::from_secs(4 * hour));
        assert_eq!(random.spread(), Some(Duration::from_secs(4 * hour)));
        let random = learn(&[2 * hour, 6 * hour, hour]);
        assert_eq!(random.duration(), Duration::from_secs(5 * hour / 2));
        assert_eq!(random.spread(), Some(Duration::from_secs(7 * hour / 2)));
    }

    #[test]
    fn a_gap_imagegc_did_not_observe_whole_teaches_no_break() {
        let minute = 60;
        let images = [image("0", 1)];
        let running = [container("c", "0")];
        // A container running throughout, seen at 0 and 10 minutes; then
        // imagegc is down for 20 minutes and its next process (records as
        // the state file held them) sees the container still there.
        let mut records = Records::new();
        records.observe(&images, &running, t(0));
        records.observe(&images, &running, t(10 * minute));
        let mut restarted = Records::from_map(records.map.clone());
        restarted.observe(&images, &running, t(30 * minute));
        assert_eq!(restarted.get("0").unwrap().usual_break, None, "its own downtime");
        assert_eq!(restarted.get("0").unwrap().last_used, t(30 * minute));
        // The runtime down for 20 minutes: listings fail, then it is back.
        records.observation_broken();
        records.observe(&images, &running, t(30 * minute));
        assert_eq!(records.get("0").unwrap().usual_break, None, "a runtime outage");
        // Nor is a use seen by an event right after the outage.
        records.observation_broken();
        records.mark_used(["0"], t(50 * minute));
        records.observe(&images, &[], t(51 * minute));
        assert_eq!(records.get("0").unwrap().usual_break, None);
        // A gap observed whole after that is a break, as ever.
        records.observe(&images, &running, t(52 * minute));
        records.observe(&images, &[], t(60 * minute));
        records.observe(&images, &running, t(82 * minute));
        assert_eq!(
            records.get("0").unwrap().usual_break.map(Break::duration),
            Some(Duration::from_secs(30 * minute))
        );
    }

    #[test]
    fn an_image_removed_and_pulled_again_keeps_what_its_uses_taught() {
        let hour = 3600;
        let mut records = Records::new();
        let images = [image("0", 1)];
        records.observe(&images, &[container("c", "0")], t(0));
        records.observe(&images, &[container("c", "0")], t(2 * hour));
        assert_eq!(
            records.get("0").unwrap().usual_break.map(Break::duration),
            Some(Duration::from_secs(2 * hour))
        );
        records.remove("0", t(3 * hour));
        // Pulled again for a job four hours after its last use: a break of
        // four hours, averaged in; first seen is the pull, as for any new
        // image.
        records.observe(&images, &[], t(6 * hour));
        let again = records.get("0").unwrap();
        assert_eq!(
            again.usual_break.map(Break::duration),
            Some(Duration::from_secs(3 * hour))
        );
        assert_eq!((again.first_seen, again.last_used), (t(6 * hour), t(6 * hour)));
        assert!(again.ever_used);
        // An image never used is not remembered.
        records.observe(&[image("0", 1), image("1", 1)], &[], t(7 * hour));
        records.remove("1", t(7 * hour));
        records.observe(&[image("0", 1), image("1", 1)], &[], t(9 * hour));
        assert!(!records.get("1").unwrap().ever_used);
    }

    #[test]
    fn the_memory_of_removed_images_is_bounded() {
        let mut records = Records::new();
        let images: Vec<Image> = (0..=REMOVED_MEMORY).map(|i| image(&i.to_string(), 1)).collect();
        records.observe(&images, &[], t(0));
        records.mark_used(images.iter().map(|i| i.id.as_str()), t(1));
        for (n, image) in images.iter().enumerate() {
            records.remove(&image.id, t(10 + n as u64));
        }
        assert_eq!(records.removed.len(), REMOVED_MEMORY);
        assert!(!records.removed.contains_key("0"), "the oldest went");
        // Past the memory's span, all go at the next removal beyond it.
        records.observe(&[image("x", 1)], &[], t(20));
        records.mark_used(["x"], t(21));
        records.remove("x", t(REMOVED_MEMORY_FOR.as_secs() + 100_000));
        assert_eq!(records.removed.len(), 1);
    }

    // Scenario 4: an image disappears; its record is dropped (once it has
    // stayed unlisted for the grace: until then it is only set aside).
    #[test]
    fn records_of_vanished_images_are_dropped() {
        let mut records = Records::new();
        records.observe(&[image("0", 1), image("1", 1)], &[], t(0));
        let observed = records.observe(&[image("1", 1)], &[], t(10));
        assert_eq!(observed.vanished, 1);
        assert!(records.get("0").is_none());
        assert!(records.get("1").is_some());
        let grace = VANISHED_GRACE.as_secs();
        let observed = records.observe(&[image("1", 1)], &[], t(10 + grace));
        assert_eq!(observed.dropped, 1);
        assert_eq!(records.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(), ["1"]);
        // Listed again after the grace: a new image.
        records.observe(&[image("0", 1), image("1", 1)], &[], t(20 + grace));
        assert_eq!(records.get("0").unwrap().first_seen, t(20 + grace));
    }

    #[test]
    fn one_empty_listing_does_not_reset_the_history_of_every_image() {
        let images = [image("0", 1), image("1", 1), image("2", 1)];
        let mut records = Records::new();
        records.observe(&images, &[container("c", "1")], t(0));
        records.observe(&images, &[], t(100));
        let before: Vec<Record> = ["0", "1", "2"].map(|id| records.get(id).unwrap().clone()).into();

        // The runtime answers one listing with no image at all.
        let observed = records.observe(&[], &[], t(200));
        assert_eq!((observed.vanished, observed.dropped), (3, 0));
        assert!(records.get("0").is_none(), "the planner sees only listed images");
        // Saved meanwhile, the set-aside records are in the state.
        assert_eq!(records.iter().count(), 3);

        let observed = records.observe(&images, &[], t(300));
        assert_eq!((observed.returned, observed.new.len()), (3, 0));
        let after: Vec<Record> = ["0", "1", "2"].map(|id| records.get(id).unwrap().clone()).into();
        assert_eq!(after, before, "first seen and last used are what they were");
    }

    #[test]
    fn an_image_imagegc_removed_is_forgotten_at_once() {
        let mut records = Records::new();
        records.observe(&[image("0", 1)], &[], t(0));
        records.remove("0", t(5));
        records.observe(&[], &[], t(10));
        records.observe(&[image("0", 1)], &[], t(20));
        assert_eq!(records.get("0").unwrap().first_seen, t(20));
    }

    #[test]
    fn mark_used_moves_last_used_forward_only() {
        let mut records = Records::new();
        records.observe(&[image("0", 1)], &[], t(100));
        records.mark_used(["0", "unknown"], t(200));
        assert_eq!(records.get("0").unwrap().last_used, t(200));
        records.mark_used(["0"], t(150));
        assert_eq!(records.get("0").unwrap().last_used, t(200));
        assert_eq!(records.len(), 1);
    }
}
