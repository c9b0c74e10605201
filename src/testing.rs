//! What every test of imagegc builds its world from: images and containers
//! as a runtime lists them, records as a previous process saved them, a
//! simulated image filesystem, the value of one series in a metrics scrape,
//! and the `imagegc` binary with the flags every process-level test passes;
//! and, for the end-to-end tests, the benches and the demo, a private real
//! runtime ([`testbed`]) and the OCI images it imports ([`oci`]).
//!
//! The unit tests, the integration tests, the benches and the example all
//! use this one module (and the fake runtime in [`crate::cri::fake`]), so a
//! fixture means the same thing everywhere. It is compiled only for tests
//! and under the `testing` feature, which the package's own dev-dependency
//! turns on: a release build has none of it. The daemon's own code must
//! never reach it.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use crate::cri::fake::RemoveEffect;
use crate::cri::{Container, Image, proto};
use crate::fs::{FsError, FsProbe, FsStats};
use crate::records::{Record, Records};

#[cfg(feature = "testing")]
pub mod oci;
#[cfg(feature = "testing")]
pub mod testbed;

/// An image with one tag (`registry.example.com/team/<name>:1.0`) and one
/// digest, named after `name`, with the id [`image_id`] gives it.
pub fn image(name: &str, size: u64) -> Image {
    let id = image_id(name);
    Image {
        repo_tags: vec![format!("registry.example.com/team/{name}:1.0")],
        repo_digests: vec![format!("registry.example.com/team/{name}@{id}")],
        id,
        size,
        pinned: false,
    }
}

/// A stable `sha256:` id for a short name: its bytes in hex, padded with
/// zeros (so ids sort like names, and the short ids of names up to six
/// bytes long differ).
pub fn image_id(name: &str) -> String {
    let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex:0<64}")
}

/// An image with the id and the tag given, and a digest of the tag's
/// repository at that id; 1 MB.
pub fn tagged_image(id: &str, tag: &str) -> Image {
    let repository = tag.split(':').next().unwrap_or(tag);
    Image {
        id: id.to_string(),
        repo_tags: vec![tag.to_string()],
        repo_digests: vec![format!("{repository}@{id}")],
        size: 1_000_000,
        pinned: false,
    }
}

/// An image tagged `docker.io/library/<id>:latest`, with no digest: the
/// form a container may name by its familiar `<id>` alone.
pub fn library_image(id: &str, size: u64) -> Image {
    Image {
        id: id.to_string(),
        repo_tags: vec![format!("docker.io/library/{id}:latest")],
        repo_digests: Vec::new(),
        size,
        pinned: false,
    }
}

/// What `ListImages` answers for `images` on the wire, to measure its size.
pub fn list_images_response(images: &[Image]) -> proto::ListImagesResponse {
    proto::ListImagesResponse {
        images: images
            .iter()
            .map(|i| proto::Image {
                id: i.id.clone(),
                repo_tags: i.repo_tags.clone(),
                repo_digests: i.repo_digests.clone(),
                size: i.size,
                ..Default::default()
            })
            .collect(),
    }
}

/// A running container whose spec names `image`'s tag and whose
/// `image_ref` is its id, as containerd reports them.
pub fn container_using(id: &str, image: &Image) -> Container {
    Container {
        id: id.to_string(),
        pod_sandbox_id: format!("pod-{id}"),
        name: id.to_string(),
        image: image.repo_tags.first().cloned().unwrap_or_default(),
        image_ref: image.id.clone(),
        image_id: String::new(),
        state: None,
        mounted_images: Vec::new(),
        mounts_unknown: false,
    }
}

/// A container that names its image by `reference` alone, both in its spec
/// and in `image_ref`.
pub fn container_naming(id: &str, reference: &str) -> Container {
    Container {
        id: id.to_string(),
        image: reference.to_string(),
        image_ref: reference.to_string(),
        ..Default::default()
    }
}

/// A record of `image` as a previous process would have saved it.
pub fn history(image: &Image, first_seen: SystemTime, last_used: SystemTime) -> (String, Record) {
    (
        image.id.clone(),
        Record {
            first_seen,
            last_used,
            size: image.size,
            pinned: image.pinned,
            tags: image.repo_tags.clone(),
            digests: image.repo_digests.clone(),
            from_history: true,
            ever_used: last_used > first_seen,
        },
    )
}

/// Records made of [`history`] entries.
pub fn records(entries: impl IntoIterator<Item = (String, Record)>) -> Records {
    Records::from_map(entries)
}

/// A simulated image filesystem: its capacity, its available bytes, and
/// what each image really occupies. Clones share one disk, so a test keeps
/// one to look at and change while the collector measures another.
#[derive(Clone, Default)]
pub struct SimDisk(Arc<Mutex<DiskState>>);

