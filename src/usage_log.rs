//! The usage log: what the daemon observes of the node's images, recorded
//! in `<state dir>/usage.jsonl` in the trace format `imagegc simulate
//! --log` replays (see [`crate::sim::trace`]), rotated by size to
//! `usage.jsonl.1`: at a listing, once the file holds [`ROTATE_BYTES`]
//! more than its whole listing.
//!
//! It records an image appearing (its id, size and names: CRI tells no
//! layer digests, so an image is one layer of its reported size and
//! images sharing layers count them twice), a container starting or
//! stopping its use of an image (seen at each listing, a cycle's or a
//! poll's between cycles: a container created and gone between two
//! listings is not recorded), an image removed and by whom (`imagegc`, or
//! `other` when it went without imagegc asking), and the image
//! filesystem's capacity and usage at each cycle (and between cycles when
//! usage moved by a percent of capacity or more).
//!
//! The engine's events come in through [`UsageLog`] as a [`Sink`]: the
//! lines are made under a lock held for microseconds, queued, and appended
//! by a thread of its own, so that the daemon's loop never waits for the
//! disk. What is kept between listings is small: each image's id, held in
//! 32 bytes, and the containers running; a whole listing is queued as the
//! listing's shared names and written line by line. Appends are crash-safe the way the journal's are
//! ([`crate::store::journal`]): one write per batch of whole lines, each batch
//! starting on a fresh line, no fsync (a power loss may lose the last
//! seconds); a reader skips a line cut short. The file is created 0600 and
//! never opened through a symbolic link. Each process starts its
//! recording, and each file after rotation starts, with every known image
//! and a `running` line of every container listed, so that a log read
//! alone (its older file rotated away) or after a restart (containers gone
//! meanwhile) is whole. When the writer falls behind by [`QUEUE_MAX_BYTES`]
//! (a disk that hangs) or cannot write, the lines queued are dropped and
//! the next listing is recorded whole again.

use std::collections::{HashMap, HashSet};
use std::io::{self, Write as _};
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::SystemTime;

use crate::engine::{Event, Sink};
use crate::fs::FsStats;
use crate::model::matching::InUse;
use crate::model::names::Names;
use crate::model::{Container, Image};
use crate::safe_file;
use crate::sim::trace::{Line, Seconds, TraceLine};
use crate::time::Clock;

/// The log's name inside the state directory (rotated to `usage.jsonl.1`).
pub const FILE_NAME: &str = "usage.jsonl";
/// A file rotates at the first listing after it passed this size beyond
/// the whole listing it starts with; one rotated file is kept, so the log
/// takes about twice this plus two whole listings on disk (a listing is
/// about 500 bytes per image with five tags).
pub const ROTATE_BYTES: u64 = 8 * 1024 * 1024;
/// The most bytes queued for the writer; past it the queue is dropped and
/// the next listing recorded whole.
pub const QUEUE_MAX_BYTES: usize = 4 * 1024 * 1024;
/// Between cycles, a disk line is written when usage moved by this percent
/// of capacity since the last one.
const DISK_STEP_PERCENT: u64 = 1;

/// What is to be done to the files, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// Append these lines.
    Append(Vec<u8>),
    /// Append a whole listing, after rotating (the current file becomes
    /// the rotated one) when `rotate`.
    Whole {
        /// Rotate first.
        rotate: bool,
        /// The listing.
        listing: Whole,
    },
}

impl Chunk {
    /// What the chunk holds in memory while queued.
    fn memory(&self) -> usize {
        match self {
            Chunk::Append(bytes) => bytes.len(),
            Chunk::Whole { listing, .. } => listing.images.len() * std::mem::size_of::<(Names, Names, u64)>(),
        }
    }

    /// The chunk as it is written (tests, benches).
    pub fn to_bytes(&self) -> Vec<u8> {
        match self {
            Chunk::Append(bytes) => bytes.clone(),
            Chunk::Whole { listing, .. } => {
                let mut out = Vec::new();
                // Writing into a Vec cannot fail.
                let _ = listing.write_to(&mut out);
                out
            }
        }
    }
}

/// A listing recorded whole: an image line for each image, then the
/// containers running. Held as the images' shared names and compact ids
/// and written line by line by the writer: on a node of 100,000 images
/// its lines are tens of megabytes, which are never in memory at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Whole {
    at: Seconds,
    /// The images' ids, sorted (shared with the recorder).
    ids: Arc<Vec<Id>>,
    /// Each image's tags, digests and size, in the ids' order.
    images: Vec<(Names, Names, u64)>,
    running: Line,
}

