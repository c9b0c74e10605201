//! The real CRI client against the fake runtime over a unix socket: what the
//! client reads, how large answers pass, and how every failure is reported.
//!
//! Default-endpoint discovery is not tested here: it probes the real
//! containerd and CRI-O sockets of the machine running the tests.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use imagegc::cri::proto;
use imagegc::cri::{Container, ContainerState, CriClient, Image, Runtime, RuntimeError, connect, discover};
use imagegc_testkit::fake::{Dialect, Events, FakeRuntime, FakeServer};
use imagegc_testkit::{list_images_response, tagged_image};
use prost::Message;
use tokio_stream::StreamExt;

/// Long enough for a slow CI machine, short enough to notice a hang.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Every field distinct, so a field the client drops or swaps shows.
fn container(id: &str, image: &str, state: ContainerState) -> Container {
    Container {
        id: id.to_string(),
        pod_sandbox_id: format!("pod-{id}"),
        name: format!("name-{id}"),
        image: image.to_string(),
        image_ref: format!("ref-{image}"),
        image_id: format!("id-{image}"),
        state: Some(state),
        mounted_images: Vec::new(),
        mounts_unknown: false,
    }
}

/// A fake runtime served in a temporary directory, and a client for it.
struct Served {
    dir: tempfile::TempDir,
    fake: FakeRuntime,
    server: FakeServer,
    client: CriClient,
}

impl Served {
    async fn start(fake: FakeRuntime) -> Self {
        Self::start_with_timeout(fake, TIMEOUT).await
    }

    async fn start_with_timeout(fake: FakeRuntime, timeout: Duration) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let server = fake.clone().serve(&dir.path().join("cri.sock")).await.unwrap();
        let client = connect(&server.endpoint(), timeout).unwrap();
        Self {
            dir,
            fake,
            server,
            client,
        }
    }
}

#[tokio::test]
async fn lists_images_and_containers_with_their_states() {
    let fake = FakeRuntime::new();
    let nginx = tagged_image("sha256:aaa", "docker.io/library/nginx:1.27");
    let redis = Image {
        pinned: true,
        ..tagged_image("sha256:bbb", "docker.io/library/redis:7")
    };
    fake.add_image(nginx.clone());
    fake.add_image(redis.clone());
    fake.add_container(container("c-created", "nginx:1.27", ContainerState::Created));
    fake.add_container(container("c-running", "nginx:1.27", ContainerState::Running));
    fake.add_container(container("c-exited", "redis:7", ContainerState::Exited));
    fake.add_container(container("c-unknown", "redis:7", ContainerState::Unknown));
    let served = Served::start(fake).await;

    assert_eq!(served.client.list_images().await.unwrap(), [nginx, redis]);
    let containers = served.client.list_containers().await.unwrap();
    assert_eq!(containers, served.fake.containers());
    let states: Vec<_> = containers.iter().map(|c| (c.id.as_str(), c.state)).collect();
    assert_eq!(
        states,
        [
            ("c-created", Some(ContainerState::Created)),
            ("c-running", Some(ContainerState::Running)),
            ("c-exited", Some(ContainerState::Exited)),
            ("c-unknown", Some(ContainerState::Unknown)),
        ]
    );

    served.fake.set_container_state("c-running", ContainerState::Exited);
    served.fake.remove_container("c-created");
    let states: Vec<_> = served
        .client
        .list_containers()
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.state)
        .collect();
    assert_eq!(
        states,
        [
            Some(ContainerState::Exited),
            Some(ContainerState::Exited),
            Some(ContainerState::Unknown)
        ]
    );
}

