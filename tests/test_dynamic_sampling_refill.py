"""Dynamic sampling that refills (`agentrl.rollout.refill`): the step fills up with mixed groups, stops at the bound and
counts what it drew, changes nothing when off, refills in async mode too, and replays the same extra tasks on resume.

In-process runners only. The engine replies with its request's sampler seed (`SeedEchoEngine`, as vLLM seeds per
request), so the two episodes of a group differ; the env gives a reward that varies with the reply only on the tasks
it calls mixable, so which groups are mixed is known in advance.
"""

from __future__ import annotations

import dataclasses
import logging
import re

import pytest
from test_judge_reward import ScriptedJudge, make_judge
from test_pool import _signature
from test_protocols import SeedEchoEngine

from agentrl.config import (
    HELD_OUT_SEED_START,
    AgentConfig,
    ConfigError,
    EnvConfig,
    LossConfig,
    RunConfig,
    SchedulerConfig,
)
from agentrl.engine.base import SamplingParams
from agentrl.envs.core import TextEnv
from agentrl.records import Trajectory
from agentrl.rewards.judge import JudgeBudgetSpent
from agentrl.rollout.loop import RolloutResult, RolloutStats, run_rollout
from agentrl.rollout.pool import EnvMaker, LocalPool
from agentrl.rollout.refill import Refill, fill_step, is_mixed, merge_stats
from agentrl.rollout.scheduler import RolloutScheduler
from agentrl.training.step import as_trained, overlong_and_dynamic_sampling

P, G = 3, 2  # tasks per step, episodes per task
KEYS = ("dynamic_sampling_groups_drawn", "dynamic_sampling_mixed", "dynamic_sampling_rounds",
        "dynamic_sampling_bound_hit", "dynamic_sampling_drawn_reward_mean")


class MixEnv(TextEnv):
    """One reply per episode; the reward is the parity of the reply's digit on a mixable task, else 0.

    Mixable: the seed is divisible by `every` (0: none). A group's two episodes (consecutive sampler seeds, which
    differ in parity) then disagree.
    """

    system_prompt = "Reply with a digit in \\boxed{}."

    def __init__(self, every: int = 0):
        self.every, self.seed = every, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.seed = int(seed or 0)
        return f"task {self.seed}", {}

    def step(self, action: str):
        digits = re.findall(r"\d", action)
        mixable = self.every > 0 and self.seed % self.every == 0
        reward = float(int(digits[-1]) % 2) if mixable and digits else 0.0
        return "done", reward, True, False, {"success": reward > 0}


class Engine(SeedEchoEngine):
    """`SeedEchoEngine` with weights to sync (versions only) and the version of the weights on each result."""

    def poll(self, timeout=None):
        return [dataclasses.replace(r, policy_version=self.policy_version) for r in super().poll(timeout)]

    def update_weights(self, named_tensors, version: int) -> None:
        self.policy_version = version

    def close(self) -> None:
        pass


def first_seeds(step: int) -> list[int]:
    return [100 * step + i for i in range(P)]


def extra_seed(step: int, j: int) -> int:
    return 10_000 + 100 * step + j


def _scheduler(tok, *, every: int, max_tasks: int | None, start_step: int = 0, **kwargs):
    engine = Engine(tok)
    engine.policy_version = start_step
    sched = RolloutScheduler(
        "mix", {}, engine, list, tok, seeds_for_step=first_seeds,
        sampling_for_step=lambda s: SamplingParams(temperature=1.0, max_new_tokens=8, seed=7 + s), group_size=G,
        rollout_kwargs={"max_turns": 1}, maker=EnvMaker("mix", {"every": every}, entry_point=MixEnv),
        start_step=start_step, refill=Refill(max_tasks, extra_seed) if max_tasks else None, **kwargs)
    return sched, engine


def _groups(trajectories: list[Trajectory]) -> list[list[Trajectory]]:
    groups: dict[int, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.group_id, []).append(t)
    return list(groups.values())


def _mixable(seed: int, every: int) -> bool:
    return every > 0 and seed % every == 0


