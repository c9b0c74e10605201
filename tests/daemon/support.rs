//! What the daemon tests share beyond `imagegc_testkit` (image and
//! container builders, the simulated image filesystem and `metric`,
//! re-exported here): the daemon loop run in-process against the fake runtime,
//! the `imagegc` binary run as a child process, raw HTTP, and waiting for
//! cycles.
//!
//! Every test runs on a current-thread tokio runtime that also serves the
//! fake CRI runtime, so nothing here blocks that thread: child processes and
//! HTTP requests are waited for with `spawn_blocking` or by polling.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use imagegc::config::Config;
use imagegc::daemon::Health;
use imagegc::outputs::metrics::Metrics;
use imagegc::records::Records;
pub use imagegc::sim::SimDisk;
use imagegc::store::state::{Loaded, StateStore};
pub use imagegc_testkit::fake::DiskEffects;
use imagegc_testkit::fake::{FakeRuntime, FakeServer};
pub use imagegc_testkit::{container_using, image, metric};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The deadline of every CRI call: long enough for a loaded CI machine.
pub const CRI_TIMEOUT: Duration = Duration::from_secs(10);

/// Polls `check` every 50 ms until it gives a value; panics naming `what`
/// after `within`.
pub async fn eventually<T>(within: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The records a state directory holds now, as the next process would load them.
pub fn load_records(state_dir: &Path) -> Records {
    // A long grace: the time since the save counts as observed.
    match StateStore::new(state_dir).load(SystemTime::now(), Duration::from_secs(3600)) {
        Loaded::Records { records, .. } => records,
        Loaded::Fresh => panic!("no state file in {}", state_dir.display()),
        Loaded::Corrupt { reason, .. } => panic!("the state file in {} is corrupt: {reason}", state_dir.display()),
    }
}

/// The daemon loop run in this process on a [`Collector`] over the real CRI
/// client, against a served fake runtime and a simulated disk.
pub struct InProcess {
    pub dir: tempfile::TempDir,
    pub server: Option<FakeServer>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    /// Held open, as the signal handler holds it in the binary.
    _reloads: mpsc::UnboundedSender<Arc<Config>>,
    shutdown: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl InProcess {
    /// The configuration tests start from: a cycle every second, usage polled
    /// every second, no minimum age, no HTTP endpoint, state in `state_dir`.
    pub fn config(state_dir: &Path, endpoint: &str) -> Config {
        let mut config = Config::default();
        config.runtime.endpoint = Some(endpoint.to_string());
        config.runtime.timeout = CRI_TIMEOUT;
        config.gc.interval = Duration::from_secs(1);
        config.gc.usage_poll_interval = Duration::from_secs(1);
        config.gc.min_age = Duration::ZERO;
        config.state.dir = state_dir.to_path_buf();
        config.metrics.listen = None;
        config
    }

    /// Serves `fake` in a fresh directory and starts the loop on `disk`.
    /// `prepare` sees the state directory before the collector loads it.
    pub async fn start(
        fake: FakeRuntime,
        disk: SimDisk,
        prepare: impl FnOnce(&Path),
        configure: impl FnOnce(&mut Config),
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
        let state_dir = dir.path().join("state");
        prepare(&state_dir);
        let mut config = Self::config(&state_dir, &server.endpoint());
        configure(&mut config);
        let health = Arc::new(Health::new(Duration::from_secs(600)));
        let daemon = imagegc::daemon::Daemon::new(config)
            .probe(Arc::new(disk))
            .health(Arc::clone(&health));
        let metrics = daemon.metrics();
        let shutdown = CancellationToken::new();
        let (reloads, reload_rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(daemon.run(shutdown.clone(), reload_rx));
        InProcess {
            dir,
            server: Some(server),
            metrics,
            health,
            _reloads: reloads,
            shutdown,
            task: Some(task),
        }
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Asks the loop to stop and waits until it has saved its state.
    pub async fn stop(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("the daemon loop stops within 10s of shutdown")
                .expect("the daemon loop does not panic");
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The settings of a configuration file for the binary.
#[derive(Debug, Clone)]
pub struct Settings {
    pub interval: &'static str,
    pub usage_poll_interval: &'static str,
    pub high: u8,
    pub low: u8,
    pub min_age: &'static str,
    pub max_age: &'static str,
    pub dry_run: bool,
    pub image_fs_path: PathBuf,
    pub listen: Option<SocketAddr>,
}

impl Settings {
    /// Measures the real filesystem holding `dir`; collects nothing by space.
    pub fn new(dir: &Path) -> Self {
        Settings {
            interval: "1s",
            usage_poll_interval: "1s",
            high: 100,
            low: 0,
            min_age: "0s",
            max_age: "0s",
            dry_run: false,
            image_fs_path: dir.to_path_buf(),
            listen: None,
        }
    }

    /// Thresholds that start the space pass on any filesystem that is not
    /// entirely empty, and that it can never reach: every candidate goes.
    pub fn remove_everything(mut self) -> Self {
        self.high = 1;
        self.low = 0;
        self
    }

    pub fn toml(&self) -> String {
        format!(
            "[runtime]\ntimeout = \"10s\"\n\n[gc]\ninterval = {:?}\nusage_poll_interval = {:?}\n\
             high_threshold_percent = {}\nlow_threshold_percent = {}\nmin_age = {:?}\nmax_age = {:?}\n\
             dry_run = {}\nimage_fs_path = {:?}\n\n[metrics]\nlisten = {:?}\n",
            self.interval,
            self.usage_poll_interval,
            self.high,
            self.low,
            self.min_age,
            self.max_age,
            self.dry_run,
            self.image_fs_path.display().to_string(),
            self.listen.map(|a| a.to_string()).unwrap_or_default(),
        )
    }

    pub fn write(&self, path: &Path) {
        std::fs::write(path, self.toml()).unwrap();
    }
}

/// A free TCP port on 127.0.0.1 (bound, read and released).
pub fn free_local_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

fn imagegc(config: &Path, endpoint: &str, state_dir: &Path) -> Command {
    imagegc_testkit::imagegc_command(env!("CARGO_BIN_EXE_imagegc"), config, endpoint, state_dir)
}

/// Runs a short-lived `imagegc` command to completion, off the runtime
/// thread so the fake runtime keeps answering it.
pub async fn imagegc_command(config: &Path, endpoint: &str, state_dir: &Path, args: &[&str]) -> Output {
    let mut command = imagegc(config, endpoint, state_dir);
    command.args(args);
    tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .expect("imagegc runs")
}

/// `imagegc <args> --output json`, which must exit with `code`, parsed.
pub async fn imagegc_json(
    config: &Path,
    endpoint: &str,
    state_dir: &Path,
    args: &[&str],
    code: i32,
) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend(["--output", "json"]);
    let output = imagegc_command(config, endpoint, state_dir, &all).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(code), "imagegc {args:?}: {stderr}");
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("imagegc {args:?} printed no JSON ({e}): {stderr}"))
}

/// `imagegc run` as a child process, killed when dropped.
pub struct Daemon {
    child: imagegc_testkit::process::Running,
    pub stderr_path: PathBuf,
    pub addr: Option<SocketAddr>,
}

impl Daemon {
    /// Starts `imagegc run` with the configuration at `config`, its log
    /// (debug for imagegc itself) going to `<config>.stderr`.
    pub fn spawn(config: &Path, endpoint: &str, state_dir: &Path, addr: Option<SocketAddr>) -> Daemon {
        Daemon::spawn_with_env(config, endpoint, state_dir, addr, &[])
    }

    /// [`Daemon::spawn`] with environment variables set, such as the
    /// `NODE_NAME` the DaemonSet sets.
    pub fn spawn_with_env(
        config: &Path,
        endpoint: &str,
        state_dir: &Path,
        addr: Option<SocketAddr>,
        env: &[(&str, &str)],
    ) -> Daemon {
        let stderr_path = config.with_extension("stderr");
        let stderr = File::create(&stderr_path).unwrap();
        let child = imagegc(config, endpoint, state_dir)
            .envs(env.iter().copied())
            .args(["--log-level", "info,imagegc=debug", "run"])
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("imagegc run starts");
        Daemon {
            child: imagegc_testkit::process::Running::new(child),
            stderr_path,
            addr,
        }
    }

    pub fn signal(&self, signal: i32) {
        self.child.signal(signal);
    }

    /// Everything the daemon logged so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// How many log lines contain `needle`.
    pub fn logged(&self, needle: &str) -> usize {
        self.stderr().lines().filter(|l| l.contains(needle)).count()
    }

    /// Waits until `needle` was logged.
    pub async fn wait_logged(&mut self, needle: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while self.logged(needle) == 0 {
            if let Some(status) = self.child.exited_within(Duration::ZERO).await {
                panic!(
                    "imagegc exited ({status}) before logging {needle:?}:\n{}",
                    self.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "imagegc did not log {needle:?} within {within:?}:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn running(&mut self) -> bool {
        self.child.is_running()
    }

    /// The exit status, once the process has exited within `within`.
    pub async fn exited_within(&mut self, within: Duration) -> Option<ExitStatus> {
        self.child.exited_within(within).await
    }

    /// GETs `path` from the daemon's HTTP endpoint, retrying until it is up.
    pub async fn get(&mut self, path: &str) -> (u16, String) {
        let addr = self.addr.expect("the daemon serves HTTP");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match http_get(addr, path).await {
                Ok(response) => return response,
                Err(err) => {
                    assert!(self.running(), "imagegc exited:\n{}", self.stderr());
                    assert!(Instant::now() < deadline, "GET {path} from {addr}: {err}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// The value of one series on `/metrics`, e.g. `imagegc_runtime_up`.
    pub async fn metric(&mut self, series: &str) -> Option<f64> {
        let (status, body) = self.get("/metrics").await;
        assert_eq!(status, 200, "{body}");
        metric(&body, series)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- imagegc stderr ---\n{}", self.stderr());
        }
    }
}

/// One plain HTTP/1.1 GET over a fresh connection: status and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.write_all(request.as_bytes())?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw)?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| std::io::Error::other(format!("no HTTP response: {text:?}")))?;
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("bad status line: {head:?}")))?;
        Ok((status, body.to_string()))
    })
    .await
    .unwrap()
}

/// `n` seconds.
pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A disk at 10% usage: below every high threshold the tests use.
pub fn roomy_disk() -> SimDisk {
    SimDisk::new(1_000_000, 900_000)
}

/// A time as `--output json` prints it (RFC 3339).
pub fn parse_time(value: &serde_json::Value) -> SystemTime {
    humantime::parse_rfc3339(value.as_str().expect("a time string")).expect("an RFC 3339 time")
}

/// Image ids as a set, to compare regardless of order.
pub fn ids(list: &[String]) -> BTreeSet<&str> {
    list.iter().map(String::as_str).collect()
}

/// Waits until the first cycle has finished (not merely started: a change
/// the test makes next must not be seen by it).
pub async fn first_cycle_done(daemon: &InProcess) {
    cycles_done(daemon, 1).await;
}

/// Waits until `n` cycles have finished, whatever their outcome.
pub async fn cycles_done(daemon: &InProcess, n: u32) {
    eventually(secs(10), &format!("{n} cycle(s) to finish"), || {
        let scrape = daemon.metrics.encode();
        let done: f64 = ["success", "failure"]
            .iter()
            .filter_map(|result| metric(&scrape, &format!("imagegc_cycles_total{{result=\"{result}\"}}")))
            .sum();
        (done >= f64::from(n)).then_some(())
    })
    .await;
}
