"""README's own commands, run as written on the test cluster: install,
verify, take over and uninstall, with kustomize and with Helm, on
containerd at its paths and on the k3s socket path, and on a CRI-O node
(IMAGEGC_CLUSTER_RUNTIME=crio) with CRI-O's component and values file. The fenced blocks
marked `<!-- readme-test: NAME -->` are extracted and run with bash from a
scratch directory holding a copy of deploy/ (README's commands are run from
the repository's top directory).

What is substituted, and nothing else:
- the image: README's `registry.example.com/imagegc` is the test bed's
  image name (imported into the node's containerd, never pulled);
- the runtime's paths in the copy of deploy/: the test bed's containerd
  listens in its own directory and keeps its root on its own filesystem, so
  the base's /run/containerd and /var/lib/containerd, and the k3s
  component's root, name the test bed's. For k3s the socket path is the
  component's own, /run/k3s/containerd/containerd.sock: the test bed's
  socket directory is bind-mounted there for the test; for CRI-O likewise
  /run/crio/crio.sock, and its root /var/lib/containers/storage names the
  directory holding the test bed's CRI-O root and image store;
- choosing the runtime as README says: uncommenting the k3s (crio)
  component, or adding the k3s (crio) values file to `helm install`;
- the kubelet's file the takeover mounts (/var/lib/kubelet/config.yaml) is
  written for the test, with the kubelet's image GC turned off as README's
  step 3 says: the test bed's kubelet reads its own elsewhere.

After uninstall, what README says is left is left (/var/lib/imagegc on the
node), and nothing else: no resource labelled as imagegc's in any
namespace, no new entry under /etc, /run, /var/lib or /usr/local/bin."""

import os
import re
import shutil
import subprocess
import tempfile

import pytest

from cluster import IMAGEGC_IMAGE, run, wait_for
from deploy import REPO

README = os.path.join(REPO, "README.md")
STATE_DIR = "/var/lib/imagegc"
K3S_SOCKET_DIR = "/run/k3s/containerd"
K3S_ROOT = "/var/lib/rancher/k3s/agent/containerd"
CRIO_SOCKET_DIR = "/run/crio"
CRIO_ROOT = "/var/lib/containers/storage"
KUBELET_FILE = "/var/lib/kubelet/config.yaml"
WATCHED = ["/etc", "/run", "/var/lib", "/usr/local/bin"]


def readme_blocks():
    """{name: shell text} of README's marked blocks, indentation removed."""
    with open(README) as f:
        text = f.read()
    blocks = {}
    for m in re.finditer(r"<!-- readme-test: ([a-z-]+) -->\n([ \t]*)```sh\n(.*?)\n[ \t]*```", text, re.S):
        indent = m.group(2)
        lines = [line[len(indent):] if line.startswith(indent) else line for line in m.group(3).split("\n")]
        blocks[m.group(1)] = "\n".join(lines) + "\n"
    return blocks


def host_entries():
    return {os.path.join(d, e) for d in WATCHED if os.path.isdir(d) for e in os.listdir(d)}


class Readme:
    def __init__(self, cluster, runtime):
        self.cluster = cluster
        self.runtime = runtime
        self.blocks = readme_blocks()
        self.dir = tempfile.mkdtemp(prefix="readme-", dir=cluster.path("work"))
        shutil.copytree(os.path.join(REPO, "deploy"), os.path.join(self.dir, "deploy"),
                        ignore=shutil.ignore_patterns("tests", "__pycache__"))
        self._paths()
        bin_dir = os.environ["IMAGEGC_KUBERNETES_BIN"]
        self.env = dict(os.environ, KUBECONFIG=cluster.kubeconfig, PATH=f"{bin_dir}:{os.environ['PATH']}",
                        HELM_CACHE_HOME=os.path.join(self.dir, ".helm"),
                        HELM_CONFIG_HOME=os.path.join(self.dir, ".helm"), HELM_DATA_HOME=os.path.join(self.dir, ".helm"))

    def _paths(self):
        """The copy of deploy/ names the test bed's runtime paths."""
        c = self.cluster
        if self.runtime == "containerd":
            changes = {"/run/containerd": c.socket_dir, "/var/lib/containerd": c.containerd_root}
            files = ["daemonset.yaml", "helm/imagegc/values.yaml"]
        elif self.runtime == "crio":
            changes = {CRIO_ROOT: c.runtime_root}
            files = ["components/crio/kustomization.yaml", "helm/imagegc/runtimes/crio.yaml"]
        else:
            changes = {K3S_ROOT: c.containerd_root}
            files = ["components/k3s/kustomization.yaml", "helm/imagegc/runtimes/k3s.yaml"]
        for name in files:
            path = os.path.join(self.dir, "deploy", name)
            with open(path) as f:
                text = f.read()
            for old, new in changes.items():
                assert old in text, f"{old} not in {name}"
                text = text.replace(old, new)
            with open(path, "w") as f:
                f.write(text)

    def script(self, name):
        text = self.blocks[name].replace("registry.example.com/imagegc", IMAGEGC_IMAGE.rsplit(":", 1)[0])
        if self.runtime in ("k3s", "crio"):
            r = self.runtime
            if name == "install-kustomize":
                assert f"  # - ../deploy/components/{r}\n" in text
                text = text.replace(f"  # - ../deploy/components/{r}\n", f"  - ../deploy/components/{r}\n")
            if name == "install-helm":
                text = re.sub(r"(helm install [^\n]*\\\n[^\n]*)", rf"\1 --values deploy/helm/imagegc/runtimes/{r}.yaml",
                              text)
                assert f"runtimes/{r}.yaml" in text
        return text

    def run(self, name, timeout=400):
        text = self.script(name)
        p = subprocess.run(["bash", "-euo", "pipefail", "-c", text], cwd=self.dir, env=self.env,
                           capture_output=True, text=True, timeout=timeout)
        assert p.returncode == 0, f"README block {name} exited {p.returncode}:\n{text}\n{p.stdout}\n{p.stderr}"
        return p.stdout + p.stderr


