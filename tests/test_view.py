"""`agentrl view`: the JSON endpoints (httpx, in-process) and the pages in a real Chromium (Playwright).

One tiny real training run (2 steps) is made per module; `write_token_values` replaces its ``token_values.jsonl``
with hand-made values in the agreed format (joined to the run's own trajectories, samples rebuilt from the turns,
synthetic trainer values that make a masked token visible). A copy without the file stands for a run from before.
A second tiny run (async, so step 1 is off-policy) keeps the file the trainer wrote: the browser reads it as is.
The live test trains a real tiny run with `agentrl run` while the viewer watches it (slow).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.view import RunFolder, ViewError, build_app, export_html
from agentrl.view.pages import _derived_samples

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


def write_token_values(run: Path) -> list[dict]:
    """token_values.jsonl for the first two episodes of group 0 at every step; returns the rows written."""
    rows, counts = [], {}
    for line in (run / "trajectories.jsonl").read_text().splitlines():
        d = json.loads(line)
        key = (d["train_step"], d["group_id"])
        episode = counts.get(key, 0)
        counts[key] = episode + 1
        if d["group_id"] != 0 or episode > 1:
            continue
        for s in _derived_samples(d):
            n, mask = len(s["token_ids"]), s["loss_mask"]
            trainer = [None if lp is None else round(lp + 0.01 * (i % 3), 4)
                       for i, lp in enumerate(s["sampler_logprob"])]
            first = mask.index(1)
            rows.append({"step": d["train_step"], "group_id": d["group_id"], "episode": episode, "sample": s["sample"],
                         "policy_version": d["policy_version"], "token_ids": s["token_ids"], "loss_mask": mask,
                         "sampler_logprob": s["sampler_logprob"], "trainer_logprob": trainer,
                         "is_weight": [None if a is None else round(math.exp(a - b), 4)
                                       for a, b in zip(trainer, s["sampler_logprob"])],
                         "is_masked": [i == first for i in range(n)],
                         "advantage": [0.5 if m else None for m in mask],
                         "entropy": [1.5 if m else None for m in mask]})
    (run / "token_values.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(run with token values, the same run without them), made once."""
    from test_train import tiny_config

    from agentrl.recipes.train import train

    base = tmp_path_factory.mktemp("view")
    run = train(tiny_config(base), progress=False)
    write_token_values(run)
    old = base / "old-run"
    shutil.copytree(run, old, ignore=shutil.ignore_patterns("token_values.jsonl", "checkpoint"))
    return run, old


def metrics_rows(run: Path) -> int:
    return sum(1 for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip())


def client(*paths):
    from fastapi.testclient import TestClient

    return TestClient(build_app([RunFolder(p, i) for i, p in enumerate(paths)]))


# ------------------------------------------------------------------------------------------------ JSON endpoints


def test_json_endpoints_join_episodes_and_token_values(runs):
    run, old = runs
    c = client(run, old)
    listing = c.get("/api/runs").json()["runs"]
    assert [r["steps"] for r in listing] == [metrics_rows(run)] * 2
    assert [r["token_values"] for r in listing] == [True, False]
    assert "no token_values.jsonl" in " ".join(listing[1]["lacks"])
    assert [r["step"] for r in c.get("/api/run/0/metrics?since=1").json()["rows"]] == [1]
    trajectories = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    wins = c.get("/api/run/0/episodes?success=yes").json()["episodes"]
    assert [e["index"] for e in wins] == [i for i, t in enumerate(trajectories) if t["success"]]
    recorded = c.get("/api/run/0/episodes?recorded=yes").json()["episodes"]
    assert [(e["step"], e["group_id"], e["episode"]) for e in recorded] == [(0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1)]
    one = c.get(f"/api/run/0/episode/{recorded[1]['index']}").json()
    assert one["trajectory"]["turns"][0]["action"] == trajectories[recorded[1]["index"]]["turns"][0]["action"]
    sample = one["token_values"][0]
    assert sample["episode"] == 1 and sum(sample["loss_mask"]) == len(one["trajectory"]["turns"][0]["generated_ids"])
    bad = c.get("/api/run/0/episodes?step=two").json()
    assert bad["errors"] == ["step='two' is not an integer: ignored"] and len(bad["episodes"]) == len(trajectories)
    assert c.get("/api/run/5/metrics").status_code == 404
    assert c.get("/api/run/0/episode/999").json()["error"].startswith("run has no episode 999")


