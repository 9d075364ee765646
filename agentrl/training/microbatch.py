"""Micro-batches: a few samples for one forward/backward pass, formed by a token budget rather than a sample count.

A count of samples is the wrong memory knob for multi-turn RL: one merged ALFWorld sample can be 4,000 tokens and a
math sample 80. Like verl's dynamic batch size, we fill each micro-batch up to a token budget instead. Samples are
sorted by length first; the gradient does not depend on the grouping, because every loss divides by global
denominators (the sequences and loss tokens of the whole mini-batch), never by a micro-batch's own size.

Two layouts of the same samples:

* padded: ``[n, T+1]`` right-padded rows. The objective always reads this layout (loss mask, rollout log-probs,
  advantages `[n, T]`), so the losses never see packing.
* packed (`PackedLayout`, padding-free, the default for training): the samples' tokens back to back in one row
  ``[1, L]`` (L = the sum of their lengths), with position ids restarting at 0 for each sample and the boundaries
  ``cu_seqlens``, as flash-attention's varlen kernels and verl / TRL's padding-free training lay them out. Only the
  backbone runs on it (`agentrl.training.logprobs.token_logprobs`); attention stays inside each sample
  (`agentrl.training.packing`) and `index` maps every padded position back to its packed one. With packing the token
  budget counts real tokens, and no padding is computed at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentrl.records import Sample

__all__ = ["MicroBatch", "PackedLayout", "collate", "pack_by_tokens", "padding_waste"]


@dataclass(frozen=True)
class PackedLayout:
    """The padding-free layout of a micro-batch's tokens, for the backbone's forward.

    Attributes:
        input_ids: `[1, L]` the samples' tokens back to back (L = sum of their lengths).
        position_ids: `[1, L]` each token's position inside its own sample (0 at every sample's first token).
        cu_seqlens: `[n + 1]` int32 sample boundaries: sample i holds packed positions ``cu_seqlens[i] ..
            cu_seqlens[i + 1] - 1`` (flash-attention's ``cu_seq_lens``).
        max_length: the longest sample.
        index: `[n, T+1]` the packed position of padded position ``(i, t)``, -1 where sample i has no token t.
    """

    input_ids: torch.Tensor  # [1, L]
    position_ids: torch.Tensor  # [1, L]
    cu_seqlens: torch.Tensor  # [n + 1]
    max_length: int
    index: torch.Tensor  # [n, T+1]


@dataclass(frozen=True)
class MicroBatch:
    """Right-padded tensors of a few samples, and their packed layout when the backbone runs padding-free.

    Token axis T = longest sequence - 1 (position t predicts token t+1).
    """

    input_ids: torch.Tensor  # [n, T+1]
    attention_mask: torch.Tensor  # [n, T+1]
    loss_mask: torch.Tensor  # [n, T]
    rollout_logp: torch.Tensor  # [n, T]
    advantages: torch.Tensor  # [n], or [n, T] when some sample's turns have their own advantages (GiGPO)
    packed: PackedLayout | None = None

    @property
    def padded_tokens(self) -> int:
        """Tokens the forward pass processes, padding included (none when packed)."""
        return self.packed.input_ids.numel() if self.packed is not None else self.input_ids.numel()

    @property
    def lengths(self) -> list[int]:
        """Every sample's token count."""
        return self.attention_mask.sum(dim=1).tolist()

    def forward_layout(self, per_sample: Sequence[torch.Tensor], fill: int = -1,
                       dtype: torch.dtype = torch.int16) -> torch.Tensor:
        """Per-sample arrays placed the way the backbone's forward input lays out the tokens.

        Routing Replay uses it: the routes of a forward align with its input, `[n, T+1, ...]` padded or `[1, L, ...]`
        packed.

        Args:
            per_sample: one `[m_i, ...]` array per sample, row 0 at the sample's first token, ``m_i <=`` its length
                (a rollout's routes stop one short: the last token is never fed back).
            fill: the value everywhere else (padding, and positions an array does not reach).
            dtype: the result's dtype.

        Returns:
            `[n, T+1, ...]` (padded) or `[1, L, ...]` (packed).
        """
        if len(per_sample) != self.input_ids.shape[0]:
            raise ValueError(f"{len(per_sample)} arrays for a micro-batch of {self.input_ids.shape[0]} samples")
        lengths = self.lengths
        rows, width = (1, self.packed.input_ids.shape[1]) if self.packed is not None else self.input_ids.shape
        rest = tuple(per_sample[0].shape[1:]) if per_sample else ()
        out = torch.full((rows, width, *rest), fill, dtype=dtype)
        for i, (a, length) in enumerate(zip(per_sample, lengths)):
            a = torch.as_tensor(a)
            if a.shape[0] > length or tuple(a.shape[1:]) != rest:
                raise ValueError(f"sample {i}: an array of shape {tuple(a.shape)} does not fit its {length} tokens "
                                 f"(expected [<= {length}, {', '.join(map(str, rest))}])")
            row, start = (0, int(self.packed.cu_seqlens[i])) if self.packed is not None else (i, 0)
            out[row, start : start + a.shape[0]] = a.to(dtype)
        return out

    def per_sample(self, forward: torch.Tensor) -> list[torch.Tensor]:
        """The inverse of `forward_layout`: each sample's `[len_i, ...]` slice of a tensor laid out like the input."""
        if self.packed is None:
            return [forward[i, :length] for i, length in enumerate(self.lengths)]
        bounds = self.packed.cu_seqlens.tolist()
        return [forward[0, s:e] for s, e in zip(bounds[:-1], bounds[1:])]


def _packed_layout(samples: Sequence[Sample], width: int) -> PackedLayout:
    """The samples' tokens back to back, their in-sample positions, boundaries and the padded-to-packed map."""
    lengths = [len(s.input_ids) for s in samples]
    cu = torch.zeros(len(samples) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0)
    ids = torch.tensor([t for s in samples for t in s.input_ids], dtype=torch.long)[None]  # [1, L]
    positions = torch.cat([torch.arange(length) for length in lengths])[None]  # [1, L]
    index = torch.full((len(samples), width), -1, dtype=torch.long)  # [n, T+1]
    for i, length in enumerate(lengths):
        index[i, :length] = torch.arange(int(cu[i]), int(cu[i]) + length)
    return PackedLayout(ids, positions, cu, max(lengths), index)


def collate(samples: Sequence[Sample], pad_id: int, *, packed: bool = False) -> MicroBatch:
    """Pad samples on the right into one micro-batch; with `packed`, also lay their tokens out padding-free."""
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
    layout = _packed_layout(samples, width) if packed else None
    return MicroBatch(ids, attn, mask[:, 1:], rlp[:, 1:], adv, layout)


def pack_by_tokens(lengths: Sequence[int], members: Sequence[int], token_budget: int,
                   max_samples: int = 0, *, packed: bool = False) -> list[list[int]]:
    """Split `members` (indices into `lengths`) into micro-batches of at most `token_budget` processed tokens.

    Longest first, each micro-batch takes the next samples while its processed tokens stay within the budget:
    ``count x longest`` padded, the sum of the lengths `packed` (padding-free: the budget counts real tokens). When
    `max_samples` > 0, also ``count <= max_samples``. A sample longer than the budget gets a micro-batch of its own:
    it cannot be split, and dropping it would bias the gradient.

    Args:
        lengths: token length of every sample.
        members: the samples of one mini-batch.
        token_budget: processed tokens per micro-batch (0 = no token budget: only `max_samples` counts).
        max_samples: cap on samples per micro-batch (0 = none).
        packed: the micro-batches run padding-free (`PackedLayout`).
    """
    if token_budget <= 0 and max_samples <= 0:
        raise ValueError("pack_by_tokens needs a token budget or a sample cap")
    order = sorted(members, key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    real = 0
    for i in order:
        longest = lengths[current[0]] if current else lengths[i]  # sorted: the first member is the longest
        processed = real + lengths[i] if packed else (len(current) + 1) * longest
        fits_tokens = token_budget <= 0 or processed <= token_budget
        fits_count = max_samples <= 0 or len(current) < max_samples
        if current and not (fits_tokens and fits_count):
            batches.append(current)
            current, real = [], 0
        current.append(i)
        real += lengths[i]
    if current:
        batches.append(current)
    return batches


def padding_waste(lengths: Sequence[int], batches: Sequence[Sequence[int]], *, packed: bool = False) -> float:
    """Fraction of the processed tokens that are padding: 1 - real / processed.

    Padded micro-batches process ``n x longest`` tokens each; packed ones exactly their real tokens (waste 0).
    """
    real = sum(lengths[i] for b in batches for i in b)
    processed = real if packed else sum(len(b) * max(lengths[i] for i in b) for b in batches if b)
    return 1.0 - real / processed if processed else 0.0
