"""Collapse guard: stop (or roll back) when entropy collapses or the training-inference KL blows up.

The paper's collapsing runs show the same signature before the reward falls: the policy entropy drops and
KL(mu || pi_old) climbs [Zheng et al. 2025, §4.2]. The paper gives no thresholds; the defaults here (entropy below
0.25, k3 KL above 0.01, for `patience` consecutive steps) are project heuristics from secondary write-ups, so they are
all configurable. A single bad step is noise; `patience` consecutive ones are a trend.

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
    """Watch entropy and KL(mu || pi_old) step by step and trip after `patience` consecutive bad steps.

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
        kl_key: metrics key holding the k3 KL.
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
        self.step = -1
        self.last_good_step: int | None = None

    def update(self, metrics: dict[str, float], step: int | None = None) -> GuardVerdict:
        """Record one training step's metrics and decide.

        Args:
            metrics: the step's metrics; must hold `entropy_key` and/or `kl_key` for the enabled checks.
            step: the step number (default: one more than the last call's).

        Returns:
            A `GuardVerdict`; `ok` is False once `patience` consecutive steps were bad.

        Raises:
            KeyError: when an enabled check's metric is missing, naming it.
        """
        self.step = self.step + 1 if step is None else step
        problems = []
        if self.entropy_min is not None:
            entropy = self._get(metrics, self.entropy_key)
            if math.isnan(entropy) or entropy < self.entropy_min:
                problems.append(f"entropy {entropy:.4g} < {self.entropy_min:g}")
        if self.k3_max is not None:
            kl = self._get(metrics, self.kl_key)
            if math.isnan(kl) or kl > self.k3_max:
                problems.append(f"KL(mu||pi_old) k3 {kl:.4g} > {self.k3_max:g}")
        if not problems:
            self.bad_streak = 0
            self.last_good_step = self.step
            return GuardVerdict(True, "", "none", 0, self.last_good_step)
        self.bad_streak += 1
        what = " and ".join(problems)
        if self.bad_streak < self.patience:
            reason = f"step {self.step}: {what} ({self.bad_streak}/{self.patience} consecutive bad steps)"
            return GuardVerdict(True, reason, "none", self.bad_streak, self.last_good_step)
        target = f"; roll back to step {self.last_good_step}" if self.action == "rollback" else ""
        reason = f"collapse guard tripped at step {self.step}: {what} for {self.bad_streak} consecutive steps{target}"
        return GuardVerdict(False, reason, self.action, self.bad_streak, self.last_good_step)

    def reset(self) -> None:
        """Forget the streak (call after a rollback, so the restored run gets a fresh `patience`)."""
        self.bad_streak = 0

    def _get(self, metrics: dict[str, float], key: str) -> float:
        if key not in metrics:
            raise KeyError(f"collapse guard needs metric {key!r}; got {sorted(metrics)}")
        return float(metrics[key])
