"""Advantage estimators, chosen by name from `ADVANTAGES`, each with its own typed options; GiGPO is one of them.

Each entry of `ADVANTAGES` names its function, its frozen options dataclass (defaults = the estimator's defaults) and
its level, which says what the function reads:

- "episode": one scalar per response from the rewards of its group. A group is the G responses sampled for one
  prompt (`group_ids` gives each response's group); the function is pure over one group, `[G] -> [G]`, and
  `compute_advantages` applies it group by group.
- "step": one advantage per step of every episode, from the episodes' `EpisodeSteps` (per-step rewards and anchor
  states); `agentrl.objective.credit.turn_advantages` builds them from the trajectories.

The estimators:

- "group_mean" (default, MiniRL): A = R - mean_G(R). The paper calls it "group-normalization" but divides by
  nothing; the std division is GRPO's.
- "grpo": A = (R - mean) / (std + eps), unbiased std.
- "loo": leave-one-out baseline, A_i = R_i - mean_{j != i} R_j = G / (G - 1) * (R_i - mean).
- "low_success_weight": group_mean, with the positive advantages multiplied by 1 + boost * (1 - success_rate),
  so the rare successes on hard prompts pull harder. This one deliberately does NOT sum to zero in a group: the
  net push goes to the successes, and only on prompts the policy mostly fails.
- "passk": the analytic Pass@k advantage (Chen et al. 2025, "Pass@k Training"): the group reward is the
  probability that a random k-subset contains a success; each response gets its marginal share. Sums to zero.
- "gigpo" (step level, `agentrl.objective.gigpo`): the episode-level GRPO advantage plus a step-level one over the
  steps of a group's episodes that acted from the same observation.

Singleton groups, one rule for every estimator: a group of one response has no baseline to compare it with, so its
advantage is 0 (it trains nothing). `compute_advantages` applies the rule before calling the estimator (GiGPO applies
it to its episode and step groups). This departs from verl's GRPO, which gives a singleton mean 0 and std 1, i.e. its
raw reward: an uncentred reward would push the policy toward whatever the lone response did, just because rewards
happen to be positive.

Options come from the config (the `advantage` section: `estimator` and `options`, e.g. `{boost: 2.0}` for
"low_success_weight" or `{k: 8}` for "passk"); `advantage_options` builds the estimator's dataclass from them and
names any key it does not have, with the valid ones. The config checks them once, when it is built.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from agentrl.objective.gigpo import GiGPOOptions, gigpo_step_advantages

__all__ = [
    "ADVANTAGES",
    "AdvantageSpec",
    "GroupMeanOptions",
    "GRPOOptions",
    "LOOOptions",
    "LowSuccessWeightOptions",
    "PassKOptions",
    "GiGPOOptions",
    "advantage_options",
    "compute_advantages",
    "informative_groups",
]


@dataclass(frozen=True)
class GroupMeanOptions:
    """"group_mean" has no options."""


@dataclass(frozen=True)
class GRPOOptions:
    """"grpo"'s options.

    Attributes:
        eps: added to the unbiased std.
    """

    eps: float = 1e-6


@dataclass(frozen=True)
class LOOOptions:
    """"loo" has no options."""


@dataclass(frozen=True)
class LowSuccessWeightOptions:
    """"low_success_weight"'s options.

    Attributes:
        boost: how much a success on a never-solved prompt is amplified (weight 1 + boost at success rate 0), >= 0.
        success_threshold: a response with reward >= this counts as a success.
    """

    boost: float = 1.0
    success_threshold: float = 1.0

    def __post_init__(self) -> None:
        if self.boost < 0:
            raise ValueError(f"boost must be >= 0, got {self.boost}")


@dataclass(frozen=True)
class PassKOptions:
    """"passk"'s options.

    Attributes:
        k: subset size, >= 1; every group needs at least k responses (`scheduler.group_size` >= k).
        success_threshold: a response with reward >= this counts as a success.
        normalize: divide by the std of the group's pass@k reward, as in the paper.
    """

    k: int = 4
    success_threshold: float = 1.0
    normalize: bool = True

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"passk needs k >= 1, got {self.k}")


def group_mean_advantage(rewards: Tensor, opts: GroupMeanOptions) -> Tensor:
    """A = R - mean(R) over the group `[G]`."""
    return rewards - rewards.mean()


def grpo_advantage(rewards: Tensor, opts: GRPOOptions) -> Tensor:
    """A = (R - mean) / (std + eps) with the unbiased std, over a group of at least two responses."""
    return (rewards - rewards.mean()) / (rewards.std(unbiased=True) + opts.eps)


def loo_advantage(rewards: Tensor, opts: LOOOptions) -> Tensor:
    """A_i = R_i - mean of the other responses' rewards, over a group of at least two responses."""
    g = rewards.numel()
    return (rewards - rewards.mean()) * (g / (g - 1))


