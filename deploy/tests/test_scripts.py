"""The scripts that run these checks."""

import pytest

from support import run, tool

# The entry point, what it sources to install the tools, the image build,
# and the systemd unit's test (with what it sources).
SCRIPTS = ["scripts/check-deploy.sh", "scripts/testbed-deploy-tools.sh", "scripts/build-image.sh", "scripts/release.sh",
           "scripts/test-systemd.sh"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_shellcheck(script):
    # -x: follow what the entry point sources.
    run(tool("shellcheck"), "-x", script)


def test_build_image_builds_this_machines_architecture_by_default():
    # One architecture unless asked: a cross build needs a cross C compiler.
    import platform
    import re
    import subprocess

    from support import REPO

    host = {"x86_64": "amd64", "aarch64": "arm64"}[platform.machine()]
    proc = subprocess.run(["scripts/build-image.sh", "--dry-run"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.findall(r"^would build linux/(\w+) ", proc.stdout, re.M) == [host], proc.stdout
    # The tag is the version on the commit scripts/release.sh made (the
    # tree clean), else it names the commit, never a release's.
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short=12", "HEAD")
    if commit:
        with open(f"{REPO}/Cargo.toml", encoding="utf-8") as f:
            version = [line.split('"')[1] for line in f if line.startswith("version = ")][0]
        released = git("log", "-1", "--format=%s") == f"release {version}" and not git(
            "status", "--porcelain", "--untracked-files=no")
        tags = re.findall(r" as ghcr\.io/imagegc/imagegc:(\S+) ", proc.stdout)
        assert len(tags) == 1, proc.stdout
        if released:
            assert tags[0] == version, proc.stdout
        else:
            # The next patch's pre-release: after the release it follows,
            # before any later one.
            major, minor, patch = version.split("-")[0].split(".")
            assert tags[0] == f"{major}.{minor}.{int(patch) + 1}-dev.{commit}", proc.stdout
    both = subprocess.run(["scripts/build-image.sh", "--dry-run", "--arch", "amd64,arm64"], cwd=REPO,
                          capture_output=True, text=True)
    if host == "amd64":
        assert re.findall(r"^would build linux/(\w+) ", both.stdout, re.M) == ["amd64", "arm64"], both.stdout
        assert "clang and lld" in both.stdout, both.stdout
