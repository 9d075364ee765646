"""Start, probe and stop an agentrl HTTP server: one `RunningServer` and one `start_server` for every server.

Every HTTP server agentrl runs is an ASGI app served the same way, so they all hold clients to the same limits:

* ``agentrl env serve`` (`agentrl.envs.server`), FastAPI;
* ``agentrl serve``, the OpenAI-compatible server (`agentrl.serve.server`), FastAPI with server-sent events;
* ``agentrl webshop serve``, WebShop's pages for a person in a browser (`agentrl.envs.webshop.server`), Starlette.

    running = start_server(app, "127.0.0.1", 0, server=thing, path="/v1")   # a background thread
    running.url, running.port, running.health()                             # http://127.0.0.1:43121/v1, ...
    running.stop()                                                          # or: with start_server(...) as running:

    serve(app, "127.0.0.1", 8000, announce=print)                            # the same, in the foreground, until Ctrl-C

What both do, in order, so that no server can skip a step:

1. Wrap the app in `agentrl.http_guard.HttpGuard`: the ``Host`` / ``Origin`` allow-list (`allowed_hosts` of the bound
   address plus `extra_hosts`), the bearer token (every path but `open_paths`), and the body's size and time limits.
2. Bind the listening socket (`agentrl.http_guard.bind_socket`: port 0 picks a free port, a listen backlog of 2048,
   a taken port is the caller's `error` naming the fix).
3. Build uvicorn with the guarded HTTP protocol (`agentrl.http_guard.uvicorn_server`: a deadline and a size cap on
   the request line and headers, keep-alive, the concurrency limit, WebSocket frame and queue limits), all from the
   one `HttpLimits` the guard got.
4. Run it (a daemon thread for `start_server`, this thread for `serve`) and wait until uvicorn listens; then
   `start_server` GETs the `health` route once and expects 200, so a returned server answers.

Refusing to bind a non-loopback address without a token (`agentrl.http_guard.check_bind`) stays with each server's
own settings, which know the flag and environment variable to name.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from agentrl.http_guard import ASGIApp, HttpGuard, HttpLimits, allowed_hosts, bind_socket, error_json, uvicorn_server

__all__ = ["RunningServer", "start_server", "serve", "base_address"]

T = TypeVar("T")

_START_TIMEOUT = 30.0  # seconds uvicorn may take to listen (its lifespan startup included)
_STOP_TIMEOUT = 10.0  # seconds to wait for open requests to finish when stopping
_PROBE_HOSTS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}  # a wildcard bind answers on loopback


def base_address(host: str, port: int) -> str:
    """``http://host:port`` (an IPv6 address in brackets)."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


