//! A space or age candidate of a cycle ([`Candidate`]): what the planner
//! hands the orders (`super::order`, which also says when each is
//! expected back) and the space pass.

use std::time::SystemTime;

use crate::model::Reason;
use crate::model::names::Names;
use crate::records::Break;

/// An image the cycle may remove. Borrowed from the snapshot: planning
/// copies no names.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Candidate<'a> {
    /// The image id, as the runtime lists it; what `RemoveImage` is called with.
    pub id: &'a str,
    /// The image's tags, as the runtime lists them (may be empty: a dangling image).
    pub tags: &'a Names,
    /// The image's repository digests, as the runtime lists them.
    pub digests: &'a Names,
    /// The size the runtime reports, in bytes (shared layers count in every
    /// image, so sizes overstate what a removal frees).
    pub size: u64,
    /// When imagegc first saw the image (from its records).
    #[serde(serialize_with = "crate::time::serialize")]
    pub first_seen: SystemTime,
    /// When a container last used the image, as far as imagegc saw; the first
    /// sight when none ever did.
    #[serde(serialize_with = "crate::time::serialize")]
    pub last_used: SystemTime,
    /// Why it may be removed: age or space.
    pub reason: Reason,
    /// The image's usual break between uses and its spread, when one is
    /// known: what [`Candidate::expected_back`] goes by (eight bytes).
    #[serde(skip)]
    pub usual_break: Option<Break>,
}
