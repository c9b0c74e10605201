//! The attacked node: a runtime and an image filesystem in one, in
//! process, on tokio's (paused) clock, that the daemon talks to through the
//! [`Runtime`] and [`FsProbe`] traits, and that checks the invariant on
//! every `RemoveImage` it receives.
//!
//! It behaves as the runtimes do where it matters: a removal is carried out
//! by the runtime whether or not the client is still there to hear the
//! answer (a killed daemon, a deadline that passed), an image in use is
//! removed all the same when asked (containerd does), space comes back at
//! once or a moment after the call returns (containerd 2.x deletes in the
//! background), and something else always writes to the filesystem. Its
//! faults are what nodes do: slow answers, partial and empty listings,
//! a `RemoveImage` that answers OK and keeps the image, one that times out
//! and completes later or never.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use imagegc::cri::{
    Container, ContainerState, Image, ImageFsUsage, Removed, Runtime, RuntimeError, RuntimeStatus, RuntimeVersion,
};
use imagegc::fs::{FsError, FsProbe, FsStats};
use imagegc::policy::Protections;
use imagegc::sim::{SimDisk, SimNode};
use imagegc_testkit::XorShift;
use tokio::sync::watch;
use tokio::time::Instant;

/// The sandbox image the runtime names (`Status`).
pub const PAUSE: &str = "registry.k8s.io/pause:3.10";

/// The longest a `ListContainers` or `ImageStatus` is made to take.
pub const MAX_LATENCY: Duration = Duration::from_millis(40);

/// How each fault is dealt, in percent of the calls it can strike (all 0
/// once the node calms down).
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// Longest extra time a `ListContainers` or `ImageStatus` takes.
    pub max_latency: Duration,
    /// A `ListImages` that omits some images.
    pub partial_listing: u64,
    /// A `ListImages` that lists nothing.
    pub empty_listing: u64,
    /// A container created on the image right after a `ListContainers` or
    /// an `ImageStatus` answered (the image just re-checked, when there is
    /// one).
    pub create_after_call: u64,
    /// A `RemoveImage` that answers OK and keeps the image (once per image
    /// at most, as `status_not_found`).
    pub lying: u64,
    /// A `RemoveImage` refused (the runtime still has the image).
    pub refused: u64,
    /// A `RemoveImage` that times out; the runtime removes the image then,
    /// a little later (up to 90 s), or never.
    pub timeout: u64,
    /// A `RemoveImage` that takes up to 3 s (a slow disk).
    pub slow_remove: u64,
    /// The daemon killed as a call arrives or answers (between any two of
    /// its steps that talk to the runtime).
    pub kill_at_call: u64,
    /// An `ImageStatus` that answers `NotFound` for an image that is there
    /// (a glitch: once per image at most; one wrong answer is what the
    /// daemon must not take for the truth, two agreeing ones a second
    /// apart are what it goes by).
    pub status_not_found: u64,
    /// An `ImageStatus` that answers with fewer names than the image has
    /// (its first tag alone, no digest): one entry of an id listed twice,
    /// a name dropped since.
    pub status_fewer_names: u64,
    /// A `ListImages` that lists an image twice, its names split between
    /// the two entries (an image being pulled or tagged).
    pub listed_twice: u64,
}

impl Faults {
    /// A node under attack, its fault rates drawn from `rng`.
    pub fn drawn(rng: &mut XorShift) -> Faults {
        Faults {
            max_latency: Duration::from_millis(rng.between(0, MAX_LATENCY.as_millis() as u64)),
            partial_listing: rng.between(0, 30),
            empty_listing: rng.between(0, 5),
            create_after_call: rng.between(0, 40),
            lying: rng.between(0, 5),
            refused: rng.between(0, 5),
            timeout: rng.between(0, 10),
            slow_remove: rng.between(0, 20),
            kill_at_call: rng.between(0, 3),
            status_not_found: rng.between(0, 10),
            status_fewer_names: rng.between(0, 60),
            listed_twice: rng.between(0, 30),
        }
    }
}

/// An image as the node holds it.
#[derive(Debug, Clone)]
struct Held {
    image: Image,
    /// Bytes it takes on the filesystem.
    bytes: u64,
}

/// A pod bound to the node, naming an image, and when it was bound.
#[derive(Debug, Clone)]
struct Bound {
    /// The name the pod gives the image: any of its tags or digests.
    reference: String,
    /// The image that name stood for when the pod was bound.
    image: String,
    pod: String,
    at: Instant,
}

