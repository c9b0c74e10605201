//! Each runtime's dialect, as measured on the real ones, spoken by the fake:
//! where the sandbox image is named (or not), CRI-O's bare ids and repo
//! digests, and image volumes. Each test is a cycle that must keep what a
//! runtime's quirk could make look unused.

use imagegc::cri::{Container, Image, connect};
use imagegc_testkit::fake::{Dialect, FakeRuntime};
use tokio_util::sync::CancellationToken;

use crate::support::{self, Bed, DiskEffects, SimDisk, image, image_id};

const PAUSE: &str = "registry.k8s.io/pause:3.10";

/// A full disk (95% used) the cycle would free all it can from.
fn full_disk() -> SimDisk {
    SimDisk::new(1_000_000, 50_000)
}

/// The fake runtime `fake`, served, and a collector over it on `disk`
/// (low 10 %, then `configure`).
async fn bed(fake: FakeRuntime, disk: &SimDisk, configure: impl FnOnce(&mut imagegc::config::Config)) -> Bed {
    Bed::serve(fake, disk.clone(), support::PATIENCE, |config| {
        config.gc.low_threshold_percent = 10;
        configure(config);
    })
    .await
}

fn pause_image(pinned: bool) -> Image {
    Image {
        id: image_id("pause"),
        repo_tags: vec![PAUSE.to_string()].into(),
        repo_digests: vec![format!("registry.k8s.io/pause@sha256:{}", "9".repeat(64))].into(),
        size: 300_000,
        pinned,
    }
}

/// containerd 2.x: `Status` no longer names the sandbox image and the
/// runtime pins it. With a pod running, its verbose status names the image:
/// it is kept as the sandbox, not merely as pinned.
#[tokio::test]
async fn containerd_2_names_its_sandbox_image_in_the_pod_status() {
    let fake = FakeRuntime::new();
    fake.set_dialect(Dialect::Containerd2);
    fake.set_sandbox_image(Some(PAUSE.to_string()));
    fake.add_image(pause_image(true));
    fake.add_pod("pod-1");
    let mut bed = bed(fake, &full_disk(), |_| {}).await;
    assert_eq!(bed.kept().await, [(image_id("pause"), "sandbox".to_string())]);
}

/// CRI-O 1.26 names its sandbox image nowhere and does not pin it. With no
/// pod running, the pause image looks like any unused image: nothing that
/// no container ever used may be removed then.
#[tokio::test]
async fn without_a_named_sandbox_image_never_used_images_are_kept() {
    let fake = FakeRuntime::new();
    fake.set_dialect(Dialect::Crio126);
    fake.set_sandbox_image(None);
    fake.add_image(pause_image(false));
    let old = image("old", 100_000);
    fake.add_image(old.clone());
    fake.add_container(Container {
        id: "c1".to_string(),
        image: old.repo_tags.first().unwrap().to_owned(),
        image_ref: old.repo_digests.first().unwrap().to_owned(),
        ..Default::default()
    });
    let disk = full_disk();
    let mut bed = bed(fake.clone(), &disk, |_| {}).await;
    // The container ran once, then went.
    let _ = bed.collector.observe().await.unwrap();
    fake.remove_container("c1");
    let removed = bed.removed_after_cycle().await;
    assert_eq!(
        removed,
        std::slice::from_ref(&old.id),
        "the image a container used goes"
    );
    assert!(
        fake.images().iter().any(|i| i.id == image_id("pause")),
        "the pause image stays"
    );
    let kept = bed.kept().await;
    assert_eq!(kept, [(image_id("pause"), "sandbox-unknown".to_string())]);
}

/// The never-used rule across a restart: the next process loads the
/// records with their last-used times moved forward past their first
/// sightings (the time it was down), and must still know that no
/// container ever used the pause image.
#[tokio::test]
async fn without_a_named_sandbox_image_never_used_images_are_kept_across_a_restart() {
    let fake = FakeRuntime::new();
    fake.set_dialect(Dialect::Crio126);
    fake.set_sandbox_image(None);
    fake.add_image(pause_image(false));
    let disk = full_disk();
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let mut config = support::config(&dir.path().join("state"));
    config.gc.low_threshold_percent = 10;
    config.gc.interval = std::time::Duration::from_secs(60);
    let client = || connect(&server.endpoint(), support::PATIENCE).unwrap();
    let mut first = support::collector(client(), &disk, &config);
    first.cycle(&CancellationToken::new()).await;
    first.save().await;
    drop(first);
    assert!(fake.removed().is_empty(), "the first process keeps it");

    // The next process starts a day later.
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(86_400);
    let mut second = support::collector_with_clock(client(), &disk, &config, imagegc::time::Clock::starting_at(later));
    second.cycle(&CancellationToken::new()).await;
    assert!(
        fake.removed().is_empty(),
        "the pause image no container ever used is kept by the next process too"
    );
}

