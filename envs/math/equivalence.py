r"""Answer equivalence: `answers_match(gold, predicted)`, exact for numbers, math-verify for the rest, time-bounded.

Both answers are cleaned alike first (`normalize_answer`: a ``\boxed{}`` is unwrapped, math delimiters go,
"18 dollars" becomes 18; extraction cleans predictions the same way), then two paths, cheapest first:

1. Both answers are plain numbers (integers, decimals, ``a/b``, ``\frac{a}{b}``, thousands separators ``1,000``,
   ``1\,000``, ``1{,}000``, ``1 000``): compare them exactly as fractions, and when either is written as a decimal
   with a fractional part, also rounded to `FLOAT_ROUNDING` places, which is what math-verify does for floats
   (``0.0833333333333333`` equals ``\frac{1}{12}`` on both paths). This covers GSM8K and the procedural problems
   and takes microseconds.
2. Otherwise math-verify (``verify(parse(gold), parse(pred))``, gold first) compares them symbolically, unless
   `costly_answer` refuses the prediction first (a power of millions of digits, a huge factorial, 50-deep brackets,
   over 1,000 characters): it then counts as no match, and `compare_answers` says why in `Match.refused`.

Why a worker thread: math-verify bounds its own time with ``signal.alarm``, which only works on the main thread of
the main interpreter (it raises inside Ray workers, thread pools, async runners) and would also cancel any alarm
the caller set (pytest-timeout's, for one). So we always call it with its timeouts off and run it on a short-lived
daemon thread that we wait on for at most `timeout_s`. A call that overruns is abandoned and counts as "no match".
Python cannot kill a thread, so an abandoned call keeps a core busy until sympy returns; to keep a pathological
answer stream from piling these up, symbolic checks are refused (answer: no match) while `MAX_ABANDONED_CHECKS`
of them are still running. Work that holds the GIL inside one C call (a big-integer power) cannot be bounded by a
thread at all: `MathEnv` therefore grades in a worker process under a hard budget (`agentrl.budget`), and the guards
above keep the common hostile answers from getting that far.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TypeVar

from .extract import boxed_list, clean_answer
from .guards import costly_answer

__all__ = [
    "FLOAT_ROUNDING",
    "MAX_ABANDONED_CHECKS",
    "Match",
    "answers_match",
    "as_number",
    "compare_answers",
    "match_any",
    "normalize_answer",
]

FLOAT_ROUNDING = 6
"""Decimal places at which a decimal answer is compared with an exact one (math-verify's default)."""

MAX_ABANDONED_CHECKS = 4
"""Symbolic checks still running after their time ran out, beyond which new symbolic checks are refused."""

_logger = logging.getLogger(__name__)
_abandoned: list[threading.Thread] = []
_abandoned_lock = threading.Lock()

_PLAIN_NUMBER_RE = re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+)?$")
_DECIMAL_RE = re.compile(r"\.\d")
# Thousands separators: ",", "\,", "{,}", "\ " or "\!" between groups of three; a plain space only when every
# group is separated by one ("1 000 000"), so "32, 349" (a list) is never a number.
_GROUPED_RE = re.compile(
    r"^[-+]?\d{1,3}(?:(?:,|\\,|\{,\}|\\ |\\!)\d{3})+(?:\.\d+)?$|^[-+]?\d{1,3}(?: \d{3})+(?:\.\d+)?$"
)
_GROUP_SEPARATOR_RE = re.compile(r",|\\,|\{,\}|\\ |\\!| ")
# Each run of spaces is tried once, from its start, and never given back (possessive): "1" + 10^5 spaces stays linear.
_OPERATOR_SPACE_RE = re.compile(r"(?<=[-+])\s++|(?<!\s)\s++(?=/)|(?<=/)\s++")
_LATEX_FRACTION_RE = re.compile(r"^([-+]?)\\[dt]?frac\s*(?:\{\s*([-+]?\d+)\s*\}|(\d))\s*(?:\{\s*(\d+)\s*\}|(\d))$")
_T = TypeVar("_T")


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once that its timeout is off; we bound the time ourselves, so the warning is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())