#[tokio::test]
async fn reads_version_sandbox_image_and_image_filesystem() {
    let fake = FakeRuntime::new();
    let served = Served::start(fake).await;

    let version = served.client.version().await.unwrap();
    assert_eq!(
        version.runtime_name, "containerd",
        "the default dialect is containerd's"
    );
    assert_eq!(version.runtime_api_version, "v1");

    assert_eq!(
        served.client.status().await.unwrap().sandbox_image.as_deref(),
        Some(imagegc_testkit::fake::DEFAULT_SANDBOX_IMAGE)
    );
    served.fake.set_sandbox_image(None);
    assert_eq!(served.client.status().await.unwrap().sandbox_image, None);
    served
        .fake
        .set_sandbox_image(Some("registry.k8s.io/pause:3.10".to_string()));
    assert_eq!(
        served.client.status().await.unwrap().sandbox_image.as_deref(),
        Some("registry.k8s.io/pause:3.10")
    );

    let filesystems = served.client.image_fs_info().await.unwrap();
    assert_eq!(filesystems.len(), 1);
    assert_eq!(
        filesystems[0].mount_point,
        "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs"
    );
    served.fake.set_image_fs_mount(served.dir.path());
    served.fake.add_image(tagged_image("sha256:aaa", "nginx:1.27"));
    let filesystems = served.client.image_fs_info().await.unwrap();
    assert_eq!(filesystems[0].mount_point, served.dir.path().to_str().unwrap());
    assert_eq!(filesystems[0].used_bytes, Some(1_000_000));
    // A split store: the container filesystem comes apart from the image one.
    assert_eq!(served.client.filesystems().await.unwrap().containers, []);
    served
        .fake
        .set_container_fs_mount("/var/lib/containers/storage/overlay-containers");
    let split = served.client.filesystems().await.unwrap();
    assert_eq!(split.images, filesystems);
    assert_eq!(
        split
            .containers
            .iter()
            .map(|fs| fs.mount_point.as_str())
            .collect::<Vec<_>>(),
        ["/var/lib/containers/storage/overlay-containers"]
    );

    assert_eq!(
        served.fake.calls(),
        [
            "Version",
            "Status",
            "Status",
            "Status",
            "ImageFsInfo",
            "ImageFsInfo",
            "ImageFsInfo",
            "ImageFsInfo"
        ]
    );
}

#[tokio::test]
async fn fifty_thousand_images_pass_the_grpc_default_message_limit() {
    const IMAGES: usize = 50_000;
    const GRPC_DEFAULT_LIMIT: usize = 4 * 1024 * 1024;
    let fake = FakeRuntime::new();
    for n in 0..IMAGES {
        let id = format!("sha256:{n:064x}");
        fake.add_image(Image {
            repo_tags: vec![format!(
                "registry.example.com/some-team/some-rather-long-application-name-{n}:v1.2.3-build-{n}"
            )]
            .into(),
            repo_digests: vec![format!(
                "registry.example.com/some-team/some-rather-long-application-name-{n}@{id}"
            )]
            .into(),
            id,
            size: 100_000_000,
            pinned: false,
        });
    }
    let answer = list_images_response(&fake.images());
    assert!(
        answer.encoded_len() > GRPC_DEFAULT_LIMIT,
        "{} bytes",
        answer.encoded_len()
    );
    let served = Served::start(fake).await;

    let images = served.client.list_images().await.unwrap();
    assert_eq!(images.len(), IMAGES);
    assert_eq!(images, served.fake.images());
}

