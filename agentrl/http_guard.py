"""What every agentrl HTTP server does before a request reaches its app: the checks that trust no client.

The servers (`agentrl env serve`, `agentrl.envs.server`; `agentrl serve`, `agentrl.serve`; WebShop's pages,
`agentrl.envs.webshop.server`) run on uvicorn behind `HttpGuard`, started by `agentrl.http_server`, which builds
their listening socket and uvicorn server here, so they promise the same things. What it does, spelled out:

    limits = HttpLimits(max_body_bytes=8 * 2**20)
    check_bind(host, token, token_flag="--token", env_var="AGENTRL_ENV_TOKEN", error=ServeError)  # the server's own
    app = HttpGuard(app, allowed_hosts=allowed_hosts(host, extra_hosts), limits=limits, token=token,
                    open_paths=("/health",))
    server = uvicorn_server(app, limits=limits)
    server.run(sockets=[bind_socket(host, port)])

What a client meets, in order (each refusal is a JSON answer ``{"error": MESSAGE}`` naming the problem and the fix,
never a traceback):

1. **Slow or huge headers** (uvicorn itself holds a client that trickles its request line and headers forever, and
   httptools has no header size cap): the request line and headers must arrive within `HttpLimits.header_timeout`
   of the connection (or of the first byte of a kept-alive connection's next request) and fit in
   `HttpLimits.max_header_bytes`, else 408 / 431 and the connection is closed. A malformed request (``Content-Length:
   abc``, which the HTTP parser rejects) gets 400 with a JSON body.
2. **Host and Origin** (DNS rebinding, cross-site pages): the ``Host`` header must name the server (`allowed_hosts`:
   loopback names for a loopback bind, the bound name otherwise, plus what the operator adds), else 421; a request
   (or WebSocket handshake) whose ``Origin`` names another host is refused with 403. Browsers always send
   ``Origin`` on cross-site requests and WebSocket handshakes; programmatic clients send none.
3. **Token**: with a token set, every path but `open_paths` needs ``Authorization: Bearer TOKEN`` (WebSocket
   clients that cannot set headers may pass ``?token=TOKEN``), compared in constant time: 401 (403 on a WebSocket).
4. **Body**: ``Content-Length`` must be one decimal number (400), at most `HttpLimits.max_body_bytes` (413, before a
   byte is read); a chunked body is counted as it streams in (413 once over); the whole body must arrive within
   `HttpLimits.body_timeout` (408). The body is read here, whole, before the app runs, so the app never waits on a
   slow client; the servers take JSON (or, WebShop's pages, form) bodies of a few MiB at most, which they would
   buffer anyway.
5. **WebSocket frames**: larger than `HttpLimits.ws_max_size` are closed by uvicorn with 1009; what a frame holds
   (binary, too deep) is the app's to answer (`agentrl.envs.server` closes with 1003 / 1007 and an OpenEnv error).

`uvicorn_server` sets the rest: keep-alive timeout, concurrency limit (503 above it), WebSocket queue and pings.
The header checks subclass uvicorn's HTTP protocol (httptools, or h11 when httptools is missing): uvicorn has no
option for them (checked on uvicorn 0.54).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import re
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["LOOPBACK_HOSTS", "HttpLimits", "HttpGuard", "allowed_hosts", "host_allowed", "is_loopback",
           "check_bind", "bind_socket", "uvicorn_server", "error_json"]

LOOPBACK_HOSTS: frozenset[str] = frozenset({"127.0.0.1", "localhost", "::1"})
"""Names of this machine's loopback interface, as they appear in a ``Host`` header (IPv6 without brackets)."""

