"""Property-based fuzzing of both servers' request schemas: the attack suite of issue 38 (Deliver item 6).

Two in-process servers on 127.0.0.1, port 0: the env server (`agentrl.envs.server`, serving the built-in math env,
which has no bug of its own, so any 500 is the server's) and `agentrl serve` (`agentrl.serve.server`, on the real
Qwen3 tokenizer and template with a stand-in engine, see `Echo`). Hypothesis writes the requests a hostile client
could send: JSON of every shape (huge ints, raw ``NaN`` / ``Infinity``, deep nesting, long and unicode strings,
wrong types), hostile sampling settings, session ids, methods, ``Host`` / ``Content-Length`` / ``Content-Type``
headers, OpenEnv WebSocket messages. The properties hold whatever exact 4xx a server picks:

* no 5xx for any client input;
* every answer body is strict JSON (``NaN`` / ``Infinity`` refused) and every error is in the server's error shape
  (``{"error": str}`` for the env server, OpenAI's ``{"error": {"message": ...}}`` for ``agentrl serve``);
* the server answers ``/health`` after every example;
* sessions and memory stay bounded: the env server holds only the sessions the client was given, and none once
  they are closed; `agentrl serve`'s recorder keeps within the (small) caps it was given, and writes what it evicts;
  the process RSS grows by less than `RSS_GROWTH` from a server's start.

Not fuzzed here: a ``Content-Length`` larger than the body sent (the slow-client case: the server rightly waits
for the body, a read-timeout test of its own in tests/test_env_server_hardening.py), bodies over the size limits
(declared ones are), the token (both servers run without one, on loopback). The default run gives each property
120 examples (the file runs in about a minute); each ``test_slow_...`` twin (``-m slow``) runs the same property
with 1,500.
"""

from __future__ import annotations

import json
import re
import select
import socket
import subprocess
import sys
import threading
import time
from typing import Any
from urllib.parse import quote

import psutil
import pytest

hypothesis = pytest.importorskip("hypothesis")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from agentrl.engine.base import EngineResult, Generation, SamplingParams  # noqa: E402
from agentrl.envs.server import ServeSettings  # noqa: E402
from agentrl.envs.server import start_server as start_env_server  # noqa: E402

RSS_GROWTH = 256 * 2**20
"""Most a test's fuzzing may grow the process RSS by (both servers run in this process)."""
MAX_SESSIONS = 32
SERVE_CAPS = {"max_sessions": 16, "max_calls_per_session": 64, "max_bytes": 4 * 2**20}
"""`agentrl serve`'s recorder caps in the fuzzing: small, so the fuzzing reaches them."""
TIMEOUT = 30.0  # seconds a client waits for one answer: far above any honest answer of these servers

FAST = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
SLOW = settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))


# ---- strict JSON and the error shapes ----------------------------------------------------------------------------

def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


def strict_json(raw: bytes | str) -> Any:
    """`raw` parsed as RFC 8259 JSON: ``NaN``, ``Infinity`` and ``-Infinity`` raise `ValueError`."""
    return json.loads(raw, parse_constant=_no_constant)


def env_error_shape(payload: Any) -> bool:
    """The env server's error body: ``{"error": "what is wrong"}``."""
    return isinstance(payload, dict) and isinstance(payload.get("error"), str) and payload["error"] != ""


def openai_error_shape(payload: Any) -> bool:
    """`agentrl serve`'s error body, OpenAI's: ``{"error": {"message": ..., "type": ...}}``."""
    error = payload.get("error") if isinstance(payload, dict) else None
    return isinstance(error, dict) and isinstance(error.get("message"), str) and error["message"] != ""


def check_answer(status: int, headers: Any, body: bytes, error_shape: Any, what: str, method: str = "POST") -> Any:
    """Assert the properties every answer must have; returns the parsed body (None when empty)."""
    assert status < 500, f"{what}: answered {status} (a client must never cause a 5xx): {body[:300]!r}"
    if method == "HEAD" or status in (204, 304) or (not body and 200 <= status < 400):
        return None  # no body to check (a redirect, such as a trailing slash's, carries none)
    content_type = headers.get("content-type", "")
    try:
        if "text/event-stream" in content_type:  # every event of a stream is one JSON object
            return [strict_json(line[6:]) for line in body.decode().split("\n")
                    if line.startswith("data: ") and line != "data: [DONE]"]
        payload = strict_json(body)
    except ValueError as e:
        raise AssertionError(f"{what}: answered {status} with a body that is not strict JSON ({e}): "
                             f"{body[:300]!r}") from None
    if status >= 400:
        assert error_shape(payload), f"{what}: error {status} not in the server's error shape: {body[:300]!r}"
    return payload


def fuzz(**strategies: st.SearchStrategy) -> Any:
    """Decorator: the property as a test of `FAST` size, and its twin ``test_slow_...`` of `SLOW` size, marked slow."""

    def wrap(prop: Any) -> Any:
        globals()[prop.__name__.replace("test_", "test_slow_", 1)] = pytest.mark.slow(SLOW(given(**strategies)(prop)))
        return FAST(given(**strategies)(prop))

    return wrap


