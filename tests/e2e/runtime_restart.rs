//! The runtime goes away under a running daemon and comes back: readiness
//! and `imagegc_runtime_up` follow it, the daemon stays up, says so once,
//! and collects again once containerd answers, without touching the image
//! of a container that survived the restart.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use imagegc::cri::ContainerState;

use crate::chaos::Daemon;
use crate::oci::ImageSpec;
use crate::testbed::{Kind, TestBed};

/// How long the daemon may take to notice that the runtime is gone (it
/// polls containers every second).
const NOTICE_DOWN: Duration = Duration::from_secs(10);
/// How long it may take to collect again once the runtime answers.
const NOTICE_UP: Duration = Duration::from_secs(20);
/// How long the runtime stays down once the daemon noticed: long enough
/// for several failed attempts.
const OUTAGE: Duration = Duration::from_secs(3);
const UNREACHABLE_WARNING: &str = "container runtime is not reachable";
const REACHABLE_AGAIN: &str = "container runtime is reachable again";

async fn the_daemon_waits_out_a_runtime_restart_and_collects_again(kind: Kind) {
    let mut bed = TestBed::start(kind, 300).await;
    let running = bed.import(&ImageSpec::small("restart-running", 0x5e57_0001)).await;
    let before_outage = bed.import(&ImageSpec::small("restart-unused-1", 0x5e57_0002)).await;
    let pod = bed.run_pod("restart").await;
    let container = bed.run_container(&pod, running.name()).await;

    let port = free_port();
    // A long interval: cycles at start and after the runtime is back, and
    // the outage is noticed by the container poll between cycles.
    let mut daemon = Daemon::start(
        bed.endpoint(),
        &format!(
            r#"[gc]
high_threshold_percent = 1
low_threshold_percent = 0
min_age = "0s"
interval = "5m"
usage_poll_interval = "1s"

[metrics]
listen = "127.0.0.1:{port}"
"#
        ),
    );
    let http = Http(SocketAddr::from(([127, 0, 0, 1], port)));

    wait_for(
        "the daemon is ready and sees the runtime",
        NOTICE_UP,
        &mut daemon,
        || http.status("/readyz") == Some(200) && http.metric("imagegc_runtime_up") == Some(1.0),
    );
    let ids = wait_for_images(&bed, &mut daemon, |ids| !ids.contains(&before_outage.id)).await;
    assert!(
        ids.contains(&running.id),
        "the running container's image was removed: {ids:?}"
    );

    // Imported after the first cycle: only a cycle after the restart can
    // remove it.
    let after_outage = bed.import(&ImageSpec::small("restart-unused-2", 0x5e57_0003)).await;
    bed.stop_containerd();
    let stopped = Instant::now();
    wait_for("readiness and runtime_up to drop", NOTICE_DOWN, &mut daemon, || {
        http.status("/readyz") == Some(503) && http.metric("imagegc_runtime_up") == Some(0.0)
    });
    println!(
        "runtime_restart: the daemon noticed the outage after {} ms",
        stopped.elapsed().as_millis()
    );
    std::thread::sleep(OUTAGE);
    assert!(daemon.is_running(), "the daemon exited while the runtime was down");
    assert_eq!(http.status("/readyz"), Some(503));
    assert_eq!(
        http.status("/healthz"),
        Some(200),
        "the daemon is alive while the runtime is down"
    );

    let cycles_in_outage = http.cycles();
    bed.start_containerd().await;
    let restarted = Instant::now();
    wait_for("readiness and runtime_up to come back", NOTICE_UP, &mut daemon, || {
        http.status("/readyz") == Some(200) && http.metric("imagegc_runtime_up") == Some(1.0)
    });
    let ready_after = restarted.elapsed();
    let ids = wait_for_images(&bed, &mut daemon, |ids| !ids.contains(&after_outage.id)).await;
    println!(
        "runtime_restart: ready {} ms and collecting {} ms after containerd answered again",
        ready_after.as_millis(),
        restarted.elapsed().as_millis()
    );
    assert!(
        http.cycles() > cycles_in_outage,
        "no cycle was counted after the restart ({cycles_in_outage:?} before)"
    );
    assert!(
        ids.contains(&running.id),
        "the image of the container that survived the restart was removed: {ids:?}"
    );
    assert_eq!(
        bed.container_state(&container).await,
        Some(ContainerState::Running),
        "the container survives containerd's restart"
    );

    let status = daemon.terminate();
    assert!(
        status.success(),
        "imagegc run exited with {status} after SIGTERM; last lines of its log:\n{}",
        daemon.log_tail(30)
    );
    let log = daemon.log();
    let count = |text: &str| log.iter().filter(|l| l.message.starts_with(text)).count();
    let warnings: Vec<&str> = log
        .iter()
        .filter(|l| l.level == "WARN" && l.message.starts_with(UNREACHABLE_WARNING))
        .map(|l| l.raw.as_str())
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "one warning for one outage (logged once per change): {warnings:#?}"
    );
    assert_eq!(count(REACHABLE_AGAIN), 1, "one notice that the runtime is back");
    let removed: Vec<&str> = log
        .iter()
        .filter(|l| l.message == "removed image")
        .filter_map(|l| l.image.as_deref())
        .collect();
    assert_eq!(
        removed,
        [before_outage.id.as_str(), after_outage.id.as_str()],
        "exactly the two unused images were removed, one before and one after the outage"
    );
}

