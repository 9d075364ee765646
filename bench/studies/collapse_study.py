"""A collapse, shown and prevented (issue 45 item 2): pushed off-policy, does the main job degrade without the
training-inference correction, and do MiniRL + TIS and the collapse guard prevent it?

    python bench/studies/collapse_study.py                    # the study: 3 arms x seeds 0, 1, 2
    python bench/studies/collapse_study.py --smoke            # 2 steps per arm, 4 held-out tasks, seed 0, into
                                                              # runs/collapse_study_smoke/ (JSON beside the runs)
    python bench/studies/collapse_study.py --smoke --model tiny-qwen3 --engine hf     # the same in about 2 minutes
    python bench/studies/collapse_study.py --plot-only        # redraw the figure from the JSON

Every run is the README's first command (`agentrl run --env math --seed S`: configs/math-smollm2.yaml, SmolLM2-135M-
Instruct on easy arithmetic, 4 tasks x 8 episodes a step; vLLM's CPU build sampling in bfloat16, ``--engine vllm
--engine-dtype bfloat16`` as bench/studies/mismatch_study.py passes them; the trainer in bfloat16 with float32 master
weights) pushed off-policy by settings every arm shares, each a flag of this script:

- ``--lr`` 2e-4 (the recipe's 2e-5 times ten): each update moves the policy further from the weights that sampled;
- ``--sync-every`` 8 (the engine gets new weights every 8 steps: samples up to 7 steps old);
- ``--minibatches`` 4 (``--optim.n-minibatches``: 4 optimizer updates per rollout batch, so every update after the
  first trains pi_theta away from pi_old within the step, and the PPO-style ratio is exercised, not only the IS);
- ``--steps`` 30 (the recipe's 20 and more: time for a degradation to show after it starts).

The arms differ in what protects the run:

- ``nois``: no protection: MiniRL without the training-inference correction (``--loss.options "{correction:
  none}"``) and the collapse guard off (``--guard.no-enabled``). The arm expected to degrade, if any does.
- ``tis``: MiniRL + token-level TIS as shipped (truncated IS on pi_old / mu), the guard off: does the correction
  alone prevent it?
- ``tis_guard``: everything as shipped, the collapse guard on with its defaults (stop after 3 consecutive steps of
  entropy below 0.05 or mismatch KL k3 above 0.01): what a user who changed only these four settings gets.

A run the guard stops (exit code nonzero, its log saying "collapse guard stopped the run") counts as finished: the
record keeps that line (``guard_stop``), the step it names and the step of the last checkpoint, which is the last
healthy step on the recipe's ``save_every`` 5 grid (the guard writes checkpoints of healthy steps only); that
checkpoint is what the user is left with, so it is evaluated and compared (``guard_stopped: true``). Any other
nonzero exit (a crash), a run short of its steps or a failed eval is listed under ``not_compared`` with its exit
codes and last checkpoint.

Every run's checkpoint is evaluated on the 64 held-out tasks exactly as mismatch_study.py evaluates (`agentrl eval
--env math --model RUN/checkpoint --episodes 64 --engine hf --output RUN/eval`: task seeds from 1,000,000, one
episode each, the model's sampling settings). The comparisons (primary: held-out success) are ``tis - nois``,
``tis_guard - nois`` and ``tis_guard - tis``, across training runs: the two-level bootstrap of
`bench.harness.compare_runs` (`agentrl.passk.run_level_bootstrap_difference`: runs drawn with replacement, then one
draw of the held-out tasks shared by every run of both arms), runs paired by seed (the primary: the arms of one seed
share the sampler's and torch's seeds) and unpaired beside it. The rule (item 1's, as corrected in
docs/experiments/issue45.md): "A is better than B" is claimed only where the paired interval excludes 0; every seed's
difference is reported beside the interval, and a claim names any seed that disagrees. Anything else is "not shown".

Per step the JSON keeps, from each run's metrics.jsonl: train success and reward, entropy, gradient norm, KL(mu ||
pi_old) k3 over every sample (``kl_k3``, staleness included) and over the fresh samples alone (``mismatch_kl_k3``,
steps 0, 8, 16, ...: what the guard reads), the IS weights' max and truncated share, the clip fraction, the PPO KL,
the largest ratio, response length and step seconds. Per run, descriptive (no claim rests on it), a ``degraded``
summary of the curve: the peak of the 3-step moving mean of train success, the mean over the last 5 steps, the drop
between them, the lowest entropy, the largest gradient norm and the largest ``kl_k3``. The figure shows every seed's
curve per arm (colour: arm, line style: seed) and every run's held-out success.

Runs go seed by seed (all arms of seed 0 first), so a stopped study keeps the arms balanced. A run that wrote its
exit code (``train_rc`` in ``walls.json``) is never redone, nor is an eval that wrote its results; a run the study
was stopped in the middle of is deleted and run again from the start. The 1-minute load average around each run is
kept with it. The JSON is rewritten after every run. Writes docs/results/collapse_study.json and .png; run folders go
to runs/collapse_study/seed<S>/<arm> (with ``<arm>.log`` beside each).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
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
    plot_seed_curves,
    read_jsonl,
    run_logged,
    write_json,
)

ARMS = {
    "nois": ["--loss.options", "{correction: none}", "--guard.no-enabled"],
    "tis": ["--guard.no-enabled"],
    "tis_guard": [],
}
"""Each arm's own flags, after the settings every arm shares."""
COMPARISONS = (("tis", "nois"), ("tis_guard", "nois"), ("tis_guard", "tis"))
PER_STEP = ("success_rate", "reward_mean", "entropy", "grad_norm", "kl_k3", "mismatch_kl_k3", "is_weight_max",
            "correction_truncated_frac", "clip_frac", "ppo_kl", "ratio_max", "response_tokens_mean", "step_seconds")