def _rss() -> int:
    return psutil.Process().memory_info().rss


_BASELINE_RSS: dict[str, int] = {}
"""The process RSS once each server started (both run in this process)."""


def check_rss(server: str) -> None:
    """The process grew by less than `RSS_GROWTH` since `server` started."""
    grown = _rss() - _BASELINE_RSS[server]
    assert grown < RSS_GROWTH, f"the process grew by {grown / 2**20:.0f} MiB while fuzzing {server}"


# ---- raw HTTP (headers httpx will not send) ----------------------------------------------------------------------

def raw_request(port: int, head: bytes, body: bytes = b"", timeout: float = TIMEOUT) -> tuple[int, dict, bytes]:
    """Send one HTTP/1.1 request as bytes and read the answer to the end (the request says ``Connection: close``).

    Returns (status, lower-cased headers, body); status 0 when the server closed without answering, -1 when it
    had not answered within `timeout`.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head + body)
        chunks = []
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                break
            except TimeoutError:
                return -1, {}, b"".join(chunks)
            if not data:
                break
            chunks.append(data)
    raw = b"".join(chunks)
    if not raw:
        return 0, {}, b""
    top, _, rest = raw.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out, i = [], 0
        while True:
            end = rest.index(b"\r\n", i)
            size = int(rest[i:end].split(b";")[0], 16)
            if size == 0:
                break
            out.append(rest[end + 2: end + 2 + size])
            i = end + 2 + size + 2
        rest = b"".join(out)
    return status, headers, rest


def http_head(method: str, path: str, headers: list[tuple[str, str]]) -> bytes:
    """The request line and headers of a raw request (``Connection: close`` added)."""
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers), "Connection: close", "", ""]
    return "\r\n".join(lines).encode("utf-8", "surrogateescape")


# ---- hostile JSON ------------------------------------------------------------------------------------------------

class Text(str):
    """A WebSocket text frame whose repr stays short (see `Body`)."""

    def __repr__(self) -> str:
        if len(self) <= 400:
            return str.__repr__(self)
        return f"Text({str(self[:80])!r} + ... {len(self)} characters ... + {str(self[-20:])!r})"


class Body(bytes):
    """A request body whose repr stays short: Hypothesis prints failing examples, some bodies are 200 KB."""

    def __repr__(self) -> str:
        if len(self) <= 400:
            return bytes.__repr__(self)
        return f"Body({bytes(self[:80])!r} + ... {len(self)} bytes ... + {bytes(self[-20:])!r})"


def as_body(value: Any) -> Body:
    """`value` as a JSON body, non-finite floats written as raw ``NaN`` / ``Infinity`` (as `json.dumps` does)."""
    return Body(json.dumps(value, allow_nan=True).encode())


HUGE_INTS = [2**31, 2**63, 2**64, 2**70, -(2**63) - 1, 10**100]
# Raw bodies json.dumps cannot write: over Python's 4,300-digit int limit, nesting past any recursion limit.
RAW_HOSTILE = [Body(b) for b in (
    b"", b"null", b"{not json", b"\xff\xfe\x00", b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 50_000 + b"1" + b"}" * 50_000, b"1" * 5000, b'{"seq": ' + b"9" * 5000 + b"}", b"NaN", b"-Infinity",
    b'"' + b"\\ud800" + b'"', b"\x00" * 64)]

leaves = (st.none() | st.booleans() | st.integers() | st.sampled_from(HUGE_INTS)
          | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=40)
          | st.text(alphabet=st.characters(codec="utf-8"), min_size=1000, max_size=5000))
json_values = st.recursive(leaves, lambda kids: st.lists(kids, max_size=4)
                           | st.dictionaries(st.text(max_size=12), kids, max_size=4), max_leaves=10)


def deep(depth: int) -> Any:
    """`depth` nested lists: valid JSON no recursive walk of a server should choke on."""
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


nested = st.integers(min_value=50, max_value=900).map(deep)  # json.dumps stops near 1,000; RAW_HOSTILE goes on
hostile = json_values | nested


def body_of(fields: dict[str, st.SearchStrategy]) -> st.SearchStrategy[bytes]:
    """Bodies around a schema: its fields with plausible or hostile values and extra keys, or raw junk."""
    as_object = st.fixed_dictionaries({}, optional={k: v | hostile for k, v in fields.items()})
    extra = st.dictionaries(st.text(max_size=12), hostile, max_size=2)
    objects = st.builds(lambda a, b: {**b, **a}, as_object, extra)
    return (objects | hostile).map(as_body) | st.sampled_from(RAW_HOSTILE)


# ---- the env server ----------------------------------------------------------------------------------------------

OPERATOR_ONLY = ("source", "extractor", "verifier", "cache_dir", "data_dir", "shared")
"""Math env (and WebShop) settings that name code, files or folders: only the operator may set them (issue 38)."""
CLIENT_SETTINGS = ("split", "level", "mode", "max_turns", "strict", "reward_correct", "reward_wrong",
                   "reward_no_answer", "format_bonus")
"""The math env's settings a client may set (bounded plain values); its other arguments are the operator's."""
# Harmless importable names and paths: an old server resolves or reads them; none runs a shell.
SETTING_PROBES = ["json:dumps", "builtins:len", "os.path:exists", "math:sqrt", "/etc/hostname", "/etc/shadow",
                  "/nonexistent/problems.jsonl", "/tmp", "../../etc/passwd", "http://127.0.0.1:1/x.jsonl"]
setting_values = st.sampled_from(SETTING_PROBES) | hostile
kwargs_keys = st.sampled_from(["split", "level", "mode", "max_turns", "verify_timeout_s", "strict", "reward_correct",
                               "reward_wrong", "format_bonus", *OPERATOR_ONLY, "no_such_arg", "", "__class__"])
kwargs_dicts = st.dictionaries(kwargs_keys, st.sampled_from(["train", "test", 1, 2, 3, True]) | setting_values,
                               max_size=3)

actions = (st.text(max_size=200) | st.sampled_from([r"\boxed{4}", r"\boxed{}", r"\boxed{\frac{1}{0}}", "}" * 1000,
                                                    r"\boxed{" * 500, "\x00", "\ud7ff" * 100])
           | st.text(min_size=5000, max_size=20000))


@pytest.fixture(scope="module")
def env_server():
    running = start_env_server(ServeSettings("math", port=0, max_sessions=MAX_SESSIONS, step_timeout=20.0))
    client = httpx.Client(timeout=TIMEOUT)
    _BASELINE_RSS["the env server"] = _rss()
    yield running, client
    client.close()
    running.stop()


def env_port(running: Any) -> int:
    return int(running.url.split(":")[2].split("/")[0])


def env_healthy(running: Any, client: Any, open_sessions: set[str] = frozenset()) -> None:
    """``/health`` answers, and the server holds exactly the sessions the client was given (after a grace)."""
    deadline = time.monotonic() + 3.0
    while True:
        answer = client.get(running.url.rsplit("/", 1)[0] + "/health")
        payload = check_answer(answer.status_code, answer.headers, answer.content, env_error_shape, "GET /health",
                               "GET")
        assert answer.status_code == 200, f"/health answered {answer.status_code}"
        held = payload["sessions"]
        assert held <= MAX_SESSIONS, f"{held} sessions open, over --max-sessions {MAX_SESSIONS}"
        if held == len(open_sessions) or time.monotonic() > deadline:
            break
        time.sleep(0.05)  # a WebSocket session closes once its handler sees the disconnect
    assert held == len(open_sessions), (f"the server holds {held} sessions, the client was given "
                                        f"{len(open_sessions)}: sessions leak")
    check_rss("the env server")


def env_call(client: Any, method: str, url: str, body: bytes | None = None, what: str = "") -> tuple[int, Any]:
    answer = client.request(method, url, content=body, headers={"Content-Type": "application/json"})
    what = what or f"{method} {url.split('/', 3)[3]} {(body or b'')[:120]!r}"
    return answer.status_code, check_answer(answer.status_code, answer.headers, answer.content, env_error_shape, what,
                                            method)


def _close_all(client: Any, url: str, sids: set[str]) -> None:
    for sid in sids:
        status = client.delete(f"{url}/sessions/{sid}").status_code
        assert status < 500, f"closing a session answered {status}"
    sids.clear()


_OPENED_SETTINGS: set[str] = set()
"""The valid settings sets a fuzz run opened sessions with: the shared-state slots they may legitimately hold."""


@fuzz(kwargs=kwargs_dicts | hostile, raw=st.none() | body_of({"kwargs": kwargs_dicts}))
def test_env_sessions_fuzz(env_server, kwargs, raw):
    """``POST /math/sessions``: any body is 2xx or 4xx; settings naming code or files are refused by name."""
    running, client = env_server
    url, opened = running.url, set()
    sent = raw if raw is not None else as_body({"kwargs": kwargs})
    try:
        status, payload = env_call(client, "POST", f"{url}/sessions", sent)
        if 200 <= status < 300:
            opened.add(payload["session"])
            _OPENED_SETTINGS.add(json.dumps(kwargs, sort_keys=True, default=str))
        if raw is None and isinstance(kwargs, dict) and any(k in OPERATOR_ONLY for k in kwargs):
            # Issue 38: a 4xx naming a setting the client may not set, never the server's reaction to a value.
            refused = [k for k in kwargs if k not in CLIENT_SETTINGS]
            assert 400 <= status < 500, f"kwargs {kwargs!r} naming {refused} answered {status}"
            assert any(repr(k) in payload["error"] for k in refused), (
                f"the refusal of {kwargs!r} does not name a refused setting: {payload['error']!r}")
            for reaction in ("No such file", "invalid JSON", "Permission denied", "Is a directory"):
                assert reaction not in payload["error"], f"the refusal of {kwargs!r} tells: {payload['error']!r}"
        # Failed builds must not use up the shared-state slots: a new valid set (what `agentrl eval` sends) opens
        # while fewer than 2 other valid sets were opened in this run.
        if len(_OPENED_SETTINGS - {"{}", '{"split": "test"}'}) < 2:
            status, payload = env_call(client, "POST", f"{url}/sessions",
                                       json.dumps({"kwargs": {"split": "test"}}).encode())
            assert status == 201, f"a valid new settings set refused after {kwargs!r}: {status} {payload}"
            opened.add(payload["session"])
    finally:
        _close_all(client, url, opened)
    env_healthy(running, client)


reset_bodies = body_of({"seed": st.integers(min_value=0, max_value=2**31) | st.sampled_from(HUGE_INTS),
                        "options": st.dictionaries(st.text(max_size=8), json_values, max_size=3),
                        "seq": st.integers(min_value=-2, max_value=4) | st.sampled_from(HUGE_INTS)})
step_bodies = body_of({"action": actions, "seq": st.integers(min_value=-2, max_value=6) | st.sampled_from(HUGE_INTS)})
calls = st.lists(st.tuples(st.sampled_from(["reset", "step", "expert_action", "delete", "reset_ok", "step_ok"]),
                           reset_bodies, step_bodies, actions), min_size=1, max_size=6)


@fuzz(calls=calls)
def test_env_session_calls_fuzz(env_server, calls):
    """Reset / step / expert_action / delete in any order with any bodies: 2xx or 4xx, and the session survives
    every 4xx (a valid call right after a refused one still succeeds)."""
    running, client = env_server
    url = running.url
    status, payload = env_call(client, "POST", f"{url}/sessions", b"{}")
    assert status == 201, payload
    sid, opened, seq, was_reset, closed = payload["session"], {payload["session"]}, 0, False, False
    try:
        for kind, reset_body, step_body, action in calls:
            if kind == "delete":
                env_call(client, "DELETE", f"{url}/sessions/{sid}")
                opened.discard(sid)
                closed = True
            elif kind == "expert_action":
                status, payload = env_call(client, "GET", f"{url}/sessions/{sid}/expert_action")
                if not closed and was_reset:
                    assert status == 200, f"expert_action after reset answered {status}: {payload}"
            elif kind in ("reset", "step"):
                status, payload = env_call(client, "POST", f"{url}/sessions/{sid}/{kind}",
                                           reset_body if kind == "reset" else step_body)
                if 200 <= status < 300:  # accepted: the body was a valid call (pydantic may coerce "2" to 2)
                    seq = int(strict_json(reset_body if kind == "reset" else step_body)["seq"])
                    was_reset = kind == "reset" or not (payload.get("terminated") or payload.get("truncated"))
            else:  # a valid call: the session must have survived whatever came before
                valid = {"seed": 0, "seq": seq + 1} if kind == "reset_ok" else {"action": action, "seq": seq + 1}
                status, payload = env_call(client, "POST", f"{url}/sessions/{sid}/{kind[:-3]}", as_body(valid))
                if closed:
                    assert 400 <= status < 500, f"a call to a closed session answered {status}"
                elif kind == "reset_ok" or was_reset:
                    assert status == 200, f"a valid {kind[:-3]} after refused calls answered {status}: {payload}"
                if 200 <= status < 300:
                    seq += 1
                    was_reset = kind == "reset_ok" or not (payload.get("terminated") or payload.get("truncated"))
    finally:
        _close_all(client, url, opened)
    env_healthy(running, client)


_segment = st.text(max_size=40) | st.sampled_from(["..", "%2e%2e", "%00", "a" * 5000, "sessions", "health", "ws"])
paths = st.builds(lambda parts: "/" + "/".join(quote(p, safe="%") for p in parts),
                  st.lists(st.sampled_from(["math", "sessions", "reset", "step", "expert_action", "info", "health"])
                           | _segment, max_size=5))
methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"])


@fuzz(method=methods, path=paths | st.builds(lambda s, tail: f"/math/sessions/{quote(s, safe='')}{tail}", _segment,
                                              st.sampled_from(["", "/reset", "/step", "/expert_action"])),
       body=st.none() | step_bodies)
def test_env_paths_and_methods_fuzz(env_server, method, path, body):
    """Any method on any path (session ids included): no 5xx, JSON answers, nothing opened behind the client."""
    running, client = env_server
    base = running.url.rsplit("/", 1)[0]
    answer = client.request(method, base + path, content=body)
    payload = check_answer(answer.status_code, answer.headers, answer.content, env_error_shape,
                           f"{method} {path[:200]}", method)
    opened = {payload["session"]} if isinstance(payload, dict) and isinstance(payload.get("session"), str) else set()
    _close_all(client, running.url, opened)
    env_healthy(running, client)


LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "[::1]"]
foreign_hosts = (st.sampled_from(["attacker.example", "127.0.0.1.attacker.example", "localhost.attacker.example",
                                  "evil.test", "10.0.0.1", "192.168.1.1", "0.0.0.0", "example.com"])
                 | st.from_regex(r"\A[a-z][a-z0-9-]{0,20}(\.[a-z0-9-]{1,10}){1,3}\Z").filter(
                     lambda h: h != "localhost"))
content_types = st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain", "",
                                 "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                                 "application/json; charset=latin-1", "*/*", "\u00e9"])
bad_lengths = st.sampled_from(["abc", "-1", "1e3", "0x10", "+5", "", "1,1", "١٢", "5 5"])


@fuzz(host=st.sampled_from(LOOPBACK_HOSTS) | foreign_hosts, with_port=st.booleans(),
       length=st.sampled_from(["exact", "short", "zero", "huge"]) | bad_lengths, content_type=content_types,
       route=st.sampled_from(["/math/info", "/math/sessions", "/math/sessions/x/step"]),
       body=st.sampled_from([b'{"kwargs": {}}', b'{"action": "x", "seq": 1}', b"{}", b"not json", b""]))
def test_env_headers_fuzz(env_server, host, with_port, length, content_type, route, body):
    """Host, Content-Length and Content-Type of every kind: foreign hosts refused, no 5xx, the server serves on."""
    running, client = env_server
    port = env_port(running)
    method = "GET" if route == "/math/info" else "POST"
    framing_ok = length in ("exact", "short", "zero", "huge")  # Content-Length is one decimal number
    declared = {"exact": str(len(body)), "short": str(max(len(body) - 2, 0)), "zero": "0",
                "huge": str(10**12)}.get(length, length)
    head = http_head(method, route, [("Host", f"{host}:{port}" if with_port else host),
                                     ("Content-Type", content_type), ("Content-Length", declared)])
    status, headers, answer = raw_request(port, head, body)
    what = f"{method} {route} Host={host!r} Content-Length={declared!r} Content-Type={content_type!r}"
    assert status != 0, f"{what}: the server closed the connection without an answer"
    assert status != -1, f"{what}: no answer within {TIMEOUT:.0f}s"
    payload = check_answer(status, headers, answer, env_error_shape, what, method)
    if isinstance(payload, dict) and isinstance(payload.get("session"), str):
        _close_all(client, running.url, {payload["session"]})
    if not framing_ok:  # a Content-Length that is not one decimal number: the body cannot be framed
        assert 400 <= status < 500, f"{what}: answered {status}: {answer[:200]!r}"
    if host not in LOOPBACK_HOSTS:  # DNS rebinding: a page's request carries its own name as Host
        assert 400 <= status < 500, f"{what}: a foreign Host was served ({status})"
    if length == "huge" and method == "POST":  # refused from the header, before reading (or waiting for) a byte
        assert 400 <= status < 500, f"{what}: a body declared at 1 TB was accepted ({status})"
    env_healthy(running, client)


ws_messages = st.one_of(
    st.builds(lambda kind, data: Text(json.dumps({"type": kind, "data": data}, allow_nan=True)),
              st.sampled_from(["reset", "step", "state", "junk", "", None]),
              st.fixed_dictionaries({}, optional={"seed": st.integers(min_value=0, max_value=9) | hostile,
                                                  "text": actions, "options": hostile, "episode_id": hostile,
                                                  "metadata": hostile}) | hostile),
    hostile.map(lambda v: Text(json.dumps(v, allow_nan=True))),
    st.sampled_from([Text(m.decode("latin-1")) for m in RAW_HOSTILE]),
    st.binary(max_size=64),
    st.just(json.dumps({"type": "close"})),
)


@fuzz(messages=st.lists(ws_messages, min_size=1, max_size=5))
def test_env_openenv_websocket_fuzz(env_server, messages):
    """OpenEnv WebSocket messages of every kind: each is answered with a JSON message (an error for a bad one), or
    the server closes with a close frame and a code (never a dropped connection, 1006)."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    running, client = env_server
    ws_url = running.url.replace("http", "ws", 1) + "/ws"
    with connect(ws_url, open_timeout=TIMEOUT, close_timeout=5, max_size=None) as ws:
        for message in messages:
            try:
                ws.send(message)
                if message == json.dumps({"type": "close"}):
                    ws.recv(timeout=TIMEOUT)  # the server closes: ConnectionClosed below
                    raise AssertionError("a close message was answered instead of closing")
                reply = ws.recv(timeout=TIMEOUT)
            except ConnectionClosed as e:
                assert e.rcvd is not None, (f"after {message[:120]!r} the server dropped the connection without a "
                                            f"close frame (1006)")
                break
            assert isinstance(reply, str), f"a binary reply to {message[:120]!r}"
            try:
                payload = strict_json(reply)
            except ValueError as e:
                raise AssertionError(f"the reply to {message[:120]!r} is not strict JSON ({e}): {reply[:300]}") \
                    from None
            assert isinstance(payload, dict) and payload.get("type") in ("observation", "state", "error"), reply[:300]
            if payload["type"] == "error":
                assert isinstance(payload["data"]["message"], str), reply[:300]
    env_healthy(running, client)


