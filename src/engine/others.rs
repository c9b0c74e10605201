//! Removals by others: images that went without imagegc asking (the
//! kubelet's own image GC, another collector, `crictl rmi`).
//!
//! An image counts as removed by someone else only when it is gone by the
//! rule pending removals settle by: a listing omits it **and** `ImageStatus`
//! says the runtime does not have it twice, [`GONE_CONFIRMED`]
//! apart (a listing alone may be partial, one answer wrong). A
//! removal imagegc asked for never counts: one pending at the listing that
//! first omitted the image (this process's or an earlier one's, settled
//! late or not at all), and one the journal holds for the image since it
//! was first seen (a process that ended between its journal line and its
//! state save). When in doubt (`ImageStatus` fails until the records'
//! grace passes), nothing is counted. An image that went while no imagegc
//! ran is found at the first listing after the start, as its record
//! (from the state file) is then omitted.
//!
//! What is found goes out as [`Event::RemovedByOthers`]: metrics, the
//! usage log (`"by":"other"`, read back by `plan`, `images` and
//! `check-config`), logs and a node event once per episode.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use crate::cri::{Runtime, RuntimeError};

use crate::model::Image;
use crate::records::{Unlisted, VANISHED_GRACE};
use crate::store::pending::Seen;

use super::{Collector, Event};

/// How many unlisted images are asked about (`ImageStatus`, all at once)
/// at one listing: the kubelet removes a batch at a time, and a partial
/// listing that omits thousands must not cost thousands of calls; the
/// others are asked about at the next listings.
const ASKED_PER_LISTING: usize = 16;

/// Images a listing omitted, not yet known removed or still there.
#[derive(Debug, Default)]
pub(super) struct Unconfirmed {
    images: Vec<(Unlisted, SystemTime)>,
}

impl Unconfirmed {
    /// Watches `fresh` (omitted by the listing of `images` at `now`) with
    /// those watched before; lets go of those listed again (the listing
    /// that omitted them was partial) or unsure for longer than the
    /// records keep them. The ones to ask about now: none after a listing
    /// of nothing (a runtime restarting tells nothing).
    pub(super) fn watch<'u>(
        &mut self,
        fresh: impl Iterator<Item = &'u Unlisted>,
        images: &[Image],
        now: SystemTime,
    ) -> Vec<String> {
        self.images.extend(fresh.map(|u| (u.clone(), now)));
        if self.images.is_empty() {
            return Vec::new();
        }
        let listed: HashSet<&str> = images.iter().map(|i| i.id.as_str()).collect();
        self.images.retain(|(u, since)| {
            !listed.contains(u.id.as_str()) && now.duration_since(*since).unwrap_or_default() < VANISHED_GRACE
        });
        if images.is_empty() {
            return Vec::new();
        }
        self.images
            .iter()
            .take(ASKED_PER_LISTING)
            .map(|(u, _)| u.id.clone())
            .collect()
    }

    /// What `ImageStatus` said of `id`: there, it is let go; unsure, asked
    /// again after the others waiting; gone, it is returned.
    pub(super) fn seen(&mut self, id: &str, seen: Seen) -> Option<Unlisted> {
        let place = self.images.iter().position(|(u, _)| u.id == id);
        match seen {
            Seen::Unsure => {
                if let Some(place) = place {
                    let unsure = self.images.remove(place);
                    self.images.push(unsure);
                }
                None
            }
            Seen::There => {
                self.images.retain(|(u, _)| u.id != id);
                None
            }
            Seen::Gone => place.map(|place| self.images.remove(place).0),
        }
    }
}

impl<R: Runtime> Collector<R> {
    /// Finds the images of `unlisted` (and of earlier listings, still
    /// unconfirmed) that someone else removed, after the pending removals
    /// were settled against `images`. `asked` holds the images of the
    /// removals pending before that listing: never counted.
    pub(super) async fn find_removed_by_others(
        &mut self,
        unlisted: &[Unlisted],
        images: &[Image],
        asked: &HashSet<String>,
    ) {
        let now = self.clock.now();
        let ids = self.remover.watch_unlisted(unlisted, images, asked, now);
        if ids.is_empty() {
            return;
        }
        let answers = seen_twice(&self.runtime, &ids).await;
        let mut gone = Vec::new();
        for (id, seen) in ids.iter().zip(answers) {
            gone.extend(self.remover.unlisted_seen(id, seen));
        }
        let gone = self.not_journaled(gone).await;
        if gone.is_empty() {
            return;
        }
        for image in &gone {
            self.inventory.forget(&image.id, now);
        }
        // Saved before it is said: a process that ends in between says it
        // no more (the next one has no record of the image to find
        // omitted), where the other way round it would be said again by
        // the next process, from the record the state file still held.
        self.save().await;
        self.sinks.emit(&Event::RemovedByOthers { images: &gone, at: now });
    }

    /// The images of `gone` that the journal does not say imagegc removed
    /// since each was first seen.
    async fn not_journaled(&self, gone: Vec<Unlisted>) -> Vec<Unlisted> {
        let Some(since) = gone.iter().map(|u| u.first_seen).min() else {
            return gone;
        };
        let journal = self.remover.journal();
        let since = since.checked_sub(std::time::Duration::from_secs(1));
        // A journal that cannot be read leaves the doubt: nothing counted.
        let Some(entries) = tokio::task::spawn_blocking(move || journal.read(since))
            .await
            .ok()
            .and_then(Result::ok)
        else {
            return Vec::new();
        };
        gone.into_iter()
            .filter(|u| {
                // Journal lines are stamped to the second.
                !entries.iter().any(|e| {
                    !e.dry_run
                        && e.image == u.id
                        && e.timestamp()
                            .is_some_and(|at| at + std::time::Duration::from_secs(1) > u.first_seen)
                })
            })
            .collect()
    }
}

/// How far apart two answers of the runtime that an image is gone must be
/// for imagegc to take it as gone, when nothing else says so (a removal of
/// unknown outcome settled, a removal by others counted): one partial
/// listing and one wrong `ImageStatus` are not a removal, and history
/// rests on neither alone.
pub(super) const GONE_CONFIRMED: Duration = Duration::from_secs(1);

/// What `ImageStatus` says of the image of a pending removal the listing
/// omitted: not found is gone; found is still there (the listing was
/// partial); an error tells nothing.
fn seen_by_status(answer: &Result<Option<Image>, RuntimeError>) -> Seen {
    match answer {
        Ok(None) => Seen::Gone,
        Ok(Some(_)) => Seen::There,
        Err(_) => Seen::Unsure,
    }
}

/// What `ImageStatus` says of each of `ids` (images a listing omitted),
/// all asked at once (see [`seen_by_status`]); those it says are gone
/// are asked again [`GONE_CONFIRMED`] later, and count as gone only
/// when both answers agree.
pub(super) async fn seen_twice<R: Runtime>(runtime: &R, ids: &[String]) -> Vec<Seen> {
    let mut seen: Vec<Seen> = futures_util::future::join_all(ids.iter().map(|id| runtime.image_status(id)))
        .await
        .iter()
        .map(seen_by_status)
        .collect();
    let again: Vec<usize> = (0..ids.len()).filter(|&i| seen[i] == Seen::Gone).collect();
    if again.is_empty() {
        return seen;
    }
    tokio::time::sleep(GONE_CONFIRMED).await;
    let answers = futures_util::future::join_all(again.iter().map(|&i| runtime.image_status(&ids[i]))).await;
    for (i, answer) in again.into_iter().zip(answers) {
        seen[i] = seen_by_status(&answer);
    }
    seen
}
