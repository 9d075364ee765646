"""Official sampling settings: read from a generation_config.json, thinking modes, flags, and the engine penalties."""

from __future__ import annotations

import json

import pytest
import torch

from agentrl.engine import HFEngine, SamplingParams
from agentrl.engine.hf import process_logits
from agentrl.recipes.evaluate import EvalError, official_sampling, resolve_split, training_sampling

# A generation_config.json as a model publishes it (transformers keys, ids and version included).
GENERATION_CONFIG = {
    "bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
    "temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.05,
    "presence_penalty": 0.5, "typical_p": 0.9, "transformers_version": "4.51.0",
}


@pytest.fixture(scope="module")
def checkpoint_folder(tiny_qwen3, tmp_path_factory):
    """A local model folder (as `agentrl run` checkpoints are) holding the fixture generation_config.json."""
    folder = tmp_path_factory.mktemp("model")
    tiny_qwen3.model.save_pretrained(folder)
    tiny_qwen3.tokenizer.save_pretrained(folder)
    (folder / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
    (folder / "agentrl_model.json").write_text(json.dumps({"family": "chatml", "base_model": "tiny-qwen3"}))
    return folder


def test_settings_are_read_from_generation_config_json(checkpoint_folder):
    from agentrl.models import load_model

    loaded = load_model(str(checkpoint_folder))
    resolved = official_sampling(loaded.generation_config, loaded.family, max_new_tokens=32)
    p = resolved.params
    assert (p.temperature, p.top_p, p.top_k, p.min_p) == (0.7, 0.8, 20, 0.05)
    assert (p.repetition_penalty, p.presence_penalty, p.frequency_penalty) == (1.05, 0.5, 0.0)
    assert resolved.sources["temperature"] == "generation_config.json"
    assert resolved.sources["frequency_penalty"] == "default (off)"
    assert resolved.ignored == ("typical_p=0.9",)  # said out loud, never dropped silently
    assert resolved.chat_kwargs == {}  # chatml has no thinking mode
    saved = resolved.to_dict()
    assert saved["temperature"] == 0.7 and saved["ignored"] == ["typical_p=0.9"] and saved["max_new_tokens"] == 32


def test_builtin_qwen3_defaults_to_its_official_thinking_settings():
    from agentrl.models import QWEN3_GENERATION

    resolved = official_sampling(QWEN3_GENERATION, "qwen3")
    assert (resolved.params.temperature, resolved.params.top_p, resolved.params.top_k) == (0.6, 0.95, 20)
    assert resolved.chat_kwargs == {"enable_thinking": True} and resolved.sources["thinking"] == "qwen3 default"


def test_qwen3_without_thinking_uses_the_model_card_non_thinking_settings():
    from agentrl.models import QWEN3_GENERATION

    resolved = official_sampling(QWEN3_GENERATION, "qwen3", thinking=False)
    assert (resolved.params.temperature, resolved.params.top_p, resolved.params.top_k) == (0.7, 0.8, 20)
    assert resolved.chat_kwargs == {"enable_thinking": False}
    assert "non-thinking" in resolved.sources["temperature"]


def test_flags_override_and_do_sample_false_means_greedy():
    resolved = official_sampling({"do_sample": False, "temperature": 0.6}, "chatml")
    assert resolved.params.temperature == 0.0 and "greedy" in resolved.sources["temperature"]
    flagged = official_sampling({"temperature": 0.6, "top_k": -1}, "chatml", overrides={"temperature": 1.0})
    assert flagged.params.temperature == 1.0 and flagged.sources["temperature"] == "flag"
    assert flagged.params.top_k == 0  # vLLM's -1 means off


def test_bad_settings_name_the_problem():
    with pytest.raises(EvalError, match="top_p"):
        official_sampling({"top_p": 1.5}, "chatml")
    with pytest.raises(EvalError, match="temperature must be a number"):
        official_sampling({"temperature": "hot"}, "chatml")
    with pytest.raises(EvalError, match="unknown sampling setting 'temp'"):
        official_sampling({}, "chatml", overrides={"temp": 1.0})


def test_training_run_sampling_is_found_next_to_its_checkpoint(tmp_path):
    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    (ckpt / "trainer_state.json").write_text('{"step": 1}')
    (tmp_path / "sampling.json").write_text(json.dumps({"temperature": 1.0, "chat_kwargs": {}}))
    assert training_sampling(str(ckpt))["temperature"] == 1.0
    assert training_sampling(str(tmp_path)) is None  # the run folder itself is not a checkpoint


def test_split_resolution():
    import agentrl

    math_cls, alf_cls, gui_cls = (agentrl.spec(i).load() for i in ("math", "alfworld", "gui"))
    assert resolve_split("math", math_cls, {"level": 2}, None) == ({"level": 2, "split": "test"}, "test")
    assert resolve_split("alfworld", alf_cls, {}, None) == ({"split": "valid_unseen"}, "valid_unseen")
    assert resolve_split("alfworld", alf_cls, {}, "valid_seen")[1] == "valid_seen"
    assert resolve_split("gui", gui_cls, {}, None) == ({}, None)
    with pytest.raises(EvalError, match="has no splits"):
        resolve_split("gui", gui_cls, {}, "test")


def _prompt(tok, text):
    s = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return tok(s)["input_ids"]


def test_penalised_logprobs_are_those_of_the_sampled_distribution(tiny_qwen3):
    tok, model = tiny_qwen3.tokenizer, tiny_qwen3.model
    engine = HFEngine(model, tok, batch_size=4)
    params = SamplingParams(max_new_tokens=10, seed=5, temperature=0.8, top_k=50, repetition_penalty=1.3,
                            presence_penalty=0.7, frequency_penalty=0.4)
    prompts = [_prompt(tok, "hello"), _prompt(tok, "a longer prompt here")]
    for p, g in zip(prompts, engine.generate(prompts, params)):
        ids = torch.tensor([p + list(g.token_ids)])
        with torch.no_grad():
            logits = model(ids).logits[0, len(p) - 1 : -1]  # [T, V]
        vocab = logits.shape[-1]
        for t, token in enumerate(g.token_ids):  # replay the token statistics the engine had at step t
            seen = torch.zeros((1, vocab), dtype=torch.bool)
            seen[0, torch.tensor(p + list(g.token_ids[:t]))] = True
            counts = torch.zeros((1, vocab))
            for earlier in g.token_ids[:t]:
                counts[0, earlier] += 1
            ref = process_logits(logits[t : t + 1], params, seen, counts)[0, token]
            assert ref.item() == pytest.approx(g.logprobs[t], abs=1e-4)


def test_a_strong_frequency_penalty_stops_greedy_repetition(tiny_qwen3):
    tok = tiny_qwen3.tokenizer
    engine = HFEngine(tiny_qwen3.model, tok)
    prompt = [_prompt(tok, "repeat")]
    plain = engine.generate(prompt, SamplingParams(max_new_tokens=24, temperature=0))[0].token_ids
    penalised = engine.generate(prompt, SamplingParams(max_new_tokens=24, temperature=0,
                                                       frequency_penalty=1e4))[0].token_ids
    assert len(set(plain)) < len(plain)  # a random tiny model loops greedily: the penalty has something to fix
    assert len(set(penalised)) == len(penalised)
