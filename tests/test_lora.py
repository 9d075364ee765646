"""LoRA (``trainer.lora``): adapters train, engines sample with them, the sync ships them alone, resume is exact."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from agentrl.config import ConfigError, LoraConfig, RunConfig, apply_overrides
from agentrl.models import load_model
from agentrl.training import lora as L


def _adapted(rank: int = 4, seed: int = 0):
    torch.manual_seed(seed)
    policy = load_model("tiny-qwen3")
    L.add_lora(policy.model, LoraConfig(rank=rank))
    with torch.no_grad():  # B starts at zero: give the adapter something to merge
        for name, p in policy.model.named_parameters():
            if ".lora_B." in name:
                p.normal_(0.0, 0.05)
    return policy


def test_adapters_freeze_the_base_and_merge_to_the_same_function(tmp_path):
    policy = _adapted()
    model = policy.model
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(L.is_adapter_name(n) for n in trainable)
    assert L.adapter_parameter_count(model.config, LoraConfig(rank=4)) == sum(
        p.numel() for p in model.parameters() if p.requires_grad)
    # The merged state is a plain model computing what the adapted one computes.
    plain = load_model("tiny-qwen3").model
    missing, unexpected = plain.load_state_dict(L.merged_state(model.state_dict(), L.scalings(model)), strict=False)
    assert not unexpected and all(k.endswith("lm_head.weight") for k in missing)
    ids = torch.randint(0, 1000, (2, 12))
    model.eval()
    torch.testing.assert_close(plain(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
    # peft's layout on disk; read back under the module's names; an adapter-only folder loads merged.
    L.save_adapter(tmp_path, L.adapter_state(model), LoraConfig(rank=4), "tiny-qwen3")
    saved = json.loads((tmp_path / L.ADAPTER_CONFIG).read_text())
    assert saved["r"] == 4 and saved["base_model_name_or_path"] == "tiny-qwen3"
    back = L.read_adapter(tmp_path)
    assert back.keys() == L.adapter_state(model).keys()
    assert all(torch.equal(back[k], v) for k, v in L.adapter_state(model).items())
    (tmp_path / "agentrl_model.json").write_text(json.dumps({"family": "qwen3", "base_model": "tiny-qwen3"}))
    merged = load_model(str(tmp_path))
    assert not L.has_lora(merged.model) and merged.family == "qwen3"


def test_lora_settings_are_checked_and_shrink_the_memory_plan():
    with pytest.raises(ConfigError, match="trainer.lora.rank"):
        apply_overrides(RunConfig(), {"trainer.lora.rank": -1})
    with pytest.raises(ConfigError, match="trainer.lora.dropout"):
        apply_overrides(RunConfig(), {"trainer.lora.dropout": 1.0})
    with pytest.raises(ValueError, match="linear layers are"):
        L.add_lora(load_model("tiny-qwen3").model, LoraConfig(rank=4, target_modules=("c_attn",)))
    from agentrl.training.memory import estimate_train_memory

    config = load_model("tiny-qwen3").model.config
    kw = dict(dtype_bytes=4, tokens=512, gradient_checkpointing=False, engine_copy=False)
    full = estimate_train_memory(config, 10_000_000, **kw)
    lora = estimate_train_memory(config, 10_000_000, trainable_params=20_000, **kw)
    assert lora.optimizer == 2 * 20_000 * 4 and lora.gradients == 20_000 * 4 and lora.total < full.total


def _config(tmp_path, name: str, **overrides) -> RunConfig:
    from test_train import tiny_config  # registers the parity-test env

    return tiny_config(tmp_path, output=str(tmp_path / name), **{
        "trainer.lora.rank": 8, "engine.kind": "hf", "optim.lr": 1e-2, "save_every": 1,
        "optim.n_minibatches": 2} | overrides)


def _rows(path) -> list[dict]:
    timing = ("seconds", "_per_s", "busy_frac")
    return [{k: v for k, v in json.loads(line).items() if not any(t in k for t in timing)}
            for line in path.read_text().splitlines()]


@pytest.fixture
def hf_synced_names(monkeypatch) -> list[set[str]]:
    """The tensor names of every weight sync into an HF engine during the test, one set per sync."""
    from agentrl.engine.hf import HFEngine

    synced: list[set[str]] = []
    real_update = HFEngine.update_weights

    def record(self, named, version):
        pairs = list(named)
        synced.append({n for n, _ in pairs})
        return real_update(self, pairs, version)

    monkeypatch.setattr(HFEngine, "update_weights", record)
    return synced


def test_hf_engine_samples_with_synced_adapters_and_resume_is_exact(tmp_path, monkeypatch, hf_synced_names):
    """The HF engine's own copy gets the adapters alone; its log-probs are the trainer's; a resume continues exactly."""
    import agentrl.recipes.setup as setup_mod
    from agentrl.recipes.train import train

    real_build = setup_mod.build_engines
    # An engine copy of its own (not the trainer's module), so every step's weights reach it by the sync.
    monkeypatch.setattr(setup_mod, "build_engines", lambda *a, **k: real_build(*a, **k | {"share_module": False}))
    synced = hf_synced_names
    straight = train(_config(tmp_path, "straight", steps=2), progress=False)
    rows = _rows(straight / "metrics.jsonl")
    # Step 1 samples with the adapters step 0 trained (lr 1e-2 moves them): mu equals pi_old to float noise.
    assert [r["step"] for r in rows] == [0, 1] and all(abs(r["kl_k3"]) < 1e-4 for r in rows), rows
    assert synced and all(names and all(L.is_adapter_name(n) for n in names) for names in synced)
    plan = json.loads((straight / "plan.json").read_text())
    assert plan["sync_adapters"] and "adapters alone" in plan["lora"]

    first = _config(tmp_path, "resumed", steps=1)
    train(first, progress=False)
    resumed = train(replace(first, steps=2), resume=True, progress=False)
    assert _rows(resumed / "metrics.jsonl") == rows
    a, b = L.read_adapter(straight / "checkpoint"), L.read_adapter(resumed / "checkpoint")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # The checkpoint's merged model is a plain HF model whose untargeted weights are the base's.
    from safetensors.torch import load_file

    merged = load_file(straight / "checkpoint" / "model.safetensors")
    torch.manual_seed(0)
    base = load_model("tiny-qwen3").model.state_dict()
    assert merged.keys() <= base.keys()
    assert torch.equal(merged["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"],
                           base["model.layers.0.self_attn.q_proj.weight"])

    # A LoRA checkpoint resumed without LoRA (or the reverse) is refused in one line.
    with pytest.raises(ConfigError, match="holds a LoRA adapter"):
        train(replace(first, steps=3, trainer=replace(first.trainer, lora=LoraConfig())), resume=True, progress=False)


@pytest.mark.slow  # two Ray workers loading a model: about 100 s on the shared 2-core box
@pytest.mark.timeout(900)
def test_fsdp_workers_shard_the_adapters_and_gather_the_single_process_update(local_ray):
    """Two gloo workers: each holds half of the adapters' AdamW state; gathered, they equal one process's update."""
    from test_fsdp import _two_updates

    from agentrl.training.fsdp import FSDPBackend, WorkerSpec
    from agentrl.training.placement import Placement, PlacementPlan
    from agentrl.training.single import SingleProcessBackend

    settings = LoraConfig(rank=4)
    single = SingleProcessBackend(load_model("tiny-qwen3"), lr=1e-2, betas=(0.9, 0.999), weight_decay=0.0,
                                  lora=settings)
    ref_norms, ref_merged = _two_updates(single)
    ref_adapter = dict(single.adapter_weights())
    trainable = sum(t.numel() for t in ref_adapter.values())
    placement = Placement(PlacementPlan(2))
    backend = FSDPBackend(WorkerSpec("tiny-qwen3", lr=1e-2, lora=settings), 2, placement)
    try:
        norms, merged = _two_updates(backend)
        adapter = dict(backend.adapter_weights())
        memory = backend.memory()
    finally:
        backend.close()
        placement.close()
    # Tolerance: float32 summation order differs between shards (test_fsdp: 1e-7 after two AdamW steps of lr 1e-3);
    # at lr 1e-2, seen here: 1.0e-6.
    assert norms == pytest.approx(ref_norms, rel=1e-5)
    assert adapter.keys() == ref_adapter.keys()
    for name in ref_adapter:
        torch.testing.assert_close(adapter[name], ref_adapter[name], rtol=0, atol=1e-5,
                                   msg=lambda m, n=name: f"{n}: {m}")
    assert merged.keys() == ref_merged.keys() and not any(".lora_" in k or "base_layer" in k for k in merged)
    for name in ref_merged:
        torch.testing.assert_close(merged[name], ref_merged[name], rtol=0, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    # Sharded: AdamW's two float32 moments of half the adapters on each rank (plus a step counter per tensor).
    for rank in memory:
        assert 2 * 4 * trainable / 2 <= rank["optimizer"] <= 2 * 4 * trainable / 2 + 8 * len(ref_adapter) + 64


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fsdp_lora_run_syncs_gathered_adapters_to_the_engine(tmp_path, hf_synced_names):
    """A whole run with two workers: the driver's engine gets the workers' adapters alone and samples pi_old."""
    from agentrl.recipes.train import train

    synced = hf_synced_names
    out = train(_config(tmp_path, "fsdp", steps=2, **{"trainer.workers": 2, "trainer.memory_limit_gb": 4.0}),
                progress=False)
    rows = _rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1] and all(abs(r["kl_k3"]) < 1e-4 for r in rows), rows
    assert synced and all(names and all(L.is_adapter_name(n) for n in names) for names in synced)
    ckpt = out / "checkpoint"
    assert (ckpt / L.ADAPTER_WEIGHTS).exists() and (ckpt / "model.safetensors").exists() and (ckpt / "shards").is_dir()


def _vllm_missing() -> str | None:
    from agentrl.engine.vllm import vllm_available

    return vllm_available()


@pytest.mark.slow  # vLLM starts in about 40 s here, and compiles its first steps
@pytest.mark.timeout(900)
@pytest.mark.skipif(_vllm_missing() is not None, reason="vLLM is not installed or not usable here")
def test_vllm_engine_samples_with_adapters_by_version_and_resume_is_exact(tmp_path, monkeypatch):
    """vLLM CPU: the base loads once, each version's adapter after; its log-probs are the trainer's; resume is exact."""
    import os

    from agentrl.engine.vllm import VLLMEngine
    from agentrl.recipes.train import train

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    synced: list[tuple[int, set[str]]] = []
    real_update = VLLMEngine.update_weights

    def record(self, named, version):
        pairs = list(named)
        synced.append((version, {n for n, _ in pairs}))
        return real_update(self, pairs, version)

    monkeypatch.setattr(VLLMEngine, "update_weights", record)
    settings = {"model": "tiny-qwen3-h64", "engine.kind": "vllm", "engine.kv_cache_gib": 0.25,
                "context.max_context_tokens": 512}
    straight = train(_config(tmp_path, "straight", steps=2, **settings), progress=False)
    rows = _rows(straight / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1] and all(abs(r["kl_k3"]) < 1e-4 for r in rows), rows
    # The start's adapter (version 0), then step 0's (version 1): adapter tensors only.
    assert [v for v, _ in synced] == [0, 1]
    assert all(names and all(L.is_adapter_name(n) for n in names) for _, names in synced)
    assert json.loads((straight / "plan.json").read_text())["sync_adapters"]

    first = _config(tmp_path, "resumed", steps=1, **settings)
    train(first, progress=False)
    resumed = train(replace(first, steps=2), resume=True, progress=False)
    assert _rows(resumed / "metrics.jsonl") == rows
    a, b = L.read_adapter(straight / "checkpoint"), L.read_adapter(resumed / "checkpoint")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow  # three CLI processes, each loading torch and transformers
def test_cli_lora_run_then_eval_and_resume_an_adapter_only_checkpoint(tmp_path):
    """`agentrl run --trainer.lora.rank 8 --trainer.lora.no-save-merged`, then `agentrl eval --model RUN/checkpoint`
    (the base named in adapter_config.json, the adapter merged in) and `agentrl run --resume RUN`."""
    import subprocess
    import sys

    from conftest import ROOT

    def agentrl(*args):
        return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True,
                              timeout=600, cwd=ROOT)

    run = tmp_path / "run"
    out = agentrl("run", "--env", "math", "--model", "tiny-qwen3", "--engine", "hf", "--steps", "1",
                  "--group-size", "2", "--prompts-per-step", "2", "--max-new-tokens", "8", "--output", str(run),
                  "--trainer.lora.rank", "8", "--trainer.lora.no-save-merged", "--guard.no-enabled")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "weight sync ships the adapters alone" in out.stdout + out.stderr
    ckpt = run / "checkpoint"
    assert (ckpt / L.ADAPTER_WEIGHTS).exists() and not (ckpt / "model.safetensors").exists()
    assert (ckpt / L.ADAPTER_WEIGHTS).stat().st_size < 200_000  # the adapter alone (the model is ~40 MB)
    out = agentrl("eval", "--env", "math", "--model", str(ckpt), "--episodes", "2", "--max-new-tokens", "8",
                  "--output", str(tmp_path / "eval"))
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(json.loads((tmp_path / "eval" / "results.json").read_text())["episodes"]) == 2
    out = agentrl("run", "--resume", str(run), "--steps", "2")
    assert out.returncode == 0, out.stderr[-2000:]
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2


def test_sft_takes_the_same_lora_setting(tmp_path):
    """`agentrl sft` with trainer.lora: the adapters alone train, the loss falls, the checkpoint holds the adapter."""
    from test_sft import CorridorEnv  # noqa: F401  (registers corridor-test)

    from agentrl.config import EnvConfig, OptimConfig, TrainerConfig
    from agentrl.recipes.sft import SFTConfig, run_sft

    cfg = SFTConfig(model="tiny-qwen3", env=EnvConfig("corridor-test", {}), demos=1, epochs=4, batch_size=8,
                    trainer=TrainerConfig(micro_batch_size=2, lora=LoraConfig(rank=8)), optim=OptimConfig(lr=3e-2),
                    warmup_steps=0, eval_episodes=0, val_demos=0, output=str(tmp_path / "sft"))
    out = run_sft(cfg, progress=False)
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert min(losses[1:]) < losses[0], losses  # lr 3e-2 oscillates: the loss falls, not monotonically
    ckpt = out / "checkpoint"
    assert (ckpt / L.ADAPTER_CONFIG).exists() and (ckpt / "model.safetensors").exists()
    torch.manual_seed(0)
    base = load_model("tiny-qwen3").model.state_dict()
    adapter = L.read_adapter(ckpt)
    assert any(float(t.abs().max()) > 0 for n, t in adapter.items() if ".lora_B." in n)  # B moved off zero
    from safetensors.torch import load_file

    merged = load_file(ckpt / "model.safetensors")
    assert torch.equal(merged["model.layers.0.input_layernorm.weight"], base["model.layers.0.input_layernorm.weight"])
