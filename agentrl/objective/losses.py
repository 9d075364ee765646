"""Policy losses: one small function per objective, chosen by name from `LOSSES`.

Notation (docs/objective.md, its opening "Notation"): N responses, T = padded response length.
    logp          log pi_theta(y_t)  [N, T], has grad (the policy being updated)
    old_logp      log pi_old(y_t)    [N, T], training engine at rollout parameters, no grad
    rollout_logp  log mu_old(y_t)    [N, T], inference engine at rollout time, no grad
    r_t   = pi_theta / pi_old        staleness ratio, controlled by clipping
    rho_t = pi_old / mu_old          training-inference ratio, controlled by the correction (corrections.py)

Every loss is `fn(logp, old_logp, adv, weights, mask, opts) -> (loss_mat [N, T], clipped_low, clipped_high)`;
`policy_loss` adds the correction weights, the optional reference-KL and entropy terms, the aggregation and the
metrics around it, so any correction can be combined with any loss (`correction=` option) and every loss reports the
same metric names.

Masked positions never contribute, whatever they hold: `policy_loss` replaces padding values (a `-inf` log-prob, a
NaN from a reference model) with zeros through `torch.where` before any arithmetic, because `0 * nan` is NaN and
would poison the loss and its gradient.

Options beyond each loss's recipe, all off by default (MiniRL stays the default recipe):
- `kl_coef` / `kl_estimator`: KL(pi_theta || pi_ref) in the loss, k1 / k2 / k3 (reference_kl.py); needs `ref_logp`.
- `entropy_coef`: an entropy bonus, `loss -= entropy_coef * agg(H)`; needs the differentiable entropy `[N, T]`.
- `dual_clip` (PPO-clip losses and MiniRL): for A < 0 the surrogate is capped at -A c (verl's clip_ratio_c), i.e.
  tokens with A < 0 and r > c get no gradient.
- `is_floor`: a lower bound for TIS; `rejection` / `rejection_low` / `rejection_high`: a rejection mask combined
  with the correction's weights (corrections.py).
- Bypass mode (pi_old = mu): pass `old_logp = rollout_logp`; rho is then 1 and the clip acts on pi_theta / mu.

Departures from the sources, on purpose:
- MiniRL truncates the decoupled rho = pi_old / mu rather than the paper's literal pi_theta / mu (see
  corrections.py); identical until a weight reaches the cap.
- Dual-clip is off by default (verl hard-codes clip_ratio_c=3 for negative advantages); MiniRL's proven
  equivalence to decoupled PPO holds only without it.
- GRPO / CISPO in the paper's appendix have no training-inference term; here their default is `correction="none"`,
  and any correction can be switched on.
- Dr.GRPO's divisor must be given (`loss_scale_factor`, the configured maximum response length): a default of the
  padded width would make the gradient depend on how samples are grouped into micro-batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from agentrl.objective.aggregation import AGG_MODES, aggregate
from agentrl.objective.corrections import (
    CORRECTIONS,
    REJECTION_LEVELS,
    CorrectionResult,
    correction_weights,
    rejection_mask,
)
from agentrl.objective.diagnostics import importance_weight_stats, kl_estimates, masked_mean
from agentrl.objective.reference_kl import KL_ESTIMATORS, kl_penalty

__all__ = [
    "LOSSES",
    "LossOptions",
    "MiniRLOptions",
    "PPOClipOptions",
    "DAPOOptions",
    "DrGRPOOptions",
    "GSPOOptions",
    "CISPOOptions",
    "ReinforceOptions",
    "LossSpec",
    "loss_options",
    "loss_weights",
    "policy_loss",
]


@dataclass(frozen=True)
class LossOptions:
    """Options every loss shares: aggregation and training-inference correction.

    Attributes:
        agg: aggregation mode, one of `aggregation.AGG_MODES`.
        correction: "tis", "icepop", "mis" or "none" (see corrections.py).
        is_cap: TIS cap C (weights above it become exactly C).
        is_floor: TIS lower bound (weights below it become exactly it; 0: none).
        is_level: TIS level, "token" or "sequence".
        icepop_low: IcePop band lower bound (tokens with rho below it are dropped).
        icepop_high: IcePop band upper bound.
        mis_level: MIS level, "token", "sequence" or "geometric".
        mis_low: MIS band lower bound.
        mis_high: MIS band upper bound (for "geometric" a much tighter band, e.g. 0.999..1.001, is usual).
        rejection: a rejection mask combined with the correction: "none", "token", "sequence" or "geometric".
        rejection_low: lower bound of the band the rejection mask keeps.
        rejection_high: upper bound of the band the rejection mask keeps.
        loss_scale_factor: the constant divisor of "seq-mean-token-sum-norm" (Dr.GRPO): the configured maximum
            response length. Required by that mode; the trainer fills it from the rollout config.
        kl_coef: weight of KL(pi_theta || pi_ref) in the loss (0: off; then no reference model is needed).
        kl_estimator: "k1", "k2" or "k3" (low-variance KL, verl's "low_var_kl").
        entropy_coef: weight of the entropy bonus (0: off).
    """

    agg: str = "seq-mean-token-sum"
    correction: str = "none"
    is_cap: float = 5.0
    is_level: str = "token"
    icepop_low: float = 0.5
    icepop_high: float = 5.0
    mis_level: str = "token"
    mis_low: float = 0.5
    mis_high: float = 2.0
    is_floor: float = 0.0
    rejection: str = "none"
    rejection_low: float = 0.5
    rejection_high: float = 2.0
    loss_scale_factor: float | None = None
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # a YAML typo ("0.2x") must fail here, not as a TypeError inside the loss
            value = getattr(self, f.name)
            if "float" in str(f.type) and not (value is None and "None" in str(f.type)):
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ValueError(f"loss option {f.name} must be a number, got {value!r}")
        if self.agg not in AGG_MODES:
            raise ValueError(f"unknown agg {self.agg!r}; choose one of {', '.join(AGG_MODES)}")
        if self.correction not in CORRECTIONS:
            raise ValueError(f"unknown correction {self.correction!r}; choose one of {', '.join(CORRECTIONS)}")
        if self.rejection not in REJECTION_LEVELS:
            raise ValueError(f"unknown rejection {self.rejection!r}; choose one of {', '.join(REJECTION_LEVELS)}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"unknown kl_estimator {self.kl_estimator!r}; choose one of {', '.join(KL_ESTIMATORS)}")
        if self.kl_coef < 0 or self.entropy_coef < 0:
            raise ValueError(f"kl_coef and entropy_coef must be >= 0; got {self.kl_coef} and {self.entropy_coef}")
        if self.loss_scale_factor is not None and not self.loss_scale_factor > 0:
            raise ValueError(f"loss_scale_factor must be > 0 (the max response length), got {self.loss_scale_factor}")
        dual_clip = getattr(self, "dual_clip", None)
        if dual_clip is not None and not dual_clip > 1:
            raise ValueError(f"dual_clip must be > 1 (verl uses 3), got {dual_clip}")


@dataclass(frozen=True)
class MiniRLOptions(LossOptions):
    """MiniRL [Zheng et al. 2025, Eq. 7]: TIS at C=5, decoupled one-sided clip 0.2 / 0.27, token sum per response.

    Attributes:
        eps_low: mask tokens with A<0 and r < 1 - eps_low.
        eps_high: mask tokens with A>0 and r > 1 + eps_high.
        dual_clip: also mask tokens with A<0 and r > dual_clip (None: off, the paper's recipe).
    """

    agg: str = "seq-mean-token-sum"
    correction: str = "tis"
    eps_low: float = 0.2
    eps_high: float = 0.27
    dual_clip: float | None = None


@dataclass(frozen=True)
class PPOClipOptions(LossOptions):
    """GRPO's PPO-clip surrogate, length-normalised per response [P, App. A].

    Attributes:
        eps_low: lower clip 1 - eps_low on r.
        eps_high: upper clip 1 + eps_high on r.
        dual_clip: for A<0, cap the surrogate at -A * dual_clip (verl's clip_ratio_c, e.g. 3); None: off.
    """

    agg: str = "seq-mean-token-mean"
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None


@dataclass(frozen=True)
class DAPOOptions(PPOClipOptions):
    """DAPO: PPO-clip with clip-higher (0.28) and token-mean aggregation."""

    agg: str = "token-mean"
    eps_high: float = 0.28


@dataclass(frozen=True)
class DrGRPOOptions(PPOClipOptions):
    """Dr.GRPO: PPO-clip with a constant divisor (no 1/|y|, no 1/N); pair it with `group_mean` advantages.

    The divisor `loss_scale_factor` is the configured maximum response length, the same for every micro-batch.
    """

    agg: str = "seq-mean-token-sum-norm"


@dataclass(frozen=True)
class GSPOOptions(LossOptions):
    """GSPO: one length-normalised ratio per sequence, clipped very tightly (verl's Qwen3-30B recipe values).

    Attributes:
        eps_low: lower clip on the sequence ratio.
        eps_high: upper clip on the sequence ratio.
    """

    agg: str = "seq-mean-token-mean"
    eps_low: float = 3e-4
    eps_high: float = 4e-4


@dataclass(frozen=True)
class CISPOOptions(LossOptions):
    """CISPO (MiniMax-M1): clip the detached IS weight, never drop a token's gradient.

    Attributes:
        eps_low: lower bound 1 - eps_low on the weight (1.0: no lower bound, as in MiniMax-M1).
        eps_high: upper bound 1 + eps_high on the weight.
    """

    agg: str = "token-mean"
    eps_low: float = 1.0
    eps_high: float = 0.28


@dataclass(frozen=True)
class ReinforceOptions(LossOptions):
    """Plain REINFORCE, `-w * A * logp`, token sum per response; `w` is the correction weight (1 by default)."""

    agg: str = "seq-mean-token-sum"


# -- the losses -----------------------------------------------------------------------------------------------------
# Each is fn(logp, old_logp, adv, w, mask, opts) -> (loss_mat [N, T], clipped_low [N, T] bool, clipped_high [N, T]
# bool). `w` is the detached correction weight [N, T]; `adv` is already [N, T]; `mask` is the bool response mask.


def minirl_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, w: Tensor, mask: Tensor, opts: MiniRLOptions):
    """MiniRL: l = -M_t * sg[w_t * r_t] * A * logp_t, with the one-sided mask M decided on r = pi_theta / pi_old.

    The gradient is -M w r A grad(logp) = -M w A grad(r): decoupled PPO with the min(.) replaced by a hard mask.
    The inequalities are strict, so a ratio exactly on the boundary is kept. With `dual_clip` c, tokens with A<0 and
    r > c are masked too: PPO's dual-clipped surrogate is the constant -A c there, so its gradient is zero as well.
    """
    ratio = (logp - old_logp).exp()  # [N, T] r_t
    clipped_high = (adv > 0) & (ratio > 1 + opts.eps_high)  # [N, T] would push pi further up: masked
    if opts.dual_clip is not None:
        clipped_high = clipped_high | ((adv < 0) & (ratio > opts.dual_clip))  # [N, T] dual-clip
    clipped_low = (adv < 0) & (ratio < 1 - opts.eps_low)  # [N, T] would push pi further down: masked
    keep = (~(clipped_high | clipped_low)).to(logp.dtype)  # [N, T] M_t
    loss_mat = -keep * (w * ratio).detach() * adv * logp  # [N, T]
    return loss_mat, clipped_low, clipped_high


def ppo_clip_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, w: Tensor, mask: Tensor, opts: PPOClipOptions):
    """PPO-clip: l = w * max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)) (GRPO, DAPO, Dr.GRPO).

    With `dual_clip` c, for A<0: l = w * min(max(...), -A c) (Ye et al. 2020; verl's clip_ratio_c). The clipped
    flags report where the gradient vanished because r was too low (`clipped_low`) or too high (`clipped_high`,
    which includes the dual clip).
    """
    ratio = (logp - old_logp).exp()  # [N, T]
    unclipped = -adv * ratio  # [N, T]
    clipped = -adv * ratio.clamp(1 - opts.eps_low, 1 + opts.eps_high)  # [N, T]
    surrogate = torch.maximum(unclipped, clipped)  # [N, T]
    # The clipped branch wins (and the gradient vanishes) exactly where the one-sided MiniRL mask would fire.
    clipped_high = (adv > 0) & (ratio > 1 + opts.eps_high)  # [N, T]
    clipped_low = (adv < 0) & (ratio < 1 - opts.eps_low)  # [N, T]
    if opts.dual_clip is not None:
        surrogate = torch.where(adv < 0, torch.minimum(surrogate, -adv * opts.dual_clip), surrogate)  # [N, T]
        clipped_high = clipped_high | ((adv < 0) & (ratio > opts.dual_clip))  # [N, T]
    return w * surrogate, clipped_low, clipped_high


def gspo_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, w: Tensor, mask: Tensor, opts: GSPOOptions):
    """GSPO: s_i = exp(mean_t(logp - old_logp)); token form s_it = sg[s_i] * pi / sg[pi]; PPO-clip on s_it."""
    log_ratio = torch.where(mask, logp - old_logp, torch.zeros_like(logp))  # [N, T]
    seq_log_ratio = log_ratio.sum(dim=1, keepdim=True) / mask.sum(dim=1, keepdim=True).clamp(min=1)  # [N, 1]
    # verl clamps the log of the token-level sequence ratio at 10 so exp() stays finite.
    log_s = (seq_log_ratio.detach() + logp - logp.detach()).clamp(max=10.0)  # [N, T], value log s_i everywhere
    s = log_s.exp()  # [N, T]
    unclipped = -adv * s  # [N, T]
    clipped = -adv * s.clamp(1 - opts.eps_low, 1 + opts.eps_high)  # [N, T]
    loss_mat = w * torch.maximum(unclipped, clipped)  # [N, T]
    clipped_high = (adv > 0) & (s > 1 + opts.eps_high)  # [N, T], whole sequences
    clipped_low = (adv < 0) & (s < 1 - opts.eps_low)  # [N, T]
    return loss_mat, clipped_low, clipped_high


def cispo_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, w: Tensor, mask: Tensor, opts: CISPOOptions):
    """CISPO: l = -sg[w * clip(r, 1 - eps_low, 1 + eps_high)] * A * logp; every token keeps a gradient."""
    ratio = (logp - old_logp).exp()  # [N, T]
    clipped_ratio = ratio.clamp(1 - opts.eps_low, 1 + opts.eps_high)  # [N, T]
    loss_mat = -(w * clipped_ratio).detach() * adv * logp  # [N, T]
    return loss_mat, ratio < 1 - opts.eps_low, ratio > 1 + opts.eps_high


def reinforce_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, w: Tensor, mask: Tensor, opts: ReinforceOptions):
    """REINFORCE: l = -sg[w] * A * logp, no clipping (on-policy only)."""
    loss_mat = -w.detach() * adv * logp  # [N, T]
    never = torch.zeros_like(logp, dtype=torch.bool)  # [N, T]
    return loss_mat, never, never


@dataclass(frozen=True)
class LossSpec:
    """A registered policy loss.

    Attributes:
        fn: the per-token loss function.
        options: the typed options class; its defaults are the loss's defaults.
        description: one line for `--help` and docs.
    """

    fn: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    options: type[LossOptions]
    description: str


LOSSES: dict[str, LossSpec] = {
    "minirl": LossSpec(minirl_loss, MiniRLOptions, "MiniRL: TIS(5) + decoupled one-sided clip, token sum per response"),
    "grpo": LossSpec(ppo_clip_loss, PPOClipOptions, "GRPO: PPO-clip 0.2, length-normalised per response"),
    "dapo": LossSpec(ppo_clip_loss, DAPOOptions, "DAPO: PPO-clip with clip-higher 0.28, token-mean"),
    "gspo": LossSpec(gspo_loss, GSPOOptions, "GSPO: sequence-level ratio, clip 3e-4 / 4e-4"),
    "cispo": LossSpec(cispo_loss, CISPOOptions, "CISPO: clipped detached IS weight, token-mean"),
    "dr_grpo": LossSpec(ppo_clip_loss, DrGRPOOptions, "Dr.GRPO: PPO-clip, constant divisor (no length norm)"),
    "reinforce": LossSpec(reinforce_loss, ReinforceOptions, "REINFORCE: -A log pi, token sum per response"),
}


def loss_options(name: str, **options: Any) -> LossOptions:
    """Build the typed options of loss `name`, rejecting options it does not have.

    Args:
        name: a key of `LOSSES`.
        **options: overrides of the defaults (e.g. from a YAML `loss_options:` block).

    Returns:
        The frozen options dataclass.

    Raises:
        ValueError: on an unknown loss name, an unknown option name or an invalid value.
    """
    if name not in LOSSES:
        raise ValueError(f"unknown policy loss {name!r}; choose one of {', '.join(LOSSES)}")
    cls = LOSSES[name].options
    valid = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - valid)
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for policy loss {name!r}; "
            f"valid options: {', '.join(sorted(valid))}"
        )
    return cls(**options)


def policy_loss(
    name: str,
    logp: torch.Tensor,
    old_logp: torch.Tensor | None,
    rollout_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    num_sequences: int | float | None = None,
    num_tokens: int | float | None = None,
    ref_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    opts: LossOptions | None = None,
    **options: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Compute policy loss `name` with its training-inference correction, aggregation and diagnostics.

    Args:
        name: a key of `LOSSES` ("minirl", "grpo", "dapo", "gspo", "cispo", "dr_grpo", "reinforce").
        logp: log pi_theta of the sampled tokens, `[N, T]`, with grad.
        old_logp: log pi_old from the training engine, `[N, T]`; None means on-policy (`logp.detach()`). Bypass
            mode passes `rollout_logp` here (pi_old = mu, no recompute pass).
        rollout_logp: log mu from the inference engine, `[N, T]`; None means no mismatch (`old_logp`).
        advantages: `[N]` (one per response) or `[N, T]` (e.g. per-turn step advantages).
        mask: response/loss mask, `[N, T]` (bool or 0/1). Positions outside it never contribute, whatever any of
            the tensors hold there (-inf, NaN).
        num_sequences: sequences in the whole mini-batch, for micro-batching (default: N).
        num_tokens: masked tokens in the whole mini-batch, for micro-batching (default: `mask.sum()`).
        ref_logp: log pi_ref of the sampled tokens, `[N, T]`; required when `kl_coef > 0`.
        entropy: the policy's entropy at each position, `[N, T]`; required (with grad) when `entropy_coef > 0`,
            reported as the `policy_entropy` metric whenever given.
        opts: the options already built by `loss_options(name, ...)` (the trainer builds them once per run);
            mutually exclusive with `**options`.
        **options: fields of the loss's options dataclass (see `LOSSES[name].options`).

    Returns:
        `(loss, metrics)`: a scalar tensor and a dict of floats. Metrics are means over this call's masked tokens:
        `loss`, `is_weight_mean`, `is_weight_max`, `is_ess`, `correction_masked_frac`, `correction_truncated_frac`,
        `clip_frac`, `clip_frac_low`, `clip_frac_high`, `kl_k1`, `kl_k2`, `kl_k3` (KL(mu || pi_old)), `ppo_kl`,
        `ratio_mean`, `ratio_max`; plus `ref_kl` with a reference and `policy_entropy` (mean over the tokens) with an
        entropy.

    Raises:
        ValueError: on an unknown name or option, tensors of the wrong shape, or a term switched on without its input.
    """
    if opts is None:
        opts = loss_options(name, **options)
    elif options:
        raise ValueError(f"pass either opts or keyword options to policy_loss, not both (got {sorted(options)})")
    elif not isinstance(opts, LOSSES[name].options):
        raise ValueError(f"opts is a {type(opts).__name__}; policy loss {name!r} takes {LOSSES[name].options.__name__}")
    m = mask.bool()  # [N, T]
    old_logp = logp.detach() if old_logp is None else old_logp.detach()  # [N, T]
    rollout_logp = old_logp if rollout_logp is None else rollout_logp.detach()  # [N, T]
    adv = _broadcast_advantages(advantages, logp).detach()  # [N, T]
    for label, t in (("old_logp", old_logp), ("rollout_logp", rollout_logp), ("mask", mask), ("ref_logp", ref_logp),
                     ("entropy", entropy)):  # fmt: skip
        if t is not None and t.shape != logp.shape:
            raise ValueError(f"{label} has shape {tuple(t.shape)}, expected {tuple(logp.shape)} like logp")
    if opts.kl_coef > 0 and ref_logp is None:
        raise ValueError("kl_coef > 0 needs ref_logp, the reference model's log-probs of the sampled tokens")
    if opts.entropy_coef > 0 and entropy is None:
        raise ValueError("entropy_coef > 0 needs entropy, the policy's per-position entropy with grad")
    if opts.agg == "seq-mean-token-sum-norm" and opts.loss_scale_factor is None:
        raise ValueError(f"policy loss {name!r} divides by a constant: set loss_scale_factor to the configured "
                         f"maximum response length (the trainer does this from sampling.max_new_tokens)")
    # Padding may hold anything (a -inf log-prob, NaN from a reference pass); where() keeps it out of every sum and
    # gives it an exact zero gradient, which multiplying by the mask would not (0 * nan = nan).
    logp, old_logp, rollout_logp, adv = (_zero_outside(t, m) for t in (logp, old_logp, rollout_logp, adv))

    corr = loss_weights(opts, old_logp, rollout_logp, m)
    w = corr.weights.to(logp.dtype)  # [N, T]
    loss_mat, clipped_low, clipped_high = LOSSES[name].fn(logp, old_logp, adv, w, m, opts)  # [N, T]
    extra: dict[str, float] = {}
    if opts.kl_coef > 0:
        kl_mat = kl_penalty(logp, _zero_outside(ref_logp, m), opts.kl_estimator)  # [N, T], grad through logp
        loss_mat = loss_mat + opts.kl_coef * kl_mat
        extra["ref_kl"] = masked_mean(kl_mat.detach(), m)
    if entropy is not None:
        entropy = _zero_outside(entropy, m)  # [N, T]
        extra["policy_entropy"] = masked_mean(entropy.detach(), m)
        if opts.entropy_coef > 0:
            loss_mat = loss_mat - opts.entropy_coef * entropy
    loss = aggregate(
        loss_mat, m, opts.agg,
        num_sequences=num_sequences, num_tokens=num_tokens, loss_scale_factor=opts.loss_scale_factor,
    )  # fmt: skip

    metrics = _metrics(logp.detach(), old_logp, rollout_logp, m, w, corr.masked, corr.truncated,
                       clipped_low, clipped_high)  # fmt: skip
    metrics["loss"] = float(loss.detach().item())
    return loss, metrics | extra


def loss_weights(opts: LossOptions, old_logp: Tensor, rollout_logp: Tensor, mask: Tensor) -> CorrectionResult:
    """The detached per-token weight `w` the loss multiplies: the correction's, zeroed where the rejection mask drops.

    `policy_loss` calls it, and so does the run's per-token record (`agentrl.training.token_values`), so what a
    viewer shows as masked or truncated is exactly what the loss did.

    Args:
        opts: the loss's options (correction, its bounds and level, the rejection mask).
        old_logp: log pi_old `[N, T]` (0 outside the mask).
        rollout_logp: log mu `[N, T]` (0 outside the mask).
        mask: the bool response mask `[N, T]`.

    Returns:
        A `CorrectionResult`: `weights` after the rejection mask, `masked` the tokens the correction or the rejection
        mask set to 0, `truncated` the tokens whose TIS weight was capped or floored; all `[N, T]`.
    """
    corr = correction_weights(
        opts.correction, old_logp, rollout_logp, mask,
        is_cap=opts.is_cap, is_floor=opts.is_floor, is_level=opts.is_level,
        icepop_low=opts.icepop_low, icepop_high=opts.icepop_high,
        mis_level=opts.mis_level, mis_low=opts.mis_low, mis_high=opts.mis_high,
    )  # fmt: skip
    keep = rejection_mask(opts.rejection, old_logp, rollout_logp, mask, opts.rejection_low,
                          opts.rejection_high)  # [N, T]
    weights = torch.where(keep, corr.weights, torch.zeros_like(corr.weights))  # [N, T]
    return CorrectionResult(weights=weights, masked=corr.masked | (mask & ~keep), truncated=corr.truncated)


def _zero_outside(t: Tensor, mask: Tensor) -> Tensor:
    """`t` on the mask, exactly 0 elsewhere (gradient 0 there too), whatever `t` holds outside it."""
    return torch.where(mask, t, torch.zeros((), dtype=t.dtype, device=t.device))


def _broadcast_advantages(advantages: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    if advantages.dim() == 1 and advantages.shape[0] == logp.shape[0]:
        return advantages.to(logp.dtype).unsqueeze(1).expand_as(logp)  # [N] -> [N, T]
    if advantages.shape == logp.shape:
        return advantages.to(logp.dtype)  # [N, T]
    raise ValueError(f"advantages must be [N] or [N, T] with N, T = {tuple(logp.shape)}; got {tuple(advantages.shape)}")


def _metrics(
    logp: Tensor,
    old_logp: Tensor,
    rollout_logp: Tensor,
    m: Tensor,
    w: Tensor,
    corr_masked: Tensor,
    corr_truncated: Tensor,
    clipped_low: Tensor,
    clipped_high: Tensor,
) -> dict[str, float]:
    """Diagnostics over the masked tokens; every value a float."""
    ratio = (logp - old_logp).exp()  # [N, T]
    return {
        **importance_weight_stats(w, m),
        "correction_masked_frac": masked_mean(corr_masked, m),
        "correction_truncated_frac": masked_mean(corr_truncated, m),
        "clip_frac": masked_mean(clipped_low | clipped_high, m),
        "clip_frac_low": masked_mean(clipped_low, m),
        "clip_frac_high": masked_mean(clipped_high, m),
        **kl_estimates(old_logp, rollout_logp, m),  # KL(mu || pi_old)
        "ppo_kl": masked_mean(old_logp - logp, m),
        "ratio_mean": masked_mean(ratio, m),
        "ratio_max": float(ratio[m].max().item()) if m.any() else 0.0,
    }
