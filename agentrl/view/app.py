"""The `agentrl view` web app: FastAPI pages and JSON endpoints over run folders, behind `agentrl.http_guard`.

Pages (server-rendered, see `agentrl.view.pages`):

- ``/``: every metric's curve, runs overlaid, step or wall-clock axis, smoothing; each run's plan, config, eval
  results and what it lacks. The page polls ``/api/run/{i}/metrics?since=N`` every 2 s while open.
- ``/run/{i}/episodes``: the episode browser (query filters: step, group, task_type, success, min_reward,
  max_reward, policy_version, staleness, flag, recorded).
- ``/run/{i}/episode/{n}``: one episode turn by turn and its samples' tokens.
- ``/compare?a=I&b=J``: two runs side by side.

JSON: ``/api/runs``, ``/api/run/{i}/metrics``, ``/api/run/{i}/episodes``, ``/api/run/{i}/episode/{n}``.
Files: ``/files/{i}/PATH`` serves a file from inside run folder `i` only (GUI screenshots); a path that resolves
elsewhere (``..``, a symlink out) is refused with 403, a missing one is 404. ``/static/NAME`` serves the viewer's
own scripts and styles, nothing else.

Security is the servers': `HttpGuard` checks Host and Origin (DNS rebinding), body and header limits; binding
anything but loopback needs a token. A browser cannot send an ``Authorization`` header when following a link, so
the first page may be opened as ``/?token=TOKEN``: the app then sets an HttpOnly, SameSite=Strict cookie and turns
the cookie (or the query value) into the bearer header `HttpGuard` compares in constant time.
"""

import mimetypes
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentrl.view.pages import (
    LIVE_LINKS,
    EpisodeFilter,
    compare_page,
    episode_page,
    episodes_page,
    overview_page,
    render,
)
from agentrl.view.runs import RunFolder, ViewError

__all__ = ["build_app", "serve_view", "STATIC_DIR", "TOKEN_COOKIE"]

STATIC_DIR = Path(__file__).resolve().parent / "static"
"""The viewer's scripts and styles (uPlot vendored with its licence)."""

TOKEN_COOKIE = "agentrl_view_token"
"""The cookie that carries the token after the first ``?token=`` page."""

_STATIC = {p.name for p in STATIC_DIR.iterdir() if p.suffix in (".js", ".css")}


def _config(runs: Sequence[RunFolder]) -> dict[str, Any]:
    return {"live": True, "runs": [{"index": r.index, "name": r.name} for r in runs]}


def build_app(runs: Sequence[RunFolder]) -> Any:
    """The FastAPI app over `runs` (wrap it in `HttpGuard` to serve it; `serve_view` does).

    Args:
        runs: the run folders, their `index` their position here.
    """
    from fastapi import FastAPI, Request
    from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response

    app = FastAPI(title="agentrl view", docs_url=None, redoc_url=None, openapi_url=None)
    headers = [{"index": r.index, "name": r.name, "path": str(r.path)} for r in runs]

    def page(template: str, status: int = 200, **context: Any) -> HTMLResponse:
        context.setdefault("links", LIVE_LINKS)
        html = render(template, runs=headers, config=_config(runs), inline=None, **context)
        return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})

    def missing(what: str) -> HTMLResponse:
        return page("message.html", 404, title="not found", heading="Not found", message=what)

    def run_of(i: int) -> RunFolder | None:
        return runs[i] if 0 <= i < len(runs) else None

    def api_error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    @app.middleware("http")
    async def remember_token(request: Request, call_next: Callable) -> Response:
        response = await call_next(request)
        given = request.query_params.get("token")
        if given:  # HttpGuard already accepted it: later pages and polls carry it as a cookie
            response.set_cookie(TOKEN_COOKIE, given, httponly=True, samesite="strict")
        return response

    @app.get("/", response_class=HTMLResponse)
    def overview() -> HTMLResponse:
        data = overview_page(runs)
        return page("overview.html", title=data["title"], page=data)

    @app.get("/run/{i}/episodes", response_class=HTMLResponse)
    def episodes(i: int, request: Request) -> HTMLResponse:
        run = run_of(i)
        if run is None:
            return missing(f"no run {i}: this viewer shows runs 0 to {len(runs) - 1}")
        flt, errors = EpisodeFilter.parse(dict(request.query_params))
        data = episodes_page(run, flt, errors)
        return page("episodes.html", title=f"{run.name}: episodes", page=data)

    @app.get("/run/{i}/episode/{n}", response_class=HTMLResponse)
    def episode(i: int, n: int) -> HTMLResponse:
        run = run_of(i)
        if run is None:
            return missing(f"no run {i}: this viewer shows runs 0 to {len(runs) - 1}")
        try:
            data = episode_page(run, n)
        except KeyError:
            return missing(f"{run.name} has no episode {n} ({len(run.episodes())} saved)")
        return page("episode.html", title=f"{run.name}: episode {n}", page=data)

    @app.get("/compare", response_class=HTMLResponse)
    def compare(a: int = 0, b: int = 1) -> HTMLResponse:
        ra, rb = run_of(a), run_of(b)
        if ra is None or rb is None:
            return missing(f"compare needs two runs: start `agentrl view RUN_A RUN_B` (runs 0 to {len(runs) - 1})")
        return page("compare.html", title=f"{ra.name} beside {rb.name}", page=compare_page(ra, rb))

    @app.get("/api/runs")
    def api_runs() -> dict[str, Any]:
        return {"runs": [h | {"steps": len(r.metrics()), "episodes": len(r.episodes()), "problems": r.problems,
                              "lacks": r.lacks(), "token_values": r.has_token_values}
                         for h, r in zip(headers, runs)]}

    @app.get("/api/run/{i}/metrics")
    def api_metrics(i: int, since: int = 0) -> Any:
        run = run_of(i)
        if run is None:
            return api_error(404, f"no run {i}")
        rows = run.metrics(max(0, since))
        return {"run": i, "since": max(0, since), "rows": rows, "problems": run.problems}

    @app.get("/api/run/{i}/episodes")
    def api_episodes(i: int, request: Request) -> Any:
        run = run_of(i)
        if run is None:
            return api_error(404, f"no run {i}")
        flt, errors = EpisodeFilter.parse(dict(request.query_params))
        recorded = run.recorded_keys()
        return {"run": i, "errors": errors, "episodes": [e.to_json() | {"recorded": e.key in recorded}
                                                         for e in run.episodes() if flt.keep(e, recorded)]}

    @app.get("/api/run/{i}/episode/{n}")
    def api_episode(i: int, n: int) -> Any:
        run = run_of(i)
        if run is None:
            return api_error(404, f"no run {i}")
        rows = run.episodes()
        if not 0 <= n < len(rows):
            return api_error(404, f"{run.name} has no episode {n} ({len(rows)} saved)")
        return {"run": i, "episode": rows[n].to_json(), "trajectory": run.episode(n),
                "token_values": run.token_samples(rows[n])}

    @app.get("/favicon.ico")
    def favicon() -> Response:  # browsers ask on every page; an empty answer keeps their consoles clean
        return Response(status_code=204)

    @app.get("/static/{name}")
    def static(name: str) -> Any:
        if name not in _STATIC:
            return api_error(404, f"no static file {name!r}")
        return FileResponse(STATIC_DIR / name)

    @app.get("/files/{i}/{path:path}")
    def files(i: int, path: str) -> Any:
        run = run_of(i)
        if run is None:
            return api_error(404, f"no run {i}")
        target = (run.path / path).resolve()
        if not target.is_relative_to(run.path):
            return api_error(403, f"{path!r} is outside run folder {run.name}: only files inside it are served")
        if not target.is_file():
            return api_error(404, f"{run.name} has no file {path!r}")
        media = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        return FileResponse(target, media_type=media, headers={"X-Content-Type-Options": "nosniff",
                                                               "Content-Security-Policy": "sandbox"})

    return app


