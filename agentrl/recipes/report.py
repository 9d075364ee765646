"""`agentrl eval` results in the terminal: the headline table, and two evaluations compared as rich tables.

The HTML report is `agentrl view`'s export of the eval folder (`agentrl.view.eval_report`); the comparison's
statistics are `agentrl.eval_compare`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentrl.eval_compare import ComparisonRow, compare_results, setting_differences
from agentrl.passk import interval_text

__all__ = ["print_results", "print_comparison"]


def print_results(results: Mapping[str, Any], console=None) -> None:
    """The headline numbers as a rich table."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    ks = [str(k) for k in results["tasks"]["ks"]]
    protocol = results.get("protocol")
    title = f"{results['env']['id']} x {results['model']['name']}"
    if protocol:  # the label says "+ overrides" when the command line changed the protocol
        title += f", protocol {protocol['label']} ({protocol['hash'][:12]})"
    table = Table(title=title, title_justify="left")
    for column in ("task type", "episodes", "success rate", "mean reward", *(f"pass@{k}" for k in ks), "turns",
                   "tokens"):
        table.add_column(column, justify="left" if column == "task type" else "right")
    for name, block in [("all", results["overall"]), *results["by_task_type"].items()]:
        table.add_row(name, str(block["episodes"]), interval_text(block["success_rate"], True),
                      interval_text(block["reward_mean"]),
                      *(interval_text(block["pass_at_k"].get(k), True) for k in ks),
                      interval_text(block["turns_mean"]), interval_text(block["tokens_mean"]))
    console.print(table)
    judge = results.get("judge")
    if judge:  # a judged evaluation: its reward is the combined one; what the judge did, its failures counted
        settings, counts = judge["settings"], judge["counts"]
        console.print(
            f"reward = {settings['rule_weight']:g} x rule + {settings['judge_weight']:g} x judge "
            f"({settings['judge']['model']}, {judge['source']}): rule {interval_text(judge['rule_reward_mean'])}, "
            f"judge {interval_text(judge['judge_score_mean']) if judge['judge_score_mean']['n'] else '-'}; "
            f"{counts['calls']} calls, {counts['cache_hits']} "
            f"from the cache, {judge['failures']} failed judgement(s) (their tasks left out, never scored 0)")


def print_comparison(a: Mapping[str, Any], b: Mapping[str, Any], label_a: str = "A", label_b: str = "B",
                     console=None) -> list[ComparisonRow]:
    """Print the settings that differ and the metric differences (A - B) as rich tables; return the rows."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    confidence = float(a.get("confidence", 0.95))
    settings = Table(title="settings that differ", title_justify="left")
    for column in ("setting", label_a, label_b):
        settings.add_column(column)
    for what, va, vb in setting_differences(a, b):
        settings.add_row(what, str(va), str(vb))
    console.print(settings if settings.row_count else "settings: identical")
    rows = compare_results(a, b, confidence)
    table = Table(title=f"{label_a} - {label_b} ({round(100 * confidence)}% intervals)", title_justify="left")
    for column in ("metric", label_a, label_b, "difference", "method", ""):
        table.add_column(column, justify="left" if column in ("metric", "method") else "right")
    for r in rows:
        pct = r.metric.startswith(("success", "pass@"))
        fmt = (lambda iv: iv.format(percent=True)) if pct else (lambda iv: iv.format())
        diff = (f"{100 * r.diff.estimate:+.1f} pts [{100 * r.diff.low:+.1f}, {100 * r.diff.high:+.1f}]" if pct
                else f"{r.diff.estimate:+.3f} [{r.diff.low:+.3f}, {r.diff.high:+.3f}]")
        table.add_row(r.metric, fmt(r.a), fmt(r.b), diff, r.method, "[bold]*[/]" if r.significant else "")
    console.print(table)
    console.print("* the interval of the difference excludes 0")
    return rows
