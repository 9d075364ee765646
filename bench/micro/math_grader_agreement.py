"""Benchmark: how often our math grading agrees with the expected verdicts of public grader test suites.

The cases live in ``tests/data/math_grader_cases.jsonl`` (ported as data from huggingface/Math-Verify's tests, the
Hendrycks MATH equivalence tests and rllm's math reward tests; see the file's ``source`` fields). Each case has a
gold answer (or a list, or null), a response (a whole model reply, or a bare answer where ``response_is_answer``),
whether the suite requires the boxed format (``strict``), and the expected verdict.

A case is graded the way a user would grade it with this package: a reply through the env's `Grader` (strict when
the suite is), a bare answer straight through `answers_match`; any acceptable gold counts. Run against another
checkout (``PYTHONPATH=/path/to/checkout``) to measure an older version: without `Grader` the script falls back to
``extract_answer`` + ``answers_match``, the API that version had.

Usage: ``python bench/micro/math_grader_agreement.py [--show-disagreements]``.
Writes ``docs/results/math_grader_agreement.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import agentrl.envs.math as math_env

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, ROOT, write_json  # noqa: E402

CASES = ROOT / "tests" / "data" / "math_grader_cases.jsonl"
OUT = RESULTS / "math_grader_agreement.json"


def load_cases(path: Path = CASES) -> list[dict]:
    """The ported grader cases, one dict per line."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def verdict(case: dict, timeout_s: float) -> bool:
    """Our verdict on one case (see the module docstring)."""
    golds = case["gold"] if isinstance(case["gold"], list) else [case["gold"]]
    golds = [g for g in golds if g is not None]
    if case.get("response_is_answer"):
        return any(math_env.answers_match(g, case["response"], timeout_s=timeout_s) for g in golds)
    if hasattr(math_env, "Grader"):
        grader = math_env.Grader(strict=case.get("strict", False), verify_timeout_s=timeout_s)
        return grader(case["response"], golds).correct
    answer = math_env.extract_answer(case["response"])  # an older checkout: no Grader, no strict mode
    return any(math_env.answers_match(g, answer, timeout_s=timeout_s) for g in golds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show-disagreements", action="store_true")
    parser.add_argument("--timeout-s", type=float, default=30.0,
                        help="bound on one symbolic check (the env's default is 2 s; a busy machine then times out "
                             "on slow cases, which count as wrong)")
    args = parser.parse_args()
    cases = load_cases()
    agree, total, disagreements = Counter(), Counter(), []
    started = time.perf_counter()
    for case in cases:
        ours = verdict(case, args.timeout_s)
        total[case["suite"]] += 1
        agree[case["suite"]] += ours == case["expected"]
        if ours != case["expected"]:
            disagreements.append({"id": case["id"], "source": case["source"], "gold": case["gold"],
                                  "response": case["response"][:200], "expected": case["expected"], "ours": ours})
    seconds = time.perf_counter() - started
    results = {
        "checkout": str(Path(math_env.__file__).resolve().parents[2]),
        "per_suite": {s: {"cases": total[s], "agree": agree[s], "rate": agree[s] / total[s]} for s in sorted(total)},
        "all": {"cases": sum(total.values()), "agree": sum(agree.values()),
                "rate": sum(agree.values()) / sum(total.values())},
        "seconds": seconds,
        "disagreements": disagreements,
    }
    for suite, row in results["per_suite"].items():
        print(f"{suite:15s} {row['agree']:4d} / {row['cases']:4d} = {row['rate']:.2%}")
    print(f"{'all':15s} {results['all']['agree']:4d} / {results['all']['cases']:4d} = {results['all']['rate']:.2%}"
          f"   ({seconds:.0f} s, checkout {results['checkout']})")
    if args.show_disagreements:
        for d in disagreements:
            print(json.dumps(d, ensure_ascii=False))
    write_json(OUT, results, indent=2, ensure_ascii=False)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