impl Whole {
    /// Writes the lines to `out`.
    pub fn write_to(&self, out: &mut impl io::Write) -> io::Result<()> {
        let mut line = Vec::with_capacity(1024);
        for (id, (tags, digests, size)) in self.ids.iter().zip(&self.images) {
            line.clear();
            push(&mut line, self.at, image_line(&id.to_string(), tags, digests, *size));
            out.write_all(&line)?;
        }
        line.clear();
        push(&mut line, self.at, self.running.clone());
        out.write_all(&line)
    }

    /// How many bytes [`Whole::write_to`] writes (counted, not kept).
    fn len(&self) -> u64 {
        let mut counter = Counter(0);
        let _ = self.write_to(&mut counter);
        counter.0
    }
}

/// Counts what is written to it.
struct Counter(u64);

impl io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// An image id, compact: a runtime's ids are nearly always a SHA-256
/// (`sha256:<hex>` from containerd, the bare hex from CRI-O), held as its
/// 32 bytes; any other id as it is.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Id {
    Sha256 { digest: [u8; 32], prefixed: bool },
    Other(Box<str>),
}

impl Id {
    fn of(id: &str) -> Id {
        let (hex, prefixed) = match id.strip_prefix("sha256:") {
            Some(hex) => (hex, true),
            None => (id, false),
        };
        let lower_hex = |b: u8| match b {
            b'0'..=b'9' => Some(b - b'0'),
            b'a'..=b'f' => Some(b - b'a' + 10),
            _ => None,
        };
        if hex.len() == 64 {
            let mut digest = [0u8; 32];
            let parsed = hex.as_bytes().chunks_exact(2).zip(&mut digest).all(|(pair, byte)| {
                match (lower_hex(pair[0]), lower_hex(pair[1])) {
                    (Some(high), Some(low)) => {
                        *byte = high << 4 | low;
                        true
                    }
                    _ => false,
                }
            });
            if parsed {
                return Id::Sha256 { digest, prefixed };
            }
        }
        Id::Other(id.into())
    }
}

impl std::fmt::Display for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Id::Sha256 { digest, prefixed } => {
                if *prefixed {
                    f.write_str("sha256:")?;
                }
                digest.iter().try_for_each(|b| write!(f, "{b:02x}"))
            }
            Id::Other(id) => f.write_str(id),
        }
    }
}

/// What the log records of the engine's events, as lines: pure, no IO.
#[derive(Debug)]
pub struct Recorder {
    /// The ids of the images last listed, sorted (their lines are not
    /// kept: a whole listing is written from the listing itself).
    images: Arc<Vec<Id>>,
    /// The images said removed since the last listing.
    removed: HashSet<Id>,
    /// Containers listed (a key per container and image it uses) and the image id.
    running: HashMap<String, String>,
    /// Whether this recording has written its first listing whole.
    started: bool,
    /// A cycle started and its disk reading is yet to be written.
    cycle_disk_due: bool,
    /// The last disk line's used bytes.
    last_used: Option<u64>,
    /// Bytes of the current file, as this recording counts them.
    file_bytes: u64,
    rotate_bytes: u64,
    /// The bytes of the last whole listing written.
    whole_bytes: u64,
}

impl Recorder {
    /// A recording appending to a file of `file_bytes`, rotating past
    /// `rotate_bytes`.
    pub fn new(file_bytes: u64, rotate_bytes: u64) -> Self {
        Recorder {
            images: Arc::default(),
            removed: HashSet::new(),
            running: HashMap::new(),
            started: false,
            cycle_disk_due: false,
            last_used: None,
            file_bytes,
            rotate_bytes,
            whole_bytes: 0,
        }
    }

    /// Records the next listing whole (images and a `running` line), as at
    /// the start of a recording: lines were lost.
    pub fn resync(&mut self) {
        self.started = false;
    }

    /// Rotates at the next listing (a rotation queued was dropped).
    fn rotate_at_next_listing(&mut self) {
        self.file_bytes = u64::MAX;
    }

    /// Whether `event` is one the log records (the others cost nothing).
    pub fn wants(event: &Event<'_>) -> bool {
        matches!(
            event,
            Event::Seen { .. }
                | Event::Removed(_)
                | Event::RemovedByOthers { .. }
                | Event::CycleStarted
                | Event::Usage { .. }
        )
    }

