"""The real engine as an option: play ALFWorld `game.tw-pddl` files with TextWorld, and export our games to them.

Needs the alfworld extra (``pip install 'agentrl-platform[alfworld]'``: TextWorld with PDDL, and alfworld); importing
this module works without it, and `textworld_available()` says whether it is there.

A `.tw-pddl` file is JSON: ``{pddl_domain, grammar, pddl_problem, solvable}``. ALFWorld's PDDL entity ids are
mangled ALFRED ids (``Mug_bar__minus_01_dot_76_bar_...``) that alfworld's `Demangler` turns into "mug 1"; files we
export carry an extra ``agentrl_names`` map from id to display name (and ``agentrl_task_type``), which TextWorld
ignores and `TextWorldGame` applies. Our ids sort like ALFWorld's (type ascending, number descending), so both
engines list things in the same order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from agentrl.envs.alfworld.world import TASK_TYPES, Game
from agentrl.extras import MissingExtraError, install_hint

__all__ = ["textworld_available", "to_tw_pddl", "TextWorldGame", "MISSING_EXTRA"]

MISSING_EXTRA = (
    "the alfworld env playing .tw-pddl files needs ALFWorld's original engine (textworld with PDDL, and alfworld), "
    f"which the base install leaves out: {install_hint('alfworld')}"
)

# Type constants the domain's actions name explicitly (CleanObject, HeatObject, CoolObject, SliceObject).
_PDDL_TYPE_NAMES = {
    "sinkbasin": "SinkBasinType",
    "microwave": "MicrowaveType",
    "fridge": "FridgeType",
    "knife": "KnifeType",
    "butterknife": "ButterKnifeType",
}
_GOALS = {
    "pick_and_place_simple": "(inReceptacle ?o ?r)",
    "pick_clean_then_place_in_recep": "(cleanable ?o) (isClean ?o) (inReceptacle ?o ?r)",
    "pick_heat_then_place_in_recep": "(heatable ?o) (isHot ?o) (inReceptacle ?o ?r)",
    "pick_cool_then_place_in_recep": "(coolable ?o) (isCool ?o) (inReceptacle ?o ?r)",
}


def textworld_available() -> bool:
    """Whether TextWorld with its PDDL support (Fast Downward) and alfworld's data files are installed."""
    try:
        import fast_downward  # noqa: F401
        import textworld.envs.pddl  # noqa: F401

        return resources.files("alfworld").joinpath("data", "alfred.pddl").is_file()
    except ImportError:
        return False


def _type_name(kind: str) -> str:
    return _PDDL_TYPE_NAMES.get(kind, f"{kind}Type")


def _entity_id(name: str) -> str:
    kind, _, number = name.rpartition(" ")
    # 9999 - n makes ids sort by number descending, the order ALFWorld's demangled names show up in.
    return f"{kind}_bar_{9999 - int(number):04d}"


def _location_id(location: str) -> str:
    return "loc_bar_" + location.rpartition(" ")[2]


def _domain_and_grammar(grammar: str) -> tuple[str, str]:
    data = resources.files("alfworld").joinpath("data")
    domain = data.joinpath("alfred.pddl").read_text()
    twl2 = data.joinpath("alfred.twl2").read_text()
    if grammar == "legacy":
        # alfworld <= 0.3.5: undo what alfworld's scripts/patch_tw-pddl.py changes for 0.4.x.
        twl2 = twl2.replace("You arrive at {r.name}.", "You arrive at {lend.name}.")
        twl2 = twl2.replace("move {o} to {r}", "put {o} in/on {r}")
        twl2 = twl2.replace("You move the {o.name} to the {r.name}.", "You put the {o.name} in/on the {r.name}.")
        twl2 = re.sub(r"\naction help \{.*", "\n", twl2, flags=re.S)
        domain = re.sub(r"\(:action help.*?\n\)\n", "", domain, flags=re.S)
    return domain, twl2


