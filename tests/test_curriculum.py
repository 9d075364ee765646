"""Curricula (issue 44): each policy draws what it says, uniform is today's seed rule, the state resumes exactly.

Distribution checks count many draws and allow 5 binomial standard deviations: a fair draw fails one in ~3.5 million
times, while a wrong distribution (uniform instead of weighted, review off, the band ignored) misses by far more.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import numpy as np
import pytest
from test_pool import PromptHashEngine

import agentrl
from agentrl.config import (
    AgentConfig,
    ConfigError,
    CurriculumConfig,
    EnvConfig,
    LossConfig,
    RunConfig,
    SchedulerConfig,
)
from agentrl.curriculum import CURRICULA, HISTORY, Curriculum, CurriculumError, Tasks
from agentrl.engine.base import SamplingParams
from agentrl.engine.requests import BatchedRequests
from agentrl.envs.core import TextEnv
from agentrl.envs.difficulty import LEVEL_STRIDE, Difficulty
from agentrl.envs.math import MathEnv
from agentrl.recipes.setup import build_curriculum
from agentrl.records import Trajectory
from agentrl.rollout.pool import EnvMaker
from agentrl.rollout.scheduler import RolloutScheduler
from agentrl.training.checkpoint import STATE_FILE, TrainerState, read_trainer_state

MATH_LEVELS = MathEnv.difficulty_levels


def _within(count: int, n: int, p: float) -> bool:
    """`count` of `n` draws is within 5 binomial standard deviations of `n * p`."""
    return abs(count - n * p) <= 5 * math.sqrt(n * p * (1 - p)) + 1e-9


def _curriculum(policy: str, options: dict | None = None, *, levels: Difficulty | None = MATH_LEVELS, per_step: int = 4,
                offset: int = 0, max_turns: int = 10, run_seed: int = 0) -> Curriculum:
    return Curriculum(policy, options or {}, Tasks("test-env", offset, per_step, max_turns, levels), run_seed)


def _trajectories(groups: list[tuple[int, float]], size: int = 4) -> list[Trajectory]:
    """`size` episodes per (seed, success rate) group, round(rate * size) of them successes."""
    out = []
    for g, (seed, rate) in enumerate(groups):
        wins = round(rate * size)
        out += [Trajectory("test-env", seed, g, (), "", float(i < wins), i < wins, True, False) for i in range(size)]
    return out


def _level_index(seed: int) -> int:
    return seed // LEVEL_STRIDE - 1


# -- uniform is today's rule ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("offset", "per_step"), [(0, 4), (7, 3), (1000, 1)])
def test_uniform_is_todays_seed_rule_exactly(offset, per_step):
    cfg = RunConfig(env=EnvConfig(id="math", seed_offset=offset), scheduler=SchedulerConfig(prompts_per_step=per_step))
    assert cfg.curriculum == CurriculumConfig(policy="uniform", options={})  # the default
    curriculum = build_curriculum(cfg, None)
    for step in (0, 1, 2, 17, 500):
        assert curriculum.seeds(step) == [offset + step * per_step + i for i in range(per_step)]
        assert curriculum.max_turns(step) == cfg.env.max_turns
        assert curriculum.observe(step, _trajectories([(offset + step * per_step, 1.0)])) == {}  # no metrics, no state
    assert curriculum.state_dict(500) == {"policy": "uniform", "step": 500, "state": {}}


# -- each policy's distribution ------------------------------------------------------------------------------------


def test_success_over_levels_draws_in_proportion_to_the_band_weights():
    """Levels in the band or never seen weigh 1, the others `explore`; each task is new (the uniform rule's seed)."""
    curriculum = _curriculum("success", {"band": [0.2, 0.8], "explore": 0.1, "window": 8})
    curriculum.load_state_dict({"policy": "success", "step": 0, "state": {"recent": {
        "1": [1.0] * 8, "2": [0.5] * 8, "4": [0.0] * 8, "5": [0.9, 1.0, 0.95, 1.0]}}})  # "3" never played
    expected = np.array([0.1, 1.0, 1.0, 0.1, 0.1]) / 2.3
    counts, steps = np.zeros(5, int), 2500
    for step in range(1, steps + 1):
        seeds = curriculum.seeds(step)
        assert [s % LEVEL_STRIDE for s in seeds] == [step * 4 + i for i in range(4)]
        for s in seeds:
            counts[_level_index(s)] += 1
    n = steps * 4
    assert all(_within(int(c), n, float(p)) for c, p in zip(counts, expected)), (counts, expected * n)


def test_success_over_a_task_pool_draws_distinct_tasks_by_weight():
    curriculum = _curriculum("success", {"over": "task", "tasks": 5, "band": [0.25, 0.75], "explore": 0.2},
                             levels=None, per_step=1, offset=100)
    # pool task 0 always solved, 1 mixed, 2 never solved, 3 and 4 never played: weights 0.2, 1, 0.2, 1, 1
    curriculum.observe(0, _trajectories([(100, 1.0), (101, 0.5), (102, 0.0)]))
    expected = np.array([0.2, 1.0, 0.2, 1.0, 1.0]) / 3.4
    counts = np.zeros(5, int)
    for step in range(1, 8001):
        counts[curriculum.seeds(step)[0] - 100] += 1
    assert all(_within(int(c), 8000, float(p)) for c, p in zip(counts, expected)), (counts, expected * 8000)
    wide = _curriculum("success", {"over": "task", "tasks": 6}, levels=None, per_step=4, offset=100)
    for step in range(50):
        seeds = wide.seeds(step)
        assert len(set(seeds)) == 4 and all(100 <= s < 106 for s in seeds)


def test_difficulty_draws_the_current_level_and_a_review_share_below():
    curriculum = _curriculum("difficulty", {"start": 3, "review": 0.25})  # level "3" is index 2
    counts, steps = np.zeros(5, int), 2500
    for step in range(steps):
        for s in curriculum.seeds(step):
            counts[_level_index(s)] += 1
    n = steps * 4
    assert counts[3] == counts[4] == 0
    assert _within(int(counts[2]), n, 0.75) and _within(int(counts[0]), n, 0.125) and _within(int(counts[1]), n, 0.125)
    no_review = _curriculum("difficulty", {"start": "2"})
    assert {_level_index(s) for step in range(100) for s in no_review.seeds(step)} == {1}


def test_difficulty_steps_up_once_the_window_passes_the_threshold_and_never_past_the_top():
    levels = Difficulty(("easy", "hard"), "test levels")
    curriculum = _curriculum("difficulty", {"threshold": 0.75, "window": 4}, levels=levels, per_step=2)
    at = lambda step: {_level_index(s) for s in curriculum.seeds(step)}  # noqa: E731
    assert at(0) == {0}
    m = curriculum.observe(0, _trajectories([(s, 1.0) for s in curriculum.seeds(0)]))
    assert m == {"curriculum_level": 0.0, "curriculum_level_success_easy": 1.0}  # 2 groups < window 4: no move yet
    assert at(1) == {0}
    curriculum.observe(1, _trajectories([(s, 0.5) for s in curriculum.seeds(1)]))  # mean 0.75 over 4: moves up
    assert at(2) == {1}
    m = curriculum.observe(2, _trajectories([(s, 1.0) for s in curriculum.seeds(2)] * 2))
    assert m["curriculum_level"] == 1.0 and at(3) == {1}  # the top level stays
    stuck = _curriculum("difficulty", {"threshold": 0.75, "window": 4}, levels=levels, per_step=2)
    for step in range(10):
        stuck.observe(step, _trajectories([(s, 0.5) for s in stuck.seeds(step)]))
    assert {_level_index(s) for s in stuck.seeds(10)} == {0}


def test_horizon_follows_its_schedule_with_uniform_tasks():
    curriculum = _curriculum("horizon", {"schedule": [[0, 2], [3, 5], [6, 9]]}, max_turns=9)
    assert [curriculum.max_turns(s) for s in range(9)] == [2, 2, 2, 5, 5, 5, 9, 9, 9]
    assert curriculum.seeds(4) == [16, 17, 18, 19]
    assert curriculum.observe(4, []) == {"curriculum_max_turns": 5.0}


def test_draws_depend_on_the_run_seed_and_the_step_only():
    def run(run_seed: int) -> list[list[int]]:
        c = _curriculum("success", {"over": "task", "tasks": 20}, levels=None, run_seed=run_seed)
        return [c.seeds(step) for step in range(5)]

    assert run(3) == run(3) and run(3) != run(4)
    c = _curriculum("success", {"over": "task", "tasks": 20}, levels=None)
    assert c.seeds(2) == c.seeds(2)  # drawn once, remembered


# -- state through save and resume ---------------------------------------------------------------------------------


def _outcome(seed: int) -> float:
    """A fixed success rate per task: lower at higher levels, varied within a level."""
    level, task = seed // LEVEL_STRIDE, seed % LEVEL_STRIDE
    return min(1.0, max(0.0, (task * 37 % 5) / 4 - 0.25 * max(level - 2, 0) + (0.5 if level == 1 else 0.0)))


POLICIES = {
    "uniform": {},
    "success-level": {"window": 3},
    "success-task": {"over": "task", "tasks": 12, "window": 2},
    "difficulty": {"threshold": 0.6, "window": 4, "review": 0.3},
    "horizon": {"schedule": [[0, 3], [5, 6]]},
}


@pytest.mark.parametrize("name", POLICIES)
def test_a_resumed_curriculum_draws_exactly_the_uninterrupted_seeds(name, tmp_path):
    policy = name.split("-")[0]

    def play(c: Curriculum, steps: range) -> list[list[int]]:
        drawn = []
        for step in steps:
            seeds = c.seeds(step)
            drawn.append(seeds)
            c.observe(step, _trajectories([(s, _outcome(s)) for s in seeds]))
        return drawn

    whole = play(_curriculum(policy, POLICIES[name], run_seed=5), range(20))
    first = _curriculum(policy, POLICIES[name], run_seed=5)
    play(first, range(8))
    state = TrainerState(step=7, curriculum=first.state_dict(7))
    (tmp_path / STATE_FILE).write_text(json.dumps(asdict(state)))  # as save_checkpoint writes it
    saved = read_trainer_state(tmp_path).curriculum
    assert saved == json.loads(json.dumps(first.state_dict(7)))
    resumed = _curriculum(policy, POLICIES[name], run_seed=5)
    resumed.load_state_dict(saved)
    assert play(resumed, range(8, 20)) == whole[8:]
    if policy in ("success", "difficulty"):  # the state matters: a fresh curriculum would draw otherwise
        assert play(_curriculum(policy, POLICIES[name], run_seed=5), range(8, 20)) != whole[8:]


def test_the_checkpoint_keeps_the_state_of_its_step_when_the_producer_ran_ahead():
    c = _curriculum("difficulty", {"threshold": 0.5, "window": 4})
    states = {}
    for step in range(4):
        c.observe(step, _trajectories([(s, 1.0) for s in c.seeds(step)]))
        states[step] = c.state_dict(step)["state"]
    assert states[0]["level"] == "2" and states[3]["level"] == "5"
    assert [c.state_dict(step)["state"] for step in range(4)] == [states[s] for s in range(4)]  # asked later: the same


def test_a_checkpoint_without_curriculum_state_reads_and_starts_fresh(tmp_path):
    (tmp_path / STATE_FILE).write_text(json.dumps({"step": 3, "backend": "single", "world_size": 1,
                                                   "shuffle_rng": [], "torch_rng": []}))
    state = read_trainer_state(tmp_path)
    assert state.curriculum is None
    c = _curriculum("difficulty", {"start": "2"})
    c.load_state_dict(state.curriculum)
    c.load_state_dict({"policy": "success", "step": 3, "state": {"recent": {}}})  # another policy's: ignored
    assert {_level_index(s) for s in c.seeds(4)} == {1}


# -- through the scheduler -----------------------------------------------------------------------------------------


class LevelEnv(TextEnv):
    """Three levels; the success of a task depends on its level and seed only, never on the replies."""

    system_prompt = "Say anything."
    difficulty_levels = Difficulty(("easy", "mid", "hard"), "test levels")

    def reset(self, *, seed=None, options=None):
        super(TextEnv, self).reset(seed=seed)
        level, task = self.difficulty_levels.split(seed)
        self.win = {None: False, "easy": True, "mid": task % 2 == 0, "hard": False}[level]
        return f"task {seed}", {"task_type": level or ""}

    def step(self, action):
        return "done", float(self.win), True, False, {"success": self.win}

    def expert_action(self):
        return "ok"


def _scheduler(tokenizer, curriculum: Curriculum, start: int, **kwargs) -> RolloutScheduler:
    engine = BatchedRequests(PromptHashEngine(tokenizer))
    return RolloutScheduler("level", {}, engine, lambda: [], tokenizer, seeds_for_step=curriculum.seeds,
                            sampling_for_step=lambda s: SamplingParams(temperature=0), group_size=2,
                            rollout_kwargs={"max_turns": 3}, maker=EnvMaker("level", {}, entry_point=LevelEnv),
                            start_step=start, curriculum=curriculum, **kwargs)


def _steps(sched: RolloutScheduler, steps: range) -> tuple[list[list[int]], list[dict]]:
    seeds, metrics = [], []
    for step in steps:
        result = sched.rollout(step)
        seeds.append(sorted({t.seed for t in result.trajectories}))
        metrics.append(result.stats.metrics())
        sched.updated(step)
    return seeds, metrics


def _level_curriculum() -> Curriculum:
    levels = LevelEnv.difficulty_levels
    return Curriculum("difficulty", {"threshold": 0.5, "window": 3, "review": 0.3},
                      Tasks("level", 0, 3, 3, levels), run_seed=1)


def test_the_scheduler_resumes_the_curriculum_exactly_in_lockstep_and_async(qwen3_tokenizer):
    whole = _scheduler(qwen3_tokenizer, _level_curriculum(), 0)
    try:
        expected, metrics = _steps(whole, range(6))
    finally:
        whole.close()
    assert [m["curriculum_level"] for m in metrics][:2] == [0.0, 1.0]  # easy is solved: up after one step
    assert {_level_index(s) for s in expected[0]} == {0} and 1 in {_level_index(s) for s in expected[1]}
    for mode in ({}, {"async_rollout": True, "max_staleness": 2, "stop_step": 6}):
        first_curriculum = _level_curriculum()
        first = _scheduler(qwen3_tokenizer, first_curriculum, 0, **mode)
        try:
            got, _ = _steps(first, range(3))
            if mode:  # the producer runs ahead to step 5 (the bound allows it): the checkpoint of step 2 must not
                first._thread.join(timeout=60)  # see its steps 3-5
                assert sorted(first._produced) == [3, 4, 5]
            saved = json.loads(json.dumps(first_curriculum.state_dict(2)))  # what the checkpoint of step 2 holds
        finally:
            first.close()
        resumed_curriculum = _level_curriculum()
        resumed_curriculum.load_state_dict(saved)
        resumed = _scheduler(qwen3_tokenizer, resumed_curriculum, 3, **mode)
        try:
            more, _ = _steps(resumed, range(3, 6))
        finally:
            resumed.close()
        assert got + more == expected, mode


def test_the_scheduler_caps_turns_by_the_horizon_in_use(qwen3_tokenizer):
    from test_pool import WalkEnv

    curriculum = Curriculum("horizon", {"schedule": [[0, 1], [2, 3]]}, Tasks("walk", 0, 2, 3), run_seed=0)
    sched = RolloutScheduler("walk", {"length": 10}, BatchedRequests(PromptHashEngine(qwen3_tokenizer)), lambda: [],
                             qwen3_tokenizer, seeds_for_step=curriculum.seeds,
                             sampling_for_step=lambda s: SamplingParams(temperature=0), group_size=2,
                             rollout_kwargs={"max_turns": 3}, curriculum=curriculum,
                             maker=EnvMaker("walk", {"length": 10}, entry_point=WalkEnv))
    try:
        for step, turns in ((0, 1), (1, 1), (2, 3)):
            result = sched.rollout(step)
            assert {len(t.turns) for t in result.trajectories} == {turns}
            assert result.stats.metrics()["curriculum_max_turns"] == turns
            assert sorted({t.seed for t in result.trajectories}) == [2 * step, 2 * step + 1]
    finally:
        sched.close()


# -- refusals ------------------------------------------------------------------------------------------------------


def test_a_bad_policy_or_option_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match=r"curriculum.policy must be one of uniform, success, difficulty, horizon, "
                                          r"got 'sucess'"):
        RunConfig(curriculum=CurriculumConfig(policy="sucess"))
    with pytest.raises(ConfigError, match=r"curriculum.options: unknown option\(s\) 'bnd' for curriculum 'success'; "
                                          r"valid options: over, band, window, explore, tasks"):
        RunConfig(curriculum=CurriculumConfig(policy="success", options={"bnd": [0, 1]}))
    with pytest.raises(ConfigError, match="option 'band' of curriculum 'success' must have 0 <= low <= high <= 1"):
        RunConfig(curriculum=CurriculumConfig(policy="success", options={"band": [0.9, 0.1]}))
    with pytest.raises(ConfigError, match="needs options.schedule"):
        RunConfig(curriculum=CurriculumConfig(policy="horizon"))
    with pytest.raises(ConfigError, match="reaches 60 turns, past env.max_turns 50.*set env.max_turns to 60"):
        RunConfig(curriculum=CurriculumConfig(policy="horizon", options={"schedule": [[0, 10], [5, 60]]}))
    with pytest.raises(ConfigError, match=r"options.tasks of curriculum 'success' \(2\) must be >= "
                                          r"scheduler.prompts_per_step \(4\)"):
        RunConfig(curriculum=CurriculumConfig(policy="success", options={"over": "task", "tasks": 2}))
    with pytest.raises(ConfigError, match="curriculum.policy must be uniform with --agent"):
        RunConfig(curriculum=CurriculumConfig(policy="difficulty"), agent=AgentConfig(function="x:y"))
    with pytest.raises(ConfigError, match="uniform or horizon with scheduler.partial_rollouts"):
        RunConfig(curriculum=CurriculumConfig(policy="success"),
                  scheduler=SchedulerConfig(async_rollout=True, partial_rollouts=True))
    # The refill's extra tasks are seeds outside a task pool: the curriculum would neither draw nor learn them.
    pool = CurriculumConfig(policy="success", options={"over": "task", "tasks": 8})
    refill = dict(scheduler=SchedulerConfig(max_oversample=2.0), loss=LossConfig(dynamic_sampling=True))
    with pytest.raises(ConfigError, match=r"scheduler.max_oversample must be 1 with curriculum success over a task "
                                          r"pool \(options.over: task\).*use over: level, got 2.0"):
        RunConfig(curriculum=pool, **refill)
    RunConfig(curriculum=CurriculumConfig(policy="success"), **refill)  # over levels: the refill's tasks at levels too
    # The checkpoint needs the state after the trainer's step, which an async producer may have left HISTORY behind.
    with pytest.raises(ConfigError, match=r"scheduler.max_staleness must be below 256 in async mode"):
        RunConfig(scheduler=SchedulerConfig(async_rollout=True, max_staleness=HISTORY))
    RunConfig(scheduler=SchedulerConfig(async_rollout=True, max_staleness=HISTORY - 1))
    assert sorted(CURRICULA) == ["difficulty", "horizon", "success", "uniform"]


