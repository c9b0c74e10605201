//! The kubelet reader: a KubeletConfiguration's image GC fields read as
//! imagegc's configuration, and the node's KubeletConfiguration named by
//! `kubelet.config` cross-checked against imagegc's own.
//!
//! It owns what an operator should hear about running beside the kubelet
//! (the kubelet still collecting, evicting before imagegc's high threshold,
//! another API version), the `ImageMaximumGCAge` feature gate, and reading
//! the kubelet's eviction thresholds and resource quantities. It must not
//! honour any other kubelet field: the runtime endpoint, the pod limits and
//! the rest are the kubelet's business.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

use super::parse::{self, Format};
use super::raw::{RawConfig, RawGc, RawKubelet, read_keys};
use super::validate::{self, KUBELET_KEYS};
use super::{Config, EvictionThreshold, KubeletView, Problems, read_text};
use crate::time::format_duration;

/// The `kind` that marks a kubelet configuration file.
pub(super) use super::raw::KUBELET_KIND;
/// The kubelet configuration API version whose fields imagegc knows.
const KUBELET_API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
/// The kubelet feature gate without which `imageMaximumGCAge` must be unset
/// or zero (beta, on by default, since Kubernetes 1.30).
const IMAGE_MAXIMUM_GC_AGE_GATE: &str = "ImageMaximumGCAge";

/// The kubelet's hard eviction thresholds on available disk when its file
/// sets no `evictionHard` (Kubernetes `DefaultEvictionHard`, Linux): pods
/// are evicted above 85 % usage of the image filesystem and above 90 % of
/// the kubelet's root filesystem.
const DEFAULT_IMAGEFS_AVAILABLE: EvictionThreshold = EvictionThreshold::Percent(DEFAULT_IMAGEFS_AVAILABLE_PERCENT);
/// See [`DEFAULT_IMAGEFS_AVAILABLE`]: what imagegc assumes when it reads no
/// kubelet configuration.
pub(super) const DEFAULT_IMAGEFS_AVAILABLE_PERCENT: f64 = 15.0;
/// See [`DEFAULT_IMAGEFS_AVAILABLE`].
const DEFAULT_NODEFS_AVAILABLE: EvictionThreshold = EvictionThreshold::Percent(10.0);

/// What imagegc reads from a KubeletConfiguration: its image GC fields as a
/// `Config`, and the eviction lines that bound where imagegc's high
/// threshold may sit.
struct KubeletFile {
    config: Config,
    api_version: Option<String>,
    eviction: Eviction,
}

/// The kubelet's hard eviction thresholds on available disk, as the kubelet
/// will apply them: written in the file, or its defaults when the file sets
/// no `evictionHard` (or asks for them with `mergeDefaultEvictionSettings`).
/// A signal a partial `evictionHard` leaves out is off, as in the kubelet.
#[derive(Debug, Default, Clone, Copy)]
struct Eviction {
    imagefs_available: Option<EvictionThreshold>,
    nodefs_available: Option<EvictionThreshold>,
    /// The thresholds above are the kubelet's defaults, not the file's.
    defaulted: bool,
    /// `evictionSoft`'s thresholds on the same signals (no defaults).
    soft_imagefs_available: Option<EvictionThreshold>,
    soft_nodefs_available: Option<EvictionThreshold>,
}

impl Eviction {
    /// The line on the image filesystem that binds: of `evictionHard` and
    /// `evictionSoft`, the one that evicts with more space available (a
    /// percentage and a size cannot be compared without the capacity: the
    /// hard line then).
    fn binding_imagefs(&self) -> Option<EvictionThreshold> {
        binding(self.imagefs_available, self.soft_imagefs_available)
    }
}

/// Of a hard and a soft threshold, the one that evicts first.
fn binding(hard: Option<EvictionThreshold>, soft: Option<EvictionThreshold>) -> Option<EvictionThreshold> {
    use EvictionThreshold::{Bytes, Percent};
    match (hard, soft) {
        (Some(Percent(h)), Some(Percent(s))) => Some(Percent(h.max(s))),
        (Some(Bytes(h)), Some(Bytes(s))) => Some(Bytes(h.max(s))),
        (Some(hard), _) => Some(hard),
        (None, soft) => soft,
    }
}

/// A source of the kubelet's configuration: its path, the file that named
/// it (imagegc's, or the command line) and the key it was named by.
pub(super) type Named = (PathBuf, String, &'static str);

/// Where the kubelet's configuration is read from, each optional.
pub(super) struct Sources<'a> {
    /// `kubelet.config`: its file (`--config`).
    pub main: Option<&'a Named>,
    /// `kubelet.config_dir`: its drop-in directory (`--config-dir`).
    pub dir: Option<&'a Named>,
    /// `kubelet.args_file`: a file of its flags, applied last.
    pub args: Option<&'a Named>,
}

/// The kubelet flags imagegc reads from `kubelet.args_file`, and the
/// KubeletConfiguration field each sets (flags win over the files, as in
/// the kubelet).
const FLAGS: [(&str, &str); 4] = [
    ("image-gc-high-threshold", "imageGCHighThresholdPercent"),
    ("image-gc-low-threshold", "imageGCLowThresholdPercent"),
    ("eviction-hard", "evictionHard"),
    ("eviction-soft", "evictionSoft"),
];

/// Reads the node's kubelet configuration as the kubelet assembles it (see
/// [`read_node_kubelet`]) from `kubelet.config` and `kubelet.config_dir`
/// (or their flags), and warns when the kubelet would collect images too,
/// or would evict pods before imagegc's high threshold is reached; sets
/// what the metrics say of it ([`KubeletView`]). A file or directory that
/// cannot be read is a warning, not an error: it only serves this check,
/// and a collector that refuses to start for want of it leaves the node
/// with none. Problems of the kubelet's files are reported against the
/// file that has them.
pub(super) fn cross_check_kubelet(config: &mut Config, sources: &Sources<'_>, problems: &mut Vec<super::Problem>) {
    let Some((document, sources)) = read_node_kubelet(config, sources, problems) else {
        return;
    };
    let mut found = Problems::new(sources.clone());
    let kubelet = read_kubelet_file(document, &mut found);
    problems.extend(found.list);
    let file = sources;
    let gc_enabled = !kubelet.config.collection_disabled();
    if gc_enabled {
        config.warnings.push(format!(
            "{file}: the kubelet's own image GC is enabled (imageGCHighThresholdPercent {}, imageMaximumGCAge {}): \
             both the kubelet and imagegc would remove images; keep gc.high_threshold_percent below it (the \
             kubelet then never finds work), or set imageGCHighThresholdPercent: 100 and imageMaximumGCAge: 0s there",
            kubelet.config.gc.high_threshold_percent,
            format_duration(kubelet.config.gc.max_age),
        ));
    }
    config.eviction_imagefs_available = kubelet.eviction.binding_imagefs();
    let default_note = format!(" (the kubelet's default: {file} sets no evictionHard)");
    let eviction = eviction_warnings(
        "gc.high_threshold_percent",
        config.gc.high_threshold_percent,
        kubelet.eviction,
        &format!(" in {file}"),
        &default_note,
    );
    config.kubelet = KubeletView {
        read: true,
        image_gc_enabled: gc_enabled,
        high_above_eviction: !eviction.is_empty(),
    };
    config.warnings.extend(eviction);
}

