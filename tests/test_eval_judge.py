"""`agentrl eval` with a judge (issue 44, item 4): the judged reward of training, on held-out tasks.

The judge is the scripted OpenAI-compatible server of `test_judge_reward` (a real HTTP server on 127.0.0.1); the
policy is the tiny built-in Qwen3 on the math env's first held-out tasks, a few tokens per reply. Each judge answers
by the task it reads in the rubric, so every episode's expected score is known.
"""

from __future__ import annotations

import io
import json
import os
import time

import pytest
import yaml
from rich.console import Console
from test_judge_reward import ScriptedJudge, closed_port_url
from typer.testing import CliRunner

from agentrl.config import JudgeConfig, RewardConfig, RunConfig, apply_overrides, config_to_dict
from agentrl.recipes.evaluate import EVAL_SEED_OFFSET, EvalConfig, EvalError, eval_env, evaluate
from agentrl.records import load_trajectories
from agentrl.rewards.judge import JUDGE_CACHE

# The math env's first three held-out tasks (split test, seeds 1,000,000 ...), and the judge's score for each.
TASKS = {EVAL_SEED_OFFSET: "What is 9 - 8?", EVAL_SEED_OFFSET + 1: "What is 18 + 9?",
         EVAL_SEED_OFFSET + 2: "What is 4 + 9?"}
SCORES = {EVAL_SEED_OFFSET: 8, EVAL_SEED_OFFSET + 1: 2, EVAL_SEED_OFFSET + 2: 5}

# results.json and its episode rows as `agentrl eval` wrote them before it took a judge.
RESULT_KEYS = {"agentrl_version", "created", "protocol", "env", "model", "tasks", "sampling", "engine", "context",
               "trained_with", "confidence", "overall", "by_task_type", "pass_at_k_curve", "timing", "episodes",
               "transcripts"}
ROW_KEYS = {"task", "seed", "task_type", "success", "reward", "turns", "tokens", "truncated", "length_cut_turns"}


@pytest.fixture
def scripted():
    """Start scripted judges (`test_judge_reward.ScriptedJudge`); each is closed after the test."""
    servers: list[ScriptedJudge] = []

    def start(answer) -> ScriptedJudge:
        servers.append(ScriptedJudge(answer))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def by_task(fail: tuple[int, ...] = ()):
    """A judge that scores each task as `SCORES` says, and answers the tasks of `fail` without a score."""
    def answer(prompt: str, n: int) -> str:
        for seed, task in TASKS.items():
            if task in prompt:
                return "No verdict." if seed in fail else f"Reasoning.\nSCORE: {SCORES[seed]}"
        raise AssertionError(f"a task this test does not know: {prompt[:300]!r}")
    return answer


def judged(url: str, **judge: object) -> RewardConfig:
    settings = dict(endpoint=url, model="judge-model", retries=1, backoff=0.01, timeout=5.0) | judge
    return RewardConfig(judge=JudgeConfig(**settings), rule_weight=0.5, judge_weight=2.0)


def run_eval(out, *, reward: RewardConfig | None = None, model: str = "tiny-qwen3", episodes: int = 3,
             n: int = 1, **kwargs) -> tuple[dict, str]:
    """An evaluation of `episodes` math tasks, `n` samples each; its results and what it printed."""
    cfg = EvalConfig(model=model, env=eval_env("math"), episodes=episodes, samples_per_task=n, max_new_tokens=4,
                     output=str(out), transcripts=0, **({"reward": reward} if reward else {}), **kwargs)
    console = Console(file=io.StringIO(), width=200)
    results = evaluate(cfg, progress=False, console=console)
    return results, console.file.getvalue()


