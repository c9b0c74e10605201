//! An in-process fake CRI runtime, served over a real unix socket, so tests
//! exercise the real tonic client end to end.
//!
//! [`FakeRuntime`] holds what a runtime would know (images, containers in any
//! state, the sandbox image, the image filesystem's mount point), records every
//! call it receives, and lets a test inject faults: failed, delayed or
//! unimplemented RPCs, a failing removal of one image, a hook run in the middle
//! of `RemoveImage`. [`FakeRuntime::serve`] puts it behind a tonic server and
//! returns a [`FakeServer`] handle that stops it.
//!
//! The fake behaves like containerd 1.6 where imagegc depends on it:
//! `RemoveImage` takes an id, a tag or a digest and removes the whole image,
//! and it removes an image even when a container uses it, because nothing but
//! the collector protects in-use images. It answers `NotFound` for an unknown
//! image (containerd answers OK; the client treats both as success).
//! References match exactly: there is no `docker.io/library/` normalisation
//! and no short-id matching. The RPCs imagegc never makes (`RunPodSandbox`
//! and the rest) answer `Unimplemented`.
//!
//! What the node holds (its images and their layers, its containers, the
//! removals made) is [`imagegc::sim::SimNode`], the model the engine
//! tests' in-process fake node keeps too; this fake is how a runtime
//! answers for it on the wire. A verbose `ImageStatus` names an image's
//! layers ([`FakeRuntime::set_layers`]) in the shape of the dialect.
//!
//! It owns no disk: a test that needs removals to free space passes an
//! effect to [`FakeRuntime::on_remove`].
//!
//! [`FakeRuntime::set_dialect`] makes it speak like another runtime, as
//! measured on the real ones (see the README's "Runtimes"): CRI-O lists
//! bare-hex ids, refuses to remove an image a container uses, answers OK
//! for an unknown id, and names its sandbox image in `Status` (1.36) or
//! nowhere (1.26); containerd 2.x names it only in `PodSandboxStatus`.
//! [`FakeRuntime::set_events`] picks how `GetContainerEvents` behaves. In
//! every streaming mode, as on every real runtime, the response headers
//! are sent only with the first event.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;
use tonic::{Code, Status};

use imagegc::cri::proto;
use imagegc::cri::{Container, ContainerState, Image};
use imagegc::sim::{SimDisk, SimNode, names};

mod server;
mod service;

pub use server::FakeServer;

/// The RPCs the fake serves, by their CRI method names. Fault injection and
/// call counting take these names; any other name panics, to catch typos.
pub const RPCS: [&str; 19] = [
    "Version",
    "RunPodSandbox",
    "StopPodSandbox",
    "RemovePodSandbox",
    "PodSandboxStatus",
    "ListPodSandbox",
    "CreateContainer",
    "StartContainer",
    "StopContainer",
    "RemoveContainer",
    "ListContainers",
    "ContainerStatus",
    "Status",
    "GetContainerEvents",
    "ListImages",
    "ImageStatus",
    "PullImage",
    "RemoveImage",
    "ImageFsInfo",
];

/// Which runtime the fake speaks like, where runtimes differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dialect {
    /// containerd 1.6/1.7: `sha256:` ids; the sandbox image in the verbose
    /// `Status` (`config.sandboxImage`), and each pod's in its verbose
    /// `PodSandboxStatus` (the runtime spec's annotations); removes images
    /// in use.
    #[default]
    Containerd,
    /// containerd 2.x: as containerd, but `Status` no longer names the
    /// sandbox image; verbose `PodSandboxStatus` does (`info.image` and the
    /// annotation `io.kubernetes.cri.podsandbox.image-name`).
    Containerd2,
    /// CRI-O 1.26: bare-hex ids, no `Status` info at all, the sandbox image
    /// named nowhere; refuses to remove an image in use; OK for an unknown id.
    Crio126,
    /// CRI-O 1.36: as 1.26, and the sandbox image in `Status` (`config`
    /// JSON `sandboxImage`) and `PodSandboxStatus` annotations
    /// (`io.kubernetes.cri-o.ImageName`).
    Crio136,
}

