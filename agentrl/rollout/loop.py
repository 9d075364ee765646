"""The agent loop: drive an inference engine against envs in a runner pool and return `Trajectory` records.

Episodes run side by side. The driver keeps each episode's chat context; each turn is one engine request
(`agentrl.engine.base.RequestEngine`), submitted as soon as the episode's observation is in, and its result is handled
as soon as it finishes (continuous batching: a vLLM engine or engine actors never hold a turn back for the slowest
episode; a batch-only engine such as the HF one samples every waiting turn in one batch per round). The actions go
to the runner pool (`agentrl.rollout.pool`) as futures, one Ray call per runner process per round, so with Ray runners
the envs step while the engine generates for other episodes.
With the in-process pool (``runners=0``) and the HF engine every call returns at once and each round is exactly one
turn of every running episode. Token-in/token-out: the ids the engine generated go into the next turn's context
verbatim (see `agentrl.chat.context`), never re-tokenized from text; runners only ever see action text.

Faults (see `agentrl.rollout.pool`): an episode whose env raised, hung or lost its runner is re-run from its seed, at
most `max_episode_retries` times; after that its whole group is dropped, never kept partially (a partial group would
bias the group-mean advantage). Every retry and drop is counted in `RolloutStats` and logged with the exception.

Judged rewards (``judge``, `agentrl.rewards.judge`): each finished episode goes to the judge on its thread pool while
the loop plays on; the episode counts as done when its score lands. An episode whose score could not be obtained
(after the judge's own retries) is not re-run (the env did its part) and is never scored 0: its group is dropped
whole, counted in ``judge_failures`` and ``dropped_groups``, and the failure logged. Past the judge's budget every
later episode would fail alike, so the first episode past it ends the rollout with `JudgeBudgetSpent` (the run stops).

Determinism: with a deterministic engine (greedy decoding, or any engine whose output depends only on the prompt)
the trajectories for given seeds do not depend on the number of runners. A sampling engine whose random stream
depends on the batch (the HF engine draws from one generator per call) gives different samples when batches differ;
every request carries its own seed (from the episode, its attempt and its turn), so an engine that seeds per request
(vLLM) gives the same samples whatever the schedule.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from agentrl.chat.context import ChatContext
from agentrl.chat.roundtrip import check_roundtrip
from agentrl.engine.base import EngineRequest, EngineResult, RequestEngine, SamplingParams
from agentrl.records import Trajectory, Turn
from agentrl.rewards.combine import CombinedReward
from agentrl.rewards.judge import JudgeBudgetSpent, JudgeFailure, JudgeReward
from agentrl.rollout.pool import Completion, EnvFailure, LocalPool, RayPool, StepResult

__all__ = ["run_rollout", "RolloutStream", "PendingTurn", "RolloutResult", "RolloutStats", "RolloutInterrupted",
           "EPISODE_SEED_STRIDE"]

EPISODE_SEED_STRIDE = 104729
"""Sampler seeds of consecutive episodes (group x group_size + index) differ by this (a prime)."""

log = logging.getLogger(__name__)

_SESSIONS = itertools.count()  # engine sessions: one per episode attempt, unique in the process


def one_version(group: list[Trajectory]) -> list[Trajectory]:
    """A group's episodes, each recording the oldest policy version among the group's turns (each turn keeps its own).

    The trainer keeps groups apart by (version, group id, task) (`agentrl.training.step.as_trained`): in async mode a
    weight update can land between two episodes of one group, and episodes recording their own versions would split
    the group in two, each with its own baseline.
    """
    versions = [t.policy_version for t in group if t.policy_version is not None]  # None: an episode without turns
    if not versions:
        return group
    return [replace(t, policy_version=min(versions)) for t in group]


@dataclass(frozen=True)
class PendingTurn:
    """A sampled turn whose action is with the env: every field of its `Turn` but what the env step returns.

    Attributes:
        prompt_ids: the context the engine was given.
        generated_ids: what it sampled, verbatim.
        rollout_logprobs: log mu of each generated token.
        action: the text sent to `env.step`.
        finish_reason: the engine's (``"stop"`` / ``"length"``).
        new_segment: the prompt does not extend the previous turn's full sequence (see `Turn.new_segment`).
        generate_seconds: wall time from the request's submission to its result.
        routed_experts: MoE experts the engine chose, or None.
        roundtrip_drift: how re-tokenizing the reply differs from `generated_ids` (``""``: it does not).
        policy_version: the version of the weights that sampled it (`Turn.policy_version`).
    """

    prompt_ids: tuple[int, ...]
    generated_ids: tuple[int, ...]
    rollout_logprobs: tuple[float, ...]
    action: str
    finish_reason: str
    new_segment: bool
    generate_seconds: float
    routed_experts: np.ndarray | None
    roundtrip_drift: str
    policy_version: int | None = None

    def completed(self, step: StepResult) -> Turn:
        """The finished `Turn`, with the env's answer to the action."""
        return Turn(self.prompt_ids, self.generated_ids, self.rollout_logprobs, self.action, step.observation,
                    step.reward, finish_reason=self.finish_reason, new_segment=self.new_segment,
                    generate_seconds=self.generate_seconds, env_seconds=step.seconds,
                    routed_experts=self.routed_experts, roundtrip_drift=self.roundtrip_drift,
                    screenshot=step.screenshot, policy_version=self.policy_version)


