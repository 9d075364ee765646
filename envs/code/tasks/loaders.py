"""Task loaders: HumanEval- and MBPP-style JSONL rows, and Harbor / terminal-bench task folders, as `CodeTask`s.

JSONL (`load_jsonl_tasks`), one task per line, the kind told by its fields:

* HumanEval rows (``task_id``, ``prompt``, ``test`` defining ``check(candidate)``, ``entry_point``, optional
  ``canonical_solution``): the agent completes the prompt's function in ``solution.py``; one hidden `ScriptTest` runs
  the row's test code with the solution's names in scope (as HumanEval's own harness runs prompt, completion and test
  in one program) and calls ``check(entry_point)``. The expert writes prompt + canonical solution.
* MBPP rows (``task_id``, ``text``, ``code``, ``test_list`` of ``assert`` lines, optional ``test_setup_code``): the
  entry point is the function the asserts call. When every assert is a plain ``assert f(literals) == literal`` (read
  with `ast`, values by ``ast.literal_eval`` only, never run) and there is no setup code, each becomes an `IOCase`, so
  the expected values never enter the sandbox; otherwise each assert is its own `ScriptTest`. Either way the reward is
  the fraction of asserts passed. IOCases compare like the grader does: floats to 1e-6, tuples equal to lists, bools
  only to bools. Arguments must survive JSON unchanged (no tuples, sets, bytes), else the row uses ScriptTests. The
  instruction shows the first assert as an example. The expert writes ``code``.
* How those test programs keep the nonce from the solution: the program that holds the nonce and runs the test code
  never runs solution code. It starts ``solution.py`` in a child ``python3 -I`` and serves calls over the child's
  stdin and stdout: each of the solution's functions that the test code names (the entry point, a prompt's helper)
  is a proxy that sends ``repr`` of its arguments and reads back ``repr`` of the result with ``ast.literal_eval``
  (None, bools, numbers, strings, bytes, and tuples, lists, sets, dicts of them; anything else fails the call with a
  detail, never pickle or eval). An exception comes back as one of the same name and built-in base class, so tests
  that expect one still work; its literal top-level values are copied, and its modules imported afresh by name. A
  solution that exits, hangs (`_CALL_CPU_S` of CPU, `_CALL_WALL_S` of wall clock per call) or replies with junk fails
  the test it was called from, even if the test code catches the error. The test program also makes itself
  non-dumpable, so a process of the same uid cannot read its memory or descriptors.

Task folders (`load_harbor_task`, `load_harbor_tasks`):

* Harbor: ``instruction.md`` (the instruction; leading lines that mention a canary string are dropped), ``task.toml``
  (``metadata.difficulty``: easy / medium / hard or 1-5; ``verifier.timeout_sec``: the test's wall limit),
  ``environment/`` (every file but ``Dockerfile`` and ``docker-compose.yaml`` becomes a workspace file),
  ``tests/test.sh`` with whatever else is in ``tests/``, which writes its reward to ``/logs/verifier/reward.txt``
  (a number) or ``reward.json`` (``{"reward": x}``), and optionally ``solution/solve.sh``.
* terminal-bench (the older layout): ``task.yaml`` (``instruction``, or ``descriptions`` with a ``base`` entry;
  ``difficulty``; ``max_test_timeout_sec``), ``run-tests.sh`` (optional: the default runs
  ``python3 -m pytest $TEST_DIR/test_outputs.py``), ``tests/``, ``solution.sh`` (``solution.yaml``, a list of
  keystrokes for a terminal, is not supported: such a task has no expert), ``Dockerfile`` and
  ``docker-compose.yaml``; every other file becomes a workspace file.

What is supported of the task's container, and how:

* The Dockerfile is NOT built. A task must work with what the sandbox has: Debian's ``python3`` (standard library),
  ``bash``, coreutils; no network, so a test script that installs packages (``apt-get``, ``pip``, ``uv``) fails
  unless what it installs is already there. Use such tasks only where the sandbox image has their tools.
* Paths: the task's scripts expect the container's layout: the Dockerfile's last absolute ``WORKDIR`` (``/app`` when
  none), ``/tests``, ``/logs/verifier``, ``/solution``. The sandbox has its workspace at `WORKDIR` (``/workspace``;
  a host folder in the subprocess back-end) and a read-only root, so nothing can be made at those paths. The test
  and solution scripts therefore run through a small wrapper (``task_script.py``, in the hidden folder beside them)
  that rewrites those paths, as whole path names in the text of its own copies of the task's files (``/app/x``
  becomes ``/workspace/x``; ``/application`` and ``/x/app`` stay), then runs ``bash tests/test.sh`` (or
  ``run-tests.sh``, or the solution) from the workspace with ``TEST_DIR`` exported (terminal-bench's convention).
  Where the root happens to be writable it also makes those paths as links, which covers paths a script computes.
  Supported: literal paths in any text file of ``tests/`` and ``solution/``. Not supported: paths the scripts build
  at run time on a read-only root, and files that the agent's own code hard-wires to ``/app``. The grader unpacks the
  test's files (and the wrapper) in the call's private ``/tmp`` folder, not the workspace, and runs them with
  ``HOME=/tmp`` and ``PYTHONNOUSERSITE=1``; the default terminal-bench command runs pytest from there in isolated
  mode with ``-c /dev/null --rootdir "$TEST_DIR" -p no:cacheprovider``, so workspace config files are not read. A
  task's own ``run-tests.sh`` or ``test.sh`` runs as written, and it runs the agent's programs by nature: such a test
  can only be as hard to forge as the task's script makes it.
* Timeouts: ``verifier.timeout_sec`` and ``max_test_timeout_sec`` are clamped to `MAX_TEST_TIMEOUT_S` (600 s).
* The instruction gets one line saying that the task's working directory is the workspace (the agent's tools start
  there and take relative paths).
* Pass / fail: Harbor passes when the reward read back is 1 or more (a ScriptTest is pass/fail: partial Harbor
  rewards count as a fail), and fails when ``test.sh`` wrote no reward; terminal-bench passes when ``run-tests.sh``
  exits 0 (pytest's exit status: every test passed).

Errors: a malformed file raises `TaskFileError` naming the file (and the JSONL line) and the field.
"""

