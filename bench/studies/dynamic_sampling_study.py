"""Dynamic sampling that refills against today's uniform step, on the main job (issue 44 item 5).

    python bench/studies/dynamic_sampling_study.py              # the study: 2 arms x seeds 0, 1, 2
    python bench/studies/dynamic_sampling_study.py --smoke      # 2 steps per arm, 4 held-out tasks, seed 0, into
                                                                # runs/dynamic_sampling_smoke/ (JSON beside the runs)
    python bench/studies/dynamic_sampling_study.py --smoke --model tiny-qwen3 --engine hf   # the same, in minutes
    python bench/studies/dynamic_sampling_study.py --plot-only  # redraw the figure from the JSON

Every run is the README's first command as typed (`agentrl run --env math --seed S`: configs/math-smollm2.yaml,
SmolLM2-135M-Instruct on easy arithmetic, MiniRL, 20 steps of 4 tasks x 8 episodes, the sampler the install picks),
and the arms differ in which groups a step trains on:

- ``today``: the recipe as shipped: each step's 4 tasks, every group in the batch (a group whose 8 episodes all got
  the same reward has zero advantage: no gradient of its own, but MiniRL's mean over sequences counts its samples,
  so it shrinks the step's update);
- ``refill``: DAPO's dynamic sampling (``--loss.dynamic-sampling --scheduler.max-oversample 3``): groups without
  mixed rewards are left out and the step rolls out more tasks, in rounds of at most 4 sized by the mixed rate seen
  so far, until it has 4 mixed groups or has drawn 12 tasks (`agentrl.rollout.refill`). The difference between the
  arms is therefore both more mixed groups and a larger update per step (no zero-advantage samples in the mean); an
  arm with the filter alone (``--loss.dynamic-sampling``) would separate the two.

Each checkpoint is evaluated on the 64 held-out tasks as every main-job study evaluates (`agentrl eval --env math
--model RUN/checkpoint --episodes 64 --engine hf --output RUN/eval`: task seeds from 1,000,000, one episode each, the
model's official sampling settings). The comparison (primary: held-out success) is ``refill - today`` with the
two-level bootstrap of `bench.harness.compare_runs`, runs paired by seed (the primary) and unpaired beside it, each
seed's difference reported. "refill is better" (or worse) is claimed only where the paired interval excludes 0.

Per run: the train and eval wall seconds (the cost of the refill's extra rollouts is the point of the second arm),
the load average around the run, and per step train success, reward, entropy, step and rollout seconds, and the
refill's counters (groups drawn, mixed groups, rounds, bound hit). Runs go seed by seed (both arms of seed 0 first);
a run that wrote its exit code (``walls.json``) is never redone, an eval that wrote its results neither; a run the
study was stopped in is run again from the start. The JSON is rewritten after every run. Writes
docs/results/dynamic_sampling_study.json and .png; run folders go to runs/dynamic_sampling/seed<S>/<arm>.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
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

ARMS = {
    "today": [],
    "refill": ["--loss.dynamic-sampling", "--scheduler.max-oversample", "3"],
}
"""Each arm's own flags, after the recipe's."""
PER_STEP = ("success_rate", "reward_mean", "entropy", "grad_norm", "step_seconds", "rollout_seconds",
            "dynamic_sampling_groups_drawn", "dynamic_sampling_mixed", "dynamic_sampling_rounds",
            "dynamic_sampling_bound_hit")
CURVES = (("success_rate", "train success (the step's trained groups)"), ("entropy", "entropy"),
          ("dynamic_sampling_groups_drawn", "groups rolled out"), ("step_seconds", "step seconds"))
COLORS = {"today": "C0", "refill": "C2"}


def train_command(arm: str, seed: int, args: argparse.Namespace, run: Path) -> list[str]:
    """`agentrl run` for one arm and seed: the recipe as typed, the arm's flags, a model and engine only if given."""
    return agentrl_command(
        "run", "--env", "math", "--seed", str(seed), "--steps", str(args.steps),
        *(["--model", args.model] if args.model else []), *(["--engine", args.engine] if args.engine else []),
        *ARMS[arm], "--output", str(run), "--overwrite")


