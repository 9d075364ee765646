"""Curricula: which tasks each step plays, by a policy named once per run from `CURRICULA`, with state that resumes.

Each entry of `CURRICULA` names a policy class, its frozen options dataclass (defaults = the policy's defaults) and a
line for docs. A `Curriculum` holds the chosen one for the rollout scheduler, which asks it three things per step::

    seeds = curriculum.seeds(step)                     # the step's task seeds (its `seeds_for_step`)
    turns = curriculum.max_turns(step)                 # the step's cap on model calls per episode
    metrics = curriculum.observe(step, trajectories)   # after the rollout: update the state, report it

The policies (options in the config's ``curriculum`` section: ``{policy: success, options: {band: [0.2, 0.8]}}``):

- "uniform" (default): step s plays tasks ``seed_offset + s * prompts_per_step + i``, new ones every step, in seed
  order: the rule of every run before curricula, seed for seed.
- "success" (keep groups mixed): a group whose episodes all succeed or all fail has no advantage and teaches nothing,
  so draw more of what the policy solves only sometimes. Each level of the env (``over: level``) or each task of a
  fixed pool of ``tasks`` seeds (``over: task``) keeps the success rates of its last ``window`` groups; a level or task
  whose mean rate lies in ``band`` (or that was never played) weighs 1, any other ``explore``, and the step's tasks are
  drawn with probability proportional to the weights (levels with replacement, each a new task; pool tasks without
  replacement, so tasks repeat across steps, which is the point).
- "difficulty" (easiest first): the step plays new tasks at the current level of the env; once the mean success of
  the last ``window`` groups at that level reaches ``threshold`` the next step moves one level up (never down). A
  share ``review`` of the tasks is drawn uniformly from the levels below, so the easier skills stay trained.
- "horizon" (ScalingInter-RL, AgentGym-RL): tasks as "uniform", and the cap on model calls per episode follows
  ``schedule``, ``[[step, max_turns], ...]``: short episodes first, where a small policy's credit assignment is
  easy, longer ones as it learns. The largest entry may not pass ``env.max_turns``, which the engines' memory plan
  is sized for; the env's own step budget (ALFWorld's ``max_steps``) still ends episodes first.

What "difficulty" is: each env declares it (`agentrl.envs.difficulty.Difficulty`, the class attribute
`TextEnv.difficulty_levels`): its level names, easiest first, and a reset seed asks for a level by carrying it (task
`seed` at level index k is ``(k + 1) * 10^12 + seed``). Math's levels are its procedural levels, the code env's its
generator's levels, ALFWorld's and the phone GUI's their task types by the length of the expert's solution. An env
that declares none supports "uniform", "horizon" and "success" over a task pool; asking for more is a
`CurriculumError` naming the env and what it supports.

Determinism: a step's seeds depend only on the run seed, the step and the state (draws come from a generator seeded
with ``(run seed, step)``), and the state only on the outcomes of the steps before it: the scheduler observes each
rollout before it draws the next step's seeds, in lockstep and in async mode alike (the producer observes its own
rollouts in order). A step's seeds are drawn once and remembered, so asking again gives the same list. The state after
each of the last `HISTORY` observed steps is kept (an async producer runs at most ``max_staleness + 1`` steps ahead of
the trainer, and the run's config keeps that within `HISTORY`), so the checkpoint of step s holds the state that step
s + 1 starts from even when the producer has run ahead; a resume loads it and, given the same outcomes, draws exactly
the seeds the uninterrupted run drew.

Departures: ScalingInter-RL grows the horizon in phases of a fixed step count; here the phases are any step schedule.
"success" reads the idea of online difficulty filtering (keep what the policy solves sometimes) as a sampling weight
rather than a filter: the filter is dynamic sampling's job (`agentrl.rollout.refill`). With the refill on, the
curriculum observes every group the step drew, kept or not, and the refill's extra tasks of a level policy are drawn
at levels as the step's own (`Curriculum.refill_seed`); "success" over a task pool refuses the refill (its extra tasks
are new seeds, outside the pool).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentrl.envs.difficulty import Difficulty
from agentrl.records import Trajectory, group_by_id

__all__ = ["CURRICULA", "HISTORY", "CurriculumSpec", "Curriculum", "CurriculumError", "Tasks", "UniformOptions",
           "SuccessOptions", "DifficultyOptions", "HorizonOptions", "curriculum_options", "check_env", "check_run"]

log = logging.getLogger(__name__)

HISTORY = 256
"""Steps of remembered seeds and states kept behind the newest (an async producer runs at most `max_staleness` + 1
steps ahead of the trainer; the run's config keeps `max_staleness` below this)."""
_SALT = 0x63757272  # "curr": the curriculum's draws stay apart from other users of the run seed
_REFILL_SALT = 0x72666C6C  # "rfll": the levels of the refill's extra tasks


class CurriculumError(ValueError):
    """A curriculum that cannot run as asked: an unknown policy or option, a bad value, or an env without levels."""


# -- options -----------------------------------------------------------------------------------------------------


def _number(policy: str, key: str, value: Any, *, integer: bool = False) -> float | int:
    """`value` as a number (an int where `integer`); a bool is none."""
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        kind = "an integer" if integer else "a number"
        raise CurriculumError(f"option {key!r} of curriculum {policy!r} must be {kind}, got {value!r}")
    return int(value) if integer else float(value)


@dataclass(frozen=True)
class UniformOptions:
    """"uniform" has no options."""


@dataclass(frozen=True)
class SuccessOptions:
    """"success"'s options.

    Attributes:
        over: ``level`` (the env's difficulty levels, a new task each time) or ``task`` (a fixed pool of `tasks` seeds,
            ``seed_offset`` to ``seed_offset + tasks - 1``, tasks repeating across steps).
        band: ``[low, high]``: a mean group success rate in it counts as mixed (weight 1).
        window: the last groups of each level or task whose success rates make its mean.
        explore: the weight of a level or task outside the band, in (0, 1]: it is still drawn now and then, so its
            rate can move back into the band.
        tasks: the pool's size with ``over: task`` (at least ``prompts_per_step``); 0 with ``over: level``.
    """

    over: str = "level"
    band: tuple[float, float] = (0.2, 0.8)
    window: int = 8
    explore: float = 0.1
    tasks: int = 0

    def __post_init__(self) -> None:
        if self.over not in ("level", "task"):
            raise CurriculumError(f"option 'over' of curriculum 'success' must be level or task, got {self.over!r}")
        band = self.band
        if not isinstance(band, (list, tuple)) or len(band) != 2:
            raise CurriculumError(f"option 'band' of curriculum 'success' must be [low, high], got {band!r}")
        low, high = (_number("success", "band", b) for b in band)
        if not 0 <= low <= high <= 1:
            raise CurriculumError(f"option 'band' of curriculum 'success' must have 0 <= low <= high <= 1, got "
                                  f"{band!r}")
        object.__setattr__(self, "band", (low, high))
        object.__setattr__(self, "window", _number("success", "window", self.window, integer=True))
        object.__setattr__(self, "explore", _number("success", "explore", self.explore))
        object.__setattr__(self, "tasks", _number("success", "tasks", self.tasks, integer=True))
        if self.window < 1:
            raise CurriculumError(f"option 'window' of curriculum 'success' must be >= 1, got {self.window}")
        if not 0 < self.explore <= 1:
            raise CurriculumError(f"option 'explore' of curriculum 'success' must be in (0, 1], got {self.explore}")
        if self.over == "task" and self.tasks < 1:
            raise CurriculumError("curriculum 'success' with over: task needs options.tasks, the size of its task pool")
        if self.over == "level" and self.tasks:
            raise CurriculumError("option 'tasks' of curriculum 'success' is for over: task (a task pool); over: level "
                                  "draws a new task each time")


@dataclass(frozen=True)
class DifficultyOptions:
    """"difficulty"'s options.

    Attributes:
        start: the level to start at, by name (math: ``1``..``5``; ALFWorld: a task type); empty: the easiest.
        threshold: mean success of the last `window` groups at the current level that moves the run one level up.
        window: groups at the current level that the promotion looks at (and needs before it can happen).
        review: share of each step's tasks drawn uniformly from the levels below the current one, in [0, 1).
    """

    start: str = ""
    threshold: float = 0.7
    window: int = 8
    review: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.start, int) and not isinstance(self.start, bool):  # YAML reads `start: 2` as a number
            object.__setattr__(self, "start", str(self.start))
        if not isinstance(self.start, str):
            raise CurriculumError(f"option 'start' of curriculum 'difficulty' must be a level name, got {self.start!r}")
        object.__setattr__(self, "threshold", _number("difficulty", "threshold", self.threshold))
        object.__setattr__(self, "window", _number("difficulty", "window", self.window, integer=True))
        object.__setattr__(self, "review", _number("difficulty", "review", self.review))
        if not 0 < self.threshold <= 1:
            raise CurriculumError(f"option 'threshold' of curriculum 'difficulty' must be in (0, 1], got "
                                  f"{self.threshold}")
        if self.window < 1:
            raise CurriculumError(f"option 'window' of curriculum 'difficulty' must be >= 1, got {self.window}")
        if not 0 <= self.review < 1:
            raise CurriculumError(f"option 'review' of curriculum 'difficulty' must be in [0, 1), got {self.review}")


