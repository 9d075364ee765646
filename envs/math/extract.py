r"""Final-answer extraction from free model text: `extract_answer(text) -> str | None`.

Models state their final answer in many ways. We look, in this order of trust, for

1. the last ``\boxed{...}`` (or ``\fbox{...}``), read with balanced braces so ``\boxed{\frac{1}{2}}`` survives;
2. the last ``#### N`` line (the GSM8K convention);
3. the last "the answer is X" / "final answer: X" phrase;
4. the last number anywhere in the text.

The extracted span is then cleaned: math delimiters (``$...$``, ``\(...\)``) and trailing punctuation go, and a
number followed only by words or a currency / percent sign ("$1,200 dollars", "50%", ``18 \text{ apples}``)
becomes the bare number without thousands separators ("1200"). Anything else (``\frac{1}{2}``, ``2\sqrt{3}``,
``x = 5``) is returned as LaTeX for `answers_match` to compare symbolically.
"""

from __future__ import annotations

import re

__all__ = ["extract_answer", "last_boxed", "normalize_number"]

# A number as people write it: optional sign, thousands separators, decimals, or a simple fraction a/b.
# The sign only counts when it is not a binary minus ("10-3" is ten minus three, not ten and minus three).
_NUMBER = r"(?:(?<![\w)\]}])[-−])?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:/\d+(?!\.\d))?|(?<!\d)[-−]?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
_LEADING_NUMBER_RE = re.compile(rf"^\s*(?:\\?\$\s*)?({_NUMBER})")
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*")
_HASHES_RE = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS_RE = re.compile(r"(?:final\s+answer|the\s+answer|answer)\s*(?:is|:|=)\s*:?\s*(.*)", re.IGNORECASE)
# Wrappers whose content is plain words: ``\text{ dollars}`` reads as " dollars".
_TEXT_WRAPPER_RE = re.compile(r"\\(?:text|textbf|textit|mbox|mathrm)\s*\{([^{}]*)\}")
# What may follow a number for it to still be "just the number": words (units), currency and percent signs.
_UNIT_TAIL_RE = re.compile(r"^(?:\s*(?:\\?%|\\?\$|\\[,;!]|\s+[A-Za-z][A-Za-z'\-]*|\.))*\s*$")
# Where the value stated after "the answer is" stops: a sentence end, a clause comma ("1,000" has no space), or a
# justification ("18 because ...").
_PHRASE_END_RE = re.compile(r"\.(?:\s|$)|\n|,\s|\s(?:because|since|as|so|which|and)\s", re.IGNORECASE)
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
# Answers longer than this are prose, not a final answer; refusing them also bounds the symbolic check's input.
_MAX_ANSWER_CHARS = 300


def extract_answer(text: str) -> str | None:
    r"""Extract the final answer from model text, or None when it states none.

    Args:
        text: the raw text the model produced.

    Returns:
        The answer as a short string (a bare number where the answer is numeric), or None when the text holds no
        boxed answer, no ``####`` line, no "the answer is" phrase and no number at all.

    Examples:
        >>> extract_answer(r"So x = 1/2, hence \boxed{\frac{1}{2}}.")
        '\\frac{1}{2}'
        >>> extract_answer(r"First \boxed{3}, no wait: \boxed{4}")
        '4'
        >>> extract_answer("She makes 9 * 2 = $18 every day.\n#### 18")
        '18'
        >>> extract_answer("The answer is $1,250 dollars.")
        '1250'
        >>> extract_answer("It drops to -7 degrees.")
        '-7'
        >>> extract_answer("I do not know.") is None
        True
    """
    if not isinstance(text, str):
        raise TypeError(f"extract_answer expects a str, got {type(text).__name__}")
    for finder in (last_boxed, _last_hashes, _last_answer_phrase, _last_number):
        span = finder(text)
        if span is None:
            continue
        answer = _clean(span)
        if answer and len(answer) <= _MAX_ANSWER_CHARS:
            return answer
    return None


def normalize_number(token: str) -> str:
    """Write a number token in canonical form: no thousands separators, ASCII minus.

    Examples:
        >>> normalize_number("1,234.50")
        '1234.50'
        >>> normalize_number("−3")
        '-3'
    """
    return token.replace(",", "").replace("−", "-").strip()


def last_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` (balanced braces) or ``\boxed 5`` in `text`; None if there is none.

    Examples:
        >>> last_boxed(r"\boxed{1} then \boxed{\frac{2}{3}}")
        '\\frac{2}{3}'
    """
    closing = _closing_braces(text)
    found = None
    for match in _BOX_RE.finditer(text):
        start = match.end()
        if start < len(text) and text[start] == "{":
            if start in closing:  # an unclosed \boxed{ is skipped
                found = text[start + 1 : closing[start]]
        else:  # ``\boxed 5``: the argument is the next token
            token = re.match(r"[^\s$]+", text[start:])
            if token:
                found = token.group(0)
    return found


def _closing_braces(text: str) -> dict[int, int]:
    """Map the index of every ``{`` that closes to the index of its ``}``, in one pass (long junk stays linear)."""
    pairs, open_stack = {}, []
    for i, char in enumerate(text):
        if char == "{":
            open_stack.append(i)
        elif char == "}" and open_stack:
            pairs[open_stack.pop()] = i
    return pairs


def _last_hashes(text: str) -> str | None:
    matches = [m.group(1) for m in _HASHES_RE.finditer(text) if m.group(1).strip()]
    return matches[-1] if matches else None


def _last_answer_phrase(text: str) -> str | None:
    spans = []
    for match in _ANSWER_IS_RE.finditer(text):
        rest = match.group(1)
        span = _first_clause(rest)
        # "the answer is 5 + 3 = 8": the value is what follows the last "=".
        span = span.rsplit("=", 1)[-1]
        # A phrase without any digit or LaTeX ("the answer is unclear") is not an answer.
        if re.search(r"[\d\\]", span):
            spans.append(span)
    return spans[-1] if spans else None


def _first_clause(text: str) -> str:
    """`text` up to the first clause end that is not inside brackets ("(1, 2) since ..." keeps "(1, 2)")."""
    for end in _PHRASE_END_RE.finditer(text):
        prefix = text[: end.start()]
        # Counted together because half-open intervals mix them: "[2, 5)".
        if sum(map(prefix.count, "([{")) <= sum(map(prefix.count, ")]}")):
            return prefix
    return text


def _last_number(text: str) -> str | None:
    numbers = _NUMBER_RE.findall(text)
    return numbers[-1] if numbers else None


def _clean(span: str) -> str:
    """Strip delimiters and punctuation; reduce "number + units" to the bare number."""
    answer = span.strip()
    for left, right in _DELIMITERS:
        if answer.startswith(left) and answer.endswith(right) and len(answer) > len(left) + len(right):
            answer = answer[len(left) : -len(right)].strip()
            break
    answer = answer.strip().rstrip(".,;:!").strip()
    answer = answer.strip("$").strip()
    unwrapped = _TEXT_WRAPPER_RE.sub(lambda m: " " + m.group(1), answer)
    leading = _LEADING_NUMBER_RE.match(unwrapped)
    if leading and _UNIT_TAIL_RE.match(unwrapped[leading.end() :]):
        return normalize_number(leading.group(1))
    return answer