def low_success_weight_advantage(rewards: Tensor, opts: LowSuccessWeightOptions) -> Tensor:
    """Group-mean advantage with positives scaled by 1 + boost * (1 - success rate of the group), over `[G]`."""
    adv = rewards - rewards.mean()  # [G]
    success_rate = (rewards >= opts.success_threshold).to(rewards.dtype).mean()
    weight = 1.0 + opts.boost * (1.0 - success_rate)
    return torch.where(adv > 0, adv * weight, adv)


def passk_advantage(rewards: Tensor, opts: PassKOptions) -> Tensor:
    """Analytic Pass@k advantage for binary success, over `[G]`.

    With G responses of which n_neg fail, the group's pass@k reward is R = 1 - C(n_neg, k) / C(G, k).
    A success gets 1 - R; a failure gets 1 - R - C(n_neg - 1, k - 1) / C(G - 1, k - 1) (its share of the subsets
    it spoils). Both are divided by sqrt(R (1 - R)) when `opts.normalize` (0 when that is 0: no signal).

    Raises:
        ValueError: a group smaller than k.
    """
    k, g = opts.k, rewards.numel()
    if not 1 <= k <= g:
        raise ValueError(f"passk needs 1 <= k <= group size; got k={k}, group size {g}")
    success = rewards >= opts.success_threshold  # [G]
    n_neg = int((~success).sum().item())
    group_reward = 1.0 - math.comb(n_neg, k) / math.comb(g, k)
    adv_pos = 1.0 - group_reward
    adv_neg = adv_pos - (math.comb(n_neg - 1, k - 1) / math.comb(g - 1, k - 1) if n_neg > 0 else 0.0)
    adv = torch.where(success, torch.full_like(rewards, adv_pos), torch.full_like(rewards, adv_neg))  # [G]
    if opts.normalize:
        std = math.sqrt(group_reward * (1.0 - group_reward))
        adv = adv / std if std > 0 else torch.zeros_like(adv)
    return adv


def _any_group_size(opts: Any) -> int:
    """No minimum: a group of one gets 0 (the singleton rule), any larger group works."""
    return 1


@dataclass(frozen=True)
class AdvantageSpec:
    """A registered advantage estimator.

    Attributes:
        fn: the estimator, `fn(x, opts)`. At level "episode" x is one group's rewards `[G]` and it returns `[G]`;
            at level "step" x is the batch's `EpisodeSteps` and it returns, per episode, one float per step.
        options: its frozen options dataclass; the defaults are the estimator's defaults.
        description: one line for docs.
        level: "episode" (one advantage per response, from its group's rewards) or "step" (one per step, from each
            episode's step rewards and anchor states): what `agentrl.objective.credit` hands `fn`.
        min_group_size: the fewest responses a group needs under given options (passk: k), checked against
            `scheduler.group_size` when the config is built.
    """

    fn: Callable[..., Any]
    options: type
    description: str
    level: Literal["episode", "step"] = "episode"
    min_group_size: Callable[[Any], int] = _any_group_size


ADVANTAGES: dict[str, AdvantageSpec] = {
    "group_mean": AdvantageSpec(group_mean_advantage, GroupMeanOptions, "R - group mean (MiniRL, Dr.GRPO)"),
    "grpo": AdvantageSpec(grpo_advantage, GRPOOptions, "(R - group mean) / (unbiased std + eps)"),
    "loo": AdvantageSpec(loo_advantage, LOOOptions, "leave-one-out baseline (RLOO)"),
    "low_success_weight": AdvantageSpec(low_success_weight_advantage, LowSuccessWeightOptions,
                                        "group mean, positives boosted on hard prompts"),
    "passk": AdvantageSpec(passk_advantage, PassKOptions, "analytic Pass@k group advantage (binary success)",
                           min_group_size=lambda opts: opts.k),
    "gigpo": AdvantageSpec(gigpo_step_advantages, GiGPOOptions,
                           "GiGPO: episode-level GRPO + step-level advantage over shared anchor states",
                           level="step"),
}