def _goal_pddl(game: Game) -> str:
    goal = game.goal
    if goal.task_type == "look_at_obj_in_light":
        return (
            f"(and (exists (?ot - object ?r - receptacle ?a - agent ?l - location) (and (objectType ?ot "
            f"{_type_name(goal.toggle or '')}) (toggleable ?ot) (isToggled ?ot) (receptacleAtLocation ?r ?l) "
            f"(atLocation ?a ?l) (inReceptacle ?ot ?r))) (exists (?o - object ?a - agent) (and (objectType ?o "
            f"{_type_name(goal.obj)}) (holds ?a ?o))))"
        )
    typed = f"(objectType ?o {_type_name(goal.obj)}) (receptacleType ?r {_type_name(goal.recep or '')})"
    if goal.task_type == "pick_two_obj_and_place":
        return (
            f"(exists (?r - receptacle ?o - object ?o2 - object) (and {typed} (inReceptacle ?o ?r) "
            f"(not (= ?o ?o2)) (objectType ?o2 {_type_name(goal.obj)}) (inReceptacle ?o2 ?r)))"
        )
    return f"(exists (?r - receptacle ?o - object) (and {typed} {_GOALS[goal.task_type]}))"


def to_tw_pddl(game: Game, grammar: str = "0.4") -> dict[str, Any]:
    """Export `game` as a `.tw-pddl` document TextWorld can play (requires the alfworld package for its data).

    Args:
        game: the game to export (its initial state).
        grammar: ``"0.4"`` or ``"legacy"``: which of ALFWorld's grammars the document carries.
    """
    if grammar not in ("0.4", "legacy"):
        raise ValueError(f"unknown grammar {grammar!r}; expected '0.4' or 'legacy'")
    domain, twl2 = _domain_and_grammar(grammar)
    state = game.initial
    names = {"agent1": "agent", "loc_bar_0": "loc 0"}
    objects, init = ["agent1 - agent", "loc_bar_0 - location"], []
    init.append(f"(atLocation agent1 {_location_id(state.location) if state.location else 'loc_bar_0'})")
    if state.location is not None:
        init[-1] = f"(atLocation agent1 {_location_id(game.receptacle(state.location).location)})"
    types = {_type_name(k) + " - otype" for k in ("knife", "butterknife")}
    types |= {_type_name(k) + " - rtype" for k in ("sinkbasin", "microwave", "fridge")}
    for r in game.receptacles:
        rid, lid = _entity_id(r.name), _location_id(r.location)
        names[rid], names[lid] = r.name, r.location
        objects += [f"{rid} - receptacle", f"{lid} - location"]
        types.add(f"{_type_name(r.kind)} - rtype")
        init += [f"(receptacleAtLocation {rid} {lid})", f"(receptacleType {rid} {_type_name(r.kind)})"]
        init += [f"(openable {rid})"] * r.openable + [f"(opened {rid})"] * (r.name in state.opened)
        for o in state.contents[r.name]:
            init += [f"(inReceptacle {_entity_id(o)} {rid})", f"(objectAtLocation {_entity_id(o)} {lid})"]
    for o in game.objects:
        oid = _entity_id(o.name)
        names[oid] = o.name
        objects.append(f"{oid} - object")
        types.add(f"{_type_name(o.kind)} - otype")
        init.append(f"(objectType {oid} {_type_name(o.kind)})")
        if "toggleable" not in o.affordances:
            init.append(f"(pickupable {oid})")
        init += [
            f"({a} {oid})"
            for a in ("cleanable", "heatable", "coolable", "sliceable", "toggleable")
            if a in o.affordances
        ]
        for attr, predicate in (
            ("clean", "isClean"),
            ("hot", "isHot"),
            ("cool", "isCool"),
            ("sliced", "isSliced"),
            ("toggled", "isToggled"),
            ("on", "isOn"),
        ):
            if o.name in getattr(state, attr):
                init.append(f"({predicate} {oid})")
    if state.holding is not None:
        init += [f"(holds agent1 {_entity_id(state.holding)})", "(holdsAny agent1)"]
    for recep_kind, obj_kinds in sorted(game.can_contain.items()):
        init += [f"(canContain {_type_name(recep_kind)} {_type_name(k)})" for k in sorted(obj_kinds)]
    problem = "\n".join(
        [
            "(define (problem agentrl)",
            "(:domain alfred)",
            "(:objects",
            *objects,
            *sorted(types),
            ")",
            "(:init",
            *init,
            ")",
            f"(:goal {_goal_pddl(game)})",
            ")",
        ]
    )
    return {
        "pddl_domain": domain,
        "grammar": twl2.replace("UNKNOWN GOAL", game.goal.text),
        "pddl_problem": problem,
        "solvable": True,
        "agentrl_names": names,
        "agentrl_task_type": game.goal.task_type,
    }


