"""scripts/release.sh: one commit that carries a new version everywhere a
version is written, or nothing at all."""

import os
import subprocess
import sys

import check_manifests
from support import REPO, no_problems

GIT = ["git", "-c", "user.email=release@test", "-c", "user.name=release test"]


def clone(tmp_path, name):
    """A clone of this repository's HEAD with the working tree's
    scripts/release.sh and CHANGELOG.md (what a release starts from)."""
    path = tmp_path / name
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", REPO, str(path)], check=True)
    for name in ("scripts/release.sh", "CHANGELOG.md", os.path.join("deploy", "tests", "check_manifests.py")):
        with open(os.path.join(REPO, name), "rb") as f, open(path / name, "wb") as out:
            out.write(f.read())
    os.chmod(path / "scripts" / "release.sh", 0o755)
    commit(path, "the working tree's release script")
    return path


def commit(path, message):
    subprocess.run(GIT + ["-C", str(path), "add", "-A"], check=True)
    subprocess.run(GIT + ["-C", str(path), "commit", "-q", "--allow-empty", "-m", message], check=True)


def release(path, *args):
    env = {**os.environ, "PYTHON": sys.executable, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run([str(path / "scripts" / "release.sh"), *args], cwd=path, env=env,
                          capture_output=True, text=True)


def head(path):
    return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()


def test_a_release_is_one_commit_whose_versions_agree(tmp_path):
    repo = clone(tmp_path, "repo")
    # A change to release, when the checkout is a release itself (its
    # Unreleased section empty).
    with open(repo / "CHANGELOG.md", encoding="utf-8") as f:
        text = f.read()
    if "## [Unreleased]\n\n## [" in text:
        with open(repo / "CHANGELOG.md", "w", encoding="utf-8") as f:
            f.write(text.replace("## [Unreleased]\n", "## [Unreleased]\n\n### Added\n\n- A change.\n", 1))
        commit(repo, "a change to release")
    with open(repo / "Cargo.toml", encoding="utf-8") as f:
        current = [line.split('"')[1] for line in f if line.startswith("version = ")][0]
    major, minor, _ = map(int, current.split("."))
    version = f"{major}.{minor + 1}.0"
    done = release(repo, version, "--date", "2027-01-02")
    assert done.returncode == 0, done.stderr
    no_problems(check_manifests.versions(str(repo)), "the release's versions differ")
    with open(repo / "Cargo.toml", encoding="utf-8") as f:
        assert f'version = "{version}"' in f.read()
    with open(repo / "CHANGELOG.md", encoding="utf-8") as f:
        changelog = f.read()
    assert f"## [Unreleased]\n\n## [{version}] - 2027-01-02\n" in changelog, changelog[:400]
    log = subprocess.run(["git", "-C", str(repo), "log", "-1", "--format=%s"], check=True,
                         capture_output=True, text=True).stdout.strip()
    assert log == f"release {version}"
    assert not subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], check=True,
                              capture_output=True, text=True).stdout
    # Again: the Unreleased section is empty now, and the version not newer.
    again = release(repo, version)
    assert again.returncode == 2 and "not newer" in again.stderr, again.stderr
    newer = release(repo, f"{major}.{minor + 2}.0")
    assert newer.returncode == 2 and "lists no change" in newer.stderr, newer.stderr


def test_a_release_refuses_versions_that_disagree_and_changes_nothing(tmp_path):
    repo = clone(tmp_path, "disagree")
    chart = repo / "deploy" / "helm" / "imagegc" / "Chart.yaml"
    with open(chart, encoding="utf-8") as f:
        text = f.read()
    with open(chart, "w", encoding="utf-8") as f:
        f.write(text.replace("appVersion: \"", "appVersion: \"9", 1))
    commit(repo, "a chart that names another version")
    before = head(repo)
    refused = release(repo, "99.0.0")
    assert refused.returncode == 2, refused.stderr
    assert "Chart.yaml" in refused.stderr and "disagree" in refused.stderr, refused.stderr
    assert head(repo) == before
    assert not subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], check=True,
                              capture_output=True, text=True).stdout
    for bad in ("1.2", "v1.2.3", "1.2.3-rc1", "01.2.3"):
        out = release(repo, bad)
        assert out.returncode == 2 and "not a release version" in out.stderr, (bad, out.stderr)
