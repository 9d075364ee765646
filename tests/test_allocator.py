"""`trainer.return_freed_memory`: freed tensors go back to the OS, so resident memory follows the live tensors.

Each case runs in a fresh interpreter (the C library's allocator state is per process): glibc's threshold is first
raised the way a training step raises it (a large tensor freed), then 400 MB of 8 MB tensors are made and freed
each followed by a small live one (as block inputs kept for the backward follow a layer's temporaries), which
keeps glibc from trimming its heap.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SCRIPT = """
import json, sys, psutil, torch
from agentrl.training.allocator import pin_mmap_threshold
pinned = pin_mmap_threshold(int(sys.argv[1]) * 1024)
rss = lambda: psutil.Process().memory_info().rss
big = torch.ones(4 << 20)                    # 16 MB mapped and freed: glibc raises its threshold past 8 MB
del big
temps, keep = [], []
for _ in range(50):                          # 50 x 8 MB, touched, each followed by a small live block
    temps.append(torch.ones(2 << 20))
    keep.append(torch.ones(16 << 10))
before = rss()
del temps
print(json.dumps({"pinned": pinned, "released_mb": (before - rss()) / 2**20}))
"""


def _released(threshold_kb: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(threshold_kb)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_pinned_threshold_returns_freed_tensors_to_the_os():
    pinned = _released(1024)
    assert pinned["pinned"] is True
    assert pinned["released_mb"] > 0.9 * 400, pinned
    default = _released(0)  # glibc's own threshold: the same tensors stay resident (reported, not required)
    assert default["pinned"] is False
    print(f"released after free: pinned {pinned['released_mb']:.0f} MB, glibc default {default['released_mb']:.0f} MB")


def test_pin_is_idempotent_and_zero_leaves_the_default():
    from agentrl.training import allocator

    assert allocator.pin_mmap_threshold(0) is False
    assert allocator.pin_mmap_threshold(1 << 20) is True
    assert allocator.pin_mmap_threshold(1 << 20) is True  # the same value again: nothing to do


def test_bad_threshold_is_named():
    from agentrl.config import ConfigError, TrainerConfig

    with pytest.raises(ConfigError, match="trainer.return_freed_memory"):
        TrainerConfig(return_freed_memory="sometimes")


def test_auto_pins_exactly_when_the_plan_turns_checkpointing_on():
    from agentrl.training.allocator import PINNED_THRESHOLD_KB, run_threshold_kb

    assert run_threshold_kb("auto", True) == PINNED_THRESHOLD_KB and run_threshold_kb("auto", False) == 0
    assert run_threshold_kb("on", False) == PINNED_THRESHOLD_KB and run_threshold_kb("off", True) == 0
