//! Removals by others: an image someone else removed, counted once, never one imagegc asked for, never on a partial listing.

use super::settle::{a_removal_of_a_that_times_out, an_earlier_process_asked_to_remove};
use super::*;

#[tokio::test]
async fn one_not_found_for_an_image_that_is_there_is_no_removal_by_others() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100), image("b", 100)]);
        s.disk.set(1000, 0);
        s.status_not_found_once = vec!["a".to_string()];
    });
    let (mut c, dir) = collector(&sim, |_| {});
    cycle(&mut c).await;
    // The listing had it, the re-check was told it was gone: kept, not
    // counted, and its history stays.
    assert_eq!(sim.removed(), ["b"]);
    let first_seen = c.records().get("a").expect("its record stays").first_seen;
    none_removed_by_others(&c);
    // The next listings still list it: nothing was removed by anyone.
    assert!(c.poll_usage().await.is_ok());
    assert!(c.poll_usage().await.is_ok());
    none_removed_by_others(&c);
    assert_eq!(c.records().get("a").map(|r| r.first_seen), Some(first_seen));
    assert!(journaled(&dir).iter().all(|e| e.image != "a"));
}

/// A collector on a node that lists only `b`, and the note of a removal of
/// `a` that an earlier process asked for and sent before it was killed.
fn after_an_earlier_process_removed_a() -> (
    SimHandle,
    Collector<SimHandle>,
    tempfile::TempDir,
    crate::store::journal::JournalEntry,
) {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("b", 100)]);
        s.disk.set(1000, 900);
    });
    let (mut c, dir) = collector(&sim, |_| {});
    an_earlier_process_asked_to_remove(&mut c, &dir, "a");
    let note = c.remover.pending()[0].entry.clone();
    (sim, c, dir, note)
}

#[tokio::test]
async fn a_removal_journaled_just_before_a_kill_is_not_journaled_again_by_the_next_process() {
    // The process before noted the removal of `a`, the runtime made it,
    // the journal line was written, and the process was killed before
    // the note was forgotten (forgetting it is not synced).
    let (_sim, mut c, dir, note) = after_an_earlier_process_removed_a();
    let mut line = crate::store::journal::JournalEntry::from_removal(&removal_of(&note), c.clock.now());
    // An earlier removal of the same image, in the same second, journaled
    // whole: it is not this one.
    crate::store::journal::Journal::new(dir.path()).append(&line);
    line.asked = Some(note.time.clone());
    crate::store::journal::Journal::new(dir.path()).append(&line);
    cycle(&mut c).await;
    cycle(&mut c).await;
    let journal = journaled(&dir);
    assert_eq!(journal.iter().filter(|e| e.image == "a").count(), 2, "{journal:?}");
    assert_eq!(
        sample(&c, "image_garbage_collected_total{reason=\"space\"}").as_deref(),
        Some("0"),
        "counted by the process that made it, not again"
    );
    assert!(c.remover.pending().is_empty());
}

#[tokio::test]
async fn a_removal_killed_before_its_journal_line_is_journaled_though_one_of_the_same_image_was_that_second() {
    let (_sim, mut c, dir, note) = after_an_earlier_process_removed_a();
    // The removal of `a` before this one, journaled in the same second.
    let mut earlier = crate::store::journal::JournalEntry::from_removal(&removal_of(&note), c.clock.now());
    earlier.asked = Some("2026-01-01T00:00:00.000000001Z".to_string());
    crate::store::journal::Journal::new(dir.path()).append(&earlier);
    cycle(&mut c).await;
    let journal = journaled(&dir);
    assert_eq!(journal.iter().filter(|e| e.image == "a").count(), 2, "{journal:?}");
    assert_eq!(journal[1].note.as_deref(), Some("completed after shutdown"));
}

