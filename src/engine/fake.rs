//! One fake node for the engine's tests: a runtime and its image
//! filesystem in one ([`SimHandle`]), with hooks to fail, hang, delay or
//! script each call, and the moves of other writers (a container created
//! between two calls, an image someone else removes). What the node holds
//! is [`SimNode`] and its filesystem [`SimDisk`], the model and the disk
//! the test kit's gRPC fake runtime keeps too (space coming back in the
//! background, other writers, scripted or failing readings, a split
//! store).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::cri::{ImageFsUsage, Removed, Runtime, RuntimeError, RuntimeStatus, RuntimeVersion};

use crate::fs::{FsError, FsProbe, FsStats};
use crate::model::{Container, Image};
use crate::sim::{SimDisk, SimNode};

/// A runtime and a disk in one: removing an image gives back the bytes
/// the test says it occupies on disk (0 for an image whose layers are
/// all shared with another image still present).
#[derive(Default)]
pub(super) struct Sim {
    /// The image filesystem (and, for a split store, the container
    /// filesystem at [`CONTAINER_FS`]).
    pub(super) disk: SimDisk,
    /// Its images (and their layers, which the verbose `ImageStatus`
    /// names), its containers, and the removals made.
    pub(super) node: SimNode,
    pub(super) fail_remove: Vec<String>,
    /// `RemoveImage` of these times out and removes nothing.
    pub(super) hang_remove: Vec<String>,
    /// A removal of an image in `hang_remove` that the runtime finishes
    /// late: right before the n-th `ListImages` after the call, or at a
    /// second `RemoveImage` of it (which then answers not found).
    pub(super) finish_after_lists: HashMap<String, usize>,
    /// Those removals under way, with the listings left until done.
    pub(super) finishing: Vec<(String, usize)>,
    /// `ListImages` leaves these out (a partial listing); `ImageStatus`
    /// still finds them.
    pub(super) omit: Vec<String>,
    /// `ImageStatus` fails while set.
    pub(super) fail_image_status: bool,
    /// `ImageStatus` of these fails.
    pub(super) fail_image_status_of: Vec<String>,
    /// `ImageStatus` of these answers `NotFound` once each, though the
    /// image is there (a runtime not to be believed).
    pub(super) status_not_found_once: Vec<String>,
    /// `ImageStatus` of these answers with the first tag alone and no
    /// digest (one entry of an id listed twice, a tag moved since).
    pub(super) status_fewer_names: Vec<String>,
    /// ListContainers fails while set: the runtime is down.
    pub(super) fail_lists: bool,
    pub(super) fail_status: bool,
    /// When each removal was made (tokio's clock).
    pub(super) removed_at: Vec<tokio::time::Instant>,
    /// How long ListContainers takes (tokio's clock).
    pub(super) list_delay: Duration,
    /// How long each `ContainerStatus` (a container's mounts) takes.
    pub(super) mounts_delay: Duration,
    /// Containers that appear right before the n-th ListContainers call.
    pub(super) appear_at_list: Option<(usize, Container)>,
    /// A container that appears right after the n-th ListContainers call
    /// answered (a container created on an image just re-checked).
    pub(super) appear_after_list: Option<(usize, Container)>,
    /// An image someone else removes right before the n-th
    /// ListContainers call (after the listing of images that had it).
    pub(super) vanish_at_list: Option<(usize, String)>,
    /// A tag an image gains right before the n-th ListContainers call.
    pub(super) tag_at_list: Option<(usize, String, String)>,
    /// An image someone else removes right before the n-th ListContainers
    /// call.
    pub(super) gone_at_list: Option<(usize, String)>,
    /// Keep rules published right before the n-th ListContainers call (a
    /// pod bound to the node meanwhile).
    pub(super) pods_at_list: Option<(usize, PodsSender, crate::policy::Protections)>,
    pub(super) lists: usize,
    /// A split store (KEP-4191): `ImageFsInfo` names a container
    /// filesystem at [`CONTAINER_FS`] (see [`Sim::split_store`]).
    split_store: bool,
    /// The container event stream breaks as soon as it is opened (a
    /// runtime that accepts the call and fails it at once).
    pub(super) events_break: bool,
    /// How many times the event stream was opened.
    pub(super) event_opens: usize,
    /// `RemoveImage` of these answers OK and the image stays listed (a
    /// runtime not to be believed), though its space comes back.
    keep_on_remove: Vec<String>,
    /// A file read at each `RemoveImage` call, with what it held then (the
    /// pending notes, as a process killed during the call leaves them).
    pub(super) read_at_remove: Option<std::path::PathBuf>,
    pub(super) read_at_remove_found: Vec<(String, String)>,
    /// How many times layers were asked for.
    pub(super) layer_asks: usize,
}

