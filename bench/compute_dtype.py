"""Trainer passes in float32 vs bfloat16 autocast (`trainer.compute_dtype`): tokens/s and how far log-probs move.

One SmolLM2-135M training pass (`token_logprobs` forward + backward of every position's log-prob, as the policy
loss runs it) over `--batch` random-token sequences of each `--lengths`, both precisions alternating in one process
(`--repeats` each, the first dropped as warm-up), so the ratio is taken on the same machine state. Also reported:
the largest and mean absolute difference of the bfloat16 log-probs from the float32 ones, and the cosine between the
two gradients. Results: docs/results/compute_dtype.json.

    python bench/compute_dtype.py [--lengths 1024 2048] [--batch 2] [--repeats 3]

Every position carries loss here, so the float32 LM head runs everywhere: multi-turn samples, where only the agent's
tokens carry loss, gain more (1.8x measured with the head left out).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


def one_pass(model, mb, compute_dtype) -> tuple[float, torch.Tensor, torch.Tensor]:
    """Seconds of a forward + backward, the log-probs and the flattened gradient."""
    from agentrl.training.logprobs import token_logprobs

    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    logp, _ = token_logprobs(model, mb, compute_dtype=compute_dtype)
    logp.sum().backward()
    seconds = time.perf_counter() - t0
    grad = torch.cat([p.grad.flatten().double() for p in model.parameters() if p.grad is not None])
    return seconds, logp.detach(), grad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from agentrl.models import load_model
    from agentrl.records import Sample
    from agentrl.training.microbatch import collate

    policy = load_model(args.model)
    model = policy.model.train()
    vocab = model.config.vocab_size
    rows = []
    for length in args.lengths:
        g = torch.Generator().manual_seed(length)
        samples = [Sample(tuple(torch.randint(0, vocab, (length,), generator=g).tolist()), (1,) * length,
                          (0.0,) * length, 0.0, i, 0) for i in range(args.batch)]
        mb = collate(samples, pad_id=0)
        times = {"float32": [], "bfloat16": []}
        out = {}
        for _ in range(args.repeats):
            for name, dtype in (("float32", None), ("bfloat16", torch.bfloat16)):
                seconds, logp, grad = one_pass(model, mb, dtype)
                times[name].append(seconds)
                out[name] = (logp, grad)
        tokens = args.batch * length
        best = {k: min(v[1:] or v) for k, v in times.items()}
        diff = (out["bfloat16"][0] - out["float32"][0]).abs()
        row = {"length": length, "batch": args.batch,
               "tok_per_s": {k: round(tokens / v, 1) for k, v in best.items()},
               "speedup_bf16": round(best["float32"] / best["bfloat16"], 2),
               "logp_abs_diff_max": round(float(diff.max()), 4), "logp_abs_diff_mean": round(float(diff.mean()), 5),
               "grad_cosine": round(float(torch.nn.functional.cosine_similarity(out["bfloat16"][1], out["float32"][1],
                                                                                dim=0)), 5),
               "load": os.getloadavg()[0]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "compute_dtype.json").write_text(json.dumps({"model": args.model, "cpus": os.cpu_count(),
                                                            "cpu_flags_bf16": _bf16_flags(), "rows": rows}, indent=1))


def _bf16_flags() -> list[str]:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return []
    return sorted({f for f in flags.split() if "bf16" in f or "amx" in f})


if __name__ == "__main__":
    main()
