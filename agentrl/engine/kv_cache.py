"""KV caches for the HF engine: a store of per-episode prefixes, and the batch buffer one `generate` call decodes in.

Multi-turn rollouts are token-in/token-out: turn k+1's prompt is turn k's prompt, its reply, then the new text. The
keys and values of everything before the new text are already known, so the engine keeps them between calls:

* `PrefixStore` maps token ids to their per-layer keys / values (and, for MoE models, their routed experts). A new
  prompt looks up the longest stored sequence that is a prefix of it (a dict keyed by the ids of each stored length:
  Python hashes the tuple and checks equality, so a match is exact). The store holds at most `budget_bytes`; the
  least recently used sequences go first. A prompt that does not extend any stored sequence (a history rewrite, a
  new episode) simply finds nothing and is prefilled in full.
* `BatchKV` is the cache of one batch of rows. Row i holds its reused prefix (c_i tokens), then its new tokens (n_i),
  then what it generates. Rows are prefilled in groups of similar n_i (only the new tokens go through the model, and
  padding is bounded by the group, not by the longest prompt of the batch); then all rows decode together, one
  column per step, into memory allocated once (a growing `torch.cat` cache copies the whole batch every step).

  Layout of row i in group g, with m_g = the largest n in the group and P the column where decoding starts::

      [ pad | reused prefix (c_i) | gap (m_g - n_i) | new tokens (n_i) ][ decoded tokens ... ]
      0                                            P - n_i            P

  Pads and gaps are masked out by the attention mask; RoPE positions are given per token, so they are the row's own.
  Only full-attention layers fit this layout: `supports_batch_kv` says whether a model has nothing else.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache, DynamicLayer

__all__ = ["PrefixEntry", "PrefixStore", "BatchKV", "supports_batch_kv", "kv_bytes_per_token", "rollout_kv_bytes",
           "size_kv_cache"]


@dataclass
class PrefixEntry:
    """The cached state of one token sequence.

    Attributes:
        ids: the tokens whose keys and values are held.
        keys: per layer, `[kv_heads, len(ids), head_dim]`.
        values: per layer, same shape as `keys`.
        routes: for MoE models, the experts chosen at each position `[len(ids), moe_layers, top_k]`; else None.
    """

    ids: tuple[int, ...]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    routes: torch.Tensor | None = None
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.nbytes = sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))
        if self.routes is not None:
            self.nbytes += self.routes.numel() * self.routes.element_size()


class PrefixStore:
    """Least-recently-used store of `PrefixEntry`, at most `budget_bytes` in all.

    Args:
        budget_bytes: memory the stored keys and values may take (0 stores nothing).
    """

    def __init__(self, budget_bytes: int):
        if budget_bytes < 0:
            raise ValueError(f"the prefix cache budget must be >= 0 bytes, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[tuple[int, ...], PrefixEntry] = OrderedDict()
        self._lengths: Counter[int] = Counter()
        self.nbytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, prompt: Sequence[int]) -> PrefixEntry | None:
        """The longest stored sequence that is a prefix of `prompt` (or equals it), or None."""
        for length in sorted((n for n in self._lengths if n <= len(prompt)), reverse=True):
            entry = self._entries.get(tuple(prompt[:length]))
            if entry is not None:
                self._entries.move_to_end(entry.ids)
                return entry
        return None

    def pop(self, entry: PrefixEntry) -> None:
        """Remove `entry` (no-op when it is no longer stored)."""
        if self._entries.pop(entry.ids, None) is not None:
            self._forget(entry)

    def add(self, entry: PrefixEntry) -> None:
        """Store `entry` as the most recent one, evicting the least recent ones beyond the budget."""
        if entry.nbytes > self.budget_bytes or not entry.ids:
            return
        self.pop(entry)
        self._entries[entry.ids] = entry
        self._lengths[len(entry.ids)] += 1
        self.nbytes += entry.nbytes
        while self.nbytes > self.budget_bytes:
            _, oldest = self._entries.popitem(last=False)
            self._forget(oldest)
            self.evictions += 1

    def clear(self) -> None:
        """Drop every entry (the weights changed: the stored keys and values are stale)."""
        self._entries.clear()
        self._lengths.clear()
        self.nbytes = 0

    def _forget(self, entry: PrefixEntry) -> None:
        self._lengths[len(entry.ids)] -= 1
        if not self._lengths[len(entry.ids)]:
            del self._lengths[len(entry.ids)]
        self.nbytes -= entry.nbytes


def kv_bytes_per_token(config, dtype_bytes: int) -> int:
    """Bytes of keys and values one token holds across the model's layers: 2 x layers x KV heads x head size x dtype.

    Args:
        config: a Hugging Face model config (``num_hidden_layers``, ``num_key_value_heads``, ``head_dim``).
        dtype_bytes: bytes per element of the engine's precision (4 for float32, 2 for bfloat16).
    """
    config = getattr(config, "text_config", None) or config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * dtype_bytes


def rollout_kv_bytes(config, dtype_bytes: int, episodes: int, context_tokens: int) -> int:
    """The KV memory that keeps every episode in flight cached at its longest context.

    Below this, an engine evicts (HF prefix store) or preempts (vLLM) episodes and prefills their whole context again
    on a later turn: with 32 WebShop episodes of ~4k tokens under a 1 GiB vLLM cache (SmolLM2 in float32: 46 KB a
    token, 6 GB needed), the first step's rollout ran at a quarter of its speed.

    Args:
        config: the model config.
        dtype_bytes: bytes per element of the engine's precision.
        episodes: episodes in flight on one engine.
        context_tokens: the longest prompt plus reply (``max_context_tokens + max_new_tokens``).
    """
    return episodes * context_tokens * kv_bytes_per_token(config, dtype_bytes)


def size_kv_cache(config, dtype_bytes: int, episodes: int, context_tokens: int,
                  available_bytes: int | None = None) -> tuple[float, str]:
    """An engine's KV memory in GiB for `episodes` in flight, and a note when it had to be capped.

    The whole rollout (`rollout_kv_bytes`), within half of `available_bytes` (default: the memory available here) and
    at least 256 MiB. The note says what the cap costs and what would fit; it is empty when nothing was capped.
    """
    need = rollout_kv_bytes(config, dtype_bytes, episodes, context_tokens)
    if available_bytes is None:
        import psutil

        available_bytes = psutil.virtual_memory().available
    cap = available_bytes // 2
    gib = max(min(need, cap), 2**28) / 2**30
    if need <= cap:
        return gib, ""
    return gib, (f"{gib:.1f} GiB of the {need / 2**30:.1f} GiB that {episodes} episodes x {context_tokens} tokens "
                 f"need (half the free memory): long episodes will be prefilled again; fewer episodes in flight, a "
                 f"shorter max_context_tokens or a bfloat16 engine would fit")


def supports_batch_kv(config) -> bool:
    """True when every layer of the model is plain full attention (no sliding window, chunks or linear attention)."""
    try:
        layers = DynamicCache(config=config).layers
    except Exception:  # a config the cache utilities cannot read: use the plain path
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


class _Window:
    """Where the next forward writes: buffer rows [row_start, row_end) and columns [start, end)."""

    row_start = row_end = start = end = 0


class _WindowLayer(CacheLayerMixin):
    """One layer of a `BatchKV`: preallocated keys / values `[rows, kv_heads, columns, head_dim]`."""

    is_sliding = False

    def __init__(self, window: _Window):
        super().__init__()
        self.window = window

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise RuntimeError("BatchKV layers are allocated by BatchKV.allocate before any forward")

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write the forward's keys / values into the window; return everything up to its end."""
        w = self.window
        if key_states.shape[-2] != w.end - w.start:
            raise RuntimeError(f"BatchKV window is {w.end - w.start} columns, the forward has {key_states.shape[-2]}")
        self.keys[w.row_start : w.row_end, :, w.start : w.end] = key_states
        self.values[w.row_start : w.row_end, :, w.start : w.end] = value_states
        return self.keys[w.row_start : w.row_end, :, : w.end], self.values[w.row_start : w.row_end, :, : w.end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """Keys span columns [0, end): the 2D attention mask covers them all."""
        return self.window.start + query_length, 0

    def get_seq_length(self) -> int:
        """Columns before the window: the queries of the forward sit at columns [start, end)."""
        return self.window.start

    def get_max_length(self) -> int:
        """The buffer's width."""
        return self.keys.shape[-2] if self.keys is not None else -1


class BatchKV(Cache):
    """The cache of one batch: rows placed by the caller, written through a window (see the module docstring).

    Args:
        num_layers: decoder layers of the model.
    """

    def __init__(self, num_layers: int):
        self.window = _Window()
        super().__init__(layers=[_WindowLayer(self.window) for _ in range(num_layers)])

    def allocate(self, rows: int, columns: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        """Allocate every layer's buffers `[rows, kv_heads, columns, head_dim]` (zeros: masked columns stay finite)."""
        for layer in self.layers:
            layer.keys = torch.zeros((rows, kv_heads, columns, head_dim), dtype=dtype, device=device)
            layer.values = torch.zeros_like(layer.keys)
            layer.is_initialized = True

    def place(self, placements: Sequence[tuple[int, int, PrefixEntry, int]]) -> None:
        """Copy reused prefixes in: per (row, column, entry, length), the entry's first `length` positions.

        They go to `row` from `column` on. The entries' tensors are released layer by layer as they are copied (the
        caller has taken the entries out of the store), so the prefixes never sit in memory twice.
        """
        for i, layer in enumerate(self.layers):
            for row, column, entry, length in placements:
                layer.keys[row, :, column : column + length] = entry.keys[i][:, :length]
                layer.values[row, :, column : column + length] = entry.values[i][:, :length]
            for _, _, entry, _ in placements:
                entry.keys[i] = entry.values[i] = None

    def set_window(self, row_start: int, row_end: int, start: int, end: int) -> None:
        """The next forward covers rows [row_start, row_end) and writes columns [start, end)."""
        w = self.window
        w.row_start, w.row_end, w.start, w.end = row_start, row_end, start, end

    def take_rows(self, spans: Sequence[Sequence[tuple[int, int]]]) -> list[tuple[list[Tensor], list[Tensor]]]:
        """Copy out each row's columns (`spans[row]`: (start, end) pieces, in order) and free the buffers.

        Returns:
            Per row, (keys, values): per layer `[kv_heads, length, head_dim]`, contiguous (not views of the batch).
        """
        out: list[tuple[list[Tensor], list[Tensor]]] = [([], []) for _ in spans]
        for layer in self.layers:  # one layer at a time, so the copies never double the batch's memory
            for row, pieces in enumerate(spans):
                keys = torch.cat([layer.keys[row, :, a:b] for a, b in pieces], dim=1)
                values = torch.cat([layer.values[row, :, a:b] for a, b in pieces], dim=1)
                out[row][0].append(keys)
                out[row][1].append(values)
            layer.keys = layer.values = None
            layer.is_initialized = False
        return out