def as_number(answer: str) -> Fraction | None:
    r"""The exact value of a plain numeric answer, or None when it is not one.

    Accepts integers, decimals, thousands separators, ``a/b``, ``\frac{a}{b}`` (``\dfrac``, ``\tfrac``,
    ``\frac12``) and a leading ``$``. A trailing ``%`` is not a plain number (50% could mean 50 or 0.5), so it
    goes to the symbolic check.

    Examples:
        >>> as_number("1,000.5")
        Fraction(2001, 2)
        >>> as_number("-\\frac{3}{4}")
        Fraction(-3, 4)
        >>> as_number("1\\,000\\,000")
        Fraction(1000000, 1)
        >>> as_number("32, 349") is None  # a list, not thirty-two thousand
        True
        >>> as_number("2x") is None
        True
    """
    text = answer.strip()
    if "−" in text or "$" in text:
        text = text.replace("−", "-").replace("\\$", "").lstrip("$").strip()
    if not _PLAIN_NUMBER_RE.match(text):  # the common plain case skips the rewriting below
        if _GROUPED_RE.match(text):
            text = _GROUP_SEPARATOR_RE.sub("", text)
        text = _OPERATOR_SPACE_RE.sub("", text)
    try:
        if _PLAIN_NUMBER_RE.match(text):
            return Fraction(text)
        match = _LATEX_FRACTION_RE.match(text)
        if match:
            sign, num_braced, num_digit, den_braced, den_digit = match.groups()
            value = Fraction(int(num_braced or num_digit), int(den_braced or den_digit))
            return -value if sign == "-" else value
    except (ValueError, ZeroDivisionError):  # "1/0", "5."-like oddities: not a plain number after all
        return None
    return None


@dataclass(frozen=True)
class Match:
    """The verdict of `compare_answers`.

    Attributes:
        equal: the answers are equivalent.
        refused: why the prediction was counted as no match without evaluating it symbolically (`costly_answer`'s
            reason, or "symbolic check ran past N s"); None when it was judged on its merits.
    """

    equal: bool
    refused: str | None = None


def answers_match(gold: str, predicted: str | None, timeout_s: float = 2.0) -> bool:
    r"""True when `predicted` is mathematically equivalent to `gold`; safe to call from any thread.

    Args:
        gold: the reference answer (a number or LaTeX, without ``\boxed``).
        predicted: the extracted model answer; None (nothing extracted) never matches.
        timeout_s: the most seconds the symbolic check may take; past it the answer counts as wrong.

    Returns:
        Whether the answers are equivalent. Never raises on bad answers: unparseable text simply does not match.

    Examples:
        >>> answers_match("0.5", "1/2")
        True
        >>> answers_match("18", "18.00")
        True
        >>> answers_match("18", "17")
        False
    """
    return compare_answers(gold, predicted, timeout_s).equal


def compare_answers(gold: str, predicted: str | None, timeout_s: float = 2.0) -> Match:
    r"""`answers_match`, saying also when the prediction was refused as too costly to evaluate (see `Match`).

    Examples:
        >>> compare_answers("5", "2+3")
        Match(equal=True, refused=None)
        >>> compare_answers("5", r"9^{4\cdot 9^{7}}")
        Match(equal=False, refused='a number of about 18,256,449 digits')
    """
    if predicted is None or gold is None:
        return Match(False)
    # The common case first: two plain numbers need no cleaning (microseconds per check).
    numeric = _numbers_match(gold, predicted)
    if numeric is not None:
        return Match(numeric)
    gold, predicted = normalize_answer(gold), normalize_answer(predicted)
    if not gold or not predicted:
        return Match(False)
    if _squash(gold) == _squash(predicted):
        return Match(True)
    numeric = _numbers_match(gold, predicted)
    if numeric is not None:
        return Match(numeric)
    refused = costly_answer(predicted)  # the gold is the operator's; only the model's answer is guarded
    if refused is not None:
        return Match(False, refused)
    _import_math_verify()  # outside the timed thread: the first import alone can take seconds on a busy machine
    finished, verdict = _run_bounded(lambda: _math_verify(gold, predicted), timeout_s)
    return Match(bool(verdict), None if finished else f"symbolic check ran past {timeout_s:g} s")


