//! The cost of watching: what imagegc asks of a real runtime on an idle
//! node, by CRI method, with the default settings.
//!
//! For each runtime named on the command line (`containerd16`,
//! `containerd2`, `crio`; all three, one after the other, when none is
//! named) a fresh test bed gets 200 small images (the shared sleeper layer
//! and 16 KiB of their own) and 5 pods of 10 running containers, each
//! container from a different image. Then:
//!
//! 1. **One poll, one cycle**: through imagegc's CRI client, 31 timed
//!    iterations (after 3 warm-ups) of each call the daemon makes on this
//!    node (`ListContainers`, `ListImages`, `ImageFsInfo`, `Status`), and of
//!    a whole `Collector::cycle` with the default settings (nothing to
//!    remove). Median and 10th-90th percentiles.
//! 2. **The watch**: the release daemon (`imagegc run`) with the default
//!    settings (only the endpoint, a state directory and a metrics address
//!    given) runs for `IMAGEGC_WATCH_MINUTES` (default 10) while nothing on
//!    the node changes. Its own `imagegc_cri_requests_total{method,code}`
//!    is scraped every 5 minutes and at the end (half a poll interval past
//!    the window, when no timer is due), and printed by method beside the
//!    count the timers predict (a cycle at start and every
//!    `gc.interval`; an image and container poll every
//!    `gc.usage_poll_interval`; `ContainerStatus` once per container,
//!    `PodSandboxStatus` once per pod, `Version` once).
//!
//! Needs root and the test bed's runtimes (like the end-to-end tests).
//! `cargo bench --bench watch [-- containerd16|containerd2|crio]`

mod common;

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{free_local_addr, imagegc_binary, median, ms, selected_cases, spread};
use imagegc::config::{Config, DEFAULT_INTERVAL, DEFAULT_USAGE_POLL_INTERVAL};
use imagegc::cri::{self, Runtime};
use imagegc::engine::{Collector, Settings};
use imagegc::fs::Statvfs;
use imagegc::outputs::metrics::Metrics;
use imagegc::time::Clock;
use imagegc_testkit::oci::{ImageSpec, Layer};
use imagegc_testkit::testbed::{Kind, TestBed};
use tokio_util::sync::CancellationToken;

const IMAGES: usize = 200;
const PODS: usize = 5;
const CONTAINERS_PER_POD: usize = 10;
const FS_MIB: u64 = 600;
const WARMUP: usize = 3;
const ITERATIONS: usize = 31;
const CALL_TIMEOUT: Duration = Duration::from_secs(120);
const SCRAPE_EVERY: Duration = Duration::from_secs(300);
const DEFAULT_MINUTES: u64 = 10;

/// Under docker.io: the name CRI-O's test bed maps to its private registry.
fn name(i: usize) -> String {
    format!("docker.io/team-{}/app-{i}:v1.{}", i / 20, i % 7)
}

fn spec(i: usize) -> ImageSpec {
    ImageSpec::new(&name(i)).layer(Layer::random(0x3a7c_0000 + i as u64, 16 * 1024))
}

fn kind_of(arg: &str) -> Kind {
    match arg {
        "containerd16" => Kind::Containerd16,
        "containerd2" => Kind::Containerd2,
        "crio" => Kind::Crio,
        other => panic!("unknown runtime {other:?}: containerd16, containerd2 or crio"),
    }
}

