"""FSDP2 trainer workers on CPU: 2 workers vs 1 (the baseline, measured in the same run).

For each model (``tiny-qwen3``: 9.8M parameters, most of them the 151k-token embedding; ``smollm2-135m``: 135M), one
batch of `--samples` sequences of `--tokens` tokens, `--micro` per micro-batch, goes through the pi_old pass, the
forward + backward and an AdamW step, `--steps` times, with 1 and with 2 workers (gloo). Reported:

* update equality: the largest weight difference between the 1- and 2-worker runs after all steps, and the
  relative difference of the gradient norms (float32 summation order is the only difference);
* step time: the median seconds of score + accumulate + step, and the ratio 2 workers / 1 worker;
* memory per worker: bytes of parameter shards, gradient shards, AdamW state (exact, from the tensors), activations
  kept for the backward of one micro-batch (every saved tensor that is not a weight, counted once per storage), and
  the process RSS and peak RSS.

Expect little or no speed-up on a 2-core machine (two workers share the cores the one worker already used, plus the
gloo traffic); what halves is the per-worker parameter, gradient and optimizer memory. Results go to
docs/results/fsdp_workers.json.

    python bench/micro/fsdp_workers.py [--models tiny-qwen3 smollm2-135m] [--steps 3] [--samples 8] [--tokens 128]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

import torch

from agentrl.cluster import start_ray
from agentrl.objective import policy_loss
from agentrl.records import Sample
from agentrl.training.backend import PolicyObjective, ScoreRequest, UpdateRequest
from agentrl.training.fsdp import FSDPBackend, WorkerSpec
from agentrl.training.microbatch import collate
from agentrl.training.placement import Placement, PlacementPlan

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, write_json  # noqa: E402


def make_batches(samples: int, tokens: int, micro: int, vocab: int) -> tuple[list, PolicyObjective]:
    """Random sequences: the first quarter is prompt, the rest carries loss; advantages of both signs."""
    g = torch.Generator().manual_seed(0)
    prompt = tokens // 4
    rows = [Sample(tuple(torch.randint(0, vocab, (tokens,), generator=g).tolist()),
                   (0,) * prompt + (1,) * (tokens - prompt), (0.0,) * prompt + (-5.0,) * (tokens - prompt),
                   float(i % 2) - 0.5, i // 2) for i in range(samples)]
    batches = [collate(rows[i : i + micro], 0) for i in range(0, samples, micro)]
    objective = PolicyObjective(functools.partial(policy_loss, "minirl"), samples,
                                sum(r.num_loss_tokens for r in rows))
    return batches, objective


def run(model: str, workers: int, steps: int, batches: list, objective: PolicyObjective) -> dict:
    placement = Placement(PlacementPlan(workers))
    t0 = time.perf_counter()
    backend = FSDPBackend(WorkerSpec(model, lr=1e-5), workers, placement)
    setup = time.perf_counter() - t0
    try:
        times, norms = [], []
        for _ in range(steps):
            t = time.perf_counter()
            old = backend.score([ScoreRequest(b) for b in batches])
            backend.accumulate([UpdateRequest(b, s.logp) for b, s in zip(batches, old)], objective)
            norms.append(backend.step(1.0))
            times.append(time.perf_counter() - t)
        probe = UpdateRequest(batches[0], torch.zeros_like(batches[0].loss_mask))
        memory = backend.memory(probe)
        weights = {k: v.clone() for k, v in backend.named_weights()}
    finally:
        backend.close()
        placement.close()
    return {"setup_s": setup, "step_s": times, "step_s_median": statistics.median(times), "grad_norms": norms,
            "memory": memory, "weights": weights}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny-qwen3", "smollm2-135m"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--micro", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "fsdp_workers.json")
    args = parser.parse_args()
    start_ray(num_cpus=4)
    report = {"args": {k: str(v) for k, v in vars(args).items()}, "models": {}}
    for model in args.models:
        batches, objective = make_batches(args.samples, args.tokens, args.micro, vocab=32000)
        one = run(model, 1, args.steps, batches, objective)
        two = run(model, 2, args.steps, batches, objective)
        max_diff = max(float((one["weights"][k] - two["weights"][k]).abs().max()) for k in one["weights"])
        norm_rel = max(abs(a - b) / abs(a) for a, b in zip(one["grad_norms"], two["grad_norms"]))
        params = one["memory"][0]["params"] // 4  # float32 shards of the one worker: tied weights counted once
        row = {
            "parameters": params, "max_weight_diff": max_diff, "grad_norm_rel_diff": norm_rel,
            "step_s_1_worker": one["step_s_median"], "step_s_2_workers": two["step_s_median"],
            "step_time_ratio_2_over_1": two["step_s_median"] / one["step_s_median"],
            "setup_s": {"1": one["setup_s"], "2": two["setup_s"]},
            "memory_per_worker_MB": {
                str(n): [{k: round(v / 2**20, 1) for k, v in m.items()} for m in r["memory"]]
                for n, r in ((1, one), (2, two))
            },
        }
        report["models"][model] = row
        print(f"{model}: {params / 1e6:.1f}M params | max weight diff {max_diff:.2e} | grad-norm rel diff "
              f"{norm_rel:.1e} | step {one['step_s_median']:.2f}s (1) vs {two['step_s_median']:.2f}s (2): "
              f"x{row['step_time_ratio_2_over_1']:.2f}")
        for n, mems in row["memory_per_worker_MB"].items():
            for rank, m in enumerate(mems):
                print(f"  {n} worker(s), rank {rank}: params {m['params']} MB, grads {m['grads']} MB, AdamW "
                      f"{m['optimizer']} MB, activations {m['activations']} MB (one micro-batch), RSS {m['rss']} MB, "
                      f"peak RSS {m['peak_rss']} MB")
    write_json(args.out, report)
    print(f"results in {args.out}")


if __name__ == "__main__":
    main()
