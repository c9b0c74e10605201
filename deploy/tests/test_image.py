"""The Containerfile, and the image its final stage builds."""

import os
import re
import shutil
import subprocess

import pytest

from support import MUSL_TARGET, REPO, no_problems, output, run, tool

CONTAINERFILE = os.path.join(REPO, "Containerfile")
IMAGE = "localhost/imagegc:check-deploy"


def test_hadolint_containerfile():
    run(tool("hadolint"), "Containerfile")


def test_containerfile_copies_what_exists_builds_and_runs_imagegc():
    # hadolint does not know the build context: every COPY source from the
    # context must exist, and the build command must be the one tested here.
    with open(CONTAINERFILE, encoding="utf-8") as f:
        lines = f.read().splitlines()
    problems = []
    for line in lines:
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from=") for w in words):
            for src in words[1:-1]:
                if not os.path.exists(os.path.join(REPO, src)):
                    problems.append(f"Containerfile copies {src}, which does not exist")
    text = "\n".join(lines)
    if 'cargo build --release --locked --target "$TARGET"' not in text:
        problems.append("Containerfile does not build with cargo build --release --locked --target")
    if f"ARG TARGET={MUSL_TARGET}" not in lines:
        problems.append(f"Containerfile's default TARGET is not {MUSL_TARGET}")
    if not re.search(r"^FROM scratch", text, re.M):
        problems.append("the final stage is not FROM scratch")
    if not re.search(r'^ENTRYPOINT \["/imagegc"\]', text, re.M):
        problems.append('no ENTRYPOINT ["/imagegc"]')
    no_problems(problems, "Containerfile")


@pytest.fixture(scope="module")
def image_rootfs(imagegc_bin, work):
    """The Containerfile's final stage built by podman, with the static
    binary just built standing in for the build stage (which needs a
    registry), exported to a directory."""
    podman = tool("podman")
    if subprocess.run([podman, "info"], capture_output=True).returncode != 0:
        pytest.skip("podman does not run here (podman info fails)")
    context, rootfs = work / "build-stage", work / "rootfs"
    context.mkdir()
    rootfs.mkdir()
    shutil.copy(imagegc_bin, context / "imagegc")
    run(podman, "build", "-q", "--build-context", f"build={context}", "-f", "Containerfile", "-t", IMAGE, ".")
    try:
        cid = output(podman, "create", IMAGE).strip()
        try:
            run(podman, "export", "-o", work / "rootfs.tar", cid)
        finally:
            subprocess.run([podman, "rm", cid], capture_output=True)
    finally:
        subprocess.run([podman, "rmi", IMAGE], capture_output=True)
    run("tar", "-x", "-f", work / "rootfs.tar", "-C", rootfs)
    return rootfs


def test_image_podman_build_of_the_final_stage(image_rootfs):
    files = sorted("/" + str(p.relative_to(image_rootfs)) for p in image_rootfs.rglob("*"))
    print("\n".join(files))
    for wanted in ("/imagegc", "/etc/imagegc/imagegc.toml"):
        assert wanted in files, f"the image has no {wanted}: {files}"


def test_image_daemon_runs_read_only_without_capabilities(image_rootfs):
    import smoke_daemon

    problems = smoke_daemon.smoke(config=str(image_rootfs / "etc/imagegc/imagegc.toml"), rootfs=str(image_rootfs))
    no_problems(problems, "imagegc run in the image's rootfs, read-only, no capabilities")
