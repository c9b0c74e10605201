//! The engine on an in-process runtime and disk.

use super::*;
use crate::config::Config;
use crate::cri::Image;
use crate::fs::FsStats;
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
    let dir = c.inventory.store.dir().to_path_buf();
    start_with(c.runtime(), c.settings().clone(), &dir, *c.clock(), Some(records))
}

/// The next process on the same node, settings and state directory
/// (after `c` was killed or stopped), its clock starting at `clock`.
fn next_process(c: &Collector<SimHandle>, clock: Clock) -> Collector<SimHandle> {
    let dir = c.inventory.store.dir().to_path_buf();
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
    let disk = Disk {
        probe: Arc::new(sim),
        path: Some(PathBuf::from("/sim")),
        image_bytes: None,
    };
    let before = FsStats {
        capacity_bytes: 1000,
        available_bytes: 100,
        ..Default::default()
    };
    let started = tokio::time::Instant::now();
    let after = disk.settled(Some(before)).await.unwrap();
    (after.available_bytes, started.elapsed())
}

#[tokio::test(start_paused = true)]
async fn space_back_when_the_removal_returns_is_confirmed_in_one_short_look() {
    // containerd 1.x and CRI-O: deleted before they answer.
    assert_eq!(settle(&[150, 150]).await, (150, SETTLE_CONFIRM));
}

#[tokio::test(start_paused = true)]
async fn space_coming_back_after_the_removal_returns_is_watched_until_it_holds_still() {
    // containerd 2.x: nothing yet as it answers, then in two steps.
    assert_eq!(settle(&[100, 100, 140, 180, 180]).await, (180, SETTLE_STEP * 4));
    // Some back as it answers, more a moment later: the short look
    // sees it still growing, and the watch goes on at the long step.
    assert_eq!(
        settle(&[150, 170, 190, 190]).await,
        (190, SETTLE_CONFIRM + SETTLE_STEP * 2)
    );
    // Nothing comes back (every layer shared): watched to the end.
    assert_eq!(settle(&[100]).await, (100, SETTLE_TIMEOUT));
}

#[tokio::test]
async fn the_usage_poll_reports_runtime_reachability_in_the_metric() {
    let sim = SimHandle::default();
    let (mut c, _dir) = collector(&sim, |_| {});
    let runtime_up = |c: &Collector<SimHandle>| {
        let text = c.metrics().encode();
        text.lines()
            .find(|l| l.starts_with("imagegc_runtime_up "))
            .map(str::to_string)
    };
    assert!(c.poll_usage().await.is_ok());
    assert_eq!(runtime_up(&c).as_deref(), Some("imagegc_runtime_up 1"));
    sim.with(|s| s.fail_lists = true);
    assert!(c.poll_usage().await.is_err());
    assert_eq!(runtime_up(&c).as_deref(), Some("imagegc_runtime_up 0"));
    sim.with(|s| s.fail_lists = false);
    assert!(c.poll_usage().await.is_ok());
    assert_eq!(runtime_up(&c).as_deref(), Some("imagegc_runtime_up 1"));
}

#[tokio::test]
async fn a_listing_that_fails_breaks_observation_until_the_next_one() {
    // No gap in an image's use that spans the outage is learnt as a break
    // (see `records::tests::a_gap_imagegc_did_not_observe_whole_teaches_no_break`).
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 10)]);
        s.node.containers = vec![crate::testing::container_naming("c", "a")];
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    assert_eq!(c.records().observed_since(), None, "not before the first listing");
    assert!(c.poll_usage().await.is_ok());
    let first = c.records().observed_since().expect("observing");
    sim.with(|s| s.fail_lists = true);
    assert!(c.poll_usage().await.is_err());
    assert_eq!(c.records().observed_since(), None);
    sim.with(|s| s.fail_lists = false);
    cycle(&mut c).await;
    let resumed = c.records().observed_since().expect("observing again");
    assert!(resumed >= first);
    assert!(c.poll_usage().await.is_ok());
    assert_eq!(c.records().observed_since(), Some(resumed), "unbroken since");
}

#[tokio::test]
async fn idle_cycles_save_only_changes_and_a_periodic_refresh() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 10), image("b", 10)]);
        s.node.containers = vec![crate::testing::container_naming("c", "a")];
        s.disk.set(1000, 900);
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    let path = c.inventory.store.path().to_path_buf();
    let read = || std::fs::read(&path).expect("the state file");
    cycle(&mut c).await;
    let first = read();
    // Only the last use of `a`, in use, moved: the file stays as it was.
    cycle(&mut c).await;
    assert_eq!(read(), first);
    // A new image is saved at once.
    sim.with(|s| s.node.add_image(image("n", 10)));
    cycle(&mut c).await;
    let second = read();
    assert_ne!(second, first);
    match StateStore::new(c.inventory.store.dir()).load(c.clock.now(), Duration::from_secs(300)) {
        Loaded::Records { records, .. } => assert!(records.get("n").is_some()),
        _ => panic!("the state file does not load"),
    }
    // A removal is saved at once. (The refresh of a file that only
    // last-used times would change: `inventory::tests`.)
    sim.with(|s| s.node.retain_images(|i| i.id != "b"));
    cycle(&mut c).await;
    assert_ne!(read(), second);
}

fn sample(c: &Collector<SimHandle>, name: &str) -> Option<String> {
    let text = c.metrics().encode();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ').map(str::to_owned))
}

#[tokio::test]
async fn usage_just_under_high_that_the_kubelet_rounds_up_to_it_shows_a_space_pass_due() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 10)]);
        s.node.containers = vec![crate::testing::container_naming("c", "a")];
        // 69.55 % used: the exact ratio is under 70 %, the kubelet's
        // whole percent is 70.
        s.disk.set(10_000, 3_045);
    });
    let (mut c, _dir) = collector(&sim, |config| {
        config.gc.high_threshold_percent = 70;
        config.gc.low_threshold_percent = 50;
    });
    let report = cycle(&mut c).await;
    assert!(report.space_pass, "imagegc itself runs the space pass");
    assert_eq!(sample(&c, "imagegc_space_pass_due").as_deref(), Some("1"));

    // Freed to 69 % (rounded up): no pass due any more.
    sim.with(|s| s.disk.set_available(3_150));
    cycle(&mut c).await;
    assert_eq!(sample(&c, "imagegc_space_pass_due").as_deref(), Some("0"));
}

#[tokio::test]
async fn a_restarted_collector_reports_the_last_success_of_the_one_before() {
    let sim = SimHandle::default();
    sim.with(|s| s.disk.set(1000, 900));
    let (mut c, _dir) = collector(&sim, |_| {});
    let report = cycle(&mut c).await;
    assert_eq!(report.outcome, Outcome::Success);
    let before = c.metrics().last_success().expect("a success");
    c.save().await;
    let restarted = next_process(&c, Clock::starting_at(SystemTime::now()));
    drop(c);
    let restored = restarted
        .metrics()
        .last_success()
        .expect("restored from the state file");
    let millis = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_millis();
    assert_eq!(millis(restored), millis(before));
    assert_ne!(
        sample(&restarted, "imagegc_last_success_timestamp_seconds").as_deref(),
        Some("0.0")
    );
}

// docs/kubelet.md scenario 9: below the low threshold nothing is removed.
#[tokio::test]
async fn below_threshold_removes_nothing() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100)]);
        s.disk.occupy("a", 100);
        s.disk.set(1000, 600);
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    let report = cycle(&mut c).await;
    assert_eq!(report.outcome, Outcome::Success);
    assert!(!report.space_pass);
    assert!(sim.removed().is_empty());
}

// Scenario 10: over the high threshold; one image frees enough, or not.
#[tokio::test]
async fn over_high_frees_enough_or_reports_failure() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 450)]);
        s.disk.occupy("a", 450);
        s.disk.set(1000, 50);
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    let report = cycle(&mut c).await;
    assert_eq!(report.outcome, Outcome::Success);
    assert_eq!(sim.removed(), ["a"]);
    assert_eq!(report.removed[0].freed_bytes, Some(450));

    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 50)]);
        s.disk.occupy("a", 50);
        s.disk.set(1000, 50);
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    let report = cycle(&mut c).await;
    assert_eq!(
        report.outcome,
        Outcome::LowNotReached {
            freed_bytes: 50,
            remaining_bytes: 100
        }
    );
}

// Scenario 11: filesystem stats fail: failure, nothing removed.
#[tokio::test]
async fn unmeasurable_filesystem_fails_the_cycle_and_removes_nothing() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 450)]);
        s.disk.fail(true);
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    let report = cycle(&mut c).await;
    assert!(
        matches!(report.outcome, Outcome::Failed(ref e) if e.to_string().contains("/sim")),
        "{:?}",
        report.outcome
    );
    assert!(sim.removed().is_empty());
}

/// A split store (KEP-4191): the images on one filesystem, the containers'
/// writable layers on another. The image filesystem alone decides and is
/// freed; a full container filesystem removes nothing (images free nothing
/// there) and is reported beside it.
#[tokio::test]
async fn on_a_split_store_only_the_image_filesystem_decides_and_the_container_one_is_reported() {
    // (image fs available, container fs available) of 1000 each, high 90,
    // low 80: what goes.
    let cases: [(u64, u64, &[&str]); 3] = [
        // The container filesystem full, the image one below high.
        (500, 5, &[]),
        // The image filesystem past high, the container one nearly empty:
        // freed down to low on the image filesystem.
        (50, 990, &["a", "b"]),
        // Both past high: the image filesystem is freed, no further.
        (50, 5, &["a", "b"]),
    ];
    for (image_available, container_available, gone) in cases {
        let sim = SimHandle::default();
        sim.with(|s| {
            for id in ["a", "b", "c", "d"] {
                s.unused(id, 100, 100);
            }
            s.disk.set(1000, image_available);
            s.split_store(1000, container_available);
        });
        let (mut c, _dir) = collector(&sim, |_| {});
        let report = cycle(&mut c).await;
        assert_eq!(
            report.outcome,
            Outcome::Success,
            "{image_available}/{container_available}"
        );
        assert_eq!(sim.removed(), gone, "{image_available}/{container_available}");
        assert_eq!(
            sample(
                &c,
                r#"imagegc_container_filesystem_available_bytes{mount_point="/sim-containers"}"#
            )
            .as_deref(),
            Some(container_available.to_string().as_str())
        );
        assert_eq!(
            sample(
                &c,
                r#"imagegc_container_filesystem_capacity_bytes{mount_point="/sim-containers"}"#
            )
            .as_deref(),
            Some("1000")
        );
        assert_eq!(
            sample(&c, "imagegc_image_filesystem_capacity_bytes").as_deref(),
            Some("1000")
        );
    }
}

/// Without a split store the container filesystem the runtime names is the
/// image filesystem: nothing is reported for it.
#[tokio::test]
async fn without_a_split_store_no_container_filesystem_is_reported() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.unused("a", 100, 100);
        s.disk.set(1000, 500);
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    assert_eq!(cycle(&mut c).await.outcome, Outcome::Success);
    let text = c.metrics().encode();
    assert!(
        !text.lines().any(|l| l.starts_with("imagegc_container_filesystem_")),
        "{text}"
    );
    assert_eq!(
        sample(&c, "imagegc_image_filesystem_capacity_bytes").as_deref(),
        Some("1000")
    );
}

