"""The two images of the upgrade scenario (test_8_upgrade.py), each built
by its own commit's scripts/build-image.sh: a release's, from that commit's
own tree (`git archive`), and this checkout's.

The release's tree is built with its own CARGO_TARGET_DIR, seeded with
hard links to the dependencies this checkout's static build compiled (the
same Cargo.lock: the same crates, features and flags, so cargo finds them
fresh and compiles the release's own crate alone); the image it writes is
kept under target/release-images/, named by the commit, so a second run
builds nothing. Its build (about 4 minutes of one core, the release's own
crate) starts when the session has collected the upgrade scenario
(conftest.py), at the lowest CPU priority, and runs beside the scenarios
before it, which mostly wait on the cluster."""

import os
import re
import shutil
import subprocess
import threading
import time

from deploy import REPO

# The release the upgrade scenario starts from.
RELEASE = "0.1.0"
RELEASE_COMMIT = "91b87e11c56f7f666c9e5cc95382b16b9c462f67"
# What an operator's registry names the builds (the private registry serves
# registry.example/ to a CRI-O node; containerd gets the images imported).
REPOSITORY = "registry.example/imagegc"
MUSL = "x86_64-unknown-linux-musl"


def target_dir():
    return os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")


def _run(argv, cwd, env=None, timeout=1500):
    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} (in {cwd}) exited {p.returncode}:\n{p.stdout[-3000:]}\n"
                           f"{p.stderr[-3000:]}")
    return p.stdout + p.stderr


def _own_unit(name):
    """A build unit of imagegc's own crate (its library, binary or build
    script), which the release compiles from its own sources."""
    return re.match(r"^(lib)?imagegc[-_.]", name) is not None


def _seed(target, into):
    """Hard links to the compiled dependencies of this checkout's static
    build (the musl target's and the host's: build scripts and proc
    macros) in the release's target directory, imagegc's own units left
    out. A unit cargo finds fresh is never written again, and a unit it
    rebuilds is written to new files (rustc renames its outputs into
    place), so this checkout's build is not touched."""
    linked = 0
    for profile in (os.path.join(MUSL, "release"), "release"):
        for part in ("deps", "build", ".fingerprint"):
            source = os.path.join(target, profile, part)
            if not os.path.isdir(source):
                continue
            os.makedirs(os.path.join(into, profile, part), exist_ok=True)
            for name in os.listdir(source):
                if _own_unit(name):
                    continue
                src, dst = os.path.join(source, name), os.path.join(into, profile, part, name)
                try:
                    if os.path.isdir(src) and not os.path.islink(src):
                        shutil.copytree(src, dst, copy_function=os.link, symlinks=True, dirs_exist_ok=True)
                    else:
                        os.link(src, dst)
                    linked += 1
                except (OSError, shutil.Error):
                    # Gone meanwhile (another build cleaning up): cargo
                    # compiles what is missing.
                    pass
    return linked


def release_image(name, commit, version, timings, nice=False):
    """(OCI archive, `imagegc --version`) of the release at `commit`, built
    by its own scripts/build-image.sh from its own tree as
    REPOSITORY:`version`, or taken from the cache of an earlier run."""
    cache = os.path.join(target_dir(), "release-images")
    archive = os.path.join(cache, f"imagegc-{commit}.oci.tar")
    said = archive + ".version"
    if os.path.exists(archive) and os.path.exists(said):
        with open(said) as f:
            return archive, f.read().strip()
    started = time.monotonic()
    src = os.path.join(target_dir(), f"{name}-src")
    build = os.path.join(target_dir(), f"{name}-target")
    for d in (src, build):
        shutil.rmtree(d, ignore_errors=True)
    release_tree(commit, ".", src)
    linked = _seed(target_dir(), build)
    timings["source tree and seeded target directory"] = time.monotonic() - started
    started = time.monotonic()
    env = dict(os.environ, CARGO_TARGET_DIR=build)
    env.pop("IMAGEGC_COMMIT", None)
    out = _run([*(["nice", "-n", "19"] if nice else []), "scripts/build-image.sh", "--image",
                f"{REPOSITORY}:{version}"], src, env)
    timings[f"build ({linked} units linked from this checkout's build)"] = time.monotonic() - started
    built = re.findall(r"^==> (\S+\.oci\.tar)$", out, re.M)
    assert built, out
    binary = os.path.join(build, MUSL, "release", "imagegc")
    version_line = _run([binary, "--version"], src).strip()
    os.makedirs(cache, exist_ok=True)
    shutil.move(built[-1], archive + ".partial")
    with open(said, "w") as f:
        f.write(version_line + "\n")
    os.rename(archive + ".partial", archive)
    shutil.rmtree(src, ignore_errors=True)
    shutil.rmtree(build, ignore_errors=True)
    return archive, version_line


