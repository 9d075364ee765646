"""CLI smoke tests in a subprocess, as a user would type them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT


def agentrl(*args, timeout=600, **kw):
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=kw.get("cwd", ROOT))


def test_help_everywhere():
    for cmd in ([], ["envs"], ["envs", "list"], ["play"], ["run"]):
        out = agentrl(*cmd, "--help")
        assert out.returncode == 0, out.stderr
        assert "Usage" in out.stdout


def test_envs_list_shows_builtins():
    out = agentrl("envs", "list")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["id", "package", "description"]
    ids = {line.split()[0] for line in lines[1:]}
    assert {"math", "alfworld", "gui", "webshop"} <= ids
    math_line = next(line for line in lines if line.startswith("math"))
    assert "agentrl" in math_line and "cannot load" not in out.stdout


def test_play_expert_prints_transcript_and_result():
    out = agentrl("play", "--env", "math", "--expert", "--seed", "4")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1].startswith("reward=1 success=True")
    assert "\\boxed{" in out.stdout


def test_play_human_reads_actions_from_stdin():
    proc = subprocess.run([sys.executable, "-m", "agentrl.cli", "play", "--env", "math", "--seed", "1",
                           "--env-arg", "mode=multi", "--env-arg", "max_turns=2"],
                          input="no idea\n\\boxed{-12345}\n", capture_output=True, text=True, timeout=120)
    assert "reward=0 success=False steps=2" in proc.stdout.splitlines()[-1]


def test_play_unknown_env_lists_known_ids():
    out = agentrl("play", "--env", "nope")
    assert out.returncode != 0
    assert "unknown env 'nope'" in out.stderr and "math" in out.stderr
    assert "Traceback" not in out.stderr


def test_run_unknown_model_lists_builtins(tmp_path):
    out = agentrl("run", "--model", str(tmp_path / "no-such-model"), "--steps", "1", "--output", str(tmp_path / "r"))
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "smollm2-135m" in out.stderr and "tiny-qwen3" in out.stderr


def test_run_unknown_config_key_is_named(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("scheduler:\n  group_sise: 4\n")
    out = agentrl("run", "--config", str(cfg))
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "group_sise" in out.stderr and "group_size" in out.stderr


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("run") / "r"
    out = agentrl("run", "--env", "math", "--model", "tiny-qwen3", "--steps", "2", "--output", str(out_dir),
                  "--group-size", "2", "--prompts-per-step", "2", "--max-new-tokens", "8")
    assert out.returncode == 0, out.stderr[-3000:]
    return out_dir


REQUIRED = ["step", "reward_mean", "success_rate", "response_tokens_mean", "entropy", "kl_k3", "is_weight_mean",
            "is_weight_max", "clip_frac", "step_seconds"]


def test_run_writes_metrics_checkpoint_and_plot(tiny_run):
    rows = [json.loads(line) for line in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        for key in REQUIRED:
            assert key in r, key
        assert r["response_tokens_mean"] == 8  # a random model never stops early within 8 tokens
    ckpt = tiny_run / "checkpoint"
    assert (ckpt / "model.safetensors").exists() and (ckpt / "optimizer.pt").exists()
    assert json.loads((ckpt / "trainer_state.json").read_text())["step"] == 1
    assert (tiny_run / "curves.png").stat().st_size > 10_000
    assert len((tiny_run / "trajectories.jsonl").read_text().splitlines()) == 2 * 2 * 2


def test_resume_continues_for_a_third_step(tiny_run):
    import torch

    out = agentrl("run", "--resume", str(tiny_run), "--steps", "3")
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert json.loads((tiny_run / "checkpoint" / "trainer_state.json").read_text())["step"] == 2
    # The optimizer state was restored and stepped once more (weights moving is tested in test_train.py).
    state = torch.load(tiny_run / "checkpoint" / "optimizer.pt")["state"]
    assert {int(s["step"]) for s in state.values()} == {3}


def test_run_refuses_to_overwrite_an_existing_run(tiny_run):
    before = (tiny_run / "metrics.jsonl").read_text()
    out = agentrl("run", "--env", "math", "--model", "tiny-qwen3", "--steps", "1", "--output", str(tiny_run))
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "already holds a run" in out.stderr and "--resume" in out.stderr and "--overwrite" in out.stderr
    assert (tiny_run / "metrics.jsonl").read_text() == before