def advantage_options(name: str, **options: Any) -> Any:
    """Build the typed options of estimator `name`, rejecting options it does not have.

    Integers are accepted for float options (YAML writes ``2`` for 2.0) and become floats.

    Args:
        name: a key of `ADVANTAGES`.
        **options: overrides of the defaults (the config's ``advantage.options``).

    Returns:
        The estimator's frozen options dataclass (`ADVANTAGES[name].options`).

    Raises:
        ValueError: on an unknown estimator or option (naming the valid ones), a value of the wrong type or out of
            range.
    """
    if name not in ADVANTAGES:
        raise ValueError(f"unknown advantage estimator {name!r}; choose one of {', '.join(ADVANTAGES)}")
    cls = ADVANTAGES[name].options
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for advantage estimator {name!r}; "
            f"valid options: {', '.join(valid) or '(none)'}"
        )
    hints = typing.get_type_hints(cls)
    return cls(**{key: _typed(name, key, value, hints[key]) for key, value in options.items()})


def _typed(name: str, key: str, value: Any, tp: type) -> Any:
    """`value` as option `key` of type `tp` (an int for a float becomes a float); a bool is no number here."""
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, tp) or (tp is not bool and isinstance(value, bool)):
        raise ValueError(f"option {key!r} of advantage estimator {name!r} must be {tp.__name__}, got {value!r}")
    return value


def compute_advantages(name: str, rewards: Tensor, group_ids: Tensor, **options: Any) -> Tensor:
    """Compute one advantage per response, group by group, with an episode-level estimator.

    Args:
        name: a key of `ADVANTAGES` whose level is "episode" (a step-level one, GiGPO, needs the episodes' steps:
            `agentrl.objective.credit.turn_advantages`).
        rewards: `[N]` scalar reward per response.
        group_ids: `[N]` integer group (prompt) id per response; groups need not be contiguous.
        **options: keyword options of the estimator (e.g. `k=` for "passk", `boost=` for "low_success_weight").

    Returns:
        `[N]` float advantages, in the dtype of `rewards` (float32 for integer rewards); 0 for every response of a
        singleton group (the module's one rule).

    Raises:
        ValueError: on an unknown name or option, a step-level estimator, or shapes that do not match.
    """
    opts = advantage_options(name, **options)
    spec = ADVANTAGES[name]
    if spec.level != "episode":
        raise ValueError(f"advantage estimator {name!r} gives one advantage per step from the episodes' steps, not "
                         f"one per response from rewards: use agentrl.objective.credit.turn_advantages")
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both be [N]; got {tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    if group_ids.is_floating_point():
        raise ValueError("group_ids must be an integer tensor")
    rewards = rewards.detach()
    rewards = rewards if rewards.is_floating_point() else rewards.to(torch.float32)
    advantages = torch.zeros_like(rewards)  # [N]
    for gid in torch.unique(group_ids):
        idx = (group_ids == gid).nonzero(as_tuple=True)[0]  # [G]
        if idx.numel() > 1:  # a singleton keeps its 0: no baseline exists
            advantages[idx] = spec.fn(rewards[idx], opts)
    return advantages


def informative_groups(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """DAPO dynamic sampling: which responses belong to a group whose rewards are not all equal.

    A group where every response got the same reward has zero group-mean advantage, so it only dilutes the batch.

    Args:
        rewards: `[N]` rewards.
        group_ids: `[N]` integer group ids.

    Returns:
        `[N]` bool, True for responses to keep.
    """
    keep = torch.zeros_like(group_ids, dtype=torch.bool)  # [N]
    for gid in torch.unique(group_ids):
        idx = group_ids == gid  # [N]
        r = rewards[idx]
        keep[idx] = bool((r != r[0]).any().item())
    return keep

