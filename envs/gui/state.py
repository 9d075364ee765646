"""Typed, immutable state of the mocked phone: app data, the navigation stack, and a seeded world generator.

Every transition returns a new `PhoneState` (`dataclasses.replace`), so a state can be kept, compared and checked
without copies going stale. Task success is a predicate on this state, never on pixels.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

__all__ = [
    "SETTINGS",
    "APPS",
    "SHOP_CATALOGUE",
    "Contact",
    "Message",
    "Thread",
    "Alarm",
    "Product",
    "Route",
    "PhoneState",
    "generate_world",
    "digits",
]

SETTINGS: dict[str, tuple[str, ...]] = {
    "Network & internet": ("Wi-Fi", "Mobile data", "Airplane mode", "Hotspot"),
    "Connected devices": ("Bluetooth", "NFC"),
    "Apps": ("Auto-update apps",),
    "Notifications": ("Do not disturb", "Notification dot"),
    "Battery": ("Battery saver", "Adaptive battery"),
    "Storage": ("Storage manager",),
    "Sound & vibration": ("Vibrate for calls", "Touch sounds"),
    "Display": ("Dark theme", "Auto-rotate screen", "Adaptive brightness"),
    "Accessibility": ("Large text", "Color inversion"),
    "Security": ("Screen lock",),
    "Location": ("Use location",),
    "System": ("Automatic updates",),
}
"""Settings sections in screen order, each with its toggles. Twelve rows: the last ones need a scroll."""

APPS: tuple[str, ...] = ("Settings", "Contacts", "Messages", "Clock", "Shop")
"""The apps on the home screen, in icon order."""

_FIRST_NAMES = (
    "Alice", "Bob", "Carol", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kira", "Liam",
    "Maya", "Noah", "Olga", "Pablo", "Quinn", "Rosa", "Sami", "Tara", "Umar", "Vera", "Wen", "Yusuf",
)  # fmt: skip
_LAST_NAMES = ("Moreau", "Lee", "Okafor", "Schmidt", "Rossi", "Tanaka", "Silva", "Novak", "Haddad", "Berg")
_CHAT_LINES = (
    "Are we still on for lunch?", "Thanks for yesterday!", "Call me when you can.", "Running 10 min late.",
    "Did you see the game?", "Happy birthday!", "Can you send the photos?", "Sounds good.",
)  # fmt: skip
SHOP_CATALOGUE: dict[str, tuple[str, ...]] = {
    "Headphones": (
        "Aurora",
        "Pulse",
        "Echo",
        "Nimbus",
        "Drift",
        "Vertex",
        "Halo",
        "Quartz",
        "Zephyr",
        "Orbit",
        "Sonar",
    ),
    "Chargers": ("Volt", "Spark", "Flux", "Amp", "Charge", "Surge", "Boost", "Watt", "Ion", "Current", "Dynamo"),
    "Phone cases": ("Shell", "Armor", "Slim", "Clear", "Rugged", "Leather", "Wave", "Grip", "Frost", "Carbon"),
    "Backpacks": ("Trail", "Metro", "Summit", "Voyager", "Scout", "Atlas", "Nomad", "Ridge", "Canyon", "Harbor"),
    "Desk lamps": ("Lumen", "Beam", "Glow", "Arc", "Flare", "Prism", "Ray", "Nova", "Dawn", "Ember", "Lux"),
}
"""Shop categories and the model names drawn for their products (10-11 each: more than a screen)."""
_CATEGORY_NOUN = {
    "Headphones": "headphones",
    "Chargers": "charger",
    "Phone cases": "phone case",
    "Backpacks": "backpack",
    "Desk lamps": "desk lamp",
}


def digits(text: str) -> str:
    """Only the digits of `text`: phone numbers compare equal whatever their punctuation."""
    return "".join(ch for ch in text if ch.isdigit())


@dataclass(frozen=True)
class Contact:
    """An address-book entry."""

    name: str
    phone: str


@dataclass(frozen=True)
class Message:
    """One SMS in a thread; `outgoing` is True for messages the phone's owner sent."""

    text: str
    outgoing: bool


@dataclass(frozen=True)
class Thread:
    """A conversation with one contact, oldest message first."""

    contact: str
    messages: tuple[Message, ...]


@dataclass(frozen=True)
class Alarm:
    """A Clock alarm at hour:minute (24 h)."""

    hour: int
    minute: int
    enabled: bool

    @property
    def label(self) -> str:
        """``"07:30"``."""
        return f"{self.hour:02d}:{self.minute:02d}"


@dataclass(frozen=True)
class Product:
    """A Shop item; `id` is stable, prices are unique within a category so "cheapest" is unambiguous."""

    id: str
    name: str
    category: str
    price_cents: int

    @property
    def price(self) -> str:
        """``"$12.99"``."""
        return f"${self.price_cents // 100}.{self.price_cents % 100:02d}"

    @property
    def noun(self) -> str:
        """The category as a singular noun for task text ("desk lamp")."""
        return _CATEGORY_NOUN[self.category]


