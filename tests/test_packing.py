"""Padding-free micro-batches (`agentrl.training.packing`): the packed pass equals the padded one.

Log-probs, entropy, loss and gradients within float32 rounding on dense families (Qwen3, Llama, Qwen2), the tiny
Qwen3-MoE under Routing Replay (R2, R3), LoRA, gradient checkpointing and the SFT loss; attention never crosses a
sample boundary; the token budget counts real tokens; and with packing off everything is today's padded path.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from agentrl.config import AdvantageConfig, LoraConfig, LossConfig, OptimConfig, TrainerConfig
from agentrl.objective import policy_loss
from agentrl.records import Sample
from agentrl.training.backend import LikelihoodObjective, PolicyObjective, ScoreRequest, UpdateRequest
from agentrl.training.logprobs import token_logprobs
from agentrl.training.microbatch import collate, pack_by_tokens, padding_waste
from agentrl.training.packing import PACKED_ATTENTION, packing_blocker, use_packing
from agentrl.training.routing_replay import R2Routing, R3Routing, RoutingReplay
from agentrl.training.single import MicroBatchPasses

VOCAB = 256
LENGTHS = (3, 40, 200, 17)  # one packed row holding very different lengths


def _samples(lengths=LENGTHS, vocab=VOCAB, seed=0, routes=None) -> list[Sample]:
    """Random sequences: a 2-token prompt, then loss tokens with rollout log-probs and advantages of both signs."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for k, n in enumerate(lengths):
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        prompt = min(2, n - 1)
        rlp = [0.0] * prompt + (-torch.rand(n - prompt, generator=g) * 3).tolist()
        experts = None if routes is None else torch.randint(0, routes[1], (n - 1, routes[0], 2), generator=g).numpy()
        out.append(Sample(tuple(ids), (0,) * prompt + (1,) * (n - prompt), tuple(rlp), float(k % 3 - 1), k // 2,
                          routed_experts=experts))
    return out


def _config_model(family: str, **extra):
    import transformers

    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
    config = {
        "qwen3": lambda: transformers.Qwen3Config(**common, head_dim=8, **extra),
        "llama": lambda: transformers.LlamaConfig(**common, **extra),  # SmolLM2's family
        "qwen2": lambda: transformers.Qwen2Config(**common, **extra),
        "qwen3_moe": lambda: transformers.Qwen3MoeConfig(**common, head_dim=8, num_experts=8, num_experts_per_tok=2,
                                                         moe_intermediate_size=32, norm_topk_prob=True,
                                                         decoder_sparse_step=1, **extra),
    }[family]()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(std=1.0)  # transformers 5.x inits routers to zeros: every top-k would tie
    return model.train()


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_grads_close(grads, ref, rel=1e-5):
    assert grads.keys() == ref.keys() and ref
    for name in ref:
        scale = ref[name].abs().max().clamp(min=1e-12)
        torch.testing.assert_close(grads[name] / scale, ref[name] / scale, rtol=0, atol=rel, msg=name)


def _objective(samples) -> PolicyObjective:
    return PolicyObjective(functools.partial(policy_loss, "minirl"), len(samples),
                           sum(s.num_loss_tokens for s in samples), with_entropy=True, entropy_grad=False)


def _update(passes: MicroBatchPasses, samples, packed: bool, routes_of=None):
    """One micro-batch's forward + backward of the policy loss: its metrics, log-probs and gradients."""
    passes.model.zero_grad()
    mb = collate(samples, 0, packed=packed)
    old = mb.rollout_logp + 0.05 * mb.loss_mask  # pi_old != mu, so the ratios are not all 1
    request = UpdateRequest(mb, old, routes_of(mb) if routes_of else None)
    result = passes.accumulate(request, _objective(samples))
    with torch.no_grad(), passes._routing(request.replay_routes):
        logp, _ = token_logprobs(passes.model, mb)
    return result.metrics, logp, _grads(passes.model)


