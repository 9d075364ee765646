"""HF engine vs vLLM engine (CPU build): generated tokens per second on the same prompts, in one run.

Two workloads, each at 8 and 32 concurrent episodes, in float32 and bfloat16:

* ``single``: 32 (`--prompts`) math prompts (chat-rendered first observations), one reply each. HF: batches of
  `concurrency` prompts (lockstep). vLLM: `concurrency` requests in flight, a new one submitted as each finishes.
* ``alfworld``: `concurrency` ALFWorld episodes of up to 10 turns through `run_rollout` (envs in the driver). HF:
  one batch per round of every waiting turn, each episode's KV cache kept across turns (prefix reuse, the
  default); vLLM: each turn its own request, prefix-cached. The vLLM rows also report the prefix-cache hit rate.

tok/s = generated tokens / wall seconds of the workload. The machine is shared: the load average is recorded before
and after every row, and ratios (vLLM / HF) are taken between rows of the same run. Results:
docs/results/engine_throughput.json.

    python bench/micro/engine_throughput.py [--model smollm2-135m] [--max-new-tokens 64] [--turns 10]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, load_1m, write_json  # noqa: E402


def single_prompts(tokenizer, n: int) -> list[list[int]]:
    import agentrl
    from agentrl.chat.context import ChatContext

    env = agentrl.make("math", level=1)
    prompts = []
    for seed in range(n):
        obs, _ = env.reset(seed=seed)
        prompts.append(ChatContext(tokenizer, env.system_prompt).first_prompt(obs))
    return prompts


def run_single(engine, prompts, concurrency: int, params) -> tuple[int, float]:
    """All prompts with at most `concurrency` in flight; returns (generated tokens, seconds)."""
    from agentrl.engine import EngineRequest

    t0 = time.perf_counter()
    tokens = 0
    todo = list(enumerate(prompts))
    in_flight = 0
    while todo or in_flight:
        while todo and in_flight < concurrency:
            i, p = todo.pop(0)
            engine.submit(EngineRequest(i, tuple(p), dataclasses.replace(params, seed=i)))
            in_flight += 1
        for result in engine.poll():
            tokens += len(result.generation.token_ids)
            in_flight -= 1
    return tokens, time.perf_counter() - t0


def run_alfworld(engine, tokenizer, concurrency: int, turns: int, params) -> tuple[int, float, int]:
    from agentrl.rollout.loop import run_rollout
    from agentrl.rollout.pool import EnvMaker, LocalPool

    pool = LocalPool(EnvMaker("alfworld"), slots=concurrency)
    try:
        result = run_rollout(pool, "alfworld", list(range(concurrency)), 1, engine, tokenizer, params,
                             max_turns=turns)
    finally:
        pool.close()
    steps = sum(len(t.turns) for t in result.trajectories)
    return result.stats.generated_tokens, result.stats.seconds, steps


def measure(rows: list[dict], name: str, engine, dtype: str, args, prompts, tok) -> None:
    """Every workload x concurrency with one engine; rows are written out as they come."""
    from agentrl.engine import SamplingParams

    for workload in args.workloads:
        for concurrency in args.concurrency:
            if name == "hf":
                engine.engine.batch_size = concurrency
            before = load_1m()
            engine.metrics()  # reset the counters
            if workload == "single":
                params = SamplingParams(max_new_tokens=args.max_new_tokens)
                tokens, seconds = run_single(engine, prompts, concurrency, params)
                steps = len(prompts)
            else:
                params = SamplingParams(max_new_tokens=args.alfworld_new_tokens, seed=0)
                tokens, seconds, steps = run_alfworld(engine, tok, concurrency, args.turns, params)
            row = {"engine": name, "dtype": dtype, "workload": workload, "concurrency": concurrency,
                   "tokens": tokens, "seconds": round(seconds, 2), "tok_per_s": round(tokens / seconds, 1),
                   "turns": steps, "load_before": before, "load_after": load_1m(),
                   **{k: round(v, 3) for k, v in engine.metrics().items() if k == "prefix_cache_hit_rate"}}
            rows.append(row)
            print(json.dumps(row), flush=True)
            write_json(RESULTS / "engine_throughput.json", {"model": args.model, "rows": rows})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--alfworld-new-tokens", type=int, default=32)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--workloads", nargs="+", default=["single", "alfworld"])
    ap.add_argument("--prompts", type=int, default=32, help="single-turn prompts")
    args = ap.parse_args()

    from agentrl.engine import HFEngine
    from agentrl.engine.factory import model_files, write_model_files
    from agentrl.engine.requests import BatchedRequests
    from agentrl.engine.vllm import VLLMEngine
    from agentrl.models import load_model

    policy = load_model(args.model)
    tok = policy.tokenizer
    prompts = single_prompts(tok, args.prompts)
    folder = write_model_files(model_files(policy))
    rows: list[dict] = []
    try:
        for dtype in args.dtypes:
            # HF rows first, then vLLM's: the vLLM CPU worker binds the process's OpenMP threads when it starts,
            # which would slow an HF engine measured after it in the same process.
            hf = BatchedRequests(HFEngine(policy.model, tok, batch_size=max(args.concurrency),
                                          dtype=getattr(torch, dtype)))
            measure(rows, "hf", hf, dtype, args, prompts, tok)
            del hf
            vllm = VLLMEngine(folder, dtype=dtype, max_model_len=8192, kv_cache_gib=1.0)
            measure(rows, "vllm", vllm, dtype, args, prompts, tok)
            vllm.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    ratios = {}
    for r in rows:
        if r["engine"] == "vllm":
            hf = next(h for h in rows if h["engine"] == "hf" and all(h[k] == r[k] for k in
                                                                        ("dtype", "workload", "concurrency")))
            ratios[f"{r['workload']}/{r['dtype']}/c{r['concurrency']}"] = round(r["tok_per_s"] / hf["tok_per_s"], 2)
    print(json.dumps({"vllm_over_hf": ratios}, indent=1))
    write_json(RESULTS / "engine_throughput.json",
               {"model": args.model, "cpus": os.cpu_count(), "rows": rows, "vllm_over_hf": ratios})


if __name__ == "__main__":
    main()
