//! A node's image usage over time, as the replay reads it: the layers
//! (each with its size, stored once on disk however many images share
//! it), the images (a name and their layers), and the events in time
//! order: a container starts naming an image (which the node pulls when it
//! is not on disk), a container goes away.
//!
//! A trace comes from a synthetic workload ([`super::workload`]) or from a
//! file of JSON lines ([`Trace::read`]), one event per line:
//!
//! ```text
//! {"at":0,"ev":"image","id":"sha256:ab..","name":"ghcr.io/o/app:1","layers":[["sha256:01..",1048576]]}
//! {"at":5,"ev":"start","container":"c1","image":"sha256:ab.."}
//! {"at":95,"ev":"stop","container":"c1"}
//! {"at":300,"ev":"disk","capacity":21474836480,"used":9663676416}
//! {"at":300,"ev":"removed","image":"sha256:ab..","by":"imagegc"}
//! ```
//!
//! `at` is in seconds (any origin: the replay starts at the first event).
//! An image is announced before a container names it; an image without
//! layers counts as one layer of its `size`. A container "goes away" when
//! the runtime stops listing it (an exited container still holds its
//! image). `disk` and `removed` lines say what the node did and had; the
//! replay reads only the first disk line's capacity (the default budget)
//! and leaves removals to the policy under test.
//!
//! A log the daemon records (`crate::usage_log`) adds what a recording
//! needs: `names` on an image line (its other tags and digests), and a
//! `running` line, `{"at":..,"ev":"running","containers":[["c1","sha256:ab.."]]}`,
//! the whole set of containers listed at that instant, written when a
//! process starts recording and at the top of each file after rotation:
//! containers running before it and absent from it stop, the others in it
//! start (those already running go on). A start of a container already
//! running on the same image goes on too. A line cut short (a crash in the
//! middle of an append) is skipped; [`Trace::read_log`] reads a rotated
//! log (`FILE.1`, then `FILE`). A line longer than [`MAX_LINE_BYTES`] is
//! an error naming it: no trace has one, and a file that is not a trace
//! (`/dev/zero`) is not read whole into memory.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The longest line a trace may have, in bytes. The longest a recorded log
/// writes are a `running` line (about 150 bytes per container listed) and
/// an image line with every name of the image (tags of up to 64 KiB each):
/// 64 MiB holds 400,000 containers, or a thousand names of the longest
/// kind.
pub const MAX_LINE_BYTES: usize = 64 * 1024 * 1024;

/// Seconds since the start of the trace.
pub type Seconds = u64;

/// One image: its name and the layers it is made of (indices into
/// [`Trace::layers`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceImage {
    /// The image id (unique in the trace).
    pub id: String,
    /// A name people would know it by (a tag).
    pub name: String,
    /// Its layers, bottom first.
    pub layers: Vec<u32>,
}

/// What happens at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// A container is created naming the image (an index into
    /// [`Trace::images`]); the node pulls what it lacks of the image first.
    Start {
        /// The container, unique among those listed at the time.
        container: u64,
        /// The image.
        image: u32,
    },
    /// The container is gone from the runtime's listing.
    Stop {
        /// The container.
        container: u64,
    },
}

/// An action at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceEvent {
    /// When, in seconds since the start of the trace.
    pub at: Seconds,
    /// What.
    pub action: Action,
}

/// A node's usage: layers, images, events in time order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    /// Layer sizes in bytes, by index (the digest only matters while
    /// reading a file).
    pub layers: Vec<u64>,
    /// Images, by index.
    pub images: Vec<TraceImage>,
    /// Events, sorted by time (stable: events at one instant keep their
    /// order).
    pub events: Vec<TraceEvent>,
    /// The disk capacity the node had, when the trace says (a recorded
    /// log's first `disk` line).
    pub capacity: Option<u64>,
}

