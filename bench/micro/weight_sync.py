"""Weight-sync seconds vs parameter count: what `update_weights(named_tensors, version)` costs per engine kind.

Models: SmolLM2-135M (the default policy) and a random-init Llama of about 0.5B parameters (SmolLM2's vocabulary,
hidden 1280, 24 layers). Paths, each timed `--repeats` times (median reported), in one run:

* ``hf_copy``: the HF engine's own copy, refreshed by a tensor copy (the default whenever the engine may lag).
* ``vllm_inprocess``: a vLLM engine in the trainer's process: ``collective_rpc("reload_weights")`` +
  ``reset_prefix_cache()``.
* ``vllm_actor``: one vLLM engine Ray actor: the tensors go into the object store once, the actor reloads them.

The HF shared-module path (lockstep on one process) costs nothing and is not timed. Results:
docs/results/weight_sync.json.

    python bench/micro/weight_sync.py [--repeats 3] [--sizes 135m 0.5b]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, load_1m, time_calls, write_json  # noqa: E402


def half_billion(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    from agentrl.models import LoadedModel

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=1280, intermediate_size=3456, num_hidden_layers=24,
                         num_attention_heads=20, num_key_value_heads=5, head_dim=64, max_position_embeddings=8192,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    return LoadedModel("random-0.5b", LlamaForCausalLM(config), tokenizer)


def timed(engine, weights: dict, repeats: int) -> list[float]:
    seconds = time_calls(engine.update_weights, [(weights.items(), version) for version in range(1, repeats + 1)])
    return [round(s, 3) for s in seconds]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", nargs="+", default=["135m", "0.5b"])
    ap.add_argument("--paths", nargs="+", default=["hf_copy", "vllm_inprocess", "vllm_actor"])
    args = ap.parse_args()

    from agentrl.engine import HFEngine
    from agentrl.engine.factory import EngineSpec, model_files, write_model_files
    from agentrl.engine.vllm import VLLMEngine
    from agentrl.engine.workers import EngineActorPool
    from agentrl.models import load_model

    base = load_model("smollm2-135m")
    rows = []
    for size in args.sizes:
        policy = base if size == "135m" else half_billion(base.tokenizer)
        params = sum(p.numel() for p in policy.model.parameters())
        weights = policy.model.state_dict()
        for path in args.paths:
            before = load_1m()
            if path == "hf_copy":
                engine = HFEngine(policy.model, policy.tokenizer)
                seconds = timed(engine, weights, args.repeats)
                del engine
            elif path == "vllm_inprocess":
                folder = write_model_files(model_files(policy))
                engine = VLLMEngine(folder, max_model_len=4096, kv_cache_gib=0.5)
                seconds = timed(engine, weights, args.repeats)
                engine.close()
                shutil.rmtree(folder, ignore_errors=True)
                del engine
            else:
                pool = EngineActorPool(EngineSpec(kind="vllm", kv_cache_gib=0.5, max_model_len=4096),
                                       model_files(policy), replicas=1)
                seconds = timed(pool, weights, args.repeats)
                pool.close()
            row = {"model": policy.name, "params_m": round(params / 1e6, 1), "path": path, "seconds": seconds,
                   "median_s": statistics.median(seconds), "load_before": before, "load_after": load_1m()}
            rows.append(row)
            print(json.dumps(row), flush=True)
            # Written after every row: a run stopped early (memory on a shared machine) keeps what it measured.
            write_json(RESULTS / "weight_sync.json", {"cpus": os.cpu_count(), "rows": rows})


if __name__ == "__main__":
    main()
