//! Another writer on the image filesystem: free space never holds still.

use super::*;

/// Another writer on the image filesystem, on a thread of its own: it
/// writes a file in chunks up to a drawn size, then truncates or deletes it
/// (a container's log rotated away, an emptyDir emptied), and again, with a
/// few milliseconds between any two steps, so that free space moves between
/// any two readings of the daemon. Stopped and joined when dropped (a
/// panicking test included), so it never writes under an unmount.
pub(crate) struct FsWriter {
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) thread: Option<JoinHandle<WriterStats>>,
}

/// What the other writer did.
#[derive(Debug, Default)]
pub(crate) struct WriterStats {
    pub(crate) writes: u64,
    pub(crate) bytes: u64,
    pub(crate) resets: u64,
    /// Steps after which the filesystem's available space differed from
    /// the reading after the step before.
    pub(crate) moves: u64,
    /// Why it stopped early, when it did.
    pub(crate) error: Option<String>,
}

impl FsWriter {
    /// Starts writing in `dir` (created, on the filesystem to keep
    /// moving), with choices drawn from `seed`.
    pub(crate) fn start(dir: &Path, seed: u64) -> FsWriter {
        fs::create_dir_all(dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let stop = Arc::new(AtomicBool::new(false));
        let dir = dir.to_path_buf();
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("chaos-writer".to_string())
            .spawn(move || {
                let mut stats = WriterStats::default();
                if let Err(e) = Self::write(&dir, seed, &stopping, &mut stats) {
                    stats.error = Some(e.to_string());
                }
                let _ = fs::remove_file(dir.join("container.log"));
                stats
            })
            .expect("starting the other writer's thread");
        FsWriter {
            stop,
            thread: Some(thread),
        }
    }

    pub(crate) fn write(dir: &Path, seed: u64, stop: &AtomicBool, stats: &mut WriterStats) -> std::io::Result<()> {
        use std::io::Write;
        let mut rng = XorShift::new(seed ^ 0x0077_7269_7465_7200);
        let path = dir.join("container.log");
        let chunk = vec![b'.'; WRITER_CHUNK.1 as usize];
        let mut last = statvfs(dir).available_bytes;
        let mut step = |rng: &mut XorShift, stats: &mut WriterStats| {
            let now = statvfs(dir).available_bytes;
            if now != last {
                stats.moves += 1;
            }
            last = now;
            std::thread::sleep(Duration::from_millis(rng.between(WRITER_PAUSE_MS.0, WRITER_PAUSE_MS.1)));
        };
        while !stop.load(Ordering::Relaxed) {
            let size = rng.between(WRITER_FILE.0, WRITER_FILE.1);
            let mut file = fs::OpenOptions::new().create(true).append(true).open(&path)?;
            let mut written = 0;
            while written < size && !stop.load(Ordering::Relaxed) {
                let n = rng.between(WRITER_CHUNK.0, WRITER_CHUNK.1).min(size - written);
                file.write_all(&chunk[..n as usize])?;
                written += n;
                stats.writes += 1;
                stats.bytes += n;
                step(&mut rng, stats);
            }
            if rng.chance(50) {
                file.set_len(0)?;
            } else {
                drop(file);
                fs::remove_file(&path)?;
            }
            stats.resets += 1;
            step(&mut rng, stats);
        }
        Ok(())
    }

    /// Stops the writer and says what it did.
    pub(crate) fn stop(mut self) -> WriterStats {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().expect("the writer runs until stopped");
        thread.join().expect("the other writer panicked")
    }
}

impl Drop for FsWriter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
