"""Does pinning glibc's mmap threshold (`trainer.return_freed_memory`) cut the trainer's peak memory, and at what speed?

    python bench/micro/allocator.py              # every workload, glibc's default vs 1 MiB pinned, 2 rounds interleaved
    python bench/micro/allocator.py --rounds 1 --workloads full135_main     # a quick look

Each arm runs in a subprocess of its own (a fresh allocator): build the backend, then two training steps (pi_old pass,
forward + backward, AdamW), sampling the process's RSS every 5 ms. The arms alternate (default, pinned, default,
pinned) so a machine that slows down slows both. Workloads:

- ``lora360_ckpt``: LoRA rank 16 on a SmolLM2-360M-shaped random-init model, one micro-batch of 2 x 1,024 tokens,
  gradient checkpointing on (the `bench/micro/lora.py fit` row whose peak the memory plan missed by 2.2 GiB);
- ``full135_multiturn``: SmolLM2-135M, full fine-tuning, the same micro-batch, no checkpointing (the fit row of the
  main job's model);
- ``full135_main``: SmolLM2-135M, full fine-tuning, the main job's step (32 sequences of 45 + 64 tokens, one pass).

Reports per workload and arm the peak RSS, the median step seconds, and the pinned/default ratios; with each the
memory plan's estimate of the step. Writes docs/results/allocator.json.

Declared before it ran (issue 31): the pinned threshold stays the default (then ``trainer.mmap_threshold_kb: 1024``) if
its second-step time is at most 1.10x glibc's default's on every workload; the peak RSS of ``lora360_ckpt`` is
expected near the plan's 3.4 GiB pinned and near 5.6 GiB at glibc's default (one look; reported whatever it says).
Run beside the issue 32 experiments on the same 2 cores, so its seconds carry their noise; the arms alternate.
Cut before any comparison was seen (one default-threshold row of lora360_ckpt had printed): this session runs
``--rounds 1 --workloads lora360_ckpt full135_main`` for CPU time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

# This checkout's agentrl (and bench.harness), then the sibling scripts.
sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]
from bench.harness import RESULTS, ROOT, command_line, write_json  # noqa: E402

GiB = 2**30
WORKLOADS = ("lora360_ckpt", "full135_multiturn", "full135_main")


def one(workload: str, threshold_kb: int) -> dict:
    """Run `workload` in this process with the threshold pinned at `threshold_kb` (0: glibc's default)."""
    import torch
    from lora import PeakRSS, _samples, _shape, _train_step
    from transformers import AutoModelForCausalLM

    from agentrl.config import LoraConfig
    from agentrl.models import LoadedModel, load_model
    from agentrl.training.backend import ScoreRequest
    from agentrl.training.lora import adapter_parameter_count
    from agentrl.training.memory import plan_training_memory
    from agentrl.training.microbatch import collate
    from agentrl.training.single import SingleProcessBackend

    torch.manual_seed(0)
    if workload == "lora360_ckpt":
        config, tok = _shape("smollm2-360m")
        policy, lora, ckpt = LoadedModel("smollm2-360m", AutoModelForCausalLM.from_config(config).float(), tok), \
            LoraConfig(rank=16), True
        samples, micro = _samples(len(tok), 2, 256, 768), 2
    else:
        policy, lora, ckpt = load_model("smollm2-135m"), None, False
        samples, micro = (_samples(len(policy.tokenizer), 2, 256, 768), 2) if workload == "full135_multiturn" \
            else (_samples(len(policy.tokenizer), 32, 45, 64), 32)
    trainable = adapter_parameter_count(policy.model.config, lora) if lora else None
    tokens = max(len(s.input_ids) for s in samples) * micro
    plan = plan_training_memory(policy.model, dtype_bytes=4, token_budget=tokens, longest_sample=tokens,
                                checkpointing="on" if ckpt else "off", engine_copy=False, limit_bytes=64 * GiB,
                                trainable_params=trainable)
    backend = SingleProcessBackend(policy, lr=1e-5, betas=(0.9, 0.999), weight_decay=0.0, gradient_checkpointing=ckpt,
                                   lora=lora, mmap_threshold_kb=threshold_kb)
    seconds = []
    with PeakRSS() as peak:
        for _ in range(2):
            t0 = time.perf_counter()
            backend.score([ScoreRequest(collate(samples[i:i + micro], 0)) for i in range(0, len(samples), micro)])
            _train_step(backend, samples, micro)
            seconds.append(time.perf_counter() - t0)
    return {"workload": workload, "threshold_kb": threshold_kb, "peak_rss_gib": peak.peak / GiB,
            "step_seconds": seconds, "plan_estimate_gib": plan.estimate.total / GiB}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--threshold-kb", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=str(RESULTS / "allocator.json"))
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "THRESHOLD_KB"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one(args.one[0], int(args.one[1]))), flush=True)
        return
    rows = []
    for workload in args.workloads:
        for r in range(args.rounds):
            for kb in (0, args.threshold_kb):
                proc = subprocess.run([sys.executable, __file__, "--one", workload, str(kb)], capture_output=True,
                                      text=True, cwd=ROOT)
                line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    raise SystemExit(f"{workload} at {kb} KiB failed:\n{proc.stderr[-2000:]}")
                rows.append(json.loads(line[7:]) | {"round": r})
                print(f"{workload} round {r} threshold {kb} KiB: peak {rows[-1]['peak_rss_gib']:.2f} GiB, steps "
                      + ", ".join(f"{s:.1f}" for s in rows[-1]["step_seconds"]) + " s", flush=True)
    summary = {}
    for workload in args.workloads:
        arm = {kb: [r for r in rows if r["workload"] == workload and r["threshold_kb"] == kb]
               for kb in (0, args.threshold_kb)}
        peak = {kb: max(r["peak_rss_gib"] for r in v) for kb, v in arm.items()}
        step = {kb: statistics.median(s for r in v for s in r["step_seconds"][1:]) for kb, v in arm.items()}
        summary[workload] = {"plan_estimate_gib": arm[0][0]["plan_estimate_gib"],
                             "peak_rss_gib": {"default": peak[0], "pinned": peak[args.threshold_kb]},
                             "second_step_seconds_median": {"default": step[0], "pinned": step[args.threshold_kb]},
                             "peak_ratio_pinned_over_default": peak[args.threshold_kb] / peak[0],
                             "step_ratio_pinned_over_default": step[args.threshold_kb] / step[0]}
    out = {"command": command_line(__file__), "threshold_kb": args.threshold_kb,
           "rounds": args.rounds, "summary": summary, "rows": rows}
    write_json(Path(args.out), out)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
