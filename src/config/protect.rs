//! `[protect]`: images that are never removed, whatever their age or the
//! disk usage. Everything about the section is here: its keys as read, as
//! validated, their checks, and how the effective configuration prints
//! them; the rules they feed are `policy::keep`'s. Every key applies live
//! (read again at each cycle's plan), so a reload needs no list of them.
//!
//! A new protection with a key of its own touches this file and
//! `policy/keep.rs`.

use serde::Deserialize;

use super::scalar::RawInt;
use super::{Problems, toml_string};

/// `[protect]`, validated.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ProtectConfig {
    /// Glob patterns on tags, digests or ids; matches are never removed.
    pub images: Vec<String>,
    /// Keep the newest N images of each repository; 0 is off.
    pub keep_recent_per_repository: u32,
}

/// `[protect]` as read.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProtect {
    images: Option<Vec<String>>,
    keep_recent_per_repository: Option<RawInt>,
}

impl ProtectConfig {
    /// Validates the section: no blank pattern; a pattern that can match no
    /// image is allowed but warned about.
    pub(super) fn validate(raw: RawProtect, warnings: &mut Vec<String>, problems: &mut Problems) -> Self {
        let mut protect = ProtectConfig::default();
        let images = raw.images.unwrap_or_default();
        for (index, image) in images.iter().enumerate() {
            if image.trim().is_empty() {
                problems.push(format!("protect.images[{index}]"), "must not be empty");
            } else if let Some(problem) = crate::model::reference::ProtectPattern::problem(image) {
                warnings.push(format!("protect.images[{index}] {image:?}: {problem}"));
            }
        }
        protect.images = images;
        if let Some(RawInt(keep)) = raw.keep_recent_per_repository {
            const KEY: &str = "protect.keep_recent_per_repository";
            match u32::try_from(keep) {
                Ok(keep) => protect.keep_recent_per_repository = keep,
                Err(_) if keep < 0 => problems.push(KEY, format!("must not be negative, got {keep}")),
                Err(_) => problems.push(KEY, format!("must be at most {}, got {keep}", u32::MAX)),
            }
        }
        protect
    }

    /// The section in imagegc's TOML schema, every key written.
    pub(super) fn to_toml(&self) -> String {
        let images: Vec<String> = self.images.iter().map(|image| toml_string(image)).collect();
        format!(
            "[protect]\nimages = [{images}]\nkeep_recent_per_repository = {keep_recent}\n",
            images = images.join(", "),
            keep_recent = self.keep_recent_per_repository,
        )
    }
}
