"""GiGPO step-level advantages for multi-turn episodes (Feng et al. 2025, "Group-in-Group Policy Optimization").

Episode-level advantages credit every turn of an episode with the same number. GiGPO adds a second, finer group:
episodes of the same task (one episode group) often pass through the same state, e.g. the ALFWorld room right after
`reset`, or the same page after the same click. Steps that act from an identical observation ("anchor state") form a
step group, and each step is compared with the others of its step group by its discounted return from that state on.

For the steps of episode i in episode group g, with per-step rewards r_t:
    A_E(i)      = F(R_i; {R_j : j in g})                   R_i = sum_t r_t (paper Eq. 3)
    G_t         = sum_{k >= t} gamma^(k - t) r_k           discounted return from step t (Eq. 5)
    A_S(i, t)   = F(G_t; {G_u : steps u of group g whose anchor observation equals step t's})   (Eqs. 6, 7)
    A(i, t)     = A_E(i) + step_weight * A_S(i, t)         (Eq. 8, omega = step_weight)
with F(x; X) = (x - mean X) / (std X + eps) (unbiased std; `normalize_std=True`, the paper's default) or x - mean X.

Anchor state: the observation the agent acted on at that step: `first_observation` for the first turn, the previous
turn's `observation` after that, compared as exact strings (verl-agent's default, without its similarity option).
Singleton groups (an episode alone in its group, a state only one step visited) get 0, the rule every estimator in
`agentrl.objective.advantages` follows. Defaults gamma = 0.95 and omega = 1 are verl-agent's.

GiGPO is registered in `agentrl.objective.advantages.ADVANTAGES` as "gigpo", with `GiGPOOptions`; its entry is a
"step"-level one, so `agentrl.objective.credit.turn_advantages` hands it every trajectory's `EpisodeSteps` rather
than one reward per episode.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.records import Trajectory

__all__ = [
    "EpisodeSteps", "GiGPOOptions", "StepGroupStats", "episode_steps", "gigpo_advantages", "gigpo_step_advantages",
    "discounted_returns", "step_group_stats",
]


@dataclass(frozen=True)
class GiGPOOptions:
    """GiGPO's options (the `advantage.options` of estimator "gigpo"); the defaults are verl-agent's.

    Attributes:
        gamma: discount of the step returns, in [0, 1].
        step_weight: omega, the weight of the step-level advantage (0 gives episode-level GRPO / group-mean).
        normalize_std: divide by the group's unbiased std (+ eps), as in the paper; False only centres.
        eps: added to the std.
    """

    gamma: float = 0.95
    step_weight: float = 1.0
    normalize_std: bool = True
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gigpo gamma must be in [0, 1], got {self.gamma}")
        if self.step_weight < 0:
            raise ValueError(f"gigpo step_weight must be >= 0, got {self.step_weight}")


@dataclass(frozen=True)
class EpisodeSteps:
    """What GiGPO needs from one episode.

    Attributes:
        group_id: the episode group (episodes of the same task).
        anchors: per step, the observation the agent acted on (any hashable key).
        rewards: per step, the env's reward for that step.
    """

    group_id: int
    anchors: tuple[Hashable, ...]
    rewards: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.anchors) != len(self.rewards):
            raise ValueError(f"one anchor per step: {len(self.anchors)} anchors, {len(self.rewards)} rewards")


def episode_steps(traj: Trajectory) -> EpisodeSteps:
    """The anchor observations and step rewards of a trajectory (the observation each turn acted on)."""
    observations = (traj.first_observation, *(t.observation for t in traj.turns[:-1]))
    return EpisodeSteps(traj.group_id, observations[: len(traj.turns)], tuple(t.reward for t in traj.turns))


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """G_t = r_t + gamma * G_{t+1}, computed backwards over one episode."""
    out, running = [0.0] * len(rewards), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def gigpo_advantages(episodes: Sequence[EpisodeSteps], **options: Any) -> list[tuple[float, ...]]:
    """`gigpo_step_advantages` with its options by keyword (`GiGPOOptions` fields; what is left out: its default).

    Raises:
        TypeError: on an option `GiGPOOptions` does not have.
        ValueError: on gamma outside [0, 1] or a negative step weight.
    """
    return gigpo_step_advantages(episodes, GiGPOOptions(**options))


def gigpo_step_advantages(episodes: Sequence[EpisodeSteps], opts: GiGPOOptions) -> list[tuple[float, ...]]:
    """One advantage per step of every episode: the episode-level one plus `step_weight` times the step-level one.

    Args:
        episodes: the batch's episodes.
        opts: gamma, step weight, std normalisation and eps.

    Returns:
        Per episode, a tuple with one float per step.
    """
    gamma, step_weight, normalize_std, eps = opts.gamma, opts.step_weight, opts.normalize_std, opts.eps
    totals = [sum(ep.rewards) for ep in episodes]
    episode_groups: dict[int, list[int]] = defaultdict(list)
    for i, ep in enumerate(episodes):
        episode_groups[ep.group_id].append(i)
    episode_adv = [0.0] * len(episodes)
    for members in episode_groups.values():
        for i, a in zip(members, _relative([totals[i] for i in members], normalize_std, eps)):
            episode_adv[i] = a

    returns = [discounted_returns(ep.rewards, gamma) for ep in episodes]
    step_adv = [[0.0] * len(ep.rewards) for ep in episodes]
    for members in _step_groups(episodes).values():
        for (i, t), a in zip(members, _relative([returns[i][t] for i, t in members], normalize_std, eps)):
            step_adv[i][t] = a
    return [tuple(episode_adv[i] + step_weight * a for a in step_adv[i]) for i in range(len(episodes))]


def _step_groups(episodes: Sequence[EpisodeSteps]) -> dict[tuple[int, Hashable], list[tuple[int, int]]]:
    """The steps (episode index, step index) that acted from each anchor state, per episode group."""
    groups: dict[tuple[int, Hashable], list[tuple[int, int]]] = defaultdict(list)
    for i, ep in enumerate(episodes):
        for t, anchor in enumerate(ep.anchors):
            groups[(ep.group_id, anchor)].append((i, t))
    return groups


@dataclass(frozen=True)
class StepGroupStats:
    """How much GiGPO's step groups have to work with in one batch (logged for every multi-turn run).

    Attributes:
        shared_frac: the fraction of steps whose anchor state another step of its episode group also acted from
            (a step alone in its step group gets a step advantage of 0).
        mixed_frac: the fraction of steps in a step group whose discounted returns differ: an upper bound on the
            steps with a nonzero step advantage (a step whose return is its group's mean gets 0 too).
    """

    shared_frac: float
    mixed_frac: float


def step_group_stats(episodes: Sequence[EpisodeSteps], gamma: float,
                     counted: Sequence[bool] | None = None) -> StepGroupStats:
    """`StepGroupStats` of a batch, with returns discounted by `gamma` (GiGPO's); zeros for a batch without steps.

    Args:
        episodes: every episode of the batch: the step groups are formed over all of them, as
            `gigpo_step_advantages` forms them (episodes a filter left out of the loss still count as partners).
        gamma: the discount of the returns compared within a step group.
        counted: per episode, whether its steps are counted (default: all), e.g. the ones left in the loss.
    """
    counted = [True] * len(episodes) if counted is None else list(counted)
    returns = [discounted_returns(ep.rewards, gamma) for ep in episodes]
    n_steps = sum(len(ep.rewards) for ep, c in zip(episodes, counted) if c)
    shared = mixed = 0
    for members in _step_groups(episodes).values():
        if len(members) > 1:
            ours = sum(counted[i] for i, _ in members)
            shared += ours
            if len({returns[i][t] for i, t in members}) > 1:
                mixed += ours
    return StepGroupStats(shared / n_steps, mixed / n_steps) if n_steps else StepGroupStats(0.0, 0.0)


def _relative(values: list[float], normalize_std: bool, eps: float) -> list[float]:
    """Each value relative to its group; a singleton group gives 0."""
    n = len(values)
    if n < 2:
        return [0.0] * n
    mean = sum(values) / n
    centred = [v - mean for v in values]
    if not normalize_std:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / (n - 1))
    return [c / (std + eps) for c in centred]
