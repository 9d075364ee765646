"""Prefix reuse in the HF engine: the same tokens and log-probs as a full prefill, fewer tokens through the model.

Every check plays the same multi-turn conversation (token-in/token-out: each prompt is the previous prompt, the
reply and new tokens) through an engine that keeps prefixes and one that prefills every prompt in full (the plain
path), with the same seeds, and compares what they sample.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentrl.engine import HFEngine, SamplingParams
from agentrl.engine.hf import _similar_length_groups
from agentrl.engine.kv_cache import PrefixEntry, PrefixStore

# top-k keeps the sampled distributions peaked enough that float noise (1e-6) cannot move a draw across a token
# boundary: on a random-init model's near-uniform 151k-token distribution it could.
PARAMS = SamplingParams(temperature=1.0, top_k=20, max_new_tokens=6)
FIRST_LENGTHS = (5, 17, 40, 9)
EXTRA_LENGTHS = ((3, 11, 2, 30), (7, 1, 25, 4), (12, 6, 6, 1))


def play(engine: HFEngine, turns: int = 3, rewrite_at: int | None = None, between=None):
    """Play `turns` turns of 4 conversations; return every turn's generations and prompts."""
    g = torch.Generator().manual_seed(0)
    contexts = [torch.randint(10, 5000, (n,), generator=g).tolist() for n in FIRST_LENGTHS]
    history = []
    for turn in range(turns):
        gens = engine.generate(contexts, SamplingParams(**{**PARAMS.__dict__, "seed": turn,
                                                           "max_new_tokens": PARAMS.max_new_tokens + turn}))
        history.append((contexts, gens))
        extra = [torch.randint(10, 5000, (n,), generator=g).tolist() for n in EXTRA_LENGTHS[turn]]
        contexts = [c + list(x.token_ids) + e for c, x, e in zip(contexts, gens, extra)]
        if rewrite_at == turn:  # the template rewrote the history of conversation 2 (e.g. dropped a <think> span)
            contexts[2] = contexts[2][:3] + [7] + contexts[2][3:]
        if between is not None:
            between(turn)
    return history


def assert_same_samples(a, b):
    for (prompts_a, gens_a), (prompts_b, gens_b) in zip(a, b, strict=True):
        assert prompts_a == prompts_b
        for x, y in zip(gens_a, gens_b, strict=True):
            assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason
            np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-4)


@pytest.fixture(scope="module")
def plain_history(tiny_qwen3):
    return play(HFEngine(tiny_qwen3.model, tiny_qwen3.tokenizer, prefix_cache_bytes=0))


def test_reuse_gives_the_full_prefill_samples_and_prefills_only_new_tokens(tiny_qwen3, plain_history):
    engine = HFEngine(tiny_qwen3.model, tiny_qwen3.tokenizer)
    assert engine.reuse_prefixes
    history = play(engine)
    assert_same_samples(plain_history, history)
    # Turns 2 and 3 reuse everything before the reply's last token: prompt + reply - 1 per conversation.
    reused = sum(len(p) + len(g.token_ids) - 1 for prompts, gens in history[:2] for p, g in zip(prompts, gens))
    assert engine.reused_tokens == reused
    full = sum(len(p) for prompts, _ in history for p in prompts)
    assert engine.prefill_tokens == full - reused
    assert len(engine.prefix_cache) == len(FIRST_LENGTHS)  # superseded prefixes are not kept twice


def test_eviction_under_a_tiny_budget_keeps_results_exact(tiny_qwen3, plain_history):
    per_token = 2 * 2 * tiny_qwen3.model.config.num_key_value_heads * tiny_qwen3.model.config.head_dim * 4
    engine = HFEngine(tiny_qwen3.model, tiny_qwen3.tokenizer, prefix_cache_bytes=60 * per_token)
    history = play(engine)
    assert_same_samples(plain_history, history)
    assert engine.prefix_cache.evictions > 0 and engine.prefix_cache.nbytes <= 60 * per_token
    assert 0 < engine.reused_tokens  # the most recently kept conversations are still reused


