//! `gc.order = "lru"`: the kubelet's order, least recently used first,
//! ties by first seen.

use super::{Context, SpaceOrder};
use crate::policy::candidate::Candidate;

/// Least recently used first: the order the candidates come in.
pub struct Lru;

impl SpaceOrder for Lru {
    fn sort(&self, _space: &mut [Candidate<'_>], _context: &Context<'_>) {}

    fn explain(&self) -> &'static str {
        "least recently used first"
    }
}
