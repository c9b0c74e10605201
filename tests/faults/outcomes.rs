//! What really happened to an image, whatever the runtime answers: a disk
//! that images cannot fix, removals slower than the deadline, names gained
//! at the last moment, ids listed twice or with no id, removals someone else
//! made, a runtime that says OK and keeps the image, and a listing that
//! comes back empty once. Only what really went is counted and journaled,
//! and nothing goes that has to stay.

use std::time::{Duration, SystemTime};

use imagegc::cri::{Container, Image, connect};
use imagegc::engine::Outcome;
use imagegc::store::state::StateStore;
use imagegc_testkit::fake::FakeRuntime;
use tokio_util::sync::CancellationToken;

use crate::support::{self, Bed, SimDisk, history, image, records};

fn ids(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| image(n, 0).id).collect()
}

const NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];

#[tokio::test]
async fn when_images_cannot_reach_low_an_image_removed_for_space_is_not_removed_again_within_the_thrash_window() {
    // 1000 bytes, 880 of them not images; five unused 20-byte images. High
    // 80, low 50: 480 bytes to free, the images hold 100.
    let images: Vec<Image> = NAMES.iter().map(|n| image(n, 20)).collect();
    let mut bed = Bed::start(&images, SimDisk::new(1000, 20), support::PATIENCE, |c| {
        c.gc.high_threshold_percent = 80;
        c.gc.low_threshold_percent = 50;
    })
    .await;

    let report = bed.cycle().await;
    // What helps is still freed.
    assert_eq!(bed.fake.removed(), ids(&NAMES));
    let outlook = report
        .space_unreachable
        .expect("the cycle says images cannot reach low");
    assert_eq!(outlook.bytes_to_free, 480);
    // containerd's images take their content and their snapshot: twice
    // the reported 100 bytes may go, and 780 of the 980 used are not images.
    assert_eq!(outlook.could_free, 200);
    assert_eq!(outlook.not_image_bytes, 780);
    assert_eq!(bed.metric("imagegc_space_unreachable"), Some(1.0));

    // The node pulls every image back at once.
    for image in &images {
        bed.disk.occupy(&image.id, image.size);
        bed.disk.set_available(bed.disk.available() - image.size);
        bed.fake.add_image(image.clone());
    }
    for _ in 0..3 {
        let report = bed.cycle().await;
        assert!(report.removed.is_empty(), "removed again: {:?}", report.removed);
        assert_eq!(report.held_back, ids(&NAMES));
    }
    assert_eq!(bed.fake.count("RemoveImage"), NAMES.len(), "each image went once");
    assert_eq!(bed.metric("imagegc_repulled_after_removal_total"), Some(5.0));

    // The data that was not images goes: the episode ends.
    bed.disk.set_available(900);
    let report = bed.cycle().await;
    assert!(report.space_unreachable.is_none());
    assert_eq!(bed.metric("imagegc_space_unreachable"), Some(0.0));
}

#[tokio::test]
async fn a_disk_images_can_fix_is_not_an_episode() {
    let images: Vec<Image> = NAMES.iter().map(|n| image(n, 200)).collect();
    let mut bed = Bed::full(&images).await;
    let report = bed.cycle().await;
    assert_eq!(report.outcome, Outcome::Success);
    assert!(report.space_unreachable.is_none());
    assert_eq!(bed.metric("imagegc_space_unreachable"), Some(0.0));
}

