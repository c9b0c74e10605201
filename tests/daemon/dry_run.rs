//! Dry run, from the configuration and from `once --dry-run`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use imagegc_testkit::fake::FakeRuntime;

use crate::support::{Daemon, Settings, free_local_addr, image, imagegc_json, secs};

#[tokio::test]
async fn dry_run_in_the_configuration_removes_nothing_and_journals_what_it_would() {
    let fake = FakeRuntime::new();
    let (a, b) = (image("a", 1000), image("b", 1000));
    fake.add_image(a.clone());
    fake.add_image(b.clone());
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    let state = dir.path().join("state");
    let addr = free_local_addr();
    Settings {
        dry_run: true,
        listen: Some(addr),
        ..Settings::new(dir.path()).remove_everything()
    }
    .write(&config);
    let mut daemon = Daemon::spawn(&config, &server.endpoint(), &state, Some(addr));

    let deadline = Instant::now() + secs(10);
    while daemon.metric("imagegc_cycles_total{result=\"failure\"}").await < Some(1.0) {
        assert!(Instant::now() < deadline, "no cycle finished:\n{}", daemon.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(daemon.metric("imagegc_dry_run").await, Some(1.0));
    assert_eq!(
        daemon.metric("image_garbage_collected_total{reason=\"space\"}").await,
        Some(0.0)
    );
    assert_eq!(fake.count("RemoveImage"), 0);
    assert!(fake.removed().is_empty());

    let history = imagegc_json(&config, &server.endpoint(), &state, &["history"], 0).await;
    let entries = history.as_array().expect("a list of removals");
    let journaled: BTreeSet<&str> = entries.iter().filter_map(|e| e["image"].as_str()).collect();
    assert_eq!(journaled, BTreeSet::from([a.id.as_str(), b.id.as_str()]));
    assert!(entries.iter().all(|e| e["dry_run"] == true), "{history:#}");
}

#[tokio::test]
async fn once_with_dry_run_removes_nothing_and_journals_what_it_would() {
    let fake = FakeRuntime::new();
    let (a, b) = (image("a", 1000), image("b", 1000));
    fake.add_image(a.clone());
    fake.add_image(b.clone());
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    let state = dir.path().join("state");
    Settings::new(dir.path()).remove_everything().write(&config);

    // Low 0 cannot be reached: exit 3, after planning every candidate.
    let report = imagegc_json(&config, &server.endpoint(), &state, &["once", "--dry-run"], 3).await;
    assert_eq!(report["dry_run"], true);
    let would: BTreeSet<&str> = report["removed"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["id"].as_str())
        .collect();
    assert_eq!(would, BTreeSet::from([a.id.as_str(), b.id.as_str()]));
    assert_eq!(fake.count("RemoveImage"), 0);

    let history = imagegc_json(&config, &server.endpoint(), &state, &["history"], 0).await;
    let entries = history.as_array().unwrap();
    assert_eq!(entries.len(), 2, "{history:#}");
    assert!(entries.iter().all(|e| e["dry_run"] == true), "{history:#}");
}