CURVES = (("success_rate", "train success"), ("entropy", "entropy"), ("grad_norm", "gradient norm"),
          ("kl_k3", "KL(mu || pi_old), k3, all samples"), ("mismatch_kl_k3", "KL(mu || pi_old), k3, fresh samples"))
COLORS = {"nois": "C3", "tis": "C0", "tis_guard": "C2"}
GUARD_STOP = "collapse guard stopped the run"
MOVING_MEAN = 3  # the window of the train-success peak: one step's 32 episodes are noisy
LAST_STEPS = 5  # the train success a run ends at: the mean over its last steps


def guard_stop_line(log_text: str) -> str | None:
    """The last line of a run's output saying the collapse guard stopped it, stripped; None if there is none."""
    lines = [line.strip() for line in log_text.splitlines() if GUARD_STOP in line]
    return lines[-1] if lines else None


def degraded(per_step: dict[str, list]) -> dict:
    """How far a run's curve fell from its best, descriptively: the peak of the `MOVING_MEAN`-step moving mean of
    train success (full windows only; a run shorter than the window has one, over all its steps), the mean train
    success over its last `LAST_STEPS` steps, the drop between them (peak - last; > 0: it ended below its best), the
    lowest entropy, the largest gradient norm and the largest ``kl_k3``. Steps without a value are left out; a value
    no step has is None."""

    def present(key: str) -> list[float]:
        return [v for v in per_step.get(key, []) if v is not None]

    success = present("success_rate")
    window = min(MOVING_MEAN, len(success))
    means = [statistics.fmean(success[i:i + window]) for i in range(len(success) - window + 1)] if success else []
    peak = max(means) if means else None
    last = statistics.fmean(success[-LAST_STEPS:]) if success else None
    entropy, grad, kl = present("entropy"), present("grad_norm"), present("kl_k3")
    return {"train_success_peak_moving_mean": peak,
            "train_success_peak_window_start": means.index(peak) if means else None,
            "train_success_last_steps_mean": last, "train_success_drop": None if peak is None else peak - last,
            "entropy_min": min(entropy) if entropy else None, "grad_norm_max": max(grad) if grad else None,
            "kl_k3_max": max(kl) if kl else None}


