"""Logging set-up for the `agentrl` command: one stderr handler on the ``agentrl`` logger, and quiet Ray and vLLM.

Library modules log through ``logging.getLogger(__name__)`` (names under ``agentrl.*``) and never configure logging
themselves; a program that imports agentrl keeps full control. The command calls `configure_logging` once, with
``--log-level`` or ``AGENTRL_LOG_LEVEL`` (default ``warning``).

At the default level a record is its bare message, as Python prints warnings of an unconfigured program; at ``info``
and ``debug`` each line carries the time, level and logger name, for reading a long log. Ray's and vLLM's own start-up
lines (INFO) stay hidden unless the level is ``debug``: `third_party_level` is the level `agentrl.cluster` hands
``ray.init`` and `agentrl.engine.vllm` puts in ``VLLM_LOGGING_LEVEL`` (only where the user has not set it).
"""

from __future__ import annotations

import logging
import os
import sys

__all__ = ["LEVELS", "LOG_LEVEL_ENV", "configure_logging", "parse_level", "third_party_level"]

LOG_LEVEL_ENV = "AGENTRL_LOG_LEVEL"
"""Environment variable read when ``--log-level`` is not given (and set by the command for its child processes)."""

LEVELS = ("debug", "info", "warning", "error", "critical")
"""The accepted level names, most verbose first."""

DEFAULT_LEVEL = "warning"


class _Stderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at each record (test runners and progress bars swap it)."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # logging.StreamHandler.__init__ assigns it; the property always wins
        pass


def parse_level(name: str) -> int:
    """The `logging` level for a name in `LEVELS` (any case).

    Raises:
        ValueError: a name not in `LEVELS`, with the accepted names.
    """
    key = name.strip().lower()
    if key not in LEVELS:
        raise ValueError(f"unknown log level {name!r}; use one of {', '.join(LEVELS)}")
    return logging.getLevelName(key.upper())


def configure_logging(level: str | None = None) -> int:
    """Send ``agentrl.*`` records at `level` and above to stderr; returns the level set.

    Calling it again replaces the earlier set-up (one handler, never two).

    Args:
        level: a name in `LEVELS`; None reads ``AGENTRL_LOG_LEVEL``, else ``warning``.

    Raises:
        ValueError: an unknown level name (from the argument or the environment variable).
    """
    name = level if level is not None else os.environ.get(LOG_LEVEL_ENV) or DEFAULT_LEVEL
    number = parse_level(name)
    logger = logging.getLogger("agentrl")
    for handler in [h for h in logger.handlers if isinstance(h, _Stderr)]:
        logger.removeHandler(handler)
    handler = _Stderr()
    handler.setLevel(number)
    verbose = number < logging.WARNING
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s" if verbose
                                           else "%(message)s"))
    logger.addHandler(handler)
    # Only a more verbose level is set on the logger: at the default the records pass as they did before (a host
    # program's own handlers, pytest's caplog, still see warnings through propagation).
    logger.setLevel(number if verbose else logging.NOTSET)
    # Child processes (grader workers, a local Ray's workers) read the same level; the default needs no variable.
    if name.strip().lower() != DEFAULT_LEVEL or LOG_LEVEL_ENV in os.environ:
        os.environ[LOG_LEVEL_ENV] = name.strip().lower()
    return number


def third_party_level() -> int:
    """The level for Ray's and vLLM's own loggers: INFO when agentrl logs at debug, else WARNING (quiet start-up)."""
    name = os.environ.get(LOG_LEVEL_ENV, DEFAULT_LEVEL).strip().lower()
    return logging.INFO if name == "debug" else logging.WARNING
