"""WebShopEnv: golden pages on a tiny hand-written catalogue in the original's file format, transitions, the
expert, the contract checks, generated catalogues and the on-disk cache."""

import json
import random

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from agentrl.envs.webshop import WebShopEnv, WebShopResource, generate_catalogue
from agentrl.envs.webshop.catalog import goal_splits, parse_pricing

RAW_PRODUCTS = [
    {
        "asin": "B000SHAMP1", "name": "Acme Lavender Shampoo for Dry Hair",
        "full_description": "A gentle sulfate free shampoo.", "small_description": ["Sulfate free", "For dry hair"],
        "category": "beauty", "query": "Shampoo ", "product_category": "Beauty › Hair Care › Shampoos",
        "images": ["img1.jpg"], "pricing": "$12.50",
        "customization_options": {
            "Size": [{"value": "8 fl oz", "image": None}, {"value": "16 fl oz", "image": None}],
            "Scent": [{"value": "Lavender", "image": None}, {"value": "Citrus/Mint", "image": None}],
        },
        "brand": "Acme",
    },
    {
        "asin": "B000CHAIR2", "name": "Zenith Office Chair with Lumbar Support",
        "full_description": "An ergonomic chair.", "small_description": "Height adjustable",
        "category": "furniture", "query": "office chair", "product_category": "Home › Furniture › Office Chairs",
        "images": ["img2.jpg"], "pricing": "$80.00 - $120.00", "customization_options": None,
    },
    {"asin": "nan", "name": "skipped", "full_description": "", "small_description": "", "category": "x",
     "query": "x", "product_category": "x", "images": [], "pricing": "", "customization_options": None},
    {
        "asin": "B000SHAMP3", "name": "Budget Shampoo Value Pack",
        "full_description": "Everyday shampoo.", "small_description": ["Value pack"],
        "category": "beauty", "query": "shampoo", "product_category": "Beauty › Hair Care › Shampoos",
        "images": ["img3.jpg"], "pricing": "", "customization_options": {"Size": [{"value": "1 gallon"}]},
    },
    {"asin": "B000SHAMP1", "name": "duplicate", "full_description": "", "small_description": "", "category": "x",
     "query": "x", "product_category": "x", "images": [], "pricing": "", "customization_options": None},
]
ATTRIBUTES = {
    "B000SHAMP1": {"attributes": ["sulfate free", "dry hair"], "instruction": "i need a sulfate free shampoo",
                   "instruction_attributes": ["sulfate free"]},
    "B000CHAIR2": {"attributes": ["lumbar support"], "instruction": None, "instruction_attributes": []},
}
HUMAN = {
    "B000SHAMP1": [{"asin": "B000SHAMP1", "instruction": "i want a lavender shampoo for dry hair, 16 fl oz.",
                    "instruction_attributes": ["dry hair"], "instruction_options": ["16 fl oz", "lavender"]}],
    "B000CHAIR2": [{"asin": "B000CHAIR2", "instruction": "an office chair", "instruction_attributes": []}],
}


@pytest.fixture
def data_dir(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "items_shuffle_1000.json").write_text(json.dumps(RAW_PRODUCTS))
    (folder / "items_ins_v2_1000.json").write_text(json.dumps(ATTRIBUTES))
    (folder / "items_human_ins.json").write_text(json.dumps(HUMAN))
    return folder


@pytest.fixture
def tiny_env(data_dir, tmp_path):
    return WebShopEnv(data_dir=str(data_dir), cache_dir=str(tmp_path / "cache"), split="test")


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    return WebShopResource.build(num_products=300, seed=5, cache_dir=str(tmp_path_factory.mktemp("cache")))


INSTRUCTION = "i want a lavender shampoo for dry hair, 16 fl oz, and price lower than {cap:.2f} dollars"
HEADER = "Instruction: [SEP] {instruction} [SEP] Back to Search"


def test_loader_follows_the_original_schema(tiny_env):
    products = tiny_env.resource.products
    assert len(products) == 3  # 'nan' and the duplicate ASIN are skipped
    shampoo, chair, budget = products[0], products[1], products[2]
    assert shampoo["options"] == {"size": ["8 fl oz", "16 fl oz"], "scent": ["lavender", "citrus | mint"]}
    assert shampoo["Attributes"] == ["sulfate free", "dry hair"] and chair["Attributes"] == ["lumbar support"]
    assert budget["Attributes"] == ["DUMMY_ATTR"] and budget["Price"] == "$100.0" and budget["price"] == 100.0
    assert chair["BulletPoints"] == ["Height adjustable"] and chair["Price"] == "$80.0 to $120.0"
    assert 80.0 <= chair["price"] <= 120.0
    assert shampoo["query"] == "shampoo" and shampoo["Rating"] == "N.A." and shampoo["Reviews"] == []
    # Human goals: one per instruction with attributes (the chair's has none).
    assert len(tiny_env.resource.goals) == 1
    goal = tiny_env.resource.goals[0]
    assert goal["goal_options"] == ["16 fl oz", "lavender"] and goal["attributes"] == ["dry hair"]
    assert goal["price_upper"] in (30.0, 40.0, 50.0)  # two of the first four steps above $12.50, the larger


