//! Space passes between scheduled cycles: started by usage crossing high,
//! and run again when images held back by `gc.min_age` may go.

use std::time::Instant;

use imagegc_testkit::fake::FakeRuntime;

use crate::support::{DiskEffects, InProcess, SimDisk, cycles_done, eventually, first_cycle_done, image, metric, secs};

/// Usage that crosses the high threshold between cycles starts a space
/// pass within seconds: the kubelet's eviction manager looks every 10 s,
/// and a pull that fills the disk must not wait for the next interval.
#[tokio::test]
async fn usage_crossing_high_between_cycles_starts_a_space_pass_within_seconds() {
    let old = image("old", 100);
    let (fake, disk, mut daemon) =
        images_on_a_1000_byte_disk(&[&old], 850, |c| c.gc.usage_poll_interval = secs(30)).await;
    assert!(fake.removed().is_empty(), "15 % used: nothing to free");
    assert_eq!(metric(&daemon.metrics.encode(), "imagegc_space_pass_due"), Some(0.0));

    // Something else fills the disk to 90 %: the next measurement, not the
    // next interval, starts the cycle.
    disk.set_available(100);
    let crossed = Instant::now();
    eventually(secs(10), "the old image removed for space", || {
        (!fake.removed().is_empty()).then_some(())
    })
    .await;
    assert_eq!(fake.removed(), vec![old.id.clone()]);
    assert!(
        crossed.elapsed() < secs(10),
        "acted {:?} after high was crossed",
        crossed.elapsed()
    );
    assert_eq!(fake.count("ImageFsInfo"), 2, "one cycle more, started by the crossing");
    cycles_done(&daemon, 2).await;
    assert_eq!(
        metric(&daemon.metrics.encode(), "imagegc_image_filesystem_usage_ratio"),
        Some(0.8),
        "the usage metric is the measurement's"
    );

    // Still above high after it (the rest is not images): the crossing is
    // not seen again until usage has gone below high, so no cycle spins.
    tokio::time::sleep(secs(5)).await;
    assert_eq!(
        fake.count("ImageFsInfo"),
        2,
        "no cycle while usage merely stays above high"
    );
    daemon.stop().await;
}

/// Usage oscillating across high (a pull filling the disk while another
/// writer frees it) starts at most one cycle per `CROSSING_SPACING`, and a
/// crossing inside it is answered at its end, not dropped: cycles do not
/// spin whatever the disk does. On tokio's paused clock.
#[tokio::test(start_paused = true)]
async fn usage_oscillating_across_high_starts_at_most_one_cycle_per_spacing() {
    let spacing = imagegc::daemon::CROSSING_SPACING;
    let (_fake, disk, mut daemon) = images_on_a_1000_byte_disk(&[], 900, |c| c.gc.usage_poll_interval = secs(30)).await;
    let cycles = || {
        let scrape = daemon.metrics.encode();
        ["success", "failure"]
            .iter()
            .filter_map(|result| metric(&scrape, &format!("imagegc_cycles_total{{result=\"{result}\"}}")))
            .sum::<f64>() as u64
    };
    assert_eq!(cycles(), 1);
    // 90 % and 10 % used in turn, 3 s each (the disk is measured every
    // 2 s): a crossing every 6 s, over one spacing and a third.
    let start = tokio::time::Instant::now();
    let end = start + spacing + spacing / 3;
    while tokio::time::Instant::now() < end {
        disk.set_available(100);
        tokio::time::sleep(secs(3)).await;
        disk.set_available(900);
        tokio::time::sleep(secs(3)).await;
    }
    // The first crossing's cycle at once, the ones after it one cycle at
    // the end of the spacing.
    assert_eq!(
        cycles(),
        3,
        "cycles in {:?} of usage crossing high every 6 s",
        start.elapsed()
    );
    daemon.stop().await;
}

