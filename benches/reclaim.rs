//! Reclaim quality, side by side: imagegc's cycle against the kubelet's space
//! algorithm, on a real containerd whose filesystem is past the high
//! threshold.
//!
//! Each scenario is a set of images in a known least-recently-used order,
//! some of them used by running containers. It is built three times, each
//! time on a fresh, identical test bed (its own containerd on its own ext4):
//!
//! 1. **replay**: the unused images are removed one at a time in LRU order
//!    with the bare CRI client, measuring the filesystem after each. This
//!    gives what each removal really frees next to the size CRI reports, and
//!    `k_min`, the shortest LRU prefix whose removal reaches the low
//!    threshold.
//! 2. **imagegc**: `imagegc once --output json` (the release binary) with a
//!    state file that holds the LRU order.
//! 3. **kubelet**: the kubelet's space algorithm (KUBELET.md), implemented
//!    here over CRI: `to_free = capacity*(100-low)/100 - available`, walk the
//!    LRU order skipping images in use, add each removed image's CRI size,
//!    stop when the sum reaches `to_free`; repeat the cycle, re-reading
//!    `statvfs`, while usage is at or above high (at most 10 cycles).
//!
//! Thresholds are relative to the usage measured after setup (high =
//! initial - 5, low = initial - 25), so every bed starts past high.
//!
//! Needs root, containerd, runc, ctr, mkfs.ext4, losetup and gcc (like the
//! end-to-end tests), and `target/release/imagegc` (`scripts/bench.sh`
//! builds it). `cargo bench --bench reclaim [-- SCENARIO...]`, scenarios
//! `shared` and `unshared`.

mod common;

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use common::{imagegc_binary, selected_cases};
use imagegc::cri::Runtime;
use imagegc::cri::proto;
use imagegc::fs::{FsStats, statvfs};
use imagegc::records::Records;
use imagegc::state::StateStore;
use imagegc::testing::history;
use imagegc::testing::{oci, testbed};
use oci::{ImageSpec, Layer};
use testbed::TestBed;

const MIB: u64 = 1024 * 1024;
/// The kubelet runs its space pass at most this many times here.
const MAX_KUBELET_CYCLES: u32 = 10;
/// Thresholds relative to the usage after setup.
const HIGH_BELOW_INITIAL: u64 = 5;
const LOW_BELOW_INITIAL: u64 = 25;
/// The kubelet also runs with high further below the initial usage, which
/// lets it run more cycles (imagegc would do the same as with the first
/// high: usage starts above both, and low is the same).
const KUBELET_HIGH_BELOW_INITIAL_TOO: u64 = 10;

/// One image of a scenario; scenarios list them least recently used first.
struct ImageDef {
    name: &'static str,
    /// Index of the shared base layer it sits on, if any.
    base: Option<usize>,
    unique_mib: u64,
    in_use: bool,
}

struct Scenario {
    name: &'static str,
    what: &'static str,
    fs_mib: u64,
    bases_mib: &'static [u64],
    images: &'static [ImageDef],
}

const fn img(name: &'static str, base: Option<usize>, unique_mib: u64, in_use: bool) -> ImageDef {
    ImageDef {
        name,
        base,
        unique_mib,
        in_use,
    }
}

const SCENARIOS: [Scenario; 2] = [
    Scenario {
        name: "shared",
        what: "2 bases of 40 MiB; 8 images on them, 2 without; 2 in use",
        fs_mib: 512,
        bases_mib: &[40, 40],
        images: &[
            img("registry.example.com/shop/cart:1", Some(0), 6, false),
            img("registry.example.com/shop/search:1", Some(1), 4, false),
            img("registry.example.com/shop/api:1", Some(0), 10, true),
            img("registry.example.com/shop/auth:1", Some(1), 8, false),
            img("registry.example.com/tools/batch:1", None, 12, false),
            img("registry.example.com/shop/mail:1", Some(1), 5, false),
            img("registry.example.com/shop/web:1", Some(0), 14, false),
            img("registry.example.com/shop/stock:1", Some(1), 9, false),
            img("registry.example.com/shop/pay:1", Some(0), 7, true),
            img("registry.example.com/tools/report:1", None, 16, false),
        ],
    },
    Scenario {
        name: "unshared",
        what: "10 images without shared layers; 2 in use",
        fs_mib: 512,
        bases_mib: &[],
        images: &[
            img("registry.example.com/ci/build-a:1", None, 14, false),
            img("registry.example.com/ci/build-b:1", None, 9, false),
            img("registry.example.com/ci/runner:1", None, 12, true),
            img("registry.example.com/ci/build-c:1", None, 18, false),
            img("registry.example.com/ci/build-d:1", None, 7, false),
            img("registry.example.com/ci/build-e:1", None, 16, false),
            img("registry.example.com/ci/build-f:1", None, 11, false),
            img("registry.example.com/ci/build-g:1", None, 20, false),
            img("registry.example.com/ci/cache:1", None, 10, true),
            img("registry.example.com/ci/build-h:1", None, 13, false),
        ],
    },
];