# ---- hostile answers while others are served ---------------------------------------------------------------------

# None of them equals 7, the answer of the seed-0 problem the test resets to: each must earn the wrong-answer reward.
HOSTILE_ANSWERS = [r"\boxed{9^{4\cdot 9^{7}}}", r"\boxed{9^{9^{9}}}", r"\boxed{(10^{10^{6}})!}", r"\boxed{99999!}",
                   r"\boxed{2^{2^{2^{2^{2^{2}}}}}}", r"\boxed{" + "(" * 2000 + "1" + ")" * 2000 + "}",
                   r"\boxed{10^{10^{10}}-10^{10^{10}}}", r"\boxed{\sqrt[9^{9}]{9^{9^{9}}}}",
                   r"\boxed{" + "9" * 100_000 + "}", r"\boxed{\frac{" + r"\frac{" * 300 + "1" + "}{2}" * 301 + "}",
                   r"\boxed{7^{8^{9}}}", r"\boxed{99^{99^{99}}}", r"\boxed{2^{3^{4}}}", r"\boxed{123456789^{987654}}"]

SERVE_MATH = ("from agentrl.envs.server import ServeSettings, serve; "
              "serve(ServeSettings('math', port=0, step_timeout=20.0), announce=lambda line: print(line, flush=True))")


