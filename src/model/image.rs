//! What a runtime lists, as imagegc reasons about it: images
//! ([`Image`]), containers in any state ([`Container`]) and one listing of
//! both with the sandbox images ([`Snapshot`]). The runtime boundary
//! (`cri`) makes them from its answers; records, the policy, the engine and
//! the simulator read them. Data only: no IO.

use super::names::Names;

/// An image as the runtime lists it.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct Image {
    /// The runtime's image id (for containerd, the config digest `sha256:...`).
    pub id: String,
    /// Tags such as `docker.io/library/nginx:1.27` (shared with the
    /// image's record: see [`Names`]).
    pub repo_tags: Names,
    /// Repository digests such as `docker.io/library/nginx@sha256:...`.
    pub repo_digests: Names,
    /// Size the runtime reports, in bytes. Shared layers are counted in every
    /// image that has them, so sizes do not add up to disk usage.
    pub size: u64,
    /// The runtime asks that this image is never removed.
    pub pinned: bool,
}

/// The state of a container as the runtime reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ContainerState {
    /// Created but not started yet.
    Created,
    /// Running.
    Running,
    /// Exited (or stopped); the container still exists and still keeps its image.
    Exited,
    /// A state the runtime reports as unknown, or a value this CRI version does not
    /// know.
    Unknown,
}

impl ContainerState {
    /// The lowercase name used in logs and JSON output (`"running"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Running => "running",
            Self::Exited => "exited",
            Self::Unknown => "unknown",
        }
    }
}

/// A container in any state. Every listed container keeps its image in use.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct Container {
    /// The runtime's container id (full length, as `ListContainers` gives it).
    pub id: String,
    /// The id of the pod sandbox the container belongs to.
    pub pod_sandbox_id: String,
    /// The container's name from its metadata (the name in the pod spec); may
    /// be empty.
    pub name: String,
    /// The image as requested in the container spec (often a tag).
    pub image: String,
    /// The runtime's reference to the image: an id, or (CRI-O) a digest.
    pub image_ref: String,
    /// The image id, where the runtime sets it (CRI 1.31+).
    pub image_id: String,
    /// The container's state; `None` when unknown to the caller (hand-built
    /// containers). Whatever the state, the container keeps its image in use.
    pub state: Option<ContainerState>,
    /// Images mounted into the container as volumes (CRI `Mount.image`,
    /// KEP-4639): a name on containerd, an id on CRI-O. `ListContainers`
    /// does not report them; the collector fills them in from
    /// `ContainerStatus`. Each keeps its image in use like the container's
    /// own image.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mounted_images: Vec<String>,
    /// True when the images the container mounts could not be read (its
    /// `ContainerStatus` failed): it may mount any image.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub mounts_unknown: bool,
}

/// What the runtime reported in one listing.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Every image the runtime lists (`ListImages`), one entry per id.
    pub images: Vec<Image>,
    /// Every container in every state (`ListContainers`), with the images
    /// they mount as volumes filled in; each keeps the images it names in use.
    pub containers: Vec<Container>,
    /// The sandbox (pause) images: `runtime.sandbox_image`, and what the
    /// runtime names in its status or its pods' statuses. Empty when none
    /// of them tells (see [`Snapshot::sandbox_unknown`]).
    pub sandbox_images: Vec<String>,
    /// Why a pod's sandbox image is not known (its `PodSandboxStatus`
    /// failed): any image no container ever used may be it.
    pub sandbox_pods_unread: Option<String>,
}

impl Snapshot {
    /// True when nothing tells which image is the sandbox image: no source
    /// names it, and the runtime pins no image (containerd 2.x and CRI-O
    /// 1.36 pin their sandbox image, which protects it; CRI-O 1.26 pins
    /// nothing); or a pod's sandbox image could not be read. Then no image
    /// that no container has ever used is removed.
    pub fn sandbox_unknown(&self) -> bool {
        self.sandbox_pods_unread.is_some() || (self.sandbox_images.is_empty() && !self.images.iter().any(|i| i.pinned))
    }
}
