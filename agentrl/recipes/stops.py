"""Stops that look like stops: SIGTERM unwinds a run like Ctrl-C, so its clean-up runs and Ray shuts down in order.

Why Ray needs this: when its core worker starts (``ray.init``), it installs absl's failure signal handler for SIGTERM
in the driver. A SIGTERM then prints a C++ stack dump (``*** SIGTERM received ... logging.cc ... @ 0x...``) before the
process dies. Python's `signal.signal` replaces that handler for SIGTERM alone (SIGSEGV and friends keep their
dumps), so `claim_sigterm` is called again once Ray is up.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["RunStopped", "sigterm_stops", "claim_sigterm", "exit_code"]

_active = 0  # how many `sigterm_stops` blocks are open: `claim_sigterm` only acts inside one
# The last signal `_raise_stopped` saw. Ray's blocking calls (ray.get, ray.wait) turn any exception a signal handler
# raises into a plain KeyboardInterrupt, so the exception alone cannot say it was SIGTERM.
_received: int | None = None


class RunStopped(KeyboardInterrupt):
    """A stop asked for by a signal other than Ctrl-C; a KeyboardInterrupt, so every clean-up for Ctrl-C runs too.

    Attributes:
        signum: the signal that asked for the stop.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum: int, frame) -> None:
    global _received
    _received = signum
    raise RunStopped(signum)


def claim_sigterm() -> None:
    """Make SIGTERM raise `RunStopped` again, inside a `sigterm_stops` block (after ``ray.init`` took it over)."""
    if _active and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_stopped)


@contextlib.contextmanager
def sigterm_stops() -> Iterator[None]:
    """Within the block, SIGTERM raises `RunStopped` in the main thread; the previous handler is restored after.

    Outside the main thread signals cannot be handled, so there the block changes nothing.
    """
    global _active, _received
    _received = None
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    _active += 1
    claim_sigterm()
    try:
        yield
    finally:
        _active -= 1
        # None means a handler Python did not install (e.g. Ray's, already gone with ray.shutdown): the default then
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def exit_code(stop: KeyboardInterrupt) -> int:
    """The shell's exit status for a run ended by `stop`: 128 + the signal (130 for Ctrl-C, 143 for SIGTERM)."""
    return 128 + getattr(stop, "signum", _received or signal.SIGINT)
