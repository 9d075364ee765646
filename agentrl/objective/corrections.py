"""Training-inference corrections: per-token weights built from rho = pi_old / mu.

The rollout is sampled by the inference engine (mu: vLLM/SGLang kernels, maybe FP8 or BF16); the gradient is taken
under the training engine (pi). Even at identical parameters the two disagree, and the token-level policy gradient is
only a valid surrogate of the sequence objective while that gap stays small [Zheng et al. 2025, Eq. 5]. Each
correction turns the ratio rho_t = pi_old(y_t) / mu(y_t) into a detached weight `w_t` that multiplies the loss:

- "tis": truncated IS, `w = min(rho, is_cap)` per token, or per sequence with `rho_seq = prod_t rho_t`.
- "icepop": `w = rho` inside `[icepop_low, icepop_high]`, else 0 (token dropped, not clipped; Ring-1T).
- "mis": masked IS at a chosen level: the token ratio, the sequence product or the per-sequence geometric mean;
  `w` is that ratio inside `[mis_low, mis_high]`, else 0 (the whole sequence for the sequence levels).
- "none": `w = 1` (the "wo_train-infer-is" ablation, which collapsed in the paper).

Departure from the paper, on purpose: MiniRL's text truncates pi_theta / mu; we truncate the decoupled rho =
pi_old / mu as verl and slime do (the open point in docs/objective.md). The two agree while no weight reaches the
cap; the decoupled form keeps the correction a function of the rollout alone (constant across the off-policy
mini-batch updates) and lets the clip alone control the staleness ratio pi_theta / pi_old.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["CORRECTIONS", "CorrectionResult", "correction_weights"]

CORRECTIONS: tuple[str, ...] = ("tis", "icepop", "mis", "none")
TIS_LEVELS: tuple[str, ...] = ("token", "sequence")
MIS_LEVELS: tuple[str, ...] = ("token", "sequence", "geometric")

# verl clamps log-ratios to +-20 before exponentiating: exp(20) ~ 5e8 is already "infinitely off-policy" and the
# clamp keeps a sequence product of many tokens finite.
_LOG_RATIO_CLAMP = 20.0


@dataclass(frozen=True)
class CorrectionResult:
    """Weights from a training-inference correction, all detached.

    Attributes:
        weights: `[N, T]` weight per token (0 where the correction dropped the token).
        masked: `[N, T]` bool, response tokens the correction set to zero (IcePop / MIS rejections).
        truncated: `[N, T]` bool, response tokens whose weight was capped (TIS).
    """

    weights: torch.Tensor
    masked: torch.Tensor
    truncated: torch.Tensor


def correction_weights(
    correction: str,
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    is_cap: float = 5.0,
    is_level: str = "token",
    icepop_low: float = 0.5,
    icepop_high: float = 5.0,
    mis_level: str = "token",
    mis_low: float = 0.5,
    mis_high: float = 2.0,
) -> CorrectionResult:
    """Detached per-token weights that correct for the training-inference mismatch.

    Args:
        correction: one of `CORRECTIONS` ("tis", "icepop", "mis", "none").
        old_logp: log pi_old of the sampled tokens under the training engine, `[N, T]`.
        rollout_logp: log mu of the same tokens under the inference engine, `[N, T]`.
        mask: response mask, `[N, T]`.
        is_cap: TIS cap C; weights above it become exactly C.
        is_level: TIS level, "token" or "sequence" (product of token ratios, broadcast over the sequence).
        icepop_low: IcePop lower bound alpha (inclusive).
        icepop_high: IcePop upper bound beta (inclusive).
        mis_level: MIS level, "token", "sequence" (product) or "geometric" (exp of the mean log-ratio).
        mis_low: MIS lower bound (inclusive).
        mis_high: MIS upper bound (inclusive).

    Returns:
        A `CorrectionResult`; all tensors `[N, T]`, with no gradient.

    Raises:
        ValueError: on an unknown correction or level, or bounds that are not ordered.
    """
    m = mask.bool()  # [N, T]
    log_rho = (old_logp.detach() - rollout_logp.detach()).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)  # [N, T]
    log_rho = torch.where(m, log_rho, torch.zeros_like(log_rho))  # padding must not enter sequence products
    none = torch.zeros_like(m)  # [N, T] bool
    if correction == "none":
        return CorrectionResult(weights=torch.ones_like(log_rho), masked=none, truncated=none)
    if correction == "tis":
        if is_level not in TIS_LEVELS:
            raise ValueError(f"unknown is_level {is_level!r} for tis; choose one of {', '.join(TIS_LEVELS)}")
        if not is_cap > 0:
            raise ValueError(f"is_cap must be > 0, got {is_cap}")
        rho = _level_ratio(log_rho, m, "token" if is_level == "token" else "sequence")  # [N, T]
        truncated = (rho > is_cap) & m  # [N, T]
        return CorrectionResult(weights=rho.clamp(max=is_cap), masked=none, truncated=truncated)
    if correction == "icepop":
        _check_band(icepop_low, icepop_high, "icepop")
        rho = log_rho.exp()  # [N, T]
        keep = (rho >= icepop_low) & (rho <= icepop_high)  # [N, T]
        return CorrectionResult(weights=torch.where(keep, rho, torch.zeros_like(rho)), masked=~keep & m, truncated=none)
    if correction == "mis":
        if mis_level not in MIS_LEVELS:
            raise ValueError(f"unknown mis_level {mis_level!r}; choose one of {', '.join(MIS_LEVELS)}")
        _check_band(mis_low, mis_high, "mis")
        rho = _level_ratio(log_rho, m, mis_level)  # [N, T]
        keep = (rho >= mis_low) & (rho <= mis_high)  # [N, T]
        return CorrectionResult(weights=torch.where(keep, rho, torch.zeros_like(rho)), masked=~keep & m, truncated=none)
    raise ValueError(f"unknown correction {correction!r}; choose one of {', '.join(CORRECTIONS)}")


def _level_ratio(log_rho: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """The ratio at `level`, broadcast to `[N, T]`; `log_rho` is already zero on padding."""
    if level == "token":
        return log_rho.exp()  # [N, T]
    if level == "sequence":
        seq = log_rho.sum(dim=1, keepdim=True).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)  # [N, 1]
    else:  # geometric mean over the response tokens
        seq = log_rho.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1)  # [N, 1]
    return seq.exp().expand_as(log_rho)  # [N, T]


def _check_band(low: float, high: float, name: str) -> None:
    if not 0 <= low <= high:
        raise ValueError(f"{name} bounds must satisfy 0 <= low <= high; got low={low}, high={high}")
