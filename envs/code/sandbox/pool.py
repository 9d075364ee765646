"""`SandboxPool`: warm sandboxes handed to episodes, and `make_backend`: a back-end chosen by name.

An episode takes a sandbox at `reset` and gives it back at its end; grading takes a second, fresh one. Starting a
sandbox costs little for bubblewrap (a folder) but a container exec for podman, so released sandboxes are emptied and
kept, up to `size`, for the next episode. Runner pools step envs from a thread pool, so every method is thread-safe;
the slow parts (making, resetting, closing a sandbox) run outside the lock.

`make_backend("auto")` means bubblewrap or an error that names the fixes. It never falls back to ``subprocess``: that
would silently run agent code on the host unprotected.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from ._calls import check_limits
from .base import Sandbox, SandboxBackend, SandboxError, SandboxLimits, SandboxUnavailable

__all__ = ["BACKENDS", "PoolStats", "SandboxPool", "make_backend"]

BACKENDS = ("auto", "bwrap", "podman", "subprocess")
"""The names `make_backend` takes."""


@dataclass(frozen=True)
class PoolStats:
    """How a pool's sandboxes were handed out, and where they are now."""

    cold: int
    """Acquisitions that had to make a new sandbox."""
    warm: int
    """Acquisitions served by a kept, emptied sandbox."""
    idle: int
    """Sandboxes kept now, ready for the next acquisition."""
    in_use: int
    """Sandboxes handed out and not yet released."""
    discarded: int
    """Released sandboxes closed instead of kept (pool full, or their reset failed)."""


class SandboxPool:
    """Warm sandboxes of one back-end and one set of limits, shared by the envs of a process.

    Args:
        backend: makes the sandboxes; the pool closes it at `close`.
        limits: the default limits of every sandbox made.
        size: how many emptied sandboxes are kept for reuse; more may be in use at once.
        prefill: sandboxes made ahead, at construction, so the first episodes start warm (at most `size`).
    """

    def __init__(self, backend: SandboxBackend, limits: SandboxLimits, size: int, *, prefill: int = 0) -> None:
        if not isinstance(backend, SandboxBackend):
            raise ValueError(f"SandboxPool needs a SandboxBackend (see make_backend), got {type(backend).__name__}")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"SandboxPool size must be a whole number >= 0, got {size!r}")
        if isinstance(prefill, bool) or not isinstance(prefill, int) or not 0 <= prefill <= size:
            raise ValueError(f"SandboxPool prefill must be a whole number from 0 to size ({size}), got {prefill!r}")
        self.backend = backend
        """The back-end the sandboxes come from."""
        self.limits = check_limits(limits)
        """Default limits of the pool's sandboxes."""
        self.size = size
        """How many emptied sandboxes are kept."""
        self._lock = threading.Lock()
        self._idle: list[Sandbox] = []
        self._in_use: set[int] = set()  # ids of the handed-out sandboxes
        self._lent: dict[int, Sandbox] = {}
        self._cold = self._warm = self._discarded = 0
        self._closed = False
        self._reaped: set[int] = set()  # ids of sandboxes lent when the pool closed (and closed by it)
        self._idle.extend(backend.create(limits) for _ in range(prefill))

    def acquire(self) -> Sandbox:
        """An empty sandbox: a kept one if any (warm), else a new one (cold).

        Raises:
            SandboxError: the pool is closed, or the back-end could not make a sandbox.
        """
        with self._lock:
            if self._closed:
                raise SandboxError("this sandbox pool is closed")
            sandbox = self._idle.pop() if self._idle else None
            if sandbox is not None:
                self._warm += 1
                self._lend(sandbox)
                return sandbox
            self._cold += 1
        sandbox = self.backend.create(self.limits)
        with self._lock:
            if not self._closed:
                self._lend(sandbox)
                return sandbox
        sandbox.close()
        raise SandboxError("this sandbox pool was closed while a sandbox was being made")

    def release(self, sandbox: Sandbox) -> None:
        """Give back a sandbox from `acquire`: emptied and kept if the pool has room, else closed.

        Raises:
            ValueError: `sandbox` is not currently lent by this pool (released twice, or from elsewhere).
        """
        with self._lock:
            if self._closed and id(sandbox) in self._reaped:
                return  # lent before `close`, which already closed it (an env ending after interpreter-exit reaping)
            if id(sandbox) not in self._in_use or self._lent.get(id(sandbox)) is not sandbox:
                raise ValueError("release() got a sandbox this pool has not lent (released twice, or made elsewhere)")
            self._in_use.discard(id(sandbox))
            del self._lent[id(sandbox)]
        try:
            sandbox.reset()
        except SandboxError:
            keep = False  # a sandbox that cannot be emptied must not serve another episode
        else:
            with self._lock:
                keep = not self._closed and len(self._idle) < self.size
                if keep:
                    self._idle.append(sandbox)
        if not keep:
            with self._lock:
                self._discarded += 1
            sandbox.close()

    def stats(self) -> PoolStats:
        """Counts of cold and warm acquisitions so far, and of sandboxes idle and in use now."""
        with self._lock:
            return PoolStats(cold=self._cold, warm=self._warm, idle=len(self._idle), in_use=len(self._in_use),
                             discarded=self._discarded)

    def close(self) -> None:
        """Close every sandbox, kept or lent, and the back-end. Idempotent; releasing a lent one later does nothing."""
        with self._lock:
            self._closed = True
            sandboxes = self._idle + list(self._lent.values())
            self._reaped.update(self._lent)
            self._idle.clear()
            self._lent.clear()
            self._in_use.clear()
        for sandbox in sandboxes:
            sandbox.close()
        self.backend.close()

    def _lend(self, sandbox: Sandbox) -> None:
        self._in_use.add(id(sandbox))
        self._lent[id(sandbox)] = sandbox


