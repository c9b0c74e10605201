//! One trace at one disk size, under every policy side by side: imagegc
//! with the configuration given, the kubelet's algorithm, and the offline
//! bound at the same budget.

use crate::config::Order;
use crate::engine::Settings;

use super::bound::{Bound, pfoo_l};
use super::choose::AutoReplay;
use super::replay::{Belady, Imagegc, Kubelet, Policy, Tally, replay};
use super::trace::Trace;

/// The comparison on one trace at one disk size.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Comparison {
    /// The disk's capacity, in bytes.
    pub capacity_bytes: u64,
    /// Bytes of the disk taken by other data than images.
    pub other_bytes: u64,
    /// The image bytes the high threshold leaves: the bound's budget.
    pub budget_bytes: u64,
    /// Every layer the trace uses, once.
    pub unique_bytes: u64,
    /// imagegc as configured, imagegc with each other `gc.order`, the
    /// kubelet, and the offline policy that knows the future.
    pub policies: Vec<Tally>,
    /// The offline lower bound at `budget_bytes` (PFOO-L, layer granularity).
    pub bound: Bound,
}

impl Comparison {
    /// Replays `trace` on a disk of `capacity` bytes, `other` of them not
    /// images, under imagegc (`settings`) and the kubelet (their
    /// thresholds and minimum age), and bounds it.
    pub fn run(trace: &Trace, capacity: u64, other: u64, settings: &Settings) -> Self {
        let policy = &settings.policy;
        let high_line = (u128::from(capacity) * u128::from(policy.target.high_percent()) / 100) as u64;
        let budget = high_line.saturating_sub(other);
        // `auto` judges its order on the past of the trace as it goes.
        let mut imagegc: Box<dyn Policy> = if policy.auto {
            Box::new(AutoReplay::new(settings, "imagegc", trace))
        } else {
            Box::new(Imagegc::new(settings, "imagegc", trace))
        };
        // The other fixed orders, side by side (`auto`, which replays the
        // past under each of them every simulated day, only when asked).
        let others: Vec<(Order, Settings)> = Order::FIXED
            .into_iter()
            .filter(|&order| policy.auto || order != policy.order)
            .map(|order| (order, settings.with_fixed_order(order)))
            .collect();
        let mut kubelet = Kubelet::new(settings);
        let mut offline = Belady::new(settings, trace);
        Comparison {
            capacity_bytes: capacity,
            other_bytes: other,
            budget_bytes: budget,
            unique_bytes: trace.unique_bytes(),
            policies: std::iter::once(replay(trace, capacity, other, settings, imagegc.as_mut()))
                .chain(others.iter().map(|(order, with)| {
                    let label = format!("imagegc {}", order.as_str());
                    replay(trace, capacity, other, with, &mut Imagegc::new(with, label, trace))
                }))
                .chain([
                    replay(trace, capacity, other, settings, &mut kubelet),
                    replay(trace, capacity, other, settings, &mut offline),
                ])
                .collect(),
            bound: pfoo_l(trace, budget),
        }
    }
}

/// The two disks a workload is compared on when none is given: the room
/// for images under the high threshold (less `other_percent` of the disk)
/// holds the peak of bytes in use plus 15%, then 35%, of every other byte
/// the trace ever pulls. Rounded up to a whole GB. A disk sized from the
/// trace, not fixed per workload, puts every seed under comparable pressure.
pub fn reference_disks(trace: &Trace, settings: &Settings, other_percent: u8) -> [u64; 2] {
    let peak = trace.peak_in_use_bytes();
    let rest = trace.unique_bytes().saturating_sub(peak);
    let high = settings.policy.target.high_percent();
    let share = u64::from(high.saturating_sub(other_percent).max(1));
    [15u64, 35].map(|percent| {
        let budget = u128::from(peak) + u128::from(rest) * u128::from(percent) / 100;
        let capacity = (budget * 100).div_ceil(u128::from(share));
        let gb = 1_000_000_000u128;
        u64::try_from(capacity.div_ceil(gb) * gb).unwrap_or(u64::MAX)
    })
}

/// `value` against `bound` in percent more (0 when both are 0; `None` when
/// only the bound is 0).
pub fn over_bound(value: u64, bound: u64) -> Option<f64> {
    match (value, bound) {
        (0, 0) => Some(0.0),
        (_, 0) => None,
        _ => Some((value as f64 - bound as f64) * 100.0 / bound as f64),
    }
}
