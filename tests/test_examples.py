"""The examples in examples/ run as they say: each command is read from its docstring or script header and run in a
subprocess from the repository root, as a user would type it, with only its run folder moved to a temporary one.

Each is a smoke run of a tiny random model (about 15 s on 2 cores, most of it importing torch and building the
model); the assertions check what shows that it really ran, not what it learned.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from conftest import ROOT

EXAMPLES = ROOT / "examples"
# The smoke run among guess_number.py's commands, not the full-size one.
GUESS_SMOKE = "agentrl run --env examples/guess_number.py:GuessNumber --model tiny-qwen3 --engine hf"


def _environ(**extra: str) -> dict[str, str]:
    # The interpreter running the tests first on PATH: `agentrl` and `python3` in the scripts are then this install's,
    # also when a virtual environment is used without being activated.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {**os.environ, "PATH": path, **extra}


def _run(argv: list[str], timeout: int = 300, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=_environ(**extra), stdin=subprocess.DEVNULL
    )


def _documented(name: str, start: str) -> list[str]:
    """The one command in examples/NAME whose line begins with `start` (continuation lines joined, comment dropped)."""
    text = (EXAMPLES / name).read_text().replace("\\\n", " ")
    lines = [line.lstrip("#").strip() for line in text.splitlines() if line.lstrip("#").strip().startswith(start)]
    assert len(lines) == 1, f"examples/{name}: expected one command starting {start!r}, found {lines}"
    return shlex.split(lines[0], comments=True)


def _output_moved(argv: list[str], out: Path) -> list[str]:
    """`argv` with its --output (a folder under runs/, which the repository ignores) replaced by `out`."""
    i = argv.index("--output")
    assert argv[i + 1].startswith("runs/"), argv
    return [*argv[: i + 1], str(out), *argv[i + 2 :]]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _servers_on(port: int) -> list[int]:
    """Pids of `agentrl env serve` processes started for `port` (a port no other test uses)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "serve" in cmdline and "--port" in cmdline and str(port) in cmdline:
            found.append(proc.info["pid"])
    return found


def test_examples_readme_lists_each_documented_command():
    table = (EXAMPLES / "README.md").read_text()
    for name, start in [
        ("guess_number.py", GUESS_SMOKE),
        ("math_tool_agent.py", "agentrl run --agent"),
        ("served_env.sh", "bash examples/served_env.sh"),
        ("lora.sh", "bash examples/lora.sh"),
    ]:
        row = re.search(rf"^\| `{re.escape(name)}` \|.*\| `([^`]+)` \|$", table, re.M)
        assert row, f"examples/README.md has no row for {name}"
        assert shlex.split(row.group(1)) == _documented(name, start), f"examples/README.md's command for {name}"


def test_guess_number_is_the_readme_env_and_plays_and_trains(tmp_path):
    readme_code = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    assert readme_code in (EXAMPLES / "guess_number.py").read_text(), "README.md's GuessNumber and the example differ"

    played = _run(_documented("guess_number.py", "agentrl play"), timeout=120)
    assert played.returncode == 0, played.stderr[-2000:]
    assert "reward=1 success=True steps=1" in played.stdout, played.stdout[-2000:]

    out = tmp_path / "guess"
    done = _run(_output_moved(_documented("guess_number.py", GUESS_SMOKE), out))
    assert done.returncode == 0, done.stderr[-3000:]
    assert [row["step"] for row in _jsonl(out / "metrics.jsonl")] == [0]
    episodes = _jsonl(out / "trajectories.jsonl")
    assert len(episodes) == 4, "2 prompts x 2 episodes"
    assert all(e["first_observation"] == "I picked a number between 1 and 100." for e in episodes)
    assert all(1 <= len(e["turns"]) <= 2 for e in episodes), "--max-turns 2"
    assert (out / "checkpoint" / "model.safetensors").is_file()