/// Everything the node is and has seen.
pub struct World {
    pub rng: XorShift,
    pub faults: Faults,
    /// The images and containers (the model the engine's and the test
    /// kit's fakes keep too).
    node: SimNode,
    /// When each container was created, by id.
    created: HashMap<String, Instant>,
    /// The image each container runs, by container id: what it really
    /// uses, whatever name it gives.
    runs: HashMap<String, String>,
    /// The images imagegc said someone else removed, in order.
    pub said_removed_by_others: Vec<String>,
    /// The images the runtime gave a wrong answer about (an `ImageStatus`
    /// that said they were not there, a `RemoveImage` that said OK and kept
    /// them): each gets one at most, so that two answers that agree are
    /// the truth, as imagegc takes them.
    lied_about: std::collections::HashSet<String>,
    /// Images the registry has: what pulls bring (by id).
    catalog: Vec<Held>,
    pods: Vec<Bound>,
    pods_tx: watch::Sender<Arc<Protections>>,
    /// The image filesystem, on tokio's clock: a removal's space back at
    /// once or a moment later, another writer never still for long.
    disk: SimDisk,
    /// When the node started, for messages.
    started: Instant,
    /// Each removal the runtime carried out because imagegc asked, in order.
    pub removed_by_imagegc: Vec<String>,
    /// Removals imagegc asked for that the runtime still works on.
    pub removing: Vec<String>,
    /// Images removed by someone else (another collector, `crictl rmi`).
    pub removed_by_others: Vec<String>,
    /// Every broken promise, described.
    pub violations: Vec<String>,
    /// The `RemoveImage` calls received.
    pub remove_calls: usize,
    /// The latest image asked about with `ImageStatus`.
    last_status: Option<String>,
    next_container: u64,
    /// Rung to have the daemon killed now.
    pub kill: Arc<tokio::sync::Notify>,
    /// The allowance for a removal: how long before the call a container
    /// may have been created, or a pod bound, and still be missed (the
    /// re-check's round trip and the promised freshness).
    pub allowance: Duration,
}

/// The node, shared by the daemon (as its runtime and disk) and the test.
#[derive(Clone)]
pub struct Node(pub Arc<Mutex<World>>);

impl Node {
    /// A node with `count` images of the catalog pulled, most of them used
    /// by a container, on a filesystem of `capacity` bytes.
    pub fn new(seed: u64, catalog: usize, pulled: usize, capacity: u64) -> (Node, watch::Receiver<Arc<Protections>>) {
        let mut rng = XorShift::new(seed);
        let catalog: Vec<Held> = (0..catalog)
            .map(|i| {
                let size = rng.between(capacity / 100, capacity / 20);
                let mut image = imagegc_testkit::image(&format!("app{i:03}"), size);
                if rng.chance(50) {
                    // A second tag, as a release and its `latest` carry.
                    let extra = format!("registry.example.com/team/app{i:03}:latest");
                    image.repo_tags = image.repo_tags.iter().map(str::to_owned).chain([extra]).collect();
                }
                // Shared layers: an image may free less than its size.
                let bytes = size * rng.between(30, 100) / 100;
                Held { image, bytes }
            })
            .collect();
        let (pods_tx, pods_rx) = watch::channel(Arc::new(Protections::default()));
        let mut world = World {
            rng,
            faults: Faults::default(),
            node: SimNode::default(),
            created: HashMap::new(),
            runs: HashMap::new(),
            said_removed_by_others: Vec::new(),
            lied_about: std::collections::HashSet::new(),
            catalog,
            pods: Vec::new(),
            pods_tx,
            disk: SimDisk::new(capacity, capacity),
            started: Instant::now(),
            removed_by_imagegc: Vec::new(),
            removing: Vec::new(),
            removed_by_others: Vec::new(),
            violations: Vec::new(),
            remove_calls: 0,
            last_status: None,
            next_container: 0,
            allowance: Duration::ZERO,
            kill: Arc::new(tokio::sync::Notify::new()),
        };
        world.disk.held_by_other(move |since| other_writer(capacity, since));
        for i in 0..pulled.min(world.catalog.len()) {
            let held = world.catalog[i].clone();
            world.disk.write(&held.image.id, held.bytes);
            world.node.add_image(held.image);
        }
        (Node(Arc::new(Mutex::new(world))), pods_rx)
    }

