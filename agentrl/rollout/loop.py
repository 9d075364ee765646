"""The agent loop: drive an inference engine against envs in a runner pool and return `Trajectory` records.

Episodes run side by side. The driver keeps each episode's chat context; each turn is one engine request
(`agentrl.engine.base.RequestEngine`), submitted as soon as the episode's observation is in, and its result is handled
as soon as it finishes (continuous batching: a vLLM engine or engine actors never hold a turn back for the slowest
episode; a batch-only engine such as the HF one samples every waiting turn in one batch per round). The actions go
to the runner pool (`agentrl.rollout.pool`) as futures, one Ray call per runner process per round, so with Ray runners
the envs step while the engine generates for other episodes.
With the in-process pool (``runners=0``) and the HF engine every call returns at once and each round is exactly one
turn of every running episode. Token-in/token-out: the ids the engine generated go into the next turn's context
verbatim (see `agentrl.chat.context`), never re-tokenized from text; runners only ever see action text.

Faults (see `agentrl.rollout.pool`): an episode whose env raised, hung or lost its runner is re-run from its seed, at
most `max_episode_retries` times; after that its whole group is dropped, never kept partially (a partial group would
bias the group-mean advantage). Every retry and drop is counted in `RolloutStats` and logged with the exception.

Determinism: with a deterministic engine (greedy decoding, or any engine whose output depends only on the prompt)
the trajectories for given seeds do not depend on the number of runners. A sampling engine whose random stream
depends on the batch (the HF engine draws from one generator per call) gives different samples when batches differ;
every request carries its own seed (from the episode, its attempt and its turn), so an engine that seeds per request
(vLLM) gives the same samples whatever the schedule.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from agentrl.chat.context import ChatContext
from agentrl.chat.roundtrip import check_roundtrip
from agentrl.engine.base import EngineRequest, EngineResult, InferenceEngine, RequestEngine, SamplingParams
from agentrl.engine.requests import as_request_engine
from agentrl.env import TextEnv
from agentrl.records import Trajectory, Turn
from agentrl.rollout.pool import Completion, EnvFailure, LocalPool, RayPool

__all__ = ["collect_trajectories", "run_rollout", "Episode", "RolloutResult", "RolloutStats", "RolloutInterrupted"]

log = logging.getLogger(__name__)

_SESSIONS = itertools.count()  # engine sessions: one per episode attempt, unique in the process


@dataclass
class Episode:
    """Mutable state of one running episode (internal to the loop; frozen into a `Trajectory` at the end)."""

    env: TextEnv | None
    seed: int
    group_id: int
    context: ChatContext | None
    prompt: list[int]
    first_observation: str
    task_type: str = ""
    turns: list[Turn] = field(default_factory=list)
    new_segment: bool = False
    done: bool = False
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    index: int = 0
    attempts: int = 0
    collateral: int = 0
    slot: int = -1
    policy_version: int | None = None
    pending_turn: dict | None = None
    session: int = -1


@dataclass
class RolloutStats:
    """Counters of one rollout, for the progress line and the step metrics.

    Attributes:
        episodes: episodes in all.
        episodes_done: episodes finished (kept or not).
        env_steps: successful `env.step` calls.
        env_seconds: summed wall time of those calls inside the runners.
        generated_tokens: tokens the engine sampled.
        generate_seconds: wall time of engine calls.
        errors: failed env calls (raised, timed out, runner died).
        retries: episodes re-run from their seed.
        dropped_groups: groups dropped whole after too many failures.
        failures: one line per failure (kind, seed, message), oldest first.
        seconds: wall time of the whole rollout.
        engine: the engine's own metrics for this rollout (weight-sync seconds, prefix-cache hit rate), filled in
            by the scheduler.
    """

    episodes: int = 0
    episodes_done: int = 0
    env_steps: int = 0
    env_seconds: float = 0.0
    generated_tokens: int = 0
    generate_seconds: float = 0.0
    errors: int = 0
    retries: int = 0
    dropped_groups: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    engine: dict[str, float] = field(default_factory=dict)

    def progress_fields(self) -> dict[str, str]:
        """The live progress line: episodes done, env steps/s, tokens/s, errors."""
        elapsed = max(self.seconds, 1e-9)
        return {"episodes": f"{self.episodes_done}/{self.episodes}", "env_steps/s": f"{self.env_steps / elapsed:.1f}",
                "tok/s": f"{self.generated_tokens / elapsed:.0f}", "errors": str(self.errors)}

    def metrics(self) -> dict[str, float]:
        """Numbers for metrics.jsonl."""
        elapsed = max(self.seconds, 1e-9)
        return {"env_steps_per_s": self.env_steps / elapsed, "tokens_per_s": self.generated_tokens / elapsed,
                "env_errors": float(self.errors), "episode_retries": float(self.retries),
                "dropped_groups": float(self.dropped_groups), **self.engine}


@dataclass(frozen=True)
class RolloutResult:
    """The trajectories of every complete group, in group order, and the rollout's counters."""

    trajectories: list[Trajectory]
    stats: RolloutStats


