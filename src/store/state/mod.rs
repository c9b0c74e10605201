//! Persistence of the records, crash-safe.
//!
//! One file, `<state dir>/records.state`, in this format (version 7):
//!
//! ```text
//! imagegc-state v7 crc32=<8 hex digits> len=<payload bytes, 10 digits>\n
//! {"saved_at":<unix ms>,"records":<how many lines follow>[,"last_success":<unix ms>][,"removed":[["<image id>",<last used>,<removed at>,<usual break, ms>,<spread, ms>],...]][,"layers":[["<layer key>",<bytes>,<measured at>],...]][,"footprint":[<own>,<learnt>]][,"ghosts":[[["<layer key>",...],<reported size>,<removed at>],...]]}\n
//! ["<image id>",<first seen, unix ms>,<last used, unix ms>,<size bytes>,<pinned>,[<tag>,...],[<repo digest>,...],<ever used>,<usual break, ms>,<spread, ms>]\n
//! ...
//! ```
//!
//! `ever used` says whether a container was ever seen using the image: the
//! times cannot say it once loaded, since loading moves last-used times
//! forward. Version 2 files (lines without it) are still read, an image
//! counting as ever used when its stored last use is after its first
//! sighting, as version 2 inferred. `usual break` is the image's
//! [`crate::records::Record::usual_break`], 0 when none is known; version 3
//! files (lines without it) are still read, no break known. `removed`
//! (version 5) is what imagegc remembers of images removed after they were
//! used (at most 10,000, for 30 days), so that one pulled again after a
//! restart has its usual break back; version 4 files (without it) are
//! still read, nothing remembered. `layers` (version 6) is what measured
//! removals showed layers take on disk (`[["<layer key>",<bytes>,<measured
//! at>],...]`, at most 10,000, for 30 days: see [`crate::policy::layers`]);
//! with `ghosts` (`[[["<layer key>",...],<reported size>,<removed at>],...]`,
//! removed images whose layers others still held, at most 1,000) and
//! `footprint` (`[<the runtime's own>,<learnt>]` on-disk bytes per
//! reported byte in thousandths, when removals raised it); version 5 files
//! (without them) are still read, no layer sized. `spread` (version 7) is
//! how far the image's breaks stray from the usual one
//! ([`crate::records::Break::spread`]), `null` when not known (one break
//! seen); versions 4 to 6 (lines and `removed` entries without it) are
//! still read, no spread known. An imagegc
//! older than a file's version
//! sets it aside as unreadable (named `records.state.corrupt-...`, see
//! below) and starts afresh: a downgrade loses the records' history, not
//! an image (every image is new to it, and `gc.min_age` keeps it).
//!
//! The payload is one JSON value a line: the time of the save, the number
//! of records and, when one is known, the time of the last successful cycle
//! (so `imagegc_last_success_timestamp_seconds` survives a restart; files
//! without it still load), then one array per image, sorted by id. Strings are JSON
//! strings, whose escapes never leave a newline inside a line, so
//! `tail -n +3 records.state | jq -c` reads the records. The CRC-32 of the
//! payload and its length are in the header, so a torn or altered file is
//! detected rather than believed.
//!
//! Version 1 files (before this layout) are still read: their payload is one
//! JSON object, `{"saved_at": <unix ms>, "records": {"<image id>":
//! {"first_seen": <unix ms>, "last_used": <unix ms>, "size": <bytes>,
//! "pinned": <bool>, "tags": [...], "digests": [...]}, ...}}`. Version 2 drops
//! the field names from every record (a sixth of the file) and is parsed
//! straight into the records' map.
//!
//! Writes go to a fresh temporary file (created with `O_EXCL|O_NOFOLLOW`,
//! mode 0600), which is fsynced, renamed over the old file, and the directory
//! fsynced: after a crash at any point the file is either the previous
//! complete state or the new one. The payload goes to the file as it is
//! encoded, so the disk works while the rest is encoded; the header, which
//! needs the payload's checksum and length, is written last over a
//! placeholder of the same width (hence the ten-digit length). The
//! temporary file's name carries the writer's pid and random bytes (two pods
//! each with pid 1 never share one); the next save removes those of writers
//! whose pid no longer runs (killed mid-save), so they do not pile up across
//! crashes.
//!
//! The directory is created 0700. An existing one must be owned by the
//! effective user (root on a node) and not writable by group or others, or
//! it is refused ([`StateError::Unsafe`], naming the fix): another user
//! could plant a FIFO or a link there. A symbolic link as the directory is
//! followed when the link is the effective user's or root's and the
//! directory it names passes the same check. `run` and `once` hold an
//! exclusive `flock` on `<state dir>/.lock` for their whole life
//! ([`StateStore::lock`]): a second imagegc on the same directory, in any
//! pid namespace, is refused at start.
//!
//! The state file is read only when it is a regular file (a FIFO, a device
//! or a link in its place is refused without blocking or following), and
//! its size is checked before a byte is read. A missing file is a fresh
//! start. A file that cannot be read or does not verify is renamed aside to
//! `records.state.corrupt-<unix seconds>` (with `-1`, `-2`... when that name
//! is taken, never over it) and the collector starts fresh: no
//! history is invented from it, so age-based removal waits (see
//! [`crate::policy`]) while space-based removal goes on. A read-only store
//! (`imagegc plan`) reports a corrupt file and leaves it where it is.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::records::Records;
use crate::time::{from_unix_millis, to_unix_millis};

mod format;
mod known;
mod running;

pub use known::Known;
pub use running::{Running, StartOnly};

use format::{Decoded, HEADER_BYTES, decode, encode_payload, header};
pub use format::{encode, verify};

/// The state file's name inside the state directory: `<state.dir>/records.state`.
pub const FILE_NAME: &str = "records.state";
/// The lock file: `run` and `once` hold an exclusive `flock` on it.
pub const LOCK_FILE_NAME: &str = ".lock";
const MAGIC: &str = "imagegc-state";
/// The version [`encode`] writes; versions 1 to 3 are still read.
const VERSION: u32 = 7;
/// A state file larger than this is not a state file imagegc wrote
/// (a million images take about 300 MiB).
const MAX_FILE_BYTES: u64 = 1 << 30;

