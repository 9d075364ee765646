"""Clients that check what servers send (issue 38, item 5): `RemoteEnv` and `OpenEnvEnv` against hostile servers.

A fake env server (the standard library's `http.server`, on 127.0.0.1 port 0 in a thread) speaks agentrl's env
protocol with answers each test sets byte for byte, so it can send what Python's own JSON encoder never would: the
bare tokens ``NaN`` and ``Infinity``, ``1e400``, a dict where the observation belongs, ``"terminated": "no"``, 300 MB
bodies, nesting 100,000 deep, an ``init_params`` entry that is no name. Every such answer must end in
`RemoteEnvError` (`BadAnswerError`) with a message naming the server, the call and the field; in a rollout it must be
a failed env call, counted, with the run going on. A fake OpenEnv server (the ``websockets`` package's own server)
does the same to `OpenEnvEnv`.

The reward bound: |reward| <= 1e6 (`agentrl.envs.remote.MAX_ABS_REWARD`): built-in envs reward within [0, 1]; 1e300 is
finite but would swamp the group's advantages and overflow once squared.
"""

from __future__ import annotations

import json
import socket
import threading
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import agentrl
from agentrl.envs.remote import (
    MAX_RESPONSE_BYTES,
    BadAnswerError,
    RemoteEnvError,
    remote_env_class,
    strict_json,
)
from agentrl.rollout.pool import EnvMaker, LocalPool

INFO = {"env": "hostile", "name": "hostile", "class": "Hostile", "description": "A test double.",
        "system_prompt": "Play.", "rollout_defaults": {}, "max_episode_steps": 5, "init_params": ["level", "split"],
        "kwargs": {}, "protocol": 1}
RESET = '{"observation": "start", "info": {"task_type": "t"}, "max_episode_steps": 5}'
STEP = '{"observation": "done", "reward": 1.0, "terminated": true, "truncated": false, "info": {"success": true}}'


@dataclass
class Script:
    """What the fake server answers: a body (text) per call, and how a huge body is sent.

    Attributes:
        answers: call name (``info``, ``sessions``, ``reset``, ``step``, ``expert_action``) -> raw JSON text.
        bad_steps: how many step calls get ``answers["bad_step"]`` before the good ``answers["step"]``.
        huge: ``""``, or how a 300 MB step body is sent: ``length`` (announced in Content-Length), ``close``
            (no length, ended by closing), ``chunked``.
        status: call name -> HTTP status to answer with instead of 200.
        sent: body bytes the server managed to send of the huge answer before the client hung up.
        calls: call names in order.
    """

    answers: dict[str, str] = field(default_factory=lambda: {
        "info": json.dumps(INFO), "sessions": '{"session": "s3ssion"}', "reset": RESET, "step": STEP,
        "expert_action": '{"action": "go"}'})
    bad_steps: int = 0
    huge: str = ""
    status: dict[str, int] = field(default_factory=dict)
    sent: int = 0
    huge_done: threading.Event = field(default_factory=threading.Event)
    calls: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


