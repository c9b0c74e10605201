//! Odd but possible runtime data: duplicate listings, dangling images, a tag
//! that moves between images, containers naming images that do not exist,
//! sizes of zero or of absurd magnitude, a filesystem reporting no capacity.
//! The planner cases are table-driven; the rest run whole cycles over the
//! fake runtime, listing whatever a test says (an id twice included).

use std::time::{Duration, SystemTime};

use imagegc::cri::Snapshot;
use imagegc::cri::{Container, Image};
use imagegc::engine::Outcome;
use imagegc::policy::{self, GcPolicy, KeepReason, Reason};
use imagegc::records::Records;
use imagegc::store::state::StateStore;
use imagegc_testkit::fake::FakeRuntime;

use crate::support::{self, Bed, DiskEffects, ServedOnThread, SimDisk, container_using, describe, image, imagegc};

/// The fake runtime listing `images` as they are (an id listed twice
/// included), with `containers`, each removal freeing on `disk` what the
/// image occupies there; served, with a collector over it (see [`Bed`]).
async fn scripted(
    images: Vec<Image>,
    containers: Vec<Container>,
    disk: &SimDisk,
    configure: impl FnOnce(&mut imagegc::config::Config),
) -> Bed {
    let fake = FakeRuntime::new();
    let mut ids: Vec<String> = Vec::new();
    for image in images {
        if ids.contains(&image.id) {
            fake.add_listing(image);
        } else {
            ids.push(image.id.clone());
            fake.add_image(image);
        }
    }
    for container in containers {
        fake.add_container(container);
    }
    fake.on_remove(Some(disk.free_on_remove()));
    Bed::serve(fake, disk.clone(), support::PATIENCE, configure).await
}

fn dangling(name: &str, size: u64) -> Image {
    Image {
        repo_tags: Default::default(),
        repo_digests: Default::default(),
        ..image(name, size)
    }
}

fn with_tags(name: &str, tags: &[&str]) -> Image {
    Image {
        repo_tags: tags.iter().map(ToString::to_string).collect(),
        ..image(name, 100)
    }
}

fn ids(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| image(n, 0).id).collect()
}