def test_a_level_policy_on_an_env_without_levels_names_the_env_and_what_it_supports():
    from test_pool import WalkEnv

    agentrl.register("curriculum-test-walk", WalkEnv)
    for policy, options in (("difficulty", {}), ("success", {})):
        cfg = RunConfig(env=EnvConfig(id="curriculum-test-walk"),
                        curriculum=CurriculumConfig(policy=policy, options=options))
        with pytest.raises(ConfigError) as err:
            build_curriculum(cfg, None)
        assert str(err.value) == (
            f"curriculum: env 'curriculum-test-walk' declares no difficulty levels (TextEnv.difficulty_levels), so "
            f"curriculum policy {policy!r} cannot run on it; it supports: uniform, horizon, and success with "
            f"options.over: task (a task pool)")
    ok = RunConfig(env=EnvConfig(id="curriculum-test-walk"),
                   curriculum=CurriculumConfig(policy="success", options={"over": "task", "tasks": 8}))
    assert build_curriculum(ok, None).name == "success"
    with pytest.raises(ConfigError, match="options.start of curriculum 'difficulty' on env 'math': unknown level '9'; "
                                          "the levels are 1, 2, 3, 4, 5"):
        build_curriculum(RunConfig(curriculum=CurriculumConfig(policy="difficulty", options={"start": 9})), None)
    with pytest.raises(CurriculumError, match="env 'walk' declares no difficulty levels"):
        Curriculum("difficulty", {}, Tasks("walk", 0, 4, 10), run_seed=0)
    with pytest.raises(ValueError, match="level index 5 is outside 0..4"):
        MATH_LEVELS.task_seed(3, 5)