#[tokio::test]
async fn a_hung_runtime_times_out_naming_the_rpc_and_the_endpoint() {
    let fake = FakeRuntime::new();
    fake.delay("ListImages", Duration::from_secs(5));
    let served = Served::start_with_timeout(fake, Duration::from_millis(200)).await;

    let started = Instant::now();
    let err = served.client.list_images().await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        matches!(err, RuntimeError::Timeout { rpc: "ListImages", .. }),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(message.contains("ListImages"), "{message}");
    assert!(message.contains(&served.server.endpoint()), "{message}");

    // Only the delayed RPC hangs; stopping the server ends the wait.
    served.client.version().await.unwrap();
    let started = Instant::now();
    served.server.shutdown().await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_failed_removal_names_the_rpc_the_endpoint_and_the_message() {
    let fake = FakeRuntime::new();
    fake.add_image(tagged_image("sha256:aaa", "nginx:1.27"));
    fake.fail_next(
        "RemoveImage",
        tonic::Status::failed_precondition("image is being pulled"),
    );
    let served = Served::start(fake).await;

    let err = served.client.remove_image("sha256:aaa").await.unwrap_err();
    assert!(matches!(err, RuntimeError::Rpc { rpc: "RemoveImage", .. }), "{err:?}");
    assert_eq!(err.code(), Some(tonic::Code::FailedPrecondition));
    let message = err.to_string();
    assert!(message.contains("RemoveImage"), "{message}");
    assert!(message.contains(&served.server.endpoint()), "{message}");
    assert!(message.contains("image is being pulled"), "{message}");
    assert!(served.fake.removed().is_empty());

    // The failure was for one call only.
    served.client.remove_image("sha256:aaa").await.unwrap();
    assert_eq!(served.fake.removed(), ["sha256:aaa"]);
    assert_eq!(served.fake.count("RemoveImage"), 2);
}

#[tokio::test]
async fn a_removal_failing_for_one_image_leaves_the_others_removable() {
    let fake = FakeRuntime::new();
    fake.add_image(tagged_image("sha256:aaa", "nginx:1.27"));
    fake.add_image(tagged_image("sha256:bbb", "redis:7"));
    fake.fail_remove("sha256:aaa", tonic::Code::PermissionDenied);
    let served = Served::start(fake).await;

    let err = served.client.remove_image("sha256:aaa").await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::PermissionDenied));
    // By tag too: the failure belongs to the image.
    let err = served.client.remove_image("nginx:1.27").await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::PermissionDenied));
    served.client.remove_image("sha256:bbb").await.unwrap();

    served.fake.clear_fail_remove("sha256:aaa");
    served.client.remove_image("sha256:aaa").await.unwrap();
    assert_eq!(served.fake.removed(), ["sha256:bbb", "sha256:aaa"]);
    assert!(served.fake.images().is_empty());
}

#[tokio::test]
async fn removing_an_image_that_is_already_gone_says_so() {
    let served = Served::start(FakeRuntime::new()).await;

    let removed = served.client.remove_image("sha256:gone").await.unwrap();
    assert_eq!(removed, imagegc::cri::Removed::AlreadyGone);
    assert_eq!(served.fake.calls(), ["RemoveImage"]);
    assert!(served.fake.removed().is_empty());
}

#[tokio::test]
async fn removal_by_tag_or_digest_removes_the_whole_image() {
    let fake = FakeRuntime::new();
    let nginx = Image {
        repo_tags: vec!["nginx:1.27".to_string(), "nginx:latest".to_string()].into(),
        ..tagged_image("sha256:aaa", "nginx:1.27")
    };
    fake.add_image(nginx);
    fake.add_image(tagged_image("sha256:bbb", "redis:7"));
    let served = Served::start(fake).await;

    served.client.remove_image("nginx:latest").await.unwrap();
    served.client.remove_image("redis@sha256:bbb").await.unwrap();
    assert_eq!(served.fake.removed(), ["sha256:aaa", "sha256:bbb"]);
    assert!(served.fake.images().is_empty());
}

#[tokio::test]
async fn like_containerd_the_runtime_removes_an_image_a_container_uses() {
    let fake = FakeRuntime::new();
    fake.add_image(tagged_image("sha256:aaa", "nginx:1.27"));
    fake.add_container(container("c1", "nginx:1.27", ContainerState::Running));
    let served = Served::start(fake).await;

    served.client.remove_image("sha256:aaa").await.unwrap();
    assert_eq!(served.fake.removed(), ["sha256:aaa"]);
    assert_eq!(served.client.list_containers().await.unwrap().len(), 1);
}

#[tokio::test]
async fn the_remove_hook_runs_before_the_removal_and_the_effect_after() {
    let fake = FakeRuntime::new();
    fake.add_image(tagged_image("sha256:aaa", "nginx:1.27"));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let in_hook = fake.clone();
    let hook_seen = Arc::clone(&seen);
    fake.hook_before_remove(Box::new(move |reference| {
        hook_seen
            .lock()
            .unwrap()
            .push(format!("before {reference}, {} images", in_hook.images().len()));
        in_hook.add_container(container("late", reference, ContainerState::Created));
    }));
    let effect_seen = Arc::clone(&seen);
    fake.on_remove(Some(Arc::new(move |image: &Image| {
        effect_seen
            .lock()
            .unwrap()
            .push(format!("removed {} ({} bytes)", image.id, image.size));
    })));
    let served = Served::start(fake).await;

    served.client.remove_image("sha256:aaa").await.unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        ["before sha256:aaa, 1 images", "removed sha256:aaa (1000000 bytes)"]
    );
    let containers = served.client.list_containers().await.unwrap();
    assert_eq!(containers[0].id, "late");
    assert_eq!(containers[0].state, Some(ContainerState::Created));
}

