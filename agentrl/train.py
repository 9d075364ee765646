"""The training loop, top to bottom: rollout -> advantages -> samples -> pi_old -> minibatch updates -> metrics.

One step:
  1. rollout: `prompts_per_step` tasks x `group_size` episodes with the current weights (policy version = step).
  2. advantages: the group-mean baseline by default (MiniRL: A = R - mean_group(R), no std division).
  3. samples: each trajectory becomes one sample per prefix-consistent run of turns (`agentrl.samples`).
  4. pi_old: the training model recomputes the log-probs of the sampled tokens (no grad), and the entropy.
     The rollout's own log-probs (mu) stay as they were: the loss's importance weight pi_old / mu corrects for
     any train-inference mismatch.
  5. updates: the batch splits into `n_minibatches` mini-batches of whole groups; each is one AdamW step,
     accumulated over micro-batches with global denominators, so micro-batch size never changes the gradient.
  6. metrics (one JSON line per step), a checkpoint every `save_every` steps, the collapse guard.

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
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

import agentrl
from agentrl.cluster import ClusterError, start_ray
from agentrl.config import ConfigError, RunConfig, config_to_dict
from agentrl.engine import HFEngine, SamplingParams
from agentrl.models import LoadedModel, load_model
from agentrl.objective import CollapseGuard, compute_advantages, minibatch_indices, policy_loss
from agentrl.records import Sample, save_trajectories
from agentrl.samples import trajectory_to_samples
from agentrl.scheduler import RolloutScheduler, staleness_metrics
from agentrl.training.backend import LossResult, PolicyObjective, TrainerFailure, TrainingBackend
from agentrl.training.checkpoint import (
    CHECKPOINT,
    TrainerState,
    checkpoint_folder,
    read_trainer_state,
    save_checkpoint,
)
from agentrl.training.fsdp import FSDPBackend, WorkerSpec
from agentrl.training.memory import MemoryPlan, plan_training_memory
from agentrl.training.metrics import append_metrics, rollout_metrics, weighted_mean
from agentrl.training.microbatch import collate, pack_by_tokens, padding_waste
from agentrl.training.placement import Placement, PlacementPlan
from agentrl.training.replay import DenseRouting, RoutingReplayError, routing_strategy
from agentrl.training.single import SingleProcessBackend

__all__ = ["train", "TrainingError", "set_up", "Run"]


class TrainingError(RuntimeError):
    """The run cannot go on (non-finite loss, collapse guard tripped); the message says why and where."""


def plot_curves(metrics_path: Path, png_path: Path) -> None:
    """Plot the run's main curves from metrics.jsonl into a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not metrics_path.exists():  # no step finished (every group dropped): nothing to plot
        return
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    if not rows:
        return
    keys = ["reward_mean", "success_rate", "entropy", "kl_k3", "response_tokens_mean", "clip_frac"]
    fig, axes = plt.subplots(2, 3, figsize=(12, 6))
    steps = [r["step"] for r in rows]
    for ax, key in zip(axes.ravel(), keys):
        ax.plot(steps, [r.get(key, float("nan")) for r in rows], marker="o", ms=3)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.suptitle(f"agentrl run: {metrics_path.parent.name}")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


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
    """The driver's model: the tokenizer, and the weights the HF engine samples from."""
    backend: TrainingBackend
    routing: DenseRouting
    scheduler: RolloutScheduler
    guard: CollapseGuard
    shuffle: torch.Generator
    """Mini-batch shuffle generator (saved in checkpoints: the data order resumes exactly)."""
    start_step: int
    placement: Placement | None = None
    owns_ray: bool = False

    def publish_weights(self) -> None:
        """Give the rollout engine the weights just trained (nothing to do when the backend trains in place)."""
        if not self.backend.trains_in_place:
            self.policy.model.load_state_dict(dict(self.backend.named_weights()))

    def save(self, step: int) -> Path:
        """Checkpoint after `step` (see `agentrl.training.checkpoint`)."""
        state = TrainerState.capture(step, self.backend.name, self.backend.world_size, self.shuffle)
        return save_checkpoint(self.out, self.backend, self.policy, state)

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
    if T.workers == 0 and R.runners == 0:
        return False
    cores = os.cpu_count() or 1
    cpu_trainers = T.workers if T.gpus_per_worker == 0 else 0
    if R.ray_address is None and cpu_trainers > cores:
        raise ConfigError(f"more workers than devices: --trainers {T.workers} on CPU needs a core per worker and this "
                          f"machine has {cores}. Use --trainers {cores} or fewer, or --ray-address a bigger cluster")
    return start_ray(R.ray_address, num_cpus=cores + cpu_trainers)