    /// The world, locked.
    pub fn world(&self) -> std::sync::MutexGuard<'_, World> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn latency(&self) {
        let delay = {
            let mut w = self.world();
            let max = w.faults.max_latency.as_millis() as u64;
            Duration::from_millis(w.rng.between(0, max))
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }
}

impl World {
    /// Prints what happens when `IMAGEGC_INVARIANT_TRACE` is set (replaying
    /// a seed).
    pub fn trace(&self, what: impl std::fmt::Display) {
        if std::env::var_os("IMAGEGC_INVARIANT_TRACE").is_some() {
            eprintln!("[{}] {what}", self.at(Instant::now()));
        }
    }

    /// The virtual time since the node started, for messages.
    fn at(&self, when: Instant) -> String {
        format!("{:.3}s", when.duration_since(self.started).as_secs_f64())
    }

    /// Whether `container` runs `image`.
    fn uses(&self, container: &Container, image: &Image) -> bool {
        self.runs.get(&container.id) == Some(&image.id)
    }

    /// One of the names of `image`, at random: a tag or a digest.
    fn any_name(&mut self, image: &Image) -> String {
        let names: Vec<&str> = image.repo_tags.iter().chain(image.repo_digests.iter()).collect();
        if names.is_empty() {
            return image.id.clone();
        }
        names[self.rng.between(0, names.len() as u64 - 1) as usize].to_owned()
    }

    /// Has the daemon killed now, at `kill_at_call`'s rate.
    fn maybe_kill(&mut self, at: &str) {
        if self.rng.chance(self.faults.kill_at_call) {
            self.trace(format_args!("kill requested at {at}"));
            self.kill.notify_one();
        }
    }

    /// Binds a pod naming the image `id` now.
    fn bind_pod_on(&mut self, id: &str) {
        let Some(image) = self.node.image(id).cloned() else {
            return;
        };
        let reference = self.any_name(&image);
        let pod = format!("default/pod-{}", self.next_container);
        self.next_container += 1;
        self.pods.push(Bound {
            reference,
            image: image.id.clone(),
            pod,
            at: Instant::now(),
        });
        self.publish_pods();
    }

    fn publish_pods(&mut self) {
        let references = self.pods.iter().map(|b| (b.reference.clone(), b.pod.clone())).collect();
        self.pods_tx.send_replace(Arc::new(Protections {
            references,
            ..Default::default()
        }));
    }

    /// Whether the node holds the image `id`.
    pub fn has_image(&self, id: &str) -> bool {
        self.node.image(id).is_some()
    }

    /// Creates a container on `id` now.
    /// Creates a container on `id` now, naming it as runtimes do: by id
    /// (containerd), or by a tag or a repository digest alone with no
    /// image id (CRI-O before CRI 1.31), in any state.
    pub fn create_container(&mut self, id: &str) {
        let Some(image) = self.node.image(id).cloned() else {
            return;
        };
        self.next_container += 1;
        let mut container = imagegc_testkit::container_using(&format!("c{:05}", self.next_container), &image);
        match self.rng.between(0, 2) {
            0 => {}
            1 => {
                let tag = image.repo_tags.iter().collect::<Vec<_>>();
                if !tag.is_empty() {
                    let name = tag[self.rng.between(0, tag.len() as u64 - 1) as usize].to_owned();
                    container.image = name.clone();
                    container.image_ref = name;
                }
            }
            _ => {
                // A pod that names the image by a digest: CRI-O reports the
                // digest as `image_ref`, and no image id.
                let name = self.any_name(&image);
                container.image = name.clone();
                container.image_ref = name;
            }
        }
        container.state = Some(match self.rng.between(0, 2) {
            0 => ContainerState::Created,
            1 => ContainerState::Running,
            _ => ContainerState::Exited,
        });
        self.created.insert(container.id.clone(), Instant::now());
        self.runs.insert(container.id.clone(), image.id.clone());
        self.node.containers.push(container);
    }

    /// Creates a container on an image no container uses, if any.
    fn create_container_on_unused(&mut self) {
        let unused: Vec<String> = self
            .node
            .images()
            .iter()
            .filter(|i| !self.node.containers.iter().any(|c| self.uses(c, i)))
            .map(|i| i.id.clone())
            .collect();
        if unused.is_empty() {
            return self.create_container_anywhere();
        }
        let id = unused[self.rng.between(0, unused.len() as u64 - 1) as usize].clone();
        self.create_container(&id);
    }

