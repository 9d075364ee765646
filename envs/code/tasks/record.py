"""`CodeTask`: one programming task as data.

What the agent is told, what its workspace starts with, the hidden tests that grade it, and the reference solution
the expert plays.

Two kinds of hidden test, by how much a hostile solution could forge them:

* `IOCase` (function tasks: the procedural generator, MBPP-style data with plain inputs and outputs): the grader calls
  the entry point in a fresh sandbox and compares the returned value with the expected one *on the host*. The expected
  values never enter a sandbox, so no code the agent writes can fake a pass without computing the answers.
* `ScriptTest` (HumanEval ``check(candidate)``, MBPP asserts, Harbor / terminal-bench test scripts): a program run in
  a fresh sandbox next to the agent's files; it passes when it exits 0 and echoes the per-grading nonce it reads from
  stdin. Its files are unpacked in the grading call's private ``/tmp``, and Python runs isolated (``python3 -I``,
  ``HOME=/tmp``), so nothing in the workspace (a ``conftest.py``, a user site, a planted grader file) configures it.
  For function tasks (HumanEval, MBPP) the solution cannot forge it either: the test program that holds the nonce
  never runs solution code, it calls the solution in a child process through proxies that pass literal values only
  (`envs/code/tasks/loaders.py`). A Harbor / terminal-bench test script runs the agent's programs by nature (that is
  what it tests), so it is only as hard to forge as the task's own script makes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["IOCase", "ScriptTest", "CodeTask", "SOLUTION_FILE"]

SOLUTION_FILE = "solution.py"
"""Where a function task's solution lives in the workspace (the instruction says so)."""


def _frozen(mapping: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class IOCase:
    """Call the entry point with `args` (JSON values) and expect `expected` (JSON; ints exact, floats to 1e-6 relative).

    The grader compares with `envs.code.grading.values_match`.
    """

    args: tuple[Any, ...]
    expected: Any


@dataclass(frozen=True)
class ScriptTest:
    """A hidden test program: `files` unpacked in the grading call's private folder, `argv` run in `WORKDIR`.

    The files never enter the workspace; an `argv` item equal to one of their paths is replaced by that file's path in
    the private folder (``$AGENTRL_TEST_DIR``). Passes when it exits 0 and its stdout holds the nonce it was given on
    stdin's first line.
    """

    name: str
    argv: tuple[str, ...]
    files: Mapping[str, str] = field(default_factory=dict)
    wall_s: float = 30.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", _frozen(self.files))


@dataclass(frozen=True)
class CodeTask:
    """One task. Exactly one of `cases` (function task) or `scripts` (script-graded task) is non-empty."""

    task_id: str
    """Stable id: ``procedural/<family>/<split>/<12 hex digits>``, ``humaneval/HumanEval/0``, ``harbor/...``."""
    instruction: str
    """What the agent reads first (after the env's tool instructions)."""
    family: str
    """A category for breakdowns (`info["task_type"]`): the generator's family, or the source's name."""
    difficulty: int = 1
    """1 (one loop or formula) to 5 (several steps, edge cases); loaders set what the source says, else 1."""
    files: Mapping[str, str] = field(default_factory=dict)
    """The workspace at the start (relative path -> text)."""
    entry_point: str = ""
    """For function tasks: the function `SOLUTION_FILE` must define."""
    cases: tuple[IOCase, ...] = ()
    scripts: tuple[ScriptTest, ...] = ()
    solution_files: Mapping[str, str] = field(default_factory=dict)
    """The reference solution the expert writes (relative path -> text)."""
    solution_commands: tuple[str, ...] = ()
    """Shell commands the expert runs after writing `solution_files` (terminal tasks), in order."""
    source: str = "procedural"

    def __post_init__(self) -> None:
        for name in ("files", "solution_files"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))
        if bool(self.cases) == bool(self.scripts):
            raise ValueError(f"task {self.task_id!r}: give hidden tests as either cases (function task) or scripts, "
                             f"exactly one of them")
        if self.cases and not self.entry_point:
            raise ValueError(f"task {self.task_id!r}: a function task (cases) needs entry_point")

    @property
    def n_tests(self) -> int:
        """How many hidden tests grade the task."""
        return len(self.cases) or len(self.scripts)
