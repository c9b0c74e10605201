//! The policy, pure (no IO, no clock reads): [`mod@plan`] says which images a
//! cycle may remove, in which order, and why every other image is kept;
//! [`space`] says when a space pass is due and done, and walks the space
//! candidates ([`Walk`]) for the cycle, the dry run and `plan` alike.
//!
//! A new keep rule goes in [`plan::plan_listed`] (with its
//! [`KeepReason`]); one that comes from outside the runtime's listing (the
//! pods bound to the node) comes in through [`Protections`].

pub mod plan;
pub mod space;

pub use plan::{
    Candidate, KeepReason, Kept, KeptTally, Plan, Protections, Reason, plan, plan_counting_kept, plan_listed,
    protecting_pattern,
};
pub use space::{
    DiskFootprint, Forecast, ImageBytes, ImageBytesSource, SpaceOutlook, SpaceTarget, Step, Walk, total_size,
};
