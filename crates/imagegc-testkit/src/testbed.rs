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
const REQUIRED_TOOLS: [(&str, &str); 4] = [
    ("runc", "apt-get install -y runc"),
    ("mkfs.ext4", "apt-get install -y e2fsprogs"),
    ("losetup", "apt-get install -y mount"),
    ("mount", "apt-get install -y mount"),
];
const CONTAINERD16_TOOLS: [(&str, &str); 2] = [
    ("containerd", "apt-get install -y containerd"),
    ("ctr", "apt-get install -y containerd"),
];
const CRIO_TOOLS: [(&str, &str); 3] = [
    ("conmon", "apt-get install -y conmon"),
    ("skopeo", "apt-get install -y skopeo"),
    ("docker-registry", "apt-get install -y docker-registry"),
];

/// CRI-O's `runtime_path`: runc, with a negative `oomScoreAdj` in the
/// bundle's config.json (CRI-O writes it compact) set to 0 first, since this
/// VM refuses lowering it even for root.
const RUNC_WRAPPER: &str = r#"#!/bin/sh
bundle=
previous=
for arg in "$@"; do
    case "$previous" in --bundle|-b) bundle=$arg ;; esac
    case "$arg" in --bundle=*) bundle=${arg#--bundle=} ;; esac
    previous=$arg
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
    sed -i -E 's/"oomScoreAdj":[[:space:]]*-[0-9]+/"oomScoreAdj":0/' "$bundle/config.json"
fi
exec runc "$@"
"#;

/// A TCP port on 127.0.0.1 nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("finding a free port on 127.0.0.1")
}

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
        let started = Instant::now();
        check_prerequisites(kind);
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
            containerd: None,
            client: None,
            pause: None,
            pods: Mutex::new(HashMap::new()),
            counter: AtomicU64::new(0),
        };
        bed.make_filesystem(fs_size_mb);
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

    fn make_filesystem(&mut self, fs_size_mb: u64) {
        let image = self.dir.join("fs.img");
        let file = fs::File::create(&image).expect("creating the filesystem image");
        file.set_len(fs_size_mb * 1024 * 1024)
            .expect("sizing the filesystem image");
        drop(file);
        run(Command::new("mkfs.ext4").args(["-q", "-F", "-m", "0"]).arg(&image));
        fs::create_dir(&self.root).expect("creating the mount point");
        let device = {
            let _guard = LOOP_SETUP.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            run(Command::new("losetup").args(["--find", "--show"]).arg(&image))
        };
        self.loop_device = Some(device.trim().to_string());
        run(Command::new("mount")
            .args(["-t", "ext4", device.trim()])
            .arg(&self.root));
    }

    fn write_config(&self) {
        match self.kind {
            Kind::Containerd16 => self.write_containerd16_config(),
            Kind::Containerd2 => self.write_containerd2_config(),
            Kind::Crio => self.write_crio_config(),
        }
    }

    fn write_containerd2_config(&self) {
        for sub in ["state", "opt", "runc", "s", "cni/bin", "cni/conf", "images", "logs"] {
            fs::create_dir_all(self.dir.join(sub)).expect("creating the test bed layout");
        }
        let template = include_str!("../runtimes/containerd2.toml.example");
        // Comments first, then the config; @DIR@ stands for the test bed's directory.
        let config = template.replace("@DIR@", &self.dir.display().to_string());
        fs::write(self.dir.join("config.toml"), config).expect("writing the containerd config");
    }

    fn write_containerd16_config(&self) {
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
        let mut command = match self.kind {
            Kind::Containerd16 => {
                let mut command = Command::new("containerd");
                command.arg("--config").arg(self.dir.join("config.toml"));
                command
            }
            Kind::Containerd2 => {
                // containerd finds its shim on PATH: the 2.x build's first.
                let bin = built(&format!("containerd-{CONTAINERD2_VERSION}"));
                let path = std::env::var_os("PATH").unwrap_or_default();
                let mut dirs = vec![bin.clone()];
                dirs.extend(std::env::split_paths(&path));
                let mut command = Command::new(bin.join("containerd"));
                command
                    .arg("--config")
                    .arg(self.dir.join("config.toml"))
                    .env("PATH", std::env::join_paths(dirs).expect("a PATH"));
                command
            }
            Kind::Crio => self.crio_command(),
        };
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("duplicating the log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.kind.name()));
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
            let Err(error) = client.version().await else { break };
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

    /// Starts the registry CRI-O pulls from: Debian's `docker-registry` on
    /// a free port of 127.0.0.1, storing under the test bed's directory.
    async fn start_registry(&mut self) {
        let port = free_port();
        let root = self.dir.join("registry");
        fs::create_dir_all(&root).expect("creating the registry's directory");
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
            root.display()
        );
        let config_path = self.dir.join("registry.yml");
        fs::write(&config_path, config).expect("writing the registry config");
        let log = fs::File::create(self.dir.join("registry.log")).expect("creating the registry log");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("duplicating the log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting docker-registry: {e}"));
        self.registry = Some((child, port));
        let deadline = Instant::now() + READY_TIMEOUT;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the registry did not listen on 127.0.0.1:{port} within {READY_TIMEOUT:?}: {}",
                fs::read_to_string(self.dir.join("registry.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn write_crio_config(&self) {
        for sub in [
            "run",
            "ns",
            "runc",
            "exits",
            "attach",
            "cni/bin",
            "cni/conf",
            "crio.conf.d",
            "registries.d",
            "images",
            "logs",
        ] {
            fs::create_dir_all(self.dir.join(sub)).expect("creating the test bed layout");
        }
        let port = self.registry.as_ref().expect("the registry runs").1;
        let dir = self.dir.display().to_string();
        let bin = built(&format!("crio-{CRIO_VERSION}"));
        // This VM refuses a negative oom_score_adj even for root: the
        // wrapper sets it to 0 in the bundle before runc creates the container.
        let wrapper = self.dir.join("runc-wrapper");
        fs::write(&wrapper, RUNC_WRAPPER).expect("writing the runc wrapper");
        fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("making the runc wrapper executable");
        let config = include_str!("../runtimes/crio.conf.example")
            .replace("@DIR@", &dir)
            .replace("@PINNS@", &bin.join("pinns").display().to_string())
            .replace("@PAUSE_IMAGE@", PAUSE_IMAGE)
            .replace("@PAUSE_COMMAND@", crate::oci::SLEEPER_PATH);
        fs::write(self.dir.join("crio.conf"), config).expect("writing the CRI-O config");
        let registries = include_str!("../runtimes/registries.conf.example").replace("@PORT@", &port.to_string());
        fs::write(self.dir.join("registries.conf"), registries).expect("writing registries.conf");
        fs::write(
            self.dir.join("policy.json"),
            r#"{"default":[{"type":"insecureAcceptAnything"}]}"#,
        )
        .expect("writing the signature policy");
    }

    fn crio_command(&self) -> Command {
        let bin = built(&format!("crio-{CRIO_VERSION}"));
        let mut command = Command::new(bin.join("crio"));
        command
            .arg("--config")
            .arg(self.dir.join("crio.conf"))
            .arg("--config-dir")
            .arg(self.dir.join("crio.conf.d"))
            .arg("--registries-conf")
            .arg(self.dir.join("registries.conf"))
            .arg("--registries-conf-dir")
            .arg(self.dir.join("registries.d"))
            .arg("--signature-policy")
            .arg(self.dir.join("policy.json"));
        command
    }

    /// CRI-O's import: push each name to the registry with `skopeo`, then
    /// pull it over CRI as a node would.
    async fn push_and_pull(&self, tarball: &Path, names: &[String]) -> Result<(), String> {
        let port = self.registry.as_ref().expect("the registry runs").1;
        for name in names {
            let output = Command::new("skopeo")
                .args(["copy", "--quiet", "--preserve-digests", "--dest-tls-verify=false"])
                .arg(format!("oci-archive:{}:{name}", tarball.display()))
                .arg(format!("docker://127.0.0.1:{port}/{name}"))
                .output()
                .map_err(|e| format!("running skopeo: {e}"))?;
            if !output.status.success() {
                return Err(format!(
                    "skopeo copy {} ({name}) to the registry failed ({}): {}",
                    tarball.display(),
                    output.status,
                    String::from_utf8_lossy(&output.stderr)
                ));
            }
            let request = proto::PullImageRequest {
                image: Some(proto::ImageSpec {
                    image: name.clone(),
                    ..Default::default()
                }),
                sandbox_config: None,
            };
            self.image_service()
                .pull_image(request)
                .await
                .map_err(|s| format!("CRI PullImage {name}: {s}"))?;
        }
        Ok(())
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
        stop_process(child, self.kind.name(), &mut notes);
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
        // CRI-O stops gracefully only once its clients have hung up.
        self.client = None;
        if let Some(child) = self.containerd.take() {
            stop_process(child, self.kind.name(), &mut notes);
        }
        if let Some((child, _)) = self.registry.take() {
            stop_process(child, "the registry", &mut notes);
        }
        kill_shims(&self.socket, &self.dir, &mut notes, &mut problems);
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
fn stop_process(mut child: Child, what: &str, notes: &mut Vec<String>) {
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
        "{what} (pid {}) ignored SIGTERM for {STOP_GRACE:?}; killed",
        child.id()
    ));
    let _ = child.kill();
    let _ = child.wait();
}

/// Kills the monitors started for the runtime, and everything they started,
/// by PID: containerd's shims (their command line carries `-address
/// SOCKET`) and CRI-O's conmon processes (theirs names paths under `dir`).
/// A monitor whose pods were removed exits by itself, so they get
/// [`SHIM_EXIT_GRACE`] first.
fn kill_shims(socket: &Path, dir: &Path, notes: &mut Vec<String>, problems: &mut Vec<String>) {
    let socket = socket.as_os_str().as_bytes();
    let dir = dir.as_os_str().as_bytes();
    let find_shims = |processes: &[Process]| -> Vec<i32> {
        processes
            .iter()
            .filter(|p| {
                p.args.windows(2).any(|w| w[0] == b"-address" && w[1] == socket)
                    || p.args
                        .iter()
                        .any(|a| a.starts_with(dir) && a.get(dir.len()) == Some(&b'/'))
            })
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
        "shims or monitors {shims:?} were still running after the runtime stopped; killed them and their children"
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
fn check_prerequisites(kind: Kind) {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the e2e tests start a real container runtime on a loop-mounted filesystem and must run as root (euid is {euid})"
    );
    let path = std::env::var_os("PATH").unwrap_or_default();
    let for_kind: &[(&str, &str)] = match kind {
        Kind::Containerd16 => &CONTAINERD16_TOOLS,
        Kind::Containerd2 => &[],
        Kind::Crio => &CRIO_TOOLS,
    };
    let missing: Vec<String> = REQUIRED_TOOLS
        .iter()
        .chain(for_kind)
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
