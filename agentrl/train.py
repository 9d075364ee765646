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
  6. metrics (one JSON line per step), the collapse guard, a checkpoint every `save_every` steps.

Departures from the MiniRL paper, and why: float32 on CPU rather than BF16 training / FP8 rollout; small groups and
batches (G=8, 4 prompts by default rather than 16 x 64) because a CPU step must take about a minute.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import yaml

import agentrl
from agentrl.config import ConfigError, RunConfig, config_to_dict
from agentrl.engine import EngineError, EngineSpec, SamplingParams, build_engines
from agentrl.models import LoadedModel, load_model
from agentrl.objective import CollapseGuard, compute_advantages, minibatch_indices, policy_loss, token_entropy
from agentrl.records import Sample, save_trajectories
from agentrl.routing_replay import RoutingReplay, pack_routes, router_agreement
from agentrl.samples import trajectory_to_samples
from agentrl.scheduler import RolloutScheduler, staleness_metrics

__all__ = ["train", "TrainingError", "sequence_logprobs"]

CHECKPOINT = "checkpoint"


class TrainingError(RuntimeError):
    """The run cannot go on (non-finite loss, collapse guard tripped); the message says why and where."""


@dataclass(frozen=True)
class MicroBatch:
    """Right-padded tensors of a few samples. Token axis T = longest sequence - 1 (position t predicts token t+1)."""

    input_ids: torch.Tensor  # [n, T+1]
    attention_mask: torch.Tensor  # [n, T+1]
    loss_mask: torch.Tensor  # [n, T]
    rollout_logp: torch.Tensor  # [n, T]
    advantages: torch.Tensor  # [n]


def collate(samples: list[Sample], pad_id: int) -> MicroBatch:
    """Pad samples on the right into one micro-batch."""
    width = max(len(s.input_ids) for s in samples)
    n = len(samples)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.float32)
    rlp = torch.zeros((n, width), dtype=torch.float32)
    for i, s in enumerate(samples):
        L = len(s.input_ids)
        ids[i, :L] = torch.tensor(s.input_ids)
        attn[i, :L] = 1
        mask[i, :L] = torch.tensor(s.loss_mask, dtype=torch.float32)
        rlp[i, :L] = torch.tensor(s.rollout_logprobs, dtype=torch.float32)
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    return MicroBatch(ids, attn, mask[:, 1:], rlp[:, 1:], adv)


def sequence_logprobs(model: torch.nn.Module, mb: MicroBatch, with_entropy: bool = False):
    """Log pi(token_{t+1} | tokens_<=t) for every position `[n, T]` (and the entropy `[n, T]` when asked).

    Positions before the batch's first loss token get 0: their logits are never computed (`logits_to_keep`), which
    skips the vocabulary projection over the prompts, the largest tensor of the pass for big vocabularies.
    """
    n, T = mb.loss_mask.shape
    has_loss = mb.loss_mask.any(dim=0)  # [T]
    t0 = int(has_loss.float().argmax()) if bool(has_loss.any()) else T - 1  # first position that carries loss
    out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, logits_to_keep=T + 1 - t0)
    logits = out.logits[:, :-1].float()  # [n, T - t0, V]: positions t0 .. T-1
    targets = mb.input_ids[:, t0 + 1 :]  # [n, T - t0]
    tail = -torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # [n, T - t0]
    logp = torch.nn.functional.pad(tail, (t0, 0))  # [n, T]
    entropy = torch.nn.functional.pad(token_entropy(logits.detach()), (t0, 0)) if with_entropy else None
    return logp, entropy


def _moe_router(model: torch.nn.Module):
    """A `RoutingReplay` over the model's MoE routers, or None for a dense model."""
    try:
        return RoutingReplay(model)
    except ValueError:
        return None