impl Trace {
    /// The bytes of an image: its layers added up (what a runtime reports
    /// as its size).
    pub fn image_bytes(&self, image: u32) -> u64 {
        self.images[image as usize]
            .layers
            .iter()
            .fold(0u64, |sum, &l| sum.saturating_add(self.layers[l as usize]))
    }

    /// Every distinct layer of the images containers start, its bytes
    /// added up once: what the disk would need to keep every image the
    /// trace uses (images never started do not count).
    pub fn unique_bytes(&self) -> u64 {
        let mut counted = vec![false; self.layers.len()];
        let mut bytes = 0u64;
        for event in &self.events {
            if let Action::Start { image, .. } = event.action {
                for &l in &self.images[image as usize].layers {
                    if !std::mem::replace(&mut counted[l as usize], true) {
                        bytes = bytes.saturating_add(self.layers[l as usize]);
                    }
                }
            }
        }
        bytes
    }

    /// How many containers start.
    pub fn starts(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e.action, Action::Start { .. }))
            .count()
    }

    /// The most bytes of layers ever in use at once (by containers
    /// listed at the same time): what no collector can remove.
    pub fn peak_in_use_bytes(&self) -> u64 {
        let mut refs = vec![0u32; self.layers.len()];
        let mut running: HashMap<u64, u32> = HashMap::new();
        let (mut bytes, mut peak) = (0u64, 0u64);
        for event in &self.events {
            match event.action {
                Action::Start { container, image } => {
                    running.insert(container, image);
                    for &l in &self.images[image as usize].layers {
                        refs[l as usize] += 1;
                        if refs[l as usize] == 1 {
                            bytes = bytes.saturating_add(self.layers[l as usize]);
                        }
                    }
                    peak = peak.max(bytes);
                }
                Action::Stop { container } => {
                    let Some(image) = running.remove(&container) else {
                        continue;
                    };
                    for &l in &self.images[image as usize].layers {
                        refs[l as usize] -= 1;
                        if refs[l as usize] == 0 {
                            bytes = bytes.saturating_sub(self.layers[l as usize]);
                        }
                    }
                }
            }
        }
        peak
    }

    /// How long the trace runs: the last event's time.
    pub fn duration(&self) -> Seconds {
        self.events.last().map_or(0, |e| e.at)
    }

    /// The part of the trace from `from` to `to` (exclusive), on its own
    /// clock (`from` is 0), with only the images `keep` keeps: what a node
    /// saw in that time. A container running at `from` starts at 0; one
    /// still running at `to` runs on to the end. Only the images and
    /// layers the part uses are in it, renumbered.
    pub fn window(&self, from: Seconds, to: Seconds, keep: impl Fn(&TraceImage) -> bool) -> Trace {
        let mut images: HashMap<u32, u32> = HashMap::new();
        let mut layers: HashMap<u32, u32> = HashMap::new();
        let mut part = Trace {
            capacity: self.capacity,
            ..Trace::default()
        };
        let mut image_of = |part: &mut Trace, image: u32| -> Option<u32> {
            if let Some(&index) = images.get(&image) {
                return Some(index);
            }
            let def = &self.images[image as usize];
            if !keep(def) {
                return None;
            }
            let index = part.images.len() as u32;
            let own = def
                .layers
                .iter()
                .map(|&l| {
                    *layers.entry(l).or_insert_with(|| {
                        part.layers.push(self.layers[l as usize]);
                        (part.layers.len() - 1) as u32
                    })
                })
                .collect();
            part.images.push(TraceImage {
                id: def.id.clone(),
                name: def.name.clone(),
                layers: own,
            });
            images.insert(image, index);
            Some(index)
        };
        // Containers running at `from`, in the order they started.
        let mut running: Vec<(u64, u32)> = Vec::new();
        let before = self.events.partition_point(|e| e.at < from);
        for event in &self.events[..before] {
            match event.action {
                Action::Start { container, image } => running.push((container, image)),
                Action::Stop { container } => running.retain(|&(c, _)| c != container),
            }
        }
        let mut kept: std::collections::HashSet<u64> = std::collections::HashSet::new();
        for (container, image) in running {
            if let Some(image) = image_of(&mut part, image) {
                kept.insert(container);
                part.events.push(TraceEvent {
                    at: 0,
                    action: Action::Start { container, image },
                });
            }
        }
        for event in self.events[before..].iter().take_while(|e| e.at < to) {
            let action = match event.action {
                Action::Start { container, image } => match image_of(&mut part, image) {
                    Some(image) => {
                        kept.insert(container);
                        Action::Start { container, image }
                    }
                    None => continue,
                },
                Action::Stop { container } if kept.remove(&container) => Action::Stop { container },
                Action::Stop { .. } => continue,
            };
            part.events.push(TraceEvent {
                at: event.at - from,
                action,
            });
        }
        part
    }

    /// Sorts the events by time, keeping the order of simultaneous ones.
    pub fn sort(&mut self) {
        self.events.sort_by_key(|e| e.at);
    }

    /// Writes the trace as JSON lines (the format [`Trace::read`] reads):
    /// each image is announced right before its first start, the first one
    /// at second 0, so that the trace reads back on the same clock (a
    /// reader starts at the first line).
    pub fn write(&self, out: &mut impl Write) -> std::io::Result<()> {
        let mut announced = vec![false; self.images.len()];
        let mut first = true;
        for event in &self.events {
            let line = match event.action {
                Action::Start { container, image } => {
                    if !std::mem::replace(&mut announced[image as usize], true) {
                        let def = &self.images[image as usize];
                        let image_line = Line::Image {
                            id: def.id.clone(),
                            name: def.name.clone(),
                            names: Vec::new(),
                            size: None,
                            layers: def
                                .layers
                                .iter()
                                .map(|&l| (layer_digest(l), self.layers[l as usize]))
                                .collect(),
                        };
                        let at = if std::mem::take(&mut first) { 0 } else { event.at };
                        write_line(out, at, image_line)?;
                    }
                    Line::Start {
                        container: container.to_string(),
                        image: self.images[image as usize].id.clone(),
                    }
                }
                Action::Stop { container } => Line::Stop {
                    container: container.to_string(),
                },
            };
            write_line(out, event.at, line)?;
        }
        Ok(())
    }

    /// Reads a trace from JSON lines. Lines of kinds the replay does not
    /// use (`removed`) are skipped, and so is a line cut short (a crash
    /// in the middle of an append); a malformed line, a start naming an
    /// unannounced image, or a stop of an unknown container is an error
    /// naming the line.
    pub fn read(input: impl BufRead) -> Result<Trace, TraceError> {
        let mut reader = Reader::default();
        reader.feed(input)?;
        Ok(reader.finish())
    }

    /// Reads a recorded log: its rotated file `PATH.1` first, when there
    /// is one, then `PATH`, as one trace.
    pub fn read_log(path: &Path) -> Result<Trace, TraceFileError> {
        Trace::read_log_sampled(path, 1.0)
    }

    /// [`Trace::read_log`], keeping only a sample of `rate` of the images
    /// (see [`sampled`]) and the containers that name them: what is held
    /// grows with the sample, not with the log's images.
    pub fn read_log_sampled(path: &Path, rate: f64) -> Result<Trace, TraceFileError> {
        let mut reader = Reader {
            rate,
            ..Reader::default()
        };
        let mut rotated = path.as_os_str().to_owned();
        rotated.push(".1");
        let rotated = PathBuf::from(rotated);
        for (file, required) in [(&rotated, false), (&path.to_path_buf(), true)] {
            let opened = match std::fs::File::open(file) {
                Ok(opened) => opened,
                Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    return Err(TraceFileError {
                        path: file.clone(),
                        message: e.to_string(),
                    });
                }
            };
            reader.feed(BufReader::new(opened)).map_err(|e| TraceFileError {
                path: file.clone(),
                message: e.to_string(),
            })?;
        }
        Ok(reader.finish())
    }
}

