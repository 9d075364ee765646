"""The original WebShop data: loading its files, product normalization, goals and goal splits.

Files (princeton-nlp/WebShop ``data/``), read from `data_dir`:
    * ``items_shuffle*.json``: the products (``asin``, ``name``, ``full_description``, ``small_description``,
      ``category``, ``query``, ``product_category``, ``images``, ``pricing``, ``customization_options``, ...).
    * ``items_ins_v2*.json``: ``{asin: {attributes, instruction, instruction_attributes}}``.
    * ``items_human_ins.json`` (optional): ``{asin: [{instruction, instruction_attributes, instruction_options}]}``;
      when present its human instructions are the goals, as in the benchmark.

Prices of range-priced products and goal price caps are drawn from seeded RNGs (the original uses the global one),
and catalogues of fewer than 3,000 goals split 10% / 10% / 80% after the original's seed-233 shuffle (with fewer
than 3 goals every split holds them all); these and every other departure are listed in ``DEVIATIONS.md``.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Iterator, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "SPLITS",
    "find_data_files",
    "goal_splits",
    "goals_for_product",
    "iter_original_products",
    "make_goal",
    "normalize_product",
    "parse_pricing",
    "resolve_price",
]

SPLITS = ("train", "eval", "test")
SPLIT_SEED = 233
PRICE_STEPS = [10.0 * i for i in range(1, 100)]
_MISSING_PRICE = 100.0


def parse_pricing(pricing: str | None) -> tuple[list[float], str]:
    """Parse ``"$12.99"`` or ``"$10.99 - $20.99"`` into floats and the price tag the pages show.

    A missing price becomes ``[100.0]``, shown as ``$100.0``, as in the original.
    """
    if not pricing:
        return [_MISSING_PRICE], f"${_MISSING_PRICE}"
    digits = [re.sub(r"[^\d.]", "", part) for part in pricing.split("$")[1:]]
    values = [float(Decimal(d)) for d in digits if d and d.count(".") <= 1 and d != "."]
    if not values:
        return [_MISSING_PRICE], f"${_MISSING_PRICE}"
    if len(values) == 1:
        return values, f"${values[0]}"
    return values[:2], f"${values[0]} to ${values[1]}"


def resolve_price(pricing: list[float], asin: str) -> float:
    """The price paid for a product: its single price, or a draw in its range seeded by the ASIN."""
    if len(pricing) == 1:
        return pricing[0]
    return random.Random(f"price:{asin}").uniform(pricing[0], pricing[1])


def normalize_product(raw: Mapping[str, Any], attributes: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """Turn one ``items_shuffle`` record into the loaded schema the pages and `score` read.

    Args:
        raw: the product record as stored in ``items_shuffle*.json``.
        attributes: the product's ``items_ins_v2`` record, if any.

    Returns:
        The loaded product (``asin``, ``name``, ``Title``, ``Description``, ``BulletPoints``, ``Attributes``,
        ``options``, ``option_to_image``, ``pricing``, ``Price``, ``price``, ``query``, ``category``,
        ``product_category``, ``MainImage``, ``Reviews``, ``Rating``), or None for a record the original skips
        (ASIN 'nan' or longer than 10 characters).
    """
    asin = str(raw.get("asin", ""))
    if not asin or asin == "nan" or len(asin) > 10:
        return None
    bullets = raw.get("small_description") or []
    bullets = [str(b) for b in bullets] if isinstance(bullets, list) else [str(bullets)]
    pricing, price_tag = parse_pricing(raw.get("pricing"))
    options: dict[str, list[str]] = {}
    option_to_image: dict[str, str | None] = {}
    for name, contents in (raw.get("customization_options") or {}).items():
        if contents is None:
            continue
        values = []
        for content in contents:
            value = str(content["value"]).strip().replace("/", " | ").lower()
            values.append(value)
            option_to_image[value] = content.get("image")
        options[name.lower()] = values
    product_attributes = (attributes or {}).get("attributes") or ["DUMMY_ATTR"]
    images = raw.get("images") or [None]
    return {
        "asin": asin,
        "name": raw["name"],
        "Title": raw["name"],
        "Description": raw.get("full_description") or "",
        "BulletPoints": bullets,
        "Attributes": list(product_attributes),
        "options": options,
        "option_to_image": option_to_image,
        "pricing": pricing,
        "Price": price_tag,
        "price": resolve_price(pricing, asin),
        "query": str(raw.get("query", "")).lower().strip(),
        "category": raw.get("category", ""),
        "product_category": raw.get("product_category", ""),
        "MainImage": images[0],
        "Reviews": [],
        "Rating": "N.A.",
    }


def make_goal(
    product: Mapping[str, Any],
    product_index: int,
    instruction: str,
    attributes: list[str],
    goal_options: dict[str, str] | list[str],
    rng: random.Random,
    option_text: str = "",
) -> dict[str, Any]:
    """Build a goal for `product`, drawing its price cap from `rng` as the original does.

    The cap is the larger of two draws from the first four multiples of 10 above the price; with fewer than two
    such steps (prices of $980 and more) there is no cap. The instruction text is ``instruction + option_text +
    price_text`` as given: the original strips dots off human instructions only (`goals_for_product` does that).
    """
    steps = [p for p in PRICE_STEPS if p > product["price"]][:4]
    if len(steps) >= 2:
        price_upper: float = max(rng.sample(steps, 2))
        price_text = f", and price lower than {price_upper:.2f} dollars"
    else:
        price_upper, price_text = 1000000.0, ""
    return {
        "asin": product["asin"],
        "product_index": product_index,
        "category": product["category"],
        "query": product["query"],
        "name": product["Title"],
        "product_category": product["product_category"],
        "instruction_text": f"{instruction}{option_text}{price_text}",
        "attributes": list(attributes),
        "price_upper": price_upper,
        "goal_options": goal_options,
    }


def goals_for_product(
    product: Mapping[str, Any],
    product_index: int,
    instructions: Mapping[str, Any] | None,
    human_instructions: list[Mapping[str, Any]] | None,
) -> list[dict[str, Any]]:
    """The goals one original product yields: its human instructions if given, else synthetic ones.

    Human goals: one per instruction with non-empty ``instruction_attributes``; their options are a list of
    values. Synthetic goals: one per combination of the product's option values, with the options spelled out
    in the text (" with color: black, and size: large").
    """
    goals = []
    if human_instructions is not None:
        for i, ins in enumerate(human_instructions):
            if not ins.get("instruction_attributes"):
                continue
            rng = random.Random(f"goal:{product['asin']}:{i}")
            goals.append(make_goal(product, product_index, ins["instruction"].strip("."), ins["instruction_attributes"],
                                   list(ins.get("instruction_options") or []), rng))
        return goals
    if not instructions or not instructions.get("instruction") or not instructions.get("instruction_attributes"):
        return goals
    names = sorted(product["options"])
    for i, combination in enumerate(itertools.product(*(product["options"][n] for n in names))):
        goal_options = dict(zip(names, combination, strict=True))
        option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
        rng = random.Random(f"goal:{product['asin']}:{i}")
        goals.append(make_goal(product, product_index, instructions["instruction"],
                               instructions["instruction_attributes"], goal_options, rng,
                               option_text=f" with {option_text}" if option_text else ""))
    return goals


def goal_splits(num_goals: int) -> dict[str, np.ndarray]:
    """Goal indices per split, after the original's seed-233 shuffle (see the module docstring for sizes)."""
    order = list(range(num_goals))
    random.Random(SPLIT_SEED).shuffle(order)
    shuffled = np.asarray(order, dtype=np.int64)
    if num_goals < 3:  # a toy catalogue (hand-written test files): nothing to hold out, every split plays all goals
        return {"test": shuffled, "eval": shuffled, "train": shuffled}
    if num_goals >= 3000:
        n_test, n_eval = 500, 1000
    else:
        n_test = n_eval = max(1, num_goals // 10)
    return {
        "test": shuffled[:n_test],
        "eval": shuffled[n_test:n_test + n_eval],
        "train": shuffled[n_test + n_eval:],
    }


def _pick(data_dir: Path, stem: str, num_products: int | None, required: bool) -> Path | None:
    candidates = sorted(data_dir.glob(f"{stem}*.json"))
    if not candidates:
        if required:
            raise FileNotFoundError(
                f"webshop: no {stem}*.json in {data_dir}; download the original data (princeton-nlp/WebShop "
                f"setup.sh) or leave data_dir unset to use a generated catalogue"
            )
        return None
    small = [c for c in candidates if c.stem.endswith("_1000")]
    full = [c for c in candidates if not c.stem.endswith("_1000")]
    if num_products is not None and num_products <= 1000 and small:
        return small[0]
    return (full or small)[0]


def find_data_files(data_dir: str | Path, num_products: int | None = None) -> dict[str, Path | None]:
    """Locate the original files in `data_dir`: the 1,000-product files when `num_products` <= 1000.

    Returns:
        ``{"products": ..., "attributes": ..., "human": ...}``; ``human`` is None when absent.
    """
    data_dir = Path(data_dir).expanduser()
    if not data_dir.is_dir():
        raise FileNotFoundError(f"webshop: data_dir {data_dir} is not a directory")
    return {
        "products": _pick(data_dir, "items_shuffle", num_products, required=True),
        "attributes": _pick(data_dir, "items_ins_v2", num_products, required=True),
        "human": data_dir / "items_human_ins.json" if (data_dir / "items_human_ins.json").exists() else None,
    }


def _load_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"webshop: {path} is not valid JSON ({e})") from None


