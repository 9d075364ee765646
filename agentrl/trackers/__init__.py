"""Experiment trackers: a run's metrics, config, sampled trajectories and eval results, also in W&B, MLflow, ...

metrics.jsonl and curves.png are always written; `log.trackers` (``--log wandb --log tensorboard``, or
``--log wandb,tensorboard``) adds trackers, each chosen by name from `TRACKERS` and installed as an extra
(``pip install 'agentrl-platform[wandb]'``). Every tracker writes under the run folder and contacts no server unless
its own environment variable asks for one:

=============  ======================================================  ==============================================
tracker        writes                                                  to reach a server instead
=============  ======================================================  ==============================================
wandb          ``RUN/wandb/offline-run-*`` (offline mode)              ``WANDB_MODE=online``, or ``wandb sync`` later
mlflow         ``RUN/mlruns`` (a file store)                           ``MLFLOW_TRACKING_URI``
tensorboard    ``RUN/tensorboard`` (event files)                       (none: ``tensorboard --logdir RUN/tensorboard``)
trackio        ``RUN/trackio`` (Trackio's SQLite store)                ``TRACKIO_DIR``, ``TRACKIO_SPACE_ID``
=============  ======================================================  ==============================================

`RunLog` is the one place a run's rows go: metrics.jsonl first, then every tracker. A tracker whose package is missing,
or that fails to start or to log, costs one line on stderr and is dropped; the run goes on with the files. The
tracker run ids are kept in ``RUN/trackers.json``, so ``agentrl run --resume`` continues the same tracker runs.
"""

from __future__ import annotations

import importlib
import itertools
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = ["TRACKERS", "Tracker", "TrackerSettings", "Table", "RunLog", "trajectory_table", "eval_summary",
           "eval_table", "tracker_names", "clear_tracker_files"]

TRACKERS: dict[str, str] = {
    "wandb": "agentrl.trackers.wandb:WandbTracker",
    "mlflow": "agentrl.trackers.mlflow:MlflowTracker",
    "tensorboard": "agentrl.trackers.tensorboard:TensorboardTracker",
    "trackio": "agentrl.trackers.trackio:TrackioTracker",
}
"""Tracker name -> ``module:Class``; each class opens itself with ``Class.open(settings)``. The name is also the extra
(``agentrl-platform[name]``) that installs the tracker's package."""

TRANSCRIPT_CHARS = 4000
"""A transcript in a table is cut to this many characters (a WebShop page per turn would fill a dashboard)."""


RUN_FOLDER_FILES = ("wandb", "mlruns", "tensorboard", "trackio", "trackers.json")
"""What the trackers write in a run folder by default (`TRACKERS`' module docstrings), and their run ids."""


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


def tracker_names(value: Sequence[str]) -> tuple[str, ...]:
    """`value`'s tracker names, comma-separated entries split, in order, each once (``["a,b", "a"]`` -> ``(a, b)``)."""
    names = [part.strip() for entry in value for part in str(entry).split(",") if part.strip()]
    return tuple(dict.fromkeys(names))


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


def _tracker_class(name: str) -> Any:
    module, _, cls = TRACKERS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


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
            names: tracker names (`TRACKERS` keys).
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
                trackers[name] = _tracker_class(name).open(settings)  # its package is imported here, on use
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
        from agentrl.training.metrics import append_metrics

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


def transcript(trajectory: Any) -> str:
    """The episode as text: the first observation, then each action (``>``) and what the env answered."""
    parts = [trajectory.first_observation]
    for turn in trajectory.turns:
        parts += [f"> {turn.action}", turn.observation]
    text = "\n".join(parts)
    return text if len(text) <= TRANSCRIPT_CHARS else text[: TRANSCRIPT_CHARS - 3] + "..."


def trajectory_table(trajectories: Sequence[Any], limit: int) -> Table:
    """Up to `limit` episodes, one per group in turn (so a small table still spans the step's tasks)."""
    groups: dict[int, list[Any]] = {}
    for traj in trajectories:
        groups.setdefault(traj.group_id, []).append(traj)
    picked = [t for rank in itertools.zip_longest(*groups.values()) for t in rank if t is not None][:limit]
    columns = ("step", "group", "seed", "policy_version", "return", "success", "turns", "tokens", "transcript")
    rows = tuple((t.train_step if t.train_step is not None else t.policy_version, t.group_id, t.seed,
                  t.policy_version, float(t.total_return), bool(t.success), len(t.turns), t.num_generated_tokens,
                  transcript(t)) for t in picked)
    return Table(columns, rows)


def eval_summary(results: Mapping[str, Any]) -> dict[str, float]:
    """The headline numbers of eval results: ``eval/success_rate`` (with ``_low`` / ``_high``), ``eval/pass_at_k``, ...

    Per task type too (``eval/<type>/success_rate``) when the env has several.
    """
    out: dict[str, float] = {}

    def add(prefix: str, block: Mapping[str, Any]) -> None:
        for key, value in block.items():
            if key == "pass_at_k":
                for k, interval in value.items():
                    out[f"{prefix}pass_at_{k}"] = interval["estimate"]
            elif isinstance(value, Mapping) and "estimate" in value:
                out[f"{prefix}{key}"] = value["estimate"]
                out[f"{prefix}{key}_low"], out[f"{prefix}{key}_high"] = value["low"], value["high"]
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                out[f"{prefix}{key}"] = value

    add("eval/", results["overall"])
    by_type = results.get("by_task_type") or {}
    if len(by_type) > 1:
        for task_type, block in by_type.items():
            add(f"eval/{task_type}/", block)
    return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(v)}


def eval_table(results: Mapping[str, Any]) -> Table:
    """One row per evaluated episode (task, seed, task type, success, reward, turns, tokens, ...)."""
    episodes = results.get("episodes") or []
    columns = tuple(episodes[0]) if episodes else ()
    return Table(columns, tuple(tuple(e.get(c) for c in columns) for e in episodes))
