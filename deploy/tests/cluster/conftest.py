"""The session's cluster, shared by the scenarios, and its report.

Environment (scripts/test-cluster.sh sets it):
  IMAGEGC_KUBERNETES_BIN  kube-apiserver, kubelet, ..., etcd, helm, crictl
  IMAGEGC_CONTAINERD_BIN  containerd 2.x, its shim and ctr
  IMAGEGC_STATIC_BIN      the static imagegc binary the image is built from
  IMAGEGC_PROMETHEUS      the prometheus server binary
  IMAGEGC_CLUSTER_RUNTIME the node's runtime: containerd (the default) or
                          crio (CRI-O with a split image store)
  IMAGEGC_CRIO_BIN        CRI-O and pinns (with IMAGEGC_CLUSTER_RUNTIME=crio)
A missing prerequisite fails the scenarios with the reason; nothing is
skipped silently.
"""

import faulthandler
import os
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import releases  # noqa: E402
from cluster import IMAGEGC_IMAGE, RUNTIMES, Cluster  # noqa: E402
from deploy import DEPLOY, REPO, Prometheus  # noqa: E402

TIMINGS = {}
# The OCI architecture of this machine, for the image built for it.
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def record(name, seconds):
    TIMINGS[name] = seconds


def _env(name):
    value = os.environ.get(name, "")
    if not value or not os.path.exists(value):
        pytest.fail(f"{name} is not set to an existing path ({value!r}); run scripts/test-cluster.sh", pytrace=False)
    return value


def build_imagegc_image(cluster, binary):
    """The image scripts/build-image.sh builds (scripts/oci-image.py: the
    static binary as /imagegc and deploy/imagegc.toml as
    /etc/imagegc/imagegc.toml on an empty base), for this machine's
    architecture, imported into the node's containerd."""
    tar = cluster.path("images", "imagegc.oci.tar")
    arch = ARCH[os.uname().machine]
    subprocess.run([sys.executable, os.path.join(REPO, "scripts", "oci-image.py"), "--name", IMAGEGC_IMAGE,
                    "--binary", f"{arch}={binary}", "--config", os.path.join(DEPLOY, "imagegc.toml"),
                    "--output", tar], check=True, capture_output=True)
    cluster.import_oci(tar, IMAGEGC_IMAGE, all_platforms=True)
    os.unlink(tar)
    return IMAGEGC_IMAGE


def cluster_runtime():
    """The runtime the session's node runs (IMAGEGC_CLUSTER_RUNTIME)."""
    runtime = os.environ.get("IMAGEGC_CLUSTER_RUNTIME") or "containerd"
    if runtime not in RUNTIMES:
        pytest.fail(f"IMAGEGC_CLUSTER_RUNTIME={runtime!r} is not one of {RUNTIMES}", pytrace=False)
    return runtime


@pytest.fixture(scope="session")
def cluster():
    if os.geteuid() != 0:
        pytest.fail("the cluster mounts a filesystem and runs a kubelet: run as root", pytrace=False)
    kube_bin = _env("IMAGEGC_KUBERNETES_BIN")
    containerd_bin = _env("IMAGEGC_CONTAINERD_BIN")
    binary = _env("IMAGEGC_STATIC_BIN")
    runtime = cluster_runtime()
    crio_bin = _env("IMAGEGC_CRIO_BIN") if runtime == "crio" else None
    c = Cluster(kube_bin, containerd_bin, runtime=runtime, crio_bin=crio_bin)
    try:
        c.up()
        record("bring-up (etcd to a Ready node)", c.timings["bring-up"])
        started = time.monotonic()
        c.imagegc_image_id = build_imagegc_image(c, binary)
        # The kubelet may remove it while no imagegc runs (the eviction
        # scenario's control case): each deployment puts it back first.
        c.ensure_imagegc_image = lambda: (IMAGEGC_IMAGE in c.images()) or build_imagegc_image(c, binary)
        record("imagegc image: OCI tarball and import", time.monotonic() - started)
    except BaseException:
        logs = {name: c.log_tail(name) for name in ("kubelet", "containerd", "kube-apiserver", "registry")} if c.dir else {}
        problems = c.down()
        raise RuntimeError(f"bring-up failed; logs: {logs}; teardown: {problems}")
    yield c
    started = time.monotonic()
    problems = c.down()
    record("teardown", time.monotonic() - started)
    left = c.leftovers()
    assert not problems and not left, f"teardown problems {problems}; left behind {left}"


@pytest.fixture(scope="session")
def prometheus(cluster):
    return Prometheus(cluster, _env("IMAGEGC_PROMETHEUS")).start()


@pytest.fixture(autouse=True)
def _scenario_time(request):
    started = time.monotonic()
    yield
    record(request.node.nodeid.split("::", 1)[-1], time.monotonic() - started)


def pytest_configure(config):
    """A run stopped from outside (SIGTERM: a time limit, a CI job or a
    test run cut short) ends as an interrupted one does, the session's node
    torn down (its etcd, API server, kubelet and runtime run in sessions of
    their own, which the signal does not reach) instead of left running."""
    def stopped(signum, frame):
        raise KeyboardInterrupt(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stopped)


def pytest_collection_finish(session):
    """The release image the upgrade scenario (test_8_upgrade.py) starts
    from is built in the background, from now on, when it is to run."""
    if any("release_builds" in getattr(item, "fixturenames", ()) for item in session.items):
        releases.start_release_image()


def pytest_sessionfinish(session, exitstatus):
    releases.join_release_build()


_SESSION_START = time.monotonic()
_TEST_START = {}
# A scenario (setup, call and teardown) still running after this fails,
# every thread's stack printed first: the longest takes about 4 minutes, so
# a hang (a runtime or API server that stopped answering) costs CI 15
# minutes and shows where it was, not the whole run.
SCENARIO_LIMIT = 900


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    def expired(signum, frame):
        faulthandler.dump_traceback(all_threads=True)
        raise TimeoutError(f"{item.nodeid} still running after {SCENARIO_LIMIT}s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(SCENARIO_LIMIT)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def pytest_runtest_logfinish(nodeid, location):
    """Each scenario's wall-clock time as it ends, and the suite's so far: a
    run cut short (CI's time limit) still shows where its time went."""
    started = _TEST_START.pop(nodeid, None)
    took = "" if started is None else f"{time.monotonic() - started:.0f}s, "
    sys.stdout.write(f" [{took}suite at {time.monotonic() - _SESSION_START:.0f}s]\n")
    sys.stdout.flush()


def pytest_runtest_logstart(nodeid, location):
    _TEST_START[nodeid] = time.monotonic()


def pytest_terminal_summary(terminalreporter):
    if TIMINGS:
        terminalreporter.section("cluster timings")
        for name, seconds in TIMINGS.items():
            terminalreporter.write_line(f"{seconds:7.1f}s  {name}")
