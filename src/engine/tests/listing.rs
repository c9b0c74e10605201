//! A cycle's observation and its outputs: usage polls, a listing that fails, saves, the last success, usage just under high.

use super::*;

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
    let path = c.inventory.store().path().to_path_buf();
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
    match StateStore::new(c.inventory.store().dir()).load(c.clock.now(), Duration::from_secs(300)) {
        Loaded::Records { records, .. } => assert!(records.get("n").is_some()),
        _ => panic!("the state file does not load"),
    }
    // A removal is saved at once. (The refresh of a file that only
    // last-used times would change: `inventory::tests`.)
    sim.with(|s| s.node.retain_images(|i| i.id != "b"));
    cycle(&mut c).await;
    assert_ne!(read(), second);
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
    let before = c.last_success().expect("a success");
    c.save().await;
    let restarted = next_process(&c, Clock::starting_at(SystemTime::now()));
    drop(c);
    let restored = restarted.last_success().expect("restored from the state file");
    let millis = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_millis();
    assert_eq!(millis(restored), millis(before));
    assert_ne!(
        sample(&restarted, "imagegc_last_success_timestamp_seconds").as_deref(),
        Some("0.0")
    );
}