def _rollout_routes(chunk: list[Sample], mb: MicroBatch) -> torch.Tensor:
    """The experts the inference engine chose, packed for a right-padded micro-batch `[n, S, L, K]`."""
    missing = [i for i, s in enumerate(chunk) if s.routed_experts is None]
    if missing:
        raise TrainingError("R3 routing replay needs rollout routes, but the engine returned none for some samples")
    return pack_routes([torch.as_tensor(s.routed_experts) for s in chunk], [0] * len(chunk), mb.input_ids.shape[1])


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _weighted_mean(rows: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """Token-weighted mean of per-micro-batch metrics; keys ending in _max take the max."""
    total = sum(w for w, _ in rows) or 1.0
    out: dict[str, float] = {}
    for key in rows[0][1] if rows else []:
        values = [m[key] for _, m in rows]
        out[key] = max(values) if key.endswith("_max") else sum(w * m[key] for w, m in rows) / total
    return out


def save_checkpoint(out: Path, policy: LoadedModel, optimizer: torch.optim.Optimizer, step: int) -> Path:
    """Write weights, tokenizer, optimizer state and the step to `out/checkpoint` (atomically: tmp dir + rename)."""
    final = out / CHECKPOINT
    tmp = out / (CHECKPOINT + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    policy.model.save_pretrained(tmp)
    policy.tokenizer.save_pretrained(tmp)
    (tmp / "generation_config.json").write_text(json.dumps(policy.generation_config, indent=1))
    (tmp / "agentrl_model.json").write_text(json.dumps({"family": policy.family, "base_model": policy.name}))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step}))
    if final.exists():
        old = out / (CHECKPOINT + ".old")
        final.rename(old)
        tmp.rename(final)
        _rmtree(old)
    else:
        tmp.rename(final)
    return final


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


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


