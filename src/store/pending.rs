//! Removals whose outcome is not known yet, persisted in
//! `<state dir>/removal-in-flight.json` so that a restart does not forget
//! them: one entry per image, with its phase and the time its removal was
//! asked (the journal entry's `time`).
//!
//! - `requested`: written (and fsynced) right before `RemoveImage` is
//!   called, forgotten once the removal is journaled or failed. Left there
//!   when the process ended during the call (a crash, or shutdown gave up
//!   waiting).
//! - `unknown`: the call timed out or broke and the image was still listed
//!   after watching it: the runtime may yet remove it.
//!
//! The engine settles the entries at each listing ([`Pending::settle`]),
//! whether this process or an earlier one wrote them, and a removal is
//! taken to have happened only when two sources agree: the listing omits
//! the image and `ImageStatus` says the runtime does not have it (a
//! listing alone may be partial: a runtime restarting, or listing part of
//! its store). Gone means removed: journaled and counted once, through the
//! same path as any removal. An image still there (listed, or found by
//! `ImageStatus` though the listing omitted it) keeps its entry: a runtime
//! slow enough to miss the call's deadline, or still working when the
//! process that asked was killed, may finish the removal later. So does an
//! image the runtime could not answer about. An entry is forgotten
//! unjournaled once its image is still there, or still not known gone,
//! [`PENDING_LIMIT`] after the removal was asked: when in doubt, no removal
//! is claimed. An empty listing (a runtime restarting, or wiped) settles
//! nothing.
//!
//! A removal of an image asked again while an earlier removal of it is of
//! unknown outcome carries that earlier one (`earlier`): when the new call
//! does not remove the image (refused, already gone, still listed), the
//! earlier one is pending again, so that if it was the earlier removal
//! that took the image, it is journaled once; when the new call removes
//! it, both are done with one journal line (the image went once).
//!
//! Files of earlier versions read as they were written: the single-entry
//! format reads as one `requested` entry, and entries without `earlier` as
//! having none.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::safe_file::{self, Links};
use crate::store::journal::JournalEntry;

/// The file's name inside the state directory.
pub const FILE_NAME: &str = "removal-in-flight.json";
/// A file larger than this is not one imagegc wrote.
const MAX_BYTES: u64 = 1024 * 1024;

/// How long after a removal of unknown outcome was asked its entry waits
/// for the image to go: a runtime that has not finished a removal in an
/// hour is not finishing it, and an image someone else removes later must
/// not be claimed as this removal. Far above the slowest removals seen
/// (minutes, on a saturated disk), and counted from the call, not from the
/// moment its outcome became unknown (at most `runtime.timeout` and 30
/// seconds of watching later).
pub const PENDING_LIMIT: Duration = Duration::from_secs(60 * 60);

/// Where a removal whose outcome is unknown stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Noted (durably) before the re-check that precedes `RemoveImage`;
    /// the call is not sent yet. Left by a process that ended then, it
    /// names a call never sent, and the next start drops it: an image
    /// that went meanwhile went by someone else's hand.
    Checking,
    /// `RemoveImage` is (or was, when the process ended) being called.
    Requested,
    /// The call failed in a way that does not tell whether the runtime
    /// removed the image, and the image was still listed afterwards.
    Unknown,
}

/// One removal whose outcome is not known yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingRemoval {
    /// Where it stands.
    pub phase: Phase,
    /// The journal entry it becomes once it is known to have happened; its
    /// `time` is when the removal was asked.
    pub entry: JournalEntry,
    /// When an earlier removal of the same image, whose outcome is still
    /// unknown, was asked (RFC 3339): set while a new removal of the image
    /// is requested, pending again if that one does not happen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub earlier: Option<String>,
    /// Whether this process wrote it (not persisted: false when loaded).
    #[serde(skip)]
    pub this_process: bool,
}

