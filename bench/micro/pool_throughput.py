"""Runner pool throughput and memory: env steps/s at 1, 4, 16, 32 runners, and resident memory added per runner.

Two envs: `math` (CPU-bound: answer extraction and checking) and a synthetic env whose step sleeps 10 ms (an env
waiting on I/O: a web server, a simulator). No model: the driver answers every observation at once with a fixed
action, so the numbers are the pool's own ceiling. Every slot is kept busy for `--seconds` per setting.

Two ways of sending calls, measured in the same run: ``batched`` (the default: one Ray call per actor per
scheduling round, results streamed back) and ``per_call`` (one Ray call per env call, the behaviour before
batching): the ratio batched / per_call is the gain. Baselines also measured in the same run: the in-process pool
(``runners=0``, serial) for steps/s, and the runner processes at the fewest runners for memory. Results go to
docs/results/pool_throughput.json.

    python bench/micro/pool_throughput.py [--seconds 4] [--runners 1 4 16 32]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import psutil
import ray
from tqdm import tqdm

from agentrl.envs.core import TextEnv
from agentrl.rollout.pool import EnvFailure, EnvMaker, LocalPool, RayPool, start_ray

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, write_json  # noqa: E402


class SleepyEnv(TextEnv):
    """Each step sleeps `latency` seconds; episodes last `length` steps."""

    system_prompt = "Reply with anything."

    def __init__(self, latency: float = 0.010, length: int = 5):
        self.latency, self.length, self.t = latency, length, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return "go", {}

    def step(self, action: str):
        time.sleep(self.latency)
        self.t += 1
        done = self.t >= self.length
        return "ok", 0.0, done, False, {"success": done}

    def expert_action(self) -> str:
        return "x"


ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

MAKERS = {
    "math": (EnvMaker("math", {"level": 1}), "The answer is \\boxed{12}."),
    "sleep10ms": (EnvMaker("sleep10ms", {"latency": 0.010}, entry_point=SleepyEnv), "x"),
}


def drive(pool, slots: int, action: str, seconds: float, errors: list[str]) -> float:
    """Keep `slots` episodes stepping for `seconds`; returns env steps per second (failures go to `errors`)."""
    seed = 0
    for slot in range(slots):
        pool.submit_reset(slot, seed)
        seed += 1
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for c in pool.poll(block=True):
            result = c.outcome
            if isinstance(result, EnvFailure):
                errors.append(result.message)
                pool.submit_reset(c.slot, seed, fresh=True)
                seed += 1
                continue
            if c.op == "step":
                steps += 1
            if c.op == "step" and (result.terminated or result.truncated):
                pool.submit_reset(c.slot, seed)
                seed += 1
            else:
                pool.submit_step(c.slot, action)
    elapsed = time.perf_counter() - t0
    while pool.in_flight:
        pool.poll(block=True)
    return steps / elapsed


def runner_rss_mb() -> float:
    """Resident memory of all Ray worker processes (MB)."""
    total = 0
    for proc in psutil.process_iter(["cmdline", "memory_info"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "ray::EnvHost" in cmd or ("default_worker.py" in cmd and "EnvHost" in cmd):
            total += proc.info["memory_info"].rss
    return total / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--runners", type=int, nargs="+", default=[1, 4, 16, 32])
    args = parser.parse_args()
    start_ray()
    results: dict = {"seconds_per_setting": args.seconds, "cpus": psutil.cpu_count(), "envs": {}}
    settings = [(env, r) for env in MAKERS for r in [0, *args.runners]]
    bar = tqdm(settings, desc="pool throughput", unit="setting")
    for env_name, runners in bar:
        bar.set_postfix(env=env_name, runners=runners)
        maker, action = MAKERS[env_name]
        row = results["envs"].setdefault(env_name, {})
        if runners == 0:
            pool = LocalPool(maker, slots=1)
            row["in_process_steps_per_s"] = drive(pool, 1, action, args.seconds, errors := [])
            pool.close()
            continue
        entry = row.setdefault(str(runners), {})
        for mode in ("per_call", "batched"):
            with RayPool(maker, runners, batch_calls=mode == "batched") as pool:
                ray.get([pool.actor_handle(i).ready.remote() for i in range(pool.actors)])
                rate = drive(pool, runners, action, args.seconds, errors := [])
                rss = runner_rss_mb()
                entry["actors"] = pool.actors
            if errors:
                print(f"{env_name} x {runners} ({mode}): {len(errors)} env failures, first: {errors[0]}")
            entry[mode] = {"steps_per_s": rate, "runner_rss_mb": rss, "errors": len(errors),
                           "vs_in_process": rate / row["in_process_steps_per_s"]}
            time.sleep(1.0)  # let killed actors exit before the next memory reading
        entry["batched_vs_per_call"] = entry["batched"]["steps_per_s"] / entry["per_call"]["steps_per_s"]
    for row in results["envs"].values():
        counts = [int(k) for k in row if k.isdigit()]
        lo, hi = min(counts), max(counts)
        row["rss_added_per_runner_mb"] = ((row[str(hi)]["batched"]["runner_rss_mb"]
                                           - row[str(lo)]["batched"]["runner_rss_mb"]) / max(hi - lo, 1))
    ray.shutdown()
    write_json(RESULTS / "pool_throughput.json", results)
    for env_name, row in results["envs"].items():
        print(f"{env_name}: in-process {row['in_process_steps_per_s']:.0f} steps/s; "
              f"memory added per runner {row['rss_added_per_runner_mb']:.1f} MB")
        for k, v in row.items():
            if k.isdigit():
                b, p = v["batched"], v["per_call"]
                print(f"  {k:>3} runners on {v['actors']} actors: batched {b['steps_per_s']:8.1f} steps/s, per-call "
                      f"{p['steps_per_s']:8.1f} steps/s ({v['batched_vs_per_call']:.2f}x; batched is "
                      f"{b['vs_in_process']:.2f}x in-process), runner processes {b['runner_rss_mb']:.0f} MB")

if __name__ == "__main__":
    main()
