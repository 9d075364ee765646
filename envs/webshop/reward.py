"""WebShop's reward: `score(goal, product, options)`, a pure function on dicts in the original's loaded schema.

    R = r_type * (n_att + n_opt + [price <= price_upper]) / (len(goal.attributes) + len(goal.goal_options) + 1)

* `n_att`: a goal attribute counts when some product attribute has a fuzzy token-set ratio above 85, or else when it
  is a substring of the lowercased title, the joined bullet points or the description.
* `n_opt`: chosen option values and goal options both pass `normalize_color`; a goal option counts when some chosen
  value has a token-set ratio above 85.
* `r_type`: 1.0 by default; 0.5 when neither the query, the category path (two shared levels) nor the title nouns
  (score > 0.2) match; 0.1 when the title-noun score is below 0.1; 0.0 when it is zero.

Departures from the original (princeton-nlp/WebShop, ``engine/goal.py``):
    * Title nouns: the original tags the product names with spaCy's ``en_core_web_lg`` (NOUN / PROPN). spaCy models
      are not installable offline from PyPI, so `title_nouns` is a heuristic: lowercase alphabetic words of two or
      more letters that are not stopwords, colour words, common adjectives, or words with adjective / adverb
      suffixes. It agrees with spaCy on typical product names ("shampoo", "sofa", "headphones") but not always.
    * Fuzzy matching uses rapidfuzz with thefuzz's behaviour reproduced: strings are preprocessed with
      `rapidfuzz.utils.default_process` and the ratio is rounded to an integer before the ``> 85`` test.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rapidfuzz import fuzz
from rapidfuzz.utils import default_process

__all__ = ["COLOR_WORDS", "ScoreBreakdown", "normalize_color", "score", "score_breakdown", "title_nouns"]

FUZZY_THRESHOLD = 85

# Checked in this (alphabetical) order and the first hit wins, as in the original: "violet lavender" -> "lavender".
COLOR_WORDS: tuple[str, ...] = tuple(sorted({
    "almond", "amber", "apricot", "aqua", "army green", "ash", "azure", "beige", "berry", "black", "blonde", "blue",
    "blush", "bronze", "brown", "burgundy", "camel", "camo", "caramel", "champagne", "charcoal", "cherry",
    "chocolate", "clear", "coffee", "copper", "coral", "cream", "crimson", "cyan", "denim", "ebony", "emerald",
    "espresso", "fuchsia", "gold", "granite", "graphite", "gray", "green", "grey", "hazel", "honey", "indigo",
    "ivory", "jade", "khaki", "lavender", "lemon", "leopard", "lilac", "lime", "magenta", "mahogany", "maroon",
    "mauve", "merlot", "mint", "mocha", "multicolor", "mustard", "navy", "nude", "oak", "olive", "orange", "peach",
    "pearl", "pewter", "pink", "platinum", "plum", "purple", "rainbow", "red", "rose", "ruby", "rust", "sage",
    "sand", "sapphire", "scarlet", "silver", "slate", "smoke", "steel", "stone", "tan", "taupe", "teal",
    "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
}))
_COLOR_SET = frozenset(COLOR_WORDS)

_STOPWORDS = frozenset(
    "a an and are as at be by for from has have in is it its of on or that the this to with without your you "
    "our we us my me i he she they them his her their not no nor so than too very can will just all any both "
    "each few more most other some such only own same into over under up down out off again further then once "
    "per pc pcs pack set piece pieces count ct oz ounce ounces inch inches lb lbs ml mm cm ft kg g x".split()
)
# Adjectives that show up constantly in product names; spaCy tags them ADJ, so they are not type nouns.
_ADJECTIVES = frozenset(
    "new best great good high low large small big mini little long short light dark heavy soft hard natural "
    "organic premium classic modern vintage portable adjustable waterproof wireless compatible professional "
    "original fresh pure extra super ultra free non anti daily easy quick fast slim thin thick wide full double "
    "single multi deluxe luxury cute casual formal warm cool cold hot dry wet sweet strong gentle sensitive "
    "healthy clean smooth comfortable stylish durable lightweight compact unisex women womens men mens kids "
    "baby girls boys adult real fine rich deep bright solid plain".split()
)
_ADJ_SUFFIXES = ("ful", "less", "ous", "ive", "able", "ible", "ish", "ly")
_WORD = re.compile(r"[a-z][a-z'-]*[a-z]")


def _ratio(a: str, b: str) -> int:
    """Token-set ratio as thefuzz computes it: default preprocessing, rounded to an integer."""
    return int(round(fuzz.token_set_ratio(a, b, processor=default_process)))


def normalize_color(value: str) -> str:
    """Return the first colour word contained in `value` (alphabetical order), else `value` unchanged."""
    for color in COLOR_WORDS:
        if color in value:
            return color
    return value


def title_nouns(name: str) -> list[str]:
    """Heuristic stand-in for spaCy's NOUN / PROPN tokens of a product name, lowercased (see module docstring)."""
    nouns = []
    for word in _WORD.findall(name.lower()):
        if word in _STOPWORDS or word in _ADJECTIVES or word in _COLOR_SET:
            continue
        if len(word) > 4 and word.endswith(_ADJ_SUFFIXES):
            continue
        nouns.append(word)
    return nouns


