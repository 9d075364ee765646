"""Serve any registered env over HTTP and WebSocket: many sessions per process, one env instance per session.

    agentrl env serve --env webshop --port 8000        # http://127.0.0.1:8000/webshop

    with start_server(ServeSettings("math")) as server:  # a background thread, for tests and benchmarks
        env = agentrl.make(server.url)                 # a `RemoteEnv` playing the served math env

Everything of env ``NAME`` (`agentrl.envs.registry.short_name` of ``--env``) lives under ``/NAME``:

* ``GET /health`` (and ``/NAME/health``): status, sessions open, the bound, the process RSS. Never needs the token.
* ``GET /NAME/info``: what a client needs to stand in for the env class (system prompt, rollout defaults, episode
  budget, constructor parameters, first docstring line) and the settings a client may set, with their bounds.
* ``POST /NAME/sessions`` ``{"kwargs": {...}}`` (the env's `TextEnv.client_settings` only) -> ``{"session": ID}``;
  then ``POST /NAME/sessions/ID/reset`` ``{"seed", "options", "seq"}``, ``POST /NAME/sessions/ID/step``
  ``{"action", "seq"}``,
  ``GET /NAME/sessions/ID/expert_action``, ``DELETE /NAME/sessions/ID``. This is agentrl's own protocol
  (`agentrl.envs.remote.RemoteEnv` speaks it): ``terminated`` / ``truncated`` stay apart and ``info`` travels whole
  (every JSON-serializable key). ``seq`` numbers a session's calls so a client may retry a call whose answer was
  lost: the server answers a repeated ``seq`` from its memory instead of stepping twice.
* ``WS /NAME/ws``: OpenEnv's WebSocket protocol, one session per connection, so OpenEnv's own clients play the env
  (the mapping is in docs/envs_remote.md).

Sessions: each holds its own env, built from the server's kwargs plus the session's settings, with the shared state
of that settings set, built once (`TextEnv.shared`), as the runner pools do. A session may set only what the env
declares in `TextEnv.client_settings` (plain, bounded values such as ``split`` or ``level``): anything else, such as a
path or an import name, is refused with 422 naming the setting, before any value is looked at, and before an env is
built; the operator's own kwargs (``--env-arg``) are not restricted. Envs step on a few worker threads ("lanes"),
each env always on the same one (one lane for envs that ask for a single thread). A session idle for longer than
`idle_timeout` is closed by a reaper; at `max_sessions` (or over `max_rss_gib`) new sessions are refused with 503 and
a ``Retry-After`` header, so memory stays bounded. Bound to 127.0.0.1 unless asked; bound to any other address the
server refuses to start without a bearer token, and then every call but ``/health`` must carry
``Authorization: Bearer TOKEN`` (WebSocket clients that cannot set headers may pass ``?token=TOKEN``).

Every request passes `agentrl.http_guard` first (`ServeSettings.limits`, `ServeSettings.allowed_hosts`): a ``Host``
header naming another host is refused with 421 (DNS rebinding), a foreign ``Origin`` with 403 (web pages), bodies
over the limit with 413, bodies and headers slower than the read timeouts with 408, WebSocket messages over the frame
limit closed with 1009. A call out of order gets 409 and keeps the session: ``step`` or ``expert_action`` before the
first ``reset``, a ``seq`` skipped, or a retried ``seq`` whose body differs from the call it repeats.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import itertools
import json
import logging
import math
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fastapi import FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentrl.envs.core import ClientSettingError, SharedResource, TextEnv, check_client_settings, check_reset_options
from agentrl.envs.openenv import openenv_session
from agentrl.envs.registry import loading, short_name, spec
from agentrl.envs.remote import PROTOCOL_VERSION, TOKEN_ENV_VAR
from agentrl.http_guard import HttpLimits, allowed_hosts, check_bind
from agentrl.http_server import RunningServer
from agentrl.http_server import serve as serve_http
from agentrl.http_server import start_server as start_http

__all__ = ["ServeSettings", "ServeError", "EnvServer", "start_server", "serve", "json_info", "PROTOCOL_VERSION",
           "TOKEN_ENV_VAR"]

log = logging.getLogger(__name__)

_MAX_KWARG_SETS = 4  # distinct session settings sets holding shared state at once: bounded, it can be large
_BASE_SETTINGS = "{}"  # the key of the operator's own set (no client settings): built at start, never evicted
_MAX_ACTION_CHARS = 1_000_000


class OpenSession(BaseModel):
    """``POST /NAME/sessions`` body: settings the env lets a client set (`TextEnv.client_settings`)."""

    kwargs: dict[str, Any] = Field(default_factory=dict)


class Reset(BaseModel):
    """``POST /NAME/sessions/ID/reset`` body."""

    seed: int | None = Field(default=None, ge=0, lt=2**64)
    options: dict[str, Any] | None = None
    seq: int = Field(ge=1, lt=2**63)


class Step(BaseModel):
    """``POST /NAME/sessions/ID/step`` body."""

    action: str = Field(max_length=_MAX_ACTION_CHARS)
    seq: int = Field(ge=1, lt=2**63)


class ServeError(RuntimeError):
    """A server that cannot start as configured (the message says what to change)."""


@dataclass(frozen=True)
class ServeSettings:
    """What `agentrl env serve` serves and how.

    Every field is a flag of ``agentrl env serve`` (`agentrl.cli.flags`): ``--env``, ``--port``,
    ``--limits.max-body-bytes``, ...
    """

    env_id: str
    """Env id (`agentrl envs list`), ``package.module:Class`` or ``path/to/file.py:Class``."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Constructor arguments of every session's env, unrestricted (the operator's); a session may set the env's
    `TextEnv.client_settings` on top."""
    host: str = "127.0.0.1"
    """Address to bind; any other than loopback needs `token`."""
    port: int = 8000
    """TCP port (0 picks a free one)."""
    max_sessions: int = 256
    """Sessions open at once (one env each); more are refused (503) until one closes or is reaped."""
    idle_timeout: float = 300.0
    """Seconds a session may go without a call before the reaper closes it."""
    token: str = field(default="", metadata={"envvar": TOKEN_ENV_VAR})
    """Bearer token every call but ``/health`` must carry (env var AGENTRL_ENV_TOKEN); empty means none (loopback
    only)."""
    max_rss_gib: float = 0.0
    """Refuse new sessions while the server process uses more memory than this, in GiB (0: no limit)."""
    threads: int = 8
    """Worker threads stepping the envs (an env always steps on the same one)."""
    step_timeout: float = 120.0
    """Seconds one env call may take before the session is failed (504) and closed."""
    allowed_hosts: tuple[str, ...] = ()
    """Another name clients may call the server by in the ``Host`` header, e.g. the name a proxy forwards
    (repeatable; loopback names, or the bound name, always pass; ``*`` allows any:
    `agentrl.http_guard.allowed_hosts`)."""
    limits: HttpLimits = field(default_factory=HttpLimits)
    """Body, header, timeout and WebSocket frame limits every client is held to (`HttpLimits`)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ServeError(f"--port must be in 0..65535 (0 picks a free one), got {self.port}")
        if self.max_sessions < 1:
            raise ServeError(f"--max-sessions must be >= 1, got {self.max_sessions}")
        if self.idle_timeout <= 0:
            raise ServeError(f"--idle-timeout must be > 0 seconds, got {self.idle_timeout}")
        if self.threads < 1:
            raise ServeError(f"--threads must be >= 1, got {self.threads}")
        check_bind(self.host, self.token, token_flag="--token", env_var=TOKEN_ENV_VAR, error=ServeError)
        try:
            allowed_hosts(self.host, self.allowed_hosts)
        except ValueError as e:
            raise ServeError(f"--allowed-host: {e}") from None

    @property
    def name(self) -> str:
        """The URL path segment of the env: its short name."""
        return short_name(self.env_id)


