//! The daemon's footprint: `imagegc run` (the release binary) against the
//! in-process fake CRI runtime (`imagegc_testkit::fake`) served on a unix
//! socket by this process, so that thousands of images cost nothing to set
//! up. Everything is measured on the daemon's process alone, from /proc.
//!
//! - start to `/readyz` 200, the runtime already answering (readiness means
//!   the first cycle reached the runtime), polled every 5 ms; target < 300 ms;
//! - resident memory (VmRSS) right after the first cycle with 1,000 images
//!   known; target <= 12 MiB;
//! - CPU over 60 s idle with usage polling every 30 s (utime + stime from
//!   /proc/PID/stat); target < 0.2% of one core;
//! - the stripped binary's size; target <= 15 MiB;
//! - peak memory (VmHWM) with 50,000 images.
//!
//! `cargo bench --bench footprint [-- quick]` (quick: a 10 s idle window);
//! needs `target/release/imagegc` (`scripts/bench.sh` builds it).
//!
//! `cargo bench --bench footprint -- memory IMAGES TAGS` measures only the
//! memory of a big node: IMAGES images with TAGS tags and one digest each,
//! cycles every 2 s; VmHWM and VmRSS once three cycles (and their state
//! saves) are done, so that a cycle's listing, the previous one and the
//! records are all counted.

mod common;
use common::{free_local_addr, hex, imagegc_binary, median};

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use imagegc::cri::{Container, ContainerState, Image};
use imagegc_testkit::fake::FakeRuntime;
use tokio_util::sync::CancellationToken;

const KNOWN_IMAGES: usize = 1_000;
const PEAK_IMAGES: usize = 50_000;
const STARTS: usize = 5;
const IDLE_WINDOW: Duration = Duration::from_secs(60);
const READY_POLL: Duration = Duration::from_millis(5);
const READY_TIMEOUT: Duration = Duration::from_secs(120);
const PAUSE: &str = "registry.k8s.io/pause:3.9";

