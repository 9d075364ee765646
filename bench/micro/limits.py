"""The yardstick: what this machine can do, and how close the main job's trainer and engine come to it (issue 39).

One run measures, on the machine it runs on, in one process (torch's thread count as the process has it):

* ``peaks``: matmul GFLOP/s, float32 and bfloat16. ``square``: n x n x n at each of `--sizes`, the best of
  `--peak-repeats` timings after a warm-up. ``model_shapes``: the matmuls of one training pass of the main model,
  their shapes read from the loaded config (hidden H, MLP width F, heads, kv heads, vocabulary V; SmolLM2-135M: 576,
  1536, 9, 3, 49152) at `--tokens` tokens per pass (the main job's micro-batches hold about 1,000): per linear layer
  the forward ``[T,K] x [K,N]`` and the two backward products (``dX = dY W``: ``[T,N] x [N,K]``; ``dW = dY^T X``:
  ``[N,T] x [T,K]``), and the LM head at the loss positions only (`agentrl.training.logprobs` projects just those).
  ``model_shapes.pass_gflops`` = all of one pass's matmul FLOPs / the sum of their times: the realistic ceiling for
  the trainer (a 576-wide matmul does not reach the square peak). The peaks are measured before the trainer part and
  again after it, each the best of both rounds (``peaks.rounds`` keeps both): on a shared machine a round taken while
  another job holds a core comes out at half. ``cpu``: AVX512-BF16 / AMX flags from /proc/cpuinfo and
  ``torch.backends.cpu.get_cpu_capability()``.
* ``bandwidth``: STREAM-like copy (``b = a``) and triad (``a = b + s c``) over float32 arrays of `--stream-mib` MiB
  each (far larger than the caches), GB/s, STREAM's byte count (2 and 3 arrays per element; write-allocate not
  counted), best of `--stream-repeats`.
* ``trainer``: the main job's trainer (`agentrl run --env math` as `configs/math-smollm2.yaml` sets it) on the real
  samples of its first step. The samples come from one rollout through the project's own set-up
  (`agentrl.recipes.setup.set_up`, the engine ``engine.kind: auto`` picks, in a child process so that vLLM's thread
  binding never touches the timings here), cached in ``bench/.cache/`` (delete it to draw them again). Per precision
  mode (`--modes`, values of ``trainer.compute_dtype``) and, when the setting exists, per ``trainer.packing``, a
  backend and `TrainingStep` built as the recipe builds them (`build_backend` with the run plan's memory plan), then,
  alternating the variants (A B A B ..., `--repeats` rounds, the first dropped as warm-up):
  ``score``: the pi_old pass over the step's micro-batches (`agentrl.training.step.score_old_policy`, forward only);
  ``update``: the step's pi_old choice plus `TrainingStep.update` (accumulate over the micro-batches + the AdamW step;
  samples without a gradient skip their passes, as in a run: the main job's groups that all failed or all succeeded
  train nothing, so ``update.sequences`` is often well below ``samples``). Reported per variant: best seconds, real
  tokens/s and processed (padded) tokens/s, achieved FLOP/s by 6·N·T (2·N·T for the forward-only score pass; N and
  what it counts: `flop_params`), MFU against the matching square peak and the model-shape peak, HFU (the FLOPs the
  passes actually run, padding included and the head at loss positions only, against the model-shape peak), and
  the speed-up over float32 (same packing).
* ``engine`` (skip with `--skip-engine`): the run's engine built as the recipe builds it (`EngineSpec` from the run
  plan, `build_engines`) on the main job's first prompts (`prompts_per_step x group_size` distinct math tasks, the
  chat template of the run): ``prefill_tok_per_s`` = prompt tokens / seconds of a 1-token generation;
  ``decode_tok_per_s`` = (generated - first tokens) / (full generation seconds - that prefill), prefix cache
  cleared before each, the least-disturbed (fastest) kept round of each. ``bound_tok_per_s`` = mean batch x triad
  bandwidth / bytes read per decode step (all weights at the engine's dtype + the batch's KV cache at the mean
  context); ``of_bound`` = decode / bound.

The machine may be shared: the load average is recorded beside each part. Results: docs/results/limits.json.

    python bench/micro/limits.py [--skip-engine] [--modes float32 bfloat16] [--repeats 3] [--out PATH]
    python bench/micro/limits.py --skip-trainer --merge  # the engine part added to the trainer's file, peaks measured
    python bench/micro/limits.py --smoke --out /tmp/limits.json    # tiny model and sizes, well under a minute
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, ROOT, command_line, load_1m, write_json  # noqa: E402

CACHE = ROOT / "bench" / ".cache"
CONFIG = ROOT / "configs" / "math-smollm2.yaml"


def say(text: str) -> None:
    """A progress line (stdout, flushed, so a long run shows where it is)."""
    print(f"[limits {time.strftime('%H:%M:%S')}] {text}", flush=True)


def load() -> float:
    """The 1-minute load average: the machine may be shared, so timings are read next to it."""
    return round(load_1m(), 2)


def best_seconds(fn: Callable[[], None], repeats: int, min_seconds: float = 0.05) -> float:
    """The best time of one call of `fn` over `repeats` timings, after one warm-up call.

    Each timing runs `fn` as many times as takes about `min_seconds`, so tiny matmuls are not timer noise.
    """
    fn()
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-6)
    inner = max(1, int(min_seconds / once))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


# -- 1. peaks -------------------------------------------------------------------------------------------------------


def cpu_info() -> dict:
    """The CPU's matmul-relevant features: bf16 / AMX flags, torch's dispatch level, cores and threads."""
    try:
        line = next(x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("flags"))
        flags = set(line.split(":", 1)[1].split())
    except (OSError, StopIteration):
        flags = set()
    try:
        model = next(x.split(":", 1)[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines()
                     if x.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor()
    return {
        "model": model, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__, "capability": torch.backends.cpu.get_cpu_capability(),
        "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags, "amx_tile": "amx_tile" in flags,
        "avx512_fp16": "avx512_fp16" in flags, "bf16_flags": sorted(f for f in flags if "bf16" in f or "amx" in f),
    }


def square_peaks(sizes: list[int], dtypes: list[torch.dtype], repeats: int) -> dict:
    """GFLOP/s of n x n x n matmuls (2 n^3 FLOPs each) per dtype and size."""
    out: dict = {}
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        rows = {}
        for n in sizes:
            a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
            c = torch.empty(n, n, dtype=dtype)
            seconds = best_seconds(lambda a=a, b=b, c=c: torch.mm(a, b, out=c), repeats)
            rows[str(n)] = round(2 * n**3 / seconds / 1e9, 1)
            say(f"square matmul {name} {n}: {rows[str(n)]} GFLOP/s")
        out[name] = {"gflops": rows, "best_gflops": max(rows.values())}
    return out


@dataclasses.dataclass(frozen=True)
class Linear:
    """One linear layer of the model: `count` of them, input width K, output width N, run at `tokens` positions."""

    name: str
    k: int
    n: int
    count: int
    tokens: int


def model_linears(config, tokens: int, head_tokens: int) -> list[Linear]:
    """The linear layers of one forward pass of a Llama/Qwen-style decoder, read from its HF config."""
    H = config.hidden_size
    F = config.intermediate_size
    L = config.num_hidden_layers
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or H // heads
    return [
        Linear("q_proj", H, heads * head_dim, L, tokens), Linear("k_proj", H, kv * head_dim, L, tokens),
        Linear("v_proj", H, kv * head_dim, L, tokens), Linear("o_proj", heads * head_dim, H, L, tokens),
        Linear("gate_proj", H, F, L, tokens), Linear("up_proj", H, F, L, tokens), Linear("down_proj", F, H, L, tokens),
        Linear("lm_head", H, config.vocab_size, 1, head_tokens),
    ]


def model_shape_peaks(config, tokens: int, head_tokens: int, dtypes: list[torch.dtype], repeats: int) -> dict:
    """GFLOP/s of the model's own matmuls, forward and backward, per dtype, and of one whole pass.

    ``pass_gflops`` weighs every product by how often a training pass runs it (each layer's linears once per block,
    forward, input-gradient and weight-gradient): total FLOPs / total seconds. It is the ceiling a perfect trainer of
    this model at this micro-batch size would reach, attention, norms and the optimizer left out.
    """
    linears = model_linears(config, tokens, head_tokens)
    out: dict = {"tokens": tokens, "head_tokens": head_tokens,
                 "shapes": {x.name: {"k": x.k, "n": x.n, "count": x.count, "tokens": x.tokens} for x in linears}}
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        rows: dict = {}
        total_flops = total_seconds = 0.0
        fwd_flops = fwd_seconds = 0.0
        for lin in linears:
            T = lin.tokens
            x, w = torch.randn(T, lin.k).to(dtype), torch.randn(lin.n, lin.k).to(dtype)  # X [T,K], W [N,K]
            dy = torch.randn(T, lin.n).to(dtype)  # dY [T,N]
            products = {
                "forward": lambda x=x, w=w: torch.nn.functional.linear(x, w),  # [T,K] x [K,N]
                "grad_input": lambda dy=dy, w=w: torch.mm(dy, w),  # [T,N] x [N,K]
                "grad_weight": lambda dy=dy, x=x: torch.mm(dy.t(), x),  # [N,T] x [T,K]
            }
            row = {}
            flops = 2 * T * lin.k * lin.n
            for kind, fn in products.items():
                seconds = best_seconds(fn, repeats)
                row[kind] = round(flops / seconds / 1e9, 1)
                total_flops += flops * lin.count
                total_seconds += seconds * lin.count
                if kind == "forward":
                    fwd_flops += flops * lin.count
                    fwd_seconds += seconds * lin.count
            rows[lin.name] = row
        out[name] = {"gflops": rows, "pass_gflops": round(total_flops / total_seconds / 1e9, 1),
                     "forward_gflops": round(fwd_flops / fwd_seconds / 1e9, 1)}
        say(f"model-shape matmuls {name} at {tokens} tokens: pass {out[name]['pass_gflops']} GFLOP/s, forward "
            f"{out[name]['forward_gflops']} GFLOP/s")
    return out


# -- 2. memory bandwidth --------------------------------------------------------------------------------------------


def stream(mib: int, repeats: int) -> dict:
    """STREAM copy and triad over float32 arrays of `mib` MiB each, GB/s (10^9 bytes)."""
    n = mib * 2**20 // 4
    a, b, c = torch.rand(n), torch.rand(n), torch.rand(n)
    nbytes = n * 4
    copy_s = best_seconds(lambda: b.copy_(a), repeats, min_seconds=0.0)
    triad_s = best_seconds(lambda: torch.add(b, c, alpha=3.0, out=a), repeats, min_seconds=0.0)
    out = {"array_mib": mib, "copy_gbs": round(2 * nbytes / copy_s / 1e9, 2),
           "triad_gbs": round(3 * nbytes / triad_s / 1e9, 2), "load": load()}
    say(f"memory bandwidth ({mib} MiB arrays): copy {out['copy_gbs']} GB/s, triad {out['triad_gbs']} GB/s")
    return out


# -- the run's config and its real samples ---------------------------------------------------------------------------


def run_config(args: argparse.Namespace):
    """The main job's `RunConfig`: the config file, with this bench's overrides (model, engine, smoke sizes)."""
    from agentrl.config import apply_overrides, load_config

    overrides: dict = {"model": args.model, "engine.kind": args.engine}
    if args.smoke:  # two tasks of two episodes, short replies: the same code path in seconds
        overrides |= {"scheduler.prompts_per_step": 2, "scheduler.group_size": 2, "sampling.max_new_tokens": 8}
    return apply_overrides(load_config(args.config), overrides)


def sample_key(cfg) -> str:
    """What the cached rollout depends on, hashed: model, env, sampling, scheduler, context, engine, seed."""
    from agentrl.config import config_to_dict

    d = config_to_dict(cfg)
    keep = {k: d[k] for k in ("model", "env", "sampling", "scheduler", "context", "seed")}
    keep["engine"] = {k: d["engine"][k] for k in ("kind", "dtype")}
    keep["trainer_dtype"] = d["trainer"]["dtype"]
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:12]


def make_samples(args: argparse.Namespace, path: Path) -> None:
    """Roll out the main job's first step through the project's set-up and save the trajectories (child process).

    Runs `set_up` exactly as `agentrl run` does (the engine `engine.kind` picks, the run's sampling settings and
    seeds) in a scratch run folder, then step 0's rollout; writes `path` (JSONL, `save_trajectories`) and a
    ``.json`` beside it saying which engine drew them.
    """
    from agentrl.recipes.setup import set_up
    from agentrl.records import save_trajectories

    cfg = run_config(args)
    with tempfile.TemporaryDirectory(prefix="limits-run-") as folder:
        cfg = dataclasses.replace(cfg, output=folder, save_trajectories=False, token_values_per_step=0)
        t0 = time.perf_counter()
        run = set_up(cfg, resume=False, overwrite=True, show=lambda fields: None, announce=lambda plan: None)
        try:
            start = time.perf_counter() - t0
            t0 = time.perf_counter()
            rollout = run.scheduler.rollout(0)
            seconds = time.perf_counter() - t0
        finally:
            run.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_trajectories(rollout.trajectories, path, append=False)
    trajectories = rollout.trajectories
    meta = {"model": cfg.model, "env": cfg.env.id, "env_kwargs": dict(cfg.env.kwargs),
            "engine": run.plan.engine.kind, "engine_dtype": run.plan.engine.dtype, "engine_why": run.plan.engine.why,
            "episodes": len(trajectories), "prompts_per_step": cfg.scheduler.prompts_per_step,
            "group_size": cfg.scheduler.group_size, "max_new_tokens": cfg.sampling.max_new_tokens,
            "reward_mean": sum(t.total_return for t in trajectories) / max(len(trajectories), 1),
            "generated_tokens": rollout.stats.generated_tokens, "rollout_seconds": round(seconds, 2),
            "setup_seconds": round(start, 1), "created": time.strftime("%Y-%m-%d %H:%M:%S")}
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1))


def real_trajectories(args: argparse.Namespace, cfg) -> tuple[list, dict]:
    """The first step's trajectories and how they were drawn: from the cache, else rolled out in a child process."""
    from agentrl.records import load_trajectories

    path = Path(args.cache_dir) / f"limits-{sample_key(cfg)}.jsonl"
    if not (path.exists() and path.with_suffix(".json").exists()):
        say(f"rolling out the main job's first step in a child process (engine.kind {cfg.engine.kind}) -> {path}")
        child = [sys.executable, str(Path(__file__).resolve()), *args.argv, "--make-samples", str(path)]
        done = subprocess.run(child, cwd=ROOT)
        if done.returncode != 0:
            raise SystemExit(f"the rollout that draws the samples failed (exit {done.returncode}); its output is above")
    meta = json.loads(path.with_suffix(".json").read_text())
    say(f"samples: {meta['episodes']} episodes drawn by the {meta['engine']} engine ({meta['engine_dtype']}), "
        f"{path.name}")
    return load_trajectories(path), meta | {"cache": str(path.relative_to(ROOT) if path.is_relative_to(ROOT)
                                                         else path)}


