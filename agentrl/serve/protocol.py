"""OpenAI request bodies -> typed requests, and the response shapes the official client reads.

Only what the engines can honour is accepted; anything else is refused with an OpenAI-style error body
(``{"error": {"message", "type", "param", "code"}}``) naming the field and what to do, never a traceback. Unknown
top-level keys are ignored (clients send ``user``, ``parallel_tool_calls``, ``store``...), as OpenAI-compatible
servers commonly do.

Trust: every number is checked finite and in range (JSON's ``NaN`` / ``Infinity`` literals, which Python's parser
accepts, are refused wherever they are when the body is read: `decode_body`), token ids must lie in the vocabulary,
bodies may nest at most `MAX_DEPTH` levels, and a prompt's characters are bounded (`RequestLimits.max_prompt_chars`)
before anything is tokenized. What leaves the server is strict JSON (`dump_json`): a non-finite number in an answer
is a 500 naming it, never ``NaN`` on the wire.

Log-probs: the engines return the log-probability of each sampled token under the distribution it was sampled from
(after temperature / top-p processing: the mu of the RL objective), not the top alternatives, so ``top_logprobs`` above
0 is refused rather than answered with an empty list.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentrl.engine.base import SamplingParams

__all__ = ["ApiError", "ChatRequest", "CompletionRequest", "RequestLimits", "parse_chat_request",
           "parse_completion_request", "decode_body", "dump_json", "MAX_N", "MAX_DEPTH", "MAX_STOP_CHARS", "ROLES"]

MAX_N = 16
"""Most choices one request may ask for."""
MAX_DEPTH = 64
"""Deepest nesting of arrays and objects a body (or a tool call's JSON arguments) may have."""
MAX_STOP_CHARS = 1000
"""Longest stop string."""
ROLES = ("system", "developer", "user", "assistant", "tool")
"""Message roles accepted; ``developer`` is rendered as ``system`` (what the open templates know)."""


class ApiError(Exception):
    """A request the server refuses, as the OpenAI error body.

    Args:
        message: what is wrong and how to fix it.
        status: the HTTP status.
        param: the offending field, or None.
        type_: the OpenAI error type.
        code: a short machine-readable code, or None.
    """

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 type_: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param, self.type, self.code = message, status, param, type_, code

    def body(self) -> dict[str, Any]:
        """The JSON error body."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask of this server, beyond the fixed bounds of the OpenAI API.

    Attributes:
        max_new_tokens: the most new tokens one call may ask for (``max_tokens``).
        vocab_size: token ids (a completions prompt, ``logit_bias`` keys) must be below it (None: unchecked).
        max_prompt_chars: the most characters of prompt (message contents, tool declarations, a completions prompt)
            a request may send, checked before tokenizing (None: unchecked).
        max_prompt_tokens: the most token ids a completions prompt may hold (None: unchecked).
        max_messages: the most messages a chat request may hold (None: unchecked).
    """

    max_new_tokens: int
    vocab_size: int | None = None
    max_prompt_chars: int | None = None
    max_prompt_tokens: int | None = None
    max_messages: int | None = None


def decode_body(raw: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """A request body as JSON, at most `max_depth` levels deep and holding only finite numbers.

    JSON's ``NaN`` / ``Infinity`` literals (which Python's parser accepts) and numbers too large for a float
    (``1e400``) are refused naming where they are (``param`` is the top-level field, e.g. ``temperature``).

    Raises:
        ApiError: 400 naming what is wrong (not JSON, not UTF-8, too deep, a non-finite number, a huge integer).
    """
    try:
        value = json.loads(raw or b"null")
    except RecursionError:
        raise ApiError(f"the request body nests arrays or objects too deeply; at most {max_depth} levels are "
                       f"accepted") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, bad UTF-8, integers over Python's digit limit
        raise ApiError(f"the request body is not valid JSON ({str(e)[:200]})") from None
    problem = _scan(value, max_depth)
    if problem is not None:
        kind, path = problem
        where = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path).lstrip(".")
        top = str(path[0]) if path else None
        if kind == "deep":
            raise ApiError(f"the request body nests arrays or objects more than {max_depth} levels deep (at "
                           f"{where[:200] or 'the top'}); flatten it", param=top)
        raise ApiError(f"'{where[:200]}' must be a finite number (NaN and Infinity are not JSON)", param=top)
    return value


def _scan(value: Any, limit: int) -> tuple[str, tuple[Any, ...]] | None:
    """The first place `value` nests past `limit` levels (``deep``) or holds a non-finite float (``non_finite``).

    Iterative, so hostile input cannot exhaust the stack; returns (kind, path of keys / indices) or None.
    """
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(value, 1, ())]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return "non_finite", path
            continue
        if isinstance(item, dict):
            children = item.items()
        elif isinstance(item, list):
            children = enumerate(item)
        else:
            continue
        if depth > limit:
            return "deep", path
        stack.extend((c, depth + 1, (*path, k)) for k, c in children if isinstance(c, (dict, list, float)))
    return None


