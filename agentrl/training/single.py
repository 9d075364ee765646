"""The single-process training backend: the model and AdamW live in the driver (``--trainers 0``, the default).

This is the behaviour agentrl always had on one CPU machine. The FSDP workers (`agentrl.training.fsdp`) reuse its
passes (`MicroBatchPasses`) on their shard of the model, so both backends compute the same losses the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import nullcontext
from pathlib import Path

import torch

from agentrl.training.allocator import pin_mmap_threshold
from agentrl.training.backend import LossResult, Objective, Scored, ScoreRequest, UpdateRequest
from agentrl.training.checkpoint import save_safetensors
from agentrl.training.logprobs import token_logprobs
from agentrl.training.lora import (
    add_lora,
    is_adapter_name,
    load_adapter_into,
    merged_state,
    save_adapter,
    scalings,
)
from agentrl.training.precision import MasterWeights

__all__ = ["MicroBatchPasses", "SingleProcessBackend", "OPTIMIZER_FILE", "build_optimizer", "set_lr", "moe_router"]

OPTIMIZER_FILE = "optimizer.pt"
"""The single-process backend's optimizer state inside a checkpoint folder."""


def moe_router(model: torch.nn.Module):
    """A `RoutingReplay` over the model's MoE routers, or None for a dense model."""
    from agentrl.training.routing_replay import RoutingReplay

    try:
        return RoutingReplay(model)
    except ValueError:
        return None


def build_optimizer(params: Iterable[torch.nn.Parameter], lr: float, betas: tuple[float, float],
                    weight_decay: float) -> torch.optim.Optimizer:
    """AdamW over the trainable ones of `params` (plain or FSDP-sharded alike; with LoRA, the adapters alone)."""
    return torch.optim.AdamW([p for p in params if p.requires_grad], lr=lr, betas=betas, weight_decay=weight_decay)


def set_lr(optimizer: torch.optim.Optimizer, lr: float | None) -> None:
    """Give every parameter group learning rate `lr` (None: leave them as they are)."""
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr


class MicroBatchPasses:
    """The two passes over one micro-batch that every backend runs on its (possibly sharded) model.

    Args:
        model: the causal LM (in train mode).
        router: its `RoutingReplay`, or None for a dense model.
        logprobs: `token_logprobs`-shaped `(model, mb, with_entropy=..., entropy_grad=...) -> (logp, entropy)`; it
            computes in the dtype of the model's weights (`agentrl.training.precision`).
    """

    def __init__(self, model: torch.nn.Module, router=None, logprobs: Callable = token_logprobs):
        self.model = model
        self.router = router
        self.logprobs = logprobs

    def _routing(self, routes: torch.Tensor | None):
        return nullcontext() if routes is None else self.router.replay(routes)

    @torch.no_grad()
    def score(self, request: ScoreRequest) -> Scored:
        """pi_old log-probs and entropy of one micro-batch (replaying or recording its experts when asked)."""
        if request.record_routes:
            with self.router.record() as recording:
                logp, entropy = self.logprobs(self.model, request.batch, with_entropy=True)
            return Scored(logp, entropy, recording.routes)
        with self._routing(request.replay_routes):
            logp, entropy = self.logprobs(self.model, request.batch, with_entropy=True)
        return Scored(logp, entropy)

    def accumulate(self, request: UpdateRequest, objective: Objective, *, scale: float = 1.0) -> LossResult:
        """Forward + backward of the objective of one micro-batch; `scale` multiplies the loss before backward."""
        mb = request.batch
        # The backward runs inside the replay too: gradient checkpointing recomputes the routing there.
        with self._routing(request.replay_routes) as agreement:
            logp, entropy = self.logprobs(self.model, mb, with_entropy=objective.with_entropy,
                                          entropy_grad=objective.entropy_grad)
            loss, metrics = objective(logp, request, entropy)
            # A non-finite loss still runs its backward: distributed workers must all join the same collectives,
            # and the loop refuses the optimizer step afterwards.
            (loss * scale).backward()
        finite = bool(torch.isfinite(loss))
        agreed, compared = agreement.counts() if agreement is not None else (0.0, 0.0)  # None: routed live
        return LossResult(metrics, float(mb.loss_mask.sum()), finite, None if finite else logp.detach(),
                          routes_agreed=agreed, routes_compared=compared)

    def idle_backward(self, request: UpdateRequest) -> None:
        """A forward + backward that adds nothing to the gradient.

        A worker with fewer micro-batches than its peers still has to join every collective of FSDP.
        """
        with self._routing(request.replay_routes):
            logp, _ = self.logprobs(self.model, request.batch)
            (logp.sum() * 0.0).backward()