#[tokio::test]
async fn persistent_failures_last_until_cleared() {
    let fake = FakeRuntime::new();
    fake.fail_always("ListContainers", Some(tonic::Status::internal("store is corrupt")));
    let served = Served::start(fake).await;

    for _ in 0..3 {
        let err = served.client.list_containers().await.unwrap_err();
        assert_eq!(err.code(), Some(tonic::Code::Internal));
        assert!(err.to_string().contains("store is corrupt"), "{err}");
    }
    served.fake.fail_always("ListContainers", None);
    served.client.list_containers().await.unwrap();
    assert_eq!(served.fake.count("ListContainers"), 4);
}

#[tokio::test]
async fn rpcs_imagegc_does_not_need_are_unimplemented() {
    let served = Served::start(FakeRuntime::new()).await;

    let err = served
        .client
        .runtime_service()
        .run_pod_sandbox(proto::RunPodSandboxRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented);
    assert_eq!(served.fake.calls(), ["RunPodSandbox"]);
}

#[tokio::test]
async fn a_runtime_that_is_down_is_a_connect_error_until_it_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("cri.sock");
    let endpoint = format!("unix://{}", socket.display());
    let client = connect(&endpoint, TIMEOUT).unwrap();

    // Nothing at the path.
    let err = client.version().await.unwrap_err();
    assert!(matches!(err, RuntimeError::Connect { .. }), "{err:?}");
    assert!(err.to_string().contains(&endpoint), "{err}");

    // A socket file nobody listens on, as a crashed runtime leaves behind.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let err = client.list_images().await.unwrap_err();
    assert!(matches!(err, RuntimeError::Connect { .. }), "{err:?}");
    assert!(err.to_string().contains(&endpoint), "{err}");

    let fake = FakeRuntime::new();
    fake.add_image(tagged_image("sha256:aaa", "nginx:1.27"));
    let server = fake.clone().serve(&socket).await.unwrap();
    assert_eq!(server.endpoint(), endpoint);
    assert_eq!(client.list_images().await.unwrap().len(), 1);

    server.shutdown().await;
    let err = client.list_images().await.unwrap_err();
    assert!(matches!(err, RuntimeError::Connect { .. }), "{err:?}");

    let _server = fake.serve(&socket).await.unwrap();
    assert_eq!(client.list_images().await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_restarted_runtime_keeps_its_state_and_answers_the_same_client() {
    let fake = FakeRuntime::new();
    fake.add_image(tagged_image("sha256:aaa", "nginx:1.27"));
    let served = Served::start(fake).await;
    served.client.version().await.unwrap();

    let server = served.server.restart().await.unwrap();
    assert_eq!(served.client.list_images().await.unwrap().len(), 1);
    assert_eq!(server.runtime().calls(), ["Version", "ListImages"]);
}

#[tokio::test]
async fn container_events_are_unimplemented_by_default_as_in_containerd_1_6() {
    let served = Served::start(FakeRuntime::new()).await;

    let mut events = served.client.container_events();
    let err = match tokio::time::timeout(TIMEOUT, events.next()).await.expect("no answer") {
        Some(Err(err)) => err,
        other => panic!("expected Unimplemented, got {other:?}"),
    };
    assert!(err.is_unimplemented(), "{err:?}");
    assert!(err.to_string().contains("GetContainerEvents"), "{err}");
}

/// Waits until the fake has `n` event streams open (the client opens its
/// stream when the stream is first polled).
async fn until_subscribed(fake: &FakeRuntime, n: usize) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while fake.event_subscribers() < n {
        assert!(tokio::time::Instant::now() < deadline, "the stream was never opened");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn emitted_container_events_arrive_through_the_client() {
    let fake = FakeRuntime::new();
    fake.events_unimplemented(false);
    let served = Served::start(fake).await;

    let mut events = served.client.container_events();
    let first = tokio::spawn(async move {
        let event = tokio::time::timeout(TIMEOUT, events.next()).await;
        (event, events)
    });
    until_subscribed(&served.fake, 1).await;
    let sent = served.fake.emit_event(
        "c1",
        proto::ContainerEventType::ContainerCreatedEvent,
        &["nginx:1.27", "sha256:aaa"],
    );
    assert_eq!(sent, 1);
    let (event, mut events) = first.await.unwrap();
    let event = event
        .expect("no event within the timeout")
        .expect("the stream ended")
        .unwrap();
    assert_eq!(event.container_id, "c1");
    assert_eq!(event.images, ["nginx:1.27", "sha256:aaa"]);
    assert!(event.created_at.is_some());

    // Stopping the runtime ends the stream rather than leaving it hanging.
    served.server.shutdown().await;
    let end = tokio::time::timeout(TIMEOUT, events.next())
        .await
        .expect("the stream did not end");
    assert!(!matches!(end, Some(Ok(_))), "{end:?}");
}

/// Real runtimes send the stream's response headers only with the first
/// event: making the stream costs nothing, and a stream polled on an idle
/// node waits without answering.
#[tokio::test]
async fn an_event_stream_waits_for_its_first_event_without_blocking_anyone() {
    let fake = FakeRuntime::new();
    fake.set_events(Events::Broadcast);
    let served = Served::start(fake).await;

    let mut events = served.client.container_events();
    assert_eq!(
        served.fake.count("GetContainerEvents"),
        0,
        "nothing is sent before the stream is polled"
    );
    let waited = tokio::time::timeout(Duration::from_millis(300), events.next()).await;
    assert!(
        waited.is_err(),
        "no event was sent, yet the stream answered: {waited:?}"
    );
    // The client is free meanwhile.
    assert_eq!(served.client.list_images().await.unwrap().len(), 0);
    served
        .fake
        .emit_event("c1", proto::ContainerEventType::ContainerStartedEvent, &["app:1"]);
    let event = tokio::time::timeout(TIMEOUT, events.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(event.container_id, "c1");
}

/// CRI-O (pod events off, its default) ends the stream, OK, at once.
#[tokio::test]
async fn a_stream_that_ends_at_once_ends_the_client_stream() {
    let fake = FakeRuntime::new();
    fake.set_events(Events::EndAtOnce);
    let served = Served::start(fake).await;
    let mut events = served.client.container_events();
    let end = tokio::time::timeout(TIMEOUT, events.next()).await.unwrap();
    assert!(end.is_none(), "{end:?}");
}

/// CRI-O lists bare-hex ids; imagegc uses `sha256:<hex>` everywhere and
/// gives CRI-O its own form back: CRI-O reads `sha256:<hex>` as a short
/// name and refuses it.
#[tokio::test]
async fn crio_ids_are_prefixed_when_read_and_bare_when_removed() {
    let fake = FakeRuntime::new();
    fake.set_dialect(Dialect::Crio136);
    let hex = "8238e0f45fe9".repeat(5) + "abcd";
    fake.add_image(tagged_image(&format!("sha256:{hex}"), "docker.io/library/app:1"));
    fake.add_container(Container {
        id: "c1".to_string(),
        image: "docker.io/library/app:1".to_string(),
        image_ref: format!("docker.io/library/app@sha256:{}", "d".repeat(64)),
        image_id: hex.clone(),
        ..Default::default()
    });
    let served = Served::start(fake).await;

    let images = served.client.list_images().await.unwrap();
    assert_eq!(images[0].id, format!("sha256:{hex}"));
    let containers = served.client.list_containers().await.unwrap();
    assert_eq!(containers[0].image_id, format!("sha256:{hex}"));

    served.fake.remove_container("c1");
    served.client.remove_image(&images[0].id).await.unwrap();
    assert!(served.fake.images().is_empty(), "the image is still there");
}

/// Image volumes show only in `ContainerStatus`: a name on containerd, the
/// bare id on CRI-O (read as `sha256:<hex>`).
#[tokio::test]
async fn mounted_images_are_read_from_container_status() {
    let fake = FakeRuntime::new();
    fake.set_dialect(Dialect::Crio136);
    let hex = "e".repeat(64);
    fake.add_container(Container {
        id: "c1".to_string(),
        mounted_images: vec![hex.clone(), "docker.io/library/data:1".to_string()],
        ..Default::default()
    });
    let served = Served::start(fake).await;
    assert!(
        served.client.list_containers().await.unwrap()[0]
            .mounted_images
            .is_empty()
    );
    assert_eq!(
        served.client.container_mounts("c1").await.unwrap(),
        [format!("sha256:{hex}"), "docker.io/library/data:1".to_string()]
    );
    assert!(served.client.container_mounts("gone").await.unwrap_err().is_not_found());
}

/// containerd 2.x names the sandbox image only in a pod's verbose status;
/// CRI-O 1.36 in annotations; CRI-O 1.26 nowhere.
#[tokio::test]
async fn pod_sandbox_images_are_read_from_each_dialect() {
    for (dialect, expected) in [
        (Dialect::Containerd2, Some("registry.k8s.io/pause:3.10")),
        (Dialect::Crio136, Some("registry.k8s.io/pause:3.10")),
        (Dialect::Crio126, None),
    ] {
        let fake = FakeRuntime::new();
        fake.set_dialect(dialect);
        fake.set_sandbox_image(Some("registry.k8s.io/pause:3.10".to_string()));
        fake.add_pod("p1");
        let served = Served::start(fake).await;
        assert_eq!(served.client.pod_sandboxes().await.unwrap(), ["p1"]);
        assert_eq!(
            served.client.pod_sandbox_image("p1").await.unwrap().as_deref(),
            expected,
            "{dialect:?}"
        );
        let status = served.client.status().await.unwrap();
        let in_status = matches!(dialect, Dialect::Crio136).then_some("registry.k8s.io/pause:3.10");
        assert_eq!(status.sandbox_image.as_deref(), in_status, "{dialect:?}");
    }
}

#[tokio::test]
async fn discover_uses_the_configured_endpoint() {
    let served = Served::start(FakeRuntime::new()).await;
    let endpoint = served.server.endpoint();

    let client = discover(Some(&endpoint), TIMEOUT).await.unwrap();
    assert_eq!(client.endpoint(), endpoint);
    assert_eq!(client.timeout(), TIMEOUT);
    client.version().await.unwrap();

    let Err(err) = discover(Some("tcp://127.0.0.1:1"), TIMEOUT).await else {
        panic!("a tcp endpoint was accepted")
    };
    assert!(matches!(err, RuntimeError::BadEndpoint { .. }), "{err:?}");
}

#[tokio::test]
async fn a_stale_socket_file_is_replaced_and_other_files_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("cri.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let server = FakeRuntime::new().serve(&socket).await.unwrap();
    connect(&server.endpoint(), TIMEOUT).unwrap().version().await.unwrap();
    server.shutdown().await;
    assert!(!socket.exists());

    let file: PathBuf = dir.path().join("not-a-socket");
    std::fs::write(&file, "keep me").unwrap();
    assert!(FakeRuntime::new().serve(&file).await.is_err());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
}

#[tokio::test]
async fn the_layers_of_the_fakes_node_are_read_from_its_verbose_image_status_in_each_dialect() {
    let digest = |c: char| format!("sha256:{}", c.to_string().repeat(64));
    for dialect in [Dialect::Containerd, Dialect::Containerd2, Dialect::Crio136] {
        let fake = FakeRuntime::new();
        fake.set_dialect(dialect);
        fake.add_image(tagged_image(&digest('a'), "app:1"));
        fake.add_image(tagged_image(&digest('b'), "other:1"));
        let layers = vec![digest('1'), digest('2')];
        fake.set_layers(&digest('a'), layers.clone());
        let served = Served::start(fake).await;
        let listed = served.client.list_images().await.unwrap();
        let id = |tag: &str| {
            listed
                .iter()
                .find(|i| i.repo_tags.iter().any(|t| t == tag))
                .map(|i| i.id.clone())
                .unwrap()
        };
        assert_eq!(
            served.client.image_layers(&id("app:1")).await.unwrap(),
            Some(layers),
            "{dialect:?}"
        );
        assert_eq!(
            served.client.image_layers(&id("other:1")).await.unwrap(),
            None,
            "{dialect:?}: a runtime that names no layers"
        );
        served.fake.remove_image_by_id(&digest('a'));
        assert_eq!(
            served.client.image_layers(&id("app:1")).await.unwrap(),
            None,
            "{dialect:?}: a gone image has none"
        );
    }
}