/// A fake runtime served on its own thread until dropped.
struct Fake {
    runtime: FakeRuntime,
    endpoint: String,
    stop: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Fake {
    /// `images` images (one tag and one digest each, plus the pause image)
    /// and one running container for every tenth image.
    fn start(images: usize, dir: &Path) -> Fake {
        Fake::start_tagged(images, 1, dir)
    }

    /// As [`Fake::start`], with `tags` tags per image (a CI node tags each
    /// build several times: commit, branch, build number).
    fn start_tagged(images: usize, tags: usize, dir: &Path) -> Fake {
        let runtime = FakeRuntime::new();
        for i in 0..images {
            let repo = i / 10;
            let name = format!("registry.example.com/team-{}/app-{repo}", repo / 20);
            runtime.add_image(Image {
                id: format!("sha256:{}", hex(1, i as u64)),
                repo_tags: (0..tags)
                    .map(|t| match t {
                        0 => format!("{name}:v1.2.{}", i % 10),
                        t => format!(
                            "{name}:build-{}-{t}",
                            hex(6, (i * tags + t) as u64).get(..12).unwrap_or("")
                        ),
                    })
                    .collect(),
                repo_digests: vec![format!("{name}@sha256:{}", hex(2, i as u64))].into(),
                size: 50_000_000 + (i as u64 % 97) * 1_000_000,
                pinned: false,
            });
        }
        runtime.add_image(Image {
            id: format!("sha256:{}", hex(3, 0)),
            repo_tags: vec![PAUSE.to_string()].into(),
            repo_digests: Default::default(),
            size: 300_000,
            pinned: false,
        });
        for c in (0..images).step_by(10) {
            runtime.add_container(Container {
                id: hex(4, c as u64),
                pod_sandbox_id: hex(5, c as u64),
                name: format!("container-{c}"),
                image: format!("registry.example.com/team-{}/app-{}:v1.2.{}", c / 200, c / 10, c % 10),
                image_ref: format!("sha256:{}", hex(1, c as u64)),
                image_id: String::new(),
                state: Some(ContainerState::Running),
                mounted_images: Vec::new(),
                mounts_unknown: false,
            });
        }
        runtime.set_sandbox_image(Some(PAUSE.to_string()));
        // The image filesystem: a real directory, below the thresholds the
        // daemon is given (100%/99%: a full build machine's disk must not
        // turn every cycle into a space pass, which is not what is measured).
        runtime.set_image_fs_mount(dir);
        let socket = dir.join(format!("fake-{images}.sock"));
        let stop = CancellationToken::new();
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = {
            let runtime = runtime.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a tokio runtime");
                rt.block_on(async {
                    let server = runtime.serve(&socket).await.expect("serving the fake runtime");
                    tx.send(server.endpoint()).expect("reporting the endpoint");
                    stop.cancelled().await;
                    server.shutdown().await;
                });
            })
        };
        let endpoint = rx.recv().expect("the fake runtime's endpoint");
        Fake {
            runtime,
            endpoint,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A running `imagegc run`; stopped with SIGTERM when dropped.
struct Daemon {
    child: Child,
    addr: SocketAddr,
    started: Instant,
}

impl Daemon {
    fn start(dir: &Path, endpoint: &str, state: &Path) -> Daemon {
        Daemon::start_every(dir, endpoint, state, "5m")
    }

    fn start_every(dir: &Path, endpoint: &str, state: &Path, interval: &str) -> Daemon {
        let addr = free_local_addr();
        let config = dir.join("imagegc.toml");
        std::fs::write(
            &config,
            format!(
                "[gc]\ninterval = \"{interval}\"\nusage_poll_interval = \"{poll}\"\n\
                 high_threshold_percent = 100\nlow_threshold_percent = 99\n\n[metrics]\nlisten = \"{addr}\"\n",
                poll = if interval == "5m" { "30s" } else { interval }
            ),
        )
        .expect("writing the configuration");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("imagegc.log"))
            .expect("opening the daemon log");
        let started = Instant::now();
        let child = Command::new(imagegc_binary())
            .args(["run", "--log-level", "warn", "--config"])
            .arg(&config)
            .arg("--runtime-endpoint")
            .arg(endpoint)
            .arg("--state-dir")
            .arg(state)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log"))
            .stderr(log)
            .spawn()
            .expect("starting imagegc run");
        Daemon { child, addr, started }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Polls /readyz until it answers 200; returns the time since start.
    fn wait_ready(&mut self) -> Duration {
        loop {
            if readyz(self.addr) == Some(200) {
                return self.started.elapsed();
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("imagegc run exited before it was ready: {status}");
            }
            assert!(
                self.started.elapsed() < READY_TIMEOUT,
                "imagegc run not ready after {READY_TIMEOUT:?}"
            );
            std::thread::sleep(READY_POLL);
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: signalling our own child by its PID.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How many cycles succeeded, from `/metrics`.
fn cycles_done(addr: SocketAddr) -> u64 {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return 0;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    if stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return 0;
    }
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    String::from_utf8_lossy(&response)
        .lines()
        .find_map(|l| l.strip_prefix("imagegc_cycles_total{result=\"success\"} "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// `memory IMAGES TAGS`: the daemon's memory on a big node (see the module docs).
fn memory(images: usize, tags: usize) {
    let dir = tempfile::Builder::new()
        .prefix("imagegc-bench-memory-")
        .tempdir()
        .expect("a temporary directory");
    let fake = Fake::start_tagged(images, tags, dir.path());
    let mut daemon = Daemon::start_every(dir.path(), &fake.endpoint, &dir.path().join("state"), "2s");
    let first = daemon.wait_ready();
    let started = Instant::now();
    while cycles_done(daemon.addr) < 3 {
        assert!(
            started.elapsed() < READY_TIMEOUT,
            "three cycles not done in {READY_TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let peak = status_kib(daemon.pid(), "VmHWM:");
    let resident = status_kib(daemon.pid(), "VmRSS:");
    let names = images * (tags + 1);
    println!(
        "memory: {images} images x {tags} tags (+1 digest): first cycle after {:.0} ms; after 3 cycles VmHWM {:.1} MiB, \
         VmRSS {:.1} MiB; {:.0} bytes per image, {:.0} per name (peak)",
        first.as_secs_f64() * 1000.0,
        mib(peak),
        mib(resident),
        peak as f64 / images as f64,
        peak as f64 / names as f64,
    );
    drop(daemon);
    drop(fake);
}

/// The status code of `GET /readyz`, or None when nothing answers yet.
fn readyz(addr: SocketAddr) -> Option<u16> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(100)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response);
    text.split_whitespace().nth(1)?.parse().ok()
}

/// A `kB` field of /proc/PID/status, in bytes.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("reading /proc/PID/status");
    status
        .lines()
        .find_map(|line| {
            line.strip_prefix(field)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse::<u64>()
                .ok()
        })
        .unwrap_or_else(|| panic!("{field} missing from /proc/{pid}/status"))
        * 1024
}

/// utime + stime of a process, from /proc/PID/stat.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("reading /proc/PID/stat");
    let after = &stat[stat.rfind(')').expect("a stat line") + 1..];
    let fields: Vec<u64> = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|f| f.parse().expect("a number of ticks"))
        .collect();
    Duration::from_secs_f64((fields[0] + fields[1]) as f64 / clock_ticks_per_second() as f64)
}

fn clock_ticks_per_second() -> i64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) }
}

/// Time on CPU of the process's live threads, in nanoseconds, from
/// /proc/PID/task/*/schedstat: finer than the clock ticks of /proc/PID/stat,
/// but blind to threads that ended in between.
fn schedstat_time(pid: u32) -> Duration {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("reading /proc/PID/task");
    let nanos: u64 = tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(nanos)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        // `cargo test --all-targets` runs bench targets without --bench.
        println!("footprint: starts the daemon for a minute; run it with `cargo bench --bench footprint`");
        return;
    }
    if let Some(at) = args.iter().position(|a| a == "memory") {
        let number = |n: usize, default: usize| args.get(at + n).and_then(|a| a.parse().ok()).unwrap_or(default);
        memory(number(1, 100_000), number(2, 5));
        return;
    }
    let idle_window = if args.iter().any(|a| a == "quick") {
        Duration::from_secs(10)
    } else {
        IDLE_WINDOW
    };
    let binary = imagegc_binary();
    let binary_bytes = std::fs::metadata(&binary).expect("the binary").len();
    let dir = tempfile::Builder::new()
        .prefix("imagegc-bench-footprint-")
        .tempdir()
        .expect("a temporary directory");

