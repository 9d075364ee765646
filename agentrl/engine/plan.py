"""The engine's part of a run plan: which engine, in what precision, with how much KV memory, and why.

Every command that samples (``run``, ``eval``, ``serve``) resolves its engines here, from the ``engine`` section and
what the caller knows about its load (episodes in flight, their longest context), then builds them from the plan
(`EnginePlan.spec`, `agentrl.engine.build_engines`). The recipes hold no engine sizing of their own.

The rules, in one place:

* kind: ``auto`` is vLLM where it imports and serves the model, else the HF engine (`choose_engine`).
* precision: ``engine.dtype`` when set; for training, bfloat16 for vLLM (its bfloat16 build samples 1.4-1.7x faster
  on CPU and MiniRL's token-level IS weights correct the mismatch: KL(mu || pi_old) about 2e-3 on the main job,
  docs/results.md) and the trainer's compute dtype for the HF engine, which samples from the trainer's module or a
  copy of it; for evaluation and serving, the weights' own dtype.
* KV memory: ``engine.kv_cache_gib`` when set; else every episode in flight on an engine stays cached at its longest
  context (`agentrl.engine.kv_cache.size_kv_cache`), local replicas splitting this machine's free memory. A server
  cannot know its load: 1 GiB unless set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from agentrl.config import EngineConfig
from agentrl.engine.factory import EngineSpec
from agentrl.engine.kv_cache import size_kv_cache
from agentrl.engine.launch import choose_engine
from agentrl.training.precision import dtype_bytes

__all__ = ["EnginePlan", "plan_engine", "engine_dtype", "kv_cache_gib", "VLLM_RUNTIME_BYTES", "SERVER_KV_GIB",
           "MAX_VLLM_LORA_RANK"]

VLLM_RUNTIME_BYTES = int(1.5 * 2**30)
"""What an in-process vLLM engine holds beside its KV cache and weights (measured here: ~1.6 GB of RSS)."""

SERVER_KV_GIB = 1.0
"""A server's KV memory when ``engine.kv_cache_gib`` is unset: its load is not known when it starts."""

MAX_VLLM_LORA_RANK = 512
"""The largest adapter rank vLLM's LoRA support loads."""


@dataclass(frozen=True)
class EnginePlan:
    """The engines a command samples from, resolved from its ``engine`` section before anything starts.

    Attributes:
        kind: ``hf`` or ``vllm``.
        why: why that kind, when the config said ``auto`` (else empty).
        dtype: the engines' precision.
        replicas: engine replicas (Ray actors when > 1 or on a cluster).
        in_process: one engine in the driver's process (no actors): it stays resident beside an in-process trainer.
        max_model_len: the longest prompt plus reply an engine accepts.
        context_tokens: the longest context the KV memory is sized for (a single-turn run's is its prompts').
        kv_cache_gib: each engine's KV cache (vLLM) or prefix store (HF).
        kv_note: set when that memory cannot hold every episode in flight.
        takes_adapters: the engines load LoRA adapters by version (the sync then ships the adapters alone).
    """

    kind: str
    why: str
    dtype: str
    replicas: int
    in_process: bool
    max_model_len: int
    context_tokens: int
    kv_cache_gib: float
    kv_note: str = ""
    takes_adapters: bool = False

    def rows(self) -> list[tuple[str, str]]:
        """The plan's engine rows, for the start-of-run table."""
        why = lambda text: f" ({text})" if text else ""  # noqa: E731
        return [("engine", f"{self.kind} x{self.replicas}, {self.dtype}{why(self.why)}"),
                ("kv cache", f"{self.kv_cache_gib:.2f} GiB per engine for {self.context_tokens} tokens"
                             f"{why(self.kv_note)}")]

    def spec(self, config: EngineConfig, *, seed: int, capture_routes: bool = False, sleep_mode: bool = False,
             lora: Any = None) -> EngineSpec:
        """What each engine is, for `agentrl.engine.build_engines`.

        Args:
            config: the ``engine`` section (batch size, vLLM's throughput settings).
            seed: vLLM's global seed.
            capture_routes: MoE: return the experts every layer chose (Routing Replay).
            sleep_mode: the engine shares a trainer's GPU and sleeps while it trains.
            lora: the LoRA settings when the engines take adapters (`takes_adapters`) and the kind loads them itself
                (vLLM); None otherwise.
        """
        return EngineSpec(kind=self.kind, dtype=self.dtype, batch_size=config.batch_size,
                          capture_routes=capture_routes, kv_cache_gib=self.kv_cache_gib, seed=seed,
                          max_model_len=self.max_model_len, sleep_mode=sleep_mode, vllm=config.vllm,
                          lora=lora if self.takes_adapters and self.kind == "vllm" else None)

    def resident_bytes(self, n_params: int) -> int:
        """Memory an in-process vLLM engine holds through a training step beside the trainer (0 for any other).

        The HF engine's copy of the weights is counted by the trainer's memory plan (``engine_copy``).
        """
        if self.kind != "vllm" or not self.in_process:
            return 0
        return int(self.kv_cache_gib * 2**30) + n_params * dtype_bytes(self.dtype) + VLLM_RUNTIME_BYTES


