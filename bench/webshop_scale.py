"""WebShop at scale: index build time and size, step latency, and memory of 32 runners sharing one catalogue.

    python bench/webshop_scale.py                      # 1.18M generated products (minutes to build, once)
    python bench/webshop_scale.py --num-products 20000 # quick

Memory: runners are separate processes (as in a runner pool), each opening the catalogue and index from the cache
and playing expert episodes. We report the summed PSS (proportional set size: shared pages split between the
processes that map them) of 1 runner and of 32 concurrent runners, each against as many bare processes with
the same imports measured in the same run, and the ratio of the WebShop-attributable memory (runners minus bare
processes), the number the issue's target (<= 1.3x) is about: with per-env copies it would be about 32x.
Results go to bench/results/webshop_scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil

RESULTS = Path(__file__).resolve().parent / "results"


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def runner(cache_dir: str, num_products: int, episodes: int, bare: bool) -> None:
    """A runner process: open the shared catalogue, play expert episodes, report ready, wait for stdin to close."""
    from agentrl.envs.webshop import WebShopEnv

    if not bare:
        env = WebShopEnv(num_products=num_products, cache_dir=cache_dir)
        for seed in range(episodes):
            env.reset(seed=seed + os.getpid())
            for _ in range(env.max_steps):
                _, _, terminated, truncated, _ = env.step(env.expert_action())
                if terminated or truncated:
                    break
    print("ready", flush=True)
    sys.stdin.read()


def pss_of_runners(n: int, args: argparse.Namespace, bare: bool) -> float:
    cmd = [sys.executable, __file__, "--runner", "--cache-dir", args.cache_dir, "--num-products",
           str(args.num_products), "--episodes", str(args.episodes)] + (["--bare"] if bare else [])
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(n)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        return sum(psutil.Process(p.pid).memory_full_info().pss for p in procs) / 2**20
    finally:
        for p in procs:
            p.stdin.close()
            p.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-products", type=int, default=1_180_000)
    parser.add_argument("--cache-dir", default=str(RESULTS / "webshop_cache"))
    parser.add_argument("--runners", type=int, default=32)
    parser.add_argument("--episodes", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200, help="timed search and item-page steps")
    parser.add_argument("--runner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.runner:
        runner(args.cache_dir, args.num_products, args.episodes, args.bare)
        return

    from agentrl.envs.webshop import WebShopEnv, WebShopResource

    started = time.perf_counter()
    resource = WebShopResource.build(num_products=args.num_products, cache_dir=args.cache_dir)
    open_seconds = time.perf_counter() - started
    meta = resource.metadata()
    bm25_bytes = folder_size(resource.folder / "bm25") + sum(
        (resource.folder / f).stat().st_size for f in ("vocab_hash.npy", "vocab_ids.npy"))
    disk_mib = folder_size(resource.folder) / 2**20
    print(f"catalogue {meta['num_products']:,} products, {meta['num_goals']:,} goals; built in "
          f"{meta['build_seconds']:.0f}s (this call {open_seconds:.1f}s); on disk {disk_mib:.0f} MiB, "
          f"BM25 index {bm25_bytes / 2**20:.0f} MiB")

    env = WebShopEnv(shared=resource)
    search_ms, item_ms = [], []
    for i in range(args.steps):
        env.reset(seed=i)
        query = env.goal["instruction_text"] if i % 2 else env.goal["name"]
        t = time.perf_counter()
        env.step(f"search[{query}]")
        search_ms.append((time.perf_counter() - t) * 1e3)
        first = next(a for a in env.admissible_actions() if a.startswith("click[b0"))
        t = time.perf_counter()
        env.step(first)
        item_ms.append((time.perf_counter() - t) * 1e3)
    print(f"search step p50 {np.median(search_ms):.1f} ms (p90 {np.percentile(search_ms, 90):.1f}); "
          f"item-page step p50 {np.median(item_ms):.2f} ms (p90 {np.percentile(item_ms, 90):.2f})")

    # Shared-library pages are split between however many processes map them, so each runner count gets its
    # own bare baseline with the same number of processes.
    bare_one = pss_of_runners(1, args, bare=True)
    bare_many = pss_of_runners(args.runners, args, bare=True)
    one = pss_of_runners(1, args, bare=False)
    many = pss_of_runners(args.runners, args, bare=False)
    attributable_one = one - bare_one
    attributable_many = many - bare_many
    ratio = attributable_many / attributable_one
    print(f"PSS: 1 bare process {bare_one:.0f} MiB, {args.runners} bare {bare_many:.0f} MiB; 1 runner {one:.0f} MiB; "
          f"{args.runners} runners {many:.0f} MiB in all ({many / one:.1f}x of one, interpreters included)")
    print(f"WebShop-attributable memory: 1 runner {attributable_one:.0f} MiB, {args.runners} runners "
          f"{attributable_many:.0f} MiB -> ratio {ratio:.2f}x (target <= 1.3x; private copies would be "
          f"{args.runners}x)")

    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {
        "num_products": meta["num_products"], "num_goals": meta["num_goals"],
        "build_seconds": meta["build_seconds"], "disk_mib": folder_size(resource.folder) / 2**20,
        "bm25_index_mib": bm25_bytes / 2**20,
        "search_p50_ms": float(np.median(search_ms)), "item_p50_ms": float(np.median(item_ms)),
        "pss_bare_mib": bare_one, "pss_bare_many_mib": bare_many, "pss_one_mib": one, "pss_many_mib": many,
        "runners": args.runners,
        "attributable_ratio": ratio,
    }
    (RESULTS / "webshop_scale.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