/// A cycle that could not bring usage below high (nothing removable)
/// holds the next crossing back for `CROSSING_SPACING`, but not when images
/// arrived since: the cluster's big pull, where a cycle during the earlier
/// pull (its image in use) found nothing, the old images then arrived and
/// took usage past high again, and the cycle that would remove them waited
/// 22 s, long enough for the next pull to cross the eviction line. Here the
/// second crossing comes 8 s after the first and is answered within
/// seconds. On tokio's paused clock.
#[tokio::test(start_paused = true)]
async fn a_crossing_after_images_arrived_is_answered_at_once_within_the_spacing() {
    let (fake, disk, mut daemon) = images_on_a_1000_byte_disk(&[], 900, |c| c.gc.usage_poll_interval = secs(2)).await;
    // Something fills the disk that no image can free: the crossing's
    // cycle finds nothing to remove.
    disk.set_available(100);
    let first = tokio::time::Instant::now();
    eventually(secs(10), "the crossing's cycle", || {
        (fake.count("ImageFsInfo") == 2).then_some(())
    })
    .await;
    // It goes; an unused image arrives and a pull takes usage past high
    // again, well inside the spacing.
    disk.set_available(900);
    tokio::time::sleep(secs(3)).await;
    let old = image("old", 300);
    fake.add_image(old.clone());
    disk.occupy(&old.id, old.size);
    disk.set_available(100);
    let second = tokio::time::Instant::now();
    eventually(
        imagegc::daemon::CROSSING_SPACING * 2,
        "the image that arrived removed",
        || (!fake.removed().is_empty()).then_some(()),
    )
    .await;
    assert_eq!(fake.removed(), vec![old.id.clone()]);
    let took = second.elapsed();
    assert!(
        took < secs(6) && second.duration_since(first) < imagegc::daemon::CROSSING_SPACING,
        "the crossing {:?} after the first, with an image arrived since, was answered {took:?} after it",
        second.duration_since(first)
    );
    daemon.stop().await;
}

/// Usage that stays at or above high after a cycle that could not bring it
/// down is no crossing, but images arriving meanwhile are something that
/// cycle did not see: they start a cycle without waiting for the interval.
#[tokio::test(start_paused = true)]
async fn images_arriving_while_usage_stays_above_high_start_a_cycle() {
    let (fake, disk, mut daemon) = images_on_a_1000_byte_disk(&[], 900, |c| c.gc.usage_poll_interval = secs(2)).await;
    disk.set_available(100);
    eventually(secs(10), "the crossing's cycle", || {
        (fake.count("ImageFsInfo") == 2).then_some(())
    })
    .await;
    tokio::time::sleep(secs(60)).await;
    assert_eq!(
        fake.count("ImageFsInfo"),
        2,
        "no cycle while usage merely stays above high"
    );
    let old = image("old", 300);
    fake.add_image(old.clone());
    disk.occupy(&old.id, old.size);
    let arrived = tokio::time::Instant::now();
    eventually(secs(60), "the image that arrived removed", || {
        (!fake.removed().is_empty()).then_some(())
    })
    .await;
    assert!(
        arrived.elapsed() < secs(6),
        "removed {:?} after it arrived",
        arrived.elapsed()
    );
    // Nothing more arrives: usage still above high starts no more cycles.
    let cycles = fake.count("ImageFsInfo");
    tokio::time::sleep(secs(60)).await;
    assert_eq!(
        fake.count("ImageFsInfo"),
        cycles,
        "no cycle spins once the arrivals are seen"
    );
    daemon.stop().await;
}

/// A cycle that could not reach low because the images it could free were
/// younger than `gc.min_age` runs again as soon as the first of them may
/// go, not at the next interval: usage staying above high is no crossing.
#[tokio::test]
async fn a_cycle_held_back_by_min_age_runs_again_when_the_young_images_may_go() {
    let fresh = image("fresh", 300);
    let (fake, _disk, mut daemon) = images_on_a_1000_byte_disk(&[&fresh], 100, |c| c.gc.min_age = secs(3)).await;
    assert!(fake.removed().is_empty(), "too young at the first cycle");
    let removed = eventually(secs(10), "the image removed once old enough", || {
        (!fake.removed().is_empty()).then(|| fake.removed())
    })
    .await;
    assert_eq!(removed, vec![fresh.id.clone()]);
    daemon.stop().await;
}

/// Images kept only for `gc.min_age` that would bring usage to low once
/// they age are no reason to say that images cannot: no unreachable
/// episode (the metric, the `FreeDiskSpaceFailed` event, the thrash
/// hold-back), and the image goes as soon as it may.
#[tokio::test]
async fn images_that_only_need_to_age_are_not_space_images_cannot_free() {
    let fresh = image("fresh", 450);
    let (fake, _disk, mut daemon) = images_on_a_1000_byte_disk(&[&fresh], 100, |c| c.gc.min_age = secs(3)).await;
    assert!(fake.removed().is_empty(), "too young at the first cycle");
    assert_eq!(
        metric(&daemon.metrics.encode(), "imagegc_space_unreachable"),
        Some(0.0),
        "400 bytes to free, and the young image frees 450 once it ages"
    );
    let removed = eventually(secs(10), "the image removed once old enough", || {
        (!fake.removed().is_empty()).then(|| fake.removed())
    })
    .await;
    assert_eq!(removed, vec![fresh.id.clone()]);
    assert_eq!(metric(&daemon.metrics.encode(), "imagegc_space_unreachable"), Some(0.0));
    daemon.stop().await;
}

