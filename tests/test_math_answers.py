"""Answer extraction and equivalence for the math env."""

from __future__ import annotations

import doctest
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from agentrl.envs.math import answers_match, equivalence, extract, extract_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so the result is \boxed{42}.", "42"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"First \boxed{3}. Hmm, no: \boxed{4}", "4"),  # several boxed answers: the last one
        (r"\boxed{\sqrt{\frac{a}{b}}} done", r"\sqrt{\frac{a}{b}}"),  # nested braces
        (r"\boxed{18 \text{ dollars}}", "18"),
        (r"\boxed{3\pi}", r"3\pi"),  # a unit-less LaTeX tail is kept for the symbolic check
        ("\\boxed 7", "7"),
        (r"\boxed{ oops \boxed{5}", "5"),  # an unclosed box is skipped
        ("Janet makes 9 * 2 = $18 a day.\n#### 18", "18"),
        ("#### 1,234", "1234"),
        ("The answer is $1,250 dollars.", "1250"),
        ("The answer is 3.5.", "3.5"),
        ("Final answer: 50%", "50"),
        ("The answer is: $\\frac{1}{2}$", r"\frac{1}{2}"),
        ("Answer: 5 + 3 = 8", "8"),
        ("It is 18 dollars", "18"),
        ("the temperature falls to -7 degrees", "-7"),
        ("10-3=7", "7"),  # binary minus is not a sign
        ("she ate 3/4 of the pie", "3/4"),
        ("It costs $1,000,000.", "1000000"),
        (r"\boxed{5} but the answer is 6", "5"),  # boxed outranks "the answer is"
        ("#### 12\nthe answer is 13", "12"),  # #### outranks "the answer is"
        ("The answer is unclear, maybe 4", "4"),  # a phrase without a value falls through to the last number
    ],
)
def test_extract_answer(text: str, expected: str) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text", ["", "I have no idea.", "The answer is unknown", "\\boxed{}"])
def test_extract_answer_none_when_nothing_stated(text: str) -> None:
    assert extract_answer(text) is None


@pytest.mark.parametrize("junk", ["\\boxed{" * 2000, "the answer is (" + ", x" * 3000, "answer is ( , " * 800])
def test_extract_answer_is_fast_on_long_junk(junk: str) -> None:
    start = time.perf_counter()
    extract_answer(junk)
    assert time.perf_counter() - start < 0.25


def test_extract_answer_rejects_non_strings() -> None:
    with pytest.raises(TypeError, match="expects a str"):
        extract_answer(42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("gold", "predicted"),
    [
        ("0.5", "1/2"),
        (r"\frac{1}{2}", "0.5"),
        (r"\frac12", r"\dfrac{1}{2}"),
        ("1000", "1,000"),
        ("18", "18.00"),
        ("-3", "−3"),
        ("2", r"\sqrt{4}"),
        (r"\frac{\sqrt{3}}{2}", r"\frac{\sqrt3}{2}"),
        (r"3\pi", r"3 \pi"),
        ("[2, 5)", "[2,5)"),
    ],
)
def test_answers_match_equivalent(gold: str, predicted: str) -> None:
    assert answers_match(gold, predicted)


@pytest.mark.parametrize(
    ("gold", "predicted"),
    [("18", "17"), ("0.5", "1/3"), ("1000", "100"), ("2", r"\sqrt{5}"), ("5", "x"), ("5", None), ("3", "")],
)
def test_answers_match_different(gold: str, predicted: str | None) -> None:
    assert not answers_match(gold, predicted)


@pytest.mark.parametrize(
    ("text", "gold"),
    [
        (r"So each gets \boxed{\frac{1}{2}} of a pizza", "0.5"),
        ("The total is 1,250 dollars.\n#### 1,250", "1250"),
        ("Therefore the answer is $18.", "18"),
        ("The final answer is 12 apples", "12"),
    ],
)
def test_extract_then_match(text: str, gold: str) -> None:
    assert answers_match(gold, extract_answer(text))


def _symbolic_case() -> bool:
    # \sqrt forces the math-verify path (not the numeric fast path), which is what breaks off the main thread.
    return answers_match(r"\frac{\sqrt{3}}{2}", r"\frac{\sqrt3}{2}") and not answers_match("2", r"\sqrt{5}")


