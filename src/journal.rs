//! The audit journal: one JSON line per removal in
//! `<state dir>/removals.jsonl`, rotated by size to `removals.jsonl.1`.
//!
//! Each line: `{"time", "image", "tags", "digests", "reason", "size_bytes",
//! "freed_bytes", "last_used", "first_seen", "dry_run"}` with RFC 3339 times.
//! Writing is best effort: a full disk must not stop collection (that is
//! when collection matters most), so failures are logged, not returned.
//! `imagegc history` reads the journal back.

use std::fs::{self, OpenOptions};
use std::io::{self, BufRead, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::collector::Removal;
use crate::time::rfc3339;

pub const FILE_NAME: &str = "removals.jsonl";
/// The journal rotates when it passes this size; one rotated file is kept,
/// so the journal takes at most twice this on disk (~40,000 removals).
pub const ROTATE_BYTES: u64 = 8 * 1024 * 1024;

/// One line of the journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    pub time: String,
    pub image: String,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub digests: Vec<String>,
    pub reason: String,
    pub size_bytes: u64,
    pub freed_bytes: Option<u64>,
    pub last_used: String,
    pub first_seen: String,
    pub dry_run: bool,
}

impl JournalEntry {
    pub fn from_removal(removal: &Removal, now: SystemTime) -> Self {
        JournalEntry {
            time: rfc3339(now),
            image: removal.id.clone(),
            tags: removal.tags.clone(),
            digests: removal.digests.clone(),
            reason: removal.reason.as_str().to_string(),
            size_bytes: removal.size,
            freed_bytes: removal.freed_bytes,
            last_used: rfc3339(removal.last_used),
            first_seen: rfc3339(removal.first_seen),
            dry_run: removal.dry_run,
        }
    }

    /// The entry's time, if it parses.
    pub fn timestamp(&self) -> Option<SystemTime> {
        humantime::parse_rfc3339(&self.time).ok()
    }
}

/// The journal files of one state directory.
#[derive(Debug, Clone)]
pub struct Journal {
    path: PathBuf,
    rotated: PathBuf,
}

impl Journal {
    pub fn new(state_dir: &Path) -> Self {
        Journal {
            path: state_dir.join(FILE_NAME),
            rotated: state_dir.join(format!("{FILE_NAME}.1")),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one entry; failures are logged and otherwise ignored.
    pub fn append(&self, entry: &JournalEntry) {
        if let Err(err) = self.try_append(entry) {
            tracing::warn!(path = %self.path.display(), error = %err, "could not write the removal journal");
        }
    }

    fn try_append(&self, entry: &JournalEntry) -> io::Result<()> {
        if let Some(dir) = self.path.parent() {
            // The state directory is private (see `crate::state`); the
            // journal may be the first to create it.
            fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        }
        if fs::symlink_metadata(&self.path).is_ok_and(|m| m.len() >= ROTATE_BYTES) {
            fs::rename(&self.path, &self.rotated)?;
        }
        let mut line = serde_json::to_vec(entry).map_err(io::Error::other)?;
        line.push(b'\n');
        let mut file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&self.path)?;
        // One write call per line: concurrent readers never see half a line
        // from us, and a crash loses at most the line being written.
        file.write_all(&line)
    }

    /// Entries at or after `since` (all when None), oldest first. Lines that
    /// do not parse (a torn last line after a crash) are skipped.
    pub fn read(&self, since: Option<SystemTime>) -> io::Result<Vec<JournalEntry>> {
        let mut entries = Vec::new();
        for path in [&self.rotated, &self.path] {
            let file = match fs::File::open(path) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            for line in io::BufReader::new(file).lines() {
                let Ok(entry) = serde_json::from_str::<JournalEntry>(&line?) else {
                    continue;
                };
                if since.is_none_or(|s| entry.timestamp().is_some_and(|t| t >= s)) {
                    entries.push(entry);
                }
            }
        }
        Ok(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Reason;
    use std::time::Duration;

    fn removal(id: &str) -> Removal {
        Removal {
            id: id.to_string(),
            tags: vec![format!("docker.io/library/{id}:1")],
            digests: vec![],
            reason: Reason::Space,
            size: 100,
            freed_bytes: Some(200),
            first_seen: SystemTime::UNIX_EPOCH,
            last_used: SystemTime::UNIX_EPOCH,
            dry_run: false,
        }
    }

    #[test]
    fn appends_and_reads_back_with_since() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::new(dir.path());
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        journal.append(&JournalEntry::from_removal(&removal("a"), t0));
        journal.append(&JournalEntry::from_removal(
            &removal("b"),
            t0 + Duration::from_secs(100),
        ));
        let all = journal.read(None).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].image, "a");
        assert_eq!(all[0].freed_bytes, Some(200));
        let recent = journal.read(Some(t0 + Duration::from_secs(50))).unwrap();
        assert_eq!(recent.iter().map(|e| e.image.as_str()).collect::<Vec<_>>(), ["b"]);
    }

    #[test]
    fn rotates_by_size_and_reads_both_files() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::new(dir.path());
        fs::write(journal.path(), vec![b'\n'; ROTATE_BYTES as usize]).unwrap();
        journal.append(&JournalEntry::from_removal(&removal("a"), SystemTime::now()));
        assert!(dir.path().join("removals.jsonl.1").exists());
        assert!(fs::metadata(journal.path()).unwrap().len() < 1000);
        assert_eq!(journal.read(None).unwrap().len(), 1);
    }

    #[test]
    fn a_missing_state_directory_is_created_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        Journal::new(&state).append(&JournalEntry::from_removal(&removal("a"), SystemTime::now()));
        assert_eq!(fs::metadata(&state).unwrap().permissions().mode() & 0o777, 0o700);
    }

    #[test]
    fn torn_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::new(dir.path());
        journal.append(&JournalEntry::from_removal(&removal("a"), SystemTime::now()));
        let mut f = OpenOptions::new().append(true).open(journal.path()).unwrap();
        f.write_all(b"{\"time\":\"20").unwrap();
        assert_eq!(journal.read(None).unwrap().len(), 1);
    }
}
