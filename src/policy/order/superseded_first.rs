//! `gc.order = "superseded-first"` (the default): the space candidates a
//! newer image of one of their repositories (first seen later, listed now)
//! superseded go first, each group in the order it had. After a rollout
//! the old tag is seldom run again, while an image unused for a while but
//! still the newest of its repository (a pod that moved away, a periodic
//! job) is what the node pulls back; least recently used alone cannot tell
//! them apart. `imagegc simulate` measures the difference (BENCHMARKS.md).

use std::time::SystemTime;

use super::{Context, SpaceOrder};
use crate::collections::HashMap;
use crate::model::reference;
use crate::policy::plan::Candidate;

/// Superseded tags first, then least recently used.
pub struct SupersededFirst;

impl SpaceOrder for SupersededFirst {
    fn sort(&self, space: &mut [Candidate<'_>], context: &Context<'_>) {
        superseded_first(space, context);
    }

    fn explain(&self) -> &'static str {
        "older tags a newer image of their repository superseded first, then least recently used"
    }
}

/// Puts the candidates a newer image of their repository superseded first,
/// each group in the order it had.
pub(super) fn superseded_first(space: &mut [Candidate<'_>], context: &Context<'_>) {
    let Context { snapshot, listed, now } = *context;
    let mut newest: HashMap<&str, SystemTime> = HashMap::default();
    for (image, place) in snapshot.images.iter().zip(&listed.places) {
        let first_seen = place.history.map_or(now, |h| h.first_seen);
        for tag in &image.repo_tags {
            let seen = newest.entry(reference::repository(tag)).or_insert(first_seen);
            *seen = (*seen).max(first_seen);
        }
    }
    let superseded = |c: &Candidate<'_>| {
        c.tags.iter().any(|tag| {
            newest
                .get(reference::repository(tag))
                .is_some_and(|&n| n > c.first_seen)
        })
    };
    // Stable: each group keeps the order it had.
    space.sort_by_key(|c| !superseded(c));
}
