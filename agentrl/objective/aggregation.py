"""Loss aggregation: how a per-token loss matrix `[N, T]` becomes one scalar.

The choice of denominator is not cosmetic: it decides how much each token and each response weighs in the
gradient. MiniRL [Zheng et al. 2025, Eq. 7] is an expectation over *responses* of a *sum* over their tokens, so a
response's weight grows with its length ("seq-mean-token-sum"); dividing by `|y|` ("seq-mean-token-mean") is the
length-normalised ablation that the paper found stable but worse.

Micro-batching: every mode divides by a constant that describes the whole mini-batch (`num_sequences`,
`num_tokens`, `loss_scale_factor`). When the trainer splits a mini-batch into micro-batches and passes the global
constants, the per-micro-batch losses sum to the whole-batch loss exactly, so gradient accumulation is invisible.
No mode falls back to a property of the micro-batch (its padded width, its row count) when the trainer passes the
constants; "seq-mean-token-sum-norm" has no fallback at all, since Dr.GRPO's divisor is a configured constant.
"""

from __future__ import annotations

import torch

__all__ = ["AGG_MODES", "aggregate"]

AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def aggregate(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_sequences: int | float | None = None,
    num_tokens: int | float | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar.

    Args:
        loss_mat: per-token loss, `[N, T]`.
        mask: response/loss mask, `[N, T]` (bool or 0/1); masked-out tokens never contribute, even non-finite ones.
        mode: one of `AGG_MODES`:
            - "token-mean": sum(l * m) / num_tokens.
            - "seq-mean-token-sum": sum(l * m) / num_sequences (MiniRL; verl's name).
            - "seq-mean-token-mean": sum_i (sum_t l * m / |y_i|) / num_sequences (length-normalised, GRPO, GSPO).
            - "seq-mean-token-sum-norm": sum(l * m) / loss_scale_factor (Dr.GRPO; no 1/N).
        num_sequences: sequences in the whole mini-batch (default: rows of `loss_mat`).
        num_tokens: masked tokens in the whole mini-batch (default: `mask.sum()`).
        loss_scale_factor: the constant for "seq-mean-token-sum-norm" (required there: the configured maximum
            response length, the same for every micro-batch).

    Returns:
        A scalar tensor.

    Raises:
        ValueError: on an unknown mode, mismatched shapes, a non-positive or missing denominator.
    """
    if loss_mat.shape != mask.shape or loss_mat.dim() != 2:
        raise ValueError(f"loss and mask must both be [N, T]; got {tuple(loss_mat.shape)} and {tuple(mask.shape)}")
    m = mask.to(loss_mat.dtype)  # [N, T]
    masked = torch.where(mask.bool(), loss_mat, torch.zeros_like(loss_mat))  # [N, T]; 0 * nan would be nan
    if mode == "token-mean":
        denom = float(m.sum().item()) if num_tokens is None else float(num_tokens)
        return masked.sum() / _positive(denom, "num_tokens")
    if mode == "seq-mean-token-sum":
        denom = loss_mat.shape[0] if num_sequences is None else float(num_sequences)
        return masked.sum() / _positive(denom, "num_sequences")
    if mode == "seq-mean-token-mean":
        denom = loss_mat.shape[0] if num_sequences is None else float(num_sequences)
        # An empty response (all tokens masked) contributes 0 instead of 0/0.
        per_seq = masked.sum(dim=1) / m.sum(dim=1).clamp(min=1.0)  # [N]
        return per_seq.sum() / _positive(denom, "num_sequences")
    if mode == "seq-mean-token-sum-norm":
        if loss_scale_factor is None:  # the padded width would tie the gradient to the micro-batch grouping
            raise ValueError("seq-mean-token-sum-norm needs loss_scale_factor (the configured maximum response length)")
        return masked.sum() / _positive(float(loss_scale_factor), "loss_scale_factor")
    raise ValueError(f"unknown aggregation mode {mode!r}; choose one of {', '.join(AGG_MODES)}")


def _positive(value: float, name: str) -> float:
    # A zero denominator means an empty mini-batch: a silent NaN here would poison the optimizer state.
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value
