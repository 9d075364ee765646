"""The code env end to end: real sandboxes (bubblewrap), tool outputs, grading in a fresh sandbox, the turn budget,
the expert in both action forms, SFT demonstrations as tool calls, Ray runners, a served env, and failures."""

from __future__ import annotations

import json
import sys

import pytest

import agentrl
from agentrl.envs.code import CodeEnv
from agentrl.envs.code.sandbox import SandboxError
from agentrl.envs.code.tools import tool_call_json, tool_call_text


def call(name: str, **args: str) -> str:
    return tool_call_json(name, **args)


@pytest.fixture()
def env():
    e = CodeEnv()
    yield e
    e.close()


def expert_episode(env: CodeEnv, seed: int):
    obs, info = env.reset(seed=seed)
    for _ in range(env.max_turns):
        obs, reward, terminated, truncated, info = env.step(env.expert_action())
        if terminated or truncated:
            return reward, terminated, info
    raise AssertionError("the expert did not finish")


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("expert_format", ["tool_call", "text"])
def test_expert_solves_every_level_in_both_action_forms(difficulty, expert_format):
    env = CodeEnv(difficulty=difficulty, expert_format=expert_format, split="test")
    try:
        for seed in range(3):
            reward, terminated, info = expert_episode(env, seed)
            assert (reward, terminated, info["success"]) == (1.0, True, True), info["test_details"]
            assert info["tests_passed"] == info["tests_total"] >= 3
    finally:
        env.close()


def test_reset_declares_tools_and_the_task(env):
    obs, info = env.reset(seed=4)
    assert obs == env.task.instruction and "solution.py" in obs
    assert [t["function"]["name"] for t in info["tools"]] == ["run_python", "run_shell", "write_file", "read_file",
                                                              "submit"]
    assert info["task_type"] == env.task.family and info["n_tests"] == env.task.n_tests
    assert CodeEnv.rollout_defaults == {"observation_role": "tool"}


def test_tool_outputs_are_the_observations(env):
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(call("run_python", code="print(6 * 7)"))
    assert obs.startswith("exit code 0") and "42" in obs and (reward, terminated, truncated) == (0.0, False, False)
    assert info["tool"] == "run_python" and info["exit_code"] == 0
    obs, *_ = env.step(call("run_shell", command="echo oops >&2; exit 3"))
    assert obs.startswith("exit code 3") and "stderr:\noops" in obs
    obs, *_ = env.step(call("write_file", path="pkg/notes.txt", content="hello\n"))
    assert obs == "Wrote 6 characters to pkg/notes.txt."
    obs, *_ = env.step(call("read_file", path="pkg/notes.txt"))
    assert obs == "hello\n"


def test_long_output_is_cut_with_a_marker_and_time_limits_are_reported():
    env = CodeEnv(observation_chars=400, limits={"wall_s": 1.0})
    try:
        env.reset(seed=0)
        obs, *_ = env.step(call("run_python", code="print('x' * 100000)"))
        assert "characters cut" in obs and "[output truncated at" in obs and len(obs) < 700
        obs, _, _, _, info = env.step(call("run_python", code="import time; time.sleep(30)"))
        assert obs.startswith("killed: over the 1 s time limit") and info["timed_out"]
    finally:
        env.close()


def test_unparseable_replies_cost_a_turn_and_never_raise(env):
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("I would write a loop here.")
    assert obs.startswith("Error: no tool call found") and "run_python" in obs
    assert (reward, terminated, truncated, info["tool"]) == (0.0, False, False, "")


def test_a_wrong_solution_gets_partial_credit_and_no_expected_values_leak(env):
    obs, info = env.reset(seed=2)
    entry = env.task.entry_point
    wrong = f"def {entry}(*args, **kwargs):\n    return None\n"
    env.step(call("write_file", path="solution.py", content=wrong))
    obs, reward, terminated, truncated, info = env.step(call("submit"))
    assert terminated and not truncated and not info["success"]
    assert reward == info["tests_passed"] / info["tests_total"] < 1.0
    assert obs == f"Submitted. Hidden tests passed: {info['tests_passed']}/{info['tests_total']}."
    for case in env.task.cases:
        assert json.dumps(case.expected) not in obs


def test_all_pass_reward_mode():
    env = CodeEnv(reward="all_pass")
    try:
        env.reset(seed=2)
        env.step(call("write_file", path="solution.py", content=f"def {env.task.entry_point}(*a):\n    return 0\n"))
        _, reward, _, _, info = env.step(call("submit"))
        assert reward == float(info["success"]) == 0.0 or reward == 1.0 == float(info["success"])
    finally:
        env.close()


