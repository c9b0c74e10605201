//! The race the collector exists to win, on a real containerd.
//!
//! A daemon with the most aggressive settings (high 1 %, low 0 %, min age 0,
//! a cycle every second, a thrash window of two seconds so that an image
//! imported again is walked again) removes every unused image it sees,
//! while a seeded random driver creates, starts, stops and removes
//! containers on a set of small images and imports removed images again,
//! for at least a minute. Two of its moves strike on purpose: a race
//! creates a container on one of the images it imported as the daemon
//! starts re-checking another, and a late race creates one on the image
//! the walk takes second more than a round trip after its re-check
//! (made ahead, beside the first one's removal) was logged.
//! The driver writes down when each container existed and ran; the daemon's
//! debug log says, for every removal, when the re-check of the containers
//! was sent and when the removal began. Afterwards:
//!
//! (a) no removal began while a container on the image existed that was
//!     created (CreateContainer returned) before the re-check was sent and
//!     not yet being removed (RemoveContainer not yet sent) when the removal
//!     began: the re-check saw it, so the image had to be kept;
//! (b) no removal began while such a container was running on the image.
//!
//! (c) no removal began while a container on the image existed that was
//!     created more than [`RECHECK_ROUND_TRIP`] after the re-check was sent:
//!     the re-check had answered long before, and the removal relied on a
//!     stale one.
//!
//! A container whose creation returned only after the re-check was sent
//! cannot have been seen by it: that is the window between the re-check and
//! `RemoveImage` that no CRI client can close, the re-check's own round
//! trip and a few milliseconds. Such containers are counted and reported,
//! not held against the daemon; a creation that returned later than any
//! round trip explains is (c).
//!
//! Free space does not move by removals alone: another writer (a
//! container's log, an emptyDir) writes and truncates or deletes a file of
//! a few hundred KiB to a few MiB on the image filesystem every few
//! milliseconds for the whole run ([`FsWriter`]), as on a node under the
//! pressure imagegc acts on. A removal's measured gain is therefore not
//! what the image took: nothing here checks it. On a filesystem that holds
//! still, the look that confirms a removal's space is short; with the
//! writer it watches for its full second, and a re-check made beside it is
//! a second old when the call is sent unless the daemon makes it again.
//!
//! `IMAGEGC_CHAOS_SECONDS` sets how long the driver runs (default 60) and
//! `IMAGEGC_CHAOS_SEED` replays a run (the seed is printed; the writer's
//! choices come from it too).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use imagegc::cri::proto;
use imagegc_testkit::{XorShift, imagegc_command};
use serde_json::Value;

use crate::oci::{BuiltImage, ImageSpec, Layer};
use crate::testbed::{ContainerId, Kind, PodId, TestBed, statvfs};

mod analysis;
mod driver;
mod log;
mod writer;

use analysis::*;
use driver::*;
pub use log::*;
use writer::*;

const MIB: u64 = 1024 * 1024;
/// How long the driver runs unless `IMAGEGC_CHAOS_SECONDS` says otherwise.
const DEFAULT_SECONDS: u64 = 60;
/// Images the driver plays with: each a shared base and 1-3 MiB of its own.
const IMAGE_COUNT: u64 = 16;
const POD_COUNT: usize = 4;
/// Containers that may exist at once; at the limit the driver removes
/// instead of creating, which keeps the machine's load bounded.
const MAX_CONTAINERS: usize = 12;
/// Pause between two operations, in milliseconds (drawn uniformly): with the
/// operations' own latency, a few operations per second.
const PAUSE_MS: (u64, u64) = (50, 400);
/// How many images a pull brings back.
const PULL_IMAGES: (u64, u64) = (1, 3);
/// How many images a race imports: the daemon's walk over several unused
/// images is what the race strikes into.
const RACE_IMAGES: (u64, u64) = (3, 5);
/// How long a freshly imported image may take to show up in CRI before the
/// driver stops waiting for it (the daemon may have removed it already).
const VISIBLE_WAIT: Duration = Duration::from_secs(2);
/// How long a race waits for the daemon to start removing the images it
/// imported (a cycle runs every second).
const RACE_WAIT: Duration = Duration::from_millis(2500);
/// How long a late race waits for the re-check of its target (the walk's
/// second image, re-checked about one removal after the first).
const LATE_RACE_WAIT: Duration = Duration::from_secs(4);
/// How long after its target's re-check was logged a late race creates a
/// container on it, in milliseconds (drawn uniformly): after any round
/// trip ([`RECHECK_ROUND_TRIP`]) and before the second a confirming look
/// can watch a moving disk is over.
const LATE_RACE_DELAY_MS: (u64, u64) = (520, 760);
/// How long the daemon keeps running after the driver stops, so that it
/// runs a few cycles on the final state.
const SETTLE: Duration = Duration::from_secs(3);
/// How long the daemon may take to exit after SIGTERM (its own grace for
/// an in-flight cycle is 20 s).
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest the re-check's own round trip (`ListContainers` and
/// `ImageStatus` at once, a few milliseconds here) is taken to last: a
/// container created later than this after the re-check was sent was
/// created after it answered. Far above the round trip on a loaded
/// machine, half the second a confirming look can watch a moving disk
/// (the daemon's `SETTLE_TIMEOUT`).
const RECHECK_ROUND_TRIP: Duration = Duration::from_millis(500);
/// The other writer's file grows to this many bytes (drawn uniformly)
/// before it is truncated or deleted: at most 3 MiB of the 800 MiB
/// filesystem, so the thresholds still mean what they say.
const WRITER_FILE: (u64, u64) = (256 * 1024, 3 * MIB);
/// One write of the other writer, in bytes (drawn uniformly).
const WRITER_CHUNK: (u64, u64) = (32 * 1024, 256 * 1024);
/// Pause after each write, truncation or deletion, in milliseconds (drawn
/// uniformly): free space moves between any two of the daemon's readings
/// while it watches a removal's space (every 20 ms).
const WRITER_PAUSE_MS: (u64, u64) = (3, 12);

