"""WebShop at scale: index build time and size, step latency, and the memory of 32 runners sharing one catalogue.

    python bench/micro/webshop_scale.py                       # 1.18M generated products (about 6 min to build, once)
    python bench/micro/webshop_scale.py --num-products 20000  # quick

A runner is one episode in flight (a pool slot), not a process: agentrl's runner pool hosts several envs per Ray actor
process, all holding the one `WebShopResource` of that process, and processes on a node share the memory-mapped
catalogue and index through the page cache. Every layout below plays the SAME episodes (the same goals, each
episode a search for the instruction text followed by the expert), so they touch the same catalogue pages and the
comparison measures copies, not different workloads:

* 1 runner: one process, one env, playing all ``runners x episodes`` episodes one after the other;
* 1 process: one process, ``runners`` envs on one worker thread each (as `EnvHost` pins slots to threads), every
  env playing ``episodes`` episodes, all of them in flight at once;
* N processes: ``processes`` processes of ``runners / processes`` envs each, the same way;
* optionally (``--per-process``) one process per runner, the layout of frameworks that copy state per env.

For each layout we read RSS, PSS (shared pages split between the processes mapping them) and USS (pages no other
process maps) with psutil's ``memory_full_info``, and the anonymous (heap) part of RSS from ``smaps_rollup``. All
layouts get a baseline of as many bare processes (same imports, no catalogue) measured in the same run; a layout's
WebShop-attributable PSS is its PSS minus that baseline. The issue's target: 32 runners <= 1.3x one runner.
The benchmark's parent process never maps the catalogue, so it does not take a share of the children's PSS.
Results go to docs/results/webshop_scale.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import psutil

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, write_json  # noqa: E402

MIB = 2**20


# ----------------------------------------------------------------------------------------------- child roles
def folder_size(folder: Path) -> int:
    """Bytes of all files under `folder`."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def prepare(args: argparse.Namespace) -> dict[str, Any]:
    """Build (or open) the catalogue, then time search and item-page steps. Runs in a child process."""
    from agentrl.envs.webshop import WebShopEnv, WebShopResource

    started = time.perf_counter()
    resource = WebShopResource.build(num_products=args.num_products, cache_dir=args.cache_dir)
    open_seconds = time.perf_counter() - started
    meta = resource.metadata()
    bm25_bytes = folder_size(resource.folder / "bm25") + sum(
        (resource.folder / f).stat().st_size for f in ("vocab_hash.npy", "vocab_ids.npy"))
    env = WebShopEnv(shared=resource)
    search_ms, item_ms = [], []
    for i in range(args.steps):
        env.reset(seed=i)
        query = env.goal["instruction_text"] if i % 2 else env.goal["name"]
        t = time.perf_counter()
        env.step(f"search[{query}]")
        search_ms.append((time.perf_counter() - t) * 1e3)
        first = next(a for a in env.admissible_actions() if a.startswith("click[b"))
        t = time.perf_counter()
        env.step(first)
        item_ms.append((time.perf_counter() - t) * 1e3)
    return {
        "folder": str(resource.folder), "num_products": meta["num_products"], "num_goals": meta["num_goals"],
        "num_train_goals": len(resource.splits["train"]),
        "build_seconds": meta["build_seconds"], "open_seconds": open_seconds,
        "disk_mib": folder_size(resource.folder) / MIB, "bm25_index_mib": bm25_bytes / MIB,
        "search_p50_ms": float(np.median(search_ms)), "search_p90_ms": float(np.percentile(search_ms, 90)),
        "item_p50_ms": float(np.median(item_ms)), "item_p90_ms": float(np.percentile(item_ms, 90)),
    }


def play_episode(env: Any, goal_position: int) -> tuple[int, bool]:
    """One episode: search the instruction text (as a model would), then follow the expert. Returns (steps, success)."""
    env.reset(options={"goal_index": goal_position})
    _, _, terminated, truncated, info = env.step(f"search[{env.instruction}]")
    steps = 1
    while not (terminated or truncated):
        _, _, terminated, truncated, info = env.step(env.expert_action())
        steps += 1
    return steps, bool(info.get("success"))


