"""The training backend: the one narrow interface between the training loop and whatever holds the weights.

The loop (`agentrl.recipes.train`) never touches a module or an optimizer. It hands a backend micro-batches and gets
back numbers: the pi_old log-probs and entropy of a micro-batch (no grad), the forward + backward of the policy loss
of a micro-batch (gradients accumulate), one optimizer step (with gradient clipping; the norm comes back), the full
named weights for the inference engines, and a sharded save / load. Two backends implement it:

* `SingleProcessBackend` (`agentrl.training.single`): the model and AdamW in the driver process (``--trainers 0``).
* `FSDPBackend` (`agentrl.training.fsdp`): FSDP2 over N Ray worker actors (``--trainers N``), data parallel over
  micro-batches.

Calls take lists of micro-batches so a distributed backend can send each worker its share in one message. The loss
stays a pure function carried in a picklable `Objective`, so it runs wherever the weights are: RL's
(`agentrl.objective.policy_loss`) as a `PolicyObjective`, SFT's (`agentrl.recipes.sft.sft_loss`) as a
`LikelihoodObjective`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch

__all__ = [
    "ScoreRequest", "Scored", "UpdateRequest", "Objective", "PolicyObjective", "LikelihoodObjective", "LossResult",
    "TrainingBackend", "TrainerFailure",
]


class TrainerFailure(RuntimeError):
    """A trainer worker died or its collective broke; the message names the worker and the last good checkpoint.

    Args:
        message: what happened, naming the worker and the call.
        died: the worker process is gone (killed, OOM, its node lost): a fresh worker group may well succeed. False
            for an error raised inside the worker's code, which a restart would only repeat.
    """

    def __init__(self, message: str, *, died: bool = False):
        super().__init__(message)
        self.died = died


@dataclass(frozen=True)
class ScoreRequest:
    """One micro-batch for the pi_old pass.

    Attributes:
        batch: the micro-batch (`agentrl.training.microbatch.MicroBatch`: padded tensors, and a packed row when
            `trainer.packing` is on).
        replay_routes: MoE experts to replay in the forward (R3), in the batch's forward layout
            (`MicroBatch.forward_layout`: `[n, S, L, K]` padded, per token of the packed row when packed); None
            routes live.
        record_routes: return the experts the training router chose (R2 replays them in the updates).
    """

    batch: Any
    replay_routes: torch.Tensor | None = None
    record_routes: bool = False


@dataclass(frozen=True)
class Scored:
    """The pi_old pass of one micro-batch.

    Attributes:
        logp: log pi_old of every next token, `[n, T]` (0 before the first loss position).
        entropy: the policy entropy at every position, `[n, T]`.
        routes: the experts the training router chose, in the batch's forward layout, when `record_routes` was
            asked; else None.
    """

    logp: torch.Tensor
    entropy: torch.Tensor
    routes: torch.Tensor | None = None


@dataclass(frozen=True)
class UpdateRequest:
    """One micro-batch for the forward + backward of the policy loss.

    Attributes:
        batch: the micro-batch (padded tensors, and its packed row when packing).
        old_logp: log pi_old of its tokens, `[n, T]`; None: this pass's own log-probs, detached (one optimizer
            step per rollout, so the weights being updated are pi_old).
        replay_routes: MoE experts to replay in the forward and the backward (R2 / R3); None routes live.
        ref_logp: log pi_ref of its tokens, `[n, T]`, when the loss has a KL-to-reference term; else None.
    """

    batch: Any
    old_logp: torch.Tensor | None
    replay_routes: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None


class Objective(Protocol):
    """The loss a backend runs on each micro-batch of one optimizer step; picklable, so trainer workers can run it.

    Attributes:
        with_entropy: the forward also computes the policy entropy `[n, T]` and hands it to the loss.
        entropy_grad: the entropy keeps its gradient.
    """

    with_entropy: bool
    entropy_grad: bool

    def __call__(self, logp: torch.Tensor, request: UpdateRequest,
                 entropy: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss (a scalar that already divides by the step's global counts) and its metrics, of one micro-batch."""
        ...