def run_arm(arm: str, seed: int, args: argparse.Namespace, folder: Path) -> dict:
    """Train one arm of one seed (unless it finished before) and evaluate its checkpoint (unless done); its record."""
    run = folder / arm
    evaluate = agentrl_command("eval", "--env", "math", "--episodes", str(args.episodes), "--engine", "hf")
    record, _ = train_then_evaluate(run, folder / f"{arm}.log", train_command(arm, seed, args, run), evaluate,
                                    PER_STEP, args.steps)
    drawn = [v for v in record["per_step"]["dynamic_sampling_groups_drawn"] if v is not None]
    record["groups_drawn_total"] = sum(drawn) if drawn else args.steps * 4
    return {"arm": arm, "seed": seed, **record}


def summarize(records: list[dict]) -> dict:
    """Per arm: held-out success per seed and its mean, train wall seconds, groups rolled out over the run."""
    out: dict[str, dict] = {}
    for r in records:
        arm = out.setdefault(r["arm"], {"per_seed": {}})
        arm["per_seed"][r["seed"]] = {"heldout": r["heldout"]["estimate"] if r["compared"] else None,
                                      "train_s": r.get("train_s"), "eval_s": r.get("eval_s"),
                                      "groups_drawn_total": r["groups_drawn_total"]}
    for arm in out.values():
        for key in ("heldout", "train_s", "groups_drawn_total"):
            values = [s[key] for s in arm["per_seed"].values() if s[key] is not None]
            arm[key] = ({"mean": statistics.fmean(values), "min": min(values), "max": max(values)} if values
                        else None)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--model", default=None, help="default: the recipe's (SmolLM2-135M-Instruct)")
    parser.add_argument("--engine", default=None, help="default: the install's (vLLM where installed)")
    parser.add_argument("--episodes", type=int, default=64, help="held-out tasks (one episode each)")
    parser.add_argument("--runs", default=None, help="default: runs/dynamic_sampling (smoke: ..._smoke)")
    parser.add_argument("--out", default=None, help="default: docs/results/dynamic_sampling_study.json")
    parser.add_argument("--smoke", action="store_true", help="2 steps per arm, 4 held-out tasks, seed 0")
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.episodes = 2, 4
        if args.seeds == [0, 1, 2]:
            args.seeds = [0]
    runs = ROOT / (args.runs or ("runs/dynamic_sampling_smoke" if args.smoke else "runs/dynamic_sampling"))
    out = Path(args.out) if args.out else (runs / "dynamic_sampling_study.json" if args.smoke
                                           else RESULTS / "dynamic_sampling_study.json")
    if args.plot_only:
        plot(json.loads(out.read_text()), out.with_suffix(".png"))
        return
    runs.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    load_at_start = load_1m()
    for seed in args.seeds:  # the JSON is rewritten after every run: a stopped study keeps what it finished
        folder = runs / f"seed{seed}"
        folder.mkdir(exist_ok=True)
        for arm in args.arms:
            record = run_arm(arm, seed, args, folder)
            records.append(record)
            print(f"seed {seed} {arm}: steps {record['steps_done']}, held-out {record.get('heldout')}, groups "
                  f"{record['groups_drawn_total']}, train {record.get('train_s', 0):.0f} s, eval "
                  f"{record.get('eval_s', 0):.0f} s, rc {record.get('train_rc')}/{record.get('eval_rc')}", flush=True)
            by_arm = held_out_by_run(runs, [r for r in records if r["compared"]])
            result = {"command": command_line(__file__), "seeds": args.seeds, "arms": args.arms,
                      "model": args.model, "engine": args.engine, "steps": args.steps, "episodes": args.episodes,
                      "load_1m_at_start": load_at_start, "load_1m_now": load_1m(),
                      "runs": os.path.relpath(runs, ROOT), "records": records, "summary": summarize(records),
                      "vs": {"refill - today": compare_runs(by_arm, "refill", "today", args.seeds)},
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

    fig, axes = plt.subplots(1, len(CURVES) + 1, figsize=(4.2 * (len(CURVES) + 1), 4))
    plot_seed_curves(axes, result["records"], CURVES, COLORS)
    plot_heldout_per_run(axes[-1], result["records"], COLORS, result["episodes"])
    axes[0].legend(fontsize=6)
    fig.suptitle(f"the main job, {result['steps']} steps, seeds {result['seeds']}: today's step against dynamic "
                 f"sampling that refills (up to 3x the tasks)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