    /// Creates a container on a random image.
    pub fn create_container_anywhere(&mut self) {
        if let Some(id) = self.pick_image() {
            self.create_container(&id);
        }
    }

    /// Deletes a random container.
    pub fn delete_container(&mut self) {
        if !self.node.containers.is_empty() {
            let i = self.rng.between(0, self.node.containers.len() as u64 - 1) as usize;
            let gone = self.node.containers.swap_remove(i);
            self.created.remove(&gone.id);
            self.runs.remove(&gone.id);
        }
    }

    /// Binds a pod naming a random image's tag, or unbinds one.
    pub fn bind_or_unbind_pod(&mut self) {
        if !self.pods.is_empty() && self.rng.chance(40) {
            let i = self.rng.between(0, self.pods.len() as u64 - 1) as usize;
            self.pods.swap_remove(i);
        } else if let Some(id) = self.pick_image() {
            self.bind_pod_on(&id);
            return;
        }
        self.publish_pods();
    }

    /// Pulls an image of the catalog not on the node (a new one or one
    /// removed before), unless `pending` names it: an image whose removal
    /// is still to be settled by imagegc is not pulled back meanwhile (no
    /// collector could tell its removal from a pull then).
    pub fn pull(&mut self, pending: &[String]) {
        let absent: Vec<usize> = (0..self.catalog.len())
            .filter(|&i| {
                let id = &self.catalog[i].image.id;
                self.node.image(id).is_none() && !pending.contains(id) && !self.removing.contains(id)
            })
            .collect();
        if absent.is_empty() {
            return;
        }
        let i = absent[self.rng.between(0, absent.len() as u64 - 1) as usize];
        let held = self.catalog[i].clone();
        self.trace(format_args!("pulled {}", held.image.id));
        self.disk.write(&held.image.id, held.bytes);
        self.node.add_image(held.image);
    }

    /// Another collector removes an unused image, unless imagegc has a
    /// removal of it to settle.
    pub fn remove_by_other(&mut self, pending: &[String]) {
        let Some(id) = self.pick_image() else {
            return;
        };
        let image = self.node.image(&id).expect("picked");
        let used = self.node.containers.iter().any(|c| self.uses(c, image));
        if used || pending.contains(&id) || self.removing.contains(&id) {
            return;
        }
        self.node.take_image(&id).expect("picked");
        self.disk.release(&id);
        self.trace(format_args!("removed {id} by another collector (pending: {pending:?})"));
        self.removed_by_others.push(id);
    }

    fn pick_image(&mut self) -> Option<String> {
        let images = self.node.images();
        if images.is_empty() {
            return None;
        }
        let i = self.rng.between(0, images.len() as u64 - 1) as usize;
        Some(images[i].id.clone())
    }

    /// The invariant at a `RemoveImage` of `id` received now.
    fn check_removal(&mut self, id: &str) {
        let now = Instant::now();
        let Some(image) = self.node.image(id).cloned() else {
            return;
        };
        let allowed_since = now.checked_sub(self.allowance).unwrap_or(self.started);
        let using: Vec<String> = self
            .node
            .containers
            .iter()
            .filter_map(|c| Some((c, *self.created.get(&c.id)?)))
            .filter(|&(c, created)| created < allowed_since && self.uses(c, &image))
            .map(|(c, created)| format!("container {} created at {}", c.id, self.at(created)))
            .collect();
        let naming: Vec<String> = self
            .pods
            .iter()
            .filter(|b| b.at < allowed_since && b.image == image.id)
            .map(|b| format!("pod {} bound at {}", b.pod, self.at(b.at)))
            .collect();
        if !using.is_empty() || !naming.is_empty() {
            let what = using.into_iter().chain(naming).collect::<Vec<_>>().join(", ");
            self.violations.push(format!(
                "RemoveImage({}) at {} while in use: {what} (allowance {:?})",
                image.repo_tags.first().unwrap_or(&image.id),
                self.at(now),
                self.allowance
            ));
        }
    }

