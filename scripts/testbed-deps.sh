# shellcheck shell=bash
# Sourced by scripts/test.sh and scripts/bench.sh: installs with apt-get what
# the containerd test bed needs and a fresh Debian 12 machine lacks
# (containerd, runc, gcc and libc6-dev for the static sleeper, mkfs.ext4 and
# losetup for the loop-mounted image filesystem). Run as root.
install_testbed_deps() {
    local missing=()
    command -v containerd >/dev/null || missing+=(containerd)
    command -v runc >/dev/null || missing+=(runc)
    command -v gcc >/dev/null || missing+=(gcc)
    dpkg -s libc6-dev >/dev/null 2>&1 || missing+=(libc6-dev)
    command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
    command -v losetup >/dev/null || missing+=(mount)
    if [ ${#missing[@]} -gt 0 ]; then
        echo "==> installing ${missing[*]}"
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
    fi
}
