"""Served envs (`agentrl env serve`) against in-process envs and Ray runners: env steps/s and memory (issue 28).

What runs. For WebShop and ALFWorld, the expert's actions for seeds 0..K-1 are recorded once (outside the timing);
then N concurrent episodes (N = 1 and 32) replay them for `--seconds`, three ways, interleaved round-robin for
`--rounds` rounds in the same run (the median of the rounds is kept; the CPU is shared with other jobs, so only
ratios within this run mean anything):

* ``in_process``: the envs in this process, stepped one after another (what ``--runners 0`` does);
* ``ray``: a `RayPool` with N slots (default actors: one per CPU; batched calls), what ``--runners N`` does;
* ``http``: N threads here, each playing a `RemoteEnv` session of one `agentrl env serve` subprocess.

Memory: the RSS of the server process holding 32 and then 256 open sessions (each reset once) against Ray runner
processes: the actor processes of the default 32-runner pool (one per CPU), and 32 single-env runner processes,
estimated as 32 x the mean RSS of 4 single-env runner processes (starting 32 Ray processes at once is too heavy for
a 2-core, shared box).

Counts as holding (declared before the run): at 32 concurrent episodes the HTTP sessions give at least half the
Ray runners' env steps/s, and one server holding 256 sessions uses less memory than 32 runner processes.

`--run` also trains one step against a served WebShop, ``agentrl run --env http://127.0.0.1:PORT/webshop --runners 32
--steps 1 --model tiny-qwen3`` (8 new tokens a turn, 6 turns an episode: the HF engine samples only about 25 tokens/s
for this model on the shared box, and a first try at the defaults had finished no episode after 13 minutes), then
replays every trajectory's actions on a local WebShop with the same seed: the
observations and rewards must be the same, turn for turn. The random tiny model earns no reward, so before it the
expert's episodes of 32 seeds are played through 32 Ray runners on the same server and their step rewards compared
with local play.

    python bench/micro/env_serve.py [--seconds 3] [--rounds 2] [--run]

Writes docs/results/env_serve.json (and env_serve_run.json with --run).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import ray

import agentrl
from agentrl.rollout.pool import EnvFailure, EnvMaker, RayPool, start_ray

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, ROOT, agentrl_command, read_jsonl, write_json  # noqa: E402

ENVS = ("webshop", "alfworld")


def record_expert(env_id: str, seeds: int) -> dict[int, list[str]]:
    """The expert's actions for each seed (played locally, outside the timing)."""
    env, out = agentrl.make(env_id), {}
    for seed in range(seeds):
        env.reset(seed=seed)
        actions = []
        for _ in range(60):
            action = env.expert_action()
            actions.append(action)
            _, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
        out[seed] = actions
    env.close()
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(env_id: str, port: int, max_sessions: int = 512) -> subprocess.Popen:
    proc = subprocess.Popen(agentrl_command("env", "serve", "--env", env_id, "--port", str(port), "--max-sessions",
                                            str(max_sessions)), stderr=subprocess.PIPE, text=True, cwd=ROOT)
    line = proc.stderr.readline()
    if "serving" not in line:
        raise RuntimeError(f"the server did not start: {line}{proc.stderr.read()}")
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep its pipe drained
    return proc


def run_in_process(env_id: str, n: int, expert: dict[int, list[str]], seconds: float) -> float:
    maker = EnvMaker(env_id)
    shared = maker.build_shared()
    envs = [maker.make(shared) for _ in range(n)]
    state = [[slot, 0] for slot in range(n)]  # seed, index into its actions
    next_seed = n
    for slot, env in enumerate(envs):
        env.reset(seed=slot % len(expert))
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for slot, env in enumerate(envs):
            seed, i = state[slot]
            actions = expert[seed % len(expert)]
            _, _, terminated, truncated, _ = env.step(actions[i])
            steps += 1
            if terminated or truncated or i + 1 >= len(actions):
                env.reset(seed=next_seed % len(expert))
                state[slot] = [next_seed, 0]
                next_seed += 1
            else:
                state[slot][1] = i + 1
    rate = steps / (time.perf_counter() - t0)
    for env in envs:
        env.close()
    return rate


