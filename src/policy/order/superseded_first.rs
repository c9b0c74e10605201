//! `gc.order = "superseded-first"`: the space candidates a newer image of
//! one of their repositories superseded go first, each group in the order
//! it had. After a rollout the old tag is seldom run again, while an image
//! unused for a while but still the newest of its repository (a pod that
//! moved away, a periodic job) is what the node pulls back; least recently
//! used alone cannot tell them apart. `imagegc simulate` measures the
//! difference (BENCHMARKS.md).
//!
//! Superseded means that a newer image (first seen later, listed now) of
//! the repository **ran since** this one last did. Newer alone is not
//! enough: after a rollback the newer tag is the one abandoned, and the
//! older one, running again, is the service's current image (measured: on
//! the simulated service node, seed 1, a rule of "first seen later" removed
//! it whenever its pod moved away, and pulled 0.68 GB again where least
//! recently used pulled 0.39).

use std::time::SystemTime;

use super::{Context, SpaceOrder};
use crate::collections::HashMap;
use crate::model::reference;
use crate::policy::candidate::Candidate;

/// Superseded tags first, then least recently used.
pub struct SupersededFirst;

impl SpaceOrder for SupersededFirst {
    fn sort(&self, space: &mut [Candidate<'_>], context: &Context<'_>) {
        superseded_first(space, context);
    }

    fn explain(&self) -> &'static str {
        "older tags whose repository ran a newer image since first, then least recently used"
    }
}

/// Puts the candidates a newer image of their repository superseded first,
/// each group in the order it had.
pub(super) fn superseded_first(space: &mut [Candidate<'_>], context: &Context<'_>) {
    let newer = Newer::of(context);
    // Stable: each group keeps the order it had.
    space.sort_by_key(|c| !newer.supersedes(c));
}

/// For each repository of a listing, its images that ran, by when each was
/// first seen: what tells whether a newer image of a repository ran since
/// an image last did.
struct Newer<'l> {
    /// The first-seen times of the images that ran, in order, and for each
    /// place the latest last use of that image and every later one.
    by_repository: HashMap<&'l str, (Vec<SystemTime>, Vec<SystemTime>)>,
}

impl<'l> Newer<'l> {
    fn of(context: &Context<'l>) -> Self {
        let Context { snapshot, listed, .. } = *context;
        let mut used: HashMap<&'l str, Vec<(SystemTime, SystemTime)>> = HashMap::default();
        for (image, place) in snapshot.images.iter().zip(&listed.places) {
            // An image never run supersedes nothing (a pre-pull, a tag not
            // rolled out yet).
            let Some(history) = place.history.filter(|h| h.ever_used) else {
                continue;
            };
            for tag in &image.repo_tags {
                used.entry(reference::repository(tag))
                    .or_default()
                    .push((history.first_seen, history.last_used));
            }
        }
        let by_repository = used
            .into_iter()
            .map(|(repository, mut images)| {
                images.sort_unstable();
                let first_seen = images.iter().map(|&(f, _)| f).collect();
                let mut latest_from: Vec<SystemTime> = images.iter().map(|&(_, l)| l).collect();
                for i in (0..latest_from.len().saturating_sub(1)).rev() {
                    latest_from[i] = latest_from[i].max(latest_from[i + 1]);
                }
                (repository, (first_seen, latest_from))
            })
            .collect();
        Newer { by_repository }
    }

    /// Whether an image of one of `c`'s repositories first seen after it
    /// ran after `c` last did.
    fn supersedes(&self, c: &Candidate<'_>) -> bool {
        c.tags.iter().any(|tag| {
            self.by_repository
                .get(reference::repository(tag))
                .is_some_and(|(first_seen, latest_from)| {
                    let after = first_seen.partition_point(|&f| f <= c.first_seen);
                    latest_from.get(after).is_some_and(|&latest| latest > c.last_used)
                })
        })
    }
}