/// The kubelet's configuration document as the kubelet assembles it, and
/// the files it came from (for problems and warnings): the main file, then
/// each file of the drop-in directory whose name ends in `.conf`, walking
/// it in lexical order (subdirectories included, as the kubelet's
/// `filepath.WalkDir`), each merged over the result so far as a JSON merge
/// patch (RFC 7386), as the kubelet's `--config-dir` does. As in the
/// kubelet, a main file without `evictionHard` has the default thresholds
/// before a drop-in's are merged in. `None` (with a warning) when the main
/// file or the directory cannot be read (beside a flags file, a main file
/// that does not exist is none), or (with problems) when a file is not a
/// kubelet configuration.
fn read_node_kubelet(
    config: &mut Config,
    from: &Sources<'_>,
    problems: &mut Vec<super::Problem>,
) -> Option<(Map<String, Value>, String)> {
    let (main, dir) = (from.main, from.dir);
    let unreadable = |what: &Path, key: &str, err: &dyn std::fmt::Display, mount: &str| {
        format!(
            "{key}: cannot read {}: {err}; the hand-over from the kubelet is not checked, and its defaults are \
             assumed (in a pod, mount the kubelet's {mount} read-only at that path: \
             deploy/components/kubelet-config, or the chart's kubelet.configPath and kubelet.configDir)",
            what.display()
        )
    };
    let mut document = Map::new();
    let mut sources = Vec::new();
    if let Some((path, file, key)) = main {
        let text = match read_text(path) {
            Ok(text) => Some(text),
            // With a flags file, a kubelet file that does not exist is one
            // the kubelet is not given: AKS writes kubeletconfig.json only
            // for a pool with a kubelet configuration of its own, and the
            // others have their flags alone, so one setting serves both.
            Err(err) if err.kind() == std::io::ErrorKind::NotFound && from.args.is_some() => None,
            Err(err) => {
                config.warnings.push(unreadable(path, key, &err, "file"));
                return None;
            }
        };
        if let Some(text) = text {
            let mut found = Problems::new(path.display().to_string());
            let parsed = parse::parse(Format::Yaml, &text, &mut found);
            problems.extend(found.list);
            let parsed = parsed?;
            if parsed.get("kind").and_then(Value::as_str) != Some(KUBELET_KIND) {
                let mut found = Problems::new(file.clone());
                found.push(*key, format!("{} is not a {KUBELET_KIND}", path.display()));
                problems.extend(found.list);
                return None;
            }
            document = parsed;
            sources.push(path.display().to_string());
        }
    }
    if let Some((path, _, key)) = dir {
        let files = match drop_ins(path) {
            Ok(files) => files,
            // Beside a configuration file read, a drop-in directory that
            // does not exist holds no drop-ins: the kubelet is given
            // --config-dir only where it exists (EKS's nodeadm writes
            // config.json.d only for a node group's own kubelet settings),
            // so one component serves every node group.
            Err(err) if err.kind() == std::io::ErrorKind::NotFound && !sources.is_empty() => Vec::new(),
            Err(err) => {
                config.warnings.push(unreadable(path, key, &err, "drop-in directory"));
                return None;
            }
        };
        let mut bad = false;
        for drop_in in files {
            let mut found = Problems::new(drop_in.display().to_string());
            let parsed = match read_text(&drop_in) {
                Ok(text) => parse::parse(Format::Yaml, &text, &mut found),
                Err(err) => {
                    found.push("", format!("cannot read the kubelet's drop-in: {err}"));
                    None
                }
            };
            if let Some(patch) = &parsed {
                if let Some(kind) = patch.get("kind").and_then(Value::as_str).filter(|k| *k != KUBELET_KIND) {
                    found.push("kind", format!("{kind:?} is not a {KUBELET_KIND}"));
                }
                // Each drop-in's own fields are checked against it.
                let _: RawKubelet = read_keys("", patch.clone(), &mut found);
            }
            bad |= !found.list.is_empty();
            problems.extend(found.list);
            let Some(patch) = parsed else { continue };
            if patch.contains_key("evictionHard") && !document.contains_key("evictionHard") {
                document.insert("evictionHard".into(), default_eviction_hard());
            }
            merge_patch(&mut document, patch);
            sources.push(drop_in.display().to_string());
        }
        if bad {
            return None;
        }
    }
    if let Some((path, _, key)) = from.args {
        let text = match read_text(path) {
            Ok(text) => text,
            Err(err) => {
                config.warnings.push(unreadable(path, key, &err, "flags file"));
                return None;
            }
        };
        let mut found = Problems::new(path.display().to_string());
        let flags = read_flags(&text, &mut found);
        if !found.list.is_empty() {
            problems.extend(found.list);
            return None;
        }
        // A flag replaces the field whole (a map flag its whole map, as
        // the kubelet's first use of it does).
        document.extend(flags);
        sources.push(path.display().to_string());
    }
    document.entry("kind").or_insert_with(|| Value::from(KUBELET_KIND));
    let sources = match sources.len() {
        0 => dir.map(|(path, _, _)| path.display().to_string()).unwrap_or_default(),
        n if n > SOURCES_NAMED => format!(
            "{} + {} more + {}",
            sources[..SOURCES_NAMED - 1].join(" + "),
            n - SOURCES_NAMED,
            sources[n - 1]
        ),
        _ => sources.join(" + "),
    };
    Some((document, sources))
}

/// How many of the files the kubelet's configuration came from a message
/// names at most (the first ones and the last): a drop-in directory of
/// thousands of files must not make one warning line of megabytes.
const SOURCES_NAMED: usize = 8;

/// The fields the kubelet flags of [`FLAGS`] in `text` set (a file of
/// flags: `--name=value` or `--name value`, separated by white space or
/// lines, values quoted or not; `#` starts a comment line; other flags are
/// the kubelet's business). The last of a threshold flag wins; map flags
/// (`signal<value,...`) add up, as in the kubelet. A file of variables
/// (a unit's EnvironmentFile, as AKS's `/etc/default/kubelet`:
/// `KUBELET_FLAGS=--name=value ...`) counts the flags in their values,
/// each split at white space as a unit splits an unbraced `$VARIABLE`.
fn read_flags(text: &str, problems: &mut Problems) -> Map<String, Value> {
    let words: Vec<String> = shell_words(text)
        .into_iter()
        .flat_map(|word| match assigned(&word) {
            Some(value) => value.split_whitespace().map(str::to_owned).collect(),
            None => vec![word],
        })
        .collect();
    let mut fields = Map::new();
    let mut i = 0;
    while i < words.len() {
        let word = &words[i];
        i += 1;
        let Some(flag) = word.strip_prefix("--") else {
            continue;
        };
        let (name, inline) = match flag.split_once('=') {
            Some((name, value)) => (name.replace('_', "-"), Some(value.to_owned())),
            None => (flag.replace('_', "-"), None),
        };
        let Some(&(_, field)) = FLAGS.iter().find(|(f, _)| *f == name) else {
            continue;
        };
        let value = match inline {
            Some(value) => value,
            None if i < words.len() && !words[i].starts_with("--") => {
                i += 1;
                words[i - 1].clone()
            }
            None => {
                problems.push(format!("--{name}"), "the flag has no value");
                continue;
            }
        };
        if field.starts_with("eviction") {
            let map = fields
                .entry(field)
                .or_insert_with(|| Value::Object(Map::new()))
                .as_object_mut()
                .expect("an eviction field is a map");
            for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                match pair.split_once('<') {
                    Some((signal, threshold)) => {
                        map.insert(signal.trim().to_owned(), Value::from(threshold.trim()));
                    }
                    None => problems.push(
                        format!("--{name}"),
                        format!("{pair:?} is not signal<threshold (for example imagefs.available<15%)"),
                    ),
                }
            }
        } else {
            match value.trim().parse::<i64>() {
                Ok(percent) => {
                    fields.insert(field.to_owned(), Value::from(percent));
                }
                Err(_) => problems.push(
                    format!("--{name}"),
                    format!("expected a whole percentage, got {value:?}"),
                ),
            }
        }
    }
    fields
}

