//! Capacity, available bytes and inodes of the image filesystem, measured
//! with `statvfs(2)`, and the kubelet's threshold arithmetic on them.
//!
//! The collector measures the real filesystem before and after every
//! removal: that is how it stops exactly at the low threshold even though
//! the runtime's image sizes double-count shared layers. [`FsProbe`] is the
//! seam tests use to simulate a disk.

use std::io;
use std::path::Path;

/// One measurement of the image filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct FsStats {
    /// Total size of the filesystem in bytes (`f_blocks * f_frsize`).
    pub capacity_bytes: u64,
    /// Bytes available to unprivileged users (`f_bavail`), as the kubelet reads it.
    pub available_bytes: u64,
    /// Free bytes including reserved blocks (`f_bfree`); `df` reports
    /// capacity minus this as used.
    pub free_bytes: u64,
    /// Total inodes (`f_files`); 0 when the filesystem does not count inodes.
    pub inodes_total: u64,
    /// Free inodes (`f_ffree`).
    pub inodes_free: u64,
    /// The filesystem's id (`f_fsid`): equal for two paths on the same
    /// filesystem (bind mounts included), 0 when the filesystem gives none.
    #[serde(skip)]
    pub filesystem_id: u64,
}

/// A filesystem that reports zero capacity cannot be reasoned about.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// `statvfs(2)` failed (the path is missing or not reachable).
    #[error("cannot measure the image filesystem at {path}: {source}")]
    Io {
        /// The path measured: `gc.image_fs_path` or the runtime's mount point.
        path: String,
        /// The error `statvfs(2)` returned.
        source: io::Error,
    },
    /// The filesystem reports no capacity (a pseudo filesystem, or a path
    /// that is not the image filesystem).
    #[error("the image filesystem at {path} reports a capacity of 0 bytes")]
    ZeroCapacity {
        /// The path measured.
        path: String,
    },
}

impl FsStats {
    /// Available bytes, clamped to the capacity (the kubelet does the same).
    pub fn available(&self) -> u64 {
        self.available_bytes.min(self.capacity_bytes)
    }

    /// Used bytes as `df` reports them: capacity minus free (reserved
    /// blocks count as free here, while usage and thresholds use available).
    pub fn used_bytes(&self) -> u64 {
        self.capacity_bytes - self.free_bytes.clamp(self.available(), self.capacity_bytes)
    }

    /// Usage in percent as the kubelet computes it: `100 - available*100/capacity`
    /// in integer arithmetic, which rounds usage up. 0 when capacity is 0.
    pub fn usage_percent(&self) -> u64 {
        if self.capacity_bytes == 0 {
            return 0;
        }
        100 - (self.available() as u128 * 100 / self.capacity_bytes as u128) as u64
    }

    /// Usage as a ratio in 0..=1, for metrics.
    pub fn usage_ratio(&self) -> f64 {
        if self.capacity_bytes == 0 {
            return 0.0;
        }
        (self.capacity_bytes - self.available()) as f64 / self.capacity_bytes as f64
    }

    /// Bytes to free so that usage is at most `low` percent: the kubelet's
    /// `capacity*(100-low)/100 - available`, never negative.
    pub fn bytes_to_free(&self, low_percent: u8) -> u64 {
        let target_available = self.capacity_bytes as u128 * (100 - low_percent.min(100) as u128) / 100;
        target_available.saturating_sub(self.available() as u128) as u64
    }

    /// Inode usage in percent (rounded up like bytes); `None` when the
    /// filesystem has no inode accounting (e.g. btrfs reports 0 inodes).
    pub fn inode_usage_percent(&self) -> Option<u64> {
        if self.inodes_total == 0 {
            return None;
        }
        let free = self.inodes_free.min(self.inodes_total);
        Some(100 - (free as u128 * 100 / self.inodes_total as u128) as u64)
    }

    /// Inodes to free so that inode usage is at most `low` percent.
    pub fn inodes_to_free(&self, low_percent: u8) -> u64 {
        if self.inodes_total == 0 {
            return 0;
        }
        let target_free = self.inodes_total as u128 * (100 - low_percent.min(100) as u128) / 100;
        target_free.saturating_sub(self.inodes_free.min(self.inodes_total) as u128) as u64
    }
}