/// Why the state directory could not be used or the state could not be saved.
/// Each names the directory or file. An unsafe directory is a configuration
/// error (exit status 2); a locked one exits with 4.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The state directory could not be created, or not inspected.
    #[error("cannot create the state directory {path}: {source}")]
    CreateDir {
        /// The state directory.
        path: PathBuf,
        /// The error from creating or inspecting it.
        source: io::Error,
    },
    /// Saving failed (temp file, fsync, rename or the directory's fsync); the
    /// state file on disk is still the previous save.
    #[error("cannot write the state file {path}: {source}")]
    Write {
        /// The state file.
        path: PathBuf,
        /// The error from the step that failed.
        source: io::Error,
    },
    /// The state directory is not safe to trust: not owned by the effective user,
    /// writable by group or others, or a symbolic link another user owns.
    #[error(
        "refusing the state directory {path}: {problem}; another user could plant files in it that imagegc \
         reads and writes. Fix it with `chown {owner} {path} && chmod 0700 {path}`"
    )]
    Unsafe {
        /// The state directory.
        path: PathBuf,
        /// What is wrong with it (owner, mode, kind of file).
        problem: String,
        /// `root:root`, or the effective uid:gid when not running as root.
        owner: String,
    },
    /// Another imagegc holds the state directory's lock.
    #[error(
        "another imagegc is using the state directory {path} (it holds the lock on {path}/{LOCK_FILE_NAME}); \
         one imagegc per state directory: stop the other one or give this one its own state.dir"
    )]
    Locked {
        /// The state directory.
        path: PathBuf,
    },
    /// The lock file could not be opened or locked, for a reason other than
    /// another holder.
    #[error("cannot lock the state directory {path}: {source}")]
    Lock {
        /// The state directory.
        path: PathBuf,
        /// The error from opening or locking `.lock` in it.
        source: io::Error,
    },
    /// A save was asked of a store opened with [`StateStore::read_only`].
    #[error("the state in {path} is opened read-only here; nothing is written")]
    ReadOnly {
        /// The state directory.
        path: PathBuf,
    },
}

/// Why a state file was not believed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Corruption {
    /// The file could not be read: the I/O error, or why it was refused (not a
    /// regular file, a symbolic link, larger than any state file imagegc writes).
    #[error("cannot read it: {0}")]
    Unreadable(String),
    /// The file has no bytes.
    #[error("it is empty")]
    Empty,
    /// The first line is not an imagegc state header.
    #[error("it has no valid header")]
    BadHeader,
    /// The header names a format version this imagegc does not read (the
    /// version as written in the file).
    #[error("it is version {0}, this imagegc reads versions 1 to {VERSION}")]
    WrongVersion(String),
    /// The header's payload length does not match the bytes that follow.
    #[error("it is truncated or has extra bytes (header says {expected} payload bytes, found {found})")]
    Length {
        /// Payload bytes the header announces.
        expected: usize,
        /// Payload bytes the file holds.
        found: usize,
    },
    /// The CRC-32 in the header does not match the payload's.
    #[error("its checksum does not match (header {expected:08x}, payload {found:08x})")]
    Checksum {
        /// The CRC-32 the header records.
        expected: u32,
        /// The CRC-32 of the payload as read.
        found: u32,
    },
    /// The payload passed the checks but does not decode into records (the
    /// decoder's message).
    #[error("its payload is not valid: {0}")]
    Payload(String),
}

/// What loading found.
#[derive(Debug)]
pub enum Loaded {
    /// No state file: a fresh start.
    Fresh,
    /// Records from the file, each marked `from_history`.
    Records {
        /// Every image the file remembers, keyed by image id.
        records: Records,
        /// When the file was saved, as recorded in it (never later than `now`).
        saved_at: SystemTime,
        /// The last successful cycle the file remembers (never later than
        /// `now`); `None` for files written before it was kept.
        last_success: Option<SystemTime>,
    },
    /// The file was corrupt; it was moved to `moved_to` (None when even the
    /// rename failed) and the collector starts fresh.
    Corrupt {
        /// Why the file was not believed.
        reason: Corruption,
        /// Where the file was moved aside (`records.state.corrupt-<unix seconds>`);
        /// `None` when the rename failed or the store is read-only.
        moved_to: Option<PathBuf>,
    },
}

/// The state directory and file.
#[derive(Debug, Clone)]
pub struct StateStore {
    dir: PathBuf,
    path: PathBuf,
    /// Set by [`StateStore::read_only`]: nothing is renamed or written.
    read_only: bool,
}

/// The exclusive lock on a state directory, held until dropped (or until
/// the process ends, however it ends: the kernel releases a `flock`).
#[derive(Debug)]
pub struct StateLock {
    _file: Option<File>,
}

