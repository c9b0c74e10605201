//! Every listing, in a cycle or between cycles, marks the images in use
//! now, gives images first seen their record, notices re-pulls and settles
//! pending removals; container events mark use between listings.

use crate::cri::{ContainerEvent, Image, Runtime, RuntimeError, Snapshot};
use crate::matching::{self, InUse};
use crate::policy::{self, Plan};
use crate::records::{Listed, Observed};

use super::observe::{ImageFs, Observation};
use super::{Collector, Event};

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

impl<R: Runtime> Collector<R> {
    /// Lists images, containers and the sandbox image, and updates the
    /// records. Also returns the image filesystem (see [`ImageFs`]).
    pub async fn observe(&mut self) -> Result<Listing, RuntimeError> {
        let observation = self.observer.observe(&self.runtime, &self.config).await;
        self.sinks.emit(&Event::RuntimeUp(observation.is_ok()));
        let Observation {
            snapshot,
            image_fs,
            sandbox_unknown,
            sandbox_configured_unmatched,
            mounts_unread,
            footprint,
        } = observation?;
        self.sandbox_unknown = sandbox_unknown;
        if !self.runtime_named && self.observer.runtime_named() {
            // Measured removals raise it from here on.
            self.runtime_named = true;
            self.footprint = footprint;
        }
        self.note_image_fs(image_fs.as_ref().ok());
        self.note_sources(&snapshot, sandbox_configured_unmatched, mounts_unread.as_deref());
        let (observed, listed) = self.records.observe_snapshot(&snapshot, self.clock.now());
        self.note_listing(&observed, &snapshot.images).await;
        Ok(Listing {
            snapshot,
            listed,
            image_fs,
        })
    }

    /// Plans a cycle over a listing from [`Collector::observe`], without
    /// removing anything (`imagegc plan`).
    pub fn plan<'a>(&'a self, snapshot: &'a Snapshot, listed: &Listed) -> Plan<'a> {
        policy::plan_listed(snapshot, listed, &self.config, self.clock.now(), self.clock.started())
    }

    /// Lists images and containers between cycles: images first seen now
    /// get their record now (min age counts from when an image appeared,
    /// not from the next cycle), and the images containers use are marked
    /// used now. Like a cycle's listing, it tells whether the runtime
    /// answered: between cycles the poll is what notices an outage.
    pub async fn poll_usage(&mut self) -> Result<usize, RuntimeError> {
        let listings = self.observer.list(&self.runtime).await;
        self.sinks.emit(&Event::RuntimeUp(listings.is_ok()));
        let (images, containers) = listings?;
        let observed = self.records.observe(&images, &containers, self.clock.now());
        self.note_listing(&observed, &images).await;
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

    /// What a listing did beyond last-used times: the records' changes,
    /// re-pulls, and the pending removals it settles.
    async fn note_listing(&mut self, observed: &Observed, images: &[Image]) {
        self.sinks.emit(&Event::Listed {
            observed,
            images: images.len(),
        });
        let window = self.config.gc.thrash_window;
        let unreachable = self.thrash.unreachable();
        for repull in self.thrash.repulls(self.clock.now(), window, images, &observed.new_ids) {
            self.sinks.emit(&Event::Repulled {
                image: &images[repull.index],
                removed_ago: repull.removed_ago,
                unreachable,
                thrash_window: window,
            });
        }
        self.settle_pending(images).await;
    }

    /// Checks the image filesystem a listing found: starts or ends an
    /// episode in which the measured filesystem is not the runtime's, and
    /// notes the path the usage checks between cycles measure.
    fn note_image_fs(&mut self, image_fs: Option<&ImageFs>) {
        let mismatch = image_fs.and_then(|fs| fs.mismatch(self.probe.as_ref()));
        if image_fs.is_some() || mismatch.is_some() {
            if mismatch != self.image_fs_mismatch {
                match &mismatch {
                    Some(why) if self.image_fs_mismatch.is_none() => {
                        self.sinks.emit(&Event::ImageFsMismatch(Some(why)));
                    }
                    None => self.sinks.emit(&Event::ImageFsMismatch(None)),
                    Some(_) => {}
                }
            }
            self.image_fs_mismatch = mismatch;
        }
        self.disk_path = image_fs
            .filter(|_| self.image_fs_mismatch.is_none())
            .map(|fs| fs.path.clone())
            .filter(|p| !p.as_os_str().is_empty());
    }

    /// Says, once per episode, that a container's mounts or a pod's sandbox
    /// image could not be read (images are kept meanwhile), and once per
    /// process that the sandbox image is named by no source, or that
    /// `runtime.sandbox_image` names no listed image.
    fn note_sources(&mut self, snapshot: &Snapshot, configured_unmatched: bool, mounts_unread: Option<&str>) {
        if self.said.mounts_unread != mounts_unread.is_some() {
            self.said.mounts_unread = mounts_unread.is_some();
            self.sinks.emit(&Event::MountsUnread(mounts_unread));
        }
        let pods_unread = snapshot.sandbox_pods_unread.as_deref();
        if self.said.sandbox_pods_unread != pods_unread.is_some() {
            self.said.sandbox_pods_unread = pods_unread.is_some();
            self.sinks.emit(&Event::SandboxPodsUnread(pods_unread));
        }
        if configured_unmatched && !std::mem::replace(&mut self.said.sandbox_configured, true) {
            let configured = self.config.runtime.sandbox_image.as_deref().unwrap_or_default();
            self.sinks.emit(&Event::SandboxConfiguredUnmatched(configured));
        }
        if snapshot.sandbox_unknown()
            && pods_unread.is_none()
            && !std::mem::replace(&mut self.said.sandbox_unnamed, true)
        {
            self.sinks.emit(&Event::SandboxUnnamed);
        }
    }
}
