//! What the configuration's unit tests share: a file written to a fresh
//! directory and loaded, the problems it gives, and the texts several
//! sections' tests read (every key in TOML and in YAML, a node's
//! KubeletConfiguration). Test code only; it checks nothing itself.

use std::time::Duration;

use super::{Config, ConfigError, Overrides, Problem, load};

/// Writes `text` to a file called `name` in a fresh directory and loads
/// it; returns the path as problems print it, and the result.
pub(super) fn load_named(name: &str, text: &str, overrides: &Overrides) -> (String, Result<Config, ConfigError>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    (path.display().to_string(), load(Some(&path), overrides))
}

pub(super) fn load_ok(name: &str, text: &str) -> Config {
    match load_named(name, text, &Overrides::default()) {
        (_, Ok(config)) => config,
        (_, Err(err)) => panic!("expected {name} to load, got:\n{err}"),
    }
}

pub(super) fn rejected(name: &str, text: &str) -> Vec<Problem> {
    match load_named(name, text, &Overrides::default()) {
        (_, Ok(config)) => panic!("expected {name} to be rejected, got {config:?}"),
        (_, Err(err)) => err.problems,
    }
}

/// The keys named by the problems of a file, in the order reported.
pub(super) fn problem_keys(name: &str, text: &str) -> Vec<String> {
    rejected(name, text).into_iter().map(|p| p.key).collect()
}

pub(super) fn without_source(mut config: Config) -> Config {
    config.source = None;
    config
}

pub(super) fn kubelet(body: &str) -> String {
    format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{body}")
}

pub(super) fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

pub(super) const EVERY_KEY_TOML: &str = r#"
[runtime]
endpoint = "unix:///run/crio/crio.sock"
timeout = "30s"

[gc]
interval = "10m"
usage_poll_interval = "1m"
high_threshold_percent = 70
low_threshold_percent = 50
min_age = "1h"
max_age = "14d"
dry_run = true
image_fs_path = "/var/lib/containers"
thrash_window = "2h"
order = "lru"
high_inodes_percent = 90
low_inodes_percent = 85

[protect]
images = ["registry.k8s.io/pause:*", "sha256:abc*"]
keep_recent_per_repository = 2

[state]
dir = "/run/imagegc"

[metrics]
listen = ":9200"
"#;

pub(super) const EVERY_KEY_YAML: &str = r#"
runtime:
  endpoint: unix:///run/crio/crio.sock
  timeout: 30s
gc:
  interval: 10m
  usage_poll_interval: 1m
  high_threshold_percent: 70
  low_threshold_percent: 50
  min_age: 1h
  max_age: 2w
  dry_run: true
  image_fs_path: /var/lib/containers
  thrash_window: 2h
  order: lru
  high_inodes_percent: 90
  low_inodes_percent: 85
protect:
  images: ["registry.k8s.io/pause:*", "sha256:abc*"]
  keep_recent_per_repository: 2
state:
  dir: /run/imagegc
metrics:
  listen: ":9200"
"#;

pub(super) const KUBELET_FILE: &str = r#"
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
cgroupDriver: systemd
clusterDNS:
- 10.96.0.10
containerRuntimeEndpoint: unix:///var/run/containerd/containerd.sock
evictionHard:
  memory.available: 100Mi
  nodefs.available: 10%
  imagefs.available: 10%
featureGates:
  ImageMaximumGCAge: true
imageGCHighThresholdPercent: 75
imageGCLowThresholdPercent: 60
imageMinimumGCAge: 5m0s
imageMaximumGCAge: 168h0m0s
maxPods: 110
rotateCertificates: true
staticPodPath: /etc/kubernetes/manifests
"#;
