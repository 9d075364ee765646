"""Measuring and emptying a workspace folder from the host, never following a link the agent made.

A workspace may hold symlinks to ``/etc/shadow``, to the repository or to ``/``; a host walk that followed one would
count (or delete!) host files. Both functions here work from directory descriptors: every entry is examined with
``lstat`` semantics relative to its parent's descriptor, every directory is opened with ``O_NOFOLLOW`` relative to
its parent, and only plain names are used, so no path is ever resolved through a link and no path grows past
``PATH_MAX`` however deep the agent nested its folders.

They run between calls, when every process of the sandbox is gone (each call's process tree dies with it), so
nothing can swap an entry for a link between the check and the use.

Two bounds keep a hostile tree cheap to handle: a walk deeper than `MAX_DEPTH` or with more than `MAX_ENTRIES`
entries counts as over the workspace limit (no honest task builds such a tree in one episode), and emptying moves
directories found deeper than `MAX_DEPTH` up to the top before removing them, so it never holds more than
`MAX_DEPTH` descriptors open.
"""

from __future__ import annotations

import errno
import itertools
import os
import stat

from .base import SandboxError

__all__ = ["MAX_DEPTH", "MAX_ENTRIES", "workspace_exceeds", "empty_folder", "remove_folder", "remove_own_folder"]

MAX_DEPTH = 128
"""Nesting below the workspace that a walk follows; deeper counts as over the limit (emptying still copes)."""
MAX_ENTRIES = 200_000
"""Entries (files, folders, links) a workspace may hold before it counts as over the limit whatever their size."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_moved = itertools.count()


def _open_dir(parent_fd: int | None, name: str) -> int:
    """Open a directory known (by lstat, nothing running) to be a real one, restoring our rights if the agent took them.

    Taking them matters only when the host runs as the sandbox's own uid: root ignores the mode.
    """
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except PermissionError:
        os.chmod(name, 0o700, dir_fd=parent_fd)
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)


def workspace_exceeds(folder: str, max_bytes: int) -> bool:
    """Whether `folder` holds more than `max_bytes` (or a tree past `MAX_DEPTH` / `MAX_ENTRIES`).

    A file counts the larger of its length and its allocated blocks (sparse files cannot hide, preallocated ones
    cannot either); a symlink counts itself, never its target. Stops as soon as the answer is known.
    """
    total = 0
    entries = 0
    root = _open_dir(None, folder)
    stack: list[tuple[int, list[str]]] = [(root, os.listdir(root))]
    try:
        while stack:
            fd, names = stack[-1]
            if not names:
                os.close(fd)
                stack.pop()
                continue
            name = names.pop()
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            entries += 1
            total += max(st.st_size, st.st_blocks * 512)
            if total > max_bytes or entries > MAX_ENTRIES:
                return True
            if stat.S_ISDIR(st.st_mode):
                if len(stack) > MAX_DEPTH:
                    return True
                child = _open_dir(fd, name)
                stack.append((child, os.listdir(child)))
        return False
    finally:
        for fd, _ in stack:
            os.close(fd)


def empty_folder(folder: str) -> None:
    """Remove everything inside `folder` (links removed as links, their targets untouched); keep `folder` itself.

    Raises:
        SandboxError: the folder could not be emptied (a file system error, not the agent's doing).
    """
    try:
        root = _open_dir(None, folder)
    except OSError as exc:
        raise SandboxError(f"could not open the workspace {folder} to empty it: {exc}") from exc
    try:
        for _ in range(10_000):  # each pass removes at least a MAX_DEPTH slice of the deepest chain
            names = os.listdir(root)
            if not names:
                return
            for name in names:
                _remove_entry(root, name)
        raise SandboxError(f"could not empty the workspace {folder}: entries keep reappearing")
    except OSError as exc:
        raise SandboxError(f"could not empty the workspace {folder}: {exc}") from exc
    finally:
        os.close(root)


def _remove_entry(root: int, top: str) -> None:
    """Remove one entry of the workspace root, iteratively, holding at most MAX_DEPTH descriptors.

    Directories nested past MAX_DEPTH are moved up to the root instead; the caller's next pass removes them.
    """
    st = os.stat(top, dir_fd=root, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(top, dir_fd=root)
        return
    os.chmod(top, 0o700, dir_fd=root)  # a real directory (lstat above): unlinking inside needs write and search
    # Each frame: (parent fd, name in parent, own fd, names still to remove).
    stack: list[tuple[int, str, int, list[str]]] = []
    fd = _open_dir(root, top)
    stack.append((root, top, fd, os.listdir(fd)))
    try:
        while stack:
            parent, name, fd, names = stack[-1]
            if not names:
                os.close(fd)
                stack.pop()
                try:
                    os.rmdir(name, dir_fd=parent)
                except OSError as exc:
                    if exc.errno != errno.ENOTEMPTY:  # readdir missed an entry: the next pass gets it
                        raise
                continue
            child = names.pop()
            try:
                st = os.stat(child, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(child, dir_fd=fd)
            elif len(stack) >= MAX_DEPTH:
                os.rename(child, f".agentrl-deep-{os.getpid()}-{next(_moved)}", src_dir_fd=fd, dst_dir_fd=root)
            else:
                os.chmod(child, 0o700, dir_fd=fd)
                child_fd = _open_dir(fd, child)
                stack.append((fd, child, child_fd, os.listdir(child_fd)))
    finally:
        for _, _, fd, _ in stack:
            os.close(fd)


def remove_folder(folder: str) -> None:
    """Empty `folder` and remove it; a folder already gone is fine."""
    if not os.path.lexists(folder):
        return
    empty_folder(folder)
    os.rmdir(folder)


def remove_own_folder(folder: str, creator: int) -> None:
    """`remove_folder`, unless this is not process `creator` (a forked child exiting must not remove its parent's)."""
    if os.getpid() == creator:
        remove_folder(folder)
