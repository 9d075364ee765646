r"""Assistant replies -> structured messages, one parser per chat-template family.

A reply is parsed once, right after generation, into what the family's template acts on: the answer (``content``),
the reasoning (``reasoning_content``, or ``thinking`` for gpt-oss) and the tool calls (``tool_calls``). The history a
`agentrl.chat.context.ChatContext` renders is this structured message; the engine's token ids stay beside it untouched.

Each parser also decides how much structure its template can take back. Where a template writes the raw text
(SmolLM3, DeepSeek-R1's tool-call turns, DeepSeek-V3.1 after tool outputs) the message keeps the raw text, so the
prefix holds exactly where the official template lets it hold. A reply whose tool-call syntax is malformed stays
plain content: it is re-rendered verbatim and the env receives the text.

Parsers take ``prefill`` (what the generation prompt already opened inside the assistant turn, e.g. ``<think>\n``)
and ``reply`` (the generated text with the end-of-turn marker removed).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ToolCall", "ParsedReply", "PARSERS", "split_reasoning"]


@dataclass(frozen=True)
class ToolCall:
    """One function call a reply makes.

    Attributes:
        name: the function name.
        arguments: the arguments (a dict when the model wrote valid JSON, else the raw text).
        id: the call id the model wrote (Kimi's ``functions.name:0``), or "".
    """

    name: str
    arguments: Any
    id: str = ""

    def action(self) -> str:
        """The text an env that asked for function calls receives: ``{"name": ..., "arguments": ...}``."""
        return json.dumps({"name": self.name, "arguments": self.arguments}, ensure_ascii=False)


@dataclass(frozen=True)
class ParsedReply:
    """A reply, parsed.

    Attributes:
        message: the assistant message the template renders in history (structured where the template acts on it).
        content: the answer text (reasoning and tool-call markup removed).
        reasoning: the reasoning text ("" when none).
        tool_calls: the calls the reply makes.
    """

    message: dict[str, Any]
    content: str
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = field(default_factory=tuple)


def split_reasoning(text: str, open_tag: str = "<think>", close_tag: str = "</think>") -> tuple[str | None, str]:
    """``(reasoning, rest)``: the text before the first `close_tag` (after `open_tag`, when present), and after it.

    Reasoning is None when the text has no `close_tag`.
    """
    if close_tag not in text:
        return None, text
    head, rest = text.split(close_tag, 1)
    if open_tag in head:
        head = head.split(open_tag, 1)[1]
    return head, rest


def _json_object(text: str) -> dict | None:
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _call_message(call: ToolCall, arguments: Any = None, with_id: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "function",
                           "function": {"name": call.name, "arguments": call.arguments if arguments is None
                                        else arguments}}
    if with_id:
        out["id"] = call.id
    return out


# ---- Qwen / SmolLM3: <think> ... </think> and <tool_call>{json}</tool_call> ----------------------------------------

_QWEN_CALL = re.compile(r"<tool_call>\n?(.*?)\n?</tool_call>", re.S)


def _qwen_calls(text: str) -> tuple[str, tuple[ToolCall, ...]] | None:
    """(content before the calls, calls), or None when the text has no well-formed call."""
    if "<tool_call>" not in text:
        return None
    calls = []
    for body in _QWEN_CALL.findall(text):
        obj = _json_object(body)
        if obj is None or not isinstance(obj.get("name"), str) or "arguments" not in obj:
            return None
        calls.append(ToolCall(obj["name"], obj["arguments"]))
    if not calls:
        return None
    content = text.split("<tool_call>", 1)[0]
    return (content[:-1] if content.endswith("\n") else content), tuple(calls)


def parse_qwen3(prefill: str, reply: str) -> ParsedReply:
    """Qwen3 (and 2507): reasoning and tool calls become ``reasoning_content`` and ``tool_calls``."""
    reasoning, rest = split_reasoning(prefill + reply)
    # After '</think>\n\n' the template writes content.lstrip('\n'), then '\n' before the first call if the content
    # is non-empty: a third newline before the call means blank content ('\n'), which re-renders as written; read
    # as '' it would lose that newline and the next prompt would no longer extend this one.
    blank_before_calls = reasoning is not None and rest.startswith("\n\n\n") and rest.lstrip("\n").startswith(
        "<tool_call>")
    if reasoning is not None:
        reasoning, rest = reasoning.strip("\n"), rest.lstrip("\n")
    parsed = _qwen_calls(rest)
    content, calls = parsed if parsed else (rest, ())
    if calls and blank_before_calls and not content:
        content = "\n"
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [_call_message(c) for c in calls]
    return ParsedReply(message, content, reasoning or "", calls)


def parse_qwen25(prefill: str, reply: str) -> ParsedReply:
    """Qwen2.5: tool calls become ``tool_calls`` with dict arguments (the template JSON-encodes them again)."""
    text = prefill + reply
    parsed = _qwen_calls(text)
    content, calls = parsed if parsed else (text, ())
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [_call_message(c) for c in calls]
    return ParsedReply(message, content, "", calls)


def parse_raw_qwen_syntax(prefill: str, reply: str) -> ParsedReply:
    """SmolLM3: the template renders only the raw content, so the message keeps the raw text.

    The reasoning and the tool calls are still read, for the env.
    """
    reasoning, rest = split_reasoning(reply)
    parsed = _qwen_calls(rest)
    content, calls = parsed if parsed else (rest, ())
    return ParsedReply({"role": "assistant", "content": reply}, content.strip(), (reasoning or "").strip(), calls)


def parse_plain(prefill: str, reply: str) -> ParsedReply:
    """ChatML (SmolLM2): no reasoning, no tool calls; the content is the reply."""
    return ParsedReply({"role": "assistant", "content": reply}, reply)


# ---- DeepSeek ------------------------------------------------------------------------------------------------------

_DS_CALLS_BEGIN, _DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_R1_CALL = re.compile(r"<｜tool▁call▁begin｜>(\w+)<｜tool▁sep｜>(.*?)\n```json\n(.*?)\n```<｜tool▁call▁end｜>", re.S)
_V31_CALL = re.compile(r"<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>", re.S)


def _ds_split(text: str) -> tuple[str, str]:
    head, _, section = text.partition(_DS_CALLS_BEGIN)
    return head, section.replace(_DS_CALLS_END, "")


def _r1(prefill: str, reply: str, distill: bool) -> ParsedReply:
    text = prefill + reply  # R1 writes a tool-call turn's content verbatim, its <think> prefill included
    head, section = _ds_split(text)
    found = _R1_CALL.findall(section)
    reasoning, answer = split_reasoning(head)
    calls = tuple(ToolCall(name, _json_object(args) or args) for _, name, args in found)
    if not calls:
        return ParsedReply({"role": "assistant", "content": text}, answer.strip(), (reasoning or "").strip())
    message = {"role": "assistant", "content": None if distill else head,
               "tool_calls": [{"type": kind, "function": {"name": name, "arguments": args}}
                              for kind, name, args in found]}
    return ParsedReply(message, answer.strip(), (reasoning or "").strip(), calls)


def parse_deepseek_r1(prefill: str, reply: str) -> ParsedReply:
    """DeepSeek-R1: the content is the raw text (the template cuts reasoning itself); calls keep their raw JSON."""
    return _r1(prefill, reply, distill=False)


def parse_deepseek_r1_distill(prefill: str, reply: str) -> ParsedReply:
    """R1-Distill: as R1, but its template renders tool calls only for a message whose content is None."""
    return _r1(prefill, reply, distill=True)


def parse_deepseek_v31(prefill: str, reply: str) -> ParsedReply:
    """DeepSeek-V3.1: the content is the raw reply (the template adds the ``</think>`` header itself)."""
    head, section = _ds_split(reply)
    found = _V31_CALL.findall(section)
    reasoning, answer = split_reasoning(prefill + head)
    calls = tuple(ToolCall(name, _json_object(args) or args) for name, args in found)
    message: dict[str, Any] = {"role": "assistant", "content": head if calls else reply}
    if calls:
        message["tool_calls"] = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in found]
    return ParsedReply(message, answer.strip(), (reasoning or "").strip(), calls)


# ---- Kimi-K2 -------------------------------------------------------------------------------------------------------

_KIMI_SECTION = "<|tool_calls_section_begin|>"
_KIMI_CALL = re.compile(r"<\|tool_call_begin\|>(.*?)<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>", re.S)


def _kimi_calls(text: str) -> tuple[str, list[tuple[str, str]]]:
    head, _, section = text.partition(_KIMI_SECTION)
    return head, _KIMI_CALL.findall(section)


def _kimi_name(call_id: str) -> str:
    return call_id.split(".", 1)[-1].rsplit(":", 1)[0]


def parse_kimi_instruct(prefill: str, reply: str) -> ParsedReply:
    """Kimi-K2-Instruct: calls become ``tool_calls`` with dict arguments (its template JSON-encodes them)."""
    head, found = _kimi_calls(reply)
    args = [_json_object(a) for _, a in found]
    if not found or any(a is None for a in args):
        return ParsedReply({"role": "assistant", "content": reply}, reply)
    calls = tuple(ToolCall(_kimi_name(i), a, i) for (i, _), a in zip(found, args))
    message = {"role": "assistant", "content": head, "tool_calls": [_call_message(c, with_id=True) for c in calls]}
    return ParsedReply(message, head, "", calls)


def parse_kimi_thinking(prefill: str, reply: str) -> ParsedReply:
    """Kimi-K2-Thinking: ``<think>`` becomes ``reasoning_content``; calls keep their raw argument text and ids."""
    reasoning, rest = split_reasoning(prefill + reply)
    head, found = _kimi_calls(rest)
    message: dict[str, Any] = {"role": "assistant", "content": head}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    calls = tuple(ToolCall(_kimi_name(i), _json_object(a) or a, i) for i, a in found)
    if calls:
        message["tool_calls"] = [{"type": "function", "id": i, "function": {"name": _kimi_name(i), "arguments": a}}
                                 for i, a in found]
    return ParsedReply(message, head, reasoning or "", calls)


# ---- GLM-4.6 -------------------------------------------------------------------------------------------------------

_GLM_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


def _glm_value(raw: str) -> Any:
    # The template writes strings raw and everything else as JSON: keep a value raw unless JSON gives it back exactly.
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, ValueError):
        return raw
    return value if not isinstance(value, str) and json.dumps(value, ensure_ascii=False) == raw else raw


def parse_glm(prefill: str, reply: str) -> ParsedReply:
    """GLM-4.6: ``<think>`` becomes ``reasoning_content``; ``<arg_key>/<arg_value>`` calls become ``tool_calls``."""
    reasoning, rest = split_reasoning(prefill + reply)
    head = rest.split("<tool_call>", 1)[0]
    calls = []
    for body in _GLM_CALL.findall(rest):
        name = body.split("\n", 1)[0].strip()
        calls.append(ToolCall(name, {k.strip(): _glm_value(v) for k, v in _GLM_ARG.findall(body)}))
    content = head.strip()
    message: dict[str, Any] = {"role": "assistant", "content": content,
                               "reasoning_content": (reasoning or "").strip()}
    if calls:
        message["tool_calls"] = [_call_message(c) for c in calls]
    return ParsedReply(message, content, (reasoning or "").strip(), tuple(calls))


# ---- gpt-oss (harmony) ---------------------------------------------------------------------------------------------

_HARMONY_MESSAGE = re.compile(r"(.*?)<\|message\|>(.*?)(?:<\|end\|>|<\|return\|>|<\|call\|>|$)", re.S)


def parse_harmony(prefill: str, reply: str) -> ParsedReply:
    """gpt-oss: the analysis channel becomes ``thinking``, final becomes ``content``, ``to=functions.x`` a call."""
    analysis, final, calls = [], [], []
    for header, body in _HARMONY_MESSAGE.findall((prefill + reply).replace("<|start|>assistant", "")):
        channel = re.search(r"<\|channel\|>(\w+)", header)
        recipient = re.search(r"to=functions\.([^\s<]+)", header)
        if recipient:
            calls.append(ToolCall(recipient.group(1), _json_object(body) if _json_object(body) is not None
                                  else body))
        elif channel and channel.group(1) == "analysis":
            analysis.append(body)
        elif channel and channel.group(1) == "final":
            final.append(body)
    content, thinking = "".join(final), "".join(analysis)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if thinking:
        message["thinking"] = thinking
    if calls:
        message["tool_calls"] = [_call_message(c) for c in calls]
    return ParsedReply(message, content, thinking, tuple(calls))


# ---- Llama 3.1 -----------------------------------------------------------------------------------------------------


def parse_llama3(prefill: str, reply: str) -> ParsedReply:
    """Llama 3.1: a reply that is one JSON object ``{"name", "parameters"}`` is a tool call."""
    obj = _json_object(reply.strip())
    if obj is not None and isinstance(obj.get("name"), str) and isinstance(obj.get("parameters"), dict):
        call = ToolCall(obj["name"], obj["parameters"])
        return ParsedReply({"role": "assistant", "content": "", "tool_calls": [_call_message(call)]}, "", "", (call,))
    return ParsedReply({"role": "assistant", "content": reply}, reply.strip())


PARSERS: dict[str, Callable[[str, str], ParsedReply]] = {
    "plain": parse_plain, "qwen3": parse_qwen3, "qwen2.5": parse_qwen25, "smollm3": parse_raw_qwen_syntax,
    "deepseek-r1": parse_deepseek_r1, "deepseek-r1-distill": parse_deepseek_r1_distill,
    "deepseek-v3.1": parse_deepseek_v31, "kimi-k2-instruct": parse_kimi_instruct,
    "kimi-k2-thinking": parse_kimi_thinking, "glm": parse_glm, "harmony": parse_harmony, "llama3": parse_llama3,
}
"""Parsers by syntax name (families refer to them by this name)."""
