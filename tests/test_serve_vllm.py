"""`agentrl serve` on the vLLM engine (CPU build): the official client, logprobs and records, tiny-qwen3-h64."""

from __future__ import annotations

import os

import pytest

from agentrl.engine.vllm import vllm_available

_MISSING = vllm_available()
pytestmark = [pytest.mark.skipif(_MISSING is not None, reason=f"vLLM is not installed or not usable here "
                                 f"({_MISSING}); install it with the README's vLLM command"), pytest.mark.slow]
openai = pytest.importorskip("openai")

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def test_official_client_against_the_vllm_engine():
    import bm25s  # noqa: F401  (as tests/test_vllm.py: vLLM's start-up module scan must survive numba)

    from agentrl.config import ContextConfig, EngineConfig
    from agentrl.recipes.serve import ServeConfig, open_server
    from agentrl.serve.server import session_url

    running = open_server(ServeConfig(model="tiny-qwen3-h64", engine=EngineConfig(kind="vllm", kv_cache_gib=0.5),
                                      context=ContextConfig(max_context_tokens=1024), port=0, max_tokens=8))
    try:
        assert running.server.engine_kind == "vllm"
        client = openai.OpenAI(base_url=session_url(running.address, "v"), api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": "What is 2+2?"}]
        reply = client.chat.completions.create(model="m", messages=messages, logprobs=True, n=2, seed=5)
        records = running.server.recorder.session("v").records
        assert len(records) == 2 and sum(len(r.generated_ids) for r in records) == reply.usage.completion_tokens
        for choice, rec in zip(reply.choices, records):
            assert [t.logprob for t in choice.logprobs.content] == list(rec.logprobs)
        messages += [reply.choices[0].message, {"role": "user", "content": "Sure?"}]
        client.chat.completions.create(model="m", messages=messages)
        assert running.server.recorder.session("v").records[2].drift == "extends"
    finally:
        running.close()
