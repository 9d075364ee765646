"""KL to a frozen reference policy: as a loss term, or as a penalty on the reward.

Both use the same per-token estimators (Schulman, "Approximating KL divergence", 2020) of KL(pi || pi_ref) from
samples of pi, with x = log pi_ref - log pi at the sampled token:

    k1 = -x                    unbiased, can be negative; its gradient is the plain log-ratio
    k2 = 0.5 x^2               biased, >= 0
    k3 = e^x - 1 - x           unbiased, >= 0, low variance ("low_var_kl" in verl)

k3 follows verl: x is clamped to [-20, 20] before the exponential and the result to [-10, 10], so one token the
reference finds absurd cannot dominate the loss.

- In the loss (`kl_coef` in the loss options, GRPO-style): `loss += kl_coef * agg(k(logp, ref_logp))`, with the
  gradient flowing through `logp`. `agentrl.objective.policy_loss` adds it when given `ref_logp`.
- In the reward (PPO-style): `R_i -= coef * sum_t k(old_logp, ref_logp)` over the response's tokens, before the
  advantages are computed; no gradient. `kl_reward_penalty` computes the per-response penalty.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["KL_ESTIMATORS", "kl_penalty", "kl_reward_penalty"]

KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")

_LOG_RATIO_CLAMP = 20.0
_K3_CLAMP = 10.0


def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) at the sampled tokens.

    Args:
        logp: `[N, T]` log pi of the sampled tokens (may carry grad).
        ref_logp: `[N, T]` log pi_ref of the same tokens (no grad needed).
        estimator: "k1", "k2" or "k3".

    Returns:
        `[N, T]` estimates; the caller masks padding.

    Raises:
        ValueError: on an unknown estimator.
    """
    log_ratio = logp - ref_logp.detach()  # [N, T] log pi - log pi_ref
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        x = (-log_ratio).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)  # [N, T] log pi_ref - log pi
        return (x.exp() - 1 - x).clamp(-_K3_CLAMP, _K3_CLAMP)
    raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {', '.join(KL_ESTIMATORS)}")


def kl_reward_penalty(
    old_logp: Tensor, ref_logp: Tensor, mask: Tensor, coef: float, estimator: str = "k1"
) -> Tensor:
    """Per-response reward penalty `coef * sum_t k(old_logp, ref_logp)` over the response tokens.

    The rollout policy's log-probs (`old_logp`, pi_old) are compared with the reference's: the penalty is part of the
    reward of the sampled response, so it carries no gradient. Padding never contributes, whatever it holds.

    Args:
        old_logp: `[N, T]` log pi_old of the sampled tokens.
        ref_logp: `[N, T]` log pi_ref of the same tokens.
        mask: `[N, T]` response mask.
        coef: the penalty coefficient beta (>= 0).
        estimator: "k1" (verl's default for the reward penalty), "k2" or "k3".

    Returns:
        `[N]` penalties, to subtract from the rewards.
    """
    if coef < 0:
        raise ValueError(f"the KL reward coefficient must be >= 0, got {coef}")
    m = mask.bool()  # [N, T]
    zero = torch.zeros((), dtype=old_logp.dtype, device=old_logp.device)
    per_token = kl_penalty(torch.where(m, old_logp.detach(), zero), torch.where(m, ref_logp.detach(), zero), estimator)
    return coef * torch.where(m, per_token, zero).sum(dim=1)  # [N]