def test_golden_pages_and_purchase(tiny_env):
    obs, info = tiny_env.reset(seed=0)
    cap = tiny_env.goal["price_upper"]
    instruction = INSTRUCTION.format(cap=cap)
    assert obs == f"WebShop [SEP] Instruction: [SEP] {instruction} [SEP] Search"
    assert info["admissible_actions"] == ["search[<query>]"] and info["task_type"] == "beauty"

    obs, reward, terminated, truncated, info = tiny_env.step("search[lavender shampoo]")
    # The original always shows "Next >", even when every result fits on page 1.
    assert obs == (f"{HEADER.format(instruction=instruction)} [SEP] Page 1 (Total results: 2) [SEP] Next > [SEP] "
                   "B000SHAMP1 [SEP] Acme Lavender Shampoo for Dry Hair [SEP] $12.5 [SEP] "
                   "B000SHAMP3 [SEP] Budget Shampoo Value Pack [SEP] $100.0")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["admissible_actions"] == ["click[back to search]", "click[next >]", "click[b000shamp1]",
                                          "click[b000shamp3]"]

    obs, *_ = tiny_env.step("click[B000SHAMP1]")
    item = (f"{HEADER.format(instruction=instruction)} [SEP] < Prev [SEP] size [SEP] 8 fl oz [SEP] 16 fl oz [SEP] "
            "scent [SEP] lavender [SEP] citrus | mint [SEP] Acme Lavender Shampoo for Dry Hair [SEP] Price: $12.5 "
            "[SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now")
    assert obs == item
    obs, *_ = tiny_env.step("click[features]")
    assert obs == f"{HEADER.format(instruction=instruction)} [SEP] < Prev [SEP] Sulfate free [SEP] For dry hair"
    obs, *_ = tiny_env.step("click[< prev]")
    assert obs == item
    obs, *_ = tiny_env.step("click[description]")
    assert obs.endswith("< Prev [SEP] A gentle sulfate free shampoo.")
    tiny_env.step("click[< prev]")
    obs, *_ = tiny_env.step("click[reviews]")
    assert obs == f"{HEADER.format(instruction=instruction)} [SEP] < Prev"
    tiny_env.step("click[< prev]")

    # Invalid actions are no-ops with reward 0.
    for junk in ("click[not there]", "buy it", "click[search]", ""):
        obs, reward, terminated, truncated, info = tiny_env.step(junk)
        assert (obs, reward, terminated) == (item, 0.0, False) and "error" in info

    tiny_env.step("click[16 fl oz]")
    obs, *_ = tiny_env.step("click[lavender]")
    assert "[SEP] 16 fl oz [SEP]" in obs  # text mode does not mark the choice
    obs, reward, terminated, truncated, info = tiny_env.step("click[buy now]")
    # The original's done page, hidden debug block included, as its text mode reads it.
    assert obs == ("Thank you for shopping with us! [SEP] Your code: [SEP] None [SEP] (Paste it in your MTurk "
                   "interface.) [SEP] Purchased [SEP] asin [SEP] B000SHAMP1 [SEP] options [SEP] "
                   '{"scent": "lavender", "size": "16 fl oz"} [SEP] attrs [SEP] None [SEP] category [SEP] None [SEP] '
                   "query [SEP] None [SEP] product category [SEP] None [SEP] Target [SEP] asin [SEP] options [SEP] "
                   "attrs [SEP] price upper [SEP] instuction text [SEP] category [SEP] product category [SEP] query "
                   "[SEP] Goal [SEP] None [SEP] Reward [SEP] Your score (min 0.0, max 1.0) [SEP] 1.0 [SEP] "
                   "Reward Details [SEP] None")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["score"] == 1.0 and info["success"] is True and info["admissible_actions"] == []
    # Stepping after the end neither raises nor pays.
    assert tiny_env.step("click[buy now]")[1:3] == (0.0, True)


def test_results_paging_and_prev(generated):
    env = WebShopEnv(shared=generated)
    env.reset(seed=0)
    obs, *_ = env.step("search[color size]")
    assert "Page 1 (Total results: 50) [SEP] Next > [SEP]" in obs and "< Prev" not in obs
    obs, *_ = env.step("click[next >]")
    assert "Page 2 (Total results: 50) [SEP] < Prev [SEP] Next > [SEP]" in obs
    first_asin = obs.split("Next > [SEP] ")[1].split(" [SEP]")[0]
    env.step(f"click[{first_asin}]")
    obs, *_ = env.step("click[< prev]")  # item -> the results page it came from
    assert "Page 2 (Total results: 50)" in obs
    obs, *_ = env.step("click[back to search]")
    assert obs.startswith("WebShop [SEP] Instruction:")
    obs, *_ = env.step("search[zzzqqq]")  # nothing matches: no results, like Lucene
    assert "(Total results: 0)" in obs


