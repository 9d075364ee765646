"""One cgroup per call, where this process may make them: memory and process count bounded for the call as a whole.

Rlimits bound each process: RLIMIT_AS lets every one of a call's `SandboxLimits.max_processes` processes map
`SandboxLimits.memory_mb`, so a call may hold their product. A cgroup bounds their sum. Where this process runs as
root and finds the memory and pids controllers writable, `CallCgroups` makes a parent cgroup named after its owner
(``agentrl-<kind>-<pid>-<start time>-<random>``, see `envs.code.sandbox._owners`; one per back-end) below the
cgroup this process is in, so calls stay inside whatever limits the runner itself has, and one child per call with

* cgroup v1 (``/sys/fs/cgroup/memory`` and ``/sys/fs/cgroup/pids``, as on the development machine):
  ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes``, so swap is no way around it) = `memory_mb`,
  ``pids.max`` = the call's processes;
* cgroup v2 (one hierarchy): ``memory.max`` (``memory.swap.max`` = 0) and ``pids.max``, when this process's own
  cgroup delegates both controllers to its children (``cgroup.subtree_control``), which in practice means a process in
  the root cgroup or a delegated one (systemd ``Delegate=yes``).

The call's first host process puts itself in the child before it execs the sandbox (`enter_command`), so every
process the call makes is born inside. The memory limit counts what the call's tmpfs mounts and page cache hold too;
the kernel's OOM killer then kills within the call's cgroup only. After the call the child's processes are killed
and the child removed. Whatever fails here (no root, read-only ``/sys``, a controller missing, a write refused) leaves
that call, or the back-end, on rlimits alone: a call never fails because cgroups are unavailable. `mode` says which
applies. A runner killed before it removed its cgroups leaves them empty (its sandboxes died with it); the next
back-end to start removes those of dead owners (`reap`).
"""

from __future__ import annotations

import itertools
import os
import secrets
import signal
import time

from ._owners import owner_alive, owner_tag, parse_tag

__all__ = ["CallCgroups", "CallCgroup", "RLIMITS_ONLY"]

RLIMITS_ONLY = "rlimits"
"""`CallCgroups.mode` when no cgroup is made: memory and processes are bounded per process (and per user namespace)."""

_ROOT = "/sys/fs/cgroup"
_V1 = ("memory", "pids")
_REMOVE_WAIT_S = 2.0
"""How long a finished call's cgroup may take to empty (its pid namespace is being torn down) before it is left for
the back-end's close or the next start."""


def _own_path(controller: str | None) -> str | None:
    """This process's cgroup path in the v1 hierarchy of `controller`, or in the v2 one for None."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, names, path = line.split(":", 2)
        if (controller is None and names == "") or (controller is not None and controller in names.split(",")):
            return path
    return None


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as fh:
        fh.write(value)


class CallCgroup:
    """The cgroup(s) of one call: one directory per v1 controller, or one v2 directory."""

    def __init__(self, dirs: list[str]) -> None:
        self.dirs = dirs
        """The call's cgroup directories; their ``cgroup.procs`` is what `CallCgroups.enter_command` writes to."""

    def remove(self) -> bool:
        """Kill what is left in the call's cgroup and remove it; False when it would not empty in time."""
        deadline = time.monotonic() + _REMOVE_WAIT_S
        left = list(self.dirs)
        while left:
            for folder in list(left):
                _kill_all(folder)
                try:
                    os.rmdir(folder)
                except FileNotFoundError:
                    pass
                except OSError:
                    continue  # EBUSY: processes still exiting
                left.remove(folder)
            if left:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.01)
        return True