def test_corrupt_lines_are_named_on_the_page_and_the_rest_shown(runs, tmp_path):
    run, _ = runs
    broken = tmp_path / "broken"
    shutil.copytree(run, broken, ignore=shutil.ignore_patterns("checkpoint"))
    with open(broken / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "reward_mean": 0.5\n')  # cut short
    with open(broken / "trajectories.jsonl", "a") as f:
        f.write('{"not": "a trajectory"}\n')
    c = client(broken)
    page = c.get("/").text
    n = metrics_rows(run)
    assert f"metrics.jsonl:{n + 1}: not JSON" in page
    assert "trajectories.jsonl:17: not a saved trajectory (KeyError" in page
    assert len(c.get("/api/run/0/metrics").json()["rows"]) == n  # the good rows still drawn
    assert len(c.get("/api/run/0/episodes").json()["episodes"]) == 16


def test_files_only_from_inside_the_run_folders(runs, tmp_path):
    run, _ = runs
    folder = tmp_path / "r"
    shutil.copytree(run, folder, ignore=shutil.ignore_patterns("checkpoint"))
    (tmp_path / "secret.txt").write_text("not yours")
    (folder / "screenshots").mkdir()
    (folder / "screenshots" / "link.txt").symlink_to(tmp_path / "secret.txt")
    c = client(folder)
    assert c.get("/files/0/config.yaml").status_code == 200
    for path in ("/files/0/%2e%2e/secret.txt", "/files/0/screenshots/link.txt", "/files/0/..%2Fsecret.txt"):
        r = c.get(path)
        assert r.status_code == 403 and "outside run folder" in r.json()["error"], path
        assert "not yours" not in r.text
    assert c.get("/files/0/nope.png").status_code == 404
    assert c.get("/static/view.js").status_code == 200
    assert c.get("/static/..%2F__init__.py").status_code == 404
    assert c.get("/files/1/config.yaml").status_code == 404


def test_token_from_the_browser_and_wide_binds(runs):
    from fastapi.testclient import TestClient

    from agentrl.http_guard import HttpGuard, allowed_hosts
    from agentrl.view.app import TOKEN_COOKIE, _TokenFromBrowser, serve_view

    run, _ = runs
    guarded = HttpGuard(build_app([RunFolder(run)]), allowed_hosts=allowed_hosts("127.0.0.1", ["testserver"]),
                        token="s3cret")
    c = TestClient(_TokenFromBrowser(guarded))
    assert c.get("/api/runs").status_code == 401
    assert c.get("/?token=wrong").status_code == 401
    first = c.get("/?token=s3cret")
    assert first.status_code == 200 and c.cookies.get(TOKEN_COOKIE) == "s3cret"
    assert c.get("/api/runs").status_code == 200  # the cookie carries it
    with pytest.raises(ViewError, match="set a token with --token"):
        serve_view([run], host="0.0.0.0", port=0)


def test_a_run_before_its_first_step_gets_the_live_curves_block(tmp_path):
    # Opened between config.yaml and the first metrics row: the page must hold the (empty) curves and their script,
    # which polls, or the steps never appear without a reload (in a browser: test_live_while_a_real_tiny_run_trains).
    folder = tmp_path / "starting"
    folder.mkdir()
    (folder / "config.yaml").write_text("model: tiny-qwen3\n")
    page = client(folder).get("/").text
    assert 'id="curves-data"' in page and '<b id="steps-0">0</b> steps' in page
    assert 'id="curves-data"' not in export_html([folder], tmp_path / "out.html").read_text()  # nothing to wait for


def test_missing_folder_is_a_one_line_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "view", "/nonexistent/run"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2
    starting = ("; a run just started writes config.yaml once its model is loaded: start the viewer after that, it "
                "then shows each step as the run writes it")
    assert out.stderr.strip().splitlines() == ["error: run folder /nonexistent/run not found; pass a folder written "
                                               "by `agentrl run` or `agentrl eval`" + starting]
    # The folder of a run still loading its model (`agentrl run` made it, wrote nothing yet): refused, saying so.
    with pytest.raises(ViewError, match=r"is not a run folder \(none of .*\); .*a run just started writes config"):
        RunFolder(tmp_path)


# ------------------------------------------------------------------------------------------------ browser


@pytest.fixture(scope="module")
def server(runs, tmp_path_factory):
    """`agentrl view RUN OLD --port 0` in a subprocess, on copies (the live test appends to the first)."""
    run, old = runs
    base = tmp_path_factory.mktemp("served")
    live, before = base / "live", base / "before"
    shutil.copytree(run, live, ignore=shutil.ignore_patterns("checkpoint"))
    shutil.copytree(old, before)
    shutil.copytree(run / "checkpoint", live / "checkpoint", ignore=shutil.ignore_patterns("*.pt", "*.safetensors"))
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "view", str(live), str(before), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    assert "agentrl view: http://127.0.0.1:" in line, line
    url = line.split()[2]
    yield url, live, before
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def open_page(browser, url, errors):
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_load_state("load")
    return page


@pytest.mark.browser
@pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"needs Chromium at {CHROMIUM} (apt-get install chromium)")
def test_pages_in_chromium(server, browser, tmp_path):
    url, live, before = server
    errors: list[str] = []
    page = open_page(browser, url, errors)
    page.wait_for_selector('.chart[data-metric="reward_mean"] canvas')
    assert page.get_attribute('.chart[data-metric="reward_mean"]', "data-points") == str(2 * metrics_rows(live))
    assert page.locator(".chart").count() > 20  # every metric, both runs overlaid
    assert "no token_values.jsonl" in page.inner_text("#run1")
    page.screenshot(path=tmp_path / "overview.png", full_page=True)

    rows = [json.loads(line) for line in (live / "token_values.jsonl").read_text().splitlines()]
    target = rows[1]  # step 0, group 0, episode 1
    episodes = [json.loads(line) for line in (live / "trajectories.jsonl").read_text().splitlines()]
    index = 1  # trajectories.jsonl lists step 0's group 0 first
    assert (episodes[index]["train_step"], episodes[index]["group_id"]) == (target["step"], target["group_id"])
    page.goto(f"{url}run/0/episode/{index}")
    assert page.inner_text(".turn .action") == episodes[index]["turns"][0]["action"]
    assert episodes[index]["turns"][0]["action"] in page.inner_text(".turn .reply")  # the reply as sampled
    assert page.locator(".tokens[data-sample='0'] .t.loss").count() == sum(target["loss_mask"])
    assert page.locator(".tokens[data-sample='0'] .t.masked").count() == 1
    page.select_option(".token-mode", "mismatch")
    page.hover(".tokens[data-sample='0'] .t.loss >> nth=1")
    tip = page.inner_text(".token-tip")
    assert "trainer log-prob" in tip and f"id {target['token_ids'][len(target['token_ids']) - 5]}" in tip
    page.screenshot(path=tmp_path / "episode.png", full_page=True)

    page.goto(f"{url}run/0/episodes?success=yes")
    shown = page.locator(".ep").count()
    assert shown == sum(1 for e in episodes if e["success"]) and page.locator(".ep.failure").count() == 0
    page.screenshot(path=tmp_path / "episodes.png", full_page=True)

    page.goto(f"{url}run/1/episode/0")  # the run from before token values: opens, says what it lacks
    assert "this run has no token_values.jsonl" in page.inner_text("body")
    assert page.locator(".tokens .t.loss").count() == len(episodes[0]["turns"][0]["generated_ids"])
    page.goto(f"{url}compare?a=0&b=1")
    assert "beside" in page.inner_text("h1")
    page.screenshot(path=tmp_path / "compare.png", full_page=True)
    assert errors == []
    page.goto(f"{url}files/0/..%2Fbefore%2Fconfig.yaml")  # a browser folds a plain ../ itself
    assert "outside run folder" in page.inner_text("body")


