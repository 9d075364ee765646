"""Runner pools: where env instances live, how they step, and what happens when one of them fails.

A pool offers `slots`: each slot holds one env and runs one episode at a time, so `--runners N` means N episodes
in flight at once. The rollout loop (`agentrl.rollout.loop`) keeps the chat context and the engine in the driver and
only sends action text to a slot and gets an observation back: token-in/token-out never leaves the driver.

Two pools share one small interface (`submit_reset`, `submit_step`, `poll`, `close`):

* `LocalPool` (``--runners 0``): envs in the driver process, stepped synchronously. For debugging: a pdb
  breakpoint in `env.step` works, and there is no Ray at all. A hanging env hangs the run (no timeout).
* `RayPool` (``--runners N``): the N slots are spread over a few Ray actors (`EnvHost`, by default one per CPU
  of the cluster), so 32 runners cost a handful of processes, not 32 processes of ~50 MB each. Calls are Ray
  futures, so env steps run while the driver generates for other episodes. Submitting only queues a call; `poll`
  sends each actor ONE Ray call with all its queued env calls (a scheduling round), and the results stream back
  as they finish. A Ray message costs about a millisecond of driver and actor time, far more than a cheap env step
  (math: ~0.1 ms), so one message per actor per round instead of one per slot is what lets cheap envs scale; the
  streaming keeps a slow step from holding back its neighbours' results.

Shared state (the `TextEnv.shared` declaration): an env class may name a `SharedResource` subclass holding heavy
read-only data (a catalogue, a search index, a problem file). The pool builds it ONCE in the driver and puts it in
the Ray object store; every actor on a node then maps the same buffers (numpy arrays are read zero-copy, memory-mapped
files stay file-backed), and every env in an actor receives that one object through `shared=`. A resource that
cannot be pickled is built once per actor process instead. Either way it is never built or copied per runner.

Threads: an `EnvHost` is an async actor; each of its slots is pinned to one worker thread, so an env is always
stepped from the thread that created it, while envs of the same actor step concurrently (an env that waits on I/O
does not block its neighbours). An env class whose envs must all share one thread (Playwright's sync API belongs to
the thread that started the browser) says so with ``metadata["single_thread"] = True``; its actor then uses one
thread for all its slots.

Faults never end the run; they come back as `EnvFailure` records and the rollout loop re-runs the episode from its
seed (see `agentrl.rollout.loop`):

* the env raises in `reset` / `step` / construction: `EnvFailure(kind="error")` with the traceback; the slot's env
  is rebuilt on its next episode.
* a call runs past `step_timeout` (timed inside the actor, from when its thread starts it): the actor (and its
  stuck thread) is killed and restarted; `kind="timeout"` for that call, `kind="actor_restarted"` for its
  neighbours in flight. An actor that gives no result at all for 2 x step_timeout + 10 s (its event loop is
  blocked) is restarted too, its calls failing as timeouts.
* the actor process dies (OOM killer, segfault, kill -9): Ray restarts it; `kind="actor_died"` for its calls.

One fault does end the rollout: a runner that Ray cannot start again (its node was lost and no other node has room
for it) raises `RunnersLost` once it has been down for `RESTART_TIMEOUT_S` (or 2 x step_timeout + 10 s, if longer),
rather than holding its episodes forever.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import time
import traceback
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl.cluster import ClusterError, shipped_code, start_ray
from agentrl.envs.core import SharedResource, TextEnv

__all__ = [
    "EnvMaker", "StepResult", "EnvFailure", "Completion", "LocalPool", "RayPool", "make_pool", "start_ray",
    "SINGLE_THREAD_KEY", "RunnersLost", "RESTART_TIMEOUT_S",
]

log = logging.getLogger(__name__)

RESTART_TIMEOUT_S = 120.0
"""How long a runner may be down (Ray restarting it) before the pool gives up with `RunnersLost`."""


class RunnersLost(RuntimeError):
    """A runner process died and Ray could not start it again in time (its node lost, no room on the others)."""

SINGLE_THREAD_KEY = "single_thread"
"""`TextEnv.metadata` key: True when every env of the class must be stepped from one thread per process."""

# Only these info keys travel back to the driver: the rollout loop needs nothing else, and an info may hold large
# objects (screenshots) that would cost a copy per step. Screenshots travel only for the episodes a rollout asks
# them of (`submit_reset(..., screenshots=True)`), as PNG bytes in `StepResult.screenshot`.
# "tools": an env asking for function calls; "grade_budget_exceeded": a reward graded wrong past its budget (counted).
_INFO_KEYS = ("success", "task_type", "tools", "grade_budget_exceeded")


@dataclass(frozen=True)
class EnvMaker:
    """How a runner builds envs: a registry id (or an explicit class / factory) and constructor kwargs.

    It travels to the Ray actors, so it holds only picklable things: a registry id, or a class importable there.

    Attributes:
        env_id: registry id; recorded in trajectories.
        kwargs: constructor keyword arguments (on top of the registered defaults).
        entry_point: a class or factory (or ``"pkg.module:Class"``) to use instead of the registry's.
        py_modules: local code (a ``.py`` file or a package folder) the runner processes must be able to import
            `entry_point` from; `start_ray` ships it to them in the job's ``runtime_env={"py_modules": ...}``.
    """

    env_id: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    entry_point: Callable[..., TextEnv] | str | None = None
    py_modules: tuple[str, ...] = ()

    def resolved(self) -> EnvMaker:
        """The same maker with the registry lookup done here, so runner processes need no entry-point metadata."""
        if self.entry_point is not None:
            return self
        from agentrl.envs.registry import spec

        s = spec(self.env_id)
        return EnvMaker(self.env_id, {**s.defaults, **self.kwargs}, entry_point=s.entry_point,
                        py_modules=s.py_modules)

    def _factory_and_kwargs(self) -> tuple[Callable[..., TextEnv], dict[str, Any]]:
        from agentrl.envs.registry import EnvSpec, spec

        if isinstance(self.entry_point, str):
            return EnvSpec(self.env_id, self.entry_point).load(), dict(self.kwargs)
        if self.entry_point is not None:
            return self.entry_point, dict(self.kwargs)

        s = spec(self.env_id)
        return s.load(), {**s.defaults, **self.kwargs}

    @property
    def shared_type(self) -> type[SharedResource] | None:
        """The env class's `shared` declaration (None for envs without shared state, or plain factories)."""
        factory, _ = self._factory_and_kwargs()
        return getattr(factory, "shared", None)

    @property
    def single_thread(self) -> bool:
        """True when the env class asks for all its envs in a process to step on one thread."""
        factory, _ = self._factory_and_kwargs()
        return bool(getattr(factory, "metadata", {}).get(SINGLE_THREAD_KEY, False))

    def build_shared(self) -> SharedResource | None:
        """Build the declared shared resource once (None when the env declares none, or its `build` says none)."""
        shared_type = self.shared_type
        if shared_type is None:
            return None
        _, kwargs = self._factory_and_kwargs()
        return shared_type.build(**kwargs)

    def make(self, shared: SharedResource | None = None) -> TextEnv:
        """Create one env, handing it `shared` when there is one."""
        factory, kwargs = self._factory_and_kwargs()
        if shared is not None:
            kwargs["shared"] = shared
        return factory(**kwargs)