def engine_dtype(setting: str, kind: str, *, trainer_compute: str | None, weights_dtype: str) -> str:
    """The precision the engines sample in (the rule is in the module docstring).

    Args:
        setting: ``engine.dtype`` (empty: choose).
        kind: the engine kind.
        trainer_compute: the trainer's compute dtype when the engines sample for training; None when they only
            sample (evaluation, serving).
        weights_dtype: the loaded weights' dtype.
    """
    if setting:
        return setting
    if trainer_compute is None:
        return weights_dtype
    return "bfloat16" if kind == "vllm" else trainer_compute


def kv_cache_gib(config: EngineConfig, model_config: Any, dtype: str, *, episodes_in_flight: int | None,
                 context_tokens: int, on_cluster: bool, available_bytes: int | None = None) -> tuple[float, str]:
    """Each engine's KV memory in GiB, and a note when it cannot hold every episode in flight.

    Args:
        config: the ``engine`` section (``kv_cache_gib`` and ``replicas``).
        model_config: the model's config (layers, heads).
        dtype: the engines' precision.
        episodes_in_flight: episodes sampling at once over all replicas; None for a server (`SERVER_KV_GIB`).
        context_tokens: the longest context an episode reaches.
        on_cluster: the replicas run on a Ray cluster, each with its own machine's memory.
        available_bytes: memory one engine may take half of (default: this machine's free memory, split between
            local replicas).
    """
    if config.kv_cache_gib > 0:
        return config.kv_cache_gib, ""
    if episodes_in_flight is None:
        return SERVER_KV_GIB, ""
    if available_bytes is None and config.replicas > 1 and not on_cluster:
        import psutil

        available_bytes = psutil.virtual_memory().available // config.replicas  # local replicas share this machine
    per_engine = math.ceil(episodes_in_flight / config.replicas)
    return size_kv_cache(model_config, dtype_bytes(dtype), per_engine, context_tokens, available_bytes)


def plan_engine(config: EngineConfig, model: Any, model_name: str, *, episodes_in_flight: int | None,
                max_model_len: int, context_tokens: int = 0, trainer_compute: str | None = None,
                on_cluster: bool = False, lora_rank: int = 0) -> EnginePlan:
    """Resolve the ``engine`` section for a command's load.

    Args:
        config: the ``engine`` section.
        model: the loaded model (`agentrl.models.LoadedModel`): its module tells what vLLM can serve.
        model_name: the model as the user named it (for the reasons in the plan).
        episodes_in_flight: episodes sampling at once over all replicas (None: a server, load unknown).
        max_model_len: the longest prompt plus reply an engine accepts.
        context_tokens: the longest context the KV memory is sized for (0: `max_model_len`).
        trainer_compute: the trainer's compute dtype when sampling for training (see `engine_dtype`).
        on_cluster: engines run on a Ray cluster.
        lora_rank: the adapters' rank when the trainer trains LoRA adapters (0: full fine-tuning).
    """
    kind, why = choose_engine(config.kind, model.model, model_name)
    weights = str(next(model.model.parameters()).dtype).removeprefix("torch.")
    dtype = engine_dtype(config.dtype, kind, trainer_compute=trainer_compute, weights_dtype=weights)
    context_tokens = context_tokens or max_model_len
    gib, note = kv_cache_gib(config, model.model.config, dtype, episodes_in_flight=episodes_in_flight,
                             context_tokens=context_tokens, on_cluster=on_cluster)
    # Engine actors load a Hugging Face folder and take full weights; in-process engines load adapters by version
    # (the HF engine through the module it copies, vLLM through its LoRA support up to its largest rank).
    # (`build_engines` makes actors of engines on a cluster, on reserved GPUs or on a named Ray resource).
    in_process = (config.replicas == 1 and not on_cluster and config.gpus == 0 and not config.colocate
                  and not config.ray_resource)
    takes_adapters = lora_rank > 0 and in_process and (kind == "hf" or lora_rank <= MAX_VLLM_LORA_RANK)
    return EnginePlan(kind=kind, why=why, dtype=dtype, replicas=config.replicas, in_process=in_process,
                      max_model_len=max_model_len,
                      context_tokens=context_tokens, kv_cache_gib=gib, kv_note=note, takes_adapters=takes_adapters)
