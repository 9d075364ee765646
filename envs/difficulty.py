"""`Difficulty`: what "difficulty" means for one env, declared by the env, read by curricula.

An env that has a natural difficulty (math's procedural levels, ALFWorld's task types, the code env's levels) sets
the class attribute `TextEnv.difficulty_levels` to a `Difficulty`: its level names, easiest first, and one line saying
what a level is. A curriculum (`agentrl.curriculum`) then asks for a task at a level through the reset seed
alone, so nothing else changes on the way: runner pools, Ray actors and trajectories carry plain integer seeds as
always.

How a seed asks for a level: seeds below `LEVEL_STRIDE` ask for none (the env plays them as it always did, so a run
without a curriculum, or with the uniform one, plays exactly what it played before); ``(k + 1) * LEVEL_STRIDE + seed``
asks for task `seed` at level index `k`. The env's `reset` reads it back with `Difficulty.split`::

    level, _ = self.difficulty_levels.split(seed)   # None for a plain seed
    super().reset(seed=seed)                        # the whole seed seeds np_random: level k's task `seed`
    ... draw the task at `level` (or at the env's own setting when level is None) ...

Why the seed and not a constructor argument or a reset option: a level is chosen per task, while an env is built once
per runner with fixed arguments, and reset options do not travel through the runner pools. The stride (10^12) is far
above any seed a run reaches (``seed_offset + step * prompts_per_step + i``), and a tagged seed reads at a glance in
trajectories.jsonl: 3000000000042 is task 42 at the third level.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Difficulty", "LEVEL_STRIDE"]

LEVEL_STRIDE = 10**12
"""Seeds at or above it carry a level: ``(k + 1) * LEVEL_STRIDE + seed`` is task `seed` at level index `k`."""


@dataclass(frozen=True)
class Difficulty:
    """An env's difficulty levels, easiest first, and how a reset seed asks for one of them.

    Attributes:
        levels: the level names, easiest first (math: ``"1"`` to ``"5"``; ALFWorld: its task types).
        meaning: one line saying what a level is for this env (shown in messages and docs).
    """

    levels: tuple[str, ...]
    meaning: str

    def __post_init__(self) -> None:
        if not self.levels or len(set(self.levels)) != len(self.levels):
            raise ValueError(f"Difficulty needs distinct level names, easiest first; got {self.levels!r}")

    def index(self, level: str) -> int:
        """The position of `level`, 0 for the easiest.

        Raises:
            ValueError: `level` is not one of `levels` (the message lists them).
        """
        if level not in self.levels:
            raise ValueError(f"unknown level {level!r}; the levels are {', '.join(self.levels)}")
        return self.levels.index(level)

    def only(self, names: Sequence[str]) -> Difficulty:
        """These levels alone, still easiest first, with the same meaning.

        What a run plays when its env arguments allow only some of them (`agentrl.envs.core.TextEnv.difficulty_for`):
        a seed's level index then counts within them.

        Raises:
            ValueError: a name that is not a level, or no name at all.
        """
        unknown = [n for n in names if n not in self.levels]
        if unknown or not names:
            raise ValueError(f"unknown level(s) {unknown or 'none given'}; the levels are {', '.join(self.levels)}")
        return Difficulty(tuple(level for level in self.levels if level in names), self.meaning)

    def task_seed(self, seed: int, level: int) -> int:
        """The reset seed that plays task `seed` at level index `level` (0 = the easiest).

        Raises:
            ValueError: `seed` outside ``[0, LEVEL_STRIDE)`` or `level` outside the levels.
        """
        if not 0 <= seed < LEVEL_STRIDE:
            raise ValueError(f"a task seed must be in [0, {LEVEL_STRIDE}) to carry a level, got {seed}")
        if not 0 <= level < len(self.levels):
            raise ValueError(f"level index {level} is outside 0..{len(self.levels) - 1} ({', '.join(self.levels)})")
        return (level + 1) * LEVEL_STRIDE + seed

    def split(self, seed: int | None) -> tuple[str | None, int | None]:
        """The level a reset seed asks for (None for a plain seed) and its task seed.

        Raises:
            ValueError: the seed carries a level index this env does not have.
        """
        if seed is None or seed < LEVEL_STRIDE:
            return None, seed
        tag, task = divmod(seed, LEVEL_STRIDE)
        if tag > len(self.levels):
            raise ValueError(f"seed {seed} asks for level index {tag - 1}, but the levels are "
                             f"{', '.join(self.levels)} (indices 0..{len(self.levels) - 1})")
        return self.levels[tag - 1], task
