"""The RL recipe, top to bottom: set-up, the loop, clean-up.

One step:
  1. rollout: `prompts_per_step` tasks x `group_size` episodes with the current weights (policy version = step).
  2. advantages: the group-mean baseline by default (MiniRL: A = R - mean_group(R), no std division), per turn.
  3. samples: each trajectory becomes one sample per prefix-consistent run of turns (`agentrl.chat.samples`).
  4. pi_old: the trainer's log-probs of the sampled tokens, and the entropy (or the rollout's own in bypass mode, or
     the update's own, detached, with one mini-batch per rollout: `agentrl.training.step.choose_old_policy`).
  5. updates: one AdamW step per mini-batch of whole groups, accumulated over micro-batches with global
     denominators, so micro-batch size never changes the gradient; then the engines sample from the new weights.
  6. metrics (one JSON line per step), the collapse guard, then a checkpoint every `save_every` steps (with the guard
     on, of healthy steps only, so a rollback restores the weights and optimizer state of the last healthy step).

Where things live (the torchtune split): `agentrl.recipes.setup` resolves the run plan and builds everything before a
step runs; `agentrl.training.step.TrainingStep` holds steps 2-5; `agentrl.training.metrics` builds the metrics line;
`agentrl.training.checkpoint` writes checkpoints. The weights and AdamW live behind a `TrainingBackend`: in this
process (``--trainers 0``) or sharded over FSDP2 Ray workers (``--trainers N``).

Departures from the MiniRL paper, and why: float32 on CPU rather than BF16 training / FP8 rollout; small groups and
batches (G=8, 4 prompts by default rather than 16 x 64) because a CPU step must take about a minute.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from agentrl.cluster import ClusterError
from agentrl.config import RunConfig
from agentrl.engine import EngineError
from agentrl.envs.registry import short_name
from agentrl.recipes.plan import RunPlan
from agentrl.recipes.setup import Run, set_up
from agentrl.recipes.stops import sigterm_stops
from agentrl.records import Trajectory, save_trajectories
from agentrl.rewards.judge import JudgeBudgetSpent
from agentrl.rollout.pool import RunnersLost
from agentrl.rollout.scheduler import staleness_metrics
from agentrl.trackers.runlog import append_metrics
from agentrl.training.backend import TrainerFailure
from agentrl.training.checkpoint import CHECKPOINT, read_trainer_state
from agentrl.training.metrics import plot_metrics, rollout_metrics, weighted_mean
from agentrl.training.microbatch import padding_waste
from agentrl.training.routing_replay import RoutingReplayError
from agentrl.training.screenshots import episodes_in, save_screenshots
from agentrl.training.step import OldPolicy, StepSamples, TrainingError, UpdateResult, as_trained
from agentrl.training.token_values import record_token_values

__all__ = ["train", "TrainingError", "default_run_dir", "plot_curves", "stop_message"]


def plot_curves(metrics_path: Path, png_path: Path) -> None:
    """Plot the run's main curves from metrics.jsonl into a PNG."""
    keys = ["reward_mean", "success_rate", "entropy", "kl_k3", "response_tokens_mean", "clip_frac"]
    plot_metrics(metrics_path, png_path, [(k, k) for k in keys], f"agentrl run: {metrics_path.parent.name}")


def default_run_dir(cfg: RunConfig) -> Path:
    """A fresh folder name for a run that did not name one: runs/<env>-<model>-<date>-<time>."""
    model = Path(cfg.model).name if Path(cfg.model).exists() else cfg.model.replace("/", "_")
    return Path("runs") / f"{short_name(cfg.env.id)}-{model}-{time.strftime('%Y%m%d-%H%M%S')}"


