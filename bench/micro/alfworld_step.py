"""ALFWorld step latency (ours vs the TextWorld engine on the same games) and memory of 32 env runners.

Run: python bench/micro/alfworld_step.py   (the TextWorld column needs textworld[pddl]==1.7.0 and alfworld==0.4.2)
Writes docs/results/alfworld_step.json.
"""

import gc
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import psutil

from agentrl.envs.alfworld import AlfworldEnv, generate_game
from agentrl.envs.alfworld.textworld_engine import TextWorldGame, textworld_available, to_tw_pddl

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, time_calls, write_json  # noqa: E402

GAMES, STEPS, RUNNERS = 5, 40, 32


def commands_for(game, seed):
    """A fixed command sequence: random admissible commands from our engine (both engines accept the same ones)."""
    env, rng, out = AlfworldEnv(), random.Random(seed), []
    _, info = env.reset(options={"game": game})
    for _ in range(STEPS):
        command = rng.choice(info["admissible_actions"])
        out.append(command)
        _, _, terminated, _, info = env.step(command)
        if terminated:
            break
    return out


def time_steps(step, commands):
    return time_calls(step, [(command,) for command in commands])


def main():
    results = {}
    ours, theirs = [], []
    for seed in range(GAMES):
        game = generate_game(seed)
        commands = commands_for(game, seed)
        env = AlfworldEnv()
        env.reset(options={"game": game})
        ours += time_steps(env.step, commands)
        if textworld_available():
            real = TextWorldGame(to_tw_pddl(game))
            real.reset()
            theirs += time_steps(real.step, commands)
    results["ours_step_p50_ms"] = statistics.median(ours) * 1e3
    if theirs:
        results["textworld_step_p50_ms"] = statistics.median(theirs) * 1e3
        results["speedup_p50"] = results["textworld_step_p50_ms"] / results["ours_step_p50_ms"]

    t0 = time.perf_counter()
    for seed in range(200):
        generate_game(seed)
    results["generate_game_ms"] = (time.perf_counter() - t0) / 200 * 1e3

    gc.collect()
    process = psutil.Process()
    before = process.memory_info().rss
    # RSS moves in whole pages and reuses freed arenas, so also count Python allocations with tracemalloc.
    tracemalloc.start()
    runners = [AlfworldEnv() for _ in range(RUNNERS)]
    for i, env in enumerate(runners):
        env.reset(seed=i)
        for _ in range(10):
            env.step(env.expert_action())
    gc.collect()
    results["traced_32_runners_mib"] = tracemalloc.get_traced_memory()[0] / 2**20
    tracemalloc.stop()
    results["rss_32_runners_mib"] = (process.memory_info().rss - before) / 2**20
    results["rss_process_mib"] = process.memory_info().rss / 2**20

    write_json(RESULTS / "alfworld_step.json", results)
    for key, value in results.items():
        print(f"{key:24s} {value:10.3f}")


if __name__ == "__main__":
    main()
