"""Padding-free forward passes: several samples in one row, attention confined to each sample, exactly.

A packed micro-batch (`agentrl.training.microbatch.PackedLayout`) holds its samples' tokens back to back in one row
`[1, L]`, with position ids restarting at 0 for each sample, so rotary embeddings see the same positions as in a row
of its own. What must not leak is attention: a token may attend only to the earlier tokens of its own sample.

On GPUs with flash-attention, transformers already runs packed rows as variable-length sequences when the forward
gets ``cu_seq_lens_q / cu_seq_lens_k / max_length_q / max_length_k``; we pass exactly those. Elsewhere (SDPA, the
CPU's default), we register an attention function, ``sdpa_packed``, through transformers' `AttentionInterface`:

* with ``cu_seq_lens_q`` in its arguments it runs `scaled_dot_product_attention(is_causal=True)` on each sample's
  segment of the row: the fused kernel, no `[heads, L, L]` mask built or saved for the backward, and the same
  arithmetic per sample as a row of its own (values and gradients equal the padded path within float32 rounding);
* without, it is transformers' own SDPA function (and its mask function is SDPA's), so generation, the HF engine
  sampling from the same module and any other caller see no difference.

`use_packing` switches a model to ``sdpa_packed`` once, for good: gradient checkpointing recomputes attention in the
backward, outside any context we could open, and it must find the packed function there too (the layers keep the
forward's keyword arguments, segment boundaries included).

Departures, on purpose: families that cannot be packed exactly fall back to the padded forward (`packing_blocker`
says why): sliding-window layers (the window would have to be confined to each sample too), attention sinks
(gpt-oss), multimodal rotary positions (mrope's 3-D position ids), and attention implementations other than SDPA and
flash-attention (eager, flex).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

log = logging.getLogger(__name__)

__all__ = ["PACKED_ATTENTION", "packing_blocker", "use_packing", "packed_hidden_states"]

PACKED_ATTENTION = "sdpa_packed"
"""The name of the packed SDPA attention function in transformers' `AttentionInterface`."""

_FLASH = ("flash_attention_2", "flash_attention_3", "flash_attention_4")

_state = threading.local()  # .active: a packed forward is running in this thread (its masks are not built)


def _active() -> bool:
    return getattr(_state, "active", False)


@contextmanager
def _packed_forward() -> Iterator[None]:
    _state.active = True
    try:
        yield
    finally:
        _state.active = False


