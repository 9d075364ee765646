"""The environment contract: `TextEnv`, a Gymnasium env whose observations and actions are text.

Everything agentrl trains on is a `TextEnv`. The contract is Gymnasium's, narrowed to strings:

    obs, info = env.reset(seed=0)
    while True:
        obs, reward, terminated, truncated, info = env.step(action_text)
        if terminated or truncated:
            break

`terminated` means the task itself ended (solved, or failed for good: a wrong purchase, a final wrong answer).
`truncated` means a budget ran out (turns, steps). They stay apart because they mean different things for
advantages and for evaluation: a truncated episode did not fail the task, it ran out of time.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import gymnasium as gym
from gymnasium import spaces

from agentrl.envs.client_settings import ClientSetting, ClientSettingError, check_client_settings, check_reset_options
from agentrl.envs.difficulty import Difficulty

__all__ = ["TextEnv", "TextSpace", "SharedResource", "ClientSetting", "ClientSettingError", "check_client_settings",
           "check_reset_options", "Difficulty"]


class TextSpace(spaces.Text):
    """A space of arbitrary Python strings up to `max_length` characters.

    Gymnasium's `Text` space only contains strings drawn from a fixed charset; real observations hold any
    character (prices, accents, newlines). `sample()` still draws from printable ASCII, which is exactly the
    kind of junk action an env must survive.
    """

    def __init__(self, max_length: int = 100_000, seed: int | None = None):
        super().__init__(max_length=max_length, min_length=0, charset=string.printable, seed=seed)

    def contains(self, x: Any) -> bool:
        """True for any `str` no longer than `max_length`."""
        return isinstance(x, str) and len(x) <= self.max_length


class SharedResource:
    """Marker base for heavy read-only state that every env on a node should share (see `TextEnv.shared`).

    Subclasses implement `build(**env_kwargs)`, a classmethod that loads the state once (a catalogue, an index,
    a dataset). The runner pool builds it once per node and passes the same object to every env it creates,
    via the env's `shared=` constructor argument. Envs created directly with `make()` build their own.
    """

    @classmethod
    def build(cls, **env_kwargs: Any) -> SharedResource:
        """Load the shared state for envs created with `env_kwargs`."""
        raise NotImplementedError


class TextEnv(gym.Env[str, str]):
    """A multi-turn text environment: observations and actions are `str`.

    Subclasses implement `reset`, `step` and `expert_action`, and set `system_prompt`.

    Contract:
        * `reset(*, seed=None, options=None) -> (obs, info)`. The same seed gives the same episode, always:
          draw every random choice from `self.np_random` after calling `super().reset(seed=seed)`.
        * `step(action) -> (obs, reward, terminated, truncated, info)`. `action` is the raw text the agent
          produced. An action the env cannot parse must not raise: return an observation saying what was wrong,
          reward 0, and let the episode go on (count it against the step budget).
        * `info` keys (all optional except where said):
            - `"success"` (bool): required on the step that ends the episode (`terminated or truncated`).
            - `"admissible_actions"` (list[str]): the actions valid now, where the env can enumerate them.
            - `"image"` (PIL.Image.Image): a rendering of the state, for multimodal agents.
            - `"task_type"` (str): a category for evaluation breakdowns (math level, ALFWorld task type).
            - `"tools"` (list[dict], at reset): JSON-schema tool declarations. The env then receives each reply's
              function call as ``{"name": ..., "arguments": ...}`` JSON and its observations are sent as tool
              results (`agentrl.chat.context.ChatContext.first_prompt`).
        * `expert_action() -> str`: a gold next action from the current state. Playing it repeatedly from
          `reset` solves the task, so tasks and rewards can be checked without a model.
        * `system_prompt`: what an LLM agent is told about the task format and the action syntax.
        * `rollout_defaults` (optional): context-layout hints for runs, e.g. ``{"observation_role": "tool"}`` when
          observations are results of the agent's actions (see `agentrl.chat.layout`).
        * `max_episode_steps` (optional): the most steps an episode can take when the env fixes it (1 for a
          single-turn env). Runs size the engines' KV memory by it: a single-turn episode never grows past its first
          prompt and one reply.
        * `difficulty_levels` (optional): a `Difficulty` naming the env's levels, easiest first, for curricula
          (`agentrl.curriculum`). Its `Difficulty.split` reads the level a reset seed asks for (None for
          the plain seeds every run without a curriculum uses); `reset` then draws the task at that level.

    Rewards: a reward that a reply's text can make slow (symbolic math, big numbers, regexes) should run under a hard
    budget so a hostile reply cannot freeze the runner or a served env: ``reward = run_with_budget(my_reward, action,
    gold, budget_s=2.0)`` (`agentrl.budget`; ``my_reward`` module-level), counting `BudgetExceeded` as a wrong answer.

    Threading: runner pools may step several envs of one process from a thread pool. An env whose state belongs to
    one thread (Playwright's sync API) sets ``metadata["single_thread"] = True`` and all envs of its class in a
    process are then stepped from a single thread.

    Shared state: an env whose construction is expensive (a product catalogue, a search index) sets the class
    attribute `shared` to a `SharedResource` subclass and accepts `shared=` in `__init__`; runner pools then
    build it once per node and hand the same object to every env.

    Client settings: `client_settings` names the constructor arguments that a client of a served env
    (`agentrl env serve`) may set per session, each a `ClientSetting` (plain type, bounded values): ``split``,
    ``level``, ``max_turns``, ... Everything else, above all anything the process would import, read or write
    (``module:function`` names, paths, URLs, cache folders), only the operator sets. Empty by default: a client
    may set nothing. `check_client_settings` applies the declaration. `client_reset_options` does the same for the
    ``options`` a client may pass to `reset` (empty by default: a served env is reset with no options).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    observation_space: spaces.Space = TextSpace()
    action_space: spaces.Space = TextSpace(max_length=10_000)
    system_prompt: ClassVar[str] = "You are an agent acting in a text environment. Reply with one action."
    shared: ClassVar[type[SharedResource] | None] = None
    rollout_defaults: ClassVar[dict[str, Any]] = {}
    client_settings: ClassVar[Mapping[str, ClientSetting]] = MappingProxyType({})
    client_reset_options: ClassVar[Mapping[str, ClientSetting]] = MappingProxyType({})
    max_episode_steps: int | None = None
    difficulty_levels: ClassVar[Difficulty | None] = None
    difficulty_narrowed_by: ClassVar[str | None] = None
    """The constructor argument that restricts which levels the env plays (the GUI's and ALFWorld's ``task_types``),
    or None: `difficulty_for` narrows `difficulty_levels` to its value."""

    @classmethod
    def difficulty_for(cls, kwargs: Mapping[str, Any]) -> Difficulty | None:
        """The levels an env built with `kwargs` plays: `difficulty_levels`, narrowed by `difficulty_narrowed_by`.

        Narrowed to the value of the argument `difficulty_narrowed_by` names when given (a run on three GUI task types
        has those three levels, so its curriculum never draws a type the run's settings exclude). The env reads a
        level seed against the same narrowed levels (its instance calls this with its own arguments).

        Raises:
            ValueError: the argument names a level the env does not have (the message starts with its name).
        """
        levels, key = cls.difficulty_levels, cls.difficulty_narrowed_by
        if levels is None or key is None or not kwargs.get(key):
            return levels
        value = kwargs[key]
        try:
            return levels.only([value] if isinstance(value, str) else list(value))
        except ValueError as e:
            raise ValueError(f"{key}: {e}") from None

    # reset(*, seed=None, options=None) -> (obs, info) is gymnasium's: subclasses call
    # `super().reset(seed=seed)` first (it seeds `self.np_random`), then build the episode from `self.np_random`.

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply one text action and return `(obs, reward, terminated, truncated, info)`."""
        raise NotImplementedError

    def expert_action(self) -> str:
        """Return a gold next action for the current state (no model needed)."""
        raise NotImplementedError
