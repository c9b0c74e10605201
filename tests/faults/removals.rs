//! Removals the runtime refuses: the other removals happen, the failures are
//! counted, the images not removed keep their records (in memory and in the
//! state file), and the journal lists only what was really removed.

use imagegc::cri::connect;
use imagegc::engine::Outcome;
use imagegc::store::journal::Journal;
use imagegc::store::state::{Loaded, StateStore};
use imagegc::time::{from_unix_millis, to_unix_millis};
use imagegc_testkit::fake::FakeRuntime;
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::support::{self, DiskEffects, SimDisk, container_using, image, metric};

#[tokio::test]
async fn refused_removals_keep_their_images_and_records_and_the_others_go() {
    // Five unused images of 200 bytes each on a full 1000-byte disk, one
    // image in use. High 90, low 40: 600 bytes must come back, so three
    // removals are needed; the runtime refuses two of the five.
    let fake = FakeRuntime::new();
    let disk = SimDisk::new(1000, 0);
    let names = ["a", "b", "c", "d", "e"];
    for name in names {
        let image = image(name, 200);
        disk.occupy(&image.id, 200);
        fake.add_image(image);
    }
    let app = image("app", 50);
    fake.add_container(container_using("app-1", &app));
    fake.add_image(app.clone());
    fake.on_remove(Some(disk.free_on_remove()));
    let id = |name: &str| image(name, 0).id;
    fake.fail_remove(&id("b"), Code::FailedPrecondition);
    fake.fail_remove(&id("d"), Code::Internal);

    let dir = tempfile::tempdir().unwrap();
    let state_dir = dir.path().join("state");
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let client = connect(&server.endpoint(), support::PATIENCE).unwrap();
    let mut config = support::config(&state_dir);
    config.gc.low_threshold_percent = 40;
    let mut collector = support::collector(client, &disk, &config);

    let report = collector.cycle(&CancellationToken::new()).await;
    assert_eq!(report.outcome, Outcome::Success, "a, c and e free enough");
    assert_eq!(fake.removed(), [id("a"), id("c"), id("e")]);
    let failed: Vec<&str> = report.failed.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(failed, [id("b"), id("d")]);
    let remaining: Vec<String> = fake.images().into_iter().map(|i| i.id).collect();
    assert_eq!(remaining, [id("b"), id("d"), app.id.clone()]);

    let metrics = collector.metrics().encode();
    assert_eq!(
        metric(&metrics, "imagegc_removal_failures_total"),
        Some(2.0),
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, r#"image_garbage_collected_total{reason="space"}"#),
        Some(3.0),
        "only successful removals count: {metrics}"
    );

    for name in ["b", "d", "app"] {
        assert!(
            collector.records().get(&id(name)).is_some(),
            "the record of {name} stays"
        );
    }
    for name in ["a", "c", "e"] {
        assert!(
            collector.records().get(&id(name)).is_none(),
            "the record of {name} goes"
        );
    }
    let journal = Journal::new(&state_dir).read(None).unwrap();
    let journaled: Vec<&str> = journal.iter().map(|e| e.image.as_str()).collect();
    assert_eq!(journaled, [id("a"), id("c"), id("e")]);
    assert!(
        journal
            .iter()
            .all(|e| e.reason == "space" && !e.dry_run && e.freed_bytes == Some(200))
    );

    // Nothing is lost across a restart: the state file has the records of
    // the images still there, with the times they were first seen.
    let first_seen_b = collector.records().get(&id("b")).unwrap().first_seen;
    let Loaded::Records { records, .. } =
        StateStore::new(&state_dir).load(SystemTime::now() + Duration::from_secs(1), Duration::from_secs(300))
    else {
        panic!("the state file did not load")
    };
    let mut saved: Vec<&str> = records.iter().map(|(id, _)| id.as_str()).collect();
    saved.sort_unstable();
    let mut expected = [id("b"), id("d"), app.id.clone()];
    expected.sort_unstable();
    assert_eq!(saved, expected);
    assert_eq!(
        to_unix_millis(records.get(&id("b")).unwrap().first_seen),
        to_unix_millis(first_seen_b),
        "kept to the millisecond, the state file's resolution"
    );

    // Once the runtime lets them go, the next cycle removes them.
    fake.clear_fail_remove(&id("b"));
    fake.clear_fail_remove(&id("d"));
    disk.set_available(0);
    let report = collector.cycle(&CancellationToken::new()).await;
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(fake.removed(), [id("a"), id("c"), id("e"), id("b"), id("d")]);
    assert!(!fake.removed().contains(&app.id));
    let journal = Journal::new(&state_dir).read(None).unwrap();
    assert_eq!(journal.len(), 5);
    let metrics = collector.metrics().encode();
    assert_eq!(metric(&metrics, "imagegc_removal_failures_total"), Some(2.0));
    assert_eq!(
        metric(&metrics, r#"image_garbage_collected_total{reason="space"}"#),
        Some(5.0)
    );
}

#[tokio::test]
async fn refused_age_removals_keep_their_history() {
    // Both images unused for two hours by a history the collector trusts;
    // max age one hour; the runtime refuses one.
    let fake = FakeRuntime::new();
    let disk = SimDisk::new(1000, 900);
    let (old, older) = (image("old", 10), image("older", 10));
    fake.add_image(old.clone());
    fake.add_image(older.clone());
    fake.fail_remove(&older.id, Code::Unknown);
    let dir = tempfile::tempdir().unwrap();
    let state_dir = dir.path().join("state");
    // Whole milliseconds: the resolution of the state file.
    let two_hours_ago = from_unix_millis(to_unix_millis(SystemTime::now() - Duration::from_secs(7200)));
    let store = StateStore::new(&state_dir);
    let history = support::records([
        support::history(&old, two_hours_ago, two_hours_ago),
        support::history(&older, two_hours_ago - Duration::from_secs(60), two_hours_ago),
    ]);
    store.save(&history, SystemTime::now()).unwrap();

    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let client = connect(&server.endpoint(), support::PATIENCE).unwrap();
    let mut config = support::config(&state_dir);
    config.gc.max_age = Duration::from_secs(3600);
    let mut collector = support::collector(client, &disk, &config);
    let report = collector.cycle(&CancellationToken::new()).await;

    assert_eq!(fake.removed(), std::slice::from_ref(&old.id));
    assert_eq!(report.failed.len(), 1);
    let kept = collector
        .records()
        .get(&older.id)
        .expect("the refused image keeps its record");
    assert_eq!(kept.last_used, two_hours_ago, "its history is unchanged");
    let metrics = collector.metrics().encode();
    assert_eq!(
        metric(&metrics, r#"image_garbage_collected_total{reason="age"}"#),
        Some(1.0)
    );
    assert_eq!(metric(&metrics, "imagegc_removal_failures_total"), Some(1.0));
    let journal = Journal::new(&state_dir).read(None).unwrap();
    assert_eq!(journal.len(), 1);
    assert_eq!(
        (journal[0].image.as_str(), journal[0].reason.as_str()),
        (old.id.as_str(), "age")
    );
}
