"""Hidden-test grading: run a task's hidden tests on the agent's workspace in a FRESH sandbox.

`grade(task, workspace_tar, sandbox)` returns a `TestReport`; the reward is its `fraction`.

How the two kinds of hidden test (`envs/code/tasks/record.py`) are run:

Nothing the grader runs lives in the workspace, and nothing in the workspace configures it. Every grading call
unpacks its own programs and test files (a tar on stdin) into a private folder under the call's ``/tmp`` (a fresh
tmpfs per call under bubblewrap, private to the sandbox under podman) and runs them from there with ``python3 -I``
(no user site, no ``PYTHON*`` variables, neither the workspace nor the script's folder on ``sys.path``), with
``HOME=/tmp`` and ``PYTHONNOUSERSITE=1``: a ``usercustomize.py`` under the workspace's ``.local/``, a
``sitecustomize.py``, ``conftest.py`` or ``pytest.ini`` left in the workspace is never read. Only the solution's own
folder is put on ``sys.path``, explicitly, by the code that imports ``solution.py``.

How the two kinds of hidden test (`envs/code/tasks/record.py`) are run:

* `IOCase`: a small runner is started once with every case's arguments (JSON) on stdin. It imports ``solution.py``,
  calls the entry point on each case under a per-case bound of CPU time (``ITIMER_PROF``, and an RLIMIT_CPU soft
  limit for C code that never returns to the interpreter) with a generous wall-clock backstop (`CASE_WALL_FACTOR`
  times as long, for a case that sleeps), and prints the JSON of each returned value, or the exception, on a line
  tagged with a random token. CPU time, not wall time, decides a case, so a loaded host does not change rewards.
  While the solution runs, its own stdout (and its children's) goes to stderr, so nothing it prints lands among the
  results. The HOST compares the values with the expected ones, which never enter the sandbox: no code in the
  workspace can pass a case without computing its answer. The host reads the runner's lines defensively (the solution
  shares the runner's process and may write lines of its own): a line it cannot read, or an index out of range, fails
  that case or is dropped, and never makes `grade` raise. See `values_match` for how values compare.
  A solution that kills the runner (``os._exit``, a C-level hang, a crash) fails the case it was on; the runner then
  restarts after that case, at most `MAX_RUNS` times in all, so one bad case does not sink the rest.
* `ScriptTest`: its files are unpacked in the call's private folder, an `argv` item that names one of them is
  replaced by its path there (``AGENTRL_TEST_DIR`` holds the folder), and the program runs in the workspace with a
  fresh random nonce on stdin; it passes when it exits 0 and prints the nonce. A test that stops early (a crash, a
  timeout) never reaches the line that prints the nonce. The loaders' HumanEval and MBPP test programs run the
  solution in a child process and call it through proxies, so the process holding the nonce never runs solution
  code (`envs/code/tasks/loaders.py`); a Harbor / terminal-bench test runs the agent's programs by nature.

A missing or broken ``solution.py`` fails every case with a clear detail and never raises; nothing the solution does
makes `grade` raise: only a sandbox that fails as infrastructure (`SandboxError`) does. `grade_reference` plays the
task's reference solution (the expert) and grades it the same way: every built-in task must score 1.0 there.
"""

from __future__ import annotations

import io
import json
import math
import secrets
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .sandbox.base import ExecResult, Sandbox, SandboxError, SandboxLimits
from .tasks.record import SOLUTION_FILE, CodeTask, IOCase, ScriptTest

__all__ = ["TestOutcome", "TestReport", "grade", "grade_reference", "values_match", "files_tar", "GRADER_DIR",
           "CASE_TIMEOUT_S", "CASE_WALL_FACTOR", "GRADING_ENV", "MAX_RUNS"]

