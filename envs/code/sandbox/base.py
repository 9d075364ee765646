"""The sandbox contract: one episode's isolated workspace, and the back-ends and pool that provide them.

A `Sandbox` is a private writable workspace plus a way to run a program over it under `SandboxLimits`: no network,
no view of the host's files beyond a read-only system (``/usr``), CPU time, wall time, memory, process count, file
size and output size bounded, every process it started gone when the call returns. Each call is its own process tree
(state between calls lives only in the workspace's files), so a call that hangs, forks or floods is killed alone and
the next call starts clean.

File access goes through the sandbox too (`read_file`, `write_file`, `export_tree`, `import_tree` run a program
inside it), never through host paths: a workspace may hold symlinks the agent made to ``/etc/shadow`` or to the
repository, and only a process inside the sandbox resolves them harmlessly.

Back-ends (`SandboxBackend`): ``bwrap`` (bubblewrap namespaces, the default where it works), ``podman`` (one container
per worker, many workspaces in it) and ``subprocess`` (no isolation at all: refused unless the user opts in with
``unsafe_subprocess=True``). `SandboxPool` keeps warm sandboxes so an episode does not pay a start, and reaps what is
left at close.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

__all__ = ["SandboxLimits", "ExecResult", "Sandbox", "SandboxBackend", "SandboxError", "SandboxUnavailable",
           "WorkspaceTooLarge", "WORKDIR"]

WORKDIR = "/workspace"
"""Where the workspace appears inside a sandbox, and the working directory of every call."""


class SandboxError(RuntimeError):
    """A sandbox that failed as infrastructure (could not start, died, lost its workspace).

    An env error, never a wrong answer. The message says what failed and how to fix it.
    """


class WorkspaceTooLarge(SandboxError):
    """`Sandbox.export_tree` could not fit the workspace in the output room given: the agent's doing, not a failure."""


class SandboxUnavailable(SandboxError):
    """A back-end that cannot run on this machine (bubblewrap missing, user namespaces off, podman absent).

    The message names the package or setting that fixes it.
    """


@dataclass(frozen=True)
class SandboxLimits:
    """What one call may use. The defaults fit the built-in tasks with room to spare on a laptop."""

    wall_s: float = 10.0
    """Wall-clock seconds before the whole process tree is killed (`ExecResult.timed_out`)."""
    cpu_s: int = 10
    """CPU seconds per process (RLIMIT_CPU): a busy loop dies here even if the wall limit is generous."""
    memory_mb: int = 512
    """Address space per process, MiB (RLIMIT_AS): a memory bomb gets MemoryError / ENOMEM."""
    max_processes: int = 32
    """Processes and threads the call may have at once (its own user namespace's RLIMIT_NPROC): a fork bomb stops."""
    output_bytes: int = 16_384
    """Bytes of stdout and of stderr kept each; the rest is read and dropped (`ExecResult.output_truncated`)."""
    file_bytes: int = 8 * 1024 * 1024
    """Largest file a process may write (RLIMIT_FSIZE)."""
    workspace_bytes: int = 64 * 1024 * 1024
    """The whole workspace after a call; over it, the call reports an error and the workspace is emptied."""
    open_files: int = 256
    """Open file descriptors per process (RLIMIT_NOFILE)."""


@dataclass(frozen=True)
class ExecResult:
    """What one call did. Output is raw bytes, cut at `SandboxLimits.output_bytes` per stream."""

    exit_code: int | None
    """The program's exit status; negative for a signal (as `subprocess` reports it); None when killed at a limit."""
    stdout: bytes
    stderr: bytes
    seconds: float
    """Wall time of the call, sandbox start included."""
    timed_out: bool = False
    """Killed at `SandboxLimits.wall_s`."""
    output_truncated: bool = False
    """stdout or stderr was longer than `SandboxLimits.output_bytes` and was cut."""
    workspace_overflow: bool = False
    """The workspace grew past `SandboxLimits.workspace_bytes` and was emptied."""

    @property
    def ok(self) -> bool:
        """Exited with status 0 inside its limits."""
        return self.exit_code == 0 and not self.timed_out

    def text(self, stream: str = "stdout") -> str:
        """One stream decoded as UTF-8, undecodable bytes replaced."""
        return (self.stdout if stream == "stdout" else self.stderr).decode("utf-8", "replace")


