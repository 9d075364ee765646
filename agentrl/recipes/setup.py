"""Set-up of an RL run: check the config, resolve the plan once, build every subsystem from its section and the plan.

Everything that can be refused is refused here, before a step runs and before an earlier run's files change. The
order matters: Ray before any model loads (trainer workers and engines reserve devices), the model before the plan
(the engine choice, the context and the memory plan read it), the plan before the backend and the engines.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import yaml

import agentrl
from agentrl.cluster import choose_address, connect_ray
from agentrl.config import ConfigError, RunConfig, config_to_dict
from agentrl.curriculum import Curriculum, CurriculumError
from agentrl.engine import EngineError, SamplingParams, build_engines
from agentrl.envs.registry import difficulty_of
from agentrl.models import LoadedModel, load_model
from agentrl.objective import CollapseGuard
from agentrl.recipes.plan import ClusterPlan, RunPlan, plan_run
from agentrl.recipes.stops import claim_sigterm
from agentrl.rewards.judge import JUDGE_CACHE, JudgeReward, rubric_and_key
from agentrl.rollout.driver import RolloutDriver
from agentrl.rollout.plan import is_single_turn
from agentrl.rollout.scheduler import RolloutScheduler
from agentrl.trackers.runlog import RunLog, clear_tracker_files
from agentrl.training.backend import TrainingBackend
from agentrl.training.checkpoint import (
    CHECKPOINT,
    TrainerState,
    checkpoint_folder,
    read_trainer_state,
    save_checkpoint,
)
from agentrl.training.factory import build_backend
from agentrl.training.lora import ADAPTER_CONFIG, add_lora, load_adapter_into
from agentrl.training.placement import RESOURCE_SHARE, Placement, reserve_placement
from agentrl.training.reference import load_reference
from agentrl.training.routing_replay import routing_strategy
from agentrl.training.step import MISMATCH_KL, TrainingError, TrainingStep
from agentrl.training.token_values import TOKEN_VALUES

__all__ = ["Run", "set_up", "restore_checkpoint", "prepare_output", "resume_state", "build_curriculum", "build_rollout"]


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
    scheduler: RolloutDriver
    guard: CollapseGuard
    start_step: int
    log: RunLog
    """Where each step's metrics row goes: metrics.jsonl and the trackers of `log.trackers`."""
    placement: Placement | None = None
    owns_ray: bool = False
    save_due: bool = False
    """A checkpoint fell on an unhealthy step and waits for a healthy one."""
    unhealthy: str = ""
    """Why the collapse guard judged the last update unhealthy ("" = healthy, or no update judged yet): the weights
    as they stand are that update's until the next one, so a step that trains nothing does not save them either."""
    restarts: int = 0
    """Times this run restarted its trainer workers after one died (``trainer.max_restarts`` bounds it)."""
    failed_steps: int = 0
    """Steps in a row whose every group was dropped (``runners.max_failed_steps`` bounds it)."""
    curriculum: Curriculum | None = None
    """The run's task-sampling policy, which the scheduler draws each step's tasks from (None with ``--agent``); its
    state goes into every checkpoint."""

    def save(self, step: int) -> Path:
        """Checkpoint after `step` (see `agentrl.training.checkpoint`)."""
        curriculum = self.curriculum.state_dict(step) if self.curriculum is not None else None
        state = TrainerState.capture(step, self.backend.name, self.backend.world_size, self.step.shuffle, curriculum)
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


