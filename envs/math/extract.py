r"""Final-answer extraction from free model text: `find_answer(text) -> Extraction | None`.

Models state their final answer in many ways. We look, in this order of trust, for

1. ``\boxed{...}`` (or ``\fbox{...}``), read with balanced braces so ``\boxed{\frac{1}{2}}`` survives. The last box
   wins; boxes right before it that are separated from it only by commas, "and" or spacing belong to the same
   answer (``\boxed{1}, \boxed{2}`` is the list ``1, 2``);
2. the last ``#### N`` line (the GSM8K convention);
3. the last answer phrase ("the answer is X", "Final Answer: X", "the final answer is $X$") whose value looks like an
   answer: a math span, or a clause with a digit or LaTeX and at most a few words ("Answer: let me check this
   again, 2+2 is 4 ..." is prose, not a value, and does not block the rules below). Phrases may nest: in the
   Minerva format "Final Answer: The final answer is $24$. I hope it is correct." the value is ``24``;
4. whichever comes last of the last math span (``$...$``, ``\(...\)``, ``\[...\]``) and the last number outside
   math: "the ordered pair is $(7, 6)$" gives ``(7, 6)``, not 6; "$a = 3$, so 12 apples" gives 12. An equation's
   value is its right-hand side.

With ``strict=True`` only rule 1 counts: the format the env asks for (see `MathEnv`).

The extracted span is then cleaned: math delimiters and trailing punctuation go, and a number followed only by
words, a currency / percent / degree sign ("$1,200 dollars", "50%", ``18 \text{ apples}``) becomes the bare number
without thousands separators ("1200"). Anything else (``\frac{1}{2}``, ``2\sqrt{3}``, ``x \geq 5``) is returned
as LaTeX for `answers_match` to compare symbolically.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

__all__ = ["ANSWER_RULES", "Extraction", "boxed_list", "clean_answer", "extract_answer", "find_answer", "last_boxed",
           "normalize_number"]

ANSWER_RULES = ("boxed", "hashes", "phrase", "math", "number")
"""How an answer was found, most trusted first (see the module docstring)."""

# A number as people write it: optional sign, thousands separators (",", "\,", "{,}", or a space between groups
# of three), decimals, or a simple fraction a/b. The sign only counts when it is not a binary minus ("10-3").
_GROUP_SEP = r"(?:,|\\,|\{,\}|\\ |\\!| )"
_NUMBER = (
    rf"(?<![A-Za-z])(?:(?<![\w)\]}}])[-−])?(?:(?<![\d.])\d{{1,3}}(?:{_GROUP_SEP}\d{{3}})+(?![\d]|,\d)|\d+)(?:\.\d+)?"
    r"(?:/\d+(?!\.\d))?|(?<![\dA-Za-z])[-−]?\.\d+"
)
_NUMBER_RE = re.compile(_NUMBER)
_LEADING_NUMBER_RE = re.compile(rf"^\s*(?:\\?\$\s*)?({_NUMBER})")
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*")
_BOX_JOINER_RE = re.compile(
    r"^(?:\s|,|;|\$|\\quad|\\qquad|\\,|\\[()\[\]]|\\text\{\s*(?:and|or)\s*\}|\band\b|\bor\b|&)*$"
)
_BRACE_RE = re.compile(r"[{}]")
_HASHES_RE = re.compile(r"####\s*([^\n]*)")
_ANSWER_PHRASE_RE = re.compile(r"(?:final\s+answer|the\s+answer|answer)\s*(?:is|:|=)\s*:?\s*", re.IGNORECASE)
_MATH_SPAN_RE = re.compile(r"\$\$(.+?)\$\$|(?<!\\)\$(.+?)(?<!\\)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.DOTALL)
_MATH_OPENER_RE = re.compile(r"\$|\\[(\[]")  # where a `_MATH_SPAN_RE` match can start (see `_math_spans`)
# Wrappers whose content is plain words: ``\text{ dollars}`` reads as " dollars".
_TEXT_WRAPPER_RE = re.compile(r"\\(?:text|textbf|textit|mbox|mathrm)\s*\{([^{}]*)\}")
# What may follow a number for it to still be "just the number": words (units), currency, percent and degree signs.
# Every piece of the tail reads one way only (a word is taken whole, possessively, and spaces only before a piece):
# with two ways per piece, "1 a a a ... #" backtracked exponentially (30 words: hours).
_UNIT_TAIL_RE = re.compile(
    r"^(?:\s*+(?:\\?%|\\?\$|\\[,;!]|\^\s*+\{?\\circ\}?|°|\\circ|[A-Za-z][A-Za-z'\-]*+(?:\^\d)?|\.))*+\s*$"
)
# Where the value stated after "the answer is" stops: a sentence end, a clause comma ("1,000" has no space), or a
# justification ("18 because ...").
_PHRASE_END_RE = re.compile(r"\.(?:\s|$)|\n|,\s|\s(?:because|since|as|so|which|and)\s", re.IGNORECASE)
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_PROSE_WORD_RE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_LATEX_COMMAND_RE = re.compile(r"\\[A-Za-z]+\*?(?:\{[A-Za-z*]*\})?")
_HAS_VALUE_RE = re.compile(r"[\d\\]")
_FINAL_PHRASE_RE = re.compile(r"final\s+answer", re.IGNORECASE)
# ASCII relations as people type them, in the LaTeX math-verify parses.
_ASCII_RELATIONS = (("<=", "\\leq "), (">=", "\\geq "), ("!=", "\\neq "), ("=<", "\\leq "), ("=>", "\\geq "))
_WHOLE_TEXT_WRAPPER_RE = re.compile(r"^\\(?:text|textbf|textit|mbox|mathrm)\s*\{([^{}]*)\}$")
_MAX_PHRASE_WORDS = 3  # "18 dollars and 50 cents" is a value; "let me check this again" is prose
# Answers longer than this are prose, not a final answer; refusing them also bounds the symbolic check's input.
_MAX_ANSWER_CHARS = 300


@dataclass(frozen=True)
class Extraction:
    """A final answer found in model text.

    Attributes:
        answer: the cleaned answer (a bare number where the answer is numeric, else LaTeX).
        rule: which rule found it, one of `ANSWER_RULES`.
    """

    answer: str
    rule: str


def find_answer(text: str, strict: bool = False) -> Extraction | None:
    r"""Find the final answer in model text and say how it was found; None when the text states none.

    Args:
        text: the raw text the model produced.
        strict: accept only ``\boxed{}`` answers (the format `MathEnv` asks for).

    Examples:
        >>> find_answer("Final Answer: The final answer is $24$. I hope it is correct.")
        Extraction(answer='24', rule='phrase')
        >>> find_answer("The answer is 24.", strict=True) is None
        True
    """
    if not isinstance(text, str):
        raise TypeError(f"extract_answer expects a str, got {type(text).__name__}")
    finders = (("boxed", _boxed_group),) if strict else (
        ("final", _final_phrase_after_boxes), ("boxed", _boxed_group), ("hashes", _last_hashes),
        ("phrase", _last_answer_phrase), ("fallback", _fallback))
    for rule, finder in finders:
        found = finder(text)
        if found is None:
            continue
        if rule == "fallback":
            rule, found = found
        elif rule == "final":
            rule = "phrase"
        answer = clean_answer(found)
        if answer and len(answer) <= _MAX_ANSWER_CHARS:
            return Extraction(answer, rule)
    return None


def extract_answer(text: str, strict: bool = False) -> str | None:
    r"""Extract the final answer from model text, or None when it states none (see `find_answer`).

    Examples:
        >>> extract_answer(r"So x = 1/2, hence \boxed{\frac{1}{2}}.")
        '\\frac{1}{2}'
        >>> extract_answer(r"First \boxed{3}, no wait: \boxed{4}")
        '4'
        >>> extract_answer(r"The solutions are \boxed{1}, \boxed{2}.")
        '1, 2'
        >>> extract_answer("She makes 9 * 2 = $18 every day.\n#### 18")
        '18'
        >>> extract_answer("The answer is $1,250 dollars.")
        '1250'
        >>> extract_answer("So the ordered pair is $(7, 6)$.")
        '(7, 6)'
        >>> extract_answer("It drops to -7 degrees.")
        '-7'
        >>> extract_answer("I do not know.") is None
        True
    """
    found = find_answer(text, strict)
    return found.answer if found else None


def normalize_number(token: str) -> str:
    r"""Write a number token in canonical form: no thousands separators, ASCII minus.

    Examples:
        >>> normalize_number("1,234.50")
        '1234.50'
        >>> normalize_number("1\\,000\\,000")
        '1000000'
        >>> normalize_number("−3")
        '-3'
    """
    for separator in ("{,}", "\\,", "\\ ", "\\!", ",", " "):
        token = token.replace(separator, "")
    return token.replace("−", "-").strip()


def last_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` (balanced braces) or ``\boxed 5`` in `text`; None if there is none.

    Examples:
        >>> last_boxed(r"\boxed{1} then \boxed{\frac{2}{3}}")
        '\\frac{2}{3}'
    """
    boxes = _boxes(text)
    return boxes[-1][2] if boxes else None