impl PendingRemoval {
    /// Becomes the earlier removal of the image it carried, of unknown
    /// outcome, when it carried one (a removal asked again that did not
    /// happen, or was never sent); false when it carried none.
    fn back_to_earlier(&mut self) -> bool {
        match self.earlier.take() {
            Some(earlier) if matches!(self.phase, Phase::Requested | Phase::Checking) => {
                self.phase = Phase::Unknown;
                self.entry.time = earlier;
                true
            }
            _ => false,
        }
    }

    /// Whether the removal was asked [`PENDING_LIMIT`] ago or more. A time
    /// that does not parse counts as long ago, and so does one as far in
    /// the future (a clock set back that far, or a time no clock of this
    /// node wrote): either way, past doubt, nothing is claimed.
    fn expired(&self, now: SystemTime) -> bool {
        self.entry.timestamp().is_none_or(|asked| {
            let apart = now.duration_since(asked).unwrap_or_else(|ahead| ahead.duration());
            apart >= PENDING_LIMIT
        })
    }
}

/// Whether a write of the file must be durable before it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Durability {
    Synced,
    Unsynced,
}

/// What is known of a pending removal's image at a listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Listed, or found by `ImageStatus` although the listing omitted it
    /// (a partial listing): the image is still there.
    There,
    /// The listing omits it and `ImageStatus` says the runtime does not
    /// have it.
    Gone,
    /// The listing omits it, and `ImageStatus` was not asked (not yet) or
    /// did not answer.
    Unsure,
}

/// How a pending removal was settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The image is gone: the removal happened.
    Gone,
    /// The image was still there [`PENDING_LIMIT`] after the removal was
    /// asked: the removal did not happen.
    StillThere,
    /// Not known gone [`PENDING_LIMIT`] after the removal was asked (the
    /// runtime did not answer about it): forgotten, not claimed.
    Unconfirmed,
    /// Noted before a re-check whose `RemoveImage` was never sent (the
    /// process ended in between): forgotten, not claimed.
    NotSent,
}

#[derive(Deserialize)]
struct File {
    removals: Vec<PendingRemoval>,
}

/// [`File`] as written, borrowing the entries.
#[derive(Serialize)]
struct FileRef<'a> {
    removals: &'a [PendingRemoval],
}

/// The pending removals of one state directory, in memory and on disk.
#[derive(Debug)]
pub struct Pending {
    path: PathBuf,
    entries: Vec<PendingRemoval>,
    /// Whether entries were forgotten since the file was last written
    /// (journaled removals, see [`Pending::journaled`]).
    behind: bool,
}

/// A write of the file, to make off the runtime's thread (see
/// [`Pending::request_ahead`]).
#[must_use = "the note is not written until the write runs"]
pub struct Write {
    path: PathBuf,
    entries: Vec<PendingRemoval>,
}

impl Write {
    /// Writes the file, durably.
    pub fn run(self) {
        persist(&self.path, &self.entries, Durability::Synced);
    }
}

impl Pending {
    /// Loads the pending removals of `state_dir` (none when the file is
    /// missing; an unreadable file is logged and ignored).
    pub fn load(state_dir: &Path) -> Self {
        let path = state_dir.join(FILE_NAME);
        let entries = match safe_file::read_bounded(&path, Links::Refuse, MAX_BYTES) {
            Ok(bytes) => match parse(&bytes) {
                Ok(entries) => entries,
                Err(err) => {
                    tracing::warn!(path = %path.display(), error = %err, "ignoring an unreadable file of removals in flight");
                    Vec::new()
                }
            },
            Err(err) if err.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(err) => {
                tracing::warn!(path = %path.display(), error = %err, "ignoring an unreadable file of removals in flight");
                Vec::new()
            }
        };
        Pending {
            path,
            entries,
            behind: false,
        }
    }

    /// The removals pending now.
    pub fn entries(&self) -> &[PendingRemoval] {
        &self.entries
    }

