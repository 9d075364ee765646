r"""Grading one reply: pluggable answer extractors and verifiers, and the reward for correct / wrong / no answer.

    grade = Grader(extractor="default", verifier="default", rewards=RewardConfig(), strict=False)
    result = grade(reply_text, problem.golds)     # Grade(answer, correct, followed_format, reward)

Extractors turn a reply into an answer (``str | None``); verifiers say whether an answer equals a gold answer. Both
are chosen by name from `EXTRACTORS` / `VERIFIERS` (add your own with `register_extractor` / `register_verifier`),
by a ``"package.module:function"`` import path, or passed as callables.

Built-in extractors: ``"default"`` (`find_answer`: boxed, ``####``, answer phrase, last math span or number) and
``"boxed"`` (only ``\boxed{}``). Built-in verifiers: ``"default"`` (`answers_match`: exact for numbers, math-verify
otherwise, time-bounded) and ``"exact"`` (the cleaned strings, or the numbers, are equal).

Grading runs under a hard budget (``budget_s``, 5 s by default): the whole grade, extraction included, runs in a
worker process of `agentrl.budget` that is killed past the budget, so an answer such as ``\boxed{9^{4\cdot 9^{7}}}``
(a power of 18 million digits that holds the GIL for ~20 s) cannot freeze the caller. Cheaper guards come first:
`costly_answer` refuses such answers before any symbolic evaluation, in microseconds. Either way the answer counts
as wrong and `Grade.refused` says why (`MathEnv` puts ``grade_budget_exceeded`` in the step's ``info``). A worker call
costs ~0.1 ms; a custom extractor or verifier is sent to the worker by reference, so it must be a module-level
function of an importable module; anything else (a lambda, a closure, a function of ``__main__``) runs in the calling
process, under the guards of the default verifier but without the budget.

The requested format is ``\boxed{}`` (what `MathEnv` asks for). ``strict=True`` counts an answer only when the reply
has a non-empty ``\boxed{}``: a reply without one is "no answer" whatever else it says, so the policy is pushed to
follow the format. `RewardConfig.format_bonus` is added whenever the reply followed the format, right or wrong.
"""

from __future__ import annotations

import importlib
import logging
import math
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from agentrl import budget

from .equivalence import answers_match, as_number, compare_answers, normalize_answer
from .extract import extract_answer, last_boxed

__all__ = [
    "DEFAULT_GRADE_BUDGET_S",
    "EXTRACTORS",
    "VERIFIERS",
    "AnswerExtractor",
    "AnswerVerifier",
    "Grade",
    "Grader",
    "RewardConfig",
    "follows_format",
    "register_extractor",
    "register_verifier",
    "resolve_extractor",
    "resolve_verifier",
]


DEFAULT_GRADE_BUDGET_S = 5.0
"""Seconds one reply's grading may take in its worker process before it is killed and counted as wrong."""

_logger = logging.getLogger(__name__)
# Workers start with the grading code and math-verify (sympy, antlr) imported: a grade is then a pipe round trip.
budget.preload("agentrl.envs.math.grading", "math_verify")


class AnswerExtractor(Protocol):
    """Turns a model reply into its final answer, or None when it states none."""

    def __call__(self, text: str) -> str | None:
        """The final answer in `text`, or None."""
        ...


class AnswerVerifier(Protocol):
    """Says whether an extracted answer is equivalent to one gold answer."""

    def __call__(self, gold: str, predicted: str) -> bool:
        """True when `predicted` is equivalent to `gold`."""
        ...


def _boxed_only(text: str) -> str | None:
    return extract_answer(text, strict=True)


def _exact(gold: str, predicted: str) -> bool:
    gold = normalize_answer(gold)
    gold_number, predicted_number = as_number(gold), as_number(predicted)
    if gold_number is not None and predicted_number is not None:
        return gold_number == predicted_number
    return "".join(gold.split()) == "".join(predicted.split())


