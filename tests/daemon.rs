//! The daemon as a user meets it: the loop (`imagegc::daemon::run`) driven
//! in-process against the fake CRI runtime and a simulated disk, and the
//! `imagegc` binary run as a child process against the same fake, checked
//! through its state file, its journal, `/metrics`, `/readyz`, its exit
//! status and its log.

#[path = "daemon/support.rs"]
mod support;

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant, SystemTime};

use imagegc::cri::proto::ContainerEventType;
use imagegc::records::{Record, Records};
use imagegc::state::{Loaded, StateStore};
use imagegc_testkit::fake::{Dialect, Events, FakeRuntime};
use support::{
    Daemon, DiskEffects, InProcess, Settings, SimDisk, container_using, eventually, free_local_addr, image,
    imagegc_json, load_records, metric,
};

const SECOND: Duration = Duration::from_secs(1);

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// A disk at 10% usage: below every high threshold the tests use.
fn roomy_disk() -> SimDisk {
    SimDisk::new(1_000_000, 900_000)
}

fn parse_time(value: &serde_json::Value) -> SystemTime {
    humantime::parse_rfc3339(value.as_str().expect("a time string")).expect("an RFC 3339 time")
}

fn ids(list: &[String]) -> BTreeSet<&str> {
    list.iter().map(String::as_str).collect()
}

// ---------------------------------------------------------------------------
// Restarts.

#[tokio::test]
async fn a_restart_keeps_the_time_each_image_was_last_used() {
    let fake = FakeRuntime::new();
    let web = image("web", 1000);
    let idle = image("idle", 1000);
    fake.add_image(web.clone());
    fake.add_image(idle.clone());
    fake.add_container(container_using("c-web", &web));
    let started = SystemTime::now();
    let mut daemon = InProcess::start(fake.clone(), roomy_disk(), |_| {}, |c| c.gc.interval = secs(3600)).await;

    // The first cycle and one poll see web in use; then its container goes.
    eventually(secs(5), "the first cycle and a poll", || {
        (fake.count("ListContainers") >= 2).then_some(())
    })
    .await;
    fake.remove_container("c-web");
    let polls = fake.count("ListContainers");
    eventually(secs(5), "a poll without the container", || {
        (fake.count("ListContainers") > polls).then_some(())
    })
    .await;
    // The daemon handled the last listing with the container before it
    // asked for this one.
    let unused_since = SystemTime::now();
    daemon.stop().await;

    let records = load_records(&daemon.state_dir());
    let saved = records.get(&web.id).expect("a record for web");
    assert!(
        saved.last_used >= started && saved.last_used <= unused_since,
        "web was last used between {started:?} and {unused_since:?}, the state says {:?}",
        saved.last_used
    );

    // Later, a new process reads the same state: `imagegc plan` shows web
    // last used when its container went, not when the new process started.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let config = daemon.dir.path().join("imagegc.toml");
    Settings {
        interval: "1h",
        ..Settings::new(daemon.dir.path()).remove_everything()
    }
    .write(&config);
    let endpoint = daemon.server.as_ref().unwrap().endpoint();
    let plan = imagegc_json(&config, &endpoint, &daemon.state_dir(), &["plan"], 0).await;
    let removals = plan["removals"].as_array().expect("removals");
    let planned = |id: &str| {
        removals
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("{id} is not planned for removal: {plan:#}"))
    };
    let last_used = parse_time(&planned(&web.id)["last_used"]);
    // The plan prints whole seconds.
    assert!(
        last_used + SECOND >= started && last_used <= unused_since,
        "plan says web was last used at {last_used:?}, expected between {started:?} and {unused_since:?}"
    );
    assert!(SystemTime::now().duration_since(last_used).unwrap() >= secs(2));
    let idle_first_seen = parse_time(&planned(&idle.id)["first_seen"]);
    assert!(
        idle_first_seen + SECOND >= started && idle_first_seen <= unused_since,
        "idle keeps the time it was first seen: {idle_first_seen:?}"
    );
    assert!(fake.removed().is_empty(), "plan removes nothing");
}

// ---------------------------------------------------------------------------
// The age guard.

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
    let history = Records::from_map(HashMap::from([(
        old.id.clone(),
        Record {
            first_seen: hour_ago,
            last_used: hour_ago,
            size: old.size,
            pinned: false,
            tags: old.repo_tags.clone(),
            digests: old.repo_digests.clone(),
            from_history: false,
            ever_used: false,
        },
    )]));

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

// ---------------------------------------------------------------------------
// Usage between cycles: polling and container events.

/// By default imagegc never subscribes to container events, even where
/// the runtime streams them: containerd 1.7 and CRI-O 1.26 split one queue
/// between subscribers, so a subscription takes events from the kubelet.
#[tokio::test]
async fn without_container_events_containers_are_polled_between_cycles() {
    let fake = FakeRuntime::new();
    fake.set_events(Events::Shared);
    let app = image("app", 1000);
    fake.add_image(app.clone());
    let mut daemon = InProcess::start(fake.clone(), roomy_disk(), |_| {}, |c| c.gc.interval = secs(3600)).await;

    eventually(secs(5), "the first cycle", || {
        (fake.count("ListImages") >= 1).then_some(())
    })
    .await;
    let before = fake.count("ListContainers");
    let polling_since = Instant::now();
    eventually(secs(5), "two polls", || {
        (fake.count("ListContainers") >= before + 2).then_some(())
    })
    .await;
    assert!(
        polling_since.elapsed() >= Duration::from_millis(900),
        "polled every second, not faster"
    );
    assert_eq!(fake.count("ImageFsInfo"), 1, "one cycle, then only polling");
    assert!(
        fake.count("ListImages") > 1,
        "a poll lists images too, so an image's first sighting is not a whole interval late"
    );
    assert_eq!(
        fake.count("GetContainerEvents"),
        0,
        "no event stream is opened by default"
    );

    // A container that runs between cycles is seen by the next poll.
    fake.add_container(container_using("c-app", &app));
    let added = SystemTime::now();
    let polls = fake.count("ListContainers");
    eventually(secs(5), "a poll that sees the container", || {
        (fake.count("ListContainers") > polls).then_some(())
    })
    .await;
    fake.remove_container("c-app");
    daemon.stop().await;
    let last_used = load_records(&daemon.state_dir()).get(&app.id).unwrap().last_used;
    assert!(
        last_used + Duration::from_millis(100) >= added,
        "app was used at {added:?}; the state says {last_used:?}"
    );
}

