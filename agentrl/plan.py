"""The run plan: every choice set-up resolves from the config, once, before anything starts.

The config says what the user asked for (``engine.kind: auto``, ``context.observation_role: auto``,
``trainer.gradient_checkpointing: auto``, ``engine.kv_cache_gib: 0``); the plan says what the run will do and why
(``vllm``, because it imports and serves the model; ``user`` messages, because the template keeps the token prefix;
checkpointing off, because the step's estimated peak fits). Subsystems build themselves from their own config section
and the plan, never from the whole config. The plan is printed as one short table when a run starts and saved as
``plan.json`` in the run folder. The choices that change what the policy sees (``engine.kind`` and
``context.observation_role``) are also written back into the run's config.yaml, so that `agentrl eval --model
RUN/checkpoint` and `--resume` rebuild the same prompts and engine; the KV size and the memory plan are worked out
again on resume, for the machine it resumes on.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["RunPlan"]


@dataclass(frozen=True)
class RunPlan:
    """What the run will do, resolved from its config at set-up.

    Attributes:
        engine: the engine kind built (``hf`` or ``vllm``).
        engine_why: why that kind, when the config said ``auto``.
        engine_dtype: the engines' precision.
        engine_replicas: engine replicas (Ray actors when > 1 or on a cluster).
        observation_role: the role observations after the first are rendered as (``user`` or ``tool``).
        context_why: why that role, when the config said ``auto``.
        context_tokens: the longest context (prompt + reply) the engines size their KV cache for.
        kv_cache_gib: each engine's KV cache (vLLM) or prefix store (HF).
        kv_note: set when that cache cannot hold every episode in flight.
        trainer: ``single`` (in the driver) or ``fsdp`` (FSDP2 Ray workers).
        trainer_workers: FSDP workers (0 for ``single``).
        dtype: the precision of the trainer's weights, gradients and AdamW state.
        compute_dtype: what the trainer's forward and backward compute in (`agentrl.training.precision`).
        compute_why: why, when the config said ``auto`` (the capability found), or ``set``.
        gradient_checkpointing: whether blocks recompute their activations in the backward.
        peak_gib: the estimated peak memory of a training step (per worker).
        limit_gib: the memory the step may use (per worker).
        ray: ``none``, ``local`` (started for this run) or the cluster address joined.
        ray_why: how that Ray was chosen: ``--ray-address``, ``RAY_ADDRESS`` (``ray job submit``) or neither.
        placement: the devices reserved for trainer workers and engines, in words (empty: none reserved).
        lora: LoRA adapters and how the engines get them, in words (empty: full fine-tuning).
        sync_adapters: the weight sync ships the adapters alone (else the full weights, merged with LoRA).
        returns_freed_memory: the trainer pins the C library's mmap threshold (`agentrl.training.allocator`).
    """

    engine: str
    engine_why: str
    engine_dtype: str
    engine_replicas: int
    observation_role: str
    context_why: str
    context_tokens: int
    kv_cache_gib: float
    kv_note: str
    trainer: str
    trainer_workers: int
    dtype: str
    gradient_checkpointing: bool
    peak_gib: float
    limit_gib: float
    ray: str
    placement: str
    lora: str = ""
    sync_adapters: bool = False
    returns_freed_memory: bool = False
    ray_why: str = ""
    compute_dtype: str = "float32"
    compute_why: str = ""

    def rows(self) -> list[tuple[str, str]]:
        """The plan as (what, choice and why) rows, for the start-of-run table."""
        why = lambda text: f" ({text})" if text else ""  # noqa: E731
        trainer = "in the driver" if self.trainer == "single" else f"{self.trainer_workers} FSDP2 workers"
        limit = "no limit checked here" if self.limit_gib >= 2**30 else f"of {self.limit_gib:.1f} GiB"
        return [
            ("engine", f"{self.engine} x{self.engine_replicas}, {self.engine_dtype}{why(self.engine_why)}"),
            ("context", f"observations as {self.observation_role} messages{why(self.context_why)}"),
            ("kv cache", f"{self.kv_cache_gib:.2f} GiB per engine for {self.context_tokens} tokens{why(self.kv_note)}"),
            ("trainer", f"{trainer}, computes in {self.compute_dtype}"
                        + (f" ({self.compute_why})" if self.compute_why else f", {self.dtype}")),
            ("memory", f"peak ~{self.peak_gib:.1f} GiB {limit}; gradient checkpointing "
                       f"{'on' if self.gradient_checkpointing else 'off'}"
                       + ("; freed memory back to the OS at once" if self.returns_freed_memory else "")),
            ("ray", self.ray + why(self.ray_why) + (f"; reserved: {self.placement}" if self.placement else "")),
        ] + ([("lora", self.lora)] if self.lora else [])

    def table(self) -> str:
        """The plan as a short aligned table (one line per choice)."""
        rows = self.rows()
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)

    def save(self, folder: Path) -> Path:
        """Write ``plan.json`` into the run folder; returns its path."""
        path = Path(folder) / "plan.json"
        path.write_text(json.dumps(asdict(self), indent=1))
        return path
