//! The engine on an in-process runtime and disk.

use super::*;
use crate::config::Config;
use crate::fs::FsStats;
use crate::model::Image;
use crate::policy::Reason;
use crate::records::Records;
use crate::store::journal::Journal;
use crate::store::state::{Loaded, StateStore};
use fake::SimHandle;
use removal::{Disk, SETTLE_CONFIRM, SETTLE_STEP, SETTLE_TIMEOUT, removal_of};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;

fn image(id: &str, size: u64) -> Image {
    crate::testing::library_image(id, size)
}

fn collector(sim: &SimHandle, configure: impl FnOnce(&mut Config)) -> (Collector<SimHandle>, tempfile::TempDir) {
    collector_with_history(sim, configure, Records::new())
}

/// A collector that starts from `records`, as if its state file held them.
fn collector_with_history(
    sim: &SimHandle,
    configure: impl FnOnce(&mut Config),
    records: Records,
) -> (Collector<SimHandle>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(dir.path(), configure);
    let clock = Clock::starting_at(SystemTime::now() - Duration::from_secs(3600));
    (start(sim, &config, clock, Some(records)), dir)
}

/// The engine tests' configuration, its state in `state_dir`, changed by
/// `configure`: high 90, low 80, no minimum age.
fn test_config(state_dir: &Path, configure: impl FnOnce(&mut Config)) -> Config {
    let mut config = Config::default();
    config.gc.high_threshold_percent = 90;
    config.gc.low_threshold_percent = 80;
    config.gc.min_age = Duration::ZERO;
    config.state.dir = state_dir.to_path_buf();
    // No eviction line: the walk measures each removal (the tests of a
    // walk past the line set one).
    config.eviction_imagefs_available = Some(crate::config::EvictionThreshold::Bytes(0));
    configure(&mut config);
    config
}

/// A process on `sim` with `config` (its state directory included), its
/// clock at `clock`: from what the state directory holds, with `records`
/// in place of its records when given (as if its state file held them).
fn start(sim: &SimHandle, config: &Config, clock: Clock, records: Option<Records>) -> Collector<SimHandle> {
    start_with(sim, Settings::from(config), &config.state.dir, clock, records)
}

/// [`start`] from settings already made (a process's, for its next one)
/// and its state directory.
fn start_with(
    sim: &SimHandle,
    settings: Settings,
    state_dir: &Path,
    clock: Clock,
    records: Option<Records>,
) -> Collector<SimHandle> {
    let restored = Restored::load(state_dir, &clock, &settings);
    let restored = match records {
        Some(records) => restored.with_records(records),
        None => restored,
    };
    Collector::new(
        sim.clone(),
        settings,
        restored,
        Arc::new(sim.clone()),
        Arc::new(Metrics::new()),
        clock,
    )
}

/// The next process, as [`next_process`], started now from `records` (as
/// if its state file held them).
fn next_process_with_history(c: &Collector<SimHandle>, records: Records) -> Collector<SimHandle> {
    let dir = c.inventory.store().dir().to_path_buf();
    start_with(c.runtime(), c.settings().clone(), &dir, *c.clock(), Some(records))
}

/// The next process on the same node, settings and state directory
/// (after `c` was killed or stopped), its clock starting at `clock`.
fn next_process(c: &Collector<SimHandle>, clock: Clock) -> Collector<SimHandle> {
    let dir = c.inventory.store().dir().to_path_buf();
    start_with(c.runtime(), c.settings().clone(), &dir, clock, None)
}

async fn cycle(c: &mut Collector<SimHandle>) -> CycleReport {
    c.cycle(&CancellationToken::new()).await
}

/// What `Disk::settled` returns after a removal, and how long (on
/// tokio's paused clock) it watched, when the filesystem reads
/// `readings` from the moment `RemoveImage` returned, 100 available
/// before.
async fn settle(readings: &[u64]) -> (u64, Duration) {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.disk.set(1000, 0);
        s.disk.script_readings(readings.iter().copied());
    });
    let disk = Disk::new(Arc::new(sim), Some(PathBuf::from("/sim")), None);
    let before = FsStats {
        capacity_bytes: 1000,
        available_bytes: 100,
        ..Default::default()
    };
    let started = tokio::time::Instant::now();
    let after = disk.settled(Some(before)).await.unwrap();
    (after.available_bytes, started.elapsed())
}

fn sample(c: &Collector<SimHandle>, name: &str) -> Option<String> {
    let text = c.metrics().encode();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ').map(str::to_owned))
}

/// Old images, unused for two hours: the age pass removes them all.
fn old_images(sim: &SimHandle, count: usize) -> Records {
    let old = SystemTime::now() - Duration::from_secs(7200);
    let ids: Vec<String> = (0..count).map(|i| format!("old{i:02}")).collect();
    sim.with(|s| {
        for id in &ids {
            s.unused(id, 10, 10);
        }
        s.disk.set(1000, 900);
    });
    Records::from_map(ids.iter().map(|id| crate::testing::history(&image(id, 10), old, old)))
}

/// A collector whose age pass (max age an hour) finds `count` old images.
fn collector_with_old_images(sim: &SimHandle, count: usize) -> (Collector<SimHandle>, tempfile::TempDir) {
    let records = old_images(sim, count);
    collector_with_history(sim, |c| c.gc.max_age = Duration::from_secs(3600), records)
}

/// How long (tokio's clock) a cycle takes to remove ten images, each
/// re-check taking as long as the confirming look.
async fn ten_removals(node: impl FnOnce(&SimHandle) -> Records) -> Duration {
    let sim = SimHandle::default();
    sim.with(|s| s.list_delay = SETTLE_CONFIRM);
    let records = node(&sim);
    let (mut c, _dir) = collector_with_history(&sim, |c| c.gc.max_age = Duration::from_secs(3600), records);
    let started = tokio::time::Instant::now();
    let report = cycle(&mut c).await;
    assert_eq!(report.removed.len(), 10, "{report:?}");
    started.elapsed()
}

fn journaled(dir: &tempfile::TempDir) -> Vec<crate::store::journal::JournalEntry> {
    Journal::new(dir.path()).read(None).unwrap()
}

fn layer(name: &str) -> String {
    format!(
        "sha256:{:0>64}",
        name.bytes().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

/// What `plan` forecasts on `listing`: the age removals, then the space
/// removals of the cycle's plan walked by the estimate, with what each of
/// those is expected to free.
fn plan_forecast(
    c: &Collector<SimHandle>,
    listing: &NodeView,
    sim: &SimHandle,
) -> (Vec<String>, Vec<String>, Vec<u64>) {
    let stats = sim.stats(Path::new("/sim")).unwrap();
    let (cycle, _) = c.cycle_plan(listing, Some(&stats));
    let forecast = cycle
        .space(stats, cycle.age_would_free(), Default::default(), c.layers(), None)
        .expect("a space pass is due")
        .forecast(|_| false);
    (
        cycle.age().iter().map(|c| c.id.to_string()).collect(),
        forecast.removals.iter().map(|c| c.id.to_string()).collect(),
        forecast.frees,
    )
}

mod listing;
mod space;
mod removals;
mod settle;
mod plan;
mod by_others;
mod pulls;
mod schedule;
