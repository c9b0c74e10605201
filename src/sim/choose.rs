//! `gc.order = "auto"`: which order the node runs, measured rather than
//! guessed. Every [`EVERY`], the node's usage over the last [`WINDOW`] (the
//! usage log, or in `simulate` the trace up to now: only the past) is
//! replayed at the node's capacity and thresholds under each fixed order
//! ([`Order::FIXED`]), and the one that pulled least again runs until the
//! next judgement. The order in force changes only for one that pulled at
//! least [`MARGIN_PERCENT`] percent less again than it ([`choose`]), so
//! that two orders of about the same worth do not take turns.
//!
//! It is the idea of ARC, LeCaR and Cacheus (an adaptive choice among
//! experts, by their regret against the best of them), with the experts
//! replayed on the node's own usage instead of kept as ghost lists.
//!
//! The replay is bounded: a node whose window holds more than
//! [`MAX_IMAGES`] images replays a sample of them, by a hash of the
//! image id, on a disk scaled by the same rate (spatial sampling, as
//! SHARDS and miniature simulations do), so its cost does not grow with
//! the node.

use serde::{Deserialize, Serialize};

use crate::config::Order;
use crate::engine::Settings;

use super::replay::{Imagegc, Node, Policy, replay};
use super::trace::{Seconds, Trace, sampled};

/// How far back a judgement looks: a week, the period of weekly jobs and
/// of a working week's rhythm. (A month judged no better over the
/// simulated workloads, at four times the replay: BENCHMARKS.md.)
pub const WINDOW: Seconds = 7 * 24 * 3600;
/// How often the order is judged again.
pub const EVERY: Seconds = 24 * 3600;
/// The order in force gives way only to one that pulled at least this
/// much less again (percent).
pub const MARGIN_PERCENT: u64 = 5;
/// The most images a judgement replays; a node with more replays a sample.
pub const MAX_IMAGES: usize = 20_000;

/// What one order did over the window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    /// The order.
    #[serde(with = "order_name")]
    pub order: Order,
    /// Bytes it pulled again (scaled back when the replay was sampled).
    pub repulled_bytes: u64,
    /// Hours it spent at or above the high threshold.
    pub hours_above_high: f64,
}

/// A judgement: the order chosen and what each order did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Judgement {
    /// The order in force from this judgement on.
    #[serde(with = "order_name")]
    pub order: Order,
    /// Each fixed order's figures over the window, the kubelet's first.
    pub figures: Vec<Figure>,
    /// How long the window replayed was, in seconds (less than [`WINDOW`]
    /// on a node with less usage recorded).
    pub window_secs: u64,
    /// The share of the images replayed (1 unless sampled).
    pub sampled: f64,
}

impl Judgement {
    /// "reuse: 12 GB pulled again over the last 7d, against 15 GB for lru
    /// and 14 GB for superseded-first".
    pub fn describe(&self) -> String {
        let bytes = |order: Order| {
            self.figures
                .iter()
                .find(|f| f.order == order)
                .map(|f| crate::outputs::human_bytes(f.repulled_bytes))
        };
        let others: Vec<String> = self
            .figures
            .iter()
            .filter(|f| f.order != self.order)
            .map(|f| {
                format!(
                    "{} for {}",
                    crate::outputs::human_bytes(f.repulled_bytes),
                    f.order.as_str()
                )
            })
            .collect();
        let window = crate::time::short(std::time::Duration::from_secs(self.window_secs));
        match bytes(self.order) {
            Some(own) if others.is_empty() => {
                format!("{}: {own} pulled again over the last {window}", self.order.as_str())
            }
            Some(own) => format!(
                "{}: {own} pulled again over the last {window}, against {}",
                self.order.as_str(),
                others.join(" and ")
            ),
            None => self.order.as_str().to_string(),
        }
    }
}

/// Replays `trace` on a disk of `capacity` bytes, `other` of them not
/// images, under each fixed order with the thresholds and ages of
/// `settings`.
pub fn judge(trace: &Trace, capacity: u64, other: u64, settings: &Settings) -> Vec<Figure> {
    Order::FIXED
        .into_iter()
        .map(|order| {
            let settings = settings.with_fixed_order(order);
            let tally = replay(
                trace,
                capacity,
                other,
                &settings,
                &mut Imagegc::new(&settings, order.as_str(), trace),
            );
            Figure {
                order,
                repulled_bytes: tally.repulled_bytes,
                hours_above_high: tally.hours_above_high,
            }
        })
        .collect()
}