/// What reading a trace keeps between lines (and between the two files
/// of a rotated log).
struct Reader {
    /// The share of the images kept (see [`sampled`]).
    rate: f64,
    /// Running containers whose image is not in the sample.
    unsampled: std::collections::HashSet<String>,
    trace: Trace,
    layers: HashMap<String, u32>,
    images: HashMap<String, u32>,
    /// Running containers: their number and image.
    containers: HashMap<String, (u64, u32)>,
    next_container: u64,
    origin: Option<Seconds>,
}

impl Default for Reader {
    fn default() -> Self {
        Reader {
            rate: 1.0,
            unsampled: Default::default(),
            trace: Trace::default(),
            layers: HashMap::new(),
            images: HashMap::new(),
            containers: HashMap::new(),
            next_container: 0,
            origin: None,
        }
    }
}

impl Reader {
    fn feed(&mut self, mut input: impl BufRead) -> Result<(), TraceError> {
        let mut line = Vec::new();
        for number in 1.. {
            line.clear();
            // At most one byte past the limit is read: enough to tell.
            let read = (&mut input)
                .take(MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut line)
                .map_err(|e| TraceError::at(number, e.to_string()))?;
            if read == 0 {
                break;
            }
            if line.last() == Some(&b'\n') {
                line.pop();
            } else if line.len() > MAX_LINE_BYTES {
                return Err(TraceError::at(
                    number,
                    format!(
                        "longer than {} MiB with no end of line: not a trace",
                        MAX_LINE_BYTES / (1024 * 1024)
                    ),
                ));
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let record: TraceLine = match serde_json::from_slice(&line) {
                Ok(record) => record,
                // Cut short: a crash in the middle of an append.
                Err(e) if e.is_eof() => continue,
                Err(e) => return Err(TraceError::at(number, e.to_string())),
            };
            self.line(number, record)?;
        }
        Ok(())
    }

    fn line(&mut self, number: usize, TraceLine { at, line: what }: TraceLine) -> Result<(), TraceError> {
        let origin = *self.origin.get_or_insert(at);
        let at = at.saturating_sub(origin);
        match what {
            Line::Image {
                id,
                name,
                size,
                layers: listed,
                ..
            } => {
                if self.images.contains_key(&id) || !sampled(&id, self.rate) {
                    // Announced again (pulled again after a removal, or
                    // a recording's restart): same layers.
                    return Ok(());
                }
                let trace = &mut self.trace;
                let mut own = Vec::with_capacity(listed.len().max(1));
                if listed.is_empty() {
                    // No layers known: the image is one layer of its own.
                    let index = u32::try_from(trace.layers.len())
                        .map_err(|_| TraceError::at(number, "too many layers".into()))?;
                    trace.layers.push(size.unwrap_or(0));
                    own.push(index);
                }
                for (digest, bytes) in listed {
                    let next = u32::try_from(trace.layers.len())
                        .map_err(|_| TraceError::at(number, "too many layers".into()))?;
                    let index = *self.layers.entry(digest).or_insert_with(|| {
                        trace.layers.push(bytes);
                        next
                    });
                    own.push(index);
                }
                let index =
                    u32::try_from(trace.images.len()).map_err(|_| TraceError::at(number, "too many images".into()))?;
                self.images.insert(id.clone(), index);
                trace.images.push(TraceImage { id, name, layers: own });
            }
            Line::Start { container, image } => self.start(number, at, container, &image)?,
            Line::Stop { container } => {
                if self.unsampled.remove(&container) {
                    return Ok(());
                }
                let Some((id, _)) = self.containers.remove(&container) else {
                    return Err(TraceError::at(
                        number,
                        format!("stop of container {container}, never started"),
                    ));
                };
                self.trace.events.push(TraceEvent {
                    at,
                    action: Action::Stop { container: id },
                });
            }
            Line::Running { containers } => {
                let listed: HashMap<&str, &str> = containers.iter().map(|(c, i)| (c.as_str(), i.as_str())).collect();
                let mut gone: Vec<(String, u64)> = self
                    .containers
                    .iter()
                    .filter(|(c, (_, image))| {
                        listed
                            .get(c.as_str())
                            .is_none_or(|named| self.images.get(*named) != Some(image))
                    })
                    .map(|(c, (id, _))| (c.clone(), *id))
                    .collect();
                gone.sort_by_key(|(_, id)| *id);
                self.unsampled.retain(|c| listed.contains_key(c.as_str()));
                for (container, id) in gone {
                    self.containers.remove(&container);
                    self.trace.events.push(TraceEvent {
                        at,
                        action: Action::Stop { container: id },
                    });
                }
                for (container, image) in containers {
                    self.start(number, at, container, &image)?;
                }
            }
            Line::Disk { capacity, .. } => {
                self.trace.capacity.get_or_insert(capacity);
            }
            Line::Removed { .. } => {}
        }
        Ok(())
    }

    /// A container starts naming `image`; one already running on it goes on.
    fn start(&mut self, number: usize, at: Seconds, container: String, image: &str) -> Result<(), TraceError> {
        if !sampled(image, self.rate) {
            self.unsampled.insert(container);
            return Ok(());
        }
        let Some(&image) = self.images.get(image) else {
            return Err(TraceError::at(
                number,
                format!("start names image {image}, not announced"),
            ));
        };
        if let Some(&(_, running)) = self.containers.get(&container) {
            if running == image {
                return Ok(());
            }
            return Err(TraceError::at(
                number,
                format!("container {container} started twice (on another image, without a stop)"),
            ));
        }
        // A fresh number per container (a counter: ids of containers
        // gone are not given again).
        let id = self.next_container;
        self.next_container += 1;
        self.containers.insert(container, (id, image));
        self.trace.events.push(TraceEvent {
            at,
            action: Action::Start { container: id, image },
        });
        Ok(())
    }

    fn finish(mut self) -> Trace {
        self.trace.sort();
        self.trace
    }
}

/// Whether the image `id` is in a sample of `rate` of the images: by a
/// hash of the id, so that the same images are in it at every judgement.
pub fn sampled(id: &str, rate: f64) -> bool {
    if rate >= 1.0 {
        return true;
    }
    // FNV-1a: stable across builds and platforms.
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    ((hash >> 11) as f64 / (1u64 << 53) as f64) < rate
}

/// A layer's made-up digest in a written synthetic trace.
fn layer_digest(layer: u32) -> String {
    format!("sha256:{layer:064x}")
}

fn write_line(out: &mut impl Write, at: Seconds, line: Line) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, &TraceLine { at, line })?;
    out.write_all(b"\n")
}

