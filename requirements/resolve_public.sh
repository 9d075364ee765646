#!/usr/bin/env bash
# Show that the lock resolves on a machine that has only PyPI and PyTorch's CPU index: pip with none of this machine's
# configuration (PIP_CONFIG_FILE=/dev/null, an empty environment: no local mirrors, find-links or constraints), a dry
# run per lock file and Python version, for Linux x86-64 with glibc up to 2.36 (Debian 12), wheels only.
#
#   requirements/resolve_public.sh TORCH_WHEELS_DIR [PYTHON_VERSION...]      (default versions: 3.11 3.12 3.13)
#
# dev.txt and gpu.txt (the CUDA set: all from PyPI) are checked against PyPI itself. torch-cpu.txt is checked against a stand-in of PyTorch's CPU index made in a
# temporary folder from the torch wheels in TORCH_WHEELS_DIR (for a machine that cannot reach download.pytorch.org;
# with a wheel for one Python only, the other versions fail that step for want of a wheel, not of a resolution).
# dev.txt's torch line is left to torch-cpu.txt, as in the README's order (the dry run installs nothing).
# Prints one line per check and writes pip's reports to $OUT (default: a temporary folder).
set -u
cd "$(dirname "$0")/.."
wheels=${1:?usage: requirements/resolve_public.sh TORCH_WHEELS_DIR [PYTHON_VERSION...]}; shift
versions=${*:-3.11 3.12 3.13}
work=$(mktemp -d); out=${OUT:-$work}
mkdir -p "$work/index/torch" "$out"
for whl in "$wheels"/torch-*+cpu-*.whl; do
    name=$(basename "$whl"); cp "$whl" "$work/index/torch/"
    printf '<a href="%s#sha256=%s">%s</a>\n' "${name//+/%2B}" "$(sha256sum "$whl" | cut -d' ' -f1)" "$name" \
        >> "$work/index/torch/index.html"
done
sed "s#https://download.pytorch.org/whl/cpu#file://$work/index#" requirements/torch-cpu.txt > "$work/torch-cpu.txt"
grep -v '^torch==' requirements/dev.txt > "$work/dev.txt"
cp requirements/gpu.txt "$work/gpu.txt"
platforms="--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64"
for v in $(seq 5 36); do platforms="$platforms --platform manylinux_2_${v}_x86_64"; done
for py in $versions; do
    for lock in torch-cpu dev gpu; do
        start=$(date +%s)
        # shellcheck disable=SC2086
        env -i PATH="$PATH" HOME="$HOME" PIP_CONFIG_FILE=/dev/null python -m pip install --dry-run --no-deps \
            --ignore-installed --only-binary=:all: --python-version "$py" $platforms --target "$work/target" \
            --index-url https://pypi.org/simple ${SSL_CERT_FILE:+--cert "$SSL_CERT_FILE"} \
            --report "$out/report-$lock-$py.json" -r "$work/$lock.txt" > "$out/pip-$lock-$py.log" 2>&1
        rc=$?
        packages=$(python -c "import json,sys; print(len(json.load(open(sys.argv[1]))['install']))" \
            "$out/report-$lock-$py.json" 2>/dev/null || echo 0)
        echo "$lock python $py: rc=$rc, $packages packages, $(( $(date +%s) - start )) s"
    done
done