@dataclass(frozen=True)
class HorizonOptions:
    """"horizon"'s options.

    Attributes:
        schedule: ``[[step, max_turns], ...]``, steps increasing from 0: from each step on, episodes get that many
            model calls (until the next entry). Required.
    """

    schedule: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        example = "e.g. [[0, 10], [100, 25], [200, 50]]"
        entries = self.schedule
        if not isinstance(entries, (list, tuple)) or not entries:
            raise CurriculumError(f"curriculum 'horizon' needs options.schedule, [[step, max_turns], ...] ({example})")
        pairs = []
        for entry in entries:
            if not isinstance(entry, (list, tuple)) or len(entry) != 2:
                raise CurriculumError(f"options.schedule of curriculum 'horizon' holds [step, max_turns] pairs "
                                      f"({example}), got {entry!r}")
            pairs.append(tuple(_number("horizon", "schedule", v, integer=True) for v in entry))
        steps = [s for s, _ in pairs]
        if steps[0] != 0 or any(b <= a for a, b in zip(steps, steps[1:])):
            raise CurriculumError(f"options.schedule of curriculum 'horizon' must start at step 0 with increasing "
                                  f"steps ({example}), got {[list(p) for p in pairs]}")
        if any(turns < 1 for _, turns in pairs):
            raise CurriculumError(f"options.schedule of curriculum 'horizon' needs max_turns >= 1, got "
                                  f"{[list(p) for p in pairs]}")
        object.__setattr__(self, "schedule", tuple(pairs))


