"""Set-up of an RL run: check the config, resolve the plan once, build every subsystem from its section and the plan.

Everything that can be refused is refused here, before a step runs and before an earlier run's files change. The
order matters: Ray before any model loads (trainer workers and engines reserve devices), the model before the plan
(the engine choice, the context and the memory plan read it), the plan before the backend and the engines.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import yaml

import agentrl
from agentrl.chat.context import ChatContext
from agentrl.chat.layout import resolve_context
from agentrl.cluster import choose_address, start_ray
from agentrl.config import ConfigError, RunConfig, config_to_dict
from agentrl.engine import EngineError, EngineSpec, SamplingParams, build_engines, choose_engine
from agentrl.engine.kv_cache import size_kv_cache
from agentrl.env import TextEnv
from agentrl.models import LoadedModel, load_model
from agentrl.objective import CollapseGuard
from agentrl.plan import RunPlan
from agentrl.recipes.stops import claim_sigterm
from agentrl.rollout.scheduler import RolloutScheduler
from agentrl.trackers import RunLog, clear_tracker_files
from agentrl.training.allocator import run_threshold_kb
from agentrl.training.backend import TrainingBackend
from agentrl.training.checkpoint import (
    CHECKPOINT,
    TrainerState,
    checkpoint_folder,
    read_trainer_state,
    save_checkpoint,
)
from agentrl.training.factory import build_backend
from agentrl.training.lora import ADAPTER_CONFIG, adapter_parameter_count, add_lora, load_adapter_into
from agentrl.training.memory import VLLM_RUNTIME_BYTES, MemoryPlan, plan_training_memory
from agentrl.training.placement import RESOURCE_SHARE, Placement, PlacementPlan, check_node_resources
from agentrl.training.precision import resolve_compute_dtype
from agentrl.training.reference import load_reference
from agentrl.training.routing_replay import routing_strategy
from agentrl.training.step import MISMATCH_KL, TrainingError, TrainingStep
from agentrl.training.token_values import TOKEN_VALUES

__all__ = ["Run", "set_up", "resolve_plan", "default_engine_dtype", "rollout_kv_cache_gib", "single_turn_context",
           "is_single_turn"]


@dataclass
class Run:
    """Everything a run holds once set up: built and checked, nothing trained yet (torchtune's recipe state)."""

    cfg: RunConfig
    """The config with its `auto` choices replaced by the plan's (as saved in config.yaml)."""
    plan: RunPlan
    out: Path
    policy: LoadedModel
    """The driver's model: its tokenizer and chat family, and its module for the one-process backend (which trains
    it in place). With trainer workers its weights are released once the engines have started from them: the workers
    own the trained weights and the scheduler syncs the engines from `backend.named_weights`."""
    backend: TrainingBackend
    step: TrainingStep
    scheduler: RolloutScheduler
    guard: CollapseGuard
    start_step: int
    log: RunLog
    """Where each step's metrics row goes: metrics.jsonl and the trackers of `log.trackers`."""
    placement: Placement | None = None
    owns_ray: bool = False
    save_due: bool = False
    """A checkpoint fell on an unhealthy step and waits for a healthy one."""
    restarts: int = 0
    """Times this run restarted its trainer workers after one died (``trainer.max_restarts`` bounds it)."""
    failed_steps: int = 0
    """Steps in a row whose every group was dropped (``runners.max_failed_steps`` bounds it)."""

    def save(self, step: int) -> Path:
        """Checkpoint after `step` (see `agentrl.training.checkpoint`)."""
        state = TrainerState.capture(step, self.backend.name, self.backend.world_size, self.step.shuffle)
        return save_checkpoint(self.out, self.backend, self.policy, state)

    def restore(self) -> int | None:
        """Load the weights and the optimizer state of the checkpoint together; the step it holds, or None if none."""
        return restore_checkpoint(self.out, self.backend)

    def close(self, *, keep_ray: bool = False) -> None:
        """Finish the trackers, stop the scheduler and trainer workers, and Ray if started here (unless `keep_ray`)."""
        self.log.close()
        self.scheduler.close()
        self.backend.close()
        if self.placement is not None:
            self.placement.close()
        _disconnect_ray(self.owns_ray and not keep_ray)


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


def _disconnect_ray(owns_ray: bool) -> None:
    if owns_ray:
        import ray

        ray.shutdown()


def prepare_output(cfg: RunConfig, resume: bool, overwrite: bool) -> Path:
    """The run folder, created; refuses to replace a run unless asked to (nothing is lost silently)."""
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


def resume_state(cfg: RunConfig, out: Path) -> TrainerState:
    """The trainer state of the checkpoint to resume from, checked against the run asked for."""
    ckpt = checkpoint_folder(out)
    if not (ckpt / "trainer_state.json").exists():
        raise TrainingError(f"nothing to resume in {out}: no {CHECKPOINT}/trainer_state.json")
    state = read_trainer_state(ckpt)
    if state.step + 1 >= cfg.steps:
        raise ConfigError(f"{out} already holds {state.step + 1} trained step(s) and the run asks for {cfg.steps}: "
                          f"pass --steps N with N > {state.step + 1} to train further")
    if (state.backend == "fsdp") != (cfg.trainer.workers > 0):
        raise ConfigError(f"the checkpoint in {out} was written by "
                          + (f"{state.world_size} FSDP trainer worker(s): resume with --trainers N (any N >= 1)"
                             if state.backend == "fsdp" else "the single-process trainer: resume with --trainers 0"))
    if (ckpt / ADAPTER_CONFIG).exists() != cfg.trainer.lora.enabled:
        raise ConfigError(f"the checkpoint in {out} holds " + (
            "a LoRA adapter: resume with the trainer.lora settings it was trained with" if cfg.trainer.lora.rank == 0
            else "full weights, not a LoRA adapter: resume without trainer.lora.rank (or start a new run from "
                 f"--model {ckpt} with LoRA)"))
    return state


def connect_ray(cfg: RunConfig) -> bool:
    """Join the cluster (or start a local Ray) when the run uses one, before any model loads; True if connected here.

    A local Ray gives each CPU trainer worker a logical CPU of its own beside the cores the env runners use, as the
    driver's training shared the cores with them before; more CPU trainer workers than cores is refused.
    """
    T, E = cfg.trainer, cfg.engine
    if T.workers == 0 and cfg.runners.count == 0 and E.gpus == 0 and not E.colocate and not E.ray_resource:
        return False
    cores = os.cpu_count() or 1
    cpu_trainers = T.workers if T.gpus_per_worker == 0 else 0
    if cfg.ray_address is None and cpu_trainers > cores:
        raise ConfigError(f"more workers than devices: --trainers {T.workers} on CPU needs a core per worker and this "
                          f"machine has {cores}. Use --trainers {cores} or fewer, or --ray-address a bigger cluster")
    return start_ray(cfg.ray_address, num_cpus=cores + cpu_trainers)


def reserve_placement(cfg: RunConfig) -> Placement | None:
    """Reserve the trainer workers' and GPU engines' devices (None for neither); refuses what the cluster cannot hold.

    Engines enter the placement group when they own GPUs (``engine.gpus``) or share the trainers' ones
    (``engine.colocate``); CPU engines are not scheduled by CPU count, so env runners still fit beside them (an
    ``engine.ray_resource`` they ask for is checked here all the same).
    """
    T, E = cfg.trainer, cfg.engine
    engines = E.replicas if E.gpus > 0 or E.colocate else 0
    if E.ray_resource and not engines:
        import ray

        check_node_resources({E.ray_resource: "engine.ray_resource"}, ray.cluster_resources())
    if T.workers == 0 and engines == 0:
        return None
    return Placement(PlacementPlan(T.workers, T.gpus_per_worker, engines, E.gpus, E.colocate,
                                   trainer_resource=T.ray_resource, engine_resource=E.ray_resource))


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
    options = cfg.context.rollout_kwargs(policy.family)
    budget = cfg.context.max_context_tokens + cfg.sampling.max_new_tokens
    longest = 0
    with contextlib.closing(agentrl.make(cfg.env.id, **cfg.env.kwargs)) as env:
        for i in range(cfg.scheduler.prompts_per_step):
            obs, info = env.reset(seed=cfg.env.seed_offset + i)
            context = ChatContext(policy.tokenizer, env.system_prompt, options["chat_kwargs"],
                                  **options["context_options"])
            longest = max(longest, len(context.first_prompt(obs, info)))
    return min(budget, longest + longest // 4 + cfg.sampling.max_new_tokens)


def rollout_kv_cache_gib(cfg: RunConfig, policy: LoadedModel, available_bytes: int | None = None,
                         context_tokens: int = 0) -> tuple[float, str]:
    """Each engine's KV cache (vLLM) or prefix store (HF) in GiB, and a note when it cannot hold the whole rollout.

    ``engine.kv_cache_gib`` when set; else sized so that every episode in flight on an engine (a step's
    ``prompts_per_step x group_size``, twice that with async rollouts, spread over the replicas) stays cached at its
    longest context (`agentrl.engine.kv_cache.size_kv_cache`): `context_tokens`, or the context budget when 0.
    Smaller, engines evict and re-prefill whole contexts.
    """
    E, S = cfg.engine, cfg.scheduler
    if E.kv_cache_gib > 0:
        return E.kv_cache_gib, ""
    episodes = math.ceil(S.prompts_per_step * S.group_size * (2 if S.async_rollout else 1) / E.replicas)
    if available_bytes is None and E.replicas > 1 and not cfg.ray_address:
        import psutil

        available_bytes = psutil.virtual_memory().available // E.replicas  # local replicas share this machine
    return size_kv_cache(policy.model.config, torch.finfo(getattr(torch, E.dtype or cfg.trainer.dtype)).bits // 8,
                         episodes, context_tokens or cfg.context.max_context_tokens + cfg.sampling.max_new_tokens,
                         available_bytes)


def default_engine_dtype(dtype: str, kind: str, compute_dtype: str) -> str:
    """The engine precision a run samples in: `dtype` when set; else bfloat16 for vLLM, the trainer's compute dtype.

    vLLM's bfloat16 build samples 1.4-1.7x faster on CPU, and MiniRL's token-level IS weights correct the mismatch
    it brings (KL(mu || pi_old) about 2e-3 on the main job); the main job learned from it within the float32 runs'
    held-out range (docs/results.md, the mismatch study). The HF engine samples from the trainer's own module (or a
    copy of it) in the precision the trainer computes in.
    """
    return dtype or ("bfloat16" if kind == "vllm" else compute_dtype)


def plan_memory(cfg: RunConfig, policy: LoadedModel, engine_kind: str, kv_cache_gib: float) -> MemoryPlan:
    """Decide gradient checkpointing and refuse a step that cannot fit (per trainer worker), before anything starts.

    The limit: `trainer.memory_limit_gb` when set; else the memory available here, shared by the CPU trainer workers
    and the driver's engine copy on a local run. GPU memory (and the memory of other nodes) is only known on the
    workers: set `trainer.memory_limit_gb` to have it checked here.
    """
    T, E, S = cfg.trainer, cfg.engine, cfg.scheduler
    limit = int(T.memory_limit_gb * 2**30)
    if not limit and T.workers and (T.gpus_per_worker > 0 or cfg.ray_address):
        limit = 1 << 62
    elif not limit and T.workers:
        import psutil

        limit = psutil.virtual_memory().available // (T.workers + 1)
    engine_bytes = 0
    if engine_kind == "vllm" and E.replicas == 1 and not cfg.ray_address:  # an in-process vLLM engine stays resident
        n_params = sum(p.numel() for p in policy.model.parameters())
        engine_dtype_bytes = torch.finfo(getattr(torch, E.dtype or T.dtype)).bits // 8
        engine_bytes = int(kv_cache_gib * 2**30) + n_params * engine_dtype_bytes + VLLM_RUNTIME_BYTES
    return plan_training_memory(
        policy.model, dtype_bytes=torch.finfo(getattr(torch, T.dtype)).bits // 8, token_budget=T.micro_batch_tokens,
        longest_sample=cfg.context.max_context_tokens + cfg.sampling.max_new_tokens,
        checkpointing=T.gradient_checkpointing, engine_copy=T.workers == 0 and (S.sync_every > 1 or S.async_rollout),
        limit_bytes=limit, shards=max(T.workers, 1), engine_bytes=engine_bytes,
        trainable_params=adapter_parameter_count(policy.model.config, T.lora) if T.lora.enabled else None)


def engine_takes_adapters(cfg: RunConfig, engine_kind: str) -> bool:
    """True when the run's engine(s) can load LoRA adapters, so the weight sync ships the adapters alone.

    The in-process HF engine samples from a copy of the adapted module (or the module itself); the in-process vLLM
    engine loads the base once and each version's adapter through vLLM's LoRA support (ranks up to 512). Engine
    actors load a Hugging Face folder and take full weights: with LoRA the sync merges the adapters and ships every
    weight.
    """
    in_process = cfg.engine.replicas == 1 and not cfg.ray_address and cfg.engine.gpus == 0 and not cfg.engine.colocate
    return in_process and (engine_kind == "hf" or engine_kind == "vllm" and cfg.trainer.lora.rank <= 512)


def lora_plan(cfg: RunConfig, policy: LoadedModel, engine_kind: str) -> tuple[str, bool]:
    """The plan's LoRA line and whether the sync ships the adapters alone ('' and False without LoRA)."""
    L = cfg.trainer.lora
    if not L.enabled:
        return "", False
    trainable = adapter_parameter_count(policy.model.config, L)
    total = sum(p.numel() for p in policy.model.parameters())
    adapters = engine_takes_adapters(cfg, engine_kind)
    sync = ("weight sync ships the adapters alone" if adapters else
            f"the {engine_kind} engine{'s' if cfg.engine.replicas > 1 else ''} here cannot take adapters: every sync "
            f"merges them and ships the full weights")
    return (f"rank {L.rank}, alpha {L.scale_alpha:g} on {', '.join(L.target_modules)}: {trainable / 1e6:.2f}M "
            f"trainable parameters ({100 * trainable / total:.2f}% of {total / 1e6:.0f}M); {sync}"), adapters


def resolve_plan(cfg: RunConfig, policy: LoadedModel, *, single_turn: bool, owns_ray: bool,
                 placement: Placement | None, ray_why: str = "") -> tuple[RunConfig, RunPlan, MemoryPlan]:
    """Every `auto` of the config decided once: the context, the engine, the KV size and the memory plan.

    `ray_why` says how the cluster was chosen (`agentrl.cluster.choose_address`), for the plan's ``ray`` row.

    Returns:
        The config with the engine kind and the observation role written in (what config.yaml saves, so `agentrl
        eval` and `--resume` rebuild the same prompts and engine), the plan, and the memory plan the backend is built
        with.
    """
    # The cheapest context layout that stays correct (one training sample per episode wherever the template allows).
    context, context_why = resolve_context(cfg.context, agentrl.spec(cfg.env.id).load(), policy.tokenizer,
                                           policy.family)
    context_why = context_why if context != cfg.context else ""
    # `auto` becomes the engine this machine serves the model with.
    kind, engine_why = choose_engine(cfg.engine.kind, policy.model, cfg.model)
    # `auto` compute precision becomes what this machine multiplies natively (written back: a resume keeps it).
    compute = resolve_compute_dtype(cfg.trainer.compute_dtype, cfg.trainer.dtype,
                                    on_gpu=cfg.trainer.gpus_per_worker > 0)
    cfg = replace(cfg, context=context, trainer=replace(cfg.trainer, compute_dtype=compute.dtype),
                  engine=replace(cfg.engine, kind=kind,
                                 dtype=default_engine_dtype(cfg.engine.dtype, kind, compute.dtype)))
    role = context.observation_role
    # The engines' KV memory first (it stays resident beside an in-process trainer), then the step's memory plan.
    context_tokens = (single_turn_context(cfg, policy) if single_turn
                      else cfg.context.max_context_tokens + cfg.sampling.max_new_tokens)
    kv_gib, kv_note = rollout_kv_cache_gib(cfg, policy, context_tokens=context_tokens if single_turn else 0)
    memory = plan_memory(cfg, policy, kind, kv_gib)
    lora_line, adapters = lora_plan(cfg, policy, kind)
    T = cfg.trainer
    plan = RunPlan(
        engine=kind, engine_why=engine_why, engine_dtype=cfg.engine.dtype or T.dtype,
        engine_replicas=cfg.engine.replicas, observation_role=role, context_why=context_why,
        context_tokens=context_tokens, kv_cache_gib=kv_gib, kv_note=kv_note,
        trainer="fsdp" if T.workers else "single", trainer_workers=T.workers, dtype=T.dtype,
        compute_dtype=compute.dtype, compute_why=compute.why,
        gradient_checkpointing=memory.gradient_checkpointing, peak_gib=memory.estimate.total / 2**30,
        limit_gib=memory.limit / 2**30,
        ray="none" if not (owns_ray or cfg.ray_address) else (cfg.ray_address or "local"),
        ray_why=ray_why if owns_ray or cfg.ray_address else "",
        placement=placement.plan.describe() if placement is not None else "", lora=lora_line, sync_adapters=adapters,
        returns_freed_memory=run_threshold_kb(T.return_freed_memory, memory.gradient_checkpointing) > 0)
    return cfg, plan, memory


def build_rollout(cfg: RunConfig, plan: RunPlan, policy: LoadedModel, backend: TrainingBackend, out: Path,
                  start_step: int, placement: Placement | None, show) -> RolloutScheduler:
    """The inference engines and the rollout scheduler around them (runner pool, sync interval or async producer)."""
    # The rollout engine(s) own their weights; the scheduler hands them the trained weights by version. Lockstep on
    # one process may share the training module instead (free sync). MoE rollouts carry the experts the engine
    # chose: R3 replays them, the other modes measure router agreement.
    spec = EngineSpec(kind=plan.engine, dtype=plan.engine_dtype, batch_size=cfg.engine.batch_size,
                      capture_routes=backend.is_moe, kv_cache_gib=plan.kv_cache_gib, seed=cfg.seed,
                      max_model_len=cfg.context.max_context_tokens + cfg.sampling.max_new_tokens,
                      sleep_mode=cfg.engine.colocate, vllm=cfg.engine.vllm,
                      lora=cfg.trainer.lora if plan.sync_adapters and plan.engine == "vllm" else None)
    share = backend.trains_in_place and cfg.scheduler.sync_every == 1 and not cfg.scheduler.async_rollout
    try:
        engine = build_engines(spec, policy, replicas=cfg.engine.replicas, ray_address=cfg.ray_address,
                               share_module=share, version=start_step,
                               placement=placement if placement is not None and placement.plan.engines else None,
                               resources={cfg.engine.ray_resource: RESOURCE_SHARE} if cfg.engine.ray_resource else None)
    except EngineError as e:
        raise TrainingError(str(e)) from None
    sampling = SamplingParams(temperature=cfg.sampling.temperature, top_p=cfg.sampling.top_p,
                              top_k=cfg.sampling.top_k, max_new_tokens=cfg.sampling.max_new_tokens, seed=cfg.seed)
    # The settings this run trains with, beside the model's official ones: `agentrl eval` shows both.
    (out / "sampling.json").write_text(json.dumps(
        sampling.__dict__ | {"chat_kwargs": cfg.context.chat_kwargs(),
                             "model_generation_config": policy.generation_config}, default=list))
    if cfg.agent.function:  # agents written against the OpenAI API play the episodes (agentrl.serve.agents)
        return _agent_rollout(cfg, policy, backend, engine, sampling, out, start_step)
    return RolloutScheduler.from_config(
        env=cfg.env, scheduler=cfg.scheduler, runners=cfg.runners, context=cfg.context, sampling=sampling,
        engine=engine, weights=backend.adapter_weights if plan.sync_adapters else backend.named_weights,
        tokenizer=policy.tokenizer, family=policy.family,
        ray_address=cfg.ray_address, start_step=start_step, stop_step=cfg.steps,
        interrupted_path=out / "trajectories.jsonl" if cfg.save_trajectories else None, progress=show,
        sleep_between_rollouts=cfg.engine.colocate,
        # Screenshots are named by the episode's line in trajectories.jsonl: without that file, none are taken.
        screenshots=cfg.screenshots_per_step if cfg.save_trajectories else 0)


def _agent_rollout(cfg: RunConfig, policy: LoadedModel, backend: TrainingBackend, engine, sampling: SamplingParams,
                   out: Path, start_step: int):
    """The rollout of an ``--agent`` run: the agent function in sessions of an in-process policy server."""
    from agentrl.rollout.pool import EnvMaker
    from agentrl.serve.agents import AgentRollout, load_agent, load_rows

    A, per_step = cfg.agent, cfg.scheduler.prompts_per_step
    try:
        fn = load_agent(A.function)
        rows = load_rows(A.dataset) if A.dataset else None
    except ConfigError:
        engine.close()
        raise
    return AgentRollout(
        fn, engine, backend.named_weights, policy.tokenizer,
        maker=None if rows is not None else EnvMaker(cfg.env.id, dict(cfg.env.kwargs)), rows=rows,
        seeds_for_step=lambda s: [cfg.env.seed_offset + s * per_step + i for i in range(per_step)],
        sampling_for_step=lambda s: sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + s),
        group_size=cfg.scheduler.group_size, concurrency=A.concurrency, timeout=A.timeout,
        max_retries=cfg.runners.max_episode_retries, sync_every=cfg.scheduler.sync_every, start_step=start_step,
        max_context_tokens=cfg.context.max_context_tokens + cfg.sampling.max_new_tokens,
        family=cfg.context.chat_family, family_hint=policy.family, chat_kwargs=cfg.context.chat_kwargs(),
        model_name=cfg.model, sessions_path=out / "agent_sessions.jsonl")


def record_nodes(out: Path, backend: TrainingBackend, scheduler: RolloutScheduler) -> dict[str, object]:
    """Where a cluster run's processes live, by Ray node id, saved as ``out/nodes.json``.

    Keys: ``driver`` (one id), then ``trainers``, ``engines`` and ``runners`` (one id per worker, replica or runner
    process; the driver's id for a role that runs in the driver).
    """
    import ray

    driver = ray.get_runtime_context().get_node_id()
    where: dict[str, object] = {"driver": driver}
    for role, part in (("trainers", backend), ("engines", scheduler.engine), ("runners", scheduler.pool)):
        nodes = getattr(part, "nodes", None)
        try:
            where[role] = nodes() if nodes is not None else [driver]
        except Exception as e:  # a process still starting past the wait: the record says so, the run goes on
            where[role] = f"unknown ({type(e).__name__})"
    (out / "nodes.json").write_text(json.dumps(where, indent=1))
    return where


def release_weights(policy: LoadedModel) -> None:
    """Free the driver's copy of the weights (the module moves to the meta device; config and tokenizer stay).

    With trainer workers the driver needs the weights only to start the engines: afterwards the workers hold the
    trained ones and the engines their own, and a third full replica in the driver (4 bytes a parameter in float32:
    28 GB for a 7B model) would only cost memory.
    """
    policy.model.to("meta")


def set_up(cfg: RunConfig, *, resume: bool, overwrite: bool, show, announce, restart: bool = False) -> Run:
    """Check the config, load the model, resolve the plan, build the backend, the engines and the scheduler.

    Args:
        cfg: the run's config.
        resume: continue from the run folder's checkpoint.
        overwrite: replace a run already in the run folder.
        restart: the same run starting again after its trainer workers died: the folder's records (metrics,
            trajectories) stay, even with no checkpoint to resume from.
        show: ``fields -> None``: live numbers for the progress line.
        announce: ``text -> None``: says the plan once, before the first step.
    """
    out = prepare_output(cfg, resume, overwrite)
    torch.manual_seed(cfg.seed)
    # The env: fail fast on an unknown id or bad kwargs, before loading a model.
    agentrl.spec(cfg.env.id)
    try:
        with contextlib.closing(agentrl.make(cfg.env.id, **cfg.env.kwargs)) as probe:
            single_turn = is_single_turn(probe)
    except (TypeError, ValueError, OSError) as e:  # the env's own message names the bad argument
        raise ConfigError(f"bad arguments for env {cfg.env.id!r} {dict(cfg.env.kwargs)}: {e}") from None

    if cfg.agent.function:  # a wrong --agent is answered before a model loads
        from agentrl.serve.loader import load_agent

        load_agent(cfg.agent.function)
    state = resume_state(cfg, out) if resume else None
    # A `ray job submit` driver joins the job's cluster (RAY_ADDRESS) as --ray-address would: engines and trainers
    # become actors there. config.yaml keeps what was asked, so a resume in another job joins that job's cluster.
    asked_ray, cluster = cfg.ray_address, choose_address(cfg.ray_address)
    cfg = replace(cfg, ray_address=cluster.address)
    if cluster.source == "RAY_ADDRESS":  # start_ray, given the address, says only where it joins
        cluster.say()
    with contextlib.ExitStack() as undo:  # a set-up that fails half way releases what it had built
        owns_ray = connect_ray(cfg)
        claim_sigterm()  # ray.init gave SIGTERM to Ray's C++ handler, which prints a stack dump: take it back
        undo.callback(_disconnect_ray, owns_ray)
        placement = reserve_placement(cfg)
        if placement is not None:
            undo.callback(placement.close)
        # A LoRA run resumes from its base model: the checkpoint's adapter is loaded into it with the optimizer state.
        source = str(checkpoint_folder(out)) if resume and not cfg.trainer.lora.enabled else cfg.model
        policy = load_model(source, dtype=getattr(torch, cfg.trainer.dtype))
        policy.name = cfg.model
        cfg, plan, memory = resolve_plan(cfg, policy, single_turn=single_turn, owns_ray=owns_ray,
                                         placement=placement, ray_why=cluster.why)
        announce(plan)
        backend = build_backend(cfg.trainer, cfg.optim, memory, policy=policy, source=source, placement=placement,
                                seed=cfg.seed)
        undo.callback(backend.close)
        shuffle = torch.Generator().manual_seed(cfg.seed)
        routing = routing_strategy(cfg.loss.routing_replay, backend.is_moe, cfg.model)
        if state is not None:
            backend.load(checkpoint_folder(out))
            state.restore_rng(shuffle)
        # Only now, with every setting checked, may a new run replace what an earlier run left in the folder.
        if not resume and not restart:
            for stale in ("metrics.jsonl", "trajectories.jsonl", TOKEN_VALUES):
                (out / stale).unlink(missing_ok=True)
            clear_tracker_files(out)
        (out / "config.yaml").write_text(yaml.safe_dump(config_to_dict(replace(cfg, ray_address=asked_ray)),
                                                        sort_keys=False))
        plan.save(out)
        log = RunLog.open(out, cfg.log.trackers, config_to_dict(cfg), project=cfg.log.project,
                          run_name=cfg.log.run_name, table_episodes=cfg.log.table_episodes,
                          resume=resume or restart)  # a restarted run continues its tracker runs
        undo.callback(log.close)

        start_step = state.step + 1 if state is not None else 0
        if cfg.trainer.lora.enabled and not backend.trains_in_place:
            # The engines start from the driver's model: give it the workers' adapters (the checkpoint's on resume;
            # fresh ones compute the base model, whatever their A), so adapter syncs find their names there.
            add_lora(policy.model, cfg.trainer.lora)
            if state is not None:
                load_adapter_into(policy.model, checkpoint_folder(out))
        scheduler = build_rollout(cfg, plan, policy, backend, out, start_step, placement, show)
        if cfg.ray_address:
            record_nodes(out, backend, scheduler)
        if not backend.trains_in_place:
            release_weights(policy)
        undo.pop_all()  # from here on `Run.close` releases them
    pad_id = policy.tokenizer.pad_token_id
    step = TrainingStep(
        backend=backend, routing=routing, loss=cfg.loss, advantage=cfg.advantage, optim=cfg.optim,
        trainer=cfg.trainer, per_turn_budget=max((cfg.sampling.max_new_tokens, *cfg.context.max_new_tokens_by_turn)),
        pad_id=pad_id if pad_id is not None else policy.tokenizer.eos_token_id, shuffle=shuffle, out=out,
        reference=load_reference(cfg.model, cfg.loss, getattr(torch, cfg.trainer.compute_dtype)))
    G = cfg.guard
    guard = CollapseGuard(G.entropy_min, G.k3_max, G.patience, G.action, kl_key=MISMATCH_KL)
    return Run(cfg, plan, out, policy, backend, step, scheduler, guard, start_step, log, placement, owns_ray)
