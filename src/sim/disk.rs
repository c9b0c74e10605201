//! [`SimDisk`]: an image filesystem in memory, measured through
//! [`FsProbe`] like a real one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::fs::{FsError, FsProbe, FsStats};

/// A simulated image filesystem: its capacity, its available bytes, and
/// what each image really occupies (which need not be the size the runtime
/// reports for it, as with shared layers). Clones share one disk, so a test
/// keeps one to look at and change while the collector measures another.
#[derive(Clone, Default)]
pub struct SimDisk(Arc<Mutex<DiskState>>);

#[derive(Default)]
struct DiskState {
    capacity: u64,
    available: u64,
    on_disk: HashMap<String, u64>,
    zero_capacity: bool,
    measurements: usize,
    /// Paths under which another filesystem is mounted (see
    /// [`SimDisk::other_filesystem_at`]).
    elsewhere: Vec<PathBuf>,
}

/// The simulated disk's filesystem id, and that of the filesystem mounted
/// elsewhere.
const SIM_FILESYSTEM_ID: u64 = 1;
const OTHER_FILESYSTEM_ID: u64 = 2;

/// The size of the filesystem mounted elsewhere, all of it available: 1 TiB.
const OTHER_FILESYSTEM_BYTES: u64 = 1 << 40;

impl SimDisk {
    /// A disk of `capacity` bytes with `available` of them available.
    pub fn new(capacity: u64, available: u64) -> Self {
        let disk = SimDisk::default();
        disk.set(capacity, available);
        disk
    }

    fn lock(&self) -> MutexGuard<'_, DiskState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the capacity and the available bytes.
    pub fn set(&self, capacity: u64, available: u64) {
        let mut state = self.lock();
        state.capacity = capacity;
        state.available = available;
    }

    /// Sets the available bytes (something else filled or freed the disk).
    pub fn set_available(&self, available: u64) {
        self.lock().available = available;
    }

    /// The available bytes now.
    pub fn available(&self) -> u64 {
        self.lock().available
    }

    /// The image really occupies `bytes` (whatever size the runtime reports).
    pub fn occupy(&self, image_id: &str, bytes: u64) {
        self.lock().on_disk.insert(image_id.to_string(), bytes);
    }

    /// statvfs answers a capacity of 0 (the real probe turns it into
    /// [`FsError::ZeroCapacity`]).
    pub fn report_zero_capacity(&self) {
        self.lock().zero_capacity = true;
    }

    /// Another filesystem (roomy, empty) is mounted at `path`: a path under
    /// it is measured there, with another filesystem id.
    pub fn other_filesystem_at(&self, path: impl AsRef<Path>) {
        self.lock().elsewhere.push(path.as_ref().to_path_buf());
    }

    /// How many times the filesystem was measured.
    pub fn measurements(&self) -> usize {
        self.lock().measurements
    }

    /// The image is gone: what it [occupied](Self::occupy) is available
    /// again; nothing if it occupied nothing.
    pub fn release(&self, image_id: &str) {
        let freed = self.lock().on_disk.remove(image_id).unwrap_or(0);
        self.free(freed);
    }

    /// `bytes` more are available, up to the capacity.
    pub fn free(&self, bytes: u64) {
        let mut state = self.lock();
        state.available = state.available.saturating_add(bytes).min(state.capacity);
    }
}

impl FsProbe for SimDisk {
    fn stats(&self, path: &Path) -> Result<FsStats, FsError> {
        let mut state = self.lock();
        state.measurements += 1;
        if state.elsewhere.iter().any(|other| path.starts_with(other)) {
            return Ok(FsStats {
                capacity_bytes: OTHER_FILESYSTEM_BYTES,
                available_bytes: OTHER_FILESYSTEM_BYTES,
                free_bytes: OTHER_FILESYSTEM_BYTES,
                filesystem_id: OTHER_FILESYSTEM_ID,
                ..Default::default()
            });
        }
        if state.zero_capacity || state.capacity == 0 {
            return Err(FsError::ZeroCapacity {
                path: path.display().to_string(),
            });
        }
        Ok(FsStats {
            capacity_bytes: state.capacity,
            available_bytes: state.available,
            free_bytes: state.available,
            filesystem_id: SIM_FILESYSTEM_ID,
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_released_image_gives_back_what_it_occupied_up_to_the_capacity() {
        let disk = SimDisk::new(1_000, 100);
        disk.occupy("a", 300);
        disk.occupy("b", 900);
        disk.release("a");
        assert_eq!(disk.available(), 400);
        disk.release("a");
        assert_eq!(disk.available(), 400, "an image is released once");
        disk.release("b");
        assert_eq!(disk.available(), 1_000, "never more than the capacity");
    }

    #[test]
    fn a_path_under_another_mount_is_measured_on_that_filesystem() {
        let disk = SimDisk::new(1_000, 100);
        disk.other_filesystem_at("/elsewhere");
        let here = disk.stats(Path::new("/var/lib/containerd")).unwrap();
        let there = disk.stats(Path::new("/elsewhere/images")).unwrap();
        assert_eq!((here.capacity_bytes, here.available_bytes), (1_000, 100));
        assert_ne!(here.filesystem_id, there.filesystem_id);
        assert_eq!(disk.measurements(), 2);
        disk.report_zero_capacity();
        assert!(matches!(
            disk.stats(Path::new("/var/lib/containerd")),
            Err(FsError::ZeroCapacity { .. })
        ));
    }
}
