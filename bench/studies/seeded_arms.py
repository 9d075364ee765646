"""Two RL arms from one SFT checkpoint, across run seeds: the machinery the seeded multi-turn studies share.

A study (`ArmStudy`) names its arms (each a list of flags after the recipe's), which arm is compared against which,
its held-out seed offset, what it keeps per step and what it plots; `main(study)` does the rest:

1. one SFT checkpoint (``configs/<env>-sft.yaml``, trained once into ``<work>/sft`` unless it is there; ``--init``
   starts RL from another model instead, for smoke tests);
2. per run seed, per arm: ``agentrl run`` with ``configs/<env>-rl.yaml`` from that checkpoint for ``--steps`` steps,
   then ``agentrl eval`` of its checkpoint on the same ``--episodes`` held-out tasks (seeds from the study's offset;
   the recipe's env arguments and budgets; the model's official sampling settings; sampler seed 0), both through
   `bench.harness.train_then_evaluate`, so a finished run or eval is never redone and a stopped one is run again;
3. the comparison: ``treatment - baseline`` held-out success with the two-level bootstrap of
   `bench.harness.compare_runs`, runs paired by seed (the primary) and unpaired beside it, each seed's difference;
   per run, held-out success per task type, train and eval wall seconds, the load around the training, and the
   study's per-step metrics. The JSON is rewritten after every run; a figure is drawn at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
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

COMMON_PER_STEP = ("success_rate", "reward_mean", "entropy", "grad_norm", "samples", "samples_without_gradient",
                   "turns_mean", "step_seconds")
"""The training metrics every study keeps per step of each run."""


@dataclass(frozen=True)
class ArmStudy:
    """What one seeded two-arm study compares; `main` runs it.

    Attributes:
        name: the study's file stem (``runs/<name>_<env>``, ``docs/results/<name>_<env>.json``).
        arms: each arm's own flags after the recipe's, baseline first (an empty list: the recipe as shipped).
        treatment: the arm compared against `baseline` (``treatment - baseline``).
        baseline: the arm it is compared against.
        seed_offset: the first held-out task seed (one no earlier study's eval used).
        default_seeds: the run seeds of the declared study.
        per_step: training metrics kept per step beyond `COMMON_PER_STEP`.
        curves: (metric key, panel title) of the per-step panels of the figure.
        title: the figure's title after "<env>: RL from one SFT checkpoint, <n> steps, seeds [...]: ".
    """

    name: str
    arms: dict[str, list[str]]
    treatment: str
    baseline: str
    seed_offset: int
    default_seeds: tuple[int, ...]
    per_step: tuple[str, ...]
    curves: tuple[tuple[str, str], ...]
    title: str

    @property
    def colors(self) -> dict[str, str]:
        """A colour per arm, in the arms' order."""
        return {arm: f"C{i}" for i, arm in enumerate(self.arms)}


def run_arm(study: ArmStudy, arm: str, seed: int, args: argparse.Namespace, work: Path, common: list[str]) -> dict:
    """Train one arm of one seed from the SFT checkpoint (unless done) and evaluate it (unless done); its record."""
    folder = work / f"seed{seed}"
    folder.mkdir(exist_ok=True)
    run = folder / arm
    train = agentrl_command("run", "--config", str(work / "rl.yaml"), "--steps", str(args.steps), "--seed", str(seed),
                            "--engine", args.engine, "--engine-dtype", args.engine_dtype, *study.arms[arm],
                            "--output", str(run), "--overwrite")
    record, results = train_then_evaluate(run, folder / f"{arm}.log", train, agentrl_command(*common),
                                          (*COMMON_PER_STEP, *study.per_step), args.steps)
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


def parse_args(study: ArmStudy, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The options every seeded two-arm study takes (its own defaults filled in)."""
    parser = argparse.ArgumentParser(description=(sys.modules["__main__"].__doc__ or study.name).splitlines()[0])
    parser.add_argument("--env", default="gui")
    parser.add_argument("--arms", nargs="+", default=list(study.arms), choices=list(study.arms))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(study.default_seeds))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--episodes", type=int, default=192, help="held-out tasks, fixed before the runs")
    parser.add_argument("--seed-offset", type=int, default=study.seed_offset, help="first held-out task seed")
    parser.add_argument("--engine", default="vllm")
    parser.add_argument("--engine-dtype", default="bfloat16")
    parser.add_argument("--work", default="", help=f"default: runs/{study.name}_<env> (smoke: ..._smoke)")
    parser.add_argument("--out", default="", help=f"default: docs/results/{study.name}_<env>.json")
    parser.add_argument("--init", default="", help="start RL from this model instead of the SFT checkpoint")
    parser.add_argument("--smoke", action="store_true", help="1 step per arm, 8 held-out tasks, seed 0")
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.episodes = 1, 8
        if args.seeds == list(study.default_seeds):
            args.seeds = [0]
    return args


def main(study: ArmStudy, argv: Sequence[str] | None = None) -> None:
    """Run `study` as the command line says (see the module's docstring)."""
    args = parse_args(study, argv)
    stem = f"{study.name}_{args.env}"
    work = (Path(args.work) if args.work else ROOT / "runs" / (stem + ("_smoke" if args.smoke else ""))).resolve()
    out = Path(args.out) if args.out else (work / "result.json" if args.smoke else RESULTS / f"{stem}.json")
    if args.plot_only:
        plot(study, json.loads(out.read_text()), out.with_suffix(".png"))
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
    comparison = f"{study.treatment} - {study.baseline}"
    for seed in args.seeds:
        for arm in args.arms:
            record = run_arm(study, arm, seed, args, work, common)
            records.append(record)
            print(f"seed {seed} {arm}: steps {record['steps_done']}, held-out {record.get('heldout')}, by type "
                  f"{record.get('heldout_by_task_type')}, train {record.get('train_s', 0):.0f} s, eval "
                  f"{record.get('eval_s', 0):.0f} s, rc {record.get('train_rc')}/{record.get('eval_rc')}", flush=True)
            by_arm = held_out_by_run(work, [r for r in records if r["compared"]])
            result = {"command": command_line(sys.modules["__main__"].__file__), "env": args.env,
                      "seeds": args.seeds, "arms": args.arms, "steps": args.steps, "episodes": args.episodes,
                      "seed_offset": args.seed_offset, "engine": args.engine, "engine_dtype": args.engine_dtype,
                      "init": args.init or "sft", "sft_phase": sft, "load_1m_at_start": load_at_start,
                      "load_1m_now": load_1m(), "work": os.path.relpath(work, ROOT), "records": records,
                      "summary": summarize(records),
                      "vs": {comparison: compare_runs(by_arm, study.treatment, study.baseline, args.seeds)},
                      "not_compared": [{k: r.get(k) for k in ("seed", "arm", "train_rc", "eval_rc", "steps_done",
                                                           "checkpoint_step")}
                                       for r in records if not r["compared"]]}
            write_json(out, result)
    plot(study, result, out.with_suffix(".png"))
    print(json.dumps(result["vs"], indent=1))


def plot(study: ArmStudy, result: dict, path: Path) -> None:
    """Per step, a line per arm and seed (colour: arm, line style: seed), and every run's held-out success."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(study.curves) + 1, figsize=(4.4 * (len(study.curves) + 1), 4))
    plot_seed_curves(axes, result["records"], study.curves, study.colors)
    plot_heldout_per_run(axes[-1], result["records"], study.colors, result["episodes"])
    axes[0].legend(fontsize=6)
    seeds = sorted({r["seed"] for r in result["records"]})  # the seeds run (a stopped study ran fewer than asked)
    fig.suptitle(f"{result['env']}: RL from one SFT checkpoint, {result['steps']} steps, seeds {seeds}: "
                 f"{study.title}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
