"""Run configuration: typed dataclasses with documented defaults. YAML files in `configs/` only set values.

A YAML file mirrors the sections below::

    model: smollm2-135m
    env: {id: math, kwargs: {level: 2}}
    rollout: {group_size: 8, prompts_per_step: 4, max_new_tokens: 96}
    loss: {name: minirl}

Unknown keys are errors that name the key and list the valid ones: a typo must never silently fall back to a default.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "EnvConfig", "RolloutConfig", "ContextConfig", "LossConfig", "OptimConfig", "GuardConfig", "TrainerConfig",
    "RunConfig",
    "ConfigError",
    "load_config", "apply_overrides", "config_to_dict",
]


class ConfigError(ValueError):
    """A config file or override that does not fit the dataclasses (unknown key, wrong type, value out of range)."""


ROUTING_REPLAY_MODES = ("none", "r2", "r3")
"""`LossConfig.routing_replay` values."""
DTYPES = ("float32", "bfloat16", "float16")
"""`RunConfig.dtype` values (torch dtype names)."""


@dataclass
class EnvConfig:
    """Which environment and how to build it."""

    id: str = "math"
    """Registry id (`agentrl envs list`)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Constructor keyword arguments for the env; what is left out takes the env's own defaults (math: level 1)."""
    seed_offset: int = 0
    """Task seeds of step s are `seed_offset + s * prompts_per_step + i`: every step sees new tasks."""

    def __post_init__(self) -> None:
        _require(isinstance(self.id, str) and bool(self.id), "env.id", self.id, "a registered env id")
        _require(self.seed_offset >= 0, "env.seed_offset", self.seed_offset, ">= 0 (env seeds cannot be negative)")


@dataclass
class RolloutConfig:
    """How episodes are sampled."""

    prompts_per_step: int = 4
    """Distinct tasks (env seeds) per training step."""
    group_size: int = 8
    """Episodes per task; advantages compare episodes within a group."""
    max_turns: int = 50
    """Cap on model calls per episode. Envs end episodes with their own budgets first (math single-turn: 1 reply;
    WebShop: 15 steps; GUI: 25; ALFWorld: 50), so the default lets every built-in env play out whole episodes."""
    max_new_tokens: int = 64
    """Per turn: enough for actions and short answers; raise it for reasoning or thinking models."""
    max_context_tokens: int = 4096
    """An episode whose prompt would grow past this is truncated."""
    temperature: float = 1.0
    """Train at temperature 1: the importance weights assume we learn from what the policy really samples."""
    top_p: float = 1.0
    """Nucleus sampling mass (1 = off)."""
    top_k: int = 0
    """Top-k sampling (0 = off)."""
    engine_batch_size: int = 32
    """Prompts per engine forward pass (HF engine)."""
    engine: str = "auto"
    """Inference engine: ``hf`` (transformers, our decode loop), ``vllm`` (continuous batching, prefix caching;
    needs the vLLM install of the README), or ``auto``: vLLM where it is installed and serves the model, else HF
    (resolved once at set-up, `agentrl.engine.choose_engine`, and saved as such in the run's config.yaml)."""
    engines: int = 1
    """Engine replicas; more than one (or a `ray_address`) runs them as Ray actors, episodes spread by load."""
    engine_dtype: str = ""
    """The engine's precision (float32, bfloat16); empty: the training dtype."""
    engine_kv_cache_gib: float = 0.0
    """Memory for each engine's KV cache (vLLM; host memory on the CPU build) or prefix store (HF), in GiB; 0 sizes
    it to keep every episode in flight cached at its longest context, within half the free memory (see
    `agentrl.recipes.train.rollout_kv_cache_gib`)."""
    runners: int = 0
    """Concurrent env runners; 0 runs envs in the driver process."""
    runner_actors: int = 0
    """Ray processes hosting the runners (several envs each); 0 = one per CPU of the Ray cluster."""
    ray_address: str | None = None
    """Ray cluster to join (``auto``, ``ray://host:10001``); None starts a quiet local Ray for the run."""
    step_timeout: float = 60.0
    """Seconds an env reset/step may take in a runner before the runner is restarted and the episode re-run."""
    max_episode_retries: int = 2
    """Re-runs of an episode whose env failed before its whole group is dropped (and counted)."""
    sync_every: int = 1
    """Refresh the rollout engine's weights every k steps (1 = lockstep on-policy; samples are <= k-1 steps old)."""
    async_rollout: bool = False
    """Collect the next step's rollout while this step trains, bounded by `max_staleness`."""
    max_staleness: int = 1
    """Async mode: train only on samples at most this many policy versions old (fresher ones first)."""

    def __post_init__(self) -> None:
        for name in ("prompts_per_step", "group_size", "max_turns", "max_new_tokens", "max_context_tokens",
                     "engine_batch_size", "sync_every", "engines"):
            _require(getattr(self, name) >= 1, f"rollout.{name}", getattr(self, name), ">= 1")
        for name in ("top_k", "runners", "runner_actors", "max_episode_retries", "max_staleness"):
            _require(getattr(self, name) >= 0, f"rollout.{name}", getattr(self, name), ">= 0")
        # Greedy decoding would give every episode of a group the same reply: zero advantages, nothing to learn.
        _require(self.temperature > 0, "rollout.temperature", self.temperature, "> 0 for training")
        _require(0 < self.top_p <= 1, "rollout.top_p", self.top_p, "in (0, 1]")
        _require(self.step_timeout > 0, "rollout.step_timeout", self.step_timeout, "> 0 seconds")
        _require(self.engine in ("auto", "hf", "vllm"), "rollout.engine", self.engine, "auto, hf or vllm")
        _require(self.engine_dtype in ("", *DTYPES), "rollout.engine_dtype", self.engine_dtype,
                 f"empty (the training dtype) or one of {', '.join(DTYPES)}")
        _require(self.engine_kv_cache_gib >= 0, "rollout.engine_kv_cache_gib", self.engine_kv_cache_gib,
                 ">= 0 GiB (0: sized for the rollout)")


