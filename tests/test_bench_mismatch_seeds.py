"""bench/studies/mismatch_seeds.py --smoke (1 step per arm, two seeds) runs end to end in a subprocess and compares
the arms across runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "studies" / "mismatch_seeds.py"


@pytest.mark.slow
def test_smoke_runs_two_arms_on_two_seeds_and_compares_them_across_runs(tmp_path):
    out = tmp_path / "mismatch_seeds.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--arms", "minirl_tis@4", "minirl_nois@4",
                           "--runs", str(tmp_path / "runs"), "--out", str(out)],
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["steps"] == 1 and result["seeds"] == [0, 1]
    assert [(r["seed"], r["arm"]) for r in result["records"]] == [
        (0, "minirl_tis@4"), (0, "minirl_nois@4"), (1, "minirl_tis@4"), (1, "minirl_nois@4")]
    for r in result["records"]:
        assert r["steps_done"] == 1 and r["train_rc"] == 0 and r["eval_rc"] == 0
        assert len(r["per_step"]["mismatch_kl_k3"]) == 1
    comparison = result["vs_minirl_tis"]["minirl_nois@4 - minirl_tis@4"]
    assert comparison["seeds"] == [0, 1] and comparison["tasks"] == 4
    for level in ("paired_by_seed", "unpaired"):
        d = comparison[level]
        assert d["n"] == 2 and d["low"] <= d["estimate"] <= d["high"]
    assert out.with_suffix(".png").stat().st_size > 0
