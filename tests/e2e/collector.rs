//! The collector on a real containerd, driven through the `imagegc` binary
//! as an operator would: `once`, `plan`, `run` and `history`, each with its
//! own configuration file and state directory.
//!
//! Most tests first give the images a known least-recently-used order: every
//! `imagegc` command shares the state directory, so a cycle that collects
//! nothing (high threshold 100) records which images containers use at that
//! moment, and the records persist for the next command.

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime};

use imagegc_testkit::imagegc_command;
use serde_json::Value;

use crate::oci::{BuiltImage, ImageSpec, Layer};
use crate::testbed::{FsUsage, Kind, PAUSE_IMAGE, TestBed, statvfs};

const MIB: u64 = 1024 * 1024;
/// Slack for filesystem comparisons taken moments apart: containerd's
/// metadata database lives on the same filesystem and may grow a little.
const FS_TOLERANCE_BYTES: u64 = 2 * MIB;
/// How long the daemon gets to exit after SIGTERM.
const DAEMON_STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// The kubelet's usage: `100 - available*100/capacity`, rounded up.
fn usage_percent(capacity: u64, available: u64) -> u64 {
    100 - available * 100 / capacity
}

/// The `[gc]`, `[protect]` and `[metrics]` sections of a configuration file.
#[derive(Debug, Clone)]
struct Settings {
    high: u64,
    low: u64,
    max_age: String,
    interval: Option<&'static str>,
    protect: Vec<String>,
}

impl Settings {
    fn thresholds(high: u64, low: u64) -> Self {
        Settings {
            high,
            low,
            max_age: "0s".to_string(),
            interval: None,
            protect: Vec::new(),
        }
    }

    /// Space and age collection off (high 100, max age 0): a cycle only
    /// records image use.
    fn record_only() -> Self {
        Self::thresholds(100, 99)
    }

    fn max_age(mut self, max_age: Duration) -> Self {
        self.max_age = format!("{}ms", max_age.as_millis());
        self
    }

    /// The cycle interval, and the container poll interval between cycles.
    fn every(mut self, interval: &'static str) -> Self {
        self.interval = Some(interval);
        self
    }

    fn protect(mut self, pattern: &str) -> Self {
        self.protect.push(pattern.to_string());
        self
    }

    fn toml(&self) -> String {
        let mut toml = format!(
            "[gc]\nhigh_threshold_percent = {}\nlow_threshold_percent = {}\nmin_age = \"0s\"\nmax_age = {:?}\n",
            self.high, self.low, self.max_age
        );
        if let Some(interval) = self.interval {
            toml.push_str(&format!(
                "interval = {interval:?}\nusage_poll_interval = {interval:?}\n"
            ));
        }
        toml.push_str(&format!("\n[protect]\nimages = {:?}\n", self.protect));
        toml.push_str("\n[metrics]\nlisten = \"\"\n");
        toml
    }
}

/// `imagegc` pointed at one test bed, with a configuration file and a state
/// directory of its own that every command shares.
struct Imagegc<'a> {
    bed: &'a TestBed,
    dir: tempfile::TempDir,
}

/// What one command did.
struct Run {
    args: Vec<String>,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The stdout as JSON, when the exit code is one of `codes`.
    fn json(&self, codes: &[i32]) -> Value {
        assert!(
            self.code.is_some_and(|c| codes.contains(&c)),
            "imagegc {:?} exited with {:?}, expected one of {codes:?}\nstdout:\n{}\nstderr:\n{}",
            self.args,
            self.code,
            self.stdout,
            self.stderr
        );
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("imagegc {:?} printed no JSON ({e}):\n{}", self.args, self.stdout))
    }
}

impl<'a> Imagegc<'a> {
    fn new(bed: &'a TestBed, settings: &Settings) -> Self {
        let gc = Imagegc {
            bed,
            dir: tempfile::Builder::new()
                .prefix("imagegc-e2e-gc-")
                .tempdir()
                .expect("creating the imagegc directory"),
        };
        gc.configure(settings);
        gc
    }

    fn configure(&self, settings: &Settings) {
        fs::write(self.config_path(), settings.toml()).expect("writing the imagegc configuration");
    }

