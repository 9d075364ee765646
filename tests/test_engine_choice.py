"""`--engine auto` (the default): which engine a run or an eval builds, decided once. The vLLM side, with the real
CPU build, is in test_vllm.py; these run with or without vLLM installed."""

import pytest

from agentrl.config import ConfigError, EngineConfig
from agentrl.engine import choose_engine
from agentrl.engine import vllm as vllm_module
from agentrl.recipes.evaluate import EvalConfig


def test_auto_falls_back_to_hf_with_the_reason_when_vllm_cannot_import(tiny_qwen3, monkeypatch):
    monkeypatch.setattr(vllm_module, "vllm_available", lambda: "ModuleNotFoundError: No module named 'vllm'")
    kind, why = choose_engine("auto", tiny_qwen3.model, "tiny-qwen3")
    assert kind == "hf" and "No module named 'vllm'" in why


def test_named_engines_are_taken_as_asked(tiny_qwen3, monkeypatch):
    def must_not_probe():
        raise AssertionError("a named engine must not probe vLLM")

    monkeypatch.setattr(vllm_module, "vllm_available", must_not_probe)
    assert choose_engine("hf", tiny_qwen3.model, "tiny-qwen3") == ("hf", "")
    assert choose_engine("vllm", tiny_qwen3.model, "tiny-qwen3") == ("vllm", "")


def test_auto_is_the_default_and_a_misspelt_engine_is_refused_with_the_choices(tmp_path):
    assert EngineConfig().kind == "auto" and EvalConfig(model="m").engine.kind == "auto"
    with pytest.raises(ConfigError, match="engine.kind must be auto, hf or vllm, got 'vlm'"):
        EngineConfig(kind="vlm")
    with pytest.raises(ConfigError, match="engine.replicas must be >= 1"):
        EvalConfig(model="m", engine=EngineConfig(replicas=0))


def test_runs_sample_in_bfloat16_on_vllm_and_in_the_trainers_dtype_on_hf_unless_asked():
    from agentrl.engine.plan import engine_dtype

    train = dict(trainer_compute="float32", weights_dtype="float32")
    assert engine_dtype("", "vllm", **train) == "bfloat16"  # the mismatch study (docs/results.md)
    assert engine_dtype("", "hf", **train) == "float32"
    assert engine_dtype("", "hf", trainer_compute="bfloat16", weights_dtype="float32") == "bfloat16"
    assert engine_dtype("float32", "vllm", **train) == "float32"
    # Evaluation and serving sample in the weights' own dtype, whatever the kind.
    assert engine_dtype("", "vllm", trainer_compute=None, weights_dtype="float32") == "float32"
    assert EngineConfig().dtype == ""  # empty: resolved per engine kind in the run plan
