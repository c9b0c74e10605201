//! A private, real containerd for one test: its own directory, its own small
//! ext4 filesystem as containerd's root (so the test controls capacity and
//! usage), its own socket, and a pause image built and imported here.
//!
//! [`TestBed::start`] fails the test with the reason when the machine cannot
//! run one (not root, a tool missing, containerd not answering); it never
//! skips. Dropping the test bed, also when the test panics, stops pods over
//! CRI, stops containerd, kills the shims started for its socket (by PID),
//! unmounts everything under its directory, detaches the loop device and
//! removes the directory. A cleanup that leaves something behind fails the
//! test.

use std::collections::{BTreeSet, HashMap};
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use imagegc::cri::proto::{
    self, image_service_client::ImageServiceClient, runtime_service_client::RuntimeServiceClient,
};
use imagegc::cri::{Container, ContainerState, CriClient, Image, ImageFsUsage, Runtime};
use sha2::{Digest, Sha256};
use tonic::transport::Channel;

use crate::oci::{BuiltImage, ImageSpec};

/// The sandbox image every test bed imports and configures.
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.9";
/// The containerd namespace CRI works in.
pub const CRI_NAMESPACE: &str = "k8s.io";
/// How long containerd gets to answer CRI `Version` after it starts; it
/// usually takes well under a second.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Deadline of each CRI call the test bed makes.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an imported image may take to show up in CRI `ListImages` (the
/// CRI plugin learns about it from an event).
const IMAGE_VISIBLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Grace period between SIGTERM and SIGKILL when stopping containerd.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long shims get to exit by themselves once containerd has stopped.
const SHIM_EXIT_GRACE: Duration = Duration::from_secs(2);
/// Where containerd 1.6 shims put their sockets, whatever containerd's state dir.
const SHIM_SOCKET_DIR: &str = "/run/containerd/s";
/// Seconds `StopContainer` waits before containerd sends SIGKILL.
const STOP_CONTAINER_TIMEOUT_SECS: i64 = 5;
/// Tools the test bed runs, and what provides them.
const REQUIRED_TOOLS: [(&str, &str); 6] = [
    ("containerd", "apt-get install -y containerd runc"),
    ("ctr", "apt-get install -y containerd runc"),
    ("runc", "apt-get install -y containerd runc"),
    ("mkfs.ext4", "apt-get install -y e2fsprogs"),
    ("losetup", "apt-get install -y mount"),
    ("mount", "apt-get install -y mount"),
];

/// Serialises loop-device allocation between the test beds of one process.
static LOOP_SETUP: Mutex<()> = Mutex::new(());

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

/// One private containerd with its filesystem. See the module docs.
pub struct TestBed {
    dir: PathBuf,
    root: PathBuf,
    socket: PathBuf,
    endpoint: String,
    /// The cgroup every pod of this test bed is placed under (in each hierarchy).
    cgroup_parent: String,
    loop_device: Option<String>,
    containerd: Option<Child>,
    client: Option<CriClient>,
    pause: Option<BuiltImage>,
    pods: Mutex<HashMap<PodId, proto::PodSandboxConfig>>,
    counter: AtomicU64,
}

impl TestBed {
    /// Starts a containerd on a fresh ext4 filesystem of `fs_size_mb` MiB
    /// and imports the pause image. Panics with the reason when it cannot.
    pub async fn start(fs_size_mb: u64) -> TestBed {
        let started = Instant::now();
        check_prerequisites();
        let dir = tempfile::Builder::new()
            .prefix("imagegc-e2e-")
            .tempdir()
            .expect("creating the test bed directory")
            .keep();
        let dir = dir.canonicalize().expect("canonicalizing the test bed directory");
        let socket = dir.join("containerd.sock");
        let cgroup_parent = format!("/{}", dir.file_name().unwrap().to_string_lossy());
        let mut bed = TestBed {
            cgroup_parent,
            root: dir.join("root"),
            endpoint: format!("unix://{}", socket.display()),
            socket,
            dir,
            loop_device: None,
            containerd: None,
            client: None,
            pause: None,
            pods: Mutex::new(HashMap::new()),
            counter: AtomicU64::new(0),
        };
        bed.make_filesystem(fs_size_mb);
        let fs_ready = started.elapsed();
        bed.write_config();
        bed.spawn_containerd();
        bed.wait_until_ready().await;
        let containerd_ready = started.elapsed();
        let pause = bed.import(&ImageSpec::new(PAUSE_IMAGE)).await;
        bed.pause = Some(pause);
        eprintln!(
            "testbed {}: ready in {} ms (filesystem {} ms, containerd answering {} ms, pause image {} ms)",
            bed.dir.display(),
            started.elapsed().as_millis(),
            fs_ready.as_millis(),
            (containerd_ready - fs_ready).as_millis(),
            (started.elapsed() - containerd_ready).as_millis(),
        );
        bed
    }