from __future__ import annotations

import ast
import builtins
import json
import math
import re
from pathlib import Path
from typing import Any

import yaml

from .record import SOLUTION_FILE, CodeTask, IOCase, ScriptTest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = None  # type: ignore[assignment]

__all__ = ["TaskFileError", "load_jsonl_tasks", "load_harbor_task", "load_harbor_tasks", "MAX_TEST_TIMEOUT_S"]

_GRADER_DIR = ".agentrl_grader"  # where hidden test files go (the grader empties it before writing them)
_SOLUTION_DIR = ".agentrl_solution"  # where a terminal task's solution files go for the expert's commands
_SCRIPT_TEST_WALL_S = 10.0  # HumanEval / MBPP test programs (the reference harnesses allow a few seconds)
_HARBOR_WALL_S = 120.0  # a Harbor / terminal-bench test without a timeout in its config
MAX_TEST_TIMEOUT_S = 600.0
"""The longest wall-clock limit a task file may give its test (``verifier.timeout_sec``, ``max_test_timeout_sec``);
a longer one is clamped to it, so one task cannot hold a grading sandbox for hours."""
# terminal-bench's default test command. Run from the tests' private folder, in isolated mode, with no config file
# and no cache: a conftest.py, pytest.ini or pytest.py the agent left in the workspace is never read.
_DEFAULT_RUN_TESTS = ('#!/bin/bash\ncd "$TEST_DIR" && python3 -I -m pytest -c /dev/null --rootdir "$TEST_DIR" '
                      '-p no:cacheprovider "$TEST_DIR/test_outputs.py" -rA\n')
_MAX_FILE_BYTES = 4 * 1024 * 1024
_DIFFICULTY_WORDS = {"trivial": 1, "easy": 1, "medium": 3, "hard": 5, "expert": 5}
_SKIPPED_DIRS = {".git", "__pycache__"}


class TaskFileError(ValueError):
    """A task file that cannot be read as a task; the message names the file (and line) and the field at fault."""


# ---- JSONL: HumanEval and MBPP ------------------------------------------------------------------------------------


def load_jsonl_tasks(path: str | Path) -> list[CodeTask]:
    """The tasks of a JSONL file of HumanEval-style or MBPP-style rows (the two may be mixed), in file order.

    Raises:
        TaskFileError: the file is missing, a line is not a JSON object, a row is neither kind, or a field is
            missing or of the wrong type (the message names the file, the line and the field).
    """
    path = Path(path)
    if not path.is_file():
        raise TaskFileError(f"{path}: no such file (give a .jsonl file of HumanEval or MBPP rows)")
    tasks: list[CodeTask] = []
    seen: dict[str, int] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise TaskFileError(f"{path}: not UTF-8 text (a .jsonl file has one JSON object per line)") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise TaskFileError(f"{where}: not valid JSON ({error.msg})") from None
        if not isinstance(row, dict):
            raise TaskFileError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
        if "test_list" in row:
            task = _mbpp_task(row, where)
        elif "entry_point" in row or "prompt" in row:
            task = _humaneval_task(row, where)
        else:
            raise TaskFileError(f"{where}: neither a HumanEval row (task_id, prompt, test, entry_point) nor an MBPP "
                                f"row (task_id, text, code, test_list); its fields are {sorted(row)[:10]}")
        if task.task_id in seen:
            raise TaskFileError(f"{where}: field 'task_id' repeats {task.task_id!r} (first on line "
                                f"{seen[task.task_id]})")
        seen[task.task_id] = number
        tasks.append(task)
    return tasks


def _field(row: dict[str, Any], name: str, where: str, kind: str) -> str:
    if name not in row:
        raise TaskFileError(f"{where}: field {name!r} is missing ({kind} rows need it)")
    value = row[name]
    if not isinstance(value, str) or not value.strip():
        raise TaskFileError(f"{where}: field {name!r} must be a non-empty string, got {type(value).__name__}")
    return value.replace("\r\n", "\n")


def _task_id(row: dict[str, Any], where: str, kind: str) -> str:
    if "task_id" not in row:
        raise TaskFileError(f"{where}: field 'task_id' is missing ({kind} rows need it)")
    value = row["task_id"]
    if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
        raise TaskFileError(f"{where}: field 'task_id' must be a string or an integer, got {value!r}")
    return str(value).strip()


def _difficulty(value: Any, where: str, field: str) -> int:
    if value is None:
        return 1
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 5:
        return value
    if isinstance(value, str):
        return _DIFFICULTY_WORDS.get(value.strip().lower(), 1)
    raise TaskFileError(f"{where}: field {field!r} must be easy / medium / hard or an integer 1-5, got {value!r}")


