"""The step's metrics, built from what each stage reports, and the curves plotted from metrics.jsonl.

The rows are written by `agentrl.trackers.runlog` (`RunLog.metrics`, `append_metrics`), one JSON line per step.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from agentrl.training.backend import LossResult

__all__ = ["weighted_mean", "rollout_metrics", "plot_metrics"]


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
    """Reward, success, lengths and template health of the step's trajectories.

    ``truncated_frac`` is the share of episodes a budget ended (the env's, ``max_turns``, the context); a reply cut
    at the per-turn token limit need not end its episode (the env answers it like any other), so
    ``length_cut_frac`` counts those apart: the share of episodes with a reply that stopped at its token budget
    (the engine's ``finish_reason == "length"``), as `agentrl inspect` counts it and the collapse guard's
    ``length_cut_max`` reads it.
    """
    turns = [t for traj in trajectories for t in traj.turns]
    return {
        "reward_mean": float(rewards.mean()),
        "success_rate": sum(t.success for t in trajectories) / len(trajectories),
        "response_tokens_mean": sum(len(t.generated_ids) for t in turns) / max(len(turns), 1),
        "turns_mean": len(turns) / len(trajectories),
        "prefix_breaks": sum(t.new_segment for t in turns),
        "roundtrip_mismatch_rate": sum(bool(t.roundtrip_drift) for t in turns) / max(len(turns), 1),
        "truncated_frac": sum(t.truncated for t in trajectories) / len(trajectories),
        "length_cut_frac": sum(any(x.finish_reason == "length" for x in t.turns) for t in trajectories)
        / len(trajectories),
    }


def plot_metrics(metrics_path: Path, png_path: Path, panels: Sequence[tuple[str, str]], title: str,
                 columns: int = 3) -> None:
    """One panel per metric of metrics.jsonl against the step, saved as a PNG (nothing when no step finished).

    Args:
        metrics_path: the run's metrics.jsonl.
        png_path: where the figure goes.
        panels: (key, panel title) pairs; a step without the key plots as a gap.
        title: the figure's title.
        columns: panels per row.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not metrics_path.exists():
        return
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    if not rows:
        return
    n_rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(n_rows, columns, figsize=(4 * columns, 3 * n_rows), squeeze=False)
    steps = [r["step"] for r in rows]
    for ax, (key, name) in zip(axes.ravel(), panels):
        ax.plot(steps, [r.get(key) if r.get(key) is not None else float("nan") for r in rows], marker="o", ms=3)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
