//! The runtime boundary: the [`Runtime`] trait every cycle goes through,
//! and its CRI v1 gRPC client.
//!
//! Nothing outside this module sees generated protobuf types: the client
//! converts them into the domain types of `model` ([`Image`],
//! [`Container`], [`Snapshot`], re-exported here), so the planner and the
//! collector can be tested against a hand-written fake.

pub mod client;
mod list_images;
mod listing;
pub mod proto;

use std::future::Future;
use std::time::Duration;

pub use client::{CallObserver, CriClient, DEFAULT_ENDPOINTS, connect, discover};
// The names of images, interned as listings are decoded.
pub(crate) use crate::model::names;

pub use crate::model::{Container, ContainerState, Dialect, Image, Snapshot};
pub use names::Names;

impl ContainerState {
    /// The state for a CRI `ContainerState` number; any value outside the four
    /// known ones is [`ContainerState::Unknown`].
    pub fn from_cri(value: i32) -> Self {
        match proto::ContainerState::try_from(value) {
            Ok(proto::ContainerState::ContainerCreated) => Self::Created,
            Ok(proto::ContainerState::ContainerRunning) => Self::Running,
            Ok(proto::ContainerState::ContainerExited) => Self::Exited,
            _ => Self::Unknown,
        }
    }
}

/// The runtime's name and version, from the CRI `Version` call.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct RuntimeVersion {
    /// The runtime's name (`containerd`, `cri-o`).
    pub runtime_name: String,
    /// The runtime's own version string (`v2.0.4`, `1.31.1`).
    pub runtime_version: String,
    /// The CRI API version the runtime speaks (`v1`).
    pub runtime_api_version: String,
}

/// What imagegc reads from the verbose CRI `Status` call.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RuntimeStatus {
    /// The sandbox (pause) image the runtime uses, when it reports it
    /// (containerd: `sandboxImage` in the `config` info; CRI-O: `pause_image`).
    pub sandbox_image: Option<String>,
}

/// One entry of the CRI `ImageFsInfo` answer.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct ImageFsUsage {
    /// The mount point of the image filesystem, as the runtime sees it; empty
    /// when the runtime does not name one.
    pub mount_point: String,
    /// Bytes the runtime says its images use on that filesystem; `None` when
    /// not reported.
    pub used_bytes: Option<u64>,
    /// Inodes the runtime says its images use on that filesystem; `None` when
    /// not reported.
    pub inodes_used: Option<u64>,
}

/// What CRI `ImageFsInfo` answers: the filesystems images are on, and those
/// the containers' writable layers are on. A runtime that splits its store
/// (KEP-4191: CRI-O's `imagestore`) names two different ones; otherwise the
/// container filesystems are the image filesystems again, or not given.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Filesystems {
    /// `image_filesystems`: where the images are; what removing images frees.
    pub images: Vec<ImageFsUsage>,
    /// `container_filesystems`: where the writable layers are; removing
    /// images frees nothing there.
    pub containers: Vec<ImageFsUsage>,
}

/// What a container event tells: something about this container changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerEvent {
    /// The id of the container the event is about.
    pub container_id: String,
    /// Images named by the event's container statuses (spec image, ref, id,
    /// image volumes).
    pub images: Vec<String>,
    /// When the runtime says the event happened. A runtime replays old
    /// events to a new subscriber (containerd 1.7: up to 1000, 2.x: the
    /// last 5 minutes), so this, not the time of arrival, is when the
    /// images were last seen in use.
    pub created_at: Option<std::time::SystemTime>,
}

