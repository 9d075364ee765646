r"""Sessions: every call rendered with the family's official template, recorded as tokens, and turned into samples.

An agent written against the chat API sends its whole conversation on every call. The server renders it with the
model family's official template (`agentrl.chat.families`), exactly as inference would, and then asks whether the
rendered text starts with an earlier call's prompt followed by that call's reply, as the model wrote it. Where it does,
the prompt ids are that call's prompt ids, its sampled ids verbatim, and only the new text tokenized (token-in /
token-out, as `agentrl.chat.context.ChatContext` builds prompts): the model's tokens are never re-tokenized, so the
calls merge into one training sequence. Where it does not, the whole text is tokenized and the call starts a new
sample; the drift is explained per call:

==================  ===============================================================================================
``first``           the session's first call.
``extends``         the prompt extends an earlier call's prompt + reply token for token (merged).
``template``        the agent kept the history, but the template renders earlier turns differently from what the model
                    saw; ``rule`` names the family's rule when it predicts it (Qwen3 dropping earlier ``<think>``).
``agent_edit``      the agent changed the history: dropped, rewrote or reordered a message, or handed back a reply
                    other than the one sampled.
``new_context``     the call shares no history with the session's earlier calls (a sub-agent, a fresh conversation).
==================  ===============================================================================================

Replies handed back: the official client returns the assistant message as the agent got it (``content``,
``tool_calls``; the ``reasoning_content`` this server adds only where the agent keeps it). An assistant message whose
content and calls equal a recorded reply of the session is rendered from the reply as the model wrote it (its
reasoning and its call arguments as parsed), so an agent that appends ``response.choices[0].message`` keeps the
prefix wherever the official template does. Counted per session as ``restored``.

Matching a call costs time linear in that call, not in the session's history: every record's prompt + reply is kept
hashed by length, and the new prompt is hashed once, prefix by prefix, and looked up (`Recorder.prepare_chat`).
Memory is capped (sessions, calls per session, bytes of records), the least recently used sessions evicted to disk
(`Recorder`).

A session becomes a `Trajectory` whose turns are its calls, ordered so that each call follows the one it extends
(`SessionLog.trajectory`), and `agentrl.chat.samples.trajectory_to_samples` makes the samples: merged while each prompt
extends the previous turn's full sequence, split where not, loss mask 1 exactly on the sampled ids.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import secrets
import sys
import threading
from array import array
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from agentrl.chat.context import detect_family, explain_rewrite, strip_thinking
from agentrl.chat.families import FAMILIES, TemplateFamily, fixed_clock, get_family
from agentrl.chat.parsers import ParsedReply
from agentrl.chat.roundtrip import check_roundtrip
from agentrl.chat.samples import trajectory_to_samples
from agentrl.records import Sample, Trajectory, Turn

__all__ = ["Renderer", "CallRecord", "SessionLog", "SessionReport", "Recorder", "Prepared", "DRIFT_KINDS",
           "SessionFull", "PromptTooLong"]

_logger = logging.getLogger(__name__)

DRIFT_KINDS = ("first", "extends", "template", "agent_edit", "new_context")
"""`CallRecord.drift` values (see the module docstring)."""


class Renderer:
    """A model family's official template, its parser and the tokenizer: messages -> text -> ids, ids -> reply.

    Args:
        tokenizer: the policy's tokenizer.
        family: a registered family name; None detects it (`agentrl.chat.context.detect_family`), falling back to
            the tokenizer's own template.
        family_hint: a family to try first when detecting (`LoadedModel.family`).
        chat_kwargs: template variables (``{"enable_thinking": False}``).
    """

    def __init__(self, tokenizer, family: str | None = None, *, family_hint: str | None = None,
                 chat_kwargs: Mapping[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.chat_kwargs = dict(chat_kwargs or {})
        # One clock for the server's life: templates that print today's date keep one prompt for a session.
        self.chat_kwargs.setdefault("strftime_now", fixed_clock(datetime.now()))
        name = family or detect_family(tokenizer, chat_kwargs, family_hint)
        self.family: TemplateFamily | None = get_family(name) if family else (FAMILIES[name] if name else None)

    @property
    def family_name(self) -> str:
        """The family rendering, or ``custom`` for the tokenizer's own template."""
        return self.family.name if self.family else "custom"

    def render(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None) -> str:
        """The prompt text, ending with the generation prompt."""
        if self.family is not None:
            return self.family.render(messages, add_generation_prompt=True, tools=tools, **self.chat_kwargs)
        extra = {"tools": list(tools)} if tools else {}
        kwargs = {k: v for k, v in self.chat_kwargs.items() if k != "strftime_now"}
        return self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True,
                                                  **extra, **kwargs)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, no special tokens added."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, special tokens kept (what the prefix check compares)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def parse(self, generated_ids: Sequence[int], prompt_text: str) -> ParsedReply:
        """The family's parse of a reply to `prompt_text`: content, reasoning, tool calls, structured message."""
        if self.family is None:
            content = self.tokenizer.decode(list(generated_ids), skip_special_tokens=True)
            return ParsedReply({"role": "assistant", "content": content}, strip_thinking(content))
        text = self.decode(generated_ids)
        eos = getattr(self.tokenizer, "eos_token", None)
        while isinstance(eos, str) and eos and text.endswith(eos) and eos not in self.family.end_of_turn:
            text = text[: -len(eos)]
        return self.family.parse(self.family.strip_end(text), self.family.prefill_of(prompt_text))

    def rewrites(self, old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> bool:
        """Whether the family's stated rule says appending `new` to `old` rewrites what the model saw."""
        if self.family is None:
            return False
        try:
            return bool(self.family.rewrites_history(list(old), list(new), self.chat_kwargs))
        except (KeyError, TypeError, IndexError, AttributeError):  # a rule written for env histories, not this one
            return False


def _reply_key(content: Any, calls: Any) -> tuple[str, tuple[tuple[str, str], ...]]:
    """What identifies a reply handed back by an agent: its stripped content and its calls (name, canonical args)."""
    out = []
    for call in calls or ():
        fn = call.get("function", call) if isinstance(call, Mapping) else {}
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        out.append((str(fn.get("name")), json.dumps(args, sort_keys=True, ensure_ascii=False)))
    return (content or "").strip() if isinstance(content, str) else "", tuple(out)


@dataclass(frozen=True)
class CallRecord:
    """One sampled choice of one call, as the model saw and wrote it.

    Attributes:
        session: the session id.
        call: the call's index in the session (request order).
        choice: the choice's index within the call (``n`` > 1).
        prompt_ids: the prompt exactly as given to the engine.
        generated_ids: the sampled ids, verbatim (end-of-turn token included when emitted).
        logprobs: log mu of each sampled id.
        finish_reason: ``stop``, ``length`` or ``tool_calls``.
        policy_version: the weights that sampled it.
        parent: index (in the session's records) of the record whose prompt + reply this prompt extends, or -1.
        drift: one of `DRIFT_KINDS`.
        rule: for ``template`` drift, the family's rule when it predicts the rewrite ("" otherwise).
        detail: where and how the rendering departs (for anything but ``first`` / ``extends``).
        restored: assistant messages of this call rendered from recorded replies.
        roundtrip_drift: ``""`` when re-tokenizing the reply in context gives back its ids (`check_roundtrip`).
        content: the reply's answer text, as returned.
        reply: the structured assistant message the template renders for this reply.
        messages: the call's messages as rendered (after restoration); empty for a completions call.
        tools: the declared tools as canonical JSON ("" when none).
        prompt_text: the prompt as text.
        reply_text: the reply as text (special tokens kept).
    """

    session: str
    call: int
    choice: int
    prompt_ids: tuple[int, ...]
    generated_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    policy_version: int
    parent: int = -1
    drift: str = "first"
    rule: str = ""
    detail: str = ""
    restored: int = 0
    roundtrip_drift: str = ""
    content: str = ""
    reply: dict[str, Any] = field(default_factory=dict)
    messages: tuple[dict[str, Any], ...] = ()
    tools: str = ""
    prompt_text: str = ""
    reply_text: str = ""

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (what ``agentrl serve --record`` writes per line)."""
        return asdict(self)


@dataclass(frozen=True)
class SessionReport:
    """How a session's calls line up, for the drift report.

    Attributes:
        session: its id.
        calls: HTTP calls.
        records: sampled choices (calls x n).
        extended: calls (after the first) whose prompt extends an earlier call's prompt + reply token for token.
        rerendered: calls (after the first) whose prompt does not, so their sample starts anew.
        by_kind: counts per drift kind over calls after the first.
        rules: counts per family rule that explained a ``template`` drift.
        details: one line per re-rendered call (call index, kind, where).
        restored: assistant messages rendered from recorded replies.
        roundtrip_drift: replies whose ids re-tokenize differently in context.
        policy_versions: the distinct versions that sampled the session.
    """

    session: str
    calls: int
    records: int
    extended: int
    rerendered: int
    by_kind: dict[str, int]
    rules: dict[str, int]
    details: tuple[str, ...]
    restored: int
    roundtrip_drift: int
    policy_versions: tuple[int, ...]

    @property
    def extend_fraction(self) -> float:
        """Share of the calls after the first that extended an earlier one (1.0 for a single call)."""
        later = self.extended + self.rerendered
        return self.extended / later if later else 1.0

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return asdict(self) | {"extend_fraction": self.extend_fraction}


@dataclass(frozen=True)
class Prepared:
    """A call's prompt, ready for the engine, and how it relates to the session's earlier calls.

    Attributes:
        prompt_ids: the ids to sample from.
        prompt_text: their text.
        messages: the messages rendered (after restoration).
        parent: the record extended, or -1.
        drift: one of `DRIFT_KINDS`.
        rule: the family rule explaining a ``template`` drift ("" when none).
        detail: where the rendering departs.
        restored: assistant messages rendered from recorded replies.
        tools: the declared tools as canonical JSON ("" when none).
    """

    prompt_ids: tuple[int, ...]
    prompt_text: str
    messages: tuple[dict[str, Any], ...]
    parent: int
    drift: str
    rule: str = ""
    detail: str = ""
    restored: int = 0
    tools: str = ""


class SessionLog:
    """The calls of one session, in order (thread-safe through its `Recorder`).

    Besides the records it keeps what makes matching a new call cost time linear in that call, not in the session's
    history: the replies by their key (for restoration), and a hash of every record's prompt + reply (as text and as
    ids) by length, so a new prompt is hashed once, prefix by prefix, and looked up.
    """

    def __init__(self, session: str):
        self.session = session
        self.records: list[CallRecord] = []
        self.calls = 0
        self.reward: float | None = None
        self.bytes = _SESSION_BYTES
        self.replies: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, Any]] = {}
        self.by_call: dict[int, list[int]] = {}
        self.text_index = _PrefixIndex()
        self.ids_index = _PrefixIndex()

    def _add(self, rec: CallRecord) -> int:
        """Append `rec`, index it, and return the bytes it adds (the caller holds the recorder's lock)."""
        i = len(self.records)
        self.records.append(rec)
        self.by_call.setdefault(rec.call, []).append(i)
        if rec.reply:
            self.replies.setdefault(_reply_key(rec.content, rec.reply.get("tool_calls")), rec.reply)
        if rec.prompt_text:
            self.text_index.add((rec.prompt_text + rec.reply_text).encode("utf-8"), i)
        self.ids_index.add(_ids_bytes(rec.prompt_ids + rec.generated_ids), i)
        size = _record_bytes(rec)
        self.bytes += size
        return size

    def trajectory(self, reward: float, *, env_id: str = "agent", seed: int = 0, group_id: int = 0,
                   first_observation: str = "", success: bool = False, task_type: str = "") -> Trajectory:
        """The session as a trajectory: one turn per record, each after the record it extends where possible.

        Records are laid out as chains (a record joins the chain whose last record it extends, else starts a
        chain), so `trajectory_to_samples` merges every run of calls that extend each other. The reward sits on
        the last turn, so the trajectory's return is `reward`.
        """
        chains: list[list[int]] = []
        tail_of: dict[int, int] = {}  # record index at a chain's end -> chain
        for i, rec in enumerate(self.records):
            chain = tail_of.pop(rec.parent, None) if rec.parent >= 0 else None
            if chain is None:
                chains.append([])
                chain = len(chains) - 1
            chains[chain].append(i)
            tail_of[i] = chain
        order = [i for chain in chains for i in chain]
        turns = []
        for k, i in enumerate(order):
            rec = self.records[i]
            new_segment = k > 0 and order[k - 1] != rec.parent
            turns.append(Turn(rec.prompt_ids, rec.generated_ids, rec.logprobs, action=rec.content, observation="",
                              reward=float(reward) if k == len(order) - 1 else 0.0,
                              finish_reason="length" if rec.finish_reason == "length" else "stop",
                              new_segment=new_segment, roundtrip_drift=rec.roundtrip_drift))
        versions = [r.policy_version for r in self.records]
        return Trajectory(env_id=env_id, seed=seed, group_id=group_id, turns=tuple(turns),
                          first_observation=first_observation, total_return=float(reward) if turns else 0.0,
                          success=success, terminated=True, truncated=False,
                          policy_version=min(versions) if versions else 0, task_type=task_type)

    def samples(self, advantage: float, reward: float = 0.0) -> list[Sample]:
        """The session's training samples (`trajectory_to_samples` over `trajectory`), each with `advantage`."""
        return trajectory_to_samples(self.trajectory(reward), advantage)

    def report(self) -> SessionReport:
        """Counts of extended and re-rendered calls, and why each re-rendered one drifted."""
        firsts = [r for r in self.records if r.choice == 0]
        later = [r for r in firsts if r.call > 0]
        kinds = Counter(r.drift for r in later)
        rules = Counter(r.rule for r in later if r.drift == "template" and r.rule)
        details = tuple(f"call {r.call}: {r.drift}{f' ({r.rule})' if r.rule else ''}: {r.detail}"
                        for r in later if r.drift not in ("extends",))
        return SessionReport(
            session=self.session, calls=self.calls, records=len(self.records), extended=kinds.get("extends", 0),
            rerendered=len(later) - kinds.get("extends", 0), by_kind=dict(kinds), rules=dict(rules),
            details=details, restored=sum(r.restored for r in firsts),
            roundtrip_drift=sum(bool(r.roundtrip_drift) for r in self.records),
            policy_versions=tuple(sorted({r.policy_version for r in self.records})))


class _PrefixIndex:
    """Records by a hash of their prompt + reply bytes.

    "Which records does this prompt start with" then costs one pass over the prompt (hashing it incrementally at each
    recorded length below its own) instead of a rescan of the records.
    """

    def __init__(self) -> None:
        self._keys: dict[tuple[int, bytes], list[int]] = {}
        self._lengths: list[int] = []  # the distinct lengths in `_keys`, ascending
        self._length_set: set[int] = set()

    def add(self, data: bytes, index: int) -> None:
        """Index record `index` whose prompt + reply is `data`."""
        key = (len(data), hashlib.blake2b(data, digest_size=16).digest())
        if key[0] not in self._length_set:
            self._length_set.add(key[0])
            bisect.insort(self._lengths, key[0])
        self._keys.setdefault(key, []).append(index)

    def prefixes(self, data: bytes, work: Counter) -> list[int]:
        """Indices of the records whose prompt + reply `data` starts with (latest first; hash matches only).

        At most one step per distinct recorded length up to ``len(data)``: linear in the new prompt.
        """
        view, hasher, done, found = memoryview(data), hashlib.blake2b(digest_size=16), 0, []
        for length in self._lengths[: bisect.bisect_right(self._lengths, len(data))]:
            hasher.update(view[done:length])
            done = length
            work["prefix_lookups"] += 1
            found.extend(self._keys.get((length, hasher.copy().digest()), ()))
        work["hashed_bytes"] += done
        return sorted(found, reverse=True)


class SessionFull(Exception):
    """A session at its cap of calls or bytes: its next call is refused (the client starts a new session)."""


class PromptTooLong(ValueError):
    """A rendered prompt over the caller's character bound, refused before it is tokenized."""


class Recorder:
    """Every session's calls: renders prompts against a session's history and records what was sampled.

    Memory is bounded three ways, so a long-running ``agentrl serve`` (or a client flooding it) cannot grow it
    without end: at most `max_sessions` sessions and `max_bytes` bytes of records are kept (an estimate that
    overcounts: every record's ids, log-probs, texts and messages), and a session takes at most
    `max_calls_per_session` calls (its next call raises `SessionFull`, as does a call to a session holding
    `max_bytes` alone). Over the session or byte cap the least recently used sessions are evicted: never silently
    lost, they are already on disk when `saved_to` is set (``--record`` appends every record as it is made), else
    their records are appended to `spill_path` (JSON lines, the ``--record`` format), else a warning is logged;
    `evicted` counts evicted sessions and `evicted_unsaved` those written nowhere. A call to an evicted session
    starts it anew.

    Args:
        renderer: the template, parser and tokenizer.
        max_sessions: sessions kept in memory.
        max_calls_per_session: calls one session may make.
        max_bytes: bytes of records kept in memory (estimated; see `bytes_kept`).
        spill_path: where evicted sessions' records are appended when `saved_to` is not set (None: nowhere).
    """

    def __init__(self, renderer: Renderer, *, max_sessions: int = 10_000, max_calls_per_session: int = 1_000,
                 max_bytes: int = 2**30, spill_path: str | Path | None = None):
        for name, value in (("max_sessions", max_sessions), ("max_calls_per_session", max_calls_per_session),
                            ("max_bytes", max_bytes)):
            if value < 1:
                raise ValueError(f"Recorder {name} must be >= 1, got {value}")
        self.renderer = renderer
        self.max_sessions, self.max_calls_per_session, self.max_bytes = max_sessions, max_calls_per_session, max_bytes
        self.spill_path = Path(spill_path) if spill_path else None
        self.saved_to: Path | None = None
        """Set by the server when every record is appended to this file as it is made (eviction writes nothing)."""
        self.evicted = 0
        self.evicted_unsaved = 0
        self.work: Counter = Counter()
        """What matching cost so far: ``prefix_lookups``, ``hashed_bytes``, ``compared_chars``, ``encoded_chars``."""
        self._bytes = 0
        self._sessions: dict[str, SessionLog] = {}  # least recently used first
        self._lock = threading.Lock()
        self._spill_lock = threading.Lock()

    @property
    def bytes_kept(self) -> int:
        """The estimated bytes of every kept session's records (at most `max_bytes` plus one call's records)."""
        return self._bytes

    def session(self, session: str) -> SessionLog:
        """The session's log (created empty on first use); evicts the least recently used ones over the caps."""
        with self._lock:
            log = self._sessions.pop(session, None)
            if log is None:
                log = SessionLog(session)
                self._bytes += log.bytes
            self._sessions[session] = log  # now the most recently used
            evicted = self._over_caps()
        self._spill(evicted)
        return log

    def find(self, session: str) -> SessionLog | None:
        """The session's log, or None when there is none (never creates one)."""
        with self._lock:
            return self._sessions.get(session)

    def _over_caps(self) -> list[SessionLog]:
        """Drop the least recently used sessions while over a cap (never the most recent one); lock held."""
        out = []
        while (len(self._sessions) > self.max_sessions or self._bytes > self.max_bytes) and len(self._sessions) > 1:
            log = self._sessions.pop(next(iter(self._sessions)))
            self._bytes -= log.bytes
            out.append(log)
        self.evicted += len(out)
        if out and self.saved_to is None and self.spill_path is None:
            self.evicted_unsaved += len(out)
        return out

    def _spill(self, evicted: list[SessionLog]) -> None:
        """Write evicted sessions where they are kept (see the class docstring)."""
        if not evicted or self.saved_to is not None:
            return
        if self.spill_path is None:
            _logger.warning("evicted %d session(s) over the server's caps (%d sessions, %d bytes) with no record file: "
                        "their calls are lost; run with --record to keep them", len(evicted), self.max_sessions,
                        self.max_bytes)
            return
        lines = [json.dumps(rec.to_json(), ensure_ascii=False) + "\n" for s in evicted for rec in s.records]
        self.spill_path.parent.mkdir(parents=True, exist_ok=True)
        with self._spill_lock, open(self.spill_path, "a") as f:
            f.writelines(lines)

    def anonymous(self) -> str:
        """A fresh, unguessable session id for a call that named none (each such call is its own session)."""
        return f"anon-{secrets.token_urlsafe(16)}"

    def pop(self, session: str) -> SessionLog | None:
        """Remove and return a session's log."""
        with self._lock:
            out = self._sessions.pop(session, None)
            if out is not None:
                self._bytes -= out.bytes
            return out

    def sessions(self) -> list[str]:
        """Session ids, least recently used first."""
        with self._lock:
            return list(self._sessions)

    # ---- prompts -------------------------------------------------------------------------------------------------

    def _restore(self, log: SessionLog, messages: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
        """Assistant messages that equal a recorded reply, replaced by the reply as the model wrote it."""
        out, restored = [], 0
        for m in messages:
            if m.get("role") == "assistant":
                recorded = log.replies.get(_reply_key(m.get("content"), m.get("tool_calls")))
                if recorded is not None:
                    if recorded != m:
                        restored += 1
                    m = dict(recorded)
            out.append(m)
        return out, restored

    def prepare_chat(self, session: str, messages: Sequence[dict[str, Any]],
                     tools: Sequence[Mapping[str, Any]] | None, *, max_chars: int | None = None) -> Prepared:
        """Render a chat call against the session's earlier calls (see the module docstring).

        Matching costs time linear in the new call: the rendered text is hashed once at every recorded length below
        its own, and only the latest hash match is compared character by character.

        Args:
            session: the session id.
            messages: the call's messages (`agentrl.serve.protocol.ChatRequest.messages`).
            tools: the declared tools, or None.
            max_chars: the longest rendered prompt accepted, checked before tokenizing (None: any).

        Raises:
            PromptTooLong: the rendered prompt is over `max_chars`.
        """
        log = self.session(session)
        with self._lock:
            rendered, restored = self._restore(log, messages)
        text = self.renderer.render(rendered, tools)
        if max_chars is not None and len(text) > max_chars:
            raise PromptTooLong(f"the rendered prompt is {len(text)} characters, over this server's bound of "
                                f"{max_chars} for its context; shorten the conversation")
        data = text.encode("utf-8")
        with self._lock:
            match = None
            for i in log.text_index.prefixes(data, self.work):
                rec = log.records[i]
                self.work["compared_chars"] += len(rec.prompt_text) + len(rec.reply_text)
                if text.startswith(rec.prompt_text) and text.startswith(rec.reply_text, len(rec.prompt_text)):
                    match = i
                    break
            records = log.records[-_EXPLAIN_WINDOW:]
            last_call = log.by_call.get(log.records[-1].call, []) if log.records else []
            last = [log.records[j] for j in last_call]
        tools_key = _tools_key(tools)
        if match is not None:
            rec = log.records[match]
            seen = len(rec.prompt_text) + len(rec.reply_text)
            with self._lock:
                self.work["encoded_chars"] += len(text) - seen
            ids = rec.prompt_ids + rec.generated_ids + tuple(self.renderer.encode(text[seen:]))
            # Extending an older call than the latest: the agent went back (an edit of what followed) or an
            # interleaved conversation (a sub-agent) went on; only the former is drift.
            drift, rule, detail = ("extends", "", "") if match in last_call else self._explain(last, rendered, tools,
                                                                                                text)
            if drift == "new_context":
                drift, detail = "extends", ""
            return Prepared(ids, text, tuple(rendered), match, drift, rule, detail, restored, tools_key)
        with self._lock:
            self.work["encoded_chars"] += len(text)
        ids = tuple(self.renderer.encode(text))
        if not records:
            return Prepared(ids, text, tuple(rendered), -1, "first", restored=restored, tools=tools_key)
        drift, rule, detail = self._explain(records, rendered, tools, text)
        return Prepared(ids, text, tuple(rendered), -1, drift, rule, detail, restored, tools_key)

    def prepare_completion(self, session: str, prompt: str | tuple[int, ...]) -> Prepared:
        """A completions call: the prompt as given (text tokenized, ids kept).

        It extends an earlier call when its ids start with that call's prompt + reply (found as `prepare_chat` does).
        """
        log = self.session(session)
        ids = prompt if isinstance(prompt, tuple) else tuple(self.renderer.encode(prompt))
        text = prompt if isinstance(prompt, str) else self.renderer.decode(prompt)
        data = _ids_bytes(ids)
        with self._lock:
            for i in log.ids_index.prefixes(data, self.work):
                rec = log.records[i]
                n, m = len(rec.prompt_ids), len(rec.generated_ids)
                self.work["compared_chars"] += n + m
                if ids[:n] == rec.prompt_ids and ids[n: n + m] == rec.generated_ids:
                    return Prepared(ids, text, (), i, "extends")
            first = not log.records
        if first:
            return Prepared(ids, text, (), -1, "first")
        return Prepared(ids, text, (), -1, "new_context", detail="the prompt ids extend no earlier call's ids")

    def _explain(self, records: list[CallRecord], messages: list[dict[str, Any]], tools: Any,
                 text: str) -> tuple[str, str, str]:
        """Why `text` extends no earlier call: (drift kind, family rule, detail), against the closest earlier call.

        Only the last `_EXPLAIN_WINDOW` records are searched, so a session that drifts on every call does not pay for
        its whole history on each one.
        """
        # An earlier call whose history and reply the agent kept: the template's doing.
        for rec in reversed(records[-_EXPLAIN_WINDOW:]):
            n = len(rec.messages)
            if rec.messages and len(messages) > n and list(rec.messages) == messages[:n] and messages[n] == rec.reply:
                if _tools_key(tools) != rec.tools:
                    return "agent_edit", "", f"the declared tools changed since call {rec.call}"
                old, new = list(rec.messages), messages[n:]
                where = explain_rewrite(rec.prompt_text + rec.reply_text, text)
                if self.renderer.rewrites(old, new):
                    return "template", f"{self.renderer.family_name}: {self.renderer.family.rule}", where
                return "template", "", f"{where} (not predicted by the family's rule)"
        best, best_len, best_hist = None, -1, []
        # The earlier call sharing the longest history (its messages and reply; latest on ties).
        for rec in records[-_EXPLAIN_WINDOW:]:
            hist = [*rec.messages, rec.reply] if rec.reply else list(rec.messages)
            shared = next((j for j, (a, b) in enumerate(zip(hist, messages)) if a != b), min(len(hist), len(messages)))
            if rec.messages and shared >= best_len:
                best, best_len, best_hist = rec, shared, hist
        if best is None or best_len == 0:
            return "new_context", "", "shares no message with the session's earlier calls"
        old, i = best_hist, best_len
        if i >= len(old):
            return "agent_edit", "", f"the declared tools or template variables changed since call {best.call}"
        if i >= len(messages):
            return "agent_edit", "", f"the history of call {best.call} was cut after message {i}"
        if i == len(old) - 1 and best.reply and messages[i].get("role") == "assistant":
            return "agent_edit", "", (f"message {i}: the assistant reply of call {best.call} was handed back changed "
                                      f"({_short(messages[i])} for {_short(best.reply)})")
        if old[i + 1: i + 2] == messages[i: i + 1]:
            return "agent_edit", "", f"message {i} ({old[i].get('role')}) of call {best.call} was dropped"
        if old[i].get("role") == messages[i].get("role"):
            return "agent_edit", "", (f"message {i} ({old[i].get('role')}) of call {best.call} was rewritten: "
                                      f"{_short(old[i])} -> {_short(messages[i])}")
        return "agent_edit", "", f"the history of call {best.call} was reordered or replaced at message {i}"

    # ---- records -------------------------------------------------------------------------------------------------

    def record(self, session: str, prepared: Prepared, generated_ids: Sequence[int], logprobs: Sequence[float],
               finish_reason: str, policy_version: int, *, choice: int = 0, call: int | None = None,
               parsed: ParsedReply | None = None) -> CallRecord:
        """Store one sampled choice; returns its record."""
        log = self.session(session)
        reply_text = self.renderer.decode(generated_ids)
        parsed = parsed or self.renderer.parse(generated_ids, prepared.prompt_text)
        rec = CallRecord(
            session=session, call=log.calls if call is None else call, choice=choice,
            prompt_ids=tuple(prepared.prompt_ids), generated_ids=tuple(generated_ids), logprobs=tuple(logprobs),
            finish_reason=finish_reason, policy_version=int(policy_version), parent=prepared.parent,
            drift=prepared.drift, rule=prepared.rule, detail=prepared.detail, restored=prepared.restored,
            roundtrip_drift=check_roundtrip(self.renderer.tokenizer, prepared.prompt_ids, generated_ids).drift,
            content=parsed.content, reply=dict(parsed.message) if prepared.messages else {},
            messages=prepared.messages, tools=prepared.tools, prompt_text=prepared.prompt_text,
            reply_text=reply_text)
        with self._lock:
            size = log._add(rec)
            if self._sessions.get(session) is log:  # (an evicted log is no longer counted)
                self._bytes += size
            evicted = self._over_caps()
        self._spill(evicted)
        return rec

    def next_call(self, session: str) -> int:
        """Reserve the session's next call index.

        Raises:
            SessionFull: the session made `max_calls_per_session` calls, or holds `max_bytes` alone.
        """
        log = self.session(session)
        with self._lock:
            if log.calls >= self.max_calls_per_session:
                raise SessionFull(f"session {session!r} made its {self.max_calls_per_session} calls, this server's "
                                  f"cap per session; start a new session")
            if log.bytes >= self.max_bytes:
                raise SessionFull(f"session {session!r} holds {log.bytes} bytes of records, this server's whole "
                                  f"memory cap; start a new session")
            log.calls += 1
            return log.calls - 1


_SESSION_BYTES = 2048
"""Estimated bytes of an empty `SessionLog` and its indexes."""
_RECORD_BYTES = 1024
"""Estimated bytes of a `CallRecord` and its index entries, beyond its ids, log-probs, texts and messages."""
_EXPLAIN_WINDOW = 64
"""Records `Recorder._explain` searches for the closest earlier call (the latest ones)."""


def _ids_bytes(ids: Sequence[int]) -> bytes:
    """Token ids as bytes, 8 per id, so a prefix of ids is a prefix of bytes."""
    try:
        return array("Q", ids).tobytes()
    except (OverflowError, TypeError):  # ids outside 0..2**64 (only a caller that skipped the vocabulary check)
        return b"\xff" + ",".join(map(str, ids)).encode()


def _deep_size(value: Any) -> int:
    """Bytes of `value` and everything it holds (dicts, lists, tuples, strings); shared objects counted each time."""
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total


def _record_bytes(rec: CallRecord) -> int:
    """An overestimate of the memory one record holds: 40 bytes a token id (pointer and int), 32 a log-prob."""
    return (_RECORD_BYTES + 40 * (len(rec.prompt_ids) + len(rec.generated_ids)) + 32 * len(rec.logprobs)
            + sum(sys.getsizeof(t) for t in (rec.prompt_text, rec.reply_text, rec.content, rec.detail, rec.tools))
            + _deep_size(rec.messages) + _deep_size(rec.reply))


def _tools_key(tools: Any) -> str:
    return json.dumps(list(tools), sort_keys=True, ensure_ascii=False) if tools else ""


def _short(message: Mapping[str, Any], width: int = 60) -> str:
    text = json.dumps({k: v for k, v in message.items() if k != "role"}, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 3] + "..."
