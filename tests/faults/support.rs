//! What the fault tests share beyond `imagegc_testkit` (image and
//! container builders, records, the simulated image filesystem and
//! `metric`, re-exported here): a collector wired to the simulated
//! filesystem, the fake runtime served on its own thread (for tests that run
//! the `imagegc` binary against it), tmpfs mounts that unmount themselves,
//! and re-running this test binary as a child process.

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use imagegc::config::Config;
use imagegc::cri::{CriClient, Image, Runtime, connect};
use imagegc::engine::{Collector, CycleReport, Settings};
use imagegc::outputs::metrics::Metrics;
pub use imagegc::sim::SimDisk;
use imagegc::store::journal::Journal;
use imagegc::time::Clock;
pub use imagegc_testkit::fake::DiskEffects;
use imagegc_testkit::fake::{FakeRuntime, FakeServer};
pub use imagegc_testkit::{container_using, history, image, image_id, metric, records};

/// Long enough for a slow CI machine, short enough to notice a hang.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The configuration the library-level tests start from: the kubelet's
/// 90/80 thresholds, no minimum age, the state in `state_dir`, and the image
/// filesystem at a fixed path the [`SimDisk`] answers for.
pub fn config(state_dir: &Path) -> Config {
    let mut config = Config::default();
    config.gc.high_threshold_percent = 90;
    config.gc.low_threshold_percent = 80;
    config.gc.min_age = Duration::ZERO;
    config.gc.image_fs_path = Some(PathBuf::from("/sim/imagefs"));
    config.state.dir = state_dir.to_path_buf();
    config.metrics.listen = None;
    // No kubelet eviction line: each removal is measured (a test of the
    // walk past the line sets one).
    config.eviction_imagefs_available = Some(imagegc::config::EvictionThreshold::Bytes(0));
    config
}

/// A collector over `runtime` and `disk`, with the clock started now.
pub fn collector<R: Runtime>(runtime: R, disk: &SimDisk, config: &Config) -> Collector<R> {
    collector_with_clock(runtime, disk, config, Clock::start())
}

pub fn collector_with_clock<R: Runtime>(runtime: R, disk: &SimDisk, config: &Config, clock: Clock) -> Collector<R> {
    Collector::load(
        runtime,
        Settings::from(config),
        &config.state.dir,
        Arc::new(disk.clone()),
        Arc::new(Metrics::new()),
        clock,
    )
}

/// The fake runtime served over gRPC on a socket of its own, and a
/// collector talking to it with the real client, on a [`SimDisk`]: the bed
/// of the fault tests that run cycles. The server lives as long as it does.
pub struct Bed {
    pub fake: FakeRuntime,
    pub disk: SimDisk,
    pub dir: tempfile::TempDir,
    _server: FakeServer,
    pub collector: Collector<CriClient>,
}

impl Bed {
    /// `fake`, served, and a collector over it on `disk` with [`config`]
    /// changed by `configure`, each call bounded by `timeout`.
    pub async fn serve(
        fake: FakeRuntime,
        disk: SimDisk,
        timeout: Duration,
        configure: impl FnOnce(&mut Config),
    ) -> Bed {
        let dir = tempfile::tempdir().unwrap();
        let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
        let mut config = config(&dir.path().join("state"));
        config.runtime.timeout = timeout;
        configure(&mut config);
        let client = connect(&server.endpoint(), timeout).unwrap();
        let collector = collector(client, &disk, &config);
        Bed {
            fake,
            disk,
            dir,
            _server: server,
            collector,
        }
    }

    /// A fake runtime listing `images`, each occupying its size on `disk`
    /// and freeing it when removed, served (see [`Bed::serve`]).
    pub async fn start(images: &[Image], disk: SimDisk, timeout: Duration, configure: impl FnOnce(&mut Config)) -> Bed {
        let fake = FakeRuntime::new();
        for image in images {
            disk.occupy(&image.id, image.size);
            fake.add_image(image.clone());
        }
        fake.on_remove(Some(disk.free_on_remove()));
        Bed::serve(fake, disk, timeout, configure).await
    }

    /// [`Bed::start`] on a full 1000-byte disk, with the default settings.
    pub async fn full(images: &[Image]) -> Bed {
        Bed::start(images, SimDisk::new(1000, 0), PATIENCE, |_| {}).await
    }

    pub async fn cycle(&mut self) -> CycleReport {
        self.collector.cycle(&tokio_util::sync::CancellationToken::new()).await
    }

    /// The ids the runtime removed so far, after one more cycle.
    pub async fn removed_after_cycle(&mut self) -> Vec<String> {
        self.cycle().await;
        self.fake.removed()
    }

    /// The ids the cycle's plan keeps now, with why.
    pub async fn kept(&mut self) -> Vec<(String, String)> {
        let listing = self.collector.observe().await.unwrap();
        let (cycle, _) = self.collector.cycle_plan(&listing, None);
        cycle
            .plan
            .kept
            .iter()
            .map(|k| (k.id.to_string(), k.why.label().to_string()))
            .collect()
    }

