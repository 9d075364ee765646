"""Per-step diagnostics: policy entropy, KL(mu || pi_old) estimators, IS-weight health.

The paper's two early-warning signals [Zheng et al. 2025, §4.2] are the entropy of pi over the full vocabulary at the
sampled prefixes, and the training-inference KL(mu_old || pi_old) = E_mu[log mu - log pi_old]; collapse shows up as
entropy falling and that KL rising. The policy loss already reports the KL and IS metrics of its own batch
(`policy_loss` metrics); this module holds the pieces that need logits or whole-batch views.

KL estimators from samples of mu, with rho = pi_old / mu (Schulman's k1 / k2 / k3):
    k1 = -log rho                unbiased, can be negative
    k2 = 0.5 (log rho)^2         biased, >= 0
    k3 = rho - 1 - log rho       unbiased, >= 0
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["token_entropy", "masked_mean", "kl_estimates", "importance_weight_stats"]


def token_entropy(logits: Tensor, chunk_size: int = 1024) -> Tensor:
    """Entropy of the softmax over the vocabulary at every position.

    Works chunk by chunk over the sequence so a `[N, T, V]` float32 softmax copy of a long response never has to
    exist at once (V = 150k makes that 600 kB per token).

    Args:
        logits: `[N, T, V]` (or `[T, V]`) logits, any float dtype; computed in float32.
        chunk_size: positions per chunk.

    Returns:
        `[N, T]` (or `[T]`) entropies in nats, float32, no grad.
    """
    if logits.dim() < 2:
        raise ValueError(f"logits must be [..., T, V]; got shape {tuple(logits.shape)}")
    with torch.no_grad():
        out = torch.empty(logits.shape[:-1], dtype=torch.float32, device=logits.device)  # [N, T]
        for start in range(0, logits.shape[-2], chunk_size):
            chunk = logits[..., start : start + chunk_size, :].float()  # [N, c, V]
            logp = torch.log_softmax(chunk, dim=-1)  # [N, c, V]
            out[..., start : start + chunk_size] = -(logp.exp() * logp).sum(dim=-1)  # [N, c]
    return out


def masked_mean(values: Tensor, mask: Tensor) -> float:
    """Mean of `values` over `mask`; 0.0 for an empty mask."""
    m = mask.bool()
    return float(values[m].double().mean().item()) if m.any() else 0.0


def kl_estimates(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor) -> dict[str, float]:
    """KL(mu || pi_old) over the sampled tokens, three ways.

    Args:
        old_logp: `[N, T]` log pi_old of the sampled tokens (training engine).
        rollout_logp: `[N, T]` log mu of the same tokens (inference engine, which sampled them).
        mask: `[N, T]` response mask.

    Returns:
        `{"kl_k1", "kl_k2", "kl_k3"}` as floats.
    """
    log_rho = (old_logp - rollout_logp).double().clamp(-20.0, 20.0)  # [N, T]
    return {
        "kl_k1": masked_mean(-log_rho, mask),
        "kl_k2": masked_mean(0.5 * log_rho**2, mask),
        "kl_k3": masked_mean(log_rho.exp() - 1 - log_rho, mask),
    }


def importance_weight_stats(weights: Tensor, mask: Tensor) -> dict[str, float]:
    """Mean, max and normalised effective sample size of IS weights over `mask`.

    ESS = (sum w)^2 / (n sum w^2) is 1 when all weights are equal and 1/n when one token carries everything.
    """
    w = weights[mask.bool()].double()  # [n]
    if w.numel() == 0 or float((w**2).sum()) == 0.0:
        return {"is_weight_mean": 0.0, "is_weight_max": 0.0, "is_ess": 0.0}
    return {
        "is_weight_mean": float(w.mean()),
        "is_weight_max": float(w.max()),
        "is_ess": float(w.sum() ** 2 / (w.numel() * (w**2).sum())),
    }