def test_served_env_script_trains_on_the_server_then_stops_it(tmp_path):
    port, out = _free_port(), tmp_path / "served"
    done = _run(_documented("served_env.sh", "bash examples/served_env.sh"), PORT=str(port), OUT=str(out))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "env server ready:" in done.stdout
    after = json.loads(done.stdout.split("env server after the run:", 1)[1].strip().splitlines()[0])
    assert after["env"] == "GuessNumber" and after["sessions"] == 0, "the run closed every session it opened"
    assert not _listening(port) and not _servers_on(port), "the script left its env server running"

    url = f"http://127.0.0.1:{port}/GuessNumber"
    assert f"agentrl run: {url}" in done.stdout
    episodes = _jsonl(out / "trajectories.jsonl")
    # Only the server has GuessNumber's code here (the run knows a URL): its observations came from the server.
    assert len(episodes) == 4 and all(e["env_id"] == url for e in episodes)
    assert all(e["first_observation"] == "I picked a number between 1 and 100." for e in episodes)
    assert all(t["observation"] for e in episodes for t in e["turns"])
    assert [row["step"] for row in _jsonl(out / "metrics.jsonl")] == [0]


def test_served_env_script_stops_the_server_when_the_run_fails(tmp_path):
    (tmp_path / "a_file").write_text("")
    port = _free_port()
    # A run folder inside a plain file: the server starts and answers, then `agentrl run` fails.
    done = _run(
        _documented("served_env.sh", "bash examples/served_env.sh"),
        timeout=120,
        PORT=str(port),
        OUT=str(tmp_path / "a_file" / "run"),
    )
    assert done.returncode != 0
    assert "env server ready:" in done.stdout and "Not a directory" in done.stderr, done.stderr[-2000:]
    assert not _listening(port) and not _servers_on(port), "the script left its env server running after a failure"


@pytest.mark.skipif(
    importlib.util.find_spec("openai") is None,
    reason="the example agent uses the openai client: pip install 'agentrl-platform[agents]'",
)
def test_math_tool_agent_docstring_command_trains(tmp_path):
    out = tmp_path / "agent"
    done = _run(_output_moved(_documented("math_tool_agent.py", "agentrl run --agent"), out))
    assert done.returncode == 0, done.stderr[-3000:]
    assert [row["step"] for row in _jsonl(out / "metrics.jsonl")] == [0, 1]
    sessions = _jsonl(out / "agent_sessions.jsonl")
    assert len(sessions) == 8, "2 steps x 2 prompts x 2 episodes, one agent session each"
    assert all(s["calls"] >= 1 for s in sessions), "every session called the policy through the OpenAI client"
    # Step 1's agents talked to the weights step 0 trained: the served policy was updated between the steps.
    assert sorted({(s["step"], tuple(s["policy_versions"])) for s in sessions}) == [(0, (0,)), (1, (1,))]
    assert len(_jsonl(out / "trajectories.jsonl")) == 8


@pytest.mark.skipif(
    importlib.util.find_spec("peft") is None, reason="LoRA needs peft: pip install 'agentrl-platform[lora]'"
)
def test_lora_script_writes_the_adapter(tmp_path):
    out = tmp_path / "lora"
    done = _run(_documented("lora.sh", "bash examples/lora.sh"), OUT=str(out))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert [row["step"] for row in _jsonl(out / "metrics.jsonl")] == [0, 1]
    config = json.loads((out / "checkpoint" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 8
    assert (out / "checkpoint" / "adapter_model.safetensors").stat().st_size > 0
    shown = re.search(
        r"^adapter: LORA r=8 alpha=16\.0 on .*, \d+ tensors \((\d+) lora_A, (\d+) lora_B\)$", done.stdout, re.M
    )
    assert shown and shown.group(1) == shown.group(2) != "0", done.stdout[-2000:]
    assert json.loads((out / "plan.json").read_text())["lora"].startswith("rank 8")
