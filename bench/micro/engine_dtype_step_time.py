"""The main job's step time with the vLLM engine sampling in float32 (the old default) vs bfloat16 (the new one).

Declared before its run (issue 32 item 3: the default changed, so the headline step time is reported before and
after): `agentrl run --env math --engine vllm --engine-dtype D --steps 4` as a user would type it, four runs
interleaved float32, bfloat16, float32, bfloat16 so that a change in the machine's load hits both arms alike. Per run:
the median step and rollout seconds over steps 1-3 (step 0 has no weight sync and warms caches) and the load average
around it; per arm the mean of its two runs' medians; the ratio float32 / bfloat16. No threshold: reported as
measured. Results: docs/results/engine_dtype_step_time.json.

    python bench/micro/engine_dtype_step_time.py [--steps 4] [--rounds 2]
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
from bench.harness import (  # noqa: E402
    RESULTS,
    ROOT,
    agentrl_command,
    command_line,
    load_1m,
    read_jsonl,
    repo_relative,
    write_json,
)


def one_run(dtype: str, steps: int, out: Path) -> dict:
    """One `agentrl run` of the main job with the vLLM engine in `dtype`; its step and rollout medians."""
    before, t0 = load_1m(), time.perf_counter()
    proc = subprocess.run(agentrl_command("run", "--env", "math", "--engine", "vllm", "--engine-dtype", dtype,
                                          "--steps", str(steps), "--output", str(out), "--overwrite"),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{dtype} run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "step_seconds" in r]
    later = rows[1:] or rows
    return {"dtype": dtype, "wall_s": round(time.perf_counter() - t0, 1),
            "step_s_median": round(statistics.median(r["step_seconds"] for r in later), 2),
            "rollout_s_median": round(statistics.median(r["rollout_seconds"] for r in later), 2),
            "kl_k3_max": max(r.get("kl_k3") or 0.0 for r in rows),
            "load_before": round(before, 2), "load_after": round(load_1m(), 2), "run": repo_relative(out)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--work", default=str(ROOT / "runs" / "engine_dtype_step_time"))
    args = ap.parse_args()
    runs = []
    for r in range(args.rounds):
        for dtype in ("float32", "bfloat16"):
            runs.append(one_run(dtype, args.steps, Path(args.work) / f"{dtype}_{r}"))
            print(json.dumps(runs[-1]), flush=True)
    arms = {d: {k: round(statistics.mean(x[k] for x in runs if x["dtype"] == d), 2)
                for k in ("step_s_median", "rollout_s_median")} for d in ("float32", "bfloat16")}
    result = {"command": command_line(__file__, []), "steps": args.steps, "rounds": args.rounds,
              "cpus": os.cpu_count(), "runs": runs, "arms": arms,
              "float32_over_bfloat16_step": round(
                  arms["float32"]["step_s_median"] / arms["bfloat16"]["step_s_median"], 2),
              "float32_over_bfloat16_rollout": round(
                  arms["float32"]["rollout_s_median"] / arms["bfloat16"]["rollout_s_median"], 2)}
    write_json(RESULTS / "engine_dtype_step_time.json", result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