def test_eval_with_a_judge_scores_as_training_does_and_a_rerun_reads_the_cache(scripted, tmp_path):
    server = scripted(by_task())
    results, printed = run_eval(tmp_path / "judged", reward=judged(server.url))
    rows = results["episodes"]
    assert sorted(r["seed"] for r in rows) == sorted(TASKS)
    for row in rows:  # reward = 0.5 x rule + 2 x judge, the score mapped from 0-10 to [0, 1]
        assert row["judge_reward"] == pytest.approx(SCORES[row["seed"]] / 10)
        assert row["reward"] == pytest.approx(0.5 * row["rule_reward"] + 2.0 * row["judge_reward"])
    judge = results["judge"]
    assert judge["source"] == "flags" and judge["failures"] == 0
    assert judge["settings"]["judge"]["endpoint"] == server.url
    assert judge["counts"]["calls"] == 3 == server.calls and judge["counts"]["cache_hits"] == 0
    assert judge["judge_score_mean"]["estimate"] == pytest.approx(0.5)
    assert results["overall"]["reward_mean"]["estimate"] == pytest.approx(sum(r["reward"] for r in rows) / 3)
    assert f"judge: judge-model at {server.url} (flags)" in printed
    assert len((tmp_path / "judged" / JUDGE_CACHE).read_text().splitlines()) == 3
    saved = json.loads((tmp_path / "judged" / "results.json").read_text())
    assert saved["judge"]["counts"]["calls"] == 3 and saved["episodes"] == rows

    # The same evaluation again into the same folder: every score from the cache, no HTTP call.
    again, _ = run_eval(tmp_path / "judged", reward=judged(server.url))
    assert server.calls == 3 and again["judge"]["counts"]["calls"] == 0 and again["judge"]["counts"]["cache_hits"] == 3
    assert again["episodes"] == rows

    # No judge: today's evaluation, bit for bit (the same episodes, the env's reward, no judge anywhere).
    plain, printed = run_eval(tmp_path / "plain")
    assert set(plain) == RESULT_KEYS and all(set(r) == ROW_KEYS for r in plain["episodes"])
    assert plain["episodes"] == [{k: (r["rule_reward"] if k == "reward" else v) for k, v in r.items()
                                  if k in ROW_KEYS} for r in rows]
    assert not (tmp_path / "plain" / JUDGE_CACHE).exists() and "judge" not in printed
    assert server.calls == 3
    # `agentrl eval --compare` says that the two rewards are not the same score.
    from agentrl.eval_compare import setting_differences

    assert setting_differences(results, plain)[0] == (
        "reward", f"0.5 x rule + 2 x judge judge-model at {server.url} (built-in rubric, scale 0-10, temperature 0)",
        "env's rule reward")
    assert setting_differences(results, again) == []


def test_a_failed_judgement_leaves_its_task_out_counted_and_never_scored(scripted, tmp_path):
    server = scripted(by_task(fail=(EVAL_SEED_OFFSET + 1,)))
    results, _ = run_eval(tmp_path / "eval", reward=judged(server.url), n=2)
    rows = results["episodes"]
    # The task whose judgement failed is out of every number (its group dropped, as training drops it), not a 0.
    assert sorted({r["seed"] for r in rows}) == [EVAL_SEED_OFFSET, EVAL_SEED_OFFSET + 2] and len(rows) == 4
    assert all(r["judge_reward"] == pytest.approx(SCORES[r["seed"]] / 10) for r in rows)
    assert results["overall"]["tasks"] == 2 and results["overall"]["episodes"] == 4
    judge = results["judge"]
    assert judge["failures"] == 1 and judge["failure_kinds"] == {"unparsable": 1}
    assert f"seed {EVAL_SEED_OFFSET + 1}" in judge["failure_lines"][0]
    assert judge["counts"]["failed_calls"] >= 2 and judge["counts"]["retries"] >= 1  # retried before it counted
    saved = [json.loads(line) for line in (tmp_path / "eval" / "trajectories.jsonl").read_text().splitlines()]
    assert EVAL_SEED_OFFSET + 1 not in {t["seed"] for t in saved}

    # A judge that cannot be reached at all: no episode is scored, so the evaluation says so and writes no result.
    with pytest.raises(EvalError, match=r"the judge scored no episode: 1 judgement\(s\) failed.*judge_unreachable"):
        run_eval(tmp_path / "down", reward=judged(closed_port_url(), retries=0), episodes=1)
    assert not (tmp_path / "down" / "results.json").exists()


def test_a_spent_budget_stops_the_eval_with_one_line_naming_the_setting(scripted, tmp_path):
    from agentrl.cli.main import app

    server = scripted(by_task())
    out = tmp_path / "eval"
    got = CliRunner().invoke(app, ["eval", "--env", "math", "--model", "tiny-qwen3", "--episodes", "3",
                                   "--max-new-tokens", "4", "--transcripts", "0", "--output", str(out),
                                   "--reward.judge.endpoint", server.url, "--reward.judge.model", "judge-model",
                                   "--reward.judge.budget-calls", "1"])
    assert got.exit_code == 2, got.output
    # The progress bar shares stderr (redrawn with \r, more often on a loaded machine): the error is its last line.
    error = got.stderr.strip().splitlines()[-1]
    assert "Traceback" not in got.stderr and "budget of 1 calls is spent (reward.judge.budget_calls)" in error
    assert "--reward.judge.budget-calls N" in error and JUDGE_CACHE in error
    assert not (out / "results.json").exists()  # nothing half-scored is written
    # The one call the budget allowed may still be on its way when the others are refused; it lands in the cache.
    deadline = time.monotonic() + 10
    while not (out / JUDGE_CACHE).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.calls == 1 and len((out / JUDGE_CACHE).read_text().splitlines()) == 1  # the budget held

    # The same flags with room: the judged evaluation, its one paid score read from the cache.
    got = CliRunner().invoke(app, ["eval", "--env", "math", "--model", "tiny-qwen3", "--episodes", "3",
                                   "--max-new-tokens", "4", "--transcripts", "0", "--output", str(out),
                                   "--reward.judge.endpoint", server.url, "--reward.judge.model", "judge-model",
                                   "--reward.judge.budget-calls", "4"])
    assert got.exit_code == 0, got.output
    assert "1 x rule + 1 x judge (judge-model, flags)" in " ".join(got.stdout.split())
    results = json.loads((out / "results.json").read_text())
    assert results["judge"]["counts"]["calls"] == 2 and results["judge"]["counts"]["cache_hits"] == 1
    assert server.calls == 3