/// Every runtime sends the event stream's response headers only with the
/// first event. On an idle node the open never completes: cycles, polls and
/// shutdown must go on regardless.
#[tokio::test]
async fn an_event_stream_that_never_answers_stalls_nothing() {
    let fake = FakeRuntime::new();
    fake.set_events(Events::Broadcast);
    fake.add_image(image("app", 1000));
    let mut daemon = InProcess::start(
        fake.clone(),
        roomy_disk(),
        |_| {},
        |c| {
            c.runtime.container_events = true;
            c.gc.interval = Duration::from_millis(500);
        },
    )
    .await;
    eventually(secs(5), "the event stream waiting for its first event", || {
        (fake.event_subscribers() == 1).then_some(())
    })
    .await;
    let cycles = fake.count("ListImages");
    eventually(secs(5), "three more cycles while the stream waits", || {
        (fake.count("ListImages") >= cycles + 3).then_some(())
    })
    .await;
    let asked = Instant::now();
    daemon.stop().await;
    assert!(asked.elapsed() < secs(5), "shutdown took {:?}", asked.elapsed());
    assert!(StateStore::new(daemon.state_dir()).path().exists(), "state saved");
}

/// SIGTERM while a cycle waits on a hung runtime call (no removal in
/// flight): the daemon stops within seconds, with its state saved, instead
/// of waiting for the call's deadline.
#[tokio::test]
async fn shutdown_does_not_wait_for_a_hung_listing() {
    let fake = FakeRuntime::new();
    fake.add_image(image("app", 1000));
    let mut daemon = InProcess::start(
        fake.clone(),
        roomy_disk(),
        |_| {},
        |c| c.gc.interval = Duration::from_millis(300),
    )
    .await;
    eventually(secs(5), "a first cycle", || {
        (fake.count("ListImages") >= 1).then_some(())
    })
    .await;
    fake.delay("ListImages", secs(60));
    fake.delay("ListContainers", secs(60));
    let listings = fake.count("ListImages");
    eventually(secs(5), "a cycle hung in ListImages", || {
        (fake.count("ListImages") > listings).then_some(())
    })
    .await;
    let asked = Instant::now();
    daemon.stop().await;
    assert!(asked.elapsed() < secs(5), "shutdown took {:?}", asked.elapsed());
    assert!(StateStore::new(daemon.state_dir()).path().exists(), "state saved");
}

/// SIGTERM right after the runtime answered a removal, while imagegc
/// measures what it freed: the removal is finished, journaled and recorded
/// before the daemon stops, not abandoned as if nothing had been removed.
#[tokio::test]
async fn shutdown_right_after_a_removal_still_journals_it() {
    let fake = FakeRuntime::new();
    let old = image("old", 1000);
    fake.add_image(old.clone());
    // A full disk that removals do not free: the collector watches the
    // filesystem for up to a second after each removal.
    let disk = SimDisk::new(1_000_000, 10_000);
    let mut daemon = InProcess::start(
        fake.clone(),
        disk,
        |_| {},
        |c| {
            c.gc.interval = secs(3600);
            c.gc.high_threshold_percent = 90;
            c.gc.low_threshold_percent = 50;
        },
    )
    .await;
    eventually(secs(5), "the removal", || (!fake.removed().is_empty()).then_some(())).await;
    daemon.stop().await;
    let journal = imagegc::journal::Journal::new(&daemon.state_dir()).read(None).unwrap();
    let journaled: Vec<&str> = journal.iter().map(|e| e.image.as_str()).collect();
    assert_eq!(
        journaled,
        [old.id.as_str()],
        "the removal the runtime made is journaled"
    );
    assert!(
        load_records(&daemon.state_dir()).get(&old.id).is_none(),
        "and its record is gone"
    );
}

