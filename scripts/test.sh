#!/usr/bin/env bash
# Runs every check and test imagegc has: formatting, lints, unit and
# integration tests, the end-to-end tests against a real containerd
# (started privately by the tests on loop-mounted filesystems, so this must
# run as root), the deployment checks and a time-boxed fuzz pass
# (IMAGEGC_SKIP_FUZZ=1 skips it). Installs what a fresh Debian 12 machine lacks.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test.sh: the end-to-end tests mount filesystems and run containerd: run as root" >&2
    exit 1
fi

. scripts/testbed-deps.sh
install_testbed_deps

echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy"
cargo clippy --locked --all-targets -- -D warnings
echo "==> cargo test (unit, integration, end-to-end on a real containerd)"
cargo test --locked --all-targets
if [ -x scripts/check-deploy.sh ]; then
    echo "==> deployment checks"
    # An unoptimised static build is enough to check the image and the
    # manifests; the release build is what the Containerfile ships.
    CHECK_DEPLOY_PROFILE=dev scripts/check-deploy.sh
fi
if [ -z "${IMAGEGC_SKIP_FUZZ:-}" ]; then
    echo "==> fuzzing the configuration loader and the state reader (60 s each)"
    scripts/fuzz.sh 60
fi
echo "==> all checks passed"
