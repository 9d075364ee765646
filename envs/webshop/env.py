r"""`WebShopEnv`: find and buy the product an instruction asks for in a simulated web shop (Yao et al., 2022).

    obs, info = env.reset(seed=0)        # "WebShop [SEP] Instruction: [SEP] i need a ... [SEP] Search"
    obs, r, terminated, truncated, info = env.step("search[sulfate free shampoo]")
    obs, r, terminated, truncated, info = env.step("click[b0abc12345]")
    ...                                   # click option values, then "click[buy now]": r = score, terminated

Actions are ``search[keywords]`` (accepted on every page) and ``click[text]`` naming one of the page's clickables,
parsed with the original's ``(.+)\\[(.+)\\]`` and lowercased. Anything else is a no-op: the page stays as it was,
reward 0 (``info["error"]`` says why), and the step counts against `max_steps`. ``click[buy now]`` scores the
purchase with `score` and ends the episode.

The score is computed under a hard budget (``reward_budget_s``, 5 s by default): in a worker process of
`agentrl.budget` that is killed past the budget, so no purchase can freeze the process that steps the env (a served
env's other sessions, a runner's rollout loop) whatever the scorer does with it. The worker gets only the fields the
score reads, with the title nouns the catalogue tagged (it never loads spaCy), and returns the same floats as scoring
in this process. A purchase whose scoring hits the budget scores 0 (a failed purchase) and ends the episode as any
purchase does; the buying step's ``info`` then has ``grade_budget_exceeded`` True and ``grade_refused`` saying why
(``grade_budget_exceeded`` is False on every other buying step), as `MathEnv` reports its grades.

Reward conventions (``reward_convention``):

* ``"original"`` (default): the step that buys returns the score in [0, 1]; every other step returns 0.
* ``"verl-agent"``: as verl-agent's WebShop wrapper, so its prompts and reward shaping transfer: the buying step
  returns 10 when the score is exactly 1.0, else 0; ``info["task_score"]`` is the original's step reward and
  ``info["won"]`` says whether the episode ended with a perfect purchase (False on reset and every other step).

Every departure from princeton-nlp/WebShop is listed, with its reason, in ``envs/webshop/DEVIATIONS.md``.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from typing import Any, ClassVar

import gymnasium as gym

from agentrl import budget
from agentrl.envs.core import ClientSetting, TextEnv
from agentrl.envs.webshop.catalog import SPLITS
from agentrl.envs.webshop.pages import (
    RESULTS_PER_PAGE,
    SUB_PAGES,
    Page,
    done_page,
    item_page,
    render_html,
    render_text,
    render_text_rich,
    results_page,
    start_page,
    sub_page,
)
from agentrl.envs.webshop.reward import (
    GOAL_FIELDS,
    NOUN_FIELDS,
    NOUN_TAGGERS,
    PRODUCT_FIELDS,
    ScoreBreakdown,
    record_nouns,
    require_spacy,
    score_breakdown,
)
from agentrl.envs.webshop.search import TOP_N
from agentrl.envs.webshop.shared import WebShopResource

__all__ = ["GOAL_KINDS", "OBSERVATION_MODES", "REWARD_CONVENTIONS", "WebShopEnv"]

OBSERVATION_MODES = ("text", "text_rich", "html")
REWARD_CONVENTIONS = ("original", "verl-agent")
GOAL_KINDS = ("auto", "human", "synthetic")
HTML_ACTION_URL = "/step"
"""Where the buttons of ``html`` observations post their action (the `server` serves the same pages there)."""
VERL_AGENT_WIN_REWARD = 10.0
_ACTION = re.compile(r"(.+)\[(.+)\]")
DEFAULT_REWARD_BUDGET_S = 5.0
"""Seconds one purchase's scoring may take in its worker process before it is killed and scored 0."""

_logger = logging.getLogger(__name__)

SYSTEM_PROMPT = """You are shopping in WebShop for the product the instruction describes.
Each turn, reply with exactly one action:
- search[keywords]  to search the catalogue (for example: search[sulfate free shampoo for dry hair])
- click[text]       to click a button, a product ID, or an option value shown on the page
                    (for example: click[b0abc12345], click[large], click[buy now], click[next >], click[< prev])
Buttons and product IDs are separated by [SEP] in the page. Choose the product's options before you click
[buy now]; buying ends the episode and scores how well the product, its options and its price match."""


