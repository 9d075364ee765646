"""Partial rollouts on vs off in async mode, for long multi-turn episodes: ALFWorld with the benchmark's 50-step budget
(issue 44, item 3).

    python bench/micro/partial_rollouts.py [--steps 8] [--repeats 2] [--model M] [--extra ARGS...]
    python bench/micro/partial_rollouts.py --smoke     # a tiny run of each arm: checks the script, measures nothing
    python bench/micro/partial_rollouts.py --from-sft --extra --context.max-context-tokens 3072
                                                       # from an ALFWorld SFT policy (configs/alfworld-sft.yaml,
                                                       # trained once into <runs>/sft) with configs/alfworld-rl.yaml

Runs `agentrl run --env alfworld --env-arg max_steps=50 --max-turns 50 --async` (staleness bound 1), once as it is
(``off``: each step's rollout waits for its own slowest episode, the next step's episodes start after it) and once
with ``--scheduler.partial-rollouts`` (``on``: one stream of episodes across steps and weight updates, a step trains on
the first groups to complete, turns older than the bound leave the loss; `agentrl.rollout.partial`), interleaved (off,
on, off, on, ...) so both see the same machine state. The first step is left out (warm-up; neither arm has anything
to overlap yet). Per run, over the remaining steps:

* ``median_step_s`` and ``wall_s`` (the whole command);
* throughput: turns in the loss per second of step time (``loss_turns_per_s``: a partial rollout's stale turns do not
  count) and the env steps of every trained episode per second (``env_steps_per_s``), from trajectories.jsonl;
* what partial rollouts cost: the share of trained turns masked as stale, the mean per-turn staleness, and the
  episodes whose turns were sampled by more than one policy version (``crossed_frac``: both arms, since async mode
  without partial rollouts also lets an episode's later turns sample from newer weights).

With ``--from-sft`` both arms start from one SFT checkpoint (trained once into ``<runs>/sft``) and run the ALFWorld RL
recipe (`configs/alfworld-rl.yaml`: its task type, groups and objective) with the budget raised to ``--max-turns``:
the base model runs every episode to the budget, so only a policy whose episodes end at different turns has
stragglers for partial rollouts to hide.

Per arm: the median over runs; the ratio on / off of the throughputs. Held-out success at equal wall time is a run of
its own (issue 44's declared experiments), not this script's. Results: docs/results/partial_rollouts.json (the smoke
mode writes under runs/ only).
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

ARMS = {"off": ["--async"], "on": ["--async", "--scheduler.partial-rollouts"]}
SMOKE = ["--model", "tiny-qwen3", "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "8",
         "--context.max-context-tokens", "1024"]
"""The smoke mode's run: a random 2-layer model, 2 tasks x 2 episodes a step, a few tokens per turn."""


def run_stats(out: Path, steps: list[dict]) -> dict:
    """Throughput and staleness of one run, over its steps after the first."""
    kept = {r["step"] for r in steps[1:]}
    seconds = sum(r["step_seconds"] for r in steps[1:])
    trained = [t for t in read_jsonl(out / "trajectories.jsonl") if t.get("train_step") in kept]
    turns = [(u, t) for t in trained for u in t["turns"]]
    loss_turns = sum(not u.get("stale", False) for u, _ in turns)
    ages = [t["train_step"] - (t["policy_version"] if u.get("policy_version") is None else u["policy_version"])
            for u, t in turns]
    crossed = sum(len({u.get("policy_version") for u in t["turns"]}) > 1 for t in trained)
    return {"episodes": len(trained), "turns": len(turns), "loss_turns": loss_turns,
            "loss_turns_per_s": loss_turns / seconds, "env_steps_per_s": len(turns) / seconds,
            "stale_turn_frac": 1 - loss_turns / len(turns) if turns else 0.0,
            "turn_staleness_mean": sum(ages) / len(ages) if ages else 0.0,
            "crossed_frac": crossed / len(trained) if trained else 0.0}