class MathServerProcess:
    """`agentrl env serve --env math` in a process of its own, restarted when it stops answering.

    In-process, a grader that holds the GIL would freeze the test's own client threads too, so the timing of
    ``/health`` would measure nothing; in a process of its own a frozen server is seen as one.
    """

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> None:
        """Start the server and wait for the line announcing its URL."""
        self.proc = subprocess.Popen([sys.executable, "-c", SERVE_MATH], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 1.0)
            line = self.proc.stdout.readline() if ready else ""
            found = re.search(r" at (http://\S+) ", line)
            if found:
                self.url = found.group(1)
                return
            assert self.proc.poll() is None, f"the math env server exited: {line}"
        raise AssertionError("the math env server did not announce its URL within 120 s")

    def healthy(self) -> bool:
        """Whether ``/health`` answers within a second."""
        try:
            return httpx.get(self.url + "/health", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def ready(self) -> str:
        """The URL of a server that answers (a frozen one is killed and replaced)."""
        if self.proc is None or not self.healthy():
            self.stop()
            self.start()
        return self.url

    def stop(self) -> None:
        """Kill the server (it may be frozen: no graceful stop)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=30)
            self.proc.stdout.close()
            self.proc = None


@pytest.fixture(scope="module")
def math_process():
    server = MathServerProcess()
    yield server
    server.stop()


@pytest.mark.parametrize("answer", HOSTILE_ANSWERS, ids=lambda a: a if len(a) < 40 else f"{a[:30]}...{len(a)}")
def test_env_hostile_answer_graded_while_health_answers(math_process, answer):
    """A worst-case answer is graded as a wrong answer, and ``/health`` answers within a second all the while."""
    url = math_process.ready()
    with httpx.Client(timeout=TIMEOUT) as client:
        status, payload = env_call(client, "POST", f"{url}/sessions", b"{}")
        sid = payload["session"]
        assert env_call(client, "POST", f"{url}/sessions/{sid}/reset", b'{"seed": 0, "seq": 1}')[0] == 200
        result: dict[str, Any] = {}

        def step() -> None:
            try:
                r = httpx.post(f"{url}/sessions/{sid}/step", json={"action": answer, "seq": 2}, timeout=TIMEOUT)
                result["status"], result["body"], result["headers"] = r.status_code, r.content, r.headers
            except httpx.HTTPError as e:
                result["error"] = e

        worker = threading.Thread(target=step, daemon=True)  # daemon: a frozen server must not hold the test run
        worker.start()
        slowest = 0.0
        while worker.is_alive():
            t0 = time.monotonic()
            try:
                client.get(url + "/health", timeout=5.0)
            except httpx.TimeoutException:
                raise AssertionError(f"/health did not answer within 5 s while {answer[:60]!r} was graded") from None
            slowest = max(slowest, time.monotonic() - t0)
            assert slowest < 1.0, f"/health took {slowest:.2f}s while {answer[:60]!r} was graded"
            time.sleep(0.05)
        worker.join()
        assert "error" not in result, f"grading {answer[:60]!r}: {result.get('error')!r}"
        payload = check_answer(result["status"], result["headers"], result["body"], env_error_shape,
                               f"step {answer[:60]!r}")
        assert result["status"] == 200, f"grading {answer[:60]!r} answered {result['status']}: {payload}"
        assert payload["reward"] == 0.0, f"{answer[:60]!r} is not the answer, got reward {payload['reward']}"
        assert client.delete(f"{url}/sessions/{sid}").status_code == 204


# ---- agentrl serve -----------------------------------------------------------------------------------------------

class Echo:
    """A stand-in engine: a few tokens of plain text per request, with log-probs shaped by every sampling setting
    as a real engine's are (a non-finite setting gives non-finite log-probs, as the HF engine's did in issue 38),
    and an embedding lookup's failure on a token id outside the vocabulary."""

    def __init__(self, tokenizer):
        self.vocab = len(tokenizer)
        self.reply = tuple(tokenizer("hello there, general", add_special_tokens=False)["input_ids"])
        self.pending, self.policy_version = [], 0

    def submit(self, request):
        self.pending.append(request)

    def poll(self, timeout=None):
        out, pending, self.pending = [], self.pending, []
        for req in pending:
            if any(t >= self.vocab for t in req.prompt):
                raise IndexError(f"index out of range in self: token id {max(req.prompt)}")
            p = req.params
            logprob = -(0.5 + abs(p.temperature - 1) + abs(p.top_p - 1) + p.min_p + abs(p.repetition_penalty - 1)
                        + abs(p.presence_penalty) + abs(p.frequency_penalty))
            ids = self.reply[: max(1, min(p.max_new_tokens, len(self.reply)))]
            out.append(EngineResult(req.id, Generation(ids, (logprob,) * len(ids),
                                                       "length" if len(ids) < len(self.reply) else "stop"),
                                    self.policy_version))
        return out

    def update_weights(self, named_tensors, version):
        self.policy_version = version

    def metrics(self):
        return {}

    def clear_cache(self):
        pass

    def close(self):
        pass