# -- the policies ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tasks:
    """What a policy draws from: the run's task seeds and budgets, and the env's levels.

    Attributes:
        env_id: the env (for messages).
        seed_offset: ``env.seed_offset``.
        prompts_per_step: tasks per step.
        max_turns: ``env.max_turns``, the run's cap on model calls per episode.
        levels: the env's declared difficulty, or None.
    """

    env_id: str
    seed_offset: int
    prompts_per_step: int
    max_turns: int
    levels: Difficulty | None = None

    def fresh(self, step: int) -> list[int]:
        """Today's rule: step s plays ``seed_offset + s * prompts_per_step + i``."""
        return [self.seed_offset + step * self.prompts_per_step + i for i in range(self.prompts_per_step)]


@dataclass(frozen=True)
class Group:
    """One observed group: its task seed and the share of its episodes that succeeded."""

    seed: int
    success: float


class Policy:
    """A task-sampling policy: its seeds and horizon per step, and its state as plain JSON values.

    Subclasses set `options_class`, and override what they change: `seeds` (default: the uniform rule), `max_turns`
    (default: ``env.max_turns``), `observe` (default: no state, no metrics), `state` and `load`.
    """

    def __init__(self, opts: Any, tasks: Tasks):
        self.opts, self.tasks = opts, tasks

    def seeds(self, step: int, rng: np.random.Generator) -> list[int]:
        """The step's task seeds; `rng` is seeded with (run seed, step)."""
        return self.tasks.fresh(step)

    def refill_seed(self, step: int, j: int, seed: int, rng: np.random.Generator) -> int:
        """The refill's `j`-th extra task `seed` as this policy plays it (default: as is)."""
        return seed

    def max_turns(self, step: int) -> int:
        """The step's cap on model calls per episode."""
        return self.tasks.max_turns

    def observe(self, step: int, groups: Sequence[Group]) -> dict[str, float]:
        """Update the state with the step's groups; the step's metrics."""
        return {}

    def state(self) -> dict[str, Any]:
        """The state, as JSON values."""
        return {}

    def load(self, state: Mapping[str, Any]) -> None:
        """Put a `state` back."""


