#!/usr/bin/env bash
# Run an agentrl image with run folders in a host folder, with docker or podman (as docker/build.sh picks).
#
#   docker/run.sh agentrl:cpu                                  # the image's default job into ./runs
#   docker/run.sh agentrl:cpu agentrl run --env math --steps 2 --output runs/math2
#   RUNS=/data/runs SHM=8g docker/run.sh agentrl:cpu agentrl run --env webshop --runners 8
#
# RUNS (default ./runs) is mounted at /opt/agentrl/runs. SHM sizes /dev/shm, where Ray's object store lives once env
# runners run in Ray actors (--runners N): Ray sizes its store at 30% of the memory it sees (the host's, in a container
# without a memory limit) and moves it to /tmp, slowly, when /dev/shm is smaller (containers get 64 MB by default).
# The default, 35% of the host's memory, leaves it in /dev/shm; /dev/shm is a tmpfs, so the size is a ceiling, not a
# reservation. GPUS=all passes the host's GPUs (docker --gpus, podman CDI).
#
# An image that runs as a user (the CPU image: agentrl, uid 1000) needs RUNS writable by that uid. With rootless
# podman the host user becomes that uid inside (--userns keep-id), so RUNS stays the host user's; otherwise the script
# gives a folder it creates to that uid when it runs as root, and refuses an existing folder the uid cannot write,
# naming the fix.
set -euo pipefail
source "$(dirname "$0")/engine.sh"
[ $# -ge 1 ] || _fail "usage: docker/run.sh IMAGE [COMMAND...]"
image=$1; shift
runs=${RUNS:-$PWD/runs}
# The image's user: numeric, or agentrl (uid 1000 in docker/Dockerfile.cpu); empty or root needs nothing.
image_user=$("${ENGINE[@]}" image inspect --format '{{.Config.User}}' "$image" 2>/dev/null || true)
case "${image_user%%:*}" in
    ""|root|0) image_uid="" ;;
    agentrl) image_uid=1000 ;;
    *[!0-9]*) image_uid="" ;;  # another named user: its uid is not known here
    *) image_uid=${image_user%%:*} ;;
esac
created=""
[ -d "$runs" ] || { mkdir -p "$runs"; created=1; }
runs=$(cd "$runs" && pwd)
shm=${SHM:-$(awk '/^MemTotal:/ {printf "%dm", $2 * 0.35 / 1024 + 1}' /proc/meminfo)}
args=(run --rm --shm-size "$shm" -v "$runs:/opt/agentrl/runs")
if [ -n "$image_uid" ] && [ "${ENGINE[0]}" = podman ] && [ "$(id -u)" != 0 ]; then
    args+=(--userns "keep-id:uid=$image_uid,gid=$image_uid")
elif [ -n "$image_uid" ] && [ "$(stat -c %u "$runs")" != "$image_uid" ] \
        && [ -z "$(find "$runs" -maxdepth 0 -perm -0002)" ]; then
    if [ -n "$created" ] && [ "$(id -u)" = 0 ]; then
        chown "$image_uid:$image_uid" "$runs"
    else
        _fail "the image runs as uid $image_uid, which cannot write RUNS=$runs (owned by uid $(stat -c %u "$runs")): \
chown -R $image_uid:$image_uid $runs, or set RUNS to a folder uid $image_uid owns"
    fi
fi
[ "${ENGINE[0]}" = podman ] && args+=(--network host)
if [ -n "${GPUS:-}" ]; then
    [ "${ENGINE[0]}" = docker ] && args+=(--gpus "$GPUS") || args+=(--device nvidia.com/gpu=all)
fi
exec "${ENGINE[@]}" "${args[@]}" "${ENGINE_FLAGS[@]}" "$image" "$@"
