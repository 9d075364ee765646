"""Replay a collapse guard over a finished run's metrics: where it would have tripped, and which signal read bad when.

A guard's thresholds are chosen by looking at runs: would ``grad_norm_max 100`` have stopped the off-policy pilot, and
would it have stopped a healthy run too? `replay_guard` answers both from metrics.jsonl alone, without training
again. It feeds the rows to the same `CollapseGuard` the training loop uses, built from a `GuardConfig` the same
way (`CollapseGuard.from_config`), and skips the rows the loop never showed its guard (``update_skipped``: every
episode was left out of the loss, no update), so a replay judges a run as a run with that config would have, with
two differences that a finished run forces:

- a metric missing from a row (a run older than the metric) is "not measured" at that step, as an unmeasured KL is,
  where the training loop would raise;
- after the first trip the replay reads on, with neither a stop nor a rollback, so the flags cover every step.

    rows = [json.loads(line) for line in open("runs/x/metrics.jsonl")]
    replay = replay_guard(rows, GuardConfig(grad_norm_max=100))
    replay.tripped_step, replay.reason, replay.bad["grad_norm"]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentrl.objective.collapse_guard import CollapseGuard

if TYPE_CHECKING:
    from agentrl.config import GuardConfig

__all__ = ["GuardReplay", "replay_guard"]


@dataclass(frozen=True)
class GuardReplay:
    """What a guard would have said over a finished run.

    Attributes:
        tripped_step: the first step at which the guard would have stopped the run (or rolled it back); None when it
            never trips.
        reason: the verdict's reason at that step, naming the signal and its value ("" when it never trips).
        steps: the steps judged, in the order of the rows (rows without an update left out).
        bad: for each enabled signal (`CollapseGuard.signals`, of ``entropy``, ``kl``, ``grad_norm``, ``length_cut``,
            ``success``), one flag per judged step, aligned with `steps`: True (read bad), False (read fine) or None
            (not measured that step: the metric missing or None, or the success window still filling).
    """

    tripped_step: int | None
    reason: str
    steps: tuple[int, ...]
    bad: dict[str, tuple[bool | None, ...]]


def replay_guard(rows: Iterable[Mapping[str, Any]], guard: GuardConfig) -> GuardReplay:
    """Run the guard `guard` describes over metrics.jsonl rows, one step at a time.

    `guard.enabled` is not read: the replay asks what these thresholds would have said, also of a run that trained
    with the guard off.

    Args:
        rows: metrics.jsonl rows (dicts with ``step``), in the order the run wrote them.
        guard: the thresholds, patience and action to judge with (a run's own ``config.yaml`` guard section, or
            other ones to try).

    Returns:
        A `GuardReplay`: the first step it trips at and why, and every enabled signal's per-step flags.

    Raises:
        KeyError: a row without ``step``.
    """
    from agentrl.training.step import MISMATCH_KL  # the key the training loop's guard reads (a heavy module)

    judge = CollapseGuard.from_config(guard, kl_key=MISMATCH_KL, missing_ok=True)
    signals = judge.signals
    steps: list[int] = []
    flags: dict[str, list[bool | None]] = {s: [] for s in signals}
    tripped_step, reason = None, ""
    for row in rows:
        if row.get("update_skipped"):  # the loop logged the rollout and went on without asking the guard
            continue
        step = int(row["step"])
        verdict = judge.update(dict(row), step=step)
        steps.append(step)
        for signal in signals:
            flags[signal].append(judge.readings.get(signal))
        if not verdict.ok and tripped_step is None:
            tripped_step, reason = step, verdict.reason
    return GuardReplay(tripped_step, reason, tuple(steps), {s: tuple(v) for s, v in flags.items()})
