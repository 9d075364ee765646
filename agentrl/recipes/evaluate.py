"""`agentrl eval`: score a model or checkpoint on an env at the model's official sampling settings.

Practitioners' advice (see ``shared/docs/background``): train at temperature 1, evaluate at the settings the model's
authors publish. Most frameworks evaluate greedily or at whatever temperature they trained with; here the default is
the model's own ``generation_config.json`` (temperature, top_p, top_k, min_p, repetition / presence / frequency
penalty) plus its family's documented thinking mode, and every flag that overrides one is recorded. The settings
actually used, with where each came from, are printed and saved in ``results.json``.

Choices, and why:
    * Tasks are env seeds ``seed_offset, seed_offset + 1, ...`` with ``seed_offset = 1_000_000`` by default, while
      training draws seeds ``0, 1, 2, ...`` (`EnvConfig.seed_offset` + step x prompts_per_step). Where the env has a
      ``split`` argument (math, alfworld, webshop) the held-out split is used as well (``--split test``; ALFWorld
      calls its out-of-distribution evaluation set ``valid_unseen``), so eval tasks are disjoint from training tasks
      twice over; an env without splits (gui) still never replays a training seed below one million tasks.
    * Each task is played n = ``samples_per_task`` times (default: the largest k asked for), which is what the
      unbiased pass@k estimator needs. Success rate and mean reward use all n x tasks episodes.
    * Sampling defaults follow vLLM's reading of ``generation_config.json``: a key that is absent means "off"
      (temperature 1, top_p 1, no top-k); ``do_sample: false`` means greedy, as in transformers.
    * Each episode's sampler seed follows its place in the task list (task x n + sample), so the chunks the tasks
      are played in (sized by the engine's batch) change no sample of an engine that seeds per request.
    * ``--protocol NAME`` (`agentrl.protocols`, `from_protocol`) replaces all of the above by a named protocol's
      settings: its env arguments, panel, budgets and sampling, whatever the model or its training run says.
    * A judge (``--reward.judge.*``, the ``reward`` section of ``agentrl run``; or the training run's own, when
      `model` is ``RUN/checkpoint``) scores each episode as in training: the reward is ``rule_weight`` x the env's
      reward + ``judge_weight`` x the judge's score (`agentrl.rewards.combine`), while success stays the env's. An
      episode whose judgement failed is never scored: its task is left out whole (training drops its group alike)
      and counted in ``results["judge"]``. Scores are cached in the output folder; a spent budget stops the
      evaluation with one line naming the setting. Without a judge nothing of this runs, and results.json is as
      it was.
"""

from __future__ import annotations

import inspect
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from agentrl.chat.layout import resolve_context
from agentrl.config import (
    ConfigError,
    ContextConfig,
    EngineConfig,
    LogConfig,
    RewardConfig,
    RunConfig,
    RunnersConfig,
    config_to_dict,
    read_run_config,
)
from agentrl.engine.base import RequestEngine, SamplingParams
from agentrl.engine.plan import EnginePlan, plan_engine
from agentrl.passk import Interval, bootstrap_pass_at_k, mean_interval, task_counts, wilson_interval
from agentrl.protocols.protocol import ProtocolRun
from agentrl.recipes.eval_config import (
    EVAL_SEED_OFFSET,
    SAMPLING_KEYS,
    EvalConfig,
    EvalEnvConfig,
    EvalError,
    SamplingOverrides,
    eval_env,
)
from agentrl.records import Trajectory, save_trajectories
from agentrl.rewards.judge import JUDGE_CACHE, JudgeBudgetSpent, JudgeReward

if TYPE_CHECKING:
    from agentrl.rollout.pool import LocalPool, RayPool

__all__ = [
    "EVAL_SEED_OFFSET", "EvalConfig", "EvalEnvConfig", "SamplingOverrides", "EvalError", "eval_env",
    "ResolvedSampling", "ThinkingMode", "THINKING_MODES", "official_sampling", "resolve_split", "summarize",
    "evaluate", "load_results", "training_sampling", "from_protocol", "run_reward",
]

_NEUTRAL: dict[str, float] = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
                              "presence_penalty": 0.0, "frequency_penalty": 0.0}

# Sampling keys of transformers' GenerationConfig that our engine has no equivalent for, with their "off" value:
# reported as ignored when a model sets them, never dropped silently.
_UNSUPPORTED: dict[str, Any] = {"typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "no_repeat_ngram_size": 0,
                                "num_beams": 1, "top_a": 0.0, "top_n_sigma": None, "dry_multiplier": 0.0}

# ALFWorld names its held-out sets valid_seen / valid_unseen; "unseen" is the one papers report as the test set.
SPLIT_ALIASES: dict[str, dict[str, str]] = {"alfworld": {"test": "valid_unseen"}}


@dataclass(frozen=True)
class ThinkingMode:
    """A model family's documented thinking mode.

    Attributes:
        default_on: whether the family thinks unless told otherwise (its chat template's default).
        off_sampling: the settings its model card asks for with thinking off (generation_config.json holds the
            thinking-mode ones).
        source: where these come from, recorded with the results.
    """

    default_on: bool
    off_sampling: Mapping[str, float]
    source: str


