"""bench/micro/engine_tuning.py: the prefill replay and the bound on hand-worked numbers, the run order, custom
variants, and (slow) the --smoke bench end to end in a subprocess."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "micro" / "engine_tuning.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("engine_tuning", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def episode(*turns, seconds=1.0):
    """A trajectory dict with (prompt ids, generated ids) turns."""
    return {"turns": [{"prompt_ids": list(p), "generated_ids": list(g), "generate_seconds": seconds} for p, g in turns]}


# Episode A: turn 0 prompt 1..10, reply 11 12 13; turn 1 extends it (prompt + reply + 14 15).
# Episode B: the same first prompt (same task, same group), another reply.
A = episode((range(1, 11), (11, 12, 13)), (list(range(1, 14)) + [14, 15], (16,)))
B = episode((range(1, 11), (11, 20, 21)))


def test_prefill_replay_hits_whole_cached_blocks_only(bench):
    # Block 4, replayed turn by turn (A0, B0, A1):
    # A0: nothing cached -> 10 prefilled; caches the blocks of prompt + reply but its last token (12 tokens): 3.
    # B0: 10-token prompt, 2 whole blocks before its last token, both cached -> 2 prefilled.
    # A1: 15-token prompt, (15 - 1) // 4 = 3 blocks may hit, all 3 cached (1-4, 5-8, 9-12) -> 3 prefilled.
    # Block 8: A0 10; B0 10 - 8 = 2; A1: 1 block may hit ((15 - 1) // 8), cached -> 7. Total 19.
    out = bench.prefill_what_if([A, B], (4, 8))
    assert out[4] == {"prompt_tokens": 35, "prefilled_tokens": 15, "hit_rate": round(1 - 15 / 35, 4)}
    assert out[8]["prefilled_tokens"] == 19


def test_prefill_replay_recomputes_a_prompt_that_is_cached_whole(bench):
    # The same 8-token prompt twice at block 4: the second may hit only (8 - 1) // 4 = 1 block -> 4 prefilled.
    twice = [episode((range(8), (9, 10))), episode((range(8), (9, 10)))]
    assert bench.prefill_what_if(twice, (4,))[4]["prefilled_tokens"] == 8 + 4


def test_rollout_shape_uses_littles_law_and_the_decode_contexts(bench):
    # Turns: A0 (10 prompt, 3 new), A1 (15, 1), B0 (10, 3); 1 s each in the engine over a 1.5 s rollout.
    shape = bench.rollout_shape([A, B], rollout_seconds=1.5)
    assert shape["generated_tokens"] == 7 and shape["turns"] == 3 and shape["episodes"] == 2
    assert shape["mean_requests_in_engine"] == 2.0
    # Contexts decoded at: 10, 11, 12 | 15 | 10, 11, 12 -> 81 / 7.
    assert shape["mean_decode_context"] == round(81 / 7, 1)


def test_decode_bound_is_batch_times_bandwidth_over_the_bytes_of_one_step(bench):
    geometry = {"weight_bytes": 1_000_000, "kv_bytes_per_token": 100}
    # 10 requests at context 1000: 1e6 + 10 * 1000 * 100 = 2e6 bytes a step; 10 tokens per 2e6 bytes at 1 GB/s.
    out = bench.decode_bound(geometry, batch=10, context=1000, triad_gbs=1.0, achieved=2500.0)
    assert out["step_bytes"] == 2_000_000 and out["bound_tok_per_s"] == 5000.0
    assert out["of_bound"] == 0.5 and out["kv_share_of_step_bytes"] == 0.5
    assert bench.decode_bound(geometry, batch=10, context=1000, triad_gbs=None, achieved=1.0) is None


def test_variants_interleave_and_custom_ones_split_flags_from_environment(bench):
    assert bench.schedule(["a", "b"], 2) == [(0, "a"), (0, "b"), (1, "a"), (1, "b")]
    v = bench.parse_custom("b32=--engine.vllm.block-size 32 OMP_NUM_THREADS=1 --engine.vllm.no-enforce-eager")
    assert v.name == "b32" and v.env == {"OMP_NUM_THREADS": "1"}
    assert v.flags == ("--engine.vllm.block-size", "32", "--engine.vllm.no-enforce-eager")
    with pytest.raises(ValueError, match="NAME="):
        bench.parse_custom("--engine.vllm.block-size 32")
    assert set(bench.DEFAULT_VARIANTS) <= set(bench.VARIANTS)
    assert bench.VARIANTS["baseline"].flags == () and bench.VARIANTS["baseline"].env == {}


def test_summary_takes_medians_and_ratios_against_the_first_variant(bench):
    runs = [{"variant": "a", "returncode": 0, "wall_s": 100.0, "tokens_per_s": 200.0},
            {"variant": "b", "returncode": 0, "wall_s": 80.0, "tokens_per_s": 250.0},
            {"variant": "b", "returncode": 1, "wall_s": 5.0}]
    out = bench.summarize(runs, ["a", "b"])
    assert out["b"]["runs"] == 1 and out["b"]["failed"] == 1 and out["b"]["wall_s"] == 80.0
    assert out["b"]["speedup_vs_a"]["wall_s"] == 1.25 and out["b"]["speedup_vs_a"]["tokens_per_s"] == 1.25


@pytest.mark.slow
def test_smoke_bench_runs_both_variants_and_writes_their_numbers(tmp_path):
    out, limits = tmp_path / "engine_tuning.json", tmp_path / "limits.json"
    limits.write_text(json.dumps({"bandwidth": {"triad_gbs": 20.0}}))
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out), "--limits", str(limits),
                           "--work", str(tmp_path / "runs")], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [(r["variant"], r["round"]) for r in result["runs"]] == [("baseline", 0), ("smoke_alt", 0)]
    for run in result["runs"]:
        assert run["returncode"] == 0, run.get("error")
        for key in ("wall_s", "step_seconds", "rollout_seconds", "tokens_per_s", "engine_tok_per_s",
                    "generated_tokens", "prefix_prompt_tokens", "mean_requests_in_engine", "mean_decode_context"):
            assert run[key] > 0, key
        assert run["plan"]["engine"] == "hf" and run["geometry"]["kv_bytes_per_token"] > 0
        assert run["decode_bound"]["bound_tok_per_s"] > 0 and run["decode_bound"]["of_bound"] > 0
        assert run["replay_check"]["replayed_prefilled"] <= run["prefix_prompt_tokens"]
        assert not (Path(run["run"]) / "checkpoint").exists()  # deleted once read
    assert result["runs"][1]["env"] == {"OMP_NUM_THREADS": "1"}
    assert result["runs"][1]["engine_config"]["batch_size"] == 2  # the variant's flag reached the run's config
    assert result["summary"]["smoke_alt"]["speedup_vs_baseline"]["wall_s"] > 0
