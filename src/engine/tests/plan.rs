//! The plan and the cycle agree: `plan`'s forecast, layers shared and measured, keep rules at the plan and at the re-check, and `simulate` removing the same images.

use super::*;

/// Two images on one base and one of its own, where the runtime names
/// their layers: `plan` counts the base once, freed by the second image
/// on it, and so foresees the third removal the measured cycle needs; by
/// reported sizes it would have stopped after two. The measured removals
/// size the layers they freed, which the next estimate goes by.
#[tokio::test]
async fn a_shared_base_is_counted_once_by_the_forecast_and_sized_by_the_measured_removals() {
    let sim = SimHandle::default();
    sim.with(|s| {
        // Reported 100 each; on disk the base is 70, each own layer 30.
        s.unused("a", 100, 30);
        s.unused("b", 100, 100);
        s.unused("c", 100, 100);
        s.node.set_layers("a", vec![layer("base"), layer("a")]);
        s.node.set_layers("b", vec![layer("base"), layer("b")]);
        s.node.set_layers("c", vec![layer("c")]);
        // 150 to free.
        s.disk.set(1000, 50);
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    let listing = c.observe().await.unwrap();
    assert_eq!(c.layers().len(), 3, "each image's layers were asked for once");
    let (_, space, frees) = plan_forecast(&c, &listing, &sim);
    // The base (two thirds of 100, the smallest split) comes back with b.
    assert_eq!(space, ["a", "b", "c"]);
    assert_eq!(frees, [33, 100, 100]);
    let report = cycle(&mut c).await;
    let removed: Vec<&str> = report.removed.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(removed, space, "the measured cycle removed what the forecast said");
    let learned = |name: &str| c.layers().learned_of(&layer(name)).map(|l| l.bytes);
    assert_eq!(learned("a"), Some(30));
    // b freed the base with its own layer: 100 shared between the two.
    assert_eq!((learned("base"), learned("b")), (Some(50), Some(50)));
    assert_eq!(learned("c"), Some(100));
    let asks = sim.0.lock().unwrap().layer_asks;
    c.observe().await.unwrap();
    assert_eq!(sim.0.lock().unwrap().layer_asks, asks, "nothing new to ask about");
    // What the removals measured survives a restart (the state file).
    let next = next_process(&c, *c.clock());
    let restored = |name: &str| next.layers().learned_of(&layer(name)).map(|l| l.bytes);
    assert_eq!(
        (restored("a"), restored("base"), restored("c")),
        (Some(30), Some(50), Some(100))
    );
}

/// A runtime that names no image's layers is asked about the first few
/// images only, and never again: each image counts whole.
#[tokio::test]
async fn a_runtime_that_names_no_layers_is_not_asked_again() {
    let sim = SimHandle::default();
    sim.with(|s| {
        for n in 0..40 {
            s.unused(&format!("i{n}"), 10, 10);
        }
        s.disk.set(1000, 900);
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    c.observe().await.unwrap();
    let asked = sim.0.lock().unwrap().layer_asks;
    assert_eq!(asked, 16);
    sim.with(|s| s.unused("new", 10, 10));
    c.observe().await.unwrap();
    c.poll_usage().await.unwrap();
    assert_eq!(sim.0.lock().unwrap().layer_asks, asked);
    assert!(c.layers().is_empty());
}

/// What measured removals taught of the bytes on disk per reported byte
/// survives a restart: the next process (or `plan`) estimates by it from
/// its first listing.
#[tokio::test]
async fn the_footprint_measured_removals_raised_survives_a_restart() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.unused("x", 100, 300);
        s.unused("y", 100, 300);
        s.disk.set(1000, 50);
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    cycle(&mut c).await;
    assert_eq!(c.footprint().factor(), 3.0);
    let mut next = next_process(&c, *c.clock());
    assert_eq!(next.footprint().factor(), 1.0, "not before the runtime is named");
    next.observe().await.unwrap();
    assert_eq!(next.footprint().factor(), 3.0);
}

#[tokio::test]
async fn the_plans_forecast_is_what_a_dry_run_cycle_does() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![
            image("old", 100),
            image("a", 100),
            image("b", 100),
            image("c", 100),
        ]);
        s.disk.set(1000, 50);
    });
    let (mut c, _dir) = collector(&sim, |c| {
        c.gc.dry_run = true;
        c.gc.max_age = Duration::from_secs(60);
    });
    cycle(&mut c).await;
    let old = SystemTime::now() - Duration::from_secs(7200);
    let mut map = HashMap::new();
    for (id, at) in [
        ("old", old),
        ("a", old + Duration::from_secs(60)),
        ("b", SystemTime::now()),
        ("c", SystemTime::now()),
    ] {
        map.insert(
            id.to_string(),
            crate::records::Record {
                first_seen: old,
                last_used: at,
                size: 100,
                pinned: false,
                tags: Default::default(),
                digests: Default::default(),
                from_history: true,
                ever_used: true,
                usual_break: None,
            },
        );
    }
    let mut c = next_process_with_history(&c, Records::from_map(map));
    // What `plan` shows.
    let listing = c.observe().await.unwrap();
    let (age, space, _) = plan_forecast(&c, &listing, &sim);
    // 150 bytes to free: the age removals' 200 (old, a) already cover it.
    assert_eq!(age, ["old", "a"]);
    assert!(space.is_empty(), "{space:?}");
    // What a dry-run cycle does.
    let report = cycle(&mut c).await;
    let by = |reason| -> Vec<String> {
        report
            .removed
            .iter()
            .filter(|r| r.reason == reason)
            .map(|r| r.id.clone())
            .collect()
    };
    assert_eq!(by(Reason::Age), age);
    assert_eq!(by(Reason::Space), space, "the cycle walked as the forecast said");
}

