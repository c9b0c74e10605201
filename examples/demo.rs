//! imagegc's main job, shown on a throwaway containerd.
//!
//! The demo starts a private containerd on a small loop-mounted filesystem
//! (the e2e tests' test bed), imports images that share a base layer, starts
//! containers on some of them, gives the others a history of use, fills the
//! filesystem past the high threshold, and lets the `imagegc` binary show
//! what it sees (`images`), what it would do (`plan`), what one cycle does
//! (`once`) and what it recorded (`history`). Everything it started is
//! stopped and removed at the end, also on Ctrl-C or a failure.
//!
//! Run it as root with `scripts/demo.sh`, which installs what is missing and
//! builds this example next to the `imagegc` binary it runs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

use imagegc::cri::Runtime;
use imagegc_testkit::{oci, testbed};
use serde_json::Value;

use oci::{BuiltImage, ImageSpec, Layer};
use testbed::{FsUsage, TestBed};

const MIB: u64 = 1024 * 1024;
/// The throwaway filesystem containerd keeps its images on.
const FS_MIB: u64 = 600;
/// The base layer every demo image is built on.
const BASE_MIB: u64 = 60;
/// The thresholds the demo uses when usage is comfortably past them.
const HIGH: u64 = 70;
const LOW: u64 = 50;
/// The `protect.images` pattern of the demo configuration.
const PROTECTED: &str = "docker.io/library/tools:*";
/// Time between two recorded uses, so the last-used column reads clearly.
const USE_SPACING: Duration = Duration::from_secs(1);

/// What the demo does with an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Running,
    Created,
    Exited,
    Protected,
    Unused,
}

impl Role {
    fn describe(self) -> &'static str {
        match self {
            Role::Running => "a running container will use it",
            Role::Created => "a created (not started) container will use it",
            Role::Exited => "a container will run on it and exit",
            Role::Protected => "protected by a configured pattern",
            Role::Unused => "unused",
        }
    }
}

/// Name, size of the image's own layer on top of the base, role.
const IMAGES: [(&str, u64, Role); 10] = [
    ("web", 20, Role::Running),
    ("api", 15, Role::Created),
    ("batch", 6, Role::Exited),
    ("tools", 4, Role::Protected),
    ("analytics", 30, Role::Unused),
    ("reports", 18, Role::Unused),
    ("legacy", 25, Role::Unused),
    ("cache", 12, Role::Unused),
    ("ml-model", 28, Role::Unused),
    ("docs", 3, Role::Unused),
];

/// The order the unused images were last used in, oldest first.
const USE_ORDER: [&str; 6] = ["legacy", "docs", "analytics", "reports", "cache", "ml-model"];