class SingleProcessBackend:
    """Model + AdamW in this process.

    Args:
        policy: the loaded model (`agentrl.models.LoadedModel`); its module trains in place, so an engine that
            samples from the same module sees every update at once.
        lr, betas, weight_decay: AdamW settings.
        gradient_checkpointing: recompute activations in the backward (less memory, about 30% more compute).
        compute_dtype: the dtype the forward and backward compute in (None: the weights' own). When it differs
            from the model's dtype (bfloat16 on a float32 model), the module's weights become bfloat16 and float32
            masters keep the weights, gradients and AdamW state (`agentrl.training.precision.MasterWeights`).
        lora: LoRA settings (`agentrl.config.LoraConfig`); enabled, adapters are injected into `policy.model` in
            place (so an engine built from it afterwards carries them too) and only they train.
        mmap_threshold_kb: pin the C library's mmap threshold for this process (`agentrl.training.allocator`; 0 =
            leave it), before the first step.
    """

    name = "single"
    world_size = 1
    trains_in_place = True

    def __init__(self, policy, *, lr: float, betas: tuple[float, float], weight_decay: float,
                 gradient_checkpointing: bool = False, compute_dtype: torch.dtype | None = None, lora=None,
                 mmap_threshold_kb: int = 0):
        pin_mmap_threshold(mmap_threshold_kb * 1024)
        self.policy = policy
        self.model = policy.model
        self.lora = lora if lora is not None and lora.enabled else None
        if self.lora is not None:
            add_lora(self.model, self.lora)
        if gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model.train()
        self.router = moe_router(self.model)
        self.passes = MicroBatchPasses(self.model, self.router)
        weights_dtype = next(self.model.parameters()).dtype
        self.master = (MasterWeights(self.model, compute_dtype)
                       if compute_dtype is not None and compute_dtype != weights_dtype else None)
        self.optimizer = build_optimizer(self._trained_parameters(), lr, betas, weight_decay)

    @property
    def is_moe(self) -> bool:
        """True when the model has MoE routers (Routing Replay applies)."""
        return self.router is not None

    def score(self, requests: Sequence[ScoreRequest]) -> list[Scored]:
        """See `TrainingBackend.score`."""
        return [self.passes.score(r) for r in requests]

    def accumulate(self, requests: Sequence[UpdateRequest], objective: Objective) -> list[LossResult]:
        """See `TrainingBackend.accumulate`."""
        return [self.passes.accumulate(r, objective) for r in requests]

    def step(self, grad_clip: float, lr: float | None = None) -> float:
        """See `TrainingBackend.step`."""
        set_lr(self.optimizer, lr)
        norm = float("nan")
        if grad_clip > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(list(self._trained_parameters()), grad_clip))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.master is not None:
            self.master.publish()
        return norm

    def _trained_parameters(self) -> Iterator[torch.nn.Parameter]:
        """What AdamW steps: the float32 masters under mixed precision, else the module's own parameters."""
        return self.master.parameters() if self.master is not None else self.model.parameters()

    def _state(self) -> dict[str, torch.Tensor]:
        """The module's state dict at training precision (the float32 masters under mixed precision)."""
        return self.master.state_dict() if self.master is not None else self.model.state_dict()

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """See `TrainingBackend.named_weights` (the live tensors: no copy; with LoRA, the merged weights)."""
        if self.lora is not None:
            yield from merged_state(self._state(), scalings(self.model)).items()
        else:
            yield from self._state().items()

    def adapter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """See `TrainingBackend.adapter_weights` (the live tensors: no copy)."""
        yield from ((n, t) for n, t in self._state().items() if is_adapter_name(n))

    def save(self, folder: Path) -> None:
        """The HF-format model (`model.safetensors`, config) and `optimizer.pt`.

        With LoRA: the adapter (peft layout) and, when `save_merged`, the merged model.
        """
        if self.lora is None:
            self.model.save_pretrained(folder, state_dict=self._state())
        else:
            save_adapter(folder, dict(self.adapter_weights()), self.lora, self.policy.name)
            if self.lora.save_merged:
                self.model.config.architectures = [type(self.model).__name__]
                self.model.config.save_pretrained(folder)
                save_safetensors(dict(self.named_weights()), folder)
        torch.save(self.optimizer.state_dict(), folder / OPTIMIZER_FILE)

    def load(self, folder: Path, *, weights_only: bool = False) -> None:
        """Weights from the HF-format model in `folder`, and the optimizer state unless `weights_only`."""
        from safetensors.torch import load_file

        if self.lora is not None:
            load_adapter_into(dict(self.adapter_weights()), folder)
            if self.master is not None:
                self.master.publish()
            if not weights_only:
                self.optimizer.load_state_dict(torch.load(folder / OPTIMIZER_FILE))
            return
        state: dict[str, torch.Tensor] = {}
        index = folder / "model.safetensors.index.json"
        files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else [
            "model.safetensors"]
        for name in files:
            state |= load_file(folder / name)
        # Tied weights are saved once: strict=False keeps the tie, and the missing names must all be tied ones.
        loader = self.master.load_state_dict if self.master is not None else self.model.load_state_dict
        missing, unexpected = loader(state, strict=False)
        tied = {k for k in missing if k.endswith("lm_head.weight")}
        if set(missing) - tied or unexpected:
            raise ValueError(f"checkpoint {folder} does not fit the model: missing {sorted(set(missing) - tied)[:5]}, "
                             f"unexpected {sorted(unexpected)[:5]}")
        if not weights_only:
            self.optimizer.load_state_dict(torch.load(folder / OPTIMIZER_FILE))

    def close(self) -> None:
        """Nothing to release: the model lives as long as the driver."""