GRADER_DIR = ".agentrl_grader"
"""The folder name the loaders key hidden test files under (`ScriptTest.files`). The grader unpacks those files in
each call's private ``/tmp`` folder, never in the workspace, so a folder of that name the agent made is ignored."""
CASE_TIMEOUT_S = 2.0
"""Default CPU seconds one `IOCase` may take (the solution's import gets twice as long)."""
CASE_WALL_FACTOR = 4.0
"""A case's wall-clock backstop is this many times its CPU bound, plus one second: only a case that sleeps or blocks
reaches it, so host load does not decide a case."""
GRADING_ENV = {"HOME": "/tmp", "PYTHONNOUSERSITE": "1"}
"""Variables every grading call gets: no home folder in the workspace, no user site-packages."""
MAX_RUNS = 3
"""How many times the case runner is started for one grading at most (first run plus restarts after a kill)."""
_DETAIL_CHARS = 200
_VALUE_CHARS = 80


@dataclass(frozen=True)
class TestOutcome:
    """One hidden test's result: its `name`, whether it `passed`, and a short `detail` when it did not."""

    __test__ = False  # not a pytest class
    name: str
    passed: bool
    detail: str = ""


@dataclass(frozen=True)
class TestReport:
    """What the hidden tests said about one workspace, test by test."""

    __test__ = False
    tests: tuple[TestOutcome, ...]
    """One outcome per hidden test, in the task's order."""

    @property
    def passed(self) -> int:
        """How many tests passed."""
        return sum(r.passed for r in self.tests)

    @property
    def total(self) -> int:
        """How many tests ran (the task's `CodeTask.n_tests`)."""
        return len(self.tests)

    @property
    def fraction(self) -> float:
        """The reward: passed / total. 0.0 for a task without tests (none of the loaders makes one)."""
        return self.passed / self.total if self.total else 0.0

    @property
    def all_passed(self) -> bool:
        """Every test passed (and there was at least one)."""
        return bool(self.tests) and self.passed == self.total

    def summary(self, max_failures: int = 3) -> str:
        """One line of counts, then the first `max_failures` failed tests with their details.

        For logs and developers only: details can hold hidden expected values (``expected 25, got 16``), so never show
        it to the agent (the env's observation shows the counts alone).
        """
        lines = [f"{self.passed}/{self.total} hidden tests passed"]
        failed = [r for r in self.tests if not r.passed]
        lines += [f"- {r.name}: {r.detail}" for r in failed[:max_failures]]
        if len(failed) > max_failures:
            lines.append(f"- ... and {len(failed) - max_failures} more failed")
        return "\n".join(lines)


# ---- the entry points ---------------------------------------------------------------------------------------------


def grade(task: CodeTask, workspace_tar: bytes, sandbox: Sandbox, *, nonce_rng: np.random.Generator | None = None,
          limits: SandboxLimits | None = None, case_timeout_s: float = CASE_TIMEOUT_S) -> TestReport:
    """Run `task`'s hidden tests on the workspace in `workspace_tar` and report, test by test.

    Args:
        task: the task whose `cases` or `scripts` grade the workspace.
        workspace_tar: the agent's workspace as `Sandbox.export_tree` made it.
        sandbox: a FRESH, empty sandbox (never the one the agent worked in: its processes and files could be rigged);
            the caller owns it and closes it.
        nonce_rng: where the per-grading tokens come from; None (the default) uses `secrets`. Give a generator only in
            tests that need repeatable runs: a predictable nonce is one a hostile solution could print.
        limits: the base limits of every grading call (memory, processes, output); wall and CPU time are set per call
            from `case_timeout_s` and `ScriptTest.wall_s`. None uses `SandboxLimits()`.
        case_timeout_s: CPU seconds each `IOCase` may take (wall-clock backstop: `CASE_WALL_FACTOR` times that, +1 s).

    Returns:
        A `TestReport` with one `TestOutcome` per hidden test, in the task's order.

    Raises:
        SandboxError: the sandbox failed as infrastructure (could not unpack the workspace, died).
    """
    base = limits or SandboxLimits()
    _checked(sandbox.import_tree(workspace_tar, limits=replace(base, wall_s=max(base.wall_s, 30.0))),
             "unpack the agent's workspace")
    new_token = _token_maker(nonce_rng)
    try:
        if task.cases:
            return TestReport(_grade_cases(task, sandbox, base, case_timeout_s, new_token))
        return TestReport(tuple(_run_script(test, sandbox, base, new_token()) for test in task.scripts))
    except SandboxError:
        raise
    except Exception as error:  # a last guard: whatever the solution printed, grading reports it, never raises
        return _all_failed(task, f"the grader could not read the test results ({type(error).__name__}: {error})")


