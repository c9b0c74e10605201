"""The Containerfile, and the image its final stage builds."""

import os
import re
import shutil
import subprocess

import pytest

from support import MUSL_TARGET, REPO, no_problems, output, run, tool

CONTAINERFILE = os.path.join(REPO, "Containerfile")
IMAGE = "localhost/imagegc:check-deploy"
# The root certificates the image carries for the registry lookups, and the
# variable that names them (rustls-native-certs reads SSL_CERT_FILE alone
# when it is set).
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # Debian's ca-certificates


def certificates(data):
    """The number of PEM certificates in a bundle's bytes."""
    return data.count(b"-----BEGIN CERTIFICATE-----")


def host_bundle():
    if not os.path.isfile(HOST_CA_BUNDLE):
        from support import missing

        missing("ca-certificates", f"no {HOST_CA_BUNDLE} (apt-get install ca-certificates)")
    with open(HOST_CA_BUNDLE, "rb") as f:
        return f.read()


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
    if f"COPY --from=build {CA_BUNDLE} {CA_BUNDLE}" not in lines:
        problems.append(f"the final stage does not copy the build stage's root certificates to {CA_BUNDLE}")
    if f"ENV SSL_CERT_FILE={CA_BUNDLE}" not in lines:
        problems.append(f"no ENV SSL_CERT_FILE={CA_BUNDLE}")
    if not re.search(r"^RUN apk add .*\bca-certificates\b", text, re.M):
        problems.append("the build stage does not install ca-certificates")
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
    # The build stage's root certificates (Alpine's ca-certificates there):
    # Debian's here, the same Mozilla roots.
    (context / CA_BUNDLE.lstrip("/")).parent.mkdir(parents=True)
    (context / CA_BUNDLE.lstrip("/")).write_bytes(host_bundle())
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
    for wanted in ("/imagegc", "/etc/imagegc/imagegc.toml", CA_BUNDLE):
        assert wanted in files, f"the image has no {wanted}: {files}"
    bundle = image_rootfs / CA_BUNDLE.lstrip("/")
    assert not bundle.is_symlink() and certificates(bundle.read_bytes()) > 100, "the image's root certificates"


def test_image_daemon_runs_read_only_without_capabilities(image_rootfs):
    import smoke_daemon

    problems = smoke_daemon.smoke(config=str(image_rootfs / "etc/imagegc/imagegc.toml"), rootfs=str(image_rootfs))
    no_problems(problems, "imagegc run in the image's rootfs, read-only, no capabilities")


def test_oci_image_carries_the_root_certificates_and_names_them(work):
    """scripts/oci-image.py, as scripts/build-image.sh runs it: the bundle
    is a file of the layer (not a link to the node's), mode 0644, and the
    image's configuration names it in SSL_CERT_FILE."""
    import gzip
    import io
    import json
    import tarfile

    bundle = host_bundle()
    exe = work / "oci-fake-imagegc"
    exe.write_bytes(b"\x7fELF not really")
    out = work / "oci-image.tar"
    run("python3", os.path.join(REPO, "scripts", "oci-image.py"), "--name", "registry.example.com/imagegc:0.0.0-test",
        "--binary", f"amd64={exe}", "--config", os.path.join(REPO, "deploy", "imagegc.toml"),
        "--ca-bundle", HOST_CA_BUNDLE, "--output", out)
    with tarfile.open(out) as tar:
        blobs = {m.name.rsplit("/", 1)[-1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    top = json.loads(blobs["index.json"])
    index = json.loads(blobs[top["manifests"][0]["digest"].split(":")[1]])
    (entry,) = index["manifests"]
    manifest = json.loads(blobs[entry["digest"].split(":")[1]])
    config = json.loads(blobs[manifest["config"]["digest"].split(":")[1]])
    assert f"SSL_CERT_FILE={CA_BUNDLE}" in config["config"]["Env"], config["config"]["Env"]
    (layer,) = manifest["layers"]
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blobs[layer["digest"].split(":")[1]]))) as tar:
        member = tar.getmember(CA_BUNDLE.lstrip("/"))
        assert member.isfile() and member.mode == 0o644, (member.type, oct(member.mode))
        carried = tar.extractfile(member).read()
    assert carried == bundle and certificates(carried) > 100, f"{certificates(carried)} certificates carried"
    # Without a bundle nothing is named that is not there.
    bare = work / "oci-image-bare.tar"
    run("python3", os.path.join(REPO, "scripts", "oci-image.py"), "--name", "registry.example.com/imagegc:0.0.0-test",
        "--binary", f"amd64={exe}", "--config", os.path.join(REPO, "deploy", "imagegc.toml"), "--output", bare)
