"""Benchmark: WebShop reward parity with an independent re-implementation of the original's scoring functions.

Purchases come from ``tests/webshop_reference.generate_purchases`` on a generated catalogue whose records carry the
title nouns a cached catalogue stores (tagged in batches at build time, as the env scores them): expert purchases,
partial option matches, same-query and random products, over-budget prices, and goals re-spelled as people write
them ("gluten-free" vs "gluten free", plurals, shades), as synthetic (name -> value) and human (list) goals. For each
we compare ``agentrl.envs.webshop.score`` with ``tests/webshop_reference.ref_get_reward`` (which follows
princeton-nlp/WebShop ``engine/goal.py`` and uses spaCy's full pipeline for nouns) for exact float equality, and
report the rate, the same rate with the dependency-free noun heuristic, and, with ``--baseline FILE``, the rate of
an older ``reward.py`` (e.g. ``git show <rev>:envs/webshop/reward.py > /tmp/old_reward.py``).

Usage: ``python bench/micro/webshop_reward_parity.py [--purchases 10000] [--products 2000]``.
Writes ``docs/results/webshop_reward_parity.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, ROOT, write_json  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))
from webshop_reference import generate_purchases, ref_get_reward  # noqa: E402

from agentrl.envs.webshop import reward  # noqa: E402

OUT = RESULTS / "webshop_reward_parity.json"
KINDS = ("expert", "partial options", "same query", "random product", "over budget", "respelled synthetic",
         "respelled human")


def _load_baseline(path: str):
    spec = importlib.util.spec_from_file_location("baseline_reward", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module.score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--purchases", type=int, default=10_000)
    parser.add_argument("--products", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline", help="an older reward.py whose score(goal, product, options) to compare too")
    args = parser.parse_args()

    baseline = _load_baseline(args.baseline) if args.baseline else None
    equal, equal_heuristic, equal_baseline = Counter(), Counter(), Counter()
    per_kind, mismatches = Counter(), []
    started = time.perf_counter()
    purchases = generate_purchases(args.products, args.seed, args.purchases, stored_nouns=True)
    for n, (goal, product, options) in enumerate(purchases):
        kind = KINDS[n % len(KINDS)]
        per_kind[kind] += 1
        expected = ref_get_reward(product, goal, product["price"], options)
        ours = reward.score(goal, product, options)  # the nouns stored at catalogue build, as the env scores
        equal[kind] += ours == expected
        if ours != expected and len(mismatches) < 10:
            mismatches.append({"goal": goal, "product": product["asin"], "options": options, "ours": ours,
                               "reference": expected})
        equal_heuristic[kind] += reward.score(goal, product, options, tagger="heuristic") == expected
        if baseline is not None:
            equal_baseline[kind] += baseline(goal, product, options) == expected
    seconds = time.perf_counter() - started
    total = sum(per_kind.values())
    results = {
        "purchases": total,
        "products": args.products,
        "seconds": seconds,
        "parity_spacy": sum(equal.values()) / total,
        "parity_heuristic": sum(equal_heuristic.values()) / total,
        "per_kind": {k: {"n": per_kind[k], "spacy": equal[k] / per_kind[k], "heuristic": equal_heuristic[k] /
                         per_kind[k]} for k in KINDS},
        "mismatches": mismatches,
    }
    if baseline is not None:
        results["parity_baseline"] = sum(equal_baseline.values()) / total
        for k in KINDS:
            results["per_kind"][k]["baseline"] = equal_baseline[k] / per_kind[k]
    for k in KINDS:
        row = results["per_kind"][k]
        extra = f"  baseline {row['baseline']:.4f}" if baseline is not None else ""
        print(f"{k:20s} n={row['n']:5d}  spacy {row['spacy']:.4f}  heuristic {row['heuristic']:.4f}{extra}")
    print(f"all {total} purchases: parity {results['parity_spacy']:.4%} (spaCy nouns), "
          f"{results['parity_heuristic']:.4%} (heuristic nouns)"
          + (f", baseline {results['parity_baseline']:.4%}" if baseline is not None else "")
          + f"  [{seconds:.0f} s]")
    write_json(OUT, results, indent=2, default=str)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
