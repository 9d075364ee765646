"""The HTML report of an `agentrl eval`: `agentrl view`'s static export of the eval folder, and its pieces.

The report is one self-contained file (the viewer's scripts, styles and the data inline; nothing is fetched), so
it opens offline: the results with their intervals, the charts (uPlot, vendored and inlined) and the episodes.
`eval_charts`, `metrics_table`, `settings_table` and `transcript_html` are the pieces the viewer's eval page shows.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.passk import Interval, interval_text

__all__ = ["PLOT_TITLES", "eval_charts", "metrics_table", "settings_table", "transcript_html", "render_report",
           "write_report"]

PLOT_TITLES = ("success by task type", "reward distribution", "turns per episode", "pass@k")
"""The charts every report holds (their titles), in page order."""


def _interval_bounds(blocks: Sequence[Mapping[str, Any]], key: str) -> tuple[list, list, list]:
    ivs = [Interval.from_dict(b[key]) for b in blocks]
    return [iv.estimate for iv in ivs], [iv.low for iv in ivs], [iv.high for iv in ivs]


def eval_charts(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The report's charts as data for the viewer's uPlot charts, in page order (titles: `PLOT_TITLES`).

    Each chart is ``{"title", "kind": "bars" | "line", "x", "xlabels", "series": [{"label", "values", "low",
    "high"}]}``: x positions, their tick labels (or None), and per series its values with interval bounds (or None).
    """
    by_type = results["by_task_type"]
    names = list(by_type)
    blocks = [by_type[n] for n in names]
    success, s_low, s_high = _interval_bounds(blocks, "success_rate")
    reward, r_low, r_high = _interval_bounds(blocks, "reward_mean")
    rewards = np.asarray([e["reward"] for e in results["episodes"]], dtype=float)
    counts, edges = np.histogram(rewards, bins=min(20, max(5, len(set(rewards.tolist())))))
    turns = [e["turns"] for e in results["episodes"]]
    top = max(turns) if turns else 1
    ok = [sum(1 for e in results["episodes"] if e["turns"] == t and e["success"]) for t in range(1, top + 1)]
    bad = [sum(1 for e in results["episodes"] if e["turns"] == t and not e["success"]) for t in range(1, top + 1)]
    curve = results["pass_at_k_curve"]
    level = round(100 * results.get("confidence", 0.95))
    return [
        {"title": PLOT_TITLES[0], "kind": "bars", "x": list(range(len(names))),
         "xlabels": [f"{n} (n={b['episodes']})" for n, b in zip(names, blocks)],
         "series": [{"label": f"success rate (Wilson {level}%)", "values": success, "low": s_low, "high": s_high},
                    {"label": f"mean reward (t {level}%)", "values": reward, "low": r_low, "high": r_high}]},
        {"title": PLOT_TITLES[1], "kind": "bars", "x": [float(x) for x in (edges[:-1] + edges[1:]) / 2],
         "xlabels": None, "series": [{"label": "episodes", "values": [int(c) for c in counts], "low": None,
                                      "high": None}]},
        {"title": PLOT_TITLES[2], "kind": "bars", "x": list(range(1, top + 1)), "xlabels": None,
         "series": [{"label": "success", "values": ok, "low": None, "high": None},
                    {"label": "failure", "values": bad, "low": None, "high": None}]},
        {"title": PLOT_TITLES[3], "kind": "line", "x": [c["k"] for c in curve], "xlabels": None,
         "series": [{"label": f"pass@k ({level}% bootstrap over tasks)", "values": [c["estimate"] for c in curve],
                     "low": [c["low"] for c in curve], "high": [c["high"] for c in curve]}]},
    ]


