//! `gc.order = "reuse"` (the default): as `superseded-first`, each group
//! by when each image is expected back ([`expected_back`]), farthest
//! first. Of the orders, it is the one that pulled least again over the
//! simulated workloads: behind the kubelet or least recently used on 4 of
//! 136 runs, where `superseded-first` was on 41 (BENCHMARKS.md, "The
//! default order").

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
        "older tags whose repository ran a newer image since first, then the image expected back last \
         first (one usual break between its uses after its last use, or from now once that is past; as \
         long from now as it has been unused when it has none)"
    }

    fn goes_by_expected_back(&self) -> bool {
        true
    }
}

/// When an image last used at `last_used` is expected to be used again.
/// An image used again after breaks before is expected one usual break
/// after its last use (a periodic job's next run); once that is past, one
/// usual break from now (a job whose run is late is as likely to come at
/// any moment as a job that runs at random, whose next run is on average
/// one usual break away whenever it is looked at); once twice its usual
/// break has passed, its job seems to have stopped, and it is expected as
/// any other image is: as long from now as it has been unused, the guess
/// least recently used makes. Over a month of each simulated workload
/// (`imagegc simulate`, BENCHMARKS.md) this order pulled far fewer bytes
/// again on the batch node, whose jobs are periodic, than least recently
/// used or the kubelet; expecting an overdue image at once instead kept
/// images of irregular jobs over ones due soon (4 of 56 runs behind the
/// kubelet or least recently used, against 2).
pub fn expected_back(last_used: SystemTime, usual_break: Option<Duration>, now: SystemTime) -> SystemTime {
    expectation(last_used, usual_break, now).0
}

/// What [`expected_back`] went by, for a person (`plan`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// One usual break after its last use.
    Due {
        /// The usual break.
        usual: Duration,
    },
    /// Past that: one usual break from now.
    Late {
        /// The usual break.
        usual: Duration,
    },
    /// No usual break, or twice it passed: as long from now as unused.
    Unused {
        /// How long it has been unused.
        unused: Duration,
    },
}

impl Basis {
    /// "runs every 2h", "runs every 2h, late", "unused 3h".
    pub fn describe(self) -> String {
        match self {
            Basis::Due { usual } => format!("runs every {}", crate::time::short(usual)),
            Basis::Late { usual } => format!("runs every {}, late", crate::time::short(usual)),
            Basis::Unused { unused } => format!("unused {}", crate::time::short(unused)),
        }
    }

    /// The JSON name: `due`, `late` or `unused`.
    pub fn as_str(self) -> &'static str {
        match self {
            Basis::Due { .. } => "due",
            Basis::Late { .. } => "late",
            Basis::Unused { .. } => "unused",
        }
    }
}

/// [`expected_back`], with what it went by.
pub fn expectation(last_used: SystemTime, usual_break: Option<Duration>, now: SystemTime) -> (SystemTime, Basis) {
    let unused = elapsed(last_used, now);
    let later = |d: Duration| now.checked_add(d).unwrap_or(now);
    match usual_break {
        Some(usual) if unused <= usual => (
            last_used.checked_add(usual).map_or(now, |at| at.max(now)),
            Basis::Due { usual },
        ),
        Some(usual) if unused <= usual.saturating_mul(2) => (later(usual), Basis::Late { usual }),
        _ => (later(unused), Basis::Unused { unused }),
    }
}
