//! A runtime that stops answering: every CRI call carries `runtime.timeout`,
//! so a hung call ends the cycle (or that one removal) within it, nothing is
//! removed on a guess, and the next cycle after the runtime recovers works.

use std::time::{Duration, Instant};

use imagegc::cri::{Image, connect};
use imagegc::engine::Outcome;
use imagegc_testkit::fake::FakeRuntime;
use tokio_util::sync::CancellationToken;

use crate::support::{self, DiskEffects, SimDisk, container_using, image, metric};

/// The hang injected: far longer than any test waits.
const HANG: Duration = Duration::from_secs(10);
/// `runtime.timeout` in these tests.
const TIMEOUT: Duration = Duration::from_millis(500);
/// What a cycle may take when one call hangs: the timeout, a few more calls
/// and a slow machine, but nowhere near [`HANG`].
const BOUND: Duration = Duration::from_secs(4);

/// Images `a` and `b` unused (500 bytes on disk each), `app` in use; the disk
/// is full, so a working cycle removes `a` and stops at the low threshold.
fn full_node() -> (FakeRuntime, SimDisk) {
    let fake = FakeRuntime::new();
    let disk = SimDisk::new(1000, 0);
    let app = image("app", 100);
    for unused in [image("a", 500), image("b", 500)] {
        disk.occupy(&unused.id, 500);
        fake.add_image(unused);
    }
    fake.add_container(container_using("app-1", &app));
    fake.add_image(app);
    fake.on_remove(Some(disk.free_on_remove()));
    (fake, disk)
}

#[tokio::test]
async fn a_hung_list_images_fails_the_cycle_within_the_timeout_and_the_next_cycle_recovers() {
    let (fake, disk) = full_node();
    fake.delay("ListImages", HANG);
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let client = connect(&server.endpoint(), TIMEOUT).unwrap();
    let mut config = support::config(&dir.path().join("state"));
    config.runtime.timeout = TIMEOUT;
    let mut collector = support::collector(client, &disk, &config);

    let started = Instant::now();
    let report = collector.cycle(&CancellationToken::new()).await;
    let took = started.elapsed();
    assert!(took < BOUND, "the cycle took {took:?} against a hung ListImages");
    match &report.outcome {
        Outcome::Failed(err) => {
            assert!(
                err.to_string().contains("ListImages") && err.to_string().contains("timed out"),
                "{err}"
            );
        }
        other => panic!("expected a failed cycle, got {other:?}"),
    }
    assert!(!report.runtime_reached);
    assert!(report.removed.is_empty() && fake.removed().is_empty());
    assert_eq!(fake.count("RemoveImage"), 0, "nothing is removed on a guess");
    assert_eq!(disk.measurements(), 0, "the cycle stopped before the space pass");
    let metrics = collector.metrics().encode();
    assert_eq!(metric(&metrics, "imagegc_runtime_up"), Some(0.0), "{metrics}");

    fake.delay("ListImages", Duration::ZERO);
    let report = collector.cycle(&CancellationToken::new()).await;
    assert_eq!(report.outcome, Outcome::Success);
    assert_eq!(fake.removed(), [image("a", 0).id], "the recovered cycle frees space");
    assert_eq!(disk.available(), 500);
    let metrics = collector.metrics().encode();
    assert_eq!(metric(&metrics, "imagegc_runtime_up"), Some(1.0), "{metrics}");
}

