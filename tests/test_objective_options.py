"""Objective options beyond each loss's recipe, and the defects of issue 18, with hand-worked numbers.

Reference KL (k1 / k2 / k3) in the loss and in the reward, entropy bonus, dual-clip, a TIS floor, bypass mode, a
rejection mask combined with IS weights; masked positions holding -inf / NaN; sequence-level IS clamping the sum.
"""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.objective import (
    kl_penalty,
    kl_reward_penalty,
    loss_options,
    policy_loss,
    rejection_mask,
)


@pytest.fixture(autouse=True)
def float64_default():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _loss_and_grad(name, logp0, old, rollout, adv, mask, **kwargs):
    logp = logp0.clone().requires_grad_(True)
    loss, metrics = policy_loss(name, logp, old, rollout, adv, mask, **kwargs)
    loss.backward()
    return loss.detach(), logp.grad, metrics


def _one(value: float) -> torch.Tensor:
    return torch.full((1, 1), value)


# -- dual-clip -------------------------------------------------------------------------------------------------------


def test_dual_clip_caps_negative_advantage_surrogate():
    # A = -1, r = 4 (> 1 + eps_high, above c = 3): PPO-clip max(-A r, -A clip(r)) = max(4, 1.2) = 4, gradient -A r = 4.
    # With dual-clip c = 3 the surrogate is min(4, -A c) = 3, a constant: zero gradient.
    old, logp, adv, mask = _one(0.0), _one(math.log(4.0)), torch.tensor([-1.0]), torch.ones(1, 1)
    loss, grad, _ = _loss_and_grad("grpo", logp, old, old, adv, mask)
    assert (loss.item(), grad.item()) == (pytest.approx(4.0), pytest.approx(4.0))
    loss, grad, metrics = _loss_and_grad("grpo", logp, old, old, adv, mask, dual_clip=3.0)
    assert (loss.item(), grad.item()) == (pytest.approx(3.0), 0.0)
    assert metrics["clip_frac_high"] == 1.0
    # r = 2 < c: untouched, gradient -A r = 2.
    _, grad, _ = _loss_and_grad("grpo", _one(math.log(2.0)), old, old, adv, mask, dual_clip=3.0)
    assert grad.item() == pytest.approx(2.0)
    # MiniRL: the same tokens are masked (r = 4 > c), the others keep -sg[w r] A = 2.
    _, grad, _ = _loss_and_grad("minirl", logp, old, old, adv, mask, dual_clip=3.0, correction="none")
    assert grad.item() == 0.0
    _, grad, _ = _loss_and_grad("minirl", _one(math.log(2.0)), old, old, adv, mask, dual_clip=3.0, correction="none")
    assert grad.item() == pytest.approx(2.0)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        loss_options("grpo", dual_clip=0.5)


# -- TIS lower bound -------------------------------------------------------------------------------------------------


def test_tis_floor_raises_small_weights_to_the_floor():
    # rho = (0.1, 2, 8): with floor 0.5 and cap 5 the weights are (0.5, 2, 5); on-policy MiniRL gradient -w A.
    rho = torch.tensor([[0.1, 2.0, 8.0]])
    old = torch.zeros(1, 3)
    rollout = -torch.log(rho)
    _, grad, metrics = _loss_and_grad("minirl", old, old, rollout, torch.tensor([1.0]), torch.ones(1, 3),
                                      is_floor=0.5)  # fmt: skip
    torch.testing.assert_close(grad, torch.tensor([[-0.5, -2.0, -5.0]]), rtol=0, atol=1e-12)
    assert metrics["correction_truncated_frac"] == pytest.approx(2 / 3)
    _, grad, _ = _loss_and_grad("minirl", old, old, rollout, torch.tensor([1.0]), torch.ones(1, 3))
    torch.testing.assert_close(grad, torch.tensor([[-0.1, -2.0, -5.0]]), rtol=0, atol=1e-12)  # default: no floor
    with pytest.raises(ValueError, match="is_floor"):
        policy_loss("minirl", old, old, rollout, torch.tensor([1.0]), torch.ones(1, 3), is_floor=6.0)


