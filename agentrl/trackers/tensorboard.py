"""TensorBoard event files in ``RUN/tensorboard`` (``tensorboard --logdir RUN/tensorboard``).

Scalars per metric, the config as text, and tables as Markdown text (TensorBoard has no table view; its Text tab shows
Markdown tables).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrl.trackers.base import Table, TrackerSettings

__all__ = ["TensorboardTracker", "markdown_table"]


def markdown_table(table: Table) -> str:
    """A Markdown table; cell line breaks become ``<br>`` and pipes are escaped, so each row stays one line."""
    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.rows]
    return "\n".join(lines)


class TensorboardTracker:
    """A `torch.utils.tensorboard.SummaryWriter` on the run folder (see the module docstring)."""

    run_id = ""

    def __init__(self, writer: Any, location: str):
        """Wrap a writer; open one with `TensorboardTracker.open`."""
        self.writer, self.location = writer, location

    @classmethod
    def open(cls, settings: TrackerSettings) -> TensorboardTracker:
        """A writer on ``settings.run_dir/tensorboard`` (a resumed run adds an event file beside the earlier ones)."""
        import tensorboard  # noqa: F401 -- torch's SummaryWriter needs it; a missing one is the ImportError to say
        from torch.utils.tensorboard import SummaryWriter

        folder = settings.run_dir / "tensorboard"
        return cls(SummaryWriter(log_dir=str(folder)), f"event files in {folder}")

    def log_config(self, config: Mapping[str, Any]) -> None:
        """The config as YAML text (tag ``config``)."""
        import yaml

        self.writer.add_text("config", "```\n" + yaml.safe_dump(dict(config), sort_keys=False) + "```", 0)

    def log_metrics(self, step: int, row: Mapping[str, float]) -> None:
        """One scalar per metric at `step`."""
        for key, value in row.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_table(self, name: str, step: int, table: Table) -> None:
        """The table as Markdown text under `name` at `step`."""
        self.writer.add_text(name, markdown_table(table), step)

    def log_eval(self, step: int, summary: Mapping[str, float]) -> None:
        """One scalar per eval number at `step`."""
        self.log_metrics(step, summary)

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()
