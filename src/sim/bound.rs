//! The offline bound: the fewest bytes any policy, even one that knows the
//! future, must pull again on a trace at a given budget of image bytes.
//!
//! Exact minimisation with variable sizes is NP-hard. This is PFOO-L, the
//! practical lower bound of Berger, Beckmann and Harchol-Balter ("Practical
//! Bounds on Optimal Caching with Variable Object Sizes", SIGMETRICS 2018),
//! for byte misses, at layer granularity (an image needed = every one of
//! its layers needed; WORKLOADS.md §6):
//!
//! - A layer must be on disk while any container uses an image holding it
//!   (its *use intervals*); between two of them (a *gap*), a policy either
//!   keeps it the whole gap, which costs its size times the gap's length in
//!   byte-seconds of disk, or pulls it again, which costs its size in bytes.
//!   Keeping it part of the gap saves nothing.
//! - PFOO-L relaxes the budget from "at every instant" to "on average over
//!   the trace": the byte-seconds of every use interval and every kept gap
//!   may add up to at most `budget × duration`. Under that one constraint
//!   the cheapest choice is greedy: gaps by byte-seconds per byte saved,
//!   that is by length, shortest first, the last one kept fractionally.
//! - Averaged over the whole trace, the budget lends a policy the room an
//!   empty disk has at the start. So the same relaxation is also solved
//!   with the budget held on average over each window of 6 hours and of a
//!   day (each gap's part in a window kept or not on its own, saving its
//!   bytes in proportion: a further relaxation, so still a lower bound),
//!   and the bound is the largest of the three.
//!
//! Any policy whose images' bytes on disk stay within the budget at every
//! instant pays at least this; with the whole trace's window alone, so does
//! any policy within it *averaged over time* (its use intervals and kept gaps
//! fit the relaxed constraint), so the figure is a true lower bound for it
//! whatever it does between cycles; the replay's `mean_image_bytes` says
//! whether a policy stayed within it. First pulls are paid by every policy
//! and are not counted.

use std::collections::HashMap;

use super::trace::{Action, Seconds, Trace};

/// The bound on one trace at one budget.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Bound {
    /// The image bytes allowed on disk, on average over the trace.
    pub budget_bytes: u64,
    /// The fewest bytes any policy within the budget pulls again (rounded up).
    pub repulled_bytes: u64,
    /// Gaps between uses of a layer, in all.
    pub gaps: usize,
    /// The window over which the budget was held on average to give this
    /// bound (the largest of the windows tried; the whole trace is PFOO-L
    /// itself).
    pub window_seconds: Seconds,
}

/// The bound on `trace` with `budget` image bytes at every instant: the
/// largest of PFOO-L over the whole trace and over windows of 6 hours and
/// a day (see the module docs).
pub fn pfoo_l(trace: &Trace, budget: u64) -> Bound {
    bound(trace, budget, &WINDOWS)
}

/// PFOO-L over the whole trace alone: a bound for any policy whose image
/// bytes stay within `budget` on average over the trace.
pub fn pfoo_l_averaged(trace: &Trace, budget: u64) -> Bound {
    bound(trace, budget, &[])
}

fn bound(trace: &Trace, budget: u64, windows: &[Seconds]) -> Bound {
    let end = trace.duration();
    // Use intervals of each image, from its containers.
    let mut open: HashMap<u64, (u32, Seconds)> = HashMap::new();
    let mut uses: Vec<Vec<(Seconds, Seconds)>> = vec![Vec::new(); trace.layers.len()];
    let close = |image: u32, from: Seconds, to: Seconds, uses: &mut Vec<Vec<(Seconds, Seconds)>>| {
        for &layer in &trace.images[image as usize].layers {
            uses[layer as usize].push((from, to));
        }
    };
    for event in &trace.events {
        match event.action {
            Action::Start { container, image } => {
                open.insert(container, (image, event.at));
            }
            Action::Stop { container } => {
                if let Some((image, from)) = open.remove(&container) {
                    close(image, from, event.at, &mut uses);
                }
            }
        }
    }
    for (image, from) in open.into_values() {
        close(image, from, end, &mut uses);
    }
    // Use intervals merged per layer, and the gaps between them:
    // (from, to, bytes).
    let mut used: Vec<(Seconds, Seconds, u64)> = Vec::new();
    let mut gaps: Vec<(Seconds, Seconds, u64)> = Vec::new();
    for (layer, intervals) in uses.iter_mut().enumerate() {
        if intervals.is_empty() {
            continue;
        }
        let bytes = trace.layers[layer];
        intervals.sort_unstable();
        let (mut from, mut to) = intervals[0];
        for &(start, stop) in &intervals[1..] {
            if start <= to {
                to = to.max(stop);
                continue;
            }
            used.push((from, to, bytes));
            gaps.push((to, start, bytes));
            (from, to) = (start, stop);
        }
        used.push((from, to, bytes));
    }
    let all: u128 = gaps.iter().map(|&(_, _, bytes)| u128::from(bytes)).sum();
    // PFOO-L over the whole trace, and over each window of a few lengths:
    // each is a lower bound, so the largest is.
    let mut best = Bound {
        budget_bytes: budget,
        repulled_bytes: 0,
        gaps: gaps.len(),
        window_seconds: end,
    };
    for window in windows
        .iter()
        .copied()
        .filter(|&w| w > 0 && w < end && end.div_ceil(w) <= MAX_WINDOWS)
        .chain([end.max(1)])
    {
        let saved = saved_in_windows(&used, &gaps, budget, end, window);
        // Rounded down: a lower bound stays one.
        let repulled = u64::try_from(all.saturating_sub(saved.ceil() as u128)).unwrap_or(u64::MAX);
        if repulled > best.repulled_bytes {
            best.repulled_bytes = repulled;
            best.window_seconds = window;
        }
    }
    best
}