def is_compared(record: dict, steps: int) -> bool:
    """Whether a run enters the comparison: it was evaluated, and it either ran all `steps` and exited 0 with its
    checkpoint at the last step, or the collapse guard stopped it (its last healthy checkpoint is what was
    evaluated). A crash, a run short of its steps or a failed eval is not compared."""
    if "heldout" not in record or record.get("eval_rc", 0) != 0:
        return False
    if record.get("guard_stop"):
        return "checkpoint_step" in record
    return (record.get("train_rc") == 0 and record["steps_done"] == steps
            and record.get("checkpoint_step") == steps - 1)


def not_compared(records: list[dict]) -> list[dict]:
    """The runs left out of the comparison, each with what says why: exit codes, steps, checkpoint, guard line."""
    keys = ("seed", "arm", "train_rc", "eval_rc", "steps_done", "checkpoint_step", "guard_stop")
    return [{k: r.get(k) for k in keys} for r in records if not r["compared"]]


def engine_dtype(args: argparse.Namespace) -> str:
    """The sampler's dtype flag: as given, else bfloat16 for vLLM (as mismatch_study.py passes it), else none (the HF
    engine samples in the trainer's dtype)."""
    return args.engine_dtype or ("bfloat16" if args.engine == "vllm" else "")


def train_command(arm: str, seed: int, args: argparse.Namespace, run: Path) -> list[str]:
    """`agentrl run` for one arm and seed: the recipe with the shared off-policy settings and the arm's flags. The
    model flag only when one is given (else the recipe's model); the engine's dtype as `engine_dtype` says."""
    dtype = engine_dtype(args)
    return agentrl_command(
        "run", "--env", "math", "--seed", str(seed), "--steps", str(args.steps),
        *(["--model", args.model] if args.model else []), "--engine", args.engine,
        *(["--engine-dtype", dtype] if dtype else []), "--lr", str(args.lr), "--sync-every", str(args.sync_every),
        "--optim.n-minibatches", str(args.minibatches), *ARMS[arm], "--output", str(run), "--overwrite")


def run_arm(arm: str, seed: int, args: argparse.Namespace, folder: Path) -> dict:
    """Train one arm of one seed (unless it finished before) and evaluate its checkpoint (unless done); its record.

    Exit codes, wall seconds, the guard's line and the load around the run go to ``<run>/walls.json``, so a second
    call rebuilds the record without running anything.
    """
    run, log = folder / arm, folder / f"{arm}.log"
    walls_file = run / "walls.json"
    walls = json.loads(walls_file.read_text()) if walls_file.exists() else {}
    env = os.environ | {"TOKENIZERS_PARALLELISM": "false"}
    if "train_rc" not in walls:
        if run.exists():
            print(f"seed {seed} {arm}: the study was stopped during this run; run again from the start", flush=True)
            shutil.rmtree(run)
            walls = {}
        start = log.stat().st_size if log.exists() else 0  # the guard's line is read from this run's output only
        walls["load_1m_before"] = load_1m()
        walls["train_rc"], walls["train_s"] = run_logged(train_command(arm, seed, args, run), log, env=env)
        walls["load_1m_after"] = load_1m()
        with log.open() as fh:
            fh.seek(start)
            stop = guard_stop_line(fh.read())
        walls["guard_stop"] = stop if walls["train_rc"] else None
        run.mkdir(parents=True, exist_ok=True)  # a run that failed before its first line has no folder
        walls_file.write_text(json.dumps(walls))
    rows = read_jsonl(run / "metrics.jsonl") if (run / "metrics.jsonl").exists() else []
    record: dict = {"arm": arm, "seed": seed, "steps_done": len(rows),
                    "per_step": {k: [r.get(k) for r in rows] for k in PER_STEP}}
    record["degraded"] = degraded(record["per_step"])
    stopped_at = re.search(r"at step (\d+)", walls.get("guard_stop") or "")
    record["guard_stopped"] = bool(walls.get("guard_stop"))
    record["guard_stop_step"] = int(stopped_at.group(1)) if stopped_at else None
    state = run / "checkpoint" / "trainer_state.json"
    if state.exists():  # a stopped run is evaluated at its last checkpoint, which may be before its last step
        record["checkpoint_step"] = json.loads(state.read_text())["step"]
        if not (run / "eval" / "results.json").exists():
            walls["eval_rc"], walls["eval_s"] = run_logged(agentrl_command(
                "eval", "--env", "math", "--model", str(run / "checkpoint"), "--episodes", str(args.episodes),
                "--engine", "hf", "--output", str(run / "eval")), log, env=env)
            walls_file.write_text(json.dumps(walls))
        if (run / "eval" / "results.json").exists():
            res = json.loads((run / "eval" / "results.json").read_text())
            record["heldout"] = {k: res["overall"]["success_rate"][k] for k in ("estimate", "low", "high")}
    record |= walls
    record["compared"] = is_compared(record, args.steps)
    return record