@dataclass(frozen=True)
class Route:
    """One screen on the back stack: which app and page, its argument, list scroll, and form contents.

    Attributes:
        app: ``"home"`` or a name from `APPS` in lower case.
        page: the app's page, e.g. ``"main"``, ``"section"``, ``"thread"``.
        arg: what the page shows (a section, a contact, a product id).
        scroll: index of the first visible list row.
        fields: text field contents as (key, value) pairs.
        focused: key of the focused text field, or "".
        error: a validation message the page shows (e.g. a form saved with an empty name).
    """

    app: str
    page: str = "main"
    arg: str = ""
    scroll: int = 0
    fields: tuple[tuple[str, str], ...] = ()
    focused: str = ""
    error: str = ""

    def field(self, key: str) -> str:
        """Current content of text field `key` ("" when untouched)."""
        return dict(self.fields).get(key, "")

    def with_field(self, key: str, value: str) -> Route:
        """This route with text field `key` set to `value`."""
        values = dict(self.fields)
        values[key] = value
        return replace(self, fields=tuple(sorted(values.items())))


@dataclass(frozen=True)
class PhoneState:
    """Everything the phone knows. `stack[-1]` is the screen on display; `stack[0]` is always home.

    Attributes:
        toggles_on: names of the Settings toggles that are on.
        contacts: address book, sorted by name.
        threads: message threads, most recent first.
        alarms: Clock alarms, sorted by time.
        products: the Shop catalogue.
        orders: ids of purchased products, in order.
        stack: navigation back stack.
    """

    toggles_on: frozenset[str]
    contacts: tuple[Contact, ...]
    threads: tuple[Thread, ...]
    alarms: tuple[Alarm, ...]
    products: tuple[Product, ...]
    orders: tuple[str, ...] = ()
    stack: tuple[Route, ...] = (Route("home"),)

    @property
    def route(self) -> Route:
        """The screen on display."""
        return self.stack[-1]

    def with_route(self, route: Route) -> PhoneState:
        """This state with the top of the stack replaced by `route`."""
        return replace(self, stack=self.stack[:-1] + (route,))

    def contact(self, name: str) -> Contact | None:
        """The contact called `name`, if any."""
        return next((c for c in self.contacts if c.name == name), None)

    def thread(self, name: str) -> Thread | None:
        """The thread with contact `name`, if any."""
        return next((t for t in self.threads if t.contact == name), None)

    def product(self, product_id: str) -> Product | None:
        """The product with id `product_id`, if any."""
        return next((p for p in self.products if p.id == product_id), None)

    def category(self, category: str) -> tuple[Product, ...]:
        """The products of `category` in catalogue order."""
        return tuple(p for p in self.products if p.category == category)


def generate_world(rng: np.random.Generator) -> PhoneState:
    """Draw a phone's contents: 12-15 contacts, 8-10 threads, 2-4 alarms, random toggles, a priced catalogue."""
    all_toggles = [t for toggles in SETTINGS.values() for t in toggles]
    toggles_on = frozenset(t for t in all_toggles if rng.random() < 0.5)

    n_contacts = int(rng.integers(12, 16))
    firsts = rng.choice(len(_FIRST_NAMES), size=n_contacts, replace=False)
    contacts = tuple(
        sorted(
            (
                Contact(
                    name=f"{_FIRST_NAMES[i]} {_LAST_NAMES[int(rng.integers(len(_LAST_NAMES)))]}",
                    phone=f"555-{int(rng.integers(100, 1000)):03d}-{int(rng.integers(0, 10000)):04d}",
                )
                for i in firsts
            ),
            key=lambda c: c.name,
        )
    )

    n_threads = int(rng.integers(8, 11))
    thread_people = rng.choice(len(contacts), size=n_threads, replace=False)
    threads = tuple(
        Thread(
            contact=contacts[int(i)].name,
            messages=tuple(
                Message(text=_CHAT_LINES[int(rng.integers(len(_CHAT_LINES)))], outgoing=bool(rng.random() < 0.5))
                for _ in range(int(rng.integers(1, 4)))
            ),
        )
        for i in thread_people
    )

    n_alarms = int(rng.integers(2, 5))
    times = sorted({(int(rng.integers(5, 11)), int(rng.choice([0, 15, 30, 45]))) for _ in range(n_alarms)})
    alarms = tuple(Alarm(hour=h, minute=m, enabled=bool(rng.random() < 0.5)) for h, m in times)
    if not any(a.enabled for a in alarms):  # "turn off the ... alarm" needs one that is on
        alarms = (replace(alarms[0], enabled=True),) + alarms[1:]

    products: list[Product] = []
    for category, models in SHOP_CATALOGUE.items():
        # Distinct prices within a category keep "the cheapest" a single product.
        prices = rng.choice(np.arange(999, 9999, 100), size=len(models), replace=False)
        order = rng.permutation(len(models))
        for j in order:
            name = f"{models[int(j)]} {_CATEGORY_NOUN[category].title()}"
            products.append(
                Product(id=f"p{len(products):02d}", name=name, category=category, price_cents=int(prices[j]))
            )

    return PhoneState(
        toggles_on=toggles_on,
        contacts=contacts,
        threads=threads,
        alarms=alarms,
        products=tuple(products),
    )