def _kill_all(folder: str) -> None:
    try:
        with open(os.path.join(folder, "cgroup.procs"), encoding="ascii") as fh:
            pids = [int(line) for line in fh if line.strip()]
    except OSError:
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class CallCgroups:
    """Makes one cgroup per call for one back-end, or knows it cannot (`mode` says which).

    Args:
        kind: the back-end's name, part of the parent cgroup's name (``agentrl-<kind>-<owner>``).
    """

    def __init__(self, kind: str) -> None:
        self._prefix = f"agentrl-{kind}-"
        self._parents: list[str] = []
        self._v2 = False
        self._count = itertools.count()
        self._left: list[CallCgroup] = []
        self.reaped: list[str] = []
        """Parent cgroups of dead owners removed when this one was made."""
        self.mode = RLIMITS_ONLY
        """``cgroup v1 (memory, pids)``, ``cgroup v2 (memory, pids)``, or `RLIMITS_ONLY` followed by why."""
        if os.geteuid() != 0:
            self.mode = f"{RLIMITS_ONLY} (not root: cgroups are not ours to make)"
            return
        try:
            bases = self._bases()
        except OSError as exc:
            self.mode = f"{RLIMITS_ONLY} ({exc})"
            return
        if bases is None:
            self.mode = f"{RLIMITS_ONLY} (no writable memory and pids cgroup controllers under {_ROOT})"
            return
        self.reaped = [path for base in bases for path in self._reap(base)]
        tag, unique = owner_tag(), secrets.token_hex(4)
        try:
            for base in bases:
                parent = os.path.join(base, f"{self._prefix}{tag}-{unique}")  # one per back-end, not per process
                os.mkdir(parent)
                self._parents.append(parent)
                if self._v2:
                    _write(os.path.join(parent, "cgroup.subtree_control"), "+memory +pids")
        except OSError as exc:
            self.close()
            self.mode = f"{RLIMITS_ONLY} (could not make a cgroup: {exc})"
            return
        self.mode = f"cgroup {'v2' if self._v2 else 'v1'} (memory, pids)"

    @property
    def active(self) -> bool:
        """Whether calls get a cgroup of their own."""
        return bool(self._parents)

    def _bases(self) -> list[str] | None:
        """Where the parents go: this process's own cgroup in each v1 controller, or in the v2 hierarchy."""
        if os.path.exists(os.path.join(_ROOT, "cgroup.controllers")):
            own = _own_path(None)
            base = os.path.join(_ROOT, (own or "/").lstrip("/"))
            with open(os.path.join(base, "cgroup.subtree_control"), encoding="ascii") as fh:
                delegated = fh.read().split()
            if own is None or not {"memory", "pids"} <= set(delegated) or not os.access(base, os.W_OK):
                return None
            self._v2 = True
            return [base]
        bases = []
        for controller in _V1:
            own = _own_path(controller)
            base = os.path.join(_ROOT, controller, (own or "/").lstrip("/"))
            if own is None or not os.path.isdir(base) or not os.access(base, os.W_OK):
                return None
            bases.append(base)
        return bases

    def _reap(self, base: str) -> list[str]:
        """Remove the parents (and their leftover children) of owners that are gone."""
        removed = []
        for name in os.listdir(base):
            tag = parse_tag(name[len(self._prefix):]) if name.startswith(self._prefix) else None
            if tag is None or owner_alive(*tag):
                continue
            parent = os.path.join(base, name)
            children = [os.path.join(parent, child) for child in os.listdir(parent)
                        if os.path.isdir(os.path.join(parent, child))]
            if CallCgroup([*children, parent]).remove():
                removed.append(parent)
        return removed

    def make(self, memory_bytes: int, pids: int) -> CallCgroup | None:
        """A new cgroup for one call with these limits, or None (the call then has its rlimits alone)."""
        if not self._parents:
            return None
        name = f"call-{next(self._count)}"
        made: list[str] = []
        try:
            for parent in self._parents:
                folder = os.path.join(parent, name)
                os.mkdir(folder)
                made.append(folder)
                if self._v2:
                    _write(os.path.join(folder, "memory.max"), str(memory_bytes))
                    _try_write(os.path.join(folder, "memory.swap.max"), "0")
                    _write(os.path.join(folder, "pids.max"), str(pids))
                elif os.path.exists(os.path.join(folder, "memory.limit_in_bytes")):
                    _write(os.path.join(folder, "memory.limit_in_bytes"), str(memory_bytes))
                    _try_write(os.path.join(folder, "memory.memsw.limit_in_bytes"), str(memory_bytes))
                else:
                    _write(os.path.join(folder, "pids.max"), str(pids))
        except OSError:
            CallCgroup(made).remove()
            return None
        return CallCgroup(made)

    def release(self, cgroup: CallCgroup | None) -> None:
        """Remove a call's cgroup once the call is over (kept for `close` if it would not empty yet)."""
        if cgroup is not None and not cgroup.remove():
            self._left.append(cgroup)

    @staticmethod
    def enter_command(cgroup: CallCgroup | None) -> list[str]:
        """A command prefix that moves itself into `cgroup`, then execs the rest (nothing when `cgroup` is None).

        A refused write leaves that call on its rlimits rather than failing it.
        """
        if cgroup is None:
            return []
        script = 'for f in "$@"; do [ "$f" = -- ] && break; echo $$ 2>/dev/null > "$f"; shift; done; shift; exec "$@"'
        return ["/bin/sh", "-c", script, "sh", *(os.path.join(d, "cgroup.procs") for d in cgroup.dirs), "--"]

    def close(self) -> None:
        """Remove every cgroup of this back-end. Idempotent."""
        for cgroup in self._left:
            cgroup.remove()
        self._left.clear()
        for parent in self._parents:
            children = [os.path.join(parent, child) for child in os.listdir(parent)
                        if os.path.isdir(os.path.join(parent, child))] if os.path.isdir(parent) else []
            CallCgroup([*children, parent]).remove()
        self._parents = []


def _try_write(path: str, value: str) -> None:
    """A write that may be refused (no swap accounting, say) without losing the limit that matters."""
    try:
        _write(path, value)
    except OSError:
        pass