def pass_tokens(args: argparse.Namespace, cfg, trajectories: list | None) -> tuple[int, int]:
    """Tokens per training pass for the model-shape matmuls, and how many of them the LM head projects.

    `--tokens` when given; else from the real samples: the mean tokens processed per micro-batch as the trainer's
    token budget, sample cap and packing form them (padding included when not packed), and the sampled (loss) share
    of the real tokens (the head's positions). Without samples: 1,024 tokens, 40% of them sampled (the main job: 64
    of about 150).
    """
    from agentrl.training.microbatch import pack_by_tokens

    if args.tokens or not trajectories:
        tokens = args.tokens or 1024
        return tokens, max(1, int(tokens * 0.4))
    lengths = [len(t.turns[-1].prompt_ids) + len(t.turns[-1].generated_ids) for t in trajectories]
    generated = sum(t.num_generated_tokens for t in trajectories)
    packed = bool(getattr(cfg.trainer, "packing", False))  # padding-free passes run the real tokens alone
    extra = {"packed": packed} if hasattr(cfg.trainer, "packing") else {}
    batches = pack_by_tokens(lengths, range(len(lengths)), cfg.trainer.micro_batch_tokens,
                             cfg.trainer.micro_batch_size, **extra)
    per_pass = [sum(lengths[i] for i in b) if packed else len(b) * max(lengths[i] for i in b) for b in batches]
    tokens = round(sum(per_pass) / len(per_pass))
    return tokens, max(1, round(tokens * generated / sum(lengths)))


