"""``agentrl run --agent``: agent functions as the rollout, their faults, and the example agent end to end."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

openai = pytest.importorskip("openai")

from conftest import ROOT  # noqa: E402

from agentrl.config import ConfigError  # noqa: E402
from agentrl.engine.base import SamplingParams  # noqa: E402
from agentrl.rollout.agents import AgentRollout, load_agent  # noqa: E402
from agentrl.rollout.driver import RolloutDriver  # noqa: E402
from agentrl.rollout.pool import EnvMaker  # noqa: E402
from agentrl.serve.server import session_url  # noqa: E402


def _ask(task, base_url):
    client = openai.OpenAI(base_url=base_url, api_key=task.api_key, max_retries=0)
    reply = client.chat.completions.create(model=task.model, messages=[{"role": "user", "content": task.prompt}])
    return task.step(reply.choices[0].message.content or "").reward


def _raises_on_seed_1(task, base_url):
    if task.seed == 1:
        raise RuntimeError("agent bug")
    return _ask(task, base_url)


def _hangs_on_seed_1(task, base_url):
    if task.seed == 1:
        time.sleep(60)
    return _ask(task, base_url)


async def _async_hangs_on_seed_1(task, base_url):
    if task.seed == 1:
        await asyncio.sleep(60)
    return await asyncio.to_thread(_ask, task, base_url)


def _no_calls_on_seed_1(task, base_url):
    if task.seed == 1:
        return 1.0
    return _ask(task, base_url)


def _rollout(tiny_qwen3, fn, rows=None, **options):
    from agentrl.engine import EngineSpec, build_engines

    engine = build_engines(EngineSpec(kind="hf", batch_size=8), tiny_qwen3, share_module=True)
    return AgentRollout(
        fn, engine, lambda: tiny_qwen3.model.state_dict().items(), tiny_qwen3.tokenizer,
        maker=None if rows else EnvMaker("math", {}), rows=rows, seeds_for_step=lambda s: [0, 1],
        sampling_for_step=lambda s: SamplingParams(max_new_tokens=6, seed=s), group_size=2,
        concurrency=options.pop("concurrency", 4), max_retries=options.pop("max_retries", 1),
        timeout=options.pop("timeout", 60.0), family_hint="qwen3", model_name="tiny-qwen3", **options)


def test_groups_and_trajectories_from_sessions(tiny_qwen3):
    rollout = _rollout(tiny_qwen3, _ask)
    try:
        result = rollout.rollout(0)
    finally:
        rollout.close()
    trajs = result.trajectories
    assert [t.group_id for t in trajs] == [0, 0, 1, 1] and [t.seed for t in trajs] == [0, 0, 1, 1]
    assert all(len(t.turns) == 1 and len(t.turns[0].generated_ids) == 6 for t in trajs)
    # Each episode of a group is sampled with its own seed: the two replies to one prompt differ.
    assert trajs[0].turns[0].prompt_ids == trajs[1].turns[0].prompt_ids
    assert trajs[0].turns[0].generated_ids != trajs[1].turns[0].generated_ids
    assert result.stats.metrics()["agent_calls_per_episode"] == 1.0 and result.stats.errors == 0
    assert isinstance(rollout, RolloutDriver) and rollout.stale_groups_evicted == 0  # the train loop's whole view


@pytest.mark.parametrize("fn, kind, metric", [
    (_raises_on_seed_1, "agent_error", "agent_errors"),
    (_hangs_on_seed_1, "timeout", "agent_timeouts"),
    # ~16 s of timeouts; the sync hang above takes the same path through the session timeout.
    pytest.param(_async_hangs_on_seed_1, "timeout", "agent_timeouts", marks=pytest.mark.slow),
    (_no_calls_on_seed_1, "no_calls", "agent_no_calls"),
])
def test_faults_drop_the_group_and_nothing_else(tiny_qwen3, fn, kind, metric):
    # Hangs need a short timeout; one long enough that the good group never meets it on a loaded box.
    rollout = _rollout(tiny_qwen3, fn, timeout=8.0 if kind == "timeout" else 60.0, max_retries=1)
    try:
        t0 = time.perf_counter()
        result = rollout.rollout(0)
        seconds = time.perf_counter() - t0
    finally:
        rollout.close()
    assert [t.seed for t in result.trajectories] == [0, 0]  # the good group, whole
    stats = result.stats
    assert stats.dropped_groups == 1 and stats.retries >= 1
    assert stats.metrics()[metric] == stats.errors >= 2  # both tries of the failing episode(s), counted
    assert all(line.startswith(kind) for line in stats.failures)
    assert seconds < 50  # a hung agent costs its timeouts (2 x 8 s), not its sleep (2 x 60 s)


def _scores_itself(task, base_url):
    client = openai.OpenAI(base_url=base_url, api_key=task.api_key, max_retries=0)
    client.chat.completions.create(model=task.model, messages=[{"role": "user", "content": task.prompt}])
    return float(task.row["target"])


def test_dataset_rows_are_tasks_and_the_agent_scores_them(tiny_qwen3):
    rows = [{"prompt": "Say hi.", "target": 1}, {"prompt": "Say bye.", "target": 0}]
    rollout = _rollout(tiny_qwen3, _scores_itself, rows=rows)
    try:
        result = rollout.rollout(0)
    finally:
        rollout.close()
    assert [t.total_return for t in result.trajectories] == [1.0, 1.0, 0.0, 0.0]
    assert [t.first_observation for t in result.trajectories] == ["Say hi.", "Say hi.", "Say bye.", "Say bye."]
    assert result.trajectories[0].env_id == "dataset"


def test_a_timed_out_session_is_closed(tiny_qwen3):
    rollout = _rollout(tiny_qwen3, _ask)
    try:
        rollout._closed_sessions.add("gone")
        client = openai.OpenAI(base_url=session_url(rollout.server.address, "gone"), api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as err:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert err.value.status_code == 409 and "closed" in err.value.body["message"]
        stranger = openai.OpenAI(base_url=session_url(rollout.server.address, "never-started"), api_key="x",
                                 max_retries=0)
        with pytest.raises(openai.APIStatusError):
            stranger.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    finally:
        rollout.close()


def test_load_agent_says_what_is_wrong(tmp_path):
    with pytest.raises(ConfigError, match="expected 'package.module:function'"):
        load_agent("no_colon")
    with pytest.raises(ConfigError, match="no file"):
        load_agent("missing.py:run")
    bad = tmp_path / "bad_agent.py"
    bad.write_text("def run(task):\n    return 1.0\n")
    with pytest.raises(ConfigError, match=r"must take \(task, base_url\)"):
        load_agent(f"{bad}:run")
    with pytest.raises(ConfigError, match="has no function 'go'"):
        load_agent(f"{bad}:go")
    assert load_agent(f"{ROOT}/examples/math_tool_agent.py:run").__name__ == "run"


@pytest.mark.slow  # ~11 s; tests/test_examples.py runs the same agent by its docstring's command in the default run
def test_example_agent_trains_from_the_cli(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "agentrl.cli", "run", "--agent", "examples/math_tool_agent.py:run",
           "--model", "tiny-qwen3", "--steps", "1", "--env-arg", "mode=multi", "--env-arg", "max_turns=2",
           "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "8", "--engine", "hf",
           "--output", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["agent_calls_per_episode"] == 2.0 and metrics[0]["samples"] >= 4
    sessions = [json.loads(line) for line in (out / "agent_sessions.jsonl").read_text().splitlines()]
    assert len(sessions) == 4 and all(s["calls"] == 2 for s in sessions)
    trajectories = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajectories) == 4 and all(len(t["turns"]) == 2 for t in trajectories)
    assert (out / "checkpoint").is_dir()


def test_bad_agent_flag_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "agentrl.cli", "run", "--agent", "nowhere.py:run", "--model",
                           "tiny-qwen3", "--steps", "1", "--output", str(tmp_path / "r")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no file 'nowhere.py'" in done.stderr and "Traceback" not in done.stderr
