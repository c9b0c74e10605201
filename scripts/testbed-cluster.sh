# shellcheck shell=bash
# Sourced by scripts/test-cluster.sh and scripts/bench-takeover.sh:
# prepare_cluster_suite installs and builds what the cluster test bed of
# deploy/tests/cluster needs, and exports where it is:
#
#   IMAGEGC_KUBERNETES_BIN  Kubernetes, etcd, helm, crictl (scripts/testbed-kubernetes.sh)
#   IMAGEGC_CONTAINERD_BIN  containerd 2.x (scripts/testbed-runtimes.sh)
#   IMAGEGC_CRIO_BIN        CRI-O and pinns (scripts/testbed-runtimes.sh), for
#                           IMAGEGC_CLUSTER_RUNTIME=crio
#   IMAGEGC_STATIC_BIN      the static imagegc (musl, or static glibc where
#                           the musl target cannot be installed)
#   IMAGEGC_PROMETHEUS      Prometheus (its Go module; Debian's lacks the
#                           Kubernetes service discovery)
#   CLUSTER_PYTHON          a virtualenv's python with pytest and PyYAML
#                           (target/cluster-venv)
#
# apt installs what is missing: runc, the CNI plugins, busybox-static,
# iptables, openssl, e2fsprogs, python3-venv, musl-tools, skopeo and
# docker-registry (the private registry both nodes pull from), and for a
# CRI-O node (IMAGEGC_CLUSTER_RUNTIME=crio) conmon. Run
# as root from the repository's top directory.

PROMETHEUS_VERSION=v0.316.0