/// A test bed with the images and the running containers.
async fn bed(kind: Kind) -> TestBed {
    let started = Instant::now();
    let bed = TestBed::start(kind, FS_MIB).await;
    for i in 0..IMAGES {
        bed.import(&spec(i)).await;
    }
    let imported = started.elapsed();
    for p in 0..PODS {
        let pod = bed.run_pod(&format!("watch-{p}")).await;
        for c in 0..CONTAINERS_PER_POD {
            bed.run_container(&pod, &name(p * CONTAINERS_PER_POD + c)).await;
        }
    }
    let containers = bed.list_containers().await.len();
    let images = bed.list_images().await.len();
    assert_eq!(containers, PODS * CONTAINERS_PER_POD, "the containers all run");
    eprintln!(
        "watch {}: {images} images (with the pause image) in {:.0} s, {containers} containers in {PODS} pods, ready after {:.0} s",
        kind.name(),
        imported.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    bed
}

async fn timed<T, E: std::fmt::Debug>(what: &str, fut: impl Future<Output = Result<T, E>>) -> f64 {
    let started = Instant::now();
    fut.await.unwrap_or_else(|e| panic!("{what}: {e:?}"));
    ms(started.elapsed())
}

/// The cost of one poll and of one cycle, through imagegc's own client.
async fn poll_cost(bed: &TestBed) {
    let client = cri::connect(bed.endpoint(), CALL_TIMEOUT).expect("an endpoint");
    let state = bed.dir().join("state-poll-cost");
    std::fs::create_dir_all(&state).expect("a state directory");
    let mut config = Config::default();
    config.runtime.endpoint = Some(bed.endpoint().to_string());
    config.state.dir = state;
    config.metrics.listen = None;
    let mut collector = Collector::load(
        client.clone(),
        Settings::from(&config),
        &config.state.dir,
        Arc::new(Statvfs),
        Arc::new(Metrics::new()),
        Clock::start(),
    );
    let cancel = CancellationToken::new();
    let names = ["ListContainers", "ListImages", "ImageFsInfo", "Status", "cycle"];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    for round in 0..WARMUP + ITERATIONS {
        let sample = [
            timed("ListContainers", client.list_containers()).await,
            timed("ListImages", client.list_images()).await,
            timed("ImageFsInfo", client.image_fs_info()).await,
            timed("Status", client.status()).await,
            {
                let started = Instant::now();
                collector.cycle(&cancel).await;
                ms(started.elapsed())
            },
        ];
        if round >= WARMUP {
            for (all, t) in times.iter_mut().zip(sample) {
                all.push(t);
            }
        }
    }
    for (name, all) in names.iter().zip(&times) {
        let (p10, p90) = spread(all);
        let middle = median(&mut all.clone());
        println!(
            "watch {}: {name:<15} median {middle:7.2} ms  (p10 {p10:.2}, p90 {p90:.2}; {ITERATIONS} iterations)",
            bed.kind().name()
        );
    }
}

fn get_metrics(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).ok()?;
    body.starts_with("HTTP/1.1 200").then_some(body)
}

/// `imagegc_cri_requests_total` by method, every code summed, and the
/// calls that did not end OK.
fn cri_requests(scrape: &str) -> (BTreeMap<String, u64>, u64) {
    let mut by_method = BTreeMap::new();
    let mut failed = 0;
    for line in scrape.lines() {
        let Some(rest) = line.strip_prefix("imagegc_cri_requests_total{") else {
            continue;
        };
        let (labels, value) = rest.split_once("} ").expect("a sample line");
        let label = |key: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{key}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
                .expect("method and code labels")
        };
        let count = value.trim().parse::<f64>().expect("a count") as u64;
        *by_method.entry(label("method")).or_insert(0) += count;
        if label("code") != "OK" {
            failed += count;
        }
    }
    (by_method, failed)
}

/// What the timers predict over `window` on this node: (method, count). A
/// cycle at start and one every interval after the last one ended; a poll
/// every poll interval after the last poll ended. Each round takes a few
/// milliseconds, so over an hour the timers drift by well under a second.
fn expected(window: Duration) -> BTreeMap<&'static str, u64> {
    let secs = window.as_secs();
    let cycles = secs / DEFAULT_INTERVAL.as_secs() + 1;
    let polls = secs / DEFAULT_USAGE_POLL_INTERVAL.as_secs();
    let containers = (PODS * CONTAINERS_PER_POD) as u64;
    BTreeMap::from([
        // A poll lists images too, so an image is first seen when it appears.
        ("ListImages", cycles + polls),
        ("Status", cycles),
        ("ImageFsInfo", cycles),
        ("ListContainers", cycles + polls),
        ("ContainerStatus", containers),
        // Every running pod's own sandbox image, whatever Status names.
        ("ListPodSandbox", cycles),
        ("PodSandboxStatus", PODS as u64),
        // How the runtime accounts image sizes, once per process.
        ("Version", 1),
    ])
}

