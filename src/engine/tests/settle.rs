//! Removals of unknown outcome: timed out, killed, listed again, journaled once, settled only on a full listing.

use super::*;

#[tokio::test]
async fn a_removal_that_timed_out_then_a_kill_then_gone_is_journaled_and_counted_once() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100)]);
        s.disk.occupy("a", 100);
        s.disk.set(1000, 50);
        s.hang_remove = vec!["a".to_string()];
    });
    let (mut c, dir) = collector(&sim, |c| c.runtime.timeout = Duration::from_millis(50));
    let report = cycle(&mut c).await;
    assert_eq!(report.unsettled, ["a"]);
    assert!(journaled(&dir).is_empty(), "not known to have happened yet");
    // SIGKILL: the process ends with nothing saved or cleaned up.
    let mut next = next_process(&c, Clock::starting_at(SystemTime::now() - Duration::from_secs(3600)));
    drop(c);
    // The runtime finished the removal meanwhile.
    sim.with(|s| {
        s.node.set_images(vec![image("b", 100)]);
        s.disk.set_available(900);
    });
    cycle(&mut next).await;
    cycle(&mut next).await;
    let entries = journaled(&dir);
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].image, "a");
    assert_eq!(entries[0].note.as_deref(), Some("completed after shutdown"));
    assert!(
        next.metrics()
            .encode()
            .contains("image_garbage_collected_total{reason=\"space\"} 1"),
        "counted once by the process that learnt of it"
    );
    assert!(!dir.path().join(crate::store::pending::FILE_NAME).exists());
}

#[tokio::test]
async fn a_removal_that_timed_out_and_went_is_journaled_by_the_same_process() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100), image("b", 100)]);
        s.disk.set(1000, 50);
        s.hang_remove = vec!["a".to_string()];
    });
    let (mut c, dir) = collector(&sim, |c| c.runtime.timeout = Duration::from_millis(50));
    assert_eq!(cycle(&mut c).await.unsettled, ["a"]);
    sim.with(|s| {
        s.node.retain_images(|i| i.id != "a");
        s.disk.set_available(900);
    });
    assert!(c.poll_usage().await.is_ok());
    let entries = journaled(&dir);
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].note.as_deref(), Some("completed after RemoveImage failed"));
    cycle(&mut c).await;
    assert_eq!(journaled(&dir).len(), 1, "journaled once");
}

/// An earlier process asked for the removal of `id` and was killed during
/// the call: its pending note is all that is left of it.
pub(super) fn an_earlier_process_asked_to_remove(c: &mut Collector<SimHandle>, dir: &tempfile::TempDir, id: &str) {
    // Its note, then this process starting from it.
    let removal = Removal {
        id: id.to_string(),
        tags: vec![],
        digests: vec![],
        reason: Reason::Space,
        size: 100,
        freed_bytes: None,
        first_seen: SystemTime::UNIX_EPOCH,
        last_used: SystemTime::UNIX_EPOCH,
        dry_run: false,
    };
    crate::store::pending::Pending::load(dir.path()).request(crate::store::journal::JournalEntry::from_removal(
        &removal,
        c.clock.now(),
    ));
    // Re-checked, and RemoveImage sent.
    let mut noted = crate::store::pending::Pending::load(dir.path());
    noted.sending(id);
    *c = next_process(c, *c.clock());
}

#[tokio::test]
async fn an_empty_listing_never_settles_a_pending_removal_as_gone() {
    let sim = SimHandle::default();
    sim.with(|s| s.disk.set(1000, 900));
    let (mut c, dir) = collector(&sim, |_| {});
    an_earlier_process_asked_to_remove(&mut c, &dir, "a");
    // The runtime is restarting: it lists nothing.
    cycle(&mut c).await;
    assert!(journaled(&dir).is_empty(), "no false \"completed after shutdown\"");
    // Back, and the image is still there: the removal has not happened,
    // and may yet, as long as the runtime may still be working on it.
    sim.with(|s| s.node.set_images(vec![image("a", 100)]));
    cycle(&mut c).await;
    assert!(journaled(&dir).is_empty());
    assert!(dir.path().join(crate::store::pending::FILE_NAME).exists());
    // Still there an hour later (the process after): it did not happen.
    c = next_process(
        &c,
        Clock::starting_at(c.clock().now() + crate::store::pending::PENDING_LIMIT),
    );
    cycle(&mut c).await;
    assert!(journaled(&dir).is_empty());
    assert!(!dir.path().join(crate::store::pending::FILE_NAME).exists());
    // Gone later: someone else's doing, not claimed.
    sim.with(|s| s.node.set_images(vec![image("b", 100)]));
    cycle(&mut c).await;
    assert!(journaled(&dir).is_empty());
}