CONTEXT_KEYS = ("observation_role", "recap_actions", "chat_family", "max_new_tokens_by_turn", "enable_thinking")
"""`ContextConfig` fields; older configs set them under ``rollout:``, which still works."""


@dataclass(frozen=True)
class ContextConfig:
    """How every turn's prompt is built, one definition for `agentrl run` and `agentrl eval`.

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
    """Chat-template family to render with (`agentrl.chat.families.FAMILIES`: qwen3, deepseek-r1, gpt-oss, ...); empty
    detects it from the tokenizer, falling back to the tokenizer's own template."""
    max_new_tokens_by_turn: tuple[int, ...] = ()
    """Per-turn generation budgets (turn i uses entry min(i, len-1)); empty uses `max_new_tokens` for every turn."""
    enable_thinking: bool | None = None
    """For thinking-model templates (Qwen3): force thinking on or off; None keeps the template default."""
    history: str = "template"
    """How earlier turns appear in later prompts: ``template`` renders them as the official template does (Qwen3
    with thinking off drops each earlier turn's empty ``<think></think>``, so every turn becomes its own training
    sample: ~21x the trainer's tokens at 50 turns), ``as_sampled`` keeps them token for token as sampled and renders
    only the new messages (one sample per episode; prompts then depart from the official rendering of history)."""

    def __post_init__(self) -> None:
        from agentrl.chat.context import OBSERVATION_ROLES

        _require(self.observation_role in (*OBSERVATION_ROLES, "auto"), "context.observation_role",
                 self.observation_role, f"one of {', '.join(OBSERVATION_ROLES)}, or auto (the env's hint)")
        _require(self.recap_actions >= 0, "context.recap_actions", self.recap_actions, ">= 0")
        _require(self.history in ("template", "as_sampled"), "context.history", self.history,
                 "template (the official rendering) or as_sampled (earlier turns as the model sampled them)")
        _require(all(isinstance(b, int) and b >= 1 for b in self.max_new_tokens_by_turn),
                 "context.max_new_tokens_by_turn", list(self.max_new_tokens_by_turn), "a list of integers >= 1")
        if self.chat_family:
            from agentrl.chat.families import ALIASES, FAMILIES

            _require(self.chat_family in {**FAMILIES, **ALIASES}, "context.chat_family", self.chat_family,
                     f"empty (detect it) or one of {', '.join(FAMILIES)}")

    def resolved(self, env_cls: type, tokenizer, family_hint: str | None) -> tuple[ContextConfig, str]:
        """This context with ``observation_role: auto`` replaced by the concrete role, and one line saying why."""
        from agentrl.chat.layout import resolve_observation_role

        role, why = resolve_observation_role(self.observation_role, env_cls, tokenizer, self.chat_kwargs(),
                                             family=self.chat_family or None, family_hint=family_hint)
        return dataclasses.replace(self, observation_role=role), why

    def chat_kwargs(self) -> dict[str, Any]:
        """Chat-template variables (``enable_thinking`` when set)."""
        return {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}

    def rollout_kwargs(self, family_hint: str | None) -> dict[str, Any]:
        """The keyword arguments `agentrl.rollout.loop.run_rollout` / `collect_trajectories` take for this context.

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
class LossConfig:
    """The policy objective (see `agentrl.objective`)."""

    name: str = "minirl"
    """A registered policy loss: minirl, grpo, dapo, gspo, cispo, dr_grpo, reinforce."""
    options: dict[str, Any] = field(default_factory=dict)
    """Loss options (is_cap, eps_low, eps_high, correction, agg, ...); defaults are the loss's own."""
    advantage: str = "group_mean"
    """Advantage estimator: group_mean (MiniRL), grpo, loo, low_success_weight, passk, or gigpo (step-level
    advantages from anchor states shared across the episodes of a task; multi-turn envs)."""
    advantage_options: dict[str, Any] = field(default_factory=dict)
    """The estimator's options, e.g. ``{boost: 2.0}`` (low_success_weight), ``{k: 8}`` (passk),
    ``{gamma: 0.95, step_weight: 1.0, normalize_std: true}`` (gigpo). A group of one response gets advantage 0."""
    bypass: bool = False
    """Bypass mode: pi_old = mu, the rollout's own log-probs; the recompute pass is skipped (strictly on-policy runs:
    the importance ratio is then 1 and the clip acts on pi_theta / mu; kl_k3 reads 0)."""
    old_policy_pass: str = "auto"
    """The pi_old recompute pass: ``auto`` skips it when the update's own forward gives exactly pi_old (one
    mini-batch per rollout, so the weights are not updated before the loss reads them, and no Routing Replay
    strategy that reads the pass): the update's log-probs, detached, stand for pi_old and it reports the entropy.
    The same loss and gradient for a forward pass less (1.19x per step in bench/trainer_step_passes.py).
    ``on``: always recompute."""
    kl_reward_coef: float = 0.0
    """KL(pi_old || pi_ref) as a reward penalty: R -= coef * sum_t k(log pi_old, log pi_ref) (0: off). A frozen copy
    of `model` is loaded as the reference only when this or ``options.kl_coef`` is > 0."""
    kl_reward_estimator: str = "k1"
    """Estimator of the reward penalty: k1, k2 or k3."""
    overlong: dict[str, Any] = field(default_factory=dict)
    """DAPO overlong treatment of episodes with a reply cut at its token budget: ``{mode: filter}`` leaves them out
    of the loss; ``{mode: penalize, cache_length: 16, penalty_factor: 1.0}`` subtracts a penalty that ramps over the
    last `cache_length` tokens of the per-turn budget; empty = neither."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: leave out groups whose episodes all got the same reward (zero advantage: they only
    dilute the batch)."""
    n_minibatches: int = 1
    """Optimizer updates per rollout batch (1 = on-policy; >1 makes later updates off-policy)."""
    micro_batch_tokens: int = 8192
    """Padded tokens per forward/backward pass (sequences x longest): the memory knob. Samples are packed longest
    first; one longer than the budget gets a pass of its own. The gradient does not depend on it."""
    micro_batch_size: int = 0
    """Optional cap on sequences per forward/backward pass (0 = only the token budget counts)."""
    gradient_checkpointing: str = "auto"
    """Recompute each block's activations in the backward: ``on``, ``off``, or ``auto`` (on when the step's
    estimated peak memory would not fit otherwise; see `agentrl.training.memory`)."""
    memory_limit_gb: float = 0.0
    """Memory the training step may use; 0 = the memory available when the run starts. A config whose estimated
    peak exceeds it fails before the first rollout, naming the setting to change."""
    routing_replay: str = "none"
    """MoE Routing Replay: ``none``, ``r2`` (replay the training router's pi_old choices in the updates) or ``r3``
    (replay the experts the inference engine chose at rollout, in the pi_old pass and the updates)."""
    per_turn_samples: bool = False
    """One training sample per turn instead of merging turns while the token prefix holds."""

    def __post_init__(self) -> None:
        from agentrl.objective import KL_ESTIMATORS, TURN_ESTIMATORS, check_turn_advantage_options, loss_options

        try:  # the loss owns its option names and values: build them once now rather than fail at step 0
            loss_options(self.name, **self.options)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"loss: {e}") from None
        _require(self.advantage in TURN_ESTIMATORS, "loss.advantage", self.advantage,
                 f"one of {', '.join(TURN_ESTIMATORS)}")
        try:
            check_turn_advantage_options(self.advantage, self.advantage_options)
        except ValueError as e:
            raise ConfigError(f"loss.advantage_options: {e}") from None
        _require(self.kl_reward_coef >= 0, "loss.kl_reward_coef", self.kl_reward_coef, ">= 0 (0 = off)")
        _require(self.kl_reward_estimator in KL_ESTIMATORS, "loss.kl_reward_estimator", self.kl_reward_estimator,
                 f"one of {', '.join(KL_ESTIMATORS)}")
        from agentrl.objective import OverlongConfig

        try:  # max_length is the rollout's per-turn budget, known at set-up: any positive value checks the rest
            OverlongConfig(**({"max_length": 1 << 30} | dict(self.overlong)))
        except (TypeError, ValueError) as e:
            raise ConfigError(f"loss.overlong: {e}") from None
        _require(self.n_minibatches >= 1, "loss.n_minibatches", self.n_minibatches, ">= 1")
        _require(self.micro_batch_tokens >= 1, "loss.micro_batch_tokens", self.micro_batch_tokens, ">= 1")
        _require(self.micro_batch_size >= 0, "loss.micro_batch_size", self.micro_batch_size, ">= 0 (0 = no cap)")
        _require(self.gradient_checkpointing in ("on", "off", "auto"), "loss.gradient_checkpointing",
                 self.gradient_checkpointing, "on, off or auto")
        _require(self.memory_limit_gb >= 0, "loss.memory_limit_gb", self.memory_limit_gb, ">= 0 (0 = available)")
        _require(self.routing_replay in ROUTING_REPLAY_MODES, "loss.routing_replay", self.routing_replay,
                 f"one of {', '.join(ROUTING_REPLAY_MODES)}")
        _require(self.old_policy_pass in ("auto", "on"), "loss.old_policy_pass", self.old_policy_pass, "auto or on")
        _require(not (self.bypass and self.routing_replay == "r2"), "loss.bypass", self.bypass,
                 "false with routing_replay r2 (R2 replays the experts the pi_old pass records; bypass skips it)")


