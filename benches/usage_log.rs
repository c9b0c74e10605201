//! The usage log's cost on a busy node: bytes per line and per day, and
//! the CPU each event costs the daemon's loop.
//!
//! The node: the images and containers of a synthetic workload
//! (`imagegc simulate --workload service`: rolling deployments of
//! long-running services; `mixed`: service, CI and batch at once, far more
//! churn), at most the 200 images it pulled last listed (older ones go, as
//! a collector would remove them, and are recorded as removed),
//! listed every 30 s (`gc.usage_poll_interval`'s default), a cycle every
//! 5 min (`gc.interval`) and the image filesystem measured every 2 s
//! between cycles, usage drifting. Ids and names are full length, as a
//! runtime gives them.
//!
//! Printed: lines and bytes per day, bytes per line of each kind, and the
//! CPU per event: the recorder alone (what `Sink::emit` does under its
//! lock), per listing and per event of any kind, and through the sink
//! with its writer thread appending to a file in `$TMPDIR`.
//!
//! `cargo bench --bench usage_log [-- service|ci|batch|mixed] [DAYS]`
//! (default: service, 7 days).

mod common;
use common::hex;

use std::collections::{BTreeMap, HashMap};
use std::hint::black_box;
use std::time::{Duration, Instant};

use imagegc::cri::{Container, Image};
use imagegc::engine::{Event, Sink};
use imagegc::fs::FsStats;
use imagegc::sim::trace::{Action, Trace};
use imagegc::sim::workload::Kind;
use imagegc::time::Clock;
use imagegc::usage_log::{ROTATE_BYTES, Recorder, UsageLog};

const IMAGES: usize = 200;
const POLL: u64 = 30;
const CYCLE: u64 = 300;
const CHECK: u64 = 2;

/// What the daemon's loop sends, in time order: (seconds, what).
enum Step {
    Listing(Vec<Image>, Vec<Container>),
    CycleStarted,
    Usage(FsStats),
}

fn image(trace: &Trace, index: u32) -> Image {
    let name = &trace.images[index as usize].name;
    let repo = name.split(':').next().unwrap_or(name);
    Image {
        id: format!("sha256:{}", hex(1, u64::from(index))),
        repo_tags: vec![format!("registry.example.com/{name}")].into(),
        repo_digests: vec![format!(
            "registry.example.com/{repo}@sha256:{}",
            hex(2, u64::from(index))
        )]
        .into(),
        size: trace.image_bytes(index),
        pinned: false,
    }
}

fn container(id: u64, image: &Image) -> Container {
    Container {
        id: hex(3, id),
        pod_sandbox_id: hex(4, id),
        name: format!("c{id}"),
        image: image.repo_tags.first().unwrap().to_owned(),
        image_ref: image.id.clone(),
        ..Default::default()
    }
}

/// The node's days as the loop sees them, each step handed to `f` as it
/// comes (a week of listings held at once would take a gigabyte).
fn walk(kind: Kind, days: u64, mut f: impl FnMut(u64, &Step)) {
    let trace = kind.generate(1, days);
    let mut events = trace.events.iter().peekable();
    let mut held: Vec<u32> = Vec::new();
    let mut running: BTreeMap<u64, u32> = BTreeMap::new();
    let capacity = 200u64 << 30;
    let mut used = 120u64 << 30;
    let end = days * 86_400;
    let mut t = 0;
    while t < end {
        while let Some(e) = events.next_if(|e| e.at <= t) {
            match e.action {
                Action::Start { container, image } => {
                    running.insert(container, image);
                    held.retain(|&i| i != image);
                    held.push(image);
                }
                Action::Stop { container } => {
                    running.remove(&container);
                }
            }
        }
        if t % CYCLE == 0 {
            f(t, &Step::CycleStarted);
        }
        // Logs and writable layers grow; a cycle frees some.
        used = if t % CYCLE == 0 {
            used - (1 << 30)
        } else {
            used + (7 << 20)
        };
        f(
            t,
            &Step::Usage(FsStats {
                capacity_bytes: capacity,
                available_bytes: capacity - used,
                ..Default::default()
            }),
        );
        if t % POLL == 0 {
            let mut listed: Vec<u32> = held.iter().rev().take(IMAGES).copied().collect();
            let in_use: Vec<u32> = running.values().copied().filter(|i| !listed.contains(i)).collect();
            listed.extend(in_use);
            let images: Vec<Image> = listed.iter().map(|&i| image(&trace, i)).collect();
            let by_index: HashMap<u32, &Image> = listed.iter().copied().zip(images.iter()).collect();
            let containers = running.iter().map(|(&c, i)| container(c, by_index[i])).collect();
            f(t, &Step::Listing(images, containers));
        }
        t += CHECK;
    }
}