@pytest.fixture(scope="module")
def policy_server(qwen3_tokenizer, tmp_path_factory):
    from agentrl.serve.engine_client import EngineClient
    from agentrl.serve.server import PolicyServer, start_server
    from agentrl.serve.sessions import Recorder, Renderer

    recorder = Recorder(Renderer(qwen3_tokenizer, family_hint="qwen3"), **SERVE_CAPS,
                        spill_path=tmp_path_factory.mktemp("serve") / "evicted.jsonl")
    policy = PolicyServer(EngineClient(Echo(qwen3_tokenizer)), recorder, "tiny-qwen3",
                          defaults=SamplingParams(max_new_tokens=8), max_context_tokens=4096)
    running = start_server(policy)
    client = httpx.Client(timeout=TIMEOUT)
    _BASELINE_RSS["agentrl serve"] = _rss()
    yield running, client
    client.close()
    running.close()


def serve_healthy(running: Any, client: Any) -> None:
    """``/health`` answers 200 with strict JSON; the recorder keeps within its caps and writes what it evicts."""
    answer = client.get(running.address + "/health")
    check_answer(answer.status_code, answer.headers, answer.content, openai_error_shape, "GET /health", "GET")
    assert answer.status_code == 200, f"/health answered {answer.status_code}"
    recorder = running.server.recorder
    kept = len(recorder.sessions())
    assert kept <= SERVE_CAPS["max_sessions"], f"{kept} sessions kept, over the cap of {SERVE_CAPS['max_sessions']}"
    # The byte cap may be passed by the call just recorded: up to 16 choices of a prompt near the context limit.
    assert recorder.bytes_kept <= 2 * SERVE_CAPS["max_bytes"], f"{recorder.bytes_kept} bytes of records kept"
    assert recorder.evicted_unsaved == 0, "sessions evicted over the caps were written nowhere"
    check_rss("agentrl serve")