fn print_counts(kind: Kind, elapsed: Duration, scrape: &str, last: bool) {
    let (by_method, failed) = cri_requests(scrape);
    let minutes = elapsed.as_secs_f64() / 60.0;
    let total: u64 = by_method.values().sum();
    println!(
        "watch {}: after {minutes:.1} min: {total} CRI calls ({failed} not OK)",
        kind.name()
    );
    if !last {
        return;
    }
    let expected = expected(elapsed);
    let mut methods: Vec<&str> = by_method.keys().map(String::as_str).collect();
    methods.extend(expected.keys().filter(|m| !by_method.contains_key(**m)));
    for method in methods {
        let count = by_method.get(method).copied().unwrap_or(0);
        // Asked once per container or pod when first listed: no rate.
        let rate = match method {
            "ContainerStatus" => "once per container".to_string(),
            "PodSandboxStatus" => "once per pod".to_string(),
            "Version" => "once per process".to_string(),
            _ => format!("{:.1} per hour", count as f64 * 60.0 / minutes),
        };
        println!(
            "watch {}: {method:<17} {count:6} in {minutes:.1} min ({rate}); timers predict {}",
            kind.name(),
            expected.get(method).copied().unwrap_or(0)
        );
    }
}

/// Stops the daemon with SIGTERM (it saves its state) and waits for it.
fn stop(mut daemon: Child) {
    let pid = i32::try_from(daemon.id()).expect("a pid");
    // SAFETY: sending a signal to our own child, still unreaped.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let _ = daemon.wait();
}

/// Runs the release daemon with the default settings for `window`.
async fn watch(bed: &TestBed, window: Duration) {
    let kind = bed.kind();
    let port = free_local_addr().port();
    let config = bed.dir().join("imagegc-watch.toml");
    std::fs::write(&config, format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n")).expect("writing the config");
    let log = std::fs::File::create(bed.dir().join("imagegc-watch.log")).expect("a log file");
    let daemon = Command::new(imagegc_binary())
        .arg("run")
        .arg("--config")
        .arg(&config)
        .arg("--runtime-endpoint")
        .arg(bed.endpoint())
        .arg("--state-dir")
        .arg(bed.dir().join("state-watch"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starting imagegc run");
    let started = Instant::now();
    let deadline = started + Duration::from_secs(10);
    while get_metrics(port).is_none() {
        assert!(Instant::now() < deadline, "imagegc run serves no /metrics");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "watch {}: imagegc run (pid {}) watching for {} min",
        kind.name(),
        daemon.id(),
        window.as_secs() / 60
    );
    let mut next = started + SCRAPE_EVERY;
    while next < started + window {
        tokio::time::sleep_until(next.into()).await;
        let scrape = get_metrics(port).expect("a scrape");
        print_counts(kind, started.elapsed(), &scrape, false);
        next += SCRAPE_EVERY;
    }
    // Half a poll interval past the window: no timer is due at the scrape,
    // so what the timers predict is one number, not one of two.
    tokio::time::sleep_until((started + window + DEFAULT_USAGE_POLL_INTERVAL / 2).into()).await;
    let scrape = get_metrics(port).expect("a scrape");
    let elapsed = started.elapsed();
    stop(daemon);
    print_counts(kind, elapsed, &scrape, true);
    let cycles = scrape
        .lines()
        .find(|l| l.starts_with("imagegc_cycles_total{result=\"success\"}"))
        .unwrap_or("no cycle count");
    let removed: Vec<&str> = scrape
        .lines()
        .filter(|l| l.starts_with("image_garbage_collected_total"))
        .collect();
    println!("watch {}: {cycles}; {}", kind.name(), removed.join(", "));
}

fn main() {
    let Some(wanted) = selected_cases("watch") else {
        return;
    };
    let kinds: Vec<Kind> = if wanted.is_empty() {
        vec![Kind::Containerd16, Kind::Containerd2, Kind::Crio]
    } else {
        wanted.iter().map(|w| kind_of(w)).collect()
    };
    let minutes = std::env::var("IMAGEGC_WATCH_MINUTES")
        .ok()
        .map_or(DEFAULT_MINUTES, |m| {
            m.parse().expect("IMAGEGC_WATCH_MINUTES: whole minutes")
        });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        for kind in kinds {
            let bed = bed(kind).await;
            poll_cost(&bed).await;
            if minutes > 0 {
                watch(&bed, Duration::from_secs(minutes * 60)).await;
            }
        }
    });
}