#[test]
fn the_planner_on_odd_listings() {
    struct Case {
        name: &'static str,
        images: Vec<Image>,
        containers: Vec<Container>,
        space: &'static [&'static str],
        in_use: &'static [&'static str],
    }
    let unknown = |id: &str, image: &str, image_ref: &str, image_id: &str| Container {
        id: id.to_string(),
        image: image.to_string(),
        image_ref: image_ref.to_string(),
        image_id: image_id.to_string(),
        ..Default::default()
    };
    let cases = vec![
        Case {
            name: "an id listed twice is planned once",
            images: vec![image("a", 100), with_tags("a", &["other:1"]), image("b", 100)],
            containers: vec![],
            space: &["a", "b"],
            in_use: &[],
        },
        Case {
            name: "a container naming the second listing's tag keeps the id",
            images: vec![image("a", 100), with_tags("a", &["other:1"]), image("b", 100)],
            containers: vec![unknown("c", "other:1", "", "")],
            space: &["b"],
            in_use: &["a"],
        },
        Case {
            name: "a dangling image (no tag, no digest) is a candidate",
            images: vec![dangling("d", 100), image("b", 100)],
            containers: vec![],
            space: &["b", "d"],
            in_use: &[],
        },
        Case {
            name: "containers naming unknown or empty references change nothing",
            images: vec![image("a", 100)],
            containers: vec![
                unknown("c1", "nowhere:1", "sha256:ffff", "sha256:eeee"),
                unknown("c2", "", "", ""),
                unknown("c3", "@", ":", "sha256:"),
                unknown("c5", &"x".repeat(100_000), "::::@@@@", "\u{0}\u{ffff}"),
            ],
            space: &["a"],
            in_use: &[],
        },
        Case {
            name: "a container that may run, naming a tag of a repository that nothing listed carries, keeps the \
                   repository's images: it could mean any of them",
            images: vec![image("a", 100), image("b", 100)],
            containers: vec![unknown(
                "c4",
                "registry.example.com/team/a",
                "docker.io/library/a:1.0",
                "a",
            )],
            space: &["b"],
            in_use: &["a"],
        },
        Case {
            name: "a size of 0 is still a candidate",
            images: vec![image("z", 0), image("b", 100)],
            containers: vec![],
            space: &["b", "z"],
            in_use: &[],
        },
        Case {
            name: "one tag on two images (mid-move): a container naming it keeps both",
            images: vec![
                with_tags("old", &["app:v1"]),
                with_tags("new", &["app:v1"]),
                image("b", 1),
            ],
            containers: vec![unknown("c", "app:v1", "", "")],
            space: &["b"],
            in_use: &["new", "old"],
        },
        Case {
            name: "sizes of u64::MAX are planned without overflow",
            images: vec![image("h1", u64::MAX), image("h2", u64::MAX)],
            containers: vec![],
            space: &["h1", "h2"],
            in_use: &[],
        },
    ];
    for case in cases {
        let snapshot = Snapshot {
            images: case.images,
            containers: case.containers,
            sandbox_images: vec!["registry.k8s.io/pause:3.9".to_string()],
            sandbox_pods_unread: None,
        };
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut records = Records::new();
        records.observe(&snapshot.images, &snapshot.containers, t0);
        let config = support::config(std::path::Path::new("/nonexistent"));
        let gc_policy = GcPolicy::from(&config);
        let plan = policy::plan(&snapshot, &records, &gc_policy, t0 + Duration::from_secs(60), t0);
        let mut space: Vec<String> = plan.space.iter().map(|c| c.id.to_string()).collect();
        space.sort();
        let mut expected = ids(case.space);
        expected.sort();
        assert_eq!(space, expected, "{}: space candidates", case.name);
        let mut in_use: Vec<String> = plan
            .kept
            .iter()
            .filter(|k| matches!(k.why, KeepReason::InUse { .. }))
            .map(|k| k.id.to_string())
            .collect();
        in_use.sort();
        let mut expected = ids(case.in_use);
        expected.sort();
        assert_eq!(in_use, expected, "{}: in use", case.name);
        assert!(plan.age.is_empty(), "{}", case.name);
    }
}

#[tokio::test]
async fn an_image_listed_twice_is_removed_once() {
    let disk = SimDisk::new(1000, 0);
    for name in ["a", "b"] {
        disk.occupy(&image(name, 0).id, 100);
    }
    let mut bed = scripted(
        vec![image("a", 100), with_tags("a", &["other:1"]), image("b", 100)],
        vec![],
        &disk,
        |_| {},
    )
    .await;
    let report = bed.cycle().await;
    // 200 bytes come back, 200 were needed.
    assert_eq!(report.outcome, Outcome::Success);
    assert_eq!(bed.fake.removed(), ids(&["a", "b"]));
    assert_eq!(report.removed.len(), 2);
}