def test_the_step_fills_up_with_mixed_groups(qwen3_tokenizer):
    every = 4  # 100 * s is mixable, 100 * s + 1 and + 2 are not; one extra task in four is
    sched, engine = _scheduler(qwen3_tokenizer, every=every, max_tasks=4 * P)
    for step in range(3):
        result = sched.rollout(step)
        groups = _groups(result.trajectories)
        assert len(groups) == P and all(len(g) == G for g in groups)
        assert all(is_mixed(g) for g in groups)
        # The first P mixable tasks in draw order: the step's own first, then its extra tasks in order.
        order = first_seeds(step) + [extra_seed(step, j) for j in range(3 * P)]
        assert [g[0].seed for g in groups] == [s for s in order if _mixable(s, every)][:P]
        m = result.stats.engine
        drawn = int(m["dynamic_sampling_groups_drawn"])
        assert order.index(groups[-1][0].seed) < drawn <= 4 * P
        assert m["dynamic_sampling_mixed"] >= P and m["dynamic_sampling_bound_hit"] == 0
        assert m["dynamic_sampling_rounds"] >= 2
        assert result.stats.episodes == drawn * G  # every round's counters are in the step's
        assert len({t.group_id for t in result.trajectories}) == P  # unique ids across rounds
        sched.updated(step)
    sched.close()
    seeds = [seed for seed, _ in engine.seen]
    assert len(seeds) == len(set(seeds))  # every episode of every round sampled with a seed of its own


def test_refill_stops_at_the_bound_and_logs_how_many_it_drew(qwen3_tokenizer, caplog):
    sched, _ = _scheduler(qwen3_tokenizer, every=0, max_tasks=2 * P + 1)  # no task is ever mixed
    with caplog.at_level(logging.WARNING, logger="agentrl.rollout.refill"):
        result = sched.rollout(0)
    sched.close()
    m = result.stats.engine
    assert (m["dynamic_sampling_groups_drawn"], m["dynamic_sampling_mixed"], m["dynamic_sampling_bound_hit"]) == (
        2 * P + 1, 0, 1)
    assert result.stats.episodes == (2 * P + 1) * G
    # The step still gets its number of groups (uniform ones, the first drawn); the trainer's filter leaves them out.
    assert sorted({t.seed for t in result.trajectories}) == first_seeds(0)
    _, keep = overlong_and_dynamic_sampling(as_trained(result.trajectories, 0), LossConfig(dynamic_sampling=True),
                                            8, {})
    assert not any(keep)
    assert "0 of 3 groups have mixed rewards after drawing 7 tasks" in caplog.text


def test_at_the_bound_the_mixed_groups_found_come_first(qwen3_tokenizer):
    every = 10_100  # only extra_seed(1, 0) = 10_100 is mixable
    sched, _ = _scheduler(qwen3_tokenizer, every=every, max_tasks=2 * P, start_step=1)
    result = sched.rollout(1)
    sched.close()
    seeds = [g[0].seed for g in _groups(result.trajectories)]
    assert seeds == [100, 101, 10_100]  # draw order: the step's own tasks, then the mixed extra one
    assert result.stats.engine["dynamic_sampling_bound_hit"] == 1 and result.stats.engine["dynamic_sampling_mixed"] == 1


def test_refill_off_plays_exactly_what_the_step_played_before(qwen3_tokenizer):
    sched, _ = _scheduler(qwen3_tokenizer, every=4, max_tasks=None)
    got = [sched.rollout(step) for step in range(2)]
    sched.close()
    for step, result in enumerate(got):
        engine = Engine(qwen3_tokenizer)
        engine.policy_version = step
        pool = LocalPool(EnvMaker("mix", {"every": 4}, entry_point=MixEnv), 1)  # one slot: another schedule
        today = run_rollout(pool, "mix", first_seeds(step), G, engine, qwen3_tokenizer,
                            SamplingParams(temperature=1.0, max_new_tokens=8, seed=7 + step), max_turns=1)
        pool.close()
        assert _signature(result.trajectories) == _signature(today.trajectories)
        assert {t.seed for t in result.trajectories} == set(first_seeds(step))
        assert not set(KEYS) & set(result.stats.engine)
    assert not SchedulerConfig().refills and not SchedulerConfig(max_oversample=1.3, prompts_per_step=3).refills


def test_refill_changes_nothing_when_the_first_draw_is_all_mixed(qwen3_tokenizer):
    off, _ = _scheduler(qwen3_tokenizer, every=1, max_tasks=None)
    on, _ = _scheduler(qwen3_tokenizer, every=1, max_tasks=4 * P)
    a, b = off.rollout(0), on.rollout(0)
    off.close()
    on.close()
    assert _signature(a.trajectories) == _signature(b.trajectories)
    assert (b.stats.engine["dynamic_sampling_groups_drawn"], b.stats.engine["dynamic_sampling_rounds"]) == (P, 1)


