"""The training loop, top to bottom: rollout -> advantages -> samples -> pi_old -> minibatch updates -> metrics.

One step:
  1. rollout: `prompts_per_step` tasks x `group_size` episodes with the current weights (policy version = step).
  2. advantages: the group-mean baseline by default (MiniRL: A = R - mean_group(R), no std division).
  3. samples: each trajectory becomes one sample per prefix-consistent run of turns (`agentrl.chat.samples`).
  4. pi_old: the training model recomputes the log-probs of the sampled tokens (no grad), and the entropy.
     The rollout's own log-probs (mu) stay as they were: the loss's importance weight pi_old / mu corrects for
     any train-inference mismatch. With one mini-batch per rollout the update's own forward runs on the same
     weights, so its detached log-probs are pi_old and this pass is skipped (``loss.old_policy_pass: auto``).
  5. updates: the batch splits into `n_minibatches` mini-batches of whole groups; each is one AdamW step,
     accumulated over micro-batches with global denominators, so micro-batch size never changes the gradient.
  6. metrics (one JSON line per step), the collapse guard, then a checkpoint every `save_every` steps (with the guard
     on, of healthy steps only, so a rollback restores the weights and optimizer state of the last healthy step).

Objective options chosen once per run: the loss options (`build_loss_options`), per-turn advantages (GiGPO or any
episode-level estimator), a frozen reference model only when a KL term asks for it (`agentrl.training.reference`),
bypass mode (pi_old = mu: step 4 is skipped), the pi_old pass or the update's own log-probs (`choose_old_policy`), the
entropy bonus (the update pass computes the entropy with grad).

Where things live (the torchtune split): `set_up` builds and checks everything before a step runs (Ray, placement,
model, memory plan, training backend, Routing Replay strategy, engine, scheduler); `score_old_policy` and
`update_policy` are steps 4 and 5; `agentrl.training.metrics` builds the metrics line; `Run.save` and
`agentrl.training.checkpoint` write checkpoints. The weights and AdamW live behind a `TrainingBackend`
(`agentrl.training.backend`): in this process (``--trainers 0``) or sharded over FSDP2 Ray workers (``--trainers N``).

Departures from the MiniRL paper, and why: float32 on CPU rather than BF16 training / FP8 rollout; small groups and
batches (G=8, 4 prompts by default rather than 16 x 64) because a CPU step must take about a minute.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

import agentrl
from agentrl.chat.samples import trajectory_to_samples
from agentrl.cluster import ClusterError, start_ray
from agentrl.config import ConfigError, LossConfig, RunConfig, config_to_dict
from agentrl.engine import EngineError, EngineSpec, SamplingParams, build_engines, choose_engine
from agentrl.env import TextEnv
from agentrl.models import LoadedModel, load_model
from agentrl.objective import (
    CollapseGuard,
    LossOptions,
    OverlongConfig,
    apply_overlong,
    informative_groups,
    kl_reward_penalty,
    loss_options,
    minibatch_indices,
    policy_loss,
    turn_advantages,
)
from agentrl.records import Sample, Trajectory, save_trajectories
from agentrl.rollout.scheduler import RolloutScheduler, staleness_metrics
from agentrl.training.backend import LossResult, PolicyObjective, TrainerFailure, TrainingBackend
from agentrl.training.checkpoint import (
    CHECKPOINT,
    TrainerState,
    checkpoint_folder,
    read_trainer_state,
    save_checkpoint,
)
from agentrl.training.fsdp import FSDPBackend, WorkerSpec
from agentrl.training.logprobs import compute_dtype_of, token_logprobs
from agentrl.training.memory import VLLM_RUNTIME_BYTES, MemoryPlan, plan_training_memory
from agentrl.training.metrics import append_metrics, plot_metrics, rollout_metrics, weighted_mean
from agentrl.training.microbatch import collate, pack_by_tokens, padding_waste
from agentrl.training.placement import Placement, PlacementPlan
from agentrl.training.reference import ReferencePolicy, load_reference
from agentrl.training.routing_replay import DenseRouting, RoutingReplayError, routing_strategy
from agentrl.training.single import SingleProcessBackend

__all__ = ["train", "TrainingError", "set_up", "Run"]


class TrainingError(RuntimeError):
    """The run cannot go on (non-finite loss, collapse guard tripped); the message says why and where."""


def plot_curves(metrics_path: Path, png_path: Path) -> None:
    """Plot the run's main curves from metrics.jsonl into a PNG."""
    keys = ["reward_mean", "success_rate", "entropy", "kl_k3", "response_tokens_mean", "clip_frac"]
    plot_metrics(metrics_path, png_path, [(k, k) for k in keys], f"agentrl run: {metrics_path.parent.name}")


def default_run_dir(cfg: RunConfig) -> Path:
    """A fresh folder name for a run that did not name one: runs/<env>-<model>-<date>-<time>."""
    model = Path(cfg.model).name if Path(cfg.model).exists() else cfg.model.replace("/", "_")
    return Path("runs") / f"{cfg.env.id}-{model}-{time.strftime('%Y%m%d-%H%M%S')}"


