"""When rollouts run and which weights they sample from: lockstep, every `sync_every` steps, or asynchronously.

The trainer asks `RolloutScheduler.rollout(step)` for each step's trajectories and calls `updated(step)` after the
optimizer steps. Policy versions: the weights after step s's update are version s + 1; every trajectory records the
version of the engine weights that sampled it (the oldest, if the weights changed mid-episode), so staleness at step
s is ``s - trajectory.policy_version``. The loss corrects for it without any extra term: pi_old is recomputed by the
trainer's current weights and mu is the rollout's own log-prob, so the importance weight pi_old / mu covers both the
train-inference mismatch and the staleness (decoupled PPO; see docs/objective.md).

Weights: the engine owns its weights; the scheduler hands it the training module's named tensors with their version
(`update_weights(named_tensors, version)`) and never touches the engine otherwise. The seconds each sync takes, and
the engine's own counters (prefix-cache hit rate), go into the rollout's metrics.

Modes:
    * ``sync_every=1`` (default): lockstep on-policy; weights are synced before every rollout (free when the HF
      engine was built to share the training module, the cheap choice on one CPU process).
    * ``sync_every=k``: weights are synced every k steps, so the samples of step s are at most k-1 versions old.
    * ``async_rollout=True``: a producer thread collects the rollout of step s+1 (and up to `max_staleness` steps
      ahead) while step s trains; complete groups wait in a `FreshnessBuffer`, which serves the freshest first and
      evicts any group more than `max_staleness` versions behind. The engine's weights are refreshed after every
      update; engines finish the requests already running first, so every sample's version is exact. An episode
      running then plays on with the new weights from its next turn: each turn records its own version
      (`Turn.policy_version`), the episode its oldest.
    * ``async_rollout=True, partial_rollouts=True`` (`agentrl.rollout.partial`): one stream of episodes outlives the
      steps; a step's tasks join it as soon as the same gate allows, its rollout is the first groups to complete
      whichever step drew them, the others play on into later steps, and the bound holds per turn (stale turns are
      masked out of the loss).

Dynamic sampling's refill (``scheduler.max_oversample > 1``, `agentrl.rollout.refill`): each step's rollout, in
either mode, rolls out more tasks until it has its number of groups with mixed rewards or hits the bound; the async
producer puts only the groups it kept into the buffer.

Departure from large-scale systems: on one CPU machine, training and generation share the cores, so async mode
shows the semantics (versions, bound, buffer) more than a speed-up; `bench/micro/pool_pipeline.py` measures the pipeline
busy fraction the modes reach when generation and training have their own hardware.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from agentrl.config import ContextConfig, EnvConfig, RunnersConfig, SchedulerConfig
from agentrl.curriculum import Curriculum, Tasks
from agentrl.engine.base import RequestEngine, SamplingParams
from agentrl.records import Trajectory, group_by_id, save_trajectories
from agentrl.rewards.judge import JudgeReward
from agentrl.rollout.buffer import FreshnessBuffer
from agentrl.rollout.loop import RolloutInterrupted, RolloutResult, RolloutStats, RolloutStream, run_rollout
from agentrl.rollout.partial import mask_stale_turns, turn_staleness_metrics
from agentrl.rollout.pool import EnvMaker, make_pool
from agentrl.rollout.refill import Refill, fill_step

__all__ = ["RolloutScheduler", "staleness_metrics"]

log = logging.getLogger(__name__)


def staleness_metrics(step: int, trajectories: list[Trajectory]) -> dict[str, float]:
    """Mean and max of ``step - policy_version`` over the step's trajectories."""
    if not trajectories:
        return {"staleness_mean": 0.0, "staleness_max": 0.0}
    ages = [step - t.policy_version for t in trajectories]
    return {"staleness_mean": sum(ages) / len(ages), "staleness_max": float(max(ages))}


@dataclass
class _Progress:
    """Throttles the live progress line to a few updates per second."""

    show: Callable[[dict[str, str]], None] | None
    every: float = 0.5
    last: float = field(default=0.0)

    def __call__(self, stats: RolloutStats) -> None:
        now = time.monotonic()
        finished = stats.episodes_done == stats.episodes  # always shown: a short rollout's final counts stay up
        if self.show is not None and (now - self.last >= self.every or finished):
            self.last = now
            self.show(stats.progress_fields())