HUGE = 300 * 2**20


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the real server
    script: Script

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        path = self.path.split("?")[0]
        call = ("info" if path.endswith("/info") else "sessions" if path.endswith("/sessions")
                else path.rsplit("/", 1)[-1])
        if self.command == "DELETE":
            call = "delete"
        with self.script.lock:
            self.script.calls.append(call)
            if call == "step" and self.script.bad_steps > 0:
                self.script.bad_steps -= 1
                call = "bad_step"
        if call == "delete":
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if call == "bad_step" and self.script.huge:
            self._huge()
            return
        body = self.script.answers[call].encode()
        self.send_response(self.script.status.get(call, 201 if call == "sessions" else 200))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _huge(self) -> None:
        """Stream a 300 MB JSON string body 1 MiB at a time, counting what gets out before the client hangs up."""
        mode, chunk = self.script.huge, b"x" * 2**20
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if mode == "length":
            self.send_header("Content-Length", str(HUGE))
        elif mode == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        try:
            for _ in range(HUGE // len(chunk)):
                piece = b"%x\r\n%s\r\n" % (len(chunk), chunk) if mode == "chunked" else chunk
                self.wfile.write(piece)
                self.script.sent += len(chunk)
        except OSError:
            pass  # the client hung up: what we wanted
        finally:
            self.close_connection = True
            self.script.huge_done.set()

    do_GET = do_POST = do_DELETE = _answer


@pytest.fixture
def hostile() -> Iterator[tuple[str, Script]]:
    """A fake env server on a free port: (its env URL, the script it follows)."""
    script = Script()
    handler = type("Handler", (_Handler,), {"script": script})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hostile", script
    server.shutdown()
    server.server_close()


def _env(url: str, **limits: object):
    """A fresh `RemoteEnv` for `url` (its class built now, not taken from the cache: the script may have changed)."""
    cls = remote_env_class.__wrapped__(url)
    for name, value in limits.items():
        setattr(cls, name, value)
    cls.retry_seconds = 0.5
    return cls()


def test_the_fake_server_plays_a_good_episode(hostile):
    """The baseline: with honest answers the client plays, so each failure below is the bad field's doing."""
    url, _ = hostile
    env = _env(url)
    assert env.reset(seed=1) == ("start", {"task_type": "t"})
    assert env.step("go") == ("done", 1.0, True, False, {"success": True})
    assert env.expert_action() == "go"
    env.close()


BAD_STEPS = {
    "NaN reward": ('"reward": NaN', "invalid JSON: 'reward' is NaN, not a JSON number"),
    "Infinity reward": ('"reward": Infinity', "'reward' is Infinity, not a JSON number"),
    "-Infinity reward": ('"reward": -Infinity', "'reward' is -Infinity"),
    "overflowing reward": ('"reward": 1e400', "'reward' is 1e400, a number that overflows"),
    "huge reward": ('"reward": 1e300', r"'reward'.*beyond \+-1e\+06"),
    "huge integer reward": ('"reward": ' + "9" * 400, r"'reward'.*beyond"),
    "boolean reward": ('"reward": true', r"'reward'.*a boolean"),
    "string reward": ('"reward": "1.0"', r"'reward'.*a string"),
    "null reward": ('"reward": null', r"'reward'.*null"),
    "dict observation": ('"observation": {"text": "hi"}', r"'observation'.*an object"),
    "terminated no": ('"terminated": "no"', r"'terminated'.*a string \(\"no\"\)"),
    "truncated 0": ('"truncated": 0', r"'truncated'.*a number"),
    "info array": ('"info": []', r"'info'.*an array"),
    "info.success string": ('"info": {"success": "yes"}', r"'info.success'"),
    "info.tools not a list": ('"info": {"tools": "all"}', r"'info.tools'"),
}


def _step_body(override: str) -> str:
    fields = json.loads(STEP)
    key = override.split(":", 1)[0].strip().strip('"')
    rest = {k: v for k, v in fields.items() if k != key}
    return "{" + ", ".join([override, *(f'"{k}": {json.dumps(v)}' for k, v in rest.items())]) + "}"


@pytest.mark.parametrize("override, message", BAD_STEPS.values(), ids=BAD_STEPS.keys())
def test_a_bad_step_answer_is_an_env_error_naming_the_server_and_field(hostile, override, message):
    url, script = hostile
    script.answers["step"] = _step_body(override)
    env = _env(url)
    env.reset(seed=0)
    with pytest.raises(BadAnswerError, match=message) as e:
        env.step("go")
    assert f"env server {url}: POST /sessions/s3ssion/step" in str(e.value)
    assert isinstance(e.value, RemoteEnvError)  # the runner pool's env-error path
    # The session is forgotten, as after any failed call: the next reset opens a new one.
    script.answers["step"] = STEP
    env.reset(seed=0)
    assert env.step("go")[1] == 1.0
    assert script.calls.count("sessions") == 2
    env.close()


@pytest.mark.parametrize("body, message", [
    ('{"observation": "x", "reward": 1, "terminated": true, "truncated": false}', r"'info': missing"),
    ("[1, 2]", r"answered an array.*not a JSON object"),
    ("<html>oops</html>", "invalid JSON"),
    ("", r"answered null"),
    ('{"info": ' + '{"a": ' * 100 + "1" + "}" * 100 + "}", "deeper than 64 levels"),
    ("[" * 100_000 + "]" * 100_000, "deeper than the JSON parser allows"),
    ('{"observation": "x", "reward": 1, "terminated": true, "truncated": false, "info": {"n": ' + "7" * 5000 + "}}",
     "invalid JSON.*digits"),
], ids=["no info", "array", "html", "empty", "nested 100", "nested 100k", "5000 digits"])
def test_malformed_step_bodies_are_env_errors(hostile, body, message):
    url, script = hostile
    script.answers["step"] = body
    env = _env(url)
    env.reset(seed=0)
    with pytest.raises(BadAnswerError, match=message):
        env.step("go")
    env.close()


@pytest.mark.parametrize("call, body, message", [
    ("reset", '{"observation": {"a": 1}, "info": {}, "max_episode_steps": 5}', r"'observation'"),
    ("reset", '{"observation": null, "info": {}, "max_episode_steps": 5}', r"'observation'.*null"),
    ("reset", '{"observation": "x", "info": {}, "max_episode_steps": 0}', r"'max_episode_steps'.*positive"),
    ("reset", '{"observation": "x", "info": {}, "max_episode_steps": "5"}', r"'max_episode_steps'.*a string"),
    ("reset", '{"observation": "x", "info": {}, "max_episode_steps": 2.5}', r"'max_episode_steps'.*a number"),
    ("reset", '{"observation": "x", "info": {}, "max_episode_steps": true}', r"'max_episode_steps'.*a boolean"),
    ("reset", '{"observation": "x", "info": {"task_type": 3}}', r"'info.task_type'"),
    ("reset", '{"observation": "x", "info": {"tools": [1]}}', r"'info.tools'"),
    ("sessions", '{"session": "../../info"}', r"'session'.*not a session id"),
    ("sessions", '{"session": 7}', r"'session'.*a number"),
    ("sessions", '{"sessio": "x"}', r"'session': missing"),
], ids=["dict obs", "null obs", "budget 0", "budget str", "budget float", "budget bool", "task_type", "tools",
        "session path", "session int", "no session"])
def test_bad_reset_and_session_answers_are_env_errors(hostile, call, body, message):
    url, script = hostile
    script.answers[call] = body
    env = _env(url)
    with pytest.raises(BadAnswerError, match=message):
        env.reset(seed=0)
    env.close()


def test_a_bad_expert_action_is_an_env_error(hostile):
    url, script = hostile
    script.answers["expert_action"] = '{"action": ["go"]}'
    env = _env(url)
    env.reset(seed=0)
    with pytest.raises(BadAnswerError, match=r"expert_action answered a bad 'action'"):
        env.expert_action()
    env.close()


def test_error_answers_are_quoted_short_and_without_control_characters(hostile):
    """A 4xx body is quoted into the error, but clipped and without terminal escapes."""
    url, script = hostile
    script.answers["step"] = json.dumps({"error": "\x1b[31mred" + "y" * 5000})
    script.status["step"] = 400
    env = _env(url)
    env.reset(seed=0)
    with pytest.raises(RemoteEnvError, match="-> 400: .x1b.31mredyyy") as e:
        env.step("go")
    assert "\x1b" not in str(e.value) and len(str(e.value)) < 600
    env.close()


@pytest.mark.parametrize("change, message", [
    ({"init_params": ["level", "not a name"]}, r"'init_params'.*\"not a name\" is not a parameter name"),
    ({"init_params": ["class"]}, r"'init_params'.*\"class\""),
    ({"init_params": [3]}, r"'init_params'.*3"),
    ({"init_params": "level"}, r"'init_params'.*a string"),
    ({"init_params": ["level", "level"]}, r"'init_params'.*twice"),
    ({"class": "Evil Env()"}, r"'class'.*not a Python identifier"),
    ({"name": None}, r"'name'.*null"),
    ({"protocol": True}, r"protocol True"),
    ({"protocol": "1"}, r"protocol 1"),
    ({"max_episode_steps": -3}, r"'max_episode_steps'"),
    ({"rollout_defaults": ["tool"]}, r"'rollout_defaults'.*an array"),
    ({"system_prompt": {"a": 1}}, r"'system_prompt'.*an object"),
], ids=["space", "keyword", "int", "str", "twice", "class", "name", "protocol bool", "protocol str", "budget",
        "rollout_defaults", "system_prompt"])
def test_bad_info_is_a_remote_env_error_not_a_traceback(hostile, change, message):
    url, script = hostile
    script.answers["info"] = json.dumps({**INFO, **change})
    with pytest.raises(RemoteEnvError, match=message) as e:
        remote_env_class.__wrapped__(url)
    assert f"env server {url}: GET /info" in str(e.value)
    # `--env URL` reports it as an env that cannot be used (the CLI prints EnvLoadError's message, no traceback).
    with pytest.raises(agentrl.envs.registry.EnvLoadError, match=message):
        agentrl.spec(url)


def test_info_from_a_newer_server_with_extra_fields_is_accepted(hostile):
    url, script = hostile
    script.answers["info"] = json.dumps({**INFO, "client_settings": {"level": {"type": "int"}}, "new": [1]})
    cls = remote_env_class.__wrapped__(url)
    assert cls.__name__ == "RemoteHostile" and cls.max_episode_steps == 5 and cls.system_prompt == "Play."
    assert list(__import__("inspect").signature(cls).parameters) == ["level", "split"]


@pytest.mark.parametrize("mode", ["length", "close", "chunked"])
def test_a_300_mb_answer_is_refused_without_being_read(hostile, mode):
    """The client reads at most the limit (16 MiB) + 1 byte: the server gets little of its 300 MB out, and the
    client's memory peak stays near the limit (the old client read all of it: 941 MiB peak)."""
    url, script = hostile
    script.bad_steps, script.huge = 1, mode
    env = _env(url)
    env.reset(seed=0)
    tracemalloc.start()
    try:
        with pytest.raises(BadAnswerError, match=r"'?POST /sessions/s3ssion/step answered .*over the limit|more "
                                                 r"than 16,777,216 bytes") as e:
            env.step("go")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "max_response_bytes" in str(e.value)
    assert script.huge_done.wait(30), "the server kept sending: the client did not hang up"
    # What got out: the bytes read plus what the kernel's socket buffers held (a few MiB on loopback).
    limit = 0 if mode == "length" else MAX_RESPONSE_BYTES
    assert script.sent < limit + 48 * 2**20, f"the server sent {script.sent / 2**20:.0f} MiB"
    assert peak < limit * 2.5 + 8 * 2**20, f"client memory peak {peak / 2**20:.0f} MiB"
    # The env still works: the broken connection was dropped, a new one serves the next episode.
    env.reset(seed=1)
    assert env.step("go")[1] == 1.0
    env.close()


def test_a_redirect_is_not_followed(hostile):
    url, script = hostile
    script.status["reset"] = 302
    env = _env(url)
    with pytest.raises(BadAnswerError, match="answered 302.*env servers answer 2xx"):
        env.reset(seed=0)
    env.close()


def test_the_response_limit_is_a_setting(hostile):
    url, script = hostile
    script.answers["reset"] = json.dumps({"observation": "o" * 5000, "info": {}, "max_episode_steps": 5})
    small = _env(url, max_response_bytes=4096)
    with pytest.raises(BadAnswerError, match="over the limit of 4,096"):
        small.reset(seed=0)
    small.close()
    big = _env(url, max_response_bytes=8192)
    assert big.reset(seed=0)[0] == "o" * 5000
    big.close()


def test_the_reward_bound_is_a_setting(hostile):
    url, script = hostile
    script.answers["step"] = _step_body('"reward": -250000.5')
    env = _env(url)
    env.reset(seed=0)
    assert env.step("go")[1] == -250000.5  # within the default +-1e6
    env.close()
    tight = _env(url, max_abs_reward=10.0)
    tight.reset(seed=0)
    with pytest.raises(BadAnswerError, match=r"beyond \+-10"):
        tight.step("go")
    tight.close()


def test_strict_json_refuses_what_json_loads_lets_through():
    for text in ("NaN", "[Infinity]", '{"a": -Infinity}', "1e999", "-1e999"):
        with pytest.raises(ValueError):
            strict_json(text)
        json.loads(text)  # the standard library takes every one of them
    assert strict_json('{"a": [1.5, 2, "x", null, true]}') == {"a": [1.5, 2, "x", None, True]}
    assert strict_json("[" * 64 + "]" * 64) is not None
    with pytest.raises(ValueError, match="deeper than 64"):
        strict_json("[" * 65 + "]" * 65)


# -- through a rollout -------------------------------------------------------------------------------------------


def _rollout(url: str, seeds: list[int], tokenizer, retries: int):
    from test_pool import PromptHashEngine

    from agentrl.engine.base import SamplingParams
    from agentrl.engine.requests import BatchedRequests
    from agentrl.rollout.loop import run_rollout

    remote_env_class(url).retry_seconds = 0.5
    with LocalPool(EnvMaker(url), slots=4) as pool:
        return run_rollout(pool, url, seeds, 2, BatchedRequests(PromptHashEngine(tokenizer)), tokenizer,
                           SamplingParams(temperature=0, seed=1), max_turns=3, max_episode_retries=retries)


def test_a_bad_answer_in_a_rollout_is_a_counted_env_error_and_the_run_goes_on(hostile, qwen3_tokenizer):
    url, script = hostile
    script.answers["bad_step"] = _step_body('"reward": NaN')
    script.bad_steps = 2  # the first two steps answer NaN; their episodes are re-run from their seeds
    result = _rollout(url, [0, 1], qwen3_tokenizer, retries=2)
    stats = result.stats
    assert stats.errors == 2 and stats.retries == 2 and stats.dropped_groups == 0
    assert stats.metrics()["env_errors"] == 2.0
    assert len(result.trajectories) == 4 and all(t.success and t.total_return == 1.0 for t in result.trajectories)
    assert all("BadAnswerError" in f and url in f and "'reward' is NaN" in f for f in stats.failures)


def test_a_server_that_always_answers_badly_drops_groups_counted_and_ends(hostile, qwen3_tokenizer):
    url, script = hostile
    script.answers["bad_step"] = _step_body('"terminated": "no"')
    script.bad_steps = 10**6
    result = _rollout(url, [0, 1], qwen3_tokenizer, retries=1)
    assert result.trajectories == [] and result.stats.dropped_groups == 2
    assert result.stats.errors >= 2 and all("'terminated'" in f for f in result.stats.failures)


# -- OpenEnvEnv --------------------------------------------------------------------------------------------------

GOOD_OBS = '{"observation": {"text": "hi", "info": {}}, "reward": null, "done": false}'


@dataclass
class OpenEnvScript:
    """What the fake OpenEnv server sends: the ``data`` of its reset and step answers, as raw JSON text."""

    reset: str = GOOD_OBS
    step: str = '{"observation": {"text": "bye", "info": {"success": true}}, "reward": 1.0, "done": true}'
    raw_step: str = ""  # a whole message instead of {"type": "observation", "data": step}


@pytest.fixture
def fake_openenv() -> Iterator[tuple[str, OpenEnvScript]]:
    """A fake OpenEnv server (``websockets``' own server at ``/ws``): (its base URL, the script it follows)."""
    pytest.importorskip("openenv.core.generic_client",
                        reason="needs openenv-core: pip install 'agentrl-platform[openenv]'")
    from websockets.sync.server import serve

    script = OpenEnvScript()

    def session(ws) -> None:
        for message in ws:
            kind = json.loads(message)["type"]
            if kind == "close":
                return
            if kind == "step" and script.raw_step:
                ws.send(script.raw_step)
                continue
            data = script.reset if kind == "reset" else script.step if kind == "step" else "{}"
            answer = "state" if kind == "state" else "observation"
            ws.send(f'{{"type": "{answer}", "data": {data}}}')

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = serve(session, "127.0.0.1", port, max_size=2**20)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}", script
    server.shutdown()


