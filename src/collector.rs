//! One collection cycle, executed.
//!
//! 1. List images, containers (all states) and the sandbox image; update the
//!    records; plan. When `Status` fails before the sandbox image was ever
//!    learnt, the cycle ends here: that image could not be told from an
//!    unused one.
//! 2. Age pass: remove every age candidate (reason `age`).
//! 3. Measure the image filesystem. When usage is at or above the high
//!    threshold, remove space candidates in order (reason `space`),
//!    **re-measuring after each removal and stopping as soon as usage is at
//!    or below the low threshold**: one cycle reaches the target even when
//!    images share layers, and no image is removed beyond the one that
//!    crossed it.
//!
//! Right before each removal the containers are listed again and an image
//! that became in use is skipped. A failed removal is logged and the walk
//! goes on. Cancellation is honoured between removals, never inside one.
//! Each removal is noted in the state directory before `RemoveImage` and
//! forgotten once journaled (see [`crate::journal`]); the first listing of
//! a process settles a note a previous process left.
//! In dry run everything happens except the removals; the space pass then
//! estimates progress from the images' reported sizes.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use futures_util::StreamExt as _;

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::Config;
use crate::cri::Snapshot;
use crate::cri::{Container, ContainerEvent, Image, Removed, Runtime, RuntimeError};
use crate::daemon::Health;
use crate::fs::{FsError, FsProbe, FsStats};
use crate::journal::{Journal, JournalEntry};
use crate::matching::{self, InUse};
use crate::metrics::Metrics;
use crate::policy::{self, Candidate, DiskFootprint, Plan, Reason, SpaceOutlook, SpaceTarget};
use crate::records::{self, HashMap, Listed, Records};
use crate::reference::{self, ProtectPattern};
use crate::report::CycleError;
pub use crate::report::{CycleReport, Outcome, Removal};
use crate::state::{Loaded, StateStore};
use crate::time::{Clock, rfc3339};

/// The longest the state file goes unsaved while only last-used times of
/// images in use move: it bounds how late age removals can come after a
/// crash (see `Collector::save_if_due`).
pub const STATE_REFRESH: Duration = Duration::from_secs(30 * 60);

/// `ContainerStatus` calls in flight at once while learning new
/// containers' image volumes: enough to hide the round trips, few enough
/// to leave the runtime to the kubelet.
const CONTAINER_STATUS_CONCURRENCY: usize = 4;

/// The images each container mounts as volumes (CRI `Mount.image`), which
/// only `ContainerStatus` reports. A container's mounts never change, so
/// each container costs one call, when it is first listed.
#[derive(Debug, Default)]
pub struct MountCache {
    by_container: HashMap<String, Vec<String>>,
    /// Why a container's mounts could not be read at the last listing.
    unread: Option<String>,
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
        let mut containers = runtime.list_containers().await?;
        let new: Vec<&str> = containers
            .iter()
            .filter(|c| !self.by_container.contains_key(&c.id))
            .map(|c| c.id.as_str())
            .collect();
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
        }
        if self.by_container.len() > containers.len() {
            let listed: HashMap<&str, ()> = containers.iter().map(|c| (c.id.as_str(), ())).collect();
            self.by_container.retain(|id, _| listed.contains_key(id.as_str()));
        }
        for container in &mut containers {
            match self.by_container.get(&container.id) {
                Some(mounts) => container.mounted_images.clone_from(mounts),
                None => container.mounts_unknown = true,
            }
        }
        Ok(containers)
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
pub struct PodImages {
    by_pod: HashMap<String, Option<String>>,
}

