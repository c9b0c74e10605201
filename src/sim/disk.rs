//! [`SimDisk`]: an image filesystem in memory, measured through
//! [`FsProbe`] like a real one. The engine's fake node and the test kit's
//! fake runtime both measure this one disk, with
//! the ways real filesystems surprise a reader: space that comes back a
//! moment after a removal (containerd 2.x deletes in the background),
//! something else writing between two readings, a scripted series of
//! readings, a failing `statvfs`, another filesystem mounted below. The
//! invariant harness runs it on tokio's paused clock: space back at an
//! instant, another writer whose bytes are a function of time.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::fs::{FsError, FsProbe, FsStats};

/// The bytes another writer holds, by the time since it started (see
/// [`SimDisk::held_by_other`]).
type OtherWriter = Arc<dyn Fn(Duration) -> u64 + Send + Sync>;

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
    /// Paths under which another filesystem is mounted, with its capacity
    /// and available bytes (see [`SimDisk::other_filesystem_at`]).
    elsewhere: Vec<(PathBuf, u64, u64)>,
    /// What an image's removal gives back in the background, on top of
    /// what it [occupied](SimDisk::occupy) (see [`SimDisk::frees_late`]).
    late: HashMap<String, u64>,
    /// Bytes coming back, after how many more readings.
    coming: Option<(u32, u64)>,
    /// Bytes something else writes before each reading.
    writer: u64,
    /// Available bytes read in turn, the last repeated (see
    /// [`SimDisk::script_readings`]).
    readings: VecDeque<u64>,
    /// `statvfs` fails while set.
    failing: bool,
    /// Bytes [written](SimDisk::write) beyond the available space: a
    /// filesystem fuller than full, which what comes back pays first.
    overdraft: u64,
    /// Bytes coming back at an instant of tokio's clock (see
    /// [`SimDisk::release_at`]).
    due: Vec<(Instant, u64)>,
    /// Another writer, and when it started (see [`SimDisk::held_by_other`]).
    other: Option<(Instant, OtherWriter)>,
}

impl DiskState {
    /// `bytes` more are available, up to the capacity; an overdraft is
    /// paid first.
    fn free(&mut self, bytes: u64) {
        let paid = bytes.min(self.overdraft);
        self.overdraft -= paid;
        self.available = self.available.saturating_add(bytes - paid).min(self.capacity);
    }

    /// Brings back what is due by `now`.
    fn settle(&mut self, now: Instant) {
        let mut back = 0u64;
        self.due.retain(|&(at, bytes)| {
            let due = at <= now;
            if due {
                back = back.saturating_add(bytes);
            }
            !due
        });
        self.free(back);
    }
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

    /// The image is written: it occupies `bytes`, which are no longer
    /// available (past the capacity, the readings stay at none available
    /// until as much has come back).
    pub fn write(&self, image_id: &str, bytes: u64) {
        let mut state = self.lock();
        let taken = bytes.min(state.available);
        state.available -= taken;
        state.overdraft = state.overdraft.saturating_add(bytes - taken);
        *state.on_disk.entry(image_id.to_string()).or_default() += bytes;
    }

    /// statvfs answers a capacity of 0 (the real probe turns it into
    /// [`FsError::ZeroCapacity`]).
    pub fn report_zero_capacity(&self) {
        self.lock().zero_capacity = true;
    }

    /// Another filesystem (roomy, empty) is mounted at `path`: a path under
    /// it is measured there, with another filesystem id.
    pub fn other_filesystem_at(&self, path: impl AsRef<Path>) {
        self.other_filesystem_sized(path, OTHER_FILESYSTEM_BYTES, OTHER_FILESYSTEM_BYTES);
    }

    /// Another filesystem of `capacity` bytes, `available` of them
    /// available, is mounted at `path` (a split store's container
    /// filesystem): removing images never changes it.
    pub fn other_filesystem_sized(&self, path: impl AsRef<Path>, capacity: u64, available: u64) {
        let mut state = self.lock();
        let path = path.as_ref().to_path_buf();
        state.elsewhere.retain(|(p, _, _)| *p != path);
        state.elsewhere.push((path, capacity, available));
    }

    /// The image's removal gives `bytes` back in the background: not at
    /// the first reading after it, at the one after that. Removals close
    /// together add up (containerd 2.x frees what several removals left
    /// behind at once).
    pub fn frees_late(&self, image_id: &str, bytes: u64) {
        self.lock().late.insert(image_id.to_string(), bytes);
    }

    /// Something else writes `bytes` before each reading (a container's
    /// log, an emptyDir, a pull): free space never holds still.
    pub fn writer(&self, bytes: u64) {
        self.lock().writer = bytes;
    }

    /// The readings answer these available bytes in turn, the last one
    /// repeated, whatever is removed (a filesystem whose space comes back
    /// on a script).
    pub fn script_readings(&self, available: impl IntoIterator<Item = u64>) {
        self.lock().readings = available.into_iter().collect();
    }

    /// `statvfs` fails while `failing` is set.
    pub fn fail(&self, failing: bool) {
        self.lock().failing = failing;
    }

    /// How many times the filesystem was measured.
    pub fn measurements(&self) -> usize {
        self.lock().measurements
    }

    /// The image is gone: what it [occupied](Self::occupy) is available
    /// again; nothing if it occupied nothing. What it [frees
    /// late](Self::frees_late) comes back a reading later.
    pub fn release(&self, image_id: &str) {
        let mut state = self.lock();
        let freed = state.on_disk.remove(image_id).unwrap_or(0);
        state.free(freed);
        if let Some(bytes) = state.late.remove(image_id) {
            let still = state.coming.map_or(0, |(_, b)| b);
            state.coming = Some((1, still.saturating_add(bytes)));
        }
    }