def train(cfg: RunConfig, *, resume: bool = False, overwrite: bool = False, progress: bool = True) -> Path:
    """Run RL training as configured; returns the run folder.

    Args:
        cfg: the run config. Its `output` folder receives metrics.jsonl, trajectories.jsonl, token_values.jsonl,
            screenshots/ (GUI envs), curves.png, config.yaml, plan.json and checkpoint/.
        resume: continue from `cfg.output/checkpoint` (weights, optimizer, step, data order) up to `cfg.steps`.
        overwrite: replace a run already saved in `cfg.output` (otherwise that is an error: no run is lost silently).
        progress: show the plan and a progress bar.

    Raises:
        KeyboardInterrupt: on Ctrl-C, or `agentrl.recipes.stops.RunStopped` on SIGTERM, after the clean-up ran.
    """
    with sigterm_stops():  # SIGTERM unwinds like Ctrl-C: Ray shuts down in order, without a C++ stack dump
        return _train(cfg, resume=resume, overwrite=overwrite, progress=progress)


def _train(cfg: RunConfig, *, resume: bool, overwrite: bool, progress: bool) -> Path:
    from tqdm import tqdm

    if not cfg.output:
        cfg = dataclasses.replace(cfg, output=str(default_run_dir(cfg)))
    # One short progress line, live numbers first: the rollout's counters (episodes, env steps/s, tok/s, errors),
    # then the last step's reward. The plan's choices and their reasons are said once, before it.
    postfix: dict[str, str] = {}
    bar = None  # the async producer may report before the bar exists

    def show(fields: dict[str, str]) -> None:
        postfix.update(fields)
        if progress and bar is not None:
            bar.set_postfix(postfix)

    def announce(plan: RunPlan) -> None:
        if progress:
            tqdm.write(f"agentrl run: {cfg.env.id} x {cfg.model} -> {cfg.output}\n{plan.table()}")

    run = _start(cfg, resume=resume, overwrite=overwrite, show=show, announce=announce)
    while True:
        step, failure = run.start_step, None
        try:
            bar = tqdm(range(run.start_step, cfg.steps), initial=run.start_step, total=cfg.steps,
                       disable=not progress, desc=cfg.env.id, unit="step")
            for step in bar:
                train_step(run, step, say=bar.write, show=show)
        except TrainerFailure as e:
            failure = e
        except RuntimeError as e:
            # An engine replica or env runner that cannot come back (its node is gone), or the judge's budget spent
            # (every later group would drop): a one-line stop with the way on.
            stops = (EngineError, RunnersLost, JudgeBudgetSpent)
            cause = e if isinstance(e, stops) else e.__cause__  # the async producer wraps it
            if not isinstance(cause, stops):
                raise
            raise TrainingError(f"{cause} (step {step}); {_resume_hint(run.out)}") from None
        finally:
            if bar is not None:  # closed now, so a stop's last line is not followed by a redrawn bar
                bar.close()
                bar = None
            restart = failure is not None and failure.died and run.restarts < cfg.trainer.max_restarts
            run.close(keep_ray=restart)  # a restart keeps this process's Ray connection (and local Ray)
        if failure is None:
            break
        if not restart:
            after = f" (after {run.restarts} restart(s))" if run.restarts else ""
            raise TrainingError(f"{failure} (step {step}){after}; {_resume_hint(run.out)}") from None
        run = _restart(run, failure, step, progress=progress, show=show)
    plot_curves(run.out / "metrics.jsonl", run.out / "curves.png")
    return run.out


def _start(cfg: RunConfig, **kwargs) -> Run:
    """`set_up`, its refusals as one-line `TrainingError`s."""
    try:
        return set_up(cfg, **kwargs)
    except (ClusterError, RoutingReplayError) as e:
        raise TrainingError(str(e)) from None
    except TrainerFailure as e:
        raise TrainingError(f"the trainer workers could not start: {e}") from None