    /// Notes a removal about to be re-checked and then asked of the
    /// runtime ([`Phase::Checking`]), durably (best effort: a failure is
    /// logged and the removal goes on); [`Pending::sending`] marks it sent.
    /// An earlier removal of the image whose outcome is unknown is carried
    /// along (see [`Pending::forget`]).
    pub fn request(&mut self, entry: JournalEntry) {
        self.note(entry);
        self.persist(Durability::Synced);
    }

    /// [`Pending::request`] in memory.
    fn note(&mut self, entry: JournalEntry) {
        let earlier = self
            .entries
            .iter()
            .find(|p| p.entry.image == entry.image)
            .and_then(|p| {
                if matches!(p.phase, Phase::Requested | Phase::Checking) && p.this_process {
                    p.earlier.clone()
                } else {
                    Some(p.entry.time.clone())
                }
            });
        self.entries.retain(|p| p.entry.image != entry.image);
        self.entries.push(PendingRemoval {
            phase: Phase::Checking,
            entry,
            earlier,
            this_process: true,
        });
    }

    /// [`Pending::request`], with the write handed back to be made beside
    /// something else (the `RemoveImage` call before this removal's).
    /// Nothing else may write the file until it is made: the writes are
    /// renames, and the last one wins.
    pub fn request_ahead(&mut self, entry: JournalEntry) -> Write {
        self.note(entry);
        self.behind = false;
        Write {
            path: self.path.clone(),
            entries: self.entries.clone(),
        }
    }

    /// The removal of `image` noted by [`Pending::request`] passed its
    /// re-check, and `RemoveImage` is sent next. Not synced: a rename, so
    /// that a process killed at any point leaves the phase it was in (a
    /// power loss may leave the note as it was, [`Phase::Checking`]: a
    /// removal the runtime made then is not journaled, rather than one it
    /// did not claimed).
    pub fn sending(&mut self, image: &str) {
        let mut changed = false;
        for pending in self
            .entries
            .iter_mut()
            .filter(|p| p.entry.image == image && p.phase == Phase::Checking)
        {
            pending.phase = Phase::Requested;
            changed = true;
        }
        if changed {
            self.persist(Durability::Unsynced);
        }
    }

    /// The removal of `image` failed without telling whether it happened:
    /// kept as [`Phase::Unknown`] until a listing settles it. An earlier
    /// removal it carried is pending with it (its limit counts from this
    /// later call).
    pub fn mark_unknown(&mut self, image: &str) {
        for pending in self.entries.iter_mut().filter(|p| p.entry.image == image) {
            pending.phase = Phase::Unknown;
            pending.earlier = None;
        }
        self.persist(Durability::Synced);
    }

    /// The removal of `image` just asked for did not remove it (refused,
    /// gone already, or still listed): forgotten, unless it carried an
    /// earlier removal of unknown outcome, which is pending again as it
    /// was (the runtime may still finish it, or just did).
    pub fn forget(&mut self, image: &str) {
        let before = self.entries.len();
        let mut reverted = false;
        self.entries.retain_mut(|p| {
            if p.entry.image != image {
                return true;
            }
            let back = p.back_to_earlier();
            reverted |= back;
            back
        });
        if reverted {
            self.persist(Durability::Synced);
        } else if self.entries.len() != before {
            self.persist(Durability::Unsynced);
        }
    }

    /// When the removal of `image` pending now was asked (its note's own
    /// time), for its journal line.
    pub fn asked(&self, image: &str) -> Option<String> {
        self.entries
            .iter()
            .find(|p| p.entry.image == image)
            .map(|p| p.entry.time.clone())
    }

    /// The removal of `image` was journaled: forgotten, with any earlier
    /// one it carried (the image went once). In memory only: the file
    /// follows at its next write or [`Pending::flush`]. A process that ends
    /// before leaves the entry, which the next start settles as any other:
    /// it finds the journal line and journals it no second time (see
    /// `Remover::settle_pending`), as after a power loss that undid an
    /// unsynced write.
    pub fn journaled(&mut self, image: &str) {
        let before = self.entries.len();
        self.entries.retain(|p| p.entry.image != image);
        self.behind |= self.entries.len() != before;
    }

