"""Collapse guard: stop (or roll back) when entropy collapses or the training-inference KL blows up.

The paper's collapsing runs show the same signature before the reward falls: the policy entropy drops and
KL(mu || pi_old) climbs [Zheng et al. 2025, §4.2]. The paper gives no thresholds; the defaults here (entropy below
0.25, k3 KL above 0.01, for `patience` consecutive steps) are project heuristics from secondary write-ups, so they are
all configurable. A single bad step is noise; `patience` consecutive ones are a trend.

The KL the guard reads is the training-inference mismatch: over samples drawn with the trainer's current weights
(`mismatch_kl_k3` in a run's metrics). Samples from older weights (``sync_every`` > 1, async rollout) differ from
pi_old by the updates since as well, which the importance weights correct and which grows with every step the
engine lags: counting it stopped the main job at ``sync_every 4`` after 12 steps (KL 0.001-0.002 on fresh samples,
0.01-0.08 three steps stale), a staleness the config asked for, not a collapse. A step without fresh samples leaves
the KL check out (its value is None), and each signal keeps its own streak, so a mismatch seen only every fourth step
still trips the guard after `patience` such steps.

Rollback needs a checkpoint that is known to be good: the trainer asks the guard about a step *before* writing its
checkpoint and writes checkpoints only of healthy steps (`GuardVerdict.healthy`); a save that falls on a bad step
waits for the next healthy one. A rollback then restores the weights and the optimizer state of that step together,
and says which step it was.

Entropy and the fresh-sample KL can miss an off-policy collapse. A pilot of the main job pushed off-policy (lr 2e-4,
``sync_every 8``, 4 mini-batches, no IS correction) went from train success 0.16 to 0.00 in 8 steps with every reply
cut at the token limit and pre-clip gradient norms of 62-2910, while its entropy stayed at 0.24-2.7 and the fresh
mismatch KL read 0.001: the samples that would have shown the drift were all stale. Three more signals see that kind
of run, each off unless asked for (`grad_norm_max`, `length_cut_max`, `success_drop`; see `GuardConfig`), each with a
streak of its own exactly as entropy and KL: the step's pre-clip gradient norm, the share of its episodes with a
reply cut at the per-turn token limit, and a fall of the train success rate's moving mean from its best.
`agentrl.training.guard_replay` runs the same guard over a finished run's metrics.jsonl, to say where it would
have tripped.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol

__all__ = ["GUARD_ACTIONS", "GUARD_SIGNALS", "SUCCESS_WINDOW", "GuardSettings", "GuardVerdict", "CollapseGuard"]

GUARD_ACTIONS: tuple[str, ...] = ("stop", "rollback")

GUARD_SIGNALS: tuple[str, ...] = ("entropy", "kl", "grad_norm", "length_cut", "success")
"""The guard's signals, each with a streak of its own, in the order a verdict's reason names them."""

SUCCESS_WINDOW = 3
"""Steps in the moving mean of the train success rate that the `success_drop` signal compares with its best: one
step's rate over a few dozen episodes moves by 0.1 on noise alone, three steps' mean much less."""


@dataclass(frozen=True)
class GuardVerdict:
    """What the guard decided after a step.

    Attributes:
        ok: False when training should stop or roll back now.
        reason: a sentence saying which signal tripped and for how long ("" when ok and nothing is wrong).
        action: "none" when ok, else the guard's action ("stop" or "rollback").
        bad_streak: consecutive bad steps so far, this one included.
        last_good_step: the last step whose metrics were healthy (the checkpoint to roll back to), or None.
    """

    ok: bool
    reason: str
    action: str
    bad_streak: int = 0
    last_good_step: int | None = None

    @property
    def healthy(self) -> bool:
        """This step's own metrics were fine (a checkpoint of it is safe to roll back to)."""
        return self.bad_streak == 0


class GuardSettings(Protocol):
    """The settings `CollapseGuard.from_config` reads.

    `agentrl.config.GuardConfig` has these fields; a protocol, so that this module, which the config imports, does not
    import the config back.
    """

    entropy_min: float
    k3_max: float
    patience: int
    action: str
    grad_norm_max: float
    length_cut_max: float
    success_drop: float