def json_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-serializable part of an env's `info` (numpy scalars and arrays converted; images and such left out)."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        value = _plain(value)
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue  # a screenshot or a handle: it cannot travel as JSON and the rollout does not need it
        out[str(key)] = value
    return out


def _close_shared(resource: SharedResource | None) -> None:
    """Free shared state the server drops, where it holds something to free.

    A browser host holds a Chromium and a server thread; left to the garbage collector, its live thread keeps it.
    """
    close = getattr(resource, "close", None)
    if callable(close):
        close()


def _settings_key(settings: Mapping[str, Any]) -> str:
    """The shared-state cache key of a checked settings set (plain JSON values, so the dump is canonical)."""
    return json.dumps(dict(settings), sort_keys=True)


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def _rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


@dataclass
class _Session:
    id: str
    env: TextEnv
    lane: int
    kind: str  # "http" or "openenv"
    created: float
    last_used: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    seq: int = 0
    answer: Any = None  # the answer to call `seq`, repeated when the client retries it
    digest: str = ""  # of call `seq`'s route and body: a retry must send the same call to get its answer
    steps: int = 0
    episode_id: str = ""
    started: bool = False  # reset at least once: step and expert_action before it are the client's mistake
    settings_key: str = _BASE_SETTINGS  # the client settings it was built with (its shared-state entry)


