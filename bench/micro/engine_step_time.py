"""`agentrl run --env math --engine vllm` vs `--engine hf`: step and rollout seconds at the same settings, one run.

Both runs are the main job's defaults (SmolLM2-135M, 4 tasks x 8 episodes, 64 new tokens) for `--steps` steps,
run one after the other as subprocesses, as a user would type them. Reported per engine: the median step seconds
and rollout seconds over the steps after the first (step 0 has no weight sync and warms caches), the weight-sync
seconds, KL(mu || pi_old) (k3) and the reward. Load averages are recorded around each run. With `--steps 20` it is
also the main job's learning curve on both engines: reward and success per step (PNG), and each engine's trend (the
mean reward of the last five steps minus the first five). Results: docs/results/engine_step_time.json and .png.

    python bench/micro/engine_step_time.py [--steps 4] [--extra --group-size 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, ROOT, agentrl_command, load_1m, read_jsonl, repo_relative, write_json  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--engines", nargs="+", default=["hf", "vllm"])
    ap.add_argument("--work", default=str(ROOT / "runs" / "engine_step_time"),
                    help="run folders (kept: metrics, trajectories, curves)")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more `agentrl run` flags for both")
    args = ap.parse_args()
    summary = {}
    work = Path(args.work)
    for engine in args.engines:
        out = work / engine
        before, t0 = load_1m(), time.perf_counter()
        proc = subprocess.run(agentrl_command("run", "--env", "math", "--engine", engine, "--steps", str(args.steps),
                                              "--output", str(out), "--overwrite", *args.extra),
                              capture_output=True, text=True)
        metrics = out / "metrics.jsonl"
        rows = read_jsonl(metrics) if metrics.exists() else []
        if proc.returncode != 0:  # keep what the run measured; say how it ended
            print(f"{engine} run ended with code {proc.returncode}: {proc.stderr.strip()[-500:]}", flush=True)
            if not rows:
                raise SystemExit(f"{engine} run failed before its first step:\n{proc.stderr[-3000:]}")
        later = rows[1:] or rows
        summary[engine] = {
            "wall_s": round(time.perf_counter() - t0, 1),
            "step_s_median": round(statistics.median(r["step_seconds"] for r in later), 2),
            "rollout_s_median": round(statistics.median(r["rollout_seconds"] for r in later), 2),
            "weight_sync_s_median": round(statistics.median(r.get("weight_sync_seconds", 0.0) for r in later), 3),
            "kl_k3_max": max(r.get("kl_k3") or 0.0 for r in rows),
            "reward_mean": [round(r["reward_mean"], 3) for r in rows],
            "success_rate": [round(r["success_rate"], 3) for r in rows],
            "reward_trend": round(statistics.mean(r["reward_mean"] for r in rows[-5:])
                                  - statistics.mean(r["reward_mean"] for r in rows[:5]), 3),
            "prefix_cache_hit_rate": [r.get("prefix_cache_hit_rate") for r in rows],
            "load_before": before, "load_after": load_1m(),
            # Relative to the repository where it lies there: results in git must not name this machine's paths.
            "exit_code": proc.returncode, "run": repo_relative(out),
        }
        print(engine, json.dumps(summary[engine]), flush=True)
    if {"hf", "vllm"} <= summary.keys():
        summary["hf_over_vllm_step_time"] = round(summary["hf"]["step_s_median"] / summary["vllm"]["step_s_median"], 2)
        summary["hf_over_vllm_rollout_time"] = round(
            summary["hf"]["rollout_s_median"] / summary["vllm"]["rollout_s_median"], 2)
    print(json.dumps(summary, indent=1))
    RESULTS.mkdir(exist_ok=True)
    plot(summary, RESULTS / "engine_step_time.png")
    write_json(RESULTS / "engine_step_time.json", {"steps": args.steps, "extra": args.extra, "cpus": os.cpu_count(),
                                                   **summary})


def plot(summary: dict, png: Path) -> None:
    """Reward and success per step of each engine's run (the main job's learning curve)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for engine in ("hf", "vllm"):
        if engine in summary:
            for ax, key in zip(axes, ("reward_mean", "success_rate")):
                ax.plot(range(len(summary[engine][key])), summary[engine][key], marker="o", ms=3,
                        label=f"{engine} (step {summary[engine]['step_s_median']} s)")
    for ax, title in zip(axes, ("reward (train rollouts)", "success (train rollouts)")):
        ax.set_title(f"agentrl run --env math: {title}")
        ax.set_xlabel("step")
        ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