def test_out_of_turns_grades_the_workspace_as_truncated():
    env = CodeEnv(max_turns=2)
    try:
        env.reset(seed=1)
        env.step(env.expert_action())  # writes the reference solution
        obs, reward, terminated, truncated, info = env.step(call("run_python", code="print(1)"))
        assert (terminated, truncated, reward, info["success"]) == (False, True, 1.0, True)
        assert "Out of turns: graded the workspace as it is. Hidden tests passed" in obs
        with pytest.raises(RuntimeError, match="reset"):
            env.step(call("submit"))
    finally:
        env.close()


def test_hidden_tests_never_enter_the_agents_workspace_and_tampering_does_not_carry(env):
    env.reset(seed=3)
    # /usr is the host's system tree, read-only (walking it took over the 10 s call limit on a slower machine).
    listing = "ls -la; find / \\( -path /usr -o -path /proc -o -path /sys \\) -prune -o -name '*grader*' -print"
    obs, *_ = env.step(call("run_shell", command=listing + " 2>/dev/null | head; echo done"))
    assert "grader" not in obs.split("done")[0].split("\n", 1)[1] and "done" in obs
    env.step(env.expert_action())
    # The agent plants a fake grader and a background process that would rewrite solution.py later.
    env.step(call("run_shell", command="mkdir -p .agentrl_grader && echo 'print(1)' > .agentrl_grader/run.py; "
                                       "(sleep 0.5; echo 'def broken(' > solution.py) &"))
    _, reward, terminated, _, info = env.step(call("submit"))
    assert terminated and reward == 1.0 and info["success"]


def test_each_episode_starts_in_an_empty_workspace(env):
    env.reset(seed=0)
    env.step(call("write_file", path="left_over.txt", content="x"))
    env.reset(seed=1)
    obs, *_ = env.step(call("run_shell", command="ls -A"))
    assert "left_over" not in obs


def test_a_sandbox_that_dies_mid_episode_is_an_env_error(env, monkeypatch):
    env.reset(seed=0)

    def dead(*args, **kwargs):
        raise SandboxError("the sandbox died")

    monkeypatch.setattr(env._sandbox, "run", dead)
    with pytest.raises(SandboxError, match="died"):
        env.step(call("run_python", code="print(1)"))


def test_the_unsafe_subprocess_backend_needs_the_operators_flag():
    with pytest.raises(Exception, match="unsafe_subprocess"):
        CodeEnv(backend="subprocess")
    env = CodeEnv(backend="subprocess", unsafe_subprocess=True)
    try:
        assert expert_episode(env, 0)[0] == 1.0
    finally:
        env.close()


def test_bad_arguments_name_the_problem():
    for kwargs, needle in [({"difficulty": 9}, "difficulty"), ({"family": "nope"}, "family"),
                           ({"split": "dev"}, "split"), ({"max_turns": 0}, "max_turns"),
                           ({"reward": "x"}, "reward"), ({"backend": "docker"}, "backend"),
                           ({"limits": {"wall": 1}}, "unknown field"), ({"source": "/no/such/file"}, "no such file")]:
        with pytest.raises((ValueError, FileNotFoundError), match=needle):
            CodeEnv(**kwargs)


def test_a_client_of_a_served_env_cannot_loosen_the_sandbox():
    from agentrl.envs.core import ClientSettingError, check_client_settings

    check_client_settings(CodeEnv, {"split": "test", "difficulty": 2, "max_turns": 5}, "code")
    for key, value in [("backend", "subprocess"), ("unsafe_subprocess", True), ("limits", "{}"),
                       ("source", "/etc"), ("backend_options", "{}")]:
        with pytest.raises(ClientSettingError, match=key):
            check_client_settings(CodeEnv, {key: value}, "code")


def test_sft_demonstrations_are_tool_calls_in_the_familys_syntax(qwen3_tokenizer):
    from agentrl.recipes.sft import expert_trajectory

    env = CodeEnv()
    try:
        traj = expert_trajectory(env, "code", 5, qwen3_tokenizer, context_options={"family": "qwen3"})
    finally:
        env.close()
    assert traj.success and traj.total_return == 1.0 and len(traj.turns) == 2
    first = qwen3_tokenizer.decode(traj.turns[0].generated_ids)
    assert "<tool_call>" in first and '"name": "write_file"' in first
    assert json.loads(traj.turns[0].action)["name"] == "write_file"
    assert "<tool_response>" in qwen3_tokenizer.decode(traj.turns[1].prompt_ids)


class _ToolCallingEngine:
    """Turn 1 runs Python, turn 2 submits: Qwen3 tool calls, as a model would write them."""

    policy_version = 0

    def __init__(self, tok):
        self.tok = tok
        self.calls = 0

    def generate(self, prompts, params):
        from agentrl.engine.base import Generation

        out = []
        for prompt in prompts:
            text = self.tok.decode(prompt)
            name, args = ("submit", {}) if "<tool_response>" in text else ("run_python", {"code": "print(6 * 7)"})
            reply = f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call><|im_end|>'
            ids = self.tok(reply, add_special_tokens=False)["input_ids"]
            out.append(Generation(tuple(ids), tuple(-0.1 for _ in ids), "stop"))
        return out

    def update_weights(self, named_tensors, version):
        pass

    def metrics(self):
        return {}

    def clear_cache(self):
        pass