#[tokio::test]
async fn a_hung_remove_image_leaves_its_outcome_unknown_and_nothing_more_goes_this_cycle() {
    let (fake, disk) = full_node();
    fake.delay("RemoveImage", HANG);
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let client = connect(&server.endpoint(), TIMEOUT).unwrap();
    let mut config = support::config(&dir.path().join("state"));
    config.runtime.timeout = TIMEOUT;
    let mut collector = support::collector(client, &disk, &config);

    let started = Instant::now();
    let report = collector.cycle(&CancellationToken::new()).await;
    let took = started.elapsed();
    assert!(took < BOUND, "the cycle took {took:?} against a hung RemoveImage");
    // The runtime may still be removing `a`: nothing else goes until a
    // listing tells, so a removal it finishes late cannot add to others.
    assert_eq!(report.unsettled, [image("a", 0).id]);
    assert_eq!(fake.count("RemoveImage"), 1);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    assert!(
        matches!(report.outcome, Outcome::LowNotReached { .. }),
        "{:?}",
        report.outcome
    );
    assert!(report.removed.is_empty());
    let metrics = collector.metrics().encode();
    assert_eq!(
        metric(&metrics, "image_garbage_collected_total{reason=\"space\"}"),
        Some(0.0)
    );
    for name in ["a", "b", "app"] {
        assert!(
            collector.records().get(&image(name, 0).id).is_some(),
            "record of {name} kept"
        );
    }
    let journal = imagegc::store::journal::Journal::new(&dir.path().join("state"))
        .read(None)
        .unwrap();
    assert!(journal.is_empty(), "no removal was journaled: {journal:?}");

    // The runtime answers again and still lists `a`: it was not removed,
    // and the next cycle removes it.
    fake.delay("RemoveImage", Duration::ZERO);
    let report = collector.cycle(&CancellationToken::new()).await;
    assert_eq!(report.outcome, Outcome::Success);
    assert_eq!(report.removed.len(), 1);
}

/// Each call a cycle makes, hung in turn. What may happen differs (a hung
/// `ListContainers` right before a removal means the in-use re-check cannot
/// be made, so the cycle stops there), but every cycle ends within its bound
/// and no image in use is removed.
#[tokio::test]
async fn every_hung_call_ends_the_cycle_within_its_bound_and_removes_nothing_wrong() {
    struct Case {
        rpc: &'static str,
        /// Which call of `rpc` hangs (1 = the first).
        nth: usize,
        /// Ask the runtime (ImageFsInfo) where the image filesystem is.
        ask_runtime_for_fs: bool,
        /// Images removed, by name.
        removed: &'static [&'static str],
        outcome: fn(&Outcome) -> bool,
    }
    let cases = [
        Case {
            rpc: "ListImages",
            nth: 1,
            ask_runtime_for_fs: false,
            removed: &[],
            outcome: |o| matches!(o, Outcome::Failed(e) if e.to_string().contains("ListImages")),
        },
        Case {
            rpc: "ListContainers",
            nth: 1,
            ask_runtime_for_fs: false,
            removed: &[],
            outcome: |o| matches!(o, Outcome::Failed(e) if e.to_string().contains("ListContainers")),
        },
        // The listing answered; the re-check right before the first removal
        // hangs: when in doubt, keep.
        Case {
            rpc: "ListContainers",
            nth: 2,
            ask_runtime_for_fs: false,
            removed: &[],
            outcome: |o| matches!(o, Outcome::Failed(e) if e.to_string().contains("re-check")),
        },
        Case {
            rpc: "ImageFsInfo",
            nth: 1,
            ask_runtime_for_fs: true,
            removed: &[],
            outcome: |o| matches!(o, Outcome::Failed(e) if e.to_string().contains("space-based collection skipped")),
        },
        // The first removal hangs: its outcome is unknown and the image
        // still listed, so nothing more goes this cycle.
        Case {
            rpc: "RemoveImage",
            nth: 1,
            ask_runtime_for_fs: false,
            removed: &[],
            outcome: |o| matches!(o, Outcome::LowNotReached { .. }),
        },
        // The verbose status that names the first listed image's layers
        // hangs: the listing goes on without layers (the other images are
        // asked at the next listing) and the cycle removes as it would.
        Case {
            rpc: "ImageStatus",
            nth: 1,
            ask_runtime_for_fs: false,
            removed: &["a"],
            outcome: |o| matches!(o, Outcome::Success),
        },
        // The image's status, asked right before its removal (after the
        // first listing asked each of the three images' layers once),
        // hangs: when in doubt, keep.
        Case {
            rpc: "ImageStatus",
            nth: 4,
            ask_runtime_for_fs: false,
            removed: &[],
            outcome: |o| matches!(o, Outcome::Failed(e) if e.to_string().contains("re-check")),
        },
    ];
    for case in cases {
        let what = format!("call {} of {} hung", case.nth, case.rpc);
        let (fake, disk) = full_node();
        let dir = tempfile::tempdir().unwrap();
        let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
        // The hang is real (the server does not answer), and the real
        // client's deadline is what ends it.
        fake.delay_nth(case.rpc, case.nth, HANG);
        let runtime = connect(&server.endpoint(), TIMEOUT).unwrap();
        let mut config = support::config(&dir.path().join("state"));
        config.runtime.timeout = TIMEOUT;
        if case.ask_runtime_for_fs {
            config.gc.image_fs_path = None;
        }
        let mut collector = support::collector(runtime, &disk, &config);

        let started = Instant::now();
        let report = collector.cycle(&CancellationToken::new()).await;
        let took = started.elapsed();
        assert!(took < BOUND, "{what}: the cycle took {took:?}");
        assert!((case.outcome)(&report.outcome), "{what}: {:?}", report.outcome);
        let expected: Vec<String> = case.removed.iter().map(|name| image(name, 0).id).collect();
        assert_eq!(fake.removed(), expected, "{what}");
        assert!(
            !fake.removed().contains(&image("app", 0).id),
            "{what}: the image in use was removed"
        );
        // Whatever happened, the state was saved at the end of the cycle.
        assert!(
            dir.path().join("state").join(imagegc::store::state::FILE_NAME).exists(),
            "{what}"
        );
        server.shutdown().await;
    }
}