/// The order in force after a judgement whose figures are `figures`, when
/// `current` was: the one that pulled least again (fewer hours above high
/// on a tie, then the kubelet's first), if it pulled at least
/// [`MARGIN_PERCENT`] percent less than `current`; else `current`.
pub fn choose(current: Order, figures: &[Figure]) -> Order {
    let Some(best) = figures.iter().min_by(|a, b| {
        a.repulled_bytes
            .cmp(&b.repulled_bytes)
            .then(a.hours_above_high.total_cmp(&b.hours_above_high))
    }) else {
        return current;
    };
    let Some(now) = figures.iter().find(|f| f.order == current) else {
        return best.order;
    };
    let less =
        u128::from(best.repulled_bytes) * 100 < u128::from(now.repulled_bytes) * u128::from(100 - MARGIN_PERCENT);
    if less { best.order } else { current }
}

/// Judges the window of `trace` that ends at `to` and chooses, from
/// `current`: the whole of it when it holds at most [`MAX_IMAGES`]
/// images, else a sample at a disk scaled alike.
pub fn judge_window(
    trace: &Trace,
    to: Seconds,
    capacity: u64,
    other: u64,
    settings: &Settings,
    current: Order,
) -> Judgement {
    let from = to.saturating_sub(WINDOW);
    let window = trace.window(from, to, |_| true);
    if window.images.len() <= MAX_IMAGES {
        return judge_sampled(&window, to - from, capacity, other, settings, current, 1.0);
    }
    let rate = MAX_IMAGES as f64 / window.images.len() as f64;
    let sample = trace.window(from, to, |image| sampled(&image.id, rate));
    judge_sampled(&sample, to - from, capacity, other, settings, current, rate)
}

/// Judges the window of `trace` that ends at `to` (all of it, when it is
/// shorter than [`WINDOW`]), a sample of `rate` of a node's images (1: all
/// of them; see [`sampled`]), on a disk of `capacity` bytes, `other` of
/// them not images, and chooses from `current`.
pub fn judge_sampled(
    trace: &Trace,
    to: Seconds,
    capacity: u64,
    other: u64,
    settings: &Settings,
    current: Order,
    rate: f64,
) -> Judgement {
    let from = to.saturating_sub(WINDOW);
    let window;
    let trace = if from > 0 || to < trace.duration() {
        window = trace.window(from, to, |_| true);
        &window
    } else {
        trace
    };
    let scale = |bytes: u64| (bytes as f64 * rate) as u64;
    let mut figures = judge(trace, scale(capacity), scale(other), settings);
    if rate < 1.0 {
        for figure in &mut figures {
            figure.repulled_bytes = (figure.repulled_bytes as f64 / rate) as u64;
        }
    }
    Judgement {
        order: choose(current, &figures),
        figures,
        window_secs: to - from,
        sampled: rate,
    }
}

/// imagegc with `gc.order = "auto"` in a replay: an [`Imagegc`] whose
/// order is judged again every [`EVERY`] on the trace up to then (what
/// the daemon's usage log would hold: only the past), at the node's disk.
pub struct AutoReplay<'c> {
    imagegc: Imagegc<'c>,
    settings: &'c Settings,
    trace: &'c Trace,
    due: Seconds,
    /// The judgements made, with their times.
    pub judgements: Vec<(Seconds, Judgement)>,
}

impl<'c> AutoReplay<'c> {
    /// `auto` with `settings`, named `label` in reports, over `trace`.
    pub fn new(settings: &'c Settings, label: impl Into<String>, trace: &'c Trace) -> Self {
        AutoReplay {
            imagegc: Imagegc::new(settings, label, trace),
            settings,
            trace,
            due: EVERY,
            judgements: Vec::new(),
        }
    }
}

impl Policy for AutoReplay<'_> {
    fn name(&self) -> String {
        self.imagegc.name()
    }

    fn next_wake(&self) -> Seconds {
        self.imagegc.next_wake()
    }

    fn wake(&mut self, t: Seconds, node: &mut Node<'_>) {
        if t >= self.due {
            let (capacity, other) = node.disk();
            let judgement = judge_window(self.trace, t, capacity, other, self.settings, self.imagegc.order());
            self.imagegc.set_order(judgement.order);
            self.judgements.push((t, judgement));
            self.due = t + EVERY;
        }
        self.imagegc.wake(t, node);
    }

    fn coming(&mut self, t: Seconds, image: u32, node: &mut Node<'_>) {
        self.imagegc.coming(t, image, node);
    }

    fn used(&mut self, t: Seconds, image: u32, started: bool, node: &Node<'_>) {
        self.imagegc.used(t, image, started, node);
    }

    fn quiet_until(&self, node: &Node<'_>) -> Option<Seconds> {
        self.imagegc.quiet_until(node)
    }

    fn skip_to(&mut self, last_skipped: Seconds, to: Seconds, node: &Node<'_>) {
        self.imagegc.skip_to(last_skipped, to, node);
    }
}

