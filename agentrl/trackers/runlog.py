"""`RunLog`, the one place a run's rows go: metrics.jsonl first, then every tracker of ``--log``.

A tracker whose package is missing, or that fails to start or to log, costs one line on stderr and is dropped; the run
goes on with the files. The tracker run ids are kept in ``RUN/trackers.json``, so ``agentrl run --resume`` continues
the same tracker runs.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.trackers.base import Tracker, TrackerSettings
from agentrl.trackers.registry import tracker_class
from agentrl.trackers.tables import eval_summary, eval_table, trajectory_table

__all__ = ["RunLog", "append_metrics", "clear_tracker_files", "RUN_FOLDER_FILES"]

RUN_FOLDER_FILES = ("wandb", "mlruns", "tensorboard", "trackio", "trackers.json")
"""What the trackers write in a run folder by default (the tracker modules' docstrings), and their run ids."""


def clear_tracker_files(out: Path) -> None:
    """Remove what trackers wrote in the run folder `out` (a run replacing it with ``--overwrite``).

    TensorBoard would show the old event files' curves beside the new ones, Trackio would add to a run of the same
    name; stores outside the folder (``TRACKIO_DIR``, ``MLFLOW_TRACKING_URI``) are not touched.
    """
    import shutil

    for name in RUN_FOLDER_FILES:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def append_metrics(path: Path, metrics: dict[str, Any]) -> None:
    """Append one JSON line; non-finite floats become null (JSON has no NaN)."""
    with open(path, "a") as f:
        f.write(json.dumps({k: (v if not isinstance(v, float) or math.isfinite(v) else None)
                            for k, v in metrics.items()}) + "\n")


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _one_line(error: BaseException, limit: int = 300) -> str:
    """The error's type and first line, cut to `limit` characters (MLflow's run to a paragraph)."""
    text = str(error).strip().splitlines()
    line = f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")
    return line if len(line) <= limit else line[: limit - 3] + "..."


class RunLog:
    """A run's records: metrics.jsonl (always) and the trackers chosen; the one place rows are written."""

    def __init__(self, out: Path, trackers: dict[str, Tracker], *, table_episodes: int = 8,
                 say: Callable[[str], None] = _say):
        """Wrap open trackers; use `RunLog.open` to open them by name.

        Args:
            out: the run folder (metrics.jsonl goes there).
            trackers: name -> open tracker.
            table_episodes: episodes per step in the trajectory table (0 = none).
            say: where the one-line notices go (stderr).
        """
        self.out, self.trackers, self.table_episodes, self.say = out, dict(trackers), table_episodes, say

    @classmethod
    def open(cls, out: Path, names: Sequence[str], config: Mapping[str, Any], *, project: str = "agentrl",
             run_name: str = "", table_episodes: int = 8, resume: bool = False,
             say: Callable[[str], None] = _say) -> RunLog:
        """Open the trackers `names` for the run folder `out` and log `config` to them.

        A tracker that is not installed or fails to open costs one line and is left out.

        Args:
            out: the run folder.
            names: tracker names (`agentrl.trackers.registry.TRACKERS` keys).
            config: the run's resolved config.
            project: project / experiment name.
            run_name: the run's name; empty: the run folder's name.
            table_episodes: episodes per step in the trajectory table.
            resume: reopen the tracker runs saved in ``out/trackers.json`` (``agentrl run --resume``).
            say: where the notices go.
        """
        ids_file = out / "trackers.json"
        ids = json.loads(ids_file.read_text()) if resume and ids_file.exists() else {}
        trackers: dict[str, Tracker] = {}
        for name in names:
            settings = TrackerSettings(out, project, run_name or out.resolve().name, ids.get(name, ""))
            try:
                trackers[name] = tracker_class(name).open(settings)  # its package is imported here, on use
            except ImportError as e:
                # The hint is agentrl.extras.install_hint's, written out: this folder imports nothing from agentrl/
                # (agentrl.config imports it), and tests/test_extras.py checks the two agree.
                hint = f"pip install 'agentrl-platform[{name}]'"
                say(f"--log {name}: cannot import {e.name or name} ({hint}); this run logs to metrics.jsonl without it")
                continue
            except Exception as e:  # a tracker's own error (bad URI, unwritable folder) must not stop the run
                say(f"--log {name}: could not start ({_one_line(e)}); this run logs to metrics.jsonl without it")
                continue
            say(f"--log {name}: {trackers[name].location}")
        if trackers:
            ids_file.write_text(json.dumps({n: t.run_id for n, t in trackers.items()}))
        log = cls(out, trackers, table_episodes=table_episodes, say=say)
        log._each("log_config", config)
        return log

    def _each(self, method: str, *args: Any) -> None:
        """Call `method` on every tracker; one that raises is said once and dropped."""
        for name, tracker in list(self.trackers.items()):
            try:
                getattr(tracker, method)(*args)
            except Exception as e:
                self.say(f"--log {name}: {method} failed ({_one_line(e)}); it stops logging, metrics.jsonl goes on")
                del self.trackers[name]
                try:
                    tracker.close()
                except Exception:  # noqa: S110 -- it already failed and was said; closing is a courtesy
                    pass

    def metrics(self, row: Mapping[str, Any], trajectories: Sequence[Any] = ()) -> None:
        """Write one metrics row (it carries ``step``) to metrics.jsonl, then to every tracker with its trajectories."""
        append_metrics(self.out / "metrics.jsonl", dict(row))
        if not self.trackers:
            return
        step = int(row["step"])
        self._each("log_metrics", step, _numbers(row))
        if trajectories and self.table_episodes:
            self._each("log_table", "trajectories", step, trajectory_table(trajectories, self.table_episodes))

    def trajectories(self, name: str, step: int, trajectories: Sequence[Any]) -> None:
        """A table of `trajectories` (all of them, an eval's) under `name`."""
        if self.trackers and trajectories:
            self._each("log_table", name, step, trajectory_table(trajectories, len(trajectories)))

    def eval(self, results: Mapping[str, Any], step: int = 0) -> None:
        """An evaluation's results (`agentrl.recipes.evaluate.evaluate`'s): summary numbers and the episode table."""
        if self.trackers:
            self._each("log_eval", step, eval_summary(results))
            self._each("log_table", "eval/episodes", step, eval_table(results))

    def close(self) -> None:
        """Finish every tracker's run (files flushed)."""
        self._each("close")
        self.trackers.clear()


def _numbers(row: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a row (``step`` is the x axis, not a metric)."""
    return {k: float(v) for k, v in row.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