def test_a_history_rewrite_prefills_in_full(tiny_qwen3):
    plain = play(HFEngine(tiny_qwen3.model, tiny_qwen3.tokenizer, prefix_cache_bytes=0), turns=2, rewrite_at=0)
    engine = HFEngine(tiny_qwen3.model, tiny_qwen3.tokenizer)
    history = play(engine, turns=2, rewrite_at=0)
    assert_same_samples(plain, history)
    (prompts, gens), (next_prompts, next_gens) = history
    reused = sum(len(p) + len(g.token_ids) - 1 for i, (p, g) in enumerate(zip(prompts, gens)) if i != 2)
    assert engine.reused_tokens == reused  # conversation 2 reused nothing
    rewritten = tuple(next_prompts[2]) + next_gens[2].token_ids  # its new sequence is kept from now on
    assert engine.prefix_cache.match(rewritten + (5,)).ids == rewritten[:-1]


def test_changed_weights_drop_the_cache(tiny_qwen3):
    model = tiny_qwen3.model
    saved = {k: v.clone() for k, v in model.state_dict().items()}

    def nudge(turn):  # an optimizer step in place, without telling the engine (it samples from this module)
        with torch.no_grad():
            model.lm_head.weight.add_(0.01 * torch.randn_like(model.lm_head.weight))

    try:
        torch.manual_seed(0)
        plain = play(HFEngine(model, tiny_qwen3.tokenizer, prefix_cache_bytes=0, share_module=True), turns=2,
                     between=nudge)
        model.load_state_dict(saved)
        torch.manual_seed(0)
        engine = HFEngine(model, tiny_qwen3.tokenizer, share_module=True)
        history = play(engine, turns=2, between=nudge)
        assert_same_samples(plain, history)
        assert engine.reused_tokens == 0
    finally:
        model.load_state_dict(saved)
    engine.generate([[1, 2, 3]], PARAMS)
    assert len(engine.prefix_cache) == 1
    engine.policy_version += 1  # what a weight sync does
    engine.generate([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]], PARAMS)
    assert engine.reused_tokens == 0
    engine.clear_cache()
    assert len(engine.prefix_cache) == 0 and engine.prefix_cache.nbytes == 0


def test_moe_routes_with_reuse_equal_the_full_prefill_routes():
    from agentrl.models import load_model

    moe = load_model("tiny-qwen3-moe")
    runs = []
    for budget in (0, 2**26):
        engine = HFEngine(moe.model, moe.tokenizer, capture_routes=True, prefix_cache_bytes=budget)
        runs.append(play(engine))
    assert_same_samples(*runs)
    assert engine.reused_tokens > 0
    for (prompts, plain_gens), (_, gens) in zip(*runs):
        for p, x, y in zip(prompts, plain_gens, gens):
            assert y.routed_experts.shape == (len(p) + len(y.token_ids) - 1, 2, 2)
            np.testing.assert_array_equal(np.sort(x.routed_experts, -1), np.sort(y.routed_experts, -1))


@pytest.mark.slow
def test_smollm2_reuse_gives_the_full_prefill_samples():
    from agentrl.models import load_model

    smol = load_model("smollm2-135m")
    plain = play(HFEngine(smol.model, smol.tokenizer, prefix_cache_bytes=0))
    engine = HFEngine(smol.model, smol.tokenizer)
    assert_same_samples(plain, play(engine))
    assert engine.reused_tokens > 0


def test_store_matches_the_longest_prefix_and_evicts_least_recent():
    def entry(ids):
        return PrefixEntry(tuple(ids), [torch.zeros(1, len(ids), 2)], [torch.zeros(1, len(ids), 2)])

    size = entry([1, 2]).nbytes  # 2 tokens x 2 x 4 bytes x (keys + values) = 32 bytes
    store = PrefixStore(budget_bytes=3 * size)
    store.add(entry([1, 2]))
    store.add(entry([1, 2, 3, 4]))  # 2 x size
    assert store.match([1, 2, 3, 4, 5]).ids == (1, 2, 3, 4)
    assert store.match([1, 2, 3]).ids == (1, 2)
    assert store.match([1, 9, 3, 4, 5]) is None  # equal lengths but other ids: never a match
    assert store.match([1, 2]).ids == (1, 2)  # equal to the prompt: the engine then feeds the last token again
    store.add(entry([5, 6]))  # over budget: the least recently used, [1, 2, 3, 4], goes
    assert store.match([1, 2, 3, 4, 5]).ids == (1, 2) and store.evictions == 1 and store.nbytes == 2 * size
    store.add(entry(range(10)))  # larger than the whole budget: not kept
    assert len(store) == 2


def test_prefill_groups_bound_padding():
    # [1,1] pad to 2 <= 1.25 x 2; adding 2 would pad to 6 > 5; [10,10] fits; 40 alone.
    assert _similar_length_groups([1, 1, 2, 10, 10, 40]) == [(0, 2), (2, 3), (3, 5), (5, 6)]
    assert _similar_length_groups([7]) == [(0, 1)]


