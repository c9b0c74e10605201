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
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use imagegc::cri::proto;
use imagegc_testkit::imagegc_command;
use serde_json::Value;

use crate::oci::{BuiltImage, ImageSpec, Layer};
use crate::testbed::{ContainerId, Kind, PodId, TestBed, statvfs};

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

/// One image the driver plays with, and its layout tarball, written once
/// and imported again whenever the driver pulls the image.
struct ChaosImage {
    built: BuiltImage,
    tarball: PathBuf,
}

/// A container's life as the driver lived it, in wall-clock times.
#[derive(Debug, Clone)]
struct Life {
    id: ContainerId,
    image: usize,
    create_sent: SystemTime,
    create_done: SystemTime,
    /// When StartContainer returned.
    start_done: Option<SystemTime>,
    stop_sent: Option<SystemTime>,
    remove_sent: Option<SystemTime>,
}

impl Life {
    fn is_live(&self) -> bool {
        self.remove_sent.is_none()
    }

    fn is_running(&self) -> bool {
        self.start_done.is_some() && self.stop_sent.is_none()
    }

    /// Visible to a re-check sent at `check` and not yet being removed when
    /// the removal began at `removal`.
    fn seen_through(&self, check: SystemTime, removal: SystemTime) -> bool {
        self.create_done < check && self.remove_sent.is_none_or(|t| t > removal)
    }

    fn running_at(&self, t: SystemTime) -> bool {
        self.start_done.is_some_and(|s| s < t) && self.stop_sent.is_none_or(|s| s > t)
    }

    /// Created across a re-check: sent before the removal ended (`done`;
    /// None when the daemon stopped before logging it), returned after the
    /// re-check was sent, and not removed before that re-check.
    fn created_across(&self, check: SystemTime, done: Option<SystemTime>) -> bool {
        done.is_none_or(|d| self.create_sent < d)
            && self.create_done >= check
            && self.remove_sent.is_none_or(|t| t > check)
    }

    /// Created after the re-check answered (later than any round trip
    /// explains) and before the removal began, and not yet being removed
    /// then: the removal relied on a stale re-check.
    fn created_after_answer(&self, check: SystemTime, removal: SystemTime) -> bool {
        self.create_done > check + RECHECK_ROUND_TRIP
            && self.create_done < removal
            && self.remove_sent.is_none_or(|t| t > removal)
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Create,
    PullAndRun,
    Pull,
    Race,
    LateRace,
    Start,
    Stop,
    Remove,
}

/// The random driver and what it recorded.
struct Driver<'a> {
    bed: &'a TestBed,
    images: Vec<ChaosImage>,
    pods: Vec<PodId>,
    rng: XorShift,
    lives: Vec<Life>,
    ops: BTreeMap<&'static str, u64>,
    /// CreateContainer and StartContainer calls the runtime refused, and
    /// imports that failed, with why: the daemon removed the image under
    /// them.
    refusals: Vec<String>,
    /// Where the images' tarballs are, and bundles of them are written.
    tarballs: PathBuf,
    log: LogTail,
    t0: SystemTime,
}

