"""pass@k, intervals and comparisons of `agentrl eval` against hand-computed values."""

from __future__ import annotations

import math

import pytest

from agentrl.passk import (
    Interval,
    bootstrap_pass_at_k,
    bootstrap_pass_at_k_difference,
    mean_interval,
    newcombe_difference,
    pass_at_k,
    t_quantile,
    task_counts,
    welch_difference,
    wilson_interval,
)
from agentrl.recipes.evaluate import summarize


@pytest.mark.parametrize("n, c, k, expected", [
    (5, 2, 1, 2 / 5),
    (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
    (5, 2, 3, 1 - 1 / 10),  # 1 - C(3,3)/C(5,3)
    (5, 2, 4, 1.0),  # any 4 of 5 samples include a success
    (10, 3, 2, 1 - 21 / 45),  # 1 - C(7,2)/C(10,2)
    (10, 0, 5, 0.0),
    (10, 10, 1, 1.0),
    (200, 1, 100, 0.5),  # 1 - C(199,100)/C(200,100) = 1 - 100/200
])
def test_pass_at_k_matches_hand_computed_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_rejects_impossible_inputs_with_a_clear_message():
    with pytest.raises(ValueError, match="samples per task"):
        pass_at_k(4, 1, 8)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(4, 5, 1)


def test_wilson_interval_hand_values():
    iv = wilson_interval(5, 10)  # centre 0.5, half-width z*sqrt(0.025 + z^2/400)/(1 + z^2/10)
    assert (iv.low, iv.high) == pytest.approx((0.236593, 0.763407), abs=1e-6)
    zero = wilson_interval(0, 10)  # upper bound z^2/n / (1 + z^2/n)
    assert zero.low == 0.0 and zero.high == pytest.approx(0.3841459 / 1.3841459, abs=1e-6)
    assert wilson_interval(10, 10).high == 1.0


@pytest.mark.parametrize("df, exact", [(1, 12.7062), (2, 4.3027), (3, 3.1824), (5, 2.5706), (10, 2.2281),
                                       (30, 2.0423)])
def test_t_quantile_close_to_tables(df, exact):
    assert t_quantile(0.975, df) == pytest.approx(exact, rel=2e-3)


@pytest.mark.parametrize("df, exact", [(1.02, 12.1323), (1.2, 8.6488), (1.5, 6.0167), (2.5, 3.5747), (2.99, 3.1885)])
def test_t_quantile_at_fractional_df_below_3_is_never_narrower(df, exact):
    # Welch's df is fractional; the expansion alone gave 10.88 at df 1.02 (10% narrow). Exact values: scipy.
    assert exact * (1 - 2e-3) <= t_quantile(0.975, df) <= 1.2 * exact  # 2e-3: the expansion's error at df 3
    assert t_quantile(0.025, df) == pytest.approx(-t_quantile(0.975, df))


def test_mean_interval_hand_values():
    iv = mean_interval([1, 2, 3, 4, 5])  # mean 3, sd sqrt(2.5), t(0.975, 4) = 2.7764
    assert iv.estimate == 3
    assert iv.high - 3 == pytest.approx(2.7764 * math.sqrt(2.5) / math.sqrt(5), rel=1e-3)
    single = mean_interval([0.7])
    assert single.estimate == 0.7 and math.isinf(single.high)  # one value says nothing about spread


def test_newcombe_matches_the_published_example():
    # Newcombe (1998), Stat. Med. 17:873, example (a): 56/70 vs 48/80 -> 0.2000 [0.0524, 0.3339] (method 10).
    iv = newcombe_difference(56, 70, 48, 80)
    assert iv.estimate == pytest.approx(0.2)
    assert (iv.low, iv.high) == pytest.approx((0.0524, 0.3339), abs=1e-4)
    assert iv.excludes_zero


def test_welch_difference_hand_values():
    # se = sqrt(4/10 + 9/15) = 1, df = 1 / (0.16/9 + 0.36/14) = 22.99, t(0.975, 23) = 2.0687
    iv = welch_difference(10.0, 2.0, 10, 8.0, 3.0, 15)
    assert iv.estimate == 2.0
    assert (iv.low, iv.high) == pytest.approx((2 - 2.0687, 2 + 2.0687), abs=2e-3)


def test_bootstrap_pass_at_k_point_estimate_and_degenerate_interval():
    counts = [(4, 1), (4, 1), (4, 1)]
    iv = bootstrap_pass_at_k(counts, 2)
    assert iv.estimate == pytest.approx(0.5) and iv.low == pytest.approx(0.5) and iv.high == pytest.approx(0.5)
    mixed = bootstrap_pass_at_k([(4, 0), (4, 4)] * 10, 1)
    assert mixed.estimate == pytest.approx(0.5) and mixed.low < 0.5 < mixed.high
    assert 0.2 <= mixed.low and mixed.high <= 0.8  # about +-2 standard errors (0.11)


def test_paired_bootstrap_removes_task_variance():
    # B is A with one more success on every task: paired, the difference is exactly +0.25 every resample.
    a = [(4, c) for c in (0, 1, 2, 3) * 5]
    b = [(4, c + 1) for c in (0, 1, 2, 3) * 5]
    paired = bootstrap_pass_at_k_difference(b, a, 1, paired=True)
    unpaired = bootstrap_pass_at_k_difference(b, a, 1, paired=False)
    assert paired.estimate == pytest.approx(0.25) and paired.high - paired.low < 1e-9
    assert unpaired.high - unpaired.low > 0.1


def _rows(successes_per_task, n, task_type="t"):
    return [{"task": t, "seed": 1000 + t, "task_type": task_type, "success": i < c, "reward": float(i < c),
             "turns": 1 + i, "tokens": 10, "truncated": False}
            for t, c in enumerate(successes_per_task) for i in range(n)]


def test_summarize_overall_by_type_and_curve():
    rows = _rows([0, 2, 4], n=4, task_type="level1") + [
        {**r, "task": r["task"] + 3, "task_type": "level2"} for r in _rows([1], n=4)]
    s = summarize(rows, ks=(1, 2))
    assert task_counts(rows) == [(4, 0), (4, 2), (4, 4), (4, 1)]
    overall = s["overall"]
    assert overall["episodes"] == 16 and overall["tasks"] == 4
    assert Interval.from_dict(overall["success_rate"]).estimate == pytest.approx(7 / 16)
    # pass@2 per task: 0, 1 - C(2,2)/C(4,2) = 5/6, 1, 1 - C(3,2)/C(4,2) = 1/2
    assert overall["pass_at_k"]["2"]["estimate"] == pytest.approx((0 + 5 / 6 + 1 + 1 / 2) / 4)
    assert set(s["by_task_type"]) == {"level1", "level2"}
    assert s["by_task_type"]["level2"]["success_rate"]["estimate"] == pytest.approx(1 / 4)
    assert [c["k"] for c in s["pass_at_k_curve"]] == [1, 2, 3, 4]
    assert overall["turns_mean"]["estimate"] == pytest.approx(2.5)
