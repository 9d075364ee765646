"""``engine.vllm`` (block size, KV dtype, batch limits, compilation): checked by the config, turned into vLLM's
``LLM(...)`` arguments, and carried by the engine spec to the constructor. vLLM never starts here: its ``LLM`` is
replaced by a recorder."""

from __future__ import annotations

import json

import pytest

from agentrl.config import ConfigError, RunConfig, VllmEngineConfig, apply_overrides
from agentrl.engine.base import EngineError
from agentrl.engine.factory import EngineSpec
from agentrl.engine.vllm import tuning_kwargs, vllm_available

CHANGED = VllmEngineConfig(block_size=32, kv_cache_dtype="fp8_e4m3", max_num_seqs=48, max_num_batched_tokens=8192,
                           enforce_eager=False)


def test_defaults_give_the_arguments_the_engine_always_passed():
    # The CPU build prefills whole prompts: the step budget is the longest context, at least 4096.
    assert tuning_kwargs(VllmEngineConfig(), max_model_len=4160, cpu=True) == {
        "enforce_eager": True, "enable_chunked_prefill": False, "max_num_batched_tokens": 4160}
    assert tuning_kwargs(VllmEngineConfig(), max_model_len=2048, cpu=True)["max_num_batched_tokens"] == 4096
    assert tuning_kwargs(VllmEngineConfig(), max_model_len=4160, cpu=False) == {"enforce_eager": True}


def test_every_setting_becomes_its_vllm_argument():
    assert tuning_kwargs(CHANGED, max_model_len=4160, cpu=True) == {
        "enforce_eager": False, "enable_chunked_prefill": False, "max_num_batched_tokens": 8192, "block_size": 32,
        "kv_cache_dtype": "fp8_e4m3", "max_num_seqs": 48}
    assert tuning_kwargs(CHANGED, max_model_len=4160, cpu=False) == {
        "enforce_eager": False, "max_num_batched_tokens": 8192, "block_size": 32, "kv_cache_dtype": "fp8_e4m3",
        "max_num_seqs": 48}


def test_a_step_budget_below_the_longest_prompt_is_refused_on_the_cpu_build_with_the_fix():
    small = VllmEngineConfig(max_num_batched_tokens=2048)
    with pytest.raises(EngineError, match="cannot hold the longest prompt .4160 tokens.*at least 4160, or set 0"):
        tuning_kwargs(small, max_model_len=4160, cpu=True)
    assert tuning_kwargs(small, max_model_len=4160, cpu=False)["max_num_batched_tokens"] == 2048  # GPUs chunk


@pytest.mark.parametrize("field, value, message", [
    ("block_size", 40, "engine.vllm.block_size must be 0 .vLLM's default. or a positive multiple of 16"),
    ("block_size", -32, "engine.vllm.block_size must be"),
    ("kv_cache_dtype", "int8", "engine.vllm.kv_cache_dtype must be one of auto, fp8, fp8_e4m3, fp8_e5m2"),
    ("max_num_seqs", -1, "engine.vllm.max_num_seqs must be >= 0"),
    ("max_num_batched_tokens", -1, "engine.vllm.max_num_batched_tokens must be >= 0"),
])
def test_bad_values_are_refused_naming_the_flag(field, value, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides(RunConfig(), {f"engine.vllm.{field}": value})


def test_flags_land_in_the_run_config_and_defaults_change_nothing():
    cfg = apply_overrides(RunConfig(), {"engine.vllm.block_size": 32, "engine.vllm.enforce_eager": False})
    assert cfg.engine.vllm == VllmEngineConfig(block_size=32, enforce_eager=False)
    assert RunConfig().engine.vllm == VllmEngineConfig() == EngineSpec().vllm


# -- the constructor (vLLM imported, never started) ---------------------------------------------------------------

needs_vllm = pytest.mark.skipif(vllm_available() is not None, reason="vLLM is not installed here")


class RecordingLLM:
    """Stands in for ``vllm.LLM``: keeps the keyword arguments, has what `VLLMEngine.__init__` reads after."""

    calls: list[dict] = []

    def __init__(self, **kwargs):
        RecordingLLM.calls.append(kwargs)
        self.llm_engine = object()

    def get_tokenizer(self):
        return type("Tokenizer", (), {"eos_token_id": 0})()


@pytest.fixture
def recorded(monkeypatch):
    import vllm

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine sets it; restored after the test
    monkeypatch.setattr(vllm, "LLM", RecordingLLM)
    RecordingLLM.calls = []
    return RecordingLLM.calls


@pytest.fixture
def model_dir(tmp_path):
    # A config vLLM's registry and CPU attention accept (Qwen3, head_dim 64); no weights: nothing is loaded.
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "hidden_size": 128, "num_attention_heads": 2, "head_dim": 64}))
    return tmp_path


@needs_vllm
def test_the_settings_reach_vllms_constructor(recorded, model_dir):
    from vllm.platforms import current_platform

    from agentrl.engine.vllm import VLLMEngine

    VLLMEngine(model_dir, max_model_len=2048, kv_cache_gib=0.01)
    VLLMEngine(model_dir, max_model_len=2048, kv_cache_gib=0.01, tuning=CHANGED)
    default, changed = recorded
    assert default["enforce_eager"] is True and default["enable_prefix_caching"] is True
    assert not {"block_size", "kv_cache_dtype", "max_num_seqs"} & set(default)
    assert {k: changed[k] for k in ("enforce_eager", "block_size", "kv_cache_dtype", "max_num_seqs",
                                    "max_num_batched_tokens")} == {
        "enforce_eager": False, "block_size": 32, "kv_cache_dtype": "fp8_e4m3", "max_num_seqs": 48,
        "max_num_batched_tokens": 8192}
    if current_platform.is_cpu():
        assert default["max_num_batched_tokens"] == 4096 and default["enable_chunked_prefill"] is False


@needs_vllm
def test_the_engine_spec_carries_the_settings_in_process_and_to_engine_actors(recorded, model_dir):
    from agentrl.engine.factory import build_engine
    from agentrl.engine.launch import build_engines
    from agentrl.models import load_model

    spec = EngineSpec(kind="vllm", kv_cache_gib=0.01, max_model_len=2048, vllm=CHANGED)
    build_engines(spec, load_model("tiny-qwen3-h64"))  # one engine, in this process (the driver of a local run)
    build_engine(spec, model_dir)  # what an engine actor builds from its spec
    assert len(recorded) == 2
    for kwargs in recorded:
        assert kwargs["block_size"] == 32 and kwargs["kv_cache_dtype"] == "fp8_e4m3"
        assert kwargs["enforce_eager"] is False and kwargs["max_num_seqs"] == 48
