"""The per-token record of a few training samples per step: what `agentrl view` colours tokens by.

For `token_values_per_step` samples of every step (``RunConfig.token_values_per_step``), one JSON line of
``token_values.jsonl`` in the run folder holds, aligned with the sample's token ids, what the step computed for each
token: the loss mask, the sampler's log-prob (mu), the trainer's log-prob (pi_old), the importance weight the loss
multiplied and whether the correction masked or truncated it there, the advantage and the entropy. Tokens without a
value (prompt, template and observation tokens: loss mask 0) hold null.

Where each value comes from, so that the record shows what the loss did rather than a re-derivation of it:

- One no-grad pass of the trainer over the chosen samples, before the update (`TrainingBackend.score`, so the
  one-process backend and FSDP workers write the same file; MoE experts routed as the update routes them). It gives
  the entropy and, when the loss had no pi_old of the trainer's own (bypass mode, or the update's own forward
  standing in for pi_old), the trainer log-prob.
- pi_old as the loss read it: the pi_old pass's log-probs when the step ran one (then also the recorded trainer
  log-prob), the rollout's own in bypass mode, and this pass's otherwise (the update's forward on the same weights).
- The weight and the masked / truncated flags from `agentrl.objective.losses.loss_weights`, the function the loss
  itself calls, on that pi_old and the rollout's log-probs. A per-token correction is the same on one sample as in
  its micro-batch; sequence-level ones (TIS / MIS ``sequence``, ``geometric``) are per sample in the loss too.

Which samples: spread evenly over the step's samples that carry a gradient (a nonzero advantage on a loss token),
then over the others when too few do; the same choice for the same step.

Departure from "every token, every step": the file is a sample, bounded by the setting (about 40 bytes a token,
see the README's run folder paragraph), and floats keep 4 significant digits; a non-finite value is written as null.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from agentrl.objective.losses import loss_weights
from agentrl.records import Sample, Trajectory
from agentrl.training.backend import ScoreRequest
from agentrl.training.microbatch import collate
from agentrl.training.step import OldPolicy, StepSamples, TrainingStep, carries_gradient

__all__ = ["TOKEN_VALUES", "TokenValues", "choose_samples", "episode_indices", "token_values", "append_token_values",
           "record_token_values"]

TOKEN_VALUES = "token_values.jsonl"
"""The per-token record's file name in the run folder."""


@dataclass(frozen=True)
class TokenValues:
    """One recorded training sample, token by token (one line of ``token_values.jsonl``).

    Every list has one entry per token of `token_ids`; entry t refers to token t (predicted from the tokens before
    it). Floats are None where the value does not exist (loss mask 0) or is not finite.

    Attributes:
        step: the trainer step that trained on the sample (the ``step`` of metrics.jsonl).
        group_id: its episode's group within the step (the ``group_id`` of trajectories.jsonl, which is written
            after the step renumbers groups).
        episode: its episode's index among the step's episodes of that group, in the order of trajectories.jsonl:
            with ``train_step`` and ``group_id`` it names one line there.
        sample: its index among the samples of the episode (a multi-turn episode whose template rewrote history, or
            trained per turn, is several samples).
        policy_version: the trainer step whose weights sampled it.
        token_ids: the whole sample: prompt and completions.
        loss_mask: 1 on the tokens that carry loss.
        sampler_logprob: log mu of the token, from the rollout.
        trainer_logprob: log pi_old of the token: the trainer's weights before the update.
        is_weight: the importance weight the loss multiplied (the correction's, 0 where it or the rejection mask
            dropped the token).
        is_masked: the correction masked (IcePop, MIS, rejection mask) or truncated (TIS) the token's weight.
        advantage: the advantage the loss used at the token.
        entropy: the trainer's entropy of the distribution the token was drawn from.
        correction: the loss's correction (``tis``, ``icepop``, ``mis``, ``none``), to say what `is_masked` means.
    """

    step: int
    group_id: int
    episode: int
    sample: int
    policy_version: int
    token_ids: list[int]
    loss_mask: list[int]
    sampler_logprob: list[float | None]
    trainer_logprob: list[float | None]
    is_weight: list[float | None]
    is_masked: list[bool]
    advantage: list[float | None]
    entropy: list[float | None]
    correction: str = "none"

    def to_json(self) -> str:
        """One compact JSON line (strict JSON: no NaN or Infinity)."""
        return json.dumps(asdict(self), separators=(",", ":"), allow_nan=False)


def choose_samples(samples: Sequence[Sample], count: int) -> list[int]:
    """Which `count` samples of a step to record, in order: spread evenly over those that carry a gradient first.

    Samples come group by group, so an even spread visits different groups. Samples with no nonzero advantage (they
    may skip their passes entirely) fill in only when too few carry one.
    """
    if count <= 0:
        return []
    trained = [i for i, s in enumerate(samples) if carries_gradient(s)]
    rest = [i for i, s in enumerate(samples) if not carries_gradient(s)]
    chosen = _spread(trained, count) + _spread(rest, count - min(count, len(trained)))
    return sorted(chosen)


