"""Env registry: `register(id, entry_point="pkg.mod:Class", **defaults)`, `make(id, **kwargs)`, `registered()`.

Environments are registered by string and imported only when made, so listing ids stays cheap and a broken
third-party env cannot break the others. Packages (agentrl's own built-ins included) register through the
Python entry-point group ``agentrl.envs``: the entry point's name is the env id, its value the class::

    [project.entry-points."agentrl.envs"]
    my-env = "my_package.my_env:MyEnv"

Entry points are read once, on the first call to `make` or `registered`; an explicit `register` call with the same
id wins over an entry point.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from types import MappingProxyType
from typing import Any

from agentrl.env import TextEnv

ENTRY_POINT_GROUP = "agentrl.envs"

__all__ = ["EnvSpec", "UnknownEnvError", "register", "make", "registered", "spec"]


class UnknownEnvError(KeyError):
    """Raised by `make` / `spec` for an id nobody registered; the message lists the known ids."""

    def __str__(self) -> str:  # KeyError would repr() the message and show quotes
        return str(self.args[0])


@dataclass(frozen=True)
class EnvSpec:
    """What the registry knows about one env id.

    Attributes:
        id: the name passed to `make`.
        entry_point: ``"pkg.module:ClassName"`` or the class / factory itself.
        defaults: keyword arguments passed to the constructor unless `make` overrides them.
        package: the distribution that provides it (``"agentrl"`` for the built-ins), for `agentrl envs list`.
    """

    id: str
    entry_point: str | Callable[..., TextEnv]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    package: str = ""

    def load(self) -> Callable[..., TextEnv]:
        """Import and return the env class (or factory)."""
        if not isinstance(self.entry_point, str):
            return self.entry_point
        module_name, _, attr = self.entry_point.partition(":")
        if not attr:
            raise ValueError(f"env {self.id!r}: entry point {self.entry_point!r} must look like 'pkg.module:Class'")
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise ImportError(f"env {self.id!r}: cannot import {module_name!r} ({e})") from e
        try:
            return getattr(module, attr)
        except AttributeError:
            raise ImportError(f"env {self.id!r}: module {module_name!r} has no attribute {attr!r}") from None

    @property
    def description(self) -> str:
        """First line of the env class docstring (imports the env)."""
        doc = inspect.getdoc(self.load()) or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""


_specs: dict[str, EnvSpec] = {}
_entry_points_loaded = False


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _specs:  # explicit register() wins
            continue
        package = ep.dist.name if ep.dist is not None else ""
        _specs[ep.name] = EnvSpec(id=ep.name, entry_point=ep.value, package=package)


def register(id: str, entry_point: str | Callable[..., TextEnv], **defaults: Any) -> EnvSpec:
    """Register an env under `id`; `make(id)` will call `entry_point(**defaults, **kwargs)`.

    Args:
        id: the env id, e.g. ``"my-maze"``. Re-registering an id replaces it.
        entry_point: ``"pkg.module:ClassName"`` (imported lazily) or a class / factory.
        **defaults: constructor keyword arguments used unless `make` overrides them.
    """
    if not isinstance(id, str) or not id:
        raise ValueError(f"env id must be a non-empty string, got {id!r}")
    caller = inspect.getmodule(inspect.stack()[1][0])
    package = (caller.__name__.split(".")[0] if caller else "") or ""
    spec_ = EnvSpec(id=id, entry_point=entry_point, defaults=MappingProxyType(dict(defaults)), package=package)
    _specs[id] = spec_
    return spec_


def registered() -> Mapping[str, EnvSpec]:
    """All registered specs by id, sorted by id (built-ins and entry points included)."""
    _load_entry_points()
    return MappingProxyType(dict(sorted(_specs.items())))


def spec(id: str) -> EnvSpec:
    """The spec registered under `id`; raises `UnknownEnvError` naming the closest known id."""
    _load_entry_points()
    if id in _specs:
        return _specs[id]
    known = sorted(_specs)
    close = difflib.get_close_matches(id, known, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise UnknownEnvError(f"unknown env {id!r}.{hint} Known envs: {', '.join(known) or '(none)'}")


def make(id: str, **kwargs: Any) -> TextEnv:
    """Create the env registered under `id`, with `kwargs` overriding the registered defaults."""
    s = spec(id)
    factory = s.load()
    return factory(**{**s.defaults, **kwargs})
