"""bench/studies/collapse_study.py: the degraded summary on a hand-made curve, which runs enter the comparison (exit
codes, the guard's line), each arm's command, and (slow) the --smoke mode end to end in a subprocess."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "studies" / "collapse_study.py"
GUARD_LINE = "error: collapse guard stopped the run at step 11: entropy 0.01 < 0.05 for 3 steps"


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location("collapse_study", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_degraded_summary_finds_the_peak_of_the_moving_mean_and_the_drop(study):
    # 3-step means: .4 .6 .7 .6 .3667 .1667 .1333 -> peak .7 over steps 2-4; the last 5 steps: .7 .3 .1 .1 .2 -> .28
    per_step = {"success_rate": [0.2, 0.4, 0.6, 0.8, 0.7, 0.3, 0.1, 0.1, 0.2],
                "entropy": [0.9, 0.8, None, 0.5, 0.3, 0.2, 0.04, 0.05, 0.06],
                "grad_norm": [1.0, 2.0, 1.5, 3.0, 9.5, 4.0, 2.0, 1.0, 1.0],
                "kl_k3": [0.001, None, 0.004, 0.02, 0.3, 0.1, None, 0.0, 0.0]}
    d = study.degraded(per_step)
    assert d["train_success_peak_moving_mean"] == pytest.approx(0.7)
    assert d["train_success_peak_window_start"] == 2
    assert d["train_success_last_steps_mean"] == pytest.approx(0.28)
    assert d["train_success_drop"] == pytest.approx(0.42)
    assert (d["entropy_min"], d["grad_norm_max"], d["kl_k3_max"]) == (0.04, 9.5, 0.3)


def test_degraded_summary_of_a_run_shorter_than_the_window_and_of_none(study):
    d = study.degraded({"success_rate": [0.25, 0.5], "entropy": [1.0, 0.9], "grad_norm": [1.0, 2.0],
                        "kl_k3": [None, None]})
    assert d["train_success_peak_moving_mean"] == d["train_success_last_steps_mean"] == pytest.approx(0.375)
    assert d["train_success_drop"] == 0.0 and d["kl_k3_max"] is None  # one window: no drop; no step measured KL
    assert set(study.degraded({"success_rate": []}).values()) == {None}  # a run that failed before its first step


def test_guard_stop_line_is_the_last_line_naming_the_guard(study):
    log = f"step 10 | success 0.1\n{GUARD_LINE} \nrun saved\n"
    assert study.guard_stop_line(log) == GUARD_LINE
    assert study.guard_stop_line("step 1\nTraceback: boom\n") is None


def record(arm, seed, *, rc, steps_done=3, checkpoint=2, guard=None, heldout=True, eval_rc=0):
    r = {"arm": arm, "seed": seed, "train_rc": rc, "steps_done": steps_done, "guard_stop": guard,
         "guard_stopped": bool(guard)}
    if checkpoint is not None:
        r["checkpoint_step"] = checkpoint
    if heldout:
        r |= {"heldout": {"estimate": 0.5, "low": 0.4, "high": 0.6}, "eval_rc": eval_rc}
    return r


def test_finished_and_guard_stopped_runs_are_compared_and_crashes_are_not(study):
    runs = {
        "finished": record("nois", 0, rc=0),
        "guard stopped, evaluated at its last checkpoint": record("tis_guard", 0, rc=1, steps_done=2, checkpoint=0,
                                                                  guard=GUARD_LINE),
        "crashed": record("tis", 0, rc=1, steps_done=2, checkpoint=0),
        "guard stopped before any checkpoint": record("tis_guard", 1, rc=1, steps_done=1, checkpoint=None,
                                                      guard=GUARD_LINE, heldout=False),
        "exit 0 but short of its steps": record("nois", 1, rc=0, steps_done=2, checkpoint=1),
        "eval failed": record("tis", 1, rc=0, heldout=False),
        "eval exited nonzero": record("nois", 2, rc=0, eval_rc=1),
        "killed by a signal": record("tis", 2, rc=-9, steps_done=2, checkpoint=0),
    }
    compared = {name for name, r in runs.items() if study.is_compared(r, steps=3)}
    assert compared == {"finished", "guard stopped, evaluated at its last checkpoint"}
    records = [r | {"compared": study.is_compared(r, steps=3)} for r in runs.values()]
    left_out = study.not_compared(records)
    assert [(r["seed"], r["arm"], r["train_rc"]) for r in left_out] == [
        (0, "tis", 1), (1, "tis_guard", 1), (1, "nois", 0), (1, "tis", 0), (2, "nois", 0), (2, "tis", -9)]
    assert left_out[1]["guard_stop"] == GUARD_LINE and left_out[1]["checkpoint_step"] is None


def test_each_arm_adds_its_own_flags_to_the_shared_settings(study):
    args = argparse.Namespace(steps=30, model=None, engine="vllm", engine_dtype=None, lr=2e-4, sync_every=8,
                              minibatches=4)
    cmds = {arm: study.train_command(arm, 1, args, Path("RUN")) for arm in study.ARMS}
    for cmd in cmds.values():
        line = " ".join(cmd)
        assert "run --env math --seed 1 --steps 30 --engine vllm --engine-dtype bfloat16 --lr 0.0002" in line
        assert "--sync-every 8 --optim.n-minibatches 4" in line and "--model" not in cmd
    assert "{correction: none}" in cmds["nois"] and "--guard.no-enabled" in cmds["nois"]
    assert "--loss.options" not in cmds["tis"] and "--guard.no-enabled" in cmds["tis"]
    assert "--loss.options" not in cmds["tis_guard"] and "--guard.no-enabled" not in cmds["tis_guard"]
    small = study.train_command("tis", 0, argparse.Namespace(**vars(args) | {"model": "tiny-qwen3", "engine": "hf"}),
                                Path("RUN"))
    assert small[small.index("--model") + 1] == "tiny-qwen3" and "--engine-dtype" not in small


@pytest.mark.slow
def test_smoke_runs_the_three_arms_and_compares_them(tmp_path):
    out = tmp_path / "collapse_study.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--model", "tiny-qwen3", "--engine", "hf",
                           "--runs", str(tmp_path / "runs"), "--out", str(out)],
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["steps"] == 2 and result["seeds"] == [0] and result["sync_every"] == 8
    assert [(r["seed"], r["arm"]) for r in result["records"]] == [(0, "nois"), (0, "tis"), (0, "tis_guard")]
    for r in result["records"]:
        assert r["steps_done"] == 2 and r["train_rc"] == 0 and r["eval_rc"] == 0 and r["guard_stop"] is None
        assert r["compared"] and not r["guard_stopped"] and r["checkpoint_step"] == 1
        assert set(r["per_step"]) == set(_per_step_keys()) and len(r["per_step"]["entropy"]) == 2
        assert r["degraded"]["train_success_drop"] is not None
    assert result["not_compared"] == []
    assert set(result["vs"]) == {"tis - nois", "tis_guard - nois", "tis_guard - tis"}
    for comparison in result["vs"].values():
        assert comparison["seeds"] == [0] and comparison["tasks"] == 4
        d = comparison["paired_by_seed"]
        assert d["n"] == 1 and d["low"] <= d["estimate"] <= d["high"]
    assert out.with_suffix(".png").stat().st_size > 0


def _per_step_keys():
    return ("success_rate", "reward_mean", "entropy", "grad_norm", "kl_k3", "mismatch_kl_k3", "is_weight_max",
            "correction_truncated_frac", "clip_frac", "ppo_kl", "ratio_max", "response_tokens_mean", "step_seconds")
