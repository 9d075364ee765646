"""The code env's tasks against the expert and against SmolLM2-135M: does the expert solve every generated task, and
how often does the base model solve them, by difficulty? (Declared in docs/experiments/issue43.md.)

    python bench/studies/code_learning.py --expert-only                 # every family x level x split, 8 seeds each
    python bench/studies/code_learning.py --base-by-level --episodes 32 # agentrl eval of the base model at levels 1-5

The expert plays each task in the bubblewrap back-end: writes the reference solution.py, submits, and the hidden tests
grade it in a fresh sandbox. The base-model evals are `agentrl eval` runs in subprocesses (vLLM bf16, the model's
official sampling, sampler seed 0, the held-out test split from agentrl eval's default seeds); SFT and RL are
`learn_multiturn.py --envs code`. Results: docs/results/code_expert.json, docs/results/code_base_by_level.json.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, ROOT, agentrl_command, command_line, load_1m, write_json  # noqa: E402


def expert_sweep(seeds: int) -> dict:
    """Every family x level x split, `seeds` tasks each, played by the expert; failures listed by task id."""
    from agentrl.envs.code import CodeEnv
    from agentrl.envs.code.tasks import FAMILIES, LEVELS

    rows, failures = [], []
    combos = [(f, lv, sp) for f in sorted(FAMILIES) for lv in LEVELS for sp in ("train", "test")]
    t0 = time.perf_counter()
    for family, level, split in tqdm(combos, desc="expert"):
        env = CodeEnv(family=family, difficulty=level, split=split)
        try:
            for seed in range(seeds):
                env.reset(seed=seed)
                while True:
                    _, reward, terminated, truncated, info = env.step(env.expert_action())
                    if terminated or truncated:
                        break
                rows.append(reward)
                if not info.get("success"):
                    failures.append({"task_id": env.task.task_id, "details": info.get("test_details")})
        finally:
            env.close()
    return {"episodes": len(rows), "solved": sum(r == 1.0 for r in rows), "failures": failures,
            "seconds": round(time.perf_counter() - t0, 1), "families": len(FAMILIES), "levels": list(LEVELS)}


def base_by_level(model: str, episodes: int, work: Path, engine: str, engine_dtype: str) -> dict:
    """`agentrl eval` of `model` at each level, the code recipes' budgets."""
    from agentrl.recipes.evaluate import load_results

    out = {}
    for level in (1, 2, 3, 4, 5):
        folder = work / f"level{level}"
        command = agentrl_command(
            "eval", "--env", "code", "--model", model, "--episodes", str(episodes), "--seed", "0", "--max-turns", "4",
            "--max-new-tokens", "256", "--env-arg", f"difficulty={level}", "--env-arg", 'expert_format="text"',
            "--env-arg", "max_turns=4", "--engine", engine, "--engine-dtype", engine_dtype, "--output", str(folder))
        print(f"== level {level}: {' '.join(command[2:])}", flush=True)
        t0 = time.perf_counter()
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        (work / f"level{level}.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            out[f"level{level}"] = {"rc": proc.returncode, "log_tail": (proc.stdout + proc.stderr)[-1500:]}
            continue
        r = load_results(folder)["overall"]
        out[f"level{level}"] = {"success_rate": r["success_rate"], "reward_mean": r["reward_mean"],
                                "turns_mean": r["turns_mean"]["estimate"], "truncated_frac": r["truncated_frac"],
                                "seconds": round(time.perf_counter() - t0, 1)}
        s = r["success_rate"]
        print(f"   success {s['estimate']:.3f} [{s['low']:.3f}, {s['high']:.3f}], "
              f"reward {r['reward_mean']['estimate']:.3f}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--expert-only", action="store_true")
    parser.add_argument("--base-by-level", action="store_true")
    parser.add_argument("--seeds", type=int, default=8, help="expert tasks per family x level x split")
    parser.add_argument("--episodes", type=int, default=32, help="held-out tasks per level (base model)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--engine", default="vllm")
    parser.add_argument("--engine-dtype", default="bfloat16")
    parser.add_argument("--work", default=str(ROOT / "runs" / "code_base_by_level"))
    args = parser.parse_args()
    if not (args.expert_only or args.base_by_level):
        parser.error("say what to run: --expert-only and/or --base-by-level")
    command = command_line(__file__)
    if args.expert_only:
        report = {"command": command, "load_avg_1m_at_start": round(load_1m(), 2)}
        report |= expert_sweep(args.seeds)
        write_json(RESULTS / "code_expert.json", report, end="\n")
        print(f"expert: {report['solved']}/{report['episodes']} solved in {report['seconds']} s")
    if args.base_by_level:
        work = Path(args.work)
        work.mkdir(parents=True, exist_ok=True)
        report = {"command": command, "model": args.model, "load_avg_1m_at_start": round(load_1m(), 2)}
        report["levels"] = base_by_level(args.model, args.episodes, work, args.engine, args.engine_dtype)
        report["load_avg_1m_at_end"] = round(load_1m(), 2)
        write_json(RESULTS / "code_base_by_level.json", report, end="\n")


if __name__ == "__main__":
    main()
