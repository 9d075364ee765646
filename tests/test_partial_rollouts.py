"""Partial rollouts (`agentrl.rollout.partial`): per-turn versions and log-probs, turn-boundary crossings, the per-turn
staleness bound, and the default (off) left as it was. In-process runners, no Ray; a fake engine whose log-probs name
the weights that sampled each token."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import ClassVar

import pytest
from test_pool import WalkEnv

from agentrl.chat.samples import trajectory_to_samples
from agentrl.config import ConfigError, SchedulerConfig
from agentrl.engine.base import Generation, SamplingParams
from agentrl.engine.requests import BatchedRequests
from agentrl.records import Trajectory, Turn
from agentrl.rollout.buffer import FreshnessBuffer
from agentrl.rollout.loop import RolloutStream
from agentrl.rollout.partial import mask_stale_turns, turn_staleness_metrics
from agentrl.rollout.pool import EnvMaker, LocalPool
from agentrl.rollout.scheduler import RolloutScheduler


def logprob_of(version: int) -> float:
    """The log-prob every token sampled by `version` gets (exact in binary, distinct per version)."""
    return -0.125 * (version + 1)


class VersionedEngine:
    """Replies ``move <h>`` (h: a hash of the prompt); each token's log-prob is read from the weights' version as that
    token is sampled, so a turn whose weights changed while it was generated would carry two versions' log-probs."""

    def __init__(self, tokenizer, token_seconds: float = 0.0):
        self.tokenizer, self.token_seconds, self.policy_version = tokenizer, token_seconds, 0
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(self, prompts, params: SamplingParams) -> list[Generation]:
        out = []
        for p in prompts:
            h = sum((i + 1) * t for i, t in enumerate(p)) % 97
            ids = tuple(self.tokenizer(f"move {h}", add_special_tokens=False)["input_ids"]) + (self.end,)
            logprobs = []
            for _ in ids:
                logprobs.append(logprob_of(self.policy_version))
                time.sleep(self.token_seconds)
            out.append(Generation(ids, tuple(logprobs), "stop"))
        return out

    def update_weights(self, named_tensors, version: int) -> None:
        self.policy_version = version

    def metrics(self) -> dict[str, float]:
        return {}

    def clear_cache(self) -> None:
        pass


