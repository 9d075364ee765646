"""Micro-batches: right-padded tensors of a few samples, formed by a token budget rather than a sample count.

A count of samples is the wrong memory knob for multi-turn RL: one merged ALFWorld sample can be 4,000 tokens and a
math sample 80. Like verl's dynamic batch size, we fill each micro-batch up to a budget of padded tokens
(``n_samples x longest``) instead. Samples are sorted by length first, so neighbours have similar lengths and
padding stays small; the gradient does not depend on the grouping, because every loss divides by global
denominators (the sequences and loss tokens of the whole mini-batch), never by a micro-batch's own size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentrl.records import Sample

__all__ = ["MicroBatch", "collate", "pack_by_tokens", "padding_waste"]


@dataclass(frozen=True)
class MicroBatch:
    """Right-padded tensors of a few samples. Token axis T = longest sequence - 1 (position t predicts token t+1)."""

    input_ids: torch.Tensor  # [n, T+1]
    attention_mask: torch.Tensor  # [n, T+1]
    loss_mask: torch.Tensor  # [n, T]
    rollout_logp: torch.Tensor  # [n, T]
    advantages: torch.Tensor  # [n], or [n, T] when some sample's turns have their own advantages (GiGPO)

    @property
    def padded_tokens(self) -> int:
        """Tokens the forward pass processes, padding included."""
        return self.input_ids.numel()


def collate(samples: Sequence[Sample], pad_id: int) -> MicroBatch:
    """Pad samples on the right into one micro-batch."""
    width = max(len(s.input_ids) for s in samples)
    n = len(samples)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.float32)
    rlp = torch.zeros((n, width), dtype=torch.float32)
    for i, s in enumerate(samples):
        length = len(s.input_ids)
        ids[i, :length] = torch.tensor(s.input_ids)
        attn[i, :length] = 1
        mask[i, :length] = torch.tensor(s.loss_mask, dtype=torch.float32)
        rlp[i, :length] = torch.tensor(s.rollout_logprobs, dtype=torch.float32)
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)  # [n]
    if any(s.token_advantages is not None for s in samples):  # per-turn advantages: one per token
        per_token = torch.zeros((n, width), dtype=torch.float32)
        for i, s in enumerate(samples):
            per_token[i, : len(s.input_ids)] = torch.tensor(s.token_advantages or (s.advantage,) * len(s.input_ids))
        adv = per_token[:, 1:]  # [n, T]
    return MicroBatch(ids, attn, mask[:, 1:], rlp[:, 1:], adv)


def pack_by_tokens(lengths: Sequence[int], members: Sequence[int], token_budget: int,
                   max_samples: int = 0) -> list[list[int]]:
    """Split `members` (indices into `lengths`) into micro-batches of at most `token_budget` padded tokens.

    Longest first, each micro-batch takes the next samples while ``count x longest <= token_budget`` (and, when
    `max_samples` > 0, ``count <= max_samples``). A sample longer than the budget gets a micro-batch of its own:
    it cannot be split, and dropping it would bias the gradient.

    Args:
        lengths: token length of every sample.
        members: the samples of one mini-batch.
        token_budget: padded tokens per micro-batch (0 = no token budget: only `max_samples` counts).
        max_samples: cap on samples per micro-batch (0 = none).
    """
    if token_budget <= 0 and max_samples <= 0:
        raise ValueError("pack_by_tokens needs a token budget or a sample cap")
    order = sorted(members, key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = lengths[current[0]] if current else lengths[i]  # sorted: the first member is the longest
        fits_tokens = token_budget <= 0 or (len(current) + 1) * longest <= token_budget
        fits_count = max_samples <= 0 or len(current) < max_samples
        if current and not (fits_tokens and fits_count):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def padding_waste(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """Fraction of the processed tokens that are padding: 1 - real / (sum over micro-batches of n x longest)."""
    real = sum(lengths[i] for b in batches for i in b)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches if b)
    return 1.0 - real / padded if padded else 0.0