/// containerd replays recent events to a new subscriber (1.7: up to 1000;
/// 2.x: the last five minutes). The replayed events count at their own
/// times, and a burst costs one container listing, not one per event.
#[tokio::test]
async fn a_replayed_backlog_counts_at_its_own_time_and_costs_one_listing() {
    let fake = FakeRuntime::new();
    fake.set_events(Events::Shared);
    let old = image("old", 1000);
    fake.add_image(old.clone());
    let ten_minutes_ago = SystemTime::now() - secs(600);
    let backlog = (0..300)
        .map(|n| FakeRuntime::event(&format!("c-{n}"), &old.repo_tags[0], ten_minutes_ago))
        .collect();
    let history = Record {
        first_seen: SystemTime::now() - secs(3600),
        last_used: SystemTime::now() - secs(3600),
        size: 1000,
        pinned: false,
        tags: old.repo_tags.clone(),
        digests: Vec::new(),
        from_history: true,
        ever_used: false,
    };
    let mut daemon = InProcess::start(
        fake.clone(),
        roomy_disk(),
        |state_dir| {
            std::fs::create_dir_all(state_dir).unwrap();
            let records = Records::from_map([(old.id.clone(), history)]);
            StateStore::new(state_dir).save(&records, SystemTime::now()).unwrap();
        },
        |c| {
            c.runtime.container_events = true;
            c.gc.interval = secs(3600);
            c.gc.usage_poll_interval = secs(3600);
        },
    )
    .await;
    eventually(secs(5), "the first cycle", || {
        (fake.count("ListImages") >= 1).then_some(())
    })
    .await;
    fake.set_event_backlog(backlog);
    // The stream opened at start is waiting; the backlog goes to the next.
    let server = daemon.server.take().unwrap();
    daemon.server = Some(server.restart().await.unwrap());
    eventually(secs(10), "the backlog delivered", || {
        (fake.count("GetContainerEvents") >= 2 && fake.event_subscribers() == 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let listings = fake.count("ListContainers");
    daemon.stop().await;
    assert!(
        listings <= 4,
        "{listings} container listings for one burst of 300 events"
    );
    let last_used = load_records(&daemon.state_dir()).get(&old.id).unwrap().last_used;
    let off = last_used
        .duration_since(ten_minutes_ago)
        .unwrap_or_else(|e| e.duration());
    assert!(
        off < secs(5),
        "the replayed events happened ten minutes ago; last used is {last_used:?}, {off:?} from then"
    );
}

/// CRI-O with `enable_pod_events = false` (its default) ends the stream at
/// once: after a few tries imagegc polls for good, quietly.
#[tokio::test]
async fn a_stream_that_ends_at_once_falls_back_to_polling() {
    let fake = FakeRuntime::new();
    fake.set_dialect(Dialect::Crio136);
    fake.set_events(Events::EndAtOnce);
    fake.add_image(image("app", 1000));
    let _daemon = start_following_events(&fake).await;
    eventually(secs(15), "three empty streams", || {
        (fake.count("GetContainerEvents") >= 3).then_some(())
    })
    .await;
    let polls = fake.count("ListContainers");
    tokio::time::sleep(secs(3)).await;
    assert_eq!(
        fake.count("GetContainerEvents"),
        3,
        "the stream is not reopened once given up on"
    );
    assert!(
        fake.count("ListContainers") >= polls + 2,
        "containers are polled instead"
    );
}

/// The loop set to follow container events, with no cycle for an hour.
async fn start_following_events(fake: &FakeRuntime) -> InProcess {
    InProcess::start(
        fake.clone(),
        roomy_disk(),
        |_| {},
        |c| {
            c.runtime.container_events = true;
            c.gc.interval = secs(3600);
        },
    )
    .await
}

/// [`start_following_events`], once its event stream is open.
async fn following_events(fake: &FakeRuntime) -> InProcess {
    let daemon = start_following_events(fake).await;
    eventually(secs(5), "the event stream opened", || {
        (fake.count("GetContainerEvents") >= 1).then_some(())
    })
    .await;
    daemon
}

/// Emits one event once the daemon's event stream is subscribed: an event
/// emitted before that reaches no one.
async fn emit_when_streaming(fake: &FakeRuntime, container_id: &str, kind: ContainerEventType, images: &[&str]) {
    eventually(secs(10), "an open container event stream", || {
        (fake.emit_event(container_id, kind, images) > 0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn with_container_events_nothing_is_polled_and_an_event_triggers_a_relist() {
    let fake = FakeRuntime::new();
    fake.events_unimplemented(false);
    let app = image("app", 1000);
    fake.add_image(app.clone());
    let _daemon = following_events(&fake).await;
    let before = fake.count("ListContainers");
    tokio::time::sleep(secs(3)).await;
    assert_eq!(fake.count("ListContainers"), before, "no polling while events stream");

    fake.add_container(container_using("c-app", &app));
    emit_when_streaming(
        &fake,
        "c-app",
        ContainerEventType::ContainerStartedEvent,
        &[&app.repo_tags[0]],
    )
    .await;
    eventually(secs(5), "a container listing after the event", || {
        (fake.count("ListContainers") > before).then_some(())
    })
    .await;
    assert_eq!(
        fake.count("ImageFsInfo"),
        1,
        "an event re-lists containers (and images), it is not a cycle"
    );
}

#[tokio::test]
async fn an_image_used_only_between_listings_is_marked_used_by_its_event() {
    let fake = FakeRuntime::new();
    fake.events_unimplemented(false);
    let job = image("job", 1000);
    fake.add_image(job.clone());
    let mut daemon = following_events(&fake).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // A short job: created, run and deleted before imagegc lists containers.
    // Only its events tell that its image was used.
    let used = SystemTime::now();
    let before = fake.count("ListContainers");
    emit_when_streaming(
        &fake,
        "c-job",
        ContainerEventType::ContainerDeletedEvent,
        &[&job.repo_tags[0]],
    )
    .await;
    eventually(secs(5), "the event handled", || {
        (fake.count("ListContainers") > before).then_some(())
    })
    .await;
    daemon.stop().await;
    let last_used = load_records(&daemon.state_dir()).get(&job.id).unwrap().last_used;
    assert!(
        last_used + Duration::from_millis(100) >= used,
        "the job ran at {used:?}; the state says job was last used at {last_used:?}"
    );
}

#[tokio::test]
async fn the_event_stream_is_reopened_after_the_runtime_restarts() {
    let fake = FakeRuntime::new();
    fake.events_unimplemented(false);
    let app = image("app", 1000);
    fake.add_image(app.clone());
    let mut daemon = following_events(&fake).await;

    let server = daemon.server.take().unwrap();
    daemon.server = Some(server.restart().await.unwrap());
    eventually(secs(10), "the event stream reopened", || {
        (fake.count("GetContainerEvents") >= 2).then_some(())
    })
    .await;
    let before = fake.count("ListContainers");
    tokio::time::sleep(secs(2)).await;
    let settled = fake.count("ListContainers");
    emit_when_streaming(
        &fake,
        "c-app",
        ContainerEventType::ContainerCreatedEvent,
        &[&app.repo_tags[0]],
    )
    .await;
    eventually(secs(5), "a container listing after the event", || {
        (fake.count("ListContainers") > settled).then_some(())
    })
    .await;
    assert!(
        settled <= before + 1,
        "polling stops once the stream is back ({before} -> {settled})"
    );
    assert!(daemon.health.is_ready());
}

// ---------------------------------------------------------------------------
// The runtime going away.

#[tokio::test]
async fn a_runtime_that_goes_away_between_cycles_is_noticed_and_found_again() {
    let fake = FakeRuntime::new();
    fake.add_image(image("app", 1000));
    let mut daemon = InProcess::start(fake.clone(), roomy_disk(), |_| {}, |c| c.gc.interval = secs(3600)).await;
    eventually(secs(5), "ready", || daemon.health.is_ready().then_some(())).await;

    let server = daemon.server.take().unwrap();
    let socket = server.socket_path().to_path_buf();
    server.shutdown().await;
    eventually(secs(5), "not ready while the runtime is down", || {
        (!daemon.health.is_ready()).then_some(())
    })
    .await;
    eventually(secs(5), "imagegc_runtime_up 0 while the runtime is down", || {
        daemon.metrics.encode().contains("imagegc_runtime_up 0").then_some(())
    })
    .await;

    daemon.server = Some(fake.clone().serve(&socket).await.unwrap());
    eventually(secs(10), "ready again once the runtime is back", || {
        daemon.health.is_ready().then_some(())
    })
    .await;
    assert!(daemon.metrics.encode().contains("imagegc_runtime_up 1"));
}

#[tokio::test]
async fn a_runtime_that_is_down_at_start_is_retried_and_readiness_follows() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("cri.sock");
    let endpoint = format!("unix://{}", socket.display());
    let config = dir.path().join("imagegc.toml");
    let addr = free_local_addr();
    Settings {
        interval: "1h",
        listen: Some(addr),
        ..Settings::new(dir.path())
    }
    .write(&config);
    let mut daemon = Daemon::spawn(&config, &endpoint, &dir.path().join("state"), Some(addr));

    assert_eq!(daemon.get("/readyz").await.0, 503);
    assert_eq!(
        daemon.get("/healthz").await.0,
        200,
        "alive while waiting for the runtime"
    );
    // Two failed attempts: the first cycle and a retry.
    daemon.wait_logged("cycle failed", secs(5)).await;
    let deadline = Instant::now() + secs(5);
    while daemon.logged("cycle failed") < 2 {
        assert!(Instant::now() < deadline, "no retry:\n{}", daemon.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(daemon.get("/readyz").await.0, 503);
    assert_eq!(daemon.metric("imagegc_runtime_up").await, Some(0.0));

    let fake = FakeRuntime::new();
    fake.add_image(image("app", 1000));
    let _server = fake.clone().serve(&socket).await.unwrap();
    let deadline = Instant::now() + secs(10);
    while daemon.get("/readyz").await.0 != 200 {
        assert!(Instant::now() < deadline, "not ready:\n{}", daemon.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(fake.count("ListImages") > 0, "a cycle ran");
    assert_eq!(daemon.metric("imagegc_runtime_up").await, Some(1.0));
    assert_eq!(
        daemon.logged("container runtime is not reachable"),
        1,
        "one warning per change, not per retry:\n{}",
        daemon.stderr()
    );
    assert_eq!(daemon.logged("container runtime is reachable again"), 1);
}

// ---------------------------------------------------------------------------
// Dry run.

#[tokio::test]
async fn dry_run_in_the_configuration_removes_nothing_and_journals_what_it_would() {
    let fake = FakeRuntime::new();
    let (a, b) = (image("a", 1000), image("b", 1000));
    fake.add_image(a.clone());
    fake.add_image(b.clone());
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    let state = dir.path().join("state");
    let addr = free_local_addr();
    Settings {
        dry_run: true,
        listen: Some(addr),
        ..Settings::new(dir.path()).remove_everything()
    }
    .write(&config);
    let mut daemon = Daemon::spawn(&config, &server.endpoint(), &state, Some(addr));

    let deadline = Instant::now() + secs(10);
    while daemon.metric("imagegc_cycles_total{result=\"failure\"}").await < Some(1.0) {
        assert!(Instant::now() < deadline, "no cycle finished:\n{}", daemon.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(daemon.metric("imagegc_dry_run").await, Some(1.0));
    assert_eq!(
        daemon.metric("image_garbage_collected_total{reason=\"space\"}").await,
        Some(0.0)
    );
    assert_eq!(fake.count("RemoveImage"), 0);
    assert!(fake.removed().is_empty());

    let history = imagegc_json(&config, &server.endpoint(), &state, &["history"], 0).await;
    let entries = history.as_array().expect("a list of removals");
    let journaled: BTreeSet<&str> = entries.iter().filter_map(|e| e["image"].as_str()).collect();
    assert_eq!(journaled, BTreeSet::from([a.id.as_str(), b.id.as_str()]));
    assert!(entries.iter().all(|e| e["dry_run"] == true), "{history:#}");
}

#[tokio::test]
async fn once_with_dry_run_removes_nothing_and_journals_what_it_would() {
    let fake = FakeRuntime::new();
    let (a, b) = (image("a", 1000), image("b", 1000));
    fake.add_image(a.clone());
    fake.add_image(b.clone());
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    let state = dir.path().join("state");
    Settings::new(dir.path()).remove_everything().write(&config);

    // Low 0 cannot be reached: exit 3, after planning every candidate.
    let report = imagegc_json(&config, &server.endpoint(), &state, &["once", "--dry-run"], 3).await;
    assert_eq!(report["dry_run"], true);
    let would: BTreeSet<&str> = report["removed"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["id"].as_str())
        .collect();
    assert_eq!(would, BTreeSet::from([a.id.as_str(), b.id.as_str()]));
    assert_eq!(fake.count("RemoveImage"), 0);

    let history = imagegc_json(&config, &server.endpoint(), &state, &["history"], 0).await;
    let entries = history.as_array().unwrap();
    assert_eq!(entries.len(), 2, "{history:#}");
    assert!(entries.iter().all(|e| e["dry_run"] == true), "{history:#}");
}

// ---------------------------------------------------------------------------
// Metrics and probes.

#[tokio::test]
async fn metrics_after_a_cycle_that_removes_two_images_by_space() {
    let fake = FakeRuntime::new();
    let (a, b, web) = (image("a", 1000), image("b", 1000), image("web", 1000));
    for i in [&a, &b, &web] {
        fake.add_image(i.clone());
    }
    fake.add_container(container_using("c-web", &web));
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    let addr = free_local_addr();
    Settings {
        interval: "1h",
        listen: Some(addr),
        ..Settings::new(dir.path()).remove_everything()
    }
    .write(&config);
    let mut daemon = Daemon::spawn(&config, &server.endpoint(), &dir.path().join("state"), Some(addr));

    let deadline = Instant::now() + secs(10);
    let body = loop {
        let (status, body) = daemon.get("/metrics").await;
        assert_eq!(status, 200);
        if metric(&body, "imagegc_cycles_total{result=\"failure\"}") >= Some(1.0) {
            break body;
        }
        assert!(Instant::now() < deadline, "no cycle finished:\n{}", daemon.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let value = |series: &str| metric(&body, series).unwrap_or_else(|| panic!("no {series} in\n{body}"));
    // Low 0 is never reached: every unused image goes and the cycle fails.
    assert_eq!(value("image_garbage_collected_total{reason=\"space\"}"), 2.0);
    assert_eq!(value("image_garbage_collected_total{reason=\"age\"}"), 0.0);
    assert_eq!(value("imagegc_cycles_total{result=\"success\"}"), 0.0);
    assert_eq!(value("imagegc_runtime_up"), 1.0);
    assert_eq!(value("imagegc_images{state=\"in_use\"}"), 1.0);
    assert_eq!(value("imagegc_dry_run"), 0.0);
    assert_eq!(value("imagegc_high_threshold_ratio"), 0.01);
    assert!(value("imagegc_image_filesystem_capacity_bytes") > 0.0);
    assert_eq!(ids(&fake.removed()), BTreeSet::from([a.id.as_str(), b.id.as_str()]));
    assert_eq!(daemon.get("/readyz").await.0, 200);
    assert_eq!(daemon.get("/healthz").await.0, 200);
}

/// `imagegc_cri_requests_total{method,code}` says what the runtime saw:
/// every call, by method, with the failures under their gRPC code.
#[tokio::test]
async fn every_call_the_runtime_sees_is_counted_by_method_and_code() {
    let fake = FakeRuntime::new();
    fake.set_dialect(Dialect::Crio136);
    fake.set_events(Events::EndAtOnce);
    let app = image("app", 1000);
    fake.add_image(app.clone());
    fake.add_container(container_using("c-app", &app));
    fake.fail_next("ImageFsInfo", tonic::Status::internal("disk on fire"));
    let mut daemon = InProcess::start(
        fake.clone(),
        roomy_disk(),
        |_| {},
        |c| c.runtime.container_events = true,
    )
    .await;
    eventually(secs(15), "three cycles, the event stream given up on, polls", || {
        (fake.count("ListImages") >= 3 && fake.count("GetContainerEvents") >= 3 && fake.count("ListContainers") >= 6)
            .then_some(())
    })
    .await;
    daemon.stop().await;

    let scrape = daemon.metrics.encode();
    let counted = |method: &str, code: &str| {
        metric(
            &scrape,
            &format!("imagegc_cri_requests_total{{method=\"{method}\",code=\"{code}\"}}"),
        )
        .unwrap_or(0.0)
    };
    let mut seen: Vec<String> = fake.calls();
    seen.sort();
    seen.dedup();
    assert!(seen.len() >= 5, "the daemon made several kinds of call: {seen:?}");
    for method in &seen {
        let total: f64 = scrape
            .lines()
            .filter(|l| l.starts_with(&format!("imagegc_cri_requests_total{{method=\"{method}\",")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert_eq!(
            total,
            fake.count(method) as f64,
            "{method}: the runtime saw {}\n{scrape}",
            fake.count(method)
        );
    }
    assert_eq!(counted("ImageFsInfo", "Internal"), 1.0, "{scrape}");
    // A call that shutdown cut short is counted as cancelled: the runtime
    // saw it all the same.
    assert_eq!(
        counted("ImageFsInfo", "OK") + counted("ImageFsInfo", "Canceled"),
        fake.count("ImageFsInfo") as f64 - 1.0
    );
    assert_eq!(
        metric(
            &scrape,
            "imagegc_cri_request_duration_seconds_count{method=\"ListImages\"}"
        ),
        Some(fake.count("ListImages") as f64),
        "every call is timed too"
    );
}

#[tokio::test]
async fn a_restarted_daemon_reports_the_last_success_of_the_one_before_and_its_node() {
    let fake = FakeRuntime::new();
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let endpoint = server.endpoint();
    let config = dir.path().join("imagegc.toml");
    let addr = free_local_addr();
    Settings {
        interval: "1h",
        listen: Some(addr),
        ..Settings::new(dir.path())
    }
    .write(&config);
    let state = dir.path().join("state");
    let node = [("NODE_NAME", "worker-7")];

    let mut daemon = Daemon::spawn_with_env(&config, &endpoint, &state, Some(addr), &node);
    let deadline = Instant::now() + secs(10);
    let before = loop {
        let stamp = daemon.metric("imagegc_last_success_timestamp_seconds").await;
        if let Some(stamp) = stamp.filter(|s| *s > 0.0) {
            break stamp;
        }
        assert!(Instant::now() < deadline, "no successful cycle:\n{}", daemon.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(daemon.metric(r#"imagegc_node_info{node="worker-7"}"#).await, Some(1.0));
    daemon.signal(libc::SIGTERM);
    assert!(daemon.exited_within(secs(10)).await.is_some_and(|s| s.success()));

    // The runtime is down: the restarted daemon's cycles cannot succeed.
    server.shutdown().await;
    let mut daemon = Daemon::spawn_with_env(&config, &endpoint, &state, Some(addr), &node);
    let deadline = Instant::now() + secs(10);
    while daemon.metric(r#"imagegc_cycles_total{result="failure"}"#).await < Some(1.0) {
        assert!(Instant::now() < deadline, "no failed cycle:\n{}", daemon.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = daemon
        .metric("imagegc_last_success_timestamp_seconds")
        .await
        .expect("the last success");
    assert!(
        (after - before).abs() < 0.002,
        "last success {after} after the restart, {before} before it"
    );
}

// ---------------------------------------------------------------------------
// Signals.

/// A runtime with `n` unused images whose removal takes `removal` each.
fn slow_runtime(n: usize, removal: Duration) -> FakeRuntime {
    let fake = FakeRuntime::new();
    for i in 0..n {
        fake.add_image(image(&format!("img-{i:02}"), 1000));
    }
    fake.delay("RemoveImage", removal);
    fake
}

#[tokio::test]
async fn sigterm_in_the_middle_of_a_cycle_stops_after_the_current_removal_and_saves_state() {
    let fake = slow_runtime(20, Duration::from_millis(1500));
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    let state = dir.path().join("state");
    Settings {
        interval: "1h",
        ..Settings::new(dir.path()).remove_everything()
    }
    .write(&config);
    let mut daemon = Daemon::spawn(&config, &server.endpoint(), &state, None);

    eventually(secs(10), "the first removal", || {
        (fake.count("RemoveImage") >= 1).then_some(())
    })
    .await;
    daemon.signal(libc::SIGTERM);
    let status = daemon
        .exited_within(secs(10))
        .await
        .expect("exits within 10s of SIGTERM");
    assert!(status.success(), "{status}:\n{}", daemon.stderr());
    let removed = fake.removed();
    assert!(
        (1..=2).contains(&removed.len()),
        "stops after the removal in progress, removed {removed:?}"
    );
    assert_eq!(
        fake.count("RemoveImage"),
        removed.len(),
        "no removal was abandoned midway"
    );

    let records = load_records(&state);
    for image in fake.images() {
        assert!(records.get(&image.id).is_some(), "a record for {}", image.repo_tags[0]);
    }
    for id in &removed {
        assert!(records.get(id).is_none(), "no record for the removed {id}");
    }
    assert_eq!(records.len(), 20 - removed.len());
}

#[tokio::test]
async fn a_second_sigterm_exits_at_once() {
    let fake = slow_runtime(20, secs(5));
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    let state = dir.path().join("state");
    Settings {
        interval: "1h",
        ..Settings::new(dir.path()).remove_everything()
    }
    .write(&config);
    let mut daemon = Daemon::spawn(&config, &server.endpoint(), &state, None);

    eventually(secs(10), "the first removal", || {
        (fake.count("RemoveImage") >= 1).then_some(())
    })
    .await;
    daemon.signal(libc::SIGTERM);
    daemon.wait_logged("signal received", secs(5)).await;
    assert!(daemon.running(), "the first SIGTERM waits for the removal in progress");
    let second = Instant::now();
    daemon.signal(libc::SIGTERM);
    let status = daemon
        .exited_within(secs(2))
        .await
        .expect("exits within 2s of the second SIGTERM");
    assert!(second.elapsed() < secs(2));
    assert!(!status.success(), "{status}");
    assert!(fake.removed().is_empty(), "the removal in progress was still waiting");
    assert!(
        !matches!(
            StateStore::new(&state).load(SystemTime::now(), secs(3600)),
            Loaded::Corrupt { .. }
        ),
        "the state file is never left half written"
    );
}

/// A configuration for the reload tests: `timeout` and `interval` as
/// given, nothing ever removed, the filesystem of `dir` measured.
fn reload_config(dir: &std::path::Path, timeout: &str, interval: &str, listen: &str) -> String {
    format!(
        "[runtime]\ntimeout = {timeout:?}\n\n[gc]\ninterval = {interval:?}\nusage_poll_interval = \"1s\"\n\
         high_threshold_percent = 100\nlow_threshold_percent = 0\nimage_fs_path = {:?}\n\n\
         [metrics]\nlisten = {listen:?}\n",
        dir.display().to_string()
    )
}

#[tokio::test]
async fn a_reload_that_shortens_the_interval_runs_the_next_cycle_on_the_new_schedule() {
    let fake = FakeRuntime::new();
    fake.add_image(image("a", 1000));
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    std::fs::write(&config, reload_config(dir.path(), "10s", "1h", "")).unwrap();
    let mut daemon = Daemon::spawn(&config, &server.endpoint(), &dir.path().join("state"), None);
    daemon.wait_logged("next cycle scheduled", secs(10)).await;

    std::fs::write(&config, reload_config(dir.path(), "10s", "2s", "")).unwrap();
    daemon.signal(libc::SIGHUP);
    daemon.wait_logged("configuration reloaded", secs(5)).await;

    // The cycle after the first is due 2s after it, not an hour.
    let deadline = Instant::now() + secs(6);
    while daemon.logged("next cycle scheduled") < 2 {
        assert!(
            Instant::now() < deadline,
            "no cycle on the new 2s interval:\n{}",
            daemon.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(daemon.running());
}

#[tokio::test]
async fn a_reload_applies_runtime_timeout_to_the_next_call_and_names_the_keys_that_need_a_restart() {
    let fake = FakeRuntime::new();
    fake.add_image(image("a", 1000));
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    let addr = free_local_addr();
    std::fs::write(&config, reload_config(dir.path(), "1h", "1s", &addr.to_string())).unwrap();
    let mut daemon = Daemon::spawn(&config, &server.endpoint(), &dir.path().join("state"), Some(addr));
    daemon.wait_logged("next cycle scheduled", secs(10)).await;

    let other = free_local_addr();
    std::fs::write(&config, reload_config(dir.path(), "1s", "1s", &other.to_string())).unwrap();
    daemon.signal(libc::SIGHUP);
    daemon.wait_logged("configuration reloaded; it applies", secs(5)).await;

    // A listing that never answers now costs one second, not the hour the
    // daemon started with.
    fake.delay("ListImages", secs(3600));
    daemon.wait_logged("timed out after 1s", secs(6)).await;
    let (status, _) = daemon.get("/healthz").await;
    assert_eq!(status, 200, "the endpoint stays on the address it was bound to");
    let restart = daemon
        .stderr()
        .lines()
        .find(|l| l.contains("take effect only after a restart"))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no warning names the keys that need a restart:\n{}", daemon.stderr()));
    assert!(
        restart.contains("WARN") && restart.contains("metrics.listen") && !restart.contains("runtime.timeout"),
        "{restart}"
    );
    fake.delay("ListImages", Duration::ZERO);
}

#[tokio::test]
async fn sighup_reloads_the_configuration_and_a_bad_one_is_refused() {
    let fake = FakeRuntime::new();
    let (a, b, c) = (image("a", 1000), image("b", 1000), image("c", 1000));
    fake.add_image(a.clone());
    fake.add_image(b.clone());
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    Settings::new(dir.path()).write(&config);
    let mut daemon = Daemon::spawn(&config, &server.endpoint(), &dir.path().join("state"), None);

    eventually(secs(10), "two cycles", || (fake.count("ListImages") >= 2).then_some(())).await;
    assert!(fake.removed().is_empty(), "high 100 removes nothing");

    Settings::new(dir.path()).remove_everything().write(&config);
    daemon.signal(libc::SIGHUP);
    daemon.wait_logged("configuration reloaded", secs(5)).await;
    eventually(secs(5), "removals under the new thresholds", || {
        (fake.removed().len() == 2).then_some(())
    })
    .await;
    assert_eq!(ids(&fake.removed()), BTreeSet::from([a.id.as_str(), b.id.as_str()]));

    // A file that would stop collection, were it not for the bad max_age.
    std::fs::write(
        &config,
        "[gc]\ninterval = \"1s\"\nhigh_threshold_percent = 100\nmin_age = \"0s\"\nmax_age = \"soon\"\n",
    )
    .unwrap();
    daemon.signal(libc::SIGHUP);
    daemon.wait_logged("configuration reload rejected", secs(5)).await;
    let rejected = daemon
        .stderr()
        .lines()
        .find(|l| l.contains("configuration reload rejected"))
        .unwrap()
        .to_string();
    assert!(
        rejected.contains("gc.max_age") && rejected.contains(&config.display().to_string()),
        "the log names the file and the key: {rejected}"
    );

    // Still running, with the thresholds from before.
    fake.add_image(c.clone());
    eventually(secs(5), "the new image removed under the old thresholds", || {
        fake.removed().contains(&c.id).then_some(())
    })
    .await;
    assert!(daemon.running());
}

// ---------------------------------------------------------------------------
// What the runtime says, printed and logged.

/// An image whose tag is 70,000 characters long, as a runtime may report.
fn image_with_a_huge_tag(name: &str) -> imagegc::cri::Image {
    let mut huge = image(name, 1000);
    huge.repo_tags = vec![format!("registry.test/{name}:{}", "x".repeat(70_000))];
    huge
}

#[tokio::test]
async fn a_tag_of_70000_characters_is_cut_short_in_every_table() {
    let fake = FakeRuntime::new();
    let huge = image_with_a_huge_tag("huge");
    fake.add_image(huge.clone());
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    let state = dir.path().join("state");
    Settings::new(dir.path()).remove_everything().write(&config);

    // `once` removes the image (and exits 3: low 0 is never reached), so
    // that `history` has the huge tag to show too.
    for (args, code) in [
        (&["images"][..], 0),
        (&["plan"][..], 0),
        (&["once"][..], 3),
        (&["history"][..], 0),
    ] {
        let output = support::imagegc_command(&config, &server.endpoint(), &state, args).await;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "imagegc {args:?}:\n{stderr}");
        assert!(
            stdout.contains("registry.test/huge:xxxxxxxx"),
            "imagegc {args:?} shows the start of the tag:\n{stdout}"
        );
        assert!(
            stdout.lines().all(|line| line.chars().count() < 1000),
            "imagegc {args:?} printed the whole tag"
        );
    }
    assert_eq!(fake.removed(), vec![huge.id.clone()]);
}

#[tokio::test]
async fn escape_codes_in_a_tag_are_printed_escaped_in_tables() {
    let fake = FakeRuntime::new();
    let mut forged = image("forged", 1000);
    forged.repo_tags = vec!["registry.test/forged:1\u{1b}[2J\nsha256:000000000000  fake-row".to_string()];
    fake.add_image(forged);
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    Settings::new(dir.path()).write(&config);

    let output = support::imagegc_command(&config, &server.endpoint(), &dir.path().join("state"), &["images"]).await;

    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0));
    assert!(
        !stdout.contains('\u{1b}'),
        "an escape code reached the terminal:\n{stdout}"
    );
    assert!(
        !stdout.lines().any(|line| line.starts_with("sha256:000000000000")),
        "the tag forged a row:\n{stdout}"
    );
    assert!(stdout.contains(r"registry.test/forged:1\u{1b}[2J\nsha256"), "{stdout}");
}

#[tokio::test]
async fn newlines_and_escape_codes_from_the_runtime_cannot_forge_log_lines() {
    let fake = FakeRuntime::new();
    let mut forged = image("forged", 1000);
    forged.id = format!("{}\n2030-01-01T00:00:00Z ERROR forged line\u{1b}[2J", forged.id);
    forged.repo_tags = vec!["registry.test/forged:1\nINFO forged tag line".to_string()];
    fake.add_image(forged.clone());
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    Settings::new(dir.path()).remove_everything().write(&config);
    let mut daemon = Daemon::spawn(&config, &server.endpoint(), &dir.path().join("state"), None);

    daemon.wait_logged("removed image", secs(10)).await;
    daemon.signal(libc::SIGTERM);
    assert!(daemon.exited_within(secs(10)).await.is_some());

    let log = daemon.stderr();
    assert!(!log.contains('\u{1b}'), "an escape code reached the log:\n{log}");
    for line in log.lines() {
        assert!(
            !line.starts_with("2030-01-01") && !line.starts_with("INFO forged"),
            "a forged line in the log:\n{log}"
        );
    }
    assert!(
        log.contains(r"\n2030-01-01T00:00:00Z ERROR forged line\u{1b}[2J"),
        "{log}"
    );
}

/// CRI-O 1.26 with no pod running names its sandbox image nowhere and pins
/// nothing: the operator is told once, at start, to set
/// `runtime.sandbox_image`, not once per cycle, and meanwhile nothing that
/// no container ever used is removed.
#[tokio::test]
async fn an_unnamed_sandbox_image_is_warned_about_once_naming_runtime_sandbox_image() {
    let fake = FakeRuntime::new();
    fake.set_dialect(Dialect::Crio126);
    fake.set_sandbox_image(None);
    fake.add_image(image("pause", 1000));
    fake.add_image(image("fresh", 1000));
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    Settings::new(dir.path()).remove_everything().write(&config);
    let mut daemon = Daemon::spawn(&config, &server.endpoint(), &dir.path().join("state"), None);

    eventually(secs(10), "three cycles", || {
        (fake.count("ListImages") >= 3).then_some(())
    })
    .await;
    daemon.signal(libc::SIGTERM);
    assert!(daemon.exited_within(secs(10)).await.is_some());

    let log = daemon.stderr();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("set runtime.sandbox_image"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning in three cycles:\n{log}");
    assert!(warnings[0].contains("WARN"), "{}", warnings[0]);
    assert!(
        fake.removed().is_empty(),
        "never-used images are kept: {:?}",
        fake.removed()
    );
}

#[tokio::test]
async fn a_runtime_that_refuses_the_listing_is_logged_with_its_own_error() {
    let fake = FakeRuntime::new();
    fake.add_image(image("app", 1000));
    fake.fail_always(
        "ListImages",
        Some(tonic::Status::permission_denied("denied by the node's security policy")),
    );
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    Settings::new(dir.path()).write(&config);
    let mut daemon = Daemon::spawn(&config, &server.endpoint(), &dir.path().join("state"), None);

    daemon.wait_logged("container runtime refused", secs(10)).await;

    let log = daemon.stderr();
    let warning = log
        .lines()
        .find(|line| line.contains("container runtime refused"))
        .unwrap();
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.contains("denied by the node's security policy"), "{warning}");
    assert_eq!(daemon.logged("not reachable"), 0, "{log}");
}

#[tokio::test]
async fn plan_json_gives_when_a_young_image_becomes_removable_as_a_time() {
    let fake = FakeRuntime::new();
    fake.add_image(image("young", 1000));
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    Settings {
        min_age: "1h",
        max_age: "2h",
        ..Settings::new(dir.path()).remove_everything()
    }
    .write(&config);
    let before = SystemTime::now();

    let plan = imagegc_json(&config, &server.endpoint(), &dir.path().join("state"), &["plan"], 0).await;

    let kept = &plan["kept"][0];
    assert_eq!(kept["reason"], "too_young", "{plan:#}");
    let removable_after = parse_time(&kept["removable_after"]);
    assert!(
        removable_after > before + secs(3500) && removable_after < SystemTime::now() + secs(3700),
        "{plan:#}"
    );
}

#[tokio::test]
async fn a_reload_of_a_file_that_could_block_stops_neither_cycles_nor_probes_nor_shutdown() {
    let fake = FakeRuntime::new();
    fake.add_image(image("app", 1000));
    let dir = tempfile::tempdir().unwrap();
    let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
    let config = dir.path().join("imagegc.toml");
    let addr = free_local_addr();
    Settings {
        listen: Some(addr),
        ..Settings::new(dir.path())
    }
    .write(&config);
    let mut daemon = Daemon::spawn(&config, &server.endpoint(), &dir.path().join("state"), Some(addr));
    eventually(secs(10), "a first cycle", || {
        (fake.count("ListImages") >= 1).then_some(())
    })
    .await;

    // The file becomes a FIFO that nobody writes: reading it would never
    // end. The reload refuses it without opening it for a blocking read,
    // off the daemon's loop.
    std::fs::remove_file(&config).unwrap();
    let fifo = std::ffi::CString::new(config.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo(3) with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    daemon.signal(libc::SIGHUP);

    let listed = fake.count("ListImages");
    eventually(secs(10), "two more cycles", || {
        (fake.count("ListImages") >= listed + 2).then_some(())
    })
    .await;
    assert_eq!(daemon.get("/healthz").await.0, 200);
    daemon.wait_logged("it is a FIFO, not a regular file", secs(5)).await;
    daemon.signal(libc::SIGHUP);

    daemon.signal(libc::SIGTERM);
    let status = daemon.exited_within(secs(10)).await;
    assert!(status.is_some_and(|s| s.success()), "{status:?}:\n{}", daemon.stderr());
}

/// Usage that crosses the high threshold between cycles starts a space
/// pass within seconds: the kubelet's eviction manager looks every 10 s,
/// and a pull that fills the disk must not wait for the next interval.
#[tokio::test]
async fn usage_crossing_high_between_cycles_starts_a_space_pass_within_seconds() {
    let old = image("old", 100);
    let (fake, disk, mut daemon) =
        one_image_on_a_1000_byte_disk(&old, 850, |c| c.gc.usage_poll_interval = secs(30)).await;
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

/// An image pulled between cycles is first seen at the next usage poll,
/// not at the next cycle: min age counts from when it appeared.
#[tokio::test]
async fn an_image_pulled_between_cycles_is_first_seen_at_the_next_poll() {
    let fake = FakeRuntime::new();
    fake.add_image(image("old", 100));
    let mut daemon = InProcess::start(fake.clone(), roomy_disk(), |_| {}, |c| c.gc.interval = secs(3600)).await;
    first_cycle_done(&daemon).await;
    let pulled = image("pulled", 100);
    fake.add_image(pulled.clone());
    let added = SystemTime::now();
    let lists = fake.count("ListImages");
    eventually(secs(5), "a poll after the pull", || {
        (fake.count("ListImages") > lists).then_some(())
    })
    .await;
    daemon.stop().await;
    assert_eq!(fake.count("ImageFsInfo"), 1, "no second cycle");
    let records = load_records(&daemon.state_dir());
    let record = records.get(&pulled.id).expect("the pulled image has a record");
    let late = record.first_seen.duration_since(added).unwrap_or_default();
    assert!(late < secs(3), "first seen {late:?} after the pull");
}

/// A cycle that could not reach low because the images it could free were
/// younger than `gc.min_age` runs again as soon as the first of them may
/// go, not at the next interval: usage staying above high is no crossing.
#[tokio::test]
async fn a_cycle_held_back_by_min_age_runs_again_when_the_young_images_may_go() {
    let fresh = image("fresh", 300);
    let (fake, _disk, mut daemon) = one_image_on_a_1000_byte_disk(&fresh, 100, |c| c.gc.min_age = secs(3)).await;
    assert!(fake.removed().is_empty(), "too young at the first cycle");
    let removed = eventually(secs(10), "the image removed once old enough", || {
        (!fake.removed().is_empty()).then(|| fake.removed())
    })
    .await;
    assert_eq!(removed, vec![fresh.id.clone()]);
    daemon.stop().await;
}

/// Waits until the first cycle has finished (not merely started: a change
/// the test makes next must not be seen by it).
async fn first_cycle_done(daemon: &InProcess) {
    cycles_done(daemon, 1).await;
}

/// Waits until `n` cycles have finished, whatever their outcome.
async fn cycles_done(daemon: &InProcess, n: u32) {
    eventually(secs(10), &format!("{n} cycle(s) to finish"), || {
        let scrape = daemon.metrics.encode();
        let done: f64 = ["success", "failure"]
            .iter()
            .filter_map(|result| metric(&scrape, &format!("imagegc_cycles_total{{result=\"{result}\"}}")))
            .sum();
        (done >= f64::from(n)).then_some(())
    })
    .await;
}

/// A daemon over one unused `image` occupying its size on a 1000-byte disk
/// with `available` bytes free, high 80 and low 50, a cycle an hour (only
/// what the test starts runs one), once its first cycle has finished.
async fn one_image_on_a_1000_byte_disk(
    image: &imagegc::cri::Image,
    available: u64,
    configure: impl FnOnce(&mut imagegc::config::Config),
) -> (FakeRuntime, SimDisk, InProcess) {
    let fake = FakeRuntime::new();
    fake.add_image(image.clone());
    let disk = SimDisk::new(1000, available);
    disk.occupy(&image.id, image.size);
    fake.on_remove(Some(disk.free_on_remove()));
    let daemon = InProcess::start(
        fake.clone(),
        disk.clone(),
        |_| {},
        |c| {
            c.gc.interval = secs(3600);
            c.gc.high_threshold_percent = 80;
            c.gc.low_threshold_percent = 50;
            configure(c);
        },
    )
    .await;
    first_cycle_done(&daemon).await;
    (fake, disk, daemon)
}