# The HumanEval / MBPP test program. It holds the nonce and runs the row's test code, but never the solution's: the
# solution runs in a child process (`_SOLUTION_SERVER`), and the names the test code uses from it are proxies that
# send each call's arguments as `repr` and read back the `repr` of the result with `ast.literal_eval`. Both run under
# the sandbox's python3 (3.8 and later), standard library only.
_SOLUTION_SERVER = r'''"""Serves calls to solution.py for a hidden test (written by agentrl's task loader)."""
import ast
import builtins
import importlib.util
import os
import signal
import sys

try:
    import resource
except ImportError:
    resource = None

CPU_S = float(sys.argv[1])
_LITERAL_TYPES = (type(None), bool, int, float, str, bytes)


class _CallTimeout(BaseException):
    pass


def _on_timer(signum, frame):
    raise _CallTimeout()


def literal(value, depth=0):
    """Whether repr(value) reads back equal with ast.literal_eval (exact built-in types, finite floats)."""
    kind = type(value)
    if depth > 200:
        return False
    if kind is float:
        return value == value and abs(value) != float("inf")
    if kind in _LITERAL_TYPES:
        return True
    if kind in (tuple, list, set):
        return all(literal(item, depth + 1) for item in value)
    if kind is dict:
        return all(literal(k, depth + 1) and literal(v, depth + 1) for k, v in value.items())
    return False


def describe(error):
    try:
        text = str(error)
    except BaseException:
        text = "?"
    name = type(error).__name__
    return (name + ": " + text if text else name)[:300]


def main():
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the solution reads nothing of the requests, and whatever it prints goes to stderr
    os.dup2(2, 1)
    sys.stdin, sys.stdout = open(os.devnull), sys.stderr

    def reply(kind, value):
        replies.write(kind + " " + repr(value) + "\n")
        replies.flush()

    workspace = os.getcwd()
    sys.path.insert(0, workspace)  # run with -I: the solution's folder is on the path only because we put it there
    path = os.path.join(workspace, "solution.py")
    if not os.path.isfile(path):
        reply("fatal", "solution.py not found in the workspace")
        return
    signal.signal(signal.SIGPROF, _on_timer)
    try:
        signal.setitimer(signal.ITIMER_PROF, 2 * CPU_S)
        try:
            spec = importlib.util.spec_from_file_location("solution", path)
            module = importlib.util.module_from_spec(spec)
            sys.modules["solution"] = module
            spec.loader.exec_module(module)
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
    except _CallTimeout:
        reply("fatal", "importing solution.py timed out")
        return
    except BaseException as error:
        reply("fatal", "importing solution.py raised " + describe(error))
        return
    names = {}
    for name, value in list(vars(module).items()):
        if name.startswith("__"):
            continue
        if type(value) is type(sys):
            names[name] = ("module", str(getattr(value, "__name__", "")))
        elif callable(value):
            names[name] = ("callable", None)
        elif literal(value):
            names[name] = ("value", value)
    reply("ready", names)
    for line in requests:
        try:
            name, args, kwargs = ast.literal_eval(line)
            function = names.get(name, ("",))[0] == "callable" and getattr(module, name)
        except Exception:
            reply("failed", "the test sent a request the server cannot read")
            continue
        if resource is not None:  # SIGXCPU ends a C-level loop that never returns to the interpreter
            used = resource.getrusage(resource.RUSAGE_SELF)
            soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
            wanted = int(used.ru_utime + used.ru_stime + CPU_S) + 2
            try:
                resource.setrlimit(resource.RLIMIT_CPU, (wanted if hard == resource.RLIM_INFINITY
                                                         else min(wanted, hard), hard))
            except (ValueError, OSError):
                pass
        try:
            signal.setitimer(signal.ITIMER_PROF, CPU_S)
            try:
                value = function(*args, **kwargs)
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
        except _CallTimeout:
            reply("failed", "timed out (over %g s of CPU time)" % CPU_S)
            continue
        except Exception as error:
            base = next(c for c in type(error).__mro__ if getattr(builtins, c.__name__, None) is c)
            try:
                message = str(error)[:2000]
            except BaseException:
                message = "?"
            reply("raised", (type(error).__name__, base.__name__, message))
            continue
        except BaseException as error:
            reply("failed", "raised " + describe(error))
            continue
        if not literal(value):
            reply("failed", "returned a " + type(value).__name__ + ", not a literal (numbers, strings, bytes, None, "
                  "bools, and tuples, lists, sets and dicts of them)")
            continue
        try:
            text = repr(value)
        except BaseException as error:
            reply("failed", "returned a value whose repr failed: " + describe(error))
            continue
        replies.write("value " + text + "\n")
        replies.flush()


main()
'''