@dataclass
class Run:
    """Everything a run holds once set up: built and checked, nothing trained yet (torchtune's recipe state)."""

    cfg: RunConfig
    out: Path
    policy: LoadedModel
    """The driver's model: its tokenizer and chat family, and its module for the one-process backend (which trains
    it in place). With trainer workers its weights are released once the engines have started from them: the workers
    own the trained weights and the scheduler syncs the engines from `backend.named_weights`."""
    backend: TrainingBackend
    routing: DenseRouting
    scheduler: RolloutScheduler
    guard: CollapseGuard
    shuffle: torch.Generator
    """Mini-batch shuffle generator (saved in checkpoints: the data order resumes exactly)."""
    start_step: int
    placement: Placement | None = None
    owns_ray: bool = False
    objective: LossOptions | None = None
    """The loss options, built once (`build_loss_options`)."""
    reference: ReferencePolicy | None = None
    """The frozen reference model, only when a KL term asks for it."""
    save_due: bool = False
    """A checkpoint fell on an unhealthy step and waits for a healthy one."""

    def save(self, step: int) -> Path:
        """Checkpoint after `step` (see `agentrl.training.checkpoint`)."""
        state = TrainerState.capture(step, self.backend.name, self.backend.world_size, self.shuffle)
        return save_checkpoint(self.out, self.backend, self.policy, state)

    def restore(self) -> int | None:
        """Load the weights and the optimizer state of the checkpoint together; the step it holds, or None if none."""
        return restore_checkpoint(self.out, self.backend)

    def close(self) -> None:
        """Stop the rollout scheduler, the trainer workers and (when this run started it) Ray."""
        self.scheduler.close()
        self.backend.close()
        if self.placement is not None:
            self.placement.close()
        _disconnect_ray(self.owns_ray)


def _disconnect_ray(owns_ray: bool) -> None:
    if owns_ray:
        import ray

        ray.shutdown()


def _prepare_output(cfg: RunConfig, resume: bool, overwrite: bool) -> Path:
    out = Path(cfg.output)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"cannot use {out} as the run folder: it is a file")
    if not resume and not overwrite and (out / "metrics.jsonl").exists():
        done = len((out / "metrics.jsonl").read_text().splitlines())
        raise ConfigError(f"{out} already holds a run ({done} steps). Continue it with --resume {out}, replace it "
                          f"with --overwrite, or choose another --output")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot use {out} as the run folder: {e.strerror or e}") from None
    return out


def _resume_state(cfg: RunConfig, out: Path) -> TrainerState:
    ckpt = checkpoint_folder(out)
    if not (ckpt / "trainer_state.json").exists():
        raise TrainingError(f"nothing to resume in {out}: no {CHECKPOINT}/trainer_state.json")
    state = read_trainer_state(ckpt)
    if state.step + 1 >= cfg.steps:
        raise ConfigError(f"{out} already holds {state.step + 1} trained step(s) and the run asks for {cfg.steps}: "
                          f"pass --steps N with N > {state.step + 1} to train further")
    fsdp = cfg.trainer.workers > 0
    if (state.backend == "fsdp") != fsdp:
        raise ConfigError(f"the checkpoint in {out} was written by "
                          + (f"{state.world_size} FSDP trainer worker(s): resume with --trainers N (any N >= 1)"
                             if state.backend == "fsdp" else "the single-process trainer: resume with --trainers 0"))
    return state


def _connect_ray(cfg: RunConfig) -> bool:
    """Join the cluster (or start a local Ray) when the run uses one, before any model loads; True if connected here.

    A local Ray gives each CPU trainer worker a logical CPU of its own beside the cores the env runners use, as the
    driver's training shared the cores with them before; more CPU trainer workers than cores is refused.
    """
    T, R = cfg.trainer, cfg.rollout
    if T.workers == 0 and R.runners == 0 and T.gpus_per_engine == 0 and not T.colocate:
        return False
    cores = os.cpu_count() or 1
    cpu_trainers = T.workers if T.gpus_per_worker == 0 else 0
    if R.ray_address is None and cpu_trainers > cores:
        raise ConfigError(f"more workers than devices: --trainers {T.workers} on CPU needs a core per worker and this "
                          f"machine has {cores}. Use --trainers {cores} or fewer, or --ray-address a bigger cluster")
    return start_ray(R.ray_address, num_cpus=cores + cpu_trainers)


def _plan_memory(cfg: RunConfig, policy: LoadedModel, kv_cache_gib: float) -> MemoryPlan:
    """Decide gradient checkpointing and refuse a step that cannot fit (per trainer worker), before anything starts.

    The limit: `loss.memory_limit_gb` when set; else the memory available here, shared by the CPU trainer workers
    and the driver's engine copy on a local run. GPU memory (and the memory of other nodes) is only known on the
    workers: set `loss.memory_limit_gb` to have it checked here.
    """
    L, R, T = cfg.loss, cfg.rollout, cfg.trainer
    limit = int(L.memory_limit_gb * 2**30)
    if not limit and T.workers and (T.gpus_per_worker > 0 or R.ray_address):
        limit = 1 << 62
    elif not limit and T.workers:
        import psutil

        limit = psutil.virtual_memory().available // (T.workers + 1)
    engine_bytes = 0
    if R.engine == "vllm" and R.engines == 1 and not R.ray_address:  # an in-process vLLM engine stays resident
        n_params = sum(p.numel() for p in policy.model.parameters())
        engine_dtype_bytes = torch.finfo(getattr(torch, R.engine_dtype or cfg.dtype)).bits // 8
        engine_bytes = int(kv_cache_gib * 2**30) + n_params * engine_dtype_bytes + VLLM_RUNTIME_BYTES
    return plan_training_memory(
        policy.model, dtype_bytes=torch.finfo(getattr(torch, cfg.dtype)).bits // 8, token_budget=L.micro_batch_tokens,
        longest_sample=R.max_context_tokens + R.max_new_tokens, checkpointing=L.gradient_checkpointing,
        engine_copy=T.workers == 0 and (R.sync_every > 1 or R.async_rollout), limit_bytes=limit,
        shards=max(T.workers, 1), engine_bytes=engine_bytes)


