"""The code env's tasks and grader: the procedural generator, the HumanEval/MBPP/Harbor loaders, hidden-test grading.

Grading runs in helper sandboxes: bubblewrap where it works here, else the (unprotected) subprocess back-end, else a
minimal test-only sandbox defined below; every program they run is this file's own.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from agentrl.envs.code.grading import (
    TestReport,
    files_tar,
    grade,
    grade_reference,
    values_match,
)
from agentrl.envs.code.sandbox.base import ExecResult, Sandbox, SandboxLimits
from agentrl.envs.code.tasks import (
    FAMILIES,
    LEVELS,
    CodeTask,
    IOCase,
    ScriptTest,
    TaskFileError,
    generate_task,
    load_harbor_task,
    load_harbor_tasks,
    load_jsonl_tasks,
    split_of,
)
from agentrl.envs.code.tasks import generator as generator_module
from agentrl.envs.code.tasks.generator import _reference

DATA = Path(__file__).resolve().parent / "data" / "code_tasks"


# ---- sandboxes ----------------------------------------------------------------------------------------------------


class _LocalSandbox(Sandbox):
    """Test-only fallback: plain child processes in a temp folder (no isolation; runs only this file's programs)."""

    backend = "test-local"

    def __init__(self, limits: SandboxLimits) -> None:
        self.limits = limits
        self.folder = tempfile.mkdtemp(prefix="agentrl-test-ws-")

    def run(self, argv, *, stdin=b"", limits=None, env=None) -> ExecResult:
        limits = limits or self.limits
        start = time.monotonic()
        proc = subprocess.Popen(["prlimit", f"--cpu={limits.cpu_s}", f"--as={limits.memory_mb << 20}", "--",
                                 *argv], cwd=self.folder, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env={"PATH": "/usr/bin:/bin", **(env or {})},
                                start_new_session=True)
        timed_out = False
        try:
            out, err = proc.communicate(stdin, timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        cut = limits.output_bytes
        return ExecResult(None if timed_out else proc.returncode, out[:cut], err[:cut], time.monotonic() - start,
                          timed_out, len(out) > cut or len(err) > cut)

    def export_tree(self, limits=None) -> bytes:
        result = self.run(["tar", "-cf", "-", "."], limits=limits)
        assert result.ok and not result.output_truncated, result
        return result.stdout

    def import_tree(self, tar, limits=None) -> ExecResult:
        return self.run(["tar", "-xf", "-"], stdin=tar, limits=limits)

    def reset(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        os.makedirs(self.folder)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture(scope="module")
def new_sandbox():
    """A factory of fresh empty sandboxes: helper A's bubblewrap back-end if it works here, else fallbacks."""
    limits = SandboxLimits()
    backend = None
    try:
        from agentrl.envs.code.sandbox import BwrapBackend, SubprocessBackend

        backend = BwrapBackend() if BwrapBackend.unavailable_reason() is None else SubprocessBackend(unsafe=True)
    except Exception:  # the back-ends are another module's; the grader must be testable without them
        backend = None
    made: list[Sandbox] = []

    def factory() -> Sandbox:
        sandbox = backend.create(limits) if backend is not None else _LocalSandbox(limits)
        made.append(sandbox)
        return sandbox

    yield factory
    for sandbox in made:
        sandbox.close()
    if backend is not None:
        backend.close()


def _grade_files(task: CodeTask, files: dict[str, str], new_sandbox, **kwargs) -> TestReport:
    return grade(task, files_tar({**task.files, **files}), new_sandbox(), **kwargs)


# ---- the generator ------------------------------------------------------------------------------------------------


def test_registry_has_many_families_and_five_levels():
    assert len(FAMILIES) >= 12
    assert LEVELS == (1, 2, 3, 4, 5)


def test_same_seed_same_task_and_seeds_vary():
    for family in FAMILIES:
        for level in LEVELS:
            first = generate_task(11, split="train", difficulty=level, family=family)
            assert generate_task(np.random.default_rng(11), split="train", difficulty=level, family=family) == first
            others = {generate_task(seed, split="train", difficulty=level, family=family).instruction
                      for seed in range(12, 16)}
            assert first.instruction not in others or len(others) > 1, (family, level)
    drawn = [generate_task(seed) for seed in range(40)]
    assert len({t.family for t in drawn}) >= 8 and len({t.difficulty for t in drawn}) == 5


def test_task_shape():
    for family in FAMILIES:
        for level in LEVELS:
            task = generate_task(3, split="test", difficulty=level, family=family)
            assert task.task_id.startswith(f"procedural/{family}/test/")
            assert (task.family, task.difficulty, task.source) == (family, level, "procedural")
            assert 5 <= len(task.cases) <= 10 and not task.scripts
            assert f"`{task.entry_point}(" in task.instruction and "solution.py" in task.instruction
            assert f"def {task.entry_point}(" in task.solution_files["solution.py"]
            for case in task.cases:
                assert json.loads(json.dumps(list(case.args))) == list(case.args)
                json.dumps(case.expected, allow_nan=False)


def test_bad_generator_arguments_are_named():
    with pytest.raises(ValueError, match="split must be one of"):
        generate_task(0, split="dev")
    with pytest.raises(ValueError, match="difficulty must be one of"):
        generate_task(0, difficulty=6)
    with pytest.raises(ValueError, match="unknown code task family 'nope'"):
        generate_task(0, family="nope")


def test_train_and_test_tasks_never_share_a_definition(monkeypatch):
    """The split is decided by the family's key (its constants), never by names or inputs: the sets are disjoint."""
    last = {}

    def recording(name, family):
        def draw(rng, level):
            last["spec"] = family(rng, level)
            return last["spec"]
        return draw

    for name, family in list(FAMILIES.items()):
        monkeypatch.setitem(generator_module.FAMILIES, name, recording(name, family))
    for name in FAMILIES:
        for level in LEVELS:
            keys = {"train": set(), "test": set()}
            for split, seed in itertools.product(("train", "test"), range(6)):
                task = generate_task(seed, split=split, difficulty=level, family=name)
                assert f"/{split}/" in task.task_id
                key = last["spec"].key
                assert split_of(name, level, key) == split
                keys[split].add(key)
            assert keys["train"] and keys["test"], (name, level)
            assert not keys["train"] & keys["test"], (name, level)


def _balanced(text: str, opening: str) -> bool:
    depth = 0
    for ch in text:
        depth += 1 if ch == opening else -1
        if depth < 0:
            return False
    return depth == 0


def _spec_and_function(family: str, level: int, seed: int):
    spec = FAMILIES[family](np.random.default_rng(seed), level)
    return spec, _reference(spec.source, spec.name)


# Independent brute-force versions of some references, parameterised by the family's key: they catch a reference
# that does not do what its instruction says (the grading sweep alone cannot: the reference defines the cases).
def test_references_agree_with_brute_force():
    rng = np.random.default_rng(0)
    for seed in range(8):
        spec, f = _spec_and_function("arithmetic", 4, seed)
        a, b = spec.key
        for n in [0, 1, 37, 500, int(rng.integers(1000, 3000))]:
            assert f(n) == sum(1 for i in range(1, n + 1) if i % a == 0 or i % b == 0)

        spec, f = _spec_and_function("digits", 5, seed)
        (target,) = spec.key
        lo = int(rng.integers(0, 3000))
        hi = lo + int(rng.integers(0, 3000))
        assert f(lo, hi) == sum(1 for x in range(lo, hi + 1) if sum(map(int, str(x))) == target)

        spec, f = _spec_and_function("brackets", 5, seed)
        o, c = spec.key
        for _ in range(5):
            s = "".join(rng.choice([o, c], size=int(rng.integers(0, 14))))
            assert f(s) == max([j - i for i in range(len(s)) for j in range(i, len(s) + 1)
                                if _balanced(s[i:j], o)], default=0)

        spec, f = _spec_and_function("dynamic_programming", 3, seed)
        (coins,) = spec.key
        for amount in range(0, 70, 7):
            best = min((n for n in range(0, 40) for combo in itertools.combinations_with_replacement(coins, n)
                        if sum(combo) == amount), default=None) if amount < 70 else None
            assert f(amount) == (-1 if best is None else best)

        spec, f = _spec_and_function("counting", 4, seed)
        k, op = spec.key
        nums = [int(x) for x in rng.integers(-30, 30, size=25)]
        pairs = [(nums[i], nums[j]) for i in range(len(nums)) for j in range(i + 1, len(nums))]
        assert f(nums) == sum(1 for x, y in pairs if ((x + y) if op == "sum" else (x - y)) % k == 0)

        spec, f = _spec_and_function("counting", 5, seed)
        mode, param = spec.key
        nums = [int(x) for x in rng.integers(-6, 9, size=20)]
        sums = [sum(nums[i:j]) for i in range(len(nums)) for j in range(i + 1, len(nums) + 1)]
        assert f(nums) == sum(1 for s in sums if (s == param if mode == "equal" else s % param == 0))

        spec, f = _spec_and_function("intervals", 4, seed)
        k, lo, width = spec.key
        ivs = [[int(s), int(s) + int(d)] for s, d in zip(rng.integers(-10, 80, 8), rng.integers(1, 30, 8))]
        assert f(ivs) == sum(1 for x in range(lo, lo + width) if sum(s <= x < e for s, e in ivs) >= k)

        spec, f = _spec_and_function("sorting", 5, seed)
        sep, desc, m = spec.key
        versions = [sep.join(str(int(p)) for p in rng.integers(0, 11, size=int(rng.integers(1, 4))))
                    for _ in range(9)]
        padded = [(tuple(int(p) for p in v.split(sep)) + (0,) * 4)[:4] for v in versions]
        order = sorted(range(len(versions)), key=lambda i: padded[i], reverse=desc)
        assert f(versions) == [versions[i] for i in order if padded[i][0] >= m]

        spec, f = _spec_and_function("run_length", 5, seed)
        pair, mode = spec.key
        text = f"2{pair[0]}ab3{pair[0]}c{pair[1]}{pair[1]}x"
        decoded = "abcccabcccx"
        want = {"string": decoded, "length": len(decoded)}.get(mode, decoded.count(str(mode)))
        assert f(text) == want


def test_instruction_examples_show_reference_values():
    task = generate_task(5, family="strings", difficulty=1)
    function = _reference(task.solution_files["solution.py"], task.entry_point)
    example = [line for line in task.instruction.splitlines() if " returns " in line][0].strip()
    call, shown = example.split(" returns ")
    assert repr(eval(call, {task.entry_point: function})) == shown  # noqa: S307 - our own example text


# ---- the grader: IOCases ------------------------------------------------------------------------------------------

_ADD = CodeTask("test/add", "Write add(a, b).", "test", entry_point="add",
                cases=(IOCase((1, 2), 3), IOCase((2, 2), 4), IOCase((0, 0), 0), IOCase((5, 5), 10)),
                solution_files={"solution.py": "def add(a, b):\n    return a + b\n"})


def test_every_family_and_level_is_solved_by_its_reference(new_sandbox):
    for i, (family, level) in enumerate(itertools.product(FAMILIES, LEVELS)):
        task = generate_task(i, split=("train", "test")[i % 2], difficulty=level, family=family)
        report = grade_reference(task, new_sandbox)
        assert report.all_passed and report.fraction == 1.0, (task.task_id, report.summary())


@pytest.mark.slow
def test_references_pass_over_many_seeds(new_sandbox):
    for seed in range(1, 6):
        for family, level, split in itertools.product(FAMILIES, LEVELS, ("train", "test")):
            task = generate_task(seed * 1000 + level, split=split, difficulty=level, family=family)
            report = grade_reference(task, new_sandbox)
            assert report.all_passed, (task.task_id, report.summary())


def test_wrong_solution_gets_partial_credit_with_details(new_sandbox):
    report = _grade_files(_ADD, {"solution.py": "def add(a, b):\n    return a * b\n"}, new_sandbox)
    assert (report.passed, report.total, report.fraction, report.all_passed) == (2, 4, 0.5, False)
    assert [t.passed for t in report.tests] == [False, True, True, False]
    assert report.tests[0].name == "case 1: add(1, 2)" and report.tests[0].detail == "expected 3, got 2"
    assert report.tests[3].detail == "expected 10, got 25"
    assert report.summary().startswith("2/4 hidden tests passed\n- case 1: add(1, 2): expected 3, got 2")


def test_generated_task_partial_credit(new_sandbox):
    task = generate_task(2, family="arithmetic", difficulty=1)
    reference = task.solution_files["solution.py"]
    wrong = reference.replace("return", "if x == 0:\n        return -12345\n    return", 1)
    report = _grade_files(task, {"solution.py": wrong}, new_sandbox)
    assert report.total == len(task.cases) and report.passed == report.total - 1
    (failed,) = [t for t in report.tests if not t.passed]
    assert failed.name.endswith("(0)") and failed.detail.endswith("got -12345")


def test_broken_solutions_fail_every_case_with_a_clear_detail(new_sandbox):
    expectations = {
        None: "solution.py not found in the workspace",
        "def add(a, b:\n": "importing solution.py raised SyntaxError",
        "def plus(a, b):\n    return a + b\n": "solution.py defines no function add",
        "import sys\nsys.exit(0)\n": "importing solution.py raised SystemExit",
        "raise RuntimeError('boom')\n": "importing solution.py raised RuntimeError: boom",
        "import os\nos._exit(3)\n": "the process ended while importing solution.py: exit code 3",
    }
    for source, detail in expectations.items():
        files = {} if source is None else {"solution.py": source}
        report = _grade_files(_ADD, files, new_sandbox)
        assert report.passed == 0 and report.total == 4, source
        assert all(t.detail.startswith(detail) for t in report.tests), (source, report.tests[0].detail)


def test_one_bad_case_does_not_sink_the_rest(new_sandbox):
    sources = {
        "def add(a, b):\n    if a == 2:\n        raise ValueError('no twos')\n    return a + b\n":
            "raised ValueError: no twos",
        "import os\ndef add(a, b):\n    if a == 2:\n        os._exit(0)\n    return a + b\n":
            "the process ended during this case: exit code 0",
        "def add(a, b):\n    if a == 2:\n        return {a, b}\n    return a + b\n": "returned a set",
        "def add(a, b):\n    while a == 2:\n        pass\n    return a + b\n": "timed out (over 0.5 s of CPU time)",
        "import time\ndef add(a, b):\n    if a == 2:\n        time.sleep(60)\n    return a + b\n":
            "timed out (over 3 s of wall clock",  # the wall backstop: 4 x 0.5 s + 1 s
        "def add(a, b):\n    if a == 2:\n        try:\n            while True:\n                pass\n"
        "        except BaseException:\n            while True:\n                pass\n    return a + b\n":
            "timed out (",  # the alarm is swallowed: the CPU time bound ends it
    }
    for source, detail in sources.items():
        report = _grade_files(_ADD, {"solution.py": source}, new_sandbox, case_timeout_s=0.5)
        assert [t.passed for t in report.tests] == [True, False, True, True], (source, report.summary())
        assert report.tests[1].detail.startswith(detail), (source, report.tests[1].detail)


def test_printed_fake_results_and_early_exits_do_not_pass(new_sandbox):
    task = CodeTask("test/secret", "Write f(x).", "test", entry_point="f",
                    cases=(IOCase((1,), 1001), IOCase((2,), 1002), IOCase((3,), 1003)),
                    solution_files={"solution.py": "def f(x):\n    return x + 1000\n"})
    forger = (
        "import os, sys\n"
        "for i in range(3):\n"
        "    line = 'value %d %d' % (i, 1001 + i)\n"
        "    print(line); print('PASS', line); os.write(1, (line + '\\n').encode())\n"
        "    sys.__stdout__.write('x ' + line + '\\n')\n"
        "def f(x):\n"
        "    print('all tests passed')\n"
        "    return None\n")
    report = _grade_files(task, {"solution.py": forger}, new_sandbox)
    assert report.passed == 0, report.summary()
    assert all(t.detail.startswith("expected 100") for t in report.tests)
    quitter = "import sys\ndef f(x):\n    print('ok'); sys.exit(0)\n"
    report = _grade_files(task, {"solution.py": quitter}, new_sandbox)
    assert report.passed == 0 and report.tests[0].detail == "raised SystemExit: 0"
    assert grade_reference(task, new_sandbox).all_passed


def test_grader_files_left_in_the_workspace_are_ignored(new_sandbox):
    planted = {".agentrl_grader/run_cases.py": "print('rigged')\n", "solution.py": "def add(a, b):\n    return 0\n"}
    report = _grade_files(_ADD, planted, new_sandbox)
    assert report.passed == 1  # only add(0, 0) == 0: the real runner ran
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, mode in ((".agentrl_grader", 0o755), (".agentrl_grader/locked", 0o000)):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        source = _ADD.solution_files["solution.py"].encode()
        info = tarfile.TarInfo("solution.py")
        info.size = len(source)
        tar.addfile(info, io.BytesIO(source))
    assert grade(_ADD, buffer.getvalue(), new_sandbox()).all_passed  # an unreadable folder there is taken back


def test_values_match():
    assert values_match(3, 3.0) and values_match(0.1 + 0.2, 0.3) and values_match([1, [2, 3]], (1, (2, 3)))
    assert values_match({"a": [1.0000000001]}, {"a": [1.0]}) and values_match(None, None)
    assert not values_match(1, True) and not values_match(True, 1) and not values_match(1.001, 1)
    assert not values_match([1, 2], [1, 2, 3]) and not values_match({"a": 1}, {"b": 1})
    assert not values_match("1", 1) and not values_match(10**400, 10**400 + 1) and values_match(10**400, 10**400)


def test_grade_reference_needs_a_solution(new_sandbox):
    task = CodeTask("test/nosolution", "x", "test", entry_point="f", cases=(IOCase((1,), 1),))
    with pytest.raises(ValueError, match="has no reference solution"):
        grade_reference(task, new_sandbox)


# ---- the grader: ScriptTests --------------------------------------------------------------------------------------


def test_script_test_needs_exit_zero_and_the_nonce(new_sandbox):
    echo = ScriptTest("echoes", ("python3", "t.py"), files={"t.py": "import sys\nprint(sys.stdin.readline())\n"})
    silent = ScriptTest("silent", ("python3", "u.py"), files={"u.py": "print('PASSED deadbeef')\n"})
    failing = ScriptTest("fails", ("python3", "v.py"), files={"v.py": "import sys\nsys.exit('assertion broke')\n"})
    slow = ScriptTest("slow", ("python3", "w.py"), files={"w.py": "import time\ntime.sleep(30)\n"}, wall_s=1.0)
    task = CodeTask("test/scripts", "x", "test", scripts=(echo, silent, failing, slow))
    report = grade(task, files_tar({}), new_sandbox(), nonce_rng=np.random.default_rng(0))
    assert [t.passed for t in report.tests] == [True, False, False, False]
    assert report.tests[1].detail.startswith("exited 0 without printing the pass token")
    assert report.tests[2].detail == "exit 1: assertion broke"
    assert report.tests[3].detail == "timed out after 1 s"


# ---- loaders ------------------------------------------------------------------------------------------------------


def test_humaneval_rows_map_and_grade(new_sandbox):
    tasks = load_jsonl_tasks(DATA / "humaneval_sample.jsonl")
    assert [t.task_id for t in tasks] == ["humaneval/Demo/0", "humaneval/Demo/1", "humaneval/Demo/2"]
    first = tasks[0]
    assert (first.family, first.source, first.entry_point, first.difficulty) == ("humaneval", "humaneval",
                                                                                 "count_vowels", 1)
    assert "def count_vowels(text: str) -> int:" in first.instruction and "solution.py" in first.instruction
    (script,) = first.scripts
    assert not first.cases and script.argv[0] == "python3"
    assert "def check(candidate)" in next(iter(script.files.values()))
    assert first.solution_files["solution.py"].startswith("def count_vowels")
    for task in tasks:  # Demo/1's test calls shift(), a helper the prompt defines: a proxy to the solution's
        assert grade_reference(task, new_sandbox).all_passed, task.task_id
    wrong = _grade_files(first, {"solution.py": "def count_vowels(text):\n    return len(text)\n"}, new_sandbox)
    assert wrong.passed == 0 and "AssertionError" in wrong.tests[0].detail
    quitter = _grade_files(first, {"solution.py": "import sys\nprint('0' * 32)\nsys.exit(0)\n"}, new_sandbox)
    assert quitter.passed == 0 and quitter.tests[0].detail == "exit 1: importing solution.py raised SystemExit: 0"
    quitter = _grade_files(first, {"solution.py": "import sys\ndef count_vowels(t):\n    sys.exit(0)\n"}, new_sandbox)
    assert quitter.passed == 0
    assert quitter.tests[0].detail == "exit 1: the solution failed a call: count_vowels() raised SystemExit: 0"
    missing = _grade_files(first, {}, new_sandbox)
    assert missing.tests[0].detail == "exit 1: solution.py not found in the workspace"


def test_mbpp_rows_become_cases_or_one_script_per_assert(new_sandbox):
    plain, tuples, setup = load_jsonl_tasks(DATA / "mbpp_sample.jsonl")
    assert plain.task_id == "mbpp/901" and plain.entry_point == "sum_squares" and not plain.scripts
    assert [(c.args, c.expected) for c in plain.cases] == [(([1, 2, 3],), 14), (([],), 0), (([-3, 4],), 25)]
    assert "assert sum_squares([1, 2, 3]) == 14" in plain.instruction
    assert "\r" not in plain.solution_files["solution.py"]
    assert tuples.entry_point == "swap_pair" and len(tuples.scripts) == 3 and not tuples.cases  # tuple arguments
    assert setup.entry_point == "circle_area" and len(setup.scripts) == 3  # setup code
    for task in (plain, tuples, setup):
        assert grade_reference(task, new_sandbox).all_passed, task.task_id
    half = "def sum_squares(nums):\n    return sum(n * n for n in nums if n > 0)\n"
    report = _grade_files(plain, {"solution.py": half}, new_sandbox)
    assert report.passed == 2 and report.tests[2].detail == "expected 25, got 16"
    report = _grade_files(tuples, {"solution.py": "def swap_pair(p):\n    return p\n"}, new_sandbox)
    assert [t.passed for t in report.tests] == [False, False, True]
    assert report.tests[0].name == "assert 1" and "AssertionError" in report.tests[0].detail


def test_harbor_and_terminal_bench_folders_map_and_grade(new_sandbox):
    tasks = load_harbor_tasks(DATA)
    assert [t.task_id for t in tasks] == ["harbor/count-errors", "harbor/shout", "terminal-bench/reverse-lines"]
    count, shout, reverse = tasks
    assert count.instruction.startswith("# Count the errors") and "canary" not in count.instruction
    assert "/app is your workspace" in count.instruction
    assert (count.family, count.difficulty, shout.difficulty) == ("harbor", 1, 3)
    assert dict(count.files) == {"server.log": (DATA / "harbor/count-errors/environment/server.log").read_text()}
    (test,) = count.scripts
    assert test.wall_s == 30.0 and test.argv[-3:] == ("test", "harbor", "/app")
    assert ".agentrl_grader/tests/test.sh" in test.files and ".agentrl_grader/tests/check_count.py" in test.files
    assert count.solution_commands and ".agentrl_solution/solve.sh" in count.solution_files
    assert set(reverse.files) == {"input.txt"} and reverse.scripts[0].wall_s == 30.0
    assert reverse.instruction.startswith("The file /app/input.txt")
    for task in tasks:
        assert grade_reference(task, new_sandbox).all_passed, task.task_id
        empty = _grade_files(task, {}, new_sandbox)
        assert empty.passed == 0 and empty.tests[0].detail.startswith("exit 1: failed:"), empty.tests[0].detail
    assert "reward 0.0 from reward.json" in _grade_files(shout, {}, new_sandbox).tests[0].detail
    fixed = _grade_files(count, {"error_count.txt": "2\n"}, new_sandbox)
    assert fixed.all_passed
    assert load_harbor_task(DATA / "harbor" / "shout") == shout


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_malformed_jsonl_names_file_line_and_field(tmp_path):
    good = json.dumps({"task_id": 1, "text": "t", "code": "def f(x): return x", "test_list": ["assert f(1) == 1"]})
    cases = {
        "{not json": "bad.jsonl:1: not valid JSON",
        "[1, 2]": "bad.jsonl:1: a row must be a JSON object",
        json.dumps({"x": 1}): "neither a HumanEval row",
        json.dumps({"task_id": "a", "prompt": "p", "entry_point": "f"}): "field 'test' is missing",
        json.dumps({"task_id": "a", "prompt": "p", "entry_point": "f", "test": "assert 1"}): "must define check",
        json.dumps({"task_id": "a", "prompt": "p", "entry_point": "f x", "test": "def check(c): pass"}):
            "field 'entry_point' must be a Python name",
        json.dumps({"task_id": 1, "text": "t", "test_list": "assert f(1) == 1"}): "field 'test_list' must be",
        json.dumps({"task_id": 1, "text": "t", "test_list": ["assert f(1 =="]}): "field 'test_list' item 0",
        json.dumps({"text": "t", "test_list": ["assert f(1) == 1"]}): "field 'task_id' is missing",
        json.dumps({"task_id": 1, "text": "t", "test_list": ["assert len([1]) == 1"]}): "calls no function",
        good + "\n\n" + good: "bad.jsonl:3: field 'task_id' repeats 'mbpp/1' (first on line 1)",
    }
    for text, message in cases.items():
        path = tmp_path / "bad.jsonl"
        path.write_text(text + "\n")
        with pytest.raises(TaskFileError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            load_jsonl_tasks(path)
    with pytest.raises(TaskFileError, match="no such file"):
        load_jsonl_tasks(tmp_path / "missing.jsonl")
    (tmp_path / "latin1.jsonl").write_bytes(b'{"task_id": "\xe9"}\n')
    with pytest.raises(TaskFileError, match="latin1.jsonl: not UTF-8 text"):
        load_jsonl_tasks(tmp_path / "latin1.jsonl")


def test_malformed_task_folders_name_file_and_field(tmp_path):
    harbor = {"instruction.md": "Do it.\n", "task.toml": "[verifier]\ntimeout_sec = 10\n",
              "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n"}
    assert load_harbor_task(_write(tmp_path / "ok", harbor)).scripts[0].wall_s == 10.0
    broken = {
        "no-test": ({**harbor, "tests/test.sh": None}, "tests/test.sh: missing"),
        "bad-toml": ({**harbor, "task.toml": "[verifier\n"}, "task.toml: not valid TOML"),
        "bad-timeout": ({**harbor, "task.toml": "[verifier]\ntimeout_sec = 'long'\n"},
                        "field 'verifier.timeout_sec' must be a positive number"),
        "bad-level": ({**harbor, "task.toml": "[metadata]\ndifficulty = [1]\n"}, "field 'metadata.difficulty'"),
        "bad-table": ({**harbor, "task.toml": "metadata = 3\n"}, "field 'metadata' must be a table"),
        "empty": ({**harbor, "instruction.md": "<!-- canary GUID x -->\n"}, "instruction.md: empty"),
        "tb-no-instruction": ({"task.yaml": "difficulty: easy\n"}, "task.yaml: field 'instruction' is missing"),
        "tb-bad-yaml": ({"task.yaml": "instruction: [unclosed\n"}, "task.yaml: not valid YAML"),
        "tb-bad-timeout": ({"task.yaml": "instruction: x\nmax_test_timeout_sec: -3\n"},
                           "field 'max_test_timeout_sec' must be a positive number"),
    }
    for name, (files, message) in broken.items():
        folder = _write(tmp_path / name, {k: v for k, v in files.items() if v is not None})
        with pytest.raises(TaskFileError, match=message):
            load_harbor_task(folder)
    binary = _write(tmp_path / "binary", harbor)
    (binary / "environment").mkdir()
    (binary / "environment" / "blob.bin").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TaskFileError, match="blob.bin: not UTF-8 text"):
        load_harbor_task(binary)
    with pytest.raises(TaskFileError, match="not a task folder"):
        load_harbor_task(tmp_path / "binary" / "environment")
    (tmp_path / "nothing").mkdir()
    with pytest.raises(TaskFileError, match="no task folders found"):
        load_harbor_tasks(tmp_path / "nothing")
    old = _write(tmp_path / "old-tb", {"task.yaml": "descriptions:\n  - key: base\n    description: Old style.\n"})
    assert load_harbor_task(old).instruction.startswith("Old style.")


# ---- reward holes a review found (issue 43): each test below fails on the grader before the fix -------------------

# A user site planted in the workspace: under HOME=/workspace it would run first in every Python of the grading call.
_USER_SITES = [f".local/lib/python3.{minor}/site-packages/usercustomize.py" for minor in range(8, 15)]


def _jsonl_task(tmp_path: Path, row: dict) -> CodeTask:
    path = tmp_path / "row.jsonl"
    path.write_text(json.dumps(row) + "\n")
    (task,) = load_jsonl_tasks(path)
    return task


def test_planted_user_site_does_not_run_in_grading(new_sandbox):
    # A Harbor test's Python (tests/check_count.py) that exits 0 at start-up would let test.sh write reward 1.
    count = load_harbor_task(DATA / "harbor" / "count-errors")
    hijack = "import os, sys\nif sys.argv[0].endswith('check_count.py'):\n    os._exit(0)\n"
    report = _grade_files(count, {path: hijack for path in _USER_SITES}, new_sandbox)
    assert report.passed == 0 and "reward 0.0 from reward.txt" in report.tests[0].detail, report.summary()
    first = load_jsonl_tasks(DATA / "humaneval_sample.jsonl")[0]
    # Reads the nonce before the test program does, prints it, and ends the process: a forged pass.
    steal = "import os, sys\nos.write(1, sys.stdin.buffer.readline())\nos._exit(0)\n"
    planted = {path: steal for path in _USER_SITES}
    report = _grade_files(first, {**planted, "solution.py": "def count_vowels(text):\n    return 0\n"}, new_sandbox)
    assert report.passed == 0 and "AssertionError" in report.tests[0].detail, report.summary()


def test_solution_cannot_forge_the_nonce_of_a_script_test(new_sandbox):
    first = load_jsonl_tasks(DATA / "humaneval_sample.jsonl")[0]
    forgers = {  # the old test program's own names, then a generic walk of the process's objects
        "at import": "import __main__\n__main__._agentrl_out.write(__main__._agentrl_nonce + '\\n')\n"
                     "__main__._agentrl_out.flush()\nimport os\nos._exit(0)\n",
        "in the call": "import __main__, os\ndef count_vowels(text):\n"
                       "    out = getattr(__main__, '_agentrl_out', None) or open(os.dup(3), 'w')\n"
                       "    out.write(getattr(__main__, '_agentrl_nonce', '') + '\\n'); out.flush()\n    os._exit(0)\n",
        "from the stack": "import gc, os, re, sys\ndef count_vowels(text):\n"
                          "    seen = [o for o in gc.get_objects() if isinstance(o, dict)]\n"
                          "    for frame in [sys._getframe(i) for i in range(1, 4)]:\n"
                          "        seen.append(frame.f_globals)\n"
                          "    for d in seen:\n"
                          "        for v in list(d.values()):\n"
                          "            if isinstance(v, str) and re.fullmatch('[0-9a-f]{32}', v):\n"
                          "                os.write(1, (v + '\\n').encode()); os.write(4, (v + '\\n').encode())\n"
                          "    os._exit(0)\n",
    }
    for where, source in forgers.items():
        report = _grade_files(first, {"solution.py": source}, new_sandbox)
        assert report.passed == 0, (where, report.summary())


def test_script_test_calls_go_through_literal_proxies(new_sandbox, tmp_path):
    row = {"task_id": "Proxy/0", "entry_point": "half", "prompt": "def half(n):\n    '''n / 2, ValueError if odd'''\n",
           "canonical_solution": "    if n % 2:\n        raise ValueError(n)\n    return n // 2\n",
           "test": "def check(candidate):\n    assert candidate(4) == 2 and candidate(n=10) == 5\n"
                   "    try:\n        candidate(3)\n    except ValueError:\n        pass\n    else:\n"
                   "        assert False\n    try:\n        candidate(5)\n    except:\n        pass\n"}
    task = _jsonl_task(tmp_path, row)
    assert grade_reference(task, new_sandbox).all_passed
    custom = "class Odd(ValueError):\n    pass\ndef half(n):\n    if n % 2:\n        raise Odd(n)\n    return n // 2\n"
    assert _grade_files(task, {"solution.py": custom}, new_sandbox).all_passed  # caught as the built-in base
    bad = {  # solution -> the test's detail; a bare `except:` in the test does not hide a failed call
        "import os\ndef half(n):\n    if n == 5:\n        os._exit(0)\n    if n % 2:\n        raise ValueError(n)\n"
        "    return n // 2\n":
            "half() ended during half() (exit code 0)",
        "def half(n):\n    return (x for x in [n // 2])\n": "half() returned a generator, not a literal",
        "import os\ndef half(n):\n    for fd in range(3, 12):\n        try:\n            os.write(fd, b'value <\\n')\n"
        "        except OSError:\n            pass\n    return n // 2\n": "not a literal in half() (SyntaxError)",
        "def half(n):\n    while True:\n        pass\n": "half() timed out (over 4 s of CPU time)",
    }
    for source, detail in bad.items():
        report = _grade_files(task, {"solution.py": source}, new_sandbox)
        assert report.passed == 0, (source, report.summary())
        assert report.tests[0].detail.startswith("exit 1: the solution failed a call: "), report.tests[0].detail
        assert detail in report.tests[0].detail, report.tests[0].detail


def test_int_expected_needs_an_exact_whole_number(new_sandbox):
    assert not values_match(123456700.0, 123456789) and not values_match(2.0000001, 2) and not values_match(2.5, 2)
    assert values_match(3.0, 3) and values_match(1e20, 10**20) and values_match([2.0, (3,)], [2, [3]])
    assert values_match(3, 3.0) and values_match(3.0000001, 3.0)  # a float expected keeps its tolerance
    task = CodeTask("test/int", "Write f().", "test", entry_point="f", cases=(IOCase((), 123456789),))
    report = grade(task, files_tar({"solution.py": "def f():\n    return 123456700.0\n"}), new_sandbox())
    assert report.tests[0].detail == "expected 123456789, got 123456700.0"


def test_solution_that_rewrites_the_runner_output_cannot_crash_the_host(new_sandbox):
    grab = "import sys\ndef _runner():\n    return sys._getframe(2)\n"
    sources = {
        "emit('start', 10**6)": grab + "def add(a, b):\n    if a == 5:  # the last case: its start is the last one\n"
                                       "        _runner().f_locals['emit']('start', 10**6)\n    return a + b\n",
        "nested json": grab + "def add(a, b):\n    if a == 2:\n        _runner().f_globals['json'].dumps = "
                              "lambda value: '[' * 60000 + ']' * 60000\n    return a + b\n",
    }
    report = _grade_files(_ADD, {"solution.py": sources["emit('start', 10**6)"]}, new_sandbox)
    assert report.total == 4 and report.passed == 4, report.summary()
    report = _grade_files(_ADD, {"solution.py": sources["nested json"]}, new_sandbox)
    assert [t.passed for t in report.tests] == [True, False, False, False], report.summary()
    assert report.tests[1].detail == "its result line could not be read (RecursionError)"


def test_case_time_is_cpu_time_not_wall_time(new_sandbox):
    sleepy = "import time\ndef add(a, b):\n    time.sleep(1.0)\n    return a + b\n"
    report = _grade_files(_ADD, {"solution.py": sleepy}, new_sandbox, case_timeout_s=0.5)
    assert report.all_passed, report.summary()  # a loaded host (here: sleeping) does not fail a cheap case


def test_task_file_timeouts_are_clamped(tmp_path):
    from agentrl.envs.code.tasks.loaders import MAX_TEST_TIMEOUT_S

    harbor = {"instruction.md": "Do it.\n", "task.toml": "[verifier]\ntimeout_sec = 86400\n",
              "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n"}
    assert load_harbor_task(_write(tmp_path / "h", harbor)).scripts[0].wall_s == MAX_TEST_TIMEOUT_S == 600.0
    tb = _write(tmp_path / "tb", {"task.yaml": "instruction: x\nmax_test_timeout_sec: 36000.0\n"})
    assert load_harbor_task(tb).scripts[0].wall_s == 600.0


def test_default_terminal_bench_command_ignores_workspace_config(tmp_path):
    task = load_harbor_task(_write(tmp_path / "tb", {"task.yaml": "instruction: x\n", "tests/test_outputs.py": "\n"}))
    run_tests = task.scripts[0].files[".agentrl_grader/run-tests.sh"]
    for option in ("python3 -I -m pytest", "-c /dev/null", '--rootdir "$TEST_DIR"', "-p no:cacheprovider",
                   'cd "$TEST_DIR"'):
        assert option in run_tests, option
    assert all(test.argv[:3] == ("python3", "-I", "-B") for test in task.scripts)
