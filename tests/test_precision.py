"""Training precision: bfloat16 compute with float32 master weights, and the `auto` choice by hardware capability."""

from __future__ import annotations

import pytest
import torch
from test_training_memory import _samples  # the same random samples as the memory tests

from agentrl.config import ConfigError, TrainerConfig
from agentrl.training.logprobs import token_logprobs
from agentrl.training.microbatch import collate
from agentrl.training.precision import MasterWeights, native_bf16, resolve_compute_dtype


def _backend(compute_dtype, lr=1e-3, **kwargs):
    from agentrl.models import load_model
    from agentrl.training.single import SingleProcessBackend

    torch.manual_seed(0)
    policy = load_model(kwargs.pop("model", "tiny-qwen3"))
    return SingleProcessBackend(policy, lr=lr, betas=(0.9, 0.999), weight_decay=0.01, compute_dtype=compute_dtype,
                                **kwargs)


def _train_step(backend, batches):
    for mb in batches:
        logp, _ = backend.passes.logprobs(backend.model, mb)
        (logp.sum() * 0.1).backward()
    return backend.step(grad_clip=1.0)


# --- the choice -------------------------------------------------------------------------------------------------------

def test_auto_picks_bfloat16_only_where_the_cpu_has_native_bf16():
    assert resolve_compute_dtype("auto", "float32", cpu_flags={"avx512f", "avx512_bf16"}).dtype == "bfloat16"
    assert resolve_compute_dtype("auto", "float32", cpu_flags={"amx_bf16", "amx_tile"}).dtype == "bfloat16"
    forced_off = resolve_compute_dtype("auto", "float32", cpu_flags={"avx512f", "avx2", "fma"})
    assert forced_off.dtype == "float32" and "no native bfloat16" in forced_off.why
    assert resolve_compute_dtype("auto", "float32", cpu_flags=set()).dtype == "float32"
    assert native_bf16(on_gpu=True, cpu_flags=set())[0]
    assert resolve_compute_dtype("auto", "float32", on_gpu=True, cpu_flags=set()).dtype == "bfloat16"


def test_explicit_settings_win_and_a_low_precision_model_computes_in_its_own_dtype():
    no_bf16 = {"avx2"}
    assert resolve_compute_dtype("float32", "float32", cpu_flags={"avx512_bf16"}).dtype == "float32"
    assert resolve_compute_dtype("", "float32", cpu_flags={"avx512_bf16"}).dtype == "float32"
    assert resolve_compute_dtype("bfloat16", "float32", cpu_flags=no_bf16).dtype == "bfloat16"
    assert resolve_compute_dtype("auto", "bfloat16", cpu_flags=no_bf16).dtype == "bfloat16"


def test_compute_dtype_is_auto_by_default_and_a_bad_value_names_the_key():
    assert TrainerConfig().compute_dtype == "auto"
    with pytest.raises(ConfigError, match="trainer.compute_dtype"):
        TrainerConfig(compute_dtype="int8")


def test_the_old_fsdp_param_dtype_key_points_to_compute_dtype(tmp_path):
    from agentrl.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text("trainer:\n  param_dtype: bfloat16\n")
    with pytest.raises(ConfigError, match="trainer.compute_dtype"):
        load_config(path)


# --- master weights ---------------------------------------------------------------------------------------------------

def test_bf16_compute_runs_the_module_in_bf16_with_float32_masters_and_gradients():
    backend = _backend(torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in backend.model.parameters())
    masters = list(backend.master.parameters())
    assert masters and all(m.dtype == torch.float32 for m in masters)
    assert {id(p) for g in backend.optimizer.param_groups for p in g["params"]} == {id(m) for m in masters}
    mb = collate(_samples([40, 33, 52]), pad_id=0)
    logp, ent = token_logprobs(backend.model, mb, with_entropy=True)
    assert logp.dtype == ent.dtype == torch.float32
    logp.sum().backward()
    assert all(p.grad is None for p in backend.model.parameters()), "bf16 gradients must move to the masters"
    assert all(m.grad is not None and m.grad.dtype == torch.float32 for m in masters)


def test_bf16_logprobs_and_gradients_stay_close_to_float32():
    ref, mixed = _backend(None), _backend(torch.bfloat16)
    mb = collate(_samples([40, 33, 52]), pad_id=0)
    ref_lp, _ = token_logprobs(ref.model, mb)
    ref_lp.sum().backward()
    lp, _ = token_logprobs(mixed.model, mb)
    lp.sum().backward()
    sel = mb.loss_mask.bool()
    assert not torch.equal(lp, ref_lp), "nothing ran in bfloat16"
    # bfloat16 keeps 8 bits of mantissa: log-probs move by hundredths of a nat, not more.
    assert (lp[sel] - ref_lp[sel]).abs().max() < 0.1
    assert (lp[~sel] == 0).all()
    ref_grads = {n: p.grad for n, p in ref.model.named_parameters()}
    for (name, _), master in zip(mixed.model.named_parameters(), mixed.master.parameters()):
        cos = torch.nn.functional.cosine_similarity(master.grad.flatten(), ref_grads[name].flatten(), dim=0)
        assert cos > 0.98, (name, float(cos))


