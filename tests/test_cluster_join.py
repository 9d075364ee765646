"""Clusters the way they are used: ``RAY_ADDRESS`` and ``ray job submit -- agentrl run ...`` join the cluster.

The address choice (flag, else ``RAY_ADDRESS``, else a private local Ray) is tested in-process and fast. The slow test
starts a real head with its dashboard (the Jobs API) on loopback, submits a one-step run with ``ray job submit``, and
checks that the run's driver joined that head rather than starting a Ray of its own. As in test_cluster.py the head
gets a private HOME and RAY_TMPDIR, runs with ``--block`` and is stopped by ending that one process, never by a
machine-wide ``ray stop`` (other Rays on the machine are not ours).

The example cluster files (examples/kuberay-rayjob.yaml, examples/skypilot.yaml) are checked here too: the agentrl
command each runs parses into a valid config, and each file has the fields its schema requires (see those tests for
what was checked against the real schemas, and how).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from agentrl.cluster import ClusterError, _beside_job_env, choose_address, start_ray
from agentrl.recipes.plan import ClusterPlan

EXAMPLES = ROOT / "examples"


# -- the address choice ------------------------------------------------------------------------------------------


def test_an_explicit_address_wins_over_ray_address():
    choice = choose_address("10.0.0.5:6379", {"RAY_ADDRESS": "127.0.0.1:6379"})
    assert (choice.address, choice.source) == ("10.0.0.5:6379", "flag")
    assert "--ray-address" in choice.why


def test_ray_address_joins_that_cluster_when_no_address_is_given():
    for given in (None, ""):
        choice = choose_address(given, {"RAY_ADDRESS": " 127.0.0.1:6379 "})
        assert (choice.address, choice.source) == ("127.0.0.1:6379", "RAY_ADDRESS")
        assert "ray job submit" in choice.why and not choice.warning


def test_neither_starts_a_private_local_ray():
    for environ in ({}, {"RAY_ADDRESS": ""}, {"RAY_ADDRESS": "local"}):
        choice = choose_address(None, environ)
        assert (choice.address, choice.source) == (None, "local"), environ
    assert choose_address("local", {"RAY_ADDRESS": "127.0.0.1:6379"}).address is None  # asked for by name


def test_a_dashboard_url_in_ray_address_is_passed_over_with_the_fix():
    # Ray's docs have users export RAY_ADDRESS=http://HEAD:8265 for the Jobs CLI; a driver cannot join that.
    choice = choose_address(None, {"RAY_ADDRESS": "http://127.0.0.1:8265"})
    assert choice.address is None and choice.source == "local"
    assert "dashboard URL" in choice.warning and "ray job submit --address http://127.0.0.1:8265" in choice.warning
    assert choose_address(None, {"RAY_ADDRESS": "ray://head:10001"}).address == "ray://head:10001"  # Ray client


def test_start_ray_reads_ray_address(monkeypatch):
    # No head needed: an unreachable RAY_ADDRESS must be tried (and named), not passed over for a local Ray.
    import ray

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    assert not ray.is_initialized()
    with pytest.raises(ClusterError, match=f"no Ray cluster answers at 127.0.0.1:{port}.*fix RAY_ADDRESS"):
        start_ray(None, num_cpus=1)
    assert not ray.is_initialized()


def test_the_job_runtime_env_is_left_to_the_job(monkeypatch):
    # `ray job submit --runtime-env-json` hands the driver its job's runtime env; Ray refuses any overlap with ours.
    from ray.runtime_env.runtime_env import _merge_runtime_env

    job = {"env_vars": {"MALLOC_ARENA_MAX": "4", "X": "1"}, "py_modules": ["gcs://job.zip"]}
    ours = {"env_vars": {"MALLOC_ARENA_MAX": "2", "Y": "2"}, "py_modules": ["/src/my_env.py"]}
    assert _merge_runtime_env(job, ours) is None  # what ray.init would do with ours as it is
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": job}))
    fitted = _beside_job_env(ours)
    assert fitted == {"env_vars": {"Y": "2"}}
    assert _merge_runtime_env(job, fitted) == {"env_vars": {"MALLOC_ARENA_MAX": "4", "X": "1", "Y": "2"},
                                               "py_modules": ["gcs://job.zip"]}
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR")
    assert _beside_job_env(ours) == ours  # not a job's driver: nothing to fit


def test_the_plan_says_how_the_cluster_was_chosen():
    plan = ClusterPlan(ray="127.0.0.1:6379",
                       why="joins 127.0.0.1:6379: RAY_ADDRESS is set (`ray job submit` sets it for the job's driver)")
    assert dict(plan.rows())["ray"] == ("127.0.0.1:6379 (joins 127.0.0.1:6379: RAY_ADDRESS is set (`ray job "
                                        "submit` sets it for the job's driver))")


# -- the example cluster files -------------------------------------------------------------------------------------


def _parses_as_a_run(command: str) -> None:
    """`command` (``agentrl run ...``) gives a valid `RunConfig`: flags exist, values pass the config's checks."""
    from agentrl.cli.flags import run_command
    from agentrl.config import apply_overrides, load_config

    argv = shlex.split(command)
    assert argv[:2] == ["agentrl", "run"], command
    seen: dict = {}
    run_command(lambda overrides, **_: seen.update(overrides), [], help="").main(argv[2:], standalone_mode=False)
    cfg = apply_overrides(load_config(None), seen)
    assert cfg.env.id == "webshop" and cfg.runners.count == 32 and cfg.steps == 1  # the headline


