"""Task templates: how a task is drawn from a phone's contents, its success check on the final state, its expert.

Each template is a `Task` subclass (a frozen dataclass) with three methods: `instruction` (the text the agent
reads), `check(state, answer)` (success, on app state only) and `expert(state, screen)` (a gold next action
string, computed from the current screen so that it also recovers from wherever the agent left the phone).

| task_type        | instruction                                     | needs                        |
|------------------|-------------------------------------------------|------------------------------|
| toggle_setting   | Turn on Wi-Fi.                                  | navigation, maybe scrolling  |
| send_message     | Send the message "see you at 5" to Alice Lee.   | navigation, scrolling, typing|
| add_contact      | Add a contact named ... with phone number ...   | typing, form                 |
| delete_contact   | Delete the contact ...                          | long press, scrolling        |
| set_alarm        | Set an alarm for 07:30.                         | typing, form                 |
| disable_alarm    | Turn off the 06:45 alarm.                       | navigation                   |
| buy_cheapest     | Buy the cheapest desk lamp in the Shop app.     | scrolling, comparing prices  |
| contact_phone    | What is Carol Rossi's phone number?             | scrolling, answer            |
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .state import SETTINGS, SHOP_CATALOGUE, PhoneState, digits
from .ui import Screen

__all__ = ["Task", "TASK_TYPES", "check_task", "sample_task"]

_MESSAGES = (
    "see you at 5", "on my way", "running late, sorry", "call me back please", "happy birthday!",
    "dinner at 8?", "thanks a lot", "I will bring the cake",
)  # fmt: skip
_NEW_NAMES = ("Zoe Park", "Xavier Cole", "Nadia Petrov", "Oscar Wilde", "Lena Fischer", "Tomás Ruiz", "Ada Byron")


def _act(action_type: str, **fields: object) -> str:
    return json.dumps({"action_type": action_type, **fields}, ensure_ascii=False)


def _click(screen: Screen, key: str, *, long: bool = False) -> str:
    """Tap (or long-press) `key` if it is on screen, else scroll its list toward it."""
    index = screen.index_of(key)
    if index is not None:
        return _act("long_press" if long else "click", index=index)
    if key in screen.list_keys:
        position = screen.list_keys.index(key)
        return _act("scroll", direction="up" if position < screen.scroll else "down")
    raise RuntimeError(f"expert: {key!r} is neither on screen nor in its list ({screen.title})")


def _go(state: PhoneState, screen: Screen, app: str) -> str:
    """One step toward app `app`'s main screen from anywhere: back out of its inner pages, else home, then launch."""
    route = state.route
    if route.app == app:
        return _act("navigate_back")
    if route.app != "home":
        return _act("navigate_home")
    return _click(screen, f"open:{app}")


def _fill(state: PhoneState, screen: Screen, wanted: dict[str, str]) -> str:
    """Type into the first field of a form whose content is wrong, then tap Save."""
    for key, value in wanted.items():
        if state.route.field(key) != value:
            return _act("input_text", text=value, index=screen.index_of(key), clear_text=True)
    return _click(screen, "form:save")


@dataclass(frozen=True)
class Task:
    """A task template instance. Subclasses set `task_type` and implement the three methods."""

    task_type: ClassVar[str] = ""
    asks_question: ClassVar[bool] = False

    def instruction(self) -> str:
        """The goal as the agent reads it."""
        raise NotImplementedError

    def check(self, state: PhoneState, answer: str | None) -> bool:
        """True when the final `state` (and `answer`, for questions) fulfils the task."""
        raise NotImplementedError

    def expert(self, state: PhoneState, screen: Screen) -> str:
        """A gold next action (AndroidWorld JSON) from `state`, whose screen is `screen`."""
        if self.check(state, None):
            return _act("status", goal_status="complete")
        return self._next(state, screen)

    def _next(self, state: PhoneState, screen: Screen) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class ToggleSetting(Task):
    """Set a Settings toggle; the section must be found (the last sections need a scroll)."""

    task_type: ClassVar[str] = "toggle_setting"
    section: str
    toggle: str
    on: bool

    def instruction(self) -> str:  # noqa: D102
        return f"Turn {'on' if self.on else 'off'} {self.toggle}."

    def check(self, state: PhoneState, answer: str | None) -> bool:  # noqa: D102
        return (self.toggle in state.toggles_on) == self.on

    def _next(self, state: PhoneState, screen: Screen) -> str:
        route = state.route
        if (route.app, route.page, route.arg) == ("settings", "section", self.section):
            return _click(screen, f"toggle:{self.toggle}")
        if (route.app, route.page) == ("settings", "main"):
            return _click(screen, f"section:{self.section}")
        return _go(state, screen, "settings")


