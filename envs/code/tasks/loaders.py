"""Task loaders: HumanEval- and MBPP-style JSONL rows, and Harbor / terminal-bench task folders, as `CodeTask`s.

JSONL (`load_jsonl_tasks`), one task per line, the kind told by its fields:

* HumanEval rows (``task_id``, ``prompt``, ``test`` defining ``check(candidate)``, ``entry_point``, optional
  ``canonical_solution``): the agent completes the prompt's function in ``solution.py``; one hidden `ScriptTest` runs
  the row's test code next to the solution's names (as HumanEval's own harness runs prompt, completion and test in one
  program) and calls ``check(entry_point)``. The expert writes prompt + canonical solution.
* MBPP rows (``task_id``, ``text``, ``code``, ``test_list`` of ``assert`` lines, optional ``test_setup_code``): the
  entry point is the function the asserts call. When every assert is a plain ``assert f(literals) == literal`` (read
  with `ast`, values by ``ast.literal_eval`` only, never run) and there is no setup code, each becomes an `IOCase`, so
  the expected values never enter the sandbox; otherwise each assert is its own `ScriptTest`. Either way the reward is
  the fraction of asserts passed. IOCases compare like the grader does: floats to 1e-6, tuples equal to lists, bools
  only to bools. Arguments must survive JSON unchanged (no tuples, sets, bytes), else the row uses ScriptTests. The
  instruction shows the first assert as an example. The expert writes ``code``.

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
  at run time on a read-only root, and files that the agent's own code hard-wires to ``/app``.
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

__all__ = ["TaskFileError", "load_jsonl_tasks", "load_harbor_task", "load_harbor_tasks"]

_GRADER_DIR = ".agentrl_grader"  # where hidden test files go (the grader empties it before writing them)
_SOLUTION_DIR = ".agentrl_solution"  # where a terminal task's solution files go for the expert's commands
_SCRIPT_TEST_WALL_S = 10.0  # HumanEval / MBPP test programs (the reference harnesses allow a few seconds)
_HARBOR_WALL_S = 120.0  # a Harbor / terminal-bench test without a timeout in its config
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


# Shared by the HumanEval and MBPP test programs: read the nonce before any solution code runs, keep the real stdout
# for the nonce alone, load the solution's names as the reference harnesses do (prompt, completion and test share one
# namespace).
_PY_PRELUDE = '''"""Hidden test (written by agentrl's task loader)."""
import os
import sys

_agentrl_nonce = sys.stdin.readline().strip()
_agentrl_out = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
sys.path[0] = os.getcwd()
if not os.path.isfile("solution.py"):
    sys.exit("solution.py not found in the workspace")
import solution as _agentrl_solution

globals().update({k: v for k, v in vars(_agentrl_solution).items() if not k.startswith("__")})
if not callable(globals().get(%(entry)r)):
    sys.exit("solution.py defines no function %(entry)s")

'''
_PY_EPILOGUE = '''

_agentrl_out.write(_agentrl_nonce + "\\n")
_agentrl_out.flush()
'''


def _python_test(entry_point: str, body: str) -> str:
    return _PY_PRELUDE % {"entry": entry_point} + body.rstrip() + "\n" + _PY_EPILOGUE


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
    script = ScriptTest(name="check", argv=("python3", program),
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
    scripts = tuple(ScriptTest(name=f"assert {i + 1}", argv=("python3", f"{_GRADER_DIR}/assert_{i + 1}.py"),
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
    test = ScriptTest(name="test.sh", argv=("python3", f"{_GRADER_DIR}/task_script.py", "test", "harbor", workdir),
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
                 '#!/bin/bash\npython3 -m pytest "$TEST_DIR/test_outputs.py" -rA\n')
    tests = {f"{_GRADER_DIR}/tests/{path}": text for path, text in _tree(folder / "tests").items()}
    workdir = _dockerfile_workdir(folder / "Dockerfile")
    test = ScriptTest(name="run-tests.sh",
                      argv=("python3", f"{_GRADER_DIR}/task_script.py", "test", "terminal-bench", workdir),
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
    if value is None:
        return _HARBOR_WALL_S
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise TaskFileError(f"{path}: field {field!r} must be a positive number of seconds, got {value!r}")
    return float(value)


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
    folder = os.path.join(here, ".agentrl_grader" if mode == "test" else ".agentrl_solution")
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
    env.setdefault("HOME", "/tmp")
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