/// `runtime.sandbox_image` names it outright, for a runtime that does not.
#[tokio::test]
async fn the_configured_sandbox_image_is_kept_as_the_sandbox() {
    let fake = FakeRuntime::new();
    fake.set_dialect(Dialect::Crio126);
    fake.set_sandbox_image(None);
    fake.add_image(pause_image(false));
    let fresh = image("fresh", 100_000);
    fake.add_image(fresh.clone());
    let mut bed = bed(fake.clone(), &full_disk(), |c| {
        c.runtime.sandbox_image = Some(PAUSE.to_string());
    })
    .await;
    assert_eq!(bed.removed_after_cycle().await, std::slice::from_ref(&fresh.id));
    assert_eq!(bed.kept().await, [(image_id("pause"), "sandbox".to_string())]);
}

/// `runtime.sandbox_image` written as a bare repository (what a user
/// writes after the start-up warning) names every tag of it, as a protect
/// pattern does; one that names no listed image protects nothing and must
/// not switch the never-used rule off either.
#[tokio::test]
async fn a_configured_sandbox_image_is_read_as_a_pattern_and_one_naming_nothing_keeps_the_safe_rule() {
    for (configured, why) in [
        ("registry.k8s.io/pause", "sandbox"),
        ("registry.k8s.io/pause:3.6", "sandbox-unknown"),
    ] {
        let fake = FakeRuntime::new();
        fake.set_dialect(Dialect::Crio126);
        fake.set_sandbox_image(None);
        fake.add_image(pause_image(false));
        let mut bed = bed(fake.clone(), &full_disk(), |c| {
            c.runtime.sandbox_image = Some(configured.to_string());
        })
        .await;
        assert!(
            bed.removed_after_cycle().await.is_empty(),
            "{configured}: the pause image was removed"
        );
        assert_eq!(bed.kept().await, [(image_id("pause"), why.to_string())], "{configured}");
    }
}

/// A runtime of `dialect` whose sandbox image is now [`PAUSE`] (pinned
/// where the dialect pins it), with a pod still running on the pause image
/// it was configured with before, `pause:3.9`, which is returned.
fn a_pod_on_an_old_pause_image(dialect: Dialect) -> (FakeRuntime, Image) {
    let fake = FakeRuntime::new();
    fake.set_dialect(dialect);
    fake.set_sandbox_image(Some(PAUSE.to_string()));
    fake.add_image(pause_image(dialect == Dialect::Containerd2));
    let old_pause = Image {
        id: image_id("pause-3.9"),
        repo_tags: vec!["registry.k8s.io/pause:3.9".to_string()].into(),
        ..pause_image(false)
    };
    fake.add_image(old_pause.clone());
    fake.add_pod_on("pod-1", "registry.k8s.io/pause:3.9");
    (fake, old_pause)
}

/// A pod whose `PodSandboxStatus` fails (a transient DeadlineExceeded on
/// containerd 2.x) may run on any image no container ever used: those are
/// kept until its status can be read.
#[tokio::test]
async fn a_pod_whose_status_cannot_be_read_keeps_every_never_used_image() {
    let (fake, old_pause) = a_pod_on_an_old_pause_image(Dialect::Containerd2);
    fake.fail_always(
        "PodSandboxStatus",
        Some(tonic::Status::deadline_exceeded("context deadline exceeded")),
    );
    let mut bed = bed(fake.clone(), &full_disk(), |_| {}).await;
    assert!(
        bed.removed_after_cycle().await.is_empty(),
        "removed while a pod's sandbox image was unknown"
    );
    assert!(
        bed.kept()
            .await
            .contains(&(old_pause.id.clone(), "sandbox-unknown".to_string()))
    );

    // Once the status can be read, the pod's own image is its sandbox image.
    fake.fail_always("PodSandboxStatus", None);
    assert!(bed.removed_after_cycle().await.is_empty());
    assert!(
        bed.kept()
            .await
            .contains(&(old_pause.id.clone(), "sandbox".to_string()))
    );
}