class RolloutInterrupted(KeyboardInterrupt):
    """Ctrl-C during a rollout; `result` holds the groups that had finished."""

    def __init__(self, result: RolloutResult):
        super().__init__("rollout interrupted")
        self.result = result


def _freeze(ep: Episode, env_id: str) -> Trajectory:
    return Trajectory(
        env_id=env_id, seed=ep.seed, group_id=ep.group_id, turns=tuple(ep.turns),
        first_observation=ep.first_observation, total_return=sum(t.reward for t in ep.turns),
        success=ep.success, terminated=ep.terminated, truncated=ep.truncated or not ep.done,
        policy_version=ep.policy_version or 0, task_type=ep.task_type,
    )


def run_rollout(
    pool: LocalPool | RayPool,
    env_id: str,
    seeds: Sequence[int],
    group_size: int,
    engine: InferenceEngine | RequestEngine,
    tokenizer,
    sampling: SamplingParams,
    *,
    max_turns: int = 1,
    max_context_tokens: int = 4096,
    policy_version: int | None = None,
    chat_kwargs: dict | None = None,
    max_episode_retries: int = 2,
    on_progress: Callable[[RolloutStats], None] | None = None,
    context_options: dict | None = None,
    max_new_tokens_by_turn: Sequence[int] = (),
) -> RolloutResult:
    """Play `group_size` episodes for each seed through `pool`; return the complete groups (group i = seeds[i]).

    Args:
        pool: where the envs live (`agentrl.rollout.pool.make_pool`); at most `pool.slots` episodes run at once.
        env_id: recorded in each trajectory.
        seeds: one task per seed.
        group_size: episodes per seed (a group).
        engine: samples the model's replies: a batch engine (`generate`) or a request engine (`submit` / `poll`).
        tokenizer: renders contexts with its chat template.
        sampling: sampling settings; `sampling.seed` (if set) is varied per engine call.
        max_turns: model calls per episode; an episode still running after that is truncated.
        max_context_tokens: an episode whose next prompt would be longer is truncated.
        policy_version: recorded in each trajectory; None records the engine's `policy_version` (0 when it has
            none) at the episode's first engine call, i.e. the oldest weights that sampled the episode.
        chat_kwargs: chat-template variables (e.g. ``{"enable_thinking": False}``).
        max_episode_retries: re-runs of a failed episode before its group is dropped.
        on_progress: called after every engine call and every batch of env results with the live counters.
        context_options: keyword arguments for each episode's `ChatContext` (``family``, ``observation_role``,
            ``recap_actions``, ``tools``).
        max_new_tokens_by_turn: per-turn generation budgets: turn i gets entry ``min(i, len - 1)``; empty uses
            ``sampling.max_new_tokens`` for every turn.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    stats = RolloutStats(episodes=len(seeds) * group_size)
    t_start = time.perf_counter()
    todo: deque[Episode] = deque(
        Episode(None, int(seed), group_id, None, [], "", index=i)
        for group_id, seed in enumerate(seeds) for i in range(group_size)
    )
    finished: dict[int, list[Episode]] = {g: [] for g in range(len(seeds))}
    dropped: set[int] = set()
    free_slots = list(range(min(pool.slots, len(todo))))[::-1]
    fresh_slots: set[int] = set()  # slots whose env failed: the next episode there gets a new env
    by_slot: dict[int, Episode] = {}
    waiting: list[Episode] = []  # have a prompt, need an action

    def start_episodes() -> None:
        while free_slots and todo:
            ep = todo.popleft()
            if ep.group_id in dropped:
                continue
            slot = free_slots.pop()
            ep.slot = slot
            by_slot[slot] = ep
            pool.submit_reset(slot, ep.seed, fresh=slot in fresh_slots)
            fresh_slots.discard(slot)

    def release(ep: Episode) -> None:
        by_slot.pop(ep.slot, None)
        free_slots.append(ep.slot)

    def fail(ep: Episode, failure: EnvFailure) -> None:
        stats.errors += 1
        fresh_slots.add(ep.slot)
        release(ep)
        line = f"{failure.kind} (group {ep.group_id}, seed {ep.seed}, attempt {ep.attempts + 1}): {failure.message}"
        stats.failures.append(line)
        if ep.group_id in dropped:
            return
        # A runner that died or restarted under a neighbour's hang says nothing about this episode's env: re-run it
        # without spending its retries (bounded, so a runner that keeps crashing still ends in a drop).
        innocent = failure.kind in ("actor_died", "actor_restarted") and ep.collateral < 10
        if not innocent and ep.attempts >= max_episode_retries:
            log.warning("dropping group %d (seed %d) after %d failed attempts; last: %s", ep.group_id, ep.seed,
                        ep.attempts + 1, failure.message)
            dropped.add(ep.group_id)
            stats.dropped_groups += 1
            stats.episodes_done += group_size - len(finished[ep.group_id])
            finished[ep.group_id] = []
            return
        log.warning("re-running episode from seed %d: %s", ep.seed, line)
        stats.retries += 1
        todo.appendleft(Episode(None, ep.seed, ep.group_id, None, [], "", index=ep.index,
                                attempts=ep.attempts + (not innocent), collateral=ep.collateral + innocent))

    def finish(ep: Episode) -> None:
        release(ep)
        if ep.group_id in dropped:
            return
        finished[ep.group_id].append(ep)
        stats.episodes_done += 1

    def handle(c: Completion) -> None:
        ep = by_slot.get(c.slot)
        if ep is None:
            return
        if isinstance(c.outcome, EnvFailure):
            fail(ep, c.outcome)
            return
        res = c.outcome
        if ep.group_id in dropped:  # its group is already gone: stop spending compute on it
            release(ep)
            return
        if c.op == "reset":
            ep.context = ChatContext(tokenizer, res.system_prompt, chat_kwargs, **(context_options or {}))
            ep.first_observation = res.observation
            ep.task_type = str(res.info.get("task_type", ""))
            ep.prompt = ep.context.first_prompt(res.observation, res.info)
            waiting.append(ep)
            return
        stats.env_steps += 1
        stats.env_seconds += res.seconds
        ep.turns.append(Turn(**ep.pending_turn, observation=res.observation, reward=res.reward,
                             env_seconds=res.seconds))
        ep.pending_turn = None
        if res.terminated or res.truncated:
            ep.done, ep.terminated, ep.truncated = True, res.terminated, res.truncated
            ep.success = bool(res.info.get("success", False))
        elif len(ep.turns) >= max_turns:
            ep.done, ep.truncated = True, True
        else:
            ep.prompt, ep.new_segment = ep.context.next_prompt(ep.turns[-1].generated_ids, res.observation)
            if len(ep.prompt) > max_context_tokens:
                ep.done, ep.truncated = True, True
        if ep.done:
            finish(ep)
        else:
            waiting.append(ep)

    def report() -> None:
        stats.seconds = time.perf_counter() - t_start
        if on_progress is not None:
            on_progress(stats)

    def submit(ep: Episode) -> None:
        nonlocal next_request
        turn = len(ep.turns)
        params = sampling
        if max_new_tokens_by_turn:
            params = replace(params, max_new_tokens=int(max_new_tokens_by_turn[min(turn, len(max_new_tokens_by_turn)
                                                                                   - 1)]))
        if sampling.seed is not None:  # a seed per episode, attempt and turn: reproducible whatever the schedule
            episode = ep.group_id * group_size + ep.index
            params = replace(params, seed=(sampling.seed + 7919 * turn + 104729 * episode
                                           + 15485863 * (ep.attempts + ep.collateral)) % 2**63)
        if ep.session < 0:
            ep.session = next(_SESSIONS)
        request = EngineRequest(next_request, tuple(ep.prompt), params, session=ep.session)
        generating[next_request] = (ep, time.perf_counter())
        next_request += 1
        requests.submit(request)

    def on_generation(result: EngineResult) -> None:
        ep, submitted_at = generating.pop(result.request_id)
        if ep.group_id in dropped:  # its group is gone while the turn was sampled
            release(ep)
            return
        gen = result.generation
        version = policy_version if policy_version is not None else result.policy_version
        ep.policy_version = int(version) if ep.policy_version is None else min(ep.policy_version, int(version))
        action = ep.context.action_from_reply(gen.token_ids)
        stats.generated_tokens += len(gen.token_ids)
        ep.pending_turn = dict(
            prompt_ids=tuple(ep.prompt), generated_ids=tuple(gen.token_ids),
            rollout_logprobs=tuple(gen.logprobs), action=action, finish_reason=gen.finish_reason,
            new_segment=ep.new_segment, generate_seconds=time.perf_counter() - submitted_at,
            routed_experts=gen.routed_experts,
            roundtrip_drift=check_roundtrip(tokenizer, ep.prompt, gen.token_ids).drift,
        )
        pool.submit_step(ep.slot, action)

    # Continuous batching: every waiting turn is its own engine request, submitted as soon as its observation is
    # in; results come back as each finishes, so an episode never waits for the slowest one of a round.
    requests = as_request_engine(engine)
    generating: dict[int, tuple[Episode, float]] = {}
    next_request = 0
    try:
        while todo or by_slot:
            start_episodes()
            for c in pool.poll(block=not waiting and not generating):
                handle(c)
            start_episodes()
            report()
            for ep in waiting:
                if ep.group_id in dropped:
                    release(ep)
                else:
                    submit(ep)
            waiting.clear()
            if not generating:
                continue
            t0 = time.perf_counter()
            # Env calls in flight: come back soon for their results; none: wait for the engine.
            results = requests.poll(timeout=0.02 if pool.in_flight else None)
            stats.generate_seconds += time.perf_counter() - t0
            for result in results:
                on_generation(result)
            report()
    except KeyboardInterrupt:
        stats.seconds = time.perf_counter() - t_start
        raise RolloutInterrupted(_result(finished, dropped, group_size, env_id, stats)) from None
    finally:
        # Episodes never outlive their rollout: prefixes an engine kept for them (HFEngine) can never match again.
        clear_cache = getattr(engine, "clear_cache", None)
        if clear_cache is not None:
            clear_cache()
    stats.seconds = time.perf_counter() - t_start
    return _result(finished, dropped, group_size, env_id, stats)


def _result(finished: dict[int, list[Episode]], dropped: set[int], group_size: int, env_id: str,
            stats: RolloutStats) -> RolloutResult:
    trajectories = []
    for group_id in sorted(finished):
        eps = finished[group_id]
        if group_id in dropped or len(eps) < group_size:
            continue
        trajectories += [_freeze(ep, env_id) for ep in sorted(eps, key=lambda e: e.index)]
    return RolloutResult(trajectories, stats)


def collect_trajectories(
    make_env: Callable[[], TextEnv],
    env_id: str,
    seeds: Sequence[int],
    group_size: int,
    engine: InferenceEngine | RequestEngine,
    tokenizer,
    sampling: SamplingParams,
    *,
    max_turns: int = 1,
    max_context_tokens: int = 4096,
    policy_version: int | None = 0,
    chat_kwargs: dict | None = None,
    on_turn: Callable[[int, int], None] | None = None,
    pool: LocalPool | RayPool | None = None,
    max_episode_retries: int = 2,
    context_options: dict | None = None,
    max_new_tokens_by_turn: Sequence[int] = (),
) -> list[Trajectory]:
    """Play `group_size` episodes for each seed and return them, grouped (group i = seeds[i]).

    Args:
        make_env: creates one env instance (used in the driver when `pool` is None).
        env_id: recorded in each trajectory.
        seeds: one task per seed.
        group_size: episodes per seed (a group).
        engine: samples the model's replies: a batch engine (`generate`) or a request engine (`submit` / `poll`).
        tokenizer: renders contexts with its chat template.
        sampling: sampling settings; `sampling.seed` (if set) is varied per turn so that runs are reproducible.
        max_turns: model calls per episode; an episode still running after that is truncated.
        max_context_tokens: an episode whose next prompt would be longer is truncated.
        policy_version: recorded in each trajectory (None: the engine's `policy_version`).
        chat_kwargs: chat-template variables (e.g. ``{"enable_thinking": False}``).
        on_turn: called after each engine call with (episodes finished, episodes in all), for progress bars.
        pool: a runner pool (`agentrl.rollout.pool.make_pool`); None runs every episode in the driver.
        max_episode_retries: re-runs of a failed episode before its group is dropped (only complete groups return).
        context_options: keyword arguments for each episode's `ChatContext` (see `run_rollout`).
        max_new_tokens_by_turn: per-turn generation budgets (see `run_rollout`).
    """
    own_pool = pool is None
    if pool is None:
        pool = LocalPool(None, slots=max(1, len(seeds) * group_size), make_env=make_env)
    on_progress = None if on_turn is None else (lambda s: on_turn(s.episodes_done, s.episodes))
    try:
        return run_rollout(pool, env_id, seeds, group_size, engine, tokenizer, sampling, max_turns=max_turns,
                           max_context_tokens=max_context_tokens, policy_version=policy_version,
                           chat_kwargs=chat_kwargs, max_episode_retries=max_episode_retries,
                           on_progress=on_progress, context_options=context_options,
                           max_new_tokens_by_turn=max_new_tokens_by_turn).trajectories
    finally:
        if own_pool:
            pool.close()

