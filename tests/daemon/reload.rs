//! SIGHUP: the configuration reloaded, or refused with the reason.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use imagegc_testkit::fake::FakeRuntime;

use crate::support::{Daemon, Settings, eventually, free_local_addr, ids, image, secs};

/// A configuration for the reload tests: `timeout` and `interval` as
/// given, nothing ever removed, the filesystem of `dir` measured.
fn reload_config(dir: &std::path::Path, timeout: &str, interval: &str, listen: &str) -> String {
    format!(
        "[runtime]\ntimeout = {timeout:?}\n\n[gc]\ninterval = {interval:?}\nusage_poll_interval = \"1s\"\n\
         high_threshold_percent = 100\nlow_threshold_percent = 0\nimage_fs_path = {:?}\n\n\
         [metrics]\nlisten = {listen:?}\n",
        dir.display().to_string()
    )
}

#[tokio::test]
async fn a_reload_that_shortens_the_interval_runs_the_next_cycle_on_the_new_schedule() {
    let fake = FakeRuntime::new();
    fake.add_image(image("a", 1000));
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    std::fs::write(&config, reload_config(dir.path(), "10s", "1h", "")).unwrap();
    let mut daemon = Daemon::spawn(&config, &server.endpoint(), &dir.path().join("state"), None);
    daemon.wait_logged("next cycle scheduled", secs(10)).await;

    std::fs::write(&config, reload_config(dir.path(), "10s", "2s", "")).unwrap();
    daemon.signal(libc::SIGHUP);
    daemon.wait_logged("configuration reloaded", secs(5)).await;

    // The cycle after the first is due 2s after it, not an hour.
    let deadline = Instant::now() + secs(6);
    while daemon.logged("next cycle scheduled") < 2 {
        assert!(
            Instant::now() < deadline,
            "no cycle on the new 2s interval:\n{}",
            daemon.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(daemon.running());
}

#[tokio::test]
async fn a_reload_applies_runtime_timeout_to_the_next_call_and_names_the_keys_that_need_a_restart() {
    let fake = FakeRuntime::new();
    fake.add_image(image("a", 1000));
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    let addr = free_local_addr();
    std::fs::write(&config, reload_config(dir.path(), "1h", "1s", &addr.to_string())).unwrap();
    let mut daemon = Daemon::spawn(&config, &server.endpoint(), &dir.path().join("state"), Some(addr));
    daemon.wait_logged("next cycle scheduled", secs(10)).await;

    let other = free_local_addr();
    std::fs::write(&config, reload_config(dir.path(), "1s", "1s", &other.to_string())).unwrap();
    daemon.signal(libc::SIGHUP);
    daemon.wait_logged("configuration reloaded; it applies", secs(5)).await;

    // A listing that never answers now costs one second, not the hour the
    // daemon started with.
    fake.delay("ListImages", secs(3600));
    daemon.wait_logged("timed out after 1s", secs(6)).await;
    let (status, _) = daemon.get("/healthz").await;
    assert_eq!(status, 200, "the endpoint stays on the address it was bound to");
    let restart = daemon
        .stderr()
        .lines()
        .find(|l| l.contains("take effect only after a restart"))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no warning names the keys that need a restart:\n{}", daemon.stderr()));
    assert!(
        restart.contains("WARN") && restart.contains("metrics.listen") && !restart.contains("runtime.timeout"),
        "{restart}"
    );
    fake.delay("ListImages", Duration::ZERO);
}

#[tokio::test]
async fn sighup_reloads_the_configuration_and_a_bad_one_is_refused() {
    let fake = FakeRuntime::new();
    let (a, b, c) = (image("a", 1000), image("b", 1000), image("c", 1000));
    fake.add_image(a.clone());
    fake.add_image(b.clone());
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    Settings::new(dir.path()).write(&config);
    let mut daemon = Daemon::spawn(&config, &server.endpoint(), &dir.path().join("state"), None);

    eventually(secs(10), "two cycles", || (fake.count("ListImages") >= 2).then_some(())).await;
    assert!(fake.removed().is_empty(), "high 100 removes nothing");

    Settings::new(dir.path()).remove_everything().write(&config);
    daemon.signal(libc::SIGHUP);
    daemon.wait_logged("configuration reloaded", secs(5)).await;
    eventually(secs(5), "removals under the new thresholds", || {
        (fake.removed().len() == 2).then_some(())
    })
    .await;
    assert_eq!(ids(&fake.removed()), BTreeSet::from([a.id.as_str(), b.id.as_str()]));

    // A file that would stop collection, were it not for the bad max_age.
    std::fs::write(
        &config,
        "[gc]\ninterval = \"1s\"\nhigh_threshold_percent = 100\nmin_age = \"0s\"\nmax_age = \"soon\"\n",
    )
    .unwrap();
    daemon.signal(libc::SIGHUP);
    daemon.wait_logged("configuration reload rejected", secs(5)).await;
    let rejected = daemon
        .stderr()
        .lines()
        .find(|l| l.contains("configuration reload rejected"))
        .unwrap()
        .to_string();
    assert!(
        rejected.contains("gc.max_age") && rejected.contains(&config.display().to_string()),
        "the log names the file and the key: {rejected}"
    );

    // Still running, with the thresholds from before.
    fake.add_image(c.clone());
    eventually(secs(5), "the new image removed under the old thresholds", || {
        fake.removed().contains(&c.id).then_some(())
    })
    .await;
    assert!(daemon.running());
}

#[tokio::test]
async fn a_reload_of_a_file_that_could_block_stops_neither_cycles_nor_probes_nor_shutdown() {
    let fake = FakeRuntime::new();
    fake.add_image(image("app", 1000));
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    let addr = free_local_addr();
    Settings {
        listen: Some(addr),
        ..Settings::new(dir.path())
    }
    .write(&config);
    let mut daemon = Daemon::spawn(&config, &server.endpoint(), &dir.path().join("state"), Some(addr));
    eventually(secs(10), "a first cycle", || {
        (fake.count("ListImages") >= 1).then_some(())
    })
    .await;

    // The file becomes a FIFO that nobody writes: reading it would never
    // end. The reload refuses it without opening it for a blocking read,
    // off the daemon's loop.
    std::fs::remove_file(&config).unwrap();
    let fifo = std::ffi::CString::new(config.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo(3) with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    daemon.signal(libc::SIGHUP);

    let listed = fake.count("ListImages");
    eventually(secs(10), "two more cycles", || {
        (fake.count("ListImages") >= listed + 2).then_some(())
    })
    .await;
    assert_eq!(daemon.get("/healthz").await.0, 200);
    daemon.wait_logged("it is a FIFO, not a regular file", secs(5)).await;
    daemon.signal(libc::SIGHUP);

    daemon.signal(libc::SIGTERM);
    let status = daemon.exited_within(secs(10)).await;
    assert!(status.is_some_and(|s| s.success()), "{status:?}:\n{}", daemon.stderr());
}
