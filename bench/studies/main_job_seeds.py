"""The main job across run seeds: what does the README's first command typically reach on held-out tasks?

    python bench/studies/main_job_seeds.py              # seeds 0-4, 20 steps each, HF engine (the default install)
    python bench/studies/main_job_seeds.py --seeds 0 1 --steps 3
    python bench/studies/main_job_seeds.py --seeds 0 1 2 --engine auto --runs runs/main_job_bf16 \
        --out docs/results/main_job_bf16.json   # the README's command as typed (issue 39's declared runs)

For each seed it runs the shipped command, `agentrl run --env math --seed S` (configs/math-smollm2.yaml's settings:
SmolLM2-135M-Instruct, MiniRL, 20 steps of 4 tasks x 8 episodes), in a subprocess exactly as a user types it, then
evaluates the checkpoint on the same 64 held-out test tasks (task seeds from 1,000,000, sampler seed 0) under two
protocols, so both published figures can be read off one table:

- `agentrl_eval`: `agentrl eval --env math --model RUN/checkpoint --episodes 64`, the model's official sampling
  settings and eval defaults (what a user runs after training);
- `train_sampling`: the training sampler (temperature 1.0, top-p 1.0, 64 new tokens), which is
  how bench/studies/learn_math.py produced the README's 0.86.

Writes docs/results/main_job_seeds.json: per seed the per-step train success, reward and entropy, and both held-out
successes with Wilson intervals, the mismatch KL(mu || pi_old) per step and the step and rollout seconds; across
seeds the mean, min, max and standard deviation. `--engine` picks the training sampler only: held-out evals run on
`--eval-engine` (hf, float32: the protocol of the five-seed study), so runs with other samplers compare on it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, ROOT, agentrl_command, command_line, read_jsonl, run_logged, write_json  # noqa: E402


def _sh(cmd: list[str], log: Path) -> float:
    """Run `cmd` with its output appended to `log`; fail loudly with the log's tail; return its wall seconds."""
    rc, seconds = run_logged(cmd, log)
    if rc != 0:
        tail = "\n".join(log.read_text().splitlines()[-20:])
        sys.exit(f"command failed (rc {rc}): {' '.join(cmd)}\n{tail}")
    return seconds


def _success(folder: Path) -> dict:
    overall = json.loads((folder / "results.json").read_text())["overall"]["success_rate"]
    return {k: overall[k] for k in ("estimate", "low", "high")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--engine", default="hf", help="the training sampler (hf: what the five-seed study ran; "
                        "auto: the README's command as typed, vLLM where installed)")
    parser.add_argument("--eval-engine", default="hf", help="the held-out evals' engine (the five-seed study: hf)")
    parser.add_argument("--runs", default="runs/main_job_seeds")
    parser.add_argument("--out", default=str(RESULTS / "main_job_seeds.json"))
    parser.add_argument("--plot-only", action="store_true", help="redraw the PNG from an existing --out JSON")
    args = parser.parse_args()
    if args.plot_only:
        plot(json.loads(Path(args.out).read_text()), Path(args.out).with_suffix(".png"))
        return

    runs = ROOT / args.runs
    runs.mkdir(parents=True, exist_ok=True)
    log = runs / "log.txt"
    agentrl = agentrl_command()
    per_seed = []
    for seed in args.seeds:
        run = runs / f"seed{seed}"
        walls = {}
        if not (run / "checkpoint").is_dir():
            walls["train_s"] = _sh(agentrl + ["run", "--env", "math", "--seed", str(seed), "--steps", str(args.steps),
                                              "--engine", args.engine, "--output", str(run), "--overwrite"], log)
        walls["eval_s"] = _sh(agentrl + ["eval", "--env", "math", "--model", str(run / "checkpoint"), "--episodes",
                                         str(args.episodes), "--engine", args.eval_engine,
                                         "--output", str(run / "eval_agentrl")], log)
        walls["eval_train_sampling_s"] = _sh(
            agentrl + ["eval", "--env", "math", "--model", str(run / "checkpoint"), "--episodes", str(args.episodes),
                       "--engine", args.eval_engine, "--temperature", "1.0", "--top-p", "1.0", "--top-k", "0",
                       "--max-new-tokens", "64", "--output", str(run / "eval_train_sampling")],
            log)
        rows = read_jsonl(run / "metrics.jsonl")
        per_seed.append({
            "seed": seed, **walls,
            "train_success": [r["success_rate"] for r in rows],
            "train_reward": [r["reward_mean"] for r in rows],
            "entropy": [r.get("entropy") for r in rows],
            "mismatch_kl_k3": [r.get("mismatch_kl_k3") for r in rows],
            "step_seconds": [r.get("step_seconds") for r in rows],
            "rollout_seconds": [r.get("rollout_seconds") for r in rows],
            "padding_waste": [r.get("padding_waste") for r in rows],
            "plan": json.loads((run / "plan.json").read_text()),
            "heldout_agentrl_eval": _success(run / "eval_agentrl"),
            "heldout_train_sampling": _success(run / "eval_train_sampling"),
        })
        print(f"seed {seed}: agentrl eval {per_seed[-1]['heldout_agentrl_eval']['estimate']:.3f}, "
              f"train sampling {per_seed[-1]['heldout_train_sampling']['estimate']:.3f}, {walls}", flush=True)

    summary = {}
    for key in ("heldout_agentrl_eval", "heldout_train_sampling"):
        values = [s[key]["estimate"] for s in per_seed]
        summary[key] = {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
                        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0, "values": values}
    result = {"command": command_line(__file__), "steps": args.steps,
              "episodes": args.episodes, "engine": args.engine, "eval_engine": args.eval_engine, "seeds": per_seed,
              "summary": summary}
    out = write_json(Path(args.out), result)
    plot(result, out.with_suffix(".png"))
    print(json.dumps(summary, indent=1))


def plot(result: dict, path: Path) -> None:
    """Train success per step for every seed (left) and each seed's held-out success with its interval (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (curves, bars) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    for s in result["seeds"]:
        curves.plot(range(len(s["train_success"])), s["train_success"], marker="o", ms=3, label=f"seed {s['seed']}")
    curves.set(xlabel="step", ylabel="train success (4 tasks x 8 episodes)", ylim=(0, 1),
               title="the main job, train success per step")
    curves.legend(fontsize=8)
    for offset, key, label in ((-0.15, "heldout_agentrl_eval", "agentrl eval"),
                               (0.15, "heldout_train_sampling", "training sampler")):
        xs = [i + offset for i in range(len(result["seeds"]))]
        est = [s[key]["estimate"] for s in result["seeds"]]
        err = [[e - s[key]["low"] for e, s in zip(est, result["seeds"])],
               [s[key]["high"] - e for e, s in zip(est, result["seeds"])]]
        bars.errorbar(xs, est, yerr=err, fmt="o", capsize=3, label=label)
    bars.axhline(result["summary"]["heldout_agentrl_eval"]["mean"], ls="--", lw=1, color="gray", label="mean")
    bars.set(xticks=range(len(result["seeds"])), xticklabels=[f"seed {s['seed']}" for s in result["seeds"]],
             ylim=(0, 1), ylabel=f"held-out success ({result['episodes']} tasks, 95% Wilson)",
             title="after 20 steps")
    bars.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