@dataclass
class OptimConfig:
    """AdamW."""

    lr: float = 2e-5
    """Learning rate."""
    weight_decay: float = 0.0
    """Decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam betas."""
    grad_clip: float = 1.0
    """Max global gradient norm (0 = off)."""

    def __post_init__(self) -> None:
        _require(self.lr > 0, "optim.lr", self.lr, "> 0")
        _require(self.weight_decay >= 0, "optim.weight_decay", self.weight_decay, ">= 0")
        _require(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "optim.betas", list(self.betas),
                 "two numbers in [0, 1), e.g. [0.9, 0.999]")
        _require(self.grad_clip >= 0, "optim.grad_clip", self.grad_clip, ">= 0 (0 = off)")


@dataclass
class GuardConfig:
    """Collapse guard: stop (or roll back) when the run degenerates."""

    enabled: bool = True
    """Watch entropy and the train-inference KL each step."""
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

    def __post_init__(self) -> None:
        from agentrl.objective.collapse_guard import GUARD_ACTIONS

        _require(self.action in GUARD_ACTIONS, "guard.action", self.action, f"one of {', '.join(GUARD_ACTIONS)}")
        _require(self.patience >= 1, "guard.patience", self.patience, ">= 1")


@dataclass
class TrainerConfig:
    """Where and how the policy trains (see `agentrl.training`)."""

    workers: int = 0
    """FSDP2 trainer workers on Ray (``--trainers``); 0 trains in the driver process (one CPU machine)."""
    gpus_per_worker: float = 0.0
    """GPUs each trainer worker owns (``--gpus-per-trainer``; 0 = train on CPU with gloo, else NCCL)."""
    gpus_per_engine: float = 0.0
    """GPUs each Ray-placed inference engine owns (``--gpus-per-engine``)."""
    colocate: bool = False
    """Engines share the trainers' GPUs (sleeping while they train) instead of owning their own."""
    param_dtype: str = ""
    """FSDP mixed precision: compute dtype of the parameters (empty = `dtype`); bfloat16 on GPUs."""
    reduce_dtype: str = ""
    """FSDP mixed precision: dtype gradients are reduced in (empty = the parameters'); float32 with bf16 params."""
    compute_dtype: str = ""
    """Autocast the trainer's matmuls to this dtype (``--compute-dtype``; empty = off): weights, gradients and AdamW
    state stay in `dtype`, so small updates are not rounded away. bfloat16 runs SmolLM2-135M's forward + backward
    ~1.8x faster on a CPU with AVX512-BF16 (290 vs 160 tokens/s on 2 cores) and is the usual choice on GPUs."""

    def __post_init__(self) -> None:
        _require(self.workers >= 0, "trainer.workers", self.workers, ">= 0 (0 trains in the driver)")
        _require(self.gpus_per_worker >= 0, "trainer.gpus_per_worker", self.gpus_per_worker, ">= 0")
        _require(self.gpus_per_engine >= 0, "trainer.gpus_per_engine", self.gpus_per_engine, ">= 0")
        for name in ("param_dtype", "reduce_dtype", "compute_dtype"):
            _require(getattr(self, name) in ("", *DTYPES), f"trainer.{name}", getattr(self, name),
                     f"empty or one of {', '.join(DTYPES)}")
        _require(self.workers > 0 or self.gpus_per_worker == 0, "trainer.gpus_per_worker", self.gpus_per_worker,
                 "0 when trainer.workers is 0 (the driver trains on CPU); set --trainers N to train on GPUs")


