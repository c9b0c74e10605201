//! Reading the runtime: one listing of images, containers (with the images
//! they mount), the sandbox images from every source, and the image
//! filesystem. It serves the cycle, `plan` and `images` alike; what the
//! runtime answers is reported as it is, and the engine decides.
//!
//! Runtime quirks live here: which source names the sandbox image in which
//! dialect, image volumes only `ContainerStatus` reports, `ImageFsInfo`
//! that names no mount point.

use std::path::{Path, PathBuf};

use futures_util::StreamExt as _;
use tracing::debug;

use crate::collections::HashMap;
use crate::cri::{ImageFsUsage, Runtime, RuntimeError};
use crate::fs::{FsProbe, FsStats};
use crate::model::matching;
use crate::model::reference::ProtectPattern;
use crate::model::{Container, Dialect, Image, Snapshot};
use crate::store::state::Known;

/// `ContainerStatus` calls in flight at once while learning new
/// containers' image volumes: enough to hide the round trips, few enough
/// to leave the runtime to the kubelet.
const CONTAINER_STATUS_CONCURRENCY: usize = 4;

/// How many `ListContainers` a re-check makes at most: one, and one more
/// after each round of `ContainerStatus` calls for containers not seen
/// before (those calls take time, in which a container may be created
/// that the listing before them cannot show). The last listing is followed
/// by no call: a container it shows for the first time counts as mounting
/// any image (see [`Container::mounts_unknown`]), and the candidate is kept.
const RECHECK_LISTINGS: usize = 3;

/// The images each container mounts as volumes (CRI `Mount.image`), which
/// only `ContainerStatus` reports. A container's mounts never change, so
/// each container costs one call, when it is first listed.
#[derive(Debug, Default)]
pub struct MountCache {
    by_container: HashMap<String, Vec<String>>,
    /// Why a container's mounts could not be read at the last listing.
    unread: Option<String>,
    /// Whether `by_container` changed since it was last noted.
    changed: bool,
}

impl MountCache {
    /// Lists the containers and fills in their mounted images, asking
    /// `ContainerStatus` for the containers not seen before. A container
    /// gone in between (`NotFound`) mounts nothing any more; one whose
    /// status fails otherwise is marked [`Container::mounts_unknown`] (it
    /// may mount any image, so the planner keeps them all) and asked again
    /// at the next listing: one broken container does not fail the listing.
    ///
    /// A mount named by a tag is remembered with the id of the image the
    /// tag names in `images` (the listing made right before) when the
    /// mount is first read: the container mounts that image, and keeps it
    /// in use after the tag moves to another one.
    pub async fn list<R: Runtime>(&mut self, runtime: &R, images: &[Image]) -> Result<Vec<Container>, RuntimeError> {
        Ok(self.list_asking(runtime, images, true).await?.0)
    }

    /// [`MountCache::list`] for the re-check before a removal: the
    /// containers as a `ListContainers` answered last, with nothing slow
    /// after that answer, so that the re-check's freshness counts from it
    /// (see [`RECHECK_LISTINGS`]).
    pub async fn list_fresh<R: Runtime>(
        &mut self,
        runtime: &R,
        images: &[Image],
    ) -> Result<Vec<Container>, RuntimeError> {
        for _ in 1..RECHECK_LISTINGS {
            let (containers, asked) = self.list_asking(runtime, images, true).await?;
            if !asked {
                return Ok(containers);
            }
        }
        Ok(self.list_asking(runtime, images, false).await?.0)
    }