_WILDCARD = frozenset({"", "0.0.0.0", "::"})
_DIGITS = re.compile(rb"\s*\d{1,19}\s*")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class HttpLimits:
    """The bounds one HTTP server holds every client to.

    Attributes:
        max_body_bytes: largest request body (by ``Content-Length``, or counted while a chunked body streams): 413.
        body_timeout: seconds the whole body may take to arrive once the headers are in: 408.
        header_timeout: seconds the request line and headers may take, from the connection (or from the first byte
            of the next request on a kept-alive connection): 408 and the connection closed.
        max_header_bytes: largest request line plus headers: 431 and the connection closed.
        keep_alive: seconds an idle kept-alive connection is held open between requests.
        limit_concurrency: connections plus running requests at once; above it new requests get 503 (None: no
            limit).
        ws_max_size: largest WebSocket message in bytes; a larger one closes the connection with 1009.
        ws_max_queue: WebSocket messages buffered per connection before reading from the client pauses.
        ws_ping_interval: seconds between WebSocket pings (None: no pings).
        ws_ping_timeout: seconds to wait for a pong before closing the WebSocket (None: wait forever).
    """

    max_body_bytes: int = 8 * 2**20
    body_timeout: float = 30.0
    header_timeout: float = 30.0
    max_header_bytes: int = 64 * 2**10
    keep_alive: float = 75.0
    limit_concurrency: int | None = 2048
    ws_max_size: int = 8 * 2**20
    ws_max_queue: int = 32
    ws_ping_interval: float | None = 20.0
    ws_ping_timeout: float | None = 20.0

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_header_bytes", "ws_max_size", "ws_max_queue"):
            if getattr(self, name) < 1:
                raise ValueError(f"HttpLimits.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("body_timeout", "header_timeout", "keep_alive"):
            if not getattr(self, name) > 0:
                raise ValueError(f"HttpLimits.{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.limit_concurrency is not None and self.limit_concurrency < 1:
            raise ValueError(f"HttpLimits.limit_concurrency must be >= 1 or None, got {self.limit_concurrency}")


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server on this machine (a loopback name or address)."""
    name = _normalize(host)
    if name in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str, *, token_flag: str, env_var: str,
               error: type[Exception] = ValueError) -> None:
    """Refuse to bind anything but loopback without a token.

    Args:
        host: the address the server will bind.
        token: the bearer token clients must send; empty means none.
        token_flag: the command-line option that sets the token, named in the message (e.g. ``--token``).
        env_var: the environment variable that sets the token, named in the message.
        error: the exception type raised (the caller's own "cannot start" error).

    Raises:
        error: `host` is not loopback and `token` is empty.
    """
    if not is_loopback(host) and not token:
        raise error(f"binding {host} exposes the server to the network; set a token with {token_flag} or "
                    f"{env_var}=..., or bind 127.0.0.1")


def allowed_hosts(bind_host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The names a ``Host`` (or ``Origin``) header may carry for a server bound to `bind_host`.

    A loopback bind answers the loopback names (`LOOPBACK_HOSTS`) and the bound name; a wildcard bind (``0.0.0.0``,
    ``::``) answers those plus this machine's host names and interface addresses; any other bind answers the bound
    name only. Ports are never compared. A DNS-rebinding page always sends its own domain name, which is none of
    these, so it is refused however its DNS answers.

    Args:
        bind_host: the address the server binds.
        extra: more names the operator allows (e.g. the name a reverse proxy forwards; ``--allowed-host``); ``*``
            allows any ``Host`` (for a server behind a proxy that checks it).

    Returns:
        The allowed names, lower-case, IPv6 addresses without brackets.
    """
    bound = _normalize(bind_host)
    names: set[str] = set()
    if bound in _WILDCARD:
        names |= LOOPBACK_HOSTS | _machine_names()
    else:
        if is_loopback(bound):
            names |= LOOPBACK_HOSTS
        names.add(bound)
    for name in extra:
        if name.strip() == "*":
            names.add("*")
            continue
        normalized = _host_name(name)
        if not normalized:
            raise ValueError(f"allowed host {name!r} is not a host name (give a name like 'box.example' or an "
                             f"address, without a scheme)")
        names.add(normalized)
    return frozenset(names)


def host_allowed(value: str | None, allowed: frozenset[str]) -> bool:
    """Whether a ``Host`` header value (``name``, ``name:port``, ``[v6]:port``) names one of `allowed`."""
    if "*" in allowed:
        return True
    name = _host_name(value or "")
    return bool(name) and name in allowed


def _origin_allowed(origin: str, allowed: frozenset[str], host: str, scheme: str) -> bool:
    """Whether a web page at `origin` may call this server, reached as `host` (the Host header) over `scheme`.

    A loopback origin must also be on this server's port: any other local server's page (a notebook, a dev server,
    another agentrl server) is another origin, and WebSockets and simple POSTs are not held back by CORS. An origin
    named by the operator (``--allowed-host``, e.g. behind a proxy that changes the port) is matched by name.
    """
    if "*" in allowed:
        return True
    try:
        parts = urlsplit(origin.strip())
        hostname, port = parts.hostname, parts.port  # hostname None for "null" (sandboxed frames, file:// pages)
    except ValueError:
        return False
    if not hostname or _normalize(hostname) not in allowed:
        return False
    if _normalize(hostname) not in LOOPBACK_HOSTS:
        return True
    given = _host_port(host)
    own = int(given) if given.isdigit() else _DEFAULT_PORTS.get(scheme, 0)
    return (port or _DEFAULT_PORTS.get(parts.scheme, -1)) == own


def _host_port(value: str) -> str:
    """The port in a ``Host`` header value (``name:port``, ``[v6]:port``); "" when it names none."""
    value = value.strip()
    if value.startswith("["):
        rest = value[value.find("]") + 1:]
        return rest[1:] if rest.startswith(":") else ""
    return value.partition(":")[2] if value.count(":") == 1 else ""


_DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}


def _normalize(name: str) -> str:
    name = name.strip().lower().rstrip(".")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    return name


def _host_name(value: str) -> str:
    """The name in a ``Host`` header value, without port and brackets; "" when malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        rest = value[end + 1:]
        if end < 0 or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return ""
        return value[1:end]
    if value.count(":") > 1:  # a bare IPv6 address (not valid in a Host header, but unambiguous)
        return _normalize(value)
    name, _, port = value.partition(":")
    if port and not port.isdigit():
        return ""
    return _normalize(name)


def _machine_names() -> set[str]:
    """This machine's host names and interface addresses: what a client of a wildcard bind may call it."""
    names = {_normalize(socket.gethostname()), _normalize(socket.getfqdn())}
    try:
        import psutil

        for addresses in psutil.net_if_addrs().values():
            for address in addresses:
                if address.family in (socket.AF_INET, socket.AF_INET6):
                    names.add(_normalize(address.address.split("%")[0]))  # drop an IPv6 zone ("fe80::1%eth0")
    except Exception:  # interface listing is best effort: the operator can add names with --allowed-host
        pass
    return {n for n in names if n}


def error_json(status: int, message: str) -> dict[str, Any]:
    """The default refusal body, ``{"error": MESSAGE}`` (the env server's format)."""
    return {"error": message}


class HttpGuard:
    """ASGI middleware: Host / Origin allow-list, bearer token, and body size and time limits (module docstring).

    A plain ASGI class, not Starlette's `BaseHTTPMiddleware`, which costs a task and a stream per request. Lifespan
    messages pass through untouched. The body is read here before the app runs and handed to it as one message;
    later ``receive`` calls (a streaming response waiting for the client to disconnect) reach the client.

    Args:
        app: the ASGI app guarded.
        allowed_hosts: names the ``Host`` / ``Origin`` headers may carry (see `allowed_hosts`).
        limits: body size and body read timeout (the header and WebSocket limits are `uvicorn_server`'s).
        token: bearer token every path but `open_paths` needs; empty means none.
        open_paths: paths served without the token (health checks).
        error_body: the JSON body of a refusal, from the status and the message (default `error_json`); a server
            with its own error format (OpenAI's ``{"error": {"message": ...}}``) passes its own.
    """

    def __init__(self, app: ASGIApp, *, allowed_hosts: frozenset[str], limits: HttpLimits = HttpLimits(),
                 token: str = "", open_paths: Iterable[str] = (),
                 error_body: Callable[[int, str], Mapping[str, Any]] = error_json):
        self.app = app
        self.allowed_hosts = frozenset(allowed_hosts)
        self.limits = limits
        self.token = token
        self.open_paths = frozenset(open_paths)
        self.error_body = error_body

    def authorized(self, header: str | None, query_token: str | None = None) -> bool:
        """Whether a call carrying `header` (``Authorization``) or `query_token` may pass (always, without a token)."""
        if not self.token:
            return True
        given = ""
        if header and header.lower().startswith("bearer "):
            given = header[7:].strip()
        elif query_token:
            given = query_token
        return hmac.compare_digest(given.encode("utf-8", "replace"), self.token.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Check one connection's request (HTTP) or handshake (WebSocket), then hand it to the app."""
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            status, message = refusal
            if kind == "http":
                await self._reply(send, status, message)
            else:
                await self._refuse_websocket(scope, receive, send, status, message)
            return
        if kind == "websocket":
            await self.app(scope, receive, send)
            return
        await self._http(scope, receive, send, headers)

    def _refusal(self, scope: Scope, headers: dict[bytes, list[bytes]]) -> tuple[int, str] | None:
        host = b", ".join(headers.get(b"host", [])).decode("latin-1")
        if not host:
            return 400, "the request has no Host header; send one (HTTP/1.1 requires it)"
        if len(headers[b"host"]) > 1 or not host_allowed(host, self.allowed_hosts):
            return 421, (f"this server does not answer for host {host[:100]!r}; call it by one of "
                         f"{sorted(self.allowed_hosts)} (an operator allows more names with --allowed-host)")
        for origin in headers.get(b"origin", []):
            if not _origin_allowed(origin.decode("latin-1"), self.allowed_hosts, host, scope.get("scheme", "http")):
                return 403, (f"requests from web pages at {origin.decode('latin-1')[:100]!r} are refused: the "
                             f"origin is not this server's (its host and port; an operator allows names with "
                             f"--allowed-host)")
        if not self.token or scope["path"] in self.open_paths:
            return None
        header = b", ".join(headers.get(b"authorization", [])).decode("latin-1")
        query = None
        if scope["type"] == "websocket":
            query = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token", [None])[0]
        if not self.authorized(header, query):
            return 401, "missing or wrong bearer token (Authorization: Bearer TOKEN)"
        return None

    async def _http(self, scope: Scope, receive: Receive, send: Send, headers: dict[bytes, list[bytes]]) -> None:
        limit = self.limits.max_body_bytes
        lengths = headers.get(b"content-length", [])
        if lengths:
            if len(set(lengths)) > 1 or not all(_DIGITS.fullmatch(v) for v in lengths):
                await self._reply(send, 400, "Content-Length must be one non-negative decimal number",
                                  close=True)
                return
            if int(lengths[0]) > limit:
                await self._reply(send, 413, f"request body of {int(lengths[0])} bytes is over this server's "
                                             f"limit of {limit} bytes; send less", close=True)
                return
        # One timer for the whole body that cancels this task, as `asyncio.timeout` (3.11+) does: `wait_for` would
        # start a task per chunk, a cost every request pays.
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            if task is not None:
                task.cancel()

        timer = loop.call_later(self.limits.body_timeout, expire)
        chunks: list[bytes] = []
        size = 0
        try:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return  # the client left: nobody to answer
                body = message.get("body", b"")
                size += len(body)
                if size > limit:
                    timer.cancel()
                    await self._reply(send, 413, f"request body over this server's limit of {limit} bytes; send "
                                                 f"less", close=True)
                    return
                chunks.append(body)
                if not message.get("more_body", False):
                    break
        except asyncio.CancelledError:
            if not expired:
                raise  # cancelled from outside (shutdown): not ours to answer
            if task is not None and hasattr(task, "uncancel"):
                task.uncancel()  # the cancellation was ours and is handled (3.11+)
            await self._reply(send, 408, f"the request body did not arrive within {self.limits.body_timeout:g}s; "
                                         f"send it at once", close=True)
            return
        finally:
            timer.cancel()
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # after the body: only http.disconnect comes

        await self.app(scope, replay, send)

    async def _reply(self, send: Send, status: int, message: str, *, close: bool = False) -> None:
        body = json.dumps(self.error_body(status, message)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if close:  # the rest of the body is unread: the connection cannot carry another request
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _refuse_websocket(self, scope: Scope, receive: Receive, send: Send, status: int, message: str) -> None:
        connect = await receive()
        if connect["type"] != "websocket.connect":
            return
        if "websocket.http.response" in scope.get("extensions", {}):  # an HTTP answer with the reason in it
            status = 403 if status == 401 else status  # 401 asks a browser for credentials
            body = json.dumps(self.error_body(status, message)).encode()
            await send({"type": "websocket.http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "websocket.http.response.body", "body": body})
        else:  # closing before accepting: the server answers the handshake with 403
            await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})


def _headers(scope: Scope) -> dict[bytes, list[bytes]]:
    out: dict[bytes, list[bytes]] = {}
    for name, value in scope.get("headers", ()):
        out.setdefault(name.lower(), []).append(value)
    return out


def bind_socket(host: str, port: int, *, error: type[Exception] = OSError, backlog: int = 2048) -> socket.socket:
    """A listening TCP socket on `host`:`port` (0 picks a free port), for ``uvicorn.Server.run(sockets=[...])``.

    Bound here rather than by uvicorn so the caller knows the port before serving and so a taken port is an error
    naming the fix. The listen backlog is 2048: the standard library's default of 5 resets bursts of connections.

    Raises:
        error: the address cannot be bound (taken, or not this machine's).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # accepted sockets inherit it: no Nagle stalls
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise error(f"cannot bind {host}:{port}: {e.strerror or e}; pick another --port "
                    f"(0 picks a free one)") from None
    sock.listen(backlog)
    return sock


def uvicorn_server(app: ASGIApp, *, limits: HttpLimits = HttpLimits(), log_level: str = "warning",
                   error_body: Callable[[int, str], Mapping[str, Any]] = error_json) -> Any:
    """A ``uvicorn.Server`` for `app` holding clients to `limits` (slow and large headers included).

    Args:
        app: the ASGI app, normally wrapped in `HttpGuard`.
        limits: the bounds (the same object the `HttpGuard` got).
        log_level: uvicorn's log level; access logs are off.
        error_body: the JSON body of the refusals written before the app runs (malformed requests, slow or huge
            headers), as `HttpGuard`'s `error_body`: a server with its own error format passes the same function.

    Returns:
        The server; run it with ``server.run(sockets=[bind_socket(...)])`` or ``await server.serve(sockets=...)``.
    """
    import uvicorn

    config = uvicorn.Config(
        app, log_level=log_level, access_log=False, lifespan="on", server_header=False,
        http=_guarded_http_protocol(limits, error_body), h11_max_incomplete_event_size=limits.max_header_bytes,
        ws="websockets-sansio", ws_max_size=limits.ws_max_size, ws_max_queue=limits.ws_max_queue,
        ws_ping_interval=limits.ws_ping_interval, ws_ping_timeout=limits.ws_ping_timeout,
        timeout_keep_alive=limits.keep_alive, limit_concurrency=limits.limit_concurrency)
    return uvicorn.Server(config)


def _raw_response(status: int, reason: str, message: str,
                  error_body: Callable[[int, str], Mapping[str, Any]] = error_json) -> bytes:
    body = json.dumps(error_body(status, message)).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\n\r\n").encode() + body


def _guarded_http_protocol(limits: HttpLimits,
                           error_body: Callable[[int, str], Mapping[str, Any]] = error_json) -> type:
    """The HTTP protocol class of uvicorn with a deadline and a size cap on the request line and headers.

    uvicorn arms its keep-alive timer only after a response, so a client that connects and trickles its headers
    (slowloris) holds a connection and a file descriptor for as long as it likes. Here a timer runs from the
    connection (and from the first byte of each later request) until the headers are parsed, whatever the client
    sends meanwhile.
    """
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class GuardedHTTPProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._header_timer: asyncio.TimerHandle | None = None
            self._header_bytes = 0  # received while waiting for the headers (a trickle of small chunks)
            self._parsed_header_bytes = 0  # parsed into the request line and headers (all in one chunk)
            self._headers_too_large = False

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            cycle = self.cycle
            if self._header_timer is None and (cycle is None or cycle.response_complete):
                self._arm()  # the first byte of the next request on a kept-alive connection
            waiting = self._header_timer is not None
            super().data_received(data)
            if not waiting or self._header_timer is None:
                return
            if self.cycle is not cycle or self.transport.is_closing():
                self._disarm()  # headers parsed (a new request cycle), or refused by the parser
                return
            self._header_bytes += len(data)
            if self._header_bytes > limits.max_header_bytes:
                self._refuse(431, "Request Header Fields Too Large",
                             f"request line and headers over {limits.max_header_bytes} bytes; send fewer")

        # httptools' callbacks (h11 never calls them; `h11_max_incomplete_event_size` caps its headers instead).
        def on_message_begin(self) -> None:
            self._parsed_header_bytes = 0
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self._count_header_bytes(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count_header_bytes(len(name) + len(value) + 4)
            super().on_header(name, value)

        def _count_header_bytes(self, size: int) -> None:
            self._parsed_header_bytes += size
            if self._parsed_header_bytes > limits.max_header_bytes:
                self._headers_too_large = True
                raise ValueError("headers too large")  # the parser stops, and uvicorn calls send_400_response

        def handle_websocket_upgrade(self, *args: Any) -> None:
            self._disarm()  # the connection is the WebSocket protocol's now, with its own pings and limits
            super().handle_websocket_upgrade(*args)

        def send_400_response(self, msg: str) -> None:
            if self._headers_too_large:
                self._refuse(431, "Request Header Fields Too Large",
                             f"request line and headers over {limits.max_header_bytes} bytes; send fewer")
                return
            self._disarm()
            if not self.transport.is_closing():
                message = f"malformed HTTP request ({msg.rstrip('.')}); check the request line and headers"
                self.transport.write(_raw_response(400, "Bad Request", message, error_body))
                self.transport.close()

        def _arm(self) -> None:
            self._disarm()
            self._header_bytes = 0
            self._header_timer = self.loop.call_later(limits.header_timeout, self._header_timeout)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            if self.transport.get_protocol() is self:
                self._refuse(408, "Request Timeout", f"request headers did not arrive within "
                                                     f"{limits.header_timeout:g}s; send them at once")

        def _refuse(self, status: int, reason: str, message: str) -> None:
            self._disarm()
            if not self.transport.is_closing():
                self.transport.write(_raw_response(status, reason, message, error_body))
                self.transport.close()

    return GuardedHTTPProtocol
