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
      update; engines finish the requests already running first, so every sample's version is exact.

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
from agentrl.engine.base import RequestEngine, SamplingParams
from agentrl.records import Trajectory, save_trajectories
from agentrl.rollout.buffer import FreshnessBuffer
from agentrl.rollout.loop import RolloutInterrupted, RolloutResult, RolloutStats, run_rollout
from agentrl.rollout.pool import EnvMaker, make_pool

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
    """

    @classmethod
    def from_config(cls, *, env: EnvConfig, scheduler: SchedulerConfig, runners: RunnersConfig,
                    context: ContextConfig, sampling: SamplingParams, engine: RequestEngine,
                    weights: Callable[[], Iterable[tuple[str, Any]]], tokenizer, family: str | None,
                    ray_address: str | None, start_step: int, stop_step: int, interrupted_path: Any = None,
                    progress: Callable[[dict[str, str]], None] | None = None,
                    sleep_between_rollouts: bool = False, screenshots: int = 0) -> RolloutScheduler:
        """The scheduler a run's config asks for: its env, scheduler, runners and (resolved) context sections.

        Step s plays the tasks ``env.seed_offset + s * prompts_per_step + i`` and samples with seed
        ``sampling.seed + s`` (when seeded), so a resumed run replays exactly the steps it would have played.
        `screenshots` episodes of each rollout bring their env images back (`run_rollout`'s argument).
        """
        per_step = scheduler.prompts_per_step
        return cls(
            env.id, env.kwargs, engine, weights, tokenizer,
            seeds_for_step=lambda s: [env.seed_offset + s * per_step + i for i in range(per_step)],
            sampling_for_step=lambda s: (sampling if sampling.seed is None
                                         else replace(sampling, seed=sampling.seed + s)),
            group_size=scheduler.group_size, runners=runners.count, runner_actors=runners.actors,
            ray_address=ray_address, step_timeout=runners.step_timeout,
            max_episode_retries=runners.max_episode_retries, sync_every=scheduler.sync_every,
            async_rollout=scheduler.async_rollout, max_staleness=scheduler.max_staleness, start_step=start_step,
            stop_step=stop_step,
            rollout_kwargs=dict(max_turns=env.max_turns, max_context_tokens=context.max_context_tokens,
                                screenshots=screenshots, **context.rollout_kwargs(family)),
            interrupted_path=interrupted_path, progress=progress, sleep_between_rollouts=sleep_between_rollouts)

    def __init__(self, env_id: str, env_kwargs: dict[str, Any], engine: RequestEngine,
                 weights: Callable[[], Iterable[tuple[str, Any]]], tokenizer,
                 seeds_for_step: Callable[[int], list[int]], sampling_for_step: Callable[[int], SamplingParams],
                 group_size: int, *, runners: int = 0, runner_actors: int = 0, ray_address: str | None = None,
                 step_timeout: float = 60.0, max_episode_retries: int = 2, sync_every: int = 1,
                 async_rollout: bool = False, max_staleness: int = 1, start_step: int = 0,
                 stop_step: int | None = None,
                 rollout_kwargs: dict[str, Any] | None = None, interrupted_path: Any = None,
                 progress: Callable[[dict[str, str]], None] | None = None, maker: EnvMaker | None = None,
                 sleep_between_rollouts: bool = False):
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1 (1 = lockstep on-policy), got {sync_every}")
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        if sleep_between_rollouts and async_rollout:
            raise ValueError("an engine that sleeps while the trainers train cannot roll out meanwhile: colocated "
                             "engines need sync mode (drop --async, or use the split layout)")
        self.sleep_between_rollouts = sleep_between_rollouts
        self.weights, self.tokenizer = weights, tokenizer
        self.seeds_for_step, self.sampling_for_step = seeds_for_step, sampling_for_step
        self.group_size, self.env_id = group_size, env_id
        self.sync_every, self.async_rollout, self.max_staleness = sync_every, async_rollout, max_staleness
        self.start_step, self.stop_step = start_step, stop_step
        self.rollout_kwargs = dict(rollout_kwargs or {}, max_episode_retries=max_episode_retries)
        self.interrupted_path = interrupted_path
        self._progress = _Progress(progress)
        self.engine = engine
        self._sync_seconds = 0.0
        self.pool = make_pool(maker or EnvMaker(env_id, dict(env_kwargs)), runners, actors=runner_actors,
                              step_timeout=step_timeout, address=ray_address)
        atexit.register(self.close)  # an exception or Ctrl-C in the trainer must not leave Ray behind
        self._closed = False
        if self.engine.policy_version != start_step:
            self._sync(start_step)
        self.buffer = FreshnessBuffer(max_staleness)
        self._cond = threading.Condition()
        self._trainer_version = start_step
        self._produced: dict[int, RolloutStats] = {}
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if async_rollout:
            self._thread = threading.Thread(target=self._produce, name="rollout-producer", daemon=True)
            self._thread.start()

    # -- sync mode ---------------------------------------------------------------------------------------------

    def _sync(self, version: int) -> None:
        """Hand the engine the trained weights as `version`, timed."""
        t0 = time.perf_counter()
        self.engine.update_weights(self.weights(), version)
        self._sync_seconds += time.perf_counter() - t0

    def _collect(self, step: int) -> RolloutResult:
        result = run_rollout(self.pool, self.env_id, self.seeds_for_step(step), self.group_size, self.engine,
                             self.tokenizer, self.sampling_for_step(step), policy_version=None,
                             on_progress=self._progress, **self.rollout_kwargs)
        # Sync seconds since the previous rollout (async mode: the syncs that landed while this one ran).
        seconds, self._sync_seconds = self._sync_seconds, 0.0
        result.stats.engine = {"weight_sync_seconds": seconds, **self.engine.metrics()}
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
                result = self._collect(step)
                groups: dict[int, list[Trajectory]] = {}
                for traj in result.trajectories:
                    groups.setdefault(traj.group_id, []).append(traj)
                for members in groups.values():
                    self.buffer.put(members)
                with self._cond:
                    self._produced[step] = result.stats
                    self._cond.notify_all()
                step += 1
        except BaseException as e:  # surfaces in the trainer thread at its next `rollout`
            with self._cond:
                self._error = e
                self._cond.notify_all()

    def _take(self, step: int) -> RolloutResult:
        if self.stop_step is not None and step >= self.stop_step:
            raise ValueError(f"step {step} is past stop_step={self.stop_step}: the producer made no rollout for it")
        with self._cond:
            while step not in self._produced and self._error is None:
                self._cond.wait(0.5)
            if self._error is not None:
                raise RuntimeError(f"the rollout producer failed: {self._error}") from self._error
            stats = self._produced.pop(step)
        groups = self.buffer.take(len(self.seeds_for_step(step)), trainer_version=step)
        trajectories = [t for g in groups for t in g.trajectories]
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