    fn make_filesystem(&mut self, fs_size_mb: u64) {
        let image = self.dir.join("fs.img");
        let file = fs::File::create(&image).expect("creating the filesystem image");
        file.set_len(fs_size_mb * 1024 * 1024)
            .expect("sizing the filesystem image");
        drop(file);
        run(Command::new("mkfs.ext4").args(["-q", "-F", "-m", "0"]).arg(&image));
        fs::create_dir(&self.root).expect("creating the mount point");
        let device = {
            let _guard = LOOP_SETUP.lock().unwrap_or_else(|e| e.into_inner());
            run(Command::new("losetup").args(["--find", "--show"]).arg(&image))
        };
        self.loop_device = Some(device.trim().to_string());
        run(Command::new("mount")
            .args(["-t", "ext4", device.trim()])
            .arg(&self.root));
    }

    fn write_config(&self) {
        for sub in ["state", "opt", "runc", "cni/bin", "cni/conf", "images", "logs"] {
            fs::create_dir_all(self.dir.join(sub)).expect("creating the test bed layout");
        }
        let path = |sub: &str| toml_string(&self.dir.join(sub));
        let config = format!(
            r#"version = 2
root = {root}
state = {state}
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = {socket}

[plugins."io.containerd.internal.v1.opt"]
  path = {opt}

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  disable_apparmor = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = {runc}
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = {cni_bin}
    conf_dir = {cni_conf}
"#,
            root = toml_string(&self.root),
            state = path("state"),
            socket = toml_string(&self.socket),
            opt = path("opt"),
            runc = path("runc"),
            cni_bin = path("cni/bin"),
            cni_conf = path("cni/conf"),
        );
        fs::write(self.dir.join("config.toml"), config).expect("writing the containerd config");
    }

    fn spawn_containerd(&mut self) {
        // Appending keeps the log of an earlier run when containerd is restarted.
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("opening the containerd log");
        let child = Command::new("containerd")
            .arg("--config")
            .arg(self.dir.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("duplicating the log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting containerd: {e}"));
        self.containerd = Some(child);
    }