# -- IS weight combined with a rejection mask --------------------------------------------------------------------------


def test_token_tis_with_geometric_rejection_mask():
    # Sequence 0: rho = (2, 0.5), geometric mean 1 -> kept, token TIS weights (2, 0.5).
    # Sequence 1: rho = (2, 2), geometric mean 2 -> outside Geo-RS band [0.999, 1.001], both tokens weight 0.
    rho = torch.tensor([[2.0, 0.5], [2.0, 2.0]])
    old = torch.zeros(2, 2)
    rollout = -torch.log(rho)
    mask = torch.ones(2, 2)
    keep = rejection_mask("geometric", old, rollout, mask, 0.999, 1.001)
    assert keep.tolist() == [[True, True], [False, False]]
    _, grad, metrics = _loss_and_grad("minirl", old, old, rollout, torch.tensor([1.0, 1.0]), mask,
                                      rejection="geometric", rejection_low=0.999, rejection_high=1.001)  # fmt: skip
    # -w A / N with N = 2.
    torch.testing.assert_close(grad, torch.tensor([[-1.0, -0.25], [0.0, 0.0]]), rtol=0, atol=1e-12)
    assert metrics["correction_masked_frac"] == 0.5
    token_keep = rejection_mask("token", old, rollout, mask, 0.5, 1.5)
    assert token_keep.tolist() == [[False, True], [False, False]]


# -- KL to a reference model -------------------------------------------------------------------------------------------


def test_kl_estimators_hand_worked():
    # log pi = -1.0, log pi_ref = -1.2, x = log pi_ref - log pi = -0.2.
    logp, ref = _one(-1.0), _one(-1.2)
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(0.2)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.02)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(math.exp(-0.2) + 0.2 - 1)  # 0.0187307531
    assert kl_penalty(_one(0.0), _one(-50.0), "k3").item() == 10.0  # x clamped to -20, then k3 to 10 (verl)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalty(logp, ref, "k4")


@pytest.mark.parametrize(("estimator", "value", "slope"), [
    ("k1", 0.2, 1.0),                                 # d/dlogp (logp - ref) = 1
    ("k2", 0.02, 0.2),                                # d/dlogp 0.5 (logp - ref)^2 = logp - ref
    ("k3", math.exp(-0.2) + 0.2 - 1, 1 - math.exp(-0.2)),  # d/dlogp (e^(ref-logp) - (ref-logp) - 1)
])  # fmt: skip
def test_kl_in_the_loss(estimator, value, slope):
    # A = 0 so the policy-gradient term is zero: the loss is kl_coef * k, the gradient kl_coef * dk/dlogp.
    logp, ref = _one(-1.0), _one(-1.2)
    loss, grad, metrics = _loss_and_grad("minirl", logp, logp, logp, torch.tensor([0.0]), torch.ones(1, 1),
                                         ref_logp=ref, kl_coef=0.5, kl_estimator=estimator)  # fmt: skip
    assert loss.item() == pytest.approx(0.5 * value)
    assert grad.item() == pytest.approx(0.5 * slope)
    assert metrics["ref_kl"] == pytest.approx(value)
    with pytest.raises(ValueError, match="needs ref_logp"):
        policy_loss("minirl", logp, logp, logp, torch.tensor([0.0]), torch.ones(1, 1), kl_coef=0.5)


