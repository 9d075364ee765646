"""The code env's tasks: the `CodeTask` record, the procedural generator, and the dataset loaders.

Public names: `CodeTask`, `IOCase`, `ScriptTest`, `SOLUTION_FILE` (the record, `envs.code.tasks.record`);
`generate_task`, `FAMILIES`, `LEVELS`, `SPLITS`, `split_of` (seeded procedural function tasks in five difficulty
levels, `envs.code.tasks.generator`); `load_jsonl_tasks` (HumanEval- and MBPP-style JSONL), `load_harbor_task` and
`load_harbor_tasks` (Harbor and terminal-bench task folders), and `TaskFileError` (what a malformed file raises),
from `envs.code.tasks.loaders`.
"""

from .generator import FAMILIES, LEVELS, SPLITS, generate_task, split_of
from .loaders import TaskFileError, load_harbor_task, load_harbor_tasks, load_jsonl_tasks
from .record import SOLUTION_FILE, CodeTask, IOCase, ScriptTest

__all__ = [
    "FAMILIES",
    "LEVELS",
    "SOLUTION_FILE",
    "SPLITS",
    "CodeTask",
    "IOCase",
    "ScriptTest",
    "TaskFileError",
    "generate_task",
    "load_harbor_task",
    "load_harbor_tasks",
    "load_jsonl_tasks",
    "split_of",
]