    /// The image is gone; what it occupied comes back at `at` (tokio's
    /// clock), for the first reading at or after it.
    pub fn release_at(&self, image_id: &str, at: Instant) {
        let mut state = self.lock();
        let bytes = state.on_disk.remove(image_id).unwrap_or(0);
        state.due.push((at, bytes));
    }

    /// Something else holds `held(time since now)` bytes at each reading,
    /// on tokio's clock: a log that grows and is rotated, an emptyDir
    /// filled and emptied.
    pub fn held_by_other(&self, held: impl Fn(Duration) -> u64 + Send + Sync + 'static) {
        self.lock().other = Some((Instant::now(), Arc::new(held)));
    }

    /// `bytes` more are available, up to the capacity.
    pub fn free(&self, bytes: u64) {
        self.lock().free(bytes);
    }
}

impl FsProbe for SimDisk {
    fn stats(&self, path: &Path) -> Result<FsStats, FsError> {
        let mut state = self.lock();
        let state = &mut *state;
        state.measurements += 1;
        if let Some(&(_, capacity, available)) = state.elsewhere.iter().find(|(other, _, _)| path.starts_with(other)) {
            return Ok(FsStats {
                capacity_bytes: capacity,
                available_bytes: available,
                free_bytes: available,
                filesystem_id: OTHER_FILESYSTEM_ID,
                ..Default::default()
            });
        }
        if let Some(&last) = state.readings.back() {
            let available = if state.readings.len() > 1 {
                state.readings.pop_front().unwrap_or(last)
            } else {
                last
            };
            return Ok(FsStats {
                capacity_bytes: state.capacity,
                available_bytes: available,
                free_bytes: available,
                filesystem_id: SIM_FILESYSTEM_ID,
                ..Default::default()
            });
        }
        let now = Instant::now();
        state.settle(now);
        // Read once as they were, then with the bytes still coming.
        match state.coming {
            Some((0, bytes)) => {
                state.free(bytes);
                state.coming = None;
            }
            Some((left, bytes)) => state.coming = Some((left - 1, bytes)),
            None => {}
        }
        state.available = state.available.saturating_sub(state.writer);
        if state.failing {
            return Err(FsError::Io {
                path: path.display().to_string(),
                source: std::io::Error::other("injected"),
            });
        }
        if state.zero_capacity || state.capacity == 0 {
            return Err(FsError::ZeroCapacity {
                path: path.display().to_string(),
            });
        }
        let held_by_other = state
            .other
            .as_ref()
            .map_or(0, |(since, held)| held(now.duration_since(*since)));
        let available = state.available.saturating_sub(held_by_other);
        Ok(FsStats {
            capacity_bytes: state.capacity,
            available_bytes: available,
            free_bytes: available,
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

    #[test]
    fn space_freed_in_the_background_comes_back_one_reading_late_and_adds_up() {
        let disk = SimDisk::new(1_000, 0);
        let here = Path::new("/var/lib/containerd");
        for (image, late) in [("a", 100), ("b", 50)] {
            disk.occupy(image, 10);
            disk.frees_late(image, late);
        }
        disk.release("a");
        disk.release("b");
        let available = |disk: &SimDisk| disk.stats(here).unwrap().available_bytes;
        assert_eq!(available(&disk), 20, "what each occupied comes back at once");
        assert_eq!(available(&disk), 170, "what each freed late, together, a reading later");
        assert_eq!(available(&disk), 170);
        disk.writer(5);
        assert_eq!(available(&disk), 165, "something else writes before each reading");
        assert_eq!(available(&disk), 160);
    }

    #[tokio::test(start_paused = true)]
    async fn on_tokios_clock_space_comes_back_at_its_instant_and_another_writer_holds_bytes_by_time() {
        let disk = SimDisk::new(1_000, 1_000);
        let here = Path::new("/var/lib/containerd");
        let available = |disk: &SimDisk| disk.stats(here).unwrap().available_bytes;
        disk.write("a", 700);
        disk.write("b", 500);
        assert_eq!(available(&disk), 0, "written past the capacity");
        disk.release("b");
        assert_eq!(available(&disk), 300, "what came back paid the overdraft first");
        let back = Instant::now() + Duration::from_millis(100);
        disk.release_at("a", back);
        assert_eq!(available(&disk), 300, "not back before its instant");
        tokio::time::sleep_until(back).await;
        assert_eq!(available(&disk), 1_000, "back at its instant");
        disk.held_by_other(|since| (since.as_millis() as u64 / 10).min(1_000));
        assert_eq!(available(&disk), 1_000);
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(available(&disk), 975, "another writer's bytes, a function of time");
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(available(&disk), 0, "never below none available");
        assert_eq!(disk.available(), 1_000, "and nothing lost once it lets go");
    }

    #[test]
    fn scripted_readings_answer_in_turn_and_a_failing_statvfs_errs() {
        let disk = SimDisk::new(1_000, 0);
        let here = Path::new("/var/lib/containerd");
        disk.script_readings([300, 200]);
        let readings: Vec<u64> = (0..3).map(|_| disk.stats(here).unwrap().available_bytes).collect();
        assert_eq!(readings, [300, 200, 200], "the last one repeated");
        disk.other_filesystem_sized("/containers", 500, 50);
        let there = disk.stats(Path::new("/containers/x")).unwrap();
        assert_eq!((there.capacity_bytes, there.available_bytes), (500, 50));
        disk.script_readings([]);
        disk.fail(true);
        assert!(matches!(disk.stats(here), Err(FsError::Io { .. })));
        disk.fail(false);
        assert_eq!(disk.stats(here).unwrap().available_bytes, 0);
    }
}
