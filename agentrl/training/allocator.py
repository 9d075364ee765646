"""Give freed tensor memory back to the OS, so a training process's resident memory follows its live tensors.

PyTorch's CPU tensors come from the C library's ``malloc``. glibc maps a block of its own for a request above its
*mmap threshold* and unmaps it when freed; smaller requests come from heaps it keeps. The threshold starts at 128 KiB
and rises (to 32 MiB at most on 64-bit) each time a mapped block is freed, so after the first few layers a
transformer's per-layer temporaries (megabytes each) come from the heap. There the freed ones, interleaved with live
ones (block inputs kept for the backward, gradients), stay resident: the process holds what it freed.

Measured on this project's memory plan check (`python bench/lora.py fit`: LoRA rank 16 on a SmolLM2-360M-shaped
model, one step of 2 x 1,024 tokens, gradient checkpointing on): peak RSS 5.6 GiB with glibc's default against 3.0
GiB with the threshold pinned at 1 MiB, for the same live tensors; the plan (`agentrl.training.memory`) estimated
3.4 GiB. Pinning it (``mallopt(M_MMAP_THRESHOLD, ...)``) also turns the dynamic adjustment off, so every tensor of at
least that size is mapped when made and returned when freed. The cost is a page fault per new page of such tensors:
`bench/allocator.py` measures the step time with and without.

Only glibc has this knob; elsewhere (macOS, musl) `pin_mmap_threshold` does nothing and says so once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

__all__ = ["pin_mmap_threshold", "M_MMAP_THRESHOLD"]

M_MMAP_THRESHOLD = -3
"""glibc's `mallopt` parameter number for the mmap threshold (malloc.h)."""

_log = logging.getLogger(__name__)
_pinned: int | None = None


def pin_mmap_threshold(threshold_bytes: int) -> bool:
    """Pin glibc's mmap threshold at `threshold_bytes` for this process (0: leave glibc's default); True if set.

    Idempotent: a second call with the same value does nothing. Call it once per training process (the backends do,
    from ``trainer.mmap_threshold_kb``), before the first step, so the step's temporaries are mapped from the start.
    """
    global _pinned
    if threshold_bytes <= 0 or _pinned == threshold_bytes:
        return _pinned == threshold_bytes and threshold_bytes > 0
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        _log.info("trainer.mmap_threshold_kb: this C library has no mallopt (not glibc); memory stays as it allocates")
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(M_MMAP_THRESHOLD, int(threshold_bytes)) != 1:
        _log.info("trainer.mmap_threshold_kb: mallopt refused %d bytes; glibc's default stays", threshold_bytes)
        return False
    _pinned = threshold_bytes
    return True
