"""Which engines a run samples with: `EngineSpec` says what to build, `build_engines` builds it where it belongs.

One engine in the driver (``--engines 1``, no ``--ray-address``), or ``--engines N`` replicas as Ray actors
(`agentrl.engine.workers`). Either way the trainer gets one `RequestEngine` and talks to it through the contract
only: `submit` / `poll` for samples, `update_weights(named_tensors, version)` for weights.

A vLLM engine (and every engine actor) starts from a Hugging Face folder of the policy's current weights: the driver
writes it once (`model_files`); actors receive its bytes through the Ray object store, so engines on other nodes of a
cluster need no shared disk.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrl.config import VllmEngineConfig
from agentrl.engine.base import RequestEngine
from agentrl.engine.requests import BatchedRequests

__all__ = ["EngineSpec", "ENGINE_KINDS", "build_engine", "model_files", "write_model_files"]

ENGINE_KINDS = ("hf", "vllm")
"""`EngineSpec.kind` values."""


@dataclass(frozen=True)
class EngineSpec:
    """How to build one engine, in any process.

    Attributes:
        kind: ``hf`` (transformers, our decode loop) or ``vllm``.
        dtype: the engine's precision (``float32``, ``bfloat16``); it may differ from the trainer's.
        batch_size: HF engine: prompts per forward pass.
        capture_routes: MoE: return the experts every layer chose (R3 Routing Replay).
        kv_cache_gib: memory for the KV cache (vLLM; host memory on the CPU build) or the prefix store (HF).
        max_model_len: vLLM: longest prompt + reply.
        seed: vLLM's global seed (requests carry their own).
        sleep_mode: the engine shares a trainer's GPU and sleeps while it trains (vLLM sleep mode, GPU builds).
        lora: LoRA settings when an in-process vLLM engine takes the adapters (base weights once, adapters by
            version); None: full weights (the HF engine takes adapters through the module it copies).
        vllm: vLLM's throughput settings (``engine.vllm``: KV block size and dtype, batch limits, compilation); the
            HF engine ignores them.
    """

    kind: str = "hf"
    dtype: str = "float32"
    batch_size: int = 32
    capture_routes: bool = False
    kv_cache_gib: float = 2.0
    max_model_len: int = 4096
    seed: int = 0
    sleep_mode: bool = False
    lora: Any = None
    vllm: VllmEngineConfig = field(default_factory=VllmEngineConfig)

    def __post_init__(self) -> None:
        if self.kind not in ENGINE_KINDS:
            raise ValueError(f"engine kind must be one of {', '.join(ENGINE_KINDS)}, got {self.kind!r}")


def model_files(policy: Any, merge: bool = True) -> dict[str, bytes]:
    """The policy (a `LoadedModel`) as the files of a Hugging Face folder: safetensors weights, config, tokenizer.

    A model with LoRA adapters is written as a plain model any engine loads: merged
    (`agentrl.training.lora.merged_state`), or its base weights alone when `merge` is False (an engine that then
    loads the adapter itself).
    """
    from agentrl.training.lora import has_lora

    folder = Path(tempfile.mkdtemp(prefix="agentrl-export-"))
    try:
        if has_lora(policy.model):
            from agentrl.training.checkpoint import save_safetensors
            from agentrl.training.lora import base_state, merged_state, scalings

            state = policy.model.state_dict()
            policy.model.config.architectures = [type(policy.model).__name__]
            policy.model.config.save_pretrained(folder)
            save_safetensors(merged_state(state, scalings(policy.model)) if merge else base_state(state), folder)
        else:
            policy.model.save_pretrained(folder)
        policy.tokenizer.save_pretrained(folder)
        return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_model_files(files: dict[str, bytes]) -> Path:
    """Write `model_files` output into a new temporary folder and return it (the caller removes it)."""
    folder = Path(tempfile.mkdtemp(prefix="agentrl-engine-"))
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def build_engine(spec: EngineSpec, folder: Path) -> RequestEngine:
    """One engine in this process, loaded from a model folder it then owns (used by engine actors)."""
    import torch

    if spec.kind == "vllm":
        from agentrl.engine.vllm import VLLMEngine

        return VLLMEngine(folder, dtype=spec.dtype, max_model_len=spec.max_model_len, kv_cache_gib=spec.kv_cache_gib,
                          seed=spec.seed, capture_routes=spec.capture_routes, sleep_mode=spec.sleep_mode,
                          tuning=spec.vllm)
    from agentrl.engine.hf import HFEngine
    from agentrl.models import load_model

    loaded = load_model(str(folder), dtype=getattr(torch, spec.dtype))
    # The module was loaded for this engine alone: nothing else changes it, so no second copy.
    return BatchedRequests(HFEngine(loaded.model, loaded.tokenizer, batch_size=spec.batch_size,
                                    capture_routes=spec.capture_routes, share_module=True,
                                    prefix_cache_bytes=int(spec.kv_cache_gib * 2**30)))