/// containerd reports compressed sizes; on disk an image takes its content
/// and its unpacked snapshot, here over five times the reported size. Measured
/// from the reported sizes alone, images "could not" reach low, and the
/// verdict stayed on after a cycle that reached it.
#[tokio::test]
async fn a_cycle_that_reaches_low_ends_the_verdict_that_images_cannot_and_learns_what_they_take() {
    // 1000 bytes, 150 available (85 %); five unused images reported at
    // 30 bytes, each occupying 160. High 80, low 50: 350 to free, and
    // twice the reported sizes (300) says images cannot.
    let images: Vec<Image> = NAMES.iter().map(|n| image(n, 30)).collect();
    let mut bed = Bed::start(&images, SimDisk::new(1000, 150), support::PATIENCE, |c| {
        c.gc.high_threshold_percent = 80;
        c.gc.low_threshold_percent = 50;
    })
    .await;
    for image in &images {
        bed.disk.occupy(&image.id, 160);
    }
    let report = bed.cycle().await;
    assert_eq!(report.outcome, Outcome::Success, "{report:?}");
    assert_eq!(report.removed.len(), 3, "three images free 480 bytes, enough");
    assert!(report.space_unreachable.is_none(), "low was reached: {report:?}");
    assert_eq!(bed.metric("imagegc_space_unreachable"), Some(0.0));
    let factor = bed.collector.footprint().factor();
    assert!(
        (5.0..=5.4).contains(&factor),
        "measured removals freed 160/30 of the reported size: {factor}"
    );

    // The node pulls the three back: with what the removals taught, they
    // can free what is needed, and go again rather than being held back.
    for image in &images[..3] {
        bed.disk.occupy(&image.id, 160);
        bed.disk.set_available(bed.disk.available() - 160);
        bed.fake.add_image(image.clone());
    }
    bed.disk.set_available(150);
    let report = bed.cycle().await;
    assert!(report.space_unreachable.is_none(), "{report:?}");
    assert!(report.held_back.is_empty(), "{report:?}");
}

/// A size of 0 (an image mid-pull, a runtime that does not say) is not
/// "nothing to free": it must not make images look unable to reach low.
#[tokio::test]
async fn an_image_of_unknown_size_does_not_make_low_look_unreachable() {
    let images: Vec<Image> = NAMES.iter().map(|n| image(n, 0)).collect();
    let mut bed = Bed::start(&images, SimDisk::new(1000, 150), support::PATIENCE, |c| {
        c.gc.high_threshold_percent = 80;
        c.gc.low_threshold_percent = 50;
    })
    .await;
    for image in &images {
        bed.disk.occupy(&image.id, 150);
    }
    let report = bed.cycle().await;
    assert!(report.space_unreachable.is_none(), "{report:?}");
    assert_eq!(report.outcome, Outcome::Success, "{report:?}");
}

/// `gc.image_fs_path` on another filesystem than the one the runtime keeps
/// its images on (the state directory on the root disk, the runtime's root
/// on its own): its figures say nothing about images, and no image is
/// removed for space on them.
#[tokio::test]
async fn a_configured_image_fs_path_on_another_filesystem_is_reported_and_runs_no_space_pass() {
    let images: Vec<Image> = NAMES.iter().map(|n| image(n, 100)).collect();
    let disk = SimDisk::new(1000, 50);
    disk.other_filesystem_at(imagegc_testkit::fake::DEFAULT_IMAGE_FS_MOUNT);
    let mut bed = Bed::start(&images, disk, support::PATIENCE, |c| {
        c.gc.image_fs_path = Some("/var/lib/imagegc".into());
    })
    .await;
    let report = bed.cycle().await;
    assert!(
        report.removed.is_empty(),
        "removed on the wrong disk's figures: {report:?}"
    );
    assert!(!report.space_pass);
    let why = report.image_fs_mismatch.expect("the mismatch is reported");
    assert!(why.contains("gc.image_fs_path /var/lib/imagegc"), "{why}");
    assert!(why.contains("not the filesystem the runtime"), "{why}");
    assert_eq!(bed.metric("imagegc_image_fs_mismatch"), Some(1.0));

    // The right path: the space pass runs, and the metric clears.
    let mut settings = bed.collector.settings().clone();
    settings.image_fs_path = Some(imagegc_testkit::fake::DEFAULT_IMAGE_FS_MOUNT.into());
    bed.collector.set_settings(settings);
    let report = bed.cycle().await;
    assert!(report.image_fs_mismatch.is_none());
    assert_eq!(bed.metric("imagegc_image_fs_mismatch"), Some(0.0));
}