fn main() -> ExitCode {
    if cfg!(panic = "abort") {
        eprintln!(
            "this demo must be built with panic = \"unwind\", so that a failure still stops its containerd \
             and unmounts its filesystem; run scripts/demo.sh, or build it with \
             cargo build --bin imagegc --example demo"
        );
        return ExitCode::FAILURE;
    }
    let imagegc = match imagegc_binary() {
        Ok(path) => path,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building a tokio runtime");
    // The test bed lives inside the demo's future: Ctrl-C drops the future,
    // and a panic unwinds through it, and either way its Drop cleans up.
    let result = runtime.block_on(async {
        tokio::select! {
            result = demo(&imagegc) => result,
            _ = tokio::signal::ctrl_c() => Err("interrupted; cleaned up".to_string()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("demo: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The `imagegc` binary built next to this example:
/// `target/<profile>/examples/demo` → `target/<profile>/imagegc`.
fn imagegc_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the demo's own path: {e}"))?;
    let binary = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("imagegc"))
        .ok_or_else(|| format!("{} has no grandparent directory", exe.display()))?;
    if !binary.is_file() {
        return Err(format!(
            "{} is missing: build it with `cargo build --bin imagegc --example demo` \
             (scripts/demo.sh does)",
            binary.display()
        ));
    }
    Ok(binary)
}

async fn demo(binary: &Path) -> Result<(), String> {
    println!("imagegc demo: keeping an image filesystem below its threshold");
    println!("==============================================================");
    say("imagegc removes unused container images when the image filesystem fills up,");
    say("least recently used first. It re-measures the disk after every removal and");
    say("stops as soon as usage is down to the low threshold: one cycle, no image more.");

    section(1, "A throwaway containerd");
    say(&format!(
        "Its root is a {FS_MIB} MiB ext4 filesystem kept in a file and loop-mounted, so the"
    ));
    say("demo controls how full it is. Nothing on this machine's own containerd is touched.");
    let bed = TestBed::start(testbed::Kind::Containerd16, FS_MIB).await;
    let version = bed
        .client()
        .version()
        .await
        .map_err(|e| format!("containerd does not answer: {e}"))?;
    say(&format!(
        "{} {} is listening on {}",
        version.runtime_name,
        version.runtime_version,
        bed.endpoint()
    ));
    say(&format!("image filesystem: {}", bed.image_fs_mount().display()));
    let empty = bed.usage();
    say(&format!("usage with only the pause image: {}", usage_line(&empty)));

    section(2, "Ten images that share a base layer");
    say(&format!(
        "Every image is a {BASE_MIB} MiB base layer plus a layer of its own. containerd stores the"
    ));
    say("base once, but reports it in every image's size. Each layer takes about twice its");
    say("size on disk here (the downloaded blob and the unpacked snapshot).");
    println!();
    let mut images: HashMap<&str, BuiltImage> = HashMap::new();
    for (name, own_mib, role) in IMAGES {
        let spec = ImageSpec::new(&reference(name))
            .layer(Layer::shared_base(BASE_MIB * MIB))
            .layer(Layer::random(seed(name), own_mib * MIB));
        images.insert(name, bed.import(&spec).await);
        say(&format!(
            "  {:<34} own layer {own_mib:>3} MiB   {}",
            reference(name),
            role.describe()
        ));
    }
    say("");
    say(&format!("usage now: {}", usage_line(&bed.usage())));

    section(3, "Containers in every state");
    say("An image is in use while any container refers to it, running or not; such images");
    say("are never removed (containerd 1.6 itself would delete them without complaint).");
    let image = |role: Role| {
        let name = IMAGES.iter().find(|(_, _, r)| *r == role).map(|(n, _, _)| *n).unwrap();
        &images[name]
    };
    let web = bed.run_pod("web").await;
    bed.run_container(&web, image(Role::Running).name()).await;
    say(&format!("  {:<34} running", image(Role::Running).name()));
    let api = bed.run_pod("api").await;
    bed.create_container(&api, image(Role::Created).name()).await;
    say(&format!("  {:<34} created, never started", image(Role::Created).name()));
    let batch = bed.run_pod("batch").await;
    let job = bed.run_container(&batch, image(Role::Exited).name()).await;
    bed.stop_container(&job).await;
    say(&format!("  {:<34} ran and exited", image(Role::Exited).name()));
    say("The pods run containerd's sandbox (pause) image, which imagegc always keeps.");

    let dir = bed.dir().to_path_buf();
    let imagegc = Imagegc {
        binary: binary.to_path_buf(),
        config: dir.join("imagegc.toml"),
        state_dir: dir.join("imagegc-state"),
        endpoint: bed.endpoint().to_string(),
    };

    section(4, "A history of use");
    say("imagegc remembers when it last saw each image in use, in its state directory, so");
    say("the order survives restarts. On a node this history builds up over days; here six");
    say("images are used one after another, a second apart, while `imagegc once` with");
    say("collection turned off (high threshold 100) records each use.");
    imagegc.configure(100, 99)?;
    imagegc.run(&["once"], &[0])?;
    let jobs = bed.run_pod("jobs").await;
    for name in USE_ORDER {
        tokio::time::sleep(USE_SPACING).await;
        let container = bed.create_container(&jobs, images[name].name()).await;
        imagegc.run(&["once"], &[0])?;
        bed.remove_container(&container).await;
        say(&format!("  used {}", images[name].name()));
    }
    bed.stop_pod(&jobs).await;
    bed.remove_pod(&jobs).await;
    say(&format!("Least recently used first: {}.", USE_ORDER.join(", ")));
    say(&format!(
        "({} was never used, which makes it the least recently used of all, but it is protected.)",
        images[PROTECTED_NAME].name()
    ));

    section(5, "Past the high threshold");
    let before = bed.usage();
    let usage = percent(&before);
    let (high, low) = thresholds(usage);
    imagegc.configure(high, low)?;
    say(&format!("usage is {}", usage_line(&before)));
    say(&format!(
        "With high {high}% and low {low}%, a cycle starts freeing space and stops at {low}%."
    ));
    say(&format!(
        "The configuration file, {} (`imagegc check-config` validates one):",
        imagegc.config.display()
    ));
    show(&std::fs::read_to_string(&imagegc.config).map_err(|e| e.to_string())?);
    say("Every command below also gets --config, --runtime-endpoint and --state-dir.");

    section(6, "What imagegc sees: `imagegc images`");
    show(&imagegc.run(&["images"], &[0])?.stdout);

    section(7, "What it would do, and why: `imagegc plan`");
    say("The plan removes nothing. Its list is an estimate from reported sizes; the cycle");
    say("itself measures the filesystem after each removal instead.");
    show(&imagegc.run(&["plan"], &[0])?.stdout);
    let plan = imagegc.run(&["plan", "--output", "json"], &[0])?.json()?;

    section(8, "One cycle: `imagegc once`");
    let once = imagegc.run(&["once"], &[0, 3])?;
    show(&once.stdout);
    let after = bed.usage();
    say(&format!("before: {}", usage_line(&before)));
    say(&format!("after:  {}", usage_line(&after)));
    if once.code == Some(3) {
        say(&format!(
            "The low threshold of {low}% could not be reached: nothing else may go."
        ));
    } else {
        say(&format!(
            "Down to {}% (low {low}%) in one cycle. The images in use, the sandbox image and the",
            percent(&after)
        ));
        say("protected one were never candidates; the remaining unused images were not needed.");
    }
    let history = imagegc.run(&["history", "--output", "json"], &[0])?.json()?;
    kubelet_comparison(&plan, &history, &before, low);

    section(9, "What was recorded: `imagegc history`");
    say(&format!(
        "Every removal is journaled in {} with its reason and the bytes it freed.",
        imagegc.state_dir.join("removals.jsonl").display()
    ));
    show(&imagegc.run(&["history"], &[0])?.stdout);

    section(10, "Clean up");
    say("Stopping the pods and containerd, unmounting and deleting the filesystem.");
    drop(bed);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let dir_text = dir.display().to_string();
    if dir.exists() || mounts.contains(&dir_text) {
        return Err(format!("{dir_text} or a mount under it is still there"));
    }
    say(&format!("{dir_text} is gone; no mounts or processes are left."));
    Ok(())
}

/// The protected image: never used, so the least recently used of all.
const PROTECTED_NAME: &str = "tools";

/// What the kubelet's collector would have done from the same start: walk
/// the same order adding the runtime's reported sizes until they cover the
/// bytes to free.
fn kubelet_comparison(plan: &Value, history: &Value, before: &FsUsage, low: u64) {
    let to_free = (before.capacity_bytes * (100 - low) / 100).saturating_sub(before.available_bytes);
    let candidates: Vec<&Value> = plan["removals"]
        .as_array()
        .into_iter()
        .chain(plan["further_space_candidates"].as_array())
        .flatten()
        .collect();
    let removed: Vec<&Value> = history.as_array().into_iter().flatten().collect();
    let mut counted = 0;
    let mut kubelet = 0;
    for candidate in &candidates {
        if counted >= to_free {
            break;
        }
        counted += candidate["size"].as_u64().unwrap_or(0);
        kubelet += 1;
    }
    println!();
    say("For comparison, the kubelet's image GC adds up the reported sizes, which count the");
    say(&format!(
        "shared {BASE_MIB} MiB base in every image, until they cover the {:.0} MiB to free.",
        mib(to_free)
    ));
    if kubelet <= removed.len() {
        let really: u64 = removed[..kubelet]
            .iter()
            .map(|r| r["freed_bytes"].as_u64().unwrap_or(0))
            .sum();
        let ends_at = 100 - (before.available_bytes + really) * 100 / before.capacity_bytes;
        say(&format!(
            "It would stop after {kubelet} image(s), which really free {:.0} MiB: this cycle would end",
            mib(really)
        ));
        say(&format!(
            "at {ends_at}% instead of {low}%, and the rest would wait for its next cycle, 5 minutes later."
        ));
    } else {
        say(&format!(
            "It would remove {kubelet} image(s), {} more than were needed.",
            kubelet - removed.len()
        ));
    }
}

/// The demo's imagegc: the built binary, a configuration file and a state
/// directory inside the test bed's directory.
struct Imagegc {
    binary: PathBuf,
    config: PathBuf,
    state_dir: PathBuf,
    endpoint: String,
}

/// What one `imagegc` command printed.
struct Output {
    args: String,
    code: Option<i32>,
    stdout: String,
}

impl Output {
    fn json(&self) -> Result<Value, String> {
        serde_json::from_str(&self.stdout).map_err(|e| format!("imagegc {} printed no JSON: {e}", self.args))
    }
}

impl Imagegc {
    fn configure(&self, high: u64, low: u64) -> Result<(), String> {
        let toml = format!(
            "[gc]\n\
             high_threshold_percent = {high}\n\
             low_threshold_percent = {low}\n\
             # The default (2m) keeps images this young; the demo's images are seconds old.\n\
             min_age = \"0s\"\n\
             \n\
             [protect]\n\
             images = [\"{PROTECTED}\"]\n\
             \n\
             [metrics]\n\
             # No HTTP endpoint for one-shot commands.\n\
             listen = \"\"\n"
        );
        std::fs::write(&self.config, toml).map_err(|e| format!("writing {}: {e}", self.config.display()))
    }

    /// Runs `imagegc ARGS`; fails unless it exits with one of `codes`.
    fn run(&self, args: &[&str], codes: &[i32]) -> Result<Output, String> {
        let output = Command::new(&self.binary)
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .args(["--runtime-endpoint", &self.endpoint])
            .arg("--state-dir")
            .arg(&self.state_dir)
            .args(["--log-level", "warn"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running {}: {e}", self.binary.display()))?;
        let result = Output {
            args: args.join(" "),
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        };
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !result.code.is_some_and(|c| codes.contains(&c)) {
            return Err(format!(
                "imagegc {} exited with {}:\n{}{stderr}",
                result.args, output.status, result.stdout
            ));
        }
        for line in stderr.lines() {
            say(&format!("(imagegc: {line})"));
        }
        Ok(result)
    }
}

/// High and low thresholds the current usage is past: the defaults when
/// usage is comfortably above them, otherwise just below the usage.
fn thresholds(usage: u64) -> (u64, u64) {
    if usage >= HIGH + 2 {
        (HIGH, LOW)
    } else {
        let high = usage.saturating_sub(2).max(2);
        (high, high.saturating_sub(20).max(1))
    }
}

fn reference(name: &str) -> String {
    format!("docker.io/library/{name}:1")
}

/// A seed per image name, so every image's own layer differs.
fn seed(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The kubelet's usage: `100 - available*100/capacity`, rounded up.
fn percent(usage: &FsUsage) -> u64 {
    100 - usage.available_bytes * 100 / usage.capacity_bytes
}

fn usage_line(usage: &FsUsage) -> String {
    format!(
        "{}% ({:.0} MiB available of {:.0} MiB)",
        percent(usage),
        mib(usage.available_bytes),
        mib(usage.capacity_bytes)
    )
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

fn section(number: usize, title: &str) {
    let heading = format!("{number}. {title}");
    println!("\n{heading}\n{}", "-".repeat(heading.chars().count()));
}

fn say(text: &str) {
    println!("   {text}");
}

/// Command output, indented and marked as such.
fn show(text: &str) {
    println!();
    for line in text.lines() {
        println!("   | {line}");
    }
    println!();
}
