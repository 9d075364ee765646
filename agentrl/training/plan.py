"""The trainer's part of a run plan: one process or FSDP workers, the compute precision, memory, and why.

RL (`agentrl.plan`) and SFT resolve their trainer here from the ``trainer`` section and the longest sample they will
train on, and build the backend from the result (`agentrl.training.factory.build_backend`). The rules:

* backend: FSDP2 workers on Ray when ``trainer.workers > 0``, else the one-process backend in the driver.
* compute precision: ``trainer.compute_dtype`` (``auto``: bfloat16 where the hardware multiplies it natively, with
  float32 master weights; `agentrl.training.precision`).
* memory: gradient checkpointing when ``auto`` and a step of the token budget would not fit the limit; a step that
  cannot fit at all is refused before anything starts (`agentrl.training.memory.plan_training_memory`). The limit is
  ``trainer.memory_limit_gb`` when set; else this machine's free memory, shared by local CPU workers and the driver;
  GPU workers and workers on a cluster are checked on their own devices, not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrl.config import TrainerConfig
from agentrl.training.allocator import run_threshold_kb
from agentrl.training.lora import adapter_parameter_count
from agentrl.training.memory import MemoryPlan, plan_training_memory
from agentrl.training.precision import ComputePrecision, dtype_bytes, resolve_compute_dtype

__all__ = ["TrainerPlan", "plan_trainer", "compute_precision", "memory_limit", "NO_LIMIT"]

NO_LIMIT = 1 << 62
"""The limit of workers whose memory is only known where they run (GPUs, other nodes)."""


@dataclass(frozen=True)
class TrainerPlan:
    """The trainer a command trains with, resolved from its ``trainer`` section before anything starts.

    Attributes:
        backend: ``single`` (in the driver) or ``fsdp`` (FSDP2 Ray workers).
        workers: FSDP workers (0 for ``single``).
        dtype: the precision of the weights, gradients and AdamW state.
        compute: what the forward and backward compute in, and why.
        memory: gradient checkpointing and the estimated peak behind it, against the limit (per worker).
        returns_freed_memory: the trainer pins the C library's mmap threshold (`agentrl.training.allocator`).
        lora: the adapters in words (empty: full fine-tuning).
    """

    backend: str
    workers: int
    dtype: str
    compute: ComputePrecision
    memory: MemoryPlan
    returns_freed_memory: bool
    lora: str = ""

    @property
    def gradient_checkpointing(self) -> bool:
        """Whether blocks recompute their activations in the backward."""
        return self.memory.gradient_checkpointing

    def to_dict(self) -> dict[str, Any]:
        """The plan as saved in ``plan.json`` (the memory estimate as its peak and limit)."""
        return {"backend": self.backend, "workers": self.workers, "dtype": self.dtype,
                "compute_dtype": self.compute.dtype, "compute_why": self.compute.why,
                "gradient_checkpointing": self.gradient_checkpointing,
                "peak_gib": self.memory.estimate.total / 2**30, "limit_gib": self.memory.limit / 2**30,
                "returns_freed_memory": self.returns_freed_memory, "lora": self.lora}

    def rows(self) -> list[tuple[str, str]]:
        """The plan's trainer rows, for the start-of-run table."""
        where = "in the driver" if self.backend == "single" else f"{self.workers} FSDP2 workers"
        limit = "no limit checked here" if self.memory.limit >= NO_LIMIT else f"of {self.memory.limit / 2**30:.1f} GiB"
        compute = f" ({self.compute.why})" if self.compute.why else f", {self.dtype}"
        return [("trainer", f"{where}, computes in {self.compute.dtype}{compute}"),
                ("memory", f"peak ~{self.memory.estimate.total / 2**30:.1f} GiB {limit}; gradient checkpointing "
                           f"{'on' if self.gradient_checkpointing else 'off'}"
                           + ("; freed memory back to the OS at once" if self.returns_freed_memory else ""))]


def compute_precision(trainer: TrainerConfig) -> ComputePrecision:
    """What ``trainer.compute_dtype`` means where the trainer runs (its workers' GPUs, or this machine's CPU)."""
    return resolve_compute_dtype(trainer.compute_dtype, trainer.dtype, on_gpu=trainer.gpus_per_worker > 0)


def memory_limit(trainer: TrainerConfig, *, on_cluster: bool = False) -> int:
    """Bytes one worker's training step may use (0: what this machine has available when the plan is made)."""
    if trainer.memory_limit_gb:
        return int(trainer.memory_limit_gb * 2**30)
    if trainer.workers and (trainer.gpus_per_worker > 0 or on_cluster):
        return NO_LIMIT
    if trainer.workers:
        import psutil

        return psutil.virtual_memory().available // (trainer.workers + 1)  # the workers and the driver share it
    return 0


def lora_line(trainer: TrainerConfig, model: Any) -> str:
    """The adapters in words: rank, alpha, modules and the trainable share ('' without LoRA)."""
    L = trainer.lora
    if not L.enabled:
        return ""
    trainable = adapter_parameter_count(model.config, L)
    total = sum(p.numel() for p in model.parameters())
    return (f"rank {L.rank}, alpha {L.scale_alpha:g} on {', '.join(L.target_modules)}: {trainable / 1e6:.2f}M "
            f"trainable parameters ({100 * trainable / total:.2f}% of {total / 1e6:.0f}M)")


def plan_trainer(trainer: TrainerConfig, model: Any, *, longest_sample: int, compute: ComputePrecision | None = None,
                 engine_copy: bool = False, engine_bytes: int = 0, on_cluster: bool = False) -> TrainerPlan:
    """Resolve the ``trainer`` section for a model and the longest sample it will train on.

    Args:
        trainer: the ``trainer`` section.
        model: the policy module (its config and parameter count).
        longest_sample: the longest sample in tokens (RL: the context budget; SFT: the longest demonstration).
        compute: the compute precision when the caller resolved it already (RL: the engine's precision follows it);
            None: resolved here.
        engine_copy: an in-process inference engine holds its own copy of the weights.
        engine_bytes: memory an in-process engine holds through the step (`agentrl.engine.plan.EnginePlan
            .resident_bytes`).
        on_cluster: the workers run on a Ray cluster.

    Raises:
        ConfigError: the step cannot fit even with gradient checkpointing (the message names what to change).
    """
    compute = compute or compute_precision(trainer)
    memory = plan_training_memory(
        model, dtype_bytes=dtype_bytes(trainer.dtype), token_budget=trainer.micro_batch_tokens,
        longest_sample=longest_sample, checkpointing=trainer.gradient_checkpointing, engine_copy=engine_copy,
        limit_bytes=memory_limit(trainer, on_cluster=on_cluster), shards=max(trainer.workers, 1),
        engine_bytes=engine_bytes,
        trainable_params=adapter_parameter_count(model.config, trainer.lora) if trainer.lora.enabled else None)
    return TrainerPlan(backend="fsdp" if trainer.workers else "single", workers=trainer.workers, dtype=trainer.dtype,
                       compute=compute, memory=memory,
                       returns_freed_memory=run_threshold_kb(trainer.return_freed_memory,
                                                             memory.gradient_checkpointing) > 0,
                       lora=lora_line(trainer, model))
