"""Math environment (`math`): procedural arithmetic and word problems, or GSM8K / MATH JSONL files.

Public names: `MathEnv` (the env), `Problem` and `load_problems` (JSONL loading), `generate_problem` (the seeded
generator), `extract_answer` (final answer from model text) and `answers_match` (time-bounded equivalence).
"""

from .env import ANSWER_INSTRUCTION, MathEnv, MathProblemSet
from .equivalence import answers_match
from .extract import extract_answer
from .generator import generate_problem
from .problems import Problem, load_problems

__all__ = [
    "ANSWER_INSTRUCTION",
    "MathEnv",
    "MathProblemSet",
    "Problem",
    "answers_match",
    "extract_answer",
    "generate_problem",
    "load_problems",
]
