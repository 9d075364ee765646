"""The run-level (two-level) bootstrap of issue 45 on hand-made runs whose answer is known in closed form."""

from __future__ import annotations

import numpy as np
import pytest

from agentrl.passk import run_level_bootstrap_difference, run_level_replicates


def test_arms_constant_over_runs_and_tasks_give_the_exact_difference_with_no_width():
    a = [[0.75] * 8] * 3
    b = [[0.25] * 8] * 3
    d = run_level_bootstrap_difference(a, b, paired_runs=False)
    assert (d.estimate, d.low, d.high, d.n) == (0.5, 0.5, 0.5, 3)


def test_outer_level_alone_resamples_runs_as_a_mean_of_draws():
    # Two runs of A score 0 and 1 on every task: the mean of two draws is 0, 0.5 or 1 with odds 1/4, 1/2, 1/4
    # (variance 0.125); B is 0 everywhere, so the difference is A's mean.
    a = [[0.0] * 5, [1.0] * 5]
    b = [[0.0] * 5, [0.0] * 5]
    reps = run_level_replicates(a, b, paired_runs=False, resamples=40_000, seed=1)
    assert set(np.unique(reps)) == {0.0, 0.5, 1.0}
    assert np.mean(reps == 0.5) == pytest.approx(0.5, abs=0.01)
    assert np.var(reps) == pytest.approx(0.125, abs=0.004)
    d = run_level_bootstrap_difference(a, b, paired_runs=False, resamples=40_000, seed=1)
    assert (d.estimate, d.low, d.high) == (0.5, 0.0, 1.0)


def test_inner_level_alone_resamples_tasks_with_the_binomial_variance():
    # Every run identical, tasks 1, 0, 1, 0: the mean of 4 tasks drawn with replacement has variance p(1-p)/T = 1/16.
    row = [1.0, 0.0, 1.0, 0.0]
    reps = run_level_replicates([row] * 3, [[0.0] * 4] * 3, paired_runs=False, resamples=40_000, seed=2)
    assert np.var(reps) == pytest.approx(1 / 16, abs=0.002)


def test_the_same_tasks_are_drawn_for_both_arms():
    # Identical arms over varying tasks: with the tasks paired, every replicate's difference is exactly 0.
    row = [1.0, 0.0, 0.0, 1.0, 1.0]
    reps = run_level_replicates([row, row], [row, row], paired_runs=False, seed=3)
    assert np.all(reps == 0.0)


def test_paired_runs_cancel_a_shared_seed_effect_and_unpaired_runs_do_not():
    # Run r of B scores c_r on every task, run r of A scores c_r + 0.1: the seed moves both arms alike.
    c = [0.0, 0.4, 0.8]
    b = [[x] * 6 for x in c]
    a = [[x + 0.1] * 6 for x in c]
    paired = run_level_bootstrap_difference(a, b, paired_runs=True)
    assert paired.estimate == pytest.approx(0.1)
    assert paired.low == pytest.approx(0.1) and paired.high == pytest.approx(0.1)
    # Unpaired, each side's mean of 3 draws has variance var(c) / 3 (var with ddof 0), and the sides are independent.
    reps = run_level_replicates(a, b, paired_runs=False, resamples=40_000, seed=4)
    assert np.var(reps) == pytest.approx(2 * np.var(c) / 3, rel=0.05)
    assert np.mean(reps) == pytest.approx(0.1, abs=0.005)


def test_results_repeat_with_the_seed():
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 2, (3, 16)), rng.integers(0, 2, (3, 16))
    assert run_level_bootstrap_difference(a, b, True, seed=7) == run_level_bootstrap_difference(a, b, True, seed=7)


@pytest.mark.parametrize("a, b, paired, message", [
    ([[1.0, 0.0]], [[1.0, 0.0, 1.0]], False, "same tasks"),
    ([[1.0, 0.0]] * 2, [[1.0, 0.0]] * 3, True, "as many runs"),
    ([], [[1.0]], False, "one row per run"),
])
def test_mismatched_inputs_are_refused_with_the_reason(a, b, paired, message):
    with pytest.raises(ValueError, match=message):
        run_level_replicates(a, b, paired_runs=paired)