finite = st.floats(min_value=-3, max_value=3, allow_nan=False)
sampling_value = (finite | st.integers(-5, 5) | st.sampled_from([float("nan"), float("inf"), float("-inf"), 2**70,
                                                                  1e308, -0.0, 5e-324, True, "0.5", None]) | hostile)
SAMPLING_KEYS = ["temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty", "seed", "max_tokens", "max_completion_tokens", "n", "logprobs",
                 "top_logprobs", "stream", "stop", "user", "tool_choice", "response_format", "stream_options"]
sampling = st.dictionaries(st.sampled_from(SAMPLING_KEYS), sampling_value, max_size=5)
plain_text = st.text(max_size=60) | st.text(min_size=2000, max_size=20000)
roles = st.sampled_from(["system", "developer", "user", "assistant", "tool"]) | hostile
content = plain_text | st.none() | st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"])},
                                                                  optional={"text": plain_text | hostile}),
                                            max_size=3) | hostile
tool_calls = st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": st.text(max_size=10) | hostile, "arguments": st.text(max_size=40) | hostile})},
    optional={"id": st.text(max_size=10) | hostile}) | hostile, max_size=3)
message = (st.fixed_dictionaries({"role": roles}, optional={"content": content, "tool_calls": tool_calls,
                                                            "tool_call_id": hostile, "name": hostile,
                                                            "reasoning_content": plain_text | hostile})
           | hostile)
