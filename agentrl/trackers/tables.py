"""What a tracker shows of a run besides its metrics: tables of episodes, and an evaluation's headline numbers."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.trackers.base import Table

__all__ = ["TRANSCRIPT_CHARS", "transcript", "trajectory_table", "eval_summary", "eval_table"]

TRANSCRIPT_CHARS = 4000
"""A transcript in a table is cut to this many characters (a WebShop page per turn would fill a dashboard)."""


def transcript(trajectory: Any) -> str:
    """The episode as text: the first observation, then each action (``>``) and what the env answered."""
    parts = [trajectory.first_observation]
    for turn in trajectory.turns:
        parts += [f"> {turn.action}", turn.observation]
    text = "\n".join(parts)
    return text if len(text) <= TRANSCRIPT_CHARS else text[: TRANSCRIPT_CHARS - 3] + "..."


def trajectory_table(trajectories: Sequence[Any], limit: int) -> Table:
    """Up to `limit` episodes, one per group in turn (so a small table still spans the step's tasks)."""
    groups: dict[int, list[Any]] = {}  # by group id (trackers import nothing above them: not records.group_by_id)
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
