"""One local command run with bounded output and a wall deadline: the host half of the bwrap and subprocess back-ends.

The command starts in a session of its own, so its process group can be killed whole. One thread feeds its stdin,
reads stdout and stderr at the same time (a child blocked on a full stderr pipe while we wait on stdout would never
finish), keeps the first `output_bytes` of each stream and reads and drops the rest (a 100 MB flood costs time, never
memory), and kills the group at the deadline. A pidfd says the moment the group's leader exits; the group is then
killed too, so background children that stayed in it cannot hold the pipes open, and whatever escaped the group
(``setsid``) gets a short grace before its pipes are abandoned rather than waited for.

A caller may also pass a `watch`: a check run every `watch_every_s` while the command runs (the back-ends measure the
workspace with it). When it answers True the group is killed as at the deadline and the outcome says `stopped`. A
check that takes long is run less often (the pause after it is at least twice its own time), so a large tree costs
at most about a third of a core however often it was asked for.

The leader is reaped only after the group is killed: until then its pid (which is the group id) cannot be reused,
so the kill cannot hit an unrelated process group.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .base import SandboxError

__all__ = ["ProcessOutcome", "run_bounded", "kill_group"]

_CHUNK = 65_536
_KILL_GRACE_S = 5.0
"""After a kill, how long the pipes may stay open (every writer is dying) before they are abandoned."""
_LINGER_S = 0.5
"""After the leader exits, how long a writer that escaped the process group may keep the pipes before they are
abandoned (the result then holds what came in time)."""
_SIDE_BYTES = 4_096


@dataclass(frozen=True)
class ProcessOutcome:
    """What one local command did, before a back-end turns it into an `ExecResult`."""

    returncode: int | None
    """`subprocess` convention (negative for a signal); None when it was killed at the deadline."""
    stdout: bytes
    stderr: bytes
    side: bytes
    """What the command wrote on the side channel (the back-end's status pipe), at most 4 KiB; empty without one."""
    seconds: float
    timed_out: bool
    truncated: bool
    stopped: bool = False
    """The `watch` of `run_bounded` asked for a stop and the group was killed (`returncode` is then None)."""


def kill_group(pgid: int) -> None:
    """SIGKILL a process group, ignoring a group that is already gone."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_bounded(cmd: Sequence[str], *, stdin: bytes, wall_s: float, output_bytes: int,
                env: Mapping[str, str], cwd: str | None = None, side_pipe: tuple[int, int] | None = None,
                watch: Callable[[], bool] | None = None, watch_every_s: float = 0.075) -> ProcessOutcome:
    """Run `cmd` with `stdin`, keep `output_bytes` of stdout and of stderr, kill its group at `wall_s`.

    Args:
        cmd: the host command line; ``cmd[0]`` must exist.
        stdin: bytes fed to the command (written as it reads; a command that never reads gets a closed pipe).
        wall_s: seconds from start until the process group is killed.
        output_bytes: bytes of each stream kept.
        env: the complete environment of the command (nothing of ours is inherited).
        cwd: working directory of the command.
        side_pipe: ``(read_fd, write_fd)`` of a pipe made by the caller: the write end is handed to the command at
            the same number (the caller put that number in `cmd`) and closed here; the read end is read like
            stdout and closed here.
        watch: called about every `watch_every_s` seconds while the command runs; True kills the group.
        watch_every_s: the shortest pause between two `watch` calls.

    Raises:
        SandboxError: the command could not be started at all.
    """
    pass_fds = (side_pipe[1],) if side_pipe else ()
    start = time.monotonic()
    try:
        proc = subprocess.Popen(list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=dict(env), cwd=cwd, start_new_session=True, close_fds=True, pass_fds=pass_fds)
    except OSError as exc:
        if side_pipe:
            os.close(side_pipe[0])
            os.close(side_pipe[1])
        raise SandboxError(f"could not start {cmd[0]!r}: {exc}") from exc
    if side_pipe:
        os.close(side_pipe[1])
    try:
        return _drive(proc, start, stdin, wall_s, output_bytes, side_pipe[0] if side_pipe else None, watch,
                      watch_every_s)
    finally:
        if side_pipe:
            os.close(side_pipe[0])


def _drive(proc: subprocess.Popen, start: float, stdin: bytes, wall_s: float, output_bytes: int,
           side_fd: int | None, watch: Callable[[], bool] | None, watch_every_s: float) -> ProcessOutcome:
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd, in_fd = proc.stdout.fileno(), proc.stderr.fileno(), proc.stdin.fileno()
    kept = {out_fd: bytearray(), err_fd: bytearray()}
    room = {out_fd: output_bytes, err_fd: output_bytes}
    if side_fd is not None:
        kept[side_fd] = bytearray()
        room[side_fd] = _SIDE_BYTES
    truncated = timed_out = stopped = exited = False
    stop_at = start + wall_s  # the deadline; after a kill or the leader's exit, the end of the grace
    watch_at = start + watch_every_s if watch is not None else float("inf")

    sel = selectors.DefaultSelector()
    for fd in kept:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    pidfd = _pidfd(proc.pid)
    if pidfd is not None:
        sel.register(pidfd, selectors.EVENT_READ)
    pending = memoryview(stdin)
    if pending:
        os.set_blocking(in_fd, False)
        sel.register(in_fd, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    open_reads = set(kept)

    try:
        while open_reads or not exited:
            now = time.monotonic()
            if now >= stop_at:
                if exited or timed_out or stopped:
                    break  # grace over: abandon pipes still held by escaped or dying writers
                timed_out = True
                kill_group(proc.pid)
                stop_at = now + _KILL_GRACE_S
                continue
            if now >= watch_at:
                if exited or timed_out or watch is None:
                    watch_at = float("inf")  # nothing of the command is left to stop
                elif watch():
                    stopped = True
                    kill_group(proc.pid)
                    stop_at = time.monotonic() + _KILL_GRACE_S
                    watch_at = float("inf")
                    continue
                else:
                    watch_at = time.monotonic() + max(watch_every_s, 2 * (time.monotonic() - now))
            timeout = stop_at - now if pidfd is not None or exited else min(stop_at - now, 0.02)
            timeout = max(min(timeout, watch_at - now), 0.0)
            for key, _ in sel.select(timeout):
                fd = key.fd
                if fd == pidfd:
                    sel.unregister(fd)
                elif fd == in_fd:
                    pending = _feed(in_fd, pending)
                    if not pending:
                        sel.unregister(in_fd)
                        proc.stdin.close()
                else:
                    try:
                        chunk = os.read(fd, _CHUNK)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        sel.unregister(fd)
                        open_reads.discard(fd)
                        continue
                    keep = max(room[fd] - len(kept[fd]), 0)
                    if len(chunk) > keep:
                        truncated = truncated or fd != side_fd
                    kept[fd] += chunk[:keep]
            if not exited and _has_exited(proc, pidfd, sel):
                exited = True
                # Background children left in the group would hold the pipes open: kill them now. The leader is a
                # zombie until waited for, so its pid, the group id, cannot have been reused.
                kill_group(proc.pid)
                if not timed_out:
                    stop_at = min(stop_at, time.monotonic() + _LINGER_S)
    finally:
        sel.close()
        if pidfd is not None:
            os.close(pidfd)
        if not proc.stdin.closed:
            proc.stdin.close()
        kill_group(proc.pid)
        try:
            proc.wait(timeout=_KILL_GRACE_S)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL did not end it (uninterruptible sleep)
            pass
        proc.stdout.close()
        proc.stderr.close()
    return ProcessOutcome(returncode=None if timed_out or stopped else proc.returncode, stdout=bytes(kept[out_fd]),
                          stderr=bytes(kept[err_fd]), side=bytes(kept[side_fd]) if side_fd is not None else b"",
                          seconds=time.monotonic() - start, timed_out=timed_out, truncated=truncated, stopped=stopped)


def _feed(fd: int, pending: memoryview) -> memoryview:
    """Write what the pipe takes now; the rest stays pending. A reader that went away wants none of it."""
    try:
        return pending[os.write(fd, pending[:_CHUNK]):]
    except BlockingIOError:
        return pending
    except BrokenPipeError:
        return pending[len(pending):]


def _has_exited(proc: subprocess.Popen, pidfd: int | None, sel: selectors.BaseSelector) -> bool:
    """Whether the leader has exited, without reaping it (the group must be killed first)."""
    if pidfd is not None:
        return pidfd not in sel.get_map()
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when `pid` exits (Linux 5.3+), or None where there is none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