def test_rollout_with_reuse_plays_the_same_episodes_and_frees_the_cache(tiny_qwen3):
    from agentrl.engine.requests import BatchedRequests
    from agentrl.rollout.loop import run_rollout
    from agentrl.rollout.pool import EnvMaker, LocalPool

    runs = []
    for budget in (0, 2**26):
        engine = HFEngine(tiny_qwen3.model, tiny_qwen3.tokenizer, prefix_cache_bytes=budget)
        pool = LocalPool(EnvMaker("math", {"level": 1, "mode": "multi", "max_turns": 3}), slots=4)
        result = run_rollout(pool, "math", [0, 1], 2, BatchedRequests(engine), tiny_qwen3.tokenizer,
                             SamplingParams(top_k=20, max_new_tokens=8, seed=0), max_turns=3)
        runs.append([[(t.prompt_ids, t.generated_ids) for t in traj.turns] for traj in result.trajectories])
    assert runs[0] == runs[1] and max(len(turns) for turns in runs[1]) == 3
    assert engine.reused_tokens > 0
    assert len(engine.prefix_cache) == 0  # the rollout's episodes are over: nothing kept into the training step


def test_engine_metrics_report_prefix_reuse_since_the_previous_call_under_the_shared_keys(tiny_qwen3):
    engine = HFEngine(tiny_qwen3.model, tiny_qwen3.tokenizer)
    assert engine.metrics() == {}
    first = engine.generate([[1, 2, 3, 4]], PARAMS)[0]
    m = engine.metrics()
    assert m["prefix_prompt_tokens"] == 4 and m["prefix_cached_tokens"] == 0 and m["prefix_cache_hit_rate"] == 0
    engine.generate([[1, 2, 3, 4, *first.token_ids, 5]], PARAMS)
    m = engine.metrics()  # the second prompt extends the first: everything but the new tokens was kept
    assert m["prefix_cached_tokens"] == engine.reused_tokens > 0
    assert m["prefix_prompt_tokens"] == 4 + len(first.token_ids) + 1
    assert engine.metrics() == {}


def test_kv_cache_is_sized_for_every_episode_in_flight():
    from transformers import LlamaConfig

    from agentrl.config import EngineConfig
    from agentrl.engine.kv_cache import kv_bytes_per_token, size_kv_cache
    from agentrl.engine.plan import SERVER_KV_GIB, kv_cache_gib

    # SmolLM2-135M's shape: 30 layers, 3 KV heads of 64: 2 x 30 x 3 x 64 x 4 bytes = 46,080 bytes a token in fp32.
    smol = LlamaConfig(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
    assert kv_bytes_per_token(smol, 4) == 46_080 and kv_bytes_per_token(smol, 2) == 23_040
    # The headline rollout: 32 episodes of 4,096 + 64 tokens = 6.13 GB (5.71 GiB), which a 1 GiB cache thrashed.
    gib, note = size_kv_cache(smol, 4, 32, 4160, available_bytes=20 * 2**30)
    assert gib == pytest.approx(32 * 4160 * 46_080 / 2**30) and note == ""
    gib, note = size_kv_cache(smol, 4, 32, 4160, available_bytes=8 * 2**30)  # capped at half of what is free
    assert gib == 4.0 and "5.7 GiB" in note and "bfloat16" in note
    assert size_kv_cache(smol, 4, 1, 10, available_bytes=8 * 2**30)[0] == 0.25  # never below 256 MiB

    # A step of 4 tasks x 8 episodes over 2 local replicas: 16 episodes each, at 4,096 + 64 tokens, in bfloat16.
    two = EngineConfig(dtype="bfloat16", replicas=2)
    gib, _ = kv_cache_gib(two, smol, "bfloat16", episodes_in_flight=32, context_tokens=4160, on_cluster=False,
                          available_bytes=20 * 2**30)
    assert gib == pytest.approx(16 * 4160 * 23_040 / 2**30)
    fixed = EngineConfig(kv_cache_gib=1.5)
    assert kv_cache_gib(fixed, smol, "float32", episodes_in_flight=32, context_tokens=4160, on_cluster=False) \
        == (1.5, "")
    # A server's load is unknown: a fixed default unless set.
    assert kv_cache_gib(EngineConfig(), smol, "float32", episodes_in_flight=None, context_tokens=4160,
                        on_cluster=False) == (SERVER_KV_GIB, "")
