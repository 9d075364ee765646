"""`agentrl run` on a Ray cluster of several nodes on this machine, and what it does when a node is lost.

The cluster (`bench/micro/ray_nodes.py`): three Ray nodes, each its own raylet started with ``ray start``, with custom
resources that name their roles: ``head`` (2 CPUs, ``trainer_node``), ``engines`` (2 CPUs, ``engine_node``),
``runners`` (2 CPUs, ``runner_node``). The driver joins with ``--ray-address``; the 2 FSDP trainer workers ask for
``trainer_node`` (``--trainer.ray-resource``), the engine actor for ``engine_node`` (``--engine.ray-resource``), and
the 4 env runners (2 runner processes) are spread by Ray over the nodes with free CPUs. tiny-qwen3 on the math env.

What is measured, and what counts as holding (declared before the first run):

1. ``placement``: a 3-step run. Where each process ran (``nodes.json``: node ids mapped to the node names); the
   trainers on ``head`` and the engine on ``engines`` hold; weights reach the engine on the other node by version
   (every step's trajectories were sampled with policy version = step: ``staleness_max`` 0, and the engine's samples
   match the trainers' log-probs: ``|kl_k3|`` < 1e-4); the seconds of one weight sync (``weight_sync_seconds``,
   steps >= 1).
2. ``lose_runner_node``: a 4-step run; the ``runners`` node's raylet is killed (kill -9) once step 0 is logged. Holds
   if the run finishes all 4 steps (its runner processes are restarted by Ray on the surviving nodes) or stops with
   one line naming the resume command; a hang (no exit within 10 minutes) fails.
3. ``lose_engine_node``: first a replacement ``runners2`` node joins (2 CPUs, ``runner_node``); then a 4-step run
   whose ``engines`` node's raylet is killed once step 0 is logged. No other node
   offers ``engine_node``, so the engine cannot come back: holds if the run stops within a bound with one line naming
   ``agentrl run --resume``, and a resume after a replacement node (``engines2``, ``engine_node``) has joined
   finishes the 4 steps, with the engine on the new node.

Timings are wall-clock on a shared 2-core machine (others' jobs run too): read them as orders of magnitude. Results:
docs/results/multinode.json.

    python bench/micro/multinode.py [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from ray_nodes import RayNodes  # noqa: E402

from bench.harness import RESULTS, ROOT, agentrl_command, read_jsonl, write_json  # noqa: E402

HANG_S = 600.0


def run_args(address: str, out: Path, steps: int) -> list[str]:
    """The `agentrl run` command of every scenario."""
    return agentrl_command(
        "run", "--env", "math", "--model", "tiny-qwen3", "--ray-address", address, "--trainers", "2",
        "--trainer.ray-resource", "trainer_node", "--engine.ray-resource", "engine_node", "--runners", "4",
        "--runners.actors", "2", "--steps", str(steps), "--group-size", "2", "--prompts-per-step", "2",
        "--max-new-tokens", "8", "--save-every", "1", "--trainer.memory-limit-gb", "4", "--output", str(out))


def launch(cmd: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))


def step_rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [r for r in read_jsonl(path) if "event" not in r]


def finish(proc: subprocess.Popen, log: Path, t0: float) -> dict:
    """Wait for the run (at most `HANG_S`); its exit code, seconds and last output line."""
    try:
        proc.wait(timeout=max(1.0, HANG_S - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return {"rc": None, "hung": True, "seconds": round(time.monotonic() - t0, 1)}
    lines = [line for line in log.read_text().replace("\r", "\n").splitlines() if line.strip()]
    return {"rc": proc.returncode, "hung": False, "seconds": round(time.monotonic() - t0, 1),
            "last_line": lines[-1] if lines else ""}


def named(nodes_json: Path, ids: dict[str, str]) -> dict:
    """nodes.json with every node id replaced by the node's name."""
    by_id = {v: k for k, v in ids.items()}
    where = json.loads(nodes_json.read_text())
    return {role: (by_id.get(v, v) if isinstance(v, str) else [by_id.get(x, x) for x in v])
            for role, v in where.items()}


