//! Reclaim quality, side by side: imagegc's cycle against the kubelet's space
//! algorithm, on each real runtime of the test bed's matrix (containerd 1.6,
//! containerd 2.x, CRI-O) whose filesystem is past the high threshold.
//!
//! Each scenario is a set of images in a known least-recently-used order,
//! some of them used by running containers. Its layers are gzip-compressed,
//! as registries serve them, and compress to about half (pseudo-random bytes
//! and zeros in alternate 4 KiB runs): containerd reports an image's size
//! as its compressed blobs and keeps those blobs beside the unpacked
//! snapshot, CRI-O reports and stores the unpacked layers, so the sizes the
//! kubelet adds up are wrong in a different way on each runtime. The same
//! images go on the same filesystem size on every runtime. Each scenario is
//! built four times per runtime, each time on a fresh, identical test bed
//! (its own runtime on its own ext4):
//!
//! 1. **replay**: the unused images are removed one at a time in LRU order
//!    with bare CRI `RemoveImage` calls, measuring the filesystem after each.
//!    This gives what each removal really frees next to the size CRI
//!    reports, and `k_min`, the shortest LRU prefix whose removal reaches the
//!    low threshold.
//! 2. **imagegc**: `imagegc once --output json` (the release binary) with a
//!    state file that holds the LRU order.
//! 3. and 4. **kubelet**: the kubelet's space algorithm (docs/kubelet.md),
//!    implemented here over CRI: `to_free = capacity*(100-low)/100 -
//!    available`, walk the LRU order skipping images containers use (matched
//!    by id, repo digest or tag) and pinned ones, add each removed image's
//!    CRI size (a failed removal counts nothing and the walk goes on), stop
//!    when the sum reaches `to_free`; repeat the cycle, re-reading `statvfs`,
//!    while usage is at or above high (at most 10 cycles). Once with imagegc's
//!    thresholds, once with high 10 points below the initial usage.
//!
//! Thresholds are relative to the usage measured after setup on each
//! runtime (high = initial - 5, low = initial - 25), so every bed starts
//! past high.
//!
//! Needs root, the test bed's tools and runtimes (containerd, runc, ctr,
//! mkfs.ext4, losetup, gcc; skopeo, docker-registry and conmon for CRI-O;
//! containerd 2.x and CRI-O built by scripts/testbed-runtimes.sh), and
//! `target/release/imagegc` (`scripts/bench.sh` builds them all).
//! `cargo bench --bench reclaim [-- SCENARIO... RUNTIME...]`: scenarios
//! `shared` and `unshared`, runtimes `containerd_1_6`, `containerd_2` and
//! `crio` (the names of the end-to-end suites); all of each when none is
//! named.

mod common;

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use common::{imagegc_binary, selected_cases};
use imagegc::cri::{Container, Image, Runtime};
use imagegc::fs::{FsStats, statvfs};
use imagegc::records::Records;
use imagegc::store::state::StateStore;
use imagegc_testkit::history;
use imagegc_testkit::{oci, testbed};
use oci::{BuiltImage, ImageSpec, Layer};
use testbed::{Kind, TestBed};

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
/// imagegc once more, after a first cycle to this many points below the
/// initial usage: `plan` then goes by what that cycle's removals measured.
const WARM_UP_LOW_BELOW_INITIAL: u64 = 12;
/// The runtimes, by the names of their end-to-end suites.
const RUNTIMES: [(&str, Kind); 3] = [
    ("containerd_1_6", Kind::Containerd16),
    ("containerd_2", Kind::Containerd2),
    ("crio", Kind::Crio),
];

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
    /// The filesystem's size, the same on every runtime.
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
        fs_mib: 352,
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
        fs_mib: 352,
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
    /// What was built for each, in the same order.
    built: Vec<BuiltImage>,
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

