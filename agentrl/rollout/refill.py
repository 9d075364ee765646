"""Dynamic sampling that refills: roll out more tasks until the step has its number of groups with mixed rewards.

DAPO's dynamic sampling (and verl's, SkyRL's, ROLL's) keeps sampling until the batch holds ``prompts_per_step``
groups whose episodes did not all get the same reward: such a group has a zero group-mean advantage, so it adds
nothing to the gradient and a step of them learns less. `loss.dynamic_sampling` alone leaves those groups out of the
loss and trains on fewer; with ``scheduler.max_oversample > 1`` the scheduler (`agentrl.rollout.scheduler`, lockstep
and async alike) also refills the step:

1. The first draw is the step's own tasks (``seeds_for_step(step)``, unchanged: a run without the refill is bit for
   bit what it was).
2. While fewer than ``prompts_per_step`` of the groups drawn so far are mixed and the step has drawn fewer than
   ``max_tasks`` tasks, another round rolls out the step's next extra tasks: as many as fill the step at the mixed
   rate seen so far (Laplace-smoothed, ``(mixed + 1) / (drawn + 2)``), at most ``prompts_per_step`` (one more step's
   worth, as DAPO's next generation batch: the engines' memory plan holds) and at most what the bound leaves.
3. The step trains on the first ``prompts_per_step`` mixed groups in draw order. When the bound stops the refill
   short, the step keeps the mixed groups it found and fills up with uniform ones in draw order; the trainer's own
   filter (`agentrl.training.step.overlong_and_dynamic_sampling`) leaves those out of the loss, and a step with no
   mixed group at all skips its update as it always did. The bound being hit is logged and counted.

Mixed means "not every episode's ``total_return`` is equal", the rewards as the env gave them: the trainer judges its
filter after the KL reward penalty and the overlong shaping, which may differ for a group on the edge.

Seeds: the j-th extra task of step s is a function of (s, j) alone (`agentrl.config.SchedulerConfig.refill_seed`: a
seed range per step, apart from every step's first draw), so a resumed run replays the same extra tasks with no state
in the checkpoint, and a round's tasks are always the next ones of that fixed list whatever the round sizes were.
Every round numbers its groups after the ones drawn before it (``first_group``), so group ids stay unique in the
step and every episode gets a sampler seed of its own.

Counters (in ``stats.engine``, so they reach metrics.jsonl): ``dynamic_sampling_groups_drawn`` (tasks rolled out
this step, groups dropped for env failures included), ``dynamic_sampling_mixed`` (mixed groups among them, surplus
included), ``dynamic_sampling_rounds``, ``dynamic_sampling_bound_hit`` (1: the step has fewer mixed groups than it
wanted after drawing ``max_tasks``) and ``dynamic_sampling_drawn_reward_mean`` (the mean reward of every episode
of the complete groups drawn, groups dropped for env failures left out: the step's ``reward_mean`` is over the kept
groups, which the selection biases toward the middle).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agentrl.records import Trajectory, group_by_id
from agentrl.rollout.loop import RolloutInterrupted, RolloutResult, RolloutStats

__all__ = ["Refill", "fill_step", "is_mixed", "merge_stats"]

log = logging.getLogger(__name__)

Draw = Callable[[Sequence[int], int], RolloutResult]
"""``(seeds, first_group) -> result``: roll out one group per seed, numbering the groups from `first_group`."""


@dataclass(frozen=True)
class Refill:
    """How a step refills: the most tasks it may draw and where its extra tasks come from.

    Attributes:
        max_tasks: the most tasks one step may roll out, its first draw included (``scheduler.max_tasks``).
        extra_seed: ``(step, j) -> seed``: the j-th extra task of the step, for ``0 <= j < max_tasks - first draw``;
            a function of its arguments alone, so a resume replays the same tasks.
    """

    max_tasks: int
    extra_seed: Callable[[int, int], int]

    def __post_init__(self) -> None:
        if self.max_tasks < 1:
            raise ValueError(f"max_tasks must be >= 1, got {self.max_tasks}")


def is_mixed(group: Sequence[Trajectory]) -> bool:
    """Whether the group's episodes did not all get the same reward (a nonzero group-mean advantage)."""
    return any(t.total_return != group[0].total_return for t in group)


