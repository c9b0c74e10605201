#!/usr/bin/env bash
# imagegc's main job on a throwaway containerd: see examples/demo.rs.
#
# Run as root on a Debian 12 machine with cargo installed. Installs
# containerd, runc, gcc, libc6-dev and e2fsprogs when they are missing,
# builds the imagegc binary and the demo, and runs the demo. The demo leaves
# nothing behind: its containerd, containers, mounts and files go at the end.
set -euo pipefail

cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "demo.sh: run as root: the demo mounts a filesystem and starts containerd" >&2
    exit 1
fi

# mkfs.ext4, losetup and runc live in sbin, which `su` without `-` leaves out.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

missing=()
for tool in containerd ctr runc gcc mkfs.ext4; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
# gcc -static needs the static C library.
dpkg -s libc6-dev >/dev/null 2>&1 || missing+=(libc6-dev)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "demo.sh: installing what is missing (${missing[*]})" >&2
    apt-get update
    apt-get install -y containerd runc gcc libc6-dev e2fsprogs
fi

# The dev profile: it builds several times faster than release, shares its
# build with the tests, and unwinds on panic, so a failure in the demo still
# runs its cleanup. Speed does not matter here: the runtime does the work.
cargo build --bin imagegc --example demo
exec target/debug/examples/demo