    async fn wait_until_ready(&mut self) {
        let client = imagegc::cri::connect(&self.endpoint, Duration::from_secs(2)).expect("a valid endpoint");
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.containerd.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!(
                    "containerd exited before answering ({status}); last lines of {}:\n{}",
                    self.log_path().display(),
                    self.log_tail(40)
                );
            }
            let error = match client.version().await {
                Ok(_) => break,
                Err(e) => e,
            };
            if Instant::now() > deadline {
                panic!(
                    "containerd did not answer CRI Version on {} within {READY_TIMEOUT:?} ({error}); \
                     last lines of {}:\n{}",
                    self.endpoint,
                    self.log_path().display(),
                    self.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.client = Some(imagegc::cri::connect(&self.endpoint, CALL_TIMEOUT).expect("a valid endpoint"));
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
        let output = Command::new("ctr")
            .arg("-a")
            .arg(&self.socket)
            .args(["-n", CRI_NAMESPACE, "images", "import"])
            .arg(&tarball)
            .output()
            .unwrap_or_else(|e| panic!("running ctr: {e}"));
        assert!(
            output.status.success(),
            "ctr images import {} ({}) failed ({}): {}{}\ncontainerd log:\n{}",
            tarball.display(),
            spec.name(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            self.log_tail(20)
        );
        let _ = fs::remove_file(&tarball);
        let deadline = Instant::now() + IMAGE_VISIBLE_TIMEOUT;
        loop {
            let images = self.list_images().await;
            if let Some(image) = images.iter().find(|i| i.id == built.id)
                && built.names.iter().all(|n| image.repo_tags.contains(n))
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
            .unwrap_or_else(|s| self.rpc_failed("RunPodSandbox", name, s));
        let id = PodId(response.into_inner().pod_sandbox_id);
        self.pods.lock().unwrap().insert(id.clone(), config);
        id
    }

    /// Creates (does not start) a container running `image`'s entrypoint in `pod`.
    pub async fn create_container(&self, pod: &PodId, image: &str) -> ContainerId {
        self.try_create_container(pod, image)
            .await
            .unwrap_or_else(|s| self.rpc_failed("CreateContainer", image, s))
    }

    /// [`TestBed::create_container`], returning the runtime's refusal instead
    /// of failing the test: for tests in which the image may be removed
    /// under the call.
    pub async fn try_create_container(&self, pod: &PodId, image: &str) -> Result<ContainerId, tonic::Status> {
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
                    ..Default::default()
                }),
                log_path: format!("{name}.log"),
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
            .unwrap_or_else(|s| self.rpc_failed("StartContainer", &container.0, s));
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
            .unwrap_or_else(|s| self.rpc_failed("StopContainer", &container.0, s));
    }

    pub async fn remove_container(&self, container: &ContainerId) {
        let request = proto::RemoveContainerRequest {
            container_id: container.0.clone(),
        };
        self.runtime_service()
            .remove_container(request)
            .await
            .unwrap_or_else(|s| self.rpc_failed("RemoveContainer", &container.0, s));
    }

    /// Stops the pod's sandbox and its containers (they stay listed, exited).
    pub async fn stop_pod(&self, pod: &PodId) {
        let request = proto::StopPodSandboxRequest {
            pod_sandbox_id: pod.0.clone(),
        };
        self.runtime_service()
            .stop_pod_sandbox(request)
            .await
            .unwrap_or_else(|s| self.rpc_failed("StopPodSandbox", &pod.0, s));
    }

    /// Removes a (stopped) pod and its containers.
    pub async fn remove_pod(&self, pod: &PodId) {
        let request = proto::RemovePodSandboxRequest {
            pod_sandbox_id: pod.0.clone(),
        };
        self.runtime_service()
            .remove_pod_sandbox(request)
            .await
            .unwrap_or_else(|s| self.rpc_failed("RemovePodSandbox", &pod.0, s));
        self.pods.lock().unwrap().remove(pod);
    }

    /// CRI `ListImages`.
    pub async fn list_images(&self) -> Vec<Image> {
        self.client()
            .list_images()
            .await
            .unwrap_or_else(|e| panic!("{e}\ncontainerd log:\n{}", self.log_tail(20)))
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
            .unwrap_or_else(|e| panic!("{e}\ncontainerd log:\n{}", self.log_tail(20)))
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
            .unwrap_or_else(|e| panic!("{e}\ncontainerd log:\n{}", self.log_tail(20)))
    }

    /// CRI `RemoveImage` by id or name.
    pub async fn remove_image(&self, image: &str) {
        let request = proto::RemoveImageRequest {
            image: Some(proto::ImageSpec {
                image: image.to_string(),
                ..Default::default()
            }),
        };
        self.image_service()
            .remove_image(request)
            .await
            .unwrap_or_else(|s| self.rpc_failed("RemoveImage", image, s));
    }

    /// Stops containerd (SIGTERM, SIGKILL after a grace period) and waits
    /// for it to exit. Shims and containers keep running, as on a node whose
    /// runtime restarts; [`TestBed::start_containerd`] brings it back.
    pub fn stop_containerd(&mut self) {
        let child = self.containerd.take().expect("containerd is running");
        let mut notes = Vec::new();
        stop_process(child, &mut notes);
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

    /// The containerd log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("containerd.log")
    }

    /// The last `lines` lines of the containerd log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = fs::read_to_string(self.log_path()).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn rpc_failed(&self, rpc: &str, subject: &str, status: tonic::Status) -> ! {
        panic!(
            "CRI {rpc} ({subject}) on {} failed: {status}\ncontainerd log:\n{}",
            self.endpoint,
            self.log_tail(20)
        )
    }