impl Driver<'_> {
    async fn run(&mut self, duration: Duration) {
        let deadline = Instant::now() + duration;
        while Instant::now() < deadline {
            self.step().await;
            let pause = self.rng.between(PAUSE_MS.0, PAUSE_MS.1);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }

    /// One operation, drawn with weights among those the state allows.
    async fn step(&mut self) {
        let present = self.bed.list_image_ids().await;
        let live: Vec<usize> = (0..self.lives.len()).filter(|&i| self.lives[i].is_live()).collect();
        let created: Vec<usize> = live
            .iter()
            .copied()
            .filter(|&i| self.lives[i].start_done.is_none() && self.lives[i].stop_sent.is_none())
            .collect();
        let running: Vec<usize> = live.iter().copied().filter(|&i| self.lives[i].is_running()).collect();
        let available: Vec<usize> = (0..self.images.len())
            .filter(|&i| present.contains(&self.images[i].built.id))
            .collect();
        let missing: Vec<usize> = (0..self.images.len()).filter(|i| !available.contains(i)).collect();
        let room = live.len() < MAX_CONTAINERS;
        let choices = [
            (Op::Create, if room && !available.is_empty() { 25 } else { 0 }),
            (Op::PullAndRun, if room && !missing.is_empty() { 15 } else { 0 }),
            (Op::Pull, if missing.is_empty() { 0 } else { 10 }),
            (Op::Race, if room && missing.len() >= 2 { 25 } else { 0 }),
            (Op::LateRace, if room && missing.len() >= 2 { 15 } else { 0 }),
            (Op::Start, if created.is_empty() { 0 } else { 8 }),
            (Op::Stop, if running.is_empty() { 0 } else { 15 }),
            (Op::Remove, if live.is_empty() { 0 } else { 25 }),
        ];
        let total: u64 = choices.iter().map(|(_, w)| w).sum();
        if total == 0 {
            return;
        }
        let mut roll = self.rng.below(total);
        let op = choices
            .iter()
            .find(|(_, weight)| {
                let hit = roll < *weight;
                roll = roll.saturating_sub(*weight);
                hit
            })
            .map(|(op, _)| *op)
            .expect("the roll is below the total weight");
        match op {
            Op::Create => {
                // Prefer an image no container uses: the daemon is about to
                // remove exactly those.
                let used: BTreeSet<usize> = live.iter().map(|&i| self.lives[i].image).collect();
                let unused: Vec<usize> = available.iter().copied().filter(|i| !used.contains(i)).collect();
                let pool = if !unused.is_empty() && self.rng.chance(70) {
                    unused
                } else {
                    available
                };
                let image = *self.rng.pick(&pool).expect("a present image");
                let start = self.rng.chance(50);
                self.create(image, start, "create").await;
            }
            Op::PullAndRun => {
                let image = *self.rng.pick(&missing).expect("a missing image");
                self.pull_and_run(image).await;
            }
            Op::Pull => {
                let images = self.draw(&missing, PULL_IMAGES);
                self.import(&images).await;
            }
            Op::Race => {
                let images = self.draw(&missing, RACE_IMAGES);
                self.race(&images).await;
            }
            Op::LateRace => {
                let images = self.draw(&missing, RACE_IMAGES);
                self.late_race(&images).await;
            }
            Op::Start => {
                let i = *self.rng.pick(&created).expect("a created container");
                self.start(i).await;
            }
            Op::Stop => {
                let i = *self.rng.pick(&running).expect("a running container");
                self.stop(i).await;
            }
            Op::Remove => {
                let i = *self.rng.pick(&live).expect("a container");
                self.remove(i).await;
            }
        }
    }

    fn count(&mut self, op: &'static str) {
        *self.ops.entry(op).or_default() += 1;
    }

    /// Distinct images drawn from `pool` (not empty): between `range.0`
    /// and `range.1`, and no more than the pool has.
    fn draw(&mut self, pool: &[usize], range: (u64, u64)) -> Vec<usize> {
        let mut pool = pool.to_vec();
        let mut drawn = Vec::new();
        for _ in 0..self.rng.between(range.0, range.1).min(pool.len() as u64) {
            let i = self.rng.below(pool.len() as u64) as usize;
            drawn.push(pool.swap_remove(i));
        }
        drawn
    }

    /// Imports `images` in one go (one `ctr` run on containerd, pushes and
    /// pulls on CRI-O), as a node pulling a pod's images does; returns them,
    /// or nothing when the import failed.
    async fn import(&mut self, images: &[usize]) -> Vec<usize> {
        *self.ops.entry("import").or_default() += images.len() as u64;
        let names: Vec<String> = images
            .iter()
            .map(|&i| self.images[i].built.name().to_string())
            .collect();
        let result = match images {
            [one] => self.bed.import_tarball(&self.images[*one].tarball, &names).await,
            _ => {
                let bundle = self.tarballs.join("bundle.tar");
                let tarballs: Vec<&Path> = images.iter().map(|&i| self.images[i].tarball.as_path()).collect();
                bundle_layouts(&tarballs, &bundle).unwrap_or_else(|e| panic!("writing {}: {e}", bundle.display()));
                self.bed.import_tarball(&bundle, &names).await
            }
        };
        match result {
            Ok(()) => images.to_vec(),
            Err(e) => {
                let refusal = format!("import {names:?}: {e}");
                self.count("import failed");
                self.refusals.push(refusal);
                Vec::new()
            }
        }
    }

    /// Imports a few images at once, waits for the daemon to start removing
    /// one of them, and at that moment creates a container on another: the
    /// race the re-check exists for, struck on purpose.
    async fn race(&mut self, images: &[usize]) {
        self.count("race");
        self.log.read();
        let from = self.log.len();
        let imported = self.import(images).await;
        if imported.is_empty() {
            return;
        }
        let deadline = Instant::now() + RACE_WAIT;
        let mut checked = None;
        while checked.is_none() && Instant::now() < deadline {
            checked = self.log.next_check(from, |id| {
                imported.iter().copied().find(|&i| self.images[i].built.id == id)
            });
            if checked.is_none() {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        let others: Vec<usize> = imported.iter().copied().filter(|&i| Some(i) != checked).collect();
        // Images with the same history are walked in id order, so the one
        // with the highest id is re-checked last: aim there, giving the
        // creation the most time to land before its re-check.
        let target = match checked {
            Some(_) => others.iter().copied().max_by_key(|&i| &self.images[i].built.id),
            None => {
                self.count("race: no removal seen");
                self.rng.pick(&others).copied()
            }
        };
        let Some(target) = target else {
            return;
        };
        let start = self.rng.chance(50);
        self.create(target, start, "create in race").await;
    }

    /// Imports a few images at once, waits for the re-check of the one the
    /// walk takes second (images with the same history are walked in id
    /// order), which the daemon makes ahead, beside the first one's
    /// removal, and creates a container on it once that re-check has long
    /// answered: a daemon that sends `RemoveImage` on the strength of that
    /// re-check after the look at the moving disk removes the image from
    /// under the container (c); one that re-checks again right before the
    /// call keeps it.
    async fn late_race(&mut self, images: &[usize]) {
        self.count("late race");
        self.log.read();
        let from = self.log.len();
        let mut imported = self.import(images).await;
        if imported.len() < 2 {
            return;
        }
        imported.sort_by(|&a, &b| self.images[a].built.id.cmp(&self.images[b].built.id));
        let target = imported[1];
        let target_id = self.images[target].built.id.clone();
        let deadline = Instant::now() + LATE_RACE_WAIT;
        let mut checked = false;
        while !checked && Instant::now() < deadline {
            checked = self
                .log
                .next_check(from, |id| (id == target_id).then_some(()))
                .is_some();
            if !checked {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        if !checked {
            self.count("late race: no re-check seen");
            return;
        }
        let delay = self.rng.between(LATE_RACE_DELAY_MS.0, LATE_RACE_DELAY_MS.1);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let start = self.rng.chance(50);
        self.create(target, start, "create in late race").await;
    }

    /// Imports a missing image and runs a container on it once CRI lists
    /// it, after a random delay: what a kubelet does after a pull, landing
    /// anywhere in the daemon's cycle.
    async fn pull_and_run(&mut self, image: usize) {
        if self.import(&[image]).await.is_empty() {
            return;
        }
        if !self.wait_visible(image).await {
            self.count("pulled image gone before the run");
            return;
        }
        let delay = self.rng.between(0, 700);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let start = self.rng.chance(70);
        self.create(image, start, "create after pull").await;
    }

    async fn wait_visible(&self, image: usize) -> bool {
        let deadline = Instant::now() + VISIBLE_WAIT;
        while Instant::now() < deadline {
            if self.bed.list_image_ids().await.contains(&self.images[image].built.id) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    async fn create(&mut self, image: usize, start: bool, op: &'static str) {
        let pod = self.pods[self.rng.below(self.pods.len() as u64) as usize].clone();
        let name = self.images[image].built.name().to_string();
        self.count(op);
        let create_sent = SystemTime::now();
        let result = self.bed.try_create_container(&pod, &name).await;
        let create_done = SystemTime::now();
        match result {
            Ok(id) => {
                self.lives.push(Life {
                    id,
                    image,
                    create_sent,
                    create_done,
                    start_done: None,
                    stop_sent: None,
                    remove_sent: None,
                });
                if start {
                    self.start(self.lives.len() - 1).await;
                }
            }
            Err(status) => {
                self.count("create refused");
                self.refusals.push(format!(
                    "CreateContainer {name} at +{} ms: {}",
                    self.ms(create_sent),
                    status.message()
                ));
            }
        }
    }

    async fn start(&mut self, i: usize) {
        self.count("start");
        let request = proto::StartContainerRequest {
            container_id: self.lives[i].id.0.clone(),
        };
        match self.bed.client().runtime_service().start_container(request).await {
            Ok(_) => self.lives[i].start_done = Some(SystemTime::now()),
            Err(status) => {
                self.count("start refused");
                let name = self.images[self.lives[i].image].built.name();
                self.refusals
                    .push(format!("StartContainer on {name}: {}", status.message()));
            }
        }
    }

    async fn stop(&mut self, i: usize) {
        self.count("stop");
        self.lives[i].stop_sent = Some(SystemTime::now());
        self.bed.stop_container(&self.lives[i].id).await;
    }

    async fn remove(&mut self, i: usize) {
        if self.lives[i].is_running() {
            self.stop(i).await;
        }
        self.count("remove");
        self.lives[i].remove_sent = Some(SystemTime::now());
        self.bed.remove_container(&self.lives[i].id).await;
    }

    /// Removes every container and pod left.
    async fn clean_up(&mut self) {
        for i in 0..self.lives.len() {
            if self.lives[i].is_live() {
                if self.lives[i].is_running() {
                    self.lives[i].stop_sent = Some(SystemTime::now());
                    self.bed.stop_container(&self.lives[i].id).await;
                }
                self.lives[i].remove_sent = Some(SystemTime::now());
                self.bed.remove_container(&self.lives[i].id).await;
            }
        }
        for pod in std::mem::take(&mut self.pods) {
            self.bed.stop_pod(&pod).await;
            self.bed.remove_pod(&pod).await;
        }
    }

    /// Milliseconds since the driver started.
    fn ms(&self, t: SystemTime) -> i64 {
        match t.duration_since(self.t0) {
            Ok(d) => d.as_millis() as i64,
            Err(e) => -(e.duration().as_millis() as i64),
        }
    }

    fn describe(&self, violation: &Violation, log: &[LogLine]) -> String {
        let removal = &violation.removal;
        let life = &self.lives[violation.life];
        let image = &self.images[life.image].built;
        let at =
            |t: Option<SystemTime>| t.map_or("never".to_string(), |t| format!("+{:.3} s", self.ms(t) as f64 / 1000.0));
        let mut text = format!(
            "  {} ({}) removal: re-check sent {}, removal began {}, {} {}\n    \
             container {}: create sent {}, create returned {}, start returned {}, stop sent {}, remove sent {} ({})\n",
            image.name(),
            image.id,
            at(Some(removal.check)),
            at(Some(removal.removal)),
            removal.outcome,
            at(removal.done),
            life.id.as_str(),
            at(Some(life.create_sent)),
            at(Some(life.create_done)),
            at(life.start_done),
            at(life.stop_sent),
            at(life.remove_sent),
            match violation.kind {
                Breach::Running => "(b) running",
                Breach::Existed => "(a) existed",
                Breach::Stale => "(c) created after the re-check answered",
            },
        );
        for line in log
            .iter()
            .filter(|l| l.image.as_deref() == Some(image.id.as_str()))
            .filter(|l| l.time.is_some_and(|t| t.duration_since(removal.check).is_ok()))
            .take(4)
        {
            let _ = writeln!(text, "    log: {}", line.raw);
        }
        text
    }
}

/// A removal that began, from the daemon's log.
#[derive(Debug, Clone)]
struct Removal {
    image: String,
    /// When the re-check of the containers was about to be sent.
    check: SystemTime,
    /// When the re-check had found no user and `RemoveImage` was next.
    removal: SystemTime,
    /// When the outcome was logged, after `RemoveImage` returned.
    done: Option<SystemTime>,
    outcome: &'static str,
}

#[derive(Debug)]
struct Violation {
    removal: Removal,
    life: usize,
    kind: Breach,
}

/// Which of the checks a removal broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Breach {
    /// (a) a container the re-check saw existed when the removal began.
    Existed,
    /// (b) one it saw was running.
    Running,
    /// (c) one created after the re-check answered existed.
    Stale,
}

#[derive(Debug)]
struct Window {
    container: String,
    image: String,
    running: bool,
}

/// The daemon's removals checked against the driver's record.
struct Analysis {
    removals: Vec<Removal>,
    saves: usize,
    violations: Vec<Violation>,
    window: Vec<Window>,
}

impl Analysis {
    fn of(log: &[LogLine], driver: &Driver<'_>) -> Analysis {
        let removals = removals(log);
        let saves = log.iter().filter(|l| l.message == KEPT_MESSAGE).count();
        let by_id: HashMap<&str, usize> = driver
            .images
            .iter()
            .enumerate()
            .map(|(i, image)| (image.built.id.as_str(), i))
            .collect();
        let mut violations = Vec::new();
        let mut window = Vec::new();
        for removal in &removals {
            let Some(&image) = by_id.get(removal.image.as_str()) else {
                continue;
            };
            for (i, life) in driver.lives.iter().enumerate().filter(|(_, l)| l.image == image) {
                if life.seen_through(removal.check, removal.removal) {
                    violations.push(Violation {
                        removal: removal.clone(),
                        life: i,
                        kind: if life.running_at(removal.removal) {
                            Breach::Running
                        } else {
                            Breach::Existed
                        },
                    });
                } else if life.created_after_answer(removal.check, removal.removal) {
                    violations.push(Violation {
                        removal: removal.clone(),
                        life: i,
                        kind: Breach::Stale,
                    });
                } else if life.created_across(removal.check, removal.done) {
                    window.push(Window {
                        container: life.id.0.clone(),
                        image: removal.image.clone(),
                        running: life.running_at(removal.removal),
                    });
                }
            }
        }
        Analysis {
            removals,
            saves,
            violations,
            window,
        }
    }
}

/// Pairs each "removing it" line with the re-check line before it for the
/// same image, and notes how the removal ended. Panics when the log does not
/// have that shape: the test would otherwise check nothing.
fn removals(log: &[LogLine]) -> Vec<Removal> {
    let mut removals: Vec<Removal> = Vec::new();
    let mut pending: Option<(String, SystemTime)> = None;
    for line in log {
        let image = || {
            line.image
                .clone()
                .unwrap_or_else(|| panic!("a removal line without an image field: {}", line.raw))
        };
        let time = || {
            line.time
                .unwrap_or_else(|| panic!("a removal line without a timestamp: {}", line.raw))
        };
        match line.message.as_str() {
            CHECK_MESSAGE => pending = Some((image(), time())),
            REMOVING_MESSAGE => {
                let (checked, check) = pending
                    .take()
                    .unwrap_or_else(|| panic!("a removal without a re-check before it: {}", line.raw));
                assert_eq!(
                    checked,
                    image(),
                    "the re-check before {} was for another image",
                    line.raw
                );
                removals.push(Removal {
                    image: image(),
                    check,
                    removal: time(),
                    done: None,
                    outcome: "unknown (the daemon stopped)",
                });
            }
            KEPT_MESSAGE => pending = None,
            // The re-check went stale between its answer and the call: no
            // removal was sent on it (the daemon re-checks again, or keeps
            // the image).
            message if message.starts_with(STALE_MESSAGE) => match &pending {
                Some((checked, _)) if *checked == image() => pending = None,
                _ => panic!("a stale re-check without its re-check: {}", line.raw),
            },
            REMOVED_MESSAGE | REMOVE_FAILED_MESSAGE => {
                let removal = removals
                    .last_mut()
                    .filter(|r| r.image == image())
                    .unwrap_or_else(|| panic!("a removal outcome without its removal: {}", line.raw));
                removal.done = Some(time());
                removal.outcome = if line.message == REMOVED_MESSAGE {
                    "removed"
                } else {
                    "failed"
                };
            }
            _ => {}
        }
    }
    removals
}

/// Merges OCI layout tarballs into one whose index lists every image, so
/// that one import takes them all (blobs they share are written once).
fn bundle_layouts(tarballs: &[&Path], out: &Path) -> std::io::Result<()> {
    let mut builder = tar::Builder::new(std::io::BufWriter::new(fs::File::create(out)?));
    let mut written = BTreeSet::new();
    let mut manifests = Vec::new();
    let mut layout = None;
    for tarball in tarballs {
        let mut archive = tar::Archive::new(fs::File::open(tarball)?);
        for entry in archive.entries()? {
            let mut entry = entry?;
            let path = entry.path()?.to_string_lossy().into_owned();
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut bytes)?;
            match path.as_str() {
                "index.json" => {
                    let index: Value = serde_json::from_slice(&bytes)?;
                    manifests.extend(index["manifests"].as_array().cloned().unwrap_or_default());
                }
                "oci-layout" => layout = Some(bytes),
                _ if written.insert(path.clone()) => {
                    let mut header = entry.header().clone();
                    builder.append_data(&mut header, &path, bytes.as_slice())?;
                }
                _ => {}
            }
        }
    }
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": crate::oci::INDEX_MEDIA_TYPE,
        "manifests": manifests,
    }))?;
    for (path, bytes) in [("oci-layout", layout.unwrap_or_default()), ("index.json", index)] {
        let mut header = tar::Header::new_ustar();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut header, path, bytes.as_slice())?;
    }
    builder
        .into_inner()?
        .into_inner()
        .map_err(std::io::IntoInnerError::into_error)?
        .sync_all()
}

