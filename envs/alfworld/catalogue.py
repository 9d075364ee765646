"""World facts for scene generation: receptacle and object types, room layouts, placement priors, goal templates.

The facts live in `catalogue.json` beside this module (hand-written from ALFRED's type lists and affordances). They
are loaded once into frozen records; the generator draws scenes from them and the expert uses the same placement
prior to decide where to look first, as the original hand-coded expert does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType

from agentrl.envs.alfworld.world import AFFORDANCES, TASK_TYPES

__all__ = ["ReceptacleKind", "ObjectKind", "RoomKind", "Catalogue", "load_catalogue"]

CATALOGUE_PATH = Path(__file__).with_name("catalogue.json")


@dataclass(frozen=True)
class ReceptacleKind:
    """A receptacle type.

    Attributes:
        name: the type name (``"cabinet"``).
        openable: whether instances have a door and start closed.
        holds: the object types it can contain; ``None`` means every object type (a surface).
    """

    name: str
    openable: bool
    holds: frozenset[str] | None

    def can_hold(self, obj_kind: str) -> bool:
        """PDDL `canContain` for this receptacle type."""
        return self.holds is None or obj_kind in self.holds


@dataclass(frozen=True)
class ObjectKind:
    """An object type.

    Attributes:
        name: the type name (``"mug"``).
        found_in: receptacle type -> relative weight of finding an instance there (the placement prior).
        affordances: the subset of `AFFORDANCES` that applies.
    """

    name: str
    found_in: Mapping[str, float]
    affordances: frozenset[str]


@dataclass(frozen=True)
class RoomKind:
    """A room type: which receptacles it has (count ranges), which objects, which task types make sense there."""

    name: str
    receptacles: Mapping[str, tuple[int, int]]
    objects: tuple[str, ...]
    task_types: tuple[str, ...]


@dataclass(frozen=True)
class Catalogue:
    """All world facts the generator and the expert need.

    Attributes:
        receptacles / objects / rooms: the types by name.
        templates: task type -> its two goal templates (``{obj}``, ``{recep}``, ``{toggle}`` placeholders).
        lookable: object types a look_at_obj_in_light task may ask for.
    """

    receptacles: Mapping[str, ReceptacleKind]
    objects: Mapping[str, ObjectKind]
    rooms: Mapping[str, RoomKind]
    templates: Mapping[str, tuple[str, ...]]
    lookable: frozenset[str]

    def can_contain(self, recep_kind: str, obj_kind: str) -> bool:
        """Whether receptacle type `recep_kind` can hold object type `obj_kind`."""
        return self.receptacles[recep_kind].can_hold(obj_kind)

    def prior(self, obj_kind: str, recep_kind: str) -> float:
        """How likely an `obj_kind` is to be found in a `recep_kind` (0 when the prior never puts it there)."""
        return self.objects[obj_kind].found_in.get(recep_kind, 0.0)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"{CATALOGUE_PATH.name}: {message}")


@cache
def load_catalogue(path: Path = CATALOGUE_PATH) -> Catalogue:
    """Load and validate the catalogue (cached: it is read once per process)."""
    raw = json.loads(Path(path).read_text())
    receptacles = {
        name: ReceptacleKind(name, bool(spec["openable"]), None if spec["holds"] == "any" else frozenset(spec["holds"]))
        for name, spec in raw["receptacles"].items()
    }
    affordance_lists = raw["affordances"]
    _check(set(affordance_lists) <= set(AFFORDANCES) | {"lookable"}, f"unknown affordances {sorted(affordance_lists)}")
    objects = {}
    for name, spec in raw["objects"].items():
        affordances = frozenset(a for a in AFFORDANCES if name in affordance_lists.get(a, ()))
        found_in = MappingProxyType({k: float(v) for k, v in spec["found_in"].items()})
        for recep in found_in:
            _check(recep in receptacles, f"object {name!r} is found in unknown receptacle {recep!r}")
            _check(receptacles[recep].can_hold(name), f"{recep!r} is a prior place for {name!r} but cannot hold it")
        objects[name] = ObjectKind(name, found_in, affordances)
    rooms = {}
    for name, spec in raw["rooms"].items():
        counts = {k: (int(lo), int(hi)) for k, (lo, hi) in spec["receptacles"].items()}
        _check(all(k in receptacles for k in counts), f"room {name!r} names an unknown receptacle")
        _check(all(o in objects for o in spec["objects"]), f"room {name!r} names an unknown object")
        _check(all(t in TASK_TYPES for t in spec["task_types"]), f"room {name!r} names an unknown task type")
        rooms[name] = RoomKind(name, MappingProxyType(counts), tuple(spec["objects"]), tuple(spec["task_types"]))
    templates = {t: tuple(v) for t, v in raw["templates"].items()}
    _check(set(templates) == set(TASK_TYPES), "templates must cover exactly the six task types")
    lookable = frozenset(affordance_lists.get("lookable", ()))
    return Catalogue(
        receptacles=MappingProxyType(receptacles),
        objects=MappingProxyType(objects),
        rooms=MappingProxyType(rooms),
        templates=MappingProxyType(templates),
        lookable=lookable,
    )