def grade_reference(task: CodeTask, sandbox_factory: Callable[[], Sandbox], *, limits: SandboxLimits | None = None,
                    case_timeout_s: float = CASE_TIMEOUT_S) -> TestReport:
    """Play the task's reference solution (the expert) and grade it like an agent's workspace.

    The expert's workspace is the task's `files` plus its `solution_files`; when the task has `solution_commands`
    they run (``sh -c``, in order) in a first sandbox whose workspace is then exported, and the grading runs in a
    second, fresh one, as for an agent. Every built-in task must report `all_passed` here.

    Args:
        task: the task; it must carry a reference solution.
        sandbox_factory: makes a new empty sandbox per call (``lambda: backend.create(limits)``); both are closed here.
        limits: as for `grade`; the solution commands run under it too (wall time at least 60 s).
        case_timeout_s: as for `grade`.

    Raises:
        ValueError: the task has no reference solution.
        RuntimeError: a solution command failed (its exit code and output in the message).
        SandboxError: the sandbox failed as infrastructure.
    """
    if not task.solution_files and not task.solution_commands:
        raise ValueError(f"task {task.task_id!r} has no reference solution (solution_files / solution_commands)")
    base = limits or SandboxLimits()
    files = {**task.files, **task.solution_files}
    if task.solution_commands:
        work = sandbox_factory()
        try:
            _checked(work.import_tree(files_tar(files), limits=base), "write the reference solution")
            for command in task.solution_commands:
                result = work.run(["sh", "-c", command], limits=replace(base, wall_s=max(base.wall_s, 60.0),
                                                                          cpu_s=max(base.cpu_s, 60)))
                if not result.ok:
                    raise RuntimeError(f"task {task.task_id!r}: reference command {command[:80]!r} failed "
                                       f"(exit {result.exit_code}, timed out={result.timed_out}): "
                                       f"{(result.text('stderr') or result.text())[-400:]}")
            tar = work.export_tree(limits=replace(base, output_bytes=max(base.output_bytes, base.workspace_bytes)))
        finally:
            work.close()
    else:
        tar = files_tar(files)
    fresh = sandbox_factory()
    try:
        return grade(task, tar, fresh, limits=limits, case_timeout_s=case_timeout_s)
    finally:
        fresh.close()


def values_match(got: Any, expected: Any) -> bool:
    """Whether a returned JSON value counts as the expected one (the comparison the host makes for an `IOCase`).

    An expected int needs an int equal to it, or a float that is a whole number equal to it exactly (``3.0`` for 3,
    never ``123456700.0`` for 123456789). An expected float takes an int or float within 1e-6 relative / 1e-9
    absolute. Bools match only bools (``True`` is not ``1``); lists and tuples match item by item; dicts need the same
    keys.

    Examples:
        >>> values_match([1, 2.0000000001], (1.0, 2.0))
        True
        >>> values_match(123456700.0, 123456789)
        False
        >>> values_match(1, True)
        False
    """
    if isinstance(expected, bool) or isinstance(got, bool):
        return isinstance(expected, bool) and isinstance(got, bool) and got == expected
    if isinstance(expected, int):
        if isinstance(got, float):  # exact: a tolerance would let a rounded float stand in for a large int
            return got.is_integer() and got == expected
        return isinstance(got, int) and got == expected
    if isinstance(expected, float) and isinstance(got, (int, float)):
        try:
            return math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9)
        except OverflowError:  # an int too large for a float: only an exact match counts
            return got == expected
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(got) == len(expected) and all(values_match(g, e) for g, e in zip(got, expected))
    if isinstance(expected, dict) and isinstance(got, dict):
        return got.keys() == expected.keys() and all(values_match(got[k], expected[k]) for k in expected)
    return type(got) is type(expected) and got == expected