@dataclass(frozen=True)
class SendMessage(Task):
    """Send an exact text to a contact who already has a thread."""

    task_type: ClassVar[str] = "send_message"
    contact: str
    text: str
    sent_before: int

    def instruction(self) -> str:  # noqa: D102
        return f'Send the message "{self.text}" to {self.contact}.'

    def check(self, state: PhoneState, answer: str | None) -> bool:  # noqa: D102
        thread = state.thread(self.contact)
        sent = [m.text for m in thread.messages if m.outgoing] if thread else []
        return len(sent) > self.sent_before and sent[-1].strip().lower() == self.text.lower()

    def _next(self, state: PhoneState, screen: Screen) -> str:
        route = state.route
        if (route.app, route.page, route.arg) == ("messages", "thread", self.contact):
            if route.field("field:message") != self.text:
                return _act("input_text", text=self.text, index=screen.index_of("field:message"), clear_text=True)
            return _click(screen, "thread:send")
        if (route.app, route.page) == ("messages", "main"):
            return _click(screen, f"thread:{self.contact}")
        return _go(state, screen, "messages")


@dataclass(frozen=True)
class AddContact(Task):
    """Create a contact through the form (two text fields)."""

    task_type: ClassVar[str] = "add_contact"
    name: str
    phone: str

    def instruction(self) -> str:  # noqa: D102
        return f"Add a contact named {self.name} with phone number {self.phone}."

    def check(self, state: PhoneState, answer: str | None) -> bool:  # noqa: D102
        contact = state.contact(self.name)
        return contact is not None and digits(contact.phone) == digits(self.phone)

    def _next(self, state: PhoneState, screen: Screen) -> str:
        route = state.route
        if (route.app, route.page) == ("contacts", "new"):
            return _fill(state, screen, {"field:name": self.name, "field:phone": self.phone})
        if (route.app, route.page) == ("contacts", "main"):
            return _click(screen, "contacts:add")
        return _go(state, screen, "contacts")


@dataclass(frozen=True)
class DeleteContact(Task):
    """Delete a contact: long-press its row, then Delete in the menu."""

    task_type: ClassVar[str] = "delete_contact"
    name: str
    others: tuple[str, ...]

    def instruction(self) -> str:  # noqa: D102
        return f"Delete the contact {self.name}."

    def check(self, state: PhoneState, answer: str | None) -> bool:  # noqa: D102
        # Deleting everyone is not success: the other contacts must survive.
        names = {c.name for c in state.contacts}
        return self.name not in names and set(self.others) <= names

    def _next(self, state: PhoneState, screen: Screen) -> str:
        route = state.route
        if (route.app, route.page, route.arg) == ("contacts", "menu", self.name):
            return _click(screen, "menu:delete")
        if (route.app, route.page) == ("contacts", "main"):
            return _click(screen, f"contact:{self.name}", long=True)
        return _go(state, screen, "contacts")


@dataclass(frozen=True)
class SetAlarm(Task):
    """Add an enabled alarm at a time that has none yet."""

    task_type: ClassVar[str] = "set_alarm"
    hour: int
    minute: int

    def instruction(self) -> str:  # noqa: D102
        return f"Set an alarm for {self.hour:02d}:{self.minute:02d}."

    def check(self, state: PhoneState, answer: str | None) -> bool:  # noqa: D102
        return any((a.hour, a.minute, a.enabled) == (self.hour, self.minute, True) for a in state.alarms)

    def _next(self, state: PhoneState, screen: Screen) -> str:
        route = state.route
        if (route.app, route.page) == ("clock", "new"):
            return _fill(state, screen, {"field:hour": str(self.hour), "field:minute": str(self.minute)})
        if (route.app, route.page) == ("clock", "main"):
            return _click(screen, "clock:add")
        return _go(state, screen, "clock")


@dataclass(frozen=True)
class DisableAlarm(Task):
    """Switch off an existing enabled alarm (it must not be deleted)."""

    task_type: ClassVar[str] = "disable_alarm"
    label: str

    def instruction(self) -> str:  # noqa: D102
        return f"Turn off the {self.label} alarm."

    def check(self, state: PhoneState, answer: str | None) -> bool:  # noqa: D102
        return any(a.label == self.label and not a.enabled for a in state.alarms)

    def _next(self, state: PhoneState, screen: Screen) -> str:
        if (state.route.app, state.route.page) == ("clock", "main"):
            return _click(screen, f"alarm:{self.label}")
        return _go(state, screen, "clock")


@dataclass(frozen=True)
class BuyCheapest(Task):
    """Buy exactly one item, the cheapest of a category (its list is longer than a screen)."""

    task_type: ClassVar[str] = "buy_cheapest"
    category: str
    noun: str
    product_id: str

    def instruction(self) -> str:  # noqa: D102
        return f"Buy the cheapest {self.noun} in the Shop app."

    def check(self, state: PhoneState, answer: str | None) -> bool:  # noqa: D102
        return state.orders == (self.product_id,)

    def _next(self, state: PhoneState, screen: Screen) -> str:
        route = state.route
        if (route.app, route.page, route.arg) == ("shop", "product", self.product_id) and not state.orders:
            return _click(screen, "product:buy")
        if (route.app, route.page, route.arg) == ("shop", "category", self.category):
            return _click(screen, f"product:{self.product_id}")
        if (route.app, route.page) == ("shop", "main"):
            return _click(screen, f"category:{self.category}")
        return _go(state, screen, "shop")