async fn prepare(kind: Kind, scenario: &Scenario) -> Prepared {
    let started = Instant::now();
    let bed = TestBed::start(kind, scenario.fs_mib).await;
    let mut order = Vec::new();
    let mut built_images = Vec::new();
    let mut in_use_names = Vec::new();
    for (i, def) in scenario.images.iter().enumerate() {
        let mut spec = ImageSpec::new(def.name).gzip();
        if let Some(base) = def.base {
            spec = spec.layer(Layer::compressible(
                0xba5e_0000 + base as u64,
                scenario.bases_mib[base] * MIB,
            ));
        }
        spec = spec.layer(Layer::compressible(0x0051_0000 + i as u64, def.unique_mib * MIB));
        let built = bed.import(&spec).await;
        if def.in_use {
            in_use_names.push(def.name);
        }
        order.push(built.id.clone());
        built_images.push(built);
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
        built: built_images,
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
    /// The image's own layer blobs as built (compressed) and unpacked, each
    /// layer counted once, shared bases included.
    packed: u64,
    unpacked: u64,
    freed: u64,
    usage_after: FsStats,
}

struct Replay {
    steps: Vec<Step>,
    /// The shortest LRU prefix of unused images that reaches low, if any.
    k_min: Option<usize>,
}

async fn replay(scenario: &Scenario, p: &Prepared, t: Thresholds) -> Replay {
    let names: HashMap<&String, &'static str> = p.order.iter().zip(scenario.images.iter().map(|d| d.name)).collect();
    let built: HashMap<&String, &BuiltImage> = p.order.iter().zip(&p.built).collect();
    let mut steps = Vec::new();
    let mut k_min = None;
    let mut before = p.fs();
    for (k, id) in p.unused().into_iter().enumerate() {
        p.bed
            .client()
            .remove_image(id)
            .await
            .unwrap_or_else(|e| panic!("RemoveImage {id}: {e}"));
        let after = p.fs();
        steps.push(Step {
            name: names[id],
            cri_size: p.cri_size[id],
            packed: built[id].layer_bytes(),
            unpacked: built[id].unpacked_bytes(),
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

/// Whether a container uses `image`, as the kubelet matches them
/// (docs/kubelet.md, "Records"): by the container's image id, else its image
/// ref, against the image's id or any of its repo digests or tags.
fn kubelet_in_use(image: &Image, containers: &[Container]) -> bool {
    containers.iter().any(|c| {
        let reference = if c.image_id.is_empty() {
            &c.image_ref
        } else {
            &c.image_id
        };
        *reference == image.id || image.repo_digests.contains(reference) || image.repo_tags.contains(reference)
    })
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

/// `imagegc COMMAND --output json` (`once` or `plan`) with the
/// configuration `config`, on `state_dir`: its JSON. It must exit with one
/// of `codes`.
fn imagegc_json(
    p: &Prepared,
    command: &str,
    codes: &[i32],
    config: &std::path::Path,
    state_dir: &std::path::Path,
) -> serde_json::Value {
    let output = Command::new(imagegc_binary())
        .args([command, "--output", "json", "--log-level", "warn", "--runtime-endpoint"])
        .arg(p.bed.endpoint())
        .arg("--config")
        .arg(config)
        .arg("--state-dir")
        .arg(state_dir)
        .output()
        .unwrap_or_else(|err| panic!("running imagegc {command}: {err}"));
    assert!(
        output.status.code().is_some_and(|code| codes.contains(&code)),
        "imagegc {command} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|err| panic!("imagegc {command} --output json: {err}"))
}

/// `imagegc once`: its report (exit 0, or 3 when low was not reached).
fn imagegc_once(p: &Prepared, config: &std::path::Path, state_dir: &std::path::Path) -> serde_json::Value {
    imagegc_json(p, "once", &[0, 3], config, state_dir)
}

fn write_config(path: &std::path::Path, t: Thresholds) {
    std::fs::write(
        path,
        format!(
            "[gc]\nhigh_threshold_percent = {}\nlow_threshold_percent = {}\n",
            t.high, t.low
        ),
    )
    .expect("writing the imagegc configuration");
}

/// imagegc on `p`: `plan`, then one cycle, at `t`. With `warm_up`, a first
/// cycle to that low threshold goes before, on the same state directory:
/// what its measured removals taught (the footprint, the layers they freed
/// and left behind) is what the plan then goes by.
async fn run_imagegc(p: &Prepared, t: Thresholds, warm_up: Option<u8>) -> Outcome {
    let dir = p.bed.dir().join("imagegc");
    let state_dir = dir.join("state");
    std::fs::create_dir_all(&dir).expect("creating the imagegc directory");
    let config = dir.join("imagegc.toml");
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
    let mut warmed: Vec<String> = Vec::new();
    if let Some(low) = warm_up {
        write_config(&config, Thresholds { low, ..t });
        let report = imagegc_once(p, &config, &state_dir);
        warmed = report["removed"]
            .as_array()
            .expect("a removed list")
            .iter()
            .map(|r| r["id"].as_str().expect("an id").to_string())
            .collect();
    }
    // After a warm-up the usage is below high: the plan and the cycle
    // then start a space pass from just above it.
    let t = match warm_up {
        Some(_) => Thresholds {
            high: t
                .high
                .min(p.fs().usage_percent().saturating_sub(1) as u8)
                .max(t.low.saturating_add(1)),
            ..t
        },
        None => t,
    };
    write_config(&config, t);

    // `plan` first, on the same state: what it forecasts the cycle frees.
    let plan = imagegc_json(p, "plan", &[0], &config, &state_dir);
    let forecast: Vec<String> = plan["removals"]
        .as_array()
        .expect("a removals list")
        .iter()
        .map(|r| r["id"].as_str().expect("an id").to_string())
        .collect();
    let forecast_frees = plan["expected_to_free_bytes"].as_u64().expect("expected_to_free_bytes");
    let before = p.fs();

    let started = Instant::now();
    let report = imagegc_once(p, &config, &state_dir);
    let elapsed = started.elapsed();
    let removed: Vec<String> = report["removed"]
        .as_array()
        .expect("a removed list")
        .iter()
        .map(|r| r["id"].as_str().expect("an id").to_string())
        .collect();
    let final_fs = p.fs();
    let reached_low = final_fs.bytes_to_free(t.low) == 0;
    let freed = final_fs.available().saturating_sub(before.available());
    let error = if freed == 0 {
        0.0
    } else {
        (forecast_frees as f64 - freed as f64) / freed as f64 * 100.0
    };
    let cycles = 1 + u32::from(warm_up.is_some());
    let mut notes = Vec::new();
    if let Some(low) = warm_up {
        notes.push(format!("a first cycle to {low}% removed {} image(s)", warmed.len()));
    }
    let same_as_forecast = forecast == removed;
    let removed: Vec<String> = warmed.into_iter().chain(removed).collect();
    Outcome {
        cycles_below_high: (final_fs.usage_percent() < u64::from(t.high)).then_some(cycles),
        cycles_to_low: reached_low.then_some(cycles),
        cycles_run: cycles,
        notes: notes
            .into_iter()
            .chain([
                format!(
                    "cycle 1: {} -> {}%, {} removed, outcome {}, cycle {:.0} ms (process {:.0} ms)",
                    report["usage_percent_before"],
                    report["usage_percent_after"],
                    removed.len(),
                    report["outcome"],
                    report["duration_seconds"].as_f64().unwrap_or(0.0) * 1000.0,
                    elapsed.as_secs_f64() * 1000.0,
                ),
                format!(
                    "plan before it: {} removal(s){}, expected to free {} MiB; the cycle freed {} MiB \
                 (forecast {error:+.1}%)",
                    forecast.len(),
                    if same_as_forecast {
                        ", the cycle's"
                    } else {
                        ", not the cycle's"
                    },
                    mib(forecast_frees),
                    mib(freed),
                ),
            ])
            .collect(),
        removed,
        final_fs,
        elapsed,
    }
}

/// The kubelet's space pass, cycle after cycle (docs/kubelet.md, "One cycle").
async fn run_kubelet(p: &Prepared, t: Thresholds) -> Outcome {
    let started = Instant::now();
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
        let containers = p.bed.list_containers().await;
        let listed: HashMap<&str, &Image> = images.iter().map(|i| (i.id.as_str(), i)).collect();
        let to_free = fs.bytes_to_free(t.low);
        let mut counted = 0u64;
        let mut this_cycle = 0;
        let mut failed = 0;
        for id in &p.order {
            if counted >= to_free {
                break;
            }
            let Some(image) = listed.get(id.as_str()) else {
                continue;
            };
            if image.pinned || *id == pause || kubelet_in_use(image, &containers) {
                continue;
            }
            // A failed removal counts nothing; the walk goes on.
            if p.bed.client().remove_image(id).await.is_err() {
                failed += 1;
                continue;
            }
            removed.push(id.clone());
            counted += image.size;
            this_cycle += 1;
        }
        let after = p.fs();
        notes.push(format!(
            "cycle {cycle}: {}% -> {}%, to free {:.1} MiB, counted {:.1} MiB freed by CRI sizes, really freed {:.1} MiB, {this_cycle} removed, {failed} removals failed{}",
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

async fn run_scenario(runtime: &str, kind: Kind, scenario: &Scenario) {
    let tag = format!("reclaim/{runtime}/{}", scenario.name);
    println!("\n== {tag}: {}, on {} ==", scenario.what, kind.name());

    // 1. Replay on the first bed: thresholds from its initial usage, k_min.
    let bed = prepare(kind, scenario).await;
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
    let replayed_initial = bed.initial;
    drop(bed);
    println!("replay: unused images removed one at a time in LRU order (bare CRI client, statvfs after each)");
    println!(
        "  {:>2}  {:<38} {:>11} {:>13} {:>9} {:>10} {:>7}",
        "k", "image", "packed MiB", "unpacked MiB", "CRI MiB", "freed MiB", "usage"
    );
    for (k, step) in replayed.steps.iter().enumerate() {
        println!(
            "  {:>2}  {:<38} {:>11} {:>13} {:>9} {:>10} {:>6}%{}",
            k + 1,
            step.name,
            mib(step.packed),
            mib(step.unpacked),
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
    let k_min = replayed.k_min.map_or(0, |k| k);
    println!(
        "{tag}/replay: initial_usage={initial}% ({:.1}) high={}% low={}% to_free={} MiB k_min={k_min} unused={} cri_sum={} MiB freed_sum={} MiB",
        precise_usage(&replayed_initial),
        t.high,
        t.low,
        mib(replayed_initial.bytes_to_free(t.low)),
        replayed.steps.len(),
        mib(cri_total),
        mib(freed_total),
    );

    // 2. imagegc and 3. the kubelet, each on a fresh identical bed.
    let t2 = Thresholds {
        high: (initial - KUBELET_HIGH_BELOW_INITIAL_TOO) as u8,
        ..t
    };
    let mut results = Vec::new();
    for (algorithm, t) in [("imagegc", t), ("imagegc, warmed", t), ("kubelet", t), ("kubelet", t2)] {
        let bed = prepare(kind, scenario).await;
        let drift = bed.initial.usage_percent().abs_diff(initial);
        assert!(
            drift <= 1,
            "bed initial usage {}% differs from {initial}%",
            bed.initial.usage_percent()
        );
        let outcome = match algorithm {
            "imagegc" => run_imagegc(&bed, t, None).await,
            "imagegc, warmed" => run_imagegc(&bed, t, Some((initial - WARM_UP_LOW_BELOW_INITIAL) as u8)).await,
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
    let k_min_text = replayed
        .k_min
        .map_or_else(|| "none (low unreachable)".to_string(), |k| k.to_string());
    println!("  k_min (shortest LRU prefix reaching {}%): {k_min_text}", t.low);
    for (algorithm, o, extra) in &results {
        println!(
            "{tag}/{algorithm}: cycles_below_high={} cycles_to_low={} final_usage={}% ({:.1}) removed={} k_min={k_min} beyond_k_min={extra} low={}%",
            cycles(o.cycles_below_high),
            cycles(o.cycles_to_low),
            o.final_fs.usage_percent(),
            precise_usage(&o.final_fs),
            o.removed.len(),
            t.low,
        );
    }
    let (_, imagegc, extra) = &results[0];
    let met = imagegc.cycles_to_low == Some(1) && *extra == 0 && imagegc.removed.len() == replayed.k_min.unwrap_or(0);
    println!(
        "{tag}: imagegc target (one cycle, final usage <= low, no image beyond k_min): {}",
        if met { "met" } else { "MISSED" }
    );
}

fn main() {
    let Some(wanted) = selected_cases("reclaim") else {
        return;
    };
    let is_scenario = |w: &String| SCENARIOS.iter().any(|s| s.name == w);
    let is_runtime = |w: &String| RUNTIMES.iter().any(|(name, _)| name == w);
    if let Some(unknown) = wanted.iter().find(|w| !is_scenario(w) && !is_runtime(w)) {
        let scenarios: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
        let runtimes: Vec<&str> = RUNTIMES.iter().map(|(name, _)| *name).collect();
        panic!(
            "unknown case {unknown:?}: scenarios are {}, runtimes {}",
            scenarios.join(", "),
            runtimes.join(", ")
        );
    }
    let chosen =
        |name: &str, is_kind: &dyn Fn(&String) -> bool| !wanted.iter().any(is_kind) || wanted.iter().any(|w| w == name);
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    for (runtime, kind) in RUNTIMES.iter().filter(|(name, _)| chosen(name, &is_runtime)) {
        for scenario in SCENARIOS.iter().filter(|s| chosen(s.name, &is_scenario)) {
            tokio.block_on(run_scenario(runtime, *kind, scenario));
        }
    }
}