/// A line of a trace file: when, and what.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TraceLine {
    /// Seconds.
    pub at: Seconds,
    /// What.
    #[serde(flatten)]
    pub line: Line,
}

/// What a line of a trace file says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case")]
pub(crate) enum Line {
    /// An image appeared.
    Image {
        /// Its id.
        id: String,
        /// A name (its first tag).
        #[serde(default)]
        name: String,
        /// Its other names (tags, then repository digests), in a recorded log.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        names: Vec<String>,
        /// Its reported size, for an image whose layers are not known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        size: Option<u64>,
        /// `[digest, bytes]` per layer, when known.
        #[serde(default)]
        layers: Vec<(String, u64)>,
    },
    /// A container appeared, naming an image by id.
    Start {
        /// The container's id.
        container: String,
        /// The image's id.
        image: String,
    },
    /// A container is gone.
    Stop {
        /// The container's id.
        container: String,
    },
    /// Every container listed at this instant, `[container, image id]`:
    /// those running before and absent here stop, the others start.
    Running {
        /// The containers and their images.
        containers: Vec<(String, String)>,
    },
    /// The image filesystem, measured.
    Disk {
        /// Capacity in bytes.
        capacity: u64,
        /// Used bytes.
        used: u64,
    },
    /// An image was removed.
    Removed {
        /// Its id.
        image: String,
        /// Who removed it (`imagegc`, or `other` when it went unasked).
        by: String,
        /// Its last known size, for an image someone else removed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bytes: Option<u64>,
    },
}

