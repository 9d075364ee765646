"""GUI screenshots reach the run folder and the viewer's episode page.

A 1-step tiny run (random-init tiny Qwen3) on the phone GUI env with its fast renderer saves the turn screenshots of
`screenshots_per_step` episodes as ``RUN/screenshots/ep{N}_turn{T}.png`` (N: the episode's line in
trajectories.jsonl); the viewer's page of such an episode shows them, other episodes say why they have none, and
``screenshots_per_step: 0`` writes nothing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from PIL import Image

from agentrl.config import RunConfig, apply_overrides
from agentrl.recipes.train import train
from agentrl.view import RunFolder, build_app

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def gui_config(tmp_path: Path, **overrides) -> RunConfig:
    """The smallest GUI run: 2 tasks x 2 episodes, 2 turns of 6 tokens, compact screens, no grading subprocess."""
    base = {
        "model": "tiny-qwen3", "env.id": "gui", "steps": 1, "output": str(tmp_path / "run"),
        "env.kwargs": {"max_steps": 2, "screenshots": True, "observation": "compact", "action_format": "call",
                       "task_types": ["toggle_setting"], "reward_budget_s": None},
        "env.max_turns": 2, "scheduler.prompts_per_step": 2, "scheduler.group_size": 2,
        "sampling.max_new_tokens": 6, "context.max_context_tokens": 4096, "guard.enabled": False,
        "token_values_per_step": 0, "save_every": 100,
    }
    return apply_overrides(RunConfig(), base | overrides)


@pytest.fixture(scope="module")
def gui_run(tmp_path_factory) -> Path:
    return train(gui_config(tmp_path_factory.mktemp("gui"), screenshots_per_step=2), progress=False)


def test_run_saves_screenshots_of_the_configured_episodes(gui_run):
    episodes = [json.loads(line) for line in (gui_run / "trajectories.jsonl").read_text().splitlines()]
    assert "screenshot" not in episodes[0]["turns"][0]  # the PNGs are files, never JSONL
    files = sorted((gui_run / "screenshots").iterdir())
    named = {}
    for f in files:
        m = re.fullmatch(r"ep(\d+)_turn(\d+)\.png", f.name)
        assert m, f.name
        named.setdefault(int(m[1]), set()).add(int(m[2]))
        data = f.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000
        with Image.open(f) as im:
            im.verify()
    # 2 episodes: the first of each group (two tasks), each with every one of its turns.
    first_of_group = {e["group_id"]: i for i, e in reversed(list(enumerate(episodes)))}
    assert set(named) == set(first_of_group.values()) and len(named) == 2
    for i, turns in named.items():
        assert turns == set(range(len(episodes[i]["turns"])))


def test_episode_page_shows_the_screenshots(gui_run):
    from fastapi.testclient import TestClient

    c = TestClient(build_app([RunFolder(gui_run, 0)]))
    shot = sorted((gui_run / "screenshots").glob("*.png"))[0]
    episode = int(re.match(r"ep(\d+)_", shot.name)[1])
    page = c.get(f"/run/0/episode/{episode}").text
    urls = re.findall(r'<img class="shot"[^>]*src="([^"]+)"', page)
    assert f"/files/0/screenshots/{shot.name}" in urls
    assert len(urls) == len(list((gui_run / "screenshots").glob(f"ep{episode}_turn*.png")))
    got = c.get(urls[0])
    assert got.status_code == 200 and got.content.startswith(PNG_MAGIC)
    others = set(range(4)) - {int(re.match(r"ep(\d+)_", p.name)[1]) for p in (gui_run / "screenshots").iterdir()}
    other = c.get(f"/run/0/episode/{min(others)}").text
    assert '<img class="shot"' not in other and "no screenshots of this episode" in other


def test_zero_writes_none_and_the_page_says_so(tmp_path):
    from fastapi.testclient import TestClient

    run = train(gui_config(tmp_path, screenshots_per_step=0), progress=False)
    assert not (run / "screenshots").exists()
    page = TestClient(build_app([RunFolder(run, 0)])).get("/run/0/episode/0").text
    assert '<img class="shot"' not in page and "this folder holds no screenshots" in page
