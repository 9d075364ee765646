"""JSONL loading (GSM8K and MATH formats) and the procedural generator."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agentrl.envs.math import Problem, generate_problem, generator, load_problems
from agentrl.envs.math.generator import split_of

GSM8K_DIR = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "gsm8k"


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_load_gsm8k_format(tmp_path: Path) -> None:
    record = {
        "question": "Tom has 3 apples and buys 1,200 more. How many?",
        "answer": "3 + 1200 = <<3+1200=1203>>1203\n#### 1,203",
    }
    problems = load_problems(_write(tmp_path / "g.jsonl", [json.dumps(record)]))
    assert problems == [
        Problem(id="g:1", question=record["question"], answer="1203", solution="3 + 1200 = 1203", source="gsm8k")
    ]


def test_load_math_format_with_and_without_answer(tmp_path: Path) -> None:
    lines = [
        json.dumps(
            {
                "problem": "Compute 1/2 + 0.",
                "solution": r"It is $\boxed{\frac{1}{2}}$.",
                "level": "Level 1",
                "type": "Algebra",
                "unique_id": "test/algebra/1.json",
            }
        ),
        json.dumps({"problem": "What is 2+2?", "solution": r"First \boxed{3}, no: \boxed{4}."}),
        json.dumps({"problem": "Pick one.", "answer": r"\text{(C)}"}),
        "",  # blank lines are skipped
    ]
    first, second, third = load_problems(_write(tmp_path / "m.jsonl", lines))
    assert (first.id, first.answer, first.level, first.type, first.source) == (
        "test/algebra/1.json",
        r"\frac{1}{2}",
        "Level 1",
        "Algebra",
        "math",
    )
    assert (second.id, second.answer) == ("m:2", "4")
    assert third.answer == r"\text{(C)}"


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ('{"question": "x?", "answer": "4"', "invalid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"question": "How many?", "answer": "It is 4."}', "no final '#### <number>'"),
        ('{"question": "", "answer": "#### 4"}', "'question' must be a non-empty string"),
        ('{"problem": "Compute.", "solution": "It is 4."}', "no 'answer'"),
        ('{"prompt": "x", "completion": "y"}', "unknown format"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path: Path, bad_line: str, message: str) -> None:
    good = json.dumps({"question": "1+1?", "answer": "#### 2"})
    path = _write(tmp_path / "bad.jsonl", [good, good, bad_line])
    with pytest.raises(ValueError, match=rf"bad\.jsonl:3: .*{message}"):
        load_problems(path)


def test_empty_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no problems found"):
        load_problems(_write(tmp_path / "empty.jsonl", [""]))
    with pytest.raises(FileNotFoundError, match="not found"):
        load_problems(tmp_path / "nope.jsonl")


@pytest.mark.skipif(not (GSM8K_DIR / "test.jsonl").is_file(), reason="GSM8K not found at ../shared/data/gsm8k")
def test_load_real_gsm8k_test_split() -> None:
    problems = load_problems(GSM8K_DIR / "test.jsonl")
    assert len(problems) == 1319
    assert problems[0].answer == "18" and problems[0].question.startswith("Janet")
    assert all("<<" not in p.solution and "####" not in p.solution for p in problems)
    assert all(p.answer.lstrip("-").replace(".", "", 1).isdigit() for p in problems)


@pytest.mark.parametrize("level", generator.LEVELS)
def test_generated_problems_are_consistent(level: int) -> None:
    rng = np.random.default_rng(level)
    for _ in range(300):
        problem = generate_problem(level, rng)
        assert int(problem.answer) >= 0
        assert problem.id.startswith(f"level{level}-") and problem.level == str(level)
        assert problem.solution.endswith(f"{problem.answer}.") or f"= {problem.answer}" in problem.solution


def test_level_one_is_small_addition_and_subtraction() -> None:
    for seed in range(200):
        question = generate_problem(1, seed).question
        a, op, b = question.removeprefix("What is ").removesuffix("?").split()
        assert op in "+-" and 1 <= int(a) <= 20 and 1 <= int(b) <= 20


def test_generator_is_deterministic_and_splits_are_disjoint() -> None:
    assert generate_problem(4, 123) == generate_problem(4, 123)
    for level in (1, 3):
        train = {generate_problem(level, seed, "train").question for seed in range(300)}
        test = {generate_problem(level, seed, "test").question for seed in range(300)}
        assert train and test and not train & test
        assert {split_of(q) for q in test} == {"test"}


def test_generator_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="level must be one of"):
        generate_problem(6, 0)
    with pytest.raises(ValueError, match="split must be one of"):
        generate_problem(1, 0, split="dev")


def test_generator_docstring_examples() -> None:
    import doctest

    from agentrl.envs.math import problems

    for module in (generator, problems):
        failures, _ = doctest.testmod(module)
        assert failures == 0


DAPO_PROMPT = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
    "Find the sum of all positive integers $n$ such that $n^2 < 10$.\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)


def _dapo(ground_truth: object = "6", index: int = 7) -> dict:
    return {"data_source": "math_dapo", "prompt": [{"role": "user", "content": DAPO_PROMPT}], "ability": "MATH",
            "reward_model": {"ground_truth": ground_truth, "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": index}}


def test_load_dapo_math_layout(tmp_path: Path) -> None:
    (problem,) = load_problems(_write(tmp_path / "dapo.jsonl", [json.dumps(_dapo())]))
    # DAPO's own answer-format paragraphs are dropped: the env asks for \boxed{} itself.
    assert problem.question == "Find the sum of all positive integers $n$ such that $n^2 < 10$."
    assert (problem.answer, problem.id, problem.source, problem.type) == ("6", "7", "dapo", "math_dapo")
    (listed,) = load_problems(_write(tmp_path / "dapo2.jsonl", [json.dumps(_dapo(["6", "six"]))]))
    assert listed.golds == ("6", "six")


def test_load_aime_math500_and_bare_answer_layouts(tmp_path: Path) -> None:
    lines = [
        json.dumps({"ID": "2024-I-1", "Problem": "Find the answer.", "Answer": 204, "Solution": "..."}),
        json.dumps({"problem": "Compute it.", "solution": "So $\\boxed{3}$.", "answer": "3", "subject": "Algebra",
                    "level": 2, "unique_id": "test/algebra/1.json"}),
        json.dumps({"question": "What is 6 times 7?", "answer": "42"}),
        json.dumps({"question": "Half of one?", "answer": "\\frac{1}{2}", "answers": ["0.5"]}),
    ]
    aime, math500, bare, alternatives = load_problems(_write(tmp_path / "mix.jsonl", lines))
    assert (aime.id, aime.question, aime.answer, aime.source) == ("2024-I-1", "Find the answer.", "204", "math")
    assert (math500.type, math500.level, math500.id) == ("Algebra", "2", "test/algebra/1.json")
    assert (bare.answer, bare.source) == ("42", "gsm8k")
    assert alternatives.golds == ("\\frac{1}{2}", "0.5")


def test_load_json_list_and_parquet(tmp_path: Path) -> None:
    records = [{"problem": "1+1?", "answer": "2"}, _dapo("5", index=3)]
    from_json = load_problems(_write(tmp_path / "p.json", [json.dumps(records)]))
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([records[0]]), tmp_path / "a.parquet")
    pq.write_table(pa.Table.from_pylist([records[1]]), tmp_path / "b.parquet")
    from_parquet = load_problems(tmp_path / "a.parquet") + load_problems(tmp_path / "b.parquet")
    assert [p.answer for p in from_json] == [p.answer for p in from_parquet] == ["2", "5"]
    assert from_parquet[1].question == from_json[1].question


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("d.jsonl", json.dumps({"prompt": [{"role": "user", "content": "x"}], "reward_model": {}}) + "\n",
         r"d\.jsonl:1: DAPO record needs 'reward_model'"),
        ("e.jsonl", json.dumps({"problem": "x", "answer": ""}) + "\n", r"e\.jsonl:1: 'answer' is empty"),
        ("b.jsonl", json.dumps({"problem": "x", "answer": True}) + "\n", r"b\.jsonl:1: 'answer' must be a string"),
        ("l.json", json.dumps([{"problem": "x", "answer": "1"}, {"nothing": 1}]), r"l\.json:item 2: unknown format"),
        ("n.json", json.dumps({"problem": "x"}), r"n\.json: a \.json problems file must hold a list"),
    ],
)
def test_loader_errors_name_file_and_record(tmp_path: Path, name: str, content: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        load_problems(path)


def test_parquet_errors_name_the_row(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"problem": "a", "answer": "1"}, {"problem": "", "answer": "2"}]),
                   tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match=r"bad\.parquet:row 2: MATH 'problem' must be a non-empty string"):
        load_problems(tmp_path / "bad.parquet")