/// `imagegc_images_removed_by_others_total`, `..._bytes_total` and the
/// last one's time.
fn removed_by_others(c: &Collector<SimHandle>) -> (String, String, String) {
    let get = |name| sample(c, name).unwrap_or_default();
    (
        get("imagegc_images_removed_by_others_total"),
        get("imagegc_removed_by_others_bytes_total"),
        get("imagegc_last_removal_by_others_timestamp_seconds"),
    )
}

fn none_removed_by_others(c: &Collector<SimHandle>) {
    assert_eq!(
        removed_by_others(c),
        ("0".to_string(), "0".to_string(), "0.0".to_string()),
        "nothing removed by others"
    );
}

#[tokio::test]
async fn an_image_someone_else_removes_is_counted_once_with_its_last_known_size() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node
            .set_images(vec![image("a", 100), image("b", 250), image("c", 40)]);
        s.disk.set(1000, 900);
    });
    let (mut c, dir) = collector(&sim, |_| {});
    cycle(&mut c).await;
    none_removed_by_others(&c);
    // The kubelet's image GC removes `b` and `c` between two listings.
    sim.with(|s| s.node.retain_images(|i| i.id == "a"));
    assert!(c.poll_usage().await.is_ok());
    let at = c
        .clock
        .now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let (images, bytes, last) = removed_by_others(&c);
    assert_eq!((images.as_str(), bytes.as_str()), ("2", "290"));
    assert!((last.parse::<f64>().unwrap() - at).abs() < 5.0, "{last} vs {at}");
    assert!(c.records().get("b").is_none(), "its record goes with it");
    cycle(&mut c).await;
    assert!(c.poll_usage().await.is_ok());
    assert_eq!(removed_by_others(&c).0, "2", "counted once");
    assert!(journaled(&dir).is_empty(), "not imagegc's removals");
    assert_eq!(
        sample(&c, "image_garbage_collected_total{reason=\"space\"}").as_deref(),
        Some("0")
    );
}

#[tokio::test]
async fn an_image_a_partial_listing_omits_is_not_removed_by_others() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100), image("b", 100)]);
        s.disk.set(1000, 900);
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    cycle(&mut c).await;
    // Omitted, and ImageStatus cannot answer: unsure, not counted...
    sim.with(|s| {
        s.omit = vec!["a".to_string()];
        s.fail_image_status = true;
    });
    assert!(c.poll_usage().await.is_ok());
    none_removed_by_others(&c);
    // ...then ImageStatus finds it: it is there.
    sim.with(|s| s.fail_image_status = false);
    assert!(c.poll_usage().await.is_ok());
    sim.with(|s| s.omit.clear());
    cycle(&mut c).await;
    none_removed_by_others(&c);
    // A listing of nothing (a runtime restarting) tells nothing either.
    let images = sim.0.lock().unwrap().node.images().to_vec();
    sim.with(|s| s.node.retain_images(|_| false));
    // ImageStatus would say not found for every image now: the empty
    // listing must not ask.
    assert!(c.poll_usage().await.is_ok());
    sim.with(|s| s.node.set_images(images));
    assert!(c.poll_usage().await.is_ok());
    cycle(&mut c).await;
    none_removed_by_others(&c);
}

#[tokio::test]
async fn a_candidate_someone_else_removed_before_its_recheck_is_counted_once_a_listing_omits_it() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node
            .set_images(vec![image("a", 100), image("b", 100), image("used", 100)]);
        s.node.containers.push(crate::testing::container_naming("c", "used"));
        s.disk.occupy("a", 100);
        s.disk.occupy("b", 100);
        s.disk.set(1000, 50);
        // Listed by the cycle, gone by its re-check.
        s.vanish_at_list = Some((1, "a".to_string()));
    });
    let (mut c, dir) = collector(&sim, |_| {});
    cycle(&mut c).await;
    // One answer is not enough: counted once listings omit it too.
    none_removed_by_others(&c);
    assert!(c.poll_usage().await.is_ok());
    assert_eq!(removed_by_others(&c).0, "1");
    assert!(journaled(&dir).iter().all(|e| e.image != "a"));
    assert!(c.records().get("a").is_none(), "its record goes with it");
    // Not counted again.
    assert!(c.poll_usage().await.is_ok());
    cycle(&mut c).await;
    assert_eq!(removed_by_others(&c).0, "1");
}