#[tokio::test]
async fn a_tag_moving_to_a_new_image_keeps_records_by_id_and_the_container_keeps_only_its_image() {
    let disk = SimDisk::new(1000, 900);
    let old = with_tags("old", &["registry.example.com/team/app:v1"]);
    disk.occupy(&old.id, 400);
    let mut bed = scripted(vec![old.clone()], vec![container_using("c1", &old)], &disk, |_| {}).await;
    bed.cycle().await;
    let old_first_seen = bed.collector.records().get(&old.id).unwrap().first_seen;

    // `app:v1` is pulled again and now names a new image; the old one is
    // dangling but its container (by image_ref, the id) still exists. The
    // disk is full.
    let new = with_tags("new", &["registry.example.com/team/app:v1"]);
    disk.occupy(&new.id, 400);
    bed.fake.remove_image_by_id(&old.id);
    bed.fake.add_image(dangling("old", 100));
    bed.fake.add_image(new.clone());
    disk.set_available(0);
    // The container names the old image by id: that one stays; the tag's
    // new image is not in use, and is enough to free.
    let report = bed.cycle().await;
    assert_eq!(report.outcome, Outcome::Success);
    assert_eq!(
        bed.fake.removed(),
        std::slice::from_ref(&new.id),
        "the container's image (by id) stays; the tag's new image, unused, goes"
    );
    let old_record = bed.collector.records().get(&old.id).unwrap();
    assert_eq!(old_record.first_seen, old_first_seen, "the record stays keyed by id");
    assert!(old_record.tags.is_empty(), "the record follows the tag move");
    assert!(bed.collector.records().get(&new.id).is_none());

    // The pod goes: the old image goes too.
    bed.fake.remove_container("c1");
    disk.set_available(0);
    let report = bed.cycle().await;
    assert_eq!(report.outcome, Outcome::Success);
    assert_eq!(bed.fake.removed(), [new.id.clone(), old.id.clone()]);
}

#[tokio::test]
async fn containers_naming_unknown_images_do_not_disturb_a_cycle() {
    let disk = SimDisk::new(1000, 0);
    disk.occupy(&image("a", 0).id, 500);
    let weird = |id: &str, r: &str| Container {
        id: id.to_string(),
        image: r.to_string(),
        image_ref: r.to_string(),
        image_id: r.to_string(),
        ..Default::default()
    };
    let mut bed = scripted(
        vec![image("a", 100), image("held", 100)],
        vec![
            weird("c1", "sha256:does-not-exist"),
            weird("c2", ""),
            weird("c3", "@@::"),
            container_using("c4", &image("held", 0)),
        ],
        &disk,
        |_| {},
    )
    .await;
    let report = bed.cycle().await;
    assert_eq!(report.outcome, Outcome::Success);
    assert_eq!(bed.fake.removed(), ids(&["a"]));
}

#[tokio::test]
async fn a_size_of_zero_still_frees_what_the_disk_measures() {
    // The runtime reports 0 bytes; the image really holds 300.
    let disk = SimDisk::new(1000, 0);
    disk.occupy(&image("z", 0).id, 300);
    let mut bed = scripted(vec![image("z", 0)], vec![], &disk, |_| {}).await;
    let report = bed.cycle().await;
    assert_eq!(
        report.outcome,
        Outcome::Success,
        "the measured disk says low is reached"
    );
    assert_eq!(bed.fake.removed(), ids(&["z"]));
    assert_eq!(report.removed[0].size, 0);
    assert_eq!(report.removed[0].freed_bytes, Some(300));
}

#[tokio::test]
async fn past_the_eviction_line_a_size_of_zero_stops_the_walk_on_what_the_disk_shows() {
    // The same, past the kubelet's eviction line (15 %), beside another
    // image of size 0 that is not needed: the estimate counts nothing for
    // either, the reading taken right after the first removal shows low
    // reached.
    let disk = SimDisk::new(1000, 0);
    disk.occupy(&image("a", 0).id, 300);
    disk.occupy(&image("b", 0).id, 100);
    let mut bed = scripted(vec![image("a", 0), image("b", 0)], vec![], &disk, |config| {
        config.eviction_imagefs_available = Some(imagegc::config::EvictionThreshold::Percent(15.0));
    })
    .await;
    let report = bed.cycle().await;
    assert!(report.hurried);
    assert_eq!(report.outcome, Outcome::Success);
    assert_eq!(bed.fake.removed(), ids(&["a"]), "b was not needed");
    assert_eq!(report.removed[0].freed_bytes, None, "not measured one by one");
    assert_eq!(report.after.unwrap().available_bytes, 300);
}

