//! What the engine reads of the configuration: the policy
//! ([`GcPolicy`]: thresholds, ages, order, keep rules) and the few
//! settings of how the collector runs, made once from a [`Config`] at start
//! and again at each reload. Nothing else in the engine reads the
//! configuration: a key the engine should follow is a field here.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, EvictionThreshold, KubeletView};
use crate::policy::GcPolicy;

/// The collector's settings (see the module docs).
#[derive(Debug, Clone)]
pub struct Settings {
    /// The policy the planner, the re-check and the space pass follow.
    pub policy: Arc<GcPolicy>,
    /// `gc.dry_run`: plan and report, remove nothing.
    pub dry_run: bool,
    /// `gc.interval`: from one cycle to the next.
    pub interval: Duration,
    /// `gc.usage_poll_interval`: how often images and containers are
    /// listed between cycles (and usage measured, at most every two
    /// seconds: see [`crate::policy::Schedule`]).
    pub usage_poll_interval: Duration,
    /// `gc.thrash_window`: how long an image removed for space is held
    /// back while images cannot bring usage to low.
    pub thrash_window: Duration,
    /// `runtime.timeout`: the longest a runtime call may take.
    pub runtime_timeout: Duration,
    /// `gc.image_fs_path`: the image filesystem, when not the runtime's.
    pub image_fs_path: Option<PathBuf>,
    /// `runtime.sandbox_image`: the sandbox image, when configured.
    pub sandbox_image: Option<String>,
    /// `evictionHard["imagefs.available"]` as read from the kubelet's
    /// configuration (checked against the measured capacity), when read.
    pub eviction_imagefs_available: Option<EvictionThreshold>,
    /// What the kubelet's configuration says (or what is assumed).
    pub kubelet: KubeletView,
}

impl Settings {
    /// These settings with the fixed `order` in force (see
    /// [`GcPolicy::fixed`]).
    pub fn with_fixed_order(&self, order: crate::config::Order) -> Settings {
        Settings {
            policy: Arc::new(self.policy.fixed(order)),
            ..self.clone()
        }
    }
}

impl From<&Config> for Settings {
    fn from(config: &Config) -> Self {
        Settings {
            policy: Arc::new(GcPolicy::from(config)),
            dry_run: config.gc.dry_run,
            interval: config.gc.interval,
            usage_poll_interval: config.gc.usage_poll_interval,
            thrash_window: config.gc.thrash_window,
            runtime_timeout: config.runtime.timeout,
            image_fs_path: config.gc.image_fs_path.clone(),
            sandbox_image: config.runtime.sandbox_image.clone(),
            eviction_imagefs_available: config.eviction_imagefs_available,
            kubelet: config.kubelet,
        }
    }
}