@dataclass(frozen=True)
class StepResult:
    """What an env returned from `reset` (reward 0, not done) or `step`.

    Attributes:
        observation: the text observation.
        reward: the step's reward.
        terminated: the task ended.
        truncated: a budget ran out.
        info: the `info` keys the rollout uses (``success``, ``task_type``, ``tools``, ``grade_budget_exceeded``).
        seconds: wall time of the env call inside the runner.
        system_prompt: the env's `system_prompt` (on `reset` results only).
        screenshot: the step's ``info["image"]`` as PNG bytes, only for an episode started with ``screenshots=True``
            (None otherwise, or when the env rendered no image).
    """

    observation: str
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: Mapping[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    system_prompt: str = ""
    screenshot: bytes | None = field(default=None, repr=False)


FailureKind = Literal["error", "timeout", "actor_died", "actor_restarted"]


@dataclass(frozen=True)
class EnvFailure:
    """An env call that did not return a result; its episode must be re-run from the seed.

    Attributes:
        kind: ``error`` (the env raised), ``timeout`` (ran past `step_timeout`), ``actor_died`` (the runner
            process died), ``actor_restarted`` (a neighbour's timeout restarted the runner).
        message: the exception and the last lines of its traceback, or what happened.
    """

    kind: FailureKind
    message: str


@dataclass(frozen=True)
class Completion:
    """One finished call: the slot, which call it was, and its result or failure."""

    slot: int
    op: Literal["reset", "step"]
    outcome: StepResult | EnvFailure


def _slim_info(info: Mapping[str, Any]) -> dict[str, Any]:
    return {k: info[k] for k in _INFO_KEYS if k in info}


def _png(image: Any) -> bytes | None:
    """`image` (a PIL image or an HxW(xC) uint8 array) as PNG bytes; None for anything else.

    Encoded in the runner, so what travels to the driver is a compressed file rather than a pickled bitmap.
    """
    if image is None:
        return None
    import io

    from PIL import Image

    if not isinstance(image, Image.Image):
        try:
            image = Image.fromarray(image)
        except (TypeError, ValueError, AttributeError):  # not an image: nothing to save
            return None
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _failure_from(exc: BaseException, where: str) -> EnvFailure:
    tail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:]).strip()
    return EnvFailure("error", f"{where}: {type(exc).__name__}: {exc}\n{tail}")