def match_any(golds: Sequence[str], predicted: str | None, timeout_s: float = 2.0) -> bool:
    """True when `predicted` matches any of several acceptable gold answers (see `answers_match`)."""
    return any(answers_match(gold, predicted, timeout_s) for gold in golds)


def normalize_answer(gold: str) -> str:
    r"""Clean an answer (gold or predicted) the way extraction cleans predictions, so both sides are read alike.

    A ``oxed{}`` is unwrapped (several boxes in a row form a list), math delimiters and trailing punctuation go,
    and a number with units becomes the bare number.

    Examples:
        >>> normalize_answer("18 dollars")
        '18'
        >>> normalize_answer(r"\boxed{24}")
        '24'
        >>> normalize_answer(r"$\frac{1}{2}$")
        '\\frac{1}{2}'
    """
    text = str(gold).strip()
    if "\\boxed" in text or "\\fbox" in text:
        # Boxes of a reference answer separated by at most a couple of words form a list ("\boxed{1} papers and
        # \boxed{2} bins" is 1, 2); otherwise the last box is the answer.
        return ", ".join(clean_answer(content) for content in boxed_list(text, max_gap_words=2) if content.strip())
    return clean_answer(text)


def _numbers_match(gold: str, predicted: str) -> bool | None:
    """Whether two plain numbers are equal (exactly, or rounded when one is a decimal); None unless both are numbers."""
    gold_number, predicted_number = as_number(gold), as_number(predicted)
    if gold_number is None or predicted_number is None:
        return None
    if gold_number == predicted_number:
        return True
    if _DECIMAL_RE.search(gold) or _DECIMAL_RE.search(predicted):
        return round(gold_number, FLOAT_ROUNDING) == round(predicted_number, FLOAT_ROUNDING)
    return False


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _import_math_verify() -> None:
    # Imported on first symbolic use: math-verify pulls in sympy and antlr (~0.5 s), which pure-numeric users never
    # need. Python's import lock makes concurrent first calls wait for one import.
    import math_verify  # noqa: F401


def _math_verify(gold: str, predicted: str) -> bool:
    from math_verify import parse, verify

    # Wrapping in \boxed makes math-verify read the whole string as the answer instead of hunting inside it.
    gold_parsed = parse(f"\\boxed{{{gold}}}", parsing_timeout=None)
    predicted_parsed = parse(f"\\boxed{{{predicted}}}", parsing_timeout=None)
    if not gold_parsed or not predicted_parsed:
        return False
    return verify(gold_parsed, predicted_parsed, timeout_seconds=None)


def _run_bounded(fn: Callable[[], _T], timeout_s: float) -> tuple[bool, _T | None]:
    """Run `fn` on a daemon thread: (finished in time, its result or None if it raised or ran past `timeout_s`)."""
    with _abandoned_lock:
        _abandoned[:] = [t for t in _abandoned if t.is_alive()]
        if len(_abandoned) >= MAX_ABANDONED_CHECKS:
            _logger.warning(
                "%d symbolic answer checks are still running past their time; refusing new ones", MAX_ABANDONED_CHECKS
            )
            return False, None
    result: list[_T] = []

    def target() -> None:
        try:
            result.append(fn())
        except Exception as e:  # a checker bug or sympy error must not crash an env step
            _logger.debug("math-verify raised %s: %s", type(e).__name__, e)

    worker = threading.Thread(target=target, name="math-verify", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        with _abandoned_lock:
            _abandoned.append(worker)
        _logger.warning("symbolic answer check ran past %.1f s; counted as no match", timeout_s)
        return False, None
    return True, (result[0] if result else None)
