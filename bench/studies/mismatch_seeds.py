"""The mismatch study with training seeds (issue 45 item 1): is MiniRL + TIS better than no IS, or than GRPO, across
training runs and not only on one run's held-out tasks?

    python bench/studies/mismatch_seeds.py                       # the declared study (docs/experiments/issue45.md)
    python bench/studies/mismatch_seeds.py --smoke               # 1 step per arm, 4 held-out tasks, seeds 0 and 1,
                                                                 # into runs/mismatch_seeds_smoke/
    python bench/studies/mismatch_seeds.py --plot-only           # redraw the figure from the JSON

Each arm is the README's first command as shipped (`agentrl run --env math --seed S`: SmolLM2-135M-Instruct, 20 steps
of 4 tasks x 8 episodes, lr 2e-5, vLLM's CPU build sampling in bfloat16, the trainer in bfloat16 with float32 master
weights) with one objective (``minirl_tis``, ``minirl_nois``, ``grpo``: see bench/studies/mismatch_study.py) and one
`sync_every` (1: on-policy; 4: samples up to 3 steps old), for every run seed. Runs go seed by seed (all arms of seed
0, then seed 1, ...), so a stopped study keeps the arms balanced; a run or eval that ended is never redone, and a run
the study itself was stopped in the middle of (no exit code recorded) is run again from the start. Only runs that
ended with exit code 0 after every step enter the comparison; any other (a collapse-guard stop, a crash) is listed
under ``not_compared`` with its exit code and last checkpoint.

Every checkpoint is evaluated on the 64 held-out tasks of bench/studies/main_job_seeds.py (task seeds from 1,000,000,
HF engine, `agentrl eval` defaults). The comparison is across training runs: a two-level bootstrap
(`agentrl.passk.run_level_bootstrap_difference`: runs drawn with replacement, then held-out tasks drawn with
replacement, one draw shared by every run of both arms: a crossed design), with runs paired by seed (the primary:
arms of one seed share its sampler and torch seeds; every seed plays the same training tasks) and unpaired (reported
beside it). Each arm is compared with ``minirl_tis`` at the same
`sync_every`. The figure shows every seed's curve, not only the means.

Writes docs/results/mismatch_seeds.json and .png; run folders go to runs/mismatch_seeds/seed<S>/<arm>.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, ROOT, command_line, compare_runs, held_out_by_run, load_1m, write_json  # noqa: E402
from bench.studies.mismatch_study import run_arm  # noqa: E402

ARMS = ["minirl_tis@1", "minirl_nois@1", "grpo@1", "minirl_tis@4", "minirl_nois@4", "grpo@4"]
CURVES = (("success_rate", "train success"), ("kl_k3", "KL(mu || pi_old), k3, all samples"),
          ("grad_norm", "gradient norm"), ("entropy", "entropy"))


def compare(records: list[dict], runs: Path, seeds: list[int]) -> dict:
    """Each arm against ``minirl_tis`` at the same `sync_every`, over the seeds both have evaluated."""
    by_arm = held_out_by_run(runs, records)
    out = {}
    for arm in by_arm:
        objective, sync = arm.split("@")
        base = f"minirl_tis@{sync}"
        if objective == "minirl_tis" or base not in by_arm:
            continue
        comparison = compare_runs(by_arm, arm, base, seeds)
        if comparison is not None:
            out[f"{arm} - {base}"] = comparison
    return out


def summarize(records: list[dict]) -> dict:
    """Per arm: held-out success per seed, and the mean, min and max over seeds."""
    out: dict[str, dict] = {}
    for r in records:
        if "heldout" in r:
            out.setdefault(r["arm"], {"per_seed": {}})["per_seed"][r["seed"]] = r["heldout"]["estimate"]
    for s in out.values():
        values = list(s["per_seed"].values())
        s.update(mean=statistics.fmean(values), min=min(values), max=max(values))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", default=ARMS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--episodes", type=int, default=64, help="held-out tasks (one episode each)")
    parser.add_argument("--engine-dtype", default="bfloat16")
    parser.add_argument("--lr", type=float, default=0.0, help="0: the recipe's (2e-5)")
    parser.add_argument("--runs", default="runs/mismatch_seeds")
    parser.add_argument("--out", default=str(RESULTS / "mismatch_seeds.json"))
    parser.add_argument("--smoke", action="store_true",
                        help="1 step per arm, 4 held-out tasks, seeds 0 and 1 (unless given), into "
                             "runs/mismatch_seeds_smoke/ (unless --runs / --out are given)")
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args()
    if args.smoke:  # never into the declared study's folders
        args.steps, args.episodes = 1, 4
        if args.seeds == [0, 1, 2]:
            args.seeds = [0, 1]
        if args.runs == parser.get_default("runs"):
            args.runs = "runs/mismatch_seeds_smoke"
        if args.out == parser.get_default("out"):
            args.out = str(ROOT / args.runs / "mismatch_seeds.json")
    out = Path(args.out)
    if args.plot_only:
        plot(json.loads(out.read_text()), out.with_suffix(".png"))
        return
    runs = ROOT / args.runs
    runs.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    load_at_start = load_1m()
    for seed in args.seeds:  # the JSON is rewritten after every run: a stopped study keeps what it finished
        for arm in args.arms:
            arm_args = argparse.Namespace(seed=seed, steps=args.steps, engine_dtype=args.engine_dtype, lr=args.lr,
                                          episodes=args.episodes, no_eval=False)
            folder = runs / f"seed{seed}"
            folder.mkdir(exist_ok=True)
            walls = folder / arm / "walls.json"
            if (folder / arm).exists() and "train_rc" not in (json.loads(walls.read_text()) if walls.exists() else {}):
                print(f"seed {seed} {arm}: the study was stopped during this run; run again from the start", flush=True)
                shutil.rmtree(folder / arm)
            # The load around the run is kept with it: a rerun of the study reads it back instead of timing a no-op.
            load_file = folder / arm / "load.json"
            trains = not (folder / arm / "checkpoint").is_dir()
            load_before = load_1m()
            record = run_arm(arm, arm_args, folder, runs / "log.txt") | {"seed": seed}
            if trains and (folder / arm).is_dir():
                load_file.write_text(json.dumps({"load_1m_before": load_before, "load_1m_after": load_1m()}))
            record |= json.loads(load_file.read_text()) if load_file.exists() else {"load_1m_before": None,
                                                                                      "load_1m_after": None}
            record["compared"] = (record.get("train_rc") == 0 and record["steps_done"] == args.steps
                                  and record.get("checkpoint_step") == args.steps - 1 and "heldout" in record)
            # run_arm's per-step keys, plus the mismatch KL as the run logs it and the policy entropy
            metrics = folder / arm / "metrics.jsonl"
            rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
            for key in ("mismatch_kl_k3", "mismatch_kl_k1", "policy_entropy"):
                record["per_step"][key] = [row.get(key) for row in rows]
            records.append(record)
            print(f"seed {seed} {arm}: steps {record['steps_done']}, held-out {record.get('heldout')}, "
                  f"train {record.get('train_s', 0):.0f} s, eval {record.get('eval_s', 0):.0f} s", flush=True)
            if record.get("train_rc") or record.get("eval_rc"):
                print(f"  exit codes: train {record.get('train_rc')}, eval {record.get('eval_rc')}: see "
                      f"{os.path.relpath(runs / 'log.txt', ROOT)}", flush=True)
            compared = [r for r in records if r["compared"]]
            result = {"command": command_line(__file__), "steps": args.steps, "seeds": args.seeds,
                      "engine_dtype": args.engine_dtype, "episodes": args.episodes, "load_1m_at_start": load_at_start,
                      "load_1m_now": load_1m(), "runs": os.path.relpath(runs, ROOT), "records": records,
                      "heldout": summarize(compared),
                      "vs_minirl_tis": compare(compared, runs, args.seeds),
                      "not_compared": [{k: r.get(k) for k in ("seed", "arm", "train_rc", "eval_rc", "steps_done",
                                                             "checkpoint_step")} for r in records if not r["compared"]]}
            write_json(out, result)
    plot(result, out.with_suffix(".png"))
    print(json.dumps(result["vs_minirl_tis"], indent=1))


def plot(result: dict, path: Path) -> None:
    """One row per `sync_every`: train success, mismatch KL, gradient norm and entropy per step (a line per arm and
    seed), and the held-out success of every run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    syncs = sorted({r["sync_every"] for r in result["records"]})
    colors = {"minirl_tis": "C0", "minirl_nois": "C3", "grpo": "C2"}
    fig, axes = plt.subplots(len(syncs), len(CURVES) + 1, figsize=(17, 3.6 * len(syncs)), squeeze=False)
    for row, sync in enumerate(syncs):
        records = [r for r in result["records"] if r["sync_every"] == sync]
        for ax, (key, title) in zip(axes[row], CURVES):
            for r in records:
                ys = [float("nan") if v is None else v for v in r["per_step"].get(key, [])]
                ax.plot(range(len(ys)), ys, color=colors.get(r["objective"], "k"), lw=0.9, alpha=0.8, marker="o", ms=2,
                        ls=("-", "--", ":", "-.")[r["seed"] % 4], label=f"{r['objective']} seed {r['seed']}")
            ax.set(title=f"{title}, sync_every {sync}", xlabel="step")
            if key == "mismatch_kl_k3":
                ax.set_yscale("log")
        ax = axes[row][-1]
        objectives = [o for o in colors if any(r["objective"] == o for r in records)]
        for i, objective in enumerate(objectives):
            values = [r["heldout"]["estimate"] for r in records if r["objective"] == objective and "heldout" in r]
            ax.scatter([i] * len(values), values, color=colors[objective])
            if values:
                ax.hlines(statistics.fmean(values), i - 0.25, i + 0.25, color=colors[objective])
        ax.set_xticks(range(len(objectives)), objectives)
        ax.set(title=f"held-out success per run, sync_every {sync}", ylim=(0, 1))
    axes[0][0].legend(fontsize=6)
    fig.suptitle(f"main job, {result['steps']} steps, seeds {result['seeds']}: every run's curve")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
