"""The OpenAI-compatible HTTP server: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``.

Sessions: a call belongs to the session its path names (``/s/<session>/v1/...``, so an agent's ``base_url`` carries
it) or its ``X-Session-Id`` header; a call with neither is a session of its own, with an unguessable id
(``anon-`` and 128 random bits, returned in the answer's ``agentrl.session``). Every sampled choice is recorded
(`agentrl.serve.sessions.Recorder`); ``GET /agentrl/sessions/<session>`` returns the session's drift report.

The engines sample whole replies (no token-by-token streaming out of the engine), so a streamed answer is sent as
server-sent events once the reply is sampled: the same chunks an OpenAI stream has (role, content pieces, tool-call
deltas, the finish reason, usage when asked), with no earlier first token.

uvicorn serves it (FastAPI routes, a listen backlog of 2048), behind the HTTP guard the env server shares
(`agentrl.http_guard`); each call's blocking work (parsing, rendering, waiting on the engine thread,
`agentrl.serve.engine_client.EngineClient`, which batches concurrent calls) runs on a thread pool, so calls are
served concurrently and ``/health`` answers while the engine is busy.

What a client can and cannot do:

* **Bind and token.** It binds 127.0.0.1 by default. With a token (``--token`` or ``AGENTRL_SERVE_TOKEN``), every
  route but ``GET /health`` needs ``Authorization: Bearer TOKEN`` (the official client's ``api_key``), drift reports
  included; the server refuses to bind anything but loopback without one. Without a token, any process on this
  machine can call it, and read or write any session whose id it knows.
* **Sessions.** With a token, only its holders read or write sessions, by any id. Named sessions (path or header)
  are as secret as their names: anyone allowed to call the server who knows a name can add calls to that session
  and read its report; anonymous ids cannot be guessed. Agent runs (`agentrl.rollout.agents`) give every episode a
  session id with a random part, refuse calls to sessions that are not running, and refuse anonymous calls.
* **Requests.** Hosts other than this server's names are refused (DNS rebinding), as are cross-site ``Origin``
  headers, malformed or over-long ``Content-Length`` and bodies over the limit (`agentrl.http_guard`). Every
  sampling setting is checked finite and in range, token ids against the vocabulary, nesting depth, and the prompt's
  characters before it is tokenized (`agentrl.serve.protocol`); a bad value is a 400 in OpenAI's error shape naming
  the parameter. Answers are strict JSON, never ``NaN``.
* **Memory.** The recorder keeps at most ``max_sessions`` sessions and ``max_bytes`` of records, each session at
  most ``max_calls_per_session`` calls; older sessions are evicted to the record file (or counted and logged when
  there is none), and ``/health`` reports the counts.
* **Cannot**: run anything but the policy on its prompts, read files, choose the engine's settings beyond the
  sampling parameters (in training, the run's sampling replaces them), or see other processes' data.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import secrets
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response, StreamingResponse

from agentrl.engine.base import EngineResult, SamplingParams
from agentrl.http_guard import HttpLimits, check_bind
from agentrl.http_server import RunningServer
from agentrl.http_server import start_server as start_http
from agentrl.serve.engine_client import EngineClient
from agentrl.serve.protocol import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    RequestLimits,
    decode_body,
    dump_json,
    parse_chat_request,
    parse_completion_request,
)
from agentrl.serve.sessions import CallRecord, Prepared, PromptTooLong, Recorder, SessionFull

__all__ = ["PolicyServer", "ServerStartError", "start_server", "session_url", "build_app", "SESSION_HEADER",
           "TOKEN_ENV_VAR", "MAX_SESSION_CHARS"]

_logger = logging.getLogger(__name__)

SESSION_HEADER = "X-Session-Id"
"""The header naming a call's session (the ``/s/<session>`` path prefix does the same)."""
TOKEN_ENV_VAR = "AGENTRL_SERVE_TOKEN"
"""The environment variable ``agentrl serve`` reads its bearer token from (as ``--token``)."""
MAX_SESSION_CHARS = 256
"""Longest session id a client may name."""
_STREAM_PIECE = 16  # characters of content per streamed chunk


