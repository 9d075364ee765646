"""Per-episode chat context: each turn's prompt ids, built token-in/token-out, exactly as inference would see them.

Turn k's prompt is the model family's official template rendering the history so far (`agentrl.chat.families`). Each
reply is parsed once by the family's parser (`agentrl.chat.parsers`) into a structured message (content, reasoning, tool
calls), and that structured message is what the template renders in later turns; the engine's ids are kept as they
are. Two paths:

* The prefix holds (the common case): the ids the engine generated are kept verbatim and only the new text (the
  end of the assistant turn, the observation, the next generation prompt) is rendered and tokenized. For a known
  family the new text comes from rendering the new messages after a few *anchor* messages, never the whole
  history, so a turn costs time proportional to its new tokens, not to the episode so far.
* The family's policy rewrote history (Qwen3 drops earlier ``<think>`` spans, DeepSeek-R1 drops all reasoning): the
  whole history is re-rendered and re-tokenized and the turn starts a new segment (`Turn.new_segment`); training
  samples split there, so the model is trained on contexts it really saw.

Whether the prefix holds is always decided on text: the new rendering must start with the previous prompt followed by
the decoded reply. Tokenizers without a known family (or an explicit ``chat_template``) take the full path every turn.

Tool calling: an env whose reset ``info`` carries ``"tools"`` (JSON-schema declarations) gets them declared to the
template, its observations sent as ``tool`` messages, and as actions the reply's function calls
(`ChatContext.action_from_reply`: ``{"name": ..., "arguments": ...}`` JSON).

Agent-loop aids: observations after the first may be sent as ``tool`` messages (Qwen3 then keeps reasoning across
turns and the prefix holds), and ``recap_actions=k`` repeats the goal and the last k actions in each observation
(small models lose focus in long episodes); the recap lives in the new message only, so it never breaks the prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from agentrl.chat.families import FAMILIES, TemplateFamily, fixed_clock, get_family
from agentrl.chat.parsers import ParsedReply
from agentrl.config import OBSERVATION_ROLES

__all__ = ["ChatContext", "ContextStep", "strip_thinking", "detect_family", "recap_text"]

HISTORY_MODES = ("template", "as_sampled")
"""How earlier turns appear in later prompts: as the official template renders them, or exactly as sampled."""

# Conversations that tell the families apart: system prompt or not, reasoning in history, a later query.
_PROBES: tuple[tuple[dict[str, str], ...], ...] = (
    ({"role": "system", "content": "S"}, {"role": "user", "content": "q1"},
     {"role": "assistant", "content": "<think>\nr\n</think>\n\na1"}, {"role": "user", "content": "q2"}),
    ({"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}),
)


def strip_thinking(text: str) -> str:
    """The answer part of a thinking model's reply: everything after the last ``</think>``."""
    return text.rsplit("</think>", 1)[-1].strip() if "</think>" in text else text.strip()


def recap_text(goal: str, actions: list[str], k: int) -> str:
    """The reminder appended to an observation: the original goal and the last `k` actions, numbered.

    Args:
        goal: the episode's first observation.
        actions: the actions taken so far, oldest first.
        k: how many of the latest actions to repeat.
    """
    start = max(len(actions) - k, 0)
    lines = [f"{i + 1}. {a}" for i, a in enumerate(actions[start:], start)]
    return f"\n\nReminder. Your goal: {goal}\nYour last {len(lines)} action(s):\n" + "\n".join(lines)


@lru_cache(maxsize=64)
def _detect(template: str, kwargs_key: tuple, special_key: tuple, hint: str | None) -> str | None:
    from agentrl.chat.families import compile_template

    names = ([hint] if hint in FAMILIES else []) + [n for n in FAMILIES if n != hint]
    exact = next((n for n in names if FAMILIES[n].source.strip() == template.strip()), None)
    if exact is not None:  # the tokenizer ships the official file itself
        return exact
    kwargs, special = dict(kwargs_key), dict(special_key)
    # Rendering with thinking off too tells hybrid templates (Qwen3) from their single-mode relatives (2507).
    variants = (kwargs, {**kwargs, "enable_thinking": False})
    for name in names:
        family = FAMILIES[name]
        try:
            if all(compile_template(template).render(messages=list(p), add_generation_prompt=True, tools=None,
                                                     **{**family.template_vars, **special, **v})
                   == family.render(p, **v) for p in _PROBES for v in variants):
                return name
        except Exception:  # a template that cannot render a probe is simply not this family
            continue
    return None


