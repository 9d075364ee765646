"""A seeded ALFWorld scene generator with a train split and two held-out splits.

ALFWorld's games come from ALFRED scenes (30 floor plans each of kitchens, living rooms, bedrooms, bathrooms) and
are filtered to those a planner solves. We cannot ship those, so we draw rooms from `catalogue.json`: receptacle
counts per room type, objects placed by a type-to-receptacle prior, then a task whose preconditions the scene meets
(the object exists and has the affordance, the appliance and the target exist, the goal does not already hold).
As ALFWorld keeps only solvable games, we keep only games our expert solves within the step budget, so every
generated game is solvable by construction.

Splits (ALFWorld has train, valid_seen and valid_unseen):
    * a task "combination" is (task type, object type, target receptacle or lamp type); a fixed, seed-independent
      fifth of all combinations (by CRC32 of their name) is held out;
    * ``train`` and ``valid_seen`` draw only the other combinations, from disjoint random streams;
    * ``valid_unseen`` draws only held-out combinations, which training never sees.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import replace
from types import MappingProxyType

import numpy as np

from agentrl.envs.alfworld.catalogue import Catalogue, RoomKind, load_catalogue
from agentrl.envs.alfworld.engine import GRAMMARS, display_key, goal_reached
from agentrl.envs.alfworld.expert import run_expert
from agentrl.envs.alfworld.world import TASK_TYPES, Game, Goal, Obj, Receptacle, State

__all__ = ["SPLITS", "is_held_out", "generate_game"]

SPLITS: tuple[str, ...] = ("train", "valid_seen", "valid_unseen")
HELD_OUT_EVERY = 5
MAX_ATTEMPTS = 200

_APPLIANCE = {
    "pick_clean_then_place_in_recep": ("cleanable", "sinkbasin"),
    "pick_heat_then_place_in_recep": ("heatable", "microwave"),
    "pick_cool_then_place_in_recep": ("coolable", "fridge"),
}


def is_held_out(task_type: str, obj: str, target: str) -> bool:
    """Whether this (task type, object type, target type) combination belongs to the unseen split only."""
    return zlib.crc32(f"{task_type}|{obj}|{target}".encode()) % HELD_OUT_EVERY == 0


def _weighted_choice(rng: np.random.Generator, items: Sequence, weights: Sequence[float]):
    w = np.asarray(weights, dtype=float)
    return items[int(rng.choice(len(items), p=w / w.sum()))]


def _place(rng: np.random.Generator, cat: Catalogue, kind: str, receptacles: Sequence[Receptacle]) -> str | None:
    """Pick a receptacle for a new `kind` instance: by the prior, else any receptacle that can hold it."""
    prior = [cat.prior(kind, r.kind) for r in receptacles]
    if sum(prior) > 0:
        return _weighted_choice(rng, receptacles, prior).name
    fits = [r for r in receptacles if cat.can_contain(r.kind, kind)]
    return fits[int(rng.integers(len(fits)))].name if fits else None


def _draw_room(rng: np.random.Generator, room: RoomKind, cat: Catalogue) -> tuple[list[Receptacle], dict[str, list]]:
    receptacles: list[Receptacle] = []
    for kind, (lo, hi) in room.receptacles.items():
        for number in range(1, int(rng.integers(lo, hi + 1)) + 1):
            receptacles.append(Receptacle(f"{kind} {number}", kind, cat.receptacles[kind].openable, ""))
    # Legacy location names ("loc 12") are arbitrary numbers in ALFWorld; draw them as a permutation.
    numbers = rng.permutation(len(receptacles)) + 1
    receptacles = [replace(r, location=f"loc {n}") for r, n in zip(receptacles, numbers, strict=True)]
    receptacles.sort(key=lambda r: display_key(r.name))
    contents: dict[str, list[str]] = {r.name: [] for r in receptacles}
    for kind in room.objects:
        toggleable = "toggleable" in cat.objects[kind].affordances
        # Lamps are always there (look-at tasks need one); other types appear in about 70% of rooms.
        count = 1 if toggleable else int(rng.choice([0, 1, 2, 3], p=[0.3, 0.35, 0.2, 0.15]))
        for number in range(1, count + 1):
            recep = _place(rng, cat, kind, receptacles)
            if recep is not None:
                contents[recep].append(f"{kind} {number}")
    return receptacles, contents


def _combos(task_type: str, kinds_present: set[str], receps_present: set[str], cat: Catalogue) -> list[tuple]:
    """Every (obj, target) the scene supports for `task_type`, sorted for determinism."""
    movable = sorted(k for k in kinds_present if "toggleable" not in cat.objects[k].affordances)
    if task_type == "look_at_obj_in_light":
        lamps = sorted(k for k in kinds_present if "toggleable" in cat.objects[k].affordances)
        return [(o, lamp) for o in movable if o in cat.lookable for lamp in lamps]
    affordance, appliance = _APPLIANCE.get(task_type, (None, None))
    if appliance is not None and appliance not in receps_present:
        return []
    return [
        (o, r)
        for o in movable
        if affordance is None or affordance in cat.objects[o].affordances
        for r in sorted(receps_present)
        if r != appliance and cat.can_contain(r, o)
    ]


def _draw_game(rng: np.random.Generator, split: str, task_types: Sequence[str], cat: Catalogue) -> Game | None:
    # Task type first, uniformly, then a room where it makes sense: heat and cool only fit kitchens, and drawing
    # the room first would make them rare.
    task_type = task_types[int(rng.integers(len(task_types)))]
    rooms = [room for room in cat.rooms.values() if task_type in room.task_types]
    room = rooms[int(rng.integers(len(rooms)))]
    receptacles, contents = _draw_room(rng, room, cat)
    kinds_present = {name.rpartition(" ")[0] for objs in contents.values() for name in objs}
    combos = [
        c
        for c in _combos(task_type, kinds_present, {r.kind for r in receptacles}, cat)
        if is_held_out(task_type, *c) == (split == "valid_unseen")
    ]
    if not combos:
        return None
    obj_kind, target = combos[int(rng.integers(len(combos)))]
    if task_type == "pick_two_obj_and_place":
        have = sum(name.rpartition(" ")[0] == obj_kind for objs in contents.values() for name in objs)
        for number in range(have + 1, 3):
            recep = _place(rng, cat, obj_kind, [r for r in receptacles if r.kind != target])
            if recep is None:
                return None
            contents[recep].append(f"{obj_kind} {number}")
    template = cat.templates[task_type][int(rng.integers(2))]
    is_look = task_type == "look_at_obj_in_light"
    goal = Goal(
        task_type=task_type,
        obj=obj_kind,
        recep=None if is_look else target,
        toggle=target if is_look else None,
        text=template.format(obj=obj_kind, recep=target, toggle=target),
    )
    names = sorted((n for objs in contents.values() for n in objs), key=display_key)
    objects = tuple(Obj(n, n.rpartition(" ")[0], cat.objects[n.rpartition(" ")[0]].affordances) for n in names)
    present = {o.kind for o in objects}
    recep_kinds = sorted({r.kind for r in receptacles})
    can_contain = {kind: frozenset(k for k in present if cat.can_contain(kind, k)) for kind in recep_kinds}
    initial = State(
        location=None,
        holding=None,
        contents=MappingProxyType({r: tuple(sorted(objs, key=display_key)) for r, objs in contents.items()}),
    )
    game = Game(
        room=room.name,
        receptacles=tuple(receptacles),
        objects=objects,
        can_contain=MappingProxyType(can_contain),
        goal=goal,
        initial=initial,
        split=split,
    )
    # A goal that already holds (a mug already in the coffeemachine) is no task: draw again.
    return None if goal_reached(game, initial) or _any_goal_object_in_target(game) else game


def _any_goal_object_in_target(game: Game) -> bool:
    goal = game.goal
    if goal.task_type not in ("pick_and_place_simple", "pick_two_obj_and_place"):
        return False
    return any(
        r.kind == goal.recep and any(game.obj(o).kind == goal.obj for o in game.initial.contents[r.name])
        for r in game.receptacles
    )


def generate_game(
    seed: int,
    split: str = "train",
    task_types: Sequence[str] | None = None,
    max_steps: int = 50,
    catalogue: Catalogue | None = None,
) -> Game:
    """Draw the game for `seed` in `split`: the same arguments always give the same game.

    Args:
        seed: any non-negative integer.
        split: ``"train"``, ``"valid_seen"`` or ``"valid_unseen"`` (see the module docstring).
        task_types: restrict to these task types (default: all six).
        max_steps: the expert must solve the game within this many steps (ALFWorld's budget is 50).
        catalogue: world facts (default: the bundled `catalogue.json`).

    Raises:
        ValueError: an unknown split or task type, or a negative seed.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    task_types = tuple(TASK_TYPES if task_types is None else task_types)
    unknown = [t for t in task_types if t not in TASK_TYPES]
    if unknown or not task_types:
        expected = ", ".join(TASK_TYPES)
        raise ValueError(f"unknown or empty task_types {list(task_types)}; expected a subset of {expected}")
    if int(seed) < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    cat = catalogue or load_catalogue()
    # The split index is part of the seed, so train and valid_seen never share a random stream.
    rng = np.random.default_rng([int(seed), SPLITS.index(split)])
    for _ in range(MAX_ATTEMPTS):
        game = _draw_game(rng, split, task_types, cat)
        if game is not None and run_expert(game, cat, GRAMMARS["0.4"], max_steps) is not None:
            return replace(game, seed=int(seed))
    raise RuntimeError(f"no solvable {split} game for seed {seed} and task types {task_types} in {MAX_ATTEMPTS} draws")