class RolloutScheduler:
    """Owns the runner pool and decides when rollouts run and with which weights.

    The `agentrl.rollout.driver.RolloutDriver` of built-in env episodes (the agent loop, `agentrl.rollout.loop`).

    Args:
        env_id: registry id of the env.
        env_kwargs: its constructor kwargs.
        engine: the inference engine(s) (`agentrl.engine.build_engines`); the scheduler closes it in `close`.
        weights: the trained weights by name, read at each sync (the training backend's `named_weights`: the
            driver's module for one process, gathered from the FSDP workers otherwise).
        tokenizer: for chat contexts.
        seeds_for_step: the task seeds of a step.
        sampling_for_step: the sampling settings of a step.
        group_size: episodes per task.
        runners: concurrent episodes in Ray runners; 0 runs envs in the driver.
        runner_actors: Ray actor processes (0 = one per CPU).
        ray_address: Ray cluster to join (None starts a quiet local Ray).
        step_timeout: seconds an env call may take before its runner restarts.
        max_episode_retries: re-runs of a failed episode before its group is dropped.
        sync_every: refresh the engine's weights every this many steps (sync mode).
        async_rollout: produce rollouts in a background thread, bounded by `max_staleness`.
        max_staleness: async mode: trajectories at most this many versions older than the trainer.
        start_step: the first step (after a resume).
        stop_step: async mode: the producer stops after the rollout of step ``stop_step - 1`` (None: runs until
            `close`, which wastes the rollout of a step nobody trains).
        rollout_kwargs: passed to `run_rollout` (max_turns, chat_kwargs, context options, ...).
        interrupted_path: where Ctrl-C saves the groups that had finished (None: not saved).
        progress: receives the live progress fields (episodes, env steps/s, tokens/s, errors).
        maker: builds the envs instead of the registry entry for `env_id` (custom or test envs).
        sleep_between_rollouts: colocated layout (sync mode): the engine sleeps after each rollout, giving the GPU to
            the trainers, and wakes before the next weight sync or rollout.
        refill: dynamic sampling's refill (`agentrl.rollout.refill`): each step rolls out extra tasks until
            ``len(seeds_for_step(step))`` groups have mixed rewards, within ``refill.max_tasks``; None: the step's
            tasks alone. Screenshots come from the first draw only.
        judge: scores each finished episode with a judge model (`agentrl.rewards.judge`, `run_rollout`'s argument);
            the step's judge counters go to ``stats.judge``; `close` closes it. None: the env's rule reward alone.
        curriculum: the run's task-sampling policy (`agentrl.curriculum`); when given, `seeds_for_step` is
            its `Curriculum.seeds`, it caps each step's turns (`Curriculum.max_turns`), and it observes every group
            each step drew (refill rounds included) before the next step's seeds are drawn; its metrics go to
            ``stats.engine``. With partial rollouts it observes each step's groups when they are harvested, which
            may be after later steps' seeds were drawn.
        partial_rollouts: async mode: partial rollouts (`agentrl.rollout.partial`): episodes play on across steps
            and updates, and the staleness bound holds per turn. Not with `refill` (its rounds need each step's own
            groups).
    """

    @classmethod
    def from_config(cls, *, env: EnvConfig, scheduler: SchedulerConfig, runners: RunnersConfig,
                    context: ContextConfig, sampling: SamplingParams, engine: RequestEngine,
                    weights: Callable[[], Iterable[tuple[str, Any]]], tokenizer, family: str | None,
                    ray_address: str | None, start_step: int, stop_step: int, interrupted_path: Any = None,
                    progress: Callable[[dict[str, str]], None] | None = None,
                    sleep_between_rollouts: bool = False, screenshots: int = 0,
                    judge: JudgeReward | None = None, curriculum: Curriculum | None = None) -> RolloutScheduler:
        """The scheduler a run's config asks for: its env, scheduler, runners and (resolved) context sections.

        Step s plays the tasks ``env.seed_offset + s * prompts_per_step + i`` and samples with seed
        ``sampling.seed + s`` (when seeded), so a resumed run replays exactly the steps it would have played; with
        ``scheduler.max_oversample > 1`` its extra tasks are ``env.seed_offset + scheduler.refill_seed(s, j)``.
        `screenshots` episodes of each rollout bring their env images back (`run_rollout`'s argument); `judge`
        (`agentrl.rewards.judge.JudgeReward.from_config`) scores the episodes. A `curriculum`
        (`agentrl.curriculum.Curriculum`) draws the tasks instead: its "uniform" policy is the rule above, seed
        for seed; a level policy plays the refill's extra tasks at levels too.
        """
        refill = (Refill(scheduler.max_tasks, lambda s, j: env.seed_offset + scheduler.refill_seed(s, j))
                  if scheduler.refills else None)
        if refill is not None and curriculum is not None:
            plain = refill.extra_seed
            refill = Refill(refill.max_tasks, lambda s, j: curriculum.refill_seed(s, j, plain(s, j)))
        return cls(
            env.id, env.kwargs, engine, weights, tokenizer,
            seeds_for_step=(curriculum.seeds if curriculum is not None  # "uniform" is the same rule, seed for seed
                            else Tasks(env.id, env.seed_offset, scheduler.prompts_per_step, env.max_turns).fresh),
            sampling_for_step=lambda s: (sampling if sampling.seed is None
                                         else replace(sampling, seed=sampling.seed + s)),
            group_size=scheduler.group_size, runners=runners.count, runner_actors=runners.actors,
            ray_address=ray_address, step_timeout=runners.step_timeout,
            max_episode_retries=runners.max_episode_retries, sync_every=scheduler.sync_every,
            async_rollout=scheduler.async_rollout, max_staleness=scheduler.max_staleness, start_step=start_step,
            stop_step=stop_step,
            rollout_kwargs=dict(max_turns=env.max_turns, max_context_tokens=context.max_context_tokens,
                                screenshots=screenshots, **context.rollout_kwargs(family)),
            interrupted_path=interrupted_path, progress=progress, sleep_between_rollouts=sleep_between_rollouts,
            refill=refill, judge=judge, curriculum=curriculum, partial_rollouts=scheduler.partial_rollouts)

    def __init__(self, env_id: str, env_kwargs: dict[str, Any], engine: RequestEngine,
                 weights: Callable[[], Iterable[tuple[str, Any]]], tokenizer,
                 seeds_for_step: Callable[[int], list[int]], sampling_for_step: Callable[[int], SamplingParams],
                 group_size: int, *, runners: int = 0, runner_actors: int = 0, ray_address: str | None = None,
                 step_timeout: float = 60.0, max_episode_retries: int = 2, sync_every: int = 1,
                 async_rollout: bool = False, max_staleness: int = 1, start_step: int = 0,
                 stop_step: int | None = None,
                 rollout_kwargs: dict[str, Any] | None = None, interrupted_path: Any = None,
                 progress: Callable[[dict[str, str]], None] | None = None, maker: EnvMaker | None = None,
                 sleep_between_rollouts: bool = False, refill: Refill | None = None,
                 judge: JudgeReward | None = None, curriculum: Curriculum | None = None,
                 partial_rollouts: bool = False):
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1 (1 = lockstep on-policy), got {sync_every}")
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        if sleep_between_rollouts and async_rollout:
            raise ValueError("an engine that sleeps while the trainers train cannot roll out meanwhile: colocated "
                             "engines need sync mode (drop --async, or use the split layout)")
        if partial_rollouts and (not async_rollout or refill is not None):
            raise ValueError("partial rollouts need async mode (--async) and no refill (scheduler.max_oversample 1)")
        self.partial_rollouts = partial_rollouts
        self._wanted: dict[int, int] = {}  # partial rollouts: groups each step's rollout is to have
        self.sleep_between_rollouts = sleep_between_rollouts
        self.refill, self.curriculum = refill, curriculum
        self.weights, self.tokenizer = weights, tokenizer
        self.seeds_for_step, self.sampling_for_step = seeds_for_step, sampling_for_step
        self.group_size, self.env_id = group_size, env_id
        self.sync_every, self.async_rollout, self.max_staleness = sync_every, async_rollout, max_staleness
        self.start_step, self.stop_step = start_step, stop_step
        self.rollout_kwargs = dict(rollout_kwargs or {}, max_episode_retries=max_episode_retries, judge=judge)
        self.judge = judge
        self.interrupted_path = interrupted_path
        self._progress = _Progress(progress)
        self.engine = engine
        self._sync_seconds = 0.0
        self._sync_lock = threading.Lock()  # the trainer thread adds sync time, the async producer reads and zeroes it
        self.pool = make_pool(maker or EnvMaker(env_id, dict(env_kwargs)), runners, actors=runner_actors,
                              step_timeout=step_timeout, address=ray_address)
        atexit.register(self.close)  # an exception or Ctrl-C in the trainer must not leave Ray behind
        self._closed = False
        if self.engine.policy_version != start_step:
            self._sync(start_step)
        self.buffer = FreshnessBuffer(max_staleness, per_turn=partial_rollouts)
        self._cond = threading.Condition()
        self._trainer_version = start_step
        self._produced: dict[int, RolloutStats] = {}
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if async_rollout:
            self._thread = threading.Thread(target=self._produce_partial if partial_rollouts else self._produce,
                                            name="rollout-producer", daemon=True)
            self._thread.start()

    # -- sync mode ---------------------------------------------------------------------------------------------

    def _sync(self, version: int) -> None:
        """Hand the engine the trained weights as `version`, timed."""
        t0 = time.perf_counter()
        self.engine.update_weights(self.weights(), version)
        with self._sync_lock:
            self._sync_seconds += time.perf_counter() - t0

    def _take_sync_seconds(self) -> float:
        """The weight-sync seconds since the last call (for the next step's metrics)."""
        with self._sync_lock:
            seconds, self._sync_seconds = self._sync_seconds, 0.0
        return seconds

    def _collect(self, step: int) -> RolloutResult:
        judged_before = self.judge.counts() if self.judge is not None else None
        sampling = self.sampling_for_step(step)
        base = self.rollout_kwargs
        if self.curriculum is not None:  # the horizon in use at this step
            base = {**base, "max_turns": self.curriculum.max_turns(step)}
        drawn: list[Trajectory] = []  # every group of every round, kept or not: what the curriculum observes

        def draw(seeds: list[int], first_group: int) -> RolloutResult:
            kwargs = base if first_group == 0 else {**base, "screenshots": 0}
            result = run_rollout(self.pool, self.env_id, seeds, self.group_size, self.engine, self.tokenizer,
                                 sampling, policy_version=None, on_progress=self._progress, first_group=first_group,
                                 **kwargs)
            drawn.extend(result.trajectories)
            return result

        seeds = self.seeds_for_step(step)
        result = draw(seeds, 0) if self.refill is None else fill_step(step, seeds, draw, self.refill)
        # Sync seconds since the previous rollout (async mode: the syncs that landed while this one ran).
        seconds = self._take_sync_seconds()
        result.stats.engine = {"weight_sync_seconds": seconds, **self.engine.metrics(), **result.stats.engine}
        if self.curriculum is not None:  # before the next step's seeds are drawn (async: the producer's next step)
            result.stats.engine.update(self.curriculum.observe(step, drawn))
        if self.judge is not None:  # the whole step's, over every round of a refill
            result.stats.judge = (self.judge.counts() - judged_before).metrics()
        return result

    def rollout(self, step: int) -> RolloutResult:
        """The trajectories to train step `step` on (complete groups only) and the rollout's counters."""
        try:
            if self.async_rollout:
                return self._take(step)
            if self.sleep_between_rollouts:
                self.engine.wake_up()
            if (step - self.start_step) % self.sync_every == 0 and self.engine.policy_version != step:
                self._sync(step)
            result = self._collect(step)
            if self.sleep_between_rollouts:
                self.engine.sleep()
            return result
        except RolloutInterrupted as e:
            self._save_interrupted(e.result.trajectories)
            self.close()
            raise KeyboardInterrupt("rollout interrupted; finished groups were saved") from None
        except KeyboardInterrupt:
            self.close()
            raise

    def updated(self, step: int) -> None:
        """Call after step `step`'s optimizer updates: async mode refreshes the engine to version step + 1."""
        if not self.async_rollout:
            return
        self._sync(step + 1)
        with self._cond:
            self._trainer_version = step + 1
            self._cond.notify_all()

    @property
    def stale_groups_evicted(self) -> int:
        """Groups the async buffer dropped so far as more than `max_staleness` versions old (0 in sync mode)."""
        return self.buffer.evicted

    # -- async mode --------------------------------------------------------------------------------------------

    def _produce(self) -> None:
        step = self.start_step
        try:
            while not self._stop.is_set() and (self.stop_step is None or step < self.stop_step):
                with self._cond:
                    # Never run further ahead than the staleness bound allows: such samples would be evicted.
                    while self._trainer_version < step - self.max_staleness and not self._stop.is_set():
                        self._cond.wait(0.5)
                if self._stop.is_set():
                    return
                self._publish(step, self._collect(step))
                step += 1
        except BaseException as e:
            self._fail(e)

    def _publish(self, step: int, result: RolloutResult) -> None:
        """Hand step `step`'s groups to the buffer and its counters to the trainer thread waiting in `rollout`."""
        for members in group_by_id(result.trajectories).values():
            self.buffer.put(members)
        with self._cond:
            self._produced[step] = result.stats
            self._cond.notify_all()

    def _fail(self, error: BaseException) -> None:
        """Keep the producer's error: it surfaces in the trainer thread at its next `rollout`."""
        with self._cond:
            self._error = error
            self._cond.notify_all()

    def _produce_partial(self) -> None:
        """Partial rollouts (`agentrl.rollout.partial`): one stream of episodes, a step's rollout its first groups."""
        kwargs = dict(self.rollout_kwargs)
        screenshots = kwargs.pop("screenshots", 0)
        stream = RolloutStream(self.pool, self.env_id, self.group_size, self.engine, self.tokenizer,
                               self.sampling_for_step(self.start_step), on_progress=self._progress, **kwargs)
        step = added = self.start_step  # the next step to harvest; the next step whose tasks join the stream
        next_group = 0  # group ids are unique for the run: groups of several steps meet in the stream and the buffer
        judged = self.judge.counts() if self.judge is not None else None

        def may_add() -> bool:  # `_produce`'s gate: a step's tasks start no earlier than its samples could train
            return ((self.stop_step is None or added < self.stop_step)
                    and self._trainer_version >= added - self.max_staleness)

        def harvestable() -> bool:
            return added > step and stream.complete >= self._wanted[step]

        try:
            while not self._stop.is_set() and (self.stop_step is None or step < self.stop_step):
                while not self._stop.is_set():
                    while may_add():
                        seeds = self.seeds_for_step(added)
                        self._wanted[added] = len(seeds)
                        stream.add(seeds, next_group, sampling=self.sampling_for_step(added), screenshots=screenshots,
                                   max_turns=self.curriculum.max_turns(added) if self.curriculum is not None else None)
                        next_group, added = next_group + len(seeds), added + 1
                    if added > step and (harvestable() or stream.idle):
                        break
                    if stream.idle:  # nothing to play until the trainer catches up with the gate
                        with self._cond:
                            self._cond.wait(0.5)
                        continue
                    stream.run(until=lambda: self._stop.is_set() or may_add() or harvestable())
                if self._stop.is_set():
                    return
                result = stream.harvest(self._wanted[step])
                seconds = self._take_sync_seconds()
                result.stats.engine = {"weight_sync_seconds": seconds, **self.engine.metrics(),
                                       "partial_groups_carried": float(stream.groups)}
                if self.curriculum is not None:
                    result.stats.engine.update(self.curriculum.observe(step, result.trajectories))
                if self.judge is not None:
                    now = self.judge.counts()
                    result.stats.judge, judged = (now - judged).metrics(), now
                self._publish(step, result)
                step += 1
        except BaseException as e:
            self._fail(e)

    def _take(self, step: int) -> RolloutResult:
        if self.stop_step is not None and step >= self.stop_step:
            raise ValueError(f"step {step} is past stop_step={self.stop_step}: the producer made no rollout for it")
        with self._cond:
            while step not in self._produced and self._error is None:
                self._cond.wait(0.5)
            if self._error is not None:
                raise RuntimeError(f"the rollout producer failed: {self._error}") from self._error
            stats = self._produced.pop(step)
        wanted = self._wanted.pop(step) if self.partial_rollouts else len(self.seeds_for_step(step))
        groups = self.buffer.take(wanted, trainer_version=step)
        trajectories = [t for g in groups for t in g.trajectories]
        if self.partial_rollouts:  # the bound per turn: what is older than it leaves the loss
            trajectories = mask_stale_turns(trajectories, step, self.max_staleness)
            stats.engine.update(turn_staleness_metrics(step, trajectories))
        return RolloutResult(trajectories, stats)

    # -- end ---------------------------------------------------------------------------------------------------

    def _save_interrupted(self, trajectories: list[Trajectory]) -> None:
        if self.interrupted_path is not None and trajectories:
            save_trajectories(trajectories, self.interrupted_path)
            log.warning("interrupted: saved %d finished trajectories to %s", len(trajectories), self.interrupted_path)

    def close(self) -> None:
        """Stop the producer and the runner pool (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.pool.close()
        self.engine.close()
        if self.judge is not None:
            self.judge.close()