/// The heart of it: images whose layers are shared free less than their
/// size. Adding sizes (the kubelet) stops early; measuring goes on to
/// exactly the image that crosses the low threshold, and no further.
#[tokio::test]
async fn shared_layers_reach_low_in_one_cycle_and_no_further() {
    let sim = SimHandle::default();
    sim.with(|s| {
        for (id, disk) in [("a", 50), ("b", 50), ("c", 150), ("d", 300), ("e", 300)] {
            s.unused(id, 200, disk);
        }
        s.disk.set(1000, 50);
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    // Give a strict LRU order a..e.
    let report = cycle(&mut c).await;
    // To free 150: a (50) + b (50) + c (150) reach it; d stays.
    assert_eq!(report.outcome, Outcome::Success);
    assert_eq!(sim.removed(), ["a", "b", "c"]);
    assert!(report.after.unwrap().usage_percent() <= 80);
}

/// The next candidate is re-checked while the removal before it is
/// confirmed; a removal whose space goes on coming back after the first
/// reading can still end the walk, and then the candidate re-checked
/// ahead stays.
#[tokio::test(start_paused = true)]
async fn space_still_coming_back_after_the_first_reading_ends_the_walk_before_the_next() {
    let sim = SimHandle::default();
    sim.with(|s| {
        for id in ["a", "b", "c"] {
            s.unused(id, 200, 100);
        }
        // "a": 100 at once, 100 more a moment after the call returns.
        s.disk.frees_late("a", 100);
        s.disk.set(1000, 50);
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    let report = cycle(&mut c).await;
    // 150 available after the call, short of low (200): "b" comes next
    // and is re-checked ahead; 250 once "a" is all back: low reached.
    assert_eq!(report.outcome, Outcome::Success);
    assert_eq!(sim.removed(), ["a"]);
    assert_eq!(report.after.unwrap().available_bytes, 250);
    assert_eq!(report.removed[0].freed_bytes, Some(200));
    // "b"'s pending note, written before its re-check ahead, went with it.
    assert!(
        c.remover.pending.entries().is_empty(),
        "{:?}",
        c.remover.pending.entries()
    );
    assert!(!_dir.path().join(crate::store::pending::FILE_NAME).exists());
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

#[tokio::test(start_paused = true)]
async fn the_space_walk_confirms_each_removal_beside_the_next_candidates_recheck() {
    let took = ten_removals(|sim| {
        sim.with(|s| {
            for i in 0..12 {
                s.unused(&format!("i{i:02}"), 200, 20);
            }
            // Low (80 %) is 200 available: ten removals.
            s.disk.set(1000, 0);
        });
        Records::new()
    })
    .await;
    let (delay, look) = (SETTLE_CONFIRM, SETTLE_CONFIRM);
    // The listing, the first re-check, then per removal the longer of its
    // look and the next re-check (the last: its look), not both.
    let one_after_the_other = delay + (delay + look) * 10;
    let side_by_side = delay * 2 + delay.max(look) * 10;
    assert!(took <= side_by_side && took < one_after_the_other, "{took:?}");
}

#[tokio::test(start_paused = true)]
async fn the_age_pass_waits_no_look_of_its_own_but_the_last() {
    let took = ten_removals(|sim| old_images(sim, 10)).await;
    let (delay, look) = (SETTLE_CONFIRM, SETTLE_CONFIRM);
    // The listing, each re-check, one look.
    assert!(took <= delay * 11 + look, "{took:?}");
}

/// The phase each removal of the pending file `held` has.
fn phases(held: &str) -> Vec<(String, String)> {
    let file: serde_json::Value = serde_json::from_str(held).unwrap_or_default();
    file["removals"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
            (text(&r["entry"]["image"]), text(&r["phase"]))
        })
        .collect()
}

#[tokio::test]
async fn in_the_age_pass_each_note_is_written_beside_the_call_before_and_on_disk_at_its_own_call() {
    let sim = SimHandle::default();
    let (mut c, dir) = collector_with_old_images(&sim, 4);
    let file = dir.path().join(crate::store::pending::FILE_NAME);
    sim.with(|s| s.read_at_remove = Some(file.clone()));
    let report = cycle(&mut c).await;
    assert_eq!(report.outcome, Outcome::Success);
    assert_eq!(sim.removed(), ["old00", "old01", "old02", "old03"]);
    let found = sim.0.lock().unwrap().read_at_remove_found.clone();
    assert_eq!(found.len(), 4);
    for (id, held) in &found {
        // A process killed during this call leaves the note that claims
        // it: written (and synced) before the call, marked sent before it.
        assert!(
            phases(held).contains(&(id.clone(), "requested".to_string())),
            "{id}: {held}"
        );
        // Nothing else is claimed: an earlier removal is journaled before
        // this call, and a later one is at most noted, not sent.
        for (other, phase) in phases(held).iter().filter(|(other, _)| other != id) {
            assert!(
                phase == "checking" || journaled(&dir).iter().any(|e| &e.image == other),
                "{id}: {other} {phase}"
            );
        }
    }
    let journal = journaled(&dir);
    let ids: Vec<&str> = journal.iter().map(|e| e.image.as_str()).collect();
    assert_eq!(ids, ["old00", "old01", "old02", "old03"]);
    assert!(journal.iter().all(|e| e.asked.is_some()), "{journal:?}");
    // Done: nothing pending, in memory or on disk.
    assert!(c.remover.pending.entries().is_empty());
    assert!(!file.exists());
}

#[tokio::test]
async fn in_the_age_pass_a_removal_the_runtime_keeps_is_not_believed_and_the_pass_goes_on() {
    let sim = SimHandle::default();
    let (mut c, dir) = collector_with_old_images(&sim, 3);
    // The first two answer OK and stay: each is asked about beside the
    // next re-check (the second) or its own look (the last would be).
    sim.with(|s| {
        s.keeps_on_remove("old00");
        s.keeps_on_remove("old01");
    });
    let report = cycle(&mut c).await;
    let failed: Vec<&str> = report.failed.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(failed, ["old00", "old01"], "{report:?}");
    assert!(report.failed.iter().all(|(_, why)| why.contains("still listed")));
    let removed: Vec<&str> = report.removed.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(removed, ["old02"]);
    let journal = journaled(&dir);
    assert_eq!(journal.len(), 1, "{journal:?}");
    assert_eq!(journal[0].image, "old02");
    assert_eq!(
        sample(&c, "image_garbage_collected_total{reason=\"age\"}").as_deref(),
        Some("1")
    );
    assert!(
        c.remover.pending.entries().is_empty(),
        "{:?}",
        c.remover.pending.entries()
    );
    assert!(!dir.path().join(crate::store::pending::FILE_NAME).exists());
}

#[tokio::test]
async fn the_last_age_removal_the_runtime_keeps_is_not_believed_either() {
    let sim = SimHandle::default();
    let (mut c, dir) = collector_with_old_images(&sim, 2);
    sim.with(|s| s.keeps_on_remove("old01"));
    let report = cycle(&mut c).await;
    let failed: Vec<&str> = report.failed.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(failed, ["old01"], "{report:?}");
    assert_eq!(journaled(&dir).len(), 1);
    assert!(c.remover.pending.entries().is_empty());
}

#[tokio::test]
async fn a_removal_of_unknown_outcome_ends_the_age_pass_and_the_note_written_beside_it_goes() {
    let sim = SimHandle::default();
    let records = old_images(&sim, 3);
    let (mut c, dir) = collector_with_history(
        &sim,
        |c| {
            c.gc.max_age = Duration::from_secs(3600);
            c.runtime.timeout = Duration::from_millis(50);
        },
        records,
    );
    sim.with(|s| s.hang_remove = vec!["old00".to_string()]);
    let report = cycle(&mut c).await;
    assert_eq!(report.unsettled, ["old00"]);
    assert!(sim.removed().is_empty());
    // `old01`'s note, written beside the call, named a call never sent.
    let pending: Vec<(&str, crate::store::pending::Phase)> = c
        .remover
        .pending
        .entries()
        .iter()
        .map(|p| (p.entry.image.as_str(), p.phase))
        .collect();
    assert_eq!(pending, [("old00", crate::store::pending::Phase::Unknown)]);
    let held = std::fs::read_to_string(dir.path().join(crate::store::pending::FILE_NAME)).unwrap();
    assert_eq!(phases(&held), [("old00".to_string(), "unknown".to_string())]);
}

#[tokio::test(start_paused = true)]
async fn the_age_pass_counts_in_full_what_comes_back_after_the_first_reading() {
    let sim = SimHandle::default();
    let (mut c, dir) = collector_with_old_images(&sim, 3);
    // 10 at once, 30 more a moment later.
    sim.with(|s| {
        s.disk.frees_late("old00", 30);
    });
    let report = cycle(&mut c).await;
    assert_eq!(sim.removed(), ["old00", "old01", "old02"]);
    let freed: Vec<Option<u64>> = report.removed.iter().map(|r| r.freed_bytes).collect();
    assert_eq!(freed, [Some(40), Some(10), Some(10)]);
    let journaled: Vec<Option<u64>> = journaled(&dir).iter().map(|e| e.freed_bytes).collect();
    assert_eq!(journaled, freed);
}

/// The cycle's removals when something else writes to the image
/// filesystem all the while and a container is created on `victim` right
/// after its re-check made ahead (the `n`-th ListContainers) answered.
async fn container_created_after_the_recheck_ahead(node: impl FnOnce(&SimHandle) -> Records) -> Vec<String> {
    let sim = SimHandle::default();
    let records = node(&sim);
    let (mut c, _dir) = collector_with_history(&sim, |c| c.gc.max_age = Duration::from_secs(3600), records);
    // The listing is the first ListContainers, the first candidate's
    // re-check the second, the second candidate's re-check ahead the third.
    sim.with(|s| {
        s.disk.writer(1);
        s.appear_after_list = Some((3, crate::testing::container_naming("new", "old01")));
    });
    cycle(&mut c).await;
    sim.removed()
}

#[tokio::test(start_paused = true)]
async fn the_age_pass_never_removes_on_a_recheck_gone_stale_while_another_writer_moves_free_space() {
    let removed = container_created_after_the_recheck_ahead(|sim| old_images(sim, 2)).await;
    // The confirming look watched a second of moving free space: the
    // re-check of old01 made beside it went stale, and the one made again
    // right before the call sees the new container.
    assert_eq!(removed, ["old00"]);
}

#[tokio::test(start_paused = true)]
async fn the_space_walk_never_removes_on_a_recheck_gone_stale_while_another_writer_moves_free_space() {
    let removed = container_created_after_the_recheck_ahead(|sim| {
        sim.with(|s| {
            for i in 0..3 {
                s.unused(&format!("old{i:02}"), 200, 100);
            }
            // Low (80 %) is 200 available: two removals.
            s.disk.set(1000, 0);
        });
        Records::new()
    })
    .await;
    assert_eq!(removed, ["old00", "old02"]);
}

#[tokio::test(start_paused = true)]
async fn a_recheck_ahead_that_takes_too_long_is_made_again_before_the_removal() {
    let sim = SimHandle::default();
    // Slower than the limit on a re-check made ahead of time.
    sim.with(|s| s.list_delay = Duration::from_secs(1));
    let (mut c, _dir) = collector_with_old_images(&sim, 2);
    let report = cycle(&mut c).await;
    assert_eq!(sim.removed(), ["old00", "old01"]);
    assert_eq!(report.outcome, Outcome::Success);
    // The listing, old00's re-check, old01's ahead (dropped, unanswered),
    // old01's made again.
    assert_eq!(sim.0.lock().unwrap().lists, 3);
    assert_eq!(journaled(&_dir).len(), 2);
}

#[tokio::test]
async fn an_image_that_comes_into_use_before_removal_is_kept() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100), image("b", 100)]);
        s.disk.occupy("a", 100);
        s.disk.occupy("b", 100);
        s.disk.set(1000, 0);
        // Cycle lists once, then re-checks before each removal: the
        // container appears right before "a" would go.
        s.appear_at_list = Some((2, crate::testing::container_naming("late", "a")));
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    let report = cycle(&mut c).await;
    assert_eq!(report.became_in_use, ["a"]);
    assert_eq!(sim.removed(), ["b"]);
}

#[tokio::test]
async fn nothing_is_removed_while_status_never_answered() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("pause", 100)]);
        s.disk.occupy("pause", 100);
        s.disk.set(1000, 0);
        s.fail_status = true;
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    let report = cycle(&mut c).await;
    assert!(
        matches!(report.outcome, Outcome::Failed(ref e) if e.to_string().contains("sandbox image")),
        "{:?}",
        report.outcome
    );
    assert!(sim.removed().is_empty());
    // Once Status answered (here: without a sandbox image), cycles run.
    sim.with(|s| s.fail_status = false);
    cycle(&mut c).await;
    assert_eq!(sim.removed(), ["pause"]);
}

#[tokio::test]
async fn a_failed_removal_is_counted_and_the_walk_goes_on() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100), image("b", 300)]);
        s.disk.occupy("a", 100);
        s.disk.occupy("b", 300);
        s.disk.set(1000, 0);
        s.fail_remove = vec!["a".into()];
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    let report = cycle(&mut c).await;
    assert_eq!(report.failed.len(), 1);
    assert!(report.failed[0].1.contains("RemoveImage"));
    assert_eq!(sim.removed(), ["b"]);
    assert!(
        c.records().get("a").is_some(),
        "the record of the image not removed stays"
    );
    assert!(c.metrics().encode().contains("imagegc_removal_failures_total 1"));
}

#[tokio::test]
async fn dry_run_removes_nothing_and_estimates_by_size() {
    let sim = SimHandle::default();
    sim.with(|s| {
        for id in ["a", "b", "c"] {
            s.unused(id, 100, 100);
        }
        s.disk.set(1000, 50);
    });
    let (mut c, dir) = collector(&sim, |c| c.gc.dry_run = true);
    let report = cycle(&mut c).await;
    assert!(sim.removed().is_empty());
    // 150 to free at 100 bytes each: two would go.
    assert_eq!(report.removed.len(), 2);
    assert!(report.removed.iter().all(|r| r.dry_run && r.freed_bytes.is_none()));
    let journal = Journal::new(dir.path()).read(None).unwrap();
    assert_eq!(journal.len(), 2);
    assert!(journal.iter().all(|e| e.dry_run));
    assert!(
        c.metrics()
            .encode()
            .contains("image_garbage_collected_total{reason=\"space\"} 0")
    );
}