    /// Lists the containers and, when `ask`, learns the mounts of those
    /// not seen before (else they count as mounting any image); also says
    /// whether any `ContainerStatus` was asked.
    async fn list_asking<R: Runtime>(
        &mut self,
        runtime: &R,
        images: &[Image],
        ask: bool,
    ) -> Result<(Vec<Container>, bool), RuntimeError> {
        let mut containers = runtime.list_containers().await?;
        let new: Vec<&str> = containers
            .iter()
            .filter(|c| ask && !self.by_container.contains_key(&c.id))
            .map(|c| c.id.as_str())
            .collect();
        let asked = !new.is_empty();
        // At most CONTAINER_STATUS_CONCURRENCY calls in flight.
        let mut learnt = Vec::new();
        {
            let mut pending = new.into_iter();
            let mut in_flight = futures_util::stream::FuturesUnordered::new();
            loop {
                while in_flight.len() < CONTAINER_STATUS_CONCURRENCY
                    && let Some(id) = pending.next()
                {
                    in_flight.push(async move { (id, runtime.container_mounts(id).await) });
                }
                match in_flight.next().await {
                    Some((id, mounts)) => learnt.push((id.to_string(), mounts)),
                    None => break,
                }
            }
        }
        self.unread = None;
        for (id, mounts) in learnt {
            let mounts = match mounts {
                Ok(mut mounts) => {
                    let ids: Vec<String> = matching::images_named(images, mounts.iter().map(String::as_str))
                        .into_iter()
                        .filter(|id| !mounts.iter().any(|m| m == id))
                        .map(str::to_string)
                        .collect();
                    mounts.extend(ids);
                    mounts
                }
                Err(err) if err.is_not_found() => Vec::new(),
                Err(err) => {
                    self.unread = Some(format!("container {id}: {err}"));
                    continue;
                }
            };
            self.by_container.insert(id, mounts);
            self.changed = true;
        }
        if self.by_container.len() > containers.len() {
            let listed: HashMap<&str, ()> = containers.iter().map(|c| (c.id.as_str(), ())).collect();
            self.by_container.retain(|id, _| listed.contains_key(id.as_str()));
            self.changed = true;
        }
        for container in &mut containers {
            match self.by_container.get(&container.id) {
                Some(mounts) => container.mounted_images.clone_from(mounts),
                None => container.mounts_unknown = true,
            }
        }
        Ok((containers, asked))
    }

    /// Why a container's mounted images could not be read at the last
    /// listing, when one could not.
    pub fn unread(&self) -> Option<&str> {
        self.unread.as_deref()
    }
}

/// The sandbox images named in pods' verbose statuses, by pod: each pod
/// costs one `PodSandboxStatus`, when it is first listed.
#[derive(Debug, Default)]
pub struct PodSandboxImages {
    by_pod: HashMap<String, Option<String>>,
    /// Whether `by_pod` changed since it was last noted.
    changed: bool,
}

impl PodSandboxImages {
    /// The sandbox images the runtime's pods name (each once).
    pub async fn images<R: Runtime>(&mut self, runtime: &R) -> Result<Vec<String>, RuntimeError> {
        let pods = runtime.pod_sandboxes().await?;
        for pod in &pods {
            if self.by_pod.contains_key(pod) {
                continue;
            }
            match runtime.pod_sandbox_image(pod).await {
                Ok(image) => {
                    self.by_pod.insert(pod.clone(), image);
                    self.changed = true;
                }
                Err(err) if err.is_not_found() => {}
                Err(err) => return Err(err),
            }
        }
        let before = self.by_pod.len();
        self.by_pod.retain(|id, _| pods.contains(id));
        self.changed |= self.by_pod.len() != before;
        let mut images: Vec<String> = self.by_pod.values().flatten().cloned().collect();
        images.sort();
        images.dedup();
        Ok(images)
    }
}

/// Images, then containers (with their mounts): a container created from
/// an image in between is listed with it.
async fn list_images_and_containers<R: Runtime>(
    runtime: &R,
    mounts: &mut MountCache,
) -> Result<(Vec<Image>, Vec<Container>), RuntimeError> {
    let images = runtime.list_images().await?;
    let containers = mounts.list(runtime, &images).await?;
    Ok((images, containers))
}