def test_the_async_producer_refills_too(qwen3_tokenizer):
    sched, _ = _scheduler(qwen3_tokenizer, every=4, max_tasks=4 * P, async_rollout=True, max_staleness=1,
                          stop_step=3)
    for step in range(3):
        result = sched.rollout(step)
        groups = _groups(result.trajectories)
        assert len(groups) == P and all(is_mixed(g) for g in groups)
        assert result.stats.engine["dynamic_sampling_groups_drawn"] > P
        assert result.stats.engine["dynamic_sampling_bound_hit"] == 0
        sched.updated(step)
    assert len(sched.buffer) == 0  # the producer put only the groups it kept
    sched.close()


def test_a_resumed_run_replays_the_same_extra_tasks(qwen3_tokenizer):
    def play(start: int, stop: int) -> dict[int, list]:
        sched, engine = _scheduler(qwen3_tokenizer, every=4, max_tasks=4 * P, start_step=start)
        out = {}
        for step in range(start, stop):
            before = len(engine.seen)
            result = sched.rollout(step)
            out[step] = (_signature(result.trajectories), engine.seen[before:], dict(
                (k, result.stats.engine[k]) for k in KEYS))
            sched.updated(step)
        sched.close()
        return out

    whole, resumed = play(0, 4), play(2, 4)
    assert resumed == {2: whole[2], 3: whole[3]}


def test_the_configured_extra_seeds_are_the_steps_own():
    S = SchedulerConfig(prompts_per_step=4, max_oversample=2.5)
    assert (S.max_tasks, S.refills) == (10, True)
    extra = {s: [S.refill_seed(s, j) for j in range(6)] for s in range(50)}
    assert extra[3] == [S.refill_seed(3, j) for j in range(6)]  # a function of (step, j) alone
    seen = [x for xs in extra.values() for x in xs]
    assert len(seen) == len(set(seen))  # disjoint between steps
    assert min(seen) >= 50 * 4 and max(seen) < HELD_OUT_SEED_START  # apart from the first draws and the held-out
    with pytest.raises(ValueError, match="6 extra task seeds"):
        S.refill_seed(0, 6)


DS = LossConfig(dynamic_sampling=True)


