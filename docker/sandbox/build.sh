#!/usr/bin/env bash
# Build the image the podman sandbox back-end runs agent code in (envs/code/sandbox/podman.py):
# Debian bookworm with python3 and coreutils, nothing else, made without any registry.
#
#   docker/sandbox/build.sh                         # localhost/agentrl-sandbox:bookworm, with debootstrap
#   docker/sandbox/build.sh --tag localhost/my-sandbox:1
#   docker/sandbox/build.sh --base docker.io/library/python:3.11-slim   # from any image that has python3
#   docker/sandbox/build.sh --force                 # rebuild even if the tag exists
#
# Default: `debootstrap --variant=minbase --include=python3 bookworm` from the Debian archive ($MIRROR, default
# http://deb.debian.org/debian; 37 s on the development machine, a 154 MB image), imported with `podman import`.
# With --base, a three-line Containerfile on top of that image (pulled only if podman lacks it).
# Either way the image gets what the back-end relies on:
#   /ws         mount point of the tmpfs that holds one folder per sandbox (the container mounts it)
#   /workspace  a symlink to /proc/self/cwd: every call starts in its sandbox's folder, so /workspace/x there means
#               that sandbox's x, as with the bubblewrap back-end (see podman.py for the limits of this).
# Build it where the back-end runs, with the same podman (the back-end needs rootful podman, as root; on cgroups v1
# hosts runc too): apt-get install -y --no-install-recommends podman runc uidmap fuse-overlayfs catatonit debootstrap
set -euo pipefail

_fail() { echo "docker/sandbox/build.sh: $*" >&2; exit 2; }

tag=localhost/agentrl-sandbox:bookworm base="" force=0
mirror=${MIRROR:-http://deb.debian.org/debian}
while [ $# -gt 0 ]; do
    case "$1" in
        --tag) tag=${2:?--tag needs a name}; shift 2 ;;
        --base) base=${2:?--base needs an image with python3}; shift 2 ;;
        --force) force=1; shift ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) _fail "unknown option '$1' (see --help)" ;;
    esac
done

command -v podman >/dev/null 2>&1 || _fail "podman is not installed: apt-get install -y --no-install-recommends \
podman runc uidmap fuse-overlayfs catatonit debootstrap"
podman=(podman)
flags=()
if [ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" != cgroup2fs ]; then
    # cgroups v1 / hybrid: crun fails there and podman's default limits exceed the host's hard limits.
    command -v runc >/dev/null 2>&1 || _fail "this host has cgroups v1, where podman needs runc: apt-get install runc"
    podman+=(--runtime runc --cgroup-manager cgroupfs)
    nofile=$(ulimit -Hn); [ "$nofile" = unlimited ] && nofile=65536
    flags+=(--ulimit "nofile=$nofile:$nofile" --ulimit nproc=4096:4096)
fi

if [ "$force" = 0 ] && "${podman[@]}" image exists "$tag"; then
    echo "docker/sandbox/build.sh: $tag exists (--force rebuilds it)" >&2
    exit 0
fi

start=$(date +%s)
if [ -n "$base" ]; then
    context=$(mktemp -d)
    trap 'rm -rf "$context"' EXIT
    printf '%s\n' "FROM $base" \
        'RUN command -v python3 >/dev/null && ln -sfn /proc/self/cwd /workspace && mkdir -p -m 1733 /ws' \
        'CMD ["sleep", "infinity"]' > "$context/Containerfile"
    pull=--pull=missing
    "${podman[@]}" image exists "$base" && pull=--pull=never
    "${podman[@]}" build "$pull" --network none "${flags[@]}" -t "$tag" "$context"
else
    command -v debootstrap >/dev/null 2>&1 || _fail "debootstrap is not installed: apt-get install debootstrap \
(or pass --base IMAGE, an image with python3 from a registry)"
    rootfs=$(mktemp -d)
    trap 'rm -rf "$rootfs"' EXIT
    echo "docker/sandbox/build.sh: debootstrap bookworm from $mirror (about 2 minutes)" >&2
    debootstrap --variant=minbase --include=python3 bookworm "$rootfs" "$mirror" >/dev/null
    # What no call needs: package caches and lists, docs (smaller image, nothing to read).
    rm -rf "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/*
    ln -sfn /proc/self/cwd "$rootfs/workspace"
    mkdir -p -m 1733 "$rootfs/ws"
    tar -C "$rootfs" -c . | "${podman[@]}" import -q --change 'CMD ["sleep", "infinity"]' - "$tag" >/dev/null
fi

# The same kind of probe the back-end's unavailable_reason() makes.
timeout 300 "${podman[@]}" run --rm --network none --pull=never "${flags[@]}" "$tag" \
    python3 -c 'import sys; assert sys.version_info >= (3, 9), sys.version' \
    || _fail "$tag was built but cannot run python3"
echo "docker/sandbox/build.sh: built $tag in $(( $(date +%s) - start )) s" >&2
