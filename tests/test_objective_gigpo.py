"""GiGPO step-level advantages and per-turn credit, with hand-worked numbers; the singleton-group rule."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.objective import (
    ADVANTAGES,
    EpisodeSteps,
    compute_advantages,
    episode_steps,
    gigpo_advantages,
    turn_advantages,
)
from agentrl.records import Trajectory, Turn


def _episodes():
    # Group 0, gamma = 0.5:
    #   a: anchors s0 s1 s2, rewards 0 0 1 -> returns 0.25 0.5 1,   total 1
    #   b: anchors s0 s3 s1, rewards 0 0 0 -> returns 0 0 0,         total 0
    # Group 1: c alone (a singleton episode group).
    return [
        EpisodeSteps(0, ("s0", "s1", "s2"), (0.0, 0.0, 1.0)),
        EpisodeSteps(0, ("s0", "s3", "s1"), (0.0, 0.0, 0.0)),
        EpisodeSteps(1, ("s0",), (1.0,)),
    ]


def test_gigpo_mean_norm_hand_worked():
    # Episode level: totals (1, 0) -> +-0.5. Step groups (within group 0): s0 = {a0: 0.25, b0: 0} -> +-0.125;
    # s1 = {a1: 0.5, b2: 0} -> +-0.25; s2 = {a2} and s3 = {b1} are singletons -> 0. Group 1's s0 is not group 0's.
    adv = gigpo_advantages(_episodes(), gamma=0.5, step_weight=1.0, normalize_std=False)
    assert adv[0] == pytest.approx((0.625, 0.75, 0.5))
    assert adv[1] == pytest.approx((-0.625, -0.5, -0.75))
    assert adv[2] == (0.0,)
    half = gigpo_advantages(_episodes(), gamma=0.5, step_weight=0.5, normalize_std=False)
    assert half[0] == pytest.approx((0.5625, 0.625, 0.5))


def test_gigpo_mean_std_norm_hand_worked():
    # Two values x, y: unbiased std = |x - y| / sqrt(2), so each normalised value is +-(1/sqrt(2)) * |x-y| / (std+eps).
    eps = 1e-6
    adv = gigpo_advantages(_episodes(), gamma=0.5, eps=eps)
    episode = 0.5 / (math.sqrt(0.5) + eps)  # totals (1, 0): std = 0.7071
    s0 = 0.125 / (0.25 / math.sqrt(2) + eps)  # returns (0.25, 0)
    s1 = 0.25 / (0.5 / math.sqrt(2) + eps)  # returns (0.5, 0)
    assert adv[0] == pytest.approx((episode + s0, episode + s1, episode))
    assert adv[1] == pytest.approx((-episode - s0, -episode, -episode - s1))


def test_gigpo_step_weight_zero_is_episode_grpo():
    adv = gigpo_advantages(_episodes(), gamma=0.5, step_weight=0.0)
    grpo = compute_advantages("grpo", torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1]), eps=1e-6)
    assert [a[0] for a in adv] == pytest.approx(grpo.tolist())


def test_gigpo_rejects_bad_options():
    with pytest.raises(ValueError, match="gamma"):
        gigpo_advantages(_episodes(), gamma=1.5)
    with pytest.raises(ValueError, match="one anchor per step"):
        EpisodeSteps(0, ("s0",), (0.0, 1.0))
    with pytest.raises(ValueError, match="unknown option.*'omega'.*gigpo"):
        turn_advantages("gigpo", [], {"omega": 1.0})


def _traj(group_id: int, observations: list[str], rewards: list[float]) -> Trajectory:
    # observations[0] is what reset returned; observations[t + 1] what step t returned.
    turns = tuple(Turn((1,), (2,), (-0.1,), f"act{t}", observations[t + 1], r) for t, r in enumerate(rewards))
    return Trajectory("math", 0, group_id, turns, observations[0], sum(rewards), rewards[-1] > 0, True, False)


def test_anchor_states_come_from_the_observation_each_turn_acted_on():
    traj = _traj(0, ["room", "hall", "kitchen"], [0.0, 1.0])
    steps = episode_steps(traj)
    assert steps.anchors == ("room", "hall")  # never the last observation: no turn acted on it
    assert steps.rewards == (0.0, 1.0)


def test_turn_advantages_episode_level_and_gigpo():
    trajs = [_traj(0, ["s0", "s1", "end"], [0.0, 1.0]), _traj(0, ["s0", "s2", "end"], [0.0, 0.0])]
    per_turn = turn_advantages("group_mean", trajs, {})
    assert per_turn == [(0.5, 0.5), (-0.5, -0.5)]
    # gamma 1: returns (1, 1) and (0, 0); step group s0 = {1, 0} -> +-0.5; s1, s2 singletons.
    gigpo = turn_advantages("gigpo", trajs, {"gamma": 1.0, "normalize_std": False})
    assert gigpo == [pytest.approx((1.0, 0.5)), pytest.approx((-1.0, -0.5))]


# -- defect 8: one rule for singleton groups ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_singleton_group_gets_zero_advantage_for_every_estimator(name):
    options = {"k": 1} if name == "passk" else {}
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.7])
    groups = torch.tensor([0, 0, 1, 2])  # groups 1 and 2 are singletons
    adv = compute_advantages(name, rewards, groups, **options)
    assert adv[2].item() == 0.0 and adv[3].item() == 0.0
    assert adv[0].item() != 0.0


def test_advantage_options_are_checked_by_name():
    with pytest.raises(ValueError, match="unknown option.*'bost'.*low_success_weight.*valid options: boost"):
        compute_advantages("low_success_weight", torch.zeros(2), torch.zeros(2, dtype=torch.long), bost=2.0)
    adv = compute_advantages("low_success_weight", torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), boost=2.0)
    assert adv.tolist() == [1.0, -0.5]  # 0.5 * (1 + 2 * (1 - 0.5)), -0.5