def make_backend(name: str, *, unsafe_subprocess: bool = False, **options: Any) -> SandboxBackend:
    """The sandbox back-end called `name`, checked to work on this machine.

    Args:
        name: ``auto`` (bubblewrap, or an error naming the fixes: never a silent fallback to ``subprocess``),
            ``bwrap``, ``podman`` or ``subprocess`` (no isolation: needs `unsafe_subprocess`).
        unsafe_subprocess: the user's consent to run agent code on the host unprotected (``subprocess`` only).
        options: keyword arguments of the back-end's constructor (podman's ``image``, for instance).

    Raises:
        ValueError: an unknown name, an option the back-end does not take, or ``subprocess`` without consent.
        SandboxUnavailable: the back-end cannot run here; the message names the fix.
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown sandbox back-end {name!r}; choose one of {', '.join(BACKENDS)}")
    if name in ("auto", "bwrap"):
        from .bwrap import BwrapBackend

        reason = BwrapBackend.unavailable_reason()
        if reason is not None:
            if name == "auto":
                reason = (f"no sandbox back-end works here: {reason}. Or choose sandbox back-end 'podman', or "
                          f"accept running agent code unprotected on this host with backend 'subprocess' and "
                          f"unsafe_subprocess=True")
            raise SandboxUnavailable(reason)
        return _build(BwrapBackend, options)
    if name == "subprocess":
        from .subprocess_backend import REFUSAL, SubprocessBackend

        if unsafe_subprocess is not True:
            raise ValueError(REFUSAL)
        reason = SubprocessBackend.unavailable_reason()
        if reason is not None:
            raise SandboxUnavailable(reason)
        return _build(SubprocessBackend, {"unsafe": True, **options})
    try:
        from .podman import PodmanBackend
    except ImportError as exc:
        raise SandboxUnavailable(f"the podman back-end is not part of this install ({exc})") from exc
    reason = PodmanBackend.unavailable_reason()
    if reason is not None:
        raise SandboxUnavailable(reason)
    return _build(PodmanBackend, options)


def _build(cls: type[SandboxBackend], options: dict[str, Any]) -> SandboxBackend:
    try:
        return cls(**options)
    except TypeError as exc:  # an option this back-end does not take
        raise ValueError(f"sandbox back-end {cls.name!r} does not take {sorted(options)}: {exc}") from exc