tools = st.lists(st.fixed_dictionaries({"type": st.just("function") | hostile, "function": st.fixed_dictionaries(
    {"name": st.text(max_size=10) | hostile}, optional={"description": plain_text, "parameters": hostile})}),
    max_size=3) | hostile


def _merge(*parts: dict) -> dict:
    out: dict = {}
    for part in parts:
        out.update(part)
    return out


chat_bodies = (st.builds(_merge, st.fixed_dictionaries({"model": st.just("tiny-qwen3")},
                                                       optional={"messages": st.lists(message, min_size=1, max_size=4)
                                                                 | hostile, "tools": tools}),
                         sampling).map(as_body)
               | st.sampled_from(RAW_HOSTILE))
token_ids = st.lists(st.integers(min_value=0, max_value=200_000) | st.sampled_from([*HUGE_INTS, -1, True, 1.5]),
                     min_size=1, max_size=20)
completion_bodies = (st.builds(_merge, st.fixed_dictionaries(
    {"model": st.just("tiny-qwen3")},
    optional={"prompt": plain_text | token_ids | st.lists(token_ids, max_size=2) | st.lists(plain_text, max_size=2)
              | hostile, "echo": hostile, "suffix": hostile}), sampling)
    .map(as_body) | st.sampled_from(RAW_HOSTILE))
