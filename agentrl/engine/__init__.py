"""Inference engines behind one narrow interface: token ids + sampling settings in, token ids + logprobs out.

`HFEngine` (transformers, CPU or GPU) is the default; `VLLMEngine` (GPU, the ``gpu`` extra) plugs into the same
`InferenceEngine` protocol.
"""

from agentrl.engine.base import Generation, InferenceEngine, SamplingParams
from agentrl.engine.hf import HFEngine

__all__ = ["Generation", "HFEngine", "InferenceEngine", "SamplingParams"]
