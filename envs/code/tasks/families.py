"""The procedural generator's task families: each draws one small function-writing task at a difficulty level 1-5.

A family is one function ``(rng, level) -> FunctionSpec`` registered in `FAMILY_SPECS`. The spec holds what the agent
is told (function name, parameters, a precise summary), the reference solution's source (what the expert writes), the
inputs of the hidden cases (edge cases first) and of the examples, and `FunctionSpec.key`: the parameters that define
the task (constants such as a divisor, a window size, a bracket pair). The generator decides the train / test split
from the key alone, so renaming the function or drawing other inputs never moves a task across splits, and a test
task is never a train task in disguise. Expected values are computed on the host by running the reference source
(`envs.code.tasks.generator`), so the reference and the cases cannot disagree; the tests replay every family and
level through the real grader, and check the trickier references against independent brute-force versions.

Levels, roughly: 1 one loop or formula; 2 a loop with a condition or two; 3 several steps, an edge case or two;
4 a classic algorithm or an efficiency bound (inputs too large for the naive loop); 5 several steps, careful edge
cases, or dynamic programming. Arguments and results are JSON values (lists, never tuples, as arguments).
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["FunctionSpec", "FAMILY_SPECS"]


@dataclass(frozen=True)
class FunctionSpec:
    """One drawn function task, before the generator computes expected values and writes the instruction."""

    name: str
    """The function `solution.py` must define."""
    params: str
    """Its parameter list as written in the instruction, e.g. ``"nums, k"``."""
    summary: str
    """What the function returns, precisely (edge cases included)."""
    source: str
    """The reference solution: a whole ``solution.py``."""
    key: tuple[Any, ...]
    """The parameters that define the task (not names, not inputs): what the split is hashed from."""
    inputs: tuple[tuple[Any, ...], ...]
    """Arguments of the hidden cases, edge cases included (5-10)."""
    examples: tuple[tuple[Any, ...], ...]
    """Arguments of the one or two examples shown in the instruction."""
    note: str = ""
    """An extra line for the instruction (input sizes when speed matters)."""


Family = Callable[[np.random.Generator, int], FunctionSpec]
"""A family: draws one `FunctionSpec` at a level (1-5) from the generator it is given, and from nothing else."""

# ---- drawing helpers ----------------------------------------------------------------------------------------------

_LOWER = string.ascii_lowercase
_SPEED = "Inputs can be large ({}): the function must take well under a second, so {}."
_PAIRS_SLOW = "a check of every pair will not do"
_LOOP_SLOW = "a loop over every number will not do"


def _int(rng: np.random.Generator, low: int, high: int) -> int:
    """A uniform integer in [low, high], both ends included."""
    return int(rng.integers(low, high + 1))


def _pick(rng: np.random.Generator, options: Sequence[Any]) -> Any:
    return options[int(rng.integers(len(options)))]


def _ints(rng: np.random.Generator, n: int, low: int, high: int) -> list[int]:
    return [int(v) for v in rng.integers(low, high + 1, size=n)]


def _word(rng: np.random.Generator, low: int = 2, high: int = 8, letters: str = _LOWER) -> str:
    return "".join(_pick(rng, letters) for _ in range(_int(rng, low, high)))


def _sentence(rng: np.random.Generator, n: int, low: int = 1, high: int = 9, letters: str = _LOWER) -> str:
    return " ".join(_word(rng, low, high, letters) for _ in range(n))


def _text(rng: np.random.Generator, n: int, alphabet: str) -> str:
    return "".join(rng.choice(list(alphabet), size=n).tolist()) if n else ""


def _spec(name: str, params: str, summary: str, source: str, key: tuple[Any, ...], inputs: list[tuple[Any, ...]],
          examples: list[tuple[Any, ...]], note: str = "") -> FunctionSpec:
    return FunctionSpec(name, params, summary, source.strip("\n") + "\n", key, tuple(inputs), tuple(examples), note)


def _levels(*levels: Callable[[np.random.Generator], FunctionSpec]) -> Family:
    """A family from its five level functions."""

    def family(rng: np.random.Generator, level: int) -> FunctionSpec:
        return levels[level - 1](rng)

    return family


# ---- arithmetic ---------------------------------------------------------------------------------------------------


def _arith_1(rng: np.random.Generator) -> FunctionSpec:
    a, b = _int(rng, 2, 9), _int(rng, 1, 20) * _pick(rng, (1, -1))
    name = _pick(rng, ("scale_shift", "linear", "affine_value"))
    sign = f"plus {b}" if b > 0 else f"minus {-b}"
    return _spec(name, "x", f"Return {a} times x {sign}. x is an integer.",
                 f"def {name}(x):\n    return {a} * x + ({b})\n", (a, b),
                 [(0,), (1,), (-1,), (10**12,), (-(10**9),), (_int(rng, -1000, 1000),), (_int(rng, -1000, 1000),)],
                 [(_int(rng, 2, 20),)])


def _arith_2(rng: np.random.Generator) -> FunctionSpec:
    a, b, c = _int(rng, 1, 5), _int(rng, 1, 9), _int(rng, -9, 9)
    name = _pick(rng, ("poly2", "mix_value", "formula"))
    return _spec(name, "x, y", f"Return {a}*x*x - {b}*y + ({c}) for integers x and y.",
                 f"def {name}(x, y):\n    return {a} * x * x - {b} * y + ({c})\n", (a, b, c),
                 [(0, 0), (1, -1), (-3, 4), (10**6, 10**6),
                  *[(_int(rng, -50, 50), _int(rng, -50, 50)) for _ in range(3)]],
                 [(_int(rng, 1, 9), _int(rng, 1, 9))])


def _arith_3(rng: np.random.Generator) -> FunctionSpec:
    a, b = _int(rng, 1, 9), _int(rng, 0, 9)
    name = _pick(rng, ("series_sum", "total_of_terms", "sum_terms"))
    return _spec(name, "n", f"The i-th term of a sequence is {a}*i + {b} (i = 1, 2, 3, ...). Return the sum of the "
                 "first n terms; 0 when n is 0 or negative.",
                 f"def {name}(n):\n    return sum({a} * i + {b} for i in range(1, n + 1))\n", (a, b),
                 [(0,), (1,), (-4,), (2,), (1000,), (_int(rng, 3, 60),), (_int(rng, 100, 900),)],
                 [(_int(rng, 2, 6),)])


def _arith_4(rng: np.random.Generator) -> FunctionSpec:
    a = _int(rng, 2, 14)
    b = _int(rng, a + 1, 15)
    name = _pick(rng, ("count_multiples", "divisible_count", "multiples_upto"))
    source = f"""
from math import gcd


def {name}(n):
    if n <= 0:
        return 0
    lcm = {a} * {b} // gcd({a}, {b})
    return n // {a} + n // {b} - n // lcm
"""
    return _spec(name, "n", f"Return how many integers in 1..n (inclusive) are divisible by {a} or by {b} (or both); "
                 "0 when n is 0 or negative.", source, (a, b),
                 [(0,), (1,), (a,), (b,), (a * b,), (10**12,), (_int(rng, 10**9, 10**11),), (_int(rng, 10, 500),)],
                 [(_int(rng, 10, 40),)], _SPEED.format("n up to 10**12", _LOOP_SLOW))


def _arith_5(rng: np.random.Generator) -> FunctionSpec:
    rate, fee = _int(rng, 1, 30), _int(rng, 0, 9)
    name = _pick(rng, ("months_to_repay", "payoff_months", "loan_months"))
    fee_text = f", then a fee of {fee} is added" if fee else ""
    source = f"""
def {name}(balance, payment):
    if balance <= 0:
        return 0
    if payment <= balance * {rate} // 1000 + {fee}:
        return -1
    months = 0
    while balance > 0:
        balance = balance + balance * {rate} // 1000 + {fee} - payment
        months += 1
    return months
"""
    summary = (f"A loan of `balance` cents is repaid with `payment` cents a month. Each month, interest of "
               f"balance * {rate} // 1000 cents (integer division) is added to the balance{fee_text}, and then the "
               f"payment is subtracted. Return the number of months until the balance is 0 or less; 0 if it already "
               f"is; -1 if the payment is not larger than the first month's interest plus fee (the loan never "
               f"shrinks).")
    inputs: list[tuple[Any, ...]] = [(0, 100), (-5, 10), (1000, 1000), (10**6, 10**6 * rate // 1000 + fee)]
    for _ in range(4):
        balance = _int(rng, 1000, 10**6)
        inputs.append((balance, int(balance * rate // 1000 * 1.3) + fee + _int(rng, 1, balance // 10)))
    example = _int(rng, 1000, 5000)
    return _spec(name, "balance, payment", summary, source, (rate, fee), inputs,
                 [(example, example // 3 + rate + fee)])


# ---- strings ------------------------------------------------------------------------------------------------------


def _str_1(rng: np.random.Generator) -> FunctionSpec:
    old, new = (str(c) for c in rng.choice(list(_LOWER), size=2, replace=False))
    name = _pick(rng, ("swap_letter", "replace_char", "substitute"))
    with_old = lambda: _word(rng, 1, 4) + old + _word(rng, 0, 4) + old  # noqa: E731
    return _spec(name, "s", f"Return s with every lowercase '{old}' replaced by '{new}' (an uppercase '{old.upper()}' "
                 "stays as it is).", f"def {name}(s):\n    return s.replace({old!r}, {new!r})\n", (old, new),
                 [("",), (old * 5,), (old.upper() + old + old.upper(),), (new + new,), (with_old(),),
                  (with_old() + " " + with_old(),), (_sentence(rng, 3),)], [(with_old(),)])


def _str_2(rng: np.random.Generator) -> FunctionSpec:
    k, both = _int(rng, 1, 25), bool(_int(rng, 0, 1))
    name = _pick(rng, ("caesar", "shift_letters", "rotate_text"))
    upper = (f"\n        elif 'A' <= ch <= 'Z':\n            out.append(chr((ord(ch) - 65 + {k}) % 26 + 65))"
             if both else "")
    source = f"""
def {name}(s):
    out = []
    for ch in s:
        if 'a' <= ch <= 'z':
            out.append(chr((ord(ch) - 97 + {k}) % 26 + 97)){upper}
        else:
            out.append(ch)
    return ''.join(out)
"""
    rule = ("uppercase letters likewise (staying uppercase)" if both else "uppercase letters are not changed")
    mixed = _sentence(rng, 3, letters=_LOWER + "XYZABQ")
    return _spec(name, "s", f"Shift every lowercase letter a-z {k} places forward in the alphabet, wrapping around "
                 f"from z to a; {rule}; every other character stays. Return the new string.", source, (k, both),
                 [("",), ("xyz abc",), ("Hello, World!",), ("zzz-ZZZ 09",), (mixed,), (_sentence(rng, 4),)],
                 [("abc xyz",)])


def _str_3(rng: np.random.Generator) -> FunctionSpec:
    m = _int(rng, 2, 8)
    mode = _pick(rng, ("reversed", "upper-cased", "capitalized", "replaced by their length", "written twice",
                       "stripped of their vowels (a, e, i, o, u)"))
    name = _pick(rng, ("transform_long_words", "edit_words", "long_word_pass"))
    expr = {"reversed": "w[::-1]", "upper-cased": "w.upper()", "capitalized": "w[:1].upper() + w[1:]",
            "replaced by their length": "str(len(w))", "written twice": "w + w",
            "stripped of their vowels (a, e, i, o, u)": "''.join(ch for ch in w if ch not in 'aeiou')"}[mode]
    source = f"""
def {name}(s):
    return ' '.join({expr} if len(w) >= {m} else w for w in s.split(' '))
