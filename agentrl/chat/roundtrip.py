r"""Token round-trip checks: would re-tokenizing the decoded reply, in its context, give back the engine's ids?

Token-in/token-out training never re-tokenizes, so drift costs nothing in training itself; it matters wherever text
is the interface (an inference server fed strings, a replay from logs, a template check). Each turn we decode the
generated ids, re-tokenize them together with the text that precedes them in the prompt since the last added token
(added tokens such as ``<|im_start|>`` always split the text, so nothing earlier can interact), and compare.

Drift kinds:
    ``split_utf8``: the ids decode to invalid UTF-8 (a multi-byte character cut between tokens, or ended early), so
        the text cannot give the same bytes back.
    ``end_whitespace``: only whitespace/newlines differ, next to the end of the reply or an added token (e.g. the
        model emitted ``"\n"`` twice where the tokenizer writes one ``"\n\n"``).
    ``merge``: the same text, segmented into different tokens (a non-canonical BPE merge).

`check_conversations` drives a `ChatContext` over given conversations (or a run's saved trajectories) and reports, per
turn, whether the prefix held and the drift. `check_family` plays generated multi-turn tool-calling episodes of one
family, each reply written as that family's model writes it, and adds the byte parity of the tokenizer's own template
with the family's official file and how often the family's stated rewrite rule mispredicted a split. Both are the
engine behind ``agentrl check-template`` (generated episodes unless ``--conversations`` is given).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RoundTrip", "check_roundtrip", "DRIFT_KINDS", "TurnReport", "TemplateReport", "check_conversations",
           "load_conversations", "BUILTIN_CONVERSATIONS"]

DRIFT_KINDS = ("merge", "end_whitespace", "split_utf8")


@dataclass(frozen=True)
class RoundTrip:
    """The result of one round-trip check.

    Attributes:
        drift: ``""`` when the ids round-trip exactly, else one of `DRIFT_KINDS`.
        first_mismatch: index into the generated ids of the first differing token (-1 when none).
        retokenized: the ids re-tokenizing gives for the generated part.
    """

    drift: str
    first_mismatch: int = -1
    retokenized: tuple[int, ...] = ()

    @property
    def matches(self) -> bool:
        """True when the generated ids are exactly what re-tokenizing gives."""
        return not self.drift


def _added_ids(tokenizer) -> frozenset[int]:
    cached = getattr(tokenizer, "_agentrl_added_ids", None)
    if cached is None:
        cached = frozenset(getattr(tokenizer, "added_tokens_decoder", {}) or ()) | frozenset(tokenizer.all_special_ids)
        try:
            tokenizer._agentrl_added_ids = cached
        except AttributeError:  # a tokenizer that refuses attributes just recomputes
            pass
    return cached


def check_roundtrip(tokenizer, prompt_ids: Sequence[int], generated_ids: Sequence[int]) -> RoundTrip:
    """Compare `generated_ids` with what re-tokenizing their decoded text in context gives.

    Args:
        tokenizer: the policy's tokenizer.
        prompt_ids: the turn's prompt (only its tail after the last added token is used: O(reply) work).
        generated_ids: the engine's ids for the reply.
    """
    added = _added_ids(tokenizer)
    prompt_ids, generated_ids = list(prompt_ids), list(generated_ids)
    start = next((i + 1 for i in range(len(prompt_ids) - 1, -1, -1) if prompt_ids[i] in added), 0)
    left = prompt_ids[start:]
    engine = left + generated_ids
    text = tokenizer.decode(engine, skip_special_tokens=False)
    again = tokenizer(text, add_special_tokens=False)["input_ids"]
    if again == engine:
        return RoundTrip("")
    first = next((i for i, (a, b) in enumerate(zip(engine, again)) if a != b), min(len(engine), len(again)))
    retokenized = tuple(again[len(left) :]) if again[: len(left)] == left else tuple(again)
    return RoundTrip(_classify(tokenizer, engine, again, first, added), max(first - len(left), 0), retokenized)


def _classify(tokenizer, engine: list[int], again: list[int], first: int, added: frozenset[int]) -> str:
    if "\ufffd" in tokenizer.decode(engine, skip_special_tokens=False):
        return "split_utf8"
    # The differing span: from the first difference to the last one counted from the end.
    tail = 0
    while tail < min(len(engine), len(again)) - first and engine[-1 - tail] == again[-1 - tail]:
        tail += 1
    span = engine[first : len(engine) - tail]
    span_text = tokenizer.decode(span, skip_special_tokens=False)
    at_end = len(engine) - tail == len(engine) or engine[len(engine) - tail] in added
    after_added = first == 0 or engine[first - 1] in added
    if span_text and not span_text.strip() and (at_end or after_added):
        return "end_whitespace"
    return "merge"


# ---- template checks over whole conversations ----------------------------------------------------------------------


@dataclass(frozen=True)
class TurnReport:
    """One assistant turn of a checked conversation.

    Attributes:
        conversation: index of the conversation.
        turn: index of the assistant turn within it.
        new_segment: the prompt after this turn does not extend what the model saw (history rewritten).
        reason: where the rendering departed, for a split.
        drift: the round-trip drift kind of the reply ("" for none).
    """

    conversation: int
    turn: int
    new_segment: bool
    reason: str
    drift: str


@dataclass(frozen=True)
class TemplateReport:
    """What `check_conversations` found.

    Attributes:
        family: the family used (``custom`` for the tokenizer's own template).
        turns: one report per assistant turn.
        incremental_ok: the incremental rendering always equalled the full rendering.
        parity: (renderings equal, renderings compared) between the tokenizer's own template and the family's
            official one, on the checked conversations; None when not compared.
        rule_misses: turns where the family's stated rewrite rule predicted wrongly whether history was rewritten.
        rule: the family's rewrite rule, in words.
    """

    family: str
    turns: tuple[TurnReport, ...] = field(default_factory=tuple)
    incremental_ok: bool = True
    parity: tuple[int, int] | None = None
    rule_misses: int = 0
    rule: str = ""

    @property
    def prefix_breaks(self) -> int:
        """Turns after which the template rewrote history."""
        return sum(t.new_segment for t in self.turns)

    @property
    def prefix_preserving(self) -> bool:
        """No turn split."""
        return self.prefix_breaks == 0

    @property
    def drift_rate(self) -> float:
        """Fraction of replies whose ids do not round-trip."""
        return sum(bool(t.drift) for t in self.turns) / max(len(self.turns), 1)

    def drift_counts(self) -> dict[str, int]:
        """Replies per drift kind."""
        return dict(Counter(t.drift for t in self.turns if t.drift))

    def lines(self) -> list[str]:
        """A human-readable report."""
        out = [f"family: {self.family}"] + ([f"rewrite rule: {self.rule}"] if self.rule else [])
        if self.parity is not None:
            same, total = self.parity
            out.append(f"byte parity, the tokenizer's own template vs the official {self.family} file: "
                       f"{same}/{total} conversations")
        out += [
               f"prefix-preserving: {'yes' if self.prefix_preserving else 'no'} "
               f"({self.prefix_breaks} of {len(self.turns)} turns split)",
               f"incremental rendering equals full rendering: {'yes' if self.incremental_ok else 'NO'}",
               f"round-trip drift rate: {self.drift_rate:.3f} {self.drift_counts() or ''}".rstrip(),
               f"stated rewrite rule mispredicted: {self.rule_misses} turns"]
        for t in self.turns:
            if t.new_segment:
                out.append(f"  conversation {t.conversation} turn {t.turn}: split, {t.reason}")
        return out


# Conversations that exercise the policies: plain chat, reasoning with user and tool observations, tool calls.
BUILTIN_CONVERSATIONS: tuple[dict[str, Any], ...] = (
    {"name": "plain chat", "observation_role": "user", "messages": [
        {"role": "system", "content": "You are a helpful agent."}, {"role": "user", "content": "Go north."},
        {"role": "assistant", "content": "go north"}, {"role": "user", "content": "You are in a hall."},
        {"role": "assistant", "content": "look"}, {"role": "user", "content": "A door, a key."},
        {"role": "assistant", "content": "take key"}]},
    {"name": "reasoning, user observations", "observation_role": "user", "messages": [
        {"role": "user", "content": "What is 12*7? Then add 5."},
        {"role": "assistant", "content": "<think>\n12*7 = 84\n</think>\n\n84"},
        {"role": "user", "content": "Now add 5."},
        {"role": "assistant", "content": "<think>\n84+5 = 89\n</think>\n\n89"}]},
    {"name": "reasoning, tool observations", "observation_role": "tool", "messages": [
        {"role": "user", "content": "Find the capital of France."},
        {"role": "assistant", "content": "<think>\nsearch first\n</think>\n\nsearch[France capital]"},
        {"role": "tool", "content": "Paris is the capital of France."},
        {"role": "assistant", "content": "<think>\nfound it\n</think>\n\nfinish[Paris]"}]},
    {"name": "unicode and trailing newline", "observation_role": "user", "messages": [
        {"role": "user", "content": "Say café."}, {"role": "assistant", "content": "café ☕\n"},
        {"role": "user", "content": "Again."}, {"role": "assistant", "content": "Ünïcödé 你好"}]},
)


def load_conversations(path: str | Path) -> list[dict[str, Any]]:
    """Read conversations from JSON or JSONL.

    Each item is ``{"messages": [...], "tools": [...]?, "observation_role": "user"|"tool"?}``, or a bare message list,
    or a trajectory saved by a run (``trajectories.jsonl``): its turns' real generated ids are then checked.

    Raises:
        ValueError: naming the file and item that is neither.
    """
    p = Path(path)
    if not p.exists():
        raise ValueError(f"conversations file not found: {p}")
    if p.is_dir():
        raise ValueError(f"{p} is a folder; --conversations needs a JSON/JSONL file (e.g. a run's trajectories.jsonl)")
    text = p.read_text()
    try:
        items = json.loads(text) if p.suffix == ".json" else [json.loads(x) for x in text.splitlines() if x.strip()]
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not JSON/JSONL ({e})") from None
    if isinstance(items, dict) or (items and all(isinstance(x, dict) and "role" in x for x in items)):
        items = [items]  # one conversation (an object, or a bare list of messages)
    out = []
    for i, item in enumerate(items):
        if isinstance(item, list):
            item = {"messages": item}
        if not isinstance(item, dict) or not ("messages" in item or "turns" in item):
            raise ValueError(f"{p}: item {i} is neither a conversation ({{'messages': [...]}}) nor a trajectory")
        problem = _conversation_problem(item)
        if problem:
            raise ValueError(f"{p}: item {i}: {problem}")
        out.append(item)
    if not out:
        raise ValueError(f"{p}: no conversations in the file")
    return out


def _conversation_problem(item: dict[str, Any]) -> str:
    """What is wrong with a loaded conversation or trajectory, or "" when it can be checked."""
    if "turns" in item:
        turns = item["turns"]
        if not isinstance(turns, list) or not all(isinstance(t, dict) and "prompt_ids" in t and "generated_ids" in t
                                                  for t in turns):
            return "'turns' must be a list of saved turns (with prompt_ids and generated_ids)"
        return ""
    messages = item["messages"]
    if not isinstance(messages, list):
        return f"'messages' must be a list of {{'role': ..., 'content': ...}} objects, got {type(messages).__name__}"
    for j, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            return f"message {j} must be an object with string 'role' and 'content', got {m!r}"
    if not any(m["role"] == "assistant" for m in messages):
        return "no assistant message: there is no reply to check"
    return ""


def check_conversations(tokenizer, conversations: Sequence[dict[str, Any]], *, family: str | None = None,
                        chat_kwargs: dict[str, Any] | None = None) -> TemplateReport:
    """Replay conversations through a `ChatContext` and report splits, their reasons and round-trip drift.

    Assistant messages become generated ids the way an engine emitting canonical tokens would produce them (the
    reply tokenized on its own, plus the end-of-turn token); saved trajectories use their real generated ids.

    Args:
        tokenizer: the model's tokenizer.
        conversations: see `load_conversations`.
        family: force a family (default: detected from the tokenizer).
        chat_kwargs: template variables (``enable_thinking``).
    """
    from agentrl.chat.context import ChatContext

    reports: list[TurnReport] = []
    incremental_ok = True
    family_name = "custom"
    for c, conv in enumerate(conversations):
        if "turns" in conv:
            reports += _trajectory_reports(tokenizer, c, conv["turns"])
            continue
        steps = _steps(conv)
        ctx = ChatContext(tokenizer, steps[0]["system"], chat_kwargs, family=family, tools=conv.get("tools"),
                          observation_role=conv.get("observation_role", "user"), verify=True)
        family_name = ctx.family_name
        prompt = ctx.first_prompt(steps[0]["observation"])
        end = ctx.family.end_of_turn[0] if ctx.family else (tokenizer.eos_token or "")
        for k, step in enumerate(steps):
            generated = tokenizer(step["reply"], add_special_tokens=False)["input_ids"]
            generated += tokenizer(end, add_special_tokens=False)["input_ids"]
            drift = check_roundtrip(tokenizer, prompt, generated).drift
            new_segment, reason = False, ""
            if step["next_observation"] is not None:
                try:
                    prompt, new_segment = ctx.next_prompt(generated, step["next_observation"])
                except AssertionError:
                    incremental_ok = False
                    break
                reason = ctx.last_step.reason
            reports.append(TurnReport(c, k, new_segment, reason, drift))
    return TemplateReport(family_name, tuple(reports), incremental_ok)


def _trajectory_reports(tokenizer, c: int, turns: list[dict[str, Any]]) -> list[TurnReport]:
    """Reports for a saved trajectory: its real generated ids, and its prompts as the rollout built them."""
    from agentrl.chat.context import explain_rewrite

    out = []
    for k, t in enumerate(turns):
        drift = check_roundtrip(tokenizer, t["prompt_ids"], t["generated_ids"]).drift
        new_segment, reason = False, ""
        if k + 1 < len(turns):
            seen = list(t["prompt_ids"]) + list(t["generated_ids"])
            nxt = list(turns[k + 1]["prompt_ids"])
            new_segment = nxt[: len(seen)] != seen
            if new_segment:
                reason = explain_rewrite(tokenizer.decode(seen), tokenizer.decode(nxt))
        out.append(TurnReport(c, k, new_segment, reason, drift))
    return out


def _steps(conv: dict[str, Any]) -> list[dict[str, Any]]:
    """Split a conversation into assistant steps, each with the observation that follows it."""
    messages = list(conv["messages"])
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
    rest = messages[1:] if system else messages
    if not rest or rest[0]["role"] != "user":
        raise ValueError("a conversation must start with a user message (after an optional system message)")
    steps = []
    for i, m in enumerate(rest[1:], 1):
        if m["role"] != "assistant":
            continue
        following = rest[i + 1]["content"] if i + 1 < len(rest) else None
        steps.append({"system": system, "observation": rest[0]["content"], "reply": m["content"],
                      "next_observation": following})
    return steps


def load_tokenizer(model: str):
    """The tokenizer of a built-in or Hugging Face model, without building the model when that can be avoided."""
    if model in ("tiny-qwen3", "tiny-qwen3-moe"):
        from agentrl.models import load_qwen3_tokenizer

        return load_qwen3_tokenizer()
    path = Path(model).expanduser()
    if (path / "tokenizer_config.json").exists():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path))
    from agentrl.models import load_model

    return load_model(model).tokenizer


def _template_parity(tokenizer, family, conversations: Sequence[list[dict[str, Any]]],
                     tools, chat_kwargs: dict[str, Any]) -> tuple[int, int]:
    """How many of `conversations` the tokenizer's own template renders exactly as the family's official one."""
    from agentrl.chat.families import compile_template

    own = getattr(tokenizer, "chat_template", None)
    if not isinstance(own, str):
        return 0, 0
    special = {k: getattr(tokenizer, k) for k in ("bos_token", "eos_token") if isinstance(getattr(tokenizer, k, None),
                                                                                             str)}
    same = 0
    for messages in conversations:
        theirs = family.render(messages, add_generation_prompt=True, tools=tools, **chat_kwargs)
        try:
            mine = compile_template(own).render(messages=list(messages), tools=tools, add_generation_prompt=True,
                                                **{**family.template_vars, **special, **chat_kwargs})
        except Exception:  # a template that cannot render the conversation differs from one that can
            mine = None
        same += mine == theirs
    return same, len(conversations)


def generated_episode(family, rng: random.Random, turns: int, tools: list[dict] | None,
                      chat_kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """A random multi-turn tool-calling episode as the model of `family` would write it.

    One step per turn, each ``{"reasoning", "content", "calls", "role"}`` (the role of the observation that follows).
    """
    from agentrl.chat.parsers import ToolCall

    words = ["look", "go north", "café", "x=1", "search the docs", "你好", "ok"]
    steps = []
    for _ in range(turns):
        calls = [ToolCall("search", {"q": rng.choice(words), "n": rng.randint(1, 9)})
                 for _ in range(rng.randint(0, min(family.max_tool_calls, 2)) if tools else 0)]
        content = "" if calls and not family.content_with_calls else rng.choice(words)
        reasoning = rng.choice(["", "plan the next step", "recall what we saw"]) if family.thinks(chat_kwargs) else ""
        role = "tool" if calls else rng.choice(["user", "tool"])
        if role == "tool" and family.tool_role_needs_call and not calls:
            role = "user"
        steps.append({"reasoning": reasoning, "content": content, "calls": calls, "role": role})
    return steps


SEARCH_TOOL = {"type": "function", "function": {"name": "search", "description": "Search the web.", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}, "required": ["q"]}}}
"""The tool the generated episodes declare."""


def check_family(tokenizer, family_name: str, *, episodes: int = 6, turns: int = 4, seed: int = 0,
                 chat_kwargs: dict[str, Any] | None = None) -> TemplateReport:
    """Play generated tool-calling episodes of `family_name` through a verifying `ChatContext`.

    Each reply is written as the family's model writes it (`TemplateFamily.write_reply`), tokenized and fed back;
    the report lists where history was rewritten and why, whether the stated rule predicted it, the replies'
    round-trip drift, and the byte parity of the tokenizer's own template with the family's official one.

    Args:
        tokenizer: the model's tokenizer.
        family_name: the family to check.
        episodes: how many episodes (half declare a tool, half do not).
        turns: assistant turns per episode.
        seed: for the generated conversations.
        chat_kwargs: template variables (``enable_thinking``, ``thinking``).
    """
    from agentrl.chat.context import ChatContext
    from agentrl.chat.families import get_family

    family = get_family(family_name)
    rng = random.Random(seed)
    kwargs = dict(chat_kwargs or {})
    reports, finals, misses, ok = [], [], 0, True
    for c in range(episodes):
        tools = [SEARCH_TOOL] if c % 2 == 0 else None
        ctx = ChatContext(tokenizer, "You are a careful agent.", kwargs, family=family.name, tools=tools, verify=True)
        prompt = ctx.first_prompt("Find the population of the capital of France.")
        for k, step in enumerate(generated_episode(family, rng, turns, tools, kwargs)):
            text = family.write_reply(ctx.messages, step["reasoning"], step["content"], step["calls"], tools=tools,
                                      **ctx.chat_kwargs)
            generated = tokenizer(text, add_special_tokens=False)["input_ids"]
            drift = check_roundtrip(tokenizer, prompt, generated).drift
            old = list(ctx.messages)
            try:
                prompt, new_segment = ctx.next_prompt(generated, f"result {k}: 2.1 million", role=step["role"])
            except AssertionError:
                ok = False
                break
            predicted = family.rewrites_history(old, ctx.messages[len(old) :], ctx.chat_kwargs)
            misses += predicted != new_segment
            reports.append(TurnReport(c, k, new_segment, ctx.last_step.reason, drift))
        finals.append((list(ctx.messages), tools, ctx.chat_kwargs))
    same = total = 0
    for messages, tools, kw in finals:
        s, t = _template_parity(tokenizer, family, [messages], tools, kw)
        same, total = same + s, total + t
    return TemplateReport(family.name, tuple(reports), ok, (same, total) if total else None, misses, family.rule)


def template_report(model: str, conversations_path: str | Path | None = None, *, family: str | None = None,
                    enable_thinking: bool | None = None) -> TemplateReport:
    """The report `agentrl check-template` prints.

    Args:
        model: a built-in, a local Hugging Face folder or a hub id.
        conversations_path: JSON/JSONL conversations or a run's trajectories.jsonl; None uses
            `BUILTIN_CONVERSATIONS`.
        family: force a family instead of detecting it.
        enable_thinking: set the template's thinking switch (None keeps its default).
    """
    # The file first: a malformed one is reported at once, before the tokenizer (and transformers) load.
    conversations = None if conversations_path is None else load_conversations(conversations_path)
    tokenizer = load_tokenizer(model)
    chat_kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking, "thinking": enable_thinking}
    if conversations is not None:
        return check_conversations(tokenizer, conversations, family=family, chat_kwargs=chat_kwargs)
    from agentrl.chat.context import detect_family

    name = family or detect_family(tokenizer, chat_kwargs)
    if name is None:  # the tokenizer's own template: replay the built-in conversations through it
        return check_conversations(tokenizer, BUILTIN_CONVERSATIONS, chat_kwargs=chat_kwargs)
    return check_family(tokenizer, name, chat_kwargs=chat_kwargs)
