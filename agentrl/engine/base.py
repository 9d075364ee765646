"""The engine contract: what every inference backend takes and returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

__all__ = ["SamplingParams", "Generation", "InferenceEngine"]


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


class InferenceEngine(Protocol):
    """What the rollout loop needs from an inference backend."""

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Sample one continuation per prompt (prompts are token ids; batch them as the backend likes)."""
        ...

    def sync_weights(self, model, policy_version: int) -> None:
        """Make the engine sample from `model`'s current weights, tagged `policy_version`."""
        ...
