"""A private single-node Kubernetes cluster on 127.0.0.1 for the tests.

Everything lives under one directory (/tmp/igck-XXXXXX): etcd, the PKI, the
API server, controller-manager, scheduler, the container runtime and a
kubelet (node `localhost`, cgroupfs) on the bridge CNI. The runtime is
containerd 2.x (`runtime="containerd"`, the default), whose root is its own
loop-mounted 1 GiB ext4 filesystem, or CRI-O (`runtime="crio"`) with a split
image store (KEP-4191): its images on one loop-mounted 1 GiB ext4
(`imagestore`), its root, where the containers' writable layers go, on
another of 512 MiB. A private registry runs on 127.0.0.1 (`registry`:
host:port) for either runtime: CRI-O pulls the test images from it, which
`build_and_import` pushes them to, as the end-to-end test bed does;
containerd gets them by `ctr images import`, and pulls over the network
what `push_oci` put there (the pull scenarios), through a hosts.toml that
names the registry's plain-http address. `down()` stops it all and removes
what the kubelet and the runtime leave outside that directory (see
TESTBED.md, "A real Kubernetes node"): kubepods cgroups, the bridge,
iptables chains, the kubelet's fixed paths.
Paths that existed before are left alone.

Binaries come from scripts/testbed-kubernetes.sh and testbed-runtimes.sh
($IMAGEGC_KUBERNETES_BIN, $IMAGEGC_CONTAINERD_BIN, $IMAGEGC_CRIO_BIN).
"""

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import textwrap
import time
import urllib.request

import oci

NODE = "localhost"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.2"
IMAGEGC_IMAGE = "ghcr.io/imagegc/imagegc:0.2.0"
MIB = 1024 * 1024
FS_SIZE = 1024 * MIB
# CRI-O's root (the containers' writable layers) on a filesystem of another
# size than the image store's, so that a capacity tells which one was measured.
CONTAINER_FS_SIZE = 512 * MIB
RUNTIMES = ("containerd", "crio")
POD_SUBNET = "10.253.0.0/24"
# The bridge's address on the host (host-local's first address): pods reach
# the API server there, as there is no kube-proxy to route the kubernetes
# Service's 10.0.0.1 (imagegc's [kubernetes] scenarios).
GATEWAY = "10.253.0.1"
BRIDGE = "igck0"
# Paths the kubelet or the CNI plugins use whatever their flags say.
HOST_PATHS = ["/var/lib/kubelet", "/var/log/containers", "/var/log/pods", "/usr/libexec/kubernetes",
              "/var/lib/cni", "/run/containerd", "/var/run/nri", "/etc/cni", "/opt/cni", "/run/netns",
              # containers/image's blob cache, written by CRI-O's pulls and skopeo.
              "/var/lib/containers"]
CGROUP_ROOT = "/sys/fs/cgroup"

# CRI-O's `runtime_path`: runc, with the bundle's config.json fixed first
# for this VM (TESTBED.md): a negative `oomScoreAdj` set to 0, since it
# refuses lowering it even for root (the end-to-end test bed's wrapper does
# the same), and the kubelet's `hugepageLimits` left out, since /proc/cgroups
# lists the hugetlb controller (so CRI-O passes them on) while no cgroup v1
# hierarchy has it (so runc cannot set them: "cannot set hugetlb limit:
# container could not join or create cgroup"). Under the kubelet CRI-O
# writes the file indented: read as JSON, not with sed.
RUNC_WRAPPER = r"""#!/bin/sh
bundle=
previous=
for arg in "$@"; do
    case "$previous" in --bundle|-b) bundle=$arg ;; esac
    case "$arg" in --bundle=*) bundle=${arg#--bundle=} ;; esac
    previous=$arg
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
    /usr/bin/python3 - "$bundle/config.json" <<'PY'
import json, sys
path = sys.argv[1]
with open(path) as f:
    spec = json.load(f)
process = spec.get("process") or {}
if (process.get("oomScoreAdj") or 0) < 0:
    process["oomScoreAdj"] = 0
(spec.get("linux") or {}).get("resources", {}).pop("hugepageLimits", None)
with open(path, "w") as f:
    json.dump(spec, f)
PY
fi
exec runc "$@"
"""
# The names the suite gives images come from these registries; on CRI-O each
# is pulled from the private registry, under the same path.
REGISTRIES = ("registry.k8s.io", "ghcr.io", "registry.example")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(argv, check=True, timeout=120, **kw):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
    return p


def bare(image_id):
    """An image id without its digest algorithm: CRI-O lists bare ids,
    containerd and imagegc's journal say sha256:<hex>."""
    return image_id.removeprefix("sha256:")