impl PodImages {
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
                }
                Err(err) if err.is_not_found() => {}
                Err(err) => return Err(err),
            }
        }
        self.by_pod.retain(|id, _| pods.contains(id));
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
    config: &Config,
    from_status: Option<&str>,
    pods: &mut PodImages,
    images: &[Image],
) -> SandboxImages {
    let mut found = SandboxImages::default();
    if let Some(configured) = &config.runtime.sandbox_image {
        let pattern = ProtectPattern::new(configured);
        let matched: Vec<&Image> = images
            .iter()
            .filter(|i| pattern.matches_image(&i.id, &i.repo_tags, &i.repo_digests))
            .collect();
        found.configured_unmatched = matched.is_empty();
        if !matched.is_empty() {
            found.names.push(configured.clone());
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

/// An image this collector removed, remembered for `gc.thrash_window`.
#[derive(Debug, Clone)]
struct RecentRemoval {
    at: SystemTime,
    id: String,
    /// Its repository digests when it was removed.
    digests: Vec<String>,
    /// Whether its return was already reported (once per removal).
    repull_reported: bool,
}

impl RecentRemoval {
    fn new(at: SystemTime, id: String, digests: &[String]) -> Self {
        RecentRemoval {
            at,
            id,
            digests: digests.to_vec(),
            repull_reported: false,
        }
    }

    /// Whether the image with this id and these repository digests is the
    /// removed image: the same id, or the same manifest digest under any
    /// name (CRI-O drops a registry's port from an old image's digest). A
    /// tag is not an image: a newer image under the removed one's tag is
    /// another image, not a re-pull.
    fn is(&self, id: &str, digests: &[String]) -> bool {
        self.id == id
            || digests.iter().filter_map(|d| reference::digest_of(d)).any(|digest| {
                self.digests
                    .iter()
                    .any(|mine| reference::digest_of(mine) == Some(digest))
            })
    }
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
}

impl ImageFs {
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

/// What became of one candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Removed (or, in dry run, would have been).
    Removed,
    /// Kept: in use, already gone, or the removal failed.
    Kept,
    /// The runtime did not tell whether it removed the image, and the
    /// image is still listed: the space pass stops here, so that a removal
    /// the runtime finishes later does not add to the ones after it.
    Unknown,
}

/// How long the outcome of a `RemoveImage` that timed out or broke is
/// watched for (`ImageStatus` every [`UNSETTLED_STEP`]), at most.
const UNSETTLED_WATCH: Duration = Duration::from_secs(30);
const UNSETTLED_STEP: Duration = Duration::from_millis(250);

/// A view of the filesystem for one cycle: where it is and how to measure it.
struct Disk {
    probe: Arc<dyn FsProbe>,
    path: Option<PathBuf>,
}

/// How long the filesystem is watched after a removal for the space to come
/// back: containerd 2.x deletes an image's content and snapshots in the
/// background after `RemoveImage` returns, a few milliseconds later.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(1);
/// Between two readings while the space comes back.
const SETTLE_STEP: Duration = Duration::from_millis(20);
/// The second look when the space was already back as `RemoveImage`
/// returned (containerd 1.x and CRI-O delete before they answer): enough to
/// see a deletion still under way, without making every removal wait a
/// [`SETTLE_STEP`].
const SETTLE_CONFIRM: Duration = Duration::from_millis(2);

impl Disk {
    /// The filesystem once a removal's space has come back: re-measured
    /// until available space has grown and then held still for one step,
    /// for at most [`SETTLE_TIMEOUT`] (an image whose layers are all shared
    /// frees nothing). Stopping at the first reading would undercount what
    /// the removal freed and remove images beyond the low threshold. The
    /// step is [`SETTLE_CONFIRM`] when the space had already grown as the
    /// call returned, [`SETTLE_STEP`] once it grows after it.
    async fn settled(&self, before: Option<FsStats>) -> Result<FsStats, FsError> {
        let mut last = self.measure()?;
        let Some(before) = before else {
            return Ok(last);
        };
        let mut step = if last.available() > before.available() {
            SETTLE_CONFIRM
        } else {
            SETTLE_STEP
        };
        let deadline = tokio::time::Instant::now() + SETTLE_TIMEOUT;
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(step).await;
            let now = self.measure()?;
            if now.available() > before.available() && now.available() == last.available() {
                return Ok(now);
            }
            if now.available() != last.available() {
                // Still coming back after the call returned: the runtime
                // deletes in the background.
                step = SETTLE_STEP;
            }
            last = now;
        }
        Ok(last)
    }

    fn measure(&self) -> Result<FsStats, FsError> {
        match &self.path {
            Some(path) => self.probe.stats(path),
            None => Err(FsError::Io {
                path: "(unknown)".to_string(),
                source: std::io::Error::other("the runtime reported no image filesystem"),
            }),
        }
    }
}

/// Which image a removal in flight removes (None between removals): the
/// daemon names it when shutdown gives up waiting.
pub type RemovingImage = Arc<std::sync::Mutex<Option<String>>>;

/// Marks a removal in flight until dropped.
struct InFlight(Arc<AtomicBool>, RemovingImage);

impl InFlight {
    fn new(flag: &Arc<AtomicBool>, image: &RemovingImage, id: &str) -> Self {
        *image.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(id.to_string());
        flag.store(true, Ordering::SeqCst);
        InFlight(Arc::clone(flag), Arc::clone(image))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
        *self.1.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }
}

/// One listing of the runtime, as [`Collector::observe`] returns it.
#[derive(Debug)]
pub struct Listing {
    /// What the runtime listed.
    pub snapshot: Snapshot,
    /// What the records made of it, by each image's place in the listing.
    pub listed: Listed,
    /// The image filesystem (see [`ImageFs`]), or why it is unknown.
    pub image_fs: Result<ImageFs, RuntimeError>,
}

/// The collector: the runtime, the records and everything a cycle touches.
pub struct Collector<R> {
    runtime: R,
    config: Arc<Config>,
    records: Records,
    store: StateStore,
    probe: Arc<dyn FsProbe>,
    metrics: Arc<Metrics>,
    journal: Journal,
    clock: Clock,
    health: Option<Arc<Health>>,
    /// Images of the last listing, to resolve container references between cycles.
    last_images: Vec<Image>,
    sandbox_image: Option<String>,
    /// When the records were last saved by this process.
    last_saved: Option<SystemTime>,
    /// Why `Status` failed while no sandbox image was known yet: the sandbox
    /// image cannot be told from an unused image then, so nothing is removed.
    sandbox_unknown: Option<String>,
    /// Images this collector removed within `gc.thrash_window`: an image
    /// that comes back under one of their names was re-pulled, and while
    /// images cannot bring usage to low, none of them goes again for space.
    recently_removed: Vec<RecentRemoval>,
    /// The current episode of a space pass that images cannot complete
    /// (see [`SpaceOutlook`]), reported once when it starts.
    space_unreachable: Option<SpaceOutlook>,
    /// Removals whose outcome the runtime did not tell (the call timed out
    /// or broke): journaled when a later listing shows the image gone.
    unsettled: Vec<Removal>,
    /// Whether a runtime that answers OK to `RemoveImage` and keeps the
    /// image was warned about (once per process).
    lying_runtime_warned: bool,
    /// Whether the kubelet-eviction check against the measured capacity has
    /// been made (once per process).
    eviction_checked: bool,
    mounts: MountCache,
    pod_images: PodImages,
    /// Whether the missing sandbox image was warned about (once per process).
    sandbox_warned: bool,
    /// Whether a pod's sandbox image could not be read at the last listing.
    sandbox_pods_unread: bool,
    /// Whether a container's mounted images could not be read at the last
    /// listing.
    mounts_unread: bool,
    /// Whether `runtime.sandbox_image` naming no listed image was warned
    /// about (once per process).
    sandbox_config_warned: bool,
    /// True while a `RemoveImage` is in flight: shutdown waits for it, and
    /// for nothing else.
    removing: Arc<AtomicBool>,
    removing_image: RemovingImage,
    /// Whether a removal left in flight by a previous process was looked
    /// for (at the first listing).
    pending_settled: bool,
    /// What an image takes on disk per byte the runtime reports for it,
    /// from the runtime's name and this process's measured removals.
    footprint: DiskFootprint,
    /// Whether the runtime's name was asked (for [`DiskFootprint`]).
    runtime_named: bool,
    /// Why the measured filesystem is not the runtime's image filesystem,
    /// while it is not (see [`ImageFs::mismatch`]): no space pass runs.
    image_fs_mismatch: Option<String>,
    /// The image filesystem as the last listing found it, when it can be
    /// trusted: what [`Collector::check_usage`] measures between cycles.
    disk_path: Option<PathBuf>,
    /// When the last cycle ended above low with images kept only for being
    /// younger than `gc.min_age`: when the first of them becomes removable.
    young_removable_at: Option<tokio::time::Instant>,
}

impl<R: Runtime> Collector<R> {
    /// Creates a collector and loads the records from the state directory.
    pub fn new(runtime: R, config: Arc<Config>, probe: Arc<dyn FsProbe>, metrics: Arc<Metrics>, clock: Clock) -> Self {
        let store = StateStore::new(&config.state.dir);
        Self::with_store(runtime, config, probe, metrics, clock, store)
    }

    /// A collector that only observes and plans (`imagegc plan`): its state
    /// is read, never written, and a corrupt file is left where it is.
    pub fn new_read_only(
        runtime: R,
        config: Arc<Config>,
        probe: Arc<dyn FsProbe>,
        metrics: Arc<Metrics>,
        clock: Clock,
    ) -> Self {
        let store = StateStore::new(&config.state.dir).read_only();
        Self::with_store(runtime, config, probe, metrics, clock, store)
    }

    fn with_store(
        runtime: R,
        config: Arc<Config>,
        probe: Arc<dyn FsProbe>,
        metrics: Arc<Metrics>,
        clock: Clock,
        store: StateStore,
    ) -> Self {
        let journal = Journal::new(&config.state.dir);
        let records = match store.load(clock.now(), config.gc.interval) {
            Loaded::Fresh => {
                info!(path = %store.path().display(), "no state file: starting with no history");
                Records::new()
            }
            Loaded::Records {
                records,
                saved_at,
                last_success,
            } => {
                if let Some(at) = last_success {
                    metrics.restore_last_success(at);
                }
                info!(
                    path = %store.path().display(),
                    records = records.len(),
                    saved_at = %rfc3339(saved_at),
                    "loaded image history"
                );
                records
            }
            Loaded::Corrupt { reason, .. } if store.is_read_only() => {
                warn!(
                    path = %store.path().display(),
                    %reason,
                    "state file is corrupt: left where it is (this command writes nothing), planning with no history"
                );
                Records::new()
            }
            Loaded::Corrupt { reason, moved_to } => {
                warn!(
                    path = %store.path().display(),
                    %reason,
                    moved_to = %moved_to.as_ref().map_or("(could not be moved)".to_string(), |p| p.display().to_string()),
                    "state file is corrupt: set aside, starting with no history (no age-based removal until max age has passed)"
                );
                Records::new()
            }
        };
        metrics.set_dry_run(config.gc.dry_run);
        metrics.set_thresholds(config.gc.high_threshold_percent, config.gc.low_threshold_percent);
        Collector {
            runtime,
            config,
            records,
            store,
            probe,
            metrics,
            journal,
            clock,
            health: None,
            last_images: Vec::new(),
            sandbox_image: None,
            last_saved: None,
            sandbox_unknown: None,
            recently_removed: Vec::new(),
            space_unreachable: None,
            unsettled: Vec::new(),
            lying_runtime_warned: false,
            eviction_checked: false,
            mounts: MountCache::default(),
            pod_images: PodImages::default(),
            sandbox_warned: false,
            sandbox_pods_unread: false,
            mounts_unread: false,
            sandbox_config_warned: false,
            removing: Arc::new(AtomicBool::new(false)),
            removing_image: RemovingImage::default(),
            pending_settled: false,
            footprint: DiskFootprint::default(),
            runtime_named: false,
            image_fs_mismatch: None,
            disk_path: None,
            young_removable_at: None,
        }
        .with_removals_from_journal()
    }

    /// Seeds thrash detection from the journal, so a re-pull right after a
    /// restart is still noticed.
    fn with_removals_from_journal(mut self) -> Self {
        let since = self.clock.now().checked_sub(self.config.gc.thrash_window);
        if let Ok(entries) = self.journal.read(since) {
            self.recently_removed = entries
                .into_iter()
                .filter(|e| !e.dry_run)
                .filter_map(|e| Some(RecentRemoval::new(e.timestamp()?, e.image, &e.digests)))
                .collect();
        }
        self
    }

    /// Counts and logs images that came back soon after imagegc removed them.
    fn detect_repulls(&mut self, images: &[Image], new_ids: &[String]) {
        let now = self.clock.now();
        let window = self.config.gc.thrash_window;
        self.recently_removed
            .retain(|r| now.duration_since(r.at).unwrap_or_default() <= window);
        if new_ids.is_empty() || self.recently_removed.is_empty() {
            return;
        }
        for image in images.iter().filter(|i| new_ids.contains(&i.id)) {
            let Some(removal) = self
                .recently_removed
                .iter_mut()
                .find(|r| !r.repull_reported && r.is(&image.id, &image.repo_digests))
            else {
                continue;
            };
            removal.repull_reported = true;
            let removed_ago = crate::time::short(now.duration_since(removal.at).unwrap_or_default());
            self.metrics.repulled();
            match &self.space_unreachable {
                Some(outlook) => warn!(
                    image = %image.id,
                    tags = ?image.repo_tags,
                    %removed_ago,
                    not_image_bytes = outlook.not_image_bytes,
                    "an image imagegc removed was pulled again: the image filesystem is full of data that is not \
                     images, which removing images cannot fix; imagegc leaves images it removed alone for \
                     gc.thrash_window while this lasts. Free that data (logs, volumes, writable layers) or give \
                     the filesystem more room"
                ),
                None => warn!(
                    image = %image.id,
                    tags = ?image.repo_tags,
                    %removed_ago,
                    thrash_window = %crate::time::short(window),
                    "an image imagegc removed was pulled again within the thrash window: \
                     the policy may be too aggressive for this node (raise the low threshold, max age or keep_recent_per_repository)"
                ),
            }
        }
    }

    /// Whether the candidate is an image this collector removed within
    /// `gc.thrash_window` (the same id or manifest digest).
    fn removed_recently(&self, candidate: &Candidate<'_>) -> bool {
        let now = self.clock.now();
        let window = self.config.gc.thrash_window;
        self.recently_removed
            .iter()
            .any(|r| now.duration_since(r.at).unwrap_or_default() <= window && r.is(candidate.id, candidate.digests))
    }

    /// Starts or ends an episode in which images cannot bring usage to low:
    /// said once when it starts, and once when it ends.
    fn note_space_outlook(&mut self, outlook: Option<SpaceOutlook>) {
        let unreachable = outlook.filter(SpaceOutlook::unreachable);
        match (&self.space_unreachable, unreachable) {
            (None, Some(o)) => warn!(
                bytes_to_free = o.bytes_to_free,
                images_could_free = o.could_free,
                not_image_bytes = o.not_image_bytes,
                thrash_window = %crate::time::short(self.config.gc.thrash_window),
                "removing every removable image cannot bring usage to the low threshold: the image filesystem \
                 holds data that is not images. imagegc still frees what helps, but removes no image for space \
                 that it removed within gc.thrash_window, so the node does not pull and lose the same images \
                 over and over"
            ),
            (Some(_), None) => info!("images can bring usage to the low threshold again"),
            _ => {}
        }
        self.metrics.set_space_unreachable(unreachable.is_some());
        self.space_unreachable = unreachable;
    }

    /// Reports progress (liveness) and runtime reachability (readiness) to
    /// the health endpoint while cycles run.
    pub fn with_health(mut self, health: Arc<Health>) -> Self {
        self.health = Some(health);
        self
    }

    fn heartbeat(&self) {
        if let Some(health) = &self.health {
            health.heartbeat();
        }
    }

    /// The configuration in force: the one given at start, or the last reload
    /// (see [`Collector::set_config`]).
    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    /// Applies a reloaded configuration from the next cycle on.
    pub fn set_config(&mut self, config: Arc<Config>) {
        self.metrics.set_dry_run(config.gc.dry_run);
        self.metrics
            .set_thresholds(config.gc.high_threshold_percent, config.gc.low_threshold_percent);
        self.config = config;
    }

    /// The per-image records as of the last listing (saved to the state file).
    pub fn records(&self) -> &Records {
        &self.records
    }

    /// The runtime the collector talks to.
    pub fn runtime(&self) -> &R {
        &self.runtime
    }

    /// The clock the collector reads `now` from.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The metric families this collector updates.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// True while a removal is in flight (see [`crate::daemon`]'s shutdown).
    pub fn removal_in_flight(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.removing)
    }

    /// The image a removal in flight removes.
    pub fn removal_in_flight_image(&self) -> RemovingImage {
        Arc::clone(&self.removing_image)
    }

    /// Journals a removal a previous process left in flight (see
    /// [`crate::journal`]), now that the images are listed: done when the
    /// image is gone, not done when it is still there.
    async fn settle_pending_removal(&mut self, images: &[Image]) {
        if std::mem::replace(&mut self.pending_settled, true) {
            return;
        }
        let journal = self.journal.clone();
        let Ok(Some(mut entry)) = tokio::task::spawn_blocking(move || journal.pending_removal()).await else {
            return;
        };
        let journal = self.journal.clone();
        if images.iter().any(|i| i.id == entry.image) {
            warn!(
                image = %entry.image,
                tags = ?entry.tags,
                "a removal in flight when imagegc last stopped was not removed: the image is still there"
            );
            let _ = tokio::task::spawn_blocking(move || journal.end_removal()).await;
            return;
        }
        const NOTE: &str = "completed after shutdown";
        warn!(image = %entry.image, tags = ?entry.tags, reason = %entry.reason, "a removal in flight when imagegc last stopped was {NOTE}: journaling it");
        entry.note = Some(NOTE.to_string());
        self.recently_removed.push(RecentRemoval::new(
            self.clock.now(),
            entry.image.clone(),
            &entry.digests,
        ));
        let _ = tokio::task::spawn_blocking(move || {
            journal.append(&entry);
            journal.end_removal();
        })
        .await;
    }

    /// Lists images, containers and the sandbox image, and updates the
    /// records. Also returns the image filesystem (see [`ImageFs`]).
    pub async fn observe(&mut self) -> Result<Listing, RuntimeError> {
        // Status (for the sandbox image) and ImageFsInfo go beside the
        // listings rather than after them: one round trip less per cycle.
        // Images are listed before containers, so a container created from
        // a listed image in between is listed too.
        let runtime = &self.runtime;
        let listings = list_images_and_containers(runtime, &mut self.mounts);
        let (listings, status, image_fs) = tokio::join!(listings, runtime.status(), image_fs(runtime, &self.config));
        let (images, containers) = match listings {
            Ok(listings) => listings,
            Err(e) => {
                self.metrics.set_runtime_up(false);
                return Err(e);
            }
        };
        self.metrics.set_runtime_up(true);
        self.note_image_fs(image_fs.as_ref().ok()).await;
        self.sandbox_unknown = None;
        match status {
            Ok(status) => {
                if status.sandbox_image.is_some() {
                    self.sandbox_image = status.sandbox_image;
                }
            }
            Err(err) if self.sandbox_image.is_none() && !err.is_unimplemented() => {
                self.sandbox_unknown = Some(err.to_string());
            }
            Err(err) => debug!(error = %err, "runtime status unavailable; keeping the last known sandbox image"),
        }
        let sandbox = sandbox_images(
            &self.runtime,
            &self.config,
            self.sandbox_image.as_deref(),
            &mut self.pod_images,
            &images,
        )
        .await;
        self.note_sandbox_sources(&sandbox);
        self.note_mounts();
        let snapshot = Snapshot {
            images,
            containers,
            sandbox_images: sandbox.names,
            sandbox_pods_unread: sandbox.pods_unread,
        };
        let (observed, listed) = self.records.observe_snapshot(&snapshot, self.clock.now());
        self.note_listing(&observed, &snapshot.images).await;
        self.detect_repulls(&snapshot.images, &observed.new_ids);
        if snapshot.sandbox_unknown()
            && snapshot.sandbox_pods_unread.is_none()
            && !std::mem::replace(&mut self.sandbox_warned, true)
        {
            warn!(
                "the runtime does not say which image is its sandbox (pause) image, no pod names it and it pins \
                 no image: no image that no container has ever used is removed; set runtime.sandbox_image to name it"
            );
        }
        Ok(Listing {
            snapshot,
            listed,
            image_fs,
        })
    }

    /// Says, once per episode, that a container's mounted images could not
    /// be read (every image is kept meanwhile), and sets the metric.
    fn note_mounts(&mut self) {
        let unread = self.mounts.unread().map(str::to_string);
        match (&self.mounts_unread, &unread) {
            (false, Some(err)) => warn!(
                error = %err,
                "cannot read the images a container mounts (ContainerStatus): no image is removed until they can \
                 be read, since it may mount any of them"
            ),
            (true, None) => info!("every container's mounted images can be read again"),
            _ => {}
        }
        self.mounts_unread = unread.is_some();
        self.metrics.set_container_mounts_unknown(self.mounts_unread);
    }

    /// Says, once per episode, that a pod's sandbox image could not be read
    /// (every image no container ever used is kept meanwhile), and once per
    /// process that `runtime.sandbox_image` names no listed image.
    fn note_sandbox_sources(&mut self, sandbox: &SandboxImages) {
        match (&self.sandbox_pods_unread, &sandbox.pods_unread) {
            (false, Some(err)) => warn!(
                error = %err,
                "cannot read a pod's sandbox image (PodSandboxStatus): no image that no container has ever used \
                 is removed until it can be read"
            ),
            (true, None) => info!("every pod's sandbox image can be read again"),
            _ => {}
        }
        self.sandbox_pods_unread = sandbox.pods_unread.is_some();
        if sandbox.configured_unmatched && !std::mem::replace(&mut self.sandbox_config_warned, true) {
            warn!(
                sandbox_image = self.config.runtime.sandbox_image.as_deref().unwrap_or_default(),
                "runtime.sandbox_image names no listed image: it protects nothing until an image of that name is \
                 listed, and the other sources of the sandbox image are used meanwhile"
            );
        }
    }

    /// Checks the image filesystem a listing found: starts or ends an
    /// episode in which the measured filesystem is not the runtime's (said
    /// once each), and notes the path the usage checks between cycles
    /// measure. At the first listing, also asks the runtime's name for its
    /// [`DiskFootprint`].
    async fn note_image_fs(&mut self, image_fs: Option<&ImageFs>) {
        if !self.runtime_named {
            if let Ok(version) = self.runtime.version().await {
                self.runtime_named = true;
                self.footprint = DiskFootprint::for_runtime(&version.runtime_name);
            }
        }
        let mismatch = image_fs.and_then(|fs| fs.mismatch(self.probe.as_ref()));
        match (&self.image_fs_mismatch, &mismatch) {
            (None, Some(why)) => warn!(
                mismatch = %why,
                "the measured filesystem is not the filesystem the runtime keeps its images on: no image is removed \
                 for space while this lasts (age removals go on). Unset gc.image_fs_path, and mount the runtime's \
                 root into the pod, so that imagegc measures the mount point the runtime names"
            ),
            (Some(_), None) if image_fs.is_some() => {
                info!("the measured filesystem is the runtime's image filesystem again");
            }
            _ => {}
        }
        if image_fs.is_some() || mismatch.is_some() {
            self.metrics.set_image_fs_mismatch(mismatch.is_some());
            self.image_fs_mismatch = mismatch;
        }
        self.disk_path = image_fs
            .filter(|_| self.image_fs_mismatch.is_none())
            .map(|fs| fs.path.clone())
            .filter(|p| !p.as_os_str().is_empty());
    }

    /// Why the measured filesystem is not the runtime's image filesystem,
    /// as the last listing found it.
    pub fn image_fs_mismatch(&self) -> Option<&str> {
        self.image_fs_mismatch.as_deref()
    }

    /// When the last cycle could not reach low and images it kept only for
    /// being younger than `gc.min_age` become removable (the first of them):
    /// the daemon runs a cycle then rather than at the next interval, since
    /// usage that stays above high is not a crossing.
    pub fn young_removable_at(&self) -> Option<tokio::time::Instant> {
        self.young_removable_at
    }

    /// What an image takes on disk per reported byte, as this collector
    /// knows it.
    pub fn footprint(&self) -> DiskFootprint {
        self.footprint
    }

    /// Measures the image filesystem between cycles (statvfs: no call to
    /// the runtime) and publishes usage. Returns whether a space pass is
    /// due; `None` when there is nothing to measure yet, or the measurement
    /// failed (the next cycle reports it).
    pub fn check_usage(&self) -> Option<bool> {
        let path = self.disk_path.as_ref()?;
        let stats = self.probe.stats(path).ok()?;
        self.publish_usage(&self.config, &stats);
        Some(SpaceTarget::new(&self.config).due(&stats))
    }

    /// Says what a listing did to the records beyond last-used times, and
    /// journals the removals whose outcome was unknown once their image is
    /// no longer listed.
    async fn note_listing(&mut self, observed: &records::Observed, images: &[Image]) {
        if observed.vanished > 0 {
            let grace = crate::time::short(records::VANISHED_GRACE);
            if images.is_empty() {
                warn!(
                    vanished = observed.vanished,
                    %grace,
                    "the runtime listed no image at all: keeping the history of the images it listed before, \
                     in case it lists them again"
                );
            } else {
                info!(
                    vanished = observed.vanished,
                    %grace,
                    "images are no longer listed: their history is kept in case the runtime lists them again"
                );
            }
        }
        if observed.returned > 0 {
            info!(
                images = observed.returned,
                "images listed again after a gap: their history is back"
            );
        }
        if observed.dropped > 0 {
            debug!(
                records = observed.dropped,
                "dropped the history of images gone for good"
            );
        }
        if self.unsettled.is_empty() {
            return;
        }
        let listed: HashMap<&str, ()> = images.iter().map(|i| (i.id.as_str(), ())).collect();
        for removal in std::mem::take(&mut self.unsettled) {
            if listed.contains_key(removal.id.as_str()) {
                info!(image = %removal.id, "a removal whose outcome the runtime did not tell did not happen: the image is still listed");
                continue;
            }
            info!(image = %removal.id, reason = removal.reason.as_str(), "a removal whose outcome the runtime did not tell went through");
            self.metrics.removed(removal.reason, 0);
            self.records.remove(&removal.id);
            self.journal_removal(&removal).await;
        }
    }

    /// Plans a cycle over a listing from [`Collector::observe`], without
    /// removing anything (`imagegc plan`).
    pub fn plan<'a>(&'a self, snapshot: &'a Snapshot, listed: &Listed) -> Plan<'a> {
        policy::plan_listed(snapshot, listed, &self.config, self.clock.now(), self.clock.started())
    }

    /// Lists images and containers between cycles: images first seen now
    /// get their record now (min age counts from when an image appeared,
    /// not from the next cycle), and the images containers use are marked
    /// used now. Like a cycle's listing, it tells `imagegc_runtime_up`
    /// whether the runtime answered: between cycles the poll is what
    /// notices an outage.
    pub async fn poll_usage(&mut self) -> Result<usize, RuntimeError> {
        let listings = list_images_and_containers(&self.runtime, &mut self.mounts).await;
        self.metrics.set_runtime_up(listings.is_ok());
        let (images, containers) = listings?;
        let observed = self.records.observe(&images, &containers, self.clock.now());
        self.note_listing(&observed, &images).await;
        self.detect_repulls(&images, &observed.new_ids);
        let in_use = InUse::new(&images, &containers).len();
        self.last_images = images;
        Ok(in_use)
    }

    /// Marks the images a container event names used now. A container that
    /// is created and deleted between two listings is known only from its
    /// events; images without a record are left for the next full listing.
    /// A replayed event (containerd replays recent events to a new
    /// subscriber) counts at its own time, not at its arrival.
    pub fn mark_used_by_event(&mut self, event: &ContainerEvent) {
        let ids = matching::images_named(&self.last_images, event.images.iter().map(String::as_str));
        let at = event
            .created_at
            .map_or_else(|| self.clock.now(), |stamped| self.clock.from_wall(stamped));
        self.records.mark_used(ids, at);
    }

    /// Saves the records; a failure is logged, never fatal: the collector
    /// goes on and tries again at the next save.
    pub async fn save(&mut self) {
        let store = self.store.clone();
        let records = self.records.clone();
        let now = self.clock.now();
        let last_success = self.metrics.last_success();
        let result =
            tokio::task::spawn_blocking(move || store.save_with_last_success(&records, now, last_success)).await;
        match result {
            Ok(Ok(())) => {
                debug!(records = self.records.len(), "state saved");
                self.records.saved();
                self.last_saved = Some(now);
            }
            Ok(Err(err)) => warn!(error = %err, "could not save state; will retry at the next save"),
            Err(err) => warn!(error = %err, "state save task failed"),
        }
    }

    /// Saves the records when something other than the last-used times of
    /// images in use changed, or when the last save is [`STATE_REFRESH`]
    /// old. Skipping the others loses nothing a restart needs: on load, the
    /// time since the save beyond one interval moves every last-used time
    /// forward, which covers the images still in use since (they are in
    /// use again at the first listing anyway); the cost falls on the safe
    /// side, age removals after a crash coming up to [`STATE_REFRESH`]
    /// late. A clean shutdown always saves.
    async fn save_if_due(&mut self) {
        let now = self.clock.now();
        let stale = self
            .last_saved
            .is_none_or(|at| now.duration_since(at).map_or(true, |d| d >= STATE_REFRESH));
        if self.records.changed() || stale {
            self.save().await;
        } else {
            debug!("records unchanged but for last-used times: state save skipped");
        }
    }

    /// Runs one cycle. Never panics on runtime or filesystem errors: they end
    /// the cycle with [`Outcome::Failed`].
    pub async fn cycle(&mut self, cancel: &CancellationToken) -> CycleReport {
        self.young_removable_at = None;
        let timer = self.metrics.cycle_timer();
        let started = std::time::Instant::now();
        let config = Arc::clone(&self.config);
        let mut report = CycleReport::new(config.gc.dry_run);
        let span = tracing::info_span!("cycle", dry_run = config.gc.dry_run);
        let _enter = span.enter();
        if let Err(err) = self.run_cycle(&config, cancel, &mut report).await {
            report.outcome = Outcome::Failed(err.to_string());
        }
        self.save_if_due().await;
        report.duration = started.elapsed();
        timer.finish(report.succeeded());
        self.log_summary(&report);
        report
    }

    async fn run_cycle(
        &mut self,
        config: &Config,
        cancel: &CancellationToken,
        report: &mut CycleReport,
    ) -> Result<(), CycleError> {
        let Listing {
            snapshot,
            listed,
            image_fs,
        } = self.observe().await.map_err(CycleError::Listing)?;
        self.settle_pending_removal(&snapshot.images).await;
        let result = self.execute(config, &snapshot, &listed, image_fs, cancel, report).await;
        // Kept for matching container events and polls until the next
        // cycle: moved, not copied.
        self.last_images = snapshot.images;
        result
    }

    /// The cycle after the listing: plan, then the age and space passes.
    async fn execute(
        &mut self,
        config: &Config,
        snapshot: &Snapshot,
        listed: &Listed,
        image_fs: Result<ImageFs, RuntimeError>,
        cancel: &CancellationToken,
        report: &mut CycleReport,
    ) -> Result<(), CycleError> {
        report.runtime_reached = true;
        self.heartbeat();
        if let Some(err) = &self.sandbox_unknown {
            // containerd 1.6 neither pins its pause image nor lists it under a
            // container: without Status it would look unused.
            return Err(CycleError::SandboxUnknown(err.clone()));
        }
        let now = self.clock.now();
        let plan = policy::plan_listed(snapshot, listed, config, now, self.clock.started());
        self.metrics.set_images(
            plan.in_use_count(),
            snapshot.images.len() - plan.in_use_count() - plan.protected_count(),
            plan.protected_count(),
        );
        self.metrics.set_candidates(plan.age.len() + plan.space.len());
        if plan.age_guarded > 0 {
            info!(
                images = plan.age_guarded,
                max_age = %crate::time::short(config.gc.max_age),
                "images without history are not removed by age until imagegc has run longer than max age"
            );
        }
        let fs_path = match image_fs {
            Ok(fs) => Some(fs.path).filter(|p| !p.as_os_str().is_empty()),
            Err(err) => {
                warn!(error = %err, "cannot find the image filesystem");
                None
            }
        };
        let disk = Disk {
            probe: Arc::clone(&self.probe),
            path: fs_path,
        };

        // Usage before the cycle removes anything: what the summary's
        // `usage_before` reports, also when the age pass frees space.
        report.before = disk.measure().ok();

        // Age pass.
        for candidate in &plan.age {
            if cancel.is_cancelled() {
                report.outcome = Outcome::Interrupted;
                return Ok(());
            }
            if self.remove(candidate, snapshot, &disk, cancel, report).await? == Step::Unknown {
                // What the runtime is still doing may free what the rest
                // of the cycle would: the next cycle sees.
                return Ok(());
            }
        }
        if !plan.age.is_empty() {
            self.save_if_due().await;
        }

        if let Some(why) = &self.image_fs_mismatch {
            debug!(mismatch = %why, "no space pass: the measured filesystem is not the runtime's");
            report.image_fs_mismatch = Some(why.clone());
            self.metrics.set_space_pass_due(false);
            return Ok(());
        }
        self.space_pass(config, &plan, snapshot, &disk, cancel, report).await
    }

    /// The space pass: when [`SpaceTarget::due`], remove space candidates in
    /// order, re-measuring after each, until [`SpaceTarget::reached`].
    #[allow(clippy::too_many_arguments)] // the cycle's parts, passed down as they are
    // Long on purpose: the walk measures, decides and removes in one loop,
    // so the stopping rule (measured low, or the estimate when measuring is
    // not possible) stays in one place.
    async fn space_pass(
        &mut self,
        config: &Config,
        plan: &Plan<'_>,
        snapshot: &Snapshot,
        disk: &Disk,
        cancel: &CancellationToken,
        report: &mut CycleReport,
    ) -> Result<(), CycleError> {
        let mut stats = match disk.measure() {
            Ok(stats) => stats,
            Err(err) => {
                self.metrics.set_usage_ratio(0.0);
                return Err(CycleError::Filesystem(err));
            }
        };
        report.before.get_or_insert(stats);
        report.after = Some(stats);
        self.publish_usage(config, &stats);
        self.check_eviction_threshold(config, &stats);
        let target = SpaceTarget::new(config);
        if !target.due(&stats) {
            debug!(
                usage_percent = stats.usage_percent(),
                high = target.high_percent(),
                "usage below the high threshold"
            );
            self.note_space_outlook(None);
            return Ok(());
        }
        report.space_pass = true;
        let outlook = SpaceOutlook::new(
            &stats,
            target.low_percent(),
            &plan.space,
            &snapshot.images,
            self.footprint,
        );
        self.note_space_outlook(Some(outlook));
        report.space_unreachable = self.space_unreachable;
        let to_free = target.bytes_to_free(&stats);
        info!(
            usage_percent = stats.usage_percent(),
            high_threshold_percent = target.high_percent(),
            low_threshold_percent = target.low_percent(),
            bytes_to_free = to_free,
            inode_usage_percent = stats.inode_usage_percent(),
            "image filesystem usage is at or above the high threshold: freeing space down to the low threshold"
        );
        // Bytes still to free by reported sizes, once measuring is no longer
        // possible (dry run, or statvfs failing mid-walk).
        let mut estimate: Option<u64> = config.gc.dry_run.then_some(to_free);
        for candidate in &plan.space {
            let reached = match estimate {
                Some(left) => left == 0,
                None => target.reached(&stats),
            };
            if reached {
                break;
            }
            if cancel.is_cancelled() {
                report.outcome = Outcome::Interrupted;
                return Ok(());
            }
            if self.space_unreachable.is_some() && self.removed_recently(candidate) {
                debug!(image = %candidate.id, "removed within gc.thrash_window while images cannot reach low: left alone");
                report.held_back.push(candidate.id.to_string());
                continue;
            }
            match self.remove(candidate, snapshot, disk, cancel, report).await? {
                Step::Removed => {}
                Step::Kept => {
                    // Kept here, but someone else may have removed it (or
                    // something else freed space) meanwhile.
                    if estimate.is_none()
                        && let Ok(s) = disk.measure()
                    {
                        stats = s;
                    }
                    continue;
                }
                Step::Unknown => break,
            }
            if let Some(left) = estimate.as_mut() {
                *left = left.saturating_sub(candidate.size);
                continue;
            }
            match disk.measure() {
                Ok(s) => stats = s,
                Err(err) => {
                    warn!(
                        error = %err,
                        "cannot re-measure the image filesystem: falling back to the runtime's image sizes (they overstate what shared layers free)"
                    );
                    estimate = Some(target.bytes_to_free(&stats).saturating_sub(candidate.size));
                }
            }
        }
        report.after = Some(stats);
        self.publish_usage(config, &stats);
        let done = match estimate {
            Some(left) => left == 0,
            None => target.reached(&stats),
        };
        if done {
            // Images brought usage to low after all: whatever the outlook
            // said, the episode is over.
            self.note_space_outlook(None);
            report.space_unreachable = None;
        } else {
            self.young_removable_at = plan
                .kept
                .iter()
                .filter_map(|k| match k.why {
                    policy::KeepReason::TooYoung { removable_after } => Some(removable_after),
                    _ => None,
                })
                .min()
                .map(|after| tokio::time::Instant::now() + after);
            let remaining = estimate.unwrap_or_else(|| target.bytes_to_free(&stats));
            let freed = report
                .before
                .map_or(0, |b| stats.available().saturating_sub(b.available()));
            report.outcome = Outcome::LowNotReached {
                freed_bytes: freed,
                remaining_bytes: remaining,
            };
        }
        Ok(())
    }

    /// Warns once when the kubelet's `imagefs.available` eviction threshold
    /// (a size, which only the measured capacity turns into a percentage)
    /// would evict pods before usage reaches the high threshold.
    fn check_eviction_threshold(&mut self, config: &Config, stats: &FsStats) {
        let Some(threshold) = config.eviction_imagefs_available else {
            return;
        };
        if std::mem::replace(&mut self.eviction_checked, true) {
            return;
        }
        let evicts_below = threshold.min_available_bytes(stats.capacity_bytes);
        let high = config.gc.high_threshold_percent;
        let collects_below = stats.capacity_bytes as u128 * (100 - u128::from(high.min(100))) / 100;
        if collects_below <= u128::from(evicts_below) {
            warn!(
                high_threshold_percent = high,
                eviction_available_bytes = evicts_below,
                capacity_bytes = stats.capacity_bytes,
                "the kubelet evicts pods before usage reaches gc.high_threshold_percent: lower the high threshold"
            );
        }
    }

    fn publish_usage(&self, config: &Config, stats: &FsStats) {
        self.metrics.set_usage_ratio(stats.usage_ratio());
        self.metrics.set_filesystem(stats.capacity_bytes, stats.available());
        self.metrics.set_space_pass_due(SpaceTarget::new(config).due(stats));
    }

    /// The re-check right before a removal: the image as the runtime holds
    /// it now, when no container uses it under any of its current names,
    /// the runtime did not pin it meanwhile, and no keep rule that reads
    /// names (a protect pattern, the sandbox image) holds for a name it
    /// gained; `None` when it is to be kept (or is gone already). An error
    /// means the check could not be made.
    async fn recheck(
        &mut self,
        candidate: &Candidate<'_>,
        snapshot: &Snapshot,
        report: &mut CycleReport,
    ) -> Result<Option<Image>, CycleError> {
        let images = &snapshot.images;
        debug!(image = %candidate.id, "re-checking containers before removal");
        let containers = self
            .mounts
            .list(&self.runtime, images)
            .await
            .map_err(|source| CycleError::Recheck {
                what: "containers",
                image: candidate.id.to_string(),
                source,
            })?;
        let current = self
            .runtime
            .image_status(candidate.id)
            .await
            .map_err(|source| CycleError::Recheck {
                what: "the image",
                image: candidate.id.to_string(),
                source,
            })?;
        let Some(current) = current else {
            self.gone_already(candidate);
            return Ok(None);
        };
        if containers.iter().any(|c| c.mounts_unknown) {
            info!(image = %candidate.id, "a container's mounted images cannot be read: keeping the image");
            return Ok(None);
        }
        // The listing's other images tell which containers' ids and digests
        // name an image exactly (a container whose digest names another
        // image does not use every image its tag names); this image is
        // matched under the names it has now.
        let listing: Vec<&Image> = images
            .iter()
            .filter(|i| i.id != current.id)
            .chain(std::iter::once(&current))
            .collect();
        let matches = matching::References::new(&containers, &[]).matches(listing.iter().copied());
        if !matches.users(listing.len() - 1).is_empty() {
            info!(image = %candidate.id, tags = ?current.repo_tags, "image came into use; keeping it");
            self.records.mark_used([candidate.id], self.clock.now());
            report.became_in_use.push(candidate.id.to_string());
            return Ok(None);
        }
        if current.pinned {
            info!(image = %candidate.id, tags = ?current.repo_tags, "the runtime pinned the image since the listing; keeping it");
            return Ok(None);
        }
        let sandbox: Vec<&str> = snapshot.sandbox_images.iter().map(String::as_str).collect();
        if matching::References::new(&[], &sandbox)
            .matches(std::iter::once(&current))
            .sandbox(0)
        {
            info!(image = %candidate.id, tags = ?current.repo_tags, "the image is a sandbox image under a name it gained since the listing; keeping it");
            return Ok(None);
        }
        if let Some(pattern) = policy::protecting_pattern(&self.config, &current) {
            info!(image = %candidate.id, tags = ?current.repo_tags, %pattern, "a name the image gained since the listing is protected; keeping it");
            return Ok(None);
        }
        Ok(Some(current))
    }

    /// Removes one candidate after re-checking that it is not in use.
    /// A runtime error while re-checking ends the cycle: when in doubt, keep.
    ///
    /// The re-check lists the containers, then asks the runtime for the
    /// image as it is now: a name it gained since the cycle's listing (a
    /// pull, a tag) counts, so a container created under that name keeps
    /// it. Only what really went is counted and journaled: `NotFound` (a
    /// second collector, `crictl rmi`) is not this collector's removal, a
    /// runtime that answers OK and still lists the image did not remove it,
    /// and a call that timed out or broke is watched until the image is gone
    /// or the outcome stays unknown (see [`Step::Unknown`]).
    // Long on purpose: every outcome of `RemoveImage` (done, already gone,
    // OK but still listed, refused, unknown) is handled in one match, inside
    // the in-flight guard and the intent note that must cover all of them.
    async fn remove(
        &mut self,
        candidate: &Candidate<'_>,
        snapshot: &Snapshot,
        disk: &Disk,
        cancel: &CancellationToken,
        report: &mut CycleReport,
    ) -> Result<Step, CycleError> {
        let Some(current) = self.recheck(candidate, snapshot, report).await? else {
            return Ok(Step::Kept);
        };
        let dry_run = report.dry_run;
        let mut removal = Removal {
            id: candidate.id.to_string(),
            tags: current.repo_tags.clone(),
            digests: current.repo_digests.clone(),
            reason: candidate.reason,
            size: candidate.size,
            freed_bytes: None,
            first_seen: candidate.first_seen,
            last_used: candidate.last_used,
            dry_run,
        };
        if dry_run {
            debug!(image = %candidate.id, reason = candidate.reason.as_str(), "no container uses the image: it would be removed");
            self.removed(removal, report).await;
            return Ok(Step::Removed);
        }
        debug!(image = %candidate.id, reason = candidate.reason.as_str(), "no container uses the image: removing it");
        // From the call until the removal is measured, recorded and
        // journaled: shutdown waits for all of it.
        let _in_flight = InFlight::new(&self.removing, &self.removing_image, candidate.id);
        // Noted before the call, forgotten once journaled or settled: a
        // process that ends in between leaves it for the next start.
        self.begin_intent(&removal).await;
        let before = disk.measure().ok();
        match self.runtime.remove_image(candidate.id).await {
            Ok(Removed::AlreadyGone) => {
                self.end_intent().await;
                self.gone_already(candidate);
                return Ok(Step::Kept);
            }
            Ok(Removed::Done) => {
                // Whether the image is really gone is asked while the
                // space comes back, not after.
                let (after, status) = tokio::join!(disk.settled(before), self.runtime.image_status(candidate.id));
                let after = after.ok();
                if let Ok(Some(_)) = status {
                    self.end_intent().await;
                    self.removal_not_done(candidate, report);
                    return Ok(Step::Kept);
                }
                removal.freed_bytes = before
                    .zip(after)
                    .map(|(b, a)| a.available().saturating_sub(b.available()));
            }
            Err(err) => {
                // The call failed, but the runtime may have removed the
                // image all the same (a deadline that passed while it
                // worked, a connection that broke): ask it.
                match self.watch_unsettled(candidate.id, &err, cancel).await {
                    Some(true) => {
                        warn!(image = %candidate.id, error = %err, "RemoveImage failed, but the image is gone: counted as removed");
                        let after = disk.settled(before).await.ok();
                        removal.freed_bytes = before
                            .zip(after)
                            .map(|(b, a)| a.available().saturating_sub(b.available()));
                    }
                    Some(false) => {
                        self.end_intent().await;
                        warn!(image = %candidate.id, tags = ?candidate.tags, reason = candidate.reason.as_str(), error = %err, "could not remove image");
                        self.metrics.removal_failed();
                        report.failed.push((candidate.id.to_string(), err.to_string()));
                        return Ok(Step::Kept);
                    }
                    None => {
                        // Followed by this process from here: the next
                        // listing journals it if it went.
                        self.end_intent().await;
                        warn!(
                            image = %candidate.id,
                            error = %err,
                            "the runtime did not say whether it removed the image and still lists it: no further image \
                             is removed for space this cycle; the removal is journaled if a later listing shows it went"
                        );
                        report.unsettled.push(candidate.id.to_string());
                        self.unsettled.push(removal);
                        return Ok(Step::Unknown);
                    }
                }
            }
        }
        self.metrics.removed(candidate.reason, removal.freed_bytes.unwrap_or(0));
        if let Some(freed) = removal.freed_bytes {
            self.footprint.learn(removal.size, freed);
        }
        self.records.remove(candidate.id);
        self.recently_removed.push(RecentRemoval::new(
            self.clock.now(),
            removal.id.clone(),
            &removal.digests,
        ));
        self.removed(removal, report).await;
        Ok(Step::Removed)
    }

    /// After a `RemoveImage` that failed with `err`: `Some(true)` when the
    /// image is gone all the same, `Some(false)` when the runtime refused
    /// and still has it, `None` when the outcome is unknown (the call timed
    /// out or broke, and the image is still listed after watching it for up
    /// to [`UNSETTLED_WATCH`] or until shutdown).
    async fn watch_unsettled(&self, id: &str, err: &RuntimeError, cancel: &CancellationToken) -> Option<bool> {
        let unknown = err.outcome_unknown();
        let deadline = tokio::time::Instant::now() + UNSETTLED_WATCH.min(self.config.runtime.timeout);
        loop {
            match self.runtime.image_status(id).await {
                Ok(None) => return Some(true),
                Ok(Some(_)) if !unknown => return Some(false),
                // Still there, or the runtime cannot say yet.
                Ok(Some(_)) | Err(_) => {}
            }
            if tokio::time::Instant::now() >= deadline || cancel.is_cancelled() {
                return None;
            }
            tokio::select! {
                () = tokio::time::sleep(UNSETTLED_STEP) => {}
                () = cancel.cancelled() => {}
            }
        }
    }

    /// Someone else removed the candidate (another collector, `crictl
    /// rmi`): not this collector's removal, so neither counted nor journaled.
    fn gone_already(&mut self, candidate: &Candidate<'_>) {
        info!(image = %candidate.id, tags = ?candidate.tags, "image is already gone: someone else removed it");
        self.records.remove(candidate.id);
    }

    /// A runtime answered OK to `RemoveImage` and still lists the image.
    fn removal_not_done(&mut self, candidate: &Candidate<'_>, report: &mut CycleReport) {
        if std::mem::replace(&mut self.lying_runtime_warned, true) {
            debug!(image = %candidate.id, "RemoveImage answered OK, but the image is still listed");
        } else {
            warn!(
                image = %candidate.id,
                endpoint = self.runtime.endpoint(),
                "RemoveImage answered OK, but the runtime still lists the image: not counted as removed \
                 (said once; later cases are logged at debug level)"
            );
        }
        self.metrics.removal_failed();
        report.failed.push((
            candidate.id.to_string(),
            "RemoveImage answered OK, but the image is still listed".to_string(),
        ));
    }

    /// Logs and journals a removal (or a dry-run one) and adds it to the report.
    async fn removed(&mut self, removal: Removal, report: &mut CycleReport) {
        info!(
            image = %removal.id,
            tags = ?removal.tags,
            reason = removal.reason.as_str(),
            size = removal.size,
            freed_bytes = removal.freed_bytes,
            last_used = %rfc3339(removal.last_used),
            dry_run = removal.dry_run,
            "{}",
            if removal.dry_run { "would remove image (dry run)" } else { "removed image" }
        );
        self.journal_removal(&removal).await;
        self.heartbeat();
        report.removed.push(removal);
    }

    /// Notes the removal about to be asked for (see [`Journal::begin_removal`]).
    async fn begin_intent(&self, removal: &Removal) {
        let journal = self.journal.clone();
        let entry = JournalEntry::from_removal(removal, self.clock.now());
        let _ = tokio::task::spawn_blocking(move || journal.begin_removal(&entry)).await;
    }

    /// Forgets the noted removal: it failed, or its outcome is followed.
    async fn end_intent(&self) {
        let journal = self.journal.clone();
        let _ = tokio::task::spawn_blocking(move || journal.end_removal()).await;
    }

    /// Appends a removal to the journal. File IO stays off the runtime's
    /// thread (metrics and health answer from it); awaited, so the journal
    /// keeps the removals' order.
    async fn journal_removal(&self, removal: &Removal) {
        let journal = self.journal.clone();
        let entry = JournalEntry::from_removal(removal, self.clock.now());
        let done = !removal.dry_run;
        if let Err(err) = tokio::task::spawn_blocking(move || {
            journal.append(&entry);
            if done {
                journal.end_removal();
            }
        })
        .await
        {
            warn!(error = %err, "journal write task failed");
        }
    }

    fn log_summary(&self, report: &CycleReport) {
        let by = |reason| report.removed.iter().filter(|r| r.reason == reason).count();
        let fields = (
            by(Reason::Age),
            by(Reason::Space),
            report.failed.len(),
            report.freed_bytes(),
            report.before.map(|s| s.usage_percent()),
            report.after.map(|s| s.usage_percent()),
        );
        let (age, space, failed, freed, before, after) = fields;
        let duration_ms = report.duration.as_millis() as u64;
        match &report.outcome {
            Outcome::Success => info!(
                removed_age = age,
                removed_space = space,
                failed,
                freed_bytes = freed,
                usage_before = before,
                usage_after = after,
                duration_ms,
                dry_run = report.dry_run,
                "cycle finished"
            ),
            Outcome::LowNotReached {
                freed_bytes,
                remaining_bytes,
            } => warn!(
                removed_age = age,
                removed_space = space,
                failed,
                freed_bytes,
                remaining_bytes,
                usage_after = after,
                duration_ms,
                "cycle could not reach the low threshold: no more removable images"
            ),
            // An unreachable runtime is reported by the daemon once per change.
            Outcome::Failed(err) if !report.runtime_reached => debug!(error = %err, "cycle failed"),
            Outcome::Failed(err) => warn!(error = %err, removed = age + space, duration_ms, "cycle failed"),
            Outcome::Interrupted => info!(removed = age + space, "cycle interrupted by shutdown"),
        }
    }
}

/// Where the image filesystem is: the configured `gc.image_fs_path`, else
/// the first entry of the runtime's `ImageFsInfo` that names a mount point
/// (an empty path when none does), with the bytes it says images use.
/// `ImageFsInfo` is asked either way, so that a configured path can be
/// checked against the runtime's ([`ImageFs::mismatch`]); with a configured
/// path, its failure costs nothing but that check.
pub async fn image_fs<R: Runtime>(runtime: &R, config: &Config) -> Result<ImageFs, RuntimeError> {
    let reported = runtime
        .image_fs_info()
        .await
        .map(|filesystems| filesystems.into_iter().find(|fs| !fs.mount_point.is_empty()));
    let reported = match (&config.gc.image_fs_path, reported) {
        (_, Ok(reported)) => reported,
        (Some(_), Err(err)) => {
            debug!(error = %err, "ImageFsInfo failed: gc.image_fs_path cannot be checked against the runtime's");
            None
        }
        (None, Err(err)) => return Err(err),
    };
    let runtime_mount_point = reported.as_ref().map(|fs| PathBuf::from(&fs.mount_point));
    Ok(ImageFs {
        path: config
            .gc
            .image_fs_path
            .clone()
            .or_else(|| runtime_mount_point.clone())
            .unwrap_or_default(),
        image_bytes: reported.and_then(|fs| fs.used_bytes),
        runtime_mount_point,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::{Container, ImageFsUsage, RuntimeStatus, RuntimeVersion};
    use std::collections::HashMap;
    use std::path::Path;
    use std::sync::Mutex;

    /// A runtime and a disk in one: removing an image gives back the bytes
    /// the test says it occupies on disk (0 for an image whose layers are
    /// all shared with another image still present).
    #[derive(Default)]
    struct Sim {
        images: Vec<Image>,
        containers: Vec<Container>,
        on_disk: HashMap<String, u64>,
        capacity: u64,
        available: u64,
        fail_remove: Vec<String>,
        fail_stats: bool,
        /// ListContainers fails while set: the runtime is down.
        fail_lists: bool,
        fail_status: bool,
        removed: Vec<String>,
        /// Containers that appear right before the n-th ListContainers call.
        appear_at_list: Option<(usize, Container)>,
        lists: usize,
    }

    #[derive(Clone, Default)]
    struct SimHandle(Arc<Mutex<Sim>>);

    impl SimHandle {
        fn with(&self, f: impl FnOnce(&mut Sim)) {
            f(&mut self.0.lock().unwrap());
        }
        fn removed(&self) -> Vec<String> {
            self.0.lock().unwrap().removed.clone()
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
            Ok(self.0.lock().unwrap().images.clone())
        }
        async fn list_containers(&self) -> Result<Vec<Container>, RuntimeError> {
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
                sim.containers.push(c);
            }
            Ok(sim.containers.clone())
        }
        async fn image_fs_info(&self) -> Result<Vec<ImageFsUsage>, RuntimeError> {
            Ok(vec![ImageFsUsage {
                mount_point: "/sim".to_string(),
                ..Default::default()
            }])
        }
        async fn remove_image(&self, id: &str) -> Result<Removed, RuntimeError> {
            let mut sim = self.0.lock().unwrap();
            if sim.fail_remove.iter().any(|f| f == id) {
                return Err(RuntimeError::Rpc {
                    rpc: "RemoveImage",
                    endpoint: "unix:///sim.sock".to_string(),
                    status: Box::new(tonic::Status::internal("injected failure")),
                });
            }
            sim.images.retain(|i| i.id != id);
            let freed = sim.on_disk.remove(id).unwrap_or(0);
            sim.available = (sim.available + freed).min(sim.capacity);
            sim.removed.push(id.to_string());
            Ok(Removed::Done)
        }
    }

    impl FsProbe for SimHandle {
        fn stats(&self, path: &Path) -> Result<FsStats, FsError> {
            let sim = self.0.lock().unwrap();
            if sim.fail_stats {
                return Err(FsError::Io {
                    path: path.display().to_string(),
                    source: std::io::Error::other("injected"),
                });
            }
            Ok(FsStats {
                capacity_bytes: sim.capacity,
                available_bytes: sim.available,
                ..Default::default()
            })
        }
    }

    fn image(id: &str, size: u64) -> Image {
        crate::testing::library_image(id, size)
    }

    fn collector(sim: &SimHandle, configure: impl FnOnce(&mut Config)) -> (Collector<SimHandle>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::default();
        config.gc.high_threshold_percent = 90;
        config.gc.low_threshold_percent = 80;
        config.gc.min_age = Duration::ZERO;
        config.state.dir = dir.path().to_path_buf();
        configure(&mut config);
        let c = Collector::new(
            sim.clone(),
            Arc::new(config),
            Arc::new(sim.clone()),
            Arc::new(Metrics::new()),
            Clock::starting_at(SystemTime::now() - Duration::from_secs(3600)),
        );
        (c, dir)
    }

    async fn cycle(c: &mut Collector<SimHandle>) -> CycleReport {
        c.cycle(&CancellationToken::new()).await
    }

    /// A filesystem whose available bytes follow a script, one reading
    /// each, the last repeated.
    struct Scripted(Mutex<std::collections::VecDeque<u64>>);

    impl FsProbe for Scripted {
        fn stats(&self, _: &Path) -> Result<FsStats, FsError> {
            let mut readings = self.0.lock().unwrap();
            let available = if readings.len() > 1 {
                readings.pop_front().unwrap()
            } else {
                readings[0]
            };
            Ok(FsStats {
                capacity_bytes: 1000,
                available_bytes: available,
                ..Default::default()
            })
        }
    }

    /// What `Disk::settled` returns after a removal, and how long (on
    /// tokio's paused clock) it watched, when the filesystem reads
    /// `readings` from the moment `RemoveImage` returned, 100 available
    /// before.
    async fn settle(readings: &[u64]) -> (u64, Duration) {
        let disk = Disk {
            probe: Arc::new(Scripted(Mutex::new(readings.iter().copied().collect()))),
            path: Some(PathBuf::from("/sim")),
        };
        let before = FsStats {
            capacity_bytes: 1000,
            available_bytes: 100,
            ..Default::default()
        };
        let started = tokio::time::Instant::now();
        let after = disk.settled(Some(before)).await.unwrap();
        (after.available_bytes, started.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn space_back_when_the_removal_returns_is_confirmed_in_one_short_look() {
        // containerd 1.x and CRI-O: deleted before they answer.
        assert_eq!(settle(&[150, 150]).await, (150, SETTLE_CONFIRM));
    }

    #[tokio::test(start_paused = true)]
    async fn space_coming_back_after_the_removal_returns_is_watched_until_it_holds_still() {
        // containerd 2.x: nothing yet as it answers, then in two steps.
        assert_eq!(settle(&[100, 100, 140, 180, 180]).await, (180, SETTLE_STEP * 4));
        // Some back as it answers, more a moment later: the short look
        // sees it still growing, and the watch goes on at the long step.
        assert_eq!(
            settle(&[150, 170, 190, 190]).await,
            (190, SETTLE_CONFIRM + SETTLE_STEP * 2)
        );
        // Nothing comes back (every layer shared): watched to the end.
        assert_eq!(settle(&[100]).await, (100, SETTLE_TIMEOUT));
    }

    #[tokio::test]
    async fn the_usage_poll_reports_runtime_reachability_in_the_metric() {
        let sim = SimHandle::default();
        let (mut c, _dir) = collector(&sim, |_| {});
        let runtime_up = |c: &Collector<SimHandle>| {
            let text = c.metrics().encode();
            text.lines()
                .find(|l| l.starts_with("imagegc_runtime_up "))
                .map(str::to_string)
        };
        assert!(c.poll_usage().await.is_ok());
        assert_eq!(runtime_up(&c).as_deref(), Some("imagegc_runtime_up 1"));
        sim.with(|s| s.fail_lists = true);
        assert!(c.poll_usage().await.is_err());
        assert_eq!(runtime_up(&c).as_deref(), Some("imagegc_runtime_up 0"));
        sim.with(|s| s.fail_lists = false);
        assert!(c.poll_usage().await.is_ok());
        assert_eq!(runtime_up(&c).as_deref(), Some("imagegc_runtime_up 1"));
    }

    #[tokio::test]
    async fn idle_cycles_save_only_changes_and_a_periodic_refresh() {
        let sim = SimHandle::default();
        sim.with(|s| {
            s.images = vec![image("a", 10), image("b", 10)];
            s.containers = vec![crate::testing::container_naming("c", "a")];
            (s.capacity, s.available) = (1000, 900);
        });
        let (mut c, _dir) = collector(&sim, |_| {});
        let path = c.store.path().to_path_buf();
        let read = || std::fs::read(&path).expect("the state file");
        cycle(&mut c).await;
        let first = read();
        // Only the last use of `a`, in use, moved: the file stays as it was.
        cycle(&mut c).await;
        assert_eq!(read(), first);
        // A new image is saved at once.
        sim.with(|s| s.images.push(image("n", 10)));
        cycle(&mut c).await;
        let second = read();
        assert_ne!(second, first);
        match StateStore::new(c.store.dir()).load(c.clock.now(), Duration::from_secs(300)) {
            Loaded::Records { records, .. } => assert!(records.get("n").is_some()),
            _ => panic!("the state file does not load"),
        }
        // Unchanged, but the last save is as old as the refresh period.
        c.last_saved = Some(c.clock.now() - STATE_REFRESH);
        cycle(&mut c).await;
        assert_ne!(read(), second);
        // A removal is saved at once.
        let third = read();
        sim.with(|s| s.images.retain(|i| i.id != "b"));
        cycle(&mut c).await;
        assert_ne!(read(), third);
    }

    fn sample(c: &Collector<SimHandle>, name: &str) -> Option<String> {
        let text = c.metrics().encode();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ').map(str::to_owned))
    }

    #[tokio::test]
    async fn usage_just_under_high_that_the_kubelet_rounds_up_to_it_shows_a_space_pass_due() {
        let sim = SimHandle::default();
        sim.with(|s| {
            s.images = vec![image("a", 10)];
            s.containers = vec![crate::testing::container_naming("c", "a")];
            // 69.55 % used: the exact ratio is under 70 %, the kubelet's
            // whole percent is 70.
            (s.capacity, s.available) = (10_000, 3_045);
        });
        let (mut c, _dir) = collector(&sim, |config| {
            config.gc.high_threshold_percent = 70;
            config.gc.low_threshold_percent = 50;
        });
        let report = cycle(&mut c).await;
        assert!(report.space_pass, "imagegc itself runs the space pass");
        assert_eq!(sample(&c, "imagegc_space_pass_due").as_deref(), Some("1"));

        // Freed to 69 % (rounded up): no pass due any more.
        sim.with(|s| s.available = 3_150);
        cycle(&mut c).await;
        assert_eq!(sample(&c, "imagegc_space_pass_due").as_deref(), Some("0"));
    }

    #[tokio::test]
    async fn a_restarted_collector_reports_the_last_success_of_the_one_before() {
        let sim = SimHandle::default();
        sim.with(|s| (s.capacity, s.available) = (1000, 900));
        let (mut c, dir) = collector(&sim, |_| {});
        let report = cycle(&mut c).await;
        assert_eq!(report.outcome, Outcome::Success);
        let before = c.metrics().last_success().expect("a success");
        c.save().await;
        drop(c);

        let restarted = Collector::new(
            sim.clone(),
            Arc::new({
                let mut config = Config::default();
                config.state.dir = dir.path().to_path_buf();
                config
            }),
            Arc::new(sim.clone()),
            Arc::new(Metrics::new()),
            Clock::starting_at(SystemTime::now()),
        );
        let restored = restarted
            .metrics()
            .last_success()
            .expect("restored from the state file");
        let millis = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_millis();
        assert_eq!(millis(restored), millis(before));
        assert_ne!(
            sample(&restarted, "imagegc_last_success_timestamp_seconds").as_deref(),
            Some("0.0")
        );
    }

    // KUBELET.md scenario 9: below the low threshold nothing is removed.
    #[tokio::test]
    async fn below_threshold_removes_nothing() {
        let sim = SimHandle::default();
        sim.with(|s| {
            s.images = vec![image("a", 100)];
            s.on_disk.insert("a".into(), 100);
            (s.capacity, s.available) = (1000, 600);
        });
        let (mut c, _dir) = collector(&sim, |_| {});
        let report = cycle(&mut c).await;
        assert_eq!(report.outcome, Outcome::Success);
        assert!(!report.space_pass);
        assert!(sim.removed().is_empty());
    }

    // Scenario 10: over the high threshold; one image frees enough, or not.
    #[tokio::test]
    async fn over_high_frees_enough_or_reports_failure() {
        let sim = SimHandle::default();
        sim.with(|s| {
            s.images = vec![image("a", 450)];
            s.on_disk.insert("a".into(), 450);
            (s.capacity, s.available) = (1000, 50);
        });
        let (mut c, _dir) = collector(&sim, |_| {});
        let report = cycle(&mut c).await;
        assert_eq!(report.outcome, Outcome::Success);
        assert_eq!(sim.removed(), ["a"]);
        assert_eq!(report.removed[0].freed_bytes, Some(450));

        let sim = SimHandle::default();
        sim.with(|s| {
            s.images = vec![image("a", 50)];
            s.on_disk.insert("a".into(), 50);
            (s.capacity, s.available) = (1000, 50);
        });
        let (mut c, _dir) = collector(&sim, |_| {});
        let report = cycle(&mut c).await;
        assert_eq!(
            report.outcome,
            Outcome::LowNotReached {
                freed_bytes: 50,
                remaining_bytes: 100
            }
        );
    }

    // Scenario 11: filesystem stats fail: failure, nothing removed.
    #[tokio::test]
    async fn unmeasurable_filesystem_fails_the_cycle_and_removes_nothing() {
        let sim = SimHandle::default();
        sim.with(|s| {
            s.images = vec![image("a", 450)];
            s.fail_stats = true;
        });
        let (mut c, _dir) = collector(&sim, |_| {});
        let report = cycle(&mut c).await;
        assert!(
            matches!(report.outcome, Outcome::Failed(ref e) if e.contains("/sim")),
            "{:?}",
            report.outcome
        );
        assert!(sim.removed().is_empty());
    }

    /// The heart of it: images whose layers are shared free less than their
    /// size. Adding sizes (the kubelet) stops early; measuring goes on to
    /// exactly the image that crosses the low threshold, and no further.
    #[tokio::test]
    async fn shared_layers_reach_low_in_one_cycle_and_no_further() {
        let sim = SimHandle::default();
        sim.with(|s| {
            for (id, disk) in [("a", 50), ("b", 50), ("c", 150), ("d", 300), ("e", 300)] {
                s.images.push(image(id, 200));
                s.on_disk.insert(id.into(), disk);
            }
            (s.capacity, s.available) = (1000, 50);
        });
        let (mut c, _dir) = collector(&sim, |_| {});
        // Give a strict LRU order a..e.
        let report = cycle(&mut c).await;
        // To free 150: a (50) + b (50) + c (150) reach it; d stays.
        assert_eq!(report.outcome, Outcome::Success);
        assert_eq!(sim.removed(), ["a", "b", "c"]);
        assert!(report.after.unwrap().usage_percent() <= 80);
    }

    #[tokio::test]
    async fn an_image_that_comes_into_use_before_removal_is_kept() {
        let sim = SimHandle::default();
        sim.with(|s| {
            s.images = vec![image("a", 100), image("b", 100)];
            s.on_disk.insert("a".into(), 100);
            s.on_disk.insert("b".into(), 100);
            (s.capacity, s.available) = (1000, 0);
            // Cycle lists once, then re-checks before each removal: the
            // container appears right before "a" would go.
            s.appear_at_list = Some((2, crate::testing::container_naming("late", "a")));
        });
        let (mut c, _dir) = collector(&sim, |_| {});
        let report = cycle(&mut c).await;
        assert_eq!(report.became_in_use, ["a"]);
        assert_eq!(sim.removed(), ["b"]);
    }

    #[tokio::test]
    async fn nothing_is_removed_while_status_never_answered() {
        let sim = SimHandle::default();
        sim.with(|s| {
            s.images = vec![image("pause", 100)];
            s.on_disk.insert("pause".into(), 100);
            (s.capacity, s.available) = (1000, 0);
            s.fail_status = true;
        });
        let (mut c, _dir) = collector(&sim, |_| {});
        let report = cycle(&mut c).await;
        assert!(
            matches!(report.outcome, Outcome::Failed(ref e) if e.contains("sandbox image")),
            "{:?}",
            report.outcome
        );
        assert!(sim.removed().is_empty());
        // Once Status answered (here: without a sandbox image), cycles run.
        sim.with(|s| s.fail_status = false);
        cycle(&mut c).await;
        assert_eq!(sim.removed(), ["pause"]);
    }

    #[tokio::test]
    async fn a_failed_removal_is_counted_and_the_walk_goes_on() {
        let sim = SimHandle::default();
        sim.with(|s| {
            s.images = vec![image("a", 100), image("b", 300)];
            s.on_disk.insert("a".into(), 100);
            s.on_disk.insert("b".into(), 300);
            (s.capacity, s.available) = (1000, 0);
            s.fail_remove = vec!["a".into()];
        });
        let (mut c, _dir) = collector(&sim, |_| {});
        let report = cycle(&mut c).await;
        assert_eq!(report.failed.len(), 1);
        assert!(report.failed[0].1.contains("RemoveImage"));
        assert_eq!(sim.removed(), ["b"]);
        assert!(
            c.records().get("a").is_some(),
            "the record of the image not removed stays"
        );
        assert!(c.metrics().encode().contains("imagegc_removal_failures_total 1"));
    }

    #[tokio::test]
    async fn dry_run_removes_nothing_and_estimates_by_size() {
        let sim = SimHandle::default();
        sim.with(|s| {
            for id in ["a", "b", "c"] {
                s.images.push(image(id, 100));
                s.on_disk.insert(id.into(), 100);
            }
            (s.capacity, s.available) = (1000, 50);
        });
        let (mut c, dir) = collector(&sim, |c| c.gc.dry_run = true);
        let report = cycle(&mut c).await;
        assert!(sim.removed().is_empty());
        // 150 to free at 100 bytes each: two would go.
        assert_eq!(report.removed.len(), 2);
        assert!(report.removed.iter().all(|r| r.dry_run && r.freed_bytes.is_none()));
        let journal = Journal::new(dir.path()).read(None).unwrap();
        assert_eq!(journal.len(), 2);
        assert!(journal.iter().all(|e| e.dry_run));
        assert!(
            c.metrics()
                .encode()
                .contains("image_garbage_collected_total{reason=\"space\"} 0")
        );
    }

    #[tokio::test]
    async fn cancellation_stops_between_removals_and_saves_state() {
        let sim = SimHandle::default();
        sim.with(|s| {
            s.images = vec![image("a", 100)];
            (s.capacity, s.available) = (1000, 0);
        });
        let (mut c, dir) = collector(&sim, |_| {});
        let cancel = CancellationToken::new();
        cancel.cancel();
        let report = c.cycle(&cancel).await;
        assert_eq!(report.outcome, Outcome::Interrupted);
        assert!(sim.removed().is_empty());
        assert!(dir.path().join(crate::state::FILE_NAME).exists());
    }

    #[tokio::test]
    async fn an_image_pulled_again_soon_after_removal_counts_as_a_repull() {
        let sim = SimHandle::default();
        sim.with(|s| {
            s.images = vec![image("a", 100), image("b", 100)];
            s.on_disk.insert("a".into(), 200);
            (s.capacity, s.available) = (1000, 50);
        });
        let (mut c, dir) = collector(&sim, |_| {});
        cycle(&mut c).await;
        assert_eq!(sim.removed(), ["a"]);
        // A newer image under the same tag is not the removed one.
        let mut newer = image("a", 100);
        newer.id = "a2".to_string();
        sim.with(|s| {
            s.images.push(newer);
            s.available = 900;
        });
        cycle(&mut c).await;
        assert!(c.metrics().encode().contains("imagegc_repulled_after_removal_total 0"));
        // The removed image itself comes back.
        sim.with(|s| s.images.push(image("a", 100)));
        cycle(&mut c).await;
        assert!(c.metrics().encode().contains("imagegc_repulled_after_removal_total 1"));
        // Counted once, and remembered across a restart through the journal.
        cycle(&mut c).await;
        assert!(c.metrics().encode().contains("imagegc_repulled_after_removal_total 1"));
        let restarted = Collector::new(
            sim.clone(),
            Arc::clone(c.config()),
            Arc::new(sim.clone()),
            Arc::new(Metrics::new()),
            *c.clock(),
        );
        assert_eq!(restarted.recently_removed.len(), 1);
        drop(dir);
    }

    #[tokio::test]
    async fn age_pass_runs_before_space_and_counts_by_reason() {
        let sim = SimHandle::default();
        sim.with(|s| {
            s.images = vec![image("old", 100)];
            s.on_disk.insert("old".into(), 100);
            (s.capacity, s.available) = (1000, 900);
        });
        let (mut c, _dir) = collector(&sim, |c| c.gc.max_age = Duration::from_secs(60));
        // First seen now: not old yet.
        assert!(cycle(&mut c).await.removed.is_empty());
        // Pretend an hour passed by loading a record with an old last use.
        let mut map = HashMap::new();
        let old = SystemTime::now() - Duration::from_secs(7200);
        map.insert(
            "old".to_string(),
            crate::records::Record {
                first_seen: old,
                last_used: old,
                size: 100,
                pinned: false,
                tags: vec![],
                digests: vec![],
                from_history: true,
                ever_used: false,
            },
        );
        c.records = Records::from_map(map);
        let report = cycle(&mut c).await;
        assert_eq!(sim.removed(), ["old"]);
        assert_eq!(report.removed[0].reason, Reason::Age);
        assert!(
            c.metrics()
                .encode()
                .contains("image_garbage_collected_total{reason=\"age\"} 1")
        );
    }
}
