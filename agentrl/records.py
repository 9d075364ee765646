"""Typed, frozen records that flow between stages: rollout -> `Trajectory` (of `Turn`s) -> `Sample` -> trainer.

Token ids are kept exactly as the engine produced them (token-in/token-out): nothing downstream re-tokenizes text.
Trajectories round-trip through JSONL (`save_trajectories` / `load_trajectories`).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Turn", "Trajectory", "Sample", "group_by_id", "save_trajectories", "load_trajectories"]


@dataclass(frozen=True)
class Turn:
    """One model call and the env step it drove.

    Attributes:
        prompt_ids: the full context the engine was given for this turn.
        generated_ids: what the engine sampled, verbatim (end-of-turn token included when emitted).
        rollout_logprobs: log mu of each generated token, under the distribution it was sampled from.
        action: the text sent to `env.step` (decoded, thinking and end tokens stripped).
        observation: what the env answered.
        reward: the env's reward for this step.
        finish_reason: the engine's (``"stop"`` / ``"length"``).
        new_segment: True when this turn's prompt does not extend the previous turn's full sequence (the chat
            template rewrote history, e.g. dropped earlier ``<think>`` spans): training samples split here.
        generate_seconds: wall time of the engine call this turn was part of, divided by its batch size.
        env_seconds: wall time of `env.step`.
        routed_experts: MoE experts the engine chose, ``[len(prompt_ids) + len(generated_ids) - 1, L, K]``, or None.
        roundtrip_drift: ``""`` when re-tokenizing the decoded reply in its context gives back `generated_ids`, else
            the kind of drift (``merge``, ``end_whitespace``, ``split_utf8``; see `agentrl.chat.roundtrip`).
        screenshot: the screen after this turn's action as PNG bytes, for the few episodes a run saves screenshots of
            (``RunConfig.screenshots_per_step``); never written to JSONL (the run writes it as a PNG file).
        policy_version: the version of the weights that sampled this turn (the engine's `EngineResult.policy_version`:
            an async run's weights may change between two turns of an episode, never inside one); None where it was
            not recorded (trajectories saved before turns carried it, agent rollouts).
        stale: left out of the loss: with partial rollouts (``scheduler.partial_rollouts``), the turn was sampled more
            than ``scheduler.max_staleness`` versions before the step that trained it (`agentrl.rollout.partial`). A
            fact of that step alone: written to JSONL for analysis, but `load_trajectories` reads every turn back as
            not stale, so whatever trains on saved trajectories (SFT) trains on every turn.
    """

    prompt_ids: tuple[int, ...]
    generated_ids: tuple[int, ...]
    rollout_logprobs: tuple[float, ...]
    action: str
    observation: str
    reward: float
    finish_reason: str = "stop"
    new_segment: bool = False
    generate_seconds: float = 0.0
    env_seconds: float = 0.0
    routed_experts: np.ndarray | None = field(default=None, compare=False, repr=False)
    roundtrip_drift: str = ""
    screenshot: bytes | None = field(default=None, compare=False, repr=False)
    policy_version: int | None = None
    stale: bool = False

    def __post_init__(self):
        if len(self.generated_ids) != len(self.rollout_logprobs):
            raise ValueError(
                f"a turn needs one logprob per generated token: {len(self.generated_ids)} ids, "
                f"{len(self.rollout_logprobs)} logprobs"
            )


@dataclass(frozen=True)
class Trajectory:
    """One episode.

    Attributes:
        env_id: registry id of the env.
        seed: the `reset` seed: the same seed replays the same task.
        group_id: episodes sharing a task (same env and seed) share a group; advantages are computed within it.
        turns: the model calls, in order.
        first_observation: the observation `reset` returned.
        total_return: the episode's reward: the sum of the turns' rewards (with a judge, combined with its score).
        success: `info["success"]` at the end (False when the episode never ended).
        terminated: the task ended (solved or failed for good).
        truncated: a budget ran out (the env's, or the rollout's `max_turns`).
        policy_version: the trainer step whose weights sampled this episode's group: the oldest among the group's
            turns, if the weights changed during it (each turn's own is `Turn.policy_version`), so that a group keeps
            one version (`agentrl.rollout.loop.one_version`).
        train_step: the trainer step whose update used this episode (None until it is trained on, and in evals);
            with `sync_every > 1` or async rollouts it is later than `policy_version`. Metrics join on it.
        task_type: the env's `info["task_type"]`, for evaluation breakdowns ("" when absent).
        rule_reward: with a judge (``reward.judge``), the env's own reward (the sum of the turns' rewards) before
            `total_return` combined it with the judge's score (`agentrl.rewards.combine`); None without a judge.
        judge_reward: the judge's score on [0, 1] that went into `total_return`; None without a judge, or when the
            episode was below the gate and never judged. An episode whose score could not be obtained is never
            recorded (its group is dropped), so a number here is always one the judge gave.
    """

    env_id: str
    seed: int
    group_id: int
    turns: tuple[Turn, ...]
    first_observation: str
    total_return: float
    success: bool
    terminated: bool
    truncated: bool
    policy_version: int = 0
    task_type: str = ""
    train_step: int | None = None
    rule_reward: float | None = None
    judge_reward: float | None = None

    @property
    def num_generated_tokens(self) -> int:
        """Tokens the model generated over the whole episode."""
        return sum(len(t.generated_ids) for t in self.turns)


@dataclass(frozen=True)
class Sample:
    """One training sequence (one prefix-consistent run of turns of one trajectory).

    All per-token arrays have the length of `input_ids`. Position t of `loss_mask` / `rollout_logprobs` refers to
    token `input_ids[t]` (predicted from the tokens before it); prompt, template and observation tokens have mask 0
    and logprob 0.

    Attributes:
        input_ids: the whole sequence.
        loss_mask: 1 exactly on model-generated tokens (those of a stale turn excepted, `Turn.stale`).
        rollout_logprobs: log mu of each generated token (0 elsewhere).
        advantage: the trajectory's advantage (shared by all samples split from it); with per-turn advantages, the
            advantage of the sample's first turn.
        group_id: the trajectory's group.
        policy_version: the trainer step whose weights generated it (staleness = current step - this).
        routed_experts: MoE routing at rollout ``[len(input_ids) - 1, L, K]`` for R3, or None.
        token_advantages: per token of `input_ids`, the advantage of the turn that generated it (0 elsewhere), when
            the turns of one sample have different advantages (GiGPO); None means `advantage` for every token.
    """

    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    rollout_logprobs: tuple[float, ...]
    advantage: float
    group_id: int
    policy_version: int = 0
    routed_experts: np.ndarray | None = field(default=None, compare=False, repr=False)
    token_advantages: tuple[float, ...] | None = None

    def __post_init__(self):
        if not (len(self.input_ids) == len(self.loss_mask) == len(self.rollout_logprobs)):
            raise ValueError("input_ids, loss_mask and rollout_logprobs must have the same length")
        if self.token_advantages is not None and len(self.token_advantages) != len(self.input_ids):
            raise ValueError("token_advantages must have one entry per input id")

    @property
    def num_loss_tokens(self) -> int:
        """Tokens that carry loss."""
        return sum(self.loss_mask)


def group_by_id(trajectories: Iterable[Trajectory]) -> dict[int, list[Trajectory]]:
    """The trajectories by `Trajectory.group_id`: groups in order of first appearance, episodes in their order.

    Ids name groups within one rollout (or one trained step, `agentrl.training.step.as_trained`); trajectories of
    several rollouts may reuse them.
    """
    groups: dict[int, list[Trajectory]] = {}
    for traj in trajectories:
        groups.setdefault(traj.group_id, []).append(traj)
    return groups


def _turn_to_json(turn: Turn) -> dict[str, Any]:
    d = asdict(turn)
    d.pop("screenshot")  # binary, and saved as its own file by the run (agentrl.training.screenshots)
    routes = d.pop("routed_experts")
    if routes is not None:
        d["routed_experts"] = {"shape": list(routes.shape), "dtype": str(routes.dtype), "data": routes.ravel().tolist()}
    return d


def _turn_from_json(d: dict[str, Any]) -> Turn:
    d.pop("stale", None)  # the mask of the RL step that trained it, not the episode's: a loaded turn trains
    routes = d.pop("routed_experts", None)
    if routes is not None:
        routes = np.asarray(routes["data"], dtype=routes["dtype"]).reshape(routes["shape"])
    for key in ("prompt_ids", "generated_ids", "rollout_logprobs"):
        d[key] = tuple(d[key])
    return Turn(**d, routed_experts=routes)


def save_trajectories(trajectories: Iterable[Trajectory], path: str | Path, append: bool = True) -> None:
    """Write one JSON object per trajectory (JSONL)."""
    with open(path, "a" if append else "w") as f:
        for traj in trajectories:
            d = asdict(traj) | {"turns": [_turn_to_json(t) for t in traj.turns]}
            f.write(json.dumps(d) + "\n")


def load_trajectories(path: str | Path) -> list[Trajectory]:
    """Read trajectories saved by `save_trajectories`; a malformed line raises naming file and line.

    Every turn comes back with ``stale=False`` (`Turn.stale` was the mask of the step that trained it).

    A last line cut short (no newline: the writer was killed mid-write) is skipped with a warning, so a crashed
    run's trajectories stay readable.
    """
    out = []
    with open(path) as f:
        lines = f.readlines()
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            d["turns"] = tuple(_turn_from_json(t) for t in d["turns"])
            out.append(Trajectory(**d))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            if lineno == len(lines) and not line.endswith("\n"):
                warnings.warn(f"{path}:{lineno}: skipping a truncated last line (the run was interrupted mid-write)",
                              stacklevel=2)
                break
            raise ValueError(f"{path}:{lineno}: not a saved trajectory ({e})") from None
    return out
