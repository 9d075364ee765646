"""The eval report and A/B comparison, from synthetic results (no model needed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agentrl.eval_compare import compare_results
from agentrl.recipes.evaluate import summarize
from agentrl.view.eval_report import PLOT_TITLES, render_report, write_report


def make_results(successes_per_task, n=4, temperature=0.6, types=("level1", "level2")):
    rows = []
    for t, c in enumerate(successes_per_task):
        for i in range(n):
            rows.append({"task": t, "seed": 1_000_000 + t, "task_type": types[t % len(types)], "success": i < c,
                         "reward": float(i < c), "turns": 1 + (i % 3), "tokens": 20 + 5 * i, "truncated": False})
    sampling = {"temperature": temperature, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "repetition_penalty": 1.0,
                "presence_penalty": 0.0, "frequency_penalty": 0.0, "max_new_tokens": 64, "seed": 0,
                "chat_kwargs": {"enable_thinking": True}, "ignored": ["typical_p=0.9"],
                "sources": {"temperature": "generation_config.json", "thinking": "qwen3 default"}}
    transcript = {"task": 0, "seed": 1_000_000, "task_type": "level1", "success": True, "reward": 1.0,
                  "first_observation": "What is 2 + 2? <b>not bold</b>",
                  "turns": [{"reply": "<think>add</think>\\boxed{4}", "action": "\\boxed{4}", "observation": "Correct.",
                             "reward": 1.0, "finish_reason": "stop", "tokens": 9}]}
    return {
        "created": "2026-01-01T00:00:00+00:00", "env": {"id": "math", "kwargs": {"level": 1}, "split": "test"},
        "model": {"name": "tiny-qwen3", "family": "qwen3"},
        "tasks": {"seed_offset": 1_000_000, "episodes": len(successes_per_task), "samples_per_task": n,
                  "ks": [1, 2, 4], "max_turns": 3},
        "sampling": sampling, "trained_with": {"temperature": 1.0, "chat_kwargs": {}}, "confidence": 0.95,
        **summarize(rows, (1, 2, 4)), "episodes": rows, "transcripts": [transcript],
    }


def test_report_is_self_contained_and_escapes_text():
    # The report is the viewer's export now: scripts and data inline (uPlot charts), nothing loaded from elsewhere.
    page = render_report(make_results([0, 1, 2, 3, 4, 2]))
    for title in PLOT_TITLES:
        assert f'class="eval-chart" data-title="{title}"' in page
    assert 'src="http' not in page and 'href="http' not in page and "<script src=" not in page
    assert "&lt;b&gt;not bold&lt;/b&gt;" in page  # env text is shown, never interpreted
    assert "<b>not bold</b>" not in page
    assert "typical_p=0.9" in page and "pass@4" in page


def test_compare_flags_a_real_difference_and_pairs_identical_tasks():
    better = make_results([4, 4, 3, 4, 4, 3, 4, 4], temperature=0.6)
    worse = make_results([0, 1, 0, 1, 0, 0, 1, 0], temperature=1.0)
    rows = {r.metric: r for r in compare_results(better, worse)}
    assert rows["success_rate"].diff.estimate == pytest.approx(30 / 32 - 3 / 32)
    assert rows["success_rate"].significant and rows["pass@1"].significant
    assert rows["pass@1"].method == "paired bootstrap"
    assert rows["pass@4"].diff.estimate == pytest.approx(1.0 - 3 / 8)
    assert "success_rate[level1]" in rows
    same = {r.metric: r for r in compare_results(better, better)}
    assert not same["success_rate"].significant and same["pass@2"].diff.estimate == 0


def test_compare_pairs_only_when_both_kept_the_same_tasks():
    # Found in review: an eval may leave a task out (a judge failure, a group dropped after its retries); with a
    # different task missing on each side the counts were equal and pass@k paired unrelated tasks by position.
    a = make_results([4, 0, 4, 4])
    b = make_results([0, 4, 0, 0])
    a["episodes"] = [r for r in a["episodes"] if r["task"] != 1]  # A lost task 1, B lost task 2
    b["episodes"] = [r for r in b["episodes"] if r["task"] != 2]
    rows = {r.metric: r for r in compare_results(a, b)}
    assert rows["pass@1"].method == "bootstrap"
    assert {r.metric: r for r in compare_results(a, a)}["pass@1"].method == "paired bootstrap"


def test_success_rate_with_several_episodes_per_task_resamples_tasks():
    # Found in review: Wilson over episodes treated the 4 episodes of a task as independent; here they agree
    # within each task (all or none), so 8 tasks carry the information of 8 draws, not 32.
    from agentrl.passk import bootstrap_pass_at_k, task_counts, wilson_interval

    results = make_results([4, 0, 4, 0, 4, 4, 0, 4], n=4)
    rate = results["overall"]["success_rate"]
    by_task = bootstrap_pass_at_k(task_counts(results["episodes"]), 1)
    assert rate["estimate"] == 20 / 32 and (rate["low"], rate["high"]) == (by_task.low, by_task.high)
    assert rate["high"] - rate["low"] > 1.5 * (wilson_interval(20, 32).high - wilson_interval(20, 32).low)
    one = make_results([1, 0, 1, 1], n=1)["overall"]["success_rate"]  # one episode per task: Wilson, as before
    assert (one["low"], one["high"]) == (wilson_interval(3, 4).low, wilson_interval(3, 4).high)


def agentrl(*args):
    from conftest import ROOT

    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)


def test_cli_compare_prints_differences(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, results in ((a, make_results([4, 4, 3, 4])), (b, make_results([0, 1, 0, 1], temperature=1.0))):
        folder.mkdir()
        (folder / "results.json").write_text(json.dumps(results))
    out = agentrl("eval", "--compare", str(a), str(b))
    assert out.returncode == 0, out.stderr
    assert "sampling.temperature" in out.stdout and "success_rate" in out.stdout and "pass@4" in out.stdout
    missing = agentrl("eval", "--compare", str(a), str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "not found" in missing.stderr and "Traceback" not in missing.stderr


@pytest.mark.browser
def test_report_opens_in_chromium_without_errors_and_shows_its_charts(tmp_path):
    from playwright.sync_api import sync_playwright

    path = write_report(make_results([0, 1, 2, 3, 4, 2]), tmp_path / "report.html")
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(path.as_uri())
            page.wait_for_load_state("load")
            page.wait_for_selector(".eval-chart canvas")
            charts = page.eval_on_selector_all(
                ".eval-chart", "els => els.map(e => [e.dataset.title, e.querySelector('.u-title').textContent, "
                               "e.querySelector('canvas').getBoundingClientRect().height])")
            transcripts = page.locator("details").count()
        finally:
            browser.close()
    assert errors == []
    assert [title for title, *_ in charts] == list(PLOT_TITLES)
    for title, shown, height in charts:
        assert shown == title and height > 100, title  # drawn with its title, not an empty box
    assert transcripts == 1
