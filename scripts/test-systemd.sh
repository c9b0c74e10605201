#!/usr/bin/env bash
# imagegc under systemd, installed as README's "With systemd" says and
# checked as an operator would (deploy/tests/systemd/scenario.py): the unit
# started with its sandbox, cycles against a real containerd, reload,
# restart, stop, Kubernetes awareness through systemd/kubernetes.conf and
# the registry lookups through systemd/registry-manifests.conf.
#
#   scripts/test-systemd.sh
#   scripts/test-systemd.sh --rootfs    makes the node's rootfs only (cached)
#
# The node is a private systemd booted as PID 1 by systemd-nspawn: a
# Debian rootfs made by debootstrap (systemd, Debian's containerd 1.6 and
# runc, python3) and cached under target/systemd-testbed/, keyed by what
# makes it; each run boots an overlay of it, with its own network namespace
# (loopback only) and containerd's root on a loop-mounted ext4. The
# container gets a unified cgroup v2 hierarchy (the host may be a cgroup v1
# hybrid) and the bpf() system call, so that the unit's IP firewall
# (IPAddressDeny=, IPAddressAllow=) is enforced.
#
# The binary is the static one the image ships (README: "or copy /imagegc
# out of the image"), built as the cluster suite builds it
# (scripts/testbed-cluster.sh: a no-op after that suite);
# IMAGEGC_SYSTEMD_BIN=target/release/imagegc runs `cargo build --release`'s
# instead. crictl starts the containers (scripts/testbed-kubernetes.sh).
#
# Run as root on Debian 12. Installs what is missing with apt
# (systemd-container, debootstrap, e2fsprogs). Costs, measured on 2 cores:
# the rootfs 73-133 s the first time (debootstrap; 360 MB under target/),
# the scenario about 50 s. Everything it started and mounted is gone when
# it exits: the node's processes, mounts and cgroups.
#
# Environment:
#   IMAGEGC_SYSTEMD_BIN    the imagegc to install (default: the static build)
#   IMAGEGC_SYSTEMD_CACHE  where the rootfs is kept (target/systemd-testbed)
#   IMAGEGC_DEBIAN_MIRROR  debootstrap's mirror (http://deb.debian.org/debian)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test-systemd.sh: boots a container and mounts filesystems: run as root" >&2
    exit 1
fi