def merge_stats(a: RolloutStats, b: RolloutStats) -> RolloutStats:
    """The counters of two rollouts as one.

    Numbers add (wall times too: the rounds run one after another), lists append. Of the dicts, ``judge`` holds
    counters, which add key by key; ``engine`` holds rates and gauges (a prefix-cache hit rate does not add), where
    `b`'s value stands.
    """
    merged = {}
    for f in dataclasses.fields(RolloutStats):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, (int, float, list)):
            merged[f.name] = x + y
        elif f.name == "judge":
            merged[f.name] = {k: x.get(k, 0.0) + y.get(k, 0.0) for k in {**x, **y}}
        else:
            merged[f.name] = {**x, **y} if isinstance(x, dict) else y
    return RolloutStats(**merged)


def _round_size(target: int, drawn: int, mixed: int, left: int) -> int:
    """Tasks for the next round: enough to fill the step at the smoothed mixed rate, within a step's worth and bound."""
    missing = target - mixed
    return min(left, target, math.ceil(missing * (drawn + 2) / (mixed + 1)))


def fill_step(step: int, first_seeds: Sequence[int], draw: Draw, refill: Refill) -> RolloutResult:
    """The step's rollout, refilled until ``len(first_seeds)`` groups are mixed or `refill.max_tasks` are drawn.

    Args:
        step: the training step (its extra tasks are ``refill.extra_seed(step, j)``).
        first_seeds: the step's own tasks, drawn first.
        draw: rolls out one round.
        refill: the bound and the extra tasks.

    Returns:
        The kept groups (at most ``len(first_seeds)``, mixed first, in draw order), with every round's counters
        merged and the refill's counters in ``stats.engine``.

    Raises:
        RolloutInterrupted: Ctrl-C in any round; it carries every group finished so far.
    """
    target = len(first_seeds)
    result = draw(first_seeds, 0)
    trajectories, stats = list(result.trajectories), result.stats
    drawn, rounds = target, 1
    while True:
        groups = group_by_id(trajectories)
        mixed = sum(is_mixed(g) for g in groups.values())
        left = refill.max_tasks - drawn
        if mixed >= target or left <= 0:
            break
        n = _round_size(target, drawn, mixed, left)
        seeds = [refill.extra_seed(step, j) for j in range(drawn - target, drawn - target + n)]
        try:
            more = draw(seeds, drawn)
        except RolloutInterrupted as e:
            raise RolloutInterrupted(RolloutResult(trajectories + e.result.trajectories,
                                                   merge_stats(stats, e.result.stats))) from None
        trajectories += more.trajectories
        stats = merge_stats(stats, more.stats)
        drawn, rounds = drawn + n, rounds + 1
    ordered = sorted(groups)  # group ids follow the draw order
    kept = [g for g in ordered if is_mixed(groups[g])][:target]
    kept += [g for g in ordered if g not in kept][: max(0, target - len(kept))]
    bound_hit = mixed < target
    if bound_hit:
        log.warning("step %d: %d of %d groups have mixed rewards after drawing %d tasks in %d rounds (the bound, "
                    "scheduler.max_oversample); the step trains on what it has", step, mixed, target, drawn, rounds)
    stats.engine = {**stats.engine, "dynamic_sampling_groups_drawn": float(drawn),
                    "dynamic_sampling_mixed": float(mixed), "dynamic_sampling_rounds": float(rounds),
                    "dynamic_sampling_bound_hit": float(bound_hit),
                    "dynamic_sampling_drawn_reward_mean": (sum(t.total_return for t in trajectories)
                                                           / len(trajectories)) if trajectories else 0.0}
    keep = set(kept)
    return RolloutResult([t for t in trajectories if t.group_id in keep], stats)