def _agentrl_line(script: str) -> str:
    lines = [line.strip() for line in script.splitlines() if line.strip().startswith("agentrl run")]
    assert len(lines) == 1, script
    return lines[0]


def test_the_kuberay_rayjob_runs_the_headline_on_gpu_workers():
    job = yaml.safe_load((EXAMPLES / "kuberay-rayjob.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    spec = job["spec"]
    _parses_as_a_run(spec["entrypoint"])
    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert set(cluster["headGroupSpec"]) >= {"rayStartParams", "template"}
    workers = cluster["workerGroupSpecs"]
    assert any(int(w["template"]["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu", 0)) >= 1
               for w in workers)
    for pod in (head, *(w["template"]["spec"]["containers"][0] for w in workers)):
        assert pod["image"] == head["image"]  # one image everywhere: the driver and the actors run the same code
    assert cluster["rayVersion"] == __import__("ray").__version__


def test_the_kuberay_rayjob_matches_the_crd_schema_where_it_is_at_hand():
    """Against the RayJob CRD's OpenAPI schema, when KUBERAY_RAYJOB_CRD names the CRD file.

    The CRD (ray-operator/config/crd/bases/ray.io_rayjobs.yaml in ray-project/kuberay, 1.4 MB) ships in no PyPI
    package; the file was checked against the v1.7.0 CRD when it was written (see the examples' README note).
    """
    crd_path = os.environ.get("KUBERAY_RAYJOB_CRD")
    if not crd_path:
        pytest.skip("set KUBERAY_RAYJOB_CRD to ray.io_rayjobs.yaml from ray-project/kuberay to check the schema")
    import jsonschema

    crd = yaml.safe_load(Path(crd_path).read_text())
    schema = _strict(next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == "v1"))
    job = yaml.safe_load((EXAMPLES / "kuberay-rayjob.yaml").read_text())
    jsonschema.validate(job, schema)
    job["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParam"] = {}  # a typo must fail, as kubectl's would
    with pytest.raises(jsonschema.ValidationError, match="rayStartParam"):
        jsonschema.validate(job, schema)


def _strict(schema: dict) -> dict:
    """`schema` refusing unknown fields, as ``kubectl apply`` (strict field validation) does; Kubernetes' CRD
    schemas leave that to the API server, so their objects do not say ``additionalProperties: false``."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema and not schema.get(
                "x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [_strict(v) for v in schema]
    return schema


def test_the_skypilot_task_runs_the_headline_after_the_gpu_install():
    task = yaml.safe_load((EXAMPLES / "skypilot.yaml").read_text())
    assert 'pip install -e ".[gpu]"' in task["setup"]
    _parses_as_a_run(_agentrl_line(task["run"]))
    assert task["resources"]["accelerators"]


def test_the_skypilot_task_matches_skypilots_schema_where_it_is_installed():
    """Against SkyPilot's own task and resources schemas (``pip install skypilot``; checked with 0.14.1)."""
    schemas = pytest.importorskip("sky.utils.schemas", reason="pip install skypilot to check its task schema")
    import jsonschema

    task = yaml.safe_load((EXAMPLES / "skypilot.yaml").read_text())
    jsonschema.validate(task, schemas.get_task_schema())
    jsonschema.validate(task["resources"], schemas.get_resources_schema())
    with pytest.raises(jsonschema.ValidationError, match="acelerators"):  # a typo must fail, as `sky launch`'s
        jsonschema.validate({"acelerators": "H100:1"}, schemas.get_resources_schema())


# -- a real `ray job submit` --------------------------------------------------------------------------------------


RAY = (sys.executable, "-m", "ray.scripts.scripts")
"""The `ray` command of this interpreter's Ray (a `ray` first on PATH may be another environment's)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _has_jobs_api() -> bool:
    """The head serves the Jobs API only with the dashboard's dependencies (``pip install "ray[default]"``)."""
    try:
        import ray.dashboard.optional_deps  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture
def job_head():
    """A real head on loopback with its dashboard (the Jobs API), in a private HOME and RAY_TMPDIR."""
    if not _has_jobs_api():
        pytest.skip('`ray job submit` needs the head\'s dashboard: pip install "ray[default]"')
    with tempfile.TemporaryDirectory(prefix="rj", dir="/tmp") as root:  # short: unix socket paths < 108 bytes
        env = dict(os.environ, HOME=f"{root}/h", RAY_TMPDIR=f"{root}/t", RAY_USAGE_STATS_ENABLED="0")
        for name in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_API_SERVER_ADDRESS"):
            env.pop(name, None)
        os.makedirs(env["HOME"])
        os.makedirs(env["RAY_TMPDIR"])
        port, dashboard = _free_port(), _free_port()
        head = subprocess.Popen(
            [*RAY, "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=2",
             "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
             f"--dashboard-agent-listen-port={_free_port()}", f"--dashboard-agent-grpc-port={_free_port()}",
             f"--metrics-export-port={_free_port()}", f"--runtime-env-agent-port={_free_port()}",
             "--disable-usage-stats"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while True:  # up once the Jobs API answers
                assert head.poll() is None and time.monotonic() < deadline, "ray start --head did not come up"
                listed = subprocess.run([*RAY, "job", "list", "--address", f"http://127.0.0.1:{dashboard}"],
                                        env=env, capture_output=True, text=True, timeout=60)
                if listed.returncode == 0:
                    break
                time.sleep(2)
            yield env, port, dashboard
        finally:
            head.terminate()  # --block: the head stops every process it started when its own process ends
            try:
                head.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(head.pid, 9)
                head.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ray_job_submit_runs_one_step_inside_the_submitted_cluster(job_head, tmp_path):
    """~60-90 s here (2 cores): head and dashboard up, then one tiny-qwen3 math step with 2 env runners."""
    env, port, dashboard = job_head
    out = tmp_path / "run"
    run = (f"{shlex.quote(sys.executable)} -m agentrl.cli run --env math --model tiny-qwen3 --steps 1 --group-size 2 "
           f"--prompts-per-step 2 --max-new-tokens 4 --runners 2 --output {shlex.quote(str(out))}")
    submitted = subprocess.run([*RAY, "job", "submit", "--address", f"http://127.0.0.1:{dashboard}", "--", *
                                shlex.split(run)], env=env, capture_output=True, text=True, timeout=480)
    assert submitted.returncode == 0, submitted.stdout[-3000:] + submitted.stderr[-2000:]
    assert (out / "metrics.jsonl").exists()
    plan = json.loads((out / "plan.json").read_text())
    # The job's driver joined the head it was submitted to (RAY_ADDRESS), not a Ray of its own.
    # Ray's job supervisor hands the driver the head's GCS port on this node's own address (it turns 127.0.0.1 into
    # the interface address; the connection still stays on this machine).
    assert plan["cluster"]["ray"].endswith(f":{port}"), plan
    assert "RAY_ADDRESS" in plan["cluster"]["why"], plan
    nodes = json.loads((out / "nodes.json").read_text())  # written for cluster runs only
    listed = subprocess.run([*RAY, "list", "nodes", "--format", "json", "--address",
                             f"http://127.0.0.1:{dashboard}"], env=env, capture_output=True, text=True, timeout=60)
    head_ids = {node["node_id"] for node in json.loads(listed.stdout)}
    assert len(head_ids) == 1, listed.stdout  # the head is the only node: no private Ray joined the cluster
    assert nodes["driver"] in head_ids and set(nodes["runners"]) <= head_ids, (nodes, head_ids)
    # config.yaml keeps what was asked (no address), so a resume in another job joins that job's cluster.
    assert yaml.safe_load((out / "config.yaml").read_text())["ray_address"] is None