#[tokio::test]
async fn an_image_a_pod_names_is_kept_by_the_plan_and_by_the_recheck() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node
            .set_images(vec![image("a", 100), image("b", 100), image("c", 100)]);
        s.disk.set(1000, 0);
        // b gains, between the listing and its removal, the name a pod
        // bound to the node runs.
        s.tag_at_list = Some((2, "b".to_string(), "docker.io/library/web:1".to_string()));
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    c.set_protections(crate::policy::Protections {
        references: vec![
            ("a".to_string(), "ns/starting".to_string()),
            ("web:1".to_string(), "ns/web".to_string()),
        ],
        ..Default::default()
    });
    let report = cycle(&mut c).await;
    assert_eq!(sim.removed(), ["c"], "a kept by the plan, b by the re-check");
    assert_eq!(report.removed.len(), 1);
    // Once the pods are gone, so is the protection.
    c.set_protections(crate::policy::Protections::default());
    sim.with(|s| s.disk.set_available(0));
    cycle(&mut c).await;
    assert_eq!(sim.removed()[..2], ["c", "a"]);
}

#[tokio::test]
async fn a_keep_rule_added_to_the_rules_holds_in_the_plan_and_at_the_recheck() {
    let sim = SimHandle::default();
    sim.with(|s| {
        let mut a = image("a", 100);
        a.repo_tags = vec!["docker.io/library/keep:1".to_string()].into();
        s.node.set_images(vec![a, image("b", 100), image("c", 100)]);
        s.disk.set(1000, 0);
        // b gains, between the listing and its removal, the name the rule
        // keeps.
        // (Listings of containers: `observe` below, the cycle's, then b's re-check.)
        s.tag_at_list = Some((3, "b".to_string(), "docker.io/library/keep:2".to_string()));
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    // A rule that exists only in `Rules`: nothing else knows of it.
    let mut settings = c.settings().clone();
    Arc::make_mut(&mut settings.policy).keep.test_rule =
        Some(|image| image.repo_tags.iter().any(|t| t.starts_with("docker.io/library/keep:")));
    c.set_settings(settings);
    let listing = c.observe().await.unwrap();
    let (planned, _) = c.cycle_plan(&listing, None);
    assert_eq!(
        planned.plan.kept.iter().find(|k| k.id == "a").map(|k| &k.why),
        Some(&crate::policy::KeepReason::Protected { pattern: "test rule" }),
        "the plan keeps a"
    );
    let report = cycle(&mut c).await;
    assert_eq!(sim.removed(), ["c"], "a kept by the plan, b by the re-check");
    assert_eq!(report.removed.len(), 1);
}

/// The ids of the images each event names: `GoneAlready` and `Kept`.
#[derive(Default)]
struct GoneOrKept(Mutex<(Vec<String>, Vec<String>)>);

impl crate::engine::Sink for GoneOrKept {
    fn emit(&self, event: &Event<'_>) {
        let mut seen = self.0.lock().unwrap();
        match event {
            Event::GoneAlready { id, .. } => seen.0.push(id.to_string()),
            Event::Kept { id, .. } => seen.1.push(id.to_string()),
            _ => {}
        }
    }
}

#[tokio::test]
async fn an_image_someone_else_removed_before_its_recheck_is_gone_already_not_kept_nor_counted() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100), image("b", 100)]);
        s.disk.set(1000, 0);
        // Removed by another collector between the listing and a's re-check.
        s.gone_at_list = Some((2, "a".to_string()));
    });
    let (c, _dir) = collector(&sim, |_| {});
    let seen = Arc::new(GoneOrKept::default());
    let mut c = c.with_sink(Arc::clone(&seen) as Arc<dyn crate::engine::Sink>);
    let report = cycle(&mut c).await;
    let (gone, kept) = std::mem::take(&mut *seen.0.lock().unwrap());
    assert_eq!(gone, ["a"]);
    assert!(kept.is_empty(), "{kept:?}");
    assert_eq!(sim.removed(), ["b"], "a was not this collector's to remove");
    assert_eq!(report.removed.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["b"]);
    // One answer: its record stays until a listing omits it too.
    assert!(c.records().get("a").is_some());
    assert!(c.poll_usage().await.is_ok());
    assert!(c.records().get("a").is_none(), "its record goes");
}