def files_tar(files: Mapping[str, str], *, executable: Callable[[str], bool] = lambda path: path.endswith(".sh")
              ) -> bytes:
    """An uncompressed tar of text files (relative path -> text), for `Sandbox.import_tree` or ``tar -xf -``.

    Raises:
        ValueError: a path is absolute or climbs out with ``..``.
    """
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, text in files.items():
            parts = path.split("/")
            if path.startswith("/") or ".." in parts or not path:
                raise ValueError(f"file path {path!r} must be relative to the workspace, without '..'")
            data = text.encode("utf-8")
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o755 if executable(path) else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


# ---- IOCases ------------------------------------------------------------------------------------------------------

# ---- private runs: the grader's files in the call's own /tmp ------------------------------------------------------

# Runs inside the sandbox as ``python3 -I -B -c _BOOTSTRAP ARGV_JSON`` (3.8 and later, standard library only). Its
# stdin is "<tar length>\n", the tar of the call's files, then the program's own stdin. It is made non-dumpable
# first: a process of the same uid (the solution's) can then read neither its memory nor its descriptors, which hold
# the program's stdin (a test's nonce).
_BOOTSTRAP = r'''
import io, json, os, shutil, subprocess, sys, tarfile, tempfile
try:
    import ctypes
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
except Exception:
    pass
size = int(sys.stdin.buffer.readline())
blob = sys.stdin.buffer.read(size)
rest = sys.stdin.buffer.read()
folder = tempfile.mkdtemp(prefix="agentrl-grader-")
try:
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        names = set(tar.getnames())
        if hasattr(tarfile, "data_filter"):
            tar.extractall(folder, filter="data")
        else:
            tar.extractall(folder)
    argv = [os.path.join(folder, item) if item in names else item for item in json.loads(sys.argv[1])]
    env = dict(os.environ, AGENTRL_TEST_DIR=folder)
    try:
        code = subprocess.run(argv, input=rest, env=env).returncode
    except OSError as error:
        sys.stderr.write("grader: cannot run " + repr(argv[0]) + ": " + str(error) + "\n")
        code = 127
finally:
    shutil.rmtree(folder, ignore_errors=True)
sys.exit(128 - code if code < 0 else code)
'''


def _run_private(sandbox: Sandbox, files: Mapping[str, str], argv: Sequence[str], stdin: bytes,
                 limits: SandboxLimits) -> ExecResult:
    """Run `argv` in the workspace with `files` unpacked in a private folder of the call's ``/tmp`` (one call)."""
    tar = files_tar(files)
    return sandbox.run(["python3", "-I", "-B", "-c", _BOOTSTRAP, json.dumps(list(argv))],
                       stdin=b"%d\n" % len(tar) + tar + stdin, limits=limits, env=GRADING_ENV)


# ---- IOCases ------------------------------------------------------------------------------------------------------

