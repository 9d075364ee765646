"""ALFWorld diagnosis (issue 32 item 4): how long the expert's plan is for each task RL trains and is tested on, and,
given an RL run's trajectories, which tasks gave groups with mixed outcomes (the only groups that carry advantage).

    python bench/studies/alfworld_task_difficulty.py                                   # expert plan lengths, no model
    python bench/studies/alfworld_task_difficulty.py --run runs/learn_multiturn/alfworld/rl     # plus a run's groups

The tasks are configs/alfworld-rl.yaml's (pick_and_place_simple): the RL train tasks (split ``train``, seeds 10000 to
10000 + 4 x 40 - 1, the recipe's 40 steps of 4 tasks) and the confirmatory held-out tasks (split ``valid_unseen``,
seeds from 2,000,000, the 384 of confirm_rl_gain.py). For each, the hand-coded expert (`envs/alfworld/expert.py`,
which searches receptacles in the order of the catalogue's placement prior) is played with a 50-step budget; its
number of steps is a proxy for how far the object is from where a policy trained on expert demonstrations looks
first. Reported: the distribution of plan lengths and how many exceed the recipe's 15-step budget.

With ``--run``, the run's ``trajectories.jsonl`` is grouped by task (env seed): per group its episodes and
successes, whether it was mixed (some but not all succeeded), and the mixed share and mean success per plan-length
bin. Writes docs/results/alfworld_task_difficulty.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
from pathlib import Path

import yaml

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, ROOT, command_line, write_json  # noqa: E402

BINS = ((1, 5), (6, 9), (10, 15), (16, 50))


def _bin(n: int) -> str:
    return next(f"{lo}-{hi}" for lo, hi in BINS if lo <= n <= hi) if n <= 50 else "unsolved"


def expert_lengths(split: str, seeds: range, task_types: list[str]) -> dict[int, int]:
    """The expert's steps to the goal per env seed (51: not reached within 50 steps)."""
    from agentrl.envs.alfworld.env import AlfworldEnv

    env = AlfworldEnv(split=split, max_steps=50, task_types=task_types)
    out = {}
    for seed in seeds:
        env.reset(seed=seed)
        steps, done, won = 0, False, False
        while not done:
            _, _, terminated, truncated, info = env.step(env.expert_action())
            steps, done, won = steps + 1, terminated or truncated, bool(info.get("won"))
        out[seed] = steps if won else 51
    return out


def summary(lengths: dict[int, int], budget: int) -> dict:
    """Distribution of plan lengths: per-length counts, bins, median, and the share beyond the step budget."""
    values = list(lengths.values())
    return {"tasks": len(values), "median": statistics.median(values), "mean": round(statistics.fmean(values), 2),
            "by_length": dict(sorted(collections.Counter(values).items())),
            "by_bin": dict(collections.Counter(_bin(v) for v in values)),
            "over_budget": sum(v > budget for v in values)}


def run_groups(run: Path, lengths: dict[int, int]) -> dict:
    """Per plan-length bin: groups, mixed groups, mean success, from a run's trajectories."""
    groups: dict[int, list[bool]] = collections.defaultdict(list)
    for line in (run / "trajectories.jsonl").read_text().splitlines():
        row = json.loads(line)
        groups[row["seed"]].append(bool(row["success"]))
    table: dict = {}
    for seed, outcomes in groups.items():
        b = _bin(lengths[seed]) if seed in lengths else "unknown"
        cell = table.setdefault(b, {"groups": 0, "mixed": 0, "episodes": 0, "successes": 0})
        cell["groups"] += 1
        cell["mixed"] += 0 < sum(outcomes) < len(outcomes)
        cell["episodes"] += len(outcomes)
        cell["successes"] += sum(outcomes)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-tasks", type=int, default=160)
    parser.add_argument("--test-tasks", type=int, default=384)
    parser.add_argument("--run", default="", help="an ALFWorld RL run folder (trajectories.jsonl)")
    parser.add_argument("--out", default=str(RESULTS / "alfworld_task_difficulty.json"))
    args = parser.parse_args()
    recipe = yaml.safe_load((ROOT / "configs" / "alfworld-rl.yaml").read_text())
    task_types, budget = recipe["env"]["kwargs"]["task_types"], recipe["env"]["max_turns"]
    offset = recipe["env"]["seed_offset"]
    train = expert_lengths("train", range(offset, offset + args.train_tasks), task_types)
    test = expert_lengths("valid_unseen", range(2_000_000, 2_000_000 + args.test_tasks), task_types)
    result = {"command": command_line(__file__, ["--run", args.run] if args.run else []),
              "task_types": task_types, "budget": budget,
              "train": summary(train, budget), "heldout": summary(test, budget)}
    if args.run:
        result["run_groups_by_plan_length"] = run_groups(Path(args.run), train)
    write_json(Path(args.out), result)
    print(json.dumps({k: v for k, v in result.items() if k != "command"}, indent=1))


if __name__ == "__main__":
    main()