def train(cfg: RunConfig, *, resume: bool = False, overwrite: bool = False, progress: bool = True) -> Path:
    """Run RL training as configured; returns the run folder.

    Args:
        cfg: the run config. Its `output` folder receives metrics.jsonl, trajectories.jsonl, curves.png,
            config.yaml and checkpoint/.
        resume: continue from `cfg.output/checkpoint` (weights, optimizer, step) up to `cfg.steps`.
        overwrite: replace a run already saved in `cfg.output` (otherwise that is an error: no run is lost silently).
        progress: show a progress bar.
    """
    from tqdm import tqdm

    if not cfg.output:
        cfg = dataclasses.replace(cfg, output=str(default_run_dir(cfg)))
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
    torch.manual_seed(cfg.seed)
    dtype = getattr(torch, cfg.dtype)

    # The env: fail fast on an unknown id or bad kwargs, before loading a model.
    spec = agentrl.spec(cfg.env.id)
    try:
        agentrl.make(cfg.env.id, **cfg.env.kwargs).close()
    except (TypeError, ValueError, OSError) as e:  # the env's own message names the bad argument
        raise ConfigError(f"bad arguments for env {cfg.env.id!r} {dict(cfg.env.kwargs)}: {e}") from None

    start_step = 0
    if resume:
        ckpt = out / CHECKPOINT
        if not (ckpt / "trainer_state.json").exists():
            raise TrainingError(f"nothing to resume in {out}: no {CHECKPOINT}/trainer_state.json")
        start_step = json.loads((ckpt / "trainer_state.json").read_text())["step"] + 1
        if start_step >= cfg.steps:
            raise ConfigError(f"{out} already holds {start_step} trained step(s) and the run asks for {cfg.steps}: "
                              f"pass --steps N with N > {start_step} to train further")
        policy = load_model(str(ckpt), dtype=dtype)
        policy.name = cfg.model
    else:
        policy = load_model(cfg.model, dtype=dtype)
    model, tokenizer = policy.model, policy.tokenizer
    router = _moe_router(model)  # None for dense models
    if cfg.loss.routing_replay != "none" and router is None:
        raise TrainingError(f"routing_replay={cfg.loss.routing_replay!r} needs an MoE model; {cfg.model} is dense")
    # Only now, with every setting checked, may a new run replace what an earlier run left in the folder.
    if not resume:
        for stale in ("metrics.jsonl", "trajectories.jsonl"):
            (out / stale).unlink(missing_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
    model.train()
    # The rollout engine(s) own their weights; the scheduler syncs them. Lockstep on one process may share the
    # training module instead (free sync). MoE rollouts carry the experts the engine chose: R3 replays them, the
    # other modes measure router agreement.
    engine_spec = EngineSpec(kind=cfg.rollout.engine, dtype=cfg.rollout.engine_dtype or cfg.dtype,
                             batch_size=cfg.rollout.engine_batch_size, capture_routes=router is not None,
                             kv_cache_gib=cfg.rollout.engine_kv_cache_gib, seed=cfg.seed,
                             max_model_len=cfg.rollout.max_context_tokens + cfg.rollout.max_new_tokens)
    try:
        engine = build_engines(engine_spec, policy, replicas=cfg.rollout.engines, ray_address=cfg.rollout.ray_address,
                               share_module=cfg.rollout.sync_every == 1 and not cfg.rollout.async_rollout,
                               version=start_step)
    except EngineError as e:
        raise TrainingError(str(e)) from None
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, betas=cfg.optim.betas,
                                  weight_decay=cfg.optim.weight_decay)
    if resume:
        optimizer.load_state_dict(torch.load(out / CHECKPOINT / "optimizer.pt"))
    guard = CollapseGuard(cfg.guard.entropy_min, cfg.guard.k3_max, cfg.guard.patience, cfg.guard.action)
    sampling = SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
                              max_new_tokens=cfg.rollout.max_new_tokens, seed=cfg.seed)
    chat_kwargs = {} if cfg.rollout.enable_thinking is None else {"enable_thinking": cfg.rollout.enable_thinking}
    # The settings this run trains with, beside the model's official ones: `agentrl eval` shows both.
    (out / "sampling.json").write_text(json.dumps(
        sampling.__dict__ | {"chat_kwargs": chat_kwargs, "model_generation_config": policy.generation_config},
        default=list))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    shuffle = torch.Generator().manual_seed(cfg.seed)
    metrics_file = out / "metrics.jsonl"
    R, L = cfg.rollout, cfg.loss

    # Rollouts: the runner pool, the sync interval or async producer, policy versions (see agentrl.scheduler).
    # One progress line: the rollout's live counters (episodes, env steps/s, tok/s, errors) beside the last step's
    # reward, so neither overwrites the other.
    postfix: dict[str, str] = {}
    bar = None  # the async producer may report before the bar exists

    def show(fields: dict[str, str]) -> None:
        postfix.update(fields)
        if progress and bar is not None:
            bar.set_postfix(postfix)

    scheduler = RolloutScheduler(
        cfg.env.id, cfg.env.kwargs, engine, model, tokenizer,
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
    bar = tqdm(range(start_step, cfg.steps), initial=start_step, total=cfg.steps, disable=not progress,
               desc=f"{spec.id} x {cfg.model}", unit="step")
    for step in bar:
        t_start = time.perf_counter()

        # 1. Rollout (complete groups only: a group whose env kept failing is dropped whole and counted).
        rollout = scheduler.rollout(step)
        trajectories = rollout.trajectories
        t_rollout = time.perf_counter() - t_start
        if cfg.save_trajectories:
            save_trajectories(trajectories, out / "trajectories.jsonl")
        if not trajectories:
            bar.write(f"step {step}: no complete group ({rollout.stats.dropped_groups} dropped); "
                      f"last failure: {rollout.stats.failures[-1] if rollout.stats.failures else 'none'}")
            continue

        # 2. Advantages, within each group of episodes of the same task.
        rewards = torch.tensor([t.total_return for t in trajectories], dtype=torch.float32)  # [N_traj]
        group_ids = torch.tensor([t.group_id for t in trajectories])  # [N_traj]
        advantages = compute_advantages(L.advantage, rewards, group_ids)  # [N_traj]

        # 3. Samples.
        samples: list[Sample] = []
        for traj, adv in zip(trajectories, advantages.tolist()):
            samples += trajectory_to_samples(traj, adv, per_turn=L.per_turn_samples)
        sample_groups = torch.tensor([s.group_id for s in samples])

        # 4. pi_old: the training model's log-probs of the sampled tokens, and the entropy, before any update.
        #    MoE: R3 replays the rollout's experts here too (pi_old(.|e_mu)); otherwise the training router's own
        #    choices are recorded, for R2 to replay in the updates and to measure agreement with the rollout's.
        old_logp: list[torch.Tensor] = []
        train_routes: list[torch.Tensor | None] = []
        entropy_sum, entropy_tokens, agree_sum, agree_n = 0.0, 0.0, 0.0, 0
        with torch.no_grad():
            for chunk in _chunks(samples, L.micro_batch_size):
                mb = collate(chunk, pad_id)
                if router is None:
                    logp, ent = sequence_logprobs(model, mb, with_entropy=True)
                elif L.routing_replay == "r3":
                    with router.replay(_rollout_routes(chunk, mb)):
                        logp, ent = sequence_logprobs(model, mb, with_entropy=True)
                else:
                    with router.record() as recording:
                        logp, ent = sequence_logprobs(model, mb, with_entropy=True)
                    routes = recording.routes  # [n, S, L, K]
                    train_routes += [routes[i, : len(s.input_ids) - 1] for i, s in enumerate(chunk)]
                    if all(s.routed_experts is not None for s in chunk):
                        engine_routes = _rollout_routes(chunk, mb)  # [n, S, L, K], -1 on padding
                        agree_sum += router_agreement(engine_routes, routes.to(engine_routes.dtype)) * len(chunk)
                        agree_n += len(chunk)
                old_logp += [row for row in logp]
                entropy_sum += float((ent * mb.loss_mask).sum())
                entropy_tokens += float(mb.loss_mask.sum())

        # 5. Updates: one AdamW step per mini-batch of whole groups.
        loss_rows: list[tuple[float, dict[str, float]]] = []
        grad_norms = []
        for mb_index in minibatch_indices(sample_groups, L.n_minibatches, generator=shuffle):
            members = mb_index.tolist()
            num_tokens = sum(samples[i].num_loss_tokens for i in members)
            optimizer.zero_grad(set_to_none=True)
            for chunk_idx in _chunks(members, L.micro_batch_size):
                mb = collate([samples[i] for i in chunk_idx], pad_id)
                width = mb.loss_mask.shape[1]
                mb_old = torch.stack([torch.nn.functional.pad(old_logp[i], (0, width - len(old_logp[i])))
                                      for i in chunk_idx])  # [n, T]
                chunk = [samples[i] for i in chunk_idx]
                if L.routing_replay == "r3":
                    replay = router.replay(_rollout_routes(chunk, mb))
                elif L.routing_replay == "r2":
                    replay = router.replay(pack_routes([train_routes[i] for i in chunk_idx], [0] * len(chunk_idx),
                                                       mb.input_ids.shape[1]))
                else:
                    replay = contextlib.nullcontext()
                with replay:  # the backward runs inside too: gradient checkpointing recomputes the routing
                    logp, _ = sequence_logprobs(model, mb)
                    loss, m = policy_loss(L.name, logp, mb_old, mb.rollout_logp, mb.advantages, mb.loss_mask,
                                          num_sequences=len(members), num_tokens=num_tokens, **L.options)
                    if not torch.isfinite(loss):
                        bad = out / f"bad_batch_step{step}.pt"
                        torch.save({"samples": chunk, "logp": logp.detach(), "old_logp": mb_old, "metrics": m}, bad)
                        raise TrainingError(
                            f"non-finite loss ({loss.item()}) at step {step}; the batch is saved in {bad}")
                    loss.backward()
                loss_rows.append((float(mb.loss_mask.sum()), m))
            if cfg.optim.grad_clip > 0:
                grad_norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)))
            optimizer.step()

        scheduler.updated(step)  # async mode: the engine samples from the new weights from now on

        # 6. Metrics, guard, checkpoint.
        turns = [t for traj in trajectories for t in traj.turns]
        metrics = {
            "step": step,
            "reward_mean": float(rewards.mean()),
            "success_rate": sum(t.success for t in trajectories) / len(trajectories),
            "response_tokens_mean": sum(len(t.generated_ids) for t in turns) / max(len(turns), 1),
            "turns_mean": len(turns) / len(trajectories),
            "entropy": entropy_sum / max(entropy_tokens, 1.0),
            **{k: v for k, v in _weighted_mean(loss_rows).items()},
            "grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else float("nan"),
            "samples": len(samples),
            "router_agreement": agree_sum / agree_n if agree_n else None,
            "prefix_breaks": sum(t.new_segment for t in turns),
            "roundtrip_mismatch_rate": sum(bool(t.roundtrip_drift) for t in turns) / max(len(turns), 1),
            "truncated_frac": sum(t.truncated for t in trajectories) / len(trajectories),
            "rollout_seconds": t_rollout,
            "step_seconds": time.perf_counter() - t_start,
        }
        metrics |= rollout.stats.metrics() | staleness_metrics(step, trajectories)
        metrics["stale_groups_evicted"] = float(scheduler.buffer.evicted)
        with open(metrics_file, "a") as f:
            f.write(json.dumps({k: (v if not isinstance(v, float) or math.isfinite(v) else None)
                                for k, v in metrics.items()}) + "\n")
        show({"reward": f"{metrics['reward_mean']:.2f}", "success": f"{metrics['success_rate']:.2f}",
              "kl_k3": f"{metrics.get('kl_k3', 0):.1e}"})
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            save_checkpoint(out, policy, optimizer, step)
        if cfg.guard.enabled:
            verdict = guard.update(metrics, step=step)
            if not verdict.ok:
                if cfg.guard.action == "rollback" and (out / CHECKPOINT).exists():
                    restored = load_model(str(out / CHECKPOINT), dtype=dtype).model
                    model.load_state_dict(restored.state_dict())
                    guard.reset()
                    bar.write(f"collapse guard: {verdict.reason}; rolled back to {out / CHECKPOINT}")
                    continue
                plot_curves(metrics_file, out / "curves.png")
                raise TrainingError(f"collapse guard stopped the run at step {step}: {verdict.reason}")
    bar.close()
    scheduler.close()
    plot_curves(metrics_file, out / "curves.png")
    return out
