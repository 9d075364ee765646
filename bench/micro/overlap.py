"""One-step-off (async) rollouts against lockstep on this machine: does overlapping the next step's rollout with this
step's update pay when the engine and the trainer share the same cores? (issue 39, item 4)

    python bench/micro/overlap.py [--steps 6] [--repeats 2] [--extra ARGS...]

Runs the main job as the README types it (`agentrl run --env math`, every default: vLLM's CPU build in bfloat16
where installed, the trainer's `auto` precision), `--steps` steps, lockstep and with `--async` (staleness 1: the
rollout of step k+1 runs while step k trains; MiniRL's token TIS corrects the one-version lag), interleaved
(lockstep, async, lockstep, async, ...) so both see the same machine state. Each run's step seconds come from its
metrics.jsonl; the first step (warm-up, and async's first rollout has nothing to overlap) is left out. Reported:
per run the median step seconds over the rest and the 20-step projection; per arm the median over runs; the ratio
async / lockstep. Results: docs/results/overlap.json.
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
from bench.harness import RESULTS, ROOT, agentrl_command, command_line, load_1m, read_jsonl, write_json  # noqa: E402

ARMS = {"lockstep": [], "async": ["--async"]}


def one_run(arm: str, k: int, args) -> dict:
    """One `agentrl run` of `arm`; its step seconds (all steps) and wall seconds."""
    out = ROOT / args.runs / f"{arm}{k}"
    cmd = agentrl_command("run", "--env", "math", "--steps", str(args.steps), "--seed", str(args.seed), "--output",
                          str(out), "--overwrite", *ARMS[arm], *args.extra)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=os.environ.copy())
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
    rows = read_jsonl(out / "metrics.jsonl")
    steps = [r["step_seconds"] for r in rows]
    return {"arm": arm, "run": k, "wall_s": wall, "step_seconds": steps,
            "rollout_seconds": [r.get("rollout_seconds") for r in rows],
            "median_step_s": statistics.median(steps[1:]), "load_avg_1m": load_1m()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", default="runs/overlap")
    ap.add_argument("--out", default=str(RESULTS / "overlap.json"))
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more `agentrl run` arguments, for both arms")
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("--steps must be >= 2 (the first step is left out)")
    runs = []
    for k in range(args.repeats):
        for arm in ARMS:
            runs.append(one_run(arm, k, args))
            print(f"{arm} #{k}: median step {runs[-1]['median_step_s']:.1f} s, wall {runs[-1]['wall_s']:.0f} s",
                  flush=True)
    arms = {arm: statistics.median(r["median_step_s"] for r in runs if r["arm"] == arm) for arm in ARMS}
    result = {"command": command_line(__file__), "steps": args.steps,
              "cpus": os.cpu_count(), "runs": runs, "median_step_s": arms,
              "async_over_lockstep": arms["async"] / arms["lockstep"]}
    write_json(Path(args.out), result)
    print(json.dumps({k: result[k] for k in ("median_step_s", "async_over_lockstep")}, indent=1))


if __name__ == "__main__":
    main()