def boxed_list(text: str, max_gap_words: int | None = None) -> list[str]:
    r"""The contents of the last ``\boxed{}`` and of the boxes right before it that belong to the same answer.

    Args:
        text: the text.
        max_gap_words: None: boxes separated only by commas, "and", "or" or spacing belong together (model replies,
            where "\boxed{3}. Hmm, no: \boxed{4}" is a correction); a number: gaps of at most that many words
            do too (reference answers, where "\boxed{1} papers and \boxed{2} bins" is a list).

    Examples:
        >>> boxed_list(r"\boxed{1}, \boxed{2}")
        ['1', '2']
        >>> boxed_list(r"\boxed{1} papers and \boxed{2} bins", max_gap_words=2)
        ['1', '2']
        >>> boxed_list(r"First \boxed{3}. Hmm, no: \boxed{4}")
        ['4']
    """
    boxes = _boxes(text)
    if not boxes:
        return []
    group = [boxes[-1]]
    for previous in reversed(boxes[:-1]):
        gap = text[previous[1] : group[0][0]]
        joined = _BOX_JOINER_RE.match(gap) if max_gap_words is None else _prose_words(gap) <= max_gap_words
        if not joined:
            break
        group.insert(0, previous)
    return [content.strip() for _, _, content in group]


@functools.lru_cache(maxsize=16)  # one reply is scanned by several rules and the format check
def _boxes(text: str) -> tuple[tuple[int, int, str], ...]:
    r"""Every closed box as (start of ``\boxed``, end after its argument, content), in text order."""
    closing = _closing_braces(text)
    found = []
    for match in _BOX_RE.finditer(text):
        start = match.end()
        if start < len(text) and text[start] == "{":
            if start in closing:  # an unclosed \boxed{ is skipped
                found.append((match.start(), closing[start] + 1, text[start + 1 : closing[start]]))
        else:  # ``\boxed 5``: the argument is the next token
            token = re.match(r"[^\s$]+", text[start:])
            if token:
                found.append((match.start(), start + token.end(), token.group(0)))
    return tuple(found)