    fn next_number(&self) -> u64 {
        self.counter.fetch_add(1, Ordering::Relaxed)
    }
}

impl Drop for TestBed {
    fn drop(&mut self) {
        let started = Instant::now();
        // Notes: a cleanup step that needed a fallback. Problems: something
        // left behind, which fails the test.
        let mut notes = Vec::new();
        let mut problems = Vec::new();
        if self.client.is_some()
            && let Err(e) = remove_all_pods(&self.endpoint)
        {
            notes.push(format!("removing pods over CRI: {e}"));
        }
        let pods_removed = started.elapsed();
        if let Some(child) = self.containerd.take() {
            stop_process(child, &mut notes);
        }
        kill_shims(&self.socket, &mut notes, &mut problems);
        remove_cgroups(&self.cgroup_parent, &mut notes, &mut problems);
        let unmounted = unmount_under(&self.dir, &mut problems);
        if let Some(device) = self.loop_device.take() {
            detach_loop(&device, &mut problems);
        }
        // Never delete through a mount that is still there.
        if unmounted && let Err(e) = fs::remove_dir_all(&self.dir) {
            problems.push(format!("removing {}: {e}", self.dir.display()));
        }
        eprintln!(
            "testbed {}: cleaned up in {} ms (pods {} ms)",
            self.dir.display(),
            started.elapsed().as_millis(),
            pods_removed.as_millis()
        );
        for note in &notes {
            eprintln!("testbed {}: {note}", self.dir.display());
        }
        if !problems.is_empty() {
            let report = format!(
                "testbed {} cleanup left problems:\n  {}",
                self.dir.display(),
                problems.join("\n  ")
            );
            if std::thread::panicking() {
                eprintln!("{report}");
            } else {
                panic!("{report}");
            }
        }
    }
}

/// Stops and removes every pod over CRI. Drop may run inside the test's
/// runtime, which cannot be blocked on, so this runs on its own thread with
/// its own runtime and its own connection.
fn remove_all_pods(endpoint: &str) -> Result<(), String> {
    let endpoint = endpoint.to_string();
    std::thread::spawn(move || -> Result<(), String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("building a runtime for cleanup: {e}"))?;
        runtime.block_on(async {
            let client = imagegc::cri::connect(&endpoint, CALL_TIMEOUT).map_err(|e| e.to_string())?;
            let mut service = client.runtime_service();
            let pods = service
                .list_pod_sandbox(proto::ListPodSandboxRequest { filter: None })
                .await
                .map_err(|s| format!("ListPodSandbox: {s}"))?
                .into_inner()
                .items;
            let mut failures = Vec::new();
            for pod in pods {
                let stop = proto::StopPodSandboxRequest {
                    pod_sandbox_id: pod.id.clone(),
                };
                if let Err(s) = service.stop_pod_sandbox(stop).await {
                    failures.push(format!("StopPodSandbox {}: {s}", pod.id));
                    continue;
                }
                let remove = proto::RemovePodSandboxRequest {
                    pod_sandbox_id: pod.id.clone(),
                };
                if let Err(s) = service.remove_pod_sandbox(remove).await {
                    failures.push(format!("RemovePodSandbox {}: {s}", pod.id));
                }
            }
            if failures.is_empty() {
                Ok(())
            } else {
                Err(failures.join("; "))
            }
        })
    })
    .join()
    .unwrap_or_else(|_| Err("the cleanup thread panicked".to_string()))
}

/// SIGTERM, then SIGKILL after [`STOP_GRACE`].
fn stop_process(mut child: Child, notes: &mut Vec<String>) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    // SAFETY: signalling our own child by its PID.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + STOP_GRACE;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    notes.push(format!(
        "containerd (pid {}) ignored SIGTERM for {STOP_GRACE:?}; killed",
        child.id()
    ));
    let _ = child.kill();
    let _ = child.wait();
}