class ServerStartError(RuntimeError):
    """The server cannot start (a wider bind without a token, a port taken); the message names the fix."""


@dataclass(frozen=True)
class _Choice:
    record: CallRecord
    tool_calls: tuple[dict[str, Any], ...]
    finish_reason: str


class PolicyServer:
    """What the HTTP handlers call: checks a body, renders, samples, records and shapes the answer.

    Args:
        client: the engine.
        recorder: renders and records per session.
        model_name: the name answered in ``model`` and ``/v1/models``.
        defaults: sampling settings for what a request leaves out.
        max_context_tokens: the longest prompt + reply a call may reach.
        forced_sampling: training: these settings replace the request's temperature / top-p / top-k / min-p and
            penalties, and cap its max_tokens, so the policy trained is the one configured (None: requests decide).
        session_gate: ``session -> reason or None``: refuses calls to sessions that are closed (agent runs).
        record_path: append every record as a JSON line here (None: keep them in memory only); sessions the
            recorder evicts over its caps are then already on disk.
        on_record: called with every record (agent runs count calls per session).
        chars_per_token: a prompt may hold at most ``max_context_tokens * chars_per_token`` characters, checked
            before anything is tokenized (generous: text averages about 4 characters a token).
        anonymous: serve calls that name no session (each its own session, with an unguessable id); agent runs,
            whose every call names its episode's session, refuse them.
        engine_kind: the engine's kind (``hf``, ``vllm``), for what ``agentrl serve`` says when it starts.
    """

    def __init__(self, client: EngineClient, recorder: Recorder, model_name: str, *, defaults: SamplingParams,
                 max_context_tokens: int = 4096, forced_sampling: SamplingParams | None = None,
                 session_gate: Callable[[str], str | None] | None = None, record_path: str | Path | None = None,
                 on_record: Callable[[CallRecord], None] | None = None, chars_per_token: int = 32,
                 anonymous: bool = True, engine_kind: str = ""):
        if max_context_tokens < 2 or chars_per_token < 1:
            raise ValueError(f"max_context_tokens must be >= 2 and chars_per_token >= 1, got {max_context_tokens}, "
                             f"{chars_per_token}")
        self.client, self.recorder, self.model_name = client, recorder, model_name
        self.defaults, self.max_context_tokens = defaults, max_context_tokens
        self.forced_sampling, self.session_gate = forced_sampling, session_gate
        self.record_path = Path(record_path) if record_path else None
        if self.record_path is not None:
            recorder.saved_to = self.record_path  # every record is on disk as made: eviction loses nothing
        self.on_record = on_record
        self.anonymous = anonymous
        self.engine_kind = engine_kind
        self.limits = RequestLimits(max_new_tokens=max_context_tokens, vocab_size=len(recorder.renderer.tokenizer),
                                    max_prompt_chars=max_context_tokens * chars_per_token,
                                    max_prompt_tokens=max_context_tokens, max_messages=max_context_tokens)
        self._write_lock = threading.Lock()

    # ---- shared steps --------------------------------------------------------------------------------------------

    def _session(self, session: str | None) -> str:
        if session is None:
            if not self.anonymous:
                raise ApiError("this server serves named sessions only: use the base_url you were given "
                               "(/s/<session>/v1)", status=403, code="session_required")
            return self.recorder.anonymous()
        if not 0 < len(session) <= MAX_SESSION_CHARS or not session.isprintable():
            raise ApiError(f"a session id must be 1 to {MAX_SESSION_CHARS} printable characters", param="session")
        if self.session_gate is not None:
            reason = self.session_gate(session)
            if reason is not None:
                raise ApiError(reason, status=409, code="session_closed")
        return session

    def _params(self, sampling: SamplingParams, session: str, call: int) -> SamplingParams:
        forced = self.forced_sampling
        if forced is None:
            return sampling
        seed = forced.seed
        if seed is not None:  # a seed per session and call: episodes of one task must not sample alike
            seed = (seed + 7919 * call + 104729 * zlib.crc32(session.encode())) % 2**63
        return dataclasses.replace(forced, max_new_tokens=min(sampling.max_new_tokens, forced.max_new_tokens),
                                   stop=sampling.stop, seed=seed)

    def _sample(self, session: str, prepared: Prepared, params: SamplingParams, n: int) -> list[EngineResult]:
        if len(prepared.prompt_ids) + params.max_new_tokens > self.max_context_tokens:
            raise ApiError(f"the prompt is {len(prepared.prompt_ids)} tokens and max_tokens {params.max_new_tokens}: "
                           f"together more than this server's context of {self.max_context_tokens} tokens; shorten "
                           f"the conversation or lower max_tokens", param="messages", code="context_length_exceeded")
        engine_session = zlib.crc32(session.encode())  # replicas keep a session on one prefix cache
        futures = [self.client.generate(prepared.prompt_ids, params if params.seed is None or n == 1
                                        else dataclasses.replace(params, seed=params.seed + i), engine_session)
                   for i in range(n)]
        try:
            results = [f.result() for f in futures]
        except Exception as e:  # the engine's failure, said as a server error (never a traceback)
            raise ApiError(f"the engine failed: {type(e).__name__}: {e}", status=500, type_="server_error") from None
        for r in results:  # never record, nor send, a NaN / infinite log-prob (it is not JSON, nor a usable mu)
            if not all(math.isfinite(lp) for lp in r.generation.logprobs):
                raise ApiError("the engine returned a non-finite log-prob for this call; it was not recorded "
                               "(check the sampling settings and the model's weights)", status=500,
                               type_="server_error", code="non_finite")
        return results

    def _keep(self, rec: CallRecord) -> None:
        if self.record_path is not None:
            line = json.dumps(rec.to_json(), ensure_ascii=False, allow_nan=False) + "\n"
            with self._write_lock, open(self.record_path, "a") as f:
                f.write(line)
        if self.on_record is not None:
            self.on_record(rec)

    def _next_call(self, session: str) -> int:
        try:
            return self.recorder.next_call(session)
        except SessionFull as e:
            raise ApiError(str(e), param="session", code="session_full") from None

    # ---- chat ----------------------------------------------------------------------------------------------------

    def chat(self, body: Any, session: str | None) -> tuple[ChatRequest, list[_Choice], int, str]:
        """Sample a chat call; returns (request, choices, prompt tokens, session)."""
        request = parse_chat_request(body, self.defaults, self.limits)
        session = self._session(session)
        call = self._next_call(session)
        try:
            prepared = self.recorder.prepare_chat(session, request.messages, request.tools,
                                                  max_chars=self.limits.max_prompt_chars)
        except PromptTooLong as e:
            raise ApiError(str(e), param="messages", code="context_length_exceeded") from None
        except Exception as e:  # the template refused the conversation (e.g. a role order it raises on)
            raise ApiError(f"the chat template cannot render these messages: {str(e)[:500]}",
                           param="messages") from None
        results = self._sample(session, prepared, self._params(request.sampling, session, call), request.n)
        choices = []
        for i, result in enumerate(results):
            gen = result.generation
            parsed = self.recorder.renderer.parse(gen.token_ids, prepared.prompt_text)
            finish = "tool_calls" if parsed.tool_calls and gen.finish_reason == "stop" else gen.finish_reason
            rec = self.recorder.record(session, prepared, gen.token_ids, gen.logprobs, finish, result.policy_version,
                                       choice=i, call=call, parsed=parsed)
            self._keep(rec)
            calls = tuple({"id": f"call_{secrets.token_hex(8)}", "type": "function",
                           "function": {"name": c.name, "arguments": c.arguments if isinstance(c.arguments, str)
                                        else json.dumps(c.arguments, ensure_ascii=False)}}
                          for c in parsed.tool_calls)
            choices.append(_Choice(rec, calls, finish))
        return request, choices, len(prepared.prompt_ids), session

    def _message(self, choice: _Choice) -> dict[str, Any]:
        rec = choice.record
        message: dict[str, Any] = {"role": "assistant", "content": rec.content if rec.content or not choice.tool_calls
                                   else None}
        reasoning = rec.reply.get("reasoning_content")
        if reasoning:
            message["reasoning_content"] = reasoning
        if choice.tool_calls:
            message["tool_calls"] = list(choice.tool_calls)
        return message

    def _token_logprobs(self, rec: CallRecord) -> list[dict[str, Any]]:
        tok = self.recorder.renderer.tokenizer
        out = []
        for token_id, logprob in zip(rec.generated_ids, rec.logprobs):
            text = tok.decode([token_id], skip_special_tokens=False)
            out.append({"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8")), "top_logprobs": []})
        return out

    def chat_response(self, request: ChatRequest, choices: list[_Choice], prompt_tokens: int,
                      session: str) -> dict[str, Any]:
        """The ``chat.completion`` object."""
        completion = sum(len(c.record.generated_ids) for c in choices)
        return {
            "id": f"chatcmpl-{secrets.token_hex(12)}", "object": "chat.completion", "created": int(time.time()),
            "model": self.model_name, "system_fingerprint": f"agentrl-v{choices[0].record.policy_version}",
            "choices": [{"index": i, "message": self._message(c), "finish_reason": c.finish_reason,
                         "logprobs": {"content": self._token_logprobs(c.record)} if request.logprobs else None}
                        for i, c in enumerate(choices)],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                      "total_tokens": prompt_tokens + completion},
            "agentrl": {"session": session, "call": choices[0].record.call,
                        "policy_version": choices[0].record.policy_version,
                        "drift": choices[0].record.drift},
        }

    def chat_chunks(self, request: ChatRequest, choices: list[_Choice], prompt_tokens: int,
                    session: str) -> Iterator[dict[str, Any]]:
        """The ``chat.completion.chunk`` objects of a streamed answer."""
        head = {"id": f"chatcmpl-{secrets.token_hex(12)}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": self.model_name,
                "system_fingerprint": f"agentrl-v{choices[0].record.policy_version}"}

        def chunk(i: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
            return head | {"choices": [{"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}

        for i, c in enumerate(choices):
            message = self._message(c)
            yield chunk(i, {"role": "assistant", "content": ""},
                        logprobs={"content": self._token_logprobs(c.record)} if request.logprobs else None)
            if message.get("reasoning_content"):
                yield chunk(i, {"reasoning_content": message["reasoning_content"]})
            content = message.get("content") or ""
            for start in range(0, len(content), _STREAM_PIECE):
                yield chunk(i, {"content": content[start: start + _STREAM_PIECE]})
            for j, call in enumerate(c.tool_calls):
                yield chunk(i, {"tool_calls": [{"index": j, "id": call["id"], "type": "function",
                                                "function": {"name": call["function"]["name"], "arguments": ""}}]})
                yield chunk(i, {"tool_calls": [{"index": j, "function": {"arguments": call["function"]["arguments"]}}]})
            yield chunk(i, {}, finish=c.finish_reason)
        if request.include_usage:
            completion = sum(len(c.record.generated_ids) for c in choices)
            yield head | {"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                                                   "total_tokens": prompt_tokens + completion}}

    # ---- completions ---------------------------------------------------------------------------------------------

    def completion(self, body: Any, session: str | None) -> tuple[CompletionRequest, list[CallRecord], int]:
        """Sample a completions call; returns (request, records, prompt tokens)."""
        request = parse_completion_request(body, self.defaults, self.limits)  # ids checked against the vocabulary
        session = self._session(session)
        call = self._next_call(session)
        prepared = self.recorder.prepare_completion(session, request.prompt)
        results = self._sample(session, prepared, self._params(request.sampling, session, call), request.n)
        records = []
        for i, result in enumerate(results):
            gen = result.generation
            rec = self.recorder.record(session, prepared, gen.token_ids, gen.logprobs, gen.finish_reason,
                                       result.policy_version, choice=i, call=call)
            self._keep(rec)
            records.append(rec)
        return request, records, len(prepared.prompt_ids)

    def completion_response(self, request: CompletionRequest, records: list[CallRecord],
                            prompt_tokens: int) -> dict[str, Any]:
        """The ``text_completion`` object."""
        tok = self.recorder.renderer.tokenizer
        choices = []
        for i, rec in enumerate(records):
            logprobs = None
            if request.logprobs:
                tokens = [tok.decode([t], skip_special_tokens=False) for t in rec.generated_ids]
                offsets = [sum(len(t) for t in tokens[:k]) for k in range(len(tokens))]
                logprobs = {"tokens": tokens, "token_logprobs": list(rec.logprobs), "top_logprobs": None,
                            "text_offset": offsets}
            choices.append({"index": i, "text": tok.decode(list(rec.generated_ids), skip_special_tokens=True),
                            "logprobs": logprobs, "finish_reason": rec.finish_reason})
        completion = sum(len(r.generated_ids) for r in records)
        return {"id": f"cmpl-{secrets.token_hex(12)}", "object": "text_completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                          "total_tokens": prompt_tokens + completion}}

    def health(self) -> dict[str, Any]:
        """``/health``: status, the engine's policy version and the recorder's counters (no session ids)."""
        rec = self.recorder
        return {"status": "ok", "policy_version": self.client.policy_version, "sessions": len(rec.sessions()),
                "bytes_kept": rec.bytes_kept, "max_bytes": rec.max_bytes, "sessions_evicted": rec.evicted,
                "sessions_evicted_unsaved": rec.evicted_unsaved}

    def models(self) -> dict[str, Any]:
        """The ``/v1/models`` list: the one policy."""
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                            "owned_by": "agentrl"}]}

    def close(self) -> None:
        """Close the engine client (and the engine, when the client owns it)."""
        self.client.close()


_CODES = {400: "invalid_request", 401: "invalid_api_key", 403: "forbidden", 404: "not_found", 405: "not_found",
          408: "timeout", 413: "request_too_large", 421: "misdirected_request", 431: "request_too_large"}


def openai_error(status: int, message: str) -> dict[str, Any]:
    """A refusal by the HTTP guard, in OpenAI's error shape (what the official client reads)."""
    kind = "server_error" if status >= 500 else "authentication_error" if status == 401 else "invalid_request_error"
    return ApiError(message, status=status, type_=kind, code=_CODES.get(status)).body()


def _json(payload: Any, status: int = 200) -> Response:
    try:
        data = dump_json(payload)
    except ApiError as e:  # a NaN in an answer: said as an error, never sent
        status, data = e.status, dump_json(e.body())
    return Response(data, status_code=status, media_type="application/json")


def _error(e: ApiError) -> Response:
    return _json(e.body(), e.status)


def _sse(chunks: Iterator[dict[str, Any]]) -> StreamingResponse:
    """Server-sent events of `chunks`, every one encoded (strict JSON) before the first byte is sent."""
    pieces = [b"data: " + dump_json(c) + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]

    async def events() -> Any:
        for piece in pieces:
            yield piece

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _not_json(request: Request) -> Response | None:
    """A 415 unless the request says its body is JSON.

    A web page may send a "simple" POST (text/plain, form data) to any address without a CORS preflight; requiring
    ``Content-Type: application/json`` (every OpenAI client sends it) keeps such pages from spending the policy.
    """
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/json":
        return None
    return _error(ApiError(f"the body must be JSON sent with Content-Type: application/json, got "
                           f"{kind[:80] or 'no Content-Type'!r}", status=415, code="unsupported_media_type"))


def _answer(policy: PolicyServer, kind: str, raw: bytes, session: str | None) -> Response:
    """One POST, start to end (on a worker thread): body -> checked request -> sampled, recorded -> response."""
    try:
        body = decode_body(raw)
        if kind == "chat":
            request, choices, prompt_tokens, session = policy.chat(body, session)
            if request.stream:
                return _sse(policy.chat_chunks(request, choices, prompt_tokens, session))
            return _json(policy.chat_response(request, choices, prompt_tokens, session))
        request, records, prompt_tokens = policy.completion(body, session)
        response = policy.completion_response(request, records, prompt_tokens)
        return _sse(iter([response])) if request.stream else _json(response)
    except ApiError as e:
        return _error(e)
    except Exception as e:  # a bug here must still answer in the API's shape, never a traceback
        _logger.exception("agentrl serve: internal error")
        return _error(ApiError(f"internal error ({type(e).__name__}); the server log has the details", status=500,
                               type_="server_error"))


def build_app(policy: PolicyServer, *, threads: int = 64) -> FastAPI:
    """The FastAPI app serving `policy` (unguarded: `start_server` wraps it in `agentrl.http_guard.HttpGuard`).

    Args:
        policy: what the routes call.
        threads: worker threads for the blocking part of calls (parsing, rendering, waiting on the engine): the
            most calls in flight at once; more wait for a thread.
    """
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="agentrl-serve")
    app = FastAPI(title="agentrl serve", docs_url=None, redoc_url=None)
    app.state.pool = pool

    async def off_loop(fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Any:
        if exc.status_code in (404, 405):
            return _error(ApiError(f"no such route: {request.method} {request.url.path[:200]}", status=404,
                                   code="not_found"))
        return _error(ApiError(str(exc.detail), status=exc.status_code))

    @app.get("/health")
    async def health() -> Any:
        return _json(policy.health())

    def session_of(request: Request) -> str | None:
        return request.path_params.get("session") or request.headers.get(SESSION_HEADER)

    async def models(request: Request) -> Any:
        return _json(policy.models())

    async def chat(request: Request) -> Any:
        if (refused := _not_json(request)) is not None:
            return refused
        raw = await request.body()
        return await off_loop(_answer, policy, "chat", raw, session_of(request))

    async def completions(request: Request) -> Any:
        if (refused := _not_json(request)) is not None:
            return refused
        raw = await request.body()
        return await off_loop(_answer, policy, "completion", raw, session_of(request))

    for prefix in ("", "/s/{session}"):
        for base in ("/v1", ""):
            app.add_api_route(f"{prefix}{base}/models", models, methods=["GET"])
            app.add_api_route(f"{prefix}{base}/chat/completions", chat, methods=["POST"])
            app.add_api_route(f"{prefix}{base}/completions", completions, methods=["POST"])

    @app.get("/agentrl/sessions/{session}")
    async def report(session: str) -> Any:
        log = policy.recorder.find(session)
        if log is None:
            return _error(ApiError(f"no session {session[:MAX_SESSION_CHARS]!r}", status=404, code="not_found"))
        return _json(await off_loop(lambda: log.report().to_json()))

    return app


def session_url(address: str, session: str) -> str:
    """The base URL an agent uses so that its calls land in `session`.

    Args:
        address: the server's ``http://host:port`` (`agentrl.http_server.RunningServer.address`).
        session: the session id.
    """
    return f"{address}/s/{session}/v1"


def start_server(policy: PolicyServer, host: str = "127.0.0.1", port: int = 0, *, token: str = "",
                 extra_hosts: Iterable[str] = (), limits: HttpLimits | None = None,
                 threads: int = 64) -> RunningServer[PolicyServer]:
    """Serve `policy` on a background thread (port 0 picks a free one); returns once it answers ``/health``.

    The `agentrl.http_server.RunningServer` returned has the OpenAI base URL (``http://host:port/v1``) as `url`
    and `policy` as `server`; `stop` stops serving, `close` closes the engine client too.

    Args:
        policy: the policy server.
        host: the address to bind; anything but loopback needs `token`.
        port: the port (0: a free one).
        token: the bearer token every route but ``/health`` needs ("" : none, loopback only).
        extra_hosts: ``Host`` names to answer besides the bound ones (`agentrl.http_guard.allowed_hosts`).
        limits: HTTP limits (default: a body cap of 8 bytes per prompt character allowed, at least 4 MiB).
        threads: worker threads for calls in flight (`build_app`).

    Raises:
        ServerStartError: a wider bind without a token, an address that cannot be bound, uvicorn not starting.
    """
    check_bind(host, token, token_flag="--token", env_var=TOKEN_ENV_VAR, error=ServerStartError)
    if limits is None:
        limits = HttpLimits(max_body_bytes=max(4 * 2**20, 8 * (policy.limits.max_prompt_chars or 0)))
    app = build_app(policy, threads=threads)
    pool: ThreadPoolExecutor = app.state.pool
    return start_http(app, host, port, server=policy, path="/v1", limits=limits, token=token,
                      extra_hosts=extra_hosts, open_paths=("/health",), error_body=openai_error,
                      on_stop=(lambda: pool.shutdown(wait=False, cancel_futures=True),), error=ServerStartError,
                      name="agentrl-serve")
