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

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["OVERLONG_MODES", "OverlongConfig", "overlong_penalty", "apply_overlong"]

OVERLONG_MODES: tuple[str, ...] = ("none", "filter", "penalize")


@dataclass(frozen=True)
class OverlongConfig:
    """How to treat responses that hit the length budget.

    Attributes:
        mode: "none", "filter" or "penalize".
        max_length: the response length budget L_max (tokens); needed by "penalize".
        cache_length: the soft band L_cache before L_max where the penalty ramps up (DAPO: 4096 of 20480).
        penalty_factor: the penalty at and beyond L_max.
    """

    mode: str = "none"
    max_length: int | None = None
    cache_length: int = 4096
    penalty_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.mode not in OVERLONG_MODES:
            raise ValueError(f"unknown overlong mode {self.mode!r}; choose one of {', '.join(OVERLONG_MODES)}")
        if self.mode == "penalize":
            if self.max_length is None or self.max_length <= 0:
                raise ValueError("overlong mode 'penalize' needs max_length > 0")
            if not 0 < self.cache_length <= self.max_length:
                raise ValueError(f"cache_length must be in (0, max_length]; got {self.cache_length}")


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
    rewards: Tensor, lengths: Tensor, truncated: Tensor, mask: Tensor, config: OverlongConfig
) -> tuple[Tensor, Tensor]:
    """Apply the configured overlong treatment.

    Args:
        rewards: `[N]` rewards.
        lengths: `[N]` response lengths (tokens).
        truncated: `[N]` bool, True where generation stopped at the budget.
        mask: `[N, T]` loss mask.
        config: the `OverlongConfig`.

    Returns:
        `(rewards [N], mask [N, T])`, new tensors; the inputs are not modified.
    """
    if config.mode == "filter":
        keep = (~truncated.bool()).unsqueeze(1)  # [N, 1]
        new_mask = mask & keep if mask.dtype == torch.bool else mask * keep.to(mask.dtype)  # [N, T]
        return rewards.clone(), new_mask
    if config.mode == "penalize":
        penalty = overlong_penalty(lengths, config.max_length, config.cache_length, config.penalty_factor)  # [N]
        return rewards + penalty.to(rewards.dtype), mask.clone()
    return rewards.clone(), mask.clone()
