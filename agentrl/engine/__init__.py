"""Inference engines behind one narrow interface: token ids + sampling settings in, token ids + logprobs out.

Engines own their weights (`update_weights(named_tensors, version)`). `HFEngine` (transformers, CPU or GPU) and
`VLLMEngine` (vLLM, CPU or GPU build; imported only when asked for) plug into the same contract; `build_engines`
builds one in the driver or several as Ray actors.
"""

from typing import Any

from agentrl.engine.base import (
    EngineError,
    EngineRequest,
    EngineResult,
    Generation,
    InferenceEngine,
    RequestEngine,
    SamplingParams,
)
from agentrl.engine.factory import EngineSpec
from agentrl.engine.hf import HFEngine
from agentrl.engine.launch import build_engines, choose_engine
from agentrl.engine.requests import BatchedRequests

__all__ = ["BatchedRequests", "EngineError", "EngineRequest", "EngineResult", "EngineSpec",
           "Generation", "HFEngine", "InferenceEngine", "RequestEngine", "SamplingParams", "VLLMEngine",
           "build_engines", "choose_engine"]


def __getattr__(name: str) -> Any:
    """`VLLMEngine` on first use: its module is only imported when asked for (see the module docstring)."""
    if name == "VLLMEngine":
        from agentrl.engine.vllm import VLLMEngine

        return VLLMEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