class _TokenFromBrowser:
    """ASGI wrapper outside `HttpGuard`: a ``?token=`` query value or the token cookie becomes the bearer header.

    Browsers cannot set ``Authorization`` on a followed link; `HttpGuard` still does the comparison.
    """

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not any(k == b"authorization" for k, _ in scope.get("headers", [])):
            from http.cookies import SimpleCookie
            from urllib.parse import parse_qs

            given = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token", [None])[0]
            if given is None:
                for key, value in scope.get("headers", []):
                    if key == b"cookie":
                        cookie = SimpleCookie()
                        try:
                            cookie.load(value.decode("latin-1"))
                        except Exception:  # noqa: BLE001 - a malformed cookie header is no token
                            continue
                        if TOKEN_COOKIE in cookie:
                            given = cookie[TOKEN_COOKIE].value
            if given is not None:
                scope = dict(scope, headers=[*scope["headers"], (b"authorization", f"Bearer {given}".encode())])
        await self.app(scope, receive, send)


def serve_view(paths: Sequence[str | Path], *, host: str = "127.0.0.1", port: int = 8100, token: str = "",
               extra_hosts: Sequence[str] = (), say: Callable[[str], None] = print) -> None:
    """Serve the viewer over run folders `paths` until interrupted.

    Args:
        paths: run folders (training runs or eval outputs).
        host: address to bind; any other than loopback needs `token`.
        port: port (0 picks a free one; the URL said names it).
        token: bearer token (or ``?token=`` once in the browser); empty for none.
        extra_hosts: more names the Host header may carry (``--allowed-host``).
        say: where the URL line goes.

    Raises:
        ViewError: a folder is missing or not a run folder, a wide bind without a token, the port is taken.
    """
    from agentrl.http_guard import HttpGuard, HttpLimits, allowed_hosts, bind_socket, check_bind, uvicorn_server
    from agentrl.view.runs import open_runs

    check_bind(host, token, token_flag="--token", env_var="AGENTRL_VIEW_TOKEN", error=ViewError)
    runs = open_runs(list(paths))
    limits = HttpLimits(max_body_bytes=64 * 2**10)  # the viewer takes no request bodies
    guarded = HttpGuard(build_app(runs), allowed_hosts=allowed_hosts(host, extra_hosts), limits=limits, token=token)
    server = uvicorn_server(_TokenFromBrowser(guarded), limits=limits)
    sock = bind_socket(host, port, error=ViewError)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{sock.getsockname()[1]}/"
    say(f"agentrl view: {url}{'?token=...' if token else ''} ({', '.join(str(r.path) for r in runs)}); "
        f"Ctrl-C stops")
    server.run(sockets=[sock])
