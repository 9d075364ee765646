"""Run a pure function under a hard time budget that GIL-holding work cannot defeat: `run_with_budget`.

    from agentrl.budget import BudgetExceeded, run_with_budget

    try:
        reward = run_with_budget(my_reward, reply, gold, budget_s=2.0)   # my_reward: a module-level function
    except BudgetExceeded:
        reward = 0.0                                                      # counted as wrong

Why a process: a reward that a client's text can make slow (a big-integer power, a factorial, a regex that
backtracks) usually spends its time inside one C call that holds the GIL. A thread timeout never fires then, and
every other thread of the process (an env server's ``/health``, the other sessions, a runner's rollout loop) waits
as long. Here the call runs in a worker process; the caller waits on a pipe with ``select`` (the GIL released), and
when the budget runs out it kills the worker with SIGKILL and raises `BudgetExceeded`. The next call gets a fresh
worker. As a second fence each worker sets ``RLIMIT_CPU`` (the budget, rounded up, plus a second, before every
call) and ``RLIMIT_AS`` on itself, so a worker whose parent died mid-call cannot spin on.

Workers are fresh interpreters started lazily (``python -c ...`` with two pipes), never forks: callers have threads
(env servers) or are Ray actors, and forking those is unsafe. Nor multiprocessing's ``spawn`` / ``forkserver``:
both re-run the caller's ``__main__`` script in every worker, which breaks any script without an
``if __name__ == "__main__":`` guard. A worker imports the `preload` modules once when it starts (~0.2 s, plus
the modules), so a call costs about a pipe round trip (~0.05 ms measured for a small call). The budget counts from
the moment the worker has unpickled the call, so importing `fn`'s module on a first call does not count. After a
kill the replacement starts at once on a background thread. A pool is thread-safe: concurrent callers each get
their own worker, up to ``max_workers``; further callers wait (the GIL released) for a free one.

What can run: `fn` and its arguments are pickled, so `fn` must be a module-level function (or a builtin) and must
not rely on state of the calling process; what it returns or raises comes back pickled. A call that leaves threads
running in the worker (a thread-bounded check it abandoned) gets its worker replaced afterwards, so abandoned work
never piles up.

A user's env puts its reward under the budget with one line in ``step`` (``my_reward`` module-level)::

    reward = run_with_budget(my_reward, action, self.gold, budget_s=2.0)   # raises BudgetExceeded past 2 s

and counts an overrun as a wrong answer (``except BudgetExceeded: reward = 0.0``), flagging it in ``info``.

Processes: `shutdown` (run at interpreter exit, and safe to call any time) kills the default pool's workers; a
`BudgetPool` used as a context manager does the same for its own. A parent killed outright leaves no workers
behind either: a worker reads end-of-file on its pipe and exits, or its CPU limit ends it.
"""

from __future__ import annotations

import atexit
import importlib
import math
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection
from typing import Any, TypeVar

__all__ = ["BudgetExceeded", "BudgetPool", "default_pool", "preload", "run_with_budget", "shutdown"]

T = TypeVar("T")

DEFAULT_MAX_WORKERS = max(2, min(4, os.cpu_count() or 2))
"""Workers of the default pool: enough that one call being killed never blocks the others."""
DEFAULT_MEMORY_LIMIT_MB = 2048
"""Address space a worker may add on top of what it had when it started (``RLIMIT_AS``)."""
_STARTUP_TIMEOUT_S = 120.0  # a first start imports the preloaded modules; a busy machine can take a while
_REASONS = ("wall", "cpu", "died")


class BudgetExceeded(RuntimeError):
    """A call ran past its budget (or its worker died) and was stopped; its worker was killed and replaced.

    Attributes:
        fn: the name of the function that was called.
        budget_s: the budget it had, in seconds.
        reason: ``"wall"`` (the wall-clock budget ran out), ``"cpu"`` (the worker's CPU limit ended it) or
            ``"died"`` (the worker exited otherwise mid-call, e.g. a crash or an out-of-memory kill).
        elapsed_s: seconds from sending the call to giving up on it.
    """

    def __init__(self, fn: str, budget_s: float, reason: str, elapsed_s: float):
        self.fn, self.budget_s, self.reason, self.elapsed_s = fn, budget_s, reason, elapsed_s
        what = {"wall": "ran past", "cpu": "used more CPU time than", "died": "lost its worker within"}[reason]
        super().__init__(f"{fn} {what} its budget of {budget_s:g} s (after {elapsed_s:.2f} s); its worker was killed")

    def __reduce__(self):  # so it survives pickling (a Ray actor's error path pickles exceptions)
        return (BudgetExceeded, (self.fn, self.budget_s, self.reason, self.elapsed_s))


