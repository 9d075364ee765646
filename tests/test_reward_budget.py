"""WebShop's score and the GUI's success check under the hard budget of `agentrl.budget` (issue 38, item 2).

A scorer or checker that holds the GIL is killed at the budget; the purchase or episode counts as failed and is
flagged (``grade_budget_exceeded``, ``grade_refused``); the env serves the next episode. Scores and checks computed
in a worker equal the in-process ones exactly, over many (goal, product, options) triples and episodes. The worker
reads the catalogue's stored title nouns (it never loads spaCy), and the budget is the operator's setting: no client
can set it.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time

import pytest

from agentrl import budget
from agentrl.envs.gui import GuiEnv
from agentrl.envs.gui import env as gui_env_module
from agentrl.envs.gui.tasks import TASK_TYPES
from agentrl.envs.webshop import WebShopEnv
from agentrl.envs.webshop import env as webshop_env_module
from agentrl.envs.webshop.env import _scoring_record
from agentrl.envs.webshop.reward import GOAL_FIELDS, PRODUCT_FIELDS, score_breakdown

BUDGET_S = 1.0
MARGIN_S = 1.5  # the kill, and a loaded 2-core machine


def spin_score(goal, product, options, tagger="auto"):
    """A scorer that holds the GIL in one C call for ~20 s (a big-integer power), whatever it is given."""
    pow(9, 4 * 9**7)
    return score_breakdown(goal, product, options, tagger)


def spin_check(task, state, answer):
    """A success check that holds the GIL in one C call for ~20 s."""
    pow(9, 4 * 9**7)
    return task.check(state, answer)


def _loaded(names: tuple[str, ...]) -> list[str]:
    """Which of `names` the calling process has imported (run in a worker)."""
    return [name for name in names if name in sys.modules]


@pytest.fixture(scope="module")
def webshop():
    env = WebShopEnv(num_products=300, reward_budget_s=BUDGET_S)
    yield env
    env.close()


def _play_expert(env) -> tuple[float, dict]:
    env.reset(seed=0)
    for _ in range(env.max_steps):
        _, reward, terminated, truncated, info = env.step(env.expert_action())
        if terminated or truncated:
            return reward, info
    raise AssertionError("the expert did not finish")


# ----------------------------------------------------------------------------------------------------- WebShop
def test_a_webshop_score_past_the_budget_is_killed_scored_zero_flagged_and_the_env_serves_on(webshop, monkeypatch):
    reward, info = _play_expert(webshop)  # a worker is up, and a normal purchase is flagged False
    assert reward == 1.0 and info["grade_budget_exceeded"] is False and "grade_refused" not in info
    before = set(budget.default_pool().pids)
    monkeypatch.setattr(webshop_env_module, "score_breakdown", spin_score)
    webshop.reset(seed=0)
    action = webshop.expert_action()
    while action != "click[buy now]":
        webshop.step(action)
        action = webshop.expert_action()
    started = time.monotonic()
    obs, reward, terminated, truncated, info = webshop.step(action)
    assert time.monotonic() - started < BUDGET_S + MARGIN_S  # not the ~20 s the scorer would hold the GIL
    assert (reward, terminated, truncated) == (0.0, True, False)  # a failed purchase, ending the episode
    assert info["grade_budget_exceeded"] is True and "budget" in info["grade_refused"]
    assert info["page"] == "done" and info["score"] == 0.0 and info["success"] is False
    assert before - set(budget.default_pool().pids)  # the worker that ran it was killed (a fresh one replaces it)
    monkeypatch.undo()
    reward, info = _play_expert(webshop)  # the next episode is served and scored as usual
    assert reward == 1.0 and info["grade_budget_exceeded"] is False


def test_webshop_scores_in_the_worker_equal_the_in_process_scores_exactly(webshop):
    rng = random.Random(0)
    goals, products = webshop.resource.goals, webshop.resource.products
    triples = []
    for goal in (goals[i] for i in rng.sample(range(len(goals)), 40)):
        # The same goal as a human-written one: its options a list of values, scored as values.
        human = dict(goal, goal_options=list(goal["goal_options"].values()))
        for bought in [products[goal["product_index"]]] + [products[i] for i in rng.sample(range(len(products)), 12)]:
            options = {name: rng.choice(values) for name, values in (bought.get("options") or {}).items() if values}
            triples += [(goal, bought, options), (human, bought, options)]
    assert len(triples) > 1000
    for tagger in ("auto", "heuristic"):  # the catalogue's stored nouns, and nouns tagged here for the worker
        for goal, product, options in triples:
            here = score_breakdown(goal, product, options, tagger)
            there = budget.run_with_budget(
                score_breakdown, _scoring_record(goal, GOAL_FIELDS, tagger),
                _scoring_record(product, PRODUCT_FIELDS, tagger), options, tagger, budget_s=5.0,
            )
            assert there == here and there.total.hex() == here.total.hex()
    # The worker scored from stored nouns: it never imported spaCy.
    assert budget.run_with_budget(_loaded, ("spacy",), budget_s=5.0) == []


def test_webshop_episodes_reward_the_same_with_and_without_the_budget(webshop):
    here = WebShopEnv(shared=webshop.resource, reward_budget_s=None)
    rng = random.Random(1)
    bought = set()
    for seed in range(25):
        for env in (webshop, here):
            env.reset(seed=seed)
        for _ in range(15):  # the same random walk through both: clicks, option picks, buys
            actions = webshop.admissible_actions()
            assert actions == here.admissible_actions()
            choice = rng.choice([a for a in actions if a != "search[<query>]"] or ["search[shampoo]"])
            if webshop.page.name == "start":
                choice = f"search[{webshop.instruction}]"
            a, b = webshop.step(choice), here.step(choice)
            assert a[1:4] == b[1:4] and a[4].get("score_parts") == b[4].get("score_parts")
            assert a[4].get("grade_budget_exceeded") == b[4].get("grade_budget_exceeded")
            if a[2]:
                bought.add(a[1])
            if a[2] or a[3]:
                break
    assert len(bought) >= 3  # purchases of different scores were compared, not only walks that never bought


def test_the_budget_is_the_operators_and_is_validated():
    assert "reward_budget_s" not in WebShopEnv.client_settings
    assert "reward_budget_s" not in GuiEnv.client_settings
    for bad in (0, -1.0, float("inf"), float("nan"), True, "5"):
        with pytest.raises(ValueError, match="reward_budget_s"):
            GuiEnv(reward_budget_s=bad, screenshots=False)


def test_a_webshop_only_process_preloads_only_the_scorer():
    # The math env's preloads (sympy, math-verify) must not reach the workers of a process that never imports it.
    code = (
        "from agentrl import budget\n"
        "from agentrl.envs.webshop import WebShopEnv\n"
        "env = WebShopEnv(num_products=300)\n"
        "env.reset(seed=0)\n"
        "while not env.step(env.expert_action())[2]: pass\n"
        "import sys\n"
        "print(budget._default_preload, budget.run_with_budget(eval, \"sorted(m for m in ('sympy', 'spacy', "
        "'bm25s', 'math_verify') if m in __import__('sys').modules)\", budget_s=5.0))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "['agentrl.envs.webshop.reward'] []"


# --------------------------------------------------------------------------------------------------------- GUI
def _final_step(env, seed: int, rng: random.Random | None) -> tuple[float, dict]:
    """Play an episode: the expert's actions, or (with `rng`) random ones mixed in; the last step's reward, info."""
    env.reset(seed=seed)
    for _ in range(env.max_steps):
        action = env.expert_action()
        if rng is not None and rng.random() < 0.4:
            action = rng.choice(['tap(3)', 'back()', 'scroll("down")', 'type("555-123-4567")', 'answer("555 0101")',
                                 'finish()', 'type("see you at 5")', 'tap(7)'])
        _, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return reward, info
    raise AssertionError("the episode did not end")


def test_a_gui_check_past_the_budget_is_killed_failed_flagged_and_the_env_serves_on(monkeypatch):
    env = GuiEnv(screenshots=False, reward_budget_s=BUDGET_S)
    reward, info = _final_step(env, 0, None)
    assert reward == 1.0 and info["grade_budget_exceeded"] is False and "grade_refused" not in info
    monkeypatch.setattr(gui_env_module, "check_task", spin_check)
    started = time.monotonic()
    reward, info = _final_step(env, 0, None)
    assert time.monotonic() - started < BUDGET_S + MARGIN_S
    assert reward == 0.0 and info["success"] is False
    assert info["grade_budget_exceeded"] is True and "budget" in info["grade_refused"]
    monkeypatch.undo()
    reward, info = _final_step(env, 1, None)
    assert reward == 1.0 and info["grade_budget_exceeded"] is False


def test_gui_checks_in_the_worker_equal_the_in_process_checks():
    budgeted = GuiEnv(screenshots=False, max_steps=12)
    here = GuiEnv(screenshots=False, max_steps=12, reward_budget_s=None)
    outcomes = set()
    for seed in range(40):
        for rng_seed in (None, seed):
            a = _final_step(budgeted, seed, None if rng_seed is None else random.Random(rng_seed))
            b = _final_step(here, seed, None if rng_seed is None else random.Random(rng_seed))
            assert a[0] == b[0] and a[1]["success"] == b[1]["success"] and a[1]["task_type"] == b[1]["task_type"]
            assert a[1]["grade_budget_exceeded"] is False and b[1]["grade_budget_exceeded"] is False
            outcomes.add((a[1]["task_type"], a[0]))
    assert {t for t, _ in outcomes} == set(TASK_TYPES) and {r for _, r in outcomes} == {0.0, 1.0}