/// The sandbox images imagegc knows of, from every source.
#[derive(Debug, Default)]
pub struct SandboxImages {
    /// Each sandbox image's reference (or id).
    pub names: Vec<String>,
    /// Why a pod's sandbox image could not be read, when one could not.
    pub pods_unread: Option<String>,
    /// Whether `runtime.sandbox_image` is set and names no listed image.
    pub configured_unmatched: bool,
}

/// Every sandbox image imagegc knows of: `runtime.sandbox_image` (read as a
/// protect pattern is: a bare repository means every tag), what the
/// runtime's `Status` names (containerd 1.x, CRI-O 1.27+), and what each
/// running pod's status names (containerd 2.x, CRI-O, and containerd 1.x in
/// the sandbox's runtime spec): a pod started on a sandbox image the
/// runtime has since been configured away from still runs on it.
/// `runtime.sandbox_image` that names no listed image counts for nothing, so
/// that it does not switch off the rule for a runtime that names none.
pub async fn sandbox_images<R: Runtime>(
    runtime: &R,
    configured: Option<&str>,
    from_status: Option<&str>,
    pods: &mut PodSandboxImages,
    images: &[Image],
) -> SandboxImages {
    let mut found = SandboxImages::default();
    if let Some(configured) = configured {
        let pattern = ProtectPattern::new(configured);
        let matched: Vec<&Image> = images
            .iter()
            .filter(|i| pattern.matches_image(&i.id, &i.repo_tags, &i.repo_digests))
            .collect();
        found.configured_unmatched = matched.is_empty();
        if !matched.is_empty() {
            found.names.push(configured.to_string());
            found.names.extend(matched.iter().map(|i| i.id.clone()));
        }
    }
    found.names.extend(from_status.map(str::to_string));
    match pods.images(runtime).await {
        Ok(images) => found.names.extend(images),
        Err(err) if err.is_unimplemented() => debug!(error = %err, "the runtime does not list pods"),
        Err(err) => found.pods_unread = Some(err.to_string()),
    }
    found.names.sort();
    found.names.dedup();
    found
}

/// Where the image filesystem is, and what the runtime says images use of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageFs {
    /// The configured `gc.image_fs_path`, else the mount point the runtime's
    /// `ImageFsInfo` names (empty when it names none).
    pub path: PathBuf,
    /// The bytes images use, from `ImageFsInfo`, when the runtime reports it.
    pub image_bytes: Option<u64>,
    /// The mount point the runtime's `ImageFsInfo` names, when it names one
    /// (asked also when `gc.image_fs_path` is set, to check it).
    pub runtime_mount_point: Option<PathBuf>,
    /// The container filesystem's mount point (`container_filesystems`),
    /// when the runtime names one other than its image filesystem's: a split
    /// store (KEP-4191), whose writable layers removing images never frees.
    /// Reported, never measured for a decision (see [`ImageFs::container_fs`]).
    pub container_mount_point: Option<PathBuf>,
}

impl ImageFs {
    /// The container filesystem, measured, when the runtime names one that
    /// is another filesystem than the image filesystem measured at
    /// [`ImageFs::path`]. `None` when it names none, the same one, or either
    /// cannot be measured or told apart.
    pub fn container_fs(&self, probe: &dyn FsProbe) -> Option<(PathBuf, FsStats)> {
        let path = self.container_mount_point.as_ref()?;
        let theirs = probe.stats(path).ok()?;
        let ours = probe.stats(&self.path).ok()?;
        theirs
            .other_filesystem_than(&ours)
            .filter(|&other| other)
            .map(|_| (path.clone(), theirs))
    }

