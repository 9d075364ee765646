r"""Cheap guards run on a model's answer before symbolic or big-integer evaluation: `costly_answer(answer)`.

An answer of a few bytes can ask sympy for a number of millions of digits: ``9^{4\cdot 9^{7}}`` is 9 to the power
19,131,876, about 18 million digits, and computing it holds the GIL for ~20 s. The grading budget
(`agentrl.budget`) kills such work, but a process kill and restart cost far more than reading the answer: these
guards reject the common hostile shapes in microseconds, and the answer counts as wrong.

What is refused (the reason comes back as a short string, None when the answer may be evaluated):

* an answer longer than `MAX_SYMBOLIC_CHARS` characters (the default extractor already stops at 300);
* brackets nested deeper than `MAX_NESTING` (``((((...))))``, ``\frac{\frac{...}}``, ``\left(\left(...``);
* any number whose size an upper bound puts over `MAX_DIGITS` digits: the bound reads the answer as arithmetic
  (numbers, ``^`` and ``**`` right-associative, ``!``, ``\frac``, ``\binom``, ``\sqrt``, ``\exp``, implicit and
  explicit products) with every letter counted as 10, so ``x^{10^{9}}``, ``2**2**2**30``, ``99999!``,
  ``\binom{10^{9}}{10^{6}}`` and 10^6-digit literals are refused, while ``2^{2023}``, ``100!``, ``e^{x^2}`` or
  ``\frac{1}{2}\sqrt{3}`` pass. A bound over `MAX_DIGITS` is far beyond any answer a problem can have; answers
  between the bound and the budget are left to the budget.

The bound is deliberately crude and never raises: what it cannot read it skips, so an odd answer is evaluated (under
the budget) rather than refused.
"""

from __future__ import annotations

import functools
import math
import re

__all__ = ["MAX_DIGITS", "MAX_NESTING", "MAX_SYMBOLIC_CHARS", "costly_answer"]

MAX_DIGITS = 100_000
"""The most digits the bound may give any number in an answer (a 10^5-digit power takes sympy milliseconds)."""
MAX_NESTING = 50
"""The deepest bracket nesting an answer may have."""
MAX_SYMBOLIC_CHARS = 1_000
"""The longest answer given to the symbolic check."""

_TOKEN_RE = re.compile(r"\d+(?:\.\d*)?|\.\d+|\\[A-Za-z]+|\\.|\*\*|\S", re.ASCII)
_NUMBER_RE = re.compile(r"\d+(?:\.\d*)?|\.\d+", re.ASCII)
_OPEN = {"{", "(", "[", "\\{", "\\langle", "\\lfloor", "\\lceil"}
_CLOSE = {"}", ")", "]", "\\}", "\\rangle", "\\rfloor", "\\rceil"}
_PRODUCT = {"*", "\\cdot", "\\times", "/", "\\div", "\\ast"}
_TWO_ARGUMENTS = {"\\frac", "\\dfrac", "\\tfrac", "\\cfrac", "\\binom", "\\dbinom", "\\tbinom", "\\choose"}
# Spacing and sizing commands: no value, skipped wherever they are.
_SKIPPED = {
    "\\left", "\\right", "\\big", "\\Big", "\\bigg", "\\Bigg", "\\bigl", "\\bigr", "\\Bigl", "\\Bigr", "\\,", "\\;",
    "\\:", "\\!", "\\ ", "\\quad", "\\qquad", "\\displaystyle", "\\limits", "%", "\\%", "'", "°", "\\circ", "$",
}  # fmt: skip
_WORD_WRAPPERS = {"\\text", "\\textbf", "\\textit", "\\mbox", "\\mathrm", "\\operatorname", "\\mathbf", "\\mathit"}
_LOG10_2 = math.log10(2)
_EXPONENT_CAP = 15.0  # an exponent above 10^15 makes any bound infinite


class _Refused(Exception):
    """Raised inside the bound as soon as a number is too large."""


@functools.lru_cache(maxsize=4096)
def costly_answer(answer: str) -> str | None:
    r"""Why evaluating `answer` symbolically could take long, or None when it looks cheap (see the module docstring).

    Examples:
        >>> costly_answer(r"9^{4\cdot 9^{7}}")
        'a number of about 18,256,449 digits'
        >>> costly_answer(r"2^{2023}") is None
        True
        >>> costly_answer("(" * 60 + "1" + ")" * 60)
        'brackets nested 60 deep (at most 50)'
    """
    if len(answer) > MAX_SYMBOLIC_CHARS:
        return f"{len(answer)} characters (at most {MAX_SYMBOLIC_CHARS})"
    tokens = [t for t in _TOKEN_RE.findall(answer) if t not in _SKIPPED]
    depth = deepest = 0
    for token in tokens:
        if token in _OPEN:
            depth += 1
            deepest = max(deepest, depth)
        elif token in _CLOSE:
            depth = max(depth - 1, 0)
    if deepest > MAX_NESTING:
        return f"brackets nested {deepest} deep (at most {MAX_NESTING})"
    bound = _Bound(tokens)
    try:
        bound.expression()
    except _Refused:
        return f"a number of about {bound.largest:,.0f} digits" if math.isfinite(bound.largest) else (
            "a number too large to write down")
    except RecursionError:  # \sqrt\sqrt\sqrt... without braces: deeper than any answer
        return "an expression nested too deeply"
    return None


