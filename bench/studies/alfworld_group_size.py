"""Groups of 8 against groups of 4 at the same 16 episodes per step, on ALFWorld (issue 32 item 4, amendment 8).

    python bench/studies/alfworld_group_size.py                                               # the declared run
    python bench/studies/alfworld_group_size.py --steps 1 --episodes 4 --work runs/alfworld_gs_smoke  # a smoke test

The diagnosis in docs/results.md ("ALFWorld: why RL gains little") says RL learns little here because few groups
mix: a group of n episodes carries advantage only if some but not all of them succeed, which for a task solved with
probability p happens with probability 1 - p^n - (1-p)^n, and GiGPO's step groups cannot help a group that never
succeeded (every return is 0). Larger groups mix more often for rarely solved tasks. This script tests that at equal
cost, from one SFT checkpoint (``configs/alfworld-sft.yaml``, trained once into ``<work>/sft``):

- ``g4``: the recipe, ``configs/alfworld-rl.yaml``: 4 tasks x 4 episodes per step;
- ``g8``: the same recipe with 2 tasks x 8 episodes per step;

the same run seed, steps and engine. The SFT checkpoint and both RL checkpoints are evaluated on the same held-out
tasks (``--seed-offset``, seeds no earlier ALFWorld eval used), the model's official sampling settings, sampler seed
0. Reported: the paired bootstrap 95% interval of g8 - g4 success (the declared test), each arm minus SFT, per arm
the share of mixed groups and of trained episodes, and mixed share and success by the expert's plan length (the bins
of bench/studies/alfworld_task_difficulty.py). Writes docs/results/alfworld_group_size.json and .png.
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
from alfworld_task_difficulty import _bin, expert_lengths, run_groups  # noqa: E402  (sibling scripts)
from learn_multiturn import add_arm_study_arguments, eval_command, evaluate_arm, sft_once, train_arm  # noqa: E402

from bench.harness import RESULTS, ROOT, command_line, write_json  # noqa: E402

ARMS = {"g8": ["--scheduler.prompts-per-step", "2", "--scheduler.group-size", "8"],
        "g4": ["--scheduler.prompts-per-step", "4", "--scheduler.group-size", "4"]}


def main() -> None:
    from agentrl.passk import bootstrap_pass_at_k_difference, task_counts

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arm_study_arguments(parser)
    args = parser.parse_args()
    work = Path(args.work or ROOT / "runs" / "alfworld_group_size").resolve()
    results = Path(args.results or RESULTS / "alfworld_group_size.json")
    work.mkdir(parents=True, exist_ok=True)
    report: dict = {"command": command_line(__file__), "args": vars(args),
                    "started": time.strftime("%Y-%m-%d %H:%M:%S"), "phases": {}, "per_step": {}}

    def save() -> None:
        write_json(results, report)

    if sft := sft_once("alfworld", work):
        report["phases"]["sft"] = sft
    sft_cfg = yaml.safe_load((ROOT / "configs" / "alfworld-sft.yaml").read_text())
    rl_cfg = yaml.safe_load((ROOT / "configs" / "alfworld-rl.yaml").read_text())
    (work / "rl.yaml").write_text(yaml.safe_dump(rl_cfg | {"model": str(work / "sft" / "checkpoint")}))
    for arm, flags in ARMS.items():
        train_arm(work, arm, flags, args, report)
        save()

    common = [*eval_command(sft_cfg, rl_cfg, args.episodes, args.engine, args.engine_dtype),
              "--seed-offset", str(args.seed_offset)]
    models = {"sft": work / "sft" / "checkpoint", **{arm: work / arm / "checkpoint" for arm in ARMS}}
    evals = {}
    for name, model in models.items():
        evals[name] = evaluate_arm(name, model, common, work, report)
        save()
    seeds = {name: [e["seed"] for e in ev["episodes"]] for name, ev in evals.items()}
    if len({tuple(s) for s in seeds.values()}) != 1:
        sys.exit("the evaluations played different tasks: no paired comparison possible")

    report["success"] = {name: ev["overall"]["success_rate"] for name, ev in evals.items()}
    counts = {name: task_counts(ev["episodes"]) for name, ev in evals.items()}
    report["paired_success_difference"] = {}
    for a, b in (("g8", "g4"), ("g4", "sft"), ("g8", "sft")):
        d = bootstrap_pass_at_k_difference(counts[a], counts[b], 1, paired=True)
        report["paired_success_difference"][f"{a}-{b}"] = d.to_dict() | {"significant": d.excludes_zero}

    # Where the groups mixed: the train tasks' expert plan lengths, then each arm's groups by plan-length bin.
    task_types, offset = rl_cfg["env"]["kwargs"]["task_types"], rl_cfg["env"]["seed_offset"]
    train_lengths = expert_lengths("train", range(offset, offset + 4 * args.steps), task_types)
    report["train_groups"] = {}
    for arm in ARMS:
        if (work / arm / "trajectories.jsonl").exists():
            table = run_groups(work / arm, train_lengths)
            groups, mixed = sum(c["groups"] for c in table.values()), sum(c["mixed"] for c in table.values())
            samples = sum(x or 0 for x in report["per_step"][arm]["samples"])
            skipped = sum(x or 0 for x in report["per_step"][arm]["samples_without_gradient"])
            report["train_groups"][arm] = {"groups": groups, "mixed": mixed, "mixed_share": mixed / max(groups, 1),
                                           "samples": samples, "samples_trained": samples - skipped,
                                           "by_plan_length": table}
    # Held-out success by the expert's plan length (from the eval's own seeds, the env's eval split).
    test_lengths = expert_lengths("valid_unseen", range(args.seed_offset, args.seed_offset + args.episodes),
                                  task_types)
    by_bin: dict = {}
    for name, ev in evals.items():
        for e in ev["episodes"]:
            cell = by_bin.setdefault(_bin(test_lengths[e["seed"]]), {}).setdefault(name, [0, 0])
            cell[0] += bool(e.get("success"))
            cell[1] += 1
    report["heldout_success_by_plan_length"] = {b: by_bin[b] for b in sorted(by_bin, key=_bin_order)}
    report["work"] = str(work.relative_to(ROOT)) if work.is_relative_to(ROOT) else work.name
    report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    save()
    plot(report, results.with_suffix(".png"))
    print(json.dumps({k: report[k] for k in ("success", "paired_success_difference")}, indent=1))
    print(json.dumps({arm: {k: v for k, v in g.items() if k != "by_plan_length"}
                      for arm, g in report["train_groups"].items()}, indent=1))



def _bin_order(name: str) -> int:
    """Plan-length bins in order of length ("1-5" before "10-15"; "unsolved" last)."""
    return int(name.split("-")[0]) if name[0].isdigit() else 99


def plot(report: dict, path: Path) -> None:
    """Train success and trained episodes per step of both arms; held-out success by plan length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for arm, rows in report["per_step"].items():
        steps = range(len(rows["success_rate"]))
        axes[0].plot(steps, rows["success_rate"], marker="o", ms=3, label=arm)
        trained = [(s or 0) - (k or 0) for s, k in zip(rows["samples"], rows["samples_without_gradient"])]
        axes[1].plot(steps, trained, marker="o", ms=3, label=arm)
    axes[0].set(xlabel="step", title="train success")
    axes[1].set(xlabel="step", title="samples with a gradient")
    bins = sorted(report["heldout_success_by_plan_length"], key=_bin_order)
    names = list(report["success"])
    for i, name in enumerate(names):
        rates = [report["heldout_success_by_plan_length"][b].get(name, [0, 1]) for b in bins]
        axes[2].bar([j + 0.27 * (i - 1) for j in range(len(bins))], [s / max(n, 1) for s, n in rates], 0.27,
                    label=name)
    axes[2].set_xticks(range(len(bins)), [f"{b}\n(n={report['heldout_success_by_plan_length'][b]['sft'][1]})"
                                          for b in bins])
    axes[2].set(xlabel="expert plan length (steps)", title="held-out success")
    for ax in axes:
        ax.legend()
    fig.suptitle(f"ALFWorld: groups of 8 vs 4 at 16 episodes per step, from one SFT checkpoint, "
                 f"seed {report['args']['seed']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
