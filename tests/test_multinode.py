"""Two Ray nodes on localhost (separate raylets started with ``ray start``): trainers on one, the engine on the other;
the engine's node is lost mid-run and the run stops with the resume command; a resume after a replacement node joined
finishes the run. Starts a real cluster and three runs (several minutes on 2 shared cores): marked slow.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "micro"))

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # a hang is a failure, never a stuck suite


def test_trainers_and_engines_on_two_nodes_and_a_resume_after_the_engine_node_is_removed(tmp_path):
    from multinode import finish, launch, run_args, step_rows
    from ray_nodes import RayNodes

    ray_root = Path(tempfile.mkdtemp(prefix="arl-nodes-", dir="/tmp"))  # short: Ray's socket paths live under it
    with RayNodes(ray_root) as nodes:
        address = nodes.start_head(num_cpus=2, resources={"trainer_node": 1})
        nodes.add_node("engines", num_cpus=2, resources={"engine_node": 1})
        ids = nodes.node_ids()
        assert ids.keys() == {"head", "engines"} and ids["head"] != ids["engines"]

        out, log = tmp_path / "run", tmp_path / "run.log"
        t0 = time.monotonic()
        proc = launch(run_args(address, out, steps=2), log)
        while proc.poll() is None and not step_rows(out) and time.monotonic() - t0 < 600:
            time.sleep(0.5)
        assert step_rows(out), log.read_text()[-3000:]
        where = json.loads((out / "nodes.json").read_text())
        assert where["trainers"] == [ids["head"]] * 2 and where["engines"] == [ids["engines"]], where
        assert set(where["runners"]) <= {ids["head"], ids["engines"]}
        nodes.kill_raylet("engines")
        stopped = finish(proc, log, t0)
        assert not stopped["hung"] and stopped["rc"] not in (0, None), stopped
        assert f"agentrl run --resume {out}" in stopped["last_line"], stopped
        assert "Traceback" not in log.read_text()

        nodes.add_node("engines2", num_cpus=2, resources={"engine_node": 1})
        log2 = tmp_path / "resume.log"
        resumed = finish(launch([sys.executable, "-m", "agentrl.cli", "run", "--resume", str(out), "--ray-address",
                                 address], log2), log2, time.monotonic())
        assert resumed["rc"] == 0, log2.read_text()[-3000:]
        assert sorted({r["step"] for r in step_rows(out)}) == [0, 1]
        after = json.loads((out / "nodes.json").read_text())
        assert after["engines"] == [nodes.node_ids()["engines2"]] and after["trainers"] == [ids["head"]] * 2
    shutil.rmtree(ray_root, ignore_errors=True)
