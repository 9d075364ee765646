"""Training-inference corrections: per-token weights built from rho = pi_old / mu.

The rollout is sampled by the inference engine (mu: vLLM/SGLang kernels, maybe FP8 or BF16); the gradient is taken
under the training engine (pi). Even at identical parameters the two disagree, and the token-level policy gradient is
only a valid surrogate of the sequence objective while that gap stays small [Zheng et al. 2025, Eq. 5]. Each
correction turns the ratio rho_t = pi_old(y_t) / mu(y_t) into a detached weight `w_t` that multiplies the loss:

- "tis": truncated IS, `w = clamp(rho, is_floor, is_cap)` per token, or per sequence with `rho_seq = prod_t rho_t`
  (the floor is 0 by default: no lower bound, as in MiniRL; slime's `--tis-clip-low`).
- "icepop": `w = rho` inside `[icepop_low, icepop_high]`, else 0 (token dropped, not clipped; Ring-1T).
- "mis": masked IS at a chosen level: the token ratio, the sequence product or the per-sequence geometric mean;
  `w` is that ratio inside `[mis_low, mis_high]`, else 0 (the whole sequence for the sequence levels).
- "none": `w = 1` (the "wo_train-infer-is" ablation, which collapsed in the paper).

A rejection mask (`rejection_mask`, verl's `rollout_rs`) can be combined with any of them: tokens, or whole sequences,
whose ratio at the chosen level (token, sequence product, geometric mean) leaves `[low, high]` get weight 0, the others
keep the correction's weight; e.g. token TIS with a geometric-mean mask (verl's Geo-RS band 0.999..1.001).

Sequence-level ratios clamp the SUM of the log-ratios to +-20 (as verl and TRL do), never the token terms: clamping
each token first would change the product of a long response whose ratios are individually extreme but cancel.

Departure from the paper, on purpose: MiniRL's text truncates pi_theta / mu; we truncate the decoupled rho =
pi_old / mu as verl and slime do (the open point of docs/objective.md §1, "TIS placement"). The two agree while no
weight reaches the cap; the decoupled form keeps the correction a function of the rollout alone (constant across the
off-policy mini-batch updates) and lets the clip alone control the staleness ratio pi_theta / pi_old.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["CORRECTIONS", "REJECTION_LEVELS", "CorrectionResult", "correction_weights", "rejection_mask"]

CORRECTIONS: tuple[str, ...] = ("tis", "icepop", "mis", "none")
TIS_LEVELS: tuple[str, ...] = ("token", "sequence")
MIS_LEVELS: tuple[str, ...] = ("token", "sequence", "geometric")
REJECTION_LEVELS: tuple[str, ...] = ("none", *MIS_LEVELS)

# verl clamps the log-ratio at the chosen level to +-20 before exponentiating: exp(20) ~ 5e8 is already "infinitely
# off-policy", and clamping the level's log-ratio (not its token terms) keeps a sequence product finite and exact.
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
    is_floor: float = 0.0,
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
        is_floor: TIS lower bound; weights below it become exactly it (0: none).
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
    log_rho = _masked_log_rho(old_logp, rollout_logp, m)  # [N, T]
    none = torch.zeros_like(m)  # [N, T] bool
    if correction == "none":
        return CorrectionResult(weights=torch.ones_like(log_rho), masked=none, truncated=none)
    if correction == "tis":
        if is_level not in TIS_LEVELS:
            raise ValueError(f"unknown is_level {is_level!r} for tis; choose one of {', '.join(TIS_LEVELS)}")
        if not 0 <= is_floor < is_cap:
            raise ValueError(f"TIS bounds must satisfy 0 <= is_floor < is_cap; got {is_floor} and {is_cap}")
        rho = _level_ratio(log_rho, m, "token" if is_level == "token" else "sequence")  # [N, T]
        truncated = ((rho > is_cap) | (rho < is_floor)) & m  # [N, T]
        return CorrectionResult(weights=rho.clamp(min=is_floor, max=is_cap), masked=none, truncated=truncated)
    if correction == "icepop":
        _check_band(icepop_low, icepop_high, "icepop")
        rho = log_rho.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP).exp()  # [N, T]
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


def rejection_mask(
    level: str, old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor, low: float, high: float
) -> torch.Tensor:
    """Which tokens a rejection mask keeps: the ratio at `level` lies in `[low, high]` (inclusive).

    Args:
        level: "none" (keep everything), "token", "sequence" (product of the token ratios) or "geometric" (exp of
            their mean: verl's Geo-RS, usually with a tight band such as 0.999..1.001).
        old_logp: `[N, T]` log pi_old.
        rollout_logp: `[N, T]` log mu.
        mask: `[N, T]` response mask.
        low: lower bound of the kept band.
        high: upper bound of the kept band.

    Returns:
        `[N, T]` bool, True where the token is kept (padding is always False).
    """
    m = mask.bool()  # [N, T]
    if level not in REJECTION_LEVELS:
        raise ValueError(f"unknown rejection level {level!r}; choose one of {', '.join(REJECTION_LEVELS)}")
    if level == "none":
        return m
    _check_band(low, high, "rejection")
    rho = _level_ratio(_masked_log_rho(old_logp, rollout_logp, m), m, level)  # [N, T]
    return (rho >= low) & (rho <= high) & m


def _masked_log_rho(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The log-ratio log pi_old - log mu on response tokens, exactly 0 on padding whatever it holds (-inf, NaN)."""
    log_rho = old_logp.detach() - rollout_logp.detach()  # [N, T]
    return torch.where(mask, log_rho, torch.zeros_like(log_rho))


def _level_ratio(log_rho: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """The ratio at `level`, broadcast to `[N, T]`; `log_rho` is zero on padding and not yet clamped.

    The clamp to +-20 applies to the log-ratio at the chosen level (the token's, the sequence sum, the mean), never to
    the token terms before a sum (verl `compute_rollout_correction_weights`, TRL's sequence IS).
    """
    if level == "token":
        level_log = log_rho  # [N, T]
    elif level == "sequence":
        level_log = log_rho.sum(dim=1, keepdim=True)  # [N, 1]
    else:  # geometric mean over the response tokens
        level_log = log_rho.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1)  # [N, 1]
    return level_log.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP).exp().expand_as(log_rho)  # [N, T]


def _check_band(low: float, high: float, name: str) -> None:
    if not 0 <= low <= high:
        raise ValueError(f"{name} bounds must satisfy 0 <= low <= high; got low={low}, high={high}")
