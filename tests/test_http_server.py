"""The one HTTP stack (`agentrl.http_server`): each of agentrl's three servers starts, answers, is guarded, and stops.

The servers: the env server (`agentrl.envs.server`, serving math), ``agentrl serve`` (`agentrl.serve.server`, a fake
engine behind the real template and tokenizer) and WebShop's pages (`agentrl.envs.webshop.server`, a small catalog).
Each starts through `agentrl.http_server.start_server`, answers its ``/health`` route, refuses a foreign ``Host``
(the guard every server gets), and frees its port when stopped. Then ``agentrl serve``'s stream is read by the
official client chunk by chunk. The servers' own behaviour is tested in tests/test_env_serve.py, tests/test_serve.py
and their hardening and fuzz suites.
"""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import pytest

from agentrl.engine.base import EngineResult, Generation, SamplingParams
from agentrl.http_guard import bind_socket
from agentrl.http_server import RunningServer, start_server

REPLY = "The answer is four, as two plus two makes four in every base above four.<|im_end|>"


class Echo:
    """A fake engine: every request answered with `REPLY` (tokenized), log-prob -0.5 a token."""

    def __init__(self, tokenizer):
        self.ids = tuple(tokenizer(REPLY, add_special_tokens=False)["input_ids"])
        self.pending, self.policy_version = [], 0

    def submit(self, request):
        self.pending.append(request)

    def poll(self, timeout=None):
        out = [EngineResult(r.id, Generation(self.ids, (-0.5,) * len(self.ids), "stop"), 0) for r in self.pending]
        self.pending = []
        return out

    def update_weights(self, named_tensors, version):
        self.policy_version = version

    def metrics(self):
        return {}

    def clear_cache(self):
        pass

    def close(self):
        pass


def _policy_server(tokenizer) -> RunningServer:
    from agentrl.serve.engine_client import EngineClient
    from agentrl.serve.server import PolicyServer
    from agentrl.serve.server import start_server as start_policy_server
    from agentrl.serve.sessions import Recorder, Renderer

    policy = PolicyServer(EngineClient(Echo(tokenizer)), Recorder(Renderer(tokenizer, family_hint="qwen3")), "m",
                          defaults=SamplingParams(max_new_tokens=64), max_context_tokens=2048)
    return start_policy_server(policy)


def _start(kind: str, tokenizer, tmp_path) -> RunningServer:
    if kind == "env":
        from agentrl.envs.server import ServeSettings
        from agentrl.envs.server import start_server as start_env_server

        return start_env_server(ServeSettings("math", port=0))
    if kind == "openai":
        return _policy_server(tokenizer)
    from agentrl.envs.webshop.server import start_server as start_webshop_server

    return start_webshop_server(num_products=50, seed=1, cache_dir=str(tmp_path))


HEALTH = {"env": ("healthy", "/math"), "openai": ("ok", "/v1"), "webshop": ("ok", "")}


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.mark.parametrize("kind", ["env", "openai", "webshop"])
def test_each_server_starts_answers_health_is_guarded_and_frees_its_port(kind, qwen3_tokenizer, tmp_path):
    running = _start(kind, qwen3_tokenizer, tmp_path)
    status, path = HEALTH[kind]
    try:
        assert type(running) is RunningServer and running.thread is not None and running.thread.is_alive()
        assert running.url == f"http://127.0.0.1:{running.port}{path}" and running.address + path == running.url
        assert running.health()["status"] == status
        answer = httpx.get(f"{running.address}/health")
        assert answer.status_code == 200 and answer.json()["status"] == status
        # The guard the helper puts in front of every server: a DNS-rebinding Host is refused before any route.
        foreign = httpx.get(f"{running.address}/health", headers={"Host": "rebind.example"})
        assert foreign.status_code == 421 and "rebind.example" in foreign.text
    finally:
        running.stop()
    assert not running.thread.is_alive()
    assert _refused(running.port), "nothing listens on the port after stop"
    bind_socket("127.0.0.1", running.port).close()  # and it can be bound again at once
    running.stop()  # idempotent


def test_a_taken_port_is_the_callers_error_and_its_cleanups_run():
    class Taken(Exception):
        pass

    cleaned = []
    with bind_socket("127.0.0.1", 0) as held:
        port = held.getsockname()[1]
        with pytest.raises(Taken, match=f"cannot bind 127.0.0.1:{port}"):
            start_server(lambda scope, receive, send: None, "127.0.0.1", port, error=Taken,
                         on_stop=(lambda: cleaned.append(True),))
    assert cleaned == [True]


def test_the_openai_stream_reaches_the_official_client_chunk_by_chunk(qwen3_tokenizer, monkeypatch):
    """The engine samples whole replies, so the server has every chunk at once; here they are paced out 50 ms apart,
    and the client must see the first one before the server sends the last: nothing on the way (the guard, uvicorn,
    the helper) holds the body back until it ends."""
    openai = pytest.importorskip("openai")
    from starlette.responses import StreamingResponse

    from agentrl.serve import server as serve_module

    sent: list[float] = []

    class Paced(StreamingResponse):
        def __init__(self, content, *args, **kwargs):
            async def paced():
                async for piece in content:
                    sent.append(time.monotonic())
                    yield piece
                    await asyncio.sleep(0.05)

            super().__init__(paced(), *args, **kwargs)

    monkeypatch.setattr(serve_module, "StreamingResponse", Paced)
    running = _policy_server(qwen3_tokenizer)
    try:
        client = openai.OpenAI(base_url=serve_module.session_url(running.address, "s"), api_key="unused",
                               max_retries=0)
        stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "2+2?"}],
                                                stream=True)
        chunks, arrived = [], []
        for chunk in stream:
            arrived.append(time.monotonic())
            chunks.append(chunk)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == running.server.recorder.session("s").records[0].content == REPLY.removesuffix("<|im_end|>")
        assert len(chunks) >= 5  # role, content pieces of 16 characters, finish
        assert arrived[0] < sent[-1], "the first chunk reached the client only after the server sent the last"
        assert arrived[-1] - arrived[0] > 0.05 * (len(chunks) - 2), "the chunks arrived together"
    finally:
        running.close()


def test_webshop_refuses_a_seed_int_cannot_read_with_a_400_not_a_traceback(tmp_path):
    """Unicode digits pass `str.isdigit` and 4,300+ digits exceed `int`'s limit: both must be a clear 400 page."""
    from agentrl.envs.webshop.server import start_server as start_webshop_server

    running = start_webshop_server(num_products=50, seed=1, cache_dir=str(tmp_path))
    try:
        for seed in ("%C2%B2", "9" * 5000, "-1", "x"):
            answer = httpx.get(f"{running.url}/?seed={seed}", follow_redirects=False)
            assert answer.status_code == 400 and "seed must be a non-negative integer" in answer.text, seed
        # The refused value is shown escaped (found in review: a link carrying a script ran it on this page).
        answer = httpx.get(f"{running.url}/?seed=%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E", follow_redirects=False)
        assert answer.status_code == 400 and "<img" not in answer.text and "&lt;img src=x" in answer.text
        assert httpx.get(f"{running.url}/?seed=3", follow_redirects=False).status_code == 303
    finally:
        running.stop()