def wait_for(what, fn, timeout, interval=0.25):
    """Polls fn() until it returns a truthy value; raises naming `what`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = fn()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - reported when the wait fails
            last = e
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}" + (f" (last error: {last})" if last else ""))


def statvfs_usage(path):
    """The kubelet's arithmetic: 100 - available*100/capacity, rounded up."""
    st = os.statvfs(path)
    capacity = st.f_blocks * st.f_frsize
    available = st.f_bavail * st.f_frsize
    return -(-(capacity - available) * 100 // capacity), capacity, available


class Cluster:
    def __init__(self, kube_bin, containerd_bin, kubelet_overrides=None, runtime="containerd", crio_bin=None):
        assert runtime in RUNTIMES, f"runtime {runtime!r} is not one of {RUNTIMES}"
        self.kube_bin = kube_bin
        self.containerd_bin = containerd_bin
        # "containerd" or "crio": what the node runs, for scenarios to ask.
        self.runtime = runtime
        self.crio_bin = crio_bin
        self.kubelet_overrides = kubelet_overrides or {}
        self.procs = {}
        self.dir = None
        self.timings = {}
        self.host_before = {}

    # --- paths ------------------------------------------------------------

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    @property
    def socket(self):
        # CRI-O's socket keeps the name its deploy component expects in the
        # socket directory (crio.sock); the kubelet reads its stats over CRI
        # for either runtime (a path ending run/crio/crio.sock would make it
        # ask cAdvisor, which looks for CRI-O at /var/run/crio/crio.sock).
        return self.path("run", "crio.sock" if self.runtime == "crio" else "containerd.sock")

    @property
    def socket_dir(self):
        return self.path("run")

    @property
    def runtime_root(self):
        """What imagegc's DaemonSet mounts as the runtime's root: containerd's
        root, or the directory holding CRI-O's root and its image store."""
        return self.path("containers") if self.runtime == "crio" else self.path("ctd", "root")

    @property
    def containerd_root(self):
        """The runtime's root as the DaemonSet mounts it (the name predates
        CRI-O on the cluster; see runtime_root)."""
        return self.runtime_root

    @property
    def crio_root(self):
        """CRI-O's `root`: the containers' writable layers (its own filesystem)."""
        return self.path("containers", "storage")

    @property
    def crio_image_store(self):
        """CRI-O's `imagestore`: the images (their own filesystem)."""
        return self.path("containers", "images")

    @property
    def image_fs(self):
        """The mount point the runtime's ImageFsInfo names for its images."""
        if self.runtime == "crio":
            return os.path.join(self.crio_image_store, "overlay-images")
        return os.path.join(self.containerd_root, "io.containerd.snapshotter.v1.overlayfs")

    @property
    def container_fs(self):
        """The mount point ImageFsInfo names for the containers' writable
        layers: another filesystem on CRI-O's split store, else the image one."""
        if self.runtime == "crio":
            return os.path.join(self.crio_root, "overlay-containers")
        return self.image_fs

    @property
    def kubeconfig(self):
        return self.path("pki", "admin.kubeconfig")

    def bin(self, name):
        for d in (self.kube_bin, self.containerd_bin, self.crio_bin):
            if d is None:
                continue
            p = os.path.join(d, name)
            if os.access(p, os.X_OK):
                return p
        raise FileNotFoundError(name)

    # --- bring-up ---------------------------------------------------------

    def up(self):
        started = time.monotonic()
        self.dir = tempfile.mkdtemp(prefix="igck-", dir="/tmp")
        os.chmod(self.dir, 0o755)
        self._record_host()
        runtime_dirs = (("containers/storage", "containers/images", "crio/run", "crio/ns", "crio/runc", "crio/exits",
                         "crio/attach", "crio/logs", "crio/conf.d", "crio/registries.d")
                        if self.runtime == "crio" else ("ctd/root", "ctd/state", "ctd/opt", "ctd/runc", "ctd/s",
                                                        "ctd/hosts"))
        for sub in ("pki", "etcd", "logs", "run", "registry", *runtime_dirs,
                    "cni/net.d", "cni/ipam", "kubelet", "kubelet-certs", "kubelet-plugins", "pod-logs",
                    "manifests", "images", "work"):
            os.makedirs(self.path(sub), exist_ok=True)
        self._filesystem()
        self._pki()
        self.ports = {name: free_port() for name in ("etcd", "etcd_peer", "apiserver", "kubelet")}
        self._start_etcd()
        self._start_apiserver()
        self._start("kube-controller-manager", [
            self.bin("kube-controller-manager"), f"--kubeconfig={self.path('pki', 'controller-manager.kubeconfig')}",
            "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0",
            f"--service-account-private-key-file={self.path('pki', 'sa.key')}",
            f"--root-ca-file={self.path('pki', 'ca.crt')}", "--use-service-account-credentials=true",
            "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-route",
            # Evicted pods stay to be looked at; no garbage collection of them.
            "--terminated-pod-gc-threshold=1000"])
        self._start("kube-scheduler", [
            self.bin("kube-scheduler"), f"--kubeconfig={self.path('pki', 'scheduler.kubeconfig')}",
            "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0"])
        self._start_registry()
        self._start_containerd()
        self._import_base_images()
        self._start_kubelet()
        wait_for("node localhost Ready", self._node_ready, 90, 0.5)
        wait_for("the default ServiceAccount", lambda: self.kubectl(
            "get", "serviceaccount", "default", check=False).returncode == 0, 60, 0.5)
        self.timings["bring-up"] = time.monotonic() - started
        return self

    def _record_host(self):
        self.host_before["paths"] = {p for p in HOST_PATHS if os.path.lexists(p)}
        self.host_before["cgroups"] = {h for h in self._cgroup_hierarchies()
                                       if os.path.isdir(os.path.join(h, "kubepods"))}
        self.host_before["links"] = set(os.listdir("/sys/class/net"))
        self.host_before["chains"] = self._chains()

    def _filesystem(self):
        if self.runtime == "crio":
            # The parent the DaemonSet mounts, then the two stores in it.
            run(["mount", "--bind", self.runtime_root, self.runtime_root])
            run(["mount", "--make-shared", self.runtime_root])
            self._loop_fs("images.img", FS_SIZE, self.crio_image_store)
            self._loop_fs("storage.img", CONTAINER_FS_SIZE, self.crio_root)
        else:
            self._loop_fs("ctd.img", FS_SIZE, self.containerd_root)

    def _loop_fs(self, name, size, mount_point):
        img = self.path(name)
        with open(img, "wb") as f:
            f.truncate(size)
        run(["mkfs.ext4", "-q", "-F", "-m", "0", img])
        run(["mount", "-o", "loop", img, mount_point])
        # A mount a pod mounts with mountPropagation HostToContainer must be
        # shared or slave on the node (containerd refuses a private one), as
        # every mount is on a systemd node, where / is shared.
        run(["mount", "--make-shared", mount_point])

    def _pki(self):
        pki = self.path("pki")

        def openssl(*args):
            run(["openssl", *args], cwd=pki)

        def key(name):
            openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key")

        key("ca")
        openssl("req", "-x509", "-new", "-key", "ca.key", "-out", "ca.crt", "-days", "3",
                "-subj", "/CN=imagegc-test-ca")

        def cert(name, subject, server=False, sans=()):
            key(name)
            openssl("req", "-new", "-key", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)
            ext = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
                   "extendedKeyUsage=" + ("serverAuth,clientAuth" if server else "clientAuth")]
            if sans:
                ext.append("subjectAltName=" + ",".join(sans))
            with open(os.path.join(pki, f"{name}.ext"), "w") as f:
                f.write("\n".join(ext) + "\n")
            openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                    "-out", f"{name}.crt", "-days", "3", "-extfile", f"{name}.ext")

        cert("apiserver", "/CN=kube-apiserver", server=True,
             sans=("IP:127.0.0.1", "IP:10.0.0.1", f"IP:{GATEWAY}", "DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default",
                   "DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local"))
        cert("admin", "/O=system:masters/CN=admin")
        cert("apiserver-kubelet", "/O=system:masters/CN=kube-apiserver-kubelet-client")
        cert("controller-manager", "/CN=system:kube-controller-manager")
        cert("scheduler", "/CN=system:kube-scheduler")
        cert("kubelet", f"/O=system:nodes/CN=system:node:{NODE}")
        key("sa")
        openssl("ec", "-in", "sa.key", "-pubout", "-out", "sa.pub")

    def _kubeconfig(self, name):
        pki = self.path("pki")
        path = os.path.join(pki, f"{name}.kubeconfig")
        with open(path, "w") as f:
            f.write(textwrap.dedent(f"""\
                apiVersion: v1
                kind: Config
                clusters:
                - name: test
                  cluster:
                    server: https://127.0.0.1:{self.ports['apiserver']}
                    certificate-authority: {pki}/ca.crt
                users:
                - name: {name}
                  user:
                    client-certificate: {pki}/{name}.crt
                    client-key: {pki}/{name}.key
                contexts:
                - name: test
                  context: {{cluster: test, user: {name}}}
                current-context: test
                """))
        return path

    def _start(self, name, argv, env=None):
        log = open(self.path("logs", f"{name}.log"), "ab")
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                                start_new_session=True)
        log.close()
        self.procs[name] = proc
        return proc

    def _alive(self, name):
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            raise RuntimeError(f"{name} exited; last lines of its log:\n{self.log_tail(name)}")
        return proc

    def log_tail(self, name, lines=30):
        try:
            with open(self.path("logs", f"{name}.log"), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def _start_etcd(self):
        p = self.ports
        self._start("etcd", [
            self.bin("etcd"), "--name=default", f"--data-dir={self.path('etcd')}",
            f"--listen-client-urls=http://127.0.0.1:{p['etcd']}",
            f"--advertise-client-urls=http://127.0.0.1:{p['etcd']}",
            f"--listen-peer-urls=http://127.0.0.1:{p['etcd_peer']}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{p['etcd_peer']}",
            f"--initial-cluster=default=http://127.0.0.1:{p['etcd_peer']}",
            "--unsafe-no-fsync", "--log-level=warn"])

        def healthy():
            self._alive("etcd")
            with urllib.request.urlopen(f"http://127.0.0.1:{p['etcd']}/health", timeout=2) as r:
                return json.load(r).get("health") == "true"
        wait_for("etcd", healthy, 30)

    def _start_apiserver(self):
        pki = self.path("pki")
        self._start("kube-apiserver", [
            self.bin("kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            # Every address, for pods to reach it on the bridge (GATEWAY);
            # clients still need the cluster's certificates or tokens.
            "--bind-address=0.0.0.0", "--advertise-address=127.0.0.1",
            f"--secure-port={self.ports['apiserver']}", "--service-cluster-ip-range=10.0.0.0/24",
            "--endpoint-reconciler-type=none", "--authorization-mode=Node,RBAC", "--allow-privileged=true",
            f"--client-ca-file={pki}/ca.crt", f"--tls-cert-file={pki}/apiserver.crt",
            f"--tls-private-key-file={pki}/apiserver.key",
            f"--kubelet-client-certificate={pki}/apiserver-kubelet.crt",
            f"--kubelet-client-key={pki}/apiserver-kubelet.key",
            "--kubelet-preferred-address-types=Hostname,InternalIP",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki}/sa.pub", f"--service-account-signing-key-file={pki}/sa.key",
            "--profiling=false"])
        for name in ("admin", "controller-manager", "scheduler", "kubelet"):
            self._kubeconfig(name)

        def ready():
            self._alive("kube-apiserver")
            return self.kubectl("get", "--raw", "/readyz", check=False, timeout=10).stdout.strip() == "ok"
        wait_for("the API server", ready, 60, 0.5)

    def stop_apiserver(self):
        """Stops the API server (SIGTERM, SIGKILL after 5 s): an outage."""
        self._stop("kube-apiserver", timeout=5)

    def start_apiserver(self):
        """Starts the API server again and waits until it is ready."""
        self._start_apiserver()

    def containerd_config(self):
        d = self.dir
        return textwrap.dedent(f"""\
            version = 3
            root = "{self.containerd_root}"
            state = "{d}/ctd/state"
            imports = []

            [grpc]
              address = "{self.socket}"

            [ttrpc]
              address = "{self.socket}.ttrpc"

            [plugins."io.containerd.internal.v1.opt"]
              path = "{d}/ctd/opt"

            [plugins."io.containerd.nri.v1.nri"]
              disable = true

            [plugins."io.containerd.shim.v1.manager"]
              socket_dir = "{d}/ctd/s"

            [plugins."io.containerd.cri.v1.images"]
              snapshotter = "overlayfs"
              [plugins."io.containerd.cri.v1.images".pinned_images]
                sandbox = "{PAUSE_IMAGE}"
              [plugins."io.containerd.cri.v1.images".registry]
                config_path = "{d}/ctd/hosts"

            [plugins."io.containerd.cri.v1.runtime"]
              disable_apparmor = true
              restrict_oom_score_adj = true
              netns_mounts_under_state_dir = true
              cdi_spec_dirs = []
              [plugins."io.containerd.cri.v1.runtime".containerd]
                default_runtime_name = "runc"
                [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
                  runtime_type = "io.containerd.runc.v2"
                  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
                    Root = "{d}/ctd/runc"
              [plugins."io.containerd.cri.v1.runtime".cni]
                bin_dirs = ["/usr/lib/cni"]
                conf_dir = "{d}/cni/net.d"
            """)

    def _start_containerd(self):
        if self.runtime == "containerd":
            assert len(self.path("ctd", "s")) <= 42, "the shim socket directory path is too long"
            with open(self.path("containerd.toml"), "w") as f:
                f.write(self.containerd_config())
            # The private registry over plain http (TESTBED.md): a directory
            # named host:port under config_path, holding its hosts.toml.
            hosts = self.path("ctd", "hosts", self.registry)
            os.makedirs(hosts, exist_ok=True)
            with open(os.path.join(hosts, "hosts.toml"), "w") as f:
                f.write(textwrap.dedent(f"""\
                    server = "http://{self.registry}"

                    [host."http://{self.registry}"]
                      capabilities = ["pull", "resolve"]
                    """))
        else:
            self._write_crio_config()
        with open(self.path("cni", "net.d", "10-igck.conflist"), "w") as f:
            json.dump({"cniVersion": "1.0.0", "name": "igck", "plugins": [{
                "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                         "routes": [{"dst": "0.0.0.0/0"}], "dataDir": self.path("cni", "ipam")}}]}, f)
        self.start_containerd()

    def start_containerd(self):
        """Starts the node's runtime (containerd or CRI-O: the name predates
        CRI-O on the cluster) and waits until its CRI answers."""
        if self.runtime == "crio":
            self._start("containerd", self._crio_command())
        else:
            env = dict(os.environ, PATH=f"{self.containerd_bin}:{os.environ.get('PATH', '/usr/sbin:/usr/bin')}")
            self._start("containerd", [os.path.join(self.containerd_bin, "containerd"), "--config",
                                       self.path("containerd.toml")], env=env)

        def answers():
            self._alive("containerd")
            return self.crictl("version", check=False, timeout=5).returncode == 0
        wait_for(f"{self.runtime}'s CRI", answers, 30)

    def stop_containerd(self):
        """Stops the node's runtime (containerd or CRI-O); its containers run on."""
        self._stop("containerd")

    # The same, by a name that says either runtime.
    start_runtime = start_containerd
    stop_runtime = stop_containerd

    # --- CRI-O ----------------------------------------------------------------

    def crio_config(self):
        """CRI-O's configuration, as the end-to-end test bed writes it
        (crates/imagegc-testkit/runtimes/crio.conf.example), with the
        cluster's paths, the bridge CNI and the split image store."""
        d = self.dir
        return textwrap.dedent(f"""\
            [crio]
            root = "{self.crio_root}"
            imagestore = "{self.crio_image_store}"
            runroot = "{d}/crio/run/storage"
            storage_driver = "overlay"
            log_dir = "{d}/crio/logs"
            version_file = "{d}/crio/run/version"
            version_file_persist = "{d}/crio/version"
            clean_shutdown_file = "{d}/crio/clean.shutdown"
            internal_wipe = true

            [crio.api]
            listen = "{self.socket}"
            stream_address = "127.0.0.1"
            stream_port = "0"

            [crio.runtime]
            default_runtime = "runc"
            conmon_cgroup = "pod"
            cgroup_manager = "cgroupfs"
            selinux = false
            apparmor_profile = "unconfined"
            namespaces_dir = "{d}/crio/ns"
            pinns_path = "{self.bin('pinns')}"
            container_exits_dir = "{d}/crio/exits"
            container_attach_socket_dir = "{d}/crio/attach"
            hooks_dir = []
            cdi_spec_dirs = []
            decryption_keys_path = "{d}/crio/keys"

            [crio.runtime.runtimes.runc]
            runtime_path = "{d}/crio/runc-wrapper"
            runtime_root = "{d}/crio/runc"
            runtime_type = "oci"
            monitor_path = "/usr/bin/conmon"
            monitor_cgroup = "pod"

            [crio.image]
            pause_image = "{PAUSE_IMAGE}"
            pause_command = "/pause"
            signature_policy = "{d}/crio/policy.json"

            [crio.network]
            network_dir = "{d}/cni/net.d"
            plugin_dirs = ["/usr/lib/cni"]

            [crio.metrics]
            enable_metrics = false

            [crio.tracing]
            enable_tracing = false

            [crio.nri]
            enable_nri = false
            """)

    def _write_crio_config(self):
        with open(self.path("crio", "crio.conf"), "w") as f:
            f.write(self.crio_config())
        wrapper = self.path("crio", "runc-wrapper")
        with open(wrapper, "w") as f:
            f.write(RUNC_WRAPPER)
        os.chmod(wrapper, 0o755)
        with open(self.path("crio", "policy.json"), "w") as f:
            json.dump({"default": [{"type": "insecureAcceptAnything"}]}, f)
        # CRI-O 1.36 ignores insecure_registries: a registries.conf naming
        # the private registry for each registry the suite's names come from.
        lines = ['unqualified-search-registries = []', 'short-name-mode = "disabled"', ""]
        for prefix in REGISTRIES:
            lines += ["[[registry]]", f'prefix = "{prefix}"',
                      f'location = "127.0.0.1:{self.ports["registry"]}/{prefix}"', "insecure = true", ""]
        # And the registry by its own address (what `push_oci` names).
        lines += ["[[registry]]", f'location = "{self.registry}"', "insecure = true", ""]
        with open(self.path("crio", "registries.conf"), "w") as f:
            f.write("\n".join(lines))

    def _crio_command(self):
        c = self.path("crio")
        return [self.bin("crio"), "--config", f"{c}/crio.conf", "--config-dir", f"{c}/conf.d",
                "--registries-conf", f"{c}/registries.conf", "--registries-conf-dir", f"{c}/registries.d",
                "--signature-policy", f"{c}/policy.json"]

    @property
    def registry(self):
        """The private registry's host:port, as image names give it."""
        return f"127.0.0.1:{self.ports['registry']}"

    def _start_registry(self):
        """Debian's docker-registry on 127.0.0.1, storing on the machine's disk
        (the test bed's directory): where CRI-O pulls the suite's images
        from, and either runtime what the pull scenarios push."""
        self.ports["registry"] = free_port()
        with open(self.path("registry.yml"), "w") as f:
            f.write(textwrap.dedent(f"""\
                version: 0.1
                log:
                  level: warn
                storage:
                  filesystem:
                    rootdirectory: {self.path("registry")}
                  delete:
                    enabled: true
                http:
                  addr: 127.0.0.1:{self.ports["registry"]}
                """))
        self._start("registry", ["docker-registry", "serve", self.path("registry.yml")])

        def listening():
            self._alive("registry")
            with socket.create_connection(("127.0.0.1", self.ports["registry"]), timeout=1):
                return True
        wait_for("the registry", listening, 30)

    def _import_base_images(self):
        busybox = oci.busybox_layer()
        self.busybox_layer = busybox
        layers = [busybox]
        if self.runtime == "crio":
            # CRI-O runs its `pause_command` (no arguments) in the pause image.
            layers.append(oci.layer([("/pause", b"#!/bin/sh\nexec /bin/sleep 2147483647\n", 0o755)]))
        self.build_and_import(PAUSE_IMAGE, layers, entrypoint=["/bin/sleep", "2147483647"])

    def kubelet_config(self):
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": "127.0.0.1",
            "port": self.ports["kubelet"],
            "readOnlyPort": 0,
            "healthzPort": 0,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": self.path("pki", "ca.crt")}},
            "authorization": {"mode": "Webhook"},
            "cgroupDriver": "cgroupfs",
            "oomScoreAdj": 0,
            "failSwapOn": False,
            "makeIPTablesUtilChains": False,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "podLogsDir": self.path("pod-logs"),
            "staticPodPath": self.path("manifests"),
            "registerNode": True,
            "nodeStatusUpdateFrequency": "2s",
            # The kubelet's image GC off: imagegc collects (or nobody does,
            # in the control case).
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            # The eviction line on the image filesystem (the loop fs);
            # the node filesystem (the machine's disk) stays out of it.
            "evictionHard": {"imagefs.available": "30%", "nodefs.available": "1%",
                             "memory.available": "50Mi"},
            "evictionPressureTransitionPeriod": "5s",
        }
        config.update(self.kubelet_overrides)
        return config

    def _start_kubelet(self):
        with open(self.path("kubelet.yaml"), "w") as f:
            json.dump(self.kubelet_config(), f, indent=1)
        self.start_kubelet()

    def start_kubelet(self):
        env = dict(os.environ, PATH="/usr/sbin:/usr/bin:/sbin:/bin")
        self._start("kubelet", [
            self.bin("kubelet"), f"--config={self.path('kubelet.yaml')}",
            f"--kubeconfig={self.path('pki', 'kubelet.kubeconfig')}", f"--root-dir={self.path('kubelet')}",
            f"--cert-dir={self.path('kubelet-certs')}", f"--volume-plugin-dir={self.path('kubelet-plugins')}",
            f"--hostname-override={NODE}", "--v=2"], env=env)

    def stop_kubelet(self):
        self._stop("kubelet")

    def _node_ready(self):
        self._alive("kubelet")
        p = self.kubectl("get", "node", NODE, "-o", "json", check=False)
        if p.returncode != 0:
            return False
        conditions = json.loads(p.stdout)["status"].get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    # --- clients ----------------------------------------------------------

    def kubectl(self, *args, check=True, timeout=120, input=None):
        return run([self.bin("kubectl"), f"--kubeconfig={self.kubeconfig}", *args], check=check,
                   timeout=timeout, input=input)

    def kubectl_json(self, *args):
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def crictl(self, *args, check=True, timeout=60):
        return run([self.bin("crictl"), f"--runtime-endpoint=unix://{self.socket}",
                    f"--image-endpoint=unix://{self.socket}", "--timeout=30s", *args],
                   check=check, timeout=timeout)

    def ctr(self, *args, check=True, timeout=300):
        return run([os.path.join(self.containerd_bin, "ctr"), "-a", self.socket, "-n", "k8s.io", *args],
                   check=check, timeout=timeout)

    def helm(self, *args, check=True, timeout=180):
        return run([self.bin("helm"), f"--kubeconfig={self.kubeconfig}", *args], check=check, timeout=timeout,
                   env=dict(os.environ, HELM_CACHE_HOME=self.path("work", "helm-cache"),
                            HELM_CONFIG_HOME=self.path("work", "helm-config"),
                            HELM_DATA_HOME=self.path("work", "helm-data")))

    # --- images -----------------------------------------------------------

    def build_and_import(self, name, layers, **config):
        tar = self.path("images", name.replace("/", "_").replace(":", "_") + ".tar")
        digest = oci.write_image(tar, name, layers, **config)
        self.import_oci(tar, name)
        os.unlink(tar)
        return digest

    def import_oci(self, tar, name, all_platforms=False):
        """Puts the OCI archive `tar` (one image, named `name`) on the node:
        `ctr images import` on containerd; on CRI-O, `skopeo copy` to the
        private registry, then a CRI pull, as a node gets its images."""
        if self.runtime == "containerd":
            self.ctr("images", "import", *(["--all-platforms"] if all_platforms else []), tar)
            return
        run(["skopeo", "copy", "--quiet", "--preserve-digests", "--dest-tls-verify=false", f"oci-archive:{tar}",
             f"docker://127.0.0.1:{self.ports['registry']}/{name}"], timeout=300)
        self.crictl("pull", name, timeout=300)

    def push_oci(self, tar, ref):
        """Pushes the OCI archive `tar` to the private registry as `ref`
        (named `registry`/...), its layers as built (uncompressed, digests
        kept): the node then pulls it over the network, as a pod asks."""
        assert ref.startswith(self.registry + "/"), f"{ref} is not in the private registry {self.registry}"
        run(["skopeo", "copy", "--quiet", "--preserve-digests", "--dest-tls-verify=false", f"oci-archive:{tar}",
             f"docker://{ref}"], timeout=300)

    def images(self):
        """{repo tag: image id} of every image CRI lists."""
        listed = json.loads(self.crictl("images", "-o", "json").stdout)["images"]
        return {tag: image["id"] for image in listed for tag in image.get("repoTags") or []}

    def image_ids(self):
        """The ids of every image CRI lists, bare (see `bare`)."""
        return {bare(image["id"]) for image in json.loads(self.crictl("images", "-o", "json").stdout)["images"]}

    def remove_images(self, names):
        present = self.images()
        for name in names:
            if name in present:
                self.crictl("rmi", name, check=False)

    def usage(self):
        """(usage percent by the kubelet's arithmetic, capacity, available) of the image filesystem."""
        return statvfs_usage(self.image_fs)

    # --- teardown ---------------------------------------------------------

    def _stop(self, name, timeout=15):
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return None
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        return time.monotonic() - started

    def _stop_all(self):
        """SIGTERM to every process left at once (the API server alone takes
        about 20 s to drain its watches), SIGKILL after 5 s."""
        procs = [p for p in self.procs.values() if p.poll() is None]
        self.procs.clear()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)

    def down(self):
        if not self.dir:
            return []
        problems = []

        def attempt(what, fn):
            started = time.monotonic()
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - every step is tried
                problems.append(f"{what}: {e}")
            self.timings[f"teardown: {what}"] = time.monotonic() - started

        attempt("stopping Prometheus and the kubelet", lambda: (self._stop("prometheus"), self._stop("kubelet")))
        if "containerd" in self.procs:
            def pods():
                self.crictl("stopp", *self._pod_ids(), check=False, timeout=120)
                self.crictl("rmp", "-f", "-a", check=False, timeout=120)
            attempt("removing the pods over CRI", pods)
        attempt("stopping containerd", lambda: self._stop("containerd"))
        attempt("stopping the control plane", self._stop_all)
        attempt("ending the shims", self._kill_shims)
        attempt("ending the processes left in kubepods", self._kill_cgroup_procs)
        attempt("unmounting", self._unmount_all)
        attempt("removing kubepods cgroups", self._remove_cgroups)
        attempt("removing the bridge", self._remove_links)
        attempt("removing iptables chains", self._remove_chains)
        attempt("removing the kubelet's fixed paths", self._remove_host_paths)
        attempt("removing the directory", lambda: shutil.rmtree(self.dir))
        return problems

    def _pod_ids(self):
        return [line for line in self.crictl("pods", "-q", check=False).stdout.split() if line]

    def _own_pids(self, marker):
        pids = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline:
                pids.append(int(pid))
        return pids

    def _kill_shims(self):
        # containerd's shims name its socket; CRI-O's conmon processes name
        # paths under the test bed's directory.
        marker = f"{self.dir}/crio/" if self.runtime == "crio" else f"-address {self.socket}"
        for pid in self._own_pids(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _cgroup_hierarchies(self):
        out = []
        if not os.path.isdir(CGROUP_ROOT):
            return out
        for name in os.listdir(CGROUP_ROOT):
            p = os.path.join(CGROUP_ROOT, name)
            if os.path.isdir(p) and not os.path.islink(p):
                out.append(p)
        if os.path.exists(os.path.join(CGROUP_ROOT, "cgroup.procs")):
            out.append(CGROUP_ROOT)
        return out

    def _our_kubepods(self):
        return [os.path.join(h, "kubepods") for h in self._cgroup_hierarchies()
                if h not in self.host_before.get("cgroups", set()) and os.path.isdir(os.path.join(h, "kubepods"))]

    def _kill_cgroup_procs(self):
        for top in self._our_kubepods():
            for root, _, _ in os.walk(top):
                try:
                    with open(os.path.join(root, "cgroup.procs")) as f:
                        for pid in f.read().split():
                            try:
                                os.kill(int(pid), signal.SIGKILL)
                            except ProcessLookupError:
                                pass
                except OSError:
                    pass

    def _unmount_all(self):
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4] for line in f]
        ours = [p for p in points if p == self.dir or p.startswith(self.dir + "/")]
        for p in sorted(set(ours), key=lambda p: (-p.count("/"), p)):
            run(["umount", "-l", p], check=False)

    def _remove_cgroups(self):
        deadline = time.monotonic() + 10
        for top in self._our_kubepods():
            dirs = sorted((root for root, _, _ in os.walk(top)), key=lambda p: -p.count("/"))
            for d in dirs:
                while True:
                    try:
                        os.rmdir(d)
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.2)

    def _remove_links(self):
        for link in set(os.listdir("/sys/class/net")) - self.host_before.get("links", set()):
            if link == BRIDGE or link.startswith("veth") or link == "cni0":
                run(["ip", "link", "delete", link], check=False)

    @staticmethod
    def _chains():
        chains = set()
        for tool in ("iptables", "ip6tables"):
            if shutil.which(tool) is None:
                continue
            for table in ("filter", "nat", "mangle"):
                p = run([tool, "-t", table, "-S"], check=False, timeout=30)
                for line in p.stdout.splitlines():
                    if line.startswith("-N "):
                        chains.add((tool, table, line.split()[1]))
        return chains

    def _remove_chains(self):
        new = self._chains() - self.host_before.get("chains", set())
        new = {c for c in new if c[2].startswith(("KUBE-", "CNI-", "CRIO-"))}
        for tool, table, chain in sorted(new):
            rules = run([tool, "-t", table, "-S"], check=False, timeout=30).stdout.splitlines()
            for rule in rules:
                tokens = shlex.split(rule)
                if tokens[:1] == ["-A"] and "-j" in tokens and tokens[tokens.index("-j") + 1] == chain:
                    run([tool, "-t", table, "-D", *tokens[1:]], check=False)
        for tool, table, chain in sorted(new):
            run([tool, "-t", table, "-F", chain], check=False)
        for tool, table, chain in sorted(new):
            run([tool, "-t", table, "-X", chain], check=False)

    def _remove_host_paths(self):
        for p in HOST_PATHS:
            if p in self.host_before.get("paths", set()) or not os.path.lexists(p):
                continue
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            else:
                os.unlink(p)

    def leftovers(self):
        """What of this cluster is still on the machine (empty after down())."""
        found = []
        if self.dir and os.path.exists(self.dir):
            found.append(self.dir)
        with open("/proc/self/mountinfo") as f:
            found += [line.split()[4] for line in f if self.dir and line.split()[4].startswith(self.dir)]
        found += [f"process {pid}" for pid in self._own_pids(self.dir)] if self.dir else []
        found += [f"cgroup {p}" for p in self._our_kubepods()]
        found += [f"path {p}" for p in HOST_PATHS
                  if os.path.lexists(p) and p not in self.host_before.get("paths", set())]
        if os.path.exists(f"/sys/class/net/{BRIDGE}"):
            found.append(f"link {BRIDGE}")
        found += [f"{t} {tb} chain {c}" for t, tb, c in self._chains() - self.host_before.get("chains", set())]
        return found