# -- 3. the trainer ----------------------------------------------------------------------------------------------


class CountingBackend:
    """A `TrainingBackend` that forwards every call and counts what the passes processed (tokens, seconds).

    The counts come from the requests themselves, so they stay right whatever micro-batches `TrainingStep` forms
    (packed rows included): real tokens are the nonzero attention-mask entries, padded ones the tokens the backbone
    ran (`MicroBatch.padded_tokens`: the padded rows' size, or the packed row's length),
    head tokens the loss-mask positions (the only positions the LM head projects).
    """

    def __init__(self, backend):
        self.backend = backend
        self.reset()

    def __getattr__(self, name: str):
        return getattr(self.backend, name)

    def reset(self) -> None:
        """Zero the counters."""
        self.real = self.padded = self.head = self.passes = self.sequences = 0
        self.step_seconds = 0.0

    def _count(self, requests) -> None:
        for r in requests:
            mb = r.batch
            self.real += int((mb.attention_mask != 0).sum())
            self.padded += int(getattr(mb, "padded_tokens", mb.input_ids.numel()))  # packed rows: no padding
            self.head += int((mb.loss_mask != 0).sum())
            self.passes += 1
            self.sequences += int(mb.input_ids.shape[0])

    def score(self, requests):
        """See `TrainingBackend.score`."""
        self._count(requests)
        return self.backend.score(requests)

    def accumulate(self, requests, objective):
        """See `TrainingBackend.accumulate`."""
        self._count(requests)
        return self.backend.accumulate(requests, objective)

    def step(self, grad_clip: float, lr: float | None = None) -> float:
        """See `TrainingBackend.step` (its seconds are counted apart: the optimizer, not a pass)."""
        t0 = time.perf_counter()
        norm = self.backend.step(grad_clip, lr)
        self.step_seconds += time.perf_counter() - t0
        return norm