# Runs inside the sandbox, under whatever python3 it has (3.8 and later): only the standard library, no f-strings
# with `=`, no walrus. It reads one JSON request on stdin and writes tagged lines on the stdout it was started with.
_CASE_RUNNER = r'''"""Hidden case runner (written by agentrl's grader): calls the solution's entry point per case."""
import importlib.util
import json
import os
import signal
import sys

try:
    import resource
except ImportError:  # not on Linux: no CPU bound per case, the sandbox's limits still hold
    resource = None


class _CaseTimeout(BaseException):
    pass


def _on_timer(signum, frame):
    raise _CaseTimeout("cpu" if signum == signal.SIGPROF else "wall")


def _set_timers(cpu, wall):
    signal.setitimer(signal.ITIMER_PROF, cpu)
    signal.setitimer(signal.ITIMER_REAL, wall)


def _describe(error):
    try:
        text = str(error)
    except BaseException:
        text = "?"
    name = type(error).__name__
    return (name + ": " + text if text else name)[:300]


def main():
    request = json.loads(sys.stdin.read())
    token, timeout, wall = request["token"], float(request["timeout"]), float(request["wall"])
    out = os.fdopen(os.dup(1), "w")  # the results' own stdout; dup'd descriptors are not inherited by children
    os.dup2(2, 1)  # from here, whatever the solution prints (or its children print) goes to stderr
    sys.stdout = sys.stderr

    def emit(kind, index=-1, payload=None):
        out.write(token + " " + kind + " " + str(index) + " " + json.dumps(payload) + "\n")
        out.flush()

    workspace = os.getcwd()
    sys.path.insert(0, workspace)  # run with -I: the solution's folder is on the path only because we put it there
    path = os.path.join(workspace, request["solution"])
    if not os.path.isfile(path):
        emit("fatal", payload=request["solution"] + " not found in the workspace")
        return
    signal.signal(signal.SIGPROF, _on_timer)
    signal.signal(signal.SIGALRM, _on_timer)
    emit("importing")
    try:
        _set_timers(2 * timeout, 2 * wall)
        try:
            spec = importlib.util.spec_from_file_location("solution", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules["solution"] = module
            spec.loader.exec_module(module)
        finally:
            _set_timers(0, 0)
    except _CaseTimeout:
        emit("fatal", payload="importing " + request["solution"] + " timed out")
        return
    except BaseException as error:
        emit("fatal", payload="importing " + request["solution"] + " raised " + _describe(error))
        return
    function = getattr(module, request["entry_point"], None)
    if not callable(function):
        emit("fatal", payload=request["solution"] + " defines no function " + request["entry_point"])
        return
    for index in range(int(request["start"]), len(request["cases"])):
        args = json.loads(request["cases"][index])
        emit("start", index)
        if resource is not None:
            used = resource.getrusage(resource.RUSAGE_SELF)
            soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
            wanted = int(used.ru_utime + used.ru_stime + timeout) + 2
            if hard != resource.RLIM_INFINITY:
                wanted = min(wanted, hard)
            try:
                resource.setrlimit(resource.RLIMIT_CPU, (wanted, hard))  # SIGXCPU ends a C-level busy loop
            except (ValueError, OSError):
                pass
        try:
            _set_timers(timeout, wall)
            try:
                value = function(*args)
            finally:
                _set_timers(0, 0)
        except _CaseTimeout as stop:
            emit("timeout", index, str(stop))
            continue
        except BaseException as error:
            emit("raised", index, _describe(error))
            continue
        try:
            text = json.dumps(value)
        except BaseException as error:
            emit("unserializable", index, type(value).__name__ + " (" + _describe(error)[:100] + ")")
            continue
        if len(text) > int(request["max_chars"]):
            emit("too_large", index, len(text))
            continue
        out.write(token + " value " + str(index) + " " + text + "\n")
        out.flush()


main()
'''

_RUNNER_PATH = "run_cases.py"
_MAX_VALUE_CHARS = 200_000