/// A log file that cannot be read, naming the file.
#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct TraceFileError {
    /// The file (`FILE` or its rotated `FILE.1`).
    pub path: PathBuf,
    /// Why it cannot be read.
    pub message: String,
}

/// A trace file that cannot be read, with the line.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct TraceError {
    /// The line, from 1.
    pub line: usize,
    /// What is wrong with it.
    pub message: String,
}

impl TraceError {
    fn at(line: usize, message: String) -> Self {
        TraceError { line, message }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_trace_reads_back_with_shared_layers_stored_once() {
        let trace = Trace {
            layers: vec![100, 20, 30],
            images: vec![
                TraceImage {
                    id: "sha256:a".into(),
                    name: "app:1".into(),
                    layers: vec![0, 1],
                },
                TraceImage {
                    id: "sha256:b".into(),
                    name: "app:2".into(),
                    layers: vec![0, 2],
                },
            ],
            events: vec![
                TraceEvent {
                    at: 5,
                    action: Action::Start { container: 7, image: 0 },
                },
                TraceEvent {
                    at: 10,
                    action: Action::Start { container: 8, image: 1 },
                },
                TraceEvent {
                    at: 20,
                    action: Action::Stop { container: 7 },
                },
            ],
            capacity: None,
        };
        let mut text = Vec::new();
        trace.write(&mut text).unwrap();
        let back = Trace::read(text.as_slice()).unwrap();
        assert_eq!(back.layers, [100, 20, 30]);
        assert_eq!(back.images[1].layers, [0, 2], "the base layer is one layer");
        assert_eq!(back.image_bytes(1), 130);
        assert_eq!(back.unique_bytes(), 150);
        assert_eq!(back.duration(), 20, "on the same clock");
        assert_eq!(back.events[0].at, 5);
        assert_eq!(back.events.len(), 3);
        assert!(matches!(back.events[2].action, Action::Stop { .. }));
    }

    #[test]
    fn a_recorded_log_starts_at_its_first_line_and_names_bad_lines() {
        let log = concat!(
            r#"{"at":1000,"ev":"disk","capacity":5000,"used":10}"#,
            "\n",
            r#"{"at":1000,"ev":"image","id":"x","size":70}"#,
            "\n",
            r#"{"at":1060,"ev":"start","container":"c","image":"x"}"#,
            "\n",
            r#"{"at":1100,"ev":"removed","image":"x","by":"imagegc"}"#,
            "\n",
        );
        let trace = Trace::read(log.as_bytes()).unwrap();
        assert_eq!(trace.capacity, Some(5000));
        assert_eq!(trace.layers, [70], "an image without layers is one layer");
        assert_eq!(trace.events[0].at, 60);
        let err = Trace::read(r#"{"at":1,"ev":"start","container":"c","image":"nope"}"#.as_bytes()).unwrap_err();
        assert_eq!(err.line, 1);
        assert!(err.message.contains("nope"), "{err}");
        let err = Trace::read("\n{\"at\":1,\"ev\":\"bogus\"}".as_bytes()).unwrap_err();
        assert_eq!(err.line, 2);
    }

    #[test]
    fn a_line_cut_short_is_skipped_and_a_running_line_reconciles_containers() {
        let log = concat!(
            r#"{"at":0,"ev":"image","id":"a","size":10}"#,
            "\n",
            r#"{"at":0,"ev":"image","id":"b","size":20}"#,
            "\n",
            r#"{"at":1,"ev":"start","container":"x","image":"a"}"#,
            "\n",
            r#"{"at":2,"ev":"start","container":"y","image":"a"}"#,
            "\n",
            // A crash in the middle of an append, then a restart's listing:
            // x still runs, y went meanwhile, z is new.
            r#"{"at":3,"ev":"start","cont"#,
            "\n",
            r#"{"at":9,"ev":"running","containers":[["x","a"],["z","b"]]}"#,
            "\n",
            r#"{"at":9,"ev":"start","container":"z","image":"b"}"#,
            "\n",
            r#"{"at":10,"ev":"stop","container":"z"}"#,
        );
        let trace = Trace::read(log.as_bytes()).unwrap();
        let actions: Vec<(Seconds, Action)> = trace.events.iter().map(|e| (e.at, e.action)).collect();
        assert_eq!(
            actions,
            [
                (1, Action::Start { container: 0, image: 0 }),
                (2, Action::Start { container: 1, image: 0 }),
                (9, Action::Stop { container: 1 }),
                (9, Action::Start { container: 2, image: 1 }),
                (10, Action::Stop { container: 2 }),
            ]
        );
        // The same line cut short at the very end (no newline) is skipped too.
        let torn = format!(
            "{}\n{}",
            r#"{"at":0,"ev":"image","id":"a","size":10}"#, r#"{"at":1,"ev":"sta"#
        );
        assert_eq!(Trace::read(torn.as_bytes()).unwrap().images.len(), 1);
        // A whole line that says something wrong is still an error.
        let err = Trace::read(r#"{"at":1,"ev":"start","container":"x"}"#.as_bytes()).unwrap_err();
        assert_eq!(err.line, 1);
    }

    #[test]
    fn a_rotated_log_is_read_older_file_first_and_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.jsonl");
        std::fs::write(
            dir.path().join("usage.jsonl.1"),
            "{\"at\":100,\"ev\":\"image\",\"id\":\"a\",\"size\":10}\n{\"at\":100,\"ev\":\"start\",\"container\":\"x\",\"image\":\"a\"}\n",
        )
        .unwrap();
        std::fs::write(&path, "{\"at\":160,\"ev\":\"stop\",\"container\":\"x\"}\n").unwrap();
        let trace = Trace::read_log(&path).unwrap();
        assert_eq!(trace.starts(), 1);
        assert_eq!(trace.duration(), 60);
        std::fs::write(&path, "{\"at\":160,\"ev\":\"stop\",\"container\":\"nope\"}\n").unwrap();
        let err = Trace::read_log(&path).unwrap_err();
        assert_eq!(err.path, path);
        assert!(err.to_string().contains("line 1: stop of container nope"), "{err}");
    }

    #[test]
    fn a_line_past_the_limit_is_an_error_naming_it_not_read_whole() {
        // Two good lines, then bytes with no end of line (/dev/zero).
        let good = "{\"at\":0,\"ev\":\"image\",\"id\":\"a\",\"size\":10}\n\n";
        let endless = good
            .as_bytes()
            .chain(std::io::repeat(0).take(2 * MAX_LINE_BYTES as u64));
        let err = Trace::read(std::io::BufReader::new(endless)).unwrap_err();
        assert_eq!(err.line, 3, "{err}");
        assert!(err.to_string().contains("longer than 64 MiB"), "{err}");
        // A line of exactly the limit is read (and judged on what it says).
        let mut long = vec![b' '; MAX_LINE_BYTES];
        long.push(b'\n');
        long.extend_from_slice(good.as_bytes());
        assert_eq!(Trace::read(long.as_slice()).unwrap().images.len(), 1);
        // The file is named, with the line.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("zeros");
        std::fs::write(&path, vec![0u8; MAX_LINE_BYTES + 1]).unwrap();
        let err = Trace::read_log(&path).unwrap_err();
        assert_eq!(err.path, path);
        assert!(err.to_string().contains("line 1: longer than"), "{err}");
    }
}