"""
    return _spec(name, "s", f"s is made of lowercase words separated by single spaces (it may be empty). Words with at "
                 f"least {m} letters are {mode}; shorter words stay. Return the words joined again by single spaces.",
                 source, (m, mode),
                 [("",), ("a",), (_word(rng, m, m),), (_word(rng, 1, m - 1),), (_sentence(rng, 5),),
                  (_sentence(rng, 8),)], [(_sentence(rng, 3, 2, 8),)])


def _str_4(rng: np.random.Generator) -> FunctionSpec:
    width, joined = _int(rng, 8, 40), bool(_int(rng, 0, 1))
    name = _pick(rng, ("wrap_text", "fill_lines", "word_wrap"))
    returned = "'\\n'.join(lines)" if joined else "lines"
    source = f"""
def {name}(text):
    lines, line = [], ''
    for word in text.split():
        if not line:
            line = word
        elif len(line) + 1 + len(word) <= {width}:
            line += ' ' + word
        else:
            lines.append(line)
            line = word
    if line:
        lines.append(line)
    return {returned}
"""
    result = ("Return the lines joined into one string with a newline ('\\n') between lines ('' when there are no "
              "words).") if joined else "Return the list of lines ([] when there are no words)."
    long_word = _word(rng, width + 1, width + 5)
    exact = " ".join(["x" * (width // 2 - 1), "y" * (width - width // 2)])  # exactly `width` characters
    return _spec(name, "text", f"Split text into words (separated by any whitespace: spaces, tabs, newlines) and pack "
                 f"them greedily into lines of at most {width} characters: each line takes as many of the next words "
                 f"as fit, joined by single spaces. A word longer than {width} characters goes alone on its own line "
                 f"(it is never split). {result}", source, (width, joined),
                 [("",), ("   \n\t",), (long_word,), (exact,), (_sentence(rng, 12) + "\n" + _sentence(rng, 5),),
                  (_sentence(rng, 3) + " " + long_word + "  " + _sentence(rng, 2),), (_sentence(rng, 30),)],
                 [(_sentence(rng, 6, 2, 7),)])


def _str_5(rng: np.random.Generator) -> FunctionSpec:
    k, fold, length = _int(rng, 1, 5), bool(_int(rng, 0, 1)), bool(_int(rng, 0, 1))
    name = _pick(rng, ("longest_few_distinct", "longest_k_window", "widest_span"))
    source = f"""
def {name}(s):
    key = s{'.lower()' if fold else ''}
    counts = {{}}
    best_start, best_len, left = 0, 0, 0
    for right, ch in enumerate(key):
        counts[ch] = counts.get(ch, 0) + 1
        while len(counts) > {k}:
            gone = key[left]
            counts[gone] -= 1
            if counts[gone] == 0:
                del counts[gone]
            left += 1
        if right - left + 1 > best_len:
            best_start, best_len = left, right - left + 1
    return {'best_len' if length else 's[best_start:best_start + best_len]'}
"""
    what = ("Return the length of the longest substring" if length else "Return the longest substring")
    tie = "" if length else " If several are longest, return the leftmost; return '' for an empty s."
    case = (" Letters are compared ignoring case ('a' and 'A' count as the same character)." if fold else
            " Characters are compared exactly ('a' and 'A' differ).")
    alphabet = "abcdAB" if fold else "abcde"
    return _spec(name, "s", f"{what} (a contiguous part) of s that has at most {k} distinct characters.{case}{tie}",
                 source, (k, fold, length),
                 [("",), ("a",), ("aaaa",), ("abAB" * 3,), (_text(rng, 12, alphabet),), (_text(rng, 40, alphabet),),
                  (_text(rng, 2000, alphabet),)], [(_text(rng, 9, alphabet[:4]),)])


# ---- lists --------------------------------------------------------------------------------------------------------


def _list_1(rng: np.random.Generator) -> FunctionSpec:
    t, greater = _int(rng, -10, 10), bool(_int(rng, 0, 1))
    op, word = (">", "greater") if greater else ("<", "less")
    name = _pick(rng, ("sum_over", "filtered_sum", "partial_total"))
    return _spec(name, "nums", f"Return the sum of the elements of the integer list nums that are strictly {word} than "
                 f"{t} (0 if there are none).", f"def {name}(nums):\n    return sum(x for x in nums if x {op} {t})\n",
                 (t, greater),
                 [([],), ([t],), ([t - 1, t, t + 1],), (_ints(rng, 10, -30, 30),), (_ints(rng, 50, -100, 100),),
                  ([10**12, -(10**12), t],)], [(_ints(rng, 6, -15, 15),)])


def _list_2(rng: np.random.Generator) -> FunctionSpec:
    d, m = _int(rng, 2, 9), _int(rng, 1, 5)
    name = _pick(rng, ("keep_multiples", "scaled_multiples", "select_divisible"))
    times = "" if m == 1 else f", each multiplied by {m}"
    expr = "x" if m == 1 else f"x * {m}"
    return _spec(name, "nums", f"Return the elements of the integer list nums that are divisible by {d} (negative ones "
                 f"and 0 included){times}, in their original order.",
                 f"def {name}(nums):\n    return [{expr} for x in nums if x % {d} == 0]\n", (d, m),
                 [([],), ([0],), ([1, 2, 3],), ([-d, d, -2 * d + 1],), (_ints(rng, 12, -40, 40),),
                  (_ints(rng, 40, -500, 500),)], [(_ints(rng, 7, 0, 30),)])


def _list_3(rng: np.random.Generator) -> FunctionSpec:
    w = _int(rng, 2, 6)
    agg = _pick(rng, ("sum", "max", "min", "spread"))
    name = _pick(rng, ("window_values", "sliding", "rolling"))
    expr = {"sum": "sum(part)", "max": "max(part)", "min": "min(part)", "spread": "max(part) - min(part)"}[agg]
    what = {"sum": "sum", "max": "largest element", "min": "smallest element",
            "spread": "largest minus smallest element"}[agg]
    source = f"""
def {name}(nums):
    out = []
    for i in range(len(nums) - {w} + 1):
        part = nums[i:i + {w}]
        out.append({expr})
    return out
"""
    return _spec(name, "nums", f"For every window of {w} consecutive elements of the integer list nums, from left to "
                 f"right, give the window's {what}. Return the list of these values ([] when nums has fewer than {w} "
                 "elements).", source, (w, agg),
                 [([],), (list(range(w - 1)),), (list(range(w)),), (_ints(rng, w + 3, -9, 9),),
                  (_ints(rng, 30, -100, 100),)], [(_ints(rng, w + 2, 0, 9),)])


def _list_4(rng: np.random.Generator) -> FunctionSpec:
    lo, hi, length = _int(rng, -3, 0), _int(rng, 0, 3), bool(_int(rng, 0, 1))
    name = _pick(rng, ("longest_run", "longest_stretch", "best_streak"))
    source = f"""
def {name}(nums):
    best_start, best_len, start = 0, (1 if nums else 0), 0
    for i in range(1, len(nums)):
        if not ({lo} <= nums[i] - nums[i - 1] <= {hi}):
            start = i
        if i - start + 1 > best_len:
            best_start, best_len = start, i - start + 1
    return {'best_len' if length else 'nums[best_start:best_start + best_len]'}
"""
    what = "Return the length of the longest run (0 for an empty list)." if length else (
        "Return the longest run (the leftmost one if several are longest; [] for an empty list).")
    return _spec(name, "nums", f"A run is a contiguous part of the integer list nums in which every element minus the "
                 f"one before it is between {lo} and {hi} (inclusive). {what}", source, (lo, hi, length),
                 [([],), ([5],), ([1, 1, 1, 1],), ([1, 5, 9, 13],), (_ints(rng, 20, 0, 6),), (_ints(rng, 200, 0, 5),),
                  (list(range(0, 40, 2)) + list(range(40, 0, -1)),)], [(_ints(rng, 8, 0, 5),)])


def _list_5(rng: np.random.Generator) -> FunctionSpec:
    limit, largest = _int(rng, 2, 11), bool(_int(rng, 0, 1))
    name = _pick(rng, ("best_short_sum", "short_segment_sum", "bounded_window_sum"))
    cmp, word = (">", "largest") if largest else ("<", "smallest")
    source = f"""
def {name}(nums):
    best = None
    for i in range(len(nums)):
        total = 0
        for j in range(i, min(i + {limit}, len(nums))):
            total += nums[j]
            if best is None or total {cmp} best:
                best = total
    return best