@dataclass(eq=False)
class RunningServer(Generic[T]):
    """A server running on a background thread (`start_server`); stop it with `stop` or a ``with`` block.

    Attributes:
        host: the bound address.
        port: the bound port (the free one picked, for port 0).
        server: what the routes serve (the env server's `EnvServer`, ``agentrl serve``'s `PolicyServer`, WebShop's
            sessions); tests read its state.
        path: the URL path `url` adds to `address` (``/NAME`` for a served env, ``/v1`` for ``agentrl serve``).
        thread: the thread running uvicorn.
        health_path: the route `health` reads.
        token: the bearer token calls need ("" when none); `health` sends it.
    """

    host: str
    port: int
    server: T
    path: str = ""
    thread: threading.Thread | None = None
    health_path: str = "/health"
    token: str = ""
    _uvicorn: Any = None
    _socket: Any = None
    _on_stop: list[Callable[[], object]] = field(default_factory=list)

    @property
    def address(self) -> str:
        """``http://host:port``, without `path`."""
        return base_address(self.host, self.port)

    @property
    def url(self) -> str:
        """The server's URL: `address` plus `path` (e.g. ``http://127.0.0.1:43121/math``)."""
        return self.address + self.path

    def health(self, timeout: float = 10.0) -> dict[str, Any]:
        """The JSON answer of the health route (`health_path`).

        Raises:
            OSError: the server does not answer, or answers another status than 200.
        """
        status, body = _get(self.host, self.port, self.health_path, self.token, timeout)
        if status != 200:
            raise OSError(f"GET {self.address}{self.health_path} answered {status}: {body[:200]!r}")
        return json.loads(body)

    def stop(self) -> None:
        """Stop serving and close the listening socket (the port is free again), then run the clean-ups.

        The clean-ups are `start_server`'s `on_stop` (an env server closes its sessions, ``agentrl serve`` stops its
        worker threads). Idempotent.
        """
        uv, self._uvicorn = self._uvicorn, None
        if uv is not None:
            uv.should_exit = True
            if self.thread is not None:
                self.thread.join(timeout=_STOP_TIMEOUT)
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        cleanups, self._on_stop = self._on_stop, []
        for cleanup in cleanups:
            cleanup()

    def close(self) -> None:
        """`stop`, then close what is served (its ``close()``, when it has one: ``agentrl serve``'s engine client)."""
        self.stop()
        close = getattr(self.server, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> RunningServer[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _prepare(app: ASGIApp, host: str, port: int, *, limits: HttpLimits, token: str, extra_hosts: Iterable[str],
             open_paths: Iterable[str], error_body: Callable[[int, str], Mapping[str, Any]],
             error: type[Exception], on_stop: Sequence[Callable[[], object]]) -> tuple[Any, Any]:
    """Steps 1 to 3 of the module docstring: the guarded app, the bound socket and the uvicorn server.

    On failure the `on_stop` clean-ups run before the error propagates: what the caller set up is released.
    """
    try:
        try:
            names = allowed_hosts(host, extra_hosts)
        except ValueError as e:
            raise error(str(e)) from None
        guarded = HttpGuard(app, allowed_hosts=names, limits=limits, token=token, open_paths=open_paths,
                            error_body=error_body)
        sock = bind_socket(host, port, error=error)
        return sock, uvicorn_server(guarded, limits=limits, error_body=error_body)
    except BaseException:
        for cleanup in on_stop:
            cleanup()
        raise


def start_server(app: ASGIApp, host: str = "127.0.0.1", port: int = 0, *, server: T = None,  # type: ignore[assignment]
                 path: str = "", limits: HttpLimits | None = None, token: str = "", extra_hosts: Iterable[str] = (),
                 open_paths: Iterable[str] = ("/health",), health: str = "/health",
                 error_body: Callable[[int, str], Mapping[str, Any]] = error_json,
                 on_stop: Sequence[Callable[[], object]] = (), error: type[Exception] = OSError,
                 name: str = "agentrl-http") -> RunningServer[T]:
    """Serve `app` on a background thread of this process; returns once it answers its health route.

    Args:
        app: the ASGI app (unguarded: the guard is added here).
        host: the address to bind.
        port: the port (0: a free one; `RunningServer.port` says which).
        server: what the routes serve, kept as `RunningServer.server`.
        path: the path `RunningServer.url` adds to the address.
        limits: the HTTP limits (`HttpLimits`; default: its defaults).
        token: the bearer token every path but `open_paths` needs ("": none).
        extra_hosts: ``Host`` names to answer besides the bound ones (`agentrl.http_guard.allowed_hosts`).
        open_paths: paths served without the token (health checks).
        health: the route GET once after start (it must answer 200).
        error_body: the JSON body of the refusals (`agentrl.http_guard.HttpGuard`'s `error_body`).
        on_stop: called, in order, after the server stopped (and when it fails to start).
        error: the exception type raised when it cannot start (the caller's own).
        name: the thread's name, also named in errors.

    Raises:
        error: an allowed host that is not a host name, an address that cannot be bound, uvicorn not starting or the
            health route not answering 200 within 30 seconds.
    """
    limits = limits or HttpLimits()
    sock, uv = _prepare(app, host, port, limits=limits, token=token, extra_hosts=extra_hosts, open_paths=open_paths,
                        error_body=error_body, error=error, on_stop=on_stop)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, name=name, daemon=True)
    running = RunningServer(host, sock.getsockname()[1], server, path, thread, health, token, _uvicorn=uv,
                            _socket=sock, _on_stop=list(on_stop))
    thread.start()
    deadline = time.monotonic() + _START_TIMEOUT
    while not uv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            running.stop()
            raise error(f"the HTTP server {name} did not start (see the log above)")
        time.sleep(0.01)
    try:
        status, body = _get(host, running.port, health, token, max(1.0, deadline - time.monotonic()))
    except OSError as e:
        status, body = 0, str(e).encode()
    if status != 200:
        running.stop()
        raise error(f"the HTTP server {name} started but GET {health} answered {status or 'nothing'}: "
                    f"{body[:200]!r}")
    return running


def serve(app: ASGIApp, host: str = "127.0.0.1", port: int = 0, *, path: str = "",
          limits: HttpLimits | None = None, token: str = "", extra_hosts: Iterable[str] = (),
          open_paths: Iterable[str] = ("/health",), error_body: Callable[[int, str], Mapping[str, Any]] = error_json,
          announce: Callable[[str], None] | None = None, on_stop: Sequence[Callable[[], object]] = (),
          error: type[Exception] = OSError) -> None:
    """Serve `app` in this thread until interrupted (blocking): `start_server`'s steps, with uvicorn's Ctrl-C handling.

    Args:
        app: the ASGI app (unguarded: the guard is added here).
        host: the address to bind.
        port: the port (0: a free one; the announced URL names it).
        path: the path the announced URL adds to the address.
        limits: the HTTP limits (`HttpLimits`; default: its defaults).
        token: the bearer token every path but `open_paths` needs ("": none).
        extra_hosts: ``Host`` names to answer besides the bound ones (`agentrl.http_guard.allowed_hosts`).
        open_paths: paths served without the token (health checks).
        error_body: the JSON body of the refusals (`agentrl.http_guard.HttpGuard`'s `error_body`).
        announce: called once with the URL (the address plus `path`) when the server listens.
        on_stop: called, in order, once serving ended (however it ended).
        error: the exception type raised when it cannot start (the caller's own).

    Raises:
        error: an allowed host that is not a host name, or an address that cannot be bound.
        KeyboardInterrupt: Ctrl-C, after uvicorn has shut down (uvicorn raises the signal again once it stopped).
    """
    limits = limits or HttpLimits()
    sock, uv = _prepare(app, host, port, limits=limits, token=token, extra_hosts=extra_hosts, open_paths=open_paths,
                        error_body=error_body, error=error, on_stop=on_stop)
    url = base_address(host, sock.getsockname()[1]) + path

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(uv.serve(sockets=[sock]))
        while not uv.started and not task.done():
            await asyncio.sleep(0.01)
        if uv.started and announce is not None:
            announce(url)
        await task

    try:
        asyncio.run(main())
    finally:
        sock.close()
        for cleanup in on_stop:
            cleanup()
    if not uv.started:  # uvicorn returns quietly when its start-up fails (a lifespan that raised)
        raise error("the HTTP server did not start (see the log above)")


def _get(host: str, port: int, path: str, token: str, timeout: float) -> tuple[int, bytes]:
    """One GET on a fresh connection (never through a proxy); returns the status and the body."""
    connection = http.client.HTTPConnection(_PROBE_HOSTS.get(host, host), port, timeout=timeout)
    try:
        connection.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()
