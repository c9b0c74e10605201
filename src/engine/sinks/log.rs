//! The logs: what an operator reads of the engine's events, each event's
//! line worded here, with `tracing` fields.

use std::time::Duration;

use tracing::{debug, info, warn};

use crate::cri::{Image, Names};
use crate::engine::events::{Event, Sink};
use crate::engine::report::{CycleReport, Outcome};
use crate::model::Reason;
use crate::policy::{KeepReason, SpaceOutlook};
use crate::records::RecordChanges;
use crate::store::pending::Settled;
use crate::time::{rfc3339, short};

/// The logs: what an operator reads, worded for them.
#[derive(Default)]
pub struct LogSink;

impl Sink for LogSink {
    // Long on purpose: one arm per event, each the log line an operator
    // reads; splitting it would only scatter the wording.
    fn emit(&self, event: &Event<'_>) {
        match event {
            Event::Listed { observed, images } => log_listed(observed, *images),
            Event::ImageFsMismatch(Some(why)) => warn!(
                mismatch = %why,
                "the measured filesystem is not the filesystem the runtime keeps its images on: no image is removed \
                 for space while this lasts (age removals go on). Unset gc.image_fs_path, and mount the runtime's \
                 root into the pod, so that imagegc measures the mount point the runtime names"
            ),
            Event::ImageFsMismatch(None) => info!("the measured filesystem is the runtime's image filesystem again"),
            Event::SplitStore { image_fs, container_fs } => info!(
                image_fs = %image_fs.display(),
                container_fs = %container_fs.display(),
                "the runtime keeps containers' writable layers on another filesystem than its images: imagegc \
                 measures and frees the image filesystem only (removing images frees nothing on the other)"
            ),
            Event::MountsUnread(Some(err)) => warn!(
                error = %err,
                "cannot read the images a container mounts (ContainerStatus): no image is removed until they can \
                 be read, since it may mount any of them"
            ),
            Event::MountsUnread(None) => info!("every container's mounted images can be read again"),
            Event::SandboxPodsUnread(Some(err)) => warn!(
                error = %err,
                "cannot read a pod's sandbox image (PodSandboxStatus): no image that no container has ever used \
                 is removed until it can be read"
            ),
            Event::SandboxPodsUnread(None) => info!("every pod's sandbox image can be read again"),
            Event::SandboxConfiguredUnmatched(configured) => warn!(
                sandbox_image = configured,
                "runtime.sandbox_image names no listed image: it protects nothing until an image of that name is \
                 listed, and the other sources of the sandbox image are used meanwhile"
            ),
            Event::SandboxUnnamed => warn!(
                "the runtime does not say which image is its sandbox (pause) image, no pod names it and it pins \
                 no image: no image that no container has ever used is removed; set runtime.sandbox_image to name it"
            ),
            Event::Repulled {
                image,
                removed_ago,
                unreachable,
                thrash_window,
            } => log_repull(image, *removed_ago, unreachable.as_ref(), *thrash_window),
            Event::Planned {
                age_guarded, max_age, ..
            } if *age_guarded > 0 => info!(
                images = age_guarded,
                max_age = %short(*max_age),
                "images without history are not removed by age until imagegc has run longer than max age"
            ),
            Event::ImageFsUnknown(err) => warn!(error = %err, "cannot find the image filesystem"),
            Event::EvictionBeforeHigh {
                high,
                evicts_below,
                capacity,
            } => warn!(
                high_threshold_percent = high,
                eviction_available_bytes = evicts_below,
                capacity_bytes = capacity,
                "the kubelet evicts pods before usage reaches gc.high_threshold_percent: lower the high threshold"
            ),
            Event::SpacePassNotDue { usage_percent, high } => {
                debug!(usage_percent, high, "usage below the high threshold");
            }
            Event::SpacePassSkipped(why) => {
                debug!(mismatch = %why, "no space pass: the measured filesystem is not the runtime's");
            }
            Event::Hurrying { stats, evicts_below } => warn!(
                usage_percent = stats.usage_percent(),
                available_bytes = stats.available(),
                eviction_available_bytes = evicts_below,
                "image filesystem past the kubelet's eviction line: removing by estimate, without waiting for each removal's space"
            ),
            Event::MakingRoom { pulls, footprint } => {
                for pull in *pulls {
                    info!(
                        image = %pull.image,
                        pod = %pull.pod,
                        sized = pull.like.as_ref().map_or_else(String::new, crate::policy::coming::PullSize::says),
                        bytes_on_disk = pull.bytes_on_disk(*footprint),
                        "a pod bound to this node names an image the node lacks: making room before the kubelet pulls it"
                    );
                }
            }
            Event::PullsCannotFit { pulls, footprint } => {
                for pull in *pulls {
                    warn!(
                        image = %pull.image,
                        pod = %pull.pod,
                        sized = pull.like.as_ref().map_or_else(String::new, crate::policy::coming::PullSize::says),
                        bytes_on_disk = pull.bytes_on_disk(*footprint),
                        "a pod bound to this node names an image that would not fit above the kubelet's eviction \
                         line even with every removable image gone: no room is made for it (removing images \
                         cannot help; the kubelet will evict when it pulls)"
                    );
                }
            }
            Event::HurryCorrected { expected, came_back } => info!(
                expected_bytes = expected,
                measured_bytes = came_back,
                "removals made in a hurry measured: the walk goes on from what came back"
            ),
            Event::SpacePassStarted {
                stats,
                high,
                low,
                to_free,
            } => info!(
                usage_percent = stats.usage_percent(),
                high_threshold_percent = high,
                low_threshold_percent = low,
                bytes_to_free = to_free,
                inode_usage_percent = stats.inode_usage_percent(),
                "image filesystem usage is at or above the high threshold: freeing space down to the low threshold"
            ),
            Event::SpaceUnreachable {
                outlook: Some(o),
                thrash_window,
            } => warn!(
                bytes_to_free = o.bytes_to_free,
                images_could_free = o.could_free,
                not_image_bytes = o.not_image_bytes,
                thrash_window = %short(*thrash_window),
                "removing every removable image cannot bring usage to the low threshold: {}. imagegc still frees \
                 what helps, but removes no image for space that it removed within gc.thrash_window, so the node \
                 does not pull and lose the same images over and over",
                o.what_stands_in_the_way()
            ),
            Event::SpaceUnreachable { outlook: None, .. } => info!("images can bring usage to the low threshold again"),
            Event::SpaceReachedOnceAged { outlook, first_after } => info!(
                bytes_to_free = outlook.bytes_to_free,
                images_could_free = outlook.could_free,
                young_images_could_free = outlook.could_free_once_aged,
                first_removable_in = %short(*first_after),
                "removable images cannot bring usage to the low threshold yet; images younger than gc.min_age \
                 can once they age, and a cycle runs when the first of them may go"
            ),
            Event::MeasureFailedMidWalk(err) => warn!(
                error = %err,
                "cannot re-measure the image filesystem: falling back to the runtime's image sizes (they overstate what shared layers free)"
            ),
            Event::HeldBack(id) => {
                debug!(image = %id, "removed within gc.thrash_window while images cannot reach low: left alone");
            }
            Event::Rechecking(id) => debug!(image = %id, "re-checking containers before removal"),
            Event::RecheckStale {
                id,
                age,
                gave_up: false,
            } => debug!(
                image = %id,
                age_ms = age.as_millis() as u64,
                "the re-check went stale before the removal: re-checking again"
            ),
            Event::RecheckStale { id, age, gave_up: true } => warn!(
                image = %id,
                age_ms = age.as_millis() as u64,
                "the re-check went stale before every removal attempt (the runtime or this host is slow): \
                 keeping the image for this cycle"
            ),
            Event::Kept { id, tags, why } => log_kept(id, tags, why),
            Event::GoneAlready { id, tags } => {
                info!(image = %id, tags = ?tags, "the runtime says the image is gone already: kept; the next listing tells whether someone else removed it");
            }
            Event::Removing { id, reason, dry_run } => debug!(
                image = %id,
                reason = reason.as_str(),
                "no container uses the image: {}",
                if *dry_run { "it would be removed" } else { "removing it" }
            ),
            Event::Removed(removal) => info!(
                image = %removal.id,
                tags = ?removal.tags,
                reason = removal.reason.as_str(),
                size = removal.size,
                freed_bytes = removal.freed_bytes,
                last_used = %rfc3339(removal.last_used),
                dry_run = removal.dry_run,
                "{}",
                if removal.dry_run { "would remove image (dry run)" } else { "removed image" }
            ),
            Event::RemovedByOthers { images, .. } => {
                for image in *images {
                    info!(image = %image.id, tags = ?image.tags, size = image.size, "image removed by someone else");
                }
                warn!(
                    images = images.len(),
                    bytes = images.iter().map(|i| i.size).sum::<u64>(),
                    "images removed by someone else (the kubelet's image GC, another collector, crictl rmi): imagegc \
                     did not ask for these removals; two collectors on one node work against each other"
                );
            }
            Event::RemovalFailed {
                id,
                tags,
                reason,
                error,
            } => {
                warn!(image = %id, tags = ?tags, reason = reason.as_str(), error = %error, "could not remove image");
            }
            Event::RemovalNotDone { id, endpoint, first } => {
                if *first {
                    warn!(
                        image = %id,
                        endpoint,
                        "RemoveImage answered OK, but the runtime still lists the image: not counted as removed \
                         (said once; later cases are logged at debug level)"
                    );
                } else {
                    debug!(image = %id, "RemoveImage answered OK, but the image is still listed");
                }
            }
            Event::RemovedDespiteError { id, error } => {
                warn!(image = %id, error = %error, "RemoveImage failed, but the image is gone: counted as removed");
            }
            Event::RemovalUnsettled { id, error } => warn!(
                image = %id,
                error = %error,
                "the runtime did not say whether it removed the image and still lists it: no further image \
                 is removed for space this cycle; the removal is journaled if a later listing shows it went"
            ),
            Event::PendingSettled {
                id,
                tags,
                reason,
                earlier_process,
                how,
            } => log_settled(id, tags, reason, *earlier_process, *how),
            Event::Saved(Ok(records)) => debug!(records, "state saved"),
            Event::Saved(Err(err)) => warn!(error = %err, "could not save state; will retry at the next save"),
            Event::CycleFinished(report) => log_summary(report),
            _ => {}
        }
    }
}