"""
    return _spec(name, "nums", f"Return the {word} sum of a non-empty contiguous part of the integer list nums that "
                 f"has at most {limit} elements; None for an empty list.", source, (limit, largest),
                 [([],), ([-7],), ([3, -1, 4],), ([-2] * 20,), (_ints(rng, 15, -20, 20),), (_ints(rng, 3000, -50, 50),),
                  ([100] * (limit + 3),)], [(_ints(rng, 6, -9, 9),)])


# ---- counting -----------------------------------------------------------------------------------------------------


def _count_1(rng: np.random.Generator) -> FunctionSpec:
    c, fold = _pick(rng, _LOWER), bool(_int(rng, 0, 1))
    name = _pick(rng, ("count_letter", "letter_count", "occurrences"))
    rule = f"both '{c}' and '{c.upper()}' count" if fold else f"only lowercase '{c}' counts, not '{c.upper()}'"
    body = f"s.lower().count({c!r})" if fold else f"s.count({c!r})"
    letters = _LOWER[:5] + c + c.upper() + " "
    return _spec(name, "s", f"Return how many times the letter '{c}' occurs in s; {rule}.",
                 f"def {name}(s):\n    return {body}\n", (c, fold),
                 [("",), (c * 7,), (c.upper() * 3 + c,), (_text(rng, 30, letters),), (_text(rng, 200, letters),)],
                 [(_text(rng, 10, letters),)])


def _count_2(rng: np.random.Generator) -> FunctionSpec:
    chars = "".join(sorted(str(c) for c in rng.choice(list(_LOWER), size=_int(rng, 3, 5), replace=False)))
    name = _pick(rng, ("count_special", "count_from_set", "tally_chars"))
    listed = ", ".join(f"'{c}'" for c in chars)
    mixed = chars + chars.upper() + "xyz .,"
    return _spec(name, "s", f"Return how many characters of s are one of the letters {listed}, in either case "
                 "('A' counts like 'a').",
                 f"def {name}(s):\n    return sum(1 for ch in s.lower() if ch in {chars!r})\n",
                 (chars,), [("",), (chars,), (chars.upper(),), ("0123 .,!",), (_text(rng, 25, mixed),),
                            (_text(rng, 300, mixed),)], [(_text(rng, 10, mixed),)])


def _count_3(rng: np.random.Generator) -> FunctionSpec:
    m, x = _int(rng, 1, 6), _pick(rng, _LOWER[:12])
    name = _pick(rng, ("count_words_with", "matching_words", "word_hits"))
    letters = _LOWER[:12]
    return _spec(name, "s", f"Split s into words at whitespace. Return how many words have at least {m} "
                 f"letter{'s' if m > 1 else ''} and contain the letter '{x}'.",
                 f"def {name}(s):\n    return sum(1 for w in s.split() if len(w) >= {m} and {x!r} in w)\n", (m, x),
                 [("",), (x,), (x * m,), ("  \n ",), (_sentence(rng, 10, letters=letters),),
                  (_sentence(rng, 80, letters=letters) + "\n" + _sentence(rng, 5, letters=letters),)],
                 [(_sentence(rng, 5, 1, 7, letters=letters),)])


def _count_4(rng: np.random.Generator) -> FunctionSpec:
    k, op = _int(rng, 2, 20), _pick(rng, ("sum", "difference"))
    name = _pick(rng, ("count_pairs", "pair_count", "divisible_pairs"))
    if op == "sum":
        rule, body = f"nums[i] + nums[j] is divisible by {k}", f"""
    total = counts[0] * (counts[0] - 1) // 2
    for r in range(1, {k}):
        if r < {k} - r:
            total += counts[r] * counts[{k} - r]
        elif r == {k} - r:
            total += counts[r] * (counts[r] - 1) // 2
    return total"""
    else:
        rule, body = f"nums[i] - nums[j] is divisible by {k}", """
    return sum(c * (c - 1) // 2 for c in counts)"""
    source = f"""
def {name}(nums):
    counts = [0] * {k}
    for x in nums:
        counts[x % {k}] += 1{body}
"""
    return _spec(name, "nums", f"Return the number of index pairs i < j such that {rule} (negative numbers and 0 are "
                 "divisible as usual: -6 and 0 are divisible by 3).", source, (k, op),
                 [([],), ([k],), ([0, 0, 0],), ([-1, 1, k - 1, 1 - k],), (_ints(rng, 30, -50, 50),),
                  (_ints(rng, 20000, -10**6, 10**6),), (_ints(rng, 20000, 0, 3 * k),)], [(_ints(rng, 6, 0, 12),)],
                 _SPEED.format("up to 20000 elements", _PAIRS_SLOW))


def _count_5(rng: np.random.Generator) -> FunctionSpec:
    mode = _pick(rng, ("equal", "divisible"))
    param = _int(rng, -5, 15) if mode == "equal" else _int(rng, 2, 10)
    name = _pick(rng, ("count_segments", "segment_count", "subarray_count"))
    test = f"prefix - {param}" if mode == "equal" else f"prefix % {param}"
    key_expr = "prefix" if mode == "equal" else f"prefix % {param}"
    rule = f"sum is exactly {param}" if mode == "equal" else f"sum is divisible by {param} (0 included)"
    source = f"""
def {name}(nums):
    seen = {{0: 1}}
    prefix = total = 0
    for x in nums:
        prefix += x
        total += seen.get({test}, 0)
        seen[{key_expr}] = seen.get({key_expr}, 0) + 1
    return total
"""
    return _spec(name, "nums", f"Return the number of non-empty contiguous parts of the integer list nums whose "
                 f"{rule}.",
                 source, (mode, param),
                 [([],), ([param],), ([0, 0, 0],), (_ints(rng, 10, -5, 8),), (_ints(rng, 40, -10, 10),),
                  (_ints(rng, 20000, -20, 20),)], [(_ints(rng, 6, -3, 6),)],
                 _SPEED.format("up to 20000 elements", _PAIRS_SLOW))


# ---- digits -------------------------------------------------------------------------------------------------------


def _digits_1(rng: np.random.Generator) -> FunctionSpec:
    mode = _pick(rng, ("equal to", "greater than", "less than"))
    d = {"equal to": _int(rng, 0, 9), "greater than": _int(rng, 0, 8), "less than": _int(rng, 1, 9)}[mode]
    op = {"equal to": "==", "greater than": ">", "less than": "<"}[mode]
    name = _pick(rng, ("count_digits", "digit_tally", "digits_matching"))
    return _spec(name, "n", f"n is a non-negative integer. Return how many of its decimal digits are {mode} {d} "
                 "(0 is written with the single digit 0).",
                 f"def {name}(n):\n    return sum(1 for ch in str(n) if int(ch) {op} {d})\n", (mode, d),
                 [(0,), (d,), (int(str(d) * 6),), (9876543210,), (_int(rng, 10, 10**6),), (_int(rng, 10**9, 10**18),)],
                 [(_int(rng, 100, 99999),)])


def _digits_2(rng: np.random.Generator) -> FunctionSpec:
    base = _pick(rng, (2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 16))
    stat = _pick(rng, ("sum", "nonzero", "largest"))
    name = _pick(rng, ("base_digit_stat", "digits_in_base", "radix_stat"))
    expr = {"sum": "sum(digits)", "nonzero": "sum(1 for d in digits if d)", "largest": "max(digits)"}[stat]
    what = {"sum": "the sum of its digits", "nonzero": "how many of its digits are not 0",
            "largest": "its largest digit"}[stat]
    source = f"""
def {name}(n):
    digits = []
    while True:
        digits.append(n % {base})
        n //= {base}
        if n == 0:
            break
    return {expr}
"""
    return _spec(name, "n", f"Write the non-negative integer n in base {base} (0 is the single digit 0). Return "
                 f"{what}, digits counted by their value (in base 16, 'f' is 15).", source, (base, stat),
                 [(0,), (1,), (base,), (base**3 - 1,), (_int(rng, 10, 10**4),), (_int(rng, 10**8, 10**15),)],
                 [(_int(rng, 10, 500),)])


def _digits_3(rng: np.random.Generator) -> FunctionSpec:
    op, t = _pick(rng, ("sum", "product")), _int(rng, 10, 30)
    name = _pick(rng, ("reduce_steps", "digit_persistence", "shrink_count"))
    step = "sum(int(ch) for ch in str(n))" if op == "sum" else "_product(n)"
    helper = "" if op == "sum" else """
def _product(n):
    result = 1
    for ch in str(n):
        result *= int(ch)
    return result

"""
    source = f"""{helper}
def {name}(n):
    steps = 0
    while n >= {t}:
        n = {step}
        steps += 1
    return steps
"""
    return _spec(name, "n", f"n is a non-negative integer. While n is {t} or more, replace it by the {op} of its "
                 "decimal digits. Return how many replacements were made (0 if n starts below "
                 f"{t}).", source, (op, t),
                 [(0,), (t - 1,), (t,), (999999999999,), (277777788888899,), (_int(rng, 100, 10**6),),
                  (_int(rng, 10**9, 10**15),)], [(_int(rng, 100, 9999),)])


def _digits_4(rng: np.random.Generator) -> FunctionSpec:
    base, mode = _int(rng, 2, 16), _pick(rng, ("palindrome", "increasing"))
    name = _pick(rng, ("digit_pattern", "base_check", "shape_in_base"))
    test = "digits == digits[::-1]" if mode == "palindrome" else (
        "all(a < b for a, b in zip(digits, digits[1:]))")
    what = ("its digits read the same in both directions" if mode == "palindrome" else
            "its digits, read from the most significant, are strictly increasing")
    source = f"""
def {name}(n):
    digits = []
    while True:
        digits.append(n % {base})
        n //= {base}
        if n == 0:
            break
    digits.reverse()
    return {test}
"""
    return _spec(name, "n", f"Write the non-negative integer n in base {base} (0 is the single digit 0). Return True "
                 f"if {what}, else False.", source, (base, mode),
                 [(0,), (base - 1,), (base,), (base * base + 1,), (1 + 2 * base + 3 * base * base,),
                  (_int(rng, 10, 10**4),), (_int(rng, 10**6, 10**12),)], [(_int(rng, 5, 300),)])


def _digits_5(rng: np.random.Generator) -> FunctionSpec:
    target = _int(rng, 1, 40)
    name = _pick(rng, ("count_digit_sum", "digit_sum_range", "numbers_with_sum"))
    source = f"""
from functools import lru_cache


def _count_upto(x):
    if x < 0:
        return 0
    digits = [int(ch) for ch in str(x)]

    @lru_cache(maxsize=None)
    def go(pos, remaining, tight):
        if remaining < 0:
            return 0
        if pos == len(digits):
            return 1 if remaining == 0 else 0
        limit = digits[pos] if tight else 9
        return sum(go(pos + 1, remaining - d, tight and d == limit) for d in range(limit + 1))

    return go(0, {target}, True)


def {name}(lo, hi):
    return _count_upto(hi) - _count_upto(lo - 1)
"""
    small = _int(rng, 0, 5000)
    return _spec(name, "lo, hi", f"Return how many integers x with lo <= x <= hi have decimal digits that add up to "
                 f"exactly {target}. 0 <= lo <= hi.", source, (target,),
                 [(0, 0), (0, 9), (target, target), (small, small + _int(rng, 100, 3000)), (1, 10**6),
                  (1, 10**12), (_int(rng, 10**9, 10**11), 10**12)], [(0, _int(rng, 50, 200))],
                 _SPEED.format("hi up to 10**12", _LOOP_SLOW))


# ---- sorting ------------------------------------------------------------------------------------------------------


def _sort_1(rng: np.random.Generator) -> FunctionSpec:
    m, desc = _int(rng, 2, 10), bool(_int(rng, 0, 1))
    name = _pick(rng, ("sort_by_remainder", "remainder_order", "mod_sort"))
    order = "largest remainder first" if desc else "smallest remainder first"
    return _spec(name, "nums", f"Return the integers of nums sorted by their remainder x % {m} as Python computes it "
                 f"(always 0 to {m - 1}, also for negative x), {order}. Elements with equal remainders keep their "
                 "original order.",
                 f"def {name}(nums):\n    return sorted(nums, key=lambda x: x % {m}, reverse={desc})\n",
                 (m, desc), [([],), ([5],), (list(range(2 * m)),), ([-1, -m, m + 1, 1],), (_ints(rng, 20, -50, 50),)],
                 [(_ints(rng, 6, 0, 20),)])


def _sort_2(rng: np.random.Generator) -> FunctionSpec:
    desc, m = bool(_int(rng, 0, 1)), _int(rng, 0, 3)
    tie = _pick(rng, ("alphabetical", "reverse alphabetical", "original"))
    name = _pick(rng, ("sort_words", "order_by_length", "length_sort"))
    if tie == "alphabetical":
        expr = f"sorted(kept, key=lambda w: ({'-' if desc else ''}len(w), w))"
    elif tie == "reverse alphabetical":
        expr = f"sorted(sorted(kept, reverse=True), key=len, reverse={desc})"
    else:
        expr = f"sorted(kept, key=len, reverse={desc})"
    tie_text = {"alphabetical": "in alphabetical order", "reverse alphabetical": "in reverse alphabetical order",
                "original": "in their original order"}[tie]
    drop = f"Drop the words shorter than {m} letters; sort" if m else "Sort"
    source = f"""
def {name}(words):
    kept = [w for w in words if len(w) >= {m}]
    return {expr}
"""
    words = lambda n: [_word(rng, 1, 6) for _ in range(n)]  # noqa: E731
    return _spec(name, "words", f"words is a list of lowercase words. {drop} the words by length, "
                 f"{'longest' if desc else 'shortest'} first; words of the same length come {tie_text}. Return the "
                 "new list (duplicates stay).", source, (desc, tie, m),
                 [([],), (["a"],), (["bb", "aa", "cc", "a", "ccc"],), (words(8),), (words(30) + ["zz", "zz"],)],
                 [(words(5),)])


def _sort_3(rng: np.random.Generator) -> FunctionSpec:
    p, asc, k = _pick(rng, (0, 10, 20, 30, 40, 50)), bool(_int(rng, 0, 1)), _int(rng, 1, 5)
    name = _pick(rng, ("top_names", "ranked_names", "leaderboard"))
    key_expr = "(r[1], r[0])" if asc else "(-r[1], r[0])"
    source = f"""
def {name}(records):
    kept = [r for r in records if r[1] >= {p}]
    kept.sort(key=lambda r: {key_expr})
    return [r[0] for r in kept[:{k}]]
"""
    names = ("ana", "bo", "cy", "dee", "eli", "fay", "gus", "hal", "ida", "jo", "kai", "lu")

    def records(n: int) -> list[list[Any]]:
        return [[_pick(rng, names) + str(_int(rng, 1, 9)), _int(rng, 0, 100)] for _ in range(n)]

    return _spec(name, "records", f"records is a list of [name, score] pairs (score an integer). Keep the pairs with a "
                 f"score of at least {p}, order them by score ({'lowest' if asc else 'highest'} first), equal scores "
                 f"by name in alphabetical order, and return the names of the first {k} (fewer if fewer are left) "
                 "as a list.",
                 source, (p, asc, k),
                 [([],), ([["zed", p], ["amy", p]],), ([["a", p - 1]] if p else [["a", 0]],), (records(6),),
                  (records(25),)], [(records(4),)])


def _sort_4(rng: np.random.Generator) -> FunctionSpec:
    metric = _pick(rng, ("bits", "digit sum", "last digit"))
    desc, tie_desc, distinct = bool(_int(rng, 0, 1)), bool(_int(rng, 0, 1)), bool(_int(rng, 0, 1))
    name = _pick(rng, ("custom_sort", "sort_by_feature", "feature_order"))
    feature = {"bits": "bin(x).count('1')", "digit sum": "sum(int(ch) for ch in str(x))",
               "last digit": "x % 10"}[metric]
    what = {"bits": "the number of 1 bits in its binary form", "digit sum": "the sum of its decimal digits",
            "last digit": "its last decimal digit"}[metric]
    source = f"""
def {name}(nums):
    values = {'sorted(set(nums))' if distinct else 'list(nums)'}
    return sorted(values, key=lambda x: ({'-' if desc else ''}({feature}), {'-' if tie_desc else ''}x))
"""
    distinct_text = "Remove repeated values, then sort" if distinct else "Sort"
    return _spec(name, "nums", f"nums is a list of non-negative integers. {distinct_text} them by {what}, "
                 f"{'largest' if desc else 'smallest'} first; ties by the value itself, "
                 f"{'largest' if tie_desc else 'smallest'} first. Return the sorted list.", source,
                 (metric, desc, tie_desc, distinct),
                 [([],), ([0],), ([7, 7, 7],), ([1, 2, 4, 8, 3, 5],), (_ints(rng, 12, 0, 100),),
                  (_ints(rng, 40, 0, 10**6),)], [(_ints(rng, 6, 0, 40),)])


def _sort_5(rng: np.random.Generator) -> FunctionSpec:
    sep, desc, m = _pick(rng, (".", "-", "_")), bool(_int(rng, 0, 1)), _int(rng, 0, 3)
    name = _pick(rng, ("sort_versions", "version_order", "release_sort"))
    source = f"""
def _version_key(v):
    parts = [int(p) for p in v.split({sep!r})]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def {name}(versions):
    kept = [v for v in versions if int(v.split({sep!r})[0]) >= {m}]
    return sorted(kept, key=_version_key, reverse={desc})
"""

    def version() -> str:
        return sep.join(str(_int(rng, 0, 12)) for _ in range(_int(rng, 1, 4)))

    drop = f"Drop the versions whose first part is below {m}, then sort" if m else "Sort"
    return _spec(name, "versions", f"Each version is written as non-negative integers joined by '{sep}', like "
                 f"'{sep.join(['1', '10', '2'])}'. Versions compare part by part as numbers (so 10 is after 9), and a "
                 f"missing part counts as 0 ('{sep.join(['1', '2'])}' equals '{sep.join(['1', '2', '0'])}'). {drop} "
                 f"the list, {'newest' if desc else 'oldest'} first; equal versions keep their original order. Return "
                 "the new list.", source, (sep, desc, m),
                 [([],), ([sep.join(["1", "2"]), sep.join(["1", "2", "0"]), "1"],),
                  ([sep.join(["1", "10"]), sep.join(["1", "9"]), sep.join(["1", "9", "1"])],),
                  ([version() for _ in range(8)],), ([version() for _ in range(25)],)],
                 [([version() for _ in range(4)],)])


# ---- run-length encoding ------------------------------------------------------------------------------------------


def _rle_1(rng: np.random.Generator) -> FunctionSpec:
    c = _pick(rng, _LOWER)
    name = _pick(rng, ("longest_run_of", "max_streak", "run_length"))
    source = f"""
def {name}(s):
    best = current = 0
    for ch in s:
        current = current + 1 if ch == {c!r} else 0
        best = max(best, current)
    return best
"""
    other = _pick(rng, [x for x in _LOWER if x != c])
    alphabet = c * 3 + other + c.upper()
    return _spec(name, "s", f"Return the length of the longest run of consecutive '{c}' characters in s (0 if there "
                 f"is none; '{c.upper()}' does not count).", source, (c,),
                 [("",), (other,), (c,), (c * 5 + other + c * 6,), (_text(rng, 30, alphabet),),
                  (_text(rng, 300, alphabet),)], [(_text(rng, 10, alphabet),)])


def _rle_format(rng: np.random.Generator) -> tuple[bool, str]:
    return bool(_int(rng, 0, 1)), _pick(rng, ("", ",", "-", " "))


def _rle_2(rng: np.random.Generator) -> FunctionSpec:
    (count_first, sep), omit_one = _rle_format(rng), bool(_int(rng, 0, 1))
    name = _pick(rng, ("rle_encode", "compress_runs", "pack_runs"))
    group = "str(n) + ch" if count_first else "ch + str(n)"
    if omit_one:
        group = f"({group} if n > 1 else ch)"
    source = f"""
from itertools import groupby


def {name}(s):
    parts = []
    for ch, run in groupby(s):
        n = len(list(run))
        parts.append({group})
    return {sep!r}.join(parts)
"""
    order = "the count, then the letter" if count_first else "the letter, then the count"
    ones = " A run of one letter is written as the letter alone." if omit_one else ""
    joined = f"joined by '{sep}'" if sep else "written one after another"
    return _spec(name, "s", f"Encode the string s of letters run by run: each run of equal letters becomes {order} "
                 f"(e.g. a run 'aaa' becomes '{'3a' if count_first else 'a3'}').{ones} The runs are {joined}. "
                 "Return the encoding ('' for an empty s).", source, (count_first, sep, omit_one),
                 [("",), ("a",), ("aaaaaaaaaaaa",), ("abAB",), (_text(rng, 20, "aabbbc"),), (_text(rng, 200, "aaab"),)],
                 [(_text(rng, 8, "aab"),)])


def _rle_3(rng: np.random.Generator) -> FunctionSpec:
    (count_first, sep), omit_one = _rle_format(rng), bool(_int(rng, 0, 1))
    name = _pick(rng, ("rle_decode", "expand_runs", "unpack_runs"))
    digits = r"\d*" if omit_one else r"\d+"
    pattern = f"({digits})([A-Za-z])" if count_first else f"([A-Za-z])({digits})"
    pair = "count, ch" if count_first else "ch, count"
    source = f"""
import re


def {name}(code):
    out = []
    for {pair} in re.findall({pattern!r}, code):
        out.append(ch * (int(count) if count else 1))
    return ''.join(out)
"""
    order = "a count, then a letter" if count_first else "a letter, then a count"
    ones = " The count may be left out when it is 1." if omit_one else ""
    joined = f"separated by '{sep}'" if sep else "written one after another"
    example = ("3a" if count_first else "a3") + sep + ("12b" if count_first else "b12")

    def encode(text: str) -> str:
        parts = []
        i = 0
        while i < len(text):
            j = i
            while j < len(text) and text[j] == text[i]:
                j += 1
            n = str(j - i) if (j - i > 1 or not omit_one or _int(rng, 0, 1)) else ""
            parts.append(n + text[i] if count_first else text[i] + n)
            i = j
        return sep.join(parts)

    return _spec(name, "code", f"code is a run-length encoding: groups of {order} (counts are 1 or more, possibly "
                 f"several digits), {joined}.{ones} For example '{example}' stands for 'aaa' followed by twelve 'b'. "
                 "Return the decoded string ('' for an empty code).", source, (count_first, sep, omit_one),
                 [("",), (encode("a"),), (encode("z" * 15),), (encode("aBBc"),), (encode(_text(rng, 30, "aaabbC")),),
                  (encode(_text(rng, 100, "xxxxy")),)], [(encode(_text(rng, 7, "aab")),)])


def _rle_4(rng: np.random.Generator) -> FunctionSpec:
    m, (count_first, sep) = _int(rng, 2, 9), _rle_format(rng)
    name = _pick(rng, ("rle_chunks", "bounded_runs", "capped_encode"))
    group = "str(take) + ch" if count_first else "ch + str(take)"
    source = f"""
from itertools import groupby


def {name}(s):
    parts = []
    for ch, run in groupby(s):
        n = len(list(run))
        while n > 0:
            take = min(n, {m})
            parts.append({group})
            n -= take
    return {sep!r}.join(parts)
"""
    order = "the count, then the letter" if count_first else "the letter, then the count"
    joined = f"joined by '{sep}'" if sep else "written one after another"
    long_run = "a" * (m + 1)
    shown = sep.join([(f"{m}a" if count_first else f"a{m}"), ("1a" if count_first else "a1")])
    return _spec(name, "s", f"Encode the string s of letters run by run, where a count may be at most {m}: a run of "
                 f"equal letters becomes groups of {order}, each group taking up to {m} letters of the run, the last "
                 f"one the rest (so '{long_run}' becomes '{shown}'). Groups are {joined}; a count of 1 is written "
                 "too. Return the encoding ('' for an empty s).", source, (m, count_first, sep),
                 [("",), ("a",), ("b" * m,), ("b" * (3 * m + 1),), (_text(rng, 25, "aaaab"),),
                  (_text(rng, 200, "aaaaaaab"),)], [(_text(rng, 10, "aaab"),)])


_PAIRS = ("[]", "()", "{}", "<>")


def _nested(rng: np.random.Generator, depth: int, pair: str, max_count: int) -> str:
    parts = []
    for _ in range(_int(rng, 1, 3)):
        if depth > 0 and _int(rng, 0, 1):
            parts.append(f"{_int(rng, 1, max_count)}{pair[0]}{_nested(rng, depth - 1, pair, max_count)}{pair[1]}")
        else:
            parts.append(_word(rng, 1, 3, "abcxy"))
    return "".join(parts)


def _rle_5(rng: np.random.Generator) -> FunctionSpec:
    pair = _pick(rng, _PAIRS)
    mode = _pick(rng, ("string", "length", *"abcxy"))
    name = _pick(rng, ("decode_nested", "expand_nested", "nested_repeat"))
    unit = {"string": "ch", "length": "1"}.get(mode, f"(1 if ch == {mode!r} else 0)")
    zero = "''" if mode == "string" else "0"
    source = f"""
def {name}(s):
    pos = 0

    def sequence():
        nonlocal pos
        total = {zero}
        while pos < len(s) and s[pos] != {pair[1]!r}:
            if s[pos].isdigit():
                start = pos
                while s[pos].isdigit():
                    pos += 1
                times = int(s[start:pos])
                pos += 1
                inner = sequence()
                pos += 1
                total += inner * times
            else:
                ch = s[pos]
                total += {unit}
                pos += 1
        return total

    return sequence()
"""
    example = f"2{pair[0]}a3{pair[0]}bc{pair[1]}{pair[1]}d"
    decoded = "abcbcbcabcbcbcd"
    what = {"string": "Return the decoded string", "length": "Return the length of the decoded string"}.get(
        mode, f"Return how many times '{mode}' occurs in the decoded string")
    big = mode != "string"
    inputs = [("",), ("abc",), (f"1{pair[0]}x{pair[1]}",), (example,),
              *[(_nested(rng, 3, pair, 4),) for _ in range(3)]]
    if big:  # decoding these for real would need gigabytes
        inputs += [(f"900{pair[0]}800{pair[0]}ax70{pair[0]}bc{pair[1]}{pair[1]}y{pair[1]}",),
                   (f"99999{pair[0]}99999{pair[0]}abcxy{pair[1]}{pair[1]}",)]
    return _spec(name, "s", f"s is written with lowercase letters and repeat groups: a number k followed by "
                 f"'{pair[0]}' ... '{pair[1]}' stands for k copies of what is between the brackets, which may hold "
                 f"letters and further groups. For example '{example}' decodes to '{decoded}'. s is always well "
                 f"formed. "
                 f"{what}.", source, (pair, mode), inputs, [(_nested(rng, 2, pair, 3),)],
                 "Repeat counts can be large (up to 99999, nested): do not build the decoded string." if big else "")


# ---- brackets -----------------------------------------------------------------------------------------------------

_BRACKET_POOL = "()[]{}<>*#+/"


def _bracket_pair(rng: np.random.Generator) -> tuple[str, str]:
    o, c = (str(x) for x in rng.choice(list(_BRACKET_POOL), size=2, replace=False))
    return o, c


def _bracket_text(rng: np.random.Generator, o: str, c: str, n: int, balanced: bool, noise: str = "ab1 ") -> str:
    out, depth = [], 0
    for roll, other in zip(rng.integers(0, 10, size=n).tolist(), rng.choice(list(noise), size=n).tolist()):
        if roll < 4:
            out.append(o)
            depth += 1
        elif roll < 8 and (depth > 0 or not balanced):
            out.append(c)
            depth -= 1
        else:
            out.append(other)
    if balanced:
        out += [c] * max(depth, 0)
    return "".join(out)


def _bracket_1(rng: np.random.Generator) -> FunctionSpec:
    o, c = _bracket_pair(rng)
    name = _pick(rng, ("is_balanced", "brackets_ok", "well_nested"))
    source = f"""
def {name}(s):
    depth = 0
    for ch in s:
        if ch == {o!r}:
            depth += 1
        elif ch == {c!r}:
            depth -= 1
            if depth < 0:
                return False
    return depth == 0
"""
    return _spec(name, "s", f"Treat '{o}' as an opening and '{c}' as a closing bracket; every other character is "
                 "ignored. Return True if the brackets are balanced (every closing one matches an earlier opening "
                 "one, and none stays open), else False.", source, (o, c),
                 [("",), ("abc",), (o + c,), (c + o,), (o + o + c,), (_bracket_text(rng, o, c, 20, True),),
                  (_bracket_text(rng, o, c, 20, False),), (_bracket_text(rng, o, c, 200, True),)],
                 [(_bracket_text(rng, o, c, 8, True),)])


def _bracket_2(rng: np.random.Generator) -> FunctionSpec:
    o, c = _bracket_pair(rng)
    name = _pick(rng, ("max_depth", "nesting_depth", "deepest"))
    source = f"""
def {name}(s):
    depth = best = 0
    for ch in s:
        if ch == {o!r}:
            depth += 1
            best = max(best, depth)
        elif ch == {c!r}:
            depth -= 1
            if depth < 0:
                return -1
    return best if depth == 0 else -1
"""
    return _spec(name, "s", f"Treat '{o}' as an opening and '{c}' as a closing bracket; every other character is "
                 "ignored. Return the deepest nesting of the brackets (0 when there are none), or -1 when they are "
                 "not balanced.", source, (o, c),
                 [("",), ("x",), (o + c,), (o + o + c + c + o + c,), (c + o,), (o * 3 + c * 2,),
                  (_bracket_text(rng, o, c, 30, True),), (_bracket_text(rng, o, c, 30, False),)],
                 [(_bracket_text(rng, o, c, 10, True),)])


def _bracket_3(rng: np.random.Generator) -> FunctionSpec:
    chars = [str(x) for x in rng.choice(list(_BRACKET_POOL), size=2 * _int(rng, 2, 3), replace=False)]
    pairs = tuple(chars[i] + chars[i + 1] for i in range(0, len(chars), 2))
    name = _pick(rng, ("is_nested_ok", "multi_balanced", "brackets_match"))
    closing = {p[1]: p[0] for p in pairs}
    source = f"""
def {name}(s):
    opening = {''.join(p[0] for p in pairs)!r}
    match = {closing!r}
    stack = []
    for ch in s:
        if ch in opening:
            stack.append(ch)
        elif ch in match:
            if not stack or stack.pop() != match[ch]:
                return False
    return not stack
"""
    listed = ", ".join(f"'{p[0]}' opening and '{p[1]}' closing" for p in pairs)

    def text(n: int, good: bool) -> str:
        out, stack = [], []
        for _ in range(n):
            roll = _int(rng, 0, 9)
            if roll < 4:
                p = _pick(rng, pairs)
                out.append(p[0])
                stack.append(p)
            elif roll < 8 and stack:
                out.append(stack.pop()[1])
            else:
                out.append(_pick(rng, "xy"))
        out += [p[1] for p in reversed(stack)]
        if not good and len(out) > 1:
            i = _int(rng, 0, len(out) - 1)
            out[i] = _pick(rng, "".join(pairs))
        return "".join(out)

    a, b = pairs[0], pairs[1]
    return _spec(name, "s", f"The bracket pairs are {listed}; every other character is ignored. Return True if s's "
                 "brackets are balanced and properly nested (each closing bracket closes the most recent open "
                 "bracket, which must be of its own pair; none stays open), else False.", source, (pairs,),
                 [("",), (a + b[0] + b[1] + a[1],), (a[0] + b[0] + a[1] + b[1],), (b[1],), (text(16, True),),
                  (text(16, False),), (text(100, True),)], [(text(8, True),)])


def _bracket_4(rng: np.random.Generator) -> FunctionSpec:
    o, c = _bracket_pair(rng)
    name = _pick(rng, ("insertions_needed", "fix_count", "min_additions"))
    source = f"""
def {name}(s):
    missing_open = depth = 0
    for ch in s:
        if ch == {o!r}:
            depth += 1
        elif ch == {c!r}:
            if depth:
                depth -= 1
            else:
                missing_open += 1
    return missing_open + depth
"""
    return _spec(name, "s", f"Treat '{o}' as an opening and '{c}' as a closing bracket; every other character is "
                 "ignored. Return the smallest number of brackets that must be inserted (anywhere) to make the "
                 "brackets balanced.", source, (o, c),
                 [("",), (o + c,), (c * 3,), (o * 2,), (c + o,), (_bracket_text(rng, o, c, 30, False),),
                  (_bracket_text(rng, o, c, 500, False),)], [(_bracket_text(rng, o, c, 8, False),)])


def _bracket_5(rng: np.random.Generator) -> FunctionSpec:
    o, c = _bracket_pair(rng)
    name = _pick(rng, ("longest_balanced", "best_balanced_span", "longest_valid"))
    source = f"""
def {name}(s):
    stack = [-1]
    best = 0
    for i, ch in enumerate(s):
        if ch == {o!r}:
            stack.append(i)
        else:
            stack.pop()
            if not stack:
                stack.append(i)
            else:
                best = max(best, i - stack[-1])
    return best
"""
    return _spec(name, "s", f"s holds only the characters '{o}' (opening) and '{c}' (closing). Return the length of "
                 "the longest contiguous part of s whose brackets are balanced (0 if there is none).", source, (o, c),
                 [("",), (o,), (o + c,), (c + o + c + o + c + c,), (o * 3 + c + o + c,),
                  (_bracket_text(rng, o, c, 40, False, o),), (_bracket_text(rng, o, c, 20000, False, c),)],
                 [(_bracket_text(rng, o, c, 8, False, c),)], _SPEED.format("up to 20000 characters", _PAIRS_SLOW))


# ---- intervals ----------------------------------------------------------------------------------------------------


def _intervals(rng: np.random.Generator, n: int, low: int, high: int, max_len: int, strict: bool = False
               ) -> list[list[int]]:
    out = []
    for _ in range(n):
        s = _int(rng, low, high)
        out.append([s, s + _int(rng, 1 if strict else 0, max_len)])
    return out


def _interval_1(rng: np.random.Generator) -> FunctionSpec:
    longer, length = bool(_int(rng, 0, 1)), _int(rng, 0, 20)
    op, word = (">=", "at least") if longer else ("<=", "at most")
    name = _pick(rng, ("count_long", "count_by_length", "length_filter"))
    return _spec(name, "intervals", f"intervals is a list of [start, end] pairs of integers with start <= end. Return "
                 f"how many have a length end - start of {word} {length}.",
                 f"def {name}(intervals):\n    return sum(1 for s, e in intervals if e - s {op} {length})\n",
                 (longer, length),
                 [([],), ([[0, length]],), ([[5, 5]],), ([[-3, length - 2], [0, length + 1]],),
                  (_intervals(rng, 10, -20, 20, 30),), (_intervals(rng, 60, -100, 100, 40),)],
                 [(_intervals(rng, 4, 0, 10, 25),)])


def _interval_2(rng: np.random.Generator) -> FunctionSpec:
    lo = _int(rng, 0, 10)
    hi = lo + _int(rng, 5, 20)
    name = _pick(rng, ("clip_intervals", "clamp_to_window", "window_cut"))
    source = f"""
def {name}(intervals):
    return [[max(s, {lo}), min(e, {hi})] for s, e in intervals if s <= {hi} and e >= {lo}]
"""
    return _spec(name, "intervals", f"intervals is a list of closed intervals [start, end] of integers (start <= end). "
                 f"Cut each one down to the window [{lo}, {hi}]: drop the intervals that share no point with the "
                 "window, and clip the others to it. Return the clipped intervals in their original order.", source,
                 (lo, hi),
                 [([],), ([[lo - 5, lo]],), ([[hi, hi + 3]],), ([[lo - 9, lo - 1], [hi + 1, hi + 4]],),
                  ([[lo - 100, hi + 100]],), (_intervals(rng, 12, lo - 15, hi + 5, 12),)],
                 [(_intervals(rng, 3, lo - 4, hi, 8),)])


def _interval_3(rng: np.random.Generator) -> FunctionSpec:
    gap = _int(rng, -1, 30)
    name = _pick(rng, ("merge_intervals", "merge_close", "join_ranges"))
    source = f"""
def {name}(intervals):
    merged = []
    for s, e in sorted(intervals):
        if merged and s - merged[-1][1] <= {gap}:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged
"""
    rule = {-1: " (so intervals merge only when they overlap by at least one unit)",
            0: " (so touching intervals like [1, 3] and [3, 5] merge)"}.get(gap, "")
    return _spec(name, "intervals", f"intervals is a list of [start, end] pairs of integers (start <= end), in any "
                 f"order. Go through them sorted by start (then end), merging an interval into the last merged one "
                 f"whenever its start minus that one's end is at most {gap}{rule}; a merged interval ends at the "
                 "larger end. Return the merged intervals, sorted by start.", source, (gap,),
                 [([],), ([[4, 8]],), ([[1, 3], [3 + gap, 9]],), ([[1, 3], [4 + gap, 9]],), ([[0, 100], [5, 6]],),
                  (_intervals(rng, 8, 0, 60, 10),), (_intervals(rng, 40, -200, 200, 15),)],
                 [(_intervals(rng, 4, 0, 30, 6),)])


def _interval_4(rng: np.random.Generator) -> FunctionSpec:
    k, lo, width = _int(rng, 1, 6), _int(rng, 0, 4), _pick(rng, (50, 100))
    hi = lo + width
    name = _pick(rng, ("covered_length", "coverage", "overlap_length"))
    source = f"""
def {name}(intervals):
    events = []
    for s, e in intervals:
        s, e = max(s, {lo}), min(e, {hi})
        if s < e:
            events.append((s, 1))
            events.append((e, -1))
    events.sort()
    total = depth = 0
    previous = None
    for x, change in events:
        if previous is not None and depth >= {k}:
            total += x - previous
        depth += change
        previous = x
    return total
"""
    times = "at least one interval" if k == 1 else f"at least {k} of the intervals"
    return _spec(name, "intervals", f"intervals is a list of half-open intervals [start, end) of integers with start < "
                 f"end (an interval covers the points x with start <= x < end). Return the total length of the part "
                 f"of the window [{lo}, {hi}) that is covered by {times}.", source, (k, lo, width),
                 [([],), ([[lo, hi]] * k,), ([[lo - 10, lo]] * k,), ([[lo + 1, lo + 5], [lo + 3, lo + 9]] * k,),
                  (_intervals(rng, 3 * k, -20, hi + 10, 40, True),), (_intervals(rng, 40, -20, hi + 10, 30, True),)],
                 [(_intervals(rng, k + 2, lo, lo + 20, 10, True),)])


def _interval_5(rng: np.random.Generator) -> FunctionSpec:
    turnover, rooms = _int(rng, 0, 9), bool(_int(rng, 0, 1))
    name = _pick(rng, ("assign_rooms", "schedule_rooms", "room_plan"))
    source = f"""
def {name}(meetings):
    order = sorted(range(len(meetings)), key=lambda i: (meetings[i][0], i))
    free_at = []
    room_of = [0] * len(meetings)
    for i in order:
        start, end = meetings[i]
        for room, free in enumerate(free_at):
            if free <= start:
                break
        else:
            room = len(free_at)
            free_at.append(0)
        free_at[room] = end + {turnover}
        room_of[i] = room
    return {'len(free_at)' if rooms else 'room_of'}
"""
    what = ("Return the number of rooms used (0 for no meetings)." if rooms else
            "Return the list of room numbers, one per meeting in the input order.")
    clean = f"; after a meeting ends at time e the room needs cleaning and is free again at e + {turnover}" if (
        turnover) else "; a room is free again as soon as its meeting ends"
    return _spec(name, "meetings", f"meetings is a list of [start, end] pairs of integers (start < end). Go through "
                 f"the meetings by start time (equal starts in input order) and put each into the lowest-numbered room "
                 f"(rooms are numbered 0, 1, 2, ...) that is free at its start, opening a new room when none is"
                 f"{clean}. {what}", source, (turnover, rooms),
                 [([],), ([[0, 5]],), ([[0, 5], [5, 9]],), ([[0, 5], [5 + turnover, 9]],), ([[1, 4], [1, 4], [1, 4]],),
                  (_intervals(rng, 10, 0, 50, 15, True),), (_intervals(rng, 300, 0, 2000, 60, True),)],
                 [(_intervals(rng, 4, 0, 12, 5, True),)])


# ---- dynamic programming ------------------------------------------------------------------------------------------


def _steps(rng: np.random.Generator) -> tuple[int, ...]:
    while True:
        steps = tuple(s for s in range(1, 6) if _int(rng, 0, 1))
        if len(steps) >= 2:
            return steps


def _dp_1(rng: np.random.Generator) -> FunctionSpec:
    steps = _steps(rng)
    name = _pick(rng, ("count_climbs", "stair_ways", "ways_up"))
    source = f"""
def {name}(n):
    ways = [1] + [0] * n
    for i in range(1, n + 1):
        ways[i] = sum(ways[i - s] for s in {steps!r} if s <= i)
    return ways[n]
"""
    listed = ", ".join(map(str, steps[:-1])) + f" or {steps[-1]}"
    return _spec(name, "n", f"A staircase has n steps (0 <= n <= 40). Each move climbs {listed} steps. Return the "
                 "number of different sequences of moves that end exactly on the top step (1 for n = 0: the empty "
                 "sequence).",
                 source, (steps,), [(0,), (1,), (steps[0],), (7,), (_int(rng, 8, 20),), (40,)], [(_int(rng, 3, 6),)])


def _dp_2(rng: np.random.Generator) -> FunctionSpec:
    steps, mod = _steps(rng), _pick(rng, (1000, 10007, 65536, 1_000_000_007, 998_244_353))
    name = _pick(rng, ("count_climbs_mod", "stair_ways_mod", "ways_up_mod"))
    source = f"""
def {name}(n):
    ways = [1] + [0] * n
    for i in range(1, n + 1):
        ways[i] = sum(ways[i - s] for s in {steps!r} if s <= i) % {mod}
    return ways[n]
"""
    listed = ", ".join(map(str, steps[:-1])) + f" or {steps[-1]}"
    return _spec(name, "n", f"A staircase has n steps (0 <= n <= 20000). Each move climbs {listed} steps. Return the "
                 "number of different sequences of moves that end exactly on the top step (1 for n = 0), modulo "
                 f"{mod}.", source, (steps, mod),
                 [(0,), (1,), (steps[-1],), (30,), (_int(rng, 100, 1000),), (20000,)], [(_int(rng, 4, 8),)],
                 _SPEED.format("n up to 20000", "plain recursion will not do"))


def _coins(rng: np.random.Generator) -> tuple[int, ...]:
    return tuple(sorted(int(c) for c in rng.choice(np.arange(2, 31), size=_int(rng, 2, 4), replace=False)))


def _dp_3(rng: np.random.Generator) -> FunctionSpec:
    coins = _coins(rng)
    name = _pick(rng, ("fewest_coins", "min_coins", "coin_count"))
    source = f"""
def {name}(amount):
    best = [0] + [None] * amount
    for a in range(1, amount + 1):
        options = [best[a - c] for c in {coins!r} if c <= a and best[a - c] is not None]
        best[a] = min(options) + 1 if options else None
    return -1 if best[amount] is None else best[amount]
"""
    listed = ", ".join(map(str, coins))
    return _spec(name, "amount", f"Coins come in the values {listed} (as many of each as needed). Return the smallest "
                 "number of coins that add up to exactly amount (0 <= amount <= 2000), or -1 if no combination "
                 "does (0 for amount 0).", source, (coins,),
                 [(0,), (1,), (coins[0],), (coins[-1] + 1,), (sum(coins),), (_int(rng, 20, 200),), (2000,)],
                 [(_int(rng, 10, 60),)])


def _dp_4(rng: np.random.Generator) -> FunctionSpec:
    coins = (1, *_coins(rng)) if _int(rng, 0, 1) else _coins(rng)
    name = _pick(rng, ("count_change", "change_ways", "coin_combinations"))
    source = f"""
def {name}(amount):
    ways = [1] + [0] * amount
    for c in {coins!r}:
        for a in range(c, amount + 1):
            ways[a] = (ways[a] + ways[a - c]) % 1000000007
    return ways[amount]
"""
    listed = ", ".join(map(str, coins))
    return _spec(name, "amount", f"Coins come in the values {listed} (as many of each as needed). Return the number of "
                 "different ways to pay exactly amount (0 <= amount <= 10000), modulo 1000000007. The order of the "
                 "coins does not matter (2+3 and 3+2 are the same way); amount 0 has one way.", source, (coins,),
                 [(0,), (1,), (coins[0],), (sum(coins),), (_int(rng, 50, 500),), (10000,)], [(_int(rng, 8, 30),)],
                 _SPEED.format("amount up to 10000", "listing the ways one by one will not do"))


def _dp_5(rng: np.random.Generator) -> FunctionSpec:
    ins, dele, sub = _int(rng, 1, 5), _int(rng, 1, 5), _int(rng, 1, 5)
    name = _pick(rng, ("edit_cost", "weighted_distance", "transform_cost"))
    source = f"""
def {name}(a, b):
    previous = [j * {ins} for j in range(len(b) + 1)]
    for i in range(1, len(a) + 1):
        current = [i * {dele}] + [0] * len(b)
        for j in range(1, len(b) + 1):
            keep = previous[j - 1] if a[i - 1] == b[j - 1] else previous[j - 1] + {sub}
            current[j] = min(keep, previous[j] + {dele}, current[j - 1] + {ins})
        previous = current
    return previous[len(b)]
"""
    return _spec(name, "a, b", f"Turn string a into string b with single-character edits: inserting a character costs "
                 f"{ins}, deleting one costs {dele}, replacing one by another costs {sub}. Return the smallest total "
                 "cost.", source, (ins, dele, sub),
                 [("", ""), ("", "abc"), ("abc", ""), ("kitten", "sitting"), ("same", "same"),
                  (_text(rng, 12, "abc"), _text(rng, 10, "abc")), (_text(rng, 300, "acgt"), _text(rng, 280, "acgt"))],
                 [(_word(rng, 3, 5, "abcd"), _word(rng, 3, 5, "abcd"))])


# ---- grids and walks ----------------------------------------------------------------------------------------------

_SCHEMES = {"UDLR": "U up, D down, L left, R right", "NSEW": "N up, S down, W left, E right",
            "wsad": "w up, s down, a left, d right"}


def _grid_1(rng: np.random.Generator) -> FunctionSpec:
    scheme, k, y_down = _pick(rng, tuple(_SCHEMES)), _int(rng, 1, 5), bool(_int(rng, 0, 1))
    name = _pick(rng, ("final_position", "walk", "follow_moves"))
    up, down, left, right = scheme
    dy = -k if y_down else k
    source = f"""
def {name}(moves):
    x = y = 0
    for m in moves:
        if m == {up!r}:
            y += {dy}
        elif m == {down!r}:
            y -= {dy}
        elif m == {left!r}:
            x -= {k}
        elif m == {right!r}:
            x += {k}
    return [x, y]
"""
    axis = "y grows downwards (up means y - " if y_down else "y grows upwards (up means y + "
    letters = scheme + "x?"
    return _spec(name, "moves", f"A walker starts at [0, 0]. Each letter of moves is one move ({_SCHEMES[scheme]}) of "
                 f"{k} unit{'s' if k > 1 else ''}; x grows to the right and {axis}{k}). Other characters are ignored. "
                 "Return the final position as [x, y].", source, (scheme, k, y_down),
                 [("",), (up,), (left * 3,), (scheme * 4,), (_text(rng, 20, letters),), (_text(rng, 500, letters),)],
                 [(_text(rng, 6, scheme),)])


def _grid_2(rng: np.random.Generator) -> FunctionSpec:
    width, height = _int(rng, 3, 10), _int(rng, 3, 10)
    name = _pick(rng, ("walk_in_box", "bounded_walk", "fenced_walk"))
    source = f"""
def {name}(start, moves):
    x, y = start
    steps = {{'U': (0, 1), 'D': (0, -1), 'L': (-1, 0), 'R': (1, 0)}}
    for m in moves:
        if m in steps:
            nx, ny = x + steps[m][0], y + steps[m][1]
            if 0 <= nx < {width} and 0 <= ny < {height}:
                x, y = nx, ny
    return [x, y]
"""
    return _spec(name, "start, moves", f"A walker stands on a board of {width} columns (x = 0..{width - 1}) and "
                 f"{height} rows (y = 0..{height - 1}), at start = [x, y]. Each letter of moves is one step: "
                 "U (y + 1), D (y - 1), L (x - 1), R (x + 1); a step that would leave the board is skipped, other "
                 "characters are ignored. Return the final position as [x, y].", source, (width, height),
                 [([0, 0], ""), ([0, 0], "LD"), ([width - 1, height - 1], "RRUU"), ([1, 1], "R" * 20 + "U" * 20),
                  ([_int(rng, 0, width - 1), _int(rng, 0, height - 1)], _text(rng, 40, "UDLR")),
                  ([_int(rng, 0, width - 1), _int(rng, 0, height - 1)], _text(rng, 300, "UDLRUR"))],
                 [([_int(rng, 0, width - 1), _int(rng, 0, height - 1)], _text(rng, 5, "UDLR"))])


def _grid(rng: np.random.Generator, rows: int, cols: int, alphabet: str) -> list[str]:
    return ["".join(_pick(rng, alphabet) for _ in range(cols)) for _ in range(rows)]


def _grid_3(rng: np.random.Generator) -> FunctionSpec:
    c, diagonal = _pick(rng, "#@*%+xo=&$"), bool(_int(rng, 0, 1))
    name = _pick(rng, ("count_regions", "count_islands", "region_count"))
    neighbours = ("[(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)]" if diagonal else
                  "[(-1, 0), (1, 0), (0, -1), (0, 1)]")
    source = f"""
def {name}(grid):
    rows, cols = len(grid), len(grid[0]) if grid else 0
    seen = set()
    regions = 0
    for r in range(rows):
        for col in range(cols):
            if grid[r][col] != {c!r} or (r, col) in seen:
                continue
            regions += 1
            seen.add((r, col))
            stack = [(r, col)]
            while stack:
                y, x = stack.pop()
                for dy, dx in {neighbours}:
                    ny, nx = y + dy, x + dx
                    if 0 <= ny < rows and 0 <= nx < cols and grid[ny][nx] == {c!r} and (ny, nx) not in seen:
                        seen.add((ny, nx))
                        stack.append((ny, nx))
    return regions
"""
    touch = "also diagonally (8 neighbours)" if diagonal else "only up, down, left or right (not diagonally)"
    alphabet = c + "."
    return _spec(name, "grid", f"grid is a list of equal-length strings (rows). Cells holding '{c}' that touch {touch} "
                 f"belong to the same region. Return the number of regions of '{c}' cells (0 for an empty grid).",
                 source, (c, diagonal),
                 [([],), (["."],), ([c],), ([c + "." + c, "." + c + "."],), (_grid(rng, 5, 6, alphabet),),
                  (_grid(rng, 40, 50, alphabet + "."),)], [(_grid(rng, 3, 4, alphabet),)])


def _grid_4(rng: np.random.Generator) -> FunctionSpec:
    start, end = _pick(rng, ("SE", "AB", "st", "@$", "*o"))
    wall, diagonal = _pick(rng, "#X%"), bool(_int(rng, 0, 1))
    name = _pick(rng, ("shortest_path", "fewest_steps", "maze_distance"))
    neighbours = ("[(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)]" if diagonal else
                  "[(-1, 0), (1, 0), (0, -1), (0, 1)]")
    source = f"""
from collections import deque


def {name}(grid):
    rows, cols = len(grid), len(grid[0])
    for r in range(rows):
        for c in range(cols):
            if grid[r][c] == {start!r}:
                begin = (r, c)
    distance = {{begin: 0}}
    queue = deque([begin])
    while queue:
        r, c = queue.popleft()
        if grid[r][c] == {end!r}:
            return distance[(r, c)]
        for dr, dc in {neighbours}:
            nr, nc = r + dr, c + dc
            if 0 <= nr < rows and 0 <= nc < cols and grid[nr][nc] != {wall!r} and (nr, nc) not in distance:
                distance[(nr, nc)] = distance[(r, c)] + 1
                queue.append((nr, nc))
    return -1
"""
    moves = "to any of the 8 neighbouring cells (diagonals too)" if diagonal else "up, down, left or right"

    def maze(rows: int, cols: int, density: int) -> list[str]:
        cells = [[wall if _int(rng, 0, 9) < density else "." for _ in range(cols)] for _ in range(rows)]
        cells[_int(rng, 0, rows - 1)][_int(rng, 0, cols - 1)] = start
        while True:
            r, c = _int(rng, 0, rows - 1), _int(rng, 0, cols - 1)
            if cells[r][c] != start:
                cells[r][c] = end
                return ["".join(row) for row in cells]

    return _spec(name, "grid", f"grid is a list of equal-length strings: '.' is open floor, '{wall}' a wall, and there "
                 f"is exactly one '{start}' (start) and one '{end}' (goal). Each step moves {moves}, never onto a wall "
                 "or off the grid. Return the fewest steps from start to goal, or -1 if the goal cannot be reached.",
                 source, (start, end, wall, diagonal),
                 [([start + end],), ([start + wall + end],), ([start + "..", wall * 2 + ".", end + ".."],),
                  (maze(5, 5, 3),), (maze(8, 12, 3),), (maze(30, 40, 3),), (maze(30, 40, 5),)],
                 [(maze(3, 4, 2),)])


def _grid_5(rng: np.random.Generator) -> FunctionSpec:
    diagonal, block = bool(_int(rng, 0, 1)), _int(rng, 5, 14)
    name = _pick(rng, ("cheapest_path", "min_path_sum", "path_cost"))
    moves = "[(0, 1), (1, 0), (1, 1)]" if diagonal else "[(0, 1), (1, 0)]"
    source = f"""
def {name}(grid):
    rows, cols = len(grid), len(grid[0])
    best = [[None] * cols for _ in range(rows)]
    for r in range(rows):
        for c in range(cols):
            if grid[r][c] >= {block}:
                continue
            if r == 0 and c == 0:
                best[r][c] = grid[r][c]
                continue
            options = [best[r - dr][c - dc] for dr, dc in {moves}
                       if r - dr >= 0 and c - dc >= 0 and best[r - dr][c - dc] is not None]
            if options:
                best[r][c] = min(options) + grid[r][c]
    return -1 if best[-1][-1] is None else best[-1][-1]
"""
    moves_text = "right, down, or diagonally down-right" if diagonal else "right or down"

    def costs(rows: int, cols: int) -> list[list[int]]:
        return [[_int(rng, 0, block + 2) for _ in range(cols)] for _ in range(rows)]

    return _spec(name, "grid", f"grid is a non-empty rectangular list of lists of non-negative integers (cell costs). "
                 f"A path starts at the top-left cell and moves {moves_text}, one cell at a time, to the bottom-right "
                 f"cell; cells with a cost of {block} or more are blocked (the path may not enter them, start and end "
                 "included). Return the smallest sum of the costs of the cells on a path (both ends counted), or -1 "
                 "if no path exists.", source, (diagonal, block),
                 [([[3]],), ([[block]],), ([[1, block], [block, 1]],), ([[0, 1, 2], [3, 4, 5]],), (costs(4, 5),),
                  (costs(30, 40),)], [(costs(3, 3),)])


# ---- parsing ------------------------------------------------------------------------------------------------------


def _parse_1(rng: np.random.Generator) -> FunctionSpec:
    sep, kv, lower = _pick(rng, (",", ";", "&", " ", "|")), _pick(rng, ("=", ":")), bool(_int(rng, 0, 1))
    name = _pick(rng, ("parse_pairs", "read_settings", "parse_options"))
    key = "key.lower()" if lower else "key"
    source = f"""
def {name}(s):
    result = {{}}
    for part in s.split({sep!r}):
        if part:
            key, value = part.split({kv!r}, 1)
            result[{key}] = value
    return result
"""

    def pairs(n: int) -> str:
        return sep.join(f"{_word(rng, 1, 4, 'abcdAB')}{kv}{_word(rng, 0, 5, 'xyz0129')}" for _ in range(n))

    case = " Keys are lower-cased." if lower else " Keys keep their case."
    return _spec(name, "s", f"s holds key{kv}value pairs separated by '{sep}' (keys and values contain neither "
                 f"'{sep}' nor '{kv}'; a value may be empty; s may be empty). Return a dict from key to value; when a "
                 f"key comes again, the later value wins.{case}", source, (sep, kv, lower),
                 [("",), (f"a{kv}",), (f"a{kv}1{sep}A{kv}2{sep}a{kv}3",), (pairs(5),), (pairs(20),)], [(pairs(3),)])


def _parse_2(rng: np.random.Generator) -> FunctionSpec:
    sep, column = _pick(rng, (",", ";", "|", "\t", " ")), _int(rng, 0, 5)
    name = _pick(rng, ("column_total", "sum_column", "field_sum"))
    source = f"""
def {name}(lines):
    total = 0
    for line in lines:
        fields = line.split({sep!r})
        if len(fields) > {column}:
            total += int(fields[{column}])
    return total
"""

    def rows(n: int) -> list[str]:
        return [sep.join(str(_int(rng, -99, 999)) for _ in range(_int(rng, 1, 8))) for _ in range(n)]

    shown = {"\t": "a tab", " ": "a single space"}.get(sep, f"'{sep}'")
    return _spec(name, "lines", f"Each string in lines is a row of integers separated by {shown}. Return the sum of "
                 f"the values in column {column} (counting from 0), skipping rows that have no such column (0 if no "
                 "row has it).", source, (sep, column),
                 [([],), ([sep.join(["1"] * column)] if column else ["7"],), ([sep.join(["-5"] * (column + 1))] * 3,),
                  (rows(4),), (rows(30),), (rows(200),)], [(rows(3),)])


def _parse_3(rng: np.random.Generator) -> FunctionSpec:
    comment, first_wins, fold = _pick(rng, "#;!%"), bool(_int(rng, 0, 1)), bool(_int(rng, 0, 1))
    name = _pick(rng, ("parse_ini", "read_config", "config_values"))
    store = ("if name not in result:\n                result[name] = value.strip()" if first_wins else
             "result[name] = value.strip()")
    source = f"""
def {name}(text):
    result = {{}}
    section = ''
    for raw in text.split('\\n'):
        line = raw.strip()
        if not line or line.startswith({comment!r}):
            continue
        if line.startswith('[') and line.endswith(']'):
            section = line[1:-1].strip()
            continue
        if '=' in line:
            key, value = line.split('=', 1)
            key = key.strip(){'.lower()' if fold else ''}
            name = section + '.' + key if section else key
            {store}
    return result
"""

    def config() -> str:
        lines = []
        for _ in range(_int(rng, 3, 9)):
            roll = _int(rng, 0, 9)
            if roll < 2:
                lines.append(f"[{_word(rng, 2, 5)}]")
            elif roll < 3:
                lines.append(f"{comment} {_sentence(rng, 2)} = no")
            elif roll < 4:
                lines.append("   ")
            else:
                equals = "=" if _int(rng, 0, 1) else " = "
                lines.append(f"{_word(rng, 1, 3, 'abAB')} {equals} {_word(rng, 0, 4, 'xy9')}")
        return "\n".join(lines)

    dup = "the first value wins" if first_wins else "the last value wins"
    case = " Keys are lower-cased (section names are not)." if fold else " Keys keep their case."
    return _spec(name, "text", f"text is a small INI-style configuration, one entry per line. Ignore blank lines and "
                 f"lines whose first non-space character is '{comment}'. A line '[name]' starts section 'name'. A line "
                 "'key = value' (spaces around '=' optional; the value is everything after the first '=') sets "
                 "'section.key' to the value with surrounding spaces removed, or plain 'key' before any section. "
                 f"When a name comes again, {dup}.{case} Return the dict of names to values.", source,
                 (comment, first_wins, fold),
                 [("",), ("a=1\na = 2",), ("[s]\nK = v = w\nk=x",), (f"{comment} x=1\n[t]\n\n y =  z ",), (config(),),
                  (config() + "\n" + config(),)], [(config(),)])


def _parse_4(rng: np.random.Generator) -> FunctionSpec:
    sep, floor = _pick(rng, (" ", ",", ";", "|")), bool(_int(rng, 0, 1))
    power, modulo = bool(_int(rng, 0, 1)), bool(_int(rng, 0, 1))
    name = _pick(rng, ("eval_rpn", "postfix_value", "stack_calc"))
    quotient = "a // b" if floor else "abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)"
    operators = "+-*/" + ("^" if power else "") + ("%" if modulo else "")
    extra = ""
    if power:
        extra += """
            elif token == '^':
                if b < 0 or b > 64:
                    return None
                stack.append(a ** b)"""
    if modulo:
        extra += f"""
            elif token == '%':
                if b == 0:
                    return None
                stack.append(a - b * ({quotient}))"""
    source = f"""
import re


def {name}(expression):
    stack = []
    for token in expression.split({sep!r}):
        if re.fullmatch(r'-?[0-9]+', token):
            stack.append(int(token))
        elif token in {tuple(operators)!r}:
            if len(stack) < 2:
                return None
            b, a = stack.pop(), stack.pop()
            if token == '+':
                stack.append(a + b)
            elif token == '-':
                stack.append(a - b)
            elif token == '*':
                stack.append(a * b){extra}
            else:
                if b == 0:
                    return None
                stack.append({quotient})
        else:
            return None
    return stack[0] if len(stack) == 1 else None
"""
    ops = ["+", "-", "*", "/"] + (["^ (power; an exponent below 0 or above 64 is an error)"] if power else []) + (
        ["% (the remainder a - b * (a / b), with / the integer division here)"] if modulo else [])
    division = "down (like Python's //)" if floor else "toward zero (so -7 / 2 is -3)"

    def rpn(depth: int) -> list[str]:
        if depth == 0 or _int(rng, 0, 3) == 0:
            return [str(_int(rng, -9, 20))]
        op = _pick(rng, operators)
        right = rpn(depth - 1) if op != "^" else [str(_int(rng, 0, 3))]
        return rpn(depth - 1) + right + [op]

    joined = lambda tokens: sep.join(tokens)  # noqa: E731
    shown = "a single space" if sep == " " else f"'{sep}'"
    mod_case = [(joined(["-7", "3", "%"]),)] if modulo else [(joined(["7", "-2", "/"]),)]
    return _spec(name, "expression", f"expression is in reverse Polish notation: tokens separated by {shown}, each "
                 f"an integer (maybe negative, like -3) or an operator: {', '.join(ops)}. An operator takes the two "
                 f"values before it (a, then b) and computes a op b. Integer division rounds {division}. Return the "
                 "value, or None when the expression is malformed (an operator without two values, values left "
                 "over, an unknown or empty token, a division by zero).", source, (sep, floor, power, modulo),
                 [(joined(["3", "4", "+"]),), (joined(["-7", "2", "/"]),), (joined(["1", "+"]),), (joined(["1", "2"]),),
                  (joined(["5", "0", "/"]),), ("",), *mod_case, (joined(rpn(5)),), (joined(rpn(8)),)],
                 [(joined(rpn(2)),)])


def _parse_5(rng: np.random.Generator) -> FunctionSpec:
    pair = _pick(rng, _PAIRS)
    mode = _pick(rng, ("depth", "inverse", 1, 2, 3, 4, 5, 6))
    name = _pick(rng, ("weighted_sum", "nested_total", "depth_sum"))
    o, c = pair
    weight = {"depth": "depth", "inverse": "deepest - depth + 1"}.get(mode, f"(1 if depth == {mode} else 0)")
    source = f"""
def _parse(s):
    tokens = s.replace({o!r}, ' {o} ').replace({c!r}, ' {c} ').split()
    stack = [[]]
    for token in tokens:
        if token == {o!r}:
            stack.append([])
        elif token == {c!r}:
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append(int(token))
    return stack[0][0]


def _items(node, depth, out):
    for item in node:
        if isinstance(item, list):
            _items(item, depth + 1, out)
        else:
            out.append((item, depth))


def {name}(s):
    found = []
    _items(_parse(s), 1, found)
    deepest = max((depth for _, depth in found), default=0)
    return sum(value * ({weight}) for value, depth in found)
"""
    what = {"depth": "each integer times its depth",
            "inverse": "each integer times (D - depth + 1), where D is the largest depth of any integer"}.get(
        mode, f"the integers at depth exactly {mode}")

    def nested(depth: int) -> str:
        items = []
        for _ in range(_int(rng, 0, 4)):
            items.append(nested(depth - 1) if depth > 0 and _int(rng, 0, 2) == 0 else str(_int(rng, -20, 20)))
        return o + " ".join(items) + c

    return _spec(name, "s", f"s writes a nested list of integers with '{o}' and '{c}', items separated by spaces, "
                 f"like '{o}1 {o}2 -3{c} {o}{c}{c}'. The integers directly in the outer list are at depth 1, those one "
                 f"level further in at depth 2, and so on. Return the sum of {what} (0 when there are no integers). "
                 "s is always well formed.", source, (pair, mode),
                 [(f"{o}{c}",), (f"{o}5{c}",), (f"{o}1 {o}2 -3{c} {o}{c}{c}",), (f"{o}{o}{o}{o}7{c}{c}{c} 1{c}",),
                  (nested(3),), (nested(5),)], [(nested(2),)])


# ---- frequencies --------------------------------------------------------------------------------------------------


def _freq_1(rng: np.random.Generator) -> FunctionSpec:
    most, alphabetical, fold = bool(_int(rng, 0, 1)), bool(_int(rng, 0, 1)), bool(_int(rng, 0, 1))
    skip_digits = bool(_int(rng, 0, 1))
    name = _pick(rng, ("pick_char", "extreme_char", "char_by_count"))
    keep = "ch != ' '" + (" and not ch.isdigit()" if skip_digits else "")
    source = f"""
def {name}(s):
    counts = {{}}
    for ch in s:
        if {keep}:
            ch = ch{'.lower()' if fold else ''}
            counts[ch] = counts.get(ch, 0) + 1
    if not counts:
        return ''
    target = {'max' if most else 'min'}(counts.values())
    candidates = [ch for ch in counts if counts[ch] == target]
    return {'min(candidates)' if alphabetical else 'candidates[0]'}
"""
    ignored = "spaces and digits" if skip_digits else "spaces"
    case = (" Letters count ignoring case, and the answer is given in lowercase." if fold else
            " 'a' and 'A' are different characters.")
    tie = ("the smallest of them in alphabetical (code point) order" if alphabetical else
           "the one that appears first in s")
    alphabet = "aabbcAB12 "
    return _spec(name, "s", f"Count the characters of s, ignoring {ignored}.{case} Return the "
                 f"{'most' if most else 'least'} frequent character; when several tie, {tie}. Return '' when nothing "
                 "is counted.", source, (most, alphabetical, fold, skip_digits),
                 [("",), ("   ",), ("ba",), ("Aab1",), (_text(rng, 15, alphabet),), (_text(rng, 300, alphabet),)],
                 [(_text(rng, 9, alphabet),)])


def _freq_2(rng: np.random.Generator) -> FunctionSpec:
    m, fold, least = _int(rng, 1, 5), bool(_int(rng, 0, 1)), _int(rng, 1, 3)
    name = _pick(rng, ("word_counts", "frequent_words", "count_words"))
    source = f"""
def {name}(text):
    counts = {{}}
    for word in text.split():
        word = word{'.lower()' if fold else ''}
        if len(word) >= {m}:
            counts[word] = counts.get(word, 0) + 1
    return {{w: n for w, n in counts.items() if n >= {least}}}
"""
    case = " Words are lower-cased first." if fold else " Case matters ('Ab' and 'ab' are different words)."
    letters = "abcAB"
    return _spec(name, "text", f"Split text into words at whitespace.{case} Return a dict from each word with at least "
                 f"{m} letters that occurs at least {least} time{'s' if least > 1 else ''} to its number of "
                 "occurrences.", source, (m, fold, least),
                 [("",), ("ab AB ab",), ("  \n\t ",), ("x " * 4 + "xy\txy\nXY",), (_sentence(rng, 12, 1, 6, letters),),
                  (_sentence(rng, 200, 1, 5, letters),)],
                 [(_sentence(rng, 6, 1, 5, "ab"),)])


def _freq_3(rng: np.random.Generator) -> FunctionSpec:
    k, m = _int(rng, 1, 5), _int(rng, 1, 4)
    name = _pick(rng, ("top_words", "most_common_words", "leading_words"))
    source = f"""
def {name}(text):
    counts = {{}}
    for word in text.split():
        if len(word) >= {m}:
            counts[word] = counts.get(word, 0) + 1
    ranked = sorted(counts, key=lambda w: (-counts[w], w))
    return ranked[:{k}]
"""
    return _spec(name, "text", f"text is lowercase words separated by whitespace. Among the words with at least {m} "
                 f"letters, return the {k} most frequent as a list, most frequent first, ties in alphabetical order "
                 "(fewer if there are fewer different words).", source, (k, m),
                 [("",), ("b a b a c",), ("dddd cc bb aa " * 2,), ("x\ty\nxx  yy",), (_sentence(rng, 15, 1, 5, "abc"),),
                  (_sentence(rng, 300, 1, 6, "abcd"),)],
                 [(_sentence(rng, 8, 1, 4, "ab"),)])


def _freq_4(rng: np.random.Generator) -> FunctionSpec:
    k, fold = _int(rng, 0, 9), bool(_int(rng, 0, 1))
    name = _pick(rng, ("nearly_anagrams", "close_letters", "similar_counts"))
    source = f"""
def {name}(a, b):
    counts = {{}}
    for ch in a{'.lower()' if fold else ''}:
        counts[ch] = counts.get(ch, 0) + 1
    for ch in b{'.lower()' if fold else ''}:
        counts[ch] = counts.get(ch, 0) - 1
    return sum(abs(n) for n in counts.values()) <= {k}
"""
    case = " Letters are compared ignoring case." if fold else " Case matters ('a' and 'A' are different)."
    alphabet = "abcdAB"
    return _spec(name, "a, b", f"For every character, take the difference between how often it occurs in a and in b. "
                 f"Return True if these differences, taken as absolute values, add up to at most {k}, else False."
                 f"{case}", source, (k, fold),
                 [("", ""), ("abc", "cab"), ("aA", "AA"), ("a" * k, ""), ("a" * (k + 1), ""),
                  (_text(rng, 10, alphabet), _text(rng, 10, alphabet)),
                  (_text(rng, 30, alphabet), _text(rng, 28, alphabet))],
                 [(_word(rng, 3, 6, "abc"), _word(rng, 3, 6, "abc"))])


def _freq_5(rng: np.random.Generator) -> FunctionSpec:
    w, distinct = _int(rng, 3, 16), bool(_int(rng, 0, 1))
    name = _pick(rng, ("window_stats", "window_counts", "sliding_frequency"))
    pick = "len(counts)" if distinct else "min(v for v in counts if counts[v] == max(counts.values()))"
    source = f"""
def {name}(nums):
    out = []
    for i in range(len(nums) - {w} + 1):
        counts = {{}}
        for v in nums[i:i + {w}]:
            counts[v] = counts.get(v, 0) + 1
        out.append({pick})
    return out
"""
    what = ("the number of distinct values in it" if distinct else
            "its most frequent value (the smallest of them on a tie)")
    return _spec(name, "nums", f"For every window of {w} consecutive elements of the integer list nums, from left to "
                 f"right, give {what}. Return the list ([] when nums has fewer than {w} elements).", source,
                 (w, distinct),
                 [([],), ([1] * (w - 1),), ([4] * w,), (list(range(w + 2)),), (_ints(rng, 30, 0, 4),),
                  (_ints(rng, 2000, -3, 3),)], [(_ints(rng, w + 2, 0, 3),)])


FAMILY_SPECS: dict[str, Family] = {
    "arithmetic": _levels(_arith_1, _arith_2, _arith_3, _arith_4, _arith_5),
    "strings": _levels(_str_1, _str_2, _str_3, _str_4, _str_5),
    "lists": _levels(_list_1, _list_2, _list_3, _list_4, _list_5),
    "counting": _levels(_count_1, _count_2, _count_3, _count_4, _count_5),
    "digits": _levels(_digits_1, _digits_2, _digits_3, _digits_4, _digits_5),
    "sorting": _levels(_sort_1, _sort_2, _sort_3, _sort_4, _sort_5),
    "run_length": _levels(_rle_1, _rle_2, _rle_3, _rle_4, _rle_5),
    "brackets": _levels(_bracket_1, _bracket_2, _bracket_3, _bracket_4, _bracket_5),
    "intervals": _levels(_interval_1, _interval_2, _interval_3, _interval_4, _interval_5),
    "dynamic_programming": _levels(_dp_1, _dp_2, _dp_3, _dp_4, _dp_5),
    "grids": _levels(_grid_1, _grid_2, _grid_3, _grid_4, _grid_5),
    "parsing": _levels(_parse_1, _parse_2, _parse_3, _parse_4, _parse_5),
    "frequencies": _levels(_freq_1, _freq_2, _freq_3, _freq_4, _freq_5),
}
"""Family name -> ``(rng, level) -> FunctionSpec``, in a fixed order (the generator draws a family by index)."""
