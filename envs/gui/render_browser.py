"""The browser renderer: the screen as HTML served on 127.0.0.1, driven through Playwright in headless Chromium.

Each screen's element tree becomes a page of absolutely positioned elements (same bboxes as the text observation).
Gestures are real browser input: `page.mouse.click`, a held click for a long press, `page.keyboard` for typing and
Enter, `page.mouse.wheel` for scrolling. Chromium decides which element was hit; the page's script (phone.js)
POSTs each event to the local server, which applies it to the env's `Phone`. Python then waits for those requests,
has the page swap in the new screen if the state moved, and takes the browser's own screenshot.

One Chromium per process: a `BrowserHost` (a `SharedResource`) owns the HTTP server, Playwright and the browser,
started lazily on the first page; every env gets a page of its own. Playwright's sync API is bound to the thread
that started it, so all browser envs sharing a host must be stepped from that thread (one runner actor = one
thread = one browser is the intended layout).
"""

from __future__ import annotations

import html
import io
import itertools
import json
import os
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

from PIL import Image

from agentrl.envs.core import SharedResource
from agentrl.extras import needs_extra

from .phone import Phone
from .renderer import Renderer
from .ui import HEIGHT, WIDTH, Screen, UIElement

__all__ = ["CHROMIUM", "CHROMIUM_ARGS", "BrowserHost", "BrowserRenderer", "screen_html"]

CHROMIUM = "/usr/bin/chromium"
"""Debian's Chromium (``apt-get install -y chromium``); Playwright's own downloaded browsers are never used."""
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)
_HERE = Path(__file__).resolve().parent
_LONG_PRESS_MS = 600  # above the 500 ms long-press threshold in phone.js
_APP_COLOURS = {
    "Settings": "#5f6368",
    "Contacts": "#1a73e8",
    "Messages": "#1e8e3e",
    "Clock": "#f9ab00",
    "Shop": "#d93025",
}
_ICONS = {
    "plus": '<svg viewBox="0 0 24 24"><path d="M12 2v20M2 12h20" stroke="#fff" stroke-width="3"/></svg>',
    "back": '<svg viewBox="0 0 24 24"><path d="M20 2v20L3 12z" fill="none" stroke="#5f6368" stroke-width="2"/></svg>',
    "home": (
        '<svg viewBox="0 0 24 24"><circle cx="12" cy="12" r="10" fill="none" stroke="#5f6368" stroke-width="2"/></svg>'
    ),
    "send": '<svg viewBox="0 0 24 24"><path d="M3 2v20l20-10z" fill="#fff"/></svg>',
}


def _inner(e: UIElement) -> str:
    text = html.escape(e.text)
    if e.style == "appicon":
        colour = _APP_COLOURS.get(e.text, "#5f6368")
        return f'<span class="dot" style="background:{colour}">{text[:1]}</span><span class="name">{text}</span>'
    if e.style.startswith("icon:"):
        return _ICONS.get(e.style.partition(":")[2], "")
    if e.is_checkable:
        on = " on" if e.is_checked else ""
        return f'<span class="label">{text}</span><span class="switch{on}"><span class="knob"></span></span>'
    if e.style in ("row", "row_caption"):
        return f'<span class="label">{text}</span>'
    return text


def _element_html(e: UIElement) -> str:
    x0, y0, x1, y1 = e.bbox
    box = f"left:{x0}px;top:{y0}px;width:{x1 - x0}px;height:{y1 - y0}px"
    classes = ["el", e.style.replace(":", "-") if e.style.startswith("icon:") else e.style]
    if e.style.startswith("icon:"):
        classes.append("icon")
    if e.interactive:
        classes.append("hit")
    key = html.escape(e.key, quote=True)
    if e.is_editable:
        focus = " autofocus" if e.is_focused else ""
        return (
            f'<input class="{" ".join(classes)} field" data-key="{key}" style="{box}" '
            f'value="{html.escape(e.text, quote=True)}" placeholder="{html.escape(e.hint_text, quote=True)}"{focus}>'
        )
    return f'<div class="{" ".join(classes)}" data-key="{key}" style="{box}">{_inner(e)}</div>'


def _body_html(screen: Screen) -> str:
    return "\n".join(_element_html(e) for e in screen.elements)


def screen_html(screen: Screen, page_id: str) -> str:
    """The HTML document for `screen`: elements in paint order, the shared stylesheet and event script inline."""
    css = (_HERE / "phone.css").read_text(encoding="utf-8")
    script = (_HERE / "phone.js").read_text(encoding="utf-8")
    body = _body_html(screen)
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(screen.title)}</title>'
        f'<style>{css}</style></head><body data-page="{page_id}">\n{body}\n<script>{script}</script></body></html>'
    )