_TEST_HARNESS = r'''
import ast
import builtins
import importlib
import os
import select
import subprocess
import sys
import time

try:  # no process of the same uid (the solution's) may read this one's memory or descriptors: they hold the nonce
    import ctypes
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
except Exception:
    pass
_NONCE = sys.stdin.readline().strip()
_MAX_REPLY = 8 * 1024 * 1024
if hasattr(sys, "set_int_max_str_digits"):
    sys.set_int_max_str_digits(0)


class SolutionCallFailed(BaseException):
    """The solution's process failed a call (ended, timed out, sent junk). A BaseException: tests cannot catch it."""


def _literal(value, depth=0):
    kind = type(value)
    if depth > 200:
        return False
    if kind is float:
        return value == value and abs(value) != float("inf")
    if kind in (type(None), bool, int, str, bytes):
        return True
    if kind in (tuple, list, set):
        return all(_literal(item, depth + 1) for item in value)
    if kind is dict:
        return all(_literal(k, depth + 1) and _literal(v, depth + 1) for k, v in value.items())
    return False


def _rebuilt(name, base, message):
    """The solution's exception as one the test can catch: same name, same built-in base class, same message."""
    cls = getattr(builtins, base, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls = Exception
    if name != cls.__name__ and name.isidentifier():
        cls = type(name, (cls,), {})
    return cls(message)


class _Solution:
    """solution.py in a child `python3 -I`, served call by call over its stdin and stdout."""

    def __init__(self):
        self.failure = None
        self.pending = b""
        self.process = subprocess.Popen([sys.executable, "-I", "-B", "-c", _SERVER, repr(_CALL_CPU_S)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        kind, payload = self._reply("importing solution.py", 2 * _CALL_WALL_S)
        if kind == "fatal" and isinstance(payload, str):
            self.close()
            sys.exit(payload)
        if kind != "ready" or not isinstance(payload, dict):
            self._fail("importing solution.py: the solution's process " + str(payload))
        self.names = payload

    def _fail(self, why):
        self.failure = why
        self.close()
        raise SolutionCallFailed(why)

    def _reply(self, what, wall):
        """(kind, payload) of the next reply line, or ("failed", why) when the process ended, hung or sent junk."""
        deadline = time.monotonic() + wall
        fd = self.process.stdout.fileno()
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return "failed", "timed out (over %g s of wall clock in %s)" % (wall, what)
            chunk = os.read(fd, 65536)
            if not chunk:
                code = self.process.poll()
                return "failed", "ended during %s (exit code %s)" % (what, code)
            self.pending += chunk
            if len(self.pending) > _MAX_REPLY:
                return "failed", "sent a reply over %d bytes in %s" % (_MAX_REPLY, what)
        line, self.pending = self.pending.split(b"\n", 1)
        kind, _, text = line.decode("utf-8", "replace").partition(" ")
        try:
            return kind, ast.literal_eval(text)
        except Exception as error:
            return "failed", "sent a reply that is not a literal in %s (%s)" % (what, type(error).__name__)

    def call(self, name, args, kwargs):
        if self.failure is not None:
            raise SolutionCallFailed("an earlier call failed: " + self.failure)
        if not _literal(args) or not _literal(kwargs):
            bad = [type(a).__name__ for a in list(args) + list(kwargs.values()) if not _literal(a)]
            self._fail("cannot pass a %s to %s(): calls into the solution take literals only" % (bad[0], name))
        try:
            self.process.stdin.write((repr((name, args, kwargs)) + "\n").encode())
            self.process.stdin.flush()
        except OSError:
            self._fail("%s(): the solution's process had ended (exit code %s)" % (name, self.process.poll()))
        kind, payload = self._reply(name + "()", _CALL_WALL_S)
        if kind == "value":
            return payload
        if kind == "raised" and isinstance(payload, tuple) and len(payload) == 3 and all(
                isinstance(p, str) for p in payload):
            raise _rebuilt(*payload)
        self._fail("%s() %s" % (name, payload) if kind in ("failed",) else "%s(): unexpected reply %r" % (name, kind))

    def close(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def _proxy(solution, name):
    def call(*args, **kwargs):
        return solution.call(name, args, kwargs)
    call.__name__ = call.__qualname__ = name
    return call


def _main():
    try:
        solution = _Solution()
    except SolutionCallFailed as error:
        sys.exit("the solution failed: " + str(error))
    kind = solution.names.get(_ENTRY, ("",))[0]
    if kind != "callable":
        solution.close()
        sys.exit("solution.py defines no function " + _ENTRY)
    used = {node.id for node in ast.walk(ast.parse(_BODY)) if isinstance(node, ast.Name)}
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    for name, entry in solution.names.items():
        if name not in used or not (isinstance(entry, tuple) and len(entry) == 2):
            continue
        if entry[0] == "callable":
            namespace[name] = _proxy(solution, name)
        elif entry[0] == "value":
            namespace[name] = entry[1]
        elif entry[0] == "module" and isinstance(entry[1], str):
            try:  # the module of that name here, never the solution's own code (the workspace is not on the path)
                namespace[name] = importlib.import_module(entry[1])
            except Exception:
                pass
    try:
        exec(compile(_BODY, "hidden_test.py", "exec"), namespace)
    except SolutionCallFailed as error:
        sys.exit("the solution failed a call: " + str(error))
    finally:
        solution.close()
    if solution.failure is not None:  # the test caught the failure (a bare except): it still fails
        sys.exit("the solution failed a call: " + solution.failure)
    sys.stdout.write(_NONCE + "\n")
    sys.stdout.flush()


_main()
'''
_CALL_CPU_S = 4.0  # CPU seconds of one call into the solution (the import gets twice as long)
_CALL_WALL_S = 8.0  # wall-clock backstop of one call (a call that sleeps or blocks)


def _python_test(entry_point: str, body: str) -> str:
    """The test program of one HumanEval check or MBPP assert (`body`), self-contained (see `_TEST_HARNESS`)."""
    return (f'"""Hidden test (written by agentrl\'s task loader): test code here, the solution in a child process."""\n'
            f"_ENTRY = {entry_point!r}\n_BODY = {body.rstrip() + chr(10)!r}\n_CALL_CPU_S = {_CALL_CPU_S!r}\n"
            f"_CALL_WALL_S = {_CALL_WALL_S!r}\n_SERVER = {_SOLUTION_SERVER!r}\n" + _TEST_HARNESS)