prepare_cluster_suite() {
    local ROOT=$PWD
    local started=$SECONDS

    # --- packages
    local missing=() containerd_bin crio_bin target binary prometheus VENV REQUIREMENTS dir
    command -v runc >/dev/null || missing+=(runc)
    [ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
    dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
    command -v iptables >/dev/null || missing+=(iptables)
    command -v openssl >/dev/null || missing+=(openssl)
    command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
    command -v losetup >/dev/null || missing+=(mount)
    dpkg -s python3-venv >/dev/null 2>&1 || missing+=(python3-venv)
    # The Kubernetes client's TLS (rustls with ring) compiles C: musl's gcc.
    command -v musl-gcc >/dev/null || missing+=(musl-tools)
    command -v skopeo >/dev/null || missing+=(skopeo)
    command -v docker-registry >/dev/null || missing+=(docker-registry)
    if [ "${IMAGEGC_CLUSTER_RUNTIME:-containerd}" = crio ]; then
        command -v conmon >/dev/null || missing+=(conmon)
    fi
    if [ ${#missing[@]} -gt 0 ]; then
        echo "==> installing ${missing[*]}"
        apt-get update -q >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
    fi

    # --- Kubernetes, etcd, helm, crictl, Prometheus; containerd
    build_cluster_tools || return 1
    . scripts/testbed-runtimes.sh
    dir=$IMAGEGC_KUBERNETES_DIR
    containerd_bin=${IMAGEGC_RUNTIMES_DIR:-$ROOT/target/runtimes}/containerd-$CONTAINERD2_VERSION/bin
    crio_bin=${IMAGEGC_RUNTIMES_DIR:-$ROOT/target/runtimes}/crio-$CRIO_VERSION/bin
    if [ ! -x "$containerd_bin/containerd" ] || [ ! -x "$containerd_bin/ctr" ] || [ ! -x "$crio_bin/crio" ] \
        || [ ! -x "$crio_bin/pinns" ]; then
        # What building them needs (gcc, pkg-config, libseccomp-dev), which
        # scripts/test.sh installs before and a machine that runs this
        # suite alone may lack.
        . scripts/testbed-deps.sh
        install_testbed_deps
        build_testbed_runtimes
    fi

    # --- the static imagegc
    build_static_imagegc || return 1
    binary=$IMAGEGC_STATIC_BIN

    prometheus=$dir/prometheus-$PROMETHEUS_VERSION/prometheus

    # --- Python
    VENV=$ROOT/target/cluster-venv
    REQUIREMENTS="pytest==8.4.2 PyYAML==6.0.3"
    if [ "$(cat "$VENV/.requirements" 2>/dev/null)" != "$REQUIREMENTS" ]; then
        rm -rf "$VENV"
        /usr/bin/python3 -m venv "$VENV"
        # shellcheck disable=SC2086 # a list of requirements
        "$VENV/bin/pip" install -q --disable-pip-version-check $REQUIREMENTS
        echo "$REQUIREMENTS" >"$VENV/.requirements"
    fi
    export IMAGEGC_KUBERNETES_BIN=$IMAGEGC_KUBERNETES_DIR/$KUBERNETES_VERSION/bin
    export IMAGEGC_CONTAINERD_BIN=$containerd_bin
    export IMAGEGC_CRIO_BIN=$crio_bin
    export IMAGEGC_STATIC_BIN=$binary
    export IMAGEGC_PROMETHEUS=$prometheus
    export CLUSTER_PYTHON=$VENV/bin/python
    echo "==> cluster test bed prerequisites ready in $((SECONDS - started))s"
}

# build_cluster_tools builds what the cluster test bed runs from Go modules,
# each when not built yet: Kubernetes, etcd, helm and crictl
# (scripts/testbed-kubernetes.sh) and Prometheus, into
# $IMAGEGC_KUBERNETES_DIR. About 10 minutes on a cold machine, seconds once
# built: scripts/test.sh starts it in the background before its first phase.
build_cluster_tools() {
    . scripts/testbed-kubernetes.sh
    build_testbed_kubernetes || return 1
    # Prometheus from its Go module: Debian's package is built without the
    # Kubernetes service discovery the suite scrapes through. Built with the
    # Kubernetes discovery alone (Prometheus's remove_all_sd and
    # enable_kubernetes_sd tags): every other provider's cloud SDK left out,
    # which took most of the 20 minutes a full build took cold here. Kept
    # once built.
    local prometheus=$IMAGEGC_KUBERNETES_DIR/prometheus-$PROMETHEUS_VERSION/prometheus
    if [ ! -x "$prometheus" ]; then
        echo "==> building prometheus $PROMETHEUS_VERSION (github.com/prometheus/prometheus, Kubernetes discovery only)"
        (cd /tmp && GOBIN=$(dirname "$prometheus") GOFLAGS=-mod=mod CGO_ENABLED=0 go install -trimpath \
            -tags remove_all_sd,enable_kubernetes_sd \
            -ldflags "-s -w" "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION") || return 1
    fi
}

# The static imagegc (musl, or static glibc where the musl target cannot be
# installed), the binary the image ships; exports IMAGEGC_STATIC_BIN. Also
# sourced by scripts/test-systemd.sh: whichever runs first builds it, the
# other finds it fresh.
build_static_imagegc() {
    local target binary commit build_started=$SECONDS
    # The commit the binary names (build.rs), given as scripts/build-image.sh
    # (and scripts/check-deploy.sh) give it: the upgrade scenario's build of
    # this checkout's image (deploy/tests/cluster/test_8_upgrade.py) then
    # finds this build fresh, not one to redo for another IMAGEGC_COMMIT.
    commit=${IMAGEGC_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
    target=x86_64-unknown-linux-musl
    if rustup target add "$target" >/dev/null 2>&1; then
        IMAGEGC_COMMIT=$commit CC_x86_64_unknown_linux_musl=musl-gcc cargo build --release --locked --target "$target"
    else
        target=$(rustc -vV | sed -n 's/^host: //p')
        echo "==> the musl target cannot be installed: a static glibc build"
        IMAGEGC_COMMIT=$commit RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked --target "$target"
    fi
    binary=${CARGO_TARGET_DIR:-$PWD/target}/$target/release/imagegc
    if readelf -d "$binary" | grep -q NEEDED; then
        echo "scripts/testbed-cluster.sh: $binary links shared libraries" >&2
        return 1
    fi
    echo "==> static imagegc built in $((SECONDS - build_started))s: $("$binary" --version)"
    export IMAGEGC_STATIC_BIN=$binary
}