_BACKGROUND = {}


def start_release_image():
    """Starts building RELEASE's image (release_image, niced) in the
    background, once per session."""
    if "thread" in _BACKGROUND:
        return
    timings = {}

    def build():
        try:
            _BACKGROUND["result"] = release_image(f"release-{RELEASE}", RELEASE_COMMIT, RELEASE, timings, nice=True)
        except BaseException as e:  # noqa: BLE001 - raised where the image is asked for
            _BACKGROUND["error"] = e

    _BACKGROUND.update(thread=threading.Thread(target=build, daemon=True), timings=timings)
    _BACKGROUND["thread"].start()


def wait_release_image(timings):
    """(OCI archive, `imagegc --version`) of RELEASE: the background build's
    once it is done (started here if it was not), with its timings and how
    long it was waited for."""
    start_release_image()
    started = time.monotonic()
    _BACKGROUND["thread"].join()
    timings.update(_BACKGROUND["timings"])
    timings["waited for the release's build"] = time.monotonic() - started
    if "error" in _BACKGROUND:
        raise _BACKGROUND["error"]
    return _BACKGROUND["result"]


def join_release_build():
    """Waits for a background build still running (a session cut short), so
    that no build outlives the session."""
    if "thread" in _BACKGROUND:
        _BACKGROUND["thread"].join()


def current_image(timings):
    """(OCI archive, image reference, `imagegc --version`) of this checkout,
    built by its scripts/build-image.sh under the tag it gives this commit
    (`--dry-run` says it), in the operator's registry."""
    started = time.monotonic()
    dry = _run(["scripts/build-image.sh", "--dry-run"], REPO)
    named = re.findall(r" as \S+?:(\S+) \(python3\)$", dry, re.M)
    assert len(named) == 1, dry
    ref = f"{REPOSITORY}:{named[0]}"
    out = _run(["scripts/build-image.sh", "--image", ref], REPO)
    built = re.findall(r"^==> (\S+\.oci\.tar)$", out, re.M)
    assert built, out
    version_line = _run([os.path.join(target_dir(), MUSL, "release", "imagegc"), "--version"], REPO).strip()
    timings["this checkout's image (scripts/build-image.sh)"] = time.monotonic() - started
    return built[-1], ref, version_line


def operator_deploy(source, into):
    """An operator's checkout of a release, as far as the overlay reads it:
    a copy of that release's deploy/ (`source`) at `into`, in place of
    what was there."""
    shutil.rmtree(into, ignore_errors=True)
    shutil.copytree(source, into, ignore=shutil.ignore_patterns("tests", "__pycache__"))
    return into


def release_tree(commit, path, into):
    """`path` of the tree at `commit` (git archive), under `into`."""
    shutil.rmtree(into, ignore_errors=True)
    os.makedirs(into)
    tree = subprocess.Popen(["git", "-C", REPO, "archive", commit, path], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", into], stdin=tree.stdout, check=True)
    assert tree.wait() == 0, f"git archive {commit} {path} failed"
    return os.path.join(into, path)