def test_openenv_fake_server_plays_a_good_episode(fake_openenv):
    url, _ = fake_openenv
    env = agentrl.make(f"openenv+{url}")
    assert env.reset(seed=0) == ("hi", {})
    assert env.step("go") == ("bye", 1.0, True, False, {"success": True})
    env.close()


OPENENV_BAD = {
    "NaN reward": ('{"observation": {"text": "x"}, "reward": NaN, "done": true}', r"'reward'.*nan"),
    "Infinity reward": ('{"observation": {"text": "x"}, "reward": Infinity, "done": true}', r"'reward'.*inf"),
    "huge reward": ('{"observation": {"text": "x"}, "reward": 1e300, "done": true}', r"'reward'.*1e\+300"),
    "string reward": ('{"observation": {"text": "x"}, "reward": "1", "done": true}', r"'reward'.*str"),
    "done no": ('{"observation": {"text": "x"}, "reward": 0, "done": "no"}', r"'done'.*str"),
    "list observation": ('{"observation": ["x"], "reward": 0, "done": true}', r"'observation'.*list"),
    "NaN inside": ('{"observation": {"text": "x", "info": {"score": [1, NaN]}}, "reward": 0, "done": true}',
                   r"'observation'.*info\.score\.1 is nan"),
    "truncated yes": ('{"observation": {"text": "x", "truncated": "yes"}, "reward": 0, "done": true}',
                      r"'observation.truncated'"),
    "success 1": ('{"observation": {"text": "x", "success": 1}, "reward": 0, "done": true}',
                  r"'observation.success'"),
    "info list": ('{"observation": {"text": "x", "info": [1]}, "reward": 0, "done": true}', r"'observation.info'"),
    "info.success": ('{"observation": {"text": "x", "info": {"success": "no"}}, "reward": 0, "done": true}',
                     r"'observation.info.success'"),
    "deep": ('{"observation": {"text": "x", "info": ' + '{"a": ' * 80 + "1" + "}" * 80 + '}, "reward": 0, '
             '"done": true}', r"deeper than 64"),
}