#[tokio::test]
async fn a_partial_listing_never_settles_a_removal_the_runtime_did_not_make_as_done() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100), image("b", 100)]);
        s.disk.set(1000, 900);
    });
    let (mut c, dir) = collector(&sim, |_| {});
    cycle(&mut c).await;
    // Killed during a RemoveImage of `a` that the runtime never carried
    // out; the next process starts.
    an_earlier_process_asked_to_remove(&mut c, &dir, "a");
    // The runtime lists only part of its images, and cannot say yet
    // whether it has `a`...
    sim.with(|s| {
        s.omit = vec!["a".to_string()];
        s.fail_image_status = true;
    });
    assert!(c.poll_usage().await.is_ok());
    // ...then says it has.
    sim.with(|s| s.fail_image_status = false);
    assert!(c.poll_usage().await.is_ok());
    // Whole listings again.
    sim.with(|s| s.omit.clear());
    cycle(&mut c).await;
    cycle(&mut c).await;
    assert!(journaled(&dir).is_empty(), "{:?}", journaled(&dir));
    assert_eq!(
        sample(&c, "image_garbage_collected_total{reason=\"space\"}").as_deref(),
        Some("0")
    );
    assert_eq!(
        sample(&c, "imagegc_repulled_after_removal_total").as_deref(),
        Some("0"),
        "no re-pull of an image that never left"
    );
    assert!(c.records().get("a").is_some(), "its history is kept");
    assert!(sim.removed().is_empty());
}

/// A cycle over a full disk whose `RemoveImage` of the unused `a` times out
/// with `a` still listed (its outcome unknown); the runtime finishes it
/// after `finish_after_lists` listings, if ever (or when asked again).
pub(super) async fn a_removal_of_a_that_times_out(
    finish_after_lists: Option<usize>,
) -> (SimHandle, Collector<SimHandle>, tempfile::TempDir) {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node
            .set_images(vec![image("a", 100), image("b", 100), image("app", 100)]);
        s.node.containers = vec![crate::testing::container_naming("c", "app")];
        s.disk.occupy("a", 100);
        s.disk.set(1000, 50);
        s.hang_remove = vec!["a".to_string()];
        if let Some(lists) = finish_after_lists {
            s.finish_after_lists.insert("a".into(), lists);
        }
    });
    let (mut c, dir) = collector(&sim, |c| c.runtime.timeout = Duration::from_millis(50));
    assert_eq!(cycle(&mut c).await.unsettled, ["a"]);
    (sim, c, dir)
}

#[tokio::test]
async fn a_removal_the_runtime_finishes_after_a_listing_still_lists_it_is_journaled_and_counted_once() {
    let (sim, mut c, dir) = a_removal_of_a_that_times_out(Some(2)).await;
    // The runtime is still at it at the next listing...
    assert!(c.poll_usage().await.is_ok());
    assert!(sim.removed().is_empty());
    assert!(journaled(&dir).is_empty());
    // ...and done by the one after.
    assert!(c.poll_usage().await.is_ok());
    assert_eq!(sim.removed(), ["a"]);
    let entries = journaled(&dir);
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].image, "a");
    assert_eq!(entries[0].note.as_deref(), Some("completed after RemoveImage failed"));
    assert_eq!(
        sample(&c, "image_garbage_collected_total{reason=\"space\"}").as_deref(),
        Some("1")
    );
    assert!(!dir.path().join(crate::store::pending::FILE_NAME).exists());
    // Pulled again soon after: seen as a re-pull.
    sim.with(|s| s.node.add_image(image("a", 100)));
    assert!(c.poll_usage().await.is_ok());
    assert_eq!(sample(&c, "imagegc_repulled_after_removal_total").as_deref(), Some("1"));
    cycle(&mut c).await;
    assert_eq!(journaled(&dir).len(), 1, "journaled once");
}

#[tokio::test]
async fn an_image_removed_again_while_an_earlier_removal_is_unknown_is_journaled_once_per_removal() {
    let (sim, mut c, dir) = a_removal_of_a_that_times_out(None).await;
    assert!(c.poll_usage().await.is_ok());
    // The runtime answers again; the next cycle removes `a`: one removal,
    // one journal line, whichever call did it.
    sim.with(|s| s.hang_remove.clear());
    cycle(&mut c).await;
    assert_eq!(sim.removed()[0], "a");
    assert!(c.poll_usage().await.is_ok());
    cycle(&mut c).await;
    let entries = journaled(&dir);
    assert_eq!(entries.iter().filter(|e| e.image == "a").count(), 1, "{entries:?}");
    assert_eq!(entries[0].note, None);
    assert!(!dir.path().join(crate::store::pending::FILE_NAME).exists());
}

#[tokio::test]
async fn an_earlier_removal_that_finishes_as_it_is_asked_again_is_journaled_once() {
    // Not finished by any listing: only as it is asked again.
    let (sim, mut c, dir) = a_removal_of_a_that_times_out(Some(1000)).await;
    // The next cycle asks again; the runtime finishes the first call and
    // answers the second that the image is not there.
    sim.with(|s| s.hang_remove.clear());
    cycle(&mut c).await;
    assert_eq!(sim.removed()[0], "a");
    assert!(c.poll_usage().await.is_ok());
    cycle(&mut c).await;
    let entries = journaled(&dir);
    let of_a: Vec<_> = entries.iter().filter(|e| e.image == "a").collect();
    assert_eq!(of_a.len(), 1, "{entries:?}");
    assert_eq!(of_a[0].note.as_deref(), Some("completed after RemoveImage failed"));
    assert!(
        c.metrics().encode().contains(&format!(
            "image_garbage_collected_total{{reason=\"space\"}} {}",
            entries.len()
        )),
        "each removal journaled is counted"
    );
}
