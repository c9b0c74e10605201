//! One removal's lifecycle in a cycle: the age pass, the pending note beside each call, the re-check ahead and again before the call, a runtime that keeps what it said it removed, dry runs, cancellation, re-pulls.

use super::*;

#[tokio::test(start_paused = true)]
async fn the_age_pass_waits_no_look_of_its_own_but_the_last() {
    let took = ten_removals(|sim| old_images(sim, 10)).await;
    let (delay, look) = (SETTLE_CONFIRM, SETTLE_CONFIRM);
    // The listing, each re-check, one look.
    assert!(took <= delay * 11 + look, "{took:?}");
}

/// The phase each removal of the pending file `held` has.
fn phases(held: &str) -> Vec<(String, String)> {
    let file: serde_json::Value = serde_json::from_str(held).unwrap_or_default();
    file["removals"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
            (text(&r["entry"]["image"]), text(&r["phase"]))
        })
        .collect()
}

#[tokio::test]
async fn in_the_age_pass_each_note_is_written_beside_the_call_before_and_on_disk_at_its_own_call() {
    let sim = SimHandle::default();
    let (mut c, dir) = collector_with_old_images(&sim, 4);
    let file = dir.path().join(crate::store::pending::FILE_NAME);
    sim.with(|s| s.read_at_remove = Some(file.clone()));
    let report = cycle(&mut c).await;
    assert_eq!(report.outcome, Outcome::Success);
    assert_eq!(sim.removed(), ["old00", "old01", "old02", "old03"]);
    let found = sim.0.lock().unwrap().read_at_remove_found.clone();
    assert_eq!(found.len(), 4);
    for (id, held) in &found {
        // A process killed during this call leaves the note that claims
        // it: written (and synced) before the call, marked sent before it.
        assert!(
            phases(held).contains(&(id.clone(), "requested".to_string())),
            "{id}: {held}"
        );
        // Nothing else is claimed: an earlier removal is journaled before
        // this call, and a later one is at most noted, not sent.
        for (other, phase) in phases(held).iter().filter(|(other, _)| other != id) {
            assert!(
                phase == "checking" || journaled(&dir).iter().any(|e| &e.image == other),
                "{id}: {other} {phase}"
            );
        }
    }
    let journal = journaled(&dir);
    let ids: Vec<&str> = journal.iter().map(|e| e.image.as_str()).collect();
    assert_eq!(ids, ["old00", "old01", "old02", "old03"]);
    assert!(journal.iter().all(|e| e.asked.is_some()), "{journal:?}");
    // Done: nothing pending, in memory or on disk.
    assert!(c.remover.pending().is_empty());
    assert!(!file.exists());
}

#[tokio::test]
async fn in_the_age_pass_a_removal_the_runtime_keeps_is_not_believed_and_the_pass_goes_on() {
    let sim = SimHandle::default();
    let (mut c, dir) = collector_with_old_images(&sim, 3);
    // The first two answer OK and stay: each is asked about beside the
    // next re-check (the second) or its own look (the last would be).
    sim.with(|s| {
        s.keeps_on_remove("old00");
        s.keeps_on_remove("old01");
    });
    let report = cycle(&mut c).await;
    let failed: Vec<&str> = report.failed.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(failed, ["old00", "old01"], "{report:?}");
    assert!(report.failed.iter().all(|(_, why)| why.contains("still listed")));
    let removed: Vec<&str> = report.removed.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(removed, ["old02"]);
    let journal = journaled(&dir);
    assert_eq!(journal.len(), 1, "{journal:?}");
    assert_eq!(journal[0].image, "old02");
    assert_eq!(
        sample(&c, "image_garbage_collected_total{reason=\"age\"}").as_deref(),
        Some("1")
    );
    assert!(c.remover.pending().is_empty(), "{:?}", c.remover.pending());
    assert!(!dir.path().join(crate::store::pending::FILE_NAME).exists());
}

