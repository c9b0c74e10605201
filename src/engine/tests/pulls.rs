//! Room before pulls: coming pulls sized by the node's history or a registry's manifest, the room they get, and the daemon making it at once.

use super::*;

/// A node at 78 %, below high (80): six unused images of 400 bytes (4 %:
/// they fit between high and the kubelet's eviction line, 85 %) and, when
/// `big` is given, an image of that size in use that arrived just now.
async fn below_high_after_a_pull(big: Option<u64>) -> (SimHandle, CycleReport) {
    let sim = SimHandle::default();
    sim.with(|s| {
        for id in ["a", "b", "c", "d", "e", "f"] {
            s.unused(id, 400, 400);
        }
        if let Some(size) = big {
            s.node.add_image(image("big", size));
            s.node.containers = vec![crate::testing::container_naming("job", "big")];
        }
        s.disk.set(10_000, 2_200);
    });
    let (mut c, _dir) = collector(&sim, |c| {
        c.gc.high_threshold_percent = 80;
        c.gc.low_threshold_percent = 75;
        c.gc.headroom = true;
        c.eviction_imagefs_available = Some(crate::config::EvictionThreshold::Percent(15.0));
    });
    let report = cycle(&mut c).await;
    (sim, report)
}

#[tokio::test]
async fn after_a_pull_that_would_not_fit_above_the_eviction_line_the_space_pass_starts_below_high() {
    // The node pulled a 2,000-byte image: 1,500 (the line) and 2,000 must
    // stay available, so high is 65 and low 60 here: 4,000 available.
    let (sim, report) = below_high_after_a_pull(Some(2_000)).await;
    assert!(report.space_pass, "{report:?}");
    assert_eq!(sim.removed().len(), 5, "{report:?}");
    assert_eq!(report.after.unwrap().available_bytes, 4_200);
    // A node whose pulls fit keeps its thresholds: nothing at 78 %.
    let (sim, report) = below_high_after_a_pull(Some(300)).await;
    assert!(!report.space_pass, "{report:?}");
    assert!(sim.removed().is_empty());
}

/// A node at 35 % (1000 MB) with six unused 25 MB images, a 420 MB image
/// of `registry.test/app` it had before, and the kubelet's line at 30 %
/// available; high 55, low 50. Then a pod bound to the node names
/// `registry.test/app:2`, which the node lacks: its pull would take usage
/// to 77 %, past the line.
async fn a_pod_on_a_node_that_had_its_repository(
    room_before_pulls: bool,
) -> (SimHandle, Collector<SimHandle>, tempfile::TempDir, Config) {
    const MB: u64 = 1_000_000;
    let sim = SimHandle::default();
    let tagged = |id: &str, tag: &str, size: u64| Image {
        repo_tags: vec![tag.to_string()].into(),
        ..image(id, size)
    };
    sim.with(|s| {
        for i in 0..6 {
            s.unused(&format!("old-{i}"), 25 * MB, 25 * MB);
        }
        s.disk.set(1000 * MB, 650 * MB);
    });
    // The node had app:1 when the last process saved its records (it went
    // since); its next process remembers its size.
    let now = SystemTime::now();
    let hour_ago = now - Duration::from_secs(3600);
    let had = crate::testing::history(&tagged("app-1", "registry.test/app:1", 420 * MB), hour_ago, hour_ago);
    let configure = |c: &mut Config| {
        c.gc.high_threshold_percent = 55;
        c.gc.low_threshold_percent = 50;
        c.eviction_imagefs_available = Some(crate::config::EvictionThreshold::Percent(30.0));
        c.kubernetes.enabled = true;
        c.kubernetes.room_before_pulls = room_before_pulls;
    };
    let (mut c, dir) = collector_with_history(&sim, configure, Records::from_map([had]));
    let config = test_config(dir.path(), configure);
    cycle(&mut c).await;
    assert!(sim.removed().is_empty());
    c.set_protections(crate::policy::Protections {
        references: vec![
            ("registry.test/app:2".to_string(), "default/app-5f4".to_string()),
            // An image a pod names is never removed to make room.
            ("old-0".to_string(), "default/cron".to_string()),
        ],
        ..Default::default()
    });
    (sim, c, dir, config)
}

