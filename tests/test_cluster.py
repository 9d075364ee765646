"""Joining Ray: a real token-auth head on loopback (``ray start --head``), leftover address files, bad addresses.

Every test runs Ray in subprocesses with a private HOME (where Ray keeps its auth token) and RAY_TMPDIR (where it
keeps the address file), so nothing here touches, or is touched by, another Ray on the machine. The head is started
with ``--block`` and stopped by terminating that one process (which stops the processes it started), never by a
machine-wide ``ray stop``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

CONNECT = """
import sys
from agentrl.cluster import ClusterError, start_ray
try:
    start_ray({address!r}, num_cpus=1)
except ClusterError as e:
    print("CLUSTER_ERROR", e)
    sys.exit(3)
import ray
print("CPUS", ray.cluster_resources().get("CPU"), "GCS", ray.get_runtime_context().gcs_address)
ray.shutdown()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_home():
    """Private HOME and RAY_TMPDIR (short: Ray's unix socket paths must stay under 108 bytes)."""
    with tempfile.TemporaryDirectory(prefix="rt", dir="/tmp") as root:
        env = dict(os.environ, HOME=f"{root}/h", RAY_TMPDIR=f"{root}/t", RAY_USAGE_STATS_ENABLED="0")
        env.pop("RAY_ADDRESS", None)
        env.pop("RAY_AUTH_MODE", None)
        env.pop("RAY_AUTH_TOKEN", None)
        os.makedirs(env["HOME"])
        os.makedirs(env["RAY_TMPDIR"])
        yield env


def _python(code: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)


def test_a_leftover_address_file_never_breaks_a_plain_local_run(ray_home):
    # What a stopped `ray start --head` leaves behind: the address file, pointing at nothing.
    (Path(ray_home["RAY_TMPDIR"]) / "ray").mkdir()
    (Path(ray_home["RAY_TMPDIR"]) / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{_free_port()}")
    raw = _python("import ray; ray.init(num_cpus=1)", ray_home)
    assert "num_cpus and num_gpus must not be provided" in raw.stderr  # the trap this guards against
    ours = _python(CONNECT.format(address=None), ray_home)
    assert ours.returncode == 0, ours.stderr[-2000:]
    assert "CPUS 1.0" in ours.stdout


def test_an_unreachable_address_is_one_clear_message(ray_home):
    port = _free_port()
    out = _python(CONNECT.format(address=f"127.0.0.1:{port}"), ray_home, timeout=60)
    assert out.returncode == 3, out.stderr[-2000:]
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in out.stdout and "ray start --head" in out.stdout


@pytest.fixture
def token_head(ray_home):
    """A real head with token auth on loopback (the token in the private HOME, as `ray start` leaves it)."""
    subprocess.run(["ray", "get-auth-token", "--generate"], env=ray_home, capture_output=True, timeout=60,
                   check=True)
    port = _free_port()
    head = subprocess.Popen(["ray", "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1",
                             "--num-cpus=1", "--include-dashboard=false", "--disable-usage-stats"],
                            env=dict(ray_home, RAY_AUTH_MODE="token"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not (Path(ray_home["RAY_TMPDIR"]) / "ray" / "ray_current_cluster").exists():
            assert head.poll() is None and time.monotonic() < deadline, "ray start --head did not come up"
            time.sleep(0.5)
        time.sleep(2)  # the address file is written just before the raylet registers
        yield ray_home, port
    finally:
        head.terminate()  # --block: the head stops every process it started when its own process ends
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, 9)
            head.wait(timeout=10)


def test_host_port_and_auto_both_join_a_token_auth_head(token_head):
    env, port = token_head
    for address in (f"127.0.0.1:{port}", "auto"):
        out = _python(CONNECT.format(address=address), env)
        assert out.returncode == 0 and "CPUS 1.0" in out.stdout, (address, out.stdout, out.stderr[-2000:])
    # A head running on the machine never captures a plain local run either.
    local = _python(CONNECT.format(address=None), env)
    assert local.returncode == 0 and f":{port}" not in local.stdout, local.stderr[-2000:]


@pytest.mark.slow
def test_a_missing_token_is_one_clear_message(token_head):
    env, port = token_head
    (Path(env["HOME"]) / ".ray" / "auth_token").rename(Path(env["HOME"]) / "token.bak")  # this machine has none
    out = _python(CONNECT.format(address=f"127.0.0.1:{port}"), env)
    assert out.returncode == 3, out.stderr[-2000:]
    assert f"could not join the Ray cluster at 127.0.0.1:{port}" in out.stdout and "RAY_AUTH_TOKEN" in out.stdout


@pytest.mark.slow
def test_agentrl_run_on_a_token_auth_head_by_host_port(token_head, tmp_path):
    env, port = token_head
    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "run", "--env", "math", "--model", "tiny-qwen3",
                          "--steps", "1", "--group-size", "2", "--prompts-per-step", "2", "--max-new-tokens", "4",
                          "--runners", "2", "--ray-address", f"127.0.0.1:{port}", "--output", str(tmp_path / "run")],
                         env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "run" / "metrics.jsonl").exists()