    /// Carries out a removal imagegc asked for, now (a no-op when the
    /// image went meanwhile).
    fn carry_out(&mut self, id: &str, background: bool) {
        // One call's work done; another call's on the same image may still
        // be under way (and keeps the image from being pulled back).
        if let Some(i) = self.removing.iter().position(|r| r == id) {
            self.removing.swap_remove(i);
        }
        if self.node.remove(id).is_none() {
            return;
        }
        if background {
            let back = Instant::now() + Duration::from_millis(self.rng.between(1, 300));
            self.disk.release_at(id, back);
        } else {
            self.disk.release(id);
        }
        self.trace(format_args!("removed {id} at imagegc's request"));
        self.removed_by_imagegc.push(id.to_owned());
    }
}

/// Bytes something else holds on a filesystem of `capacity`, `since` the
/// node started: a log growing and rotated, an emptyDir filled and
/// emptied; never still for long.
fn other_writer(capacity: u64, since: Duration) -> u64 {
    let ms = since.as_millis() as u64;
    (ms / 7 % 97) * (capacity / 2000) + (ms / 1000 % 13) * (capacity / 200)
}

fn rpc_error(rpc: &'static str, status: tonic::Status) -> RuntimeError {
    RuntimeError::Rpc {
        rpc,
        endpoint: "unix:///node.sock".to_string(),
        status: Box::new(status),
    }
}

impl Runtime for Node {
    fn endpoint(&self) -> &str {
        "unix:///node.sock"
    }

    async fn version(&self) -> Result<RuntimeVersion, RuntimeError> {
        Ok(RuntimeVersion::default())
    }

    async fn status(&self) -> Result<RuntimeStatus, RuntimeError> {
        Ok(RuntimeStatus {
            sandbox_image: Some(PAUSE.to_string()),
        })
    }

    async fn list_images(&self) -> Result<Vec<Image>, RuntimeError> {
        self.latency().await;
        let mut guard = self.world();
        let w = &mut *guard;
        if w.rng.chance(w.faults.empty_listing) {
            return Ok(Vec::new());
        }
        let partial = w.rng.chance(w.faults.partial_listing);
        if partial {
            w.trace("ListImages: partial");
        }
        let mut images: Vec<Image> = w.node.images().to_vec();
        images.retain(|_| !partial || !w.rng.chance(30));
        if !images.is_empty() && w.rng.chance(w.faults.listed_twice) {
            // One id twice, its names split: the first tag in one entry,
            // the other tags and the digests in the other.
            let at = w.rng.between(0, images.len() as u64 - 1) as usize;
            let image = images[at].clone();
            w.trace(format_args!("ListImages: {} listed twice", image.id));
            images[at].repo_tags = image.repo_tags.iter().take(1).map(str::to_owned).collect();
            images[at].repo_digests = Default::default();
            images.push(Image {
                repo_tags: image.repo_tags.iter().skip(1).map(str::to_owned).collect(),
                ..image
            });
        }
        Ok(images)
    }

    async fn list_containers(&self) -> Result<Vec<Container>, RuntimeError> {
        // What the runtime answers is as it was when the call arrived; the
        // answer takes its time.
        let answer: Vec<Container> = self.world().node.containers.clone();
        self.latency().await;
        let mut guard = self.world();
        let w = &mut *guard;
        if w.rng.chance(w.faults.create_after_call) {
            match w.last_status.clone() {
                // The image just re-checked, or one no container uses (a
                // candidate, likely): a pod starting on an old image.
                Some(id) if w.rng.chance(50) => w.create_container(&id),
                _ => w.create_container_on_unused(),
            }
        }
        if let Some(id) = w.last_status.clone()
            && w.rng.chance(w.faults.create_after_call / 2)
        {
            // A pod bound between the plan and the call.
            w.bind_pod_on(&id);
        }
        w.maybe_kill("ListContainers' answer");
        Ok(answer)
    }

    async fn image_status(&self, id: &str) -> Result<Option<Image>, RuntimeError> {
        let answer = {
            let mut w = self.world();
            let answer = w.node.image(id).cloned();
            let faults = w.faults;
            if answer.is_some() && !w.lied_about.contains(id) && w.rng.chance(faults.status_not_found) {
                w.lied_about.insert(id.to_owned());
                w.trace(format_args!("ImageStatus({id}): NotFound, though it is there"));
                None
            } else if w.rng.chance(faults.status_fewer_names) {
                answer.map(|mut image| {
                    image.repo_tags = image.repo_tags.iter().take(1).map(str::to_owned).collect();
                    image.repo_digests = Default::default();
                    image
                })
            } else {
                answer
            }
        };
        self.latency().await;
        let mut guard = self.world();
        let w = &mut *guard;
        w.last_status = Some(id.to_owned());
        if w.rng.chance(w.faults.create_after_call) {
            w.create_container(id);
        }
        w.maybe_kill("ImageStatus' answer");
        Ok(answer)
    }