#[tokio::test]
async fn a_pull_coming_for_a_pod_that_would_cross_the_eviction_line_gets_its_room_first_and_once() {
    const MB: u64 = 1_000_000;
    let (sim, mut c, _dir, _) = a_pod_on_a_node_that_had_its_repository(true).await;
    // 35 % is below high (55), but not 420 MB above the line (30 %): the
    // thresholds in force are 28/23.
    assert_eq!(c.check_usage(), Some(true), "a space pass is due before the pull");
    let report = cycle(&mut c).await;
    assert_eq!(
        sim.removed(),
        ["old-1", "old-2", "old-3", "old-4", "old-5"],
        "down to 23 %, never the image a pod names: {report:?}"
    );
    assert!(report.hurried, "the pull would cross the line: no settle waits");
    assert_eq!(sample(&c, "imagegc_room_before_pulls_total").as_deref(), Some("1"));
    // The pull's blobs arrive: the room was made for them, nothing more goes.
    sim.with(|s| s.disk.set_available(s.disk.available() - 300 * MB));
    assert_eq!(
        c.check_usage(),
        Some(false),
        "{:?}",
        sim.0.lock().unwrap().disk.available()
    );
    cycle(&mut c).await;
    assert_eq!(sim.removed().len(), 5);
    // The image lands under the line.
    sim.with(|s| {
        s.disk.set_available(s.disk.available() - 120 * MB);
        s.node.add_image(Image {
            repo_tags: vec!["registry.test/app:2".to_string()].into(),
            ..image("app-2", 420 * MB)
        });
    });
    let stats = sim.stats(Path::new("/sim")).unwrap();
    assert!(stats.available() >= 300 * MB, "{stats:?}");
    cycle(&mut c).await;
    assert_eq!(sim.removed().len(), 5);
}

#[tokio::test]
async fn without_room_before_pulls_a_coming_pull_starts_nothing() {
    let (sim, mut c, _dir, _) = a_pod_on_a_node_that_had_its_repository(false).await;
    assert_eq!(c.check_usage(), Some(false));
    cycle(&mut c).await;
    assert!(sim.removed().is_empty());
}

#[tokio::test]
async fn a_pull_of_a_repository_the_node_never_had_is_not_sized_and_starts_nothing() {
    let (sim, mut c, _dir, _) = a_pod_on_a_node_that_had_its_repository(true).await;
    c.set_protections(crate::policy::Protections {
        references: vec![("registry.test/other:1".to_string(), "default/new".to_string())],
        ..Default::default()
    });
    assert_eq!(c.check_usage(), Some(false));
    cycle(&mut c).await;
    assert!(sim.removed().is_empty());
}

/// Sizes given by a test, as a registry's manifests would give them: the
/// references asked for are noted.
struct GivenSizes {
    sizes: Mutex<HashMap<String, u64>>,
    asked: Mutex<Vec<String>>,
    answered: tokio::sync::watch::Sender<u64>,
}

impl Default for GivenSizes {
    fn default() -> Self {
        GivenSizes {
            sizes: Mutex::default(),
            asked: Mutex::default(),
            answered: tokio::sync::watch::channel(0).0,
        }
    }
}

impl GivenSizes {
    /// `reference` read at `size`; who waits on answers is woken.
    fn answer(&self, reference: &str, size: u64) {
        self.sizes.lock().unwrap().insert(reference.to_string(), size);
        self.answered.send_modify(|n| *n += 1);
    }
}

impl super::PullSizes for GivenSizes {
    fn size_of(&self, reference: &str) -> Option<u64> {
        self.asked.lock().unwrap().push(reference.to_string());
        self.sizes.lock().unwrap().get(reference).copied()
    }

    fn read_for(&self, image: &Image) -> Option<u64> {
        let sizes = self.sizes.lock().unwrap();
        image.repo_tags.iter().find_map(|tag| sizes.get(tag).copied())
    }

    fn answers(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.answered.subscribe())
    }
}

