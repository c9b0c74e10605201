# shellcheck shell=bash
# Sourced by scripts/test.sh and scripts/bench.sh: builds the runtimes of the
# test bed's matrix beside Debian's containerd 1.6 (which apt installs):
#
#   containerd 2.x  containerd, containerd-shim-runc-v2, ctr
#   CRI-O           crio, and pinns (a minimal C stand-in, crates/imagegc-testkit/runtimes/pinns.c)
#
# from their Go modules (the module proxy), into $IMAGEGC_RUNTIMES_DIR
# (default target/runtimes), where crates/imagegc-testkit/src/testbed/ finds them. A
# runtime already built there is kept; Go's build cache makes a rebuild a
# matter of linking. Needs Go >= 1.26 (/usr/local/go/bin is added to PATH),
# gcc, pkg-config and libseccomp-dev (scripts/testbed-deps.sh installs them).
#
# Modules are fetched with `go mod download` and built in place: `go install
# module@version` asks the proxy for the module's version list to check for a
# deprecation, which the proxy refuses for CRI-O.

CONTAINERD2_MODULE=github.com/containerd/containerd/v2
CONTAINERD2_VERSION=v2.4.2
CRIO_MODULE=github.com/cri-o/cri-o
CRIO_VERSION=v1.36.3
# Build tags: no C libraries beyond libseccomp (btrfs, devmapper, gpgme,
# ostree are left out).
CONTAINERD2_TAGS="no_btrfs"
CRIO_TAGS="containers_image_openpgp exclude_graphdriver_btrfs exclude_graphdriver_devicemapper containers_image_ostree_stub seccomp"

# go_build MODULE VERSION TAGS OUT_DIR PACKAGE...: builds each package's
# command into OUT_DIR.
go_build() {
    local module=$1 version=$2 tags=$3 out=$4
    shift 4
    local source
    source=$(GOFLAGS=-mod=mod go mod download -json "$module@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    if [ -z "$source" ] || [ ! -d "$source" ]; then
        echo "scripts/testbed-runtimes.sh: cannot download $module@$version from the Go module proxy" >&2
        return 1
    fi
    mkdir -p "$out"
    local package
    for package in "$@"; do
        (cd "$source" && GOFLAGS=-buildvcs=false CGO_ENABLED=1 go build -trimpath -tags "$tags" \
            -o "$out/$(basename "$package")" "./$package") || return 1
    done
}

build_testbed_runtimes() {
    local dir=${IMAGEGC_RUNTIMES_DIR:-$PWD/target/runtimes}
    export IMAGEGC_RUNTIMES_DIR=$dir
    export PATH="$PATH:/usr/local/go/bin"
    if ! command -v go >/dev/null; then
        echo "scripts/testbed-runtimes.sh: go is not installed (Go >= 1.26 builds containerd 2.x and CRI-O)" >&2
        return 1
    fi
    local started=$SECONDS
    local containerd2=$dir/containerd-$CONTAINERD2_VERSION/bin
    if [ ! -x "$containerd2/containerd" ] || [ ! -x "$containerd2/containerd-shim-runc-v2" ] || [ ! -x "$containerd2/ctr" ]; then
        echo "==> building containerd $CONTAINERD2_VERSION ($(go version | cut -d' ' -f3))"
        go_build "$CONTAINERD2_MODULE" "$CONTAINERD2_VERSION" "$CONTAINERD2_TAGS" "$containerd2" \
            cmd/containerd cmd/containerd-shim-runc-v2 cmd/ctr || return 1
    fi
    local crio=$dir/crio-$CRIO_VERSION/bin
    if [ ! -x "$crio/crio" ]; then
        echo "==> building CRI-O $CRIO_VERSION"
        go_build "$CRIO_MODULE" "$CRIO_VERSION" "$CRIO_TAGS" "$crio" cmd/crio || return 1
    fi
    if [ ! -x "$crio/pinns" ] || [ crates/imagegc-testkit/runtimes/pinns.c -nt "$crio/pinns" ]; then
        gcc -O2 -Wall -Werror -o "$crio/pinns" crates/imagegc-testkit/runtimes/pinns.c || return 1
    fi
    echo "==> runtimes ready in $((SECONDS - started))s: containerd $("$containerd2/containerd" --version | cut -d' ' -f3), $("$crio/crio" --version 2>/dev/null | head -n 1)"
}