/// containerd 1.x names its current sandbox image in `Status`, and each
/// pod's in its verbose `PodSandboxStatus`: a pod started on the sandbox
/// image the runtime was configured away from keeps it.
#[tokio::test]
async fn a_pods_own_sandbox_image_is_kept_whatever_status_names() {
    let (fake, old_pause) = a_pod_on_an_old_pause_image(Dialect::Containerd);
    let mut bed = bed(fake.clone(), &full_disk(), |_| {}).await;
    assert!(bed.removed_after_cycle().await.is_empty());
    let kept = bed.kept().await;
    assert!(
        kept.contains(&(old_pause.id.clone(), "sandbox".to_string())),
        "{kept:?}"
    );
}

/// CRI-O names a container's image by a repo digest. After the tag moved
/// to a newer image, the old image's digest loses the registry's port
/// (`127.0.0.1@sha256:…` for `127.0.0.1:5000/move`): the container still
/// uses the old image, by its digest, and not the new one.
#[tokio::test]
async fn crio_digests_match_by_the_digest_whatever_the_name_before_it() {
    let fake = FakeRuntime::new();
    fake.set_dialect(Dialect::Crio136);
    let digest = |c: char| format!("sha256:{}", c.to_string().repeat(64));
    let old = Image {
        id: image_id("old"),
        repo_tags: Default::default(),
        repo_digests: vec![format!("127.0.0.1:5000/move@{}", digest('a'))].into(),
        size: 100_000,
        pinned: false,
    };
    let new = Image {
        id: image_id("new"),
        repo_tags: vec!["127.0.0.1:5000/move:latest".to_string()].into(),
        repo_digests: vec![format!("127.0.0.1:5000/move@{}", digest('b'))].into(),
        size: 100_000,
        pinned: false,
    };
    fake.add_image(old.clone());
    fake.add_image(new.clone());
    fake.add_container(Container {
        id: "c1".to_string(),
        image: "127.0.0.1:5000/move:latest".to_string(),
        image_ref: format!("127.0.0.1@{}", digest('a')),
        ..Default::default()
    });
    // A `name:tag@digest` reference, no id: the digest decides.
    let pinned_ref = image("pinned-ref", 100_000);
    fake.add_image(pinned_ref.clone());
    fake.add_container(Container {
        id: "c2".to_string(),
        image: format!("registry.example.com/team/pinned-ref:1.0@{}", image_id("pinned-ref")),
        ..Default::default()
    });
    let mut bed = bed(fake.clone(), &full_disk(), |_| {}).await;
    let kept = bed.kept().await;
    assert!(kept.contains(&(old.id.clone(), "in-use".to_string())), "{kept:?}");
    assert!(
        kept.contains(&(pinned_ref.id.clone(), "in-use".to_string())),
        "{kept:?}"
    );
    assert!(!kept.iter().any(|(id, _)| *id == new.id), "{kept:?}");
    let report = bed.collector.cycle(&CancellationToken::new()).await;
    assert_eq!(fake.removed(), std::slice::from_ref(&new.id), "{report:?}");
}

/// CRI-O lists bare-hex ids. A protect pattern written as the README shows
/// (`sha256:<prefix>*`) protects the image there too.
#[tokio::test]
async fn protect_patterns_on_ids_hold_on_crio() {
    let fake = FakeRuntime::new();
    fake.set_dialect(Dialect::Crio136);
    let keep = image("keep", 100_000);
    let other = image("other", 100_000);
    fake.add_image(keep.clone());
    fake.add_image(other.clone());
    let pattern = format!("{}*", &keep.id[..19]);
    let mut bed = bed(fake.clone(), &full_disk(), |c| c.protect.images = vec![pattern]).await;
    assert_eq!(
        bed.removed_after_cycle().await,
        std::slice::from_ref(&other.id),
        "removed by its sha256: id, which CRI-O lists bare"
    );
    assert!(fake.images().iter().any(|i| i.id == keep.id));
}