class _Slots:
    """The envs of one process, one per slot, built lazily (shared by `LocalPool` and `EnvHost`)."""

    def __init__(self, maker: EnvMaker, shared: SharedResource | None):
        self.maker = maker
        self.shared = shared
        self.envs: dict[int, TextEnv] = {}
        self.shoot: set[int] = set()  # slots whose current episode ships its screenshots to the driver

    def reset(self, slot: int, seed: int, fresh: bool, screenshots: bool = False) -> StepResult | EnvFailure:
        t0 = time.perf_counter()
        if screenshots:
            self.shoot.add(slot)
        else:
            self.shoot.discard(slot)
        try:
            if fresh or slot not in self.envs:
                self.close(slot)
                self.envs[slot] = self.maker.make(self.shared)
            obs, info = self.envs[slot].reset(seed=seed)
        except Exception as e:  # the env's own bug: report it, the rollout re-runs the episode
            self.envs.pop(slot, None)
            return _failure_from(e, f"reset(seed={seed}) of {self.maker.env_id!r}")
        return StepResult(str(obs), info=_slim_info(info), seconds=time.perf_counter() - t0,
                          system_prompt=self.envs[slot].system_prompt)

    def step(self, slot: int, action: str) -> StepResult | EnvFailure:
        env = self.envs.get(slot)
        if env is None:  # the runner restarted since this episode began: its env is gone
            return EnvFailure("actor_restarted", f"slot {slot} has no env (its runner restarted)")
        t0 = time.perf_counter()
        try:
            obs, reward, terminated, truncated, info = env.step(action)
        except Exception as e:
            self.envs.pop(slot, None)
            return _failure_from(e, f"step of {self.maker.env_id!r}")
        # Only the few episodes the rollout asked for pay the PNG encoding and the transfer of their images.
        shot = _png(info.get("image")) if slot in self.shoot else None
        return StepResult(str(obs), float(reward), bool(terminated), bool(truncated), _slim_info(info),
                          time.perf_counter() - t0, screenshot=shot)

    def close(self, slot: int) -> None:
        env = self.envs.pop(slot, None)
        if env is not None:
            try:
                env.close()
            except Exception as e:  # a failing close must not take the next episode down with it
                log.warning("closing %s env of slot %d failed: %s", self.maker.env_id, slot, e)

    def close_all(self) -> None:
        for slot in list(self.envs):
            self.close(slot)


class LocalPool:
    """Envs in the driver process, stepped synchronously when submitted (``--runners 0``).

    Args:
        maker: builds the envs.
        slots: concurrent episodes.
    """

    def __init__(self, maker: EnvMaker, slots: int):
        if slots < 1:
            raise ValueError(f"a pool needs at least one slot, got {slots}")
        self.slots = slots
        self._slots = _Slots(maker, maker.build_shared())
        self._done: list[Completion] = []

    def submit_reset(self, slot: int, seed: int, fresh: bool = False, screenshots: bool = False) -> None:
        """Start an episode in `slot` (a new env when `fresh` or when the slot has none).

        With `screenshots`, each step of the episode returns its ``info["image"]`` as PNG bytes.
        """
        self._done.append(Completion(slot, "reset", self._slots.reset(slot, seed, fresh, screenshots)))

    def submit_step(self, slot: int, action: str) -> None:
        """Step the env of `slot`."""
        self._done.append(Completion(slot, "step", self._slots.step(slot, action)))

    def poll(self, block: bool = True) -> list[Completion]:
        """Return the calls finished since the last poll (all of them: calls run on submit)."""
        done, self._done = self._done, []
        return done

    @property
    def in_flight(self) -> int:
        """Calls submitted but not yet returned by `poll`."""
        return len(self._done)

    def close(self) -> None:
        """Close every env."""
        self._slots.close_all()

    def __enter__(self) -> LocalPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