/// Ten unused 100-byte images on a disk that needs one of them gone
/// (capacity 1000, 150 available, low 80: 50 bytes to free).
async fn slow_removals(latency: Duration, timeout: Duration) -> Bed {
    let names: Vec<String> = (0..10).map(|n| format!("slow{n}")).collect();
    let images: Vec<Image> = names.iter().map(|n| image(n, 100)).collect();
    let bed = Bed::start(&images, SimDisk::new(1000, 150), timeout, |c| {
        c.gc.high_threshold_percent = 80;
        c.gc.low_threshold_percent = 80;
    })
    .await;
    bed.fake.remove_latency(Some(latency));
    bed
}

#[tokio::test]
async fn a_removal_that_completes_after_the_deadline_is_counted_once_and_nothing_more_goes() {
    let mut bed = slow_removals(Duration::from_millis(1500), Duration::from_secs(1)).await;

    let report = bed.cycle().await;
    let first = image("slow0", 0).id;
    assert_eq!(report.outcome, Outcome::Success, "{report:?}");
    assert_eq!(
        bed.fake.removed(),
        std::slice::from_ref(&first),
        "one removal was needed"
    );
    assert_eq!(bed.fake.count("RemoveImage"), 1);
    let removed: Vec<&str> = report.removed.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(removed, [first.as_str()]);
    assert_eq!(report.removed[0].freed_bytes, Some(100), "the space was measured");
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert_eq!(bed.journaled(), [first]);
    assert_eq!(bed.metric("image_garbage_collected_total{reason=\"space\"}"), Some(1.0));
}

#[tokio::test]
async fn a_removal_whose_outcome_stays_unknown_stops_the_space_pass_and_is_journaled_once_seen_gone() {
    let mut bed = slow_removals(Duration::from_secs(3), Duration::from_millis(400)).await;

    let report = bed.cycle().await;
    let first = image("slow0", 0).id;
    assert_eq!(report.unsettled, std::slice::from_ref(&first));
    assert_eq!(
        bed.fake.count("RemoveImage"),
        1,
        "no further removal while the first may be under way"
    );
    assert!(report.removed.is_empty() && report.failed.is_empty());
    assert!(bed.journaled().is_empty());

    // The runtime finishes the removal; the next cycle sees it went.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(bed.fake.removed(), std::slice::from_ref(&first));
    let report = bed.cycle().await;
    assert_eq!(report.outcome, Outcome::Success);
    assert!(report.removed.is_empty(), "usage is below low: {:?}", report.removed);
    assert_eq!(bed.fake.count("RemoveImage"), 1);
    assert_eq!(bed.journaled(), [first]);
    assert_eq!(bed.metric("image_garbage_collected_total{reason=\"space\"}"), Some(1.0));
}

#[tokio::test]
async fn an_image_that_gains_a_name_right_before_its_removal_is_kept_for_a_container_using_that_name() {
    let a = image("a", 500);
    let mut bed = Bed::full(std::slice::from_ref(&a)).await;
    // Between the cycle's listing and the re-check before the removal, the
    // node tags the image anew and starts a container that names it only
    // by that tag (no id, no digest).
    let fake = bed.fake.clone();
    let retagged = a.clone();
    bed.fake.hook_on_call("ListContainers", 2, move || {
        let mut image = retagged.clone();
        image.repo_tags = image
            .repo_tags
            .iter()
            .map(str::to_owned)
            .chain(["registry.example.com/team/renamed:2.0".to_string()])
            .collect();
        fake.add_image(image);
        fake.add_container(Container {
            id: "late".to_string(),
            image: "registry.example.com/team/renamed:2.0".to_string(),
            image_ref: "registry.example.com/team/renamed:2.0".to_string(),
            ..Default::default()
        });
    });

    let report = bed.cycle().await;
    assert!(bed.fake.removed().is_empty(), "removed from under the container");
    assert_eq!(report.became_in_use, [a.id]);
}

