"""One training step's pieces, between a rollout and the next one: samples, the pi_old pass, the updates.

`TrainingStep` is built once per run from the loss, advantage, optimizer and trainer sections and the backend; the
recipe (`agentrl.recipes.train`) calls its three stages in order:

  make_samples(trajectories) -> StepSamples   advantages (per turn), the KL reward penalty, DAPO's filters, samples
  old_policy(samples)        -> OldPolicy     pi_old and the entropy: the recompute pass, the rollout's own log-probs
                                              (bypass) or, with one mini-batch, the update's own (chosen once)
  update(...)                -> UpdateResult  one optimizer step per mini-batch of whole groups

The rollout's own log-probs (mu) stay as they were: the loss's importance weight pi_old / mu corrects any
train-inference mismatch. Every micro-batch's loss divides by its whole mini-batch's counts, so neither the
micro-batch size nor the number of trainer workers changes the gradient.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from agentrl.chat.samples import trajectory_to_samples
from agentrl.config import AdvantageConfig, ConfigError, LossConfig, OptimConfig, OverlongConfig, TrainerConfig
from agentrl.objective import (
    GiGPOOptions,
    LossOptions,
    apply_overlong,
    informative_groups,
    kl_reward_penalty,
    loss_options,
    minibatch_indices,
    policy_loss,
    turn_advantages,
)
from agentrl.objective.gigpo import episode_steps, step_group_stats
from agentrl.records import Sample, Trajectory
from agentrl.training.backend import LossResult, PolicyObjective, TrainingBackend
from agentrl.training.logprobs import token_logprobs
from agentrl.training.metrics import weighted_mean
from agentrl.training.microbatch import MicroBatch, collate, pack_by_tokens
from agentrl.training.reference import ReferencePolicy
from agentrl.training.routing_replay import DenseRouting

log = logging.getLogger(__name__)

__all__ = ["TrainingStep", "StepSamples", "OldPolicy", "UpdateResult", "TrainingError", "build_loss_options",
           "choose_old_policy", "as_trained", "carries_gradient", "gradient_members", "MISMATCH_KL", "MISMATCH_KEYS"]

MISMATCH_KL = "mismatch_kl_k3"
"""The metric the collapse guard reads: KL(mu || pi_old), k3, over the samples drawn with the current weights."""
MISMATCH_KEYS = ("mismatch_kl_k1", MISMATCH_KL, "mismatch_tokens")


class TrainingError(RuntimeError):
    """The run cannot go on (non-finite loss, collapse guard tripped); the message says why and where."""


@dataclass(frozen=True)
class StepSamples:
    """What step 2-3 give the rest of the step.

    Attributes:
        samples: the training samples (one per prefix-consistent run of turns of the episodes left in the loss).
        rewards: `[N_traj]` every episode's reward before any penalty (for the metrics).
        ref_logp: the reference's log-probs per sample index `[len - 1]`; empty without a reference model.
        metrics: what the filters and penalties did (overlong_frac, uninformative_frac, kl_reward_penalty_mean, ...).
        origins: per sample, `(trajectory, part)`: the index of its episode in the step's trajectories and its index
            among that episode's samples (a multi-turn episode may train as several samples).
    """

    samples: list[Sample]
    rewards: torch.Tensor
    ref_logp: dict[int, torch.Tensor]
    metrics: dict[str, float]
    origins: list[tuple[int, int]] = field(default_factory=list)


@dataclass(frozen=True)
class OldPolicy:
    """What step 4 gives the updates.

    Attributes:
        logp: log pi_old per sample index `[len - 1]`; None: the update pass's own log-probs, detached.
        entropy: the mean entropy over loss tokens; None: the update pass reports it.
        micro_batches: the sample indices of each micro-batch of the pass.
    """

    logp: dict[int, torch.Tensor] | None
    entropy: float | None
    micro_batches: list[list[int]]


@dataclass(frozen=True)
class UpdateResult:
    """What step 5 did.

    Each micro-batch's loss result, each optimizer step's gradient norm, the samples skipped, and which micro-batches
    held only samples drawn with the weights being trained (`fresh`, parallel to `results`).
    """

    results: list[LossResult]
    grad_norms: list[float]
    skipped: int
    fresh: list[bool] = field(default_factory=list)

    def mismatch(self) -> dict[str, float | None]:
        """KL(mu || pi_old) over the fresh samples alone (None when the step trained on no fresh sample).

        The training-inference mismatch without the staleness that older samples add: the collapse guard reads it.
        """
        fresh = [r for r, f in zip(self.results, self.fresh) if f]
        if not fresh:
            return dict.fromkeys(MISMATCH_KEYS)
        means = weighted_mean(fresh)
        return {f"mismatch_{k}": means[k] for k in ("kl_k1", "kl_k3")} | {
            "mismatch_tokens": float(sum(r.loss_tokens for r in fresh))}


def build_loss_options(loss: LossConfig, per_turn_budget: int) -> LossOptions:
    """The run's loss options, built once.

    Dr.GRPO's constant divisor defaults to the largest per-turn token budget, the same for every micro-batch whatever
    its padded width.
    """
    options = dict(loss.options)
    if loss_options(loss.name, **options).agg == "seq-mean-token-sum-norm":
        options.setdefault("loss_scale_factor", float(per_turn_budget))
    return loss_options(loss.name, **options)


def as_trained(trajectories: list[Trajectory], step: int) -> list[Trajectory]:
    """The trajectories as step `step` trains them: recording the step, with group ids unique within the step.

    A rollout numbers its groups from 0, so a step that trains on rollouts of several policy versions (async mode)
    would otherwise merge unrelated groups in the advantage baseline and the mini-batch split; two rollouts of the same
    version can meet too (async mode, when a step lost a group to the staleness bound and takes one of the next
    step's), so a group is its (version, id, task seed). A group's episodes share all three.
    """
    ids: dict[tuple[int, int, int], int] = {}
    return [replace(t, train_step=step, group_id=ids.setdefault((t.policy_version, t.group_id, t.seed), len(ids)))
            for t in trajectories]


def carries_gradient(sample: Sample) -> bool:
    """Whether any of the sample's loss tokens has a nonzero advantage.

    Every policy loss here is the advantage times a function of the log-probs (ratios, clips and corrections
    included), so without a KL or entropy term a sample whose loss tokens all have advantage 0 adds exactly 0 to the
    gradient: the base model's first WebShop step (every episode scores 0) trains nothing.
    """
    advantages = sample.token_advantages or (sample.advantage,) * len(sample.input_ids)
    return any(a != 0.0 for a, m in zip(advantages, sample.loss_mask) if m)


def gradient_members(samples: list[Sample], members: list[int]) -> list[int]:
    """The members whose forward and backward can change the update: those that carry a gradient.

    When none does, the shortest member stays, so that the optimizer step still sees the zero gradients it would
    have seen (AdamW moves weights with zero gradients, through its moments and weight decay, and skips
    parameters without any).
    """
    kept = [i for i in members if carries_gradient(samples[i])]
    return kept or [min(members, key=lambda i: len(samples[i].input_ids))]


def overlong_and_dynamic_sampling(trajectories: list[Trajectory], loss: LossConfig, budget: int,
                                  extra: dict[str, float]) -> tuple[list[Trajectory], list[bool]]:
    """DAPO's overlong treatment and dynamic sampling: the rewards advantages see, and which episodes train.

    An episode counts as overlong when one of its replies stopped at the per-turn budget; its length is its longest
    reply. Left-out episodes still take part in their group's baseline (their reward was real), only their tokens
    leave the loss.
    """
    keep = [True] * len(trajectories)
    if loss.overlong.mode != "none":
        config = overlong_config(loss, budget)
        rewards = torch.tensor([t.total_return for t in trajectories], dtype=torch.float32)  # [N]
        lengths = torch.tensor([max((len(x.generated_ids) for x in t.turns), default=0) for t in trajectories])
        cut = torch.tensor([any(x.finish_reason == "length" for x in t.turns) for t in trajectories])  # [N]
        new_rewards, mask = apply_overlong(rewards, lengths, cut, torch.ones(len(trajectories), 1), config)
        trajectories = [replace(t, total_return=float(r)) for t, r in zip(trajectories, new_rewards.tolist())]
        keep = [k and bool(m) for k, m in zip(keep, mask[:, 0].tolist())]
        extra["overlong_frac"] = float(cut.float().mean()) if trajectories else 0.0
    if loss.dynamic_sampling:
        rewards = torch.tensor([t.total_return for t in trajectories], dtype=torch.float32)
        informative = informative_groups(rewards, torch.tensor([t.group_id for t in trajectories]))
        keep = [k and bool(i) for k, i in zip(keep, informative.tolist())]
        extra["uninformative_frac"] = 1.0 - float(informative.float().mean()) if trajectories else 0.0
    return trajectories, keep


def overlong_config(loss: LossConfig, budget: int) -> OverlongConfig:
    """The objective's overlong settings: the configured ones, counting to `budget` unless a max_length is set.

    Raises:
        ConfigError: the settings do not fit the budget (a penalty band longer than the budget itself).
    """
    try:
        return replace(loss.overlong, max_length=loss.overlong.max_length or budget)
    except ValueError as e:
        raise ConfigError(f"loss.overlong: {e} (the per-turn token budget is {budget}; set "
                          f"loss.overlong.cache_length to at most that)") from None


def unmasked(traj: Trajectory) -> Trajectory:
    """`traj` as if none of its turns were stale (`Turn.stale`): every generated token counts.

    The KL reward penalty sums over these tokens: the stale mask is the loss's, and an episode's penalised return must
    not depend on how late its turns were trained.
    """
    if not any(turn.stale for turn in traj.turns):
        return traj
    return replace(traj, turns=tuple(replace(turn, stale=False) for turn in traj.turns))


def layout_indices(parts: list[Sample], layout: list[Sample], start: int) -> list[int]:
    """Where one episode's training samples `parts` lie among the samples the reference scored.

    `layout` is that episode's samples with stale turns unmasked (`unmasked`), in the same order, the first at index
    `start`; `parts` leaves out those that only stale turns would train, so each part is the next layout sample with
    its token ids.
    """
    out, i = [], 0
    for part in parts:
        while layout[i].input_ids != part.input_ids:
            i += 1
        out.append(start + i)
        i += 1
    return out


def kl_penalty_per_trajectory(trajectories: list[Trajectory], ref_logp: dict[int, torch.Tensor],
                              loss: LossConfig) -> torch.Tensor:
    """The KL reward penalty of every trajectory `[N_traj]`: coef * sum_t k(log mu, log pi_ref) over its tokens.

    Every generated token counts, those of stale turns too: `ref_logp` is indexed like the samples
    `trajectory_to_samples` makes of the `unmasked` trajectories, in order. The rollout's own log-probs stand for the
    sampling policy (pi_old = mu up to the training-inference mismatch).
    """
    penalties, index = [], 0
    for traj in trajectories:
        total = 0.0
        for s in trajectory_to_samples(unmasked(traj), 0.0, per_turn=loss.per_turn_samples):
            mu = torch.tensor(s.rollout_logprobs[1:], dtype=torch.float32)[None]  # [1, T]
            mask = torch.tensor(s.loss_mask[1:], dtype=torch.bool)[None]  # [1, T]
            total += float(kl_reward_penalty(mu, ref_logp[index][None], mask, loss.kl_reward_coef,
                                             loss.kl_reward_estimator))
            index += 1
        penalties.append(total)
    return torch.tensor(penalties)


OldPolicyPass = Callable[["TrainingStep", list[Sample]], OldPolicy]
"""Step 4, chosen once per run (`choose_old_policy`)."""


def bypass_old_policy(step: TrainingStep, samples: list[Sample]) -> OldPolicy:
    """Bypass mode: pi_old = mu, the rollout's own log-probs; no pass runs (the entropy comes from the updates)."""
    step.routing.begin_step(len(samples))
    logp = {i: torch.tensor(s.rollout_logprobs[1:], dtype=torch.float32) for i, s in enumerate(samples)}
    return OldPolicy(logp, None, step.micro_batches(samples, range(len(samples))))


def update_is_old_policy(step: TrainingStep, samples: list[Sample]) -> OldPolicy:
    """pi_old = the update pass's own log-probs, detached; no pass runs and the updates report the entropy.

    Exact with one optimizer step per rollout: the update's forward runs on the weights a recompute pass would score.
    """
    step.routing.begin_step(len(samples))
    return OldPolicy(None, None, step.micro_batches(samples, range(len(samples))))


def score_old_policy(step: TrainingStep, samples: list[Sample]) -> OldPolicy:
    """pi_old: the trainer's log-probs of the sampled tokens before any update, and their mean entropy."""
    chunks = step.micro_batches(samples, range(len(samples)))
    step.routing.begin_step(len(samples))
    requests = [step.routing.score_request(idx, [samples[i] for i in idx], step.collate(samples, idx))
                for idx in chunks]
    logp: dict[int, torch.Tensor] = {}
    entropy_sum, entropy_tokens = 0.0, 0.0
    for idx, request, scored in zip(chunks, requests, step.backend.score(requests)):
        step.routing.scored(idx, [samples[i] for i in idx], request.batch, scored)
        logp |= {i: scored.logp[row, : len(samples[i].input_ids) - 1] for row, i in enumerate(idx)}
        entropy_sum += float((scored.entropy * request.batch.loss_mask).sum())
        entropy_tokens += float(request.batch.loss_mask.sum())
    return OldPolicy(logp, entropy_sum / max(entropy_tokens, 1.0), chunks)


def choose_old_policy(loss: LossConfig, optim: OptimConfig, routing: DenseRouting) -> OldPolicyPass:
    """Step 4, chosen once per run.

    Bypass (pi_old = mu); the update's own log-probs (``old_policy_pass: auto`` with one mini-batch and a routing
    strategy that does not read the pass); or the recompute pass.
    """
    if loss.bypass:
        return bypass_old_policy
    if loss.old_policy_pass == "auto" and optim.n_minibatches == 1 and not routing.needs_old_policy_pass:
        return update_is_old_policy
    return score_old_policy


@dataclass
class TrainingStep:
    """The step's stages over one backend, with the options a run chose once.

    Attributes:
        backend: where the weights and AdamW live (one process or FSDP workers).
        routing: the Routing Replay strategy (`DenseRouting` for dense models).
        loss, advantage, optim, trainer: the config sections the step reads.
        per_turn_budget: the largest per-turn token budget (DAPO's overlong budget, Dr.GRPO's divisor).
        pad_id: the id that pads micro-batches (never trained on: the loss mask is 0 there).
        shuffle: the mini-batch shuffle generator (saved in checkpoints: the data order resumes exactly).
        out: the run folder (a batch with a non-finite loss is saved there).
        reference: the frozen reference model, only when a KL term asks for it.
    """

    backend: TrainingBackend
    routing: DenseRouting
    loss: LossConfig
    advantage: AdvantageConfig
    optim: OptimConfig
    trainer: TrainerConfig
    per_turn_budget: int
    pad_id: int
    shuffle: torch.Generator
    out: Path
    reference: ReferencePolicy | None = None

    def __post_init__(self) -> None:
        self.objective = build_loss_options(self.loss, self.per_turn_budget)
        overlong_config(self.loss, self.per_turn_budget)  # a penalty band that cannot fit fails now, not at step 0
        self.old_policy_pass = choose_old_policy(self.loss, self.optim, self.routing)

    def micro_batches(self, samples: list[Sample], members: Sequence[int]) -> list[list[int]]:
        """Sample indices per micro-batch: longest first, filled to the token budget (see `pack_by_tokens`)."""
        return pack_by_tokens([len(s.input_ids) for s in samples], members, self.trainer.micro_batch_tokens,
                              self.trainer.micro_batch_size, packed=self.trainer.packing)

    def collate(self, samples: list[Sample], idx: Sequence[int]) -> MicroBatch:
        """The micro-batch of samples `idx`: padded, with the padding-free layout when `trainer.packing` is on."""
        return collate([samples[i] for i in idx], self.pad_id, packed=self.trainer.packing)

    def make_samples(self, trajectories: list[Trajectory]) -> StepSamples:
        """Advantages within each group of episodes of the same task, then one sample per prefix-consistent run.

        One advantage per turn (equal within an episode for the episode-level estimators, per step for GiGPO). With a
        reference model, it scores the sampled tokens first, and with a KL reward penalty each episode's reward pays
        coef * sum_t k(mu, pi_ref) before the advantages, over every token it generated (stale turns' too).
        """
        L = self.loss
        rewards = torch.tensor([t.total_return for t in trajectories], dtype=torch.float32)  # [N_traj]
        ref_logp: dict[int, torch.Tensor] = {}
        layout: list[list[Sample]] = []  # per episode, its samples with stale turns unmasked: what the reference scores
        extra: dict[str, float] = {}
        if self.reference is not None:
            # The samples' token layout does not depend on the advantages: score it before they exist.
            layout = [trajectory_to_samples(unmasked(t), 0.0, per_turn=L.per_turn_samples) for t in trajectories]
            ref_logp = self.reference_logprobs([s for parts in layout for s in parts])
            extra["ref_model_bytes"] = self.reference.memory_bytes
        if L.kl_reward_coef > 0:
            penalty = kl_penalty_per_trajectory(trajectories, ref_logp, L)  # [N_traj]
            trajectories = [replace(t, total_return=t.total_return - p) for t, p in zip(trajectories, penalty.tolist())]
            extra["kl_reward_penalty_mean"] = float(penalty.mean())
        trajectories, in_loss = overlong_and_dynamic_sampling(trajectories, L, self.per_turn_budget, extra)
        if any(len(t.turns) > 1 for t in trajectories):  # what GiGPO's step groups have to work with, every arm
            gamma = getattr(self.advantage.typed_options(), "gamma", GiGPOOptions().gamma)
            stats = step_group_stats([episode_steps(t) for t in trajectories], gamma, counted=in_loss)
            extra |= {"step_groups_shared_frac": stats.shared_frac, "step_groups_mixed_frac": stats.mixed_frac}
        samples: list[Sample] = []
        origins: list[tuple[int, int]] = []
        trained_ref: dict[int, torch.Tensor] = {}  # the loss's: by training sample (the filters left episodes out)
        starts = list(itertools.accumulate(map(len, layout), initial=0))
        advantages = turn_advantages(self.advantage.estimator, trajectories, self.advantage.options)
        for k, (traj, adv, keep) in enumerate(zip(trajectories, advantages, in_loss)):
            if keep:
                parts = trajectory_to_samples(traj, adv, per_turn=L.per_turn_samples)
                if ref_logp:
                    at = layout_indices(parts, layout[k], starts[k])
                    trained_ref |= {len(samples) + j: ref_logp[i] for j, i in enumerate(at)}
                samples += parts
                origins += [(k, j) for j in range(len(parts))]
        return StepSamples(samples, rewards, trained_ref, extra, origins)

    @torch.no_grad()
    def reference_logprobs(self, samples: list[Sample]) -> dict[int, torch.Tensor]:
        """The reference's log-probs of every sample's next tokens, per sample index `[len - 1]` (one no-grad pass)."""
        out: dict[int, torch.Tensor] = {}
        for idx in self.micro_batches(samples, range(len(samples))):
            logp, _ = token_logprobs(self.reference.model, self.collate(samples, idx))
            out |= {i: logp[row, : len(samples[i].input_ids) - 1] for row, i in enumerate(idx)}
        return out

    def old_policy(self, samples: list[Sample]) -> OldPolicy:
        """Step 4: pi_old and the entropy, as the run chose once (`choose_old_policy`)."""
        return self.old_policy_pass(self, samples)

    def update(self, samples: list[Sample], old: OldPolicy, ref_logp: dict[int, torch.Tensor],
               step: int) -> UpdateResult:
        """One optimizer step per mini-batch of whole groups, accumulated over micro-batches.

        Without a KL or entropy term in the loss, samples with no nonzero advantage skip their passes
        (`gradient_members`): the gradient is the same, and the update's metrics (and, without a pi_old pass, the
        entropy) cover the samples that were trained on.
        """
        results: list[LossResult] = []
        grad_norms: list[float] = []
        fresh: list[bool] = []
        skipped = 0
        opts = self.objective
        exact_skip = opts.kl_coef == 0 and opts.entropy_coef == 0
        groups = torch.tensor([s.group_id for s in samples])
        n_groups = len(set(groups.tolist()))
        n_minibatches = min(self.optim.n_minibatches, n_groups)
        if n_minibatches < self.optim.n_minibatches:  # groups were dropped (filtered, failed): fewer, whole ones
            log.warning("step %d: %d groups left for %d mini-batches; this step trains %d", step, n_groups,
                        self.optim.n_minibatches, n_minibatches)
        for members in minibatch_indices(groups, n_minibatches, generator=self.shuffle):
            members = members.tolist()
            # The update pass computes the entropy when the loss trains on it (bonus) or no pi_old pass did.
            objective = PolicyObjective(functools.partial(policy_loss, self.loss.name, opts=opts), len(members),
                                        sum(samples[i].num_loss_tokens for i in members),
                                        with_entropy=opts.entropy_coef > 0 or self.loss.bypass or old.logp is None,
                                        entropy_grad=opts.entropy_coef > 0)
            trained = gradient_members(samples, members) if exact_skip else members
            skipped += len(members) - len(trained)
            # Fresh and older samples in micro-batches of their own, so the mismatch KL can be read apart from the
            # staleness (the gradient is the same sum; on-policy there is one kind and the packing is unchanged).
            fresh_now = [i for i in trained if samples[i].policy_version == step]
            older = [i for i in trained if samples[i].policy_version != step]
            chunks = self.micro_batches(samples, fresh_now) + self.micro_batches(samples, older)
            fresh += [samples[idx[0]].policy_version == step for idx in chunks]
            requests = [self._update_request(samples, idx, old, ref_logp) for idx in chunks]
            done = self.backend.accumulate(requests, objective)
            for idx, request, result in zip(chunks, requests, done):
                if not result.finite:
                    bad = self.out / f"bad_batch_step{step}.pt"
                    torch.save({"samples": [samples[i] for i in idx], "logp": result.logp,
                                "old_logp": request.old_logp, "metrics": result.metrics}, bad)
                    raise TrainingError(f"non-finite loss ({result.metrics.get('loss')}) at step {step}; the batch "
                                        f"is saved in {bad}")
                self.routing.updated(result)
            results += done
            norm = self.backend.step(self.optim.grad_clip)
            if math.isfinite(norm):
                grad_norms.append(norm)
        return UpdateResult(results, grad_norms, skipped, fresh)

    def _update_request(self, samples: list[Sample], idx: list[int], old: OldPolicy,
                        ref_logp: dict[int, torch.Tensor]):
        """One micro-batch of the update: the padded batch, pi_old and the reference log-probs `[n, T]`, routed."""
        chunk = [samples[i] for i in idx]
        mb = self.collate(samples, idx)
        width = mb.loss_mask.shape[1]
        mb_old = None if old.logp is None else torch.stack(
            [F.pad(old.logp[i], (0, width - len(old.logp[i]))) for i in idx])  # [n, T]
        request = self.routing.update_request(idx, chunk, mb, mb_old)
        if ref_logp:  # KL to the reference in the loss
            request = replace(request, ref_logp=torch.stack([F.pad(ref_logp[i], (0, width - len(ref_logp[i])))
                                                             for i in idx]))  # [n, T]
        return request
