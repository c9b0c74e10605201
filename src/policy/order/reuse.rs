//! `gc.order = "reuse"` (the default): as `superseded-first`, each group
//! by when each image is expected back ([`expected_back`]), farthest
//! first. Of the orders, it is the one that pulled least again over the
//! simulated workloads: behind the kubelet or least recently used on none
//! of the 136 runs of BENCHMARKS.md ("The default order"), where
//! `superseded-first` was on 41.

use std::time::{Duration, SystemTime};

use super::superseded_first::superseded_first;
use super::{Context, SpaceOrder};
use crate::policy::candidate::Candidate;
use crate::policy::keep::elapsed;
use crate::records::Break;

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
         first (one usual break between its uses after its last use, or from now once that is past or \
         when its breaks vary as a random use's do; as long from now as it has been unused when it has \
         none)"
    }

    fn goes_by_expected_back(&self) -> bool {
        true
    }
}

// The expectation of a candidate, where the expectation is.
impl Candidate<'_> {
    /// When the image is expected to be used again ([`expected_back`]):
    /// what `gc.order = "reuse"` orders the space candidates by.
    pub fn expected_back(&self, now: SystemTime) -> SystemTime {
        expected_back(self.last_used, self.usual_break, now)
    }

    /// [`Candidate::expected_back`], with what it went by (for `plan`).
    pub fn expectation(&self, now: SystemTime) -> (SystemTime, Basis) {
        expectation(self.last_used, self.usual_break, now)
    }
}

/// When an image last used at `last_used` is expected to be used again,
/// after breaks before of `usual_break` (its usual length and spread).
///
/// A periodic job's image is expected one usual break after its last use
/// (its next run); once that is past, one usual break from now (a job
/// whose run is late is as likely to come at any moment as a job that
/// runs at random, whose next run is on average one usual break away
/// whenever it is looked at); once twice its usual break has passed, its
/// job seems to have stopped, and it is expected as any other image is:
/// as long from now as it has been unused, the guess least recently used
/// makes.
///
/// An image used at random (a CI pipeline's, run on pushes) has no next
/// run: its breaks stray from their mean by about the mean itself, and at
/// any moment its next use is about one mean break away, whatever the
/// time since the last (the longer it has been unused, the rarer it looks,
/// so the mean of its usual break and that time). Expecting it one usual
/// break after its last use would keep it the more, the longer unused. So
/// the expectation moves from the periodic one towards that one as the
/// spread grows: all the way at a spread of [`RANDOM_SPREAD`] times the
/// usual break, and two thirds of the way while one break alone tells no
/// spread.
///
/// Over a month of each simulated workload (`imagegc simulate`,
/// BENCHMARKS.md), the periodic expectation alone pulled far fewer bytes
/// again than least recently used or the kubelet on the batch node, whose
/// jobs are periodic, but more than least recently used on one CI runner;
/// with the spread, 1.4 % less on CI runners (seeds 1-25), 0.4 % more on
/// the batch node, and behind the kubelet or least recently used on none
/// of the 136 runs of BENCHMARKS.md (4 before).
pub fn expected_back(last_used: SystemTime, usual_break: Option<Break>, now: SystemTime) -> SystemTime {
    expectation(last_used, usual_break, now).0
}

/// The spread, as a share of the usual break, at which an image counts as
/// used at random: an exponential break (a Poisson process) strays from
/// its mean by 2/e, 0.74 of it, on average; 1.5 leaves room for an
/// estimate from few breaks. Tried over the 136 simulated runs of
/// BENCHMARKS.md: 0.5, 0.75, 1, 1.25, 1.5 and 2 (1.5 the only one behind
/// the kubelet or least recently used on none).
pub const RANDOM_SPREAD: f64 = 1.5;

/// How far an image with these breaks counts as used at random, from 0
/// (periodic) to 1.
fn randomness(usual_break: Break) -> f64 {
    match usual_break.spread() {
        Some(spread) => (spread.as_secs_f64() / (RANDOM_SPREAD * usual_break.duration().as_secs_f64())).min(1.0),
        None => 1.0 / RANDOM_SPREAD,
    }
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
    /// Breaks that stray as far as a random use's (half the way or more):
    /// about one usual break from now.
    Random {
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
    /// "runs every 2h", "runs every 2h, late", "used about every 2h, at
    /// random", "unused 3h".
    pub fn describe(self) -> String {
        match self {
            Basis::Due { usual } => format!("runs every {}", crate::time::short(usual)),
            Basis::Late { usual } => format!("runs every {}, late", crate::time::short(usual)),
            Basis::Random { usual } => format!("used about every {}, at random", crate::time::short(usual)),
            Basis::Unused { unused } => format!("unused {}", crate::time::short(unused)),
        }
    }

    /// The JSON name: `due`, `late`, `random` or `unused`.
    pub fn as_str(self) -> &'static str {
        match self {
            Basis::Due { .. } => "due",
            Basis::Late { .. } => "late",
            Basis::Random { .. } => "random",
            Basis::Unused { .. } => "unused",
        }
    }

    /// The usual break it went by, if any.
    pub fn usual(self) -> Option<Duration> {
        match self {
            Basis::Due { usual } | Basis::Late { usual } | Basis::Random { usual } => Some(usual),
            Basis::Unused { .. } => None,
        }
    }
}

/// [`expected_back`], with what it went by.
pub fn expectation(last_used: SystemTime, usual_break: Option<Break>, now: SystemTime) -> (SystemTime, Basis) {
    let unused = elapsed(last_used, now);
    let later = |d: Duration| now.checked_add(d).unwrap_or(now);
    let Some(b) = usual_break else {
        return (later(unused), Basis::Unused { unused });
    };
    let usual = b.duration();
    let periodic = if unused <= usual {
        (
            last_used.checked_add(usual).map_or(now, |at| at.max(now)),
            Basis::Due { usual },
        )
    } else if unused <= usual.saturating_mul(2) {
        (later(usual), Basis::Late { usual })
    } else {
        (later(unused), Basis::Unused { unused })
    };
    let random = randomness(b);
    if random == 0.0 {
        return periodic;
    }
    let from_now = |at: SystemTime| at.duration_since(now).unwrap_or_default().as_secs_f64();
    let periodic_in = from_now(periodic.0);
    let random_in = (usual.as_secs_f64() + unused.as_secs_f64()) / 2.0;
    // In whole seconds, as breaks are kept.
    let blended = Duration::try_from_secs_f64((periodic_in + random * (random_in - periodic_in)).round())
        .unwrap_or(Duration::MAX);
    let basis = if random >= 0.5 {
        Basis::Random { usual }
    } else {
        periodic.1
    };
    (later(blended), basis)
}
