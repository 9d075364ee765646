"""Parse the agent's text into an `Action`: AndroidWorld JSON or the function style (``tap(3)``, ``back()``).

JSON (AndroidWorld's `JSONAction` field names)::

    {"action_type": "click", "index": 3}            {"action_type": "click", "x": 180, "y": 400}
    {"action_type": "long_press", "index": 5}       {"action_type": "double_tap", "index": 5}
    {"action_type": "input_text", "text": "hi", "index": 7, "clear_text": true}
    {"action_type": "scroll", "direction": "down"}  {"action_type": "swipe", "direction": "up"}
    {"action_type": "navigate_back"}  {"action_type": "navigate_home"}  {"action_type": "keyboard_enter"}
    {"action_type": "open_app", "app_name": "Contacts"}  {"action_type": "wait"}
    {"action_type": "status", "goal_status": "complete"}  {"action_type": "answer", "text": "555-010-1234"}

Function style: ``tap(3)``, ``tap(180, 400)``, ``long_press(5)``, ``double_tap(5)``, ``type("hi")``,
``type("hi", 7)``, ``type("hi", 7, clear=True)``,
``text("hi")``, ``scroll("down")``, ``swipe("up")``, ``back()``, ``home()``, ``enter()``,
``wait()``, ``open_app("Clock")``, ``answer("...")``, ``finish()``, ``infeasible()``.

The JSON object or the call may follow free text (reasoning, ``Action:``); the last one in the reply counts.

Reading an action takes time linear in the reply, whatever its content (the reward's checker reads the phone's state,
which only actions change, so this and `MAX_TEXT_CHARS` bound the checker's work too): a typed text or an answer
longer than `MAX_TEXT_CHARS` is refused, and JSON nested past Python's recursion limit is an invalid action, not a
crash.
A swipe moves the finger, so ``swipe up`` scrolls the content ``down``, as on a phone.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["ACTION_TYPES", "MAX_TEXT_CHARS", "Action", "ActionError", "format_call", "parse_action"]

MAX_TEXT_CHARS = 2_000
"""The longest text an ``input_text`` or ``answer`` action may carry (phone messages and answers are short)."""

ACTION_TYPES = (
    "click", "double_tap", "long_press", "input_text", "scroll", "swipe", "navigate_back", "navigate_home",
    "open_app", "keyboard_enter", "wait", "status", "answer",
)  # fmt: skip
_DIRECTIONS = ("up", "down", "left", "right")
_HELP = (
    'Reply with one action, as JSON such as {"action_type": "click", "index": 3} or as a call such as tap(3), '
    'type("hello"), scroll("down"), back(), home(), open_app("Contacts"), finish().'
)
# A call's name and opening parenthesis. The leftmost match always starts a run of letters, so matching only there
# (and possessively) keeps the search linear: the plain pattern rescanned every suffix of a long word (20,000
# letters: 4.5 s holding the GIL).
_CALL_START = re.compile(r"(?<![A-Za-z_])([A-Za-z_]++)\s*+\(")


class ActionError(ValueError):
    """The text is not a valid action; the message says what is wrong (it goes into the observation)."""


@dataclass(frozen=True)
class Action:
    """One parsed action.

    Attributes:
        action_type: one of `ACTION_TYPES`.
        index: target element index (click, long_press, double_tap, input_text, scroll).
        x: target pixel column, when given by coordinates.
        y: target pixel row, when given by coordinates.
        text: text to type (input_text) or the answer (answer).
        direction: up / down / left / right (scroll, swipe).
        app_name: app to launch (open_app).
        clear_text: clear the field before typing (input_text).
        goal_status: complete / infeasible (status).
    """

    action_type: str
    index: int | None = None
    x: int | None = None
    y: int | None = None
    text: str = ""
    direction: str = ""
    app_name: str = ""
    clear_text: bool = False
    goal_status: str = ""


def _int(value: Any, name: str) -> int:
    # bool is an int subclass; "index": true is a mistake, not element 1.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ActionError(f"{name} must be a number, got {value!r}.")
    return int(value)


def _str(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ActionError(f"{name} must be a string, got {value!r}.")
    return value


def _text(value: Any, name: str) -> str:
    text = _str(value, name)
    if len(text) > MAX_TEXT_CHARS:
        raise ActionError(f"{name} is {len(text)} characters long; at most {MAX_TEXT_CHARS} fit.")
    return text


def _direction(value: Any) -> str:
    d = _str(value, "direction").strip().lower()
    if d not in _DIRECTIONS:
        raise ActionError(f"direction must be one of {', '.join(_DIRECTIONS)}, got {value!r}.")
    return d


def _target(kind: str, fields: dict[str, Any]) -> Action:
    if fields.get("index") is not None:
        return Action(kind, index=_int(fields["index"], "index"))
    if fields.get("x") is not None and fields.get("y") is not None:
        return Action(kind, x=_int(fields["x"], "x"), y=_int(fields["y"], "y"))
    raise ActionError(f"{kind} needs an element index or x and y.")


def _from_fields(fields: dict[str, Any]) -> Action:
    kind = fields.get("action_type")
    if kind not in ACTION_TYPES:
        raise ActionError(f"unknown action_type {kind!r}; use one of: {', '.join(ACTION_TYPES)}.")
    if kind in ("click", "double_tap", "long_press"):
        return _target(kind, fields)
    if kind == "input_text":
        if "text" not in fields:
            raise ActionError("input_text needs a text field.")
        index = fields.get("index")
        return Action(
            kind,
            index=None if index is None else _int(index, "index"),
            text=_text(fields["text"], "text"),
            clear_text=bool(fields.get("clear_text", False)),
        )
    if kind in ("scroll", "swipe"):
        index = fields.get("index")
        return Action(kind, direction=_direction(fields.get("direction")),
                      index=None if index is None else _int(index, "index"))  # fmt: skip
    if kind == "open_app":
        return Action(kind, app_name=_str(fields.get("app_name"), "app_name"))
    if kind == "status":
        status = _str(fields.get("goal_status"), "goal_status").strip().lower()
        if status not in ("complete", "infeasible"):
            raise ActionError(f"goal_status must be 'complete' or 'infeasible', got {status!r}.")
        return Action(kind, goal_status=status)
    if kind == "answer":
        return Action(kind, text=_text(fields.get("text"), "text"))
    return Action(kind)


def _parse_json(text: str) -> Action:
    start, end = text.find("{"), text.rfind("}")
    if end < start:
        raise ActionError("the JSON object is not closed.")
    try:
        fields = json.loads(text[start : end + 1])
    except json.JSONDecodeError as e:
        raise ActionError(f"invalid JSON ({e.msg} at character {e.pos}).") from None
    except RecursionError:  # [[[[...]]]] nested past the interpreter's limit
        raise ActionError("the JSON is nested too deeply.") from None
    if not isinstance(fields, dict):
        raise ActionError("the action must be a JSON object.")
    return _from_fields(fields)


def _call_args(raw: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Positional and keyword arguments of a call, each a Python literal (``type("hi", 4, clear=True)``)."""
    if not raw.strip():
        return (), {}
    try:
        call = ast.parse(f"f({raw})", mode="eval").body  # not a Call (``f(1), g(2)``): AttributeError below
        if any(k.arg is None for k in call.keywords):  # ``**kwargs`` is not a literal
            raise ValueError
        return tuple(ast.literal_eval(a) for a in call.args), {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    except (ValueError, SyntaxError, MemoryError, RecursionError, AttributeError):
        raise ActionError(f"cannot read the arguments ({raw.strip()[:60]}); use numbers and quoted strings.") from None


def _parse_call(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Action:
    name = name.lower()
    if kwargs and (name not in ("type", "text", "input_text") or set(kwargs) != {"clear"}):
        raise ActionError(f"{name}() takes no keyword {', '.join(sorted(kwargs))}; only type() takes clear=True.")
    if name in ("tap", "click", "long_press", "double_tap"):
        kind = "click" if name in ("tap", "click") else name
        if len(args) == 1:
            return _target(kind, {"index": args[0]})
        if len(args) == 2:
            return _target(kind, {"x": args[0], "y": args[1]})
        raise ActionError(f"{name}() takes an element index or x, y.")
    if name in ("type", "text", "input_text"):
        texts = [a for a in args if isinstance(a, str)]
        numbers = [a for a in args if not isinstance(a, str)]
        if len(texts) != 1 or len(numbers) > 1:
            raise ActionError(f'{name}() takes a quoted text and optionally an element index: {name}("hello", 4).')
        return _from_fields({"action_type": "input_text", "text": texts[0], "index": numbers[0] if numbers else None,
                             "clear_text": kwargs.get("clear", False)})
    if name in ("scroll", "swipe"):
        if len(args) != 1:
            raise ActionError(f'{name}() takes a direction: {name}("down").')
        return _from_fields({"action_type": name, "direction": args[0]})
    simple = {"back": "navigate_back", "home": "navigate_home", "enter": "keyboard_enter", "wait": "wait"}
    if name in simple:
        return Action(simple[name])
    if name == "open_app" and len(args) == 1:
        return _from_fields({"action_type": "open_app", "app_name": args[0]})
    if name == "answer" and len(args) == 1:
        return _from_fields({"action_type": "answer", "text": args[0] if isinstance(args[0], str) else str(args[0])})
    if name in ("finish", "done", "complete"):
        return Action("status", goal_status="complete")
    if name == "infeasible":
        return Action("status", goal_status="infeasible")
    raise ActionError(f"unknown action {name}() with {len(args)} argument(s).")


def parse_action(text: str) -> Action:
    """Parse one reply into an `Action`; raises `ActionError` with a readable reason."""
    if not isinstance(text, str) or not text.strip():
        raise ActionError("empty action. " + _HELP)
    stripped = text.strip()
    if "{" in stripped and '"action_type"' in stripped:
        return _parse_json(stripped)
    for line in reversed(stripped.splitlines()):
        line = line.strip().removeprefix("Action:").strip().strip("`").strip()
        match = _CALL_START.search(line) if line.endswith(")") else None
        if match:
            return _parse_call(match.group(1), *_call_args(line[match.end() : -1]))
    if "{" in stripped:
        return _parse_json(stripped)
    raise ActionError(f"cannot read an action in {stripped[:80]!r}. " + _HELP)


_CALL_NAMES = {"navigate_back": "back", "navigate_home": "home", "keyboard_enter": "enter", "wait": "wait"}


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def format_call(action: Action) -> str:
    """The function-style text of `action`, the inverse of `parse_action` on it: ``tap(3)``, ``finish()``.

    Strings are double-quoted JSON strings (also Python literals), so quotes and backslashes read back unchanged;
    ``clear_text`` is the keyword ``clear=True`` of ``type``.
    """
    kind = action.action_type
    if kind in ("click", "long_press", "double_tap"):
        name = "tap" if kind == "click" else kind
        target = f"{action.index}" if action.index is not None else f"{action.x}, {action.y}"
        return f"{name}({target})"
    if kind == "input_text":
        index = "" if action.index is None else f", {action.index}"
        return f"type({_quote(action.text)}{index}{', clear=True' if action.clear_text else ''})"
    if kind in ("scroll", "swipe"):
        return f"{kind}({_quote(action.direction)})"
    if kind == "open_app":
        return f"open_app({_quote(action.app_name)})"
    if kind == "answer":
        return f"answer({_quote(action.text)})"
    if kind == "status":
        return "finish()" if action.goal_status == "complete" else "infeasible()"
    return f"{_CALL_NAMES[kind]}()"
