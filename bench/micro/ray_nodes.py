"""A Ray cluster of several nodes on one machine: a head and worker nodes as separate raylets, each with its own
resources, ports and temp folder, started with ``ray start`` the way a real cluster's nodes are.

Used by `bench/micro/multinode.py` and the slow multi-node test. Nothing here touches another Ray on the machine: every
port is picked free, every node has a temp folder under this cluster's own, and `stop` ends only the processes this
object started (by process id).

Example::

    with RayNodes(Path("/tmp/my-cluster")) as nodes:
        address = nodes.start_head(num_cpus=2, resources={"trainer_node": 1})
        nodes.add_node("engines", num_cpus=1, resources={"engine_node": 1})
        ...  # agentrl run --ray-address <address> ...
        nodes.kill_raylet("engines")
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["RayNodes", "free_port"]


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class _Node:
    name: str
    process: subprocess.Popen
    resources: dict[str, float]
    log: Path
    lost: bool = False  # its raylet was killed on purpose
    node_id: str = ""  # its Ray node id, once it joined


@dataclass
class RayNodes:
    """Ray nodes on this machine, under `root` (temp folders and logs).

    Attributes:
        root: this cluster's own folder (each node's Ray temp folder and `ray start` log go under it); keep it short,
            Ray's socket paths under it must stay within 107 bytes.
        object_store_mb: object store of each node (small: the machine is shared).
    """

    root: Path
    object_store_mb: int = 300
    nodes: dict[str, _Node] = field(default_factory=dict)
    address: str = ""

    def _start(self, name: str, args: list[str], num_cpus: int, resources: dict[str, float]) -> None:
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        log = self.root / f"{name}.log"
        ports = ["--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
                 "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port"]
        # This interpreter (not the `ray` on PATH): the processes Ray starts on the node import agentrl the way the
        # driver does (an editable install's package mapping included).
        cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", *args, "--num-cpus", str(num_cpus),
               "--resources", json.dumps(resources),
               "--temp-dir", str(folder), "--object-store-memory", str(self.object_store_mb * 2**20),
               "--disable-usage-stats"]
        for flag in ports:
            cmd += [flag, str(free_port())]
        # Token auth, as `ray start --head` turns it on by default (Ray >= 2.60): a worker joining an explicit
        # address does not look for the token itself.
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token")
        process = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)  # its own group: stopped as one, never others'
        self.nodes[name] = _Node(name, process, resources, log)

    def start_head(self, num_cpus: int, resources: dict[str, float] | None = None) -> str:
        """Start the head node; returns the address workers and drivers join (``IP:PORT``)."""
        port = free_port()
        self._start("head", ["--head", "--port", str(port), "--include-dashboard", "false",
                             "--ray-client-server-port", str(free_port())], num_cpus, resources or {})
        import ray

        self.address = f"{ray.util.get_node_ip_address()}:{port}"  # where `ray start --head` listens
        self._wait_joined("head")
        return self.address

    def add_node(self, name: str, num_cpus: int, resources: dict[str, float] | None = None) -> None:
        """Start a worker node that joins the head."""
        self._start(name, ["--address", self.address], num_cpus, resources or {})
        self._wait_joined(name)

    def _alive(self) -> list[dict]:
        code = (f"import json, ray; from agentrl.cluster import start_ray; start_ray({self.address!r}); "
                "print(json.dumps([n for n in ray.nodes() if n['Alive']], default=str))")
        out = subprocess.run([sys.executable, "-c", code],
            capture_output=True, text=True, timeout=120)
        return json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else []

    def _wait_joined(self, name: str, timeout: float = 120.0) -> None:
        """Wait until node `name` is a live node of the cluster; record its node id (the one no other node has)."""
        node, known = self.nodes[name], {n.node_id for n in self.nodes.values()}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if node.process.poll() is not None:  # `ray start` failed: its log says why
                tail = node.log.read_text().strip().splitlines()[-1:] or ["(no output)"]
                raise RuntimeError(f"node {name} did not start: {tail[0]} (log: {node.log})")
            new = [n["NodeID"] for n in self._alive() if n["NodeID"] not in known]
            if new:
                node.node_id = new[0]
                return
            time.sleep(1.0)
        raise RuntimeError(f"node {name} did not join the Ray cluster at {self.address} in {timeout:.0f}s; see the "
                           f"logs in {self.root}")

    def node_ids(self) -> dict[str, str]:
        """Node id by node name, of the nodes not lost."""
        return {name: node.node_id for name, node in self.nodes.items() if not node.lost}

    def raylet_pid(self, name: str) -> int:
        """The process id of node `name`'s raylet."""
        import psutil

        for child in psutil.Process(self.nodes[name].process.pid).children(recursive=True):
            try:
                if "raylet" in child.name() or any("/raylet" in part for part in child.cmdline()[:1]):
                    return child.pid
            except psutil.Error:
                continue
        raise RuntimeError(f"node {name} has no raylet running")

    def kill_raylet(self, name: str) -> int:
        """kill -9 node `name`'s raylet (its worker processes go with it, as when a machine is lost)."""
        pid = self.raylet_pid(name)
        self.nodes[name].lost = True
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop(self) -> None:
        """End every process this object started: each node's process group, SIGTERM, then SIGKILL after 10 s."""
        for node in reversed(list(self.nodes.values())):
            try:
                os.killpg(node.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for node in self.nodes.values():
            try:
                node.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            try:  # what the node's processes left behind in its group
                os.killpg(node.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            node.process.wait()
        self.nodes.clear()

    def __enter__(self) -> RayNodes:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
