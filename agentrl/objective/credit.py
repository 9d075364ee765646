"""Credit assignment: one advantage per turn of every trajectory, from any configured estimator.

The trainer needs the advantage of each turn (its tokens are trained with it). Episode-level estimators
(`agentrl.objective.advantages.ADVANTAGES`: group_mean, grpo, loo, ...) give every turn of an episode the episode's
advantage; "gigpo" (`agentrl.objective.gigpo`) adds a step-level term, so turns of one episode can differ.

    per_turn = turn_advantages("group_mean", trajectories, {})       # list of tuples, one float per turn
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch

from agentrl.objective.advantages import ADVANTAGES, check_advantage_options, compute_advantages
from agentrl.objective.gigpo import episode_steps, gigpo_advantages
from agentrl.records import Trajectory

__all__ = ["TURN_ESTIMATORS", "check_turn_advantage_options", "turn_advantages"]

TURN_ESTIMATORS: tuple[str, ...] = (*ADVANTAGES, "gigpo")
"""Every name `advantage.name` accepts."""


def check_turn_advantage_options(name: str, options: dict[str, Any]) -> None:
    """Raise a `ValueError` naming the problem unless `name` is an estimator and `options` are its options."""
    if name != "gigpo":
        check_advantage_options(name, options)
        return
    valid = [p for p in inspect.signature(gigpo_advantages).parameters if p != "episodes"]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(map(repr, unknown))} for advantage estimator 'gigpo'; "
                         f"valid options: {', '.join(valid)}")


def turn_advantages(
    name: str, trajectories: Sequence[Trajectory], options: dict[str, Any]
) -> list[tuple[float, ...]]:
    """Advantages of every turn of every trajectory.

    Args:
        name: one of `TURN_ESTIMATORS`.
        trajectories: the step's trajectories; `group_id` groups episodes of the same task.
        options: the estimator's keyword options (the `advantage` section's fields that are set).

    Returns:
        Per trajectory, a tuple with one float per turn.
    """
    check_turn_advantage_options(name, options)
    if name == "gigpo":
        return gigpo_advantages([episode_steps(t) for t in trajectories], **options)
    rewards = torch.tensor([t.total_return for t in trajectories], dtype=torch.float64)  # [N]
    group_ids = torch.tensor([t.group_id for t in trajectories], dtype=torch.long)  # [N]
    episode = compute_advantages(name, rewards, group_ids, **options).tolist()  # [N]
    return [(a,) * len(t.turns) for a, t in zip(episode, trajectories)]
