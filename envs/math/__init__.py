"""Math environment (`math`): procedural arithmetic and word problems, or GSM8K / MATH / AIME / DAPO problem files.

Public names: `MathEnv` (the env), `Problem` and `load_problems` (JSONL / JSON / parquet loading),
`generate_problem` (the seeded generator), `find_answer` / `extract_answer` (final answer from model text),
`answers_match` (time-bounded equivalence), and `Grader` / `RewardConfig` with the extractor and verifier
registries (`register_extractor`, `register_verifier`) for custom grading.
"""

from .env import ANSWER_INSTRUCTION, MathEnv, MathProblemSet
from .equivalence import answers_match, match_any, normalize_answer
from .extract import Extraction, extract_answer, find_answer
from .generator import generate_problem
from .grading import (
    EXTRACTORS,
    VERIFIERS,
    Grade,
    Grader,
    RewardConfig,
    register_extractor,
    register_verifier,
)
from .problems import Problem, load_problems

__all__ = [
    "ANSWER_INSTRUCTION",
    "EXTRACTORS",
    "VERIFIERS",
    "Extraction",
    "Grade",
    "Grader",
    "MathEnv",
    "MathProblemSet",
    "Problem",
    "RewardConfig",
    "answers_match",
    "extract_answer",
    "find_answer",
    "generate_problem",
    "load_problems",
    "match_any",
    "normalize_answer",
    "register_extractor",
    "register_verifier",
]