Call = tuple[int, int, str, tuple]
"""What `EnvHost.run` receives per env call: (call id, slot, ``"reset"`` or ``"step"``, arguments)."""


class EnvHost:
    """A Ray actor hosting the envs of several slots (wrapped with `ray.remote` by `RayPool`).

    Args:
        maker: builds the envs.
        shared: the shared resource (resolved from the object store by Ray), or None.
        build_shared: build the shared resource here (it could not be pickled in the driver).
        threads: worker threads; slot `s` always runs on thread `s % threads`.
        step_timeout: seconds one env call may run once its thread has started it.
    """

    def __init__(self, maker: EnvMaker, shared: SharedResource | None, build_shared: bool, threads: int,
                 step_timeout: float = 60.0):
        self._slots = _Slots(maker, maker.build_shared() if build_shared else shared)
        self._step_timeout = step_timeout
        # One single-thread executor per lane pins each env to the thread that created it.
        self._lanes = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"env-lane{i}") for i in range(threads)]

    async def ready(self) -> int:
        """The actor's process id, once it is constructed."""
        return os.getpid()

    async def node(self) -> str:
        """The id of the Ray node this runner process lives on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    async def run(self, calls: list[Call]) -> AsyncIterator[list[tuple[int, StepResult | EnvFailure]]]:
        """Start every call at once (each on its slot's thread); yield ``(call id, outcome)`` lists as they finish.

        One Ray call carries the env calls of a whole scheduling round for this actor, and its results stream back
        in a few messages: a cheap env step costs far less than a Ray message, while a slow step must not hold back
        the results of its fast neighbours.
        """
        loop = asyncio.get_running_loop()
        tasks = {asyncio.ensure_future(self._timed(slot, op, args)): call_id for call_id, slot, op, args in calls}
        pending: set[asyncio.Future] = set(tasks)
        t0 = loop.time()
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if pending:
                # Calls started together tend to end together: wait a little for the others so that one message
                # carries several results: 1 ms plus a quarter of the time the batch has run so far, at most 20 ms,
                # so a slow step delays its finished neighbours by little.
                linger = min(0.02, 0.001 + 0.25 * (loop.time() - t0))
                more, pending = await asyncio.wait(pending, timeout=linger)
                done |= more
            yield [(tasks[task], task.result()) for task in done]

    async def _timed(self, slot: int, op: str, args: tuple) -> StepResult | EnvFailure:
        """Run one env call on its slot's thread, or report a timeout.

        `step_timeout` counts from when the thread starts the call, not from when it was queued behind a neighbour.
        A stuck thread cannot be stopped: the driver restarts the whole actor when it sees the timeout.
        """
        loop = asyncio.get_running_loop()
        started = loop.create_future()
        fn = functools.partial(self._slots.reset if op == "reset" else self._slots.step, slot, *args)

        def body() -> StepResult | EnvFailure:
            loop.call_soon_threadsafe(started.set_result, None)
            return fn()

        result = loop.run_in_executor(self._lanes[slot % len(self._lanes)], body)
        try:
            await started
            return await asyncio.wait_for(asyncio.shield(result), self._step_timeout)
        except asyncio.TimeoutError:
            return EnvFailure("timeout", f"{op} of slot {slot} ran past step_timeout={self._step_timeout}s")
        except Exception as e:  # `_Slots` reports env errors itself: this is the machinery failing
            return _failure_from(e, f"{op} of slot {slot}")

    async def close_all(self) -> None:
        """Close every env of this actor."""
        loop = asyncio.get_running_loop()
        for slot in list(self._slots.envs):
            await loop.run_in_executor(self._lanes[slot % len(self._lanes)],
                                       functools.partial(self._slots.close, slot))


def _check_code_shipped(maker: EnvMaker) -> None:
    """Refuse a ``file.py:Class`` / ``module:Class`` env whose code the Ray job does not carry (runners would fail).

    Ray accepts local paths in ``py_modules`` only in the job's runtime_env, at ``ray.init``; `start_ray` adds the
    code of every such env loaded so far. An env loaded after Ray started misses it.
    """
    shipped = shipped_code()
    missing = [path for path in maker.py_modules if shipped is not None and path not in shipped]
    if missing:
        raise ClusterError(f"env {maker.env_id!r} needs {missing[0]} in its Ray runners, but Ray was started before "
                           f"the env was loaded; call agentrl.spec({maker.env_id!r}) before starting Ray")


@dataclass(frozen=True)
class _Call:
    id: int
    slot: int
    op: Literal["reset", "step"]
    args: tuple
    host: int


@dataclass
class _Stream:
    """One `EnvHost.run` call in flight: its actor, the calls not answered yet, when it last made progress."""

    host: int
    calls: dict[int, _Call]
    progress_at: float


class RayPool:
    """`slots` envs spread over a few Ray actors; calls go out in batches, one per actor, collected with `poll`.

    `submit_reset` / `submit_step` only queue a call. `poll` first sends the queue: one Ray call per actor carrying
    all of that actor's calls (a scheduling round of the rollout loop), whose results stream back as they finish.

    Args:
        maker: builds the envs (must be picklable: a registry id, or an importable class).
        slots: concurrent episodes.
        actors: runner processes; 0 picks one per CPU of the cluster (never more than `slots`).
        step_timeout: seconds an env call may run in its runner; past it the runner is restarted.
        address: Ray cluster to join; None starts a local Ray (shut down again by `close`).
        batch_calls: send each actor's queued calls as one Ray call. False sends one Ray call per env call (the
            behaviour before batching; `bench/micro/pool_throughput.py` measures it as the baseline).
    """

    def __init__(self, maker: EnvMaker, slots: int, *, actors: int = 0, step_timeout: float = 60.0,
                 address: str | None = None, batch_calls: bool = True):
        import ray

        if slots < 1:
            raise ValueError(f"a pool needs at least one slot, got {slots}")
        if step_timeout <= 0:
            raise ValueError(f"step_timeout must be positive, got {step_timeout}")
        self.slots = slots
        self.step_timeout = step_timeout
        self.batch_calls = batch_calls
        maker = maker.resolved()
        self._owns_ray = start_ray(address)
        _check_code_shipped(maker)
        # CPUs not already held (by trainer workers, say): actors asking for more would wait forever.
        cluster_cpus = max(1, int(ray.available_resources().get("CPU", 1)))
        n_actors = min(slots, actors if actors > 0 else cluster_cpus)
        slots_per_actor = math.ceil(slots / n_actors)
        threads = 1 if maker.single_thread else slots_per_actor

        shared = maker.build_shared()
        build_in_actor = False
        shared_arg: Any = None
        if shared is not None:
            try:
                shared_arg = ray.put(shared)  # once per cluster; actors on a node map the same object
            except Exception as e:  # unpicklable (open handles): each actor process builds its own
                log.info("shared %s cannot go to the object store (%s); building it once per runner process",
                         type(shared).__name__, e)
                build_in_actor = True

        remote_host = ray.remote(EnvHost).options(
            max_restarts=-1, max_task_retries=0, num_cpus=min(1.0, cluster_cpus / n_actors),
            max_concurrency=max(8, 2 * slots_per_actor + 2), scheduling_strategy="SPREAD",
        )
        self._hosts = [remote_host.remote(maker, shared_arg, build_in_actor, threads, step_timeout)
                       for _ in range(n_actors)]
        self._ready_at: list[float | None] = [None] * n_actors
        self._down_since: list[float | None] = [None] * n_actors  # when a running actor died (None: not down)
        self._ready_refs = {h.ready.remote(): i for i, h in enumerate(self._hosts)}
        self._queued: list[_Call] = []  # submitted, not sent yet (or held while their actor restarts)
        self._streams: dict[Any, _Stream] = {}  # ObjectRefGenerator -> its calls still unanswered
        self._pending: list[Completion] = []  # failures decided in the driver (restarts), returned by `poll`
        self._next_id = 0
        self.restarts = 0
        self.messages = 0  # Ray calls sent for env calls (tests and benchmarks read it)

    @property
    def actors(self) -> int:
        """Number of runner processes."""
        return len(self._hosts)

    def host_of(self, slot: int) -> int:
        """Index of the actor that hosts `slot`."""
        return slot % len(self._hosts)

    def actor_handle(self, index: int) -> Any:
        """The Ray handle of actor `index` (tests kill it)."""
        return self._hosts[index]

    def nodes(self, timeout: float = 60.0) -> list[str]:
        """The Ray node id of each runner process, in actor order."""
        import ray

        return ray.get([h.node.remote() for h in self._hosts], timeout=timeout)

    def submit_reset(self, slot: int, seed: int, fresh: bool = False, screenshots: bool = False) -> None:
        """Start an episode in `slot`; the call goes out with the next `poll`, its result comes back from a `poll`.

        With `screenshots`, each step of the episode returns its ``info["image"]`` as PNG bytes.
        """
        self._queue(slot, "reset", (int(seed), bool(fresh), bool(screenshots)))

    def submit_step(self, slot: int, action: str) -> None:
        """Step the env of `slot`; the call goes out with the next `poll`, its result comes back from a `poll`."""
        self._queue(slot, "step", (action,))

    def _queue(self, slot: int, op: Literal["reset", "step"], args: tuple) -> None:
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} out of range: this pool has {self.slots} slots")
        self._queued.append(_Call(self._next_id, slot, op, args, self.host_of(slot)))
        self._next_id += 1

    def _flush(self) -> None:
        """Send the queued calls of every running actor; calls for an actor that is (re)starting stay queued."""
        by_host: dict[int, list[_Call]] = {}
        held = []
        for call in self._queued:
            if self._ready_at[call.host] is None:  # a restarting actor refuses calls: hold them until it is back
                held.append(call)
            else:
                by_host.setdefault(call.host, []).append(call)
        self._queued = held
        now = time.monotonic()
        for host, calls in by_host.items():
            for batch in [calls] if self.batch_calls else [[c] for c in calls]:
                gen = self._hosts[host].run.options(num_returns="streaming").remote(
                    [(c.id, c.slot, c.op, c.args) for c in batch])
                self._streams[gen] = _Stream(host, {c.id: c for c in batch}, now)
                self.messages += 1

    @property
    def in_flight(self) -> int:
        """Calls submitted but not yet returned by `poll`."""
        return sum(len(s.calls) for s in self._streams.values()) + len(self._queued) + len(self._pending)

    def poll(self, block: bool = True, gather_seconds: float = 0.002) -> list[Completion]:
        """Send the queued calls, then return the finished ones. With `block`, wait for at least one.

        After the first completion, results that arrive within `gather_seconds` are collected too, so the engine's
        next batch is not a batch of one.
        """
        import ray

        while True:
            self._check_ready()
            self._flush()
            done = self._collect(timeout=0.0)
            if done or self._pending or not block or not (self._streams or self._queued):
                break
            done = self._collect(timeout=0.2, first=True)
            if done:
                done += self._collect(timeout=gather_seconds)
                break
            self._check_unresponsive(ray)
            self._check_down()
        out, self._pending = self._pending + done, []
        return out

    def _check_ready(self) -> None:
        import ray

        if not self._ready_refs:
            return
        ready, _ = ray.wait(list(self._ready_refs), num_returns=len(self._ready_refs), timeout=0)
        for ref in ready:
            index = self._ready_refs.pop(ref)
            try:
                ray.get(ref)
                self._ready_at[index] = time.monotonic()
                self._down_since[index] = None
            except Exception:  # died while starting: Ray restarts it; ask again
                self._ready_refs[self._hosts[index].ready.remote()] = index

    def _collect(self, timeout: float, first: bool = False) -> list[Completion]:
        import ray

        refs = list(self._streams)
        if first:  # also wake up when a restarting actor comes back, so its held calls go out
            refs += list(self._ready_refs)
        if not refs:
            return []
        ready, _ = ray.wait(refs, num_returns=1 if first else len(refs), timeout=timeout)
        if first and ready:  # anything else already finished comes along
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        out: list[Completion] = []
        timed_out: set[int] = set()
        for gen in ready:
            stream = self._streams.get(gen)
            if stream is None:  # an actor's ready signal (`_check_ready` handles it), or a stream already failed
                continue
            try:
                items = ray.get(next(gen))
            except StopIteration:  # cannot happen while calls are unanswered; fail them rather than wait forever
                items = [(i, EnvFailure("error", f"runner {stream.host} ended a batch without answering"))
                         for i in stream.calls]
            except ray.exceptions.RayActorError as e:
                items = [(i, EnvFailure("actor_died", f"runner {stream.host} died: {type(e).__name__}: {e}"))
                         for i in stream.calls]
                self._mark_restarting(stream.host)
            except Exception as e:  # a Ray-level failure (serialization, object lost) fails these episodes only
                items = [(i, EnvFailure("error", f"runner {stream.host}: {type(e).__name__}: {e}"))
                         for i in stream.calls]
            stream.progress_at = time.monotonic()
            for call_id, outcome in items:
                call = stream.calls.pop(call_id)
                out.append(Completion(call.slot, call.op, outcome))
                if isinstance(outcome, EnvFailure) and outcome.kind == "timeout":
                    timed_out.add(call.host)
            if not stream.calls:
                del self._streams[gen]  # its last message carried its last result: no need to wait for the end
        for host in timed_out:
            log.warning("runner %d: an env call ran past step_timeout=%.1fs; restarting the runner", host,
                        self.step_timeout)
            self._restart(host, "a neighbour's timeout")
        return out

    def _restart(self, host: int, why: str, kind: FailureKind = "actor_restarted") -> None:
        """Kill and restart actor `host` (a stuck thread cannot be stopped from outside); fail its calls in flight."""
        import ray

        for gen, stream in list(self._streams.items()):
            if stream.host != host:
                continue
            del self._streams[gen]
            for call in stream.calls.values():
                self._pending.append(Completion(call.slot, call.op,
                                                EnvFailure(kind, f"runner {host} restarted after {why}")))
        ray.kill(self._hosts[host], no_restart=False)
        self._mark_restarting(host)

    def _mark_restarting(self, host: int) -> None:
        if self._ready_at[host] is None:
            return
        self._ready_at[host] = None
        self._down_since[host] = time.monotonic()
        self.restarts += 1
        self._ready_refs[self._hosts[host].ready.remote()] = host

    def _check_down(self) -> None:
        """Raise `RunnersLost` when a runner Ray restarts has been down too long to wait for."""
        now, limit = time.monotonic(), max(RESTART_TIMEOUT_S, 2 * self.step_timeout + 10)
        for host, since in enumerate(self._down_since):
            if since is not None and now - since > limit:
                raise RunnersLost(f"env runner {host} died and was not running again after {now - since:.0f}s: no "
                                  f"node of the Ray cluster has room for it (was its node lost?)")

    def _check_unresponsive(self, ray: Any) -> None:
        """Restart an actor that gave no result for 2 x step_timeout + 10 s, failing its calls as timeouts.

        A backstop: an env call stuck in C code that holds the GIL stops the actor's event loop, so the actor's own
        per-call timeouts cannot fire.
        """
        now = time.monotonic()
        limit = 2 * self.step_timeout + 10
        for stream in list(self._streams.values()):
            ready_at = self._ready_at[stream.host]
            if ready_at is None or now - max(stream.progress_at, ready_at) <= limit:
                continue
            log.warning("runner %d gave no result for %.0fs; restarting it", stream.host, limit)
            self._restart(stream.host, f"giving no result for {limit:.0f}s", kind="timeout")

    def close(self) -> None:
        """Close the envs, stop the actors, and shut Ray down if this pool started it."""
        import ray

        if not ray.is_initialized():
            return
        try:
            ray.get([h.close_all.remote() for h in self._hosts], timeout=10)
        except Exception as e:  # closing is best effort: the actors are killed next anyway
            log.info("closing runner envs: %s", e)
        for h in self._hosts:
            ray.kill(h, no_restart=True)
        self._hosts, self._streams, self._queued = [], {}, []
        if self._owns_ray:
            ray.shutdown()

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_pool(maker: EnvMaker, runners: int, *, actors: int = 0, step_timeout: float = 60.0,
              address: str | None = None) -> LocalPool | RayPool:
    """`RayPool` with `runners` slots, or a `LocalPool` for ``runners=0`` (one slot per episode, in the driver)."""
    if runners < 0:
        raise ValueError(f"runners must be >= 0 (0 runs envs in the driver), got {runners}")
    if runners == 0:
        return LocalPool(maker, slots=1 << 30)
    return RayPool(maker, runners, actors=actors, step_timeout=step_timeout, address=address)
