"""Run configuration: typed dataclasses with documented defaults, one section per owner.

Each section is read by the module that owns it: `env` (the registry and the rollout's task seeds), `sampling` and
`context` (the agent loop, `agentrl.rollout.loop`), `engine` (`agentrl.engine`), `runners` (`agentrl.rollout.pool`),
`scheduler` (`agentrl.rollout.scheduler`), `trainer` and `optim` (`agentrl.training`), `loss`, `advantage` and `guard`
(`agentrl.objective`). Set-up resolves them once into a `agentrl.recipes.plan.RunPlan`. A YAML file in `configs/`
only sets values and mirrors the sections::

    model: smollm2-135m
    env: {id: math, kwargs: {level: 2}}
    scheduler: {group_size: 8, prompts_per_step: 4}
    sampling: {max_new_tokens: 96}
    loss: {name: minirl}

Unknown keys are errors that name the key and list the valid ones: a typo must never silently fall back to a default.
A key of an earlier layout fails with one line naming its new place (`MOVED_KEYS`); a key renamed by the current
release is still read, with a warning naming its new place, until the release written beside it (`RENAMED_KEYS`).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import logging
import types
import typing
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml

__all__ = [
    "EnvConfig", "SamplingConfig", "EngineConfig", "VllmEngineConfig", "RunnersConfig", "SchedulerConfig",
    "ContextConfig",
    "TrainerConfig", "LoraConfig", "OptimConfig", "LossConfig", "OverlongConfig", "AdvantageConfig", "GuardConfig",
    "CurriculumConfig",
    "LogConfig", "AgentConfig", "JudgeConfig", "RewardConfig", "RUBRIC_FIELDS", "check_rubric",
    "RunConfig",
    "MOVED_KEYS", "RENAMED_KEYS", "Renamed",
    "ConfigError",
    "load_config", "apply_overrides", "build_config", "config_to_dict",
]


logger = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A config file or override that does not fit the dataclasses (unknown key, wrong type, value out of range)."""


ROUTING_REPLAY_MODES = ("none", "r2", "r3")
"""`LossConfig.routing_replay` values."""
DTYPES = ("float32", "bfloat16", "float16")
COMPUTE_DTYPES = ("auto", "float32", "bfloat16")
"""What ``trainer.compute_dtype`` accepts (see `agentrl.training.precision`)."""
OBSERVATION_ROLES = ("user", "tool")
"""The roles an observation after the first can be rendered as (`context.observation_role`, besides ``auto``)."""


