"""The stabilized policy-gradient objective: losses, corrections, aggregation, advantages, diagnostics.

The token-level policy gradient is a first-order approximation of the sequence-level objective, valid only while
the training-inference discrepancy (rho = pi_old / mu) and the policy staleness (r = pi_theta / pi_old) stay small
[Zheng et al. 2025]. Importance sampling corrections keep the first honest, clipping keeps the second small, and
Routing Replay (`agentrl.training.routing_replay`) shrinks both for MoE models.

    from agentrl.objective import policy_loss, compute_advantages
    adv = compute_advantages("group_mean", rewards, group_ids)                      # [N]
    loss, metrics = policy_loss("minirl", logp, old_logp, rollout_logp, adv, mask)  # scalar, dict[str, float]

Modules: `losses` (the registry `LOSSES`), `corrections` (TIS / IcePop / MIS, rejection masks), `aggregation`,
`advantages` (the registry `ADVANTAGES`, GiGPO included), `gigpo` (step-level advantages), `credit` (per-turn
advantages from any estimator, dispatched on the level its entry declares),
`reference_kl` (KL to a reference model, in the loss or the reward), `overlong`, `minibatches`, `diagnostics`,
`collapse_guard`.
"""

from agentrl.objective.advantages import (
    ADVANTAGES,
    AdvantageSpec,
    advantage_options,
    compute_advantages,
    informative_groups,
)
from agentrl.objective.aggregation import AGG_MODES, aggregate
from agentrl.objective.collapse_guard import CollapseGuard, GuardVerdict
from agentrl.objective.corrections import CORRECTIONS, CorrectionResult, correction_weights, rejection_mask
from agentrl.objective.credit import turn_advantages
from agentrl.objective.diagnostics import importance_weight_stats, kl_estimates, token_entropy
from agentrl.objective.gigpo import EpisodeSteps, GiGPOOptions, episode_steps, gigpo_advantages
from agentrl.objective.losses import LOSSES, LossOptions, loss_options, policy_loss
from agentrl.objective.minibatches import minibatch_indices
from agentrl.objective.overlong import apply_overlong, overlong_penalty
from agentrl.objective.reference_kl import KL_ESTIMATORS, kl_penalty, kl_reward_penalty

__all__ = [
    "ADVANTAGES",
    "AGG_MODES",
    "CORRECTIONS",
    "KL_ESTIMATORS",
    "LOSSES",
    "AdvantageSpec",
    "CollapseGuard",
    "CorrectionResult",
    "EpisodeSteps",
    "GiGPOOptions",
    "GuardVerdict",
    "LossOptions",
    "advantage_options",
    "aggregate",
    "apply_overlong",
    "compute_advantages",
    "correction_weights",
    "episode_steps",
    "gigpo_advantages",
    "importance_weight_stats",
    "informative_groups",
    "kl_estimates",
    "kl_penalty",
    "kl_reward_penalty",
    "loss_options",
    "minibatch_indices",
    "overlong_penalty",
    "policy_loss",
    "rejection_mask",
    "token_entropy",
    "turn_advantages",
]
