"""Evaluation statistics: unbiased pass@k and the confidence intervals every reported number carries.

* pass@k: the unbiased estimator of Chen et al. (2021, "Evaluating Large Language Models Trained on Code"): with n
  samples of a task of which c succeed, pass@k = 1 - C(n-c, k) / C(n, k), averaged over tasks. Computed as a product
  (never with factorials) so that large n stays exact in floating point.
* success rates: Wilson score intervals (well behaved at 0 %, 100 % and small n, unlike the normal "Wald" interval).
* means (reward, turns, tokens): Student-t intervals.
* pass@k: percentile bootstrap over tasks (tasks are the independent unit; the n samples of one task are not).
* differences (`agentrl eval --compare`): Newcombe's hybrid score interval for two rates, Welch's t for two means,
  and a bootstrap over tasks (paired when both runs used the same tasks) for pass@k.

Departure: the t quantile uses the Cornish-Fisher expansion of the normal quantile (Abramowitz & Stegun 26.7.5)
instead of scipy, which agentrl does not depend on; it is within 0.2 % of the exact value for df >= 3 (df 1 and 2
use their closed forms).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

__all__ = [
    "Interval", "interval_text", "pass_at_k", "pass_at_k_per_task", "task_counts", "wilson_interval", "mean_interval",
    "t_quantile",
    "bootstrap_pass_at_k", "newcombe_difference", "welch_difference", "bootstrap_pass_at_k_difference",
    "run_level_bootstrap_difference", "run_level_replicates",
]


def task_counts(rows: Sequence[Mapping[str, Any]]) -> list[tuple[int, int]]:
    """Per task, in task order: (episodes n, successes c), from episode rows with ``task`` and ``success`` keys."""
    counts: dict[int, list[int]] = {}
    for r in rows:
        nc = counts.setdefault(r["task"], [0, 0])
        nc[0] += 1
        nc[1] += int(r["success"])
    return [(n, c) for _, (n, c) in sorted(counts.items())]


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided confidence interval.

    Attributes:
        estimate: the point estimate.
        low: lower bound.
        high: upper bound.
        n: how many observations it rests on (episodes, or tasks for pass@k).
    """

    estimate: float
    low: float
    high: float
    n: int

    def to_dict(self) -> dict[str, float | int | None]:
        """Plain data for results.json; non-finite values become None (strict JSON has no NaN or Infinity)."""
        def clean(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {"estimate": clean(self.estimate), "low": clean(self.low), "high": clean(self.high), "n": self.n}

    @classmethod
    def from_dict(cls, d: dict) -> Interval:
        """Inverse of `to_dict` (None reads back as NaN)."""
        def num(x: float | None) -> float:
            return float("nan") if x is None else float(x)

        return cls(num(d["estimate"]), num(d["low"]), num(d["high"]), int(d["n"]))

    @property
    def excludes_zero(self) -> bool:
        """True when the whole interval lies on one side of 0 (for differences: the change is significant)."""
        return self.low > 0 or self.high < 0

    def format(self, percent: bool = False, digits: int = 3) -> str:
        """``0.412 [0.351, 0.474]`` (or ``41.2% [35.1, 47.4]`` with `percent`)."""
        if percent:
            return f"{100 * self.estimate:.1f}% [{100 * self.low:.1f}, {100 * self.high:.1f}]"
        return f"{self.estimate:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def interval_text(d: Mapping[str, Any] | None, percent: bool = False) -> str:
    """An interval saved as a dict (`Interval.to_dict`'s form) as text, or ``"-"`` when there is none."""
    return "-" if d is None else Interval.from_dict(d).format(percent=percent)


def _z(confidence: float) -> float:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased probability that at least one of k samples (drawn without replacement from n) succeeds.

    Args:
        n: samples drawn for the task.
        c: how many of them succeeded.
        k: the budget of attempts, 1 <= k <= n.
    """
    if not (0 <= c <= n) or n < 1:
        raise ValueError(f"pass@k needs 0 <= c <= n and n >= 1, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n samples per task, got n={n} (raise --samples-per-task)")
    if n - c < k:  # every draw of k samples contains a success
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_k_per_task(counts: Sequence[tuple[int, int]], k: int) -> np.ndarray:
    """pass@k of each task from its (n, c) counts, shape ``[tasks]``."""
    return np.array([pass_at_k(n, c, k) for n, c in counts], dtype=float)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> Interval:
    """Wilson score interval for a success rate (`successes` of `n` trials)."""
    if n <= 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0)
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, n], got {successes} of {n}")
    z = _z(confidence)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At 0 or n successes the exact bound is 0 or 1; the formula leaves rounding noise there.
    low = 0.0 if successes == 0 else centre - half
    high = 1.0 if successes == n else centre + half
    return Interval(p, low, high, n)


def t_quantile(p: float, df: float) -> float:
    """Quantile `p` of Student's t with `df` degrees of freedom (Cornish-Fisher expansion around the normal).

    Exact at df 1 and 2 (closed forms), within 0.2% from df 3 on. Between 1 and 3, where the expansion errs by up to
    10% (too narrow) and Welch's fractional df can fall, it interpolates linearly in 1/df between the quantiles at the
    whole df either side: t's quantile is convex in 1/df, so this is wider than exact, not narrower (beyond the
    expansion's 0.2% at df 3; checked against scipy at df 1.02-2.99). Below 1 (no Welch df is), the Cauchy quantile,
    which is narrower.
    """
    if df <= 0:
        raise ValueError(f"t_quantile needs df > 0, got {df}")
    if not 0 < p < 1:
        raise ValueError(f"t_quantile needs 0 < p < 1, got {p}")
    if df <= 1:  # Cauchy: closed form, where the expansion is worst
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    if df < 3:
        low, high = math.floor(df), math.floor(df) + 1  # whole df either side: 1 and 2, or 2 and 3
        w = (1 / df - 1 / high) / (1 / low - 1 / high)  # 1 at `low`, 0 at `high`
        return w * t_quantile(p, low) + (1 - w) * t_quantile(p, high)
    z = NormalDist().inv_cdf(p)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Student-t interval for the mean of `values` (a single value gets an infinite-width interval, not a fake 0)."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0)
    mean = float(x.mean())
    if n == 1:
        return Interval(mean, float("-inf"), float("inf"), 1)
    half = t_quantile(0.5 + confidence / 2, n - 1) * float(x.std(ddof=1)) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def _bootstrap_indices(n_tasks: int, resamples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n_tasks, size=(resamples, n_tasks))  # [B, T]


def bootstrap_pass_at_k(counts: Sequence[tuple[int, int]], k: int, confidence: float = 0.95,
                        resamples: int = 2000, seed: int = 0) -> Interval:
    """pass@k over tasks with a percentile-bootstrap interval (resampling whole tasks).

    Args:
        counts: per task, (samples n, successes c).
        k: attempts budget; must not exceed any task's n.
        confidence: two-sided level.
        resamples: bootstrap replicates.
        seed: the resampling seed (results are reproducible).
    """
    per_task = pass_at_k_per_task(counts, k)  # [T]
    if len(per_task) == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0)
    means = per_task[_bootstrap_indices(len(per_task), resamples, seed)].mean(axis=1)  # [B]
    alpha = (1 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    return Interval(float(per_task.mean()), float(low), float(high), len(per_task))


def bootstrap_pass_at_k_difference(counts_a: Sequence[tuple[int, int]], counts_b: Sequence[tuple[int, int]], k: int,
                                   paired: bool, confidence: float = 0.95, resamples: int = 2000,
                                   seed: int = 0) -> Interval:
    """pass@k(A) - pass@k(B) with a bootstrap interval; `paired` resamples the same task indices on both sides.

    Pair only when task i of A and task i of B are the same task (same env, split and seed): pairing removes the
    between-task variance from the difference, which is most of it.
    """
    a, b = pass_at_k_per_task(counts_a, k), pass_at_k_per_task(counts_b, k)
    if paired and len(a) != len(b):
        raise ValueError(f"a paired bootstrap needs the same tasks on both sides, got {len(a)} and {len(b)}")
    idx_a = _bootstrap_indices(len(a), resamples, seed)
    idx_b = idx_a if paired else _bootstrap_indices(len(b), resamples, seed + 1)
    diffs = a[idx_a].mean(axis=1) - b[idx_b].mean(axis=1)  # [B]
    alpha = (1 - confidence) / 2
    low, high = np.quantile(diffs, [alpha, 1 - alpha])
    return Interval(float(a.mean() - b.mean()), float(low), float(high), min(len(a), len(b)))


def run_level_replicates(runs_a: Sequence[Sequence[float]], runs_b: Sequence[Sequence[float]], paired_runs: bool,
                         resamples: int = 10_000, seed: int = 0) -> np.ndarray:
    """Bootstrap replicates `[B]` of mean(A) - mean(B) over training runs, resampled on two levels.

    `runs_a[r][t]` is run r's success on held-out task t (a rate in [0, 1]; 0/1 with one episode per task), every run
    of both arms scored on the same tasks in the same order. One replicate draws runs with replacement (the outer
    level: what another set of training seeds would give), then held-out tasks with replacement (the inner level:
    what another draw of tasks would give), and takes the mean over the drawn runs of each run's mean over the drawn
    tasks. One task draw per replicate serves every run of both arms (they are the same tasks): runs and tasks are
    crossed, not nested, which is mildly conservative for the run level. `paired_runs` draws the same run
    indices on both sides: right when run r of A and run r of B share a training seed (same tasks, same sampler
    seeds), so that what a seed does to both arms cancels in the difference.
    """
    a = np.asarray(runs_a, dtype=float)  # [Ra, T]
    b = np.asarray(runs_b, dtype=float)  # [Rb, T]
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or a.shape[0] == 0 or b.shape[0] == 0:
        raise ValueError(f"runs need one row per run and the same tasks on both sides, got shapes {a.shape} and "
                         f"{b.shape}")
    if paired_runs and a.shape[0] != b.shape[0]:
        raise ValueError(f"paired runs need as many runs on both sides, got {a.shape[0]} and {b.shape[0]}")
    rng = np.random.default_rng(seed)
    tasks = rng.integers(0, a.shape[1], size=(resamples, a.shape[1]))  # [B, T]
    runs_of_a = rng.integers(0, a.shape[0], size=(resamples, a.shape[0]))  # [B, Ra]
    runs_of_b = runs_of_a if paired_runs else rng.integers(0, b.shape[0], size=(resamples, b.shape[0]))  # [B, Rb]
    per_run_a = a[:, tasks].mean(axis=2).T  # [B, Ra]: each run's mean over the drawn tasks
    per_run_b = b[:, tasks].mean(axis=2).T  # [B, Rb]
    mean_a = np.take_along_axis(per_run_a, runs_of_a, axis=1).mean(axis=1)  # [B]
    mean_b = np.take_along_axis(per_run_b, runs_of_b, axis=1).mean(axis=1)  # [B]
    return mean_a - mean_b


def run_level_bootstrap_difference(runs_a: Sequence[Sequence[float]], runs_b: Sequence[Sequence[float]],
                                   paired_runs: bool, confidence: float = 0.95, resamples: int = 10_000,
                                   seed: int = 0) -> Interval:
    """mean(A) - mean(B) across training runs, with a two-level (runs, then tasks) percentile-bootstrap interval.

    The comparison the seed papers' claims need: an interval over held-out tasks alone says how sure we are of one
    run's score, not whether another training seed would rank the arms the same. See `run_level_replicates` for the
    scheme. With few runs per arm the outer level can take only a few distinct values (3 runs: 10 multisets), so the
    interval is coarse; it is still the honest one. `n` of the result is the number of runs per arm (the smaller).
    """
    diffs = run_level_replicates(runs_a, runs_b, paired_runs, resamples, seed)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(diffs, [alpha, 1 - alpha])
    a, b = np.asarray(runs_a, dtype=float), np.asarray(runs_b, dtype=float)
    return Interval(float(a.mean() - b.mean()), float(low), float(high), min(len(a), len(b)))


def newcombe_difference(successes_a: int, n_a: int, successes_b: int, n_b: int,
                        confidence: float = 0.95) -> Interval:
    """Rate(A) - rate(B) with Newcombe's hybrid score interval (built from the two Wilson intervals)."""
    a, b = wilson_interval(successes_a, n_a, confidence), wilson_interval(successes_b, n_b, confidence)
    d = a.estimate - b.estimate
    low = d - math.sqrt((a.estimate - a.low) ** 2 + (b.high - b.estimate) ** 2)
    high = d + math.sqrt((a.high - a.estimate) ** 2 + (b.estimate - b.low) ** 2)
    return Interval(d, low, high, min(n_a, n_b))


def welch_difference(mean_a: float, sd_a: float, n_a: int, mean_b: float, sd_b: float, n_b: int,
                     confidence: float = 0.95) -> Interval:
    """Mean(A) - mean(B) with Welch's t interval (unequal variances), from summary statistics."""
    if n_a < 2 or n_b < 2:
        return Interval(mean_a - mean_b, float("-inf"), float("inf"), min(n_a, n_b))
    va, vb = sd_a**2 / n_a, sd_b**2 / n_b
    se = math.sqrt(va + vb)
    if se == 0:
        return Interval(mean_a - mean_b, mean_a - mean_b, mean_a - mean_b, min(n_a, n_b))
    df = (va + vb) ** 2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1))
    half = t_quantile(0.5 + confidence / 2, df) * se
    d = mean_a - mean_b
    return Interval(d, d - half, d + half, min(n_a, n_b))
