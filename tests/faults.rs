//! imagegc under faults and bad input. Each test injects one fault and checks
//! what a user would check: nothing wrong removed, nothing lost.
//!
//! - [`hung`]: a runtime that stops answering, call by call;
//! - [`removals`]: removals the runtime refuses;
//! - [`odd_data`]: duplicate, dangling, moved, unknown and absurd runtime data.

#[path = "faults/hung.rs"]
mod hung;
#[path = "faults/odd_data.rs"]
mod odd_data;
#[path = "faults/removals.rs"]
mod removals;
#[path = "faults/support.rs"]
mod support;
