"""Advantage estimators: one scalar per response from the rewards of its group, chosen by name from `ADVANTAGES`.

A group is the G responses sampled for one prompt (`group_ids` gives each response's group). Every estimator is a
pure function of one group's rewards `[G] -> [G]`; `compute_advantages` applies it group by group.

- "group_mean" (default, MiniRL): A = R - mean_G(R). The paper calls it "group-normalization" but divides by
  nothing; the std division is GRPO's.
- "grpo": A = (R - mean) / (std + 1e-6), unbiased std.
- "loo": leave-one-out baseline, A_i = R_i - mean_{j != i} R_j = G / (G - 1) * (R_i - mean).
- "low_success_weight": group_mean, with the positive advantages multiplied by 1 + boost * (1 - success_rate),
  so the rare successes on hard prompts pull harder. This one deliberately does NOT sum to zero in a group: the
  net push goes to the successes, and only on prompts the policy mostly fails.
- "passk": the analytic Pass@k advantage (Chen et al. 2025, "Pass@k Training"): the group reward is the
  probability that a random k-subset contains a success; each response gets its marginal share. Sums to zero.

Singleton groups, one rule for every estimator: a group of one response has no baseline to compare it with, so its
advantage is 0 (it trains nothing). `compute_advantages` applies the rule before calling the estimator. This departs
from verl's GRPO, which gives a singleton mean 0 and std 1, i.e. its raw reward: an uncentred reward would push
the policy toward whatever the lone response did, just because rewards happen to be positive.

Options come from the config (the `advantage` section, e.g. `{boost: 2.0}` for "low_success_weight" or `{k: 8}`
for "passk"); `check_advantage_options` validates them once, when the config is built.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["ADVANTAGES", "AdvantageSpec", "check_advantage_options", "compute_advantages", "informative_groups"]


def group_mean_advantage(rewards: Tensor) -> Tensor:
    """A = R - mean(R) over the group `[G]`."""
    return rewards - rewards.mean()


def grpo_advantage(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """A = (R - mean) / (std + eps) with the unbiased std, over a group of at least two responses."""
    return (rewards - rewards.mean()) / (rewards.std(unbiased=True) + eps)


def loo_advantage(rewards: Tensor) -> Tensor:
    """A_i = R_i - mean of the other responses' rewards, over a group of at least two responses."""
    g = rewards.numel()
    return (rewards - rewards.mean()) * (g / (g - 1))


def low_success_weight_advantage(rewards: Tensor, boost: float = 1.0, success_threshold: float = 1.0) -> Tensor:
    """Group-mean advantage with positives scaled by 1 + boost * (1 - success rate of the group).

    Args:
        rewards: `[G]` rewards of one group.
        boost: how much a success on a never-solved prompt is amplified (weight 1 + boost at success rate 0).
        success_threshold: a response with reward >= this counts as a success.
    """
    if boost < 0:
        raise ValueError(f"boost must be >= 0, got {boost}")
    adv = rewards - rewards.mean()  # [G]
    success_rate = (rewards >= success_threshold).to(rewards.dtype).mean()
    weight = 1.0 + boost * (1.0 - success_rate)
    return torch.where(adv > 0, adv * weight, adv)


def passk_advantage(rewards: Tensor, k: int = 4, success_threshold: float = 1.0, normalize: bool = True) -> Tensor:
    """Analytic Pass@k advantage for binary success.

    With G responses of which n_neg fail, the group's pass@k reward is R = 1 - C(n_neg, k) / C(G, k).
    A success gets 1 - R; a failure gets 1 - R - C(n_neg - 1, k - 1) / C(G - 1, k - 1) (its share of the subsets
    it spoils). Both are divided by sqrt(R (1 - R)) when `normalize` (0 when that is 0: no signal).

    Args:
        rewards: `[G]` rewards of one group.
        k: subset size; must satisfy 1 <= k <= G.
        success_threshold: a response with reward >= this counts as a success.
        normalize: divide by the std of the group's pass@k reward, as in the paper.
    """
    g = rewards.numel()
    if not 1 <= k <= g:
        raise ValueError(f"passk needs 1 <= k <= group size; got k={k}, group size {g}")
    success = rewards >= success_threshold  # [G]
    n_neg = int((~success).sum().item())
    group_reward = 1.0 - math.comb(n_neg, k) / math.comb(g, k)
    adv_pos = 1.0 - group_reward
    adv_neg = adv_pos - (math.comb(n_neg - 1, k - 1) / math.comb(g - 1, k - 1) if n_neg > 0 else 0.0)
    adv = torch.where(success, torch.full_like(rewards, adv_pos), torch.full_like(rewards, adv_neg))  # [G]
    if normalize:
        std = math.sqrt(group_reward * (1.0 - group_reward))
        adv = adv / std if std > 0 else torch.zeros_like(adv)
    return adv


@dataclass(frozen=True)
class AdvantageSpec:
    """A registered advantage estimator.

    Attributes:
        fn: per-group function `[G] -> [G]`, taking keyword options.
        description: one line for docs.
    """

    fn: Callable[..., Tensor]
    description: str


ADVANTAGES: dict[str, AdvantageSpec] = {
    "group_mean": AdvantageSpec(group_mean_advantage, "R - group mean (MiniRL, Dr.GRPO)"),
    "grpo": AdvantageSpec(grpo_advantage, "(R - group mean) / (unbiased std + eps)"),
    "loo": AdvantageSpec(loo_advantage, "leave-one-out baseline (RLOO)"),
    "low_success_weight": AdvantageSpec(low_success_weight_advantage, "group mean, positives boosted on hard prompts"),
    "passk": AdvantageSpec(passk_advantage, "analytic Pass@k group advantage (binary success)"),
}


def compute_advantages(name: str, rewards: Tensor, group_ids: Tensor, **options: Any) -> Tensor:
    """Compute one advantage per response, group by group.

    Args:
        name: a key of `ADVANTAGES`.
        rewards: `[N]` scalar reward per response.
        group_ids: `[N]` integer group (prompt) id per response; groups need not be contiguous.
        **options: keyword options of the estimator (e.g. `k=` for "passk", `boost=` for "low_success_weight").

    Returns:
        `[N]` float advantages, in the dtype of `rewards` (float32 for integer rewards); 0 for every response of a
        singleton group (the module's one rule).

    Raises:
        ValueError: on an unknown name or option, or shapes that do not match.
    """
    check_advantage_options(name, options)
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both be [N]; got {tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    if group_ids.is_floating_point():
        raise ValueError("group_ids must be an integer tensor")
    fn = ADVANTAGES[name].fn
    rewards = rewards.detach()
    rewards = rewards if rewards.is_floating_point() else rewards.to(torch.float32)
    advantages = torch.zeros_like(rewards)  # [N]
    for gid in torch.unique(group_ids):
        idx = (group_ids == gid).nonzero(as_tuple=True)[0]  # [G]
        if idx.numel() > 1:  # a singleton keeps its 0: no baseline exists
            advantages[idx] = fn(rewards[idx], **options)
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


def check_advantage_options(name: str, options: dict[str, Any]) -> None:
    """Raise a `ValueError` naming the problem if `name` is not an estimator or `options` are not its options.

    Args:
        name: a key of `ADVANTAGES`.
        options: keyword options for it.
    """
    if name not in ADVANTAGES:
        raise ValueError(f"unknown advantage estimator {name!r}; choose one of {', '.join(ADVANTAGES)}")
    valid = [p for p in inspect.signature(ADVANTAGES[name].fn).parameters if p != "rewards"]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for advantage estimator {name!r}; "
            f"valid options: {', '.join(valid) or '(none)'}"
        )
