"""`CodeEnv`: programming tasks solved with tool calls in a per-episode sandbox, graded by hidden tests.

An episode:

    obs, info = env.reset(seed=3)          # the task; info["tools"] declares run_python, run_shell, write_file,
                                           # read_file and submit as JSON schemas
    obs, r, term, trunc, info = env.step('{"name": "write_file", "arguments": {"path": "solution.py", ...}}')
    obs, r, term, trunc, info = env.step('{"name": "run_python", "arguments": {"code": "import solution; ..."}}')
    obs, r, term, trunc, info = env.step('{"name": "submit", "arguments": {}}')   # r = hidden tests passed / total

Every tool call runs in the episode's own sandbox (`envs.code.sandbox`): no network, only its workspace writable,
CPU, wall time, memory, processes, file size and output bounded, all its processes gone when the call returns.
Observations are the tools' outputs (exit code, stdout, stderr), cut at `observation_chars` with a marker saying how
much was left out. `submit` exports the workspace and grades it in a *fresh* sandbox with the hidden tests, which
never enter the agent's workspace (`envs.code.grading`). Reaching `max_turns` without a submit grades the workspace
as it is and ends the episode as truncated.

Rewards: ``reward="fraction"`` (default) pays the fraction of hidden tests passed on the grading step, ``"all_pass"``
pays 1 only when all pass; every other step pays 0. ``info["success"]`` is all tests passing.

Sandboxes come from a per-process pool shared by every `CodeEnv` of the process (one per runner actor): an episode
takes a warm sandbox instead of starting one, and gives it back emptied. A sandbox that fails as infrastructure
raises `SandboxError` from `step`/`reset`: the runner pool reports it as an env error and plays the episode again,
like any env failure, never as a wrong answer.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Mapping
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, ClassVar

import gymnasium as gym

from agentrl.envs.core import ClientSetting, Difficulty, SharedResource, TextEnv

from .grading import TestOutcome, TestReport, grade
from .sandbox import Sandbox, SandboxError, SandboxLimits, SandboxPool, WorkspaceTooLarge, make_backend
from .tasks import FAMILIES, LEVELS, CodeTask, generate_task, load_harbor_tasks, load_jsonl_tasks
from .tools import TOOLS, ToolCall, ToolCallError, parse_action, tool_call_json, tool_call_text

__all__ = ["CodeEnv", "CodeTaskSet", "SPLITS", "REWARDS", "EXPERT_FORMATS"]

SPLITS = ("train", "test")
REWARDS = ("fraction", "all_pass")
EXPERT_FORMATS = ("tool_call", "text")
BACKENDS = ("auto", "bwrap", "podman", "subprocess")
_GRADE_WALL_S = 60.0  # grading runs every hidden test in one call or a few: more than a tool call


class CodeTaskSet(SharedResource):
    """The tasks of a HumanEval/MBPP JSONL file or a folder of Harbor / terminal-bench tasks, loaded once per node."""

    def __init__(self, tasks: list[CodeTask], path: Path):
        if not tasks:
            raise ValueError(f"{path}: no tasks found (a .jsonl file of HumanEval/MBPP rows, or a folder of Harbor "
                             f"or terminal-bench task folders)")
        self.tasks = tuple(tasks)
        self.path = path

    @classmethod
    def build(cls, **env_kwargs: Any) -> CodeTaskSet | None:
        """Load ``source``; None for procedural tasks, which need no shared state."""
        source = env_kwargs.get("source", "procedural")
        if source == "procedural":
            return None
        path = Path(source)
        if path.is_dir():
            return cls(load_harbor_tasks(path), path)
        if path.is_file():
            return cls(load_jsonl_tasks(path), path)
        raise FileNotFoundError(f"CodeEnv source {str(source)!r}: no such file or folder (give 'procedural', a .jsonl "
                                f"of HumanEval/MBPP rows, or a folder of Harbor / terminal-bench tasks)")


# ---- one sandbox pool per process and back-end ---------------------------------------------------------------------

_POOLS: dict[tuple[Any, ...], SandboxPool] = {}
_IDLE_SANDBOXES = 16  # emptied sandboxes kept per process; live ones (one per episode in flight) come on top
_POOLS_LOCK = threading.Lock()


def _pool(backend: str, unsafe_subprocess: bool, limits: SandboxLimits, options: Mapping[str, Any]) -> SandboxPool:
    # Options are plain values from a config (an image name, sizes): their repr tells equal settings apart.
    key = (backend, unsafe_subprocess, limits, repr(sorted(options.items())), os.getpid())
    with _POOLS_LOCK:
        if key not in _POOLS:
            made = make_backend(backend, unsafe_subprocess=unsafe_subprocess, **dict(options))
            _POOLS[key] = SandboxPool(made, limits, size=_IDLE_SANDBOXES)
        return _POOLS[key]


@atexit.register
def _close_pools() -> None:
    with _POOLS_LOCK:
        for pool in _POOLS.values():
            pool.close()
        _POOLS.clear()


def _limits(value: SandboxLimits | Mapping[str, Any] | None) -> SandboxLimits:
    if value is None:
        return SandboxLimits()
    if isinstance(value, SandboxLimits):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"CodeEnv limits must be a mapping of SandboxLimits fields, got {type(value).__name__}")
    known = set(asdict(SandboxLimits()))
    unknown = sorted(set(value) - known)
    if unknown:
        raise ValueError(f"CodeEnv limits: unknown field(s) {unknown}; the fields are {sorted(known)}")
    return SandboxLimits(**value)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[-tail:]}"


class CodeEnv(TextEnv):
    """Programming tasks solved by calling tools (Python, shell, files) in a sandbox; reward = hidden tests passed.

    Tasks: ``source="procedural"`` draws from the generator's families (`envs.code.tasks.FAMILIES`) at
    ``difficulty`` 1-5 (None: a level drawn per task) with disjoint ``train`` / ``test`` splits; a ``.jsonl`` path
    loads HumanEval- or MBPP-style rows; a folder loads Harbor or terminal-bench task folders. With a file or folder,
    ``reset(seed=s)`` plays task ``s % len(tasks)`` (seed None: a uniform draw). A seed that asks for a level
    (`difficulty_levels`, from a curriculum) draws a procedural task of that level, whatever ``difficulty`` says;
    files and folders state no levels, so such a seed is refused there.

    ``info`` on reset: ``tools`` (the declarations), ``task_type`` (the family), ``task_id``, ``difficulty``,
    ``n_tests``. On each step: ``tool`` (the call made, "" for an unparseable reply), ``exit_code``, ``timed_out``.
    On the grading step: ``tests_passed``, ``tests_total``, ``test_details`` (name, passed, short detail per test,
    for logs: a detail may quote an expected value, so details never go into an observation) and ``success``.

    Args:
        source: ``"procedural"``, a ``.jsonl`` file, or a folder of task folders (see above).
        difficulty: procedural level 1-5, or None for a level drawn per task.
        family: one procedural family (a name in `FAMILIES`), or None for all.
        split: ``"train"`` or ``"test"`` (procedural; a file is its own split).
        max_turns: tool calls per episode; the last one grades the workspace if the agent has not submitted.
        reward: ``"fraction"`` of hidden tests passed, or ``"all_pass"`` (1 or 0).
        observation_chars: the most characters of a tool's output shown; the middle is cut with a marker.
        expert_format: how `expert_action` writes its calls: ``"tool_call"`` (function-call JSON, for families
            whose templates declare tools) or ``"text"`` (the plain-text forms, for templates without tools).
        backend: ``"auto"`` (bubblewrap where it works), ``"bwrap"``, ``"podman"`` or ``"subprocess"``.
        unsafe_subprocess: allow ``backend="subprocess"``, which runs the agent's code on the host with resource
            limits but NO isolation (host files and network visible). An operator's decision; off by default.
        limits: per-call limits, a `SandboxLimits` or a mapping of its fields (``{"wall_s": 5, "memory_mb": 256}``).
        backend_options: keyword arguments for the back-end (podman: ``{"image": ...}``).
        shared: a prebuilt `CodeTaskSet` for ``source`` (runner pools pass one per node).
    """

    system_prompt: ClassVar[str] = (
        "You are a programming agent working in a sandboxed workspace. Solve the task by calling tools, one per "
        "reply: run_python(code) and run_shell(command) run code and show its output, write_file(path, content) and "
        "read_file(path) edit files, submit() ends the episode and the hidden tests grade your work. Without function "
        "calling, write a ```python``` block to run Python, a ```bash``` block to run a command, 'write_file PATH' "
        "followed by a ``` block to write a file, or 'submit'."
    )
    shared: ClassVar[type[SharedResource] | None] = CodeTaskSet
    rollout_defaults: ClassVar[dict[str, Any]] = {"observation_role": "tool"}
    difficulty_levels: ClassVar[Difficulty | None] = Difficulty(
        tuple(str(n) for n in LEVELS), "the procedural generator's level, 1 to 5 (files and folders have none)")
    # Data only: the back-end, its options, the limits and the task source (a path the server would read) stay
    # with the operator; a client cannot loosen the sandbox or point it at files.
    client_settings: ClassVar[Mapping[str, ClientSetting]] = {
        "split": ClientSetting(str, "procedural task set: train or test", choices=SPLITS),
        "difficulty": ClientSetting(int, "procedural difficulty, 1 to 5", choices=LEVELS),
        "family": ClientSetting(str, "one procedural task family", choices=tuple(sorted(FAMILIES))),
        "max_turns": ClientSetting(int, "tool calls per episode", min=1, max=50),
        "reward": ClientSetting(str, "fraction of hidden tests passed, or all_pass (1/0)", choices=REWARDS),
        "observation_chars": ClientSetting(int, "characters of tool output shown", min=200, max=20_000),
        "expert_format": ClientSetting(str, "how the expert writes calls: tool_call or text", choices=EXPERT_FORMATS),
    }

    def __init__(self, source: str | os.PathLike[str] = "procedural", difficulty: int | None = 1,
                 family: str | None = None, split: str = "train", max_turns: int = 8, reward: str = "fraction",
                 observation_chars: int = 2000, expert_format: str = "tool_call", backend: str = "auto",
                 unsafe_subprocess: bool = False, limits: SandboxLimits | Mapping[str, Any] | None = None,
                 backend_options: Mapping[str, Any] | None = None, shared: CodeTaskSet | None = None):
        if difficulty is not None and difficulty not in LEVELS:
            raise ValueError(f"CodeEnv difficulty must be one of {LEVELS} or None, got {difficulty!r}")
        if family is not None and family not in FAMILIES:
            raise ValueError(f"CodeEnv family must be one of {sorted(FAMILIES)} or None, got {family!r}")
        if split not in SPLITS:
            raise ValueError(f"CodeEnv split must be one of {SPLITS}, got {split!r}")
        if not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1:
            raise ValueError(f"CodeEnv max_turns must be a positive integer, got {max_turns!r}")
        if reward not in REWARDS:
            raise ValueError(f"CodeEnv reward must be one of {REWARDS}, got {reward!r}")
        if not isinstance(observation_chars, int) or observation_chars < 200:
            raise ValueError(f"CodeEnv observation_chars must be an integer >= 200, got {observation_chars!r}")
        if expert_format not in EXPERT_FORMATS:
            raise ValueError(f"CodeEnv expert_format must be one of {EXPERT_FORMATS}, got {expert_format!r}")
        if backend not in BACKENDS:
            raise ValueError(f"CodeEnv backend must be one of {BACKENDS}, got {backend!r}")
        self.source = source if source == "procedural" else os.fspath(source)
        self.difficulty, self.family, self.split = difficulty, family, split
        self.max_turns = self.max_episode_steps = max_turns
        self.reward_mode, self.observation_chars, self.expert_format = reward, observation_chars, expert_format
        self.limits = _limits(limits)
        # Grading reads the whole workspace back as a tar (headers and padding on top of the files' bytes), and the
        # tests' results: room for a full workspace, never the cause of a failed grade.
        self.grade_limits = replace(self.limits, wall_s=max(self.limits.wall_s, _GRADE_WALL_S),
                                    output_bytes=max(self.limits.output_bytes, 2 * self.limits.workspace_bytes + 2**20))
        if backend_options is not None and not isinstance(backend_options, Mapping):
            raise ValueError(f"CodeEnv backend_options must be a mapping of the back-end's keyword arguments, got "
                             f"{type(backend_options).__name__}")
        self._pool = _pool(backend, bool(unsafe_subprocess), self.limits, dict(backend_options or {}))
        self.backend = self._pool.backend.name
        if self.source == "procedural":
            self._task_set = None
        else:
            self._task_set = shared if shared is not None else CodeTaskSet.build(source=self.source)
        self.shared_state = self._task_set
        self._sandbox: Sandbox | None = None
        self._task: CodeTask | None = None
        self._turn = 0
        self._done = True
        self._expert_plan: list[str] = []
        self._expert_next = 0

    # ---- episode ---------------------------------------------------------------------------------------------------

    @property
    def task(self) -> CodeTask:
        """The current task (after `reset`)."""
        if self._task is None:
            raise RuntimeError("CodeEnv: call reset() before using the env")
        return self._task

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Pick a task (deterministically from `seed`), give the episode an empty sandbox with the task's files."""
        gym.Env.reset(self, seed=seed, options=options)
        level, _ = self.difficulty_levels.split(seed)
        if self._task_set is None:
            difficulty = self.difficulty if level is None else int(level)
            task = generate_task(self.np_random, split=self.split, difficulty=difficulty, family=self.family)
        elif level is not None:
            raise ValueError(f"seed {seed} asks for difficulty level {level}, but the tasks of {self.source} state no "
                             f"levels: a difficulty curriculum needs source='procedural'")
        else:
            tasks = self._task_set.tasks
            task = tasks[seed % len(tasks) if seed is not None else int(self.np_random.integers(len(tasks)))]
        self._release()
        self._task, self._turn, self._done = task, 0, False
        self._sandbox = self._pool.acquire()
        for path, text in task.files.items():
            result = self._sandbox.write_file(path, text.encode())
            if result.workspace_overflow:
                raise ValueError(f"task {task.task_id}: its files are larger than the workspace limit "
                                 f"({self.limits.workspace_bytes} bytes); raise limits.workspace_bytes")
            if not result.ok:
                raise SandboxError(f"could not write the task file {path!r} into the sandbox: {result.text('stderr')}")
        self._expert_plan = self._plan(task)
        self._expert_next = 0
        info = {"tools": [dict(t) for t in TOOLS], "task_type": task.family, "task_id": task.task_id,
                "difficulty": task.difficulty, "n_tests": task.n_tests}
        return task.instruction, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Run one tool call; `submit` (or the last turn) grades the workspace in a fresh sandbox."""
        if self._done or self._sandbox is None:
            raise RuntimeError("CodeEnv: the episode is over; call reset()")
        self._turn += 1
        if self._expert_next < len(self._expert_plan) and action == self._expert_plan[self._expert_next]:
            self._expert_next += 1
        info: dict[str, Any] = {"tool": "", "exit_code": None, "timed_out": False}
        try:
            call = parse_action(action)
        except ToolCallError as e:
            obs = f"Error: {e}"
        else:
            info["tool"] = call.name
            if call.name == "submit":
                return self._finish(info, truncated=False)
            obs = self._run_tool(call, info)
        if self._turn >= self.max_turns:
            obs_end, reward, terminated, truncated, info = self._finish(info, truncated=True)
            return f"{obs}\n\n{obs_end}", reward, terminated, truncated, info
        return obs, 0.0, False, False, info

    def _run_tool(self, call: ToolCall, info: dict[str, Any]) -> str:
        sandbox = self._sandbox
        assert sandbox is not None
        args = call.arguments
        if call.name == "run_python":
            result = sandbox.run(["python3", "-c", args["code"]])
        elif call.name == "run_shell":
            result = sandbox.run(["sh", "-c", args["command"]])
        elif call.name == "write_file":
            result = sandbox.write_file(args["path"], args["content"].encode())
        else:  # read_file
            result = sandbox.read_file(args["path"])
        info["exit_code"], info["timed_out"] = result.exit_code, result.timed_out
        if call.name == "write_file" and result.ok and not result.workspace_overflow:
            return f"Wrote {len(args['content'])} characters to {args['path']}."
        if call.name == "read_file" and result.ok:
            text = result.text()
            return _cut(text, self.observation_chars) + ("\n[output truncated]" if result.output_truncated else "")
        return self._describe(result)

    def _describe(self, result) -> str:
        if result.timed_out:
            status = f"killed: over the {self.limits.wall_s:g} s time limit"
        elif result.exit_code is None:
            status = "killed at a resource limit"
        elif result.exit_code < 0:
            status = f"killed by signal {-result.exit_code}"
        else:
            status = f"exit code {result.exit_code}"
        parts = [status]
        half = self.observation_chars // 2
        for name in ("stdout", "stderr"):
            text = result.text(name)
            if text:
                parts.append(f"{name}:\n{_cut(text, half)}")
        if result.output_truncated:
            parts.append(f"[output truncated at {self.limits.output_bytes} bytes per stream]")
        if result.workspace_overflow:
            parts.append(f"[the workspace grew past {self.limits.workspace_bytes} bytes and was emptied]")
        return "\n".join(parts)

    def _finish(self, info: dict[str, Any], truncated: bool) -> tuple[str, float, bool, bool, dict[str, Any]]:
        report = self.grade_workspace(end_episode=True)
        self._done = True
        reward = report.fraction if self.reward_mode == "fraction" else float(report.all_passed)
        info.update(tests_passed=report.passed, tests_total=report.total, success=report.all_passed,
                    test_details=[(t.name, t.passed, t.detail) for t in report.tests])
        lead = "Out of turns: graded the workspace as it is." if truncated else "Submitted."
        obs = f"{lead} Hidden tests passed: {report.passed}/{report.total}."
        return obs, float(reward), not truncated, truncated, info

    def grade_workspace(self, end_episode: bool = False) -> TestReport:
        """Grade the current workspace with the hidden tests, in a fresh sandbox.

        Args:
            end_episode: give the episode's sandbox back (emptied) once its workspace is exported, before grading,
                so an episode never holds two sandboxes (podman gives each live sandbox a uid of its own, from a
                block of 63 per process). Otherwise the episode goes on.
        """
        assert self._sandbox is not None and self._task is not None
        try:
            tar = self._sandbox.export_tree(self.grade_limits)
        except WorkspaceTooLarge as e:  # the agent's doing (a workspace of many tiny files): a failed grade
            detail = f"the workspace is too large to grade ({e})"
            tar = None
        if end_episode:
            self._release()
        if tar is None:
            return TestReport(tuple(TestOutcome(f"test {i + 1}", False, detail) for i in range(self._task.n_tests)))
        fresh = self._pool.acquire()
        try:
            return grade(self._task, tar, fresh, limits=self.grade_limits)
        finally:
            self._pool.release(fresh)

    # ---- expert ----------------------------------------------------------------------------------------------------

    def _plan(self, task: CodeTask) -> list[str]:
        call = tool_call_json if self.expert_format == "tool_call" else tool_call_text
        plan = [call("write_file", path=p, content=c) for p, c in task.solution_files.items()]
        plan += [call("run_shell", command=c) for c in task.solution_commands]
        return plan + [call("submit")]

    def expert_action(self) -> str:
        """The reference solution, one call at a time: write its files, run its commands, submit.

        A step that departs from the plan does not move it on, so after a detour the expert repeats the call it
        was at (writing a file again is harmless); its last call is always ``submit``.
        """
        self.task  # noqa: B018 - raises before reset
        return self._expert_plan[min(self._expert_next, len(self._expert_plan) - 1)]

    # ---- lifecycle -------------------------------------------------------------------------------------------------

    def _release(self) -> None:
        if self._sandbox is not None:
            sandbox, self._sandbox = self._sandbox, None
            self._pool.release(sandbox)

    def close(self) -> None:
        """Give the episode's sandbox back to the pool (emptied)."""
        self._release()
        super().close()