    // Starts with 1,000 images: the first on a fresh state directory, the
    // others restarts that load the state the previous one saved.
    let fake = Fake::start(KNOWN_IMAGES, dir.path());
    let state = dir.path().join("state-1k");
    let (mut ready, mut rss) = (Vec::new(), Vec::new());
    for run in 0..STARTS {
        let mut daemon = Daemon::start(dir.path(), &fake.endpoint, &state);
        let took = daemon.wait_ready();
        let resident = status_kib(daemon.pid(), "VmRSS:");
        println!(
            "footprint: start {} ({}): /readyz 200 after {:.1} ms, VmRSS {:.2} MiB",
            run + 1,
            if run == 0 { "fresh state" } else { "restart with state" },
            took.as_secs_f64() * 1000.0,
            mib(resident)
        );
        ready.push(took.as_secs_f64() * 1000.0);
        rss.push(mib(resident));
        if run + 1 < STARTS {
            continue;
        }
        // The last one stays up for the idle window.
        let polls_before = fake.runtime.count("ListContainers");
        let cpu_before = cpu_time(daemon.pid());
        let sched_before = schedstat_time(daemon.pid());
        let wall = Instant::now();
        std::thread::sleep(idle_window);
        let cpu = cpu_time(daemon.pid()).saturating_sub(cpu_before);
        let sched = schedstat_time(daemon.pid()).saturating_sub(sched_before);
        let wall = wall.elapsed();
        let polls = fake.runtime.count("ListContainers") - polls_before;
        // The larger of the two: ticks see ended threads, schedstat is finer.
        let percent = cpu.max(sched).as_secs_f64() * 100.0 / wall.as_secs_f64();
        let rss_after = status_kib(daemon.pid(), "VmRSS:");
        println!(
            "footprint: idle {:.0} s with {KNOWN_IMAGES} images: CPU {:.0} ms by utime+stime ({} ms ticks), \
             {:.2} ms by schedstat = {percent:.4}% of one core ({polls} container polls), VmRSS after {:.2} MiB \
             (target < 0.2%: {})",
            wall.as_secs_f64(),
            cpu.as_secs_f64() * 1000.0,
            1000 / clock_ticks_per_second(),
            sched.as_secs_f64() * 1000.0,
            mib(rss_after),
            verdict(percent < 0.2)
        );
        drop(daemon);
    }
    drop(fake);
    let ready_median = median(&mut ready);
    let rss_median = median(&mut rss);
    println!(
        "footprint: start to /readyz 200 median {ready_median:.1} ms over {STARTS} starts (min {:.1}, max {:.1}) \
         (target < 300 ms: {})",
        ready[0],
        ready[ready.len() - 1],
        verdict(ready_median < 300.0)
    );
    println!(
        "footprint: VmRSS after the first cycle, {KNOWN_IMAGES} images: median {rss_median:.2} MiB \
         (min {:.2}, max {:.2}) (target <= 12 MiB: {})",
        rss[0],
        rss[rss.len() - 1],
        verdict(rss_median <= 12.0)
    );
    println!(
        "footprint: binary {} bytes = {:.2} MiB (stripped release build; target <= 15 MiB: {})",
        binary_bytes,
        mib(binary_bytes),
        verdict(mib(binary_bytes) <= 15.0)
    );

    // Peak memory with 50,000 images.
    let fake = Fake::start(PEAK_IMAGES, dir.path());
    let mut daemon = Daemon::start(dir.path(), &fake.endpoint, &dir.path().join("state-50k"));
    let took = daemon.wait_ready();
    let peak = status_kib(daemon.pid(), "VmHWM:");
    let resident = status_kib(daemon.pid(), "VmRSS:");
    println!(
        "footprint: {PEAK_IMAGES} images: first cycle done after {:.0} ms, VmHWM {:.1} MiB, VmRSS {:.1} MiB",
        took.as_secs_f64() * 1000.0,
        mib(peak),
        mib(resident)
    );
    drop(daemon);
    drop(fake);
}
