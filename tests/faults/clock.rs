//! Wall-clock jumps. While it runs, the collector measures time with its
//! [`Clock`] (the wall-clock time at start plus monotonic time since), so a
//! jump of the system clock can neither age an image nor make it young; a
//! state saved with times in the future (the clock went back since) is
//! clamped to now when loaded.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use imagegc::cri::connect;
use imagegc::engine::Outcome;
use imagegc::policy::Reason;
use imagegc::store::state::{self, Loaded, StateStore};
use imagegc::time::Clock;
use imagegc_testkit::fake::FakeRuntime;
use tokio_util::sync::CancellationToken;

use crate::support::{self, DiskEffects, ServedOnThread, SimDisk, container_using, describe, image, imagegc};

const TEN_DAYS: Duration = Duration::from_secs(10 * 86_400);
const DAY: Duration = Duration::from_secs(86_400);
const HOUR: Duration = Duration::from_secs(3600);

/// The collector started ten days before the wall clock's now: exactly what
/// it would see had the wall clock jumped ten days forward right after it
/// started. Any read of the wall clock in a cycle would make its images ten
/// days old: removed by age (max age 1h), or by space (min age 1h).
#[tokio::test]
async fn a_wall_clock_ten_days_ahead_of_the_collectors_clock_ages_nothing() {
    let fake = FakeRuntime::new();
    let disk = SimDisk::new(1000, 0);
    for name in ["a", "b"] {
        let image = image(name, 500);
        disk.occupy(&image.id, 500);
        fake.add_image(image);
    }
    let app = image("app", 100);
    fake.add_container(container_using("app-1", &app));
    fake.add_image(app);
    fake.on_remove(Some(disk.free_on_remove()));
    let dir = tempfile::tempdir().unwrap();
    let state_dir = dir.path().join("state");
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let mut config = support::config(&state_dir);
    config.gc.max_age = HOUR;
    config.gc.min_age = HOUR;

    let started_at = SystemTime::now() - TEN_DAYS;
    let clock = Clock::starting_at(started_at);
    let client = connect(&server.endpoint(), support::PATIENCE).unwrap();
    let mut collector = support::collector_with_clock(client, &disk, &config, clock);
    for cycle in 0..3 {
        let report = collector.cycle(&CancellationToken::new()).await;
        assert!(report.removed.is_empty(), "cycle {cycle}: {:?}", report.removed);
        assert!(
            matches!(report.outcome, Outcome::LowNotReached { .. }),
            "cycle {cycle}: every unused image is younger than min age: {:?}",
            report.outcome
        );
    }
    assert!(fake.removed().is_empty());
    // Every time the collector recorded is on its own clock, not the wall's.
    let latest_possible = started_at + Duration::from_secs(60);
    for (id, record) in collector.records().iter() {
        assert!(
            record.first_seen >= started_at && record.last_used <= latest_possible,
            "{id}: {record:?} is not on the collector's clock"
        );
    }
    let Loaded::Records { saved_at, .. } = StateStore::new(&state_dir).load(SystemTime::now(), Duration::MAX) else {
        panic!("no state saved")
    };
    assert!(saved_at <= latest_possible, "the save time came from the wall clock");

    // The control: the same history and runtime under a clock that reads the
    // wall clock's now (a restart after the jump). The images were first seen
    // ten days ago, so min age no longer holds them: space removal goes on.
    // The ten days nobody watched do not count as unused time (beyond one
    // interval), so nothing is removed by age.
    drop(collector);
    let client = connect(&server.endpoint(), support::PATIENCE).unwrap();
    let mut restarted = support::collector_with_clock(client, &disk, &config, Clock::start());
    let report = restarted.cycle(&CancellationToken::new()).await;
    assert_eq!(report.outcome, Outcome::Success);
    let reasons: Vec<Reason> = report.removed.iter().map(|r| r.reason).collect();
    assert_eq!(reasons, [Reason::Space], "{:?}", report.removed);
    assert_eq!(fake.removed(), [image("a", 0).id]);
}