def test_kl_as_reward_penalty():
    # Tokens: (log pi_old, log pi_ref) = (-1, -1.2), (-2, -1.5), padding holding NaN / -inf.
    old = torch.tensor([[-1.0, -2.0, math.nan]])
    ref = torch.tensor([[-1.2, -1.5, -math.inf]])
    mask = torch.tensor([[1, 1, 0]])
    k1 = kl_reward_penalty(old, ref, mask, coef=0.1, estimator="k1")
    assert k1.item() == pytest.approx(0.1 * (0.2 - 0.5))
    k3 = kl_reward_penalty(old, ref, mask, coef=0.1, estimator="k3")
    assert k3.item() == pytest.approx(0.1 * ((math.exp(-0.2) + 0.2 - 1) + (math.exp(0.5) - 0.5 - 1)))
    with pytest.raises(ValueError, match=">= 0"):
        kl_reward_penalty(old, ref, mask, coef=-1.0)


def test_reference_kl_ignores_non_finite_padding():
    logp = torch.tensor([[-1.0, 0.0]])
    ref = torch.tensor([[-1.2, -math.inf]])
    mask = torch.tensor([[1, 0]])
    loss, grad, metrics = _loss_and_grad("minirl", logp.masked_fill(~mask.bool(), math.nan), logp, logp,
                                         torch.tensor([0.0]), mask, ref_logp=ref, kl_coef=1.0)  # fmt: skip
    assert loss.item() == pytest.approx(math.exp(-0.2) + 0.2 - 1) and grad[0, 1].item() == 0.0
    assert metrics["ref_kl"] == pytest.approx(math.exp(-0.2) + 0.2 - 1)


# -- entropy bonus ---------------------------------------------------------------------------------------------------


def test_entropy_bonus_subtracts_coef_times_entropy():
    logp = torch.zeros(1, 3)
    entropy = torch.tensor([[0.5, 1.0, 7.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0]])  # the third position is padding
    loss, metrics = policy_loss("minirl", logp, logp, logp, torch.tensor([0.0]), mask, entropy=entropy,
                                entropy_coef=0.01)  # fmt: skip
    assert loss.item() == pytest.approx(-0.01 * 1.5)  # token sum over one response
    loss.backward()
    torch.testing.assert_close(entropy.grad, torch.tensor([[-0.01, -0.01, 0.0]]))
    assert metrics["policy_entropy"] == pytest.approx(0.75)
    with pytest.raises(ValueError, match="needs entropy"):
        policy_loss("minirl", logp, logp, logp, torch.tensor([0.0]), mask, entropy_coef=0.01)


# -- bypass mode -------------------------------------------------------------------------------------------------------


def test_bypass_mode_clips_pi_theta_over_mu():
    # pi_old = mu: rho = 1 for every correction, and the clip acts on r = pi_theta / mu.
    mu = _one(math.log(0.5))
    adv = torch.tensor([1.0])
    _, grad, metrics = _loss_and_grad("minirl", _one(math.log(0.6)), mu, mu, adv, torch.ones(1, 1))
    assert grad.item() == pytest.approx(-1.2)  # r = 1.2 inside the band: -sg[w r] A with w = 1
    assert metrics["is_weight_mean"] == 1.0 and metrics["kl_k3"] == 0.0
    _, grad, _ = _loss_and_grad("minirl", _one(math.log(0.75)), mu, mu, adv, torch.ones(1, 1))
    assert grad.item() == 0.0  # r = 1.5 > 1.27 with A > 0: masked


def test_prebuilt_options_equal_keyword_options():
    logp, adv, mask = torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2)
    opts = loss_options("dr_grpo", loss_scale_factor=4.0)
    a, _ = policy_loss("dr_grpo", logp, logp, logp, adv, mask, opts=opts)
    b, _ = policy_loss("dr_grpo", logp, logp, logp, adv, mask, loss_scale_factor=4.0)
    assert a.item() == b.item() == -0.5
    with pytest.raises(ValueError, match="not both"):
        policy_loss("dr_grpo", logp, logp, logp, adv, mask, opts=opts, eps_low=0.1)
    with pytest.raises(ValueError, match="takes DrGRPOOptions"):
        policy_loss("dr_grpo", logp, logp, logp, adv, mask, opts=loss_options("minirl"))
