"""The stabilized policy-gradient objective: losses, corrections, aggregation, advantages, diagnostics.

The token-level policy gradient is a first-order approximation of the sequence-level objective, valid only while
the training-inference discrepancy (rho = pi_old / mu) and the policy staleness (r = pi_theta / pi_old) stay small
[Zheng et al. 2025]. Importance sampling corrections keep the first honest, clipping keeps the second small, and
Routing Replay (`agentrl.routing_replay`) shrinks both for MoE models.

    from agentrl.objective import policy_loss, compute_advantages
    adv = compute_advantages("group_mean", rewards, group_ids)                      # [N]
    loss, metrics = policy_loss("minirl", logp, old_logp, rollout_logp, adv, mask)  # scalar, dict[str, float]

Modules: `losses` (the registry `LOSSES`), `corrections` (TIS / IcePop / MIS), `aggregation`, `advantages`
(`ADVANTAGES`), `overlong`, `minibatches`, `diagnostics`, `collapse_guard`.
"""

from agentrl.objective.advantages import ADVANTAGES, compute_advantages, informative_groups
from agentrl.objective.aggregation import AGG_MODES, aggregate
from agentrl.objective.collapse_guard import CollapseGuard, GuardVerdict
from agentrl.objective.corrections import CORRECTIONS, CorrectionResult, correction_weights
from agentrl.objective.diagnostics import batch_stats, importance_weight_stats, kl_estimates, token_entropy
from agentrl.objective.losses import LOSSES, LossOptions, loss_options, policy_loss
from agentrl.objective.minibatches import minibatch_indices
from agentrl.objective.overlong import OverlongConfig, apply_overlong, overlong_penalty

__all__ = [
    "ADVANTAGES",
    "AGG_MODES",
    "CORRECTIONS",
    "LOSSES",
    "CollapseGuard",
    "CorrectionResult",
    "GuardVerdict",
    "LossOptions",
    "OverlongConfig",
    "aggregate",
    "apply_overlong",
    "batch_stats",
    "compute_advantages",
    "correction_weights",
    "importance_weight_stats",
    "informative_groups",
    "kl_estimates",
    "loss_options",
    "minibatch_indices",
    "overlong_penalty",
    "policy_loss",
    "token_entropy",
]
