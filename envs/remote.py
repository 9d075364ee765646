"""Play a served env (`agentrl env serve`) as a `TextEnv`: ``--env http://HOST:PORT/NAME``.

    env = agentrl.make("http://127.0.0.1:8000/webshop")   # what the registry does with a URL id
    obs, info = env.reset(seed=3)

`remote_env_class(url)` asks the server once for the env's class-level facts (system prompt, rollout defaults,
episode budget, constructor parameters) and returns a `RemoteEnv` subclass that carries them, so the run plan, the
chat layout and `agentrl eval`'s split handling treat it as the env itself. Each instance opens one session on the
server (its kwargs are sent along: ``--env-arg`` and the eval split reach the served env) and keeps it across
episodes; `close` ends it. The class is built at run time, so it travels to Ray runners by value (cloudpickle),
and every runner talks to the server directly.

Faults: a call that cannot reach the server (refused, reset, timed out, 502/503/504) is retried with backoff for
about `retry_seconds`; every call carries a sequence number, so a retried step whose answer was lost is answered
from the server's memory, never applied twice. Past that, or on an answer saying the session is gone (the server
restarted or reaped it), the call raises `RemoteEnvError`; the runner pool reports it as a failed env call and the
rollout re-runs the episode from its seed, dropping its group after `max_episode_retries` (counted in the step's
``env_errors`` / ``episode_retries`` / ``dropped_groups``), as for an env that raised in a runner.

What a server answers is checked, never trusted (a served env may be someone else's machine): the body is read up
to `RemoteEnv.max_response_bytes` (16 MiB) and no further; it must be strict JSON (no ``NaN`` / ``Infinity``, no number
that overflows a float, nesting at most `MAX_JSON_DEPTH` deep); and every field must have its protocol type: the
observation a string, the reward a finite real number within +-`RemoteEnv.max_abs_reward` (1e6), ``terminated`` /
``truncated`` JSON booleans, ``info`` a JSON object whose ``success`` / ``task_type`` / ``tools`` have the types the
rollout reads, ``max_episode_steps`` a positive integer or null. An answer that is not raises `BadAnswerError` (a
`RemoteEnvError`) naming the server, the call, the field and what was wrong; in a rollout that is a failed env call,
counted in ``env_errors`` like any other. `/info` is checked the same way when the class is built (a bad
``init_params`` entry is a `RemoteEnvError`, which ``--env`` reports as an env that cannot be used).

The bearer token of a server bound beyond loopback comes from the ``AGENTRL_ENV_TOKEN`` environment variable
(Ray runners started from the same shell inherit it).
"""

from __future__ import annotations

import functools
import http.client
import inspect
import json
import keyword
import math
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar
from urllib.parse import urlsplit

from agentrl.envs.core import TextEnv

__all__ = ["PROTOCOL_VERSION", "TOKEN_ENV_VAR", "MAX_RESPONSE_BYTES", "MAX_ABS_REWARD", "MAX_JSON_DEPTH", "RemoteEnv",
           "RemoteEnvError", "BadAnswerError", "ResetAnswer", "StepAnswer", "EnvFacts", "remote_env_class",
           "is_env_url", "url_name", "strict_json", "check_info"]

PROTOCOL_VERSION = 1
"""Version of agentrl's env session protocol; servers report it in `GET /NAME/info` and clients refuse others."""

TOKEN_ENV_VAR = "AGENTRL_ENV_TOKEN"
"""Environment variable holding the bearer token (for `agentrl env serve` and for `RemoteEnv` clients)."""
MAX_RESPONSE_BYTES = 16 * 2**20
"""Default limit on the body of one answer (`RemoteEnv.max_response_bytes`); a longer one fails the call unread.

Observations are text (a WebShop page is ~10 KiB) and images never travel, so 16 MiB is far above any honest answer
while a hostile one (300 MB) costs the client at most this much memory."""

MAX_ABS_REWARD = 1e6
"""Default bound on a served reward's magnitude (`RemoteEnv.max_abs_reward`).

Built-in envs reward within [0, 1] (user envs: a few hundred at most); a finite but absurd reward such as 1e300 would
swamp the group's advantages and overflow when squared for their spread (float32 overflows past ~1.8e19 squared)."""