impl Dialect {
    fn is_crio(self) -> bool {
        matches!(self, Dialect::Crio126 | Dialect::Crio136)
    }
}

/// How `GetContainerEvents` behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Events {
    /// `Unimplemented` (containerd 1.6).
    #[default]
    Unimplemented,
    /// Every stream gets every event (containerd 2.x, CRI-O 1.36).
    Broadcast,
    /// One queue split between the open streams, each event going to one
    /// of them in turn (containerd 1.7, CRI-O 1.26): a second subscriber
    /// takes events away from the first.
    Shared,
    /// The stream ends, OK, as soon as it is opened (CRI-O with
    /// `enable_pod_events = false`, its default).
    EndAtOnce,
}

/// The sandbox image the fake reports until told otherwise: containerd's
/// default.
pub const DEFAULT_SANDBOX_IMAGE: &str = "registry.k8s.io/pause:3.9";

/// containerd's default image filesystem: the overlayfs snapshotter's root.
pub const DEFAULT_IMAGE_FS_MOUNT: &str = "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs";

/// Events buffered per open stream; a stream further behind loses the newest.
const EVENT_BUFFER: usize = 1024;

type EventItem = Result<proto::ContainerEventResponse, Status>;

/// Called inside `RemoveImage`, before the removal, with the requested reference.
pub type RemoveHook = Box<dyn Fn(&str) + Send + Sync>;

type SharedHook = Arc<dyn Fn(&str) + Send + Sync>;

/// Called after `RemoveImage` removed an image, with that image.
pub type RemoveEffect = Arc<dyn Fn(&Image) + Send + Sync>;

/// The removal effects of a [`SimDisk`], to give [`FakeRuntime::on_remove`]:
/// what a removal frees on the simulated disk.
pub trait DiskEffects {
    /// A removed image frees what it [occupied](SimDisk::occupy), nothing if
    /// it occupied nothing.
    fn free_on_remove(&self) -> RemoveEffect;
    /// A removed image frees the size the runtime lists for it.
    fn free_listed_size_on_remove(&self) -> RemoveEffect;
}

impl DiskEffects for SimDisk {
    fn free_on_remove(&self) -> RemoveEffect {
        let disk = self.clone();
        Arc::new(move |image: &Image| disk.release(&image.id))
    }

    fn free_listed_size_on_remove(&self) -> RemoveEffect {
        let disk = self.clone();
        Arc::new(move |image: &Image| disk.free(image.size))
    }
}

/// A fake container runtime. Clones share one state, so a test keeps a clone
/// to change the runtime and inspect its calls while it is being served.
#[derive(Clone)]
pub struct FakeRuntime {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
}