_MAX_EVENT_BYTES = 64 * 1024
"""The largest input event body the phone server reads (an event is a few dozen bytes)."""


class _Handler(BaseHTTPRequestHandler):
    """Serves the phone pages and takes their input events.

    GET /screen/<page>: the full document of the page's current screen.
    GET /body/<page>?since=<version>: 204 if the phone is still at `version`, else the new screen's elements
    (the page swaps them in) with the new version in the X-Version header.
    POST /event/<page>: applies one input event (tap, long_press, set, enter, scroll).
    """

    host: BrowserHost  # set on the subclass made per server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet: one line per event is noise
        pass

    def _send_html(self, text: str, version: int) -> None:
        body = text.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Version", str(version))
        self.end_headers()
        self.wfile.write(body)

    def _foreign(self) -> bool:
        """Refuse (404) a request whose Host is not this server's own address.

        A page elsewhere that resolves its name to 127.0.0.1 (DNS rebinding) then cannot reach the phones.
        """
        if self.headers.get("Host") == f"127.0.0.1:{self.server.server_address[1]}":
            return False
        self.send_error(404)
        return True

    def do_GET(self) -> None:  # noqa: D102, N802
        if self._foreign():
            return
        path, _, query = self.path.partition("?")
        kind, _, page_id = path.strip("/").partition("/")
        phone = self.host.phones.get(page_id)
        if phone is None or kind not in ("screen", "body"):
            self.send_error(404)
            return
        version = phone.version
        if kind == "screen":
            self._send_html(screen_html(phone.screen(), page_id), version)
        elif query == f"since={version}":
            self.send_response(204)
            self.end_headers()
        else:
            self._send_html(_body_html(phone.screen()), version)

    def do_POST(self) -> None:  # noqa: D102, N802
        if self._foreign():
            return
        phone = self.host.phones.get(self.path.removeprefix("/event/"))
        length = self.headers.get("Content-Length") or "0"
        if not (length.isascii() and length.isdigit() and int(length) <= _MAX_EVENT_BYTES):
            self.send_error(413)  # an input event is a few dozen bytes
            return
        try:
            event = json.loads(self.rfile.read(int(length)) or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError):
            event = {}
        if phone is None or not isinstance(event, dict):
            self.send_error(404)
            return
        kind, key = event.get("type"), str(event.get("key", ""))
        if kind == "tap":
            phone.tap(key)
        elif kind == "long_press":
            phone.long_press(key)
        elif kind == "set":
            phone.set_field(key, str(event.get("value", "")))
        elif kind == "enter":
            phone.submit()
        elif kind == "scroll":
            phone.scroll_at(int(event.get("x", 0)), int(event.get("y", 0)), str(event.get("direction", "")))
        self.send_response(204)
        self.end_headers()