def _too_deep(value: Any, limit: int) -> bool:
    """Whether `value` nests lists / dicts more than `limit` levels, or holds a non-finite float."""
    return _scan(value, limit) is not None


def dump_json(payload: Any) -> bytes:
    """Strict JSON bytes of an answer.

    Raises:
        ApiError: 500 when the payload holds a non-finite number, which JSON cannot carry (the engine produced it).
    """
    try:
        return json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except ValueError:
        raise ApiError("the answer holds a non-finite number (NaN or Infinity, e.g. a log-prob), which JSON cannot "
                       "carry; it was not sent", status=500, type_="server_error", code="non_finite") from None


@dataclass(frozen=True)
class ChatRequest:
    """A checked ``/v1/chat/completions`` body.

    Attributes:
        messages: the conversation, in the template's shape (``developer`` -> ``system``, text parts joined,
            tool-call arguments decoded from JSON where they are JSON).
        tools: the declared tools (OpenAI's ``{"type": "function", "function": {...}}`` entries), or None.
        sampling: the sampling settings asked for (server defaults where the body is silent).
        n: choices to sample.
        stream: answer as server-sent events.
        include_usage: streaming: end with a usage chunk.
        logprobs: return the sampled tokens' log-probs.
        sampling_given: the sampling fields the body set (the server may override the rest, or all in training).
    """

    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] | None
    sampling: SamplingParams
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    sampling_given: frozenset[str] = frozenset()


@dataclass(frozen=True)
class CompletionRequest:
    """A checked ``/v1/completions`` body.

    Attributes:
        prompt: the prompt text, or its token ids when the body gave ids.
        sampling: as `ChatRequest.sampling`.
        n: choices per prompt.
        stream: answer as server-sent events.
        logprobs: return the sampled tokens' log-probs (the legacy ``logprobs: int`` form; only 0 alternatives).
        sampling_given: as `ChatRequest.sampling_given`.
    """

    prompt: str | tuple[int, ...]
    sampling: SamplingParams
    n: int = 1
    stream: bool = False
    logprobs: bool = False
    sampling_given: frozenset[str] = frozenset()


def _number(body: Mapping[str, Any], key: str, lo: float, hi: float, *, integer: bool = False,
            lo_open: bool = False) -> float | int | None:
    value = body.get(key)
    if value is None:
        return None
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ApiError(f"'{key}' must be {'an integer' if integer else 'a number'}, got {_show(value)}", param=key)
    if isinstance(value, float) and not math.isfinite(value):  # NaN passes every comparison below
        raise ApiError(f"'{key}' must be a finite number, got {value}", param=key)
    if value < lo or value > hi or (lo_open and value == lo):
        bound = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
        raise ApiError(f"'{key}' must be in {bound}, got {_show(value)}", param=key)
    return value


def _show(value: Any, width: int = 60) -> str:
    """A client's value, shortened for an error message (a 10,000-digit integer is not echoed whole)."""
    try:
        text = repr(value)
    except ValueError:  # an integer over Python's str-conversion digit limit
        return "a very large integer"
    return text if len(text) <= width else text[: width - 3] + "..."