@pytest.mark.browser
@pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"needs Chromium at {CHROMIUM} (apt-get install chromium)")
def test_live_a_new_step_appears_within_seconds(server, browser, tmp_path):
    url, live, _ = server
    errors: list[str] = []
    page = open_page(browser, url, errors)
    page.wait_for_selector('.chart[data-metric="reward_mean"] canvas')
    n = metrics_rows(live)
    last = json.loads((live / "metrics.jsonl").read_text().splitlines()[-1])
    with open(live / "metrics.jsonl", "a") as f:
        f.write(json.dumps(last | {"step": last["step"] + 1, "reward_mean": 0.9}) + "\n")
    start = time.monotonic()
    page.wait_for_function(f"document.getElementById('steps-0').textContent === '{n + 1}'", timeout=10_000)
    page.wait_for_function(
        f"document.querySelector('.chart[data-metric=\"reward_mean\"]').dataset.points === '{2 * n + 1}'",
        timeout=5_000)
    assert time.monotonic() - start < 10
    page.screenshot(path=tmp_path / "live.png", full_page=True)
    assert errors == []


def start_view(paths: list[Path]) -> tuple[subprocess.Popen, str]:
    """`agentrl view PATHS --port 0` in a subprocess, and the URL it said."""
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "view", *map(str, paths), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    assert "agentrl view: http://127.0.0.1:" in line, line + proc.stdout.read()
    return proc, line.split()[2]


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def tip_value(tip: str, label: str) -> float:
    """A number of the token hover card ("trainer log-prob -12.3")."""
    found = re.search(rf"^{label} (\S+)", tip, re.M)
    assert found, (label, tip)
    return float(found.group(1))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny real run whose token_values.jsonl is the trainer's own. Async rollout: step 1 trains on samples of
    step 0's weights, so the trainer's log-probs differ from the sampler's and IS weights from 1."""
    from test_train import tiny_config

    from agentrl.recipes.train import train

    return train(tiny_config(tmp_path_factory.mktemp("trained"), **{"scheduler.async_rollout": True}),
                 progress=False)


