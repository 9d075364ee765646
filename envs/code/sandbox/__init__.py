"""Sandboxes for the ``code`` env: the contract (`base`), the back-ends, and the warm pool.

``bwrap`` (`BwrapBackend`, the default: bubblewrap namespaces), ``podman`` (`PodmanBackend`, one container per
worker; imported on first use) and ``subprocess`` (`SubprocessBackend`, no isolation, only with
``unsafe_subprocess=True``). `make_backend` picks one by name; `SandboxPool` keeps emptied sandboxes warm.
"""

from __future__ import annotations

from typing import Any

from .base import (
    WORKDIR,
    ExecResult,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxLimits,
    SandboxUnavailable,
    WorkspaceTooLarge,
)
from .bwrap import BwrapBackend
from .pool import BACKENDS, PoolStats, SandboxPool, make_backend
from .subprocess_backend import SubprocessBackend

__all__ = ["WORKDIR", "ExecResult", "Sandbox", "SandboxBackend", "SandboxError", "SandboxLimits",
           "SandboxUnavailable", "WorkspaceTooLarge", "BwrapBackend", "SubprocessBackend", "PodmanBackend",
           "SandboxPool", "PoolStats", "BACKENDS", "make_backend"]


def __getattr__(name: str) -> Any:
    # podman.py is imported only when asked for, so the package imports where podman's module is absent or broken.
    if name == "PodmanBackend":
        from .podman import PodmanBackend

        return PodmanBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
