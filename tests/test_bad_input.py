"""Bad input at the CLI: a non-zero exit, one message naming the problem, never a traceback, and no data lost.

Most cases run in-process through Typer's test runner (one interpreter, so the whole table takes seconds); a few run
as a real subprocess, as a user types them, to check what reaches the terminal. Every case fails before a model is
loaded except the two marked below, which use `tiny-qwen3` (a few seconds each).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT
from typer.testing import CliRunner

from agentrl.cli.main import app

TINY_RUN = ["--model", "tiny-qwen3", "--steps", "1", "--group-size", "2", "--prompts-per-step", "1",
            "--max-new-tokens", "8"]


def cli(*args: str, stdin: str = "") -> tuple[int, str]:
    """Run the CLI in-process; return its exit code and stderr. A Python exception escaping it fails the test."""
    result = CliRunner().invoke(app, list(args), input=stdin)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"agentrl {' '.join(args)} raised {result.exception!r} instead of a clean error")
    return result.exit_code, result.stderr


def assert_clean_failure(code: int, stderr: str, *fragments: str) -> None:
    assert code != 0, f"expected a failure, got exit 0; stderr: {stderr}"
    assert "Traceback" not in stderr, stderr
    assert stderr.strip().startswith("error:"), stderr
    for fragment in fragments:
        assert fragment in stderr, f"{fragment!r} missing from: {stderr}"


@pytest.fixture
def yaml_file(tmp_path):
    def write(text: str) -> str:
        path = tmp_path / "config.yaml"
        path.write_text(text)
        return str(path)

    return write


@pytest.fixture
def broken_jsonl(tmp_path) -> str:
    path = tmp_path / "problems.jsonl"
    path.write_text('{"question": "1 + 1", "answer": "#### 2"}\n{not json\n')
    return str(path)


# -- play: env ids and env arguments ------------------------------------------------------------------------------

@pytest.mark.parametrize("args, fragments", [
    (["--env", "mathh"], ["unknown env 'mathh'", "Did you mean 'math'"]),
    (["--env", "math", "--env-arg", "foo=1"], ["bad env argument for 'math'", "'foo'"]),
    (["--env", "math", "--env-arg", "level=99"], ["level must be one of", "99"]),
    (["--env", "math", "--env-arg", "mode=weird"], ["mode must be one of", "'weird'"]),
    (["--env", "math", "--env-arg", "verify_timeout_s=abc"], ["verify_timeout_s", "'abc'"]),
    (["--env", "math", "--env-arg", "source=/no/such/problems.jsonl"], ["not found", "/no/such/problems.jsonl"]),
    (["--env", "math", "--env-arg", "level=[1"], ["--env-arg 'level=[1'", "not valid YAML"]),
    (["--env", "math", "--env-arg", "level"], ["KEY=VALUE"]),
    (["--env", "math", "--seed", "-1"], ["--seed must be >= 0"]),
    (["--env", "math", "--max-steps", "0"], ["--max-steps must be >= 1"]),
    (["--env", "alfworld", "--env-arg", "grammar=xyz"], ["unknown grammar 'xyz'", "legacy"]),
    (["--env", "alfworld", "--env-arg", "game_file=/no/such/game.json"], ["game file not found"]),
    (["--env", "gui", "--env-arg", "renderer=xyz"], ["renderer must be one of", "'xyz'"]),
])
def test_play_bad_env_input(args, fragments):
    assert_clean_failure(*cli("play", *args), *fragments)


def test_play_malformed_math_jsonl_names_the_line(broken_jsonl):
    assert_clean_failure(*cli("play", "--env", "math", "--env-arg", f"source={broken_jsonl}"),
                         f"{broken_jsonl}:2", "invalid JSON")


def test_play_eof_on_stdin_stops_and_says_so():
    code, _ = cli("play", "--env", "math", stdin="")
    assert code == 1  # the episode did not end
    result = CliRunner().invoke(app, ["play", "--env", "math"], input="")
    assert "end of input" in result.stdout and "reward=0 success=False steps=0" in result.stdout


def test_alfworld_accepts_one_bare_task_type():
    result = CliRunner().invoke(app, ["play", "--env", "alfworld", "--expert", "--env-arg",
                                      "task_types=pick_and_place_simple"])
    assert result.exit_code == 0, result.output
    assert "success=True" in result.stdout


# -- run: flags and config files, all rejected before a model loads -------------------------------------------------

@pytest.mark.parametrize("args, fragments", [
    (["--steps", "-1"], ["steps must be >= 1, got -1"]),
    (["--group-size", "0"], ["scheduler.group_size must be >= 1, got 0"]),
    (["--prompts-per-step", "0"], ["scheduler.prompts_per_step must be >= 1"]),
    (["--runners", "-1"], ["runners.count must be >= 0 (0 = in-process), got -1"]),
    (["--max-turns", "0"], ["env.max_turns must be >= 1"]),
    (["--max-new-tokens", "0"], ["sampling.max_new_tokens must be >= 1"]),
    (["--sync-every", "0"], ["scheduler.sync_every must be >= 1"]),
    (["--lr", "-1"], ["optim.lr must be > 0"]),
    (["--loss", "nosuch"], ["unknown policy loss 'nosuch'", "minirl"]),
    (["--model", "tiny-qwen"], ["unknown model 'tiny-qwen'", "Did you mean 'tiny-qwen3'"]),
    (["--env", "mathh"], ["unknown env 'mathh'"]),
    (["--env-arg", "level=99"], ["bad arguments for env 'math'", "level must be one of"]),
    (["--env-arg", "foo=1"], ["bad arguments for env 'math'", "'foo'"]),
    (["--env", "gui", "--env-arg", "renderer=xyz"], ["bad arguments for env 'gui'", "renderer"]),
])
def test_run_bad_flags(tmp_path, args, fragments):
    assert_clean_failure(*cli("run", *TINY_RUN, "--output", str(tmp_path / "run"), *args), *fragments)


@pytest.mark.parametrize("text, fragments", [
    ("scheduler: {group_sz: 4}\n", ["unknown config key scheduler.'group_sz'", "Did you mean 'group_size'"]),
    ("scheduler: {group_size: four}\n", ["scheduler.group_size: expected int, got 'four'"]),
    ("context: {enable_thinking: maybe}\n", ["context.enable_thinking: expected bool"]),
    ("context: {observation_role: robot}\n", ["context.observation_role must be one of user, tool"]),
    ("context: {chat_family: xyz}\n", ["context.chat_family", "qwen3"]),
    ("sampling: {temperature: 0}\n", ["sampling.temperature must be > 0"]),
    ("scheduler: {group_size: 4\n", ["not valid YAML", "line 2"]),
    ("rollout: {group_size: 4}\n", ["rollout.group_size is now scheduler.group_size"]),
    ("rollout: {engine: vllm}\n", ["rollout.engine is now engine.kind"]),
    ("loss: {micro_batch_tokens: 512}\n", ["loss.micro_batch_tokens is now trainer.micro_batch_tokens"]),
    ("loss: {options: {eps_hi: 0.3}}\n", ["unknown option(s) 'eps_hi'", "eps_high"]),
    ("loss: {options: {eps_high: abc}}\n", ["eps_high must be a number, got 'abc'"]),
    ("loss: {options: 5}\n", ["loss.options: expected a mapping"]),
    ("advantage: {estimator: nosuch}\n", ["advantage.estimator must be one of", "group_mean"]),
    ("advantage: {estimator: grpo, options: {epsilon: 0.1}}\n", ["unknown option(s) 'epsilon'", "valid options: eps"]),
    ("loss: {routing_replay: r4}\n", ["loss.routing_replay must be one of none, r2, r3"]),
    ("env: {kwargs: 5}\n", ["env.kwargs: expected a mapping"]),
    ("env: {seed_offset: -1}\n", ["env.seed_offset must be >= 0"]),
    ("optim: {betas: [0.9]}\n", ["optim.betas: expected a list of 2 values"]),
    ("guard: {action: explode}\n", ["guard.action must be one of stop, rollback"]),
    ("trainer: {dtype: float64x}\n", ["trainer.dtype must be one of float32"]),
    ("dtype: float32\n", ["dtype is now trainer.dtype"]),
    ("save_every: 0\n", ["save_every must be >= 1"]),
    ("- just\n- a list\n", ["the top level must be a mapping"]),
])
def test_run_bad_config_file(tmp_path, yaml_file, text, fragments):
    config = yaml_file(text)
    code, stderr = cli("run", "--config", config, "--steps", "1", "--output", str(tmp_path / "run"))
    assert_clean_failure(code, stderr, *fragments)


def test_run_passk_needs_big_enough_groups(tmp_path, yaml_file):
    config = yaml_file("advantage: {estimator: passk}\n")
    assert_clean_failure(*cli("run", *TINY_RUN, "--config", config, "--output", str(tmp_path / "run")),
                         "scheduler.group_size must be >= 4 with advantage.estimator passk")


def test_run_missing_config_and_unusable_output(tmp_path):
    assert_clean_failure(*cli("run", "--config", str(tmp_path / "nope.yaml")), "config file not found")
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    assert_clean_failure(*cli("run", *TINY_RUN, "--output", str(a_file)), "it is a file")


def test_resume_of_a_folder_that_is_not_a_run(tmp_path):
    assert_clean_failure(*cli("run", "--resume", str(tmp_path)), "no config.yaml there")
    (tmp_path / "config.yaml").write_text("{broken\n")
    assert_clean_failure(*cli("run", "--resume", str(tmp_path)), "not valid YAML")
    (tmp_path / "config.yaml").write_text("model: tiny-qwen3\n")
    assert_clean_failure(*cli("run", "--resume", str(tmp_path)), "nothing to resume", "trainer_state.json")


def test_resume_of_a_finished_run_asks_for_more_steps(tmp_path):
    (tmp_path / "config.yaml").write_text("model: tiny-qwen3\nsteps: 5\n")
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "trainer_state.json").write_text(json.dumps({"step": 4}))
    assert_clean_failure(*cli("run", "--resume", str(tmp_path)), "already holds 5 trained step(s)", "--steps N")


# -- eval, inspect, check-template, webshop serve ---------------------------------------------------------------------

def test_eval_bad_input(tmp_path):
    out = str(tmp_path / "eval")
    assert_clean_failure(*cli("eval", "--env", "math", "--model", str(tmp_path / "no-checkpoint"), "--output", out),
                         "unknown model", "no config.json")
    assert_clean_failure(*cli("eval", "--env", "math", "--model", "tiny-qwen3", "--seed-offset", "-1"),
                         "env.seed_offset must be >= 0")
    assert_clean_failure(*cli("eval", "--env", "math", "--model", "tiny-qwen3", "--k", "4", "--samples-per-task",
                              "2"), "pass@4 needs at least 4 samples per task")
    assert_clean_failure(*cli("eval", "--env", "math", "--model", "tiny-qwen3", "--env-arg",
                              "source=/no/such.jsonl", "--output", out), "bad arguments for env 'math'", "not found")
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    assert_clean_failure(*cli("eval", "--env", "math", "--model", "tiny-qwen3", "--output", str(a_file)),
                         "it is a file")
    assert_clean_failure(*cli("eval", "--compare", str(tmp_path), str(tmp_path)), "results.json: not found")


def test_inspect_bad_input(tmp_path):
    assert_clean_failure(*cli("inspect", str(tmp_path)), "trajectories.jsonl not found")
    assert_clean_failure(*cli("inspect", str(tmp_path), "--plot", str(tmp_path / "shifts.txt")),
                         "must end in .png")
    assert_clean_failure(*cli("inspect", str(tmp_path), "--plot", str(tmp_path / "no" / "dir.png")),
                         "does not exist")
    (tmp_path / "trajectories.jsonl").write_text('{"group_id": 0}\n')
    assert_clean_failure(*cli("inspect", str(tmp_path)), "trajectories.jsonl:1: not a saved trajectory")


@pytest.mark.parametrize("content, fragment", [
    ('[{"role": "user"}]', "message 0 must be an object with string 'role' and 'content'"),
    ('{"messages": 5}', "'messages' must be a list"),
    ('[{"role": "user", "content": "hi"}]', "no assistant message"),
    ("[]", "no conversations in the file"),
    ("nonsense", "not JSON/JSONL"),
])
def test_check_template_bad_conversations(tmp_path, content, fragment):
    path = tmp_path / "conversations.json"
    path.write_text(content)
    assert_clean_failure(*cli("check-template", "--model", "tiny-qwen3", "--conversations", str(path)), fragment)


def test_check_template_bad_model_family_and_folder(tmp_path):
    assert_clean_failure(*cli("check-template", "--model", "tiny-qwen"), "Did you mean 'tiny-qwen3'")
    assert_clean_failure(*cli("check-template", "--model", "tiny-qwen3", "--family", "xyz"),
                         "unknown chat-template family 'xyz'")
    assert_clean_failure(*cli("check-template", "--model", "tiny-qwen3", "--conversations", str(tmp_path)),
                         "is a folder")


def test_webshop_serve_bad_port():
    assert_clean_failure(*cli("webshop", "serve", "--port", "70000"), "--port must be in 0..65535")


# -- real subprocesses: what a user's terminal shows ------------------------------------------------------------------

def agentrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("args, fragment", [
    (["play", "--env", "math", "--env-arg", "level=99"], "level must be one of"),
    (["run", "--group-size", "0", "--steps", "1"], "scheduler.group_size must be >= 1"),
    (["run", "--model", "tiny-qwen", "--steps", "1"], "Did you mean 'tiny-qwen3'"),
])
def test_subprocess_errors_reach_the_terminal_without_traceback(tmp_path, args, fragment):
    proc = agentrl(*args, *(["--output", str(tmp_path / "run")] if args[0] == "run" else []))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.startswith("error:") and fragment in proc.stderr, proc.stderr


def test_failed_run_keeps_the_previous_runs_data(tmp_path):
    """A setting that is only checked once the model is loaded (R2 on a dense model) must not wipe the old run."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 0, "reward_mean": 0.5}\n')
    (out / "trajectories.jsonl").write_text("{}\n")
    (out / "config.yaml").write_text("steps: 7\n")
    config = tmp_path / "r2.yaml"
    config.write_text("loss: {routing_replay: r2}\n")
    proc = agentrl("run", *TINY_RUN, "--config", str(config), "--output", str(out), "--overwrite")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr  # refused once the model loaded: 1
    assert "needs an MoE model" in proc.stderr
    assert (out / "metrics.jsonl").read_text() == '{"step": 0, "reward_mean": 0.5}\n'
    assert (out / "trajectories.jsonl").exists() and (out / "config.yaml").read_text() == "steps: 7\n"


def test_play_eof_in_a_real_terminal_pipe():
    proc = agentrl("play", "--env", "math")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "end of input" in proc.stdout
