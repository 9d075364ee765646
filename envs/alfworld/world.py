"""The ALFWorld world model: typed, frozen records for a game and its state, and their JSON form.

A `Game` is everything fixed for one episode (the room, its receptacles and objects, what fits where, the goal,
the initial `State`). A `State` is everything an action can change. Both are frozen: the engine
(`agentrl.envs.alfworld.engine`) returns a new `State` per step, so a state can be kept, compared and replayed.

The records mirror the predicates of ALFWorld's PDDL domain (`alfred.pddl`): `openable`/`opened`,
`inReceptacle`, `holds`, `isClean`/`isHot`/`isCool`/`isSliced`/`isToggled`, `canContain` between types.
Departures: one receptacle per location (so `objectAtLocation` is implied by `inReceptacle`), no objects on the
floor, and no movable receptacles (ALFWorld's text games do not use them either).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

__all__ = [
    "TASK_TYPES",
    "AFFORDANCES",
    "Receptacle",
    "Obj",
    "Goal",
    "State",
    "Game",
    "GameFormatError",
    "save_game",
    "load_game",
]

TASK_TYPES: tuple[str, ...] = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
"""The six ALFWorld task types, in the original's numbering order (1 to 6)."""

AFFORDANCES: tuple[str, ...] = ("cleanable", "heatable", "coolable", "sliceable", "toggleable", "sharp")
"""Object capabilities, as in the PDDL domain (`sharp` stands for the Knife/ButterKnife type test of SliceObject)."""

GAME_FORMAT = "agentrl-alfworld-game/1"
_STATE_SETS = ("opened", "clean", "hot", "cool", "sliced", "toggled", "on")


class GameFormatError(ValueError):
    """A saved game file that cannot be read; the message names the file and the problem."""


def _split_name(name: str) -> tuple[str, int]:
    kind, _, number = name.rpartition(" ")
    if not kind or not number.isdigit():
        raise GameFormatError(f"entity name {name!r} must look like '<type> <number>', e.g. 'mug 1'")
    return kind, int(number)


@dataclass(frozen=True)
class Receptacle:
    """A fixed piece of furniture or appliance the agent can go to.

    Attributes:
        name: the displayed name, ``"<kind> <number>"`` (``"cabinet 3"``).
        kind: the receptacle type, ALFRED's name lower-cased (``"cabinet"``, ``"sinkbasin"``).
        openable: whether it has a door (cabinet, drawer, fridge, microwave, safe).
        location: the legacy location name shown by the 0.3.x grammar (``"loc 12"``).
    """

    name: str
    kind: str
    openable: bool
    location: str

    @property
    def number(self) -> int:
        """The instance number in the name."""
        return _split_name(self.name)[1]


@dataclass(frozen=True)
class Obj:
    """A portable object.

    Attributes:
        name: the displayed name, ``"<kind> <number>"`` (``"mug 1"``).
        kind: the object type (``"mug"``).
        affordances: the subset of `AFFORDANCES` that applies (``{"cleanable", "heatable", "coolable"}``).
    """

    name: str
    kind: str
    affordances: frozenset[str] = frozenset()

    @property
    def number(self) -> int:
        """The instance number in the name."""
        return _split_name(self.name)[1]


@dataclass(frozen=True)
class Goal:
    """One task: its type, the object type it is about, where it must end up, and its text.

    Attributes:
        task_type: one of `TASK_TYPES`.
        obj: the object type (``"mug"``).
        recep: the target receptacle type (``"coffeemachine"``); ``None`` for look_at_obj_in_light.
        toggle: the lamp type for look_at_obj_in_light (``"desklamp"``), else ``None``.
        text: the task sentence without its final period (``"put a clean mug in coffeemachine"``).
    """

    task_type: str
    obj: str
    recep: str | None
    toggle: str | None
    text: str

    def __post_init__(self) -> None:
        if self.task_type not in TASK_TYPES:
            raise GameFormatError(f"unknown task type {self.task_type!r}; expected one of {', '.join(TASK_TYPES)}")
        if (self.task_type == "look_at_obj_in_light") != (self.toggle is not None):
            raise GameFormatError(f"goal {self.text!r}: only look_at_obj_in_light takes a toggle, and it needs one")
        if self.toggle is None and self.recep is None:
            raise GameFormatError(f"goal {self.text!r} ({self.task_type}) needs a target receptacle type")


