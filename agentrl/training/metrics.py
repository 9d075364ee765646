"""The step's metrics: one JSON line per step in metrics.jsonl, built from what each stage reports."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from agentrl.training.backend import LossResult

__all__ = ["weighted_mean", "rollout_metrics", "append_metrics"]


def weighted_mean(results: Sequence[LossResult]) -> dict[str, float]:
    """Token-weighted mean of the per-micro-batch loss metrics; keys ending in _max take the max."""
    rows = [(r.loss_tokens, r.metrics) for r in results]
    total = sum(w for w, _ in rows) or 1.0
    out: dict[str, float] = {}
    for key in rows[0][1] if rows else []:
        values = [m[key] for _, m in rows]
        out[key] = max(values) if key.endswith("_max") else sum(w * m[key] for w, m in rows) / total
    return out


def rollout_metrics(trajectories: Sequence[Any], rewards: torch.Tensor) -> dict[str, float]:
    """Reward, success, lengths and template health of the step's trajectories."""
    turns = [t for traj in trajectories for t in traj.turns]
    return {
        "reward_mean": float(rewards.mean()),
        "success_rate": sum(t.success for t in trajectories) / len(trajectories),
        "response_tokens_mean": sum(len(t.generated_ids) for t in turns) / max(len(turns), 1),
        "turns_mean": len(turns) / len(trajectories),
        "prefix_breaks": sum(t.new_segment for t in turns),
        "roundtrip_mismatch_rate": sum(bool(t.roundtrip_drift) for t in turns) / max(len(turns), 1),
        "truncated_frac": sum(t.truncated for t in trajectories) / len(trajectories),
    }


def append_metrics(path: Path, metrics: dict[str, Any]) -> None:
    """Append one JSON line; non-finite floats become null (JSON has no NaN)."""
    with open(path, "a") as f:
        f.write(json.dumps({k: (v if not isinstance(v, float) or math.isfinite(v) else None)
                            for k, v in metrics.items()}) + "\n")
