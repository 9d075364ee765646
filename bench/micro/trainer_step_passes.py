"""The passes of one training step: recompute pi_old vs the update's own log-probs, and samples without advantage.

One SmolLM2-135M training step through the single-process backend, as `agentrl.recipes.train` runs it, on `--samples`
random-token sequences of `--length` tokens whose last quarter carries loss (agent tokens in a multi-turn sample),
two samples per micro-batch, bfloat16 autocast (`--compute-dtype`). Three ways, alternating in one process
(`--repeats` each, the first dropped as warm-up), so the ratios are taken on the same machine state:

* ``recompute``: the pi_old pass (forward, no grad), then the update (forward + backward) and the AdamW step:
  ``loss.old_policy_pass: on``.
* ``fused``: the update alone, its detached log-probs standing for pi_old (``auto``, one mini-batch).
* ``fused_skip``: as ``fused`` with half the samples at advantage 0, which skip their passes
  (`agentrl.training.step.gradient_members`); the recompute path trains all of them.

Each way starts from the same weights and AdamW state, and the updated weights are compared with ``recompute``'s
(``fused`` must match to float noise; ``fused_skip`` too, since the zero-advantage samples add exactly nothing).
Results: docs/results/trainer_step_passes.json.

    python bench/micro/trainer_step_passes.py [--samples 4] [--length 2048] [--repeats 3]
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, load_1m, write_json  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compute-dtype", default="bfloat16")
    args = ap.parse_args()

    from agentrl.models import load_model
    from agentrl.objective import policy_loss
    from agentrl.records import Sample
    from agentrl.training.backend import PolicyObjective, ScoreRequest, UpdateRequest
    from agentrl.training.microbatch import collate
    from agentrl.training.single import SingleProcessBackend
    from agentrl.training.step import gradient_members

    policy = load_model(args.model)
    backend = SingleProcessBackend(policy, lr=1e-5, betas=(0.9, 0.999), weight_decay=0.0,
                                   compute_dtype=getattr(torch, args.compute_dtype))
    start_weights = copy.deepcopy(backend.model.state_dict())
    start_optim = copy.deepcopy(backend.optimizer.state_dict())
    vocab, n, length = policy.model.config.vocab_size, args.samples, args.length
    g = torch.Generator().manual_seed(0)
    agent = length // 4
    mask = (0,) * (length - agent) + (1,) * agent

    def batch(advantages: list[float]) -> list[Sample]:
        g.manual_seed(0)  # the same tokens every time
        return [Sample(tuple(torch.randint(0, vocab, (length,), generator=g).tolist()), mask,
                       tuple(-3.0 * m for m in mask), a, i // 2) for i, a in enumerate(advantages)]

    signed = [1.0 if i % 2 == 0 else -1.0 for i in range(n)]
    half_zero = [a if i < n // 2 else 0.0 for i, a in enumerate(signed)]

    def step(samples: list[Sample], recompute: bool, skip: bool) -> tuple[float, dict[str, torch.Tensor]]:
        backend.model.load_state_dict(start_weights)
        backend.optimizer.load_state_dict(start_optim)
        members = gradient_members(samples, list(range(n))) if skip else list(range(n))
        # As the loop does: without a pi_old pass the update computes the entropy the pass would have reported.
        objective = PolicyObjective(functools.partial(policy_loss, "minirl"), n,
                                    sum(s.num_loss_tokens for s in samples), with_entropy=not recompute)
        t0 = time.perf_counter()
        chunks = [members[i : i + 2] for i in range(0, len(members), 2)]
        batches = [collate([samples[i] for i in c], 0) for c in chunks]
        old = ([s.logp for s in backend.score([ScoreRequest(b) for b in batches])] if recompute
               else [None] * len(batches))
        backend.accumulate([UpdateRequest(b, o) for b, o in zip(batches, old)], objective)
        backend.step(1.0)
        seconds = time.perf_counter() - t0
        return seconds, {k: v.detach().clone() for k, v in backend.model.state_dict().items()}

    ways = {"recompute": (signed, True, False), "fused": (signed, False, False),
            "recompute_half_zero": (half_zero, True, False), "fused_skip": (half_zero, False, True)}
    times: dict[str, list[float]] = {k: [] for k in ways}
    weights: dict[str, dict[str, torch.Tensor]] = {}
    for r in range(args.repeats):
        for name, (advantages, recompute, skip) in ways.items():
            seconds, weights[name] = step(batch(advantages), recompute, skip)
            times[name].append(seconds)
            print(f"repeat {r} {name}: {seconds:.1f} s", flush=True)
    best = {k: min(v[1:] or v) for k, v in times.items()}

    def max_diff(a: str, b: str) -> float:
        return max(float((weights[a][k] - weights[b][k]).abs().max()) for k in weights[a])

    moved = max(float((weights["recompute"][k] - start_weights[k]).abs().max()) for k in start_weights)
    result = {
        "model": args.model, "samples": n, "length": length, "loss_tokens_per_sample": agent,
        "compute_dtype": args.compute_dtype, "cpus": os.cpu_count(), "load": load_1m(),
        "seconds": {k: round(v, 2) for k, v in best.items()},
        "speedup_fused": round(best["recompute"] / best["fused"], 2),
        "speedup_fused_skip_half": round(best["recompute_half_zero"] / best["fused_skip"], 2),
        "weights_moved_max": moved,
        "fused_vs_recompute_max_abs_diff": max_diff("fused", "recompute"),
        "skip_vs_recompute_max_abs_diff": max_diff("fused_skip", "recompute_half_zero"),
    }
    print(json.dumps(result, indent=1))
    write_json(RESULTS / "trainer_step_passes.json", result)


if __name__ == "__main__":
    main()
