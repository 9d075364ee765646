"""Does RL make the model better? Train on math, then evaluate the base model and the trained checkpoint on the same
held-out tasks (test split, seeds disjoint from training) at the same sampling settings.

    python bench/studies/learn_math.py                               # SmolLM2-135M, configs/math-smollm2.yaml
    python bench/studies/learn_math.py --steps 12 --eval-episodes 64
    python bench/studies/learn_math.py --skip-train --run runs/math-smollm2   # only evaluate an existing run

Prints the training curve (success per step), the step and wall times, and base vs trained success with 95%
intervals; writes docs/results/learn_math.json and the run's curves.png.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from agentrl.config import apply_overrides, load_config
from agentrl.recipes.evaluate import EvalConfig, eval_env, evaluate
from agentrl.recipes.train import train

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, ROOT, read_jsonl, write_json  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "math-smollm2.yaml"))
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--run", default=None, help="run folder (default: the config's output)")
    parser.add_argument("--eval-episodes", type=int, default=64)
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--overwrite", action="store_true", help="replace a run already in the run folder")
    args = parser.parse_args()

    cfg = load_config(args.config)
    cfg = apply_overrides(cfg, {"steps": args.steps, "output": args.run})
    run = Path(cfg.output)
    t0 = time.perf_counter()
    if not args.skip_train:
        train(cfg, overwrite=args.overwrite)
    train_wall = time.perf_counter() - t0
    rows = read_jsonl(run / "metrics.jsonl")

    # Same tasks, same sampler seed, the training temperature (1.0) for both: only the weights differ.
    env = eval_env(cfg.env.id, cfg.env.kwargs, max_turns=cfg.env.max_turns)
    common = dict(env=env, episodes=args.eval_episodes, ks=(1,), max_new_tokens=cfg.sampling.max_new_tokens,
                  sampling_overrides={"temperature": cfg.sampling.temperature, "top_p": 1.0, "top_k": 0})
    results = {}
    for label, model in (("base", cfg.model), ("trained", str(run / "checkpoint"))):
        res = evaluate(EvalConfig(model=model, output=str(run / f"eval_{label}"), **common), progress=True)
        results[label] = res["overall"]["success_rate"]

    print("\nstep  success  reward  entropy  kl_k3     step_s")
    for r in rows:
        print(f"{r['step']:>4}  {r['success_rate']:.3f}    {r['reward_mean']:.3f}   {r['entropy']:.3f}    "
              f"{r['kl_k3'] or 0:.1e}  {r['step_seconds']:.0f}")
    base, trained = results["base"], results["trained"]
    ratio = trained["estimate"] / max(base["estimate"], 1e-9)
    print(f"\nheld-out success ({args.eval_episodes} tasks): base {base['estimate']:.3f} "
          f"[{base['low']:.3f}, {base['high']:.3f}], trained {trained['estimate']:.3f} "
          f"[{trained['low']:.3f}, {trained['high']:.3f}]; ratio {ratio:.2f}")
    step_s = [r["step_seconds"] for r in rows]
    median = sorted(step_s)[len(step_s) // 2]
    print(f"steps {len(rows)}, step time median {median:.0f} s, train wall {train_wall:.0f} s")
    write_json(RESULTS / "learn_math.json", {"curve": rows, "eval": results, "train_wall_s": train_wall}, default=str)


if __name__ == "__main__":
    main()