def test_answers_match_off_the_main_thread() -> None:
    results: list[bool] = []
    worker = threading.Thread(target=lambda: results.append(_symbolic_case()))
    worker.start()
    worker.join(timeout=30)
    assert results == [True]
    with ThreadPoolExecutor(max_workers=2) as pool:  # how Ray actors and async runners call it
        assert all(pool.map(lambda _: _symbolic_case(), range(4)))


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs POSIX interval timers")
def test_answers_match_leaves_the_callers_alarm_alone() -> None:
    # math-verify's own timeout calls signal.alarm, which would cancel a timer the caller (pytest-timeout) set.
    previous = signal.signal(signal.SIGALRM, lambda *_: None)
    try:
        signal.setitimer(signal.ITIMER_REAL, 30)
        assert _symbolic_case()
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_answers_match_bounds_time(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    def hanging_verify(gold: str, predicted: str) -> bool:
        release.wait(10)
        return True

    monkeypatch.setattr(equivalence, "_math_verify", hanging_verify)
    try:
        start = time.perf_counter()
        assert not answers_match(r"\sqrt{2}", r"\sqrt{2}+0", timeout_s=0.1)
        assert time.perf_counter() - start < 2
        # Past the cap of abandoned checks, new symbolic checks are refused at once.
        for _ in range(equivalence.MAX_ABANDONED_CHECKS):
            answers_match(r"\sqrt{2}", r"\sqrt{2}+0", timeout_s=0.05)
        start = time.perf_counter()
        assert not answers_match(r"\sqrt{2}", r"\sqrt{2}+0", timeout_s=5)
        assert time.perf_counter() - start < 1
        assert answers_match("7", "7.0")  # the numeric path never needs a worker
    finally:
        release.set()
    deadline = time.monotonic() + 5
    while any(t.is_alive() for t in equivalence._abandoned) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_numeric_check_is_fast() -> None:
    start = time.perf_counter()
    for i in range(2000):
        answers_match(str(i), f"{i}.0")
    assert (time.perf_counter() - start) / 2000 < 1e-3


@pytest.mark.parametrize("module", [extract, equivalence])
def test_docstring_examples(module: object) -> None:
    failures, tried = doctest.testmod(module)  # type: ignore[arg-type]
    assert tried > 0 and failures == 0


# ---- the defects of issue 16, one hand-worked case each --------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # The Minerva / lm-eval format: the phrase rule used to swallow the sentence ('The final answer is $24').
        ("Final Answer: The final answer is $24$. I hope it is correct.", "24"),
        # ... also after boxed intermediate results: the stated final answer wins over the last box.
        (r"so $0.04 \cdot 100 = \boxed{4}$. Final Answer: The final answer is $10,455$. I hope it is correct.",
         "10455"),
        # Prose after "Answer:" is not a value and no longer blocks the fallbacks.
        ("Answer: we need to be careful here.\nThe total is 7 + 5 = 12 apples.", "12"),
        ("Final Answer: The largest $n$ is 34.", "34"),
        # The last math span, not the last number inside it.
        ("So the ordered pair is $(7, 6)$.", "(7, 6)"),
        (r"The product is $\begin{pmatrix} 1 & 0 \\ 0 & 1 \end{pmatrix}$.",
         r"\begin{pmatrix} 1 & 0 \\ 0 & 1 \end{pmatrix}"),
        ("The solution set is $x \\geq 5$.", "x \\geq 5"),
        ("We get $a = 3$, so the farmer has 12 apples.", "12"),  # a later number outside math wins
        ("Since $2 + 3 = 5$, we are done.", "5"),  # arithmetic: the value after "="
        ("Hence $y = 2x + 1$.", "y = 2x + 1"),  # an equation with variables stays whole
        ("Thus $x <= 2$ is our answer.", "x \\leq  2"),  # ASCII relations in the LaTeX math-verify reads
        # Several boxes in a row form one answer; a correction does not.
        (r"The roots are \boxed{1}, \boxed{2}.", "1, 2"),
        (r"x = \boxed{1} and x = \boxed{-3}", "-3"),  # "x =" between them: not a bare list
        # Thousands separators in LaTeX.
        (r"The population is \boxed{1\,000\,000}.", "1000000"),
        (r"\boxed{1{,}234}", "1234"),
        (r"\boxed{32, 349}", "32, 349"),  # comma-space: a list, not 32349
        # Units and degrees.
        (r"\boxed{90^\circ}", "90"),
        (r"\boxed{\text{E}}", "E"),
        # A bare answer is the whole reply.
        (r"-\frac{10}{9}", r"-\frac{10}{9}"),
        ("AZYUK2A", None),  # a digit glued to letters is not a number
    ],
)
def test_issue_16_extraction_defects(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("gold", "predicted", "expected"),
    [
        ("1000000", r"1\,000\,000", True),
        ("1000", "1 000", True),  # a space between groups of three
        ("32349", "32, 349", False),  # a list
        (r"\frac{1}{12}", "0.0833333333333333", True),  # decimals compare rounded to 6 places, like math-verify
        (r"\frac{\sqrt3}{2}", "0.866025", True),  # ... which the symbolic path already did
        (r"\frac{1}{3}", "0.33", False),  # 0.333333 != 0.330000
        ("18 dollars", "18", True),  # the gold is cleaned like the prediction
        (r"\boxed{24}", "24", True),
        ("$\\frac{1}{2}$", "0.5", True),
        (r"\boxed{1} and \boxed{2}", "1, 2", True),  # a gold's boxes separated by a word form a list
        ("\\text{odd}", "odd", True),
        (None, "4", False),
        ("", "4", False),
    ],
)
def test_issue_16_equivalence_defects(gold: str | None, predicted: str, expected: bool) -> None:
    assert answers_match(gold, predicted) is expected  # type: ignore[arg-type]


def test_find_answer_names_its_rule_and_strict_reads_only_boxes() -> None:
    from agentrl.envs.math import find_answer

    assert find_answer(r"so \boxed{4}").rule == "boxed"
    assert find_answer("work\n#### 4").rule == "hashes"
    assert find_answer("The answer is 4.").rule == "phrase"
    assert find_answer("the pair is $(1, 2)$").rule == "math"
    assert find_answer("so we get 4 apples").rule == "number"
    assert find_answer("The answer is 4.", strict=True) is None
    assert find_answer(r"The answer is \boxed{4}.", strict=True).answer == "4"