def _spread(pool: list[int], count: int) -> list[int]:
    """`count` members of `pool` at even strides (all of them when it has no more)."""
    if count >= len(pool):
        return list(pool)
    return [pool[k * len(pool) // count] for k in range(count)]


def episode_indices(trajectories: Sequence[Trajectory]) -> list[int]:
    """Each trajectory's index among the earlier trajectories of its group, in order (trajectories.jsonl's order)."""
    seen: dict[int, int] = {}
    out = []
    for t in trajectories:
        out.append(seen.get(t.group_id, 0))
        seen[t.group_id] = out[-1] + 1
    return out


@torch.no_grad()
def token_values(step: TrainingStep, batch: StepSamples, old: OldPolicy, trajectories: Sequence[Trajectory],
                 step_index: int, count: int) -> list[TokenValues]:
    """The per-token values of `count` of the step's samples, from the weights the update starts from.

    Call it after the pi_old stage (`TrainingStep.old_policy`) and before `TrainingStep.update`.

    Args:
        step: the run's training step (its backend, routing, loss options, pad id).
        batch: the step's samples, with their origins in `trajectories`.
        old: what the pi_old stage gave the update.
        trajectories: the step's episodes as trained (`agentrl.training.step.as_trained`), in the order they are
            saved to trajectories.jsonl.
        step_index: the trainer step.
        count: samples to record.

    Returns:
        One `TokenValues` per chosen sample, in sample order.
    """
    samples = batch.samples
    chosen = choose_samples(samples, count)
    if not chosen:
        return []
    scored: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for idx in step.micro_batches(samples, chosen):
        chunk = [samples[i] for i in idx]
        mb = collate(chunk, step.pad_id)
        # The experts the update replays for these samples (R2 / R3; none for a dense model), so an MoE's trainer
        # log-prob is the one its loss saw.
        routes = step.routing.update_request(idx, chunk, mb, None).replay_routes
        (result,) = step.backend.score([ScoreRequest(mb, replay_routes=routes)])
        for row, i in enumerate(idx):
            n = len(samples[i].input_ids) - 1
            scored[i] = (result.logp[row, :n].float().cpu(), result.entropy[row, :n].float().cpu())  # [len - 1] x 2
    episodes = episode_indices(trajectories)
    records = []
    for i in chosen:
        s = samples[i]
        this_logp, entropy = scored[i]  # [T], T = len - 1: position t scores token t + 1
        own_old = old.logp is not None and not step.loss.bypass  # the step's pi_old pass scored this sample
        trainer = old.logp[i].float().cpu() if own_old else this_logp  # [T]
        pi_old = old.logp[i].float().cpu() if old.logp is not None else this_logp  # [T] as the loss read it
        m = torch.tensor(s.loss_mask[1:], dtype=torch.bool)  # [T]
        mu = torch.tensor(s.rollout_logprobs[1:], dtype=torch.float32)  # [T]
        zero = torch.zeros(())
        corr = loss_weights(step.objective, torch.where(m, pi_old, zero)[None], torch.where(m, mu, zero)[None],
                            m[None])  # [1, T] each
        flagged = (corr.masked | corr.truncated)[0]  # [T]
        advantages = s.token_advantages or (s.advantage,) * len(s.input_ids)
        traj, part = batch.origins[i]
        on = [False, *m.tolist()]  # per token: position t - 1 scores token t; token 0 is never scored
        records.append(TokenValues(
            step=step_index, group_id=s.group_id, episode=episodes[traj], sample=part,
            policy_version=s.policy_version, token_ids=list(s.input_ids), loss_mask=list(s.loss_mask),
            sampler_logprob=_on(on, [None, *mu.tolist()]),
            trainer_logprob=_on(on, [None, *trainer.tolist()]),
            is_weight=_on(on, [None, *corr.weights[0].tolist()]),
            is_masked=[False, *(flagged & m).tolist()],
            advantage=_on(on, list(advantages)),
            entropy=_on(on, [None, *entropy.tolist()]),
            correction=step.objective.correction,
        ))  # fmt: skip
    return records


def _on(where: list[bool], values: list[float | None]) -> list[float | None]:
    """`values` rounded to 4 significant digits where `where` holds, None elsewhere and for non-finite values."""
    return [_round(v) if w else None for w, v in zip(where, values)]


def _round(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return float(f"{x:.4g}")


def append_token_values(records: Sequence[TokenValues], path: str | Path) -> None:
    """Append the records to `path`, one JSON line each."""
    if records:
        with open(path, "a") as f:
            f.write("".join(r.to_json() + "\n" for r in records))


def record_token_values(step: TrainingStep, batch: StepSamples, old: OldPolicy, trajectories: Sequence[Trajectory],
                        step_index: int, count: int, out: Path) -> list[TokenValues]:
    """`token_values` of the step, appended to ``out / TOKEN_VALUES``; returns what it wrote."""
    records = token_values(step, batch, old, trajectories, step_index, count)
    append_token_values(records, out / TOKEN_VALUES)
    return records
