//! Cycle overhead against the runtime's own cost, on a real containerd.
//!
//! Two fresh, identical test beds, each with 200 small images (a shared
//! 1 MiB base and a 64 KiB layer of their own) and a pod with 3 running
//! containers.
//!
//! 1. **Nothing to remove** (high 100, max age 0), on bed A: the daemon's
//!    whole cycle (`Collector::cycle` over `cri::connect` with the real
//!    `Statvfs` probe and a state directory on the machine's disk) against
//!    the bare CRI calls a cycle needs (ListImages, ListContainers,
//!    ImageFsInfo through the generated clients). Alternating, after a
//!    warm-up; medians. Target: within 1.2x. The cycle also asks Status
//!    (beside the listings) and, when one is due, saves the state; idle
//!    cycles change nothing but the last use of images in use, so they
//!    save only every 30 minutes. Both are also timed alone.
//! 2. **With removals**: batches of 20 images. On bed A a fresh collector
//!    (max age 1h, state file marking the batch unused for 2h) lists the
//!    node once, as a daemon's usage poll does between cycles (a fresh
//!    collector's first listing learns every image's layers: timed and
//!    printed apart), then runs one cycle that removes the batch by age; on bed B the same 20 images are
//!    removed with bare RemoveImage calls. Alternating batch by batch.
//!    Target: cycle time within 1.1x of the sum of the RemoveImage calls.
//!    Also printed: the cycle against its own RemoveImage calls (timed by
//!    the CRI client's metrics), which the two beds' differences in
//!    RemoveImage times do not move.
//!
//! Needs root and containerd (like the end-to-end tests).
//! `cargo bench --bench cycle [-- idle|removals]`

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use common::{median, ms, selected_cases, spread};
use imagegc::config::Config;
use imagegc::cri::{self, CriClient, Runtime, proto};
use imagegc::engine::{Collector, Outcome, Settings};
use imagegc::fs::Statvfs;
use imagegc::outputs::metrics::Metrics;
use imagegc::records::Records;
use imagegc::store::state::StateStore;
use imagegc::time::Clock;
use imagegc_testkit::history;
use imagegc_testkit::{oci, testbed};
use oci::{ImageSpec, Layer};
use testbed::{CRI_NAMESPACE, TestBed};
use tokio_util::sync::CancellationToken;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const IMAGES: usize = 200;
const RUNNING: usize = 3;
const FS_MIB: u64 = 400;
const WARMUP: usize = 3;
const ITERATIONS: usize = 31;
const BATCH: usize = 20;
const BATCHES: usize = 5;
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

fn name(i: usize) -> String {
    format!("registry.example.com/team-{}/app-{i}:v1.2.{}", i / 20, i % 7)
}

fn specs() -> Vec<ImageSpec> {
    (0..IMAGES)
        .map(|i| {
            ImageSpec::new(&name(i))
                .layer(Layer::random(0xba5e, MIB))
                .layer(Layer::random(0x1000 + i as u64, 64 * KIB))
        })
        .collect()
}