/// The daemon loop on `c` (a [`a_pod_on_a_node_that_had_its_repository`]
/// node), its pods' images given by the returned sender, until the token
/// is cancelled; returned after its first cycle (10 s of virtual time).
async fn daemon_on(
    mut c: Collector<SimHandle>,
    config: Config,
) -> (
    tokio::sync::watch::Sender<Arc<crate::policy::Protections>>,
    CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let (pods, watched) = tokio::sync::watch::channel(Arc::new(crate::policy::Protections::default()));
    c.protections_from(watched);
    let health = Arc::new(crate::outputs::health::Health::new(Duration::from_secs(600)));
    let shutdown = CancellationToken::new();
    let (reloads, reload_rx) = tokio::sync::mpsc::unbounded_channel::<Arc<Config>>();
    let stop = shutdown.clone();
    let daemon = tokio::spawn(async move {
        let _reloads = reloads;
        crate::daemon::run(c, Arc::new(config), health, stop, reload_rx).await;
    });
    tokio::time::sleep(Duration::from_secs(10)).await;
    (pods, shutdown, daemon)
}

/// Asserts that the first removal on `sim` came within 0.5 s of `since`
/// (virtual time: the daemon's own usage check runs every 2 s, so only a
/// wake-up on `what` is that quick), stops the daemon, and asserts that
/// every old image went but the one a pod names.
async fn room_made_at_once_after(
    what: &str,
    since: tokio::time::Instant,
    sim: &SimHandle,
    shutdown: CancellationToken,
    daemon: tokio::task::JoinHandle<()>,
) {
    while sim.removed().is_empty() {
        assert!(since.elapsed() < Duration::from_secs(60), "nothing removed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let after = since.elapsed();
    assert!(
        after < Duration::from_millis(500),
        "the first removal {after:?} after {what}"
    );
    shutdown.cancel();
    daemon.await.unwrap();
    assert_eq!(sim.removed(), ["old-1", "old-2", "old-3", "old-4", "old-5"]);
}

fn pods_naming(references: &[(&str, &str)]) -> Arc<crate::policy::Protections> {
    Arc::new(crate::policy::Protections {
        references: references.iter().map(|(r, p)| (r.to_string(), p.to_string())).collect(),
        ..Default::default()
    })
}

#[tokio::test(start_paused = true)]
async fn the_daemon_makes_room_as_soon_as_a_pod_is_bound() {
    let (sim, c, _dir, config) = a_pod_on_a_node_that_had_its_repository(true).await;
    let (pods, shutdown, daemon) = daemon_on(c, config).await;
    assert!(sim.removed().is_empty());
    // Between two of the daemon's own usage checks.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let bound = tokio::time::Instant::now();
    pods.send_replace(pods_naming(&[
        ("registry.test/app:2", "default/app-5f4"),
        ("old-0", "default/cron"),
    ]));
    room_made_at_once_after("the binding", bound, &sim, shutdown, daemon).await;
}

#[tokio::test(start_paused = true)]
async fn the_daemon_makes_room_as_soon_as_a_pulls_size_is_read() {
    const MB: u64 = 1_000_000;
    let (sim, c, _dir, config) = a_pod_on_a_node_that_had_its_repository(true).await;
    let sizes = Arc::new(GivenSizes::default());
    let c = c.with_pull_sizes(Arc::clone(&sizes) as Arc<dyn super::PullSizes>);
    let (pods, shutdown, daemon) = daemon_on(c, config).await;
    // A pod bound with an image of a repository the node never had: asked
    // of the registry at once, nothing made room for yet.
    pods.send_replace(pods_naming(&[
        ("registry.test/other:1", "default/new"),
        ("old-0", "default/cron"),
    ]));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        sizes.asked.lock().unwrap().first().map(String::as_str),
        Some("registry.test/other:1")
    );
    assert!(sim.removed().is_empty());
    // The size is read: the usage check runs at once, not at its next turn.
    let answered = tokio::time::Instant::now();
    // 162 MB of manifest: about 420 MB as a runtime storing its layers
    // unpacked reports it (the median ratio, 2.6), as app:1 was.
    sizes.answer("registry.test/other:1", 162 * MB);
    room_made_at_once_after("the answer", answered, &sim, shutdown, daemon).await;
}

#[tokio::test]
async fn a_pull_of_a_repository_the_node_never_had_is_sized_by_its_manifest_when_one_is_read() {
    const MB: u64 = 1_000_000;
    let (sim, c, _dir, _) = a_pod_on_a_node_that_had_its_repository(true).await;
    let sizes = Arc::new(GivenSizes::default());
    let mut c = c.with_pull_sizes(Arc::clone(&sizes) as Arc<dyn super::PullSizes>);
    c.set_protections(crate::policy::Protections {
        references: vec![
            ("registry.test/other:1".to_string(), "default/new".to_string()),
            ("old-0".to_string(), "default/cron".to_string()),
        ],
        ..Default::default()
    });
    // Not read yet: asked for, nothing made room for.
    assert_eq!(c.check_usage(), Some(false));
    assert_eq!(sizes.asked.lock().unwrap().as_slice(), ["registry.test/other:1"]);
    cycle(&mut c).await;
    assert!(sim.removed().is_empty());
    // Read: about the pull the history would have sized (162 MB of
    // manifest, about 420 MB as reported).
    sizes
        .sizes
        .lock()
        .unwrap()
        .insert("registry.test/other:1".to_string(), 162 * MB);
    assert_eq!(c.check_usage(), Some(true), "a space pass is due before the pull");
    let report = cycle(&mut c).await;
    assert_eq!(
        sim.removed(),
        ["old-1", "old-2", "old-3", "old-4", "old-5"],
        "down to the low in force, never the image a pod names: {report:?}"
    );
    assert_eq!(sample(&c, "imagegc_room_before_pulls_total").as_deref(), Some("1"));
    // A pull the node's history sizes is never asked of the registry.
    c.set_protections(crate::policy::Protections {
        references: vec![("registry.test/app:3".to_string(), "default/app".to_string())],
        ..Default::default()
    });
    sizes.asked.lock().unwrap().clear();
    c.check_usage();
    assert!(sizes.asked.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_manifests_size_is_scaled_to_what_the_runtime_reports_and_each_arrival_teaches_the_scale() {
    const MB: u64 = 1_000_000;
    // The simulated runtime reports unpacked sizes, as CRI-O does (its
    // footprint is 1): a manifest's 150 MB of compressed layers are 390 MB
    // reported at the median compression ratio, past the line from 35 %.
    let (sim, c, _dir, _) = a_pod_on_a_node_that_had_its_repository(true).await;
    assert!(!c.inventory.footprint().reports_compressed());
    let sizes = Arc::new(GivenSizes::default());
    sizes.answer("registry.test/other:1", 150 * MB);
    let mut c = c.with_pull_sizes(Arc::clone(&sizes) as Arc<dyn super::PullSizes>);
    c.set_protections(crate::policy::Protections {
        references: vec![
            ("registry.test/other:1".to_string(), "default/new".to_string()),
            ("old-0".to_string(), "default/cron".to_string()),
        ],
        ..Default::default()
    });
    assert_eq!(
        c.check_usage(),
        Some(true),
        "150 MB read as 150 MB would not cross the line"
    );
    cycle(&mut c).await;
    assert!(!sim.removed().is_empty());
    // It arrives reported at its manifest's size (incompressible layers):
    // the ratio moves halfway, from 2.6 to 1.8.
    sim.with(|s| {
        s.disk.set_available(s.disk.available() - 150 * MB);
        s.node.add_image(Image {
            repo_tags: vec!["registry.test/other:1".to_string()].into(),
            ..image("other-1", 150 * MB)
        });
    });
    cycle(&mut c).await;
    assert_eq!(c.inventory.manifest_scale().factor(), 1.8);
    assert_eq!(c.inventory.manifest_scale().reported(100 * MB), 180 * MB);
}

#[tokio::test]
async fn a_manifest_larger_than_the_image_filesystem_is_not_believed() {
    const MB: u64 = 1_000_000;
    let (sim, c, _dir, _) = a_pod_on_a_node_that_had_its_repository(true).await;
    let sizes = Arc::new(GivenSizes::default());
    // More than the whole 1000 MB disk.
    sizes
        .sizes
        .lock()
        .unwrap()
        .insert("registry.test/other:1".to_string(), 1001 * MB);
    let mut c = c.with_pull_sizes(Arc::clone(&sizes) as Arc<dyn super::PullSizes>);
    c.set_protections(crate::policy::Protections {
        references: vec![("registry.test/other:1".to_string(), "default/new".to_string())],
        ..Default::default()
    });
    assert_eq!(c.check_usage(), Some(false));
    cycle(&mut c).await;
    assert!(sim.removed().is_empty(), "a lying registry removes nothing");
}

/// A node of 1000 MB, 650 available: six images of 25 MB (`old-0` named
/// by a pod) and 200 MB of other data; high 55, low 50, the kubelet's line
/// at 30 %. With every removable image gone, 475 MB can be had above the
/// line. The node had `registry.test/rN:1` of `sizes[N]` MB each.
async fn a_node_with_room_for_475_mb_of_pulls(sizes: &[u64]) -> (SimHandle, Collector<SimHandle>, tempfile::TempDir) {
    const MB: u64 = 1_000_000;
    let sim = SimHandle::default();
    sim.with(|s| {
        for i in 0..6 {
            s.unused(&format!("old-{i}"), 25 * MB, 25 * MB);
        }
        s.disk.set(1000 * MB, 650 * MB);
    });
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    let had = sizes.iter().enumerate().map(|(n, size)| {
        let image = Image {
            repo_tags: vec![format!("registry.test/r{n}:1")].into(),
            ..image(&format!("r{n}-1"), size * MB)
        };
        crate::testing::history(&image, hour_ago, hour_ago)
    });
    let (mut c, dir) = collector_with_history(
        &sim,
        |c| {
            c.gc.high_threshold_percent = 55;
            c.gc.low_threshold_percent = 50;
            c.eviction_imagefs_available = Some(crate::config::EvictionThreshold::Percent(30.0));
            c.kubernetes.enabled = true;
            c.kubernetes.room_before_pulls = true;
        },
        Records::from_map(had),
    );
    cycle(&mut c).await;
    assert!(sim.removed().is_empty());
    (sim, c, dir)
}

/// Pods naming `registry.test/rN:2` for each N of `pulls`, and `old-0`.
fn pods_pulling(pulls: impl IntoIterator<Item = usize>) -> crate::policy::Protections {
    crate::policy::Protections {
        references: pulls
            .into_iter()
            .map(|n| (format!("registry.test/r{n}:2"), format!("default/p{n}")))
            .chain([("old-0".to_string(), "default/cron".to_string())])
            .collect(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_pull_that_cannot_fit_is_said_and_not_answered_by_emptying_the_node() {
    // 900 MB cannot fit above the line whatever goes.
    let (sim, mut c, _dir) = a_node_with_room_for_475_mb_of_pulls(&[900]).await;
    c.set_protections(pods_pulling([0]));
    // Between cycles every pull counts (a crossing is never missed); the
    // cycle, which plans, finds that no room can help.
    assert_eq!(c.check_usage(), Some(true));
    let report = cycle(&mut c).await;
    assert!(sim.removed().is_empty(), "{report:?}");
    assert_eq!(sample(&c, "imagegc_coming_pulls_cannot_fit").as_deref(), Some("1"));
    assert_eq!(sample(&c, "imagegc_room_before_pulls_total").as_deref(), Some("0"));
    // The pod goes: nothing is said of it any more.
    c.set_protections(pods_pulling([]));
    cycle(&mut c).await;
    assert_eq!(sample(&c, "imagegc_coming_pulls_cannot_fit").as_deref(), Some("0"));
}

#[tokio::test]
async fn many_pulls_each_reasonable_get_the_room_that_fits_and_no_more() {
    const MB: u64 = 1_000_000;
    // Twelve pulls of 80 MB: 960 MB together, 475 can be had. Five fit
    // (400 MB): 700 MB to keep available, so 30 % in force for high and
    // 25 % for low. Four images go, not every one.
    let (sim, mut c, _dir) = a_node_with_room_for_475_mb_of_pulls(&[80; 12]).await;
    c.set_protections(pods_pulling(0..12));
    assert_eq!(c.check_usage(), Some(true));
    let report = cycle(&mut c).await;
    assert_eq!(sim.removed(), ["old-1", "old-2", "old-3", "old-4"], "{report:?}");
    let available = sim.stats(Path::new("/sim")).unwrap().available_bytes;
    assert_eq!(available, 750 * MB);
    assert_eq!(sample(&c, "imagegc_coming_pulls_cannot_fit").as_deref(), Some("7"));
}

#[tokio::test(start_paused = true)]
async fn pulls_sized_one_at_a_time_are_weighed_together_and_each_size_read_is_a_new_crossing() {
    const MB: u64 = 1_000_000;
    let (sim, c, dir) = a_node_with_room_for_475_mb_of_pulls(&[]).await;
    let config = test_config(dir.path(), |c| {
        c.gc.high_threshold_percent = 55;
        c.gc.low_threshold_percent = 50;
        c.eviction_imagefs_available = Some(crate::config::EvictionThreshold::Percent(30.0));
        c.kubernetes.enabled = true;
        c.kubernetes.room_before_pulls = true;
    });
    // Something else filled the node to 45 % (at or above no threshold)
    // before the pods came.
    sim.with(|s| s.disk.set(1000 * MB, 550 * MB));
    let sizes = Arc::new(GivenSizes::default());
    let c = c.with_pull_sizes(Arc::clone(&sizes) as Arc<dyn super::PullSizes>);
    let (pods, shutdown, daemon) = daemon_on(c, config).await;
    pods.send_replace(Arc::new(crate::policy::Protections {
        references: vec![
            ("registry.test/a:1".to_string(), "default/a".to_string()),
            ("registry.test/b:1".to_string(), "default/b".to_string()),
            ("old-0".to_string(), "default/cron".to_string()),
        ],
        ..Default::default()
    }));
    tokio::time::sleep(Duration::from_millis(100)).await;
    // a: 50 MB of manifest, 130 MB as reported; alone it fits between
    // high and the line (keep 430 MB: 57 %).
    sizes.answer("registry.test/a:1", 50 * MB);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(sim.removed().is_empty());
    // b too: together they need 560 MB kept available (44 %), and a's
    // blobs have not arrived. The thresholds in force went down: a new
    // crossing, answered at once.
    let answered = tokio::time::Instant::now();
    sizes.answer("registry.test/b:1", 50 * MB);
    while sim.removed().is_empty() {
        assert!(answered.elapsed() < Duration::from_secs(60), "nothing removed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        answered.elapsed() < Duration::from_millis(500),
        "{:?}",
        answered.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    shutdown.cancel();
    daemon.await.unwrap();
    let available = sim.stats(Path::new("/sim")).unwrap().available_bytes;
    assert!(available >= 560 * MB, "room for both: {available}");
    assert!(!sim.removed().contains(&"old-0".to_string()));
}

/// Room before the pull, attacked: on nodes and pods drawn at random (image
/// sizes, other data, thresholds, the eviction line, pulls of any size,
/// some that cannot fit), the daemon's usage check and `plan` (a new
/// process on the same state) agree on whether a space pass is due and on
/// the thresholds in force where every pull fits (where one cannot, the
/// check never misses a pass `plan` says is due), and a cycle removes
/// nothing for pulls that cannot fit.
#[tokio::test]
async fn the_daemon_and_plan_agree_on_room_before_pulls_and_nothing_goes_for_a_pull_that_cannot_fit() {
    const MB: u64 = 1_000_000;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut draw = |low: u64, high: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        low + state % (high - low + 1)
    };
    let (mut cannot_fit, mut made_room, mut nothing_due) = (0, 0, 0);
    for seed in 0..60 {
        let sim = SimHandle::default();
        // Unused images, the first `repositories` of them the tag 1 of a
        // repository a pod may roll out the tag 2 of (sized like it).
        let images = draw(3, 10);
        let repositories = draw(1, 3).min(images);
        let mut on_disk = 0;
        sim.with(|s| {
            for i in 0..images {
                let size = draw(10, 150) * MB;
                on_disk += size;
                let mut listed = image(&format!("old-{i}"), size);
                if i < repositories {
                    listed.repo_tags = vec![format!("registry.test/r{i}:1")].into();
                }
                s.node.add_image(listed);
                s.disk.occupy(&format!("old-{i}"), size);
            }
        });
        let other = draw(0, 500) * MB;
        sim.with(|s| s.disk.set(1000 * MB, (1000 * MB).saturating_sub(on_disk + other)));
        let high = draw(60, 90) as u8;
        let low = high - draw(5, 15) as u8;
        let line = draw(10, 30) as f64;
        let (c, dir) = collector(&sim, |c| {
            c.gc.high_threshold_percent = high;
            c.gc.low_threshold_percent = low;
            c.gc.max_age = Duration::ZERO;
            c.eviction_imagefs_available = Some(crate::config::EvictionThreshold::Percent(line));
            c.kubernetes.enabled = true;
            c.kubernetes.room_before_pulls = true;
        });
        if sim.stats(Path::new("/sim")).unwrap().usage_percent() >= u64::from(high) {
            // Only nodes below high: what the pulls alone make due.
            continue;
        }
        // And a repository whose image imagegc removed an hour ago, of any
        // size: what the journal tells every process.
        let big = Removal {
            id: "big-1".into(),
            tags: vec!["registry.test/big:1".into()],
            digests: vec![],
            reason: Reason::Space,
            size: draw(50, 900) * MB,
            freed_bytes: None,
            first_seen: SystemTime::now() - Duration::from_secs(7200),
            last_used: SystemTime::now() - Duration::from_secs(7200),
            dry_run: false,
        };
        Journal::new(dir.path()).append(&crate::store::journal::JournalEntry::from_removal(
            &big,
            SystemTime::now() - Duration::from_secs(3600),
        ));
        let mut c = next_process(&c, *c.clock());
        cycle(&mut c).await;
        c.save().await;
        let before = sim.removed().len();
        let mut pods = pods_pulling((0..repositories as usize).filter(|_| draw(0, 1) == 1));
        if draw(0, 1) == 1 {
            pods.references
                .push(("registry.test/big:2".to_string(), "default/big".to_string()));
        }
        c.set_protections(pods.clone());
        // `plan`: a new process on the same state, the same pods.
        let mut plan = next_process(&c, *c.clock());
        plan.set_protections(pods);
        let listing = plan.observe().await.unwrap();
        let stats = sim.stats(Path::new("/sim")).unwrap();
        let (planned, pulls) = plan.cycle_plan(&listing, Some(&stats));
        let planned_due = planned.target().due(&stats);
        let in_force = planned.target().in_force(stats.capacity_bytes);
        let daemon_due = c.check_usage();
        if pulls.cannot_fit.is_empty() {
            assert_eq!(daemon_due, Some(planned_due), "seed {seed}: {pulls:?}");
            assert_eq!(c.inventory.in_force(), Some(in_force), "seed {seed}: {pulls:?}");
        } else {
            // Between cycles every pull counts: the check never misses a
            // pass `plan` says is due, and the cycle bounds the room.
            assert!(daemon_due == Some(true) || !planned_due, "seed {seed}: {pulls:?}");
        }
        let configured_due = stats.usage_percent() >= u64::from(high);
        let report = cycle(&mut c).await;
        if pulls.fit.iter().all(|p| p.bytes_on_disk(c.footprint()) == 0) && !configured_due {
            assert_eq!(
                sim.removed().len(),
                before,
                "seed {seed}: removed for pulls that cannot fit: {report:?}"
            );
        }
        if sim.removed().len() > before {
            assert!(planned_due, "seed {seed}: removed though plan said no pass was due");
            made_room += 1;
        }
        cannot_fit += usize::from(!pulls.cannot_fit.is_empty());
        nothing_due += usize::from(!planned_due);
    }
    // The draws reach every case.
    assert!(
        cannot_fit > 0 && made_room > 0 && nothing_due > 0,
        "{cannot_fit} {made_room} {nothing_due}"
    );
}