def _humaneval_task(row: dict[str, Any], where: str) -> CodeTask:
    task_id = _task_id(row, where, "HumanEval")
    prompt = _field(row, "prompt", where, "HumanEval")
    test = _field(row, "test", where, "HumanEval")
    entry = _field(row, "entry_point", where, "HumanEval").strip()
    if not entry.isidentifier():
        raise TaskFileError(f"{where}: field 'entry_point' must be a Python name, got {entry!r}")
    if not re.search(r"^def check\(", test, flags=re.MULTILINE):
        raise TaskFileError(f"{where}: field 'test' must define check(candidate) (HumanEval's test format)")
    solution = row.get("canonical_solution")
    if solution is not None and not isinstance(solution, str):
        raise TaskFileError(f"{where}: field 'canonical_solution' must be a string")
    instruction = (f"Complete the Python function `{entry}` below and write it, whole (with the imports and helpers it "
                   f"needs), to the file `{SOLUTION_FILE}`.\n\n```python\n{prompt.rstrip()}\n```")
    program = f"{_GRADER_DIR}/check_{_slug(entry)}.py"
    script = ScriptTest(name="check", argv=("python3", "-I", "-B", program),
                        files={program: _python_test(entry, f"{test}\n\ncheck({entry})")}, wall_s=_SCRIPT_TEST_WALL_S)
    files = {SOLUTION_FILE: prompt + solution.replace("\r\n", "\n")} if solution else {}
    return CodeTask(task_id=f"humaneval/{task_id}", instruction=instruction, family="humaneval",
                    difficulty=_difficulty(row.get("difficulty"), where, "difficulty"), entry_point=entry,
                    scripts=(script,), solution_files=files, source="humaneval")


def _mbpp_task(row: dict[str, Any], where: str) -> CodeTask:
    task_id = _task_id(row, where, "MBPP")
    text = _field(row, "text", where, "MBPP")
    asserts = row["test_list"]
    if not isinstance(asserts, list) or not asserts or not all(isinstance(a, str) and a.strip() for a in asserts):
        raise TaskFileError(f"{where}: field 'test_list' must be a non-empty list of assert lines")
    setup = row.get("test_setup_code") or ""
    if not isinstance(setup, str):
        raise TaskFileError(f"{where}: field 'test_setup_code' must be a string")
    code = row.get("code")
    if code is not None and not isinstance(code, str):
        raise TaskFileError(f"{where}: field 'code' must be a string")
    code = code.replace("\r\n", "\n") if code else ""
    trees = []
    for i, line in enumerate(asserts):
        try:
            trees.append(ast.parse(line.strip()))
        except SyntaxError as error:
            raise TaskFileError(f"{where}: field 'test_list' item {i} is not valid Python ({error.msg})") from None
    entry = _mbpp_entry_point(trees, code, where)
    cases = [_literal_case(tree, entry) for tree in trees]
    instruction = (f"{text.strip()}\n\nWrite it as a Python function `{entry}` in the file `{SOLUTION_FILE}`. It "
                   f"should pass tests like this one:\n\n    {asserts[0].strip()}")
    common = dict(task_id=f"mbpp/{task_id}", instruction=instruction, family="mbpp",
                  difficulty=_difficulty(row.get("difficulty"), where, "difficulty"), entry_point=entry,
                  solution_files={SOLUTION_FILE: code} if code.strip() else {}, source="mbpp")
    if not setup.strip() and all(case is not None for case in cases):
        return CodeTask(cases=tuple(c for c in cases if c is not None), **common)
    scripts = tuple(ScriptTest(name=f"assert {i + 1}", argv=("python3", "-I", "-B", f"{_GRADER_DIR}/assert_{i + 1}.py"),
                               files={f"{_GRADER_DIR}/assert_{i + 1}.py": _python_test(entry, f"{setup}\n{a.strip()}")},
                               wall_s=_SCRIPT_TEST_WALL_S) for i, a in enumerate(asserts))
    return CodeTask(scripts=scripts, **common)