EXTRACTORS: dict[str, AnswerExtractor] = {"default": extract_answer, "boxed": _boxed_only}
"""Answer extractors by name."""
VERIFIERS: dict[str, AnswerVerifier] = {"default": answers_match, "exact": _exact}
"""Answer verifiers by name."""


def register_extractor(name: str, extractor: AnswerExtractor) -> None:
    """Make `extractor` available as ``extractor=name`` (for configs and the CLI)."""
    if not callable(extractor):
        raise TypeError(f"math: extractor {name!r} must be callable, got {type(extractor).__name__}")
    EXTRACTORS[name] = extractor


def register_verifier(name: str, verifier: AnswerVerifier) -> None:
    """Make `verifier` available as ``verifier=name`` (for configs and the CLI)."""
    if not callable(verifier):
        raise TypeError(f"math: verifier {name!r} must be callable, got {type(verifier).__name__}")
    VERIFIERS[name] = verifier


def _resolve(spec: str | Callable, registry: dict[str, Callable], kind: str) -> Callable:
    if callable(spec):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"math: {kind} must be a name, 'module:function' or a callable, got {type(spec).__name__}")
    if spec in registry:
        return registry[spec]
    if ":" in spec:
        module_name, _, attribute = spec.partition(":")
        try:
            found = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"math: cannot import {kind} {spec!r}: {e}") from None
        if not callable(found):
            raise ValueError(f"math: {kind} {spec!r} is not callable")
        return found
    raise ValueError(f"math: unknown {kind} {spec!r}; use one of {sorted(registry)} or 'package.module:function'")


def resolve_extractor(spec: str | AnswerExtractor) -> AnswerExtractor:
    """The extractor named by `spec` (a registry name, ``"module:function"``), or `spec` itself if callable."""
    return _resolve(spec, EXTRACTORS, "extractor")


def resolve_verifier(spec: str | AnswerVerifier) -> AnswerVerifier:
    """The verifier named by `spec` (a registry name, ``"module:function"``), or `spec` itself if callable."""
    return _resolve(spec, VERIFIERS, "verifier")


def follows_format(text: str) -> bool:
    r"""True when the reply gives its answer in the requested format: a non-empty ``\boxed{}``."""
    boxed = last_boxed(text)
    return boxed is not None and bool(boxed.strip())


@dataclass(frozen=True)
class RewardConfig:
    r"""The reward of one graded reply.

    Attributes:
        correct: reward for a correct answer.
        wrong: reward for a wrong answer.
        no_answer: reward when no answer was found (in strict mode: no ``\boxed{}``).
        format_bonus: added whenever the reply followed the requested format (a non-empty ``\boxed{}``).
    """

    correct: float = 1.0
    wrong: float = 0.0
    no_answer: float = 0.0
    format_bonus: float = 0.0

    def __post_init__(self) -> None:
        for name in ("correct", "wrong", "no_answer", "format_bonus"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"math: reward {name} must be a finite number, got {value!r}")


@dataclass(frozen=True)
class Grade:
    r"""The verdict on one reply.

    Attributes:
        answer: the extracted answer, or None when none counts.
        correct: the answer matches one of the gold answers.
        followed_format: the reply has a non-empty ``\boxed{}``.
        reward: the reward under the grader's `RewardConfig`.
        refused: why the reply was counted wrong without being judged on its merits: a guard's reason
            (`costly_answer`), a symbolic check past ``verify_timeout_s``, or the grading budget (then `answer` is
            None and `followed_format` False: nothing of the reply could be read in time); None otherwise.
    """

    answer: str | None
    correct: bool
    followed_format: bool
    reward: float
    refused: str | None = None

    @property
    def budget_exceeded(self) -> bool:
        """True when the grading hit its budget, a time bound or a cost guard (counted as a wrong answer)."""
        return self.refused is not None


