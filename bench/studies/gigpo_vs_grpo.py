"""GiGPO vs GRPO from the same SFT checkpoint (issue 32 item 2): step-level against episode-level advantages.

    python bench/studies/gigpo_vs_grpo.py --env gui                  # the declared run (docs/experiments/issue32.md)
    python bench/studies/gigpo_vs_grpo.py --env gui --steps 1 --episodes 8 --work runs/gigpo_smoke    # a smoke test

One SFT checkpoint (``configs/<env>-sft.yaml``, trained once into ``<work>/sft`` unless it is there), then two RL runs
from it with ``configs/<env>-rl.yaml``, the same run seed, steps, tasks and engine, that differ only in the advantage:

- ``gigpo``: the recipe's GiGPO, A = A_E + A_S with the episode part (R - mean) / std over the task's group and the
  step part over anchor states (gamma 0.95, step weight 1);
- ``grpo``: ``advantage.name grpo``, the same episode part alone, (R - mean) / std: GiGPO without its step groups.

Both checkpoints are evaluated on the same held-out tasks (``--seed-offset``: seeds no earlier eval used), the model's
official sampling settings and sampler seed 0; the answer is the paired bootstrap 95% interval of GiGPO minus GRPO
success (and a t interval on the mean reward). Writes docs/results/gigpo_vs_grpo_<env>.json and .png.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from learn_multiturn import add_arm_study_arguments, eval_command, evaluate_arm, sft_once, train_arm  # noqa: E402

from bench.harness import RESULTS, ROOT, command_line, write_json  # noqa: E402

ARMS = {"gigpo": [], "grpo": ["--advantage.name", "grpo"]}


def main() -> None:
    from agentrl.passk import bootstrap_pass_at_k_difference, mean_interval, task_counts

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env", default="gui")
    add_arm_study_arguments(parser)
    args = parser.parse_args()
    work = Path(args.work or ROOT / "runs" / f"gigpo_vs_grpo_{args.env}").resolve()
    results = Path(args.results or RESULTS / f"gigpo_vs_grpo_{args.env}.json")
    work.mkdir(parents=True, exist_ok=True)
    sft_cfg = yaml.safe_load((ROOT / "configs" / f"{args.env}-sft.yaml").read_text())
    rl_cfg = yaml.safe_load((ROOT / "configs" / f"{args.env}-rl.yaml").read_text())
    report: dict = {"command": command_line(__file__), "args": vars(args),
                    "started": time.strftime("%Y-%m-%d %H:%M:%S"), "phases": {}, "per_step": {}}
    sft_dir = work / "sft"
    if sft := sft_once(args.env, work):
        report["phases"]["sft"] = sft
    (work / "rl.yaml").write_text(yaml.safe_dump(rl_cfg | {"model": str(sft_dir / "checkpoint")}))
    common = [*eval_command(sft_cfg, rl_cfg, args.episodes, args.engine, args.engine_dtype),
              "--seed-offset", str(args.seed_offset)]
    evals = {}
    for arm, flags in ARMS.items():
        train_arm(work, arm, flags, args, report)
        evals[arm] = evaluate_arm(arm, work / arm / "checkpoint", common, work, report)
        write_json(results, report)
    g, r = evals["gigpo"]["episodes"], evals["grpo"]["episodes"]
    if [e["seed"] for e in g] != [e["seed"] for e in r]:
        sys.exit("the two evals played different tasks: no paired comparison possible")
    d = bootstrap_pass_at_k_difference(task_counts(g), task_counts(r), 1, paired=True)
    report["success"] = {arm: evals[arm]["overall"]["success_rate"] for arm in ARMS}
    report["reward_mean"] = {arm: evals[arm]["overall"]["reward_mean"] for arm in ARMS}
    report["gigpo_minus_grpo_success"] = d.to_dict() | {"significant": d.excludes_zero}
    reward = mean_interval([a["reward"] - b["reward"] for a, b in zip(g, r)])
    report["gigpo_minus_grpo_reward"] = reward.to_dict() | {"significant": reward.excludes_zero}
    by_type: dict = {}
    for arm in ARMS:  # success per task type where the env records one (the phone GUI does)
        for e in evals[arm]["episodes"]:
            by_type.setdefault(e["task_type"], {}).setdefault(arm, []).append(bool(e.get("success")))
    report["by_task_type"] = {t: {arm: [sum(v), len(v)] for arm, v in arms.items()} for t, arms in by_type.items()}
    report["work"] = str(work.relative_to(ROOT)) if work.is_relative_to(ROOT) else work.name
    write_json(results, report)
    plot(report, results.with_suffix(".png"))
    print(json.dumps({k: report[k] for k in ("success", "gigpo_minus_grpo_success", "by_task_type")}, indent=1))


def plot(report: dict, path: Path) -> None:
    """Train success and gradient norm per step of both arms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, key in zip(axes, ("success_rate", "grad_norm")):
        for arm, rows in report["per_step"].items():
            ax.plot(range(len(rows[key])), rows[key], marker="o", ms=3, label=arm)
        ax.set(xlabel="step", title=key)
    axes[0].legend()
    fig.suptitle(f"{report['args']['env']}: GiGPO vs GRPO from one SFT checkpoint, seed {report['args']['seed']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
