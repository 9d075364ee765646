#!/usr/bin/env bash
# Build agentrl:cpu or agentrl:gpu from the repository, with docker where its daemon answers and podman otherwise.
#
#   docker/build.sh cpu                        # the lock (requirements/); torch from PyTorch's CPU index
#   docker/build.sh cpu --torch-from /opt/wheels   # torch from a folder of wheels (podman: mounted into the build)
#   docker/build.sh gpu                        # CUDA torch + vLLM from PyPI
#   docker/build.sh cpu --base debian:bookworm-slim@sha256:<digest>   # the base pinned by digest
#   docker/build.sh cpu --base my/debian:bookworm --tag me/agentrl:cpu
#   docker/build.sh cpu --ca-bundle /etc/ssl/certs/ca-certificates.crt   # pip behind a TLS-intercepting proxy
#
# --ca-bundle (default: the host's PIP_CERT, with podman) is mounted into the build for pip only; the image keeps
# Debian's own certificates.
# Where the base image cannot be pulled (no registry reachable) and debootstrap is installed, the script makes the
# base from the Debian archive (`debootstrap --variant=minbase bookworm`, about 300 MB) and tags it with the base's
# name, so the Dockerfile builds unchanged; a base pinned by digest is never made (debootstrap cannot produce a given
# digest): it must be pulled. podman builds docker-format images (--format docker): the OCI format has no HEALTHCHECK
# and podman would drop the images'. Extra arguments after `--` go to `build` as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
source docker/engine.sh

usage="usage: docker/build.sh cpu|gpu [--torch-from URL|DIR] [--base IMAGE] [--tag TAG] [--ca-bundle FILE] [-- BUILD-ARGS...]"
[ $# -ge 1 ] || _fail "$usage"
flavour=$1; shift
case "$flavour" in cpu|gpu) ;; *) _fail "unknown image '$flavour': $usage" ;; esac
base=debian:bookworm-slim tag=agentrl:$flavour torch_from="" ca_bundle="" extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --torch-from) torch_from=${2:?--torch-from needs a URL or a folder}; shift 2 ;;
        --base) base=${2:?--base needs an image}; shift 2 ;;
        --tag) tag=${2:?--tag needs a name}; shift 2 ;;
        --ca-bundle) ca_bundle=${2:?--ca-bundle needs a file}; shift 2 ;;
        --) shift; extra=("$@"); break ;;
        *) _fail "unknown option '$1': $usage" ;;
    esac
done

if [ "$flavour" = cpu ]; then
    for lock in requirements/torch-cpu.txt requirements/cpu.txt; do
        [ -f "$lock" ] || _fail "$lock (the lock the CPU image installs; python requirements/lock.py writes it) is \
missing from $(pwd)"
    done
fi
args=(build -f "docker/Dockerfile.$flavour" -t "$tag" --build-arg "BASE=$base")
if [ -n "$torch_from" ]; then
    [ "$flavour" = cpu ] || _fail "--torch-from is for the CPU image (the GPU image's CUDA torch comes from PyPI)"
    if [ -d "$torch_from" ]; then
        torch_from=$(cd "$torch_from" && pwd)
        [ "${ENGINE[0]}" = podman ] || _fail "docker build cannot mount $torch_from: serve it as an index \
(python -m http.server) and pass its URL, or build with podman (AGENTRL_ENGINE=podman)"
        torch_pin=$(sed -n 's/^torch==//p' requirements/torch-cpu.txt)
        ls "$torch_from/torch-$torch_pin-"*.whl >/dev/null 2>&1 || _fail "$torch_from has no torch-$torch_pin wheel \
(the version requirements/torch-cpu.txt pins)"
        args+=(-v "$torch_from:$torch_from:ro")
    fi
    args+=(--build-arg "TORCH_FROM=$torch_from")
fi

if [ -n "$ca_bundle" ]; then
    [ "${ENGINE[0]}" = podman ] || _fail "docker build cannot mount $ca_bundle: add it to the base image, or build with podman"
    [ -f "$ca_bundle" ] || _fail "--ca-bundle $ca_bundle: no such file"
elif [ "${ENGINE[0]}" = podman ] && [ -f "${PIP_CERT:-}" ]; then
    ca_bundle=$PIP_CERT
fi
if [ -n "$ca_bundle" ]; then
    args+=(-v "$(realpath "$ca_bundle"):/run/agentrl-ca.crt:ro" --build-arg PIP_CERT=/run/agentrl-ca.crt)
fi

if [ "${ENGINE[0]}" = podman ]; then
    # podman resolves a short name through registries.conf; the Dockerfile's FROM means Docker Hub's image.
    if [[ "$base" != */* ]]; then
        full=docker.io/library/$base
    else
        case "${base%%/*}" in *.*|*:*|localhost) full=$base ;; *) full=docker.io/$base ;; esac
    fi
    if ! "${ENGINE[@]}" image exists "$full" && ! "${ENGINE[@]}" pull -q "$full" >/dev/null 2>&1; then
        [[ "$base" != *@* ]] || _fail "cannot pull $full: a base pinned by digest must come from a registry \
(debootstrap cannot make a given digest); reach one, or pass --base without the digest"
        [[ "$base" == debian:bookworm* ]] || _fail "cannot pull $full, and only a debian:bookworm base can be made here"
        command -v debootstrap >/dev/null 2>&1 || _fail "cannot pull $full: reach a registry, or apt-get install debootstrap"
        echo "docker/build.sh: $full cannot be pulled; making it from the Debian archive with debootstrap" >&2
        rootfs=$(mktemp -d)
        trap 'rm -rf "$rootfs"' EXIT
        debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" >/dev/null
        tar -C "$rootfs" -c . | "${ENGINE[@]}" import -q - "$full" >/dev/null
        rm -rf "$rootfs"
    fi
    args+=(--pull=never --network host --format docker)
fi

echo "+ ${ENGINE[*]} ${args[*]} ${ENGINE_FLAGS[*]} ${extra[*]} ." >&2
start=$(date +%s)
"${ENGINE[@]}" "${args[@]}" "${ENGINE_FLAGS[@]}" "${extra[@]}" .
echo "docker/build.sh: built $tag in $(( $(date +%s) - start )) s" >&2