class Grader:
    """Extract, verify and reward one reply against a problem's gold answers.

    Args:
        extractor: a name in `EXTRACTORS`, ``"module:function"``, or a callable (text -> answer or None).
        verifier: a name in `VERIFIERS`, ``"module:function"``, or a callable (gold, predicted -> bool).
        rewards: the rewards for correct / wrong / no answer and the format bonus.
        strict: count an answer only when the reply follows the requested format (see the module docstring).
        verify_timeout_s: the time bound given to the default verifier (per gold answer).
        budget_s: the most seconds one whole grade may take in a worker process; past it the worker is killed and
            the reply counts as wrong. None grades in the calling process (no budget, the guards still apply): only
            for trusted text. Extractors and verifiers that cannot be sent to a worker (see the module docstring)
            run in the calling process whatever `budget_s` says.
    """

    def __init__(
        self,
        extractor: str | AnswerExtractor = "default",
        verifier: str | AnswerVerifier = "default",
        rewards: RewardConfig | None = None,
        strict: bool = False,
        verify_timeout_s: float = 2.0,
        budget_s: float | None = DEFAULT_GRADE_BUDGET_S,
    ):
        if not isinstance(strict, bool):
            raise ValueError(f"math: strict must be True or False, got {strict!r}")
        if budget_s is not None and (
            isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not 0 < budget_s < math.inf
        ):
            raise ValueError(f"math: budget_s must be a positive number of seconds or None, got {budget_s!r}")
        self.extractor = resolve_extractor(extractor)
        self.verifier = resolve_verifier(verifier)
        self.verify_timeout_s = verify_timeout_s
        self.rewards = rewards if rewards is not None else RewardConfig()
        self.strict = strict
        self.budget_s = budget_s
        self.in_worker = budget_s is not None and _sendable(self.extractor) and _sendable(self.verifier)
        """Whether grades run in a budget worker process (False: in the calling process)."""
        if self.in_worker:  # workers started from now on import them up front
            budget.preload(*dict.fromkeys((self.extractor.__module__, self.verifier.__module__)))
        if budget_s is not None and not self.in_worker:
            _logger.warning("math: the extractor or verifier is not a module-level function of an importable module, "
                            "so replies are graded in this process without the %g s budget", budget_s)

    def __call__(self, text: str, golds: Sequence[str]) -> Grade:
        """Grade `text` against the acceptable answers `golds` (any match is correct), under the budget."""
        if not self.in_worker:
            return self.grade_here(text, golds)
        try:
            return budget.run_with_budget(_grade_in_worker, self, text, tuple(golds), budget_s=self.budget_s)
        except budget.BudgetExceeded as e:
            _logger.warning("math: %s; the reply counts as wrong", e)
            return Grade(answer=None, correct=False, followed_format=False, reward=float(self.rewards.wrong),
                         refused=f"grading ran past its budget of {self.budget_s:g} s")

    def grade_here(self, text: str, golds: Sequence[str]) -> Grade:
        """Grade `text` in this process, without the budget (the guards of the default verifier still apply)."""
        formatted = follows_format(text)
        answer = self.extractor(text) if formatted or not self.strict else None
        correct, refused = False, None
        if answer is not None:
            for gold in golds:
                if gold is None:
                    continue
                if self.verifier is answers_match:
                    verdict = compare_answers(gold, answer, self.verify_timeout_s)
                    correct, refused = verdict.equal, refused or verdict.refused
                else:
                    correct = bool(self.verifier(gold, answer))
                if correct:
                    refused = None
                    break
        if correct:
            reward = self.rewards.correct
        elif answer is None:
            reward = self.rewards.no_answer
        else:
            reward = self.rewards.wrong
        if formatted:
            reward += self.rewards.format_bonus
        return Grade(answer=answer, correct=correct, followed_format=formatted, reward=float(reward), refused=refused)


def _grade_in_worker(grader: Grader, text: str, golds: tuple[str, ...]) -> Grade:
    return grader.grade_here(text, golds)


def _sendable(fn: Callable) -> bool:
    """True when `fn` pickles by reference to an importable module, so a worker process can call it."""
    if getattr(fn, "__module__", None) in (None, "__main__"):
        return False
    try:
        return pickle.loads(pickle.dumps(fn)) is fn
    except Exception:  # a lambda, a closure, a bound method of an unpicklable object
        return False
