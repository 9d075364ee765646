"""`build_engines`: the run's engine(s) as one `RequestEngine`, in this process or as Ray actors.

Kept apart from `agentrl.engine.factory` (what one engine is and how it is built), which the engine actors import
themselves: this module is the one place that chooses between an in-process engine and a pool of actors.
"""

from __future__ import annotations

import shutil
from typing import Any

from agentrl.engine.base import RequestEngine
from agentrl.engine.factory import EngineSpec, model_files, write_model_files
from agentrl.engine.requests import BatchedRequests

__all__ = ["build_engines", "choose_engine"]


def choose_engine(requested: str, model: Any, model_name: str) -> tuple[str, str]:
    """The engine kind to build for `model` (a transformers module), and why when it was not asked for by name.

    ``auto`` means vLLM where it imports and can serve the model (its architecture is in vLLM's registry; on the CPU
    build, its head size is one the CPU attention serves), else the HF engine. vLLM's continuous batching and prefix
    cache make multi-turn rollouts several times faster on the same hardware (`bench/micro/engine_throughput.py`); the
    HF engine runs every model transformers loads. ``hf`` and ``vllm`` are taken as asked (a vLLM that cannot serve the
    model is refused later with the reason).
    """
    if requested != "auto":
        return requested, ""
    from agentrl.engine.vllm import unservable_reason, vllm_available

    problem = vllm_available()
    if problem is not None:
        return "hf", f"vLLM is not usable here ({problem})"
    # A module built in memory (the tiny test models) has no `architectures` until saved: its class is that name.
    config = model.config.to_dict()
    config["architectures"] = config.get("architectures") or [type(model).__name__]
    problem = unservable_reason(config, model_name)
    if problem is not None:
        return "hf", problem
    return "vllm", f"vLLM imports here and serves {model_name}"


def build_engines(spec: EngineSpec, policy: Any, *, replicas: int = 1, ray_address: str | None = None,
                  share_module: bool = False, version: int = 0, placement: Any = None,
                  resources: dict[str, float] | None = None) -> RequestEngine:
    """The run's engine(s), as one `RequestEngine`, sampling from `policy`'s current weights as `version`.

    Args:
        spec: what each engine is.
        policy: the trainer's `LoadedModel`.
        replicas: engines; more than one (or a `ray_address`) makes them Ray actors.
        ray_address: Ray cluster for the engine actors (None: a local Ray when actors are needed).
        share_module: in-process HF engine only: sample from the trainer's module itself (correct only for lockstep
            rollouts, see `HFEngine`).
        version: the policy version of `policy`'s weights.
        placement: a `agentrl.training.placement.Placement` with engine bundles: the engines become Ray actors in
            their reserved bundles (their GPUs, or a trainer's GPU when colocated).
        resources: Ray custom resources each engine actor asks for outside a placement group (pins the engines to
            the nodes that offer them); engines become actors even with one replica.

    Raises:
        EngineError: a model the chosen engine cannot serve, too little memory, vLLM missing (before any rollout).
    """
    if replicas < 1:
        raise ValueError(f"engines must be >= 1, got {replicas}")
    if spec.kind == "vllm":
        from agentrl.engine.vllm import require_vllm

        require_vllm()
    if replicas > 1 or ray_address or placement is not None or resources:
        from agentrl.engine.workers import EngineActorPool

        files = model_files(policy)
        if spec.kind == "vllm":  # refuse here, with the reason, rather than as a dead actor
            _check_vllm_here(files, spec)
        return EngineActorPool(spec, files, replicas=replicas, version=version, address=ray_address,
                               actor_options=placement.engine_options if placement is not None else None,
                               resources=resources)
    if spec.kind == "vllm":
        from agentrl.engine.vllm import VLLMEngine

        folder = write_model_files(model_files(policy, merge=spec.lora is None))
        try:
            engine = VLLMEngine(folder, dtype=spec.dtype, max_model_len=spec.max_model_len,
                                kv_cache_gib=spec.kv_cache_gib, seed=spec.seed, capture_routes=spec.capture_routes,
                                sleep_mode=spec.sleep_mode, lora=spec.lora, tuning=spec.vllm)
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # vLLM has read the weights; later ones come as tensors
        if spec.lora is not None:  # the base is loaded: the policy's adapters (a resumed run's trained ones) on top
            from agentrl.training.lora import adapter_state

            engine.update_weights(adapter_state(policy.model).items(), version)
        engine.policy_version = version
        return engine
    import torch

    from agentrl.engine.hf import HFEngine

    dtype = getattr(torch, spec.dtype)
    same = dtype == next(policy.model.parameters()).dtype
    engine = HFEngine(policy.model, policy.tokenizer, batch_size=spec.batch_size, capture_routes=spec.capture_routes,
                      dtype=None if same else dtype, share_module=share_module and same,
                      prefix_cache_bytes=int(spec.kv_cache_gib * 2**30))
    engine.policy_version = version
    return BatchedRequests(engine)


def _check_vllm_here(files: dict[str, bytes], spec: EngineSpec) -> None:
    from agentrl.engine.vllm import check_servable

    folder = write_model_files({k: v for k, v in files.items() if not k.endswith(".safetensors")})
    try:
        weights = sum(len(v) for k, v in files.items() if k.endswith(".safetensors"))
        check_servable(folder, kv_cache_gib=spec.kv_cache_gib, weight_bytes=weights)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