class UniformPolicy(Policy):
    """Every step new tasks, in seed order."""


class HorizonPolicy(Policy):
    """Uniform tasks; the cap on model calls per episode follows the step schedule."""

    def max_turns(self, step: int) -> int:
        """The schedule's entry for `step`: the last one whose step is <= it."""
        return next(turns for start, turns in reversed(self.opts.schedule) if start <= step)

    def observe(self, step: int, groups: Sequence[Group]) -> dict[str, float]:
        """The horizon in use; no state (the schedule is a function of the step)."""
        return {"curriculum_max_turns": float(self.max_turns(step))}


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


class _Recent:
    """The success rates of the last `window` groups of each unit (a level name, or a task's pool index)."""

    def __init__(self, window: int):
        self.window = window
        self.rates: dict[str, list[float]] = {}

    def add(self, unit: str, rate: float) -> None:
        rates = self.rates.setdefault(unit, [])
        rates.append(rate)
        del rates[:-self.window]

    def mean(self, unit: str) -> float | None:
        rates = self.rates.get(unit)
        return _mean(rates) if rates else None


class SuccessPolicy(Policy):
    """Levels or pool tasks weighted 1 when their recent mean success is in the band (or unknown), else `explore`."""

    def __init__(self, opts: SuccessOptions, tasks: Tasks):
        super().__init__(opts, tasks)
        self.recent = _Recent(opts.window)

    def _units(self) -> list[str]:
        if self.opts.over == "level":
            assert self.tasks.levels is not None  # check_env refused an env without levels
            return list(self.tasks.levels.levels)
        return [str(j) for j in range(self.opts.tasks)]

    def weights(self) -> np.ndarray:
        """The weight of each level (or pool task), in order."""
        low, high = self.opts.band
        means = [self.recent.mean(u) for u in self._units()]
        return np.array([1.0 if m is None or low <= m <= high else self.opts.explore for m in means])

    def probabilities(self) -> np.ndarray:
        """The weights normalized: each draw's probability of each level (or, for one draw, each pool task)."""
        w = self.weights()
        return w / w.sum()

    def seeds(self, step: int, rng: np.random.Generator) -> list[int]:
        """Levels with replacement, each a new task; or pool tasks without replacement."""
        p, n = self.probabilities(), self.tasks.prompts_per_step
        if self.opts.over == "task":
            return [self.tasks.seed_offset + int(j) for j in rng.choice(len(p), size=n, replace=False, p=p)]
        levels = self.tasks.levels
        return [levels.task_seed(seed, int(k)) for seed, k in zip(self.tasks.fresh(step), rng.choice(len(p), n, p=p))]

    def refill_seed(self, step: int, j: int, seed: int, rng: np.random.Generator) -> int:
        """Over levels: the extra task at a level drawn as the step's own; over a pool: as is.

        The run's config refuses a refill with a pool: its extra tasks would be new seeds, outside the pool.
        """
        if self.opts.over == "task":
            return seed
        return self.tasks.levels.task_seed(seed, int(rng.choice(len(self.tasks.levels.levels), p=self.probabilities())))

    def observe(self, step: int, groups: Sequence[Group]) -> dict[str, float]:
        """Record each group's success under its level (or pool task); per-level means, or pool counts.

        A group of a seed outside the units (a plain seed in level mode, one outside the pool) is not recorded.
        """
        played = []  # level indices of the step's groups
        for g in groups:
            if self.opts.over == "level":
                level, _ = self.tasks.levels.split(g.seed)
                if level is not None:
                    self.recent.add(level, g.success)
                    played.append(self.tasks.levels.index(level))
            elif 0 <= g.seed - self.tasks.seed_offset < self.opts.tasks:
                self.recent.add(str(g.seed - self.tasks.seed_offset), g.success)
        low, high = self.opts.band
        means = {u: self.recent.mean(u) for u in self._units()}
        known = {u: m for u, m in means.items() if m is not None}
        mixed = float(sum(low <= m <= high for m in known.values()))
        if self.opts.over == "task":
            return {"curriculum_tasks_seen": float(len(known)), "curriculum_tasks_mixed": mixed}
        return {"curriculum_levels_mixed": mixed, **({"curriculum_level_mean": _mean(played)} if played else {}),
                **{f"curriculum_level_success_{u}": m for u, m in known.items()}}

    def state(self) -> dict[str, Any]:
        """The recent success rates by level name (or pool index)."""
        return {"recent": copy.deepcopy(self.recent.rates)}

    def load(self, state: Mapping[str, Any]) -> None:
        """Put the recent success rates back."""
        self.recent.rates = {str(u): [float(r) for r in rates][-self.opts.window:]
                             for u, rates in state.get("recent", {}).items()}