class _Bound:
    """Upper bounds of log10 |value| over a token list; raises `_Refused` once any exceeds `MAX_DIGITS`."""

    def __init__(self, tokens: list[str]):
        self.tokens = tokens
        self.position = 0
        self.largest = 0.0

    def _peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def _note(self, size: float) -> float:
        if size > MAX_DIGITS:
            self.largest = size
            raise _Refused
        return size

    def expression(self, closing: str | None = None) -> float:
        """Sums, relations and lists: the largest term, doubled per further term (log10 2 added)."""
        size, terms = 0.0, 0
        while (token := self._peek()) is not None:
            if token in _CLOSE:
                if closing is not None:
                    self.position += 1
                    return size
                self.position += 1  # a stray closer at the top level
                continue
            if token in _PRODUCT or token in ("^", "**", "!", "_"):
                self.position += 1  # an operator without a left operand: skip it
                continue
            term = self.term()
            size = self._note(max(size, term) + _LOG10_2) if terms else term
            terms += 1
        return size

    def _starts_factor(self, token: str | None) -> bool:
        if token is None or token in _CLOSE:
            return False
        return token in _PRODUCT or token in _OPEN or token[0].isalpha() or _NUMBER_RE.fullmatch(token) is not None or (
            token.startswith("\\") and len(token) > 2)

    def term(self) -> float:
        """Products, quotients and implicit products: the sizes add up."""
        size = self.power()
        while self._starts_factor(self._peek()):
            if self._peek() in _PRODUCT:
                self.position += 1
                if not self._starts_factor(self._peek()):
                    break
            size = self._note(size + self.power())
        return size

    def power(self) -> float:
        """``a ^ b ^ c`` (right-associative, also ``**``), each operand with its factorials and subscripts."""
        operands = [self.postfix()]
        while self._peek() in ("^", "**"):
            self.position += 1
            if self._peek() is None:
                break
            operands.append(self.postfix())
        size = operands.pop()
        while operands:
            base = max(operands.pop(), _LOG10_2)  # a base of 1 or 0.5 still materializes 2^exponent-like numbers
            size = math.inf if size > _EXPONENT_CAP else base * 10**size
            size = self._note(size)
        return size

    def postfix(self) -> float:
        """An atom followed by factorials (``n!`` has about n log10 n digits) and subscripts (skipped)."""
        size = self.atom()
        while self._peek() in ("!", "_"):
            if self._peek() == "_":
                self.position += 1
                if self._peek() is not None:
                    self.atom()
                continue
            self.position += 1
            n = 10**size if size <= _EXPONENT_CAP else math.inf
            size = self._note(n * math.log10(n + 1) if math.isfinite(n) else math.inf)
        return size

    def atom(self) -> float:
        """A number, a letter, a bracketed expression or a command with its arguments."""
        token = self._peek()
        if token is None:
            return 0.0
        self.position += 1
        if token in _OPEN:
            return self.expression(closing=token)
        if _NUMBER_RE.fullmatch(token):
            digits = token.replace(".", "").lstrip("0")
            if len(digits) <= 15:
                return self._note(math.log10(float(token))) if float(token) > 1 else 0.0
            return self._note(float(len(digits)))
        if token in _WORD_WRAPPERS:
            if self._peek() == "{":  # \text{...}: words, no value; its content is skipped
                depth = 0
                while (inner := self._peek()) is not None:
                    self.position += 1
                    depth += inner in _OPEN
                    depth -= inner in _CLOSE
                    if depth <= 0:
                        break
            return 0.0
        if token in _TWO_ARGUMENTS:
            first, second = self.postfix(), self.postfix()
            if token.endswith("binom") or token == "\\choose":
                k = 10**second if second <= _EXPONENT_CAP else math.inf
                return self._note(k * max(first, _LOG10_2))
            return self._note(first + second)
        if token == "\\sqrt":
            if self._peek() == "[":  # \sqrt[n]{x}
                self.position += 1
                self.expression(closing="[")
            return self.postfix()
        if token == "\\exp":
            argument = self.postfix()
            return self._note(math.inf if argument > _EXPONENT_CAP else 10**argument * math.log10(math.e))
        return 1.0  # a letter, a constant, a function name: counted as 10