def test_text_rich_marks_buttons_choices_and_visited_products(tiny_env):
    env = WebShopEnv(shared=tiny_env.resource, observation_mode="text_rich", split="test")
    env.reset(seed=0)
    env.step("search[lavender shampoo]")
    env.step("click[b000shamp1]")
    obs, *_ = env.step("click[lavender]")
    assert obs.startswith("You have clicked lavender.\nInstruction:\n")
    assert "  [clicked button] lavender [clicked button_]\n" in obs
    assert "  [button] citrus | mint [button_]\n" in obs and "[button] Buy Now [button_]\n" in obs
    obs, *_ = env.step("click[< prev]")
    assert "\n[clicked button] B000SHAMP1 [clicked button_]\n" in obs
    assert "\n[button] B000SHAMP3 [button_]\n" in obs


def test_truncation_after_max_steps(generated):
    env = WebShopEnv(shared=generated, max_steps=3)
    env.reset(seed=1)
    results = [env.step("click[nothing]") for _ in range(3)]
    assert [r[3] for r in results] == [False, False, True]
    assert results[-1][4]["success"] is False


def test_expert_scores_one_on_generated_goals(generated):
    for split in ("train", "eval", "test"):
        env = WebShopEnv(shared=generated, split=split)
        wins = 0
        for seed in range(30):
            env.reset(seed=seed)
            for _ in range(env.max_steps):
                _, reward, terminated, truncated, info = env.step(env.expert_action())
                if terminated or truncated:
                    break
            wins += info.get("success", False)
        assert wins == 30, split


def test_expert_on_human_goals(tiny_env):
    tiny_env.reset(seed=3)
    for _ in range(10):
        _, reward, terminated, truncated, _ = tiny_env.step(tiny_env.expert_action())
        if terminated:
            break
    assert reward == 1.0


def test_contract_checks(generated):
    env = WebShopEnv(shared=generated)
    check_env(env, skip_render_check=True)
    first = [env.reset(seed=7)[0]] + [env.step(a)[0] for a in ("search[coffee]", "click[next >]")]
    again = [env.reset(seed=7)[0]] + [env.step(a)[0] for a in ("search[coffee]", "click[next >]")]
    assert first == again
    rng = random.Random(0)
    env.reset(seed=0)
    for i in range(200):
        pick = rng.random()
        if pick < 0.4:
            action = env.action_space.sample()
        elif pick < 0.8 and env.admissible_actions():
            action = rng.choice(env.admissible_actions())
        else:
            action = rng.choice(["click[]", "search[]", "click[[x]]", "search[" * 3, "\n", "click[buy now]"])
        _, reward, terminated, truncated, _ = env.step(action)
        assert 0.0 <= reward <= 1.0
        if terminated or truncated:
            env.reset(seed=i)


def test_search_modes_find_the_title(generated):
    product = generated.products[17]
    for mode in ("bm25", "dense", "hybrid"):
        assert generated.searcher_for(mode).search(product["Title"])[0] == 17, mode


def test_generator_is_reproducible_and_in_schema():
    first = list(generate_catalogue(50, seed=3))
    assert first == list(generate_catalogue(50, seed=3))
    assert first != list(generate_catalogue(50, seed=4))
    assert len({p["asin"] for p, _ in first}) == 50
    for product, (goal,) in first:
        assert set(goal["attributes"]) <= set(product["Attributes"])
        assert all(product["options"][k].count(v) == 1 for k, v in goal["goal_options"].items())
        assert product["price"] <= goal["price_upper"]
        assert goal["instruction_text"].endswith("dollars") or goal["price_upper"] == 1000000.0


def test_cache_is_reused_and_keyed(tmp_path):
    first = WebShopResource.build(num_products=40, seed=1, cache_dir=str(tmp_path))
    again = WebShopResource.build(num_products=40, seed=1, cache_dir=str(tmp_path))
    other = WebShopResource.build(num_products=40, seed=2, cache_dir=str(tmp_path))
    assert first.folder == again.folder != other.folder
    assert isinstance(first.products.offsets, np.memmap)
    assert [p for p in sorted(tmp_path.iterdir()) if ".tmp-" in p.name] == []


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="split"):
        WebShopEnv(split="dev", cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="observation_mode"):
        WebShopEnv(observation_mode="xml", cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="goals must be one of"):
        WebShopEnv(goals="robot", cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="reward_convention"):
        WebShopEnv(reward_convention="alfworld", cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="noun_tagger"):
        WebShopEnv(noun_tagger="nltk", cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="search_mode"):
        WebShopEnv(search_mode="lucene", cache_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="items_shuffle"):
        WebShopEnv(data_dir=str(tmp_path), cache_dir=str(tmp_path))