def _task_type_from_path(path: Path | None) -> str:
    # ALFWorld stores games as <task_type>-<Obj>-<MRecep>-<Recep>-<scene>/<trial>/game.tw-pddl.
    for part in reversed(path.parts if path else ()):
        head = part.split("-", 1)[0]
        if head in TASK_TYPES:
            return head
    return "unknown"


class TextWorldGame:
    """One `.tw-pddl` game running in TextWorld's PDDL engine, with ALFWorld's display names.

    Args:
        source: a path to a `.tw-pddl` file, or its parsed JSON (e.g. from `to_tw_pddl`).
    """

    def __init__(self, source: str | Path | Mapping[str, Any]):
        if not textworld_available():
            raise MissingExtraError(MISSING_EXTRA)
        import textworld
        from textworld.envs.pddl import PddlEnv

        path = None
        if isinstance(source, Mapping):
            data = dict(source)
        else:
            path = Path(source)
            if not path.is_file():
                raise FileNotFoundError(f"ALFWorld game file not found: {path}")
            try:
                data = json.loads(path.read_text())
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not valid JSON ({e})") from None
        missing = [k for k in ("pddl_domain", "grammar", "pddl_problem") if k not in data]
        if missing:
            raise ValueError(f"{path or 'tw-pddl data'}: not a .tw-pddl game (missing {', '.join(missing)})")
        self.task_type: str = data.get("agentrl_task_type") or _task_type_from_path(path)
        infos = textworld.EnvInfos(admissible_commands=True, won=True)
        self._env = PddlEnv(infos)
        self._env.load(data)
        self._rename(data.get("agentrl_names"))
        self._state: Any = None

    def _rename(self, names: Mapping[str, str] | None) -> None:
        infos = self._env._entity_infos
        if names is None:  # an original ALFWorld file: demangle as alfworld does
            from alfworld.agents.utils.misc import Demangler

            demangler = Demangler(game_infos=infos)
            for info in infos.values():
                info.name = demangler.demangle_alfred_name(info.id)
            return
        for entity_id, info in infos.items():
            info.name = names.get(entity_id, info.id)

    def reset(self) -> tuple[str, list[str], bool]:
        """Start over: the intro text, the admissible commands, whether the goal holds."""
        self._state = self._env.reset()
        return self._state.feedback, list(self._state["admissible_commands"]), bool(self._state["won"])

    def step(self, command: str) -> tuple[str, list[str], bool]:
        """Play `command`: the feedback, the admissible commands, whether the goal holds."""
        self._state, _, _ = self._env.step(command)
        return self._state.feedback, list(self._state["admissible_commands"]), bool(self._state["won"])

    def expert_action(self) -> str:
        """The next command of a Fast Downward plan from the current state (ALFWorld's "planner" expert)."""
        # Planned on demand, not per step: Fast Downward replanning costs far more than a step.
        plan = self._env._pddl_state.replan(self._env._entity_infos) if self._state is not None else []
        return plan[0] if plan else "look"