@functools.cache
def chat_family_names() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The chat-template families and their aliases, as the family table (``templates/families.yaml``) lists them.

    Read from the data file rather than `agentrl.chat.families`, which imports this module: the config is checked
    before any chat code loads.
    """
    from importlib.resources import files

    table = yaml.safe_load(files("agentrl.templates").joinpath("families.yaml").read_text())
    return tuple(f["name"] for f in table["families"]), tuple(table.get("aliases") or {})
"""`trainer.dtype` and `engine.dtype` values (torch dtype names)."""


@dataclass
class EnvConfig:
    """Which environment, how to build it, which tasks each step plays."""

    id: str = "math"
    """Registry id (`agentrl envs list`), or ``package.module:Class``, or ``path/to/file.py:Class``."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Constructor keyword arguments for the env (env-specific, so free-form); what is left out takes the env's own
    defaults (math: level 1)."""
    seed_offset: int = 0
    """Task seeds of step s are `seed_offset + s * prompts_per_step + i`: every step sees new tasks."""
    max_turns: int = 50
    """Cap on model calls per episode. Envs end episodes with their own budgets first (math single-turn: 1 reply;
    WebShop: 15 steps; GUI: 25; ALFWorld: 50), so the default lets every built-in env play out whole episodes."""
    url: str = ""
    """A served env, ``http://HOST:PORT/NAME`` (`agentrl env serve`): the same as giving it as `id`, which it then
    becomes."""

    def __post_init__(self) -> None:
        if self.url:
            _require(self.url.startswith(("http://", "https://")), "env.url", self.url, "http://HOST:PORT/NAME")
            _require(self.id in ("math", self.url), "env.id", self.id,
                     f"left out when env.url is set (env.url {self.url!r} names the env)")
            self.id = self.url
        _require(isinstance(self.id, str) and bool(self.id), "env.id", self.id,
                 "a registered env id, module:Class or path/to/file.py:Class")
        _require(self.seed_offset >= 0, "env.seed_offset", self.seed_offset, ">= 0 (env seeds cannot be negative)")
        _require(self.max_turns >= 1, "env.max_turns", self.max_turns, ">= 1")


@dataclass
class SamplingConfig:
    """How the policy samples its replies while training (`agentrl eval` uses the model's official settings)."""

    temperature: float = 1.0
    """Train at temperature 1: the importance weights assume we learn from what the policy really samples."""
    top_p: float = 1.0
    """Nucleus sampling mass (1 = off)."""
    top_k: int = 0
    """Top-k sampling (0 = off)."""
    max_new_tokens: int = 64
    """Per turn: enough for actions and short answers; raise it for reasoning or thinking models."""

    def __post_init__(self) -> None:
        # Greedy decoding would give every episode of a group the same reply: zero advantages, nothing to learn.
        _require(self.temperature > 0, "sampling.temperature", self.temperature, "> 0 for training")
        _require(0 < self.top_p <= 1, "sampling.top_p", self.top_p, "in (0, 1]")
        _require(self.top_k >= 0, "sampling.top_k", self.top_k, ">= 0 (0 = off)")
        _require(self.max_new_tokens >= 1, "sampling.max_new_tokens", self.max_new_tokens, ">= 1")


VLLM_KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
"""`VllmEngineConfig.kv_cache_dtype` values: the engine's dtype, or an FP8 format both vLLM builds store."""


@dataclass(frozen=True)
class VllmEngineConfig:
    """vLLM's own throughput settings (``--engine.vllm.*``); the defaults are what the engine always used.

    Each one is handed to vLLM's ``LLM(...)`` by `agentrl.engine.vllm.VLLMEngine`; `bench/micro/engine_tuning.py`
    measures them on the headline command. The HF engine ignores them.
    """

    block_size: int = 0
    """Tokens per KV-cache block, which is also where prefix-cache hits land: a turn re-prefills its prompt from the
    last whole cached block, so smaller blocks re-prefill fewer tokens per turn. 0: vLLM's default (128 on the CPU
    build, 16 on GPUs); the CPU attention's fast kernels want a multiple of 32."""
    kv_cache_dtype: str = "auto"
    """What the KV cache stores: ``auto`` (the engine's dtype) or ``fp8`` / ``fp8_e4m3`` / ``fp8_e5m2`` (half the
    bytes a bfloat16 cache reads per decode step, at some precision: the sampler then departs further from the
    trainer, which the mismatch KL shows)."""
    max_num_seqs: int = 0
    """Most requests in one engine step; 0: vLLM's default (256 on the CPU build, more than a rollout's episodes)."""
    max_num_batched_tokens: int = 0
    """Most tokens (prefill + decode) in one engine step; 0: the longest context or 4096 if more on the CPU build
    (which prefills whole prompts, so this must hold the longest one), vLLM's default on GPUs."""
    enforce_eager: bool = True
    """Run the model eagerly (as always so far); off, vLLM compiles it (torch.compile with Inductor on the CPU build,
    CUDA graphs on GPUs): fewer per-op overheads per step, at a compile cost when the engine starts."""

    def __post_init__(self) -> None:
        _require(self.block_size >= 0 and self.block_size % 16 == 0, "engine.vllm.block_size", self.block_size,
                 "0 (vLLM's default) or a positive multiple of 16 (32, 64, 128: the CPU build wants multiples of 32)")
        _require(self.kv_cache_dtype in VLLM_KV_CACHE_DTYPES, "engine.vllm.kv_cache_dtype", self.kv_cache_dtype,
                 f"one of {', '.join(VLLM_KV_CACHE_DTYPES)}")
        _require(self.max_num_seqs >= 0, "engine.vllm.max_num_seqs", self.max_num_seqs, ">= 0 (0: vLLM's default)")
        _require(self.max_num_batched_tokens >= 0, "engine.vllm.max_num_batched_tokens", self.max_num_batched_tokens,
                 ">= 0 (0: the longest context on the CPU build, vLLM's default on GPUs)")


@dataclass
class EngineConfig:
    """The inference engines: which kind, how many, in what precision, on which devices (see `agentrl.engine`)."""

    kind: str = "auto"
    """``hf`` (transformers, our decode loop), ``vllm`` (continuous batching, prefix caching; needs the vLLM install of
    the README), or ``auto``: vLLM where it is installed and serves the model, else HF (resolved once in the run plan
    and saved as such)."""
    replicas: int = 1
    """Engine replicas (``--engines``); more than one (or a `ray_address`) runs them as Ray actors, episodes spread by
    load."""
    dtype: str = ""
    """The engine's precision (float32, bfloat16); empty: in training runs bfloat16 for vLLM engines and the trainer's
    dtype for HF (docs/results.md, the mismatch study); in `agentrl eval` the model's."""
    kv_cache_gib: float = 0.0
    """Memory for each engine's KV cache (vLLM; host memory on the CPU build) or prefix store (HF), in GiB; 0 sizes
    it to keep every episode in flight cached at its longest context, within half the free memory."""
    batch_size: int = 32
    """Prompts per engine forward pass (HF engine)."""
    gpus: float = 0.0
    """GPUs each Ray-placed engine owns (``--gpus-per-engine``)."""
    colocate: bool = False
    """Engines share the trainers' GPUs (sleeping while they train) instead of owning their own."""
    ray_resource: str = ""
    """A Ray custom resource that places the engine actors (empty: anywhere): each asks 0.01 of it, so they start only
    on nodes started with ``ray start --resources '{"NAME": 1}'``; engines become Ray actors even with one replica."""
    vllm: VllmEngineConfig = field(default_factory=VllmEngineConfig)
    """vLLM's throughput settings (KV block size and dtype, batch limits, compilation)."""

    def __post_init__(self) -> None:
        _require(self.kind in ("auto", "hf", "vllm"), "engine.kind", self.kind, "auto, hf or vllm")
        _require(self.replicas >= 1, "engine.replicas", self.replicas, ">= 1")
        _require(self.dtype in ("", *DTYPES), "engine.dtype", self.dtype,
                 f"empty (the trainer's dtype) or one of {', '.join(DTYPES)}")
        _require(self.kv_cache_gib >= 0, "engine.kv_cache_gib", self.kv_cache_gib,
                 ">= 0 GiB (0: sized for the rollout)")
        _require(self.batch_size >= 1, "engine.batch_size", self.batch_size, ">= 1")
        _require(self.gpus >= 0, "engine.gpus", self.gpus, ">= 0")


@dataclass
class RunnersConfig:
    """The env runner pool: envs in Ray actors, with fault tolerance (see `agentrl.rollout.pool`)."""

    count: int = 0
    """Concurrent env runners (``--runners``); 0 runs envs in the driver process."""
    actors: int = 0
    """Ray processes hosting the runners (several envs each); 0 = one per CPU of the Ray cluster."""
    step_timeout: float = 60.0
    """Seconds an env reset/step may take in a runner before the runner is restarted and the episode re-run."""
    max_episode_retries: int = 2
    """Re-runs of an episode whose env failed before its whole group is dropped (and counted)."""
    max_failed_steps: int = 3
    """Steps in a row whose every group was dropped before the run stops with exit code 1 (an env server that died, an
    env that fails every episode); 0 never stops."""

    def __post_init__(self) -> None:
        _require(self.count >= 0, "runners.count", self.count, ">= 0 (0 = in-process)")
        _require(self.actors >= 0, "runners.actors", self.actors, ">= 0 (0 = one per CPU)")
        _require(self.step_timeout > 0, "runners.step_timeout", self.step_timeout, "> 0 seconds")
        _require(self.max_episode_retries >= 0, "runners.max_episode_retries", self.max_episode_retries, ">= 0")
        _require(self.max_failed_steps >= 0, "runners.max_failed_steps", self.max_failed_steps, ">= 0 (0 = never stop)")


@dataclass
class SchedulerConfig:
    """What each step rolls out and with which policy version (see `agentrl.rollout.scheduler`)."""

    prompts_per_step: int = 4
    """Distinct tasks (env seeds) per training step."""
    group_size: int = 8
    """Episodes per task; advantages compare episodes within a group."""
    sync_every: int = 1
    """Refresh the rollout engine's weights every k steps (1 = lockstep on-policy; samples are <= k-1 steps old)."""
    async_rollout: bool = False
    """Collect the next step's rollout while this step trains, bounded by `max_staleness`."""
    max_staleness: int = 1
    """Async mode: train only on samples at most this many policy versions old (fresher ones first)."""
    max_oversample: float = 1.0
    """Dynamic sampling that refills (needs `loss.dynamic_sampling`): a step rolls out more tasks until it has
    `prompts_per_step` groups with mixed rewards, at most this many times `prompts_per_step` tasks in all (1 = no
    refill: groups whose episodes all got the same reward are only left out). Extra tasks come in rounds of at most
    `prompts_per_step`, from seeds of their own (`refill_seed`); see `agentrl.rollout.refill`."""
    partial_rollouts: bool = False
    """Async mode: partial rollouts: episodes play on across steps and weight updates (between turns), a step trains on
    the first groups to complete, and `max_staleness` holds per turn (older turns leave the loss); see
    `agentrl.rollout.partial`."""

    def __post_init__(self) -> None:
        for name in ("prompts_per_step", "group_size", "sync_every"):
            _require(getattr(self, name) >= 1, f"scheduler.{name}", getattr(self, name), ">= 1")
        _require(self.max_staleness >= 0, "scheduler.max_staleness", self.max_staleness, ">= 0")
        _require(not self.partial_rollouts or self.async_rollout, "scheduler.partial_rollouts", self.partial_rollouts,
                 "false without scheduler.async_rollout (partial rollouts run in async mode): add --async")
        _require(isinstance(self.max_oversample, (int, float)) and 1 <= self.max_oversample < float("inf"),
                 "scheduler.max_oversample", self.max_oversample,
                 "a finite number >= 1 (1 = no refill; 3 = up to 3 x prompts_per_step tasks a step)")
        _require(not (self.partial_rollouts and self.refills), "scheduler.partial_rollouts", self.partial_rollouts,
                 "false with scheduler.max_oversample > 1 (the refill's rounds need each step's own groups; partial "
                 "rollouts train on whichever groups complete first)")

    @property
    def max_tasks(self) -> int:
        """The most tasks one step may roll out: ``floor(max_oversample * prompts_per_step)``, at least one step's."""
        return max(self.prompts_per_step, int(self.max_oversample * self.prompts_per_step + 1e-9))

    @property
    def refills(self) -> bool:
        """Whether a step may roll out more tasks than `prompts_per_step` (``max_oversample`` allows one more)."""
        return self.max_tasks > self.prompts_per_step

    def refill_seed(self, step: int, j: int) -> int:
        """The task seed (before ``env.seed_offset``) of the `j`-th extra task of step `step`.

        ``REFILL_SEED_BASE + step * (max_tasks - prompts_per_step) + j``: each step owns a range of its own, apart
        from every step's first draw (``step * prompts_per_step + i``, unchanged), so the extra tasks are a function
        of the step alone and a resumed run replays the same ones without any state in the checkpoint (a counter
        there would have to be saved and restored exactly, and a restart from an older checkpoint would have to roll
        it back). The range moves if `max_oversample` or `prompts_per_step` changes between a run and its resume.
        """
        if not 0 <= j < self.max_tasks - self.prompts_per_step:
            raise ValueError(f"step {step} has {self.max_tasks - self.prompts_per_step} extra task seeds, not {j + 1}")
        return REFILL_SEED_BASE + step * (self.max_tasks - self.prompts_per_step) + j


REFILL_SEED_BASE = 500_000
"""Extra task seeds of dynamic sampling's refill start here (plus ``env.seed_offset``; `SchedulerConfig.refill_seed`):
past every first draw of a run of up to 500,000 / prompts_per_step steps, below the held-out seeds."""
HELD_OUT_SEED_START = 1_000_000
"""Evaluation's default held-out task seeds start here (`agentrl.recipes.eval_config.EVAL_SEED_OFFSET`): no training
seed may reach it."""


@dataclass
class CurriculumConfig:
    """Which tasks each step plays: a task-sampling policy chosen by name, and its options.

    See `agentrl.curriculum`. Its state is saved in the checkpoint, so a resume continues it.
    """

    policy: str = "uniform"
    """uniform (every step new tasks in seed order), success (the env's levels, or a pool of tasks, whose recent group
    success is mixed, so groups keep a learning signal), difficulty (the env's levels easiest first, one up when the
    success at the current one passes a threshold) or horizon (max turns per episode growing by a step schedule, as
    ScalingInter-RL). Levels are the env's own (math: its levels; ALFWorld, GUI: task types; code: its levels)."""
    options: dict[str, Any] = field(default_factory=dict)
    """The policy's own options, e.g. ``{band: [0.2, 0.8]}`` or ``{over: task, tasks: 64}`` for success,
    ``{threshold: 0.7, review: 0.2}`` for difficulty, ``{schedule: [[0, 10], [100, 25], [200, 50]]}`` for horizon
    (each policy declares and checks its names and types); what is left out takes the policy's default."""

    def typed_options(self) -> Any:
        """The policy's frozen options dataclass: `options` over its defaults (e.g. `SuccessOptions`)."""
        from agentrl.curriculum import curriculum_options

        return curriculum_options(self.policy, **self.options)

    def __post_init__(self) -> None:
        from agentrl.curriculum import CURRICULA

        _require(self.policy in CURRICULA, "curriculum.policy", self.policy, f"one of {', '.join(CURRICULA)}")
        try:  # the policy owns its option names and values: build them once now rather than fail at step 0
            self.typed_options()
        except (TypeError, ValueError) as e:
            raise ConfigError(f"curriculum.options: {e}") from None


@dataclass(frozen=True)
class ContextConfig:
    """How every turn's prompt is built, one definition for `agentrl run`, `agentrl sft` and `agentrl eval`.

    It is saved in the run's config.yaml, and `agentrl eval --model RUN/checkpoint` rebuilds the prompts the policy
    trained on from it.
    """

    observation_role: str = "auto"
    """Role of observations after the first: ``user``, ``tool`` (Qwen3 then keeps reasoning across turns, so the
    token prefix holds and turns merge into one sample), or ``auto``: the env's hint (`rollout_defaults`) where the
    model's template needs it to keep the prefix, else ``user`` (see `agentrl.chat.layout`). A run saves the
    role it resolved to in config.yaml."""
    recap_actions: int = 0
    """When > 0, every observation after the first repeats the goal and the last k actions (small models lose focus)."""
    chat_family: str = ""
    """Chat-template family to render with (`agentrl.chat.families.FAMILIES`: qwen3, deepseek-r1, gpt-oss, ...);
    empty detects it from the tokenizer, falling back to the tokenizer's own template."""
    max_new_tokens_by_turn: tuple[int, ...] = ()
    """Per-turn generation budgets (turn i uses entry min(i, len-1)); empty uses `sampling.max_new_tokens` for every
    turn."""
    max_context_tokens: int = 4096
    """An episode whose prompt would grow past this is truncated."""
    enable_thinking: bool | None = None
    """For thinking-model templates (Qwen3): force thinking on or off; None keeps the template default."""
    history: str = "template"
    """How earlier turns appear in later prompts: ``template`` renders them as the official template does (Qwen3
    with thinking off drops each earlier turn's empty ``<think></think>``, so every turn becomes its own training
    sample: ~21x the trainer's tokens at 50 turns), ``as_sampled`` keeps them token for token as sampled and renders
    only the new messages (one sample per episode; prompts then depart from the official rendering of history)."""

    def __post_init__(self) -> None:
        _require(self.observation_role in (*OBSERVATION_ROLES, "auto"), "context.observation_role",
                 self.observation_role, f"one of {', '.join(OBSERVATION_ROLES)}, or auto (the env's hint)")
        _require(self.recap_actions >= 0, "context.recap_actions", self.recap_actions, ">= 0")
        _require(self.history in ("template", "as_sampled"), "context.history", self.history,
                 "template (the official rendering) or as_sampled (earlier turns as the model sampled them)")
        _require(all(isinstance(b, int) and b >= 1 for b in self.max_new_tokens_by_turn),
                 "context.max_new_tokens_by_turn", list(self.max_new_tokens_by_turn), "a list of integers >= 1")
        _require(self.max_context_tokens >= 1, "context.max_context_tokens", self.max_context_tokens, ">= 1")
        if self.chat_family:
            families, aliases = chat_family_names()
            _require(self.chat_family in (*families, *aliases), "context.chat_family", self.chat_family,
                     f"empty (detect it) or one of {', '.join(families)}")

    def chat_kwargs(self) -> dict[str, Any]:
        """Chat-template variables (``enable_thinking`` when set)."""
        return {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}

    def rollout_kwargs(self, family_hint: str | None) -> dict[str, Any]:
        """The keyword arguments `agentrl.rollout.loop.run_rollout` takes for this context.

        Args:
            family_hint: the loaded model's family (`LoadedModel.family`), tried first when detecting the template.
        """
        return {
            "chat_kwargs": self.chat_kwargs(),
            "context_options": {"family": self.chat_family or None, "family_hint": family_hint,
                                "observation_role": self.observation_role, "recap_actions": self.recap_actions,
                                "history": self.history},
            "max_new_tokens_by_turn": self.max_new_tokens_by_turn,
        }


@dataclass
class LoraConfig:
    """LoRA adapters (peft): the base weights stay frozen and only low-rank adapters train (rank 0 = off).

    AdamW's state, the gradients, the weight sync to the engines and the checkpoints shrink to the adapters
    (`agentrl.training.lora`).
    """

    rank: int = 0
    """Rank of every adapter (``--trainer.lora.rank 16``); 0 trains every weight (full fine-tuning)."""
    alpha: float = 0.0
    """Scaling numerator: the update is ``alpha / rank * B A``; 0 uses twice the rank (a scale of 2 at any rank)."""
    dropout: float = 0.0
    """Dropout on the adapters' input while training. The engines sample without it, so above 0 the trainer's
    log-probs depart from the engine's (it shows in the train-inference KL): keep 0 for RL."""
    target_modules: tuple[str, ...] = ("all-linear",)
    """Module names that get adapters (peft's matching: ``q_proj``, ``v_proj``, ...), or ``all-linear``: every linear
    layer of the blocks (the LM head excluded)."""
    save_merged: bool = True
    """Checkpoints also write the merged model (base + adapter, Hugging Face format: any tool loads it); off, they
    hold the adapter alone and loading one merges it into the base model named in adapter_config.json."""

    @property
    def enabled(self) -> bool:
        """True when adapters train (rank > 0)."""
        return self.rank > 0

    @property
    def scale_alpha(self) -> float:
        """The alpha used: `alpha`, or twice the rank when it is 0."""
        return self.alpha or 2.0 * self.rank

    def __post_init__(self) -> None:
        _require(self.rank >= 0, "trainer.lora.rank", self.rank, ">= 0 (0 = off: full fine-tuning)")
        _require(self.alpha >= 0, "trainer.lora.alpha", self.alpha, ">= 0 (0 = twice the rank)")
        _require(0 <= self.dropout < 1, "trainer.lora.dropout", self.dropout, "in [0, 1)")
        _require(len(self.target_modules) >= 1 and all(isinstance(m, str) and m for m in self.target_modules),
                 "trainer.lora.target_modules", list(self.target_modules),
                 "a list of module names (e.g. [q_proj, v_proj]) or [all-linear]")


@dataclass
class TrainerConfig:
    """Where and how the policy trains, and in how much memory (see `agentrl.training`)."""

    workers: int = 0
    """FSDP2 trainer workers on Ray (``--trainers``); 0 trains in the driver process (one CPU machine)."""
    gpus_per_worker: float = 0.0
    """GPUs each trainer worker owns (``--gpus-per-trainer``; 0 = train on CPU with gloo, else NCCL)."""
    dtype: str = "float32"
    """Training precision of weights, gradients and AdamW state (float32 on CPU)."""
    compute_dtype: str = "auto"
    """What the forward and backward compute in (``--compute-dtype``): ``auto`` (bfloat16 where the hardware
    multiplies it natively: CPUs with AVX512-BF16 or AMX, CUDA GPUs; float32 elsewhere, the run plan says which and
    why), ``bfloat16`` or ``float32`` (exactly the float32 training of earlier versions). With bfloat16 and a float32
    `dtype`, float32 master weights keep the weights, gradients and AdamW state, so small updates are not rounded away
    (`agentrl.training.precision`); FSDP workers get the same from FSDP2's mixed-precision policy."""
    reduce_dtype: str = ""
    """FSDP workers: dtype gradients are reduced in (empty: float32 when computing in bfloat16, else `dtype`)."""
    micro_batch_tokens: int = 8192
    """Tokens per forward/backward pass, the memory knob: real tokens with `packing`, else padded ones (sequences x
    longest). Samples are grouped longest first; one longer than the budget gets a pass of its own. The gradient does
    not depend on it."""
    micro_batch_size: int = 0
    """Optional cap on sequences per forward/backward pass (0 = only the token budget counts)."""
    packing: bool = True
    """Padding-free micro-batches (``--trainer.no-packing`` turns them off): each pass runs its samples back to back
    in one row, with attention confined to each sample and position ids restarting per sample, so no padding is
    computed (log-probs and gradients equal the padded pass within float32 rounding; see
    `agentrl.training.packing`). Families that cannot pack exactly (sliding windows, attention sinks) run padded."""
    gradient_checkpointing: str = "auto"
    """Recompute each block's activations in the backward: ``on``, ``off``, or ``auto`` (on when the step's
    estimated peak memory would not fit otherwise; see `agentrl.training.memory`)."""
    memory_limit_gb: float = 0.0
    """Memory the training step may use; 0 = the memory available when the run starts. A config whose estimated
    peak exceeds it fails before the first rollout, naming the setting to change."""
    ray_resource: str = ""
    """A Ray custom resource that places the trainer workers (empty: anywhere): each asks 0.01 of it, so they start
    only on nodes started with ``ray start --resources '{"NAME": 1}'``."""
    max_restarts: int = 2
    """Times a run restarts its trainer workers after one dies (killed, OOM, its node lost): the run goes back to its
    last checkpoint (weights, optimizer state, step; none yet: step 0) as ``--resume`` would and redoes the steps after
    it, rollouts included. Past this many, or for an error raised inside a worker, it stops with the resume command.
    0 stops at the first death."""
    return_freed_memory: str = "auto"
    """Give freed tensors back to the OS at once (pin the C library's mmap threshold at 1 MiB, glibc only): ``on``,
    ``off``, or ``auto`` (on when the memory plan turns gradient checkpointing on). glibc otherwise keeps what a step
    frees, and resident memory outgrows the plan (LoRA on a 360M model with checkpointing: 6.1 GiB against 3.4
    planned; 3.1 GiB pinned), at a price: steps 1.14-1.31x slower. See `agentrl.training.allocator`."""
    lora: LoraConfig = field(default_factory=LoraConfig)

    def __post_init__(self) -> None:
        _require(self.workers >= 0, "trainer.workers", self.workers, ">= 0 (0 trains in the driver)")
        _require(self.gpus_per_worker >= 0, "trainer.gpus_per_worker", self.gpus_per_worker, ">= 0")
        _require(self.dtype in DTYPES, "trainer.dtype", self.dtype, f"one of {', '.join(DTYPES)}")
        _require(self.reduce_dtype in ("", *DTYPES), "trainer.reduce_dtype", self.reduce_dtype,
                 f"empty or one of {', '.join(DTYPES)}")
        _require(self.compute_dtype in ("", *COMPUTE_DTYPES), "trainer.compute_dtype", self.compute_dtype,
                 f"one of {', '.join(COMPUTE_DTYPES)}")
        _require(self.workers > 0 or self.gpus_per_worker == 0, "trainer.gpus_per_worker", self.gpus_per_worker,
                 "0 when trainer.workers is 0 (the driver trains on CPU); set --trainers N to train on GPUs")
        _require(self.micro_batch_tokens >= 1, "trainer.micro_batch_tokens", self.micro_batch_tokens, ">= 1")
        _require(self.micro_batch_size >= 0, "trainer.micro_batch_size", self.micro_batch_size, ">= 0 (0 = no cap)")
        _require(self.gradient_checkpointing in ("on", "off", "auto"), "trainer.gradient_checkpointing",
                 self.gradient_checkpointing, "on, off or auto")
        _require(self.memory_limit_gb >= 0, "trainer.memory_limit_gb", self.memory_limit_gb, ">= 0 (0 = available)")
        _require(self.max_restarts >= 0, "trainer.max_restarts", self.max_restarts, ">= 0 (0 = never restart)")
        _require(self.return_freed_memory in ("on", "off", "auto"), "trainer.return_freed_memory",
                 self.return_freed_memory, "on, off or auto")


@dataclass
class OptimConfig:
    """AdamW, and how many optimizer steps each rollout batch feeds."""

    lr: float = 2e-5
    """Learning rate."""
    weight_decay: float = 0.0
    """Decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam betas."""
    grad_clip: float = 1.0
    """Max global gradient norm (0 = off)."""
    n_minibatches: int = 1
    """Optimizer updates per rollout batch (1 = on-policy; >1 makes later updates off-policy)."""

    def __post_init__(self) -> None:
        _require(self.lr > 0, "optim.lr", self.lr, "> 0")
        _require(self.weight_decay >= 0, "optim.weight_decay", self.weight_decay, ">= 0")
        _require(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "optim.betas", list(self.betas),
                 "two numbers in [0, 1), e.g. [0.9, 0.999]")
        _require(self.grad_clip >= 0, "optim.grad_clip", self.grad_clip, ">= 0 (0 = off)")
        _require(self.n_minibatches >= 1, "optim.n_minibatches", self.n_minibatches, ">= 1")


OVERLONG_MODES: tuple[str, ...] = ("none", "filter", "penalize")
"""`OverlongConfig.mode` values (`agentrl.objective.overlong`)."""


@dataclass(frozen=True)
class OverlongConfig:
    """DAPO's overlong treatment of episodes with a reply cut at its per-turn token budget.

    The run config's ``loss.overlong`` section (`LossConfig`), one definition, read by
    `agentrl.objective.overlong.apply_overlong`: each field is also a flag (``--loss.overlong.mode``). Left at None,
    `max_length` is the run's largest per-turn token budget, which the trainer fills in (`dataclasses.replace`)
    before it calls `apply_overlong`. Kept here rather than in the objective so that reading a config needs no torch.
    """

    mode: str = "none"
    """``filter`` leaves them out of the loss; ``penalize`` subtracts a penalty that ramps over the last
    `cache_length` tokens of the per-turn budget; ``none``: neither."""
    max_length: int | None = None
    """The response length budget L_max the penalty counts to; None: the run's largest per-turn token budget."""
    cache_length: int = 4096
    """Penalize: the soft band L_cache before the budget where the penalty ramps up (DAPO: 4096 of 20480); at most
    the budget."""
    penalty_factor: float = 1.0
    """Penalize: the penalty at and beyond the budget."""

    def __post_init__(self) -> None:
        if self.mode not in OVERLONG_MODES:
            raise ValueError(f"unknown overlong mode {self.mode!r}; choose one of {', '.join(OVERLONG_MODES)}")
        if self.cache_length < 1:
            raise ValueError(f"overlong cache_length must be >= 1, got {self.cache_length}")
        if self.max_length is not None and self.max_length < 1:
            raise ValueError(f"overlong max_length must be >= 1, or empty for the per-turn token budget; "
                             f"got {self.max_length}")
        if self.mode == "penalize" and self.max_length is not None and self.cache_length > self.max_length:
            raise ValueError(f"cache_length must be in (0, max_length]; got {self.cache_length}")


@dataclass
class LossConfig:
    """The policy objective (see `agentrl.objective`)."""

    name: str = "minirl"
    """A registered policy loss: minirl, grpo, dapo, gspo, cispo, dr_grpo, reinforce."""
    options: dict[str, Any] = field(default_factory=dict)
    """The loss's own options (is_cap, eps_low, eps_high, correction, agg, ...; each loss owns and checks its names);
    defaults are the loss's own."""
    bypass: bool = False
    """Bypass mode: pi_old = mu, the rollout's own log-probs; the recompute pass is skipped (strictly on-policy runs:
    the importance ratio is then 1 and the clip acts on pi_theta / mu; kl_k3 reads 0)."""
    old_policy_pass: str = "auto"
    """The pi_old recompute pass: ``auto`` skips it when the update's own forward gives exactly pi_old (one
    mini-batch per rollout, so the weights are not updated before the loss reads them, and no Routing Replay
    strategy that reads the pass): the update's log-probs, detached, stand for pi_old and it reports the entropy.
    The same loss and gradient for a forward pass less (1.19x per step in bench/micro/trainer_step_passes.py).
    ``on``: always recompute."""
    kl_reward_coef: float = 0.0
    """KL(pi_old || pi_ref) as a reward penalty: R -= coef * sum_t k(log pi_old, log pi_ref) (0: off). A frozen copy
    of `model` is loaded as the reference only when this or ``options.kl_coef`` is > 0."""
    kl_reward_estimator: str = "k1"
    """Estimator of the reward penalty: k1, k2 or k3."""
    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: leave out groups whose episodes all got the same reward (zero advantage: they only
    dilute the batch); with `scheduler.max_oversample` > 1 the step also rolls out more tasks to make up for them."""
    routing_replay: str = "none"
    """MoE Routing Replay: ``none``, ``r2`` (replay the training router's pi_old choices in the updates) or ``r3``
    (replay the experts the inference engine chose at rollout, in the pi_old pass and the updates). Under r2 / r3,
    ``router_agreement_live_vs_replayed`` in metrics.jsonl is how often the update passes' live router chose the
    replayed experts (`agentrl.training.routing_replay`)."""
    per_turn_samples: bool = False
    """One training sample per turn instead of merging turns while the token prefix holds."""

    def __post_init__(self) -> None:
        from agentrl.objective import KL_ESTIMATORS, loss_options

        try:  # the loss owns its option names and values: build them once now rather than fail at step 0
            loss_options(self.name, **self.options)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"loss: {e}") from None
        _require(self.kl_reward_coef >= 0, "loss.kl_reward_coef", self.kl_reward_coef, ">= 0 (0 = off)")
        _require(self.kl_reward_estimator in KL_ESTIMATORS, "loss.kl_reward_estimator", self.kl_reward_estimator,
                 f"one of {', '.join(KL_ESTIMATORS)}")
        _require(self.routing_replay in ROUTING_REPLAY_MODES, "loss.routing_replay", self.routing_replay,
                 f"one of {', '.join(ROUTING_REPLAY_MODES)}")
        _require(self.old_policy_pass in ("auto", "on"), "loss.old_policy_pass", self.old_policy_pass, "auto or on")
        _require(not (self.bypass and self.routing_replay == "r2"), "loss.bypass", self.bypass,
                 "false with routing_replay r2 (R2 replays the experts the pi_old pass records; bypass skips it)")


@dataclass
class AdvantageConfig:
    """The advantage estimator and its options (see `agentrl.objective.advantages`)."""

    estimator: str = "group_mean"
    """group_mean (MiniRL), grpo, loo, low_success_weight, passk, or gigpo (step-level advantages from anchor states
    shared across the episodes of a task; multi-turn envs). A group of one response gets advantage 0."""
    options: dict[str, Any] = field(default_factory=dict)
    """The estimator's own options, e.g. ``{gamma: 0.9}`` for gigpo or ``{k: 8}`` for passk (each estimator declares
    and checks its names and types); what is left out takes the estimator's default."""

    def typed_options(self) -> Any:
        """The estimator's frozen options dataclass: `options` over its defaults (e.g. `GiGPOOptions`)."""
        from agentrl.objective import advantage_options

        return advantage_options(self.estimator, **self.options)

    def __post_init__(self) -> None:
        from agentrl.objective import ADVANTAGES

        _require(self.estimator in ADVANTAGES, "advantage.estimator", self.estimator,
                 f"one of {', '.join(ADVANTAGES)}")
        try:  # the estimator owns its option names and values: build them once now rather than fail at step 0
            self.typed_options()
        except (TypeError, ValueError) as e:
            raise ConfigError(f"advantage.options: {e}") from None


@dataclass
class GuardConfig:
    """Collapse guard: stop (or roll back) when the run degenerates."""

    enabled: bool = True
    """Watch entropy and the train-inference KL each step (and the opt-in signals below that are set)."""
    entropy_min: float = 0.05
    """Entropy (mean per token) below this counts as a bad step. Learning sharpens the policy too: the main job
    (SmolLM2 on arithmetic) sits at 0.21 with reward 0.59 after 18 steps, and a 0.25 floor stopped it there; a
    collapsed policy is near 0."""
    k3_max: float = 0.01
    """KL(mu||pi_old) k3 estimate above this counts as a bad step."""
    patience: int = 3
    """Consecutive bad steps before acting."""
    action: str = "stop"
    """``stop`` or ``rollback`` (to the last good checkpoint)."""
    grad_norm_max: float = 0.0
    """A step whose pre-clip gradient norm is above this counts as a bad step; 0 = off. The norm is ``grad_norm`` in
    metrics.jsonl (the mean over the step's mini-batch updates, before ``optim.grad_clip``; NaN when none was finite,
    which counts as bad). It sees the update itself blow up, which an off-policy collapse shows before the entropy or
    the fresh-sample KL moves: a pilot of the main job at lr 2e-4, ``sync_every 8``, 4 mini-batches and no IS
    correction read 62, 674, 48 and 2910 on its first four steps and reached success 0 at step 8, while its entropy
    stayed above the floor and its fresh KL read 0.001. Off by default because a healthy norm depends on the model,
    the loss, its aggregation and the batch (the shipped main job reads about 10-40), so no one number fits
    every run, and clipping already bounds the step a large norm takes; set it to a few times a healthy run's peak."""
    length_cut_max: float = 0.0
    """A step where the share of episodes with a reply cut at the per-turn token limit is above this counts as a bad
    step; 0 = off. The share is ``length_cut_frac`` in metrics.jsonl (an episode counts when one of its replies
    stopped at ``sampling.max_new_tokens`` or its turn's budget). A collapsing policy often rambles until every reply
    hits the limit (the off-policy pilot above: every reply cut at 64 tokens by step 8). Off by default because the
    share starts high for a base model that has not learned the answer format yet (the main job: 0.34-0.56 at step
    0, near 0 by step 15) and depends on the budget the env is given; 0.9 leaves that start alone."""
    success_drop: float = 0.0
    """A step counts as bad when the train success rate's 3-step moving mean falls below ``1 - success_drop`` times
    the best such mean so far (once that best is above 0); 0 = off, else in (0, 1). It reads ``success_rate`` in
    metrics.jsonl, the outcome every other signal stands in for, so it catches a collapse whatever its cause, but
    only once the reward has already fallen (the pilot above: 0.16 to 0.00 by step 8). Off by default because
    train success is noisy at a few dozen episodes a step (the main job's moves by up to 0.4 from one step to
    the next) and a curriculum or a harder task mix lowers it on purpose; 0.5 (half the best) is a cautious start. The
    window and the best restart with the run on ``--resume`` (they are not in the checkpoint)."""

    def __post_init__(self) -> None:
        from agentrl.objective.collapse_guard import GUARD_ACTIONS

        _require(self.action in GUARD_ACTIONS, "guard.action", self.action, f"one of {', '.join(GUARD_ACTIONS)}")
        _require(self.patience >= 1, "guard.patience", self.patience, ">= 1")
        _require(self.grad_norm_max >= 0, "guard.grad_norm_max", self.grad_norm_max, ">= 0 (0 = off)")
        _require(0 <= self.length_cut_max < 1, "guard.length_cut_max", self.length_cut_max,
                 "in [0, 1) (a share of episodes; 0 = off)")
        _require(0 <= self.success_drop < 1, "guard.success_drop", self.success_drop,
                 "in [0, 1) (a fraction of the best success; 0 = off)")


@dataclass
class LogConfig:
    """Experiment trackers a run also logs to, besides metrics.jsonl and curves.png (see `agentrl.trackers`)."""

    trackers: tuple[str, ...] = ()
    """Trackers to log to as well: wandb, mlflow, tensorboard, trackio (several: ``--log wandb --log mlflow`` or
    ``--log wandb,mlflow``). Each writes under the run folder and stays offline unless its own environment variable
    names a server (``WANDB_MODE=online``, ``MLFLOW_TRACKING_URI``, ``TRACKIO_SPACE_ID``); one not installed is said
    in one line and the run goes on."""
    project: str = "agentrl"
    """The W&B / Trackio project or MLflow experiment the run is logged under."""
    run_name: str = ""
    """The run's name in the trackers; empty: the run folder's name."""
    table_episodes: int = 8
    """Episodes per step in the trackers' trajectory table, one group after another (0 = no table)."""

    def __post_init__(self) -> None:
        from agentrl.trackers.registry import TRACKERS, tracker_names

        self.trackers = tracker_names(self.trackers)  # "wandb,mlflow" in one entry is two trackers
        unknown = [name for name in self.trackers if name not in TRACKERS]
        _require(not unknown, "log.trackers", unknown[0] if unknown else "", f"one of {', '.join(TRACKERS)}")
        _require(bool(self.project.strip()), "log.project", self.project, "a non-empty name")
        _require(self.table_episodes >= 0, "log.table_episodes", self.table_episodes, ">= 0 (0 = no table)")


@dataclass
class AgentConfig:
    """Agents written against the OpenAI API as the rollout (``--agent``; see `agentrl.rollout.agents`)."""

    function: str = ""
    """``package.module:function`` or ``path/to/file.py:function``, called as ``run(task, base_url)`` per episode
    (plain or async) and returning the reward (or None: the env's rewards from ``task.step``); empty: the built-in
    agent loop."""
    concurrency: int = 8
    """Agent sessions running at once."""
    timeout: float = 300.0
    """Seconds one agent session may run before it counts as failed (and its session is closed)."""
    dataset: str = ""
    """A JSONL file whose rows are the tasks (``task.row``; ``prompt`` / ``system`` keys fill ``task.prompt`` /
    ``task.system_prompt``) instead of the env's; the agent returns the reward."""

    def __post_init__(self) -> None:
        _require(self.concurrency >= 1, "agent.concurrency", self.concurrency, ">= 1")
        _require(self.timeout > 0, "agent.timeout", self.timeout, "> 0 seconds")
        _require(not self.dataset or bool(self.function), "agent.dataset", self.dataset,
                 "empty unless agent.function is set (dataset rows are tasks for an agent function)")


RUBRIC_FIELDS: tuple[str, ...] = ("task", "transcript", "rule_reward", "scale_min", "scale_max")
"""The placeholders a judge's rubric template may use, as ``{name}`` (`agentrl.rewards.judge.render_prompt`)."""


def check_rubric(text: str, key: str) -> None:
    """Refuse a rubric template with an unknown ``{placeholder}`` or without ``{transcript}``.

    Braces that do not hold a bare name (``{"score": 7}`` in an example) are left alone: only ``{identifier}`` is a
    placeholder, so a typo such as ``{transcrpt}`` is caught rather than sent to the judge verbatim.

    Raises:
        ConfigError: naming `key` (the field the template came from), the placeholder and the valid ones.
    """
    import re

    names = re.findall(r"\{([A-Za-z_]\w*)\}", text)
    unknown = [name for name in names if name not in RUBRIC_FIELDS]
    _require(not unknown, key, f"{{{unknown[0]}}}" if unknown else "",
             f"a template whose placeholders are among {', '.join('{' + n + '}' for n in RUBRIC_FIELDS)}")
    _require("transcript" in names, key, text[:60] + ("..." if len(text) > 60 else ""),
             "a template that holds {transcript} (the judge must see the episode it scores)")


@dataclass(frozen=True)
class JudgeConfig:
    """A judge model that scores each finished episode through an OpenAI-compatible endpoint (off by default).

    Read by `agentrl.rewards.judge.JudgeReward`: each episode's task and transcript (and its rule reward) fill a
    rubric template, the judge's reply must end with one ``SCORE: <number>`` line on the stated `scale`, and the
    score, mapped to [0, 1], is combined with the env's rule reward (`RewardConfig`). An episode whose score could
    not be obtained (timeouts, an unreachable endpoint, a reply without a score, past the budget, after the retries)
    is never scored 0: its group is dropped and counted (``judge_failures``), as an env failure is. The weights and
    gate that combine the score with the rule reward are `RewardConfig`'s.
    """

    endpoint: str = ""
    """The OpenAI-compatible base URL, e.g. ``http://127.0.0.1:8000/v1`` (``agentrl serve``, vLLM, a hosted API);
    ``/chat/completions`` is appended. Empty: no judge, the env's rule reward alone."""
    model: str = ""
    """The ``model`` each request names (a served model's name, as ``/v1/models`` lists it)."""
    rubric: str = ""
    """The rubric template, inline: placeholders ``{task}``, ``{transcript}`` (required), ``{rule_reward}``,
    ``{scale_min}``, ``{scale_max}``; it must ask for a last line ``SCORE: <number>``. Empty (with `rubric_file`
    empty too): the built-in rubric (`agentrl.rewards.judge.DEFAULT_RUBRIC`)."""
    rubric_file: str = ""
    """The rubric template read from this file instead of `rubric` (one of the two)."""
    scale: tuple[float, float] = (0.0, 10.0)
    """The lowest and highest score the rubric asks for; a score is mapped to [0, 1] linearly, and one outside the
    scale is a failed reply."""
    temperature: float = 0.0
    """The judge's sampling temperature (0: its most likely verdict, so the cache is also what a second call says)."""
    max_reply_tokens: int = 512
    """The ``max_tokens`` of each request: room for the judge's reasoning and its SCORE line."""
    timeout: float = 60.0
    """Seconds each phase of a call may take (connecting; waiting for the reply): past it the call failed."""
    retries: int = 3
    """Calls after a failed one (timeout, unreachable, HTTP 408/429/5xx, a reply without a parsable score) before
    the episode counts as failed; other HTTP errors (401, 404) are not retried."""
    backoff: float = 1.0
    """Seconds before the first retry, doubled before each later one."""
    budget_calls: int = 0
    """The most HTTP calls to the judge in the whole run (retries count; cache hits are free; a resume continues the
    count): a call past it is not made, and its episode counts as failed (``judge_over_budget``). 0: no limit."""
    budget_tokens: int = 0
    """The most tokens (prompt + reply, as the endpoint's ``usage`` says, else characters / 4) in the whole run;
    once spent, no further call is made. 0: no limit."""
    concurrency: int = 4
    """Judge calls in flight at once (the rollout goes on meanwhile)."""
    api_key_env: str = ""
    """The environment variable that holds the endpoint's API key, sent as ``Authorization: Bearer``; empty: none.
    (The key itself never goes in a config: config.yaml is saved with the run.)"""

    @property
    def enabled(self) -> bool:
        """True when an endpoint is set."""
        return bool(self.endpoint)

    def __post_init__(self) -> None:
        if not self.endpoint:
            _require(not (self.model or self.rubric or self.rubric_file), "reward.judge.endpoint", self.endpoint,
                     "set (e.g. http://127.0.0.1:8000/v1) when reward.judge.model or a rubric is set")
            return
        _check_base_url(self.endpoint, "reward.judge.endpoint")
        _require(bool(self.model.strip()), "reward.judge.model", self.model,
                 "the model name the endpoint serves (its /v1/models lists it)")
        _require(not (self.rubric and self.rubric_file), "reward.judge.rubric_file", self.rubric_file,
                 "empty when reward.judge.rubric is set (give the rubric inline or in a file, not both)")
        if self.rubric:
            check_rubric(self.rubric, "reward.judge.rubric")
        _require(len(self.scale) == 2 and all(map(_finite, self.scale)) and self.scale[0] < self.scale[1],
                 "reward.judge.scale", list(self.scale), "two finite numbers, lowest first, e.g. [0, 10]")
        _require(_finite(self.temperature) and self.temperature >= 0, "reward.judge.temperature", self.temperature,
                 ">= 0")
        _require(self.max_reply_tokens >= 1, "reward.judge.max_reply_tokens", self.max_reply_tokens, ">= 1")
        _require(_finite(self.timeout) and self.timeout > 0, "reward.judge.timeout", self.timeout, "> 0 seconds")
        _require(self.retries >= 0, "reward.judge.retries", self.retries, ">= 0")
        _require(_finite(self.backoff) and self.backoff >= 0, "reward.judge.backoff", self.backoff, ">= 0 seconds")
        _require(self.budget_calls >= 0, "reward.judge.budget_calls", self.budget_calls, ">= 0 (0 = no limit)")
        _require(self.budget_tokens >= 0, "reward.judge.budget_tokens", self.budget_tokens, ">= 0 (0 = no limit)")
        _require(self.concurrency >= 1, "reward.judge.concurrency", self.concurrency, ">= 1")


@dataclass(frozen=True)
class RewardConfig:
    """Where each episode's reward comes from: the env's rules, and optionally a judge model combined with them.

    With a judge (``reward.judge.endpoint``): reward = ``rule_weight`` x rule + ``judge_weight`` x judge, where rule is
    the env's reward and judge the judge's score mapped to [0, 1] (`agentrl.rewards.combine`). With a `gate`, only
    episodes whose rule reward is at least the gate go to the judge; the others get ``below_gate`` as their judge term
    (a declared value, never a failed call scored 0). Without a judge the rule reward is the reward.
    """

    judge: JudgeConfig = field(default_factory=JudgeConfig)
    rule_weight: float = 1.0
    """With a judge: the weight of the env's rule reward (the sum of its turns' rewards)."""
    judge_weight: float = 1.0
    """With a judge: the weight of its score on [0, 1]."""
    gate: float | None = None
    """With a judge: send only episodes whose rule reward is >= this to it (e.g. 1: judge only the solved ones);
    None: every episode."""
    below_gate: float = 0.0
    """With a gate: the judge term (on [0, 1]) of an episode below it, which is never sent to the judge."""

    def __post_init__(self) -> None:
        for name in ("rule_weight", "judge_weight"):
            value = getattr(self, name)
            _require(_finite(value) and value >= 0, f"reward.{name}", value, "a finite number >= 0")
        _require(self.rule_weight + self.judge_weight > 0, "reward.judge_weight", self.judge_weight,
                 "> 0 when reward.rule_weight is 0 (some reward must count)")
        _require(self.gate is None or _finite(self.gate), "reward.gate", self.gate,
                 "a finite number (the least rule reward the judge sees), or empty for no gate")
        _require(_finite(self.below_gate) and 0 <= self.below_gate <= 1, "reward.below_gate", self.below_gate,
                 "in [0, 1] (a judge term, as the judge's mapped score is)")
        combined = (self.rule_weight, self.judge_weight, self.gate, self.below_gate) != (1.0, 1.0, None, 0.0)
        _require(self.judge.enabled or not combined, "reward.judge.endpoint", self.judge.endpoint,
                 "set when reward.rule_weight, judge_weight, gate or below_gate is (they combine a judge's score "
                 "with the rule reward; without a judge the rule reward is the reward)")


def _finite(value: Any) -> bool:
    """True for an int or float (not a bool) that is neither infinite nor NaN."""
    import math

    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class RunConfig:
    """Everything `agentrl run` needs, one section per owner; `agentrl run --help` lists every field."""

    MOVED: ClassVar[dict[str, str]]
    """Keys of earlier layouts and where they live now (`MOVED_KEYS`, set below it)."""
    RENAMED: ClassVar[dict[str, Renamed]]
    """Keys the current release renamed, still read until a later one (`RENAMED_KEYS`, set below it)."""

    model: str = "smollm2-135m"
    """A built-in (smollm2-135m, tiny-qwen3, tiny-qwen3-moe), a local Hugging Face folder, or a hub id."""
    env: EnvConfig = field(default_factory=EnvConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    runners: RunnersConfig = field(default_factory=RunnersConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    context: ContextConfig = field(default_factory=ContextConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    log: LogConfig = field(default_factory=LogConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    steps: int = 20
    """Training steps (one rollout batch each)."""
    seed: int = 0
    """Seeds torch and the sampler."""
    output: str = ""
    """Run folder: metrics.jsonl, trajectories.jsonl, curves.png, checkpoint/. Empty: a new
    ``runs/<env>-<model>-<date>-<time>`` folder, so no run ever overwrites another by default."""
    save_every: int = 5
    """Checkpoint every N steps (and at the end)."""
    save_trajectories: bool = True
    """Append every step's trajectories to output/trajectories.jsonl."""
    token_values_per_step: int = 2
    """Training samples per step whose per-token values (loss mask, sampler and trainer log-probs, IS weight and
    whether the correction masked or truncated it, advantage, entropy) go to output/token_values.jsonl for
    `agentrl view` (0: none). About 40 bytes a token: 1,000 steps at 2 cost ~20 MB on math (~200-token samples),
    ~230 MB on WebShop (~3k tokens)."""
    screenshots_per_step: int = 2
    """Episodes per step whose env images (``info["image"]``: the GUI env's screenshots, when its ``screenshots``
    setting is on) are saved as ``output/screenshots/ep{N}_turn{T}.png`` for `agentrl view` (N: the episode's line
    in trajectories.jsonl, T: its turn, from 0; the screen after that turn's action). 0, or an env that renders no
    image: none. Needs `save_trajectories`. About 13 KB a screenshot on the phone GUI (fast renderer, 360x800 PNG):
    at 2 episodes of up to 8 turns, at most ~200 KB a step, ~200 MB for 1,000 steps."""
    ray_address: str | None = None
    """Ray cluster to join (``HOST:PORT``, ``auto``, ``ray://host:10001``) for runners, engines and trainer workers;
    None joins the one ``RAY_ADDRESS`` names (``ray job submit`` sets it), else starts a quiet local Ray when the run
    needs one."""

    def __post_init__(self) -> None:
        _require(self.steps >= 1, "steps", self.steps, ">= 1")
        _require(self.save_every >= 1, "save_every", self.save_every, ">= 1")
        _require(self.token_values_per_step >= 0, "token_values_per_step", self.token_values_per_step, ">= 0 (0 = off)")
        _require(self.screenshots_per_step >= 0, "screenshots_per_step", self.screenshots_per_step, ">= 0 (0 = off)")
        _require(self.output == "" or bool(self.output.strip()), "output", self.output,
                 "a folder path (or empty for a new runs/<env>-<model>-<time> folder)")
        _require(not (self.engine.colocate and self.scheduler.async_rollout), "scheduler.async_rollout",
                 self.scheduler.async_rollout, "false with engine.colocate (a colocated engine sleeps while the "
                 "trainers train, so it cannot roll out meanwhile): drop --async, or use the split layout")
        _require(not (self.agent.function and self.scheduler.async_rollout), "scheduler.async_rollout",
                 self.scheduler.async_rollout, "false with --agent (agent rollouts are lockstep): drop --async")
        _require(not (self.agent.function and self.reward.judge.enabled), "reward.judge.endpoint",
                 self.reward.judge.endpoint, "empty with --agent (an agent function returns its own reward)")
        # Mini-batches hold whole groups, and a step has prompts_per_step of them (fewer when groups are dropped).
        _require(self.optim.n_minibatches <= self.scheduler.prompts_per_step, "optim.n_minibatches",
                 self.optim.n_minibatches, f"<= scheduler.prompts_per_step ({self.scheduler.prompts_per_step}): each "
                 f"mini-batch trains on whole groups; lower --optim.n-minibatches or raise "
                 f"--scheduler.prompts-per-step")
        self._check_refill()
        self._check_curriculum()
        from agentrl.objective import ADVANTAGES

        # An estimator that compares k episodes of a group (passk) needs at least k of them
        needed = ADVANTAGES[self.advantage.estimator].min_group_size(self.advantage.typed_options())
        _require(self.scheduler.group_size >= needed, "scheduler.group_size", self.scheduler.group_size,
                 f">= {needed} with advantage.estimator {self.advantage.estimator} (it needs {needed} episodes per "
                 f"group)")
        # A step-level estimator (gigpo) reads each turn's own env reward: a judged episode reward would be ignored.
        _require(not (self.reward.judge.enabled and ADVANTAGES[self.advantage.estimator].level == "step"),
                 "reward.judge.endpoint", self.reward.judge.endpoint,
                 f"empty with advantage.estimator {self.advantage.estimator} (it reads each turn's own env reward, "
                 f"so the judged episode reward would not count): use an episode-level estimator such as grpo")
        # The KL reward penalty and DAPO's overlong penalty change only the episode's total: a step-level estimator,
        # reading each turn's env reward, would train as if they were off.
        step_level = ADVANTAGES[self.advantage.estimator].level == "step"
        _require(not (step_level and self.loss.kl_reward_coef > 0), "loss.kl_reward_coef", self.loss.kl_reward_coef,
                 f"0 with advantage.estimator {self.advantage.estimator} (it reads each turn's own env reward, so the "
                 f"episode-level penalty would not count): use an episode-level estimator such as grpo, or the KL as "
                 f"a loss term (loss.options.kl_coef)")
        _require(not (step_level and self.loss.overlong.mode == "penalize"), "loss.overlong.mode",
                 self.loss.overlong.mode,
                 f"none or filter with advantage.estimator {self.advantage.estimator} (it reads each turn's own env "
                 f"reward, so the episode-level penalty would not count): use an episode-level estimator such as grpo")

    def _check_curriculum(self) -> None:
        """The curriculum against the rest of the run (its env's levels are checked at set-up, where the env loads)."""
        from agentrl.curriculum import HISTORY, CurriculumError, check_run

        C = self.curriculum
        # The checkpoint of step s saves the state after step s, which the async producer may have observed up to
        # max_staleness + 1 steps before: the curriculum keeps the last HISTORY.
        _require(not self.scheduler.async_rollout or self.scheduler.max_staleness < HISTORY, "scheduler.max_staleness",
                 self.scheduler.max_staleness, f"below {HISTORY} in async mode (the curriculum keeps the states of its "
                 f"last {HISTORY} steps, and the checkpoint needs the trainer's)")
        _require(not (self.agent.function and C.policy != "uniform"), "curriculum.policy", C.policy,
                 "uniform with --agent (agent rollouts play the step's tasks in seed order)")
        # A partial-rollout stream draws a step's tasks before the steps ahead of it are observed, so a policy with
        # state would draw by timing, and a resume could not replay it.
        _require(not (self.scheduler.partial_rollouts and C.policy in ("success", "difficulty")), "curriculum.policy",
                 C.policy, "uniform or horizon with scheduler.partial_rollouts (success and difficulty draw from "
                 "outcomes that a partial-rollout stream has not observed yet when it draws)")
        opts = C.typed_options()
        try:
            check_run(C.policy, opts, prompts_per_step=self.scheduler.prompts_per_step, max_turns=self.env.max_turns)
        except CurriculumError as e:
            raise ConfigError(f"curriculum: {e}") from None
        if C.policy == "success" and opts.over == "task":
            _require(self.env.seed_offset + opts.tasks <= HELD_OUT_SEED_START, "curriculum.options.tasks", opts.tasks,
                     f"small enough that the pool (from env.seed_offset {self.env.seed_offset}) stays below the "
                     f"held-out seeds from {HELD_OUT_SEED_START:,}")
            # The refill's extra tasks are new seeds past the pool: the curriculum would neither choose nor learn them.
            _require(not self.scheduler.refills, "scheduler.max_oversample", self.scheduler.max_oversample,
                     "1 with curriculum success over a task pool (options.over: task): the refill's extra tasks are "
                     "new seeds outside the pool, which the curriculum neither draws by its weights nor learns from; "
                     "drop --scheduler.max-oversample, or use over: level")

    def _check_refill(self) -> None:
        """Dynamic sampling's refill: it needs the filter, the built-in agent loop, and seeds short of the held-out."""
        S = self.scheduler
        if not S.refills:
            return
        _require(self.loss.dynamic_sampling, "scheduler.max_oversample", S.max_oversample,
                 "1 without loss.dynamic_sampling (the refill looks for groups with mixed rewards, which only dynamic "
                 "sampling trains apart): add --loss.dynamic-sampling, or drop --scheduler.max-oversample")
        _require(not self.agent.function, "scheduler.max_oversample", S.max_oversample,
                 "1 with --agent (agent rollouts do not refill)")
        first_end = self.env.seed_offset + self.steps * S.prompts_per_step
        extra_end = self.env.seed_offset + S.refill_seed(self.steps - 1, S.max_tasks - S.prompts_per_step - 1) + 1
        _require(first_end <= self.env.seed_offset + REFILL_SEED_BASE and extra_end <= HELD_OUT_SEED_START,
                 "scheduler.max_oversample", S.max_oversample,
                 f"small enough that {self.steps} steps' extra task seeds (from env.seed_offset + {REFILL_SEED_BASE:,}"
                 f", up to {extra_end - 1:,}) stay apart from the first draws (up to {first_end - 1:,}) and below the "
                 f"held-out seeds from {HELD_OUT_SEED_START:,}: fewer steps, a smaller max_oversample or "
                 f"prompts_per_step, or a smaller env.seed_offset")


MOVED_KEYS: dict[str, str] = {
    "rollout.prompts_per_step": "scheduler.prompts_per_step",
    "rollout.group_size": "scheduler.group_size",
    "rollout.sync_every": "scheduler.sync_every",
    "rollout.async_rollout": "scheduler.async_rollout",
    "rollout.max_staleness": "scheduler.max_staleness",
    "rollout.max_turns": "env.max_turns",
    "rollout.max_new_tokens": "sampling.max_new_tokens",
    "rollout.temperature": "sampling.temperature",
    "rollout.top_p": "sampling.top_p",
    "rollout.top_k": "sampling.top_k",
    "rollout.max_context_tokens": "context.max_context_tokens",
    "rollout.engine": "engine.kind",
    "rollout.engines": "engine.replicas",
    "rollout.engine_dtype": "engine.dtype",
    "rollout.engine_kv_cache_gib": "engine.kv_cache_gib",
    "rollout.engine_batch_size": "engine.batch_size",
    "rollout.runners": "runners.count",
    "rollout.runner_actors": "runners.actors",
    "rollout.step_timeout": "runners.step_timeout",
    "rollout.max_episode_retries": "runners.max_episode_retries",
    "rollout.ray_address": "ray_address",
    **{f"rollout.{k}": f"context.{k}" for k in ("observation_role", "recap_actions", "chat_family",
                                                 "max_new_tokens_by_turn", "enable_thinking")},
    "loss.advantage": "advantage.estimator",
    "loss.advantage_options": "advantage.options (e.g. advantage.options.gamma)",
    "loss.n_minibatches": "optim.n_minibatches",
    "loss.micro_batch_tokens": "trainer.micro_batch_tokens",
    "loss.micro_batch_size": "trainer.micro_batch_size",
    "loss.gradient_checkpointing": "trainer.gradient_checkpointing",
    "loss.memory_limit_gb": "trainer.memory_limit_gb",
    "trainer.gpus_per_engine": "engine.gpus",
    "trainer.colocate": "engine.colocate",
    "dtype": "trainer.dtype",
    "trainer.param_dtype": "trainer.compute_dtype",
}
"""Keys of earlier config layouts and where they live now: a YAML that still uses one fails with one line. The
one-line messages stay until release 0.3 (after which such a key is an unknown key like any other, with the closest
valid keys suggested); keys renamed in 0.2 join them then (`RENAMED_KEYS`)."""
RunConfig.MOVED = MOVED_KEYS


@dataclass(frozen=True)
class Renamed:
    """A key the current release renamed: still read, with a warning naming its new place, until `removed_in`."""

    new: str
    """Its dotted place now (``advantage.options.gamma``)."""
    removed_in: str
    """The release that stops reading it; it then moves to `MOVED_KEYS`, which refuses it in one line."""
    type: Any = str
    """Its value's type: its ``--flag`` (generated by `agentrl.cli.flags`) is typed by it."""


RENAMED_KEYS: dict[str, Renamed] = {
    # 0.2 (issue 40): the advantage section became the estimator and its options, typed by the estimator.
    "advantage.name": Renamed("advantage.estimator", "0.3"),
    **{f"advantage.{key}": Renamed(f"advantage.options.{key}", "0.3", tp) for key, tp in (
        ("boost", float), ("success_threshold", float), ("k", int), ("normalize", bool), ("gamma", float),
        ("step_weight", float), ("normalize_std", bool), ("eps", float))},
}
"""Keys renamed by the current release (old dotted key -> `Renamed`): a YAML file, ``apply_overrides`` (so the flags
too) and a saved run still read them, each with one warning line; the release `Renamed.removed_in` removes them."""
RunConfig.RENAMED = RENAMED_KEYS


def _old_keys(values: dict[str, Any], moved_keys: dict[str, str]) -> list[tuple[str, dict[str, Any], str]]:
    """The keys of `moved_keys` present in `values`: (old dotted key, the mapping holding it, its leaf name)."""
    found = []
    for old in moved_keys:  # every key listed is gone from its old place: its presence marks an earlier layout
        section, _, leaf = old.rpartition(".")
        node = values.get(section) if section else values
        if isinstance(node, dict) and leaf in node:
            found.append((old, node, leaf))
    return found


def _moved_key(cls: type, values: dict[str, Any]) -> str | None:
    """The first key of an earlier layout in `values` (a `cls` mapping), as ``old is now new``; None if none.

    `cls` lists its moved keys in a ``MOVED`` class attribute (`MOVED_KEYS` for `RunConfig`).
    """
    old = _old_keys(values, cls.MOVED)
    if old:
        return f"{old[0][0]} is now {cls.MOVED[old[0][0]]}"
    if isinstance(values.get("rollout"), dict) and "rollout" not in {f.name for f in dataclasses.fields(cls)}:
        return "the rollout section is gone: its keys moved to sampling, engine, runners, scheduler, context and env"
    return None


def _rename(values: dict[str, Any], renamed: dict[str, Renamed]) -> tuple[dict[str, Any], list[str]]:
    """`values` with every key of `renamed` present moved to its new place; and the old keys found.

    `values` is not modified. A None under an old key is dropped: a run saved by the release before wrote every
    option of the flat advantage section, None for those left unset.

    Raises:
        ConfigError: an old key and its new place both set, to different values.
    """
    found = _old_keys(values, renamed)
    if not found:
        return values, []
    values = copy.deepcopy(values)
    olds = []
    for old, node, leaf in _old_keys(values, renamed):
        value, new = node.pop(leaf), renamed[old].new
        olds.append(old)
        if value is None:
            continue
        *parents, new_leaf = new.split(".")
        target = values
        for i, part in enumerate(parents):
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise ConfigError(f"{'.'.join(parents[: i + 1])}: expected a mapping, got {target!r}")
        if new_leaf in target and target[new_leaf] != value:
            raise ConfigError(f"{old} and {new} are one setting, set twice ({old} is its name before "
                              f"{renamed[old].removed_in}): keep {new}")
        target[new_leaf] = value
    return values, olds


def _warn_renamed(old: str, renamed: dict[str, Renamed]) -> None:
    """One warning line: the key's new place, and the release that stops reading the old one."""
    logger.warning("%s is now %s (%s is read until %s, which removes it)", old, renamed[old].new, old,
                   renamed[old].removed_in)


def _check_base_url(url: str, key: str) -> None:
    """Refuse what is not an OpenAI-compatible base URL: http(s), a host, a valid port, no ``/chat/completions``.

    Raises:
        ConfigError: naming `key`, the URL and the fix.
    """
    example = "e.g. http://127.0.0.1:8000/v1"
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # a port that is not a number, or out of range, raises here
    except ValueError as e:
        raise ConfigError(f"{key} must be an http:// or https:// base URL, {example}, got {url!r} ({e})") from None
    _require(parts.scheme in ("http", "https"), key, url, f"an http:// or https:// base URL, {example}")
    _require(bool(parts.hostname), key, url, f"a URL with a host name or address, {example}")
    _require(port is None or port > 0, key, url, f"a URL with a port from 1 to 65535, {example}")
    # The judge appends /chat/completions itself: a full route would be asked for twice.
    _require(not parts.path.rstrip("/").endswith("/chat/completions"), key, url,
             f"the base URL, without /chat/completions (which is appended), {example}")
    # A query or fragment would end up before the appended route; credentials in the URL would be written into
    # config.yaml, results.json and messages (the key belongs in the variable named by api_key_env).
    _require(not parts.query and not parts.fragment, key, url, f"a base URL without ?query or #fragment, {example}")
    _require(parts.username is None and parts.password is None, key, "<the URL, credentials not repeated here>",
             "a URL without user:password@ (name an environment variable holding the key in api_key_env)")


def _require(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raise a `ConfigError` naming the key, the bad value and what is allowed, unless `ok`."""
    if not ok:
        raise ConfigError(f"{key} must be {allowed}, got {value!r}")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):  # `X | None`: None is allowed, anything else must be an X
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None and len(options) < len(typing.get_args(tp)):
            return None
        if len(options) == 1:
            return _coerce(value, options[0], where)
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return _build(tp, value, where)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping (KEY: VALUE lines or {{key: value}}), got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        args = typing.get_args(tp)
        item_types = [args[0]] * len(value) if len(args) == 2 and args[1] is Ellipsis else list(args)
        if len(item_types) != len(value):
            raise ConfigError(f"{where}: expected a list of {len(item_types)} values, got {list(value)!r}")
        return tuple(_coerce(v, t, f"{where}[{i}]") for i, (v, t) in enumerate(zip(value, item_types)))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    simple = {int: int, float: float, str: str, bool: bool}
    if tp in simple and not isinstance(value, tp) or (tp in (int, float) and isinstance(value, bool)):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")
    return value


def _build(cls: type, values: dict[str, Any], where: str = "") -> Any:
    if hasattr(cls, "MOVED") and (moved := _moved_key(cls, values)):
        raise ConfigError(moved)
    if getattr(cls, "RENAMED", None):
        values, olds = _rename(values, cls.RENAMED)
        for old in olds:
            _warn_renamed(old, cls.RENAMED)
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        prefix = f"{where}." if where else ""
        close = difflib.get_close_matches(str(unknown[0]), names, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        valid = ", ".join(sorted(names))
        raise ConfigError(f"unknown config key {prefix}{unknown[0]!r}.{hint} Valid keys here: {valid}")
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}" if where else k) for k, v in values.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as e:  # a section defined by the module that owns it (loss.overlong) checks with ValueError
        raise ConfigError(f"{where}: {e}" if where else str(e)) from None


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain data (for saving next to a run)."""
    return dataclasses.asdict(cfg)


def load_config(path: str | Path | None = None) -> RunConfig:
    """Defaults, updated by the YAML file at `path` (if any)."""
    return load_yaml(RunConfig, path, "config sections")


def read_run_config(path: str | Path) -> tuple[RunConfig, list[str]]:
    """The config.yaml a run folder saved, in the earlier layout too; and the keys that moved, as ``old -> new``.

    A config a user writes must use the current layout (an old key is an error naming its new place), but a run
    saved before the sections were sorted by owner must still resume and evaluate: its keys are moved here, and the
    keys of `RENAMED_KEYS` too (without the warnings a config a user writes gets).
    """
    p = Path(path)
    values, moved = upgrade_layout(_read_mapping(p, "config sections"), MOVED_KEYS)
    try:
        values, renamed = _rename(values, RENAMED_KEYS)
        moved += [f"{old} -> {RENAMED_KEYS[old].new}" for old in renamed]
        return _build(RunConfig, values), moved
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None


def upgrade_layout(values: dict[str, Any], moved_keys: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
    """`values` with every key of `moved_keys` (``old.dotted -> new.dotted``) moved to its new place.

    ``loss.advantage_options`` becomes ``advantage.options``; a section left empty goes.

    Returns:
        The upgraded mapping and the moves made, as ``old -> new`` lines.
    """
    values = {k: dict(v) if isinstance(v, dict) else v for k, v in values.items()}
    moves = []
    for old, node, leaf in _old_keys(values, moved_keys):
        new = moved_keys[old]
        value = node.pop(leaf)
        if old == "loss.advantage_options":  # merged with any options the advantage section has
            advantage = values.setdefault("advantage", {})
            advantage["options"] = {**(advantage.get("options") or {}), **(value or {})}
            moves.append(f"{old} -> advantage.options")
            continue
        new_section, _, new_leaf = new.rpartition(".")
        (values.setdefault(new_section, {}) if new_section else values)[new_leaf] = value
        moves.append(f"{old} -> {new}")
    for section in ("rollout",):
        if values.get(section) == {}:
            del values[section]
    return values, moves


def load_yaml(cls: type, path: str | Path | None, top_level: str) -> Any:
    """A `cls` config: its defaults, updated by the YAML file at `path` (if any); errors name the file and the key.

    Args:
        cls: the config dataclass.
        path: the YAML file, or None for the defaults.
        top_level: what the file's top-level mapping holds, for the message when it is not a mapping.
    """
    if path is None:
        return cls()
    p = Path(path)
    values = _read_mapping(p, top_level)
    try:
        return _build(cls, values)
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None


def _read_mapping(p: Path, top_level: str) -> dict[str, Any]:
    """The YAML mapping in file `p`; a missing file, bad YAML or another top level is one `ConfigError` line."""
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        values = yaml.safe_load(p.read_text()) or {}
    except OSError as e:
        raise ConfigError(f"{p}: cannot read it ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML ({_yaml_problem(e)})") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of {top_level}")
    return values


def _yaml_problem(error: yaml.YAMLError) -> str:
    """One line for a YAML parse error: what is wrong and where (PyYAML's own text spans several lines)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def build_config(cls: type, overrides: dict[str, Any]) -> Any:
    """A `cls` config from its defaults and dotted keys (``"env.max_turns": 15``), as a command's flags give them.

    Unlike `apply_overrides` this needs no config to start from, so a root with a required field (`EvalConfig`'s
    ``model``) builds too, once the keys set it. None values are skipped; renamed keys (``RENAMED``) set their new
    place with one warning line; the result is checked as a loaded file is.

    Raises:
        ConfigError: an unknown key or a bad value, naming it.
    """
    return _build(cls, _set_dotted({}, overrides, getattr(cls, "RENAMED", {})))


def apply_overrides(cfg: Any, overrides: dict[str, Any]) -> Any:
    """Set dotted keys (``"scheduler.group_size": 4``) of a config (`RunConfig`, `SFTConfig`), as CLI flags do.

    None values are skipped; the result is checked as a loaded file is. A key of the config's ``RENAMED`` table
    (`RENAMED_KEYS`: ``--advantage.gamma``) sets its new place, with one warning line.
    """
    return _build(type(cfg), _set_dotted(config_to_dict(cfg), overrides, getattr(type(cfg), "RENAMED", {})))


def _set_dotted(tree: dict[str, Any], overrides: dict[str, Any], renamed: dict[str, Renamed]) -> dict[str, Any]:
    """`tree` with each dotted key of `overrides` set; returns `tree`.

    None values are skipped; a renamed key sets its new place, with a warning. A section `tree` lacks is made, so
    that an unknown one reaches `_build`, which names it and the valid keys.
    """
    for dotted, value in overrides.items():
        if value is None:
            continue
        if dotted in renamed:
            _warn_renamed(dotted, renamed)
            dotted = renamed[dotted].new
        node = tree
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree
