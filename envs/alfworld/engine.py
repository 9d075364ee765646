"""The ALFWorld rules and text: which commands are admissible, what each does, what the game says back.

This is a direct reimplementation of the TextWorld PDDL engine running ALFWorld's `alfred.pddl` domain with its
`alfred.twl2` grammar, for the subset of the domain the text games use. Every function is pure: it takes a `Game`
and a `State` and returns text or a new `State`.

Faithfulness notes (each checked against TextWorld 1.7.0 + alfworld 0.4.2, see tests/test_alfworld_textworld.py):
    * A command must equal an admissible command after stripping surrounding whitespace, else "Nothing happens."
      and the state does not change. Admissible commands are sorted and deduplicated.
    * `go to X` is not admissible for the receptacle the agent already faces.
    * `examine X` for an object is admissible only while holding it (the domain's other precondition branch,
      an object in an open receptacle here, never grounds in TextWorld).
    * Lists read "a X 1, a Y 2, and a Z 1" (the article is always "a", the last separator always ", and "), in
      the order of ALFWorld's entity ids: type ascending, then number descending.
    * `use` always answers "You turn on the X.": the grammar tests `isToggled`, which the domain never clears.
    * Heat, cool and clean need the object in hand at a microwave, fridge or sinkbasin; neither needs the door open.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from agentrl.envs.alfworld.world import Game, State

__all__ = [
    "Grammar",
    "GRAMMARS",
    "Action",
    "NOTHING_HAPPENS",
    "HELP_TEXT",
    "actions",
    "admissible_commands",
    "apply",
    "goal_reached",
    "intro",
    "look",
    "describe_receptacle",
]

NOTHING_HAPPENS = "Nothing happens."

HELP_TEXT = (
    "Available commands:\n"
    "  look:                             look around your current location\n"
    "  inventory:                        check your current inventory\n"
    "  go to (receptacle):               move to a receptacle\n"
    "  open (receptacle):                open a receptacle\n"
    "  close (receptacle):               close a receptacle\n"
    "  take (object) from (receptacle):  take an object from a receptacle\n"
    "  move (object) to (receptacle):  place an object in or on a receptacle\n"
    "  examine (something):              examine a receptacle or an object\n"
    "  use (object):                     use an object\n"
    "  heat (object) with (receptacle):  heat an object using a receptacle\n"
    "  clean (object) with (receptacle): clean an object using a receptacle\n"
    "  cool (object) with (receptacle):  cool an object using a receptacle\n"
    "  slice (object) with (object):     slice an object using a sharp object\n"
)
"""ALFWorld 0.4.x's `help` output as TextWorld prints it (its odd column alignment included)."""


@dataclass(frozen=True)
class Grammar:
    """The wording that differs between ALFWorld's two text grammars.

    Attributes:
        name: ``"0.4"`` (alfworld >= 0.4.0) or ``"legacy"`` (alfworld <= 0.3.5, used by ReAct-era prompts).
        put_command: the command template for placing the held object.
        put_feedback: what placing says.
        arrive_at_location: the legacy grammar says "You arrive at loc 12." instead of "You arrive at cabinet 1.".
        has_help: the `help` command exists only in 0.4.x.
    """

    name: str
    put_command: str
    put_feedback: str
    arrive_at_location: bool
    has_help: bool


GRAMMARS: dict[str, Grammar] = {
    "0.4": Grammar("0.4", "move {o} to {r}", "You move the {o} to the {r}.", False, True),
    "legacy": Grammar("legacy", "put {o} in/on {r}", "You put the {o} in/on the {r}.", True, False),
}

_APPLIANCE_FOR = {"heat": "microwave", "cool": "fridge", "clean": "sinkbasin"}
_AFFORDANCE_FOR = {"heat": "heatable", "cool": "coolable", "clean": "cleanable"}


@dataclass(frozen=True)
class Action:
    """A grounded action: a verb and its entity arguments (names).

    Verbs: ``goto(r)``, ``open(r)``, ``close(r)``, ``take(o, r)``, ``put(o, r)``, ``use(o)``, ``heat(o, r)``,
    ``cool(o, r)``, ``clean(o, r)``, ``slice(o, knife)``, ``examine(x)``, ``inventory()``, ``look()``, ``help()``.
    """

    verb: str
    args: tuple[str, ...] = ()


def display_key(name: str) -> tuple[str, int]:
    """Sort key for entity names in the order ALFWorld lists them: type ascending, number descending."""
    kind, _, number = name.rpartition(" ")
    return kind, -int(number)