def run_ray(env_id: str, n: int, expert: dict[int, list[str]], seconds: float) -> float:
    with RayPool(EnvMaker(env_id), n) as pool:
        ray.get([pool.actor_handle(i).ready.remote() for i in range(pool.actors)])
        state, next_seed = {}, n
        for slot in range(n):
            pool.submit_reset(slot, slot % len(expert))
            state[slot] = [slot, 0]
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for c in pool.poll(block=True):
                if isinstance(c.outcome, EnvFailure):
                    raise RuntimeError(c.outcome.message)
                seed, i = state[c.slot]
                actions = expert[seed % len(expert)]
                if c.op == "step":
                    steps += 1
                    i += 1
                    if c.outcome.terminated or c.outcome.truncated or i >= len(actions):
                        pool.submit_reset(c.slot, next_seed % len(expert))
                        state[c.slot] = [next_seed, 0]
                        next_seed += 1
                        continue
                state[c.slot] = [seed, i]
                pool.submit_step(c.slot, actions[i])
        rate = steps / (time.perf_counter() - t0)
        while pool.in_flight:
            pool.poll(block=True)
    return rate


def run_http(url: str, n: int, expert: dict[int, list[str]], seconds: float) -> float:
    counts = [0] * n
    stop = time.perf_counter() + seconds
    errors: list[str] = []

    def worker(k: int) -> None:
        env = agentrl.make(url)
        seed = k
        try:
            while time.perf_counter() < stop:
                env.reset(seed=seed % len(expert))
                for action in expert[seed % len(expert)]:
                    _, _, terminated, truncated, _ = env.step(action)
                    counts[k] += 1
                    if terminated or truncated or time.perf_counter() >= stop:
                        break
                seed += n
        except Exception as e:  # counted, reported; the rate of the others still stands
            errors.append(str(e))
        finally:
            env.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} HTTP workers failed, first: {errors[0]}")
    return sum(counts) / (time.perf_counter() - t0)


