"""What a client of a served env may set: constructor settings and reset options as bounded plain data.

A served env (`agentrl env serve`) builds each session's env from the operator's kwargs plus the client's, and
resets it with the client's options. Both are data, declared by the env class (`TextEnv.client_settings`,
`TextEnv.client_reset_options`), each a `ClientSetting`:

    client_settings = {"split": ClientSetting(str, "which problems", choices=("train", "test")),
                       "max_turns": ClientSetting(int, "replies per episode", min=1, max=20)}

    check_client_settings(MathEnv, {"extractor": "os:system"}, "math")   # ClientSettingError naming 'extractor'

Importable names, paths, URLs and cache folders are never declared: the process would import, read or write what
they name, so only the operator sets them (``--env-arg``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ClientSetting", "ClientSettingError", "check_client_settings", "check_reset_options"]


_PLAIN_TYPES = (bool, int, float, str)
_SHOWN_CHARS = 64  # a client's names and values are echoed in refusals, cut to this length


class ClientSettingError(ValueError):
    """A client asked for a setting it may not set, or for a value outside the setting's bounds.

    Attributes:
        setting: the name of the offending setting (as the client sent it, cut to 64 characters).
    """

    def __init__(self, setting: str, message: str):
        super().__init__(message)
        self.setting = setting


@dataclass(frozen=True)
class ClientSetting:
    """One constructor argument that a client of a served env may set: a plain value within declared bounds.

    A served env (`agentrl env serve`) builds each session's env from the operator's kwargs plus the client's. What a
    client may add is data only, declared by the env class in `TextEnv.client_settings`; importable names, paths,
    URLs, cache folders and shared-state handles stay with the operator (``--env-arg``), because the process would
    import, read or write whatever they name.

    Attributes:
        type: ``bool``, ``int``, ``float`` or ``str``. A JSON ``true`` is never taken for an int or a float (Python
            would read it as 1); an int is taken for a float and becomes one.
        doc: one line for clients (``GET /NAME/info`` shows it).
        min: the smallest number allowed (int and float settings; inclusive). Numbers need `min` and `max` unless
            an int setting lists `choices`.
        max: the largest number allowed (inclusive).
        choices: the only values allowed (int and str settings).
        max_length: the longest string allowed (str settings without `choices`).
    """

    type: type
    doc: str = ""
    min: float | None = None
    max: float | None = None
    choices: tuple[Any, ...] = ()
    max_length: int = 64

    def __post_init__(self) -> None:
        # Declaration mistakes are the env author's: fail when the class is defined, with what to write instead.
        if self.type not in _PLAIN_TYPES:
            raise TypeError(f"ClientSetting type must be one of bool, int, float, str, got {self.type!r}")
        object.__setattr__(self, "choices", tuple(self.choices))
        numeric = self.type in (int, float)
        if self.type is bool and (self.choices or self.min is not None or self.max is not None):
            raise ValueError("a bool ClientSetting takes no min, max or choices: both values are allowed")
        if not numeric and (self.min is not None or self.max is not None):
            raise ValueError(f"min / max bound numbers; a {self.type.__name__} setting uses choices or max_length")
        if self.type is float and self.choices:
            raise ValueError("a float ClientSetting takes min and max, not choices")
        for choice in self.choices:
            if type(choice) is not self.type:
                raise TypeError(f"ClientSetting choice {choice!r} is not a {self.type.__name__}")
        if numeric and not self.choices:
            if self.min is None or self.max is None:
                raise ValueError(f"a {self.type.__name__} ClientSetting needs min and max (or choices): a client "
                                 f"must not pick any number it likes")
            if not (math.isfinite(self.min) and math.isfinite(self.max)) or self.min > self.max:
                raise ValueError(f"ClientSetting bounds must be finite with min <= max, got [{self.min}, {self.max}]")
        if isinstance(self.max_length, bool) or not isinstance(self.max_length, int) or self.max_length < 1:
            raise ValueError(f"ClientSetting max_length must be a positive int, got {self.max_length!r}")

    def check(self, name: str, value: Any, env_name: str = "this env") -> bool | int | float | str:
        """Return `value` as the setting's type, or raise `ClientSettingError` naming `name` and the bounds.

        Args:
            name: the setting's name (for the message).
            value: what the client sent (decoded JSON).
            env_name: the env's name (for the message).
        """
        got = _shown(value)
        wanted = self.describe_bounds()
        if self.type is float and type(value) is int:
            # JSON has one number type: 1 means 1.0 here (and 10**400, too large for a float, means infinity).
            value = float(value) if abs(value) < 2**1023 else math.inf
        if type(value) is not self.type:
            raise ClientSettingError(name, f"{env_name}: setting {name!r} must be {wanted}, got {got}")
        if self.type is float and not math.isfinite(value):
            raise ClientSettingError(name, f"{env_name}: setting {name!r} must be a finite number ({wanted}), "
                                           f"got {got}")
        if self.choices and value not in self.choices:
            raise ClientSettingError(name, f"{env_name}: setting {name!r} must be {wanted}, got {got}")
        if self.min is not None and not self.min <= value <= self.max:  # type: ignore[operator]
            raise ClientSettingError(name, f"{env_name}: setting {name!r} must be {wanted}, got {got}")
        if self.type is str and not self.choices and len(value) > self.max_length:
            raise ClientSettingError(name, f"{env_name}: setting {name!r} must be {wanted}, got a string of "
                                           f"{len(value)} characters")
        return value

    def describe_bounds(self) -> str:
        """The allowed values in words, e.g. ``"an int in [1, 20]"`` or ``"one of 'train', 'test'"``."""
        if self.choices:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.type is bool:
            return "true or false"
        if self.type is str:
            return f"a string of at most {self.max_length} characters"
        low, high = (int(self.min), int(self.max)) if self.type is int else (self.min, self.max)  # type: ignore[arg-type]
        return f"{'an int' if self.type is int else 'a finite number'} in [{low}, {high}]"

    def describe(self) -> dict[str, Any]:
        """The setting as JSON for clients: type, doc and the bounds that apply."""
        out: dict[str, Any] = {"type": self.type.__name__, "doc": self.doc}
        if self.choices:
            out["choices"] = list(self.choices)
        elif self.type in (int, float):
            out["min"], out["max"] = self.type(self.min), self.type(self.max)
        elif self.type is str:
            out["max_length"] = self.max_length
        return out


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def check_client_settings(env_class: Any, settings: Any, env_name: str | None = None) -> dict[str, Any]:
    """Check a client's constructor kwargs against `env_class.client_settings`; return them as plain values.

    Every name is checked before any value is looked at, so a refused name gets the same answer whatever its value
    (a server never answers with its reaction to a path or an import name it was not meant to touch).

    Args:
        env_class: the env class (a factory or a class without declarations: a client may set nothing).
        settings: the client's kwargs, decoded JSON.
        env_name: the env's name for messages (default: the class name).

    Returns:
        The settings, each converted to its declared type (an int sent for a float setting becomes a float).

    Raises:
        ClientSettingError: `settings` is not an object, names a setting the env does not declare, or holds a value
            of the wrong type or outside its bounds. The message names the setting and the fix.
    """
    env_name = env_name or getattr(env_class, "__name__", "this env")
    declared: Mapping[str, ClientSetting] = getattr(env_class, "client_settings", None) or {}

    def refused(shown: str) -> str:
        allowed = f"a client may set {', '.join(sorted(declared))}" if declared else "a client may set nothing on it"
        return (f"{shown!r} is not a setting a client may set on {env_name} ({allowed}); the operator sets it with "
                f"--env-arg {shown}=... when starting the server")

    return _check_declared(declared, settings, env_name, "session settings", refused)


def check_reset_options(env_class: Any, options: Any, env_name: str | None = None) -> dict[str, Any] | None:
    """Check a client's reset options against `env_class.client_reset_options`; return them as plain values.

    The same rule as `check_client_settings`: names first, then each value against its declaration. ``None`` and
    ``{}`` mean no options.

    Raises:
        ClientSettingError: `options` is not an object, names an option the env does not declare, or holds a value
            of the wrong type or outside its bounds.
    """
    if options is None:
        return None
    env_name = env_name or getattr(env_class, "__name__", "this env")
    declared: Mapping[str, ClientSetting] = getattr(env_class, "client_reset_options", None) or {}

    def refused(shown: str) -> str:
        allowed = f"it takes {', '.join(sorted(declared))}" if declared else "it takes none"
        return f"{shown!r} is not a reset option a client may send to {env_name} ({allowed})"

    return _check_declared(declared, options, env_name, "reset options", refused)


def _check_declared(declared: Mapping[str, ClientSetting], values: Any, env_name: str, what: str,
                    refused: Callable[[str], str]) -> dict[str, Any]:
    """Every name of `values` against `declared` first (`refused(name)` words the refusal), then every value."""
    if not isinstance(values, Mapping):
        raise ClientSettingError("", f"{env_name}: {what} must be a JSON object of name: value, got "
                                     f"{type(values).__name__}")
    for name in values:
        if not isinstance(name, str) or name not in declared:
            shown = str(name)[:_SHOWN_CHARS]
            raise ClientSettingError(shown, refused(shown))
    return {name: declared[name].check(name, value, env_name) for name, value in values.items()}
