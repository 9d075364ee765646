"""The ``subprocess`` back-end: plain child processes in a workspace folder, with NO isolation at all.

Agent code run here sees and can change everything this process can: host files (the repository, ``~/.ssh``), the
network, other processes of the same user. It exists as the baseline the benchmarks compare bubblewrap and podman
with, and for machines without user namespaces where the user accepts the risk; the constructor refuses to build
unless told ``unsafe=True`` (the env's ``unsafe_subprocess=True``).

What it does bound, with the same numbers as the isolating back-ends: CPU seconds, address space, file size, open
files and core dumps per process (rlimits set by util-linux ``prlimit``, which then execs the command, so the exit
status is the command's own); wall time and leftovers (each call is its own process group, killed at the wall limit
and again when the call's first process exits); output size (read concurrently, cut, the rest drained); workspace
size (measured every 75 ms during a call, which is killed when it passes the limit, and checked after it).
RLIMIT_NPROC counts every process of the user on the whole host: as root it does
nothing at all (root is exempt), so it is not set and a fork bomb runs until the wall limit kills its process group;
as another user it is set to the processes the user already has plus `SandboxLimits.max_processes`, an approximate
bound that concurrent calls share. A process that leaves the group (``setsid``) outlives the call; `reset` and
`close` kill what still has its working directory in the workspace, which is as far as a back-end without namespaces
can follow it.

Paths: `WORKDIR` is not ``/workspace`` here but the workspace folder itself. Calls run with it as working directory
and in ``$WORKSPACE`` and ``$HOME``; relative paths (what `write_file` / `read_file` take) work the same everywhere;
`export_tree` / `import_tree` are overridden to use the folder.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import weakref
from collections.abc import Mapping, Sequence

from ._calls import check_argv, check_env, check_limits, check_stdin, rlimits
from ._process import run_bounded
from ._workspace import empty_folder, remove_folder, remove_own_folder, workspace_exceeds
from .base import ExecResult, Sandbox, SandboxBackend, SandboxError, SandboxLimits, WorkspaceTooLarge

__all__ = ["SubprocessBackend", "SubprocessSandbox"]

_SYSTEM_PATH = "/usr/bin:/bin"

REFUSAL = ("the subprocess sandbox back-end runs agent code directly on this host with no isolation: it can read and "
           "change your files, reach the network and signal your processes. Pass unsafe_subprocess=True to the env "
           "(SubprocessBackend(unsafe=True)) only if you accept that; otherwise install bubblewrap "
           "(apt-get install bubblewrap) or use the podman back-end.")
"""Why `SubprocessBackend` refused to build, and the flag that makes it build."""


class SubprocessSandbox(Sandbox):
    """A workspace folder on the host; each call is a child process in it. Made by `SubprocessBackend.create`."""

    backend = "subprocess"

    def __init__(self, owner: SubprocessBackend, folder: str, limits: SandboxLimits) -> None:
        self._owner = owner
        self._folder = folder
        self.limits = limits
        """The limits a call gets when it names none."""
        self._closed = False
        self._finalizer = weakref.finalize(self, _reap_and_remove, folder, os.getpid())

    @property
    def host_path(self) -> str:
        """The workspace folder: here also what the calls see as their working directory and ``$WORKSPACE``."""
        return self._folder

    def run(self, argv: Sequence[str], *, stdin: bytes = b"", limits: SandboxLimits | None = None,
            env: Mapping[str, str] | None = None) -> ExecResult:
        """Run `argv` as a child process in the workspace folder; see `Sandbox.run` (but nothing is isolated)."""
        if self._closed:
            raise SandboxError("this subprocess sandbox is closed: take a new one from the backend or the pool")
        limits = check_limits(self.limits if limits is None else limits)
        argv = check_argv(argv)
        extra = check_env(env)
        stdin = check_stdin(stdin)
        if not os.path.isdir(self._folder):
            raise SandboxError(f"the sandbox's workspace folder {self._folder} is gone (removed from outside?); "
                               f"take a new sandbox")
        os.chmod(self._folder, 0o700)  # the command may have taken our rights to its workspace away
        cmd = [self._owner.prlimit, *(f"--{name.lower()}={soft}:{hard}" for name, soft, hard in
                                      rlimits(limits, nproc=_nproc_limit(limits))), "--", *argv]
        base = {"PATH": _SYSTEM_PATH, "HOME": self._folder, "WORKSPACE": self._folder, "LANG": "C.UTF-8",
                "PYTHONDONTWRITEBYTECODE": "1"}
        outcome = run_bounded(cmd, stdin=stdin, wall_s=limits.wall_s, output_bytes=limits.output_bytes,
                              env={**base, **extra}, cwd=self._folder,
                              watch=lambda: _grew_past(self._folder, limits.workspace_bytes))
        overflow = outcome.stopped or workspace_exceeds(self._folder, limits.workspace_bytes)
        if overflow:
            empty_folder(self._folder)
        return ExecResult(exit_code=outcome.returncode, stdout=outcome.stdout, stderr=outcome.stderr,
                          seconds=outcome.seconds, timed_out=outcome.timed_out, output_truncated=outcome.truncated,
                          workspace_overflow=overflow)

    def reset(self) -> None:
        """Kill processes still working in the workspace (escaped with ``setsid``), then empty it."""
        if self._closed:
            raise SandboxError("this subprocess sandbox is closed: take a new one from the backend or the pool")
        _kill_inside(self._folder)
        empty_folder(self._folder)

    def close(self) -> None:
        """Kill what still works in the workspace and remove the folder. Idempotent."""
        self._closed = True
        self._finalizer()

    def export_tree(self, limits: SandboxLimits | None = None) -> bytes:
        """The workspace as an uncompressed tar (links kept as links), made with the folder as tar's root."""
        result = self.run(["tar", "-C", self._folder, "-cf", "-", "."], limits=limits)
        if result.output_truncated:
            room = (limits or self.limits).output_bytes
            raise WorkspaceTooLarge(f"the workspace is larger than {room} bytes as a tar")
        if not result.ok:
            raise SandboxError(f"could not export the workspace (exit {result.exit_code}, "
                               f"truncated={result.output_truncated}): {result.text('stderr')[-300:]}")
        return result.stdout

    def import_tree(self, tar: bytes, limits: SandboxLimits | None = None) -> ExecResult:
        """Unpack a tar made by `export_tree` into the workspace folder."""
        return self.run(["tar", "-C", self._folder, "-xf", "-"], stdin=tar, limits=limits)