/// The value of `word` when it assigns a variable (`NAME=value`, `NAME`
/// a shell variable's name).
fn assigned(word: &str) -> Option<&str> {
    let (name, value) = word.split_once('=')?;
    let mut chars = name.chars();
    let first = chars.next()?;
    ((first.is_ascii_alphabetic() || first == '_') && chars.all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .then_some(value)
}

/// Words as a shell splits them: white space apart, quotes (`'`, `"`)
/// grouping and removed, a backslash escaping the next character (a
/// backslash-newline joins lines); lines starting with `#` skipped.
fn shell_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    let mut chars = text.chars().peekable();
    let mut line_start = true;
    while let Some(c) = chars.next() {
        if line_start && quote.is_none() && word.is_none() && c == '#' {
            for skipped in chars.by_ref() {
                if skipped == '\n' {
                    break;
                }
            }
            continue;
        }
        line_start = c == '\n' && quote.is_none();
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('"') | None, '\\') => match chars.next() {
                Some('\n') | None => {}
                Some(escaped) => word.get_or_insert_with(String::new).push(escaped),
            },
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, c) if c.is_whitespace() => words.extend(word.take()),
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

/// The `.conf` files under `dir`, in the order the kubelet merges them:
/// each directory's entries by name (bytes), a subdirectory walked where
/// its name falls. As the kubelet's `filepath.WalkDir`, a symbolic link
/// is not walked into, even to a directory (a `.conf` link is read as the
/// file it names); `dir` itself may be one.
fn drop_ins(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut entries: Vec<std::fs::DirEntry> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            files.extend(drop_ins(&path)?);
        } else if path.extension().is_some_and(|e| e == "conf") {
            files.push(path);
        }
    }
    Ok(files)
}

/// RFC 7386: an object merges key by key, `null` removes a key, anything
/// else replaces the value.
fn merge_patch(target: &mut Map<String, Value>, patch: Map<String, Value>) {
    for (key, value) in patch {
        match value {
            Value::Null => {
                target.remove(&key);
            }
            Value::Object(inner) => {
                let slot = target.entry(key).or_insert_with(|| Value::Object(Map::new()));
                if !slot.is_object() {
                    *slot = Value::Object(Map::new());
                }
                if let Value::Object(slot) = slot {
                    merge_patch(slot, inner);
                }
            }
            other => {
                target.insert(key, other);
            }
        }
    }
}

/// The kubelet's `DefaultEvictionHard` (Linux), as the document holds it.
fn default_eviction_hard() -> Value {
    serde_json::json!({
        "memory.available": "100Mi",
        "nodefs.available": "10%",
        "nodefs.inodesFree": "5%",
        "imagefs.available": "15%",
        "imagefs.inodesFree": "5%",
    })
}

/// Reads the image GC fields of a KubeletConfiguration as imagegc's own
/// configuration, with what an operator should know about running imagegc
/// from the kubelet's own file.
pub(super) fn read_kubelet(document: Map<String, Value>, problems: &mut Problems) -> Config {
    let kubelet = read_kubelet_file(document, problems);
    let mut config = kubelet.config;
    config.eviction_imagefs_available = kubelet.eviction.binding_imagefs();
    config.warnings = kubelet_warnings(&config, kubelet.api_version.as_deref(), kubelet.eviction);
    config
}

/// The image GC fields of a KubeletConfiguration, validated as the kubelet
/// does, and its eviction thresholds on disk.
fn read_kubelet_file(document: Map<String, Value>, problems: &mut Problems) -> KubeletFile {
    let kubelet: RawKubelet = read_keys("", document, problems);
    let raw = RawConfig {
        gc: RawGc {
            high_threshold_percent: kubelet.image_gc_high_threshold_percent,
            low_threshold_percent: kubelet.image_gc_low_threshold_percent,
            min_age: kubelet.image_minimum_gc_age,
            max_age: kubelet.image_maximum_gc_age,
            ..RawGc::default()
        },
        ..RawConfig::default()
    };
    let mut config = validate::build(raw, &KUBELET_KEYS, problems);
    let max_age_gate = match kubelet
        .feature_gates
        .as_ref()
        .and_then(|gates| gates.get(IMAGE_MAXIMUM_GC_AGE_GATE))
    {
        None => true,
        Some(Value::Bool(enabled)) => *enabled,
        Some(other) => {
            problems.push(
                format!("featureGates.{IMAGE_MAXIMUM_GC_AGE_GATE}"),
                format!("invalid type: {other}, expected true or false"),
            );
            true
        }
    };
    // As the kubelet's own validation: a maximum age needs its gate.
    if !max_age_gate && !config.gc.max_age.is_zero() && !problems.has(KUBELET_KEYS.max_age) {
        problems.push(
            KUBELET_KEYS.max_age,
            format!(
                "{} requires the {IMAGE_MAXIMUM_GC_AGE_GATE} feature gate, which featureGates turns off: the kubelet \
                 refuses this file (\"{IMAGE_MAXIMUM_GC_AGE_GATE} feature gate is required\"); set it to 0s or \
                 enable the gate",
                format_duration(config.gc.max_age)
            ),
        );
        config.gc.max_age = Duration::ZERO;
    }
    let mut eviction = read_eviction(
        kubelet.eviction_hard.as_ref(),
        kubelet.merge_default_eviction_settings.unwrap_or(false),
        problems,
    );
    if let Some(soft) = &kubelet.eviction_soft {
        let mut read = |signal: &str| {
            let text = soft.get(signal)?;
            parse_eviction_threshold(text)
                .map_err(|message| problems.push(format!("evictionSoft.{signal}"), message))
                .ok()
        };
        eviction.soft_imagefs_available = read("imagefs.available");
        eviction.soft_nodefs_available = read("nodefs.available");
    }
    KubeletFile {
        config,
        api_version: kubelet.api_version,
        eviction,
    }
}

/// The disk eviction thresholds the kubelet applies: with no `evictionHard`
/// its defaults; with one, what it says, the signals it leaves out off
/// (kubernetes#112057) unless `mergeDefaultEvictionSettings` fills them in
/// with the defaults.
fn read_eviction(hard: Option<&BTreeMap<String, String>>, merge_defaults: bool, problems: &mut Problems) -> Eviction {
    let Some(hard) = hard else {
        return Eviction {
            imagefs_available: Some(DEFAULT_IMAGEFS_AVAILABLE),
            nodefs_available: Some(DEFAULT_NODEFS_AVAILABLE),
            defaulted: true,
            ..Eviction::default()
        };
    };
    let mut read = |signal: &str, default: EvictionThreshold| match hard.get(signal) {
        Some(text) => match parse_eviction_threshold(text) {
            Ok(threshold) => Some(threshold),
            Err(message) => {
                problems.push(format!("evictionHard.{signal}"), message);
                None
            }
        },
        None => merge_defaults.then_some(default),
    };
    Eviction {
        imagefs_available: read("imagefs.available", DEFAULT_IMAGEFS_AVAILABLE),
        nodefs_available: read("nodefs.available", DEFAULT_NODEFS_AVAILABLE),
        defaulted: false,
        ..Eviction::default()
    }
}

fn kubelet_warnings(config: &Config, api_version: Option<&str>, eviction: Eviction) -> Vec<String> {
    let mut warnings = Vec::new();
    if let Some(version) = api_version.filter(|v| *v != KUBELET_API_VERSION) {
        warnings.push(format!(
            "apiVersion {version:?} is not {KUBELET_API_VERSION:?}; its image GC fields are read as if it were"
        ));
    }
    if config.collection_disabled() {
        warnings.push(
            "imageGCHighThresholdPercent 100 with imageMaximumGCAge 0 disables collection: imagegc will remove nothing"
                .to_owned(),
        );
        return warnings;
    }
    warnings.push(
        "this KubeletConfiguration leaves the kubelet's own image GC enabled with these settings, so both would \
         remove images; disable it in the kubelet (imageGCHighThresholdPercent: 100, imageMaximumGCAge: 0s) and \
         give imagegc its own configuration"
            .to_owned(),
    );
    warnings.extend(eviction_warnings(
        "imageGCHighThresholdPercent",
        config.gc.high_threshold_percent,
        eviction,
        "",
        " (the kubelet's default: this file sets no evictionHard)",
    ));
    warnings
}

