"""The trainer's memory path: chunked log-probs equal the full computation, token-budget micro-batches leave the
gradient unchanged, the memory plan refuses what cannot fit, and a 4k-token step with a 151k vocabulary runs under a
memory limit the full-logits path exceeds."""

import subprocess
import sys
import textwrap

import pytest
import torch

from agentrl.config import ConfigError
from agentrl.objective import policy_loss
from agentrl.records import Sample
from agentrl.training.logprobs import full_logprobs, head_logprobs, token_logprobs
from agentrl.training.memory import estimate_train_memory, plan_training_memory
from agentrl.training.microbatch import collate, pack_by_tokens, padding_waste


def _samples(lengths, prompt=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for k, n in enumerate(lengths):
        ids = torch.randint(0, 150_000, (n,), generator=g).tolist()
        mask = [0] * prompt + [1] * (n - prompt)
        rlp = [0.0] * prompt + (-torch.rand(n - prompt, generator=g) * 3).tolist()
        out.append(Sample(tuple(ids), tuple(mask), tuple(rlp), float(k % 3 - 1), k // 2, 0))
    return out


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("keep_bytes", [0, 2**30], ids=["recompute", "kept"])
def test_chunked_logprobs_and_entropy_equal_the_full_pass_values_and_gradients(tiny_qwen3, keep_bytes):
    model = tiny_qwen3.model
    mb = collate(_samples([23, 17, 30]), pad_id=0)

    model.zero_grad()
    ref_lp, ref_ent = full_logprobs(model, mb, with_entropy=True)
    (ref_lp * 0.7 + ref_ent * 0.3).sum().backward()
    ref_grads = _grads(model)

    model.zero_grad()
    lp, ent = token_logprobs(model, mb, with_entropy=True, entropy_grad=True, chunk=7, keep_bytes=keep_bytes)
    (lp * 0.7 + ent * 0.3).sum().backward()
    grads = _grads(model)

    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-5, atol=1e-5)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        scale = ref_grads[name].abs().max().clamp(min=1.0)
        torch.testing.assert_close(grads[name] / scale, ref_grads[name] / scale, rtol=0, atol=1e-5, msg=name)
    assert (lp[mb.loss_mask == 0] == 0).all() and (ent[mb.loss_mask == 0] == 0).all()


def test_head_logprobs_hand_worked_with_bias():
    # V = 2, logits z = h @ W.T + b = [0, log 3] -> p = [1/4, 3/4]; entropy = -(1/4 ln 1/4 + 3/4 ln 3/4).
    h = torch.tensor([[1.0]], requires_grad=True)
    w = torch.tensor([[0.0], [0.0]])
    b = torch.tensor([0.0, float(torch.log(torch.tensor(3.0)))])
    logp, ent = head_logprobs(h, w, b, torch.tensor([1]), chunk=1, with_entropy=True)
    assert logp.item() == pytest.approx(torch.log(torch.tensor(0.75)).item(), abs=1e-6)
    import math

    assert ent.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-6)
    empty_lp, _ = head_logprobs(h[:0], w, b, torch.tensor([], dtype=torch.long))
    assert empty_lp.shape == (0,)


def test_pack_by_tokens_respects_the_budget_and_keeps_every_sample():
    lengths = [100, 900, 30, 30, 500, 2000, 64]
    batches = pack_by_tokens(lengths, range(len(lengths)), token_budget=1000)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) * max(lengths[i] for i in b) <= 1000 or len(b) == 1  # 2000 > budget: alone
    assert [5] in batches
    assert pack_by_tokens(lengths, range(7), token_budget=10**6, max_samples=3) == [[5, 1, 4], [0, 6, 2], [3]]
    assert padding_waste([10, 10], [[0, 1]]) == 0.0
    assert padding_waste([10, 30], [[0, 1]]) == pytest.approx(1 - 40 / 60)
    with pytest.raises(ValueError):
        pack_by_tokens(lengths, range(7), token_budget=0)


@pytest.mark.parametrize("loss", ["minirl", "grpo", "gspo"])
def test_token_budget_micro_batches_leave_the_gradient_unchanged(tiny_qwen3, loss):
    model = tiny_qwen3.model
    samples = _samples([40, 12, 25, 33, 18, 9], seed=1)
    lengths = [len(s.input_ids) for s in samples]
    num_tokens = sum(s.num_loss_tokens for s in samples)

    def gradient(budget):
        model.zero_grad()
        for idx in pack_by_tokens(lengths, range(len(samples)), budget):
            mb = collate([samples[i] for i in idx], pad_id=0)
            logp, _ = token_logprobs(model, mb)
            with torch.no_grad():
                old = logp.detach() + 0.01 * mb.loss_mask  # pi_old != pi: ratios and clipping are exercised
            lossv, _ = policy_loss(loss, logp, old, mb.rollout_logp, mb.advantages, mb.loss_mask,
                                   num_sequences=len(samples), num_tokens=num_tokens)
            lossv.backward()
        return _grads(model)

    whole, split = gradient(10**6), gradient(45)
    assert len(pack_by_tokens(lengths, range(len(samples)), 45)) >= 4
    for name in whole:
        scale = whole[name].abs().max()
        err = (split[name] - whole[name]).abs().max()
        assert err <= 1e-5 * scale, (name, float(err), float(scale))