def _boxed_group(text: str) -> str | None:
    group = boxed_list(text)
    return ", ".join(group) if group else None


def _closing_braces(text: str) -> dict[int, int]:
    """Map the index of every ``{`` that closes to the index of its ``}``, in one pass (long junk stays linear)."""
    pairs, open_stack = {}, []
    for match in _BRACE_RE.finditer(text):  # only the braces, not every character, go through Python
        if match.group() == "{":
            open_stack.append(match.start())
        elif open_stack:
            pairs[open_stack.pop()] = match.start()
    return pairs


def _last_hashes(text: str) -> str | None:
    matches = [m.group(1) for m in _HASHES_RE.finditer(text) if m.group(1).strip()]
    return matches[-1] if matches else None


def _final_phrase_after_boxes(text: str) -> str | None:
    """A "final answer" phrase stated after the last box: the Minerva format after boxed intermediate results."""
    boxes = _boxes(text)
    if not boxes:
        return None
    tail = text[boxes[-1][1] :]
    return _last_answer_phrase(tail) if _FINAL_PHRASE_RE.search(tail) else None


def _last_answer_phrase(text: str) -> str | None:
    value = None
    for match in _ANSWER_PHRASE_RE.finditer(text):
        # A value is short: reading past a few hundred characters only costs time on junk input.
        window = text[match.end() : match.end() + _MAX_ANSWER_CHARS]
        candidate = _phrase_value(window) if _HAS_VALUE_RE.search(window) else None
        if candidate is not None:
            value = candidate
    return value


