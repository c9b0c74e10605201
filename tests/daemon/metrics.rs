//! Metrics and probes, as a scrape shows them.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use imagegc_testkit::fake::{Dialect, Events, FakeRuntime};

use crate::support::{
    Daemon, InProcess, Settings, container_using, eventually, free_local_addr, ids, image, imagegc_command, metric,
    roomy_disk, secs,
};

#[tokio::test]
async fn metrics_after_a_cycle_that_removes_two_images_by_space() {
    let fake = FakeRuntime::new();
    let (a, b, web) = (image("a", 1000), image("b", 1000), image("web", 1000));
    for i in [&a, &b, &web] {
        fake.add_image(i.clone());
    }
    fake.add_container(container_using("c-web", &web));
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    let addr = free_local_addr();
    Settings {
        interval: "1h",
        listen: Some(addr),
        ..Settings::new(dir.path()).remove_everything()
    }
    .write(&config);
    let mut daemon = Daemon::spawn(&config, &server.endpoint(), &dir.path().join("state"), Some(addr));

    let deadline = Instant::now() + secs(10);
    let body = loop {
        let (status, body) = daemon.get("/metrics").await;
        assert_eq!(status, 200);
        if metric(&body, "imagegc_cycles_total{result=\"failure\"}") >= Some(1.0) {
            break body;
        }
        assert!(Instant::now() < deadline, "no cycle finished:\n{}", daemon.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let value = |series: &str| metric(&body, series).unwrap_or_else(|| panic!("no {series} in\n{body}"));
    // Low 0 is never reached: every unused image goes and the cycle fails.
    assert_eq!(value("image_garbage_collected_total{reason=\"space\"}"), 2.0);
    assert_eq!(value("image_garbage_collected_total{reason=\"age\"}"), 0.0);
    assert_eq!(value("imagegc_cycles_total{result=\"success\"}"), 0.0);
    assert_eq!(value("imagegc_runtime_up"), 1.0);
    assert_eq!(value("imagegc_images{state=\"in_use\"}"), 1.0);
    assert_eq!(value("imagegc_dry_run"), 0.0);
    assert_eq!(value("imagegc_high_threshold_ratio"), 0.01);
    assert!(value("imagegc_image_filesystem_capacity_bytes") > 0.0);
    assert_eq!(ids(&fake.removed()), BTreeSet::from([a.id.as_str(), b.id.as_str()]));
    assert_eq!(daemon.get("/readyz").await.0, 200);
    assert_eq!(daemon.get("/healthz").await.0, 200);
}

/// `imagegc_cri_requests_total{method,code}` says what the runtime saw:
/// every call, by method, with the failures under their gRPC code.
#[tokio::test]
async fn every_call_the_runtime_sees_is_counted_by_method_and_code() {
    let fake = FakeRuntime::new();
    fake.set_dialect(Dialect::Crio136);
    fake.set_events(Events::EndAtOnce);
    let app = image("app", 1000);
    fake.add_image(app.clone());
    fake.add_container(container_using("c-app", &app));
    fake.fail_next("ImageFsInfo", tonic::Status::internal("disk on fire"));
    let mut daemon = InProcess::start(
        fake.clone(),
        roomy_disk(),
        |_| {},
        |c| c.runtime.container_events = true,
    )
    .await;
    // The third stream (opened 6 s in: reopens back off) counted by the
    // daemon too, not only seen by the runtime, before it stops.
    let streams_counted = || {
        daemon
            .metrics
            .encode()
            .lines()
            .filter(|l| l.starts_with("imagegc_cri_requests_total{method=\"GetContainerEvents\","))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    eventually(secs(15), "three cycles, the event stream given up on, polls", || {
        (fake.count("ListImages") >= 3
            && fake.count("GetContainerEvents") >= 3
            && streams_counted() >= 3.0
            && fake.count("ListContainers") >= 6)
            .then_some(())
    })
    .await;
    daemon.stop().await;

    let scrape = daemon.metrics.encode();
    let counted = |method: &str, code: &str| {
        metric(
            &scrape,
            &format!("imagegc_cri_requests_total{{method=\"{method}\",code=\"{code}\"}}"),
        )
        .unwrap_or(0.0)
    };
    let mut seen: Vec<String> = fake.calls();
    seen.sort();
    seen.dedup();
    assert!(seen.len() >= 5, "the daemon made several kinds of call: {seen:?}");
    for method in &seen {
        let total: f64 = scrape
            .lines()
            .filter(|l| l.starts_with(&format!("imagegc_cri_requests_total{{method=\"{method}\",")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert_eq!(
            total,
            fake.count(method) as f64,
            "{method}: the runtime saw {}\n{scrape}",
            fake.count(method)
        );
    }
    assert_eq!(counted("ImageFsInfo", "Internal"), 1.0, "{scrape}");
    // A call that shutdown cut short is counted as cancelled: the runtime
    // saw it all the same.
    assert_eq!(
        counted("ImageFsInfo", "OK") + counted("ImageFsInfo", "Canceled"),
        fake.count("ImageFsInfo") as f64 - 1.0
    );
    assert_eq!(
        metric(
            &scrape,
            "imagegc_cri_request_duration_seconds_count{method=\"ListImages\"}"
        ),
        Some(fake.count("ListImages") as f64),
        "every call is timed too"
    );
}

#[tokio::test]
async fn a_restarted_daemon_reports_the_last_success_of_the_one_before_and_its_node() {
    let fake = FakeRuntime::new();
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let endpoint = server.endpoint();
    let config = dir.path().join("imagegc.toml");
    let addr = free_local_addr();
    Settings {
        interval: "1h",
        listen: Some(addr),
        ..Settings::new(dir.path())
    }
    .write(&config);
    let state = dir.path().join("state");
    let node = [("NODE_NAME", "worker-7")];

    let mut daemon = Daemon::spawn_with_env(&config, &endpoint, &state, Some(addr), &node);
    let deadline = Instant::now() + secs(10);
    let before = loop {
        let stamp = daemon.metric("imagegc_last_success_timestamp_seconds").await;
        if let Some(stamp) = stamp.filter(|s| *s > 0.0) {
            break stamp;
        }
        assert!(Instant::now() < deadline, "no successful cycle:\n{}", daemon.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(daemon.metric(r#"imagegc_node_info{node="worker-7"}"#).await, Some(1.0));
    daemon.signal(libc::SIGTERM);
    assert!(daemon.exited_within(secs(10)).await.is_some_and(|s| s.success()));

    // The runtime is down: the restarted daemon's cycles cannot succeed.
    server.shutdown().await;
    let mut daemon = Daemon::spawn_with_env(&config, &endpoint, &state, Some(addr), &node);
    let deadline = Instant::now() + secs(10);
    while daemon.metric(r#"imagegc_cycles_total{result="failure"}"#).await < Some(1.0) {
        assert!(Instant::now() < deadline, "no failed cycle:\n{}", daemon.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = daemon
        .metric("imagegc_last_success_timestamp_seconds")
        .await
        .expect("the last success");
    assert!(
        (after - before).abs() < 0.002,
        "last success {after} after the restart, {before} before it"
    );
}

/// Another collector on the node (the kubelet's image GC, `crictl rmi`)
/// removes an image imagegc did not ask to remove: the scrape counts it
/// with its size and time, and `plan` and `check-config` say it from the
/// usage log.
/// `gc.order = "auto"`: a restarted daemon goes on with the order judged
/// before (order.json), and says which (`imagegc_gc_order`); a fixed order
/// is said as not chosen.
#[tokio::test]
async fn the_order_auto_chose_before_a_restart_is_in_force_and_said() {
    let fake = FakeRuntime::new();
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let endpoint = server.endpoint();
    let config = dir.path().join("imagegc.toml");
    let addr = free_local_addr();
    Settings {
        interval: "1h",
        listen: Some(addr),
        ..Settings::new(dir.path())
    }
    .write(&config);
    let toml = std::fs::read_to_string(&config).unwrap();
    let state = dir.path().join("state");
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(&state)
        .unwrap();
    std::fs::write(
        state.join("order.json"),
        r#"{"at":1800000000,"order":"superseded-first","figures":[],"window_secs":604800,"sampled":1.0}"#,
    )
    .unwrap();
    for (order, said) in [
        ("auto", r#"imagegc_gc_order{order="superseded-first",auto="true"}"#),
        ("lru", r#"imagegc_gc_order{order="lru",auto="false"}"#),
    ] {
        std::fs::write(&config, toml.replace("[gc]\n", &format!("[gc]\norder = \"{order}\"\n"))).unwrap();
        let mut daemon = Daemon::spawn_with_env(&config, &endpoint, &state, Some(addr), &[]);
        let deadline = Instant::now() + secs(10);
        while daemon.metric(said).await != Some(1.0) {
            assert!(Instant::now() < deadline, "{said} not said:\n{}", daemon.stderr());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        daemon.signal(libc::SIGTERM);
        assert!(daemon.exited_within(secs(10)).await.is_some_and(|s| s.success()));
    }
}

#[tokio::test]
async fn an_image_removed_by_someone_else_is_counted_and_said_by_plan_and_check_config() {
    let fake = FakeRuntime::new();
    let (kept, gone) = (image("kept", 1000), image("gone", 4096));
    for i in [&kept, &gone] {
        fake.add_image(i.clone());
    }
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    let state = dir.path().join("state");
    let addr = free_local_addr();
    Settings {
        listen: Some(addr),
        ..Settings::new(dir.path())
    }
    .write(&config);
    let mut daemon = Daemon::spawn(&config, &server.endpoint(), &state, Some(addr));
    let deadline = Instant::now() + secs(10);
    while daemon.metric("imagegc_cycles_total{result=\"success\"}").await < Some(1.0) {
        assert!(Instant::now() < deadline, "no cycle finished:\n{}", daemon.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(daemon.metric("imagegc_images_removed_by_others_total").await, Some(0.0));
    // No kubelet configuration read: its defaults are assumed, and high 100
    // is above their eviction line.
    assert_eq!(daemon.metric("imagegc_kubelet_config_read").await, Some(0.0));
    assert_eq!(daemon.metric("imagegc_kubelet_image_gc_enabled").await, Some(1.0));
    assert_eq!(daemon.metric("imagegc_high_threshold_above_eviction").await, Some(1.0));
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    fake.remove_image_by_id(&gone.id);
    let deadline = Instant::now() + secs(10);
    while daemon.metric("imagegc_images_removed_by_others_total").await < Some(1.0) {
        assert!(Instant::now() < deadline, "not counted:\n{}", daemon.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(daemon.metric("imagegc_images_removed_by_others_total").await, Some(1.0));
    assert_eq!(
        daemon.metric("imagegc_removed_by_others_bytes_total").await,
        Some(4096.0)
    );
    let last = daemon
        .metric("imagegc_last_removal_by_others_timestamp_seconds")
        .await
        .unwrap();
    assert!(last >= before.floor(), "{last} before {before}");
    assert!(fake.removed().is_empty(), "imagegc removed nothing itself");
    // The usage log has it once the writer wrote it.
    eventually(secs(5), "the usage log's line", || {
        std::fs::read_to_string(state.join("usage.jsonl"))
            .ok()
            .filter(|log| log.contains(&format!(r#""image":"{}","by":"other","bytes":4096"#, gone.id)))
    })
    .await;
    let plan = imagegc_command(&config, &server.endpoint(), &state, &["plan"]).await;
    let stdout = String::from_utf8_lossy(&plan.stdout);
    assert!(
        stdout.contains("another collector removed 1 image(s) (4.0 KiB) in the last 24 h, the last at "),
        "{stdout}\n{}",
        String::from_utf8_lossy(&plan.stderr)
    );
    let check = imagegc_command(&config, &server.endpoint(), &state, &["check-config"]).await;
    let stderr = String::from_utf8_lossy(&check.stderr);
    assert!(
        stderr.contains("warning: another collector removed 1 image(s) (4.0 KiB)"),
        "{stderr}"
    );
}