/// Kills the shims started for `socket` (their command line carries
/// `-address SOCKET`) and everything they started, by PID. A shim whose pods
/// were removed exits by itself, so they get [`SHIM_EXIT_GRACE`] first.
fn kill_shims(socket: &Path, notes: &mut Vec<String>, problems: &mut Vec<String>) {
    let socket = socket.as_os_str().as_bytes();
    let find_shims = |processes: &[Process]| -> Vec<i32> {
        processes
            .iter()
            .filter(|p| p.args.windows(2).any(|w| w[0] == b"-address" && w[1] == socket))
            .map(|p| p.pid)
            .collect()
    };
    let deadline = Instant::now() + SHIM_EXIT_GRACE;
    let (processes, shims) = loop {
        let processes = processes();
        let shims = find_shims(&processes);
        if shims.is_empty() || Instant::now() > deadline {
            break (processes, shims);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if shims.is_empty() {
        return;
    }
    let mut doomed = shims.clone();
    let mut i = 0;
    while i < doomed.len() {
        let parent = doomed[i];
        doomed.extend(processes.iter().filter(|p| p.ppid == parent).map(|p| p.pid));
        i += 1;
    }
    notes.push(format!(
        "shims {shims:?} were still running after containerd stopped; killed them and their children"
    ));
    for pid in doomed.iter().rev() {
        // SAFETY: signalling a process found above by PID.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline && doomed.iter().any(|pid| alive(*pid)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let survivors: Vec<i32> = doomed.into_iter().filter(|pid| alive(*pid)).collect();
    if !survivors.is_empty() {
        problems.push(format!("processes {survivors:?} survived SIGKILL"));
    }
    // A killed shim cannot remove its socket, which containerd 1.6 puts in a
    // fixed directory shared by every containerd on the machine.
    for shim in processes.iter().filter(|p| shims.contains(&p.pid)) {
        if let Some(path) = shim_socket(socket, &shim.args)
            && let Err(e) = fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            problems.push(format!("removing the shim socket {}: {e}", path.display()));
        }
    }
}

/// The socket a containerd 1.6 shim listens on:
/// `/run/containerd/s/<sha256 of "ADDRESS/NAMESPACE/ID">`.
fn shim_socket(address: &[u8], args: &[Vec<u8>]) -> Option<PathBuf> {
    let flag = |name: &[u8]| args.windows(2).find(|w| w[0] == name).map(|w| w[1].as_slice());
    let mut key = address.to_vec();
    for part in [flag(b"-namespace")?, flag(b"-id")?] {
        key.push(b'/');
        key.extend_from_slice(part);
    }
    Some(PathBuf::from(SHIM_SOCKET_DIR).join(format!("{:x}", Sha256::digest(&key))))
}

/// Removes the test bed's cgroup in every hierarchy, killing (by PID) any
/// process still in it first.
fn remove_cgroups(parent: &str, notes: &mut Vec<String>, problems: &mut Vec<String>) {
    let dirs = cgroup_dirs(parent);
    let pids: BTreeSet<i32> = dirs
        .iter()
        .filter_map(|dir| fs::read_to_string(dir.join("cgroup.procs")).ok())
        .flat_map(|procs| procs.lines().filter_map(|l| l.trim().parse().ok()).collect::<Vec<_>>())
        .collect();
    if !pids.is_empty() {
        notes.push(format!("processes {pids:?} were still in cgroup {parent}; killed them"));
        for pid in &pids {
            // SAFETY: signalling a process found in the test bed's cgroup.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
    }
    // A cgroup can be removed once its last process has been reaped.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let left: Vec<PathBuf> = cgroup_dirs(parent)
            .into_iter()
            .filter(|dir| fs::remove_dir(dir).is_err())
            .collect();
        if left.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            problems.push(format!("cgroups left behind: {left:?}"));
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every directory at or under `parent` in each mounted cgroup hierarchy,
/// deepest first.
fn cgroup_dirs(parent: &str) -> Vec<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut pending: Vec<PathBuf> = info
        .lines()
        .filter_map(|line| {
            let (mount, fs) = line.split_once(" - ")?;
            let point = mount.split(' ').nth(4)?;
            fs.starts_with("cgroup")
                .then(|| PathBuf::from(unescape_mountinfo(point)))
        })
        .map(|mount| mount.join(parent.trim_start_matches('/')))
        .filter(|dir| dir.is_dir())
        .collect();
    let mut dirs = Vec::new();
    while let Some(dir) = pending.pop() {
        if let Ok(entries) = fs::read_dir(&dir) {
            pending.extend(
                entries
                    .filter_map(Result::ok)
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
        dirs.push(dir);
    }
    dirs.sort_by_key(|dir| std::cmp::Reverse(dir.components().count()));
    dirs
}

struct Process {
    pid: i32,
    ppid: i32,
    args: Vec<Vec<u8>>,
}

fn processes() -> Vec<Process> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // The command name may contain spaces and parentheses: fields
            // are counted after the last ')'. State, then the parent PID.
            let after = &stat[stat.rfind(')')? + 1..];
            let ppid = after.split_whitespace().nth(1)?.parse().ok()?;
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args = cmdline.split(|b| *b == 0).map(<[u8]>::to_vec).collect();
            Some(Process { pid, ppid, args })
        })
        .collect()
}

/// True while `pid` exists and is not a zombie.
fn alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z"),
        Err(_) => false,
    }
}

