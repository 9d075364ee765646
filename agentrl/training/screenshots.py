"""GUI screenshots of a few episodes per step, saved for `agentrl view` as ``RUN/screenshots/ep{N}_turn{T}.png``.

The viewer names an episode by its position in trajectories.jsonl (N, from 0) and shows the file of turn T (from 0)
under that turn's observation, so each file holds the screen after the turn's action. Which episodes carry images is
decided by the rollout before they start (`agentrl.rollout.loop.run_rollout`'s ``screenshots``): only those episodes'
runners encode PNGs and send them to the driver; this module only writes what came back.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agentrl.records import Trajectory

__all__ = ["SCREENSHOTS", "screenshot_name", "episodes_in", "save_screenshots"]

SCREENSHOTS = "screenshots"
"""The run folder's screenshot subfolder."""

# Lines counted so far per trajectories.jsonl: (its inode, bytes read, lines in them). The file only grows during a
# run, so each step reads just what the last step appended instead of the whole file (gigabytes in a long GUI run).
_COUNTED: dict[Path, tuple[int, int, int]] = {}


def screenshot_name(episode: int, turn: int) -> str:
    """The file name the viewer looks for: episode `episode` of trajectories.jsonl, turn `turn` (both from 0)."""
    return f"ep{episode}_turn{turn}.png"


def episodes_in(path: Path) -> int:
    """Episodes already in trajectories.jsonl at `path` (its lines; 0 when it does not exist).

    The count resumes from where the previous call stopped; a file that was replaced or shrank (a new run in the
    folder) is counted again from its start.
    """
    path = Path(path).resolve()
    try:
        stat = path.stat()
    except FileNotFoundError:
        _COUNTED.pop(path, None)
        return 0
    inode, offset, lines = _COUNTED.get(path, (stat.st_ino, 0, 0))
    if inode != stat.st_ino or stat.st_size < offset:
        offset, lines = 0, 0
    with open(path, "rb") as f:
        f.seek(offset)
        while chunk := f.read(1 << 20):
            lines += chunk.count(b"\n")
        offset = f.tell()
    _COUNTED[path] = (stat.st_ino, offset, lines)
    return lines


def save_screenshots(trajectories: Sequence[Trajectory], first_episode: int, out: Path, limit: int) -> list[Path]:
    """Write the turn screenshots of at most `limit` episodes under ``out/screenshots``.

    Args:
        trajectories: the step's trajectories, in the order they were appended to trajectories.jsonl.
        first_episode: how many episodes trajectories.jsonl held before them (`episodes_in`, read before appending).
        out: the run folder.
        limit: episodes at most (async rollouts can hand one step the marked episodes of two rollouts).

    Returns:
        The files written, in order.
    """
    written: list[Path] = []
    episodes = 0
    for i, trajectory in enumerate(trajectories):
        if episodes >= limit:
            break
        shots = [(t, turn.screenshot) for t, turn in enumerate(trajectory.turns) if turn.screenshot]
        if not shots:
            continue
        episodes += 1
        folder = Path(out) / SCREENSHOTS
        folder.mkdir(exist_ok=True)
        for t, png in shots:
            path = folder / screenshot_name(first_episode + i, t)
            path.write_bytes(png)
            written.append(path)
    return written
