# shellcheck shell=bash
# Sourced by scripts/test.sh and scripts/bench.sh: installs with apt-get what
# the test bed needs and a fresh Debian 12 machine lacks: containerd 1.6 and
# runc; conmon, skopeo and the distribution registry for CRI-O; gcc,
# libc6-dev, pkg-config and libseccomp-dev to build the static sleeper,
# pinns and CRI-O; mkfs.ext4 and losetup for the loop-mounted image
# filesystems; systemd-nspawn and debootstrap for the systemd unit's node
# (scripts/test-systemd.sh). Run as root.
install_testbed_deps() {
    local missing=() pkg
    command -v containerd >/dev/null || missing+=(containerd)
    command -v runc >/dev/null || missing+=(runc)
    command -v conmon >/dev/null || missing+=(conmon)
    command -v skopeo >/dev/null || missing+=(skopeo)
    command -v docker-registry >/dev/null || missing+=(docker-registry)
    command -v gcc >/dev/null || missing+=(gcc)
    command -v pkg-config >/dev/null || missing+=(pkg-config)
    # The static (musl) builds compile ring's C for the Kubernetes client.
    command -v musl-gcc >/dev/null || missing+=(musl-tools)
    for pkg in libc6-dev libseccomp-dev; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
    command -v losetup >/dev/null || missing+=(mount)
    command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    if [ ${#missing[@]} -gt 0 ]; then
        echo "==> installing ${missing[*]}"
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
    fi
}
