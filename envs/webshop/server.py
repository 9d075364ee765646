"""Human web mode: serve WebShop's pages as HTML on 127.0.0.1, one env per browser session.

    serve(port=3000)                       # blocking; `agentrl webshop serve` calls this
    with start_server(port=0) as server:   # background thread, for tests
        print(server.url)

``GET /`` (optionally ``/?seed=N``) starts a session on the goal `reset(seed=N)` draws and redirects to
``/s/<session>``, which shows the current page. Every button posts its ``click[...]`` action and the search box its
keywords back to ``/s/<session>``, so a human plays through exactly the transitions and pages an agent gets. The
standard library's `ThreadingHTTPServer` is enough: it only runs on the loopback interface, for humans and tests.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from agentrl.envs.webshop.env import WebShopEnv
from agentrl.envs.webshop.pages import render_html
from agentrl.envs.webshop.shared import WebShopResource

__all__ = ["RunningServer", "make_server", "serve", "start_server"]

MAX_SESSIONS = 1000
_MAX_BODY = 64 * 1024


class _Sessions:
    """Session id -> env, all sharing one `WebShopResource`."""

    def __init__(self, env_kwargs: dict[str, Any]):
        self.env_kwargs = env_kwargs
        self.resource = WebShopResource.build(**env_kwargs)
        # Build one env now: a bad kwarg must stop `serve` at start, not turn every page into a server error.
        WebShopEnv(**env_kwargs, shared=self.resource).close()
        self.envs: dict[str, tuple[WebShopEnv, threading.Lock]] = {}
        self.lock = threading.Lock()

    def create(self, seed: int | None) -> str:
        env = WebShopEnv(**self.env_kwargs, shared=self.resource)
        env.reset(seed=seed)
        sid = secrets.token_hex(8)
        with self.lock:
            if len(self.envs) >= MAX_SESSIONS:  # forget the oldest session rather than grow without bound
                self.envs.pop(next(iter(self.envs)))
            self.envs[sid] = (env, threading.Lock())
        return sid

    def get(self, sid: str) -> tuple[WebShopEnv, threading.Lock] | None:
        with self.lock:
            return self.envs.get(sid)


def _handler(sessions: _Sessions) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "agentrl-webshop"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
            pass  # keep test and terminal output quiet

        def _send(self, status: HTTPStatus, body: str = "", location: str | None = None) -> None:
            data = body.encode("utf-8")
            self.send_response(status)
            if location is not None:
                self.send_header("Location", location)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _session(self) -> tuple[str, WebShopEnv, threading.Lock] | None:
            parts = urlparse(self.path).path.strip("/").split("/")
            if len(parts) == 2 and parts[0] == "s":
                found = sessions.get(parts[1])
                if found is not None:
                    return parts[1], *found
            return None

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            url = urlparse(self.path)
            if url.path == "/":
                seed_text = parse_qs(url.query).get("seed", [""])[0]
                if seed_text and not seed_text.isdigit():
                    self._send(HTTPStatus.BAD_REQUEST, f"<p>seed must be a non-negative integer, got {seed_text!r}</p>")
                    return
                sid = sessions.create(int(seed_text) if seed_text else None)
                self._send(HTTPStatus.SEE_OTHER, location=f"/s/{sid}")
                return
            found = self._session()
            if found is None:
                self._send(HTTPStatus.NOT_FOUND, '<p>No such session. <a href="/">Start a new one</a>.</p>')
                return
            sid, env, lock = found
            with lock:
                page = render_html(env.page, f"/s/{sid}")
            self._send(HTTPStatus.OK, page)

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            found = self._session()
            if found is None:
                self._send(HTTPStatus.NOT_FOUND, '<p>No such session. <a href="/">Start a new one</a>.</p>')
                return
            sid, env, lock = found
            length = min(int(self.headers.get("Content-Length") or 0), _MAX_BODY)
            form = parse_qs(self.rfile.read(length).decode("utf-8", errors="replace"))
            if "keywords" in form:
                action = f"search[{form['keywords'][0]}]"
            else:
                action = form.get("action", [""])[0]
            with lock:
                env.step(action)
            self._send(HTTPStatus.SEE_OTHER, location=f"/s/{sid}")

    return Handler


def make_server(host: str = "127.0.0.1", port: int = 3000, **env_kwargs: Any) -> ThreadingHTTPServer:
    """Build (but do not start) the HTTP server; `env_kwargs` are `WebShopEnv` kwargs."""
    server = ThreadingHTTPServer((host, port), _handler(_Sessions(env_kwargs)))
    server.daemon_threads = True
    return server


def serve(host: str = "127.0.0.1", port: int = 3000, **env_kwargs: Any) -> None:
    """Serve WebShop for humans at ``http://host:port/`` until interrupted (blocking)."""
    server = make_server(host, port, **env_kwargs)
    print(f"WebShop at http://{host}:{server.server_address[1]}/ (Ctrl-C to stop)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


@dataclass
class RunningServer:
    """A server running in a background thread (see `start_server`).

    Attributes:
        url: the base URL, e.g. ``http://127.0.0.1:43121``.
        server: the HTTP server.
        thread: the thread serving it.
    """

    url: str
    server: ThreadingHTTPServer
    thread: threading.Thread

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_server(host: str = "127.0.0.1", port: int = 0, **env_kwargs: Any) -> RunningServer:
    """Start the server in a daemon thread; port 0 picks a free port. Returns its URL and a stop handle."""
    server = make_server(host, port, **env_kwargs)
    thread = threading.Thread(target=server.serve_forever, name="webshop-server", daemon=True)
    thread.start()
    return RunningServer(url=f"http://{host}:{server.server_address[1]}", server=server, thread=thread)