#[tokio::test]
async fn a_filesystem_of_zero_capacity_fails_the_cycle_and_nothing_goes_for_space() {
    let disk = SimDisk::new(1000, 0);
    disk.report_zero_capacity();
    let old = image("old", 100);
    // One image unused for two hours by a history the collector trusts.
    let state = tempfile::tempdir().unwrap();
    let two_hours_ago = SystemTime::now() - Duration::from_secs(7200);
    StateStore::new(state.path())
        .save(
            &support::records([support::history(&old, two_hours_ago, two_hours_ago)]),
            SystemTime::now(),
        )
        .unwrap();
    let mut bed = scripted(
        vec![old.clone(), image("a", 100), image("b", 100)],
        vec![],
        &disk,
        |config| {
            config.state.dir = state.path().to_path_buf();
            config.gc.max_age = Duration::from_secs(3600);
        },
    )
    .await;
    let report = bed.cycle().await;
    match &report.outcome {
        Outcome::Failed(err) => assert!(err.to_string().contains("capacity of 0"), "{err}"),
        other => panic!("expected a failed cycle, got {other:?}"),
    }
    // Age removal does not depend on the disk; space removal does.
    assert_eq!(bed.fake.removed(), std::slice::from_ref(&old.id));
    assert!(report.removed.iter().all(|r| r.reason == Reason::Age));
    assert!(!report.space_pass);
}

/// A dangling image reads `<none>` in `imagegc images` and is a candidate
/// in `imagegc plan`; sizes of u64::MAX do not overflow what `plan` adds up.
#[test]
fn dangling_images_show_as_none_and_absurd_sizes_do_not_overflow_plan() {
    let fake = FakeRuntime::new();
    fake.add_image(dangling("d", 5_000));
    fake.add_image(image("h1", u64::MAX));
    fake.add_image(image("h2", u64::MAX));
    let served = ServedOnThread::start(fake);
    let dir = tempfile::tempdir().unwrap();
    let state_dir = dir.path().join("state");
    // h1 and h2 are old by a trusted history: age candidates, summed by plan.
    let long_ago = SystemTime::now() - Duration::from_secs(86_400);
    StateStore::new(&state_dir)
        .save(
            &support::records(["h1", "h2"].map(|n| support::history(&image(n, u64::MAX), long_ago, long_ago))),
            SystemTime::now(),
        )
        .unwrap();
    let config = dir.path().join("imagegc.toml");
    std::fs::write(
        &config,
        format!(
            "[gc]\nhigh_threshold_percent = 1\nlow_threshold_percent = 0\nmin_age = \"0s\"\nmax_age = \"1h\"\n\
             image_fs_path = {:?}\n\n[metrics]\nlisten = \"\"\n",
            dir.path().display().to_string()
        ),
    )
    .unwrap();
    let short = imagegc::cli::short_id(&image("d", 0).id);

    let output = support::run(imagegc(&config, &served.endpoint, &state_dir).arg("images"));
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.lines().any(|l| l.starts_with(&short) && l.contains("<none>")),
        "{}",
        describe(&output)
    );

    let output = support::run(imagegc(&config, &served.endpoint, &state_dir).args(["plan", "--output", "table"]));
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let output = support::run(imagegc(&config, &served.endpoint, &state_dir).args(["plan", "--output", "json"]));
    assert_eq!(output.status.code(), Some(0), "{}", describe(&output));
    let plan: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    // The runtime's used bytes (the sizes added up, saturated) are more
    // than the filesystem holds: not believed, the listing's estimate is.
    assert_eq!(
        plan["image_filesystem"]["image_bytes"]["source"],
        "listing",
        "{}",
        describe(&output)
    );
    let reasons: Vec<(String, String)> = plan["removals"]
        .as_array()
        .unwrap()
        .iter()
        .chain(plan["further_space_candidates"].as_array().unwrap())
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_string(),
                c["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = [("h1", "age"), ("h2", "age"), ("d", "space")]
        .iter()
        .map(|(n, r)| (image(n, 0).id, r.to_string()))
        .collect();
    assert_eq!(reasons, expected, "{}", describe(&output));
}