impl StateStore {
    /// A store for `dir` (the state directory, `state.dir`); touches nothing on
    /// disk until it is locked, loaded or saved.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        let path = dir.join(FILE_NAME);
        StateStore {
            dir,
            path,
            read_only: false,
        }
    }

    /// The same store for a reader that writes nothing (`imagegc plan`): a
    /// corrupt file is reported and left where it is, and saves fail.
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// True for a store made by [`StateStore::read_only`].
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Takes the exclusive lock on the state directory, creating the
    /// directory when missing and checking it is safe (see
    /// [`StateStore::check_dir`]). A second imagegc on the same directory,
    /// in this or another pid namespace, gets [`StateError::Locked`]. On a
    /// read-only or full filesystem no lock file can be made, and nothing
    /// can be saved either: the caller runs unlocked (with a warning).
    pub fn lock(&self) -> Result<StateLock, StateError> {
        self.ensure_dir()?;
        let path = self.dir.join(LOCK_FILE_NAME);
        let lerr = |source| StateError::Lock {
            path: self.dir.clone(),
            source,
        };
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&path)
        {
            Ok(file) => file,
            Err(err) if matches!(err.raw_os_error(), Some(libc::EROFS | libc::ENOSPC | libc::EDQUOT)) => {
                tracing::warn!(
                    path = %path.display(),
                    error = %err,
                    "cannot create the state directory's lock file: running unlocked; no state can be saved either"
                );
                return Ok(StateLock { _file: None });
            }
            Err(err) => return Err(lerr(err)),
        };
        crate::safe_file::ensure_regular(&file).map_err(lerr)?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let err = io::Error::last_os_error();
            return Err(if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                StateError::Locked { path: self.dir.clone() }
            } else {
                lerr(err)
            });
        }
        Ok(StateLock { _file: Some(file) })
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The state file: `<dir>/records.state`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Loads the records. `now` clamps times from the future (a clock that
    /// went backwards since the save), and `unobserved_grace` bounds how much
    /// of the time since the save counts as unused time: the collector did
    /// not watch the runtime then, so beyond one expected gap between
    /// observations, the last-used times move forward by the rest.
    pub fn load(&self, now: SystemTime, unobserved_grace: Duration) -> Loaded {
        let bytes = match read_limited(&self.path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Loaded::Fresh,
            Err(err) => return self.set_aside(Corruption::Unreadable(err.to_string())),
        };
        match decode(&bytes) {
            Ok(Decoded {
                saved_at,
                last_success,
                mut records,
                removed,
                layers,
                footprint,
                ghosts,
            }) => {
                let saved_at = from_unix_millis(saved_at).min(now);
                let last_success = last_success.map(|ms| from_unix_millis(ms).min(now));
                let shift = now
                    .duration_since(saved_at)
                    .unwrap_or_default()
                    .saturating_sub(unobserved_grace);
                for record in records.values_mut() {
                    record.first_seen = record.first_seen.min(now);
                    record.last_used = (record.last_used + shift).min(now).max(record.first_seen);
                }
                let mut records = Records::from_loaded(records);
                records.restore_removed(
                    removed.into_iter().map(|line| {
                        let (id, last_used, removed_at, usual_break) = line.into_parts();
                        (
                            id,
                            from_unix_millis(last_used),
                            from_unix_millis(removed_at),
                            usual_break,
                        )
                    }),
                    now,
                );
                records.set_footprint(footprint);
                records.set_layer_ghosts(
                    ghosts
                        .into_iter()
                        .map(|(layers, reported, at)| (layers, reported, from_unix_millis(at).min(now)))
                        .collect(),
                );
                records.set_layer_sizes(
                    layers
                        .into_iter()
                        .map(|(layer, bytes, at)| (layer, bytes, from_unix_millis(at).min(now))),
                );
                Loaded::Records {
                    records,
                    saved_at,
                    last_success,
                }
            }
            Err(reason) => self.set_aside(reason),
        }
    }

    #[expect(clippy::disallowed_methods, reason = "names a corrupt file set aside, for people")]
    fn set_aside(&self, reason: Corruption) -> Loaded {
        if self.read_only {
            return Loaded::Corrupt { reason, moved_to: None };
        }
        let secs = to_unix_millis(SystemTime::now()) / 1000;
        // Never over an earlier file set aside in the same second: each is
        // kept for inspection (`-1`, `-2`... after the first).
        let moved_to = (0..100)
            .map(|n| match n {
                0 => self.dir.join(format!("{FILE_NAME}.corrupt-{secs}")),
                n => self.dir.join(format!("{FILE_NAME}.corrupt-{secs}-{n}")),
            })
            .find(|aside| fs::symlink_metadata(aside).is_err_and(|e| e.kind() == io::ErrorKind::NotFound))
            .and_then(|aside| fs::rename(&self.path, &aside).ok().map(|()| aside));
        Loaded::Corrupt { reason, moved_to }
    }

    /// Saves the records atomically (see the module docs). The payload goes
    /// to the file a chunk at a time as it is encoded, each chunk handed to
    /// the disk at once, so the final fsync has little left to wait for.
    pub fn save(&self, records: &Records, now: SystemTime) -> Result<(), StateError> {
        self.save_with_last_success(records, now, None)
    }

    /// [`StateStore::save`], remembering also when the last successful cycle
    /// finished.
    pub fn save_with_last_success(
        &self,
        records: &Records,
        now: SystemTime,
        last_success: Option<SystemTime>,
    ) -> Result<(), StateError> {
        if self.read_only {
            return Err(StateError::ReadOnly { path: self.dir.clone() });
        }
        self.write_atomic(|mut file| {
            file.write_all(&[b' '; HEADER_BYTES])?;
            let mut at = HEADER_BYTES;
            let (crc, len) = encode_payload(records, now, last_success, |chunk| {
                file.write_all(chunk)?;
                start_writeback(file, at, chunk.len());
                at += chunk.len();
                Ok(())
            })?;
            file.write_all_at(header(crc, len).as_bytes(), 0)
        })
    }

    /// Checks an existing state directory without creating it: Ok(false)
    /// when it is missing. The directory, or the one a symbolic link there
    /// names, must be owned by the effective user (root on a node) and not
    /// writable by group or others; the link itself must be owned by that
    /// user or root. Anything else is [`StateError::Unsafe`]: a directory
    /// another user can write could hold a FIFO or a link imagegc trips on.
    pub fn check_dir(&self) -> Result<bool, StateError> {
        let err = |source| StateError::CreateDir {
            path: self.dir.clone(),
            source,
        };
        let euid = unsafe { libc::geteuid() };
        let unsafe_dir = |problem: String| StateError::Unsafe {
            path: self.dir.clone(),
            problem,
            owner: if euid == 0 {
                "root:root".to_string()
            } else {
                format!("{euid}:{}", unsafe { libc::getegid() })
            },
        };
        let meta = match fs::symlink_metadata(&self.dir) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(err(e)),
        };
        let meta = if meta.file_type().is_symlink() {
            use std::os::unix::fs::MetadataExt;
            if meta.uid() != euid && meta.uid() != 0 {
                return Err(unsafe_dir(format!(
                    "it is a symbolic link owned by uid {}, not by uid {euid} or root",
                    meta.uid()
                )));
            }
            match fs::metadata(&self.dir) {
                Ok(target) => target,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(err(io::Error::other(
                        "it is a symbolic link to a directory that does not exist",
                    )));
                }
                Err(e) => return Err(err(e)),
            }
        } else {
            meta
        };
        if !meta.is_dir() {
            return Err(err(io::Error::other("exists and is not a directory")));
        }
        use std::os::unix::fs::MetadataExt;
        if meta.uid() != euid {
            return Err(unsafe_dir(format!(
                "it is owned by uid {}, not by uid {euid} that imagegc runs as",
                meta.uid()
            )));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(unsafe_dir(format!(
                "it is writable by group or others (mode {:04o})",
                meta.mode() & 0o7777
            )));
        }
        Ok(true)
    }

    fn ensure_dir(&self) -> Result<(), StateError> {
        if self.check_dir()? {
            return Ok(());
        }
        let err = |source| StateError::CreateDir {
            path: self.dir.clone(),
            source,
        };
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(err)?;
        // The umask may have narrowed, never widened; make it exact.
        fs::set_permissions(&self.dir, fs::Permissions::from_mode(0o700)).map_err(err)
    }

    /// Has `write` fill a fresh temporary file, then puts it in place.
    fn write_atomic(&self, write: impl FnOnce(&File) -> io::Result<()>) -> Result<(), StateError> {
        self.ensure_dir()?;
        let werr = |path: &Path, source| StateError::Write {
            path: path.to_path_buf(),
            source,
        };
        self.remove_stale_temporaries();
        // The pid (for the clean-up of dead writers' files) and random
        // bytes: two writers with the same pid in two pid namespaces never
        // share a name. `create_new` never follows or reuses what is there.
        let tmp = self
            .dir
            .join(format!(".{FILE_NAME}.tmp-{}-{:016x}", std::process::id(), random_u64()));
        let result = (|| {
            let file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp)?;
            write(&file)?;
            file.sync_all()?;
            drop(file);
            fs::rename(&tmp, &self.path)?;
            File::open(&self.dir)?.sync_all()
        })();
        if let Err(source) = result {
            let _ = fs::remove_file(&tmp);
            return Err(werr(&self.path, source));
        }
        Ok(())
    }

    /// Removes the temporary files of writers that no longer run. One of a
    /// live process (an `imagegc once` beside the daemon) is left alone; one
    /// whose pid is not visible here (another pid namespace) may be removed,
    /// which makes that writer's save fail, never the state file torn.
    fn remove_stale_temporaries(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let prefix = format!(".{FILE_NAME}.tmp-");
        for entry in entries.flatten() {
            let name = entry.file_name();
            let pid = name
                .to_str()
                .and_then(|n| n.strip_prefix(&prefix))
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<libc::pid_t>().ok());
            if let Some(pid) = pid
                && pid > 0
                && !process_exists(pid)
            {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

fn process_exists(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 sends nothing; it only checks that the pid exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Random bytes from the kernel; the time and the pid when there are none.
#[expect(clippy::disallowed_methods, reason = "entropy when the kernel has none")]
fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom writes at most `bytes.len()` bytes into `bytes`.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), libc::GRND_NONBLOCK) };
    if n == bytes.len() as isize {
        return u64::from_ne_bytes(bytes);
    }
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    nanos ^ (u64::from(std::process::id()) << 32)
}

