"""Give freed tensor memory back to the OS, so a training process's resident memory follows its live tensors.

PyTorch's CPU tensors come from the C library's ``malloc``. glibc maps a block of its own for a request above its
*mmap threshold* and unmaps it when freed; smaller requests come from heaps it keeps. The threshold starts at 128 KiB
and rises (to 32 MiB at most on 64-bit) each time a mapped block is freed, so after the first few layers a
transformer's per-layer temporaries (megabytes each) come from the heap. There the freed ones, interleaved with live
ones (block inputs kept for the backward, gradients), stay resident: the process holds what it freed.

Measured on this project's memory plan check (`python bench/micro/lora.py fit`: LoRA rank 16 on a SmolLM2-360M-shaped
model, one step of 2 x 1,024 tokens, gradient checkpointing on): peak RSS 5.6 GiB with glibc's default against 3.0
GiB with the threshold pinned at 1 MiB, for the same live tensors; the plan (`agentrl.training.memory`) estimated
3.4 GiB. Pinning it (``mallopt(M_MMAP_THRESHOLD, ...)``) also turns the dynamic adjustment off, so every tensor of at
least that size is mapped when made and returned when freed. The cost is a page fault per new page of such tensors:
`bench/micro/allocator.py` measured the second step at 1.31x the time of glibc's default on that LoRA step, and 1.14x on
the main job's full fine-tuning step (peak 8.5 -> 7.5 GiB), beside other work on 2 cores.

So it is not pinned everywhere (``trainer.return_freed_memory: auto``): only when the memory plan has to turn gradient
checkpointing on, i.e. when memory is what limits the run. That is where the retention was measured past the plan
(LoRA with checkpointing: 5.6-6.1 GiB against 3.4 planned; 7.2 against 5.0 on a Qwen3-0.6B shape), and where a run
that the plan passes must not be killed for memory it freed. ``on`` pins it always, ``off`` never.

Only glibc has this knob; elsewhere (macOS, musl) `pin_mmap_threshold` does nothing and says so once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

__all__ = ["pin_mmap_threshold", "run_threshold_kb", "M_MMAP_THRESHOLD", "PINNED_THRESHOLD_KB"]

M_MMAP_THRESHOLD = -3
"""glibc's `mallopt` parameter number for the mmap threshold (malloc.h)."""

PINNED_THRESHOLD_KB = 1024
"""Where a run pins the threshold: above the small allocations Python and the tokenizer make by the million, below
a layer's activations (megabytes at a few hundred tokens)."""

_log = logging.getLogger(__name__)
_pinned: int | None = None


def run_threshold_kb(setting: str, gradient_checkpointing: bool) -> int:
    """The threshold a training run pins, in KiB (0: glibc's default), from ``trainer.return_freed_memory``.

    ``auto`` pins it exactly when the memory plan turned gradient checkpointing on (see the module docstring).
    """
    if setting == "on" or (setting == "auto" and gradient_checkpointing):
        return PINNED_THRESHOLD_KB
    return 0


def pin_mmap_threshold(threshold_bytes: int) -> bool:
    """Pin glibc's mmap threshold at `threshold_bytes` for this process (0: leave glibc's default); True if set.

    Idempotent: a second call with the same value does nothing. Call it once per training process (the backends do,
    from ``trainer.return_freed_memory``), before the first step, so the step's temporaries are mapped from the start.
    """
    global _pinned
    if threshold_bytes <= 0:
        return False
    if _pinned == threshold_bytes:
        return True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        _log.info("trainer.return_freed_memory: no mallopt in this C library (not glibc); nothing pinned")
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(M_MMAP_THRESHOLD, int(threshold_bytes)) != 1:
        _log.info("trainer.return_freed_memory: mallopt refused %d bytes; glibc's default stays", threshold_bytes)
        return False
    _pinned = threshold_bytes
    return True
