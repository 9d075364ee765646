"""bench/micro/limits.py --smoke runs end to end in a subprocess and writes every part's numbers, all positive."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "micro" / "limits.py"


@pytest.mark.slow
def test_limits_smoke_writes_every_part(tmp_path):
    out = tmp_path / "limits.json"
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out), "--cache-dir",
                           str(tmp_path / "cache")], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert {"cpu", "peaks", "bandwidth", "trainer", "engine"} <= set(result)
    assert isinstance(result["cpu"]["avx512_bf16"], bool) and result["cpu"]["capability"]

    for dtype in ("float32", "bfloat16"):
        assert result["peaks"]["square"][dtype]["best_gflops"] > 0
        shapes = result["peaks"]["model_shapes"][dtype]
        assert shapes["pass_gflops"] > 0 and shapes["forward_gflops"] > 0
        assert {"q_proj", "down_proj", "lm_head"} <= set(shapes["gflops"])
    assert result["bandwidth"]["copy_gbs"] > 0 and result["bandwidth"]["triad_gbs"] > 0

    trainer = result["trainer"]
    assert trainer["samples_from"]["episodes"] > 0 and trainer["flop_params"]["N"] > 0
    modes = {label.split("/")[0] for label in trainer["variants"]}  # "float32" or "float32/packing=on"
    assert {"float32", "bfloat16"} <= modes
    for row in trainer["variants"].values():
        for part in ("score", "update"):
            rates = row[part]
            assert rates["tokens_real"] > 0 and rates["tokens_padded"] >= rates["tokens_real"]
            assert rates["tok_per_s_real"] > 0 and rates["gflops_6nt"] > 0
            assert rates["mfu_square"] > 0 and rates["mfu_model_shapes"] > 0
        assert row["speedup_vs_float32"]["update"] > 0

    engine = result["engine"]
    assert engine["kind"] == "hf"
    for key in ("prefill_tok_per_s", "decode_tok_per_s", "bound_tok_per_s", "of_bound", "weight_bytes"):
        assert engine[key] > 0, key
    # The drawn samples are cached for the next run (one rollout, one file).
    assert len(list((tmp_path / "cache").glob("limits-*.jsonl"))) == 1
