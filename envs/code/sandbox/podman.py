"""The podman back-end: one long-lived container per back-end (one per worker), one folder and one uid per sandbox.

Starting a container costs a tenth of a second to several seconds; a worker runs thousands of episodes. So a
`PodmanBackend` starts ONE container lazily, at its first `create`, and every `PodmanSandbox` it makes is a folder
``/ws/<random id>`` inside it, run by a uid of its own. The container is locked down as a whole: ``--network none``,
a read-only root, ``--cap-drop ALL``, ``no-new-privileges``, ``--pids-limit`` and ``--memory`` for everything in it,
tmpfs for ``/ws`` and ``/tmp`` (nothing written reaches the host's disk), an init (``--init``, catatonit) as pid 1 to
reap orphans, ``sleep infinity`` as its only process of its own, and a label with the owner's pid so a container left
by a crashed run is found and removed at the next start (`PodmanBackend.remove_leftovers`).

How the sandboxes of one container are kept apart, and why a uid each:

* Each sandbox's calls run as its own uid (``podman exec --user U:U``), from a block of 64 derived from the owner's
  pid above 0x60000000 (no host user has them, two live processes never share one, and no two live sandboxes of a
  process do, whichever of its back-ends made them); podman runs rootful here, so these are host uids too.
  Files: ``/ws`` is mode 1733 (enter, not list) and each ``/ws/<id>`` is 0700 and owned by its uid, so a sandbox can
  neither list nor open another's folder. Processes: ``/proc`` is mounted with ``hidepid=2``, so a sandbox sees only
  its own processes (not other sandboxes' command lines), and ``kill -9 -1`` inside one reaches its own processes
  only, never another sandbox's, the container's ``sleep`` (a uid of its own) or its init. Process count:
  RLIMIT_NPROC counts processes per uid, so each sandbox gets its own ``max_processes`` budget.
* Killing "every process of the sandbox" is then ``kill -9 -1`` run as its uid: the kernel delivers it to all of that
  uid's processes at once, with forks locked out while it does, so nothing escapes it, whether the process left its
  process group with ``setsid``, double-forked, or was orphaned to the init. A process group kill (``setsid`` per
  call, ``kill -- -PGID``) would miss exactly those, and a marker searched for in ``/proc`` races with forks.

One call is two ``podman exec`` (about 0.1 s each): the program, under ``prlimit`` (cpu, as, fsize, nofile, nproc,
core) and ``timeout -s KILL`` (a back-stop should the host die mid-call), with its output read by
`envs.code.sandbox._process.run_bounded` (both streams read at once, ``output_bytes`` of each kept, the rest
drained and dropped) and the wall limit enforced there, on the host, by killing the ``podman exec`` client; then a
cleanup run as the same uid, which kills whatever that uid still runs (background processes, or the whole call when
it timed out: killing the client does not stop the program), repairs the folder if the agent removed or locked it,
and measures it (each file the larger of its length and its blocks; over ``workspace_bytes`` or
`envs.code.sandbox._workspace.MAX_ENTRIES` entries, it is emptied). The cleanup has to be a second exec: the program
runs as the same uid as anything that would wait for it inside the container, so it could kill such a waiter.

``/workspace`` (`WORKDIR`): the image makes ``/workspace`` a symlink to ``/proc/self/cwd`` and every call starts in
its sandbox's folder, so ``/workspace/x`` means that sandbox's ``x`` (``cat /workspace/x``, ``tar -C /workspace``,
``python3 /workspace/t.py``) as it does with bubblewrap, and the base class's file helpers work unchanged. Unlike
bubblewrap's bind mount it follows the process: after ``cd sub``, ``/workspace`` is ``sub``. ``$HOME`` and
``$WORKSPACE`` hold the folder's real path for scripts that change directory. ``$TMPDIR`` is a private folder beside
the workspace; ``/tmp`` is a tmpfs the sandboxes share (``umask 077``: their files are private unless a program makes
them readable), cleared of the sandbox's files at `reset`.

What the sandboxes of one container share, unlike bubblewrap's (one namespace set per call): the network namespace
(no interface but loopback: two sandboxes running at once could talk over 127.0.0.1 or abstract sockets), System V
IPC (what a sandbox made is removed with ``ipcrm -a`` as its uid after each call and at reset, so nothing of it
reaches its next call or the next episode; two sandboxes running at once could still meet there), ``/dev/shm``,
``/tmp``, and the container's ceilings on memory, processes and ``/ws`` space. One sandbox within its own limits can
reach those for as long as a call runs (32 processes of 512 MiB each pass the default 4 GiB); the kernel then kills
the largest process of the container, and every sandbox process carries the highest OOM score, so the container's
init and ``sleep`` (and with them the container) survive. Disk is no host risk here: workspaces live on the ``/ws``
tmpfs, capped at ``workspaces_mb`` of the container's memory, so a call writing past
`SandboxLimits.workspace_bytes` fills at most that tmpfs, for its neighbours only, until the cleanup after the call
empties its folder; the bwrap back-end's disk watchdog is not needed for the host's sake and is not run.

Episodes that must not see each other at all belong in different back-ends (containers) or in the bubblewrap back-end.
The cleanup runs as the sandbox's uid, so a program built to attack it could ptrace it (the container allows ptrace
between processes of one uid) in the instant before its ``kill``; what it would gain is a process outliving a call
inside its own sandbox (still bounded by its limits, and gone at reset's or close's kill unless attacked again, and at
the container's end).

Exit codes: ``podman exec`` reports a program killed by signal N as 128 + N, which this back-end returns as -N (the
`subprocess` convention); a program that itself exits with 129-192 reads as a signal.

Rootful podman only (the owner runs as root, as on the development machine): rootless podman maps too few uids for
the ones above. Build the image with ``docker/sandbox/build.sh`` (Debian bookworm from the Debian archive with
debootstrap, or ``--base IMAGE`` from any image with python3). Podman on a cgroups v1 host (like the development
machine) needs runc and ``--runtime runc --cgroup-manager cgroupfs``, and open-file / process limits within the host's
hard limits: the back-end adds both where ``/sys/fs/cgroup`` is not cgroup v2.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import shutil
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Mapping, Sequence

from ._calls import check_argv, check_env, check_limits, check_stdin, rlimits
from ._owners import start_time as _start_time
from ._process import run_bounded
from ._workspace import MAX_ENTRIES
from .base import ExecResult, Sandbox, SandboxBackend, SandboxError, SandboxLimits, SandboxUnavailable

__all__ = ["PodmanBackend", "PodmanSandbox", "DEFAULT_IMAGE", "LABEL"]

DEFAULT_IMAGE = "localhost/agentrl-sandbox:bookworm"
"""The image `docker/sandbox/build.sh` makes: Debian bookworm's python3 and coreutils, ``/workspace`` -> cwd."""
LABEL = "agentrl.sandbox"
"""Every container this back-end starts carries ``LABEL=1`` and ``LABEL.owner=<host>:<pid>:<process start time>``."""
INSTALL = "apt-get install -y --no-install-recommends podman runc uidmap fuse-overlayfs catatonit debootstrap"
"""What makes podman work on a Debian host like the development machine (catatonit is podman's ``--init``)."""
BUILD = "docker/sandbox/build.sh"
_ROOTLESS = ("the podman back-end needs rootful podman (run as root): rootless podman maps about 65,536 uids, and each "
             "sandbox runs as a uid of its own from 0x60000000 up; use the bwrap back-end instead")