/// Measures a filesystem. [`Statvfs`] is the real one.
pub trait FsProbe: Send + Sync {
    /// Measures the filesystem that holds `path`. A zero capacity is
    /// [`FsError::ZeroCapacity`].
    fn stats(&self, path: &Path) -> Result<FsStats, FsError>;
}

/// The real filesystem, through `statvfs(2)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Statvfs;

impl FsProbe for Statvfs {
    fn stats(&self, path: &Path) -> Result<FsStats, FsError> {
        let stats = statvfs(path).map_err(|source| FsError::Io {
            path: path.display().to_string(),
            source,
        })?;
        if stats.capacity_bytes == 0 {
            return Err(FsError::ZeroCapacity {
                path: path.display().to_string(),
            });
        }
        Ok(stats)
    }
}

/// Calls `statvfs(2)` on `path`.
// The field types differ between platforms (u32 on some 32-bit targets).
#[allow(clippy::unnecessary_cast)]
pub fn statvfs(path: &Path) -> io::Result<FsStats> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    let mut buf = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: c_path is a valid NUL-terminated string and buf points to
    // writable memory of the right size; statvfs fills it on success.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), buf.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so buf is initialised.
    let s = unsafe { buf.assume_init() };
    let frsize = if s.f_frsize > 0 { s.f_frsize } else { s.f_bsize } as u64;
    Ok(FsStats {
        capacity_bytes: (s.f_blocks as u64).saturating_mul(frsize),
        available_bytes: (s.f_bavail as u64).saturating_mul(frsize),
        free_bytes: (s.f_bfree as u64).saturating_mul(frsize),
        inodes_total: s.f_files as u64,
        inodes_free: s.f_ffree as u64,
        filesystem_id: s.f_fsid as u64,
    })
}

impl FsStats {
    /// Whether `self` and `other` were measured on different filesystems;
    /// `None` when either gives no filesystem id.
    pub fn other_filesystem_than(&self, other: &FsStats) -> Option<bool> {
        (self.filesystem_id != 0 && other.filesystem_id != 0).then_some(self.filesystem_id != other.filesystem_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fs(capacity: u64, available: u64) -> FsStats {
        FsStats {
            capacity_bytes: capacity,
            available_bytes: available,
            ..Default::default()
        }
    }

    #[test]
    fn usage_rounds_up_like_the_kubelet() {
        assert_eq!(fs(1000, 600).usage_percent(), 40);
        assert_eq!(fs(1000, 50).usage_percent(), 95);
        assert_eq!(fs(1000, 999).usage_percent(), 1);
        assert_eq!(fs(1000, 1000).usage_percent(), 0);
        assert_eq!(fs(1000, 0).usage_percent(), 100);
        // Available beyond capacity is clamped.
        assert_eq!(fs(1000, 5000).usage_percent(), 0);
    }

    #[test]
    fn bytes_to_free_matches_the_kubelet_formula() {
        // capacity 1000, available 50, low 80: 1000*20/100 - 50 = 150.
        assert_eq!(fs(1000, 50).bytes_to_free(80), 150);
        assert_eq!(fs(1000, 600).bytes_to_free(80), 0);
        assert_eq!(fs(1000, 0).bytes_to_free(0), 1000);
    }

    #[test]
    fn inode_usage() {
        let s = FsStats {
            capacity_bytes: 1,
            available_bytes: 1,
            inodes_total: 1000,
            inodes_free: 100,
            ..Default::default()
        };
        assert_eq!(s.inode_usage_percent(), Some(90));
        assert_eq!(s.inodes_to_free(80), 100);
        assert_eq!(FsStats::default().inode_usage_percent(), None);
    }

    #[test]
    fn statvfs_measures_a_real_directory() {
        let s = Statvfs.stats(Path::new("/")).unwrap();
        assert!(s.capacity_bytes > 0);
        assert!(s.available_bytes <= s.capacity_bytes);
        let err = Statvfs.stats(Path::new("/nonexistent/imagegc")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/imagegc"));
    }
}