/// A scenario set up on one test bed.
struct Prepared {
    bed: TestBed,
    /// Image ids, least recently used first (all images of the scenario).
    order: Vec<String>,
    in_use: HashSet<String>,
    /// CRI-reported sizes by id.
    cri_size: HashMap<String, u64>,
    initial: FsStats,
    setup: Duration,
}

impl Prepared {
    fn fs(&self) -> FsStats {
        statvfs(self.bed.image_fs_mount()).expect("statvfs of the test bed")
    }

    /// The unused images in LRU order: the candidates of both algorithms.
    fn unused(&self) -> Vec<&String> {
        self.order.iter().filter(|id| !self.in_use.contains(*id)).collect()
    }
}

async fn prepare(scenario: &Scenario) -> Prepared {
    let started = Instant::now();
    let bed = TestBed::start(testbed::Kind::Containerd16, scenario.fs_mib).await;
    let mut order = Vec::new();
    let mut in_use_names = Vec::new();
    for (i, def) in scenario.images.iter().enumerate() {
        let mut spec = ImageSpec::new(def.name);
        if let Some(base) = def.base {
            spec = spec.layer(Layer::random(0xba5e_0000 + base as u64, scenario.bases_mib[base] * MIB));
        }
        spec = spec.layer(Layer::random(0x0051_0000 + i as u64, def.unique_mib * MIB));
        let built = bed.import(&spec).await;
        if def.in_use {
            in_use_names.push(def.name);
        }
        order.push(built.id);
    }
    if !in_use_names.is_empty() {
        let pod = bed.run_pod("reclaim").await;
        for name in &in_use_names {
            bed.run_container(&pod, name).await;
        }
    }
    let images = bed.list_images().await;
    let cri_size = images.iter().map(|i| (i.id.clone(), i.size)).collect();
    let in_use = scenario
        .images
        .iter()
        .zip(&order)
        .filter(|(def, _)| def.in_use)
        .map(|(_, id)| id.clone())
        .collect();
    let initial = statvfs(bed.image_fs_mount()).expect("statvfs of the test bed");
    Prepared {
        bed,
        order,
        in_use,
        cri_size,
        initial,
        setup: started.elapsed(),
    }
}

#[derive(Clone, Copy)]
struct Thresholds {
    high: u8,
    low: u8,
}

/// One removal as the replay measured it.
struct Step {
    name: &'static str,
    cri_size: u64,
    freed: u64,
    usage_after: FsStats,
}

struct Replay {
    steps: Vec<Step>,
    /// The shortest LRU prefix of unused images that reaches low, if any.
    k_min: Option<usize>,
}

async fn replay(scenario: &Scenario, p: &Prepared, t: Thresholds) -> Replay {
    let mut service = p.bed.client().image_service();
    let names: HashMap<&String, &'static str> = p.order.iter().zip(scenario.images.iter().map(|d| d.name)).collect();
    let mut steps = Vec::new();
    let mut k_min = None;
    let mut before = p.fs();
    for (k, id) in p.unused().into_iter().enumerate() {
        remove_image(&mut service, id).await;
        let after = p.fs();
        steps.push(Step {
            name: names[id],
            cri_size: p.cri_size[id],
            freed: after.available().saturating_sub(before.available()),
            usage_after: after,
        });
        if k_min.is_none() && after.bytes_to_free(t.low) == 0 {
            k_min = Some(k + 1);
        }
        before = after;
    }
    Replay { steps, k_min }
}

