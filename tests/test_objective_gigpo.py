"""GiGPO step-level advantages and per-turn credit, with hand-worked numbers; the singleton-group rule."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from agentrl.objective import (
    ADVANTAGES,
    AdvantageSpec,
    EpisodeSteps,
    GiGPOOptions,
    advantage_options,
    compute_advantages,
    episode_steps,
    gigpo_advantages,
    turn_advantages,
)
from agentrl.objective.gigpo import StepGroupStats, step_group_stats
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


def test_step_group_stats_hand_worked():
    # _episodes(), gamma 0.5: 7 steps; (0, s0) = {a0: 0.25, b0: 0} and (0, s1) = {a1: 0.5, b2: 0} are shared and mixed
    # (4 steps); s2, s3 and group 1's s0 are alone.
    assert step_group_stats(_episodes(), gamma=0.5) == StepGroupStats(4 / 7, 4 / 7)
    # Shared anchors with equal returns are not mixed: rewards (0, 1) and (1, 0) from x give returns 1 and 1 at
    # gamma 1, 0.5 and 1 at gamma 0.5; from y, 1 and 0 either way.
    two = [EpisodeSteps(0, ("x", "y"), (0.0, 1.0)), EpisodeSteps(0, ("x", "y"), (1.0, 0.0))]
    assert step_group_stats(two, gamma=1.0) == StepGroupStats(1.0, 0.5)
    assert step_group_stats(two, gamma=0.5) == StepGroupStats(1.0, 1.0)
    assert step_group_stats([], gamma=0.5) == StepGroupStats(0.0, 0.0)
    # Episodes left out of the loss still partner in step groups (as in the advantages) but are not counted: with b
    # left out, a's steps at s0 and s1 are shared and mixed (2 of a's 3 steps), c's lone step is not.
    assert step_group_stats(_episodes(), gamma=0.5, counted=[True, False, True]) == StepGroupStats(2 / 4, 2 / 4)


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


@pytest.mark.parametrize("name", sorted(n for n, spec in ADVANTAGES.items() if spec.level == "episode"))
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


@pytest.mark.parametrize("name", sorted(ADVANTAGES))
def test_singleton_groups_get_zero_per_turn_too_gigpo_included(name):
    options = {"k": 1} if name == "passk" else {}
    trajs = [_traj(0, ["s0", "s1", "end"], [0.0, 1.0]), _traj(0, ["s0", "s2", "end"], [0.0, 0.0]),
             _traj(1, ["s0", "s1", "end"], [0.0, 1.0])]  # group 1 is one episode alone
    per_turn = turn_advantages(name, trajs, options)
    assert per_turn[2] == (0.0, 0.0) and per_turn[0] != (0.0, 0.0)


# -- one registry: every estimator with its typed options, GiGPO included (issue 40) --------------------------------


def test_every_estimator_is_registered_with_frozen_typed_options():
    assert ADVANTAGES["gigpo"].level == "step" and ADVANTAGES["gigpo"].options is GiGPOOptions
    assert {n for n, spec in ADVANTAGES.items() if spec.level == "episode"} == {
        "group_mean", "grpo", "loo", "low_success_weight", "passk"}
    for name, spec in ADVANTAGES.items():
        assert dataclasses.is_dataclass(spec.options) and spec.options.__dataclass_params__.frozen, name
        assert advantage_options(name) == spec.options()  # no option given: the estimator's defaults
    assert advantage_options("gigpo", gamma=1) == GiGPOOptions(gamma=1.0, step_weight=1.0, normalize_std=True, eps=1e-6)
    assert isinstance(advantage_options("gigpo", gamma=1).gamma, float)  # YAML's 1 for a float option is 1.0
    passk = ADVANTAGES["passk"]
    assert passk.min_group_size(advantage_options("passk", k=8)) == 8 and passk.min_group_size(passk.options()) == 4


def test_turn_advantages_dispatches_on_the_level_the_entry_declares(monkeypatch):
    # A step-level estimator under a new name gets the episodes' steps, as GiGPO does: nothing keys on "gigpo".
    @dataclasses.dataclass(frozen=True)
    class Scale:
        factor: float = 2.0

    seen = []

    def per_step_reward(episodes, opts):
        seen.append(episodes)
        return [tuple(opts.factor * r for r in ep.rewards) for ep in episodes]

    monkeypatch.setitem(ADVANTAGES, "scaled_step_reward", AdvantageSpec(per_step_reward, Scale, "test", level="step"))
    trajs = [_traj(0, ["s0", "s1", "end"], [0.0, 1.0]), _traj(3, ["s0", "end"], [0.5])]
    assert turn_advantages("scaled_step_reward", trajs, {"factor": 3}) == [(0.0, 3.0), (1.5,)]
    assert seen == [[episode_steps(t) for t in trajs]]
    # GiGPO through the registry gives exactly what its own function gives.
    assert turn_advantages("gigpo", trajs, {"gamma": 0.5}) == gigpo_advantages(
        [episode_steps(t) for t in trajs], gamma=0.5)
    with pytest.raises(ValueError, match="'gigpo' gives one advantage per step.*turn_advantages"):
        compute_advantages("gigpo", torch.tensor([1.0, 0.0]), torch.tensor([0, 0]))


def test_a_bad_option_is_named_with_the_valid_ones():
    with pytest.raises(ValueError) as err:
        advantage_options("gigpo", omega=1.0)
    assert str(err.value) == ("unknown option(s) 'omega' for advantage estimator 'gigpo'; "
                              "valid options: gamma, step_weight, normalize_std, eps")
    with pytest.raises(ValueError, match="unknown option.*'eps'.*'group_mean'; valid options: \\(none\\)"):
        advantage_options("group_mean", eps=0.1)
    with pytest.raises(ValueError, match="option 'k' of advantage estimator 'passk' must be int, got 2.5"):
        advantage_options("passk", k=2.5)
    with pytest.raises(ValueError, match="option 'normalize_std' of advantage estimator 'gigpo' must be bool"):
        advantage_options("gigpo", normalize_std="yes")
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'; choose one of group_mean"):
        advantage_options("ppo")
