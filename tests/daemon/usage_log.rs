//! The usage log (`state.usage_log`): what the daemon records of the
//! node's images and containers, replayed by `imagegc simulate --log`.

use std::process::Command;
use std::time::SystemTime;

use imagegc::sim::trace::Trace;
use imagegc::store::state::StateStore;
use imagegc_testkit::fake::FakeRuntime;
use imagegc_testkit::{history, records};

use crate::support::{DiskEffects, InProcess, container_using, cycles_done, eventually, image, roomy_disk, secs};

#[tokio::test]
async fn the_daemon_records_a_log_that_simulate_replays() {
    let fake = FakeRuntime::new();
    let (app, old, tmp) = (image("app", 3000), image("old", 1000), image("tmp", 2000));
    for i in [&app, &old, &tmp] {
        fake.add_image(i.clone());
    }
    fake.add_container(container_using("c1", &app));
    let disk = roomy_disk();
    fake.on_remove(Some(disk.free_listed_size_on_remove()));
    // Unused for an hour by its history: imagegc removes it by age.
    let hour_ago = SystemTime::now() - secs(3600);
    let history = records([history(&old, hour_ago, hour_ago)]);
    let mut daemon = InProcess::start(
        fake.clone(),
        disk,
        |state_dir| StateStore::new(state_dir).save(&history, SystemTime::now()).unwrap(),
        |c| c.gc.max_age = secs(3600),
    )
    .await;
    eventually(secs(5), "old removed by imagegc", || {
        fake.removed().contains(&old.id).then_some(())
    })
    .await;
    // A second container comes, the first goes, and someone else removes tmp.
    fake.add_container(container_using("c2", &tmp));
    cycles_done(&daemon, 2).await;
    fake.remove_container("c1");
    fake.remove_container("c2");
    fake.remove_image_by_id(&tmp.id);
    cycles_done(&daemon, 4).await;
    daemon.stop().await;

    let path = daemon.state_dir().join("usage.jsonl");
    let log = std::fs::read_to_string(&path).unwrap();
    assert!(
        log.contains(&format!(r#""ev":"removed","image":"{}","by":"imagegc"}}"#, old.id)),
        "{log}"
    );
    assert!(
        log.contains(&format!(
            r#""ev":"removed","image":"{}","by":"other","bytes":2000}}"#,
            tmp.id
        )),
        "{log}"
    );
    assert!(log.contains(r#""ev":"disk","capacity":1000000,"#), "{log}");
    let trace = Trace::read_log(&path).unwrap();
    assert_eq!(trace.images.len(), 3);
    assert_eq!(trace.starts(), 2, "c1 and c2: {log}");
    assert_eq!(trace.events.len(), 4, "each started and stopped: {log}");
    assert_eq!(trace.capacity, Some(1_000_000));

    let path = path.to_str().unwrap().to_string();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_imagegc"))
            .args(["simulate", "--log", &path, "--output", "json"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let replayed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let run = &replayed["runs"][0];
    assert_eq!(run["images"], 3);
    assert_eq!(run["container_starts"], 2);
    assert_eq!(
        run["comparisons"][0]["capacity_bytes"], 1_000_000,
        "the recorded capacity is the default disk"
    );
}