def _grade_cases(task: CodeTask, sandbox: Sandbox, base: SandboxLimits, case_timeout_s: float,
                 new_token: Callable[[], str]) -> tuple[TestOutcome, ...]:
    cases = task.cases
    names = [_case_name(task.entry_point, i, case) for i, case in enumerate(cases)]
    outcomes: dict[int, TestOutcome] = {}
    case_wall_s = CASE_WALL_FACTOR * case_timeout_s + 1.0
    encoded = [json.dumps(list(case.args)) for case in cases]
    start = 0
    for _ in range(MAX_RUNS):
        if start >= len(cases):
            break
        token = new_token()
        request = {"token": token, "timeout": case_timeout_s, "wall": case_wall_s, "solution": SOLUTION_FILE,
                   "entry_point": task.entry_point, "cases": encoded, "start": start, "max_chars": _MAX_VALUE_CHARS}
        remaining = len(cases) - start
        # Only a solution that sleeps in every case gets near the wall limit; CPU time bounds the rest.
        wall = 2 * case_wall_s + remaining * (case_wall_s + 0.5) + 5.0
        call_limits = replace(base, wall_s=wall, cpu_s=math.ceil(2 * case_timeout_s + remaining * case_timeout_s) + 5,
                              output_bytes=max(base.output_bytes, remaining * (_MAX_VALUE_CHARS + 200)))
        result = _run_private(sandbox, {_RUNNER_PATH: _CASE_RUNNER}, ["python3", "-I", "-B", _RUNNER_PATH],
                              json.dumps(request).encode(), call_limits)
        lines = _tagged_lines(result, token, len(cases))
        fatal = next((payload for kind, _, payload in lines if kind == "fatal"), None)
        if fatal is not None:
            for i in range(start, len(cases)):
                outcomes[i] = TestOutcome(names[i], False, _short(str(fatal)))
            break
        last_started = -1
        for kind, index, payload in lines:
            if kind == "start":
                if start <= index < len(cases):  # a line the solution wrote may name any index: keep the real ones
                    last_started = index
            elif 0 <= index < len(cases) and index not in outcomes:
                outcomes[index] = _case_outcome(names[index], cases[index], kind, payload, case_timeout_s)
        if last_started == -1:  # died before the first case: while importing the solution, or the runner broke
            where = f"while importing {SOLUTION_FILE}" if any(k == "importing" for k, _, _ in lines) else "at start"
            detail = _short(f"the process ended {where}: {_how_it_ended(result)}")
            for i in range(start, len(cases)):
                outcomes[i] = TestOutcome(names[i], False, detail)
            break
        if last_started not in outcomes:
            how = _how_it_ended(result, case_timeout_s)
            outcomes[last_started] = TestOutcome(names[last_started], False, _short(
                f"the process ended during this case: {how}" if how.startswith("exit code") else how))
        start = last_started + 1
    for i in range(len(cases)):
        if i not in outcomes:
            outcomes[i] = TestOutcome(names[i], False, f"not run: the solution ended the runner {MAX_RUNS} times")
    return tuple(outcomes[i] for i in range(len(cases)))


def _tagged_lines(result: ExecResult, token: str, n_cases: int) -> list[tuple[str, int, Any]]:
    """The runner's lines, parsed as ``(kind, index, payload)``.

    Lines without the token and lines whose index is not a case's (or -1) are dropped. A line whose payload cannot be
    read (cut at the output limit, or nested past the parser's depth by a solution that rewrote the runner's
    ``json.dumps``) becomes kind ``unreadable`` for its case: any error here is the solution's doing and fails only
    that case.
    """
    parsed: list[tuple[str, int, Any]] = []
    for line in result.stdout.decode("utf-8", "replace").splitlines():
        parts = line.split(" ", 3)
        if len(parts) != 4 or parts[0] != token or len(parts[2]) > 12:
            continue
        try:
            index = int(parts[2])
        except ValueError:
            continue
        if not -1 <= index < n_cases:
            continue
        try:
            parsed.append((parts[1], index, json.loads(parts[3])))
        except Exception as error:  # noqa: BLE001 - RecursionError, MemoryError, ValueError: all the solution's doing
            parsed.append(("unreadable", index, type(error).__name__))
    return parsed


def _case_outcome(name: str, case: IOCase, kind: str, payload: Any, case_timeout_s: float) -> TestOutcome:
    try:
        return _compared(name, case, kind, payload, case_timeout_s)
    except Exception as error:  # noqa: BLE001 - a value nested too deep to compare or show is a failed case
        return TestOutcome(name, False, f"returned a value that could not be compared ({type(error).__name__})")