#[tokio::test]
async fn the_last_age_removal_the_runtime_keeps_is_not_believed_either() {
    let sim = SimHandle::default();
    let (mut c, dir) = collector_with_old_images(&sim, 2);
    sim.with(|s| s.keeps_on_remove("old01"));
    let report = cycle(&mut c).await;
    let failed: Vec<&str> = report.failed.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(failed, ["old01"], "{report:?}");
    assert_eq!(journaled(&dir).len(), 1);
    assert!(c.remover.pending().is_empty());
}

#[tokio::test]
async fn a_removal_of_unknown_outcome_ends_the_age_pass_and_the_note_written_beside_it_goes() {
    let sim = SimHandle::default();
    let records = old_images(&sim, 3);
    let (mut c, dir) = collector_with_history(
        &sim,
        |c| {
            c.gc.max_age = Duration::from_secs(3600);
            c.runtime.timeout = Duration::from_millis(50);
        },
        records,
    );
    sim.with(|s| s.hang_remove = vec!["old00".to_string()]);
    let report = cycle(&mut c).await;
    assert_eq!(report.unsettled, ["old00"]);
    assert!(sim.removed().is_empty());
    // `old01`'s note, written beside the call, named a call never sent.
    let pending: Vec<(&str, crate::store::pending::Phase)> = c
        .remover
        .pending()
        .iter()
        .map(|p| (p.entry.image.as_str(), p.phase))
        .collect();
    assert_eq!(pending, [("old00", crate::store::pending::Phase::Unknown)]);
    let held = std::fs::read_to_string(dir.path().join(crate::store::pending::FILE_NAME)).unwrap();
    assert_eq!(phases(&held), [("old00".to_string(), "unknown".to_string())]);
}

#[tokio::test(start_paused = true)]
async fn the_age_pass_counts_in_full_what_comes_back_after_the_first_reading() {
    let sim = SimHandle::default();
    let (mut c, dir) = collector_with_old_images(&sim, 3);
    // 10 at once, 30 more a moment later.
    sim.with(|s| {
        s.disk.frees_late("old00", 30);
    });
    let report = cycle(&mut c).await;
    assert_eq!(sim.removed(), ["old00", "old01", "old02"]);
    let freed: Vec<Option<u64>> = report.removed.iter().map(|r| r.freed_bytes).collect();
    assert_eq!(freed, [Some(40), Some(10), Some(10)]);
    let journaled: Vec<Option<u64>> = journaled(&dir).iter().map(|e| e.freed_bytes).collect();
    assert_eq!(journaled, freed);
}

/// The cycle's removals when something else writes to the image
/// filesystem all the while and a container is created on `victim` right
/// after its re-check made ahead (the `n`-th ListContainers) answered.
async fn container_created_after_the_recheck_ahead(node: impl FnOnce(&SimHandle) -> Records) -> Vec<String> {
    let sim = SimHandle::default();
    let records = node(&sim);
    let (mut c, _dir) = collector_with_history(&sim, |c| c.gc.max_age = Duration::from_secs(3600), records);
    // The listing is the first ListContainers, the first candidate's
    // re-check the second, the second candidate's re-check ahead the third.
    sim.with(|s| {
        s.disk.writer(1);
        s.appear_after_list = Some((3, crate::testing::container_naming("new", "old01")));
    });
    cycle(&mut c).await;
    sim.removed()
}

/// A re-check whose listing shows a container not seen before asks its
/// `ContainerStatus` (its image volumes), which takes a second here: a
/// container created on the candidate right after that listing answered
/// is in the listing made after those calls, and the candidate is kept.
#[tokio::test(start_paused = true)]
async fn a_container_created_while_a_recheck_asks_about_new_containers_keeps_its_image() {
    let sim = SimHandle::default();
    let records = old_images(&sim, 2);
    let (mut c, _dir) = collector_with_history(&sim, |c| c.gc.max_age = Duration::from_secs(3600), records);
    // The listing is the first ListContainers, old00's re-check the second:
    // it shows `busy` for the first time, and `new` is created on old00
    // right after it answered.
    sim.with(|s| {
        s.mounts_delay = Duration::from_secs(1);
        s.appear_at_list = Some((2, crate::testing::container_naming("busy", "elsewhere")));
        s.appear_after_list = Some((2, crate::testing::container_naming("new", "old00")));
    });
    cycle(&mut c).await;
    assert_eq!(sim.removed(), ["old01"], "old00 is in use by `new`");
}