class DifficultyPolicy(Policy):
    """New tasks at the current level (a `review` share below it); one level up once its recent success passes."""

    def __init__(self, opts: DifficultyOptions, tasks: Tasks):
        super().__init__(opts, tasks)
        self.levels: Difficulty = tasks.levels
        self.level = self.levels.index(opts.start) if opts.start else 0
        self.recent = _Recent(opts.window)

    def _draw_level(self, u: float, below: int) -> int:
        return below if self.level > 0 and u < self.opts.review else self.level

    def seeds(self, step: int, rng: np.random.Generator) -> list[int]:
        """Each task at the current level, or with probability `review` at a level drawn uniformly below it."""
        n = self.tasks.prompts_per_step
        u, below = rng.random(n), rng.integers(0, max(self.level, 1), n)  # both drawn always: a steady stream
        return [self.levels.task_seed(seed, self._draw_level(float(u[i]), int(below[i])))
                for i, seed in enumerate(self.tasks.fresh(step))]

    def refill_seed(self, step: int, j: int, seed: int, rng: np.random.Generator) -> int:
        """The extra task at a level drawn as the step's own."""
        u, below = rng.random(), rng.integers(0, max(self.level, 1))
        return self.levels.task_seed(seed, self._draw_level(float(u), int(below)))

    def observe(self, step: int, groups: Sequence[Group]) -> dict[str, float]:
        """Record each group under its level; move up when the current level's recent mean reaches the threshold."""
        used = self.level
        for g in groups:
            level, _ = self.levels.split(g.seed)
            if level is not None:
                self.recent.add(level, g.success)
        current = self.levels.levels[self.level]
        recent = self.recent.rates.get(current, [])
        if (self.level + 1 < len(self.levels.levels) and len(recent) >= self.opts.window
                and _mean(recent) >= self.opts.threshold):
            self.level += 1
            log.info("curriculum: level %s reached mean success %.2f over its last %d groups at step %d; moving up to "
                     "%s", current, _mean(recent), len(recent), step, self.levels.levels[self.level])
        known = {u: self.recent.mean(u) for u in self.levels.levels}
        return {"curriculum_level": float(used),
                **{f"curriculum_level_success_{u}": m for u, m in known.items() if m is not None}}

    def state(self) -> dict[str, Any]:
        """The current level (its name) and the recent success rates by level."""
        return {"level": self.levels.levels[self.level], "recent": copy.deepcopy(self.recent.rates)}

    def load(self, state: Mapping[str, Any]) -> None:
        """Put the level and the recent success rates back."""
        self.level = self.levels.index(str(state["level"]))
        self.recent.rates = {str(u): [float(r) for r in rates][-self.opts.window:]
                             for u, rates in state.get("recent", {}).items()}


# -- the registry ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CurriculumSpec:
    """A registered curriculum policy.

    Attributes:
        policy: its class (a `Policy`).
        options: its frozen options dataclass; the defaults are the policy's defaults.
        description: one line for docs.
    """

    policy: type[Policy]
    options: type
    description: str

    def levels_needed(self, opts: Any) -> bool:
        """Whether this policy, with `opts`, draws tasks by the env's levels."""
        return self.policy is DifficultyPolicy or (self.policy is SuccessPolicy and opts.over == "level")


