"""Hand-worked cases for WebShop's reward `score` (see shared/docs/envs.md, "Reward (exact)")."""

import pytest

from agentrl.envs.webshop import normalize_color, score, score_breakdown, title_nouns

PATH = "Beauty & Personal Care › Hair Care › Shampoo & Conditioner › Shampoos"


def make_goal(**overrides):
    goal = {
        "attributes": ["sulfate free", "dry hair"],
        "goal_options": {"size": "16 fl oz (pack of 1)", "scent": "lavender"},
        "price_upper": 30.0,
        "query": "shampoo",
        "product_category": PATH,
        "name": "Acme Lavender Shampoo for Dry Hair",
    }
    return {**goal, **overrides}


def make_product(**overrides):
    product = {
        "Title": "Acme Lavender Shampoo for Dry Hair",
        "name": "Acme Lavender Shampoo for Dry Hair",
        "Attributes": ["sulfate-free", "paraben free"],
        "BulletPoints": ["Gentle formula", "Made in USA"],
        "Description": "A shampoo.",
        "query": "shampoo",
        "product_category": PATH,
        "price": 29.99,
    }
    return {**product, **overrides}


GOOD_OPTIONS = {"size": "16 fl oz (pack of 1)", "scent": "light lavender"}


def test_perfect_purchase_scores_one():
    # "sulfate-free" fuzzy-matches "sulfate free" (100 after preprocessing); "dry hair" is a substring of the title;
    # "light lavender" and "lavender" both normalise to "lavender"; 29.99 <= 30; same query: (2 + 2 + 1) / 5.
    parts = score_breakdown(make_goal(), make_product(), GOOD_OPTIONS)
    assert (parts.n_attributes, parts.n_options, parts.price_ok, parts.r_type) == (2, 2, True, 1.0)
    assert parts.total == pytest.approx(1.0)


def test_price_boundary_is_inclusive():
    assert score(make_goal(), make_product(price=30.0), GOOD_OPTIONS) == pytest.approx(1.0)
    assert score(make_goal(), make_product(price=30.01), GOOD_OPTIONS) == pytest.approx(4 / 5)


def test_attribute_needs_fuzzy_ratio_above_85_or_a_substring():
    goal = make_goal(attributes=["water resistant", "dry hair"])
    # "water resistant" vs "sulfate-free"/"paraben free": low ratio, and not in title / bullets / description.
    parts = score_breakdown(goal, make_product(), GOOD_OPTIONS)
    assert parts.n_attributes == 1
    assert parts.total == pytest.approx(4 / 5)
    # The same attribute found in a bullet point counts.
    product = make_product(BulletPoints=["Water resistant cap"])
    assert score(goal, product, GOOD_OPTIONS) == pytest.approx(1.0)


def test_colour_normalisation_matches_shades():
    goal = make_goal(goal_options={"color": "navy blue"})
    # Without normalisation "navy blue" vs "light blue" is below 86; both normalise to "blue".
    assert score(goal, make_product(), {"color": "light blue"}) == pytest.approx(1.0)
    assert score(goal, make_product(), {"color": "red"}) == pytest.approx(3 / 4)
    assert score(goal, make_product(), {}) == pytest.approx(3 / 4)


def test_normalize_color_takes_first_colour_alphabetically():
    assert normalize_color("violet lavender") == "lavender"
    assert normalize_color("black forest") == "black"
    assert normalize_color("webshop") == "webshop"
    assert normalize_color("") == ""


def test_human_goal_options_may_be_a_list():
    goal = make_goal(goal_options=["16 fl oz (pack of 1)"])
    assert score(goal, make_product(), {"size": "16 fl oz (pack of 1)"}) == pytest.approx(1.0)
    assert score(goal, make_product(), {"size": "8 fl oz"}) == pytest.approx(3 / 4)


def test_type_score_levels():
    other = {"query": "conditioner", "product_category": "Garden › Tools"}
    # title_score 1/5 = 0.2 (not > 0.2), no query or category match: r_type 0.5.
    goal = make_goal(name="Acme Shampoo Bottle Pump Refill", **other)
    assert title_nouns(goal["name"]) == ["acme", "shampoo", "bottle", "pump", "refill"]
    parts = score_breakdown(goal, make_product(name="Zenith Shampoo"), GOOD_OPTIONS)
    assert (parts.title_score, parts.r_type) == (pytest.approx(0.2), 0.5)
    assert parts.total == pytest.approx(0.5)
    # The same title score with a query match keeps r_type 1.0.
    goal_same_query = make_goal(name="Acme Shampoo Bottle Pump Refill")
    assert score(goal_same_query, make_product(name="Zenith Shampoo"), GOOD_OPTIONS) == pytest.approx(1.0)
    # title_score 1/11 < 0.1: r_type 0.1 even with a query match.
    long_name = "Acme Shampoo Bottle Pump Refill Kit Travel Case Brush Comb Towel"
    assert len(title_nouns(long_name)) == 11
    parts = score_breakdown(make_goal(name=long_name), make_product(name="Zenith Shampoo"), GOOD_OPTIONS)
    assert (parts.r_type, parts.total) == (0.1, pytest.approx(0.1))
    # No shared noun: r_type 0.0.
    assert score(make_goal(name="Acme Shampoo"), make_product(name="Zenith Sofa"), GOOD_OPTIONS) == 0.0
    # A goal name without nouns gives title_score 0.2.
    parts = score_breakdown(make_goal(name="Black Soft"), make_product(name="Zenith Sofa"), GOOD_OPTIONS)
    assert (parts.title_score, parts.r_type) == (pytest.approx(0.2), 1.0)


def test_category_match_needs_two_shared_levels():
    goal = make_goal(query="other", name="Acme Shampoo Bottle Pump Refill")
    two_levels = make_product(name="Zenith Shampoo", query="x", product_category="Beauty & Personal Care › Hair Care")
    assert score_breakdown(goal, two_levels, GOOD_OPTIONS).category_match
    assert score(goal, two_levels, GOOD_OPTIONS) == pytest.approx(1.0)
    one_level = make_product(name="Zenith Shampoo", query="x", product_category="Beauty & Personal Care › Makeup")
    assert score(goal, one_level, GOOD_OPTIONS) == pytest.approx(0.5)


def test_missing_fields_are_named():
    with pytest.raises(KeyError, match="price"):
        score(make_goal(), {k: v for k, v in make_product().items() if k != "price"}, {})