class Sandbox(ABC):
    """One isolated workspace. Not thread-safe: one episode uses it at a time."""

    backend: ClassVar[str] = ""

    @abstractmethod
    def run(self, argv: Sequence[str], *, stdin: bytes = b"", limits: SandboxLimits | None = None,
            env: Mapping[str, str] | None = None) -> ExecResult:
        """Run `argv` inside the sandbox, in `WORKDIR`, with `stdin`; every process it starts is gone on return.

        `argv[0]` is looked up on the sandbox's own PATH (``/usr/bin:/bin``: ``python3``, ``sh``, coreutils). `env`
        adds variables to a clean environment (nothing of the host's leaks in). Never raises for what the program
        does (crash, timeout, flood): that is in the result. Raises `SandboxError` when the sandbox itself failed.
        """

    @abstractmethod
    def reset(self) -> None:
        """Empty the workspace and kill anything left running, so the next episode starts clean."""

    @abstractmethod
    def close(self) -> None:
        """Kill everything and remove the workspace. Idempotent."""

    # ---- files, through the sandbox (never through host paths: see the module docstring) -------------------------

    def write_file(self, path: str, data: bytes, limits: SandboxLimits | None = None) -> ExecResult:
        """Write `data` to `path` (relative to `WORKDIR`, parent folders made) from inside the sandbox."""
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        return self.run(["sh", "-c", script, "sh", path], stdin=data, limits=limits)

    def read_file(self, path: str, limits: SandboxLimits | None = None) -> ExecResult:
        """`cat` of `path` from inside the sandbox (cut at the output limit like any call)."""
        return self.run(["cat", "--", path], limits=limits)

    def export_tree(self, limits: SandboxLimits | None = None) -> bytes:
        """The whole workspace as an uncompressed tar (symlinks kept as links), for grading in a fresh sandbox.

        Raises `WorkspaceTooLarge` when the tar is over the output limit given, `SandboxError` when tar failed.
        """
        result = self.run(["tar", "-C", WORKDIR, "-cf", "-", "."], limits=limits)
        if result.output_truncated:
            raise WorkspaceTooLarge(f"the workspace is larger than {(limits or SandboxLimits()).output_bytes} bytes as "
                                    f"a tar")
        if not result.ok:
            raise SandboxError(f"could not export the workspace (exit {result.exit_code}, "
                               f"truncated={result.output_truncated}): {result.text('stderr')[-300:]}")
        return result.stdout

    def import_tree(self, tar: bytes, limits: SandboxLimits | None = None) -> ExecResult:
        """Unpack a tar made by `export_tree` into the workspace, from inside the sandbox."""
        return self.run(["tar", "-C", WORKDIR, "-xf", "-"], stdin=tar, limits=limits)


class SandboxBackend(ABC):
    """Makes sandboxes of one kind. One per runner process; `close` reaps every sandbox it made."""

    name: ClassVar[str] = ""

    @classmethod
    @abstractmethod
    def unavailable_reason(cls) -> str | None:
        """None when this back-end works on this machine, else why not and how to fix it.

        Probed by running a tiny program; the reason names the package to install or the setting to change.
        """

    @abstractmethod
    def create(self, limits: SandboxLimits) -> Sandbox:
        """A new, empty sandbox whose calls default to `limits` (a cold start)."""

    @abstractmethod
    def close(self) -> None:
        """Kill and remove every sandbox this back-end made. Idempotent; also run at interpreter exit."""