def flop_params(model) -> dict:
    """The parameter counts behind 6·N·T.

    N = the non-embedding parameters plus the LM head's matrix (V x H). The embedding lookup is a gather, no FLOPs;
    the head is a real matmul whether or not its matrix is tied to the embedding (SmolLM2 ties it), and it is the
    largest single one (28M of SmolLM2-135M's 134M multiply-adds per token), so leaving it out would understate the
    work by a fifth. Attention's score and value products (4·T·ctx·d per layer) are not counted: at the main job's
    ~150-token samples they are a few percent.
    """
    config = model.config
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel()
    tied = head.data_ptr() == embed.data_ptr()
    body = total - embed.numel() - (0 if tied else head.numel())
    return {"non_embedding": body, "head": config.vocab_size * config.hidden_size, "tied_head": tied,
            "N": body + config.vocab_size * config.hidden_size, "total_unique": total}


def variant_names(args: argparse.Namespace) -> list[tuple[str, dict]]:
    """(label, config overrides) of every trainer variant: each mode, times packing off/on when that setting exists."""
    from agentrl.config import TrainerConfig

    fields = {f.name: f for f in dataclasses.fields(TrainerConfig)}
    packings: list = [None]
    if "packing" in fields and not args.no_packing:
        default = fields["packing"].default
        packings = [False, True] if isinstance(default, bool) else ["off", "on"]
    out = []
    for mode in args.modes:
        for packing in packings:
            overrides = {"trainer.compute_dtype": mode}
            label = mode or "float32"
            if packing is not None:
                overrides["trainer.packing"] = packing
                label += f"/packing={'on' if packing in (True, 'on') else 'off'}"
            out.append((label, overrides))
    return out


def resolved_mode(mode: str) -> str:
    """What a ``trainer.compute_dtype`` value computes in here (``auto`` resolved as the trainer resolves it)."""
    if mode != "auto":
        return mode or "float32"
    try:
        from agentrl.training.precision import resolve_compute_dtype
    except ImportError:  # no `auto` resolver in this tree: bf16 where the CPU has it natively
        cpu = cpu_info()
        return "bfloat16" if cpu["avx512_bf16"] or cpu["amx_bf16"] else "float32"
    return str(resolve_compute_dtype("auto", "float32").dtype).removeprefix("torch.")


def default_modes() -> list[str]:
    """The precision modes `trainer.compute_dtype` accepts, float32 first (the baseline every ratio divides).

    float32, bfloat16 and any further mode the config module names (``COMPUTE_DTYPES`` / ``PRECISION_MODES``, so a
    new mode is picked up by name), each kept only if `TrainerConfig` accepts it. A mode that resolves to one already
    listed here (``auto`` is bfloat16 on a CPU with AVX512-BF16) is not timed twice; float16 is left out (no CPU path
    here makes it faster: ask for it with ``--modes``).
    """
    from agentrl import config
    from agentrl.config import ConfigError, TrainerConfig

    names = ["float32", "bfloat16"]
    for attr in ("COMPUTE_DTYPES", "PRECISION_MODES"):
        names += [n for n in getattr(config, attr, ()) if n and n not in names and n != "float16"]
    accepted: list[str] = []
    for name in names:
        try:
            TrainerConfig(compute_dtype=name)
        except (ConfigError, ValueError):
            continue
        if resolved_mode(name) not in [resolved_mode(a) for a in accepted]:
            accepted.append(name)
    return accepted


def peak_dtype(mode: str) -> str:
    """Which peak a precision mode's MFU divides by: bfloat16 for any bf16 mode, float16, else float32."""
    low = resolved_mode(mode).lower()
    if "bfloat16" in low or "bf16" in low:
        return "bfloat16"
    if "float16" in low or "fp16" in low:
        return "float16"
    return "float32"


@dataclasses.dataclass
class Variant:
    """One trainer variant: its label, its config, the counting backend and the `TrainingStep` over it."""

    label: str
    cfg: object
    backend: CountingBackend
    step: object
    plan: dict
    times: dict = dataclasses.field(default_factory=lambda: {"score": [], "update": [], "optimizer": []})
    counts: dict = dataclasses.field(default_factory=dict)