def placement(nodes: RayNodes, work: Path) -> dict:
    out, log = work / "placement", work / "placement.log"
    t0 = time.monotonic()
    result = finish(launch(run_args(nodes.address, out, 3), log), log, t0)
    rows = step_rows(out)
    ids = nodes.node_ids()
    return result | {
        "node_ids": ids, "where": named(out / "nodes.json", ids) if (out / "nodes.json").exists() else None,
        "steps": [r["step"] for r in rows],
        "weight_sync_seconds": [round(r["weight_sync_seconds"], 3) for r in rows if r["step"] >= 1],
        "staleness_max": [r.get("staleness_max") for r in rows],
        "kl_k3": [r["kl_k3"] for r in rows],
    }


def lose_node(nodes: RayNodes, work: Path, name: str, steps: int = 4) -> dict:
    """Kill node `name`'s raylet once step 0 is logged; what the run does."""
    out, log = work / f"lose_{name}", work / f"lose_{name}.log"
    t0 = time.monotonic()
    proc = launch(run_args(nodes.address, out, steps), log)
    killed_at = None
    while proc.poll() is None and time.monotonic() - t0 < HANG_S:
        if step_rows(out):
            nodes.kill_raylet(name)
            killed_at = time.monotonic()
            break
        time.sleep(0.5)
    result = finish(proc, log, t0)
    rows = read_jsonl(out / "metrics.jsonl")
    return result | {
        "killed_node": name, "killed_after_s": round(killed_at - t0, 1) if killed_at else None,
        "exit_after_kill_s": round(time.monotonic() - killed_at, 1) if killed_at else None,
        "steps_logged": [r["step"] for r in rows if "event" not in r],
        "events": [r for r in rows if "event" in r],
        "env_errors_per_step": [r.get("env_errors") for r in rows if "event" not in r],
        "episode_retries_per_step": [r.get("episode_retries") for r in rows if "event" not in r],
    }, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", action="store_true", help="keep the run folders and logs (printed)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="agentrl-multinode-"))
    results: dict = {"machine": f"{os.cpu_count()} cores, shared", "model": "tiny-qwen3", "env": "math"}
    t_all = time.monotonic()
    with RayNodes(work / "ray") as nodes:
        t0 = time.monotonic()
        nodes.start_head(num_cpus=2, resources={"trainer_node": 1})
        nodes.add_node("engines", num_cpus=2, resources={"engine_node": 1})
        nodes.add_node("runners", num_cpus=2, resources={"runner_node": 1})
        results["cluster_start_seconds"] = round(time.monotonic() - t0, 1)
        results["placement"] = placement(nodes, work)
        print(json.dumps(results["placement"], indent=1), flush=True)

        results["lose_runner_node"], _ = lose_node(nodes, work, "runners")
        print(json.dumps(results["lose_runner_node"], indent=1), flush=True)

        nodes.add_node("runners2", num_cpus=2, resources={"runner_node": 1})  # a replacement for the lost node
        lost, out = lose_node(nodes, work, "engines")
        nodes.add_node("engines2", num_cpus=2, resources={"engine_node": 1})
        log = work / "resume.log"
        t0 = time.monotonic()
        resumed = finish(launch(agentrl_command("run", "--resume", str(out), "--ray-address", nodes.address), log),
                         log, t0)
        ids = nodes.node_ids()
        lost["resume"] = resumed | {
            "steps_logged": [r["step"] for r in step_rows(out)],
            "where": named(out / "nodes.json", ids) if (out / "nodes.json").exists() else None}
        results["lose_engine_node"] = lost
        print(json.dumps(lost, indent=1), flush=True)
    results["total_seconds"] = round(time.monotonic() - t_all, 1)
    for section in ("placement", "lose_runner_node", "lose_engine_node"):  # no machine paths in the results
        text = json.dumps(results[section]).replace(str(work) + "/", "")
        results[section] = json.loads(text)
    write_json(RESULTS / "multinode.json", results, end="\n")
    print(f"wrote {RESULTS / 'multinode.json'}" + (f"; runs and logs in {work}" if args.keep else ""))
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