# -- a training run's judge carries into the evaluation of its checkpoint ---------------------------------------------


@pytest.fixture(scope="module")
def run_folder(tiny_qwen3, tmp_path_factory):
    """A run folder as `agentrl run` leaves it: checkpoint/ (the tiny model, trainer_state.json) and config.yaml."""
    run = tmp_path_factory.mktemp("run")
    ckpt = run / "checkpoint"
    tiny_qwen3.model.save_pretrained(ckpt)
    tiny_qwen3.tokenizer.save_pretrained(ckpt)
    (ckpt / "generation_config.json").write_text(json.dumps(tiny_qwen3.generation_config))
    (ckpt / "agentrl_model.json").write_text(json.dumps({"family": tiny_qwen3.family, "base_model": "tiny-qwen3"}))
    (ckpt / "trainer_state.json").write_text('{"step": 1}')
    return run


def save_run_config(run, url: str, api_key_env: str = "") -> None:
    cfg = apply_overrides(RunConfig(), {"model": "tiny-qwen3", "env.id": "math", "reward.judge.endpoint": url,
                                        "reward.judge.model": "run-judge", "reward.judge.retries": 0,
                                        "reward.judge.api_key_env": api_key_env,
                                        "reward.rule_weight": 0.25, "reward.judge_weight": 1.0})
    (run / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def test_the_runs_judge_scores_an_eval_of_its_checkpoint_only_when_asked(scripted, run_folder, tmp_path):
    from agentrl.cli.evaluate import eval_config
    from agentrl.recipes.evaluate import _reward, _training_run

    server = scripted(by_task())
    save_run_config(run_folder, server.url, api_key_env="AGENTRL_TEST_SECRET")
    ckpt = str(run_folder / "checkpoint")

    # By default a run folder is not trusted: its judge (an endpoint, a key variable) is named, not called.
    off, printed = run_eval(tmp_path / "off", model=ckpt, episodes=1)
    assert "judge" not in off and server.calls == 0
    assert "--reward-from-run" in printed and server.url in printed and "$AGENTRL_TEST_SECRET" in printed
    assert eval_config({"model": ckpt, "env.id": "math", "reward.judge.budget_calls": 5}).reward.judge.endpoint == ""

    os.environ["AGENTRL_TEST_SECRET"] = "s3cret"
    try:
        results, printed = run_eval(tmp_path / "eval", model=ckpt, episodes=1, reward_from_run=True)
    finally:
        del os.environ["AGENTRL_TEST_SECRET"]
    assert server.requests[0]["auth"] == "Bearer s3cret"
    judge = results["judge"]
    assert judge["source"] == "training run (config.yaml)" and judge["settings"]["judge"]["model"] == "run-judge"
    row = results["episodes"][0]
    assert row["reward"] == pytest.approx(0.25 * row["rule_reward"] + 0.8) and server.calls == 1
    assert "(training run (config.yaml))" in printed

    # The command line: --reward.* flags change the run's judge key by key; an empty endpoint turns it off.
    cfg = eval_config({"model": ckpt, "env.id": "math", "reward_from_run": True, "reward.judge.budget_calls": 5})
    assert (cfg.reward.judge.endpoint, cfg.reward.judge.model, cfg.reward.judge.budget_calls) == (server.url,
                                                                                                  "run-judge", 5)
    assert cfg.reward.rule_weight == 0.25
    assert _reward(cfg, _training_run(ckpt))[1] == "training run (config.yaml), reward.judge.budget_calls from flags"
    cfg = eval_config({"model": ckpt, "env.id": "math", "reward_from_run": True, "reward.judge.endpoint": ""})
    assert not cfg.reward.judge.enabled and cfg.reward_from_run is False
    assert _reward(cfg, _training_run(ckpt)) == (RewardConfig(), "")
    assert eval_config({"model": ckpt, "env.id": "math"}).reward == RewardConfig()  # taken from the run at eval time


def test_a_scripted_judge_sees_the_episode_it_scores(scripted, tmp_path):
    """The rubric the judge gets holds the task and the agent's reply: the same prompt as in training."""
    server = scripted(by_task())
    results, _ = run_eval(tmp_path / "eval", reward=judged(server.url), episodes=1)
    prompt = server.requests[0]["body"]["messages"][0]["content"]
    action = load_trajectories(tmp_path / "eval" / "trajectories.jsonl")[0].turns[0].action
    assert TASKS[EVAL_SEED_OFFSET] in prompt and f"[turn 1] agent: {action}" in prompt
    assert server.requests[0]["body"]["model"] == "judge-model" and results["judge"]["counts"]["calls"] == 1