def ray_runner_rss_mb() -> tuple[float, int]:
    """Resident memory of the Ray EnvHost worker processes (MB) and how many there are."""
    total, count = 0, 0
    for proc in psutil.process_iter(["cmdline", "memory_info"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "ray::EnvHost" in cmd:
            total += proc.info["memory_info"].rss
            count += 1
    return total / 2**20, count


def server_memory(env_id: str, expert: dict[int, list[str]]) -> dict[str, float]:
    port = free_port()
    proc = start_server(env_id, port)
    url = f"http://127.0.0.1:{port}/{env_id}"
    client, rss = httpx.Client(timeout=120), {}
    try:
        rss["0_sessions_mb"] = psutil.Process(proc.pid).memory_info().rss / 2**20
        opened = 0
        for target in (32, 256):
            while opened < target:
                sid = client.post(url + "/sessions", json={}).json()["session"]
                client.post(f"{url}/sessions/{sid}/reset", json={"seed": opened % len(expert), "seq": 1})
                opened += 1
            time.sleep(0.5)
            rss[f"{target}_sessions_mb"] = psutil.Process(proc.pid).memory_info().rss / 2**20
    finally:
        client.close()
        proc.terminate()
        proc.wait()
    return rss


def wait_for_runners_to_exit(timeout: float = 30.0) -> None:
    """Wait until no EnvHost process is left (a closed pool's actors take a moment to exit)."""
    deadline = time.monotonic() + timeout
    while ray_runner_rss_mb()[1] and time.monotonic() < deadline:
        time.sleep(0.5)


def runner_memory(env_id: str) -> dict[str, float]:
    out = {}
    wait_for_runners_to_exit()
    with RayPool(EnvMaker(env_id), 32) as pool:
        for slot in range(32):
            pool.submit_reset(slot, slot)
        while pool.in_flight:
            pool.poll(block=True)
        out["pool_32_runners_mb"], out["pool_32_runners_processes"] = ray_runner_rss_mb()
    wait_for_runners_to_exit()
    with RayPool(EnvMaker(env_id), 4, actors=4) as pool:
        for slot in range(4):
            pool.submit_reset(slot, slot)
        while pool.in_flight:
            pool.poll(block=True)
        total, count = ray_runner_rss_mb()
    out["single_env_process_mb"] = total / max(count, 1)
    out["estimated_32_processes_mb"] = 32 * out["single_env_process_mb"]
    wait_for_runners_to_exit()
    return out


def throughput(args: argparse.Namespace) -> dict:
    results: dict = {"seconds_per_setting": args.seconds, "rounds": args.rounds, "cpus": psutil.cpu_count(),
                     "expert_seeds": args.seeds, "envs": {}}
    for env_id in ENVS:
        expert = record_expert(env_id, args.seeds)
        port = free_port()
        server = start_server(env_id, port)
        url = f"http://127.0.0.1:{port}/{env_id}"
        row: dict = {"steps_per_episode": statistics.mean(len(a) for a in expert.values())}
        try:
            for n in (1, 32):
                rates: dict[str, list[float]] = {"in_process": [], "ray": [], "http": []}
                for _ in range(args.rounds):  # interleaved, so a busy neighbour hits every mode alike
                    rates["in_process"].append(run_in_process(env_id, n, expert, args.seconds))
                    rates["ray"].append(run_ray(env_id, n, expert, args.seconds))
                    rates["http"].append(run_http(url, n, expert, args.seconds))
                median = {mode: statistics.median(v) for mode, v in rates.items()}
                row[str(n)] = {"steps_per_s": median, "all_rounds": rates,
                               "http_vs_in_process": median["http"] / median["in_process"],
                               "http_vs_ray": median["http"] / median["ray"],
                               "ray_vs_in_process": median["ray"] / median["in_process"]}
                print(f"{env_id} x {n}: " + ", ".join(f"{m} {r:.0f} steps/s" for m, r in median.items()), flush=True)
        finally:
            server.terminate()
            server.wait()
        row["memory"] = {"server": server_memory(env_id, expert), "runners": runner_memory(env_id)}
        mem = row["memory"]
        mem["server_256_vs_32_processes"] = (mem["server"]["256_sessions_mb"]
                                             / mem["runners"]["estimated_32_processes_mb"])
        print(f"{env_id} memory: {json.dumps(mem)}", flush=True)
        row["holds"] = {"http_at_32_at_least_half_of_ray": row["32"]["http_vs_ray"] >= 0.5,
                        "server_256_below_32_processes": mem["server_256_vs_32_processes"] < 1.0}
        results["envs"][env_id] = row
    return results


def expert_parity(url: str, env_id: str, episodes: int = 32) -> dict:
    """The expert's episodes of seeds 0..episodes-1 played through 32 Ray runners on the served env, step rewards
    compared with the same actions on a local env (the random model of the training step earns no reward)."""
    expert = record_expert(env_id, episodes)
    local = agentrl.make(env_id)
    served: dict[int, list[float]] = {seed: [] for seed in expert}
    with RayPool(EnvMaker(url), episodes) as pool:
        progress = {slot: 0 for slot in range(episodes)}
        for slot in range(episodes):
            pool.submit_reset(slot, slot)
        while pool.in_flight or any(progress[s] < len(expert[s]) for s in progress):
            for c in pool.poll(block=True):
                if isinstance(c.outcome, EnvFailure):
                    raise RuntimeError(c.outcome.message)
                if c.op == "step":
                    served[c.slot].append(c.outcome.reward)
                    progress[c.slot] += 1
                if progress[c.slot] < len(expert[c.slot]) and not (c.op == "step" and (
                        c.outcome.terminated or c.outcome.truncated)):
                    pool.submit_step(c.slot, expert[c.slot][progress[c.slot]])
                else:
                    progress[c.slot] = len(expert[c.slot])
    local_rewards = {}
    for seed, actions in expert.items():
        local.reset(seed=seed)
        local_rewards[seed] = [float(local.step(a)[1]) for a in actions]
    return {"episodes": episodes, "same_step_rewards": all(served[s] == local_rewards[s] for s in expert),
            "served_total_return": sum(map(sum, served.values())),
            "local_total_return": sum(map(sum, local_rewards.values()))}


def train_step(args: argparse.Namespace) -> dict:
    """`agentrl run` against a served WebShop, then every trajectory replayed on a local WebShop."""
    port = free_port()
    server = start_server("webshop", port)
    url = f"http://127.0.0.1:{port}/webshop"
    out_dir = ROOT / "runs" / "env_serve_webshop"
    command = ["agentrl", "run", "--env", url, "--runners", str(args.runners), "--steps", "1", "--model",
               "tiny-qwen3", "--max-new-tokens", str(args.max_new_tokens), "--env.max-turns", str(args.max_turns),
               "--output", str(out_dir.relative_to(ROOT)), "--overwrite"]
    t0 = time.perf_counter()
    try:
        start_ray()
        parity = expert_parity(url, "webshop")
        ray.shutdown()
        t0 = time.perf_counter()
        proc = subprocess.run(agentrl_command(*command[1:]), cwd=ROOT, capture_output=True,
                              text=True, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    finally:
        server.terminate()
        server.wait()
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"agentrl run failed:\n{proc.stderr[-3000:]}")
    metrics = read_jsonl(out_dir / "metrics.jsonl")
    trajectories = read_jsonl(out_dir / "trajectories.jsonl")
    local = agentrl.make("webshop")
    mismatches, turns, rewards = [], 0, []
    for t in trajectories:
        obs, _ = local.reset(seed=t["seed"])
        if obs != t["first_observation"]:
            mismatches.append(f"seed {t['seed']}: first observation")
        total = 0.0
        for turn in t["turns"]:
            obs, reward, *_ = local.step(turn["action"])
            turns += 1
            total += reward
            if obs != turn["observation"] or reward != turn["reward"]:
                mismatches.append(f"seed {t['seed']} turn {turns}: {reward} vs {turn['reward']}")
        rewards.append((t["seed"], t["total_return"], total))
    return {"command": " ".join(command).replace(str(port), "PORT"), "seconds": seconds,
            "expert_through_32_ray_runners": parity,
            "episodes": len(trajectories), "turns_replayed": turns, "mismatches": mismatches,
            "same_rewards_as_local": not mismatches,
            "served_total_return": sum(r[1] for r in rewards), "local_total_return": sum(r[2] for r in rewards),
            "episodes_with_reward": sum(r[1] > 0 for r in rewards),
            "metrics": {k: metrics[0][k] for k in ("reward_mean", "success_rate", "env_errors", "episode_retries",
                                                   "dropped_groups", "env_steps_per_s", "step_seconds")
                        if k in metrics[0]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=16, help="expert episodes replayed")
    parser.add_argument("--run", action="store_true", help="also train one step against a served WebShop")
    parser.add_argument("--runners", type=int, default=32, help="runners of the --run training step")
    parser.add_argument("--max-new-tokens", type=int, default=8,
                        help="per turn in --run: the random tiny model's replies are junk either way, and the HF "
                             "engine samples about 25 tokens/s on this loaded box")
    parser.add_argument("--max-turns", type=int, default=6, help="model calls per episode in --run")
    parser.add_argument("--skip-throughput", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    RESULTS.mkdir(exist_ok=True)
    if not args.skip_throughput:
        start_ray()
        results = throughput(args)
        ray.shutdown()
        write_json(RESULTS / "env_serve.json", results)
    if args.run:
        run = train_step(args)
        write_json(RESULTS / "env_serve_run.json", run)
        print(json.dumps({k: v for k, v in run.items() if k != "mismatches"}, indent=1))


if __name__ == "__main__":
    main()
