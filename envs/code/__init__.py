"""Sandboxed code environment (`code`): programming tasks solved with tool calls, graded by hidden tests.

`CodeEnv` is registered as env id ``code``. Each episode runs its tool calls (Python, shell, file reads and writes)
in its own sandbox (`envs.code.sandbox`: bubblewrap by default, podman, or an opt-in unprotected subprocess), and
`submit` grades the workspace in a fresh sandbox with tests the agent never sees (`envs.code.grading`). Tasks come
from a procedural generator with graded difficulty (`envs.code.tasks`), HumanEval/MBPP-style JSONL, or Harbor and
terminal-bench task folders.
"""

from .env import CodeEnv, CodeTaskSet

__all__ = ["CodeEnv", "CodeTaskSet"]
