"""A buffer of complete groups for asynchronous training: fresher groups first, nothing past the staleness bound.

In async mode the rollout of step s+1 runs while step s trains, so a group may have been sampled by weights a few
versions older than the trainer's. The buffer keeps whole groups (never single episodes: the group-mean advantage
needs all of them), tagged with the oldest policy version that sampled any of their episodes, and

* `take` serves the freshest groups first (highest policy version, then first come), because fresher samples
  need smaller importance-weight corrections (AReaL and the practitioners' notes make the same choice);
* groups more than `max_staleness` versions behind the trainer are evicted and counted, never trained on.

With partial rollouts (``per_turn``, `agentrl.rollout.partial`) the bound holds per turn: the trainer masks each turn
older than the bound out of the loss, so a group is evicted only when none of its turns is within it (nothing of it
could train). Groups are then served first come, first served: the stream already hands each step the groups that
completed first, and a group passed over for a fresher one would only lose more of its turns to the bound.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from agentrl.records import Trajectory

__all__ = ["Group", "FreshnessBuffer"]


@dataclass(frozen=True)
class Group:
    """The episodes of one task, complete.

    Attributes:
        trajectories: all `group_size` episodes, in order.
        policy_version: the oldest policy version among them.
        arrival: insertion order (ties between equal versions go first come, first served).
        newest_version: the newest policy version among their turns (`Turn.policy_version`; an episode's own where
            its turns carry none).
    """

    trajectories: tuple[Trajectory, ...]
    policy_version: int
    arrival: int
    newest_version: int = 0


class FreshnessBuffer:
    """Thread-safe store of complete groups, served freshest first within a staleness bound.

    Args:
        max_staleness: a group sampled by version v may train at trainer version t only if t - v <= max_staleness.
        per_turn: partial rollouts: v is the group's newest turn's version (its older turns are masked out of the
            loss by the trainer), and groups are served in arrival order; else v is its oldest, freshest first.
    """

    def __init__(self, max_staleness: int, per_turn: bool = False):
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self.max_staleness = max_staleness
        self.per_turn = per_turn
        self._groups: list[Group] = []
        self._arrivals = itertools.count()
        self._lock = threading.Lock()
        self.evicted = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._groups)

    def put(self, trajectories: Sequence[Trajectory]) -> None:
        """Add one complete group (all its episodes)."""
        if not trajectories:
            raise ValueError("a group needs at least one trajectory")
        if len({t.group_id for t in trajectories}) != 1:
            raise ValueError("put() takes the episodes of exactly one group")
        version = min(t.policy_version for t in trajectories)
        newest = max(max((turn.policy_version for turn in t.turns if turn.policy_version is not None),
                         default=t.policy_version) for t in trajectories)
        with self._lock:
            self._groups.append(Group(tuple(trajectories), version, next(self._arrivals), newest))

    def evict_stale(self, trainer_version: int) -> int:
        """Drop the groups too old for `trainer_version`; returns how many were dropped."""
        with self._lock:
            bound = trainer_version - self.max_staleness
            keep = [g for g in self._groups if (g.newest_version if self.per_turn else g.policy_version) >= bound]
            dropped = len(self._groups) - len(keep)
            self._groups = keep
            self.evicted += dropped
            return dropped

    def take(self, n_groups: int, trainer_version: int) -> list[Group]:
        """Evict stale groups, then remove and return up to `n_groups`, freshest first (`per_turn`: first come)."""
        self.evict_stale(trainer_version)
        with self._lock:
            order = sorted(self._groups, key=lambda g: (0 if self.per_turn else -g.policy_version, g.arrival))
            chosen, rest = order[:n_groups], order[n_groups:]
            self._groups = sorted(rest, key=lambda g: g.arrival)
            return chosen