CURRICULA: dict[str, CurriculumSpec] = {
    "uniform": CurriculumSpec(UniformPolicy, UniformOptions, "every step new tasks in seed order (the default)"),
    "success": CurriculumSpec(SuccessPolicy, SuccessOptions,
                              "levels or pool tasks whose recent group success is mixed, so groups stay mixed"),
    "difficulty": CurriculumSpec(DifficultyPolicy, DifficultyOptions,
                                 "the env's levels easiest first, one up as success at the current one passes"),
    "horizon": CurriculumSpec(HorizonPolicy, HorizonOptions,
                              "max turns per episode growing over training by a step schedule (ScalingInter-RL)"),
}


def curriculum_options(name: str, **options: Any) -> Any:
    """Build the typed options of curriculum `name`, rejecting options it does not have.

    Raises:
        CurriculumError: an unknown policy or option (naming the valid ones), or a bad value.
    """
    if name not in CURRICULA:
        raise CurriculumError(f"unknown curriculum policy {name!r}; choose one of {', '.join(CURRICULA)}")
    cls = CURRICULA[name].options
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(map(str, options)) - set(valid))
    if unknown:
        raise CurriculumError(f"unknown option(s) {', '.join(map(repr, unknown))} for curriculum {name!r}; valid "
                              f"options: {', '.join(valid) or '(none)'}")
    return cls(**options)


def supported_policies(levels: Difficulty | None) -> str:
    """The policies an env with (or without) declared levels supports, as a phrase for messages."""
    if levels is not None:
        return ", ".join(CURRICULA)
    return "uniform, horizon, and success with options.over: task (a task pool)"


def check_env(name: str, opts: Any, *, env_id: str, levels: Difficulty | None) -> None:
    """Refuse a curriculum the env cannot play.

    Raises:
        CurriculumError: a level policy on an env that declares no levels (naming the env and the policies it
            supports), or a start level the env does not have.
    """
    if CURRICULA[name].levels_needed(opts) and levels is None:
        raise CurriculumError(f"env {env_id!r} declares no difficulty levels (TextEnv.difficulty_levels), so "
                              f"curriculum policy {name!r} cannot run on it; it supports: {supported_policies(levels)}")
    if name == "difficulty" and opts.start:
        try:
            levels.index(opts.start)
        except ValueError as e:
            raise CurriculumError(f"options.start of curriculum 'difficulty' on env {env_id!r}: {e}") from None


def check_run(name: str, opts: Any, *, prompts_per_step: int, max_turns: int) -> None:
    """Refuse a curriculum the run cannot play (the config checks it before any env loads).

    Raises:
        CurriculumError: a task pool smaller than a step, or a horizon past ``env.max_turns``.
    """
    if name == "success" and opts.over == "task" and opts.tasks < prompts_per_step:
        raise CurriculumError(f"options.tasks of curriculum 'success' ({opts.tasks}) must be >= "
                              f"scheduler.prompts_per_step ({prompts_per_step}): a step draws distinct pool tasks")
    if name == "horizon":
        longest = max(turns for _, turns in opts.schedule)
        if longest > max_turns:
            raise CurriculumError(f"options.schedule of curriculum 'horizon' reaches {longest} turns, past "
                                  f"env.max_turns {max_turns}, which the run's memory plan is sized for: set "
                                  f"env.max_turns to {longest}")


# -- what the scheduler holds -------------------------------------------------------------------------------------


def _groups(trajectories: Sequence[Trajectory]) -> list[Group]:
    """One `Group` per group id, in order of first appearance: its seed and the share of successes."""
    return [Group(ts[0].seed, sum(t.success for t in ts) / len(ts)) for ts in group_by_id(trajectories).values()]