def build_curriculum(cfg: RunConfig, state: TrainerState | None) -> Curriculum | None:
    """The run's curriculum (None for agent rollouts), continuing the checkpoint's state when resuming.

    Raises:
        ConfigError: a policy the env cannot play (one that needs levels on an env that declares none).
    """
    if cfg.agent.function:  # agent rollouts play the step's tasks in seed order (the config refuses other policies)
        return None
    try:
        levels = difficulty_of(cfg.env.id, cfg.env.kwargs)
    except ValueError as e:  # an env argument that narrows the levels names one the env does not have
        raise ConfigError(f"env.kwargs.{e}") from None
    try:
        curriculum = Curriculum.for_env(cfg.curriculum.policy, cfg.curriculum.options, env_id=cfg.env.id,
                                        levels=levels, seed_offset=cfg.env.seed_offset,
                                        prompts_per_step=cfg.scheduler.prompts_per_step, max_turns=cfg.env.max_turns,
                                        run_seed=cfg.seed)
    except CurriculumError as e:
        raise ConfigError(f"curriculum: {e}") from None
    if state is not None:
        try:
            curriculum.load_state_dict(state.curriculum)
        except (CurriculumError, KeyError, TypeError, ValueError) as e:  # e.g. a level this run's env no longer offers
            now = ", ".join(levels.levels) if levels is not None else "none"
            raise ConfigError(f"curriculum: the checkpoint's curriculum state does not fit this run ({e}; this run's "
                              f"levels: {now}); resume with the env.kwargs and curriculum settings it was saved "
                              f"with, or start a new run") from None
    return curriculum


def build_rollout(cfg: RunConfig, plan: RunPlan, policy: LoadedModel, backend: TrainingBackend, out: Path,
                  start_step: int, placement: Placement | None, show,
                  curriculum: Curriculum | None = None) -> RolloutDriver:
    """The inference engines and the rollout scheduler around them (runner pool, sync interval or async producer)."""
    # The rollout engine(s) own their weights; the scheduler hands them the trained weights by version. Lockstep on
    # one process may share the training module instead (free sync). MoE rollouts carry the experts the engine
    # chose: R3 replays them, the other modes measure router agreement.
    spec = plan.engine.spec(cfg.engine, seed=cfg.seed, capture_routes=backend.is_moe, sleep_mode=cfg.engine.colocate,
                            lora=cfg.trainer.lora)
    # Judged rewards (None without reward.judge): the cache and the spent budget live in the run folder, so a resume
    # does not pay again. Read before the engines start, so that a cache it cannot read stops nothing half-built.
    judge = JudgeReward.from_config(cfg.reward, out)
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
    if cfg.agent.function:  # agents written against the OpenAI API play the episodes (agentrl.rollout.agents)
        from agentrl.rollout.agents import AgentRollout  # the OpenAI front end (FastAPI) only for --agent runs

        return AgentRollout.from_config(
            agent=cfg.agent, env=cfg.env, scheduler=cfg.scheduler, runners=cfg.runners, context=cfg.context,
            sampling=sampling, engine=engine, weights=backend.named_weights, tokenizer=policy.tokenizer,
            family_hint=policy.family, model_name=cfg.model, start_step=start_step,
            max_context_tokens=cfg.context.max_context_tokens + cfg.sampling.max_new_tokens,
            sessions_path=out / "agent_sessions.jsonl")
    return RolloutScheduler.from_config(
        env=cfg.env, scheduler=cfg.scheduler, runners=cfg.runners, context=cfg.context, sampling=sampling,
        engine=engine, weights=backend.adapter_weights if plan.sync_adapters else backend.named_weights,
        tokenizer=policy.tokenizer, family=policy.family,
        ray_address=cfg.ray_address, start_step=start_step, stop_step=cfg.steps,
        interrupted_path=out / "trajectories.jsonl" if cfg.save_trajectories else None, progress=show,
        sleep_between_rollouts=cfg.engine.colocate,
        # Screenshots are named by the episode's line in trajectories.jsonl: without that file, none are taken.
        screenshots=cfg.screenshots_per_step if cfg.save_trajectories else 0, judge=judge, curriculum=curriculum)