    /// The chunks `event`, observed at `at`, adds.
    pub fn record(&mut self, event: &Event<'_>, at: Seconds, out: &mut Vec<Chunk>) {
        let mut lines = Vec::new();
        match event {
            Event::Seen { images, containers } => {
                // A file rotates at a listing, which it starts whole, so
                // that a reader can go on from it alone. It holds at least
                // `rotate_bytes` past its whole listing.
                let rotate = self.file_bytes >= self.rotate_bytes.saturating_add(self.whole_bytes);
                if rotate {
                    self.started = false;
                }
                let whole = self.seen(images, containers, at, &mut lines);
                if !lines.is_empty() {
                    self.file_bytes = self.file_bytes.saturating_add(lines.len() as u64);
                    out.push(Chunk::Append(std::mem::take(&mut lines)));
                }
                if let Some(listing) = whole {
                    self.whole_bytes = listing.len();
                    self.file_bytes = if rotate { 0 } else { self.file_bytes }.saturating_add(self.whole_bytes);
                    out.push(Chunk::Whole { rotate, listing });
                }
                return;
            }
            Event::Removed(removal) if !removal.dry_run => {
                self.removed.insert(Id::of(&removal.id));
                push(&mut lines, at, removed(&removal.id, "imagegc", None));
            }
            Event::RemovedByOthers { images, .. } => {
                // Found gone (see `engine::others`): also by the listing
                // that omitted it, which wrote nothing for it.
                for image in *images {
                    self.removed.insert(Id::of(&image.id));
                    push(&mut lines, at, removed(&image.id, "other", Some(image.size)));
                }
            }
            Event::CycleStarted => self.cycle_disk_due = true,
            Event::Usage { stats, .. } => self.usage(stats, at, &mut lines),
            _ => {}
        }
        if !lines.is_empty() {
            self.file_bytes = self.file_bytes.saturating_add(lines.len() as u64);
            out.push(Chunk::Append(lines));
        }
    }

    /// Whether the last listing had this image.
    fn listed(&self, id: &Id) -> bool {
        self.images.binary_search(id).is_ok()
    }

    /// Lines for what changed since the last listing; the listing whole
    /// when this recording has not written it yet.
    fn seen(&mut self, images: &[Image], containers: &[Container], at: Seconds, lines: &mut Vec<u8>) -> Option<Whole> {
        // The ids sorted, with each one's place in the listing.
        let mut order: Vec<(Id, u32)> = (0..)
            .zip(images)
            .map(|(place, image): (u32, &Image)| (Id::of(&image.id), place))
            .collect();
        order.sort_unstable();
        order.dedup_by(|later, first| later.0 == first.0);
        let (listed, places): (Vec<Id>, Vec<u32>) = order.into_iter().unzip();
        let listed = Arc::new(listed);
        // An image gone without imagegc removing it is said when it is
        // known gone (`Event::RemovedByOthers`, right after this listing):
        // a listing alone may be partial.
        let removed_since = std::mem::take(&mut self.removed);
        let whole = !self.started;
        if !whole {
            for image in images {
                let id = Id::of(&image.id);
                if !self.listed(&id) || removed_since.contains(&id) {
                    push(
                        lines,
                        at,
                        image_line(&image.id, &image.repo_tags, &image.repo_digests, image.size),
                    );
                }
            }
        }
        self.images = listed;
        let now = running(images, containers);
        if whole {
            self.started = true;
            self.running = now;
            return Some(Whole {
                at,
                ids: Arc::clone(&self.images),
                images: places
                    .iter()
                    .map(|&place| {
                        let image = &images[place as usize];
                        (image.repo_tags.clone(), image.repo_digests.clone(), image.size)
                    })
                    .collect(),
                running: self.running_line(),
            });
        }
        let mut stops: Vec<&String> = self.running.keys().filter(|k| !now.contains_key(*k)).collect();
        stops.sort();
        for container in stops {
            push(
                lines,
                at,
                Line::Stop {
                    container: container.clone(),
                },
            );
        }
        let mut starts: Vec<(&String, &String)> = now
            .iter()
            .filter(|(k, image)| self.running.get(*k) != Some(image))
            .collect();
        starts.sort();
        for (container, image) in starts {
            if self.running.contains_key(container) {
                // The same key on another image: a stop first.
                push(
                    lines,
                    at,
                    Line::Stop {
                        container: container.clone(),
                    },
                );
            }
            push(
                lines,
                at,
                Line::Start {
                    container: container.clone(),
                    image: image.clone(),
                },
            );
        }
        self.running = now;
        None
    }

    fn usage(&mut self, stats: &FsStats, at: Seconds, lines: &mut Vec<u8>) {
        let used = stats.used_bytes();
        let step = stats.capacity_bytes / 100 * DISK_STEP_PERCENT;
        let moved = self.last_used.is_none_or(|last| last.abs_diff(used) >= step.max(1));
        if std::mem::take(&mut self.cycle_disk_due) || moved {
            self.last_used = Some(used);
            push(
                lines,
                at,
                Line::Disk {
                    capacity: stats.capacity_bytes,
                    used,
                },
            );
        }
    }

