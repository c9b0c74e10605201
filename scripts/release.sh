#!/usr/bin/env bash
# Makes a release of imagegc: one commit that carries VERSION everywhere a
# version is written, and the CHANGELOG's Unreleased section as VERSION's.
#
#   scripts/release.sh VERSION [--no-commit] [--date YYYY-MM-DD]
#
#   VERSION       the release, MAJOR.MINOR.PATCH (semantic versioning), newer
#                 than the version the tree carries now
#   --no-commit   leave the changes in the working tree
#   --date        the release's date in the CHANGELOG (default: today, UTC)
#
# It refuses (exit 2, nothing changed) when VERSION is not a version or not
# newer than the current one, when the working tree has changes, when the
# places that carry the version disagree before it starts (the crate, the
# chart's version and appVersion, the kustomize tag, deploy/daemonset.yaml,
# the tags README.md, the chart's README and the cluster suite name), or
# when CHANGELOG.md has no Unreleased section or an empty one.
#
# It sets VERSION in: Cargo.toml and Cargo.lock (the imagegc package),
# deploy/helm/imagegc/Chart.yaml (version and appVersion),
# deploy/kustomization.yaml (newTag), deploy/daemonset.yaml (the image),
# the image tags of README.md, deploy/README.md, the chart's README.md and
# deploy/tests/cluster/cluster.py; CHANGELOG.md's "## [Unreleased]" becomes
# "## [VERSION] - DATE" under a new, empty Unreleased section. Then it runs
# the deployment checks' version test (deploy/tests/check_manifests.py) on
# the result, and commits "release VERSION". Tag it (`git tag -s vVERSION`)
# and push the tag: the release workflow (.github/workflows/release.yml)
# builds and publishes from it. Needs python3 with PyYAML ($PYTHON names
# another interpreter; scripts/check-deploy.sh makes one in
# target/deploy-venv).
set -euo pipefail
cd "$(dirname "$0")/.."

commit=true
date=$(date -u +%Y-%m-%d)
version=
while [ $# -gt 0 ]; do
    case $1 in
        --no-commit) commit=false; shift ;;
        --date) date=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "scripts/release.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) [ -z "$version" ] || { echo "scripts/release.sh: one VERSION only" >&2; exit 2; }; version=$1; shift ;;
    esac
done
if [ -z "$version" ]; then
    echo "scripts/release.sh: which version? (scripts/release.sh VERSION, see --help)" >&2
    exit 2
fi
if [ -n "$(git status --porcelain)" ]; then
    echo "scripts/release.sh: the working tree has changes: commit or stash them first" >&2
    exit 2
fi

"${PYTHON:-python3}" - "$version" "$date" <<'EOF'
import os
import re
import sys

version, date = sys.argv[1], sys.argv[2]
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")


def fail(message):
    print(f"scripts/release.sh: {message}; nothing was changed", file=sys.stderr)
    sys.exit(2)


if not SEMVER.match(version):
    fail(f"{version!r} is not a release version (MAJOR.MINOR.PATCH)")
if not re.match(r"^\d{4}-\d{2}-\d{2}$", date):
    fail(f"--date {date!r} is not YYYY-MM-DD")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


cargo = read("Cargo.toml")
current = re.search(r'(?m)^version = "([^"]+)"', cargo).group(1)
if not SEMVER.match(current):
    fail(f"the crate's version {current!r} is not a release version")
if tuple(map(int, version.split("."))) <= tuple(map(int, current.split("."))):
    fail(f"{version} is not newer than the current version {current}")

# Every place a version is written, with the pattern that finds it; each
# must hold the current version before anything changes.
TAG = r"(?:imagegc:|newTag: |image\.tag=)"
places = [
    ("Cargo.toml", r'(?m)^(version = ")([^"]+)(")', 1),
    ("Cargo.lock", r'(?m)(^name = "imagegc"\nversion = ")([^"]+)(")', 1),
    ("deploy/helm/imagegc/Chart.yaml", r"(?m)^(version: )(\S+)()$", 1),
    ("deploy/helm/imagegc/Chart.yaml", r'(?m)^(appVersion: ")([^"]+)(")', 1),
    ("deploy/kustomization.yaml", r"(?m)^(\s+newTag: )(\S+)()$", 1),
    ("deploy/daemonset.yaml", r"(image: ghcr\.io/imagegc/imagegc:)(\S+)()", 1),
]
for name in ("README.md", "deploy/README.md", "deploy/helm/imagegc/README.md", "deploy/tests/cluster/cluster.py"):
    places.append((name, rf"({TAG})(\d[\w.+-]*?)(?=[\s\"'`),]|$)()", 0))

texts = {}
for path, pattern, at_least in places:
    text = texts.setdefault(path, read(path))
    found = [m.group(2) for m in re.finditer(pattern, text)]
    if len(found) < at_least:
        fail(f"{path}: no version found where one is expected ({pattern})")
    wrong = sorted({v for v in found if v != current})
    if wrong:
        fail(f"{path} names {', '.join(wrong)} where the crate is {current}: the versions disagree")

changelog = read("CHANGELOG.md")
unreleased = re.search(r"(?m)^## \[Unreleased\][^\n]*\n(.*?)(?=^## \[)", changelog, re.S)
if not unreleased:
    fail("CHANGELOG.md has no '## [Unreleased]' section before the last release's")
if not re.search(r"(?m)^- ", unreleased.group(1)):
    fail("CHANGELOG.md's Unreleased section lists no change")
if re.search(rf"(?m)^## \[{re.escape(version)}\]", changelog):
    fail(f"CHANGELOG.md has a section for {version} already")

for path, pattern, _ in places:
    texts[path] = re.sub(pattern, lambda m: f"{m.group(1)}{version}{m.group(3)}", texts[path])
texts["CHANGELOG.md"] = changelog.replace(
    unreleased.group(0),
    f"## [Unreleased]\n\n## [{version}] - {date}\n{unreleased.group(1)}",
    1,
)
for path, text in texts.items():
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)

sys.path.insert(0, os.path.join("deploy", "tests"))
import check_manifests  # noqa: E402

problems = check_manifests.versions(".")
if problems:
    print("scripts/release.sh: the release's versions disagree after the bump:", file=sys.stderr)
    for problem in problems:
        print(f"  {problem}", file=sys.stderr)
    sys.exit(1)
print(f"imagegc {current} -> {version} ({date})")
EOF

if $commit; then
    git add -u
    git commit -q -m "release $version"
    echo "committed \"release $version\": tag it (git tag -s v$version) and push the tag"
fi