class CollapseGuard:
    """Watch entropy and KL(mu || pi_old) step by step; trip after `patience` consecutive bad readings of either.

    The gradient norm, the length-cut share and the train success rate are watched as well when their thresholds are
    given (each off by default), each with a streak of its own.

    Example:
        guard = CollapseGuard(entropy_min=0.25, k3_max=0.01, patience=3, action="rollback")
        verdict = guard.update({"entropy": 0.9, "kl_k3": 0.002})
        if not verdict.ok:
            ...  # restore the checkpoint of verdict.last_good_step, and log verdict.reason

    Args:
        entropy_min: a step is bad when its mean token entropy is below this (nats). None disables the check.
        k3_max: a step is bad when its k3 estimate of KL(mu || pi_old) is above this. None disables the check.
        patience: consecutive bad steps that trip the guard (K).
        action: "stop" or "rollback" (to the last good checkpoint).
        entropy_key: metrics key holding the entropy.
        kl_key: metrics key holding the k3 KL; a value of None means "not measured this step" (no fresh samples).
        grad_norm_max: a step is bad when its pre-clip gradient norm is above this (a NaN norm too). None disables
            the check.
        length_cut_max: a step is bad when the share of its episodes with a reply cut at the per-turn token limit
            is above this. None disables the check.
        success_drop: a step is bad when the mean train success rate of the last `SUCCESS_WINDOW` measured steps is
            below ``(1 - success_drop)`` times the best such mean so far, once that best is above 0 (the first
            ``SUCCESS_WINDOW - 1`` steps only fill the window). None disables the check.
        grad_norm_key: metrics key holding the pre-clip gradient norm.
        length_cut_key: metrics key holding the length-cut share.
        success_key: metrics key holding the train success rate.
        missing_ok: False (training): an enabled check's metric that is missing raises, so a renamed key cannot
            switch a check off unseen. True (replaying the rows of a finished run, which may predate a metric): a
            metric that is missing or None is "not measured this step", like an unmeasured KL.
    """

    def __init__(
        self,
        entropy_min: float | None = 0.25,
        k3_max: float | None = 0.01,
        patience: int = 3,
        action: str = "stop",
        entropy_key: str = "entropy",
        kl_key: str = "kl_k3",
        *,
        grad_norm_max: float | None = None,
        length_cut_max: float | None = None,
        success_drop: float | None = None,
        grad_norm_key: str = "grad_norm",
        length_cut_key: str = "length_cut_frac",
        success_key: str = "success_rate",
        missing_ok: bool = False,
    ):
        if action not in GUARD_ACTIONS:
            raise ValueError(f"unknown guard action {action!r}; choose one of {', '.join(GUARD_ACTIONS)}")
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        if success_drop is not None and not 0 < success_drop < 1:
            raise ValueError(f"success_drop must be in (0, 1), got {success_drop}")
        self.entropy_min = entropy_min
        self.k3_max = k3_max
        self.patience = patience
        self.action = action
        self.entropy_key = entropy_key
        self.kl_key = kl_key
        self.grad_norm_max = grad_norm_max
        self.length_cut_max = length_cut_max
        self.success_drop = success_drop
        self.grad_norm_key = grad_norm_key
        self.length_cut_key = length_cut_key
        self.success_key = success_key
        self.missing_ok = missing_ok
        self.bad_streak = 0
        self._streaks = dict.fromkeys(GUARD_SIGNALS, 0)  # consecutive bad readings of each signal
        self.readings: dict[str, bool] = {}
        """The signals measured at the last `update`, each with whether it read bad."""
        self._success: deque[float] = deque(maxlen=SUCCESS_WINDOW)  # the last measured success rates
        self.success_best: float | None = None
        """The best `SUCCESS_WINDOW`-step mean of the train success rate so far (None until the window filled)."""
        self.step = -1
        self.last_good_step: int | None = None

    @classmethod
    def from_config(cls, guard: GuardSettings, kl_key: str, missing_ok: bool = False) -> CollapseGuard:
        """The guard a run's `GuardConfig` asks for (its 0 thresholds: those checks off), reading the KL at `kl_key`.

        The one place a config becomes a guard: the training loop and `replay_guard` build theirs here, so a replay
        judges a run exactly as the run did.
        """
        return cls(guard.entropy_min, guard.k3_max, guard.patience, guard.action, kl_key=kl_key,
                   grad_norm_max=guard.grad_norm_max or None, length_cut_max=guard.length_cut_max or None,
                   success_drop=guard.success_drop or None, missing_ok=missing_ok)

    @property
    def signals(self) -> tuple[str, ...]:
        """The signals this guard watches (those with a threshold), in `GUARD_SIGNALS` order."""
        thresholds = (self.entropy_min, self.k3_max, self.grad_norm_max, self.length_cut_max, self.success_drop)
        return tuple(s for s, limit in zip(GUARD_SIGNALS, thresholds) if limit is not None)

    def update(self, metrics: dict[str, float | None], step: int | None = None) -> GuardVerdict:
        """Record one training step's metrics and decide.

        Args:
            metrics: the step's metrics; must hold the key of each enabled check (the KL may be None: not measured
                this step, the check is left out and its streak kept; with `missing_ok`, any metric may be missing
                or None).
            step: the step number (default: one more than the last call's).

        Returns:
            A `GuardVerdict`; `ok` is False once one signal read bad `patience` times in a row (a step where it was
            not measured neither breaks nor extends its streak).

        Raises:
            KeyError: when an enabled check's metric is missing, naming it (unless `missing_ok`).
        """
        self.step = self.step + 1 if step is None else step
        problems = []
        readings: dict[str, bool] = {}  # signal -> bad, for the signals measured this step
        if self.entropy_min is not None and (entropy := self._get(metrics, self.entropy_key)) is not None:
            readings["entropy"] = math.isnan(entropy) or entropy < self.entropy_min
            if readings["entropy"]:
                problems.append(f"entropy {entropy:.4g} < {self.entropy_min:g}")
        if self.k3_max is not None and (kl := self._get(metrics, self.kl_key, optional=True)) is not None:
            readings["kl"] = math.isnan(kl) or kl > self.k3_max
            if readings["kl"]:
                problems.append(f"KL(mu||pi_old) k3 {kl:.4g} > {self.k3_max:g}")
        if self.grad_norm_max is not None and (norm := self._get(metrics, self.grad_norm_key)) is not None:
            # NaN: no mini-batch of the step had a finite norm (the trainer keeps only finite ones), a blow-up too.
            readings["grad_norm"] = math.isnan(norm) or norm > self.grad_norm_max
            if readings["grad_norm"]:
                problems.append(f"{self.grad_norm_key} {norm:.4g} > {self.grad_norm_max:g}")
        if self.length_cut_max is not None and (cut := self._get(metrics, self.length_cut_key)) is not None:
            readings["length_cut"] = math.isnan(cut) or cut > self.length_cut_max
            if readings["length_cut"]:
                problems.append(f"{self.length_cut_key} {cut:.3g} > {self.length_cut_max:g}")
        if self.success_drop is not None and (rate := self._get(metrics, self.success_key)) is not None:
            problem = self._read_success(rate)
            if problem is not None:
                readings["success"] = bool(problem)
                if problem:
                    problems.append(problem)
        self.readings = readings
        for signal, bad in readings.items():
            self._streaks[signal] = self._streaks[signal] + 1 if bad else 0
        if not problems:
            self.bad_streak = 0
            self.last_good_step = self.step
            return GuardVerdict(True, "", "none", 0, self.last_good_step)
        self.bad_streak = max(self._streaks[s] for s, bad in readings.items() if bad)
        what = " and ".join(problems)
        if self.bad_streak < self.patience:
            reason = f"step {self.step}: {what} ({self.bad_streak}/{self.patience} consecutive bad readings)"
            return GuardVerdict(True, reason, "none", self.bad_streak, self.last_good_step)
        target = f"; roll back to step {self.last_good_step}" if self.action == "rollback" else ""
        reason = (f"collapse guard tripped at step {self.step}: {what} for {self.bad_streak} consecutive "
                  f"readings{target}")
        return GuardVerdict(False, reason, self.action, self.bad_streak, self.last_good_step)

    def reset(self) -> None:
        """Forget the streak (call after a rollback, so the restored run gets a fresh `patience`).

        The success window empties too: its rates were the collapsed policy's, not the restored one's. The best mean
        stays, the level the restored policy is measured against.
        """
        self.bad_streak = 0
        self._streaks = dict.fromkeys(self._streaks, 0)
        self._success.clear()

    def _read_success(self, rate: float) -> str | None:
        """Add one success rate to the window; None while the window fills, "" when fine, else the problem."""
        if math.isnan(rate):
            return f"{self.success_key} is NaN"
        self._success.append(rate)
        if len(self._success) < SUCCESS_WINDOW:
            return None
        mean = sum(self._success) / len(self._success)
        self.success_best = mean if self.success_best is None else max(self.success_best, mean)
        floor = (1 - self.success_drop) * self.success_best
        if self.success_best > 0 and mean < floor:
            return (f"{self.success_key} {SUCCESS_WINDOW}-step mean {mean:.3g} < {floor:.3g} "
                    f"({1 - self.success_drop:g} x best {self.success_best:.3g})")
        return ""

    def _get(self, metrics: dict[str, float | None], key: str, optional: bool = False) -> float | None:
        if key not in metrics:
            if self.missing_ok:
                return None
            raise KeyError(f"collapse guard needs metric {key!r}; got {sorted(metrics)}")
        value = metrics[key]
        if value is None and not (optional or self.missing_ok):
            raise ValueError(f"collapse guard: metric {key!r} is None")
        return value if value is None else float(value)
