//! Shutdown: cancellation in process, SIGTERM to the binary, between
//! removals and never in the middle of one.

use std::time::{Duration, Instant, SystemTime};

use imagegc::store::state::{Loaded, StateStore};
use imagegc_testkit::fake::FakeRuntime;

use crate::support::{Daemon, InProcess, Settings, SimDisk, eventually, image, load_records, roomy_disk, secs};

/// SIGTERM while a cycle waits on a hung runtime call (no removal in
/// flight): the daemon stops within seconds, with its state saved, instead
/// of waiting for the call's deadline.
#[tokio::test]
async fn shutdown_does_not_wait_for_a_hung_listing() {
    let fake = FakeRuntime::new();
    fake.add_image(image("app", 1000));
    let mut daemon = InProcess::start(
        fake.clone(),
        roomy_disk(),
        |_| {},
        |c| c.gc.interval = Duration::from_millis(300),
    )
    .await;
    eventually(secs(5), "a first cycle", || {
        (fake.count("ListImages") >= 1).then_some(())
    })
    .await;
    fake.delay("ListImages", secs(60));
    fake.delay("ListContainers", secs(60));
    let listings = fake.count("ListImages");
    eventually(secs(5), "a cycle hung in ListImages", || {
        (fake.count("ListImages") > listings).then_some(())
    })
    .await;
    let asked = Instant::now();
    daemon.stop().await;
    assert!(asked.elapsed() < secs(5), "shutdown took {:?}", asked.elapsed());
    assert!(StateStore::new(daemon.state_dir()).path().exists(), "state saved");
}

/// SIGTERM right after the runtime answered a removal, while imagegc
/// measures what it freed: the removal is finished, journaled and recorded
/// before the daemon stops, not abandoned as if nothing had been removed.
#[tokio::test]
async fn shutdown_right_after_a_removal_still_journals_it() {
    let fake = FakeRuntime::new();
    let old = image("old", 1000);
    fake.add_image(old.clone());
    // A full disk that removals do not free: the collector watches the
    // filesystem for up to a second after each removal.
    let disk = SimDisk::new(1_000_000, 10_000);
    let mut daemon = InProcess::start(
        fake.clone(),
        disk,
        |_| {},
        |c| {
            c.gc.interval = secs(3600);
            c.gc.high_threshold_percent = 90;
            c.gc.low_threshold_percent = 50;
        },
    )
    .await;
    eventually(secs(5), "the removal", || (!fake.removed().is_empty()).then_some(())).await;
    daemon.stop().await;
    let journal = imagegc::store::journal::Journal::new(&daemon.state_dir())
        .read(None)
        .unwrap();
    let journaled: Vec<&str> = journal.iter().map(|e| e.image.as_str()).collect();
    assert_eq!(
        journaled,
        [old.id.as_str()],
        "the removal the runtime made is journaled"
    );
    assert!(
        load_records(&daemon.state_dir()).get(&old.id).is_none(),
        "and its record is gone"
    );
}

/// A runtime with `n` unused images whose removal takes `removal` each.
fn slow_runtime(n: usize, removal: Duration) -> FakeRuntime {
    let fake = FakeRuntime::new();
    for i in 0..n {
        fake.add_image(image(&format!("img-{i:02}"), 1000));
    }
    fake.delay("RemoveImage", removal);
    fake
}

#[tokio::test]
async fn sigterm_in_the_middle_of_a_cycle_stops_after_the_current_removal_and_saves_state() {
    let fake = slow_runtime(20, Duration::from_millis(1500));
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    let state = dir.path().join("state");
    Settings {
        interval: "1h",
        ..Settings::new(dir.path()).remove_everything()
    }
    .write(&config);
    let mut daemon = Daemon::spawn(&config, &server.endpoint(), &state, None);

    eventually(secs(10), "the first removal", || {
        (fake.count("RemoveImage") >= 1).then_some(())
    })
    .await;
    daemon.signal(libc::SIGTERM);
    let status = daemon
        .exited_within(secs(10))
        .await
        .expect("exits within 10s of SIGTERM");
    assert!(status.success(), "{status}:\n{}", daemon.stderr());
    let removed = fake.removed();
    assert!(
        (1..=2).contains(&removed.len()),
        "stops after the removal in progress, removed {removed:?}"
    );
    assert_eq!(
        fake.count("RemoveImage"),
        removed.len(),
        "no removal was abandoned midway"
    );

    let records = load_records(&state);
    for image in fake.images() {
        assert!(
            records.get(&image.id).is_some(),
            "a record for {}",
            image.repo_tags.first().unwrap()
        );
    }
    for id in &removed {
        assert!(records.get(id).is_none(), "no record for the removed {id}");
    }
    assert_eq!(records.len(), 20 - removed.len());
}

#[tokio::test]
async fn a_second_sigterm_exits_at_once() {
    let fake = slow_runtime(20, secs(5));
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    let state = dir.path().join("state");
    Settings {
        interval: "1h",
        ..Settings::new(dir.path()).remove_everything()
    }
    .write(&config);
    let mut daemon = Daemon::spawn(&config, &server.endpoint(), &state, None);

    eventually(secs(10), "the first removal", || {
        (fake.count("RemoveImage") >= 1).then_some(())
    })
    .await;
    daemon.signal(libc::SIGTERM);
    daemon.wait_logged("signal received", secs(5)).await;
    assert!(daemon.running(), "the first SIGTERM waits for the removal in progress");
    let second = Instant::now();
    daemon.signal(libc::SIGTERM);
    let status = daemon
        .exited_within(secs(2))
        .await
        .expect("exits within 2s of the second SIGTERM");
    assert!(second.elapsed() < secs(2));
    assert!(!status.success(), "{status}");
    assert!(fake.removed().is_empty(), "the removal in progress was still waiting");
    assert!(
        !matches!(
            StateStore::new(&state).load(SystemTime::now(), secs(3600)),
            Loaded::Corrupt { .. }
        ),
        "the state file is never left half written"
    );
}