/// Where the split store's container filesystem is mounted in [`Sim`].
pub(super) const CONTAINER_FS: &str = "/sim-containers";

pub(super) type PodsSender = tokio::sync::watch::Sender<Arc<crate::policy::Protections>>;

impl Sim {
    /// `RemoveImage` of `id` answers OK from now on and keeps the image
    /// listed, though its space comes back.
    pub(super) fn keeps_on_remove(&mut self, id: &str) {
        self.keep_on_remove.push(id.to_string());
    }

    /// An unused image of `size` reported bytes that takes `on_disk` bytes
    /// of the filesystem (what its removal gives back).
    pub(super) fn unused(&mut self, id: &str, size: u64, on_disk: u64) {
        self.node.add_image(crate::testing::library_image(id, size));
        self.disk.occupy(id, on_disk);
    }

    /// A split store (KEP-4191): `ImageFsInfo` names a container
    /// filesystem at [`CONTAINER_FS`], another filesystem of this capacity
    /// and available bytes, which removing images never changes.
    pub(super) fn split_store(&mut self, capacity: u64, available: u64) {
        self.split_store = true;
        self.disk.other_filesystem_sized(CONTAINER_FS, capacity, available);
    }
}

#[derive(Clone, Default)]
pub(super) struct SimHandle(pub(super) Arc<Mutex<Sim>>);

impl Sim {
    /// The runtime removes an image.
    pub(super) fn remove(&mut self, id: &str) {
        if self.node.remove(id).is_some() {
            self.disk.release(id);
            self.removed_at.push(tokio::time::Instant::now());
        }
    }
}

impl SimHandle {
    pub(super) fn with(&self, f: impl FnOnce(&mut Sim)) {
        f(&mut self.0.lock().unwrap());
    }
    pub(super) fn removed(&self) -> Vec<String> {
        self.0.lock().unwrap().node.removed().to_vec()
    }
}