    fn running_line(&self) -> Line {
        let mut containers: Vec<(String, String)> = self
            .running
            .iter()
            .map(|(k, image)| (k.clone(), image.clone()))
            .collect();
        containers.sort();
        Line::Running { containers }
    }
}

/// The containers listed, each under a key per image it uses: its id when
/// it uses one image (the usual case), `ID/IMAGE` for each when it uses
/// several (images mounted as volumes).
fn running(images: &[Image], containers: &[Container]) -> HashMap<String, String> {
    let in_use = InUse::new(images, containers);
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    let mut seen: HashMap<&str, ()> = HashMap::new();
    for image in images {
        if seen.insert(&image.id, ()).is_some() {
            continue;
        }
        for container in in_use.containers(&image.id) {
            pairs.push((container, &image.id));
        }
    }
    let mut per_container: HashMap<&str, usize> = HashMap::new();
    for (container, _) in &pairs {
        *per_container.entry(container).or_default() += 1;
    }
    pairs
        .into_iter()
        .map(|(container, image)| {
            let key = if per_container[container] == 1 {
                container.to_string()
            } else {
                format!("{container}/{image}")
            };
            (key, image.to_string())
        })
        .collect()
}

fn image_line(id: &str, tags: &Names, digests: &Names, size: u64) -> Line {
    let mut names = tags.iter().chain(digests).map(str::to_owned);
    Line::Image {
        id: id.to_owned(),
        name: names.next().unwrap_or_default(),
        names: names.collect(),
        size: Some(size),
        layers: Vec::new(),
    }
}

fn removed(id: &str, by: &str, bytes: Option<u64>) -> Line {
    Line::Removed {
        image: id.to_string(),
        by: by.to_string(),
        bytes,
    }
}

fn push(lines: &mut Vec<u8>, at: Seconds, line: Line) {
    // Serializing plain strings and numbers into a Vec cannot fail.
    if serde_json::to_writer(&mut *lines, &TraceLine { at, line }).is_ok() {
        lines.push(b'\n');
    }
}

/// What the usage log says someone else removed (lines `"by":"other"`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RemovedByOthers {
    /// How many images.
    pub images: u64,
    /// Their last known sizes, added up.
    pub bytes: u64,
    /// When the last of them was found gone.
    pub last: Option<SystemTime>,
}

