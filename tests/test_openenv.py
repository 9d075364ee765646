"""OpenEnv both ways, against the real `openenv-core` package (skipped where it is not installed).

* OpenEnv's own client (`GenericEnvClient`) plays agentrl envs served by `agentrl env serve`: the same episodes as
  local play, the expert action through `state()`, typed-action errors answered as OpenEnv errors.
* An environment written against OpenEnv's server API (`Environment`, `Action`, `Observation`, `create_app`) plays
  as an agentrl `TextEnv` (``--env openenv+http://HOST:PORT``): directly, in a rollout, and for one training step.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import agentrl
from agentrl.envs.server import ServeSettings, json_info, start_server

pytest.importorskip("openenv.core.generic_client", reason="needs openenv-core: pip install 'agentrl-platform[openenv]'")
from openenv.core.generic_client import GenericEnvClient  # noqa: E402


@pytest.mark.parametrize("env_id", ["alfworld", "webshop"])
def test_openenv_client_plays_a_served_agentrl_env(env_id):
    with start_server(ServeSettings(env_id, port=0)) as server:
        local = agentrl.make(env_id)
        with GenericEnvClient(base_url=server.url).sync() as client:
            for seed in (0, 4):
                obs, info = local.reset(seed=seed)
                result = client.reset(seed=seed)
                assert result.observation["text"] == obs and result.observation["info"] == json_info(info)
                assert result.reward is None and result.done is False
                while True:
                    expert = local.expert_action()
                    assert client.state()["expert_action"] == expert
                    obs, reward, terminated, truncated, info = local.step(expert)
                    result = client.step({"text": expert})
                    assert result.observation["text"] == obs and result.reward == reward
                    assert (result.observation["terminated"], result.observation["truncated"]) == (terminated,
                                                                                                  truncated)
                    assert result.done == (terminated or truncated)
                    assert result.observation["info"] == json_info(info)
                    if result.done:
                        break
                assert result.observation["info"]["success"] is True
            assert client.state()["step_count"] > 0
            with pytest.raises(RuntimeError, match="VALIDATION_ERROR|an action is"):
                client.step({"command": "look"})  # a typed action of another env: refused, the session goes on
            assert client.reset(seed=0).observation["text"] == local.reset(seed=0)[0]
        deadline = time.monotonic() + 5
        while server.server.health()["sessions"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.server.health()["sessions"] == 0, "closing the WebSocket ends the session"


def test_agentrl_openenv_adapter_round_trips_a_served_agentrl_env():
    """`OpenEnvEnv` over our own server: terminated/truncated, info and the expert action survive the round trip."""
    with start_server(ServeSettings("alfworld", port=0)) as server:
        env = agentrl.make("openenv+" + server.url)
        local = agentrl.make("alfworld")
        for seed in (1, 2):
            assert env.reset(seed=seed) == local.reset(seed=seed)
            while True:
                action = env.expert_action()
                assert action == local.expert_action()
                got, want = env.step(action), local.step(action)
                assert got[:4] == want[:4] and got[4] == json_info(want[4])
                if got[2] or got[3]:
                    break
        env.close()


GUESS_OPENENV = textwrap.dedent('''
    """A guessing game written against OpenEnv's server API (not agentrl's)."""

    import random

    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State


    class GuessAction(Action):
        message: str


    class GuessObservation(Observation):
        prompt: str = ""


    class GuessEnvironment(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self):
            super().__init__()
            self._state = State()
            self.secret, self.tries = 0, 0

        def reset(self, seed=None, episode_id=None, **kwargs):
            self.secret = random.Random(seed).randint(1, 8)
            self.tries = 0
            self._state = State(episode_id=episode_id, step_count=0)
            return GuessObservation(prompt="Guess my number, 1 to 8.", done=False, reward=None)

        def step(self, action, timeout_s=None, **kwargs):
            self.tries += 1
            self._state.step_count += 1
            try:
                guess = int(action.message.strip())
            except ValueError:
                return GuessObservation(prompt="Reply with an integer.", done=self.tries >= 4, reward=0.0)
            if guess == self.secret:
                return GuessObservation(prompt="Correct!", done=True, reward=1.0)
            hint = "higher" if guess < self.secret else "lower"
            return GuessObservation(prompt=hint, done=self.tries >= 4, reward=0.0)

        @property
        def state(self):
            return self._state


    app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=16)
''')


@pytest.fixture(scope="module")
def openenv_guess(tmp_path_factory):
    folder = tmp_path_factory.mktemp("openenv")
    (folder / "openenv_guess.py").write_text(GUESS_OPENENV)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "openenv_guess:app", "--port", str(port),
                             "--log-level", "warning"], cwd=folder)
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url + "/health").status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "the OpenEnv server did not start"
        time.sleep(0.2)
    yield url, folder
    proc.kill()
    proc.wait()


def _secret(seed: int) -> int:
    import random

    return random.Random(seed).randint(1, 8)


def test_an_openenv_environment_plays_as_a_text_env(openenv_guess):
    url, _ = openenv_guess
    env = agentrl.make(f"openenv+{url}", action_field="message", observation_field="prompt")
    obs, info = env.reset(seed=3)
    assert obs == "Guess my number, 1 to 8." and info == {}
    low, high, steps = 1, 8, 0
    while True:
        guess = (low + high) // 2
        obs, reward, terminated, truncated, info = env.step(str(guess))
        steps += 1
        if obs == "higher":
            low = guess + 1
        elif obs == "lower":
            high = guess - 1
        if terminated or truncated:
            break
    assert obs == "Correct!" and guess == _secret(3) and reward == 1.0 and info["success"] is True
    assert terminated and not truncated
    env.reset(seed=3)
    assert env.step("nonsense")[0] == "Reply with an integer."
    env.close()


@pytest.mark.slow  # a full `agentrl run` (about a minute on a loaded 2-core box)
def test_an_openenv_environment_trains_one_step(openenv_guess, tmp_path):
    url, _ = openenv_guess
    args = ["run", "--env", f"openenv+{url}", "--env-arg", "action_field=message", "--env-arg",
            "observation_field=prompt", "--model", "tiny-qwen3", "--steps", "1", "--group-size", "2",
            "--prompts-per-step", "2", "--max-new-tokens", "4", "--output", "run"]
    proc = subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0] and rows[0]["env_errors"] == 0
    trajectories = [json.loads(line) for line in Path(tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajectories) == 4
    assert all(t["first_observation"] == "Guess my number, 1 to 8." for t in trajectories)