def test_splits_and_pricing_helpers():
    big = goal_splits(12087)
    assert [len(big[s]) for s in ("test", "eval", "train")] == [500, 1000, 10587]
    assert sorted(np.concatenate(list(big.values())).tolist()) == list(range(12087))
    small = goal_splits(1000)
    assert [len(small[s]) for s in ("test", "eval", "train")] == [100, 100, 800]
    assert parse_pricing("$10.99 - $20.99") == ([10.99, 20.99], "$10.99 to $20.99")
    assert parse_pricing(None) == ([100.0], "$100.0")


def _play_expert(env, seed):
    env.reset(seed=seed)
    for _ in range(env.max_steps):
        _, reward, terminated, truncated, info = env.step(env.expert_action())
        if terminated or truncated:
            return reward, info
    raise AssertionError("the expert did not finish")


def test_verl_agent_reward_convention(generated):
    env = WebShopEnv(shared=generated, reward_convention="verl-agent")
    _, info = env.reset(seed=2)
    assert info["won"] is False
    reward, info = _play_expert(env, seed=2)
    assert (reward, info["won"], info["task_score"], info["score"]) == (10.0, True, 1.0, 1.0)
    # An imperfect purchase: the task score is the original's reward, the step reward 0.
    env.reset(seed=2)
    env.step("search[" + env.goal["name"].lower() + "]")
    env.step(env.expert_action())  # open the goal product
    _, reward, terminated, _, info = env.step("click[buy now]")  # without choosing its options
    assert terminated and 0.0 < info["task_score"] < 1.0
    assert (reward, info["won"]) == (0.0, False)
    original = WebShopEnv(shared=generated)
    assert _play_expert(original, seed=2)[0] == 1.0


def test_html_observation_mode(data_dir, tmp_path):
    env = WebShopEnv(data_dir=str(data_dir), cache_dir=str(tmp_path / "cache"), split="test", observation_mode="html")
    obs, _ = env.reset(seed=0)
    assert obs.startswith("<!DOCTYPE html>") and 'id="search_input"' in obs
    obs, *_ = env.step("search[shampoo]")
    assert 'value="click[b000shamp1]"' in obs and "Next &gt;" in obs
    env.step("click[b000shamp1]")
    obs, *_ = env.step("click[buy now]")
    # People see the thank-you line and the score; the original's hidden debug block is not in the HTML.
    assert "Thank you for shopping with us!" in obs and "Your score (min 0.0, max 1.0)" in obs
    assert "instuction text" not in obs


def test_goal_kinds_switch(data_dir, tmp_path):
    cache = str(tmp_path / "cache")
    human = WebShopEnv(data_dir=str(data_dir), cache_dir=cache, split="test", goals="human")
    synthetic = WebShopEnv(data_dir=str(data_dir), cache_dir=cache, split="test", goals="synthetic")
    auto = WebShopEnv(data_dir=str(data_dir), cache_dir=cache, split="test")
    assert human.resource.folder != synthetic.resource.folder
    assert all(isinstance(g["goal_options"], list) for g in human.resource.goals)
    synthetic_goals = list(synthetic.resource.goals)
    # One synthetic goal per option combination of the one product with an instruction (2 sizes x 2 scents).
    assert [g["goal_options"] for g in synthetic_goals] == [
        {"scent": s, "size": z} for s in ("lavender", "citrus | mint") for z in ("8 fl oz", "16 fl oz")]
    assert synthetic_goals[0]["instruction_text"].startswith("i need a sulfate free shampoo with scent: lavender, "
                                                             "and size: 8 fl oz")
    assert [g["goal_options"] for g in auto.resource.goals] == [g["goal_options"] for g in human.resource.goals]
    (data_dir / "items_human_ins.json").unlink()
    with pytest.raises(FileNotFoundError, match="items_human_ins.json"):
        WebShopEnv(data_dir=str(data_dir), cache_dir=str(tmp_path / "other"), goals="human")


def test_generated_human_goals_list_their_values(tmp_path):
    env = WebShopEnv(num_products=60, seed=1, cache_dir=str(tmp_path), goals="human")
    goal = env.resource.goals[0]
    assert isinstance(goal["goal_options"], list) and " with " not in goal["instruction_text"]
    assert all(value in goal["instruction_text"] for value in goal["goal_options"])
    assert _play_expert(env, seed=0)[0] == 1.0
