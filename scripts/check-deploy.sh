#!/usr/bin/env bash
# Checks everything under deploy/ and systemd/, the Containerfile, and the
# scripts that check them: installs the tools (scripts/testbed-deploy-tools.sh),
# builds the static binary and the fake runtime, and runs the pytest suite of
# deploy/tests/ (not deploy/tests/cluster/, which is scripts/test-cluster.sh).
#
# Runs on a Debian 12 machine as root. Exits non-zero if any check fails or
# the tools cannot be installed; a check that cannot run here is skipped,
# with the reason. Safe to run again: installed tools are reused.
#
#   scripts/check-deploy.sh [PYTEST ARGS...]      e.g. -k helm
#
# Environment:
#   CHECK_DEPLOY_SKIP_BUILD=1  skip the static build and the checks that run
#                              the binary (the build takes about 5 minutes
#                              on 2 cores from a cold cache)
#   CHECK_DEPLOY_PROFILE=dev   build the static binary unoptimised (a few
#                              times faster from a cold cache; what the
#                              checks need is a static binary, not a fast
#                              one). Default: release, which is a no-op after
#                              scripts/test-cluster.sh built the same binary
#   CHECK_DEPLOY_VERBOSE=1     show the output of the checks that pass too
#   IMAGEGC_METRICS_FILE       a /metrics scrape to check metric names
#                              against, instead of the daemon's own scrape
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
START=$SECONDS
PROFILE="${CHECK_DEPLOY_PROFILE:-release}"
PROFILE_DIR=$PROFILE
[ "$PROFILE" = dev ] && PROFILE_DIR=debug
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
MUSL_TARGET=x86_64-unknown-linux-musl

# shellcheck source=scripts/testbed-deploy-tools.sh
. scripts/testbed-deploy-tools.sh
install_deploy_tools || {
    echo "scripts/check-deploy.sh: cannot continue without the tools"
    exit 1
}
echo "==> tools: promtool $(promtool --version 2>&1 | head -n1 | awk '{print $3}')," \
    "kubernetes-validate $(kubernetes-validate --version 2>&1 | tail -n1)," \
    "hadolint $(hadolint --version | awk '{print $NF}')," \
    "$(shellcheck --version | sed -n 's/^version: /shellcheck /p'), $(systemd-analyze --version | head -n1)," \
    "$("$DEPLOY_PYTHON" -m pytest --version 2>&1)${IMAGEGC_HELM:+, helm $HELM_VERSION}"

# --- the static binary and the fake runtime --------------------------------
# The Containerfile builds for musl. Where rustup cannot install the musl
# target (no rustup mirror reachable), a static glibc build (crt-static)
# proves the same thing: a binary with no shared libraries that runs in an
# empty image. A build that fails leaves IMAGEGC_STATIC_BIN unset, and the
# checks that need the binary fail; one that does not run skips them
# (CHECK_DEPLOY_NO_BUILD says why).
build_static() {
    local target=$MUSL_TARGET flags=${RUSTFLAGS:-} started=$SECONDS
    # ring (the Kubernetes client's TLS) compiles C: musl's gcc for musl.
    if ! command -v musl-gcc >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q musl-tools >/dev/null 2>&1 || true
    fi
    export CC_x86_64_unknown_linux_musl=musl-gcc
    if ! rustup target add "$MUSL_TARGET" >/dev/null 2>&1; then
        target=$(rustc -vV | sed -n 's/^host: //p')
        echo "==> rustup cannot install $MUSL_TARGET: building a static glibc binary for $target instead"
        flags="-C target-feature=+crt-static"
    fi
    # The commit the binary names, given as scripts/build-image.sh and the
    # cluster suite (scripts/testbed-cluster.sh) give it: the same build.
    local commit=${IMAGEGC_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
    echo "==> static build: cargo build --profile $PROFILE --locked --target $target"
    IMAGEGC_COMMIT=$commit RUSTFLAGS=$flags cargo build --profile "$PROFILE" --locked --target "$target" || return 1
    export IMAGEGC_STATIC_BIN=$TARGET_DIR/$target/$PROFILE_DIR/imagegc
    echo "==> static build took $((SECONDS - started))s"
}

# The fake CRI runtime that the live Prometheus check drives: a test tool,
# built unoptimised (on the dependencies `cargo test` already built).
build_fake_runtime() {
    echo "==> fake runtime: cargo build --locked --example fake_runtime"
    cargo build --locked --example fake_runtime || return 1
    export IMAGEGC_FAKE_RUNTIME=$TARGET_DIR/debug/examples/fake_runtime
}

if [ -n "${CHECK_DEPLOY_SKIP_BUILD:-}" ]; then
    export CHECK_DEPLOY_NO_BUILD="CHECK_DEPLOY_SKIP_BUILD is set"
elif ! command -v cargo >/dev/null || ! command -v rustup >/dev/null; then
    export CHECK_DEPLOY_NO_BUILD="no cargo and rustup here"
else
    CHECK_DEPLOY_REQUIRED="$CHECK_DEPLOY_REQUIRED imagegc fake_runtime"
    build_static || echo "scripts/check-deploy.sh: the static build failed: its checks will fail"
    build_fake_runtime || echo "scripts/check-deploy.sh: the fake runtime did not build: the live check will fail"
fi

# --- the checks -------------------------------------------------------------
verbose=()
[ -n "${CHECK_DEPLOY_VERBOSE:-}" ] && verbose=(-rA)
# pytest's temporary directories (the image's rootfs, helm's renders) go
# with this run.
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
status=0
PYTHONDONTWRITEBYTECODE=1 "$DEPLOY_PYTHON" -m pytest -p no:cacheprovider --basetemp "$WORK" -v -rfEs \
    --durations=0 --durations-min=1 "${verbose[@]}" deploy/tests "$@" || status=$?
echo "==> deployment checks: exit $status; $((SECONDS - START))s with the tools and the builds"
exit "$status"