def detect_family(tokenizer, chat_kwargs: dict[str, Any] | None = None, hint: str | None = None) -> str | None:
    """The registered family whose template is, or renders like, the tokenizer's own; None when none does.

    Args:
        tokenizer: a Hugging Face tokenizer (its ``bos_token`` and ``eos_token`` are passed to the template, as
            Hugging Face does).
        chat_kwargs: template variables the run uses (they can change the rendering).
        hint: a family to try first (e.g. `LoadedModel.family`); it is still checked, never trusted.
    """
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return None
    key = tuple(sorted((k, v) for k, v in (chat_kwargs or {}).items() if isinstance(v, (str, int, float, bool))))
    special = tuple((k, getattr(tokenizer, k)) for k in ("bos_token", "eos_token")
                    if isinstance(getattr(tokenizer, k, None), str))
    return _detect(template, key, special, hint)


@dataclass(frozen=True)
class ContextStep:
    """How the last `next_prompt` call built its prompt.

    Attributes:
        new_segment: the prompt does not extend the previous full sequence (history was rewritten).
        path: ``"delta"`` (only new messages rendered), ``"full"`` (whole history re-rendered, prefix held),
            ``"rewrite"`` (whole history re-rendered, new segment) or ``"as_sampled"`` (the template would rewrite
            history; the earlier turns were kept as sampled and only the new messages were appended).
        reason: for a rewrite, where the rendering first departs from what the model saw (empty otherwise).
        new_tokens: ids added after the generated ones (or the whole prompt for a rewrite).
    """

    new_segment: bool
    path: str
    reason: str = ""
    new_tokens: int = 0


def explain_rewrite(seen: str, rendered: str, width: int = 40) -> str:
    """Say where `rendered` first departs from `seen` (the text the model saw plus its reply)."""
    i = next((j for j, (a, b) in enumerate(zip(seen, rendered)) if a != b), min(len(seen), len(rendered)))
    was, now = seen[i : i + width], rendered[i : i + width]
    dropped = " (a <think> span was dropped)" if "<think>" in seen[max(i - 10, 0) : i + width] else ""
    return f"at char {i}: the model saw {was!r}, the template now renders {now!r}{dropped}"


