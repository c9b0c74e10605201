//! The schedule: `daemon::run` and `simulate` start cycles at the same moments.

use super::*;

/// Notes when each cycle starts, in the tokio clock.
#[derive(Default)]
struct CycleStarts(Mutex<Vec<tokio::time::Instant>>);

impl Sink for CycleStarts {
    fn emit(&self, event: &Event<'_>) {
        if matches!(event, Event::CycleStarted) {
            self.0.lock().unwrap().push(tokio::time::Instant::now());
        }
    }
}

/// `simulate` runs the daemon's schedule (`policy::Schedule`): for the same
/// node and the same events, `daemon::run` and the replay start cycles at
/// the same moments (the daemon's in whole seconds, rounded up, as the
/// replay counts time). The node: 1,000 MB; high 80, low 60, minimum age
/// 60 s, every 5 minutes. Its cycles: at the start; at the first usage
/// check after a pull takes usage to 85 %, which keeps the only unused
/// image for being too young; again as soon as that image may go (low
/// reached); one interval later; at the check after a pull that crosses
/// high again with every image in use (low not reached, none young: the
/// interval next); then every interval.
#[tokio::test(start_paused = true)]
async fn the_daemon_and_simulate_start_cycles_at_the_same_moments() {
    const MB: u64 = 1_000_000;
    let sizes = [300 * MB, 300 * MB, 250 * MB, 300 * MB];
    // (second, container, image, started): at odd seconds, between the
    // daemon's usage checks.
    let events: [(u64, u64, u32, bool); 7] = [
        (1, 0, 0, true),
        (41, 0, 0, false),
        (101, 1, 1, true),
        (161, 2, 2, true),
        (541, 3, 3, true),
        (561, 1, 1, false),
        (1501, 3, 3, false),
    ];
    let configure = |c: &mut Config| {
        c.gc.high_threshold_percent = 80;
        c.gc.low_threshold_percent = 60;
        c.gc.min_age = Duration::from_secs(60);
        c.gc.interval = Duration::from_secs(300);
        // Polls that list the node between cycles come once per interval,
        // after the cycles that see each image first (the replay's
        // listings are its cycles').
        c.gc.usage_poll_interval = Duration::from_secs(300);
        c.gc.headroom = false;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(dir.path(), configure);
    let simulated = crate::sim::replay::tests::cycle_starts(&sizes, &events, 1000 * MB, &config);

    let sim = SimHandle::default();
    sim.with(|s| s.disk.set(1000 * MB, 1000 * MB));
    let starts = Arc::new(CycleStarts::default());
    // Records' times on the daemon's clock (virtual here), as in a node's
    // life: images age with it.
    let clock = Clock::following_tokio(SystemTime::now() - Duration::from_secs(3600));
    let c = start(&sim, &config, clock, None).with_sink(Arc::clone(&starts) as Arc<dyn Sink>);
    let health = Arc::new(crate::outputs::health::Health::new(Duration::from_secs(600)));
    let shutdown = CancellationToken::new();
    let (reloads, reload_rx) = tokio::sync::mpsc::unbounded_channel::<Arc<Config>>();
    let origin = tokio::time::Instant::now();
    let daemon = tokio::spawn({
        let (config, stop) = (config.clone(), shutdown.clone());
        async move {
            let _reloads = reloads;
            crate::daemon::run(c, Arc::new(config), health, stop, reload_rx).await;
        }
    });
    for &(at, container, image, started) in &events {
        tokio::time::sleep_until(origin + Duration::from_secs(at)).await;
        let id = format!("sha256:{image:064x}");
        let container = format!("c{container}");
        sim.with(|s| {
            if !started {
                s.node.containers.retain(|c| c.id != container);
                return;
            }
            if s.node.image(&id).is_none() {
                let mut pulled = crate::testing::library_image(&id, sizes[image as usize]);
                pulled.repo_tags = vec![crate::sim::replay::tests::image_name(image)].into();
                s.node.add_image(pulled);
                s.disk.write(&id, sizes[image as usize]);
            }
            s.node.add_container(crate::testing::container_naming(&container, &id));
        });
    }
    shutdown.cancel();
    daemon.await.unwrap();
    let secs_up = |d: Duration| d.as_secs() + u64::from(d.subsec_nanos() > 0);
    let daemon_starts: Vec<u64> = starts
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|at| secs_up(at.duration_since(origin)))
        .collect();
    assert_eq!(simulated, [0, 162, 223, 523, 543, 843, 1143, 1443], "simulate's");
    assert_eq!(daemon_starts, simulated, "the daemon's");
    assert_eq!(
        sim.removed(),
        [format!("sha256:{:064x}", 0), format!("sha256:{:064x}", 1)]
    );
}