#[tokio::test]
async fn cancellation_stops_between_removals_and_saves_state() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100)]);
        s.disk.set(1000, 0);
    });
    let (mut c, dir) = collector(&sim, |_| {});
    let cancel = CancellationToken::new();
    cancel.cancel();
    let report = c.cycle(&cancel).await;
    assert_eq!(report.outcome, Outcome::Interrupted);
    assert!(sim.removed().is_empty());
    assert!(dir.path().join(crate::store::state::FILE_NAME).exists());
}

#[tokio::test]
async fn an_image_pulled_again_soon_after_removal_counts_as_a_repull() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100), image("b", 100)]);
        s.disk.occupy("a", 200);
        s.disk.set(1000, 50);
    });
    let (mut c, dir) = collector(&sim, |_| {});
    cycle(&mut c).await;
    assert_eq!(sim.removed(), ["a"]);
    // A newer image under the same tag is not the removed one.
    let mut newer = image("a", 100);
    newer.id = "a2".to_string();
    sim.with(|s| {
        s.node.add_image(newer);
        s.disk.set_available(900);
    });
    cycle(&mut c).await;
    assert!(c.metrics().encode().contains("imagegc_repulled_after_removal_total 0"));
    // The removed image itself comes back.
    sim.with(|s| s.node.add_image(image("a", 100)));
    cycle(&mut c).await;
    assert!(c.metrics().encode().contains("imagegc_repulled_after_removal_total 1"));
    // Counted once, and remembered across a restart through the journal.
    cycle(&mut c).await;
    assert!(c.metrics().encode().contains("imagegc_repulled_after_removal_total 1"));
    let restarted = next_process(&c, *c.clock());
    let now = restarted.clock().now();
    let window = restarted.settings().thrash_window;
    assert!(
        restarted
            .remover
            .thrash
            .removed_recently(now, window, "a", &Default::default())
    );
    drop(dir);
}

#[tokio::test]
async fn age_pass_runs_before_space_and_counts_by_reason() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("old", 100)]);
        s.disk.occupy("old", 100);
        s.disk.set(1000, 900);
    });
    let (mut c, _dir) = collector(&sim, |c| c.gc.max_age = Duration::from_secs(60));
    // First seen now: not old yet.
    assert!(cycle(&mut c).await.removed.is_empty());
    // Pretend an hour passed by loading a record with an old last use.
    let mut map = HashMap::new();
    let old = SystemTime::now() - Duration::from_secs(7200);
    map.insert(
        "old".to_string(),
        crate::records::Record {
            first_seen: old,
            last_used: old,
            size: 100,
            pinned: false,
            tags: Default::default(),
            digests: Default::default(),
            from_history: true,
            ever_used: false,
            usual_break: None,
        },
    );
    let mut c = next_process_with_history(&c, Records::from_map(map));
    let report = cycle(&mut c).await;
    assert_eq!(sim.removed(), ["old"]);
    assert_eq!(report.removed[0].reason, Reason::Age);
    assert!(
        c.metrics()
            .encode()
            .contains("image_garbage_collected_total{reason=\"age\"} 1")
    );
}

fn journaled(dir: &tempfile::TempDir) -> Vec<crate::store::journal::JournalEntry> {
    Journal::new(dir.path()).read(None).unwrap()
}

#[tokio::test]
async fn a_removal_that_timed_out_then_a_kill_then_gone_is_journaled_and_counted_once() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100)]);
        s.disk.occupy("a", 100);
        s.disk.set(1000, 50);
        s.hang_remove = vec!["a".to_string()];
    });
    let (mut c, dir) = collector(&sim, |c| c.runtime.timeout = Duration::from_millis(50));
    let report = cycle(&mut c).await;
    assert_eq!(report.unsettled, ["a"]);
    assert!(journaled(&dir).is_empty(), "not known to have happened yet");
    // SIGKILL: the process ends with nothing saved or cleaned up.
    let mut next = next_process(&c, Clock::starting_at(SystemTime::now() - Duration::from_secs(3600)));
    drop(c);
    // The runtime finished the removal meanwhile.
    sim.with(|s| {
        s.node.set_images(vec![image("b", 100)]);
        s.disk.set_available(900);
    });
    cycle(&mut next).await;
    cycle(&mut next).await;
    let entries = journaled(&dir);
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].image, "a");
    assert_eq!(entries[0].note.as_deref(), Some("completed after shutdown"));
    assert!(
        next.metrics()
            .encode()
            .contains("image_garbage_collected_total{reason=\"space\"} 1"),
        "counted once by the process that learnt of it"
    );
    assert!(!dir.path().join(crate::store::pending::FILE_NAME).exists());
}

#[tokio::test]
async fn a_removal_that_timed_out_and_went_is_journaled_by_the_same_process() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100), image("b", 100)]);
        s.disk.set(1000, 50);
        s.hang_remove = vec!["a".to_string()];
    });
    let (mut c, dir) = collector(&sim, |c| c.runtime.timeout = Duration::from_millis(50));
    assert_eq!(cycle(&mut c).await.unsettled, ["a"]);
    sim.with(|s| {
        s.node.retain_images(|i| i.id != "a");
        s.disk.set_available(900);
    });
    assert!(c.poll_usage().await.is_ok());
    let entries = journaled(&dir);
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].note.as_deref(), Some("completed after RemoveImage failed"));
    cycle(&mut c).await;
    assert_eq!(journaled(&dir).len(), 1, "journaled once");
}

/// An earlier process asked for the removal of `id` and was killed during
/// the call: its pending note is all that is left of it.
fn an_earlier_process_asked_to_remove(c: &mut Collector<SimHandle>, dir: &tempfile::TempDir, id: &str) {
    // Its note, then this process starting from it.
    let removal = Removal {
        id: id.to_string(),
        tags: vec![],
        digests: vec![],
        reason: Reason::Space,
        size: 100,
        freed_bytes: None,
        first_seen: SystemTime::UNIX_EPOCH,
        last_used: SystemTime::UNIX_EPOCH,
        dry_run: false,
    };
    crate::store::pending::Pending::load(dir.path()).request(crate::store::journal::JournalEntry::from_removal(
        &removal,
        c.clock.now(),
    ));
    // Re-checked, and RemoveImage sent.
    let mut noted = crate::store::pending::Pending::load(dir.path());
    noted.sending(id);
    *c = next_process(c, *c.clock());
}

#[tokio::test]
async fn an_empty_listing_never_settles_a_pending_removal_as_gone() {
    let sim = SimHandle::default();
    sim.with(|s| s.disk.set(1000, 900));
    let (mut c, dir) = collector(&sim, |_| {});
    an_earlier_process_asked_to_remove(&mut c, &dir, "a");
    // The runtime is restarting: it lists nothing.
    cycle(&mut c).await;
    assert!(journaled(&dir).is_empty(), "no false \"completed after shutdown\"");
    // Back, and the image is still there: the removal has not happened,
    // and may yet, as long as the runtime may still be working on it.
    sim.with(|s| s.node.set_images(vec![image("a", 100)]));
    cycle(&mut c).await;
    assert!(journaled(&dir).is_empty());
    assert!(dir.path().join(crate::store::pending::FILE_NAME).exists());
    // Still there an hour later (the process after): it did not happen.
    c = next_process(
        &c,
        Clock::starting_at(c.clock().now() + crate::store::pending::PENDING_LIMIT),
    );
    cycle(&mut c).await;
    assert!(journaled(&dir).is_empty());
    assert!(!dir.path().join(crate::store::pending::FILE_NAME).exists());
    // Gone later: someone else's doing, not claimed.
    sim.with(|s| s.node.set_images(vec![image("b", 100)]));
    cycle(&mut c).await;
    assert!(journaled(&dir).is_empty());
}

#[tokio::test]
async fn a_partial_listing_never_settles_a_removal_the_runtime_did_not_make_as_done() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100), image("b", 100)]);
        s.disk.set(1000, 900);
    });
    let (mut c, dir) = collector(&sim, |_| {});
    cycle(&mut c).await;
    // Killed during a RemoveImage of `a` that the runtime never carried
    // out; the next process starts.
    an_earlier_process_asked_to_remove(&mut c, &dir, "a");
    // The runtime lists only part of its images, and cannot say yet
    // whether it has `a`...
    sim.with(|s| {
        s.omit = vec!["a".to_string()];
        s.fail_image_status = true;
    });
    assert!(c.poll_usage().await.is_ok());
    // ...then says it has.
    sim.with(|s| s.fail_image_status = false);
    assert!(c.poll_usage().await.is_ok());
    // Whole listings again.
    sim.with(|s| s.omit.clear());
    cycle(&mut c).await;
    cycle(&mut c).await;
    assert!(journaled(&dir).is_empty(), "{:?}", journaled(&dir));
    assert_eq!(
        sample(&c, "image_garbage_collected_total{reason=\"space\"}").as_deref(),
        Some("0")
    );
    assert_eq!(
        sample(&c, "imagegc_repulled_after_removal_total").as_deref(),
        Some("0"),
        "no re-pull of an image that never left"
    );
    assert!(c.records().get("a").is_some(), "its history is kept");
    assert!(sim.removed().is_empty());
}

/// A cycle over a full disk whose `RemoveImage` of the unused `a` times out
/// with `a` still listed (its outcome unknown); the runtime finishes it
/// after `finish_after_lists` listings, if ever (or when asked again).
async fn a_removal_of_a_that_times_out(
    finish_after_lists: Option<usize>,
) -> (SimHandle, Collector<SimHandle>, tempfile::TempDir) {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node
            .set_images(vec![image("a", 100), image("b", 100), image("app", 100)]);
        s.node.containers = vec![crate::testing::container_naming("c", "app")];
        s.disk.occupy("a", 100);
        s.disk.set(1000, 50);
        s.hang_remove = vec!["a".to_string()];
        if let Some(lists) = finish_after_lists {
            s.finish_after_lists.insert("a".into(), lists);
        }
    });
    let (mut c, dir) = collector(&sim, |c| c.runtime.timeout = Duration::from_millis(50));
    assert_eq!(cycle(&mut c).await.unsettled, ["a"]);
    (sim, c, dir)
}

#[tokio::test]
async fn a_removal_the_runtime_finishes_after_a_listing_still_lists_it_is_journaled_and_counted_once() {
    let (sim, mut c, dir) = a_removal_of_a_that_times_out(Some(2)).await;
    // The runtime is still at it at the next listing...
    assert!(c.poll_usage().await.is_ok());
    assert!(sim.removed().is_empty());
    assert!(journaled(&dir).is_empty());
    // ...and done by the one after.
    assert!(c.poll_usage().await.is_ok());
    assert_eq!(sim.removed(), ["a"]);
    let entries = journaled(&dir);
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].image, "a");
    assert_eq!(entries[0].note.as_deref(), Some("completed after RemoveImage failed"));
    assert_eq!(
        sample(&c, "image_garbage_collected_total{reason=\"space\"}").as_deref(),
        Some("1")
    );
    assert!(!dir.path().join(crate::store::pending::FILE_NAME).exists());
    // Pulled again soon after: seen as a re-pull.
    sim.with(|s| s.node.add_image(image("a", 100)));
    assert!(c.poll_usage().await.is_ok());
    assert_eq!(sample(&c, "imagegc_repulled_after_removal_total").as_deref(), Some("1"));
    cycle(&mut c).await;
    assert_eq!(journaled(&dir).len(), 1, "journaled once");
}

#[tokio::test]
async fn an_image_removed_again_while_an_earlier_removal_is_unknown_is_journaled_once_per_removal() {
    let (sim, mut c, dir) = a_removal_of_a_that_times_out(None).await;
    assert!(c.poll_usage().await.is_ok());
    // The runtime answers again; the next cycle removes `a`: one removal,
    // one journal line, whichever call did it.
    sim.with(|s| s.hang_remove.clear());
    cycle(&mut c).await;
    assert_eq!(sim.removed()[0], "a");
    assert!(c.poll_usage().await.is_ok());
    cycle(&mut c).await;
    let entries = journaled(&dir);
    assert_eq!(entries.iter().filter(|e| e.image == "a").count(), 1, "{entries:?}");
    assert_eq!(entries[0].note, None);
    assert!(!dir.path().join(crate::store::pending::FILE_NAME).exists());
}