# -- what each env's levels are --------------------------------------------------------------------------------------


def test_math_levels_pick_the_procedural_level_and_plain_seeds_play_as_before():
    env = MathEnv(level=1)
    for k in range(5):
        _, info = env.reset(seed=MATH_LEVELS.task_seed(42, k))
        assert info["level"] == str(k + 1) and info["task_type"] == f"level{k + 1}"
    _, plain = env.reset(seed=42)
    assert plain["level"] == "1" and env.problem.question == MathEnv(level=1).reset(seed=42)[0].split("\n\n")[0]


def test_math_levels_in_a_problem_file_pick_among_that_levels_problems(tmp_path):
    rows = [{"problem": f"What is {i} + 1?", "solution": f"\\boxed{{{i + 1}}}", "level": f"Level {1 + i % 2}"}
            for i in range(6)]
    path = tmp_path / "math.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = MathEnv(source=str(path))
    assert {env.reset(seed=MATH_LEVELS.task_seed(s, 1))[1]["level"] for s in range(6)} == {"Level 2"}
    # level 1 holds rows 0, 2, 4: task 5 is its problem 5 % 3 = 2, row 4
    assert env.reset(seed=MATH_LEVELS.task_seed(5, 0))[0].startswith("What is 4 + 1?")
    with pytest.raises(ValueError, match="no problem of level 3"):
        env.reset(seed=MATH_LEVELS.task_seed(0, 2))