    fn config_path(&self) -> PathBuf {
        self.dir.path().join("imagegc.toml")
    }

    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = imagegc_command(
            env!("CARGO_BIN_EXE_imagegc"),
            &self.config_path(),
            self.bed.endpoint(),
            &self.state_dir(),
        );
        command.args(args);
        command
    }

    fn run(&self, args: &[&str]) -> Run {
        let output = self.command(args).output().expect("running imagegc");
        Run {
            args: args.iter().map(ToString::to_string).collect(),
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// `once --output json` that must succeed.
    fn once_ok(&self) -> Value {
        let report = self.run(&["once", "--output", "json"]).json(&[0]);
        assert_eq!(report["outcome"], "success", "{report:#}");
        report
    }

    /// `history --output json`.
    fn history(&self) -> Vec<Value> {
        let history = self.run(&["history", "--output", "json"]).json(&[0]);
        history.as_array().expect("history is an array").clone()
    }

    /// Gives `images` a known least-recently-used order, oldest use first:
    /// all are first seen by one cycle, then each in turn is used by a
    /// created container while a cycle records it, and the container is
    /// removed again. Leaves the configuration set to record only.
    async fn use_in_order(&self, images: &[&BuiltImage]) {
        self.configure(&Settings::record_only());
        self.once_ok();
        let pod = self.bed.run_pod("lru").await;
        for image in images {
            let container = self.bed.create_container(&pod, image.name()).await;
            self.once_ok();
            self.bed.remove_container(&container).await;
        }
        self.bed.stop_pod(&pod).await;
        self.bed.remove_pod(&pod).await;
    }
}

/// `name:1` with the shared base layer and a unique layer of its own.
fn app(name: &str, base_mib: u64, seed: u64, unique_mib: u64) -> ImageSpec {
    ImageSpec::new(&format!("docker.io/library/{name}:1"))
        .layer(Layer::shared_base(base_mib * MIB))
        .layer(Layer::random(seed, unique_mib * MIB))
}

fn ids(images: &[&BuiltImage]) -> Vec<String> {
    images.iter().map(|i| i.id.clone()).collect()
}

fn str_field<'v>(value: &'v Value, key: &str) -> &'v str {
    value[key]
        .as_str()
        .unwrap_or_else(|| panic!("expected a string at {key:?} in {value:#}"))
}

fn u64_field(value: &Value, key: &str) -> u64 {
    value[key]
        .as_u64()
        .unwrap_or_else(|| panic!("expected a non-negative integer at {key:?} in {value:#}"))
}

fn array<'v>(value: &'v Value, key: &str) -> &'v Vec<Value> {
    value[key]
        .as_array()
        .unwrap_or_else(|| panic!("expected an array at {key:?} in {value:#}"))
}

fn id_list(values: &[Value]) -> Vec<String> {
    values.iter().map(|v| str_field(v, "id").to_string()).collect()
}