def record_nodes(out: Path, backend: TrainingBackend, scheduler: RolloutDriver) -> dict[str, object]:
    """Where a cluster run's processes live, by Ray node id, saved as ``out/nodes.json``.

    Keys: ``driver`` (one id), then ``trainers``, ``engines`` and ``runners`` (one id per worker, replica or runner
    process; the driver's id for a role that runs in the driver).
    """
    import ray

    driver = ray.get_runtime_context().get_node_id()
    where: dict[str, object] = {"driver": driver}
    # An agent rollout has no runner pool: its envs run in the driver.
    engine, pool = getattr(scheduler, "engine", None), getattr(scheduler, "pool", None)
    for role, part in (("trainers", backend), ("engines", engine), ("runners", pool)):
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


def check_before_loading(cfg: RunConfig, *, resume: bool, overwrite: bool) -> tuple[Path, bool, TrainerState | None]:
    """Refuse what can be refused before a model loads: the folder, the env and its arguments, ``--agent``, a resume.

    Returns:
        The run folder (created), whether the env is single-turn (the engines' KV sizing reads it), and the
        checkpoint's trainer state when resuming (else None).
    """
    out = prepare_output(cfg, resume, overwrite)
    agentrl.spec(cfg.env.id)
    try:
        with contextlib.closing(agentrl.make(cfg.env.id, **cfg.env.kwargs)) as probe:
            single_turn = is_single_turn(probe)
    except (TypeError, ValueError, OSError) as e:  # the env's own message names the bad argument
        raise ConfigError(f"bad arguments for env {cfg.env.id!r} {dict(cfg.env.kwargs)}: {e}") from None
    if cfg.agent.function:
        from agentrl.rollout.agent_loader import load_agent

        load_agent(cfg.agent.function)
    if cfg.reward.judge.enabled:
        rubric_and_key(cfg.reward.judge)  # a rubric file or an API key that is not there, before a model loads
    return out, single_turn, resume_state(cfg, out) if resume else None


def open_records(cfg: RunConfig, plan: RunPlan, out: Path, *, fresh: bool, asked_ray: str | None) -> RunLog:
    """Write config.yaml and plan.json, and open the metrics log and trackers; a fresh run first clears old records.

    Called only once every setting is checked: nothing an earlier run left in the folder is lost to a refused run.
    config.yaml keeps the cluster address as asked (`asked_ray`), so a resume in another job joins that job's cluster.
    """
    if fresh:
        for stale in ("metrics.jsonl", "trajectories.jsonl", TOKEN_VALUES, JUDGE_CACHE):
            (out / stale).unlink(missing_ok=True)
        clear_tracker_files(out)
    (out / "config.yaml").write_text(yaml.safe_dump(config_to_dict(replace(cfg, ray_address=asked_ray)),
                                                    sort_keys=False))
    plan.save(out)
    return RunLog.open(out, cfg.log.trackers, config_to_dict(cfg), project=cfg.log.project, run_name=cfg.log.run_name,
                       table_episodes=cfg.log.table_episodes, resume=not fresh)  # a restart continues its trackers


def training_step(cfg: RunConfig, policy: LoadedModel, backend: TrainingBackend, routing, shuffle: torch.Generator,
                  out: Path) -> TrainingStep:
    """The step's objective over the backend, from the loss, advantage, optimizer and trainer sections."""
    pad_id = policy.tokenizer.pad_token_id
    return TrainingStep(
        backend=backend, routing=routing, loss=cfg.loss, advantage=cfg.advantage, optim=cfg.optim,
        trainer=cfg.trainer, per_turn_budget=max((cfg.sampling.max_new_tokens, *cfg.context.max_new_tokens_by_turn)),
        pad_id=pad_id if pad_id is not None else policy.tokenizer.eos_token_id, shuffle=shuffle, out=out,
        reference=load_reference(cfg.model, cfg.loss, getattr(torch, cfg.trainer.compute_dtype)))