@dataclass(frozen=True)
class ContactPhone(Task):
    """A question: read a contact's phone number and `answer` it."""

    task_type: ClassVar[str] = "contact_phone"
    asks_question: ClassVar[bool] = True
    name: str
    phone: str

    def instruction(self) -> str:  # noqa: D102
        return f"What is {self.name}'s phone number? Reply with the answer action."

    def check(self, state: PhoneState, answer: str | None) -> bool:  # noqa: D102
        return answer is not None and digits(answer) == digits(self.phone)

    def expert(self, state: PhoneState, screen: Screen) -> str:  # noqa: D102
        route = state.route
        if (route.app, route.page, route.arg) == ("contacts", "detail", self.name):
            element = screen.element("detail:phone")
            return _act("answer", text=element.text if element else self.phone)
        if (route.app, route.page) == ("contacts", "main"):
            return _click(screen, f"contact:{self.name}")
        return _go(state, screen, "contacts")


def check_task(task: Task, state: PhoneState, answer: str | None) -> bool:
    """``task.check(state, answer)`` as a module-level function, so a budget worker process can run it.

    `GuiEnv` sends it through `agentrl.budget.run_with_budget`: the task, the state and the answer are frozen
    dataclasses and strings, all picklable, so the whole check (which reads the agent's typed texts and answer)
    runs under the hard budget.
    """
    return task.check(state, answer)


def _toggle_task(rng: np.random.Generator, state: PhoneState) -> Task:
    section = list(SETTINGS)[int(rng.integers(len(SETTINGS)))]
    toggles = SETTINGS[section]
    toggle = toggles[int(rng.integers(len(toggles)))]
    return ToggleSetting(section=section, toggle=toggle, on=toggle not in state.toggles_on)


def _message_task(rng: np.random.Generator, state: PhoneState) -> Task:
    thread = state.threads[int(rng.integers(len(state.threads)))]
    text = _MESSAGES[int(rng.integers(len(_MESSAGES)))]
    return SendMessage(contact=thread.contact, text=text, sent_before=sum(m.outgoing for m in thread.messages))


def _add_contact_task(rng: np.random.Generator, state: PhoneState) -> Task:
    name = _NEW_NAMES[int(rng.integers(len(_NEW_NAMES)))]
    phone = f"555-{int(rng.integers(100, 1000)):03d}-{int(rng.integers(0, 10000)):04d}"
    return AddContact(name=name, phone=phone)


def _delete_contact_task(rng: np.random.Generator, state: PhoneState) -> Task:
    name = state.contacts[int(rng.integers(len(state.contacts)))].name
    return DeleteContact(name=name, others=tuple(c.name for c in state.contacts if c.name != name))


def _set_alarm_task(rng: np.random.Generator, state: PhoneState) -> Task:
    taken = {(a.hour, a.minute) for a in state.alarms}
    free = [(h, m) for h in range(5, 12) for m in (0, 10, 20, 30, 40, 50) if (h, m) not in taken]
    hour, minute = free[int(rng.integers(len(free)))]
    return SetAlarm(hour=hour, minute=minute)


def _disable_alarm_task(rng: np.random.Generator, state: PhoneState) -> Task:
    enabled = [a for a in state.alarms if a.enabled] or list(state.alarms)
    return DisableAlarm(label=enabled[int(rng.integers(len(enabled)))].label)


def _buy_task(rng: np.random.Generator, state: PhoneState) -> Task:
    category = list(SHOP_CATALOGUE)[int(rng.integers(len(SHOP_CATALOGUE)))]
    cheapest = min(state.category(category), key=lambda p: p.price_cents)
    return BuyCheapest(category=category, noun=cheapest.noun, product_id=cheapest.id)


def _phone_task(rng: np.random.Generator, state: PhoneState) -> Task:
    contact = state.contacts[int(rng.integers(len(state.contacts)))]
    return ContactPhone(name=contact.name, phone=contact.phone)


_SAMPLERS = {
    "toggle_setting": _toggle_task,
    "send_message": _message_task,
    "add_contact": _add_contact_task,
    "delete_contact": _delete_contact_task,
    "set_alarm": _set_alarm_task,
    "disable_alarm": _disable_alarm_task,
    "buy_cheapest": _buy_task,
    "contact_phone": _phone_task,
}
TASK_TYPES: tuple[str, ...] = tuple(_SAMPLERS)
"""Every task type, in sampling order."""


def sample_task(rng: np.random.Generator, state: PhoneState, task_types: tuple[str, ...] = TASK_TYPES) -> Task:
    """Draw one task of a type from `task_types` (uniformly) for the phone `state`.

    Raises:
        ValueError: when a name in `task_types` is not a known task type.
    """
    unknown = [t for t in task_types if t not in _SAMPLERS]
    if unknown or not task_types:
        raise ValueError(f"unknown task types {unknown}; choose from {', '.join(TASK_TYPES)}")
    task_type = task_types[int(rng.integers(len(task_types)))]
    return _SAMPLERS[task_type](rng, state)