/// An image mounted as a volume (KEP-4639) shows only in
/// `ContainerStatus`: a name on containerd 2.x, the bare id on CRI-O. It
/// is in use like a container's own image, also at the re-check right
/// before a removal.
#[tokio::test]
async fn an_image_mounted_as_a_volume_is_in_use() {
    for dialect in [Dialect::Containerd2, Dialect::Crio136] {
        let fake = FakeRuntime::new();
        fake.set_dialect(dialect);
        fake.add_pod("pod-1");
        let app = image("app", 100_000);
        let data = image("data", 100_000);
        let early = image("early", 100_000);
        let late = image("late", 100_000);
        for i in [&app, &data, &early, &late] {
            fake.add_image(i.clone());
        }
        let name_or_id = |i: &Image| match dialect {
            Dialect::Crio136 => i.id.trim_start_matches("sha256:").to_string(),
            _ => i.repo_tags.first().unwrap().to_owned(),
        };
        fake.add_container(Container {
            id: "c1".to_string(),
            image: app.repo_tags.first().unwrap().to_owned(),
            image_ref: app.id.clone(),
            mounted_images: vec![name_or_id(&data)],
            ..Default::default()
        });
        // While `early` is removed, a container mounting `late` starts:
        // the re-check before `late` must see its mount.
        let (hook_fake, late_mount) = (fake.clone(), name_or_id(&late));
        fake.hook_before_remove(Box::new(move |_| {
            hook_fake.add_container(Container {
                id: "c2".to_string(),
                image: app_tag(),
                mounted_images: vec![late_mount.clone()],
                ..Default::default()
            });
        }));
        let mut bed = bed(fake.clone(), &full_disk(), |_| {}).await;
        let removed = bed.removed_after_cycle().await;
        assert_eq!(removed, std::slice::from_ref(&early.id), "{dialect:?}");
        let kept = bed.kept().await;
        for id in [&app.id, &data.id, &late.id] {
            assert!(
                kept.contains(&(id.clone(), "in-use".to_string())),
                "{dialect:?}: {kept:?}"
            );
        }
        // One ContainerStatus per container, not per listing.
        assert_eq!(fake.count("ContainerStatus"), 2, "{dialect:?}");
    }
}

/// containerd 2.x names an image volume by the reference the pod gave: a
/// tag. When the tag moves to another image while the pod runs, the
/// container still mounts the image it started with.
#[tokio::test]
async fn an_image_volume_named_by_a_tag_stays_in_use_after_the_tag_moves() {
    let fake = FakeRuntime::new();
    fake.set_dialect(Dialect::Containerd2);
    fake.add_pod("pod-1");
    let app = image("app", 100_000);
    let data = image("data", 100_000);
    for i in [&app, &data] {
        fake.add_image(i.clone());
    }
    fake.add_container(Container {
        id: "c1".to_string(),
        image: app.repo_tags.first().unwrap().to_owned(),
        image_ref: app.id.clone(),
        mounted_images: vec![data.repo_tags.first().unwrap().to_owned()],
        ..Default::default()
    });
    let mut bed = bed(fake.clone(), &full_disk(), |_| {}).await;
    assert!(bed.removed_after_cycle().await.is_empty());
    // The tag moves to a newer image: the old one keeps only its digest.
    let newer = Image {
        id: image_id("data-2"),
        ..data.clone()
    };
    fake.remove_image_by_id(&data.id);
    fake.add_image(Image {
        repo_tags: Default::default(),
        ..data.clone()
    });
    fake.add_image(newer.clone());
    let removed = bed.removed_after_cycle().await;
    assert!(
        !removed.contains(&data.id),
        "the image the running container mounts was removed when its tag moved"
    );
}

fn app_tag() -> String {
    image("app", 0).repo_tags.first().unwrap().to_owned()
}

/// The cycle's `usage_before` is the usage before anything was removed,
/// also when the age pass frees space.
#[tokio::test]
async fn usage_before_is_measured_before_the_age_pass() {
    let fake = FakeRuntime::new();
    let old = image("old", 400_000);
    fake.add_image(old.clone());
    let disk = SimDisk::new(1_000_000, 500_000);
    disk.occupy(&old.id, 400_000);
    fake.on_remove(Some(disk.free_on_remove()));
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let client = connect(&server.endpoint(), support::PATIENCE).unwrap();
    let mut config = support::config(&dir.path().join("state"));
    config.gc.max_age = std::time::Duration::from_secs(60);
    let now = std::time::SystemTime::now();
    let long_ago = now - std::time::Duration::from_secs(7200);
    let records = support::records([support::history(&old, long_ago, long_ago)]);
    imagegc::store::state::StateStore::new(&config.state.dir)
        .save(&records, now)
        .unwrap();
    let mut collector = support::collector(client, &disk, &config);
    let report = collector.cycle(&CancellationToken::new()).await;
    assert_eq!(fake.removed(), std::slice::from_ref(&old.id));
    assert_eq!(report.before.map(|s| s.usage_percent()), Some(50));
    assert_eq!(report.after.map(|s| s.usage_percent()), Some(10));
}