def _reserve_placement(cfg: RunConfig) -> Placement | None:
    """Reserve the trainer workers' and GPU engines' devices (None for neither); refuses what the cluster cannot hold.

    Engines enter the placement group when they own GPUs (``--gpus-per-engine``) or share the trainers' ones
    (``--colocate``); CPU engines are not scheduled by CPU count, so env runners still fit beside them.
    """
    T, R = cfg.trainer, cfg.rollout
    engines = R.engines if T.gpus_per_engine > 0 or T.colocate else 0
    if T.workers == 0 and engines == 0:
        return None
    return Placement(PlacementPlan(T.workers, T.gpus_per_worker, engines, T.gpus_per_engine, T.colocate))


def _build_backend(cfg: RunConfig, policy: LoadedModel, source: str, memory: MemoryPlan,
                   placement: Placement | None) -> TrainingBackend:
    """The training backend the config asks for (its workers go where `placement` reserved)."""
    T, opt = cfg.trainer, cfg.optim
    if T.workers == 0:
        return SingleProcessBackend(policy, lr=opt.lr, betas=opt.betas, weight_decay=opt.weight_decay,
                                    gradient_checkpointing=memory.gradient_checkpointing,
                                    compute_dtype=compute_dtype_of(cfg.trainer.compute_dtype))
    spec = WorkerSpec(source, dtype=cfg.dtype, lr=opt.lr, betas=opt.betas, weight_decay=opt.weight_decay,
                      param_dtype=T.param_dtype or None, reduce_dtype=T.reduce_dtype or None,
                      compute_dtype=T.compute_dtype or None,
                      gradient_checkpointing=memory.gradient_checkpointing, use_gpu=T.gpus_per_worker > 0,
                      seed=cfg.seed)
    return FSDPBackend(spec, T.workers, placement)


def is_single_turn(env: TextEnv) -> bool:
    """True when every episode of `env` ends after one step (``max_episode_steps == 1``)."""
    return getattr(env, "max_episode_steps", None) == 1


