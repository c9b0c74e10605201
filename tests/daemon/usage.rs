//! Image usage between cycles: containers polled, or followed through
//! container events, and images pulled between cycles.

use std::time::{Duration, Instant, SystemTime};

use imagegc::cri::proto::ContainerEventType;
use imagegc::records::{Record, Records};
use imagegc::store::state::StateStore;
use imagegc_testkit::fake::{Dialect, Events, FakeRuntime};

use crate::support::{InProcess, container_using, eventually, first_cycle_done, image, load_records, roomy_disk, secs};

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
    // Polls run one after another: once the one after the first that lists
    // the container has started, that first one has finished (its
    // ContainerStatus for the new container and the records' update
    // included). Stopping as the first one's ListContainers arrives raced
    // its end and lost it one run in a few.
    eventually(secs(5), "a poll that saw the container, finished", || {
        (fake.count("ListContainers") > polls + 1).then_some(())
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
        .map(|n| FakeRuntime::event(&format!("c-{n}"), old.repo_tags.first().unwrap(), ten_minutes_ago))
        .collect();
    let history = Record {
        first_seen: SystemTime::now() - secs(3600),
        last_used: SystemTime::now() - secs(3600),
        size: 1000,
        pinned: false,
        tags: old.repo_tags.clone(),
        digests: Default::default(),
        from_history: true,
        ever_used: false,
        usual_break: None,
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
    // The stream opened at start, waiting: on a busy machine it opens
    // after the first listing, and a backlog set before would go to it.
    eventually(secs(10), "the event stream opened at start", || {
        (fake.count("GetContainerEvents") >= 1 && fake.event_subscribers() == 1).then_some(())
    })
    .await;
    fake.set_event_backlog(backlog);
    // The stream opened at start is waiting; the backlog goes to the next.
    let server = daemon.server.take().unwrap();
    daemon.server = Some(server.restart().await.unwrap());
    // Reopens back off (2, 4, 8, 16 s) while streams break as they open,
    // as they may while the restarted runtime comes back.
    eventually(secs(40), "the backlog delivered", || {
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
        &[app.repo_tags.first().unwrap()],
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
        &[job.repo_tags.first().unwrap()],
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
        &[app.repo_tags.first().unwrap()],
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