def _assert_same_update(a, b):
    metrics_a, logp_a, grads_a = a
    metrics_b, logp_b, grads_b = b
    torch.testing.assert_close(logp_b, logp_a, rtol=1e-5, atol=1e-6)
    assert metrics_b["loss"] == pytest.approx(metrics_a["loss"], rel=1e-5, abs=1e-7)
    _assert_grads_close(grads_b, grads_a)


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen2"])
def test_packed_logprobs_entropy_and_gradients_equal_the_padded_pass(family):
    model = _config_model(family)
    samples = _samples()
    results = {}
    for packed in (False, True):
        model.zero_grad()
        mb = collate(samples, 0, packed=packed)
        lp, ent = token_logprobs(model, mb, with_entropy=True, entropy_grad=True)
        (lp * 0.7 + ent * 0.3).sum().backward()
        results[packed] = lp.detach(), ent.detach(), _grads(model)
    assert model.config._attn_implementation == PACKED_ATTENTION
    torch.testing.assert_close(results[True][0], results[False][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(results[True][1], results[False][1], rtol=1e-5, atol=1e-6)
    _assert_grads_close(results[True][2], results[False][2])
    assert (results[True][0][mb.loss_mask == 0] == 0).all()


@pytest.mark.parametrize("waste", [0.0, 100.0], ids=["per-segment", "one-padded-batch"])
def test_both_packed_attention_layouts_equal_the_padded_pass(monkeypatch, waste):
    """Segments attend one call each, or as one right-padded batch (similar lengths): both equal the padded pass."""
    import agentrl.training.packing as packing

    monkeypatch.setattr(packing, "BATCH_SEGMENTS_WASTE", waste)
    model = _config_model("llama")
    samples = _samples(lengths=(31, 17, 40, 3, 26))
    results = {}
    for packed in (False, True):
        model.zero_grad()
        lp, ent = token_logprobs(model, collate(samples, 0, packed=packed), with_entropy=True, entropy_grad=True)
        (lp * 0.7 + ent * 0.3).sum().backward()
        results[packed] = lp.detach(), ent.detach(), _grads(model)
    torch.testing.assert_close(results[True][0], results[False][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(results[True][1], results[False][1], rtol=1e-5, atol=1e-6)
    _assert_grads_close(results[True][2], results[False][2])


def test_packed_loss_and_gradients_on_the_tiny_qwen3_with_its_real_vocabulary(tiny_qwen3):
    model = copy.deepcopy(tiny_qwen3.model).train()
    passes = MicroBatchPasses(model)
    samples = _samples(vocab=150_000)
    _assert_same_update(_update(passes, samples, packed=False), _update(passes, samples, packed=True))


def test_attention_stays_inside_each_sample_and_no_boundary_is_scored():
    model = _config_model("qwen3").eval()
    samples = _samples()
    with torch.no_grad():
        together, _ = token_logprobs(model, collate(samples, 0, packed=True))  # [n, T]
        for i, s in enumerate(samples):
            alone, _ = token_logprobs(model, collate([s], 0))  # [1, len - 1]
            torch.testing.assert_close(together[i, : len(s.input_ids) - 1], alone[0], rtol=1e-5, atol=1e-6)
        # Other samples' tokens change nothing in sample 0, not even at the boundary next to sample 1.
        changed = [samples[0]] + [Sample(tuple((t + 1) % VOCAB for t in s.input_ids), s.loss_mask, s.rollout_logprobs,
                                         s.advantage, s.group_id) for s in samples[1:]]
        other, _ = token_logprobs(model, collate(changed, 0, packed=True))
    assert torch.equal(other[0], together[0])
    layout = collate(samples, 0, packed=True).packed
    bounds = layout.cu_seqlens.tolist()
    assert bounds == [0, 3, 43, 243, 260] and layout.position_ids[0, bounds[1:-1]].tolist() == [0, 0, 0]
    mb = collate(samples, 0, packed=True)
    scored = layout.index[:, :-1][mb.loss_mask.bool()]  # packed positions whose next token is a target
    assert not set(scored.tolist()) & {b - 1 for b in bounds[1:]}  # no sample's last token predicts the next's first


def test_the_budget_counts_real_tokens_and_packed_waste_is_zero():
    lengths = [90, 160, 120, 100, 150, 95, 130, 110, 140, 105]  # the main job's kind of lengths
    padded = pack_by_tokens(lengths, range(len(lengths)), 700)
    packed = pack_by_tokens(lengths, range(len(lengths)), 700, packed=True)
    assert all(len(b) * max(lengths[i] for i in b) <= 700 for b in padded)
    assert all(sum(lengths[i] for i in b) <= 700 for b in packed)
    assert sorted(i for b in packed for i in b) == list(range(len(lengths)))
    assert len(packed) < len(padded)  # the same budget holds more samples
    assert padding_waste(lengths, packed, packed=True) == 0.0
    assert padding_waste(lengths, padded) > 0.0
    assert pack_by_tokens([700, 10], range(2), 600, packed=True) == [[0], [1]]  # a long sample gets its own pass
    mb = collate(_samples(), 0, packed=True)
    assert mb.padded_tokens == sum(LENGTHS) < collate(_samples(), 0).padded_tokens


@pytest.mark.parametrize("strategy", ["r2", "r3"])
def test_routing_replay_with_packing_equals_the_padded_passes(strategy):
    model = _config_model("qwen3_moe")
    router = RoutingReplay(model)
    passes = MicroBatchPasses(model, router)
    samples = _samples(routes=(router.num_layers, router.num_experts))
    updates = {}
    for packed in (False, True):
        routing = R2Routing() if strategy == "r2" else R3Routing()
        routing.begin_step(len(samples))
        idx = list(range(len(samples)))
        # pi_old on the other layout than the update: routes convert through the samples, whatever the grouping.
        score_mb = collate(samples, 0, packed=not packed)
        request = routing.score_request(idx, samples, score_mb)
        scored = passes.score(request)
        routing.scored(idx, samples, score_mb, scored)
        updates[packed] = _update(passes, samples, packed,
                                  lambda mb, r=routing, i=idx: r.update_request(i, samples, mb, None).replay_routes)
        if strategy == "r2":  # the update replays exactly the experts the pi_old pass chose: the same log-probs
            torch.testing.assert_close(updates[packed][1], scored.logp, rtol=1e-5, atol=1e-6)
    _assert_same_update(updates[False], updates[True])
    if strategy == "r3":  # the replay matters: live routing gives other log-probs
        mb = collate(samples, 0, packed=True)
        with torch.no_grad():
            live, _ = token_logprobs(model, mb)
        assert (live - updates[True][1]).abs().max() > 1e-3


def test_routes_recorded_on_a_packed_row_match_the_padded_rows():
    model = _config_model("qwen3_moe").eval()
    router = RoutingReplay(model)
    samples = _samples()
    per_layout = {}
    for packed in (False, True):
        mb = collate(samples, 0, packed=packed)
        with torch.no_grad(), router.record() as rec:
            token_logprobs(model, mb)
        per_layout[packed] = mb.per_sample(rec.routes)
        assert rec.routes.shape[:2] == ((1, sum(LENGTHS)) if packed else (len(LENGTHS), max(LENGTHS)))
    for a, b in zip(per_layout[False], per_layout[True]):
        assert torch.equal(a.sort(-1).values, b.sort(-1).values)


def test_lora_adapters_get_the_padded_gradients():
    from agentrl.training.lora import add_lora

    model = _config_model("qwen3")
    torch.manual_seed(0)
    add_lora(model, LoraConfig(rank=4))
    with torch.no_grad():  # B starts at zero: give A a gradient too
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)
    passes = MicroBatchPasses(model)
    samples = _samples()
    padded, packed = _update(passes, samples, packed=False), _update(passes, samples, packed=True)
    assert padded[2] and all("lora_" in name for name in padded[2])
    _assert_same_update(padded, packed)


def test_gradient_checkpointing_recomputes_the_packed_attention():
    model = _config_model("llama")
    passes = MicroBatchPasses(model)
    samples = _samples()
    plain = _update(passes, samples, packed=True)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    _assert_same_update(plain, _update(passes, samples, packed=True))
    _assert_same_update(_update(passes, samples, packed=False), plain)


def test_sft_loss_and_validation_nll_are_the_same_packed():
    from agentrl.recipes.sft import demonstration_nll, sft_loss
    from agentrl.training.single import SingleProcessBackend

    class Policy:  # what SingleProcessBackend reads of a loaded model
        model = _config_model("qwen2")

    backend = SingleProcessBackend(Policy(), lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0)
    samples = _samples(lengths=(30, 9, 64, 41, 5))
    nll = {p: demonstration_nll(backend, samples, 0, 80, packed=p) for p in (False, True)}
    assert nll[True] == pytest.approx(nll[False], rel=1e-6)
    total = sum(s.num_loss_tokens for s in samples)
    grads = {}
    for packed in (False, True):
        requests = [UpdateRequest(collate([samples[i] for i in chunk], 0, packed=packed), None)
                    for chunk in pack_by_tokens([len(s.input_ids) for s in samples], range(5), 80, packed=packed)]
        done = backend.accumulate(requests, LikelihoodObjective(sft_loss, total))
        grads[packed] = sum(r.metrics["loss"] for r in done), _grads(backend.model)
        backend.model.zero_grad()
    assert grads[True][0] == pytest.approx(grads[False][0], rel=1e-6)
    _assert_grads_close(grads[True][1], grads[False][1])


def test_the_training_step_packs_when_asked_and_reproduces_the_padded_path_when_not(tmp_path):
    from agentrl.training.single import SingleProcessBackend
    from agentrl.training.step import TrainingStep

    samples = _samples(lengths=(30, 9, 64, 41, 5, 22))
    runs = {}
    for packing in (False, True):
        class Policy:
            model = _config_model("qwen3_moe")

        backend = SingleProcessBackend(Policy(), lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0)
        step = TrainingStep(backend, R2Routing(), LossConfig(routing_replay="r2"), AdvantageConfig(), OptimConfig(),
                            TrainerConfig(micro_batch_tokens=70, packing=packing), per_turn_budget=64, pad_id=0,
                            shuffle=torch.Generator().manual_seed(0), out=tmp_path)
        seen = []
        backend.step = lambda clip, lr=None, b=backend, s=seen: s.append(_grads(b.model)) or 1.0
        old = step.old_policy(samples)
        update = step.update(samples, old, {}, step=0)
        assert all(step.collate(samples, idx).packed is not None for idx in old.micro_batches) == packing
        runs[packing] = old, update, seen[0]
    (old_pad, up_pad, g_pad), (old_pack, up_pack, g_pack) = runs[False], runs[True]
    assert len(old_pack.micro_batches) < len(old_pad.micro_batches)  # 70 real tokens hold more than 70 padded
    for i in range(len(samples)):
        torch.testing.assert_close(old_pack.logp[i], old_pad.logp[i], rtol=1e-5, atol=1e-6)
    assert sum(r.metrics["loss"] * r.loss_tokens for r in up_pack.results) == pytest.approx(
        sum(r.metrics["loss"] * r.loss_tokens for r in up_pad.results), rel=1e-5)
    _assert_grads_close(g_pack, g_pad)


def test_packing_off_is_the_padded_path_bit_for_bit():
    model = _config_model("qwen3")
    twin = copy.deepcopy(model)
    assert use_packing(twin) and twin.config._attn_implementation == PACKED_ATTENTION
    mb = collate(_samples(), 0)
    assert mb.packed is None
    outs = []
    for m in (model, twin):  # SDPA, and the packed function on an unpacked batch
        m.zero_grad()
        lp, ent = token_logprobs(m, mb, with_entropy=True, entropy_grad=True)
        (lp + ent).sum().backward()
        logits = m(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits  # a padding mask: SDPA's mask
        outs.append((lp, ent, logits, _grads(m)))
    assert model.config._attn_implementation == "sdpa"
    for a, b in zip(outs[0][:3], outs[1][:3]):
        assert torch.equal(a, b)
    assert all(torch.equal(outs[0][3][k], outs[1][3][k]) for k in outs[0][3])
    assert pack_by_tokens([10, 30, 20], range(3), 59) == [[1], [2, 0]]  # count x longest, as before
    assert pack_by_tokens([10, 30, 20], range(3), 59, packed=True) == [[1, 2], [0]]  # real tokens


def test_families_that_cannot_pack_run_padded():
    model = _config_model("qwen3", use_sliding_window=True, sliding_window=8, max_window_layers=1)
    assert "sliding_attention" in packing_blocker(model)
    samples = _samples()
    with torch.no_grad():
        packed, _ = token_logprobs(model, collate(samples, 0, packed=True))
        padded, _ = token_logprobs(model, collate(samples, 0))
    assert torch.equal(packed, padded) and model.config._attn_implementation == "sdpa"


def test_a_layer_that_drops_the_boundaries_fails_loudly():
    from agentrl.training import packing

    q = torch.zeros(1, 2, 5, 4)
    with pytest.raises(RuntimeError, match="no-packing"), packing._packed_forward():
        packing._packed_sdpa(torch.nn.Module(), q, q, q, None)


@pytest.mark.timeout(600)  # Ray workers: a hang is a failure
def test_fsdp_workers_run_packed_micro_batches(local_ray):
    from agentrl.models import load_model
    from agentrl.training.fsdp import FSDPBackend, WorkerSpec
    from agentrl.training.placement import Placement, PlacementPlan
    from agentrl.training.single import SingleProcessBackend

    samples = _samples(lengths=(12, 30, 7, 20), vocab=5000)
    objective = _objective(samples)
    batches = [collate(samples[i : i + 2], 0, packed=True) for i in (0, 2)]
    padded = [collate(samples[i : i + 2], 0) for i in (0, 2)]
    single = SingleProcessBackend(load_model("tiny-qwen3"), lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0)
    ref = single.score([ScoreRequest(b) for b in padded])
    single.accumulate([UpdateRequest(b, s.logp) for b, s in zip(padded, ref)], objective)
    ref_norm = single.step(1.0)
    placement = Placement(PlacementPlan(2))
    backend = FSDPBackend(WorkerSpec("tiny-qwen3", lr=1e-3), 2, placement)
    try:
        old = backend.score([ScoreRequest(b) for b in batches])
        backend.accumulate([UpdateRequest(b, s.logp) for b, s in zip(batches, old)], objective)
        norm = backend.step(1.0)
    finally:
        backend.close()
        placement.close()
    for a, b in zip(old, ref):
        torch.testing.assert_close(a.logp, b.logp, rtol=1e-5, atol=1e-6)
    assert norm == pytest.approx(ref_norm, rel=1e-5)