def build_variant(label: str, cfg, engine_kind: str) -> Variant:
    """A backend and `TrainingStep` built as `agentrl.recipes.setup.set_up` builds them, for this variant's config."""
    from agentrl.models import load_model
    from agentrl.recipes.plan import ClusterPlan, plan_run
    from agentrl.training.factory import build_backend
    from agentrl.training.routing_replay import routing_strategy
    from agentrl.training.step import TrainingStep

    # The engine the samples were drawn with, named: resolving `auto` again would import vLLM in this process.
    cfg = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, kind=engine_kind))
    policy = load_model(cfg.model, dtype=getattr(torch, cfg.trainer.dtype))
    policy.name = cfg.model
    cfg, plan = plan_run(cfg, policy, single_turn=True, cluster=ClusterPlan())
    backend = CountingBackend(build_backend(cfg.trainer, cfg.optim, plan.trainer, policy=policy, source=cfg.model,
                                            placement=None, seed=cfg.seed))
    pad_id = policy.tokenizer.pad_token_id
    step = TrainingStep(
        backend=backend, routing=routing_strategy(cfg.loss.routing_replay, backend.is_moe, cfg.model), loss=cfg.loss,
        advantage=cfg.advantage, optim=cfg.optim, trainer=cfg.trainer,
        per_turn_budget=max((cfg.sampling.max_new_tokens, *cfg.context.max_new_tokens_by_turn)),
        pad_id=pad_id if pad_id is not None else policy.tokenizer.eos_token_id,
        shuffle=torch.Generator().manual_seed(cfg.seed), out=Path(tempfile.gettempdir()))
    plan_row = {k: v for k, v in plan.trainer.to_dict().items()
                if k in ("dtype", "gradient_checkpointing", "backend", "compute_dtype")}
    return Variant(label, cfg, backend, step, plan_row)


def time_variant(v: Variant, trajectories: list) -> None:
    """One round of a variant: the score pass, then the step's pi_old choice and update; seconds and counts kept."""
    from agentrl.training.step import as_trained, score_old_policy

    batch = v.step.make_samples(as_trained(trajectories, 0))
    b = v.backend
    b.reset()
    t0 = time.perf_counter()
    score_old_policy(v.step, batch.samples)
    v.times["score"].append(time.perf_counter() - t0)
    score = {"real": b.real, "padded": b.padded, "head": b.head, "passes": b.passes, "sequences": b.sequences}
    b.reset()
    t0 = time.perf_counter()
    old = v.step.old_policy(batch.samples)
    v.step.update(batch.samples, old, batch.ref_logp, 0)
    v.times["update"].append(time.perf_counter() - t0)
    v.times["optimizer"].append(b.step_seconds)
    v.counts = {"samples": len(batch.samples), "score": score,
                "update": {"real": b.real, "padded": b.padded, "head": b.head, "passes": b.passes,
                           "sequences": b.sequences}}


def trainer_rates(args: argparse.Namespace, cfg, samples: tuple[list, dict]) -> dict:
    """The trainer part: every variant timed on the real samples, alternating, with FLOP/s and ratios (MFU: `add_mfu`,
    once the peaks are final)."""
    trajectories, meta = samples
    if not cfg.trainer.memory_limit_gb:
        import psutil

        # Every variant plans its memory (gradient checkpointing or not) against what this machine had free before
        # any of them loaded, as a lone run would: the variants built later must not see the earlier ones' weights.
        from agentrl.config import apply_overrides

        cfg = apply_overrides(cfg, {"trainer.memory_limit_gb": psutil.virtual_memory().available / 2**30})
    variants = []
    for label, overrides in variant_names(args):
        from agentrl.config import apply_overrides

        say(f"building trainer variant {label}")
        variants.append(build_variant(label, apply_overrides(cfg, overrides), meta["engine"]))
    params = flop_params(variants[0].backend.model)
    loads = []
    for r in range(args.repeats):
        for v in variants:
            loads.append(load())
            time_variant(v, trajectories)
            say(f"round {r} {v.label}: score {v.times['score'][-1]:.2f} s, update {v.times['update'][-1]:.2f} s "
                f"(optimizer {v.times['optimizer'][-1]:.2f} s), load {loads[-1]}")
    N = params["N"]
    rows = {}
    for v in variants:
        kept = {k: t[1:] or t for k, t in v.times.items()}  # the first round is the warm-up
        best = {k: min(t) for k, t in kept.items()}
        row = {"plan": v.plan, "samples": v.counts["samples"], "rounds_kept": len(kept["score"]),
               "seconds_best": {k: round(s, 3) for k, s in best.items()},
               "seconds_median": {k: round(statistics.median(t), 3) for k, t in kept.items()},
               "seconds_all": {k: [round(s, 3) for s in t] for k, t in v.times.items()}}
        peak_name = peak_dtype(v.cfg.trainer.compute_dtype or v.cfg.trainer.dtype)
        for part, factor in (("score", 2), ("update", 6)):
            c, seconds = v.counts[part], best[part]
            achieved = factor * N * c["real"] / seconds / 1e9  # GFLOP/s by 2·N·T / 6·N·T on the real tokens
            # What the passes actually multiply: the body over every padded position, the head at loss positions.
            executed = factor * (params["non_embedding"] * c["padded"] + params["head"] * c["head"]) / seconds / 1e9
            row[part] = {
                "tokens_real": c["real"], "tokens_padded": c["padded"], "tokens_head": c["head"],
                "micro_batches": c["passes"], "sequences": c["sequences"],
                "tok_per_s_real": round(c["real"] / seconds, 1),
                "tok_per_s_padded": round(c["padded"] / seconds, 1), "gflops_6nt": round(achieved, 1),
                "gflops_executed": round(executed, 1), "peak_dtype": peak_name,
            }
        rows[v.label] = row
    base = {lab.split("/", 1)[1] if "/" in lab else "": rows[lab] for lab in rows if lab.split("/")[0] == "float32"}
    for label, row in rows.items():
        ref = base.get(label.split("/", 1)[1] if "/" in label else "")
        if ref is not None:
            row["speedup_vs_float32"] = {k: round(ref["seconds_best"][k] / row["seconds_best"][k], 2)
                                         for k in ("score", "update")}
    for label, row in rows.items():  # padding-free against padded, same precision mode
        mode, _, packing = label.partition("/")
        off = rows.get(f"{mode}/packing=off")
        if packing == "packing=on" and off is not None:
            row["speedup_vs_padded"] = {k: round(off["seconds_best"][k] / row["seconds_best"][k], 2)
                                        for k in ("score", "update")}
    return {"samples_from": meta, "flop_params": params, "variants": rows, "load": loads,
            "config": {"micro_batch_tokens": cfg.trainer.micro_batch_tokens,
                       "memory_limit_gb": round(cfg.trainer.memory_limit_gb, 1),
                       "micro_batch_size": cfg.trainer.micro_batch_size, "loss": cfg.loss.name,
                       "old_policy_pass": cfg.loss.old_policy_pass, "n_minibatches": cfg.optim.n_minibatches}}


