"""``agentrl run --agent module:function``: agents written against the OpenAI API as the rollout.

Each episode is one call of the agent function, ``run(task, base_url) -> reward | None`` (a plain function, run in a
thread, or an ``async def``, run on one event loop), in its own session of the policy server
(`agentrl.serve.server`): ``base_url`` is ``http://127.0.0.1:PORT/s/<session>/v1``, so every call the agent makes
with any OpenAI-compatible client is recorded as tokens. The task carries the env's first observation, its system
prompt and reset info, and `AgentTask.step` acts in the env; or, with ``agent.dataset``, a row of a JSONL file.

The reward is what the function returns; when it returns None, the sum of the env's rewards over its `AgentTask.step`
calls. The session becomes one `Trajectory` (`agentrl.serve.sessions.SessionLog.trajectory`), so groups, advantages,
the objective, trajectories.jsonl and metrics.jsonl work as for built-in envs; each session's drift report goes to
the run folder's ``agent_sessions.jsonl``.

Faults, handled as the env loop handles a failed env episode (`agentrl.rollout.loop`): an agent that raises, runs
past ``agent.timeout``, never calls the model, or returns neither a number nor a scored env episode fails its episode;
it is re-run (a new session) up to ``runners.max_episode_retries`` times, then its whole group is dropped, and every
failure is counted (``agent_errors``, ``agent_timeouts``, ``agent_no_calls``; ``env_errors``, ``episode_retries``,
``dropped_groups``) and logged. A timed-out session is closed: the server refuses its later calls (409). A plain
function that hangs cannot be stopped from outside: its thread is left behind (daemon) and no longer counts against
``agent.concurrency``; an ``async def`` is cancelled.

Concurrency: at most ``agent.concurrency`` sessions run at once; concurrent calls share the engine's batches.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agentrl.config import AgentConfig, ConfigError, ContextConfig, EnvConfig, RunnersConfig, SchedulerConfig
from agentrl.curriculum import Tasks
from agentrl.engine.base import RequestEngine, SamplingParams
from agentrl.http_server import RunningServer
from agentrl.records import Trajectory
from agentrl.rollout.agent_loader import AgentLoadError, load_agent
from agentrl.rollout.loop import RolloutResult, RolloutStats
from agentrl.rollout.pool import EnvMaker
from agentrl.serve.engine_client import EngineClient
from agentrl.serve.server import PolicyServer, session_url, start_server
from agentrl.serve.sessions import Recorder, Renderer

__all__ = ["AgentTask", "EnvOutcome", "AgentRollout", "load_agent", "AgentLoadError", "load_rows"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnvOutcome:
    """What `AgentTask.step` returns: the env's answer to one action."""

    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


@dataclass
class AgentTask:
    """One episode's task, handed to the agent function with its session's ``base_url``.

    Attributes:
        prompt: the env's first observation (or the dataset row's ``prompt``).
        system_prompt: the env's instructions ("" for a dataset row without ``system``).
        seed: the task's seed (a dataset row: its index).
        group: the task's index in the step (episodes of one group share a task).
        info: the env's reset info (``tools`` when the env declares them).
        row: the dataset row, or None.
        model: the model name to send in requests (any name is accepted).
        api_key: an API key for clients that need one (the server ignores it).
        session: the session id (the ``/s/<session>`` part of ``base_url``).
    """

    prompt: str
    system_prompt: str
    seed: int
    group: int
    info: dict[str, Any] = field(default_factory=dict)
    row: dict[str, Any] | None = None
    model: str = "policy"
    api_key: str = "agentrl"
    session: str = ""
    _env: Any = field(default=None, repr=False)
    _rewards: list[float] = field(default_factory=list, repr=False)
    _last: EnvOutcome | None = field(default=None, repr=False)

    def step(self, action: str) -> EnvOutcome:
        """Act in the env (the episode's own instance); its rewards score the episode when the agent returns None.

        Raises:
            RuntimeError: a dataset task (no env), or an env episode that already ended.
        """
        if self._env is None:
            raise RuntimeError("this task comes from a dataset row: there is no env to step; return the reward")
        if self._last is not None and (self._last.terminated or self._last.truncated):
            raise RuntimeError("the env episode has ended; return from the agent")
        observation, reward, terminated, truncated, info = self._env.step(action)
        self._rewards.append(float(reward))
        self._last = EnvOutcome(str(observation), float(reward), bool(terminated), bool(truncated), dict(info))
        return self._last

    @property
    def done(self) -> bool:
        """The env episode ended (terminated or truncated)."""
        return self._last is not None and (self._last.terminated or self._last.truncated)