impl RemovedByOthers {
    /// The removals by others the usage log of `state_dir` recorded at or
    /// after `since` (its rotated file, then its current one). No log: none.
    pub fn read(state_dir: &Path, since: SystemTime) -> io::Result<Self> {
        use std::io::BufRead as _;
        let since = since.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let files = Files::new(state_dir);
        let mut found = RemovedByOthers::default();
        for path in [&files.rotated, &files.path] {
            let file = match safe_file::open_read(path, safe_file::Links::Refuse) {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            for line in io::BufReader::new(file).split(b'\n') {
                let line = line?;
                // Only removal lines by others are parsed; a line cut
                // short is skipped, as every reader of the log does.
                if !contains(&line, br#""by":"other""#) {
                    continue;
                }
                let Ok(TraceLine {
                    at,
                    line: Line::Removed { bytes, .. },
                }) = serde_json::from_slice::<TraceLine>(&line)
                else {
                    continue;
                };
                if at < since {
                    continue;
                }
                found.images += 1;
                found.bytes = found.bytes.saturating_add(bytes.unwrap_or(0));
                let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(at);
                found.last = found.last.max(Some(at));
            }
        }
        Ok(found)
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The log files of one state directory.
#[derive(Debug, Clone)]
pub struct Files {
    path: PathBuf,
    rotated: PathBuf,
}

impl Files {
    /// `<state_dir>/usage.jsonl` and its rotated `usage.jsonl.1`.
    pub fn new(state_dir: &Path) -> Self {
        Files {
            path: state_dir.join(FILE_NAME),
            rotated: state_dir.join(format!("{FILE_NAME}.1")),
        }
    }

    /// The current file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Does what `chunk` says.
    pub fn apply(&self, chunk: &Chunk) -> io::Result<()> {
        match chunk {
            Chunk::Append(bytes) if bytes.is_empty() => Ok(()),
            Chunk::Append(bytes) => self.open()?.write_all(bytes),
            Chunk::Whole { rotate, listing } => {
                if *rotate {
                    match std::fs::rename(&self.path, &self.rotated) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                        // The rotated file's place is taken (a directory,
                        // an immutable file): the current file starts
                        // over, its older lines lost, or it would grow
                        // without bound.
                        Err(e) => {
                            tracing::warn!(
                                rotated = %self.rotated.display(),
                                error = %e,
                                path = %self.path.display(),
                                "cannot rotate the usage log: it starts over, its older lines lost"
                            );
                            safe_file::open_append(&self.path, 0o600)?.set_len(0)?;
                        }
                    }
                }
                let file = self.open()?;
                let mut out = io::BufWriter::with_capacity(64 * 1024, file);
                listing.write_to(&mut out)?;
                out.flush()
            }
        }
    }

    /// The current file, for appending, its last line ended.
    fn open(&self) -> io::Result<std::fs::File> {
        let mut file = safe_file::open_append(&self.path, 0o600)?;
        // A last line left without its newline (a write cut short) would
        // swallow the first of these: start on a fresh line.
        let len = file.metadata()?.len();
        let mut last = [0u8; 1];
        if len > 0 && file.read_exact_at(&mut last, len - 1).is_ok() && last[0] != b'\n' {
            file.write_all(b"\n")?;
        }
        Ok(file)
    }
}

/// What the emitting side and the writer share.
struct State {
    recorder: Recorder,
    queue: Vec<Chunk>,
    queued: usize,
    closed: bool,
    /// The writer lost lines: the next listing is recorded whole.
    lost: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

/// The usage log as a [`Sink`] of the engine's events, with the thread
/// that appends its lines.
pub struct UsageLog {
    shared: Arc<Shared>,
    clock: Clock,
    writer: Mutex<Option<JoinHandle<()>>>,
    path: PathBuf,
}

impl UsageLog {
    /// Starts recording to `<state_dir>/usage.jsonl` (creating the state
    /// directory private when missing), rotating past `rotate_bytes`. An
    /// error when the file cannot be opened for appending (a symbolic link
    /// or anything but a regular file at its path, a read-only directory).
    pub fn start(state_dir: &Path, rotate_bytes: u64, clock: Clock) -> io::Result<Arc<Self>> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(state_dir)?;
        let files = Files::new(state_dir);
        let file_bytes = safe_file::open_append(files.path(), 0o600)?.metadata()?.len();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                recorder: Recorder::new(file_bytes, rotate_bytes),
                queue: Vec::new(),
                queued: 0,
                closed: false,
                lost: false,
            }),
            wake: Condvar::new(),
        });
        let path = files.path().to_path_buf();
        let writer = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("usage-log".into())
                .spawn(move || write_loop(&shared, &files))?
        };
        Ok(Arc::new(UsageLog {
            shared,
            clock,
            writer: Mutex::new(Some(writer)),
            path,
        }))
    }

    /// The current file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes what is queued and stops the writer (at shutdown); events
    /// after it are not recorded.
    pub fn close(&self) {
        {
            let mut state = self.shared.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.closed = true;
        }
        self.shared.wake.notify_all();
        if let Some(writer) = self.writer.lock().unwrap_or_else(PoisonError::into_inner).take() {
            let _ = writer.join();
        }
    }
}

impl Drop for UsageLog {
    fn drop(&mut self) {
        self.close();
    }
}

impl Sink for UsageLog {
    fn emit(&self, event: &Event<'_>) {
        if !Recorder::wants(event) {
            return;
        }
        let at = self
            .clock
            .now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut state = self.shared.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.closed {
            return;
        }
        if std::mem::take(&mut state.lost) {
            state.recorder.resync();
        }
        let mut chunks = Vec::new();
        state.recorder.record(event, at, &mut chunks);
        if chunks.is_empty() {
            return;
        }
        // One batch is queued whatever its size (a whole listing of a big
        // node is more than the bound, and is what a resync writes).
        let bytes: usize = chunks.iter().map(Chunk::memory).sum();
        if state.queued + bytes > QUEUE_MAX_BYTES.max(bytes) {
            tracing::warn!(
                queued_bytes = state.queued,
                "the usage log's writer is behind (a slow or hung disk): dropping its queue; \
                 the next listing is recorded whole"
            );
            if state
                .queue
                .iter()
                .any(|c| matches!(c, Chunk::Whole { rotate: true, .. }))
            {
                state.recorder.rotate_at_next_listing();
            }
            state.queue.clear();
            state.queued = 0;
            state.recorder.resync();
            return;
        }
        state.queued += bytes;
        state.queue.extend(chunks);
        drop(state);
        self.shared.wake.notify_one();
    }
}

