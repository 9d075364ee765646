"""``agentrl serve``: a model behind the OpenAI-compatible endpoint, every call recorded (see `agentrl.serve`).

The engine is planned and built as training and evaluation do it (`agentrl.engine.plan` / `build_engines`:
the HF engine, vLLM's CPU build, or engine actors); prompts are rendered with the model family's official template.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.config import ContextConfig, EngineConfig

__all__ = ["ServeConfig", "ServeError", "open_server", "serve"]


class ServeError(RuntimeError):
    """The server cannot start; the message names the cause and the fix."""


@dataclass(frozen=True)
class ServeConfig:
    """What `agentrl serve` runs: RL's `engine` and `context` sections, and the server's own settings.

    Every field is a flag of ``agentrl serve`` (`agentrl.cli.flags`): ``--port``, ``--context.chat-family``, ...
    """

    model: str
    """A built-in (smollm2-135m, tiny-qwen3), a run's ``checkpoint/`` folder, or a hub id."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """The engine kind (``auto``: vLLM where it serves the model), replicas, precision and batch size."""
    context: ContextConfig = field(default_factory=ContextConfig)
    """The chat family (empty: detected), the thinking switch and the longest prompt + reply per call."""
    host: str = "127.0.0.1"
    """Address to bind (127.0.0.1: only this machine can call it); any other needs `token`."""
    port: int = 8000
    """Port to listen on (0 picks a free one)."""
    max_tokens: int = 256
    """New tokens a call gets when it does not say (the most it may ask for is the context)."""
    temperature: float = 1.0
    """Temperature a call gets when it does not say (OpenAI's default, 1.0)."""
    top_p: float = 1.0
    """Top-p a call gets when it does not say."""
    seed: int = 0
    """The engine's seed (requests may carry their own)."""
    record: str = ""
    """Append every sampled choice as a JSON line to this file ("": in memory only; sessions evicted over the caps
    below are then written to ``runs/serve-<time>/evicted_sessions.jsonl``, never dropped)."""
    token: str = field(default="", metadata={"envvar": "AGENTRL_SERVE_TOKEN"})  # agentrl.serve.server.TOKEN_ENV_VAR
    """Bearer token clients must send as their API key, on every call but ``/health`` (env var
    AGENTRL_SERVE_TOKEN); "" for none (loopback only)."""
    allowed_hosts: tuple[str, ...] = ()
    """Another name clients may call the server by in the ``Host`` header, e.g. a reverse proxy's (repeatable;
    loopback names, or the bound name, always pass; ``*`` allows any)."""
    max_sessions: int = 10_000
    """Sessions kept in memory; the least recently used are evicted past it (`record` keeps them on disk)."""
    max_session_calls: int = 1_000
    """Calls one session may make (its next call gets a 400)."""
    max_memory_mib: int = 1024
    """MiB of recorded calls kept in memory (estimated); the least recently used sessions are evicted past it."""

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
        The `agentrl.http_server.RunningServer` serving the `agentrl.serve.server.PolicyServer` (its `close` stops it
        and closes the engine).

    Raises:
        ServeError: an engine that cannot serve the model, a port in use.
    """
    import torch

    from agentrl.engine import build_engines
    from agentrl.engine.base import EngineError, SamplingParams  # here: `agentrl serve --help` imports no engine
    from agentrl.engine.plan import plan_engine
    from agentrl.models import load_model
    from agentrl.serve.engine_client import EngineClient
    from agentrl.serve.server import PolicyServer, ServerStartError, start_server
    from agentrl.serve.sessions import Recorder, Renderer

    torch.manual_seed(cfg.seed)
    policy = policy or load_model(cfg.model)
    # A server's load is not known when it starts: its KV memory is engine.kv_cache_gib, else a fixed default.
    plan = plan_engine(cfg.engine, policy, cfg.model, episodes_in_flight=None,
                       max_model_len=cfg.context.max_context_tokens)
    try:
        engine = build_engines(plan.spec(cfg.engine, seed=cfg.seed), policy, replicas=cfg.engine.replicas,
                               share_module=True)
    except EngineError as e:
        raise ServeError(str(e)) from None
    client = EngineClient(engine)
    renderer = Renderer(policy.tokenizer, cfg.context.chat_family or None, family_hint=policy.family,
                        chat_kwargs=cfg.context.chat_kwargs())
    defaults = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_tokens)
    recorder = Recorder(renderer, max_sessions=cfg.max_sessions, max_calls_per_session=cfg.max_session_calls,
                        max_bytes=cfg.max_memory_mib * 2**20, spill_path=None if cfg.record else evicted_path())
    server = PolicyServer(client, recorder, cfg.model, defaults=defaults,
                          max_context_tokens=cfg.context.max_context_tokens, record_path=cfg.record or None,
                          engine_kind=plan.kind)
    try:
        running = start_server(server, cfg.host, cfg.port, token=cfg.token, extra_hosts=cfg.allowed_hosts)
    except ServerStartError as e:
        client.close()
        raise ServeError(str(e)) from None
    return running


def serve(cfg: ServeConfig, *, say=print) -> None:
    """Serve until Ctrl-C."""
    import threading

    running = open_server(cfg)
    policy = running.server
    say(f"agentrl serve: {cfg.model} ({policy.engine_kind} engine, {policy.recorder.renderer.family_name} "
        f"template) at {running.url}; sessions: {running.address}/s/<session>/v1 or the X-Session-Id header"
        + (f"; recording to {Path(cfg.record)}" if cfg.record
           else f"; sessions evicted over the caps go to {policy.recorder.spill_path}")
        + ("; bearer token required" if cfg.token else ""))
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        running.close()
