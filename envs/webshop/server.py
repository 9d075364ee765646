"""Human web mode: serve WebShop's pages as HTML, one env per browser session.

    serve(port=3000)                       # blocking; `agentrl webshop serve` calls this
    with start_server(port=0) as server:   # background thread, for tests
        print(server.url)

``GET /`` (optionally ``/?seed=N``) starts a session on the goal `reset(seed=N)` draws and redirects (303) to
``/s/<session>``, which shows the current page. Every button posts its ``click[...]`` action and the search box its
keywords back to ``/s/<session>``, so a human plays through exactly the transitions and pages an agent gets. An
unknown session is a 404 page, a seed that is not a non-negative integer a 400 page, any method but GET and POST a
501 page (the pages, their bytes and status codes, are those the standard library's server sent before this one).
``GET /health`` answers ``{"status": "ok", "sessions": N}``.

A small Starlette app, served like agentrl's other servers (`agentrl.http_server`): behind `agentrl.http_guard`
(the ``Host`` / ``Origin`` checks, a body cap of 64 KiB, the header and body deadlines), bound to 127.0.0.1 unless
asked. It has no token: it is for a person at this machine, and for tests. The env calls (a reset searches, a step
may) run on Starlette's worker threads, so one slow page holds no other session.
"""

from __future__ import annotations

import html
import http.server
import json
import secrets
import threading
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlparse

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agentrl.envs.webshop.env import WebShopEnv
from agentrl.envs.webshop.pages import render_html
from agentrl.envs.webshop.shared import WebShopResource
from agentrl.http_guard import HttpLimits
from agentrl.http_server import RunningServer
from agentrl.http_server import serve as serve_http
from agentrl.http_server import start_server as start_http

__all__ = ["WebShopSessions", "build_app", "serve", "start_server"]

MAX_SESSIONS = 1000
_MAX_BODY = 64 * 1024
_LIMITS = HttpLimits(max_body_bytes=_MAX_BODY)
_HTML = "text/html; charset=utf-8"
_METHODS = ["GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"]
_NO_SESSION = '<p>No such session. <a href="/">Start a new one</a>.</p>'


class WebShopSessions:
    """Session id -> env, all sharing one `WebShopResource`.

    Args:
        env_kwargs: `WebShopEnv` kwargs of every session's env.
    """

    def __init__(self, env_kwargs: dict[str, Any]):
        self.env_kwargs = env_kwargs
        self.resource = WebShopResource.build(**env_kwargs)
        # Build one env now: a bad kwarg must stop `serve` at start, not turn every page into a server error.
        WebShopEnv(**env_kwargs, shared=self.resource).close()
        self.envs: dict[str, tuple[WebShopEnv, threading.Lock]] = {}
        self.lock = threading.Lock()

    def create(self, seed: int | None) -> str:
        """Start a session on the goal `reset(seed=seed)` draws; returns its id."""
        env = WebShopEnv(**self.env_kwargs, shared=self.resource)
        env.reset(seed=seed)
        sid = secrets.token_hex(8)
        with self.lock:
            if len(self.envs) >= MAX_SESSIONS:  # forget the oldest session rather than grow without bound
                self.envs.pop(next(iter(self.envs)))
            self.envs[sid] = (env, threading.Lock())
        return sid

    def get(self, sid: str) -> tuple[WebShopEnv, threading.Lock] | None:
        """The env of session `sid` and the lock its calls hold (None when unknown)."""
        with self.lock:
            return self.envs.get(sid)

    def close(self) -> None:
        """Close every session's env."""
        with self.lock:
            envs, self.envs = list(self.envs.values()), {}
        for env, _ in envs:
            env.close()


def _page(status: HTTPStatus, body: str = "", location: str | None = None) -> Response:
    return Response(body.encode("utf-8"), status_code=status, media_type=_HTML,
                    headers={"Location": location} if location is not None else None)


def _unsupported(method: str) -> Response:
    """The standard library server's answer to a method it has no handler for (501, its own error page)."""
    status = HTTPStatus.NOT_IMPLEMENTED
    body = http.server.DEFAULT_ERROR_MESSAGE % {
        "code": status.value, "message": html.escape(f"Unsupported method ({method!r})", quote=False),
        "explain": html.escape(status.description, quote=False)}
    return Response(body.encode("utf-8", "replace"), status_code=status,
                    media_type=http.server.DEFAULT_ERROR_CONTENT_TYPE, headers={"Connection": "close"})