async fn remove_image(
    service: &mut proto::image_service_client::ImageServiceClient<tonic::transport::Channel>,
    id: &str,
) {
    let request = proto::RemoveImageRequest {
        image: Some(proto::ImageSpec {
            image: id.to_string(),
            ..Default::default()
        }),
    };
    service
        .remove_image(request)
        .await
        .unwrap_or_else(|s| panic!("RemoveImage {id}: {s}"));
}

/// What one algorithm did on its bed.
struct Outcome {
    /// Cycles run until usage was below high (None: never).
    cycles_below_high: Option<u32>,
    /// Cycles run until usage was at or below low (None: never).
    cycles_to_low: Option<u32>,
    cycles_run: u32,
    removed: Vec<String>,
    final_fs: FsStats,
    /// One line per cycle.
    notes: Vec<String>,
    elapsed: Duration,
}

async fn run_imagegc(p: &Prepared, t: Thresholds) -> Outcome {
    let dir = p.bed.dir().join("imagegc");
    let state_dir = dir.join("state");
    std::fs::create_dir_all(&dir).expect("creating the imagegc directory");
    let config = dir.join("imagegc.toml");
    std::fs::write(
        &config,
        format!(
            "[gc]\nhigh_threshold_percent = {}\nlow_threshold_percent = {}\n",
            t.high, t.low
        ),
    )
    .expect("writing the imagegc configuration");
    // The LRU order, as imagegc would have recorded it: one minute apart,
    // all first seen two hours ago.
    let now = SystemTime::now();
    let listed = p.bed.list_images().await;
    let records = listed.iter().map(|image| {
        let rank = p.order.iter().position(|id| *id == image.id);
        let last_used = match rank {
            Some(rank) => now - Duration::from_secs(60 * (p.order.len() - rank) as u64),
            None => now,
        };
        history(image, now - Duration::from_secs(7200), last_used)
    });
    StateStore::new(&state_dir)
        .save(&Records::from_map(records), now)
        .expect("writing the state file");

    let started = Instant::now();
    let output = Command::new(imagegc_binary())
        .args(["once", "--output", "json", "--log-level", "warn", "--runtime-endpoint"])
        .arg(p.bed.endpoint())
        .arg("--config")
        .arg(&config)
        .arg("--state-dir")
        .arg(&state_dir)
        .output()
        .expect("running imagegc once");
    let elapsed = started.elapsed();
    assert!(
        matches!(output.status.code(), Some(0 | 3)),
        "imagegc once failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("imagegc once --output json");
    let removed: Vec<String> = report["removed"]
        .as_array()
        .expect("a removed list")
        .iter()
        .map(|r| r["id"].as_str().expect("an id").to_string())
        .collect();
    let final_fs = p.fs();
    let reached_low = final_fs.bytes_to_free(t.low) == 0;
    Outcome {
        cycles_below_high: (final_fs.usage_percent() < u64::from(t.high)).then_some(1),
        cycles_to_low: reached_low.then_some(1),
        cycles_run: 1,
        notes: vec![format!(
            "cycle 1: {} -> {}%, {} removed, outcome {}, cycle {:.0} ms (process {:.0} ms)",
            report["usage_percent_before"],
            report["usage_percent_after"],
            removed.len(),
            report["outcome"],
            report["duration_seconds"].as_f64().unwrap_or(0.0) * 1000.0,
            elapsed.as_secs_f64() * 1000.0,
        )],
        removed,
        final_fs,
        elapsed,
    }
}

/// The kubelet's space pass, cycle after cycle (KUBELET.md, "One cycle").
async fn run_kubelet(p: &Prepared, t: Thresholds) -> Outcome {
    let started = Instant::now();
    let mut service = p.bed.client().image_service();
    let mut removed: Vec<String> = Vec::new();
    let mut notes = Vec::new();
    let mut cycles_below_high = None;
    let mut cycles_to_low = None;
    let mut cycles_run = 0;
    let pause = p.bed.pause_image().id.clone();
    for cycle in 1..=MAX_KUBELET_CYCLES {
        let fs = p.fs();
        if fs.usage_percent() < u64::from(t.high) {
            break;
        }
        cycles_run = cycle;
        // Detection: what exists, and which images containers use.
        let images = p.bed.list_images().await;
        let sizes: HashMap<&str, u64> = images.iter().map(|i| (i.id.as_str(), i.size)).collect();
        let used: HashSet<String> = p
            .bed
            .client()
            .list_containers()
            .await
            .expect("ListContainers")
            .into_iter()
            .flat_map(|c| [c.image_ref, c.image_id])
            .collect();
        let to_free = fs.bytes_to_free(t.low);
        let mut counted = 0u64;
        let mut this_cycle = 0;
        for id in &p.order {
            if counted >= to_free {
                break;
            }
            let Some(&size) = sizes.get(id.as_str()) else {
                continue;
            };
            if used.contains(id) || *id == pause {
                continue;
            }
            remove_image(&mut service, id).await;
            removed.push(id.clone());
            counted += size;
            this_cycle += 1;
        }
        let after = p.fs();
        notes.push(format!(
            "cycle {cycle}: {}% -> {}%, to free {:.1} MiB, counted {:.1} MiB freed by CRI sizes, really freed {:.1} MiB, {this_cycle} removed{}",
            fs.usage_percent(),
            after.usage_percent(),
            to_free as f64 / MIB as f64,
            counted as f64 / MIB as f64,
            after.available().saturating_sub(fs.available()) as f64 / MIB as f64,
            if counted < to_free { " (counted short of to free: reports FreeDiskSpaceFailed)" } else { "" },
        ));
        if cycles_to_low.is_none() && after.bytes_to_free(t.low) == 0 {
            cycles_to_low = Some(cycle);
        }
        if after.usage_percent() < u64::from(t.high) {
            cycles_below_high = Some(cycle);
        }
        if this_cycle == 0 {
            notes.push(format!(
                "cycle {cycle}: no candidate left; the kubelet makes no more progress"
            ));
            break;
        }
    }
    Outcome {
        cycles_below_high,
        cycles_to_low,
        cycles_run,
        removed,
        final_fs: p.fs(),
        notes,
        elapsed: started.elapsed(),
    }
}

fn precise_usage(fs: &FsStats) -> f64 {
    (fs.capacity_bytes - fs.available()) as f64 * 100.0 / fs.capacity_bytes as f64
}

fn cycles(c: Option<u32>) -> String {
    c.map_or_else(|| "never".to_string(), |c| c.to_string())
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / MIB as f64)
}

