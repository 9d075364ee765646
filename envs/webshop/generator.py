"""A seeded generator of WebShop catalogues in the original's schema, from 1k to 1.18M products.

The real catalogue (1.18M scraped Amazon products) cannot be downloaded here, so tests, benchmarks and default envs
use generated ones: the five original categories (beauty, electronics, fashion, furniture, grocery), each with
product types carrying a search query, a category path, an attribute pool and option axes (colour, size, flavour,
...), prices drawn per type (a fifth of them as "$a - $b" ranges), and one goal per product whose instruction names
some of its attributes, one value per option and a price cap, built exactly as the original builds its goals.

The same seed gives the same catalogue and goals, byte for byte. Titles carry a brand and a model code, so they are
distinct and a search for a product's title finds it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from agentrl.envs.webshop.catalog import make_goal, normalize_product

__all__ = ["CATEGORIES", "ProductType", "generate_catalogue"]


@dataclass(frozen=True)
class ProductType:
    """A kind of product the generator makes.

    Attributes:
        noun: the product noun phrase used in titles and instructions ("shampoo").
        query: the search query the original scraped it with.
        path: the category path, levels joined with " › ".
        attributes: the pool of attributes a product of this type draws from.
        options: option axes, name -> pool of values.
        price: (low, high) dollars.
    """

    noun: str
    query: str
    path: str
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]
    price: tuple[float, float]


_COLORS = ("black", "white", "navy blue", "red", "grey", "pink", "beige", "green", "brown", "purple", "gold",
           "silver", "light blue", "khaki", "burgundy", "ivory", "teal", "coral")
_APPAREL_SIZES = ("x-small", "small", "medium", "large", "x-large", "xx-large", "3x-large")
_SHOE_SIZES = ("6", "6.5", "7", "7.5", "8", "8.5", "9", "9.5", "10", "10.5", "11", "12")
_BEAUTY_SIZES = ("1 fl oz (pack of 1)", "3.4 fl oz (pack of 1)", "8 fl oz (pack of 2)", "16 fl oz (pack of 1)",
                 "2 count (pack of 3)")
_FOOD_SIZES = ("4 ounce (pack of 1)", "8 ounce (pack of 2)", "12 ounce (pack of 6)", "1 pound (pack of 1)",
               "24 count (pack of 1)")
_FLAVORS = ("original", "chocolate", "vanilla", "strawberry", "sea salt", "honey roasted", "spicy", "lemon",
            "peanut butter", "caramel", "mixed berry", "barbecue")
# Option values must survive the original's colour normalisation: "sandalwood" would become "sand" on the chosen
# side but not inside the goal's (name, value) pair, so even the goal product with the goal options would score 0.8.
_SCENTS = ("lavender", "unscented", "coconut", "rose", "citrus", "eucalyptus mint", "vanilla", "cedarwood")

_BEAUTY = "Beauty & Personal Care"
_FOOD = "Grocery & Gourmet Food"
_FASHION = "Clothing, Shoes & Jewelry"
_HOME = "Home & Kitchen › Furniture"
_ELEC = "Electronics"

CATEGORIES: dict[str, tuple[ProductType, ...]] = {
    "beauty": (
        ProductType("shampoo", "shampoo", f"{_BEAUTY} › Hair Care › Shampoo & Conditioner › Shampoos",
                    ("sulfate free", "paraben free", "natural ingredients", "dry hair", "hair growth",
                     "cruelty free", "long lasting", "color treated"),
                    (("size", _BEAUTY_SIZES), ("scent", _SCENTS)), (6, 45)),
        ProductType("face moisturizer", "face moisturizer", f"{_BEAUTY} › Skin Care › Face › Moisturizers",
                    ("fine lines", "dry skin", "sensitive skin", "hyaluronic acid", "oil free", "anti aging",
                     "non toxic", "dermatologist tested"),
                    (("size", _BEAUTY_SIZES),), (9, 80)),
        ProductType("lipstick", "lipstick", f"{_BEAUTY} › Makeup › Lips › Lipstick",
                    ("long lasting", "cruelty free", "paraben free", "highly pigmented", "easy apply", "vegan"),
                    (("color", _COLORS),), (5, 35)),
        ProductType("hair extension", "hair extensions", f"{_BEAUTY} › Hair Care › Hair Extensions, Wigs & "
                    "Accessories › Hair Extensions", ("natural looking", "high quality", "easy apply",
                                                      "heat resistant", "synthetic hair", "clip in"),
                    (("color", _COLORS), ("size", ("14 inch", "16 inch", "18 inch", "20 inch", "22 inch"))),
                    (12, 120)),
        ProductType("deodorant", "deodorant", f"{_BEAUTY} › Personal Care › Deodorants & Antiperspirants",
                    ("aluminum free", "sensitive skin", "long lasting", "natural ingredients", "travel size"),
                    (("scent", _SCENTS), ("size", _BEAUTY_SIZES)), (4, 25)),
    ),
    "electronics": (
        ProductType("wireless earbuds", "wireless earbuds", f"{_ELEC} › Headphones, Earbuds & Accessories › Earbuds",
                    ("noise cancelling", "bluetooth 5.0", "water resistant", "long battery life", "fast charging",
                     "hands free"), (("color", _COLORS),), (15, 250)),
        ProductType("phone case", "iphone case", f"{_ELEC} › Cell Phones & Accessories › Cases, Holsters & Sleeves",
                    ("shock absorbing", "wireless charging", "easy install", "slim fit", "scratch resistant"),
                    (("color", _COLORS), ("size", ("iphone 13", "iphone 14", "iphone 14 pro", "iphone 15",
                                                   "iphone 15 pro max"))), (6, 40)),
        ProductType("hdmi cable", "hdmi cable", f"{_ELEC} › Television & Video › Accessories › Cables › HDMI Cables",
                    ("high speed", "gold plated", "4k hdr", "plug and play", "easy carry"),
                    (("size", ("3 feet", "6 feet", "10 feet", "15 feet", "25 feet")),), (5, 30)),
        ProductType("security camera", "security camera", f"{_ELEC} › Camera & Photo › Video Surveillance",
                    ("night vision", "motion detection", "easy install", "two way audio", "high definition",
                     "weather resistant"), (("size", ("1 camera", "2 cameras", "4 cameras")),), (25, 400)),
        ProductType("tv mount", "tv wall mount", f"{_ELEC} › Television & Video › Accessories › TV Mounts",
                    ("heavy duty", "easy install", "full motion", "stainless steel", "space saving"),
                    (("size", ("26-55 inch", "32-65 inch", "42-85 inch")),), (18, 150)),
    ),
    "fashion": (
        ProductType("running shoes", "men's running shoes", f"{_FASHION} › Men › Shoes › Athletic › Running",
                    ("rubber sole", "lace up", "memory foam", "non slip", "breathable mesh", "arch support"),
                    (("color", _COLORS), ("size", _SHOE_SIZES)), (30, 160)),
        ProductType("t-shirt", "women's t-shirts", f"{_FASHION} › Women › Clothing › Tops, Tees & Blouses › T-Shirts",
                    ("machine wash", "short sleeve", "cotton spandex", "relaxed fit", "soft material", "crew neck"),
                    (("color", _COLORS), ("size", _APPAREL_SIZES)), (9, 40)),
        ProductType("yoga pants", "women's yoga pants", f"{_FASHION} › Women › Clothing › Active › Leggings",
                    ("high waist", "tummy control", "butt lift", "moisture wicking", "machine wash",
                     "four way stretch"), (("color", _COLORS), ("size", _APPAREL_SIZES)), (15, 55)),
        ProductType("winter jacket", "men's winter jacket", f"{_FASHION} › Men › Clothing › Jackets & Coats",
                    ("water resistant", "hooded", "zipper closure", "fleece lined", "windproof", "machine wash"),
                    (("color", _COLORS), ("size", _APPAREL_SIZES)), (35, 220)),
        ProductType("sandals", "women's sandals", f"{_FASHION} › Women › Shoes › Sandals",
                    ("open toe", "ankle strap", "non slip", "rubber sole", "arch support", "memory foam"),
                    (("color", _COLORS), ("size", _SHOE_SIZES)), (18, 90)),
    ),
    "furniture": (
        ProductType("sofa", "living room sofa", f"{_HOME} › Living Room Furniture › Sofas & Couches",
                    ("mid century", "easy assemble", "solid wood", "living room", "high density foam",
                     "removable cushions"), (("color", _COLORS), ("size", ("loveseat", "3 seat", "sectional"))),
                    (250, 1400)),
        ProductType("office chair", "office chair", f"{_HOME} › Home Office Furniture › Home Office Chairs",
                    ("lumbar support", "height adjustable", "easy assemble", "high back", "swivel", "breathable"),
                    (("color", _COLORS),), (60, 450)),
        ProductType("bookshelf", "bookshelf", f"{_HOME} › Living Room Furniture › Bookcases",
                    ("easy assemble", "space saving", "solid wood", "storage space", "living room", "metal frame"),
                    (("color", ("white", "black", "walnut", "oak", "espresso", "grey")),
                     ("size", ("3 tier", "4 tier", "5 tier"))), (40, 300)),
        ProductType("coffee table", "coffee table", f"{_HOME} › Living Room Furniture › Tables › Coffee Tables",
                    ("storage space", "easy assemble", "tempered glass", "solid wood", "mid century"),
                    (("color", ("white", "black", "walnut", "oak", "rustic brown", "grey")),), (50, 500)),
        ProductType("bed frame", "queen bed frame", f"{_HOME} › Bedroom Furniture › Beds, Frames & Bases",
                    ("no box spring needed", "easy assemble", "heavy duty", "storage space", "noise free"),
                    (("size", ("twin", "full", "queen", "king")),), (90, 900)),
    ),
    "grocery": (
        ProductType("protein bars", "protein bars", f"{_FOOD} › Snacks & Sweets › Bars › Protein",
                    ("gluten free", "low sugar", "high protein", "non gmo", "keto friendly", "plant based"),
                    (("flavor name", _FLAVORS), ("size", _FOOD_SIZES)), (12, 45)),
        ProductType("coffee beans", "whole bean coffee", f"{_FOOD} › Beverages › Coffee › Whole Coffee Beans",
                    ("medium roast", "dark roast", "fair trade", "usda organic", "single origin", "low acid"),
                    (("size", _FOOD_SIZES),), (9, 40)),
        ProductType("potato chips", "potato chips", f"{_FOOD} › Snacks & Sweets › Chips & Crisps",
                    ("gluten free", "kettle cooked", "non gmo", "individually wrapped", "low sodium"),
                    (("flavor name", _FLAVORS), ("size", _FOOD_SIZES)), (3, 30)),
        ProductType("green tea", "green tea", f"{_FOOD} › Beverages › Tea › Green",
                    ("usda organic", "caffeine free", "non gmo", "individually wrapped", "natural ingredients"),
                    (("flavor name", ("original", "jasmine", "lemon", "mint", "honey", "ginger")),
                     ("size", _FOOD_SIZES)), (5, 28)),
        ProductType("almond butter", "almond butter", f"{_FOOD} › Pantry Staples › Nut & Seed Butters",
                    ("no sugar added", "keto friendly", "non gmo", "gluten free", "plant based", "dairy free"),
                    (("flavor name", _FLAVORS), ("size", _FOOD_SIZES)), (7, 35)),
    ),
}

_BRANDS = ("Aurora", "Bellwood", "Cobalt", "Driftline", "Everpeak", "Foxglove", "Granite & Co", "Harbor",
           "Ironleaf", "Juniper", "Kestrel", "Lumen", "Maple Ridge", "Northwind", "Oakhurst", "Pinecrest", "Quill",
           "Redstone", "Solstice", "Tidewater", "Umbra", "Vireo", "Willow", "Yarrow", "Zenith")
_TITLE_HOOKS = ("for Everyday Use", "Perfect Gift", "Premium Quality", "Value Pack", "Best Seller",
                "New Version", "for Home and Travel", "Made in USA")
_INSTRUCTION_OPENINGS = ("i am looking for a", "i need a", "i want a", "find me a", "i'm searching for a",
                         "get me a", "i would like a")
_ASIN_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_ASIN_SPACE = 36**8
_ASIN_MULTIPLIER = 2654435761  # coprime with 36, so index -> ASIN is a bijection on [0, 36^8)


def _asin(index: int, seed: int) -> str:
    code = (index * _ASIN_MULTIPLIER + (seed * 97 + 1) * 1_234_567_891) % _ASIN_SPACE
    chars = []
    for _ in range(8):
        code, digit = divmod(code, 36)
        chars.append(_ASIN_ALPHABET[digit])
    return "B0" + "".join(reversed(chars))


def _raw_product(index: int, seed: int, rng: random.Random) -> tuple[dict[str, Any], dict[str, Any]]:
    category = rng.choice(tuple(CATEGORIES))
    kind = rng.choice(CATEGORIES[category])
    asin = _asin(index, seed)
    attributes = rng.sample(kind.attributes, k=min(len(kind.attributes), rng.randint(3, 5)))
    brand = rng.choice(_BRANDS)
    model = f"{rng.choice(_ASIN_ALPHABET[10:])}{rng.choice(_ASIN_ALPHABET[10:])}-{rng.randint(100, 9999)}"
    title = f"{brand} {kind.noun.title()} {model}, {attributes[0].title()}, {rng.choice(_TITLE_HOOKS)}"
    options = {}
    for name, pool in kind.options:
        options[name] = [{"value": v, "image": None} for v in rng.sample(pool, k=rng.randint(2, min(6, len(pool))))]
    low, high = kind.price
    price = round(rng.uniform(low, high), 2)
    pricing = f"${price:.2f}"
    if rng.random() < 0.2:
        pricing += f" - ${price * rng.uniform(1.1, 1.6):.2f}"
    bullets = [f"{a.capitalize()}: this {kind.noun} is {a}, made by {brand}." for a in attributes]
    raw = {
        "asin": asin,
        "name": title,
        "full_description": (f"The {brand} {kind.noun} {model} is {', '.join(attributes[:-1])} and "
                             f"{attributes[-1]}. Designed for {kind.query} shoppers who want {attributes[0]}."),
        "small_description": bullets,
        "category": category,
        "query": kind.query,
        "product_category": kind.path,
        "images": [None],
        "pricing": pricing,
        "customization_options": options,
    }
    return raw, {"attributes": attributes}


def _instruction(kind_noun: str, wanted: list[str], rng: random.Random) -> str:
    opening = rng.choice(_INSTRUCTION_OPENINGS)
    if len(wanted) == 1:
        return f"{opening} {wanted[0]} {kind_noun}"
    return f"{opening} {kind_noun} that is {', '.join(wanted[:-1])} and {wanted[-1]}"


def generate_catalogue(
    num_products: int, seed: int = 0, goals: str = "synthetic"
) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Yield ``(product, [goal])`` for `num_products` generated products, in the loaded schema.

    Args:
        num_products: how many products (1 up to 1.18M and beyond).
        seed: the catalogue seed; the same seed gives the same products and goals.
        goals: "synthetic" (options as ``{name: value}``, spelled out " with size: large") or "human" (options as a
            list of values, named in the sentence as people do: ", large and black"); "auto" means synthetic.
    """
    if goals not in ("auto", "synthetic", "human"):
        raise ValueError(f"webshop: goals must be 'auto', 'human' or 'synthetic', got {goals!r}")
    if num_products < 1:
        raise ValueError(f"webshop: num_products must be >= 1, got {num_products}")
    rng = random.Random(seed)
    nouns = {kind.query: kind.noun for kinds in CATEGORIES.values() for kind in kinds}
    for index in range(num_products):
        raw, ins = _raw_product(index, seed, rng)
        product = normalize_product(raw, ins)
        assert product is not None  # generated ASINs are always valid
        wanted = rng.sample(ins["attributes"], k=rng.randint(1, min(3, len(ins["attributes"]))))
        goal_options = {name: rng.choice(values) for name, values in sorted(product["options"].items())}
        option_text = " with " + ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
        chosen: dict[str, str] | list[str] = goal_options
        if goals == "human":
            chosen = list(goal_options.values())
            option_text = ", " + " and ".join(chosen)
        goal = make_goal(product, index, _instruction(nouns[product["query"]], wanted, rng), wanted, chosen,
                         random.Random(f"{seed}:goal:{index}"), option_text=option_text)
        yield product, [goal]