    /// Writes what [`Pending::journaled`] left in memory only.
    pub fn flush(&mut self) {
        if self.behind {
            self.persist(Durability::Unsynced);
        }
    }

    /// The images of at most `limit` pending removals that a listing omits
    /// (`listed` says whether an id is listed), to ask the runtime about:
    /// they move to the end of the list, so that when a listing omits more
    /// than `limit`, the next listings ask about the others first.
    pub fn next_to_ask(&mut self, listed: impl Fn(&str) -> bool, limit: usize) -> Vec<String> {
        let (mut asked, mut others) = (Vec::new(), Vec::new());
        for pending in std::mem::take(&mut self.entries) {
            if asked.len() < limit && !listed(&pending.entry.image) {
                asked.push(pending);
            } else {
                others.push(pending);
            }
        }
        let ids = asked.iter().map(|p| p.entry.image.clone()).collect();
        others.append(&mut asked);
        self.entries = others;
        ids
    }

    /// Settles the pending removals against what a listing (and
    /// `ImageStatus`) says of their images (`seen`): those settled come
    /// back with how, and are forgotten; the others stay pending. Gone
    /// settles at once; still there, or unsure, only once
    /// [`PENDING_LIMIT`] has passed since the removal was asked. A listing
    /// with no image at all (`listing_empty`) settles nothing: a runtime
    /// that is restarting lists nothing for a moment, and that is no sign
    /// an image went.
    pub fn settle(
        &mut self,
        listing_empty: bool,
        now: SystemTime,
        seen: impl Fn(&str) -> Seen,
    ) -> Vec<(PendingRemoval, Settled)> {
        if self.entries.is_empty() || listing_empty {
            return Vec::new();
        }
        let mut settled = Vec::new();
        let mut kept = Vec::new();
        let mut forgotten = false;
        for pending in std::mem::take(&mut self.entries) {
            if pending.phase == Phase::Checking {
                forgotten = true;
                // Its call was never sent. An earlier removal it carried is
                // pending again as it was.
                let mut earlier = pending.clone();
                if earlier.back_to_earlier() {
                    kept.push(earlier);
                }
                settled.push((pending, Settled::NotSent));
                continue;
            }
            let how = match seen(&pending.entry.image) {
                Seen::Gone => Some(Settled::Gone),
                Seen::There if pending.expired(now) => Some(Settled::StillThere),
                Seen::Unsure if pending.expired(now) => Some(Settled::Unconfirmed),
                Seen::There | Seen::Unsure => None,
            };
            match how {
                // Kept until journaled ([`Pending::journaled`]): a process
                // ended in between finds it again, and its journal line
                // says whether it was.
                Some(Settled::Gone) => {
                    kept.push(pending.clone());
                    settled.push((pending, Settled::Gone));
                }
                Some(how) => {
                    forgotten = true;
                    settled.push((pending, how));
                }
                None => kept.push(pending),
            }
        }
        self.entries = kept;
        if forgotten {
            self.persist(Durability::Unsynced);
        }
        settled
    }

    /// Writes the entries (or removes the file when there are none):
    /// written to a temporary file and renamed, so that a crash leaves the
    /// old list or the new one whole. A removal about to be asked for, or of
    /// unknown outcome, is made durable (the file and the directory
    /// fsynced) before the call: it must survive a power loss. Forgetting
    /// one that was journaled or settled is not: lost, it comes back at the
    /// next start, which finds its journal line and journals it no second
    /// time (see `Remover::settle_pending`).
    fn persist(&mut self, durability: Durability) {
        self.behind = false;
        persist(&self.path, &self.entries, durability);
    }
}

/// Writes `entries` to `path` (see [`Pending::persist`]).
fn persist(path: &Path, entries: &[PendingRemoval], durability: Durability) {
    let synced = durability == Durability::Synced;
    let result = if entries.is_empty() {
        match fs::remove_file(path) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
            _ if synced => safe_file::sync_parent(path),
            _ => Ok(()),
        }
    } else {
        serde_json::to_vec(&FileRef { removals: entries })
            .map_err(io::Error::other)
            .and_then(|bytes| safe_file::replace(path, &bytes, synced))
    };
    if let Err(err) = result {
        tracing::warn!(path = %path.display(), error = %err, "could not note the removals in flight");
    }
}

