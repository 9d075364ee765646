"""Seeded procedural math problems in five difficulty levels: `generate_problem(level, rng, split)`.

Levels (every answer is a whole number, so answers are unambiguous and cheap to check):

1. One-step addition or subtraction of small numbers: "What is 7 + 5?" (operands 1..20 and 1..10).
2. Two-digit addition and subtraction, and the times tables up to 12.
3. Two operations with precedence and exact division ("What is 4 × 6 + 9?"), and one-step word problems.
4. Two-step word problems (change from a purchase, wages, packs bought and given away, legs on a farm, ...).
5. Three- and four-step word problems with percentages, fractions and rates.

Train / test split: a problem belongs to the test split when the SHA-256 of its question text falls in a fixed
tenth of the hash range, and to train otherwise. The generator redraws until it hits the requested split, so the
two splits never share a question, whichever seeds are used. Levels 1 and 2 have only a few hundred to a few
thousand distinct questions, so a long run repeats them; that is intended (a tiny model can learn them on CPU).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .problems import Problem

__all__ = ["LEVELS", "SPLITS", "generate_problem", "split_of"]

LEVELS = (1, 2, 3, 4, 5)
SPLITS = ("train", "test")
_TEST_BUCKETS = 1  # out of 10: the test split is a tenth of the question space
_MAX_REDRAWS = 10_000

_NAMES = ("Ava", "Ben", "Chloe", "Diego", "Emma", "Farah", "Gus", "Hana", "Ivan", "Jade", "Kofi", "Lena", "Mia", "Noah")
_ITEMS = ("apples", "marbles", "stickers", "pencils", "cookies", "stamps", "shells", "cards", "books", "balloons")
_FOODS = ("muffins", "loaves of bread", "cupcakes", "pies", "bagels")
_GIFTS = ("bike", "game", "jacket", "watch", "guitar")


class _Draft(NamedTuple):
    question: str
    steps: tuple[str, ...]
    answer: int
    kind: str


def generate_problem(level: int, rng: np.random.Generator | int, split: str = "train") -> Problem:
    """Draw one problem of difficulty `level` from `rng`, belonging to `split`.

    Args:
        level: 1 (easiest) to 5.
        rng: a NumPy generator (all randomness is drawn from it) or an integer seed.
        split: ``"train"`` or ``"test"`` (disjoint question sets, see the module docstring).

    Returns:
        A `Problem` whose id is ``level<n>-<hash of the question>``, so equal questions share an id.

    Examples:
        >>> generate_problem(1, 0).question
        'What is 13 - 6?'
    """
    if level not in LEVELS:
        raise ValueError(f"math level must be one of {LEVELS}, got {level!r}")
    if split not in SPLITS:
        raise ValueError(f"math split must be one of {SPLITS}, got {split!r}")
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(rng)
    templates = _TEMPLATES[level]
    for _ in range(_MAX_REDRAWS):
        draft = templates[int(rng.integers(len(templates)))](rng)
        if split_of(draft.question) == split:
            break
    else:  # unreachable in practice: a tenth of each level's questions is test, the rest train
        raise RuntimeError(f"no level-{level} {split} problem found in {_MAX_REDRAWS} draws")
    digest = hashlib.sha256(draft.question.encode()).hexdigest()[:12]
    return Problem(
        id=f"level{level}-{digest}",
        question=draft.question,
        answer=str(draft.answer),
        solution="\n".join(draft.steps),
        source="procedural",
        level=str(level),
        type=draft.kind,
    )


def split_of(question: str) -> str:
    """The split (``"train"`` or ``"test"``) a question belongs to, from a hash of its text."""
    bucket = hashlib.sha256(question.encode()).digest()[0] % 10
    return "test" if bucket < _TEST_BUCKETS else "train"


def _int(rng: np.random.Generator, low: int, high: int) -> int:
    """A uniform integer in [low, high], both ends included."""
    return int(rng.integers(low, high + 1))


def _pick(rng: np.random.Generator, options: tuple[str, ...]) -> str:
    return options[int(rng.integers(len(options)))]


# ---- level 1 ----------------------------------------------------------------------------------------------------


def _add_small(rng: np.random.Generator) -> _Draft:
    a, b = _int(rng, 1, 20), _int(rng, 1, 10)
    return _Draft(f"What is {a} + {b}?", (f"{a} + {b} = {a + b}.",), a + b, "arithmetic/add")


def _subtract_small(rng: np.random.Generator) -> _Draft:
    a, b = _int(rng, 1, 20), _int(rng, 1, 10)
    a, b = max(a, b), min(a, b)
    return _Draft(f"What is {a} - {b}?", (f"{a} - {b} = {a - b}.",), a - b, "arithmetic/subtract")


# ---- level 2 ----------------------------------------------------------------------------------------------------


def _add_two_digit(rng: np.random.Generator) -> _Draft:
    a, b = _int(rng, 10, 99), _int(rng, 10, 99)
    return _Draft(f"What is {a} + {b}?", (f"{a} + {b} = {a + b}.",), a + b, "arithmetic/add")


def _subtract_two_digit(rng: np.random.Generator) -> _Draft:
    a, b = sorted((_int(rng, 10, 99), _int(rng, 10, 99)), reverse=True)
    return _Draft(f"What is {a} - {b}?", (f"{a} - {b} = {a - b}.",), a - b, "arithmetic/subtract")


def _times_table(rng: np.random.Generator) -> _Draft:
    a, b = _int(rng, 2, 12), _int(rng, 2, 12)
    return _Draft(f"What is {a} × {b}?", (f"{a} × {b} = {a * b}.",), a * b, "arithmetic/multiply")


# ---- level 3 ----------------------------------------------------------------------------------------------------


def _two_operations(rng: np.random.Generator) -> _Draft:
    a, b, c = _int(rng, 2, 12), _int(rng, 2, 12), _int(rng, 1, 30)
    form = _int(rng, 0, 3)
    if form == 0:
        return _Draft(
            f"What is {a} × {b} + {c}?",
            (f"{a} × {b} = {a * b}.", f"{a * b} + {c} = {a * b + c}."),
            a * b + c,
            "arithmetic/two-step",
        )
    if form == 1:
        return _Draft(
            f"What is {c} + {a} × {b}?",
            (f"{a} × {b} = {a * b}.", f"{c} + {a * b} = {a * b + c}."),
            a * b + c,
            "arithmetic/two-step",
        )
    if form == 2:
        return _Draft(
            f"What is ({a} + {c}) × {b}?",
            (f"{a} + {c} = {a + c}.", f"{a + c} × {b} = {(a + c) * b}."),
            (a + c) * b,
            "arithmetic/two-step",
        )
    return _Draft(
        f"What is {a * b} ÷ {b} + {c}?",
        (f"{a * b} ÷ {b} = {a}.", f"{a} + {c} = {a + c}."),
        a + c,
        "arithmetic/two-step",
    )


def _word_more(rng: np.random.Generator) -> _Draft:
    name, item = _pick(rng, _NAMES), _pick(rng, _ITEMS)
    a, b = _int(rng, 5, 60), _int(rng, 2, 40)
    question = f"{name} has {a} {item}. {name} buys {b} more {item}. How many {item} does {name} have now?"
    return _Draft(question, (f"{a} + {b} = {a + b}.",), a + b, "word/more")


def _word_fewer(rng: np.random.Generator) -> _Draft:
    name, item = _pick(rng, _NAMES), _pick(rng, _ITEMS)
    a = _int(rng, 20, 90)
    b = _int(rng, 2, a - 5)
    question = f"{name} has {a} {item} and gives {b} of them to a friend. How many {item} does {name} have left?"
    return _Draft(question, (f"{a} - {b} = {a - b}.",), a - b, "word/fewer")


def _word_groups(rng: np.random.Generator) -> _Draft:
    name, item = _pick(rng, _NAMES), _pick(rng, _ITEMS)
    boxes, each = _int(rng, 2, 12), _int(rng, 2, 15)
    question = f"{name} has {boxes} boxes with {each} {item} in each box. How many {item} are there in all?"
    return _Draft(question, (f"{boxes} × {each} = {boxes * each}.",), boxes * each, "word/groups")


def _word_share(rng: np.random.Generator) -> _Draft:
    name, item = _pick(rng, _NAMES), _pick(rng, _ITEMS)
    friends, each = _int(rng, 2, 9), _int(rng, 2, 12)
    total = friends * each
    question = f"{name} shares {total} {item} equally among {friends} friends. How many {item} does each friend get?"
    return _Draft(question, (f"{total} ÷ {friends} = {each}.",), each, "word/share")


# ---- level 4 ----------------------------------------------------------------------------------------------------


def _word_change(rng: np.random.Generator) -> _Draft:
    name, item = _pick(rng, _NAMES), _pick(rng, _ITEMS)
    count, price = _int(rng, 2, 9), _int(rng, 2, 15)
    cost = count * price
    bill = next(b for b in (20, 50, 100, 200) if b > cost)
    question = (
        f"{name} buys {count} {item} that cost ${price} each and pays with a ${bill} bill. "
        f"How much change, in dollars, does {name} get back?"
    )
    steps = (f"The {item} cost {count} × {price} = {cost} dollars.", f"The change is {bill} - {cost} = {bill - cost}.")
    return _Draft(question, steps, bill - cost, "word/change")


def _word_wages(rng: np.random.Generator) -> _Draft:
    name = _pick(rng, _NAMES)
    wage, hours, days = _int(rng, 8, 25), _int(rng, 2, 8), _int(rng, 2, 6)
    question = (
        f"{name} earns ${wage} per hour and works {hours} hours a day for {days} days. "
        f"How many dollars does {name} earn in total?"
    )
    steps = (
        f"Each day {name} earns {wage} × {hours} = {wage * hours} dollars.",
        f"In {days} days that is {wage * hours} × {days} = {wage * hours * days} dollars.",
    )
    return _Draft(question, steps, wage * hours * days, "word/wages")


def _word_packs(rng: np.random.Generator) -> _Draft:
    name, item = _pick(rng, _NAMES), _pick(rng, _ITEMS)
    start, packs, per_pack = _int(rng, 3, 30), _int(rng, 2, 6), _int(rng, 4, 12)
    bought = packs * per_pack
    given = _int(rng, 1, start + bought - 1)
    question = (
        f"{name} has {start} {item}. {name} buys {packs} packs with {per_pack} {item} in each pack, "
        f"then gives {given} {item} away. How many {item} does {name} have now?"
    )
    steps = (
        f"{name} buys {packs} × {per_pack} = {bought} {item}.",
        f"{start} + {bought} = {start + bought}.",
        f"{start + bought} - {given} = {start + bought - given}.",
    )
    return _Draft(question, steps, start + bought - given, "word/packs")


def _word_legs(rng: np.random.Generator) -> _Draft:
    cows, chickens = _int(rng, 2, 30), _int(rng, 2, 40)
    question = (
        f"A farm has {cows} cows and {chickens} chickens. A cow has 4 legs and a chicken has 2 legs. "
        "How many legs are there on the farm in total?"
    )
    steps = (
        f"Cows: {cows} × 4 = {cows * 4} legs.",
        f"Chickens: {chickens} × 2 = {chickens * 2} legs.",
        f"Total: {cows * 4} + {chickens * 2} = {cows * 4 + chickens * 2}.",
    )
    return _Draft(question, steps, cows * 4 + chickens * 2, "word/legs")


def _word_bakery(rng: np.random.Generator) -> _Draft:
    food = _pick(rng, _FOODS)
    morning, afternoon = _int(rng, 10, 60), _int(rng, 10, 60)
    sold = _int(rng, 5, morning + afternoon - 1)
    question = (
        f"A baker makes {morning} {food} in the morning and {afternoon} {food} in the afternoon. "
        f"She sells {sold} of them. How many {food} are left?"
    )
    steps = (
        f"She makes {morning} + {afternoon} = {morning + afternoon} {food}.",
        f"{morning + afternoon} - {sold} = {morning + afternoon - sold}.",
    )
    return _Draft(question, steps, morning + afternoon - sold, "word/bakery")


# ---- level 5 ----------------------------------------------------------------------------------------------------


def _word_discount(rng: np.random.Generator) -> _Draft:
    name, gift = _pick(rng, _NAMES), _pick(rng, _GIFTS)
    price = 20 * _int(rng, 1, 15)
    percent = int(rng.choice((10, 20, 25, 50)))
    count = _int(rng, 2, 5)
    off = price * percent // 100  # exact: price is a multiple of 20
    question = (
        f"A {gift} costs ${price}. It is on sale for {percent}% off. {name} buys {count} of them. "
        f"How many dollars does {name} pay?"
    )
    steps = (
        f"The discount is {percent}% of {price} = {off} dollars.",
        f"Each costs {price} - {off} = {price - off}.",
        f"{count} × {price - off} = {count * (price - off)}.",
    )
    return _Draft(question, steps, count * (price - off), "word/discount")


def _word_class_fraction(rng: np.random.Generator) -> _Draft:
    numerator, denominator = ((1, 2), (1, 3), (2, 3), (1, 4), (3, 4), (2, 5))[_int(rng, 0, 5)]
    students = denominator * _int(rng, 4, 8)
    girls = students * numerator // denominator
    boys = students - girls
    pencils = _int(rng, 2, 6)
    question = (
        f"There are {students} students in a class. {numerator}/{denominator} of them are girls and the rest are "
        f"boys. Each boy brings {pencils} pencils. How many pencils do the boys bring in total?"
    )
    steps = (
        f"Girls: {students} × {numerator}/{denominator} = {girls}.",
        f"Boys: {students} - {girls} = {boys}.",
        f"Pencils: {boys} × {pencils} = {boys * pencils}.",
    )
    return _Draft(question, steps, boys * pencils, "word/fraction")


def _word_savings(rng: np.random.Generator) -> _Draft:
    name, gift = _pick(rng, _NAMES), _pick(rng, _GIFTS)
    weekly, weeks = _int(rng, 5, 30), 2 * _int(rng, 2, 8)
    saved = weekly * weeks
    lunch = _int(rng, 1, saved // 2 - 1)
    question = (
        f"{name} saves ${weekly} every week for {weeks} weeks, then spends half of the savings on a {gift} "
        f"and ${lunch} on lunch. How many dollars does {name} have left?"
    )
    steps = (
        f"Savings: {weekly} × {weeks} = {saved}.",
        f"After the {gift}: {saved} ÷ 2 = {saved // 2}.",
        f"After lunch: {saved // 2} - {lunch} = {saved // 2 - lunch}.",
    )
    return _Draft(question, steps, saved // 2 - lunch, "word/savings")


def _word_reading(rng: np.random.Generator) -> _Draft:
    name = _pick(rng, _NAMES)
    monday = _int(rng, 5, 40)
    fewer = _int(rng, 1, 2 * monday - 1)
    tuesday, wednesday = 2 * monday, 2 * monday - fewer
    question = (
        f"{name} reads {monday} pages on Monday, twice as many pages on Tuesday, and {fewer} fewer pages on "
        f"Wednesday than on Tuesday. How many pages does {name} read over the three days?"
    )
    steps = (
        f"Tuesday: 2 × {monday} = {tuesday}.",
        f"Wednesday: {tuesday} - {fewer} = {wednesday}.",
        f"Total: {monday} + {tuesday} + {wednesday} = {monday + tuesday + wednesday}.",
    )
    return _Draft(question, steps, monday + tuesday + wednesday, "word/reading")


def _word_tank(rng: np.random.Generator) -> _Draft:
    name = _pick(rng, _NAMES)
    numerator, denominator = ((1, 2), (1, 4), (3, 4), (1, 5), (2, 5))[_int(rng, 0, 4)]
    capacity = denominator * 10 * _int(rng, 2, 12)
    start = capacity * numerator // denominator
    added = _int(rng, 1, capacity - start)
    used = _int(rng, 1, start + added)
    question = (
        f"A water tank holds {capacity} liters and is {numerator}/{denominator} full. {name} adds {added} liters, "
        f"then uses {used} liters. How many liters are in the tank now?"
    )
    steps = (
        f"At first: {capacity} × {numerator}/{denominator} = {start} liters.",
        f"After adding: {start} + {added} = {start + added}.",
        f"After using: {start + added} - {used} = {start + added - used}.",
    )
    return _Draft(question, steps, start + added - used, "word/tank")


_TEMPLATES: dict[int, tuple[Callable[[np.random.Generator], _Draft], ...]] = {
    1: (_add_small, _subtract_small),
    2: (_add_two_digit, _subtract_two_digit, _times_table),
    3: (_two_operations, _two_operations, _word_more, _word_fewer, _word_groups, _word_share),
    4: (_word_change, _word_wages, _word_packs, _word_legs, _word_bakery),
    5: (_word_discount, _word_class_fraction, _word_savings, _word_reading, _word_tank),
}
