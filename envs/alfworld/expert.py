"""A hand-coded ALFWorld expert that plans from what the agent has seen, in the spirit of the original one.

Like `alfworld/agents/expert/handcoded_expert.py`, it works through subgoals (find the object, take it, transform
it at the right appliance, find the target, open it, place the object; or find a lamp and use it) and searches
receptacles in the order of an object-to-receptacle prior, opening closed ones and remembering what it saw where.

It never reads hidden state: its inputs are the current `State` restricted to what the agent can know (where it
is, what it holds, which objects it transformed) plus `seen`, the last observed contents of each receptacle
(`observe` keeps it up to date from the same text the agent reads). So it also recovers from states an agent
reached by itself: anything the agent moved, it saw being moved.

Departures from the original: no random exploration and no 150-step budget; when nothing useful is left unseen it
answers "look" (this only happens in games where the goal objects no longer exist, which our engine cannot reach).
"""

from __future__ import annotations

from collections.abc import Mapping

from agentrl.envs.alfworld.catalogue import Catalogue
from agentrl.envs.alfworld.engine import Grammar, admissible_commands, apply, goal_reached
from agentrl.envs.alfworld.world import Game, State

__all__ = ["observe", "expert_action", "run_expert", "search_order"]

_TRANSFORM = {
    "pick_clean_then_place_in_recep": ("clean", "sinkbasin", "clean"),
    "pick_heat_then_place_in_recep": ("heat", "microwave", "hot"),
    "pick_cool_then_place_in_recep": ("cool", "fridge", "cool"),
}


def observe(game: Game, state: State, seen: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Update the memory of receptacle contents after a step: the faced receptacle is visible if it is open."""
    memory = dict(seen)
    here = state.location
    if here is not None and (not game.receptacle(here).openable or here in state.opened):
        memory[here] = state.contents[here]
    return memory


def _kind(game: Game, name: str) -> str:
    return game.obj(name).kind


def search_order(game: Game, obj_kind: str, catalogue: Catalogue) -> list[str]:
    """Receptacles that can hold `obj_kind`, most likely first under the placement prior (ties: display order)."""
    known = obj_kind in catalogue.objects

    def likelihood(kind: str) -> float:
        return catalogue.prior(obj_kind, kind) if known and kind in catalogue.receptacles else 0.0

    candidates = [r for r in game.receptacles if obj_kind in game.can_contain.get(r.kind, frozenset())]
    ranked = sorted(enumerate(candidates), key=lambda ir: (-likelihood(ir[1].kind), ir[0]))
    return [r.name for _, r in ranked]


def _go_or_open(game: Game, state: State, recep: str) -> str | None:
    """The step that brings the agent in front of an open `recep`, or None when it already is."""
    if state.location != recep:
        return f"go to {recep}"
    if game.receptacle(recep).openable and recep not in state.opened:
        return f"open {recep}"
    return None


def _explore(game: Game, state: State, seen: Mapping[str, tuple[str, ...]], kind: str, catalogue: Catalogue) -> str:
    for recep in search_order(game, kind, catalogue):
        if recep not in seen:
            return _go_or_open(game, state, recep) or "look"
    return "look"


def _fetch(
    game: Game,
    state: State,
    seen: Mapping[str, tuple[str, ...]],
    kind: str,
    catalogue: Catalogue,
    exclude: str | None = None,
) -> str:
    """Take an object of `kind` (not one lying in `exclude`): go to a known one, or search for one."""
    places = [r for r, objs in seen.items() if r != exclude and any(_kind(game, o) == kind for o in objs)]
    if places:
        recep = state.location if state.location in places else min(places, key=_name_order)
        obj = min((o for o in seen[recep] if _kind(game, o) == kind), key=_name_order)
        return _go_or_open(game, state, recep) or f"take {obj} from {recep}"
    return _explore(game, state, seen, kind, catalogue)


def _name_order(name: str) -> tuple[str, int]:
    kind, _, number = name.rpartition(" ")
    return kind, int(number)


def _place(game: Game, state: State, recep: str, grammar: Grammar) -> str:
    held = state.holding
    assert held is not None
    return _go_or_open(game, state, recep) or grammar.put_command.format(o=held, r=recep)


def _drop(game: Game, state: State, grammar: Grammar) -> str:
    """Put down an object the task does not need, preferably right here, else on the nearest surface."""
    held = state.holding
    assert held is not None
    here = state.location
    if here is not None and game.accepts(here, held):
        return _place(game, state, here, grammar)
    fits = [r for r in game.receptacles if game.accepts(r.name, held)]
    if not fits:
        return "look"
    recep = min(fits, key=lambda r: (r.openable, _name_order(r.name)))
    return _place(game, state, recep.name, grammar)


def _target(game: Game, state: State, seen: Mapping[str, tuple[str, ...]]) -> str:
    """The receptacle instance to fill: the one already holding most goal objects, else the one here, else first."""
    goal = game.goal
    instances = [r.name for r in game.receptacles if r.kind == goal.recep]
    if not instances:
        raise ValueError(f"game has no {goal.recep!r} for the goal {goal.text!r}")

    def score(recep: str) -> tuple[int, int, tuple[str, int]]:
        count = sum(_kind(game, o) == goal.obj for o in seen.get(recep, ()))
        return -count, recep != state.location, _name_order(recep)

    return min(instances, key=score)


def expert_action(
    game: Game, state: State, seen: Mapping[str, tuple[str, ...]], catalogue: Catalogue, grammar: Grammar
) -> str:
    """The expert's next command for `state`, given the receptacle contents the agent has seen so far."""
    goal = game.goal
    held = state.holding
    if goal.task_type == "look_at_obj_in_light":
        if held is None:
            return _fetch(game, state, seen, goal.obj, catalogue)
        if _kind(game, held) != goal.obj:
            return _drop(game, state, grammar)
        lamps = [(r, o) for r, objs in seen.items() for o in objs if _kind(game, o) == goal.toggle] + [
            (state.location, o) for o in state.contents.get(state.location or "", ()) if _kind(game, o) == goal.toggle
        ]
        if not lamps:
            return _explore(game, state, seen, goal.toggle or "", catalogue)
        recep, lamp = next(((r, o) for r, o in lamps if r == state.location), min(lamps))
        return f"go to {recep}" if state.location != recep else f"use {lamp}"

    target = _target(game, state, seen)
    if held is not None and _kind(game, held) == goal.obj:
        transform = _TRANSFORM.get(goal.task_type)
        if transform is not None:
            verb, appliance_kind, done_attr = transform
            if held not in getattr(state, done_attr):
                appliances = [r.name for r in game.receptacles if r.kind == appliance_kind]
                appliance = state.location if state.location in appliances else min(appliances, key=_name_order)
                return f"go to {appliance}" if state.location != appliance else f"{verb} {held} with {appliance}"
        return _place(game, state, target, grammar)
    if held is not None:
        return _drop(game, state, grammar)
    exclude = target if goal.task_type == "pick_two_obj_and_place" else None
    return _fetch(game, state, seen, goal.obj, catalogue, exclude=exclude)


def run_expert(game: Game, catalogue: Catalogue, grammar: Grammar, max_steps: int = 50) -> list[str] | None:
    """Play the expert from the game's initial state; its commands if it wins within `max_steps`, else None."""
    state, seen, commands = game.initial, observe(game, game.initial, {}), []
    for _ in range(max_steps):
        command = expert_action(game, state, seen, catalogue, grammar)
        if command not in admissible_commands(game, state, grammar):
            return None
        state, _ = apply(game, state, command, grammar)
        seen = observe(game, state, seen)
        commands.append(command)
        if goal_reached(game, state):
            return commands
    return None