#[tokio::test]
async fn a_pod_bound_between_the_plan_and_a_removal_keeps_its_image() {
    let sim = SimHandle::default();
    let (sender, pods) = tokio::sync::watch::channel(Arc::new(crate::policy::Protections::default()));
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100), image("b", 100)]);
        s.disk.set(1000, 0);
        // The watch learns of a pod naming b after the cycle's listing,
        // before b's re-check.
        let pods = crate::policy::Protections {
            references: vec![("b".to_string(), "ns/late".to_string())],
            ..Default::default()
        };
        s.pods_at_list = Some((2, sender, pods));
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    c.protections_from(pods);
    let report = cycle(&mut c).await;
    assert_eq!(sim.removed(), ["a"], "b was kept at its re-check");
    assert_eq!(report.removed.len(), 1);
}

/// `b` with a second tag, `registry.test/b:2`, that its `ImageStatus`
/// no longer gives (one entry of an id listed twice, or a tag moved since
/// the listing); `a` beside it. Both unused at the listing.
fn an_image_whose_status_drops_a_name(sim: &SimHandle) {
    let mut b = image("b", 100);
    b.repo_tags = vec![
        "docker.io/library/b:latest".to_string(),
        "registry.test/b:2".to_string(),
    ]
    .into();
    b.repo_digests = vec![format!("registry.test/b@sha256:{}", "b".repeat(64))].into();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100), b]);
        s.disk.set(1000, 0);
        s.status_fewer_names = vec!["b".to_string()];
    });
}

#[tokio::test]
async fn a_container_naming_its_image_by_a_name_the_recheck_does_not_give_keeps_it() {
    // By the tag alone, and by the repository digest alone with no image
    // id (CRI-O's way), each created after the listing, before b's
    // re-check.
    for (by, reference) in [
        ("tag", "registry.test/b:2".to_string()),
        ("digest", format!("registry.test/b@sha256:{}", "b".repeat(64))),
    ] {
        let sim = SimHandle::default();
        an_image_whose_status_drops_a_name(&sim);
        sim.with(|s| {
            s.appear_at_list = Some((
                2,
                crate::model::Container {
                    id: "late".to_string(),
                    image: "registry.test/b:2".to_string(),
                    image_ref: reference,
                    state: Some(crate::model::ContainerState::Running),
                    ..Default::default()
                },
            ));
        });
        let (mut c, _dir) = collector(&sim, |_| {});
        let report = cycle(&mut c).await;
        assert_eq!(sim.removed(), ["a"], "b is kept when named by its {by}");
        assert_eq!(report.became_in_use, ["b"]);
    }
}