/// Errors from the runtime, each naming the RPC and the endpoint.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The runtime could not be reached: its socket is missing or refuses
    /// connections, or the connection broke during the call.
    #[error("cannot connect to the container runtime at {endpoint}: {message}")]
    Connect {
        /// The endpoint tried.
        endpoint: String,
        /// The RPC and why the connection failed (`ListImages: connection refused`).
        message: String,
    },
    /// The runtime answered the call with a gRPC error.
    #[error("CRI {rpc} on {endpoint} failed: {status}")]
    Rpc {
        /// The CRI call (`ListImages`, `RemoveImage`, ...).
        rpc: &'static str,
        /// The endpoint the call went to (`unix:///run/containerd/containerd.sock`).
        endpoint: String,
        /// The gRPC status the runtime answered with.
        status: Box<tonic::Status>,
    },
    /// The call had no answer within the runtime timeout (`runtime.timeout`).
    #[error("CRI {rpc} on {endpoint} timed out after {}", humantime::format_duration(*timeout))]
    Timeout {
        /// The CRI call (`ListImages`, `RemoveImage`, ...).
        rpc: &'static str,
        /// The endpoint the call went to.
        endpoint: String,
        /// How long the call was given.
        timeout: Duration,
    },
    /// No endpoint was configured and none of the default ones answered.
    #[error("no container runtime answered; tried {}", tried.join(", "))]
    NoneAnswered {
        /// The endpoints tried, in order.
        tried: Vec<String>,
    },
    /// The endpoint is not `unix:///absolute/path` (or a bare absolute path).
    #[error("invalid runtime endpoint {endpoint:?}: {reason}")]
    BadEndpoint {
        /// The endpoint as configured.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl RuntimeError {
    /// The gRPC code, when the runtime answered with one.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Self::Rpc { status, .. } => Some(status.code()),
            _ => None,
        }
    }

    /// True when the runtime answered that the RPC is not implemented.
    pub fn is_unimplemented(&self) -> bool {
        self.code() == Some(tonic::Code::Unimplemented)
    }

    /// True when the call may have done its work all the same: it timed
    /// out, was cancelled, or the connection broke on the way.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            Self::Timeout { .. } => true,
            _ => matches!(
                self.code(),
                Some(tonic::Code::DeadlineExceeded | tonic::Code::Cancelled | tonic::Code::Unavailable)
            ),
        }
    }

    /// True when the runtime answered that the object does not exist.
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(tonic::Code::NotFound)
    }
}

/// What a `RemoveImage` call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removed {
    /// The runtime removed the image.
    Done,
    /// The runtime answered `NotFound`: the image was already gone.
    AlreadyGone,
}

/// One entry per image id, as the planner and the records expect. Runtimes
/// may list an id twice while an image is being pulled or tagged (each
/// listing with some of its names); the entries are merged: every name of
/// every listing, pinned when any listing says so, the largest size.
/// Entries with an empty id name nothing that could be removed and are
/// dropped.
pub fn merge_listings(mut images: Vec<Image>) -> Vec<Image> {
    images.retain(|image| !image.id.is_empty());
    let mut first: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut repeats = Vec::new();
    for (i, image) in images.iter().enumerate() {
        if let Some(&f) = first.get(image.id.as_str()) {
            repeats.push((f, i));
        } else {
            first.insert(&image.id, i);
        }
    }
    if repeats.is_empty() {
        return images;
    }
    drop(first);
    let mut later = vec![false; images.len()];
    for &(f, i) in &repeats {
        later[i] = true;
        let repeat = std::mem::take(&mut images[i]);
        let merged = &mut images[f];
        merged.pinned |= repeat.pinned;
        merged.size = merged.size.max(repeat.size);
        for (merged, repeat) in [
            (&mut merged.repo_tags, repeat.repo_tags),
            (&mut merged.repo_digests, repeat.repo_digests),
        ] {
            let mut names = merged.to_vec();
            for name in &repeat {
                if !merged.contains(name) {
                    names.push(name.to_owned());
                }
            }
            *merged = names.into();
        }
    }
    let mut index = 0;
    images.retain(|_| {
        index += 1;
        !later[index - 1]
    });
    images
}

/// A stream of container events; `None` when the stream ends.
pub type EventStream = std::pin::Pin<Box<dyn futures_core::Stream<Item = Result<ContainerEvent, RuntimeError>> + Send>>;