def add_mfu(trainer: dict, peaks: dict) -> None:
    """MFU of every variant's passes against the matching square peak and model-shape ceiling (in place).

    ``hfu_model_shapes``: how busy the matmul units were, the FLOPs the passes actually ran (padding included, the
    head at loss positions only) against the model-shape ceiling.
    """
    for row in trainer["variants"].values():
        for part in ("score", "update"):
            r = row[part]
            square = peaks["square"].get(r["peak_dtype"], {}).get("best_gflops")
            shaped = peaks["model_shapes"].get(r["peak_dtype"], {})
            ceiling = shaped.get("forward_gflops" if part == "score" else "pass_gflops")
            r |= {"mfu_square": round(r["gflops_6nt"] / square, 3) if square else None,
                  "mfu_model_shapes": round(r["gflops_6nt"] / ceiling, 3) if ceiling else None,
                  "hfu_model_shapes": round(r["gflops_executed"] / ceiling, 3) if ceiling else None,
                  "peaks_used_gflops": {"square": square, "model_shapes": ceiling}}


def best_peaks(rounds: list[dict]) -> dict:
    """The peaks at their best over the rounds measured (a shared machine lowers some rounds, never raises them)."""
    out = json.loads(json.dumps(rounds[0]))
    for other in rounds[1:]:
        for dtype, p in other["square"].items():
            mine = out["square"][dtype]
            mine["gflops"] = {n: max(g, mine["gflops"].get(n, 0)) for n, g in p["gflops"].items()}
            mine["best_gflops"] = max(mine["gflops"].values())
        for dtype, p in other["model_shapes"].items():
            if not isinstance(p, dict) or "pass_gflops" not in p:
                continue  # the shapes' description, not a dtype's rates
            mine = out["model_shapes"][dtype]
            for name, kinds in p["gflops"].items():
                mine["gflops"][name] = {k: max(g, mine["gflops"][name][k]) for k, g in kinds.items()}
            mine["pass_gflops"] = max(mine["pass_gflops"], p["pass_gflops"])
            mine["forward_gflops"] = max(mine["forward_gflops"], p["forward_gflops"])
    return out


# -- 4. the engine -------------------------------------------------------------------------------------------------


def main_job_prompts(cfg, policy) -> list[list[int]]:
    """The first prompt of `prompts_per_step x group_size` distinct tasks, rendered as the run renders them."""
    import agentrl
    from agentrl.chat.context import ChatContext

    options = cfg.context.rollout_kwargs(policy.family)
    prompts = []
    env = agentrl.make(cfg.env.id, **cfg.env.kwargs)
    try:
        for i in range(cfg.scheduler.prompts_per_step * cfg.scheduler.group_size):
            obs, info = env.reset(seed=cfg.env.seed_offset + i)
            context = ChatContext(policy.tokenizer, env.system_prompt, options["chat_kwargs"],
                                  **options["context_options"])
            prompts.append(list(context.first_prompt(obs, info)))
    finally:
        env.close()
    return prompts


def clear_prefix_cache(engine) -> None:
    """Empty the engine's prefix cache, so a timed run prefills every prompt in full."""
    inner = getattr(engine, "engine", engine)  # `BatchedRequests` wraps the HF engine
    if hasattr(inner, "clear_cache"):
        inner.clear_cache()
    llm = getattr(engine, "llm", None)
    if llm is not None:
        llm.reset_prefix_cache()


def generate_all(engine, prompts: list[list[int]], params) -> tuple[float, list[int]]:
    """Every prompt submitted at once, polled until done: (seconds, generated tokens per prompt)."""
    from agentrl.engine import EngineRequest

    clear_prefix_cache(engine)
    lengths = [0] * len(prompts)
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.submit(EngineRequest(i, tuple(p), dataclasses.replace(params, seed=i)))
    left = len(prompts)
    while left:
        for result in engine.poll():
            lengths[result.request_id] = len(result.generation.token_ids)
            left -= 1
    return time.perf_counter() - t0, lengths


