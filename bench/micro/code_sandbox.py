"""The code env's sandboxes: start (cold and from the warm pool), a tool call's round trip, episodes/s at 1 and 32
concurrent episodes, and memory per running sandbox, per back-end, against a plain subprocess in the same run.

    python bench/micro/code_sandbox.py [--backends subprocess,bwrap,podman] [--repeats 30] [--episodes 96]

Back-ends: ``subprocess`` (the baseline: the same resource limits, no isolation), ``bwrap`` (bubblewrap namespaces,
the default) and ``podman`` (one container per worker; skipped with the reason when podman or its image is missing).
What is timed:
  * cold start: a new sandbox made and its first call (``true``) returned;
  * warm start: a sandbox taken from the pool (kept from an earlier episode, emptied) and its first call returned;
  * round trip: one ``run_python`` tool call (``python3 -c 'print(1)'``) and one ``run_shell`` (``sh -c 'echo hi'``)
    on a started sandbox;
  * episodes/s: the expert's episodes of `CodeEnv` (level 1 tasks: write solution.py, submit, graded in a fresh
    sandbox) with 1 and 32 episodes at once, each on its own env, stepped from a thread pool as a runner pool does;
  * memory: the resident size of the host processes of one call that sleeps (sampled), i.e. what each concurrently
    running sandbox costs the host; an idle sandbox is a folder (bwrap, subprocess) or a folder in the container.
Medians over ``--repeats``. Ratios are against ``subprocess`` measured in the same run. Writes
docs/results/code_sandbox.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from agentrl.envs.code import CodeEnv
from agentrl.envs.code.sandbox import SandboxLimits, SandboxPool, make_backend

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, command_line, load_1m, rss_mib, time_repeats, write_json  # noqa: E402


def _median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 2)


def _check(result, what: str) -> None:
    if not result.ok:
        raise RuntimeError(f"{what} failed: exit {result.exit_code}, {result.text('stderr')[-300:]}")


def starts_and_round_trips(name: str, repeats: int, options: dict) -> dict:
    """Cold and warm starts, and the two tool calls' round trips, in ms (medians)."""
    backend = make_backend(name, unsafe_subprocess=True, **options)
    limits = SandboxLimits()
    try:
        def cold():
            sandbox = backend.create(limits)
            _check(sandbox.run(["true"]), "cold start")
            sandbox.close()

        pool = SandboxPool(backend, limits, size=4, prefill=1)

        def warm():
            sandbox = pool.acquire()
            _check(sandbox.run(["true"]), "warm start")
            pool.release(sandbox)

        cold()  # the first call of a back-end may start a container or fill caches: not a per-episode cost
        cold_s, warm_s = time_repeats(cold, repeats), time_repeats(warm, repeats)
        sandbox = pool.acquire()
        python_s = time_repeats(lambda: _check(sandbox.run(["python3", "-c", "print(1)"]), "run_python"), repeats)
        shell_s = time_repeats(lambda: _check(sandbox.run(["sh", "-c", "echo hi"]), "run_shell"), repeats)
        rss = _call_rss_mb(sandbox)
        pool.release(sandbox)
        stats = pool.stats()
        pool.close()
        return {"cold_start_ms": _median_ms(cold_s), "warm_start_ms": _median_ms(warm_s),
                "run_python_ms": _median_ms(python_s), "run_shell_ms": _median_ms(shell_s),
                "host_rss_per_running_sandbox_mb": rss, "pool": {"cold": stats.cold, "warm": stats.warm}}
    finally:
        backend.close()


def _call_rss_mb(sandbox) -> float:
    """Peak resident size of the processes this process started for one sleeping call (sampled every 20 ms)."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    peak = 0.0
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_mib(p for p in me.children(recursive=True) if p.pid not in before))
            time.sleep(0.02)

    t = threading.Thread(target=sample)
    t.start()
    sandbox.run(["python3", "-c", "import time; time.sleep(1.0)"])
    done.set()
    t.join()
    return round(peak, 1)


def episodes_per_second(name: str, concurrency: int, episodes: int, options: dict) -> dict:
    """Expert episodes of level-1 tasks, `concurrency` at once."""
    envs = [CodeEnv(backend=name, unsafe_subprocess=name == "subprocess", backend_options=options or None)
            for _ in range(concurrency)]
    seeds = iter(range(episodes))
    lock = threading.Lock()
    rewards: list[float] = []

    def worker(env: CodeEnv) -> None:
        while True:
            with lock:
                seed = next(seeds, None)
            if seed is None:
                return
            env.reset(seed=seed)
            while True:
                _, reward, terminated, truncated, _ = env.step(env.expert_action())
                if terminated or truncated:
                    break
            with lock:
                rewards.append(reward)

    expert_warm = envs[0]
    expert_warm.reset(seed=10**6)  # the pool's first sandboxes and the back-end's start are not per-episode costs
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(worker, envs))
    seconds = time.perf_counter() - t0
    for env in envs:
        env.close()
    return {"episodes": len(rewards), "seconds": round(seconds, 2), "episodes_per_s": round(len(rewards) / seconds, 2),
            "mean_reward": round(statistics.fmean(rewards), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="subprocess,bwrap,podman")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--episodes", type=int, default=96, help="expert episodes per concurrency setting")
    parser.add_argument("--podman-image", default="", help="the podman back-end's image (default: its own)")
    parser.add_argument("--results", default=str(RESULTS / "code_sandbox.json"))
    args = parser.parse_args()

    report: dict = {"command": command_line(__file__),
                    "cores": os.cpu_count(), "load_avg_1m_at_start": round(load_1m(), 2), "backends": {}}
    for name in [b.strip() for b in args.backends.split(",") if b.strip()]:
        options = {"image": args.podman_image} if name == "podman" and args.podman_image else {}
        if name != "subprocess":
            from agentrl.envs.code.sandbox import BwrapBackend, PodmanBackend

            reason = (BwrapBackend if name == "bwrap" else PodmanBackend).unavailable_reason()
            if reason:
                print(f"[{name}] skipped: {reason}")
                report["backends"][name] = {"skipped": reason}
                continue
        print(f"[{name}] starts and round trips ...", flush=True)
        row = starts_and_round_trips(name, args.repeats, options)
        for concurrency in (1, 32):
            print(f"[{name}] {args.episodes} expert episodes, {concurrency} at once ...", flush=True)
            row[f"episodes_at_{concurrency}"] = episodes_per_second(name, concurrency, args.episodes, options)
        report["backends"][name] = row
        print(f"[{name}] {json.dumps(row)}", flush=True)
    base = report["backends"].get("subprocess", {})
    for name, row in report["backends"].items():
        if name == "subprocess" or "skipped" in row or not base:
            continue
        row["vs_subprocess"] = {
            key: round(row[key] / base[key], 2) for key in ("cold_start_ms", "warm_start_ms", "run_python_ms",
                                                            "run_shell_ms", "host_rss_per_running_sandbox_mb")
        } | {f"episodes_per_s_at_{c}": round(row[f"episodes_at_{c}"]["episodes_per_s"]
                                               / base[f"episodes_at_{c}"]["episodes_per_s"], 2) for c in (1, 32)}
    report["load_avg_1m_at_end"] = round(load_1m(), 2)
    write_json(Path(args.results), report, indent=2, end="\n")
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
