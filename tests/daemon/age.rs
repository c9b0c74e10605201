//! The age guard: `gc.max_age` counts only time imagegc has watched or its history vouches for.

use std::time::{Instant, SystemTime};

use imagegc::store::state::StateStore;
use imagegc_testkit::fake::FakeRuntime;
use imagegc_testkit::{history, records};

use crate::support::{DiskEffects, InProcess, eventually, image, metric, roomy_disk, secs};

#[tokio::test]
async fn images_without_history_wait_for_max_age_while_old_history_goes_at_once() {
    let fake = FakeRuntime::new();
    let fresh = image("fresh", 1000);
    let old = image("old", 1000);
    fake.add_image(fresh.clone());
    fake.add_image(old.clone());
    let disk = roomy_disk();
    fake.on_remove(Some(disk.free_listed_size_on_remove()));
    let hour_ago = SystemTime::now() - secs(3600);
    let history = records([history(&old, hour_ago, hour_ago)]);

    let started = Instant::now();
    let daemon = InProcess::start(
        fake.clone(),
        disk,
        |state_dir| StateStore::new(state_dir).save(&history, SystemTime::now()).unwrap(),
        |c| c.gc.max_age = secs(3),
    )
    .await;

    // Unused for an hour by its history: removed by the first cycle.
    eventually(secs(3), "the image with old history removed", || {
        (!fake.removed().is_empty()).then_some(())
    })
    .await;
    assert_eq!(fake.removed(), [old.id.as_str()]);

    // Never seen before: imagegc cannot know how long it was unused, so it
    // waits until it has itself watched for longer than max age.
    tokio::time::sleep_until((started + secs(2)).into()).await;
    assert_eq!(fake.removed(), [old.id.as_str()], "fresh is kept for the first 3s");
    let removed_after = eventually(secs(8), "fresh removed by age", || {
        fake.removed().contains(&fresh.id).then(|| started.elapsed())
    })
    .await;
    assert!(removed_after > secs(3), "fresh was removed after {removed_after:?}");
    // Counted once the daemon has the runtime's answer.
    eventually(secs(5), "both removals counted with reason age", || {
        let metrics = daemon.metrics.encode();
        metric(&metrics, "image_garbage_collected_total{reason=\"age\"}")
            .is_some_and(|n| n == 2.0)
            .then_some(())
    })
    .await;
}