def engine_rates(args: argparse.Namespace, cfg, bandwidth: dict) -> dict:
    """Prefill and decode tokens/s of the run's engine on the main job's prompts, against the bandwidth bound."""
    from agentrl.engine import SamplingParams, build_engines
    from agentrl.models import load_model
    from agentrl.recipes.plan import ClusterPlan, plan_run

    policy = load_model(cfg.model, dtype=getattr(torch, cfg.trainer.dtype))
    policy.name = cfg.model
    cfg, run_plan = plan_run(cfg, policy, single_turn=True, cluster=ClusterPlan())
    plan = run_plan.engine
    spec = plan.spec(cfg.engine, seed=cfg.seed)
    say(f"engine: {plan.kind} ({plan.why or 'asked for'}), {plan.dtype}, KV {plan.kv_cache_gib:.2f} GiB")
    prompts = main_job_prompts(cfg, policy)
    engine = build_engines(spec, policy, share_module=False)
    threads = {"torch_threads": torch.get_num_threads(),
               **{k: os.environ[k] for k in ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE",
                                             "VLLM_CPU_NUM_OF_RESERVED_CPU") if k in os.environ}}
    sampling = SamplingParams(temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p,
                              top_k=cfg.sampling.top_k, max_new_tokens=cfg.sampling.max_new_tokens)
    first = dataclasses.replace(sampling, max_new_tokens=1)
    prefill_s, full_s, full_lengths = [], [], []
    hits = 0.0
    try:
        for r in range(args.engine_repeats):
            seconds, _ = generate_all(engine, prompts, first)
            prefill_s.append(seconds)
            seconds, lengths = generate_all(engine, prompts, sampling)
            hits = engine.metrics().get("prefix_cache_hit_rate", 0.0)  # since the previous call: these two runs
            full_s.append(seconds)
            full_lengths.append(lengths)
            say(f"engine round {r}: prefill {prefill_s[-1]:.2f} s, full {full_s[-1]:.2f} s "
                f"({sum(lengths)} tokens), prefix cache hits {hits:.2f}, load {load()}")
    finally:
        engine.close()
    keep = slice(1, None) if args.engine_repeats > 1 else slice(None)  # the first round is the warm-up
    prompt_tokens = sum(len(p) for p in prompts)
    # The least-disturbed times of each kind (the machine may be shared): the decode time is what the full
    # generation took beyond its prefill.
    prefill, full = min(prefill_s[keep]), min(full_s[keep])
    lengths = full_lengths[full_s.index(full)]
    decoded = sum(lengths) - len(lengths)  # each request's first token came with its prefill
    decode = decoded / max(full - prefill, 1e-6)
    batch = decoded / max(max(lengths) - 1, 1)  # mean requests per decode step (replies stop at different lengths)
    context = prompt_tokens / len(prompts) + sum(lengths) / len(lengths) / 2  # mean context over the decode
    # Bytes a decode step reads: every weight once (the tied head is read once) at the engine's dtype, and each
    # sequence's keys and values (2 x layers x kv heads x head_dim per token) at the KV dtype (the engine's).
    c = policy.model.config
    width = torch.finfo(getattr(torch, plan.dtype)).bits // 8
    params = flop_params(policy.model)["total_unique"]
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_per_token = 2 * c.num_hidden_layers * (getattr(c, "num_key_value_heads", None) or c.num_attention_heads) \
        * head_dim * width
    step_bytes = params * width + batch * context * kv_per_token
    bound = batch * bandwidth["triad_gbs"] * 1e9 / step_bytes
    out = {"kind": plan.kind, "why": plan.why, "dtype": plan.dtype, "kv_cache_gib": plan.kv_cache_gib,
           "requests": len(prompts), "batch_size_setting": cfg.engine.batch_size, "threads": threads,
           "prompt_tokens": prompt_tokens, "max_new_tokens": cfg.sampling.max_new_tokens,
           "prefill_seconds": [round(s, 3) for s in prefill_s], "full_seconds": [round(s, 3) for s in full_s],
           "prefill_tok_per_s": round(prompt_tokens / prefill, 1), "decode_tok_per_s": round(decode, 1),
           "prefix_cache_hit_rate": round(hits, 3), "mean_decode_batch": round(batch, 1),
           "mean_context_tokens": round(context, 1),
           "weight_bytes": params * width, "kv_bytes_per_token": kv_per_token, "bytes_per_decode_step": int(step_bytes),
           "triad_gbs_used": bandwidth["triad_gbs"], "bound_tok_per_s": round(bound, 1),
           "of_bound": round(decode / bound, 3), "load": load()}
    say(f"engine {plan.kind} {plan.dtype}: prefill {out['prefill_tok_per_s']} tok/s, decode "
        f"{out['decode_tok_per_s']} tok/s at mean batch {out['mean_decode_batch']} = {100 * out['of_bound']:.0f}% of "
        f"the bandwidth bound {out['bound_tok_per_s']} tok/s")
    return out


# -- the run ---------------------------------------------------------------------------------------------------------


