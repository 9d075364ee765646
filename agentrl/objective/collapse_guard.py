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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["GUARD_ACTIONS", "GuardVerdict", "CollapseGuard"]

GUARD_ACTIONS: tuple[str, ...] = ("stop", "rollback")


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


class CollapseGuard:
    """Watch entropy and KL(mu || pi_old) step by step; trip after `patience` consecutive bad readings of either.

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
    """

    def __init__(
        self,
        entropy_min: float | None = 0.25,
        k3_max: float | None = 0.01,
        patience: int = 3,
        action: str = "stop",
        entropy_key: str = "entropy",
        kl_key: str = "kl_k3",
    ):
        if action not in GUARD_ACTIONS:
            raise ValueError(f"unknown guard action {action!r}; choose one of {', '.join(GUARD_ACTIONS)}")
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        self.entropy_min = entropy_min
        self.k3_max = k3_max
        self.patience = patience
        self.action = action
        self.entropy_key = entropy_key
        self.kl_key = kl_key
        self.bad_streak = 0
        self._streaks = {"entropy": 0, "kl": 0}  # consecutive bad readings of each signal
        self.step = -1
        self.last_good_step: int | None = None

    def update(self, metrics: dict[str, float | None], step: int | None = None) -> GuardVerdict:
        """Record one training step's metrics and decide.

        Args:
            metrics: the step's metrics; must hold `entropy_key` and/or `kl_key` for the enabled checks (the KL may
                be None: not measured this step, the check is left out and its streak kept).
            step: the step number (default: one more than the last call's).

        Returns:
            A `GuardVerdict`; `ok` is False once one signal read bad `patience` times in a row (a step where it was
            not measured neither breaks nor extends its streak).

        Raises:
            KeyError: when an enabled check's metric is missing, naming it.
        """
        self.step = self.step + 1 if step is None else step
        problems = []
        readings: dict[str, bool] = {}  # signal -> bad, for the signals measured this step
        if self.entropy_min is not None:
            entropy = self._get(metrics, self.entropy_key)
            readings["entropy"] = math.isnan(entropy) or entropy < self.entropy_min
            if readings["entropy"]:
                problems.append(f"entropy {entropy:.4g} < {self.entropy_min:g}")
        if self.k3_max is not None and (raw := self._get(metrics, self.kl_key, optional=True)) is not None:
            kl = float(raw)
            readings["kl"] = math.isnan(kl) or kl > self.k3_max
            if readings["kl"]:
                problems.append(f"KL(mu||pi_old) k3 {kl:.4g} > {self.k3_max:g}")
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
        """Forget the streak (call after a rollback, so the restored run gets a fresh `patience`)."""
        self.bad_streak = 0
        self._streaks = dict.fromkeys(self._streaks, 0)

    def _get(self, metrics: dict[str, float | None], key: str, optional: bool = False) -> float | None:
        if key not in metrics:
            raise KeyError(f"collapse guard needs metric {key!r}; got {sorted(metrics)}")
        value = metrics[key]
        if value is None and not optional:
            raise ValueError(f"collapse guard: metric {key!r} is None")
        return value if value is None else float(value)