def _restart(run: Run, failure: TrainerFailure, step: int, *, progress: bool, show) -> Run:
    """The run set up again after its trainer workers died: from its last checkpoint, exactly as `--resume` would.

    The steps after the checkpoint are redone, rollouts included (every rollout seed is a function of the step), so
    no update is trained into the weights twice. The event is a line of metrics.jsonl (``event: trainer_restart``)
    and every later step's row counts the restarts (``trainer_restarts``).
    """
    from tqdm import tqdm

    last = _last_checkpoint_step(run.out)
    restarts = run.restarts + 1
    back_to = last + 1 if last is not None else 0
    append_metrics(run.out / "metrics.jsonl", {
        "step": back_to, "event": "trainer_restart", "trainer_restarts": restarts, "failed_step": step,
        "reason": str(failure)})
    if progress:
        tqdm.write(f"{failure} (step {step}); restart {restarts} of {run.cfg.trainer.max_restarts}: the trainer "
                   f"workers start again from " + (f"the checkpoint of step {last}" if last is not None
                                                   else "the initial weights (no checkpoint yet)")
                   + f", redoing steps {back_to}..{step}")
    try:
        again = _start(run.cfg, resume=last is not None, overwrite=True, restart=True, show=show,
                       announce=lambda plan: None)
    except BaseException as e:
        if run.owns_ray:  # kept for the restart, which failed: this run started Ray, so it stops it
            import ray

            ray.shutdown()
        if isinstance(e, TrainingError):  # e.g. the lost node offered a resource the trainers ask for
            raise TrainingError(f"{failure} (step {step}); the restart failed: {e}; {_resume_hint(run.out)}") from None
        raise
    again.owns_ray, again.restarts = run.owns_ray, restarts
    return again


def save_rollout(run: Run, trajectories: list) -> None:
    """Append the step's episodes to trajectories.jsonl, and their screenshots beside it."""
    cfg, out = run.cfg, run.out
    # Screenshots are named by the episode's line in trajectories.jsonl: count the lines before appending (only when
    # the rollout brought any back, so envs without images never read the file).
    shots = cfg.screenshots_per_step > 0 and any(turn.screenshot for t in trajectories for turn in t.turns)
    first = episodes_in(out / "trajectories.jsonl") if shots else 0
    save_trajectories(trajectories, out / "trajectories.jsonl")
    if shots:
        save_screenshots(trajectories, first, out, cfg.screenshots_per_step)


def count_failed_step(run: Run, step: int, stats, say) -> None:
    """A step whose every group failed: say so, and stop the run after ``runners.max_failed_steps`` in a row.

    Raises:
        TrainingError: the limit is reached (the env is gone or broken: more steps would only repeat this).
    """
    last = stats.failures[-1] if stats.failures else "none"
    run.failed_steps += 1
    limit = run.cfg.runners.max_failed_steps
    if limit and run.failed_steps >= limit:
        raise TrainingError(f"every group failed in {run.failed_steps} steps in a row (last failure: {last}); "
                            f"fix the env; {_resume_hint(run.out)} (--runners.max-failed-steps sets how many)")
    say(f"step {step}: no complete group ({stats.dropped_groups} dropped); last failure: {last}")