def compare(records: list[dict], runs: Path, seeds: list[int]) -> dict:
    """``tis - nois``, ``tis_guard - nois``, ``tis_guard - tis``: held-out success across the compared runs."""
    by_arm = held_out_by_run(runs, [r for r in records if r["compared"]])
    out = {}
    for arm, base in COMPARISONS:
        comparison = compare_runs(by_arm, arm, base, seeds)
        if comparison is not None:
            out[f"{arm} - {base}"] = comparison
    return out


def summarize(records: list[dict]) -> dict:
    """Per arm and seed: held-out success (compared runs only), whether the guard stopped the run, and its degraded
    summary; per arm the mean, min and max held-out success over its compared seeds."""
    out: dict[str, dict] = {}
    for r in records:
        row = {"heldout": r["heldout"]["estimate"] if r["compared"] else None, "compared": r["compared"],
               "guard_stopped": r["guard_stopped"], "checkpoint_step": r.get("checkpoint_step"), **r["degraded"]}
        out.setdefault(r["arm"], {"per_seed": {}})["per_seed"][r["seed"]] = row
    for arm in out.values():
        values = [s["heldout"] for s in arm["per_seed"].values() if s["heldout"] is not None]
        arm["heldout"] = ({"mean": statistics.fmean(values), "min": min(values), "max": max(values)} if values
                          else None)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lr", type=float, default=2e-4, help="every arm's learning rate (the recipe's: 2e-5)")
    parser.add_argument("--sync-every", type=int, default=8, help="steps between weight syncs to the engine")
    parser.add_argument("--minibatches", type=int, default=4, help="optim.n_minibatches: updates per rollout batch")
    parser.add_argument("--model", default=None, help="default: the recipe's (SmolLM2-135M-Instruct)")
    parser.add_argument("--engine", default="vllm", choices=["vllm", "hf"], help="the sampling engine")
    parser.add_argument("--engine-dtype", default=None,
                        help="default: bfloat16 for vllm (as mismatch_study.py), the engine's default for hf")
    parser.add_argument("--episodes", type=int, default=64, help="held-out tasks (one episode each)")
    parser.add_argument("--runs", default=None, help="default: runs/collapse_study (smoke: runs/collapse_study_smoke)")
    parser.add_argument("--out", default=None,
                        help="default: docs/results/collapse_study.json (smoke: into the smoke's runs folder)")
    parser.add_argument("--smoke", action="store_true",
                        help="2 steps per arm, 4 held-out tasks, seed 0 (unless given), into a scratch folder")
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args()
    if args.smoke:  # 2 steps, so the degraded summary has a last-steps mean to compare with a peak
        args.steps, args.episodes = 2, 4
        if args.seeds == [0, 1, 2]:
            args.seeds = [0]
    runs = ROOT / (args.runs or ("runs/collapse_study_smoke" if args.smoke else "runs/collapse_study"))
    out = Path(args.out) if args.out else (runs / "collapse_study.json" if args.smoke
                                           else RESULTS / "collapse_study.json")
    if args.plot_only:
        plot(json.loads(out.read_text()), out.with_suffix(".png"))
        return
    runs.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    load_at_start = load_1m()
    setting = {"model": args.model, "engine": args.engine, "engine_dtype": engine_dtype(args) or None,
               "steps": args.steps, "lr": args.lr, "sync_every": args.sync_every, "n_minibatches": args.minibatches,
               "episodes": args.episodes}
    for seed in args.seeds:  # the JSON is rewritten after every run: a stopped study keeps what it finished
        folder = runs / f"seed{seed}"
        folder.mkdir(exist_ok=True)
        for arm in args.arms:
            record = run_arm(arm, seed, args, folder)
            records.append(record)
            d = record["degraded"]
            print(f"seed {seed} {arm}: steps {record['steps_done']}, held-out {record.get('heldout')}, train success "
                  f"peak {d['train_success_peak_moving_mean']} last {d['train_success_last_steps_mean']}, "
                  f"train {record.get('train_s', 0):.0f} s, eval {record.get('eval_s', 0):.0f} s", flush=True)
            if record.get("train_rc") or record.get("eval_rc"):
                print(f"  exit codes: train {record.get('train_rc')}, eval {record.get('eval_rc')}; "
                      f"{record.get('guard_stop') or 'see ' + os.path.relpath(folder / f'{arm}.log', ROOT)}",
                      flush=True)
            result = {"command": command_line(__file__), "seeds": args.seeds, "arms": args.arms,
                      **setting, "load_1m_at_start": load_at_start, "load_1m_now": load_1m(),
                      "runs": os.path.relpath(runs, ROOT), "records": records, "summary": summarize(records),
                      "vs": compare(records, runs, args.seeds), "not_compared": not_compared(records)}
            write_json(out, result)
    plot(result, out.with_suffix(".png"))
    print(json.dumps(result["vs"], indent=1))


