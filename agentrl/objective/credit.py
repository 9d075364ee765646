"""Credit assignment: one advantage per turn of every trajectory, from any registered estimator.

The trainer needs the advantage of each turn (its tokens are trained with it). What an estimator reads is declared by
its `ADVANTAGES` entry (`agentrl.objective.advantages.AdvantageSpec.level`), and this module hands it that:

- level "episode" (group_mean, grpo, loo, low_success_weight, passk): each episode's total return, grouped by task;
  every turn of an episode gets the episode's advantage.
- level "step" (gigpo): each episode's `EpisodeSteps` (per-turn rewards and the observation each turn acted on, its
  anchor state); turns of one episode can differ.

    per_turn = turn_advantages("group_mean", trajectories, {})       # list of tuples, one float per turn
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from agentrl.objective.advantages import ADVANTAGES, advantage_options, compute_advantages
from agentrl.objective.gigpo import episode_steps
from agentrl.records import Trajectory

__all__ = ["turn_advantages"]


def turn_advantages(
    name: str, trajectories: Sequence[Trajectory], options: Mapping[str, Any] | None = None
) -> list[tuple[float, ...]]:
    """Advantages of every turn of every trajectory.

    Args:
        name: a key of `ADVANTAGES`.
        trajectories: the step's trajectories; `group_id` groups episodes of the same task.
        options: the estimator's options (the config's ``advantage.options``); what is left out takes its default.

    Returns:
        Per trajectory, a tuple with one float per turn.

    Raises:
        ValueError: on an unknown estimator or option (naming the valid ones).
    """
    options = dict(options or {})
    opts = advantage_options(name, **options)
    spec = ADVANTAGES[name]
    if spec.level == "step":
        return spec.fn([episode_steps(t) for t in trajectories], opts)
    rewards = torch.tensor([t.total_return for t in trajectories], dtype=torch.float64)  # [N]
    group_ids = torch.tensor([t.group_id for t in trajectories], dtype=torch.long)  # [N]
    episode = compute_advantages(name, rewards, group_ids, **options).tolist()  # [N]
    return [(a,) * len(t.turns) for a, t in zip(episode, trajectories)]