sessions = st.none() | st.text(max_size=30) | st.sampled_from(["a" * 3000, "..", "%00", "anon-0", "anon-1"])


def _serve_call(running: Any, client: Any, path: str, body: bytes, session: str | None, header: bool) -> Any:
    base = running.address
    headers: dict[str, Any] = {"Content-Type": "application/json"}
    if session is not None and header:
        headers["X-Session-Id"] = session.encode("utf-8")  # raw bytes: httpx would refuse non-ASCII text
    elif session is not None:
        base = f"{base}/s/{quote(session, safe='')}"
    try:
        answer = client.post(base + path, content=body, headers=headers)
    except httpx.LocalProtocolError:  # a header httpx itself will not send: nothing reached the server
        return None
    return check_answer(answer.status_code, answer.headers, answer.content, openai_error_shape,
                        f"POST {path} {body[:200]!r}")


@fuzz(body=chat_bodies, session=sessions, header=st.booleans())
def test_serve_chat_fuzz(policy_server, body, session, header):
    """``/v1/chat/completions`` with every shape of messages, tools and sampling settings: no 5xx, strict JSON
    (no ``NaN`` log-probs), errors in OpenAI's shape, and the server answers ``/health`` after."""
    running, client = policy_server
    _serve_call(running, client, "/v1/chat/completions", body, session, header)
    serve_healthy(running, client)


@fuzz(body=completion_bodies, session=sessions, header=st.booleans())
def test_serve_completions_fuzz(policy_server, body, session, header):
    """``/v1/completions`` with text and token-id prompts of any size and value, and every sampling setting."""
    running, client = policy_server
    _serve_call(running, client, "/v1/completions", body, session, header)
    serve_healthy(running, client)


@fuzz(method=methods, path=paths | st.sampled_from(["/v1/models", "/health", "/agentrl/sessions/anon-0",
                                                     "/s/x/v1/models", "/v1/chat/completions"]),
       length=st.sampled_from(["exact", "huge"]) | bad_lengths, content_type=content_types,
       host=st.sampled_from(LOOPBACK_HOSTS) | foreign_hosts)
def test_serve_paths_methods_and_headers_fuzz(policy_server, method, path, length, content_type, host):
    """Any method, path and header on `agentrl serve`: no 5xx, JSON errors, foreign Host refused."""
    running, client = policy_server
    port = int(running.address.rsplit(":", 1)[1])
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    declared = {"exact": str(len(body)), "huge": str(10**12)}.get(length, length)
    head = http_head(method, path, [("Host", f"{host}:{port}"), ("Content-Type", content_type),
                                    ("Content-Length", declared)])
    status, headers, answer = raw_request(port, head, body)
    what = f"{method} {path[:200]} Host={host!r} Content-Length={declared!r}"
    assert status != 0, f"{what}: the server closed the connection without an answer"
    assert status != -1, f"{what}: no answer within {TIMEOUT:.0f}s"
    check_answer(status, headers, answer, openai_error_shape, what, method)
    if length not in ("exact", "huge") or (length == "huge" and method == "POST"):
        assert 400 <= status < 500, f"{what}: answered {status}: {answer[:200]!r}"
    if host not in LOOPBACK_HOSTS:
        assert 400 <= status < 500, f"{what}: a foreign Host was served ({status})"
    serve_healthy(running, client)
