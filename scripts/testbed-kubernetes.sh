# shellcheck shell=bash
# Sourced by scripts/test-cluster.sh and scripts/bench-takeover.sh: builds
# the single-node Kubernetes cluster of deploy/tests/cluster from Go modules:
#
#   Kubernetes v1.34.x  kube-apiserver, kube-controller-manager, kube-scheduler,
#                       kubelet, kubectl (k8s.io/kubernetes; v1.34 is the last
#                       minor whose kubelet runs on cgroup v1 without opting in)
#   etcd                etcd (go.etcd.io/etcd/server/v3)
#   helm                helm (helm.sh/helm/v3), the chart's install
#   crictl              crictl (sigs.k8s.io/cri-tools), removals over CRI
#
# into $IMAGEGC_KUBERNETES_DIR (default target/kubernetes). A binary already
# built there is kept; Go's build cache (-trimpath, so the copy's path does
# not matter) makes a rebuild on the same machine a matter of linking. A cold
# machine spends about 10 minutes and 3 GB of build cache here.
#
# k8s.io/kubernetes replaces every k8s.io/* module with ./staging/..., which
# the module zip lacks: the module is copied somewhere writable and each
# replace pointed at the published module of the matching v0 version.

KUBERNETES_VERSION=v1.34.4
ETCD_VERSION=v3.6.4
HELM_VERSION=v3.22.0
CRICTL_VERSION=v1.34.0

build_testbed_kubernetes() {
    local dir=${IMAGEGC_KUBERNETES_DIR:-$PWD/target/kubernetes}
    export IMAGEGC_KUBERNETES_DIR=$dir
    export PATH="$PATH:/usr/local/go/bin"
    if ! command -v go >/dev/null; then
        echo "scripts/testbed-kubernetes.sh: go is not installed (Go >= 1.26 builds Kubernetes and etcd)" >&2
        return 1
    fi
    local started=$SECONDS
    local bin=$dir/$KUBERNETES_VERSION/bin
    mkdir -p "$bin"
    local wanted=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl) missing=() name
    for name in "${wanted[@]}"; do
        [ -x "$bin/$name" ] || missing+=("$name")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "==> building Kubernetes $KUBERNETES_VERSION: ${missing[*]} ($(go version | cut -d' ' -f3))"
        local source
        source=$(GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" \
            | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
        if [ -z "$source" ] || [ ! -d "$source" ]; then
            echo "scripts/testbed-kubernetes.sh: cannot download k8s.io/kubernetes@$KUBERNETES_VERSION" >&2
            return 1
        fi
        local work=$dir/src-$KUBERNETES_VERSION
        rm -rf "$work"
        cp -r "$source" "$work" && chmod -R u+w "$work" || return 1
        rm -rf "$work/go.work" "$work/go.work.sum" "$work/vendor"
        local staging=v0.${KUBERNETES_VERSION#v1.} module
        # Every `k8s.io/X => ./staging/src/k8s.io/X` becomes k8s.io/X@v0.<minor>.<patch>.
        for module in $(cd "$work" && go mod edit -json | sed -n 's/.*"Path": "\(k8s\.io\/[^"]*\)".*/\1/p' | sort -u); do
            if grep -q "^[[:space:]]*$module => ./staging/" "$work/go.mod"; then
                (cd "$work" && go mod edit -replace="$module=$module@$staging") || return 1
            fi
        done
        local minor=${KUBERNETES_VERSION#v1.}
        minor=${minor%%.*}
        local ldflags="-s -w"
        local pkg
        for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
            ldflags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
            ldflags+=" -X $pkg.gitTreeState=clean"
        done
        local targets=()
        for name in "${missing[@]}"; do
            targets+=("./cmd/$name")
        done
        (cd "$work" && GOFLAGS=-mod=mod GOWORK=off CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" \
            -o "$bin/" "${targets[@]}") || return 1
        rm -rf "$work"
    fi
    if [ ! -x "$bin/etcd" ]; then
        echo "==> building etcd $ETCD_VERSION"
        local wrapper=$dir/etcd-$ETCD_VERSION
        rm -rf "$wrapper" && mkdir -p "$wrapper"
        (cd "$wrapper" && go mod init imagegc.test/etcd >/dev/null 2>&1 \
            && GOFLAGS=-mod=mod go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null 2>&1 \
            && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3) \
            || { echo "scripts/testbed-kubernetes.sh: cannot build etcd $ETCD_VERSION" >&2; return 1; }
        rm -rf "$wrapper"
    fi
    if [ ! -x "$bin/helm" ]; then
        echo "==> building helm $HELM_VERSION"
        (GOBIN=$bin GOFLAGS=-mod=mod CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION") || return 1
    fi
    build_testbed_crictl || return 1
    echo "==> Kubernetes ready in $((SECONDS - started))s: $("$bin/kubelet" --version), etcd $("$bin/etcd" --version | head -n 1 | cut -d' ' -f3), helm $("$bin/helm" version --short), crictl $("$bin/crictl" --version | cut -d' ' -f3)"
}

# crictl alone, into the same directory (scripts/test-systemd.sh starts its
# containers over CRI with it, before the cluster suite builds the rest).
# Exports IMAGEGC_CRICTL.
build_testbed_crictl() {
    local bin=${IMAGEGC_KUBERNETES_DIR:-$PWD/target/kubernetes}/$KUBERNETES_VERSION/bin
    export PATH="$PATH:/usr/local/go/bin"
    if [ ! -x "$bin/crictl" ]; then
        echo "==> building crictl $CRICTL_VERSION"
        (GOBIN=$bin GOFLAGS=-mod=mod CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION") || return 1
    fi
    export IMAGEGC_CRICTL=$bin/crictl
}
