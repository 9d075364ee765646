"""Trackio, in its local SQLite store under the run folder (``RUN/trackio``) unless ``TRACKIO_DIR`` names another.

``TRACKIO_DIR=RUN/trackio trackio show`` opens the dashboard. Trackio reads ``TRACKIO_DIR`` once, when it is first
imported: a second run in the same process logs to the first one's store (the location line says where). A Hugging
Face Space is reached only when ``TRACKIO_SPACE_ID`` asks for one. Config, metrics rows, trajectory tables
(`trackio.Table`) and eval numbers are logged; Trackio's own CPU/GPU samplers are left off.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Mapping
from typing import Any

from agentrl.trackers.base import Table, TrackerSettings

__all__ = ["TrackioTracker"]


class TrackioTracker:
    """A Trackio run (see the module docstring)."""

    def __init__(self, run: Any, location: str):
        """Wrap a started run; open one with `TrackioTracker.open`."""
        self.run, self.location, self.run_id = run, location, run.name

    @classmethod
    def open(cls, settings: TrackerSettings) -> TrackioTracker:
        """Start (or, with `settings.run_id`, continue) the run named `settings.run_name`."""
        if "trackio" not in sys.modules and not os.environ.get("TRACKIO_DIR"):
            os.environ["TRACKIO_DIR"] = str((settings.run_dir / "trackio").resolve())
        import trackio
        from trackio.utils import TRACKIO_DIR

        with contextlib.redirect_stdout(io.StringIO()):  # its banner (six lines) would break into the progress bar
            run = trackio.init(project=settings.project, name=settings.run_id or settings.run_name,
                               resume="allow" if settings.run_id else "never", auto_log_cpu=False,
                               auto_log_gpu=False, embed=False)
        return cls(run, f"project {settings.project!r} in {TRACKIO_DIR} (view: TRACKIO_DIR={TRACKIO_DIR} trackio show)")

    def log_config(self, config: Mapping[str, Any]) -> None:
        """The config, sent with the first logged row (Trackio stores a run's config once)."""
        self.run.config.update(dict(config))

    def log_metrics(self, step: int, row: Mapping[str, float]) -> None:
        """One row at `step`."""
        self.run.log(dict(row), step=step)

    def log_table(self, name: str, step: int, table: Table) -> None:
        """A `trackio.Table` at `step`."""
        import trackio

        self.run.log({name: trackio.Table(columns=list(table.columns), data=[list(r) for r in table.rows])},
                     step=step)

    def log_eval(self, step: int, summary: Mapping[str, float]) -> None:
        """The eval numbers as one row at `step`."""
        self.run.log(dict(summary), step=step)

    def close(self) -> None:
        """Finish the run (writes what is still queued)."""
        import trackio.context_vars

        with contextlib.redirect_stdout(io.StringIO()):
            self.run.finish()
        if trackio.context_vars.current_run.get() is self.run:  # else its exit hook finishes it again, out loud
            trackio.context_vars.current_run.set(None)
