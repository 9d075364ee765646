"""MathEnv: the TextEnv contract, single- and multi-turn episodes, file sources, junk actions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gymnasium.utils.env_checker import check_env

from agentrl.envs.core import TextSpace
from agentrl.envs.math import ANSWER_INSTRUCTION, MathEnv, MathProblemSet
from agentrl.envs.registry import make

GSM8K_TEST = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "gsm8k" / "test.jsonl"


def _wrong(env: MathEnv) -> str:
    return f"\\boxed{{{int(env.problem.answer) + 1}}}"


@pytest.fixture
def tiny_file(tmp_path: Path) -> Path:
    records = [
        {"question": "What is 2 + 2?", "answer": "2 + 2 = <<2+2=4>>4\n#### 4"},
        {"problem": "What is half of one?", "solution": r"One half: $\boxed{\frac{1}{2}}$."},
        {"question": "A shop sells 1,000 pens a day. How many in 2 days?", "answer": "#### 2,000"},
    ]
    path = tmp_path / "tiny.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records), encoding="utf-8")
    return path


def test_registered_and_passes_gymnasium_check_env() -> None:
    env = make("math")
    assert isinstance(env, MathEnv)
    check_env(env, skip_render_check=True)


@pytest.mark.parametrize("level", [1, 2, 3, 4, 5])
def test_reset_is_deterministic_and_informative(level: int) -> None:
    env_a, env_b = MathEnv(level=level), MathEnv(level=level)
    obs_a, info_a = env_a.reset(seed=7)
    obs_b, info_b = env_b.reset(seed=7)
    assert obs_a == obs_b and info_a == info_b
    assert obs_a.endswith(ANSWER_INSTRUCTION)
    assert info_a["task_type"] == f"level{level}" and info_a["problem_id"].startswith(f"level{level}-")
    assert len({MathEnv(level=level).reset(seed=s)[0] for s in range(20)}) > 5


@pytest.mark.parametrize("mode", ["single", "multi"])
@pytest.mark.parametrize("level", [1, 2, 3, 4, 5])
def test_expert_solves_every_seed(level: int, mode: str) -> None:
    env = MathEnv(level=level, mode=mode)
    for seed in range(40):
        env.reset(seed=seed)
        action = env.expert_action()
        assert action.rstrip(".").endswith(f"\\boxed{{{env.problem.answer}}}")
        _, reward, terminated, truncated, info = env.step(action)
        assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)


def test_single_mode_wrong_answer_is_final() -> None:
    env = MathEnv(level=2)
    env.reset(seed=1)
    obs, reward, terminated, truncated, info = env.step(_wrong(env))
    assert (reward, terminated, truncated, info["success"]) == (0.0, True, False, False)
    assert obs == "Incorrect." and info["gold_answer"] == env.problem.answer
    with pytest.warns(UserWarning, match="after the episode ended"):
        obs, reward, terminated, truncated, info = env.step(env.expert_action())
    assert "episode is over" in obs and (reward, terminated, info["success"]) == (0.0, True, False)


def test_single_mode_missing_answer_ends_truncated_and_says_why() -> None:
    env = MathEnv(level=1)
    env.reset(seed=3)
    obs, reward, terminated, truncated, info = env.step("I am not sure how to do this.")
    assert (reward, terminated, truncated, info["success"]) == (0.0, False, True, False)
    assert "No final answer found" in obs and "\\boxed" in obs
    assert info["extracted_answer"] is None


def test_multi_mode_feedback_then_success_without_leaking_gold() -> None:
    env = MathEnv(level=3, mode="multi", max_turns=3)
    env.reset(seed=5)
    gold = env.problem.answer
    obs, reward, terminated, truncated, info = env.step(_wrong(env))
    assert obs.startswith("Incorrect. Try again.") and "2 tries left" in obs and gold not in obs
    assert (reward, terminated, truncated) == (0.0, False, False) and "success" not in info
    obs, reward, terminated, truncated, info = env.step("hmm, let me think")
    assert obs.startswith("No final answer found") and "1 try left" in obs
    assert (reward, terminated, truncated) == (0.0, False, False)
    obs, reward, terminated, truncated, info = env.step(f"The answer is {gold}.")
    assert (obs, reward, terminated, truncated, info["success"], info["turn"]) == (
        "Correct.",
        1.0,
        True,
        False,
        True,
        3,
    )


def test_multi_mode_runs_out_of_turns() -> None:
    env = MathEnv(level=1, mode="multi", max_turns=2)
    env.reset(seed=0)
    assert env.step(_wrong(env))[2:4] == (False, False)
    _, reward, terminated, truncated, info = env.step(_wrong(env))
    assert (reward, terminated, truncated, info["success"]) == (0.0, False, True, False)


def test_random_junk_actions_never_raise() -> None:
    env = MathEnv(level=4, mode="multi", max_turns=1000)
    env.reset(seed=0)
    junk = TextSpace(max_length=200, seed=0)
    for _ in range(200):
        obs, reward, terminated, truncated, info = env.step(junk.sample())
        assert isinstance(obs, str) and reward in (0.0, 1.0)
        if terminated or truncated:
            env.reset()


def test_file_source_walks_problems_by_seed(tiny_file: Path) -> None:
    env = MathEnv(source=tiny_file, mode="multi")
    answers = []
    for seed in range(4):
        _, info = env.reset(seed=seed)
        answers.append(env.problem.answer)
        assert info["task_type"] in ("gsm8k", "math")
        assert env.step(env.expert_action())[1] == 1.0
    assert answers == ["4", r"\frac{1}{2}", "2000", "4"]  # index = seed % len
    env.reset(seed=1)
    assert env.step("so each is 0.5")[1] == 1.0
    env.reset(seed=2)
    assert env.step("#### 2,000")[1] == 1.0
    env.reset(seed=None)  # unseeded resets draw from np_random and still work
    assert env.problem.answer in answers


def test_shared_problem_set_is_reused(tiny_file: Path) -> None:
    shared = MathEnv.shared.build(source=str(tiny_file))
    assert isinstance(shared, MathProblemSet)
    first, second = MathEnv(source=tiny_file, shared=shared), MathEnv(source=tiny_file, shared=shared)
    assert first._problem_set is second._problem_set
    assert MathEnv.shared.build(source="procedural") is None


def test_bad_constructor_arguments_are_named(tmp_path: Path) -> None:
    for kwargs, message in [
        ({"level": 0}, "level must be one of"),
        ({"mode": "chat"}, "mode must be one of"),
        ({"max_turns": 0}, "max_turns must be a positive integer"),
        ({"split": "dev"}, "split must be one of"),
    ]:
        with pytest.raises(ValueError, match=message):
            MathEnv(**kwargs)
    with pytest.raises(FileNotFoundError, match="not found"):
        MathEnv(source=tmp_path / "missing.jsonl")
    with pytest.raises(RuntimeError, match="call reset"):
        MathEnv().step("\\boxed{1}")


@pytest.mark.skipif(not GSM8K_TEST.is_file(), reason="GSM8K not found at ../shared/data/gsm8k")
def test_gsm8k_expert_scores_one_everywhere() -> None:
    env = make("math", source=str(GSM8K_TEST))
    for seed in range(0, 1319, 7):
        _, info = env.reset(seed=seed)
        assert info["task_type"] == "gsm8k"
        assert env.step(env.expert_action())[1] == 1.0


# ---- strict mode, reward configuration, pluggable grading, several golds ----------------------------------------
def test_strict_mode_counts_only_boxed_answers() -> None:
    lenient, strict = MathEnv(level=1), MathEnv(level=1, strict=True)
    for env in (lenient, strict):
        env.reset(seed=4)
    gold = lenient.problem.answer
    # Lenient: the last number of a reply that never states an answer still scores (the complaint).
    assert lenient.step(f"I computed it and got {gold}")[1] == 1.0
    obs, reward, terminated, truncated, info = strict.step(f"I computed it and got {gold}")
    assert (reward, terminated, truncated, info["extracted_answer"]) == (0.0, False, True, None)
    assert "No final answer found" in obs
    strict.reset(seed=4)
    assert strict.step(f"so \\boxed{{{gold}}}")[1] == 1.0


def test_reward_configuration_and_format_bonus() -> None:
    kwargs = {"reward_correct": 2.0, "reward_wrong": -1.0, "reward_no_answer": -0.5, "format_bonus": 0.25}
    env = MathEnv(level=2, **kwargs)
    rewards = []
    for action in ("\\boxed{{{gold}}}", "{gold}", "\\boxed{{{wrong}}}", "{wrong}", "no idea"):
        env.reset(seed=9)
        gold = env.problem.answer
        _, reward, _, _, info = env.step(action.format(gold=gold, wrong=int(gold) + 1))
        rewards.append((reward, info["followed_format"]))
    # correct+boxed 2 + 0.25; correct unboxed 2; wrong boxed -1 + 0.25; wrong unboxed -1; no answer -0.5.
    assert rewards == [(2.25, True), (2.0, False), (-0.75, True), (-1.0, False), (-0.5, False)]


def test_pluggable_extractor_and_verifier() -> None:
    env = MathEnv(level=1, extractor=lambda text: text.split("ANSWER=")[-1].strip() if "ANSWER=" in text else None)
    env.reset(seed=2)
    assert env.step(f"ANSWER={env.problem.answer}")[1] == 1.0
    env = MathEnv(level=1, extractor="boxed")  # by name: the strict extractor
    env.reset(seed=2)
    assert env.step(f"The answer is {env.problem.answer}.")[4]["extracted_answer"] is None
    env = MathEnv(level=1, verifier="exact")
    env.reset(seed=2)
    assert env.step(f"\\boxed{{{env.problem.answer}.0}}")[1] == 1.0  # exact still compares numbers as numbers
    # An import path works too, and unknown names say what exists.
    env = MathEnv(level=1, verifier="agentrl.envs.math.equivalence:answers_match")
    env.reset(seed=2)
    assert env.step(f"\\boxed{{{env.problem.answer}}}")[1] == 1.0
    with pytest.raises(ValueError, match=r"unknown verifier 'sympy'.*'default', 'exact'"):
        MathEnv(verifier="sympy")
    with pytest.raises(ValueError, match="cannot import extractor"):
        MathEnv(extractor="no_such_module:f")
    with pytest.raises(ValueError, match="reward correct must be a finite number"):
        MathEnv(reward_correct=float("nan"))


def test_registered_extractor_is_found_by_name() -> None:
    from agentrl.envs.math import EXTRACTORS, register_extractor

    register_extractor("last-word", lambda text: text.split()[-1] if text.split() else None)
    try:
        env = MathEnv(level=1, extractor="last-word")
        env.reset(seed=1)
        assert env.step(f"it is {env.problem.answer}")[1] == 1.0
    finally:
        EXTRACTORS.pop("last-word")


def test_several_acceptable_gold_answers(tmp_path: Path) -> None:
    path = tmp_path / "alt.jsonl"
    path.write_text(json.dumps({"problem": "Half of one?", "answer": ["\\frac{1}{2}", "one half"]}) + "\n")
    env = MathEnv(source=path)
    env.reset(seed=0)
    assert env.problem.golds == ("\\frac{1}{2}", "one half")
    assert env.step("\\boxed{one half}")[1] == 1.0
    env.reset(seed=0)
    assert env.step("\\boxed{0.5}")[1] == 1.0