struct State {
    /// Its images, their layers and containers, and the removals made:
    /// the model the engine tests' fake node keeps too.
    node: SimNode,
    sandbox_image: Option<String>,
    image_fs_mount: String,
    /// The container filesystem `ImageFsInfo` names (a split store), if any.
    container_fs_mount: Option<String>,
    dialect: Dialect,
    /// Each pod sandbox, with the sandbox image it was started on.
    pods: Vec<(String, Option<String>)>,
    events: Events,
    /// The open event streams.
    subscribers: Vec<mpsc::Sender<EventItem>>,
    /// The next subscriber a shared queue hands an event to.
    next_subscriber: usize,
    /// Events replayed to the next stream opened.
    backlog: Vec<proto::ContainerEventResponse>,
    fail_remove: HashMap<String, Code>,
    fail_next: HashMap<&'static str, VecDeque<Status>>,
    fail_always: HashMap<&'static str, Status>,
    delays: HashMap<&'static str, Duration>,
    /// `(rpc, nth, delay)`: the nth call of rpc (1 = the first) waits this long.
    delays_nth: Vec<(&'static str, usize, Duration)>,
    before_remove: Option<SharedHook>,
    on_remove: Option<RemoveEffect>,
    /// How long a removal takes inside the runtime: it completes even when
    /// the client gave up waiting, as on a real runtime.
    remove_latency: Option<Duration>,
    /// `RemoveImage` answers OK and keeps the image.
    remove_keeps_image: bool,
    /// Entries added to every `ListImages` answer as they are (an id listed
    /// twice, an empty id).
    extra_listings: Vec<Image>,
    /// Hooks run right before the n-th call of an RPC is answered.
    call_hooks: Vec<(&'static str, usize, CallHook)>,
    calls: Vec<&'static str>,
    /// How many times each RPC was called: `calls` counted once per call,
    /// so a long-lived fake answers in constant time.
    call_counts: HashMap<&'static str, usize>,
}

/// Run at a chosen call: see [`FakeRuntime::hook_on_call`].
pub type CallHook = Arc<dyn Fn() + Send + Sync>;

impl State {
    /// The image `reference` names: its id, a tag or a digest. CRI-O
    /// takes an id only in its bare form (see `remove_image` for what it
    /// does with `sha256:<hex>`).
    fn find_image(&self, reference: &str) -> Option<&Image> {
        if self.dialect.is_crio()
            && let Some(image) = self.node.image(&format!("sha256:{reference}"))
        {
            return Some(image);
        }
        self.node.find(reference)
    }

    /// The id in the form this runtime lists it.
    fn listed_id(&self, id: &str) -> String {
        if self.dialect.is_crio() {
            id.strip_prefix("sha256:").unwrap_or(id).to_string()
        } else {
            id.to_string()
        }
    }

    /// Hands an event to the open streams as the event mode says; returns
    /// how many streams it reached.
    fn deliver(&mut self, event: proto::ContainerEventResponse) -> usize {
        self.subscribers.retain(|s| !s.is_closed());
        match self.events {
            Events::Shared if !self.subscribers.is_empty() => {
                let i = self.next_subscriber % self.subscribers.len();
                self.next_subscriber = i + 1;
                usize::from(self.subscribers[i].try_send(Ok(event)).is_ok())
            }
            Events::Broadcast => self
                .subscribers
                .iter()
                .filter(|s| s.try_send(Ok(event.clone())).is_ok())
                .count(),
            _ => 0,
        }
    }
}

/// The `RPCS` entry for `rpc`.
fn rpc_name(rpc: &str) -> &'static str {
    RPCS.iter()
        .find(|known| **known == rpc)
        .unwrap_or_else(|| panic!("{rpc:?} is not a CRI RPC the fake serves; expected one of {RPCS:?}"))
}

impl std::fmt::Debug for FakeRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("FakeRuntime")
            .field("images", &state.node.images().len())
            .field("containers", &state.node.containers.len())
            .field("calls", &state.calls.len())
            .finish_non_exhaustive()
    }
}