#[derive(Default)]
struct DiskState {
    capacity: u64,
    available: u64,
    on_disk: HashMap<String, u64>,
    zero_capacity: bool,
    measurements: usize,
    /// Paths under which another filesystem is mounted (see
    /// [`SimDisk::other_filesystem_at`]).
    elsewhere: Vec<std::path::PathBuf>,
}

/// The simulated disk's filesystem id, and that of the filesystem mounted
/// elsewhere.
const SIM_FILESYSTEM_ID: u64 = 1;
const OTHER_FILESYSTEM_ID: u64 = 2;

impl SimDisk {
    pub fn new(capacity: u64, available: u64) -> Self {
        let disk = SimDisk::default();
        disk.set(capacity, available);
        disk
    }

    fn lock(&self) -> MutexGuard<'_, DiskState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn set(&self, capacity: u64, available: u64) {
        let mut state = self.lock();
        state.capacity = capacity;
        state.available = available;
    }

    pub fn set_available(&self, available: u64) {
        self.lock().available = available;
    }

    pub fn available(&self) -> u64 {
        self.lock().available
    }

    /// The image really occupies `bytes` (whatever size the runtime reports).
    pub fn occupy(&self, image_id: &str, bytes: u64) {
        self.lock().on_disk.insert(image_id.to_string(), bytes);
    }

    /// statvfs answers a capacity of 0 (the real probe turns it into
    /// [`FsError::ZeroCapacity`]).
    pub fn report_zero_capacity(&self) {
        self.lock().zero_capacity = true;
    }

    /// Another filesystem (roomy, empty) is mounted at `path`: a path under
    /// it is measured there, with another filesystem id.
    pub fn other_filesystem_at(&self, path: impl AsRef<Path>) {
        self.lock().elsewhere.push(path.as_ref().to_path_buf());
    }

    /// How many times the filesystem was measured.
    pub fn measurements(&self) -> usize {
        self.lock().measurements
    }

    /// The effect to give [`FakeRuntime::on_remove`](crate::cri::fake::FakeRuntime::on_remove):
    /// a removed image frees what it [occupied](Self::occupy), nothing if
    /// it occupied nothing.
    pub fn free_on_remove(&self) -> RemoveEffect {
        let disk = self.clone();
        Arc::new(move |image: &Image| disk.release(&image.id))
    }

    /// The effect to give [`FakeRuntime::on_remove`](crate::cri::fake::FakeRuntime::on_remove):
    /// a removed image frees the size the runtime lists for it.
    pub fn free_listed_size_on_remove(&self) -> RemoveEffect {
        let disk = self.clone();
        Arc::new(move |image: &Image| disk.give_back(image.size))
    }

    /// The image is gone: what it occupied is available again.
    pub fn release(&self, image_id: &str) {
        let freed = self.lock().on_disk.remove(image_id).unwrap_or(0);
        self.give_back(freed);
    }

    fn give_back(&self, bytes: u64) {
        let mut state = self.lock();
        state.available = (state.available + bytes).min(state.capacity);
    }
}

impl FsProbe for SimDisk {
    fn stats(&self, path: &Path) -> Result<FsStats, FsError> {
        let mut state = self.lock();
        state.measurements += 1;
        if state.elsewhere.iter().any(|other| path.starts_with(other)) {
            return Ok(FsStats {
                capacity_bytes: 1 << 40,
                available_bytes: 1 << 40,
                free_bytes: 1 << 40,
                filesystem_id: OTHER_FILESYSTEM_ID,
                ..Default::default()
            });
        }
        if state.zero_capacity || state.capacity == 0 {
            return Err(FsError::ZeroCapacity {
                path: path.display().to_string(),
            });
        }
        Ok(FsStats {
            capacity_bytes: state.capacity,
            available_bytes: state.available,
            free_bytes: state.available,
            filesystem_id: SIM_FILESYSTEM_ID,
            ..Default::default()
        })
    }
}

/// The value of `series` (its name and labels, exactly as exposed, e.g.
/// `imagegc_runtime_up` or `imagegc_images_removed_total{reason="age"}`)
/// in a scrape of `/metrics`.
pub fn metric(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

/// The `imagegc` binary at `binary` (a test passes
/// `env!("CARGO_BIN_EXE_imagegc")`) with the flags every process-level test
/// passes, and none of the environment that would change what it reads or
/// logs: no `IMAGEGC_CONFIG`, `NOTIFY_SOCKET` or `RUST_LOG`.
pub fn imagegc_command(binary: impl AsRef<Path>, config: &Path, endpoint: &str, state_dir: &Path) -> Command {
    let mut command = Command::new(binary.as_ref());
    command
        .env_remove("IMAGEGC_CONFIG")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("RUST_LOG")
        .arg("--config")
        .arg(config)
        .arg("--runtime-endpoint")
        .arg(endpoint)
        .arg("--state-dir")
        .arg(state_dir)
        .stdin(Stdio::null());
    command
}
