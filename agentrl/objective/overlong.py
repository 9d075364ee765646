"""Overlong responses: filter them out of the loss or penalise them in the reward (configurable).

A response cut off at the generation budget has no final answer, so its reward says little about its tokens.
DAPO offers two remedies, both here:

- "filter": drop truncated responses from the loss (their mask rows become zero), so the policy is neither
  rewarded nor punished for an unfinished answer.
- "penalize": soft overlong punishment, r += min(-(|y| - (L_max - L_cache)) / L_cache * factor, 0), clipped at
  -factor: nothing until the last `L_cache` tokens of the budget, then a linear ramp.
- "none": leave rewards and masks alone.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

__all__ = ["OverlongSettings", "overlong_penalty", "apply_overlong"]


class OverlongSettings(Protocol):
    """What `apply_overlong` reads.

    The run config's ``loss.overlong`` section (`agentrl.config.OverlongConfig`, the one definition, with each
    field's meaning) has these fields; the objective does not import the config.
    """

    mode: str
    max_length: int | None
    cache_length: int
    penalty_factor: float


def overlong_penalty(lengths: Tensor, max_length: int, cache_length: int, factor: float = 1.0) -> Tensor:
    """DAPO soft overlong punishment per response.

    Args:
        lengths: `[N]` response lengths in tokens.
        max_length: L_max.
        cache_length: L_cache.
        factor: the penalty at and beyond L_max.

    Returns:
        `[N]` penalties in [-factor, 0].
    """
    excess = lengths.to(torch.float32) - (max_length - cache_length)  # [N]
    return (-excess / cache_length * factor).clamp(min=-factor, max=0.0)


def apply_overlong(
    rewards: Tensor, lengths: Tensor, truncated: Tensor, mask: Tensor, config: OverlongSettings
) -> tuple[Tensor, Tensor]:
    """Apply the configured overlong treatment.

    Args:
        rewards: `[N]` rewards.
        lengths: `[N]` response lengths (tokens).
        truncated: `[N]` bool, True where generation stopped at the budget.
        mask: `[N, T]` loss mask.
        config: the ``loss.overlong`` section (`agentrl.config.OverlongConfig`); "penalize" needs its `max_length`.

    Returns:
        `(rewards [N], mask [N, T])`, new tensors; the inputs are not modified.

    Raises:
        ValueError: "penalize" without a max_length, or a mode other than none, filter and penalize.
    """
    if config.mode == "filter":
        keep = (~truncated.bool()).unsqueeze(1)  # [N, 1]
        new_mask = mask & keep if mask.dtype == torch.bool else mask * keep.to(mask.dtype)  # [N, T]
        return rewards.clone(), new_mask
    if config.mode == "penalize":
        if config.max_length is None:
            raise ValueError("overlong mode 'penalize' needs max_length: the response length budget (the trainer "
                             "fills in the per-turn token budget)")
        penalty = overlong_penalty(lengths, config.max_length, config.cache_length, config.penalty_factor)  # [N]
        return rewards + penalty.to(rewards.dtype), mask.clone()
    if config.mode != "none":
        raise ValueError(f"unknown overlong mode {config.mode!r}; choose none, filter or penalize")
    return rewards.clone(), mask.clone()