#[tokio::test]
async fn a_pod_naming_its_image_by_a_name_the_recheck_does_not_give_keeps_it() {
    let sim = SimHandle::default();
    an_image_whose_status_drops_a_name(&sim);
    let (sender, pods) = tokio::sync::watch::channel(Arc::new(crate::policy::Protections::default()));
    sim.with(|s| {
        let pods = crate::policy::Protections {
            references: vec![("registry.test/b:2".to_string(), "ns/late".to_string())],
            ..Default::default()
        };
        s.pods_at_list = Some((2, sender, pods));
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    c.protections_from(pods);
    cycle(&mut c).await;
    assert_eq!(sim.removed(), ["a"], "b was kept at its re-check");
}

/// The daemon's cycle, `imagegc plan`'s forecast and `imagegc simulate`'s
/// replay run one script (`policy::CyclePlan`): on one node they remove the
/// same images in the same order. The node: five images of 100 MB, four
/// of them used last 100 s apart and one running, then an image of 400 MB
/// pulled and run, which takes usage from 50% to 90%; high 80, low 65.
#[tokio::test]
async fn the_daemon_plan_and_simulate_remove_the_same_images_in_the_same_order() {
    const MB: u64 = 1_000_000;
    let sizes = [100 * MB, 100 * MB, 100 * MB, 100 * MB, 100 * MB, 400 * MB];
    let stops = [Some(100), Some(200), Some(300), Some(400), None];
    let pull_at = 10_000;
    let configure = |c: &mut Config| {
        c.gc.high_threshold_percent = 80;
        c.gc.low_threshold_percent = 65;
        c.gc.min_age = Duration::from_secs(60);
        // The kubelet's default line: the 400 MB pull's headroom lowers the
        // thresholds to 60/45 in all three, and the daemon's pass hurries.
        c.eviction_imagefs_available = Some(crate::config::EvictionThreshold::Percent(15.0));
        c.gc.headroom = true;
    };
    let mut config = Config::default();
    configure(&mut config);
    // `simulate`: the replay. Its cycle that removes comes one usage check
    // after the pull, which crosses high.
    let simulated = crate::sim::replay::tests::removals_after_a_pull(&sizes, &stops, (5, pull_at), 1000 * MB, &config);
    let simulated: Vec<String> = simulated.iter().map(u32::to_string).collect();
    let at = pull_at + crate::policy::cycle::USAGE_CHECK_INTERVAL.as_secs();

    // The same node for the daemon, as the runtime lists it at that cycle.
    let sim = SimHandle::default();
    sim.with(|s| {
        for (i, &size) in sizes.iter().enumerate() {
            s.unused(&i.to_string(), size, size);
        }
        s.node.containers = vec![
            crate::testing::container_naming("c4", "4"),
            crate::testing::container_naming("c5", "5"),
        ];
        s.disk.set(1000 * MB, 100 * MB);
    });
    let (c, _dir) = collector(&sim, configure);
    let now = SystemTime::now();
    let ago = |secs: u64| now - Duration::from_secs(secs);
    let history = sizes.iter().enumerate().map(|(i, &size)| {
        let (first_seen, last_used) = match stops.get(i) {
            Some(Some(stop)) => (ago(at), ago(at - stop)),
            Some(None) => (ago(at), now),
            None => (ago(at - pull_at), now),
        };
        crate::testing::history(&image(&i.to_string(), size), first_seen, last_used)
    });
    let map: HashMap<_, _> = history.collect();
    let mut c = next_process_with_history(&c, Records::from_map(map));
    // `plan`: the cycle's plan, its space pass by the estimate.
    let listing = c.observe().await.unwrap();
    // (a space pass is due at 90 %)
    let (_, planned, _) = plan_forecast(&c, &listing, &sim);
    // The daemon's cycle, removing.
    let report = cycle(&mut c).await;
    // Low 45 % (the headroom's): every unused image, one short of it.
    assert_eq!(sim.removed(), ["0", "1", "2", "3"], "{report:?}");
    assert!(report.hurried, "90 % is past the line");
    assert_eq!(planned, sim.removed(), "plan's forecast");
    assert_eq!(simulated, sim.removed(), "simulate's replay");
}