fn write_loop(shared: &Shared, files: &Files) {
    let mut failing = false;
    loop {
        let chunks = {
            let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
            while state.queue.is_empty() && !state.closed {
                state = shared.wake.wait(state).unwrap_or_else(PoisonError::into_inner);
            }
            if state.queue.is_empty() {
                return;
            }
            state.queued = 0;
            std::mem::take(&mut state.queue)
        };
        for chunk in &chunks {
            match files.apply(chunk) {
                Ok(()) => failing = false,
                Err(err) => {
                    if !std::mem::replace(&mut failing, true) {
                        tracing::warn!(
                            path = %files.path().display(),
                            error = %err,
                            "could not write the usage log; the next listing is recorded whole once it can"
                        );
                    }
                    shared.state.lock().unwrap_or_else(PoisonError::into_inner).lost = true;
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Reason, Removal};
    use crate::sim::trace::{Action, Trace};
    use crate::testing::{container_using, library_image};

    fn seen<'a>(images: &'a [Image], containers: &'a [Container]) -> Event<'a> {
        Event::Seen { images, containers }
    }

    fn removal(id: &str) -> Removal {
        Removal {
            id: id.to_string(),
            tags: vec![],
            digests: vec![],
            reason: Reason::Space,
            size: 100,
            freed_bytes: Some(100),
            first_seen: SystemTime::UNIX_EPOCH,
            last_used: SystemTime::UNIX_EPOCH,
            dry_run: false,
        }
    }

    fn text(chunks: &[Chunk]) -> String {
        chunks
            .iter()
            .map(|c| String::from_utf8(c.to_bytes()).unwrap())
            .collect()
    }

    #[test]
    fn a_recording_reads_back_as_the_starts_stops_and_removals_the_node_saw() {
        let (a, b, c) = (
            library_image("a", 100),
            library_image("b", 200),
            library_image("c", 300),
        );
        let mut r = Recorder::new(0, ROTATE_BYTES);
        let mut out = Vec::new();
        let images = [a.clone(), b.clone()];
        r.record(&seen(&images, &[container_using("x", &a)]), 1000, &mut out);
        r.record(&Event::CycleStarted, 1000, &mut out);
        let stats = FsStats {
            capacity_bytes: 10_000,
            available_bytes: 4_000,
            ..Default::default()
        };
        r.record(
            &Event::Usage {
                stats: &stats,
                due: false,
            },
            1000,
            &mut out,
        );
        // A later reading within a percent of capacity says nothing new.
        let close = FsStats {
            available_bytes: 3_950,
            ..stats
        };
        r.record(
            &Event::Usage {
                stats: &close,
                due: false,
            },
            1002,
            &mut out,
        );
        // x goes, y starts on b, c is pulled.
        let images = [a.clone(), b.clone(), c.clone()];
        r.record(&seen(&images, &[container_using("y", &b)]), 1060, &mut out);
        r.record(&Event::Removed(&removal("a")), 1100, &mut out);
        // c goes without imagegc: the listing alone says nothing (it may
        // be partial); the engine's finding that it is gone does.
        let images = [b.clone()];
        r.record(&seen(&images, &[container_using("y", &b)]), 1160, &mut out);
        assert!(!text(&out).contains(r#""image":"c","by""#), "{}", text(&out));
        let gone = [crate::records::Unlisted {
            id: "c".into(),
            tags: c.repo_tags.clone(),
            size: 300,
            first_seen: SystemTime::UNIX_EPOCH,
        }];
        r.record(
            &Event::RemovedByOthers {
                images: &gone,
                at: SystemTime::UNIX_EPOCH,
            },
            1160,
            &mut out,
        );
        let log = text(&out);
        assert_eq!(log.matches("\"ev\":\"disk\"").count(), 1, "{log}");
        assert!(
            log.contains(r#"{"at":1100,"ev":"removed","image":"a","by":"imagegc"}"#),
            "{log}"
        );
        assert!(
            log.contains(r#"{"at":1160,"ev":"removed","image":"c","by":"other","bytes":300}"#),
            "{log}"
        );
        assert!(
            log.contains(r#""ev":"image","id":"b","name":"docker.io/library/b:latest","size":200"#),
            "{log}"
        );
        let trace = Trace::read(log.as_bytes()).unwrap();
        assert_eq!(trace.capacity, Some(10_000));
        assert_eq!(trace.images.len(), 3);
        assert_eq!(trace.image_bytes(1), 200, "an image is one layer of its size");
        let actions: Vec<(u64, Action)> = trace.events.iter().map(|e| (e.at, e.action)).collect();
        assert_eq!(
            actions,
            [
                (0, Action::Start { container: 0, image: 0 }),
                (60, Action::Stop { container: 0 }),
                (60, Action::Start { container: 1, image: 1 }),
            ]
        );
    }

    #[test]
    fn a_new_recording_reconciles_containers_gone_while_no_one_recorded() {
        let (a, b) = (library_image("a", 100), library_image("b", 200));
        let images = [a.clone(), b.clone()];
        let mut first = Recorder::new(0, ROTATE_BYTES);
        let mut out = Vec::new();
        first.record(
            &seen(&images, &[container_using("x", &a), container_using("y", &b)]),
            100,
            &mut out,
        );
        // A restart: y went meanwhile, x still runs.
        let mut second = Recorder::new(0, ROTATE_BYTES);
        second.record(&seen(&images, &[container_using("x", &a)]), 400, &mut out);
        let trace = Trace::read(text(&out).as_bytes()).unwrap();
        let actions: Vec<(u64, Action)> = trace.events.iter().map(|e| (e.at, e.action)).collect();
        assert_eq!(
            actions,
            [
                (0, Action::Start { container: 0, image: 0 }),
                (0, Action::Start { container: 1, image: 1 }),
                (300, Action::Stop { container: 1 }),
            ],
            "x goes on, y stops when the new recording lists"
        );
    }

    #[test]
    fn a_container_mounting_an_image_uses_both() {
        let (a, b) = (library_image("a", 100), library_image("b", 200));
        let mut x = container_using("x", &a);
        x.mounted_images = vec![b.id.clone()];
        let mut r = Recorder::new(0, ROTATE_BYTES);
        let mut out = Vec::new();
        r.record(&seen(&[a, b], &[x]), 100, &mut out);
        let trace = Trace::read(text(&out).as_bytes()).unwrap();
        assert_eq!(trace.starts(), 2);
        assert_eq!(trace.peak_in_use_bytes(), 300);
    }

    /// A node of `images` images and `containers` containers, its
    /// containers replaced one by one on new images: `steps` listings.
    fn churn(log: &UsageLog, images: usize, containers: usize, steps: usize) {
        let mut listed: Vec<Image> = (0..images)
            .map(|i| library_image(&format!("sha256:{i:064x}"), 1 << 20))
            .collect();
        let mut running: Vec<Container> = (0..containers)
            .map(|c| container_using(&format!("{c:064x}"), &listed[c]))
            .collect();
        for step in 0..steps {
            let new = library_image(&format!("sha256:{:064x}", images + step), 1 << 20);
            listed.remove(containers);
            listed.push(new.clone());
            running[step % containers] = container_using(&format!("{:064x}", containers + step), &new);
            log.emit(&seen(&listed, &running));
        }
    }

    #[test]
    fn the_log_rotates_into_two_bounded_files_each_readable_alone() {
        let dir = tempfile::tempdir().unwrap();
        let rotate = 64 * 1024;
        let log = UsageLog::start(dir.path(), rotate, Clock::start()).unwrap();
        churn(&log, 50, 10, 400);
        log.close();
        let current = dir.path().join(FILE_NAME);
        let rotated = dir.path().join(format!("{FILE_NAME}.1"));
        for file in [&current, &rotated] {
            let len = std::fs::metadata(file).unwrap().len();
            assert!(len < rotate + 16 * 1024, "{} is {len} bytes", file.display());
        }
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&current).unwrap().permissions().mode() & 0o777, 0o600);
        // The pair and the current file alone both read, with the 10
        // containers of the end running.
        for trace in [
            Trace::read_log(&current).unwrap(),
            Trace::read(std::fs::read(&current).unwrap().as_slice()).unwrap(),
        ] {
            let starts = trace.starts();
            let stops = trace.events.len() - starts;
            assert_eq!(starts - stops, 10);
        }
    }

    #[test]
    fn a_rotation_that_fails_starts_the_file_over_rather_than_let_it_grow() {
        let dir = tempfile::tempdir().unwrap();
        // The rotated file's place is taken by a directory.
        std::fs::create_dir(dir.path().join(format!("{FILE_NAME}.1"))).unwrap();
        let rotate = 64 * 1024;
        let log = UsageLog::start(dir.path(), rotate, Clock::start()).unwrap();
        churn(&log, 50, 10, 400);
        log.close();
        let current = dir.path().join(FILE_NAME);
        let len = std::fs::metadata(&current).unwrap().len();
        assert!(len < rotate + 16 * 1024, "{} is {len} bytes", current.display());
        // What is left reads alone, with the 10 containers of the end.
        let trace = Trace::read(std::fs::read(&current).unwrap().as_slice()).unwrap();
        assert_eq!(trace.starts() - (trace.events.len() - trace.starts()), 10);
    }

    #[test]
    fn a_line_cut_short_by_a_crash_is_skipped_and_the_next_recording_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let log = UsageLog::start(dir.path(), ROTATE_BYTES, Clock::start()).unwrap();
        churn(&log, 20, 5, 10);
        log.close();
        drop(log);
        let path = dir.path().join(FILE_NAME);
        let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(br#"{"at":17,"ev":"start","contai"#).unwrap();
        // Read as the crash left it: the torn last line is skipped.
        let torn = Trace::read_log(&path).unwrap();
        assert_eq!(torn.starts(), 14, "5 at the first listing, one per step after");
        // A restart records on from a fresh line: its first listing's
        // containers that ran before go on, the others start.
        let log = UsageLog::start(dir.path(), ROTATE_BYTES, Clock::start()).unwrap();
        churn(&log, 20, 5, 3);
        log.close();
        let trace = Trace::read_log(&path).unwrap();
        assert_eq!(trace.starts(), 14 + 5 + 2);
    }

    #[test]
    fn a_link_at_the_log_path_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join(FILE_NAME)).unwrap();
        let err = UsageLog::start(dir.path(), ROTATE_BYTES, Clock::start()).err().unwrap();
        assert!(err.to_string().contains("symbolic link"), "{err}");
    }

    #[test]
    fn ids_are_held_compact_and_written_as_listed() {
        let hex = "0123456789abcdef".repeat(4);
        for id in [
            format!("sha256:{hex}"),
            hex.clone(),
            hex.to_uppercase(),
            format!("sha512:{hex}"),
            "a".to_owned(),
            String::new(),
        ] {
            assert_eq!(Id::of(&id).to_string(), id);
        }
        assert!(matches!(Id::of(&hex), Id::Sha256 { prefixed: false, .. }));
        assert!(matches!(Id::of(&hex.to_uppercase()), Id::Other(_)));
        assert_ne!(Id::of(&hex), Id::of(&format!("sha256:{hex}")));
    }

    /// A node of many images with long names: its whole listing is more
    /// than the queue's bound, and is written once, then only what changes.
    #[test]
    fn a_listing_bigger_than_the_queue_is_recorded_whole_and_once() {
        let dir = tempfile::tempdir().unwrap();
        let log = UsageLog::start(dir.path(), ROTATE_BYTES, Clock::start()).unwrap();
        let mut listed: Vec<Image> = (0..12_000)
            .map(|i| {
                let mut image = library_image(&format!("sha256:{i:064x}"), 1 << 20);
                image.repo_tags = (0..5)
                    .map(|t| format!("registry.example.com/team/service-{i}:build-{t}"))
                    .collect();
                image
            })
            .collect();
        log.emit(&seen(&listed, &[]));
        listed.pop();
        log.emit(&seen(&listed, &[]));
        log.close();
        let path = dir.path().join(FILE_NAME);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.len() > QUEUE_MAX_BYTES, "the listing is {} bytes", text.len());
        assert_eq!(text.matches(r#""ev":"image""#).count(), 12_000, "each image once");
        assert_eq!(
            text.matches(r#""ev":"removed""#).count(),
            0,
            "an image a listing omits is said once known gone"
        );
        let trace = Trace::read_log(&path).unwrap();
        assert_eq!(trace.images.len(), 12_000);
    }

    /// `plan`, `images` and `check-config` read what others removed from
    /// both files, since a time, skipping a line cut short.
    #[test]
    fn removals_by_others_are_read_back_since_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let at = |s: u64| SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(s);
        assert_eq!(
            RemovedByOthers::read(dir.path(), at(0)).unwrap(),
            RemovedByOthers::default(),
            "no log: nothing"
        );
        std::fs::write(
            dir.path().join(format!("{FILE_NAME}.1")),
            concat!(
                r#"{"at":100,"ev":"removed","image":"old","by":"other","bytes":7}"#,
                "\n",
                r#"{"at":2000,"ev":"removed","image":"a","by":"other","bytes":1000}"#,
                "\n",
            ),
        )
        .unwrap();
        std::fs::write(
            dir.path().join(FILE_NAME),
            concat!(
                r#"{"at":2100,"ev":"removed","image":"mine","by":"imagegc"}"#,
                "\n",
                r#"{"at":2500,"ev":"removed","image":"b","by":"other","bytes":24}"#,
                "\n",
                r#"{"at":2600,"ev":"removed","image":"c","by":"oth"#,
            ),
        )
        .unwrap();
        assert_eq!(
            RemovedByOthers::read(dir.path(), at(1000)).unwrap(),
            RemovedByOthers {
                images: 2,
                bytes: 1024,
                last: Some(at(2500)),
            }
        );
        assert_eq!(RemovedByOthers::read(dir.path(), at(0)).unwrap().images, 3);
    }
}