#[tokio::test(start_paused = true)]
async fn the_age_pass_never_removes_on_a_recheck_gone_stale_while_another_writer_moves_free_space() {
    let removed = container_created_after_the_recheck_ahead(|sim| old_images(sim, 2)).await;
    // The confirming look watched a second of moving free space: the
    // re-check of old01 made beside it went stale, and the one made again
    // right before the call sees the new container.
    assert_eq!(removed, ["old00"]);
}

#[tokio::test(start_paused = true)]
async fn the_space_walk_never_removes_on_a_recheck_gone_stale_while_another_writer_moves_free_space() {
    let removed = container_created_after_the_recheck_ahead(|sim| {
        sim.with(|s| {
            for i in 0..3 {
                s.unused(&format!("old{i:02}"), 200, 100);
            }
            // Low (80 %) is 200 available: two removals.
            s.disk.set(1000, 0);
        });
        Records::new()
    })
    .await;
    assert_eq!(removed, ["old00", "old02"]);
}

#[tokio::test(start_paused = true)]
async fn a_recheck_ahead_that_takes_too_long_is_made_again_before_the_removal() {
    let sim = SimHandle::default();
    // Slower than the limit on a re-check made ahead of time.
    sim.with(|s| s.list_delay = Duration::from_secs(1));
    let (mut c, _dir) = collector_with_old_images(&sim, 2);
    let report = cycle(&mut c).await;
    assert_eq!(sim.removed(), ["old00", "old01"]);
    assert_eq!(report.outcome, Outcome::Success);
    // The listing, old00's re-check, old01's ahead (dropped, unanswered),
    // old01's made again.
    assert_eq!(sim.0.lock().unwrap().lists, 3);
    assert_eq!(journaled(&_dir).len(), 2);
}

#[tokio::test]
async fn an_image_that_comes_into_use_before_removal_is_kept() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100), image("b", 100)]);
        s.disk.occupy("a", 100);
        s.disk.occupy("b", 100);
        s.disk.set(1000, 0);
        // Cycle lists once, then re-checks before each removal: the
        // container appears right before "a" would go.
        s.appear_at_list = Some((2, crate::testing::container_naming("late", "a")));
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    let report = cycle(&mut c).await;
    assert_eq!(report.became_in_use, ["a"]);
    assert_eq!(sim.removed(), ["b"]);
}

#[tokio::test]
async fn nothing_is_removed_while_status_never_answered() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("pause", 100)]);
        s.disk.occupy("pause", 100);
        s.disk.set(1000, 0);
        s.fail_status = true;
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    let report = cycle(&mut c).await;
    assert!(
        matches!(report.outcome, Outcome::Failed(ref e) if e.to_string().contains("sandbox image")),
        "{:?}",
        report.outcome
    );
    assert!(sim.removed().is_empty());
    // Once Status answered (here: without a sandbox image), cycles run.
    sim.with(|s| s.fail_status = false);
    cycle(&mut c).await;
    assert_eq!(sim.removed(), ["pause"]);
}

#[tokio::test]
async fn a_failed_removal_is_counted_and_the_walk_goes_on() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100), image("b", 300)]);
        s.disk.occupy("a", 100);
        s.disk.occupy("b", 300);
        s.disk.set(1000, 0);
        s.fail_remove = vec!["a".into()];
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    let report = cycle(&mut c).await;
    assert_eq!(report.failed.len(), 1);
    assert!(report.failed[0].1.contains("RemoveImage"));
    assert_eq!(sim.removed(), ["b"]);
    assert!(
        c.records().get("a").is_some(),
        "the record of the image not removed stays"
    );
    assert!(c.metrics().encode().contains("imagegc_removal_failures_total 1"));
}