def _packed_sdpa(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                 dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """Transformers' SDPA attention, per sample segment when the call carries ``cu_seq_lens_q``.

    Args:
        module: the attention layer.
        query: `[1, heads, L, d]` in a packed call.
        key: `[1, kv_heads, L, d]` in a packed call.
        value: `[1, kv_heads, L, d]` in a packed call.
        attention_mask: None for a packed call (no mask is built), else what SDPA would get.
        dropout: attention dropout probability (0 in the trainer's models).
        scaling: the softmax scale (None: 1 / sqrt(d)).
        is_causal: as transformers' `sdpa_attention_forward` (a packed call is causal within each segment).
        **kwargs: ``cu_seq_lens_q`` `[n + 1]` (the sample boundaries) marks a packed call.

    Returns:
        `([1, L, heads, d], None)`, as transformers' attention functions return.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    bounds = kwargs.pop("cu_seq_lens_q", None)
    if bounds is None:
        if _active():  # a layer of a packed forward lost the boundaries: it would attend across samples
            raise RuntimeError(f"{type(module).__name__} did not pass the packed-sequence boundaries to its attention "
                               f"function; this model family cannot run packed: run with --trainer.no-packing")
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if query.shape[0] != 1 or kwargs.get("sliding_window") is not None or getattr(module, "sinks", None) is not None:
        raise RuntimeError(f"packed attention needs one row without sliding windows or sinks "
                           f"({type(module).__name__}: batch {query.shape[0]}); run with --trainer.no-packing")
    for name in ("cu_seq_lens_k", "max_length_q", "max_length_k", "sliding_window"):
        kwargs.pop(name, None)
    bounds = bounds.tolist()
    lengths = [e - s for s, e in zip(bounds[:-1], bounds[1:])]
    if len(lengths) > 1 and len(lengths) * max(lengths) ** 2 <= BATCH_SEGMENTS_WASTE * sum(n * n for n in lengths):
        # Segments of similar length attend as one right-padded batch: one kernel call instead of one per sample
        # (CPU SDPA's backward pays a fixed cost per call; the main job's 32 samples: 1.4x faster attention). With
        # causal attention a real query sees only earlier, real keys of its own row; padded queries are dropped.
        index, valid = _segment_grid(lengths, query.device)  # [n, Tmax]
        def rows(x):
            return x[0][:, index].transpose(0, 1)  # [1, h, L, d] -> [n, h, Tmax, d]
        out = sdpa_attention_forward(module, rows(query), rows(key), rows(value), None, dropout=dropout,
                                     scaling=scaling, is_causal=True, **kwargs)[0]  # [n, Tmax, heads, d]
        return out[valid][None], None  # [1, L, heads, d]: valid positions in row order are the packed order
    parts = [sdpa_attention_forward(module, query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], None,
                                    dropout=dropout, scaling=scaling, is_causal=True, **kwargs)[0]
             for s, e in zip(bounds[:-1], bounds[1:])]  # each [1, len_i, heads, d]
    return torch.cat(parts, dim=1), None  # [1, L, heads, d]


BATCH_SEGMENTS_WASTE = 2.0
"""Attention runs the segments as one padded batch while that costs at most this many times the attention FLOPs of
the segments alone (n x longest^2 against the sum of length^2); past it (one long sample among short ones), per
segment."""


def _segment_grid(lengths: list[int], device) -> tuple[Tensor, Tensor]:
    """`(index [n, Tmax], valid [n, Tmax])`: packed position of each sample's t-th token (0 past its end)."""
    longest = max(lengths)
    starts = torch.tensor([0, *lengths[:-1]], device=device).cumsum(0)  # [n]
    t = torch.arange(longest, device=device)  # [Tmax]
    valid = t[None, :] < torch.tensor(lengths, device=device)[:, None]  # [n, Tmax]
    index = torch.where(valid, starts[:, None] + t[None, :], 0)  # [n, Tmax]
    return index, valid


def _packed_sdpa_mask(*args, **kwargs):
    """SDPA's mask, except inside a packed forward: there the segments confine attention and no mask is built."""
    from transformers.masking_utils import sdpa_mask

    return None if _active() else sdpa_mask(*args, **kwargs)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(PACKED_ATTENTION, _packed_sdpa)
    AttentionMaskInterface.register(PACKED_ATTENTION, _packed_sdpa_mask)


def packing_blocker(model: torch.nn.Module) -> str | None:
    """Why `model` cannot run packed micro-batches exactly, or None when it can.

    Args:
        model: a transformers causal LM (plain, LoRA-injected or FSDP-wrapped).
    """
    config = model.config
    impl = getattr(config, "_attn_implementation", None)
    if impl not in ("sdpa", PACKED_ATTENTION, *_FLASH):
        return f"attention implementation {impl!r} has no packed path here (sdpa and flash-attention do)"
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        return f"layers of types {sorted(set(layer_types) - {'full_attention'})} (only full attention packs exactly)"
    if layer_types is None and getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return f"a sliding window of {config.sliding_window} tokens"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if isinstance(rope, dict) and "mrope_section" in rope:
        return "multimodal rotary positions (mrope)"
    if any(getattr(m, "sinks", None) is not None for m in model.modules()):
        return "attention sinks"
    return None


def use_packing(model: torch.nn.Module) -> bool:
    """Make `model` run packed micro-batches, if its family can (see `packing_blocker`); True when it does.

    Switches an SDPA model to ``sdpa_packed`` (identical to SDPA for every unpacked call); flash-attention models
    need nothing. The answer is kept on the model: the check runs once.
    """
    known = model.__dict__.get("_agentrl_packs")
    if known is not None:
        return known
    blocker = packing_blocker(model)
    if blocker is None and model.config._attn_implementation == "sdpa":
        _register()
        model.set_attn_implementation(PACKED_ATTENTION)
        if model.config._attn_implementation != PACKED_ATTENTION:
            blocker = "its attention does not go through transformers' AttentionInterface"
    if blocker is not None:
        log.warning("%s cannot run packed micro-batches exactly (%s): its passes run padded, over up to "
                    "trainer.micro_batch_tokens real tokens each; --trainer.no-packing budgets padded tokens instead",
                    type(model).__name__, blocker)
    packs = blocker is None
    model.__dict__["_agentrl_packs"] = packs
    return packs


def packed_hidden_states(backbone: torch.nn.Module, layout) -> Tensor:
    """The backbone's last hidden states over a packed row, `[1, L, H]`.

    Args:
        backbone: the decoder (``model.get_decoder()``) of a model `use_packing` accepted.
        layout: the micro-batch's `agentrl.training.microbatch.PackedLayout`.
    """
    cu = layout.cu_seqlens.to(layout.input_ids.device)
    with _packed_forward():
        return backbone(input_ids=layout.input_ids, position_ids=layout.position_ids, cu_seq_lens_q=cu,
                        cu_seq_lens_k=cu, max_length_q=layout.max_length,
                        max_length_k=layout.max_length).last_hidden_state  # [1, L, H]