def test_episodes_in_ray_runners_run_real_sandboxes(ray_session, qwen3_tokenizer):
    from agentrl.engine.base import SamplingParams
    from agentrl.engine.requests import BatchedRequests
    from agentrl.rollout.loop import run_rollout
    from agentrl.rollout.pool import EnvMaker, RayPool

    with RayPool(EnvMaker("code", {"difficulty": 1}), 4, actors=2) as pool:
        result = run_rollout(pool, "code", [0, 1], 2, BatchedRequests(_ToolCallingEngine(qwen3_tokenizer)),
                             qwen3_tokenizer, SamplingParams(), max_turns=4, context_options={"family": "qwen3"})
    trajs = result.trajectories
    assert len(trajs) == 4
    for traj in trajs:
        assert [t.action and json.loads(t.action)["name"] for t in traj.turns] == ["run_python", "submit"]
        assert "42" in traj.turns[0].observation and "Hidden tests passed: 0/" in traj.turns[1].observation
        assert traj.terminated and not traj.success and traj.task_type


def test_served_code_env_plays_like_the_local_one():
    from agentrl.envs.server import ServeSettings, start_server

    with start_server(ServeSettings("code", port=0)) as server:
        remote = agentrl.make(server.url, difficulty=2)
        try:
            obs, info = remote.reset(seed=7)
            assert info["tools"][0]["function"]["name"] == "run_python"
            first = remote.step(tool_call_text("run_python", code="print(sum(range(10)))"))
            assert "45" in first[0]
            while True:
                obs, reward, terminated, truncated, info = remote.step(remote.expert_action())
                if terminated or truncated:
                    break
            assert reward == 1.0 and info["success"]
        finally:
            remote.close()


def test_play_runs_the_expert_and_a_person_types_fenced_blocks(tmp_path):
    import subprocess

    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "play", "--env", "code", "--expert", "--seed", "3"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "success=True" in out.stdout.splitlines()[-1]
    typed = "```python\nprint('typed' * 2)\n```\nsubmit\n"
    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "play", "--env", "code", "--seed", "3"],
                         input=typed, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "typedtyped" in out.stdout and "Hidden tests passed: 0/" in out.stdout


def test_a_workspace_too_large_to_export_is_a_failed_grade_not_an_env_error():
    from dataclasses import replace

    env = CodeEnv()
    try:
        env.reset(seed=0)
        env.step(env.expert_action())
        env.step(call("run_shell", command="head -c 20000 /dev/zero > blob"))
        # The export's room is twice the workspace limit, and the workspace's own accounting stops a workspace
        # before it gets there; shrink the room to see what a too-large export does.
        env.grade_limits = replace(env.grade_limits, output_bytes=8192)
        _, reward, terminated, _, info = env.step(call("submit"))
        assert terminated and reward == 0.0 and not info["success"]
        assert all("too large to grade" in d for _, _, d in info["test_details"])
    finally:
        env.close()


def test_task_files_over_the_workspace_limit_name_the_setting():
    from pathlib import Path

    from agentrl.envs.code import CodeTaskSet
    from agentrl.envs.code.tasks import CodeTask, IOCase

    task = CodeTask("t/0", "Write f.", "t", files={"big.txt": "x" * 300_000}, entry_point="f",
                    cases=(IOCase((), 1),), solution_files={"solution.py": "def f():\n    return 1\n"})
    env = CodeEnv(source="tasks.jsonl", shared=CodeTaskSet([task], Path("tasks.jsonl")),
                  limits={"workspace_bytes": 100_000})
    try:
        with pytest.raises(ValueError, match="workspace_bytes"):
            env.reset(seed=0)
    finally:
        env.close()


@pytest.mark.slow
def test_cli_trains_and_evaluates_on_the_code_env(tmp_path):
    """`agentrl run --env code` trains a step in real sandboxes, and `agentrl eval --protocol agentrl-code-v1` scores
    its checkpoint (a tiny random model: the numbers are not the point, the path is)."""
    import subprocess

    run = subprocess.run([sys.executable, "-m", "agentrl.cli", "run", "--env", "code", "--model", "tiny-qwen3",
                          "--steps", "1", "--env-arg", "max_turns=2", "--env.max-turns", "2",
                          "--sampling.max-new-tokens", "16", "--output", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows and rows[-1]["step"] == 0 and "reward_mean" in rows[-1]
    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "eval", "--protocol", "agentrl-code-v1", "--model",
                          str(tmp_path / "run" / "checkpoint"), "--episodes", "2", "--engine", "hf",
                          "--output", str(tmp_path / "eval")], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["protocol"]["name"] == "agentrl-code-v1" and len(results["episodes"]) == 2