#[tokio::test]
async fn an_earlier_removal_that_finishes_as_it_is_asked_again_is_journaled_once() {
    // Not finished by any listing: only as it is asked again.
    let (sim, mut c, dir) = a_removal_of_a_that_times_out(Some(1000)).await;
    // The next cycle asks again; the runtime finishes the first call and
    // answers the second that the image is not there.
    sim.with(|s| s.hang_remove.clear());
    cycle(&mut c).await;
    assert_eq!(sim.removed()[0], "a");
    assert!(c.poll_usage().await.is_ok());
    cycle(&mut c).await;
    let entries = journaled(&dir);
    let of_a: Vec<_> = entries.iter().filter(|e| e.image == "a").collect();
    assert_eq!(of_a.len(), 1, "{entries:?}");
    assert_eq!(of_a[0].note.as_deref(), Some("completed after RemoveImage failed"));
    assert!(
        c.metrics().encode().contains(&format!(
            "image_garbage_collected_total{{reason=\"space\"}} {}",
            entries.len()
        )),
        "each removal journaled is counted"
    );
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
fn plan_forecast(c: &Collector<SimHandle>, listing: &Listing, sim: &SimHandle) -> (Vec<String>, Vec<String>, Vec<u64>) {
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

/// Two images on one base and one of its own, where the runtime names
/// their layers: `plan` counts the base once, freed by the second image
/// on it, and so foresees the third removal the measured cycle needs; by
/// reported sizes it would have stopped after two. The measured removals
/// size the layers they freed, which the next estimate goes by.
#[tokio::test]
async fn a_shared_base_is_counted_once_by_the_forecast_and_sized_by_the_measured_removals() {
    let sim = SimHandle::default();
    sim.with(|s| {
        // Reported 100 each; on disk the base is 70, each own layer 30.
        s.unused("a", 100, 30);
        s.unused("b", 100, 100);
        s.unused("c", 100, 100);
        s.node.set_layers("a", vec![layer("base"), layer("a")]);
        s.node.set_layers("b", vec![layer("base"), layer("b")]);
        s.node.set_layers("c", vec![layer("c")]);
        // 150 to free.
        s.disk.set(1000, 50);
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    let listing = c.observe().await.unwrap();
    assert_eq!(c.layers().len(), 3, "each image's layers were asked for once");
    let (_, space, frees) = plan_forecast(&c, &listing, &sim);
    // The base (two thirds of 100, the smallest split) comes back with b.
    assert_eq!(space, ["a", "b", "c"]);
    assert_eq!(frees, [33, 100, 100]);
    let report = cycle(&mut c).await;
    let removed: Vec<&str> = report.removed.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(removed, space, "the measured cycle removed what the forecast said");
    let learned = |name: &str| c.layers().learned_of(&layer(name)).map(|l| l.bytes);
    assert_eq!(learned("a"), Some(30));
    // b freed the base with its own layer: 100 shared between the two.
    assert_eq!((learned("base"), learned("b")), (Some(50), Some(50)));
    assert_eq!(learned("c"), Some(100));
    let asks = sim.0.lock().unwrap().layer_asks;
    c.observe().await.unwrap();
    assert_eq!(sim.0.lock().unwrap().layer_asks, asks, "nothing new to ask about");
    // What the removals measured survives a restart (the state file).
    let next = next_process(&c, *c.clock());
    let restored = |name: &str| next.layers().learned_of(&layer(name)).map(|l| l.bytes);
    assert_eq!(
        (restored("a"), restored("base"), restored("c")),
        (Some(30), Some(50), Some(100))
    );
}

/// A runtime that names no image's layers is asked about the first few
/// images only, and never again: each image counts whole.
#[tokio::test]
async fn a_runtime_that_names_no_layers_is_not_asked_again() {
    let sim = SimHandle::default();
    sim.with(|s| {
        for n in 0..40 {
            s.unused(&format!("i{n}"), 10, 10);
        }
        s.disk.set(1000, 900);
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    c.observe().await.unwrap();
    let asked = sim.0.lock().unwrap().layer_asks;
    assert_eq!(asked, 16);
    sim.with(|s| s.unused("new", 10, 10));
    c.observe().await.unwrap();
    c.poll_usage().await.unwrap();
    assert_eq!(sim.0.lock().unwrap().layer_asks, asked);
    assert!(c.layers().is_empty());
}

/// What measured removals taught of the bytes on disk per reported byte
/// survives a restart: the next process (or `plan`) estimates by it from
/// its first listing.
#[tokio::test]
async fn the_footprint_measured_removals_raised_survives_a_restart() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.unused("x", 100, 300);
        s.unused("y", 100, 300);
        s.disk.set(1000, 50);
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    cycle(&mut c).await;
    assert_eq!(c.footprint().factor(), 3.0);
    let mut next = next_process(&c, *c.clock());
    assert_eq!(next.footprint().factor(), 1.0, "not before the runtime is named");
    next.observe().await.unwrap();
    assert_eq!(next.footprint().factor(), 3.0);
}

#[tokio::test]
async fn the_plans_forecast_is_what_a_dry_run_cycle_does() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![
            image("old", 100),
            image("a", 100),
            image("b", 100),
            image("c", 100),
        ]);
        s.disk.set(1000, 50);
    });
    let (mut c, _dir) = collector(&sim, |c| {
        c.gc.dry_run = true;
        c.gc.max_age = Duration::from_secs(60);
    });
    cycle(&mut c).await;
    let old = SystemTime::now() - Duration::from_secs(7200);
    let mut map = HashMap::new();
    for (id, at) in [
        ("old", old),
        ("a", old + Duration::from_secs(60)),
        ("b", SystemTime::now()),
        ("c", SystemTime::now()),
    ] {
        map.insert(
            id.to_string(),
            crate::records::Record {
                first_seen: old,
                last_used: at,
                size: 100,
                pinned: false,
                tags: Default::default(),
                digests: Default::default(),
                from_history: true,
                ever_used: true,
                usual_break: None,
            },
        );
    }
    let mut c = next_process_with_history(&c, Records::from_map(map));
    // What `plan` shows.
    let listing = c.observe().await.unwrap();
    let (age, space, _) = plan_forecast(&c, &listing, &sim);
    // 150 bytes to free: the age removals' 200 (old, a) already cover it.
    assert_eq!(age, ["old", "a"]);
    assert!(space.is_empty(), "{space:?}");
    // What a dry-run cycle does.
    let report = cycle(&mut c).await;
    let by = |reason| -> Vec<String> {
        report
            .removed
            .iter()
            .filter(|r| r.reason == reason)
            .map(|r| r.id.clone())
            .collect()
    };
    assert_eq!(by(Reason::Age), age);
    assert_eq!(by(Reason::Space), space, "the cycle walked as the forecast said");
}

#[tokio::test]
async fn an_image_a_pod_names_is_kept_by_the_plan_and_by_the_recheck() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node
            .set_images(vec![image("a", 100), image("b", 100), image("c", 100)]);
        s.disk.set(1000, 0);
        // b gains, between the listing and its removal, the name a pod
        // bound to the node runs.
        s.tag_at_list = Some((2, "b".to_string(), "docker.io/library/web:1".to_string()));
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    c.set_protections(crate::policy::Protections {
        references: vec![
            ("a".to_string(), "ns/starting".to_string()),
            ("web:1".to_string(), "ns/web".to_string()),
        ],
        ..Default::default()
    });
    let report = cycle(&mut c).await;
    assert_eq!(sim.removed(), ["c"], "a kept by the plan, b by the re-check");
    assert_eq!(report.removed.len(), 1);
    // Once the pods are gone, so is the protection.
    c.set_protections(crate::policy::Protections::default());
    sim.with(|s| s.disk.set_available(0));
    cycle(&mut c).await;
    assert_eq!(sim.removed()[..2], ["c", "a"]);
}

#[tokio::test]
async fn a_keep_rule_added_to_the_rules_holds_in_the_plan_and_at_the_recheck() {
    let sim = SimHandle::default();
    sim.with(|s| {
        let mut a = image("a", 100);
        a.repo_tags = vec!["docker.io/library/keep:1".to_string()].into();
        s.node.set_images(vec![a, image("b", 100), image("c", 100)]);
        s.disk.set(1000, 0);
        // b gains, between the listing and its removal, the name the rule
        // keeps.
        // (Listings of containers: `observe` below, the cycle's, then b's re-check.)
        s.tag_at_list = Some((3, "b".to_string(), "docker.io/library/keep:2".to_string()));
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    // A rule that exists only in `Rules`: nothing else knows of it.
    let mut settings = c.settings().clone();
    Arc::make_mut(&mut settings.policy).keep.test_rule =
        Some(|image| image.repo_tags.iter().any(|t| t.starts_with("docker.io/library/keep:")));
    c.set_settings(settings);
    let listing = c.observe().await.unwrap();
    let (planned, _) = c.cycle_plan(&listing, None);
    assert_eq!(
        planned.plan.kept.iter().find(|k| k.id == "a").map(|k| &k.why),
        Some(&crate::policy::KeepReason::Protected { pattern: "test rule" }),
        "the plan keeps a"
    );
    let report = cycle(&mut c).await;
    assert_eq!(sim.removed(), ["c"], "a kept by the plan, b by the re-check");
    assert_eq!(report.removed.len(), 1);
}

/// The ids of the images each event names: `GoneAlready` and `Kept`.
#[derive(Default)]
struct GoneOrKept(Mutex<(Vec<String>, Vec<String>)>);

impl crate::engine::Sink for GoneOrKept {
    fn emit(&self, event: &Event<'_>) {
        let mut seen = self.0.lock().unwrap();
        match event {
            Event::GoneAlready { id, .. } => seen.0.push(id.to_string()),
            Event::Kept { id, .. } => seen.1.push(id.to_string()),
            _ => {}
        }
    }
}

#[tokio::test]
async fn an_image_someone_else_removed_before_its_recheck_is_gone_already_not_kept_nor_counted() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100), image("b", 100)]);
        s.disk.set(1000, 0);
        // Removed by another collector between the listing and a's re-check.
        s.gone_at_list = Some((2, "a".to_string()));
    });
    let (c, _dir) = collector(&sim, |_| {});
    let seen = Arc::new(GoneOrKept::default());
    let mut c = c.with_sink(Arc::clone(&seen) as Arc<dyn crate::engine::Sink>);
    let report = cycle(&mut c).await;
    let (gone, kept) = std::mem::take(&mut *seen.0.lock().unwrap());
    assert_eq!(gone, ["a"]);
    assert!(kept.is_empty(), "{kept:?}");
    assert_eq!(sim.removed(), ["b"], "a was not this collector's to remove");
    assert_eq!(report.removed.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["b"]);
    // One answer: its record stays until a listing omits it too.
    assert!(c.records().get("a").is_some());
    assert!(c.poll_usage().await.is_ok());
    assert!(c.records().get("a").is_none(), "its record goes");
}

#[tokio::test]
async fn a_pod_bound_between_the_plan_and_a_removal_keeps_its_image() {
    let sim = SimHandle::default();
    let (sender, pods) = tokio::sync::watch::channel(Arc::new(crate::policy::Protections::default()));
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100), image("b", 100)]);
        s.disk.set(1000, 0);
        // The watch learns of a pod naming b after the cycle's listing,
        // before b's re-check.
        let pods = crate::policy::Protections {
            references: vec![("b".to_string(), "ns/late".to_string())],
            ..Default::default()
        };
        s.pods_at_list = Some((2, sender, pods));
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    c.protections_from(pods);
    let report = cycle(&mut c).await;
    assert_eq!(sim.removed(), ["a"], "b was kept at its re-check");
    assert_eq!(report.removed.len(), 1);
}

/// `b` with a second tag, `registry.test/b:2`, that its `ImageStatus`
/// no longer gives (one entry of an id listed twice, or a tag moved since
/// the listing); `a` beside it. Both unused at the listing.
fn an_image_whose_status_drops_a_name(sim: &SimHandle) {
    let mut b = image("b", 100);
    b.repo_tags = vec![
        "docker.io/library/b:latest".to_string(),
        "registry.test/b:2".to_string(),
    ]
    .into();
    b.repo_digests = vec![format!("registry.test/b@sha256:{}", "b".repeat(64))].into();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100), b]);
        s.disk.set(1000, 0);
        s.status_fewer_names = vec!["b".to_string()];
    });
}

#[tokio::test]
async fn a_container_naming_its_image_by_a_name_the_recheck_does_not_give_keeps_it() {
    // By the tag alone, and by the repository digest alone with no image
    // id (CRI-O's way), each created after the listing, before b's
    // re-check.
    for (by, reference) in [
        ("tag", "registry.test/b:2".to_string()),
        ("digest", format!("registry.test/b@sha256:{}", "b".repeat(64))),
    ] {
        let sim = SimHandle::default();
        an_image_whose_status_drops_a_name(&sim);
        sim.with(|s| {
            s.appear_at_list = Some((
                2,
                crate::cri::Container {
                    id: "late".to_string(),
                    image: "registry.test/b:2".to_string(),
                    image_ref: reference,
                    state: Some(crate::cri::ContainerState::Running),
                    ..Default::default()
                },
            ));
        });
        let (mut c, _dir) = collector(&sim, |_| {});
        let report = cycle(&mut c).await;
        assert_eq!(sim.removed(), ["a"], "b is kept when named by its {by}");
        assert_eq!(report.became_in_use, ["b"]);
    }
}