def _phrase_value(rest: str) -> str | None:
    """The value stated at the start of `rest` (after an answer phrase), or None when it is prose or nothing."""
    math = _MATH_SPAN_RE.match(rest)
    span = next(g for g in math.groups() if g is not None) if math else _first_clause(rest)
    span = _equation_value(span)
    if not re.search(r"[\d\\]", span):  # "the answer is unclear"
        return None
    if _prose_words(span) > _MAX_PHRASE_WORDS:
        return None
    if not math and _PROSE_WORD_RE.match(span.lstrip()):
        # "Final Answer: The largest $n$ is 34": a sentence whose value is its last math span or number.
        found = _fallback(span)
        return found[1] if found else None
    return span


def _equation_value(span: str) -> str:
    """The right-hand side of arithmetic ("5 + 3 = 8" -> "8"); equations with variables stay whole ("y = 2x")."""
    lhs, equals, rhs = span.rpartition("=")
    if equals and lhs.strip() and rhs.strip() and not lhs.rstrip().endswith(("<", ">", "!")):
        if not re.search(r"[A-Za-z]", _LATEX_COMMAND_RE.sub("", lhs)):
            return rhs
    return span


def _prose_words(text: str) -> int:
    r"""Words of two or more letters outside LaTeX commands and ``\text{}``."""
    return len(_PROSE_WORD_RE.findall(_LATEX_COMMAND_RE.sub(" ", _TEXT_WRAPPER_RE.sub(" ", text))))


def _first_clause(text: str) -> str:
    """`text` up to the first clause end that is not inside brackets ("(1, 2) since ..." keeps "(1, 2)")."""
    depth, counted = 0, 0
    for end in _PHRASE_END_RE.finditer(text):
        # Counted together because half-open intervals mix them: "[2, 5)"; counted incrementally (linear time).
        chunk = text[counted : end.start()]
        depth += sum(map(chunk.count, "([{")) - sum(map(chunk.count, ")]}"))
        counted = end.start()
        if depth <= 0:
            return text[: end.start()]
    return text


def _math_spans(text: str) -> list[tuple[int, int, str]]:
    r"""What ``_MATH_SPAN_RE.finditer(text)`` finds, as (start, end, content), in linear time.

    The regex tries every opener and, for one that is never closed (``\(`` repeated), scans to the end of the text
    each time: quadratic (40,000 characters took 3.6 s). Here the next closer of each kind is looked up once and
    reused, with the regex's own rules: the alternatives in its order at each position, the shortest content of at
    least one character, and a ``$`` counted only when no backslash precedes it.
    """
    spans: list[tuple[int, int, str]] = []
    next_close: dict[str, int] = {}  # closer -> its first position at or after the last lookup's start (-1: none)

    def closer(mark: str, start: int) -> int:
        found = next_close.get(mark)
        if found is None or (found != -1 and found < start):
            found = _unescaped_dollar(text, start) if mark == "$" else text.find(mark, start)
            next_close[mark] = found
        return found

    position = 0
    while (opener := _MATH_OPENER_RE.search(text, position)) is not None:
        i = opener.start()
        match = None
        if text.startswith("$$", i) and (end := closer("$$", i + 3)) != -1:
            match = (i, end + 2, text[i + 2 : end])
        elif text[i] == "$" and (i == 0 or text[i - 1] != "\\") and (end := closer("$", i + 2)) != -1:
            match = (i, end + 1, text[i + 1 : end])
        elif text.startswith("\\(", i) and (end := closer("\\)", i + 3)) != -1:
            match = (i, end + 2, text[i + 2 : end])
        elif text.startswith("\\[", i) and (end := closer("\\]", i + 3)) != -1:
            match = (i, end + 2, text[i + 2 : end])
        if match is None:
            position = i + 1
        else:
            spans.append(match)
            position = match[1]
    return spans


