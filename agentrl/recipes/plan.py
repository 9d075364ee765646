"""The run plan: every choice set-up resolves from the config, once, before anything starts.

The config says what the user asked for (``engine.kind: auto``, ``context.observation_role: auto``,
``trainer.gradient_checkpointing: auto``, ``engine.kv_cache_gib: 0``); the plan says what the run will do and why
(``vllm``, because it imports and serves the model; ``user`` messages, because the template keeps the token prefix;
checkpointing off, because the step's estimated peak fits). Each part plans itself from its own config sections and
what the others tell it, and is built from its own plan:

* the rollout (`agentrl.rollout.plan`): the context layout, the episodes in flight and their longest context;
* the engine (`agentrl.engine.plan`): kind, precision and KV memory for that load;
* the trainer (`agentrl.training.plan`): backend, compute precision and memory, beside the engine it shares the
  machine with;
* the cluster (`ClusterPlan`): the Ray a run joined or started and the devices it reserved.

This module only composes them in that order (`plan_run`). The plan is printed as one short table when a run starts
and saved as ``plan.json`` in the run folder, one object per part. The choices that change what the policy sees
(``engine.kind`` and ``context.observation_role``) are also written back into the run's config.yaml, so that
`agentrl eval --model RUN/checkpoint` and ``--resume`` rebuild the same prompts and engine; the KV size and the
memory plan are worked out again on resume, for the machine it resumes on.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from agentrl.engine.plan import EnginePlan, plan_engine
from agentrl.rollout.plan import RolloutPlan, plan_rollout
from agentrl.training.plan import TrainerPlan, compute_precision, plan_trainer

if TYPE_CHECKING:
    from agentrl.config import RunConfig
    from agentrl.models import LoadedModel

__all__ = ["ClusterPlan", "RunPlan", "plan_run"]


@dataclass(frozen=True)
class ClusterPlan:
    """Where a run's processes go.

    Attributes:
        ray: ``none``, ``local`` (started for this run) or the cluster address joined.
        why: how that Ray was chosen: ``--ray-address``, ``RAY_ADDRESS`` (``ray job submit``) or neither.
        placement: the devices reserved for trainer workers and engines, in words (empty: none reserved).
    """

    ray: str = "none"
    why: str = ""
    placement: str = ""

    def rows(self) -> list[tuple[str, str]]:
        """The plan's Ray row, for the start-of-run table."""
        return [("ray", self.ray + (f" ({self.why})" if self.why else "")
                 + (f"; reserved: {self.placement}" if self.placement else ""))]


@dataclass(frozen=True)
class RunPlan:
    """What an RL run will do, resolved from its config at set-up: one plan per part.

    Attributes:
        rollout: the context layout and the rollout's load.
        engine: the engines that sample.
        trainer: the trainer and its memory.
        cluster: Ray and the reserved devices.
        sync_adapters: the weight sync ships the LoRA adapters alone (else the full weights, merged with LoRA).
    """

    rollout: RolloutPlan
    engine: EnginePlan
    trainer: TrainerPlan
    cluster: ClusterPlan
    sync_adapters: bool = False

    def lora_row(self) -> str:
        """The LoRA line: the adapters, and how the engines get them ('' without LoRA)."""
        if not self.trainer.lora:
            return ""
        engines = f"the {self.engine.kind} engine{'s' if self.engine.replicas > 1 else ''}"
        sync = ("weight sync ships the adapters alone" if self.sync_adapters else
                f"{engines} here cannot take adapters: every sync merges them and ships the full weights")
        return f"{self.trainer.lora}; {sync}"

    def rows(self) -> list[tuple[str, str]]:
        """The plan as (what, choice and why) rows, for the start-of-run table."""
        engine, kv = self.engine.rows()
        lora = self.lora_row()
        return ([engine, *self.rollout.rows(), kv, *self.trainer.rows(), *self.cluster.rows()]
                + ([("lora", lora)] if lora else []))

    def table(self) -> str:
        """The plan as a short aligned table (one line per choice)."""
        rows = self.rows()
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)

    def to_dict(self) -> dict:
        """The plan as saved in ``plan.json``: one object per part."""
        return {"rollout": asdict(self.rollout), "engine": asdict(self.engine), "trainer": self.trainer.to_dict(),
                "cluster": asdict(self.cluster), "sync_adapters": self.sync_adapters, "lora": self.lora_row()}

    def save(self, folder: Path) -> Path:
        """Write ``plan.json`` into the run folder; returns its path."""
        path = Path(folder) / "plan.json"
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path


def plan_run(cfg: RunConfig, policy: LoadedModel, *, single_turn: bool,
             cluster: ClusterPlan) -> tuple[RunConfig, RunPlan]:
    """Every `auto` of the config decided once, each part by its owner: rollout, then engine, then trainer.

    The engine's precision follows the trainer's compute precision, and the trainer's memory counts what an
    in-process engine keeps resident, so the compute precision is resolved first and the memory plan last.

    Returns:
        The config with the context, the compute precision and the engine's kind and precision written in (what
        config.yaml saves), and the plan.
    """
    T, S = cfg.trainer, cfg.scheduler
    context, rollout = plan_rollout(cfg.env, cfg.context, S, cfg.sampling, policy, single_turn=single_turn)
    # `auto` compute precision becomes what this machine multiplies natively (written back: a resume keeps it).
    compute = compute_precision(T)
    on_cluster = bool(cfg.ray_address)
    engine = plan_engine(cfg.engine, policy, cfg.model, episodes_in_flight=rollout.episodes_in_flight,
                         max_model_len=rollout.budget_tokens, context_tokens=rollout.context_tokens,
                         trainer_compute=compute.dtype, on_cluster=on_cluster,
                         lora_rank=T.lora.rank if T.lora.enabled else 0)
    n_params = sum(p.numel() for p in policy.model.parameters())
    # An HF engine beside the one-process trainer keeps a copy of the weights unless it samples from the module.
    trainer = plan_trainer(T, policy.model, longest_sample=rollout.budget_tokens, compute=compute,
                           engine_copy=T.workers == 0 and (S.sync_every > 1 or S.async_rollout),
                           engine_bytes=engine.resident_bytes(n_params), on_cluster=on_cluster)
    cfg = replace(cfg, context=context, trainer=replace(T, compute_dtype=compute.dtype),
                  engine=replace(cfg.engine, kind=engine.kind, dtype=engine.dtype))
    return cfg, RunPlan(rollout=rollout, engine=engine, trainer=trainer, cluster=cluster,
                        sync_adapters=engine.takes_adapters)