#[tokio::test]
async fn a_pod_naming_its_image_by_a_name_the_recheck_does_not_give_keeps_it() {
    let sim = SimHandle::default();
    an_image_whose_status_drops_a_name(&sim);
    let (sender, pods) = tokio::sync::watch::channel(Arc::new(crate::policy::Protections::default()));
    sim.with(|s| {
        let pods = crate::policy::Protections {
            references: vec![("registry.test/b:2".to_string(), "ns/late".to_string())],
            ..Default::default()
        };
        s.pods_at_list = Some((2, sender, pods));
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    c.protections_from(pods);
    cycle(&mut c).await;
    assert_eq!(sim.removed(), ["a"], "b was kept at its re-check");
}

#[tokio::test]
async fn one_not_found_for_an_image_that_is_there_is_no_removal_by_others() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100), image("b", 100)]);
        s.disk.set(1000, 0);
        s.status_not_found_once = vec!["a".to_string()];
    });
    let (mut c, dir) = collector(&sim, |_| {});
    cycle(&mut c).await;
    // The listing had it, the re-check was told it was gone: kept, not
    // counted, and its history stays.
    assert_eq!(sim.removed(), ["b"]);
    let first_seen = c.records().get("a").expect("its record stays").first_seen;
    none_removed_by_others(&c);
    // The next listings still list it: nothing was removed by anyone.
    assert!(c.poll_usage().await.is_ok());
    assert!(c.poll_usage().await.is_ok());
    none_removed_by_others(&c);
    assert_eq!(c.records().get("a").map(|r| r.first_seen), Some(first_seen));
    assert!(journaled(&dir).iter().all(|e| e.image != "a"));
}

/// A collector on a node that lists only `b`, and the note of a removal of
/// `a` that an earlier process asked for and sent before it was killed.
fn after_an_earlier_process_removed_a() -> (
    SimHandle,
    Collector<SimHandle>,
    tempfile::TempDir,
    crate::store::journal::JournalEntry,
) {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("b", 100)]);
        s.disk.set(1000, 900);
    });
    let (mut c, dir) = collector(&sim, |_| {});
    an_earlier_process_asked_to_remove(&mut c, &dir, "a");
    let note = c.remover.pending.entries()[0].entry.clone();
    (sim, c, dir, note)
}

#[tokio::test]
async fn a_removal_journaled_just_before_a_kill_is_not_journaled_again_by_the_next_process() {
    // The process before noted the removal of `a`, the runtime made it,
    // the journal line was written, and the process was killed before
    // the note was forgotten (forgetting it is not synced).
    let (_sim, mut c, dir, note) = after_an_earlier_process_removed_a();
    let mut line = crate::store::journal::JournalEntry::from_removal(&removal_of(&note), c.clock.now());
    // An earlier removal of the same image, in the same second, journaled
    // whole: it is not this one.
    crate::store::journal::Journal::new(dir.path()).append(&line);
    line.asked = Some(note.time.clone());
    crate::store::journal::Journal::new(dir.path()).append(&line);
    cycle(&mut c).await;
    cycle(&mut c).await;
    let journal = journaled(&dir);
    assert_eq!(journal.iter().filter(|e| e.image == "a").count(), 2, "{journal:?}");
    assert_eq!(
        sample(&c, "image_garbage_collected_total{reason=\"space\"}").as_deref(),
        Some("0"),
        "counted by the process that made it, not again"
    );
    assert!(c.remover.pending.entries().is_empty());
}

#[tokio::test]
async fn a_removal_killed_before_its_journal_line_is_journaled_though_one_of_the_same_image_was_that_second() {
    let (_sim, mut c, dir, note) = after_an_earlier_process_removed_a();
    // The removal of `a` before this one, journaled in the same second.
    let mut earlier = crate::store::journal::JournalEntry::from_removal(&removal_of(&note), c.clock.now());
    earlier.asked = Some("2026-01-01T00:00:00.000000001Z".to_string());
    crate::store::journal::Journal::new(dir.path()).append(&earlier);
    cycle(&mut c).await;
    let journal = journaled(&dir);
    assert_eq!(journal.iter().filter(|e| e.image == "a").count(), 2, "{journal:?}");
    assert_eq!(journal[1].note.as_deref(), Some("completed after shutdown"));
}

/// `imagegc_images_removed_by_others_total`, `..._bytes_total` and the
/// last one's time.
fn removed_by_others(c: &Collector<SimHandle>) -> (String, String, String) {
    let get = |name| sample(c, name).unwrap_or_default();
    (
        get("imagegc_images_removed_by_others_total"),
        get("imagegc_removed_by_others_bytes_total"),
        get("imagegc_last_removal_by_others_timestamp_seconds"),
    )
}

fn none_removed_by_others(c: &Collector<SimHandle>) {
    assert_eq!(
        removed_by_others(c),
        ("0".to_string(), "0".to_string(), "0.0".to_string()),
        "nothing removed by others"
    );
}

#[tokio::test]
async fn an_image_someone_else_removes_is_counted_once_with_its_last_known_size() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node
            .set_images(vec![image("a", 100), image("b", 250), image("c", 40)]);
        s.disk.set(1000, 900);
    });
    let (mut c, dir) = collector(&sim, |_| {});
    cycle(&mut c).await;
    none_removed_by_others(&c);
    // The kubelet's image GC removes `b` and `c` between two listings.
    sim.with(|s| s.node.retain_images(|i| i.id == "a"));
    assert!(c.poll_usage().await.is_ok());
    let at = c
        .clock
        .now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let (images, bytes, last) = removed_by_others(&c);
    assert_eq!((images.as_str(), bytes.as_str()), ("2", "290"));
    assert!((last.parse::<f64>().unwrap() - at).abs() < 5.0, "{last} vs {at}");
    assert!(c.records().get("b").is_none(), "its record goes with it");
    cycle(&mut c).await;
    assert!(c.poll_usage().await.is_ok());
    assert_eq!(removed_by_others(&c).0, "2", "counted once");
    assert!(journaled(&dir).is_empty(), "not imagegc's removals");
    assert_eq!(
        sample(&c, "image_garbage_collected_total{reason=\"space\"}").as_deref(),
        Some("0")
    );
}

#[tokio::test]
async fn an_image_a_partial_listing_omits_is_not_removed_by_others() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100), image("b", 100)]);
        s.disk.set(1000, 900);
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    cycle(&mut c).await;
    // Omitted, and ImageStatus cannot answer: unsure, not counted...
    sim.with(|s| {
        s.omit = vec!["a".to_string()];
        s.fail_image_status = true;
    });
    assert!(c.poll_usage().await.is_ok());
    none_removed_by_others(&c);
    // ...then ImageStatus finds it: it is there.
    sim.with(|s| s.fail_image_status = false);
    assert!(c.poll_usage().await.is_ok());
    sim.with(|s| s.omit.clear());
    cycle(&mut c).await;
    none_removed_by_others(&c);
    // A listing of nothing (a runtime restarting) tells nothing either.
    let images = sim.0.lock().unwrap().node.images().to_vec();
    sim.with(|s| s.node.retain_images(|_| false));
    // ImageStatus would say not found for every image now: the empty
    // listing must not ask.
    assert!(c.poll_usage().await.is_ok());
    sim.with(|s| s.node.set_images(images));
    assert!(c.poll_usage().await.is_ok());
    cycle(&mut c).await;
    none_removed_by_others(&c);
}

#[tokio::test]
async fn a_candidate_someone_else_removed_before_its_recheck_is_counted_once_a_listing_omits_it() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node
            .set_images(vec![image("a", 100), image("b", 100), image("used", 100)]);
        s.node.containers.push(crate::testing::container_naming("c", "used"));
        s.disk.occupy("a", 100);
        s.disk.occupy("b", 100);
        s.disk.set(1000, 50);
        // Listed by the cycle, gone by its re-check.
        s.vanish_at_list = Some((1, "a".to_string()));
    });
    let (mut c, dir) = collector(&sim, |_| {});
    cycle(&mut c).await;
    // One answer is not enough: counted once listings omit it too.
    none_removed_by_others(&c);
    assert!(c.poll_usage().await.is_ok());
    assert_eq!(removed_by_others(&c).0, "1");
    assert!(journaled(&dir).iter().all(|e| e.image != "a"));
    assert!(c.records().get("a").is_none(), "its record goes with it");
    // Not counted again.
    assert!(c.poll_usage().await.is_ok());
    cycle(&mut c).await;
    assert_eq!(removed_by_others(&c).0, "1");
}

#[tokio::test]
async fn removals_imagegc_asked_for_are_never_removed_by_others() {
    // Finished by the runtime after a listing still listed it.
    let (_sim, mut c, _dir) = a_removal_of_a_that_times_out(Some(2)).await;
    assert!(c.poll_usage().await.is_ok());
    assert!(c.poll_usage().await.is_ok());
    cycle(&mut c).await;
    none_removed_by_others(&c);
    // Finished as it was asked again (RemoveImage answers not found).
    let (sim, mut c, _dir) = a_removal_of_a_that_times_out(Some(1000)).await;
    sim.with(|s| s.hang_remove.clear());
    cycle(&mut c).await;
    assert!(c.poll_usage().await.is_ok());
    none_removed_by_others(&c);
    // Asked by a process killed during the call, gone by the next start.
    let (sim, mut c, dir) = a_removal_of_a_that_times_out(None).await;
    c.save().await;
    sim.with(|s| {
        s.node.retain_images(|i| i.id != "a");
        s.hang_remove.clear();
    });
    let mut next = next_process(&c, Clock::starting_at(SystemTime::now() - Duration::from_secs(3600)));
    drop(c);
    cycle(&mut next).await;
    cycle(&mut next).await;
    none_removed_by_others(&next);
    assert_eq!(journaled(&dir).iter().filter(|e| e.image == "a").count(), 1);
}

#[tokio::test]
async fn a_removal_journaled_before_a_kill_that_left_its_record_is_not_removed_by_others() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100), image("b", 100)]);
        s.disk.set(1000, 900);
    });
    let (mut c, dir) = collector(&sim, |_| {});
    cycle(&mut c).await;
    // The process removed `a` and journaled it, and was killed before its
    // records were saved and before its note was: only the line is left.
    let record = c.records().get("a").unwrap().clone();
    let line = Removal {
        id: "a".into(),
        tags: vec![],
        digests: vec![],
        reason: Reason::Space,
        size: 100,
        freed_bytes: None,
        first_seen: record.first_seen,
        last_used: record.last_used,
        dry_run: false,
    };
    Journal::new(dir.path()).append(&crate::store::journal::JournalEntry::from_removal(&line, c.clock.now()));
    sim.with(|s| s.node.retain_images(|i| i.id != "a"));
    assert!(c.poll_usage().await.is_ok());
    none_removed_by_others(&c);
}