/// Polls `ready` every 100 ms until it holds; fails with the daemon's log
/// when it does not within `within`, or when the daemon exits.
fn wait_for(what: &str, within: Duration, daemon: &mut Daemon, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    loop {
        if ready() {
            return;
        }
        assert!(
            daemon.is_running(),
            "the daemon exited while waiting for {what}; last lines of its log:\n{}",
            daemon.log_tail(30)
        );
        assert!(
            Instant::now() < deadline,
            "waited {within:?} for {what}; last lines of the daemon's log:\n{}",
            daemon.log_tail(30)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until the image ids CRI lists satisfy `done`; returns them.
async fn wait_for_images(
    bed: &TestBed,
    daemon: &mut Daemon,
    done: impl Fn(&std::collections::BTreeSet<String>) -> bool,
) -> std::collections::BTreeSet<String> {
    let deadline = Instant::now() + NOTICE_UP;
    loop {
        let ids = bed.list_image_ids().await;
        if done(&ids) {
            return ids;
        }
        assert!(
            daemon.is_running() && Instant::now() < deadline,
            "the daemon did not remove the unused image within {NOTICE_UP:?} (images: {ids:?}); \
             last lines of its log:\n{}",
            daemon.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A port nothing listens on right now.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    listener.local_addr().expect("the bound address").port()
}

/// Plain HTTP/1.1 GETs against the daemon's endpoint.
struct Http(SocketAddr);

impl Http {
    /// The status code and body of `GET path`; None when nothing answers.
    fn get(&self, path: &str) -> Option<(u16, String)> {
        let mut stream = TcpStream::connect_timeout(&self.0, Duration::from_secs(2)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.0
        )
        .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let status = response.split(' ').nth(1)?.parse().ok()?;
        let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
        Some((status, body))
    }

    fn status(&self, path: &str) -> Option<u16> {
        self.get(path).map(|(status, _)| status)
    }

    /// `imagegc_cycles_total`, summed over its results.
    fn cycles(&self) -> Option<f64> {
        let (_, body) = self.get("/metrics")?;
        Some(
            body.lines()
                .filter(|line| line.starts_with("imagegc_cycles_total{"))
                .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                .sum(),
        )
    }

    /// The value of an unlabelled sample in `/metrics`.
    fn metric(&self, name: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics")?;
        imagegc_testkit::metric(&body, name)
    }
}

on_every_runtime!(the_daemon_waits_out_a_runtime_restart_and_collects_again,);
