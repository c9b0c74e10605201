//! The audit journal: one JSON line per removal in
//! `<state dir>/removals.jsonl`, rotated by size to `removals.jsonl.1`.
//!
//! Each line: `{"time", "image", "tags", "digests", "reason", "size_bytes",
//! "freed_bytes", "last_used", "first_seen", "dry_run"}` with RFC 3339 times.
//! Writing is best effort: a full disk must not stop collection (that is
//! when collection matters most), so failures are logged, not returned.
//! Every append starts on a fresh line: after a write cut short (a full
//! disk) or a planted partial line, the next entry is still whole.
//! `imagegc history` reads the journal back: a line that does not parse
//! (torn, not UTF-8) is skipped alone, and only regular files are read
//! (never a FIFO, a device, or through a symbolic link), at most
//! [`READ_MAX_BYTES`] of each, the newest.
//!
//! A removal is journaled once it is known to have happened; until then it
//! is pending (see `crate::store::pending`).

use std::fs;
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::safe_file::{self, Links};

use serde::{Deserialize, Serialize};

use crate::model::Removal;
use crate::time::rfc3339;

/// The journal's name inside the state directory: `<state.dir>/removals.jsonl`
/// (rotated to `removals.jsonl.1`).
pub const FILE_NAME: &str = "removals.jsonl";
/// The journal rotates when it passes this size; one rotated file is kept,
/// so the journal takes at most twice this on disk (~40,000 removals).
pub const ROTATE_BYTES: u64 = 8 * 1024 * 1024;
/// The most `history` reads of each journal file (its newest part): four
/// times what rotation lets a file grow to, so a file imagegc wrote is
/// always read whole, and one it did not write cannot exhaust memory.
pub const READ_MAX_BYTES: u64 = 4 * ROTATE_BYTES;
/// Why the journal could not be read, naming the file.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the removal journal {path}: {source}")]
pub struct JournalError {
    /// The journal file that could not be read (`removals.jsonl` or its rotated
    /// `removals.jsonl.1`).
    pub path: PathBuf,
    /// The I/O error, or why the file was refused (not a regular file, a link).
    pub source: io::Error,
}

/// One line of the journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// When the removal was journaled, RFC 3339 in UTC.
    pub time: String,
    /// The image id, as the runtime listed it.
    pub image: String,
    /// The image's tags when it was removed (absent in old entries: empty).
    #[serde(default)]
    pub tags: Vec<String>,
    /// The image's repository digests when it was removed (absent in old
    /// entries: empty).
    #[serde(default)]
    pub digests: Vec<String>,
    /// Why it was removed: `"age"` or `"space"`.
    pub reason: String,
    /// The size the runtime reported, in bytes.
    pub size_bytes: u64,
    /// Bytes the filesystem gained back, measured around the removal; `null`
    /// in dry run or when the filesystem could not be measured.
    pub freed_bytes: Option<u64>,
    /// When a container was last seen using the image, RFC 3339 in UTC.
    pub last_used: String,
    /// When imagegc first saw the image, RFC 3339 in UTC.
    pub first_seen: String,
    /// True when nothing was removed: the entry records what a dry run would
    /// have done.
    pub dry_run: bool,
    /// How the removal became known, when not as it happened: `completed
    /// after shutdown` for a removal found done at the next start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// When the removal was asked: its pending note's own time (RFC 3339,
    /// nanoseconds), which names this removal apart from any other of the
    /// same image. A process started after one that ended between a
    /// removal's journal line and forgetting its note matches the two, and
    /// journals the removal no second time. Absent in dry run and in lines
    /// of earlier versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asked: Option<String>,
}

impl JournalEntry {
    /// The entry for `removal`, journaled at `now`.
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
            note: None,
            asked: None,
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
    /// The journal files of `state_dir` (nothing is opened until used).
    pub fn new(state_dir: &Path) -> Self {
        Journal {
            path: state_dir.join(FILE_NAME),
            rotated: state_dir.join(format!("{FILE_NAME}.1")),
        }
    }