#[tokio::test]
async fn dry_run_removes_nothing_and_estimates_by_size() {
    let sim = SimHandle::default();
    sim.with(|s| {
        for id in ["a", "b", "c"] {
            s.unused(id, 100, 100);
        }
        s.disk.set(1000, 50);
    });
    let (mut c, dir) = collector(&sim, |c| c.gc.dry_run = true);
    let report = cycle(&mut c).await;
    assert!(sim.removed().is_empty());
    // 150 to free at 100 bytes each: two would go.
    assert_eq!(report.removed.len(), 2);
    assert!(report.removed.iter().all(|r| r.dry_run && r.freed_bytes.is_none()));
    let journal = Journal::new(dir.path()).read(None).unwrap();
    assert_eq!(journal.len(), 2);
    assert!(journal.iter().all(|e| e.dry_run));
    assert!(
        c.metrics()
            .encode()
            .contains("image_garbage_collected_total{reason=\"space\"} 0")
    );
}

#[tokio::test]
async fn cancellation_stops_between_removals_and_saves_state() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100)]);
        s.disk.set(1000, 0);
    });
    let (mut c, dir) = collector(&sim, |_| {});
    let cancel = CancellationToken::new();
    cancel.cancel();
    let report = c.cycle(&cancel).await;
    assert_eq!(report.outcome, Outcome::Interrupted);
    assert!(sim.removed().is_empty());
    assert!(dir.path().join(crate::store::state::FILE_NAME).exists());
}

#[tokio::test]
async fn an_image_pulled_again_soon_after_removal_counts_as_a_repull() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100), image("b", 100)]);
        s.disk.occupy("a", 200);
        s.disk.set(1000, 50);
    });
    let (mut c, dir) = collector(&sim, |_| {});
    cycle(&mut c).await;
    assert_eq!(sim.removed(), ["a"]);
    // A newer image under the same tag is not the removed one.
    let mut newer = image("a", 100);
    newer.id = "a2".to_string();
    sim.with(|s| {
        s.node.add_image(newer);
        s.disk.set_available(900);
    });
    cycle(&mut c).await;
    assert!(c.metrics().encode().contains("imagegc_repulled_after_removal_total 0"));
    // The removed image itself comes back.
    sim.with(|s| s.node.add_image(image("a", 100)));
    cycle(&mut c).await;
    assert!(c.metrics().encode().contains("imagegc_repulled_after_removal_total 1"));
    // Counted once, and remembered across a restart through the journal.
    cycle(&mut c).await;
    assert!(c.metrics().encode().contains("imagegc_repulled_after_removal_total 1"));
    let restarted = next_process(&c, *c.clock());
    let now = restarted.clock().now();
    let window = restarted.settings().thrash_window;
    assert!(
        restarted
            .remover
            .removed_recently(now, window, "a", &Default::default())
    );
    drop(dir);
}

#[tokio::test]
async fn age_pass_runs_before_space_and_counts_by_reason() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("old", 100)]);
        s.disk.occupy("old", 100);
        s.disk.set(1000, 900);
    });
    let (mut c, _dir) = collector(&sim, |c| c.gc.max_age = Duration::from_secs(60));
    // First seen now: not old yet.
    assert!(cycle(&mut c).await.removed.is_empty());
    // Pretend an hour passed by loading a record with an old last use.
    let mut map = HashMap::new();
    let old = SystemTime::now() - Duration::from_secs(7200);
    map.insert(
        "old".to_string(),
        crate::records::Record {
            first_seen: old,
            last_used: old,
            size: 100,
            pinned: false,
            tags: Default::default(),
            digests: Default::default(),
            from_history: true,
            ever_used: false,
            usual_break: None,
        },
    );
    let mut c = next_process_with_history(&c, Records::from_map(map));
    let report = cycle(&mut c).await;
    assert_eq!(sim.removed(), ["old"]);
    assert_eq!(report.removed[0].reason, Reason::Age);
    assert!(
        c.metrics()
            .encode()
            .contains("image_garbage_collected_total{reason=\"age\"} 1")
    );
}
