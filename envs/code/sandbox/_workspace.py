"""Measuring and emptying a workspace folder from the host, never following a link the agent made.

A workspace may hold symlinks to ``/etc/shadow``, to the repository or to ``/``; a host walk that followed one would
count (or delete!) host files. Both functions here work from directory descriptors: every entry is examined with
``lstat`` semantics relative to its parent's descriptor, every directory is opened with ``O_NOFOLLOW`` relative to
its parent, and only plain names are used, so no path is ever resolved through a link and no path grows past
``PATH_MAX`` however deep the agent nested its folders.

Emptying runs between calls, when every process of the sandbox is gone (each call's process tree dies with it), so
nothing can swap an entry for a link between the check and the use. Measuring also runs during a call (the back-ends'
disk watchdog, ``live=True``): then entries may vanish or turn into links or files under the walk, which skips them
(never follows them), and never changes a mode.

Modes: a folder the agent locked (mode 000) is opened again by restoring the owner's rights, and only when this
process is not root (root needs no rights to open or unlink). The restore goes through an ``O_PATH | O_NOFOLLOW |
O_DIRECTORY`` descriptor of the folder itself (``chmod /proc/self/fd/N``), never ``chmod(name)``, which would follow
a link put in the folder's place.

Disk during a call: a call writes at disk speed (about 600 MB/s on the development machine, in files each under
`SandboxLimits.file_bytes`). The watchdog measures every 75 ms (less often when a walk itself is slow: the pause
is at least twice the walk), so a call can pass `SandboxLimits.workspace_bytes` by about its write rate times
(pause + walk + kill), some 50-100 MB here, before it is killed and its workspace emptied; plus whatever several
sandboxes write at once. `require_free_space` refuses to start a back-end on a disk with less than
`FREE_SPACE_FACTOR` times `workspace_bytes` free.

Two bounds keep a hostile tree cheap to handle: a walk deeper than `MAX_DEPTH` or with more than `MAX_ENTRIES`
entries counts as over the workspace limit (no honest task builds such a tree in one episode), and emptying moves
directories found deeper than `MAX_DEPTH` up to the top before removing them, so it never holds more than
`MAX_DEPTH` descriptors open.
"""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import stat

from ._owners import owner_alive, parse_tag
from .base import SandboxError, SandboxUnavailable

__all__ = ["MAX_DEPTH", "MAX_ENTRIES", "FREE_SPACE_FACTOR", "workspace_exceeds", "empty_folder", "remove_folder",
           "remove_own_folder", "require_free_space", "reap_dead_roots"]

MAX_DEPTH = 128
"""Nesting below the workspace that a walk follows; deeper counts as over the limit (emptying still copes)."""
MAX_ENTRIES = 200_000
"""Entries (files, folders, links) a workspace may hold before it counts as over the limit whatever their size."""

FREE_SPACE_FACTOR = 4
"""A back-end refuses to start where less than this many times `SandboxLimits.workspace_bytes` is free."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_moved = itertools.count()


def _let_in(parent_fd: int | None, name: str) -> None:
    """Give the owner rwx on directory `name` again, through a descriptor of it (a link there fails, unfollowed).

    Nothing to do as root: root opens and unlinks whatever the mode.
    """
    if os.geteuid() == 0:
        return
    fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    try:
        os.chmod(f"/proc/self/fd/{fd}", 0o700)  # the magic link names this very directory, whatever `name` is now
    finally:
        os.close(fd)


def _open_dir(parent_fd: int | None, name: str, *, repair: bool = True) -> int:
    """Open a real directory (never a link), restoring our rights first if the agent took them and `repair`.

    Taking them matters only when the host runs as the sandbox's own uid: root ignores the mode.
    """
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except PermissionError:
        if not repair:
            raise
        _let_in(parent_fd, name)
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)


def workspace_exceeds(folder: str, max_bytes: int, *, live: bool = False) -> bool:
    """Whether `folder` holds more than `max_bytes` (or a tree past `MAX_DEPTH` / `MAX_ENTRIES`).

    A file counts the larger of its length and its allocated blocks (sparse files cannot hide, preallocated ones
    cannot either); a symlink counts itself, never its target. Stops as soon as the answer is known.

    `live`: the sandbox is running (the watchdog). Entries that vanish, turn into links or files, or are locked
    under the walk are skipped, and no mode is changed; the check after the call sees them.
    """
    total = 0
    entries = 0
    root = _open_dir(None, folder, repair=not live)
    try:
        stack: list[tuple[int, list[str]]] = [(root, os.listdir(root))]
    except OSError:
        os.close(root)
        raise
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
                try:
                    child = _open_dir(fd, name, repair=not live)
                except OSError:
                    if not live:
                        raise
                    continue  # gone, locked, or swapped for a link or a file since the lstat
                try:
                    names = os.listdir(child)
                except OSError:
                    os.close(child)
                    if not live:
                        raise
                    continue
                stack.append((child, names))
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
    _let_in(root, top)  # unlinking inside needs write and search (not as root)
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
                _let_in(fd, child)
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


def require_free_space(folder: str, workspace_bytes: int, backend: str) -> None:
    """Refuse (`SandboxUnavailable`) when `folder`'s file system has less than `FREE_SPACE_FACTOR` workspaces free.

    The disk watchdog stops a call only after it passed its limit (see the module docstring): the floor leaves room
    for that overshoot without filling the host's disk.
    """
    free = shutil.disk_usage(folder).free
    floor = FREE_SPACE_FACTOR * workspace_bytes
    if free < floor:
        raise SandboxUnavailable(
            f"the {backend} back-end keeps workspaces under {folder}, which has {free / 2**20:.0f} MiB free, below "
            f"the floor of {FREE_SPACE_FACTOR} x SandboxLimits.workspace_bytes = {floor / 2**20:.0f} MiB: free space "
            f"there, point TMPDIR at a larger disk, or lower SandboxLimits.workspace_bytes")


def reap_dead_roots(parent: str, prefix: str) -> list[str]:
    """Remove the folders ``<parent>/<prefix><pid>-<start>-...`` whose owner process is gone; return their paths.

    Only real folders owned by this uid are touched (a shared ``/tmp`` may hold other users' look-alikes, or links);
    folders whose names carry no owner, or whose owner still runs, stay. Removal never follows a link inside.
    """
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        tag = parse_tag(name[len(prefix):]) if name.startswith(prefix) else None
        if tag is None or owner_alive(*tag):
            continue
        path = os.path.join(parent, name)
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                continue
            remove_folder(path)
        except (OSError, SandboxError):
            continue  # another runner reaping the same folder, or a file system error: the next start tries again
        removed.append(path)
    return removed