#[tokio::test]
async fn images_whose_status_cannot_be_read_do_not_keep_the_others_from_being_asked_about() {
    let sim = SimHandle::default();
    let many: Vec<String> = (0..40).map(|i| format!("u{i:02}")).collect();
    sim.with(|s| {
        s.node.set_images(
            many.iter()
                .map(|id| image(id, 10))
                .chain([image("x", 7), image("kept", 1)])
                .collect(),
        );
        s.disk.set(1000, 900);
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    cycle(&mut c).await;
    // All go at once; the runtime cannot answer about 40 of them.
    sim.with(|s| {
        s.node.retain_images(|i| i.id == "kept");
        s.fail_image_status_of = many.clone();
    });
    // 41 to ask about, 16 at a time: `x` is asked by the third listing
    // whatever its place.
    for _ in 0..3 {
        assert!(c.poll_usage().await.is_ok());
    }
    assert_eq!(removed_by_others(&c).0, "1");
    assert_eq!(removed_by_others(&c).1, "7");
}

/// The daemon's cycle, `imagegc plan`'s forecast and `imagegc simulate`'s
/// replay run one script (`policy::CyclePlan`): on one node they remove the
/// same images in the same order. The node: five images of 100 MB, four
/// of them used last 100 s apart and one running, then an image of 400 MB
/// pulled and run, which takes usage from 50% to 90%; high 80, low 65.
#[tokio::test]
async fn the_daemon_plan_and_simulate_remove_the_same_images_in_the_same_order() {
    const MB: u64 = 1_000_000;
    let sizes = [100 * MB, 100 * MB, 100 * MB, 100 * MB, 100 * MB, 400 * MB];
    let stops = [Some(100), Some(200), Some(300), Some(400), None];
    let pull_at = 10_000;
    let configure = |c: &mut Config| {
        c.gc.high_threshold_percent = 80;
        c.gc.low_threshold_percent = 65;
        c.gc.min_age = Duration::from_secs(60);
        // The kubelet's default line: the 400 MB pull's headroom lowers the
        // thresholds to 60/45 in all three, and the daemon's pass hurries.
        c.eviction_imagefs_available = Some(crate::config::EvictionThreshold::Percent(15.0));
        c.gc.headroom = true;
    };
    let mut config = Config::default();
    configure(&mut config);
    // `simulate`: the replay. Its cycle that removes comes one usage check
    // after the pull, which crosses high.
    let simulated = crate::sim::replay::tests::removals_after_a_pull(&sizes, &stops, (5, pull_at), 1000 * MB, &config);
    let simulated: Vec<String> = simulated.iter().map(u32::to_string).collect();
    let at = pull_at + crate::policy::cycle::USAGE_CHECK_INTERVAL.as_secs();

    // The same node for the daemon, as the runtime lists it at that cycle.
    let sim = SimHandle::default();
    sim.with(|s| {
        for (i, &size) in sizes.iter().enumerate() {
            s.unused(&i.to_string(), size, size);
        }
        s.node.containers = vec![
            crate::testing::container_naming("c4", "4"),
            crate::testing::container_naming("c5", "5"),
        ];
        s.disk.set(1000 * MB, 100 * MB);
    });
    let (c, _dir) = collector(&sim, configure);
    let now = SystemTime::now();
    let ago = |secs: u64| now - Duration::from_secs(secs);
    let history = sizes.iter().enumerate().map(|(i, &size)| {
        let (first_seen, last_used) = match stops.get(i) {
            Some(Some(stop)) => (ago(at), ago(at - stop)),
            Some(None) => (ago(at), now),
            None => (ago(at - pull_at), now),
        };
        crate::testing::history(&image(&i.to_string(), size), first_seen, last_used)
    });
    let map: HashMap<_, _> = history.collect();
    let mut c = next_process_with_history(&c, Records::from_map(map));
    // `plan`: the cycle's plan, its space pass by the estimate.
    let listing = c.observe().await.unwrap();
    // (a space pass is due at 90 %)
    let (_, planned, _) = plan_forecast(&c, &listing, &sim);
    // The daemon's cycle, removing.
    let report = cycle(&mut c).await;
    // Low 45 % (the headroom's): every unused image, one short of it.
    assert_eq!(sim.removed(), ["0", "1", "2", "3"], "{report:?}");
    assert!(report.hurried, "90 % is past the line");
    assert_eq!(planned, sim.removed(), "plan's forecast");
    assert_eq!(simulated, sim.removed(), "simulate's replay");
}

/// Four 100-byte images whose space comes back in the background, a
/// moment after each `RemoveImage` returns (containerd 2.x), on a full
/// disk: 200 bytes to free to reach low (80 %). `line`: the kubelet's
/// eviction line.
async fn full_disk_removed_in_the_background(line: crate::config::EvictionThreshold) -> (SimHandle, CycleReport) {
    let sim = SimHandle::default();
    sim.with(|s| {
        for id in ["a", "b", "c", "d"] {
            s.unused(id, 100, 0);
            s.disk.frees_late(id, 100);
        }
        s.disk.set(1000, 0);
    });
    let (mut c, _dir) = collector(&sim, |c| c.eviction_imagefs_available = Some(line));
    let report = cycle(&mut c).await;
    (sim, report)
}

#[tokio::test(start_paused = true)]
async fn past_the_eviction_line_removals_wait_for_no_space_and_the_walk_ends_on_what_came_back() {
    let (sim, report) = full_disk_removed_in_the_background(crate::config::EvictionThreshold::Percent(15.0)).await;
    assert!(report.hurried);
    assert_eq!(sim.removed(), ["a", "b"], "{report:?}");
    // One RemoveImage after the other, no watch between them.
    let at = sim.0.lock().unwrap().removed_at.clone();
    assert!(at[1] - at[0] < SETTLE_STEP, "{:?}", at[1] - at[0]);
    // Then measured once the space came back: low reached.
    assert_eq!(report.outcome, Outcome::Success);
    assert_eq!(report.after.unwrap().available_bytes, 200);
    // Not measured one by one: the journal says nothing it does not know.
    assert!(report.removed.iter().all(|r| r.freed_bytes.is_none()), "{report:?}");
}

#[tokio::test(start_paused = true)]
async fn below_the_eviction_line_each_removal_is_measured_before_the_next() {
    // The same node where the kubelet keeps no space: the walk watches each
    // removal's space come back, and removes the same images.
    let (sim, report) = full_disk_removed_in_the_background(crate::config::EvictionThreshold::Bytes(0)).await;
    assert!(!report.hurried);
    assert_eq!(sim.removed(), ["a", "b"], "{report:?}");
    let at = sim.0.lock().unwrap().removed_at.clone();
    assert!(at[1] - at[0] >= SETTLE_STEP, "{:?}", at[1] - at[0]);
    assert_eq!(report.removed[0].freed_bytes, Some(100));
}

#[tokio::test(start_paused = true)]
async fn a_hurry_that_expected_more_than_came_back_goes_on_from_the_measurement() {
    // Reported 100, but only 50 each comes back (layers shared with an
    // image in use): the estimate says low after two removals, the
    // measurement says 100 short, and the walk goes on in a hurry.
    let sim = SimHandle::default();
    sim.with(|s| {
        for id in ["a", "b", "c", "d", "e"] {
            s.unused(id, 100, 0);
            s.disk.frees_late(id, 50);
        }
        s.disk.set(1000, 0);
    });
    let (mut c, _dir) = collector(&sim, |c| {
        c.eviction_imagefs_available = Some(crate::config::EvictionThreshold::Percent(15.0));
    });
    let report = cycle(&mut c).await;
    assert_eq!(sim.removed(), ["a", "b", "c", "d"], "{report:?}");
    assert_eq!(report.outcome, Outcome::Success);
    assert_eq!(report.after.unwrap().available_bytes, 200);
    assert!(
        c.metrics().encode().contains("imagegc_hurried_space_passes_total 2"),
        "a hurry, then another while still past the line"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hurry_removes_only_what_the_line_needs_then_measures() {
    // Layers that compress well: each image takes six times what the
    // runtime reports (60 for 10), back a moment after each call. Full
    // disk, line at 15 %, low 80 %: 200 to free, four images by what is
    // back. By the estimate alone (10 each) the hurry would take all seven.
    let sim = SimHandle::default();
    let ids = ["a", "b", "c", "d", "e", "f", "g"];
    sim.with(|s| {
        for id in ids {
            s.unused(id, 10, 0);
            s.disk.frees_late(id, 60);
        }
        s.disk.set(1000, 0);
    });
    let (mut c, _dir) = collector(&sim, |c| {
        c.eviction_imagefs_available = Some(crate::config::EvictionThreshold::Percent(15.0));
    });
    let report = cycle(&mut c).await;
    assert!(report.hurried);
    assert_eq!(report.outcome, Outcome::Success, "{report:?}");
    let removed = sim.removed();
    assert!(removed.len() < ids.len(), "{removed:?}");
    assert!(report.after.unwrap().available_bytes >= 200, "{report:?}");
    assert!(
        report.after.unwrap().available_bytes < 200 + 60 * 3,
        "no more than the line needs, then measured: {removed:?}"
    );
}

/// A node at 78 %, below high (80): six unused images of 400 bytes (4 %:
/// they fit between high and the kubelet's eviction line, 85 %) and, when
/// `big` is given, an image of that size in use that arrived just now.
async fn below_high_after_a_pull(big: Option<u64>) -> (SimHandle, CycleReport) {
    let sim = SimHandle::default();
    sim.with(|s| {
        for id in ["a", "b", "c", "d", "e", "f"] {
            s.unused(id, 400, 400);
        }
        if let Some(size) = big {
            s.node.add_image(image("big", size));
            s.node.containers = vec![crate::testing::container_naming("job", "big")];
        }
        s.disk.set(10_000, 2_200);
    });
    let (mut c, _dir) = collector(&sim, |c| {
        c.gc.high_threshold_percent = 80;
        c.gc.low_threshold_percent = 75;
        c.gc.headroom = true;
        c.eviction_imagefs_available = Some(crate::config::EvictionThreshold::Percent(15.0));
    });
    let report = cycle(&mut c).await;
    (sim, report)
}

#[tokio::test]
async fn after_a_pull_that_would_not_fit_above_the_eviction_line_the_space_pass_starts_below_high() {
    // The node pulled a 2,000-byte image: 1,500 (the line) and 2,000 must
    // stay available, so high is 65 and low 60 here: 4,000 available.
    let (sim, report) = below_high_after_a_pull(Some(2_000)).await;
    assert!(report.space_pass, "{report:?}");
    assert_eq!(sim.removed().len(), 5, "{report:?}");
    assert_eq!(report.after.unwrap().available_bytes, 4_200);
    // A node whose pulls fit keeps its thresholds: nothing at 78 %.
    let (sim, report) = below_high_after_a_pull(Some(300)).await;
    assert!(!report.space_pass, "{report:?}");
    assert!(sim.removed().is_empty());
}

/// A node at 35 % (1000 MB) with six unused 25 MB images, a 420 MB image
/// of `registry.test/app` it had before, and the kubelet's line at 30 %
/// available; high 55, low 50. Then a pod bound to the node names
/// `registry.test/app:2`, which the node lacks: its pull would take usage
/// to 77 %, past the line.
async fn a_pod_on_a_node_that_had_its_repository(
    room_before_pulls: bool,
) -> (SimHandle, Collector<SimHandle>, tempfile::TempDir, Config) {
    const MB: u64 = 1_000_000;
    let sim = SimHandle::default();
    let tagged = |id: &str, tag: &str, size: u64| Image {
        repo_tags: vec![tag.to_string()].into(),
        ..image(id, size)
    };
    sim.with(|s| {
        for i in 0..6 {
            s.unused(&format!("old-{i}"), 25 * MB, 25 * MB);
        }
        s.disk.set(1000 * MB, 650 * MB);
    });
    // The node had app:1 when the last process saved its records (it went
    // since); its next process remembers its size.
    let now = SystemTime::now();
    let hour_ago = now - Duration::from_secs(3600);
    let had = crate::testing::history(&tagged("app-1", "registry.test/app:1", 420 * MB), hour_ago, hour_ago);
    let configure = |c: &mut Config| {
        c.gc.high_threshold_percent = 55;
        c.gc.low_threshold_percent = 50;
        c.eviction_imagefs_available = Some(crate::config::EvictionThreshold::Percent(30.0));
        c.kubernetes.enabled = true;
        c.kubernetes.room_before_pulls = room_before_pulls;
    };
    let (mut c, dir) = collector_with_history(&sim, configure, Records::from_map([had]));
    let config = test_config(dir.path(), configure);
    cycle(&mut c).await;
    assert!(sim.removed().is_empty());
    c.set_protections(crate::policy::Protections {
        references: vec![
            ("registry.test/app:2".to_string(), "default/app-5f4".to_string()),
            // An image a pod names is never removed to make room.
            ("old-0".to_string(), "default/cron".to_string()),
        ],
        ..Default::default()
    });
    (sim, c, dir, config)
}

#[tokio::test]
async fn a_pull_coming_for_a_pod_that_would_cross_the_eviction_line_gets_its_room_first_and_once() {
    const MB: u64 = 1_000_000;
    let (sim, mut c, _dir, _) = a_pod_on_a_node_that_had_its_repository(true).await;
    // 35 % is below high (55), but not 420 MB above the line (30 %): the
    // thresholds in force are 28/23.
    assert_eq!(c.check_usage(), Some(true), "a space pass is due before the pull");
    let report = cycle(&mut c).await;
    assert_eq!(
        sim.removed(),
        ["old-1", "old-2", "old-3", "old-4", "old-5"],
        "down to 23 %, never the image a pod names: {report:?}"
    );
    assert!(report.hurried, "the pull would cross the line: no settle waits");
    assert_eq!(sample(&c, "imagegc_room_before_pulls_total").as_deref(), Some("1"));
    // The pull's blobs arrive: the room was made for them, nothing more goes.
    sim.with(|s| s.disk.set_available(s.disk.available() - 300 * MB));
    assert_eq!(
        c.check_usage(),
        Some(false),
        "{:?}",
        sim.0.lock().unwrap().disk.available()
    );
    cycle(&mut c).await;
    assert_eq!(sim.removed().len(), 5);
    // The image lands under the line.
    sim.with(|s| {
        s.disk.set_available(s.disk.available() - 120 * MB);
        s.node.add_image(Image {
            repo_tags: vec!["registry.test/app:2".to_string()].into(),
            ..image("app-2", 420 * MB)
        });
    });
    let stats = sim.stats(Path::new("/sim")).unwrap();
    assert!(stats.available() >= 300 * MB, "{stats:?}");
    cycle(&mut c).await;
    assert_eq!(sim.removed().len(), 5);
}

#[tokio::test]
async fn without_room_before_pulls_a_coming_pull_starts_nothing() {
    let (sim, mut c, _dir, _) = a_pod_on_a_node_that_had_its_repository(false).await;
    assert_eq!(c.check_usage(), Some(false));
    cycle(&mut c).await;
    assert!(sim.removed().is_empty());
}

#[tokio::test]
async fn a_pull_of_a_repository_the_node_never_had_is_not_sized_and_starts_nothing() {
    let (sim, mut c, _dir, _) = a_pod_on_a_node_that_had_its_repository(true).await;
    c.set_protections(crate::policy::Protections {
        references: vec![("registry.test/other:1".to_string(), "default/new".to_string())],
        ..Default::default()
    });
    assert_eq!(c.check_usage(), Some(false));
    cycle(&mut c).await;
    assert!(sim.removed().is_empty());
}

/// Sizes given by a test, as a registry's manifests would give them: the
/// references asked for are noted.
struct GivenSizes {
    sizes: Mutex<HashMap<String, u64>>,
    asked: Mutex<Vec<String>>,
    answered: tokio::sync::watch::Sender<u64>,
}

impl Default for GivenSizes {
    fn default() -> Self {
        GivenSizes {
            sizes: Mutex::default(),
            asked: Mutex::default(),
            answered: tokio::sync::watch::channel(0).0,
        }
    }
}

impl GivenSizes {
    /// `reference` read at `size`; who waits on answers is woken.
    fn answer(&self, reference: &str, size: u64) {
        self.sizes.lock().unwrap().insert(reference.to_string(), size);
        self.answered.send_modify(|n| *n += 1);
    }
}

impl super::PullSizes for GivenSizes {
    fn size_of(&self, reference: &str) -> Option<u64> {
        self.asked.lock().unwrap().push(reference.to_string());
        self.sizes.lock().unwrap().get(reference).copied()
    }

    fn read_for(&self, image: &Image) -> Option<u64> {
        let sizes = self.sizes.lock().unwrap();
        image.repo_tags.iter().find_map(|tag| sizes.get(tag).copied())
    }

    fn answers(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.answered.subscribe())
    }
}

/// The daemon loop on `c` (a [`a_pod_on_a_node_that_had_its_repository`]
/// node), its pods' images given by the returned sender, until the token
/// is cancelled; returned after its first cycle (10 s of virtual time).
async fn daemon_on(
    mut c: Collector<SimHandle>,
    config: Config,
) -> (
    tokio::sync::watch::Sender<Arc<crate::policy::Protections>>,
    CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let (pods, watched) = tokio::sync::watch::channel(Arc::new(crate::policy::Protections::default()));
    c.protections_from(watched);
    let health = Arc::new(crate::outputs::health::Health::new(Duration::from_secs(600)));
    let shutdown = CancellationToken::new();
    let (reloads, reload_rx) = tokio::sync::mpsc::unbounded_channel::<Arc<Config>>();
    let stop = shutdown.clone();
    let daemon = tokio::spawn(async move {
        let _reloads = reloads;
        crate::daemon::run(c, Arc::new(config), health, stop, reload_rx).await;
    });
    tokio::time::sleep(Duration::from_secs(10)).await;
    (pods, shutdown, daemon)
}

/// Asserts that the first removal on `sim` came within 0.5 s of `since`
/// (virtual time: the daemon's own usage check runs every 2 s, so only a
/// wake-up on `what` is that quick), stops the daemon, and asserts that
/// every old image went but the one a pod names.
async fn room_made_at_once_after(
    what: &str,
    since: tokio::time::Instant,
    sim: &SimHandle,
    shutdown: CancellationToken,
    daemon: tokio::task::JoinHandle<()>,
) {
    while sim.removed().is_empty() {
        assert!(since.elapsed() < Duration::from_secs(60), "nothing removed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let after = since.elapsed();
    assert!(
        after < Duration::from_millis(500),
        "the first removal {after:?} after {what}"
    );
    shutdown.cancel();
    daemon.await.unwrap();
    assert_eq!(sim.removed(), ["old-1", "old-2", "old-3", "old-4", "old-5"]);
}

fn pods_naming(references: &[(&str, &str)]) -> Arc<crate::policy::Protections> {
    Arc::new(crate::policy::Protections {
        references: references.iter().map(|(r, p)| (r.to_string(), p.to_string())).collect(),
        ..Default::default()
    })
}

#[tokio::test(start_paused = true)]
async fn the_daemon_makes_room_as_soon_as_a_pod_is_bound() {
    let (sim, c, _dir, config) = a_pod_on_a_node_that_had_its_repository(true).await;
    let (pods, shutdown, daemon) = daemon_on(c, config).await;
    assert!(sim.removed().is_empty());
    // Between two of the daemon's own usage checks.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let bound = tokio::time::Instant::now();
    pods.send_replace(pods_naming(&[
        ("registry.test/app:2", "default/app-5f4"),
        ("old-0", "default/cron"),
    ]));
    room_made_at_once_after("the binding", bound, &sim, shutdown, daemon).await;
}

#[tokio::test(start_paused = true)]
async fn the_daemon_makes_room_as_soon_as_a_pulls_size_is_read() {
    const MB: u64 = 1_000_000;
    let (sim, c, _dir, config) = a_pod_on_a_node_that_had_its_repository(true).await;
    let sizes = Arc::new(GivenSizes::default());
    let c = c.with_pull_sizes(Arc::clone(&sizes) as Arc<dyn super::PullSizes>);
    let (pods, shutdown, daemon) = daemon_on(c, config).await;
    // A pod bound with an image of a repository the node never had: asked
    // of the registry at once, nothing made room for yet.
    pods.send_replace(pods_naming(&[
        ("registry.test/other:1", "default/new"),
        ("old-0", "default/cron"),
    ]));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        sizes.asked.lock().unwrap().first().map(String::as_str),
        Some("registry.test/other:1")
    );
    assert!(sim.removed().is_empty());
    // The size is read: the usage check runs at once, not at its next turn.
    let answered = tokio::time::Instant::now();
    // 162 MB of manifest: about 420 MB as a runtime storing its layers
    // unpacked reports it (the median ratio, 2.6), as app:1 was.
    sizes.answer("registry.test/other:1", 162 * MB);
    room_made_at_once_after("the answer", answered, &sim, shutdown, daemon).await;
}

#[tokio::test]
async fn a_pull_of_a_repository_the_node_never_had_is_sized_by_its_manifest_when_one_is_read() {
    const MB: u64 = 1_000_000;
    let (sim, c, _dir, _) = a_pod_on_a_node_that_had_its_repository(true).await;
    let sizes = Arc::new(GivenSizes::default());
    let mut c = c.with_pull_sizes(Arc::clone(&sizes) as Arc<dyn super::PullSizes>);
    c.set_protections(crate::policy::Protections {
        references: vec![
            ("registry.test/other:1".to_string(), "default/new".to_string()),
            ("old-0".to_string(), "default/cron".to_string()),
        ],
        ..Default::default()
    });
    // Not read yet: asked for, nothing made room for.
    assert_eq!(c.check_usage(), Some(false));
    assert_eq!(sizes.asked.lock().unwrap().as_slice(), ["registry.test/other:1"]);
    cycle(&mut c).await;
    assert!(sim.removed().is_empty());
    // Read: about the pull the history would have sized (162 MB of
    // manifest, about 420 MB as reported).
    sizes
        .sizes
        .lock()
        .unwrap()
        .insert("registry.test/other:1".to_string(), 162 * MB);
    assert_eq!(c.check_usage(), Some(true), "a space pass is due before the pull");
    let report = cycle(&mut c).await;
    assert_eq!(
        sim.removed(),
        ["old-1", "old-2", "old-3", "old-4", "old-5"],
        "down to the low in force, never the image a pod names: {report:?}"
    );
    assert_eq!(sample(&c, "imagegc_room_before_pulls_total").as_deref(), Some("1"));
    // A pull the node's history sizes is never asked of the registry.
    c.set_protections(crate::policy::Protections {
        references: vec![("registry.test/app:3".to_string(), "default/app".to_string())],
        ..Default::default()
    });
    sizes.asked.lock().unwrap().clear();
    c.check_usage();
    assert!(sizes.asked.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_manifests_size_is_scaled_to_what_the_runtime_reports_and_each_arrival_teaches_the_scale() {
    const MB: u64 = 1_000_000;
    // The simulated runtime reports unpacked sizes, as CRI-O does (its
    // footprint is 1): a manifest's 150 MB of compressed layers are 390 MB
    // reported at the median compression ratio, past the line from 35 %.
    let (sim, c, _dir, _) = a_pod_on_a_node_that_had_its_repository(true).await;
    assert!(!c.inventory.footprint.reports_compressed());
    let sizes = Arc::new(GivenSizes::default());
    sizes.answer("registry.test/other:1", 150 * MB);
    let mut c = c.with_pull_sizes(Arc::clone(&sizes) as Arc<dyn super::PullSizes>);
    c.set_protections(crate::policy::Protections {
        references: vec![
            ("registry.test/other:1".to_string(), "default/new".to_string()),
            ("old-0".to_string(), "default/cron".to_string()),
        ],
        ..Default::default()
    });
    assert_eq!(
        c.check_usage(),
        Some(true),
        "150 MB read as 150 MB would not cross the line"
    );
    cycle(&mut c).await;
    assert!(!sim.removed().is_empty());
    // It arrives reported at its manifest's size (incompressible layers):
    // the ratio moves halfway, from 2.6 to 1.8.
    sim.with(|s| {
        s.disk.set_available(s.disk.available() - 150 * MB);
        s.node.add_image(Image {
            repo_tags: vec!["registry.test/other:1".to_string()].into(),
            ..image("other-1", 150 * MB)
        });
    });
    cycle(&mut c).await;
    assert_eq!(c.inventory.manifest_scale.factor(), 1.8);
    assert_eq!(c.inventory.manifest_scale.reported(100 * MB), 180 * MB);
}

#[tokio::test]
async fn a_manifest_larger_than_the_image_filesystem_is_not_believed() {
    const MB: u64 = 1_000_000;
    let (sim, c, _dir, _) = a_pod_on_a_node_that_had_its_repository(true).await;
    let sizes = Arc::new(GivenSizes::default());
    // More than the whole 1000 MB disk.
    sizes
        .sizes
        .lock()
        .unwrap()
        .insert("registry.test/other:1".to_string(), 1001 * MB);
    let mut c = c.with_pull_sizes(Arc::clone(&sizes) as Arc<dyn super::PullSizes>);
    c.set_protections(crate::policy::Protections {
        references: vec![("registry.test/other:1".to_string(), "default/new".to_string())],
        ..Default::default()
    });
    assert_eq!(c.check_usage(), Some(false));
    cycle(&mut c).await;
    assert!(sim.removed().is_empty(), "a lying registry removes nothing");
}

/// A node of 1000 MB, 650 available: six images of 25 MB (`old-0` named
/// by a pod) and 200 MB of other data; high 55, low 50, the kubelet's line
/// at 30 %. With every removable image gone, 475 MB can be had above the
/// line. The node had `registry.test/rN:1` of `sizes[N]` MB each.
async fn a_node_with_room_for_475_mb_of_pulls(sizes: &[u64]) -> (SimHandle, Collector<SimHandle>, tempfile::TempDir) {
    const MB: u64 = 1_000_000;
    let sim = SimHandle::default();
    sim.with(|s| {
        for i in 0..6 {
            s.unused(&format!("old-{i}"), 25 * MB, 25 * MB);
        }
        s.disk.set(1000 * MB, 650 * MB);
    });
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    let had = sizes.iter().enumerate().map(|(n, size)| {
        let image = Image {
            repo_tags: vec![format!("registry.test/r{n}:1")].into(),
            ..image(&format!("r{n}-1"), size * MB)
        };
        crate::testing::history(&image, hour_ago, hour_ago)
    });
    let (mut c, dir) = collector_with_history(
        &sim,
        |c| {
            c.gc.high_threshold_percent = 55;
            c.gc.low_threshold_percent = 50;
            c.eviction_imagefs_available = Some(crate::config::EvictionThreshold::Percent(30.0));
            c.kubernetes.enabled = true;
            c.kubernetes.room_before_pulls = true;
        },
        Records::from_map(had),
    );
    cycle(&mut c).await;
    assert!(sim.removed().is_empty());
    (sim, c, dir)
}

/// Pods naming `registry.test/rN:2` for each N of `pulls`, and `old-0`.
fn pods_pulling(pulls: impl IntoIterator<Item = usize>) -> crate::policy::Protections {
    crate::policy::Protections {
        references: pulls
            .into_iter()
            .map(|n| (format!("registry.test/r{n}:2"), format!("default/p{n}")))
            .chain([("old-0".to_string(), "default/cron".to_string())])
            .collect(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_pull_that_cannot_fit_is_said_and_not_answered_by_emptying_the_node() {
    // 900 MB cannot fit above the line whatever goes.
    let (sim, mut c, _dir) = a_node_with_room_for_475_mb_of_pulls(&[900]).await;
    c.set_protections(pods_pulling([0]));
    // Between cycles every pull counts (a crossing is never missed); the
    // cycle, which plans, finds that no room can help.
    assert_eq!(c.check_usage(), Some(true));
    let report = cycle(&mut c).await;
    assert!(sim.removed().is_empty(), "{report:?}");
    assert_eq!(sample(&c, "imagegc_coming_pulls_cannot_fit").as_deref(), Some("1"));
    assert_eq!(sample(&c, "imagegc_room_before_pulls_total").as_deref(), Some("0"));
    // The pod goes: nothing is said of it any more.
    c.set_protections(pods_pulling([]));
    cycle(&mut c).await;
    assert_eq!(sample(&c, "imagegc_coming_pulls_cannot_fit").as_deref(), Some("0"));
}

#[tokio::test]
async fn many_pulls_each_reasonable_get_the_room_that_fits_and_no_more() {
    const MB: u64 = 1_000_000;
    // Twelve pulls of 80 MB: 960 MB together, 475 can be had. Five fit
    // (400 MB): 700 MB to keep available, so 30 % in force for high and
    // 25 % for low. Four images go, not every one.
    let (sim, mut c, _dir) = a_node_with_room_for_475_mb_of_pulls(&[80; 12]).await;
    c.set_protections(pods_pulling(0..12));
    assert_eq!(c.check_usage(), Some(true));
    let report = cycle(&mut c).await;
    assert_eq!(sim.removed(), ["old-1", "old-2", "old-3", "old-4"], "{report:?}");
    let available = sim.stats(Path::new("/sim")).unwrap().available_bytes;
    assert_eq!(available, 750 * MB);
    assert_eq!(sample(&c, "imagegc_coming_pulls_cannot_fit").as_deref(), Some("7"));
}

#[tokio::test(start_paused = true)]
async fn pulls_sized_one_at_a_time_are_weighed_together_and_each_size_read_is_a_new_crossing() {
    const MB: u64 = 1_000_000;
    let (sim, c, dir) = a_node_with_room_for_475_mb_of_pulls(&[]).await;
    let config = test_config(dir.path(), |c| {
        c.gc.high_threshold_percent = 55;
        c.gc.low_threshold_percent = 50;
        c.eviction_imagefs_available = Some(crate::config::EvictionThreshold::Percent(30.0));
        c.kubernetes.enabled = true;
        c.kubernetes.room_before_pulls = true;
    });
    // Something else filled the node to 45 % (at or above no threshold)
    // before the pods came.
    sim.with(|s| s.disk.set(1000 * MB, 550 * MB));
    let sizes = Arc::new(GivenSizes::default());
    let c = c.with_pull_sizes(Arc::clone(&sizes) as Arc<dyn super::PullSizes>);
    let (pods, shutdown, daemon) = daemon_on(c, config).await;
    pods.send_replace(Arc::new(crate::policy::Protections {
        references: vec![
            ("registry.test/a:1".to_string(), "default/a".to_string()),
            ("registry.test/b:1".to_string(), "default/b".to_string()),
            ("old-0".to_string(), "default/cron".to_string()),
        ],
        ..Default::default()
    }));
    tokio::time::sleep(Duration::from_millis(100)).await;
    // a: 50 MB of manifest, 130 MB as reported; alone it fits between
    // high and the line (keep 430 MB: 57 %).
    sizes.answer("registry.test/a:1", 50 * MB);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(sim.removed().is_empty());
    // b too: together they need 560 MB kept available (44 %), and a's
    // blobs have not arrived. The thresholds in force went down: a new
    // crossing, answered at once.
    let answered = tokio::time::Instant::now();
    sizes.answer("registry.test/b:1", 50 * MB);
    while sim.removed().is_empty() {
        assert!(answered.elapsed() < Duration::from_secs(60), "nothing removed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        answered.elapsed() < Duration::from_millis(500),
        "{:?}",
        answered.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    shutdown.cancel();
    daemon.await.unwrap();
    let available = sim.stats(Path::new("/sim")).unwrap().available_bytes;
    assert!(available >= 560 * MB, "room for both: {available}");
    assert!(!sim.removed().contains(&"old-0".to_string()));
}

/// Room before the pull, attacked: on nodes and pods drawn at random (image
/// sizes, other data, thresholds, the eviction line, pulls of any size,
/// some that cannot fit), the daemon's usage check and `plan` (a new
/// process on the same state) agree on whether a space pass is due and on
/// the thresholds in force where every pull fits (where one cannot, the
/// check never misses a pass `plan` says is due), and a cycle removes
/// nothing for pulls that cannot fit.
#[tokio::test]
async fn the_daemon_and_plan_agree_on_room_before_pulls_and_nothing_goes_for_a_pull_that_cannot_fit() {
    const MB: u64 = 1_000_000;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut draw = |low: u64, high: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        low + state % (high - low + 1)
    };
    let (mut cannot_fit, mut made_room, mut nothing_due) = (0, 0, 0);
    for seed in 0..60 {
        let sim = SimHandle::default();
        // Unused images, the first `repositories` of them the tag 1 of a
        // repository a pod may roll out the tag 2 of (sized like it).
        let images = draw(3, 10);
        let repositories = draw(1, 3).min(images);
        let mut on_disk = 0;
        sim.with(|s| {
            for i in 0..images {
                let size = draw(10, 150) * MB;
                on_disk += size;
                let mut listed = image(&format!("old-{i}"), size);
                if i < repositories {
                    listed.repo_tags = vec![format!("registry.test/r{i}:1")].into();
                }
                s.node.add_image(listed);
                s.disk.occupy(&format!("old-{i}"), size);
            }
        });
        let other = draw(0, 500) * MB;
        sim.with(|s| s.disk.set(1000 * MB, (1000 * MB).saturating_sub(on_disk + other)));
        let high = draw(60, 90) as u8;
        let low = high - draw(5, 15) as u8;
        let line = draw(10, 30) as f64;
        let (c, dir) = collector(&sim, |c| {
            c.gc.high_threshold_percent = high;
            c.gc.low_threshold_percent = low;
            c.gc.max_age = Duration::ZERO;
            c.eviction_imagefs_available = Some(crate::config::EvictionThreshold::Percent(line));
            c.kubernetes.enabled = true;
            c.kubernetes.room_before_pulls = true;
        });
        if sim.stats(Path::new("/sim")).unwrap().usage_percent() >= u64::from(high) {
            // Only nodes below high: what the pulls alone make due.
            continue;
        }
        // And a repository whose image imagegc removed an hour ago, of any
        // size: what the journal tells every process.
        let big = Removal {
            id: "big-1".into(),
            tags: vec!["registry.test/big:1".into()],
            digests: vec![],
            reason: Reason::Space,
            size: draw(50, 900) * MB,
            freed_bytes: None,
            first_seen: SystemTime::now() - Duration::from_secs(7200),
            last_used: SystemTime::now() - Duration::from_secs(7200),
            dry_run: false,
        };
        Journal::new(dir.path()).append(&crate::store::journal::JournalEntry::from_removal(
            &big,
            SystemTime::now() - Duration::from_secs(3600),
        ));
        let mut c = next_process(&c, *c.clock());
        cycle(&mut c).await;
        c.save().await;
        let before = sim.removed().len();
        let mut pods = pods_pulling((0..repositories as usize).filter(|_| draw(0, 1) == 1));
        if draw(0, 1) == 1 {
            pods.references
                .push(("registry.test/big:2".to_string(), "default/big".to_string()));
        }
        c.set_protections(pods.clone());
        // `plan`: a new process on the same state, the same pods.
        let mut plan = next_process(&c, *c.clock());
        plan.set_protections(pods);
        let listing = plan.observe().await.unwrap();
        let stats = sim.stats(Path::new("/sim")).unwrap();
        let (planned, pulls) = plan.cycle_plan(&listing, Some(&stats));
        let planned_due = planned.target().due(&stats);
        let in_force = planned.target().in_force(stats.capacity_bytes);
        let daemon_due = c.check_usage();
        if pulls.cannot_fit.is_empty() {
            assert_eq!(daemon_due, Some(planned_due), "seed {seed}: {pulls:?}");
            assert_eq!(c.inventory.in_force, Some(in_force), "seed {seed}: {pulls:?}");
        } else {
            // Between cycles every pull counts: the check never misses a
            // pass `plan` says is due, and the cycle bounds the room.
            assert!(daemon_due == Some(true) || !planned_due, "seed {seed}: {pulls:?}");
        }
        let configured_due = stats.usage_percent() >= u64::from(high);
        let report = cycle(&mut c).await;
        if pulls.fit.iter().all(|p| p.bytes_on_disk(c.footprint()) == 0) && !configured_due {
            assert_eq!(
                sim.removed().len(),
                before,
                "seed {seed}: removed for pulls that cannot fit: {report:?}"
            );
        }
        if sim.removed().len() > before {
            assert!(planned_due, "seed {seed}: removed though plan said no pass was due");
            made_room += 1;
        }
        cannot_fit += usize::from(!pulls.cannot_fit.is_empty());
        nothing_due += usize::from(!planned_due);
    }
    // The draws reach every case.
    assert!(
        cannot_fit > 0 && made_room > 0 && nothing_due > 0,
        "{cannot_fit} {made_room} {nothing_due}"
    );
}

/// Notes when each cycle starts, in the tokio clock.
#[derive(Default)]
struct CycleStarts(Mutex<Vec<tokio::time::Instant>>);

impl Sink for CycleStarts {
    fn emit(&self, event: &Event<'_>) {
        if matches!(event, Event::CycleStarted) {
            self.0.lock().unwrap().push(tokio::time::Instant::now());
        }
    }
}

/// `simulate` runs the daemon's schedule (`policy::Schedule`): for the same
/// node and the same events, `daemon::run` and the replay start cycles at
/// the same moments (the daemon's in whole seconds, rounded up, as the
/// replay counts time). The node: 1,000 MB; high 80, low 60, minimum age
/// 60 s, every 5 minutes. Its cycles: at the start; at the first usage
/// check after a pull takes usage to 85 %, which keeps the only unused
/// image for being too young; again as soon as that image may go (low
/// reached); one interval later; at the check after a pull that crosses
/// high again with every image in use (low not reached, none young: the
/// interval next); then every interval.
#[tokio::test(start_paused = true)]
async fn the_daemon_and_simulate_start_cycles_at_the_same_moments() {
    const MB: u64 = 1_000_000;
    let sizes = [300 * MB, 300 * MB, 250 * MB, 300 * MB];
    // (second, container, image, started): at odd seconds, between the
    // daemon's usage checks.
    let events: [(u64, u64, u32, bool); 7] = [
        (1, 0, 0, true),
        (41, 0, 0, false),
        (101, 1, 1, true),
        (161, 2, 2, true),
        (541, 3, 3, true),
        (561, 1, 1, false),
        (1501, 3, 3, false),
    ];
    let configure = |c: &mut Config| {
        c.gc.high_threshold_percent = 80;
        c.gc.low_threshold_percent = 60;
        c.gc.min_age = Duration::from_secs(60);
        c.gc.interval = Duration::from_secs(300);
        // Polls that list the node between cycles come once per interval,
        // after the cycles that see each image first (the replay's
        // listings are its cycles').
        c.gc.usage_poll_interval = Duration::from_secs(300);
        c.gc.headroom = false;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(dir.path(), configure);
    let simulated = crate::sim::replay::tests::cycle_starts(&sizes, &events, 1000 * MB, &config);

    let sim = SimHandle::default();
    sim.with(|s| s.disk.set(1000 * MB, 1000 * MB));
    let starts = Arc::new(CycleStarts::default());
    // Records' times on the daemon's clock (virtual here), as in a node's
    // life: images age with it.
    let clock = Clock::following_tokio(SystemTime::now() - Duration::from_secs(3600));
    let c = start(&sim, &config, clock, None).with_sink(Arc::clone(&starts) as Arc<dyn Sink>);
    let health = Arc::new(crate::outputs::health::Health::new(Duration::from_secs(600)));
    let shutdown = CancellationToken::new();
    let (reloads, reload_rx) = tokio::sync::mpsc::unbounded_channel::<Arc<Config>>();
    let origin = tokio::time::Instant::now();
    let daemon = tokio::spawn({
        let (config, stop) = (config.clone(), shutdown.clone());
        async move {
            let _reloads = reloads;
            crate::daemon::run(c, Arc::new(config), health, stop, reload_rx).await;
        }
    });
    for &(at, container, image, started) in &events {
        tokio::time::sleep_until(origin + Duration::from_secs(at)).await;
        let id = format!("sha256:{image:064x}");
        let container = format!("c{container}");
        sim.with(|s| {
            if !started {
                s.node.containers.retain(|c| c.id != container);
                return;
            }
            if s.node.image(&id).is_none() {
                let mut pulled = crate::testing::library_image(&id, sizes[image as usize]);
                pulled.repo_tags = vec![crate::sim::replay::tests::image_name(image)].into();
                s.node.add_image(pulled);
                s.disk.write(&id, sizes[image as usize]);
            }
            s.node.add_container(crate::testing::container_naming(&container, &id));
        });
    }
    shutdown.cancel();
    daemon.await.unwrap();
    let secs_up = |d: Duration| d.as_secs() + u64::from(d.subsec_nanos() > 0);
    let daemon_starts: Vec<u64> = starts
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|at| secs_up(at.duration_since(origin)))
        .collect();
    assert_eq!(simulated, [0, 162, 223, 523, 543, 843, 1143, 1443], "simulate's");
    assert_eq!(daemon_starts, simulated, "the daemon's");
    assert_eq!(
        sim.removed(),
        [format!("sha256:{:064x}", 0), format!("sha256:{:064x}", 1)]
    );
}
