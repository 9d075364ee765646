"""The apps as state machines: one layout function per screen (state -> `Screen`) and one tap handler per screen.

A screen is named by its route's ``(app, page)``. Its layout function draws the element tree for the current
`PhoneState`; its tap handler maps the `key` of the tapped element to a new `PhoneState`. System gestures (back,
home, scroll, typing, keyboard enter, long press) are handled here too, so the two renderers only ever have to
say *which element* received *which event*; everything else is shared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from .state import APPS, SETTINGS, Alarm, Contact, Message, PhoneState, Route, Thread, digits
from .ui import CONTENT_TOP, NAV_TOP, ROW_HEIGHT, STATUS_BAR, VISIBLE_ROWS, WIDTH, Screen, UIElement

__all__ = ["layout", "tap", "long_press", "set_field", "submit", "scroll", "back", "home", "open_app"]

_TEXT = "android.widget.TextView"
_BUTTON = "android.widget.Button"
_IMAGE_BUTTON = "android.widget.ImageButton"
_SWITCH = "android.widget.Switch"
_EDIT = "android.widget.EditText"
_LIST = "androidx.recyclerview.widget.RecyclerView"
_FRAME = "android.widget.FrameLayout"
_SCROLL_STEP = VISIBLE_ROWS - 1  # one row of overlap, like a real fling, so nothing is skipped

Layout = Callable[[PhoneState], tuple[str, list[UIElement], tuple[str, ...], int, int]]


def _package(app: str) -> str:
    return "com.android.launcher3" if app == "home" else f"com.mock.{app}"


# ---------------------------------------------------------------- building blocks


def _chrome(app: str, title: str, action: UIElement | None = None) -> list[UIElement]:
    """Status bar and app bar (title plus an optional action icon on the right)."""
    pkg = _package(app)
    out = [UIElement("status_bar", _FRAME, (0, 0, WIDTH, STATUS_BAR), text="12:00", package_name=pkg, style="status")]
    if app != "home":
        out.append(UIElement("app_bar", _TEXT, (0, STATUS_BAR, WIDTH, CONTENT_TOP), text=title, package_name=pkg,
                             style="appbar"))  # fmt: skip
    if action is not None:
        out.append(action)
    return out


def _nav_bar(app: str) -> list[UIElement]:
    """The system navigation bar: Back and Home are ordinary tappable elements on every screen."""
    pkg = "com.android.systemui"
    return [
        UIElement("nav_bar", _FRAME, (0, NAV_TOP, WIDTH, 800), package_name=pkg, style="navbar"),
        UIElement(
            "nav:back",
            _IMAGE_BUTTON,
            (60, NAV_TOP, 150, 800),
            content_description="Back",
            is_clickable=True,
            package_name=pkg,
            style="icon:back",
        ),  # fmt: skip
        UIElement(
            "nav:home",
            _IMAGE_BUTTON,
            (210, NAV_TOP, 300, 800),
            content_description="Home",
            is_clickable=True,
            package_name=pkg,
            style="icon:home",
        ),  # fmt: skip
    ]


def _action_icon(app: str, key: str, description: str) -> UIElement:
    return UIElement(key, _IMAGE_BUTTON, (WIDTH - 56, STATUS_BAR, WIDTH, CONTENT_TOP), content_description=description,
                     is_clickable=True, package_name=_package(app), style="icon:plus")  # fmt: skip


def _rows(app: str, route: Route, rows: list[list[UIElement]], keys: tuple[str, ...]):
    """Place list rows (each a group of elements laid out at y=0) under the app bar, honouring the scroll.

    Returns (elements, clamped scroll, max scroll): the list container first, then the visible rows.
    """
    max_scroll = max(0, len(rows) - VISIBLE_ROWS)
    start = min(route.scroll, max_scroll)
    container = UIElement("list", _LIST, (0, CONTENT_TOP, WIDTH, NAV_TOP), is_scrollable=max_scroll > 0,
                          package_name=_package(app), style="list")  # fmt: skip
    out = [container]
    for slot, group in enumerate(rows[start : start + VISIBLE_ROWS]):
        dy = CONTENT_TOP + slot * ROW_HEIGHT
        for e in group:
            x0, y0, x1, y1 = e.bbox
            out.append(replace(e, bbox=(x0, y0 + dy, x1, y1 + dy)))
    return out, start, max_scroll


def _row(app: str, key: str, text: str, *, cls: str = _TEXT, checked: bool | None = None, long: bool = False,
         caption: str = "", caption_key: str = "") -> list[UIElement]:  # fmt: skip
    """A full-width list row; a switch row when `checked` is given; an optional caption line under the text."""
    pkg = _package(app)
    row = UIElement(key, _SWITCH if checked is not None else cls, (0, 0, WIDTH, ROW_HEIGHT), text=text,
                    is_clickable=True, is_long_clickable=long, is_checkable=checked is not None,
                    is_checked=bool(checked), package_name=pkg, style="row_caption" if caption else "row")  # fmt: skip
    out = [row]
    if caption:
        out.append(UIElement(caption_key, _TEXT, (16, 36, WIDTH - 16, ROW_HEIGHT - 4), text=caption, package_name=pkg,
                             style="caption"))  # fmt: skip
    return out


def _field(app: str, route: Route, key: str, hint: str, bbox: tuple[int, int, int, int]) -> UIElement:
    return UIElement(key, _EDIT, bbox, text=route.field(key), hint_text=hint, is_clickable=True, is_editable=True,
                     is_focused=route.focused == key, package_name=_package(app), style="field")  # fmt: skip


def _button(app: str, key: str, text: str, bbox: tuple[int, int, int, int]) -> UIElement:
    return UIElement(key, _BUTTON, bbox, text=text, is_clickable=True, package_name=_package(app), style="button")


def _label(app: str, key: str, text: str, bbox: tuple[int, int, int, int], style: str = "label") -> UIElement:
    return UIElement(key, _TEXT, bbox, text=text, package_name=_package(app), style=style)


def _form(app: str, title: str, route: Route, fields: list[tuple[str, str]]) -> list[UIElement]:
    out = _chrome(app, title)
    y = CONTENT_TOP + 24
    for key, hint in fields:
        out.append(_field(app, route, key, hint, (16, y, WIDTH - 16, y + 52)))
        y += 72
    out.append(_button(app, "form:save", "Save", (WIDTH - 136, y, WIDTH - 16, y + 48)))
    if route.error:
        out.append(_label(app, "form:error", route.error, (16, y + 64, WIDTH - 16, y + 96), style="error"))
    return out


# ---------------------------------------------------------------- layouts


def _home(state: PhoneState):
    out = _chrome("home", "")
    out.append(UIElement("wallpaper", _FRAME, (0, STATUS_BAR, WIDTH, NAV_TOP), package_name=_package("home"),
                         style="wallpaper"))  # fmt: skip
    out.append(_label("home", "home:clock", "12:00", (0, 72, WIDTH, 152), style="bigclock"))
    for i, app in enumerate(APPS):
        col, line = i % 4, i // 4
        x = 12 + col * 84
        y = 200 + line * 108
        out.append(UIElement(f"open:{app.lower()}", _TEXT, (x, y, x + 84, y + 100), text=app, content_description=app,
                             is_clickable=True, package_name=_package("home"), style="appicon"))  # fmt: skip
    return "Home screen", out, (), 0, 0


def _settings_main(state: PhoneState):
    keys = tuple(f"section:{s}" for s in SETTINGS)
    rows = [_row("settings", f"section:{s}", s) for s in SETTINGS]
    body, scroll, max_scroll = _rows("settings", state.route, rows, keys)
    return "Settings", _chrome("settings", "Settings") + body, keys, scroll, max_scroll


def _settings_section(state: PhoneState):
    section = state.route.arg
    toggles = SETTINGS.get(section, ())
    keys = tuple(f"toggle:{t}" for t in toggles)
    rows = [_row("settings", f"toggle:{t}", t, checked=t in state.toggles_on) for t in toggles]
    body, scroll, max_scroll = _rows("settings", state.route, rows, keys)
    return f"Settings > {section}", _chrome("settings", section) + body, keys, scroll, max_scroll


def _contacts_main(state: PhoneState):
    keys = tuple(f"contact:{c.name}" for c in state.contacts)
    rows = [_row("contacts", f"contact:{c.name}", c.name, long=True) for c in state.contacts]
    body, scroll, max_scroll = _rows("contacts", state.route, rows, keys)
    head = _chrome("contacts", "Contacts", _action_icon("contacts", "contacts:add", "Create contact"))
    return "Contacts", head + body, keys, scroll, max_scroll


def _contacts_detail(state: PhoneState):
    name = state.route.arg
    contact = state.contact(name)
    out = _chrome("contacts", name)
    if contact is not None:
        out.append(_label("contacts", "detail:name", contact.name, (16, 104, WIDTH - 16, 144), style="title"))
        out.append(_label("contacts", "detail:phone", contact.phone, (16, 152, WIDTH - 16, 184)))
        out.append(_button("contacts", "detail:message", "Message", (16, 208, 176, 256)))
    return f"Contacts > {name}", out, (), 0, 0


def _contacts_menu(state: PhoneState):
    name = state.route.arg
    out = _chrome("contacts", "Contacts")
    out.append(UIElement("menu:dialog", _FRAME, (32, 280, WIDTH - 32, 480), package_name=_package("contacts"),
                         style="dialog"))  # fmt: skip
    out.append(_label("contacts", "menu:title", name, (48, 296, WIDTH - 48, 336), style="title"))
    out.append(_button("contacts", "menu:delete", "Delete", (48, 352, WIDTH - 48, 400)))
    out.append(_button("contacts", "menu:cancel", "Cancel", (48, 416, WIDTH - 48, 464)))
    return f"Contacts > {name} (menu)", out, (), 0, 0


def _contacts_new(state: PhoneState):
    out = _form("contacts", "Create contact", state.route, [("field:name", "Name"), ("field:phone", "Phone")])
    return "Contacts > Create contact", out, (), 0, 0


def _messages_main(state: PhoneState):
    keys = tuple(f"thread:{t.contact}" for t in state.threads)
    rows = [
        _row(
            "messages",
            f"thread:{t.contact}",
            t.contact,
            caption=t.messages[-1].text if t.messages else "",
            caption_key=f"preview:{t.contact}",
        )  # fmt: skip
        for t in state.threads
    ]
    body, scroll, max_scroll = _rows("messages", state.route, rows, keys)
    return "Messages", _chrome("messages", "Messages") + body, keys, scroll, max_scroll


def _messages_thread(state: PhoneState):
    name = state.route.arg
    thread = state.thread(name)
    out = _chrome("messages", name)
    messages = thread.messages[-10:] if thread else ()
    y = CONTENT_TOP + 8
    for i, message in enumerate(messages):
        x0, x1 = (96, WIDTH - 12) if message.outgoing else (12, WIDTH - 96)
        style = "bubble_out" if message.outgoing else "bubble_in"
        out.append(_label("messages", f"message:{i}", message.text, (x0, y, x1, y + 44), style=style))
        y += 52
    out.append(_field("messages", state.route, "field:message", "Type a message", (8, NAV_TOP - 60, WIDTH - 64,
                                                                                   NAV_TOP - 8)))  # fmt: skip
    out.append(UIElement("thread:send", _IMAGE_BUTTON, (WIDTH - 60, NAV_TOP - 60, WIDTH - 8, NAV_TOP - 8),
                         content_description="Send", is_clickable=True, package_name=_package("messages"),
                         style="icon:send"))  # fmt: skip
    return f"Messages > {name}", out, (), 0, 0


def _clock_main(state: PhoneState):
    keys = tuple(f"alarm:{a.label}" for a in state.alarms)
    rows = [_row("clock", f"alarm:{a.label}", a.label, checked=a.enabled) for a in state.alarms]
    body, scroll, max_scroll = _rows("clock", state.route, rows, keys)
    head = _chrome("clock", "Alarms", _action_icon("clock", "clock:add", "Add alarm"))
    return "Clock > Alarms", head + body, keys, scroll, max_scroll


def _clock_new(state: PhoneState):
    out = _form("clock", "New alarm", state.route, [("field:hour", "Hour (0-23)"), ("field:minute", "Minute (0-59)")])
    return "Clock > New alarm", out, (), 0, 0


def _shop_main(state: PhoneState):
    categories = tuple(dict.fromkeys(p.category for p in state.products))
    keys = tuple(f"category:{c}" for c in categories)
    rows = [_row("shop", f"category:{c}", c) for c in categories]
    body, scroll, max_scroll = _rows("shop", state.route, rows, keys)
    return "Shop", _chrome("shop", "Shop") + body, keys, scroll, max_scroll


def _shop_category(state: PhoneState):
    category = state.route.arg
    products = state.category(category)
    keys = tuple(f"product:{p.id}" for p in products)
    rows = [_row("shop", f"product:{p.id}", p.name, caption=p.price, caption_key=f"price:{p.id}") for p in products]
    body, scroll, max_scroll = _rows("shop", state.route, rows, keys)
    return f"Shop > {category}", _chrome("shop", category) + body, keys, scroll, max_scroll


def _shop_product(state: PhoneState):
    product = state.product(state.route.arg)
    out = _chrome("shop", "Product")
    if product is not None:
        out.append(_label("shop", "product:name", product.name, (16, 104, WIDTH - 16, 144), style="title"))
        out.append(_label("shop", "product:price", product.price, (16, 152, WIDTH - 16, 184)))
        out.append(_label("shop", "product:about", f"In {product.category}. Ships in 2 days.", (16, 192, WIDTH - 16,
                                                                                                   224)))  # fmt: skip
        out.append(_button("shop", "product:buy", "Buy now", (16, 248, WIDTH - 16, 296)))
    return f"Shop > {product.name if product else 'Product'}", out, (), 0, 0


def _shop_confirmed(state: PhoneState):
    product = state.product(state.route.arg)
    out = _chrome("shop", "Order placed")
    out.append(_label("shop", "order:title", "Thank you for your order!", (16, 104, WIDTH - 16, 144), style="title"))
    out.append(_label("shop", "order:item", product.name if product else "", (16, 152, WIDTH - 16, 184)))
    out.append(_button("shop", "order:done", "Continue shopping", (16, 208, WIDTH - 16, 256)))
    return "Shop > Order placed", out, (), 0, 0


_LAYOUTS: dict[tuple[str, str], Layout] = {
    ("home", "main"): _home,
    ("settings", "main"): _settings_main,
    ("settings", "section"): _settings_section,
    ("contacts", "main"): _contacts_main,
    ("contacts", "detail"): _contacts_detail,
    ("contacts", "menu"): _contacts_menu,
    ("contacts", "new"): _contacts_new,
    ("messages", "main"): _messages_main,
    ("messages", "thread"): _messages_thread,
    ("clock", "main"): _clock_main,
    ("clock", "new"): _clock_new,
    ("shop", "main"): _shop_main,
    ("shop", "category"): _shop_category,
    ("shop", "product"): _shop_product,
    ("shop", "confirmed"): _shop_confirmed,
}


def layout(state: PhoneState) -> Screen:
    """The element tree of the screen on display, in paint order (status bar first, navigation bar last)."""
    route = state.route
    title, elements, keys, scroll, max_scroll = _LAYOUTS[(route.app, route.page)](state)
    elements = elements + _nav_bar(route.app)
    return Screen(title=title, elements=tuple(elements), list_keys=keys, scroll=scroll, max_scroll=max_scroll)


# ---------------------------------------------------------------- transitions


def _push(state: PhoneState, route: Route) -> PhoneState:
    return replace(state, stack=state.stack + (route,))


def back(state: PhoneState) -> PhoneState:
    """System back: drop focus first if a field has it (the keyboard closes), else pop the back stack."""
    if state.route.focused:
        return state.with_route(replace(state.route, focused=""))
    if len(state.stack) == 1:
        return state
    return replace(state, stack=state.stack[:-1])


def home(state: PhoneState) -> PhoneState:
    """System home: back to the launcher; the apps forget their screens (a cold start next time)."""
    return replace(state, stack=(Route("home"),))


def open_app(state: PhoneState, name: str) -> PhoneState | None:
    """Launch app `name` (any case) on its main screen; None when no such app is installed."""
    match = next((a for a in APPS if a.lower() == name.strip().lower()), None)
    if match is None:
        return None
    return replace(state, stack=(Route("home"), Route(match.lower())))


def _toggle(state: PhoneState, name: str) -> PhoneState:
    on = state.toggles_on - {name} if name in state.toggles_on else state.toggles_on | {name}
    return replace(state, toggles_on=on)


def _send(state: PhoneState) -> PhoneState:
    route = state.route
    text = route.field("field:message").strip()
    if not text:
        return state
    old = state.thread(route.arg) or Thread(contact=route.arg, messages=())
    new = Thread(contact=route.arg, messages=old.messages + (Message(text=text, outgoing=True),))
    threads = (new,) + tuple(t for t in state.threads if t.contact != route.arg)
    return replace(state, threads=threads).with_route(route.with_field("field:message", ""))


def _save_contact(state: PhoneState) -> PhoneState:
    route = state.route
    name, phone = route.field("field:name").strip(), route.field("field:phone").strip()
    if not name or not digits(phone):
        return state.with_route(replace(route, error="A name and a phone number are required."))
    contacts = tuple(sorted(state.contacts + (Contact(name=name, phone=phone),), key=lambda c: c.name))
    return replace(state, contacts=contacts, stack=state.stack[:-1])


def _save_alarm(state: PhoneState) -> PhoneState:
    route = state.route
    hour, minute = route.field("field:hour").strip(), route.field("field:minute").strip()
    if not (hour.isdigit() and minute.isdigit() and int(hour) < 24 and int(minute) < 60):
        return state.with_route(replace(route, error="Enter an hour 0-23 and a minute 0-59."))
    others = tuple(a for a in state.alarms if (a.hour, a.minute) != (int(hour), int(minute)))
    alarms = tuple(sorted(others + (Alarm(int(hour), int(minute), True),), key=lambda a: (a.hour, a.minute)))
    return replace(state, alarms=alarms, stack=state.stack[:-1])


def _tap_page(state: PhoneState, key: str) -> PhoneState:
    route = state.route
    kind, _, arg = key.partition(":")
    page = (route.app, route.page)
    if page == ("home", "main") and kind == "open":
        return open_app(state, arg) or state
    if page == ("settings", "main") and kind == "section":
        return _push(state, Route("settings", "section", arg))
    if page == ("settings", "section") and kind == "toggle":
        return _toggle(state, arg)
    if page == ("contacts", "main") and key == "contacts:add":
        return _push(state, Route("contacts", "new"))
    if page == ("contacts", "main") and kind == "contact":
        return _push(state, Route("contacts", "detail", arg))
    if page == ("contacts", "detail") and key == "detail:message":
        return _push(state, Route("messages", "thread", route.arg))
    if page == ("contacts", "menu") and key == "menu:delete":
        contacts = tuple(c for c in state.contacts if c.name != route.arg)
        return replace(state, contacts=contacts, stack=state.stack[:-1])
    if page == ("contacts", "menu") and key == "menu:cancel":
        return replace(state, stack=state.stack[:-1])
    if page in (("contacts", "new"), ("clock", "new")) and key == "form:save":
        return _save_contact(state) if route.app == "contacts" else _save_alarm(state)
    if page == ("messages", "main") and kind == "thread":
        return _push(state, Route("messages", "thread", arg))
    if page == ("messages", "thread") and key == "thread:send":
        return _send(state)
    if page == ("clock", "main") and key == "clock:add":
        return _push(state, Route("clock", "new"))
    if page == ("clock", "main") and kind == "alarm":
        alarms = tuple(replace(a, enabled=not a.enabled) if a.label == arg else a for a in state.alarms)
        return replace(state, alarms=alarms)
    if page == ("shop", "main") and kind == "category":
        return _push(state, Route("shop", "category", arg))
    if page == ("shop", "category") and kind == "product":
        return _push(state, Route("shop", "product", arg))
    if page == ("shop", "product") and key == "product:buy":
        return replace(state, orders=state.orders + (route.arg,)).with_route(Route("shop", "confirmed", route.arg))
    if page == ("shop", "confirmed") and key == "order:done":
        return replace(state, stack=(Route("home"), Route("shop")))
    return state


def tap(state: PhoneState, key: str) -> PhoneState:
    """A tap on the element named `key` of the screen on display."""
    if key == "nav:back":
        return back(state)
    if key == "nav:home":
        return home(state)
    route = state.route
    if key.startswith("field:"):
        return state.with_route(replace(route, focused=key))
    # Tapping anything else takes the focus away from a text field, as in a browser.
    return _tap_page(state.with_route(replace(route, focused="")), key)


def long_press(state: PhoneState, key: str) -> PhoneState:
    """A long press on `key`: opens the contact menu on a contact row; elsewhere it does nothing."""
    route = state.route
    if (route.app, route.page) == ("contacts", "main") and key.startswith("contact:"):
        return _push(state, Route("contacts", "menu", key.partition(":")[2]))
    return state


def set_field(state: PhoneState, key: str, value: str) -> PhoneState:
    """The text field `key` now holds `value` (and has the focus)."""
    route = state.route
    if not key.startswith("field:"):
        return state
    return state.with_route(replace(route.with_field(key, value), focused=key))


def submit(state: PhoneState) -> PhoneState:
    """The keyboard's Enter key: sends a message from the message field; in other fields it does nothing."""
    route = state.route
    if (route.app, route.page) == ("messages", "thread") and route.focused == "field:message":
        return _send(state)
    return state


def scroll(state: PhoneState, direction: str) -> PhoneState:
    """Scroll the list on screen: ``"down"`` shows rows further down, ``"up"`` rows above; others do nothing."""
    screen = layout(state)
    if screen.max_scroll == 0 or direction not in ("up", "down"):
        return state
    step = _SCROLL_STEP if direction == "down" else -_SCROLL_STEP
    new = min(max(screen.scroll + step, 0), screen.max_scroll)
    return state.with_route(replace(state.route, scroll=new))
