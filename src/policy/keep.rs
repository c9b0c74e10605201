//! The keep rules: why an image stays. Every rule lives in
//! [`Rules::why_kept`], and nowhere else: the planner asks it of each image
//! of a listing, and the re-check right before a removal asks it again of
//! the one image as the runtime holds it then (its names, its pin, the
//! containers and pods that name it now). A new rule is a branch there, a
//! [`KeepReason`] variant (its label and what `plan` says of it, here
//! too), and its configuration key (read in `Rules::from`).
//!
//! Pure: no IO and no clock reads. The `protect.images` globs are compiled
//! once, when the rules are made from the configuration.

use std::time::{Duration, SystemTime};

use crate::config::Config;
use crate::model::Image;
use crate::model::Reason;
use crate::model::reference::ProtectPattern;
use crate::records::History;

/// Why an image is kept.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum KeepReason<'a> {
    /// Referenced by these containers (any state); with none, used at this
    /// very instant (the kubelet skips these too).
    InUse {
        /// The ids of the containers that name the image.
        containers: Vec<&'a str>,
    },
    /// Named by a pod bound to this node (see
    /// [`Protections`](super::Protections)), which will run it.
    Pod {
        /// The first such pod, `namespace/name`.
        pod: &'a str,
    },
    /// The runtime marks it pinned.
    Pinned,
    /// The runtime's sandbox (pause) image.
    Sandbox,
    /// Never used by any container while the runtime does not say which
    /// image is its sandbox image: it may be that image.
    SandboxUnknown,
    /// A container's mounted images could not be read (its
    /// `ContainerStatus` failed): it may mount this image.
    MountsUnknown,
    /// Matched by a `protect.images` pattern.
    Protected {
        /// The first `protect.images` pattern that matched, as configured.
        pattern: &'a str,
    },
    /// Among the newest `keep_recent_per_repository` of its repository.
    KeepRecent {
        /// The repository, as its tag names it (`docker.io/library/nginx`).
        repository: &'a str,
        /// Its place among that repository's images, newest first seen = 1.
        rank: u32,
    },
    /// First seen less than `gc.min_age` ago: not yet removable for space.
    TooYoung {
        /// How much longer until it is `gc.min_age` old.
        removable_after: Duration,
    },
}

impl KeepReason<'_> {
    /// A short label, for tables and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            KeepReason::InUse { .. } => "in-use",
            KeepReason::Pod { .. } => "pod",
            KeepReason::Pinned => "pinned",
            KeepReason::Sandbox => "sandbox",
            KeepReason::SandboxUnknown => "sandbox-unknown",
            KeepReason::MountsUnknown => "mounts-unknown",
            KeepReason::Protected { .. } => "protected",
            KeepReason::KeepRecent { .. } => "keep-recent",
            KeepReason::TooYoung { .. } => "too-young",
        }
    }

    /// True for the reasons that hold whatever the usage (everything but age).
    pub fn is_protection(&self) -> bool {
        !matches!(
            self,
            KeepReason::InUse { .. } | KeepReason::Pod { .. } | KeepReason::TooYoung { .. }
        )
    }

    /// Whether the reason keeps the image from a removal for `reason`: a
    /// space removal is held by every reason; a removal by age (unused for
    /// longer than `gc.max_age`) is not held by youth, nor by a use at
    /// this very instant, which only the space pass waits for.
    pub fn holds_against(&self, reason: Reason) -> bool {
        match self {
            KeepReason::TooYoung { .. } => reason == Reason::Space,
            KeepReason::InUse { containers } if containers.is_empty() => reason == Reason::Space,
            _ => true,
        }
    }
}

/// What `plan` says of the reason.
impl std::fmt::Display for KeepReason<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeepReason::InUse { containers } if containers.is_empty() => write!(f, "in use"),
            KeepReason::InUse { containers } => write!(f, "in use by {} container(s)", containers.len()),
            KeepReason::Pod { pod } => write!(f, "named by pod {pod}, bound to this node"),
            KeepReason::Pinned => write!(f, "pinned by the runtime"),
            KeepReason::Sandbox => write!(f, "the runtime's sandbox image"),
            KeepReason::SandboxUnknown => {
                write!(
                    f,
                    "never used, and the sandbox image is unknown (set runtime.sandbox_image)"
                )
            }
            KeepReason::MountsUnknown => write!(
                f,
                "a container's mounted images cannot be read (ContainerStatus fails): it may mount this one"
            ),
            KeepReason::Protected { pattern } => write!(f, "protected by {pattern:?}"),
            KeepReason::KeepRecent { repository, rank } => write!(f, "newest #{rank} of {repository}"),
            KeepReason::TooYoung { removable_after } => write!(
                f,
                "younger than min age (removable in {})",
                crate::time::short(*removable_after)
            ),
        }
    }
}