const CHECK_MESSAGE: &str = "re-checking containers before removal";
const REMOVING_MESSAGE: &str = "no container uses the image: removing it";
const KEPT_MESSAGE: &str = "image came into use; keeping it";
const REMOVED_MESSAGE: &str = "removed image";
/// The start of the lines of a re-check that went stale between its answer
/// and the call (made again, or the image kept): the removal logged just
/// before was not sent.
const STALE_MESSAGE: &str = "the re-check went stale before";
const REMOVE_FAILED_MESSAGE: &str = "could not remove image";
const REPULLED_MESSAGE: &str = "an image imagegc removed was pulled again";

async fn no_image_is_removed_from_under_a_container_while_containers_come_and_go(kind: Kind) {
    let seconds = env_u64("IMAGEGC_CHAOS_SECONDS").unwrap_or(DEFAULT_SECONDS);
    let seed = env_u64("IMAGEGC_CHAOS_SEED").unwrap_or_else(|| {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
        (nanos as u64) ^ u64::from(std::process::id())
    });
    println!("chaos: seed {seed} (IMAGEGC_CHAOS_SEED={seed} replays the driver's choices), {seconds} s");

    let bed = TestBed::start(kind, 800).await;
    let tarballs = bed.dir().join("chaos-images");
    fs::create_dir_all(&tarballs).expect("creating the tarball directory");
    let mut images = Vec::new();
    for n in 0..IMAGE_COUNT {
        let spec = ImageSpec::new(&format!("docker.io/library/chaos-{n}:1"))
            .layer(Layer::shared_base(2 * MIB))
            .layer(Layer::random(0xc4a0_5000 + n, (1 + n % 3) * MIB));
        let tarball = tarballs.join(format!("chaos-{n}.tar"));
        let built = spec
            .write_layout(&tarball)
            .unwrap_or_else(|e| panic!("writing {}: {e}", tarball.display()));
        assert_eq!(bed.import(&spec).await, built);
        images.push(ChaosImage { built, tarball });
    }
    let mut pods = Vec::new();
    for n in 0..POD_COUNT {
        pods.push(bed.run_pod(&format!("chaos-{n}")).await);
    }
    let mut driver = Driver {
        bed: &bed,
        images,
        pods,
        rng: XorShift::new(seed),
        lives: Vec::new(),
        ops: BTreeMap::new(),
        refusals: Vec::new(),
        tarballs,
        log: LogTail::new(PathBuf::new()),
        t0: SystemTime::now(),
    };
    // Half the images start in use, half of those by running containers.
    for image in 0..IMAGE_COUNT as usize / 2 {
        driver.create(image, image % 2 == 0, "create").await;
    }
    // Free space moves from before the daemon's first cycle to after its
    // last; stopped and joined on every way out (panics included) before
    // the test bed goes.
    let writer = FsWriter::start(&bed.image_fs_mount().join("chaos-writer"), seed);
    // Low 0 % is out of reach: with the default thrash window (1 h) every
    // image removed once and imported again would be left alone for the
    // rest of the run, and the races would strike at nothing. Two seconds
    // keep re-pulls noticed right after a removal and let the walk take an
    // image again once the driver imports it again.
    let mut daemon = Daemon::start(
        bed.endpoint(),
        r#"[gc]
high_threshold_percent = 1
low_threshold_percent = 0
min_age = "0s"
interval = "1s"
usage_poll_interval = "1s"
thrash_window = "2s"

[metrics]
listen = ""
"#,
    );
    driver.log = LogTail::new(daemon.log_path());
    let started = Instant::now();
    driver.run(Duration::from_secs(seconds)).await;
    let drove = started.elapsed();
    tokio::time::sleep(SETTLE).await;
    let final_containers = bed.list_containers().await;
    let final_images = bed.list_image_ids().await;
    let stopping = Instant::now();
    let status = daemon.terminate();
    println!(
        "chaos: the daemon exited {} ms after SIGTERM",
        stopping.elapsed().as_millis()
    );
    let writes = writer.stop();
    let log = daemon.log();
    let history = daemon.history();
    driver.clean_up().await;

    let analysis = Analysis::of(&log, &driver);
    let removed = log.iter().filter(|l| l.message == REMOVED_MESSAGE).count();
    let report = summary(seed, drove, &driver, &analysis, &log, history.len(), &writes);
    println!("{report}");
    for refusal in driver.refusals.iter().take(10) {
        println!("chaos: refused: {refusal}");
    }
    if analysis.saves == 0 {
        println!("chaos: note: no container was created between a listing and a re-check in this run");
    }

    assert!(
        status.success(),
        "imagegc run exited with {status} after SIGTERM; last lines of its log:\n{}",
        daemon.log_tail(30)
    );
    assert!(
        writes.error.is_none() && writes.moves as f64 >= drove.as_secs_f64() * 10.0,
        "{report}the other writer did not keep free space moving"
    );
    if !analysis.violations.is_empty() {
        let mut evidence = String::new();
        for violation in &analysis.violations {
            let _ = writeln!(evidence, "{}", driver.describe(violation, &log));
        }
        panic!(
            "{report}the daemon removed images that containers it could see were using (seed {seed}):\n{evidence}\
             daemon log kept at {}",
            daemon.keep()
        );
    }
    assert!(
        !analysis.removals.is_empty() && analysis.removals.len() as u64 >= seconds / 6,
        "{report}too few removals for the run to mean anything; last lines of the daemon's log:\n{}",
        daemon.log_tail(30)
    );
    assert_eq!(
        history.len(),
        removed,
        "{report}the journal must hold one entry per successful removal"
    );
    // The final state: every container's image is still there unless the
    // container was created across the re-check of the removal that took it.
    let window_lost: BTreeSet<(&str, &str)> = analysis
        .window
        .iter()
        .map(|w| (w.container.as_str(), w.image.as_str()))
        .collect();
    for container in &final_containers {
        // The id: `image_id` where the runtime sets it (containerd 2.x,
        // CRI-O, whose `image_ref` is a repo digest), else `image_ref`.
        let image = if container.image_id.is_empty() {
            container.image_ref.as_str()
        } else {
            container.image_id.as_str()
        };
        assert!(
            final_images.contains(image) || window_lost.contains(&(container.id.as_str(), image)),
            "{report}container {} outlived its image {image}, which was not removed across its creation",
            container.id
        );
    }
}

