//! The orders of the space candidates, one per `gc.order` value, each in a
//! file of its own with its sort and what `plan` says of it. The planner
//! hands the chosen order its space candidates least recently used first
//! (then first seen, then id: the kubelet's order, deterministic).
//!
//! A new order is a file here, its line in [`of`], and its name in
//! [`crate::config::Order`].

use std::time::SystemTime;

use crate::config::Order;
use crate::model::Snapshot;
use crate::records::ImageFacts;

use super::candidate::Candidate;

mod lru;
mod reuse;
mod superseded_first;

pub use reuse::{Basis, expectation, expected_back};

/// What an order may read besides the candidates: the listing they come
/// from, what the records made of it, and the plan's `now`.
pub struct Context<'l> {
    /// The listing.
    pub snapshot: &'l Snapshot,
    /// What the records made of it, by place.
    pub listed: &'l ImageFacts,
    /// The plan's time.
    pub now: SystemTime,
}

/// An order of the space candidates.
pub trait SpaceOrder: Sync {
    /// Orders `space`, which comes least recently used first.
    fn sort(&self, space: &mut [Candidate<'_>], context: &Context<'_>);

    /// What it puts first, for a person (`plan`).
    fn explain(&self) -> &'static str;

    /// Whether it goes by when each candidate is expected back
    /// ([`Candidate::expected_back`]), which `plan` then shows.
    fn goes_by_expected_back(&self) -> bool {
        false
    }
}

/// The order `gc.order` names.
pub fn of(order: Order) -> &'static dyn SpaceOrder {
    match order {
        Order::Lru => &lru::Lru,
        Order::SupersededFirst => &superseded_first::SupersededFirst,
        Order::Reuse => &reuse::Reuse,
        // The policy resolves `auto` before it plans (`GcPolicy::order`).
        Order::Auto => of(Order::PRIOR),
    }
}