fn log_listed(observed: &RecordChanges, images: usize) {
    if observed.vanished > 0 {
        let grace = short(crate::records::VANISHED_GRACE);
        if images == 0 {
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
}

fn log_repull(image: &Image, removed_ago: Duration, unreachable: Option<&SpaceOutlook>, window: Duration) {
    let removed_ago = short(removed_ago);
    match unreachable {
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
            thrash_window = %short(window),
            "an image imagegc removed was pulled again within the thrash window: \
             the policy may be too aggressive for this node (raise the low threshold, max age or keep_recent_per_repository)"
        ),
    }
}

fn log_kept(id: &str, tags: &Names, why: &KeepReason<'_>) {
    match why {
        KeepReason::InUse { .. } => info!(image = %id, tags = ?tags, "image came into use; keeping it"),
        KeepReason::Pinned => {
            info!(image = %id, tags = ?tags, "the runtime pinned the image since the listing; keeping it");
        }
        KeepReason::Sandbox => info!(
            image = %id,
            tags = ?tags,
            "the image is a sandbox image under a name it gained since the listing; keeping it"
        ),
        KeepReason::Protected { pattern } => info!(
            image = %id,
            tags = ?tags,
            %pattern,
            "a name the image gained since the listing is protected; keeping it"
        ),
        KeepReason::Pod { pod } => info!(
            image = %id,
            tags = ?tags,
            %pod,
            "a pod bound to this node names the image; keeping it"
        ),
        KeepReason::MountsUnknown => {
            info!(image = %id, "a container's mounted images cannot be read: keeping the image");
        }
        other => info!(image = %id, tags = ?tags, reason = other.label(), "keeping the image"),
    }
}

fn log_settled(id: &str, tags: &[String], reason: &str, earlier_process: bool, how: Settled) {
    match (earlier_process, how) {
        (true, Settled::Gone) => warn!(
            image = %id,
            tags = ?tags,
            reason,
            "a removal in flight when imagegc last stopped was completed after shutdown: journaling it"
        ),
        (true, Settled::StillThere) => warn!(
            image = %id,
            tags = ?tags,
            waited = %short(crate::store::pending::PENDING_LIMIT),
            "a removal in flight when imagegc last stopped did not happen: the image is still there"
        ),
        (false, Settled::Gone) => info!(
            image = %id,
            reason,
            "a removal whose outcome the runtime did not tell went through"
        ),
        (false, Settled::StillThere) => info!(
            image = %id,
            waited = %short(crate::store::pending::PENDING_LIMIT),
            "a removal whose outcome the runtime did not tell did not happen: the image is still there"
        ),
        (_, Settled::NotSent) => info!(
            image = %id,
            "a removal noted when imagegc last stopped was never asked of the runtime (the process ended during \
             its re-check): forgetting it, not journaled"
        ),
        (_, Settled::Unconfirmed) => warn!(
            image = %id,
            tags = ?tags,
            waited = %short(crate::store::pending::PENDING_LIMIT),
            "the runtime never said whether a removal whose outcome was unknown happened: forgetting it, not journaled"
        ),
    }
}

fn log_summary(report: &CycleReport) {
    let by = |reason| report.removed.iter().filter(|r| r.reason == reason).count();
    let (age, space) = (by(Reason::Age), by(Reason::Space));
    let failed = report.failed.len();
    let freed = report.freed_bytes();
    let before = report.before.map(|s| s.usage_percent());
    let after = report.after.map(|s| s.usage_percent());
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
