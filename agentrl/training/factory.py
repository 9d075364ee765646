"""Build the training backend a command asks for, from the trainer and optimizer sections and the trainer's plan."""

from __future__ import annotations

from agentrl.config import OptimConfig, TrainerConfig
from agentrl.models import LoadedModel
from agentrl.training.allocator import run_threshold_kb
from agentrl.training.backend import TrainingBackend
from agentrl.training.fsdp import FSDPBackend, WorkerSpec
from agentrl.training.placement import Placement
from agentrl.training.plan import TrainerPlan
from agentrl.training.single import SingleProcessBackend

__all__ = ["build_backend"]


def build_backend(trainer: TrainerConfig, optim: OptimConfig, plan: TrainerPlan, *, policy: LoadedModel,
                  source: str, placement: Placement | None, seed: int) -> TrainingBackend:
    """The one-process backend (``trainer.workers == 0``: it trains `policy` in place) or FSDP2 workers on Ray.

    Args:
        trainer: where and in what precision to train.
        optim: AdamW's settings.
        plan: the trainer's plan (`agentrl.training.plan.plan_trainer`): compute precision, gradient checkpointing.
        policy: the driver's model (trained in place by the one-process backend).
        source: what FSDP workers load the weights from (the model name, or the checkpoint being resumed).
        placement: the devices reserved for the workers (None: none reserved).
        seed: seeds the workers.
    """
    threshold = run_threshold_kb(trainer.return_freed_memory, plan.gradient_checkpointing)
    compute = plan.compute
    if trainer.workers == 0:
        return SingleProcessBackend(policy, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay,
                                    gradient_checkpointing=plan.gradient_checkpointing,
                                    compute_dtype=compute.torch_dtype, lora=trainer.lora,
                                    mmap_threshold_kb=threshold)
    # FSDP2's mixed-precision policy is the workers' master-weight scheme: sharded float32 parameters, gathered in
    # the compute dtype for each block, gradients reduced in float32.
    mixed = compute.dtype != trainer.dtype
    spec = WorkerSpec(source, dtype=trainer.dtype, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay,
                      param_dtype=compute.dtype if mixed else None,
                      reduce_dtype=trainer.reduce_dtype or ("float32" if mixed else None),
                      gradient_checkpointing=plan.gradient_checkpointing, use_gpu=trainer.gpus_per_worker > 0,
                      seed=seed, lora=trainer.lora if trainer.lora.enabled else None,
                      mmap_threshold_kb=threshold)
    return FSDPBackend(spec, trainer.workers, placement)
