"""The context layout a run uses by default: the cheapest one that stays correct for its env and model family.

Cost (measured by ``bench/micro/trainer_tokens_per_episode.py``, a 50-turn ALFWorld-like episode, Qwen3 tokenizer):
while the token prefix holds, the whole episode is one training sample (~4.5k tokens through the trainer) and the
rollout engine prefills only each turn's new tokens; when the template rewrites history every turn (Qwen3 drops earlier
``<think>`` spans before a new *user* message), every turn is its own sample holding the whole context so far
(~94k tokens, 21x) and every turn is prefilled in full. Repeating the goal and recent actions (``recap_actions=5``)
keeps the prefix but costs 3.5x merged and pushes 50-turn episodes past a 4k context. Samples are correct in every
layout (each is what the model saw); only the cost differs.

So an env whose observations are results of the agent's actions says so with a class attribute::

    rollout_defaults: ClassVar[dict[str, Any]] = {"observation_role": "tool"}

and with ``context.observation_role: auto`` (the default) a run sends its observations in that role exactly when the
model family keeps the prefix with it and would not with user messages (Qwen3); otherwise (ChatML / SmolLM2, where
user messages already keep the prefix and a ``tool`` turn would be unfamiliar to the model) they stay user messages.
Envs whose follow-ups are feedback from a person (math's "try again") declare nothing and stay user messages.

Qwen3 with thinking off rewrites history with either role (the official template drops every earlier turn's empty
``<think></think>``), so by default each turn is its own sample (~22x merged at 50 turns). ``context.history:
as_sampled`` keeps earlier turns token for token as sampled and renders only the new messages: one sample per episode
(0.85x merged, the empty spans are shorter than reasoning), at the price of prompts whose history departs from the
official rendering. The default stays the official rendering; the start-up line names the option when it applies.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agentrl.chat.context import ChatContext
from agentrl.config import OBSERVATION_ROLES, ContextConfig

__all__ = ["AUTO", "resolve_observation_role"]

AUTO = "auto"
"""`ContextConfig.observation_role` value: choose per env and model family (`resolve_observation_role`)."""

# A reply with reasoning, as a thinking model writes it: the history rewrite of Qwen3-style templates drops it.
_PROBE_REPLY = "<think>\nr\n</think>\n\na"


def keeps_prefix(tokenizer, role: str, chat_kwargs: dict[str, Any] | None = None, **context_options: Any) -> bool:
    """True when two turns with observations in `role` extend the prompt token for token (no history rewrite)."""
    ctx = ChatContext(tokenizer, "S", chat_kwargs, observation_role=role, **context_options)
    ctx.first_prompt("q1")
    end = ctx.family.end_of_turn[0] if ctx.family is not None else (tokenizer.eos_token or "")
    for turn in range(2):
        reply = tokenizer(_PROBE_REPLY + end, add_special_tokens=False)["input_ids"]
        _, new_segment = ctx.next_prompt(reply, f"o{turn}")
        if new_segment:
            return False
    return True


def resolve_observation_role(requested: str, env_cls: type, tokenizer, chat_kwargs: dict[str, Any] | None = None,
                             **context_options: Any) -> tuple[str, str]:
    """The observation role a run uses, and why (one line for the log).

    Args:
        requested: `ContextConfig.observation_role`: ``user``, ``tool`` (used as given) or ``auto``.
        env_cls: the env class; its ``rollout_defaults["observation_role"]`` is the role its observations may take.
        tokenizer: the model's tokenizer.
        chat_kwargs: the run's chat-template variables.
        context_options: `ChatContext` options (``family``, ``family_hint``).
    """
    if requested != AUTO:
        return requested, "set in the config"
    hinted = dict(getattr(env_cls, "rollout_defaults", {}) or {}).get("observation_role", "user")
    if hinted not in OBSERVATION_ROLES:
        raise ValueError(f"{env_cls.__name__}.rollout_defaults['observation_role'] must be one of "
                         f"{', '.join(OBSERVATION_ROLES)}, got {hinted!r}")
    if hinted == "user":
        return "user", f"{env_cls.__name__} observations are user messages"
    if keeps_prefix(tokenizer, "user", chat_kwargs, **context_options):
        return "user", "user messages keep the token prefix with this template (one sample per episode)"
    if keeps_prefix(tokenizer, hinted, chat_kwargs, **context_options):
        return hinted, (f"user messages would rewrite history every turn; {hinted} messages keep the prefix "
                        "(one sample per episode instead of one per turn)")
    return "user", ("this template rewrites history with either role: one training sample per turn "
                    "(context.history: as_sampled keeps earlier turns as sampled, one sample per episode)")


def resolve_context(context: ContextConfig, env_cls: type, tokenizer,
                    family_hint: str | None) -> tuple[ContextConfig, str]:
    """`context` with ``observation_role: auto`` replaced by the concrete role, and one line saying why.

    The same resolution for RL (in the run plan) and SFT, so demonstrations get RL's sample layout.
    """
    role, why = resolve_observation_role(context.observation_role, env_cls, tokenizer, context.chat_kwargs(),
                                         family=context.chat_family or None, family_hint=family_hint)
    return replace(context, observation_role=role), why