/// The calls imagegc makes to a container runtime. The CRI client implements
/// it; tests use the test kit's `FakeRuntime` behind a real gRPC server, or
/// their own.
pub trait Runtime: Send + Sync {
    /// The endpoint this runtime is reached at, for messages.
    fn endpoint(&self) -> &str;
    /// Changes the deadline of the calls that follow (`runtime.timeout`,
    /// reloaded on SIGHUP). A runtime without a deadline of its own ignores it.
    fn set_timeout(&self, timeout: Duration) {
        let _ = timeout;
    }
    /// The runtime's name and versions (CRI `Version`); also how discovery tells
    /// that an endpoint answers.
    fn version(&self) -> impl Future<Output = Result<RuntimeVersion, RuntimeError>> + Send;
    /// What the verbose CRI `Status` says that imagegc uses: the sandbox image.
    fn status(&self) -> impl Future<Output = Result<RuntimeStatus, RuntimeError>> + Send;
    /// Every image the runtime holds (CRI `ListImages`), one entry per id (see
    /// [`merge_listings`]).
    fn list_images(&self) -> impl Future<Output = Result<Vec<Image>, RuntimeError>> + Send;
    /// Every container in every state (CRI `ListContainers` with no filter);
    /// `mounted_images` is left empty.
    fn list_containers(&self) -> impl Future<Output = Result<Vec<Container>, RuntimeError>> + Send;
    /// The image filesystems the runtime uses (CRI `ImageFsInfo`); usually one.
    fn image_fs_info(&self) -> impl Future<Output = Result<Vec<ImageFsUsage>, RuntimeError>> + Send;
    /// The image and the container filesystems (the whole CRI `ImageFsInfo`
    /// answer). A runtime that names no container filesystem of its own
    /// need not implement it: the default asks [`Runtime::image_fs_info`].
    fn filesystems(&self) -> impl Future<Output = Result<Filesystems, RuntimeError>> + Send {
        async move {
            Ok(Filesystems {
                images: self.image_fs_info().await?,
                containers: Vec::new(),
            })
        }
    }
    /// Removes an image by id. An image the runtime no longer has is
    /// [`Removed::AlreadyGone`]: someone else removed it, and it is not this
    /// call's doing.
    fn remove_image(&self, id: &str) -> impl Future<Output = Result<Removed, RuntimeError>> + Send;

    /// The image with this id as the runtime holds it now (CRI
    /// `ImageStatus`), with its current names; `None` when it is gone.
    fn image_status(&self, id: &str) -> impl Future<Output = Result<Option<Image>, RuntimeError>> + Send {
        async move {
            let images = merge_listings(self.list_images().await?);
            Ok(images.into_iter().find(|image| image.id == id))
        }
    }
    /// The layers of the image with this id, lowest first: the digests of
    /// their uncompressed content (`rootfs.diff_ids` of the image config,
    /// which containerd and CRI-O put in the verbose `ImageStatus`). Images
    /// that share a layer store it once. `None` when the runtime does not
    /// say, or the image is gone; a runtime that cannot tell need not
    /// implement it.
    fn image_layers(&self, id: &str) -> impl Future<Output = Result<Option<Vec<String>>, RuntimeError>> + Send {
        let _ = id;
        async { Ok(None) }
    }
    /// The container event stream (CRI `GetContainerEvents`). Nothing is
    /// sent before the stream is first polled, and opening it is part of
    /// polling it: runtimes send no response headers until the first event,
    /// so an open that waits must cost nothing but the stream's own task.
    /// A runtime without events yields one `Unimplemented` error.
    fn container_events(&self) -> EventStream {
        let endpoint = self.endpoint().to_string();
        Box::pin(tokio_stream::once(Err(RuntimeError::Rpc {
            rpc: "GetContainerEvents",
            endpoint,
            status: Box::new(tonic::Status::unimplemented("container events are not implemented")),
        })))
    }

    /// The images a container mounts as volumes (CRI `ContainerStatus`,
    /// `mounts[].image`). A runtime without image volumes has none.
    fn container_mounts(&self, id: &str) -> impl Future<Output = Result<Vec<String>, RuntimeError>> + Send {
        let _ = id;
        async { Ok(Vec::new()) }
    }

    /// The ids of the pod sandboxes (CRI `ListPodSandbox`).
    fn pod_sandboxes(&self) -> impl Future<Output = Result<Vec<String>, RuntimeError>> + Send {
        async { Ok(Vec::new()) }
    }

    /// The image a pod's sandbox container runs, from the verbose
    /// `PodSandboxStatus` (containerd 2.x and CRI-O name it there).
    fn pod_sandbox_image(&self, id: &str) -> impl Future<Output = Result<Option<String>, RuntimeError>> + Send {
        let _ = id;
        async { Ok(None) }
    }
}