/// A disk filling in steps: each crossing's cycle brings usage below high,
/// and the next crossing, well inside `CROSSING_SPACING`, starts a cycle at
/// once (the spacing holds only while cycles cannot bring usage down).
/// On tokio's paused clock.
#[tokio::test(start_paused = true)]
async fn a_disk_filling_in_steps_is_answered_at_every_crossing() {
    let (a, b) = (image("a", 200), image("b", 200));
    let (fake, disk, mut daemon) = images_on_a_1000_byte_disk(&[&a, &b], 600, |c| {
        c.gc.usage_poll_interval = secs(30);
        c.gc.low_threshold_percent = 75;
    })
    .await;
    assert!(fake.removed().is_empty());
    // A pull: 90 % used. One image brings usage to 70 %.
    disk.set_available(100);
    let first = tokio::time::Instant::now();
    eventually(secs(60), "the first image removed", || {
        (fake.removed().len() == 1).then_some(())
    })
    .await;
    // The next pull, a few seconds later.
    tokio::time::sleep(secs(4)).await;
    disk.set_available(100);
    let second = tokio::time::Instant::now();
    eventually(secs(60), "the second image removed", || {
        (fake.removed().len() == 2).then_some(())
    })
    .await;
    let took = second.elapsed();
    assert!(
        second.duration_since(first) < imagegc::daemon::CROSSING_SPACING && took < secs(5),
        "the second crossing, {:?} after the first, was answered {took:?} after it",
        second.duration_since(first)
    );
    daemon.stop().await;
}

/// A daemon over unused `images`, each occupying its size on a 1000-byte
/// disk with `available` bytes free, high 80 and low 50, no eviction line
/// (so no headroom and no hurry), a cycle an hour
/// (only what the test starts runs one), once its first cycle has finished.
async fn images_on_a_1000_byte_disk(
    images: &[&imagegc::cri::Image],
    available: u64,
    configure: impl FnOnce(&mut imagegc::config::Config),
) -> (FakeRuntime, SimDisk, InProcess) {
    let fake = FakeRuntime::new();
    let disk = SimDisk::new(1000, available);
    for image in images {
        fake.add_image((*image).clone());
        disk.occupy(&image.id, image.size);
    }
    fake.on_remove(Some(disk.free_on_remove()));
    let daemon = InProcess::start(
        fake.clone(),
        disk.clone(),
        |_| {},
        |c| {
            c.gc.interval = secs(3600);
            c.gc.high_threshold_percent = 80;
            c.gc.low_threshold_percent = 50;
            // No kubelet eviction line: on a disk this small, each image a
            // fifth of it, usage is past the default line at the first
            // crossing, and the hurry would change the walks these tests
            // check (the tests of the line set one).
            c.eviction_imagefs_available = Some(imagegc::config::EvictionThreshold::Bytes(0));
            configure(c);
        },
    )
    .await;
    first_cycle_done(&daemon).await;
    (fake, disk, daemon)
}

/// Usage at 62 %, below high (80), on a node that pulled a 300-byte image
/// (and two of 100) into a 1000-byte disk: `line`, the kubelet's eviction
/// line. Whether an image was removed within ten seconds.
async fn below_high_after_a_big_pull(line: imagegc::config::EvictionThreshold) -> bool {
    let (big, a, b) = (image("big", 300), image("a", 100), image("b", 100));
    let (fake, disk, mut daemon) = images_on_a_1000_byte_disk(&[&big, &a, &b], 500, |c| {
        c.gc.headroom = true;
        c.eviction_imagefs_available = Some(line);
    })
    .await;
    assert!(fake.removed().is_empty(), "50 % at the first cycle");
    // Something else writes: 62 %.
    disk.set_available(380);
    tokio::time::sleep(secs(10)).await;
    let removed = !fake.removed().is_empty();
    daemon.stop().await;
    removed
}

/// The usage checks between cycles go by the thresholds in force: with the
/// kubelet's eviction line at 15 %, the 300-byte pull asks 450 bytes free
/// at least (high 55 % here), and 62 % starts a space pass; without a line,
/// nothing happens below 80 %.
#[tokio::test(start_paused = true)]
async fn a_pull_that_would_cross_the_eviction_line_from_below_high_starts_a_space_pass_below_high() {
    assert!(below_high_after_a_big_pull(imagegc::config::EvictionThreshold::Percent(15.0)).await);
    assert!(!below_high_after_a_big_pull(imagegc::config::EvictionThreshold::Bytes(0)).await);
}