@dataclass
class _Session:
    """One attempt at one episode (internal)."""

    task: AgentTask
    group: int
    index: int
    attempt: int
    started: float = 0.0
    result: Any = None
    error: str = ""
    kind: str = ""  # "" ok, or agent_error / timeout / no_calls / bad_return
    done: threading.Event = field(default_factory=threading.Event)


_FAULT_METRIC = {"agent_error": "agent_errors", "timeout": "agent_timeouts", "no_calls": "agent_no_calls",
                 "bad_return": "agent_bad_returns"}
"""`_Session.kind` -> the metric counting it."""


@dataclass
class _Rollout:
    """One rollout's bookkeeping (internal): what is left to start, what finished, what was dropped, counters."""

    step: int
    seeds: list[int]
    stats: RolloutStats
    todo: list[tuple[int, int, int]]  # (group, index in group, attempt)
    finished: dict[int, list[tuple[int, Trajectory, dict[str, Any]]]]
    dropped: set[int] = field(default_factory=set)
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_FAULT_METRIC.values(), 0))
    calls: int = 0
    extended: int = 0
    later: int = 0


class AgentRollout:
    """The rollout driver of agent runs: `rollout(step)` plays every task's group through the agent function.

    A `agentrl.rollout.driver.RolloutDriver`, as `agentrl.rollout.scheduler.RolloutScheduler` is; lockstep only
    (``sync_every`` honoured; no async rollouts, so no group is ever evicted as stale).

    Args:
        fn: the agent function.
        engine: the run's engine(s); closed with this rollout.
        weights: the trained weights by name (the backend's `named_weights`), read at each sync.
        tokenizer: the policy's tokenizer.
        maker: builds the envs (None with a dataset).
        rows: dataset rows (None: tasks come from the env).
        seeds_for_step: the task seeds of a step.
        sampling_for_step: the run's sampling settings for a step (they replace what agents ask for).
        group_size: episodes per task.
        concurrency: sessions at once.
        timeout: seconds a session may run.
        max_retries: re-runs of a failed episode before its group is dropped.
        sync_every: refresh the engine's weights every k steps.
        start_step: the first step.
        max_context_tokens: longest prompt + reply of one call.
        family: chat family name ("" detects it), with `family_hint` tried first.
        chat_kwargs: template variables.
        model_name: the name the server answers with.
        sessions_path: where each session's drift report is appended (None: not written).
    """

    @classmethod
    def from_config(cls, *, agent: AgentConfig, env: EnvConfig, scheduler: SchedulerConfig, runners: RunnersConfig,
                    context: ContextConfig, sampling: SamplingParams, engine: RequestEngine,
                    weights: Callable[[], Any], tokenizer, family_hint: str | None, model_name: str,
                    max_context_tokens: int, start_step: int, sessions_path: Path | None) -> AgentRollout:
        """The agent rollout a run's config asks for: its agent, env, scheduler, runners and (resolved) context.

        Step s plays the tasks ``env.seed_offset + s * prompts_per_step + i`` with sampling seed ``sampling.seed +
        s``, as `agentrl.rollout.scheduler.RolloutScheduler.from_config` does. A bad ``--agent`` or dataset closes
        `engine` before raising `ConfigError`.
        """
        try:
            fn = load_agent(agent.function)
            rows = load_rows(agent.dataset) if agent.dataset else None
        except ConfigError:
            engine.close()
            raise
        return cls(
            fn, engine, weights, tokenizer,
            maker=None if rows is not None else EnvMaker(env.id, dict(env.kwargs)), rows=rows,
            seeds_for_step=Tasks(env.id, env.seed_offset, scheduler.prompts_per_step, env.max_turns).fresh,
            sampling_for_step=lambda s: (sampling if sampling.seed is None
                                         else replace(sampling, seed=sampling.seed + s)),
            group_size=scheduler.group_size, concurrency=agent.concurrency, timeout=agent.timeout,
            max_retries=runners.max_episode_retries, sync_every=scheduler.sync_every, start_step=start_step,
            max_context_tokens=max_context_tokens, family=context.chat_family, family_hint=family_hint,
            chat_kwargs=context.chat_kwargs(), model_name=model_name, sessions_path=sessions_path)

    def __init__(self, fn: Callable[..., Any], engine: RequestEngine, weights: Callable[[], Any], tokenizer, *,
                 maker: EnvMaker | None, rows: list[dict[str, Any]] | None,
                 seeds_for_step: Callable[[int], list[int]], sampling_for_step: Callable[[int], SamplingParams],
                 group_size: int, concurrency: int = 8, timeout: float = 300.0, max_retries: int = 2,
                 sync_every: int = 1, start_step: int = 0, max_context_tokens: int = 4096, family: str = "",
                 family_hint: str | None = None, chat_kwargs: dict[str, Any] | None = None,
                 model_name: str = "policy", sessions_path: Path | None = None):
        self.fn, self.is_async = fn, inspect.iscoroutinefunction(fn)
        self.weights, self.maker, self.rows = weights, maker, rows
        self.seeds_for_step, self.sampling_for_step = seeds_for_step, sampling_for_step
        self.group_size, self.concurrency, self.timeout = group_size, concurrency, timeout
        self.max_retries, self.sync_every, self.start_step = max_retries, sync_every, start_step
        self.model_name, self.sessions_path = model_name, sessions_path
        self.env_id = maker.env_id if maker is not None else "dataset"
        self.client = EngineClient(engine)
        self.shared = maker.build_shared() if maker is not None else None
        self._closed_sessions: set[str] = set()
        self._calls: dict[str, int] = {}
        self._lock = threading.Lock()
        self._sync_seconds = 0.0
        recorder = Recorder(Renderer(tokenizer, family or None, family_hint=family_hint, chat_kwargs=chat_kwargs))
        self.policy = PolicyServer(
            self.client, recorder, model_name, defaults=sampling_for_step(start_step),
            max_context_tokens=max_context_tokens, forced_sampling=sampling_for_step(start_step),
            session_gate=self._gate, on_record=self._on_record, anonymous=False)
        self.server: RunningServer[PolicyServer] = start_server(self.policy)
        self._loop: asyncio.AbstractEventLoop | None = None
        if self.is_async:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, name="agent-loop", daemon=True).start()
        self._closed = False
        if self.client.policy_version != start_step:
            self._sync(start_step)

    # ---- the server's hooks ----------------------------------------------------------------------------------------

    def _gate(self, session: str) -> str | None:
        with self._lock:
            if session in self._closed_sessions:
                return f"session {session!r} is closed (its episode ended or timed out)"
            if session not in self._calls:
                return f"no running episode has session {session!r}: use the base_url the agent was given"
        return None

    def _on_record(self, rec) -> None:
        with self._lock:
            self._calls[rec.session] = self._calls.get(rec.session, 0) + 1

    # ---- weights ---------------------------------------------------------------------------------------------------

    def _sync(self, version: int) -> None:
        t0 = time.perf_counter()
        self.client.update_weights(self.weights(), version)
        self._sync_seconds += time.perf_counter() - t0

    def updated(self, step: int) -> None:
        """Nothing to do after an update: lockstep syncs before the next rollout."""

    @property
    def stale_groups_evicted(self) -> int:
        """Always 0: lockstep rollouts are trained at once, never evicted as stale."""
        return 0

    @property
    def engine(self) -> RequestEngine:
        """The engine(s) the agents' calls reach (set-up records the nodes of their replicas)."""
        return self.client.engine

    # ---- one rollout -----------------------------------------------------------------------------------------------

    def _task(self, seed: int, group: int, session: str) -> AgentTask:
        if self.rows is not None:
            row = self.rows[seed % len(self.rows)]
            return AgentTask(prompt=str(row.get("prompt", "")), system_prompt=str(row.get("system", "")), seed=seed,
                             group=group, row=row, model=self.model_name, session=session)
        env = self.maker.make(self.shared)
        observation, info = env.reset(seed=seed)
        return AgentTask(prompt=str(observation), system_prompt=env.system_prompt, seed=seed, group=group,
                         info=dict(info), model=self.model_name, session=session, _env=env)

    def _run_one(self, s: _Session) -> None:
        """The agent function on one task, in this thread (plain functions) or on the event loop (async ones)."""
        try:
            url = session_url(self.server.address, s.task.session)
            if self.is_async:
                future = asyncio.run_coroutine_threadsafe(
                    asyncio.wait_for(self.fn(s.task, url), self.timeout), self._loop)
                s.result = future.result()
            else:
                s.result = self.fn(s.task, url)
        except (asyncio.TimeoutError, TimeoutError):
            s.kind, s.error = "timeout", f"the agent ran past agent.timeout ({self.timeout:g} s)"
        except BaseException as e:  # the agent's own failure: its episode fails, the run goes on
            s.kind, s.error = "agent_error", f"{type(e).__name__}: {e}"
        finally:
            s.done.set()

    def rollout(self, step: int) -> RolloutResult:
        """Every task of the step, `group_size` sessions each; complete groups only, in group order."""
        if (step - self.start_step) % self.sync_every == 0 and self.client.policy_version != step:
            self._sync(step)
        self.policy.forced_sampling = self.sampling_for_step(step)
        seeds = self.seeds_for_step(step)
        state = _Rollout(step, seeds, RolloutStats(episodes=len(seeds) * self.group_size),
                         todo=[(g, i, 0) for g in range(len(seeds)) for i in range(self.group_size)],
                         finished={g: [] for g in range(len(seeds))})
        t_start = time.perf_counter()
        running: list[_Session] = []
        while state.todo or running:
            while state.todo and len(running) < self.concurrency:
                g, i, attempt = state.todo.pop(0)
                if g not in state.dropped:
                    running.append(self._start(step, seeds[g], g, i, attempt))
            time.sleep(0.01)
            still = []
            for s in running:
                if not s.done.is_set():
                    if time.monotonic() - s.started <= self.timeout + 1.0:
                        still.append(s)
                        continue
                    # A plain function past its timeout: give up on it (its thread cannot be stopped).
                    s.kind, s.error = "timeout", f"the agent ran past agent.timeout ({self.timeout:g} s)"
                self._finish(s, state)
            running = still
            state.stats.seconds = time.perf_counter() - t_start
        return self._result(state)

    def _start(self, step: int, seed: int, group: int, index: int, attempt: int) -> _Session:
        """A new session for one attempt at one episode, its agent running."""
        # A random part: another process on this machine cannot guess a running episode's session to write into it.
        session = f"step{step}-g{group}-e{index}-a{attempt}-{secrets.token_hex(8)}"
        with self._lock:
            self._calls[session] = 0
        try:
            task = self._task(seed, group, session)
        except Exception as e:  # the env's reset failed: as a failed episode
            s = _Session(AgentTask("", "", seed, group, session=session), group, index, attempt,
                         kind="agent_error", error=f"env reset: {type(e).__name__}: {e}")
            s.done.set()
            return s
        s = _Session(task, group, index, attempt, started=time.monotonic())
        threading.Thread(target=self._run_one, args=(s,), name=f"agent-{session}", daemon=True).start()
        return s

    def _finish(self, s: _Session, state: _Rollout) -> None:
        """Close a finished (or abandoned) session: its trajectory, or its failure counted and retried / dropped."""
        with self._lock:
            self._closed_sessions.add(s.task.session)
            n_calls = self._calls.pop(s.task.session, 0)
        log_ = self.policy.recorder.pop(s.task.session)
        if log_ is None and n_calls and not s.kind:  # evicted over the recorder's caps: its calls are gone
            s.kind, s.error = "agent_error", "the session was evicted over the server's memory caps"
        if s.task._env is not None:
            s.task._env.close()
        reward, success = self._score(s, n_calls)
        stats = state.stats
        if s.kind:
            state.counts[_FAULT_METRIC[s.kind]] += 1
            stats.errors += 1
            line = f"{s.kind} (group {s.group}, seed {s.task.seed}, attempt {s.attempt + 1}): {s.error}"
            stats.failures.append(line)
            if s.group in state.dropped:
                return
            if s.attempt >= self.max_retries:
                log.warning("dropping group %d (seed %d) after %d failed attempts; last: %s", s.group, s.task.seed,
                            s.attempt + 1, s.error)
                state.dropped.add(s.group)
                stats.dropped_groups += 1
                stats.episodes_done += self.group_size - len(state.finished[s.group])
                state.finished[s.group] = []
            else:
                log.warning("re-running agent episode: %s", line)
                stats.retries += 1
                state.todo.insert(0, (s.group, s.index, s.attempt + 1))
            return
        if s.group in state.dropped:
            return
        traj = log_.trajectory(reward, env_id=self.env_id, seed=s.task.seed, group_id=s.group,
                               first_observation=s.task.prompt, success=success,
                               task_type=str(s.task.info.get("task_type", "")))
        report = log_.report()
        state.calls += report.calls
        state.extended += report.extended
        state.later += report.extended + report.rerendered
        stats.generated_tokens += traj.num_generated_tokens
        stats.env_steps += len(s.task._rewards)
        stats.episodes_done += 1
        state.finished[s.group].append((s.index, traj, report.to_json() | {
            "step": state.step, "group": s.group, "seed": s.task.seed, "reward": reward,
            "samples": len(log_.samples(0.0))}))

    def _result(self, state: _Rollout) -> RolloutResult:
        """The complete groups in group order; their session reports appended to `sessions_path`."""
        trajectories, reports = [], []
        for g in sorted(state.finished):
            if g in state.dropped or len(state.finished[g]) < self.group_size:
                continue
            for _, traj, report in sorted(state.finished[g], key=lambda x: x[0]):
                trajectories.append(traj)
                reports.append(report)
        if self.sessions_path is not None and reports:
            with open(self.sessions_path, "a") as f:
                for r in reports:
                    f.write(json.dumps(r) + "\n")
        self.client.clear_cache()
        seconds, self._sync_seconds = self._sync_seconds, 0.0
        episodes = max(1, len(trajectories))
        stats = state.stats
        stats.engine = {"weight_sync_seconds": seconds, **self.client.metrics(),
                        **{k: float(v) for k, v in state.counts.items()},
                        "agent_calls_per_episode": state.calls / episodes,
                        "agent_extend_frac": state.extended / state.later if state.later else 1.0}
        stats.generate_seconds = stats.seconds  # the engine serves the agents the whole rollout long
        return RolloutResult(trajectories, stats)

    def _score(self, s: _Session, n_calls: int) -> tuple[float, bool]:
        """The episode's reward and success; sets `s.kind` when the episode must count as failed."""
        if s.kind:
            return 0.0, False
        if n_calls == 0:
            s.kind, s.error = "no_calls", "the agent returned without calling the model"
            return 0.0, False
        result = s.result
        last = s.task._last
        success = bool(last.info.get("success", False)) if last is not None else False
        if result is None:
            if not s.task._rewards:
                s.kind, s.error = "bad_return", ("the agent returned None and never stepped the env: return the "
                                                 "reward, or score the episode with task.step(action)")
                return 0.0, False
            return float(sum(s.task._rewards)), success
        if isinstance(result, bool) or not isinstance(result, (int, float)) or not math.isfinite(result):
            s.kind, s.error = "bad_return", f"the agent returned {result!r}: return a finite number or None"
            return 0.0, False
        return float(result), success if last is not None else result > 0

    def close(self) -> None:
        """Stop the server, the event loop and the engine (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.server.stop()
        self.client.close()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)


def load_rows(path: str) -> list[dict[str, Any]]:
    """A dataset's rows (JSONL objects); a bad line is named."""
    rows = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise ConfigError(f"agent.dataset: cannot read {path} ({e.strerror or e})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"agent.dataset: {path}:{n} is not JSON ({e})") from None
        if not isinstance(row, dict):
            raise ConfigError(f"agent.dataset: {path}:{n} must be a JSON object")
        rows.append(row)
    if not rows:
        raise ConfigError(f"agent.dataset: {path} has no rows")
    return rows