/// The warnings due when collection would only start after one of the
/// kubelet's percentage eviction lines on the image filesystem:
/// `imagefs.available`, and `nodefs.available` where it is stricter, for a
/// node whose image filesystem is also the kubelet's root filesystem (one
/// disk, the usual node; the kubelet then applies both to that disk). Sizes
/// need the measured capacity; the collector checks those.
fn eviction_warnings(key: &str, high: u8, eviction: Eviction, source: &str, default_note: &str) -> Vec<String> {
    let evicts_at = |field: &'static str, threshold| match threshold {
        Some(EvictionThreshold::Percent(available)) if available > 0.0 => Some((field, available, 100.0 - available)),
        _ => None,
    };
    // Of `evictionHard` and `evictionSoft`, the lower line binds.
    let lower = |hard, soft| match (evicts_at("evictionHard", hard), evicts_at("evictionSoft", soft)) {
        (Some(hard), Some(soft)) => Some(if soft.2 < hard.2 { soft } else { hard }),
        (hard, soft) => hard.or(soft),
    };
    let warning = |(field, available, line): (&str, f64, f64), signal: &str, condition: &str| {
        let note = if eviction.defaulted && field == "evictionHard" {
            default_note
        } else {
            ""
        };
        format!(
            "{key} {high}: space collection starts at {high}% usage, but {field} {signal} {available}%{source} \
             makes the kubelet evict pods above {line}% usage{condition}{note}; set it below {line}"
        )
    };
    let mut warnings = Vec::new();
    let imagefs = lower(eviction.imagefs_available, eviction.soft_imagefs_available);
    if let Some(found) = imagefs.filter(|(_, _, line)| f64::from(high) >= *line) {
        warnings.push(warning(found, "imagefs.available", ""));
    }
    let nodefs = lower(eviction.nodefs_available, eviction.soft_nodefs_available);
    if let Some(found) = nodefs.filter(|(_, _, line)| f64::from(high) >= *line)
        && imagefs.is_none_or(|(_, _, image_line)| found.2 < image_line)
    {
        warnings.push(warning(
            found,
            "nodefs.available",
            " where the image filesystem is also the kubelet's root filesystem (one disk for both)",
        ));
    }
    warnings
}

/// A kubelet eviction threshold value: a percentage (`"15%"`) or a
/// quantity (`"10Gi"`, `"500Mi"`, `"10G"`).
fn parse_eviction_threshold(text: &str) -> Result<EvictionThreshold, String> {
    let text = text.trim();
    let Some(number) = text.strip_suffix('%') else {
        return parse_quantity(text).map(EvictionThreshold::Bytes);
    };
    match number.trim().parse::<f64>() {
        Ok(percent) if (0.0..=100.0).contains(&percent) => Ok(EvictionThreshold::Percent(percent)),
        Ok(_) => Err(format!("must be within 0%..=100%, got {text:?}")),
        Err(_) => Err(format!("invalid percentage {text:?}")),
    }
}