def one_run(arm: str, k: int, args) -> dict:
    """One `agentrl run` of `arm`: its step seconds, wall seconds, throughput and staleness."""
    out = ROOT / args.runs / f"{arm}{k}"
    start = (["--config", str(ROOT / "configs" / "alfworld-rl.yaml"), "--model", str(args.sft_checkpoint)]
             if args.sft_checkpoint else ["--env", "alfworld"])
    cmd = agentrl_command("run", *start, "--env-arg", f"max_steps={args.max_turns}", "--max-turns",
                          str(args.max_turns), "--steps", str(args.steps), "--seed", str(args.seed), "--output",
                          str(out), "--overwrite", "--save-trajectories", *ARMS[arm], *args.extra)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=os.environ.copy())
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "step_seconds" in r]
    if len(rows) < 2:
        sys.exit(f"{out}: {len(rows)} step rows in metrics.jsonl; need 2 or more (the first is left out)")
    steps = [r["step_seconds"] for r in rows]
    return {"arm": arm, "run": k, "wall_s": wall, "step_seconds": steps, "median_step_s": statistics.median(steps[1:]),
            **run_stats(out, rows), "load_avg_1m": load_1m()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-turns", type=int, default=50, help="the episode budget: env max_steps and max turns")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", default="runs/partial_rollouts")
    ap.add_argument("--out", default=str(RESULTS / "partial_rollouts.json"))
    ap.add_argument("--smoke", action="store_true",
                    help="tiny-qwen3, 2 steps of 2 x 2 episodes, a 4-step budget, one run per arm; results under runs/")
    ap.add_argument("--from-sft", action="store_true",
                    help="start both arms from an ALFWorld SFT checkpoint with configs/alfworld-rl.yaml")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more `agentrl run` arguments, for both arms")
    args = ap.parse_args()
    if args.smoke:
        args.steps, args.repeats, args.max_turns = 2, 1, 4
        args.runs, args.out, args.extra = "runs/partial_rollouts_smoke", str(ROOT / "runs" / "partial_rollouts_smoke"
                                                                             / "result.json"), SMOKE + args.extra
    if args.steps < 2:
        ap.error("--steps must be >= 2 (the first step is left out)")
    args.sft_checkpoint = None
    sft_phase = None
    if args.from_sft:
        sys.path.insert(0, str(ROOT / "bench" / "studies"))
        from learn_multiturn import sft_once

        work = ROOT / args.runs
        work.mkdir(parents=True, exist_ok=True)
        sft_phase = sft_once("alfworld", work)
        args.sft_checkpoint = work / "sft" / "checkpoint"
        if not args.sft_checkpoint.is_dir():
            sys.exit(f"SFT left no checkpoint: see {work / 'sft.log'}")
    runs = []
    for k in range(args.repeats):
        for arm in ARMS:
            runs.append(one_run(arm, k, args))
            r = runs[-1]
            print(f"{arm} #{k}: median step {r['median_step_s']:.1f} s, {r['loss_turns_per_s']:.2f} loss turns/s, "
                  f"stale {r['stale_turn_frac']:.2f}, crossed {r['crossed_frac']:.2f}, wall {r['wall_s']:.0f} s",
                  flush=True)
    keys = ("median_step_s", "loss_turns_per_s", "env_steps_per_s", "stale_turn_frac", "turn_staleness_mean",
            "crossed_frac")
    arms = {arm: {key: statistics.median(r[key] for r in runs if r["arm"] == arm) for key in keys} for arm in ARMS}
    result = {"command": command_line(__file__), "steps": args.steps, "max_turns": args.max_turns,
              "smoke": args.smoke, "from_sft": args.from_sft, "sft_phase": sft_phase, "cpus": os.cpu_count(),
              "runs": runs, "arms": arms,
              "on_over_off": {key: arms["on"][key] / arms["off"][key] if arms["off"][key] else None
                              for key in ("median_step_s", "loss_turns_per_s", "env_steps_per_s")}}
    write_json(Path(args.out), result)
    print(json.dumps({k: result[k] for k in ("arms", "on_over_off")}, indent=1))


if __name__ == "__main__":
    main()