/// What the run covered, one line per fact.
fn summary(
    seed: u64,
    drove: Duration,
    driver: &Driver<'_>,
    analysis: &Analysis,
    log: &[LogLine],
    journal_entries: usize,
    writes: &WriterStats,
) -> String {
    let count = |message: &str| log.iter().filter(|l| l.message.starts_with(message)).count();
    let violations = |kind: Breach| analysis.violations.iter().filter(|v| v.kind == kind).count();
    let gap = |r: &Removal| r.removal.duration_since(r.check).unwrap_or_default();
    let mut gaps: Vec<Duration> = analysis.removals.iter().map(gap).collect();
    gaps.sort();
    let gap_at = |q: f64| {
        gaps.get(((gaps.len() as f64 - 1.0) * q).round() as usize)
            .map_or(0, Duration::as_millis)
    };
    format!(
        "chaos: seed {seed}; the driver ran {:.1} s\n\
         chaos: operations {:?}\n\
         chaos: {} containers lived; the runtime refused {} calls (an image removed under them)\n\
         chaos: {} removals checked ({} succeeded, {} failed) in {} cycles; {} images kept by the re-check; \
         {} re-pulls noticed; {} journal entries\n\
         chaos: the other writer: {} writes ({} MiB), {} truncations or deletions, free space seen moving {} times{}\n\
         chaos: re-check sent to removal began: median {} ms, p99 {} ms, max {} ms; {} re-checks went stale \
         and were made again or kept\n\
         chaos: {} containers created across a re-check (the window no client can close), {} of them running \
         when the removal began\n\
         chaos: violations: (a) {} removals under an existing container, (b) {} under a running one, \
         (c) {} under one created after the re-check had answered\n",
        drove.as_secs_f64(),
        driver.ops,
        driver.lives.len(),
        driver.refusals.len(),
        analysis.removals.len(),
        count(REMOVED_MESSAGE),
        count(REMOVE_FAILED_MESSAGE),
        count("cycle finished") + count("cycle could not reach"),
        analysis.saves,
        count(REPULLED_MESSAGE),
        journal_entries,
        writes.writes,
        writes.bytes / MIB,
        writes.resets,
        writes.moves,
        writes
            .error
            .as_ref()
            .map_or(String::new(), |e| format!("; stopped on: {e}")),
        gap_at(0.5),
        gap_at(0.99),
        gap_at(1.0),
        count(STALE_MESSAGE),
        analysis.window.len(),
        analysis.window.iter().filter(|w| w.running).count(),
        violations(Breach::Existed),
        violations(Breach::Running),
        violations(Breach::Stale),
    )
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{name}={value:?} is not a number: {e}")),
    )
}

on_every_runtime!(no_image_is_removed_from_under_a_container_while_containers_come_and_go,);