/// containerd 1.6 does not pin its pause image, and no container lists it:
/// imagegc learns it from the verbose `Status`. A `Status` that hangs or
/// fails before the sandbox image was ever learnt must not expose it.
#[tokio::test]
async fn the_sandbox_image_is_not_exposed_by_a_status_call_that_fails() {
    const PAUSE: &str = "registry.k8s.io/pause:3.9";
    for fault in ["hangs", "fails"] {
        let fake = FakeRuntime::new();
        let disk = SimDisk::new(1000, 0);
        let pause = Image {
            repo_tags: vec![PAUSE.to_string()].into(),
            repo_digests: Default::default(),
            ..image("pause", 300)
        };
        disk.occupy(&pause.id, 900);
        fake.add_image(pause.clone());
        let other = image("a", 100);
        disk.occupy(&other.id, 100);
        fake.add_image(other.clone());
        fake.set_sandbox_image(Some(PAUSE.to_string()));
        fake.on_remove(Some(disk.free_on_remove()));
        let inject = |on: bool| match (fault, on) {
            ("hangs", true) => fake.delay("Status", HANG),
            ("hangs", false) => fake.delay("Status", Duration::ZERO),
            (_, true) => fake.fail_always("Status", Some(tonic::Status::internal("injected"))),
            (_, false) => fake.fail_always("Status", None),
        };
        let dir = tempfile::tempdir().unwrap();
        let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
        let client = connect(&server.endpoint(), TIMEOUT).unwrap();
        let mut collector = support::collector(client, &disk, &support::config(&dir.path().join("state")));

        // Never learnt: nothing is removed this cycle.
        inject(true);
        let started = Instant::now();
        let report = collector.cycle(&CancellationToken::new()).await;
        assert!(
            started.elapsed() < BOUND,
            "Status {fault}: took {:?}",
            started.elapsed()
        );
        assert!(
            fake.removed().is_empty(),
            "Status {fault} before the sandbox image was known: removed {:?}",
            fake.removed()
        );
        assert!(
            matches!(report.outcome, Outcome::Failed(ref e) if e.to_string().contains("Status")),
            "{:?}",
            report.outcome
        );

        // Learnt: it is kept as the sandbox image while the rest goes.
        inject(false);
        let report = collector.cycle(&CancellationToken::new()).await;
        assert_eq!(fake.removed(), std::slice::from_ref(&other.id), "Status {fault}");
        assert!(
            matches!(report.outcome, Outcome::LowNotReached { .. }),
            "{:?}",
            report.outcome
        );

        // Failing again later: the last known sandbox image is still kept,
        // and the cycle runs.
        inject(true);
        let report = collector.cycle(&CancellationToken::new()).await;
        assert_eq!(fake.removed(), std::slice::from_ref(&other.id), "Status {fault}");
        assert!(
            matches!(report.outcome, Outcome::LowNotReached { .. }),
            "{:?}",
            report.outcome
        );
        server.shutdown().await;
    }
}