_UID_BASE = 0x6000_0000
_PID_SPAN = 1 << 22
"""Linux's largest pid_max: every live process's pid is below it, so pid-derived uid blocks never overlap."""
_UID_BLOCK = 64
"""uids per process: the containers' own (the block's first) and one per live sandbox. 0x60000000 + 2**22 * 64 ends
where the bwrap back-end's uids begin (0x70000000), inside the range systemd leaves to containers."""
_uids_lock = threading.Lock()
_uids_used: set[int] = set()
_START_TIMEOUT_S = 120.0
"""A first ``podman run`` may set up storage; later ones take a fraction of a second."""
_EXEC_TIMEOUT_S = 60.0
"""A cleanup, reset or folder set-up exec: seconds of work at most (an ``rm -rf`` of a full workspace)."""
_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "TERM": "dumb"}

# Run as the sandbox's uid after every call. $1 the sandbox folder, $2 the byte limit, $3 the entry limit.
# `kill -9 -1` first: nothing of the sandbox runs while the folder is repaired and measured. `ipcrm -a` then removes
# the System V message queues, semaphores and shared memory this uid made (the others' are not its to remove), which
# the container's one IPC namespace would otherwise keep for the next call or episode.
_REPAIR = r"""
kill -9 -1 2>/dev/null
ipcrm -a 2>/dev/null
d=$1
cd / || exit 3
for p in "$d" "$d/work" "$d/tmp"; do
    if [ -L "$p" ] || [ ! -d "$p" ]; then rm -f -- "$p" && mkdir -m 700 -- "$p" || exit 3; fi
    chmod u+rwx -- "$p" || exit 3
done
"""
_CLEANUP = _REPAIR + r"""
measure() {
    find "$d" -xdev -mindepth 1 -printf '%s %b\n' |
        awk '{n++; b=$2*512; t+=($1>b?$1:b)} END {printf "%.0f %.0f\n", n, t}'  # no 1e+09 for the test below
}
stats=$(measure 2>/dev/null) && [ -n "$stats" ] || { chmod -R u+rwX -- "$d" 2>/dev/null; stats=$(measure); }
set -- $stats "$2" "$3"
if [ "$1" -gt "$4" ] || [ "$2" -gt "$3" ]; then
    chmod -R u+rwX -- "$d" 2>/dev/null
    rm -rf -- "$d/work" "$d/tmp" && mkdir -m 700 -- "$d/work" "$d/tmp" || exit 3
    echo "agentrl-cleanup overflow $1 $2"
else
    echo "agentrl-cleanup ok $1 $2"
fi
"""
# Run as the sandbox's uid at reset ($2 = "keep") and close ($2 = "remove").
_RESET = _REPAIR + r"""
chmod -R u+rwX -- "$d" 2>/dev/null
if [ "$2" = remove ]; then rm -rf -- "$d" || exit 3; else
    rm -rf -- "$d/work" "$d/tmp" && mkdir -m 700 -- "$d/work" "$d/tmp" || exit 3; fi
find /tmp /dev/shm -xdev -mindepth 1 -maxdepth 1 -user "$(id -u)" \
    -exec sh -c 'chmod -R u+rwX -- "$@" 2>/dev/null; rm -rf -- "$@"' sh {} + 2>/dev/null
echo agentrl-reset
"""