@pytest.mark.parametrize("env_id", ["alfworld", "gui"])
def test_task_type_levels_draw_that_task_type(env_id):
    env = agentrl.make(env_id)
    levels = type(env).difficulty_levels
    try:
        for k, name in enumerate(levels.levels):
            assert {env.reset(seed=levels.task_seed(s, k))[1]["task_type"] for s in range(3)} == {name}
    finally:
        env.close()


@pytest.mark.parametrize("env_id, types", [("alfworld", ["pick_two_obj_and_place", "pick_and_place_simple"]),
                                           ("gui", ["toggle_setting", "disable_alarm", "contact_phone"])])
def test_task_types_narrow_the_levels_a_curriculum_draws(env_id, types):
    """Found in review: a GUI run on three task types had a curriculum over all eight, so a 'success' curriculum
    trained mostly on types the run, its SFT data and its held-out tasks never had."""
    from agentrl.envs.registry import difficulty_of

    declared = difficulty_of(env_id)
    levels = difficulty_of(env_id, {"task_types": types})
    assert levels.levels == tuple(t for t in declared.levels if t in types)  # easiest first, as declared
    assert difficulty_of(env_id, {"task_types": types[0]}).levels == (types[0],)  # one type given bare
    env = agentrl.make(env_id, task_types=types)
    try:
        for k, name in enumerate(levels.levels):  # the env reads level k within its own task types
            assert {env.reset(seed=levels.task_seed(s, k))[1]["task_type"] for s in range(3)} == {name}
        with pytest.raises(ValueError, match="level index"):
            env.reset(seed=levels.task_seed(0, len(types)))
    finally:
        env.close()
    curriculum = Curriculum.for_env("success", {}, env_id=env_id, levels=levels, seed_offset=0, prompts_per_step=4,
                                    max_turns=8, run_seed=0)
    drawn = {levels.split(seed)[0] for step in range(20) for seed in curriculum.seeds(step)}
    assert drawn == set(types)
    with pytest.raises(ValueError, match="task_types: unknown level"):
        difficulty_of(env_id, {"task_types": ["no_such_type"]})
    # Through a run's set-up: one line naming the argument, not a traceback.
    from agentrl.config import ConfigError, RunConfig, apply_overrides
    from agentrl.recipes.setup import build_curriculum

    cfg = apply_overrides(RunConfig(), {"env.id": env_id, "env.kwargs": {"task_types": ["no_such_type"]},
                                        "curriculum.policy": "success"})
    with pytest.raises(ConfigError, match=r"env\.kwargs\.task_types: unknown level\(s\) \['no_such_type'\]"):
        build_curriculum(cfg, None)