MAX_JSON_DEPTH = 64
"""Deepest nesting of objects and arrays an answer may have (agentrl's own answers nest under 10 levels)."""

_RETRY_STATUS = {502, 503, 504}
_SESSION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")  # it goes into URL paths: nothing that could leave the segment
_QUOTE_CHARS = 300  # of a server's error message or bad value quoted in ours
_Answer = TypeVar("_Answer")


class RemoteEnvError(RuntimeError):
    """A served env that cannot be reached or refused a call (the message names the server and what to do)."""


class BadAnswerError(RemoteEnvError):
    """A server answered, but not what the protocol says.

    A field of the wrong type, a non-finite or absurd number, a body over the size limit, invalid or too deeply
    nested JSON.

    The message names the server, the call, the field and what was wrong. In a rollout it fails the episode as an env
    error (counted in ``env_errors``; the episode is re-run from its seed), as any `RemoteEnvError` does.
    """


def _quote(value: Any) -> str:
    """A short printable rendering of `value` for an error message (never the whole of a huge value)."""
    text = value if isinstance(value, str) else repr(value)
    short = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:_QUOTE_CHARS])  # no control characters
    return short + ("..." if len(text) > _QUOTE_CHARS else "")


def _show(value: Any) -> str:
    """A decoded JSON value as JSON, shortened, for an error message (``"no"``, ``[1]``, ``true``)."""
    try:
        return _quote(json.dumps(value, ensure_ascii=False))
    except (TypeError, ValueError):
        return _quote(value)


class _NotANumber(str):
    """What the parser puts where a server wrote ``NaN``, ``Infinity`` or a number that overflows a float.

    Refused right after parsing, by `_tree_problem`, with the path to it, so the error names the field.
    """


def _not_a_number(token: str) -> _NotANumber:
    return _NotANumber(f"{token}, not a JSON number (JSON has no NaN or Infinity)")


def _finite_float(text: str) -> float | _NotANumber:
    value = float(text)
    return value if math.isfinite(value) else _NotANumber(f"{_quote(text)}, a number that overflows a float")