def _unescaped_dollar(text: str, start: int) -> int:
    """The first ``$`` at or after `start` with no backslash right before it; -1 if none."""
    found = text.find("$", start)
    while found > 0 and text[found - 1] == "\\":
        found = text.find("$", found + 1)
    return found


def _fallback(text: str) -> tuple[str, str] | None:
    """The fallback answer as (rule, span).

    The whole text when it is a bare answer, else the later of the last math span and the last number outside math.
    """
    bare = text.strip()
    if bare and len(bare) <= 100 and "\n" not in bare:
        # "-\frac{10}{9}", "(1, 2)", "$E$", "$odd$": the whole reply is the answer.
        if _MATH_SPAN_RE.fullmatch(bare) and _prose_words(bare) <= _MAX_PHRASE_WORDS:
            return "math", bare
        if _prose_words(bare) == 0 and re.search(r"[\d\\]", bare) and "\\boxed" not in bare:
            return "math", _equation_value(bare)
    math_end, math_value = -1, None
    outside = []
    position = 0
    for start, end, content in _math_spans(text):
        outside.append((position, text[position:start]))
        position = end
        # Prose between two currency signs ("costs $5 and then $") is not math.
        if re.search(r"[\d\\]", content) and _prose_words(content) <= _MAX_PHRASE_WORDS:
            math_end, math_value = end, _equation_value(content)
    outside.append((position, text[position:]))
    number_end, number_value = -1, None
    for offset, chunk in outside:
        for match in _NUMBER_RE.finditer(chunk):
            number_end, number_value = offset + match.end(), match.group(0)
    if math_value is not None and math_end >= number_end:
        return "math", math_value
    if number_value is not None:
        return "number", number_value
    return None


def clean_answer(span: str) -> str:
    r"""Strip delimiters and punctuation; reduce "number + units" to the bare number.

    Examples:
        >>> clean_answer(r"$18 \text{ dollars}$.")
        '18'
        >>> clean_answer(r"90^\circ")
        '90'
        >>> clean_answer(r"\frac{1}{2}")
        '\\frac{1}{2}'
    """
    answer = span.strip()
    for left, right in _DELIMITERS:
        if answer.startswith(left) and answer.endswith(right) and len(answer) > len(left) + len(right):
            answer = answer[len(left) : -len(right)].strip()
            break
    answer = answer.strip().rstrip(".,;:!").strip()
    answer = answer.strip("$").strip()
    whole_text = _WHOLE_TEXT_WRAPPER_RE.match(answer)
    if whole_text:  # "\text{E}", "\text{odd}": the words are the answer
        answer = whole_text.group(1).strip()
    for ascii_relation, latex in _ASCII_RELATIONS:
        answer = answer.replace(ascii_relation, latex)
    unwrapped = _TEXT_WRAPPER_RE.sub(lambda m: " " + m.group(1), answer)
    leading = _LEADING_NUMBER_RE.match(unwrapped)
    if leading and _UNIT_TAIL_RE.match(unwrapped[leading.end() :]):
        return normalize_number(leading.group(1))
    return answer
