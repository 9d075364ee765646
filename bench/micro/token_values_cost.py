"""What the per-token record (token_values.jsonl, `token_values_per_step`) costs: seconds per step and bytes on disk.

Two measurements:

* ``run``: a real `agentrl run` (default SmolLM2-135M on the math env, two steps) with the recording wrapped in a
  timer: the seconds it adds to each step next to the step's own, and the bytes of each recorded sample.
* ``shapes``: bytes per recorded sample at the main jobs' shapes, serialised by the real writer: a token's bytes
  depend on whether it carries loss (six values) or not (nulls), so the per-token costs of the run's own lines
  (each array entry and its comma) are applied to a math sample (~250 tokens, 150 generated) and a WebShop sample
  (~3k tokens, about one in eight generated), then scaled to 1,000 steps at the default (2 samples a step).

    python bench/micro/token_values_cost.py [--model smollm2-135m] [--env math] [--max-new-tokens 192] [--steps 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import agentrl.recipes.train as train_recipe
from agentrl.config import RunConfig, apply_overrides
from agentrl.training.token_values import TOKEN_VALUES

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import read_jsonl  # noqa: E402


def main() -> None:
    """Run the measurement and print one JSON object."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--env", default="math")
    parser.add_argument("--max-new-tokens", type=int, default=192)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--per-step", type=int, default=2)
    args = parser.parse_args()

    seconds: list[float] = []
    record = train_recipe.record_token_values

    def timed(*a, **k):
        start = time.perf_counter()
        out = record(*a, **k)
        seconds.append(time.perf_counter() - start)
        return out

    train_recipe.record_token_values = timed
    out = Path(tempfile.mkdtemp()) / "run"
    cfg = apply_overrides(RunConfig(), {
        "model": args.model, "env.id": args.env, "steps": args.steps, "output": str(out),
        "scheduler.prompts_per_step": 2, "scheduler.group_size": 4, "sampling.max_new_tokens": args.max_new_tokens,
        "guard.enabled": False, "token_values_per_step": args.per_step,
    })  # fmt: skip
    train_recipe.train(cfg, progress=False)
    steps = read_jsonl(out / "metrics.jsonl")
    lines = (out / TOKEN_VALUES).read_text().splitlines()
    loss_tokens = sum(sum(json.loads(line)["loss_mask"]) for line in lines)
    tokens = sum(len(json.loads(line)["token_ids"]) for line in lines)
    total = sum(len(line) + 1 for line in lines)
    per_loss, per_other = _per_token_bytes([json.loads(line) for line in lines])
    math_sample = 100 * per_other + 150 * per_loss  # ~250 tokens: the prompt, then the solution
    webshop_sample = 2600 * per_other + 400 * per_loss  # ~3k tokens, 1 in 8 generated (actions and thinking)
    print(json.dumps({
        "model": args.model, "env": args.env, "steps": len(steps),
        "step_seconds": [round(s["step_seconds"], 2) for s in steps],
        "record_seconds": [round(s, 3) for s in seconds],
        "overhead_frac": round(sum(seconds) / sum(s["step_seconds"] for s in steps), 4),
        "samples_per_step": [s["samples"] for s in steps],
        "recorded_lines": len(lines), "tokens_per_line": round(tokens / len(lines), 1),
        "loss_tokens_per_line": round(loss_tokens / len(lines), 1), "bytes_per_line": round(total / len(lines)),
        "bytes_per_loss_token": round(per_loss, 1), "bytes_per_other_token": round(per_other, 1),
        "math_sample_bytes": round(math_sample), "webshop_sample_bytes": round(webshop_sample),
        "math_1000_steps_mb": round(math_sample * 2 * 1000 / 1e6, 1),
        "webshop_1000_steps_mb": round(webshop_sample * 2 * 1000 / 1e6, 1),
    }, indent=1))


def _per_token_bytes(records: list[dict]) -> tuple[float, float]:
    """Mean bytes a loss token and another token take in the lines (each array entry and its comma)."""
    sizes: dict[bool, list[int]] = {True: [], False: []}
    for d in records:
        arrays = [v for v in d.values() if isinstance(v, list)]
        for t, m in enumerate(d["loss_mask"]):
            sizes[m == 1].append(sum(len(json.dumps(a[t], separators=(",", ":"))) + 1 for a in arrays))
    return sum(sizes[True]) / len(sizes[True]), sum(sizes[False]) / len(sizes[False])


if __name__ == "__main__":
    main()
