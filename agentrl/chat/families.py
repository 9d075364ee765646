r"""Chat-template families: the official templates, their reply parsers and their history-rewrite rules.

Each family's template is the official file its models ship (byte for byte, see ``templates/README.md``), rendered the
way Hugging Face's ``apply_chat_template`` renders it. Besides the template a family states what the rollout needs to
build contexts that match inference token for token: how a reply is parsed into a structured message
(`agentrl.chat.parsers`), which text ends a reply, what the generation prompt already opened (``prefills``) and when the
template rewrites history. The rule is stated for a turn ``k -> k+1``: the model saw ``render(history)`` followed by its
reply; the next prompt is ``render(history + [reply, observation])``; the rule says when that does *not* extend the
former. "Reasoning shown" means rendered in a ``<think>`` (or analysis) block.

=======================  ==========================================================================================
family                   history rewrite (k -> k+1), for replies as the model writes them
=======================  ==========================================================================================
``chatml``               none (SmolLM2's ChatML).
``qwen2.5``              none; tool-call arguments are parsed to dicts because the template JSON-encodes them.
``qwen3``                Reasoning is shown only for assistant turns after the last real user query (a user message
``qwen3-2507-thinking``  not wrapped in ``<tool_response>``), and for a non-final turn only when non-empty. The
``qwen3-2507-instruct``  reply was seen with its ``<think>`` block, so a turn rewrites when the observation is a real
                         user query (every turn after that query loses its block) or when the reply's reasoning is
                         empty (its empty ``<think>\n\n</think>\n\n`` is dropped, even before tool responses).
                         Reasoning and answers are trimmed of leading/trailing newlines by the template.
``smollm3``              none, but for a reply that starts with a newline: the template renders the raw reply
                         (``/think`` and ``/no_think`` alike) with leading newlines stripped.
``deepseek-r1``          a reply after a user message rewrites (its ``<think>\n`` prefill is never re-rendered and a
                         plain answer loses its reasoning) unless it is the conversation's first tool-call turn; a
                         plain reply after tool outputs holds (rendered raw, no generation prefix there), a tool
                         call there rewrites (history gives it an ``<｜Assistant｜>`` header the model never saw).
``deepseek-r1-distill``  as R1, but every tool-call turn rewrites (the template drops content beside tool calls).
``deepseek-v3.1``        thinking off: none. Thinking on: a reply after a user message rewrites (history renders
                         ``</think>`` where the model saw ``<think>``); replies after tool outputs hold.
``kimi-k2-instruct``     none.
``kimi-k2-thinking``     Reasoning is shown only after the last assistant turn without tool calls: while the model
                         calls tools the prefix holds; an answer without a tool call rewrites its own reasoning and
                         that of the tool-call turns since the previous answer.
``glm-4.6``              Reasoning is shown only after the last user message: a user observation rewrites every turn
                         since the previous one that reasoned; the reply's stop token (``<|observation|>`` or
                         ``<|user|>``) must match the next message's role.
``gpt-oss``              a final answer always rewrites (``<|return|>`` becomes ``<|end|>`` and its analysis is
                         dropped, with that of earlier tool-call turns); tool calls hold.
``llama-3.1``            none; answers are trimmed by the template.
=======================  ==========================================================================================

`TemplateFamily.rewrites_history` is the rule as code; tests check it against official renderings of k and k+1 turns,
and `agentrl.chat.context.ChatContext` uses it to render only the new messages where it says the prefix holds.

The family table itself (files, markers, parsers, prefills, which rule each family follows, aliases) is data:
``templates/families.yaml``, loaded once at import by `parse_family_table`. The rule, anchor and writer functions stay
here, registered by the keys the table names them with (``_REWRITES``, ``_ANCHORS``, ``_WRITERS``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from importlib.resources import files
from typing import Any

from agentrl.chat.parsers import PARSERS, ParsedReply, ToolCall

__all__ = [
    "TemplateFamily", "FAMILIES", "ALIASES", "get_family", "family_names", "compile_template", "UnknownFamilyError",
    "is_real_user_query", "FamilyTableError", "parse_family_table", "family_entry",
]

Message = Mapping[str, Any]
RewriteRule = Callable[[Sequence[Message], Sequence[Message], Mapping[str, Any]], bool]
"""``(old, new, template_vars) -> bool``: whether appending `new` rewrites what the model saw (see `TemplateFamily`)."""
Anchor = Callable[[Sequence[Message]], list[int]]
"""``old -> indices`` of the messages that, rendered alone, give new messages their rendering after `old`."""
Writer = Callable[["TemplateFamily", Sequence[Message], str, str, Sequence[ToolCall], dict[str, Any]], str]
"""``(family, history, reasoning, content, calls, template_vars) -> text`` the model writes for a reply."""


class UnknownFamilyError(ValueError):
    """A family name that is not registered here."""


@cache
def compile_template(source: str):
    """Compile a chat template the way Hugging Face `apply_chat_template` does (same environment, filters, globals).

    Args:
        source: the Jinja text.

    Returns:
        A `jinja2.Template`.
    """
    import jinja2
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        # SmolLM3 marks assistant text with {% generation %}; rendering text only needs the body.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Jinja's own tojson escapes HTML characters; chat templates expect plain json.dumps.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def fixed_clock(when: datetime) -> Callable[[str], str]:
    """A ``strftime_now`` that always formats `when` (so an episode's prompts do not change at midnight)."""
    return when.strftime


# ---- rule helpers --------------------------------------------------------------------------------------------------


def is_real_user_query(message: Message) -> bool:
    """Qwen3's notion of a user query: a user message that is not a wrapped ``<tool_response>``."""
    if message.get("role") != "user":  # first: histories are scanned for this every turn
        return False
    content = message.get("content")
    return not (isinstance(content, str) and content.startswith("<tool_response>")
                and content.endswith("</tool_response>"))


def _is_assistant(m: Message) -> bool:
    return m.get("role") == "assistant"


def _calls(m: Message) -> bool:
    return bool(m.get("tool_calls"))


def _reasoning(m: Message) -> str:
    return str(m.get("reasoning_content") or "")


def _qwen3_shown(messages: Sequence[Message]) -> list[bool]:
    """Per message: whether Qwen3's template renders its think block (only assistant entries matter)."""
    last_query = next((j for j in range(len(messages) - 1, -1, -1) if is_real_user_query(messages[j])),
                      len(messages) - 1)
    return [i > last_query and (i == len(messages) - 1 or bool(_reasoning(m).strip("\n")))
            for i, m in enumerate(messages)]


def _shown_changes(shown: Callable[[Sequence[Message]], list[bool]], reply_shown: bool,
                   old: Sequence[Message], new: Sequence[Message]) -> bool:
    """True when some assistant turn of `old` or the reply renders its reasoning differently after `new`."""
    after = list(old) + list(new)
    before, now = [*shown(old), reply_shown], shown(after)
    return any(_is_assistant(after[i]) and before[i] != now[i] for i in range(len(old) + 1))


def _first_and_tail(old: Sequence[Message]) -> list[int]:
    # The first message fixes the header (system prompt or the default one); the tail fixes role-grouping.
    return sorted({0, max(len(old) - 2, 0), len(old) - 1})


def _qwen3_anchor(old: Sequence[Message]) -> list[int]:
    query = next((j for j in range(len(old) - 1, -1, -1) if is_real_user_query(old[j])), None)
    return sorted(set(_first_and_tail(old)) | ({query} if query is not None else set()))


def _never(old: Sequence[Message], new: Sequence[Message], template_vars: Mapping[str, Any]) -> bool:
    return False


def _qwen3_rewrites(old, new, template_vars) -> bool:
    reply = new[0]
    seen_block = "reasoning_content" in reply  # it wrote a think block (or the prompt prefilled one)
    if any(is_real_user_query(m) for m in old) and not any(is_real_user_query(m) for m in new[1:]):
        # The last query stays where it was: earlier turns render as before (O(1), the common tool-chain case).
        return seen_block != bool(_reasoning(reply).strip("\n"))
    return _shown_changes(_qwen3_shown, seen_block, old, new)


def _glm_shown(messages: Sequence[Message]) -> list[bool]:
    last_user = max((j for j, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    return [i > last_user and bool(_reasoning(m).strip()) for i, m in enumerate(messages)]


def _glm_rewrites(old, new, template_vars) -> bool:
    reply = new[0]
    stop_mismatch = len(new) > 1 and (new[1].get("role") == "tool") != _calls(reply)
    return stop_mismatch or _shown_changes(_glm_shown, bool(_reasoning(reply).strip()), old, new)


def _kimi_shown(messages: Sequence[Message]) -> list[bool]:
    last_answer = max((j for j, m in enumerate(messages) if _is_assistant(m) and not _calls(m)), default=-1)
    return [i > last_answer and bool(_reasoning(m)) for i, m in enumerate(messages)]


def _kimi_rewrites(old, new, template_vars) -> bool:
    return _shown_changes(_kimi_shown, bool(_reasoning(new[0])), old, new)


def _after_user(old: Sequence[Message]) -> bool:
    return bool(old) and old[-1].get("role") != "tool"


def _r1_rewrites(old, new, template_vars) -> bool:
    reply = new[0]
    if not _after_user(old):
        return _calls(reply)  # a tool-call turn after outputs gets an <｜Assistant｜> header the model never saw
    first_call_turn = not any(_is_assistant(m) and "tool_calls" in m for m in old)
    return not (_calls(reply) and first_call_turn)


def _r1_distill_rewrites(old, new, template_vars) -> bool:
    return _after_user(old) or _calls(new[0])


def _v31_rewrites(old, new, template_vars) -> bool:
    return bool(template_vars.get("thinking")) and _after_user(old)


def _smollm3_rewrites(old, new, template_vars) -> bool:
    return str(new[0].get("content") or "").startswith("\n")


def _harmony_rewrites(old, new, template_vars) -> bool:
    return not _calls(new[0])


# ---- the family type -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TemplateFamily:
    r"""A chat-template family.

    Attributes:
        name: registry name (``qwen3``, ``chatml``, ...).
        template_file: the official Jinja file beside this module.
        description: one line for listings.
        end_of_turn: texts that end a reply (stop tokens); the first is the one a plain answer ends with.
        reasons: whether the family's models write reasoning.
        parser: name of the reply parser in `agentrl.chat.parsers.PARSERS`.
        rewrites_history: ``(old, new, template_vars) -> bool``: True when the prompt after appending `new`
            (the parsed reply and the observation) does not extend what the model saw (the rule, as code).
        template_vars: variables Hugging Face passes from the tokenizer (``bos_token``) and the family's defaults.
        prefills: texts a generation prompt can end with inside the assistant turn (``<think>\n``), longest first.
        tool_role_needs_call: the template renders a tool message only after a tool call (gpt-oss).
        max_tool_calls: calls one reply can make in this template (0: no tool-call syntax).
        stop_after_call: the stop token a reply with tool calls ends with, when it differs from `end_of_turn[0]`.
        content_with_calls: the template renders an answer beside tool calls (gpt-oss, Llama and R1-Distill do not).
        rule: the history-rewrite rule in one line (for reports; `rewrites_history` is the rule as code).
        anchor: ``old -> indices`` of the earlier messages that, rendered alone before new ones, give those new ones
            the rendering they get after the whole history; None re-renders the whole history each turn.
        writer: writes a reply's text where the template never renders a final turn as the model writes it
            (``(family, history, reasoning, content, calls, template_vars) -> str``); None derives it from the
            template (see `write_reply`).
    """

    name: str
    template_file: str
    description: str
    end_of_turn: tuple[str, ...]
    reasons: bool
    parser: str
    rewrites_history: RewriteRule
    template_vars: Mapping[str, Any] = field(default_factory=dict)
    prefills: tuple[str, ...] = ()
    tool_role_needs_call: bool = False
    max_tool_calls: int = 8
    stop_after_call: str = ""
    content_with_calls: bool = True
    rule: str = ""
    anchor: Anchor | None = None
    writer: Writer | None = None

    @property
    def source(self) -> str:
        """The Jinja template text (the official file)."""
        return _read(self.template_file)

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None, **template_vars: Any) -> str:
        """Render `messages` to text, like ``tokenizer.apply_chat_template(..., tokenize=False)``.

        Args:
            messages: ``{"role", "content", ...}`` dicts (assistant messages may carry ``reasoning_content``,
                ``thinking`` and ``tool_calls``).
            add_generation_prompt: end with the header that opens the assistant's reply.
            tools: JSON-schema tool declarations, for templates that declare tools.
            **template_vars: extra template variables (``enable_thinking=False`` for Qwen3, ``thinking=True`` for
                DeepSeek-V3.1).
        """
        if not messages:
            raise ValueError(f"{self.name}: cannot render an empty conversation")
        for i, m in enumerate(messages):
            if not isinstance(m.get("content"), str) and not (_is_assistant(m) and m.get("tool_calls")):
                raise ValueError(f"{self.name}: message {i} ({m.get('role')!r}) needs a string 'content'")
        return compile_template(self.source).render(messages=list(messages), tools=tools,
                                                   add_generation_prompt=add_generation_prompt,
                                                   **{**self.template_vars, **template_vars})

    def thinks(self, template_vars: Mapping[str, Any]) -> bool:
        """Whether replies reason under these template variables (thinking switched off closes the block)."""
        if self.name == "deepseek-v3.1":
            return bool(template_vars.get("thinking"))
        return self.reasons and template_vars.get("enable_thinking", True) is not False

    def parse(self, reply: str, prefill: str = "") -> ParsedReply:
        """Parse a reply (its end-of-turn marker removed) into a structured message, its reasoning and tool calls.

        Args:
            reply: the generated text.
            prefill: what the generation prompt opened inside the assistant turn (see `prefill_of`).
        """
        return PARSERS[self.parser](prefill, reply)

    def prefill_of(self, prompt: str) -> str:
        r"""The part of the assistant turn the generation prompt `prompt` already wrote (``<think>\n``), or ""."""
        return next((p for p in self.prefills if prompt.endswith(p)), "")

    def strip_end(self, text: str) -> str:
        """`text` without its trailing end-of-turn markers."""
        stripped = True
        while stripped:
            stripped = False
            for marker in self.end_of_turn:
                if text.endswith(marker):
                    text, stripped = text[: -len(marker)], True
        return text

    def write_reply(self, history: Sequence[Message], reasoning: str, content: str,
                    calls: Sequence[ToolCall] = (), *, tools: Sequence[Mapping[str, Any]] | None = None,
                    **template_vars: Any) -> str:
        """The text a model of this family writes after the generation prompt for this reply (end marker included).

        Derived from the official template's rendering of the reply as the final turn, except where the template
        never renders a final turn as the model writes it (DeepSeek's ``<think>`` prefill, Kimi-K2-Thinking).

        Args:
            history: the messages before the reply (the prompt's).
            reasoning: the reasoning ("" for none).
            content: the answer.
            calls: tool calls.
            tools: tool declarations.
            **template_vars: template variables.
        """
        if self.writer is not None:
            return self.writer(self, history, reasoning, content, calls, dict(template_vars))
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            message["reasoning_content" if self.name != "gpt-oss" else "thinking"] = reasoning
        if calls:
            message["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                     for c in calls]
        prompt = self.render(history, add_generation_prompt=True, tools=tools, **template_vars)
        full = self.render([*history, message], add_generation_prompt=False, tools=tools, **template_vars)
        if not full.startswith(prompt):
            raise ValueError(f"{self.name}: the template renders a final reply unlike its generation prompt")
        text = full[len(prompt) :]
        ends = [(text.find(m), m) for m in self.end_of_turn if m in text]
        if ends:
            at, marker = min(ends)
            return text[: at + len(marker)]
        return text + (self.stop_after_call if calls and self.stop_after_call else self.end_of_turn[0])


@cache
def _read(filename: str) -> str:
    return files("agentrl.templates").joinpath(filename).read_text()


# ---- writers for templates that never render a final turn as the model writes it ---------------------------------


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)  # as the templates' tojson writes it


def _ds_calls_r1(calls: Sequence[ToolCall]) -> str:
    body = "\n".join(f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{c.name}\n```json\n{_json(c.arguments)}\n```"
                     "<｜tool▁call▁end｜>" for c in calls)
    return f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>" if calls else ""


def _write_r1(family, history, reasoning, content, calls, template_vars) -> str:
    head = f"{reasoning}\n</think>\n\n" if _after_user(history) else ""
    return head + content + _ds_calls_r1(calls) + "<｜end▁of▁sentence｜>"


def _write_v31(family, history, reasoning, content, calls, template_vars) -> str:
    head = f"{reasoning}</think>" if template_vars.get("thinking") and _after_user(history) else ""
    body = "".join(f"<｜tool▁call▁begin｜>{c.name}<｜tool▁sep｜>{_json(c.arguments)}<｜tool▁call▁end｜>"
                   for c in calls)
    section = f"<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>" if calls else ""
    return head + content + section + "<｜end▁of▁sentence｜>"


def _write_kimi_thinking(family, history, reasoning, content, calls, template_vars) -> str:
    body = "".join(f"<|tool_call_begin|>functions.{c.name}:{i}<|tool_call_argument_begin|>{_json(c.arguments)}"
                   "<|tool_call_end|>" for i, c in enumerate(calls))
    section = f"<|tool_calls_section_begin|>{body}<|tool_calls_section_end|>" if calls else ""
    return f"<think>{reasoning}</think>{content}{section}<|im_end|>"


def _qwen_call_text(call: ToolCall) -> str:
    return f"<tool_call>\n{_json({'name': call.name, 'arguments': call.arguments})}\n</tool_call>"


def _write_qwen_answer(family, history, reasoning, content, calls, template_vars) -> str:
    # Qwen3-Instruct-2507 answers without a think block (its template would render an empty one for a final turn).
    body = "\n".join(_qwen_call_text(c) for c in calls)
    return content + ("\n" if content and calls else "") + body + "<|im_end|>"


def _write_harmony(family, history, reasoning, content, calls, template_vars) -> str:
    # Rendering the reply as the final turn would also drop earlier tool-call analysis: write the harmony text.
    parts = [f"<|channel|>analysis<|message|>{reasoning}<|end|>"] if reasoning else []
    if calls:
        c = calls[0]
        parts.append(f" to=functions.{c.name}<|channel|>commentary json<|message|>"
                     f"{_json(c.arguments)}<|call|>")
    else:
        parts.append(f"<|channel|>final<|message|>{content}<|return|>")
    return "<|start|>assistant".join(parts)


def _write_smollm3(family, history, reasoning, content, calls, template_vars) -> str:
    think = f"<think>\n{reasoning}\n</think>\n" if reasoning and template_vars.get("enable_thinking", True) else ""
    body = "".join("\n" + _qwen_call_text(c) for c in calls)
    return think + content + body + "<|im_end|>"


_WRITERS: dict[str, Writer] = {"r1": _write_r1, "v3.1": _write_v31, "kimi_thinking": _write_kimi_thinking,
                                "smollm3": _write_smollm3, "qwen_answer": _write_qwen_answer,
                                "harmony": _write_harmony}
"""Reply writers by the key ``writer:`` names in ``templates/families.yaml``."""

_REWRITES: dict[str, RewriteRule] = {"never": _never, "qwen3": _qwen3_rewrites, "smollm3": _smollm3_rewrites,
                                     "r1": _r1_rewrites, "r1_distill": _r1_distill_rewrites, "v3.1": _v31_rewrites,
                                     "kimi_thinking": _kimi_rewrites, "glm": _glm_rewrites,
                                     "harmony": _harmony_rewrites}
"""History-rewrite rules by the key ``rewrites:`` names in ``templates/families.yaml``."""

_ANCHORS: dict[str, Anchor] = {"first_and_tail": _first_and_tail, "qwen3": _qwen3_anchor}
"""Anchors by the key ``anchor:`` names in ``templates/families.yaml``."""


# ---- the family table (templates/families.yaml) --------------------------------------------------------------------

_TABLE_FILE = "families.yaml"


class FamilyTableError(ValueError):
    """``templates/families.yaml`` (or a table given to `parse_family_table`) is malformed."""


def _string(value: Any) -> str | None:
    return None if isinstance(value, str) else "a string"


def _strings(value: Any) -> str | None:
    ok = isinstance(value, list) and all(isinstance(v, str) and v for v in value)
    return None if ok else "a list of non-empty strings"


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else "true or false"


def _count(value: Any) -> str | None:
    # bool is an int subclass: `max_tool_calls: true` must not read as 1.
    return None if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else "a count (0 or more)"


def _variables(value: Any) -> str | None:
    ok = isinstance(value, dict) and all(isinstance(k, str) for k in value)
    return None if ok else "a mapping of variable names to values"


_KEYED: dict[str, Mapping[str, Any]] = {"parser": PARSERS, "rewrites": _REWRITES, "anchor": _ANCHORS,
                                        "writer": _WRITERS}
"""Fields that name a parser or a rule function, and the registry each name must be in."""

# Table field -> its type check. Optional fields left out take the TemplateFamily defaults (the same as in the README).
_REQUIRED: dict[str, Callable[[Any], str | None]] = {
    "name": _string, "template_file": _string, "description": _string, "end_of_turn": _strings, "reasons": _boolean,
    "parser": _string, "rewrites": _string, "rule": _string,
}
_OPTIONAL: dict[str, Callable[[Any], str | None]] = {
    "template_vars": _variables, "prefills": _strings, "tool_role_needs_call": _boolean, "max_tool_calls": _count,
    "stop_after_call": _string, "content_with_calls": _boolean, "anchor": _string, "writer": _string,
}
_ATTRIBUTE = {"rewrites": "rewrites_history"}  # the one table field whose attribute has another name


def _family_from_entry(entry: Any, index: int) -> TemplateFamily:
    """Build one family from its table entry, or raise `FamilyTableError` naming the family and the field."""
    if not isinstance(entry, dict):
        raise FamilyTableError(f"{_TABLE_FILE}: family #{index + 1} is not a mapping of fields")
    name = entry.get("name")
    who = f"{_TABLE_FILE}: family {name!r}" if isinstance(name, str) else f"{_TABLE_FILE}: family #{index + 1}"
    unknown = sorted(set(entry) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise FamilyTableError(f"{who}: unknown field {unknown[0]!r} (fields: {', '.join([*_REQUIRED, *_OPTIONAL])})")
    missing = [k for k in _REQUIRED if k not in entry]
    if missing:
        raise FamilyTableError(f"{who}: missing field {missing[0]!r}")
    values: dict[str, Any] = {}
    for key, value in entry.items():
        if value is None and key in ("anchor", "writer"):  # an explicit null: the default (none)
            continue
        problem = {**_REQUIRED, **_OPTIONAL}[key](value)
        if problem:
            raise FamilyTableError(f"{who}: field {key!r} must be {problem}, not {value!r}")
        if key in _KEYED:
            registry = _KEYED[key]
            if value not in registry:
                raise FamilyTableError(f"{who}: unknown {key} key {value!r} (known: {', '.join(registry)})")
            value = value if key == "parser" else registry[value]  # a family keeps its parser by name
        elif key in ("end_of_turn", "prefills"):
            value = tuple(value)
        values[_ATTRIBUTE.get(key, key)] = value
    if not values["end_of_turn"]:
        raise FamilyTableError(f"{who}: field 'end_of_turn' must name at least one marker")
    if not files("agentrl.templates").joinpath(values["template_file"]).is_file():
        raise FamilyTableError(f"{who}: template_file {values['template_file']!r} is not in agentrl.templates")
    return TemplateFamily(**values)


def parse_family_table(text: str) -> tuple[dict[str, TemplateFamily], dict[str, str]]:
    """Build the family registry from the text of a family table (the format of ``templates/families.yaml``).

    Args:
        text: the YAML text: ``families`` (a list of entries) and ``aliases`` (alias -> family name).

    Returns:
        ``(families, aliases)``: families by name, in table order, and the aliases.

    Raises:
        FamilyTableError: one message naming the family and the field that is missing, unknown or ill-typed, or the
            rule key that names no function.
    """
    import yaml

    try:
        table = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise FamilyTableError(f"{_TABLE_FILE}: not valid YAML: {e}") from None
    if not isinstance(table, dict) or set(table) != {"families", "aliases"}:
        raise FamilyTableError(f"{_TABLE_FILE}: must be a mapping with exactly 'families' and 'aliases'")
    if not isinstance(table["families"], list) or not isinstance(table["aliases"], dict):
        raise FamilyTableError(f"{_TABLE_FILE}: 'families' must be a list of entries, 'aliases' a mapping")
    families: dict[str, TemplateFamily] = {}
    for index, entry in enumerate(table["families"]):
        family = _family_from_entry(entry, index)
        if family.name in families:
            raise FamilyTableError(f"{_TABLE_FILE}: family {family.name!r} is listed twice")
        families[family.name] = family
    aliases: dict[str, str] = {}
    for alias, target in table["aliases"].items():
        if not isinstance(alias, str) or target not in families or alias in families:
            raise FamilyTableError(f"{_TABLE_FILE}: alias {alias!r} must be a new name for a listed family, "
                                   f"not -> {target!r}")
        aliases[alias] = target
    return families, aliases


def family_entry(family: TemplateFamily) -> dict[str, Any]:
    """The table entry (every field, defaults included) that `parse_family_table` turns into `family`.

    Rule functions are written as their keys, so that dumping these entries and parsing them gives the same families.

    Raises:
        FamilyTableError: when a rule function of `family` has no key (it was not built from a table).
    """
    entry: dict[str, Any] = {}
    for key in [*_REQUIRED, *_OPTIONAL]:
        value = getattr(family, _ATTRIBUTE.get(key, key))
        if key in _KEYED and key != "parser" and value is not None:
            value = next((k for k, f in _KEYED[key].items() if f is value), None)
            if value is None:
                raise FamilyTableError(f"family {family.name!r}: its {key} function has no key in the table")
        elif isinstance(value, tuple):
            value = list(value)
        elif key == "template_vars":
            value = dict(value)
        entry[key] = value
    return entry


# Loaded once, at import: a broken table fails every use of families at once, with the message naming the entry.
_TABLE = parse_family_table(files("agentrl.templates").joinpath(_TABLE_FILE).read_text(encoding="utf-8"))

FAMILIES: dict[str, TemplateFamily] = _TABLE[0]
"""The families of ``templates/families.yaml``, by name, in its order."""

ALIASES: dict[str, str] = _TABLE[1]
"""Other names users write for a family (``templates/families.yaml``'s ``aliases``)."""


def family_names() -> list[str]:
    """Registered family names."""
    return list(FAMILIES)


def get_family(name: str) -> TemplateFamily:
    """Look a family up by name (or alias).

    Raises:
        UnknownFamilyError: naming the registered families.
    """
    try:
        return FAMILIES[ALIASES.get(name, name)]
    except KeyError:
        raise UnknownFamilyError(f"unknown chat-template family {name!r}; known: {', '.join(FAMILIES)}") from None