def table(result: dict) -> str:
    """The short printed summary."""
    lines = []
    cpu = result["cpu"]
    lines.append(f"CPU {cpu['model']}: {cpu['cores']} cores, torch {cpu['torch_threads']} threads, "
                 f"{cpu['capability']}, avx512_bf16={cpu['avx512_bf16']} amx_bf16={cpu['amx_bf16']}")
    for dtype, p in result["peaks"]["square"].items():
        shaped = result["peaks"]["model_shapes"].get(dtype, {})
        lines.append(f"  {dtype:9s} square peak {p['best_gflops']:8.1f} GFLOP/s   model-shape pass "
                     f"{shaped.get('pass_gflops', float('nan')):8.1f}   forward {shaped.get('forward_gflops', 0):8.1f}")
    bw = result["bandwidth"]
    lines.append(f"  memory: copy {bw['copy_gbs']} GB/s, triad {bw['triad_gbs']} GB/s")
    if "trainer" in result:
        lines.append(f"  trainer (N = {result['trainer']['flop_params']['N'] / 1e6:.1f}M):")
        lines.append(f"    {'variant':28s} {'update s':>9s} {'tok/s':>8s} {'GFLOP/s':>8s} {'MFU sq':>7s} "
                     f"{'MFU shp':>7s} {'x fp32':>6s} | {'score s':>8s} {'tok/s':>8s}")
        for label, row in result["trainer"]["variants"].items():
            u, s = row["update"], row["score"]
            lines.append(f"    {label:28s} {row['seconds_best']['update']:9.2f} {u['tok_per_s_real']:8.1f} "
                         f"{u['gflops_6nt']:8.1f} {u['mfu_square'] or 0:7.3f} {u['mfu_model_shapes'] or 0:7.3f} "
                         f"{row.get('speedup_vs_float32', {}).get('update', float('nan')):6.2f} | "
                         f"{row['seconds_best']['score']:8.2f} {s['tok_per_s_real']:8.1f}")
    if "engine" in result:
        e = result["engine"]
        lines.append(f"  engine {e['kind']} {e['dtype']}: prefill {e['prefill_tok_per_s']} tok/s, decode "
                     f"{e['decode_tok_per_s']} tok/s (mean batch {e['mean_decode_batch']}), bound "
                     f"{e['bound_tok_per_s']} tok/s: {100 * e['of_bound']:.0f}%")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(CONFIG), help="the main job's config")
    ap.add_argument("--model", default=None, help="override the config's model")
    ap.add_argument("--engine", default=None, help="override engine.kind (auto: vLLM where it serves the model)")
    ap.add_argument("--modes", nargs="+", default=None,
                    help="trainer.compute_dtype values to compare (default: every mode the config accepts, float32 "
                         "first)")
    ap.add_argument("--no-packing", action="store_true", help="time trainer.packing's default only")
    ap.add_argument("--repeats", type=int, default=3, help="trainer rounds per variant (the first is warm-up)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096], help="square matmul sizes")
    ap.add_argument("--tokens", type=int, default=0,
                    help="tokens per pass for the model-shape matmuls (0: the real micro-batches' mean)")
    ap.add_argument("--peak-repeats", type=int, default=5)
    ap.add_argument("--stream-mib", type=int, default=1024, help="MiB per STREAM array")
    ap.add_argument("--stream-repeats", type=int, default=5)
    ap.add_argument("--engine-repeats", type=int, default=3, help="engine rounds (the first is warm-up)")
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--skip-trainer", action="store_true")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny model (tiny-qwen3, HF engine) and tiny sizes: checks the bench runs, measures nothing")
    ap.add_argument("--cache-dir", default=str(CACHE), help="where the drawn samples are kept")
    ap.add_argument("--out", default=str(RESULTS / "limits.json"))
    ap.add_argument("--merge", action="store_true",
                    help="keep the parts this run skips (trainer, engine) from the file at --out, each with its date")
    ap.add_argument("--make-samples", default=None, help=argparse.SUPPRESS)  # the child process that rolls out
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the child that rolls out parses the same
    if args.smoke:
        args.model = args.model or "tiny-qwen3"
        args.engine = args.engine or "hf"
        args.sizes, args.tokens, args.peak_repeats = [128, 256], args.tokens or 64, 2
        args.stream_mib, args.stream_repeats = 16, 2
        args.repeats, args.engine_repeats = 2, 2
    if args.modes is None:
        args.modes = default_modes()
    return args


def main(argv: list[str] | None = None) -> None:
    """Run every part and write the JSON (see the module docstring)."""
    args = parse_args(argv)
    if args.make_samples:
        make_samples(args, Path(args.make_samples))
        return
    cfg = run_config(args)
    started = time.perf_counter()
    result: dict = {"command": command_line(__file__, argv),
                    "model": cfg.model, "smoke": args.smoke, "cpu": cpu_info(), "load_start": load(),
                    "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    say(f"{result['cpu']['model']}, {result['cpu']['cores']} cores, torch threads {torch.get_num_threads()}, "
        f"capability {result['cpu']['capability']}, bf16 flags {result['cpu']['bf16_flags']}")
    dtypes = [torch.float32, torch.bfloat16]
    samples = None if args.skip_trainer else real_trajectories(args, cfg)  # first: its child process may roll out
    tokens, head_tokens = pass_tokens(args, cfg, samples[0] if samples else None)
    from agentrl.models import load_model

    model_config = load_model(cfg.model).model.config

    def peaks() -> dict:
        return {"square": square_peaks(args.sizes, dtypes, args.peak_repeats),
                "model_shapes": model_shape_peaks(model_config, tokens, head_tokens, dtypes, args.peak_repeats),
                "load": load()}

    rounds = [peaks()]
    result["bandwidth"] = stream(args.stream_mib, args.stream_repeats)
    if not args.skip_trainer:
        result["trainer"] = trainer_rates(args, cfg, samples) | {"measured": result["date"]}
        say("the peaks again, after the trainer (each peak is the best of both rounds)")
        rounds.append(peaks())
    result["peaks"] = best_peaks(rounds) | {"rounds": rounds}
    if "trainer" in result:
        add_mfu(result["trainer"], result["peaks"])
    if not args.skip_engine:  # last: a vLLM engine binds this process's threads when it starts
        result["engine"] = engine_rates(args, cfg, result["bandwidth"]) | {"measured": result["date"]}
    result["seconds"] = round(time.perf_counter() - started, 1)
    out = Path(args.out)
    if args.merge and out.exists():
        before = json.loads(out.read_text())
        for part in ("trainer", "engine"):
            if part not in result and part in before:
                result[part] = before[part] | {"measured": before[part].get("measured", before.get("date"))}
    print(table(result), flush=True)
    write_json(out, result)
    say(f"wrote {out}")


if __name__ == "__main__":
    main()
