//! What becomes of what imagegc does, one output to a file: each turns
//! the facts it cares about into its own form.
//!
//! - `cri_calls`: every call to the runtime, counted and timed
//!   ([`CriCallMetrics`], the CRI client's [`crate::cri::CallObserver`]).

mod cri_calls;

pub use cri_calls::CriCallMetrics;