@dataclass(frozen=True)
class State:
    """Everything an action can change. Treat `contents` as read-only; the engine builds a new one per change.

    Attributes:
        location: the receptacle the agent faces, or ``None`` in the middle of the room (the start).
        holding: the object in the agent's hands, or ``None``.
        contents: receptacle name -> the objects in it (every receptacle has an entry).
        opened: openable receptacles that are open.
        clean / hot / cool / sliced: objects with that state (heating removes cool and cooling removes hot, as in
            the PDDL domain).
        toggled: toggleable objects that were ever used (`isToggled`, what the look-at goal checks).
        on: toggleable objects currently on (`isOn`, flipped by every use).
    """

    location: str | None
    holding: str | None
    contents: Mapping[str, tuple[str, ...]]
    opened: frozenset[str] = frozenset()
    clean: frozenset[str] = frozenset()
    hot: frozenset[str] = frozenset()
    cool: frozenset[str] = frozenset()
    sliced: frozenset[str] = frozenset()
    toggled: frozenset[str] = frozenset()
    on: frozenset[str] = frozenset()

    def container_of(self, obj: str) -> str | None:
        """The receptacle holding `obj`, or ``None`` when the agent holds it."""
        for recep, objs in self.contents.items():
            if obj in objs:
                return recep
        return None

    def with_contents(self, recep: str, objs: tuple[str, ...]) -> State:
        """A copy of this state where `recep` holds exactly `objs`."""
        contents = dict(self.contents)
        contents[recep] = objs
        return replace(self, contents=MappingProxyType(contents))


