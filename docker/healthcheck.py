#!/usr/bin/env python3
"""The images' HEALTHCHECK: every agentrl server in the container answers ``GET /health``; anything else is healthy.

One image runs the training job, ``agentrl env serve`` and ``agentrl serve``, and a Dockerfile has one HEALTHCHECK
for all of them. A fixed URL would mark every training container unhealthy (nothing listens there), and an
orchestrator that restarts unhealthy containers would kill the job. So this looks at the container's processes
instead: for each ``agentrl env serve`` / ``agentrl serve`` it reads ``--host`` and ``--port`` from the command line
(the defaults otherwise) and asks that server's ``/health``, which never needs the bearer token. Exit 0 when every
server found answers 200 (or none runs), 1 otherwise, with one line saying which server failed and how.

Standard library only (the image has no curl, and the check must not import agentrl: a health probe that takes
seconds to start would time out on a loaded machine).

    python3 docker/healthcheck.py              # every agentrl server among the processes this one can see
    python3 docker/healthcheck.py --pid 1234   # only the process 1234
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PORT = 8000
"""What ``--port`` defaults to in both ``agentrl env serve`` and ``agentrl serve``."""

TIMEOUT_S = 4.0
"""Seconds one ``/health`` request may take; the Dockerfile's ``--timeout`` is a little longer."""

# Options of the `agentrl` group that take a value: they sit between the program and the subcommand.
_ROOT_OPTIONS_WITH_VALUE = frozenset({"--log-level", "--app-dir"})
# A wildcard bind answers on loopback too, and a loopback Host header passes the servers' Host check.
_WILDCARD = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}


@dataclass(frozen=True)
class Server:
    """An agentrl server found on a command line.

    Attributes:
        command: ``env serve`` or ``serve``.
        host: the address ``--host`` binds (``127.0.0.1`` by default).
        port: the port ``--port`` binds.
    """

    command: str
    host: str
    port: int

    @property
    def url(self) -> str:
        """The ``/health`` URL this container reaches the server at (a wildcard bind is asked on loopback)."""
        host = _WILDCARD.get(self.host, self.host)
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}/health"


def _agentrl_args(argv: Sequence[str]) -> list[str] | None:
    """The arguments after the agentrl program in `argv` (``agentrl ...``, ``python -m agentrl[.cli] ...``)."""
    for i, arg in enumerate(argv):
        if os.path.basename(arg) == "agentrl":
            return list(argv[i + 1 :])
        if arg == "-m" and i + 1 < len(argv) and argv[i + 1] in ("agentrl", "agentrl.cli"):
            return list(argv[i + 2 :])
    return None


def _option(args: Sequence[str], name: str) -> str | None:
    """The last value of ``--name VALUE`` or ``--name=VALUE`` in `args`, as click reads a repeated option."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg[len(name) + 1 :]
    return value


def server_of(argv: Sequence[str]) -> Server | None:
    """The agentrl server a process's command line starts, or None when it starts none.

    Args:
        argv: the process's arguments (``/proc/PID/cmdline`` split at NUL bytes).

    Returns:
        The server and the address it binds; None for any other command (training, eval, a shell).

    Raises:
        ValueError: ``--port`` is not a number (the server itself would refuse it; the check says so).
    """
    args = _agentrl_args(argv)
    if args is None:
        return None
    words: list[tuple[int, str]] = []  # (index, word): the subcommand path
    i = 0
    while i < len(args) and len(words) < 2:
        if args[i] in _ROOT_OPTIONS_WITH_VALUE:
            i += 2
            continue
        if not args[i].startswith("-"):
            words.append((i, args[i]))
        i += 1
    names = [word for _, word in words]
    if names[:1] == ["serve"]:
        command, rest = "serve", args[words[0][0] + 1 :]
    elif names == ["env", "serve"]:
        command, rest = "env serve", args[words[1][0] + 1 :]
    else:
        return None
    port = _option(rest, "--port")
    host = _option(rest, "--host")
    return Server(command, "127.0.0.1" if host is None else host, DEFAULT_PORT if port is None else int(port))


def _command_lines(pids: Iterable[str] | None = None) -> list[list[str]]:
    """The command lines of the processes in /proc (those in `pids` only, when given); gone ones are skipped."""
    if pids is None:
        pids = [p.name for p in Path("/proc").iterdir() if p.name.isdigit()]
    lines = []
    for pid in pids:
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # exited while we looked, or not ours to read
        if raw:
            lines.append([part.decode(errors="replace") for part in raw.rstrip(b"\0").split(b"\0")])
    return lines


def check(server: Server) -> str | None:
    """Ask `server` for ``/health``; None when it answers 200, else what went wrong."""
    try:
        with urllib.request.urlopen(server.url, timeout=TIMEOUT_S) as response:
            if response.status == 200:
                return None
            return f"HTTP {response.status}"
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}: {e.read(300).decode(errors='replace')}"
    except (OSError, ValueError) as e:
        return str(getattr(e, "reason", e))


def main(argv: Sequence[str] | None = None) -> int:
    """Check every agentrl server among the visible processes; the exit status is the health (0 healthy)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pid", action="append", help="check only this process (repeatable)")
    opts = parser.parse_args(argv)
    failed = 0
    servers = []
    for line in _command_lines(opts.pid):
        try:
            server = server_of(line)
        except ValueError:
            print(f"unhealthy: cannot read the port of {' '.join(line)!r}", file=sys.stderr)
            failed += 1
            continue
        if server is not None and server not in servers:
            servers.append(server)
    for server in servers:
        # Port 0 binds a free port that no command line shows.
        problem = "--port 0 cannot be checked: give the server a fixed --port" if server.port == 0 else check(server)
        if problem is None:
            print(f"healthy: agentrl {server.command} at {server.url}")
        else:
            print(f"unhealthy: agentrl {server.command} at {server.url}: {problem}", file=sys.stderr)
            failed += 1
    if not servers and not failed:
        print("healthy: no agentrl server runs in this container (nothing to ask)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