def _compared(name: str, case: IOCase, kind: str, payload: Any, case_timeout_s: float) -> TestOutcome:
    if kind == "value":
        if values_match(payload, case.expected):
            return TestOutcome(name, True)
        return TestOutcome(name, False, f"expected {_show(case.expected)}, got {_show(payload)}")
    if kind == "timeout":
        if payload == "wall":
            return TestOutcome(name, False, f"timed out (over {CASE_WALL_FACTOR * case_timeout_s + 1:g} s of wall "
                                            f"clock; it sleeps or blocks)")
        return TestOutcome(name, False, f"timed out (over {case_timeout_s:g} s of CPU time)")
    if kind == "unreadable":
        return TestOutcome(name, False, _short(f"its result line could not be read ({payload})"))
    if kind == "raised":
        return TestOutcome(name, False, _short(f"raised {payload}"))
    if kind == "unserializable":
        return TestOutcome(name, False, _short(f"returned a {payload}, not a JSON value"))
    if kind == "too_large":
        return TestOutcome(name, False, f"returned a value too large to compare ({payload} characters of JSON)")
    return TestOutcome(name, False, f"unexpected runner line {kind!r}")


def _how_it_ended(result: ExecResult, case_timeout_s: float | None = None) -> str:
    if result.timed_out:
        return "timed out (the grading call's wall clock ran out)"
    code = result.exit_code
    if code in (-24, 128 + 24):
        limit = f", over {case_timeout_s:g} s" if case_timeout_s else ""
        return f"timed out (killed at its CPU time bound{limit})"
    if code in (-9, 128 + 9):
        return "killed (memory, process or time limit)"
    if result.workspace_overflow:
        return "the workspace grew past its size limit"
    if result.output_truncated:
        return "the output limit was hit"
    tail = result.text("stderr").strip().splitlines()
    return f"exit code {code}" + (f" ({tail[-1].strip()})" if tail else "")


def _case_name(entry_point: str, index: int, case: IOCase) -> str:
    args = ", ".join(_show(a, 30) for a in case.args)
    return _short(f"case {index + 1}: {entry_point}({args})", 100)


# ---- ScriptTests --------------------------------------------------------------------------------------------------


def _run_script(test: ScriptTest, sandbox: Sandbox, base: SandboxLimits, nonce: str) -> TestOutcome:
    call_limits = replace(base, wall_s=test.wall_s, cpu_s=max(base.cpu_s, math.ceil(test.wall_s)))
    result = _run_private(sandbox, test.files, test.argv, (nonce + "\n").encode(), call_limits)
    if result.exit_code == 0 and not result.timed_out and nonce in result.text():
        return TestOutcome(test.name, True)
    if result.timed_out:
        detail = f"timed out after {test.wall_s:g} s"
    elif result.workspace_overflow:
        detail = "the workspace grew past its size limit"
    elif result.exit_code == 0 and result.output_truncated:
        detail = "the output limit was hit before the test finished"
    elif result.exit_code == 0:
        detail = "exited 0 without printing the pass token (the test did not run to its end)"
    else:
        lines = [line for line in result.text("stderr").splitlines() if line.strip()] or [
            line for line in result.text().splitlines() if line.strip()]
        detail = f"exit {result.exit_code}" + (f": {lines[-1].strip()}" if lines else "")
    return TestOutcome(test.name, False, _short(detail))


# ---- small helpers ------------------------------------------------------------------------------------------------


def _all_failed(task: CodeTask, detail: str) -> TestReport:
    names = ([_case_name(task.entry_point, i, case) for i, case in enumerate(task.cases)] or
             [test.name for test in task.scripts])
    return TestReport(tuple(TestOutcome(name, False, _short(detail)) for name in names))


def _token_maker(nonce_rng: np.random.Generator | None) -> Callable[[], str]:
    if nonce_rng is None:
        return lambda: secrets.token_hex(16)
    return lambda: nonce_rng.bytes(16).hex()


def _checked(result: ExecResult, what: str) -> ExecResult:
    if not result.ok:
        raise SandboxError(f"grading could not {what} (exit {result.exit_code}, timed out={result.timed_out}): "
                           f"{result.text('stderr')[-300:]}")
    return result


def _show(value: Any, limit: int = _VALUE_CHARS) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short(text: str, limit: int = _DETAIL_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."