@pytest.mark.browser
@pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"needs Chromium at {CHROMIUM} (apt-get install chromium)")
def test_trainer_written_token_values_in_chromium(trained, browser, tmp_path):
    run = trained
    lines = [json.loads(line) for line in (run / "token_values.jsonl").read_text().splitlines()]
    assert lines and all(sum(line["loss_mask"]) > 0 for line in lines)
    # Which episode each line records, joined as trajectories.jsonl counts them (the n-th of its step's group).
    counts: dict[tuple[int, int], int] = {}
    index_of = {}
    for i, line in enumerate((run / "trajectories.jsonl").read_text().splitlines()):
        t = json.loads(line)
        key = (t["train_step"], t["group_id"])
        index_of[(*key, counts.get(key, 0))] = i
        counts[key] = counts.get(key, 0) + 1

    def mismatch(x: dict, i: int) -> float:
        return abs(x["trainer_logprob"][i] - x["sampler_logprob"][i]) if x["loss_mask"][i] else 0.0

    # The sample whose trainer and sampler disagree most: the card must show the trainer's value, not the sampler's.
    line = max(lines, key=lambda x: max(mismatch(x, i) for i in range(len(x["token_ids"]))))
    index = index_of[(line["step"], line["group_id"], line["episode"])]
    samples = [x for x in lines if (x["step"], x["group_id"], x["episode"]) == (line["step"], line["group_id"],
                                                                              line["episode"])]
    proc, url = start_view([run])
    try:
        errors: list[str] = []
        page = open_page(browser, url, errors)
        page.wait_for_selector('.chart[data-metric="reward_mean"] canvas')
        metrics = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
        assert len(metrics) == 2
        for chart in page.locator(".chart").all():  # each curve: one point per row that holds the metric
            key = chart.get_attribute("data-metric")
            expected = sum(1 for r in metrics if isinstance(r.get(key), (int, float))
                           and not isinstance(r.get(key), bool) and math.isfinite(r[key]))
            assert chart.get_attribute("data-points") == str(expected), key
        assert page.get_attribute('.chart[data-metric="reward_mean"]', "data-points") == str(len(metrics))
        page.screenshot(path=tmp_path / "trained-overview.png", full_page=True)

        page.goto(f"{url}run/0/episode/{index}")
        body = page.inner_text("body")
        assert "no token_values.jsonl" not in body and "no token values were recorded" not in body
        assert page.locator(".tokens").count() == len(samples)
        box = f".tokens[data-sample='{line['sample']}']"
        spans = page.locator(f"{box} .t")
        assert spans.count() == len(line["token_ids"])
        assert page.locator(f"{box} .t.loss").count() == sum(line["loss_mask"])
        assert page.locator(f"{box} .t.masked").count() == sum(line["is_masked"])
        # Colouring: a token is painted exactly where the file holds a value for the chosen mode.
        painted = f"Array.from(document.querySelectorAll(\"{box} .t\")).map(s => s.style.background !== '')"
        for mode, has in (("is_weight", [w is not None for w in line["is_weight"]]),
                          ("mismatch", [a is not None and b is not None
                                        for a, b in zip(line["trainer_logprob"], line["sampler_logprob"])]),
                          ("advantage", [a is not None for a in line["advantage"]])):
            page.select_option(".token-mode", mode)
            assert page.evaluate(painted) == has, mode
        # The hover card of a loss token shows its id and the file's values (4 significant digits).
        page.select_option(".token-mode", "mismatch")
        visible = page.evaluate(f"Array.from(document.querySelectorAll(\"{box} .t\"))"
                                ".map(s => s.getBoundingClientRect().width > 0)")
        i = max((i for i, m in enumerate(line["loss_mask"]) if m and visible[i]), key=lambda i: mismatch(line, i))
        assert mismatch(line, i) > 1e-3 and abs(line["is_weight"][i] - 1) > 1e-3  # off-policy: the values differ
        spans.nth(i).hover()
        tip = page.inner_text(".token-tip")
        assert f"token {i}: id {line['token_ids'][i]} " in tip
        for label, key in (("trainer log-prob", "trainer_logprob"), ("sampler log-prob", "sampler_logprob"),
                           ("IS weight", "is_weight"), ("advantage", "advantage"), ("entropy", "entropy")):
            assert math.isclose(tip_value(tip, label), line[key][i], rel_tol=1e-3, abs_tol=1e-4), (label, tip)
        mismatch = line["trainer_logprob"][i] - line["sampler_logprob"][i]
        assert math.isclose(tip_value(tip, "mismatch"), mismatch, rel_tol=1e-3, abs_tol=1e-4), tip
        page.screenshot(path=tmp_path / "trained-episode.png", full_page=True)
        assert errors == []
    finally:
        stop(proc)