    /// Why the filesystem measured at [`ImageFs::path`] (a configured
    /// `gc.image_fs_path`) is not the image filesystem the runtime names:
    /// it is another filesystem (when the runtime's mount point can be
    /// measured here), or it holds fewer used bytes than the runtime says
    /// its images take. `None` when it is the runtime's, or cannot be told.
    pub fn mismatch(&self, probe: &dyn FsProbe) -> Option<String> {
        let runtime = self.runtime_mount_point.as_ref().filter(|m| **m != self.path)?;
        let measured = probe.stats(&self.path).ok()?;
        match probe.stats(runtime) {
            Ok(theirs) => measured.other_filesystem_than(&theirs).filter(|&other| other).map(|_| {
                format!(
                    "gc.image_fs_path {} is not the filesystem the runtime keeps its images on ({} is on another \
                     filesystem)",
                    self.path.display(),
                    runtime.display()
                )
            }),
            Err(_) => self
                .image_bytes
                .filter(|&bytes| bytes > measured.used_bytes())
                .map(|bytes| {
                    format!(
                        "gc.image_fs_path {} is not the filesystem the runtime keeps its images on: {} bytes are used \
                     there, fewer than the {bytes} bytes the runtime says its images take on {}",
                        self.path.display(),
                        measured.used_bytes(),
                        runtime.display()
                    )
                }),
        }
    }
}

/// Where the image filesystem is: the configured `gc.image_fs_path`, else
/// the first entry of the runtime's `ImageFsInfo` that names a mount point
/// (an empty path when none does), with the bytes it says images use.
/// `ImageFsInfo` is asked either way, so that a configured path can be
/// checked against the runtime's ([`ImageFs::mismatch`]); with a configured
/// path, its failure costs nothing but that check.
pub async fn image_fs<R: Runtime>(runtime: &R, configured: Option<&Path>) -> Result<ImageFs, RuntimeError> {
    let named = |filesystems: Vec<ImageFsUsage>| filesystems.into_iter().find(|fs| !fs.mount_point.is_empty());
    let reported = runtime
        .filesystems()
        .await
        .map(|filesystems| (named(filesystems.images), named(filesystems.containers)));
    let (reported, container) = match (configured, reported) {
        (_, Ok(reported)) => reported,
        (Some(_), Err(err)) => {
            debug!(error = %err, "ImageFsInfo failed: gc.image_fs_path cannot be checked against the runtime's");
            (None, None)
        }
        (None, Err(err)) => return Err(err),
    };
    let runtime_mount_point = reported.as_ref().map(|fs| PathBuf::from(&fs.mount_point));
    let container_mount_point = container
        .map(|fs| PathBuf::from(fs.mount_point))
        .filter(|path| Some(path) != runtime_mount_point.as_ref());
    Ok(ImageFs {
        path: configured
            .map(Path::to_path_buf)
            .or_else(|| runtime_mount_point.clone())
            .unwrap_or_default(),
        image_bytes: reported.and_then(|fs| fs.used_bytes),
        runtime_mount_point,
        container_mount_point,
    })
}

/// One read of the runtime ([`Observer::observe`]): the listing
/// ([`Snapshot`]) and what its other calls answered beside it (the image
/// filesystem, the sandbox image, the runtime's dialect).
#[derive(Debug)]
pub struct RuntimeRead {
    /// What the runtime listed.
    pub snapshot: Snapshot,
    /// The image filesystem (see [`ImageFs`]), or why it is unknown.
    pub image_fs: Result<ImageFs, RuntimeError>,
    /// Why `Status` failed while no sandbox image was known yet: the
    /// sandbox image cannot be told from an unused image then.
    pub sandbox_unknown: Option<String>,
    /// Whether `runtime.sandbox_image` is set and names no listed image.
    pub sandbox_configured_unmatched: bool,
    /// Why a container's mounted images could not be read, when one could not.
    pub mounts_unread: Option<String>,
    /// How the runtime speaks: at the read whose `Version` call first
    /// answered, `None` at the others (the caller keeps it).
    pub dialect: Option<Dialect>,
}