class WebShopEnv(TextEnv):
    """WebShop: search a product catalogue and buy the item an instruction describes (text observations).

    Args:
        num_products: size of the generated catalogue (default 1000); with `data_dir`, how many of the original
            products to load (default all).
        seed: the generated catalogue's seed (not the episode seed: that is `reset(seed=...)`).
        split: which goals episodes draw from: "train", "eval" or "test".
        data_dir: a folder with the original files (``items_shuffle*.json``, ``items_ins_v2*.json``, optionally
            ``items_human_ins.json``); when given they are loaded instead of generating a catalogue.
        observation_mode: "text" (``[SEP]``-joined), "text_rich" (buttons marked ``[button] ... [button_]``) or
            "html" (the page as an HTML document whose buttons post their ``click[...]`` action).
        max_steps: steps before the episode is truncated.
        search_mode: "bm25", "dense" or "hybrid".
        cache_dir: root of the on-disk cache (default ``$AGENTRL_CACHE/webshop`` or ``~/.cache/agentrl/webshop``).
        goals: "synthetic" (one goal per option combination, options scored as (name, value) pairs), "human"
            (the human-written instructions, options scored as values), or "auto": human when the data folder has
            ``items_human_ins.json``, synthetic otherwise (always synthetic for generated catalogues).
        reward_convention: "original" or "verl-agent" (see the module docstring).
        noun_tagger: title nouns for the type score: "auto" (spaCy when installed), "spacy" or "heuristic".
        shared: a `WebShopResource` already opened for these kwargs (runner pools pass one to every env).
        reward_budget_s: the most seconds scoring one purchase may take, in a worker process that is killed past it
            (`agentrl.budget`); such a purchase scores 0 and the step's ``info`` has ``grade_budget_exceeded`` True.
            None scores in this process, without the budget (trusted use only). The operator's setting: a client of
            a served env cannot set it.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"]}
    system_prompt: ClassVar[str] = SYSTEM_PROMPT
    # Pages answer the agent's clicks and searches: as tool results they keep Qwen3's token prefix, so an episode
    # trains as one sample, not one per step (see agentrl.chat.layout).
    rollout_defaults: ClassVar[dict[str, Any]] = {"observation_role": "tool"}
    shared: ClassVar[type[WebShopResource]] = WebShopResource
    # What a client of a served WebShop may set per session: data only. The catalogue (`num_products`, `seed`,
    # `data_dir`, `goals`), the index (`search_mode`, `cache_dir`: folders the server writes) and the noun tagger
    # (a spaCy model to load) are the operator's, set with --env-arg.
    client_settings: ClassVar[Mapping[str, ClientSetting]] = {
        "split": ClientSetting(str, "which goals episodes draw from", choices=SPLITS),
        "observation_mode": ClientSetting(str, "how pages are shown", choices=OBSERVATION_MODES),
        "max_steps": ClientSetting(int, "steps before the episode is truncated", min=1, max=100),
        "reward_convention": ClientSetting(str, "original (score in [0, 1]) or verl-agent (10 for a perfect buy)",
                                           choices=REWARD_CONVENTIONS),
    }
    client_reset_options: ClassVar[Mapping[str, ClientSetting]] = {
        "goal_index": ClientSetting(int, "play the split's i-th goal instead of drawing one", min=0, max=10**7),
    }

    def __init__(
        self,
        num_products: int | None = None,
        seed: int = 0,
        split: str = "train",
        data_dir: str | None = None,
        observation_mode: str = "text",
        max_steps: int = 15,
        search_mode: str = "bm25",
        cache_dir: str | None = None,
        goals: str = "auto",
        reward_convention: str = "original",
        noun_tagger: str = "auto",
        shared: WebShopResource | None = None,
        render_mode: str | None = None,
        reward_budget_s: float | None = DEFAULT_REWARD_BUDGET_S,
    ):
        if split not in SPLITS:
            raise ValueError(f"webshop: split must be one of {SPLITS}, got {split!r}")
        if observation_mode not in OBSERVATION_MODES:
            raise ValueError(f"webshop: observation_mode must be one of {OBSERVATION_MODES}, got {observation_mode!r}")
        if goals not in GOAL_KINDS:
            raise ValueError(f"webshop: goals must be one of {GOAL_KINDS}, got {goals!r}")
        if reward_convention not in REWARD_CONVENTIONS:
            raise ValueError(
                f"webshop: reward_convention must be one of {REWARD_CONVENTIONS}, got {reward_convention!r}")
        if noun_tagger != "auto" and noun_tagger not in NOUN_TAGGERS:
            raise ValueError(
                f"webshop: noun_tagger must be 'auto' or one of {sorted(NOUN_TAGGERS)}, got {noun_tagger!r}")
        if noun_tagger == "spacy":
            require_spacy()  # now, not at the first purchase: scoring may first need spaCy mid-run
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"webshop: max_steps must be >= 1, got {max_steps}")
        if reward_budget_s is not None and (isinstance(reward_budget_s, bool)
                                            or not isinstance(reward_budget_s, (int, float))
                                            or not 0 < reward_budget_s < math.inf):
            raise ValueError(
                f"webshop: reward_budget_s must be a positive number of seconds or None, got {reward_budget_s!r}")
        if shared is not None and not isinstance(shared, WebShopResource):
            raise TypeError(f"webshop: shared must be a WebShopResource, got {type(shared).__name__}")
        self.resource = shared if shared is not None else WebShopResource.build(
            num_products=num_products, seed=seed, data_dir=data_dir, search_mode=search_mode, cache_dir=cache_dir,
            goals=goals)
        self.searcher = self.resource.searcher_for(search_mode)
        self.goal_indices = self.resource.splits[split]
        if len(self.goal_indices) == 0:
            raise ValueError(f"webshop: split {split!r} has no goals in catalogue {self.resource.key}")
        self.split = split
        self.observation_mode = observation_mode
        self.reward_convention = reward_convention
        self.noun_tagger = noun_tagger
        self.max_steps = max_steps
        self.render_mode = render_mode
        self.reward_budget_s = reward_budget_s
        if reward_budget_s is not None:
            # Workers started from now on import the scorer's module up front, so a purchase costs a pipe round
            # trip, not an import inside its budget. Nothing more: the worker reads stored nouns (no spaCy).
            budget.preload(score_breakdown.__module__)
        self._refused: str | None = None  # why the last purchase's scoring was refused (its budget), or None
        self.goal: dict[str, Any] | None = None
        self._page = Page("start", ())

    # ----------------------------------------------------------------------------------------------- episode
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode on a goal of the split drawn from `seed`.

        Args:
            seed: the episode seed; the same seed gives the same goal.
            options: ``{"goal_index": i}`` picks the split's i-th goal instead of drawing one.
        """
        # TextEnv.reset is abstract (it raises), so seed np_random through gymnasium's base reset directly.
        gym.Env.reset(self, seed=seed)
        if options and "goal_index" in options:
            position = int(options["goal_index"])
            if not 0 <= position < len(self.goal_indices):
                raise ValueError(f"webshop: goal_index {position} out of range for {len(self.goal_indices)} goals")
        else:
            position = int(self.np_random.integers(len(self.goal_indices)))
        self.goal = self.resource.goals[int(self.goal_indices[position])]
        self.instruction = self.goal["instruction_text"]
        self.steps = 0
        self.done = False
        self.reward = 0.0
        self._go_start()
        info = self._info()
        if self.reward_convention == "verl-agent":
            info["won"] = False
        return self._observation(), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply a ``search[...]`` or ``click[...]`` action (see the module docstring)."""
        if self.goal is None:
            raise RuntimeError("webshop: call reset() before step()")
        if self.done:
            return self._observation(), 0.0, True, False, self._info(error="the episode is over; call reset()")
        self.steps += 1
        reward, error = 0.0, None
        action = action if isinstance(action, str) else repr(action)
        name, arg = self._parse(action)
        if name == "search" and arg:
            self._search(arg)
        elif name == "click" and arg in self._clickables and arg != "search":
            reward = self._click(arg)
        elif name in ("search", "click"):
            error = f"{action.strip()!r} names nothing clickable on this page"
        else:
            error = f"could not parse {action.strip()[:80]!r}; use search[...] or click[...]"
        truncated = not self.done and self.steps >= self.max_steps
        info = self._info(error=error)
        if self.done or truncated:
            info["success"] = self.done and self.reward >= 1.0 - 1e-9
        if name == "click" and arg == "buy now" and self.done:  # the buying step: say how its score was computed
            info["grade_budget_exceeded"] = self._refused is not None
            if self._refused is not None:
                info["grade_refused"] = self._refused
        if self.reward_convention == "verl-agent":
            info["task_score"] = reward
            info["won"] = self.done and reward == 1.0
            reward = VERL_AGENT_WIN_REWARD if info["won"] else 0.0
        return self._observation(), reward, self.done, truncated, info

    def render(self) -> str | None:
        """The current page as text (render_mode "ansi")."""
        return self._observation() if self.render_mode == "ansi" else None

    # ------------------------------------------------------------------------------------------- transitions
    @staticmethod
    def _parse(action: str) -> tuple[str, str | None]:
        match = _ACTION.match(action.strip())
        if match is None:
            return action.strip(), None
        return match.group(1), match.group(2).lower()

    def _go_start(self) -> None:
        self.keywords: str | None = None
        self.results: list[int] = []
        self.results_page_number = 1
        self.product_index: int | None = None
        self.chosen: dict[str, str] = {}
        self.visited: set[str] = set()
        self._show(start_page(self.instruction))

    def _search(self, keywords: str, page: int = 1) -> None:
        if keywords != self.keywords:
            self.results = self.searcher.search(keywords, k=TOP_N)
        self.keywords = keywords
        self.product_index = None
        self.chosen = {}
        self._show_results(page)

    def _show_results(self, page: int) -> None:
        self.results_page_number = page
        start = (page - 1) * RESULTS_PER_PAGE
        products = [self.resource.products[i] for i in self.results[start:start + RESULTS_PER_PAGE]]
        self._show(results_page(self.instruction, page, len(self.results), products, frozenset(self.visited)))

    def _show_item(self) -> None:
        assert self.product_index is not None
        self._product = self.resource.products[self.product_index]
        self._show(item_page(self.instruction, self._product, self.chosen))

    def _click(self, key: str) -> float:
        element = self._clickables[key]
        page = self._page.name
        if key == "buy now":
            breakdown, self._refused = self._score()
            total = breakdown.total if breakdown is not None else 0.0
            self.done, self.reward, self.breakdown = True, total, breakdown
            self._show(done_page(total, self._product["asin"], self.chosen))
            return total
        if key == "back to search":
            self._go_start()
        elif key == "next >" and page == "results":
            self._show_results(self.results_page_number + 1)
        elif key == "< prev" and page == "results":
            self._show_results(self.results_page_number - 1)
        elif key == "< prev" and page in SUB_PAGES:
            self._show_item()
        elif key == "< prev" and page == "item":
            self._search(self.keywords or "", self.results_page_number)
        elif key in SUB_PAGES:
            self._show(sub_page(self.instruction, self._product, key))
        elif element.kind == "link":
            position = (self.results_page_number - 1) * RESULTS_PER_PAGE
            on_page = self.results[position:position + RESULTS_PER_PAGE]
            self.product_index = next(i for i in on_page if self.resource.products[i]["asin"].lower() == key)
            self.visited.add(element.text)
            self._show_item()
        elif element.kind == "option":
            self.chosen[element.group] = element.text
            self._show_item()
        return 0.0

    def _score(self) -> tuple[ScoreBreakdown | None, str | None]:
        """Score the purchase: ``(breakdown, None)``, or ``(None, why)`` when scoring ran past its budget."""
        if self.reward_budget_s is None:
            return score_breakdown(self.goal, self._product, self.chosen, self.noun_tagger), None
        goal = _scoring_record(self.goal, GOAL_FIELDS, self.noun_tagger)
        product = _scoring_record(self._product, PRODUCT_FIELDS, self.noun_tagger)
        try:
            breakdown = budget.run_with_budget(score_breakdown, goal, product, dict(self.chosen), self.noun_tagger,
                                               budget_s=self.reward_budget_s)
        except budget.BudgetExceeded as e:
            _logger.warning("webshop: %s; the purchase scores 0", e)
            return None, f"scoring ran past its budget of {self.reward_budget_s:g} s"
        return breakdown, None

    def _show(self, page: Page) -> None:
        self._page = page
        self._clickables = page.clickables()

    # ------------------------------------------------------------------------------------------ observations
    def _observation(self) -> str:
        if self.observation_mode == "text":
            return render_text(self._page)
        if self.observation_mode == "text_rich":
            return render_text_rich(self._page)
        return render_html(self._page, HTML_ACTION_URL)

    def admissible_actions(self) -> list[str]:
        """The actions valid now: ``search[<query>]`` where the page has a search box, and each ``click[...]``."""
        actions = ["search[<query>]"] if self._page.name == "start" else []
        return actions + [f"click[{key}]" for key in self._clickables]

    def _info(self, error: str | None = None) -> dict[str, Any]:
        assert self.goal is not None
        info: dict[str, Any] = {
            "admissible_actions": self.admissible_actions(),
            "task_type": self.goal["category"],
            "page": self._page.name,
            "instruction": self.instruction,
            "steps": self.steps,
        }
        if error is not None:
            info["error"] = error
        if self.done:
            info["score"] = self.reward
            info["score_parts"] = self.breakdown  # None when scoring ran past its budget
            info["success"] = self.reward >= 1.0 - 1e-9
        return info

    @property
    def page(self) -> Page:
        """The current page (for renderers such as the HTML server)."""
        return self._page

    # ------------------------------------------------------------------------------------------------ expert
    def expert_action(self) -> str:
        """A gold next action: search the instruction, open the goal product, choose the goal options, buy.

        The expert searches with the instruction's own words first, as an agent can: its episodes are demonstrations
        a model can imitate from what it sees (on generated catalogues the product is on the first results page
        for about 19 goals in 20). When that search does not list the product in its top 50, it searches the
        product's title (which only the expert knows).
        """
        if self.goal is None:
            raise RuntimeError("webshop: call reset() before expert_action()")
        target = int(self.goal["product_index"])
        title_query = self.goal["name"].lower()
        instruction_query = self.instruction.lower()
        page = self._page.name
        if page == "done":
            return "click[buy now]"  # nothing left to do; a no-op here
        if page == "item" and self.product_index == target:
            for name, value in self._missing_goal_options():
                element = self._clickables.get(value)
                if element is not None and element.kind == "option" and element.group == name:
                    return f"click[{value}]"
            return "click[buy now]"
        if page == "results":
            position = (self.results_page_number - 1) * RESULTS_PER_PAGE
            if target in self.results[position:position + RESULTS_PER_PAGE]:
                return f"click[{self.resource.products[target]['asin'].lower()}]"
            if target in self.results and target not in self.results[:position]:
                return "click[next >]"
            if target in self.results:
                return "click[< prev]"
        return f"search[{title_query if self.keywords == instruction_query else instruction_query}]"

    def _missing_goal_options(self) -> list[tuple[str, str]]:
        goal_options = self.goal["goal_options"]
        options = self._product["options"]
        if isinstance(goal_options, dict):
            wanted = list(goal_options.items())
        else:  # human goals list values only: find the option each belongs to
            wanted = [(name, v) for v in goal_options for name, values in options.items() if v in values]
        return [(name, v) for name, v in wanted if name in options and self.chosen.get(name) != v]


def _scoring_record(record: Mapping[str, Any], fields: tuple[str, ...], tagger: str) -> dict[str, Any]:
    """What the budget worker needs of a goal or product: the fields the score reads and the title nouns.

    Only those fields travel (a pipe round trip, not the whole record with its reviews and images). The nouns are
    the ones `record_nouns` gives here (the catalogue's stored nouns; a tagger other than the catalogue's tags the
    catalogue's name here, as scoring in this process did), stored under `tagger` so that the worker reads them and
    never loads spaCy (~100 MB and seconds per worker, which a first purchase's budget would pay).
    """
    slim = {key: record[key] for key in fields if key in record}
    if "name" in record:
        slim[NOUN_FIELDS[0]], slim[NOUN_FIELDS[1]] = record_nouns(record, tagger), tagger
    return slim