class SubprocessBackend(SandboxBackend):
    """Makes `SubprocessSandbox`es under one private temporary folder. Refuses to exist unless ``unsafe=True``."""

    name = "subprocess"

    def __init__(self, *, unsafe: bool = False) -> None:
        """Build the back-end; `unsafe` must be True, acknowledging that agent code runs on the host unprotected."""
        if unsafe is not True:
            raise ValueError(REFUSAL)
        self.prlimit = shutil.which("prlimit", path=f"{_SYSTEM_PATH}:/usr/local/bin") or "prlimit"
        """The util-linux ``prlimit`` every call starts through."""
        self._root = tempfile.mkdtemp(prefix="agentrl-subprocess-")
        self._lock = threading.Lock()
        self._sandboxes: weakref.WeakSet[SubprocessSandbox] = weakref.WeakSet()
        self._closed = False
        self._finalizer = weakref.finalize(self, remove_own_folder, self._root, os.getpid())

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """None when util-linux ``prlimit`` is on this machine (it sets each call's rlimits)."""
        if shutil.which("prlimit", path=f"{_SYSTEM_PATH}:/usr/local/bin") is None:
            return ("the subprocess back-end sets limits with util-linux prlimit, which is missing: "
                    "apt-get install util-linux")
        return None

    def create(self, limits: SandboxLimits) -> SubprocessSandbox:
        """A new empty workspace folder (mode 0700); no process started."""
        check_limits(limits)
        with self._lock:
            if self._closed:
                raise SandboxError("this subprocess backend is closed: make a new one")
            sandbox = SubprocessSandbox(self, tempfile.mkdtemp(prefix="ws-", dir=self._root), limits)
            self._sandboxes.add(sandbox)
            return sandbox

    def close(self) -> None:
        """Close every sandbox made here and remove the temporary folder. Idempotent; also run at exit."""
        with self._lock:
            self._closed = True
            sandboxes = list(self._sandboxes)
        for sandbox in sandboxes:
            sandbox.close()
        self._finalizer()


def _grew_past(folder: str, max_bytes: int) -> bool:
    """The disk watchdog, run during a call: whether the workspace already holds more than `max_bytes`."""
    try:
        return workspace_exceeds(folder, max_bytes, live=True)
    except OSError:
        return False  # the check after the call decides


def _nproc_limit(limits: SandboxLimits) -> int | None:
    """RLIMIT_NPROC for a call: none as root (exempt), else the user's current tasks plus the call's allowance."""
    uid = os.geteuid()
    if uid == 0:
        return None
    tasks = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status", "rb") as status:
                fields = dict(line.split(b":", 1) for line in status if b":" in line)
        except OSError:
            continue
        if int(fields.get(b"Uid", b"-1 ").split()[0]) == uid:
            tasks += int(fields.get(b"Threads", b"1").strip())
    return tasks + limits.max_processes


def _kill_inside(folder: str) -> None:
    """SIGKILL every process whose working directory is in `folder` (those that left their call's process group)."""
    own = os.getpid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == own:
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if cwd == folder or cwd.startswith(folder + os.sep):
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _reap_and_remove(folder: str, creator: int) -> None:
    if os.getpid() != creator:
        return  # a forked child exiting: the folder and its processes are its parent's
    _kill_inside(folder)
    remove_folder(folder)