def podman_command(podman: str = "podman") -> list[str]:
    """The podman command with the global flags this host needs: runc and cgroupfs where cgroups are v1 or hybrid.

    crun (Debian's default runtime) fails on a hybrid cgroup hierarchy; runc works there.
    """
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):  # cgroup v2 unified: podman's defaults work
        return [podman]
    return [podman, "--runtime", "runc", "--cgroup-manager", "cgroupfs"]


def _ulimits() -> tuple[int, int]:
    """(open files, processes) hard limits for the container; calls lower them further with prlimit.

    podman's defaults ask for more than this host's hard limits allow, which fails on cgroups v1 hosts.
    """
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if nofile == resource.RLIM_INFINITY or nofile > 65_536:
        nofile = 65_536
    return nofile, 4096


def _podman(cmd: Sequence[str], what: str, timeout: float) -> subprocess.CompletedProcess[bytes]:
    """Run one podman command to completion within `timeout`; a hang becomes a `SandboxError` naming `what`."""
    try:
        return subprocess.run(list(cmd), stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise SandboxError(f"podman did not finish {what} within {timeout:.0f} s (is the podman service stuck? "
                           f"try `podman ps`)") from exc
    except OSError as exc:
        raise SandboxUnavailable(f"cannot run podman ({exc}): {INSTALL}") from exc


def _tail(data: bytes, n: int = 400) -> str:
    return data.decode("utf-8", "replace").strip()[-n:]


def _remove_container(podman: list[str], name: str, owner_pid: int) -> None:
    """``podman rm -f`` one container, quietly (also called from a finalizer at interpreter exit).

    Only in the process that started it: a forked child exiting must not take its parent's container.
    """
    if os.getpid() != owner_pid:
        return
    try:
        subprocess.run([*podman, "rm", "-f", "-t", "0", name], stdin=subprocess.DEVNULL, capture_output=True,
                       timeout=_EXEC_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        pass


def _take_uid(base: int) -> int:
    """A uid no live sandbox of this process has (in any of its containers), or a `SandboxError` past 63."""
    with _uids_lock:
        uid = next((u for u in range(base + 1, base + _UID_BLOCK) if u not in _uids_used), None)
        if uid is None:
            raise SandboxError(f"this process already has {_UID_BLOCK - 1} open podman sandboxes, one uid each: "
                               f"close some (a SandboxPool reuses released ones)")
        _uids_used.add(uid)
        return uid


def _give_uid(uid: int) -> None:
    """Free a sandbox's uid once none of its processes or files is left."""
    with _uids_lock:
        _uids_used.discard(uid)


def _retire(podman: list[str], name: str, owner_pid: int, uids: set[int]) -> None:
    """Remove a back-end's container, then free the uids of its sandboxes (nothing of them is left)."""
    _remove_container(podman, name, owner_pid)
    with _uids_lock:
        _uids_used.difference_update(uids)
        uids.clear()


class PodmanSandbox(Sandbox):
    """One sandbox of a `PodmanBackend`: the folder ``/ws/<id>`` in its container, run as a uid of its own.

    Its calls start in ``/ws/<id>/work`` (which ``/workspace`` points to, see the module docstring) with
    ``TMPDIR=/ws/<id>/tmp``. Not thread-safe, like every `Sandbox`: one episode uses it at a time.
    """

    backend = "podman"

    def __init__(self, owner: PodmanBackend, uid: int, folder: str, limits: SandboxLimits) -> None:
        self._owner = owner
        self.uid = uid
        """The uid (in the container and, podman running rootful, on the host) that every call of it runs as."""
        self.folder = folder
        """``/ws/<id>`` inside the container: ``work/`` (the workspace) and ``tmp/`` (its TMPDIR)."""
        self.limits = limits
        """What calls get when they pass no limits of their own."""
        self._closed = False

    @property
    def workdir(self) -> str:
        """The workspace's real path inside the container (``/workspace`` resolves to it at the start of a call)."""
        return f"{self.folder}/work"

    @property
    def host_path(self) -> str:
        """The workspace seen from the host, for tests and inspection (as the other back-ends' `host_path`).

        It goes through the container's root, ``/proc/<the container's pid>/root/ws/<id>/work``. Never read the
        agent's files through it: an absolute link there resolves on the host (use `read_file`,
        `export_tree`).
        """
        return f"/proc/{self._owner._pid}/root{self.workdir}"

    def run(self, argv: Sequence[str], *, stdin: bytes = b"", limits: SandboxLimits | None = None,
            env: Mapping[str, str] | None = None) -> ExecResult:
        """Run `argv` in the workspace under `limits`; see `Sandbox.run` and the module docstring for how."""
        self._check_open()
        limits = check_limits(self.limits if limits is None else limits)
        argv = check_argv(argv)
        variables = {**_ENV, "HOME": self.workdir, "WORKSPACE": self.workdir, "TMPDIR": f"{self.folder}/tmp",
                     **check_env(env)}
        stdin = check_stdin(stdin)
        prlimit = ["prlimit"] + [f"--{name.lower()}={soft}:{hard}"
                                 for name, soft, hard in self._owner._call_rlimits(limits)]
        cmd = [*self._owner._podman, "exec", "-i", "--user", f"{self.uid}:{self.uid}", "-w", self.workdir]
        for key, value in variables.items():
            cmd += ["--env", f"{key}={value}"]
        # umask 077 keeps what a call leaves in the shared /tmp and /dev/shm private to its uid. The highest OOM score
        # makes a sandbox's process, never the container's init or sleep, what the kernel kills when the container
        # runs out of memory (raising one's own score needs no privilege).
        wrapper = 'echo 1000 > /proc/self/oom_score_adj; umask 077 && exec "$@"'
        cmd += [self._owner._container_name(), "sh", "-c", wrapper, "sh", *prlimit, "--",
                "timeout", "-s", "KILL", f"{limits.wall_s + 2:g}", *argv]
        outcome = run_bounded(cmd, stdin=stdin, wall_s=limits.wall_s, output_bytes=limits.output_bytes,
                              env=os.environ)
        overflow, cleanup_s = self._cleanup(limits)
        code = outcome.returncode
        if code is not None and 128 < code <= 128 + 64:
            code = 128 - code  # podman exec's 128 + N for a program killed by signal N
        return ExecResult(exit_code=code, stdout=outcome.stdout, stderr=outcome.stderr,
                          seconds=outcome.seconds + cleanup_s, timed_out=outcome.timed_out,
                          output_truncated=outcome.truncated, workspace_overflow=overflow)

    def reset(self) -> None:
        """Kill every process of this sandbox, empty its workspace and TMPDIR, remove its files in /tmp and /dev/shm."""
        self._check_open()
        self._script(_RESET, "keep", what="reset")

    def close(self) -> None:
        """Kill every process of this sandbox and remove its folder; its uid is then free for a new sandbox."""
        if self._closed:
            return
        self._closed = True
        if self._owner._closed:
            return  # the container, and with it every process and file, is gone; its close freed the uid
        try:
            self._script(_RESET, "remove", what="close")
        except SandboxError:
            if self._owner._running():
                raise  # the uid stays taken: something of the sandbox may be left
        self._owner._forget(self.uid)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"podman sandbox {self.folder} is closed: acquire a new sandbox")

    def _cleanup(self, limits: SandboxLimits) -> tuple[bool, float]:
        """After a call: kill what it left, repair and measure the folder.

        Returns whether it was over the limit (and was emptied), and the seconds this took.
        """
        start = time.monotonic()
        out = self._script(_CLEANUP, str(limits.workspace_bytes), str(MAX_ENTRIES), what="clean up after a call")
        return out.split()[1] == "overflow", time.monotonic() - start

    def _script(self, script: str, *args: str, what: str) -> str:
        """Run one of the back-end's own scripts as this sandbox's uid; its last line, or a `SandboxError`."""
        cmd = [*self._owner._podman, "exec", "--user", f"{self.uid}:{self.uid}", self._owner._container_name(),
               "sh", "-c", script, "sh", self.folder, *args]
        done = _podman(cmd, f"the {what} of {self.folder}", _EXEC_TIMEOUT_S)
        lines = done.stdout.decode("utf-8", "replace").strip().splitlines()
        if done.returncode != 0 or not lines or not lines[-1].startswith("agentrl-"):
            self._owner._raise_if_gone()
            raise SandboxError(f"podman sandbox {self.folder}: the {what} failed (exit {done.returncode}): "
                               f"{_tail(done.stderr + done.stdout)}")
        return lines[-1]


class PodmanBackend(SandboxBackend):
    """Sandboxes as folders of one podman container, started at the first `create` and removed at `close`.

    Args:
        image: the sandbox image; `DEFAULT_IMAGE` is what ``docker/sandbox/build.sh`` makes. Any image with python3,
            coreutils, util-linux's prlimit and a ``/workspace -> /proc/self/cwd`` symlink works
            (``build.sh --base IMAGE`` adds the symlink).
        memory_mb: memory of the whole container (every sandbox's processes and every file in its tmpfs folders).
        pids_limit: processes and threads of the whole container.
        workspaces_mb: size of the tmpfs at ``/ws`` that holds every sandbox's folder.
        tmp_mb: size of the shared ``/tmp`` tmpfs.
        podman: the podman executable.
    """

    name = "podman"
    _probed: dict[str, str | None] = {}

    def __init__(self, image: str = DEFAULT_IMAGE, *, memory_mb: int = 4096, pids_limit: int = 1024,
                 workspaces_mb: int = 1024, tmp_mb: int = 256, podman: str = "podman") -> None:
        for label, value in (("memory_mb", memory_mb), ("pids_limit", pids_limit), ("workspaces_mb", workspaces_mb),
                             ("tmp_mb", tmp_mb)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"PodmanBackend({label}=...) must be a positive integer, got {value!r}")
        if not isinstance(image, str) or not image:
            raise ValueError(f"PodmanBackend(image=...) must name an image (default {DEFAULT_IMAGE}), got {image!r}")
        self.image = image
        self.memory_mb, self.pids_limit, self.workspaces_mb, self.tmp_mb = memory_mb, pids_limit, workspaces_mb, tmp_mb
        self._podman = podman_command(podman)
        self._nofile, self._nproc = _ulimits()
        self.uid_base = _UID_BASE + (os.getpid() % _PID_SPAN) * _UID_BLOCK
        """This process's block of uids (see the module docstring); the first runs the container's own processes."""
        self._lock = threading.Lock()
        self._name: str | None = None
        self._pid = 0
        self._closed = False
        self._finalizer: weakref.finalize | None = None
        self._uids: set[int] = set()
        """uids of this back-end's open sandboxes, freed with the container however it ends."""
        self.start_seconds: float | None = None
        """How long the container took to start (None until the first `create`)."""

    # ---- SandboxBackend --------------------------------------------------------------------------------------------

    @classmethod
    def unavailable_reason(cls, image: str | None = None) -> str | None:
        """None when podman can run `image` (default `DEFAULT_IMAGE`) here, locked down as the back-end runs it.

        Probes once per image and process: podman on PATH, runc where cgroups are v1, the image present, then
        ``podman run --rm`` of the image with the back-end's flags running ``true``.
        """
        image = image or DEFAULT_IMAGE
        if image not in cls._probed:
            cls._probed[image] = cls._probe(image)
        return cls._probed[image]

    @classmethod
    def _probe(cls, image: str) -> str | None:
        podman = podman_command()
        if shutil.which(podman[0]) is None:
            return f"podman is not installed: {INSTALL}"
        if os.geteuid() != 0:
            return _ROOTLESS
        if "runc" in podman and shutil.which("runc") is None:
            return f"this host has cgroups v1, where podman needs runc: {INSTALL}"
        try:
            exists = _podman([*podman, "image", "exists", image], "looking for the image", 30)
            if exists.returncode != 0:
                return f"podman has no image {image}: build it with {BUILD}" + (
                    "" if exists.returncode == 1 else f" ({_tail(exists.stderr)})")
            probe = cls(image)
            done = _podman([*probe._podman, "run", "--rm", *probe._run_flags(probe.uid_base), image, "true"],
                           "a probe container", _START_TIMEOUT_S)
        except SandboxError as exc:
            return str(exc)
        if done.returncode != 0:
            err = _tail(done.stderr)
            hint = f" ({INSTALL})" if "catatonit" in err or "init binary" in err else ""
            return f"podman cannot run {image} locked down (exit {done.returncode}): {err}{hint}"
        return None

    def create(self, limits: SandboxLimits) -> PodmanSandbox:
        """A new, empty sandbox (a folder and a uid in this back-end's container, started on first use)."""
        limits = check_limits(limits)
        with self._lock:
            if self._closed:
                raise SandboxError("this PodmanBackend is closed: make a new one")
            if self._name is None:
                self._start()
            uid = _take_uid(self.uid_base)
            self._uids.add(uid)
        folder = f"/ws/{secrets.token_hex(8)}"
        setup = "umask 077 && mkdir -m 700 -- \"$1\" \"$1/work\" \"$1/tmp\" && echo agentrl-created"
        done = _podman([*self._podman, "exec", "--user", f"{uid}:{uid}", self._container_name(), "sh", "-c", setup,
                        "sh", folder], "making a sandbox folder", _EXEC_TIMEOUT_S)
        if done.returncode != 0 or b"agentrl-created" not in done.stdout:
            self._forget(uid)
            self._raise_if_gone()
            raise SandboxError(f"could not make the sandbox folder {folder} in container {self._name} "
                               f"(exit {done.returncode}): {_tail(done.stderr)}")
        return PodmanSandbox(self, uid, folder, limits)

    def close(self) -> None:
        """Remove the container (``podman rm -f``): every sandbox's processes and files go with it. Idempotent."""
        with self._lock:
            self._closed = True
            if self._finalizer is not None:
                self._finalizer()  # runs _retire once; at interpreter exit (or when collected) it runs by itself

    # ---- the container -----------------------------------------------------------------------------------------------

    @property
    def container(self) -> str | None:
        """The container's name, None before the first `create`."""
        return self._name

    @classmethod
    def remove_leftovers(cls, podman: str = "podman") -> list[str]:
        """Remove containers of this back-end whose owner process on this host is gone; return their names.

        A run killed with SIGKILL (or a machine that lost power) cannot remove its container; the next back-end to
        start here does. Containers of live owners, and of other hosts sharing the storage, are left alone.
        """
        cmd = podman_command(podman)
        done = _podman([*cmd, "ps", "-a", "--filter", f"label={LABEL}=1", "--format", "json"],
                       "listing leftover containers", _EXEC_TIMEOUT_S)
        if done.returncode != 0:
            raise SandboxError(f"podman ps failed (exit {done.returncode}): {_tail(done.stderr)}")
        removed = []
        for entry in json.loads(done.stdout or b"[]"):
            owner = (entry.get("Labels") or {}).get(f"{LABEL}.owner", "")
            host, _, rest = owner.partition(":")
            pid, _, started = rest.partition(":")
            if host != socket.gethostname() or not pid.isdigit():
                continue
            if _start_time(int(pid)) == started:
                continue  # its owner still runs
            name = (entry.get("Names") or [entry.get("Id", "")])[0]
            _remove_container(cmd, name, os.getpid())
            removed.append(name)
        return removed

    def _run_flags(self, uid: int) -> list[str]:
        """``podman run`` flags of the locked-down container (the probe uses them too)."""
        return ["--network", "none", "--read-only", "--read-only-tmpfs=false",
                "--tmpfs", f"/ws:rw,size={self.workspaces_mb}m,mode=1733,nosuid,nodev",
                "--tmpfs", f"/tmp:rw,size={self.tmp_mb}m,mode=1777,nosuid,nodev",
                "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                "--security-opt", "proc-opts=hidepid=2",
                "--pids-limit", str(self.pids_limit), "--memory", f"{self.memory_mb}m",
                "--memory-swap", f"{self.memory_mb}m",
                "--ulimit", f"nofile={self._nofile}:{self._nofile}", "--ulimit", f"nproc={self._nproc}:{self._nproc}",
                "--user", f"{uid}:{uid}", "--init", "--hostname", "sandbox", "--pull", "never"]

    def _start(self) -> None:
        """Start the container (lock held).

        Reaps leftovers, checks the image, ``podman run -d``, checks the image's ``/workspace`` symlink.
        """
        reason = self._probe_cheap()
        if reason:
            raise SandboxUnavailable(reason)
        self.remove_leftovers(self._podman[0])
        owner = f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"
        name = f"agentrl-sandbox-{os.getpid()}-{secrets.token_hex(4)}"
        start = time.monotonic()
        done = _podman([*self._podman, "run", "-d", "--rm", "--name", name, "--label", f"{LABEL}=1",
                        "--label", f"{LABEL}.owner={owner}", *self._run_flags(self.uid_base), self.image,
                        "sleep", "infinity"], "starting the sandbox container", _START_TIMEOUT_S)
        if done.returncode != 0:
            _remove_container(self._podman, name, os.getpid())
            err = _tail(done.stderr)
            hint = f" ({INSTALL})" if "catatonit" in err or "init binary" in err else ""
            raise SandboxUnavailable(f"podman could not start {self.image} (exit {done.returncode}): {err}{hint}")
        self._name = name
        self._finalizer = weakref.finalize(self, _retire, list(self._podman), name, os.getpid(), self._uids)
        pid = _podman([*self._podman, "container", "inspect", "--format", "{{.State.Pid}}", name],
                      "inspecting the container", _EXEC_TIMEOUT_S).stdout.strip()
        self._pid = int(pid) if pid.isdigit() else 0
        check = _podman([*self._podman, "exec", name, "readlink", "/workspace"], "checking the image",
                        _EXEC_TIMEOUT_S)
        if check.stdout.strip() != b"/proc/self/cwd":
            self._finalizer()
            self._name = None
            raise SandboxUnavailable(f"image {self.image} lacks the /workspace -> /proc/self/cwd symlink the podman "
                                     f"back-end relies on: build it with {BUILD} (--base {self.image} adds it)")
        self.start_seconds = time.monotonic() - start

    def _probe_cheap(self) -> str | None:
        if shutil.which(self._podman[0]) is None:
            return f"podman is not installed: {INSTALL}"
        if os.geteuid() != 0:
            return _ROOTLESS
        exists = _podman([*self._podman, "image", "exists", self.image], "looking for the image", 30)
        if exists.returncode != 0:
            return f"podman has no image {self.image}: build it with {BUILD}"
        return None

    def _container_name(self) -> str:
        if self._name is None or self._closed:
            raise SandboxError("the podman back-end is closed: its sandboxes are gone")
        return self._name

    def _running(self) -> bool:
        if self._name is None or self._closed:
            return False
        done = _podman([*self._podman, "container", "inspect", "--format", "{{.State.Running}}", self._name],
                       "inspecting the container", _EXEC_TIMEOUT_S)
        return done.returncode == 0 and done.stdout.strip() == b"true"

    def _forget(self, uid: int) -> None:
        """A sandbox's uid back, its processes and files gone."""
        with self._lock:
            self._uids.discard(uid)
        _give_uid(uid)

    def _raise_if_gone(self) -> None:
        if self._closed:
            raise SandboxError("the podman back-end is closed: its sandboxes are gone")
        if not self._running():
            raise SandboxError(f"the sandbox container {self._name} is gone (removed, or its memory limit of "
                               f"{self.memory_mb} MiB killed it): make a new PodmanBackend")

    def _call_rlimits(self, limits: SandboxLimits) -> list[tuple[str, int, int]]:
        """The call's rlimits, lowered to what the container grants (prlimit cannot raise a hard limit)."""
        ceilings = {"NOFILE": self._nofile, "NPROC": self._nproc}
        out = []
        for name, soft, hard in rlimits(limits, nproc=limits.max_processes):
            hard = min(hard, ceilings.get(name, hard))
            out.append((name, min(soft, hard), hard))
        return out
