"""LoRA adapters with peft: add them to a model, name their tensors, merge them, save and load them.

`add_lora` injects peft's LoRA layers into the Hugging Face module in place (no `PeftModel` wrapper stays in the
way), so every pass that runs a plain causal LM (`agentrl.training.logprobs.token_logprobs`, the HF engine's decode
loop, FSDP2's sharding of decoder blocks) runs the adapted one unchanged. peft freezes the base weights; the
optimizer takes the trainable parameters only, so AdamW's state is the adapters'.

Names. In the module's state dict an adapted linear ``...q_proj`` holds ``...q_proj.base_layer.weight`` (frozen) and
``...q_proj.lora_A.default.weight`` / ``lora_B`` (trained). Three views of the weights come out of it:

* the adapter (`adapter_state`): the ``lora_`` tensors under the module's names, what the weight sync ships to an
  engine that holds the same adapted module;
* the merged model (`merged_state`): Hugging Face names, each adapted weight replaced by ``W + alpha / r * B @ A``,
  what an engine without adapter support loads and what checkpoints write as ``model.safetensors``;
* the base model (`base_state`): Hugging Face names, the frozen weights alone (vLLM loads it, then the adapter).

On disk a checkpoint holds the adapter in peft's own layout (``adapter_config.json``, ``adapter_model.safetensors``
with ``base_model.model.<name>`` keys and no adapter name), which `peft.PeftModel.from_pretrained` and vLLM's
`LoRARequest` read as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from agentrl.config import LoraConfig

__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "add_lora", "has_lora", "is_adapter_name", "adapter_state",
           "scalings", "merged_state", "base_state", "save_adapter", "read_adapter", "load_adapter_into",
           "adapter_parameter_count", "peft_config"]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_ADAPTER = "default"  # peft's adapter name inside the module (one adapter per model here)
_PEFT_PREFIX = "base_model.model."


def peft_config(settings: LoraConfig, base_model: str = ""):
    """The peft `LoraConfig` for `settings` (`target_modules` ``[all-linear]`` becomes peft's ``"all-linear"``).

    Raises:
        ConfigError: peft is not installed (one line naming the extra to install).
    """
    try:
        from peft import LoraConfig as PeftLoraConfig
    except ImportError:
        from agentrl.config import ConfigError
        from agentrl.extras import install_hint

        raise ConfigError(f"trainer.lora needs peft, which the base install leaves out: {install_hint('lora')} "
                          "(or pip install peft)") from None

    targets: Any = list(settings.target_modules)
    if targets == ["all-linear"]:
        targets = "all-linear"
    return PeftLoraConfig(r=settings.rank, lora_alpha=settings.scale_alpha, lora_dropout=settings.dropout,
                          target_modules=targets, bias="none", task_type="CAUSAL_LM",
                          base_model_name_or_path=base_model or None)


def add_lora(model: torch.nn.Module, settings: LoraConfig) -> torch.nn.Module:
    """Inject LoRA layers into `model` in place, freeze its base weights, and return it.

    The adapters start as peft starts them (A random, B zero), so the adapted model computes what the base computes.
    Which random A depends on the torch RNG: seed it first for a reproducible run.

    Raises:
        ValueError: a target module the model does not have (one line naming it and the model's linear layers).
    """
    from peft import get_peft_model

    try:
        get_peft_model(model, peft_config(settings))
    except ValueError as e:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ValueError(f"trainer.lora.target_modules {list(settings.target_modules)} do not fit "
                         f"{type(model).__name__} ({str(e).splitlines()[0][:160]}); its linear layers are "
                         f"{', '.join(linear)}, or use all-linear") from None
    return model


def has_lora(model: torch.nn.Module) -> bool:
    """True when `model` carries LoRA layers (False wherever peft is not installed: nothing can carry them)."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:
        return False

    return any(isinstance(m, LoraLayer) for m in model.modules())


def is_adapter_name(name: str) -> bool:
    """True for a state-dict name of an adapter tensor (``...lora_A.default.weight``)."""
    return ".lora_A." in name or ".lora_B." in name


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter tensors of `model` under its own state-dict names (live tensors: no copy)."""
    return {n: t for n, t in model.state_dict().items() if is_adapter_name(n)}


def scalings(model: torch.nn.Module) -> dict[str, float]:
    """`alpha / r` of every adapted module, by module name (what `merged_state` multiplies ``B @ A`` by)."""
    from peft.tuners.lora import LoraLayer

    return {n: float(m.scaling[_ADAPTER]) for n, m in model.named_modules() if isinstance(m, LoraLayer)}


def merged_state(state: Mapping[str, torch.Tensor], scale: Mapping[str, float]) -> dict[str, torch.Tensor]:
    """A full state dict of an adapted model as the plain model's, each adapted weight merged: ``W + s * B @ A``.

    Args:
        state: the adapted model's state dict (base layers and adapters under the module's names).
        scale: `scalings` of the model.

    Returns:
        Hugging Face names (no ``base_layer``, no adapters); unadapted tensors are the same objects (ties stay).
    """
    out = base_state(state)
    for module, s in scale.items():
        a = state[f"{module}.lora_A.{_ADAPTER}.weight"]  # [r, in]
        b = state[f"{module}.lora_B.{_ADAPTER}.weight"]  # [out, r]
        w = out[f"{module}.weight"]  # [out, in]
        out[f"{module}.weight"] = (w.float() + s * (b.float() @ a.float())).to(w.dtype)
    return out


def base_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The frozen base weights of an adapted model's state dict, under Hugging Face names."""
    return {n.replace(".base_layer.", "."): t for n, t in state.items() if not is_adapter_name(n)}


def _peft_key(name: str) -> str:
    return _PEFT_PREFIX + name.replace(f".{_ADAPTER}.", ".")


def _module_key(key: str) -> str:
    name = key.removeprefix(_PEFT_PREFIX)
    for part in ("lora_A", "lora_B"):
        name = name.replace(f".{part}.weight", f".{part}.{_ADAPTER}.weight")
    return name


def save_adapter(folder: Path, adapter: Mapping[str, torch.Tensor], settings: LoraConfig, base_model: str) -> None:
    """Write the adapter in peft's layout (`ADAPTER_CONFIG`, `ADAPTER_WEIGHTS`) into `folder`.

    Args:
        folder: where to write.
        adapter: `adapter_state` of the model (module names).
        settings: the run's LoRA settings.
        base_model: the model the adapter applies to (a built-in name or a folder), for loading it alone.
    """
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    peft_config(settings, base_model).save_pretrained(str(folder))
    save_file({_peft_key(n): t.detach().contiguous().cpu() for n, t in adapter.items()}, folder / ADAPTER_WEIGHTS,
              metadata={"format": "pt"})


def read_adapter(folder: Path) -> dict[str, torch.Tensor]:
    """The adapter `save_adapter` wrote, under the module's state-dict names."""
    from safetensors.torch import load_file

    return {_module_key(k): t for k, t in load_file(folder / ADAPTER_WEIGHTS).items()}


def load_adapter_into(model: torch.nn.Module | Mapping[str, torch.Tensor], folder: Path) -> None:
    """Copy the adapter saved in `folder` into `model`'s adapters; refuses a mismatch (rank, targets) in one line.

    `model` may also be the adapter tensors themselves (`adapter_state`-named), e.g. float32 masters.
    """
    own = adapter_state(model) if isinstance(model, torch.nn.Module) else dict(model)
    saved = read_adapter(folder)
    if set(saved) != set(own) or any(own[n].shape != t.shape for n, t in saved.items()):
        raise ValueError(f"the adapter in {folder} does not fit the model's LoRA layers (other rank or target "
                         f"modules?): resume with the trainer.lora settings the run was started with")
    with torch.no_grad():
        for name, tensor in saved.items():
            own[name].copy_(tensor)


def adapter_parameter_count(config, settings: LoraConfig) -> int:
    """Parameters the adapters of `settings` add to a model of `config` (built on the meta device: no memory)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
        add_lora(model, settings)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