def _flag(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(f"'{key}' must be true or false, got {_show(value)}", param=key)
    return value


def _sampling(body: Mapping[str, Any], defaults: SamplingParams, max_tokens_keys: tuple[str, ...],
              max_tokens_limit: int) -> tuple[SamplingParams, frozenset[str]]:
    given: dict[str, Any] = {}
    for key, field_, lo, hi, integer, lo_open in (
            ("temperature", "temperature", 0, 2, False, False), ("top_p", "top_p", 0, 1, False, True),
            ("top_k", "top_k", 0, 1_000_000, True, False), ("min_p", "min_p", 0, 1, False, False),
            ("presence_penalty", "presence_penalty", -2, 2, False, False),
            ("frequency_penalty", "frequency_penalty", -2, 2, False, False),
            ("repetition_penalty", "repetition_penalty", 0, 10, False, True),
            ("seed", "seed", 0, 2**63 - 1, True, False)):
        value = _number(body, key, lo, hi, integer=integer, lo_open=lo_open)
        if value is not None:
            given[field_] = value
    for key in max_tokens_keys:
        value = _number(body, key, 1, max_tokens_limit, integer=True)
        if value is not None:
            given["max_new_tokens"] = value
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or len(stops) > 4 \
                or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops):
            raise ApiError(f"'stop' must be a non-empty string of at most {MAX_STOP_CHARS} characters or a list of "
                           f"up to 4 of them, got {_show(stop)}", param="stop")
        given["stop"] = tuple(stops)
    fields = {k: getattr(defaults, k) for k in defaults.__dataclass_fields__} | given
    return SamplingParams(**fields), frozenset(given)


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, or a list of text parts (other parts are refused)."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = _show(part.get("type")) if isinstance(part, Mapping) else type(part).__name__
                raise ApiError(f"{where}: only text content parts are supported, got a {kind} part",
                               param=where)
            parts.append(part["text"])
        return "".join(parts)
    raise ApiError(f"{where}: content must be a string or a list of text parts, got {type(content).__name__}",
                   param=where)


def _arguments(value: Any, where: str) -> Any:
    """Tool-call arguments as the templates take them: a dict when the JSON string holds an object."""
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except (ValueError, RecursionError):  # not JSON (kept as the string), or nested past the parser's depth
            return value
        if _too_deep(decoded, MAX_DEPTH):
            raise ApiError(f"{where}: the arguments nest more than {MAX_DEPTH} levels deep or hold a non-finite "
                           f"number", param=where)
        return decoded if isinstance(decoded, dict) else value
    return value


