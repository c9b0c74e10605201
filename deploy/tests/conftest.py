"""The deployment checks (deploy/tests/test_*.py): everything under deploy/
and systemd/, the Containerfile and the scripts that test them.

scripts/check-deploy.sh installs the tools (scripts/testbed-deploy-tools.sh),
builds the static binary and the fake runtime, and runs this suite with:

  CHECK_DEPLOY_REQUIRED  what it installed and built: a check that needs one
                         of these and finds it missing fails; anything else
                         missing skips the check with the reason (support.py)
  IMAGEGC_STATIC_BIN     the static imagegc (musl, or static glibc)
  CHECK_DEPLOY_NO_BUILD  why there is no static binary, when none was built
  IMAGEGC_FAKE_RUNTIME   the fake CRI runtime the live Prometheus check drives
  IMAGEGC_HELM, IMAGEGC_OPERATOR_CRDS
                         helm, and the prometheus-operator's CRDs
  IMAGEGC_METRICS_FILE   a /metrics scrape to check the dashboard and rules
                         against, instead of the daemon's own

deploy/tests/cluster/ is another suite (scripts/test-cluster.sh), with its
own conftest.py: it is not collected here. pytest loads this file when that
suite runs too (it is a parent directory), so this file only defines
fixtures, none of them autouse and none named as the cluster suite's, and
imports nothing that suite's virtualenv lacks.
"""

import os

import pytest

from support import DEPLOY, REPO, missing

collect_ignore = ["cluster"]


@pytest.fixture(scope="session")
def work(tmp_path_factory):
    """A scratch directory shared by the session's checks."""
    return tmp_path_factory.mktemp("check-deploy")


@pytest.fixture(scope="session")
def imagegc_bin():
    """The static imagegc binary, as the Containerfile ships it."""
    path = os.environ.get("IMAGEGC_STATIC_BIN")
    if path:
        if not os.access(path, os.X_OK):
            missing("imagegc", f"IMAGEGC_STATIC_BIN={path} is not an executable")
        return path
    if os.environ.get("CHECK_DEPLOY_NO_BUILD"):
        pytest.skip(f"no static binary: {os.environ['CHECK_DEPLOY_NO_BUILD']}")
    missing("imagegc", "no static binary (IMAGEGC_STATIC_BIN is unset: the static build failed or did not run)")


@pytest.fixture(scope="session")
def any_imagegc_bin():
    """An imagegc binary, static or not, for checks that only run it: the
    static one, else target/release's, else target/debug's; None without."""
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")
    for path in (os.environ.get("IMAGEGC_STATIC_BIN"), os.path.join(target, "release", "imagegc"),
                 os.path.join(target, "debug", "imagegc")):
        if path and os.access(path, os.X_OK):
            return path
    return None


@pytest.fixture(scope="session")
def daemon_smoke(imagegc_bin, work):
    """`imagegc run` started as the DaemonSet starts it, with no runtime
    behind it (deploy/tests/smoke_daemon.py): its problems, and the scrape of
    /metrics it took (a classic-format scrape: no Accept header)."""
    import smoke_daemon

    scrape = work / "scrape"
    problems = smoke_daemon.smoke(config=os.path.join(DEPLOY, "imagegc.toml"), binary=imagegc_bin,
                                  scrape_out=str(scrape))
    return problems, scrape


@pytest.fixture(scope="session")
def daemon_scrape(request):
    """The daemon's own /metrics scrape, when the smoke test got one."""
    _, scrape = request.getfixturevalue("daemon_smoke")
    if not scrape.exists() or scrape.stat().st_size == 0:
        pytest.fail("the daemon smoke test took no scrape of /metrics", pytrace=False)
    return scrape


@pytest.fixture(scope="session")
def kustomized(work):
    """`kustomize build deploy/` (kubectl's or kustomize's), as a file."""
    import shutil
    import subprocess

    from support import output

    kubectl, kustomize = shutil.which("kubectl"), shutil.which("kustomize")
    if kubectl and subprocess.run([kubectl, "kustomize", "--help"], capture_output=True).returncode == 0:
        built = output(kubectl, "kustomize", DEPLOY)
    elif kustomize:
        built = output(kustomize, "build", DEPLOY)
    elif kubectl:
        pytest.fail("kubectl cannot kustomize (kubectl kustomize --help fails) and there is no kustomize",
                    pytrace=False)
    else:
        pytest.skip("no kubectl or kustomize here")
    path = work / "kustomized.yaml"
    path.write_text(built)
    return path