@dataclass(frozen=True)
class PolicyObjective:
    """The loss of one mini-batch, applied micro-batch by micro-batch with the mini-batch's global denominators.

    Attributes:
        loss_fn: `policy_loss`-shaped: `(logp, old_logp, rollout_logp, advantages, mask, num_sequences=...,
            num_tokens=...) -> (loss, metrics)`; picklable (a module-level function or a `functools.partial` of one)
            so that trainer workers can run it.
        num_sequences: sequences in the whole mini-batch (all micro-batches, all workers).
        num_tokens: loss tokens in the whole mini-batch.
        with_entropy: the forward also computes the policy entropy `[n, T]` and hands it to the loss (bypass mode
            reports it; an entropy bonus trains on it).
        entropy_grad: the entropy keeps its gradient (an entropy bonus).
    """

    loss_fn: Callable[..., tuple[torch.Tensor, dict[str, float]]]
    num_sequences: int
    num_tokens: int
    with_entropy: bool = False
    entropy_grad: bool = False

    def __call__(self, logp: torch.Tensor, request: UpdateRequest,
                 entropy: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss and metrics of one micro-batch, given its live log-probs `[n, T]` (and entropy, when asked)."""
        mb = request.batch
        return self.loss_fn(logp, request.old_logp, mb.rollout_logp, mb.advantages, mb.loss_mask,
                            num_sequences=self.num_sequences, num_tokens=self.num_tokens, ref_logp=request.ref_logp,
                            entropy=entropy)


@dataclass(frozen=True)
class LikelihoodObjective:
    """A loss of the live log-probs and the loss mask alone (no pi_old, no advantages): supervised fine-tuning.

    Attributes:
        loss_fn: `sft_loss`-shaped: `(logp [n, T], loss_mask [n, T], num_tokens) -> loss []`; picklable (a
            module-level function).
        num_tokens: loss tokens in the whole optimizer batch (all micro-batches, all workers), so the micro-batch
            losses sum to the batch's loss whatever the grouping.
    """

    loss_fn: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
    num_tokens: int
    with_entropy: ClassVar[bool] = False
    entropy_grad: ClassVar[bool] = False

    def __call__(self, logp: torch.Tensor, request: UpdateRequest,
                 entropy: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of one micro-batch, given its live log-probs `[n, T]`; its one metric is the loss itself."""
        loss = self.loss_fn(logp, request.batch.loss_mask, self.num_tokens)  # []
        return loss, {"loss": float(loss.detach())}


@dataclass(frozen=True)
class LossResult:
    """What the backward of one micro-batch reports.

    Attributes:
        metrics: the objective's diagnostics (`policy_loss` metrics; the loss alone for `LikelihoodObjective`).
        loss_tokens: loss tokens in the micro-batch (the weight of its metrics in the step's means).
        finite: False when the loss was NaN or infinite (the optimizer step must not run).
        logp: the live log-probs `[n, T]`, only when the loss was not finite (to save the bad batch).
        routes_agreed: under Routing Replay, the (token, layer) pairs where the live router's top-k expert set
            equalled the replayed one (`agentrl.training.routing_replay.ReplayAgreement`); 0 when routed live.
        routes_compared: the (token, layer) pairs compared (replayed ones: padding and last tokens route live).
    """

    metrics: dict[str, float]
    loss_tokens: float
    finite: bool = True
    logp: torch.Tensor | None = None
    routes_agreed: float = 0.0
    routes_compared: float = 0.0


class TrainingBackend(Protocol):
    """Holds the policy weights and the optimizer; does the passes the loop asks for.

    Attributes:
        name: ``single`` or ``fsdp`` (the optimizer-state layout its checkpoints hold).
        world_size: trainer processes (1 for the single-process backend).
        trains_in_place: the driver's own module is the one being trained (an engine sampling from it sees every
            update at once); otherwise the engines need `named_weights` after every update.
        is_moe: the model has MoE routers (Routing Replay applies).
        lora: the LoRA settings when adapters train (`agentrl.config.LoraConfig`), else None.
    """

    name: str
    world_size: int
    trains_in_place: bool
    is_moe: bool
    lora: Any

    def score(self, requests: Sequence[ScoreRequest]) -> list[Scored]:
        """pi_old log-probs and entropy of each micro-batch, without gradients, in the order given."""
        ...

    def accumulate(self, requests: Sequence[UpdateRequest], objective: Objective) -> list[LossResult]:
        """Forward + backward of `objective` for each micro-batch; gradients add up until `step`."""
        ...

    def step(self, grad_clip: float, lr: float | None = None) -> float:
        """Clip the gradient to `grad_clip` (0 = off), take one optimizer step, zero the gradients.

        `lr`, when given, is the learning rate of this step and the next ones (a schedule's value); None keeps it.
        Returns the gradient norm before clipping (NaN when clipping is off).
        """
        ...

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The full (unsharded) weights, as `(name, tensor)` pairs with Hugging Face names, on the CPU.

        With LoRA, the merged weights (``W + alpha / r * B @ A``): what an engine without adapters loads.
        """
        ...

    def adapter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """With LoRA, the (unsharded) adapter tensors alone under the module's names (`agentrl.training.lora`)."""
        ...

    def save(self, folder: Path) -> None:
        """Write the trainer state into `folder`.

        That is an HF-format model any tool can load, plus the (sharded) model and optimizer state needed to resume
        exactly.
        """
        ...

    def load(self, folder: Path, *, weights_only: bool = False) -> None:
        """Restore what `save` wrote (only the weights when `weights_only`, e.g. a collapse-guard rollback)."""
        ...

    def close(self) -> None:
        """Release the workers and their memory (idempotent)."""
        ...