def metrics_table(results: Mapping[str, Any]) -> str:
    """The headline numbers with their intervals, overall and by task type, as an HTML table."""
    ks = [str(k) for k in results["tasks"]["ks"]]
    head = "".join(f"<th>pass@{k}</th>" for k in ks)
    rows = []
    for name, block in [("all", results["overall"]), *results["by_task_type"].items()]:
        passk = "".join(f"<td>{interval_text(block['pass_at_k'].get(k), percent=True)}</td>" for k in ks)
        rows.append(
            f"<tr><td>{html.escape(name)}</td><td>{block['episodes']}</td><td>{block['tasks']}</td>"
            f"<td>{interval_text(block['success_rate'], percent=True)}</td>"
            f"<td>{interval_text(block['reward_mean'])}</td>{passk}"
            f"<td>{interval_text(block['turns_mean'])}</td><td>{interval_text(block['tokens_mean'])}</td>"
            f"<td>{100 * block['truncated_frac']:.1f}%</td></tr>"
        )
    return ("<table><tr><th>task type</th><th>episodes</th><th>tasks</th><th>success rate</th><th>mean reward</th>"
            f"{head}<th>turns</th><th>generated tokens</th><th>truncated</th></tr>{''.join(rows)}</table>")


def settings_table(results: Mapping[str, Any]) -> str:
    """The sampling settings used, where each came from, and what the model trained with (HTML table)."""
    sampling = results["sampling"]
    trained = results.get("trained_with") or {}
    rows = []
    for key, source in sampling["sources"].items():
        value = sampling["chat_kwargs"].get("enable_thinking", "n/a") if key == "thinking" else sampling.get(key)
        if not trained:
            was = ""
        elif key == "thinking":
            was = trained.get("chat_kwargs", {}).get("enable_thinking", "template default")
        else:
            was = trained.get(key, "-")
        rows.append(f"<tr><td>{html.escape(key)}</td><td>{html.escape(str(value))}</td>"
                    f"<td>{html.escape(source)}</td><td>{html.escape(str(was))}</td></tr>")
    ignored = sampling.get("ignored") or []
    note = f"<p>Ignored (the engine cannot apply them): {html.escape(', '.join(ignored))}</p>" if ignored else ""
    return ("<table><tr><th>setting</th><th>value</th><th>source</th><th>trained with</th></tr>"
            f"{''.join(rows)}</table>{note}")


def transcript_html(t: Mapping[str, Any]) -> str:
    """One saved transcript as a collapsed HTML block (env text escaped)."""
    verdict = '<span class="ok">success</span>' if t["success"] else '<span class="bad">failure</span>'
    turns = "".join(
        f"<p><b>turn {i + 1}</b> ({turn['tokens']} tokens, {html.escape(turn['finish_reason'])}, "
        f"reward {turn['reward']:g})</p><pre>{html.escape(turn['reply'])}</pre>"
        f"<p>action sent: <code>{html.escape(turn['action'])}</code></p><pre>{html.escape(turn['observation'])}</pre>"
        for i, turn in enumerate(t["turns"])
    )
    return (f"<details><summary>task {t['task']} (seed {t['seed']}, {html.escape(t['task_type'] or 'all')}): "
            f"{verdict}, return {t['reward']:g}, {len(t['turns'])} turns</summary>"
            f"<pre>{html.escape(t['first_observation'])}</pre>{turns}</details>")


def render_report(results: Mapping[str, Any]) -> str:
    """The HTML report of one evaluation from its results alone: `agentrl view`'s export of an eval, as a string.

    Self-contained (the viewer's scripts, styles and the data inline; nothing is fetched), so it opens offline.
    """
    from agentrl.view.export import export_results

    return export_results(results)


def write_report(results: Mapping[str, Any], path: str | Path, folder: str | Path | None = None) -> Path:
    """Write the report to `path`: the viewer's export of the eval `folder` (its episodes too), else of `results`.

    Args:
        results: the evaluation's results (as saved in results.json).
        path: the HTML file to write.
        folder: the eval's output folder (results.json and trajectories.jsonl already written there), or None.
    """
    path = Path(path)
    if folder is not None:
        from agentrl.view.export import export_html

        return export_html([folder], path)
    path.write_text(render_report(results), encoding="utf-8")
    return path