@dataclass
class RunConfig:
    """Everything `agentrl run` needs; `agentrl run --help` shows the common flags."""

    model: str = "smollm2-135m"
    """A built-in (smollm2-135m, tiny-qwen3, tiny-qwen3-moe), a local Hugging Face folder, or a hub id."""
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    context: ContextConfig = field(default_factory=ContextConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
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
    dtype: str = "float32"
    """Training precision (float32 on CPU)."""

    def __post_init__(self) -> None:
        _require(self.steps >= 1, "steps", self.steps, ">= 1")
        _require(self.save_every >= 1, "save_every", self.save_every, ">= 1")
        _require(self.output == "" or bool(self.output.strip()), "output", self.output,
                 "a folder path (or empty for a new runs/<env>-<model>-<time> folder)")
        _require(self.dtype in DTYPES, "dtype", self.dtype, f"one of {', '.join(DTYPES)}")
        _require(not (self.trainer.colocate and self.rollout.async_rollout), "rollout.async_rollout",
                 self.rollout.async_rollout, "false with trainer.colocate (a colocated engine sleeps while the "
                 "trainers train, so it cannot roll out meanwhile): drop --async, or use the split layout")
        if self.loss.advantage == "passk":  # Pass@k compares k episodes of one group: it needs at least k of them
            import inspect

            from agentrl.objective import ADVANTAGES

            k = self.loss.advantage_options.get("k", inspect.signature(ADVANTAGES["passk"].fn).parameters["k"].default)
            _require(self.rollout.group_size >= k, "rollout.group_size", self.rollout.group_size,
                     f">= {k} with loss.advantage passk (pass@{k} needs {k} episodes per group)")


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


def _move_context_keys(values: dict[str, Any]) -> dict[str, Any]:
    """Move context keys that older configs set under `rollout:` into `context:`.

    A key set in both places with different values is an error naming it.
    """
    rollout = values.get("rollout")
    if not isinstance(rollout, dict) or not any(k in rollout for k in CONTEXT_KEYS):
        return values
    context = dict(values.get("context") or {})
    for key in CONTEXT_KEYS:
        if key in rollout:
            if key in context and context[key] != rollout[key]:
                raise ConfigError(f"context.{key} is set twice, as rollout.{key} and context.{key}: keep one")
            context[key] = rollout[key]
    return values | {"rollout": {k: v for k, v in rollout.items() if k not in CONTEXT_KEYS}, "context": context}


def _build(cls: type, values: dict[str, Any], where: str = "") -> Any:
    if cls is RunConfig:
        values = _move_context_keys(values)
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
    return cls(**kwargs)


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain data (for saving next to a run)."""
    return dataclasses.asdict(cfg)


def load_config(path: str | Path | None = None) -> RunConfig:
    """Defaults, updated by the YAML file at `path` (if any)."""
    return load_yaml(RunConfig, path, "config sections")


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
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        values = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML ({_yaml_problem(e)})") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of {top_level}")
    try:
        return _build(cls, values)
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None


def _yaml_problem(error: yaml.YAMLError) -> str:
    """One line for a YAML parse error: what is wrong and where (PyYAML's own text spans several lines)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def apply_overrides(cfg: RunConfig, overrides: dict[str, Any]) -> RunConfig:
    """Set dotted keys (``"rollout.group_size": 4``), as CLI flags do; None values are skipped."""
    data = config_to_dict(cfg)
    for dotted, value in overrides.items():
        if value is None:
            continue
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return _build(RunConfig, data)
