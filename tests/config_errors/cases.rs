//! Malformed configuration files, each with the one problem it must produce:
//! the text that follows `FILE: ` on the problem's line (the key as the user
//! wrote it, or where the file is broken). Shared by the tests of
//! `config::load` and the `check-config` integration test.

use std::path::{Path, PathBuf};

/// What is at the configuration path.
pub enum Fixture {
    Text(&'static str),
    Bytes(&'static [u8]),
    /// Text made when the case runs (too large to write out).
    Generated(fn() -> String),
    /// Nothing: the file does not exist.
    Missing,
    /// A directory where the file should be.
    Directory,
}

pub struct Case {
    /// Unique; also the file's name.
    pub name: &'static str,
    pub extension: &'static str,
    pub fixture: Fixture,
    /// The problem's line must start with `FILE: named`.
    pub named: &'static str,
}

impl Case {
    /// Puts the fixture in `dir` and returns the path to hand to `--config`.
    pub fn create_in(&self, dir: &Path) -> PathBuf {
        let path = dir.join(format!("{}.{}", self.name, self.extension));
        match self.fixture {
            Fixture::Text(text) => std::fs::write(&path, text).unwrap(),
            Fixture::Bytes(bytes) => std::fs::write(&path, bytes).unwrap(),
            Fixture::Generated(make) => std::fs::write(&path, make()).unwrap(),
            Fixture::Missing => {}
            Fixture::Directory => std::fs::create_dir(&path).unwrap(),
        }
        path
    }

    /// The start of the line that must report the problem.
    pub fn expected_line_start(&self, path: &Path) -> String {
        format!("{}: {}", path.display(), self.named)
    }
}

const fn toml(name: &'static str, text: &'static str, named: &'static str) -> Case {
    Case {
        name,
        extension: "toml",
        fixture: Fixture::Text(text),
        named,
    }
}

const fn yaml(name: &'static str, text: &'static str, named: &'static str) -> Case {
    Case {
        name,
        extension: "yaml",
        fixture: Fixture::Text(text),
        named,
    }
}

/// A KubeletConfiguration holding `body` after its header.
macro_rules! kubelet {
    ($body:literal) => {
        concat!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n",
            $body
        )
    };
}

pub const CASES: &[Case] = &[
    // TOML syntax.
    toml(
        "toml-unclosed-header",
        "[gc\nhigh_threshold_percent = 90\n",
        "line 1, column",
    ),
    toml(
        "toml-double-equals",
        "[gc]\nhigh_threshold_percent = = 90\n",
        "line 2, column",
    ),
    toml(
        "toml-duplicate-key",
        "[gc]\ndry_run = true\ndry_run = false\n",
        "line 3, column",
    ),
    // Unknown keys at each level.
    toml("unknown-section", "[garbage]\ncollect = true\n", "garbage: unknown key"),
    toml(
        "unknown-gc-key",
        "[gc]\nhihg_threshold_percent = 90\n",
        "gc.hihg_threshold_percent: unknown key",
    ),
    toml(
        "unknown-runtime-key",
        "[runtime]\nendpiont = \"unix:///run/containerd/containerd.sock\"\n",
        "runtime.endpiont: unknown key",
    ),
    toml(
        "unknown-protect-key",
        "[protect]\nimage = [\"registry.k8s.io/pause:*\"]\n",
        "protect.image: unknown key",
    ),
    toml(
        "unknown-state-key",
        "[state]\ndirectory = \"/var/lib/imagegc\"\n",
        "state.directory: unknown key",
    ),
    toml(
        "unknown-metrics-key",
        "[metrics]\nport = 9105\n",
        "metrics.port: unknown key",
    ),
    toml("section-not-a-table", "gc = 5\n", "gc: must be a table"),
    // Wrong types.
    toml(
        "percent-as-string",
        "[gc]\nhigh_threshold_percent = \"85\"\n",
        "gc.high_threshold_percent: invalid type",
    ),
    toml(
        "percent-empty-string",
        "[gc]\nlow_threshold_percent = \"\"\n",
        "gc.low_threshold_percent: invalid type",
    ),
    toml(
        "percent-float",
        "[gc]\nhigh_threshold_percent = 85.5\n",
        "gc.high_threshold_percent: invalid type",
    ),
    toml(
        "dry-run-string",
        "[gc]\ndry_run = \"yes\"\n",
        "gc.dry_run: invalid type",
    ),
    toml(
        "headroom-string",
        "[gc]\nheadroom = \"off\"\n",
        "gc.headroom: invalid type",
    ),
    toml(
        "images-not-a-list",
        "[protect]\nimages = \"nginx:*\"\n",
        "protect.images: invalid type",
    ),
    toml(
        "endpoint-number",
        "[runtime]\nendpoint = 1\n",
        "runtime.endpoint: invalid type",
    ),
    // Out of range.
    toml(
        "high-above-100",
        "[gc]\nhigh_threshold_percent = 101\n",
        "gc.high_threshold_percent: must be within 0..=100",
    ),
    toml(
        "high-negative",
        "[gc]\nhigh_threshold_percent = -1\n",
        "gc.high_threshold_percent: must be within 0..=100",
    ),
    toml(
        "low-above-100",
        "[gc]\nlow_threshold_percent = 101\n",
        "gc.low_threshold_percent: must be within 0..=100",
    ),
    toml(
        "low-negative",
        "[gc]\nlow_threshold_percent = -1\n",
        "gc.low_threshold_percent: must be within 0..=100",
    ),
    toml(
        "low-above-high",
        "[gc]\nhigh_threshold_percent = 85\nlow_threshold_percent = 90\n",
        "gc.low_threshold_percent: 90 must be less than",
    ),
    toml(
        "low-equals-high",
        "[gc]\nhigh_threshold_percent = 70\nlow_threshold_percent = 70\n",
        "gc.low_threshold_percent: 70 must be less than",
    ),
    toml(
        "keep-recent-negative",
        "[protect]\nkeep_recent_per_repository = -1\n",
        "protect.keep_recent_per_repository: must not be negative",
    ),
    toml(
        "image-pattern-empty",
        "[protect]\nimages = [\"registry.k8s.io/pause:*\", \"\"]\n",
        "protect.images[1]: must not be empty",
    ),
    // Durations.
    toml(
        "min-age-unparsable",
        "[gc]\nmin_age = \"abc\"\n",
        "gc.min_age: invalid duration",
    ),
    toml(
        "min-age-negative",
        "[gc]\nmin_age = \"-1m\"\n",
        "gc.min_age: must not be negative",
    ),
    toml(
        "max-age-bare-integer",
        "[gc]\nmax_age = 300\n",
        "gc.max_age: expected a duration",
    ),
    toml(
        "max-age-below-min-age",
        "[gc]\nmin_age = \"2m\"\nmax_age = \"1m\"\n",
        "gc.max_age: 1m must be greater than gc.min_age",
    ),
    toml(
        "max-age-equals-min-age",
        "[gc]\nmin_age = \"10m\"\nmax_age = \"10m\"\n",
        "gc.max_age: 10m must be greater",
    ),
    toml(
        "interval-zero",
        "[gc]\ninterval = \"0s\"\n",
        "gc.interval: must be at least 1s, got 0s",
    ),
    toml(
        "poll-longer-than-interval",
        "[gc]\ninterval = \"5m\"\nusage_poll_interval = \"10m\"\n",
        "gc.usage_poll_interval: 10m must not be longer",
    ),
    toml(
        "poll-below-a-second",
        "[gc]\nusage_poll_interval = \"500ms\"\n",
        "gc.usage_poll_interval: must be at least 1s",
    ),
    toml(
        "timeout-zero",
        "[runtime]\ntimeout = \"0s\"\n",
        "runtime.timeout: must be at least 1s",
    ),
    toml(
        "thrash-window-unknown-unit",
        "[gc]\nthrash_window = \"1 fortnight\"\n",
        "gc.thrash_window: invalid duration",
    ),
    toml(
        "interval-overflowing",
        "[gc]\ninterval = \"18446744073709551615s\"\n",
        "gc.interval: 213503982334601d7h15s is more than the maximum of 1d",
    ),
    toml(
        "poll-interval-over-a-day",
        "[gc]\ninterval = \"1d\"\nusage_poll_interval = \"25h\"\n",
        "gc.usage_poll_interval: 1d1h is more than the maximum of 1d",
    ),
    toml(
        "timeout-overflowing",
        "[runtime]\ntimeout = \"18446744073709551615s\"\n",
        "runtime.timeout: 213503982334601d7h15s is more than the maximum of 1d",
    ),
    toml(
        "min-age-over-a-year",
        "[gc]\nmin_age = \"366d\"\n",
        "gc.min_age: 366d is more than the maximum of 365d",
    ),
    toml(
        "max-age-overflowing",
        "[gc]\nmax_age = \"18446744073709551615s\"\n",
        "gc.max_age: 213503982334601d7h15s is more than the maximum of 365d",
    ),
    toml(
        "thrash-window-over-a-year",
        "[gc]\nthrash_window = \"53w\"\n",
        "gc.thrash_window: 371d is more than the maximum of 365d",
    ),
    yaml(
        "kubelet-max-age-overflowing",
        kubelet!("imageMaximumGCAge: 18446744073709551615s\n"),
        "imageMaximumGCAge: 213503982334601d7h15s is more than the maximum of 365d",
    ),
    yaml(
        "kubelet-min-age-over-a-year",
        kubelet!("imageMinimumGCAge: 9000h\n"),
        "imageMinimumGCAge: 375d is more than the maximum of 365d",
    ),
    // Paths and addresses.
    toml(
        "endpoint-tcp",
        "[runtime]\nendpoint = \"tcp://127.0.0.1:10010\"\n",
        "runtime.endpoint: only unix:// endpoints are supported",
    ),
    toml(
        "endpoint-relative-socket",
        "[runtime]\nendpoint = \"unix://containerd.sock\"\n",
        "runtime.endpoint: expected unix://",
    ),
    toml(
        "listen-without-port",
        "[metrics]\nlisten = \"localhost\"\n",
        "metrics.listen: expected an address",
    ),
    toml(
        "listen-hostname",
        "[metrics]\nlisten = \"metrics.example.com:9105\"\n",
        "metrics.listen: expected an address",
    ),
    toml(
        "state-dir-relative",
        "[state]\ndir = \"var/lib/imagegc\"\n",
        "state.dir: must be an absolute path",
    ),
    toml(
        "state-dir-empty",
        "[state]\ndir = \"\"\n",
        "state.dir: must not be empty",
    ),
    toml(
        "image-fs-path-relative",
        "[gc]\nimage_fs_path = \"containerd\"\n",
        "gc.image_fs_path: must be an absolute path",
    ),
    // Inode thresholds.
    toml(
        "inodes-only-high",
        "[gc]\nhigh_inodes_percent = 90\n",
        "gc.low_inodes_percent: must be set",
    ),
    toml(
        "inodes-only-low",
        "[gc]\nlow_inodes_percent = 80\n",
        "gc.high_inodes_percent: must be set",
    ),
    toml(
        "inodes-low-above-high",
        "[gc]\nhigh_inodes_percent = 80\nlow_inodes_percent = 90\n",
        "gc.low_inodes_percent: 90 must be less than",
    ),
    toml(
        "inodes-above-100",
        "[gc]\nhigh_inodes_percent = 101\nlow_inodes_percent = 80\n",
        "gc.high_inodes_percent: must be within",
    ),
    // imagegc's schema in YAML.
    yaml("yaml-unclosed-list", "gc:\n  high_threshold_percent: [90\n", "line "),
    yaml(
        "yaml-unknown-gc-key",
        "gc:\n  hihg_threshold_percent: 90\n",
        "gc.hihg_threshold_percent: unknown key",
    ),
    yaml(
        "yaml-unknown-section",
        "garbage:\n  collect: true\n",
        "garbage: unknown key",
    ),
    yaml(
        "yaml-wrong-type",
        "gc:\n  dry_run: [true]\n",
        "gc.dry_run: invalid type",
    ),
    yaml(
        "yaml-percent-150",
        "gc:\n  high_threshold_percent: 150\n",
        "gc.high_threshold_percent: must be within",
    ),
    yaml(
        "yaml-duplicate-key",
        "gc:\n  dry_run: true\n  high_threshold_percent: 90\n  dry_run: false\n",
        "line 4, column 3: duplicate key gc.dry_run",
    ),
    yaml(
        "yaml-duplicate-section",
        "gc:\n  dry_run: true\nstate:\n  dir: /var/lib/imagegc\ngc:\n  dry_run: false\n",
        "line 5, column 1: duplicate key gc",
    ),
    yaml(
        "kubelet-duplicate-field",
        kubelet!("imageGCHighThresholdPercent: 85\nimageGCHighThresholdPercent: 100\n"),
        "line 4, column 1: duplicate key imageGCHighThresholdPercent",
    ),
    toml(
        "toml-duplicate-key-named",
        "[gc]\ndry_run = true\nhigh_threshold_percent = 90\ndry_run = false\n",
        "line 4, column 1: duplicate key gc.dry_run",
    ),
    toml(
        "toml-duplicate-section-named",
        "[gc]\ndry_run = true\n[state]\ndir = \"/x\"\n[gc]\ndry_run = false\n",
        "line 5, column 2: duplicate key gc",
    ),
    yaml("yaml-top-level-list", "- gc\n- runtime\n", "expected a mapping"),
    yaml(
        "yaml-unsupported-kind",
        "kind: ConfigMap\n",
        "kind: unsupported kind \"ConfigMap\"",
    ),
    // KubeletConfiguration: the kubelet's field names.
    yaml(
        "kubelet-high-101",
        kubelet!("imageGCHighThresholdPercent: 101\n"),
        "imageGCHighThresholdPercent: must be within",
    ),
    yaml(
        "kubelet-low-negative",
        kubelet!("imageGCLowThresholdPercent: -1\n"),
        "imageGCLowThresholdPercent: must be within",
    ),
    yaml(
        "kubelet-low-above-high",
        kubelet!("imageGCHighThresholdPercent: 50\nimageGCLowThresholdPercent: 60\n"),
        "imageGCLowThresholdPercent: 60 must be less than imageGCHighThresholdPercent (50)",
    ),
    yaml(
        "kubelet-percent-string",
        kubelet!("imageGCHighThresholdPercent: \"85\"\n"),
        "imageGCHighThresholdPercent: invalid type",
    ),
    yaml(
        "kubelet-min-age-unparsable",
        kubelet!("imageMinimumGCAge: abc\n"),
        "imageMinimumGCAge: invalid duration \"abc\"",
    ),
    yaml(
        "kubelet-max-age-negative",
        kubelet!("imageMaximumGCAge: -5m\n"),
        "imageMaximumGCAge: must not be negative",
    ),
    yaml(
        "kubelet-max-age-below-min",
        kubelet!("imageMinimumGCAge: 2m0s\nimageMaximumGCAge: 1m0s\n"),
        "imageMaximumGCAge: 1m must be greater than imageMinimumGCAge (2m)",
    ),
    yaml(
        "kubelet-max-age-without-its-feature-gate",
        kubelet!("featureGates:\n  ImageMaximumGCAge: false\nimageMinimumGCAge: 2m\nimageMaximumGCAge: 1h\n"),
        "imageMaximumGCAge: 1h requires the ImageMaximumGCAge feature gate",
    ),
    yaml(
        "kubelet-feature-gate-not-a-bool",
        kubelet!("featureGates:\n  ImageMaximumGCAge: \"no\"\n"),
        "featureGates.ImageMaximumGCAge: invalid type",
    ),
    yaml(
        "kubelet-eviction-unparsable",
        kubelet!("evictionHard:\n  imagefs.available: lots\n"),
        "evictionHard.imagefs.available: invalid quantity",
    ),
    yaml(
        "kubelet-tab-indent",
        kubelet!("evictionHard:\n\timagefs.available: 15%\n"),
        "line 4, column",
    ),
    // Formats told apart by content.
    Case {
        name: "sniffed-toml-unknown-key",
        extension: "conf",
        fixture: Fixture::Text("[gc]\nhihg_threshold_percent = 90\n"),
        named: "gc.hihg_threshold_percent: unknown key",
    },
    Case {
        name: "sniffed-kubelet-high-101",
        extension: "conf",
        fixture: Fixture::Text(kubelet!("imageGCHighThresholdPercent: 101\n")),
        named: "imageGCHighThresholdPercent: must be within",
    },
    // Files that cannot be read.
    Case {
        name: "missing",
        extension: "toml",
        fixture: Fixture::Missing,
        named: "cannot read the file",
    },
    Case {
        name: "directory",
        extension: "toml",
        fixture: Fixture::Directory,
        named: "cannot read the file",
    },
    Case {
        name: "not-utf8",
        extension: "toml",
        fixture: Fixture::Bytes(b"[gc]\nmin_age = \"\xff\xfe\"\n"),
        named: "cannot read the file",
    },
    // Input that would cost the parser far more than its size.
    Case {
        name: "yaml-nested-100k-deep",
        extension: "yaml",
        fixture: Fixture::Generated(|| format!("gc: {}", "[".repeat(100_000))),
        // The top-level mapping is the first level.
        named: "line 1, column 36: more than 32 levels of nesting",
    },
    Case {
        name: "json-nested-100k-deep",
        extension: "json",
        fixture: Fixture::Generated(|| format!("{{\"gc\": {}", "{\"a\": ".repeat(100_000))),
        named: "line 1, column 194: more than 32 levels of nesting",
    },
    Case {
        name: "toml-nested-100k-deep",
        extension: "toml",
        fixture: Fixture::Generated(|| format!("[protect]\nimages = {}", "[".repeat(100_000))),
        named: "line 2, column 42: more than 32 levels of nesting",
    },
    Case {
        name: "sniffed-nested-100k-deep",
        extension: "conf",
        fixture: Fixture::Generated(|| format!("a = {}", "[".repeat(100_000))),
        named: "line 1, column 37: more than 32 levels of nesting",
    },
    // A quote inside a plain YAML value is a character, not the start of a
    // string: it hides none of the mebibyte of brackets that follows.
    Case {
        name: "yaml-stray-quote-then-a-mebibyte-of-brackets",
        extension: "yaml",
        fixture: Fixture::Generated(|| {
            let head = "gc:\n  dry_run: x\"y\nprotect: ";
            format!("{head}{}", "[".repeat(1024 * 1024 - head.len()))
        }),
        named: "line 3, column 41: more than 32 levels of nesting",
    },
    Case {
        name: "yaml-stray-quote-then-a-mebibyte-of-dashes",
        extension: "yml",
        fixture: Fixture::Generated(|| {
            let head = "gc:\n  dry_run: x\"y\nprotect:\n  images:\n    ";
            format!("{head}{}", "- ".repeat((1024 * 1024 - head.len()) / 2))
        }),
        named: "line 5, column 65: more than 32 levels of nesting",
    },
    Case {
        name: "toml-unterminated-string-then-brackets",
        extension: "toml",
        fixture: Fixture::Generated(|| format!("a = \"x\nb = {}", "[".repeat(500_000))),
        named: "line 2, column 37: more than 32 levels of nesting",
    },
    Case {
        name: "toml-string-ending-in-four-quotes-then-brackets",
        extension: "toml",
        fixture: Fixture::Generated(|| format!("a = \"\"\"x\"\"\"\"\nb = {}", "[".repeat(500_000))),
        named: "line 2, column 37: more than 32 levels of nesting",
    },
    Case {
        name: "larger-than-a-mebibyte",
        extension: "toml",
        fixture: Fixture::Generated(|| format!("[gc]\n{}", "# padding\n".repeat(120_000))),
        named: "the file is 1200005 bytes, more than the maximum of 1048576 (1 MiB)",
    },
];
