"""The trackers by name: `TRACKERS` (name -> ``module:Class``), each imported only when a run asks for it.

`agentrl.config` checks ``log.trackers`` against `TRACKERS` with `tracker_names`, so this module imports nothing
beyond the standard library at import time.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

__all__ = ["TRACKERS", "tracker_names", "tracker_class"]

TRACKERS: dict[str, str] = {
    "wandb": "agentrl.trackers.wandb:WandbTracker",
    "mlflow": "agentrl.trackers.mlflow:MlflowTracker",
    "tensorboard": "agentrl.trackers.tensorboard:TensorboardTracker",
    "trackio": "agentrl.trackers.trackio:TrackioTracker",
}
"""Tracker name -> ``module:Class``; each class opens itself with ``Class.open(settings)``. The name is also the extra
(``agentrl-platform[name]``) that installs the tracker's package."""


def tracker_names(value: Sequence[str]) -> tuple[str, ...]:
    """`value`'s tracker names, comma-separated entries split, in order, each once (``["a,b", "a"]`` -> ``(a, b)``)."""
    names = [part.strip() for entry in value for part in str(entry).split(",") if part.strip()]
    return tuple(dict.fromkeys(names))


def tracker_class(name: str) -> Any:
    """The class of tracker `name` (a `TRACKERS` key); its module, and so its package, is imported here."""
    module, _, cls = TRACKERS[name].partition(":")
    return getattr(importlib.import_module(module), cls)