#[tokio::test]
async fn removals_imagegc_asked_for_are_never_removed_by_others() {
    // Finished by the runtime after a listing still listed it.
    let (_sim, mut c, _dir) = a_removal_of_a_that_times_out(Some(2)).await;
    assert!(c.poll_usage().await.is_ok());
    assert!(c.poll_usage().await.is_ok());
    cycle(&mut c).await;
    none_removed_by_others(&c);
    // Finished as it was asked again (RemoveImage answers not found).
    let (sim, mut c, _dir) = a_removal_of_a_that_times_out(Some(1000)).await;
    sim.with(|s| s.hang_remove.clear());
    cycle(&mut c).await;
    assert!(c.poll_usage().await.is_ok());
    none_removed_by_others(&c);
    // Asked by a process killed during the call, gone by the next start.
    let (sim, mut c, dir) = a_removal_of_a_that_times_out(None).await;
    c.save().await;
    sim.with(|s| {
        s.node.retain_images(|i| i.id != "a");
        s.hang_remove.clear();
    });
    let mut next = next_process(&c, Clock::starting_at(SystemTime::now() - Duration::from_secs(3600)));
    drop(c);
    cycle(&mut next).await;
    cycle(&mut next).await;
    none_removed_by_others(&next);
    assert_eq!(journaled(&dir).iter().filter(|e| e.image == "a").count(), 1);
}

#[tokio::test]
async fn a_removal_journaled_before_a_kill_that_left_its_record_is_not_removed_by_others() {
    let sim = SimHandle::default();
    sim.with(|s| {
        s.node.set_images(vec![image("a", 100), image("b", 100)]);
        s.disk.set(1000, 900);
    });
    let (mut c, dir) = collector(&sim, |_| {});
    cycle(&mut c).await;
    // The process removed `a` and journaled it, and was killed before its
    // records were saved and before its note was: only the line is left.
    let record = c.records().get("a").unwrap().clone();
    let line = Removal {
        id: "a".into(),
        tags: vec![],
        digests: vec![],
        reason: Reason::Space,
        size: 100,
        freed_bytes: None,
        first_seen: record.first_seen,
        last_used: record.last_used,
        dry_run: false,
    };
    Journal::new(dir.path()).append(&crate::store::journal::JournalEntry::from_removal(&line, c.clock.now()));
    sim.with(|s| s.node.retain_images(|i| i.id != "a"));
    assert!(c.poll_usage().await.is_ok());
    none_removed_by_others(&c);
}

#[tokio::test]
async fn images_whose_status_cannot_be_read_do_not_keep_the_others_from_being_asked_about() {
    let sim = SimHandle::default();
    let many: Vec<String> = (0..40).map(|i| format!("u{i:02}")).collect();
    sim.with(|s| {
        s.node.set_images(
            many.iter()
                .map(|id| image(id, 10))
                .chain([image("x", 7), image("kept", 1)])
                .collect(),
        );
        s.disk.set(1000, 900);
    });
    let (mut c, _dir) = collector(&sim, |_| {});
    cycle(&mut c).await;
    // All go at once; the runtime cannot answer about 40 of them.
    sim.with(|s| {
        s.node.retain_images(|i| i.id == "kept");
        s.fail_image_status_of = many.clone();
    });
    // 41 to ask about, 16 at a time: `x` is asked by the third listing
    // whatever its place.
    for _ in 0..3 {
        assert!(c.poll_usage().await.is_ok());
    }
    assert_eq!(removed_by_others(&c).0, "1");
    assert_eq!(removed_by_others(&c).1, "7");
}
