//! A private, real container runtime for one test: Debian's containerd 1.6,
//! the current containerd 2.x or the current CRI-O ([`Kind`]), with its own
//! directory, its own small ext4 filesystem as the runtime's root (so the
//! test controls capacity and usage), its own socket, and a pause image
//! built and imported here.
//!
//! Images reach containerd with `ctr images import`; they reach CRI-O the
//! way a node pulls them: pushed by `skopeo` to a private registry on
//! 127.0.0.1 that the test bed runs, then pulled over CRI, under their own
//! names (the runtime's registries.conf maps `docker.io` and
//! `registry.k8s.io` to the private registry).
//!
//! [`TestBed::start`] fails the test with the reason when the machine cannot
//! run one (not root, a tool or a runtime build missing, the runtime not
//! answering); it never skips. Dropping the test bed, also when the test
//! panics, stops pods over CRI, stops the runtime and the registry, kills
//! the shims or conmon processes started for it (by PID), unmounts
//! everything under its directory, detaches the loop device and removes the
//! directory. A cleanup that leaves something behind fails the test.

use std::collections::{BTreeSet, HashMap};
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use imagegc::cri::proto::{
    self, image_service_client::ImageServiceClient, runtime_service_client::RuntimeServiceClient,
};
use imagegc::cri::{Container, ContainerState, CriClient, Image, ImageFsUsage, Runtime};
use tonic::transport::Channel;

use crate::oci::{BuiltImage, ImageSpec};

mod cleanup;
mod setup;

/// The sandbox image every test bed imports and configures.
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.9";
/// The containerd 2.x release the test bed runs (built by
/// scripts/testbed-runtimes.sh).
pub const CONTAINERD2_VERSION: &str = "v2.4.2";
/// The CRI-O release the test bed runs (built by scripts/testbed-runtimes.sh).
pub const CRIO_VERSION: &str = "v1.36.3";

/// Which runtime a test bed runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Debian's containerd (1.6), from apt.
    Containerd16,
    /// The current containerd 2.x release, built from its Go module.
    Containerd2,
    /// The current CRI-O release, built from its Go module.
    Crio,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Containerd16 => "containerd 1.6",
            Kind::Containerd2 => "containerd 2.x",
            Kind::Crio => "CRI-O",
        }
    }

    pub fn is_containerd(self) -> bool {
        !matches!(self, Kind::Crio)
    }

    /// Whether `RemoveImage` removes an image a container uses (containerd
    /// does; CRI-O refuses).
    pub fn removes_images_in_use(self) -> bool {
        self.is_containerd()
    }

    /// Whether the runtime mounts images as volumes (CRI `Mount.image`).
    pub fn has_image_volumes(self) -> bool {
        !matches!(self, Kind::Containerd16)
    }

    /// Whether the runtime stores content blobs beside the unpacked layers
    /// (containerd), so an image takes about twice its layers on disk.
    pub fn keeps_blobs(self) -> bool {
        self.is_containerd()
    }
}

/// Where scripts/testbed-runtimes.sh puts the runtimes it builds:
/// `$IMAGEGC_RUNTIMES_DIR`, or `target/runtimes` in the workspace.
pub fn runtimes_dir() -> PathBuf {
    match std::env::var_os("IMAGEGC_RUNTIMES_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => workspace_root().join("target/runtimes"),
    }
}

/// The root of the workspace, two levels above this crate
/// (`crates/imagegc-testkit`).
fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("the test kit lives in crates/ of the workspace")
}

/// A built runtime's bin directory; fails the test with how to build it.
fn built(what: &str) -> PathBuf {
    let dir = runtimes_dir().join(what).join("bin");
    assert!(
        dir.is_dir(),
        "{} is missing: scripts/testbed-runtimes.sh builds {what} (scripts/test.sh runs it)",
        dir.display()
    );
    dir
}
/// The containerd namespace CRI works in.
pub const CRI_NAMESPACE: &str = "k8s.io";
/// Deadline of each CRI call the test bed makes.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an imported image may take to show up in CRI `ListImages` (the
/// CRI plugin learns about it from an event).
const IMAGE_VISIBLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Seconds `StopContainer` waits before containerd sends SIGKILL.
const STOP_CONTAINER_TIMEOUT_SECS: i64 = 5;

