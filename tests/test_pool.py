"""Runner pools: faults (raise, hang, kill -9), shared resources, and identical trajectories across pool sizes.

The engine here is an honest mock: its reply is a pure function of the prompt ids, so trajectories can be compared
across pool sizes whatever the batch composition. The envs are small test doubles defined below; Ray ships them to
the runner processes by value.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from agentrl.engine.base import Generation, SamplingParams
from agentrl.engine.requests import BatchedRequests
from agentrl.envs.core import SharedResource, TextEnv
from agentrl.rollout.loop import run_rollout
from agentrl.rollout.pool import EnvFailure, EnvMaker, LocalPool, RayPool, make_pool

ray = pytest.importorskip("ray")


class PromptHashEngine:
    """Replies `word<h>` where h is a hash of the prompt ids: deterministic, batch-independent."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.policy_version = 3
        self.calls: list[int] = []

    def generate(self, prompts, params: SamplingParams) -> list[Generation]:
        self.calls.append(len(prompts))
        out = []
        for p in prompts:
            h = sum((i + 1) * t for i, t in enumerate(p)) % 97
            ids = tuple(self.tokenizer(f"move {h}", add_special_tokens=False)["input_ids"]) + (self.end,)
            out.append(Generation(ids, tuple(-0.5 for _ in ids), "stop"))
        return out

    def update_weights(self, named_tensors, version: int) -> None:
        self.policy_version = version

    def metrics(self) -> dict[str, float]:
        return {}

    def clear_cache(self) -> None:
        pass


class Counters(SharedResource):
    """Stands in for a catalogue: counts how often it is built (per process) and carries a big array."""

    builds: ClassVar[int] = 0

    def __init__(self, size: int):
        import numpy as np

        self.table = np.arange(size, dtype=np.int64)

    @classmethod
    def build(cls, **env_kwargs: Any) -> Counters:
        cls.builds += 1
        return cls(env_kwargs.get("table_size", 10))


class WalkEnv(TextEnv):
    """A multi-turn env: observations echo the seed, the turn and the last action; ends after `length` steps.

    Fault injection: `raise_every` makes every n-th `step` of a process raise; `hang_seed` makes the first attempt at
    that seed hang in `step` (a marker file in `marker_dir` records that it already hung once); `latency` sleeps;
    `slow_seed` sleeps `slow_latency` more in every step of that seed.
    """

    system_prompt = "Walk. Reply with a move."
    shared = Counters
    steps_in_process: ClassVar[int] = 0

    def __init__(self, length: int = 3, latency: float = 0.0, raise_every: int = 0, hang_seed: int = -1,
                 marker_dir: str = "", table_size: int = 10, slow_seed: int = -1, slow_latency: float = 0.0,
                 shared: Counters | None = None):
        self.length, self.latency, self.raise_every = length, latency, raise_every
        self.slow_seed, self.slow_latency = slow_seed, slow_latency
        self.hang_seed, self.marker_dir = hang_seed, marker_dir
        self.shared_resource = shared if shared is not None else Counters.build(table_size=table_size)
        self.seed, self.t = 0, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.seed, self.t = int(seed or 0), 0
        return f"start {self.seed} table {int(self.shared_resource.table[-1])}", {"task_type": f"t{self.seed % 2}"}

    def step(self, action: str):
        type(self).steps_in_process += 1
        if self.raise_every and type(self).steps_in_process % self.raise_every == 0:
            raise RuntimeError(f"injected failure at process step {type(self).steps_in_process}")
        if self.seed == self.hang_seed:
            marker = Path(self.marker_dir) / f"hung-{self.seed}"
            if not marker.exists():
                marker.write_text("x")
                time.sleep(3600)
        if self.latency:
            time.sleep(self.latency)
        if self.seed == self.slow_seed:
            time.sleep(self.slow_latency)
        self.t += 1
        reward = float(len(action) % 3 == 0)
        done = self.t >= self.length
        return f"seed {self.seed} turn {self.t} saw {action!r}", reward, done, False, {"success": done and reward > 0}

    def expert_action(self) -> str:
        return "move 0"


ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _maker(**kwargs) -> EnvMaker:
    return EnvMaker("walk", kwargs, entry_point=WalkEnv)


def _rollout(pool, engine, tok, seeds=(0, 1, 2, 3), group_size=2, max_turns=4, retries=2):
    return run_rollout(pool, "walk", list(seeds), group_size, BatchedRequests(engine), tok,
                       SamplingParams(temperature=0, seed=1), max_turns=max_turns, max_episode_retries=retries)