def _mbpp_entry_point(trees: list[ast.Module], code: str, where: str) -> str:
    called = [node.func.id for tree in trees for node in ast.walk(tree)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)]
    defined: set[str] = set()
    if code:
        try:
            defined = {n.name for n in ast.parse(code).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        except SyntaxError as error:
            raise TaskFileError(f"{where}: field 'code' is not valid Python ({error.msg})") from None
    for name in called:
        if name in defined:
            return name
    for name in called:
        if not hasattr(builtins, name):
            return name
    raise TaskFileError(f"{where}: field 'test_list' calls no function of the solution (none but builtins)")


def _literal_case(tree: ast.Module, entry: str) -> IOCase | None:
    """``assert entry(literals) == literal`` (either side) as an IOCase, or None when the assert is anything else."""
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        return None
    test = tree.body[0].test
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return None
    left, right = test.left, test.comparators[0]
    if _calls(left, entry):
        call, other = left, right
    elif _calls(right, entry):
        call, other = right, left
    else:
        return None
    assert isinstance(call, ast.Call)
    if call.keywords or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    try:
        args = [ast.literal_eval(a) for a in call.args]
        expected = ast.literal_eval(other)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    if not all(_json_faithful(a) for a in args):
        return None
    expected = _as_json(expected)
    return None if expected is _NOT_JSON else IOCase(args=tuple(args), expected=expected)


def _calls(node: ast.expr, entry: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == entry


def _json_faithful(value: Any) -> bool:
    """Survives a JSON round trip unchanged, type included (what an IOCase argument must do)."""
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_json_faithful(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_faithful(v) for k, v in value.items())
    return False


_NOT_JSON = object()


def _as_json(value: Any) -> Any:
    """An expected value as JSON (tuples become lists, which the grader treats as equal); `_NOT_JSON` otherwise."""
    if isinstance(value, (tuple, list)):
        items = [_as_json(v) for v in value]
        return _NOT_JSON if any(i is _NOT_JSON for i in items) else items
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return _NOT_JSON
        items = {k: _as_json(v) for k, v in value.items()}
        return _NOT_JSON if any(i is _NOT_JSON for i in items.values()) else items
    return value if _json_faithful(value) else _NOT_JSON


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", text)[:60] or "task"


# ---- task folders: Harbor and terminal-bench ----------------------------------------------------------------------


def load_harbor_tasks(root: str | Path) -> list[CodeTask]:
    """Every Harbor or terminal-bench task folder under `root` (or `root` itself if it is one), sorted by path.

    Folders are found at any depth (Harbor's downloads nest them as ``<hash>/<name>/``); a task folder's own
    subfolders are not searched, nor are hidden folders.

    Raises:
        TaskFileError: `root` is not a folder, holds no task folder, or one of its tasks is malformed.
    """
    root = Path(root)
    if not root.is_dir():
        raise TaskFileError(f"{root}: not a folder (give a Harbor / terminal-bench task folder or a folder of them)")
    if _layout(root):
        return [load_harbor_task(root)]
    found: list[Path] = []

    def walk(folder: Path) -> None:
        for child in sorted(folder.iterdir()):
            if not child.is_dir() or child.is_symlink() or child.name.startswith(".") or child.name in _SKIPPED_DIRS:
                continue
            if _layout(child):
                found.append(child)
            else:
                walk(child)

    walk(root)
    if not found:
        raise TaskFileError(f"{root}: no task folders found (a Harbor task has instruction.md and task.toml, a "
                            f"terminal-bench task has task.yaml)")
    return [load_harbor_task(folder) for folder in found]


def load_harbor_task(folder: str | Path) -> CodeTask:
    """One Harbor or terminal-bench task folder as a `CodeTask` with one `ScriptTest` (see the module docstring).

    Raises:
        TaskFileError: the folder is neither layout, or a file in it is missing or malformed (named with its field).
    """
    folder = Path(folder)
    layout = _layout(folder) if folder.is_dir() else None
    if layout is None:
        raise TaskFileError(f"{folder}: not a task folder (a Harbor task has instruction.md and task.toml, a "
                            f"terminal-bench task has task.yaml)")
    return _harbor_task(folder) if layout == "harbor" else _terminal_bench_task(folder)


def _layout(folder: Path) -> str | None:
    if (folder / "instruction.md").is_file() or (folder / "task.toml").is_file():
        return "harbor"
    if (folder / "task.yaml").is_file():
        return "terminal-bench"
    return None


def _harbor_task(folder: Path) -> CodeTask:
    instruction_path, config_path = folder / "instruction.md", folder / "task.toml"
    for required in (instruction_path, config_path, folder / "tests" / "test.sh"):
        if not required.is_file():
            raise TaskFileError(f"{required}: missing (a Harbor task needs instruction.md, task.toml and "
                                f"tests/test.sh)")
    instruction = _drop_canary(_read_text(instruction_path))
    if not instruction.strip():
        raise TaskFileError(f"{instruction_path}: empty (the instruction is the whole file)")
    config = _read_toml(config_path)
    metadata, verifier = _table(config, "metadata", config_path), _table(config, "verifier", config_path)
    difficulty = _difficulty(metadata.get("difficulty"), str(config_path), "metadata.difficulty")
    wall_s = _seconds(verifier.get("timeout_sec"), config_path, "verifier.timeout_sec")
    environment = folder / "environment"
    workdir = _dockerfile_workdir(environment / "Dockerfile")
    files = _tree(environment, skip={"Dockerfile", "docker-compose.yaml", "docker-compose.yml"})
    tests = {f"{_GRADER_DIR}/tests/{path}": text for path, text in _tree(folder / "tests").items()}
    test = ScriptTest(name="test.sh", argv=("python3", "-I", "-B", f"{_GRADER_DIR}/task_script.py", "test", "harbor",
                                             workdir),
                      files={**tests, f"{_GRADER_DIR}/task_script.py": _TASK_SCRIPT}, wall_s=wall_s)
    solution = _tree(folder / "solution")
    if "solve.sh" not in solution:
        solution = {}
    return _terminal_task(f"harbor/{folder.name}", instruction, "harbor", difficulty, files, test, solution, workdir)


def _terminal_bench_task(folder: Path) -> CodeTask:
    config_path = folder / "task.yaml"
    try:
        config = yaml.safe_load(_read_text(config_path))
    except yaml.YAMLError as error:
        raise TaskFileError(f"{config_path}: not valid YAML ({str(error).splitlines()[0]})") from None
    if not isinstance(config, dict):
        raise TaskFileError(f"{config_path}: must be a mapping of fields (instruction, difficulty, ...)")
    instruction = config.get("instruction")
    if instruction is None and isinstance(config.get("descriptions"), list):  # the first terminal-bench releases
        entries = [d for d in config["descriptions"] if isinstance(d, dict)]
        base = [d for d in entries if d.get("key") == "base"] or entries
        instruction = base[0].get("description") if base else None
    if not isinstance(instruction, str) or not instruction.strip():
        raise TaskFileError(f"{config_path}: field 'instruction' is missing or not a non-empty string")
    difficulty = _difficulty(config.get("difficulty"), str(config_path), "difficulty")
    wall_s = _seconds(config.get("max_test_timeout_sec"), config_path, "max_test_timeout_sec")
    known = {"task.yaml", "solution.sh", "solution.yaml", "run-tests.sh", "Dockerfile", "docker-compose.yaml",
             "docker-compose.yml", "tests"}
    files = _tree(folder, skip=known)
    run_tests = (_read_text(folder / "run-tests.sh") if (folder / "run-tests.sh").is_file() else
                 _DEFAULT_RUN_TESTS)
    tests = {f"{_GRADER_DIR}/tests/{path}": text for path, text in _tree(folder / "tests").items()}
    workdir = _dockerfile_workdir(folder / "Dockerfile")
    test = ScriptTest(name="run-tests.sh",
                      argv=("python3", "-I", "-B", f"{_GRADER_DIR}/task_script.py", "test", "terminal-bench", workdir),
                      files={**tests, f"{_GRADER_DIR}/run-tests.sh": run_tests,
                             f"{_GRADER_DIR}/task_script.py": _TASK_SCRIPT}, wall_s=wall_s)
    solution = {"solution.sh": _read_text(folder / "solution.sh")} if (folder / "solution.sh").is_file() else {}
    return _terminal_task(f"terminal-bench/{folder.name}", instruction, "terminal-bench", difficulty, files, test,
                          solution, workdir)


def _terminal_task(task_id: str, instruction: str, layout: str, difficulty: int, files: dict[str, str],
                   test: ScriptTest, solution: dict[str, str], workdir: str) -> CodeTask:
    note = (f"\n\n(Sandbox note: the task's working directory {workdir} is your workspace, the directory your tools "
            f"start in; write the task's files there, with relative paths.)")
    commands: tuple[str, ...] = ()
    solution_files: dict[str, str] = {}
    if solution:
        solution_files = {f"{_SOLUTION_DIR}/{path}": text for path, text in solution.items()}
        solution_files[f"{_SOLUTION_DIR}/task_script.py"] = _TASK_SCRIPT
        commands = (f"python3 {_SOLUTION_DIR}/task_script.py solve {layout} {workdir}; status=$?; "
                    f"rm -rf {_SOLUTION_DIR}; exit $status",)
    return CodeTask(task_id=task_id, instruction=instruction.strip() + note, family=layout, difficulty=difficulty,
                    files=files, scripts=(test,), solution_files=solution_files, solution_commands=commands,
                    source=layout)


def _read_text(path: Path) -> str:
    if path.is_symlink():
        raise TaskFileError(f"{path}: a symbolic link (task files must be plain files)")
    data = path.read_bytes()
    if len(data) > _MAX_FILE_BYTES:
        raise TaskFileError(f"{path}: {len(data)} bytes, larger than a task file may be ({_MAX_FILE_BYTES})")
    try:
        return data.decode("utf-8").replace("\r\n", "\n")
    except UnicodeDecodeError:
        raise TaskFileError(f"{path}: not UTF-8 text (only text files can be task files)") from None


def _tree(folder: Path, skip: set[str] | None = None) -> dict[str, str]:
    """Every file under `folder` (relative path -> text); names in `skip` are left out at the top level only."""
    if not folder.is_dir():
        return {}
    out: dict[str, str] = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if (skip and rel.parts[0] in skip) or any(part in _SKIPPED_DIRS for part in rel.parts):
            continue
        if path.is_symlink():
            raise TaskFileError(f"{path}: a symbolic link (task files must be plain files)")
        if path.is_file():
            out[rel.as_posix()] = _read_text(path)
    return out


def _read_toml(path: Path) -> dict[str, Any]:
    if tomllib is None:
        raise TaskFileError(f"{path}: reading task.toml needs Python 3.11 or later (tomllib)")
    try:
        return tomllib.loads(_read_text(path))
    except tomllib.TOMLDecodeError as error:
        raise TaskFileError(f"{path}: not valid TOML ({error})") from None


def _table(config: dict[str, Any], name: str, path: Path) -> dict[str, Any]:
    value = config.get(name, {})
    if not isinstance(value, dict):
        raise TaskFileError(f"{path}: field {name!r} must be a table ([{name}]), got {type(value).__name__}")
    return value


def _seconds(value: Any, path: Path, field: str) -> float:
    """A task file's test timeout: the default when absent, clamped to `MAX_TEST_TIMEOUT_S`."""
    if value is None:
        return _HARBOR_WALL_S
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise TaskFileError(f"{path}: field {field!r} must be a positive number of seconds, got {value!r}")
    return min(float(value), MAX_TEST_TIMEOUT_S)


def _drop_canary(text: str) -> str:
    lines = text.replace("\r\n", "\n").split("\n")
    while lines and "canary" in lines[0].lower():
        lines.pop(0)
    return "\n".join(lines).strip() + "\n"


def _dockerfile_workdir(path: Path) -> str:
    """The Dockerfile's last absolute WORKDIR without variables, else ``/app`` (both benchmarks' convention)."""
    workdir = "/app"
    if path.is_file():
        for line in _read_text(path).splitlines():
            match = re.match(r"\s*WORKDIR\s+(\S+)\s*$", line, flags=re.IGNORECASE)
            if match and match.group(1).startswith("/") and "$" not in match.group(1):
                workdir = match.group(1).rstrip("/") or "/app"
    return workdir


# Runs in the sandbox (python3 3.8 or later, standard library only): the wrapper that runs a task's test or solution
# script as the task's container would, then turns the test's verdict into the grader's protocol (nonce on stdout).
_TASK_SCRIPT = r'''"""Runs a Harbor / terminal-bench task script in this sandbox (written by agentrl's task loader).

python3 task_script.py test|solve harbor|terminal-bench WORKDIR   (run in the workspace)

The container paths the task's scripts use (WORKDIR, /tests, /logs, /solution) are rewritten in this folder's own
copies of the scripts to where they are here; where the sandbox's root is writable they are also made as links.
"""
import json
import os
import re
import subprocess
import sys


def rewrite(folder, mapping):
    """Replace whole container paths (not '/application', not '/x/app') in every text file under `folder`."""
    names = sorted(mapping, key=len, reverse=True)
    pattern = re.compile(r"(?<![\w.~/})$-])(" + "|".join(re.escape(n) for n in names) + r")(?![\w.-])")
    own = os.path.abspath(__file__)
    for base, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(base, name)
            if os.path.abspath(path) == own:
                continue
            try:
                with open(path, encoding="utf-8") as handle:
                    text = handle.read()
            except (OSError, UnicodeDecodeError):
                continue
            new = pattern.sub(lambda match: mapping[match.group(1)], text)
            if new != text:
                with open(path, "w", encoding="utf-8") as handle:
                    handle.write(new)


def link(path, target):
    """Make `path` a symlink to `target` if nothing is there and the root lets us (bonus for computed paths)."""
    try:
        if not os.path.lexists(path):
            parent = os.path.dirname(path)
            if parent and not os.path.isdir(parent):
                os.makedirs(parent)
            os.symlink(target, path)
    except OSError:
        pass


def read_reward(logs):
    """(reward, where) from reward.txt or else reward.json (Harbor's order); (None, why) when there is none."""
    text_path, json_path = os.path.join(logs, "reward.txt"), os.path.join(logs, "reward.json")
    if os.path.isfile(text_path):
        with open(text_path) as handle:
            raw = handle.read().strip()
        try:
            return float(raw), "reward.txt"
        except ValueError:
            return None, "reward.txt holds " + repr(raw[:40]) + ", not a number"
    if os.path.isfile(json_path):
        try:
            with open(json_path) as handle:
                data = json.load(handle)
            if isinstance(data, dict):
                data = data["reward"] if "reward" in data else (list(data.values())[0] if len(data) == 1 else None)
            return float(data), "reward.json"
        except (ValueError, TypeError, KeyError):
            return None, "reward.json holds no number under 'reward'"
    return None, "test.sh wrote no reward (/logs/verifier/reward.txt or reward.json)"


def main():
    mode, layout, workdir = sys.argv[1], sys.argv[2], sys.argv[3]
    here = os.getcwd()
    folder = os.path.dirname(os.path.abspath(__file__))  # the test's private copy (grading) or the solution folder
    nonce = sys.stdin.readline().strip() if mode == "test" else ""
    tests, logs = os.path.join(folder, "tests"), os.path.join(folder, "logs")
    mapping = {"/tests": tests, "/logs": logs, "/solution": folder}
    if workdir not in ("/", here):
        mapping[workdir] = here
    if not os.path.isdir(os.path.join(logs, "verifier")):
        os.makedirs(os.path.join(logs, "verifier"))
    for name in ("reward.txt", "reward.json"):
        if os.path.exists(os.path.join(logs, "verifier", name)):
            os.remove(os.path.join(logs, "verifier", name))
    rewrite(folder, mapping)
    if here == "/workspace":  # a private root (never the host's): also make the paths themselves, where it can
        for path, target in mapping.items():
            link(path, target)
    env = dict(os.environ)
    env["TEST_DIR"] = tests
    env["HOME"] = "/tmp"  # never the workspace: no user site-packages or dotfiles the agent could have planted
    env["PYTHONNOUSERSITE"] = "1"
    if mode == "solve":
        script = os.path.join(folder, "solve.sh" if layout == "harbor" else "solution.sh")
        sys.exit(subprocess.call(["bash", script], cwd=here, env=env, stdin=subprocess.DEVNULL))
    script = os.path.join(tests, "test.sh") if layout == "harbor" else os.path.join(folder, "run-tests.sh")
    sys.stdout.flush()
    code = subprocess.call(["bash", script], cwd=here, env=env, stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno())
    if layout == "harbor":
        reward, where = read_reward(os.path.join(logs, "verifier"))
        if reward is None:
            passed, why = False, where + "; exit code " + str(code)
        else:
            passed, why = reward >= 1.0, "reward " + repr(reward) + " from " + where
    else:
        passed, why = code == 0, "run-tests.sh exit code " + str(code)
    if passed:
        sys.stdout.write(nonce + "\n")
        sys.exit(0)
    sys.stderr.write("failed: " + why + "\n")
    sys.exit(1)


main()
'''
