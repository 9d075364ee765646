"""The rollout's part of a run plan: how observations are rendered, how many episodes are in flight, how long they get.

The engines size their KV memory from what this says (`agentrl.engine.plan`): every episode of a step in flight
(twice that with async rollouts, which sample the next step while this one trains), each at its longest context. A
single-turn env's longest context is known from its prompts; a multi-turn one's is the context budget.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import agentrl
from agentrl.chat.context import ChatContext
from agentrl.chat.layout import resolve_context
from agentrl.config import ContextConfig, EnvConfig, SamplingConfig, SchedulerConfig

__all__ = ["RolloutPlan", "plan_rollout", "single_turn_context", "is_single_turn"]


@dataclass(frozen=True)
class RolloutPlan:
    """The rollout a run will do, resolved from its ``env``, ``context``, ``scheduler`` and ``sampling`` sections.

    Attributes:
        observation_role: the role observations after the first are rendered as (``user`` or ``tool``).
        context_why: why that role, when the config said ``auto`` (else empty).
        episodes_in_flight: episodes sampling at once (a step's tasks x group size, twice that with async rollouts).
        context_tokens: the longest context (prompt + reply) an episode reaches.
        budget_tokens: the longest context the config allows (``max_context_tokens + max_new_tokens``).
    """

    observation_role: str
    context_why: str
    episodes_in_flight: int
    context_tokens: int
    budget_tokens: int

    def rows(self) -> list[tuple[str, str]]:
        """The plan's context row, for the start-of-run table."""
        return [("context", f"observations as {self.observation_role} messages"
                            + (f" ({self.context_why})" if self.context_why else ""))]


def is_single_turn(env: Any) -> bool:
    """True when every episode of `env` ends after one step (``max_episode_steps == 1``)."""
    return getattr(env, "max_episode_steps", None) == 1


def single_turn_context(env: EnvConfig, context: ContextConfig, scheduler: SchedulerConfig, sampling: SamplingConfig,
                        policy: Any) -> int:
    """The longest context (prompt + reply) an episode of a single-turn env reaches, for sizing the engines' KV.

    The longest first prompt of the first step's tasks, with a quarter more for tasks not seen, plus one reply, within
    the context budget. Multi-turn runs size for the budget itself (``max_context_tokens + max_new_tokens``): sizing
    single-turn math that way gave vLLM a 5.7 GiB cache that pushed the training step into gradient checkpointing
    (30% slower) for nothing.
    """
    options = context.rollout_kwargs(policy.family)
    budget = context.max_context_tokens + sampling.max_new_tokens
    longest = 0
    with contextlib.closing(agentrl.make(env.id, **env.kwargs)) as made:
        for i in range(scheduler.prompts_per_step):
            obs, info = made.reset(seed=env.seed_offset + i)
            chat = ChatContext(policy.tokenizer, made.system_prompt, options["chat_kwargs"],
                               **options["context_options"])
            longest = max(longest, len(chat.first_prompt(obs, info)))
    return min(budget, longest + longest // 4 + sampling.max_new_tokens)


def plan_rollout(env: EnvConfig, context: ContextConfig, scheduler: SchedulerConfig, sampling: SamplingConfig,
                 policy: Any, *, single_turn: bool) -> tuple[ContextConfig, RolloutPlan]:
    """Resolve the context layout and the rollout's load.

    Returns:
        The context with ``observation_role: auto`` replaced (what config.yaml saves, so `agentrl eval` and
        ``--resume`` rebuild the same prompts), and the plan.
    """
    # The cheapest context layout that stays correct (one training sample per episode wherever the template allows).
    resolved, why = resolve_context(context, agentrl.spec(env.id).load(), policy.tokenizer, policy.family)
    why = why if resolved != context else ""
    budget = resolved.max_context_tokens + sampling.max_new_tokens
    longest = single_turn_context(env, resolved, scheduler, sampling, policy) if single_turn else budget
    in_flight = scheduler.prompts_per_step * scheduler.group_size * (2 if scheduler.async_rollout else 1)
    return resolved, RolloutPlan(observation_role=resolved.observation_role, context_why=why,
                                 episodes_in_flight=in_flight, context_tokens=longest, budget_tokens=budget)
