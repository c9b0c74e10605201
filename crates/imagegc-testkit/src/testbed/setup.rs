//! Starting a test bed: its filesystem, the runtime's configuration and
//! process, CRI-O's private registry, and the checks that fail a test with
//! what the machine lacks.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use imagegc::cri::{Runtime, proto};

use super::{CALL_TIMEOUT, CONTAINERD2_VERSION, CRIO_VERSION, Kind, PAUSE_IMAGE, TestBed, built};

/// How long containerd gets to answer CRI `Version` after it starts; it
/// usually takes well under a second.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

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

impl TestBed {
    pub(super) fn make_filesystem(&mut self, fs_size_mb: u64) {
        self.loop_device = Some(self.loop_filesystem("fs.img", fs_size_mb, &self.root));
    }

    /// A split store's second filesystem, at `containers` in the directory.
    pub(super) fn make_container_filesystem(&mut self, fs_size_mb: u64) {
        let root = self.dir.join("containers");
        self.container_loop_device = Some(self.loop_filesystem("containers.img", fs_size_mb, &root));
        self.container_root = Some(root);
    }

    /// An ext4 filesystem of `fs_size_mb` MiB in the file `name`, mounted at
    /// `mount_point` through a loop device, which it returns.
    fn loop_filesystem(&self, name: &str, fs_size_mb: u64, mount_point: &Path) -> String {
        let image = self.dir.join(name);
        let file = fs::File::create(&image).expect("creating the filesystem image");
        file.set_len(fs_size_mb * 1024 * 1024)
            .expect("sizing the filesystem image");
        drop(file);
        run(Command::new("mkfs.ext4").args(["-q", "-F", "-m", "0"]).arg(&image));
        fs::create_dir(mount_point).expect("creating the mount point");
        let device = {
            let _guard = LOOP_SETUP.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            run(Command::new("losetup").args(["--find", "--show"]).arg(&image))
        };
        let device = device.trim().to_string();
        run(Command::new("mount").args(["-t", "ext4", &device]).arg(mount_point));
        device
    }

    pub(super) fn write_config(&self) {
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
        let template = include_str!("../../runtimes/containerd2.toml.example");
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

    pub(super) fn spawn_containerd(&mut self) {
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

    pub(super) async fn wait_until_ready(&mut self) {
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
    pub(super) async fn start_registry(&mut self) {
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
        let mut config = include_str!("../../runtimes/crio.conf.example").to_string();
        if self.container_root.is_some() {
            // A split store: the images on the test bed's filesystem, the
            // containers' writable layers on the second one.
            config = config.replace(
                "root = \"@DIR@/root\"\n",
                "root = \"@DIR@/containers\"\nimagestore = \"@DIR@/root\"\n",
            );
            assert!(config.contains("imagestore"), "crio.conf.example no longer sets root");
        }
        let config = config
            .replace("@DIR@", &dir)
            .replace("@PINNS@", &bin.join("pinns").display().to_string())
            .replace("@PAUSE_IMAGE@", PAUSE_IMAGE)
            .replace("@PAUSE_COMMAND@", crate::oci::SLEEPER_PATH);
        fs::write(self.dir.join("crio.conf"), config).expect("writing the CRI-O config");
        let registries = include_str!("../../runtimes/registries.conf.example").replace("@PORT@", &port.to_string());
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
    pub(super) async fn push_and_pull(&self, tarball: &Path, names: &[String]) -> Result<(), String> {
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
}

/// Fails the test with what is missing when the machine cannot run a test bed.
pub(super) fn check_prerequisites(kind: Kind) {
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
