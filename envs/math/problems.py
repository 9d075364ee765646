r"""Math problems as typed records, and the JSONL loader for GSM8K- and MATH-format files.

Formats, detected per line:

* GSM8K: ``{"question": ..., "answer": "<worked solution>\n#### 18"}``; the gold answer is what follows ``####``
  (thousands separators removed), the solution is the text before it with the ``<<48/2=24>>`` calculator
  annotations removed.
* MATH: ``{"problem": ..., "solution": "... \boxed{...} ...", "answer"?: ..., "level"?: ..., "type"?: ...}``;
  the gold answer is ``answer`` when present, else the last ``\boxed{}`` of the solution.

An ``id`` / ``unique_id`` field is used as the problem id when present, else ``<file stem>:<line number>``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .extract import last_boxed

__all__ = ["Problem", "load_problems"]

_CALCULATOR_ANNOTATION_RE = re.compile(r"<<[^<>]*>>")


@dataclass(frozen=True)
class Problem:
    r"""One math problem with its gold answer.

    Attributes:
        id: a stable identifier (``level1-3f2a...`` for generated problems, the file's id or ``stem:line``).
        question: the problem statement shown to the agent.
        answer: the canonical gold answer: a bare number (``"18"``) or LaTeX (``"\frac{1}{2}"``), no ``\boxed``.
        solution: a worked solution without the final-answer marker; may be empty.
        source: where it comes from: ``"procedural"``, ``"gsm8k"`` or ``"math"``; used as the task type of files.
        level: difficulty as the source states it (``"1"``..``"5"`` for generated problems, ``"Level 3"`` in MATH).
        type: the subject or template (``"Algebra"`` in MATH, ``"word/change"`` for generated problems).
    """

    id: str
    question: str
    answer: str
    solution: str = ""
    source: str = ""
    level: str = ""
    type: str = ""


def load_problems(path: str | os.PathLike[str]) -> list[Problem]:
    """Load every problem of a GSM8K- or MATH-format JSONL file (formats may mix; blank lines are skipped).

    Args:
        path: the ``.jsonl`` file.

    Returns:
        The problems in file order.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a line is not JSON, not an object, or lacks the fields of both formats
            (the message starts with ``<file>:<line>:``), or the file holds no problems at all.
    """
    file = Path(path)
    if not file.is_file():
        what = "is a folder, not a JSONL file" if file.is_dir() else "not found"
        raise FileNotFoundError(f"math problems file {what}: {file}")
    problems = []
    with file.open(encoding="utf-8") as lines:
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{file}:{line_number}: invalid JSON ({e.msg} at column {e.colno})") from None
            problems.append(_parse_record(record, file, line_number))
    if not problems:
        raise ValueError(f"{file}: no problems found (the file is empty)")
    return problems


def _parse_record(record: Any, file: Path, line_number: int) -> Problem:
    where = f"{file}:{line_number}"
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    problem_id = str(record.get("id") or record.get("unique_id") or f"{file.stem}:{line_number}")
    if "question" in record:
        return _parse_gsm8k(record, problem_id, where)
    if "problem" in record:
        return _parse_math(record, problem_id, where)
    raise ValueError(
        f"{where}: unknown format: expected GSM8K fields (question, answer) or MATH fields "
        f"(problem, answer or solution), got fields {sorted(record)}"
    )


def _parse_gsm8k(record: dict[str, Any], problem_id: str, where: str) -> Problem:
    question, answer = record.get("question"), record.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{where}: GSM8K 'question' must be a non-empty string")
    if not isinstance(answer, str):
        raise ValueError(f"{where}: GSM8K 'answer' must be a string ending in '#### <number>'")
    solution, marker, final = answer.rpartition("####")
    final = final.strip().replace(",", "")
    if not marker or not final:
        raise ValueError(f"{where}: GSM8K 'answer' has no final '#### <number>' line")
    solution = _CALCULATOR_ANNOTATION_RE.sub("", solution).strip()
    return Problem(id=problem_id, question=question.strip(), answer=final, solution=solution, source="gsm8k")


def _parse_math(record: dict[str, Any], problem_id: str, where: str) -> Problem:
    question = record.get("problem")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{where}: MATH 'problem' must be a non-empty string")
    solution = record.get("solution", "")
    if not isinstance(solution, str):
        raise ValueError(f"{where}: MATH 'solution' must be a string")
    answer = record.get("answer")
    if answer is None:
        answer = last_boxed(solution)
        if answer is None:
            raise ValueError(f"{where}: MATH record has no 'answer' and its 'solution' has no \\boxed{{}} answer")
    if not isinstance(answer, (str, int, float)) or not str(answer).strip():
        raise ValueError(f"{where}: MATH 'answer' must be a non-empty string or number")
    return Problem(
        id=problem_id,
        question=question.strip(),
        answer=str(answer).strip(),
        solution=solution.strip(),
        source="math",
        level=str(record.get("level", "")),
        type=str(record.get("type", "")),
    )
