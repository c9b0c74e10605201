//! Removals whose outcome is not known yet, persisted in
//! `<state dir>/removal-in-flight.json` so that a restart does not forget
//! them: one entry per removal, with its phase.
//!
//! - `requested`: written (and fsynced) right before `RemoveImage` is
//!   called, forgotten once the removal is journaled or failed. Left there
//!   when the process ended during the call (a crash, or shutdown gave up
//!   waiting).
//! - `unknown`: the call timed out or broke and the image was still listed
//!   after watching it: the runtime may yet remove it.
//!
//! The engine settles every entry at each listing ([`Pending::settle`]),
//! whether this process or an earlier one wrote it: gone means removed
//! (journaled and counted once, through the same path as any removal), still
//! listed means not removed. An empty listing (a runtime restarting, or
//! wiped) settles nothing. A file in the single-entry format of earlier
//! versions reads as one `requested` entry.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::journal::JournalEntry;
use crate::safe_file::{self, Links};

/// The file's name inside the state directory.
pub const FILE_NAME: &str = "removal-in-flight.json";
/// A file larger than this is not one imagegc wrote.
const MAX_BYTES: u64 = 1024 * 1024;

/// Where a removal whose outcome is unknown stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
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
    /// The journal entry it becomes once it is known to have happened.
    pub entry: JournalEntry,
    /// Whether this process wrote it (not persisted: false when loaded).
    #[serde(skip)]
    pub this_process: bool,
}

/// Whether a write of the file must be durable before it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Durability {
    Synced,
    Unsynced,
}

/// How a pending removal was settled by a listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The image is no longer listed: the removal happened.
    Gone,
    /// The image is still listed: the removal did not happen.
    StillThere,
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
        Pending { path, entries }
    }

    /// The removals pending now.
    pub fn entries(&self) -> &[PendingRemoval] {
        &self.entries
    }

    /// Notes a removal about to be asked of the runtime, durably (best
    /// effort: a failure is logged and the removal goes on).
    pub fn request(&mut self, entry: JournalEntry) {
        self.entries.retain(|p| p.entry.image != entry.image);
        self.entries.push(PendingRemoval {
            phase: Phase::Requested,
            entry,
            this_process: true,
        });
        self.persist(Durability::Synced);
    }

    /// The removal of `image` failed without telling whether it happened:
    /// kept as [`Phase::Unknown`] until a listing settles it.
    pub fn mark_unknown(&mut self, image: &str) {
        for pending in self.entries.iter_mut().filter(|p| p.entry.image == image) {
            pending.phase = Phase::Unknown;
        }
        self.persist(Durability::Synced);
    }

    /// Forgets the removal of `image`: it was journaled, or it failed.
    pub fn forget(&mut self, image: &str) {
        let before = self.entries.len();
        self.entries.retain(|p| p.entry.image != image);
        if self.entries.len() != before {
            self.persist(Durability::Unsynced);
        }
    }

    /// Settles every pending removal against a listing of the runtime's
    /// images (`listed` says whether an id is listed): each comes back
    /// with how it was settled, and is forgotten. A listing with no image
    /// at all settles nothing: a runtime that is restarting lists nothing
    /// for a moment, and that is no sign an image went.
    pub fn settle(&mut self, listing_empty: bool, listed: impl Fn(&str) -> bool) -> Vec<(PendingRemoval, Settled)> {
        if self.entries.is_empty() || listing_empty {
            return Vec::new();
        }
        let settled: Vec<(PendingRemoval, Settled)> = std::mem::take(&mut self.entries)
            .into_iter()
            .map(|p| {
                let how = if listed(&p.entry.image) {
                    Settled::StillThere
                } else {
                    Settled::Gone
                };
                (p, how)
            })
            .collect();
        self.persist(Durability::Unsynced);
        settled
    }

    /// Writes the entries (or removes the file when there are none):
    /// written to a temporary file and renamed, so that a crash leaves the
    /// old list or the new one whole. A removal about to be asked for, or of
    /// unknown outcome, is made durable (the file and the directory
    /// fsynced) before the call: it must survive a power loss. Forgetting
    /// one that was journaled or failed is not: lost, it comes back at the
    /// next start, which finds it settled (journaled again at worst, never
    /// lost).
    fn persist(&self, durability: Durability) {
        let synced = durability == Durability::Synced;
        let result = if self.entries.is_empty() {
            match fs::remove_file(&self.path) {
                Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
                _ if synced => safe_file::sync_parent(&self.path),
                _ => Ok(()),
            }
        } else {
            serde_json::to_vec(&FileRef {
                removals: &self.entries,
            })
            .map_err(io::Error::other)
            .and_then(|bytes| safe_file::replace(&self.path, &bytes, synced))
        };
        if let Err(err) = result {
            tracing::warn!(path = %self.path.display(), error = %err, "could not note the removals in flight");
        }
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
                this_process: false,
            }]),
            Err(_) => Err(err),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        }
    }

    #[test]
    fn an_unknown_removal_survives_a_restart_and_settles_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut pending = Pending::load(dir.path());
        pending.request(entry("a"));
        pending.mark_unknown("a");
        // The process ends here, however it ends.
        drop(pending);
        let mut pending = Pending::load(dir.path());
        assert_eq!(pending.entries().len(), 1);
        assert_eq!(pending.entries()[0].phase, Phase::Unknown);
        assert!(!pending.entries()[0].this_process);
        // A runtime restarting lists nothing: no sign the image went.
        assert!(pending.settle(true, |_| false).is_empty());
        let settled = pending.settle(false, |id| id == "other");
        assert_eq!(settled.len(), 1);
        assert_eq!(settled[0].1, Settled::Gone);
        assert!(pending.settle(false, |_| false).is_empty(), "settled once");
        assert!(!dir.path().join(FILE_NAME).exists(), "nothing left on disk");
    }

    #[test]
    fn an_earlier_versions_single_entry_reads_as_requested() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(FILE_NAME), serde_json::to_vec(&entry("old")).unwrap()).unwrap();
        let mut pending = Pending::load(dir.path());
        assert_eq!(pending.entries()[0].phase, Phase::Requested);
        let settled = pending.settle(false, |id| id == "old");
        assert_eq!(settled[0].1, Settled::StillThere);
    }
}
