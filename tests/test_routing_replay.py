"""Routing Replay (R2 / R3) on a tiny random Qwen3-MoE, on CPU (docs/objective.md §7)."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM  # noqa: E402

from agentrl.training.routing_replay import (  # noqa: E402
    RoutingReplay,
    pack_routes,
    replay_gate_weights,
    route_dtype,
    router_agreement,
)

VOCAB = 64


def tiny_moe(seed: int = 0) -> Qwen3MoeForCausalLM:
    config = Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, max_position_embeddings=128, decoder_sparse_step=1, mlp_only_layers=[],
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(std=1.0)  # transformers 5.x inits routers to zeros: every top-k would be a tie
            elif ".mlp.experts." in name:
                p.normal_(std=0.2)  # large enough that the choice of experts visibly moves the log-probs
    return model.eval()


def perturbed_router(model: Qwen3MoeForCausalLM, std: float = 0.5, seed: int = 1) -> Qwen3MoeForCausalLM:
    """A stand-in for the inference engine mu (or for theta != theta_old): same weights, noisy routers."""
    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in other.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.add_(torch.randn(p.shape, generator=g) * std)
    return other


def bf16_router(model: Qwen3MoeForCausalLM) -> Qwen3MoeForCausalLM:
    """A stand-in for a lower-precision inference engine: router weights rounded to bfloat16."""
    other = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in other.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.copy_(p.to(torch.bfloat16).float())
    return other


def token_logp(model, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids).logits[:, :-1].float()  # [N, S-1, V]
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # [N, S-1]


@pytest.fixture(scope="module")
def model():
    return tiny_moe()


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, VOCAB, (4, 12), generator=torch.Generator().manual_seed(0))


def test_record_shape_and_compact_dtype(model, ids):
    rr = RoutingReplay(model)
    assert (rr.num_layers, rr.top_k, rr.num_experts) == (2, 2, 8)
    with torch.no_grad(), rr.record() as rec:
        model(ids)
    assert rec.routes.shape == (4, 12, 2, 2) and rec.routes.dtype == torch.uint8
    assert int(rec.routes.max()) < 8
    assert (route_dtype(256), route_dtype(257), route_dtype(40000)) == (torch.uint8, torch.int16, torch.int32)


def test_replay_at_unchanged_weights_is_bit_identical(model, ids):
    rr = RoutingReplay(model)
    with torch.no_grad(), rr.record() as rec:
        live = model(ids).logits
    with torch.no_grad(), rr.replay(rec.routes):
        replayed = model(ids).logits
    assert torch.equal(live, replayed)


def test_replay_under_perturbed_router(model, ids):
    mu = perturbed_router(model)
    rr_mu, rr = RoutingReplay(mu), RoutingReplay(model)
    with torch.no_grad(), rr_mu.record() as rollout:
        token_logp(mu, ids)
    with torch.no_grad(), rr.record() as natural:
        token_logp(model, ids)
    # Some tokens' natural top-k differs from the rollout's.
    assert router_agreement(natural.routes, rollout.routes) < 0.95

    captured = []
    with torch.no_grad(), rr.replay(rollout.routes):
        # Registered after replay's own hooks, so these see the gate output the experts will receive.
        hooks = [layer.mlp.gate.register_forward_hook(lambda m, a, o: captured.append(o))
                 for layer in model.model.layers]  # fmt: skip
        try:
            token_logp(model, ids)
        finally:
            for h in hooks:
                h.remove()
    for layer, (logits, weights, idx) in enumerate(captured):
        # Replayed experts equal the recorded ones, layer by layer.
        assert torch.equal(idx, rollout.routes[:, :, layer, :].reshape(-1, 2).long())
        # Gate weights = softmax of the live logits restricted to the replayed experts; they sum to 1.
        restricted = torch.softmax(logits.gather(1, idx), dim=-1)
        torch.testing.assert_close(weights, restricted)
        torch.testing.assert_close(weights.sum(-1), torch.ones(idx.shape[0]))


def test_replay_shrinks_bf16_router_mismatch(model):
    ids = torch.randint(0, VOCAB, (16, 64), generator=torch.Generator().manual_seed(1))
    mu = bf16_router(model)
    with torch.no_grad(), RoutingReplay(mu).record() as rollout:
        mu_logp = token_logp(mu, ids)
    rr = RoutingReplay(model)
    with torch.no_grad(), rr.record() as natural:
        live_logp = token_logp(model, ids)
    with torch.no_grad(), rr.replay(rollout.routes):
        replay_logp = token_logp(model, ids)
    assert router_agreement(natural.routes, rollout.routes) < 1.0  # bf16 rounding flips near-tied top-k
    gap_live = (live_logp - mu_logp).abs().mean()
    gap_replay = (replay_logp - mu_logp).abs().mean()
    k3 = lambda a, b: ((a - b).exp() - 1 - (a - b)).mean()  # noqa: E731
    assert gap_replay < 0.8 * gap_live
    assert k3(replay_logp, mu_logp) < k3(live_logp, mu_logp)


def test_gate_weights_recomputed_from_live_logits():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]], requires_grad=True)
    idx = torch.tensor([[3, 1]])
    w = replay_gate_weights(logits, idx, norm_topk_prob=True)
    e = torch.exp(torch.tensor([-1.0, 1.0]))
    torch.testing.assert_close(w, (e / e.sum()).unsqueeze(0))
    w[0, 1].backward()
    # Only the fixed experts' logits matter (analytically zero elsewhere; Qwen3's softmax-then-renormalise formula,
    # kept for bit-identical replay, leaves float rounding there).
    assert abs(logits.grad[0, 0].item()) < 1e-6 and abs(logits.grad[0, 1].item()) > 0.1
    full = replay_gate_weights(logits.detach(), idx, norm_topk_prob=False)
    torch.testing.assert_close(full, torch.softmax(logits.detach(), -1)[:, [3, 1]])


def test_experts_outside_replayed_set_get_zero_gradient_router_gets_nonzero(model, ids):
    train = copy.deepcopy(model).train()
    rr = RoutingReplay(train)
    routes = torch.zeros(4, 12, 2, 2, dtype=torch.uint8)
    routes[..., 1] = 3  # every token, every layer: experts {0, 3}
    with rr.replay(routes):
        token_logp(train, ids).sum().backward()
    for layer in train.model.layers:
        grad = layer.mlp.experts.gate_up_proj.grad  # [E, 2I, H]
        used = grad.flatten(1).abs().sum(1) > 0  # [E]
        assert used.tolist() == [True, False, False, True, False, False, False, False]
        assert (layer.mlp.experts.down_proj.grad[[1, 2, 4, 5, 6, 7]] == 0).all()
        assert layer.mlp.gate.weight.grad.abs().sum() > 0


def test_replay_works_with_gradient_checkpointing(model, ids):
    plain, ckpt = copy.deepcopy(model).train(), copy.deepcopy(model).train()
    ckpt.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mu = perturbed_router(model)
    with torch.no_grad(), RoutingReplay(mu).record() as rollout:
        mu(ids)
    for m in (plain, ckpt):
        with RoutingReplay(m).replay(rollout.routes):
            token_logp(m, ids).sum().backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), ckpt.named_parameters(), strict=True):
        if a.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_generation_recorder_matches_full_forward_layout(model):
    rr = RoutingReplay(model)
    prompts = torch.randint(1, VOCAB, (2, 5), generator=torch.Generator().manual_seed(3))
    attention_mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])  # LEFT padding
    with torch.no_grad(), rr.record_generation() as rec:
        out = model.generate(prompts, attention_mask=attention_mask, max_new_tokens=4, do_sample=False,
                             pad_token_id=0)  # fmt: skip
    per_sample = rec.per_sample(attention_mask, [4, 3])
    assert [tuple(r.shape) for r in per_sample] == [(3 + 4 - 1, 2, 2), (5 + 3 - 1, 2, 2)]
    assert all(r.dtype == torch.uint8 and int(r.max()) < 8 for r in per_sample)
    # The same unpadded sequence in one training forward routes identically (fp32, same weights).
    for i, (offset, gen) in enumerate([(2, 4), (0, 3)]):
        seq = out[i, offset : 5 + gen]
        with torch.no_grad(), rr.record() as full:
            model(seq[None])
        assert router_agreement(full.routes[0, :-1], per_sample[i]) == 1.0
    # Packed at the left-pad offset for a padded training batch; -1 = live elsewhere.
    packed = pack_routes(per_sample, offsets=[2, 0], total_len=9)
    assert packed.shape == (2, 9, 2, 2) and packed.dtype == torch.int16
    assert (packed[0, :2] == -1).all() and torch.equal(packed[0, 2:8], per_sample[0].to(torch.int16))
    assert (packed[0, 8] == -1).all() and (packed[1, 7:] == -1).all()


def test_r3_replay_of_packed_routes_reproduces_rollout_routing(model):
    mu = perturbed_router(model)
    ids = torch.randint(1, VOCAB, (2, 8), generator=torch.Generator().manual_seed(5))
    with torch.no_grad(), RoutingReplay(mu).record() as rollout:
        mu(ids)
    packed = pack_routes([rollout.routes[0, :-1], rollout.routes[1, :-1]], offsets=[0, 0], total_len=8)
    rr = RoutingReplay(model)
    with torch.no_grad(), rr.replay(packed):
        with_replay = _routes_seen(model, ids, rr)
    assert router_agreement(with_replay[:, :-1], rollout.routes[:, :-1]) == 1.0


def _routes_seen(model, ids, rr):
    """The experts the experts-module actually received during a forward (under whatever context is active)."""
    seen = []
    hooks = [layer.mlp.experts.register_forward_hook(lambda m, a, o: seen.append(a[1].clone()))
             for layer in model.model.layers]  # fmt: skip
    try:
        model(ids)
    finally:
        for h in hooks:
            h.remove()
    return torch.stack(seen, dim=1).reshape(ids.shape[0], ids.shape[1], rr.num_layers, rr.top_k)


def test_router_agreement_counts_expert_sets():
    a = torch.tensor([[[0, 1], [2, 3]], [[4, 5], [6, 7]]])  # [T=2, L=2, K=2]
    b = torch.tensor([[[1, 0], [2, 4]], [[4, 5], [-1, -1]]])  # order ignored; -1 skipped
    assert router_agreement(a, b) == pytest.approx(2 / 3)
    assert router_agreement(a, b, mask=torch.tensor([True, False])) == 0.5


def test_clear_errors(model, ids):
    rr = RoutingReplay(model)
    with pytest.raises(ValueError, match=r"routes must be \[N, S, L=2, K=2\]"):
        with rr.replay(torch.zeros(4, 12, 3, 2, dtype=torch.long)):
            pass
    with pytest.raises(ValueError, match="pass the routes of exactly this"):
        with torch.no_grad(), rr.replay(torch.zeros(3, 12, 2, 2, dtype=torch.long)):
            model(ids)
    with pytest.raises(ValueError, match="num_experts=8"):
        with rr.replay(torch.full((4, 12, 2, 2), 9)):
            pass
    with pytest.raises(RuntimeError, match="cannot be nested"):
        with rr.record(), rr.replay(torch.zeros(4, 12, 2, 2, dtype=torch.long)):
            pass
    with pytest.raises(ValueError, match="no MoE router"):
        RoutingReplay(torch.nn.Linear(2, 2))


# ---- how often the live router agrees with the replayed experts (the update passes' metric) ------------------------


@pytest.mark.parametrize("checkpointing", [False, True])
def test_replay_counts_how_often_the_live_router_chose_the_replayed_experts(model, ids, checkpointing):
    train = copy.deepcopy(model).train()
    if checkpointing:  # the backward recomputes every router: each forward must still count once
        train.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    rr = RoutingReplay(train)
    with torch.no_grad(), rr.record() as live:
        train(ids)
    routes = live.routes.to(torch.int16)  # [4, 12, L=2, K=2]: the live choice everywhere, so far
    routes[0, 9:] = -1  # 3 tokens route live (padding, last tokens): not compared
    # 5 tokens take other experts in the LAST layer only, so no later router sees a changed hidden state and every
    # other pair stays the live choice: exactly 5 of the (48 - 3) * 2 = 90 compared pairs disagree.
    changed = [(0, 2), (1, 0), (1, 5), (2, 3), (3, 11)]
    for row, pos in changed:
        routes[row, pos, -1] = (routes[row, pos, -1] + 1) % rr.num_experts  # {a, b} -> {a + 1, b + 1}: another set
    with rr.replay(routes) as agreement:
        token_logp(train, ids).sum().backward()
    assert agreement.counts() == (85.0, 90.0)
    assert agreement.fraction == pytest.approx(85 / 90)
    assert agreement.fraction == pytest.approx(router_agreement(live.routes, routes))  # the same definition
    with torch.no_grad(), rr.replay(routes, measure=False) as unmeasured:
        train(ids)
    assert unmeasured.counts() == (0.0, 0.0) and unmeasured.fraction is None


def test_measuring_the_agreement_changes_no_loss_gradient_or_route():
    from agentrl.models import load_model

    model = load_model("tiny-qwen3-moe").model.train()
    ids = torch.randint(0, 1000, (3, 10), generator=torch.Generator().manual_seed(2))
    mu = perturbed_router(model)  # a rollout engine whose experts differ from the live router's on some tokens
    with torch.no_grad(), RoutingReplay(mu).record() as rollout:
        mu(ids)
    routes = rollout.routes.to(torch.int16)
    routes[0, 7:] = -1  # some tokens keep the live choice
    rr = RoutingReplay(model)
    runs = {}
    for measure in (False, True):
        model.zero_grad(set_to_none=True)
        with rr.replay(routes, measure=measure) as agreement:
            used = _routes_seen(model, ids, rr)
            logp = token_logp(model, ids)
            loss = (logp * torch.linspace(-1.0, 1.0, logp.shape[1])).mean()
            loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        runs[measure] = loss.detach(), used, grads, agreement.counts()
    (loss_off, used_off, grads_off, counts_off), (loss_on, used_on, grads_on, counts_on) = runs[False], runs[True]
    assert torch.equal(loss_off, loss_on) and torch.equal(used_off, used_on)
    assert grads_off.keys() == grads_on.keys() and any(n.endswith("mlp.gate.weight") for n in grads_on)
    assert all(torch.equal(grads_off[n], grads_on[n]) for n in grads_off)
    assert counts_off == (0.0, 0.0)
    assert 0 < counts_on[0] < counts_on[1]  # the perturbed router moved some tokens' experts, not all


def test_replaying_strategies_report_the_update_passes_agreement():
    from agentrl.training.backend import LossResult
    from agentrl.training.routing_replay import (
        REPLAY_AGREEMENT,
        DenseRouting,
        LiveRouting,
        R2Routing,
        R3Routing,
    )

    for strategy in (R2Routing(), R3Routing()):
        strategy.begin_step(2)
        assert strategy.metrics()[REPLAY_AGREEMENT] is None  # no update pass yet
        strategy.updated(LossResult({}, 4.0, routes_agreed=3.0, routes_compared=4.0))
        strategy.updated(LossResult({}, 9.0, routes_agreed=5.0, routes_compared=6.0))
        assert strategy.metrics()[REPLAY_AGREEMENT] == pytest.approx(0.8)  # pooled over pairs: 8 / 10
        strategy.begin_step(2)  # the next step starts afresh
        assert strategy.metrics()[REPLAY_AGREEMENT] is None
    live = LiveRouting()
    live.begin_step(1)
    live.updated(LossResult({}, 4.0))  # routed live: nothing compared
    assert live.metrics() == {"router_agreement": None, REPLAY_AGREEMENT: None}
    assert REPLAY_AGREEMENT not in DenseRouting().metrics()  # a dense run's metrics do not gain the key