@pytest.mark.parametrize(("build", "message"), [
    (lambda: SchedulerConfig(max_oversample=0.5), "scheduler.max_oversample must be a finite number >= 1"),
    (lambda: SchedulerConfig(max_oversample=float("nan")), "scheduler.max_oversample must be a finite"),
    (lambda: SchedulerConfig(max_oversample=float("inf")), "scheduler.max_oversample must be a finite"),
    (lambda: RunConfig(scheduler=SchedulerConfig(max_oversample=3)), "without loss.dynamic_sampling"),
    (lambda: RunConfig(scheduler=SchedulerConfig(max_oversample=3), loss=DS, agent=AgentConfig(function="m:f")),
     "with --agent"),
    (lambda: RunConfig(scheduler=SchedulerConfig(max_oversample=3), loss=DS, steps=200_000),
     "stay apart from the first draws"),
    (lambda: RunConfig(scheduler=SchedulerConfig(max_oversample=3), loss=DS, env=EnvConfig(seed_offset=600_000)),
     "below the held-out seeds from 1,000,000"),
])
def test_bad_refill_settings_are_config_errors(build, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        build()


def test_a_good_refill_config_passes_and_the_flag_has_help():
    from typer.testing import CliRunner

    from agentrl.cli.main import app

    RunConfig(scheduler=SchedulerConfig(max_oversample=3), loss=LossConfig(dynamic_sampling=True), steps=200)
    words = " ".join(CliRunner().invoke(app, ["run", "--help"], terminal_width=200).stdout.split())
    assert "--scheduler.max-oversample" in words and "Dynamic sampling that refills" in words


def test_merged_counters_add_up():
    a = RolloutStats(episodes=4, errors=1, failures=["x"], seconds=1.5, judge_failures=1,
                     engine={"k": 1.0, "hit_rate": 0.5}, judge={"judge_calls": 3.0, "judge_tokens": 300.0})
    b = RolloutStats(episodes=2, errors=2, failures=["y"], seconds=0.5, judge_failures=2,
                     engine={"j": 2.0, "hit_rate": 0.25}, judge={"judge_calls": 2.0, "judge_retries": 1.0})
    m = merge_stats(a, b)
    assert (m.episodes, m.errors, m.failures, m.seconds, m.judge_failures) == (6, 3, ["x", "y"], 2.0, 3)
    assert m.engine == {"k": 1.0, "j": 2.0, "hit_rate": 0.25}  # rates do not add: the later round's stands
    assert m.judge == {"judge_calls": 5.0, "judge_tokens": 300.0, "judge_retries": 1.0}  # counters add


def test_fill_step_asks_for_the_next_extra_tasks_in_order():
    """Without env or engine: a draw that records its seeds; every task mixed from seed 1000 on."""
    asked = []

    def draw(seeds, first_group):
        asked.append((list(seeds), first_group))
        trajs = [Trajectory("x", seed=s, group_id=first_group + k, turns=(), first_observation="",
                            total_return=float(i if s >= 1000 else 0), success=False, terminated=True,
                            truncated=False) for k, s in enumerate(seeds) for i in range(2)]
        return RolloutResult(trajs, RolloutStats(episodes=2 * len(seeds)))

    result = fill_step(5, [1, 2, 3, 4], draw, Refill(16, lambda s, j: 1000 + 10 * s + j))
    assert asked[0] == ([1, 2, 3, 4], 0)
    assert [s for seeds, _ in asked[1:] for s in seeds] == [1050 + j for j in range(sum(len(x) for x, _ in asked[1:]))]
    assert all(len(seeds) <= 4 for seeds, _ in asked)  # a round is at most one step's worth of tasks
    assert [first for _, first in asked] == [0, *[4 + sum(len(x) for x, _ in asked[1:k]) for k in range(1, len(asked))]]
    assert sorted({t.seed for t in result.trajectories}) == [1050, 1051, 1052, 1053]


# -- with a judge (agentrl.rewards.judge) ---------------------------------------------------------------------------


def _judged_scheduler(tok, judge):
    """`_scheduler` with every=4 and a judge; the reward is rule + judge score, so mixed is the rule's mixed."""
    return _scheduler(tok, every=4, max_tasks=4 * P, judge=judge)


def test_a_judge_failure_in_a_refill_round_drops_and_counts_its_group_and_the_step_refills(qwen3_tokenizer):
    # A constant score keeps the rule reward's mixed groups mixed; the first extra task (10_000, mixable) gets a
    # reply without one, so its group drops in the second round and later rounds fill the step.
    server = ScriptedJudge(lambda prompt, n: "no verdict" if "task 10000\n" in prompt else "Fine.\nSCORE: 5")
    judge = make_judge(server.url, retries=0)
    sched, _ = _judged_scheduler(qwen3_tokenizer, judge)
    try:
        result = sched.rollout(0)
    finally:
        sched.close()
        server.close()
    groups = _groups(result.trajectories)
    assert [g[0].seed for g in groups] == [0, 10_004, 10_008] and all(is_mixed(g) for g in groups)
    assert all(t.judge_reward == 0.5 for t in result.trajectories)
    stats = result.stats
    assert stats.judge_failures == 1 and stats.dropped_groups == 1
    assert stats.failures[-1].startswith("judge_unparsable (group 3, seed 10000")
    # Rounds of 3, 3, 3 and 3 tasks: 10_000 fails its judge, 10_004 and 10_008 are the next mixed ones.
    assert stats.engine["dynamic_sampling_rounds"] == 4 and stats.engine["dynamic_sampling_groups_drawn"] == 12
    assert stats.engine["dynamic_sampling_bound_hit"] == 0 and stats.episodes == 12 * G
    metrics = stats.metrics()
    assert metrics["judge_failures"] == 1 and metrics["judge_failed_calls"] >= 1 and metrics["judge_episodes"] >= 23


def test_a_spent_judge_budget_stops_the_refill_at_once(qwen3_tokenizer):
    server = ScriptedJudge(lambda prompt, n: "Fine.\nSCORE: 5")
    judge = make_judge(server.url, budget_calls=P * G)  # the first draw's episodes (their replies differ)
    sched, engine = _judged_scheduler(qwen3_tokenizer, judge)
    try:
        with pytest.raises(JudgeBudgetSpent, match="reward.judge.budget_calls"):
            sched.rollout(0)
    finally:
        sched.close()
        server.close()
    assert server.calls == P * G
    assert len(engine.seen) <= 2 * P * G  # the second round's episodes at most: no third round for nothing
