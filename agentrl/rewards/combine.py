"""Combining a judge's score with the env's rule reward: weights and a gate (`agentrl.config.RewardConfig`).

    reward = rule_weight * rule + judge_weight * judge

`rule` is the env's reward for the episode (the sum of its turns' rewards); `judge` is the judge's score mapped to
[0, 1]. With a gate, only episodes whose rule reward is at least the gate are sent to the judge (e.g. judge the
quality of solved episodes only); the others take ``below_gate`` as their judge term. That value is declared in the
config: it is never what a failed judge call turns into (a failed call drops the episode's group instead, see
`agentrl.rewards.judge`).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.config import RewardConfig

__all__ = ["CombinedReward", "passes_gate", "combine"]


@dataclass(frozen=True)
class CombinedReward:
    """An episode's reward and the two parts it came from.

    Attributes:
        reward: the combined reward (what the trainer reads as the episode's return).
        rule: the env's rule reward.
        judge: the judge's score on [0, 1]; None when the episode was below the gate and never judged.
    """

    reward: float
    rule: float
    judge: float | None


def passes_gate(rule: float, cfg: RewardConfig) -> bool:
    """Whether an episode with rule reward `rule` goes to the judge (always, without a gate)."""
    return cfg.gate is None or rule >= cfg.gate


def combine(rule: float, judge: float | None, cfg: RewardConfig) -> CombinedReward:
    """The episode's reward from its rule reward and its judged score (None: below the gate, not judged).

    Raises:
        ValueError: `judge` is None for an episode that passes the gate (its score was never obtained: such an
            episode must not be trained on), or a score outside [0, 1].
    """
    if judge is None:
        if passes_gate(rule, cfg):
            raise ValueError(f"an episode with rule reward {rule} passes the gate {cfg.gate} and needs a judged score")
        term = cfg.below_gate
    else:
        if not 0.0 <= judge <= 1.0:
            raise ValueError(f"a judged score must be in [0, 1] (mapped from the rubric's scale), got {judge}")
        term = judge
    return CombinedReward(cfg.rule_weight * rule + cfg.judge_weight * term, rule, judge)
