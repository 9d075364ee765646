"""The reference policy for KL regularisation: a frozen copy of the base model, loaded only when a run asks for it.

A run pays for a reference model (a second copy of the weights, and one extra forward pass per sample and step)
only when `loss.options.kl_coef > 0` (KL in the loss) or `loss.kl_reward_coef > 0` (KL as a reward penalty). The
reference is always the run's base `model`, also after `--resume`: the KL keeps the policy near where training
started, not near the last checkpoint. Its memory is reported in the step metrics (`ref_model_bytes`).

Limitation: the reference lives in the driver process, where `load_model` puts it (the CPU), also when FSDP trainer
workers hold the policy on GPUs; its pass costs a CPU forward of the whole model per step. That is fine for the
small models of a CPU machine; sharding the reference onto the trainer workers is left to do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentrl.config import LossConfig
from agentrl.models import load_model

__all__ = ["ReferencePolicy", "needs_reference", "load_reference"]


@dataclass(frozen=True)
class ReferencePolicy:
    """A frozen model and what it costs.

    Attributes:
        model: the causal LM, in eval mode, with no parameter requiring grad.
        memory_bytes: bytes of its parameters and buffers.
    """

    model: torch.nn.Module
    memory_bytes: int


def needs_reference(loss: LossConfig) -> bool:
    """True when the run's loss or reward uses KL to a reference model."""
    return float(loss.options.get("kl_coef", 0.0)) > 0 or loss.kl_reward_coef > 0


def load_reference(model_name: str, loss: LossConfig, dtype: torch.dtype) -> ReferencePolicy | None:
    """The frozen base model `model_name` when `needs_reference(loss)`, else None (nothing is loaded)."""
    if not needs_reference(loss):
        return None
    model = load_model(model_name, dtype=dtype).model
    model.eval()
    model.requires_grad_(False)
    tensors = [*model.parameters(), *model.buffers()]
    return ReferencePolicy(model, sum(t.numel() * t.element_size() for t in tensors))
