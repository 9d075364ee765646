"""Envs served over HTTP (`agentrl env serve`, `agentrl.envs.server`) and played back (`agentrl.envs.remote.RemoteEnv`).

The contract over the wire: every built-in env, served in-process, plays exactly as the local env on the same seeds
and actions (observations, rewards, terminated / truncated, info). Then the server's guards (token, bind, bounds,
reaping, 1,000 malformed requests), a server killed with SIGKILL in the middle of a rollout, and the CLI.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx", reason="needs httpx (the dev requirements)")
pytest.importorskip("fastapi", reason="needs fastapi (the base install)")
from gymnasium.utils.env_checker import check_env  # noqa: E402
from test_env_contract import JUNK  # noqa: E402

import agentrl  # noqa: E402
from agentrl.envs.remote import RemoteEnvError, remote_env_class  # noqa: E402
from agentrl.envs.server import ServeError, ServeSettings, json_info, start_server  # noqa: E402

ENV_IDS = sorted(agentrl.registered())


@pytest.fixture(scope="module")
def servers():
    running: dict[str, object] = {}
    yield lambda env_id: running.setdefault(env_id, start_server(ServeSettings(env_id, port=0)))
    for server in running.values():
        server.stop()


def _expert_transcript(env, seed: int, max_steps: int = 60):
    obs, info = env.reset(seed=seed)
    out, actions = [(obs, json_info(info))], []
    for _ in range(max_steps):
        action = env.expert_action()
        actions.append(action)
        obs, reward, terminated, truncated, info = env.step(action)
        out.append((obs, float(reward), bool(terminated), bool(truncated), json_info(info)))
        if terminated or truncated:
            break
    return out, actions


def _replay(env, seed: int, actions):
    obs, info = env.reset(seed=seed)
    out = [(obs, json_info(info))]
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        out.append((obs, float(reward), bool(terminated), bool(truncated), json_info(info)))
        if terminated or truncated:
            break
    return out


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_served_env_plays_exactly_like_the_local_env(servers, env_id):
    server = servers(env_id)
    local, remote = agentrl.make(env_id), agentrl.make(server.url)
    assert type(remote).system_prompt == type(local).system_prompt
    assert type(remote).rollout_defaults == type(local).rollout_defaults
    try:
        for seed in (0, 1):
            expected, actions = _expert_transcript(local, seed)
            assert _replay(remote, seed, actions) == expected, f"seed {seed} played differently over HTTP"
            assert expected[-1][4]["success"] is True
            # The expert action travels too: played from the remote env it gives the same episode.
            got, remote_actions = _expert_transcript(remote, seed)
            assert (got, remote_actions) == (expected, actions)
        junk = [JUNK[i % len(JUNK)] for i in range(25)]
        assert _replay(remote, 3, junk) == _replay(local, 3, junk), "junk actions were answered differently"
    finally:
        remote.close()
    assert server.server.health()["sessions"] == 0, "close() must end the session on the server"


def test_served_env_passes_gymnasium_check_env(servers):
    env = agentrl.make(servers("math").url)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(env, skip_render_check=True)
    env.close()


def test_env_kwargs_reach_the_served_env_and_eval_sees_its_split(servers):
    import inspect

    url = servers("math").url
    remote, local = agentrl.make(url, level=2), agentrl.make("math", level=2)
    assert remote.reset(seed=5) == local.reset(seed=5)
    remote.close()
    # `agentrl eval` (`resolve_split`) adds split=test where the env's constructor takes a split: the served class
    # has the served env's parameters.
    served = inspect.signature(agentrl.spec(url).load()).parameters
    assert "split" in served and "level" in served and "shared" not in served
    assert agentrl.envs.registry.short_name(url) == "math"


def test_a_server_bound_beyond_loopback_needs_a_token():
    with pytest.raises(ServeError, match="--token"):
        ServeSettings("math", host="0.0.0.0")
    ServeSettings("math", host="0.0.0.0", token="x")  # fine with a token


def test_token_is_required_when_set(monkeypatch):
    with start_server(ServeSettings("math", port=0, token="s3cret")) as server:
        base = server.url
        assert httpx.get(base + "/health").status_code == 200  # health needs no token
        assert httpx.get(base + "/info").status_code == 401
        assert httpx.get(base + "/info", headers={"Authorization": "Bearer wrong"}).status_code == 401
        with pytest.raises(agentrl.UnknownEnvError, match="401.*AGENTRL_ENV_TOKEN"):
            agentrl.spec(base)
        monkeypatch.setenv("AGENTRL_ENV_TOKEN", "s3cret")
        env = agentrl.make(base)
        assert env.reset(seed=0) == agentrl.make("math").reset(seed=0)
        env.close()


def test_idle_sessions_are_reaped_and_the_client_says_so():
    with start_server(ServeSettings("math", port=0, idle_timeout=0.3)) as server:
        env = agentrl.make(server.url)
        env.reset(seed=0)
        assert server.server.health()["sessions"] == 1
        deadline = time.monotonic() + 10
        while server.server.health()["sessions"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.server.health() | {"rss_mib": 0} == server.server.health() | {
            "sessions": 0, "reaped": 1, "rss_mib": 0}
        with pytest.raises(RemoteEnvError, match="reaped"):
            env.step("\\boxed{1}")
        env.reset(seed=0)  # a new episode opens a new session
        assert server.server.health()["sessions"] == 1
        env.close()


def test_sessions_are_bounded():
    with start_server(ServeSettings("math", port=0, max_sessions=2)) as server:
        cls = remote_env_class(server.url)
        cls.retry_seconds = 0.5
        a, b, c = cls(), cls(), cls()
        a.reset(seed=0), b.reset(seed=1)
        with pytest.raises(RemoteEnvError, match="server full"):
            c.reset(seed=2)
        a.close()
        c.reset(seed=2)  # room again
        assert server.server.health()["sessions"] == 2
        b.close(), c.close()
        # Many opening at once never overshoot the bound.
        with httpx.Client() as client:
            statuses: list[int] = []
            threads = [threading.Thread(target=lambda: statuses.append(
                client.post(server.url + "/sessions", json={}).status_code)) for _ in range(12)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert sorted(statuses) == [201, 201] + [503] * 10 and server.server.health()["sessions"] == 2


def test_1000_malformed_requests_get_4xx_and_the_server_keeps_serving():
    with start_server(ServeSettings("math", port=0)) as server:
        base = server.url
        client = httpx.Client()
        sid = client.post(base + "/sessions", json={}).json()["session"]
        bad = [
            ("POST", "/sessions", {"content": b"{not json"}),
            ("POST", "/sessions", {"json": {"kwargs": "level=2"}}),
            ("POST", "/sessions", {"json": {"kwargs": {"no_such_arg": 1}}}),
            ("POST", f"/sessions/{sid}/reset", {"json": {"seed": -1, "seq": 1}}),
            ("POST", f"/sessions/{sid}/reset", {"json": {"seed": "x", "seq": 1}}),
            ("POST", f"/sessions/{sid}/reset", {"json": {"seed": 0}}),
            ("POST", f"/sessions/{sid}/step", {"json": {"action": 5, "seq": 1}}),
            ("POST", f"/sessions/{sid}/step", {"json": {"action": "x", "seq": 7}}),
            ("POST", "/sessions/nope/step", {"json": {"action": "x", "seq": 1}}),
            ("GET", "/sessions/nope/expert_action", {}),
            ("GET", "/no/such/route", {}),
            ("PUT", "/info", {}),
            ("POST", f"/sessions/{sid}/step", {"content": b"\xff\xfe" * 50}),
        ]
        statuses = [client.request(m, base + path, **kw).status_code for i in range(1000)
                    for m, path, kw in [bad[i % len(bad)]]]
        assert all(400 <= s < 500 for s in statuses), sorted(set(statuses))
        # Still serving, and the session the junk aimed at is intact.
        assert client.post(f"{base}/sessions/{sid}/reset", json={"seed": 0, "seq": 1}).status_code == 200
        assert agentrl.make(base).reset(seed=0) == agentrl.make("math").reset(seed=0)
        assert client.get(base + "/health").json()["status"] == "healthy"
        client.close()


def test_a_retried_step_is_not_applied_twice():
    with start_server(ServeSettings("alfworld", port=0)) as server:
        base, client = server.url, httpx.Client()
        sid = client.post(base + "/sessions", json={}).json()["session"]
        client.post(f"{base}/sessions/{sid}/reset", json={"seed": 0, "seq": 1})
        action = client.get(f"{base}/sessions/{sid}/expert_action").json()["action"]
        first = client.post(f"{base}/sessions/{sid}/step", json={"action": action, "seq": 2}).json()
        again = client.post(f"{base}/sessions/{sid}/step", json={"action": action, "seq": 2}).json()
        assert first == again and server.server.sessions[sid].steps == 1
        client.close()


WALK = textwrap.dedent('''
    import time
    import agentrl

    class Walk(agentrl.TextEnv):
        """Walks for 5 steps; every step takes 50 ms."""

        system_prompt = "Walk."

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.seed, self.t = seed, 0
            return f"start {seed}", {}

        def step(self, action):
            time.sleep(0.05)
            self.t += 1
            done = self.t >= 5
            return f"seed {self.seed} turn {self.t}", 1.0, done, False, {"success": done}

        def expert_action(self):
            return "go"
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_subprocess(env: str, port: int, cwd: Path, *extra: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "env", "serve", "--env", env, "--port", str(port),
                             *extra], cwd=cwd, stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()  # the server announces itself once it listens
    assert "serving" in line, line + proc.stderr.read()
    return proc


def test_a_server_killed_mid_rollout_fails_episodes_that_are_rerun_or_dropped_and_counted(tmp_path, qwen3_tokenizer):
    from test_pool import PromptHashEngine

    from agentrl.engine.base import SamplingParams
    from agentrl.engine.requests import BatchedRequests
    from agentrl.rollout.loop import run_rollout
    from agentrl.rollout.pool import EnvMaker, LocalPool

    (tmp_path / "walk_served.py").write_text(WALK)
    port = _free_port()
    url = f"http://127.0.0.1:{port}/Walk"
    proc = _serve_subprocess("walk_served.py:Walk", port, tmp_path)
    replacement: list[subprocess.Popen] = []
    try:
        remote_env_class(url).retry_seconds = 8.0  # the clients wait this long for a server to come back
        pool = LocalPool(EnvMaker(url), slots=8)
        engine = PromptHashEngine(qwen3_tokenizer)
        generate, calls = engine.generate, []

        def generate_and_kill(prompts, params):  # the server dies once episodes are under way; a supervisor restarts it
            calls.append(len(prompts))
            if len(calls) == 3:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                threading.Thread(target=lambda: replacement.append(
                    _serve_subprocess("walk_served.py:Walk", port, tmp_path))).start()
            return generate(prompts, params)

        engine.generate = generate_and_kill
        result = run_rollout(pool, url, list(range(4)), 2, BatchedRequests(engine), qwen3_tokenizer,
                             SamplingParams(temperature=0, seed=1), max_turns=6, max_episode_retries=2)
        pool.close()
        # With no server at all, every group is dropped and counted; nothing hangs.
        replacement[0].kill(), replacement[0].wait()
        remote_env_class(url).retry_seconds = 0.2
        with LocalPool(EnvMaker(url), slots=2) as dead_pool:
            dead = run_rollout(dead_pool, url, [7], 2, BatchedRequests(engine), qwen3_tokenizer,
                               SamplingParams(temperature=0, seed=1), max_turns=6, max_episode_retries=1)
    finally:
        for p in (proc, *replacement):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert dead.trajectories == [] and dead.stats.dropped_groups == 1 and dead.stats.errors >= 2
    stats = result.stats
    assert stats.errors >= 1 and stats.retries >= 1
    assert any("env server" in f for f in stats.failures)
    groups = [t.group_id for t in result.trajectories]
    assert all(groups.count(g) == 2 for g in set(groups)), "a group is kept whole or not at all"
    assert len(set(groups)) + stats.dropped_groups == 4, "every group is either played or counted as dropped"
    assert all(len(t.turns) == 5 and t.success for t in result.trajectories), "no half-played episode is kept"
    assert len(result.trajectories) == 8, "the restarted server served the re-run episodes"


def test_cli_serves_and_stops_on_sigterm(tmp_path):
    port = _free_port()
    proc = _serve_subprocess("math", port, tmp_path, "--max-sessions", "4")
    try:
        health = httpx.get(f"http://127.0.0.1:{port}/health").json()
        assert health["status"] == "healthy" and health["max_sessions"] == 4
        env = agentrl.make(f"http://127.0.0.1:{port}/math")
        assert env.reset(seed=1) == agentrl.make("math").reset(seed=1)
        env.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == -signal.SIGTERM  # uvicorn shuts down, then dies of the signal it caught
    finally:
        if proc.poll() is None:
            proc.kill()
    bad = subprocess.run([sys.executable, "-m", "agentrl.cli", "env", "serve", "--env", "math", "--host", "0.0.0.0"],
                         capture_output=True, text=True, env={**os.environ, "AGENTRL_ENV_TOKEN": ""})
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--token" in bad.stderr
    unknown = subprocess.run([sys.executable, "-m", "agentrl.cli", "play", "--env", f"http://127.0.0.1:{port}/math"],
                             capture_output=True, text=True)
    assert unknown.returncode == 2 and "agentrl env serve" in unknown.stderr and "Traceback" not in unknown.stderr
    assert json.loads(json.dumps(health))  # health is plain JSON


@pytest.mark.slow  # a full `agentrl run` with Ray runners (about a minute on a loaded 2-core box)
def test_cli_trains_one_step_on_a_served_env_in_ray_runners(tmp_path):
    (tmp_path / "walk_served.py").write_text(WALK)
    port = _free_port()
    proc = _serve_subprocess("walk_served.py:Walk", port, tmp_path)
    try:
        args = ["run", "--env", f"http://127.0.0.1:{port}/Walk", "--model", "tiny-qwen3", "--steps", "1",
                "--group-size", "2", "--prompts-per-step", "2", "--max-new-tokens", "4", "--runners", "2",
                "--output", "run"]
        run = subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True,
                             timeout=300, cwd=tmp_path)
    finally:
        proc.kill()
        proc.wait()
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0] and rows[0]["env_errors"] == 0
    trajectories = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajectories) == 4 and all(len(t["turns"]) == 5 for t in trajectories)


def test_yaml_env_url_names_a_served_env(servers, tmp_path):
    from agentrl.cli.train import _configured
    from agentrl.config import ConfigError, load_config

    url = servers("math").url
    (tmp_path / "run.yaml").write_text(f"env:\n  url: {url}\n  max_turns: 3\n")
    cfg = _configured(load_config(tmp_path / "run.yaml"), {}, ())
    assert cfg.env.id == cfg.env.url == url and cfg.env.max_turns == 3
    assert _configured(cfg, {"env.id": "math"}, ()).env.url == ""  # --env on the command line names another env
    (tmp_path / "both.yaml").write_text(f"env:\n  id: webshop\n  url: {url}\n")
    with pytest.raises(ConfigError, match="env.id must be left out when env.url is set"):
        load_config(tmp_path / "both.yaml")