def _tree_problem(value: Any, limit: int) -> str | None:
    """What is wrong in a parsed answer, or None when nothing is.

    A NaN / Infinity / overflow (named by its path), or nesting deeper than `limit`. Iterative, so no recursion limit
    is hit.
    """
    if isinstance(value, _NotANumber):
        return f"the answer is {value}"
    stack: list[tuple[Any, tuple[str, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if len(path) >= limit:
            return f"it nests deeper than {limit} levels"
        for key, child in (item.items() if isinstance(item, dict) else enumerate(item)):
            if isinstance(child, _NotANumber):
                return f"{'.'.join(map(str, (*path, key)))!r} is {child}"
            if isinstance(child, (dict, list)):
                stack.append((child, (*path, str(key))))
    return None


def strict_json(content: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Decode a server's answer as strict JSON.

    Python's `json.loads` accepts the non-JSON tokens ``NaN``, ``Infinity`` and ``-Infinity`` and turns ``1e400``
    into ``inf``; here they are refused, as is nesting deeper than `max_depth`.

    Raises:
        ValueError: the text is not strict JSON; the message says why.
    """
    try:
        value = json.loads(content, parse_constant=_not_a_number, parse_float=_finite_float)
    except RecursionError:
        raise ValueError("it nests deeper than the JSON parser allows") from None
    problem = _tree_problem(value, max_depth) if isinstance(value, (dict, list, _NotANumber)) else None
    if problem:
        raise ValueError(problem)
    return value


def _json_kind(value: Any) -> str:
    """The JSON type of a decoded value, for messages (``true`` is a boolean, not the number 1)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {str: "a string", dict: "an object", list: "an array"}.get(type(value), type(value).__name__)


class _Fields:
    """The fields of one decoded answer, each read with its protocol type; a wrong one raises `BadAnswerError`.

    Args:
        value: the decoded answer (must be a JSON object).
        where: the server and the call, for messages (``env server URL: POST /sessions/ID/step``).
    """

    def __init__(self, value: Any, where: str):
        self.where = where
        if not isinstance(value, dict):
            raise BadAnswerError(f"{where} answered {_json_kind(value)} ({_show(value)}), not a JSON object")
        self.value = value

    def bad(self, key: str, problem: str) -> BadAnswerError:
        """The error for field `key`."""
        return BadAnswerError(f"{self.where} answered a bad {key!r}: {problem}")

    def _get(self, key: str, kind: type | tuple[type, ...], wanted: str, optional: bool) -> Any:
        if key not in self.value:
            if optional:
                return None
            raise self.bad(key, "missing")
        value = self.value[key]
        if optional and value is None:
            return None
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
            raise self.bad(key, f"{_json_kind(value)} ({_show(value)}) where {wanted} belongs")
        return value

    def text(self, key: str, optional: bool = False) -> str | None:
        """A JSON string."""
        return self._get(key, str, "a string", optional)

    def flag(self, key: str) -> bool:
        """A JSON boolean, ``true`` or ``false`` (not ``"no"``, not 0)."""
        return self._get(key, bool, "true or false", False)

    def mapping(self, key: str, optional: bool = False) -> dict[str, Any] | None:
        """A JSON object."""
        return self._get(key, dict, "a JSON object", optional)

    def reward(self, key: str, bound: float) -> float:
        """A finite real number within +-`bound` (the JSON parser already refused NaN and Infinity)."""
        value = self._get(key, (int, float), "a number", False)
        if not abs(value) <= bound:
            raise self.bad(key, f"{_quote(value)} is beyond +-{bound:g} (RemoteEnv.max_abs_reward)")
        return float(value)

    def budget(self, key: str) -> int | None:
        """A positive integer or null (an episode budget)."""
        value = self._get(key, int, "a positive integer or null", True)
        if value is not None and value < 1:
            raise self.bad(key, f"{value} is not a positive integer")
        return value


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def check_info(info: dict[str, Any], problem: Callable[[str, str], Exception]) -> dict[str, Any]:
    """Check the `info` keys the rollout reads (``success``, ``task_type``, ``tools``) have their contract's types.

    Args:
        info: an env's info, decoded from a server's answer.
        problem: builds the error to raise from a field name and what is wrong with it.

    Returns:
        `info` itself.
    """
    if "success" in info and not isinstance(info["success"], bool):
        # 0 / 1 is what an env returning ints says locally too; anything else is not a verdict.
        if type(info["success"]) is not int or info["success"] not in (0, 1):
            raise problem("info.success", f"{_json_kind(info['success'])} ({_show(info['success'])}) where true or "
                                          "false belongs")
        info["success"] = bool(info["success"])
    if "task_type" in info and not isinstance(info["task_type"], str):
        raise problem("info.task_type", f"{_json_kind(info['task_type'])} where a string belongs")
    tools = info.get("tools")
    if "tools" in info and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise problem("info.tools", f"{_json_kind(tools)} where an array of tool objects belongs")
    return info


@dataclass(frozen=True)
class ResetAnswer:
    """A served env's answer to a reset, checked.

    Attributes:
        observation: the first observation.
        info: the reset info (a JSON object).
        max_episode_steps: the episode budget of the session's env, or None.
    """

    observation: str
    info: dict[str, Any]
    max_episode_steps: int | None

    @classmethod
    def from_json(cls, value: Any, where: str) -> ResetAnswer:
        """Check a decoded answer field by field.

        Raises:
            BadAnswerError: a field is missing or has the wrong type.
        """
        f = _Fields(value, where)
        return cls(f.text("observation"), check_info(f.mapping("info"), f.bad), f.budget("max_episode_steps"))


@dataclass(frozen=True)
class StepAnswer:
    """A served env's answer to a step, checked: Gymnasium's five values.

    Attributes:
        observation: the next observation.
        reward: the step's reward: finite, within +-`max_abs_reward`.
        terminated: the task ended (solved or failed).
        truncated: a budget ended the episode.
        info: the step info (a JSON object).
    """

    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]

    @classmethod
    def from_json(cls, value: Any, where: str, max_abs_reward: float = MAX_ABS_REWARD) -> StepAnswer:
        """Check a decoded answer field by field.

        Raises:
            BadAnswerError: a field is missing, has the wrong type or an absurd value.
        """
        f = _Fields(value, where)
        return cls(f.text("observation"), f.reward("reward", max_abs_reward), f.flag("terminated"),
                   f.flag("truncated"), check_info(f.mapping("info"), f.bad))


@dataclass(frozen=True)
class EnvFacts:
    """A served env's class-level facts from ``GET /info``, checked.

    Attributes:
        name: the env's short name on the server.
        class_name: the served env class's name (an identifier).
        description: its docstring's first line.
        system_prompt: what the agent is told.
        rollout_defaults: context-layout hints (`TextEnv.rollout_defaults`).
        max_episode_steps: the class's episode budget, or None.
        init_params: the constructor's keyword parameters a client may pass (identifiers).
    """

    name: str
    class_name: str
    description: str
    system_prompt: str
    rollout_defaults: dict[str, Any]
    max_episode_steps: int | None
    init_params: tuple[str, ...]

    @classmethod
    def from_json(cls, value: Any, where: str) -> EnvFacts:
        """Check a decoded ``/info`` answer field by field (fields added by later servers are ignored).

        Raises:
            RemoteEnvError: the protocol differs from this client's (`BadAnswerError`: a field is wrong).
        """
        f = _Fields(value, where)
        protocol = value.get("protocol")
        if type(protocol) is not int or protocol != PROTOCOL_VERSION:
            raise RemoteEnvError(f"{where}: the server speaks env protocol {_quote(protocol)}, this agentrl speaks "
                                 f"{PROTOCOL_VERSION}; use the same agentrl version on both sides")
        name = f.text("name")
        class_name = f.text("class", optional=True) or "Env"
        if not class_name.isidentifier():
            raise f.bad("class", f"{_show(class_name)} is not a Python identifier")
        params = f._get("init_params", list, "an array of parameter names", True) or []
        for p in params:
            if not isinstance(p, str) or not p.isidentifier() or keyword.iskeyword(p):
                raise f.bad("init_params", f"the entry {_show(p)} is not a parameter name (a Python identifier)")
        if len(set(params)) != len(params):
            raise f.bad("init_params", "a parameter is named twice")
        return cls(name, class_name, f.text("description", optional=True) or "",
                   f.text("system_prompt", optional=True) or "", dict(f.mapping("rollout_defaults", optional=True)
                                                                         or {}),
                   f.budget("max_episode_steps"), tuple(params))


def is_env_url(env_id: str) -> bool:
    """True for an ``http://`` / ``https://`` env id."""
    return env_id.startswith(("http://", "https://"))


def url_name(url: str) -> str:
    """The env name of a served env's URL: its last path segment (``http://h:8000/webshop`` -> ``webshop``)."""
    path = urlsplit(url).path.strip("/")
    return path.rpartition("/")[2] or urlsplit(url).hostname or "remote"


def _headers() -> dict[str, str]:
    token = os.environ.get(TOKEN_ENV_VAR, "")
    return {"Authorization": f"Bearer {token}"} if token else {}


class _Connection:
    """One keep-alive HTTP connection to a server (the standard library's; one per env, used by one thread at a time).

    `http.client` costs about a third of httpx's client CPU per call (0.22 vs 0.60 ms measured per step), which is
    what a many-session client spends its time on.
    """

    def __init__(self, url: str, timeout: float, max_bytes: int = MAX_RESPONSE_BYTES):
        parts = urlsplit(url)
        self.https = parts.scheme == "https"
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        self.url = f"http{'s' if self.https else ''}://{self.host}:{self.port}{self.prefix}"
        self.timeout = timeout
        self.max_bytes = max_bytes
        self._conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, str], bytes]:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self._conn = cls(self.host, self.port, timeout=self.timeout)
            self._conn.connect()
            # Nagle's algorithm would hold a POST's body behind its headers until the server's delayed ACK: 40 ms a
            # call (measured: 44 ms per WebShop step with it, 1-2 ms without).
            self._conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        headers = {"Content-Type": "application/json", **_headers()}
        data = None if body is None else json.dumps(body).encode()
        response = None
        try:
            self._conn.request(method, self.prefix + path, body=data, headers=headers)
            response = self._conn.getresponse()
            # Read at most one byte past the limit, and nothing when the announced length is already over it: a
            # hostile body (300 MB) must cost this process no more than the limit.
            over = f"env server {self.url}: {method} {path} answered"
            hint = "; raise RemoteEnv.max_response_bytes if this env's answers really are that large"
            if response.length is not None and response.length > self.max_bytes:
                raise BadAnswerError(f"{over} {response.length:,} bytes, over the limit of {self.max_bytes:,}{hint}")
            content = response.read(self.max_bytes + 1)
            if len(content) > self.max_bytes:
                raise BadAnswerError(f"{over} more than {self.max_bytes:,} bytes{hint}")
            return response.status, {k.lower(): v for k, v in response.getheaders()}, content
        except BaseException:
            self.close()  # a half-read connection cannot be reused
            if response is not None:
                # A response that ends by closing holds the socket itself: close it too, or a hostile server keeps
                # streaming into it for as long as the exception (and this frame) lives.
                response.close()
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _request(conn: _Connection, method: str, path: str, *, body: Any = None, retry_seconds: float = 10.0) -> Any:
    """One call on `conn`, retried on connection faults and 502/503/504; the decoded JSON answer (None: no body).

    Raises:
        BadAnswerError: the answer is over the size limit, not strict JSON, or not a 2xx (never retried: the server
            answered).
        RemoteEnvError: the server refused the call, or could not be reached for `retry_seconds`.
    """
    url = conn.url
    deadline = time.monotonic() + retry_seconds
    delay, attempt = 0.1, 0
    while True:
        attempt += 1
        try:
            status, headers, content = conn.request(method, path, body)
        except (OSError, http.client.HTTPException) as e:  # refused, reset, timed out, closed mid-answer
            problem = f"{type(e).__name__}: {e or 'no answer'}"
        else:
            if 200 <= status < 300:
                try:
                    return strict_json(content) if content else None
                except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors too
                    raise BadAnswerError(f"env server {url}: {method} {path} answered invalid JSON: {e}") from None
            if status < 400:  # 1xx/3xx: env servers never redirect; following one would leave the named server
                raise BadAnswerError(f"env server {url}: {method} {path} answered {status} (location: "
                                     f"{_quote(headers.get('location', ''))}); env servers answer 2xx or an error, "
                                     f"use the URL the server announced")
            try:
                message = strict_json(content)
                message = message.get("error", message) if isinstance(message, dict) else message
            except ValueError:
                message = content[:_QUOTE_CHARS * 4].decode(errors="replace")
            message = _quote(message)
            if status not in _RETRY_STATUS:
                hint = f"; set {TOKEN_ENV_VAR} to the server's token" if status == 401 else ""
                raise RemoteEnvError(f"env server {url}: {method} {path} -> {status}: {message}{hint}")
            problem = f"{status}: {message}"
            wait = headers.get("retry-after", "")
            if wait.isdigit():
                delay = max(delay, float(wait))
        if time.monotonic() + delay > deadline:
            raise RemoteEnvError(f"env server {url} did not answer {method} {path} after {attempt} tries in "
                                 f"{retry_seconds:.0f}s ({problem}); is `agentrl env serve` running there?")
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


class RemoteEnv(TextEnv):
    """A `TextEnv` whose episodes run on an env server; subclasses made by `remote_env_class` name the server.

    Every answer is checked before it is used (see the module docstring); one that breaks the protocol raises
    `BadAnswerError`, and the session is forgotten (a later reset opens a new one) as for any other failed call.

    Args:
        **kwargs: constructor kwargs for the served env, on top of the server's own (``--env-arg``).

    Attributes:
        request_timeout: seconds a socket operation may wait for the server.
        retry_seconds: how long unreachable servers and 502/503/504 are retried.
        max_response_bytes: the largest answer body read; a larger one fails the call without being read.
        max_abs_reward: the largest reward magnitude accepted.
    """

    url: ClassVar[str] = ""
    request_timeout: ClassVar[float] = 120.0
    retry_seconds: ClassVar[float] = 10.0
    max_response_bytes: ClassVar[int] = MAX_RESPONSE_BYTES
    max_abs_reward: ClassVar[float] = MAX_ABS_REWARD

    def __init__(self, **kwargs: Any):
        if not self.url:
            raise RemoteEnvError("RemoteEnv needs a server: use agentrl.make('http://HOST:PORT/NAME')")
        self._kwargs = kwargs
        self._conn = _Connection(self.url, self.request_timeout, self.max_response_bytes)
        self._session: str | None = None
        self._seq = 0
        self.max_episode_steps = type(self).max_episode_steps

    def _call(self, method: str, path: str, body: Any = None) -> _Fields:
        answer = _request(self._conn, method, path, body=body, retry_seconds=self.retry_seconds)
        return _Fields(answer, f"env server {self.url}: {method} {path}")

    def _open_session(self) -> str:
        f = self._call("POST", "/sessions", {"kwargs": self._kwargs})
        sid = f.text("session")
        if not _SESSION_ID.fullmatch(sid):
            raise f.bad("session", f"{_show(sid)} is not a session id (1-128 letters, digits, '-' or '_')")
        return sid

    def _sequenced(self, op: str, body: dict[str, Any], parse: Callable[[Any, str], _Answer]) -> _Answer:
        if self._session is None:
            self._session = self._open_session()
            self._seq = 0
        self._seq += 1
        path = f"/sessions/{self._session}/{op}"
        try:
            answer = _request(self._conn, "POST", path, body={**body, "seq": self._seq},
                              retry_seconds=self.retry_seconds)
            return parse(answer, f"env server {self.url}: POST {path}")
        except RemoteEnvError:
            self._session = None  # gone, unreachable or broken: a later reset opens a new one
            raise

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode on the server; the same seed gives the same episode as the env played locally.

        Raises:
            RemoteEnvError: the server could not be reached or refused (`BadAnswerError`: answered out of protocol).
        """
        super().reset(seed=seed)
        answer = self._sequenced("reset", {"seed": seed, "options": options}, ResetAnswer.from_json)
        if answer.max_episode_steps is not None:
            self.max_episode_steps = answer.max_episode_steps
        return answer.observation, answer.info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Send `action` to the server's env; `(obs, reward, terminated, truncated, info)` come back, checked.

        Raises:
            RemoteEnvError: the server could not be reached or refused (`BadAnswerError`: answered out of protocol).
        """
        if self._session is None:
            raise RemoteEnvError(f"env server {self.url}: step before reset (or the session was lost); reset first")
        a = self._sequenced("step", {"action": action},
                            functools.partial(StepAnswer.from_json, max_abs_reward=self.max_abs_reward))
        return a.observation, a.reward, a.terminated, a.truncated, a.info

    def expert_action(self) -> str:
        """The served env's gold next action."""
        if self._session is None:
            raise RemoteEnvError(f"env server {self.url}: expert_action before reset; reset first")
        return self._call("GET", f"/sessions/{self._session}/expert_action").text("action")

    def close(self) -> None:
        """End the session on the server (best effort: a dead server has nothing to close)."""
        sid, self._session = self._session, None
        if sid is not None:
            try:
                _request(self._conn, "DELETE", f"/sessions/{sid}", retry_seconds=0.0)
            except RemoteEnvError:
                pass
        self._conn.close()


@functools.lru_cache(maxsize=64)
def remote_env_class(url: str) -> type[RemoteEnv]:
    """A `RemoteEnv` subclass for the env served at `url`, with the served env's class-level facts.

    Raises:
        RemoteEnvError: the server cannot be reached, or is not an agentrl env server at that path
            (`BadAnswerError`: its ``/info`` breaks the protocol, e.g. an ``init_params`` entry that is no name).
    """
    base = url.rstrip("/")
    parts = urlsplit(base)
    if not parts.hostname or not parts.path.strip("/"):
        raise RemoteEnvError(f"env URL {url!r} must look like http://HOST:PORT/NAME (NAME: the served env's name)")
    try:
        conn = _Connection(base, timeout=10.0)
        info = _request(conn, "GET", "/info", retry_seconds=5.0)
        conn.close()
    except RemoteEnvError as e:
        if "-> 404" in str(e):
            raise RemoteEnvError(f"{base} is not a served env (404 on {base}/info); check NAME against the server's "
                                 f"/health") from None
        raise
    facts = EnvFacts.from_json(info, f"env server {base}: GET /info")
    attrs = {
        "__module__": __name__,
        "__doc__": f"{facts.description or facts.name} (served at {base})",
        "url": base,
        "system_prompt": facts.system_prompt,
        "rollout_defaults": facts.rollout_defaults,
        "max_episode_steps": facts.max_episode_steps,
    }
    cls = type(f"Remote{facts.class_name}", (RemoteEnv,), attrs)
    # `agentrl eval` reads the constructor's parameters to know whether the env takes a split.
    cls.__signature__ = inspect.Signature([inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY, default=None)
                                           for p in facts.init_params])
    return cls
