"""Policy versions, sync intervals, the staleness bound and the fresher-first buffer (no Ray: in-process runners)."""

from __future__ import annotations

import time

import pytest
from test_pool import PromptHashEngine, WalkEnv

from agentrl.engine.base import SamplingParams
from agentrl.engine.requests import BatchedRequests
from agentrl.records import Trajectory
from agentrl.rollout.buffer import FreshnessBuffer
from agentrl.rollout.pool import EnvMaker
from agentrl.rollout.scheduler import RolloutScheduler, staleness_metrics


def _traj(group_id: int, version: int) -> Trajectory:
    return Trajectory("walk", seed=group_id, group_id=group_id, turns=(), first_observation="", total_return=0.0,
                      success=False, terminated=True, truncated=False, policy_version=version)


def test_buffer_serves_freshest_first_and_evicts_stale():
    buf = FreshnessBuffer(max_staleness=1)
    buf.put([_traj(0, 3), _traj(0, 3)])
    buf.put([_traj(1, 5)])
    buf.put([_traj(2, 4), _traj(2, 5)])  # a group is as old as its oldest episode: version 4
    buf.put([_traj(3, 5)])
    got = buf.take(2, trainer_version=5)
    assert [g.policy_version for g in got] == [5, 5]
    assert [g.trajectories[0].group_id for g in got] == [1, 3]  # equal versions: first come, first served
    assert buf.evicted == 1 and len(buf) == 1  # group 0 (5 - 3 > 1) was dropped, group 2 waits
    buf.put([_traj(4, 3)])
    assert [g.policy_version for g in buf.take(5, trainer_version=5)] == [4]  # the version-3 group is too old now
    assert buf.evicted == 2 and len(buf) == 0


def test_buffer_rejects_mixed_groups():
    buf = FreshnessBuffer(max_staleness=0)
    with pytest.raises(ValueError, match="exactly one group"):
        buf.put([_traj(0, 1), _traj(1, 1)])
    with pytest.raises(ValueError, match="max_staleness"):
        FreshnessBuffer(-1)


def no_weights() -> list:
    """A stand-in trainer with no weights: the engine only records the version it was given."""
    return []


def _scheduler(tokenizer, engine=None, **kwargs) -> tuple[RolloutScheduler, BatchedRequests]:
    engine = engine or BatchedRequests(PromptHashEngine(tokenizer))
    engine.policy_version = -1
    sched = RolloutScheduler(
        "walk", {"length": 2}, engine, no_weights, tokenizer,
        seeds_for_step=lambda s: [10 * s, 10 * s + 1], sampling_for_step=lambda s: SamplingParams(temperature=0),
        group_size=2, rollout_kwargs={"max_turns": 2}, maker=EnvMaker("walk", {"length": 2}, entry_point=WalkEnv),
        **kwargs)
    return sched, engine


def test_sync_every_k_bounds_staleness(qwen3_tokenizer):
    sched, engine = _scheduler(qwen3_tokenizer, sync_every=3)
    versions = []
    for step in range(7):
        result = sched.rollout(step)
        assert len(result.trajectories) == 4
        versions.append({t.policy_version for t in result.trajectories})
        sched.updated(step)
    sched.close()
    assert versions == [{0}, {0}, {0}, {3}, {3}, {3}, {6}]
    assert staleness_metrics(5, [_traj(0, 3), _traj(0, 5)]) == {"staleness_mean": 1.0, "staleness_max": 2.0}


def test_async_mode_respects_max_staleness_and_overlaps(qwen3_tokenizer):
    sched, engine = _scheduler(qwen3_tokenizer, async_rollout=True, max_staleness=1)
    seen = []
    ahead = []
    for step in range(5):
        result = sched.rollout(step)
        seen.append(staleness_metrics(step, result.trajectories))
        assert len(result.trajectories) == 4 and {t.seed for t in result.trajectories} == {10 * step, 10 * step + 1}
        time.sleep(0.2)  # "training": the producer may use this time for the next step, but not the one after
        with sched._cond:
            ahead.append(max(sched._produced, default=step))
        sched.updated(step)
    sched.close()
    assert all(m["staleness_max"] <= 1 for m in seen)
    assert any(m["staleness_max"] == 1 for m in seen)  # the next rollout did run while a step trained
    assert all(a <= s + 1 for s, a in enumerate(ahead))  # never more than max_staleness steps ahead


def test_async_producer_stops_at_stop_step(qwen3_tokenizer):
    sched, engine = _scheduler(qwen3_tokenizer, async_rollout=True, max_staleness=2, stop_step=2)
    for step in range(2):
        assert len(sched.rollout(step).trajectories) == 4
        sched.updated(step)
    sched._thread.join(timeout=10)
    assert not sched._thread.is_alive()  # no rollout for a step nobody trains
    with pytest.raises(ValueError, match="past stop_step=2"):
        sched.rollout(2)
    sched.close()


def test_async_producer_error_reaches_the_trainer(qwen3_tokenizer):
    class BrokenEngine(PromptHashEngine):
        def generate(self, prompts, params):
            raise RuntimeError("engine exploded")

    sched, _ = _scheduler(qwen3_tokenizer, BatchedRequests(BrokenEngine(qwen3_tokenizer)), async_rollout=True,
                          max_staleness=0)
    with pytest.raises(RuntimeError, match="engine exploded"):
        sched.rollout(0)
    sched.close()


def test_scheduler_rejects_bad_settings(qwen3_tokenizer):
    with pytest.raises(ValueError, match="sync_every"):
        _scheduler(qwen3_tokenizer, sync_every=0)


def test_colocated_engine_sleeps_while_the_trainer_trains_and_never_samples_asleep(qwen3_tokenizer):
    class Recorded(BatchedRequests):
        """The real request wrapper, logging what the scheduler asks of it and refusing work while asleep."""

        def __init__(self, engine):
            super().__init__(engine)
            self.log, self.asleep = [], False

        def poll(self, timeout=None):
            assert not self.asleep, "sampled while asleep"
            return super().poll(timeout)

        def update_weights(self, named_tensors, version):
            assert not self.asleep, "weights loaded while asleep"
            self.log.append(f"sync {version}")
            super().update_weights(named_tensors, version)

        def sleep(self):
            self.log.append("sleep")
            self.asleep = True

        def wake_up(self):
            self.log.append("wake")
            self.asleep = False

    engine = Recorded(PromptHashEngine(qwen3_tokenizer))
    sched, _ = _scheduler(qwen3_tokenizer, engine=engine, sleep_between_rollouts=True)
    for step in range(3):
        assert len(sched.rollout(step).trajectories) == 4
        assert engine.asleep  # the trainer has the device from here
        sched.updated(step)
    sched.close()
    assert engine.log == ["sync 0", "wake", "sleep", "wake", "sync 1", "sleep", "wake", "sync 2", "sleep"]
    with pytest.raises(ValueError, match="sync mode"):
        _scheduler(qwen3_tokenizer, sleep_between_rollouts=True, async_rollout=True)