def iter_original_products(
    data_dir: str | Path, num_products: int | None = None, goals: str = "auto"
) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Yield ``(product, goals)`` for each product of the original files, skipping what the original skips.

    Args:
        data_dir: the folder holding the original files.
        num_products: keep only the first `num_products` records (the files are pre-shuffled).
        goals: "human" (``items_human_ins.json``, required), "synthetic" (from ``items_ins_v2``, the original's
            ``human_goals=False``) or "auto" (human when the file exists).
    """
    files = find_data_files(data_dir, num_products)
    if goals == "human" and files["human"] is None:
        raise FileNotFoundError(f"webshop: goals='human' needs items_human_ins.json in {data_dir}; download it "
                                "(princeton-nlp/WebShop setup.sh) or use goals='synthetic'")
    if goals == "synthetic":
        files["human"] = None
    raw_products = _load_json(files["products"])
    if not isinstance(raw_products, list):
        raise ValueError(f"webshop: {files['products']} must hold a list of products")
    attributes = _load_json(files["attributes"])
    human = _load_json(files["human"]) if files["human"] is not None else None
    if num_products is not None:
        raw_products = raw_products[:num_products]
    seen: set[str] = set()
    index = 0
    for raw in raw_products:
        asin = str(raw.get("asin", ""))
        if asin in seen:
            continue
        product = normalize_product(raw, attributes.get(asin))
        if product is None:
            continue
        seen.add(asin)
        human_ins = (human.get(asin) or []) if human is not None else None
        goals = goals_for_product(product, index, attributes.get(asin), human_ins)
        yield product, goals
        index += 1