/// Reads the state file: a regular file only (a FIFO, a device or a link
/// planted in its place is refused without blocking or following), its
/// size checked before a byte is read.
fn read_limited(path: &Path) -> io::Result<Vec<u8>> {
    crate::safe_file::read_bounded(path, crate::safe_file::Links::Refuse, MAX_FILE_BYTES)
}

/// Starts writing `len` bytes of `file` at `offset` to the disk, without
/// waiting: the fsync that follows still decides durability, it only finds
/// less to do. Linux only; elsewhere the fsync does it all.
#[cfg(target_os = "linux")]
fn start_writeback(file: &File, offset: usize, len: usize) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor and range; the call only schedules I/O.
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    };
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File, _offset: usize, _len: usize) {}

#[cfg(test)]
mod tests {
    use super::format::*;
    use super::*;
    use crate::records::Record;
    use crate::testing::{history, library_image as image};
    use std::collections::HashMap;

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    fn sample() -> Records {
        let mut r = Records::new();
        r.observe(&[image("a", 10), image("b", 20)], &[], t(0));
        r
    }

    #[test]
    fn the_last_successful_cycle_survives_a_save_and_a_load() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("state"));
        store.save_with_last_success(&sample(), t(5), Some(t(4))).unwrap();
        let Loaded::Records { last_success, .. } = store.load(t(6), Duration::from_secs(300)) else {
            panic!("not loaded")
        };
        assert_eq!(last_success, Some(t(4)));
        let head = fs::read_to_string(store.path()).unwrap();
        assert!(
            head.lines().nth(1).unwrap().contains(r#""last_success":1700000004000"#),
            "{head}"
        );
    }

    #[test]
    fn a_state_file_without_a_last_success_still_loads() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("state"));
        store.save(&sample(), t(5)).unwrap();
        assert!(!fs::read_to_string(store.path()).unwrap().contains("last_success"));
        let Loaded::Records {
            records, last_success, ..
        } = store.load(t(6), Duration::from_secs(300))
        else {
            panic!("not loaded")
        };
        assert_eq!((records.len(), last_success), (2, None));
    }

    #[test]
    fn a_last_success_from_the_future_is_brought_back_to_now() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("state"));
        store.save_with_last_success(&sample(), t(5), Some(t(500))).unwrap();
        let Loaded::Records { last_success, .. } = store.load(t(6), Duration::from_secs(300)) else {
            panic!("not loaded")
        };
        assert_eq!(last_success, Some(t(6)));
    }

    #[test]
    fn save_and_load_round_trip_marks_history() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path().join("state"));
        store.save(&sample(), t(5)).unwrap();
        let Loaded::Records { records, saved_at, .. } = store.load(t(6), Duration::from_secs(300)) else {
            panic!("not loaded")
        };
        assert_eq!(saved_at, t(5));
        assert_eq!(records.len(), 2);
        let a = records.get("a").unwrap();
        assert_eq!((a.first_seen, a.last_used, a.size), (t(0), t(0), 10));
        assert!(a.from_history);
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(store.dir()), 0o700);
        assert_eq!(mode(store.path()), 0o600);
    }

    #[test]
    fn the_payload_is_the_documented_json_lines_sorted_by_id() {
        let bytes = encode(&sample(), t(5));
        let newline = bytes.iter().position(|&b| b == b'\n').unwrap();
        let body = &bytes[newline + 1..];
        assert_eq!(
            std::str::from_utf8(&bytes[..newline]).unwrap(),
            format!(
                "imagegc-state v7 crc32={:08x} len={:010}",
                crc32fast::hash(body),
                body.len()
            )
        );
        assert_eq!(
            std::str::from_utf8(body).unwrap(),
            concat!(
                "{\"saved_at\":1700000005000,\"records\":2}\n",
                r#"["a",1700000000000,1700000000000,10,false,["docker.io/library/a:latest"],[],false,0,null]"#,
                "\n",
                r#"["b",1700000000000,1700000000000,20,false,["docker.io/library/b:latest"],[],false,0,null]"#,
                "\n",
            )
        );
    }

    /// Records with every kind of value a state file must carry: names that
    /// need JSON escapes, none or several names, pinned, extreme sizes.
    fn varied() -> Records {
        let record = |first: u64, last: u64, size: u64, pinned: bool, tags: &[&str], digests: &[&str]| Record {
            first_seen: t(first),
            last_used: t(last),
            size,
            pinned,
            tags: tags.iter().map(ToString::to_string).collect::<Vec<_>>().into(),
            digests: digests.iter().map(ToString::to_string).collect::<Vec<_>>().into(),
            from_history: true,
            ever_used: last > first,
            // Every kind: none, a millisecond, a day, the largest.
            usual_break: match size % 4 {
                0 => None,
                1 => Some(Duration::from_millis(1)),
                2 => Some(Duration::from_secs(86_400)),
                _ => Some(Duration::from_millis(u64::MAX)),
            }
            .map(crate::records::Break::from_duration)
            // And every kind of spread: not known, none, an hour, the largest.
            .map(|b| {
                b.with_spread(match first % 4 {
                    0 => None,
                    1 => Some(Duration::ZERO),
                    2 => Some(Duration::from_secs(3_600)),
                    _ => Some(Duration::MAX),
                })
            }),
        };
        let map = HashMap::from([
            (
                format!("sha256:{}", "a".repeat(64)),
                record(
                    0,
                    50,
                    123_456_789,
                    false,
                    &["docker.io/library/nginx:1.27"],
                    &[
                        "docker.io/library/nginx@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                    ],
                ),
            ),
            (format!("sha256:{}", "b".repeat(64)), record(10, 10, 0, true, &[], &[])),
            (
                "sha256:c".to_string(),
                record(
                    20,
                    30,
                    u64::MAX,
                    false,
                    &["a:1", "b:2", "c:3"],
                    &["a@sha256:1", "b@sha256:2"],
                ),
            ),
            (
                "odd \"id\"\n\t\\ \u{1} \u{2028} é 漢".to_string(),
                record(5, 40, 1, true, &["quote\"back\\slash\nnewline:tag"], &["\u{7f}\u{0}@x"]),
            ),
        ]);
        Records::from_map(map)
    }

    #[test]
    fn a_version_1_file_written_by_the_old_encoder_loads_to_the_same_records() {
        // Written by the version 1 `encode` (as of e45aa58) from `varied()`
        // saved at t(60).
        let bytes = include_bytes!("../../../tests/data/records-v1.state");
        assert!(bytes.starts_with(b"imagegc-state v1 "));
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        fs::write(store.path(), bytes).unwrap();
        let Loaded::Records { records, saved_at, .. } = store.load(t(60), Duration::MAX) else {
            panic!("not loaded")
        };
        assert_eq!(saved_at, t(60));
        // Version 1 knew no breaks.
        let without_breaks = Records::from_map(varied().iter().map(|(id, r)| {
            let mut r = r.clone();
            r.usual_break = None;
            (id.clone(), r)
        }));
        assert_eq!(records, without_breaks);
        assert_eq!(verify(bytes), Ok(4));
    }

    #[test]
    fn every_kind_of_value_round_trips_through_a_save() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        store.save(&varied(), t(60)).unwrap();
        let bytes = fs::read(store.path()).unwrap();
        assert!(bytes.starts_with(b"imagegc-state v7 "));
        // One line for the header, one for the save time, one a record:
        // the escapes keep every newline in a name out of the file.
        assert_eq!(bytes.iter().filter(|&&b| b == b'\n').count(), 2 + 4);
        let Loaded::Records { records, saved_at, .. } = store.load(t(60), Duration::MAX) else {
            panic!("not loaded")
        };
        assert_eq!(saved_at, t(60));
        assert_eq!(records, varied());
    }

    /// What measured removals showed layers take (version 6) survives a
    /// save; a version 5 file, without it, loads with none.
    #[test]
    fn measured_layer_sizes_survive_a_save_and_a_version_5_file_has_none() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        let mut records = varied();
        let layer = format!("sha256:{}", "ab".repeat(32));
        records.set_layer_sizes([(layer.clone(), 42 << 20, t(30))]);
        records.set_footprint(Some((2_000, 3_100)));
        records.set_layer_ghosts(vec![(vec![layer.clone()], 7 << 20, t(20))]);
        store.save(&records, t(60)).unwrap();
        let text = String::from_utf8(fs::read(store.path()).unwrap()).unwrap();
        assert!(
            text.contains(&format!("\"layers\":[[\"{layer}\",{},", 42u64 << 20)),
            "{text}"
        );
        let Loaded::Records { records, .. } = store.load(t(60), Duration::MAX) else {
            panic!("not loaded")
        };
        let sizes: Vec<(String, u64, SystemTime)> =
            records.layer_sizes().map(|(l, b, at)| (l.to_string(), b, at)).collect();
        assert_eq!(sizes, [(layer.clone(), 42 << 20, t(30))]);
        assert_eq!(records.footprint(), Some((2_000, 3_100)));
        assert_eq!(records.layer_ghosts(), [(vec![layer], 7 << 20, t(20))]);
        // The same file as version 5 wrote it: no layers in its head.
        store.save(&varied(), t(60)).unwrap();
        let v7 = fs::read(store.path()).unwrap();
        let body = without_spreads(&v7[HEADER_BYTES..]);
        let mut v5 = header(crc32fast::hash(&body), body.len())
            .replace(" v7 ", " v5 ")
            .into_bytes();
        v5.extend_from_slice(&body);
        fs::write(store.path(), v5).unwrap();
        let Loaded::Records { records, .. } = store.load(t(60), Duration::MAX) else {
            panic!("a version 5 file loads")
        };
        assert_eq!(records.layer_sizes().count(), 0);
        assert_eq!((records.footprint(), records.layer_ghosts().len()), (None, 0));
        assert_eq!(records, spreads_unknown(&varied()));
    }

    /// A payload as versions 4 to 6 wrote it: record lines without the
    /// spread of the usual break.
    fn without_spreads(body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        for (n, line) in std::str::from_utf8(body).unwrap().lines().enumerate() {
            if n == 0 {
                out.extend_from_slice(line.as_bytes());
            } else {
                let mut fields: Vec<serde_json::Value> = serde_json::from_str(line).unwrap();
                fields.pop();
                out.extend_from_slice(serde_json::to_string(&fields).unwrap().as_bytes());
            }
            out.push(b'\n');
        }
        out
    }

    /// `records` as a file without spreads gives them back.
    fn spreads_unknown(records: &Records) -> Records {
        Records::from_map(records.iter().map(|(id, r)| {
            let mut r = r.clone();
            r.usual_break = r.usual_break.map(|b| b.with_spread(None));
            (id.clone(), r)
        }))
    }

    /// The committed fuzzing seed of version 6 (layers, footprint and
    /// ghosts in its head) is a file this version reads.
    #[test]
    fn the_version_6_fuzzing_seed_is_a_valid_state_file() {
        let bytes = include_bytes!("../../../fuzz/corpus/state/valid-v6-layers.state");
        assert_eq!(verify(bytes).unwrap(), 1);
    }

    /// The committed fuzzing seed of version 7 (spreads known, `null` and
    /// 0, in records and removed images) is a file this version reads, its
    /// spreads as written.
    #[test]
    fn the_version_7_fuzzing_seed_is_a_valid_state_file_with_its_spreads() {
        let bytes = include_bytes!("../../../fuzz/corpus/state/valid-v7-spread.state");
        assert_eq!(verify(bytes).unwrap(), 2);
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        fs::write(store.path(), bytes).unwrap();
        let now = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_000);
        let Loaded::Records { records, .. } = store.load(now, Duration::MAX) else {
            panic!("not loaded")
        };
        let dd = records.get("sha256:dd").unwrap().usual_break.unwrap();
        assert_eq!(
            (dd.duration(), dd.spread()),
            (Duration::from_secs(3600), Some(Duration::ZERO))
        );
        assert_eq!(records.get("sha256:aa").unwrap().usual_break, None);
        let removed: Vec<_> = records
            .removed_memory()
            .map(|(id, _, _, b)| (id.to_string(), b.map(|b| (b.duration(), b.spread()))))
            .collect::<std::collections::BTreeMap<_, _>>()
            .into_iter()
            .collect();
        assert_eq!(
            removed,
            [
                (
                    "sha256:bb".to_string(),
                    Some((Duration::from_secs(3600), Some(Duration::from_secs(1800))))
                ),
                ("sha256:cc".to_string(), Some((Duration::from_secs(7200), None))),
            ]
        );
    }

    /// The lines are written by hand for speed: byte for byte what
    /// `serde_json` writes for the same array, names needing escapes
    /// included, and in the order of the ids however they are spelled.
    #[test]
    fn record_lines_are_what_serde_json_writes_in_the_order_of_the_ids() {
        let mut records = varied();
        for id in [
            "b",
            "sha256:aaa",
            "t",
            "",
            "sha256:0123456789abcdef-1",
            "sha256:0123456789abcdef-0",
            "\u{7f}é",
            "q\"uote",
            "back\\slash",
            "new\nline\t\u{1}",
        ] {
            let r = history(&image(id, 1), t(0), t(1)).1;
            records = Records::from_map(
                records
                    .iter()
                    .map(|(i, r)| (i.clone(), r.clone()))
                    .chain([(id.to_string(), r)]),
            );
        }
        let mut expected = Vec::new();
        let mut ids: Vec<(&String, &Record)> = records.iter().collect();
        ids.sort_by(|a, b| a.0.cmp(b.0));
        for (id, r) in ids {
            let line = (
                id,
                to_unix_millis(r.first_seen),
                to_unix_millis(r.last_used),
                r.size,
                r.pinned,
                r.tags.iter().collect::<Vec<_>>(),
                r.digests.iter().collect::<Vec<_>>(),
                r.ever_used,
                r.usual_break.map_or(0, |b| b.duration().as_secs() * 1000),
                r.usual_break
                    .and_then(crate::records::Break::spread)
                    .map(|s| s.as_secs() * 1000),
            );
            serde_json::to_writer(&mut expected, &line).unwrap();
            expected.push(b'\n');
        }
        let bytes = encode(&records, t(5));
        let second_line = bytes.iter().enumerate().filter(|&(_, &b)| b == b'\n').nth(1).unwrap().0;
        assert_eq!(
            String::from_utf8_lossy(&bytes[second_line + 1..]),
            String::from_utf8_lossy(&expected)
        );
    }

    #[test]
    fn a_save_writes_what_encode_returns_across_several_chunks() {
        let names = |n: usize, kind: &str| vec![format!("registry.example.com/{kind}/{n}:{}", "x".repeat(100))];
        let map: HashMap<String, Record> = (0..2000)
            .map(|n| {
                let record = Record {
                    first_seen: t(n),
                    last_used: t(n + 1),
                    size: n,
                    pinned: n % 3 == 0,
                    tags: names(n as usize, "tag").into(),
                    digests: names(n as usize, "digest").into(),
                    from_history: true,
                    ever_used: n % 2 == 0,
                    usual_break: None,
                };
                (format!("sha256:{n:064x}"), record)
            })
            .collect();
        let records = Records::from_map(map);
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        store.save(&records, t(9000)).unwrap();
        let saved = fs::read(store.path()).unwrap();
        assert!(saved.len() > 2 * CHUNK_BYTES, "{} bytes", saved.len());
        assert_eq!(saved, encode(&records, t(9000)));
        let Loaded::Records { records: loaded, .. } = store.load(t(9000), Duration::MAX) else {
            panic!("not loaded")
        };
        assert_eq!(loaded, records);
    }

    #[test]
    fn version_2_payloads_that_are_not_a_state_do_not_verify() {
        let head = |n: usize| format!(r#"{{"saved_at":1700000005000,"records":{n}}}"#);
        let line = |id: &str| format!(r#"["{id}",1700000000000,1700000000000,10,false,["a:1"],[]]"#);
        let one = |record: &str| format!("{}\n{record}\n", head(1)).into_bytes();
        let ok = format!("{}\n{}\n{}\n", head(2), line("a"), line("b"));
        let mut not_utf8 = one(&line("a"));
        let at = not_utf8.len() - 8;
        not_utf8[at] = 0xff;
        let cases: [(&str, Vec<u8>); 14] = [
            ("no final newline", ok.trim_end().into()),
            (
                "an image twice",
                format!("{}\n{}\n{}\n", head(2), line("a"), line("a")).into(),
            ),
            ("a blank line", format!("{}\n\n{}\n", head(1), line("a")).into()),
            ("no head", format!("{}\n", line("a")).into()),
            ("no count", format!("{{\"saved_at\":1}}\n{}\n", line("a")).into()),
            (
                "fewer records than announced",
                format!("{}\n{}\n", head(2), line("a")).into(),
            ),
            (
                "more records than announced",
                format!("{}\n{}\n{}\n", head(1), line("a"), line("b")).into(),
            ),
            (
                "an absurd count",
                format!("{}\n{}\n", head(usize::MAX), line("a")).into(),
            ),
            (
                "an unknown head field",
                format!("{{\"saved_at\":1,\"records\":1,\"x\":2}}\n{}\n", line("a")).into(),
            ),
            ("a missing field", one("[\"a\",1,1,10,false,[]]")),
            ("an extra field", one("[\"a\",1,1,10,false,[],[],0]")),
            (
                "two records a line",
                format!("{}\n{}{}\n", head(2), line("a"), line("b")).into(),
            ),
            ("a negative size", one("[\"a\",1,1,-1,false,[],[]]")),
            ("not UTF-8", not_utf8),
        ];
        let wrap = |payload: &[u8]| {
            let mut file = format!(
                "imagegc-state v2 crc32={:08x} len={}\n",
                crc32fast::hash(payload),
                payload.len()
            )
            .into_bytes();
            file.extend_from_slice(payload);
            file
        };
        assert_eq!(verify(&wrap(ok.as_bytes())), Ok(2));
        for (name, payload) in cases {
            assert!(
                matches!(verify(&wrap(&payload)), Err(Corruption::Payload(_))),
                "{name}: {:?}",
                verify(&wrap(&payload))
            );
        }
    }

    #[test]
    fn missing_file_is_a_fresh_start() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            StateStore::new(dir.path()).load(t(0), Duration::ZERO),
            Loaded::Fresh
        ));
    }

    #[test]
    fn corrupt_files_are_set_aside() {
        let good = encode(&sample(), t(1));
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        let mut wrong_version = good.clone();
        wrong_version[15] = b'9';
        type Case = (&'static str, Vec<u8>, fn(&Corruption) -> bool);
        let cases: Vec<Case> = vec![
            ("empty", vec![], |c| *c == Corruption::Empty),
            ("garbage", b"\x00\xffhello".to_vec(), |c| *c == Corruption::BadHeader),
            ("truncated", good[..good.len() - 7].to_vec(), |c| {
                matches!(c, Corruption::Length { .. })
            }),
            ("checksum", flipped, |c| matches!(c, Corruption::Checksum { .. })),
            ("version", wrong_version, |c| matches!(c, Corruption::WrongVersion(_))),
            (
                "header only",
                b"imagegc-state v1 crc32=00000000 len=0\n".to_vec(),
                |c| matches!(c, Corruption::Payload(_)),
            ),
        ];
        for (name, bytes, expected) in cases {
            let dir = tempfile::tempdir().unwrap();
            let store = StateStore::new(dir.path());
            fs::write(store.path(), &bytes).unwrap();
            match store.load(t(2), Duration::ZERO) {
                Loaded::Corrupt { reason, moved_to } => {
                    assert!(expected(&reason), "{name}: {reason:?}");
                    let moved = moved_to.expect("moved aside");
                    assert!(moved.to_string_lossy().contains("records.state.corrupt-"));
                    assert_eq!(fs::read(&moved).unwrap(), bytes, "{name}: content kept for inspection");
                    assert!(!store.path().exists());
                }
                other => panic!("{name}: {other:?}"),
            }
        }
    }

    #[test]
    fn times_from_the_future_are_clamped() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        store.save(&sample(), t(1000)).unwrap();
        // The clock went back 1000 s: nothing may look used in the future.
        let Loaded::Records { records, saved_at, .. } = store.load(t(0) - Duration::from_secs(500), Duration::ZERO)
        else {
            panic!()
        };
        let now = t(0) - Duration::from_secs(500);
        assert_eq!(saved_at, now);
        assert!(records.iter().all(|(_, r)| r.last_used <= now && r.first_seen <= now));
    }

    #[test]
    fn whether_an_image_was_ever_used_survives_a_load_that_moves_last_use_forward() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        let mut records = sample();
        records.mark_used(["b"], t(50));
        store.save(&records, t(100)).unwrap();
        // Down for 1000 s with a 300 s grace: last used moves past first
        // seen, but "a" was never used, and says so.
        let Loaded::Records { records, .. } = store.load(t(1100), Duration::from_secs(300)) else {
            panic!()
        };
        assert!(records.get("a").unwrap().last_used > records.get("a").unwrap().first_seen);
        assert!(!records.ever_used("a"), "never used, whatever the times say");
        assert!(records.ever_used("b"));
    }

    #[test]
    fn a_version_2_file_reads_ever_used_from_its_stored_times_before_they_move() {
        let payload = concat!(
            "{\"saved_at\":1700000100000,\"records\":2}\n",
            r#"["a",1700000000000,1700000000000,10,false,["docker.io/library/a:latest"],[]]"#,
            "\n",
            r#"["b",1700000000000,1700000050000,20,false,["docker.io/library/b:latest"],[]]"#,
            "\n",
        );
        let records = load_written(2, payload);
        assert!(!records.ever_used("a"));
        assert!(records.ever_used("b"));
    }

    #[test]
    fn a_version_3_file_loads_with_no_break_known() {
        let payload = concat!(
            "{\"saved_at\":1700000100000,\"records\":1}\n",
            r#"["b",1700000000000,1700000050000,20,false,["docker.io/library/b:latest"],[],true]"#,
            "\n",
        );
        let records = load_written(3, payload);
        let b = records.get("b").unwrap();
        assert!(b.ever_used);
        assert_eq!(b.usual_break, None);
    }

    /// The records a file of `version` with `payload`, as an earlier
    /// imagegc wrote it, loads to (at t(1100), a 300 s grace).
    fn load_written(version: u32, payload: &str) -> Records {
        let header = format!(
            "imagegc-state v{version} crc32={:08x} len={:010}\n",
            crc32fast::hash(payload.as_bytes()),
            payload.len()
        );
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        fs::write(store.path(), format!("{header}{payload}")).unwrap();
        match store.load(t(1100), Duration::from_secs(300)) {
            Loaded::Records { records, .. } => records,
            _ => panic!("a version {version} file loads"),
        }
    }

    /// What imagegc learnt of an image it removed (its usual break) is
    /// saved with the records: pulled again after a restart, the image
    /// has it back.
    #[test]
    fn what_a_removed_image_taught_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        let job = image("job", 10);
        let mut records = Records::new();
        // A job run every 2000 s, then removed.
        for at in [0, 2000, 4000] {
            records.observe(
                std::slice::from_ref(&job),
                &[crate::testing::container_naming("c", &job.id)],
                t(at),
            );
            records.observe(std::slice::from_ref(&job), &[], t(at + 60));
        }
        let learnt = records.get(&job.id).unwrap().usual_break;
        // Two breaks of 2000 s: they do not stray, a periodic job.
        assert_eq!(
            learnt.map(crate::records::Break::duration),
            Some(Duration::from_secs(2000))
        );
        assert_eq!(learnt.and_then(crate::records::Break::spread), Some(Duration::ZERO));
        records.remove(&job.id, t(4100));
        store.save(&records, t(4100)).unwrap();
        let bytes = fs::read(store.path()).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains(&format!("\"removed\":[[\"{}\",", job.id)), "{text}");

        // The next process: the job's image comes back for its next run.
        let Loaded::Records { mut records, .. } = store.load(t(6000), Duration::from_secs(300)) else {
            panic!("not loaded")
        };
        assert_eq!(records.removed_memory().count(), 1);
        records.observe(
            std::slice::from_ref(&job),
            &[crate::testing::container_naming("c", &job.id)],
            t(6000),
        );
        let back = records.get(&job.id).unwrap();
        assert_eq!(back.usual_break, learnt, "what its uses taught came back");
        assert!(back.ever_used);
        assert_eq!(records.removed_memory().count(), 0);

        // A memory older than 30 days is not taken back.
        let mut records = Records::new();
        records.observe(
            std::slice::from_ref(&job),
            &[crate::testing::container_naming("c", &job.id)],
            t(0),
        );
        records.remove(&job.id, t(10));
        store.save(&records, t(10)).unwrap();
        let Loaded::Records { records, .. } = store.load(t(31 * 86_400), Duration::from_secs(300)) else {
            panic!("not loaded")
        };
        assert_eq!(records.removed_memory().count(), 0);
    }

    /// A version 4 file (before the memory of removed images) loads as it
    /// did, with nothing remembered of removed images.
    #[test]
    fn a_version_4_file_still_loads() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        let body = concat!(
            "{\"saved_at\":1700000005000,\"records\":1}\n",
            r#"["a",1700000000000,1700000000000,10,false,["docker.io/library/a:latest"],[],true,120000]"#,
            "\n",
        );
        let file = format!(
            "imagegc-state v4 crc32={:08x} len={:010}\n{body}",
            crc32fast::hash(body.as_bytes()),
            body.len()
        );
        fs::write(store.path(), file).unwrap();
        let Loaded::Records { records, .. } = store.load(t(10), Duration::MAX) else {
            panic!("not loaded")
        };
        assert_eq!(
            records
                .get("a")
                .unwrap()
                .usual_break
                .map(crate::records::Break::duration),
            Some(Duration::from_secs(120))
        );
        assert_eq!(records.removed_memory().count(), 0);
    }

    #[test]
    fn the_usual_break_survives_a_restart_and_the_downtime_is_no_break() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        let mut records = sample();
        // Used at 0 (first sight), at 100, then again after 2000 s unused.
        records.mark_used(["b"], t(100));
        records.mark_used(["b"], t(2100));
        assert_eq!(
            records
                .get("b")
                .unwrap()
                .usual_break
                .map(crate::records::Break::duration),
            Some(Duration::from_secs(2000))
        );
        store.save(&records, t(2100)).unwrap();
        // Down for a day with a 300 s grace: the unobserved day moves the
        // last use forward, so the next use after it is no break.
        let Loaded::Records { mut records, .. } = store.load(t(2100 + 86_400), Duration::from_secs(300)) else {
            panic!()
        };
        assert_eq!(
            records
                .get("b")
                .unwrap()
                .usual_break
                .map(crate::records::Break::duration),
            Some(Duration::from_secs(2000))
        );
        records.mark_used(["b"], t(2100 + 86_400));
        assert_eq!(
            records
                .get("b")
                .unwrap()
                .usual_break
                .map(crate::records::Break::duration),
            Some(Duration::from_secs(2000))
        );
    }

    #[test]
    fn unobserved_time_beyond_the_grace_does_not_count_as_unused() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        store.save(&sample(), t(100)).unwrap();
        // Down for 1000 s with a 300 s grace: last used moves 700 s forward.
        let Loaded::Records { records, .. } = store.load(t(1100), Duration::from_secs(300)) else {
            panic!()
        };
        assert_eq!(records.get("a").unwrap().last_used, t(700));
        assert_eq!(records.get("a").unwrap().first_seen, t(0));
        // A short gap changes nothing.
        let Loaded::Records { records, .. } = store.load(t(200), Duration::from_secs(300)) else {
            panic!()
        };
        assert_eq!(records.get("a").unwrap().last_used, t(0));
    }

    #[test]
    fn save_replaces_a_planted_symlink_instead_of_following_it() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        let state_dir = dir.path().join("state");
        fs::create_dir(&state_dir).unwrap();
        let store = StateStore::new(&state_dir);
        std::os::unix::fs::symlink(&victim, store.path()).unwrap();
        std::os::unix::fs::symlink(
            &victim,
            state_dir.join(format!(".{FILE_NAME}.tmp-{}", std::process::id())),
        )
        .unwrap();
        store.save(&sample(), t(1)).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        assert!(!fs::symlink_metadata(store.path()).unwrap().file_type().is_symlink());
        assert!(matches!(store.load(t(2), Duration::ZERO), Loaded::Records { .. }));
    }

    #[test]
    fn temporaries_of_writers_that_no_longer_run_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        // A child that has exited and been reaped: its pid runs no more.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let leftover = dir.path().join(format!(".{FILE_NAME}.tmp-{dead}"));
        fs::write(&leftover, b"half a state").unwrap();
        // pid 1 always runs: its file may belong to a live writer.
        let live = dir.path().join(format!(".{FILE_NAME}.tmp-1"));
        fs::write(&live, b"being written").unwrap();
        store.save(&sample(), t(0)).unwrap();
        assert!(!leftover.exists());
        assert!(live.exists());
        assert!(matches!(store.load(t(1), Duration::ZERO), Loaded::Records { .. }));
    }

    #[test]
    fn save_into_an_unwritable_place_is_an_error_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        fs::write(&file, b"").unwrap();
        // The state dir path is a regular file.
        let err = StateStore::new(&file).save(&sample(), t(0)).unwrap_err();
        assert!(err.to_string().contains(&file.display().to_string()), "{err}");
    }

    #[test]
    fn a_temporary_file_of_another_writer_with_our_pid_is_left_alone() {
        // Two pods, pid 1 in each, on one state directory: the other's
        // temporary file carries our pid. Saving must neither remove nor
        // reuse it (that tore the state file).
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        let theirs = dir.path().join(format!(".{FILE_NAME}.tmp-{}", std::process::id()));
        fs::write(&theirs, b"being written by another pid namespace").unwrap();
        store.save(&sample(), t(0)).unwrap();
        assert_eq!(fs::read(&theirs).unwrap(), b"being written by another pid namespace");
        assert!(matches!(store.load(t(1), Duration::ZERO), Loaded::Records { .. }));
    }

    #[test]
    fn a_second_lock_on_a_state_directory_is_refused_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let state_dir = dir.path().join("state");
        let first = StateStore::new(&state_dir).lock().unwrap();
        let err = StateStore::new(&state_dir).lock().unwrap_err();
        assert!(matches!(err, StateError::Locked { .. }), "{err}");
        assert!(err.to_string().contains(&state_dir.display().to_string()), "{err}");
        drop(first);
        StateStore::new(&state_dir).lock().unwrap();
    }

    #[test]
    fn a_read_only_store_neither_sets_aside_nor_saves() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path()).read_only();
        fs::write(store.path(), b"garbage").unwrap();
        assert!(matches!(
            store.load(t(0), Duration::ZERO),
            Loaded::Corrupt { moved_to: None, .. }
        ));
        assert_eq!(fs::read(store.path()).unwrap(), b"garbage");
        assert!(store.save(&sample(), t(0)).is_err());
        assert_eq!(fs::read(store.path()).unwrap(), b"garbage");
    }

    #[test]
    fn corrupt_files_set_aside_within_one_second_are_all_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path());
        let mut kept = Vec::new();
        for n in 0..3 {
            let bytes = format!("garbage {n}").into_bytes();
            fs::write(store.path(), &bytes).unwrap();
            let Loaded::Corrupt {
                moved_to: Some(moved), ..
            } = store.load(t(0), Duration::ZERO)
            else {
                panic!("not set aside")
            };
            kept.push((moved, bytes));
        }
        for (moved, bytes) in kept {
            assert_eq!(fs::read(&moved).unwrap(), bytes, "{}", moved.display());
        }
    }
}