# --------------------------------------------------------------------------------------------------- the worker
def _set_limit(kind: int, soft: int) -> None:
    import resource

    _, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(kind, (soft, hard))


def _address_space_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _worker_main(conn: Connection, modules: tuple[str, ...], memory_limit_mb: int | None) -> None:
    """A worker's loop: receive ``(fn, args, kwargs, budget_s)``, reply ``(ok, value, recycle)``; exit on EOF."""
    import resource

    # The parent handles Ctrl-C; a worker killed by it mid-call would only turn into a confusing "died".
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _set_limit(resource.RLIMIT_CORE, 0)  # SIGXCPU would otherwise dump a core file per overrun
    for name in modules:
        importlib.import_module(name)  # a no-op when the fork server preloaded it
    if memory_limit_mb is not None:
        used = _address_space_bytes()
        if used is not None:
            _set_limit(resource.RLIMIT_AS, used + memory_limit_mb * 2**20)
    conn.send(("ready", os.getpid()))
    threads = threading.active_count()
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the parent closed the pipe or died: nobody waits for us
            return
        except Exception as e:  # the call could not be unpickled here (e.g. its module does not import)
            conn.send((False, RuntimeError(f"the call could not be unpickled in the worker: {type(e).__name__}: {e}"),
                       False))
            continue
        fn, args, kwargs, budget_s = message
        conn.send(("started",))  # the budget runs from here: a first call's imports (unpickling) do not count
        cpu = resource.getrusage(resource.RUSAGE_SELF)
        _set_limit(resource.RLIMIT_CPU, math.ceil(cpu.ru_utime + cpu.ru_stime + budget_s) + 1)
        try:
            reply: tuple[bool, Any] = (True, fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - the caller gets it back, whatever it is
            reply = (False, e)
        recycle = threading.active_count() > threads
        try:
            conn.send((*reply, recycle))
        except Exception as e:  # the value or exception does not pickle
            conn.send((False, RuntimeError(f"{_name(fn)} returned or raised something that does not pickle: {e!r}"),
                       recycle))


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _subprocess_main() -> None:
    """Entry point of a worker process: ``python -c 'from agentrl.budget import _subprocess_main; ...' R W``."""
    read_fd, write_fd = int(sys.argv[1]), int(sys.argv[2])
    conn = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    try:
        modules, memory_limit_mb = conn[0].recv()
        _worker_main(_Duplex(*conn), tuple(modules), memory_limit_mb)
    except (EOFError, OSError):  # the parent went away (closed the pool, exited): nothing to report to anyone
        pass


class _Duplex:
    """Two one-way pipe ends as one connection (what `_worker_main` and the parent talk through)."""

    def __init__(self, reader: Connection, writer: Connection):
        self.reader, self.writer = reader, writer

    def send(self, obj: Any) -> None:
        self.writer.send(obj)

    def send_bytes(self, data: bytes) -> None:
        self.writer.send_bytes(data)

    def recv(self) -> Any:
        return self.reader.recv()

    def poll(self, timeout: float) -> bool:
        return self.reader.poll(timeout)

    def close(self) -> None:
        self.reader.close()
        self.writer.close()


class _Worker:
    """One worker process and the parent's ends of its two pipes."""

    def __init__(self, modules: tuple[str, ...], memory_limit_mb: int | None):
        # A fresh interpreter (not multiprocessing's spawn or forkserver): those re-run the caller's __main__ script
        # in every worker, which breaks any script without an ``if __name__ == "__main__"`` guard.
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        command = "from agentrl.budget import _subprocess_main; _subprocess_main()"
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", command, str(to_child_r), str(from_child_w)],
                pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL, env=env, close_fds=True,
            )
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self.conn = _Duplex(Connection(from_child_r, writable=False), Connection(to_child_w, readable=False))
        self.conn.send((list(modules), memory_limit_mb))
        if not self.conn.poll(_STARTUP_TIMEOUT_S):
            self.kill()
            raise RuntimeError(f"a budget worker did not start within {_STARTUP_TIMEOUT_S:g} s")
        try:
            self.conn.recv()  # ("ready", pid)
        except EOFError:
            code = self.process.wait()
            self.conn.close()
            raise RuntimeError(
                f"a budget worker exited while starting (exit code {code}); check that the modules {list(modules)} "
                "import in a fresh process"
            ) from None

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self.process.pid

    def exit_code(self, wait_s: float) -> int | None:
        """The worker's exit code (negative: killed by that signal), waiting up to `wait_s`; None while it runs."""
        try:
            return self.process.wait(wait_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL the worker, reap it and close the pipes."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.conn.close()


# ----------------------------------------------------------------------------------------------------- the pool
class BudgetPool:
    """Worker processes that run pure functions under a hard budget; thread-safe, started lazily.

    Args:
        max_workers: the most calls running at once; further callers wait for a free worker.
        preload: modules every worker imports when it starts (the reward's own module, sympy, ...), so that a
            call costs a pipe round trip, not an import.
        memory_limit_mb: address space a worker may add to its size at start (``RLIMIT_AS``); None: no limit.
    """

    def __init__(
        self,
        max_workers: int = DEFAULT_MAX_WORKERS,
        preload: Iterable[str] = (),
        memory_limit_mb: int | None = DEFAULT_MEMORY_LIMIT_MB,
    ):
        if not isinstance(max_workers, int) or isinstance(max_workers, bool) or max_workers < 1:
            raise ValueError(f"budget: max_workers must be a positive integer, got {max_workers!r}")
        if memory_limit_mb is not None and (not isinstance(memory_limit_mb, int) or memory_limit_mb < 1):
            raise ValueError(f"budget: memory_limit_mb must be a positive integer or None, got {memory_limit_mb!r}")
        self.max_workers = max_workers
        self.memory_limit_mb = memory_limit_mb
        self._modules: list[str] = list(dict.fromkeys(preload))
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._all: set[_Worker] = set()
        self._starting = 0
        self._closed = False

    def preload(self, *modules: str) -> None:
        """Import `modules` in workers started from now on."""
        with self._cond:
            self._modules.extend(m for m in modules if m not in self._modules)

    @property
    def pids(self) -> list[int]:
        """Process ids of the live workers (busy or idle)."""
        with self._cond:
            return [w.pid for w in self._all]

    def run(self, fn: Callable[..., T], /, *args: Any, budget_s: float, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in a worker; its value, or its exception re-raised here.

        Raises:
            BudgetExceeded: the call ran past `budget_s` seconds of wall time (or its worker's CPU limit, or the
                worker died); the worker was killed and a fresh one is being started.
            TypeError: `fn` or an argument cannot be pickled (a lambda, a local function, an open file).
        """
        if isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or not 0 < budget_s < math.inf:
            raise ValueError(f"budget: budget_s must be a positive number of seconds, got {budget_s!r}")
        try:
            payload = pickle.dumps((fn, args, kwargs, float(budget_s)), protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            raise TypeError(f"budget: cannot send {_name(fn)} to a worker process ({e}); pass a module-level function "
                            "and picklable arguments") from None
        worker = self._acquire()
        healthy = False
        started = time.monotonic()
        try:
            worker.conn.send_bytes(payload)
            try:
                # The worker acknowledges once it has unpickled the call (importing fn's module the first time).
                if not worker.conn.poll(_STARTUP_TIMEOUT_S):
                    raise BudgetExceeded(_name(fn), _STARTUP_TIMEOUT_S, "wall", time.monotonic() - started)
                reply = worker.conn.recv()
                if reply == ("started",):
                    started = time.monotonic()
                    # poll() waits in select(): the GIL is free for the caller's other threads meanwhile.
                    if not worker.conn.poll(budget_s):
                        raise BudgetExceeded(_name(fn), budget_s, "wall", time.monotonic() - started)
                    reply = worker.conn.recv()
                ok, value, recycle = reply
            except EOFError:
                if self._closed:
                    raise RuntimeError("budget: the pool was closed during the call") from None
                reason = "cpu" if worker.exit_code(1.0) == -signal.SIGXCPU else "died"
                raise BudgetExceeded(_name(fn), budget_s, reason, time.monotonic() - started) from None
            healthy = not recycle
        finally:
            self._release(worker, healthy)
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """Kill every worker (busy ones too); the pool refuses calls afterwards."""
        with self._cond:
            self._closed = True
            idle, busy = self._idle, [w for w in self._all if w not in self._idle]
            self._idle = []
            self._all.clear()
            self._cond.notify_all()
        for worker in idle:
            worker.kill()
        for worker in busy:  # its caller sees the pipe close and reaps it (closing the pipe under it would race)
            if worker.process.poll() is None:
                worker.process.kill()

    def __enter__(self) -> BudgetPool:
        """The pool itself."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the pool."""
        self.close()

    def _acquire(self) -> _Worker:
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("budget: the pool is closed")
                if self._idle:
                    return self._idle.pop()
                if len(self._all) + self._starting < self.max_workers:
                    self._starting += 1
                    break
                self._cond.wait()
        return self._start(idle=False)

    def _start(self, idle: bool) -> _Worker:
        """Start a worker (the caller counted it in `_starting`); hand it to the caller or park it idle."""
        try:
            worker = _Worker(tuple(self._modules), self.memory_limit_mb)
        except BaseException:
            with self._cond:
                self._starting -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._starting -= 1
            if self._closed:
                worker.kill()
                raise RuntimeError("budget: the pool is closed")
            self._all.add(worker)
            if idle:
                self._idle.append(worker)
                self._cond.notify()
        return worker

    def _release(self, worker: _Worker, healthy: bool) -> None:
        with self._cond:
            if healthy and not self._closed:
                self._idle.append(worker)
                self._cond.notify()
                return
            self._all.discard(worker)
            replace = not self._closed and not self._idle and not self._starting
            if replace:
                self._starting += 1
            self._cond.notify()
        worker.kill()  # SIGKILL: a GIL-holding C call ignores anything gentler
        if replace:
            # Start the replacement now, off the caller's thread, so the next call does not wait for an interpreter.
            threading.Thread(target=self._start_quietly, name="agentrl-budget-start", daemon=True).start()

    def _start_quietly(self) -> None:
        try:
            self._start(idle=True)
        except Exception:  # the next call starts one itself and reports the error there
            pass


# ---------------------------------------------------------------------------------------- the default pool
_default: BudgetPool | None = None
_default_lock = threading.Lock()
_default_preload: list[str] = []


def default_pool() -> BudgetPool:
    """The process-wide pool `run_with_budget` uses (created on first use, closed at exit)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = BudgetPool(preload=_default_preload)
        return _default


def preload(*modules: str) -> None:
    """Have the default pool's workers start with `modules` imported (call at import time of the reward's module)."""
    with _default_lock:
        _default_preload.extend(m for m in modules if m not in _default_preload)
        pool = _default
    if pool is not None:
        pool.preload(*modules)


def run_with_budget(fn: Callable[..., T], /, *args: Any, budget_s: float, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a worker process of the default pool, stopped after `budget_s` seconds.

    Args:
        fn: a module-level function (or builtin); it and its arguments are pickled.
        *args: its positional arguments.
        budget_s: the most wall-clock seconds the call may take.
        **kwargs: its keyword arguments.

    Returns:
        What `fn` returned. An exception `fn` raised is raised here.

    Raises:
        BudgetExceeded: the call ran past its budget; its worker was killed and is replaced on the next call.
        TypeError: `fn` or an argument cannot be pickled.
    """
    return default_pool().run(fn, *args, budget_s=budget_s, **kwargs)


def shutdown() -> None:
    """Kill the default pool's workers (run at interpreter exit); a later `run_with_budget` starts a new pool."""
    global _default
    with _default_lock:
        pool, _default = _default, None
    if pool is not None:
        pool.close()


atexit.register(shutdown)