/// Writes all images into one OCI layout tarball (each built with
/// [`ImageSpec::write_layout`], then merged) and imports it with one `ctr`
/// call: far faster than one import per image.
async fn import_all(bed: &TestBed, specs: &[ImageSpec]) -> Vec<String> {
    let dir = bed.dir().join("images");
    std::fs::create_dir_all(&dir).expect("creating the image directory");
    let mut blobs: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut manifests = Vec::new();
    let mut ids = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let path = dir.join(format!("single-{i}.tar"));
        let built = spec.write_layout(&path).expect("writing an image layout");
        let mut archive = tar::Archive::new(std::fs::File::open(&path).expect("opening a layout"));
        for entry in archive.entries().expect("reading a layout") {
            let mut entry = entry.expect("a layout entry");
            let entry_path = entry.path().expect("an entry path").to_string_lossy().into_owned();
            if entry_path == "index.json" {
                let mut text = String::new();
                entry.read_to_string(&mut text).expect("reading index.json");
                let index: serde_json::Value = serde_json::from_str(&text).expect("index.json");
                manifests.extend(index["manifests"].as_array().expect("manifests").iter().cloned());
            } else if entry_path.starts_with("blobs/sha256/") && !blobs.contains_key(&entry_path) {
                let mut bytes = Vec::new();
                entry.read_to_end(&mut bytes).expect("reading a blob");
                blobs.insert(entry_path, bytes);
            }
        }
        std::fs::remove_file(&path).expect("removing a layout");
        ids.push(built.id);
    }
    let path = dir.join("all.tar");
    let mut out = tar::Builder::new(std::fs::File::create(&path).expect("creating the merged layout"));
    let mut add = |name: &str, bytes: &[u8]| {
        let mut header = tar::Header::new_ustar();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_entry_type(tar::EntryType::Regular);
        out.append_data(&mut header, name, bytes)
            .expect("writing the merged layout");
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#);
    for (name, bytes) in &blobs {
        add(name, bytes);
    }
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": oci::INDEX_MEDIA_TYPE,
        "manifests": manifests,
    });
    add("index.json", &serde_json::to_vec(&index).expect("index.json"));
    out.into_inner().expect("finishing the merged layout");
    let output = Command::new("ctr")
        .arg("-a")
        .arg(bed.socket())
        .args(["-n", CRI_NAMESPACE, "images", "import"])
        .arg(&path)
        .output()
        .expect("running ctr");
    assert!(
        output.status.success(),
        "ctr images import failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::remove_file(&path).expect("removing the merged layout");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed: std::collections::HashSet<String> = bed.list_image_ids().await.into_iter().collect();
        if ids.iter().all(|id| listed.contains(id)) {
            break;
        }
        assert!(Instant::now() < deadline, "imported images did not all show up in CRI");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ids
}