def test_resuming_a_curriculum_at_a_level_the_run_no_longer_has_is_one_line():
    """Found in review: a checkpoint's difficulty curriculum at level toggle_setting, resumed with task_types
    narrowed so that level is gone, stopped set-up with a ValueError traceback."""
    from agentrl.config import ConfigError, RunConfig, apply_overrides

    wide = apply_overrides(RunConfig(), {"env.id": "gui", "curriculum.policy": "difficulty", "env.kwargs": {
        "task_types": ["disable_alarm", "contact_phone", "toggle_setting"]}})
    first = build_curriculum(wide, None)
    saved = first.state_dict(0)
    saved["state"]["level"] = "toggle_setting"
    narrow = apply_overrides(wide, {"env.kwargs": {"task_types": ["disable_alarm", "contact_phone"]}})
    with pytest.raises(ConfigError, match=r"curriculum: the checkpoint's curriculum state does not fit this run "
                                          r"\(.*toggle_setting.*this run's levels: .*disable_alarm"):
        build_curriculum(narrow, TrainerState(step=0, curriculum=saved))
    assert build_curriculum(wide, TrainerState(step=0, curriculum=saved)) is not None  # the run it was saved with


def test_code_levels_draw_that_procedural_level():
    env = agentrl.make("code")
    levels = type(env).difficulty_levels
    try:
        assert [env.reset(seed=levels.task_seed(7, k))[1]["difficulty"] for k in range(5)] == [1, 2, 3, 4, 5]
    finally:
        env.close()