/// Lazily unmounts every mount at or under `dir`, deepest first. Returns
/// whether none is left.
fn unmount_under(dir: &Path, problems: &mut Vec<String>) -> bool {
    for _round in 0..5 {
        let mounts = mounts_under(dir);
        if mounts.is_empty() {
            return true;
        }
        for mount in mounts {
            let c_path = CString::new(mount.as_os_str().as_bytes()).expect("a path without NUL bytes");
            // SAFETY: `c_path` is NUL-terminated.
            let rc = unsafe { libc::umount2(c_path.as_ptr(), libc::MNT_DETACH) };
            if rc != 0 {
                let error = std::io::Error::last_os_error();
                if error.raw_os_error() != Some(libc::EINVAL) && error.raw_os_error() != Some(libc::ENOENT) {
                    problems.push(format!("umount {}: {error}", mount.display()));
                }
            }
        }
    }
    let left = mounts_under(dir);
    if !left.is_empty() {
        problems.push(format!("mounts left under {}: {left:?}", dir.display()));
    }
    left.is_empty()
}

/// Mount points at or under `dir` from /proc/self/mountinfo, deepest first
/// (and, at equal depth, the latest mounted first).
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts: Vec<(usize, usize, PathBuf)> = info
        .lines()
        .enumerate()
        .filter_map(|(order, line)| {
            let point = PathBuf::from(unescape_mountinfo(line.split(' ').nth(4)?));
            point
                .starts_with(dir)
                .then(|| (point.components().count(), order, point))
        })
        .collect();
    mounts.sort_by_key(|&(depth, order, _)| std::cmp::Reverse((depth, order)));
    mounts.into_iter().map(|(_, _, point)| point).collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 4 <= bytes.len()
            && let Ok(value) = u8::from_str_radix(&field[i + 1..i + 4], 8)
        {
            out.push(value);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn detach_loop(device: &str, problems: &mut Vec<String>) {
    match Command::new("losetup").args(["-d", device]).output() {
        Ok(output) if output.status.success() => {}
        Ok(output) => problems.push(format!(
            "losetup -d {device}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )),
        Err(e) => problems.push(format!("running losetup -d {device}: {e}")),
    }
}

/// Fails the test with what is missing when the machine cannot run a test bed.
fn check_prerequisites() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the e2e tests start a real containerd on a loop-mounted filesystem and must run as root (euid is {euid})"
    );
    let path = std::env::var_os("PATH").unwrap_or_default();
    let missing: Vec<String> = REQUIRED_TOOLS
        .iter()
        .filter(|(tool, _)| !std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
        .map(|(tool, install)| format!("{tool} (`{install}`)"))
        .collect();
    assert!(
        missing.is_empty(),
        "the e2e tests need these tools on PATH, which are missing: {}",
        missing.join(", ")
    );
}

/// Runs a setup command; panics with its output when it fails. Returns stdout.
fn run(command: &mut Command) -> String {
    let output = command.output().unwrap_or_else(|e| panic!("running {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed ({}): {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn toml_string(path: &Path) -> String {
    toml::Value::String(path.display().to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mountinfo(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape_mountinfo(r"/tmp/plain"), "/tmp/plain");
        assert_eq!(unescape_mountinfo(r"/tmp/back\134slash"), r"/tmp/back\slash");
    }
}
