"""`agentrl run` with Ray runners, end to end in a subprocess: async rollouts and sync intervals.

Each run trains tiny-qwen3 on math for 3 steps with 2 Ray runners, as a user would type it, and checks what the run
folder says: 3 steps in metrics.jsonl, the staleness the mode promises, and a checkpoint. About 30 s each on 2 cores:
the async run is a default test, the sync-interval run is marked slow (``pytest -m slow``).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT

pytest.importorskip("ray")

COMMON = ["--env", "math", "--model", "tiny-qwen3", "--steps", "3", "--runners", "2", "--group-size", "2",
          "--prompts-per-step", "2", "--max-new-tokens", "8"]


def _run(out_dir, *mode: str) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "agentrl.cli", "run", *COMMON, *mode, "--output", str(out_dir)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["env_errors"] == 0 and r["dropped_groups"] == 0 for r in rows)
    assert json.loads((out_dir / "checkpoint" / "trainer_state.json").read_text())["step"] == 2
    assert (out_dir / "checkpoint" / "model.safetensors").exists()
    trajectories = [json.loads(line) for line in (out_dir / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajectories) == 3 * 2 * 2  # whole groups only, every step
    return rows


@pytest.mark.slow  # ~22 s; the async staleness bound runs in the default run with vLLM (tests/test_vllm.py)
def test_async_run_stays_within_max_staleness(tmp_path):
    rows = _run(tmp_path / "async", "--async", "--max-staleness", "1")
    assert all(r["staleness_max"] <= 1 for r in rows)
    assert rows[0]["staleness_max"] == 0  # step 0's rollout can only have used the initial weights
    # The guard's mismatch KL covers the fresh samples trained on: all of step 0's, none of a step whose samples
    # are all old (fresh samples without advantage are not trained on either, so a mixed step may have none).
    assert rows[0]["mismatch_kl_k3"] == pytest.approx(rows[0]["kl_k3"])
    assert all(r["mismatch_kl_k3"] is None for r in rows if r["staleness_mean"] == 1)


@pytest.mark.slow  # ~30 s; the same staleness pattern is checked in-process by test_sync_every_k_bounds_staleness
def test_sync_every_two_refreshes_weights_every_other_step(tmp_path):
    rows = _run(tmp_path / "sync2", "--sync-every", "2")
    # Weights sync at steps 0 and 2: step 1 trains on samples one version old, the others on fresh ones.
    assert [r["staleness_max"] for r in rows] == [0, 1, 0]
    assert [r["staleness_mean"] for r in rows] == [0, 1, 0]
    assert [r["mismatch_kl_k3"] is None for r in rows] == [False, True, False]