def _signature(trajs):
    return [(t.seed, t.group_id, t.total_return, t.success, t.terminated, t.truncated, t.first_observation,
             t.task_type, [(u.prompt_ids, u.generated_ids, u.action, u.observation, u.reward) for u in t.turns])
            for t in trajs]


def test_local_pool_runs_episodes_and_passes_shared(qwen3_tokenizer):
    engine = PromptHashEngine(qwen3_tokenizer)
    Counters.builds = 0
    result = _rollout(LocalPool(_maker(table_size=5), slots=8), engine, qwen3_tokenizer)
    assert Counters.builds == 1  # once for the pool, not per env
    assert len(result.trajectories) == 8
    assert [t.group_id for t in result.trajectories] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(len(t.turns) == 3 and t.terminated for t in result.trajectories)
    assert result.trajectories[0].first_observation == "start 0 table 4"
    assert all(t.policy_version == 3 for t in result.trajectories)  # the engine's version when none is given
    assert result.stats.env_steps == 24 and result.stats.errors == 0
    assert engine.calls == [8, 8, 8]  # in-process: one batched engine call per turn over all episodes


def test_a_given_policy_version_is_recorded_and_a_group_shares_its_task(qwen3_tokenizer):
    engine = BatchedRequests(PromptHashEngine(qwen3_tokenizer))
    trajs = run_rollout(LocalPool(_maker(length=2), slots=6), "walk", [5, 6], 3, engine, qwen3_tokenizer,
                        SamplingParams(temperature=0), max_turns=2, policy_version=7).trajectories
    assert len(trajs) == 6 and all(t.policy_version == 7 and len(t.turns) == 2 for t in trajs)
    assert trajs[0].turns[0].prompt_ids[:3] == trajs[1].turns[0].prompt_ids[:3]


def test_identical_trajectories_across_pool_sizes(ray_session, qwen3_tokenizer):
    engine = PromptHashEngine(qwen3_tokenizer)
    reference = _signature(_rollout(make_pool(_maker(), 0), engine, qwen3_tokenizer).trajectories)
    for runners, actors in ((1, 1), (3, 2), (8, 2)):
        with RayPool(_maker(latency=0.002 * runners), runners, actors=actors) as pool:
            got = _rollout(pool, engine, qwen3_tokenizer)
        assert _signature(got.trajectories) == reference, f"runners={runners}"


def _drain(pool, expected: int, timeout: float = 30.0) -> list:
    done, t0 = [], time.monotonic()
    while len(done) < expected and time.monotonic() - t0 < timeout:
        done += pool.poll(block=True)
    return done


def test_one_ray_call_per_actor_per_round(ray_session):
    with RayPool(_maker(), 8, actors=2) as pool:
        for slot in range(8):
            pool.submit_reset(slot, seed=slot)
        assert pool.messages == 0  # submitting only queues
        resets = _drain(pool, 8)
        assert pool.messages == 2  # one Ray call per actor carried the whole round
        assert sorted(c.slot for c in resets) == list(range(8))
        assert all(c.op == "reset" and c.outcome.observation == f"start {c.slot} table 9" for c in resets)
        for slot in range(8):
            pool.submit_step(slot, "abc")
        steps = _drain(pool, 8)
        assert pool.messages == 4 and pool.in_flight == 0
        assert {c.outcome.observation for c in steps} == {f"seed {s} turn 1 saw 'abc'" for s in range(8)}
        with pytest.raises(ValueError, match="slot 8 out of range"):
            pool.submit_step(8, "x")
    with RayPool(_maker(), 4, actors=2, batch_calls=False) as pool:
        for slot in range(4):
            pool.submit_reset(slot, seed=slot)
        assert len(_drain(pool, 4)) == 4 and pool.messages == 4  # the unbatched baseline: one call per env call


def test_slow_step_does_not_hold_back_its_neighbours(ray_session):
    with RayPool(_maker(slow_seed=0, slow_latency=1.5), 3, actors=1) as pool:
        for slot in range(3):
            pool.submit_reset(slot, seed=slot)
        _drain(pool, 3)
        t0 = time.monotonic()
        for slot in range(3):
            pool.submit_step(slot, "go")
        first = _drain(pool, 2)
        fast_seconds = time.monotonic() - t0
        rest = _drain(pool, 3 - len(first))
    assert pool.messages == 2  # the three steps travelled in one call...
    assert sorted(c.slot for c in first) == [1, 2] and fast_seconds < 1.0  # ...but the fast ones came back first
    assert [c.slot for c in rest] == [0] and rest[0].outcome.seconds >= 1.5