/// The modules that decide what is old do not read the wall clock at all;
/// the few places that do, each for a reason unrelated to image ages, are
/// listed here. clippy refuses `SystemTime::now()` in the shipped code
/// (clippy.toml) unless the read carries `#[expect(clippy::disallowed_methods,
/// reason = ...)]`: those attributes are where the wall clock is read, and a
/// new one must be added here with its reason.
#[test]
fn only_the_clock_and_reporting_read_the_wall_clock() {
    let allowed: [(&str, &str); 5] = [
        (
            "time.rs",
            "Clock::start: the wall-clock time at start; Clock::from_wall: a runtime's event stamp",
        ),
        ("store/state/mod.rs", "names a set-aside corrupt file"),
        (
            "outputs/metrics.rs",
            "the last-success timestamp dashboards compare with time()",
        ),
        ("cli/history.rs", "history --since, relative to the wall clock"),
        (
            "kubernetes/node_events.rs",
            "a unique name for a node event, as the kubelet names its own",
        ),
    ];
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    for path in rust_files(&src) {
        // A module's unit tests in files of their own (`engine/tests/`).
        if path.file_name().is_some_and(|n| n == "tests.rs") || path.components().any(|c| c.as_os_str() == "tests") {
            continue;
        }
        let text = fs::read_to_string(&path).unwrap();
        // Unit tests come last in each module: `#[cfg(test)] mod tests`.
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap();
        let name = path.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
        for (n, line) in code.lines().enumerate() {
            // `#[expect(clippy::disallowed_methods, ...)]`, however rustfmt
            // breaks it (not the crate roots' `warn` that turns it on).
            if line.contains("clippy::disallowed_methods") && !line.contains("warn(") {
                found.push((name.clone(), n + 1, line.trim().to_string()));
            }
        }
    }
    let unexpected: Vec<_> = found
        .iter()
        .filter(|(file, _, _)| !allowed.iter().any(|(a, _)| a == file))
        .collect();
    assert!(
        unexpected.is_empty(),
        "wall-clock reads outside the allowed places: {unexpected:#?}"
    );
    // Each allowed place is found: the search reads what clippy enforces.
    for (file, why) in allowed {
        assert!(
            found.iter().any(|(f, _, _)| f == file),
            "{file} ({why}) no longer reads the wall clock: take it off the list"
        );
    }
    for deciding in [
        "engine/",
        "policy/",
        "records.rs",
        "model/matching.rs",
        "store/pending.rs",
        "daemon/",
    ] {
        assert!(
            !found.iter().any(|(file, _, _)| file.starts_with(deciding)),
            "{deciding} reads the wall clock"
        );
    }
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The wall clock went back a day since the last save: the saved times are a
/// day in the future. Loaded, they are clamped to now, so nothing looks
/// used until tomorrow (which would keep unused images from collection for
/// a day) and nothing is removed by age.
#[test]
fn a_state_saved_a_day_in_the_future_is_clamped_to_now() {
    let fake = FakeRuntime::new();
    let names = ["x", "y"];
    for name in names {
        fake.add_image(image(name, 1000));
    }
    let served = ServedOnThread::start(fake.clone());
    let dir = tempfile::tempdir().unwrap();
    let state_dir = dir.path().join("state");
    let tomorrow = SystemTime::now() + DAY;
    let history = support::records(names.map(|n| support::history(&image(n, 1000), tomorrow, tomorrow)));
    StateStore::new(&state_dir).save(&history, tomorrow).unwrap();
    let config = |high: u8| {
        let path = dir.path().join(format!("high-{high}.toml"));
        fs::write(
            &path,
            format!(
                "[gc]\nhigh_threshold_percent = {high}\nlow_threshold_percent = 0\nmin_age = \"0s\"\n\
                 max_age = \"1m\"\nimage_fs_path = {:?}\n\n[metrics]\nlisten = \"\"\n",
                dir.path().display().to_string()
            ),
        )
        .unwrap();
        path
    };

    // High 100: only age could remove, and nothing is old.
    let before = SystemTime::now();
    let output = support::run(imagegc(&config(100), &served.endpoint, &state_dir).args(["once", "--output", "json"]));
    let after = SystemTime::now();
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["removed"], serde_json::json!([]), "{}", describe(&output));
    assert!(fake.removed().is_empty());
    // The saved times are no longer in the future.
    // The file as `state` documents it: a header line, the save time, a line a record.
    let saved = fs::read_to_string(state_dir.join(state::FILE_NAME)).unwrap();
    let mut lines = saved
        .lines()
        .skip(1)
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap());
    let ms = |t: SystemTime| imagegc::time::to_unix_millis(t);
    assert!(lines.next().unwrap()["saved_at"].as_u64().unwrap() <= ms(after));
    for record in lines {
        let id = record[0].as_str().unwrap();
        for (field, at) in [("first_seen", 1), ("last_used", 2)] {
            let t = record[at].as_u64().unwrap();
            assert!(
                t >= ms(before) - 1000 && t <= ms(after),
                "{id}: {field} {t} is not clamped into [{}, {}]",
                ms(before),
                ms(after)
            );
        }
    }

    // A later plan (high 1: every unused image is a space candidate) shows
    // both images as candidates used in the past, not as "in use now".
    let output = support::run(imagegc(&config(1), &served.endpoint, &state_dir).args(["plan", "--output", "json"]));
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let plan: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let now = humantime::parse_rfc3339(plan["time"].as_str().unwrap()).unwrap();
    let candidates: Vec<&serde_json::Value> = plan["removals"]
        .as_array()
        .unwrap()
        .iter()
        .chain(plan["further_space_candidates"].as_array().unwrap())
        .collect();
    assert_eq!(candidates.len(), 2, "{}", describe(&output));
    for candidate in candidates {
        let last_used = humantime::parse_rfc3339(candidate["last_used"].as_str().unwrap()).unwrap();
        assert!(last_used <= now, "{candidate} is used in the future of {now:?}");
        assert_eq!(candidate["reason"], "space");
    }
    assert_eq!(plan["kept"], serde_json::json!([]), "{}", describe(&output));
}