/// The entries of a file: this version's list, or the single entry an
/// earlier version wrote (a removal in flight: requested).
fn parse(bytes: &[u8]) -> Result<Vec<PendingRemoval>, serde_json::Error> {
    match serde_json::from_slice::<File>(bytes) {
        Ok(file) => Ok(file.removals),
        Err(err) => match serde_json::from_slice::<JournalEntry>(bytes) {
            Ok(entry) => Ok(vec![PendingRemoval {
                phase: Phase::Requested,
                entry,
                earlier: None,
                this_process: false,
            }]),
            Err(_) => Err(err),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A removal noted, re-checked and sent (`RemoveImage` called).
    fn sent(pending: &mut Pending, entry: JournalEntry) {
        let image = entry.image.clone();
        pending.request(entry);
        pending.sending(&image);
    }

    #[test]
    fn a_note_whose_call_was_never_sent_is_not_claimed_by_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let mut pending = Pending::load(dir.path());
        pending.request(entry("a"));
        // The process ends during the re-check; someone else removes `a`.
        drop(pending);
        let mut pending = Pending::load(dir.path());
        assert_eq!(pending.entries()[0].phase, Phase::Checking);
        let settled = pending.settle(false, asked(), |_| Seen::Gone);
        assert_eq!(settled.len(), 1);
        assert_eq!(settled[0].1, Settled::NotSent);
        assert!(pending.entries().is_empty());
    }

    #[test]
    fn a_journaled_removal_leaves_the_file_at_the_next_write_or_flush() {
        let dir = tempfile::tempdir().unwrap();
        let mut pending = Pending::load(dir.path());
        sent(&mut pending, entry("a"));
        pending.journaled("a");
        assert!(pending.entries().is_empty());
        // What a process killed now leaves: the note, which the next start
        // settles by the journal line it finds.
        assert_eq!(Pending::load(dir.path()).entries().len(), 1);
        // The next note's write takes it along...
        let write = pending.request_ahead(entry("b"));
        assert_eq!(Pending::load(dir.path()).entries().len(), 1, "not written until run");
        write.run();
        let on_disk = Pending::load(dir.path());
        let images: Vec<&str> = on_disk.entries().iter().map(|p| p.entry.image.as_str()).collect();
        assert_eq!(images, ["b"]);
        assert_eq!(on_disk.entries()[0].phase, Phase::Checking);
        // ...and once that one is journaled too, a flush removes the file.
        pending.journaled("b");
        pending.flush();
        assert!(!dir.path().join(FILE_NAME).exists());
    }

    fn entry(image: &str) -> JournalEntry {
        JournalEntry {
            time: "2026-01-01T00:00:00Z".to_string(),
            image: image.to_string(),
            tags: vec![format!("{image}:1")],
            digests: Vec::new(),
            reason: "space".to_string(),
            size_bytes: 10,
            freed_bytes: None,
            last_used: "2026-01-01T00:00:00Z".to_string(),
            first_seen: "2026-01-01T00:00:00Z".to_string(),
            dry_run: false,
            note: None,
            asked: None,
        }
    }

    /// When [`entry`]'s removal was asked.
    fn asked() -> SystemTime {
        humantime::parse_rfc3339("2026-01-01T00:00:00Z").unwrap()
    }

    fn entry_at(image: &str, time: SystemTime) -> JournalEntry {
        JournalEntry {
            time: crate::time::rfc3339(time),
            ..entry(image)
        }
    }

    #[test]
    fn an_unknown_removal_survives_a_restart_and_settles_once_gone() {
        let dir = tempfile::tempdir().unwrap();
        let mut pending = Pending::load(dir.path());
        sent(&mut pending, entry("a"));
        pending.mark_unknown("a");
        // The process ends here, however it ends.
        drop(pending);
        let mut pending = Pending::load(dir.path());
        assert_eq!(pending.entries().len(), 1);
        assert_eq!(pending.entries()[0].phase, Phase::Unknown);
        assert!(!pending.entries()[0].this_process);
        let now = asked() + Duration::from_secs(60);
        // A runtime restarting lists nothing: no sign the image went.
        assert!(pending.settle(true, now, |_| Seen::Gone).is_empty());
        let settled = pending.settle(false, now, |_| Seen::Gone);
        assert_eq!(settled.len(), 1);
        assert_eq!(settled[0].1, Settled::Gone);
        // On disk until journaled: a process ended before the journal line
        // finds it again.
        assert!(dir.path().join(FILE_NAME).exists());
        pending.journaled("a");
        assert!(pending.settle(false, now, |_| Seen::Gone).is_empty(), "settled once");
        pending.flush();
        assert!(!dir.path().join(FILE_NAME).exists(), "nothing left on disk");
    }

    #[test]
    fn an_image_still_there_keeps_its_removal_pending_until_the_limit_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let mut pending = Pending::load(dir.path());
        sent(&mut pending, entry("a"));
        pending.mark_unknown("a");
        // Still listed a minute, and nearly an hour, later: the runtime
        // may yet finish it.
        for ago in [Duration::from_secs(60), PENDING_LIMIT - Duration::from_secs(1)] {
            assert!(pending.settle(false, asked() + ago, |_| Seen::There).is_empty());
        }
        // A restart keeps it, and when it was asked.
        drop(pending);
        let mut pending = Pending::load(dir.path());
        assert_eq!(pending.entries().len(), 1);
        assert!(
            pending
                .settle(false, asked() + PENDING_LIMIT / 2, |_| Seen::There)
                .is_empty()
        );
        // Still there an hour after it was asked: it did not happen.
        let settled = pending.settle(false, asked() + PENDING_LIMIT, |_| Seen::There);
        assert_eq!(settled.len(), 1);
        assert_eq!(settled[0].1, Settled::StillThere);
        assert!(!dir.path().join(FILE_NAME).exists());
        // Gone after that: not this removal's doing, not claimed.
        assert!(
            pending
                .settle(false, asked() + PENDING_LIMIT * 2, |_| Seen::Gone)
                .is_empty()
        );
    }

    #[test]
    fn an_image_the_runtime_cannot_answer_about_is_never_claimed() {
        let dir = tempfile::tempdir().unwrap();
        let mut pending = Pending::load(dir.path());
        sent(&mut pending, entry("a"));
        pending.mark_unknown("a");
        // Omitted by the listing, and not asked about (or no answer).
        assert!(pending.settle(false, asked(), |_| Seen::Unsure).is_empty());
        assert_eq!(pending.entries().len(), 1);
        let settled = pending.settle(false, asked() + PENDING_LIMIT, |_| Seen::Unsure);
        assert_eq!(settled[0].1, Settled::Unconfirmed);
        assert!(pending.entries().is_empty());
        // A clock set back a little counts no time; a time that does not
        // parse, or an hour ahead, is long ago.
        sent(&mut pending, entry("b"));
        let earlier = asked() - Duration::from_secs(600);
        assert!(pending.settle(false, earlier, |_| Seen::There).is_empty());
        sent(
            &mut pending,
            JournalEntry {
                time: "yesterday".to_string(),
                ..entry("c")
            },
        );
        sent(&mut pending, entry_at("d", earlier + PENDING_LIMIT));
        let settled = pending.settle(false, earlier, |_| Seen::There);
        let settled: Vec<&str> = settled.iter().map(|(p, _)| p.entry.image.as_str()).collect();
        assert_eq!(settled, ["c", "d"]);
        assert_eq!(pending.entries().len(), 1);
    }

    #[test]
    fn a_listing_that_omits_many_asks_about_a_few_in_turn() {
        let dir = tempfile::tempdir().unwrap();
        let mut pending = Pending::load(dir.path());
        let ids = ["a", "b", "c", "d", "e", "f"];
        for id in ids {
            sent(&mut pending, entry(id));
            pending.mark_unknown(id);
        }
        let listed = |id: &str| id == "b";
        assert_eq!(pending.next_to_ask(listed, 3), ["a", "c", "d"]);
        // Still there, by ImageStatus: the others come first next time.
        assert!(pending.settle(false, asked(), |_| Seen::There).is_empty());
        assert_eq!(pending.next_to_ask(listed, 3), ["e", "f", "a"]);
        assert_eq!(pending.next_to_ask(listed, 3), ["c", "d", "e"]);
        assert_eq!(pending.entries().len(), ids.len());
    }

    #[test]
    fn a_removal_asked_again_over_an_unknown_one_leaves_it_pending_unless_it_removed_the_image() {
        let dir = tempfile::tempdir().unwrap();
        let later = asked() + Duration::from_secs(600);
        let mut pending = Pending::load(dir.path());
        sent(&mut pending, entry("a"));
        pending.mark_unknown("a");

        // Asked again, and the runtime did not remove it this time (it
        // refused, said it was gone already, or still lists it): the
        // earlier removal is pending again, as it was.
        sent(&mut pending, entry_at("a", later));
        assert_eq!(pending.entries().len(), 1);
        assert_eq!(pending.entries()[0].earlier.as_deref(), Some("2026-01-01T00:00:00Z"));
        pending.forget("a");
        drop(pending);
        let mut pending = Pending::load(dir.path());
        assert_eq!(pending.entries().len(), 1);
        assert_eq!(pending.entries()[0].phase, Phase::Unknown);
        assert_eq!(pending.entries()[0].entry.time, "2026-01-01T00:00:00Z");

        // Asked again and removed: journaled once, nothing left pending.
        sent(&mut pending, entry_at("a", later));
        pending.journaled("a");
        assert!(pending.entries().is_empty());
        pending.flush();
        assert!(!dir.path().join(FILE_NAME).exists());

        // Asked again over an unknown one, and unknown again: one entry,
        // its limit counting from the later call.
        sent(&mut pending, entry("a"));
        pending.mark_unknown("a");
        sent(&mut pending, entry_at("a", later));
        pending.mark_unknown("a");
        assert_eq!(pending.entries().len(), 1);
        assert!(
            pending
                .settle(false, asked() + PENDING_LIMIT, |_| Seen::There)
                .is_empty()
        );
        assert_eq!(
            pending.settle(false, later + PENDING_LIMIT, |_| Seen::There)[0].1,
            Settled::StillThere
        );

        // A removal that failed plainly is forgotten.
        sent(&mut pending, entry("b"));
        pending.forget("b");
        assert!(pending.entries().is_empty());
    }

    #[test]
    fn files_of_earlier_versions_read_as_they_were_written() {
        let dir = tempfile::tempdir().unwrap();
        // The single-entry format: one removal in flight.
        fs::write(dir.path().join(FILE_NAME), serde_json::to_vec(&entry("old")).unwrap()).unwrap();
        let mut pending = Pending::load(dir.path());
        assert_eq!(pending.entries()[0].phase, Phase::Requested);
        assert!(pending.settle(false, asked(), |_| Seen::There).is_empty());
        let settled = pending.settle(false, asked() + PENDING_LIMIT, |_| Seen::There);
        assert_eq!(settled[0].1, Settled::StillThere);
        // The list, before entries carried an earlier removal.
        let file = serde_json::json!({
            "removals": [{ "phase": "unknown", "entry": entry("u") }],
        });
        fs::write(dir.path().join(FILE_NAME), serde_json::to_vec(&file).unwrap()).unwrap();
        let pending = Pending::load(dir.path());
        assert_eq!(pending.entries().len(), 1);
        assert_eq!(pending.entries()[0].phase, Phase::Unknown);
        assert_eq!(pending.entries()[0].earlier, None);
    }
}