    async fn image_fs_info(&self) -> Result<Vec<ImageFsUsage>, RuntimeError> {
        Ok(vec![ImageFsUsage {
            mount_point: "/node".to_string(),
            ..Default::default()
        }])
    }

    async fn remove_image(&self, id: &str) -> Result<Removed, RuntimeError> {
        enum How {
            Done {
                background: bool,
            },
            Lying,
            Refused,
            /// Times out after the first duration; carried out after the
            /// second, or never.
            TimesOut(Duration, Option<Duration>),
        }
        let (how, slow) = {
            let mut w = self.world();
            w.remove_calls += 1;
            w.check_removal(id);
            if w.node.image(id).is_none() {
                return Ok(Removed::AlreadyGone);
            }
            let f = w.faults;
            let slow = if w.rng.chance(f.slow_remove) {
                Duration::from_millis(w.rng.between(10, 3000))
            } else {
                Duration::from_millis(w.rng.between(0, 3))
            };
            let how = if !w.lied_about.contains(id) && w.rng.chance(f.lying) {
                // One wrong answer per image: not a `NotFound` besides.
                w.lied_about.insert(id.to_owned());
                How::Lying
            } else if w.rng.chance(f.refused) {
                How::Refused
            } else if w.rng.chance(f.timeout) {
                let later = match w.rng.between(0, 2) {
                    0 => None,
                    1 => Some(Duration::from_millis(w.rng.between(0, 2000))),
                    _ => Some(Duration::from_millis(w.rng.between(2000, 90_000))),
                };
                How::TimesOut(Duration::from_secs(2), later)
            } else {
                How::Done {
                    background: w.rng.chance(50),
                }
            };
            let what = match &how {
                How::Done { background } => format!("done (background {background})"),
                How::Lying => "lying".to_string(),
                How::Refused => "refused".to_string(),
                How::TimesOut(_, later) => format!("times out, carried out after {later:?}"),
            };
            w.trace(format_args!("RemoveImage({id}): {what}, slow {slow:?}"));
            w.maybe_kill("RemoveImage's arrival");
            (how, slow)
        };
        match how {
            How::Done { background } => {
                // The runtime works on it whether or not the caller is
                // still there when it is done.
                self.world().removing.push(id.to_owned());
                let node = self.clone();
                let id = id.to_owned();
                let work = tokio::spawn(async move {
                    tokio::time::sleep(slow).await;
                    node.world().carry_out(&id, background);
                });
                let _ = work.await;
                self.world().maybe_kill("RemoveImage's answer");
                Ok(Removed::Done)
            }
            How::Lying => {
                tokio::time::sleep(slow).await;
                Ok(Removed::Done)
            }
            How::Refused => {
                tokio::time::sleep(slow).await;
                Err(rpc_error(
                    "RemoveImage",
                    tonic::Status::failed_precondition("image is in use by a container"),
                ))
            }
            How::TimesOut(deadline, later) => {
                if let Some(later) = later {
                    self.world().removing.push(id.to_owned());
                    let node = self.clone();
                    let id = id.to_owned();
                    tokio::spawn(async move {
                        tokio::time::sleep(later).await;
                        node.world().carry_out(&id, false);
                    });
                }
                tokio::time::sleep(deadline).await;
                Err(RuntimeError::Timeout {
                    rpc: "RemoveImage",
                    endpoint: "unix:///node.sock".to_string(),
                    timeout: deadline,
                })
            }
        }
    }
}

/// What imagegc says of removals by others, noted on the node.
impl imagegc::engine::Sink for Node {
    fn emit(&self, event: &imagegc::engine::Event<'_>) {
        if let imagegc::engine::Event::RemovedByOthers { images, .. } = event {
            let mut w = self.world();
            for image in *images {
                w.trace(format_args!("imagegc says {} was removed by someone else", image.id));
                w.said_removed_by_others.push(image.id.clone());
            }
        }
    }
}

impl FsProbe for Node {
    fn stats(&self, path: &Path) -> Result<FsStats, FsError> {
        let disk = self.world().disk.clone();
        disk.stats(path)
    }
}
