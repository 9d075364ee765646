r"""Graders that cannot be frozen (issue 38, item 2): `agentrl.budget`, the math guards, and the WebShop / GUI bounds.

The budget: a call past its budget is killed (SIGKILL) and the next call works; the caller's other threads run while
it waits; workers carry CPU and memory limits; no worker outlives `close` or a parent killed outright. Math: a
generated corpus of hostile answers (huge powers, towers, factorials, deep brackets, giant numbers, pathological
LaTeX, strings that made the extractor's regexes backtrack) is graded as wrong within the budget; the grade of
normal answers (procedural problems, GSM8K golds, the grader cases) is the same with and without the guarded path;
and a served math env keeps answering ``/health`` and other sessions while a worst-case answer is graded.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl import budget
from agentrl.budget import BudgetExceeded, BudgetPool, run_with_budget
from agentrl.envs.math import MathEnv
from agentrl.envs.math import equivalence as equivalence_module
from agentrl.envs.math import extract as extract_module
from agentrl.envs.math.extract import find_answer
from agentrl.envs.math.generator import generate_problem
from agentrl.envs.math.grading import Grader
from agentrl.envs.math.guards import MAX_DIGITS, costly_answer

BUDGET_S = 3.0
MARGIN_S = 1.5  # a worker's kill, and a loaded 2-core machine
GSM8K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k" / "test.jsonl"
CASES = Path(__file__).parent / "data" / "math_grader_cases.jsonl"
HOSTILE = r"\boxed{9^{4\cdot 9^{7}}}"  # the 24 bytes: ~20 s of GIL-holding big-integer power before


def spin_verifier(gold: str, predicted: str) -> bool:
    """A verifier that, for the answer "spin", holds the GIL in one C call for ~20 s (as sympy did on HOSTILE)."""
    if predicted == "spin":
        pow(9, 4 * 9**7)
    return gold == predicted


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) is not running
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except OSError:
        return False


# ------------------------------------------------------------------------------------------------ agentrl.budget
def test_an_overrun_is_killed_the_caller_keeps_running_and_the_next_call_works():
    with BudgetPool(max_workers=1) as pool:
        assert pool.run(pow, 2, 10, budget_s=5) == 1024
        (first,) = pool.pids
        ticks: list[float] = []
        stop = threading.Event()

        def tick() -> None:
            while not stop.is_set():
                ticks.append(time.monotonic())
                time.sleep(0.01)

        ticker = threading.Thread(target=tick)
        ticker.start()
        started = time.monotonic()
        with pytest.raises(BudgetExceeded) as caught:
            pool.run(pow, 9, 4 * 9**7, budget_s=1.0)  # ~20 s in one C call holding the worker's GIL
        elapsed = time.monotonic() - started
        stop.set()
        ticker.join()
        assert caught.value.reason == "wall" and 1.0 <= elapsed < 1.0 + MARGIN_S
        # The caller waited in select(): its other threads kept ticking (a GIL-holding wait would leave a ~1 s gap).
        assert max(b - a for a, b in zip(ticks, ticks[1:])) < 0.5
        assert not _alive(first)  # killed, not left spinning
        assert pool.run(pow, 3, 3, budget_s=5) == 27  # a fresh worker
        assert pool.pids and first not in pool.pids


def test_exceptions_come_back_and_unpicklable_calls_are_refused_before_they_run():
    with BudgetPool(max_workers=1) as pool:
        with pytest.raises(ValueError, match="invalid literal"):
            pool.run(int, "x", budget_s=5)
        with pytest.raises(TypeError, match="module-level function"):
            pool.run(lambda: 1, budget_s=5)
        with pytest.raises(ValueError, match="budget_s"):
            pool.run(pow, 2, 2, budget_s=float("nan"))
        with pytest.raises(BudgetExceeded) as caught:
            pool.run(os._exit, 3, budget_s=5)
        assert caught.value.reason == "died"
        assert pool.run(pow, 2, 3, budget_s=5) == 8


def test_workers_carry_cpu_and_memory_limits():
    with BudgetPool(max_workers=1) as pool:
        cpu_soft, _ = pool.run(resource.getrlimit, resource.RLIMIT_CPU, budget_s=2)
        memory_soft, _ = pool.run(resource.getrlimit, resource.RLIMIT_AS, budget_s=2)
        assert cpu_soft != resource.RLIM_INFINITY and memory_soft != resource.RLIM_INFINITY
        with pytest.raises(MemoryError):  # 3 GiB past the 2 GiB allowance
            pool.run(bytearray, 3 * 2**30, budget_s=10)


def test_concurrent_callers_share_the_pool_and_no_worker_outlives_close():
    pool = BudgetPool(max_workers=3)
    results: list[int] = []
    threads = [threading.Thread(target=lambda i=i: results.append(pool.run(pow, 2, i, budget_s=10))) for i in range(9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [2**i for i in range(9)]
    pids = pool.pids
    assert 1 <= len(pids) <= 3 and all(_alive(pid) for pid in pids)
    pool.close()
    assert not any(_alive(pid) for pid in pids)
    with pytest.raises(RuntimeError, match="closed"):
        pool.run(pow, 2, 2, budget_s=1)


def test_a_parent_killed_outright_leaves_no_worker_behind():
    script = (
        "import os, sys\n"
        "from agentrl.budget import run_with_budget\n"
        "print(run_with_budget(os.getpid, budget_s=30), flush=True)\n"
        "os._exit(0)\n"  # no atexit, no close: the worker must notice on its own
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    worker = int(done.stdout.split()[-1])
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker)


# --------------------------------------------------------------------------------------- the hostile corpus
def _hostile_corpus(seed: int = 38) -> list[tuple[str, str]]:
    """(family, reply) pairs: answers whose evaluation or extraction used to take seconds to hours."""
    rng = random.Random(seed)
    corpus = [("issue", HOSTILE), ("python tower", r"\boxed{2**2**2**30}"), ("factorial", r"\boxed{99999! + 1}")]
    for _ in range(4):
        a, k, b, e = rng.randint(3, 99), rng.randint(2, 9), rng.randint(3, 99), rng.randint(6, 12)
        corpus.append(("power", f"\\boxed{{{a}^{{{k}\\cdot {b}^{{{e}}}}}}}"))
        corpus.append(("tower", f"\\boxed{{{a}^{{{b}^{{{e}}}}}}}"))
        corpus.append(("python tower", f"The answer is {a}**{b}**{e}**{k}."))
        corpus.append(("factorial", f"\\boxed{{{rng.randint(30_000, 10**9)}! - 1}}"))
        corpus.append(("negative exponent", f"\\boxed{{{a}^{{-{b}^{{{e}}}}}}}"))
        corpus.append(("binomial", f"\\boxed{{\\binom{{10^{{{e}}}}}{{10^{{{e - 3}}}}}}}"))
        corpus.append(("exp", f"\\boxed{{\\exp({b}^{{{e}}})}}"))
        depth = rng.randint(20, 45)
        corpus.append(("nested exponents", "\\boxed{" + "x^{" * depth + "9" + "}" * depth + "}"))
    for depth in (60, 10_000):
        corpus.append(("deep brackets", "\\boxed{" + "(" * depth + "1" + ")" * depth + "}"))
        corpus.append(("deep brackets", "(" * depth + "1" + ")" * depth))
        corpus.append(("frac nesting", "\\boxed{" + "\\frac{" * depth + "1" + "}{2}" * depth + "}"))
        corpus.append(("sqrt nesting", "\\boxed{" + "\\sqrt{" * depth + "2" + "}" * depth + "}"))
        corpus.append(("left-right chain", "\\boxed{" + "\\left(" * depth + "x" + "\\right)" * depth + "}"))
    corpus += [
        ("sqrt chain", "\\boxed{" + "\\sqrt" * 150 + "2}"),
        ("giant number", "\\boxed{" + "9" * 10**6 + "}"),
        ("giant number", "The answer is " + "9" * 10**6),
        ("giant decimal", "\\boxed{0." + "0" * 5_000 + "1}"),
        ("giant power of a literal", "\\boxed{" + "9" * 200 + "^{" + "9" * 50 + "}}"),
        # Strings the extractor's regexes used to backtrack on (exponential, or quadratic in the length).
        ("regex: units", "\\boxed{1" + " a" * 60 + " #}"),
        ("regex: units", "The answer is 1" + " a" * 60 + " #"),
        ("regex: units", "\\boxed{1 " + "a" * 100_000 + "#}"),
        ("regex: unclosed math", "\\(" * 100_000),
        ("regex: unclosed math", "\\[" * 100_000),
        ("regex: unclosed math", "$1 " + "\\(" * 50_000),
        ("regex: dollars", "$1" * 100_000),
        ("regex: spaces", "\\boxed{1" + " " * 100_000 + "x}"),
        ("regex: boxes", "\\boxed{" * 100_000),
        ("regex: phrases", "the answer is " * 20_000),
    ]
    return corpus


CORPUS = _hostile_corpus()


@pytest.fixture(scope="module")
def grader():
    return Grader(budget_s=BUDGET_S)


@pytest.mark.parametrize(("family", "reply"), CORPUS, ids=[f"{i}-{family}" for i, (family, _) in enumerate(CORPUS)])
def test_every_hostile_answer_is_graded_wrong_within_the_budget(grader, family, reply):
    started = time.monotonic()
    grade = grader(reply, ("7",))
    elapsed = time.monotonic() - started
    assert elapsed < BUDGET_S + MARGIN_S, (family, elapsed)
    assert not grade.correct and grade.reward == 0.0
    if family in ("issue", "power", "tower", "python tower", "factorial", "negative exponent", "binomial", "exp"):
        # Refused by a guard, in the worker, long before the budget: no process was killed.
        assert grade.budget_exceeded and grade.answer is not None
        assert "digits" in grade.refused or "too large" in grade.refused
        assert elapsed < BUDGET_S / 2


def test_the_guards_alone_answer_in_microseconds():
    refused = [reply for family, reply in CORPUS if family in ("issue", "power", "tower", "factorial")]
    answers = [find_answer(reply).answer for reply in refused]
    costly_answer.cache_clear()
    started = time.perf_counter()
    verdicts = [costly_answer(answer) for answer in answers]
    per_answer = (time.perf_counter() - started) / len(answers)
    assert all(verdicts) and per_answer < 1e-3  # measured ~20-60 us


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 999), st.integers(2, 99), st.integers(1, 12))
def test_the_power_guard_refuses_every_huge_tower_and_no_moderate_one(a, b, c):
    digits = b**c * math.log10(a)  # a^(b^c) has about this many digits
    refused = costly_answer(f"{a}^{{{b}^{{{c}}}}}") is not None
    if digits > 2 * MAX_DIGITS:
        assert refused
    if digits < MAX_DIGITS / 10:
        assert not refused


def test_a_worker_past_the_budget_is_killed_counted_wrong_and_the_next_grade_works():
    grader = Grader(verifier=spin_verifier, budget_s=1.0)
    assert grader.in_worker
    started = time.monotonic()
    grade = grader(r"\boxed{spin}", ("spin",))
    assert time.monotonic() - started < 1.0 + MARGIN_S
    assert grade.budget_exceeded and not grade.correct and grade.reward == 0.0 and "budget" in grade.refused
    assert grader(r"\boxed{7}", ("7",)).correct


def test_math_env_step_returns_within_the_budget_and_flags_the_answer():
    env = MathEnv(grade_budget_s=BUDGET_S)
    env.reset(seed=0)
    started = time.monotonic()
    obs, reward, terminated, truncated, info = env.step(HOSTILE)
    assert time.monotonic() - started < BUDGET_S + MARGIN_S
    assert (obs, reward, terminated, truncated) == ("Incorrect.", 0.0, True, False)
    assert info["grade_budget_exceeded"] is True and "digits" in info["grade_refused"]
    # A reply killed at the budget is a wrong answer too (not "no answer"), and flagged.
    env = MathEnv(verifier=f"{__name__}:spin_verifier", grade_budget_s=1.0)
    env.reset(seed=0)
    started = time.monotonic()
    obs, reward, terminated, truncated, info = env.step(r"\boxed{spin}")
    assert time.monotonic() - started < 1.0 + MARGIN_S
    assert (obs, reward, terminated, info["grade_budget_exceeded"]) == ("Incorrect.", 0.0, True, True)
    env.reset(seed=0)
    _, reward, _, _, info = env.step(env.expert_action())
    assert reward == 1.0 and info["grade_budget_exceeded"] is False


# ------------------------------------------------------------------------- normal answers grade as before
def _normal_cases() -> list[tuple[str, tuple[str, ...]]]:
    cases = []
    for level in range(1, 6):
        for seed in range(30):
            problem = generate_problem(level, np.random.default_rng(seed), "train")
            answer = problem.answer
            cases += [(f"So \\boxed{{{answer}}}.", problem.golds), (f"The answer is {answer}1.", problem.golds),
                      (f"#### {answer}", problem.golds), (f"I get $-{answer}$", problem.golds)]
    with GSM8K.open() as f:
        for line in list(f)[:150]:
            gold = json.loads(line)["answer"].split("####")[-1].strip()
            cases += [(f"\\boxed{{{gold}}}", (gold,)), (f"The answer is {gold}.5 dollars", (gold,))]
    with CASES.open() as f:
        for line in f:
            case = json.loads(line)
            golds = tuple(case["gold"]) if isinstance(case["gold"], list) else (case["gold"],)
            cases.append((case["response"], golds))
    return cases


def test_normal_answers_grade_the_same_with_and_without_the_guarded_path(monkeypatch):
    guarded = Grader(budget_s=30.0)  # in a worker, with the guards
    cases = _normal_cases()
    worker_grades = [guarded(text, golds) for text, golds in cases]
    # The unguarded path: in this process, the guard switched off (the worker above keeps its own).
    monkeypatch.setattr(equivalence_module, "costly_answer", lambda answer: None)
    plain = Grader(budget_s=None)
    for (text, golds), grade in zip(cases, worker_grades):
        expected = plain(text, golds)
        assert (grade.answer, grade.correct, grade.followed_format, grade.reward) == (
            expected.answer, expected.correct, expected.followed_format, expected.reward), text
        assert grade.refused is None or grade.refused.startswith("symbolic check"), (text, grade.refused)


# ------------------------------------------------------------- the extractor's regexes: linear, same matches
_OLD_MATH_SPAN_RE = re.compile(r"\$\$(.+?)\$\$|(?<!\\)\$(.+?)(?<!\\)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
_OLD_UNIT_TAIL_RE = re.compile(
    r"^(?:\s*(?:\\?%|\\?\$|\\[,;!]|\^\s*\{?\\circ\}?|°|\\circ|\s*[A-Za-z][A-Za-z'\-]*(?:\^\d)?|\.))*\s*$"
)
_PIECES = st.sampled_from(list("$\\()[]ab1 .,%^{}°;!'-\n") + ["\\(", "\\)", "\\[", "\\]", "$$", "\\$", "\\circ"])


@settings(max_examples=2000, deadline=None)
@given(st.lists(_PIECES, max_size=24).map("".join))
def test_the_linear_extractor_finds_what_the_old_regexes_found(text):
    old_spans = [(m.start(), m.end(), next(g for g in m.groups() if g is not None))
                 for m in _OLD_MATH_SPAN_RE.finditer(text)]
    assert extract_module._math_spans(text) == old_spans
    assert bool(extract_module._UNIT_TAIL_RE.match(text)) == bool(_OLD_UNIT_TAIL_RE.match(text))


def test_the_extractor_is_linear_on_strings_that_made_it_backtrack():
    for text in ("\\boxed{1" + " a" * 40 + " #}", "\\(" * 100_000, "The answer is 1" + " a" * 40 + " #"):
        started = time.perf_counter()
        find_answer(text)
        assert time.perf_counter() - started < 1.0  # before: hours, ~90 s and hours


# ------------------------------------------------------------------------------------------ the env server
def _warm_workers(count: int) -> None:
    threads = [threading.Thread(target=run_with_budget, args=(time.sleep, 0.3), kwargs={"budget_s": 60})
               for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_a_served_math_env_answers_health_and_other_sessions_while_a_worst_case_answer_is_graded():
    httpx = pytest.importorskip("httpx")
    from agentrl.envs.server import ServeSettings, start_server

    kwargs = {"verifier": f"{__name__}:spin_verifier", "grade_budget_s": 4.0}
    with start_server(ServeSettings("math", kwargs=kwargs, port=0)) as server:
        base, client = server.url, httpx.Client(timeout=30)
        sessions = [client.post(base + "/sessions", json={}).json()["session"] for _ in range(2)]
        for sid in sessions:
            assert client.post(f"{base}/sessions/{sid}/reset", json={"seed": 0, "seq": 1}).status_code == 200
        _warm_workers(budget.default_pool().max_workers)
        answers: dict[str, object] = {}

        def worst_case() -> None:
            started = time.monotonic()
            response = client.post(f"{base}/sessions/{sessions[0]}/step", json={"action": r"\boxed{spin}", "seq": 2})
            answers["worst"], answers["seconds"] = response.json(), time.monotonic() - started

        grading = threading.Thread(target=worst_case)
        grading.start()
        time.sleep(0.5)  # the worst case is now in its worker
        for _ in range(3):
            started = time.monotonic()
            assert client.get(base + "/health").status_code == 200
            assert time.monotonic() - started < 1.0
        started = time.monotonic()
        other = client.post(f"{base}/sessions/{sessions[1]}/step", json={"action": r"\boxed{7}", "seq": 2})
        assert other.status_code == 200 and time.monotonic() - started < 1.0
        assert grading.is_alive()  # the worst case was still being graded all along
        grading.join()
        worst = answers["worst"]
        assert worst["reward"] == 0.0 and worst["terminated"] and worst["info"]["grade_budget_exceeded"] is True
        assert answers["seconds"] < 4.0 + MARGIN_S
        client.close()


# ---------------------------------------------------------------------------------------- the GUI's checker
def test_gui_actions_read_in_linear_time_and_the_worst_answer_checks_fast():
    from agentrl.envs.gui import GuiEnv
    from agentrl.envs.gui.actions import MAX_TEXT_CHARS, ActionError, parse_action

    worst = ["a" * 200_000, "a(" * 100_000, "a(" * 100_000 + ")", "tap(\n" * 100_000,
             '{"action_type": "answer", "text": ' + "[" * 100_000 + "]" * 100_000 + "}",
             'type("' + "x" * 10**6 + '")']
    for action in worst:
        started = time.perf_counter()
        with pytest.raises(ActionError):
            parse_action(action)
        assert time.perf_counter() - started < 0.5  # before: 4.5 s for 20,000 letters; RecursionError for the JSON
    env = GuiEnv(task_types=["contact_phone"], screenshots=False)
    env.reset(seed=0)
    env.step('answer("0")')  # starts the checker's budget worker (once, ~0.3 s): the timing below is the check's
    env.reset(seed=0)
    obs, *_ = env.step('{"action_type": "answer", "text": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert "nested too deeply" in obs  # an invalid action, not a crash
    started = time.perf_counter()
    _, reward, terminated, _, info = env.step(f'answer("{"5" * MAX_TEXT_CHARS}")')  # the checker reads it
    assert time.perf_counter() - started < 0.5 and terminated and reward == 0.0 and info["success"] is False


# ------------------------------------------------------------------------------------------ WebShop's reward
def test_webshop_scoring_is_bounded_by_the_catalogue():
    from agentrl.envs.webshop import WebShopEnv
    from agentrl.envs.webshop.reward import MAX_OPTIONS, score_breakdown

    env = WebShopEnv(num_products=300)
    env.reset(seed=0)
    products = env.resource.products
    slowest = 0.0
    for index in range(len(products)):  # every product an action can buy, every option value it can pick last
        product = products[index]
        chosen = {name: values[-1] for name, values in (product.get("options") or {}).items() if values}
        started = time.perf_counter()
        score_breakdown(env.goal, product, chosen, env.noun_tagger)
        slowest = max(slowest, time.perf_counter() - started)
    assert slowest < 0.25  # measured: median ~50 us, worst ~13 ms
    with pytest.raises(ValueError, match="options"):
        score_breakdown(env.goal, products[0], {f"o{i}": "x" for i in range(MAX_OPTIONS + 1)})
    with pytest.raises(ValueError, match="characters"):
        score_breakdown(env.goal, products[0], {"size": "x" * 10**6})


# ------------------------------------------------------------------------- counted in a rollout's metrics

class _FixedReplyEngine:
    """Replies the same text to every prompt (a policy that writes one hostile answer)."""

    def __init__(self, tokenizer, text: str):
        from agentrl.engine.base import Generation

        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        ids = tuple(tokenizer(text, add_special_tokens=False)["input_ids"]) + (end,)
        self.reply = Generation(ids, tuple(-0.5 for _ in ids), "stop")
        self.policy_version = 0

    def generate(self, prompts, params):
        return [self.reply for _ in prompts]

    def update_weights(self, named_tensors, version: int) -> None:
        self.policy_version = version

    def metrics(self) -> dict[str, float]:
        return {}

    def clear_cache(self) -> None:
        pass


def test_a_rollout_counts_the_grades_that_hit_the_budget(qwen3_tokenizer):
    from agentrl.engine.base import SamplingParams
    from agentrl.engine.requests import BatchedRequests
    from agentrl.rollout.loop import run_rollout
    from agentrl.rollout.pool import EnvMaker, LocalPool

    for reply, counted in ((r"\boxed{9^{4\cdot 9^{7}}}", 4), (r"\boxed{3}", 0)):
        with LocalPool(EnvMaker("math"), slots=2) as pool:
            result = run_rollout(pool, "math", [0, 1], 2, BatchedRequests(_FixedReplyEngine(qwen3_tokenizer, reply)),
                                 qwen3_tokenizer, SamplingParams(temperature=0, seed=1), max_turns=1)
        assert len(result.trajectories) == 4 and result.stats.errors == 0
        assert result.stats.metrics()["grades_over_budget"] == counted
        if counted:
            assert all(t.total_return == 0.0 and not t.success for t in result.trajectories)