def host(args: argparse.Namespace) -> None:
    """A runner process: `args.envs` envs sharing one resource, stepped on `args.threads` worker threads.

    Env ``j`` (global index ``args.first_env + j``) plays goal positions ``[g * episodes, (g + 1) * episodes)`` of the
    train split, so any split of the runners over processes plays the same goals. A lane steps its envs round-robin
    one episode each at a time, so every env has an episode in flight at once. Prints what it played, then stays
    alive, envs and memory maps in place, until the parent closes its stdin.
    """
    from agentrl.envs.webshop import WebShopEnv, WebShopResource

    if args.bare:
        print(json.dumps({"episodes": 0}), flush=True)
        sys.stdin.read()
        return
    resource = WebShopResource.build(num_products=args.num_products, cache_dir=args.cache_dir)
    num_goals = len(resource.splits["train"])
    envs: dict[int, Any] = {}
    totals = {"episodes": 0, "steps": 0, "successes": 0}
    lock = threading.Lock()

    def lane(slots: list[int]) -> None:
        for j in slots:  # built on the thread that steps them, as the pool does
            envs[j] = WebShopEnv(shared=resource)
        for e in range(args.episodes):
            for j in slots:
                g = args.first_env + j
                steps, success = play_episode(envs[j], (g * args.episodes + e) % num_goals)
                with lock:
                    totals["episodes"] += 1
                    totals["steps"] += steps
                    totals["successes"] += success

    lanes = [list(range(i, args.envs, args.threads)) for i in range(args.threads)]
    with ThreadPoolExecutor(args.threads) as pool:
        list(pool.map(lane, lanes))
    assert len({id(env.resource) for env in envs.values()}) == 1
    print(json.dumps(totals), flush=True)
    sys.stdin.read()  # measured now: `envs` and `resource` must stay referenced (returning would unmap the files)


# ------------------------------------------------------------------------------------------------ measuring
def memory_of(pids: list[int]) -> dict[str, float]:
    """Summed RSS, PSS, USS, anonymous RSS and peak RSS (MiB) of `pids`."""
    out = {"rss": 0.0, "pss": 0.0, "uss": 0.0, "anon": 0.0, "peak_rss": 0.0}
    for pid in pids:
        info = psutil.Process(pid).memory_full_info()
        out["rss"] += info.rss / MIB
        out["pss"] += info.pss / MIB
        out["uss"] += info.uss / MIB
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().split("\n")
        out["anon"] += next(int(line.split()[1]) for line in rollup if line.startswith("Anonymous:")) / 1024
        status = Path(f"/proc/{pid}/status").read_text().split("\n")
        out["peak_rss"] += next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024
    return out


def measure_layout(args: argparse.Namespace, processes: int, envs_per_process: int, episodes: int,
                   bare: bool) -> dict[str, Any]:
    """Start `processes` host processes, wait until all played their episodes, measure them together, stop them."""
    procs = []
    for p in range(processes):
        cmd = [sys.executable, __file__, "--role", "host", "--cache-dir", args.cache_dir,
               "--num-products", str(args.num_products), "--envs", str(envs_per_process),
               "--threads", str(envs_per_process), "--episodes", str(episodes),
               "--first-env", str(p * envs_per_process)] + (["--bare"] if bare else [])
        procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    try:
        started = time.perf_counter()
        played = [json.loads(p.stdout.readline()) for p in procs]
        seconds = time.perf_counter() - started
        memory = memory_of([p.pid for p in procs])
    finally:
        for p in procs:
            p.stdin.close()
            p.wait()
    return {**memory, "processes": processes, "envs_per_process": envs_per_process, "seconds": seconds,
            "episodes": sum(x["episodes"] for x in played), "steps": sum(x.get("steps", 0) for x in played),
            "successes": sum(x.get("successes", 0) for x in played)}


