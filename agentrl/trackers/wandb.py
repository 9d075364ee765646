"""Weights & Biases, offline by default: the run lands in ``RUN/wandb/offline-run-*`` (``wandb sync`` uploads it).

``WANDB_MODE=online`` (with a logged-in W&B) logs live instead. Config, metrics rows, trajectory tables
(`wandb.Table`) and eval numbers (history and run summary) are logged.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from agentrl.trackers.base import Table, TrackerSettings

__all__ = ["WandbTracker"]


class WandbTracker:
    """A W&B run (see the module docstring)."""

    def __init__(self, run: Any, location: str):
        """Wrap a started `wandb` run; open one with `WandbTracker.open`."""
        self.run, self.location, self.run_id = run, location, run.id

    @classmethod
    def open(cls, settings: TrackerSettings) -> WandbTracker:
        """Start (or, with `settings.run_id`, continue) the run under ``settings.run_dir/wandb``."""
        import wandb

        mode = os.environ.get("WANDB_MODE", "offline")  # nothing reaches a server unless the user asks for it
        run = wandb.init(
            project=settings.project, name=settings.run_name, dir=str(settings.run_dir), mode=mode,
            id=settings.run_id or None, resume="allow" if settings.run_id else None,
            # console off: W&B would otherwise wrap stdout/stderr, under the progress bar; no system-stats sampler
            # thread, no code or git capture: the run folder holds the config already.
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True, disable_git=True,
                                    save_code=False, reinit="create_new"))
        where = run.dir if mode == "offline" else run.url
        return cls(run, f"{mode} run in {os.path.dirname(where)}" if mode == "offline" else f"{where}")

    def log_config(self, config: Mapping[str, Any]) -> None:
        """The config as the run's W&B config (nested sections stay nested)."""
        self.run.config.update(dict(config), allow_val_change=True)

    def log_metrics(self, step: int, row: Mapping[str, float]) -> None:
        """One history row at `step`."""
        self.run.log(dict(row), step=step)

    def log_table(self, name: str, step: int, table: Table) -> None:
        """A `wandb.Table` in the history at `step`."""
        import wandb

        self.run.log({name: wandb.Table(columns=list(table.columns), data=[list(r) for r in table.rows])}, step=step)

    def log_eval(self, step: int, summary: Mapping[str, float]) -> None:
        """Eval numbers in the history at `step` and in the run summary."""
        self.run.log(dict(summary), step=step)
        self.run.summary.update(dict(summary))

    def close(self) -> None:
        """Finish the run (flushes the offline file)."""
        self.run.finish()