impl Runtime for SimHandle {
    fn endpoint(&self) -> &str {
        "unix:///sim.sock"
    }
    async fn version(&self) -> Result<RuntimeVersion, RuntimeError> {
        Ok(RuntimeVersion::default())
    }
    async fn status(&self) -> Result<RuntimeStatus, RuntimeError> {
        if self.0.lock().unwrap().fail_status {
            return Err(RuntimeError::Rpc {
                rpc: "Status",
                endpoint: "unix:///sim.sock".to_string(),
                status: Box::new(tonic::Status::internal("injected failure")),
            });
        }
        Ok(RuntimeStatus {
            sandbox_image: Some("registry.k8s.io/pause:3.9".to_string()),
        })
    }
    async fn list_images(&self) -> Result<Vec<Image>, RuntimeError> {
        let mut sim = self.0.lock().unwrap();
        let mut finished = Vec::new();
        for (id, left) in &mut sim.finishing {
            *left = left.saturating_sub(1);
            if *left == 0 {
                finished.push(id.clone());
            }
        }
        sim.finishing.retain(|(_, left)| *left > 0);
        for id in finished {
            sim.remove(&id);
        }
        Ok(sim
            .node
            .images()
            .iter()
            .filter(|i| !sim.omit.contains(&i.id))
            .cloned()
            .collect())
    }
    async fn image_layers(&self, id: &str) -> Result<Option<Vec<String>>, RuntimeError> {
        let mut sim = self.0.lock().unwrap();
        sim.layer_asks += 1;
        Ok(sim.node.layers(id).map(<[String]>::to_vec))
    }
    async fn image_status(&self, id: &str) -> Result<Option<Image>, RuntimeError> {
        let mut sim = self.0.lock().unwrap();
        if sim.fail_image_status || sim.fail_image_status_of.iter().any(|f| f == id) {
            return Err(RuntimeError::Rpc {
                rpc: "ImageStatus",
                endpoint: "unix:///sim.sock".to_string(),
                status: Box::new(tonic::Status::unavailable("injected failure")),
            });
        }
        if let Some(at) = sim.status_not_found_once.iter().position(|f| f == id) {
            sim.status_not_found_once.remove(at);
            return Ok(None);
        }
        let fewer = sim.status_fewer_names.iter().any(|f| f == id);
        Ok(sim.node.image(id).cloned().map(|mut image| {
            if fewer {
                image.repo_tags = image.repo_tags.iter().take(1).map(str::to_owned).collect();
                image.repo_digests = Default::default();
            }
            image
        }))
    }
    async fn list_containers(&self) -> Result<Vec<Container>, RuntimeError> {
        let delay = self.0.lock().unwrap().list_delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut sim = self.0.lock().unwrap();
        if sim.fail_lists {
            return Err(RuntimeError::Rpc {
                rpc: "ListContainers",
                endpoint: "unix:///sim.sock".to_string(),
                status: Box::new(tonic::Status::unavailable("injected outage")),
            });
        }
        sim.lists += 1;
        if let Some((n, c)) = sim.appear_at_list.clone()
            && sim.lists == n
        {
            sim.node.containers.push(c);
        }
        if let Some((n, id)) = sim.vanish_at_list.clone()
            && sim.lists == n
        {
            sim.node.take_image(&id);
        }
        if let Some((n, id, tag)) = sim.tag_at_list.clone()
            && sim.lists == n
            && let Some(image) = sim.node.image_mut(&id)
        {
            image.repo_tags = image.repo_tags.iter().map(str::to_owned).chain([tag]).collect();
        }
        if let Some((n, id)) = sim.gone_at_list.clone()
            && sim.lists == n
        {
            sim.node.take_image(&id);
        }
        if let Some((n, sender, pods)) = &sim.pods_at_list
            && sim.lists == *n
        {
            sender.send_replace(Arc::new(pods.clone()));
        }
        let answer = sim.node.containers.clone();
        if let Some((n, c)) = sim.appear_after_list.clone()
            && sim.lists == n
        {
            sim.node.containers.push(c);
        }
        Ok(answer)
    }
    async fn container_mounts(&self, _id: &str) -> Result<Vec<String>, RuntimeError> {
        let delay = self.0.lock().unwrap().mounts_delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Ok(Vec::new())
    }
    async fn image_fs_info(&self) -> Result<Vec<ImageFsUsage>, RuntimeError> {
        Ok(vec![ImageFsUsage {
            mount_point: "/sim".to_string(),
            ..Default::default()
        }])
    }
    async fn filesystems(&self) -> Result<crate::cri::Filesystems, RuntimeError> {
        let images = self.image_fs_info().await?;
        // Without a split store the container filesystem is the image one,
        // as CRI-O names it.
        let containers = if self.0.lock().unwrap().split_store {
            vec![ImageFsUsage {
                mount_point: CONTAINER_FS.to_string(),
                ..Default::default()
            }]
        } else {
            images.clone()
        };
        Ok(crate::cri::Filesystems { images, containers })
    }
    async fn remove_image(&self, id: &str) -> Result<Removed, RuntimeError> {
        let mut sim = self.0.lock().unwrap();
        if let Some(path) = &sim.read_at_remove {
            let held = std::fs::read_to_string(path).unwrap_or_default();
            sim.read_at_remove_found.push((id.to_string(), held));
        }
        if sim.keep_on_remove.iter().any(|k| k == id) {
            // Its space comes back all the same (something else freed as
            // much, or the runtime deleted the content and kept the image).
            sim.disk.release(id);
            return Ok(Removed::Done);
        }
        if sim.fail_remove.iter().any(|f| f == id) {
            return Err(RuntimeError::Rpc {
                rpc: "RemoveImage",
                endpoint: "unix:///sim.sock".to_string(),
                status: Box::new(tonic::Status::internal("injected failure")),
            });
        }
        if let Some(at) = sim.finishing.iter().position(|(f, _)| f == id) {
            sim.finishing.remove(at);
            sim.remove(id);
            return Ok(Removed::AlreadyGone);
        }
        if sim.hang_remove.iter().any(|f| f == id) {
            if let Some(n) = sim.finish_after_lists.remove(id) {
                sim.finishing.push((id.to_string(), n));
            }
            return Err(RuntimeError::Timeout {
                rpc: "RemoveImage",
                endpoint: "unix:///sim.sock".to_string(),
                timeout: Duration::from_millis(50),
            });
        }
        sim.remove(id);
        Ok(Removed::Done)
    }
    fn container_events(&self) -> crate::cri::EventStream {
        let mut sim = self.0.lock().unwrap();
        sim.event_opens += 1;
        let status = if sim.events_break {
            tonic::Status::internal("stream reset")
        } else {
            tonic::Status::unimplemented("container events are not implemented")
        };
        Box::pin(tokio_stream::once(Err(RuntimeError::Rpc {
            rpc: "GetContainerEvents",
            endpoint: self.endpoint().to_string(),
            status: Box::new(status),
        })))
    }
}

impl FsProbe for SimHandle {
    fn stats(&self, path: &Path) -> Result<FsStats, FsError> {
        let disk = self.0.lock().unwrap().disk.clone();
        disk.stats(path)
    }
}
