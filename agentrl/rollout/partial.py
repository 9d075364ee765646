"""Partial rollouts: in async mode, episodes play on across weight updates and across steps; the bound holds per turn.

What verl, SkyRL, AReaL and OpenRLHF call partial rollouts, at turn granularity (``scheduler.partial_rollouts``, with
``scheduler.async_rollout``; `agentrl.rollout.scheduler` runs it):

* One stream of episodes (`agentrl.rollout.loop.RolloutStream`) outlives the steps. Step s's tasks join it as soon
  as the staleness gate allows (the trainer is at version s - max_staleness or later: the same gate as without partial
  rollouts), while earlier steps' episodes still play; step s's rollout is the first `prompts_per_step` groups to
  complete, whichever step drew them, and the groups still playing carry over to later steps. Without partial
  rollouts, step s's rollout waits for its own slowest episode and step s+1's episodes start only after it, so the
  engine's batch drains to that tail every step; long multi-turn episodes of uneven length (ALFWorld's 50-step
  budget) are where that tail costs most (`bench/micro/partial_rollouts.py` measures both).
* A weight update lands between two turns of an episode, never inside one turn's generation: each turn is one engine
  request, sampled with one version of the weights (engines let the requests already running finish first), and
  records that version (`Turn.policy_version`) with its own log-probs (`Turn.rollout_logprobs`, mu). The training
  sample that merges an episode's turns keeps each turn's own mu token for token (`agentrl.chat.samples`), so the
  importance weight pi_old / mu of every token is against the sampler that drew it.
* The staleness bound applies per turn, by masking: when step s trains, a turn sampled by version v with
  ``s - v > max_staleness`` is marked stale (`Turn.stale`) and its tokens leave the loss (they stay in the sequence as
  the context the later turns saw); a group none of whose turns is within the bound is evicted
  (`agentrl.rollout.buffer.FreshnessBuffer` with ``per_turn``). Masking rather than evicting every group with one
  stale turn, because the episodes that cross the most updates are the longest ones: evicting them would throw away
  their fresh turns and bias each step toward short episodes (the bias partial rollouts exist to avoid), while their
  returns are real and their group's baseline needs them. What masking costs: a long episode's early turns train
  less often (only while fresh enough), and its return still credits its fresh turns for the stale ones' actions.

Without partial rollouts (the default) nothing here runs: each step's rollout is one `run_rollout`, every turn still
records its version, and a group is as old as its oldest turn (evicted whole past the bound).

Group ids in the stream are unique for the run (a step's groups are numbered after every group drawn before), and a
harvested group's episodes all record the oldest version among the group's turns as `Trajectory.policy_version`, so a
group keeps one id and one version through the buffer and `agentrl.training.step.as_trained`. A resumed run starts with
an empty stream: the episodes playing at the checkpoint are not saved.

Metrics (into the step's ``stats.engine``, so they reach metrics.jsonl): ``turn_staleness_mean`` /
``turn_staleness_max`` over every turn of the step's episodes, ``turn_staleness_trained_max`` over the turns the
staleness bound keeps (at most ``max_staleness``; counted before the overlong and dynamic-sampling filters, which may
leave more out), ``stale_turns_masked``, ``episodes_crossed_update`` (episodes whose turns were sampled by more than one
version), and ``partial_groups_carried`` (groups in the stream when the step's rollout was harvested: playing,
complete but not yet harvested, or not started).
"""

from __future__ import annotations

from dataclasses import replace

from agentrl.records import Trajectory, Turn

__all__ = ["turn_version", "mask_stale_turns", "turn_staleness_metrics"]


def turn_version(turn: Turn, trajectory: Trajectory) -> int:
    """The version that sampled `turn`: its own, or its episode's where it records none."""
    return trajectory.policy_version if turn.policy_version is None else turn.policy_version


def mask_stale_turns(trajectories: list[Trajectory], step: int, max_staleness: int) -> list[Trajectory]:
    """The trajectories as step `step` trains them: each turn more than `max_staleness` versions old marked stale."""
    out = []
    for traj in trajectories:
        stale = [step - turn_version(turn, traj) > max_staleness for turn in traj.turns]
        out.append(replace(traj, turns=tuple(replace(turn, stale=True) if old else turn
                                             for turn, old in zip(traj.turns, stale))) if any(stale) else traj)
    return out


def turn_staleness_metrics(step: int, trajectories: list[Trajectory]) -> dict[str, float]:
    """Per-turn staleness at step `step` (every turn, and the turns left in the loss), masked turns, crossings."""
    ages = [step - turn_version(turn, traj) for traj in trajectories for turn in traj.turns]
    trained = [step - turn_version(turn, traj) for traj in trajectories for turn in traj.turns if not turn.stale]
    crossed = sum(len({turn_version(turn, traj) for turn in traj.turns}) > 1 for traj in trajectories)
    return {"turn_staleness_mean": sum(ages) / len(ages) if ages else 0.0,
            "turn_staleness_max": float(max(ages, default=0)),
            "turn_staleness_trained_max": float(max(trained, default=0)),
            "stale_turns_masked": float(len(ages) - len(trained)),
            "episodes_crossed_update": float(crossed)}