/// What a listing says of one image beyond its own names: who uses it, and
/// what the rest of the listing makes of it.
#[derive(Debug, Clone, Default)]
pub struct Uses<'a> {
    /// The ids of the containers (any state) that name the image.
    pub containers: Vec<&'a str>,
    /// A sandbox image's name names it.
    pub sandbox: bool,
    /// The runtime pins it (under any listing of its id).
    pub pinned: bool,
    /// Its repository and its place among the newest
    /// `protect.keep_recent_per_repository` of it, when among them.
    pub newest: Option<(&'a str, u32)>,
    /// Some container's mounted images could not be read.
    pub mounts_unknown: bool,
    /// The runtime does not say which image is its sandbox image.
    pub sandbox_unknown: bool,
}

/// The keep rules of a configuration, compiled once.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    /// `protect.images`, each as configured and compiled.
    protect: Vec<(String, ProtectPattern)>,
    /// `protect.keep_recent_per_repository`.
    keep_recent: u32,
    /// `gc.min_age`.
    min_age: Duration,
    /// A rule of a test's own, tried after every other protection (kept as
    /// [`KeepReason::Protected`] by the pattern `"test rule"`): what shows
    /// that a rule added here holds in the plan and at the re-check alike.
    #[cfg(test)]
    pub(crate) test_rule: Option<fn(&Image) -> bool>,
}

impl From<&Config> for Rules {
    /// The rules the configuration sets: `protect.*`, `gc.min_age`.
    fn from(config: &Config) -> Self {
        Rules::new(
            &config.protect.images,
            config.protect.keep_recent_per_repository,
            config.gc.min_age,
        )
    }
}

impl Rules {
    /// `gc.min_age`.
    pub fn min_age(&self) -> Duration {
        self.min_age
    }

    /// The rules of `protect.images`, `protect.keep_recent_per_repository`
    /// and `gc.min_age`.
    pub fn new(protect: &[String], keep_recent: u32, min_age: Duration) -> Self {
        Rules {
            protect: protect.iter().map(|p| (p.clone(), ProtectPattern::new(p))).collect(),
            keep_recent,
            min_age,
            #[cfg(test)]
            test_rule: None,
        }
    }

    /// `protect.keep_recent_per_repository`: how many of each repository's
    /// newest images stay (the planner ranks them over the listing).
    pub fn keep_recent(&self) -> u32 {
        self.keep_recent
    }

    /// Why `image` is kept at `now`, the first rule that holds in their
    /// order of precedence; `None` when it may be removed. `uses` is what
    /// the listing says of it, `history` its record's times (`None`: first
    /// seen now, the safe reading), `pod` the first pod bound to this node
    /// that names it. The reasons that hold only against a space removal
    /// come last (see [`KeepReason::holds_against`]).
    pub(crate) fn why_kept<'a>(
        &'a self,
        image: &Image,
        uses: Uses<'a>,
        history: Option<History>,
        pod: Option<&'a str>,
        now: SystemTime,
    ) -> Option<KeepReason<'a>> {
        if !uses.containers.is_empty() {
            return Some(KeepReason::InUse {
                containers: uses.containers,
            });
        }
        if let Some(pod) = pod {
            return Some(KeepReason::Pod { pod });
        }
        // Sandbox before pinned: runtimes pin their sandbox image, and
        // "sandbox" says more.
        if uses.sandbox {
            return Some(KeepReason::Sandbox);
        }
        if uses.pinned {
            return Some(KeepReason::Pinned);
        }
        if let Some(pattern) = self.protecting(image) {
            return Some(KeepReason::Protected { pattern });
        }
        if let Some((repository, rank)) = uses.newest {
            return Some(KeepReason::KeepRecent { repository, rank });
        }
        if uses.sandbox_unknown && !history.is_some_and(|h| h.ever_used) {
            return Some(KeepReason::SandboxUnknown);
        }
        // Any image may be what a container whose mounts are unknown
        // mounts: when in doubt, keep.
        if uses.mounts_unknown {
            return Some(KeepReason::MountsUnknown);
        }
        #[cfg(test)]
        if self.test_rule.is_some_and(|rule| rule(image)) {
            return Some(KeepReason::Protected { pattern: "test rule" });
        }
        // Against a space removal only.
        let (first_seen, last_used) = history.map_or((now, now), |h| (h.first_seen, h.last_used));
        let age = elapsed(first_seen, now);
        if age < self.min_age {
            return Some(KeepReason::TooYoung {
                removable_after: self.min_age - age,
            });
        }
        if last_used >= now {
            return Some(KeepReason::InUse { containers: Vec::new() });
        }
        None
    }

    /// The first `protect.images` pattern that matches the image, as
    /// configured.
    fn protecting(&self, image: &Image) -> Option<&str> {
        self.protect
            .iter()
            .find(|(_, glob)| glob.matches_image(&image.id, &image.repo_tags, &image.repo_digests))
            .map(|(pattern, _)| pattern.as_str())
    }
}

/// Time from `earlier` to `later`; zero when the clock says `earlier` is in
/// the future.
pub(crate) fn elapsed(earlier: SystemTime, later: SystemTime) -> Duration {
    later.duration_since(earlier).unwrap_or(Duration::ZERO)
}