class BrowserHost(SharedResource):
    """One headless Chromium, one local HTTP server, many pages: the per-process resource of browser envs.

    Nothing starts until the first `open_page`; building a host is free, so runner pools may build one for every
    `gui` env, fast renderer included. A host is picklable (it travels as its settings and restarts lazily).

    Args:
        executable_path: the Chromium binary.
    """

    _default: ClassVar[BrowserHost | None] = None

    def __init__(self, executable_path: str = CHROMIUM):
        self.executable_path = executable_path
        self.phones: dict[str, Phone] = {}
        self._pages: dict[str, Any] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._playwright: Any = None
        self._browser: Any = None

    @classmethod
    def build(cls, **env_kwargs: Any) -> BrowserHost:
        """A new, not yet started host (the env kwargs do not matter: every browser env can share it)."""
        return cls()

    @classmethod
    def default(cls) -> BrowserHost:
        """The process-wide host that browser envs use when none is passed to them."""
        if cls._default is None:
            cls._default = cls()
        return cls._default

    def __getstate__(self) -> dict[str, Any]:
        return {"executable_path": self.executable_path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)

    @property
    def started(self) -> bool:
        """True once Chromium runs."""
        return self._browser is not None

    def _start(self) -> None:
        if self._browser is not None:
            return
        if not os.access(self.executable_path, os.X_OK):
            raise RuntimeError(
                f"the browser renderer needs Chromium at {self.executable_path}; install it with "
                "`apt-get install -y chromium` (Debian) or use renderer='fast'"
            )
        from playwright.sync_api import sync_playwright

        handler = type("Handler", (_Handler,), {"host": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="gui-phone-server", daemon=True).start()
        self._playwright = sync_playwright().start()
        self._browser = self._playwright.chromium.launch(
            executable_path=self.executable_path, headless=True, args=list(CHROMIUM_ARGS)
        )

    def open_page(self, phone: Phone) -> tuple[Any, str, str]:
        """A new browser page showing `phone`; returns (page, url, page_id)."""
        with self._lock:
            self._start()
            # Unguessable: another local process that finds the port cannot drive (or read) a running episode's
            # phone by counting page ids.
            page_id = f"p{next(self._ids)}-{secrets.token_urlsafe(16)}"
        self.phones[page_id] = phone
        page = self._browser.new_page(viewport={"width": WIDTH, "height": HEIGHT}, device_scale_factor=1)
        page.set_default_timeout(15_000)
        self._pages[page_id] = page
        url = f"http://127.0.0.1:{self._server.server_address[1]}/screen/{page_id}"
        return page, url, page_id

    def bind(self, page_id: str, phone: Phone) -> None:
        """Route the events of page `page_id` to `phone` from now on."""
        self.phones[page_id] = phone

    def close_page(self, page_id: str) -> None:
        """Close one page (its env is done)."""
        self.phones.pop(page_id, None)
        page = self._pages.pop(page_id, None)
        if page is not None:
            page.context.close()

    def close(self) -> None:
        """Stop Chromium, Playwright and the server."""
        for page_id in list(self._pages):
            self.close_page(page_id)
        if self._browser is not None:
            self._browser.close()
            self._playwright.stop()
            self._server.shutdown()
            self._server.server_close()
        self._browser = self._playwright = self._server = None
        if BrowserHost._default is self:
            BrowserHost._default = None


class BrowserRenderer(Renderer):
    """Drives a `Phone` through a page of a shared headless Chromium.

    Args:
        host: the `BrowserHost` whose browser opens this renderer's page.
    """

    def __init__(self, host: BrowserHost):
        # Imported now, not when the first page opens: a missing Playwright stops `make`, not the first episode.
        with needs_extra("the gui env's browser renderer"):
            import playwright.sync_api  # noqa: F401
        self.host = host
        self._page: Any = None
        self._url = ""
        self._page_id = ""
        self._shown = -1

    def attach(self, phone: Phone) -> None:  # noqa: D102
        super().attach(phone)
        if self._page is None:
            self._page, self._url, self._page_id = self.host.open_page(phone)
            self._page.goto(self._url)
            self._shown = phone.version
        else:
            self.host.bind(self._page_id, phone)
            self._shown = -1  # whatever the page shows belongs to the last episode: fetch the new screen
            self._settle()

    def _settle(self) -> None:
        """Wait until the page's events reached the phone, then show the new state if it moved."""
        self._shown = self._page.evaluate("v => window.__sync(v)", self._shown)

    def tap(self, x: int, y: int) -> None:  # noqa: D102
        self._page.mouse.click(x, y)
        self._settle()

    def long_press(self, x: int, y: int) -> None:  # noqa: D102
        self._page.mouse.click(x, y, delay=_LONG_PRESS_MS)
        self._settle()

    def type_text(self, text: str, clear: bool) -> None:  # noqa: D102
        keyboard = self._page.keyboard
        if clear:
            keyboard.press("Control+A")
            keyboard.press("Delete")
        else:
            keyboard.press("End")  # the tap may have put the caret mid-text; Android's adb typing appends
        if text:
            keyboard.insert_text(text)
        self._settle()

    def enter(self) -> None:  # noqa: D102
        self._page.keyboard.press("Enter")
        self._settle()

    def scroll(self, x: int, y: int, direction: str) -> None:  # noqa: D102
        dx, dy = {"down": (0, 400), "up": (0, -400), "right": (400, 0), "left": (-400, 0)}[direction]
        seen = self._page.evaluate("window.__seen")
        self._page.mouse.move(x, y)
        self._page.mouse.wheel(dx, dy)
        # Wheel input is delivered asynchronously: wait until the page has handled it before settling.
        self._page.wait_for_function("n => window.__seen > n", arg=seen)
        self._settle()

    def refresh(self) -> None:  # noqa: D102
        self._settle()

    def screenshot(self) -> Image.Image:  # noqa: D102
        png = self._page.screenshot(type="png")
        return Image.open(io.BytesIO(png)).convert("RGB")

    def close(self) -> None:  # noqa: D102
        if self._page is not None:
            self.host.close_page(self._page_id)
            self._page = None