    /// The current journal file, `<state dir>/removals.jsonl`.
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
            // The state directory is private (see `crate::store::state`); the
            // journal may be the first to create it.
            fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        }
        if fs::symlink_metadata(&self.path).is_ok_and(|m| m.len() >= ROTATE_BYTES) {
            fs::rename(&self.path, &self.rotated)?;
        }
        let mut line = serde_json::to_vec(entry).map_err(io::Error::other)?;
        line.push(b'\n');
        let mut file = safe_file::open_append(&self.path, 0o600)?;
        // A last line left without its newline (a write cut short, or
        // planted) would swallow this entry: start on a fresh line.
        let len = file.metadata()?.len();
        let mut last = [0u8; 1];
        if len > 0 && file.read_exact_at(&mut last, len - 1).is_ok() && last[0] != b'\n' {
            line.insert(0, b'\n');
        }
        // One write call per line: concurrent readers never see half a line
        // from us, and a crash loses at most the line being written.
        file.write_all(&line)
    }

    /// Entries at or after `since` (all when None), oldest first. Lines that
    /// do not parse (a torn line after a crash, a byte that is not UTF-8)
    /// are skipped, each alone.
    pub fn read(&self, since: Option<SystemTime>) -> Result<Vec<JournalEntry>, JournalError> {
        let mut entries = Vec::new();
        for path in [&self.rotated, &self.path] {
            let bytes = match read_newest(path) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(source) => {
                    return Err(JournalError {
                        path: path.clone(),
                        source,
                    });
                }
            };
            for line in bytes.split(|&b| b == b'\n') {
                let Ok(entry) = serde_json::from_slice::<JournalEntry>(line) else {
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

/// A journal file's bytes: a regular file only, never through a link, and
/// of a file larger than [`READ_MAX_BYTES`] only its newest lines.
fn read_newest(path: &Path) -> io::Result<Vec<u8>> {
    let mut file = safe_file::open_read(path, Links::Refuse)?;
    let len = file.metadata()?.len();
    let skip = len.saturating_sub(READ_MAX_BYTES);
    if skip > 0 {
        file.seek(io::SeekFrom::Start(skip))?;
    }
    let mut bytes = Vec::with_capacity(len.min(READ_MAX_BYTES) as usize);
    file.take(READ_MAX_BYTES).read_to_end(&mut bytes)?;
    if skip > 0 {
        // The first line was cut by the skip.
        let first = bytes.iter().position(|&b| b == b'\n').map_or(bytes.len(), |n| n + 1);
        bytes.drain(..first);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Reason;
    use std::fs::OpenOptions;
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

    #[test]
    fn a_torn_line_does_not_swallow_the_next_entry() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::new(dir.path());
        journal.append(&JournalEntry::from_removal(&removal("a"), SystemTime::now()));
        // Half a line: a write cut short by a full disk, or planted.
        let mut f = OpenOptions::new().append(true).open(journal.path()).unwrap();
        f.write_all(b"{\"time\":\"20").unwrap();
        journal.append(&JournalEntry::from_removal(&removal("b"), SystemTime::now()));
        let images: Vec<String> = journal.read(None).unwrap().into_iter().map(|e| e.image).collect();
        assert_eq!(images, ["a", "b"]);
    }

    #[test]
    fn a_line_with_a_byte_that_is_not_utf8_is_skipped_alone() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::new(dir.path());
        journal.append(&JournalEntry::from_removal(&removal("a"), SystemTime::now()));
        let mut f = OpenOptions::new().append(true).open(journal.path()).unwrap();
        f.write_all(b"{\"image\":\"\xff\"}\n").unwrap();
        journal.append(&JournalEntry::from_removal(&removal("b"), SystemTime::now()));
        let images: Vec<String> = journal.read(None).unwrap().into_iter().map(|e| e.image).collect();
        assert_eq!(images, ["a", "b"]);
    }
}
