"""A confirmatory test of SFT+RL against SFT on fresh held-out tasks, with its size fixed before it runs.

    python bench/studies/confirm_rl_gain.py --run runs/learn_multiturn_v3/alfworld --episodes 384 \
        --seed-offset 2000000 --engine vllm --engine-dtype bfloat16 --results docs/results/confirm_alfworld_v3.json

`learn_multiturn.py` trains and compares on one set of held-out tasks. When that comparison comes out
"positive, not significant", evaluating more tasks until the interval clears zero is optional stopping: the
false-positive rate is no longer 5%. This script is the clean second look: both checkpoints of a finished
`learn_multiturn` run (``<run>/sft/checkpoint`` and ``<run>/rl/checkpoint``), evaluated on task seeds neither
training nor any earlier eval used, with the number of tasks, the sampler seed and the test chosen up front
(the command line, recorded in the result), and one answer: the paired bootstrap 95% interval of the success
difference, significant when it excludes zero. No second look is taken inside the script.

Both evals use the run's own env arguments, turn and token budgets (``<run>/sft.yaml``, ``<run>/rl.yaml``), the
model's official sampling settings and sampler seed 0, as `learn_multiturn.py` does. The mean-reward difference
(the graded score, for envs such as WebShop) is reported beside it: a t interval on the per-task differences.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from learn_multiturn import eval_command  # noqa: E402  (a sibling script, not a package)

from bench.harness import ROOT, run_phase, write_json  # noqa: E402


def main() -> None:
    from agentrl.passk import bootstrap_pass_at_k_difference, mean_interval, task_counts
    from agentrl.recipes.evaluate import load_results

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", required=True, help="a learn_multiturn env folder (sft/, rl/, sft.yaml, rl.yaml)")
    parser.add_argument("--episodes", type=int, required=True, help="held-out tasks, fixed before the run")
    parser.add_argument("--seed-offset", type=int, required=True, help="first task seed: seeds no eval used")
    parser.add_argument("--engine", default="", help="hf or vllm (default: auto)")
    parser.add_argument("--engine-dtype", default="")
    parser.add_argument("--eval-seconds", type=float, default=3600)
    parser.add_argument("--results", required=True)
    args = parser.parse_args()

    run = Path(args.run).resolve()
    sft_cfg = yaml.safe_load((run / "sft.yaml").read_text())
    rl_cfg = yaml.safe_load((run / "rl.yaml").read_text())
    env_id = sft_cfg["env"]["id"]
    common = [*eval_command(sft_cfg, rl_cfg, args.episodes, args.engine, args.engine_dtype),
              "--seed-offset", str(args.seed_offset)]

    report: dict = {"args": vars(args), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "env": env_id, "phases": {}}
    evals = {}
    for label in ("sft", "rl"):
        out = run / f"confirm_{args.seed_offset}_{label}"
        report["phases"][label] = run_phase(f"eval {label}", [*common, "--model", str(run / label / "checkpoint"),
                                                               "--output", str(out)],
                                            args.eval_seconds, run / f"confirm_{args.seed_offset}_{label}.log")
        if report["phases"][label]["rc"] != 0:
            sys.exit(f"eval {label} failed: see {report['phases'][label]['log']}")
        evals[label] = load_results(out)

    rl, sft = evals["rl"]["episodes"], evals["sft"]["episodes"]
    if [r["seed"] for r in rl] != [r["seed"] for r in sft]:
        sys.exit("the two evals played different tasks: no paired comparison possible")
    success = bootstrap_pass_at_k_difference(task_counts(rl), task_counts(sft), 1, paired=True)
    report["success"] = {label: evals[label]["overall"]["success_rate"] for label in ("sft", "rl")}
    report["reward_mean"] = {label: evals[label]["overall"]["reward_mean"] for label in ("sft", "rl")}
    report["rl_minus_sft_success"] = success.to_dict() | {"significant": success.excludes_zero}
    # Paired: the per-task differences, with a t interval on their mean.
    reward = mean_interval([a["reward"] - b["reward"] for a, b in zip(rl, sft)])
    report["rl_minus_sft_reward"] = reward.to_dict() | {"significant": reward.excludes_zero}
    write_json(Path(args.results), report)
    for label in ("sft", "rl"):
        s = report["success"][label]
        print(f"  {label:4s} success {s['estimate']:.3f} [{s['low']:.3f}, {s['high']:.3f}]  "
              f"reward {report['reward_mean'][label]['estimate']:.3f}")
    d = report["rl_minus_sft_success"]
    print(f"  RL - SFT success {d['estimate']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] n={d['n']}"
          f"  {'significant' if d['significant'] else 'not significant'}")
    print(f"  results in {args.results}  (root {ROOT})")


if __name__ == "__main__":
    main()