def _plan_memory(cfg: RunConfig, policy: LoadedModel) -> MemoryPlan:
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
    return plan_training_memory(
        policy.model, dtype_bytes=torch.finfo(getattr(torch, cfg.dtype)).bits // 8, token_budget=L.micro_batch_tokens,
        longest_sample=R.max_context_tokens + R.max_new_tokens, checkpointing=L.gradient_checkpointing,
        engine_copy=T.workers == 0 and (R.sync_every > 1 or R.async_rollout), limit_bytes=limit,
        shards=max(T.workers, 1))


def _reserve_placement(cfg: RunConfig) -> Placement | None:
    """Reserve the trainer workers' devices (None without workers); refuses a layout the cluster cannot hold."""
    T = cfg.trainer
    if T.workers == 0:
        return None
    return Placement(PlacementPlan(T.workers, T.gpus_per_worker, 0, T.gpus_per_engine, T.colocate))


def _build_backend(cfg: RunConfig, policy: LoadedModel, source: str, memory: MemoryPlan,
                   placement: Placement | None) -> TrainingBackend:
    """The training backend the config asks for (its workers go where `placement` reserved)."""
    T, opt = cfg.trainer, cfg.optim
    if placement is None:
        return SingleProcessBackend(policy, lr=opt.lr, betas=opt.betas, weight_decay=opt.weight_decay,
                                    gradient_checkpointing=memory.gradient_checkpointing)
    spec = WorkerSpec(source, dtype=cfg.dtype, lr=opt.lr, betas=opt.betas, weight_decay=opt.weight_decay,
                      param_dtype=T.param_dtype or None, reduce_dtype=T.reduce_dtype or None,
                      gradient_checkpointing=memory.gradient_checkpointing, use_gpu=T.gpus_per_worker > 0,
                      seed=cfg.seed)
    return FSDPBackend(spec, T.workers, placement)


def _build_rollout(cfg: RunConfig, policy: LoadedModel, is_moe: bool, out: Path, start_step: int,
                   show) -> RolloutScheduler:
    """The inference engine and the rollout scheduler around it (runner pool, sync interval or async producer)."""
    R = cfg.rollout
    # MoE rollouts carry the experts the engine chose: R3 replays them, the other modes measure router agreement.
    engine = HFEngine(policy.model, policy.tokenizer, batch_size=R.engine_batch_size, capture_routes=is_moe)
    sampling = SamplingParams(temperature=R.temperature, top_p=R.top_p, top_k=R.top_k,
                              max_new_tokens=R.max_new_tokens, seed=cfg.seed)
    chat_kwargs = {} if R.enable_thinking is None else {"enable_thinking": R.enable_thinking}
    # The settings this run trains with, beside the model's official ones: `agentrl eval` shows both.
    (out / "sampling.json").write_text(json.dumps(
        sampling.__dict__ | {"chat_kwargs": chat_kwargs, "model_generation_config": policy.generation_config},
        default=list))
    # Rollouts: the runner pool, the sync interval or async producer, policy versions (see agentrl.scheduler).
    return RolloutScheduler(
        cfg.env.id, cfg.env.kwargs, engine, policy.model, policy.tokenizer,
        seeds_for_step=lambda s: [cfg.env.seed_offset + s * R.prompts_per_step + i for i in range(R.prompts_per_step)],
        sampling_for_step=lambda s: sampling if sampling.seed is None else replace(sampling, seed=cfg.seed + s),
        group_size=R.group_size, runners=R.runners, runner_actors=R.runner_actors, ray_address=R.ray_address,
        step_timeout=R.step_timeout, max_episode_retries=R.max_episode_retries, sync_every=R.sync_every,
        async_rollout=R.async_rollout, max_staleness=R.max_staleness, start_step=start_step, stop_step=cfg.steps,
        rollout_kwargs=dict(
            max_turns=R.max_turns, max_context_tokens=R.max_context_tokens, chat_kwargs=chat_kwargs,
            context_options={"family": R.chat_family or None, "family_hint": policy.family,
                             "observation_role": R.observation_role, "recap_actions": R.recap_actions},
            max_new_tokens_by_turn=R.max_new_tokens_by_turn,
        ),
        interrupted_path=out / "trajectories.jsonl" if cfg.save_trajectories else None,
        progress=show,
    )


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
        agentrl.make(cfg.env.id, **cfg.env.kwargs).close()
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
        # Memory: decide gradient checkpointing and refuse a step that cannot fit, before any worker or rollout.
        backend = _build_backend(cfg, policy, source, _plan_memory(cfg, policy), placement)
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
        scheduler = _build_rollout(cfg, policy, backend.is_moe, out, start_step, show)
        undo.pop_all()  # from here on `Run.close` releases them
    G = cfg.guard
    return Run(cfg, out, policy, backend, routing, scheduler, CollapseGuard(G.entropy_min, G.k3_max, G.patience,
               G.action), shuffle, start_step, placement, owns_ray)