def _message(raw: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(raw, Mapping):
        raise ApiError(f"{where} must be an object with 'role' and 'content'", param=where)
    role = raw.get("role")
    if role not in ROLES:
        raise ApiError(f"{where}.role must be one of {', '.join(ROLES)}, got {_show(role)}", param=f"{where}.role")
    message: dict[str, Any] = {"role": "system" if role == "developer" else role,
                               "content": _text(raw.get("content"), f"{where}.content")}
    if role == "assistant":
        calls = raw.get("tool_calls")
        if calls:
            if not isinstance(calls, list):
                raise ApiError(f"{where}.tool_calls must be a list", param=f"{where}.tool_calls")
            out = []
            for j, call in enumerate(calls):
                fn = call.get("function") if isinstance(call, Mapping) else None
                if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                    raise ApiError(f"{where}.tool_calls[{j}] needs function.name and function.arguments",
                                   param=f"{where}.tool_calls")
                entry: dict[str, Any] = {"type": "function", "function": {
                    "name": fn["name"], "arguments": _arguments(fn.get("arguments", {}),
                                                                f"{where}.tool_calls[{j}].function.arguments")}}
                if call.get("id"):
                    entry["id"] = _string(call["id"], f"{where}.tool_calls[{j}].id")
                out.append(entry)
            message["tool_calls"] = out
        for key in ("reasoning_content", "reasoning"):  # what this server returned, handed back by the agent
            if isinstance(raw.get(key), str) and raw.get(key):
                message["reasoning_content"] = raw[key]
                break
    elif role == "tool":
        if raw.get("tool_call_id"):
            message["tool_call_id"] = _string(raw["tool_call_id"], f"{where}.tool_call_id")
    if raw.get("name") and role in ("user", "tool"):
        message["name"] = _string(raw["name"], f"{where}.name")
    return message


def _string(value: Any, where: str) -> str:
    """An identifier-like field (a name, an id): a string or a number, as a string."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ApiError(f"{where} must be a string, got {type(value).__name__}", param=where)
    return value if isinstance(value, str) else _show(value)


def _tools(body: Mapping[str, Any]) -> tuple[dict[str, Any], ...] | None:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise ApiError("'tool_choice' supports 'auto' and 'none' only: the open chat templates cannot force a call "
                       f"(got {_show(choice)})", param="tool_choice")
    if tools is None or choice == "none":
        return None
    if not isinstance(tools, list) or not tools:
        raise ApiError("'tools' must be a non-empty list of {'type': 'function', 'function': {...}}", param="tools")
    for j, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(tool, Mapping) or tool.get("type") != "function" or not isinstance(fn, Mapping) \
                or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ApiError(f"tools[{j}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': "
                           f"...}}}}", param=f"tools[{j}]")
    return tuple(dict(t) for t in tools)


def _n(body: Mapping[str, Any]) -> int:
    n = _number(body, "n", 1, MAX_N, integer=True)
    return 1 if n is None else int(n)


def _characters(*values: Any) -> int:
    """Characters of every string (keys included) in `values`: what a template can render from them."""
    total, stack = 0, list(values)
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return total


def _check_prompt_chars(chars: int, limits: RequestLimits, param: str) -> None:
    if limits.max_prompt_chars is not None and chars > limits.max_prompt_chars:
        raise ApiError(f"the prompt is {chars} characters, more than this server's context can hold (at most "
                       f"{limits.max_prompt_chars} characters are read before tokenizing); shorten it",
                       param=param, code="context_length_exceeded")


def _logit_bias(body: Mapping[str, Any], limits: RequestLimits) -> None:
    """Check ``logit_bias`` (token ids in the vocabulary, biases in [-100, 100]), then refuse a non-empty one."""
    bias = body.get("logit_bias")
    if bias is None or bias == {}:
        return
    if not isinstance(bias, Mapping):
        raise ApiError("'logit_bias' must be an object of token id -> bias", param="logit_bias")
    for key, value in bias.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 12):
            raise ApiError(f"'logit_bias' keys must be token ids, got {_show(key)}", param="logit_bias")
        if limits.vocab_size is not None and int(key) >= limits.vocab_size:
            raise ApiError(f"'logit_bias' names token {key}, outside the vocabulary (size {limits.vocab_size})",
                           param="logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not -100 <= value <= 100:
            raise ApiError(f"'logit_bias' values must be numbers in [-100, 100], got {_show(value)}",
                           param="logit_bias")
    raise ApiError("'logit_bias' is not supported: the engines cannot bias logits (send none)", param="logit_bias")


def _limits(limits: RequestLimits | int) -> RequestLimits:
    return limits if isinstance(limits, RequestLimits) else RequestLimits(max_new_tokens=int(limits))


def parse_chat_request(body: Any, defaults: SamplingParams, limits: RequestLimits | int) -> ChatRequest:
    """Check a chat-completions body.

    Args:
        body: the decoded JSON.
        defaults: sampling settings for the fields the body leaves out.
        limits: what a request may ask (an int: only the most new tokens one call may ask for).

    Raises:
        ApiError: naming the field that is wrong.
    """
    limits = _limits(limits)
    if not isinstance(body, Mapping):
        raise ApiError("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError("'messages' must be a non-empty list of {'role': ..., 'content': ...}", param="messages")
    if limits.max_messages is not None and len(messages) > limits.max_messages:
        raise ApiError(f"'messages' holds {len(messages)} messages, more than this server's context can render "
                       f"(at most {limits.max_messages})", param="messages", code="context_length_exceeded")
    _check_prompt_chars(_characters(messages, body.get("tools")), limits, "messages")
    top = body.get("top_logprobs")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20):
        raise ApiError(f"'top_logprobs' must be an integer in [0, 20], got {_show(top)}", param="top_logprobs")
    if top:
        raise ApiError("'top_logprobs' is not supported: the engines return the sampled token's log-prob only "
                       "(ask for 'logprobs': true)", param="top_logprobs")
    fmt = body.get("response_format")
    if fmt not in (None, {"type": "text"}):
        raise ApiError("'response_format' other than text is not supported (no constrained decoding here)",
                       param="response_format")
    options = body.get("stream_options") or {}
    if not isinstance(options, Mapping):
        raise ApiError("'stream_options' must be an object", param="stream_options")
    _logit_bias(body, limits)
    sampling, given = _sampling(body, defaults, ("max_tokens", "max_completion_tokens"), limits.max_new_tokens)
    return ChatRequest(
        messages=tuple(_message(m, i) for i, m in enumerate(messages)), tools=_tools(body), sampling=sampling,
        n=_n(body), stream=_flag(body, "stream"), include_usage=_flag(options, "include_usage"),
        logprobs=_flag(body, "logprobs"), sampling_given=given)


def _token_ids(prompt: list[Any], limits: RequestLimits) -> tuple[int, ...] | None:
    """A prompt of token ids, checked against the vocabulary and the context; None when it is not a list of ints."""
    if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return None
    if limits.max_prompt_tokens is not None and len(prompt) > limits.max_prompt_tokens:
        raise ApiError(f"'prompt' holds {len(prompt)} token ids, more than this server's context of "
                       f"{limits.max_prompt_tokens} tokens", param="prompt", code="context_length_exceeded")
    bad = next((t for t in prompt if t < 0 or (limits.vocab_size is not None and t >= limits.vocab_size)), None)
    if bad is not None:
        size = f" (size {limits.vocab_size})" if limits.vocab_size is not None else ""
        raise ApiError(f"'prompt' holds token id {_show(bad)}, outside the vocabulary{size}", param="prompt")
    return tuple(prompt)


def parse_completion_request(body: Any, defaults: SamplingParams, limits: RequestLimits | int) -> CompletionRequest:
    """Check a (legacy) completions body: one prompt, as text or token ids.

    Args:
        body: the decoded JSON.
        defaults: sampling settings for the fields the body leaves out.
        limits: what a request may ask (an int: only the most new tokens one call may ask for).

    Raises:
        ApiError: naming the field that is wrong.
    """
    limits = _limits(limits)
    if not isinstance(body, Mapping):
        raise ApiError("the request body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    ids = _token_ids(prompt, limits) if isinstance(prompt, list) else None
    if ids is not None:
        prompt = ids
    elif not isinstance(prompt, str) or not prompt:
        raise ApiError("'prompt' must be a non-empty string or a list of token ids (one prompt per request)",
                       param="prompt")
    else:
        _check_prompt_chars(len(prompt), limits, "prompt")
    if body.get("echo"):
        raise ApiError("'echo' is not supported", param="echo")
    if body.get("suffix"):
        raise ApiError("'suffix' is not supported", param="suffix")
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool) and logprobs != 0:
        raise ApiError("'logprobs' above 0 is not supported: the engines return the sampled token's log-prob only "
                       "(ask for 'logprobs': 0)", param="logprobs")
    _logit_bias(body, limits)
    # OpenAI's default for completions is 16 new tokens.
    defaults16 = SamplingParams(**{k: getattr(defaults, k) for k in defaults.__dataclass_fields__}
                                | {"max_new_tokens": min(16, defaults.max_new_tokens)})
    sampling, given = _sampling(body, defaults16, ("max_tokens",), limits.max_new_tokens)
    return CompletionRequest(prompt=prompt, sampling=sampling, n=_n(body), stream=_flag(body, "stream"),
                             logprobs=logprobs is not None and logprobs is not False, sampling_given=given)
