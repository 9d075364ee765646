"""The tracker contract: `Tracker`, the run one tracker keeps, opened from `TrackerSettings`, and the `Table` it shows.

A tracker module (one per tracker, named in `agentrl.trackers.registry.TRACKERS`) holds one class with
``open(settings) -> Tracker``; `agentrl.trackers.runlog.RunLog` calls it and drops a tracker whose method raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = ["Table", "TrackerSettings", "Tracker"]


@dataclass(frozen=True)
class Table:
    """A table of rows: what each tracker shows as its table (W&B, Trackio), table artifact (MLflow) or text (TB)."""

    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


@dataclass(frozen=True)
class TrackerSettings:
    """What a tracker needs to open its run.

    Attributes:
        run_dir: the run folder; every tracker writes under it by default.
        project: the project (W&B, Trackio) or experiment (MLflow) name.
        run_name: the run's display name.
        run_id: the tracker's run id saved by an earlier part of this run (``--resume``), or "" for a new run.
    """

    run_dir: Path
    project: str
    run_name: str
    run_id: str = ""


class Tracker(Protocol):
    """One experiment tracker's run. Opened by ``Class.open(settings: TrackerSettings) -> Tracker``.

    A method may raise: `RunLog` then says so in one line and stops calling this tracker.
    """

    run_id: str
    """The id that reopens this run on ``--resume`` ("" when the tracker has none)."""
    location: str
    """Where the records are, for the one line said when it opens (a folder, a URI)."""

    def log_config(self, config: Mapping[str, Any]) -> None:
        """The run's resolved config (nested mappings, as config.yaml)."""

    def log_metrics(self, step: int, row: Mapping[str, float]) -> None:
        """One metrics row (numbers only; non-finite values are left out) at training step `step`."""

    def log_table(self, name: str, step: int, table: Table) -> None:
        """A table (sampled trajectories, eval episodes) under `name` at `step`."""

    def log_eval(self, step: int, summary: Mapping[str, float]) -> None:
        """An evaluation's summary numbers (``eval/success_rate``, ...), measured after training step `step`."""

    def close(self) -> None:
        """Flush and finish the run."""
