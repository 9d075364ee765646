"""Two evaluations side by side: every shared metric's difference (A - B) with its interval.

Each difference comes with its interval (Newcombe for rates, Welch for means, a task bootstrap for pass@k, paired
when both evaluations ran the same tasks), and a row is flagged when that interval excludes zero.
`setting_differences` lists the settings that differ, the context a comparison needs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentrl.passk import (
    Interval,
    bootstrap_pass_at_k_difference,
    newcombe_difference,
    task_counts,
    welch_difference,
)

__all__ = ["ComparisonRow", "compare_results", "setting_differences"]


@dataclass(frozen=True)
class ComparisonRow:
    """One metric of A against B.

    Attributes:
        metric: its name (``success_rate``, ``pass@4``, ``success_rate[level2]``, ...).
        a: A's value with its interval.
        b: B's value with its interval.
        diff: A - B with the interval of the difference.
        method: how the difference interval was computed.
    """

    metric: str
    a: Interval
    b: Interval
    diff: Interval
    method: str

    @property
    def significant(self) -> bool:
        """The difference interval excludes zero."""
        return self.diff.excludes_zero


def _rate_rows(name: str, rows_a: list[Mapping], rows_b: list[Mapping], conf: float) -> ComparisonRow:
    from agentrl.passk import wilson_interval

    sa, sb = sum(bool(r["success"]) for r in rows_a), sum(bool(r["success"]) for r in rows_b)
    return ComparisonRow(name, wilson_interval(sa, len(rows_a), conf), wilson_interval(sb, len(rows_b), conf),
                         newcombe_difference(sa, len(rows_a), sb, len(rows_b), conf), "Newcombe")


def _mean_row(name: str, key: str, rows_a: list[Mapping], rows_b: list[Mapping], conf: float) -> ComparisonRow:
    from agentrl.passk import mean_interval

    xa = np.array([r[key] for r in rows_a], dtype=float)
    xb = np.array([r[key] for r in rows_b], dtype=float)
    sd = lambda x: float(x.std(ddof=1)) if len(x) > 1 else 0.0  # noqa: E731
    diff = welch_difference(float(xa.mean()), sd(xa), len(xa), float(xb.mean()), sd(xb), len(xb), conf)
    return ComparisonRow(name, mean_interval(xa, conf), mean_interval(xb, conf), diff, "Welch t")


def _task_key(results: Mapping[str, Any]) -> tuple:
    return (results["env"]["id"], str(sorted(results["env"]["kwargs"].items())), results["env"].get("split"),
            results["tasks"]["seed_offset"], results["tasks"]["episodes"])


def compare_results(a: Mapping[str, Any], b: Mapping[str, Any], confidence: float = 0.95) -> list[ComparisonRow]:
    """Every shared metric of two evaluations, with the interval of each difference (A - B).

    pass@k differences are paired over tasks when A and B ran the same tasks (env, kwargs, split, seeds) and both
    kept every one of them; otherwise unpaired.
    """
    rows_a, rows_b = a["episodes"], b["episodes"]
    out = [_rate_rows("success_rate", rows_a, rows_b, confidence),
           _mean_row("reward_mean", "reward", rows_a, rows_b, confidence)]
    counts_a, counts_b = task_counts(rows_a), task_counts(rows_b)  # each in task order
    # Paired only over the very same tasks: an eval may leave a task out (a judge failure, a group dropped after its
    # retries), and equal counts with a different task missing on each side would pair unrelated tasks.
    paired = _task_key(a) == _task_key(b) and {r["task"] for r in rows_a} == {r["task"] for r in rows_b}
    n_common = min(min(n for n, _ in counts_a), min(n for n, _ in counts_b))
    for k in sorted({*a["tasks"]["ks"], *b["tasks"]["ks"]}):
        if k > n_common:
            continue
        ia, ib = Interval.from_dict(a["pass_at_k_curve"][k - 1]), Interval.from_dict(b["pass_at_k_curve"][k - 1])
        diff = bootstrap_pass_at_k_difference(counts_a, counts_b, k, paired=paired, confidence=confidence)
        out.append(ComparisonRow(f"pass@{k}", ia, ib, diff, "paired bootstrap" if paired else "bootstrap"))
    out += [_mean_row("turns_mean", "turns", rows_a, rows_b, confidence),
            _mean_row("tokens_mean", "tokens", rows_a, rows_b, confidence)]
    types = sorted({r["task_type"] for r in rows_a} & {r["task_type"] for r in rows_b})
    if len(types) > 1:
        for t in types:
            ta = [r for r in rows_a if r["task_type"] == t]
            tb = [r for r in rows_b if r["task_type"] == t]
            out.append(_rate_rows(f"success_rate[{t}]", ta, tb, confidence))
            out.append(_mean_row(f"reward_mean[{t}]", "reward", ta, tb, confidence))
    return out


def setting_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(what, A's, B's) for every env / task / sampling setting that differs: context for a comparison."""
    diffs = []
    for section, keys in (("env", ("id", "kwargs", "split")), ("model", ("name",)),
                          ("tasks", ("seed_offset", "episodes", "samples_per_task", "max_turns")),
                          ("sampling", ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                                        "presence_penalty", "frequency_penalty", "max_new_tokens", "chat_kwargs"))):
        for key in keys:
            va, vb = a[section].get(key), b[section].get(key)
            if va != vb:
                diffs.append((f"{section}.{key}", va, vb))
    protocols = [(r.get("protocol") or {}) for r in (a, b)]
    labels = [f"{p['label']} ({p['hash'][:12]})" if p else None for p in protocols]
    if labels[0] != labels[1]:  # results from different protocols (or none) do not compare as one protocol's
        diffs.insert(0, ("protocol", labels[0], labels[1]))
    rewards = [_reward_label(r.get("judge")) for r in (a, b)]
    if rewards[0] != rewards[1]:  # a judged reward and the env's alone (or two judges) are different scores
        diffs.insert(0, ("reward", rewards[0], rewards[1]))
    return diffs


def _reward_label(judge: Mapping[str, Any] | None) -> str:
    """What an evaluation's reward is: the env's rule reward, or its combination with a judge (what sets the score)."""
    if not judge:
        return "env's rule reward"
    s, j = judge["settings"], judge["settings"]["judge"]
    inline = f"inline rubric {hashlib.sha256(j['rubric'].encode()).hexdigest()[:8]}" if j["rubric"] else ""
    rubric = j["rubric_file"] or inline or "built-in rubric"
    gate = f", gate {s['gate']:g} (below: {s['below_gate']:g})" if s["gate"] is not None else ""
    return (f"{s['rule_weight']:g} x rule + {s['judge_weight']:g} x judge {j['model']} at {j['endpoint']} "
            f"({rubric}, scale {j['scale'][0]:g}-{j['scale'][1]:g}, temperature {j['temperature']:g}{gate})")