THINKING_MODES: dict[str, ThinkingMode] = {
    # Qwen3 model cards: thinking (the default, generation_config.json) T=0.6, top_p=0.95, top_k=20, min_p=0;
    # non-thinking T=0.7, top_p=0.8, top_k=20, min_p=0.
    "qwen3": ThinkingMode(default_on=True, off_sampling={"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0},
                          source="Qwen3 model card, non-thinking mode"),
}


@dataclass(frozen=True)
class ResolvedSampling:
    """The sampling settings an evaluation uses and where each one came from.

    Attributes:
        params: what the engine receives.
        chat_kwargs: chat-template variables (``enable_thinking``).
        sources: per setting (and ``thinking``): ``generation_config.json``, ``flag``, ``default (off)``, ...
        ignored: settings the model asks for that the engine cannot apply, e.g. ``typical_p=0.9``.
    """

    params: SamplingParams
    chat_kwargs: Mapping[str, Any]
    sources: Mapping[str, str]
    ignored: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain data for results.json."""
        values = {k: getattr(self.params, k) for k in (*SAMPLING_KEYS, "max_new_tokens", "seed")}
        return {**values, "chat_kwargs": dict(self.chat_kwargs), "sources": dict(self.sources),
                "ignored": list(self.ignored)}


def _number(key: str, value: Any) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EvalError(f"generation_config.json: {key} must be a number, got {value!r}")
    return int(value) if key == "top_k" else float(value)


def official_sampling(generation_config: Mapping[str, Any], family: str, *, thinking: bool | None = None,
                      thinking_source: str = "flag", overrides: Mapping[str, Any] | None = None,
                      max_new_tokens: int = 256, seed: int | None = 0, fixed: Mapping[str, Any] | None = None,
                      fixed_source: str = "protocol") -> ResolvedSampling:
    """Resolve the sampling settings: the model's generation_config, its family's thinking mode, fixed ones, flags.

    Args:
        generation_config: the model's ``generation_config.json`` (`LoadedModel.generation_config`).
        family: the chat-template family (`LoadedModel.family`), for the thinking-mode rules.
        thinking: force thinking on or off; None takes the family's default.
        thinking_source: how to label a `thinking` that is not None (``flag``, ``training run``).
        overrides: settings given on the command line (None values are skipped).
        max_new_tokens: per turn.
        seed: sampler seed.
        fixed: settings that replace the model's and its thinking mode's, below the flags (an eval protocol's).
        fixed_source: how to label `fixed` settings (``protocol NAME``).

    Raises:
        EvalError: a setting of the wrong type or out of range, naming it.
    """
    values = dict(_NEUTRAL)
    sources = {k: "default (off)" for k in SAMPLING_KEYS}
    for key in SAMPLING_KEYS:
        if generation_config.get(key) is not None:
            values[key] = _number(key, generation_config[key])
            sources[key] = "generation_config.json"
    if values["top_k"] < 0:  # vLLM spells "no top-k" -1
        values["top_k"] = 0
    if generation_config.get("do_sample") is False:
        values["temperature"] = 0.0
        sources["temperature"] = "generation_config.json (do_sample: false, greedy)"

    mode = THINKING_MODES.get(family)
    if thinking is None:
        thinking = mode.default_on if mode else None
        sources["thinking"] = f"{family} default" if mode else f"{family} has no thinking mode"
    else:
        sources["thinking"] = thinking_source
    if mode is not None and thinking is False:
        for key, value in mode.off_sampling.items():
            values[key] = value
            sources[key] = mode.source

    for given, source in ((fixed, fixed_source), (overrides, "flag")):
        for key, value in (given or {}).items():
            if value is None:
                continue
            if key not in _NEUTRAL:
                raise EvalError(f"unknown sampling setting {key!r}; known: {', '.join(SAMPLING_KEYS)}")
            values[key] = _number(key, value)
            sources[key] = source

    ignored = [f"{k}={generation_config[k]}" for k, off in _UNSUPPORTED.items()
               if generation_config.get(k) not in (None, off)]
    supported = {f.name for f in fields(SamplingParams)}
    ignored += [f"{k}={values.pop(k)}" for k in list(values) if k not in supported]
    try:
        params = SamplingParams(**values, max_new_tokens=max_new_tokens, seed=seed)
    except ValueError as e:
        raise EvalError(f"bad sampling setting: {e}") from None
    chat_kwargs = {} if thinking is None else {"enable_thinking": thinking}
    return ResolvedSampling(params, chat_kwargs, sources, tuple(ignored))


def training_sampling(model: str) -> dict[str, Any] | None:
    """The sampling a checkpoint was trained with: ``RUN/sampling.json`` when `model` is ``RUN/checkpoint``."""
    path = Path(model).expanduser()
    saved = path.parent / "sampling.json"
    if path.is_dir() and (path / "trainer_state.json").exists() and saved.exists():
        try:
            return json.loads(saved.read_text())
        except json.JSONDecodeError:
            return None
    return None


def _training_run(model: str) -> RunConfig | None:
    """``RUN/config.yaml`` when `model` is ``RUN/checkpoint`` (an `agentrl run` or `agentrl sft` folder)."""
    path = Path(model).expanduser()
    saved = path.parent / "config.yaml"
    if not (path.is_dir() and (path / "trainer_state.json").exists() and saved.exists()):
        return None
    try:
        cfg, _ = read_run_config(saved)  # a run saved in the earlier config layout still evaluates
    except ConfigError as e:
        raise EvalError(f"cannot read the training run's settings: {e}") from None
    return cfg


def run_reward(model: str) -> RewardConfig | None:
    """The ``reward`` section of the training run whose checkpoint `model` is, when that run had a judge (else None).

    ``agentrl eval`` lays its ``--reward.*`` flags over it key by key (`agentrl.cli.evaluate.eval_config`).

    Raises:
        EvalError: the run's config.yaml cannot be read.
    """
    run = _training_run(model)
    return run.reward if run is not None and run.reward.judge.enabled else None


def _reward(cfg: EvalConfig, trained_run: RunConfig | None) -> tuple[RewardConfig, str]:
    """The reward section episodes are scored by, and where it came from ("" without a judge).

    A judge given wins; else the training run's when `EvalConfig.reward_from_run` asks for it (not under a
    protocol, which fixes what is compared); else the env's rule reward alone.
    """
    run_judged = (cfg.reward_from_run and not cfg.protocol and trained_run is not None
                  and trained_run.reward.judge.enabled)
    if cfg.reward.judge.enabled:
        if not run_judged:
            return cfg.reward, "flags"
        changed = _changed_keys(config_to_dict(trained_run.reward), config_to_dict(cfg.reward), "reward")
        return cfg.reward, "training run (config.yaml)" + (f", {', '.join(changed)} from flags" if changed else "")
    if run_judged:
        return trained_run.reward, "training run (config.yaml)"
    return cfg.reward, ""


def _changed_keys(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str) -> list[str]:
    """The dotted keys whose values differ between two nested mappings of the same shape."""
    out = []
    for key, value in a.items():
        if isinstance(value, Mapping):
            out += _changed_keys(value, b[key], f"{prefix}.{key}")
        elif value != b[key]:
            out.append(f"{prefix}.{key}")
    return out


def _env_kwargs_of(run: RunConfig | None, env_id: str) -> dict[str, Any]:
    """The env arguments `run` trained with, when it trained on `env_id` (``split`` left out).

    A policy trained on one observation format (the phone's compact screens, say) and evaluated on another is
    measured off its distribution; evaluating with the run's own arguments is what a user means by default.
    """
    if run is None or run.env.id != env_id:
        return {}
    return {k: v for k, v in run.env.kwargs.items() if k != "split"}


def resolve_split(env_id: str, env_class: Callable[..., Any], env_kwargs: Mapping[str, Any],
                  split: str | None) -> tuple[dict[str, Any], str | None]:
    """Add the eval split to the env kwargs where the env takes one.

    Args:
        env_id: registry id (for the alias table and messages).
        env_class: the env class or factory (its signature tells whether it has a ``split`` argument).
        env_kwargs: kwargs from ``--env-arg``; an explicit ``split`` there wins.
        split: ``--split``; None means the default, ``test``.

    Returns:
        (kwargs for `make`, the split used or None when the env has no splits).
    """
    kwargs = dict(env_kwargs)
    try:
        takes_split = "split" in inspect.signature(env_class).parameters
    except (TypeError, ValueError):  # builtins / C factories: assume no splits
        takes_split = False
    if "split" in kwargs:
        return kwargs, str(kwargs["split"])
    if not takes_split:
        if split is not None:
            raise EvalError(f"env {env_id!r} has no splits, so --split {split!r} cannot apply; drop --split "
                            f"(eval seeds start at {EVAL_SEED_OFFSET:,} to stay clear of training seeds)")
        return kwargs, None
    wanted = split or "test"
    kwargs["split"] = SPLIT_ALIASES.get(env_id, {}).get(wanted, wanted)
    return kwargs, kwargs["split"]


def from_protocol(run: ProtocolRun, model: str, *, output: str = "runs/eval", engine: EngineConfig | None = None,
                  runners: RunnersConfig | None = None, ray_address: str | None = None) -> EvalConfig:
    """The `EvalConfig` of a protocol with its overrides.

    The protocol fixes what is compared; the caller only where it runs (engine kind, precision and replicas, runners,
    cluster, output folder).

    Raises:
        EvalError: an override the protocol has no setting for.
    """
    from agentrl.protocols.protocol import OVERRIDABLE

    unknown = sorted(set(run.overrides) - set(OVERRIDABLE))
    if unknown:
        raise EvalError(f"cannot override {', '.join(unknown)} of a protocol; overridable: {', '.join(OVERRIDABLE)}")
    p, o = run.protocol, run.overrides
    seed_offset = o.get("seed_offset", p.tasks.seed_offset)
    return EvalConfig(
        model=model,
        env=eval_env(p.env.id, {**p.env.kwargs, **o.get("env_kwargs", {})}, max_turns=o.get("max_turns",
                                                                                            p.env.max_turns),
                     seed_offset=seed_offset),
        engine=engine or EngineConfig(), runners=runners or RunnersConfig(),
        split=o.get("split", p.env.split), episodes=o.get("episodes", p.tasks.count), ks=tuple(o.get("ks", p.tasks.ks)),
        samples_per_task=o.get("samples_per_task", p.tasks.samples_per_task),
        max_new_tokens=o.get("max_new_tokens", p.context.max_new_tokens),
        max_context_tokens=p.context.max_context_tokens, seed=o.get("seed", p.sampling.seed),
        thinking=o.get("thinking", p.sampling.thinking), sampling_overrides=dict(o.get("sampling", {})),
        ray_address=ray_address, output=output, confidence=p.intervals.confidence, protocol=run,
    )


def _episode_row(traj: Trajectory) -> dict[str, Any]:
    return {
        "task": traj.group_id, "seed": traj.seed, "task_type": traj.task_type or "all", "success": traj.success,
        "reward": traj.total_return, "turns": len(traj.turns), "tokens": traj.num_generated_tokens,
        "truncated": traj.truncated, "length_cut_turns": sum(t.finish_reason == "length" for t in traj.turns),
        # Judged (`agentrl.rewards.combine`): "reward" is the combined one; its parts too (judge None: below the gate).
        **({"rule_reward": traj.rule_reward, "judge_reward": traj.judge_reward} if traj.rule_reward is not None
           else {}),
    }


def _block(rows: Sequence[Mapping[str, Any]], ks: Sequence[int], confidence: float) -> dict[str, Any]:
    """All metrics of a set of episodes (the whole eval, or one task type)."""
    counts = task_counts(rows)
    n_min = min(n for n, _ in counts)
    rewards = np.array([r["reward"] for r in rows], dtype=float)
    return {
        "episodes": len(rows),
        "tasks": len(counts),
        "success_rate": _success_rate(rows, counts, confidence).to_dict(),
        "reward_mean": mean_interval(rewards, confidence).to_dict(),
        "reward_std": float(rewards.std(ddof=1)) if len(rows) > 1 else 0.0,
        "pass_at_k": {str(k): bootstrap_pass_at_k(counts, k, confidence).to_dict() for k in ks if k <= n_min},
        "turns_mean": mean_interval([r["turns"] for r in rows], confidence).to_dict(),
        "tokens_mean": mean_interval([r["tokens"] for r in rows], confidence).to_dict(),
        "truncated_frac": sum(bool(r["truncated"]) for r in rows) / len(rows),
    }


def _success_rate(rows: Sequence[Mapping[str, Any]], counts: Sequence[tuple[int, int]], confidence: float) -> Interval:
    """The episodes' success rate, with its interval.

    Wilson's with one episode per task; with several, pass@1's bootstrap over tasks (the episodes of one task are not
    independent draws, so Wilson over episodes would be too narrow).
    """
    successes = sum(bool(r["success"]) for r in rows)
    if max(n for n, _ in counts) == 1:
        return wilson_interval(successes, len(rows), confidence)
    by_task = bootstrap_pass_at_k(counts, 1, confidence)
    return Interval(successes / len(rows), by_task.low, by_task.high, len(rows))


def summarize(rows: Sequence[Mapping[str, Any]], ks: Sequence[int], confidence: float = 0.95) -> dict[str, Any]:
    """Metrics overall and by task type, from per-episode rows (see `results.json` ``episodes``).

    Returns:
        ``{"overall": {...}, "by_task_type": {type: {...}}, "pass_at_k_curve": [{"k": 1, ...}, ...]}``. The curve
        runs k = 1..n over all tasks, for the report's plot.
    """
    if not rows:
        raise EvalError("no episodes to summarize")
    by_type: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_type.setdefault(r["task_type"], []).append(r)
    counts = task_counts(rows)
    n_min = min(n for n, _ in counts)
    curve = [{"k": k, **bootstrap_pass_at_k(counts, k, confidence).to_dict()} for k in range(1, n_min + 1)]
    return {
        "overall": _block(rows, ks, confidence),
        "by_task_type": {t: _block(rs, ks, confidence) for t, rs in sorted(by_type.items())},
        "pass_at_k_curve": curve,
    }


def _transcripts(trajectories: Sequence[Trajectory], tokenizer, count: int, limit: int = 3000) -> list[dict]:
    """A few episodes for the report: half successes, half failures (the first ones, so the pick is stable)."""
    if count <= 0:
        return []
    wins = [t for t in trajectories if t.success][: (count + 1) // 2]
    losses = [t for t in trajectories if not t.success][: count - len(wins)]
    picked = sorted(wins + losses, key=lambda t: (t.group_id, t.seed))
    out = []
    for traj in picked:
        out.append({
            "task": traj.group_id, "seed": traj.seed, "task_type": traj.task_type, "success": traj.success,
            "reward": traj.total_return, "first_observation": traj.first_observation[:limit],
            "turns": [{"reply": tokenizer.decode(list(t.generated_ids), skip_special_tokens=True)[:limit],
                       "action": t.action[:limit], "observation": t.observation[:limit], "reward": t.reward,
                       "finish_reason": t.finish_reason, "tokens": len(t.generated_ids)} for t in traj.turns],
        })
    return out


def _print_settings(console, resolved: ResolvedSampling, trained: Mapping[str, Any] | None) -> None:
    from rich.table import Table

    table = Table(title="sampling settings used", title_justify="left")
    table.add_column("setting")
    table.add_column("value", justify="right")
    table.add_column("source")
    if trained:
        table.add_column("trained with", justify="right")
    for key in (*SAMPLING_KEYS, "max_new_tokens"):
        if not hasattr(resolved.params, key):
            continue
        row = [key, f"{getattr(resolved.params, key):g}", resolved.sources.get(key, "flag")]
        if trained:
            row.append(f"{trained[key]:g}" if isinstance(trained.get(key), (int, float)) else "-")
        table.add_row(*row)
    thinking = resolved.chat_kwargs.get("enable_thinking", "n/a")
    row = ["thinking", str(thinking), resolved.sources.get("thinking", "")]
    if trained:
        row.append(str(trained.get("chat_kwargs", {}).get("enable_thinking", "template default")))
    table.add_row(*row)
    console.print(table)
    if resolved.ignored:
        console.print(f"[yellow]ignored (the engine cannot apply them):[/] {', '.join(resolved.ignored)}")


def _collect(cfg: EvalConfig, seeds: Sequence[int], resolved: ResolvedSampling, engine: RequestEngine,
             tokenizer, pool: LocalPool | RayPool, bar, rollout_kwargs: Mapping[str, Any],
             judge: JudgeReward | None = None) -> tuple[list[Trajectory], list[str]]:
    """Play `cfg.n` episodes of every task seed through the RL rollout loop, a chunk of whole tasks at a time.

    With a `judge` the loop scores each episode and leaves out the task of one whose judgement failed; the second
    value holds one line per such failure (kind, seed, message). Without one it is empty.

    Each episode's sampler seed depends on its place in the panel (task index x n + sample), not on the chunk it
    falls in: the rollout loop seeds episode i of a chunk ``EPISODE_SEED_STRIDE i`` above ``params.seed``, so a chunk
    starting at task `first` starts ``EPISODE_SEED_STRIDE first n`` further. The chunk size (the engine's batch size)
    then changes no sample of an engine that seeds per request.
    """
    from agentrl.rollout.loop import EPISODE_SEED_STRIDE, run_rollout

    trajectories: list[Trajectory] = []
    judge_failures: list[str] = []
    tasks_per_chunk = _tasks_per_chunk(cfg)
    for first in range(0, len(seeds), tasks_per_chunk):
        chunk = seeds[first : first + tasks_per_chunk]
        params = resolved.params if resolved.params.seed is None else replace(
            resolved.params, seed=(resolved.params.seed + EPISODE_SEED_STRIDE * first * cfg.n) % 2**63)
        done_before = bar.n
        result = run_rollout(
            pool, cfg.env.id, chunk, cfg.n, engine, tokenizer, params, max_turns=cfg.env.max_turns,
            max_context_tokens=cfg.context.max_context_tokens, policy_version=0,
            max_episode_retries=cfg.runners.max_episode_retries, **rollout_kwargs,
            on_progress=lambda stats, base=done_before: bar.update(base + stats.episodes_done - bar.n), judge=judge,
        )
        got = result.trajectories
        trajectories += [replace(t, group_id=first + t.group_id) for t in got]
        judge_failures += [line for line in result.stats.failures if line.startswith("judge_")]
        bar.update(done_before + len(got) - bar.n)
    return trajectories, judge_failures


def _tasks_per_chunk(cfg: EvalConfig) -> int:
    """Tasks played together (whole tasks; each chunk fills the engine's batch twice over).

    Chunks keep memory bounded and the progress bar moving.
    """
    return max(1, (2 * cfg.engine.batch_size) // cfg.n)


def _build_engine(cfg: EvalConfig, plan: EnginePlan, policy) -> RequestEngine:
    """The engine(s) the evaluation samples from, built from its engine plan as training builds them.

    Evaluation never changes the weights, so an in-process HF engine samples from the loaded module itself (no
    copy, unless `cfg.engine.dtype` asks for another precision); vLLM and engine actors read the same weights from a
    saved folder. One replica stays in this process even on a cluster (the runners use it): no weights to ship.
    """
    from agentrl.engine import EngineError, build_engines

    try:
        return build_engines(plan.spec(cfg.engine, seed=cfg.seed), policy, replicas=cfg.engine.replicas,
                             share_module=True, ray_address=cfg.ray_address if cfg.engine.replicas > 1 else None)
    except EngineError as e:
        raise EvalError(str(e)) from None


def _tasks(cfg: EvalConfig, spec, trained_run: RunConfig | None, console) -> tuple[dict[str, Any], str, list[int],
                                                                                str | None]:
    """The env's arguments, split and task seeds, checked before the model loads (and the protocol's panel).

    Returns:
        The env's keyword arguments, the split, the seeds, and the panel's fingerprint under a protocol (else None).
    """
    import agentrl

    # A protocol fixes the env's arguments; otherwise the training run's are what a user means by default.
    trained_kwargs = {} if cfg.protocol else _env_kwargs_of(trained_run, cfg.env.id)
    if trained_kwargs:  # --env-arg wins key by key
        console.print(f"env arguments from the training run (config.yaml): {trained_kwargs}"
                      + (f"; --env-arg sets {sorted(cfg.env.kwargs)}" if cfg.env.kwargs else ""))
    env_kwargs, split = resolve_split(cfg.env.id, spec.load(), trained_kwargs | dict(cfg.env.kwargs), cfg.split)
    seeds = [cfg.env.seed_offset + i for i in range(cfg.episodes)]
    try:
        env = agentrl.make(cfg.env.id, **env_kwargs)
    except (TypeError, ValueError, OSError) as e:
        raise EvalError(f"bad arguments for env {cfg.env.id!r} {env_kwargs}: {e}") from None
    try:
        fingerprint = _check_panel(cfg.protocol, env, seeds, console) if cfg.protocol else None
    finally:
        env.close()
    return env_kwargs, split, seeds, fingerprint


def _output_folder(cfg: EvalConfig) -> Path:
    """The results folder, created before the model loads: a bad --output must not cost a whole evaluation."""
    out = Path(cfg.output)
    if out.exists() and not out.is_dir():
        raise EvalError(f"cannot write results to {out}: it is a file, --output needs a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise EvalError(f"cannot write results to {out}: {e.strerror or e}") from None
    return out


def _context(cfg: EvalConfig, spec, policy, trained_run: RunConfig | None) -> tuple[ContextConfig, str]:
    """The context episodes are rendered with (the training run's, or --context, or defaults), and where it came from.

    Eval's own context budget applies, the same for every model it compares; under a protocol, what the model sees of
    earlier turns is the protocol's (how its template renders stays the model's).
    """
    run_context = None if trained_run is None else trained_run.context
    context = cfg.context or run_context or ContextConfig()
    # Named before resolving ("auto" settings), which builds a new object.
    source = "--context" if cfg.context else "training run (config.yaml)" if run_context else "defaults"
    context, _ = resolve_context(context, spec.load(), policy.tokenizer, policy.family)
    context = replace(context, max_context_tokens=cfg.max_context_tokens)
    if cfg.protocol:
        pc = cfg.protocol.protocol.context
        context = replace(context, recap_actions=pc.recap_actions, history=pc.history)
        source += f", recap and history from protocol {cfg.protocol.protocol.name}"
    return context, source


def _sampling(cfg: EvalConfig, policy, context_source: str) -> ResolvedSampling:
    """The model's official sampling settings, the thinking mode, flags and a protocol's fixed values, with sources."""
    thinking, thinking_source = cfg.thinking, "flag"
    if thinking is None and cfg.context.enable_thinking is not None:
        thinking, thinking_source = cfg.context.enable_thinking, context_source
    protocol = cfg.protocol.protocol if cfg.protocol else None
    if protocol and "thinking" not in cfg.protocol.overrides and protocol.sampling.thinking is not None:
        thinking_source = f"protocol {protocol.name}"
    resolved = official_sampling(policy.generation_config, policy.family, thinking=thinking,
                                 thinking_source=thinking_source, overrides=cfg.sampling_overrides,
                                 max_new_tokens=cfg.max_new_tokens, seed=cfg.seed,
                                 fixed=protocol.sampling.values() if protocol else None,
                                 fixed_source=f"protocol {protocol.name}" if protocol else "")
    if protocol:  # the token budget is the protocol's too, unless a flag changed it
        budget = "flag" if "max_new_tokens" in cfg.protocol.overrides else f"protocol {protocol.name}"
        resolved = replace(resolved, sources={**resolved.sources, "max_new_tokens": budget})
    return resolved


def _play(cfg: EvalConfig, engine_plan: EnginePlan, policy, env_kwargs: Mapping[str, Any], seeds: Sequence[int],
          resolved: ResolvedSampling, progress: bool,
          judge: JudgeReward | None = None) -> tuple[list[Trajectory], float, list[str]]:
    """Every task's episodes through the engine(s) and the runner pool (scored by `judge`, when given).

    Returns:
        The trajectories, the seconds taken, and one line per failed judgement (`_collect`).
    """
    import torch
    from tqdm import tqdm

    from agentrl.rollout.pool import EnvMaker, make_pool

    # The training run's context (observation role, recap, family, per-turn budgets), thinking as resolved.
    rollout_kwargs = replace(cfg.context, enable_thinking=resolved.chat_kwargs.get("enable_thinking")).rollout_kwargs(
        policy.family)
    torch.manual_seed(cfg.seed)
    engine = _build_engine(cfg, engine_plan, policy)
    start = time.perf_counter()
    bar = tqdm(total=cfg.episodes * cfg.n, disable=not progress, unit="episode",
               desc=f"eval {cfg.env.id} x {policy.name}")
    try:
        # The same runner pools as training: env steps in Ray actors (shared env state, fault tolerance), or
        # in-process.
        with make_pool(EnvMaker(cfg.env.id, dict(env_kwargs)), cfg.runners.count, actors=cfg.runners.actors,
                       step_timeout=cfg.runners.step_timeout, address=cfg.ray_address) as pool:
            trajectories, judge_failures = _collect(cfg, seeds, resolved, engine, policy.tokenizer, pool, bar,
                                                    rollout_kwargs, judge)
    finally:
        engine.close()
    bar.close()
    return trajectories, time.perf_counter() - start, judge_failures


def evaluate(cfg: EvalConfig, *, progress: bool = True, console=None) -> dict[str, Any]:
    """Run the evaluation; write ``results.json``, ``report.html`` and ``trajectories.jsonl`` to `cfg.output`.

    Returns:
        The results, as saved in results.json.

    Raises:
        EvalError: bad config, env arguments or sampling settings; the judge's budget spent, or every judgement
            failed.
        agentrl.ConfigError: the judge's rubric file, API key variable or cache cannot be read.
        agentrl.UnknownEnvError, agentrl.models.UnknownModelError: unknown env or model.
    """
    from rich.console import Console

    import agentrl
    from agentrl.models import load_model
    from agentrl.view.eval_report import write_report

    console = console or Console()
    cfg.validate()
    spec = agentrl.spec(cfg.env.id)
    trained_run = _training_run(cfg.model)  # RUN/config.yaml: the env arguments and context it trained with
    env_kwargs, split, seeds, fingerprint = _tasks(cfg, spec, trained_run, console)
    out = _output_folder(cfg)
    reward, reward_source = _reward(cfg, trained_run)
    # Its rubric, API key and cache (the scores an earlier evaluation into this folder paid for) are read before the
    # model loads: a bad one costs no evaluation. None without a judge.
    judge = JudgeReward.from_config(reward, out)

    policy = load_model(cfg.model)
    policy.model.eval()
    trained = training_sampling(cfg.model)
    context, context_source = _context(cfg, spec, policy, trained_run)
    cfg = replace(cfg, context=context)
    resolved = _sampling(cfg, policy, context_source)
    _print_settings(console, resolved, trained)
    _print_judge(console, cfg, reward, reward_source, trained_run, out)
    # Every episode of a chunk stays cached at its longest context (see `_collect`'s chunks), spread over the engines.
    engine_plan = plan_engine(cfg.engine, policy, cfg.model, episodes_in_flight=_tasks_per_chunk(cfg) * cfg.n,
                              max_model_len=cfg.context.max_context_tokens + cfg.max_new_tokens,
                              on_cluster=bool(cfg.ray_address) and cfg.engine.replicas > 1)
    if engine_plan.kind != cfg.engine.kind:
        console.print(f"engine: {engine_plan.kind} ({engine_plan.why})")
        cfg = replace(cfg, engine=replace(cfg.engine, kind=engine_plan.kind))
    try:
        trajectories, seconds, judge_failures = _play(cfg, engine_plan, policy, env_kwargs, seeds, resolved, progress,
                                                      judge)
    except JudgeBudgetSpent as e:
        raise EvalError(_budget_spent(e, out)) from None
    finally:
        if judge is not None:
            judge.close()
    if judge is not None and not trajectories and judge_failures:
        raise EvalError(f"the judge scored no episode: {len(judge_failures)} judgement(s) failed, every task was left "
                        f"out (never scored 0); the first: {judge_failures[0]}")
    save_trajectories(trajectories, out / "trajectories.jsonl", append=False)

    rows = [_episode_row(t) for t in trajectories]
    results = {
        "agentrl_version": getattr(agentrl, "__version__", ""),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "protocol": cfg.protocol.to_dict(fingerprint) if cfg.protocol else None,
        "env": {"id": cfg.env.id, "kwargs": env_kwargs, "split": split},
        "model": {"name": cfg.model, "family": policy.family, "generation_config": policy.generation_config},
        "tasks": {"seed_offset": cfg.env.seed_offset, "episodes": cfg.episodes, "samples_per_task": cfg.n,
                  "ks": list(cfg.ks), "max_turns": cfg.env.max_turns,
                  "max_context_tokens": cfg.context.max_context_tokens},
        "sampling": resolved.to_dict(),
        "engine": {"kind": cfg.engine.kind, "dtype": cfg.engine.dtype or "model", "engines": cfg.engine.replicas},
        "context": asdict(context) | {"source": context_source},
        "trained_with": trained,
        **({"judge": _judge_summary(reward, reward_source, judge, judge_failures, trajectories, cfg.confidence)}
           if judge is not None else {}),
        "confidence": cfg.confidence,
        **summarize(rows, cfg.ks, cfg.confidence),
        "timing": {"seconds": seconds, "episodes_per_second": len(rows) / seconds if seconds > 0 else None},
        "episodes": rows,
        "transcripts": _transcripts(trajectories, policy.tokenizer, cfg.transcripts),
    }
    (out / "results.json").write_text(json.dumps(_json_safe(results), indent=1))
    write_report(results, out / "report.html", folder=out)  # the viewer's export of this folder
    _log_to_trackers(cfg.log, out, results, trajectories)
    return results


def _print_judge(console, cfg: EvalConfig, reward: RewardConfig, source: str, trained_run: RunConfig | None,
                 out: Path) -> None:
    """One line: the judge episodes are scored by and where it came from, or why the training run's is not used."""
    if reward.judge.enabled:
        gate = f", judged from rule reward {reward.gate:g} up" if reward.gate is not None else ""
        console.print(f"judge: {reward.judge.model} at {reward.judge.endpoint} ({source}); reward = "
                      f"{reward.rule_weight:g} x rule + {reward.judge_weight:g} x judge{gate}; scores cached in "
                      f"{out / JUDGE_CACHE}")
    elif trained_run is not None and trained_run.reward.judge.enabled:
        judge = trained_run.reward.judge
        if cfg.protocol:
            why = f"protocol {cfg.protocol.protocol.name} fixes the score"
        else:  # --reward.judge.endpoint "" with --reward-from-run lands here too (it turns the flag off)
            why = (f"the run's judge is used only with --reward-from-run (and no empty --reward.judge.endpoint), "
                   f"since it sends the episodes to {judge.endpoint}"
                   + (f" with ${judge.api_key_env} as the key" if judge.api_key_env else ""))
        console.print(f"judge: none ({why}; the training run's was {judge.model}): the env's rule reward alone")


def _budget_spent(e: JudgeBudgetSpent, out: Path) -> str:
    """The one line `agentrl eval` stops with when the judge's budget is spent: the setting and the way on."""
    flag = "--reward.judge.budget-tokens" if "budget_tokens" in str(e.failure) else "--reward.judge.budget-calls"
    return (f"{e.failure}, so the evaluation stops (past it every task would be left out): run it again with a "
            f"larger {flag} N (0 = no limit); the scores paid for so far are kept in {out / JUDGE_CACHE} and cost "
            f"nothing again")


def _judge_summary(reward: RewardConfig, source: str, judge: JudgeReward, failures: Sequence[str],
                   trajectories: Sequence[Trajectory], confidence: float) -> dict[str, Any]:
    """results.json's ``judge``: its settings and their source, its counters, its failures, the two reward parts.

    ``failures`` counts the tasks left out because a judgement failed (the first failed episode of each; the task is
    out of every number, never scored);
    ``counts`` are the judge's (calls, cache hits, retries, tokens, ...; `agentrl.rewards.judge.JudgeCounts`).
    """
    counts = judge.counts()
    scores = [t.judge_reward for t in trajectories if t.judge_reward is not None]
    kinds: dict[str, int] = {}
    for line in failures:  # "judge_<kind> (group ..., seed ..., episode ...): message"
        kind = line.split(" ", 1)[0].removeprefix("judge_")
        kinds[kind] = kinds.get(kind, 0) + 1
    return {
        "source": source,
        "settings": config_to_dict(reward),
        "cache": JUDGE_CACHE,
        "failures": len(failures),
        "failure_kinds": dict(sorted(kinds.items())),
        "failure_lines": list(failures[:20]),
        "counts": {f.name: getattr(counts, f.name) for f in fields(counts)},
        "rule_reward_mean": mean_interval([t.rule_reward for t in trajectories], confidence).to_dict(),
        "judge_score_mean": mean_interval(scores, confidence).to_dict(),  # episodes below the gate left out
    }


def _log_to_trackers(log_cfg: LogConfig, out: Path, results: Mapping[str, Any], trajectories: list[Trajectory]):
    """The evaluation's settings, summary numbers, episode table and transcripts, to the trackers of `log_cfg`."""
    if not log_cfg.trackers:
        return
    from agentrl.trackers.runlog import RunLog, clear_tracker_files

    clear_tracker_files(out)  # results.json was just replaced: an earlier evaluation's tracker files go with it
    settings = {k: results[k] for k in ("env", "model", "tasks", "sampling", "engine", "context", "confidence")}
    if "judge" in results:  # a judged evaluation says so (its reward is not the env's alone)
        settings["judge"] = {k: results["judge"][k] for k in ("settings", "source")}
    log = RunLog.open(out, log_cfg.trackers, _json_safe(settings), project=log_cfg.project,
                      run_name=log_cfg.run_name, table_episodes=log_cfg.table_episodes)
    try:
        log.eval(results)
        log.trajectories("eval/trajectories", 0, trajectories)
    finally:
        log.close()


def _check_panel(run: ProtocolRun, env, seeds: Sequence[int], console) -> str:
    """The panel's fingerprint; refuses a protocol whose env no longer gives the tasks it was pinned with.

    The check applies to the protocol as named: overrides of the env or the panel make other tasks on purpose (the
    result then says "+ overrides").
    """
    from agentrl.protocols.protocol import panel_fingerprint

    protocol = run.protocol
    fingerprint = panel_fingerprint(env, seeds)
    console.print(f"protocol: {run.label} (hash {protocol.hash[:12]}, panel {fingerprint[:12]})"
                  + (f"; overrides: {dict(run.overrides)}" if run.overrides else ""))
    changes_panel = {"env_kwargs", "split", "seed_offset", "episodes"} & set(run.overrides)
    pinned = protocol.tasks.fingerprint
    if pinned and not changes_panel and fingerprint != pinned:
        raise EvalError(f"env {protocol.env.id!r} no longer gives the tasks protocol {protocol.name} was pinned with "
                        f"(panel fingerprint {fingerprint[:12]}, pinned {pinned[:12]}): the env changed, so results "
                        f"would not compare with earlier ones; a protocol for the new env needs a new name")
    return fingerprint


def _json_safe(value: Any) -> Any:
    """Replace NaN / infinity by None everywhere (strict JSON, readable by jq and browsers)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def load_results(folder: str | Path) -> dict[str, Any]:
    """Read ``folder/results.json`` written by `evaluate`; raises `EvalError` naming the problem."""
    path = Path(folder)
    path = path / "results.json" if path.is_dir() else path
    if not path.exists():
        raise EvalError(f"{path}: not found (is {folder} an `agentrl eval --output` folder?)")
    try:
        results = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise EvalError(f"{path}: not valid JSON ({e})") from None
    missing = [k for k in ("overall", "episodes", "sampling", "env") if k not in results]
    if missing:
        raise EvalError(f"{path}: not an agentrl eval result (missing {', '.join(missing)})")
    return results


def interval(block: Mapping[str, Any], key: str) -> Interval:
    """An `Interval` stored in a results block (e.g. ``interval(results["overall"], "success_rate")``)."""
    return Interval.from_dict(block[key])
