"""bench/studies/routing_replay_run.py: its task (bench/studies/token_band_env.py), and its smoke mode (2 steps per
arm, seed 0) end to end in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import agentrl

STUDIES = Path(__file__).resolve().parents[1] / "bench" / "studies"
SCRIPT = STUDIES / "routing_replay_run.py"


def test_token_band_env_scores_the_share_of_lower_half_tokens():
    env = agentrl.make(f"{STUDIES / 'token_band_env.py'}:TokenBandEnv")  # named by file, as the study names it
    prompt, _ = env.reset(seed=7)
    assert env.reset(seed=7)[0] == prompt and env.reset(seed=8)[0] != prompt  # the prompt is the seed's
    _, reward, terminated, _, info = env.step(env.expert_action())
    assert reward == 1.0 and terminated and info["success"]
    env.reset(seed=7)
    assert env.step("")[1:3] == (0.0, True)  # an empty reply never pays
    env.reset(seed=7)
    _, reward, _, _, info = env.step(" the 新闻")  # " the" (id 279) is in the band; the Chinese word is not
    assert 0 < reward < 1 and not info["success"]


@pytest.mark.slow
def test_smoke_runs_the_three_arms_and_compares_them(tmp_path):
    out = tmp_path / "routing_replay_run.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--runs", str(tmp_path / "runs"), "--out", str(out)],
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["steps"] == 2 and result["seeds"] == [0] and result["sync_every"] == 4
    assert [(r["seed"], r["arm"]) for r in result["records"]] == [(0, "none"), (0, "r2"), (0, "r3")]
    for r in result["records"]:
        assert r["steps_done"] == 2 and r["train_rc"] == 0 and r["eval_rc"] == 0 and r["guard_stop"] is None
        steps = r["per_step"]
        assert steps["staleness_mean"] == [0.0, 1.0]  # sync_every 4: the second step trains on stale samples
        assert steps["mismatch_kl_k3"][0] is not None and steps["mismatch_kl_k3"][1] is None  # fresh samples only
        assert all(0 <= v <= 1 for v in steps["reward_mean"]) and all(v > 0 for v in steps["grad_norm"])
        if r["arm"] == "r3":
            assert steps["router_agreement"] == [None, None]  # its passes replay the engine's experts
        else:  # the engine and the trainer hold the same weights at step 0: the same experts, up to near-ties
            assert 0.9 <= steps["router_agreement"][0] <= 1.0
        assert r["heldout"]["reward_mean"]["n"] == 4 and r["heldout"]["sampling"]["temperature"] == 1.0
    assert set(result["summary"]) == {"none", "r2", "r3"}
    assert set(result["vs"]) == {"r2 - none", "r3 - none", "r3 - r2"}
    for comparison in result["vs"].values():
        assert comparison["seeds"] == [0] and comparison["tasks"] == 4
        for level in ("paired_by_seed", "unpaired"):
            d = comparison[level]
            assert d["n"] == 1 and d["low"] <= d["estimate"] <= d["high"]
    assert out.with_suffix(".png").stat().st_size > 0
