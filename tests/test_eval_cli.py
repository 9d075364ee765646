"""`agentrl eval` end to end with the tiny real Qwen3, in a subprocess as a user would run it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT


def agentrl(*args):
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)


def test_eval_smoke_with_tiny_qwen3(tmp_path):
    out_dir = tmp_path / "eval"
    out = agentrl("eval", "--env", "math", "--model", "tiny-qwen3", "--episodes", "3", "--k", "1,2",
                  "--max-new-tokens", "8", "--presence-penalty", "0.5", "--output", str(out_dir))
    assert out.returncode == 0, out.stderr
    assert "sampling settings used" in out.stdout and "generation_config.json" in out.stdout
    results = json.loads((out_dir / "results.json").read_text())
    sampling = results["sampling"]
    # Official Qwen3 settings by default, the flag on top, all recorded with their source.
    assert (sampling["temperature"], sampling["top_p"], sampling["top_k"]) == (0.6, 0.95, 20)
    assert sampling["presence_penalty"] == 0.5 and sampling["sources"]["presence_penalty"] == "flag"
    assert sampling["chat_kwargs"] == {"enable_thinking": True}
    assert results["env"] == {"id": "math", "kwargs": {"split": "test"}, "split": "test"}
    assert len(results["episodes"]) == 6 and {e["seed"] for e in results["episodes"]} == {1_000_000, 1_000_001,
                                                                                      1_000_002}
    assert set(results["overall"]["pass_at_k"]) == {"1", "2"}
    assert all(e["tokens"] <= 8 for e in results["episodes"])
    assert (out_dir / "report.html").stat().st_size > 10_000  # the viewer's export: uPlot and the data inline
    assert len((out_dir / "trajectories.jsonl").read_text().splitlines()) == 6


def test_eval_bad_input_gets_a_clear_message():
    from typer.testing import CliRunner

    from agentrl.cli.main import app

    runner = CliRunner()  # in-process: these fail before any model loads, so a subprocess each would be slow
    for args, message in [
        (("--env", "maths", "--model", "tiny-qwen3"), "Did you mean 'math'"),
        (("--env", "math", "--model", "tiny-qwen3", "--k", "1,x"), "'--k': expects comma-separated integers"),
        (("--env", "math", "--model", "tiny-qwen3", "--k", "4", "--samples-per-task", "2"), "pass@4 needs"),
        (("--env", "gui", "--model", "tiny-qwen3", "--split", "test"), "has no splits"),
        (("--env", "math",), "needs --env and --model"),
    ]:
        out = runner.invoke(app, ["eval", *args])
        assert out.exit_code == 2, (args, out.output)
        assert message in out.stderr, (args, out.stderr)
        assert out.exception is None or isinstance(out.exception, SystemExit), (args, out.exception)  # no traceback


def test_eval_through_the_ray_runner_pool(tmp_path):
    out_dir = tmp_path / "eval"
    out = agentrl("eval", "--env", "alfworld", "--model", "tiny-qwen3", "--episodes", "2", "--k", "1",
                  "--max-new-tokens", "6", "--max-turns", "2", "--runners", "2", "--output", str(out_dir))
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads((out_dir / "results.json").read_text())
    assert len(results["episodes"]) == 2 and all(e["turns"] == 2 for e in results["episodes"])
    assert results["env"]["split"] == "valid_unseen"


@pytest.mark.slow  # ~25 s; engine replicas as Ray actors run in the default run in tests/test_engine_workers.py
def test_eval_with_two_engine_replicas_as_ray_actors(tmp_path):
    """`--engines 2`: engine actors from `build_engines`, as `agentrl run --engines 2` builds them, in the RL loop.

    ``--engine hf`` keeps it short (two vLLM actors take three times as long here); the loop is the same for both.
    """
    out_dir = tmp_path / "eval"
    out = agentrl("eval", "--env", "math", "--model", "tiny-qwen3-h64", "--engine", "hf", "--engines", "2",
                  "--episodes", "4", "--k", "1", "--max-new-tokens", "8", "--output", str(out_dir))
    assert out.returncode == 0, out.stderr[-2000:]
    results = json.loads((out_dir / "results.json").read_text())
    assert results["engine"] == {"kind": "hf", "dtype": "model", "engines": 2}
    assert sorted(e["seed"] for e in results["episodes"]) == [1_000_000 + i for i in range(4)]
    assert all(e["turns"] == 1 and 1 <= e["tokens"] <= 8 for e in results["episodes"])


def test_eval_refuses_zero_engines():
    from typer.testing import CliRunner

    from agentrl.cli.main import app

    out = CliRunner().invoke(app, ["eval", "--env", "math", "--model", "tiny-qwen3", "--engines", "0"])
    assert out.exit_code == 2 and "engine.replicas must be >= 1" in out.stderr