def test_env_raising_every_fifth_step_keeps_whole_groups(ray_session, qwen3_tokenizer):
    engine = PromptHashEngine(qwen3_tokenizer)
    local = _rollout(LocalPool(_maker(), slots=64), engine, qwen3_tokenizer, seeds=range(6))
    reference = _signature(local.trajectories)
    with RayPool(_maker(raise_every=5), 4, actors=2) as pool:
        result = _rollout(pool, engine, qwen3_tokenizer, seeds=range(6), retries=3)
    stats = result.stats
    assert stats.errors > 0 and len(stats.failures) == stats.errors
    assert "injected failure" in stats.failures[0]
    groups = [t.group_id for t in result.trajectories]
    assert all(groups.count(g) == 2 for g in set(groups))  # never a partial group
    assert len(set(groups)) + stats.dropped_groups == 6
    kept = {t.group_id for t in result.trajectories}
    assert _signature(result.trajectories) == [s for s in reference if s[1] in kept]  # re-runs replay the seed


def test_retries_exhausted_drops_the_group_and_counts_it(qwen3_tokenizer):
    engine = PromptHashEngine(qwen3_tokenizer)
    WalkEnv.steps_in_process = 0
    result = _rollout(LocalPool(_maker(raise_every=1), slots=4), engine, qwen3_tokenizer, seeds=(0, 1), retries=1)
    assert result.trajectories == []
    assert result.stats.dropped_groups == 2 and result.stats.episodes_done == 4
    assert result.stats.errors >= 4


def test_hanging_env_times_out_and_reruns(ray_session, qwen3_tokenizer, tmp_path):
    engine = PromptHashEngine(qwen3_tokenizer)
    with RayPool(_maker(hang_seed=2, marker_dir=str(tmp_path)), 4, actors=2, step_timeout=2.0) as pool:
        t0 = time.monotonic()
        result = _rollout(pool, engine, qwen3_tokenizer, seeds=range(4))
        elapsed = time.monotonic() - t0
    assert (tmp_path / "hung-2").exists()
    assert len(result.trajectories) == 8 and result.stats.dropped_groups == 0
    assert any(f.startswith("timeout") for f in result.stats.failures)
    assert pool.restarts >= 1 and elapsed < 60


def test_kill_9_of_a_runner_mid_rollout(ray_session, qwen3_tokenizer):
    engine = PromptHashEngine(qwen3_tokenizer)
    with RayPool(_maker(latency=0.05, length=6), 6, actors=2) as pool:
        pid = ray.get(pool.actor_handle(1).ready.remote())

        def kill_later():
            time.sleep(0.6)
            os.kill(pid, signal.SIGKILL)

        killer = threading.Thread(target=kill_later)
        killer.start()
        result = _rollout(pool, engine, qwen3_tokenizer, seeds=range(6), group_size=2, max_turns=6)
        killer.join()
    stats = result.stats
    assert stats.errors >= 1 and any(f.startswith(("actor_died", "actor_restarted")) for f in stats.failures)
    groups = [t.group_id for t in result.trajectories]
    assert all(groups.count(g) == 2 for g in set(groups))
    assert len(set(groups)) + stats.dropped_groups == 6
    assert all(len(t.turns) == 6 for t in result.trajectories)


def test_failure_records_are_returned_not_raised():
    pool = LocalPool(_maker(raise_every=1), slots=1)
    pool.submit_reset(0, seed=1)
    pool.submit_step(0, "move")
    done = pool.poll()
    assert [c.op for c in done] == ["reset", "step"]
    assert isinstance(done[1].outcome, EnvFailure) and done[1].outcome.kind == "error"
    pool.submit_step(0, "again")  # the failed env was discarded: the slot says so instead of raising
    assert pool.poll()[0].outcome.kind == "actor_restarted"


def test_bad_pool_arguments_name_the_problem():
    with pytest.raises(ValueError, match="runners must be >= 0"):
        make_pool(_maker(), -1)
    with pytest.raises(ValueError, match="at least one slot"):
        LocalPool(_maker(), slots=0)