/// A test bed with the 200 images and a pod running the first few.
async fn bed() -> (TestBed, Vec<String>) {
    let started = Instant::now();
    let bed = TestBed::start(testbed::Kind::Containerd16, FS_MIB).await;
    let specs = specs();
    let ids = import_all(&bed, &specs).await;
    let pod = bed.run_pod("cycle").await;
    for spec in &specs[..RUNNING] {
        bed.run_container(&pod, spec.name()).await;
    }
    eprintln!(
        "cycle: bed with {IMAGES} images and {RUNNING} running containers ready in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    (bed, ids)
}

fn config(state_dir: &Path, high: u8, max_age: Duration) -> Arc<Config> {
    let mut config = Config::default();
    config.gc.high_threshold_percent = high;
    config.gc.low_threshold_percent = 80.min(high - 1);
    config.gc.max_age = max_age;
    config.gc.min_age = Duration::ZERO;
    config.state.dir = state_dir.to_path_buf();
    config.metrics.listen = None;
    Arc::new(config)
}

fn collector(client: CriClient, config: &Config) -> Collector<CriClient> {
    collector_with(client, config, Arc::new(Metrics::new()))
}

/// [`collector`], its calls timed in `metrics`.
fn collector_with(client: CriClient, config: &Config, metrics: Arc<Metrics>) -> Collector<CriClient> {
    let client = client.observed_by(Arc::new(imagegc::engine::sinks::CriCallMetrics::new(&metrics)));
    Collector::load(
        client,
        Settings::from(config),
        &config.state.dir,
        Arc::new(Statvfs),
        metrics,
        Clock::start(),
    )
}

/// The time the cycle's own `RemoveImage` calls took, in milliseconds:
/// `imagegc_cri_request_duration_seconds_sum{method="RemoveImage"}`.
fn own_remove_calls_ms(metrics: &Metrics) -> f64 {
    cri_calls(metrics, "sum", "RemoveImage") * 1000.0
}

/// `imagegc_cri_request_duration_seconds_{what}{method}`: the calls of
/// `method` so far (`count`) or their seconds (`sum`); NaN when absent.
fn cri_calls(metrics: &Metrics, what: &str, method: &str) -> f64 {
    let family = format!("imagegc_cri_request_duration_seconds_{what}");
    let label = format!("method=\"{method}\"");
    metrics
        .encode()
        .lines()
        .find(|l| l.starts_with(&family) && l.contains(&label))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(f64::NAN)
}

/// Where state goes: the machine's disk (not tmpfs, not the test bed's
/// filesystem), as `/var/lib/imagegc` would be.
fn state_dir(bed: &TestBed, name: &str) -> std::path::PathBuf {
    let dir = bed.dir().join(name);
    std::fs::create_dir_all(&dir).expect("creating a state directory");
    dir
}

async fn bare_calls(client: &CriClient) -> Duration {
    let mut images = client.image_service();
    let mut runtime = client.runtime_service();
    let started = Instant::now();
    let listed = images
        .list_images(proto::ListImagesRequest { filter: None })
        .await
        .expect("ListImages")
        .into_inner();
    let containers = runtime
        .list_containers(proto::ListContainersRequest { filter: None })
        .await
        .expect("ListContainers")
        .into_inner();
    let fs = images
        .image_fs_info(proto::ImageFsInfoRequest {})
        .await
        .expect("ImageFsInfo")
        .into_inner();
    let elapsed = started.elapsed();
    assert!(listed.images.len() > IMAGES && containers.containers.len() == RUNNING && !fs.image_filesystems.is_empty());
    elapsed
}

async fn idle(bed: &TestBed) {
    let client = cri::connect(bed.endpoint(), CALL_TIMEOUT).expect("an endpoint");
    let state = state_dir(bed, "state-idle");
    let mut collector = collector(client.clone(), &config(&state, 100, Duration::ZERO));
    let cancel = CancellationToken::new();
    for _ in 0..WARMUP {
        collector.cycle(&cancel).await;
        bare_calls(&client).await;
    }
    let (mut cycle, mut bare) = (Vec::new(), Vec::new());
    // Parts of the cycle beyond the bare calls, timed alone.
    let (mut status, mut save, mut statvfs) = (Vec::new(), Vec::new(), Vec::new());
    let store = StateStore::new(&state);
    let mount = bed.image_fs_info().await[0].mount_point.clone();
    for _ in 0..ITERATIONS {
        let report = collector.cycle(&cancel).await;
        assert!(
            report.removed.is_empty() && report.outcome == Outcome::Success,
            "{:?}",
            report.outcome
        );
        cycle.push(ms(report.duration));
        bare.push(ms(bare_calls(&client).await));
        let started = Instant::now();
        client.status().await.expect("Status");
        status.push(ms(started.elapsed()));
        let started = Instant::now();
        store
            .save(collector.records(), SystemTime::now())
            .expect("saving state");
        save.push(ms(started.elapsed()));
        let started = Instant::now();
        imagegc::fs::statvfs(Path::new(&mount)).expect("statvfs");
        statvfs.push(ms(started.elapsed()));
    }
    let (c, b) = (median(&mut cycle), median(&mut bare));
    let (c_lo, c_hi) = spread(&cycle);
    let (b_lo, b_hi) = spread(&bare);
    println!(
        "cycle/idle: {IMAGES} images, {RUNNING} containers, nothing to remove; {ITERATIONS} iterations after {WARMUP} warm-up"
    );
    println!("  whole cycle          median {c:7.2} ms  (p10 {c_lo:.2}, p90 {c_hi:.2})");
    println!(
        "  bare CRI calls       median {b:7.2} ms  (p10 {b_lo:.2}, p90 {b_hi:.2})  ListImages+ListContainers+ImageFsInfo"
    );
    println!(
        "  timed alone: Status(verbose) {:.2} ms, a state save when due (fsync) {:.2} ms, statvfs {:.3} ms",
        median(&mut status),
        median(&mut save),
        median(&mut statvfs)
    );
    println!(
        "cycle/idle: ratio {:.2}x (target <= 1.2x: {})",
        c / b,
        if c / b <= 1.2 { "met" } else { "MISSED" }
    );
}

/// A state file in which `old` were last used two hours ago and every other
/// image just now.
fn write_state(state: &Path, images: &[cri::Image], old: &[String]) {
    let now = SystemTime::now();
    let records = images.iter().map(|image| {
        let last_used = if old.contains(&image.id) {
            now - Duration::from_secs(7200)
        } else {
            now
        };
        history(image, now - Duration::from_secs(86_400), last_used)
    });
    StateStore::new(state)
        .save(&Records::from_map(records), now)
        .expect("writing the state file");
}

async fn removals(a: &TestBed, b: &TestBed, ids: &[String]) {
    let client_a = cri::connect(a.endpoint(), CALL_TIMEOUT).expect("an endpoint");
    let client_b = cri::connect(b.endpoint(), CALL_TIMEOUT).expect("an endpoint");
    let mut service_b = client_b.image_service();
    let state = state_dir(a, "state-removals");
    let (mut cycles, mut bares, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut own_ratios, mut firsts) = (Vec::new(), Vec::new());
    println!(
        "cycle/removals: {BATCHES} batches of {BATCH} images, removed by age by one cycle (bed A) and by bare RemoveImage calls (bed B)"
    );
    for batch in 0..BATCHES {
        let start = RUNNING + batch * BATCH;
        let victims: Vec<String> = ids[start..start + BATCH].to_vec();
        write_state(&state, &a.list_images().await, &victims);
        let metrics = Arc::new(Metrics::new());
        let config = config(&state, 100, Duration::from_secs(3600));
        let mut collector = collector_with(client_a.clone(), &config, Arc::clone(&metrics));
        // The node seen once before the cycle, as a daemon's usage poll
        // sees it between cycles: a fresh collector's first listing asks
        // the layers of every image it lists (one verbose ImageStatus
        // each, up to 256), which a daemon pays once, at its start.
        let first = Instant::now();
        collector.poll_usage().await.expect("a listing");
        firsts.push(ms(first.elapsed()));
        let statuses_before = cri_calls(&metrics, "count", "ImageStatus");
        let report = collector.cycle(&CancellationToken::new()).await;
        let own = own_remove_calls_ms(&metrics);
        let statuses = cri_calls(&metrics, "count", "ImageStatus") - statuses_before;
        assert_eq!(report.outcome, Outcome::Success);
        let mut removed: Vec<&String> = report.removed.iter().map(|r| &r.id).collect();
        removed.sort();
        let mut expected: Vec<&String> = victims.iter().collect();
        expected.sort();
        assert_eq!(removed, expected, "the cycle removed exactly the batch");

        let mut bare = Duration::ZERO;
        for id in &victims {
            let request = proto::RemoveImageRequest {
                image: Some(proto::ImageSpec {
                    image: id.clone(),
                    ..Default::default()
                }),
            };
            let started = Instant::now();
            service_b.remove_image(request).await.expect("RemoveImage");
            bare += started.elapsed();
        }
        let (c, r) = (ms(report.duration), ms(bare));
        let over_own = c / own;
        println!(
            "  batch {}: cycle {c:7.1} ms, RemoveImage x{BATCH} {r:7.1} ms ({:.1} ms each), ratio {:.3}x; \
             the cycle's own RemoveImage calls {own:7.1} ms, cycle / own calls {:.3}x; ImageStatus calls {statuses}",
            batch + 1,
            r / BATCH as f64,
            c / r,
            over_own
        );
        own_ratios.push(over_own);
        cycles.push(c);
        bares.push(r);
        ratios.push(c / r);
    }
    let own = median(&mut own_ratios);
    let ratio = median(&mut ratios);
    let (lo, hi) = (ratios[0], ratios[ratios.len() - 1]);
    println!(
        "cycle/removals: median cycle {:.1} ms, median RemoveImage sum {:.1} ms; ratio median {ratio:.3}x (min {lo:.3}, max {hi:.3}) (target <= 1.1x: {})",
        median(&mut cycles),
        median(&mut bares),
        if ratio <= 1.1 { "met" } else { "MISSED" }
    );
    println!(
        "cycle/removals: a fresh collector's first listing (the layers of {} images learnt), median {:.1} ms",
        ids.len(),
        median(&mut firsts)
    );
    // The same cycles against their own calls, on the same bed: what
    // imagegc adds, without the two beds' difference in RemoveImage times.
    println!(
        "cycle/removals: cycle / its own RemoveImage calls, median {own:.3}x (min {:.3}, max {:.3})",
        own_ratios[0],
        own_ratios[own_ratios.len() - 1]
    );
}

fn main() {
    let Some(wanted) = selected_cases("cycle") else {
        return;
    };
    let want = |name: &str| wanted.is_empty() || wanted.iter().any(|w| w == name);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let (a, ids) = bed().await;
        if want("idle") {
            idle(&a).await;
        }
        if want("removals") {
            let (b, ids_b) = bed().await;
            assert_eq!(ids, ids_b, "the two test beds hold the same images");
            removals(&a, &b, &ids).await;
        }
    });
}
