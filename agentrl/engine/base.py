"""The engine contract: what every inference backend takes and returns.

An engine owns the weights it samples from. The trainer hands it new weights as named tensors with a version
(`update_weights`), and every result says which version sampled it, so a trajectory always knows its policy version.
Two ways to ask for samples:

* `InferenceEngine.generate`: a batch of prompts in, one `Generation` each out (lockstep).
* `RequestEngine.submit` / `poll`: one request per episode turn, results as they finish (continuous batching). The
  rollout loop, the scheduler and `agentrl eval` speak this one only; `agentrl.engine.requests.BatchedRequests`
  adapts a batch-only engine to it.

Every capability the loop uses is a method of the protocol, so no caller probes an engine for what it has: an engine
with nothing to do for one of them implements it as a no-op and says why.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["SamplingParams", "Generation", "InferenceEngine", "RequestEngine", "EngineRequest", "EngineResult",
           "NamedTensors", "EngineError"]

NamedTensors = Iterable[tuple[str, "torch.Tensor"]]
"""Weights as (Hugging Face parameter name, tensor) pairs, e.g. ``model.state_dict().items()``."""


class EngineError(RuntimeError):
    """An engine cannot start or serve this model; the message names the cause and the fix."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. Processing order per step: penalties, temperature, then top-k, then top-p, then min-p.

    Attributes:
        temperature: logits are divided by it; 0 means greedy (logprobs are then those of the untempered softmax).
        top_p: nucleus mass kept (1.0 = off).
        top_k: keep the k most likely tokens (0 = off).
        min_p: drop tokens whose probability is below `min_p` times the top token's (0 = off).
        max_new_tokens: per call (per turn).
        stop: strings that end a generation; the text up to and including the stop string is kept.
        seed: seeds the sampler; the same seed and prompts give the same tokens.
        repetition_penalty: transformers / vLLM semantics: logits of tokens already in the prompt or the output
            are divided by it when positive, multiplied when negative (1.0 = off). Applied before temperature.
        presence_penalty: subtracted from the logits of tokens the output already contains (0 = off; OpenAI / vLLM).
        frequency_penalty: subtracted once per earlier occurrence in the output (0 = off; OpenAI / vLLM).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def has_penalties(self) -> bool:
        """True when a repetition, presence or frequency penalty is on (the engine then tracks token counts)."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0 or self.max_new_tokens < 1:
            raise ValueError(f"top_k must be >= 0 and max_new_tokens >= 1, got {self.top_k}, {self.max_new_tokens}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0 (1.0 = off), got {self.repetition_penalty}")


@dataclass(frozen=True)
class Generation:
    """One sampled continuation.

    Attributes:
        token_ids: the generated ids, exactly as sampled (the end-of-turn token included when the model emitted it).
        logprobs: per generated token, its log-probability under the distribution it was actually sampled from,
            i.e. AFTER temperature / top-k / top-p / min-p processing (vLLM's ``processed_logprobs``). This is
            mu in the importance weights pi_old / mu.
        finish_reason: ``"stop"`` (end-of-sequence token or a stop string) or ``"length"`` (max_new_tokens).
        routed_experts: for MoE models when the engine captures them: ``[prompt_len + gen_len - 1, layers, top_k]``
            (uint8 when there are at most 256 experts), the vLLM ``routed_experts`` layout; else None.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: Literal["stop", "length"]
    routed_experts: np.ndarray | None = None


@dataclass(frozen=True)
class EngineRequest:
    """One turn of one episode, to be sampled.

    Attributes:
        id: unique among the requests in flight on one engine.
        prompt: the prompt's token ids (never re-tokenised by the engine).
        params: how to sample; its `seed` makes this request's sample reproducible.
        session: the episode it belongs to: replicated engines keep a session on one replica so that its growing
            prompt keeps hitting that replica's prefix cache.
    """

    id: int
    prompt: tuple[int, ...]
    params: SamplingParams
    session: int = 0


@dataclass(frozen=True)
class EngineResult:
    """A finished request.

    Attributes:
        request_id: `EngineRequest.id`.
        generation: what was sampled.
        policy_version: the version of the weights the request started with (the oldest, if they changed while it
            ran).
    """

    request_id: int
    generation: Generation
    policy_version: int


class InferenceEngine(Protocol):
    """A batch-sampling backend that owns its weights."""

    policy_version: int
    """The version of the weights it samples from now."""

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Sample one continuation per prompt (prompts are token ids; batch them as the backend likes)."""
        ...

    def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        """Load these weights (every name must be one of the model's) and sample as `version` from now on."""
        ...

    def metrics(self) -> dict[str, float]:
        """Counters since the previous call (e.g. the prefix-cache hit rate), for the step's metrics."""
        ...

    def clear_cache(self) -> None:
        """Drop whatever the engine keeps between calls (the HF engine's prefixes); see `RequestEngine.clear_cache`."""
        ...


class RequestEngine(Protocol):
    """A continuous-batching backend: requests go in one at a time and come back as each finishes."""

    policy_version: int
    """The version of the weights new requests start with."""

    def submit(self, request: EngineRequest) -> None:
        """Queue a request; it is sampled alongside whatever else is running."""
        ...

    def poll(self, timeout: float | None = None) -> list[EngineResult]:
        """Finished requests; waits up to `timeout` seconds (None: until one finishes) while requests are pending."""
        ...

    def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        """As `InferenceEngine.update_weights`; requests already running finish with whichever weights they get."""
        ...

    def metrics(self) -> dict[str, float]:
        """As `InferenceEngine.metrics`."""
        ...

    def clear_cache(self) -> None:
        """Drop what the engine keeps for episodes that have ended; the rollout loop calls it after every rollout.

        Episodes never outlive their rollout, so prefixes kept for them can never match again. Engines whose cache
        looks after itself (vLLM's block pool, the replicas of an engine-actor pool) do nothing.
        """
        ...

    def sleep(self) -> None:
        """Give back the device memory generation holds while trainers use the same GPU (colocated layout).

        vLLM's sleep mode drops the KV cache and offloads the weights to host memory; `wake_up` restores them.
        Engines with nothing to give back between rollouts (the HF engine drops its prefixes after each) do nothing.
        """
        ...

    def wake_up(self) -> None:
        """Undo `sleep` before the next weight update or request."""
        ...

    def close(self) -> None:
        """Release processes and memory (idempotent)."""
        ...