def test_micro_batches_accumulate_in_float32_on_the_masters():
    backend = _backend(torch.bfloat16)
    a, b = collate(_samples([30, 20], seed=1), pad_id=0), collate(_samples([25, 44], seed=2), pad_id=0)
    grads = []
    for mb in (a, b):
        for m in backend.master.parameters():
            m.grad = None
        token_logprobs(backend.model, mb)[0].sum().backward()
        grads.append([m.grad.clone() for m in backend.master.parameters()])
    for m in backend.master.parameters():
        m.grad = None
    for mb in (a, b):
        token_logprobs(backend.model, mb)[0].sum().backward()
    for m, ga, gb in zip(backend.master.parameters(), *grads):
        assert torch.equal(m.grad, ga + gb)  # float32 sums of the two micro-batches' bf16 gradients, exactly


def test_a_tiny_update_lands_in_the_masters_and_the_module_gets_them_rounded_once():
    backend = _backend(torch.bfloat16, lr=1e-6)
    before = [m.detach().clone() for m in backend.master.parameters()]
    module_before = [p.detach().clone() for p in backend.model.parameters()]
    _train_step(backend, [collate(_samples([40, 33]), pad_id=0)])
    moved = sum(not torch.equal(m, b) for m, b in zip(backend.master.parameters(), before))
    assert moved > len(before) // 2  # a 1e-6 step is below bf16's spacing, but float32 masters keep it
    # Most bf16 weights do not move at all: the step is below their resolution (what bf16 weights would lose).
    module_moved = sum(not torch.equal(p, b) for p, b in zip(backend.model.parameters(), module_before))
    assert module_moved < moved
    for p, m in zip(backend.model.parameters(), backend.master.parameters()):
        assert torch.equal(p, m.detach().to(torch.bfloat16))


def test_compute_float32_is_plain_float32_training_bit_for_bit():
    """`--trainer.compute-dtype float32` trains as earlier versions did: the module's own parameters, AdamW on them."""
    backend = _backend(torch.float32)
    assert backend.master is None
    reference = _backend(None)
    batches = [collate(_samples([40, 33], seed=3), pad_id=0), collate(_samples([21, 50], seed=4), pad_id=0)]
    for _ in range(2):
        assert _train_step(backend, batches) == _train_step(reference, batches)
    for p, q in zip(backend.model.parameters(), reference.model.parameters()):
        assert p.dtype == torch.float32 and torch.equal(p, q)
    # and by hand: the same AdamW over the same model gives the same weights
    from agentrl.models import load_model

    torch.manual_seed(0)
    plain = load_model("tiny-qwen3").model.train()
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01)
    for _ in range(2):
        for mb in batches:
            (token_logprobs(plain, mb)[0].sum() * 0.1).backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    for p, q in zip(backend.model.parameters(), plain.parameters()):
        assert torch.equal(p, q)


def test_checkpoints_and_the_weight_sync_carry_the_float32_masters(tmp_path):
    from safetensors.torch import load_file

    backend = _backend(torch.bfloat16)
    _train_step(backend, [collate(_samples([40, 33]), pad_id=0)])
    synced = dict(backend.named_weights())
    assert all(t.dtype == torch.float32 for t in synced.values())
    masters = backend.master.state_dict()
    backend.save(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    for name, tensor in saved.items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, masters[name]), name
    # a fresh backend loads the masters (exactly) and the module gets them in bf16
    other = _backend(torch.bfloat16)
    other.load(tmp_path)
    for m, n in zip(backend.master.parameters(), other.master.parameters()):
        assert torch.equal(m, n)
    for p, m in zip(other.model.parameters(), other.master.parameters()):
        assert torch.equal(p, m.detach().to(torch.bfloat16))
    # the optimizer continues from the same state: one more identical step gives identical masters
    batches = [collate(_samples([22, 31], seed=5), pad_id=0)]
    _train_step(backend, batches)
    _train_step(other, batches)
    for m, n in zip(backend.master.parameters(), other.master.parameters()):
        assert torch.equal(m, n)


def test_lora_under_bf16_trains_float32_adapters_and_merges_float32_weights():
    from agentrl.config import LoraConfig

    backend = _backend(torch.bfloat16, lora=LoraConfig(rank=4, alpha=8))
    trained = list(backend.master.parameters())
    assert trained and all("lora_" in n for n, p in backend.model.named_parameters() if p.requires_grad)
    assert sum(m.numel() for m in trained) == sum(p.numel() for p in backend.model.parameters() if p.requires_grad)
    before = {n: t.clone() for n, t in backend.adapter_weights()}
    _train_step(backend, [collate(_samples([40, 33]), pad_id=0)])
    after = dict(backend.adapter_weights())
    assert all(t.dtype == torch.float32 for t in after.values())
    assert any(not torch.equal(after[n], before[n]) for n in before)
    merged = dict(backend.named_weights())
    assert all(t.dtype == torch.float32 for t in merged.values() if t.is_floating_point())
    assert not any("lora_" in n for n in merged)


def test_master_weights_keep_tied_parameters_tied():
    from agentrl.models import load_model

    model = load_model("tiny-qwen3").model
    tied = model.get_input_embeddings().weight is model.get_output_embeddings().weight
    master = MasterWeights(model, torch.bfloat16)
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight or not tied
    assert len(list(master.parameters())) == len(list(model.parameters()))