/// What reading the runtime remembers between listings: each container's
/// mounts and each pod's sandbox image (one call each, when first listed),
/// the sandbox image `Status` last named, and whether the runtime named itself.
#[derive(Debug, Default)]
pub struct Observer {
    mounts: MountCache,
    pod_images: PodSandboxImages,
    sandbox_image: Option<String>,
    /// Whether `Version` answered: it is asked until it does.
    dialect_known: bool,
}

impl Observer {
    /// An observer that already knows what `known` notes (see
    /// [`crate::store::state::Known`]): containers and pods in it cost no call.
    pub fn knowing(known: Known) -> Observer {
        Observer {
            mounts: MountCache {
                by_container: known.containers,
                ..MountCache::default()
            },
            pod_images: PodSandboxImages {
                by_pod: known.pods,
                changed: false,
            },
            ..Observer::default()
        }
    }

    /// What it learnt of containers and pods, when that changed since the
    /// last time it was asked.
    pub fn learnt(&mut self) -> Option<Known> {
        if !self.mounts.changed && !self.pod_images.changed {
            return None;
        }
        self.mounts.changed = false;
        self.pod_images.changed = false;
        Some(Known {
            containers: self.mounts.by_container.clone(),
            pods: self.pod_images.by_pod.clone(),
        })
    }

    /// Lists images, containers, the sandbox images and the image
    /// filesystem. `Status` and `ImageFsInfo` go beside the listings rather
    /// than after them: one round trip less per cycle. Images are listed
    /// before containers, so a container created from a listed image in
    /// between is listed too.
    /// `image_fs_path` is `gc.image_fs_path`, `sandbox_image`
    /// `runtime.sandbox_image`.
    pub async fn observe<R: Runtime>(
        &mut self,
        runtime: &R,
        image_fs_path: Option<&Path>,
        sandbox_image: Option<&str>,
    ) -> Result<RuntimeRead, RuntimeError> {
        let listings = list_images_and_containers(runtime, &mut self.mounts);
        let image_fs = image_fs(runtime, image_fs_path);
        let (listings, status, image_fs) = tokio::join!(listings, runtime.status(), image_fs);
        let (images, containers) = listings?;
        let mut dialect = None;
        if !self.dialect_known
            && let Ok(version) = runtime.version().await
        {
            self.dialect_known = true;
            dialect = Some(Dialect::of(&version.runtime_name));
        }
        let mut sandbox_unknown = None;
        match status {
            Ok(status) => {
                if status.sandbox_image.is_some() {
                    self.sandbox_image = status.sandbox_image;
                }
            }
            Err(err) if self.sandbox_image.is_none() && !err.is_unimplemented() => {
                sandbox_unknown = Some(err.to_string());
            }
            Err(err) => debug!(error = %err, "runtime status unavailable; keeping the last known sandbox image"),
        }
        let sandbox = sandbox_images(
            runtime,
            sandbox_image,
            self.sandbox_image.as_deref(),
            &mut self.pod_images,
            &images,
        )
        .await;
        Ok(RuntimeRead {
            snapshot: Snapshot {
                images,
                containers,
                sandbox_images: sandbox.names,
                sandbox_pods_unread: sandbox.pods_unread,
            },
            image_fs,
            sandbox_unknown,
            sandbox_configured_unmatched: sandbox.configured_unmatched,
            mounts_unread: self.mounts.unread().map(str::to_string),
            dialect,
        })
    }

    /// Images and containers only (the usage poll between cycles).
    pub async fn list<R: Runtime>(&mut self, runtime: &R) -> Result<(Vec<Image>, Vec<Container>), RuntimeError> {
        list_images_and_containers(runtime, &mut self.mounts).await
    }

    /// The containers as they are now, with their mounts (the re-check
    /// before a removal: see [`MountCache::list_fresh`]); `images`
    /// resolves mounts named by a tag.
    pub async fn containers<R: Runtime>(
        &mut self,
        runtime: &R,
        images: &[Image],
    ) -> Result<Vec<Container>, RuntimeError> {
        self.mounts.list_fresh(runtime, images).await
    }
}
