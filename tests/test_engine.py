"""HFEngine against a tiny real Qwen3 (random init, real tokenizer)."""

import math

import pytest
import torch

from agentrl.engine import HFEngine, SamplingParams
from agentrl.engine.hf import process_logits


@pytest.fixture(scope="module")
def engine(tiny_qwen3):
    return HFEngine(tiny_qwen3.model, tiny_qwen3.tokenizer, batch_size=4)


def prompt(tok, text):
    s = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return tok(s)["input_ids"]


def test_logprobs_are_those_of_the_sampled_distribution(engine, tiny_qwen3):
    tok = tiny_qwen3.tokenizer
    prompts = [prompt(tok, "hi"), prompt(tok, "a much longer prompt with more words in it")]
    params = SamplingParams(max_new_tokens=12, seed=3, temperature=0.7, top_k=50)
    gens = engine.generate(prompts, params)
    for p, g in zip(prompts, gens):
        assert len(g.token_ids) == len(g.logprobs) == 12 and g.finish_reason == "length"
        ids = torch.tensor([p + list(g.token_ids)])
        with torch.no_grad():
            logits = tiny_qwen3.model(ids).logits[0, len(p) - 1 : -1]  # [12, V]
        ref = process_logits(logits, params).gather(-1, ids[0, len(p) :, None]).squeeze(-1)
        assert torch.allclose(ref, torch.tensor(g.logprobs), atol=1e-4)


def test_same_seed_same_tokens_and_batch_independent_greedy(engine, tiny_qwen3):
    tok = tiny_qwen3.tokenizer
    prompts = [prompt(tok, "one"), prompt(tok, "two two two"), prompt(tok, "three")]
    a = engine.generate(prompts, SamplingParams(max_new_tokens=8, seed=1))
    b = engine.generate(prompts, SamplingParams(max_new_tokens=8, seed=1))
    assert a == b
    alone = engine.generate(prompts[1:2], SamplingParams(max_new_tokens=8, temperature=0))
    batched = engine.generate(prompts, SamplingParams(max_new_tokens=8, temperature=0))
    assert alone[0].token_ids == batched[1].token_ids


def test_stop_on_eos_and_stop_strings(tiny_qwen3):
    tok = tiny_qwen3.tokenizer
    eng = HFEngine(tiny_qwen3.model, tok)
    g = eng.generate([prompt(tok, "x")], SamplingParams(max_new_tokens=30, temperature=0))[0]
    text = tok.decode(g.token_ids)
    # Pick a stop string from the greedy output itself, so the test knows it will appear.
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    g2 = eng.generate([prompt(tok, "x")], SamplingParams(max_new_tokens=30, temperature=0, stop=(stop,)))[0]
    assert g2.finish_reason == "stop" and stop in tok.decode(g2.token_ids)
    assert stop not in tok.decode(g2.token_ids[:-1])
    fake_eos = g.token_ids[-1]  # pretend a token the greedy output contains is the end-of-sequence token
    eng.eos_ids = {fake_eos}
    g3 = eng.generate([prompt(tok, "x")], SamplingParams(max_new_tokens=30, temperature=0))[0]
    first = g.token_ids.index(fake_eos)
    assert g3.finish_reason == "stop" and g3.token_ids == g.token_ids[: first + 1]


def test_process_logits_top_k_top_p_min_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    p = process_logits(logits, SamplingParams(top_k=2)).exp()
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0, 0]]))
    p = process_logits(logits, SamplingParams(top_p=0.7)).exp()  # 0.5 < 0.7, 0.5+0.3 >= 0.7: keep two
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0, 0]]))
    p = process_logits(logits, SamplingParams(min_p=0.5)).exp()  # keep p >= 0.25
    assert torch.allclose(p, torch.tensor([[0.625, 0.375, 0, 0]]))
    p = process_logits(logits, SamplingParams(temperature=0.5)).exp()  # p^2 renormalised
    q = torch.tensor([0.25, 0.09, 0.0225, 0.0025])
    assert torch.allclose(p, (q / q.sum())[None])
    assert math.isclose(float(p.sum()), 1.0, rel_tol=1e-6)


def test_bad_sampling_params():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)


def test_engine_owns_a_copy_until_update_weights(tiny_qwen3):
    """The engine samples from its own weights: the trainer's changes reach it only through update_weights."""
    import copy

    tok = tiny_qwen3.tokenizer
    trainer = copy.deepcopy(tiny_qwen3.model)
    eng = HFEngine(trainer, tok)
    params = SamplingParams(max_new_tokens=6, seed=4)
    p = [prompt(tok, "hi")]
    before = eng.generate(p, params)
    with torch.no_grad():
        for w in trainer.parameters():
            w.add_(0.3 * torch.randn_like(w))
    assert eng.generate(p, params) == before  # the trainer's step did not touch the engine
    eng.update_weights(trainer.state_dict().items(), version=7)
    assert eng.policy_version == 7 and eng.generate(p, params)[0].logprobs != before[0].logprobs
    eng.update_weights(tiny_qwen3.model.state_dict().items(), version=8)
    assert eng.generate(p, params) == before
    with pytest.raises(KeyError, match="not_a_weight"):
        eng.update_weights([("not_a_weight", torch.zeros(1))], version=9)
    assert eng.policy_version == 8


def test_shared_module_is_an_explicit_choice(tiny_qwen3):
    eng = HFEngine(tiny_qwen3.model, tiny_qwen3.tokenizer, share_module=True)
    assert eng.model is tiny_qwen3.model
    eng.update_weights(tiny_qwen3.model.state_dict().items(), version=3)  # its own tensors: nothing to copy
    assert eng.policy_version == 3
    with pytest.raises(ValueError, match="share_module"):
        HFEngine(tiny_qwen3.model, tiny_qwen3.tokenizer, share_module=True, dtype=torch.bfloat16)
    assert HFEngine(tiny_qwen3.model, tiny_qwen3.tokenizer).model is not tiny_qwen3.model


def test_batched_requests_group_by_settings_and_tag_versions(tiny_qwen3):
    from agentrl.engine import BatchedRequests, EngineRequest

    tok = tiny_qwen3.tokenizer
    eng = HFEngine(tiny_qwen3.model, tok, share_module=True)
    eng.policy_version = 5
    calls = []
    generate = eng.generate
    eng.generate = lambda prompts, params: calls.append(len(prompts)) or generate(prompts, params)
    req = BatchedRequests(eng)
    for i, budget in enumerate([4, 4, 6]):
        req.submit(EngineRequest(i, tuple(prompt(tok, f"q{i}")), SamplingParams(max_new_tokens=budget, seed=i)))
    results = sorted(req.poll(), key=lambda r: r.request_id)
    assert [len(r.generation.token_ids) for r in results] == [4, 4, 6]
    assert sorted(calls) == [1, 2] and {r.policy_version for r in results} == {5}
    assert req.poll() == []