class LongWalk(WalkEnv):
    """WalkEnv whose `long_seed` plays `long_length` steps (the others `length`): one straggler group per run."""

    def __init__(self, long_seed: int = -1, long_length: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.long_seed, self.long_length, self.base_length = long_seed, long_length, self.length

    def reset(self, *, seed=None, options=None):
        out = super().reset(seed=seed, options=options)
        self.length = self.long_length if self.seed == self.long_seed else self.base_length
        return out


class Lockstep:
    """Ties the env to the stand-in trainer with events instead of sleeps, so what each step trains never depends on
    how fast threads run. With the in-process pool the env steps in the producer thread, so a wait there pauses the
    whole stream (never the trainer).

    * Partial rollouts: the straggler's i-th step (from 0) waits until the trainer has made ``(i + 1) // 3`` updates,
      and the trainer makes update s + 1 only once the straggler waits for it (or has finished): its turns are
      sampled by versions 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, while the other groups complete and train in between.
    * Off: a task of step k >= 1 starts only once the trainer has taken step k - 1's rollout, so no later step's
      groups are in the buffer when a step takes its own.
    """

    TIMEOUT = 60.0
    current: ClassVar[Lockstep | None] = None  # the one the envs of the running test use

    def __init__(self):
        self.cond = threading.Condition()
        self.version, self.wanted, self.finished, self.taken = 0, 0, False, -1

    def _wait(self, ready, what: str) -> None:
        if not self.cond.wait_for(ready, self.TIMEOUT):
            raise TimeoutError(f"lockstep: {what} never came")

    def straggler_step(self, i: int, last: bool) -> None:
        need = (i + 1) // 3
        with self.cond:
            if self.version < need:
                self.wanted = need
                self.cond.notify_all()
                self._wait(lambda: self.version >= need, f"update {need}")
            self.finished = last
            self.cond.notify_all()

    def task_reset(self, step: int) -> None:
        with self.cond:
            self._wait(lambda: self.taken >= step - 1, f"the trainer taking step {step - 1}")

    def took(self, step: int) -> None:
        with self.cond:
            self.taken = step
            self.cond.notify_all()

    def update(self, sched: RolloutScheduler, step: int, partial: bool) -> None:
        if partial:
            with self.cond:
                self._wait(lambda: self.wanted == step + 1 or self.finished, f"the straggler waiting for {step + 1}")
        sched.updated(step)
        with self.cond:
            self.version = step + 1
            self.cond.notify_all()


class LockstepWalk(LongWalk):
    """`LongWalk` whose straggler steps and task starts follow `Lockstep.current` (partial: the straggler; off: the
    starts)."""

    def __init__(self, partial: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.partial = partial

    def reset(self, *, seed=None, options=None):
        if not self.partial and seed >= 10:
            Lockstep.current.task_reset(seed // 10)
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.partial and self.seed == self.long_seed:
            Lockstep.current.straggler_step(self.t, last=self.t + 1 == self.length)
        return super().step(action)


# Seed 1 (step 0's second task) walks 10 steps; every other task ends after one step.
STRAGGLER = {"length": 1, "long_seed": 1, "long_length": 10}


def _train(tokenizer, *, partial: bool, steps: int, until_seed: int | None = None):
    """A stand-in trainer: every step takes its rollout, "trains", and has the engine updated to the next version."""
    env = {**STRAGGLER, "partial": partial}
    engine = BatchedRequests(VersionedEngine(tokenizer))
    lockstep = Lockstep.current = Lockstep()
    sched = RolloutScheduler(
        "walk", env, engine, lambda: [], tokenizer, seeds_for_step=lambda s: [10 * s, 10 * s + 1],
        sampling_for_step=lambda s: SamplingParams(temperature=0), group_size=2, rollout_kwargs={"max_turns": 12},
        maker=EnvMaker("walk", env, entry_point=LockstepWalk), async_rollout=True, max_staleness=1,
        partial_rollouts=partial)
    results = []
    try:
        for step in range(steps):
            results.append(sched.rollout(step))
            lockstep.took(step)
            lockstep.update(sched, step, partial)
            if until_seed is not None and any(t.seed == until_seed for t in results[-1].trajectories):
                break
    finally:
        sched.close()
        Lockstep.current = None
    return results, sched


def _turn_versions(traj: Trajectory) -> list[int]:
    return [turn.policy_version for turn in traj.turns]


def _check_turns_are_their_samplers(trajectories: list[Trajectory]) -> None:
    """Every turn records a version, all its log-probs are that version's, and versions never go back in an episode;
    the merged training sample carries each turn's own log-probs, token for token."""
    for traj in trajectories:
        versions = _turn_versions(traj)
        assert None not in versions
        assert versions == sorted(versions)
        for turn in traj.turns:
            assert set(turn.rollout_logprobs) == {logprob_of(turn.policy_version)}, "a turn sampled by two versions"
        # WalkEnv's prompts extend each other: the episode trains as one sample (stale turns in it too, unmasked here).
        [sample] = trajectory_to_samples(replace(traj, turns=tuple(replace(u, stale=False) for u in traj.turns)), 1.0)
        for turn in traj.turns:
            at = slice(len(turn.prompt_ids), len(turn.prompt_ids) + len(turn.generated_ids))
            assert sample.input_ids[at] == turn.generated_ids and sample.rollout_logprobs[at] == turn.rollout_logprobs


# -- the stream --------------------------------------------------------------------------------------------------


def test_stream_harvests_complete_groups_while_the_others_play_on(qwen3_tokenizer):
    engine = BatchedRequests(VersionedEngine(qwen3_tokenizer))
    env = {"length": 1, "long_seed": 5, "long_length": 4}
    stream = RolloutStream(LocalPool(EnvMaker("walk", env, entry_point=LongWalk), slots=64), "walk", 2, engine,
                           qwen3_tokenizer, SamplingParams(temperature=0), max_turns=8)
    stream.add([5, 6], 0)  # group 0 walks 4 steps, group 1 one
    stream.run(until=lambda: stream.complete >= 1)
    first = stream.harvest(2)
    assert {t.seed for t in first.trajectories} == {6} and stream.groups == 1  # group 0 plays on
    engine.update_weights([], 1)  # between two of group 0's turns
    stream.add([7], 2)
    with pytest.raises(ValueError, match="overlap"):
        stream.add([8], 2)
    stream.run(until=lambda: stream.complete >= 2)
    rest = stream.harvest(5)
    assert [t.group_id for t in rest.trajectories] == [0, 0, 2, 2]  # oldest group first
    long = rest.trajectories[0]
    assert _turn_versions(long)[0] == 0 and _turn_versions(long)[-1] == 1  # it crossed the update
    assert all(t.policy_version == 0 for t in rest.trajectories[:2])  # a group keeps its oldest turn's version
    _check_turns_are_their_samplers(first.trajectories + rest.trajectories)
    assert stream.idle and stream.groups == 0


# -- the scheduler -----------------------------------------------------------------------------------------------


def test_partial_rollouts_turn_versions_logprobs_and_the_per_turn_bound(qwen3_tokenizer):
    results, sched = _train(qwen3_tokenizer, partial=True, steps=60, until_seed=1)
    straggler_step = next(s for s, r in enumerate(results) if any(t.seed == 1 for t in r.trajectories))
    assert straggler_step == 3  # the straggler did not hold step 0 back: it carried over
    assert {t.seed for t in results[0].trajectories} == {0, 10}  # step 0 trained the first groups to complete
    crossed = 0
    for step, result in enumerate(results):
        trajectories = result.trajectories
        assert len(trajectories) == 4
        _check_turns_are_their_samplers(trajectories)
        ages = [(step - turn.policy_version, turn.stale) for t in trajectories for turn in t.turns]
        assert all(stale == (age > sched.max_staleness) for age, stale in ages)  # the bound, turn by turn
        m = result.stats.engine
        assert m["turn_staleness_trained_max"] <= sched.max_staleness
        assert m["stale_turns_masked"] == sum(stale for _, stale in ages)
        assert m["turn_staleness_max"] == max(age for age, _ in ages)
        crossed += m["episodes_crossed_update"]
        for traj in trajectories:  # stale turns leave the loss, the others stay in it
            samples = trajectory_to_samples(traj, 1.0)
            assert sum(s.num_loss_tokens for s in samples) == sum(len(u.generated_ids) for u in traj.turns
                                                                  if not u.stale)
    straggler = [t for t in results[straggler_step].trajectories if t.seed == 1]
    assert any(u.stale for u in straggler[0].turns) and not straggler[0].turns[-1].stale
    assert crossed == 2 and [_turn_versions(t) for t in straggler] == [[0, 0, 0, 1, 1, 1, 2, 2, 2, 3]] * 2
    assert sched.stale_groups_evicted == 0  # its last turns were fresh: masked, not evicted


def test_off_is_todays_async_mode(qwen3_tokenizer):
    results, sched = _train(qwen3_tokenizer, partial=False, steps=4)
    assert not sched.partial_rollouts and not sched.buffer.per_turn
    assert [sorted({t.seed for t in r.trajectories}) for r in results] == [[0, 1], [10, 11], [20, 21], [30, 31]]
    for result in results:  # each step waits for its own straggler; group ids as they always were
        assert [t.group_id for t in result.trajectories] == [0, 0, 1, 1]
        _check_turns_are_their_samplers(result.trajectories)
        for traj in result.trajectories:
            assert not any(u.stale for u in traj.turns)
            group = [t for t in result.trajectories if t.group_id == traj.group_id]
            assert traj.policy_version == min(v for t in group for v in _turn_versions(t))  # one version a group
        assert not any(k.startswith(("turn_staleness", "stale_turns", "episodes_crossed", "partial_"))
                       for k in result.stats.engine)
    straggler = next(t for t in results[0].trajectories if t.seed == 1)
    [sample] = trajectory_to_samples(straggler, 1.0)
    assert sample.num_loss_tokens == straggler.num_generated_tokens


# -- pieces ------------------------------------------------------------------------------------------------------


def _turn(version: int | None, n: int = 2, prompt: tuple[int, ...] = (1,)) -> Turn:
    return Turn(prompt, tuple(range(100, 100 + n)), (logprob_of(version or 0),) * n, "a", "o", 0.0,
                policy_version=version)


def _episode(group: int, versions: list[int | None], episode_version: int | None = None) -> Trajectory:
    turns, prompt = [], (1,)
    for v in versions:
        turn = _turn(v, prompt=prompt)
        turns.append(turn)
        prompt = prompt + turn.generated_ids + (7,)  # the next prompt extends this turn: one merged sample
    if episode_version is None:
        episode_version = min(v for v in versions if v is not None)
    return Trajectory("walk", group, group, tuple(turns), "", 0.0, False, True, False, policy_version=episode_version)


def test_a_group_records_one_version_whatever_its_episodes_saw():
    # Found in review: async mode without partial rollouts left each episode its own oldest version, so an update
    # landing between two episodes of a group split it in two for the trainer (`as_trained`), each with its own
    # baseline.
    from agentrl.rollout.loop import one_version
    from agentrl.training.step import as_trained

    group = [_episode(0, [3, 3]), _episode(0, [3, 4]), _episode(0, [4, 4]), _episode(0, [4, 5])]
    assert [t.policy_version for t in group] == [3, 3, 4, 4]
    assert len({t.group_id for t in as_trained(group, step=5)}) == 2  # what the trainer made of it before
    fixed = one_version(group)
    assert [t.policy_version for t in fixed] == [3, 3, 3, 3]
    assert [[u.policy_version for u in t.turns] for t in fixed] == [[3, 3], [3, 4], [4, 4], [4, 5]]  # turns keep theirs
    assert len({t.group_id for t in as_trained(fixed, step=5)}) == 1


def test_mask_stale_turns_samples_and_metrics():
    traj = _episode(0, [3, 4, 5, 6])
    [masked] = mask_stale_turns([traj], step=6, max_staleness=1)
    assert [u.stale for u in masked.turns] == [True, True, False, False]
    [sample] = trajectory_to_samples(masked, 1.0)
    gen = [i for i, x in enumerate(sample.input_ids) if x >= 100]
    assert [sample.loss_mask[i] for i in gen] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [sample.rollout_logprobs[i] for i in gen] == [logprob_of(v) for v in (3, 3, 4, 4, 5, 5, 6, 6)]
    assert trajectory_to_samples(mask_stale_turns([traj], 9, 1)[0], 1.0) == []  # nothing fresh: no sample at all
    assert mask_stale_turns([traj], 6, 3) == [traj]
    assert turn_staleness_metrics(6, [masked, _episode(1, [None, None], episode_version=6)]) == {
        "turn_staleness_mean": (3 + 2 + 1 + 0 + 0 + 0) / 6, "turn_staleness_max": 3.0,
        "turn_staleness_trained_max": 1.0, "stale_turns_masked": 2.0, "episodes_crossed_update": 1.0}


def test_buffer_per_turn_bound_and_order():
    for per_turn in (False, True):
        buf = FreshnessBuffer(max_staleness=1, per_turn=per_turn)
        buf.put([_episode(0, [2, 5]), _episode(0, [2, 3])])  # oldest turn 2, newest 5
        buf.put([_episode(1, [4, 4])])  # newest 4: too old at 6 either way
        buf.put([_episode(2, [6])])
        got = buf.take(3, trainer_version=6)
        # Per turn: a group trains while any turn is within the bound, first come first served; else as old as its
        # oldest turn, freshest first.
        assert [g.trajectories[0].group_id for g in got] == ([0, 2] if per_turn else [2])
        assert buf.evicted == (1 if per_turn else 2)


def test_config_needs_async_and_no_refill():
    assert SchedulerConfig(async_rollout=True, partial_rollouts=True).partial_rollouts
    assert not SchedulerConfig().partial_rollouts
    with pytest.raises(ConfigError, match="async"):
        SchedulerConfig(partial_rollouts=True)
    with pytest.raises(ConfigError, match="max_oversample"):
        SchedulerConfig(async_rollout=True, partial_rollouts=True, max_oversample=2)