fn event(step: &Step) -> Event<'_> {
    match step {
        Step::Listing(images, containers) => Event::Seen { images, containers },
        Step::CycleStarted => Event::CycleStarted,
        Step::Usage(stats) => Event::Usage { stats, due: false },
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let days: u64 = args.iter().find_map(|a| a.parse().ok()).unwrap_or(7);
    let kind = Kind::ALL
        .into_iter()
        .find(|k| args.iter().any(|a| a == k.name()))
        .unwrap_or(Kind::Service);

    // What is written, line by line.
    let mut recorder = Recorder::new(0, u64::MAX);
    let mut bytes = Vec::new();
    let mut out = Vec::new();
    let (mut steps, mut listings, mut containers, mut images) = (0usize, 0usize, 0usize, 0usize);
    walk(kind, days, |at, step| {
        steps += 1;
        if let Step::Listing(i, c) = step {
            listings += 1;
            containers = containers.max(c.len());
            images = images.max(i.len());
        }
        recorder.record(&event(step), at, &mut out);
        for chunk in out.drain(..) {
            bytes.extend(chunk.to_bytes());
        }
    });
    let text = String::from_utf8(bytes).unwrap();
    let mut kinds: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for line in text.lines() {
        let kind = line
            .split("\"ev\":\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or("?");
        let entry = kinds.entry(kind.to_string()).or_default();
        entry.0 += 1;
        entry.1 += line.len() + 1;
    }
    let lines: usize = kinds.values().map(|k| k.0).sum();
    println!(
        "node: {} workload, {days} days, up to {images} images listed, up to {containers} containers, \
         a listing every {POLL}s ({listings}), a cycle every {CYCLE}s, usage measured every {CHECK}s",
        kind.name()
    );
    for (kind, (n, b)) in &kinds {
        println!(
            "  {kind:8} {:>9.1} lines/day  {:>5} bytes/line",
            *n as f64 / days as f64,
            b / n
        );
    }
    let per_day = text.len() as f64 / days as f64;
    println!(
        "usage_log: {:.0} lines/day, {:.0} KiB/day, {} bytes/line on average; {} MiB rotation lasts {:.0} days",
        lines as f64 / days as f64,
        per_day / 1024.0,
        text.len() / lines.max(1),
        ROTATE_BYTES >> 20,
        ROTATE_BYTES as f64 / per_day
    );
    let reread = Trace::read(text.as_bytes()).unwrap();
    println!(
        "  read back: {} images, {} container starts",
        reread.images.len(),
        reread.starts()
    );

    // CPU: the recorder alone, as `emit` runs it under its lock, best of 3.
    let (mut per_listing, mut per_event) = (Duration::MAX, Duration::MAX);
    for _ in 0..3 {
        let mut recorder = Recorder::new(0, u64::MAX);
        let (mut listing_time, mut all) = (Duration::ZERO, Duration::ZERO);
        walk(kind, days, |at, step| {
            let t = Instant::now();
            recorder.record(&event(step), at, &mut out);
            black_box(&out);
            out.clear();
            let took = t.elapsed();
            all += took;
            if matches!(step, Step::Listing(..)) {
                listing_time += took;
            }
        });
        per_event = per_event.min(all / steps as u32);
        per_listing = per_listing.min(listing_time / listings as u32);
    }
    println!(
        "usage_log: recorder {:.1} us per listing (up to {images} images), {:.2} us per event of any kind ({steps} events)",
        per_listing.as_secs_f64() * 1e6,
        per_event.as_secs_f64() * 1e6,
    );

    // Through the sink, its writer thread appending to a file.
    let dir = tempfile::tempdir().unwrap();
    let log = UsageLog::start(dir.path(), ROTATE_BYTES, Clock::start()).unwrap();
    let mut emitted = Duration::ZERO;
    walk(kind, days, |_, step| {
        let t = Instant::now();
        log.emit(&event(step));
        emitted += t.elapsed();
    });
    log.close();
    let written: u64 = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    println!(
        "usage_log: sink emit {:.2} us per event on the loop's side (the writer thread apart), {} KiB written",
        emitted.as_secs_f64() * 1e6 / steps as f64,
        written / 1024
    );
}
