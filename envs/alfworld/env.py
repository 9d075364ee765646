"""`AlfworldEnv`: ALFWorld's household text games as an agentrl `TextEnv`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from agentrl.envs.alfworld.catalogue import load_catalogue
from agentrl.envs.alfworld.engine import GRAMMARS, actions, goal_reached, intro, perform
from agentrl.envs.alfworld.expert import expert_action, observe
from agentrl.envs.alfworld.generator import SPLITS, generate_game
from agentrl.envs.alfworld.textworld_engine import TextWorldGame
from agentrl.envs.alfworld.world import TASK_TYPES, Game, load_game, save_game
from agentrl.envs.core import ClientSetting, Difficulty, TextEnv

__all__ = ["AlfworldEnv"]

_SYSTEM_PROMPT_04 = (
    "You are an agent in a household, playing a text game. Complete the task given in the first observation.\n"
    "Each turn, reply with exactly one command, for example:\n"
    "  go to cabinet 1 | open cabinet 1 | close cabinet 1 | take mug 1 from cabinet 1 | move mug 1 to countertop 1\n"
    "  heat mug 1 with microwave 1 | cool mug 1 with fridge 1 | clean mug 1 with sinkbasin 1 | use desklamp 1\n"
    "  examine mug 1 | inventory | look | help\n"
    'A command that is not possible right now answers "Nothing happens."'
)
_SYSTEM_PROMPT_LEGACY = _SYSTEM_PROMPT_04.replace("move mug 1 to countertop 1", "put mug 1 in/on countertop 1").replace(
    " | help", ""
)


class AlfworldEnv(TextEnv):
    """ALFWorld: household tasks (find, clean, heat, cool, examine, place objects) in text, six task types.

    A faithful reimplementation of ALFWorld's TextWorld engine (the `alfred.pddl` rules and `alfred.twl2` text)
    over seeded, generated rooms; or, with the optional extra installed, the original engine on `.tw-pddl` files.
    Reward is 1 on the step the goal holds, which terminates the episode; running out of steps truncates it.

    Args:
        split: which games `reset(seed)` draws: ``"train"``, ``"valid_seen"`` (new rooms, task combinations seen
            in training) or ``"valid_unseen"`` (object/target combinations held out of training).
        grammar: ``"0.4"`` (default) or ``"legacy"``. The default is the grammar of the current ALFWorld release
            (0.4.x: ``move X to Y``, ``help``, "You arrive at cabinet 1."), the only one the pinned real engine
            ships, so both engines agree out of the box. ``"legacy"`` is ALFWorld <= 0.3.5 (``put X in/on Y``,
            "You arrive at loc 12."), which ReAct-era prompts and most published results use: pick it to compare
            with those numbers.
        max_steps: step budget per episode (ALFWorld's is 50); every step counts, inadmissible ones included.
        game_file: play this one game at every reset instead of generating: a JSON file saved by `save_game`
            (replays a run exactly), or an ALFWorld ``.tw-pddl`` file (needs the real-engine extra).
        task_types: generate only these task types (default: all six, uniformly).

    Info keys: ``admissible_actions`` (sorted), ``task_type``, ``won``, ``goal`` (the task sentence),
    ``game_seed`` (the generator seed, ``None`` for files), and ``success`` once the episode ends.

    Difficulty (`difficulty_levels`, for curricula): the six task types, ordered by the mean length of the expert's
    solution over 30 generated train games each (5.8 steps for look_at_obj_in_light up to 11.5 for
    pick_cool_then_place_in_recep), narrowed to ``task_types`` when given (`difficulty_for`): a seed that asks for a
    level generates a game of that type. A fixed game (``game_file``) plays as always. The step budget is the other
    axis of difficulty: the ``horizon`` curriculum grows the run's ``env.max_turns`` over training.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    system_prompt: ClassVar[str] = _SYSTEM_PROMPT_04
    # Observations answer the agent's commands: as tool results they keep Qwen3's token prefix, so a 50-step episode
    # trains as one sample, not 50 (see agentrl.chat.layout).
    rollout_defaults: ClassVar[dict[str, Any]] = {"observation_role": "tool"}
    difficulty_levels: ClassVar[Difficulty | None] = Difficulty(
        ("look_at_obj_in_light", "pick_and_place_simple", "pick_clean_then_place_in_recep",
         "pick_heat_then_place_in_recep", "pick_two_obj_and_place", "pick_cool_then_place_in_recep"),
        "the task type, ordered by the length of the expert's solution")
    difficulty_narrowed_by: ClassVar[str | None] = "task_types"
    # What a client of a served ALFWorld may set per session: data only; `game_file` (a file the server would read)
    # is the operator's, set with --env-arg. `task_types` takes one type from a client (a list only from the operator).
    client_settings: ClassVar[Mapping[str, ClientSetting]] = {
        "split": ClientSetting(str, "which games reset draws", choices=SPLITS),
        "grammar": ClientSetting(str, "ALFWorld 0.4 or legacy (<= 0.3.5) commands and text", choices=tuple(GRAMMARS)),
        "max_steps": ClientSetting(int, "step budget per episode", min=1, max=200),
        "task_types": ClientSetting(str, "generate only this task type", choices=TASK_TYPES),
    }

    def __init__(
        self,
        split: str = "train",
        grammar: str = "0.4",
        max_steps: int = 50,
        game_file: str | Path | None = None,
        task_types: Sequence[str] | None = None,
    ):
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        if grammar not in GRAMMARS:
            raise ValueError(f"unknown grammar {grammar!r}; expected one of {', '.join(GRAMMARS)}")
        if not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
        if isinstance(task_types, str):  # one type given bare (--env-arg task_types=pick_and_place_simple)
            task_types = [task_types]
        self.task_types = tuple(TASK_TYPES if task_types is None else task_types)
        bad = [t for t in self.task_types if t not in TASK_TYPES]
        if bad or not self.task_types:
            raise ValueError(f"unknown task_types {bad or '(empty)'}; expected a subset of {', '.join(TASK_TYPES)}")
        self.levels = self.difficulty_for({"task_types": self.task_types})
        self.split = split
        self.grammar = GRAMMARS[grammar]
        self.max_steps = max_steps
        self.system_prompt = _SYSTEM_PROMPT_04 if grammar == "0.4" else _SYSTEM_PROMPT_LEGACY
        self._catalogue = load_catalogue()
        self._fixed_game: Game | None = None
        self._real: TextWorldGame | None = None
        if game_file is not None:
            if str(game_file).endswith(".tw-pddl"):
                if grammar != "0.4":
                    raise ValueError("a .tw-pddl file carries its own grammar; leave grammar at '0.4'")
                self._real = TextWorldGame(game_file)
            else:
                self._fixed_game = load_game(game_file)
        self.game: Game | None = None
        self._state = None
        self._seen: dict[str, tuple[str, ...]] = {}
        self._actions: dict = {}
        self._admissible: list[str] = []
        self._won = False
        self._steps = 0

    # -- episode --------------------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode: a generated game drawn with `seed` (or the fixed `game_file`).

        `options` may hold ``{"game": Game}`` to play a given game once (e.g. one from `generate_game`).
        """
        super().reset(seed=seed)
        self._steps = 0
        if self._real is not None:
            obs, self._admissible, self._won = self._real.reset()
            return obs, self._info()
        game = (options or {}).get("game") or self._fixed_game
        if game is None:
            level, _ = self.levels.split(seed)
            game_seed = int(self.np_random.integers(2**31 - 1))
            types = self.task_types if level is None else (level,)
            game = generate_game(game_seed, self.split, types, catalogue=self._catalogue)
        if not isinstance(game, Game):
            raise TypeError(f"options['game'] must be an ALFWorld Game, got {type(game).__name__}")
        self.game, self._state = game, game.initial
        self._seen = observe(game, game.initial, {})
        self._refresh()
        return intro(game, game.initial), self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play one command; anything that is not an admissible command answers "Nothing happens."."""
        if self._state is None and self._real is None:
            raise RuntimeError("call reset() before step()")
        command = action.strip() if isinstance(action, str) else ""
        self._steps += 1
        if self._real is not None:
            obs, self._admissible, self._won = self._real.step(command)
        else:
            chosen = self._actions.get(command)
            if chosen is None:
                obs = "Nothing happens."
            else:
                self._state, obs = perform(self.game, self._state, chosen, self.grammar)
                self._seen = observe(self.game, self._state, self._seen)
                self._refresh()
        terminated = self._won
        truncated = not terminated and self._steps >= self.max_steps
        info = self._info()
        if terminated or truncated:
            info["success"] = terminated
        return obs, float(terminated), terminated, truncated, info

    def expert_action(self) -> str:
        """A gold next command planned from the current state and what the agent has seen so far."""
        if self._real is not None:
            return self._real.expert_action()
        if self._state is None:
            raise RuntimeError("call reset() before expert_action()")
        return expert_action(self.game, self._state, self._seen, self._catalogue, self.grammar)

    # -- helpers ----------------------------------------------------------------------------------------------

    def save_game(self, path: str | Path) -> Path:
        """Save the current game as JSON; `AlfworldEnv(game_file=path)` replays it exactly."""
        if self.game is None:
            raise RuntimeError("no game to save: call reset() first (a .tw-pddl game is already a file)")
        return save_game(self.game, path)

    def _refresh(self) -> None:
        self._actions = actions(self.game, self._state, self.grammar)
        self._admissible = sorted(self._actions)
        self._won = goal_reached(self.game, self._state)

    def _info(self) -> dict[str, Any]:
        if self._real is not None:
            return {
                "admissible_actions": list(self._admissible),
                "task_type": self._real.task_type,
                "won": self._won,
                "goal": None,
                "game_seed": None,
            }
        return {
            "admissible_actions": list(self._admissible),
            "task_type": self.game.goal.task_type,
            "won": self._won,
            "goal": self.game.goal.text,
            "game_seed": self.game.seed,
        }
