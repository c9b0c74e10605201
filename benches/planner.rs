//! The planner's cost: `policy::plan` over 1k, 10k and 100k images with
//! half as many containers and a record for every image.
//!
//! Target: 10k images planned in under 5 ms on one core, and growth no
//! worse than n log n (100k/10k ≈ 12.5x). After the criterion runs, the
//! medians and the 100k/10k ratio are printed on one `planner:` line.
//!
//! Time is the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), not wall
//! time: "on one core", and steadier on a machine other work shares.
//!
//! `cargo bench --bench planner`

mod common;
use common::{hex, node_history, node_image};
use imagegc_testkit::history;

use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, SystemTime};

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{BenchmarkId, Criterion, Throughput};
use imagegc::config::Config;
use imagegc::cri::Snapshot;
use imagegc::cri::{Container, ContainerState, Image};
use imagegc::policy::{self, GcPolicy, Protections};
use imagegc::records::Records;

const SIZES: [usize; 3] = [1_000, 10_000, 100_000];
const PAUSE: &str = "registry.k8s.io/pause:3.9";

/// A node with `n` images (ten versions per repository, twenty repositories
/// per team), `n / 2` containers on distinct images, the sandbox image, and a
/// record with a distinct last use for every image.
fn world(n: usize) -> (Snapshot, Records, GcPolicy, SystemTime) {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_750_000_000);
    let mut images = Vec::with_capacity(n + 1);
    let mut map = HashMap::with_capacity(n + 1);
    for i in 0..n {
        let image = node_image(i);
        let (first_seen, last_used) = node_history(i, now);
        let (id, record) = history(&image, first_seen, last_used);
        map.insert(id, record);
        images.push(image);
    }
    let pause = Image {
        id: format!("sha256:{}", hex(3, 0)),
        repo_tags: vec![PAUSE.to_string()].into(),
        repo_digests: Default::default(),
        size: 300_000,
        pinned: false,
    };
    images.push(pause);
    // containerd reports the spec image as the tag it was created with and
    // the image id in image_ref.
    let containers = (0..n / 2)
        .map(|c| {
            let image = &images[(c * 2) % n];
            Container {
                id: hex(4, c as u64),
                pod_sandbox_id: hex(5, c as u64 / 3),
                name: format!("container-{c}"),
                image: image.repo_tags.first().unwrap().to_owned(),
                image_ref: image.id.clone(),
                image_id: String::new(),
                state: Some(ContainerState::Running),
                mounted_images: Vec::new(),
                mounts_unknown: false,
            }
        })
        .collect();
    let mut config = Config::default();
    config.gc.max_age = Duration::from_secs(14 * 86_400);
    config.protect.images = vec!["registry.k8s.io/*".to_string()];
    let snapshot = Snapshot {
        images,
        containers,
        sandbox_images: vec![PAUSE.to_string()],
        sandbox_pods_unread: None,
    };
    (snapshot, Records::from_map(map), GcPolicy::from(&config), now)
}

/// The calling thread's CPU time, as a criterion measurement.
struct ThreadCpuTime;

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec it is given.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

impl Measurement for ThreadCpuTime {
    type Intermediate = Duration;
    type Value = Duration;

    fn start(&self) -> Duration {
        thread_cpu()
    }
    fn end(&self, started: Duration) -> Duration {
        thread_cpu().saturating_sub(started)
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, value: &Duration) -> f64 {
        value.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        // Nanoseconds, like wall time.
        static WALL: WallTime = WallTime;
        WALL.formatter()
    }
}

fn bench_plan(c: &mut Criterion<ThreadCpuTime>) {
    let mut group = c.benchmark_group("plan");
    for n in SIZES {
        let (snapshot, records, gc_policy, now) = world(n);
        let started = now - Duration::from_secs(86_400);
        let plan = policy::plan(&snapshot, &records, &gc_policy, now, started);
        assert_eq!(plan.in_use_count(), n / 2);
        assert!(!plan.age.is_empty() && !plan.space.is_empty());
        group.throughput(Throughput::Elements(n as u64));
        if n >= 100_000 {
            group.sample_size(10);
        }
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| policy::plan(black_box(&snapshot), &records, &gc_policy, now, started));
        });
    }
    group.finish();
}

/// What a cycle spends between the listing and the plan: the records see
/// the listing (matching it against the containers once, looking every
/// image up once), then the plan reads what they made of it. Steady state:
/// every image already has its record, as from the second cycle on.
fn bench_cycle_plan(c: &mut Criterion<ThreadCpuTime>) {
    let mut observe_and_plan = c.benchmark_group("observe_plan");
    for n in SIZES {
        let (snapshot, mut records, gc_policy, now) = world(n);
        let started = now - Duration::from_secs(86_400);
        let (_, listed) = records.observe_snapshot(&snapshot, now);
        assert_eq!(
            policy::plan_listed(&snapshot, &listed, &gc_policy, Protections::none(), now, started),
            policy::plan(&snapshot, &records, &gc_policy, now, started),
        );
        if n >= 100_000 {
            observe_and_plan.sample_size(10);
        }
        observe_and_plan.throughput(Throughput::Elements(n as u64));
        observe_and_plan.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                let (_, listed) = records.observe_snapshot(black_box(&snapshot), now);
                let plan = policy::plan_listed(&snapshot, &listed, &gc_policy, Protections::none(), now, started);
                (plan.age.len(), plan.space.len())
            });
        });
    }
    observe_and_plan.finish();
    let mut from_listing = c.benchmark_group("plan_listed");
    for n in SIZES {
        let (snapshot, mut records, gc_policy, now) = world(n);
        let started = now - Duration::from_secs(86_400);
        let (_, listed) = records.observe_snapshot(&snapshot, now);
        if n >= 100_000 {
            from_listing.sample_size(10);
        }
        from_listing.throughput(Throughput::Elements(n as u64));
        from_listing.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                policy::plan_listed(
                    black_box(&snapshot),
                    &listed,
                    &gc_policy,
                    Protections::none(),
                    now,
                    started,
                )
            });
        });
    }
    from_listing.finish();
}

/// The median criterion measured for `<group>/<n>`, in nanoseconds.
fn median_ns(group: &str, n: usize) -> Option<f64> {
    let home = std::env::var_os("CRITERION_HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            let target = std::env::var_os("CARGO_TARGET_DIR").unwrap_or_else(|| "target".into());
            std::path::PathBuf::from(target).join("criterion")
        });
    let path = home.join(group).join(n.to_string()).join("new").join("estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json["median"]["point_estimate"].as_f64()
}

fn main() {
    let mut criterion = Criterion::default()
        .with_measurement(ThreadCpuTime)
        .configure_from_args();
    bench_plan(&mut criterion);
    bench_cycle_plan(&mut criterion);
    criterion.final_summary();
    // Under `cargo test` (no --bench) each benchmark ran once, unmeasured.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    for (group, what) in [
        ("plan", "plan from the records"),
        ("observe_plan", "observe + plan (a cycle)"),
        ("plan_listed", "plan from the cycle's listing"),
    ] {
        let medians: Vec<Option<f64>> = SIZES.iter().map(|&n| median_ns(group, n)).collect();
        if let [Some(small), Some(mid), Some(large)] = medians[..] {
            println!(
                "planner: {what}: CPU time median 1k {:.3} ms, 10k {:.3} ms, 100k {:.1} ms; 100k/10k = {:.1}x \
                 (n log n: 12.5x); 10k target < 5 ms: {}",
                small / 1e6,
                mid / 1e6,
                large / 1e6,
                large / mid,
                if mid < 5e6 { "met" } else { "MISSED" }
            );
        }
    }
}
