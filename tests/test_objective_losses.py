"""Policy losses, corrections and aggregation: the properties of docs/objective.md §6 with hand-worked numbers."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.objective import LOSSES, aggregate, correction_weights, loss_options, policy_loss


@pytest.fixture(autouse=True)
def float64_default():
    # Hand-worked numbers compare to 1e-12; restore the default so other test modules keep float32.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _grad(name: str, logp0, old, rollout, adv, mask, **options) -> torch.Tensor:
    logp = logp0.clone().requires_grad_(True)
    loss, _ = policy_loss(name, logp, old, rollout, adv, mask, **options)
    loss.backward()
    return logp.grad


def _random_batch(seed: int = 0, n: int = 6, t: int = 7):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=g) * 3  # [N, T] log-probs in (-3, 0]
    logp = old + torch.randn(n, t, generator=g) * 0.3  # stale policy
    rollout = old + torch.randn(n, t, generator=g) * 0.3  # mismatched inference engine
    adv = torch.randn(n, generator=g)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)  # [N, T] right-padded
    return logp, old, rollout, adv, mask


# -- 1. on-policy MiniRL is REINFORCE ---------------------------------------------------------------------------------


def test_on_policy_minirl_equals_reinforce():
    logp, _, _, adv, mask = _random_batch()
    old = logp.clone()
    grad_minirl = _grad("minirl", logp, old, old, adv, mask)
    # Plain REINFORCE written out: -sum_{i,t} A_i log pi / N.
    p = logp.clone().requires_grad_(True)
    (-(adv.unsqueeze(1) * p * mask).sum() / logp.shape[0]).backward()
    torch.testing.assert_close(grad_minirl, p.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_minirl, _grad("reinforce", logp, old, old, adv, mask), rtol=0, atol=1e-12)


# -- 2. MiniRL without TIS is decoupled PPO weighted by sg[rho] ---------------------------------------------------


def test_minirl_without_truncation_equals_weighted_ppo_min():
    logp, old, rollout, adv, mask = _random_batch(seed=1)
    grad_minirl = _grad("minirl", logp, old, rollout, adv, mask, is_cap=math.inf)
    p = logp.clone().requires_grad_(True)
    rho = (old - rollout).exp()  # [N, T]
    r = (p - old).exp()  # [N, T]
    a = adv.unsqueeze(1)
    ppo = torch.maximum(-a * r, -a * r.clamp(1 - 0.2, 1 + 0.27))  # [N, T]
    ((rho * ppo * mask).sum() / logp.shape[0]).backward()
    assert (grad_minirl != 0).any()
    torch.testing.assert_close(grad_minirl, p.grad, rtol=0, atol=1e-6)


# -- 3. the one-sided clip ---------------------------------------------------------------------------------------------


def test_one_sided_clip_hand_worked():
    # Four tokens, one per row: (A, r) = (+1, 1.5), (+1, 0.5), (-1, 0.5), (-1, 1.5); eps 0.2 / 0.27.
    old = torch.zeros(4, 1)
    logp = torch.log(torch.tensor([[1.5], [0.5], [0.5], [1.5]]))
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    mask = torch.ones(4, 1, dtype=torch.bool)
    grad = _grad("minirl", logp, old, old, adv, mask, correction="none")
    # d/dlogp of -sg[r] A logp / N = -r A / N where kept, exactly 0 where clipped.
    expected = torch.tensor([[0.0], [-0.5 / 4], [0.0], [1.5 / 4]])
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-15)
    _, metrics = policy_loss("minirl", logp, old, old, adv, mask, correction="none")
    assert metrics["clip_frac_high"] == 0.25 and metrics["clip_frac_low"] == 0.25 and metrics["clip_frac"] == 0.5


def test_ratio_exactly_on_the_boundary_is_kept():
    assert math.exp(math.log(1.25)) == 1.25 and math.exp(math.log(0.75)) == 0.75  # exact in float64
    old = torch.zeros(2, 1)
    logp = torch.log(torch.tensor([[1.25], [0.75]]))
    adv = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 1)
    grad = _grad("minirl", logp, old, old, adv, mask, correction="none", eps_low=0.25, eps_high=0.25)
    torch.testing.assert_close(grad, torch.tensor([[-1.25 / 2], [0.75 / 2]]), rtol=0, atol=1e-15)


@pytest.mark.parametrize("name", ["grpo", "dapo", "dr_grpo"])
def test_ppo_clip_losses_zero_gradient_exactly_where_minirl_masks(name):
    logp, old, rollout, adv, mask = _random_batch(seed=2)
    logp = old + (logp - old) * 3  # push many ratios out of the band
    extra = {"loss_scale_factor": 7} if name == "dr_grpo" else {}
    opts = loss_options(name, **extra)
    grad = _grad(name, logp, old, rollout, adv, mask, **extra)
    r = (logp - old).exp()
    a = adv.unsqueeze(1).expand_as(r)
    clipped = ((a > 0) & (r > 1 + opts.eps_high)) | ((a < 0) & (r < 1 - opts.eps_low))
    assert clipped.logical_and(mask).any() and (~clipped).logical_and(mask).any()
    assert (grad[clipped] == 0).all()
    assert (grad[~clipped & mask] != 0).all()


# -- 4. IcePop drops, TIS caps -----------------------------------------------------------------------------------------


def test_icepop_zero_gradient_outside_band_and_tis_weight_exactly_cap():
    # rho = pi_old / mu per token: 0.4 (below 0.5), 2.0 (inside), 6.0 (above 5); on-policy wrt pi_old (r = 1).
    rho = torch.tensor([[0.4, 2.0, 6.0]])
    old = torch.zeros(1, 3)
    rollout = -torch.log(rho)
    adv = torch.tensor([1.0])
    mask = torch.ones(1, 3)
    grad_icepop = _grad("minirl", old, old, rollout, adv, mask, correction="icepop")
    assert grad_icepop[0, 0].item() == 0.0 and grad_icepop[0, 2].item() == 0.0
    assert grad_icepop[0, 1].item() == pytest.approx(-2.0, abs=1e-12)
    grad_tis = _grad("minirl", old, old, rollout, adv, mask, correction="tis", is_cap=5.0)
    torch.testing.assert_close(grad_tis, torch.tensor([[-0.4, -2.0, -5.0]]), rtol=0, atol=1e-12)
    result = correction_weights("tis", old, rollout, mask, is_cap=5.0)
    assert result.weights[0, 2].item() == 5.0
    assert result.truncated.tolist() == [[False, False, True]]
    _, m = policy_loss("minirl", old, old, rollout, adv, mask, correction="icepop")
    assert m["correction_masked_frac"] == pytest.approx(2 / 3)


def test_sequence_tis_and_mis_levels():
    # Two sequences of 2 tokens: log rho = (log 2, log 3) and (log 0.5, log 0.5).
    old = torch.zeros(2, 2)
    rollout = -torch.log(torch.tensor([[2.0, 3.0], [0.5, 0.5]]))
    mask = torch.ones(2, 2)
    seq = correction_weights("tis", old, rollout, mask, is_cap=5.0, is_level="sequence").weights
    torch.testing.assert_close(seq, torch.tensor([[5.0, 5.0], [0.25, 0.25]]))  # min(6, 5), 0.25
    geo = correction_weights("mis", old, rollout, mask, mis_level="geometric", mis_low=0.5, mis_high=2.0)
    # geometric means sqrt(6) = 2.449 (rejected) and 0.5 (kept, boundary inclusive).
    torch.testing.assert_close(geo.weights, torch.tensor([[0.0, 0.0], [0.5, 0.5]]))
    assert geo.masked.tolist() == [[True, True], [False, False]]
    tok = correction_weights("mis", old, rollout, mask, mis_level="token", mis_low=0.5, mis_high=2.0)
    torch.testing.assert_close(tok.weights, torch.tensor([[2.0, 0.0], [0.5, 0.5]]))


def test_padding_does_not_enter_sequence_ratio():
    old = torch.zeros(1, 3)
    rollout = torch.tensor([[-math.log(2.0), 5.0, 5.0]])  # junk on the padding
    mask = torch.tensor([[1.0, 0.0, 0.0]])
    w = correction_weights("tis", old, rollout, mask, is_level="sequence").weights
    assert w[0, 0].item() == pytest.approx(2.0)


# -- 5. IS weights carry no gradient -----------------------------------------------------------------------------------


def test_is_weights_are_detached():
    # rho = 2, r = 1.1, A = 1, one token, N = 1: dl/dlogp = -sg[rho * r] * A = -2.2 exactly (no w log w term).
    old = torch.zeros(1, 1)
    rollout = torch.full((1, 1), -math.log(2.0))
    logp = torch.full((1, 1), math.log(1.1))
    grad = _grad("minirl", logp, old, rollout, torch.tensor([1.0]), torch.ones(1, 1))
    assert grad.item() == pytest.approx(-2.2, abs=1e-12)
    grad_cispo = _grad("cispo", logp, old, rollout, torch.tensor([1.0]), torch.ones(1, 1), correction="tis")
    assert grad_cispo.item() == pytest.approx(-2.2, abs=1e-12)  # r = 1.1 is inside CISPO's band


def test_cispo_keeps_gradient_when_clipped():
    old = torch.zeros(1, 1)
    logp = torch.full((1, 1), math.log(2.0))  # r = 2 > 1.28
    grad = _grad("cispo", logp, old, old, torch.tensor([1.0]), torch.ones(1, 1))
    assert grad.item() == pytest.approx(-1.28, abs=1e-12)


# -- 6. aggregation ----------------------------------------------------------------------------------------------------


def test_aggregation_identities_for_unit_loss():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)  # |y| = 3, 1
    ones = torch.ones(2, 4)
    assert aggregate(ones, mask, "token-mean").item() == 1.0
    assert aggregate(ones, mask, "seq-mean-token-sum").item() == 2.0  # mean |y|
    assert aggregate(ones, mask, "seq-mean-token-mean").item() == 1.0
    assert aggregate(ones, mask, "seq-mean-token-sum-norm", loss_scale_factor=8).item() == 0.5  # 4 tokens / 8
    with pytest.raises(ValueError, match="loss_scale_factor"):  # never the padded width: it varies by micro-batch
        aggregate(ones, mask, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="unknown aggregation mode"):
        aggregate(ones, mask, "token-sum")


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_micro_batches_with_global_denominators_match_one_pass(name):
    # The trainer pads each micro-batch to its own longest sample, so the micro-batches here are trimmed to their own
    # widths: a divisor taken from the padded width (Dr.GRPO's old default) would change the gradient.
    logp, old, rollout, adv, mask = _random_batch(seed=3, n=8)
    mask[:3, 4:] = False  # the first micro-batch is shorter than the whole batch
    extra = {"loss_scale_factor": 7} if name == "dr_grpo" else {}
    full = _grad(name, logp, old, rollout, adv, mask, **extra)
    p = logp.clone().requires_grad_(True)
    n_tokens = int(mask.sum())
    total = 0.0
    for rows in (slice(0, 3), slice(3, 8)):
        width = int(mask[rows].any(dim=0).nonzero().max()) + 1
        loss, _ = policy_loss(name, p[rows, :width], old[rows, :width], rollout[rows, :width], adv[rows],
                              mask[rows, :width], num_sequences=8, num_tokens=n_tokens, **extra)  # fmt: skip
        total = total + loss
    total.backward()
    torch.testing.assert_close(p.grad, full, rtol=0, atol=1e-12)


def test_doubling_a_response_doubles_its_weight_under_token_sum_only():
    # Response 0 repeated twice (2 tokens instead of 1, same per-token loss) next to a fixed response 1.
    loss_mat = torch.tensor([[1.0, 1.0], [3.0, 0.0]])
    once = torch.tensor([[1, 0], [1, 0]], dtype=torch.bool)
    twice = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    # seq-mean-token-sum: (1 + 3) / 2 -> (2 + 3) / 2, response 0's share goes from 0.5 to 1.0.
    assert aggregate(loss_mat, once, "seq-mean-token-sum").item() == 2.0
    assert aggregate(loss_mat, twice, "seq-mean-token-sum").item() == 2.5
    # seq-mean-token-mean: (1 + 3) / 2 both times.
    assert aggregate(loss_mat, once, "seq-mean-token-mean").item() == 2.0
    assert aggregate(loss_mat, twice, "seq-mean-token-mean").item() == 2.0


def test_dr_grpo_divides_by_constant_not_batch_size():
    mask = torch.ones(2, 5)
    logp = torch.zeros(2, 5)
    with pytest.raises(ValueError, match="loss_scale_factor"):
        _grad("dr_grpo", logp, logp, logp, torch.tensor([1.0, -1.0]), mask)
    grad = _grad("dr_grpo", logp, logp, logp, torch.tensor([1.0, -1.0]), mask, loss_scale_factor=10)
    torch.testing.assert_close(grad, torch.tensor([[-0.1] * 5, [0.1] * 5]))


# -- 8. GSPO -----------------------------------------------------------------------------------------------------------


def test_gspo_sequence_ratio_shared_and_whole_sequence_clipped():
    old = torch.zeros(2, 3)
    # Sequence 0: mean log-ratio 0 (s = 1, inside); sequence 1: mean log-ratio 0.01 (s = 1.01 > 1 + 4e-4, A > 0).
    logp = torch.tensor([[0.1, -0.1, 0.0], [0.02, 0.0, 0.01]])
    adv = torch.tensor([1.0, 1.0])
    mask = torch.ones(2, 3)
    grad = _grad("gspo", logp, old, old, adv, mask)
    assert (grad[1] == 0).all()
    # Inside the band: d/dlogp_t of -A * s_i * pi_t / sg[pi_t] / |y| / N = -A * s_i / 3 / 2, the same for all t.
    torch.testing.assert_close(grad[0], torch.full((3,), -1.0 / 6))
    _, metrics = policy_loss("gspo", logp, old, old, adv, mask)
    assert metrics["clip_frac_high"] == 0.5


# -- defect 5: masked positions never contribute, whatever they hold -------------------------------------------------


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("correction", ["tis", "icepop", "mis", "none"])
def test_non_finite_values_on_padding_change_nothing(name, correction):
    g = torch.Generator().manual_seed(7)
    old = -torch.rand(4, 5, generator=g) * 2
    logp = old + torch.randn(4, 5, generator=g) * 0.1
    rollout = old + torch.randn(4, 5, generator=g) * 0.1
    adv = torch.randn(4, 5, generator=g)  # per-token advantages, so padding can hold NaN there too
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
    options = {"correction": correction} | ({"loss_scale_factor": 5.0} if name == "dr_grpo" else {})
    clean = _loss_and_metrics(name, logp, old, rollout, adv, mask, **options)
    pad = ~mask
    dirty_logp = logp.masked_fill(pad, -math.inf)
    dirty = _loss_and_metrics(name, dirty_logp, old.masked_fill(pad, math.nan), rollout.masked_fill(pad, math.nan),
                           adv.masked_fill(pad, math.nan), mask, **options)
    assert torch.isfinite(dirty[0]) and torch.isfinite(dirty[1]).all()
    assert dirty[0].item() == pytest.approx(clean[0].item(), abs=1e-12)
    torch.testing.assert_close(dirty[1], clean[1], rtol=0, atol=1e-12)
    assert (dirty[1][pad] == 0).all()
    assert all(math.isfinite(v) for v in dirty[2].values())


# -- defect 6: sequence-level IS clamps the sum of the log-ratios ------------------------------------------------------


def test_sequence_is_clamps_the_sum_not_the_tokens():
    # log rho = (25, -24): the sum is 1, so the sequence ratio is e. Clamping each token to +-20 first would give 1.
    old = torch.tensor([[25.0, -24.0]])
    rollout = torch.zeros(1, 2)
    mask = torch.ones(1, 2, dtype=torch.bool)
    tis = correction_weights("tis", old, rollout, mask, is_level="sequence", is_cap=10.0)
    torch.testing.assert_close(tis.weights, torch.full((1, 2), math.e))
    mis = correction_weights("mis", old, rollout, mask, mis_level="sequence", mis_low=0.5, mis_high=3.0)
    torch.testing.assert_close(mis.weights, torch.full((1, 2), math.e))
    # The sum itself is still bounded: log rho summing to 30 gives exp(20).
    big = correction_weights("tis", torch.tensor([[15.0, 15.0]]), rollout, mask, is_level="sequence", is_cap=1e12)
    assert big.weights[0, 0].item() == pytest.approx(math.exp(20.0))


def _loss_and_metrics(name, logp0, old, rollout, adv, mask, **options):
    logp = logp0.clone().requires_grad_(True)
    loss, metrics = policy_loss(name, logp, old, rollout, adv, mask, **options)
    loss.backward()
    return loss.detach(), logp.grad, metrics


# -- options and errors ------------------------------------------------------------------------------------------------


def test_defaults_match_the_spec():
    minirl = loss_options("minirl")
    assert (minirl.eps_low, minirl.eps_high, minirl.is_cap, minirl.correction, minirl.agg) == (
        0.2, 0.27, 5.0, "tis", "seq-mean-token-sum")  # fmt: skip
    dapo = loss_options("dapo")
    assert (dapo.eps_high, dapo.agg) == (0.28, "token-mean")
    icepop = loss_options("grpo", correction="icepop")
    assert (icepop.icepop_low, icepop.icepop_high) == (0.5, 5.0)


def test_bad_input_gets_clear_errors():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="unknown option.*'eps'.*minirl"):
        policy_loss("minirl", x, x, x, torch.zeros(2), x, eps=0.1)
    with pytest.raises(ValueError, match="unknown policy loss 'ppo'"):
        policy_loss("ppo", x, x, x, torch.zeros(2), x)
    with pytest.raises(ValueError, match="unknown correction"):
        policy_loss("minirl", x, x, x, torch.zeros(2), x, correction="clip")
    with pytest.raises(ValueError, match="advantages must be"):
        policy_loss("minirl", x, x, x, torch.zeros(3), x)
    with pytest.raises(ValueError, match="rollout_logp has shape"):
        policy_loss("minirl", x, x, torch.zeros(2, 4), torch.zeros(2), x)


def test_metrics_are_floats_with_required_names():
    logp, old, rollout, adv, mask = _random_batch(seed=4)
    for name in LOSSES:
        extra = {"loss_scale_factor": 7} if name == "dr_grpo" else {}
        _, metrics = policy_loss(name, logp, old, rollout, adv, mask, **extra)
        for key in ("is_weight_mean", "is_weight_max", "is_ess", "correction_masked_frac",
                    "correction_truncated_frac", "clip_frac", "clip_frac_low", "clip_frac_high", "kl_k1", "kl_k3",
                    "ppo_kl", "loss"):  # fmt: skip
            assert isinstance(metrics[key], float), (name, key)
        log_rho = (old - rollout)[mask]
        assert metrics["kl_k1"] == pytest.approx(float((-log_rho).mean()))
        assert metrics["kl_k3"] == pytest.approx(float((log_rho.exp() - 1 - log_rho).mean()))


# -- zero advantage, zero gradient (the trainer skips such samples) ---------------------------------------------------


@pytest.mark.parametrize("name", sorted(LOSSES))
@pytest.mark.parametrize("correction", ["tis", "icepop", "mis", "none"])
def test_zero_advantage_gives_exactly_zero_gradient_whatever_the_ratios(name, correction):
    """Every loss is the advantage times a function of the log-probs: the trainer leaves samples whose loss tokens
    all have advantage 0 out of the passes (`agentrl.recipes.train.gradient_members`) on the strength of this."""
    logp, old, rollout, _, mask = _random_batch(seed=3)
    adv = torch.where(mask, 0.0, 5.0)  # [N, T]: zero on every loss token, anything on padding
    for agg in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        grad = _grad(name, logp, old, rollout, adv, mask, correction=correction, agg=agg,
                     **({"loss_scale_factor": 7.0} if agg.endswith("norm") else {}))
        assert (grad == 0).all(), (name, correction, agg)
