#!/usr/bin/env bash
# LoRA: train peft adapters on the math env instead of every weight, then show the adapter files the run wrote.
# From the repository root (needs peft: pip install 'agentrl-platform[lora]'):
#
#   bash examples/lora.sh
#
# OUT (default runs/lora-smoke) is the run folder. tiny-qwen3 is a random 2-layer model: two steps show the
# mechanics in about 15 s on a CPU, not learning (on the HF engine, named: vLLM's CPU build does not serve
# tiny-qwen3, and `auto` would spend seconds finding out). `agentrl eval --model $OUT/checkpoint` and `agentrl run --resume
# $OUT` take the folder as they take a full fine-tune's (README.md, "LoRA").
set -euo pipefail

OUT=${OUT:-runs/lora-smoke}

agentrl run --env math --model tiny-qwen3 --engine hf --steps 2 --prompts-per-step 2 --group-size 2 --max-new-tokens 8 \
  --trainer.lora.rank 8 --output "$OUT" --overwrite

# checkpoint/ holds the adapter in peft's layout (adapter_config.json, adapter_model.safetensors) beside the merged
# model that engines and `agentrl eval` load.
ls -l "$OUT"/checkpoint/adapter_*
python3 - "$OUT/checkpoint" <<'PY'
import json, sys
from pathlib import Path

from safetensors import safe_open

folder = Path(sys.argv[1])
config = json.loads((folder / "adapter_config.json").read_text())
with safe_open(folder / "adapter_model.safetensors", "pt") as tensors:
    names = list(tensors.keys())
print(f"adapter: {config['peft_type']} r={config['r']} alpha={config['lora_alpha']} on {config['target_modules']}, "
      f"{len(names)} tensors ({sum('lora_A' in n for n in names)} lora_A, {sum('lora_B' in n for n in names)} lora_B)")
PY
