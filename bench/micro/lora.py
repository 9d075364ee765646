"""Full fine-tuning vs LoRA on the main job's model (SmolLM2-135M-Instruct), and the largest model a step fits in 8 GB.

    python bench/micro/lora.py curve     # the main job with LoRA rank 16, 20 steps, seed 0 (full's seed 0 is recorded)
    python bench/micro/lora.py costs     # full vs LoRA rank 8 / 16 / 64: memory, optimizer bytes, tokens/s, weight sync
    python bench/micro/lora.py fit       # Qwen3-shaped random-init models (real tokenizer): largest that fits 8 GB
    python bench/micro/lora.py vllm      # vLLM CPU build: full reload vs adapter-version sync, decode with the adapter
    python bench/micro/lora.py report    # docs/results/lora.json from the three parts' files under runs/lora/

Declared before running, then cut down (second declaration, 16:03 UTC, before any figure came in): the shared
2-core box sat at a load average of 28, and the first LoRA curve run had used 50 CPU-seconds in 13 minutes without
finishing its first step, so 20 steps (~30 min on a quiet box) could not finish by the deadline.

Third declaration (16:27 UTC, before any figure came in): at load 16-20 the full arm alone took 21 minutes, so
costs runs full and rank 16 only (rank 8 and 64 not run), fit measures only SmolLM2-135M (the other rungs give the
plan's estimate, not a measured peak), and the vllm part is not run.

* curve (NOT run in this session; the script is ready): ONE LoRA arm (rank 16, alpha 32, all linear layers of the
  blocks, lr 2e-4: ten times full fine-tuning's 2e-5, the usual LoRA ratio) runs the main job's command (`agentrl
  run --env math --seed 0 --steps 20 --engine hf`); the full fine-tuning arm is seed 0 of
  docs/results/main_job_seeds.json (same command and seeds). Compared: train success per step, the mean over steps
  10-19, and the held-out success of `agentrl eval --env math --model RUN/checkpoint --episodes 64` (full seed 0:
  0.84). LoRA "still learns" if its mean train success over steps 10-19 beats the base model's 0.19 by more than 0.2.
* costs (run): each arm (full, rank 8, 16, 64) in a subprocess of its own, one round, in that order: the trainer's
  peak RSS during 2 timed training steps of 16 main-job-shaped sequences (prompt 45 + reply 64 tokens, micro-batches
  of 8; one warm-up step before), AdamW's state bytes, trainer tokens/s (ratio to full), the weight sync into an HF
  engine copy (seconds, bytes: full weights vs the adapters alone, plus LoRA's merged fallback), and the HF engine's
  decode tokens/s with the adapters unmerged in its module vs the plain model (= merged). Holds if LoRA's optimizer
  bytes and sync bytes are each < 5% of full's. Speeds on this loaded box are noisy even as ratios.
* fit: Qwen3-0.6B / 1.7B / 4B-shaped configs (random init, Qwen3 tokenizer: no such weights offline) and a
  SmolLM2-360M shape, float32, one training step (pi_old pass, forward + backward, AdamW) on a multi-turn-length
  micro-batch (2 sequences x 1024 tokens): the memory plan's estimate, full vs LoRA rank 16, an 8 GiB limit. A
  configuration the plan says fits is measured (peak RSS in a subprocess) only when the machine has its estimate
  plus 2 GiB available; otherwise the row says it was not measured.
* vllm (declared 16:10 UTC, before running): the vLLM CPU build on SmolLM2-135M, float32, one engine at a time in
  one process: `update_weights` seconds (median of 3) and bytes, full in-place reload vs one adapter version (rank
  16, written in peft's layout and loaded as a LoRARequest), and decode tokens/s of 8 prompts x 32 tokens with the
  adapter vs the plain model. Reported as measured; no threshold.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import (  # noqa: E402
    RESULTS,
    ROOT,
    agentrl_command,
    read_jsonl,
    script_path,
    time_calls,
    time_repeats,
    write_json,
)

RUNS = ROOT / "runs" / "lora"
OUT = RESULTS / "lora.json"
GiB = 2**30
ARMS = (0, 8, 16, 64)  # LoRA rank; 0 = full fine-tuning
SEQUENCES = 16  # main-job-shaped sequences per timed step (half a main-job step: the shared box is loaded)
FIT_LIMIT = 8 * GiB


class PeakRSS:
    """The largest resident set size of this process while the block runs (sampled every 5 ms)."""

    def __enter__(self):
        import psutil

        self._proc, self.peak, self._stop = psutil.Process(), 0, threading.Event()
        self.peak = self._proc.memory_info().rss
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


def _samples(vocab: int, n: int, prompt: int, reply: int, seed: int = 0):
    """`n` sequences of `prompt` + `reply` random tokens, loss on the reply, advantages of both signs."""
    import torch

    from agentrl.records import Sample

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = tuple(torch.randint(0, vocab, (prompt + reply,), generator=g).tolist())
        out.append(Sample(ids, (0,) * prompt + (1,) * reply, (0.0,) * prompt + (-2.0,) * reply,
                          1.0 if i % 2 else -1.0, i // 8))
    return out


def _train_step(backend, samples, micro: int):
    """One main-job training step: forward + backward of every micro-batch, then AdamW (pi_old from the pass)."""
    from agentrl.objective import policy_loss
    from agentrl.training.backend import PolicyObjective, UpdateRequest
    from agentrl.training.microbatch import collate

    batches = [collate(samples[i : i + micro], 0) for i in range(0, len(samples), micro)]
    objective = PolicyObjective(functools.partial(policy_loss, "minirl"), len(samples),
                                sum(s.num_loss_tokens for s in samples))
    backend.accumulate([UpdateRequest(b, None) for b in batches], objective)
    return backend.step(1.0)


def arm(rank: int) -> dict:
    """One arm of `costs` in this process (a subprocess of its own: its memory is its own)."""
    import torch

    from agentrl.config import LoraConfig
    from agentrl.engine.base import SamplingParams
    from agentrl.engine.hf import HFEngine
    from agentrl.models import load_model
    from agentrl.training.single import SingleProcessBackend

    torch.manual_seed(0)
    policy = load_model("smollm2-135m")
    rss_loaded = PeakRSS().__enter__()._proc.memory_info().rss
    backend = SingleProcessBackend(policy, lr=2e-5, betas=(0.9, 0.999), weight_decay=0.0,
                                   lora=LoraConfig(rank=rank))
    samples = _samples(len(policy.tokenizer), SEQUENCES, 45, 64)
    tokens = sum(len(s.input_ids) for s in samples)
    _train_step(backend, samples, 8)  # warm-up (and AdamW's state appears)
    with PeakRSS() as peak:
        seconds = time_repeats(functools.partial(_train_step, backend, samples, 8), 2)
    optimizer_bytes = sum(v.numel() * v.element_size() for s in backend.optimizer.state.values() for v in s.values()
                          if isinstance(v, torch.Tensor))
    trainable = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)

    # Weight sync into an HF engine copy: what the run ships (adapters with LoRA), and LoRA's merged fallback.
    engine = HFEngine(policy.model, policy.tokenizer, batch_size=8, prefix_cache_bytes=0)

    def sync(weights) -> tuple[float, int]:
        times, nbytes = [], 0
        for v in range(3):
            t0 = time.perf_counter()
            pairs = list(weights())
            engine.update_weights(pairs, v + 1)
            times.append(time.perf_counter() - t0)
            nbytes = sum(t.numel() * t.element_size() for _, t in pairs)
        return statistics.median(times), nbytes

    ship = backend.adapter_weights if rank else backend.named_weights
    sync_s, sync_bytes = sync(ship)
    out = {"rank": rank, "trainable_params": trainable, "tokens_per_step": tokens,
           "train_step_seconds": seconds, "train_tokens_per_s": tokens / statistics.median(seconds),
           "train_peak_rss_gib": peak.peak / GiB, "rss_after_load_gib": rss_loaded / GiB,
           "optimizer_state_bytes": optimizer_bytes, "sync_seconds": sync_s, "sync_bytes": sync_bytes}
    if rank:
        # What an engine without adapters gets: the merged full weights (merged here, every sync).
        from agentrl.training.lora import merged_state, scalings

        plain = load_model("smollm2-135m").model
        plain.load_state_dict(merged_state(policy.model.state_dict(), scalings(policy.model)), strict=False)
        merged_engine = HFEngine(plain, policy.tokenizer, batch_size=8, prefix_cache_bytes=0, share_module=True)
        times = time_calls(lambda version: merged_engine.update_weights(list(backend.named_weights()), version),
                           [(v + 1,) for v in range(3)])
        out["merged_sync_seconds"] = statistics.median(times)
        out["merged_sync_bytes"] = sum(t.numel() * t.element_size() for _, t in backend.named_weights())
    # The HF engine's decode speed with the adapters unmerged in its module (the plain model: the full arm).
    prompts = [s.input_ids[:45] for s in samples[:8]]
    params = SamplingParams(temperature=1.0, max_new_tokens=32, seed=0)
    engine.generate(prompts, params)  # warm-up
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        gens = engine.generate(prompts, params)
        times.append(time.perf_counter() - t0)
    out["engine_decode_tokens_per_s"] = sum(len(g.token_ids) for g in gens) / statistics.median(times)
    return out


def costs(rounds: int, arms: list[int], append: bool) -> None:
    """Every arm in a subprocess, arms interleaved over `rounds` rounds; `RUNS/costs.json` (`append`: add to it)."""
    RUNS.mkdir(parents=True, exist_ok=True)
    results = json.loads((RUNS / "costs.json").read_text()) if append and (RUNS / "costs.json").exists() else []
    for r in range(rounds):
        for rank in arms:
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, __file__, "_arm", str(rank)], capture_output=True, text=True,
                                  cwd=ROOT)
            if proc.returncode:
                sys.exit(f"arm rank {rank} failed:\n{proc.stderr[-3000:]}")
            row = json.loads(proc.stdout.strip().splitlines()[-1]) | {"round": r}
            results.append(row)
            print(f"round {r} rank {rank}: {time.perf_counter() - t0:.0f}s "
                  f"{ {k: v for k, v in row.items() if not isinstance(v, list)} }", flush=True)
            write_json(RUNS / "costs.json", results)


def vllm_part() -> dict:
    """vLLM CPU build on SmolLM2-135M: weight sync seconds (full reload vs one adapter version) and decode tokens/s
    with the adapter vs the plain model, in this process, one engine at a time."""
    import torch

    from agentrl.config import LoraConfig
    from agentrl.engine.base import SamplingParams
    from agentrl.engine.factory import model_files, write_model_files
    from agentrl.engine.vllm import VLLMEngine
    from agentrl.models import load_model
    from agentrl.training.lora import adapter_state, add_lora

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    torch.manual_seed(0)
    policy = load_model("smollm2-135m")
    samples = _samples(len(policy.tokenizer), 8, 45, 0)
    prompts = [s.input_ids for s in samples]
    params = SamplingParams(temperature=1.0, max_new_tokens=32, seed=0)
    out: dict = {}
    for arm in ("full", "rank_16"):
        lora = LoraConfig(rank=16) if arm != "full" else None
        if lora is not None:
            add_lora(policy.model, lora)
            with torch.no_grad():  # a trained-looking adapter (B is zero at the start)
                for n, p in policy.model.named_parameters():
                    if ".lora_B." in n:
                        p.normal_(0.0, 0.01)
        folder = write_model_files(model_files(policy, merge=lora is None))
        engine = VLLMEngine(folder, dtype="float32", max_model_len=512, kv_cache_gib=0.25, lora=lora)
        weights = (lambda: adapter_state(policy.model).items()) if lora else (
            lambda: policy.model.state_dict().items())
        times = []
        for v in range(3):
            pairs = list(weights())
            t0 = time.perf_counter()
            engine.update_weights(pairs, v + 1)
            times.append(time.perf_counter() - t0)
        engine.generate(prompts, params)  # warm-up
        t0 = time.perf_counter()
        gens = engine.generate(prompts, params)
        decode = sum(len(g.token_ids) for g in gens) / (time.perf_counter() - t0)
        out[arm] = {"sync_seconds": times, "sync_bytes": sum(t.numel() * t.element_size() for _, t in pairs),
                    "decode_tokens_per_s": decode}
        engine.close()
        del engine
    return out


def _shape(name: str):
    """(config, tokenizer) of a ladder rung: SmolLM2-135M's own, or a random-init shape with its family's tokenizer."""
    from transformers import LlamaConfig, Qwen3Config

    from agentrl.models import load_model, load_qwen3_tokenizer

    if name.startswith("smollm2"):
        base = load_model("smollm2-135m")
        if name == "smollm2-135m":
            return base.model.config, base.tokenizer
        return LlamaConfig(vocab_size=len(base.tokenizer), hidden_size=960, intermediate_size=2560,
                           num_hidden_layers=32, num_attention_heads=15, num_key_value_heads=5,
                           tie_word_embeddings=True, max_position_embeddings=8192), base.tokenizer
    tok = load_qwen3_tokenizer()
    hidden, inter, layers, heads = {"qwen3-0.6b": (1024, 3072, 28, 16), "qwen3-1.7b": (2048, 6144, 28, 16),
                                    "qwen3-4b": (2560, 9728, 36, 32)}[name]
    return Qwen3Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                       max_position_embeddings=8192), tok


LADDER = ("smollm2-135m", "smollm2-360m", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b")
FIT_TOKENS, FIT_SEQ = 2048, 1024  # one micro-batch of two multi-turn-length sequences


def fit_one(name: str, rank: int, measure: bool) -> dict:
    """The memory plan's estimate for one rung (full or LoRA), and with `measure` the peak RSS of one real step."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentrl.config import ConfigError, LoraConfig, TrainerConfig
    from agentrl.models import LoadedModel
    from agentrl.training.allocator import run_threshold_kb
    from agentrl.training.lora import adapter_parameter_count
    from agentrl.training.memory import estimate_train_memory, plan_training_memory
    from agentrl.training.single import SingleProcessBackend

    config, tok = _shape(name)
    lora = LoraConfig(rank=rank)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    n_params = sum(p.numel() for p in meta.parameters())
    trainable = adapter_parameter_count(config, lora) if rank else None
    out = {"model": name, "rank": rank, "params": n_params, "trainable_params": trainable or n_params}
    try:
        plan = plan_training_memory(meta, dtype_bytes=4, token_budget=FIT_TOKENS, longest_sample=FIT_SEQ,
                                    checkpointing="auto", engine_copy=False, limit_bytes=FIT_LIMIT,
                                    trainable_params=trainable)
        out |= {"fits_plan": True, "estimate_gib": plan.estimate.total / GiB,
                "gradient_checkpointing": plan.gradient_checkpointing}
    except ConfigError:
        est = estimate_train_memory(config, n_params, dtype_bytes=4, tokens=FIT_TOKENS, gradient_checkpointing=True,
                                    engine_copy=False, trainable_params=trainable)
        return out | {"fits_plan": False, "estimate_gib": est.total / GiB, "gradient_checkpointing": True}
    if not measure:
        return out
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float()
    # what a run does (`trainer.return_freed_memory: auto`); rows measured before it existed lack the key
    threshold = run_threshold_kb(TrainerConfig().return_freed_memory, plan.gradient_checkpointing)
    backend = SingleProcessBackend(LoadedModel(name, model, tok), lr=1e-5, betas=(0.9, 0.999), weight_decay=0.0,
                                   gradient_checkpointing=plan.gradient_checkpointing, lora=lora,
                                   mmap_threshold_kb=threshold)
    samples = _samples(len(tok), 2, 256, FIT_SEQ - 256)
    from agentrl.training.backend import ScoreRequest
    from agentrl.training.microbatch import collate

    with PeakRSS() as peak:
        t0 = time.perf_counter()
        backend.score([ScoreRequest(collate(samples, 0))])
        _train_step(backend, samples, 2)
        seconds = time.perf_counter() - t0
    return out | {"measured_peak_gib": peak.peak / GiB, "step_seconds": seconds, "mmap_threshold_kb": threshold,
                  "ru_maxrss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GiB}


def fit(rungs: list[str], measure: list[str] | None, append: bool) -> None:
    """Each rung, full and LoRA rank 16: the plan's estimate; those that fit 8 GiB measured (subprocesses).

    `measure` limits the measured runs to those rungs (None: every rung that fits); `append` keeps earlier rows.
    """
    RUNS.mkdir(parents=True, exist_ok=True)
    rows = json.loads((RUNS / "fit.json").read_text()) if append and (RUNS / "fit.json").exists() else []
    for name in rungs:
        for rank in (0, 16):
            estimate = json.loads(_child("_fit", name, str(rank), "0"))
            import psutil

            free = psutil.virtual_memory().available / GiB
            if estimate["fits_plan"] and measure is not None and name not in measure:
                estimate["not_measured"] = "no time left in the session (the shared box was at load 16-28)"
            elif estimate["fits_plan"] and free >= estimate["estimate_gib"] + 2:
                estimate = json.loads(_child("_fit", name, str(rank), "1"))
            elif estimate["fits_plan"]:
                estimate["not_measured"] = f"{free:.1f} GiB available on the shared machine"
            rows.append(estimate)
            print(json.dumps(estimate), flush=True)
            write_json(RUNS / "fit.json", rows)


def _child(*args: str) -> str:
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        sys.exit(f"{args} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def curve(steps: int, episodes: int) -> None:
    """The LoRA arm of the curve (if not already run) and its held-out eval; full fine-tuning's seed 0 is recorded."""
    run = RUNS / "curve_r16"
    agentrl = agentrl_command()
    if not (run / "checkpoint").is_dir():
        subprocess.run(agentrl + ["run", "--env", "math", "--seed", "0", "--steps", str(steps), "--engine", "hf",
                                  "--trainer.lora.rank", "16", "--lr", "2e-4", "--output", str(run), "--overwrite"],
                       check=True, cwd=ROOT)
    subprocess.run(agentrl + ["eval", "--env", "math", "--model", str(run / "checkpoint"), "--episodes",
                              str(episodes), "--engine", "hf", "--output", str(run / "eval_agentrl")],
                   check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def report() -> None:
    """docs/results/lora.json from the parts' outputs, with ratios to full fine-tuning."""
    result: dict = {"command": "; ".join(f"python {script_path(__file__)} {part}"
                                         for part in ("curve", "costs", "fit", "report")),
                    "machine": "shared 2-core CPU box (8 helpers at once): speeds are ratios within one round"}
    if (RUNS / "costs.json").exists():
        rows = json.loads((RUNS / "costs.json").read_text())
        per_rank: dict = {}
        for rank in ARMS:
            mine = [r for r in rows if r["rank"] == rank]
            if not mine:
                continue
            full = {r["round"]: r for r in rows if r["rank"] == 0}
            per_rank[f"rank_{rank}" if rank else "full"] = {
                "trainable_params": mine[0]["trainable_params"],
                "optimizer_state_bytes": mine[0]["optimizer_state_bytes"],
                "sync_bytes": mine[0]["sync_bytes"],
                "sync_seconds_median": statistics.median(r["sync_seconds"] for r in mine),
                "train_peak_rss_gib": max(r["train_peak_rss_gib"] for r in mine),
                "train_tokens_per_s": [r["train_tokens_per_s"] for r in mine],
                "train_tokens_per_s_ratio_to_full": [r["train_tokens_per_s"] / full[r["round"]]["train_tokens_per_s"]
                                                     for r in mine if r["round"] in full],
                "engine_decode_ratio_to_plain": [r["engine_decode_tokens_per_s"]
                                                 / full[r["round"]]["engine_decode_tokens_per_s"]
                                                 for r in mine if r["round"] in full],
                **({"merged_sync_seconds_median": statistics.median(r["merged_sync_seconds"] for r in mine),
                    "merged_sync_bytes": mine[0]["merged_sync_bytes"]} if rank else {}),
            }
        result["costs"] = {"arms": per_rank, "raw": rows}
    if (RUNS / "vllm.json").exists():
        result["vllm_cpu"] = json.loads((RUNS / "vllm.json").read_text())
    if (RUNS / "fit.json").exists():
        result["fit"] = {"limit_gib": FIT_LIMIT / GiB, "micro_batch": f"2 x {FIT_SEQ} tokens, float32",
                         "rows": json.loads((RUNS / "fit.json").read_text())}
    run = RUNS / "curve_r16"
    if (run / "metrics.jsonl").exists():
        rows = read_jsonl(run / "metrics.jsonl")
        full = json.loads((RESULTS / "main_job_seeds.json").read_text())["seeds"][0]
        lora_success = [r["success_rate"] for r in rows]
        curve_out = {"lora_rank_16_lr_2e-4": {"train_success": lora_success,
                                              "mean_steps_10_19": statistics.fmean(lora_success[10:20])
                                              if len(lora_success) >= 20 else None},
                     "full_seed0_recorded": {"train_success": full["train_success"],
                                             "mean_steps_10_19": statistics.fmean(full["train_success"][10:20]),
                                             "heldout_agentrl_eval": full["heldout_agentrl_eval"]},
                     "base_model_heldout": 0.19}
        if (run / "eval_agentrl" / "results.json").exists():
            overall = json.loads((run / "eval_agentrl" / "results.json").read_text())["overall"]["success_rate"]
            curve_out["lora_rank_16_lr_2e-4"]["heldout_agentrl_eval"] = {k: overall[k]
                                                                         for k in ("estimate", "low", "high")}
        result["curve"] = curve_out
    write_json(OUT, result)
    print(json.dumps({k: v for k, v in result.items() if k != "costs"} | {
        "costs": {k: {kk: vv for kk, vv in v.items()} for k, v in result.get("costs", {}).get("arms", {}).items()}},
        indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["curve", "costs", "fit", "vllm", "report", "_arm", "_fit"])
    parser.add_argument("args", nargs="*")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--arms", type=int, nargs="+", default=list(ARMS), help="costs: LoRA ranks (0 = full)")
    parser.add_argument("--rungs", nargs="+", default=list(LADDER), help="fit: the model shapes")
    parser.add_argument("--measure", nargs="*", default=None, help="fit: measure only these rungs")
    parser.add_argument("--append", action="store_true", help="costs / fit: keep the rows already written")
    a = parser.parse_args()
    if a.part == "_arm":
        print(json.dumps(arm(int(a.args[0]))))
    elif a.part == "_fit":
        print(json.dumps(fit_one(a.args[0], int(a.args[1]), a.args[2] == "1")))
    elif a.part == "costs":
        costs(a.rounds, a.arms, a.append)
    elif a.part == "fit":
        fit(a.rungs, a.measure, a.append)
    elif a.part == "vllm":
        RUNS.mkdir(parents=True, exist_ok=True)
        write_json(RUNS / "vllm.json", vllm_part())
    elif a.part == "curve":
        curve(a.steps, a.episodes)
    else:
        report()


if __name__ == "__main__":
    main()