impl Default for FakeRuntime {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeRuntime {
    /// An empty runtime: no images, no containers, the sandbox image
    /// [`DEFAULT_SANDBOX_IMAGE`] (not listed as an image), the image
    /// filesystem at [`DEFAULT_IMAGE_FS_MOUNT`], no faults, and container
    /// events unimplemented (as in containerd 1.6).
    pub fn new() -> Self {
        let state = State {
            node: SimNode::default(),
            // What containerd reports when its config names none.
            sandbox_image: Some(DEFAULT_SANDBOX_IMAGE.to_string()),
            image_fs_mount: DEFAULT_IMAGE_FS_MOUNT.to_string(),
            container_fs_mount: None,
            dialect: Dialect::default(),
            pods: Vec::new(),
            events: Events::default(),
            subscribers: Vec::new(),
            next_subscriber: 0,
            backlog: Vec::new(),
            fail_remove: HashMap::new(),
            fail_next: HashMap::new(),
            fail_always: HashMap::new(),
            delays: HashMap::new(),
            delays_nth: Vec::new(),
            before_remove: None,
            on_remove: None,
            remove_latency: None,
            remove_keeps_image: false,
            extra_listings: Vec::new(),
            call_hooks: Vec::new(),
            calls: Vec::new(),
            call_counts: HashMap::new(),
        };
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(state),
            }),
        }
    }

    /// The state, even after a test panicked while holding it.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds an image, or replaces the image with the same id. Images are
    /// listed in the order they were first added.
    pub fn add_image(&self, image: Image) {
        self.lock().node.add_image(image);
    }

    /// The image with this id is made of these layers (diff ids): its
    /// verbose `ImageStatus` names them, in the shape of the dialect.
    pub fn set_layers(&self, id: &str, layers: Vec<String>) {
        self.lock().node.set_layers(id, layers);
    }

    /// Removes the image with this id, as if removed outside imagegc (by
    /// `crictl rmi`, say). Not recorded in [`removed`](Self::removed).
    pub fn remove_image_by_id(&self, id: &str) -> Option<Image> {
        self.lock().node.take_image(id)
    }

    /// Adds a container, or replaces the container with the same id. A
    /// container without a state is added as running.
    pub fn add_container(&self, mut container: Container) {
        container.state.get_or_insert(ContainerState::Running);
        self.lock().node.add_container(container);
    }

    /// Changes a container's state; false when there is no such container.
    pub fn set_container_state(&self, id: &str, new: ContainerState) -> bool {
        let mut state = self.lock();
        match state.node.containers.iter_mut().find(|c| c.id == id) {
            Some(container) => {
                container.state = Some(new);
                true
            }
            None => false,
        }
    }

    /// Removes a container, returning it when it existed.
    pub fn remove_container(&self, id: &str) -> Option<Container> {
        let mut state = self.lock();
        let index = state.node.containers.iter().position(|c| c.id == id)?;
        Some(state.node.containers.remove(index))
    }

    /// Sets the sandbox (pause) image the runtime uses. Where the dialect
    /// says the runtime names it: containerd 1.x and CRI-O 1.36 in the
    /// verbose `Status` (`sandboxImage` inside the JSON under `config`),
    /// containerd 2.x and CRI-O 1.36 in each pod's verbose
    /// `PodSandboxStatus`. `None`: named nowhere.
    pub fn set_sandbox_image(&self, image: Option<String>) {
        self.lock().sandbox_image = image;
    }

    /// Makes the fake speak like another runtime (see [`Dialect`]).
    pub fn set_dialect(&self, dialect: Dialect) {
        self.lock().dialect = dialect;
    }

    /// Adds a pod sandbox (listed by `ListPodSandbox`), started on the
    /// sandbox image the runtime names now.
    pub fn add_pod(&self, id: &str) {
        let mut state = self.lock();
        let image = state.sandbox_image.clone();
        state.pods.push((id.to_string(), image));
    }

    /// Adds a pod sandbox started on `image`, whatever sandbox image the
    /// runtime names now (it was configured away from it since).
    pub fn add_pod_on(&self, id: &str, image: &str) {
        self.lock().pods.push((id.to_string(), Some(image.to_string())));
    }

    /// Removes a pod sandbox.
    pub fn remove_pod(&self, id: &str) {
        self.lock().pods.retain(|(p, _)| p != id);
    }

    /// Sets the mount point `ImageFsInfo` reports.
    pub fn set_image_fs_mount(&self, path: impl AsRef<Path>) {
        self.lock().image_fs_mount = path.as_ref().to_string_lossy().into_owned();
    }

    /// Makes `ImageFsInfo` name `path` as the container filesystem, as a
    /// runtime with a split store does (CRI-O's `imagestore`).
    pub fn set_container_fs_mount(&self, path: impl AsRef<Path>) {
        self.lock().container_fs_mount = Some(path.as_ref().to_string_lossy().into_owned());
    }

    /// The images the runtime has now.
    pub fn images(&self) -> Vec<Image> {
        self.lock().node.images().to_vec()
    }

    /// The containers the runtime has now, each with its state.
    pub fn containers(&self) -> Vec<Container> {
        self.lock().node.containers.clone()
    }

    /// Makes every `RemoveImage` of this image (by id, tag or digest) fail
    /// with `code`, until [`clear_fail_remove`](Self::clear_fail_remove).
    pub fn fail_remove(&self, image_id: &str, code: Code) {
        self.lock().fail_remove.insert(image_id.to_string(), code);
    }

    /// Lets `RemoveImage` of this image succeed again.
    pub fn clear_fail_remove(&self, image_id: &str) {
        self.lock().fail_remove.remove(image_id);
    }

    /// Makes the next call of `rpc` fail with `status`. Calling it again
    /// queues more failures, answered one per call, before any
    /// [`fail_always`](Self::fail_always) failure.
    pub fn fail_next(&self, rpc: &str, status: Status) {
        let rpc = rpc_name(rpc);
        self.lock().fail_next.entry(rpc).or_default().push_back(status);
    }

    /// Makes every call of `rpc` fail with `status`; `None` clears it.
    pub fn fail_always(&self, rpc: &str, status: Option<Status>) {
        let rpc = rpc_name(rpc);
        let mut state = self.lock();
        match status {
            Some(status) => state.fail_always.insert(rpc, status),
            None => state.fail_always.remove(rpc),
        };
    }

    /// Makes every call of `rpc` wait this long before it is answered, as a
    /// hung runtime would; [`Duration::ZERO`] clears it. Stopping the server
    /// ends the wait, so a stopped test does not hang.
    pub fn delay(&self, rpc: &str, delay: Duration) {
        let rpc = rpc_name(rpc);
        let mut state = self.lock();
        if delay.is_zero() {
            state.delays.remove(rpc);
        } else {
            state.delays.insert(rpc, delay);
        }
    }

    /// Makes the `nth` call (1 = the first) of `rpc` wait this long before
    /// it is answered, as a runtime that hangs once would; the calls before
    /// and after it are answered at once. Stopping the server ends the wait.
    pub fn delay_nth(&self, rpc: &str, nth: usize, delay: Duration) {
        let rpc = rpc_name(rpc);
        self.lock().delays_nth.push((rpc, nth, delay));
    }

    /// Whether `GetContainerEvents` answers `Unimplemented`, as containerd 1.6
    /// does (the default). When false every stream gets every event passed
    /// to [`emit_event`](Self::emit_event) ([`Events::Broadcast`]).
    pub fn events_unimplemented(&self, unimplemented: bool) {
        self.set_events(if unimplemented {
            Events::Unimplemented
        } else {
            Events::Broadcast
        });
    }

    /// How `GetContainerEvents` behaves from now on.
    pub fn set_events(&self, events: Events) {
        self.lock().events = events;
    }

    /// How many event streams are open (waiting for their first event or
    /// streaming).
    pub fn event_subscribers(&self) -> usize {
        let mut state = self.lock();
        state.subscribers.retain(|s| !s.is_closed());
        state.subscribers.len()
    }

    /// Events the next stream opened gets first, as containerd replays its
    /// recent events to a new subscriber.
    pub fn set_event_backlog(&self, backlog: Vec<proto::ContainerEventResponse>) {
        self.lock().backlog = backlog;
    }

    /// An event about `container_id` whose one container status names
    /// `image` in its spec, created at `created_at`.
    pub fn event(container_id: &str, image: &str, created_at: SystemTime) -> proto::ContainerEventResponse {
        proto::ContainerEventResponse {
            container_id: container_id.to_string(),
            container_event_type: proto::ContainerEventType::ContainerStartedEvent as i32,
            created_at: created_at
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)),
            containers_statuses: vec![proto::ContainerStatus {
                id: container_id.to_string(),
                image: Some(proto::ImageSpec {
                    image: image.to_string(),
                    ..Default::default()
                }),
                ..Default::default()
            }],
        }
    }

    /// Sends an event to the open `GetContainerEvents` streams (each of
    /// them, or one in turn for [`Events::Shared`]) and returns how many
    /// streams it reached. The event carries one container status per entry
    /// of `images`, each naming that image in its spec.
    pub fn emit_event(&self, container_id: &str, event_type: proto::ContainerEventType, images: &[&str]) -> usize {
        let containers_statuses = images
            .iter()
            .map(|image| proto::ContainerStatus {
                id: container_id.to_string(),
                image: Some(proto::ImageSpec {
                    image: image.to_string(),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect();
        let event = proto::ContainerEventResponse {
            container_id: container_id.to_string(),
            container_event_type: event_type as i32,
            created_at: unix_nanos(),
            containers_statuses,
        };
        self.lock().deliver(event)
    }

    /// Runs `hook` inside every `RemoveImage`, after the call's injected
    /// delay and failures and before the image is looked up and removed, with
    /// the reference the request named; it replaces any earlier hook. A test
    /// uses it to change the runtime at the worst moment, such as starting a
    /// container on the image.
    pub fn hook_before_remove(&self, hook: RemoveHook) {
        self.lock().before_remove = Some(Arc::from(hook));
    }

    /// Makes each removal take `latency` inside the runtime, completing even
    /// when the client's deadline passed first (containerd and CRI-O go on
    /// with a removal whose caller went away).
    pub fn remove_latency(&self, latency: Option<Duration>) {
        self.lock().remove_latency = latency;
    }

    /// Makes `RemoveImage` answer OK and keep the image: a runtime whose
    /// word cannot be taken.
    pub fn remove_keeps_image(&self, keeps: bool) {
        self.lock().remove_keeps_image = keeps;
    }

    /// Adds `image` to every `ListImages` answer as it is, beside the
    /// images: an id listed a second time (runtimes do during a pull), or
    /// an entry with no id.
    pub fn add_listing(&self, image: Image) {
        self.lock().extra_listings.push(image);
    }

    /// Runs `hook` right before the `nth` call (1 = the first) of `rpc` is
    /// answered, after its delay: a test changes the runtime between two
    /// of imagegc's calls.
    pub fn hook_on_call(&self, rpc: &str, nth: usize, hook: impl Fn() + Send + Sync + 'static) {
        let rpc = rpc_name(rpc);
        self.lock().call_hooks.push((rpc, nth, Arc::new(hook)));
    }

    /// Runs `effect` after each successful removal, with the removed image
    /// (a test frees simulated disk space in it); `None` clears it.
    pub fn on_remove(&self, effect: Option<RemoveEffect>) {
        self.lock().on_remove = effect;
    }

    /// The RPCs received so far, in order, including failed ones.
    pub fn calls(&self) -> Vec<String> {
        self.lock().calls.iter().map(ToString::to_string).collect()
    }

    /// The ids of the images `RemoveImage` removed, in order.
    pub fn removed(&self) -> Vec<String> {
        self.lock().node.removed().to_vec()
    }

    /// How many times `rpc` was called.
    pub fn count(&self, rpc: &str) -> usize {
        let rpc = rpc_name(rpc);
        self.lock().call_counts.get(rpc).copied().unwrap_or(0)
    }
}

fn unix_nanos() -> i64 {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since_epoch.as_nanos()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::service::container_matches;
    use super::*;

    fn image(id: &str, tag: &str, digest: &str) -> Image {
        Image {
            repo_digests: vec![digest.to_string()].into(),
            ..crate::tagged_image(id, tag)
        }
    }

    #[test]
    fn an_image_is_found_by_id_tag_or_digest_exactly() {
        let fake = FakeRuntime::new();
        fake.add_image(image(
            "sha256:a",
            "docker.io/library/nginx:1.27",
            "docker.io/library/nginx@sha256:d",
        ));
        let state = fake.lock();
        for reference in [
            "sha256:a",
            "docker.io/library/nginx:1.27",
            "docker.io/library/nginx@sha256:d",
        ] {
            assert_eq!(
                state.find_image(reference).map(|i| i.id.as_str()),
                Some("sha256:a"),
                "{reference}"
            );
        }
        for reference in ["nginx:1.27", "sha256", "a", ""] {
            assert!(state.find_image(reference).is_none(), "{reference}");
        }
    }

    #[test]
    fn adding_an_existing_id_replaces_it_in_place() {
        let fake = FakeRuntime::new();
        fake.add_image(image("sha256:a", "a:1", "a@sha256:1"));
        fake.add_image(image("sha256:b", "b:1", "b@sha256:1"));
        fake.add_image(image("sha256:a", "a:2", "a@sha256:1"));
        let tags: Vec<_> = fake.images().into_iter().flat_map(|i| i.repo_tags.to_vec()).collect();
        assert_eq!(tags, ["a:2", "b:1"]);
    }

    #[test]
    fn images_stay_findable_after_one_before_them_is_removed() {
        let fake = FakeRuntime::new();
        for id in ["sha256:a", "sha256:b", "sha256:c"] {
            fake.add_image(image(id, &format!("{id}-tag"), &format!("{id}-digest")));
        }
        assert_eq!(
            fake.remove_image_by_id("sha256:a").map(|i| i.id).as_deref(),
            Some("sha256:a")
        );
        assert_eq!(fake.remove_image_by_id("sha256:a"), None);
        fake.add_image(image("sha256:c", "c:2", "c@sha256:2"));
        fake.add_image(image("sha256:d", "d:1", "d@sha256:1"));
        let state = fake.lock();
        for id in ["sha256:b", "sha256:c", "sha256:d"] {
            assert_eq!(state.find_image(id).map(|i| i.id.as_str()), Some(id));
        }
        let tags: Vec<_> = state.node.images().iter().flat_map(|i| i.repo_tags.to_vec()).collect();
        assert_eq!(tags, ["sha256:b-tag", "c:2", "d:1"]);
    }

    #[test]
    fn containers_without_a_state_are_running() {
        let fake = FakeRuntime::new();
        fake.add_container(Container {
            id: "c1".to_string(),
            ..Default::default()
        });
        assert_eq!(fake.containers()[0].state, Some(ContainerState::Running));
        assert!(fake.set_container_state("c1", ContainerState::Exited));
        assert!(!fake.set_container_state("c2", ContainerState::Exited));
        assert_eq!(fake.containers()[0].state, Some(ContainerState::Exited));
        assert_eq!(fake.remove_container("c1").map(|c| c.id).as_deref(), Some("c1"));
        assert!(fake.containers().is_empty());
    }

    #[test]
    fn container_filters_match_like_the_cri_describes() {
        let container = Container {
            id: "c1".to_string(),
            pod_sandbox_id: "p1".to_string(),
            state: Some(ContainerState::Exited),
            ..Default::default()
        };
        let exited = Some(proto::ContainerStateValue {
            state: proto::ContainerState::ContainerExited as i32,
        });
        let running = Some(proto::ContainerStateValue {
            state: proto::ContainerState::ContainerRunning as i32,
        });
        let filter = |id: &str, pod: &str, state| proto::ContainerFilter {
            id: id.to_string(),
            pod_sandbox_id: pod.to_string(),
            state,
            label_selector: HashMap::new(),
        };
        assert!(container_matches(&container, &filter("", "", None)));
        assert!(container_matches(&container, &filter("c1", "p1", exited)));
        assert!(!container_matches(&container, &filter("c2", "", None)));
        assert!(!container_matches(&container, &filter("", "p2", None)));
        assert!(!container_matches(&container, &filter("", "", running)));
        let mut labelled = filter("", "", None);
        labelled.label_selector.insert("app".to_string(), "x".to_string());
        assert!(!container_matches(&container, &labelled));
    }

    #[test]
    #[should_panic(expected = "not a CRI RPC")]
    fn misspelt_rpc_names_are_caught() {
        FakeRuntime::new().fail_next("RemoveImages", Status::internal("x"));
    }
}