def single_turn_context(cfg: RunConfig, policy: LoadedModel) -> int:
    """The longest context (prompt + reply) an episode of a single-turn env reaches, for sizing the engines' KV.

    The longest first prompt of the first step's tasks, with a quarter more for tasks not seen, plus one reply, within
    the context budget. Multi-turn runs size for the budget itself (``max_context_tokens + max_new_tokens``): sizing
    single-turn math that way gave vLLM a 5.7 GiB cache that pushed the training step into gradient checkpointing
    (30% slower) for nothing.
    """
    from agentrl.chat.context import ChatContext

    R = cfg.rollout
    options = cfg.context.rollout_kwargs(policy.family)
    longest = 0
    with contextlib.closing(agentrl.make(cfg.env.id, **cfg.env.kwargs)) as env:
        for i in range(R.prompts_per_step):
            obs, info = env.reset(seed=cfg.env.seed_offset + i)
            context = ChatContext(policy.tokenizer, env.system_prompt, options["chat_kwargs"],
                                  **options["context_options"])
            longest = max(longest, len(context.first_prompt(obs, info)))
    return min(R.max_context_tokens + R.max_new_tokens, longest + longest // 4 + R.max_new_tokens)


def rollout_kv_cache_gib(cfg: RunConfig, policy: LoadedModel, available_bytes: int | None = None,
                         context_tokens: int = 0) -> tuple[float, str]:
    """Each engine's KV cache (vLLM) or prefix store (HF) in GiB, and a note when it cannot hold the whole rollout.

    ``rollout.engine_kv_cache_gib`` when set; else sized so that every episode in flight on an engine (a step's
    ``prompts_per_step x group_size``, twice that with async rollouts, spread over the replicas) stays cached at its
    longest context (`agentrl.engine.kv_cache.size_kv_cache`): `context_tokens`, or the context budget when 0.
    Smaller, engines evict and re-prefill whole contexts.
    """
    import math

    from agentrl.engine.kv_cache import size_kv_cache

    R = cfg.rollout
    if R.engine_kv_cache_gib > 0:
        return R.engine_kv_cache_gib, ""
    episodes = math.ceil(R.prompts_per_step * R.group_size * (2 if R.async_rollout else 1) / R.engines)
    if available_bytes is None and R.engines > 1 and not R.ray_address:
        import psutil

        available_bytes = psutil.virtual_memory().available // R.engines  # local replicas share this machine
    return size_kv_cache(policy.model.config, torch.finfo(getattr(torch, R.engine_dtype or cfg.dtype)).bits // 8,
                         episodes, context_tokens or R.max_context_tokens + R.max_new_tokens, available_bytes)


def _build_rollout(cfg: RunConfig, policy: LoadedModel, backend: TrainingBackend, out: Path, start_step: int,
                   kv_cache_gib: float, placement: Placement | None, show) -> RolloutScheduler:
    """The inference engine and the rollout scheduler around it (runner pool, sync interval or async producer)."""
    R = cfg.rollout
    # The rollout engine(s) own their weights; the scheduler hands them the trained weights by version. Lockstep on
    # one process may share the training module instead (free sync). MoE rollouts carry the experts the engine
    # chose: R3 replays them, the other modes measure router agreement.
    spec = EngineSpec(kind=R.engine, dtype=R.engine_dtype or cfg.dtype, batch_size=R.engine_batch_size,
                      capture_routes=backend.is_moe, kv_cache_gib=kv_cache_gib, seed=cfg.seed,
                      max_model_len=R.max_context_tokens + R.max_new_tokens, sleep_mode=cfg.trainer.colocate)
    share = backend.trains_in_place and R.sync_every == 1 and not R.async_rollout
    try:
        engine = build_engines(spec, policy, replicas=R.engines, ray_address=R.ray_address, share_module=share,
                               version=start_step,
                               placement=placement if placement is not None and placement.plan.engines else None)
    except EngineError as e:
        raise TrainingError(str(e)) from None
    sampling = SamplingParams(temperature=R.temperature, top_p=R.top_p, top_k=R.top_k,
                              max_new_tokens=R.max_new_tokens, seed=cfg.seed)
    chat_kwargs = cfg.context.chat_kwargs()
    # The settings this run trains with, beside the model's official ones: `agentrl eval` shows both.
    (out / "sampling.json").write_text(json.dumps(
        sampling.__dict__ | {"chat_kwargs": chat_kwargs, "model_generation_config": policy.generation_config},
        default=list))
    # Rollouts: the runner pool, the sync interval or async producer, policy versions (see agentrl.rollout.scheduler).
    return RolloutScheduler(
        cfg.env.id, cfg.env.kwargs, engine, backend.named_weights, policy.tokenizer,
        seeds_for_step=lambda s: [cfg.env.seed_offset + s * R.prompts_per_step + i for i in range(R.prompts_per_step)],
        sampling_for_step=lambda s: sampling if sampling.seed is None else replace(sampling, seed=cfg.seed + s),
        group_size=R.group_size, runners=R.runners, runner_actors=R.runner_actors, ray_address=R.ray_address,
        step_timeout=R.step_timeout, max_episode_retries=R.max_episode_retries, sync_every=R.sync_every,
        async_rollout=R.async_rollout, max_staleness=R.max_staleness, start_step=start_step, stop_step=cfg.steps,
        rollout_kwargs=dict(
            max_turns=R.max_turns, max_context_tokens=R.max_context_tokens,
            **cfg.context.rollout_kwargs(policy.family),  # the same context `agentrl eval` rebuilds from config.yaml
        ),
        interrupted_path=out / "trajectories.jsonl" if cfg.save_trajectories else None,
        progress=show, sleep_between_rollouts=cfg.trainer.colocate,
    )


def release_weights(policy: LoadedModel) -> None:
    """Free the driver's copy of the weights (the module moves to the meta device; config and tokenizer stay).

    With trainer workers the driver needs the weights only to start the engines: afterwards the workers hold the
    trained ones and the engines their own, and a third full replica in the driver (4 bytes a parameter in float32:
    28 GB for a 7B model) would only cost memory.
    """
    policy.model.to("meta")


def _pad_id(tokenizer) -> int:
    """The id that pads micro-batches (never trained on: the loss mask is 0 there)."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def restore_checkpoint(out: Path, backend: TrainingBackend) -> int | None:
    """Load the weights and the optimizer state of `out/checkpoint` into `backend` together.

    The engines get them at their next sync.

    Returns:
        The step the checkpoint holds, or None when there is none.
    """
    folder = checkpoint_folder(out)
    if not (folder / "trainer_state.json").exists():
        return None
    backend.load(folder)  # weights and optimizer state: a rollback must not keep the collapsed run's moments
    return read_trainer_state(folder).step


def set_up(cfg: RunConfig, *, resume: bool, overwrite: bool, show) -> Run:
    """Check the config, load the model, build the backend, the engine and the rollout scheduler.

    Everything that can be refused is refused here, before a step runs and before an earlier run's files change.
    """
    out = _prepare_output(cfg, resume, overwrite)
    torch.manual_seed(cfg.seed)
    dtype = getattr(torch, cfg.dtype)
    # The env: fail fast on an unknown id or bad kwargs, before loading a model.
    agentrl.spec(cfg.env.id)
    try:
        with contextlib.closing(agentrl.make(cfg.env.id, **cfg.env.kwargs)) as probe:
            single_turn = is_single_turn(probe)
    except (TypeError, ValueError, OSError) as e:  # the env's own message names the bad argument
        raise ConfigError(f"bad arguments for env {cfg.env.id!r} {dict(cfg.env.kwargs)}: {e}") from None

    state = _resume_state(cfg, out) if resume else None
    with contextlib.ExitStack() as undo:  # a set-up that fails half way releases what it had built
        owns_ray = _connect_ray(cfg)
        undo.callback(_disconnect_ray, owns_ray)
        placement = _reserve_placement(cfg)
        if placement is not None:
            undo.callback(placement.close)
        source = str(checkpoint_folder(out)) if resume else cfg.model
        policy = load_model(source, dtype=dtype)
        policy.name = cfg.model
        # The cheapest context layout that stays correct (one training sample per episode wherever the template
        # allows), resolved once and saved in config.yaml so that `agentrl eval` rebuilds the same prompts.
        context, why = cfg.context.resolved(agentrl.spec(cfg.env.id).load(), policy.tokenizer, policy.family)
        if context != cfg.context:
            show({"context": f"observations as {context.observation_role} messages ({why})"})
            cfg = dataclasses.replace(cfg, context=context)
        # `auto` becomes the engine this machine serves the model with, once, saved in config.yaml like the context.
        kind, why = choose_engine(cfg.rollout.engine, policy.model, cfg.model)
        if kind != cfg.rollout.engine:
            show({"engine": f"{kind} ({why})"})
            cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, engine=kind))
        # Memory: decide gradient checkpointing and refuse a step that cannot fit, before any worker or rollout.
        # The engines' KV memory first (it stays resident beside an in-process trainer), then the step's plan.
        kv_gib, kv_note = rollout_kv_cache_gib(
            cfg, policy, context_tokens=single_turn_context(cfg, policy) if single_turn else 0)
        if kv_note:
            show({"kv_cache": kv_note})
        backend = _build_backend(cfg, policy, source, _plan_memory(cfg, policy, kv_gib), placement)
        undo.callback(backend.close)
        shuffle = torch.Generator().manual_seed(cfg.seed)
        routing = routing_strategy(cfg.loss.routing_replay, backend.is_moe, cfg.model)
        if state is not None:
            backend.load(checkpoint_folder(out))
            state.restore_rng(shuffle)
        # Only now, with every setting checked, may a new run replace what an earlier run left in the folder.
        if not resume:
            for stale in ("metrics.jsonl", "trajectories.jsonl"):
                (out / stale).unlink(missing_ok=True)
        (out / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))

        start_step = state.step + 1 if state is not None else 0
        scheduler = _build_rollout(cfg, policy, backend, out, start_step, kv_gib, placement, show)
        if not backend.trains_in_place:
            release_weights(policy)
        undo.pop_all()  # from here on `Run.close` releases them
    G = cfg.guard
    return Run(cfg, out, policy, backend, routing, scheduler, CollapseGuard(G.entropy_min, G.k3_max, G.patience,
               G.action), shuffle, start_step, placement, owns_ray, objective=build_loss_options(cfg),
               reference=load_reference(cfg, getattr(torch, cfg.dtype)))


def carries_gradient(sample: Sample) -> bool:
    """Whether any of the sample's loss tokens has a nonzero advantage.

    Every policy loss here is the advantage times a function of the log-probs (ratios, clips and corrections
    included), so without a KL or entropy term a sample whose loss tokens all have advantage 0 adds exactly 0 to the
    gradient: the base model's first WebShop step (every episode scores 0) trains nothing.
    """
    advantages = sample.token_advantages or (sample.advantage,) * len(sample.input_ids)
    return any(a != 0.0 for a, m in zip(advantages, sample.loss_mask) if m)


def gradient_members(samples: list[Sample], members: list[int]) -> list[int]:
    """The members whose forward and backward can change the update: those that carry a gradient.

    When none does, the shortest member stays, so that the optimizer step still sees the zero gradients it would
    have seen (AdamW moves weights with zero gradients, through its moments and weight decay, and skips
    parameters without any).
    """
    kept = [i for i in members if carries_gradient(samples[i])]
    return kept or [min(members, key=lambda i: len(samples[i].input_ids))]


def _micro_batches(samples: list[Sample], members, cfg: RunConfig) -> list[list[int]]:
    """Sample indices per micro-batch: longest first, packed to the token budget (see `pack_by_tokens`)."""
    return pack_by_tokens([len(s.input_ids) for s in samples], members, cfg.loss.micro_batch_tokens,
                          cfg.loss.micro_batch_size)


def build_loss_options(cfg: RunConfig) -> LossOptions:
    """The run's loss options, built once.

    Dr.GRPO's constant divisor defaults to the configured maximum response length (tokens per model call), the same
    for every micro-batch whatever its padded width.
    """
    options = dict(cfg.loss.options)
    if loss_options(cfg.loss.name, **options).agg == "seq-mean-token-sum-norm":
        budgets = (cfg.rollout.max_new_tokens, *cfg.context.max_new_tokens_by_turn)
        options.setdefault("loss_scale_factor", float(max(budgets)))
    return loss_options(cfg.loss.name, **options)


def as_trained(trajectories: list[Trajectory], step: int) -> list[Trajectory]:
    """The trajectories as step `step` trains them: recording the step, with group ids unique within the step.

    A rollout numbers its groups from 0, so a step that trains on rollouts of several policy versions (async mode)
    would otherwise merge unrelated groups in the advantage baseline and the mini-batch split.
    """
    ids: dict[tuple[int, int], int] = {}
    return [replace(t, train_step=step, group_id=ids.setdefault((t.policy_version, t.group_id), len(ids)))
            for t in trajectories]


@torch.no_grad()
def reference_logprobs(reference: ReferencePolicy, samples: list[Sample], pad_id: int,
                       cfg: RunConfig) -> dict[int, torch.Tensor]:
    """The reference's log-probs of every sample's next tokens, per sample index `[len - 1]` (one no-grad pass)."""
    out: dict[int, torch.Tensor] = {}
    for idx in _micro_batches(samples, range(len(samples)), cfg):
        logp, _ = token_logprobs(reference.model, collate([samples[i] for i in idx], pad_id),
                                 compute_dtype=compute_dtype_of(cfg.trainer.compute_dtype))
        out |= {i: logp[row, : len(samples[i].input_ids) - 1] for row, i in enumerate(idx)}
    return out


def kl_penalty_per_trajectory(trajectories: list[Trajectory], ref_logp: dict[int, torch.Tensor],
                              loss: LossConfig) -> torch.Tensor:
    """The KL reward penalty of every trajectory `[N_traj]`: coef * sum_t k(log mu, log pi_ref) over its tokens.

    `ref_logp` is indexed like the samples `trajectory_to_samples` makes of the trajectories, in order. The rollout's
    own log-probs stand for the sampling policy (pi_old = mu up to the training-inference mismatch).
    """
    penalties, index = [], 0
    for traj in trajectories:
        total = 0.0
        for s in trajectory_to_samples(traj, 0.0, per_turn=loss.per_turn_samples):
            mu = torch.tensor(s.rollout_logprobs[1:], dtype=torch.float32)[None]  # [1, T]
            mask = torch.tensor(s.loss_mask[1:], dtype=torch.bool)[None]  # [1, T]
            total += float(kl_reward_penalty(mu, ref_logp[index][None], mask, loss.kl_reward_coef,
                                             loss.kl_reward_estimator))
            index += 1
        penalties.append(total)
    return torch.tensor(penalties)


def make_samples(run: Run, trajectories: list[Trajectory],
                 pad_id: int) -> tuple[list[Sample], torch.Tensor, dict[int, torch.Tensor], dict[str, float]]:
    """Advantages within each group of episodes of the same task, then one sample per prefix-consistent run.

    One advantage per turn (equal within an episode for the episode-level estimators, per step for GiGPO). With a
    reference model, it scores the sampled tokens first (its log-probs come back per sample index), and with a KL
    reward penalty each episode's reward pays coef * sum_t k(mu, pi_ref) before the advantages.

    Returns:
        The samples, the rewards `[N_traj]` (before any penalty), the reference log-probs and extra metrics.
    """
    L = run.cfg.loss
    rewards = torch.tensor([t.total_return for t in trajectories], dtype=torch.float32)  # [N_traj]
    ref_logp: dict[int, torch.Tensor] = {}
    extra: dict[str, float] = {}
    if run.reference is not None:
        # The samples' token layout does not depend on the advantages: score it before they exist.
        layout = [s for t in trajectories for s in trajectory_to_samples(t, 0.0, per_turn=L.per_turn_samples)]
        ref_logp = reference_logprobs(run.reference, layout, pad_id, run.cfg)
        extra["ref_model_bytes"] = run.reference.memory_bytes
    if L.kl_reward_coef > 0:
        penalty = kl_penalty_per_trajectory(trajectories, ref_logp, L)  # [N_traj]
        trajectories = [replace(t, total_return=t.total_return - p) for t, p in zip(trajectories, penalty.tolist())]
        extra["kl_reward_penalty_mean"] = float(penalty.mean())
    budget = max((run.cfg.rollout.max_new_tokens, *run.cfg.context.max_new_tokens_by_turn))
    trajectories, in_loss = _overlong_and_dynamic_sampling(trajectories, L, budget, extra)
    samples: list[Sample] = []
    for traj, adv, keep in zip(trajectories, turn_advantages(L.advantage, trajectories, L.advantage_options), in_loss):
        if keep:
            samples += trajectory_to_samples(traj, adv, per_turn=L.per_turn_samples)
    return samples, rewards, ref_logp, extra


def _overlong_and_dynamic_sampling(trajectories: list[Trajectory], L: LossConfig, budget: int,
                                   extra: dict[str, float]) -> tuple[list[Trajectory], list[bool]]:
    """DAPO's overlong treatment and dynamic sampling: the rewards advantages see, and which episodes train.

    An episode counts as overlong when one of its replies stopped at the per-turn budget; its length is its longest
    reply. Left-out episodes still take part in their group's baseline (their reward was real), only their tokens
    leave the loss.
    """
    keep = [True] * len(trajectories)
    if L.overlong.get("mode", "none") != "none":
        config = OverlongConfig(**({"max_length": budget} | dict(L.overlong)))
        rewards = torch.tensor([t.total_return for t in trajectories], dtype=torch.float32)  # [N]
        lengths = torch.tensor([max((len(x.generated_ids) for x in t.turns), default=0) for t in trajectories])
        cut = torch.tensor([any(x.finish_reason == "length" for x in t.turns) for t in trajectories])  # [N]
        new_rewards, mask = apply_overlong(rewards, lengths, cut, torch.ones(len(trajectories), 1), config)
        trajectories = [replace(t, total_return=float(r)) for t, r in zip(trajectories, new_rewards.tolist())]
        keep = [k and bool(m) for k, m in zip(keep, mask[:, 0].tolist())]
        extra["overlong_frac"] = float(cut.float().mean()) if trajectories else 0.0
    if L.dynamic_sampling:
        rewards = torch.tensor([t.total_return for t in trajectories], dtype=torch.float32)
        informative = informative_groups(rewards, torch.tensor([t.group_id for t in trajectories]))
        keep = [k and bool(i) for k, i in zip(keep, informative.tolist())]
        extra["uninformative_frac"] = 1.0 - float(informative.float().mean()) if trajectories else 0.0
    return trajectories, keep


OldPolicy = tuple[dict[int, torch.Tensor] | None, float | None, list[list[int]]]
"""What step 4 gives the updates: log pi_old per sample (None: the update pass's own, detached), the mean entropy
over loss tokens (None: the update pass reports it) and the step's micro-batches."""


def bypass_old_policy(run: Run, samples: list[Sample], pad_id: int) -> OldPolicy:
    """Bypass mode: pi_old = mu, the rollout's own log-probs; no pass runs (the entropy comes from the updates)."""
    run.routing.begin_step(len(samples))
    old_logp = {i: torch.tensor(s.rollout_logprobs[1:], dtype=torch.float32) for i, s in enumerate(samples)}
    return old_logp, None, _micro_batches(samples, range(len(samples)), run.cfg)


def update_is_old_policy(run: Run, samples: list[Sample], pad_id: int) -> OldPolicy:
    """pi_old = the update pass's own log-probs, detached; no pass runs and the updates report the entropy.

    Exact with one optimizer step per rollout: the update's forward runs on the weights a recompute pass would score.
    """
    run.routing.begin_step(len(samples))
    return None, None, _micro_batches(samples, range(len(samples)), run.cfg)


def score_old_policy(run: Run, samples: list[Sample], pad_id: int) -> OldPolicy:
    """pi_old: the trainer's log-probs of the sampled tokens before any update, and the mean entropy.

    Returns per sample its `[len - 1]` log-probs, the entropy averaged over loss tokens, and the micro-batches.
    The rollout's own log-probs (mu) stay as they were: the importance weight pi_old / mu corrects any
    train-inference mismatch.
    """
    chunks = _micro_batches(samples, range(len(samples)), run.cfg)
    run.routing.begin_step(len(samples))
    requests = [run.routing.score_request(idx, [samples[i] for i in idx], collate([samples[i] for i in idx], pad_id))
                for idx in chunks]
    old_logp: dict[int, torch.Tensor] = {}
    entropy_sum, entropy_tokens = 0.0, 0.0
    for idx, request, scored in zip(chunks, requests, run.backend.score(requests)):
        run.routing.scored(idx, [samples[i] for i in idx], request.batch, scored)
        old_logp |= {i: scored.logp[row, : len(samples[i].input_ids) - 1] for row, i in enumerate(idx)}
        entropy_sum += float((scored.entropy * request.batch.loss_mask).sum())
        entropy_tokens += float(request.batch.loss_mask.sum())
    return old_logp, entropy_sum / max(entropy_tokens, 1.0), chunks


def choose_old_policy(loss: LossConfig, routing: DenseRouting) -> Callable[[Run, list[Sample], int], OldPolicy]:
    """Step 4, chosen once per run.

    Bypass (pi_old = mu); the update's own log-probs (``old_policy_pass: auto`` with one mini-batch and a routing
    strategy that does not read the pass); or the recompute pass.
    """
    if loss.bypass:
        return bypass_old_policy
    if loss.old_policy_pass == "auto" and loss.n_minibatches == 1 and not routing.needs_old_policy_pass:
        return update_is_old_policy
    return score_old_policy


def update_policy(run: Run, samples: list[Sample], old_logp: dict[int, torch.Tensor] | None,
                  ref_logp: dict[int, torch.Tensor], pad_id: int,
                  step: int) -> tuple[list[LossResult], list[float], int]:
    """One optimizer step per mini-batch of whole groups, accumulated over micro-batches.

    Every micro-batch's loss divides by the whole mini-batch's counts, so neither the micro-batch size nor the
    number of trainer workers changes the gradient. Without a KL or entropy term in the loss, samples with no
    nonzero advantage skip their passes (`gradient_members`): the gradient is the same, and the update's metrics
    (and, without a pi_old pass, the entropy) cover the samples that were trained on.

    Returns:
        The micro-batches' results, the gradient norm of each optimizer step, and the samples skipped.
    """
    L = run.cfg.loss
    results: list[LossResult] = []
    grad_norms: list[float] = []
    skipped = 0
    exact_skip = run.objective.kl_coef == 0 and run.objective.entropy_coef == 0
    groups = torch.tensor([s.group_id for s in samples])
    for members in minibatch_indices(groups, L.n_minibatches, generator=run.shuffle):
        members = members.tolist()
        # The update pass computes the entropy when the loss trains on it (bonus) or no pi_old pass did.
        objective = PolicyObjective(functools.partial(policy_loss, L.name, opts=run.objective), len(members),
                                    sum(samples[i].num_loss_tokens for i in members),
                                    with_entropy=run.objective.entropy_coef > 0 or L.bypass or old_logp is None,
                                    entropy_grad=run.objective.entropy_coef > 0)
        trained = gradient_members(samples, members) if exact_skip else members
        skipped += len(members) - len(trained)
        chunks = _micro_batches(samples, trained, run.cfg)
        requests = []
        for idx in chunks:
            chunk = [samples[i] for i in idx]
            mb = collate(chunk, pad_id)
            width = mb.loss_mask.shape[1]
            mb_old = None if old_logp is None else torch.stack(
                [F.pad(old_logp[i], (0, width - len(old_logp[i]))) for i in idx])  # [n, T]
            request = run.routing.update_request(idx, chunk, mb, mb_old)
            if ref_logp:  # KL to the reference in the loss
                request = replace(request, ref_logp=torch.stack([F.pad(ref_logp[i], (0, width - len(ref_logp[i])))
                                                                 for i in idx]))  # [n, T]
            requests.append(request)
        done = run.backend.accumulate(requests, objective)
        for idx, request, result in zip(chunks, requests, done):
            if not result.finite:
                bad = run.out / f"bad_batch_step{step}.pt"
                torch.save({"samples": [samples[i] for i in idx], "logp": result.logp, "old_logp": request.old_logp,
                            "metrics": result.metrics}, bad)
                raise TrainingError(f"non-finite loss ({result.metrics.get('loss')}) at step {step}; the batch is "
                                    f"saved in {bad}")
        results += done
        norm = run.backend.step(run.cfg.optim.grad_clip)
        if math.isfinite(norm):
            grad_norms.append(norm)
    return results, grad_norms, skipped


def train(cfg: RunConfig, *, resume: bool = False, overwrite: bool = False, progress: bool = True) -> Path:
    """Run RL training as configured; returns the run folder.

    Args:
        cfg: the run config. Its `output` folder receives metrics.jsonl, trajectories.jsonl, curves.png,
            config.yaml and checkpoint/.
        resume: continue from `cfg.output/checkpoint` (weights, optimizer, step, data order) up to `cfg.steps`.
        overwrite: replace a run already saved in `cfg.output` (otherwise that is an error: no run is lost silently).
        progress: show a progress bar.
    """
    from tqdm import tqdm

    if not cfg.output:
        cfg = dataclasses.replace(cfg, output=str(default_run_dir(cfg)))
    # One progress line: the rollout's live counters (episodes, env steps/s, tok/s, errors) beside the last step's
    # reward, so neither overwrites the other.
    postfix: dict[str, str] = {}
    bar = None  # the async producer may report before the bar exists

    def show(fields: dict[str, str]) -> None:
        postfix.update(fields)
        if progress and bar is not None:
            bar.set_postfix(postfix)

    try:
        run = set_up(cfg, resume=resume, overwrite=overwrite, show=show)
    except (ClusterError, RoutingReplayError) as e:
        raise TrainingError(str(e)) from None
    except TrainerFailure as e:
        raise TrainingError(f"the trainer workers could not start: {e}") from None
    out, pad_id, step = run.out, _pad_id(run.policy.tokenizer), run.start_step
    old_policy = choose_old_policy(run.cfg.loss, run.routing)
    metrics_file = out / "metrics.jsonl"
    try:
        bar = tqdm(range(run.start_step, cfg.steps), initial=run.start_step, total=cfg.steps, disable=not progress,
                   desc=f"{cfg.env.id} x {cfg.model}", unit="step")
        for step in bar:
            t_start = time.perf_counter()

            # 1. Rollout (complete groups only: a group whose env kept failing is dropped whole and counted).
            rollout = run.scheduler.rollout(step)
            trajectories = as_trained(rollout.trajectories, step)
            t_rollout = time.perf_counter() - t_start
            if cfg.save_trajectories:
                save_trajectories(trajectories, out / "trajectories.jsonl")
            if not trajectories:
                bar.write(f"step {step}: no complete group ({rollout.stats.dropped_groups} dropped); "
                          f"last failure: {rollout.stats.failures[-1] if rollout.stats.failures else 'none'}")
                continue

            # 2-3. Advantages (per turn; after the KL reward penalty when there is one) and samples.
            samples, rewards, ref_logp, objective_metrics = make_samples(run, trajectories, pad_id)
            if not samples:  # the overlong filter or dynamic sampling left every episode out: nothing to learn
                bar.write(f"step {step}: every episode was left out of the loss ({objective_metrics}); no update")
                # The rollout still happened and belongs in the curves: without its row, the steps where every
                # group failed alike vanish from metrics.jsonl and the success curve reads too high.
                append_metrics(metrics_file, {
                    "step": step, **rollout_metrics(trajectories, rewards), **objective_metrics, "samples": 0,
                    "update_skipped": 1.0, "rollout_seconds": t_rollout, "step_seconds": time.perf_counter() - t_start,
                } | rollout.stats.metrics() | staleness_metrics(step, trajectories))
                continue

            # 4. pi_old and the entropy, before any update (routed as the Routing Replay strategy says); bypass
            #    mode takes pi_old = mu instead, and with one mini-batch the update's own log-probs stand for it.
            old_logp, entropy, micro_batches = old_policy(run, samples, pad_id)

            # 5. Updates, then the engines sample from the new weights.
            results, grad_norms, skipped = update_policy(run, samples, old_logp, ref_logp, pad_id, step)
            run.scheduler.updated(step)  # async mode: the engine samples from the new weights from now on

            # 6. Metrics.
            step_seconds = time.perf_counter() - t_start
            losses = weighted_mean(results)
            if entropy is None:  # the update pass's entropy (pi_theta = pi_old in the first mini-batch)
                entropy = losses["policy_entropy"]
            metrics = {
                "step": step, **rollout_metrics(trajectories, rewards), "entropy": entropy,
                **losses, **objective_metrics,
                "grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else float("nan"),
                "samples": len(samples), "samples_without_gradient": skipped, "micro_batches": len(micro_batches),
                "update_micro_batches": len(results), "update_skipped": 0.0,
                "padding_waste": padding_waste([len(s.input_ids) for s in samples], micro_batches),
                **run.routing.metrics(),
                "rollout_seconds": t_rollout, "step_seconds": step_seconds,
                # The share of the step the engine spent generating (async: capped, generation overlaps training).
                "engine_busy_frac": min(1.0, rollout.stats.generate_seconds / step_seconds),
            }
            metrics |= rollout.stats.metrics() | staleness_metrics(step, trajectories)
            metrics["stale_groups_evicted"] = float(run.scheduler.buffer.evicted)
            append_metrics(metrics_file, metrics)
            show({"reward": f"{metrics['reward_mean']:.2f}", "success": f"{metrics['success_rate']:.2f}",
                  "kl_k3": f"{metrics.get('kl_k3', 0):.1e}"})

            # 7. The collapse guard judges the step, then the checkpoint: with the guard on, only healthy steps are
            #    saved, so the checkpoint is always one a rollback may return to (a save due on a bad step waits).
            verdict = run.guard.update(metrics, step=step) if cfg.guard.enabled else None
            run.save_due = run.save_due or (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps
            if run.save_due and (verdict is None or verdict.healthy):
                run.save(step)
                run.save_due = False
            elif run.save_due:
                bar.write(f"step {step} not checkpointed: {verdict.reason}; the checkpoint keeps the last healthy "
                          f"step")
            if verdict is not None and not verdict.ok:
                if cfg.guard.action == "rollback":
                    good = run.restore()
                    if good is None:
                        plot_curves(metrics_file, out / "curves.png")
                        raise TrainingError(f"collapse guard at step {step}: {verdict.reason}; no healthy checkpoint "
                                            f"to roll back to yet (lower save_every)")
                    run.scheduler.updated(step)  # async mode: the engine samples from the restored weights
                    run.guard.reset()
                    bar.write(f"collapse guard: {verdict.reason}; rolled back to step {good} (weights and optimizer "
                              f"state of {out / CHECKPOINT})")
                    continue
                plot_curves(metrics_file, out / "curves.png")
                raise TrainingError(f"collapse guard stopped the run at step {step}: {verdict.reason}")
        bar.close()
    except TrainerFailure as e:
        last = read_trainer_state(out / CHECKPOINT).step if (out / CHECKPOINT / "trainer_state.json").exists() else None
        where = (f"the checkpoint of step {last} in {out / CHECKPOINT} is intact: continue with "
                 f"`agentrl run --resume {out}`") if last is not None else "no checkpoint was saved yet"
        raise TrainingError(f"{e} (step {step}); {where}") from None
    finally:
        run.close()
    plot_curves(metrics_file, out / "curves.png")
    return out