/// A pod sandbox started by [`TestBed::run_pod`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodId(pub String);

/// A container created by [`TestBed::create_container`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContainerId(pub String);

impl PodId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl ContainerId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Capacity and usage of a filesystem, from `statvfs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsUsage {
    pub capacity_bytes: u64,
    /// Bytes an unprivileged writer may still use.
    pub available_bytes: u64,
    pub free_bytes: u64,
    /// `capacity - free`.
    pub used_bytes: u64,
    pub inodes_total: u64,
    pub inodes_free: u64,
}

/// `statvfs` of `path`. Panics with the path when the call fails.
pub fn statvfs(path: &Path) -> FsUsage {
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("a path without NUL bytes");
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is NUL-terminated and `stat` is a valid out pointer.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) };
    assert_eq!(rc, 0, "statvfs {}: {}", path.display(), std::io::Error::last_os_error());
    let fragment = stat.f_frsize as u64;
    let capacity_bytes = stat.f_blocks as u64 * fragment;
    let free_bytes = stat.f_bfree as u64 * fragment;
    FsUsage {
        capacity_bytes,
        available_bytes: stat.f_bavail as u64 * fragment,
        free_bytes,
        used_bytes: capacity_bytes - free_bytes,
        inodes_total: stat.f_files as u64,
        inodes_free: stat.f_ffree as u64,
    }
}

/// One private runtime with its filesystem. See the module docs.
pub struct TestBed {
    kind: Kind,
    dir: PathBuf,
    root: PathBuf,
    socket: PathBuf,
    endpoint: String,
    /// The cgroup every pod of this test bed is placed under (in each hierarchy).
    cgroup_parent: String,
    loop_device: Option<String>,
    /// A split store's second filesystem (CRI-O's `root`, where the
    /// containers' writable layers go; `root` above is then its
    /// `imagestore`), and its loop device.
    container_root: Option<PathBuf>,
    container_loop_device: Option<String>,
    /// The runtime's process.
    containerd: Option<Child>,
    /// CRI-O's registry, and its port.
    registry: Option<(Child, u16)>,
    client: Option<CriClient>,
    pause: Option<BuiltImage>,
    pods: Mutex<HashMap<PodId, proto::PodSandboxConfig>>,
    counter: AtomicU64,
}

impl TestBed {
    /// Starts a runtime of `kind` on a fresh ext4 filesystem of `fs_size_mb`
    /// MiB and imports the pause image. Panics with the reason when it cannot.
    pub async fn start(kind: Kind, fs_size_mb: u64) -> TestBed {
        TestBed::start_with(kind, fs_size_mb, None).await
    }

    /// Starts CRI-O with a split store (KEP-4191): its images (`imagestore`)
    /// on an ext4 filesystem of `image_fs_mb` MiB, which
    /// [`TestBed::image_fs_mount`] and [`TestBed::usage`] name, and its
    /// `root`, where the containers' writable layers go, on another of
    /// `container_fs_mb` MiB ([`TestBed::container_fs_mount`]).
    pub async fn start_split(kind: Kind, image_fs_mb: u64, container_fs_mb: u64) -> TestBed {
        assert_eq!(kind, Kind::Crio, "only CRI-O splits its store (imagestore)");
        TestBed::start_with(kind, image_fs_mb, Some(container_fs_mb)).await
    }

    async fn start_with(kind: Kind, fs_size_mb: u64, container_fs_mb: Option<u64>) -> TestBed {
        let started = Instant::now();
        setup::check_prerequisites(kind);
        let dir = tempfile::Builder::new()
            .prefix("imagegc-e2e-")
            .tempdir()
            .expect("creating the test bed directory")
            .keep();
        let dir = dir.canonicalize().expect("canonicalizing the test bed directory");
        let socket = dir.join(if kind.is_containerd() {
            "containerd.sock"
        } else {
            "crio.sock"
        });
        let cgroup_parent = format!("/{}", dir.file_name().unwrap().to_string_lossy());
        let mut bed = TestBed {
            kind,
            registry: None,
            cgroup_parent,
            root: dir.join("root"),
            endpoint: format!("unix://{}", socket.display()),
            socket,
            dir,
            loop_device: None,
            container_root: None,
            container_loop_device: None,
            containerd: None,
            client: None,
            pause: None,
            pods: Mutex::new(HashMap::new()),
            counter: AtomicU64::new(0),
        };
        bed.make_filesystem(fs_size_mb);
        if let Some(size) = container_fs_mb {
            bed.make_container_filesystem(size);
        }
        let fs_ready = started.elapsed();
        if kind == Kind::Crio {
            bed.start_registry().await;
        }
        bed.write_config();
        bed.spawn_containerd();
        bed.wait_until_ready().await;
        let containerd_ready = started.elapsed();
        let pause = bed.import(&ImageSpec::new(PAUSE_IMAGE)).await;
        bed.pause = Some(pause);
        eprintln!(
            "testbed {} ({}): ready in {} ms (filesystem {} ms, runtime answering {} ms, pause image {} ms)",
            bed.dir.display(),
            kind.name(),
            started.elapsed().as_millis(),
            fs_ready.as_millis(),
            (containerd_ready - fs_ready).as_millis(),
            (started.elapsed() - containerd_ready).as_millis(),
        );
        bed
    }

    /// The containerd socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `unix://` + the socket path, as imagegc takes it.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The test bed's private directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the test bed's ext4 filesystem is mounted: containerd's root.
    pub fn image_fs_mount(&self) -> &Path {
        &self.root
    }

    /// `statvfs` of the test bed's filesystem.
    pub fn usage(&self) -> FsUsage {
        statvfs(&self.root)
    }

    /// Where a split store's container filesystem is mounted (CRI-O's
    /// `root`); `None` unless started with [`TestBed::start_split`].
    pub fn container_fs_mount(&self) -> Option<&Path> {
        self.container_root.as_deref()
    }

    /// The pause image imported at start.
    pub fn pause_image(&self) -> &BuiltImage {
        self.pause.as_ref().expect("the pause image is imported at start")
    }

    /// The CRI client (it implements [`imagegc::cri::Runtime`]).
    pub fn client(&self) -> &CriClient {
        self.client.as_ref().expect("containerd is running")
    }

    fn runtime_service(&self) -> RuntimeServiceClient<Channel> {
        self.client().runtime_service()
    }

    fn image_service(&self) -> ImageServiceClient<Channel> {
        self.client().image_service()
    }

    /// Builds `spec` as an OCI layout tarball, imports it with `ctr` into the
    /// CRI namespace (unpacking it), and waits until CRI lists it.
    pub async fn import(&self, spec: &ImageSpec) -> BuiltImage {
        let tarball = self.dir.join("images").join(format!("{}.tar", self.next_number()));
        let built = spec
            .write_layout(&tarball)
            .unwrap_or_else(|e| panic!("writing {}: {e}", tarball.display()));
        if let Err(e) = self.import_tarball(&tarball, &built.names).await {
            panic!("{e}\n{} log:\n{}", self.kind.name(), self.log_tail(20));
        }
        let _ = fs::remove_file(&tarball);
        // containerd 2.x's import also names the image by its repository
        // digest, and CRI learns of that name a moment after the tags: a
        // RemoveImage in between removes the tags only, and the digest's
        // name keeps the image, listed and on disk. Wait for every name.
        let digests: Vec<String> = match self.kind {
            Kind::Containerd2 => built
                .names
                .iter()
                .map(|name| format!("{}@{}", crate::oci::repository(name), built.manifest.digest))
                .collect(),
            _ => Vec::new(),
        };
        let deadline = Instant::now() + IMAGE_VISIBLE_TIMEOUT;
        loop {
            let images = self.list_images().await;
            if let Some(image) = images.iter().find(|i| i.id == built.id)
                && built.names.iter().all(|n| image.repo_tags.contains(n))
                && digests.iter().all(|d| image.repo_digests.contains(d))
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} ({}) was imported but CRI ListImages does not show it after {IMAGE_VISIBLE_TIMEOUT:?}: {images:#?}",
                spec.name(),
                built.id
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        built
    }

    /// Imports an OCI layout tarball holding the images `names` name,
    /// without waiting for CRI to list them: `ctr images import` on
    /// containerd; on CRI-O a `skopeo` push of each name to the registry and
    /// a CRI `PullImage`. Returns the tool's or the runtime's complaint.
    pub async fn import_tarball(&self, tarball: &Path, names: &[String]) -> Result<(), String> {
        if self.kind == Kind::Crio {
            return self.push_and_pull(tarball, names).await;
        }
        let ctr = match self.kind {
            Kind::Containerd2 => built(&format!("containerd-{CONTAINERD2_VERSION}")).join("ctr"),
            _ => PathBuf::from("ctr"),
        };
        let output = Command::new(&ctr)
            .arg("-a")
            .arg(&self.socket)
            .args(["-n", CRI_NAMESPACE, "images", "import"])
            .arg(tarball)
            .output()
            .map_err(|e| format!("running {}: {e}", ctr.display()))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "ctr images import {} ({names:?}) failed ({}): {}{}",
                tarball.display(),
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
            ))
        }
    }

    /// What the runtime lists as the `image_ref` of a container created from
    /// `image` by its name: the id on containerd, the repo digest on CRI-O.
    pub fn image_ref_of(&self, image: &BuiltImage) -> String {
        if self.kind.is_containerd() {
            image.id.clone()
        } else {
            image.repo_digests()[0].clone()
        }
    }

    /// How many times the runtime stores an image's layers on disk:
    /// containerd keeps the content blob beside the unpacked snapshot, CRI-O
    /// only the unpacked layer.
    pub fn stored_copies(&self) -> u64 {
        if self.kind.keeps_blobs() { 2 } else { 1 }
    }

    /// The runtime this test bed runs.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Starts a pod sandbox (host network, so no CNI is needed).
    pub async fn run_pod(&self, name: &str) -> PodId {
        let number = self.next_number();
        let log_directory = self.dir.join("logs").join(format!("{name}-{number}"));
        fs::create_dir_all(&log_directory).expect("creating the pod log directory");
        let config = proto::PodSandboxConfig {
            metadata: Some(proto::PodSandboxMetadata {
                name: name.to_string(),
                uid: format!("{name}-uid-{number}"),
                namespace: "e2e".to_string(),
                attempt: 0,
            }),
            log_directory: log_directory.display().to_string(),
            linux: Some(proto::LinuxPodSandboxConfig {
                cgroup_parent: self.cgroup_parent.clone(),
                security_context: Some(proto::LinuxSandboxSecurityContext {
                    namespace_options: Some(proto::NamespaceOption {
                        network: proto::NamespaceMode::Node as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        };
        let request = proto::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        };
        let response = self
            .runtime_service()
            .run_pod_sandbox(request)
            .await
            .unwrap_or_else(|s| self.rpc_failed("RunPodSandbox", name, &s));
        let id = PodId(response.into_inner().pod_sandbox_id);
        self.pods.lock().unwrap().insert(id.clone(), config);
        id
    }

    /// Creates (does not start) a container running `image`'s entrypoint in `pod`.
    pub async fn create_container(&self, pod: &PodId, image: &str) -> ContainerId {
        self.try_create_container(pod, image)
            .await
            .unwrap_or_else(|s| self.rpc_failed("CreateContainer", image, &s))
    }

    /// Creates and starts a container running `image` with `volume`, another
    /// image, mounted read-only at `/volume` (an image volume, KEP-4639; CRI
    /// `Mount.image`). containerd 2.x and CRI-O support them.
    pub async fn run_container_mounting(&self, pod: &PodId, image: &str, volume: &str) -> ContainerId {
        let mount = proto::Mount {
            container_path: "/volume".to_string(),
            // containerd refuses an image mount that is not read-only.
            readonly: true,
            image: Some(proto::ImageSpec {
                image: volume.to_string(),
                user_specified_image: volume.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let container = self
            .create(pod, image, vec![mount])
            .await
            .unwrap_or_else(|s| self.rpc_failed("CreateContainer", image, &s));
        self.start_container(&container).await;
        container
    }

    /// [`TestBed::create_container`], returning the runtime's refusal instead
    /// of failing the test: for tests in which the image may be removed
    /// under the call.
    pub async fn try_create_container(&self, pod: &PodId, image: &str) -> Result<ContainerId, tonic::Status> {
        self.create(pod, image, Vec::new()).await
    }

    async fn create(&self, pod: &PodId, image: &str, mounts: Vec<proto::Mount>) -> Result<ContainerId, tonic::Status> {
        let sandbox_config = self
            .pods
            .lock()
            .unwrap()
            .get(pod)
            .cloned()
            .unwrap_or_else(|| panic!("pod {} was not started by this test bed", pod.0));
        let name = format!("c{}", self.next_number());
        let request = proto::CreateContainerRequest {
            pod_sandbox_id: pod.0.clone(),
            config: Some(proto::ContainerConfig {
                metadata: Some(proto::ContainerMetadata {
                    name: name.clone(),
                    attempt: 0,
                }),
                image: Some(proto::ImageSpec {
                    image: image.to_string(),
                    // CRI-O 1.36 refuses a container without it (it verifies
                    // the signature policy of the image the user named).
                    user_specified_image: image.to_string(),
                    ..Default::default()
                }),
                log_path: format!("{name}.log"),
                mounts,
                ..Default::default()
            }),
            sandbox_config: Some(sandbox_config),
        };
        let response = self.runtime_service().create_container(request).await?;
        Ok(ContainerId(response.into_inner().container_id))
    }

    pub async fn start_container(&self, container: &ContainerId) {
        let request = proto::StartContainerRequest {
            container_id: container.0.clone(),
        };
        self.runtime_service()
            .start_container(request)
            .await
            .unwrap_or_else(|s| self.rpc_failed("StartContainer", &container.0, &s));
    }

    /// Creates and starts a container; returns once it is running.
    pub async fn run_container(&self, pod: &PodId, image: &str) -> ContainerId {
        let container = self.create_container(pod, image).await;
        self.start_container(&container).await;
        container
    }

    /// Stops a container: it stays listed, exited.
    pub async fn stop_container(&self, container: &ContainerId) {
        let request = proto::StopContainerRequest {
            container_id: container.0.clone(),
            timeout: STOP_CONTAINER_TIMEOUT_SECS,
        };
        self.runtime_service()
            .stop_container(request)
            .await
            .unwrap_or_else(|s| self.rpc_failed("StopContainer", &container.0, &s));
    }

    pub async fn remove_container(&self, container: &ContainerId) {
        let request = proto::RemoveContainerRequest {
            container_id: container.0.clone(),
        };
        self.runtime_service()
            .remove_container(request)
            .await
            .unwrap_or_else(|s| self.rpc_failed("RemoveContainer", &container.0, &s));
    }

    /// Stops the pod's sandbox and its containers (they stay listed, exited).
    pub async fn stop_pod(&self, pod: &PodId) {
        let request = proto::StopPodSandboxRequest {
            pod_sandbox_id: pod.0.clone(),
        };
        self.runtime_service()
            .stop_pod_sandbox(request)
            .await
            .unwrap_or_else(|s| self.rpc_failed("StopPodSandbox", &pod.0, &s));
    }

    /// Removes a (stopped) pod and its containers.
    pub async fn remove_pod(&self, pod: &PodId) {
        let request = proto::RemovePodSandboxRequest {
            pod_sandbox_id: pod.0.clone(),
        };
        self.runtime_service()
            .remove_pod_sandbox(request)
            .await
            .unwrap_or_else(|s| self.rpc_failed("RemovePodSandbox", &pod.0, &s));
        self.pods.lock().unwrap().remove(pod);
    }

    /// CRI `ListImages`.
    pub async fn list_images(&self) -> Vec<Image> {
        self.client()
            .list_images()
            .await
            .unwrap_or_else(|e| panic!("{e}\nruntime log:\n{}", self.log_tail(20)))
    }

    /// The ids of the images CRI lists.
    pub async fn list_image_ids(&self) -> BTreeSet<String> {
        self.list_images().await.into_iter().map(|i| i.id).collect()
    }

    /// CRI `ListContainers`: containers in every state.
    pub async fn list_containers(&self) -> Vec<Container> {
        self.client()
            .list_containers()
            .await
            .unwrap_or_else(|e| panic!("{e}\nruntime log:\n{}", self.log_tail(20)))
    }

    /// The state CRI reports for `container`; `None` when it is not listed.
    pub async fn container_state(&self, container: &ContainerId) -> Option<ContainerState> {
        self.list_containers()
            .await
            .into_iter()
            .find(|c| c.id == container.0)
            .and_then(|c| c.state)
    }

    /// CRI `ImageFsInfo`.
    pub async fn image_fs_info(&self) -> Vec<ImageFsUsage> {
        self.client()
            .image_fs_info()
            .await
            .unwrap_or_else(|e| panic!("{e}\nruntime log:\n{}", self.log_tail(20)))
    }

    /// CRI `RemoveImage` by id or name.
    pub async fn remove_image(&self, image: &str) {
        // CRI-O takes an id only bare: `sha256:<hex>` reads to it as a short name.
        let image = match self.kind {
            Kind::Crio => image.strip_prefix("sha256:").unwrap_or(image),
            _ => image,
        };
        let request = proto::RemoveImageRequest {
            image: Some(proto::ImageSpec {
                image: image.to_string(),
                ..Default::default()
            }),
        };
        self.image_service()
            .remove_image(request)
            .await
            .unwrap_or_else(|s| self.rpc_failed("RemoveImage", image, &s));
    }

    /// Stops containerd (SIGTERM, SIGKILL after a grace period) and waits
    /// for it to exit. Shims and containers keep running, as on a node whose
    /// runtime restarts; [`TestBed::start_containerd`] brings it back.
    pub fn stop_containerd(&mut self) {
        let child = self.containerd.take().expect("containerd is running");
        // CRI-O stops gracefully only once its clients have hung up.
        self.client = None;
        let mut notes = Vec::new();
        cleanup::stop_process(child, self.kind.name(), &mut notes);
        for note in notes {
            eprintln!("testbed {}: {note}", self.dir.display());
        }
    }

    /// Starts containerd again on the same configuration, socket and
    /// filesystem, and waits until it answers CRI.
    pub async fn start_containerd(&mut self) {
        assert!(self.containerd.is_none(), "containerd is already running");
        self.spawn_containerd();
        self.wait_until_ready().await;
    }

    /// Names `image` as the runtime's sandbox image in its configuration,
    /// in place of the pause image it started with: it applies from the
    /// next [`TestBed::start_containerd`]. Pods already running keep the
    /// sandbox image they were started on.
    pub fn configure_sandbox_image(&self, image: &str) {
        let path = self.dir.join(if self.kind == Kind::Crio {
            "crio.conf"
        } else {
            "config.toml"
        });
        let config = fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        let quoted = format!("\"{PAUSE_IMAGE}\"");
        assert!(
            config.contains(&quoted),
            "{} does not name {PAUSE_IMAGE}",
            path.display()
        );
        fs::write(&path, config.replace(&quoted, &format!("\"{image}\"")))
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }

    /// The containerd log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("runtime.log")
    }

    /// The last `lines` lines of the containerd log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = fs::read_to_string(self.log_path()).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn rpc_failed(&self, rpc: &str, subject: &str, status: &tonic::Status) -> ! {
        panic!(
            "CRI {rpc} ({subject}) on {} failed: {status}\nruntime log:\n{}",
            self.endpoint,
            self.log_tail(20)
        )
    }

    fn next_number(&self) -> u64 {
        self.counter.fetch_add(1, Ordering::Relaxed)
    }
}
