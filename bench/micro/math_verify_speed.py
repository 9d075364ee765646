"""Benchmark: per-answer check time of `answers_match` against plain math-verify, and MathEnv step throughput.

Baseline (measured in the same run): math-verify called directly on the main thread with its default
signal-based timeouts, i.e. ``verify(parse(gold), parse(pred))``. We report our time and the ratio ours / baseline
for numeric answers (GSM8K golds vs extracted model answers) and for symbolic answers (LaTeX), both on the main
thread and from a worker thread (where the baseline cannot run at all).

Usage: ``python bench/micro/math_verify_speed.py [--n 2000]``. Writes ``docs/results/math_verify_speed.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

from math_verify import parse, verify
from tqdm import tqdm

from agentrl.envs.math import MathEnv, answers_match, load_problems

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, ROOT, time_calls, write_json  # noqa: E402

GSM8K_TEST = ROOT / ".." / "shared" / "data" / "gsm8k" / "test.jsonl"
OUT = RESULTS / "math_verify_speed.json"

SYMBOLIC = [
    (r"\frac{\sqrt{3}}{2}", r"\frac{\sqrt3}{2}"),
    ("2", r"\sqrt{4}"),
    (r"3\pi", r"3 \pi"),
    ("[2, 5)", "[2,5)"),
    (r"x^2 + 2x + 1", r"(x+1)^2"),
    (r"\frac{1}{2}", r"\sqrt{2}"),
]


def numeric_pairs(n: int) -> list[tuple[str, str]]:
    """GSM8K golds paired with typical model answers (equal with a different form, or off by one)."""
    if GSM8K_TEST.is_file():
        golds = [p.answer for p in load_problems(GSM8K_TEST)]
    else:  # fall back to generated problems so the script runs anywhere
        env = MathEnv(level=5)
        golds = [(env.reset(seed=s), env.problem.answer)[1] for s in range(500)]
    pairs = []
    for i in range(n):
        gold = golds[i % len(golds)]
        pairs.append((gold, f"{gold}.0" if i % 2 else str(float(gold) + 1)))
    return pairs


def baseline_check(gold: str, predicted: str) -> bool:
    """Plain math-verify on the main thread (signal-based timeouts)."""
    return verify(parse(f"\\boxed{{{gold}}}"), parse(f"\\boxed{{{predicted}}}"))


def time_per_call(fn, pairs: list[tuple[str, str]], label: str) -> float:
    """Median seconds per call over `pairs` (after one warm-up pass over a few)."""
    for gold, predicted in pairs[:3]:
        fn(gold, predicted)
    return statistics.median(time_calls(fn, tqdm(pairs, desc=label, leave=False)))


def in_thread(fn):
    """Run `fn` on a fresh thread and return its result (as a Ray actor or thread pool would)."""
    box = []
    worker = threading.Thread(target=lambda: box.append(fn()))
    worker.start()
    worker.join()
    return box[0]


def env_steps_per_second(level: int, n: int) -> float:
    """Reset + expert step episodes per second on procedural problems."""
    env = MathEnv(level=level)
    start = time.perf_counter()
    for seed in range(n):
        env.reset(seed=seed)
        env.step(env.expert_action())
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="numeric answer pairs to time")
    args = parser.parse_args()

    numeric = numeric_pairs(args.n)
    symbolic = SYMBOLIC * 10
    results = {
        "numeric_baseline_s": time_per_call(baseline_check, numeric, "baseline numeric"),
        "numeric_ours_s": time_per_call(answers_match, numeric, "ours numeric"),
        "numeric_ours_thread_s": in_thread(lambda: time_per_call(answers_match, numeric, "ours numeric (thread)")),
        "symbolic_baseline_s": time_per_call(baseline_check, symbolic, "baseline symbolic"),
        "symbolic_ours_s": time_per_call(answers_match, symbolic, "ours symbolic"),
        "symbolic_ours_thread_s": in_thread(lambda: time_per_call(answers_match, symbolic, "ours symbolic (thread)")),
        "episodes_per_s_level1": env_steps_per_second(1, 2000),
        "episodes_per_s_level5": env_steps_per_second(5, 2000),
    }
    for kind in ("numeric", "symbolic"):
        base = results[f"{kind}_baseline_s"]
        for variant in ("ours", "ours_thread"):
            ours = results[f"{kind}_{variant}_s"]
            results[f"{kind}_{variant}_ratio"] = ours / base
            print(
                f"{kind:8s} {variant:12s} {ours * 1e3:8.3f} ms/check   baseline {base * 1e3:8.3f} ms   "
                f"ratio {ours / base:6.3f}"
            )
    print(
        f"episodes/s (reset + expert step): level 1 {results['episodes_per_s_level1']:.0f}, "
        f"level 5 {results['episodes_per_s_level5']:.0f}"
    )
    write_json(OUT, results, indent=2)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