def _socket_dir_at(cluster, path):
    """The test bed's socket directory bind-mounted at `path` while the
    context lasts; the directories made for it removed after."""
    created = []
    d = path
    while not os.path.exists(d):
        created.append(d)
        d = os.path.dirname(d)
    os.makedirs(path, exist_ok=True)
    run(["mount", "--bind", cluster.socket_dir, path])
    try:
        yield
    finally:
        run(["umount", "-l", path], check=False)
        for d in created:
            os.rmdir(d)


@pytest.fixture
def k3s_socket_path(cluster):
    """The test bed's socket directory at k3s's path, for the test."""
    yield from _socket_dir_at(cluster, K3S_SOCKET_DIR)


@pytest.fixture
def crio_socket_path(cluster):
    """The test bed's socket directory at CRI-O's path (/run/crio/crio.sock
    is the test bed's socket there), for the test."""
    yield from _socket_dir_at(cluster, CRIO_SOCKET_DIR)


def leftovers(cluster):
    """Resources labelled as imagegc's, in any namespace."""
    kinds = cluster.kubectl("api-resources", "--verbs=list", "--namespaced", "-o", "name").stdout.split()
    kinds = [k for k in kinds if k not in ("events", "events.events.k8s.io")]
    listed = cluster.kubectl("get", ",".join(kinds), "--all-namespaces", "-l", "app.kubernetes.io/name=imagegc",
                             "-o", "name", check=False)
    return listed.stdout.split()


@pytest.mark.parametrize("runtime", ["containerd", "k3s", "crio"])
@pytest.mark.parametrize("how", ["kustomize", "helm"])
def test_readme_install_verify_takeover_uninstall(cluster, how, runtime, request):
    if (runtime == "crio") != (cluster.runtime == "crio"):
        pytest.skip(f"README's {runtime} install needs a {'CRI-O' if runtime == 'crio' else 'containerd'} node; "
                    f"this one runs {cluster.runtime} (IMAGEGC_CLUSTER_RUNTIME)")
    if runtime in ("k3s", "crio"):
        request.getfixturevalue(f"{runtime}_socket_path")
    assert not os.path.exists(STATE_DIR), f"{STATE_DIR} exists before the test: it would be used and removed"
    cluster.ensure_imagegc_image()
    before = host_entries()
    readme = Readme(cluster, runtime)
    kubelet_file_made = False
    try:
        readme.run(f"install-{how}")
        verify = readme.run("verify")
        assert re.search(r"image filesystem: \S+: .* used of .*; high 80%, low 75%", verify), verify
        assert "cannot be measured" not in verify, verify
        assert cluster.containerd_root in verify, verify
        # Step 2, confirm: `imagegc plan` through the pod on a chosen node.
        confirm = readme.run("confirm")
        assert re.search(r"high 80%, low 75%", confirm), confirm
        # Step 3 of the takeover done on the node: the kubelet's file with
        # its image GC off, where the kubelet-config component (or the
        # chart's kubelet.configPath) mounts it.
        assert not os.path.exists(KUBELET_FILE)
        with open(KUBELET_FILE, "w") as f:
            f.write("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                    "imageGCHighThresholdPercent: 100\nimageMaximumGCAge: 0s\n")
        kubelet_file_made = True
        out = readme.run(f"takeover-{how}")
        assert "warning:" not in out.lower(), out
        assert f"config = \"{KUBELET_FILE}\"" in out, out
        readme.run(f"uninstall-{how}")
        assert cluster.kubectl("get", "namespace", "imagegc", check=False).returncode != 0
        assert leftovers(cluster) == []
        if how == "helm":
            assert cluster.helm("list", "--all-namespaces", "-q").stdout.strip() == ""
        # What README says is left, and nothing else.
        assert os.path.isdir(STATE_DIR), f"README says {STATE_DIR} is left on the node"
        new = host_entries() - before
        assert new == {STATE_DIR}, f"left on the node besides {STATE_DIR}: {sorted(new - {STATE_DIR})}"
    finally:
        cluster.kubectl("delete", "namespace", "imagegc", "--wait=true", "--ignore-not-found", check=False,
                        timeout=180)
        wait_for("the imagegc namespace gone",
                 lambda: cluster.kubectl("get", "namespace", "imagegc", check=False).returncode != 0, 120, 1)
        if kubelet_file_made:
            os.unlink(KUBELET_FILE)
        shutil.rmtree(STATE_DIR, ignore_errors=True)
