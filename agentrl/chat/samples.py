"""Trajectory -> training samples, one per maximal prefix-consistent run of turns.

While each turn's prompt extends the previous turn's full sequence (prompt + generated ids), the turns merge into one
sequence: the model saw exactly this sequence, token for token, so one forward pass trains all those turns. Where the
prefix breaks (the template rewrote history), a new sample starts, with the context the model actually saw then.

Sequence-level quantities on split samples: every sample of a trajectory carries the trajectory's advantage (the
reward is the episode's, so each of its turns is credited with it), or, with per-turn advantages (GiGPO), each turn's
tokens carry their own turn's advantage. Loss aggregation counts samples as sequences, so
a trajectory split into k samples weighs like k sequences under "seq-mean-*" modes; sequence-level importance ratios
(GSPO, sequence TIS / MIS) are computed per sample, i.e. over the tokens the model generated in that context.

Each generated token keeps the log-prob its own turn's sampler gave it (`Turn.rollout_logprobs`), so a sample whose
turns were sampled by different policy versions (async rollouts) carries each turn's own mu. A stale turn
(`Turn.stale`, partial rollouts: `agentrl.rollout.partial`) stays in the sequence as context with loss mask 0, and a
sample left with no loss token by its stale turns is not made at all.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentrl.records import Sample, Trajectory

__all__ = ["trajectory_to_samples"]


def trajectory_to_samples(
    traj: Trajectory, advantage: float | Sequence[float], *, per_turn: bool = False
) -> list[Sample]:
    """Build training samples from one trajectory.

    Args:
        traj: the episode.
        advantage: its advantage, given to each sample; or one advantage per turn (`agentrl.objective.
            turn_advantages`), given to that turn's tokens.
        per_turn: one sample per turn instead of merging turns whose prefix holds.
    """
    per_turn_adv = [float(advantage)] * len(traj.turns) if isinstance(advantage, (int, float)) else list(advantage)
    if len(per_turn_adv) != len(traj.turns):
        raise ValueError(f"{len(per_turn_adv)} advantages for a trajectory of {len(traj.turns)} turns")
    samples: list[Sample] = []
    ids: list[int] = []
    mask: list[int] = []
    logps: list[float] = []
    advs: list[float] = []
    first = 0.0  # the advantage of the sample's first turn
    routes = None
    has_stale = False  # the sample holds a stale turn

    def flush():
        if ids and (any(mask) or not has_stale):  # a sample that only stale turns would train teaches nothing
            varies = any(a != first for a, m in zip(advs, mask) if m)
            samples.append(Sample(tuple(ids), tuple(mask), tuple(logps), first, traj.group_id, traj.policy_version,
                                  routed_experts=routes, token_advantages=tuple(advs) if varies else None))

    for turn, turn_adv in zip(traj.turns, per_turn_adv):
        prompt = list(turn.prompt_ids)
        extends = bool(ids) and not per_turn and len(prompt) >= len(ids) and prompt[: len(ids)] == ids
        if not extends:
            flush()
            ids, mask, logps, advs, first, has_stale = [], [], [], [], turn_adv, False
        new_context = prompt[len(ids) :]
        ids += new_context + list(turn.generated_ids)
        mask += [0] * len(new_context) + [int(not turn.stale)] * len(turn.generated_ids)
        has_stale = has_stale or turn.stale
        logps += [0.0] * len(new_context) + list(turn.rollout_logprobs)
        advs += [0.0] * len(new_context) + [turn_adv] * len(turn.generated_ids)
        routes = turn.routed_experts
    flush()
    return samples