@pytest.mark.parametrize("data, message", OPENENV_BAD.values(), ids=OPENENV_BAD.keys())
def test_openenv_bad_answers_are_env_errors(fake_openenv, data, message):
    from agentrl.envs.remote import BadAnswerError

    url, script = fake_openenv
    script.step = data
    env = agentrl.make(f"openenv+{url}")
    env.reset(seed=0)
    with pytest.raises(BadAnswerError, match=message) as e:
        env.step("go")
    assert f"OpenEnv server {url}: step" in str(e.value)
    # The connection was dropped; the env reconnects for the next episode.
    script.step = OpenEnvScript.step
    assert env.reset(seed=0) == ("hi", {}) and env.step("go")[1] == 1.0
    env.close()


@pytest.mark.parametrize("message, expected", [
    ("[" * 100_000 + "]" * 100_000, r"nested deeper than the parser allows"),
    ('{"type": "observation", "data": "' + "x" * (2**20 + 10) + '"}', r"over the limit of 1,048,576 bytes"),
    ('{"type": "error", "data": {"message": "boom", "code": "EXECUTION_ERROR"}}', r"step failed: RuntimeError.*boom"),
    ("[1]", r"step failed: AttributeError"),
], ids=["nested 100k", "too big", "server error", "not an object"])
def test_openenv_broken_messages_are_env_errors(fake_openenv, message, expected):
    url, script = fake_openenv
    script.raw_step = message
    env = agentrl.make(f"openenv+{url}", max_message_bytes=2**20)
    env.reset(seed=0)
    with pytest.raises(RemoteEnvError, match=expected):
        env.step("go")
    env.close()


def test_openenv_nan_in_a_rollout_is_a_counted_env_error(fake_openenv, qwen3_tokenizer):
    from test_pool import PromptHashEngine

    from agentrl.engine.base import SamplingParams
    from agentrl.engine.requests import BatchedRequests
    from agentrl.rollout.loop import run_rollout

    url, script = fake_openenv
    script.step = '{"observation": {"text": "x"}, "reward": NaN, "done": true}'
    env_id = f"openenv+{url}"
    with LocalPool(EnvMaker(env_id), slots=2) as pool:
        result = run_rollout(pool, env_id, [0], 2, BatchedRequests(PromptHashEngine(qwen3_tokenizer)),
                             qwen3_tokenizer, SamplingParams(temperature=0, seed=1), max_turns=2,
                             max_episode_retries=1)
    assert result.trajectories == [] and result.stats.dropped_groups == 1 and result.stats.errors >= 2
    assert all("BadAnswerError" in f and "'reward'" in f for f in result.stats.failures)
