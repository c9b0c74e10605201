//! `gc.order = "reuse"`: as `superseded-first`, each group by when each
//! image is expected back ([`expected_back`]), farthest first.

use std::time::{Duration, SystemTime};

use super::superseded_first::superseded_first;
use super::{Context, SpaceOrder};
use crate::policy::keep::elapsed;
use crate::policy::plan::Candidate;

/// Superseded tags first, then the image expected back last first.
pub struct Reuse;

impl SpaceOrder for Reuse {
    fn sort(&self, space: &mut [Candidate<'_>], context: &Context<'_>) {
        // Stable: images expected back at the same time stay least
        // recently used first.
        space.sort_by_key(|c| std::cmp::Reverse(c.expected_back(context.now)));
        superseded_first(space, context);
    }

    fn explain(&self) -> &'static str {
        "older tags a newer image of their repository superseded first, then the image expected back \
         last first (one usual break between its uses after its last use; as long from now as it has \
         been unused when it has none)"
    }

    fn goes_by_expected_back(&self) -> bool {
        true
    }
}

/// When an image last used at `last_used` is expected to be used again.
/// An image used again after breaks before is expected one usual break
/// after its last use (a periodic job's next run), or now when that is
/// past; once twice its usual break has passed, its job seems to have
/// stopped, and it is expected as any other image is: as long from now as
/// it has been unused, the guess least recently used makes. Over a month
/// of each simulated workload (`imagegc simulate`, BENCHMARKS.md) this
/// order pulled far fewer bytes again on the batch node, whose jobs are
/// periodic, than least recently used or the kubelet.
pub fn expected_back(last_used: SystemTime, usual_break: Option<Duration>, now: SystemTime) -> SystemTime {
    let unused = elapsed(last_used, now);
    match usual_break {
        Some(usual) if unused <= usual.saturating_mul(2) => last_used.checked_add(usual).map_or(now, |at| at.max(now)),
        _ => now.checked_add(unused).unwrap_or(now),
    }
}
