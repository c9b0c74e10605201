#!/usr/bin/env bash
# Builds imagegc's container image in one command: a static (musl) binary
# per architecture and one OCI image holding them all (an index of one
# manifest per architecture), then pushes it to a registry or loads it into
# a local containerd.
#
#   scripts/build-image.sh [--image REF] [--arch amd64,arm64] [--push] [--load-containerd SOCKET] [--dry-run]
#
#   --image REF      the image reference (default ghcr.io/imagegc/imagegc:<version>
#                    on a release commit (scripts/release.sh), else
#                    ghcr.io/imagegc/imagegc:<next patch>-dev.<commit>: the name the
#                    manifests and the chart use, a tag no other build takes)
#   --arch LIST      architectures, comma-separated: amd64, arm64 (default: this
#                    machine's own; --arch amd64,arm64 for one image of both)
#   --push           push every architecture to REF (skopeo copy --all; log in
#                    first with `skopeo login REGISTRY`)
#   --load-containerd SOCKET
#                    import into the containerd at SOCKET, namespace k8s.io (ctr)
#   --dry-run        say what would be built and what it needs, build nothing
#
# The image is written to target/image/imagegc-<version>.oci.tar either way.
# What it needs, besides rustup and cargo (the script adds the musl targets
# with rustup) and python3 (scripts/oci-image.py assembles the image with
# the standard library only):
#   amd64 on amd64:  musl-gcc (apt-get install musl-tools): the Kubernetes
#                    client's TLS (rustls with ring) compiles C and assembly
#   arm64 on arm64:  musl-gcc, as above
#   arm64 on amd64:  clang (apt-get install clang lld) compiles ring for
#                    aarch64 musl; the toolchain's own rust-lld links
#   amd64 on arm64:  not supported by this script (use the Containerfile on an
#                    amd64 builder)
#   --push:          skopeo (apt-get install skopeo)
#   root certificates: /etc/ssl/certs/ca-certificates.crt (Debian's
#                    ca-certificates: apt-get install ca-certificates), or
#                    IMAGEGC_CA_BUNDLE naming another PEM bundle; carried in
#                    the image for the registry lookups (SSL_CERT_FILE)
# Without Kubernetes support (IMAGEGC_CARGO_FLAGS=--no-default-features) no
# C compiler is needed at all.
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
# The commit built (the binary says it: `imagegc --version`,
# imagegc_build_info), and the image's tag: the version on the commit
# scripts/release.sh made ("release VERSION", the tree clean), else
# NEXT-dev.COMMIT, NEXT the version's next patch (0.2.1-dev.COMMIT after
# 0.2.0), so that no build of another commit ever takes a release's tag (a
# node that has the release never keeps it for an upgrade) and semantic
# versioning orders a build after the release it follows and before any
# later one.
commit=${IMAGEGC_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
if [ "$(git log -1 --format=%s 2>/dev/null)" = "release $version" ] \
    && [ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    tag=$version
else
    IFS=. read -r major minor patch <<<"${version%%-*}"
    tag=$major.$minor.$((patch + 1))-dev.$commit
fi
export IMAGEGC_COMMIT=$commit
image=ghcr.io/imagegc/imagegc:$tag
case $(uname -m) in
    x86_64) arches=amd64 ;;
    aarch64 | arm64) arches=arm64 ;;
    *) echo "scripts/build-image.sh: no image for this machine's architecture $(uname -m) (amd64, arm64)" >&2; exit 2 ;;
esac
push=false
dry_run=false
load_socket=
while [ $# -gt 0 ]; do
    case $1 in
        --image) image=$2; shift 2 ;;
        --arch) arches=$2; shift 2 ;;
        --push) push=true; shift ;;
        --load-containerd) load_socket=$2; shift 2 ;;
        --dry-run) dry_run=true; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "scripts/build-image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

ca_bundle=${IMAGEGC_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
if [ ! -r "$ca_bundle" ]; then
    echo "scripts/build-image.sh: no root certificates at $ca_bundle (apt-get install ca-certificates, or set IMAGEGC_CA_BUNDLE)" >&2
    $dry_run || exit 1
fi
target_dir=${CARGO_TARGET_DIR:-$PWD/target}
binaries=()
IFS=, read -ra wanted <<<"$arches"
for arch in "${wanted[@]}"; do
    case $arch in
        amd64) triple=x86_64-unknown-linux-musl ;;
        arm64) triple=aarch64-unknown-linux-musl ;;
        *) echo "scripts/build-image.sh: unknown architecture $arch (amd64, arm64)" >&2; exit 2 ;;
    esac
    if [ "$arch" = arm64 ] && [ "$(uname -m)" != aarch64 ]; then
        needs="rustup target $triple, clang and lld (apt-get install clang lld)"
    elif [ "$arch" = amd64 ] && [ "$(uname -m)" != x86_64 ]; then
        echo "scripts/build-image.sh: amd64 on $(uname -m) is not supported here: use the Containerfile on an amd64 builder" >&2
        exit 2
    else
        needs="rustup target $triple, musl-gcc (apt-get install musl-tools)"
    fi
    if $dry_run; then
        echo "would build linux/$arch ($triple): needs $needs"
        continue
    fi
    rustup target add "$triple" >/dev/null
    echo "==> building imagegc $version for linux/$arch ($triple)"
    # shellcheck disable=SC2086 # flags, split on purpose
    if [ "$arch" = arm64 ] && [ "$(uname -m)" != aarch64 ]; then
        # rust-lld links the musl target with the toolchain's own crt
        # objects; clang compiles ring's C for the target.
        CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=rust-lld \
            CC_aarch64_unknown_linux_musl=clang CFLAGS_aarch64_unknown_linux_musl=--target=aarch64-linux-musl \
            cargo build --release --locked --target "$triple" ${IMAGEGC_CARGO_FLAGS:-}
    elif [ "$arch" = amd64 ] && command -v musl-gcc >/dev/null; then
        CC_x86_64_unknown_linux_musl=musl-gcc cargo build --release --locked --target "$triple" ${IMAGEGC_CARGO_FLAGS:-}
    else
        cargo build --release --locked --target "$triple" ${IMAGEGC_CARGO_FLAGS:-}
    fi
    binary=$target_dir/$triple/release/imagegc
    if readelf -d "$binary" 2>/dev/null | grep -q NEEDED; then
        echo "scripts/build-image.sh: $binary links shared libraries" >&2
        exit 1
    fi
    binaries+=(--binary "$arch=$binary")
done

if $dry_run; then
    echo "would carry the root certificates of $ca_bundle as /etc/ssl/certs/ca-certificates.crt"
    echo "would write $target_dir/image/imagegc-$version.oci.tar as $image (python3)"
    $push && echo "would push $image (skopeo)"
    [ -n "$load_socket" ] && echo "would import $image into the containerd at $load_socket (ctr)"
    exit 0
fi
mkdir -p "$target_dir/image"
archive=$target_dir/image/imagegc-$version.oci.tar
python3 scripts/oci-image.py --name "$image" --version "$version" --config deploy/imagegc.toml \
    --ca-bundle "$ca_bundle" --output "$archive" "${binaries[@]}"

if $push; then
    command -v skopeo >/dev/null || { echo "scripts/build-image.sh: --push needs skopeo" >&2; exit 1; }
    echo "==> pushing $image ($arches)"
    skopeo copy --all "oci-archive:$archive" "docker://$image"
fi
if [ -n "$load_socket" ]; then
    echo "==> importing $image into the containerd at $load_socket (namespace k8s.io)"
    ctr -a "$load_socket" -n k8s.io images import --all-platforms "$archive"
fi
echo "==> $archive"