def set_up(cfg: RunConfig, *, resume: bool, overwrite: bool, show, announce, restart: bool = False) -> Run:
    """Check the config, load the model, resolve the plan, build the backend, the engines and the scheduler.

    The order matters: everything checkable before the model loads; Ray and the devices before the model (workers
    and engines reserve them); the model before the plan; the plan before the parts; the run folder's records only
    once every setting is checked.

    Args:
        cfg: the run's config.
        resume: continue from the run folder's checkpoint.
        overwrite: replace a run already in the run folder.
        restart: the same run starting again after its trainer workers died: the folder's records (metrics,
            trajectories) stay, even with no checkpoint to resume from.
        show: ``fields -> None``: live numbers for the progress line.
        announce: ``text -> None``: says the plan once, before the first step.
    """
    torch.manual_seed(cfg.seed)
    out, single_turn, state = check_before_loading(cfg, resume=resume, overwrite=overwrite)
    curriculum = build_curriculum(cfg, state)  # before the scheduler: an async producer draws seeds at once
    # A `ray job submit` driver joins the job's cluster (RAY_ADDRESS) as --ray-address would: engines and trainers
    # become actors there.
    asked_ray, cluster = cfg.ray_address, choose_address(cfg.ray_address)
    cfg = replace(cfg, ray_address=cluster.address)
    if cluster.source == "RAY_ADDRESS":  # start_ray, given the address, says only where it joins
        cluster.say()
    with contextlib.ExitStack() as undo:  # a set-up that fails half way releases what it had built
        owns_ray = connect_ray(cfg.trainer, cfg.engine, runners=cfg.runners.count, address=cfg.ray_address)
        claim_sigterm()  # ray.init gave SIGTERM to Ray's C++ handler, which prints a stack dump: take it back
        undo.callback(_disconnect_ray, owns_ray)
        placement = reserve_placement(cfg.trainer, cfg.engine)
        if placement is not None:
            undo.callback(placement.close)
        # A LoRA run resumes from its base model: the checkpoint's adapter is loaded into it with the optimizer state.
        source = str(checkpoint_folder(out)) if resume and not cfg.trainer.lora.enabled else cfg.model
        policy = load_model(source, dtype=getattr(torch, cfg.trainer.dtype))
        policy.name = cfg.model
        joined = owns_ray or bool(cfg.ray_address)
        cfg, plan = plan_run(cfg, policy, single_turn=single_turn, cluster=ClusterPlan(
            ray=(cfg.ray_address or "local") if joined else "none", why=cluster.why if joined else "",
            placement=placement.plan.describe() if placement is not None else ""))
        announce(plan)
        backend = build_backend(cfg.trainer, cfg.optim, plan.trainer, policy=policy, source=source,
                                placement=placement, seed=cfg.seed)
        undo.callback(backend.close)
        shuffle = torch.Generator().manual_seed(cfg.seed)
        routing = routing_strategy(cfg.loss.routing_replay, backend.is_moe, cfg.model)
        if state is not None:
            backend.load(checkpoint_folder(out))
            state.restore_rng(shuffle)
        log = open_records(cfg, plan, out, fresh=not resume and not restart, asked_ray=asked_ray)
        undo.callback(log.close)
        start_step = state.step + 1 if state is not None else 0
        if cfg.trainer.lora.enabled and not backend.trains_in_place:
            # The engines start from the driver's model: give it the workers' adapters (the checkpoint's on resume;
            # fresh ones compute the base model, whatever their A), so adapter syncs find their names there.
            add_lora(policy.model, cfg.trainer.lora)
            if state is not None:
                load_adapter_into(policy.model, checkpoint_folder(out))
        scheduler = build_rollout(cfg, plan, policy, backend, out, start_step, placement, show, curriculum)
        if cfg.ray_address:
            record_nodes(out, backend, scheduler)
        if not backend.trains_in_place:
            release_weights(policy)
        undo.pop_all()  # from here on `Run.close` releases them
    step = training_step(cfg, policy, backend, routing, shuffle, out)
    guard = CollapseGuard.from_config(cfg.guard, kl_key=MISMATCH_KL)
    return Run(cfg, plan, out, policy, backend, step, scheduler, guard, start_step, log, placement, owns_ray,
               curriculum=curriculum)