/// Short names for failure messages: `sha256:…` ids mapped to image names.
fn names_of(ids: &[String], images: &[&BuiltImage]) -> Vec<String> {
    ids.iter()
        .map(|id| {
            images
                .iter()
                .find(|i| &i.id == id)
                .map_or_else(|| id.clone(), |i| i.name().to_string())
        })
        .collect()
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

async fn shared_layers_reach_low_in_one_cycle_removing_only_the_lru_images_needed(kind: Kind) {
    let bed = TestBed::start(kind, 256).await;
    const BASE_MIB: u64 = 24;
    // Unique layer sizes; the base is in every image's reported size but
    // stored once, and each unique layer is stored twice on containerd (blob
    // and snapshot), once on CRI-O.
    let unique_mib = [6, 4, 8, 5, 7, 4, 9, 5];
    let busy = bed.import(&app("busy", BASE_MIB, 100, 6)).await;
    let mut apps = Vec::new();
    for (n, size) in unique_mib.iter().enumerate() {
        apps.push(
            bed.import(&app(&format!("app-{n}"), BASE_MIB, 101 + n as u64, *size))
                .await,
        );
    }
    let web = bed.run_pod("web").await;
    bed.run_container(&web, busy.name()).await;

    // Least recently used first; not the import order.
    let order = [5, 7, 0, 2, 4, 1, 6, 3];
    let lru: Vec<&BuiltImage> = order.iter().map(|&n| &apps[n]).collect();
    let gc = Imagegc::new(&bed, &Settings::record_only());
    gc.use_in_order(&lru).await;

    // The low threshold falls halfway through what the fourth image frees:
    // three removals are clearly not enough, four clearly are.
    const NEEDED: usize = 4;
    let stored = |n: usize| bed.stored_copies() * unique_mib[order[n]] * MIB;
    let before = bed.usage();
    let target_gain = (0..NEEDED - 1).map(stored).sum::<u64>() + stored(NEEDED - 1) / 2;
    let low = usage_percent(before.capacity_bytes, before.available_bytes + target_gain);
    let usage_now = usage_percent(before.capacity_bytes, before.available_bytes);
    // Checked below, with the readings, when usage is too low for this.
    let high = usage_now.saturating_sub(2);
    assert!(
        high > low + 5,
        "the scenario needs usage well above the low threshold: usage {usage_now}%, low {low}%"
    );
    gc.configure(&Settings::thresholds(high, low));
    let cri_sizes: Vec<u64> = {
        let images = bed.list_images().await;
        lru.iter()
            .map(|b| {
                images
                    .iter()
                    .find(|i| i.id == b.id)
                    .expect("imported image is listed")
                    .size
            })
            .collect()
    };
    let images_before = bed.list_image_ids().await;

    let run = gc.run(&["once", "--output", "json"]);
    let report = run.json(&[0]);
    let after = bed.usage();

    assert_eq!(report["outcome"], "success", "{report:#}");
    assert_eq!(report["space_pass"], true);
    assert_eq!(report["dry_run"], false);
    assert!(array(&report, "failed").is_empty(), "{report:#}");
    let capacity = before.capacity_bytes;
    let available_before = u64_field(&report, "available_bytes_before");
    assert!(u64_field(&report, "usage_percent_before") >= high, "{report:#}");
    assert!(u64_field(&report, "usage_percent_after") <= low, "{report:#}");
    assert!(
        usage_percent(after.capacity_bytes, after.available_bytes) <= low,
        "statvfs after the cycle: {after:?}, low {low}%"
    );

    // Exactly the least recently used prefix, and no image more than needed:
    // by the filesystem's own readings, the last removal crossed the low
    // threshold and the one before it had not.
    let removed = array(&report, "removed");
    let removed_ids = id_list(removed);
    let k = removed.len();
    assert_eq!(
        removed_ids,
        ids(&lru[..k]),
        "removed {:?}, least recently used first is {:?}",
        names_of(&removed_ids, &lru),
        lru.iter().map(|i| i.name()).collect::<Vec<_>>()
    );
    let freed: Vec<u64> = removed.iter().map(|r| u64_field(r, "freed_bytes")).collect();
    let reached_after: Vec<bool> = (1..=k)
        .map(|n| usage_percent(capacity, available_before + freed[..n].iter().sum::<u64>()) <= low)
        .collect();
    assert_eq!(
        reached_after.iter().position(|&r| r),
        Some(k - 1),
        "low {low}% is first reached after removal {} of {k}; freed {freed:?} from {available_before} \
         available of {capacity}",
        reached_after.iter().position(|&r| r).map_or(0, |p| p + 1)
    );
    assert_eq!(k, NEEDED, "the scenario is built so that {NEEDED} removals are needed");
    for r in removed {
        assert_eq!(r["reason"], "space");
        assert_eq!(r["dry_run"], false);
    }
    let images_after = bed.list_image_ids().await;
    let expected_after: BTreeSet<String> = images_before
        .iter()
        .filter(|id| !removed_ids.contains(id))
        .cloned()
        .collect();
    assert_eq!(images_after, expected_after);
    assert!(
        images_after.contains(&busy.id),
        "the image of a running container was removed"
    );
    assert!(
        images_after.contains(&bed.pause_image().id),
        "the pause image was removed"
    );

    // What the kubelet would have removed from the same starting point: the
    // same order, adding reported sizes until they cover the bytes to free.
    let to_free = (capacity * (100 - low) / 100).saturating_sub(available_before);
    let mut counted = 0;
    let kubelet_k = cri_sizes
        .iter()
        .position(|size| {
            counted += size;
            counted >= to_free
        })
        .map_or(cri_sizes.len(), |p| p + 1);
    let imagegc_freed: u64 = freed.iter().sum();
    eprintln!(
        "from {}% ({:.1} MiB available of {:.1} MiB), low {low}%: {:.1} MiB to free",
        usage_percent(capacity, available_before),
        mib(available_before),
        mib(capacity),
        mib(to_free)
    );
    eprintln!(
        "imagegc: removed {k} images, measured {:.1} MiB freed (per image {:?} MiB), ended at {}%",
        mib(imagegc_freed),
        freed
            .iter()
            .map(|f| (mib(*f) * 10.0).round() / 10.0)
            .collect::<Vec<_>>(),
        report["usage_percent_after"]
    );
    if kubelet_k <= k {
        let really = freed[..kubelet_k].iter().sum::<u64>();
        eprintln!(
            "kubelet: would remove {kubelet_k} images, counting {:.1} MiB of reported sizes; they free {:.1} MiB \
             on disk, ending at {}% against the {low}% target",
            mib(cri_sizes[..kubelet_k].iter().sum()),
            mib(really),
            usage_percent(capacity, available_before + really)
        );
    } else {
        eprintln!(
            "kubelet: would remove {kubelet_k} images, counting {:.1} MiB of reported sizes: {} more than needed",
            mib(cri_sizes[..kubelet_k].iter().sum()),
            kubelet_k - k
        );
    }
}

async fn the_most_aggressive_settings_keep_images_in_use_the_sandbox_and_protected_ones(kind: Kind) {
    let bed = TestBed::start(kind, 256).await;
    let running = bed.import(&app("running", 2, 11, 1)).await;
    let created = bed.import(&app("created", 2, 12, 1)).await;
    let exited = bed.import(&app("exited", 2, 13, 1)).await;
    let keep = bed.import(&app("keep", 2, 14, 1)).await;
    let unused_a = bed.import(&app("unused-a", 2, 15, 1)).await;
    let unused_b = bed.import(&app("unused-b", 2, 16, 1)).await;
    let web = bed.run_pod("web").await;
    bed.run_container(&web, running.name()).await;
    bed.create_container(&web, created.name()).await;
    let batch = bed.run_pod("batch").await;
    let done = bed.run_container(&batch, exited.name()).await;
    bed.stop_container(&done).await;

    let settings = Settings::thresholds(1, 0)
        .max_age(Duration::from_secs(1))
        .protect("docker.io/library/keep:*");
    let gc = Imagegc::new(&bed, &settings);
    let survivors = [&running, &created, &exited, &keep, bed.pause_image()];

    // Low 0% cannot be reached: everything removable goes, then exit 3.
    let report = gc.run(&["once", "--output", "json"]).json(&[3]);
    assert_eq!(report["outcome"], "low_not_reached", "{report:#}");
    let mut removed = id_list(array(&report, "removed"));
    removed.sort();
    let mut expected = ids(&[&unused_a, &unused_b]);
    expected.sort();
    assert_eq!(removed, expected, "{report:#}");
    let listed = bed.list_image_ids().await;
    assert_eq!(listed, ids(&survivors).into_iter().collect::<BTreeSet<_>>());

    // A second cycle with history older than max age removes nothing more.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let report = gc.run(&["once", "--output", "json"]).json(&[3]);
    assert!(array(&report, "removed").is_empty(), "{report:#}");
    assert_eq!(bed.list_image_ids().await, listed);
}

/// A pod keeps running on the sandbox image it was started on after the
/// runtime is configured to another one and restarted (an upgrade of the
/// pause image): that image is in use, whatever the runtime's status names
/// now, and the most aggressive `once` keeps it.
async fn a_running_pods_sandbox_image_is_kept_after_the_runtime_moves_to_another(kind: Kind) {
    let mut bed = TestBed::start(kind, 256).await;
    let pod = bed.run_pod("web").await;
    let old_pause = bed.pause_image().clone();
    let new_pause = bed
        .import(&ImageSpec::new("registry.k8s.io/pause:3.10").layer(Layer::random(310, 64 * 1024)))
        .await;
    bed.stop_containerd();
    bed.configure_sandbox_image(new_pause.name());
    bed.start_containerd().await;
    let unused = bed.import(&app("unused", 2, 51, 1)).await;

    let gc = Imagegc::new(&bed, &Settings::thresholds(1, 0).max_age(Duration::from_secs(1)));
    let report = gc.run(&["once", "--output", "json"]).json(&[0, 3]);
    let removed = id_list(array(&report, "removed"));
    assert!(removed.contains(&unused.id), "{report:#}");
    let listed = bed.list_image_ids().await;
    assert!(
        listed.contains(&old_pause.id),
        "the sandbox image of the running pod was removed: {report:#}"
    );
    assert!(listed.contains(&new_pause.id), "{report:#}");
    bed.stop_pod(&pod).await;
}

/// An image mounted as a volume (KEP-4639) by a running container is in
/// use exactly like a container's own image, though only the runtime's
/// `ContainerStatus` shows it: the most aggressive `once` keeps it. (On
/// containerd 2.x nothing else would: containerd removes it from under the
/// running container.)
async fn an_image_mounted_as_a_volume_is_kept_by_the_most_aggressive_settings(kind: Kind) {
    assert!(kind.has_image_volumes());
    let bed = TestBed::start(kind, 256).await;
    let running = bed.import(&app("volume-user", 2, 41, 1)).await;
    let data = bed.import(&app("volume-data", 2, 42, 1)).await;
    let unused = bed.import(&app("volume-unused", 2, 43, 1)).await;
    let pod = bed.run_pod("web").await;
    bed.run_container_mounting(&pod, running.name(), data.name()).await;
    let containers = bed.list_containers().await;
    assert!(
        containers
            .iter()
            .all(|c| !c.image_ref.contains("volume-data") && c.image_ref != data.id),
        "ListContainers names the volume's image after all: {containers:#?}"
    );

    let gc = Imagegc::new(&bed, &Settings::thresholds(1, 0).max_age(Duration::from_secs(1)));
    let plan = gc.run(&["plan", "--output", "json"]).json(&[0]);
    let kept = array(&plan, "kept");
    let data_kept = kept
        .iter()
        .find(|k| k["id"] == data.id.as_str())
        .unwrap_or_else(|| panic!("{} is not kept: {plan:#}", data.name()));
    assert_eq!(data_kept["reason"], "in_use", "{plan:#}");

    let report = gc.run(&["once", "--output", "json"]).json(&[3]);
    assert_eq!(id_list(array(&report, "removed")), ids(&[&unused]), "{report:#}");
    let listed = bed.list_image_ids().await;
    assert!(listed.contains(&data.id), "the mounted image was removed");
    assert!(listed.contains(&running.id));
}

/// An image volume named by a tag, and the tag moved to another image
/// while the pod runs (a new image pushed and pulled under the same tag):
/// the container still mounts the image it started with. The daemon, which
/// saw the container start, keeps that image through the most aggressive
/// cycles.
async fn an_image_volume_stays_in_use_after_its_tag_moves(kind: Kind) {
    assert!(kind.has_image_volumes());
    let bed = TestBed::start(kind, 256).await;
    let running = bed.import(&app("volume-user", 2, 44, 1)).await;
    let data = bed.import(&app("volume-data", 2, 45, 1)).await;
    let pod = bed.run_pod("web").await;
    bed.run_container_mounting(&pod, running.name(), data.name()).await;

    let settings = Settings::thresholds(1, 0).max_age(Duration::from_secs(1)).every("1s");
    let gc = Imagegc::new(&bed, &settings);
    let mut daemon = Daemon::start(&gc, "daemon.log");
    let state_file = gc.state_dir().join("records.state");
    assert!(
        wait_for(Duration::from_secs(20), || async { state_file.exists() }).await,
        "no cycle; log:\n{}",
        daemon.log()
    );
    // The same tag, another image; then three more cycles.
    let cycles = |log: &str| log.matches("cycle could not reach the low threshold").count();
    let before = cycles(&daemon.log());
    let moved = bed.import(&app("volume-data", 2, 46, 1)).await;
    assert_ne!(moved.id, data.id);
    assert!(
        wait_for(Duration::from_secs(30), || async {
            cycles(&daemon.log()) >= before + 3
        })
        .await,
        "three cycles after the tag moved; log:\n{}",
        daemon.log()
    );
    let listed = bed.list_image_ids().await;
    let (status, _) = daemon.terminate();
    assert_eq!(status.code(), Some(0), "log:\n{}", daemon.log());
    assert!(
        listed.contains(&data.id),
        "the image the running container mounts was removed when its tag moved; log:\n{}",
        daemon.log()
    );
    assert!(listed.contains(&running.id));
}

/// The `imagegc run` daemon, killed if the test ends without stopping it.
struct Daemon {
    child: Option<imagegc_testkit::process::Running>,
    log: PathBuf,
}

impl Daemon {
    fn start(gc: &Imagegc, log_name: &str) -> Daemon {
        let log = gc.dir.path().join(log_name);
        let file = fs::File::create(&log).expect("creating the daemon log");
        let child = gc
            .command(&["run", "--log-level", "debug"])
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("starting imagegc run");
        Daemon {
            child: Some(imagegc_testkit::process::Running::new(child)),
            log,
        }
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM; returns the exit status and how long the daemon took.
    fn terminate(&mut self) -> (ExitStatus, Duration) {
        let mut child = self.child.take().expect("the daemon is running");
        child.terminate(DAEMON_STOP_TIMEOUT).unwrap_or_else(|within| {
            panic!(
                "imagegc run did not exit within {within:?} of SIGTERM; log:\n{}",
                self.log()
            )
        })
    }
}

/// Polls until `done` holds, for at most `timeout`; returns whether it did.
async fn wait_for<F: std::future::Future<Output = bool>>(timeout: Duration, mut done: impl FnMut() -> F) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn max_age_removes_images_no_longer_used_across_a_daemon_restart(kind: Kind) {
    const MAX_AGE: Duration = Duration::from_secs(8);
    let bed = TestBed::start(kind, 256).await;
    let a = bed.import(&app("was-used", 2, 21, 1)).await;
    let b = bed.import(&app("in-use", 2, 22, 1)).await;
    let c = bed.import(&app("never-used", 2, 23, 1)).await;
    let pod = bed.run_pod("web").await;
    let on_a = bed.run_container(&pod, a.name()).await;
    bed.run_container(&pod, b.name()).await;

    // High 100: no space collection, only max age.
    let settings = Settings::thresholds(100, 99).max_age(MAX_AGE).every("1s");
    let gc = Imagegc::new(&bed, &settings);
    let first_started = Instant::now();
    let mut daemon = Daemon::start(&gc, "first.log");
    let state_file = gc.state_dir().join("records.state");
    assert!(
        wait_for(Duration::from_secs(20), || async { state_file.exists() }).await,
        "the daemon saved no state after its first cycle; log:\n{}",
        daemon.log()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    bed.stop_container(&on_a).await;
    bed.remove_container(&on_a).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let (status, took) = daemon.terminate();
    assert_eq!(
        status.code(),
        Some(0),
        "imagegc run after SIGTERM; log:\n{}",
        daemon.log()
    );
    let first_ran = first_started.elapsed();
    eprintln!("first daemon ran {first_ran:?}, stopped {took:?} after SIGTERM");
    assert!(
        first_ran < MAX_AGE,
        "the first daemon ran {first_ran:?}, longer than max age: the test no longer checks a restart"
    );
    let all = ids(&[&a, &b, &c]);
    let listed = bed.list_image_ids().await;
    assert!(
        all.iter().all(|id| listed.contains(id)),
        "nothing is older than max age yet, yet images are gone; log:\n{}",
        daemon.log()
    );

    let restarted = SystemTime::now();
    let restarted_at = Instant::now();
    let mut daemon = Daemon::start(&gc, "second.log");
    let gone = wait_for(Duration::from_secs(20), || async {
        let listed = bed.list_image_ids().await;
        !listed.contains(&a.id) && !listed.contains(&c.id)
    })
    .await;
    assert!(
        gone,
        "after the restart {} and {} were not removed within 20 s; listed {:?}; log:\n{}",
        a.name(),
        c.name(),
        bed.list_image_ids().await,
        daemon.log()
    );
    eprintln!("both removed {:?} after the restart", restarted_at.elapsed());
    let listed = bed.list_image_ids().await;
    assert!(listed.contains(&b.id), "the image of a running container was removed");
    assert!(listed.contains(&bed.pause_image().id), "the pause image was removed");
    let (status, _) = daemon.terminate();
    assert_eq!(
        status.code(),
        Some(0),
        "imagegc run after SIGTERM; log:\n{}",
        daemon.log()
    );

    let history = gc.history();
    let entry = |image: &BuiltImage| {
        history
            .iter()
            .find(|e| e["image"] == image.id.as_str())
            .unwrap_or_else(|| panic!("history does not list {}: {history:#?}", image.name()))
            .clone()
    };
    assert_eq!(history.len(), 2, "{history:#?}\nlog:\n{}", daemon.log());
    for image in [&a, &c] {
        let e = entry(image);
        assert_eq!(e["reason"], "age", "{e:#}");
        assert_eq!(e["dry_run"], false, "{e:#}");
    }
    // The last use came from the first daemon through the state file: a
    // fresh start would have recorded it at the restart.
    let last_used = humantime::parse_rfc3339(str_field(&entry(&a), "last_used")).expect("an RFC 3339 time");
    assert!(
        last_used < restarted,
        "{}'s last use {last_used:?} is not before the restart {restarted:?}",
        a.name()
    );
}

/// Images for the `plan` and dry-run tests: one in use, one protected, the
/// pause image, and unused ones.
struct Shelf {
    in_use: BuiltImage,
    protected: BuiltImage,
    unused: Vec<BuiltImage>,
    container: String,
}

impl Shelf {
    async fn stock(bed: &TestBed) -> Shelf {
        let in_use = bed.import(&app("in-use", 2, 31, 1)).await;
        let protected = bed.import(&app("keep", 2, 32, 1)).await;
        let mut unused = Vec::new();
        for (n, size) in [3, 1, 2, 1, 2].into_iter().enumerate() {
            unused.push(bed.import(&app(&format!("old-{n}"), 2, 33 + n as u64, size)).await);
        }
        let pod = bed.run_pod("web").await;
        let container = bed.run_container(&pod, in_use.name()).await.0;
        Shelf {
            in_use,
            protected,
            unused,
            container,
        }
    }

    /// Thresholds that put the current usage past the high one.
    fn settings_past_high(usage: FsUsage) -> Settings {
        let now = usage_percent(usage.capacity_bytes, usage.available_bytes);
        assert!(now >= 3, "usage {now}% is too low for the scenario");
        Settings::thresholds(now - 1, 1).protect("docker.io/library/keep:*")
    }
}

async fn plan_explains_the_order_and_what_is_kept_and_removes_nothing(kind: Kind) {
    let bed = TestBed::start(kind, 256).await;
    let shelf = Shelf::stock(&bed).await;
    let order = [3, 0, 4, 1, 2];
    let lru: Vec<&BuiltImage> = order.iter().map(|&n| &shelf.unused[n]).collect();
    let gc = Imagegc::new(&bed, &Settings::record_only());
    gc.use_in_order(&lru).await;
    let settings = Shelf::settings_past_high(bed.usage());
    gc.configure(&settings);
    let cri_images = bed.list_images().await;
    let images_before = bed.list_image_ids().await;
    let fs_before = bed.usage();

    let plan = gc.run(&["plan", "--output", "json"]).json(&[0]);

    assert_eq!(plan["space_pass"], true, "{plan:#}");
    assert_eq!(plan["high_threshold_percent"], settings.high);
    assert_eq!(plan["low_threshold_percent"], settings.low);
    assert!(u64_field(&plan, "bytes_to_free") > 0, "{plan:#}");
    let removals = array(&plan, "removals");
    assert!(!removals.is_empty(), "{plan:#}");
    let candidates: Vec<Value> = removals
        .iter()
        .chain(array(&plan, "further_space_candidates"))
        .cloned()
        .collect();
    let candidate_ids = id_list(&candidates);
    assert_eq!(
        candidate_ids,
        ids(&lru),
        "candidates {:?}, least recently used first is {:?}",
        names_of(&candidate_ids, &lru),
        lru.iter().map(|i| i.name()).collect::<Vec<_>>()
    );
    let mut last_used_before = String::new();
    for (candidate, built) in candidates.iter().zip(&lru) {
        assert_eq!(candidate["reason"], "space", "{candidate:#}");
        let cri = cri_images.iter().find(|i| i.id == built.id).unwrap();
        assert_eq!(u64_field(candidate, "size"), cri.size, "{candidate:#}");
        assert_eq!(candidate["tags"], serde_json::json!(built.names));
        let last_used = str_field(candidate, "last_used").to_string();
        assert!(last_used >= last_used_before, "{candidates:#?}");
        last_used_before = last_used;
    }

    let kept = array(&plan, "kept");
    let reason_of = |image: &BuiltImage| {
        kept.iter()
            .find(|k| k["id"] == image.id.as_str())
            .unwrap_or_else(|| panic!("{} is not among the kept images: {kept:#?}", image.name()))
    };
    assert_eq!(kept.len(), 3, "{kept:#?}");
    let in_use = reason_of(&shelf.in_use);
    assert_eq!(in_use["reason"], "in_use", "{in_use:#}");
    assert_eq!(in_use["containers"], serde_json::json!([shelf.container]));
    assert_eq!(reason_of(bed.pause_image())["reason"], "sandbox");
    let protected = reason_of(&shelf.protected);
    assert_eq!(protected["reason"], "protected", "{protected:#}");
    assert_eq!(protected["pattern"], "docker.io/library/keep:*");

    // The table says the same to a person.
    let table = gc.run(&["plan"]);
    assert_eq!(table.code, Some(0), "{}", table.stderr);
    assert!(
        table.stdout.contains("would remove, in this order:"),
        "{}",
        table.stdout
    );
    assert!(table.stdout.contains("the runtime's sandbox image"), "{}", table.stdout);
    assert!(table.stdout.contains(PAUSE_IMAGE), "{}", table.stdout);

    assert_eq!(bed.list_image_ids().await, images_before, "plan removed images");
    let fs_after = bed.usage();
    assert!(fs_after.available_bytes + FS_TOLERANCE_BYTES >= fs_before.available_bytes);
    assert!(gc.history().is_empty(), "plan wrote to the removal journal");
}

async fn dry_run_reports_removals_and_removes_nothing(kind: Kind) {
    let bed = TestBed::start(kind, 256).await;
    let shelf = Shelf::stock(&bed).await;
    let gc = Imagegc::new(&bed, &Shelf::settings_past_high(bed.usage()));
    let images_before = bed.list_image_ids().await;
    let fs_before = bed.usage();

    let report = gc.run(&["once", "--dry-run", "--output", "json"]).json(&[0, 3]);

    assert_eq!(report["dry_run"], true, "{report:#}");
    assert_eq!(report["space_pass"], true, "{report:#}");
    let removed = array(&report, "removed");
    assert!(!removed.is_empty(), "{report:#}");
    let unused = ids(&shelf.unused.iter().collect::<Vec<_>>());
    for r in removed {
        assert_eq!(r["dry_run"], true, "{r:#}");
        assert_eq!(r["freed_bytes"], Value::Null, "{r:#}");
        assert!(unused.contains(&str_field(r, "id").to_string()), "{r:#}");
    }
    assert_eq!(bed.list_image_ids().await, images_before, "a dry run removed images");
    let fs_after = bed.usage();
    assert!(
        fs_after.available_bytes <= fs_before.available_bytes + FS_TOLERANCE_BYTES,
        "a dry run freed space: {fs_before:?} -> {fs_after:?}"
    );
    let history = gc.history();
    assert_eq!(history.len(), removed.len(), "{history:#?}");
    assert!(history.iter().all(|e| e["dry_run"] == true), "{history:#?}");
}

/// An image pulled again soon after imagegc removed it is reported as a
/// re-pull (the policy is too aggressive for the node), and the removal is in
/// the journal `imagegc history` reads, with its reason and measured bytes.
async fn an_image_pulled_again_after_its_removal_is_reported_and_journaled(kind: Kind) {
    let bed = TestBed::start(kind, 256).await;
    let spec = app("thrash", 4, 4242, 6);
    let image = bed.import(&spec).await;
    // high 1, low 0: every unused image goes; low 0 cannot be reached (exit 3).
    let gc = Imagegc::new(&bed, &Settings::thresholds(1, 0));
    let report = gc.run(&["once", "--output", "json"]).json(&[3]);
    let removed = id_list(array(&report, "removed"));
    assert!(removed.contains(&image.id), "{report:#}");
    assert!(!bed.list_image_ids().await.contains(&image.id));

    let history = gc.history();
    let entry = history
        .iter()
        .find(|e| str_field(e, "image") == image.id)
        .unwrap_or_else(|| panic!("no journal entry for {}: {history:#?}", image.id));
    assert_eq!(entry["reason"], "space", "{entry:#}");
    assert_eq!(entry["dry_run"], false, "{entry:#}");
    assert!(u64_field(entry, "freed_bytes") > 0, "{entry:#}");
    assert!(
        array(entry, "tags").iter().any(|t| t.as_str() == Some(image.name())),
        "{entry:#}"
    );

    // Pulled again: the same name comes back; a later cycle (a new process,
    // which learns the recent removals from the journal) reports it.
    bed.import(&spec).await;
    gc.configure(&Settings::record_only());
    let run = gc.run(&["once", "--output", "json"]);
    run.json(&[0]);
    assert!(
        run.stderr.contains("pulled again within the thrash window"),
        "no re-pull reported:\n{}",
        run.stderr
    );
    assert!(run.stderr.contains(image.name()), "{}", run.stderr);
}

/// CRI-O with a split store (KEP-4191): images on one filesystem
/// (`imagestore`), the containers' writable layers on another (`root`).
/// imagegc measures and frees the image filesystem; the container
/// filesystem filling past every threshold removes nothing (images free
/// nothing there); `images` and `plan` report both.
async fn a_split_store_is_measured_and_freed_on_its_image_filesystem_only(kind: Kind) {
    const UNUSED_MIB: u64 = 24;
    let bed = TestBed::start_split(kind, 256, 128).await;
    let container_root = bed.container_fs_mount().expect("a split store").to_path_buf();
    let busy = bed.import(&app("busy", 4, 300, 8)).await;
    let mut unused = Vec::new();
    for n in 0..5 {
        unused.push(bed.import(&app(&format!("old-{n}"), 4, 301 + n, UNUSED_MIB)).await);
    }
    let web = bed.run_pod("web").await;
    bed.run_container(&web, busy.name()).await;
    let gc = Imagegc::new(&bed, &Settings::record_only());
    gc.use_in_order(&unused.iter().collect::<Vec<_>>()).await;
    let images_before = bed.list_image_ids().await;

    // The container filesystem fills past 90 % (what a container writing its
    // writable layer does to it), the image filesystem stays where it is.
    let container_fs = statvfs(&container_root);
    let fill = container_fs.available_bytes - container_fs.capacity_bytes / 20;
    let filler = container_root.join("filler");
    fs::write(&filler, vec![0xa5u8; usize::try_from(fill).expect("a size that fits")])
        .expect("filling the container filesystem");
    let container_fs = statvfs(&container_root);
    let container_usage = usage_percent(container_fs.capacity_bytes, container_fs.available_bytes);
    assert!(
        container_usage >= 90,
        "the container filesystem is at {container_usage}%"
    );
    let image_fs = bed.usage();
    let image_usage = usage_percent(image_fs.capacity_bytes, image_fs.available_bytes);
    assert!(
        (40..=85).contains(&image_usage),
        "the image filesystem is at {image_usage}%: the scenario needs room on both sides"
    );

    // High above the image filesystem's usage, far below the container one's.
    gc.configure(&Settings::thresholds(image_usage + 5, image_usage.saturating_sub(20)));
    let report = gc.once_ok();
    assert_eq!(report["space_pass"], false, "{report:#}");
    assert!(array(&report, "removed").is_empty(), "{report:#}");
    assert_eq!(u64_field(&report, "usage_percent_before"), image_usage, "{report:#}");
    assert_eq!(bed.list_image_ids().await, images_before);
    let images = gc.run(&["images", "--output", "json"]).json(&[0]);
    let measured = &images["image_filesystem"];
    assert_eq!(
        str_field(measured, "mount_point"),
        bed.image_fs_mount().join("overlay-images").to_str().unwrap(),
        "{images:#}"
    );
    assert_eq!(u64_field(measured, "capacity_bytes"), image_fs.capacity_bytes);
    let reported = &images["container_filesystem"];
    assert_eq!(
        str_field(reported, "mount_point"),
        container_root.join("overlay-containers").to_str().unwrap(),
        "{images:#}"
    );
    assert_eq!(u64_field(reported, "capacity_bytes"), container_fs.capacity_bytes);
    assert!(u64_field(reported, "usage_percent") >= 90, "{images:#}");
    let plan = gc.run(&["plan"]);
    assert_eq!(plan.code, Some(0), "{}", plan.stderr);
    for line in [
        format!("image filesystem: {}/overlay-images: ", bed.image_fs_mount().display()),
        format!(
            "container filesystem: {}/overlay-containers: ",
            container_root.display()
        ),
    ] {
        assert!(plan.stdout.contains(&line), "no {line:?} in:\n{}", plan.stdout);
    }

    // The image filesystem past high: freed there, down to low, and nothing
    // changes on the container filesystem.
    let low = image_usage - 12;
    gc.configure(&Settings::thresholds(image_usage - 2, low));
    let report = gc.once_ok();
    assert_eq!(report["space_pass"], true, "{report:#}");
    let removed = id_list(array(&report, "removed"));
    assert!(!removed.is_empty(), "{report:#}");
    let after = bed.usage();
    assert!(
        usage_percent(after.capacity_bytes, after.available_bytes) <= low,
        "statvfs of the image filesystem after the cycle: {after:?}, low {low}%"
    );
    assert!(u64_field(&report, "usage_percent_after") <= low, "{report:#}");
    assert!(
        removed.iter().all(|id| unused.iter().any(|u| &u.id == id)),
        "removed {removed:?}, not only unused images"
    );
    assert!(
        bed.list_image_ids().await.contains(&busy.id),
        "the image in use was removed"
    );
    let container_after = statvfs(&container_root);
    assert!(
        container_after.available_bytes.abs_diff(container_fs.available_bytes) <= FS_TOLERANCE_BYTES,
        "the container filesystem changed: {container_fs:?} -> {container_after:?}"
    );
    fs::remove_file(&filler).expect("removing the filler");
}

mod a_split_store_is_measured_and_freed_on_its_image_filesystem_only {
    use crate::testbed::Kind;

    #[tokio::test]
    #[ignore = "needs root and the test bed's runtimes: scripts/test.sh runs it"]
    async fn crio() {
        super::a_split_store_is_measured_and_freed_on_its_image_filesystem_only(Kind::Crio).await;
    }
}

on_every_runtime!(
    shared_layers_reach_low_in_one_cycle_removing_only_the_lru_images_needed,
    the_most_aggressive_settings_keep_images_in_use_the_sandbox_and_protected_ones,
    max_age_removes_images_no_longer_used_across_a_daemon_restart,
    plan_explains_the_order_and_what_is_kept_and_removes_nothing,
    dry_run_reports_removals_and_removes_nothing,
    an_image_pulled_again_after_its_removal_is_reported_and_journaled,
    a_running_pods_sandbox_image_is_kept_after_the_runtime_moves_to_another,
);

on_runtimes_with_image_volumes!(
    an_image_mounted_as_a_volume_is_kept_by_the_most_aggressive_settings,
    an_image_volume_stays_in_use_after_its_tag_moves,
);