/// A name gained between the listing and the removal is read by every keep
/// rule that reads names, not only by the containers: a protect pattern,
/// and the sandbox image.
#[tokio::test]
async fn an_image_that_gains_a_protected_or_sandbox_name_right_before_its_removal_is_kept() {
    for (gained, why) in [
        ("registry.example.com/team/golden:1", "protect pattern"),
        (imagegc_testkit::fake::DEFAULT_SANDBOX_IMAGE, "sandbox image"),
    ] {
        let a = image("a", 500);
        let mut bed = Bed::start(
            std::slice::from_ref(&a),
            SimDisk::new(1000, 0),
            support::PATIENCE,
            |c| {
                c.protect.images = vec!["registry.example.com/team/golden:*".to_string()];
            },
        )
        .await;
        let fake = bed.fake.clone();
        let retagged = a.clone();
        bed.fake.hook_on_call("ListContainers", 2, move || {
            let mut image = retagged.clone();
            image.repo_tags = image
                .repo_tags
                .iter()
                .map(str::to_owned)
                .chain([gained.to_string()])
                .collect();
            fake.add_image(image);
        });
        let report = bed.cycle().await;
        assert!(
            bed.fake.removed().is_empty(),
            "removed under a {why} gained: {report:?}"
        );
    }
}

/// One container whose `ContainerStatus` fails, on a node where
/// everything else answers: the cycle goes on and the runtime stays up,
/// but that container may mount any image, so none is removed until its
/// mounts can be read.
#[tokio::test]
async fn one_container_whose_status_fails_keeps_every_image_without_failing_the_cycle() {
    let used = image("used", 100);
    let unused = image("unused", 500);
    let mut bed = Bed::full(&[used.clone(), unused.clone()]).await;
    bed.fake.add_container(support::container_using("broken", &used));
    bed.fake
        .fail_always("ContainerStatus", Some(tonic::Status::internal("broken container")));

    let report = bed.cycle().await;
    assert!(report.runtime_reached, "{report:?}");
    assert!(!matches!(report.outcome, Outcome::Failed(_)), "{report:?}");
    assert!(
        bed.fake.removed().is_empty(),
        "removed while a container's mounts were unknown"
    );
    assert_eq!(bed.metric("imagegc_runtime_up"), Some(1.0));
    assert_eq!(bed.metric("imagegc_container_mounts_unknown"), Some(1.0));

    bed.fake.fail_always("ContainerStatus", None);
    bed.cycle().await;
    assert_eq!(bed.fake.removed(), [unused.id]);
    assert_eq!(bed.metric("imagegc_container_mounts_unknown"), Some(0.0));
}

#[tokio::test]
async fn an_id_listed_twice_is_planned_with_what_every_listing_says() {
    // `a` listed unpinned, then pinned; `b` listed under a second tag that
    // a protect pattern names; `c` is the only image that may go.
    let a = image("a", 300);
    let b = image("b", 300);
    let c = image("c", 300);
    let mut bed = Bed::start(
        &[a.clone(), b.clone(), c.clone()],
        SimDisk::new(1000, 0),
        support::PATIENCE,
        |config| {
            config.gc.low_threshold_percent = 0;
            config.protect.images = vec!["registry.example.com/team/kept-b:*".to_string()];
        },
    )
    .await;
    bed.fake.add_listing(Image {
        pinned: true,
        repo_tags: Default::default(),
        ..a.clone()
    });
    bed.fake.add_listing(Image {
        repo_tags: vec!["registry.example.com/team/kept-b:1".to_string()].into(),
        ..b.clone()
    });

    bed.cycle().await;
    assert_eq!(bed.fake.removed(), [c.id]);
}