@dataclass(frozen=True)
class ScoreBreakdown:
    """The parts of one purchase's reward, as the original reports them in its verbose info.

    Attributes:
        total: the reward in [0, 1].
        r_type: the type multiplier (1.0, 0.5, 0.1 or 0.0).
        n_attributes: goal attributes matched.
        n_options: goal options matched.
        price_ok: the price is at most the goal's cap.
        query_match: the product's search query equals the goal's.
        category_match: the category paths share at least two levels.
        title_score: the fraction of the goal name's nouns found in the product name's nouns.
    """

    total: float
    r_type: float
    n_attributes: int
    n_options: int
    price_ok: bool
    query_match: bool
    category_match: bool
    title_score: float


def _type_score(goal: Mapping[str, Any], product: Mapping[str, Any]) -> tuple[float, bool, bool, float]:
    query_match = product["query"] == goal["query"]
    bought_path = {level.strip() for level in product["product_category"].split("›")}
    goal_path = {level.strip() for level in goal["product_category"].split("›")}
    category_match = len(bought_path & goal_path) >= 2
    goal_nouns = set(title_nouns(goal["name"]))
    bought_nouns = set(title_nouns(product["name"]))
    title_score = len(goal_nouns & bought_nouns) / len(goal_nouns) if goal_nouns else 0.2
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type, query_match, category_match, title_score


def _count_attributes(goal_attributes: Sequence[str], product: Mapping[str, Any]) -> int:
    title = product["Title"].lower()
    bullets = " ".join(product["BulletPoints"]).lower()
    description = product["Description"].lower()
    matched = 0
    for wanted in goal_attributes:
        if any(_ratio(have, wanted) > FUZZY_THRESHOLD for have in product["Attributes"]):
            matched += 1
        elif wanted in title or wanted in bullets or wanted in description:
            matched += 1
    return matched


def _goal_option_values(goal_options: Mapping[str, str] | Sequence[str]) -> list[str]:
    # Synthetic goals store {name: value}; human goals store a list of values.
    return list(goal_options.values()) if isinstance(goal_options, Mapping) else list(goal_options)


def _count_options(goal_values: Sequence[str], chosen: Mapping[str, str]) -> int:
    chosen_values = [normalize_color(v) for v in chosen.values()]
    matched = 0
    for wanted in (normalize_color(v) for v in goal_values):
        if any(_ratio(have, wanted) > FUZZY_THRESHOLD for have in chosen_values):
            matched += 1
    return matched


def score_breakdown(
    goal: Mapping[str, Any], product: Mapping[str, Any], options: Mapping[str, str]
) -> ScoreBreakdown:
    """Score buying `product` with `options` for `goal`, with every part of the reward.

    Args:
        goal: a goal dict with ``attributes``, ``goal_options`` (dict name -> value, or list of values),
            ``price_upper``, ``query``, ``product_category`` and ``name``.
        product: a product dict with ``Title``, ``Attributes``, ``BulletPoints``, ``Description``, ``query``,
            ``product_category``, ``name`` and ``price`` (the price actually paid).
        options: the chosen options, option name -> value.

    Returns:
        The total reward and its parts.
    """
    for key in ("attributes", "goal_options", "price_upper", "query", "product_category", "name"):
        if key not in goal:
            raise KeyError(f"webshop score: goal has no {key!r} field (got {sorted(goal)})")
    for key in ("Title", "Attributes", "BulletPoints", "Description", "query", "product_category", "name", "price"):
        if key not in product:
            raise KeyError(f"webshop score: product has no {key!r} field (got {sorted(product)})")
    r_type, query_match, category_match, title_score = _type_score(goal, product)
    goal_values = _goal_option_values(goal["goal_options"])
    n_attributes = _count_attributes(goal["attributes"], product)
    n_options = _count_options(goal_values, options)
    price_ok = float(product["price"]) <= float(goal["price_upper"])
    total = r_type * (n_attributes + n_options + int(price_ok)) / (len(goal["attributes"]) + len(goal_values) + 1)
    return ScoreBreakdown(
        total=total,
        r_type=r_type,
        n_attributes=n_attributes,
        n_options=n_options,
        price_ok=price_ok,
        query_match=query_match,
        category_match=category_match,
        title_score=title_score,
    )


def score(goal: Mapping[str, Any], product: Mapping[str, Any], options: Mapping[str, str]) -> float:
    """The WebShop reward in [0, 1] for buying `product` with `options` for `goal` (see `score_breakdown`)."""
    return score_breakdown(goal, product, options).total
