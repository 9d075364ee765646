"""`RolloutDriver`: the one interface between the training loop and whatever plays a step's episodes.

The loop (`agentrl.recipes.train`) never touches an engine, an env or a runner. Once per step it asks the driver for
that step's trajectories, trains on them, tells the driver the update happened, and at the end closes it; for the
metrics it also reads how many groups were thrown away as too stale. Two drivers implement it:

* `RolloutScheduler` (`agentrl.rollout.scheduler`): the built-in agent loop over the env runner pool, in lockstep,
  every ``sync_every`` steps, or asynchronously (a producer thread ahead of the trainer, bounded by
  ``max_staleness``).
* `AgentRollout` (`agentrl.rollout.agents`): agent functions written against the OpenAI API (``--agent``), each
  episode one call in its own session of an in-process OpenAI-compatible server (`agentrl.serve`); lockstep only.

`agentrl.recipes.setup.build_rollout` picks one from the config; the loop sees only this protocol.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from agentrl.rollout.loop import RolloutResult

__all__ = ["RolloutDriver"]


@runtime_checkable
class RolloutDriver(Protocol):
    """Plays each step's episodes with a policy version it chooses; the training loop's whole view of the rollout.

    What the train loop may call, and nothing more: `rollout` once per step, `updated` after each optimizer update
    (and after a collapse-guard rollback restored older weights), `stale_groups_evicted` for the step's metrics line,
    and `close` once at the end (`agentrl.recipes.setup.Run.close`). Anything else a driver holds (engines, runner
    pool, policy server, buffer) is its own business; set-up may read more of a concrete driver, the loop may not.

    **A step's collect.** ``rollout(step)`` returns a `RolloutResult` (`agentrl.rollout.loop`):

    * ``trajectories``: complete groups only, ``group_size`` episodes each, one group per task of the step. An
      episode that fails (an env call that raises or times out, a runner that dies, an agent that raises, hangs or
      never calls the model) is re-run from its seed up to the retry limit; after that its whole group is dropped
      and counted, never trained half. Every trajectory carries its `group_id`, its task `seed` and the
      `policy_version` that sampled it. The list may be empty when every group failed; the loop then skips the
      update (and stops the run after ``runners.max_failed_steps`` such steps).
    * ``stats``: a `RolloutStats` of the rollout (episodes, env steps, tokens, errors, retries, dropped groups, one
      line per failure, wall time and generation time); ``stats.engine`` holds the seconds spent syncing weights
      since the previous rollout, the engine's own counters (prefix-cache hits) and any counters of the driver's own
      (the agent driver's fault counts and calls per episode).

    Steps are asked for in increasing order from the run's start step (a resume starts later); each step's task
    seeds and sampling seed are functions of the step alone, so a resumed or restarted run replays exactly the steps
    it would have played.

    **Versions and staleness.** The weights after step s's update are policy version s + 1; step s's rollout is meant
    to sample from version s. A driver hands the engine the trained weights with their version
    (`RequestEngine.update_weights`) and every trajectory records the version of the weights that sampled it (the
    oldest one, if the weights changed mid-episode), so the staleness of a step-s sample is ``s - policy_version``
    (`agentrl.rollout.scheduler.staleness_metrics`): 0 in lockstep, at most ``sync_every - 1`` when weights sync
    every ``sync_every`` steps, at most ``max_staleness`` in async mode, where older groups are evicted rather than
    trained (`stale_groups_evicted` counts them). The loss needs no extra term for it: pi_old is recomputed by the
    trainer's current weights and mu is the rollout's own log-prob, so the importance weight covers both the
    train-inference mismatch and the staleness (decoupled PPO; see `agentrl.objective.corrections`).

    **Errors.** An engine or runner pool that cannot come back raises `agentrl.engine.EngineError` or
    `agentrl.rollout.pool.RunnersLost` (an async producer's failure arrives as a `RuntimeError` whose ``__cause__``
    is the original). Ctrl-C during a rollout raises `KeyboardInterrupt` (the scheduler first saves the groups that
    had finished and closes itself); the loop's clean-up closes the driver either way.

    **Close.** `close` stops whatever the driver started (producer thread, runner pool, Ray actors, policy server,
    event loop) and closes the engines it was handed; it is idempotent, and nothing may be called after it.
    """

    def rollout(self, step: int) -> RolloutResult:
        """The trajectories to train step `step` on (complete groups only) and the rollout's counters."""
        ...

    def updated(self, step: int) -> None:
        """Step `step`'s optimizer update (or a rollback) is done: the trained weights are now version ``step + 1``.

        A driver that refreshes its engine only before a rollout (lockstep) may do nothing here; an asynchronous one
        hands the engine the new weights at once, so the rollouts still running sample from them.
        """
        ...

    @property
    def stale_groups_evicted(self) -> int:
        """Groups thrown away so far in the run as too many versions old (always 0 in lockstep)."""
        ...

    def close(self) -> None:
        """Stop what the driver started and close its engines (idempotent)."""
        ...
