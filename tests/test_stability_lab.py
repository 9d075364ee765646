"""Checks of the mismatch lab's building blocks (bench/studies/stability): quantized inference copies, the exact
enumeration of responses, the exact gradient-bias measurement, and tiny smoke runs of parts (a1) and (b).
"""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "studies" / "stability"))

from exact_gradient import enumerate_responses, gradient_bias  # noqa: E402
from is_runs import LOGGED, TrainSetup, train_run  # noqa: E402
from lab_models import (  # noqa: E402
    PROMPT_LEN,
    chain_reward,
    quantize_weight,
    quantized_copy,
    response_logp,
    tiny_moe,
)
from replay_runs import replay_run  # noqa: E402

VOCAB, RESPONSE_LEN = 8, 3


@pytest.fixture(scope="module")
def model():
    return tiny_moe(0, vocab=VOCAB, embed_std=1.0, head_std=0.3).eval()


def test_quantize_weight_formats():
    w = torch.randn(16, 32, generator=torch.Generator().manual_seed(0))
    assert torch.equal(quantize_weight(w, "fp32"), w)
    assert torch.equal(quantize_weight(w, "bf16"), w.to(torch.bfloat16).float())
    q = quantize_weight(w, "fp8_e4m3")
    # The per-row scale maps each row's largest magnitude onto the format's max, which FP8 represents exactly.
    torch.testing.assert_close(q.abs().amax(1), w.abs().amax(1))
    rel = ((q - w).abs() / w.abs().amax(1, keepdim=True)).max()
    assert 0 < rel <= 2**-4  # 3 mantissa bits: half an ulp at the top binade, relative to the row max
    assert (quantize_weight(w, "fp8_e5m2") - w).abs().mean() > (q - w).abs().mean()  # 2 mantissa bits are coarser
    with pytest.raises(ValueError, match="unknown weight format 'int3'"):
        quantize_weight(w, "int3")


def test_quantized_copy_leaves_the_policy_untouched(model):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    mu = quantized_copy(model, "fp8_e4m3")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not torch.equal(mu.lm_head.weight, model.lm_head.weight)
    assert torch.equal(mu.model.norm.weight, model.model.norm.weight)  # norms stay in full precision


def test_enumeration_is_a_distribution_matching_the_model(model):
    prompts = torch.randint(0, VOCAB, (2, PROMPT_LEN), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        enum = enumerate_responses(model, prompts, VOCAB, RESPONSE_LEN)
    assert enum.seq.shape == (2 * VOCAB**RESPONSE_LEN, PROMPT_LEN + RESPONSE_LEN)
    assert enum.seq[:, PROMPT_LEN:].unique(dim=0).shape[0] == VOCAB**RESPONSE_LEN
    totals = enum.logp.sum(1).exp().view(2, -1).sum(1)
    torch.testing.assert_close(totals, torch.ones(2))
    rows = torch.tensor([0, 77, VOCAB**RESPONSE_LEN + 300])
    with torch.no_grad():
        direct, _ = response_logp(model, enum.seq[rows])
    torch.testing.assert_close(enum.logp[rows], direct, atol=1e-5, rtol=1e-5)


def _bias(model, fmt):
    prompts = torch.randint(0, VOCAB, (2, PROMPT_LEN), generator=torch.Generator().manual_seed(2))
    return gradient_bias(model, quantized_copy(model, fmt), prompts, VOCAB, RESPONSE_LEN, chain_reward,
                         group=4, n_batches=2, batch_seed=0)  # fmt: skip


def test_no_mismatch_every_correction_is_the_exact_gradient(model):
    mismatch, biases = _bias(model, "fp32")
    assert mismatch["kl_k3"] == 0
    for name, b in biases.items():
        assert b.relative_bias < 1e-4, name
        assert b.cosine == pytest.approx(1, abs=1e-4)
    # Common random numbers: with all weights 1, every correction sees the same batches and the same gradient.
    assert len({round(b.batch_cosine_mean, 5) for b in biases.values()}) == 1


def test_mismatch_biases_the_uncorrected_gradient_but_not_sequence_is(model):
    mismatch, biases = _bias(model, "fp8_e5m2")
    assert mismatch["kl_k3"] > 1e-3
    assert biases["seq_is"].relative_bias < 1e-4  # exact sequence-level IS is unbiased
    assert biases["none"].relative_bias > 0.05
    assert biases["tis"].relative_bias < biases["none"].relative_bias


def test_train_run_smoke():
    setup = TrainSetup(steps=3, n_prompts=2, group=4, response_len=4)
    history = train_run(setup, "icepop", seed=0)
    assert set(history) == set(LOGGED)
    assert all(len(v) == 3 for v in history.values())
    assert all(0 <= r <= 1 for r in history["reward"])
    assert history["kl_k3"][0] > 0  # the FP8 inference copy does differ from the float32 policy


def test_replay_run_r3_routes_like_the_rollout():
    r3 = replay_run("R3", 2, rollouts=1, lr=1e-2, seed=0, router_noise=0.1)
    live = replay_run("none", 2, rollouts=1, lr=1e-2, seed=0, router_noise=0.1)
    assert r3["router_agreement"] == 1.0
    assert live["router_agreement"] < 1.0