def run_child(args: argparse.Namespace, role: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--role", role, "--cache-dir", args.cache_dir,
           "--num-products", str(args.num_products), "--steps", str(args.steps)]
    done = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-products", type=int, default=1_180_000)
    parser.add_argument("--cache-dir", default=None, help="cache root (default: $AGENTRL_CACHE or ~/.cache/agentrl)")
    parser.add_argument("--runners", type=int, default=32, help="concurrent episodes (pool slots)")
    parser.add_argument("--processes", type=int, default=4, help="runner processes of the multi-process layout")
    parser.add_argument("--episodes", type=int, default=5, help="episodes per runner")
    parser.add_argument("--steps", type=int, default=200, help="timed search and item-page steps")
    parser.add_argument("--per-process", action="store_true", help="also measure one process per runner")
    parser.add_argument("--role", choices=["prepare", "host"], help=argparse.SUPPRESS)
    parser.add_argument("--envs", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--first-env", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cache_dir is None:
        from agentrl.envs.webshop.shared import cache_root

        args.cache_dir = str(cache_root())
    if args.role == "prepare":
        print(json.dumps(prepare(args)), flush=True)
        return
    if args.role == "host":
        host(args)
        return
    if args.runners % args.processes:
        parser.error(f"--runners ({args.runners}) must be a multiple of --processes ({args.processes})")

    print(f"webshop: opening (building if needed) {args.num_products:,} products under {args.cache_dir} ...",
          flush=True)
    prep = run_child(args, "prepare")
    print(f"catalogue {prep['num_products']:,} products, {prep['num_goals']:,} goals; built in "
          f"{prep['build_seconds']:.0f}s (opening it: {prep['open_seconds']:.2f}s); on disk {prep['disk_mib']:.0f} "
          f"MiB, BM25 index {prep['bm25_index_mib']:.0f} MiB")
    print(f"search step p50 {prep['search_p50_ms']:.1f} ms (p90 {prep['search_p90_ms']:.1f}); item-page step p50 "
          f"{prep['item_p50_ms']:.2f} ms (p90 {prep['item_p90_ms']:.2f})")

    n, k, procs = args.runners, args.episodes, args.processes
    plan = {  # name -> (processes, envs per process, episodes per env)
        "1 runner": (1, 1, n * k),
        f"{n} runners, 1 process": (1, n, k),
        f"{n} runners, {procs} processes": (procs, n // procs, k),
    }
    if args.per_process:
        plan[f"{n} runners, {n} processes"] = (n, 1, k)
    bare: dict[int, dict[str, Any]] = {}
    layouts: dict[str, dict[str, Any]] = {}
    for name, (p, e, eps) in plan.items():
        if p not in bare:
            bare[p] = measure_layout(args, p, 1, 0, bare=True)
        m = measure_layout(args, p, e, eps, bare=False)
        m["attributable_pss"] = m["pss"] - bare[p]["pss"]
        m["attributable_anon"] = m["anon"] - bare[p]["anon"]
        layouts[name] = m
        print(f"{name:>26}: {m['episodes']} episodes ({m['successes']} solved) in {m['seconds']:.1f}s; RSS "
              f"{m['rss']:.0f} MiB, PSS {m['pss']:.0f}, USS {m['uss']:.0f}, anon {m['anon']:.0f}; "
              f"WebShop-attributable PSS {m['attributable_pss']:.0f} MiB (bare x{p}: PSS {bare[p]['pss']:.0f})")

    one = layouts["1 runner"]
    ratios = {}
    for name, m in layouts.items():
        if name == "1 runner":
            continue
        ratios[name] = {key: m[key] / one[key] for key in ("rss", "pss", "uss", "attributable_pss")}
        r = ratios[name]
        print(f"{name:>26} / 1 runner: RSS {r['rss']:.2f}x, PSS {r['pss']:.2f}x, USS {r['uss']:.2f}x, "
              f"WebShop-attributable PSS {r['attributable_pss']:.2f}x (target <= 1.3x; a copy per runner: {n}x)")

    out = {**{k_: v for k_, v in prep.items() if k_ != "folder"}, "runners": n, "episodes_per_runner": k,
           "bare": {str(p): m for p, m in bare.items()}, "layouts": layouts, "ratios_vs_one_runner": ratios}
    write_json(RESULTS / "webshop_scale.json", out, indent=2)
    print(f"results: {RESULTS / 'webshop_scale.json'}")


if __name__ == "__main__":
    main()