def train_step(run: Run, step: int, *, say, show) -> None:
    """One step: rollout, samples, pi_old, updates, metrics, guard, checkpoint (or a rollback).

    Args:
        run: what set-up built.
        step: the step's index (its policy version).
        say: ``text -> None``: a line above the progress bar.
        show: ``fields -> None``: the progress line's numbers.

    Raises:
        TrainingError: the run must stop (non-finite loss, the collapse guard).
    """
    cfg, out = run.cfg, run.out
    t_start = time.perf_counter()

    # 1. Rollout (complete groups only: a group whose env kept failing is dropped whole and counted).
    rollout = run.scheduler.rollout(step)
    trajectories = as_trained(rollout.trajectories, step)
    t_rollout = time.perf_counter() - t_start
    if cfg.save_trajectories:
        save_rollout(run, trajectories)
    if not trajectories:
        count_failed_step(run, step, rollout.stats, say)
        run.scheduler.updated(step)  # async mode: the step is done, unchanged weights (else the producer stalls)
        checkpoint_if_due(run, step, say)
        return
    run.failed_steps = 0
    live = rollout.stats.metrics() | staleness_metrics(step, trajectories)

    # 2-3. Advantages (per turn; after the KL reward penalty when there is one) and samples.
    batch = run.step.make_samples(trajectories)
    if not batch.samples:  # the overlong filter or dynamic sampling left every episode out: nothing to learn
        say(f"step {step}: every episode was left out of the loss ({batch.metrics}); no update")
        # The rollout still happened and belongs in the curves: without its row, the steps where every group
        # failed alike vanish from metrics.jsonl and the success curve reads too high.
        run.log.metrics({
            "step": step, **rollout_metrics(trajectories, batch.rewards), **batch.metrics, "samples": 0,
            "update_skipped": 1.0, "rollout_seconds": t_rollout, "step_seconds": time.perf_counter() - t_start,
            "trainer_restarts": run.restarts,
        } | live, trajectories)
        run.scheduler.updated(step)  # async mode: the step is done, unchanged weights (else the producer stalls)
        checkpoint_if_due(run, step, say)
        return

    # 4. pi_old and the entropy, before any update (routed as the Routing Replay strategy says); a few samples'
    # per-token values for `agentrl view`, on the same weights.
    old = run.step.old_policy(batch.samples)
    if cfg.token_values_per_step:
        record_token_values(run.step, batch, old, trajectories, step, cfg.token_values_per_step, out)

    # 5. Updates, then the engines sample from the new weights.
    update = run.step.update(batch.samples, old, batch.ref_logp, step)
    run.scheduler.updated(step)  # async mode: the engine samples from the new weights from now on

    # 6. Metrics.
    metrics = step_metrics(run, step, trajectories, batch, old, update, live, t_start, t_rollout,
                           rollout.stats.generate_seconds)
    run.log.metrics(metrics, trajectories)  # metrics.jsonl, then the trackers (with a table of the episodes)
    show({"reward": f"{metrics['reward_mean']:.2f}", "success": f"{metrics['success_rate']:.2f}"})

    # 7. The collapse guard judges the step, then the checkpoint (or a rollback).
    guard_and_checkpoint(run, step, metrics, say)


def step_metrics(run: Run, step: int, trajectories: list[Trajectory], batch: StepSamples, old: OldPolicy,
                 update: UpdateResult, live: dict[str, float], t_start: float, t_rollout: float,
                 generate_seconds: float) -> dict[str, float]:
    """The step's metrics line: the rollout, the loss terms, the update's passes, timings, staleness."""
    step_seconds = time.perf_counter() - t_start
    losses = weighted_mean(update.results)
    return {
        "step": step, **rollout_metrics(trajectories, batch.rewards),
        # Without a pi_old pass, the update pass's entropy (pi_theta = pi_old in the first mini-batch).
        "entropy": old.entropy if old.entropy is not None else losses["policy_entropy"],
        **losses, **update.mismatch(), **batch.metrics,
        "grad_norm": sum(update.grad_norms) / len(update.grad_norms) if update.grad_norms else float("nan"),
        "samples": len(batch.samples), "samples_without_gradient": update.skipped,
        "micro_batches": len(old.micro_batches), "update_micro_batches": len(update.results), "update_skipped": 0.0,
        "padding_waste": padding_waste([len(s.input_ids) for s in batch.samples], old.micro_batches,
                                       packed=run.step.trainer.packing),
        **run.step.routing.metrics(),
        "rollout_seconds": t_rollout, "step_seconds": step_seconds,
        # The share of the step the engine spent generating (async: capped, generation overlaps training).
        "engine_busy_frac": min(1.0, generate_seconds / step_seconds),
    } | live | {"stale_groups_evicted": float(run.scheduler.stale_groups_evicted), "trainer_restarts": run.restarts}


