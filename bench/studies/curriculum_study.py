"""A curriculum against uniform task sampling, RL from one SFT checkpoint, across run seeds (issue 44 item 5).

    python bench/studies/curriculum_study.py --env gui                    # the study: 2 arms x seeds 0, 1
    python bench/studies/curriculum_study.py --env gui --smoke --init smollm2-135m   # 1 step per arm, 8 held-out
                                                          # tasks, seed 0, from the base model (no SFT), into
                                                          # runs/curriculum_gui_smoke/
    python bench/studies/curriculum_study.py --env gui --smoke --init tiny-qwen3 --engine hf --engine-dtype float32
                                                          # the same with a random tiny model, in about 2 minutes
    python bench/studies/curriculum_study.py --env gui --plot-only        # redraw the figure from the JSON

One SFT checkpoint (``configs/<env>-sft.yaml``, trained once into ``<work>/sft`` unless it is there), then RL runs
from it with ``configs/<env>-rl.yaml`` (the recipe: GiGPO, dynamic sampling without refill, lr 2e-5, 4 tasks x 8
episodes a step), ``--steps`` steps, vLLM in bfloat16, one run per arm and run seed:

- ``uniform``: the recipe as shipped: each step's tasks are new seeds in order, task types as the env draws them;
- ``success``: ``--curriculum.policy success`` with its defaults (over the env's difficulty levels, band [0.2, 0.8],
  window 8, explore 0.1; `agentrl.curriculum`): a level whose recent groups succeed between 20% and 80% of the time
  (or that was never played) is drawn with weight 1, any other with weight 0.1, so steps play more of what makes
  mixed groups. On the phone GUI the levels are its three task types.

Every checkpoint is evaluated on the same ``--episodes`` held-out tasks (seeds from ``--seed-offset``: 4,000,000, no
earlier study used them; the recipe's env arguments and budgets; the model's official sampling settings; sampler
seed 0) into ``<work>/seed<S>/<arm>/eval``. The comparison (primary: held-out success) is ``success - uniform``
with the two-level bootstrap of `bench.harness.compare_runs`, runs paired by seed (the primary) and unpaired beside
it, each seed's difference reported; "the curriculum is better" (or worse) is claimed only where the paired
interval excludes 0. Also per run: held-out success per task type, the train wall seconds, the load around it, and
per step train success, the mixed-group count (``samples`` against ``samples_without_gradient``), the curriculum's
own metrics and step seconds. Runs go seed by seed; a finished run (``walls.json`` with its exit code) or eval is
never redone; the JSON is rewritten after every run. Writes docs/results/curriculum_<env>.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from learn_multiturn import eval_command, sft_once  # noqa: E402

from bench.harness import (  # noqa: E402
    RESULTS,
    ROOT,
    agentrl_command,
    command_line,
    compare_runs,
    held_out_by_run,
    load_1m,
    plot_heldout_per_run,
    plot_seed_curves,
    train_then_evaluate,
    write_json,
)

ARMS = {"uniform": [], "success": ["--curriculum.policy", "success"]}
"""Each arm's own flags, after the recipe's."""
PER_STEP = ("success_rate", "reward_mean", "entropy", "grad_norm", "samples", "samples_without_gradient",
            "turns_mean", "step_seconds", "curriculum_levels_mixed", "curriculum_level_mean")
CURVES = (("success_rate", "train success"), ("curriculum_level_mean", "mean level played (0 = easiest)"),
          ("step_seconds", "step seconds"))
COLORS = {"uniform": "C0", "success": "C1"}


def run_arm(arm: str, seed: int, args: argparse.Namespace, work: Path, common: list[str]) -> dict:
    """Train one arm of one seed from the SFT checkpoint (unless done) and evaluate it (unless done); its record."""
    folder = work / f"seed{seed}"
    folder.mkdir(exist_ok=True)
    run = folder / arm
    train = agentrl_command("run", "--config", str(work / "rl.yaml"), "--steps", str(args.steps), "--seed", str(seed),
                            "--engine", args.engine, "--engine-dtype", args.engine_dtype, *ARMS[arm], "--output",
                            str(run), "--overwrite")
    record, results = train_then_evaluate(run, folder / f"{arm}.log", train, agentrl_command(*common), PER_STEP,
                                          args.steps)
    if results is not None:
        by_type: dict[str, list[int]] = {}
        for e in results["episodes"]:
            counts = by_type.setdefault(str(e.get("task_type")), [0, 0])
            counts[0] += bool(e.get("success"))
            counts[1] += 1
        record["heldout_by_task_type"] = by_type
    return {"arm": arm, "seed": seed, **record}


def summarize(records: list[dict]) -> dict:
    """Per arm: held-out success per seed and its mean, min and max; train seconds per seed."""
    out: dict[str, dict] = {}
    for r in records:
        arm = out.setdefault(r["arm"], {"per_seed": {}})
        arm["per_seed"][r["seed"]] = {"heldout": r["heldout"]["estimate"] if r["compared"] else None,
                                      "train_s": r.get("train_s"), "eval_s": r.get("eval_s"),
                                      "by_task_type": r.get("heldout_by_task_type")}
    for arm in out.values():
        values = [s["heldout"] for s in arm["per_seed"].values() if s["heldout"] is not None]
        arm["heldout"] = ({"mean": statistics.fmean(values), "min": min(values), "max": max(values)} if values
                          else None)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="gui")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--episodes", type=int, default=192, help="held-out tasks, fixed before the runs")
    parser.add_argument("--seed-offset", type=int, default=4_000_000, help="first held-out task seed")
    parser.add_argument("--engine", default="vllm")
    parser.add_argument("--engine-dtype", default="bfloat16")
    parser.add_argument("--work", default="", help="default: runs/curriculum_<env> (smoke: ..._smoke)")
    parser.add_argument("--out", default="", help="default: docs/results/curriculum_<env>.json")
    parser.add_argument("--init", default="", help="start RL from this model instead of the SFT checkpoint")
    parser.add_argument("--smoke", action="store_true", help="1 step per arm, 8 held-out tasks, seed 0")
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.episodes = 1, 8
        if args.seeds == [0, 1]:
            args.seeds = [0]
    work = Path(args.work) if args.work else ROOT / "runs" / (f"curriculum_{args.env}" + ("_smoke" if args.smoke
                                                                                         else ""))
    work = work.resolve()
    out = Path(args.out) if args.out else (work / "result.json" if args.smoke
                                           else RESULTS / f"curriculum_{args.env}.json")
    if args.plot_only:
        plot(json.loads(out.read_text()), out.with_suffix(".png"))
        return
    work.mkdir(parents=True, exist_ok=True)
    sft_cfg = yaml.safe_load((ROOT / "configs" / f"{args.env}-sft.yaml").read_text())
    rl_cfg = yaml.safe_load((ROOT / "configs" / f"{args.env}-rl.yaml").read_text())
    sft = None if args.init else sft_once(args.env, work)
    if not args.init and not (work / "sft" / "checkpoint").is_dir():
        sys.exit(f"SFT left no checkpoint: see {work / 'sft.log'}")
    (work / "rl.yaml").write_text(yaml.safe_dump(rl_cfg | {"model": args.init or str(work / "sft" / "checkpoint")}))
    common = [*eval_command(sft_cfg, rl_cfg, args.episodes, args.engine, args.engine_dtype),
              "--seed-offset", str(args.seed_offset)]
    records: list[dict] = []
    load_at_start = load_1m()
    result: dict = {}
    for seed in args.seeds:
        for arm in args.arms:
            record = run_arm(arm, seed, args, work, common)
            records.append(record)
            print(f"seed {seed} {arm}: steps {record['steps_done']}, held-out {record.get('heldout')}, by type "
                  f"{record.get('heldout_by_task_type')}, train {record.get('train_s', 0):.0f} s, eval "
                  f"{record.get('eval_s', 0):.0f} s, rc {record.get('train_rc')}/{record.get('eval_rc')}", flush=True)
            by_arm = held_out_by_run(work, [r for r in records if r["compared"]])
            result = {"command": command_line(__file__), "env": args.env, "seeds": args.seeds, "arms": args.arms,
                      "steps": args.steps, "episodes": args.episodes, "seed_offset": args.seed_offset,
                      "engine": args.engine, "engine_dtype": args.engine_dtype, "init": args.init or "sft",
                      "sft_phase": sft, "load_1m_at_start": load_at_start, "load_1m_now": load_1m(),
                      "work": os.path.relpath(work, ROOT), "records": records, "summary": summarize(records),
                      "vs": {"success - uniform": compare_runs(by_arm, "success", "uniform", args.seeds)},
                      "not_compared": [{k: r.get(k) for k in ("seed", "arm", "train_rc", "eval_rc", "steps_done",
                                                           "checkpoint_step")}
                                       for r in records if not r["compared"]]}
            write_json(out, result)
    plot(result, out.with_suffix(".png"))
    print(json.dumps(result["vs"], indent=1))


def plot(result: dict, path: Path) -> None:
    """Per step, a line per arm and seed (colour: arm, line style: seed), and every run's held-out success."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CURVES) + 1, figsize=(4.4 * (len(CURVES) + 1), 4))
    plot_seed_curves(axes, result["records"], CURVES, COLORS)
    plot_heldout_per_run(axes[-1], result["records"], COLORS, result["episodes"])
    axes[0].legend(fontsize=6)
    seeds = sorted({r["seed"] for r in result["records"]})  # the seeds run (a stopped study ran fewer than asked)
    fig.suptitle(f"{result['env']}: RL from one SFT checkpoint, {result['steps']} steps, seeds {seeds}: "
                 f"uniform tasks against the 'success' curriculum")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
