//! Opening the files imagegc reads and appends to (the state file, the
//! journal, the configuration) without trusting what sits at their path.
//!
//! Every open is `O_NONBLOCK|O_CLOEXEC` (a FIFO never blocks the open),
//! then `fstat` on the open descriptor: anything but a regular file (a FIFO,
//! a device such as `/dev/zero`, a socket, a directory) is refused before a
//! byte is read. Files in the state directory are also opened `O_NOFOLLOW`,
//! so a symbolic link planted there is refused rather than followed; the
//! configuration follows links (a Kubernetes ConfigMap is mounted as one).
//! Sizes are checked on the descriptor before reading, and every read is
//! bounded all the same (a file may grow between the check and the read).
//! This module owns no policy on what to do with a refusal: callers decide.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Whether a symbolic link at the path itself is followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// Refuse a link (files imagegc owns, in its private directory).
    Refuse,
    /// Follow links (files an operator provides, e.g. a mounted ConfigMap).
    Follow,
}

/// Opens `path` for reading, refusing anything but a regular file.
pub fn open_read(path: &Path, links: Links) -> io::Result<File> {
    let mut flags = libc::O_NONBLOCK | libc::O_CLOEXEC;
    if links == Links::Refuse {
        flags |= libc::O_NOFOLLOW;
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|err| explain_open(path, links, err))?;
    ensure_regular(&file)?;
    Ok(file)
}

/// Opens `path` for appending (and reading, so a caller can look at what
/// it ends with), creating it with `mode` when missing; refuses a link at
/// the path and anything but a regular file.
pub fn open_append(path: &Path, mode: u32) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|err| explain_open(path, Links::Refuse, err))?;
    ensure_regular(&file)?;
    Ok(file)
}

/// Reads a whole regular file of at most `max_bytes`; a larger one is an
/// error, found from its size before anything is read.
pub fn read_bounded(path: &Path, links: Links, max_bytes: u64) -> io::Result<Vec<u8>> {
    let file = open_read(path, links)?;
    let len = file.metadata()?.len();
    if len > max_bytes {
        return Err(too_large(len, max_bytes));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(max_bytes + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large(bytes.len() as u64, max_bytes));
    }
    Ok(bytes)
}

/// An error when the open descriptor is not a regular file, naming what it is.
pub fn ensure_regular(file: &File) -> io::Result<()> {
    let kind = file.metadata()?.file_type();
    let what = if kind.is_file() {
        return Ok(());
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a plain file"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("it is {what}, not a regular file; refusing to read or write it"),
    ))
}

fn explain_open(path: &Path, links: Links, err: io::Error) -> io::Error {
    // O_NOFOLLOW on a link fails with ELOOP, whose own text ("Too many
    // levels of symbolic links") misleads.
    if links == Links::Refuse
        && err.raw_os_error() == Some(libc::ELOOP)
        && std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
    {
        return io::Error::new(
            io::ErrorKind::InvalidInput,
            "it is a symbolic link; refusing to follow it",
        );
    }
    err
}

/// Replaces the file at `path` with `bytes`: written to a private temporary
/// file beside it (mode 0600, never through a link planted at its name)
/// and renamed over it, so a reader finds the old content or the new one,
/// whole. `durable`: the file and its directory are fsynced before this
/// returns, so the new content survives a power loss.
pub fn replace(path: &Path, bytes: &[u8], durable: bool) -> io::Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        file.write_all(bytes)?;
        if durable {
            file.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        if durable { sync_parent(path) } else { Ok(()) }
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Makes a rename or a removal in `path`'s directory durable.
pub fn sync_parent(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) => File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

fn too_large(len: u64, max: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("it is {len} bytes, larger than the {max} this file may be"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;

    fn mkfifo(path: &Path) {
        let c = CString::new(path.as_os_str().as_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn a_fifo_is_refused_without_blocking_for_reading_and_appending() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        mkfifo(&fifo);
        for links in [Links::Refuse, Links::Follow] {
            let err = read_bounded(&fifo, links, 100).unwrap_err();
            assert!(err.to_string().contains("a FIFO, not a regular file"), "{err}");
        }
        // No reader: the non-blocking open for writing fails at once.
        assert!(open_append(&fifo, 0o600).is_err());
    }

    #[test]
    fn a_device_is_refused_before_anything_is_read() {
        let err = read_bounded(Path::new("/dev/zero"), Links::Follow, 100).unwrap_err();
        assert!(err.to_string().contains("a character device"), "{err}");
    }

    #[test]
    fn a_link_is_followed_only_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"hello").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert_eq!(read_bounded(&link, Links::Follow, 100).unwrap(), b"hello");
        let err = read_bounded(&link, Links::Refuse, 100).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        let err = open_append(&link, 0o600).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert_eq!(std::fs::read(&target).unwrap(), b"hello");
    }

    #[test]
    fn a_file_over_the_bound_is_refused_from_its_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse");
        // 2 GiB that take no disk and would take 2 GiB of memory to read.
        File::create(&path).unwrap().set_len(2 << 30).unwrap();
        let err = read_bounded(&path, Links::Refuse, 1 << 30).unwrap_err();
        assert!(err.to_string().contains("2147483648 bytes"), "{err}");
    }
}
