r"""Math problems as typed records, and the loader for the common dataset layouts in JSONL, JSON or parquet files.

Layouts, detected per record (field names are matched case-insensitively, so AIME's ``Problem`` / ``Answer`` work):

* GSM8K: ``{"question": ..., "answer": "<worked solution>\n#### 18"}``; the gold answer is what follows ``####``
  (thousands separators removed), the solution is the text before it with the ``<<48/2=24>>`` calculator
  annotations removed. A ``question`` whose ``answer`` is a bare number or LaTeX (no worked solution) is read as
  question / answer too.
* MATH and MATH-500: ``{"problem": ..., "solution": "... \boxed{...} ...", "answer"?: ..., "level"?: ...,
  "type"? or "subject"?: ...}``; the gold answer is ``answer`` when present, else the last ``\boxed{}`` of the
  solution.
* AIME-style: ``{"problem": ..., "answer": 204}`` (numbers are read as their text).
* DAPO-Math-17k (verl's RL layout): ``{"prompt": [{"role": "user", "content": ...}], "reward_model":
  {"ground_truth": ...}, "data_source"?: ..., "extra_info"?: {"index": ...}}``. DAPO wraps each problem in its own
  answer-format instruction ("Solve the following math problem step by step. The last line of your response
  should be of the form Answer: $Answer ..." and "Remember to put your answer on its own line after
  \"Answer:\""); those paragraphs are dropped, because `MathEnv` asks for its own format.

Several acceptable answers: ``answer`` (or ``ground_truth``) may be a list, and an ``answers`` list may sit beside
``answer``; the first is the canonical `Problem.answer`, the rest are `Problem.alternatives`.

An ``id`` / ``unique_id`` field (or DAPO's ``extra_info.index``) is the problem id when present, else
``<file stem>:<line number>``. Every error names ``<file>:<line>`` (``<file>:row <n>`` for parquet, ``<file>:item
<n>`` for a JSON list).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.extras import needs_extra

from .equivalence import as_number
from .extract import last_boxed

__all__ = ["Problem", "load_problems"]

_CALCULATOR_ANNOTATION_RE = re.compile(r"<<[^<>]*>>")
_DAPO_HEAD_RE = re.compile(r"^solve the following math problem", re.IGNORECASE)
_DAPO_TAIL_RE = re.compile(r"^remember to put your answer", re.IGNORECASE)



@dataclass(frozen=True)
class Problem:
    r"""One math problem with its gold answer(s).

    Attributes:
        id: a stable identifier (``level1-3f2a...`` for generated problems, the file's id or ``stem:line``).
        question: the problem statement shown to the agent.
        answer: the canonical gold answer: a bare number (``"18"``) or LaTeX (``"\frac{1}{2}"``), no ``\boxed``.
        solution: a worked solution without the final-answer marker; may be empty.
        source: where it comes from: ``"procedural"``, ``"gsm8k"``, ``"math"`` or ``"dapo"``; the task type of files.
        level: difficulty as the source states it (``"1"``..``"5"`` for generated problems, ``"Level 3"`` in MATH).
        type: the subject or template (``"Algebra"`` in MATH, ``"word/change"`` for generated problems).
        alternatives: further acceptable gold answers (``"0.5"`` beside ``"\frac{1}{2}"``); usually empty.
    """

    id: str
    question: str
    answer: str
    solution: str = ""
    source: str = ""
    level: str = ""
    type: str = ""
    alternatives: tuple[str, ...] = ()

    @property
    def golds(self) -> tuple[str, ...]:
        """Every acceptable answer, the canonical one first."""
        return (self.answer, *self.alternatives)


def load_problems(path: str | os.PathLike[str]) -> list[Problem]:
    """Load every problem of a ``.jsonl``, ``.json`` (a list of records) or ``.parquet`` file; layouts may mix.

    Args:
        path: the file.

    Returns:
        The problems in file order.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a record is not JSON, not an object, or fits no layout (the message starts with
            ``<file>:<line>:``), or the file holds no problems at all.
        agentrl.extras.MissingExtraError: a parquet file without pyarrow installed (the message names the extra
            that installs it; an `ImportError`). Other formats never import pyarrow.
    """
    file = Path(path)
    if not file.is_file():
        what = "is a folder, not a problems file" if file.is_dir() else "not found"
        raise FileNotFoundError(f"math problems file {what}: {file}")
    problems = [_parse_record(record, file, where) for where, record in _records(file)]
    if not problems:
        raise ValueError(f"{file}: no problems found (the file is empty)")
    return problems


def _records(file: Path) -> Iterator[tuple[str, Any]]:
    """(location, record) for each record of the file, with locations as errors should name them."""
    suffix = file.suffix.lower()
    if suffix == ".parquet":
        with needs_extra(f"reading the parquet problems file {file}"):
            import pyarrow.parquet as pq
        row = 0
        for batch in pq.ParquetFile(file).iter_batches(batch_size=1024):
            for record in batch.to_pylist():
                row += 1
                yield f"{file}:row {row}", record
        return
    if suffix == ".json":
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{file}:{e.lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(data, list):
            raise ValueError(f"{file}: a .json problems file must hold a list of records, got {type(data).__name__}")
        for item, record in enumerate(data, start=1):
            yield f"{file}:item {item}", record
        return
    with file.open(encoding="utf-8") as lines:
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{file}:{line_number}: invalid JSON ({e.msg} at column {e.colno})") from None
            yield f"{file}:{line_number}", record


def _parse_record(raw: Any, file: Path, where: str) -> Problem:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    record = {str(k).lower(): v for k, v in raw.items()}
    fallback_id = f"{file.stem}:{where.rsplit(':', 1)[-1].split()[-1]}"
    problem_id = str(record.get("id") or record.get("unique_id") or fallback_id)
    if "reward_model" in record or isinstance(record.get("prompt"), list):
        return _parse_dapo(record, problem_id, where)
    if "question" in record:
        return _parse_gsm8k(record, problem_id, where)
    if "problem" in record:
        return _parse_math(record, problem_id, where)
    raise ValueError(
        f"{where}: unknown format: expected GSM8K fields (question, answer), MATH / AIME fields (problem, answer or "
        f"solution) or DAPO fields (prompt, reward_model.ground_truth), got fields {sorted(raw)}"
    )


def _golds(value: Any, extra: Any, where: str, field: str) -> tuple[str, tuple[str, ...]]:
    """The canonical gold and the alternatives from an answer field (a value or a list) and an ``answers`` list."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if extra is not None:
        values += list(extra) if isinstance(extra, (list, tuple)) else [extra]
    golds = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise ValueError(f"{where}: '{field}' must be a string, a number or a list of them, got {v!r}")
        text = str(v).strip()
        if text and text not in golds:
            golds.append(text)
    if not golds:
        raise ValueError(f"{where}: '{field}' is empty: a problem needs at least one gold answer")
    return golds[0], tuple(golds[1:])


def _parse_gsm8k(record: dict[str, Any], problem_id: str, where: str) -> Problem:
    question, answer = record.get("question"), record.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{where}: GSM8K 'question' must be a non-empty string")
    if isinstance(answer, (int, float, list)) and not isinstance(answer, bool) or (
        isinstance(answer, str) and "####" not in answer and _is_bare_answer(answer)
    ):
        gold, alternatives = _golds(answer, record.get("answers"), where, "answer")
        return Problem(id=problem_id, question=question.strip(), answer=gold, source="gsm8k",
                       alternatives=alternatives)
    if not isinstance(answer, str):
        raise ValueError(f"{where}: GSM8K 'answer' must be a string ending in '#### <number>'")
    solution, marker, final = answer.rpartition("####")
    final = final.strip().replace(",", "")
    if not marker or not final:
        raise ValueError(f"{where}: GSM8K 'answer' has no final '#### <number>' line")
    solution = _CALCULATOR_ANNOTATION_RE.sub("", solution).strip()
    _, alternatives = _golds(final, record.get("answers"), where, "answers")
    return Problem(id=problem_id, question=question.strip(), answer=final, solution=solution, source="gsm8k",
                   alternatives=alternatives)


def _is_bare_answer(text: str) -> bool:
    r"""A final answer with no worked solution: a plain number, or LaTeX ("\frac{1}{2}", "$x^2$")."""
    text = text.strip()
    return as_number(text) is not None or (len(text) <= 100 and "\n" not in text and text.startswith(("$", "\\")))


def _parse_math(record: dict[str, Any], problem_id: str, where: str) -> Problem:
    question = record.get("problem")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{where}: MATH 'problem' must be a non-empty string")
    solution = record.get("solution") or ""
    if not isinstance(solution, str):
        raise ValueError(f"{where}: MATH 'solution' must be a string")
    answer = record.get("answer")
    if answer is None:
        answer = last_boxed(solution)
        if answer is None:
            raise ValueError(f"{where}: MATH record has no 'answer' and its 'solution' has no \\boxed{{}} answer")
    gold, alternatives = _golds(answer, record.get("answers"), where, "answer")
    return Problem(
        id=problem_id,
        question=question.strip(),
        answer=gold,
        solution=solution.strip(),
        source="math",
        level=str(record.get("level", "")),
        type=str(record.get("type") or record.get("subject") or ""),
        alternatives=alternatives,
    )


def _parse_dapo(record: dict[str, Any], problem_id: str, where: str) -> Problem:
    prompt = record.get("prompt")
    if isinstance(prompt, str):
        content = prompt
    elif isinstance(prompt, list):
        users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        content = users[-1] if users else None
    else:
        content = None
    if not isinstance(content, str) or not content.strip():
        raise ValueError(f"{where}: DAPO 'prompt' must be a chat list with a non-empty user message")
    reward_model = record.get("reward_model")
    if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
        raise ValueError(f"{where}: DAPO record needs 'reward_model': {{'ground_truth': ...}}")
    gold, alternatives = _golds(reward_model["ground_truth"], None, where, "reward_model.ground_truth")
    extra = record.get("extra_info") if isinstance(record.get("extra_info"), dict) else {}
    if "id" not in record and extra.get("index") is not None:
        problem_id = str(extra["index"])
    return Problem(id=problem_id, question=_strip_dapo_instruction(content), answer=gold, source="dapo",
                   type=str(record.get("data_source") or ""), alternatives=alternatives)


def _strip_dapo_instruction(content: str) -> str:
    paragraphs = [p for p in re.split(r"\n\s*\n", content.strip()) if p.strip()]
    if len(paragraphs) > 1 and _DAPO_HEAD_RE.match(paragraphs[0].strip()):
        paragraphs = paragraphs[1:]
    if len(paragraphs) > 1 and _DAPO_TAIL_RE.match(paragraphs[-1].strip()):
        paragraphs = paragraphs[:-1]
    return "\n\n".join(p.strip() for p in paragraphs)
