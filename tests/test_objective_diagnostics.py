"""Diagnostics (entropy, KL estimators, IS stats) and the collapse guard."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.objective import CollapseGuard, GuardVerdict, importance_weight_stats, kl_estimates, token_entropy


def test_token_entropy_hand_worked_and_chunked():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0], [math.log(3.0), 0.0, -1e9, -1e9]]])
    ent = token_entropy(logits, chunk_size=2)  # [1, 3], chunk boundary inside the sequence
    p = torch.tensor([0.75, 0.25])
    expected = torch.tensor([[math.log(4.0), 0.0, float(-(p * p.log()).sum())]])
    torch.testing.assert_close(ent, expected, atol=1e-6, rtol=0)
    big = torch.randn(2, 7, 11)
    torch.testing.assert_close(token_entropy(big, chunk_size=3), token_entropy(big, chunk_size=1024))


def test_k1_and_k3_are_exact_kl_under_p_and_k3_is_nonnegative():
    # mu = p = (0.5, 0.25, 0.25) sampled exactly in proportion: 4 tokens, categories 0, 0, 1, 2.
    p = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    q = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)  # pi_old
    cats = torch.tensor([0, 0, 1, 2])
    rollout_logp, old_logp = p.log()[cats].unsqueeze(0), q.log()[cats].unsqueeze(0)  # [1, 4]
    mask = torch.ones(1, 4, dtype=torch.bool)
    kl = float((p * (p / q).log()).sum())
    est = kl_estimates(old_logp, rollout_logp, mask)
    assert est["kl_k1"] == pytest.approx(kl, abs=1e-12)
    assert est["kl_k3"] == pytest.approx(kl, abs=1e-12)
    assert abs(est["kl_k2"] - kl) > 1e-3  # k2 is biased
    log_rho = torch.linspace(-5, 5, 101)
    assert (log_rho.exp() - 1 - log_rho >= 0).all()


def test_importance_weight_stats():
    w = torch.tensor([[1.0, 1.0, 4.0, 9.0]])
    mask = torch.tensor([[True, True, True, False]])
    stats = importance_weight_stats(w, mask)
    assert stats["is_weight_mean"] == 2.0 and stats["is_weight_max"] == 4.0
    assert stats["is_ess"] == pytest.approx(36 / (3 * 18))  # (sum w)^2 / (n sum w^2)


def test_guard_trips_after_patience_consecutive_bad_steps():
    guard = CollapseGuard(patience=3, action="rollback")
    healthy = {"entropy": 0.9, "kl_k3": 0.001}
    low_entropy = {"entropy": 0.1, "kl_k3": 0.001}
    assert guard.update(healthy) == GuardVerdict(True, "", "none", 0, 0)
    assert guard.update(low_entropy).ok and guard.update(low_entropy).ok
    assert guard.update(healthy).ok  # the streak resets
    verdicts = [guard.update(low_entropy) for _ in range(3)]
    assert [v.ok for v in verdicts] == [True, True, False]
    final = verdicts[-1]
    assert final.action == "rollback" and final.last_good_step == 3 and final.bad_streak == 3
    assert "entropy 0.1 < 0.25" in final.reason and "roll back to step 3" in final.reason


def test_guard_kl_threshold_and_stop_action():
    guard = CollapseGuard(k3_max=0.01, patience=1, action="stop")
    verdict = guard.update({"entropy": 1.0, "kl_k3": 0.05}, step=42)
    assert not verdict.ok and verdict.action == "stop"
    assert "KL(mu||pi_old) k3 0.05 > 0.01" in verdict.reason and "step 42" in verdict.reason
    assert not CollapseGuard(patience=1).update({"entropy": float("nan"), "kl_k3": 0.0}).ok


def test_guard_errors_are_clear():
    with pytest.raises(ValueError, match="unknown guard action"):
        CollapseGuard(action="pause")
    with pytest.raises(KeyError, match="needs metric 'entropy'"):
        CollapseGuard().update({"kl_k3": 0.0})
    assert CollapseGuard(entropy_min=None).update({"kl_k3": 0.0}).ok  # disabled checks need no metric


def test_guard_verdict_says_whether_this_step_is_healthy():
    guard = CollapseGuard(entropy_min=0.5, k3_max=None, patience=2, action="rollback")
    assert guard.update({"entropy": 1.0}).healthy
    bad = guard.update({"entropy": 0.1})
    assert bad.ok and not bad.healthy and bad.last_good_step == 0  # within patience, but not checkpoint material
    tripped = guard.update({"entropy": 0.1})
    assert not tripped.ok and tripped.last_good_step == 0 and "roll back to step 0" in tripped.reason


def test_guard_skips_an_unmeasured_kl_and_keeps_its_streak():
    # sync_every 4: the mismatch is measured on fresh samples only, every fourth step; the other steps carry None.
    # A mismatch that reads bad at each measurement must still trip the guard after `patience` readings.
    guard = CollapseGuard(entropy_min=0.05, k3_max=0.01, patience=2, action="stop", kl_key="mismatch_kl_k3")
    row = {"entropy": 1.0}
    assert guard.update(row | {"mismatch_kl_k3": 0.05}).bad_streak == 1
    unmeasured = guard.update(row | {"mismatch_kl_k3": None})
    assert unmeasured.ok and unmeasured.healthy and unmeasured.last_good_step == 1  # entropy alone judged it
    tripped = guard.update(row | {"mismatch_kl_k3": 0.02})
    assert not tripped.ok and tripped.bad_streak == 2 and "for 2 consecutive readings" in tripped.reason
    # A good reading ends the KL streak; NaN still counts as bad (a diverged pass is not "unmeasured").
    guard = CollapseGuard(k3_max=0.01, patience=2, kl_key="mismatch_kl_k3")
    assert [guard.update(row | {"mismatch_kl_k3": v}).ok for v in (0.05, 0.001, 0.05, None, 0.001)] == [True] * 5
    nan = guard.update(row | {"mismatch_kl_k3": float("nan")})
    assert nan.ok and not nan.healthy and nan.bad_streak == 1
    with pytest.raises(ValueError, match="'entropy' is None"):
        CollapseGuard().update({"entropy": None, "kl_k3": 0.0})


def test_entropy_and_kl_streaks_are_counted_apart():
    guard = CollapseGuard(entropy_min=0.5, k3_max=0.01, patience=2)
    assert guard.update({"entropy": 0.1, "kl_k3": 0.001}).bad_streak == 1
    # entropy recovers as the KL goes bad: each signal has one bad reading, nothing trips
    both = guard.update({"entropy": 1.0, "kl_k3": 0.5})
    assert both.ok and both.bad_streak == 1
    assert not guard.update({"entropy": 1.0, "kl_k3": 0.5}).ok


def test_mismatch_reads_the_fresh_micro_batches_alone():
    from agentrl.training.backend import LossResult
    from agentrl.training.step import UpdateResult

    results = [LossResult({"kl_k1": 0.2, "kl_k3": 0.1}, 10.0), LossResult({"kl_k1": 0.9, "kl_k3": 0.5}, 10.0),
               LossResult({"kl_k1": 0.4, "kl_k3": 0.3}, 30.0)]
    mixed = UpdateResult(results, [1.0], 0, [True, False, True])
    # token-weighted over the fresh two: k3 (10 x 0.1 + 30 x 0.3) / 40 = 0.25, k1 (2 + 12) / 40 = 0.35
    assert mixed.mismatch() == pytest.approx({"mismatch_kl_k1": 0.35, "mismatch_kl_k3": 0.25, "mismatch_tokens": 40})
    stale = UpdateResult(results, [1.0], 0, [False, False, False])
    assert stale.mismatch() == {"mismatch_kl_k1": None, "mismatch_kl_k3": None, "mismatch_tokens": None}