/// The daemon's log as it grows, read by the driver to strike while a
/// removal walk is under way.
struct LogTail {
    path: PathBuf,
    lines: Vec<LogLine>,
    partial: String,
    offset: u64,
}

impl LogTail {
    fn new(path: PathBuf) -> Self {
        LogTail {
            path,
            lines: Vec::new(),
            partial: String::new(),
            offset: 0,
        }
    }

    /// Lines read so far.
    fn len(&self) -> usize {
        self.lines.len()
    }

    fn read(&mut self) {
        use std::io::{Read, Seek, SeekFrom};
        let Ok(mut file) = fs::File::open(&self.path) else {
            return;
        };
        let mut fresh = String::new();
        if file.seek(SeekFrom::Start(self.offset)).is_err() || file.read_to_string(&mut fresh).is_err() {
            return;
        }
        self.offset += fresh.len() as u64;
        self.partial.push_str(&fresh);
        while let Some(end) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=end).collect();
            self.lines.push(LogLine::parse(line.trim_end()));
        }
    }

    /// The first re-check logged at or after line `from` whose image `pick`
    /// recognises, reading what the daemon wrote since the last call.
    fn next_check<T>(&mut self, from: usize, pick: impl Fn(&str) -> Option<T>) -> Option<T> {
        self.read();
        self.lines[from.min(self.lines.len())..]
            .iter()
            .filter(|l| l.message == CHECK_MESSAGE)
            .find_map(|l| pick(l.image.as_deref()?))
    }
}

