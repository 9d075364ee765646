"""Envs named by where their class lives: ``package.module:Class`` and ``path/to/file.py:Class`` (issue 28).

In-process: both forms build the same env as registering the class does, and a broken file, a missing class or a
class that is not a TextEnv each give one line naming the problem. In a subprocess, as a user would type it from
the folder holding ``guess.py`` (the README's example env): ``agentrl run --env ./guess.py:GuessNumber``, with envs
in the driver and with 2 Ray runners (the file reaches them through Ray's ``py_modules``).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import ROOT

import agentrl
from agentrl.envs.registry import EnvLoadError, short_name

COUNTER_ENV = '''
import agentrl


class Counter(agentrl.TextEnv):
    """Counts the actions; ends after three."""

    system_prompt = "Say anything."

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.n = int(self.np_random.integers(0, 1000))
        return f"start {self.n}", {}

    def step(self, action):
        self.n += 1
        return f"{action} -> {self.n}", float(self.n % 2), self.n % 3 == 0, False, {"success": True}


class NotAnEnv:
    """A plain class."""
'''


def _write_module(folder: Path, body: str) -> str:
    """Write `body` to a .py file with a name no other test uses (modules are cached by name); return the name."""
    name = f"agentrl_test_env_{uuid.uuid4().hex[:8]}"
    (folder / f"{name}.py").write_text(body)
    return name


def _episode(env: agentrl.TextEnv, seed: int) -> list:
    out = [env.reset(seed=seed)]
    out += [env.step(f"a{i}") for i in range(3)]
    return out


def test_module_and_file_ids_match_the_registered_env(tmp_path, monkeypatch):
    name = _write_module(tmp_path, COUNTER_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    by_module = agentrl.make(f"{name}:Counter")
    registered = agentrl.register(f"counter-{name}", entry_point=type(by_module))
    expected = _episode(agentrl.make(registered.id), seed=3)
    assert _episode(by_module, seed=3) == expected
    monkeypatch.chdir(tmp_path)
    for file_id in (f"./{name}.py:Counter", f"{name}.py:Counter", f"{tmp_path / name}.py:Counter"):
        assert _episode(agentrl.make(file_id), seed=3) == expected, file_id
    assert f"{name}:Counter" not in agentrl.registered()  # `agentrl envs list` shows registered envs only
    assert short_name(f"./{name}.py:Counter") == "Counter" and short_name("math") == "math"


def test_a_file_outside_sys_path_is_loaded_and_shipped_to_runners(tmp_path):
    name = _write_module(tmp_path, COUNTER_ENV)
    spec = agentrl.spec(f"{tmp_path / name}.py:Counter")
    assert spec.entry_point == f"{name}:Counter"  # the name Ray runners import it by
    assert spec.py_modules == (str((tmp_path / f"{name}.py").resolve()),)
    assert agentrl.spec("agentrl.envs.math:MathEnv").py_modules == ()  # installed code is not shipped


@pytest.mark.parametrize(("body", "cls", "message"), [
    ("import agentrl\nx = 1\ny = undefined_name\n", "Counter",
     r"cannot load env '{file}:Counter': {file} line 3: NameError: name 'undefined_name' is not defined$"),
    ("def broken(:\n", "Counter", r"cannot load env '{file}:Counter': {file} line 1: SyntaxError: "),
    (COUNTER_ENV, "Missing",
     r"cannot load env '{file}:Missing': {file} has no 'Missing' \(its TextEnv classes: Counter\)$"),
    (COUNTER_ENV, "NotAnEnv", r"cannot load env '{file}:NotAnEnv': NotAnEnv in {file} is class NotAnEnv, "
                              r"not an agentrl.TextEnv subclass"),
])
def test_bad_files_give_one_line(tmp_path, monkeypatch, body, cls, message):
    monkeypatch.chdir(tmp_path)
    file = f"{_write_module(tmp_path, body)}.py"
    with pytest.raises(EnvLoadError) as err:
        agentrl.make(f"{file}:{cls}")
    text = str(err.value)
    assert "\n" not in text
    assert re.match(message.format(file=re.escape(file)), text), text


def test_missing_module_file_and_plain_ids_say_what_is_wrong(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EnvLoadError, match=r"no module named 'no_such_pkg_x' on sys.path"):
        agentrl.spec("no_such_pkg_x.envs:Env")
    with pytest.raises(EnvLoadError, match=r"no file 'missing.py'"):
        agentrl.spec("missing.py:Env")
    with pytest.raises(agentrl.UnknownEnvError, match=r"^unknown env 'maht'\. Did you mean 'math'\?"):
        agentrl.spec("maht")


def _readme_guess_number() -> str:
    """The README's GuessNumber example, as a user would save it to guess.py."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```python\n(import agentrl\n+class GuessNumber.*?)```", readme, re.S)
    assert block, "README.md no longer has the GuessNumber example"
    return block.group(1)


def _run_guess(tmp_path: Path, env_id: str, *extra: str) -> subprocess.CompletedProcess:
    file = tmp_path / env_id.partition(":")[0]
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(_readme_guess_number())
    args = ["run", "--env", env_id, "--model", "tiny-qwen3", "--steps", "1", "--group-size", "2",
            "--prompts-per-step", "1", "--max-new-tokens", "4", "--output", "run", *extra]
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)


def _check_run(tmp_path: Path, proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0]
    assert rows[0]["env_errors"] == 0


@pytest.mark.slow  # ~17 s; tests/test_examples.py runs GuessNumber from its file through the CLI in the default run
def test_cli_runs_an_env_from_a_file(tmp_path):
    _check_run(tmp_path, _run_guess(tmp_path, "./guess.py:GuessNumber"))


def test_cli_runs_an_env_from_a_file_in_ray_runners(tmp_path):
    pytest.importorskip("ray")
    # In a subfolder: Ray puts the driver's cwd on its workers' sys.path, not envs/, so only py_modules ships it.
    _check_run(tmp_path, _run_guess(tmp_path, "envs/guess.py:GuessNumber", "--runners", "2"))


def test_cli_names_a_broken_env_file_in_one_line(tmp_path):
    (tmp_path / "guess.py").write_text("import agentrl\n\nraise RuntimeError('boom')\n")
    proc = subprocess.run([sys.executable, "-m", "agentrl.cli", "play", "--env", "guess.py:GuessNumber"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: cannot load env 'guess.py:GuessNumber': guess.py line 3: "
                                   "RuntimeError: boom")
