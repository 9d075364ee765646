"""The ``bwrap`` back-end: every call is one bubblewrap sandbox over the episode's workspace folder.

What a call sees: a read-only ``/usr`` (with the merged-usr links ``/bin``, ``/lib``, ``/lib64``, ``/sbin``), a fresh
``/proc`` for its own pid namespace, a minimal read-only ``/dev`` with a small ``/dev/shm``, a small private
``/tmp`` (both `SandboxLimits.workspace_bytes` big, since they live in the host's memory), `WORKDIR` bound to its
workspace folder, and a read-only root so nothing else can be written. No ``/etc``, ``/root``, ``/home``,
repository or host ``/tmp``; no network (a network namespace with only its own loopback); no capabilities; no new
user namespaces (``--disable-userns``); no new privileges. The environment is rebuilt from nothing.

How a call ends: bubblewrap's pid 1 inside the sandbox dies with the call's first process, and with it every process
of the pid namespace, so background processes never outlive a call. At the wall limit the host kills bubblewrap's
process group; ``--die-with-parent`` turns that into the death of the whole namespace. If the host process itself dies,
the same flag takes every running sandbox with it.

Limits: a tiny Python supervisor (`_SHIM`, run by the sandbox's own ``/usr/bin/python3``) is the first program inside.
It sets the rlimits on the command's process (after bubblewrap made the user namespace, which is what makes
RLIMIT_NPROC count this call's processes only: the kernel checks each user-namespace level against the limit its
creator had, so a limit set before bubblewrap would be shared by every sandbox of the same uid), runs the command,
and reports its exact wait status on a private pipe: bubblewrap itself reports a signal as ``128 + n``, which a
program could also exit with. The supervisor marks itself undumpable so the command, running as the same uid, cannot
open its pipe through ``/proc``. It costs one Python start per call: a call of ``true`` takes 25-40 ms here,
bubblewrap alone 7-10 ms.

Root: bubblewrap is started through ``setpriv`` as a non-root uid, since root is exempt from RLIMIT_NPROC and should
not own anything a sandbox touches. Each live sandbox of a process gets its own uid (see `_uid`), so sandboxes never
share the per-user kernel quotas (pending signals, message queues, inotify instances, user namespaces) that one of them
could exhaust to starve the others, and, should one ever get out of its mount namespace, the others' workspace
folders (mode 0700, each owned by its own uid) stay closed to it. Not root: bubblewrap runs as our own uid.

Memory and processes per call: as root with writable memory and pids cgroup controllers (v1, as on the development
machine, or a delegated v2), each call runs in a cgroup of its own whose memory limit is `SandboxLimits.memory_mb`
and whose pids limit is `SandboxLimits.max_processes` (plus ours), removed after the call
(`envs.code.sandbox._cgroups`). Elsewhere only the rlimits bound them: RLIMIT_AS per process, so a call may hold up
to ``memory_mb * max_processes``. `BwrapBackend.resource_control` says which applies.

Disk: a watchdog measures the workspace from the host every 75 ms during a call (an lstat walk that never follows
a link) and kills the call once it passes `SandboxLimits.workspace_bytes` (`ExecResult.workspace_overflow`, the
workspace emptied, as the check after each call does). A call can still overshoot by its write rate times the pause
between two walks (some 50-100 MB at this machine's 600 MB/s; see `envs.code.sandbox._workspace`), so the back-end
refuses to start, or to make a sandbox, where the temporary folder's disk has less than 4 workspaces free.

Leftovers: the back-end's temporary folder is named after its owner (``agentrl-bwrap-<pid>-<start time>-...``).
Closing the back-end, dropping it, or the interpreter's exit (also after a SIGTERM that the runner turns into an
exception, as ``agentrl run`` does) removes it; a runner killed outright (SIGKILL, or SIGTERM at its default) cannot,
and the next `BwrapBackend` to start on the machine removes the folders (and cgroups) of owners that are gone.
Library code installs no signal handler for this.

Not done: no seccomp filter (every system call the namespaces allow is allowed: the kernel's attack surface is the
host's), and ``/usr/local`` is visible read-only with the rest of ``/usr`` (keep secrets out of it). A bubblewrap
without ``--disable-userns`` or ``--size`` (both in 0.8; Ubuntu 22.04 ships 0.6) runs without them: nested user
namespaces are then allowed and ``/tmp`` is unsized.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Mapping, Sequence

from ._calls import check_argv, check_env, check_limits, check_stdin, rlimits
from ._cgroups import CallCgroups
from ._owners import owner_tag
from ._process import run_bounded
from ._workspace import (
    empty_folder,
    reap_dead_roots,
    remove_folder,
    remove_own_folder,
    require_free_space,
    workspace_exceeds,
)
from .base import WORKDIR, ExecResult, Sandbox, SandboxBackend, SandboxError, SandboxLimits

__all__ = ["BwrapBackend", "BwrapSandbox"]

_SYSTEM_PATH = "/usr/bin:/bin"
_INSIDE_UID = 1000
"""The uid (and gid) a call sees for itself, whatever host uid it runs as: output the same on every machine."""
_SUPERVISOR_PROCESSES = 2
"""Processes of each call's namespace that are ours, not the command's (bubblewrap's pid 1 and the supervisor); added
to `SandboxLimits.max_processes` so the command gets the count it was promised."""

_SHIM = r"""
import os, resource, signal, sys
fd = int(sys.argv[1])
limits = [item.split(":") for item in sys.argv[2].split(",")]
sep = sys.argv.index("--", 3)
env = dict(os.environ)
env.update(item.split("=", 1) for item in sys.argv[3:sep])
argv = sys.argv[sep + 1:]
try:
    import ctypes
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
except Exception:
    pass
os.write(fd, b"S")
pid = os.fork()
if pid == 0:
    try:
        os.close(fd)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        for name, soft, hard in limits:
            resource.setrlimit(getattr(resource, "RLIMIT_" + name), (int(soft), int(hard)))
        os.execvpe(argv[0], argv, env)
    except FileNotFoundError:
        os.write(2, b"sandbox: command not found: " + os.fsencode(argv[0]) + b"\n")
        os._exit(127)
    except BaseException as exc:
        os.write(2, ("sandbox: cannot run %r: %s\n" % (argv[0], exc)).encode())
        os._exit(126)
_, status = os.waitpid(pid, 0)
os.write(fd, b"E%d" % status)
"""
"""The supervisor: set rlimits (``NAME:soft:hard,...``), add ``KEY=VALUE`` pairs to the environment, run the command
after ``--``, write ``S`` when started and ``E<wait status>`` when the command ended. PR_SET_DUMPABLE (4) = 0 keeps
its descriptors out of the command's reach; Python ignores SIGPIPE and SIGXFSZ, and ignored signals survive exec, so
the command gets their defaults back."""

_STATUS = re.compile(rb"^S(?:E(\d+))?$")
_ROOT_PREFIX = "agentrl-bwrap-"
_HOST_PROCESSES = 1
"""The call's host process (bubblewrap's outer half), counted by its cgroup's pids limit besides the namespace's."""

# ---- one uid per live sandbox (root only) --------------------------------------------------------------------------

_UID_BASE = 0x7000_0000
_PID_SPAN = 1 << 22
"""Linux's largest pid_max: every live process's pid is below it, so pid-derived uid blocks never overlap."""
_SLOTS = 63
"""Uids per process: 0x70000000 + 2**22 * 63 stays below 0x7FFE0000, clear of systemd's container range (which ends
at 0x6FFFFFFF), its foreign range (0x7FFE0000-0x7FFEFFFF) and the upper half that some tools read as negative."""
_slots_lock = threading.Lock()
_slots_used: dict[int, int] = {}
_slots_turn = 0


def _take_slot() -> int:
    """A free per-process slot, or past `_SLOTS` live sandboxes a shared one, taken in turn.

    Sharing keeps the namespaces' isolation; only the per-uid quotas and the defence in depth are then shared.
    """
    global _slots_turn
    with _slots_lock:
        slot = next((s for s in range(_SLOTS) if s not in _slots_used), None)
        if slot is None:
            slot = _slots_turn % _SLOTS
            _slots_turn += 1
        _slots_used[slot] = _slots_used.get(slot, 0) + 1
        return slot


def _give_slot(slot: int) -> None:
    with _slots_lock:
        left = _slots_used.get(slot, 0) - 1
        if left > 0:
            _slots_used[slot] = left
        else:
            _slots_used.pop(slot, None)


def _uid(slot: int) -> int:
    """The host uid of a sandbox in slot `slot` of this process.

    A block of `_SLOTS` uids per pid: two processes alive at the same time (runner workers on one node) never
    collide, and one process never hands the same uid to two live sandboxes.
    """
    return _UID_BASE + (os.getpid() % _PID_SPAN) * _SLOTS + slot


# ---- the sandbox ---------------------------------------------------------------------------------------------------


class BwrapSandbox(Sandbox):
    """One workspace folder on the host, run over by one bubblewrap sandbox per call. Made by `BwrapBackend.create`."""

    backend = "bwrap"

    def __init__(self, owner: BwrapBackend, folder: str, uid: int | None, slot: int | None,
                 limits: SandboxLimits) -> None:
        self._owner = owner
        self._folder = folder
        self._uid = uid
        self.limits = limits
        """The limits a call gets when it names none."""
        self._closed = False
        # Runs once: at close, when the sandbox is dropped unclosed, or at interpreter exit.
        self._finalizer = weakref.finalize(self, _release, folder, slot, os.getpid())

    @property
    def host_path(self) -> str:
        """The workspace folder on the host, for reaping and tests.

        Never read the agent's files through it: a link there resolves on the host (use `read_file`, `export_tree`).
        """
        return self._folder

    def run(self, argv: Sequence[str], *, stdin: bytes = b"", limits: SandboxLimits | None = None,
            env: Mapping[str, str] | None = None) -> ExecResult:
        """Run `argv` in a fresh bubblewrap sandbox over the workspace; see `Sandbox.run`."""
        if self._closed:
            raise SandboxError("this bwrap sandbox is closed: take a new one from the backend or the pool")
        limits = check_limits(self.limits if limits is None else limits)
        argv = check_argv(argv)
        extra = check_env(env)
        stdin = check_stdin(stdin)
        self._own_folder()
        cgroups = self._owner.cgroups
        cgroup = cgroups.make(limits.memory_mb * 1024 * 1024,
                              limits.max_processes + _SUPERVISOR_PROCESSES + _HOST_PROCESSES)
        try:
            read_fd, write_fd = os.pipe()
            cmd = [*cgroups.enter_command(cgroup),
                   *self._owner.command(self._folder, self._uid, limits, write_fd, extra, argv)]
            outcome = run_bounded(cmd, stdin=stdin, wall_s=limits.wall_s, output_bytes=limits.output_bytes,
                                  env={"PATH": _SYSTEM_PATH}, side_pipe=(read_fd, write_fd),
                                  watch=lambda: self._grew_past(limits.workspace_bytes))
        finally:
            cgroups.release(cgroup)
        status = _STATUS.match(outcome.side)
        if outcome.timed_out or outcome.stopped:
            code = None
        elif status is None:
            raise SandboxError(f"bubblewrap could not start the sandbox (exit {outcome.returncode}): "
                               f"{outcome.stderr.decode('utf-8', 'replace')[-500:].strip()}")
        elif status.group(1) is not None:
            code = os.waitstatus_to_exitcode(int(status.group(1)))
        else:
            # The command killed its supervisor (`kill -9 $PPID`, `kill -9 -1`): only bubblewrap's 128 + n is left.
            code = outcome.returncode
            code = 128 - code if code is not None and 128 < code < 128 + 65 else code
        overflow = self._check_size(limits, stopped=outcome.stopped)
        return ExecResult(exit_code=code, stdout=outcome.stdout, stderr=outcome.stderr, seconds=outcome.seconds,
                          timed_out=outcome.timed_out, output_truncated=outcome.truncated, workspace_overflow=overflow)

    def reset(self) -> None:
        """Empty the workspace from the host (links removed, never followed).

        No process is left to kill: every call's processes died with it.
        """
        if self._closed:
            raise SandboxError("this bwrap sandbox is closed: take a new one from the backend or the pool")
        self._own_folder()
        empty_folder(self._folder)

    def close(self) -> None:
        """Remove the workspace folder and give the uid back. Idempotent."""
        self._closed = True
        self._finalizer()

    def _own_folder(self) -> None:
        # The command owns its workspace and may have chmod-ed it to 000, which would fail the next bubblewrap's chdir.
        try:
            os.chmod(self._folder, 0o700)
        except FileNotFoundError as exc:
            raise SandboxError(f"the sandbox's workspace folder {self._folder} is gone (removed from outside?); "
                               f"take a new sandbox") from exc

    def _grew_past(self, max_bytes: int) -> bool:
        """The disk watchdog, run during a call: whether the workspace already holds more than `max_bytes`."""
        try:
            return workspace_exceeds(self._folder, max_bytes, live=True)
        except OSError:
            return False  # the root itself unreadable for a moment: the check after the call decides

    def _check_size(self, limits: SandboxLimits, *, stopped: bool) -> bool:
        if not stopped and not workspace_exceeds(self._folder, limits.workspace_bytes):
            return False
        empty_folder(self._folder)
        return True


def _release(folder: str, slot: int | None, creator: int) -> None:
    if os.getpid() != creator:
        return  # a forked child exiting: the folder is its parent's
    try:
        remove_folder(folder)
    finally:
        if slot is not None:
            _give_slot(slot)


# ---- the back-end --------------------------------------------------------------------------------------------------


class BwrapBackend(SandboxBackend):
    """Makes `BwrapSandbox`es: workspace folders under one private temporary folder of this process.

    The constructor does not probe the machine: `unavailable_reason` does (once per process), and `make_backend`
    calls it. Without bubblewrap or user namespaces, the first `run` raises `SandboxError` with bubblewrap's message.
    """

    name = "bwrap"

    def __init__(self) -> None:
        self._root_user = os.geteuid() == 0
        self._bwrap = shutil.which("bwrap", path=f"{_SYSTEM_PATH}:/usr/local/bin") or "bwrap"
        self._options = _known_options(self._bwrap)
        self._setpriv = shutil.which("setpriv", path=f"{_SYSTEM_PATH}:/usr/sbin:/sbin") or "setpriv"
        temp = tempfile.gettempdir()
        self.reaped = reap_dead_roots(temp, _ROOT_PREFIX)
        """Temporary folders of runners that died without removing them, removed at this back-end's start."""
        require_free_space(temp, SandboxLimits().workspace_bytes, self.name)
        self._root = tempfile.mkdtemp(prefix=f"{_ROOT_PREFIX}{owner_tag()}-", dir=temp)
        if self._root_user:
            # Sandbox uids must reach their own folder by name to bind it, but may not list the others.
            os.chmod(self._root, 0o711)
        self.cgroups = CallCgroups(self.name)
        """Makes each call's cgroup, where this process may (see `resource_control`)."""
        self._lock = threading.Lock()
        self._sandboxes: weakref.WeakSet[BwrapSandbox] = weakref.WeakSet()
        self._closed = False
        self._finalizer = weakref.finalize(self, _retire, self._root, os.getpid(), self.cgroups)

    @property
    def resource_control(self) -> str:
        """How a call's memory and processes are bounded, for the doctor and the logs.

        ``cgroup v1 (memory, pids)``, ``cgroup v2 (memory, pids)``, or ``rlimits (why)`` (per process; see the module
        docstring).
        """
        return self.cgroups.mode

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """None when a bubblewrap sandbox runs here (probed once per process by running ``true`` in one)."""
        return _probe()

    def create(self, limits: SandboxLimits) -> BwrapSandbox:
        """A new empty workspace (mode 0700, owned by the sandbox's uid): a folder made, no process started."""
        check_limits(limits)
        require_free_space(self._root, limits.workspace_bytes, self.name)
        with self._lock:
            if self._closed:
                raise SandboxError("this bwrap backend is closed: make a new one")
            slot = _take_slot() if self._root_user else None
            try:
                folder = tempfile.mkdtemp(prefix="ws-", dir=self._root)
                uid = _uid(slot) if slot is not None else None
                if uid is not None:
                    os.chown(folder, uid, uid)
            except BaseException:
                if slot is not None:
                    _give_slot(slot)
                raise
            sandbox = BwrapSandbox(self, folder, uid, slot, limits)
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

    def command(self, folder: str, uid: int | None, limits: SandboxLimits, status_fd: int, env: Mapping[str, str],
                argv: Sequence[str]) -> list[str]:
        """The host command line of one call (public for inspection and tests; `BwrapSandbox.run` runs it)."""
        prefix = [self._setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs"] \
            if uid is not None else []
        # An older bubblewrap may lack --disable-userns or --size: run without them rather than not at all (the
        # namespaces still isolate; only nested user namespaces and the scratch mounts' size are then open).
        no_userns = ["--disable-userns"] if "--disable-userns" in self._options else []
        size = ["--size", str(limits.workspace_bytes)] if "--size" in self._options else []
        spec = ",".join(f"{name}:{soft}:{hard}" for name, soft, hard in
                        rlimits(limits, nproc=limits.max_processes + _SUPERVISOR_PROCESSES))
        return [
            *prefix, self._bwrap,
            "--unshare-all", "--unshare-user", *no_userns, "--die-with-parent", "--new-session",
            "--uid", str(_INSIDE_UID), "--gid", str(_INSIDE_UID), "--hostname", "sandbox",
            "--ro-bind", "/usr", "/usr",
            "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
            "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
            "--proc", "/proc", "--dev", "/dev", *size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
            *size, "--tmpfs", "/tmp",
            "--bind", folder, WORKDIR, "--remount-ro", "/", "--chdir", WORKDIR,
            "--clearenv", "--setenv", "PATH", _SYSTEM_PATH, "--setenv", "HOME", WORKDIR,
            "--setenv", "LANG", "C.UTF-8", "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
            "--", "/usr/bin/python3", "-I", "-S", "-c", _SHIM, str(status_fd), spec,
            *(f"{key}={value}" for key, value in env.items()), "--", *argv,
        ]


def _retire(root: str, creator: int, cgroups: CallCgroups) -> None:
    """Remove a back-end's temporary folder and cgroups, in the process that made them only."""
    if os.getpid() != creator:
        return
    try:
        cgroups.close()
    finally:
        remove_own_folder(root, creator)


@functools.lru_cache(maxsize=4)
def _known_options(bwrap: str) -> frozenset[str]:
    """The options this bubblewrap's ``--help`` lists (empty if it cannot even say)."""
    try:
        shown = subprocess.run([bwrap, "--help"], capture_output=True, timeout=10, env={"PATH": _SYSTEM_PATH})
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    return frozenset(re.findall(r"--[a-z][a-z0-9-]*", (shown.stdout + shown.stderr).decode("utf-8", "replace")))


_FIXES = ("install bubblewrap (apt-get install bubblewrap; dnf install bubblewrap); allow unprivileged user "
          "namespaces (sysctl -w kernel.unprivileged_userns_clone=1 on Debian/Ubuntu kernels that have it, "
          "sysctl -w user.max_user_namespaces=15000 where it is 0, and on Ubuntu 23.10+ "
          "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0); inside a container, start it with "
          "--security-opt seccomp=unconfined --security-opt apparmor=unconfined; or use the podman back-end")


@functools.lru_cache(maxsize=1)
def _probe() -> str | None:
    """Run ``true`` in a real sandbox once per process; None if it worked, else what failed and the fixes."""
    if not sys.platform.startswith("linux"):
        return f"bubblewrap needs Linux (this is {sys.platform}); use the podman back-end"
    if shutil.which("bwrap", path=f"{_SYSTEM_PATH}:/usr/local/bin") is None:
        return f"bubblewrap (bwrap) is not installed. Fixes: {_FIXES}"
    if not os.access("/usr/bin/python3", os.X_OK):
        return "the sandbox runs the host's /usr/bin/python3, which is missing: apt-get install python3"
    if os.geteuid() == 0 and shutil.which("setpriv", path=f"{_SYSTEM_PATH}:/usr/sbin:/sbin") is None:
        return "running as root, the bwrap back-end drops to another uid with setpriv: apt-get install util-linux"
    backend = BwrapBackend()
    try:
        result = backend.create(SandboxLimits(wall_s=20)).run(["true"])
    except SandboxError as exc:
        return f"bubblewrap could not start a sandbox here ({exc}). Fixes: {_FIXES}"
    finally:
        backend.close()
    if result.exit_code != 0:
        return (f"a bubblewrap sandbox ran but `true` exited {result.exit_code} "
                f"({result.text('stderr')[-300:].strip()}). Fixes: {_FIXES}")
    return None
