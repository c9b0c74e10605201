//! The data every layer shares: what a runtime lists ([`Image`],
//! [`Container`], [`Snapshot`], and an image's tags and digests held once,
//! [`names::Names`]); why an image goes ([`Reason`]) and what one removal
//! was ([`Removal`], also what the journal records); and how images are
//! named ([`reference`]: references and the patterns of `protect.images`);
//! how a runtime speaks where the CRI leaves it open ([`Dialect`]).
//! Data only: no IO.

use std::time::SystemTime;

mod dialect;
mod image;
pub(crate) mod matching;
pub mod names;
pub(crate) mod reference;

pub use dialect::Dialect;
pub use image::{Container, ContainerState, Image, Snapshot};

/// Why an image is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Unused for longer than `gc.max_age`.
    Age,
    /// Usage reached the high threshold.
    Space,
}

impl Reason {
    /// The lowercase name used in logs, metric labels and JSON (`"age"`, `"space"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Age => "age",
            Reason::Space => "space",
        }
    }
}

/// One removal (or, in dry run, one removal that would have happened).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Removal {
    /// The image id, as the runtime lists it.
    pub id: String,
    /// The image's tags when it was removed.
    pub tags: Vec<String>,
    /// The image's repository digests when it was removed.
    pub digests: Vec<String>,
    /// Why it was removed: age or space.
    pub reason: Reason,
    /// Size the runtime reported.
    pub size: u64,
    /// Bytes the filesystem gained back, measured around the removal (None
    /// when the filesystem could not be measured, and in dry run).
    pub freed_bytes: Option<u64>,
    /// When imagegc first saw the image.
    #[serde(serialize_with = "crate::time::serialize")]
    pub first_seen: SystemTime,
    /// When a container was last seen using the image.
    #[serde(serialize_with = "crate::time::serialize")]
    pub last_used: SystemTime,
    /// True when nothing was removed: the cycle ran in dry run.
    pub dry_run: bool,
}