def test_registered_envs_declare_levels_where_natural():
    from agentrl.envs.registry import difficulty_of

    assert difficulty_of("math").levels == ("1", "2", "3", "4", "5")
    assert difficulty_of("code").levels == ("1", "2", "3", "4", "5")
    assert len(difficulty_of("alfworld").levels) == 6 and len(difficulty_of("gui").levels) == 8


# -- through the train recipe: checkpoint and resume -----------------------------------------------------------------


@pytest.mark.slow
def test_a_resumed_run_continues_the_curriculum_of_its_checkpoint(tmp_path):
    """tiny-qwen3 on the level env: 3 steps at once, and 2 steps then a resume to 3, play the same tasks (~40 s)."""
    from agentrl.config import GuardConfig, SamplingConfig
    from agentrl.recipes.train import train
    from agentrl.records import load_trajectories

    agentrl.register("curriculum-test-level", LevelEnv)

    def config(out: str, steps: int) -> RunConfig:
        return RunConfig(model="tiny-qwen3", env=EnvConfig(id="curriculum-test-level", max_turns=1),
                         scheduler=SchedulerConfig(group_size=2, prompts_per_step=2),
                         sampling=SamplingConfig(max_new_tokens=4), guard=GuardConfig(enabled=False),
                         curriculum=CurriculumConfig("difficulty", {"window": 2, "threshold": 0.5, "review": 0.5}),
                         steps=steps, save_every=1, token_values_per_step=0, output=str(tmp_path / out))

    def seeds_by_step(out: str) -> list[list[int]]:
        trajectories = load_trajectories(tmp_path / out / "trajectories.jsonl")
        return [sorted({t.seed for t in trajectories if t.train_step == s}) for s in range(3)]

    train(config("whole", 3), progress=False)
    train(config("parts", 2), progress=False)
    saved = read_trainer_state(tmp_path / "parts" / "checkpoint").curriculum
    assert saved["policy"] == "difficulty" and saved["step"] == 1 and saved["state"]["level"] != "easy"
    train(config("parts", 3), resume=True, progress=False)
    whole = seeds_by_step("whole")
    assert seeds_by_step("parts") == whole and {_level_index(s) for s in whole[0]} == {0}
    assert 1 in {_level_index(s) for s in whole[1] + whole[2]}  # easy was solved: the run moved up
    rows = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert [r["curriculum_level"] for r in rows][:2] == [0.0, 1.0]