/// The window lengths, besides the whole trace, over which the budget is
/// held on average: 6 hours and a day.
const WINDOWS: [Seconds; 2] = [6 * 3600, 24 * 3600];

/// The most windows of one length a bound is computed over: a trace longer
/// than this many windows (68 years of 6 hours) is bounded over its longer
/// windows and the whole trace only, which are lower bounds still; its
/// gaps would otherwise cost memory and time in proportion to their length.
const MAX_WINDOWS: u64 = 100_000;

/// What keeping gaps can save, at most, when the budget is held on
/// average over each window of `window` seconds. Each gap's part in a
/// window is kept or not on its own (a further relaxation), saving the
/// gap's bytes in proportion to that part's length: in each window the
/// best choice is then greedy, shortest gaps first (they save the most
/// per byte-second).
fn saved_in_windows(
    used: &[(Seconds, Seconds, u64)],
    gaps: &[(Seconds, Seconds, u64)],
    budget: u64,
    end: Seconds,
    window: Seconds,
) -> f64 {
    let windows = end.div_ceil(window).max(1) as usize;
    let overlap = |from: Seconds, to: Seconds, w: usize| {
        let start = w as Seconds * window;
        to.min(start + window).saturating_sub(from.max(start))
    };
    let mut room: Vec<u128> = (0..windows)
        .map(|w| {
            let start = w as Seconds * window;
            u128::from(budget) * u128::from(end.min(start + window) - start)
        })
        .collect();
    let spanned = |from: Seconds, to: Seconds| {
        let first = (from / window) as usize;
        (
            first,
            ((to / window) as usize).min(windows - 1) + 1 - first.min(windows),
        )
    };
    for &(from, to, bytes) in used {
        let (first, count) = spanned(from, to);
        for (w, room) in room.iter_mut().enumerate().skip(first).take(count) {
            *room = room.saturating_sub(u128::from(bytes) * u128::from(overlap(from, to, w)));
        }
    }
    // Pieces per window: (gap length, bytes, part of the gap in the window).
    let mut pieces: Vec<Vec<(Seconds, u64, Seconds)>> = vec![Vec::new(); windows];
    let mut saved = 0.0;
    for &(from, to, bytes) in gaps {
        let length = to - from;
        if length == 0 {
            saved += bytes as f64;
            continue;
        }
        let (first, count) = spanned(from, to);
        for (w, pieces) in pieces.iter_mut().enumerate().skip(first).take(count) {
            let part = overlap(from, to, w);
            if part > 0 {
                pieces.push((length, bytes, part));
            }
        }
    }
    for (w, mut pieces) in pieces.into_iter().enumerate() {
        pieces.sort_unstable_by_key(|&(length, bytes, _)| (length, std::cmp::Reverse(bytes)));
        let mut room = room[w];
        for (length, bytes, part) in pieces {
            if room == 0 {
                break;
            }
            let cost = u128::from(bytes) * u128::from(part);
            let kept = if cost <= room { 1.0 } else { room as f64 / cost as f64 };
            room = room.saturating_sub(cost);
            saved += kept * bytes as f64 * part as f64 / length as f64;
        }
    }
    saved
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::engine::Settings;
    use crate::sim::replay::{Imagegc, Kubelet, replay};
    use crate::sim::trace::{TraceEvent, TraceImage};
    use crate::sim::workload::Kind;

    fn one_layer_images(sizes: &[u64], events: &[(Seconds, Action)]) -> Trace {
        Trace {
            layers: sizes.to_vec(),
            images: (0..sizes.len())
                .map(|i| TraceImage {
                    id: format!("i{i}"),
                    name: format!("i{i}"),
                    layers: vec![i as u32],
                })
                .collect(),
            events: events.iter().map(|&(at, action)| TraceEvent { at, action }).collect(),
            capacity: None,
        }
    }

    #[test]
    fn the_bound_keeps_the_shortest_gaps_within_the_budget() {
        // Image 0 (10 bytes) used at [0,10] and [20,30]: a gap of 10.
        // Image 1 (10 bytes) used at [0,10] and [90,100]: a gap of 80.
        use Action::{Start, Stop};
        let events = [
            (0, Start { container: 1, image: 0 }),
            (0, Start { container: 2, image: 1 }),
            (10, Stop { container: 1 }),
            (10, Stop { container: 2 }),
            (20, Start { container: 3, image: 0 }),
            (30, Stop { container: 3 }),
            (90, Start { container: 4, image: 1 }),
            (100, Stop { container: 4 }),
        ];
        let trace = one_layer_images(&[10, 10], &events);
        // Mandatory: 10*10 + 10*10 + 10*10 + 10*10 = 400 byte-seconds.
        // Budget 5 over 100 s = 500: room 100 = gap 0 (10*10) exactly.
        let bound = pfoo_l(&trace, 5);
        assert_eq!((bound.repulled_bytes, bound.gaps), (10, 2));
        // Budget 20: room 1600 >= 100 + 800: nothing pulled again.
        assert_eq!(pfoo_l(&trace, 20).repulled_bytes, 0);
        // Budget 4: no room at all.
        assert_eq!(pfoo_l(&trace, 4).repulled_bytes, 20);
        // Budget 9: room 500 keeps gap 0 and 400 of gap 1's 800: half of it.
        assert_eq!(pfoo_l(&trace, 9).repulled_bytes, 5);
    }

    #[test]
    fn a_trace_spanning_ages_is_bounded_without_a_window_per_six_hours() {
        // A container running 10^15 s, another image used at each end.
        use Action::{Start, Stop};
        const AGES: Seconds = 1_000_000_000_000_000;
        let events = [
            (0, Start { container: 1, image: 0 }),
            (0, Start { container: 2, image: 1 }),
            (1, Stop { container: 2 }),
            (AGES, Start { container: 3, image: 1 }),
            (AGES, Stop { container: 1 }),
        ];
        let trace = one_layer_images(&[10, 10], &events);
        let bound = pfoo_l(&trace, 15);
        assert_eq!(bound.window_seconds, AGES, "the whole trace only");
        assert_eq!(bound.gaps, 1);
        assert_eq!(bound.repulled_bytes, 5, "half the gap fits in the budget's room");
    }

    #[test]
    fn no_policy_within_the_budget_pulls_again_less_than_the_bound() {
        let mut config = Config::default();
        config.gc.high_threshold_percent = 85;
        config.gc.low_threshold_percent = 80;
        for kind in Kind::ALL {
            let trace = kind.generate(11, 10);
            let capacity = trace.unique_bytes() / 3;
            let other = capacity / 10;
            let settings = Settings::from(&config);
            let mut imagegc = Imagegc::new(&settings, "imagegc", &trace);
            let mut kubelet = Kubelet::new(&settings);
            for tally in [
                replay(&trace, capacity, other, &settings, &mut imagegc),
                replay(&trace, capacity, other, &settings, &mut kubelet),
            ] {
                // Within its own average, and within its own peak at every instant.
                let averaged = pfoo_l_averaged(&trace, tally.mean_image_bytes);
                let windowed = pfoo_l(&trace, tally.peak_image_bytes);
                assert!(tally.repulled_bytes > 0, "{kind:?}: pressure");
                for bound in [averaged, windowed] {
                    assert!(
                        bound.repulled_bytes <= tally.repulled_bytes,
                        "{kind:?} {}: bound {bound:?} above the policy's {}",
                        tally.policy,
                        tally.repulled_bytes
                    );
                }
            }
        }
    }

    #[test]
    fn holding_the_budget_per_window_bounds_tighter_when_the_disk_starts_empty() {
        // Image 0 (10 bytes) used for the first second, then again at 100
        // for a second; image 1 (10 bytes) in use from 50 to 101; image 2
        // (1 byte) at 1000. With a budget of 10, nobody can keep image 0
        // through 50..100; averaged over the trace, the idle end lends room.
        use Action::{Start, Stop};
        let events = [
            (0, Start { container: 1, image: 0 }),
            (1, Stop { container: 1 }),
            (50, Start { container: 2, image: 1 }),
            (100, Start { container: 3, image: 0 }),
            (101, Stop { container: 3 }),
            (101, Stop { container: 2 }),
            (1000, Start { container: 4, image: 2 }),
            (1001, Stop { container: 4 }),
        ];
        let trace = one_layer_images(&[10, 10, 1], &events);
        assert_eq!(pfoo_l_averaged(&trace, 10).repulled_bytes, 0);
        let windowed = bound(&trace, 10, &[25]);
        assert!(windowed.repulled_bytes >= 5, "{windowed:?}");
        assert_eq!(windowed.window_seconds, 25);
    }
}