    /// The images the journal has, in order.
    pub fn journaled(&self) -> Vec<String> {
        Journal::new(&self.dir.path().join("state"))
            .read(None)
            .unwrap()
            .into_iter()
            .map(|e| e.image)
            .collect()
    }

    pub fn metric(&self, series: &str) -> Option<f64> {
        metric(&self.collector.metrics().encode(), series)
    }
}

/// The fake runtime served on a thread of its own, so that a test can run
/// the `imagegc` binary (a blocking child process) against it. Stops the
/// server when dropped.
pub struct ServedOnThread {
    pub endpoint: String,
    _dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServedOnThread {
    pub fn start(fake: FakeRuntime) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("cri.sock");
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a tokio runtime for the fake server");
            runtime.block_on(async move {
                let server = fake.serve(&socket).await.expect("serving the fake runtime");
                ready_tx
                    .send(server.endpoint())
                    .expect("the test waits for the endpoint");
                let _ = stop_rx.await;
                server.shutdown().await;
            });
        });
        let endpoint = ready_rx.recv_timeout(PATIENCE).expect("the fake runtime did not start");
        ServedOnThread {
            endpoint,
            _dir: dir,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }
}

impl Drop for ServedOnThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The `imagegc` binary with the flags every process-level test passes.
pub fn imagegc(config: &Path, endpoint: &str, state_dir: &Path) -> Command {
    imagegc_testkit::imagegc_command(env!("CARGO_BIN_EXE_imagegc"), config, endpoint, state_dir)
}

/// Runs a command to its end, failing the test if it takes longer than
/// [`PATIENCE`] (it is killed then).
pub fn run(command: &mut Command) -> Output {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning imagegc");
    let deadline = std::time::Instant::now() + PATIENCE;
    // Read both pipes on threads so a chatty child never blocks on a full pipe.
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut buf).ok();
        buf
    });
    let err = std::thread::spawn(move || {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut stderr, &mut buf).ok();
        buf
    });
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{command:?} did not finish within {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// Everything a process-level failure message needs.
pub fn describe(output: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A tmpfs mounted for one test; unmounted (lazily, if still busy) when
/// dropped, also when the test panics. Needs root, like the end-to-end tests.
pub struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    pub fn mount(path: &Path, size_bytes: u64) -> Self {
        assert!(
            unsafe { libc::geteuid() } == 0,
            "mounting a tmpfs needs root: run the tests as root (scripts/test.sh does)"
        );
        fs::create_dir_all(path).unwrap();
        let source = CString::new("tmpfs").unwrap();
        let target = CString::new(path.as_os_str().as_bytes()).unwrap();
        let options = CString::new(format!("size={size_bytes},mode=0700")).unwrap();
        let rc = unsafe {
            libc::mount(
                source.as_ptr(),
                target.as_ptr(),
                source.as_ptr(),
                0,
                options.as_ptr().cast(),
            )
        };
        assert_eq!(
            rc,
            0,
            "mount -t tmpfs {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
        Tmpfs {
            path: path.to_path_buf(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `mount -o remount,ro`.
    pub fn remount_read_only(&self) {
        let target = CString::new(self.path.as_os_str().as_bytes()).unwrap();
        let rc = unsafe {
            libc::mount(
                std::ptr::null(),
                target.as_ptr(),
                std::ptr::null(),
                libc::MS_REMOUNT | libc::MS_RDONLY,
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "remount read-only: {}", std::io::Error::last_os_error());
    }

    /// Writes a file until the filesystem is full; returns its path.
    pub fn fill(&self) -> PathBuf {
        let path = self.path.join("filler");
        let mut file = fs::File::create(&path).unwrap();
        let chunk = vec![0xa5u8; 4096];
        loop {
            match std::io::Write::write(&mut file, &chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(err) if err.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(err) => panic!("filling {}: {err}", self.path.display()),
            }
        }
        // A few bytes may still fit in the last partial page: take them too.
        while matches!(std::io::Write::write(&mut file, &[0u8]), Ok(1)) {}
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let target = CString::new(self.path.as_os_str().as_bytes()).unwrap();
        let rc = unsafe { libc::umount2(target.as_ptr(), 0) };
        if rc != 0 {
            unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

/// Runs one test of this binary in a child process with `env` set, and
/// returns it running (stdout piped, stderr inherited). The test named must
/// look at `env` and do its child's work only when it is set.
pub fn spawn_self(test: &str, env: &[(&str, &str)]) -> std::process::Child {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut command = Command::new(exe);
    command
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (key, value) in env {
        command.env(key, value);
    }
    command.spawn().expect("re-running the test binary")
}

/// The peak resident set size of this process so far (`VmHWM`), in KiB.
pub fn peak_rss_kib() -> u64 {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

pub use imagegc_testkit::XorShift;