/// A Kubernetes resource quantity in bytes: a decimal number with an
/// optional binary (`Ki` .. `Ei`), decimal (`k` .. `E`) or exponent (`e3`)
/// suffix. Fractional bytes round up, as Kubernetes does.
pub(crate) fn parse_quantity(text: &str) -> Result<u64, String> {
    let invalid =
        || format!("invalid quantity {text:?}: expected a percentage such as \"15%\" or a size such as \"10Gi\"");
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let value: f64 = number.parse().map_err(|_| invalid())?;
    let multiplier = match suffix {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "m" => 1e-3,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        _ => match suffix.strip_prefix(['e', 'E']).map(str::parse::<i32>) {
            Some(Ok(exponent)) => 10f64.powi(exponent),
            _ => return Err(invalid()),
        },
    };
    let bytes = (value * multiplier).ceil();
    if bytes >= u64::MAX as f64 {
        return Err(format!("quantity {text:?} is too large"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests_support::*;
    use crate::config::{ConfigError, Overrides, load};

    /// `kubelet.config` points at the node's KubeletConfiguration: imagegc
    /// warns while the kubelet still collects, and when it would evict first.
    #[test]
    fn kubelet_config_is_cross_checked() {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = dir.path().join("kubelet.yaml");
        let imagegc = dir.path().join("imagegc.toml");
        let write = |kubelet_text: &str, high: u8| {
            std::fs::write(&kubelet, kubelet_text).unwrap();
            std::fs::write(
                &imagegc,
                format!(
                    "[gc]\nhigh_threshold_percent = {high}\nlow_threshold_percent = 50\n[kubelet]\nconfig = {:?}\n",
                    kubelet.display().to_string()
                ),
            )
            .unwrap();
            load(Some(&imagegc), &Overrides::default())
        };
        let enabled = "kind: KubeletConfiguration\nevictionHard:\n  imagefs.available: 10%\n";
        let config = write(enabled, 92).unwrap();
        assert_eq!(config.warnings.len(), 2, "{:?}", config.warnings);
        assert!(config.warnings[0].contains("both the kubelet and imagegc would remove images"));
        assert!(config.warnings[1].contains("evict pods above 90% usage"));
        assert_eq!(config.kubelet_config.as_deref(), Some(kubelet.as_path()));
        let handed_over = "kind: KubeletConfiguration\nimageGCHighThresholdPercent: 100\nimageMaximumGCAge: 0s\n\
                           evictionHard:\n  imagefs.available: 10%\n";
        let config = write(handed_over, 85).unwrap();
        assert!(config.warnings.is_empty(), "{:?}", config.warnings);
        // The kubelet file's own problems name that file and its field.
        let err = write("kind: KubeletConfiguration\nimageGCHighThresholdPercent: 101\n", 85).unwrap_err();
        assert_eq!(err.problems[0].file, kubelet.display().to_string());
        assert_eq!(err.problems[0].key, "imageGCHighThresholdPercent");
        let err = write("kind: Pod\n", 85).unwrap_err();
        assert_eq!(err.problems[0].key, "kubelet.config");
    }

    /// A kubelet file the pod was not given (the DaemonSet does not mount
    /// it) costs a warning naming the fix, not the collector: a pod that
    /// exits 2 for it leaves the node with no image GC at all.
    #[test]
    fn a_kubelet_file_that_cannot_be_read_is_a_warning_naming_the_mount() {
        let dir = tempfile::tempdir().unwrap();
        let imagegc = dir.path().join("imagegc.toml");
        std::fs::write(&imagegc, "[kubelet]\nconfig = \"/nonexistent/kubelet/config.yaml\"\n").unwrap();
        let config = load(Some(&imagegc), &Overrides::default()).unwrap();
        assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
        let warning = &config.warnings[0];
        assert!(
            warning.starts_with("kubelet.config: cannot read /nonexistent/kubelet/config.yaml"),
            "{warning}"
        );
        assert!(warning.contains("deploy/components/kubelet-config"), "{warning}");
        assert!(warning.contains("kubelet.configPath"), "{warning}");
    }

    /// `--kubelet-config` (`IMAGEGC_KUBELET_CONFIG`, which the DaemonSet's
    /// kubelet-config component sets) names the kubelet's file without
    /// touching imagegc's own.
    #[test]
    fn the_kubelet_file_named_on_the_command_line_is_cross_checked() {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = dir.path().join("config.yaml");
        std::fs::write(&kubelet, "kind: KubeletConfiguration\n").unwrap();
        let imagegc = dir.path().join("imagegc.toml");
        std::fs::write(
            &imagegc,
            "[gc]\nhigh_threshold_percent = 80\nlow_threshold_percent = 75\n",
        )
        .unwrap();
        let overrides = Overrides {
            kubelet_config: Some(kubelet.clone()),
            ..Overrides::default()
        };
        let config = load(Some(&imagegc), &overrides).unwrap();
        assert_eq!(config.kubelet_config.as_deref(), Some(kubelet.as_path()));
        assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
        assert!(config.warnings[0].contains("the kubelet's own image GC is enabled"));
        let relative = Overrides {
            kubelet_config: Some("config.yaml".into()),
            ..Overrides::default()
        };
        let err = load(Some(&imagegc), &relative).unwrap_err();
        assert_eq!(err.problems[0].key, "--kubelet-config");
    }

    /// The warnings `kubelet.config` gives for a kubelet file whose image
    /// GC is off, with `evictionHard` as written (or absent).
    fn handover_warnings(eviction: &str, high: u8) -> (Config, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = dir.path().join("config.yaml");
        std::fs::write(
            &kubelet,
            format!("kind: KubeletConfiguration\nimageGCHighThresholdPercent: 100\nimageMaximumGCAge: 0s\n{eviction}"),
        )
        .unwrap();
        let imagegc = dir.path().join("imagegc.toml");
        std::fs::write(
            &imagegc,
            format!(
                "[gc]\nhigh_threshold_percent = {high}\nlow_threshold_percent = 50\n[kubelet]\nconfig = {:?}\n",
                kubelet.display().to_string()
            ),
        )
        .unwrap();
        let config = load(Some(&imagegc), &Overrides::default()).unwrap();
        let warnings = config.warnings.clone();
        (config, warnings)
    }

    /// A kubelet file that sets no `evictionHard` evicts at the kubelet's
    /// defaults (imagefs.available 15%: above 85% usage): the shipped high
    /// of 85 gets a warning, 80 none.
    #[test]
    fn a_kubelet_file_without_eviction_hard_is_checked_against_the_kubelets_defaults() {
        let (config, warnings) = handover_warnings("", 85);
        assert_eq!(
            config.eviction_imagefs_available,
            Some(EvictionThreshold::Percent(15.0))
        );
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].starts_with(
                "gc.high_threshold_percent 85: space collection starts at 85% usage, but evictionHard \
                 imagefs.available 15% in "
            ),
            "{}",
            warnings[0]
        );
        assert!(
            warnings[0].contains("evict pods above 85% usage (the kubelet's default: "),
            "{}",
            warnings[0]
        );
        assert!(
            warnings[0].ends_with("sets no evictionHard); set it below 85"),
            "{}",
            warnings[0]
        );
        assert_eq!(handover_warnings("", 80).1, Vec::<String>::new());
    }

    /// A partial `evictionHard` turns the signals it leaves out off, as the
    /// kubelet does (kubernetes#112057), unless `mergeDefaultEvictionSettings`
    /// asks for the defaults.
    #[test]
    fn a_partial_eviction_hard_leaves_the_other_disk_signals_off_unless_defaults_are_merged() {
        let partial = "evictionHard:\n  memory.available: 100Mi\n";
        let (config, warnings) = handover_warnings(partial, 95);
        assert_eq!(config.eviction_imagefs_available, None);
        assert!(warnings.is_empty(), "{warnings:?}");
        let merged = format!("{partial}mergeDefaultEvictionSettings: true\n");
        let (config, warnings) = handover_warnings(&merged, 85);
        assert_eq!(
            config.eviction_imagefs_available,
            Some(EvictionThreshold::Percent(15.0))
        );
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("imagefs.available 15%"), "{}", warnings[0]);
        assert!(!warnings[0].contains("the kubelet's default"), "{}", warnings[0]);
    }

    /// On one disk the kubelet applies `nodefs.available` to the image
    /// filesystem too: where it is the stricter line, it is named.
    #[test]
    fn nodefs_available_is_named_where_it_is_the_stricter_line_on_one_disk() {
        let eviction = "evictionHard:\n  imagefs.available: 5%\n  nodefs.available: 10%\n";
        let (_, warnings) = handover_warnings(eviction, 92);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("evictionHard nodefs.available 10% in "),
            "{}",
            warnings[0]
        );
        assert!(
            warnings[0].contains("above 90% usage where the image filesystem is also the kubelet's root filesystem"),
            "{}",
            warnings[0]
        );
        assert!(handover_warnings(eviction, 89).1.is_empty());
        // Both lines crossed: imagefs.available is the stricter, named alone.
        let (_, warnings) = handover_warnings("evictionHard:\n  imagefs.available: 15%\n  nodefs.available: 10%\n", 92);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("imagefs.available 15%"), "{}", warnings[0]);
    }

    /// A node's kubelet configuration: a main file (`None`: none) and
    /// drop-ins by name, read with imagegc's high threshold `high`.
    fn node_kubelet(main: Option<(&str, &str)>, drop_ins: &[(&str, &str)], high: u8) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let mut toml = format!("[gc]\nhigh_threshold_percent = {high}\nlow_threshold_percent = 50\n[kubelet]\n");
        if let Some((name, text)) = main {
            std::fs::write(root.join(name), text).unwrap();
            toml.push_str(&format!("config = {:?}\n", root.join(name).display().to_string()));
        }
        if !drop_ins.is_empty() {
            let d = root.join("config.d");
            for (name, text) in drop_ins {
                let path = d.join(name);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(path, text).unwrap();
            }
            toml.push_str(&format!("config_dir = {:?}\n", d.display().to_string()));
        }
        let imagegc = root.join("imagegc.toml");
        std::fs::write(&imagegc, toml).unwrap();
        let result = load(Some(&imagegc), &Overrides::default());
        // The paths in messages outlive the directory in these tests.
        std::mem::forget(dir);
        result
    }

    const GC_OFF: &str = "imageGCHighThresholdPercent: 100\nimageMaximumGCAge: 0s\n";

    /// A node group with no kubelet settings of its own has no drop-in
    /// directory (EKS AL2023 without `spec.kubelet.config`): beside the
    /// configuration file, that is no drop-ins, not a file unread.
    #[test]
    fn a_missing_drop_in_directory_beside_a_configuration_file_holds_no_drop_ins() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("config.json");
        std::fs::write(
            &main,
            "{\"kind\": \"KubeletConfiguration\", \"imageGCHighThresholdPercent\": 100}",
        )
        .unwrap();
        let imagegc = dir.path().join("imagegc.toml");
        std::fs::write(
            &imagegc,
            format!(
                "[gc]\nhigh_threshold_percent = 80\nlow_threshold_percent = 50\n[kubelet]\nconfig = {:?}\nconfig_dir = {:?}\n",
                main.display().to_string(),
                dir.path().join("config.json.d").display().to_string()
            ),
        )
        .unwrap();
        let config = load(Some(&imagegc), &Overrides::default()).unwrap();
        assert!(config.kubelet.read, "{:?}", config.warnings);
        assert!(!config.kubelet.image_gc_enabled, "the file's setting is read");
        assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    }

    /// EKS (AL2023) keeps /etc/kubernetes/kubelet/config.json, JSON indented
    /// with tabs, and nodeadm's drop-ins in config.json.d: a drop-in that
    /// turns the kubelet's image GC off is honoured.
    #[test]
    fn a_json_kubelet_file_with_a_drop_in_that_turns_image_gc_off() {
        let json = "{\n\t\"apiVersion\": \"kubelet.config.k8s.io/v1beta1\",\n\t\"kind\": \"KubeletConfiguration\",\n\
                    \t\"imageGCHighThresholdPercent\": 85,\n\t\"evictionHard\": {\"imagefs.available\": \"10%\"}\n}\n";
        let on = node_kubelet(Some(("config.json", json)), &[], 80).unwrap();
        assert!(on.kubelet.read && on.kubelet.image_gc_enabled, "{:?}", on.kubelet);
        assert!(
            on.warnings[0].contains("the kubelet's own image GC is enabled"),
            "{:?}",
            on.warnings
        );
        let off_json = "{\"apiVersion\":\"kubelet.config.k8s.io/v1beta1\",\"kind\":\"KubeletConfiguration\",\
                        \"imageGCHighThresholdPercent\":100,\"imageMaximumGCAge\":\"0s\"}";
        let config = node_kubelet(Some(("config.json", json)), &[("40-nodeadm.conf", off_json)], 80).unwrap();
        assert_eq!(
            config.kubelet,
            KubeletView {
                read: true,
                image_gc_enabled: false,
                high_above_eviction: false,
            }
        );
        assert!(config.warnings.is_empty(), "{:?}", config.warnings);
        assert_eq!(
            config.eviction_imagefs_available,
            Some(EvictionThreshold::Percent(10.0))
        );
    }

    /// The kubelet's `--config-dir`: `.conf` files only, in lexical order
    /// (a subdirectory walked where its name falls), each over the last.
    #[test]
    fn drop_ins_merge_in_lexical_order_and_only_conf_files_count() {
        let main = Some((
            "config.yaml",
            "kind: KubeletConfiguration\nimageGCHighThresholdPercent: 90\n",
        ));
        let enabled = |drop_ins: &[(&str, &str)]| node_kubelet(main, drop_ins, 80).unwrap().kubelet.image_gc_enabled;
        assert!(!enabled(&[("10-off.conf", GC_OFF)]));
        assert!(enabled(&[
            ("10-off.conf", GC_OFF),
            ("20-on.conf", "imageGCHighThresholdPercent: 95\n")
        ]));
        assert!(!enabled(&[
            ("10-on.conf", "imageGCHighThresholdPercent: 95\n"),
            ("20-off.conf", GC_OFF)
        ]));
        assert!(
            enabled(&[("10-off.yaml", GC_OFF), ("20-off.conf.bak", GC_OFF)]),
            "not .conf"
        );
        assert!(!enabled(&[
            ("10-on.conf", "imageGCHighThresholdPercent: 95\n"),
            ("15-more/01-off.conf", GC_OFF)
        ]));
        // Only a drop-in directory: the kubelet's defaults under it.
        let config = node_kubelet(None, &[("10-off.conf", GC_OFF)], 80).unwrap();
        assert!(config.kubelet.read && !config.kubelet.image_gc_enabled);
    }

    /// As the kubelet's `filepath.WalkDir`: a link to a directory is not
    /// walked into (one to `/` would walk the host).
    #[test]
    fn a_linked_directory_among_the_drop_ins_is_not_walked() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("01-off.conf"), GC_OFF).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("config.d");
        std::fs::create_dir(&d).unwrap();
        std::os::unix::fs::symlink(outside.path(), d.join("05-linked")).unwrap();
        std::fs::write(d.join("10-on.conf"), "imageGCHighThresholdPercent: 95\n").unwrap();
        assert_eq!(drop_ins(&d).unwrap(), [d.join("10-on.conf")]);
        // A `.conf` link to a file is read, as the kubelet reads it.
        std::os::unix::fs::symlink(outside.path().join("01-off.conf"), d.join("20-off.conf")).unwrap();
        assert_eq!(drop_ins(&d).unwrap(), [d.join("10-on.conf"), d.join("20-off.conf")]);
    }

    /// Thousands of drop-ins: the messages that name where the kubelet's
    /// configuration came from stay short.
    #[test]
    fn thousands_of_drop_ins_make_no_giant_warning() {
        let soft = "evictionSoft:\n  imagefs.available: 30%\n";
        let names: Vec<String> = (0..2000).map(|i| format!("{i:05}-x.conf")).collect();
        let mut drop_ins: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), GC_OFF)).collect();
        drop_ins.push(("99999-soft.conf", soft));
        let config = node_kubelet(None, &drop_ins, 75).unwrap();
        assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
        let warning = &config.warnings[0];
        assert!(warning.len() < 2000, "{} characters", warning.len());
        assert!(
            warning.contains("+ 1993 more +") && warning.contains("99999-soft.conf"),
            "{warning}"
        );
    }

    /// `evictionSoft` is counted beside `evictionHard`: the lower line binds.
    #[test]
    fn a_drop_in_that_sets_eviction_soft_lower_binds() {
        let main = Some(("config.yaml", &*format!("kind: KubeletConfiguration\n{GC_OFF}")));
        let config = node_kubelet(main, &[], 80).unwrap();
        assert!(!config.kubelet.high_above_eviction, "{:?}", config.warnings);
        let soft = "evictionSoft:\n  imagefs.available: 30%\nevictionSoftGracePeriod:\n  imagefs.available: 1m\n";
        let config = node_kubelet(main, &[("50-soft.conf", soft)], 75).unwrap();
        assert!(config.kubelet.high_above_eviction);
        assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
        assert!(
            config.warnings[0]
                .starts_with("gc.high_threshold_percent 75: space collection starts at 75% usage, but evictionSoft imagefs.available 30% in "),
            "{}",
            config.warnings[0]
        );
        assert!(
            config.warnings[0].ends_with("evict pods above 70% usage; set it below 70"),
            "{}",
            config.warnings[0]
        );
        assert_eq!(
            config.eviction_imagefs_available,
            Some(EvictionThreshold::Percent(30.0))
        );
        // A soft line above the hard one does not bind.
        let config = node_kubelet(
            main,
            &[("50-soft.conf", "evictionSoft:\n  imagefs.available: 5%\n")],
            80,
        )
        .unwrap();
        assert_eq!(
            config.eviction_imagefs_available,
            Some(EvictionThreshold::Percent(15.0))
        );
    }

    /// As the kubelet: a main file without `evictionHard` has the defaults
    /// before a drop-in's `evictionHard` merges into them key by key.
    #[test]
    fn a_drop_ins_eviction_hard_merges_over_the_defaults() {
        let main = Some(("config.yaml", &*format!("kind: KubeletConfiguration\n{GC_OFF}")));
        let drop_in = "evictionHard:\n  imagefs.available: 5%\n";
        let config = node_kubelet(main, &[("10-e.conf", drop_in)], 92).unwrap();
        assert_eq!(config.eviction_imagefs_available, Some(EvictionThreshold::Percent(5.0)));
        // nodefs.available keeps its default 10%: evicts above 90% usage.
        assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
        assert!(
            config.warnings[0].contains("evictionHard nodefs.available 10%"),
            "{}",
            config.warnings[0]
        );
    }

    /// A drop-in the kubelet would refuse is an error naming that file and
    /// its field; one that does not parse names the file too.
    #[test]
    fn a_bad_drop_in_names_its_file() {
        let main = Some(("config.yaml", "kind: KubeletConfiguration\n"));
        let err = node_kubelet(
            main,
            &[
                ("10-ok.conf", GC_OFF),
                ("20-bad.conf", "imageGCHighThresholdPercent: high\n"),
            ],
            80,
        )
        .unwrap_err();
        assert_eq!(err.problems.len(), 1, "{:?}", err.problems);
        assert!(
            err.problems[0].file.ends_with("/config.d/20-bad.conf"),
            "{}",
            err.problems[0]
        );
        assert_eq!(err.problems[0].key, "imageGCHighThresholdPercent");
        let err = node_kubelet(main, &[("30-broken.conf", "evictionSoft: [\n")], 80).unwrap_err();
        assert!(
            err.problems[0].file.ends_with("/config.d/30-broken.conf"),
            "{}",
            err.problems[0]
        );
        let err = node_kubelet(main, &[("40-pod.conf", "kind: Pod\n")], 80).unwrap_err();
        assert_eq!(err.problems[0].key, "kind");
    }

    /// No kubelet configuration: the kubelet's defaults are assumed (image
    /// GC on, eviction above 85 % usage), and a directory that cannot be
    /// read costs a warning naming the chart's values.
    #[test]
    fn without_a_kubelet_file_its_defaults_are_assumed() {
        let dir = tempfile::tempdir().unwrap();
        let imagegc = dir.path().join("imagegc.toml");
        for (high, above) in [(85, true), (84, false)] {
            std::fs::write(
                &imagegc,
                format!("[gc]\nhigh_threshold_percent = {high}\nlow_threshold_percent = 50\n"),
            )
            .unwrap();
            let config = load(Some(&imagegc), &Overrides::default()).unwrap();
            assert_eq!(
                config.kubelet,
                KubeletView {
                    read: false,
                    image_gc_enabled: true,
                    high_above_eviction: above,
                }
            );
        }
        std::fs::write(&imagegc, "[kubelet]\nconfig_dir = \"/nonexistent/config.json.d\"\n").unwrap();
        let config = load(Some(&imagegc), &Overrides::default()).unwrap();
        assert!(!config.kubelet.read);
        assert!(config.warnings[0].starts_with("kubelet.config_dir: cannot read /nonexistent/config.json.d"));
        assert!(
            config.warnings[0].contains("kubelet.configDir"),
            "{}",
            config.warnings[0]
        );
        let relative = Overrides {
            kubelet_config_dir: Some("config.json.d".into()),
            ..Overrides::default()
        };
        let err = load(Some(&imagegc), &relative).unwrap_err();
        assert_eq!(err.problems[0].key, "--kubelet-config-dir");
    }

    /// MicroK8s passes the kubelet its settings as flags in
    /// /var/snap/microk8s/current/args/kubelet: the image GC and eviction
    /// flags apply over the kubelet's file, as in the kubelet.
    /// Loads an imagegc.toml (high 75, low 50) written in `dir` that names
    /// `args` as the kubelet's flags file, holding `flags`, and `kubelet` as
    /// its configuration file when given.
    fn load_with_args_file(
        dir: &Path,
        args: &Path,
        flags: &str,
        kubelet: Option<&Path>,
    ) -> Result<Config, ConfigError> {
        std::fs::write(args, flags).unwrap();
        let file = kubelet
            .map(|kubelet| format!("config = {:?}\n", kubelet.display().to_string()))
            .unwrap_or_default();
        let imagegc = dir.join("imagegc.toml");
        std::fs::write(
            &imagegc,
            format!(
                "[gc]\nhigh_threshold_percent = 75\nlow_threshold_percent = 50\n[kubelet]\n{file}args_file = {:?}\n",
                args.display().to_string()
            ),
        )
        .unwrap();
        load(Some(&imagegc), &Overrides::default())
    }

    #[test]
    fn kubelet_flags_from_an_args_file_apply_over_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let args = dir.path().join("kubelet");
        let kubelet = dir.path().join("config.yaml");
        std::fs::write(&kubelet, format!("kind: KubeletConfiguration\n{GC_OFF}")).unwrap();
        let load_with = |flags: &str, with_file: bool| {
            load_with_args_file(dir.path(), &args, flags, with_file.then_some(kubelet.as_path()))
        };
        let microk8s = "--kubeconfig=${SNAP_DATA}/credentials/kubelet.config\n--cert-dir=${SNAP_DATA}/certs\n\
                        # image GC\n--image-gc-high-threshold 90\n--eviction-hard=\"memory.available<100Mi,imagefs.available<30%\"\n";
        let config = load_with(microk8s, false).unwrap();
        assert!(config.kubelet.read && config.kubelet.image_gc_enabled);
        assert!(config.kubelet.high_above_eviction, "{:?}", config.warnings);
        assert_eq!(
            config.eviction_imagefs_available,
            Some(EvictionThreshold::Percent(30.0))
        );
        assert!(
            config
                .warnings
                .iter()
                .any(|w| w.contains("evictionHard imagefs.available 30%")),
            "{:?}",
            config.warnings
        );
        // A flag wins over the file: the file turned GC off, the flag on.
        let config = load_with(
            "--image-gc-high-threshold=90 --eviction-soft='imagefs.available<10%'",
            true,
        )
        .unwrap();
        assert!(config.kubelet.image_gc_enabled);
        let config = load_with("--image_gc_high_threshold=100\n", true).unwrap();
        assert!(!config.kubelet.image_gc_enabled);
        // A flag the kubelet would refuse names the file and the flag.
        let err = load_with("--eviction-hard=imagefs.available=15%\n", false).unwrap_err();
        assert_eq!(err.problems[0].file, args.display().to_string());
        assert_eq!(err.problems[0].key, "--eviction-hard");
        let err = load_with("--image-gc-low-threshold=lots\n", false).unwrap_err();
        assert_eq!(err.problems[0].key, "--image-gc-low-threshold");
    }

    /// AKS keeps the kubelet's flags in /etc/default/kubelet, the unit's
    /// EnvironmentFile: `KUBELET_FLAGS=--a=b --c=d ...` on one line
    /// (Azure/AgentBaker, cse_config.sh `ensureKubelet`), which the unit
    /// passes as an unbraced `$KUBELET_FLAGS`, split at white space.
    #[test]
    fn kubelet_flags_from_an_environment_file_are_read_as_the_unit_passes_them() {
        let dir = tempfile::tempdir().unwrap();
        let args = dir.path().join("kubelet");
        // Where the node pool has a kubelet configuration of its own.
        let kubelet = dir.path().join("kubeletconfig.json");
        let load_with = |flags: &str, with_file: bool| {
            load_with_args_file(dir.path(), &args, flags, with_file.then_some(kubelet.as_path())).unwrap()
        };
        // The flag the variable's value starts with counts like the others.
        let aks = "KUBELET_FLAGS=--image-gc-high-threshold=100 --address=0.0.0.0 \
                   --eviction-hard=memory.available<750Mi,nodefs.available<10%,imagefs.available<20% \
                   --image-gc-low-threshold=80 --max-pods=110\n\
                   KUBELET_REGISTER_SCHEDULABLE=true\nNETWORK_POLICY=\n\
                   KUBELET_NODE_LABELS=agentpool=nodepool1,kubernetes.azure.com/mode=system\n";
        let config = load_with(aks, false);
        assert!(config.kubelet.read, "{:?}", config.warnings);
        assert!(!config.kubelet.image_gc_enabled, "{:?}", config.warnings);
        assert_eq!(
            config.eviction_imagefs_available,
            Some(EvictionThreshold::Percent(20.0))
        );
        // A pool with a kubelet configuration of its own has the kubelet's
        // file too (/etc/default/kubeletconfig.json), where the GC fields
        // then are; one without it has the flags alone, and the same
        // settings serve both.
        let config = load_with(aks, true);
        assert!(config.kubelet.read, "{:?}", config.warnings);
        assert!(!config.kubelet.image_gc_enabled, "{:?}", config.warnings);
        std::fs::write(
            &kubelet,
            r#"{"kind":"KubeletConfiguration","apiVersion":"kubelet.config.k8s.io/v1beta1","imageGCHighThresholdPercent":100}"#,
        )
        .unwrap();
        let config = load_with("KUBELET_FLAGS=--address=0.0.0.0 --max-pods=110\n", true);
        assert!(
            config.kubelet.read && !config.kubelet.image_gc_enabled,
            "{:?}",
            config.warnings
        );
        // Quoted, the value is still split as the unit splits it.
        let config = load_with(
            "KUBELET_FLAGS=\"--image-gc-high-threshold=90 --image-gc-low-threshold=80\"\n",
            false,
        );
        assert!(config.kubelet.image_gc_enabled);
        let config = load_with(
            "KUBELET_FLAGS=\"--max-pods=110 --image-gc-high-threshold=100\"\n",
            false,
        );
        assert!(!config.kubelet.image_gc_enabled);
    }

    #[test]
    fn args_files_split_as_a_shell_does() {
        assert_eq!(
            shell_words("# a comment\n--a=\"x y\" --b 'z'\\\n  --c=d\\ e\n"),
            ["--a=x y", "--b", "z", "--c=d e"]
        );
    }

    #[test]
    fn kubelet_image_gc_fields_are_honoured_and_the_rest_ignored() {
        let config = load_ok("config.yaml", KUBELET_FILE);
        assert_eq!(config.gc.high_threshold_percent, 75);
        assert_eq!(config.gc.low_threshold_percent, 60);
        assert_eq!(config.gc.min_age, secs(300));
        assert_eq!(config.gc.max_age, secs(168 * 3600));
        assert_eq!(
            config.eviction_imagefs_available,
            Some(EvictionThreshold::Percent(10.0))
        );
        let defaults = Config::default();
        assert_eq!(
            config.runtime, defaults.runtime,
            "containerRuntimeEndpoint is the kubelet's, not imagegc's"
        );
        assert_eq!(config.gc.interval, defaults.gc.interval);
        assert_eq!(config.state, defaults.state);
        assert_eq!(config.metrics, defaults.metrics);
    }

    #[test]
    fn feature_gates_are_read_as_the_kubelet_does() {
        // On by default (beta since 1.30), and other gates are the kubelet's business.
        let config = load_ok(
            "k.yaml",
            &kubelet("featureGates:\n  SomeFutureGate: true\n  Other: 3\nimageMaximumGCAge: 1h\n"),
        );
        assert_eq!(config.gc.max_age, secs(3600));
        let config = load_ok(
            "k.yaml",
            &kubelet("featureGates:\n  ImageMaximumGCAge: true\nimageMaximumGCAge: 1h\n"),
        );
        assert_eq!(config.gc.max_age, secs(3600));
        // Off, the kubelet only accepts an unset or zero maximum age.
        let config = load_ok(
            "k.yaml",
            &kubelet("featureGates:\n  ImageMaximumGCAge: false\nimageMaximumGCAge: 0s\n"),
        );
        assert_eq!(config.gc.max_age, Duration::ZERO);
        let problems = rejected(
            "k.yaml",
            &kubelet("featureGates:\n  ImageMaximumGCAge: false\nimageMaximumGCAge: 1h\n"),
        );
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].key, "imageMaximumGCAge");
        assert!(
            problems[0].message.contains("feature gate is required"),
            "{}",
            problems[0]
        );
    }

    #[test]
    fn a_kubelet_file_without_image_gc_fields_gives_the_kubelet_defaults() {
        let config = load_ok("config.yaml", &kubelet("maxPods: 110\n"));
        let defaults = Config::default();
        let kubelets = crate::config::GcConfig {
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            ..defaults.gc
        };
        assert_eq!(config.gc, kubelets);
    }

    #[test]
    fn kubelet_fields_of_the_wrong_type_are_named() {
        let problems = rejected(
            "config.yaml",
            &kubelet("imageGCHighThresholdPercent: high\nimageMinimumGCAge: 120\nevictionHard: 15%\nmaxPods: lots\n"),
        );
        let keys: Vec<_> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            ["evictionHard", "imageGCHighThresholdPercent", "imageMinimumGCAge"]
        );
        assert!(
            problems[2].message.contains("expected a duration such as \"5m\""),
            "{}",
            problems[2]
        );
    }

    #[test]
    fn the_kubelet_still_collecting_is_a_warning() {
        let config = load_ok(
            "config.yaml",
            &kubelet("imageGCHighThresholdPercent: 80\nimageGCLowThresholdPercent: 70\n"),
        );
        assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
        assert!(
            config.warnings[0].contains("kubelet's own image GC enabled"),
            "{:?}",
            config.warnings
        );
    }

    #[test]
    fn a_kubelet_file_that_disables_collection_is_a_warning() {
        let config = load_ok(
            "config.yaml",
            &kubelet("imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 80\nimageMaximumGCAge: 0s\n"),
        );
        assert!(config.collection_disabled());
        assert_eq!(config.warnings.len(), 1, "{:?}", config.warnings);
        assert!(
            config.warnings[0].contains("disables collection"),
            "{:?}",
            config.warnings
        );
    }

    #[test]
    fn eviction_before_the_high_threshold_is_a_warning() {
        let eviction_warnings = |high: u8, available: &str| {
            let body = format!(
                "imageGCHighThresholdPercent: {high}\nimageGCLowThresholdPercent: 50\nevictionHard:\n  imagefs.available: {available:?}\n"
            );
            let config = load_ok("config.yaml", &kubelet(&body));
            config
                .warnings
                .into_iter()
                .filter(|w| w.contains("evictionHard"))
                .collect::<Vec<_>>()
        };
        let warnings = eviction_warnings(85, "15%");
        assert_eq!(warnings.len(), 1);
        assert_eq!(
            warnings[0],
            "imageGCHighThresholdPercent 85: space collection starts at 85% usage, but evictionHard \
             imagefs.available 15% makes the kubelet evict pods above 85% usage; set it below 85"
        );
        assert_eq!(eviction_warnings(90, "15%").len(), 1);
        assert_eq!(eviction_warnings(84, "15%").len(), 0);
        assert_eq!(eviction_warnings(85, "10%").len(), 0);
        assert_eq!(
            eviction_warnings(95, "10Gi").len(),
            0,
            "a size cannot be compared without the capacity"
        );
    }

    #[test]
    fn an_eviction_size_is_kept_in_bytes() {
        let config = load_ok("config.yaml", &kubelet("evictionHard:\n  imagefs.available: 10Gi\n"));
        assert_eq!(
            config.eviction_imagefs_available,
            Some(EvictionThreshold::Bytes(10 << 30))
        );
    }

    #[test]
    fn eviction_threshold_values() {
        let cases = [
            ("15%", EvictionThreshold::Percent(15.0)),
            ("7.5%", EvictionThreshold::Percent(7.5)),
            ("0%", EvictionThreshold::Percent(0.0)),
            ("1Gi", EvictionThreshold::Bytes(1 << 30)),
            ("500Mi", EvictionThreshold::Bytes(500 << 20)),
            ("1.5Gi", EvictionThreshold::Bytes(3 << 29)),
            ("10G", EvictionThreshold::Bytes(10_000_000_000)),
            ("2k", EvictionThreshold::Bytes(2_000)),
            ("1Ki", EvictionThreshold::Bytes(1_024)),
            ("1e9", EvictionThreshold::Bytes(1_000_000_000)),
            ("1E3", EvictionThreshold::Bytes(1_000)),
            ("1Ti", EvictionThreshold::Bytes(1 << 40)),
            ("12345", EvictionThreshold::Bytes(12_345)),
            ("1500m", EvictionThreshold::Bytes(2)),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_eviction_threshold(text), Ok(expected), "{text}");
        }
        for text in ["", "lots", "-1Gi", "10GB", "150%", "-5%", "abc%", "1.2.3Gi", "20Ei"] {
            assert!(parse_eviction_threshold(text).is_err(), "{text}");
        }
        assert_eq!(EvictionThreshold::Percent(10.0).min_available_bytes(1000), 100);
        assert_eq!(EvictionThreshold::Bytes(42).min_available_bytes(1000), 42);
    }

    #[test]
    fn another_kubelet_api_version_is_a_warning() {
        let config = load_ok(
            "config.yaml",
            "apiVersion: kubelet.config.k8s.io/v1alpha9\nkind: KubeletConfiguration\nimageGCHighThresholdPercent: 90\n",
        );
        assert!(config.warnings[0].contains("v1alpha9"), "{:?}", config.warnings);
        assert_eq!(config.gc.high_threshold_percent, 90);
    }
}