def _micro_batches(samples: list[Sample], members, cfg: RunConfig) -> list[list[int]]:
    """Sample indices per micro-batch: longest first, packed to the token budget (see `pack_by_tokens`)."""
    return pack_by_tokens([len(s.input_ids) for s in samples], members, cfg.loss.micro_batch_tokens,
                          cfg.loss.micro_batch_size)


def make_samples(trajectories: list, cfg: RunConfig) -> tuple[list[Sample], torch.Tensor]:
    """Advantages within each group of episodes of the same task, then one sample per prefix-consistent run."""
    L = cfg.loss
    rewards = torch.tensor([t.total_return for t in trajectories], dtype=torch.float32)  # [N_traj]
    group_ids = torch.tensor([t.group_id for t in trajectories])  # [N_traj]
    advantages = compute_advantages(L.advantage, rewards, group_ids)  # [N_traj]
    samples: list[Sample] = []
    for traj, adv in zip(trajectories, advantages.tolist()):
        samples += trajectory_to_samples(traj, adv, per_turn=L.per_turn_samples)
    return samples, rewards


def score_old_policy(run: Run, samples: list[Sample], pad_id: int) -> tuple[dict[int, torch.Tensor], float,
                                                                            list[list[int]]]:
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


def update_policy(run: Run, samples: list[Sample], old_logp: dict[int, torch.Tensor], pad_id: int,
                  step: int) -> tuple[list[LossResult], list[float]]:
    """One optimizer step per mini-batch of whole groups, accumulated over micro-batches.

    Every micro-batch's loss divides by the whole mini-batch's counts, so neither the micro-batch size nor the
    number of trainer workers changes the gradient.
    """
    L = run.cfg.loss
    results: list[LossResult] = []
    grad_norms: list[float] = []
    groups = torch.tensor([s.group_id for s in samples])
    for members in minibatch_indices(groups, L.n_minibatches, generator=run.shuffle):
        members = members.tolist()
        objective = PolicyObjective(functools.partial(policy_loss, L.name, **L.options), len(members),
                                    sum(samples[i].num_loss_tokens for i in members))
        chunks = _micro_batches(samples, members, run.cfg)
        requests = []
        for idx in chunks:
            chunk = [samples[i] for i in idx]
            mb = collate(chunk, pad_id)
            width = mb.loss_mask.shape[1]
            mb_old = torch.stack([F.pad(old_logp[i], (0, width - len(old_logp[i]))) for i in idx])  # [n, T]
            requests.append(run.routing.update_request(idx, chunk, mb, mb_old))
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
    return results, grad_norms


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
    out, pad_id, step = run.out, run.scheduler.engine.engine.pad_id, run.start_step
    metrics_file = out / "metrics.jsonl"
    try:
        bar = tqdm(range(run.start_step, cfg.steps), initial=run.start_step, total=cfg.steps, disable=not progress,
                   desc=f"{cfg.env.id} x {cfg.model}", unit="step")
        for step in bar:
            t_start = time.perf_counter()

            # 1. Rollout (complete groups only: a group whose env kept failing is dropped whole and counted).
            rollout = run.scheduler.rollout(step)
            trajectories = rollout.trajectories
            t_rollout = time.perf_counter() - t_start
            if cfg.save_trajectories:
                save_trajectories(trajectories, out / "trajectories.jsonl")
            if not trajectories:
                bar.write(f"step {step}: no complete group ({rollout.stats.dropped_groups} dropped); "
                          f"last failure: {rollout.stats.failures[-1] if rollout.stats.failures else 'none'}")
                continue

            # 2-3. Advantages and samples.
            samples, rewards = make_samples(trajectories, cfg)

            # 4. pi_old and the entropy, before any update (routed as the Routing Replay strategy says).
            old_logp, entropy, micro_batches = score_old_policy(run, samples, pad_id)

            # 5. Updates, then the engines sample from the new weights.
            results, grad_norms = update_policy(run, samples, old_logp, pad_id, step)
            run.publish_weights()
            run.scheduler.updated(step)  # async mode: the engine samples from the new weights from now on

            # 6. Metrics.
            step_seconds = time.perf_counter() - t_start
            metrics = {
                "step": step, **rollout_metrics(trajectories, rewards), "entropy": entropy,
                **weighted_mean(results),
                "grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else float("nan"),
                "samples": len(samples), "micro_batches": len(micro_batches),
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

            # 7. Checkpoint, then the collapse guard.
            if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
                run.save(step)
            if cfg.guard.enabled:
                verdict = run.guard.update(metrics, step=step)
                if not verdict.ok:
                    if cfg.guard.action == "rollback" and (out / CHECKPOINT).exists():
                        run.backend.load(out / CHECKPOINT, weights_only=True)
                        run.publish_weights()
                        run.guard.reset()
                        bar.write(f"collapse guard: {verdict.reason}; rolled back to {out / CHECKPOINT}")
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
