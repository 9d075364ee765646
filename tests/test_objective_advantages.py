"""Advantage estimators, overlong handling and mini-batch splitting, with hand-worked numbers."""

from __future__ import annotations

import pytest
import torch

from agentrl.config import OverlongConfig
from agentrl.objective import (
    ADVANTAGES,
    apply_overlong,
    compute_advantages,
    informative_groups,
    minibatch_indices,
    overlong_penalty,
    policy_loss,
)

REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
GROUPS = torch.tensor([0, 0, 0, 0, 7, 7, 7, 7])  # ids need not be 0..G-1


@pytest.mark.parametrize("name", ["group_mean", "grpo", "loo", "passk"])
def test_advantages_sum_to_zero_within_each_group(name):
    adv = compute_advantages(name, REWARDS, GROUPS)
    for g in (0, 7):
        assert adv[GROUPS == g].sum().item() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("name", sorted(n for n, spec in ADVANTAGES.items() if spec.level == "episode"))
def test_all_equal_rewards_give_zero_advantage_and_zero_gradient(name):
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    adv = compute_advantages(name, rewards, groups, **({"k": 2} if name == "passk" else {}))
    assert (adv == 0).all()
    logp = torch.randn(6, 4, requires_grad=True)
    loss, _ = policy_loss("minirl", logp, logp.detach(), logp.detach(), adv, torch.ones(6, 4))
    loss.backward()
    assert (logp.grad == 0).all()


def test_hand_worked_values():
    r, g = torch.tensor([1.0, 0.0, 0.0, 0.0]), torch.zeros(4, dtype=torch.long)
    torch.testing.assert_close(compute_advantages("group_mean", r, g), torch.tensor([0.75, -0.25, -0.25, -0.25]))
    # Unbiased std of (1, 0, 0, 0) is sqrt(0.75 / 3) = 0.5; the epsilon is 1e-6.
    torch.testing.assert_close(compute_advantages("grpo", r, g), torch.tensor([0.75, -0.25, -0.25, -0.25]) / 0.500001)
    torch.testing.assert_close(compute_advantages("loo", r, g), torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))
    # Success rate 0.25 -> positives x (1 + 1 * 0.75).
    torch.testing.assert_close(
        compute_advantages("low_success_weight", r, g), torch.tensor([0.75 * 1.75, -0.25, -0.25, -0.25])
    )
    # Pass@2 with 1 success of 4: R = 1 - C(3,2)/C(4,2) = 0.5; pos 0.5, neg 0.5 - C(2,1)/C(3,1) = -1/6; std 0.5.
    torch.testing.assert_close(compute_advantages("passk", r, g, k=2), torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))


def test_low_success_boost_shrinks_on_easy_prompts():
    g = torch.zeros(4, dtype=torch.long)
    hard = compute_advantages("low_success_weight", torch.tensor([1.0, 0, 0, 0]), g)
    easy = compute_advantages("low_success_weight", torch.tensor([1.0, 1, 1, 0]), g)
    assert hard[0] / 0.75 == pytest.approx(1.75) and easy[0] / 0.25 == pytest.approx(1.25)


def test_singleton_groups_get_zero_even_under_grpo():
    # One rule for every estimator (test_objective_gigpo.py checks them all); verl's GRPO would return 0.7 here.
    r, g = torch.tensor([0.7]), torch.tensor([3])
    assert compute_advantages("grpo", r, g).item() == 0.0
    assert compute_advantages("group_mean", r, g).item() == 0.0
    assert compute_advantages("loo", r, g).item() == 0.0


def test_advantage_errors_are_clear():
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        compute_advantages("ppo", REWARDS, GROUPS)
    with pytest.raises(ValueError, match="unknown option.*'std'.*grpo"):
        compute_advantages("grpo", REWARDS, GROUPS, std=False)
    with pytest.raises(ValueError, match="integer"):
        compute_advantages("grpo", REWARDS, GROUPS.float())
    with pytest.raises(ValueError, match="1 <= k <= group size"):
        compute_advantages("passk", REWARDS, GROUPS, k=5)


def test_informative_groups_drops_all_equal_groups():
    keep = informative_groups(torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 1]))
    assert keep.tolist() == [False, False, True, True]


def test_overlong_penalty_and_filter():
    lengths = torch.tensor([10, 16, 18, 25])
    # L_max 20, L_cache 4: free up to 16, then -1/4 per token, capped at -1.
    torch.testing.assert_close(overlong_penalty(lengths, 20, 4), torch.tensor([0.0, 0.0, -0.5, -1.0]))
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0])
    truncated = torch.tensor([False, False, False, True])
    mask = torch.ones(4, 3, dtype=torch.bool)
    new_r, new_m = apply_overlong(rewards, lengths, truncated, mask, OverlongConfig(mode="filter"))
    assert new_r.tolist() == [1.0] * 4 and new_m.sum(dim=1).tolist() == [3, 3, 3, 0]
    cfg = OverlongConfig(mode="penalize", max_length=20, cache_length=4)
    new_r, new_m = apply_overlong(rewards, lengths, truncated, mask, cfg)
    assert new_r.tolist() == [1.0, 1.0, 0.5, 0.0] and bool(new_m.all())
    with pytest.raises(ValueError, match="needs max_length"):  # left empty, the trainer fills in the turn budget
        apply_overlong(rewards, lengths, truncated, mask, OverlongConfig(mode="penalize"))
    with pytest.raises(ValueError, match="unknown overlong mode"):
        OverlongConfig(mode="drop")


def test_minibatches_keep_groups_whole_and_cover_everything():
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    parts = minibatch_indices(groups, 2, generator=torch.Generator().manual_seed(0))
    assert len(parts) == 2
    assert sorted(torch.cat(parts).tolist()) == list(range(8))
    for part in parts:
        ids = groups[part]
        for g in ids.unique():
            assert int((ids == g).sum()) == 2
    with pytest.raises(ValueError, match="4 groups cannot fill 5"):
        minibatch_indices(groups, 5)