/// An order as the configuration writes it.
mod order_name {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::config::Order;

    pub fn serialize<S: Serializer>(order: &Order, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(order.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Order, D::Error> {
        let text = String::deserialize(d)?;
        Order::parse(&text)
            .filter(|order| *order != Order::Auto)
            .ok_or_else(|| serde::de::Error::custom(format!("not an order: {text:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn figure(order: Order, repulled_bytes: u64) -> Figure {
        Figure {
            order,
            repulled_bytes,
            hours_above_high: 0.0,
        }
    }

    #[test]
    fn the_order_in_force_gives_way_only_to_one_that_pulled_clearly_less() {
        let (close, clearly) = (100 - MARGIN_PERCENT + 1, 100 - MARGIN_PERCENT - 1);
        let figures = [
            figure(Order::Lru, 100),
            figure(Order::SupersededFirst, close + 1),
            figure(Order::Reuse, close),
        ];
        // Less, but within the margin: no change.
        assert_eq!(choose(Order::Lru, &figures), Order::Lru);
        let figures = [figure(Order::Lru, 100), figure(Order::Reuse, clearly)];
        assert_eq!(choose(Order::Lru, &figures), Order::Reuse);
        assert_eq!(choose(Order::Reuse, &figures), Order::Reuse);
        // Nothing pulled again by any: stays.
        let none = [figure(Order::Lru, 0), figure(Order::Reuse, 0)];
        assert_eq!(choose(Order::Reuse, &none), Order::Reuse);
        // Nothing judged: stays.
        assert_eq!(choose(Order::SupersededFirst, &[]), Order::SupersededFirst);
    }

    #[test]
    fn a_judgement_sees_only_its_window() {
        use crate::sim::workload::Kind;
        let trace = Kind::Preview.generate(1, 10);
        let config = Config::default();
        let day = 24 * 3600;
        let settings = Settings::from(&config);
        let judgement = judge_window(&trace, 3 * day, 40_000_000_000, 0, &settings, Order::PRIOR);
        assert_eq!(judgement.window_secs, 3 * day, "less usage than a window: all of it");
        // Only images used by then are replayed: the same as the trace
        // cut there.
        let cut = Trace {
            events: trace.events.iter().copied().filter(|e| e.at < 3 * day).collect(),
            ..trace.clone()
        };
        assert_eq!(judge(&cut, 40_000_000_000, 0, &settings), judgement.figures);
        let later = judge_window(&trace, 10 * day, 40_000_000_000, 0, &settings, Order::PRIOR);
        assert_eq!(later.window_secs, WINDOW.min(10 * day));
        assert_eq!(later.sampled, 1.0);
    }

    #[test]
    fn auto_in_a_replay_judges_once_a_day_on_the_past_only() {
        use crate::sim::workload::Kind;
        let trace = Kind::Preview.generate(2, 3);
        let mut config = Config::default();
        config.gc.order = Order::Auto;
        let capacity = trace.unique_bytes() / 3;
        let settings = Settings::from(&config);
        let mut auto = AutoReplay::new(&settings, "auto", &trace);
        let tally = replay(&trace, capacity, capacity / 10, &settings, &mut auto);
        assert_eq!(tally.policy, "auto");
        let times: Vec<Seconds> = auto.judgements.iter().map(|(t, _)| *t).collect();
        assert_eq!(times.len(), 2, "{times:?}");
        assert!(times[0] >= EVERY && times[1] >= times[0] + EVERY, "{times:?}");
        for (t, judgement) in &auto.judgements {
            // The whole past, no more (shorter than a window).
            assert_eq!(judgement.window_secs, *t);
            assert_eq!(judgement.figures.len(), Order::FIXED.len());
        }
    }

    #[test]
    fn a_judgement_round_trips_as_json_and_refuses_auto_as_a_figure() {
        let judgement = Judgement {
            order: Order::Lru,
            figures: vec![figure(Order::Lru, 5), figure(Order::Reuse, 9)],
            window_secs: 7 * 24 * 3600,
            sampled: 1.0,
        };
        let text = serde_json::to_string(&judgement).unwrap();
        assert!(text.contains(r#""order":"lru""#), "{text}");
        assert_eq!(serde_json::from_str::<Judgement>(&text).unwrap(), judgement);
        assert!(serde_json::from_str::<Judgement>(&text.replacen("lru", "auto", 1)).is_err());
        assert!(
            judgement
                .describe()
                .starts_with("lru: 5 B pulled again over the last 7d, against 9 B for reuse"),
            "{}",
            judgement.describe()
        );
    }
}