async fn run_scenario(scenario: &Scenario) {
    println!("\n== reclaim/{}: {} ==", scenario.name, scenario.what);

    // 1. Replay on the first bed: thresholds from its initial usage, k_min.
    let bed = prepare(scenario).await;
    let initial = bed.initial.usage_percent();
    assert!(
        initial > LOW_BELOW_INITIAL + 5,
        "the scenario fills only {initial}% of its filesystem"
    );
    let t = Thresholds {
        high: (initial - HIGH_BELOW_INITIAL) as u8,
        low: (initial - LOW_BELOW_INITIAL) as u8,
    };
    println!(
        "filesystem {} MiB, initial usage {initial}% ({:.1}% exactly; setup {:.1} s); high {}%, low {}%: {} MiB to free",
        mib(bed.initial.capacity_bytes),
        precise_usage(&bed.initial),
        bed.setup.as_secs_f64(),
        t.high,
        t.low,
        mib(bed.initial.bytes_to_free(t.low)),
    );
    let replayed = replay(scenario, &bed, t).await;
    drop(bed);
    println!("replay: unused images removed one at a time in LRU order (bare CRI client, statvfs after each)");
    println!(
        "  {:>2}  {:<38} {:>9} {:>12} {:>7}",
        "k", "image", "CRI MiB", "freed MiB", "usage"
    );
    for (k, step) in replayed.steps.iter().enumerate() {
        println!(
            "  {:>2}  {:<38} {:>9} {:>12} {:>6}%{}",
            k + 1,
            step.name,
            mib(step.cri_size),
            mib(step.freed),
            step.usage_after.usage_percent(),
            if Some(k + 1) == replayed.k_min {
                "  <- low reached (k_min)"
            } else {
                ""
            }
        );
    }
    let cri_total: u64 = replayed.steps.iter().map(|s| s.cri_size).sum();
    let freed_total: u64 = replayed.steps.iter().map(|s| s.freed).sum();
    println!(
        "  sum of CRI sizes {} MiB, really freed {} MiB",
        mib(cri_total),
        mib(freed_total)
    );

    // 2. imagegc and 3. the kubelet, each on a fresh identical bed.
    let t2 = Thresholds {
        high: (initial - KUBELET_HIGH_BELOW_INITIAL_TOO) as u8,
        ..t
    };
    let mut results = Vec::new();
    for (algorithm, t) in [("imagegc", t), ("kubelet", t), ("kubelet", t2)] {
        let bed = prepare(scenario).await;
        let drift = bed.initial.usage_percent().abs_diff(initial);
        assert!(
            drift <= 1,
            "bed initial usage {}% differs from {initial}%",
            bed.initial.usage_percent()
        );
        let outcome = match algorithm {
            "imagegc" => run_imagegc(&bed, t).await,
            _ => run_kubelet(&bed, t).await,
        };
        let algorithm = format!("{algorithm} (high {}%)", t.high);
        let prefix: HashSet<&String> = bed
            .unused()
            .into_iter()
            .take(replayed.k_min.unwrap_or(usize::MAX))
            .collect();
        let extra = outcome.removed.iter().filter(|id| !prefix.contains(id)).count();
        let in_use_removed = outcome.removed.iter().filter(|id| bed.in_use.contains(*id)).count();
        assert_eq!(in_use_removed, 0, "{algorithm} removed an image in use");
        drop(bed);
        results.push((algorithm, outcome, extra));
    }

    println!(
        "\n  {:<20} {:>18} {:>14} {:>14} {:>8} {:>13} {:>9}",
        "", "cycles below high", "cycles to low", "final usage", "removed", "beyond k_min", "time"
    );
    for (algorithm, o, extra) in &results {
        println!(
            "  {:<20} {:>18} {:>14} {:>7}% ({:>4.1}) {:>8} {:>13} {:>7.2} s",
            algorithm,
            cycles(o.cycles_below_high),
            cycles(o.cycles_to_low),
            o.final_fs.usage_percent(),
            precise_usage(&o.final_fs),
            o.removed.len(),
            extra,
            o.elapsed.as_secs_f64(),
        );
    }
    for (algorithm, o, _) in &results {
        for note in &o.notes {
            println!("  {algorithm}: {note}");
        }
        if o.cycles_run == 0 {
            println!("  {algorithm}: ran no cycle");
        }
    }
    let k_min = replayed
        .k_min
        .map_or_else(|| "none (low unreachable)".to_string(), |k| k.to_string());
    println!("  k_min (shortest LRU prefix reaching {}%): {k_min}", t.low);
    for (algorithm, o, extra) in &results {
        println!(
            "reclaim/{}/{algorithm}: cycles_below_high={} cycles_to_low={} final_usage={}% removed={} k_min={} beyond_k_min={extra} low={}",
            scenario.name,
            cycles(o.cycles_below_high),
            cycles(o.cycles_to_low),
            o.final_fs.usage_percent(),
            o.removed.len(),
            replayed.k_min.map_or(0, |k| k),
            t.low,
        );
    }
    let (_, imagegc, extra) = &results[0];
    let met = imagegc.cycles_to_low == Some(1) && *extra == 0 && imagegc.removed.len() == replayed.k_min.unwrap_or(0);
    println!(
        "reclaim/{}: imagegc target (one cycle, final usage <= low, no image beyond k_min): {}",
        scenario.name,
        if met { "met" } else { "MISSED" }
    );
}

fn main() {
    let Some(wanted) = selected_cases("reclaim") else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    for scenario in SCENARIOS
        .iter()
        .filter(|s| wanted.is_empty() || wanted.iter().any(|w| w == s.name))
    {
        runtime.block_on(run_scenario(scenario));
    }
}