def test_memory_plan_turns_on_checkpointing_when_needed_and_refuses_what_cannot_fit(tiny_qwen3):
    model = tiny_qwen3.model
    kw = dict(dtype_bytes=4, token_budget=4096, longest_sample=4096, engine_copy=False)
    roomy = plan_training_memory(model, checkpointing="auto", limit_bytes=64 * 2**30, **kw)
    assert not roomy.gradient_checkpointing
    plain = roomy.estimate.total
    recompute = estimate_train_memory(model.config, sum(p.numel() for p in model.parameters()), dtype_bytes=4,
                                      tokens=4096, gradient_checkpointing=True, engine_copy=False).total
    assert recompute < plain
    tight = plan_training_memory(model, checkpointing="auto", limit_bytes=(plain + recompute) // 2, **kw)
    assert tight.gradient_checkpointing
    with pytest.raises(ConfigError, match="micro_batch_tokens|max_context_tokens"):
        plan_training_memory(model, checkpointing="auto", limit_bytes=recompute // 2, **kw)
    with pytest.raises(ConfigError, match="gradient_checkpointing: on"):
        plan_training_memory(model, checkpointing="off", limit_bytes=(plain + recompute) // 2, **kw)



def test_an_in_process_engine_counts_against_the_step(tiny_qwen3):
    # The headline run (vLLM in-process, 6.1 GB of KV cache) was planned without checkpointing against the memory
    # free before the engine started, and the kernel killed the step at 24 GB: the engine's bytes count now.
    model = tiny_qwen3.model
    kw = dict(dtype_bytes=4, token_budget=4096, longest_sample=4096, engine_copy=False, checkpointing="auto")
    plain = plan_training_memory(model, limit_bytes=64 * 2**30, **kw).estimate.total
    recompute = plan_training_memory(model, limit_bytes=64 * 2**30, **kw | {"checkpointing": "on"}).estimate.total
    engine = (plain - recompute) // 2  # fits beside the step only if the step recomputes its activations
    alone = plan_training_memory(model, limit_bytes=plain + engine // 2, **kw)
    beside = plan_training_memory(model, limit_bytes=plain + engine // 2, engine_bytes=engine, **kw)
    assert not alone.gradient_checkpointing and beside.gradient_checkpointing
    assert beside.estimate.engine == engine and "engine" in beside.estimate.table()
    with pytest.raises(ConfigError, match="engine.dtype: bfloat16"):
        plan_training_memory(model, limit_bytes=plain, engine_bytes=4 * plain, **kw)


STEP = textwrap.dedent("""
    import resource, sys, torch
    limit = int(3.5 * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    from agentrl.models import load_model
    from agentrl.records import Sample
    from agentrl.training.logprobs import full_logprobs, token_logprobs
    from agentrl.training.microbatch import collate
    torch.set_num_threads(1)
    model = load_model("tiny-qwen3").model
    n, answer = 4096, 384
    ids = torch.randint(0, 150_000, (n,), generator=torch.Generator().manual_seed(0)).tolist()
    mb = collate([Sample(tuple(ids), tuple([0] * (n - answer) + [1] * answer), tuple([0.0] * n), 1.0, 0)], 0)
    path = token_logprobs if sys.argv[1] == "chunked" else full_logprobs
    try:
        logp, _ = path(model, mb)
        logp.sum().backward()
    except (MemoryError, RuntimeError) as e:
        print("OUT OF MEMORY", str(e)[:200])
        sys.exit(3)
    print("OK", model.config.vocab_size)
""")


def test_a_4k_token_step_with_a_151k_vocabulary_fits_where_the_full_logits_path_does_not():
    def run(path):
        return subprocess.run([sys.executable, "-c", STEP, path], capture_output=True, text=True, timeout=600)

    chunked = run("chunked")
    assert chunked.returncode == 0, chunked.stdout + chunked.stderr[-2000:]
    assert "OK 151" in chunked.stdout
    full = run("full")
    assert full.returncode == 3, full.stdout + full.stderr[-2000:]


def test_compute_dtype_bad_value_names_the_key():
    from agentrl.config import TrainerConfig

    with pytest.raises(ConfigError, match="trainer.compute_dtype"):
        TrainerConfig(compute_dtype="int8")


def test_single_turn_envs_size_the_engine_kv_for_their_prompts_not_the_context_budget(tiny_qwen3):
    import dataclasses

    import agentrl
    from agentrl.chat.layout import resolve_context
    from agentrl.config import apply_overrides, load_config
    from agentrl.engine.kv_cache import rollout_kv_bytes
    from agentrl.rollout.plan import is_single_turn, single_turn_context

    def resolved(cfg):  # as `set_up` resolves the context before sizing the engines
        context, _ = resolve_context(cfg.context, agentrl.spec("math").load(), tiny_qwen3.tokenizer,
                                     tiny_qwen3.family)
        return dataclasses.replace(cfg, context=context)

    math = resolved(apply_overrides(load_config(None), {"env.id": "math", "engine.kind": "vllm"}))
    env = agentrl.make("math", **math.env.kwargs)
    assert is_single_turn(env)
    longest = single_turn_context(math.env, math.context, math.scheduler, math.sampling, tiny_qwen3)
    budget = math.context.max_context_tokens + math.sampling.max_new_tokens
    assert math.sampling.max_new_tokens < longest < 400 < budget  # one short prompt and one reply
    kv_bytes = {n: rollout_kv_bytes(tiny_qwen3.model.config, 4, 32, n) for n in (longest, budget)}
    assert kv_bytes[longest] * 10 < kv_bytes[budget]
    env.close()

    multi = resolved(apply_overrides(load_config(None), {"env.id": "math",
                                                          "env.kwargs": {"mode": "multi", "max_turns": 3}}))
    env = agentrl.make("math", **multi.env.kwargs)
    assert not is_single_turn(env)  # observations may grow it to the budget: sized for the budget
    env.close()
