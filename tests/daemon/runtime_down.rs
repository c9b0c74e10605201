//! The runtime going away, and down at start.

use std::time::{Duration, Instant};

use imagegc_testkit::fake::FakeRuntime;

use crate::support::{Daemon, InProcess, Settings, eventually, free_local_addr, image, roomy_disk, secs};

#[tokio::test]
async fn a_runtime_that_goes_away_between_cycles_is_noticed_and_found_again() {
    let fake = FakeRuntime::new();
    fake.add_image(image("app", 1000));
    let mut daemon = InProcess::start(fake.clone(), roomy_disk(), |_| {}, |c| c.gc.interval = secs(3600)).await;
    eventually(secs(5), "ready", || daemon.health.is_ready().then_some(())).await;

    let server = daemon.server.take().unwrap();
    let socket = server.socket_path().to_path_buf();
    server.shutdown().await;
    eventually(secs(5), "not ready while the runtime is down", || {
        (!daemon.health.is_ready()).then_some(())
    })
    .await;
    eventually(secs(5), "imagegc_runtime_up 0 while the runtime is down", || {
        daemon.metrics.encode().contains("imagegc_runtime_up 0").then_some(())
    })
    .await;

    daemon.server = Some(fake.clone().serve(&socket).await.unwrap());
    eventually(secs(10), "ready again once the runtime is back", || {
        daemon.health.is_ready().then_some(())
    })
    .await;
    assert!(daemon.metrics.encode().contains("imagegc_runtime_up 1"));
}

#[tokio::test]
async fn a_runtime_that_is_down_at_start_is_retried_and_readiness_follows() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("cri.sock");
    let endpoint = format!("unix://{}", socket.display());
    let config = dir.path().join("imagegc.toml");
    let addr = free_local_addr();
    Settings {
        interval: "1h",
        listen: Some(addr),
        ..Settings::new(dir.path())
    }
    .write(&config);
    let mut daemon = Daemon::spawn(&config, &endpoint, &dir.path().join("state"), Some(addr));

    assert_eq!(daemon.get("/readyz").await.0, 503);
    assert_eq!(
        daemon.get("/healthz").await.0,
        200,
        "alive while waiting for the runtime"
    );
    // Two failed attempts: the first cycle and a retry.
    daemon.wait_logged("cycle failed", secs(5)).await;
    let deadline = Instant::now() + secs(5);
    while daemon.logged("cycle failed") < 2 {
        assert!(Instant::now() < deadline, "no retry:\n{}", daemon.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(daemon.get("/readyz").await.0, 503);
    assert_eq!(daemon.metric("imagegc_runtime_up").await, Some(0.0));

    let fake = FakeRuntime::new();
    fake.add_image(image("app", 1000));
    let _server = fake.clone().serve(&socket).await.unwrap();
    let deadline = Instant::now() + secs(10);
    while daemon.get("/readyz").await.0 != 200 {
        assert!(Instant::now() < deadline, "not ready:\n{}", daemon.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(fake.count("ListImages") > 0, "a cycle ran");
    assert_eq!(daemon.metric("imagegc_runtime_up").await, Some(1.0));
    assert_eq!(
        daemon.logged("container runtime is not reachable"),
        1,
        "one warning per change, not per retry:\n{}",
        daemon.stderr()
    );
    assert_eq!(daemon.logged("container runtime is reachable again"), 1);
}