@dataclass(frozen=True)
class Game:
    """One ALFWorld game: a room, its receptacles and objects, the goal and the initial state.

    Attributes:
        room: ``"kitchen"``, ``"livingroom"``, ``"bedroom"`` or ``"bathroom"``.
        receptacles: all receptacles, in display order (type ascending, number descending, like ALFWorld's
            demangled names).
        objects: all objects, in display order.
        can_contain: receptacle type -> the object types it accepts (PDDL `canContain`), for the types present.
        goal: the task.
        initial: the state at reset.
        seed: the generator seed that produced it (``None`` for hand-written games).
        split: the split it was drawn for (``"train"``, ``"valid_seen"``, ``"valid_unseen"`` or ``"custom"``).
    """

    room: str
    receptacles: tuple[Receptacle, ...]
    objects: tuple[Obj, ...]
    can_contain: Mapping[str, frozenset[str]]
    goal: Goal
    initial: State
    seed: int | None = None
    split: str = "custom"
    _receptacle_by_name: Mapping[str, Receptacle] = field(init=False, repr=False, compare=False)
    _object_by_name: Mapping[str, Obj] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_receptacle_by_name", MappingProxyType({r.name: r for r in self.receptacles}))
        object.__setattr__(self, "_object_by_name", MappingProxyType({o.name: o for o in self.objects}))
        self._validate()

    def receptacle(self, name: str) -> Receptacle:
        """The receptacle called `name`."""
        return self._receptacle_by_name[name]

    def obj(self, name: str) -> Obj:
        """The object called `name`."""
        return self._object_by_name[name]

    def is_receptacle(self, name: str) -> bool:
        """Whether `name` names a receptacle of this game."""
        return name in self._receptacle_by_name

    def accepts(self, recep: str, obj: str) -> bool:
        """PDDL `canContain`: can receptacle `recep` hold object `obj` (by their types)?"""
        return self.obj(obj).kind in self.can_contain.get(self.receptacle(recep).kind, frozenset())

    def _validate(self) -> None:
        if len(self._receptacle_by_name) != len(self.receptacles) or len(self._object_by_name) != len(self.objects):
            raise GameFormatError("receptacle and object names must be unique")
        placed = [o for objs in self.initial.contents.values() for o in objs]
        if set(self.initial.contents) != set(self._receptacle_by_name):
            raise GameFormatError("the initial state must list the contents of every receptacle (and nothing else)")
        held = [self.initial.holding] if self.initial.holding else []
        if sorted(placed + held) != sorted(self._object_by_name):
            raise GameFormatError("every object must be in exactly one receptacle (or held) in the initial state")
        if self.initial.location is not None and self.initial.location not in self._receptacle_by_name:
            raise GameFormatError(f"initial location {self.initial.location!r} is not a receptacle")

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form of this game (see `save_game`)."""
        s = self.initial
        return {
            "format": GAME_FORMAT,
            "room": self.room,
            "seed": self.seed,
            "split": self.split,
            "goal": {
                "task_type": self.goal.task_type,
                "obj": self.goal.obj,
                "recep": self.goal.recep,
                "toggle": self.goal.toggle,
                "text": self.goal.text,
            },
            "receptacles": [
                {"name": r.name, "openable": r.openable, "location": r.location, "contents": list(s.contents[r.name])}
                for r in self.receptacles
            ],
            "objects": [{"name": o.name, "affordances": sorted(o.affordances)} for o in self.objects],
            "can_contain": {k: sorted(v) for k, v in sorted(self.can_contain.items())},
            "state": {
                "location": s.location,
                "holding": s.holding,
                **{key: sorted(getattr(s, key)) for key in _STATE_SETS},
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Game:
        """Rebuild a game from `to_dict`'s output; raises `GameFormatError` naming what is wrong."""
        if not isinstance(data, Mapping) or data.get("format") != GAME_FORMAT:
            found = data.get("format") if isinstance(data, Mapping) else type(data).__name__
            raise GameFormatError(f"not an agentrl ALFWorld game (format {found!r}, expected {GAME_FORMAT!r})")
        try:
            receptacles = tuple(
                Receptacle(r["name"], _split_name(r["name"])[0], bool(r["openable"]), r["location"])
                for r in data["receptacles"]
            )
            objects = tuple(
                Obj(o["name"], _split_name(o["name"])[0], frozenset(o["affordances"])) for o in data["objects"]
            )
            unknown = {a for o in objects for a in o.affordances} - set(AFFORDANCES)
            if unknown:
                raise GameFormatError(f"unknown affordances {sorted(unknown)}; expected a subset of {AFFORDANCES}")
            st = data["state"]
            initial = State(
                location=st["location"],
                holding=st["holding"],
                contents=MappingProxyType({r["name"]: tuple(r["contents"]) for r in data["receptacles"]}),
                **{k: frozenset(st[k]) for k in _STATE_SETS},
            )
            return cls(
                room=data["room"],
                receptacles=receptacles,
                objects=objects,
                can_contain=MappingProxyType({k: frozenset(v) for k, v in data["can_contain"].items()}),
                goal=Goal(**data["goal"]),
                initial=initial,
                seed=data["seed"],
                split=data["split"],
            )
        except KeyError as e:
            raise GameFormatError(f"game data is missing the field {e.args[0]!r}") from None
        except TypeError as e:
            raise GameFormatError(f"game data has a field of the wrong type ({e})") from None


def save_game(game: Game, path: str | Path) -> Path:
    """Write `game` as JSON to `path` (parents created) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(game.to_dict(), indent=1) + "\n")
    return path


def load_game(path: str | Path) -> Game:
    """Read a game written by `save_game`; raises `GameFormatError` naming the file on bad content."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"ALFWorld game file not found: {path}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise GameFormatError(f"{path}: not valid JSON ({e})") from None
    try:
        return Game.from_dict(data)
    except GameFormatError as e:
        raise GameFormatError(f"{path}: {e}") from None