LIVE_SECONDS = 6.0
"""How soon a new metrics row must show on the page: the page polls every 2 s."""


def count_rows(path: Path) -> int:
    """Complete metrics rows written so far (0 before the file exists)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return 0
    return sum(1 for line in text.split("\n")[:-1] if line.strip())


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"needs Chromium at {CHROMIUM} (apt-get install chromium)")
def test_live_while_a_real_tiny_run_trains(browser, tmp_path):
    run, steps = tmp_path / "live-run", 4
    log = tmp_path / "run.log"
    with open(log, "w") as out:
        trainer = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "run", "--env", "math", "--model",
                                    "tiny-qwen3", "--steps", str(steps), "--output", str(run), "--group-size", "2",
                                    "--prompts-per-step", "2", "--max-new-tokens", "8"], stdout=out,
                                   stderr=subprocess.STDOUT)
    viewer = None
    try:
        deadline = time.monotonic() + 300
        # The viewer opens a folder once the run has written its first file (config.yaml, after the model loads).
        while not (run / "config.yaml").exists():
            assert trainer.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the run wrote no config.yaml in 300 s"
            time.sleep(0.1)
        viewer, url = start_view([run])
        errors: list[str] = []
        page = open_page(browser, url, errors)
        loaded = count_rows(run / "metrics.jsonl")
        shown_js = "(() => { const e = document.getElementById('steps-0'); return e ? Number(e.textContent) : -1; })()"
        grew: dict[int, float] = {}  # row -> when metrics.jsonl first held it
        seen: dict[int, float] = {}  # row -> when the page first showed it
        ended = None
        while time.monotonic() < deadline:
            now = time.monotonic()
            for k in range(loaded + 1, count_rows(run / "metrics.jsonl") + 1):
                grew.setdefault(k, now)
            shown = page.evaluate(shown_js)
            for k in range(1, shown + 1):
                seen.setdefault(k, time.monotonic())
            if trainer.poll() is not None:
                ended = ended or now
                if trainer.returncode != 0 or shown >= steps or now - ended > 2 * LIVE_SECONDS:
                    break
            time.sleep(0.1)
        assert trainer.wait(timeout=60) == 0, log.read_text()[-3000:]
        latency = {k: round(seen[k] - grew[k], 2) for k in grew if k in seen}
        (tmp_path / "latency.json").write_text(json.dumps({"loaded_with_rows": loaded, "grew": grew, "seen": seen,
                                                           "latency": latency}))
        print(f"live: page opened with {loaded} rows; seconds from row to page: {latency}")
        assert len(grew) >= 2, f"the run wrote only {len(grew)} rows after the page opened"
        assert sorted(latency) == sorted(grew), f"rows never shown: {sorted(set(grew) - set(latency))}"
        assert all(v < LIVE_SECONDS for v in latency.values()), latency
        # The curve holds every step the run wrote, by its step number.
        xs = page.evaluate("window.agentrlCharts.reward_mean.data[0]")
        assert xs == list(range(steps))
        assert page.get_attribute('.chart[data-metric="reward_mean"]', "data-points") == str(steps)
        page.screenshot(path=tmp_path / "live-run.png", full_page=True)
        assert errors == []
    finally:
        stop(viewer)
        stop(trainer)


@pytest.mark.browser
@pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"needs Chromium at {CHROMIUM} (apt-get install chromium)")
def test_export_is_one_file_that_opens_offline(runs, browser, tmp_path):
    run, old = runs
    out = export_html([run, old], tmp_path / "out.html")
    text = out.read_text()
    assert 'src="http' not in text and 'href="http' not in text and "/static/" not in text
    errors: list[str] = []
    context = browser.new_context()
    requests: list[str] = []
    context.route("**/*", lambda route: (requests.append(route.request.url), route.continue_()
                                         if route.request.url.startswith("file:") else route.abort()))
    page = context.new_page()
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(out.as_uri())
    page.wait_for_selector('.chart[data-metric="reward_mean"] canvas')
    assert page.get_attribute('.chart[data-metric="reward_mean"]', "data-points") == str(2 * metrics_rows(run))
    assert page.locator("section[id^='run0-ep'] .tokens").count() >= 4
    assert [u for u in requests if not u.startswith("file:")] == []
    page.screenshot(path=tmp_path / "export.png")
    context.close()
    assert errors == []


def test_export_errors_are_one_line(runs, tmp_path):
    run, _ = runs
    with pytest.raises(ViewError, match="does not exist"):
        export_html([run], tmp_path / "no" / "out.html")
    with pytest.raises(ViewError, match="not found"):
        export_html([tmp_path / "missing"], tmp_path / "out.html")