/// Another writer on the image filesystem, on a thread of its own: it
/// writes a file in chunks up to a drawn size, then truncates or deletes it
/// (a container's log rotated away, an emptyDir emptied), and again, with a
/// few milliseconds between any two steps, so that free space moves between
/// any two readings of the daemon. Stopped and joined when dropped (a
/// panicking test included), so it never writes under an unmount.
struct FsWriter {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<WriterStats>>,
}

/// What the other writer did.
#[derive(Debug, Default)]
struct WriterStats {
    writes: u64,
    bytes: u64,
    resets: u64,
    /// Steps after which the filesystem's available space differed from
    /// the reading after the step before.
    moves: u64,
    /// Why it stopped early, when it did.
    error: Option<String>,
}

impl FsWriter {
    /// Starts writing in `dir` (created, on the filesystem to keep
    /// moving), with choices drawn from `seed`.
    fn start(dir: &Path, seed: u64) -> FsWriter {
        fs::create_dir_all(dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let stop = Arc::new(AtomicBool::new(false));
        let dir = dir.to_path_buf();
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("chaos-writer".to_string())
            .spawn(move || {
                let mut stats = WriterStats::default();
                if let Err(e) = Self::write(&dir, seed, &stopping, &mut stats) {
                    stats.error = Some(e.to_string());
                }
                let _ = fs::remove_file(dir.join("container.log"));
                stats
            })
            .expect("starting the other writer's thread");
        FsWriter {
            stop,
            thread: Some(thread),
        }
    }

    fn write(dir: &Path, seed: u64, stop: &AtomicBool, stats: &mut WriterStats) -> std::io::Result<()> {
        use std::io::Write;
        let mut rng = XorShift::new(seed ^ 0x0077_7269_7465_7200);
        let path = dir.join("container.log");
        let chunk = vec![b'.'; WRITER_CHUNK.1 as usize];
        let mut last = statvfs(dir).available_bytes;
        let mut step = |rng: &mut XorShift, stats: &mut WriterStats| {
            let now = statvfs(dir).available_bytes;
            if now != last {
                stats.moves += 1;
            }
            last = now;
            std::thread::sleep(Duration::from_millis(rng.between(WRITER_PAUSE_MS.0, WRITER_PAUSE_MS.1)));
        };
        while !stop.load(Ordering::Relaxed) {
            let size = rng.between(WRITER_FILE.0, WRITER_FILE.1);
            let mut file = fs::OpenOptions::new().create(true).append(true).open(&path)?;
            let mut written = 0;
            while written < size && !stop.load(Ordering::Relaxed) {
                let n = rng.between(WRITER_CHUNK.0, WRITER_CHUNK.1).min(size - written);
                file.write_all(&chunk[..n as usize])?;
                written += n;
                stats.writes += 1;
                stats.bytes += n;
                step(&mut rng, stats);
            }
            if rng.chance(50) {
                file.set_len(0)?;
            } else {
                drop(file);
                fs::remove_file(&path)?;
            }
            stats.resets += 1;
            step(&mut rng, stats);
        }
        Ok(())
    }

    /// Stops the writer and says what it did.
    fn stop(mut self) -> WriterStats {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().expect("the writer runs until stopped");
        thread.join().expect("the other writer panicked")
    }
}

impl Drop for FsWriter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// An `imagegc run` process with its own directory (configuration, state
/// and captured stderr), logging JSON at debug level. Killed if still
/// running when dropped; its directory is kept when the test fails.
pub struct Daemon {
    child: Option<Child>,
    dir: Option<tempfile::TempDir>,
}

impl Daemon {
    /// Starts `imagegc run` against `endpoint` with `config` (TOML).
    pub fn start(endpoint: &str, config: &str) -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix("imagegc-daemon-")
            .tempdir()
            .expect("creating the daemon's directory");
        let config_path = dir.path().join("imagegc.toml");
        fs::write(&config_path, config).expect("writing the daemon's configuration");
        let stderr = fs::File::create(dir.path().join("stderr.log")).expect("creating the daemon's log");
        let child = imagegc_command(
            env!("CARGO_BIN_EXE_imagegc"),
            &config_path,
            endpoint,
            &dir.path().join("state"),
        )
        .arg("run")
        .args(["--log-format", "json", "--log-level", "debug"])
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("starting imagegc run: {e}"));
        Daemon {
            child: Some(child),
            dir: Some(dir),
        }
    }

    fn dir(&self) -> &Path {
        self.dir.as_ref().expect("the directory is kept until drop").path()
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir().join("state")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir().join("stderr.log")
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Sends SIGTERM and waits for the exit; panics with the log's tail when
    /// the daemon does not exit within [`EXIT_TIMEOUT`].
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("the daemon was started");
        if let Ok(Some(status)) = child.try_wait() {
            return status;
        }
        // SAFETY: signalling our own child by its PID.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + EXIT_TIMEOUT;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "imagegc run did not exit within {EXIT_TIMEOUT:?} of SIGTERM; last lines of its log:\n{}",
                    self.log_tail(30)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The log so far, one entry per line.
    pub fn log(&self) -> Vec<LogLine> {
        fs::read_to_string(self.log_path())
            .unwrap_or_default()
            .lines()
            .map(LogLine::parse)
            .collect()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let log = fs::read_to_string(self.log_path()).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// `imagegc history --output json` on the daemon's state directory.
    pub fn history(&self) -> Vec<Value> {
        let output = Command::new(env!("CARGO_BIN_EXE_imagegc"))
            .args(["history", "--output", "json", "--state-dir"])
            .arg(self.state_dir())
            .output()
            .expect("running imagegc history");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "imagegc history failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        match serde_json::from_str(&stdout) {
            Ok(Value::Array(entries)) => entries,
            _ => panic!("imagegc history --output json printed no JSON array:\n{stdout}"),
        }
    }

    /// Keeps the directory (log, state, configuration) after the test and
    /// returns where it is.
    pub fn keep(&mut self) -> String {
        match self.dir.take() {
            Some(dir) => dir.keep().display().to_string(),
            None => "(already kept)".to_string(),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() && self.dir.is_some() {
            eprintln!(
                "imagegc run's directory (configuration, state, log) kept at {}",
                self.keep()
            );
        }
    }
}

/// One line of the daemon's JSON log.
#[derive(Debug, Clone)]
pub struct LogLine {
    pub time: Option<SystemTime>,
    pub level: String,
    pub message: String,
    pub image: Option<String>,
    pub raw: String,
}

impl LogLine {
    fn parse(raw: &str) -> LogLine {
        let json: Value = serde_json::from_str(raw).unwrap_or(Value::Null);
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
        let message = text(json.get("message"))
            .or_else(|| text(json.pointer("/fields/message")))
            .unwrap_or_default();
        let image = text(json.get("image")).or_else(|| text(json.pointer("/fields/image")));
        LogLine {
            time: json
                .get("timestamp")
                .and_then(Value::as_str)
                .and_then(|t| humantime::parse_rfc3339(t).ok()),
            level: text(json.get("level")).unwrap_or_default(),
            message,
            image,
            raw: raw.to_string(),
        }
    }
}

/// Marsaglia's xorshift64: the driver's choices, replayable from the seed.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        XorShift(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform in `low..=high`.
    fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low + 1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() {
            None
        } else {
            items.get(self.below(items.len() as u64) as usize)
        }
    }
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
