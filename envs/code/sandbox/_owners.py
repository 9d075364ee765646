"""Who made a leftover: a process named by its pid and its start time, so the next back-end can reap what it left.

A runner killed with SIGKILL (or with SIGTERM left at its default, which ends Python without running `atexit` or
finalizers) cannot remove its workspace folders, cgroups or containers. Each of them therefore carries its owner's
tag, ``<pid>-<start time>``, in its name (or label), and a back-end starting later removes those whose owner is gone.
The pid alone would not do: pids are reused, and a reused pid has a later start time.
"""

from __future__ import annotations

import os
import re

__all__ = ["start_time", "owner_tag", "owner_alive", "parse_tag"]

_TAG = re.compile(r"(\d+)-(\d+)")


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of ``/proc/PID/stat``), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]


def owner_tag() -> str:
    """``<pid>-<start time>`` of this process, to put in the names of what it makes."""
    return f"{os.getpid()}-{start_time(os.getpid())}"


def parse_tag(text: str) -> tuple[int, str] | None:
    """``(pid, start time)`` from the start of `text` (``<pid>-<start>...``), or None when it holds no tag."""
    found = _TAG.match(text)
    return (int(found.group(1)), found.group(2)) if found else None


def owner_alive(pid: int, started: str) -> bool:
    """Whether process `pid` that started at `started` still runs (a reused pid has another start time)."""
    return start_time(pid) == started