def _listing(names: Iterable[str]) -> str:
    items = [f"a {n}" for n in sorted(names, key=display_key)]
    if not items:
        return "nothing"
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + ", and " + items[-1]


def _accessible(game: Game, state: State, recep: str) -> bool:
    return not game.receptacle(recep).openable or recep in state.opened


def describe_receptacle(game: Game, state: State, recep: str) -> str:
    """What examining (or arriving at, or opening) `recep` shows."""
    if game.receptacle(recep).openable:
        if recep in state.opened:
            return f"The {recep} is open. In it, you see {_listing(state.contents[recep])}."
        return f"The {recep} is closed."
    return f"On the {recep}, you see {_listing(state.contents[recep])}."


def describe_object(game: Game, state: State, obj: str) -> str:
    """What examining `obj` shows; the first matching rule of the original grammar wins."""
    o = game.obj(obj)
    clean, hot, cool, sliced = obj in state.clean, obj in state.hot, obj in state.cool, obj in state.sliced
    rules = (
        (clean and hot and sliced, f"This is a hot and clean sliced {obj}."),
        (clean and cool and sliced, f"This is a cool and clean sliced {obj}."),
        (clean and sliced, f"This is a clean sliced {obj}."),
        (hot and sliced, f"This is a hot sliced {obj}."),
        (cool and sliced, f"This is a cool sliced {obj}."),
        (clean and hot, f"This is a hot and clean {obj}."),
        (clean and cool, f"This is a cool and clean {obj}."),
        (hot, f"This is a hot {obj}."),
        (clean, f"This is a clean {obj}."),
        (cool, f"This is a cold {obj}."),
        ("toggleable" in o.affordances and obj in state.toggled, f"This {obj} is on."),
        ("toggleable" in o.affordances, f"This {obj} is off."),
        ("sliceable" in o.affordances and sliced, f"This is a sliced {obj}."),
    )
    return next((text for holds, text in rules if holds), f"There's nothing special about {obj}.")


def look(game: Game, state: State) -> str:
    """The `look` feedback (also the middle paragraph of the intro)."""
    if state.location is None:
        receptacles = [r.name for r in game.receptacles]
        return f"You are in the middle of a room. Looking quickly around you, you see {_listing(receptacles)}."
    # No object ever lies on the floor in these games, so "next to it" is always empty.
    return f"You are facing the {state.location}. Next to it, you see nothing."


def intro(game: Game, state: State) -> str:
    """The first observation of an episode."""
    return f"-= Welcome to TextWorld, ALFRED! =-\n\n{look(game, state)}\n\nYour task is to: {game.goal.text}."


def _inventory(state: State) -> str:
    if state.holding is None:
        return "You are not carrying anything."
    return f"You are carrying: a {state.holding}."


def actions(game: Game, state: State, grammar: Grammar) -> dict[str, Action]:
    """Every admissible command of `state`, mapped to the action it performs (PDDL preconditions, grounded)."""
    found: dict[str, Action] = {"look": Action("look"), "inventory": Action("inventory")}
    if grammar.has_help:
        found["help"] = Action("help")
    for r in game.receptacles:
        if r.name != state.location:
            found[f"go to {r.name}"] = Action("goto", (r.name,))
    held = state.holding
    if held is not None:
        found[f"examine {held}"] = Action("examine", (held,))
    here = state.location
    if here is None:
        return found
    recep = game.receptacle(here)
    found[f"examine {here}"] = Action("examine", (here,))
    if recep.openable:
        verb = "close" if here in state.opened else "open"
        found[f"{verb} {here}"] = Action(verb, (here,))
    open_here = _accessible(game, state, here)
    for obj in state.contents[here]:
        affordances = game.obj(obj).affordances
        if open_here:
            # Lamps are the only non-pickupable objects in these games (PDDL `pickupable` is false for them).
            if held is None and "toggleable" not in affordances:
                found[f"take {obj} from {here}"] = Action("take", (obj, here))
        if "toggleable" in affordances:  # ToggleObject does not check that the receptacle is open
            found[f"use {obj}"] = Action("use", (obj,))
        if held is not None and "sliceable" in affordances and "sharp" in game.obj(held).affordances:
            found[f"slice {obj} with {held}"] = Action("slice", (obj, held))
    if held is not None:
        if open_here and game.accepts(here, held):
            found[grammar.put_command.format(o=held, r=here)] = Action("put", (held, here))
        for verb, appliance in _APPLIANCE_FOR.items():
            if recep.kind == appliance and _AFFORDANCE_FOR[verb] in game.obj(held).affordances:
                found[f"{verb} {held} with {here}"] = Action(verb, (held, here))
    return found