#[tokio::test]
async fn an_image_listed_with_no_id_is_never_asked_to_be_removed() {
    let mut bed = Bed::full(&[]).await;
    bed.fake.add_listing(Image {
        id: String::new(),
        repo_tags: vec!["registry.example.com/team/noid:1".to_string()].into(),
        size: 500,
        ..Default::default()
    });
    let report = bed.cycle().await;
    assert_eq!(bed.fake.count("RemoveImage"), 0);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
}

#[tokio::test]
async fn an_image_someone_else_removed_first_is_neither_counted_nor_journaled() {
    let a = image("a", 500);
    let b = image("b", 500);
    let mut bed = Bed::full(&[a.clone(), b.clone()]).await;
    // A second collector removes `a` while this one's RemoveImage is on
    // its way: the runtime answers NotFound.
    let fake = bed.fake.clone();
    let disk = bed.disk.clone();
    let first = a.id.clone();
    bed.fake.hook_before_remove(Box::new(move |reference| {
        if reference == first {
            fake.remove_image_by_id(&first);
            disk.release(&first);
        }
    }));

    let report = bed.cycle().await;
    assert_eq!(report.outcome, Outcome::Success, "the other removal freed the space");
    assert!(report.removed.is_empty(), "{:?}", report.removed);
    assert!(bed.journaled().is_empty(), "{:?}", bed.journaled());
    assert_eq!(bed.metric("image_garbage_collected_total{reason=\"space\"}"), Some(0.0));
    assert!(bed.fake.images().iter().any(|i| i.id == b.id), "b was not needed");
}

#[tokio::test]
async fn a_runtime_that_answers_ok_and_keeps_the_image_is_not_believed() {
    let a = image("a", 500);
    let mut bed = Bed::full(std::slice::from_ref(&a)).await;
    bed.fake.remove_keeps_image(true);

    for _ in 0..3 {
        let report = bed.cycle().await;
        assert!(report.removed.is_empty(), "{:?}", report.removed);
        assert_eq!(report.failed.len(), 1);
        assert!(report.failed[0].1.contains("still listed"), "{:?}", report.failed);
    }
    assert!(bed.journaled().is_empty());
    assert_eq!(bed.metric("image_garbage_collected_total{reason=\"space\"}"), Some(0.0));
    assert_eq!(bed.metric("imagegc_removal_failures_total"), Some(3.0));
}

#[tokio::test]
async fn one_empty_listing_does_not_reset_the_ages_that_make_images_due_for_removal() {
    // Fifty images last used two days ago, max age one day: all due.
    let names: Vec<String> = (0..50).map(|n| format!("old{n}")).collect();
    let images: Vec<Image> = names.iter().map(|n| image(n, 1)).collect();
    let two_days_ago = SystemTime::now() - Duration::from_secs(2 * 86_400);
    let dir = tempfile::tempdir().unwrap();
    let state_dir = dir.path().join("state");
    StateStore::new(&state_dir)
        .save(
            &records(images.iter().map(|i| history(i, two_days_ago, two_days_ago))),
            SystemTime::now(),
        )
        .unwrap();
    let fake = FakeRuntime::new();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let disk = SimDisk::new(1_000_000, 900_000);
    let mut config = support::config(&state_dir);
    config.gc.max_age = Duration::from_secs(86_400);
    let mut collector = support::collector(connect(&server.endpoint(), support::PATIENCE).unwrap(), &disk, &config);

    // The runtime answers once with no image (restarting, say), and the
    // collector saves its state.
    collector.cycle(&CancellationToken::new()).await;
    collector.save().await;
    drop(collector);

    // It lists them again; a new process loads the state.
    for image in &images {
        fake.add_image(image.clone());
    }
    let mut collector = support::collector(connect(&server.endpoint(), support::PATIENCE).unwrap(), &disk, &config);
    let report = collector.cycle(&CancellationToken::new()).await;
    assert_eq!(report.removed.len(), 50, "the age removals that were due still are");
    let a_day_ago = SystemTime::now() - Duration::from_secs(86_400);
    assert!(
        report.removed.iter().all(|r| r.last_used < a_day_ago),
        "with their history"
    );
}
