"""Chat-template families and their history-rewrite policies, all stated in this one module.

Each family is a Jinja template beside this file (installed as package data of `agentrl.templates`) plus what the
rollout needs to know about it to build contexts that match inference token for token:

=============  ===================================================================================================
family         history rewrite (what the template drops from earlier turns, and when)
=============  ===================================================================================================
``chatml``     none: SmolLM2's ChatML; the prefix always holds.
``qwen2.5``    none: ChatML with Qwen's default system prompt and tool calls; the prefix always holds.
``qwen3``      ``<think>`` spans of assistant turns before the last real user query are dropped. A new user
               message therefore rewrites every earlier turn that reasoned; tool responses (``role="tool"``) do
               not. With ``enable_thinking=False`` the generation prompt's empty ``<think></think>`` is never
               re-rendered, so every turn rewrites its own reply.
``deepseek-r1`` all reasoning is dropped from history: every turn whose reply reasoned rewrites it.
``kimi-k2``    reasoning is kept only after the last assistant turn that made no tool call: while the model keeps
               calling tools the prefix holds; a turn that answers without a tool call rewrites its own reasoning
               and that of the tool calls before it.
=============  ===================================================================================================

The policy is code, not only prose: `TemplateFamily.rewrites_history` says whether appending messages changes how the
existing ones render, and `TemplateFamily.anchor` picks the few earlier messages that fix how new ones render. Together
they let `agentrl.context.ChatContext` render only the new messages of a turn (cost proportional to the new tokens)
and fall back to a full re-render exactly when the policy rewrites history. Tests check both against full renderings.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

__all__ = [
    "TemplateFamily", "FAMILIES", "get_family", "family_names", "compile_template", "UnknownFamilyError",
    "qwen3_reasoning", "is_real_user_query",
]

Message = Mapping[str, Any]
HERE = Path(__file__).resolve().parent


class UnknownFamilyError(ValueError):
    """A family name that is not registered here."""


@cache
def compile_template(source: str):
    """Compile a chat template the way Hugging Face `apply_chat_template` does (same environment, same filters).

    Args:
        source: the Jinja text.

    Returns:
        A `jinja2.Template`.
    """
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Jinja's own tojson escapes HTML characters; chat templates expect plain json.dumps.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


@dataclass(frozen=True)
class TemplateFamily:
    """A chat-template family.

    Attributes:
        name: registry name (``qwen3``, ``chatml``, ...).
        template_file: the Jinja file beside this module.
        description: one line for listings.
        end_of_turn: the text that closes an assistant turn (stripped from a reply to get the message content).
        reasons: whether the family's models write ``<think>`` reasoning.
        rewrites_history: ``(old_messages, new_messages) -> bool``: True when appending `new_messages` changes the
            rendering of some message of `old_messages` (the family's history-rewrite policy, as code).
        anchor: ``old_messages -> indices``: earlier messages that, rendered alone before new ones, give those new
            ones exactly the rendering they get after the whole history.
    """

    name: str
    template_file: str
    description: str
    end_of_turn: str
    reasons: bool
    rewrites_history: Callable[[Sequence[Message], Sequence[Message]], bool]
    anchor: Callable[[Sequence[Message]], list[int]]

    @property
    def source(self) -> str:
        """The Jinja template text."""
        return _read(self.template_file)

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None, **template_vars: Any) -> str:
        """Render `messages` to text, like ``tokenizer.apply_chat_template(..., tokenize=False)``.

        Args:
            messages: ``{"role", "content", ...}`` dicts.
            add_generation_prompt: end with the header that opens the assistant's reply.
            tools: JSON-schema tool declarations, for templates that declare tools.
            **template_vars: extra template variables (``enable_thinking=False`` for Qwen3).
        """
        if not messages:
            raise ValueError(f"{self.name}: cannot render an empty conversation")
        for i, m in enumerate(messages):
            if not isinstance(m.get("content"), str):
                raise ValueError(f"{self.name}: message {i} ({m.get('role')!r}) needs a string 'content'")
        return compile_template(self.source).render(messages=list(messages), tools=tools,
                                                   add_generation_prompt=add_generation_prompt, **template_vars)


@cache
def _read(filename: str) -> str:
    return (HERE / filename).read_text()


# ---- policy helpers -------------------------------------------------------------------------------------------------


def is_real_user_query(message: Message) -> bool:
    """Qwen3's notion of a user query: a user message that is not a wrapped ``<tool_response>``."""
    content = message.get("content") or ""
    wrapped = content.startswith("<tool_response>") and content.endswith("</tool_response>")
    return message.get("role") == "user" and not wrapped


def qwen3_reasoning(message: Message) -> str:
    """The reasoning Qwen3's template would render for an assistant message (empty when none)."""
    if message.get("reasoning_content") is not None:
        return str(message["reasoning_content"])
    content = message.get("content") or ""
    if "</think>" not in content:
        return ""
    return content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")


def _last_query(messages: Sequence[Message]) -> int | None:
    return next((i for i in range(len(messages) - 1, -1, -1) if is_real_user_query(messages[i])), None)


def _never(old: Sequence[Message], new: Sequence[Message]) -> bool:
    return False


def _first_and_tail(old: Sequence[Message]) -> list[int]:
    # The first message fixes the header (system prompt or the default one); the tail fixes role-grouping.
    return sorted({0, max(len(old) - 2, 0), len(old) - 1})


def _qwen3_rewrites(old: Sequence[Message], new: Sequence[Message]) -> bool:
    query = _last_query(old)
    if query is None:  # the template then anchors on the last message, which moves: no cheap rule
        return True
    if not any(is_real_user_query(m) for m in new):
        return False
    # A new query moves the cut: assistant turns after the old query lose the reasoning they rendered with.
    return any(m.get("role") == "assistant" and qwen3_reasoning(m) for m in old[query + 1 :])


def _qwen3_anchor(old: Sequence[Message]) -> list[int]:
    query = _last_query(old)
    return sorted(set(_first_and_tail(old)) | ({query} if query is not None else set()))


def _kimi_makes_tool_call(message: Message) -> bool:
    return bool(message.get("tool_calls")) or "<|tool_calls_section_begin|>" in (message.get("content") or "")


def _kimi_reasoning(message: Message) -> str:
    if message.get("reasoning_content") is not None:
        return str(message["reasoning_content"])
    content = message.get("content") or ""
    return content.split("</think>")[0].split("<think>")[-1] if "</think>" in content else ""


def _kimi_rewrites(old: Sequence[Message], new: Sequence[Message]) -> bool:
    answers = [m for m in new if m.get("role") == "assistant" and not _kimi_makes_tool_call(m)]
    if not answers:
        return False
    cut = max((i for i, m in enumerate(old) if m.get("role") == "assistant" and not _kimi_makes_tool_call(m)),
              default=-1)
    return any(m.get("role") == "assistant" and _kimi_reasoning(m) for m in old[cut + 1 :])


FAMILIES: dict[str, TemplateFamily] = {
    f.name: f
    for f in [
        TemplateFamily("chatml", "chatml.jinja", "ChatML as in SmolLM2-Instruct", "<|im_end|>", False,
                       _never, _first_and_tail),
        TemplateFamily("qwen2.5", "qwen2.5.jinja", "Qwen2.5-Instruct (ChatML + tools)", "<|im_end|>", False,
                       _never, _first_and_tail),
        TemplateFamily("qwen3", "qwen3.jinja", "Qwen3, thinking on and off (the official template)", "<|im_end|>",
                       True, _qwen3_rewrites, _qwen3_anchor),
        TemplateFamily("deepseek-r1", "deepseek-r1.jinja", "DeepSeek-R1 (reasoning dropped from history)",
                       "<｜end▁of▁sentence｜>", True, _never, _first_and_tail),
        TemplateFamily("kimi-k2", "kimi-k2.jinja", "Kimi-K2-style tool calling with reasoning", "<|im_end|>", True,
                       _kimi_rewrites, _first_and_tail),
    ]
}


def family_names() -> list[str]:
    """Registered family names."""
    return list(FAMILIES)


def get_family(name: str) -> TemplateFamily:
    """Look a family up by name.

    Raises:
        UnknownFamilyError: naming the registered families.
    """
    try:
        return FAMILIES[name]
    except KeyError:
        raise UnknownFamilyError(f"unknown chat-template family {name!r}; known: {', '.join(FAMILIES)}") from None
