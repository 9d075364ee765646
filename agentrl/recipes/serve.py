"""``agentrl serve``: a model behind the OpenAI-compatible endpoint, every call recorded (see `agentrl.serve`).

The engine is built as training and evaluation build it (`agentrl.engine.launch.choose_engine` / `build_engines`:
the HF engine, vLLM's CPU build, or engine actors); prompts are rendered with the model family's official template.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.config import ContextConfig, EngineConfig
from agentrl.engine.base import EngineError, SamplingParams

__all__ = ["ServeConfig", "ServeError", "open_server", "serve"]


class ServeError(RuntimeError):
    """The server cannot start; the message names the cause and the fix."""


@dataclass(frozen=True)
class ServeConfig:
    """What `agentrl serve` runs.

    Attributes:
        model: built-in name, local folder (a run's ``checkpoint/``) or hub id.
        engine: the engine kind (``auto``: vLLM where it serves the model), replicas, precision, batch size.
        context: the chat family (empty: detected), thinking switch and the longest prompt + reply per call.
        host: the address to bind (127.0.0.1: only this machine can call it); any other needs `token`.
        port: the port (0 picks a free one).
        max_tokens: new tokens a call gets when it does not say (and the most it may ask for is the context).
        temperature: the default temperature (OpenAI's default, 1.0).
        top_p: the default top-p.
        seed: the engine's seed (requests may carry their own).
        record: append every sampled choice as a JSON line to this file ("": in memory only; sessions evicted over
            the caps below are then written to ``runs/serve-<time>/evicted_sessions.jsonl``, never dropped).
        token: bearer token every call but ``/health`` needs (the client's ``api_key``); "" for none (loopback only).
        allowed_hosts: more names the ``Host`` header may carry (a reverse proxy's; ``*``: any).
        max_sessions: sessions kept in memory; the least recently used are evicted past it.
        max_session_calls: calls one session may make (its next call gets a 400).
        max_memory_mib: MiB of records kept in memory (estimated); the least recently used sessions are evicted
            past it.
    """

    model: str
    engine: EngineConfig = field(default_factory=EngineConfig)
    context: ContextConfig = field(default_factory=ContextConfig)
    host: str = "127.0.0.1"
    port: int = 8000
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    record: str = ""
    token: str = ""
    allowed_hosts: tuple[str, ...] = ()
    max_sessions: int = 10_000
    max_session_calls: int = 1_000
    max_memory_mib: int = 1024

    def __post_init__(self) -> None:
        from agentrl.http_guard import check_bind
        from agentrl.serve.server import TOKEN_ENV_VAR

        if not 0 <= self.port <= 65535:
            raise ServeError(f"port must be in 0..65535 (0 picks a free one), got {self.port}")
        if self.max_tokens < 1:
            raise ServeError(f"max_tokens must be >= 1, got {self.max_tokens}")
        for name in ("max_sessions", "max_session_calls", "max_memory_mib"):
            if getattr(self, name) < 1:
                raise ServeError(f"{name} must be >= 1, got {getattr(self, name)}")
        check_bind(self.host, self.token, token_flag="--token", env_var=TOKEN_ENV_VAR, error=ServeError)


def evicted_path() -> Path:
    """Where a server without ``--record`` writes the sessions it evicts over its caps (made on the first eviction)."""
    return Path("runs") / f"serve-{time.strftime('%Y%m%d-%H%M%S')}" / "evicted_sessions.jsonl"


def open_server(cfg: ServeConfig, *, policy=None):
    """Load the model (unless `policy`, a `LoadedModel`, is given), build the engine and start serving.

    Returns:
        The `agentrl.serve.server.RunningServer` (its `stop` stops it; the engine is closed with it).

    Raises:
        ServeError: an engine that cannot serve the model, a port in use.
    """
    import torch

    from agentrl.engine import EngineSpec, build_engines
    from agentrl.engine.launch import choose_engine
    from agentrl.models import load_model
    from agentrl.serve.engine_client import EngineClient
    from agentrl.serve.server import PolicyServer, ServerStartError, start_server
    from agentrl.serve.sessions import Recorder, Renderer

    torch.manual_seed(cfg.seed)
    policy = policy or load_model(cfg.model)
    kind, _ = choose_engine(cfg.engine.kind, policy.model, cfg.model)
    dtype = cfg.engine.dtype or str(next(policy.model.parameters()).dtype).removeprefix("torch.")
    spec = EngineSpec(kind=kind, dtype=dtype, batch_size=cfg.engine.batch_size, seed=cfg.seed,
                      max_model_len=cfg.context.max_context_tokens, kv_cache_gib=cfg.engine.kv_cache_gib or 1.0,
                      vllm=cfg.engine.vllm)
    try:
        engine = build_engines(spec, policy, replicas=cfg.engine.replicas, share_module=True)
    except EngineError as e:
        raise ServeError(str(e)) from None
    client = EngineClient(engine)
    renderer = Renderer(policy.tokenizer, cfg.context.chat_family or None, family_hint=policy.family,
                        chat_kwargs=cfg.context.chat_kwargs())
    defaults = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_tokens)
    recorder = Recorder(renderer, max_sessions=cfg.max_sessions, max_calls_per_session=cfg.max_session_calls,
                        max_bytes=cfg.max_memory_mib * 2**20, spill_path=None if cfg.record else evicted_path())
    server = PolicyServer(client, recorder, cfg.model, defaults=defaults,
                          max_context_tokens=cfg.context.max_context_tokens, record_path=cfg.record or None)
    try:
        running = start_server(server, cfg.host, cfg.port, token=cfg.token, extra_hosts=cfg.allowed_hosts)
    except ServerStartError as e:
        client.close()
        raise ServeError(str(e)) from None
    running.engine_kind = kind
    return running


def serve(cfg: ServeConfig, *, say=print) -> None:
    """Serve until Ctrl-C."""
    import threading

    running = open_server(cfg)
    say(f"agentrl serve: {cfg.model} ({running.engine_kind} engine, {running.policy.recorder.renderer.family_name} "
        f"template) at {running.url}; sessions: {running.address}/s/<session>/v1 or the X-Session-Id header"
        + (f"; recording to {Path(cfg.record)}" if cfg.record
           else f"; sessions evicted over the caps go to {running.policy.recorder.spill_path}")
        + ("; bearer token required" if cfg.token else ""))
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        running.close()