class Curriculum:
    """The run's task-sampling policy, its remembered seeds and its saved states; safe across the producer thread.

    Args:
        policy: a key of `CURRICULA`.
        options: the policy's options (the config's ``curriculum.options``).
        tasks: the run's task seeds, budgets and the env's levels.
        run_seed: the run's seed: the policy's draws come from ``(run_seed, step)``.

    Raises:
        CurriculumError: as `curriculum_options`, `check_env` and `check_run`.
    """

    def __init__(self, policy: str, options: Mapping[str, Any], tasks: Tasks, run_seed: int):
        opts = curriculum_options(policy, **options)
        check_env(policy, opts, env_id=tasks.env_id, levels=tasks.levels)
        check_run(policy, opts, prompts_per_step=tasks.prompts_per_step, max_turns=tasks.max_turns)
        self.name, self.opts, self.tasks, self.run_seed = policy, opts, tasks, run_seed
        self.policy: Policy = CURRICULA[policy].policy(opts, tasks)
        self._lock = threading.Lock()
        self._seeds: dict[int, list[int]] = {}
        self._after: dict[int, dict[str, Any]] = {}  # the state after observing each step
        self._initial = copy.deepcopy(self.policy.state())
        self._forgotten = -1  # states of steps up to this one were dropped (older than HISTORY)

    @classmethod
    def for_env(cls, policy: str, options: Mapping[str, Any], *, env_id: str, levels: Difficulty | None,
                seed_offset: int, prompts_per_step: int, max_turns: int, run_seed: int) -> Curriculum:
        """The curriculum of a run on env `env_id`, with the levels the env declares.

        The caller looks `levels` up (`agentrl.envs.registry.difficulty_of`): the curriculum sits below the registry.
        """
        return cls(policy, options, Tasks(env_id, seed_offset, prompts_per_step, max_turns, levels), run_seed)

    def _rng(self, step: int, *salt: int) -> np.random.Generator:
        return np.random.default_rng(np.random.SeedSequence([self.run_seed % 2**64, step, _SALT, *salt]))

    def seeds(self, step: int) -> list[int]:
        """The task seeds of `step`: drawn once from the state the step starts from, then remembered."""
        with self._lock:
            if step not in self._seeds:
                self._seeds[step] = self.policy.seeds(step, self._rng(step))
                for old in [s for s in self._seeds if s < step - HISTORY]:
                    del self._seeds[old]
            return list(self._seeds[step])

    def refill_seed(self, step: int, j: int, seed: int) -> int:
        """The refill's `j`-th extra task of `step` (plain seed `seed`) as the policy plays it.

        A level policy plays it at a level drawn as the step's own are, from ``(run seed, step, j)``.
        """
        with self._lock:
            return self.policy.refill_seed(step, j, seed, self._rng(step, _REFILL_SALT, j))

    def max_turns(self, step: int) -> int:
        """The cap on model calls per episode at `step`."""
        return self.policy.max_turns(step)

    def observe(self, step: int, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """Update the state with the step's groups (every group drawn, kept or not); the step's metrics."""
        with self._lock:
            metrics = self.policy.observe(step, _groups(trajectories))
            self._after[step] = copy.deepcopy(self.policy.state())
            for old in [s for s in self._after if s < step - HISTORY]:
                del self._after[old]
                self._forgotten = max(self._forgotten, old)
            return metrics

    def state_dict(self, step: int) -> dict[str, Any]:
        """The state that step ``step + 1`` starts from (what the checkpoint of `step` saves), as JSON values."""
        with self._lock:
            if step <= self._forgotten:
                raise RuntimeError(f"curriculum: the state after step {step} is older than the {HISTORY} steps kept")
            done = [s for s in self._after if s <= step]
            state = self._after[max(done)] if done else self._initial
            return {"policy": self.name, "step": step, "state": copy.deepcopy(state)}

    def load_state_dict(self, saved: Mapping[str, Any] | None) -> None:
        """Continue from a `state_dict` (a checkpoint's); one of another policy, or none, leaves the state fresh."""
        if not saved:
            if not isinstance(self.policy, (UniformPolicy, HorizonPolicy)):
                log.warning("curriculum %r: the checkpoint holds no curriculum state; it starts fresh", self.name)
            return
        if saved.get("policy") != self.name:
            log.warning("curriculum %r: the checkpoint holds the state of curriculum %r; %r starts fresh", self.name,
                        saved.get("policy"), self.name)
            return
        with self._lock:
            self.policy.load(saved.get("state", {}))
            self._seeds.clear()
            self._after = {int(saved["step"]): copy.deepcopy(self.policy.state())}

