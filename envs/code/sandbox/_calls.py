"""One call's inputs checked (argv, env, stdin, limits), and its limits turned into the rlimits its processes get.

Bad input is the caller's mistake, so it raises `ValueError` naming the argument, never a `SandboxError` (which means
the sandbox itself failed). Both local back-ends only lower limits: a limit above what this process may grant (its
hard limit) is clamped to it rather than failing the call, so the sandbox still gets the tightest limit the machine
allows.
"""

from __future__ import annotations

import re
import resource
from collections.abc import Mapping, Sequence
from dataclasses import fields

from .base import SandboxLimits

__all__ = ["check_argv", "check_env", "check_stdin", "check_limits", "rlimits"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_argv(argv: object) -> list[str]:
    """`argv` as a list of strings, or a `ValueError` saying what is wrong with it."""
    if isinstance(argv, (str, bytes)) or not isinstance(argv, Sequence):
        raise ValueError(f"argv must be a list of strings such as ['python3', '-c', 'print(1)'], got {argv!r:.80}")
    if not argv:
        raise ValueError("argv is empty: give the program and its arguments, e.g. ['sh', '-c', 'ls']")
    for arg in argv:
        if not isinstance(arg, str):
            raise ValueError(f"argv items must be strings, got {type(arg).__name__} ({arg!r:.40})")
        if "\0" in arg:
            raise ValueError(f"argv items cannot hold a NUL character: {arg!r:.40}")
    return list(argv)


def check_env(env: object) -> dict[str, str]:
    """`env` (None or a mapping of names to strings) as a dict, or a `ValueError` naming the bad entry."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise ValueError(f"env must be a mapping of variable names to strings, got {type(env).__name__}")
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            raise ValueError(f"env name {key!r} is not a valid variable name (letters, digits, _; not first a digit)")
        if not isinstance(value, str) or "\0" in value:
            raise ValueError(f"env value of {key} must be a string without NUL, got {value!r:.40}")
    return dict(env)


def check_stdin(stdin: object) -> bytes:
    """`stdin` as bytes, or a `ValueError` (text must be encoded by the caller: the sandbox passes bytes)."""
    if not isinstance(stdin, (bytes, bytearray, memoryview)):
        raise ValueError(f"stdin must be bytes (encode text first), got {type(stdin).__name__}")
    return bytes(stdin)


def check_limits(limits: object) -> SandboxLimits:
    """Return `limits` if it is a `SandboxLimits` whose every field is positive, else raise a `ValueError` naming it."""
    if not isinstance(limits, SandboxLimits):
        raise ValueError(f"sandbox limits must be a SandboxLimits, got {type(limits).__name__}")
    for field in fields(limits):
        value = getattr(limits, field.name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"SandboxLimits.{field.name} must be a positive number, got {value!r}")
    return limits


def rlimits(limits: SandboxLimits, *, nproc: int | None) -> list[tuple[str, int, int]]:
    """``(RLIMIT name without the prefix, soft, hard)`` for one call, clamped to this process's hard limits.

    The CPU limit's hard value is one second past the soft one, so a busy loop gets SIGXCPU (reported as that signal)
    before the kernel's SIGKILL. `nproc` None leaves RLIMIT_NPROC alone (the back-end says why).
    """
    wanted = [("CPU", limits.cpu_s, limits.cpu_s + 1),
              ("AS", limits.memory_mb * 1024 * 1024, limits.memory_mb * 1024 * 1024),
              ("FSIZE", limits.file_bytes, limits.file_bytes),
              ("NOFILE", limits.open_files, limits.open_files),
              ("CORE", 0, 0)]
    if nproc is not None:
        wanted.append(("NPROC", nproc, nproc))
    out = []
    for name, soft, hard in wanted:
        _, host_hard = resource.getrlimit(getattr(resource, f"RLIMIT_{name}"))
        if host_hard != resource.RLIM_INFINITY:
            hard = min(int(hard), host_hard)
        out.append((name, min(int(soft), int(hard)), int(hard)))
    return out