# --- what the node is made of -----------------------------------------------
DEBIAN_SUITE=bookworm
DEBIAN_MIRROR=${IMAGEGC_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# systemd as init; containerd 1.6 and runc, the runtime; python3 runs the
# scenario; ca-certificates for the registry's TLS (and openssl, which it
# brings, to make the test's certificates); iproute2 for the test's
# addresses; busybox-static for the test images.
NODE_PACKAGES=systemd,systemd-sysv,dbus,containerd,runc,python3,ca-certificates,iproute2,busybox-static
CACHE=${IMAGEGC_SYSTEMD_CACHE:-$ROOT/target/systemd-testbed}

# make_rootfs DIR: a Debian with NODE_PACKAGES in DIR, made to boot quickly
# and quietly as a container (what is masked does not concern the test).
make_rootfs() {
    local dir=$1 unit
    debootstrap --variant=minbase --include="$NODE_PACKAGES" "$DEBIAN_SUITE" "$dir" "$DEBIAN_MIRROR" \
        >"$dir.log" 2>&1 || {
        tail -n 20 "$dir.log" >&2
        return 1
    }
    rm -f "$dir.log"
    chroot "$dir" apt-get clean
    echo imagegc-node >"$dir/etc/hostname"
    printf '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n' >"$dir/etc/hosts"
    for unit in apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer \
        fstrim.timer systemd-tmpfiles-clean.timer console-getty.service getty@.service; do
        ln -sf /dev/null "$dir/etc/systemd/system/$unit"
    done
}

# The cached rootfs: target/systemd-testbed/rootfs-KEY, KEY a hash of what
# makes it (the suite, the packages, make_rootfs itself). Any other key's is
# removed.
cached_rootfs() {
    local key dir started=$SECONDS
    key=$(printf '%s\n' "$DEBIAN_SUITE" "$NODE_PACKAGES" "$(declare -f make_rootfs)" | sha256sum | cut -c1-16)
    dir=$CACHE/rootfs-$key
    if [ ! -d "$dir" ]; then
        mkdir -p "$CACHE"
        find "$CACHE" -mindepth 1 -maxdepth 1 -name 'rootfs-*' -exec rm -rf {} +
        echo "==> making the node's rootfs (debootstrap $DEBIAN_SUITE: ${NODE_PACKAGES//,/ })" >&2
        make_rootfs "$dir.tmp-$$" || {
            rm -rf "$dir.tmp-$$"
            echo "scripts/test-systemd.sh: debootstrap failed (mirror $DEBIAN_MIRROR)" >&2
            return 1
        }
        # (A run beside this one may have made it first: its copy stays.)
        mv -T "$dir.tmp-$$" "$dir" 2>/dev/null || rm -rf "$dir.tmp-$$"
        echo "==> rootfs made in $((SECONDS - started))s: $dir" >&2
    fi
    echo "$dir"
}

# --- prerequisites ------------------------------------------------------------
started=$SECONDS
missing=()
command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
if [ ${#missing[@]} -gt 0 ]; then
    echo "==> installing ${missing[*]}"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ "${1:-}" = --rootfs ]; then
    # The node's rootfs alone (scripts/test.sh makes it in the background).
    cached_rootfs >/dev/null
    exit 0
fi
if [ -n "${IMAGEGC_SYSTEMD_BIN:-}" ]; then
    binary=$IMAGEGC_SYSTEMD_BIN
    [ -x "$binary" ] || {
        echo "scripts/test-systemd.sh: IMAGEGC_SYSTEMD_BIN=$binary is not an executable" >&2
        exit 1
    }
else
    . scripts/testbed-cluster.sh
    build_static_imagegc
    binary=$IMAGEGC_STATIC_BIN
fi
. scripts/testbed-kubernetes.sh
build_testbed_crictl
rootfs=$(cached_rootfs)
echo "==> prerequisites ready in $((SECONDS - started))s"

# --- the node -----------------------------------------------------------------
run=$(mktemp -d /tmp/igcsd-XXXXXX)
nspawn_pid=
init_pid=
# systemd-nspawn (--keep-unit, no systemd on the host to ask for a scope)
# puts the node under the cgroup it is started in: one of its own in every
# hierarchy systemd uses, so that runs side by side do not share one, and
# removed at the end.
if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
    hierarchies=(/sys/fs/cgroup)
else
    hierarchies=()
    for hierarchy in /sys/fs/cgroup/systemd /sys/fs/cgroup/unified; do
        [ -d "$hierarchy" ] && hierarchies+=("$hierarchy")
    done
fi
cgroup=imagegc-systemd-test-${run##*-}

# in_node CMD...: runs CMD in the node's namespaces.
in_node() {
    nsenter --target "$init_pid" --all --root --wd=/ \
        env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"
}

# shellcheck disable=SC2317 # run by the EXIT trap
stop_node() {
    local status=$? deadline hierarchy mount
    trap - EXIT INT TERM
    if [ -n "$nspawn_pid" ] && kill -0 "$nspawn_pid" 2>/dev/null; then
        # The containers first (their sleep ignores SIGTERM: a power-off
        # would wait for systemd's stop timeout), then the node: SIGTERM
        # makes nspawn power it off.
        [ -n "$init_pid" ] && in_node timeout 30 crictl rmp --force --all >/dev/null 2>&1
        kill -TERM "$nspawn_pid" 2>/dev/null || true
        deadline=$((SECONDS + 20))
        while kill -0 "$nspawn_pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do
            sleep 0.2
        done
        if kill -0 "$nspawn_pid" 2>/dev/null; then
            echo "==> the node did not power off within 20 s: killing it" >&2
            [ -n "$init_pid" ] && kill -KILL "$init_pid" 2>/dev/null
            wait "$nspawn_pid" 2>/dev/null || true
        fi
    fi
    for mount in "$run/root" "$run/imagefs"; do
        if mountpoint -q "$mount"; then
            umount "$mount" 2>/dev/null || umount -l "$mount"
        fi
    done
    rm -rf "$run"
    for hierarchy in "${hierarchies[@]}"; do
        if [ -d "$hierarchy/$cgroup" ]; then
            # Empty once the node's last process is reaped.
            deadline=$((SECONDS + 10))
            until find "$hierarchy/$cgroup" -depth -type d -exec rmdir {} + 2>/dev/null; do
                if [ "$SECONDS" -ge "$deadline" ]; then
                    echo "scripts/test-systemd.sh: cannot remove the cgroup $hierarchy/$cgroup" >&2
                    break
                fi
                sleep 0.2
            done
        fi
    done
    exit "$status"
}
trap stop_node EXIT
trap 'exit 130' INT TERM

# The node's root: an overlay of the cached rootfs, which stays as it is.
mkdir -p "$run/root" "$run/upper" "$run/work" "$run/imagefs"
mount -t overlay overlay -o "lowerdir=$rootfs,upperdir=$run/upper,workdir=$run/work" "$run/root"
# containerd's root: its own small filesystem, as on the test bed of
# TESTBED.md (mounted here, bound into the node).
truncate -s 512M "$run/imagefs.img"
mkfs.ext4 -q -F -m 0 "$run/imagefs.img"
mount -o loop "$run/imagefs.img" "$run/imagefs"

# The operator's checkout, as far as README's commands read it: the unit,
# its drop-ins, the configuration, README itself and the binary at the path
# README installs it from.
src=$run/root/src
mkdir -p "$src/target/release" "$src/deploy/tests"
cp -r systemd "$src/"
cp README.md "$src/"
cp "$binary" "$src/target/release/imagegc"
cp -r deploy/tests/systemd "$src/deploy/tests/"
cp deploy/tests/cluster/oci.py "$src/deploy/tests/systemd/"
install -m 0755 "$IMAGEGC_CRICTL" "$run/root/usr/local/bin/crictl"

# Debian's containerd, configured as TESTBED.md says for this machine: no
# registry (the sandbox image is imported), no AppArmor, no lowered OOM
# scores; and no cgroups for its containers: the node's cgroup v2
# hierarchy has no controllers where the host keeps them on v1 (runc could
# not set the pause container's cpu.weight). Its root is the loop-mounted
# filesystem.
cat >"$run/root/etc/containerd/config.toml" <<'EOF'
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "imagegc.test/pause:1"
  disable_apparmor = true
  restrict_oom_score_adj = true
  disable_cgroup = true
EOF
printf 'runtime-endpoint: unix:///run/containerd/containerd.sock\nimage-endpoint: unix:///run/containerd/containerd.sock\ntimeout: 30\n' \
    >"$run/root/etc/crictl.yaml"

echo "==> booting the node (systemd-nspawn, $("$run/root/lib/systemd/systemd" --version | head -n 1))"
# A unified cgroup v2 hierarchy whatever the host has, and bpf(), which
# nspawn's own filter denies: the unit's IP firewall is a BPF program on its
# cgroup. The keyring calls too, for runc.
(
    for hierarchy in "${hierarchies[@]}"; do
        mkdir -p "$hierarchy/$cgroup"
        echo "$BASHPID" >"$hierarchy/$cgroup/cgroup.procs"
    done
    SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 exec systemd-nspawn --quiet --boot --console=passive \
        --directory="$run/root" --machine="imagegc-node-${run##*-}" --register=no --keep-unit \
        --private-network --resolv-conf=off --link-journal=no --system-call-filter='bpf @keyring' \
        --bind="$run/imagefs:/var/lib/containerd"
) >"$run/nspawn.log" 2>&1 &
nspawn_pid=$!

deadline=$((SECONDS + 60))
until [ -n "$init_pid" ] && [ "$(cat "/proc/$init_pid/comm" 2>/dev/null)" = systemd ] \
    && in_node test -S /run/systemd/private 2>/dev/null; do
    if ! kill -0 "$nspawn_pid" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
        echo "scripts/test-systemd.sh: the node did not boot within 60 s; systemd-nspawn said:" >&2
        cat "$run/nspawn.log" >&2
        exit 1
    fi
    init_pid=$(pgrep -P "$nspawn_pid" | head -n 1 || true)
    sleep 0.2
done
state=$(in_node timeout 60 systemctl is-system-running --wait || true)
echo "==> the node is up ($state) in $((SECONDS - started))s"

status=0
in_node python3 /src/deploy/tests/systemd/scenario.py || status=$?
echo "==> systemd scenario: exit $status; $((SECONDS - started))s with prerequisites"
exit "$status"