def plot(result: dict, path: Path) -> None:
    """Per step, a line per arm and seed (colour: arm, line style: seed): train success, entropy, gradient norm and
    the two KLs; and the held-out success of every run (a cross: the guard stopped it; hollow: not compared)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8))  # the curves, then the held-out panel last
    plot_seed_curves(axes.flat, result["records"], CURVES, COLORS)
    ax = axes.flat[-1]
    arms = [a for a in COLORS if any(r["arm"] == a for r in result["records"])]
    for i, arm in enumerate(arms):
        runs = [r for r in result["records"] if r["arm"] == arm and "heldout" in r]
        for r in runs:
            x = i + 0.08 * (r["seed"] % 5 - 2)  # seeds side by side
            if r["guard_stopped"]:
                ax.scatter([x], [r["heldout"]["estimate"]], marker="x", color=COLORS[arm])
            else:
                ax.scatter([x], [r["heldout"]["estimate"]], edgecolors=COLORS[arm],
                           facecolors=COLORS[arm] if r["compared"] else "none")
        values = [r["heldout"]["estimate"] for r in runs if r["compared"]]
        if values:
            ax.hlines(statistics.fmean(values), i - 0.25, i + 0.25, color=COLORS[arm])
    ax.set_xticks(range(len(arms)), arms)
    ax.set(title=f"held-out success per run ({result['episodes']} tasks)", ylim=(0, 1))
    axes.flat[0].legend(fontsize=6)
    fig.suptitle(f"math, model {result['model'] or 'as in the recipe'}, engine {result['engine']}, lr {result['lr']}, "
                 f"sync_every {result['sync_every']}, {result['n_minibatches']} mini-batches, {result['steps']} steps, "
                 f"seeds {result['seeds']}: every run's curve")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