def admissible_commands(game: Game, state: State, grammar: Grammar) -> list[str]:
    """The admissible commands of `state`, sorted (as TextWorld returns them)."""
    return sorted(actions(game, state, grammar))


def apply(game: Game, state: State, command: str, grammar: Grammar) -> tuple[State, str]:
    """Play `command`: the next state and the feedback text. Inadmissible -> same state, "Nothing happens."."""
    action = actions(game, state, grammar).get(command.strip())
    if action is None:
        return state, NOTHING_HAPPENS
    return perform(game, state, action, grammar)


def perform(game: Game, state: State, action: Action, grammar: Grammar) -> tuple[State, str]:
    """Apply an already-validated `action` (from `actions`) and return the next state and its feedback."""
    verb, args = action.verb, action.args
    if verb == "look":
        return state, look(game, state)
    if verb == "inventory":
        return state, _inventory(state)
    if verb == "help":
        return state, HELP_TEXT
    if verb == "examine":
        (name,) = args
        if game.is_receptacle(name):
            return state, describe_receptacle(game, state, name)
        return state, describe_object(game, state, name)
    if verb == "goto":
        (r,) = args
        new = replace(state, location=r)
        where = game.receptacle(r).location if grammar.arrive_at_location else r
        return new, f"You arrive at {where}. {describe_receptacle(game, new, r)}"
    if verb == "open":
        (r,) = args
        new = replace(state, opened=state.opened | {r})
        return new, f"You open the {r}. {describe_receptacle(game, new, r)}"
    if verb == "close":
        (r,) = args
        return replace(state, opened=state.opened - {r}), f"You close the {r}."
    if verb == "take":
        o, r = args
        new = replace(state.with_contents(r, tuple(x for x in state.contents[r] if x != o)), holding=o)
        return new, f"You pick up the {o} from the {r}."
    if verb == "put":
        o, r = args
        new = replace(state.with_contents(r, (*state.contents[r], o)), holding=None)
        return new, grammar.put_feedback.format(o=o, r=r)
    if verb == "use":
        (o,) = args
        on = state.on - {o} if o in state.on else state.on | {o}
        return replace(state, toggled=state.toggled | {o}, on=on), f"You turn on the {o}."
    if verb == "heat":
        o, r = args
        return replace(state, hot=state.hot | {o}, cool=state.cool - {o}), f"You heat the {o} using the {r}."
    if verb == "cool":
        o, r = args
        return replace(state, cool=state.cool | {o}, hot=state.hot - {o}), f"You cool the {o} using the {r}."
    if verb == "clean":
        o, r = args
        return replace(state, clean=state.clean | {o}), f"You clean the {o} using the {r}."
    if verb == "slice":
        o, knife = args
        return replace(state, sliced=state.sliced | {o}), f"You sliced the {o} with the {knife}."
    raise ValueError(f"unknown action verb {verb!r}")


def _satisfies(game: Game, state: State, obj: str) -> bool:
    """Whether `obj` has the type and the transformed state the goal asks for."""
    goal, o = game.goal, game.obj(obj)
    if o.kind != goal.obj:
        return False
    needed = {
        "pick_clean_then_place_in_recep": ("cleanable", state.clean),
        "pick_heat_then_place_in_recep": ("heatable", state.hot),
        "pick_cool_then_place_in_recep": ("coolable", state.cool),
    }.get(goal.task_type)
    return needed is None or (needed[0] in o.affordances and obj in needed[1])


def goal_reached(game: Game, state: State) -> bool:
    """The PDDL goal of the game's task type, evaluated on `state`."""
    goal = game.goal
    if goal.task_type == "look_at_obj_in_light":
        if state.holding is None or game.obj(state.holding).kind != goal.obj or state.location is None:
            return False
        return any(
            game.obj(x).kind == goal.toggle and "toggleable" in game.obj(x).affordances and x in state.toggled
            for x in state.contents[state.location]
        )
    needed = 2 if goal.task_type == "pick_two_obj_and_place" else 1
    return any(
        r.kind == goal.recep and sum(_satisfies(game, state, o) for o in state.contents[r.name]) >= needed
        for r in game.receptacles
    )