class ChatContext:
    """The growing conversation of one episode and its prompt ids.

    Replies are parsed once by the family's parser (`agentrl.chat.parsers`) into structured messages (content,
    reasoning, tool calls); the history the template renders is that structured one, the engine's ids stay verbatim.

    Args:
        tokenizer: a Hugging Face tokenizer.
        system_prompt: the env's instructions; omitted when empty.
        chat_kwargs: template variables (``{"enable_thinking": False}`` for Qwen3). A ``chat_template`` entry renders
            with that template instead of a family's, re-rendering the whole history each turn.
        family: a registered family name to render with (overrides detection); None detects it from the tokenizer
            (`detect_family`), falling back to the tokenizer's own template re-rendered in full every turn.
        family_hint: a family to try first when detecting (e.g. `LoadedModel.family`).
        tools: tool declarations passed to the template.
        observation_role: ``"user"`` or ``"tool"``: the role of observations after the first.
        recap_actions: when > 0, each observation after the first ends with the goal and the last k actions.
        history: ``"template"`` (the official rendering: where the template rewrites earlier turns, e.g. Qwen3
            dropping a ``<think>`` span, the next prompt is re-rendered and starts a new training segment) or
            ``"as_sampled"`` (earlier turns stay token for token as the model sampled them and only the new
            messages are rendered, so the whole episode stays one sample; a deliberate departure from the official
            rendering of history, see `next_prompt`).
        verify: also render the whole history each turn and raise if the fast path disagreed (for tests and
            `agentrl check-template`; costs O(history) per turn).
    """

    def __init__(self, tokenizer, system_prompt: str = "", chat_kwargs: dict[str, Any] | None = None, *,
                 family: str | None = None, family_hint: str | None = None, tools: list[dict] | None = None,
                 observation_role: str = "user", recap_actions: int = 0, history: str = "template",
                 verify: bool = False):
        if observation_role not in OBSERVATION_ROLES:
            raise ValueError(f"observation_role must be one of {OBSERVATION_ROLES}, got {observation_role!r}")
        if recap_actions < 0:
            raise ValueError(f"recap_actions must be >= 0, got {recap_actions}")
        if history not in HISTORY_MODES:
            raise ValueError(f"history must be one of {HISTORY_MODES}, got {history!r}")
        self.tokenizer = tokenizer
        self.chat_kwargs = dict(chat_kwargs or {})
        # One clock per episode: templates that print today's date (gpt-oss, SmolLM3) keep one prompt all along.
        self.chat_kwargs.setdefault("strftime_now", fixed_clock(datetime.now()))
        self.tools = tools
        self.observation_role = observation_role
        self.recap_actions = recap_actions
        self.history = history
        self.verify = verify
        if family is not None:
            self.family: TemplateFamily | None = get_family(family)
        elif "chat_template" in self.chat_kwargs:
            self.family = None
        else:
            name = detect_family(tokenizer, chat_kwargs, family_hint)
            self.family = FAMILIES[name] if name else None
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
        self.actions: list[str] = []
        self.goal = ""
        self.last_step = ContextStep(new_segment=False, path="first")
        self._pieces: list[str] = []  # the last prompt's text, in pieces (joined only when a full render needs it)
        self._ids: list[int] = []

    @classmethod
    def for_model(cls, loaded, system_prompt: str = "", chat_kwargs: dict[str, Any] | None = None,
                  **options: Any) -> ChatContext:
        """A context for a `agentrl.models.LoadedModel`, trying its `family` first when detecting."""
        return cls(loaded.tokenizer, system_prompt, chat_kwargs, family_hint=loaded.family, **options)

    @property
    def family_name(self) -> str:
        """The family rendering this context, or ``"custom"`` for the tokenizer's own template."""
        return self.family.name if self.family else "custom"

    @property
    def text(self) -> str:
        """The text of the current prompt."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    # ---- rendering ---------------------------------------------------------------------------------------------

    def _render(self, messages: list[dict[str, Any]]) -> str:
        if self.family is not None:
            return self.family.render(messages, add_generation_prompt=True, tools=self.tools, **self.chat_kwargs)
        extra = {"tools": self.tools} if self.tools else {}
        kwargs = {k: v for k, v in self.chat_kwargs.items() if k != "strftime_now"}
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                  **extra, **kwargs)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def parse_reply(self, generated_ids) -> ParsedReply:
        """The family's parse of `generated_ids` as the reply to the current prompt (end-of-turn markers removed)."""
        generated_ids = list(generated_ids)
        if self.family is None:  # the tokenizer's own template: let the tokenizer say what is special
            content = self.tokenizer.decode(generated_ids, skip_special_tokens=True)
            return ParsedReply({"role": "assistant", "content": content}, strip_thinking(content))
        text = self.tokenizer.decode(generated_ids, skip_special_tokens=False)
        eos = getattr(self.tokenizer, "eos_token", None)
        while isinstance(eos, str) and eos and text.endswith(eos) and eos not in self.family.end_of_turn:
            text = text[: -len(eos)]
        prompt_tail = self._pieces[-1] if self._pieces else ""
        return self.family.parse(self.family.strip_end(text), self.family.prefill_of(prompt_tail))

    def action_from_reply(self, generated_ids) -> str:
        """The action the env receives for `generated_ids`.

        A reply that makes a tool call gives its first call as ``{"name": ..., "arguments": ...}`` JSON (what an
        env that asked for function calls, with ``info["tools"]`` at reset, parses); a reply without one gives its
        answer, reasoning and template markup removed.
        """
        return self._action(self.parse_reply(generated_ids))

    @staticmethod
    def _action(parsed: ParsedReply) -> str:
        return parsed.tool_calls[0].action() if parsed.tool_calls else parsed.content.strip()

    # ---- turns -------------------------------------------------------------------------------------------------

    def first_prompt(self, observation: str, info: dict[str, Any] | None = None) -> list[int]:
        """Prompt ids for the first turn.

        Args:
            observation: the env's first observation.
            info: the env's reset info; ``info["tools"]`` (JSON-schema tool declarations) asks for tool calling:
                the tools are declared to the template, later observations are tool messages and actions are the
                reply's function calls (`action_from_reply`).
        """
        if info and info.get("tools"):
            self.tools = list(info["tools"])
            self.observation_role = "tool"
        self.goal = observation
        self.messages.append({"role": "user", "content": observation})
        text = self._render(self.messages)
        self._pieces, self._ids = [text], self._encode(text)
        self.last_step = ContextStep(new_segment=False, path="first", new_tokens=len(self._ids))
        return list(self._ids)

    def next_prompt(self, generated_ids: list[int] | tuple[int, ...], observation: str,
                    role: str | None = None) -> tuple[list[int], bool]:
        """Record the model's reply and the env's observation; return (next prompt ids, starts a new segment).

        Args:
            generated_ids: the engine's ids for the reply, verbatim.
            observation: the env's answer.
            role: the observation's role for this turn (default: the context's `observation_role`).
        """
        role = role or self.observation_role
        if role not in OBSERVATION_ROLES:
            raise ValueError(f"role must be one of {OBSERVATION_ROLES}, got {role!r}")
        if not self.messages:
            raise RuntimeError("call first_prompt before next_prompt")
        generated_ids = list(generated_ids)
        reply_text = self.tokenizer.decode(generated_ids, skip_special_tokens=False)
        parsed = self.parse_reply(generated_ids)
        self.actions.append(self._action(parsed))
        if self.recap_actions:
            observation += recap_text(self.goal, self.actions, self.recap_actions)
        if role == "tool" and self.family is not None and self.family.tool_role_needs_call and not parsed.tool_calls:
            role = "user"  # the template renders a tool message only as the answer to a call
        answer: dict[str, Any] = {"role": role, "content": observation}
        if role == "tool" and parsed.tool_calls and parsed.tool_calls[0].id:
            answer["tool_call_id"] = parsed.tool_calls[0].id  # Kimi names the call a result answers
        new = [parsed.message, answer]

        delta = self._delta_text(new, reply_text)
        if delta is not None:
            added = self._encode(delta)
            ids = self._ids + generated_ids + added
            self._pieces += [reply_text, delta]
            step = ContextStep(new_segment=False, path="delta", new_tokens=len(added))
        else:
            seen = self.text + reply_text
            text = self._render(self.messages + new)
            tail = None if text.startswith(seen) or self.history == "template" else self._tail_after_reply(
                text, reply_text, observation)
            if text.startswith(seen):
                added = self._encode(text[len(seen) :])
                ids = self._ids + generated_ids + added
                step = ContextStep(new_segment=False, path="full", new_tokens=len(added))
            elif tail is not None:
                added = self._encode(tail)
                ids = self._ids + generated_ids + added
                step = ContextStep(new_segment=False, path="as_sampled", reason=explain_rewrite(seen, text),
                                   new_tokens=len(added))
                text = seen + tail
            else:
                ids = self._encode(text)
                step = ContextStep(new_segment=True, path="rewrite", reason=explain_rewrite(seen, text),
                                   new_tokens=len(ids))
            self._pieces = [text]
        if self.verify and step.path == "delta":
            full = self._render(self.messages + new)
            if full != self.text:
                raise AssertionError(f"{self.family_name}: incremental rendering departs from the full rendering, "
                                     f"{explain_rewrite(full, self.text)}")
        self.messages += new
        self._ids = ids
        self.last_step = step
        return list(ids), step.new_segment

    def _tail_after_reply(self, rendered: str, reply_text: str, observation: str) -> str | None:
        """The text the template puts after the reply in `rendered` (the whole history with the new messages).

        The template's rendering of the *earlier* turns differs from what was sampled, but what follows the reply
        (its end-of-turn, the observation's turn, the next generation prompt) does not depend on them: it starts
        after the last end-of-turn marker before the observation. A reply cut at the token budget has no marker of
        its own, so the tail keeps the template's. None when the observation or a marker cannot be found (the
        caller then re-renders: a new segment, as in ``history="template"``).
        """
        markers = tuple(m for m in (*(self.family.end_of_turn if self.family else ()),
                                    getattr(self.tokenizer, "eos_token", None) or "") if m)
        at = rendered.rfind(observation.strip()) if observation.strip() else len(rendered)
        ends = [(rendered.rfind(m, 0, at), m) for m in markers]
        start, marker = max(ends, default=(-1, ""))
        if start < 0:
            return None
        return rendered[start + len(marker) :] if reply_text.endswith(marker) else rendered[start:]

    def _delta_text(self, new: list[dict[str, Any]], reply_text: str) -> str | None:
        """The text after the reply when only `new` needs rendering, or None when the full path must decide."""
        family = self.family
        if family is None or family.anchor is None or family.rewrites_history(self.messages, new, self.chat_kwargs):
            return None
        anchor = [self.messages[i] for i in family.anchor(self.messages)]
        before = self._render(anchor)
        after = self._render(anchor + new)
        seen = before + reply_text
        return after[len(seen) :] if after.startswith(seen) else None

    @staticmethod
    def action_text(tokenizer, generated_ids) -> str:
        """The text an env receives for `generated_ids` without a context: special tokens and thinking removed."""
        return strip_thinking(tokenizer.decode(list(generated_ids), skip_special_tokens=True))