@dataclass
class _Episode:
    """Mutable state of one running episode (internal to the loop; frozen into a `Trajectory` at the end)."""

    seed: int
    group_id: int
    index: int
    attempts: int = 0
    collateral: int = 0
    context: ChatContext | None = None
    prompt: list[int] = field(default_factory=list)
    first_observation: str = ""
    task_type: str = ""
    turns: list[Turn] = field(default_factory=list)
    new_segment: bool = False
    done: bool = False
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    slot: int = -1
    policy_version: int | None = None
    pending_turn: PendingTurn | None = None
    session: int = -1
    reward: CombinedReward | None = None
    sampling: SamplingParams | None = None  # a stream's episodes: their step's (None: the rollout's)
    max_turns: int | None = None  # a stream's episodes: their step's (None: the rollout's)

    def freeze(self, env_id: str) -> Trajectory:
        """The finished episode as a `Trajectory` (its reward combined with the judge's score once it has one)."""
        traj = Trajectory(
            env_id=env_id, seed=self.seed, group_id=self.group_id, turns=tuple(self.turns),
            first_observation=self.first_observation, total_return=sum(t.reward for t in self.turns),
            success=self.success, terminated=self.terminated, truncated=self.truncated or not self.done,
            policy_version=self.policy_version or 0, task_type=self.task_type,
        )
        if self.reward is None:
            return traj
        return replace(traj, total_return=self.reward.reward, rule_reward=self.reward.rule,
                       judge_reward=self.reward.judge)


@dataclass
class RolloutStats:
    """Counters of one rollout, for the progress line and the step metrics.

    Attributes:
        episodes: episodes in all.
        episodes_done: episodes finished (kept or not).
        env_steps: successful `env.step` calls.
        env_seconds: summed wall time of those calls inside the runners.
        generated_tokens: tokens the engine sampled.
        generate_seconds: wall time of engine calls.
        errors: failed env calls (raised, timed out, runner died).
        retries: episodes re-run from their seed.
        dropped_groups: groups dropped whole after too many failures.
        grades_over_budget: steps whose reward was graded wrong because grading hit its time budget or a cost
            guard (the env's ``info["grade_budget_exceeded"]``, see `agentrl.budget`).
        judge_failures: groups dropped because an episode's judged reward could not be obtained (one per group: the
            first failure drops it, and its other episodes' judgements are not waited for; counted in
            `dropped_groups` too).
        failures: one line per failure (kind, seed, message), oldest first.
        seconds: wall time of the whole rollout.
        engine: the scheduler's numbers for this rollout, filled in by it: the engine's own metrics (weight-sync
            seconds, prefix-cache hit rate) and those of the step's schedule (dynamic sampling's refill counters,
            the curriculum's metrics, partial rollouts' carried groups and turn staleness); all go to metrics.jsonl.
        judge: the judge's counters for this rollout (`agentrl.rewards.judge.JudgeCounts.metrics`: calls, cache hits,
            retries, tokens, ...); empty without a judge.
    """

    episodes: int = 0
    episodes_done: int = 0
    env_steps: int = 0
    env_seconds: float = 0.0
    generated_tokens: int = 0
    generate_seconds: float = 0.0
    errors: int = 0
    retries: int = 0
    dropped_groups: int = 0
    grades_over_budget: int = 0
    judge_failures: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    engine: dict[str, float] = field(default_factory=dict)
    judge: dict[str, float] = field(default_factory=dict)

    def progress_fields(self) -> dict[str, str]:
        """The live progress line: episodes done, env steps/s, tokens/s, errors."""
        elapsed = max(self.seconds, 1e-9)
        return {"episodes": f"{self.episodes_done}/{self.episodes}", "env_steps/s": f"{self.env_steps / elapsed:.1f}",
                "tok/s": f"{self.generated_tokens / elapsed:.0f}", "errors": str(self.errors)}

    def metrics(self) -> dict[str, float]:
        """Numbers for metrics.jsonl."""
        elapsed = max(self.seconds, 1e-9)
        return {"env_steps_per_s": self.env_steps / elapsed, "tokens_per_s": self.generated_tokens / elapsed,
                "env_errors": float(self.errors), "episode_retries": float(self.retries),
                "dropped_groups": float(self.dropped_groups), "grades_over_budget": float(self.grades_over_budget),
                **self.engine, **({"judge_failures": float(self.judge_failures), **self.judge} if self.judge else {})}