def _session(sessions: WebShopSessions, target: str) -> tuple[str, WebShopEnv, threading.Lock] | None:
    parts = urlparse(target).path.strip("/").split("/")
    if len(parts) == 2 and parts[0] == "s":
        found = sessions.get(parts[1])
        if found is not None:
            return parts[1], *found
    return None


def _get(sessions: WebShopSessions, target: str) -> Response:
    url = urlparse(target)
    if url.path == "/":
        seed_text = parse_qs(url.query).get("seed", [""])[0]
        if seed_text and not (seed_text.isascii() and seed_text.isdigit() and len(seed_text) <= 20):
            return _page(HTTPStatus.BAD_REQUEST,  # escaped: the query is the client's (a link could carry a script)
                         f"<p>seed must be a non-negative integer, got {html.escape(repr(seed_text))}</p>")
        sid = sessions.create(int(seed_text) if seed_text else None)
        return _page(HTTPStatus.SEE_OTHER, location=f"/s/{sid}")
    found = _session(sessions, target)
    if found is None:
        return _page(HTTPStatus.NOT_FOUND, _NO_SESSION)
    sid, env, lock = found
    with lock:
        page = render_html(env.page, f"/s/{sid}")
    return _page(HTTPStatus.OK, page)


def _post(sessions: WebShopSessions, target: str, body: bytes) -> Response:
    found = _session(sessions, target)
    if found is None:
        return _page(HTTPStatus.NOT_FOUND, _NO_SESSION)
    sid, env, lock = found
    form = parse_qs(body.decode("utf-8", errors="replace"))
    if "keywords" in form:
        action = f"search[{form['keywords'][0]}]"
    else:
        action = form.get("action", [""])[0]
    with lock:
        env.step(action)
    return _page(HTTPStatus.SEE_OTHER, location=f"/s/{sid}")


def build_app(sessions: WebShopSessions) -> Starlette:
    """The Starlette app serving `sessions`' pages (unguarded: `agentrl.http_server` adds the guard)."""

    async def health(request: Request) -> Response:
        return Response(json.dumps({"status": "ok", "sessions": len(sessions.envs)}), media_type="application/json")

    async def pages(request: Request) -> Response:
        # The request target as the client sent it (not percent-decoded), as the standard library's server saw it.
        target = request.scope.get("raw_path", request.scope["path"].encode()).decode("latin-1")
        query = request.scope.get("query_string", b"").decode("latin-1")
        target += f"?{query}" if query else ""
        if request.method == "GET":
            return await run_in_threadpool(_get, sessions, target)
        if request.method == "POST":
            body = await request.body()  # read whole, at most 64 KiB, by the guard before this runs
            return await run_in_threadpool(_post, sessions, target, body)
        return _unsupported(request.method)

    # Every method reaches `pages` (a Starlette function route takes GET alone unless told), which answers 501.
    return Starlette(routes=[Route("/health", health, methods=["GET"]), Route("/{path:path}", pages, methods=_METHODS)])


def serve(host: str = "127.0.0.1", port: int = 3000, **env_kwargs: Any) -> None:
    """Serve WebShop for humans at ``http://host:port/`` until interrupted (blocking)."""
    sessions = WebShopSessions(env_kwargs)
    try:
        serve_http(build_app(sessions), host, port, limits=_LIMITS, on_stop=(sessions.close,),
                   announce=lambda url: print(f"WebShop at {url}/ (Ctrl-C to stop)"))
    except KeyboardInterrupt:
        pass


def start_server(host: str = "127.0.0.1", port: int = 0, **env_kwargs: Any) -> RunningServer[WebShopSessions]:
    """Start the server in a daemon thread (port 0 picks a free port); returns once it answers ``/health``.

    The `agentrl.http_server.RunningServer` returned has the base URL (``http://127.0.0.1:43121``) as `url` and the
    `WebShopSessions` as `server`; `stop` stops serving and closes the sessions' envs.
    """
    sessions = WebShopSessions(env_kwargs)
    return start_http(build_app(sessions), host, port, server=sessions, limits=_LIMITS, on_stop=(sessions.close,),
                      name="webshop-server")
