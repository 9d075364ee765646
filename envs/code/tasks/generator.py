"""Seeded procedural programming tasks: `generate_task(rng, split=..., difficulty=..., family=...)`.

Each task asks for one Python function in ``solution.py``. A family (`FAMILIES`, defined in
`envs.code.tasks.families`) draws the function's definition at a difficulty level (`LEVELS`, 1 to 5): its constants,
its name, the hidden inputs (edge cases included) and the examples; this module runs the family's reference solution
on the host to get the expected values, writes the instruction, and packs a `CodeTask` whose hidden tests are
`IOCase`s and whose `solution_files` are the reference solution (what the expert writes).

Train / test split: a task belongs to the test split when the SHA-256 of (family, level, `FunctionSpec.key`) falls in
a fixed fifth of the hash range, and to train otherwise. The key holds the constants that define the task (a divisor,
a window size, a bracket pair...), never the function's name or its inputs, so the test split's tasks are problems
the train split never asks, not renamed copies. The generator redraws until it hits the requested split. Every family
and level has enough distinct keys for both splits (the tests check each one).

Determinism: all randomness comes from the `numpy.random.Generator` given (or the integer seed), so a seed always
gives the same task; task ids are ``procedural/<family>/<split>/<12 hex digits of the task's hash>``, equal for equal
tasks.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from typing import Any

import numpy as np

from .families import FAMILY_SPECS, FunctionSpec
from .record import SOLUTION_FILE, CodeTask, IOCase

__all__ = ["FAMILIES", "LEVELS", "SPLITS", "generate_task", "split_of", "task_from_spec"]

FAMILIES = FAMILY_SPECS
"""Family name -> ``(rng, level) -> FunctionSpec`` (see `envs.code.tasks.families`)."""
LEVELS = (1, 2, 3, 4, 5)
"""Difficulty levels, 1 (one loop or formula) to 5 (several steps, careful edge cases, dynamic programming)."""
SPLITS = ("train", "test")
_TEST_BUCKETS = 2  # out of 10: a fifth of each family-level's keys are test tasks
_MAX_REDRAWS = 2000


def generate_task(rng: np.random.Generator | int, *, split: str = "train", difficulty: int | None = None,
                  family: str | None = None) -> CodeTask:
    """Draw one function-writing task.

    Args:
        rng: a NumPy generator (all randomness is drawn from it) or an integer seed.
        split: ``"train"`` or ``"test"`` (disjoint task definitions, see the module docstring).
        difficulty: a level in `LEVELS`, or None to draw one uniformly.
        family: a name in `FAMILIES`, or None to draw one uniformly.

    Returns:
        A `CodeTask` with 5-10 hidden `IOCase`s, ``entry_point`` the function's name, and the reference solution in
        ``solution_files["solution.py"]``.

    Raises:
        ValueError: an unknown split, level or family (the message lists the valid ones).
    """
    if split not in SPLITS:
        raise ValueError(f"code task split must be one of {SPLITS}, got {split!r}")
    if difficulty is not None and difficulty not in LEVELS:
        raise ValueError(f"code task difficulty must be one of {LEVELS} or None, got {difficulty!r}")
    if family is not None and family not in FAMILIES:
        raise ValueError(f"unknown code task family {family!r}; choose one of {sorted(FAMILIES)} or None")
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(rng)
    names = tuple(FAMILIES)
    family = family if family is not None else names[int(rng.integers(len(names)))]
    level = difficulty if difficulty is not None else LEVELS[int(rng.integers(len(LEVELS)))]
    for _ in range(_MAX_REDRAWS):
        spec = FAMILIES[family](rng, level)
        if split_of(family, level, spec.key) == split:
            return task_from_spec(spec, family=family, level=level, split=split)
    raise RuntimeError(f"no {split} task of family {family!r} level {level} in {_MAX_REDRAWS} draws (a family with "
                       f"too few distinct keys: give it more constants)")


def split_of(family: str, level: int, key: tuple[Any, ...]) -> str:
    """The split (``"train"`` or ``"test"``) of a task definition, from a hash of its family, level and key."""
    digest = hashlib.sha256(repr((family, level, key)).encode()).digest()
    return "test" if int.from_bytes(digest[:4], "big") % 10 < _TEST_BUCKETS else "train"


def task_from_spec(spec: FunctionSpec, *, family: str, level: int, split: str) -> CodeTask:
    """Run the spec's reference solution on its inputs and pack the `CodeTask` (instruction, cases, solution).

    Raises:
        RuntimeError: the reference solution failed or returned something that is not a JSON value (a bug in the
            family, never the agent's doing).
    """
    function = _reference(spec.source, spec.name)
    cases = tuple(IOCase(args=_json_args(spec, args), expected=_run(function, spec, args)) for args in spec.inputs)
    shown = [f"    {spec.name}({', '.join(repr(a) for a in args)}) returns {_run(function, spec, args)!r}"
             for args in spec.examples]
    parts = [f"Write a Python function `{spec.name}({spec.params})` in the file `{SOLUTION_FILE}`.", "", spec.summary,
             "", "Example" + ("s:" if len(shown) > 1 else ":"), *shown, ""]
    if spec.note:
        parts += [spec.note, ""]
    parts.append(f"Return the result (do not print it). Hidden tests call `{spec.name}` on other inputs, edge cases "
                 "included.")
    instruction = "\n".join(parts)
    digest = hashlib.sha256(json.dumps([family, level, instruction, [[list(c.args), c.expected] for c in cases]],
                                       sort_keys=True).encode()).hexdigest()[:12]
    return CodeTask(task_id=f"procedural/{family}/{split}/{digest}", instruction=instruction, family=family,
                    difficulty=level, entry_point=spec.name, cases=cases,
                    solution_files={SOLUTION_FILE: spec.source}, source="procedural")


@functools.lru_cache(maxsize=512)
def _compiled(source: str) -> Any:
    return compile(source, "<reference solution>", "exec")


def _reference(source: str, name: str) -> Any:
    namespace: dict[str, Any] = {"__name__": "solution"}
    exec(_compiled(source), namespace)  # our own reference source, never the agent's
    return namespace[name]


def _run(function: Any, spec: FunctionSpec, args: tuple[Any, ...]) -> Any:
    try:
        value = function(*json.loads(json.dumps(list(args))))  # a fresh copy: references may mutate arguments
        text = json.dumps(value, allow_nan=False)
    except Exception as error:
        raise RuntimeError(f"reference solution of {spec.name!r} failed on {args!r}: {error!r}") from error
    if isinstance(value, float) and not math.isfinite(value):
        raise RuntimeError(f"reference solution of {spec.name!r} returned {value!r}")
    return json.loads(text)


def _json_args(spec: FunctionSpec, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The arguments as the runner will see them; refuses what JSON would change (tuples, non-string keys)."""
    if not all(_plain(a) for a in args):
        raise RuntimeError(f"family bug: the arguments of {spec.name!r} are not plain JSON values: {args!r}")
    return tuple(args)


def _plain(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False