def guard_and_checkpoint(run: Run, step: int, metrics: dict[str, float], say) -> None:
    """The collapse guard judges the step; then the checkpoint, or a rollback to the last healthy one.

    With the guard on, only healthy steps are saved, so the checkpoint is always one a rollback may return to (a save
    due on a bad step waits for the next healthy one).

    Raises:
        TrainingError: the guard stops the run, or asks for a rollback before any healthy checkpoint exists.
    """
    cfg, out = run.cfg, run.out
    verdict = run.guard.update(metrics, step=step) if cfg.guard.enabled else None
    run.unhealthy = "" if verdict is None or verdict.healthy else verdict.reason
    checkpoint_if_due(run, step, say)
    if verdict is None or verdict.ok:
        return
    if cfg.guard.action != "rollback":
        plot_curves(out / "metrics.jsonl", out / "curves.png")
        raise TrainingError(f"collapse guard stopped the run at step {step}: {verdict.reason}")
    good = run.restore()
    if good is None:
        plot_curves(out / "metrics.jsonl", out / "curves.png")
        raise TrainingError(f"collapse guard at step {step}: {verdict.reason}; no healthy checkpoint to roll back to "
                            f"yet (lower save_every)")
    run.scheduler.updated(step)  # async mode: the engine samples from the restored weights
    run.guard.reset()
    run.unhealthy = ""  # the restored weights are the healthy checkpoint's
    say(f"collapse guard: {verdict.reason}; rolled back to step {good} (weights and optimizer state of "
        f"{out / CHECKPOINT})")


def checkpoint_if_due(run: Run, step: int, say) -> None:
    """Save the checkpoint when `step` is on the ``save_every`` grid or the last, unless the guard judged it unhealthy.

    The weights as they stand come from the last update; when the guard judged that one unhealthy, the save waits for
    a healthy step.

    A step that trained nothing (no complete group, or every group left out by dynamic sampling) counts too: its
    weights are the last update's, and a run whose last steps trained nothing still ends with its checkpoint.
    """
    run.save_due = run.save_due or (step + 1) % run.cfg.save_every == 0 or step + 1 == run.cfg.steps
    if run.save_due and not run.unhealthy:
        run.save(step)
        run.save_due = False
    elif run.save_due:
        say(f"step {step} not checkpointed: {run.unhealthy}; the checkpoint keeps the last healthy step")


def _last_checkpoint_step(out: Path) -> int | None:
    """The step the run folder's checkpoint holds, or None when none was saved yet."""
    if not (out / CHECKPOINT / "trainer_state.json").exists():
        return None
    return read_trainer_state(out / CHECKPOINT).step


def _resume_hint(out: Path) -> str:
    """Where a run that stopped stands: the checkpoint to resume from, or that there is none yet."""
    last = _last_checkpoint_step(out)
    if last is None:
        return (f"no checkpoint was saved yet: start again with `agentrl run --config {out / 'config.yaml'} "
                f"--overwrite`")
    return f"the checkpoint of step {last} in {out / CHECKPOINT} is intact: continue with `agentrl run --resume {out}`"


def stop_message(out: Path, steps: int, signal_name: str) -> str:
    """One line for a run stopped by a signal: the run folder, the last checkpointed step and how to go on."""
    last = _last_checkpoint_step(out)
    if last is not None:
        return (f"stopped by {signal_name}; {out} keeps the checkpoint of step {last} and the metrics so far: "
                f"continue with `agentrl run --resume {out} --steps {steps}`")
    if (out / "config.yaml").exists():
        return (f"stopped by {signal_name} before the first checkpoint of {out}: start again with "
                f"`agentrl run --config {out / 'config.yaml'} --overwrite`")
    return f"stopped by {signal_name} before anything was saved in {out}"
