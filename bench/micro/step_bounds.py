"""How fast could a main-job run go on this machine? The compute floor of each run's steps at the measured matmul peak.

    python bench/micro/step_bounds.py runs/main_job_bf16/seed0 runs/main_job_bf16/seed1 runs/main_job_bf16/seed2

Issue 39 asks for the main job's 20 steps in <= 2 min. This reads what a finished run actually computed and prices
it at the bf16 square-matmul peak measured by `bench/micro/limits.py` (docs/results/limits.json), with no overhead of
any kind, by the usual FLOP counts (N = the model's parameters with its tied head, 134.5M for SmolLM2-135M):

- the update: 6 N T over the tokens T of every sample that carries a gradient (groups whose episodes all got the same
  reward skip their passes: `agentrl.training.step`), prompt and response;
- decode: 2 N per generated token;
- prefill: 2 N per prompt token, once per group (its 8 episodes share the prompt through the prefix cache).

Attention's own FLOPs and the optimizer step are left out, so the floor is lower than the truth: a goal below it
cannot be met on this machine by any software, and the ratio floor / measured is the whole step's achieved fraction
of the peak. Writes docs/results/step_bounds.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, command_line, read_jsonl, repo_relative, write_json  # noqa: E402


def run_bounds(run: Path, n_params: float, peak: float) -> dict:
    """The compute floor of one run's steps (seconds at `peak` FLOP/s) beside its measured step and rollout time."""
    groups: dict[tuple[int, int], list[dict]] = {}
    for t in read_jsonl(run / "trajectories.jsonl"):
        groups.setdefault((t["train_step"], t["group_id"]), []).append(t)
    trained = generated = prompts = 0
    for members in groups.values():
        mixed = len({t["total_return"] for t in members}) > 1
        for t in members:
            for turn in t["turns"]:
                generated += len(turn["generated_ids"])
                if mixed:
                    trained += len(turn["prompt_ids"]) + len(turn["generated_ids"])
        prompts += sum(len(turn["prompt_ids"]) for turn in members[0]["turns"])
    rows = read_jsonl(run / "metrics.jsonl")
    floor = {"update_s": 6 * n_params * trained / peak, "decode_s": 2 * n_params * generated / peak,
             "prefill_s": 2 * n_params * prompts / peak}
    floor["total_s"] = sum(floor.values())
    measured = {"steps": len(rows), "steps_s": sum(r["step_seconds"] for r in rows),
                "rollout_s": sum(r["rollout_seconds"] for r in rows)}
    return {"run": repo_relative(run), "trained_tokens": trained, "generated_tokens": generated,
            "prompt_tokens_per_group": prompts, "floor": floor, "measured": measured,
            "achieved_fraction_of_peak": floor["total_s"] / measured["steps_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--limits", type=Path, default=RESULTS / "limits.json")
    parser.add_argument("--goal-s", type=float, default=120.0, help="the goal for the run's steps (issue 39: 2 min)")
    parser.add_argument("--out", type=Path, default=RESULTS / "step_bounds.json")
    args = parser.parse_args()
    limits = json.loads(args.limits.read_text())
    peak = limits["peaks"]["square"]["bfloat16"]["best_gflops"] * 1e9
    n_params = limits["trainer"]["flop_params"]["N"]
    runs = [run_bounds(run, n_params, peak) for run in args.runs]
    for r in runs:
        floor, measured = r["floor"], r["measured"]
        print(f"{r['run']}: floor {floor['total_s']:.0f} s (update {floor['update_s']:.0f}, decode "
              f"{floor['decode_s']:.0f}, prefill {floor['prefill_s']:.0f}) against {measured['steps_s']:.0f} s "
              f"measured: {r['achieved_fraction_of_peak']:.0%} of the peak; the goal needs "
              f"{floor['total_s'] / args.goal_s:.0%}")
    write_json(args.out, {"command": command_line(__file__), "peak_bf16_gflops": peak / 1e9, "n_params": n_params,
                          "goal_s": args.goal_s, "runs": runs})


if __name__ == "__main__":
    main()