@dataclass(frozen=True)
class RolloutResult:
    """The trajectories of every complete group, in group order, and the rollout's counters."""

    trajectories: list[Trajectory]
    stats: RolloutStats


class RolloutInterrupted(KeyboardInterrupt):
    """Ctrl-C during a rollout; `result` holds the groups that had finished."""

    def __init__(self, result: RolloutResult):
        super().__init__("rollout interrupted")
        self.result = result


def run_rollout(
    pool: LocalPool | RayPool,
    env_id: str,
    seeds: Sequence[int],
    group_size: int,
    engine: RequestEngine,
    tokenizer,
    sampling: SamplingParams,
    *,
    max_turns: int = 1,
    max_context_tokens: int = 4096,
    policy_version: int | None = None,
    chat_kwargs: dict | None = None,
    max_episode_retries: int = 2,
    on_progress: Callable[[RolloutStats], None] | None = None,
    context_options: Mapping[str, Any] | None = None,
    max_new_tokens_by_turn: Sequence[int] = (),
    screenshots: int = 0,
    first_group: int = 0,
    judge: JudgeReward | None = None,
) -> RolloutResult:
    """Play `group_size` episodes for each seed through `pool`; return the complete groups (group i = seeds[i]).

    Args:
        pool: where the envs live (`agentrl.rollout.pool.make_pool`); at most `pool.slots` episodes run at once.
        env_id: recorded in each trajectory.
        seeds: one task per seed.
        group_size: episodes per seed (a group).
        engine: samples the model's replies (`agentrl.engine.build_engines`; a batch-only engine goes in wrapped in
            `agentrl.engine.requests.BatchedRequests`).
        tokenizer: renders contexts with its chat template.
        sampling: sampling settings; `sampling.seed` (if set) is varied per engine call.
        max_turns: model calls per episode; an episode still running after that is truncated.
        max_context_tokens: an episode whose next prompt would be longer is truncated.
        policy_version: recorded in each trajectory; None records the engine's `policy_version` at the episode's
            first engine call, i.e. the oldest weights that sampled the episode.
        chat_kwargs: chat-template variables (e.g. ``{"enable_thinking": False}``).
        max_episode_retries: re-runs of a failed episode before its group is dropped.
        on_progress: called after every engine call and every batch of env results with the live counters.
        context_options: keyword arguments for each episode's `ChatContext` (``family``, ``observation_role``,
            ``recap_actions``, ``tools``).
        max_new_tokens_by_turn: per-turn generation budgets: turn i gets entry ``min(i, len - 1)``; empty uses
            ``sampling.max_new_tokens`` for every turn.
        screenshots: episodes whose env images (``info["image"]``) come back with their turns (`Turn.screenshot`):
            episode 0 of the first groups, then episode 1, ... (decided up front, so the runners encode and send the
            images of these episodes only); 0: none.
        first_group: the group id of ``seeds[0]`` (the others follow): a step that rolls out in several rounds
            (dynamic sampling's refill, `agentrl.rollout.refill`) numbers each round's groups after the earlier ones,
            so ids stay unique and every episode's sampler seed (which follows its group id) is its own.
        judge: scores each finished episode with a judge model and combines the score with the env's rule reward
            (`agentrl.rewards.judge`); an episode whose score could not be obtained drops its group, counted in
            ``stats.judge_failures``. None: the rule reward alone.

    Raises:
        RolloutInterrupted: Ctrl-C; it carries the groups that had finished.
        JudgeBudgetSpent: the judge's budget ran out (`agentrl.rewards.judge`; a stream's `run` raises it too).
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if first_group < 0:
        raise ValueError(f"first_group must be >= 0, got {first_group}")
    settings = _Settings(env_id, group_size, sampling, max_turns, max_context_tokens, policy_version, chat_kwargs,
                         max_episode_retries, dict(context_options or {}), tuple(max_new_tokens_by_turn),
                         screenshots, first_group, judge)
    return _Rollout(pool, engine, tokenizer, seeds, settings, on_progress).run()


class RolloutStream:
    """Episodes that outlive one call: the agent loop of partial rollouts (`agentrl.rollout.partial`).

    Groups join with `add` (each with its step's sampling settings and turn cap), `run` plays every episode in the
    stream until a condition holds, and `harvest` takes the groups complete so far while the others play on at the
    next `run`. Between two calls nothing plays, and the engine's weights may change: a turn is one engine request,
    which an engine samples with one version of the weights (`RequestEngine.update_weights` lets the running ones
    finish first), so an episode crosses an update only between two of its turns, and each turn records the version
    that sampled it (`Turn.policy_version`). Failures, retries and group drops are `run_rollout`'s.

    Args:
        pool, env_id, group_size, engine, tokenizer, sampling: as `run_rollout`'s (`sampling`: for groups added
            without their own).
        max_turns, max_context_tokens, chat_kwargs, max_episode_retries, on_progress, context_options,
            max_new_tokens_by_turn, judge: as `run_rollout`'s.
    """

    def __init__(self, pool: LocalPool | RayPool, env_id: str, group_size: int, engine: RequestEngine, tokenizer,
                 sampling: SamplingParams, *, max_turns: int = 1, max_context_tokens: int = 4096,
                 chat_kwargs: dict | None = None, max_episode_retries: int = 2,
                 on_progress: Callable[[RolloutStats], None] | None = None,
                 context_options: Mapping[str, Any] | None = None, max_new_tokens_by_turn: Sequence[int] = (),
                 judge: JudgeReward | None = None):
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        # No groups yet: `add` numbers each step's groups and picks their screenshots.
        settings = _Settings(env_id, group_size, sampling, max_turns, max_context_tokens, None, chat_kwargs,
                             max_episode_retries, dict(context_options or {}), tuple(max_new_tokens_by_turn),
                             screenshots=0, first_group=0, judge=judge)
        self._rollout = _Rollout(pool, engine, tokenizer, [], settings, on_progress)

    def add(self, seeds: Sequence[int], first_group: int, *, sampling: SamplingParams | None = None,
            max_turns: int | None = None, screenshots: int = 0) -> None:
        """Start a group for each seed, numbered from `first_group` (ids must be new to the stream).

        `sampling` / `max_turns` (None: the stream's) hold for these groups' episodes; `screenshots` as
        `run_rollout`'s, over these groups.
        """
        if first_group < 0:
            raise ValueError(f"first_group must be >= 0, got {first_group}")
        self._rollout.add(seeds, first_group, sampling, max_turns, screenshots)

    @property
    def complete(self) -> int:
        """Groups complete and not harvested yet."""
        return len(self._rollout.complete_groups())

    @property
    def idle(self) -> bool:
        """Nothing left to play (every episode added has finished, or its group was dropped)."""
        r = self._rollout
        return not (r.todo or r.by_slot or r.judging)

    @property
    def groups(self) -> int:
        """Groups added and neither harvested nor dropped (complete ones included)."""
        return sum(g not in self._rollout.dropped for g in self._rollout.finished)

    def run(self, until: Callable[[], bool]) -> None:
        """Play until `until()` holds (checked before every round) or nothing is left to play.

        Raises:
            RolloutInterrupted: Ctrl-C; it carries the complete groups.
        """
        self._rollout.run(until)

    def harvest(self, n: int) -> RolloutResult:
        """Remove and return up to `n` complete groups (oldest first) and the counters since the previous harvest.

        Every episode of a harvested group records the oldest policy version among the group's turns as its
        `Trajectory.policy_version` (its turns keep their own), so a group keeps one version.
        """
        return self._rollout.harvest(n)


@dataclass(frozen=True)
class _Settings:
    """What every episode of one rollout shares; the fields are `run_rollout`'s arguments of the same names."""

    env_id: str
    group_size: int
    sampling: SamplingParams
    max_turns: int
    max_context_tokens: int
    policy_version: int | None
    chat_kwargs: dict | None
    max_episode_retries: int
    context_options: dict[str, Any]
    max_new_tokens_by_turn: tuple[int, ...]
    screenshots: int = 0
    first_group: int = 0
    judge: JudgeReward | None = None


def _shots(groups: range, group_size: int, n: int) -> set[tuple[int, int]]:
    """(group, index) of the `n` episodes that ship screenshots: one per group first (other tasks), then a second."""
    order = sorted(((g, i) for g in groups for i in range(group_size)), key=lambda e: e[::-1])
    return set(order[:n])


class _Rollout:
    """One rollout in the driver: episodes waiting to start, in their slots, waiting for the engine, finished.

    Continuous batching: every waiting turn is its own engine request, submitted as soon as its observation is in;
    results come back as each finishes, so an episode never waits for the slowest one of a round.
    """

    def __init__(self, pool: LocalPool | RayPool, engine: RequestEngine, tokenizer, seeds: Sequence[int],
                 settings: _Settings, on_progress: Callable[[RolloutStats], None] | None):
        self.pool, self.engine, self.tokenizer = pool, engine, tokenizer
        self.settings, self.on_progress = settings, on_progress
        self.t_start = time.perf_counter()
        self.stats = RolloutStats(episodes=len(seeds) * settings.group_size)
        groups = range(settings.first_group, settings.first_group + len(seeds))
        self.todo: deque[_Episode] = deque(_Episode(int(seed), group_id, i) for group_id, seed in zip(groups, seeds)
                                           for i in range(settings.group_size))
        self.shoot = _shots(groups, settings.group_size, settings.screenshots)
        self.finished: dict[int, list[_Episode]] = {g: [] for g in groups}
        self.dropped: set[int] = set()
        self.free_slots = list(range(min(pool.slots, len(self.todo))))[::-1]
        self.n_slots = len(self.free_slots)  # slots made so far (a stream makes more as groups join)
        self.fresh_slots: set[int] = set()  # slots whose env failed: the next episode there gets a new env
        self.by_slot: dict[int, _Episode] = {}
        self.waiting: list[_Episode] = []  # have a prompt, need an action
        self.generating: dict[int, tuple[_Episode, float]] = {}  # request id -> (episode, submitted at)
        self.next_request = 0
        self.judging: list[tuple[_Episode, Future]] = []  # finished episodes waiting for their judged score
        self.judge_start = settings.judge.counts() if settings.judge is not None else None

    def run(self, until: Callable[[], bool] | None = None) -> RolloutResult:
        """Play every episode to its end (or its group's drop) and return the complete groups.

        A stream (`RolloutStream`) passes `until`: it plays until that holds (checked before every round), and its
        episodes still running stay for the next call.
        """
        try:
            while (self.todo or self.by_slot or self.judging) and not (until is not None and until()):
                self._start_episodes()
                for completion in self.pool.poll(block=not self.waiting and not self.generating):
                    self._on_env(completion)
                self._start_episodes()
                self._report()
                self._submit_waiting()
                if self.generating:
                    self._on_engine()
                    self._report()
                if self.judging:  # with no episode left to play, wait for a verdict
                    self._on_judgments(block=not self.by_slot and not self.todo)
                    self._report()
        except KeyboardInterrupt:
            raise RolloutInterrupted(self._result()) from None
        finally:
            # Episodes never outlive their rollout: prefixes an engine kept for them (HFEngine) can never match again.
            # A stream's do: they keep theirs (a weight update drops them anyway).
            if until is None:
                self.engine.clear_cache()
        return self._result() if until is None else RolloutResult([], self.stats)  # a stream harvests its own

    # -- a stream's episodes outlive one call (partial rollouts) -----------------------------------------------

    def add(self, seeds: Sequence[int], first_group: int, sampling: SamplingParams | None, max_turns: int | None,
            screenshots: int) -> None:
        """More groups: ``seeds[i]`` plays as group ``first_group + i``, with these sampling settings and turn cap."""
        groups = range(first_group, first_group + len(seeds))
        if any(g in self.finished or g in self.dropped for g in groups):
            raise ValueError(f"groups {groups.start}-{groups.stop - 1} overlap groups the stream already has")
        size = self.settings.group_size
        self.todo.extend(_Episode(int(seed), g, i, sampling=sampling, max_turns=max_turns)
                         for g, seed in zip(groups, seeds) for i in range(size))
        self.shoot |= _shots(groups, size, screenshots)
        self.finished.update({g: [] for g in groups})
        self.stats.episodes += len(seeds) * size
        want = min(self.pool.slots, len(self.todo) + len(self.by_slot))  # a slot per episode alive, the pool's at most
        self.free_slots = list(range(self.n_slots, want))[::-1] + self.free_slots
        self.n_slots = max(self.n_slots, want)

    def complete_groups(self) -> list[int]:
        """The ids of the groups whose every episode has finished (and kept), not yet harvested."""
        size = self.settings.group_size
        return [g for g, eps in self.finished.items() if len(eps) == size and g not in self.dropped]

    def harvest(self, n: int) -> RolloutResult:
        """Remove and return up to `n` complete groups, oldest group id first, with the counters since the last one.

        A group's episodes all record the oldest policy version among the group's turns (each turn keeps its own), so
        the group keeps one version whatever the weights were when each of its episodes began.
        """
        now = time.perf_counter()
        self.stats.seconds = now - self.t_start
        trajectories = []
        for g in sorted(self.complete_groups())[:n]:
            trajectories += one_version([ep.freeze(self.settings.env_id)
                                         for ep in sorted(self.finished.pop(g), key=lambda e: e.index)])
        for g in [g for g in self.finished if g in self.dropped]:  # a dropped group's episodes are gone already
            del self.finished[g]
        stats = self.stats
        self.stats = RolloutStats(episodes=len(self.todo) + len(self.by_slot) + len(self.judging))
        self.t_start = now
        return RolloutResult(trajectories, stats)

    # -- slots -------------------------------------------------------------------------------------------------

    def _start_episodes(self) -> None:
        while self.free_slots and self.todo:
            ep = self.todo.popleft()
            if ep.group_id in self.dropped:
                continue
            ep.slot = self.free_slots.pop()
            self.by_slot[ep.slot] = ep
            self.pool.submit_reset(ep.slot, ep.seed, fresh=ep.slot in self.fresh_slots,
                                   screenshots=(ep.group_id, ep.index) in self.shoot)
            self.fresh_slots.discard(ep.slot)

    def _release(self, ep: _Episode) -> None:
        self.by_slot.pop(ep.slot, None)
        self.free_slots.append(ep.slot)

    def _finish(self, ep: _Episode) -> None:
        self._release(ep)
        if ep.group_id in self.dropped:
            return
        if self.settings.judge is not None:  # done once its judged score lands (`_on_judgments`)
            self.judging.append((ep, self.settings.judge.submit(ep.freeze(self.settings.env_id))))
            return
        self._keep(ep)

    def _keep(self, ep: _Episode) -> None:
        self.finished[ep.group_id].append(ep)
        self.stats.episodes_done += 1

    def _drop_group(self, ep: _Episode, why: str) -> None:
        """Drop `ep`'s whole group (a partial group would bias the group-mean advantage), counted."""
        log.warning("dropping group %d (seed %d) %s", ep.group_id, ep.seed, why)
        self.dropped.add(ep.group_id)
        self.stats.dropped_groups += 1
        self.stats.episodes_done += self.settings.group_size - len(self.finished[ep.group_id])
        self.finished[ep.group_id] = []

    def _fail(self, ep: _Episode, failure: EnvFailure) -> None:
        """Count the failure, then re-run the episode from its seed or, out of retries, drop its whole group."""
        stats = self.stats
        stats.errors += 1
        self.fresh_slots.add(ep.slot)
        self._release(ep)
        line = f"{failure.kind} (group {ep.group_id}, seed {ep.seed}, attempt {ep.attempts + 1}): {failure.message}"
        stats.failures.append(line)
        if ep.group_id in self.dropped:
            return
        # A runner that died or restarted under a neighbour's hang says nothing about this episode's env: re-run it
        # without spending its retries (bounded, so a runner that keeps crashing still ends in a drop).
        innocent = failure.kind in ("actor_died", "actor_restarted") and ep.collateral < 10
        if not innocent and ep.attempts >= self.settings.max_episode_retries:
            self._drop_group(ep, f"after {ep.attempts + 1} failed attempts; last: {failure.message}")
            return
        log.warning("re-running episode from seed %d: %s", ep.seed, line)
        stats.retries += 1
        self.todo.appendleft(_Episode(ep.seed, ep.group_id, ep.index, attempts=ep.attempts + (not innocent),
                                      collateral=ep.collateral + innocent, sampling=ep.sampling,
                                      max_turns=ep.max_turns))

    # -- env results -------------------------------------------------------------------------------------------

    def _on_env(self, c: Completion) -> None:
        ep = self.by_slot.get(c.slot)
        if ep is None:
            return
        if isinstance(c.outcome, EnvFailure):
            self._fail(ep, c.outcome)
        elif ep.group_id in self.dropped:  # its group is already gone: stop spending compute on it
            self._release(ep)
        elif c.op == "reset":
            self._on_reset(ep, c.outcome)
        else:
            self._on_step(ep, c.outcome)

    def _on_reset(self, ep: _Episode, res: StepResult) -> None:
        ep.context = ChatContext(self.tokenizer, res.system_prompt, self.settings.chat_kwargs,
                                 **self.settings.context_options)
        ep.first_observation = res.observation
        ep.task_type = str(res.info.get("task_type", ""))
        ep.prompt = ep.context.first_prompt(res.observation, res.info)
        self.waiting.append(ep)

    def _on_step(self, ep: _Episode, res: StepResult) -> None:
        self.stats.env_steps += 1
        self.stats.env_seconds += res.seconds
        self.stats.grades_over_budget += bool(res.info.get("grade_budget_exceeded", False))
        ep.turns.append(ep.pending_turn.completed(res))
        ep.pending_turn = None
        if res.terminated or res.truncated:
            ep.done, ep.terminated, ep.truncated = True, res.terminated, res.truncated
            ep.success = bool(res.info.get("success", False))
        elif len(ep.turns) >= (self.settings.max_turns if ep.max_turns is None else ep.max_turns):
            ep.done, ep.truncated = True, True
        else:
            ep.prompt, ep.new_segment = ep.context.next_prompt(ep.turns[-1].generated_ids, res.observation)
            if len(ep.prompt) > self.settings.max_context_tokens:
                ep.done, ep.truncated = True, True
        if ep.done:
            self._finish(ep)
        else:
            self.waiting.append(ep)

    # -- judged rewards ----------------------------------------------------------------------------------------

    def _on_judgments(self, block: bool) -> None:
        """Keep the episodes whose judged score landed; drop the group of one whose score could not be obtained."""
        if block:
            wait({future for _, future in self.judging}, return_when=FIRST_COMPLETED)
        pending = []
        for ep, future in self.judging:
            if ep.group_id in self.dropped:
                continue
            if not future.done():
                pending.append((ep, future))
                continue
            try:
                score = future.result()
            except JudgeFailure as e:
                if e.kind == "over_budget":  # every episode from now on would drop its group: stop, not roll on
                    raise JudgeBudgetSpent(e) from None
                self.stats.judge_failures += 1
                line = f"judge_{e.kind} (group {ep.group_id}, seed {ep.seed}, episode {ep.index}): {e}"
                self.stats.failures.append(line)
                self._drop_group(ep, f"without a judged reward: {line}")
                continue
            ep.reward = self.settings.judge.reward(sum(t.reward for t in ep.turns), score)
            self._keep(ep)
        self.judging = [(ep, future) for ep, future in pending if ep.group_id not in self.dropped]

    # -- engine ------------------------------------------------------------------------------------------------

    def _submit_waiting(self) -> None:
        for ep in self.waiting:
            if ep.group_id in self.dropped:
                self._release(ep)
            else:
                self._submit(ep)
        self.waiting.clear()

    def _submit(self, ep: _Episode) -> None:
        if ep.session < 0:
            ep.session = next(_SESSIONS)
        request = EngineRequest(self.next_request, tuple(ep.prompt), self._params(ep), session=ep.session)
        self.generating[self.next_request] = (ep, time.perf_counter())
        self.next_request += 1
        self.engine.submit(request)

    def _params(self, ep: _Episode) -> SamplingParams:
        """The turn's sampling settings: its token budget, and its own seed when the rollout is seeded."""
        s, turn = self.settings, len(ep.turns)
        params = s.sampling if ep.sampling is None else ep.sampling
        if s.max_new_tokens_by_turn:
            budgets = s.max_new_tokens_by_turn
            params = replace(params, max_new_tokens=int(budgets[min(turn, len(budgets) - 1)]))
        if params.seed is not None:  # a seed per episode, attempt and turn: reproducible whatever the schedule
            episode = ep.group_id * s.group_size + ep.index
            params = replace(params, seed=(params.seed + 7919 * turn + EPISODE_SEED_STRIDE * episode
                                           + 15485863 * (ep.attempts + ep.collateral)) % 2**63)
        return params

    def _on_engine(self) -> None:
        t0 = time.perf_counter()
        # Env calls in flight: come back soon for their results; none: wait for the engine.
        results = self.engine.poll(timeout=0.02 if self.pool.in_flight else None)
        self.stats.generate_seconds += time.perf_counter() - t0
        for result in results:
            self._on_generation(result)

    def _on_generation(self, result: EngineResult) -> None:
        ep, submitted_at = self.generating.pop(result.request_id)
        if ep.group_id in self.dropped:  # its group is gone while the turn was sampled
            self._release(ep)
            return
        gen = result.generation
        version = self.settings.policy_version
        version = int(result.policy_version if version is None else version)
        ep.policy_version = version if ep.policy_version is None else min(ep.policy_version, version)
        action = ep.context.action_from_reply(gen.token_ids)
        self.stats.generated_tokens += len(gen.token_ids)
        ep.pending_turn = PendingTurn(
            prompt_ids=tuple(ep.prompt), generated_ids=tuple(gen.token_ids), rollout_logprobs=tuple(gen.logprobs),
            action=action, finish_reason=gen.finish_reason, new_segment=ep.new_segment,
            generate_seconds=time.perf_counter() - submitted_at, routed_experts=gen.routed_experts,
            roundtrip_drift=check_roundtrip(self.tokenizer, ep.prompt, gen.token_ids).drift, policy_version=version,
        )
        self.pool.submit_step(ep.slot, action)

    # -- progress and result -----------------------------------------------------------------------------------

    def _report(self) -> None:
        self.stats.seconds = time.perf_counter() - self.t_start
        if self.on_progress is not None:
            self.on_progress(self.stats)

    def _result(self) -> RolloutResult:
        """The complete groups so far, in group order (a dropped or unfinished group gives nothing)."""
        self.stats.seconds = time.perf_counter() - self.t_start
        if self.settings.judge is not None:
            self.stats.judge = (self.settings.judge.counts() - self.judge_start).metrics()
        trajectories = []
        for group_id in sorted(self.finished):
            eps = self.finished[group_id]
            if group_id in self.dropped or len(eps) < self.settings.group_size:
                continue
            trajectories += one_version([ep.freeze(self.settings.env_id) for ep in sorted(eps, key=lambda e: e.index)])
        return RolloutResult(trajectories, self.stats)
