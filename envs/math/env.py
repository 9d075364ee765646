r"""`MathEnv`: answer a math problem, in one try or in several with feedback.

Episode rules (with the default rewards, 1 for a correct answer, else 0; ``info["success"]`` is set on the last
step):

============================  ==========================================  ==========================================
model reply                   ``mode="single"``                           ``mode="multi"``
============================  ==========================================  ==========================================
correct answer                reward 1, ``terminated``                    reward 1, ``terminated``
wrong answer                  reward 0, ``terminated`` (the answer is     "Incorrect. Try again." and the episode
                              final)                                      goes on; the gold answer is never shown
no answer found               reward 0, ``truncated``: the only try is    says no answer was found and how to give
                              spent without an answer (the observation    one; the episode goes on
                              says why)
``max_turns`` replies used    (single mode has one turn)                  ``truncated``
============================  ==========================================  ==========================================

A wrong answer ends a single-turn episode as ``terminated`` because the task failed for good. A reply without an
answer ends it as ``truncated``: the one-reply budget ran out before the model answered.

Rewards and grading are configurable (see `grading`): ``reward_correct`` / ``reward_wrong`` / ``reward_no_answer``
and a ``format_bonus`` for replies with a ``\boxed{}``; ``strict=True`` counts only boxed answers, so a reply that
merely ends in the right number is "no answer"; ``extractor`` and ``verifier`` pick the answer extraction and the
equivalence check by name, import path or callable. A problem may have several acceptable gold answers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import gymnasium as gym

from agentrl.envs.core import ClientSetting, Difficulty, SharedResource, TextEnv

from .generator import LEVELS, SPLITS, generate_problem
from .grading import DEFAULT_GRADE_BUDGET_S, AnswerExtractor, AnswerVerifier, Grader, RewardConfig
from .problems import Problem, load_problems

__all__ = ["MathEnv", "MathProblemSet", "ANSWER_INSTRUCTION"]

ANSWER_INSTRUCTION = "Put your final answer in \\boxed{}."
MODES = ("single", "multi")


class MathProblemSet(SharedResource):
    """The problems of a JSONL file, loaded once per node and shared by every `MathEnv` reading that file."""

    def __init__(self, problems: list[Problem], path: Path):
        if not problems:
            raise ValueError(f"{path}: no problems")
        self.problems = tuple(problems)
        self.path = path
        self._by_level: dict[str, tuple[Problem, ...]] = {}

    def of_level(self, level: str) -> tuple[Problem, ...]:
        """The problems whose stated level is `level` (``"3"`` matches MATH's ``"Level 3"``), in file order.

        Raises:
            ValueError: the file has no problem of that level.
        """
        if level not in self._by_level:
            self._by_level[level] = tuple(p for p in self.problems if re.findall(r"\d+", p.level) == [level])
        if not self._by_level[level]:
            raise ValueError(f"{self.path}: no problem of level {level} (a difficulty curriculum on a problem file "
                             f"needs a level on each problem, as MATH's 'Level 3')")
        return self._by_level[level]

    @classmethod
    def build(cls, **env_kwargs: Any) -> MathProblemSet | None:
        """Load the file named by ``source``; None for procedural problems, which need no shared state."""
        source = env_kwargs.get("source", "procedural")
        if source == "procedural":
            return None
        return cls(load_problems(source), Path(source))


class MathEnv(TextEnv):
    r"""Math word problems and arithmetic, 1/0 reward by default: procedural levels 1-5, or problem files.

    The observation is the problem text followed by "Put your final answer in \boxed{}.". The model's reply is
    searched for a final answer (``\boxed{}``, ``#### N``, "the answer is X", else the last math span or number;
    only ``\boxed{}`` with ``strict=True``; see `find_answer`) and compared with each acceptable gold answer exactly
    for numbers and with math-verify otherwise (see `answers_match`, which is safe off the main thread).

    Problem choice on `reset(seed=...)`:
        * procedural: the problem is drawn from ``self.np_random``, so the same seed gives the same problem, and
          ``split`` picks disjoint train / test question sets.
        * file: with a seed, problem ``seed % len(problems)``, so seeds ``0..N-1`` walk the whole file in order
          (handy for evaluation); with ``seed=None``, a uniform draw from ``self.np_random``.
        * a seed that asks for a level (`difficulty_levels`, from a curriculum): a procedural problem of that level,
          whatever ``level`` says; in a file, problem ``seed % n`` of the n problems of that level.

    ``info`` on reset: ``task_type`` (``"level<n>"``, ``"gsm8k"``, ``"math"`` or ``"dapo"``), ``problem_id``,
    ``level``, ``turn``. ``info`` on step adds ``extracted_answer`` (None when none was found), ``correct``,
    ``followed_format`` (the reply has a non-empty ``\boxed{}``), ``grade_budget_exceeded`` (the reply was counted
    wrong because grading hit its budget or a cost guard; ``grade_refused`` then says why) and, on the last step,
    ``success`` and ``gold_answer``.

    Args:
        source: ``"procedural"`` or the path of a ``.jsonl`` / ``.json`` / ``.parquet`` problems file (GSM8K, MATH,
            MATH-500, AIME-style or DAPO-Math layouts; see `load_problems`).
        level: difficulty of procedural problems, 1 (``7 + 5``) to 5 (multi-step word problems); ignored for files.
        mode: ``"single"`` (one reply, right or wrong) or ``"multi"`` (wrong answers get feedback and another try).
        max_turns: replies allowed per episode in ``"multi"`` mode (single mode always allows one).
        split: ``"train"`` or ``"test"`` for procedural problems; ignored for files (the file is the split).
        verify_timeout_s: the most seconds one symbolic equivalence check may take before counting as wrong.
        strict: count an answer only when the reply has a non-empty ``\boxed{}`` (the requested format).
        reward_correct: reward for a correct answer.
        reward_wrong: reward for a wrong answer.
        reward_no_answer: reward when no answer is found (in strict mode: no ``\boxed{}``).
        format_bonus: added to the reward of every reply with a non-empty ``\boxed{}``, right or wrong.
        extractor: how answers are found: ``"default"``, ``"boxed"``, a registered name, ``"module:function"`` or a
            callable (text -> answer or None).
        verifier: how answers are compared: ``"default"``, ``"exact"``, a registered name, ``"module:function"`` or
            a callable (gold, predicted -> bool).
        shared: a prebuilt `MathProblemSet` for ``source`` (runner pools pass one per node); built if omitted.
        grade_budget_s: the most seconds grading one reply may take, in a worker process that is killed past it
            (`agentrl.budget`); such a reply counts as wrong and the step's ``info`` has ``grade_budget_exceeded``
            True (also when a cheap guard refused the answer, see `costly_answer`, or a symbolic check timed out).
            None grades in this process without a budget: only for trusted text. An operator setting.
    """

    system_prompt: ClassVar[str] = (
        "You solve math problems. Think step by step, then give your final answer as a number or expression "
        "inside \\boxed{}, for example \\boxed{42}."
    )
    shared: ClassVar[type[SharedResource] | None] = MathProblemSet
    difficulty_levels: ClassVar[Difficulty | None] = Difficulty(
        tuple(str(n) for n in LEVELS), "the procedural level, 1 (7 + 5) to 5 (multi-step word problems); a file's "
        "stated level (MATH's 'Level 3')")
    # What a client of a served math env may set per session: data only. `source` (a file the server would read),
    # `extractor` / `verifier` (import paths the server would run) and `verify_timeout_s` (how long one grading may
    # hold a worker) stay with the operator's --env-arg.
    client_settings: ClassVar[Mapping[str, ClientSetting]] = {
        "split": ClientSetting(str, "procedural question set: train or test", choices=SPLITS),
        "level": ClientSetting(int, "procedural difficulty, 1 to 5", choices=LEVELS),
        "mode": ClientSetting(str, "single (one reply) or multi (feedback and another try)", choices=MODES),
        "max_turns": ClientSetting(int, "replies allowed per episode in multi mode", min=1, max=20),
        "strict": ClientSetting(bool, "count only answers inside \\boxed{}"),
        "reward_correct": ClientSetting(float, "reward for a correct answer", min=-10.0, max=10.0),
        "reward_wrong": ClientSetting(float, "reward for a wrong answer", min=-10.0, max=10.0),
        "reward_no_answer": ClientSetting(float, "reward when no answer is found", min=-10.0, max=10.0),
        "format_bonus": ClientSetting(float, "added to every reply with a non-empty \\boxed{}", min=-10.0, max=10.0),
    }

    def __init__(
        self,
        source: str | os.PathLike[str] = "procedural",
        level: int = 1,
        mode: str = "single",
        max_turns: int = 3,
        split: str = "train",
        verify_timeout_s: float = 2.0,
        strict: bool = False,
        reward_correct: float = 1.0,
        reward_wrong: float = 0.0,
        reward_no_answer: float = 0.0,
        format_bonus: float = 0.0,
        extractor: str | AnswerExtractor = "default",
        verifier: str | AnswerVerifier = "default",
        shared: MathProblemSet | None = None,
        grade_budget_s: float | None = DEFAULT_GRADE_BUDGET_S,
    ):
        if level not in LEVELS:
            raise ValueError(f"MathEnv level must be one of {LEVELS}, got {level!r}")
        if mode not in MODES:
            raise ValueError(f"MathEnv mode must be one of {MODES}, got {mode!r}")
        if not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"MathEnv max_turns must be a positive integer, got {max_turns!r}")
        if split not in SPLITS:
            raise ValueError(f"MathEnv split must be one of {SPLITS}, got {split!r}")
        numeric = isinstance(verify_timeout_s, (int, float)) and not isinstance(verify_timeout_s, bool)
        if not numeric or verify_timeout_s <= 0:
            raise ValueError(f"MathEnv verify_timeout_s must be a positive number of seconds, got {verify_timeout_s!r}")
        self.source = source if source == "procedural" else os.fspath(source)
        self.level = level
        self.mode = mode
        self.max_turns = 1 if mode == "single" else max_turns
        self.max_episode_steps = self.max_turns
        self.split = split
        self.verify_timeout_s = verify_timeout_s
        rewards = RewardConfig(correct=reward_correct, wrong=reward_wrong, no_answer=reward_no_answer,
                               format_bonus=format_bonus)
        self.grader = Grader(extractor, verifier, rewards, strict=strict, verify_timeout_s=verify_timeout_s,
                             budget_s=grade_budget_s)
        if self.source == "procedural":
            self._problem_set = None
        else:
            self._problem_set = shared if shared is not None else MathProblemSet.build(source=self.source)
        self._problem: Problem | None = None
        self._turn = 0
        self._done = False
        self._success = False

    @property
    def problem(self) -> Problem:
        """The current problem (after `reset`)."""
        if self._problem is None:
            raise RuntimeError("MathEnv: call reset() before using the env")
        return self._problem

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Pick a problem (deterministically from `seed`) and return it with the answer-format instruction."""
        # gym.Env.reset seeds self.np_random; TextEnv.reset (the abstract contract method) would raise.
        gym.Env.reset(self, seed=seed, options=options)
        level, task = self.difficulty_levels.split(seed)
        if self._problem_set is None:
            self._problem = generate_problem(self.level if level is None else int(level), self.np_random, self.split)
        elif level is not None:
            problems = self._problem_set.of_level(level)
            self._problem = problems[task % len(problems)]
        else:
            problems = self._problem_set.problems
            index = seed % len(problems) if seed is not None else int(self.np_random.integers(len(problems)))
            self._problem = problems[index]
        self._turn = 0
        self._done = False
        self._success = False
        return f"{self._problem.question}\n\n{ANSWER_INSTRUCTION}", self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Check the answer in `action`; see the class docstring for rewards and episode ends."""
        problem = self.problem
        if self._done:
            # Like Gymnasium's own envs: a step after the end is the caller's bug, so warn, but do not crash a
            # rollout worker over it; the episode stays over.
            gym.logger.warn("MathEnv.step() called after the episode ended; call reset() to start a new one")
            info = self._info(extracted_answer=None, correct=False, success=self._success, gold_answer=problem.answer)
            return "The episode is over. Call reset() to start a new one.", 0.0, True, False, info
        if not isinstance(action, str):
            raise TypeError(f"MathEnv actions are str, got {type(action).__name__}")
        self._turn += 1
        grade = self.grader(action, problem.golds)
        answer, correct = grade.answer, grade.correct
        out_of_turns = self._turn >= self.max_turns
        if correct:
            observation, terminated, truncated = "Correct.", True, False
        elif answer is None and not grade.budget_exceeded:  # a reply past the grading budget is wrong, not unanswered
            observation = f"No final answer found. {ANSWER_INSTRUCTION} For example: \\boxed{{42}}."
            terminated, truncated = False, out_of_turns
        elif self.mode == "single":
            observation, terminated, truncated = "Incorrect.", True, False
        else:
            observation = "Incorrect." if out_of_turns else "Incorrect. Try again."
            terminated, truncated = False, out_of_turns
        if not (terminated or truncated) and self.mode == "multi":
            turns_left = self.max_turns - self._turn
            observation += f" ({turns_left} {'try' if turns_left == 1 else 'tries'} left.)"
        info = self._info(extracted_answer=answer, correct=correct, followed_format=grade.followed_format,
                          grade_budget_exceeded=grade.budget_exceeded)
        if grade.refused is not None:
            info["grade_refused"] = grade.refused
        if terminated or truncated:
            self._done, self._success = True, correct
            info.update(success=correct, gold_answer=problem.answer)
        return observation, grade.reward, terminated, truncated, info

    def expert_action(self) -> str:
        r"""A worked solution ending in ``\boxed{<gold answer>}``."""
        problem = self.problem
        solution = problem.solution.strip()
        final = f"The final answer is \\boxed{{{problem.answer}}}."
        return f"{solution}\n{final}" if solution else final

    def _info(self, **extra: Any) -> dict[str, Any]:
        problem = self.problem
        task_type = f"level{problem.level}" if problem.source == "procedural" else problem.source
        return {"task_type": task_type, "problem_id": problem.id, "level": problem.level, "turn": self._turn, **extra}