class _Refused(Exception):
    """A call answered with an HTTP error status (turned into a 4xx/5xx JSON answer or an OpenEnv error)."""

    def __init__(self, status: int, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after


class EnvServer:
    """The sessions of one served env and the ASGI app that exposes them (see the module docstring).

    Args:
        settings: what to serve and the bounds.
    """

    def __init__(self, settings: ServeSettings):
        self.settings = settings
        s = spec(settings.env_id)
        self.env_class = s.load()
        self._kwargs = {**s.defaults, **settings.kwargs}
        single = bool(getattr(self.env_class, "metadata", {}).get("single_thread", False))
        self._lanes = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"serve-lane{i}")
                       for i in range(1 if single else settings.threads)]
        self._shared: OrderedDict[str, SharedResource] = OrderedDict()  # by settings set, least recently used first
        self._shared_lock = threading.Lock()
        self.sessions: dict[str, _Session] = {}
        self._counter = itertools.count()
        self._opening = 0  # sessions being built: they count against max_sessions already
        self.reaped = 0
        # Build the shared state and one env now: a bad kwarg, or a feature whose extra is not installed, must stop
        # the server at start, not fail every session.
        with loading(settings.env_id):
            probe = self._make_env({})
        self.max_episode_steps = getattr(probe, "max_episode_steps", None)
        probe.close()
        self.app = self._build_app()

    # -- sessions -------------------------------------------------------------------------------------------------

    def _make_env(self, settings: Mapping[str, Any]) -> TextEnv:
        """A new env with the server's kwargs plus the client's checked `settings`, sharing the state of that set.

        A set whose env cannot be built frees the shared-state entry it created: a failed build never holds a slot.
        """
        key = _settings_key(settings)
        env_kwargs = {**self._kwargs, **settings}
        shared, created = self._shared_for(key, env_kwargs)
        try:
            return self.env_class(**env_kwargs, **({"shared": shared} if shared is not None else {}))
        except BaseException:
            if created:
                with self._shared_lock:
                    _close_shared(self._shared.pop(key, None))
            raise

    def _shared_for(self, key: str, env_kwargs: Mapping[str, Any]) -> tuple[SharedResource | None, bool]:
        """The shared state of settings set `key` (built now if needed) and whether this call built it."""
        shared_type: type[SharedResource] | None = getattr(self.env_class, "shared", None)
        if shared_type is None:
            return None, False  # nothing to share, so nothing to hold per set
        with self._shared_lock:
            if key in self._shared:
                self._shared.move_to_end(key)
                return self._shared[key], False
            if len(self._shared) >= _MAX_KWARG_SETS:
                self._evict_unused()
            # Built once per settings set, as `agentrl.rollout.pool.EnvMaker.build_shared` does for a pool.
            resource = shared_type.build(**env_kwargs)
            if resource is None:  # e.g. math's procedural problems: the build is free, nothing to keep
                return None, False
            self._shared[key] = resource
            return resource, True

    def _evict_unused(self) -> None:
        """Drop the least recently used shared state that no open session uses (never the operator's own set)."""
        # A list copy: this runs on a lane thread while the event loop may add or remove sessions.
        in_use = {session.settings_key for session in list(self.sessions.values())}
        for key in self._shared:
            if key != _BASE_SETTINGS and key not in in_use:
                _close_shared(self._shared.pop(key))
                return
        raise _Refused(503, f"this server holds shared state for {_MAX_KWARG_SETS} different session settings, all "
                            f"in use by open sessions; retry when some close, or serve these settings from their own "
                            f"server (--env-arg)", retry_after=5.0)

    async def _run(self, session: _Session | None, lane: int, fn: Callable[[], Any]) -> Any:
        """Run `fn` on `lane` (the session's thread), failing the session when it runs past `step_timeout`."""
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._lanes[lane], fn)
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.settings.step_timeout)
        except asyncio.TimeoutError:
            if session is not None:
                self.sessions.pop(session.id, None)
            raise _Refused(504, f"the env call ran past step_timeout={self.settings.step_timeout}s; "
                                f"session closed") from None
        except _Refused:
            raise
        except Exception as e:  # the env's own bug: the session is unusable now, its episode must be re-run
            if session is not None:
                self.sessions.pop(session.id, None)
                self._close_env(session)
            raise _Refused(500, f"{type(e).__name__} in the env: {e}") from e

    def _check_capacity(self) -> None:
        if len(self.sessions) + self._opening >= self.settings.max_sessions:
            raise _Refused(503, f"server full: {len(self.sessions) + self._opening} sessions open (--max-sessions "
                                f"{self.settings.max_sessions}); retry after one closes", retry_after=1.0)
        if self.settings.max_rss_gib > 0 and _rss_bytes() > self.settings.max_rss_gib * 2**30:
            raise _Refused(503, f"server memory over --max-rss-gib {self.settings.max_rss_gib}; retry later",
                           retry_after=2.0)

    async def open_session(self, kwargs: Any, kind: str = "http") -> _Session:
        """A new session with its own env, built from the server's kwargs and the client's settings `kwargs`.

        `kwargs` is checked against the env's `TextEnv.client_settings` first: a name the env does not declare, or a
        value of the wrong type or out of bounds, gets 422 naming the setting, and no env is built. Then 503 when the
        server is at its bounds, and 422 when the env refuses the (valid) settings.
        """
        try:
            settings = check_client_settings(self.env_class, kwargs, self.settings.name)
        except ClientSettingError as e:
            raise _Refused(422, str(e)) from None
        self._check_capacity()
        number = next(self._counter)
        lane = number % len(self._lanes)
        self._opening += 1
        try:
            env = await self._run(None, lane, functools.partial(self._make_env, settings))
        except _Refused as e:
            if e.status == 500:  # the env's constructor refused a combination the declaration allows
                raise _Refused(422, f"cannot build {self.settings.name} with settings {settings}: "
                                    f"{e.message[:300]}") from None
            raise
        finally:
            self._opening -= 1
        now = time.monotonic()
        session = _Session(secrets.token_hex(12), env, lane, kind, now, now, settings_key=_settings_key(settings))
        self.sessions[session.id] = session
        return session

    def session(self, sid: str) -> _Session:
        """The open session `sid` (404 when unknown: never opened, closed, reaped, or the server restarted)."""
        session = self.sessions.get(sid)
        if session is None:
            raise _Refused(404, f"no session {sid[:32]!r} on this server (closed, reaped after "
                                f"{self.settings.idle_timeout:.0f}s idle, or the server restarted)")
        session.last_used = time.monotonic()
        return session

    async def reset(self, session: _Session, seed: int | None, options: dict | None) -> dict[str, Any]:
        """Reset the session's env; the answer holds the observation, the info and the episode budget.

        `options` are checked against the env's `client_reset_options` first (422 naming the option, the session
        kept): like session settings, they are data a client may send only where the env declares them.
        """
        try:
            options = check_reset_options(self.env_class, options, self.settings.name)
        except ClientSettingError as e:
            raise _Refused(422, str(e)) from None

        def reset_env() -> tuple[Any, dict]:
            try:
                return session.env.reset(seed=seed, options=options)
            except ValueError as e:  # a declared option the env refuses here (e.g. a goal index past this split's)
                if not options:
                    raise
                session.started = False
                raise _Refused(422, f"the env refused the reset options {options}: {str(e)[:300]}; the session is "
                                    f"kept (reset it again)") from None

        obs, info = await self._run(session, session.lane, reset_env)
        session.steps = 0
        session.episode_id = f"{session.id}-{seed}"
        session.started = True
        return {"observation": str(obs), "info": json_info(info),
                "max_episode_steps": getattr(session.env, "max_episode_steps", None)}

    @staticmethod
    def _check_reset(session: _Session, call: str) -> None:
        # The env would raise (an env bug path that fails the session with 500); the client's mistake gets a 409.
        if not session.started:
            raise _Refused(409, f"{call} before reset: reset the session first (POST .../reset); the session is "
                                f"kept")

    async def step(self, session: _Session, action: str) -> dict[str, Any]:
        """Step the session's env with `action` (409, the session kept, before its first reset)."""
        self._check_reset(session, "step")
        obs, reward, terminated, truncated, info = await self._run(
            session, session.lane, functools.partial(session.env.step, action))
        reward = float(reward)
        if not math.isfinite(reward):
            raise _Refused(500, f"the env returned a non-finite reward {reward}")
        session.steps += 1
        return {"observation": str(obs), "reward": reward, "terminated": bool(terminated),
                "truncated": bool(truncated), "info": json_info(info)}

    async def expert_action(self, session: _Session) -> str:
        """The env's gold next action (409, the session kept, before its first reset)."""
        self._check_reset(session, "expert_action")
        return str(await self._run(session, session.lane, session.env.expert_action))

    async def close_session(self, sid: str) -> bool:
        """Close session `sid`; False when it was not open."""
        session = self.sessions.pop(sid, None)
        if session is None:
            return False
        await asyncio.get_running_loop().run_in_executor(self._lanes[session.lane],
                                                         functools.partial(self._close_env, session))
        return True

    def _close_env(self, session: _Session) -> None:
        try:
            session.env.close()
        except Exception as e:  # a failing close must not keep the session's memory
            log.warning("closing the env of session %s failed: %s", session.id, e)

    async def reap(self) -> int:
        """Close the sessions idle for longer than `idle_timeout`; return how many."""
        limit = time.monotonic() - self.settings.idle_timeout
        idle = [sid for sid, s in self.sessions.items() if s.last_used < limit and not s.lock.locked()]
        for sid in idle:
            await self.close_session(sid)
        if idle:
            self.reaped += len(idle)
            log.info("reaped %d idle sessions", len(idle))
        return len(idle)

    async def _reaper(self) -> None:
        period = min(5.0, self.settings.idle_timeout / 4)
        while True:
            await asyncio.sleep(period)
            try:
                await self.reap()
            except Exception as e:  # the reaper must outlive one bad close
                log.warning("reaping idle sessions failed: %s", e)

    def health(self) -> dict[str, Any]:
        """Liveness and load: sessions open, the bounds, memory."""
        return {"status": "healthy", "env": self.settings.name, "sessions": len(self.sessions),
                "max_sessions": self.settings.max_sessions, "reaped": self.reaped,
                "rss_mib": round(_rss_bytes() / 2**20, 1), "protocol": PROTOCOL_VERSION}

    def info(self) -> dict[str, Any]:
        """What a client needs to stand in for the env class."""
        cls = self.env_class
        doc = (inspect.getdoc(cls) or "").strip()
        try:
            params = [name for name, p in inspect.signature(cls).parameters.items()
                      if name != "shared" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        except (TypeError, ValueError):
            params = []
        declared = getattr(cls, "client_settings", None) or {}
        # Only the operator's values of settings a client may set: the others may name server paths.
        shown = {k: v for k, v in self._kwargs.items() if k in declared}
        settable = {name: {**setting.describe(), **({"default": shown[name]} if name in shown else {})}
                    for name, setting in declared.items()}
        return {"env": self.settings.env_id, "name": self.settings.name, "class": getattr(cls, "__name__", "Env"),
                "description": doc.splitlines()[0] if doc else "", "system_prompt": getattr(cls, "system_prompt", ""),
                "rollout_defaults": dict(getattr(cls, "rollout_defaults", {}) or {}),
                "max_episode_steps": self.max_episode_steps, "init_params": params,
                "client_settings": json_info(settable), "kwargs": json_info(shown), "protocol": PROTOCOL_VERSION}

    def close(self) -> None:
        """Close every session's env and stop the worker threads."""
        for session in list(self.sessions.values()):
            self._close_env(session)
        self.sessions.clear()
        for lane in self._lanes:
            lane.shutdown(wait=False, cancel_futures=True)

    # -- the app --------------------------------------------------------------------------------------------------

    def _build_app(self) -> Any:
        """The FastAPI app (unguarded: `agentrl.http_server` puts it behind `agentrl.http_guard.HttpGuard`)."""
        server = self
        name = self.settings.name
        prefix = f"/{name}"

        async def lifespan(app: Any):
            reaper = asyncio.get_running_loop().create_task(server._reaper())
            yield
            reaper.cancel()

        app = FastAPI(title=f"agentrl env server: {name}", lifespan=lifespan, docs_url=None, redoc_url=None,
                      openapi_url=None)

        def error(status: int, message: str, retry_after: float | None = None) -> JSONResponse:
            headers = {"Retry-After": str(math.ceil(retry_after))} if retry_after else None
            return JSONResponse({"error": message}, status_code=status, headers=headers)

        @app.exception_handler(_Refused)
        async def refused(request: Request, exc: _Refused) -> JSONResponse:
            return error(exc.status, exc.message, exc.retry_after)

        @app.exception_handler(RequestValidationError)
        async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
            first = exc.errors()[0] if exc.errors() else {}
            where = ".".join(str(p) for p in first.get("loc", ()))
            return error(422, f"bad request body: {where}: {first.get('msg', 'invalid')}")

        @app.exception_handler(StarletteHTTPException)
        async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
            return error(exc.status_code, str(exc.detail))

        @app.get("/health")
        @app.get(f"{prefix}/health")
        async def health() -> dict[str, Any]:
            return server.health()

        @app.get(f"{prefix}/info")
        async def info() -> dict[str, Any]:
            return server.info()

        @app.post(f"{prefix}/sessions", status_code=201)
        async def open_session(body: OpenSession) -> dict[str, Any]:
            session = await server.open_session(body.kwargs)
            return {"session": session.id}

        async def sequenced(sid: str, seq: int, route: str, body: BaseModel, call: Callable[[_Session], Any]) -> Any:
            session = server.session(sid)
            # What the call asked, so a retry is answered from memory only when it is the same call.
            digest = hashlib.sha256(json.dumps([route, body.model_dump(mode="json")], sort_keys=True).encode()
                                    ).hexdigest()
            async with session.lock:
                if seq == session.seq and session.answer is not None:  # a retry of the last call: same answer
                    if digest != session.digest:
                        raise _Refused(409, f"call seq {seq} was already answered for a different {route} request; "
                                            f"a retry must resend the same body, a new call takes seq {seq + 1}")
                    return session.answer
                if seq != session.seq + 1:
                    raise _Refused(409, f"call seq {seq} out of order: the session's last call was {session.seq}")
                answer = await call(session)
                session.seq, session.answer, session.digest = seq, answer, digest
                session.last_used = time.monotonic()
                return answer

        # The answers go out as JSONResponse: FastAPI's own encoding walks every observation string once more.
        @app.post(f"{prefix}/sessions/{{sid}}/reset")
        async def reset(sid: str, body: Reset) -> JSONResponse:
            return JSONResponse(await sequenced(sid, body.seq, "reset", body,
                                                lambda s: server.reset(s, body.seed, body.options)))

        @app.post(f"{prefix}/sessions/{{sid}}/step")
        async def step(sid: str, body: Step) -> JSONResponse:
            return JSONResponse(await sequenced(sid, body.seq, "step", body, lambda s: server.step(s, body.action)))

        @app.get(f"{prefix}/sessions/{{sid}}/expert_action")
        async def expert_action(sid: str) -> dict[str, str]:
            session = server.session(sid)
            async with session.lock:
                return {"action": await server.expert_action(session)}

        @app.delete(f"{prefix}/sessions/{{sid}}")
        async def close(sid: str) -> Response:
            await server.close_session(sid)  # closing twice is fine: the client may have retried
            return Response(status_code=204)

        @app.websocket(f"{prefix}/ws")
        async def openenv_ws(websocket: WebSocket) -> None:
            await openenv_session(server, websocket, refused=_Refused)

        return app


def _http_options(settings: ServeSettings) -> dict[str, Any]:
    """How `agentrl.http_server` serves the app: the URL path and the guard's settings.

    The guard checks every request and WebSocket handshake, the token's included, before any route runs.
    """
    return {"path": f"/{settings.name}", "limits": settings.limits, "token": settings.token,
            "extra_hosts": settings.allowed_hosts, "open_paths": ("/health", f"/{settings.name}/health"),
            "error": ServeError}


def start_server(settings: ServeSettings) -> RunningServer[EnvServer]:
    """Start serving in a background thread of this process; returns once the server answers ``/health``.

    The `agentrl.http_server.RunningServer` returned has the env's URL as `url` (e.g.
    ``http://127.0.0.1:43121/math``, what ``--env`` takes) and the `EnvServer` as `server`; `stop` closes every
    session.
    """
    server = EnvServer(settings)
    return start_http(server.app, settings.host, settings.port, server=server, on_stop=(server.close,),
                      name="agentrl-env-serve", **_http_options(settings))


def serve(settings: ServeSettings, announce: Callable[[str], None] = print) -> None:
    """Serve until interrupted (blocking); `announce` gets one line with the URL once the server listens."""
    server = EnvServer(settings)

    def listening(url: str) -> None:
        announce(f"serving {settings.env_id} at {url} (OpenEnv clients: {url.replace('http', 'ws', 1)}/ws; "
                 f"health: {url}/health; max {settings.max_sessions} sessions, idle timeout "
                 f"{settings.idle_timeout:.0f}s; Ctrl-C stops)")

    serve_http(server.app, settings.host, settings.port, announce=listening, on_stop=(server.close,),
               **_http_options(settings))
