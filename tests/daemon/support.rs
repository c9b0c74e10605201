//! What the daemon tests share: image and container builders, a simulated
//! image filesystem, the daemon loop run in-process against the fake runtime,
//! the `imagegc` binary run as a child process, and raw HTTP.
//!
//! Every test runs on a current-thread tokio runtime that also serves the
//! fake CRI runtime, so nothing here blocks that thread: child processes and
//! HTTP requests are waited for with `spawn_blocking` or by polling.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use imagegc::collector::Collector;
use imagegc::config::Config;
use imagegc::cri::fake::{FakeRuntime, FakeServer};
use imagegc::cri::{Container, ContainerState, Image};
use imagegc::fs::{FsError, FsProbe, FsStats};
use imagegc::http::Health;
use imagegc::metrics::Metrics;
use imagegc::records::Records;
use imagegc::state::{Loaded, StateStore};
use imagegc::time::Clock;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The deadline of every CRI call: long enough for a loaded CI machine.
pub const CRI_TIMEOUT: Duration = Duration::from_secs(10);

/// An image named `name` (tag `registry.test/<name>:1`) with a realistic id.
pub fn image(name: &str, size: u64) -> Image {
    let digest = format!("{:x}", Sha256::digest(name.as_bytes()));
    Image {
        id: format!("sha256:{digest}"),
        repo_tags: vec![format!("registry.test/{name}:1")],
        repo_digests: vec![format!("registry.test/{name}@sha256:{digest}")],
        size,
        pinned: false,
    }
}

/// A running container of `image`, referring to it the way containerd does.
pub fn container(id: &str, image: &Image) -> Container {
    Container {
        id: id.to_string(),
        pod_sandbox_id: format!("pod-{id}"),
        name: id.to_string(),
        image: image.repo_tags[0].clone(),
        image_ref: image.id.clone(),
        image_id: image.id.clone(),
        state: Some(ContainerState::Running),
        mounted_images: Vec::new(),
    }
}

/// A simulated image filesystem. [`SimDisk::frees_on_remove`] ties it to a
/// fake runtime, so removing an image gives its size back.
#[derive(Clone)]
pub struct SimDisk(Arc<Mutex<(u64, u64)>>);

impl SimDisk {
    pub fn new(capacity: u64, available: u64) -> Self {
        SimDisk(Arc::new(Mutex::new((capacity, available))))
    }

    pub fn frees_on_remove(&self, fake: &FakeRuntime) {
        let disk = self.clone();
        fake.on_remove(Some(Arc::new(move |image: &Image| {
            let mut state = disk.0.lock().unwrap();
            state.1 = (state.1 + image.size).min(state.0);
        })));
    }
}

impl FsProbe for SimDisk {
    fn stats(&self, _: &Path) -> Result<FsStats, FsError> {
        let (capacity, available) = *self.0.lock().unwrap();
        Ok(FsStats {
            capacity_bytes: capacity,
            available_bytes: available,
            free_bytes: available,
            ..Default::default()
        })
    }
}

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
        let runtime = imagegc::cri::connect(&server.endpoint(), CRI_TIMEOUT).unwrap();
        let metrics = Arc::new(Metrics::new());
        let health = Arc::new(Health::new(Duration::from_secs(600)));
        let collector = Collector::new(
            runtime,
            Arc::new(config),
            Arc::new(disk),
            Arc::clone(&metrics),
            Clock::start(),
        )
        .with_health(Arc::clone(&health));
        let shutdown = CancellationToken::new();
        let (reloads, reload_rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(imagegc::daemon::run(
            collector,
            Arc::clone(&health),
            shutdown.clone(),
            reload_rx,
        ));
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
    let mut command = Command::new(env!("CARGO_BIN_EXE_imagegc"));
    command
        .env_remove("IMAGEGC_CONFIG")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("RUST_LOG")
        .arg("--config")
        .arg(config)
        .arg("--runtime-endpoint")
        .arg(endpoint)
        .arg("--state-dir")
        .arg(state_dir)
        .stdin(Stdio::null());
    command
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
    child: Child,
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
            child,
            stderr_path,
            addr,
        }
    }

    pub fn signal(&self, signal: i32) {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: kill(2) on our own child's pid has no memory effects.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal}): {}", std::io::Error::last_os_error());
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
            if let Some(status) = self.child.try_wait().unwrap() {
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
        self.child.try_wait().unwrap().is_none()
    }

    /// The exit status, once the process has exited within `within`.
    pub async fn exited_within(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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
        if self.running() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
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

/// The value of `series` (name and labels, exactly as exposed) in a scrape.
pub fn metric(body: &str, series: &str) -> Option<f64> {
    body.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}
