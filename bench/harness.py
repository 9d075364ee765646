"""What the bench scripts share: where the repository and its results are, the command line a result records, the
machine's load, per-call timings, `agentrl` run in a subprocess, RSS sums, and reading and writing JSON.

Every script under ``bench/micro/`` and ``bench/studies/`` runs as ``python bench/<kind>/<script>.py`` from the
repository root, so Python puts only the script's own folder on ``sys.path`` (which is how a study imports a sibling
study: ``from learn_multiturn import ...``). To reach this module a script appends the repository root, after its other
imports::

    sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
    from bench.harness import RESULTS, ROOT  # noqa: E402

Appended, not inserted: an ``agentrl`` installed or put first on ``PYTHONPATH`` (to measure another checkout, as
``bench/micro/math_grader_agreement.py`` allows) still wins over this checkout's. The two scripts that want this
checkout's ``agentrl`` whatever is installed (``micro/allocator.py``, ``micro/openai_proxy.py``) insert the root
first instead; ``micro/gpu_smoke.py`` does not use the harness at all (the GPU image copies that file alone).
``bench`` has no ``__init__.py``: it is a namespace package, and only this module is meant to be imported from it.

What is deliberately not here: argument parsing (each script's flags, defaults and help are its own, and ``--out``
/ ``--results`` / ``--repeats`` mean different things from one script to the next), best-of-N timing (no two scripts
take a best the same way: `bench/micro/limits.py` calibrates inner loops, `micro/train_memory.py` keeps the fastest
subprocess's whole record, `micro/trainer_step_passes.py` drops a warm-up first, `micro/eval_penalties.py` needs the
last call's output), and the machine description (each result names its fields in its own way: ``cpus``, ``cores``,
``cpu_count``; renaming them would change the layout of the JSON already in docs/results/).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
"""The repository root (the folder holding ``bench/``, ``configs/`` and ``docs/``)."""

RESULTS = ROOT / "docs" / "results"
"""Where results cited in docs/results.md live."""


def script_path(script: str | Path) -> str:
    """`script` (a ``__file__``) as a path from the repository root, e.g. ``bench/micro/limits.py``; as given when
    it lies outside the repository."""
    path = Path(script).resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(script)


def command_line(script: str | Path, argv: Sequence[str] | None = None, *, quote: bool = False) -> str:
    """The command that ran `script`, as typed from the repository root: ``python bench/micro/x.py ARGS``.

    Results record it so that a JSON file in docs/results/ says how to reproduce it. `argv` defaults to this
    process's arguments (``sys.argv[1:]``); `quote` shell-quotes each one (arguments holding spaces, such as a
    custom variant's flags).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join(["python", script_path(script), *([shlex.quote(a) for a in args] if quote else args)])


def repo_relative(path: Path) -> str:
    """`path` relative to the repository when it lies inside it, else as given: results in git must not name this
    machine's folders."""
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


def load_1m() -> float:
    """The 1-minute load average (`os.getloadavg`: the kernel's value, unrounded). The machine may be shared: timings
    are recorded next to it."""
    return os.getloadavg()[0]


def time_calls(fn: Callable[..., object], calls: Iterable[Sequence[Any]]) -> list[float]:
    """Wall seconds of ``fn(*args)`` for each `args` of `calls`, one `time.perf_counter` reading on each side."""
    out = []
    for args in calls:
        t0 = time.perf_counter()
        fn(*args)
        out.append(time.perf_counter() - t0)
    return out


def time_repeats(fn: Callable[[], object], repeats: int) -> list[float]:
    """Wall seconds of each of `repeats` calls of ``fn()``."""
    return time_calls(fn, [()] * repeats)


def agentrl_command(*args: str) -> list[str]:
    """``python -m agentrl.cli ARGS`` with this interpreter: the CLI as a user types it, in this environment."""
    return [sys.executable, "-m", "agentrl.cli", *args]


def run_logged(cmd: Sequence[str], log: Path, env: dict[str, str] | None = None) -> tuple[int, float]:
    """Run `cmd` from the repository root with its output appended to `log` (after a ``$ cmd`` line); its exit code
    and wall seconds. `env` defaults to a copy of this process's environment."""
    t0 = time.perf_counter()
    with log.open("a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT,
                            env=os.environ.copy() if env is None else env).returncode
    return rc, time.perf_counter() - t0


def rss_mib(processes: Iterable[psutil.Process]) -> float:
    """Summed resident memory of `processes`, in MiB; one that exits before it is read counts 0."""
    total = 0
    for p in processes:
        try:
            total += p.memory_info().rss
        except psutil.Error:  # exited between the listing and the read
            pass
    return total / 2**20


def run_phase(name: str, args: list[str], limit_s: float, log: Path) -> dict:
    """Run `agentrl <args>` with a wall-clock limit: SIGINT at the limit (the CLI saves what it has), kill 5 min later.

    Output goes to `log` (overwritten). Peak memory is the largest resident size of the phase's process tree (Ray
    actors included), sampled every half second. Returns ``rc``, ``seconds``, ``limited``, ``peak_rss_mb`` and
    ``log`` (relative to the repository when inside it, else the file's name).
    """
    t0 = time.perf_counter()
    peak = 0.0
    limited = False
    with open(log, "w") as f:
        proc = subprocess.Popen(agentrl_command(*args), stdout=f, stderr=subprocess.STDOUT,
                                cwd=ROOT, env=os.environ | {"TOKENIZERS_PARALLELISM": "false"},
                                # A shell that starts this script in the background ignores SIGINT, the child
                                # inherits that, and Python then installs no Ctrl-C handler: the limit's SIGINT
                                # would be lost (it was, in issue 32's amendment 10).
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        watched = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                children = watched.children(recursive=True)
            except psutil.Error:  # it exited since poll()
                children = []
            peak = max(peak, rss_mib([watched, *children]))
            if not limited and time.perf_counter() - t0 > limit_s:
                proc.send_signal(signal.SIGINT)
                limited = True
            if limited and time.perf_counter() - t0 > limit_s + 300:  # a step in flight finishes its C++ ops first
                proc.kill()
            time.sleep(0.5)
        rc = proc.returncode
    seconds = time.perf_counter() - t0
    print(f"  {name}: rc {rc}, {seconds:.0f} s, peak {peak:.0f} MiB"
          f"{' (stopped at the wall-clock limit)' if limited else ''}", flush=True)
    return {"rc": rc, "seconds": seconds, "limited": limited, "peak_rss_mb": peak,
            "log": str(log.relative_to(ROOT)) if log.is_relative_to(ROOT) else log.name}


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSON-lines file (a run's ``metrics.jsonl``, ``trajectories.jsonl``); blank lines skipped."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_json(path: Path, data: Any, *, indent: int = 1, end: str = "", **dumps: Any) -> Path:
    """Write `data` as JSON to `path` (its folder made if missing) and return `path`.

    `indent`, `end` (``"\\n"`` for a final newline) and `dumps` (``default=str``, ``ensure_ascii=False``) are each
    script's own: a rerun rewrites its file in docs/results/ byte for byte in the same layout.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent, **dumps) + end)
    return path


def held_out_by_run(runs: Path, records: Iterable[dict], value: str = "success") -> dict[str, dict[int, dict]]:
    """Per arm and run seed, each held-out task's mean `value` (``success`` or ``reward``) from the run's eval folder.

    `records` are a study's run records (``arm`` and ``seed`` keys), each evaluated into ``runs/seed<S>/<arm>/eval``
    by ``agentrl eval``; a run not evaluated yet is left out. Tasks are keyed by their env seed, so runs evaluated on
    different tasks never pair by position. What the run-level bootstrap
    (`agentrl.passk.run_level_bootstrap_difference`) compares: ``{arm: {run seed: {task seed: mean}}}``.
    """
    from agentrl.recipes.evaluate import load_results

    by_arm: dict[str, dict[int, dict]] = {}
    for r in records:
        folder = runs / f"seed{r['seed']}" / r["arm"] / "eval"
        if not (folder / "results.json").exists():
            continue
        per_task: dict[int, list[float]] = {}
        for row in load_results(folder)["episodes"]:
            per_task.setdefault(row["seed"], []).append(float(row[value]))
        by_arm.setdefault(r["arm"], {})[r["seed"]] = {t: statistics.fmean(v) for t, v in sorted(per_task.items())}
    return by_arm


def compare_runs(by_arm: dict[str, dict[int, dict]], arm: str, base: str, seeds: Sequence[int]) -> dict | None:
    """`arm` against `base` across the run seeds both have evaluated (`held_out_by_run`'s layout), or None if none.

    The run-level bootstrap (`agentrl.passk.run_level_bootstrap_difference`) paired by seed (the primary) and
    unpaired, with each seed's own difference beside them.

    Raises:
        SystemExit: the runs were not evaluated on the same held-out tasks.
    """
    from agentrl.passk import run_level_bootstrap_difference

    both = [s for s in seeds if s in by_arm.get(arm, {}) and s in by_arm.get(base, {})]
    if not both:
        return None
    tasks = sorted(by_arm[arm][both[0]])
    if any(sorted(by_arm[a][s]) != tasks for a in (arm, base) for s in both):
        raise SystemExit(f"{arm} and {base}: the runs were not evaluated on the same held-out tasks")
    a = [[by_arm[arm][s][t] for t in tasks] for s in both]
    b = [[by_arm[base][s][t] for t in tasks] for s in both]
    paired = run_level_bootstrap_difference(a, b, paired_runs=True)
    unpaired = run_level_bootstrap_difference(a, b, paired_runs=False, seed=1)
    return {"seeds": both, "tasks": len(tasks),
            "per_seed_difference": {s: statistics.fmean(x) - statistics.fmean(y) for s, x, y in zip(both, a, b)},
            "paired_by_seed": paired.to_dict() | {"significant": paired.excludes_zero},
            "unpaired": unpaired.to_dict() | {"significant": unpaired.excludes_zero}}


def plot_seed_curves(axes, records: Iterable[dict], curves: Sequence[tuple[str, str]], colors: dict[str, str]) -> None:
    """One panel per (metric key, title) in `curves`: every run's per-step curve, colour by arm, line style by seed.

    `records` are a study's run records (``arm``, ``seed``, ``per_step`` {key: [value or None per step]}); a None
    value is a gap. KL panels get a symlog axis (k3 is >= 0 but may print as a tiny negative float).
    """
    records = list(records)
    for ax, (key, title) in zip(axes, curves):
        for r in records:
            ys = [float("nan") if v is None else v for v in r["per_step"].get(key, [])]
            ax.plot(range(len(ys)), ys, color=colors.get(r["arm"], "k"), lw=0.9, alpha=0.8, marker="o", ms=2,
                    ls=("-", "--", ":", "-.")[r["seed"] % 4], label=f"{r['arm']} seed {r['seed']}")
        ax.set(title=title, xlabel="step")
        if key in ("kl_k3", "mismatch_kl_k3"):
            ax.set_yscale("symlog", linthresh=1e-6)


def plot_heldout_per_run(ax, records: Iterable[dict], colors: dict[str, str], episodes: int) -> None:
    """One panel: every compared run's held-out success as a dot per arm (seeds side by side), each arm's mean a line.

    `records` are a study's run records (``arm``, ``seed``, ``compared``, ``heldout`` {``estimate``}); arms in the
    order of `colors`.
    """
    records = list(records)
    for i, arm in enumerate(colors):
        done = [r for r in records if r["arm"] == arm and r["compared"]]
        for r in done:
            ax.scatter([i + 0.08 * (r["seed"] % 5 - 2)], [r["heldout"]["estimate"]], color=colors[arm])
        if done:
            ax.hlines(statistics.fmean(r["heldout"]["estimate"] for r in done), i - 0.25, i + 0.25, color=colors[arm])
    ax.set_xticks(range(len(colors)), list(colors))
    ax.set(title=f"held-out success per run ({episodes} tasks)", ylim=(0, 1))


def train_then_evaluate(run: Path, log: Path, train: Sequence[str], evaluate: Sequence[str], per_step: Sequence[str],
                        steps: int) -> tuple[dict, dict | None]:
    """One run of a seeded study, resumable: train into `run` (unless it wrote its exit code), then evaluate its
    checkpoint into ``run/eval`` (unless that holds results); the run's record and the eval's results.json (or None).

    `train` is the ``agentrl run`` command (its ``--output`` is `run`); `evaluate` the ``agentrl eval`` command
    without ``--model`` and ``--output``, which are added. Exit codes, wall seconds and the load around the training
    go to ``run/walls.json``, so a second call rebuilds the record without running anything; a run the study was
    stopped in the middle of (a folder without them) is deleted and run again. The record: ``steps_done`` (distinct
    steps in metrics.jsonl, trainer-restart events left out), ``per_step`` {key: values} for `per_step`,
    ``checkpoint_step``, ``heldout`` (success estimate and Wilson bounds), the walls, and ``compared``: evaluated at
    the last of `steps` (the collapse guard may keep an earlier checkpoint of a run that ended unhealthy).
    """
    walls_file = run / "walls.json"
    walls = json.loads(walls_file.read_text()) if walls_file.exists() else {}
    env = os.environ | {"TOKENIZERS_PARALLELISM": "false"}
    if "train_rc" not in walls:
        if run.exists():
            print(f"{run}: the study was stopped during this run; run again from the start", flush=True)
            shutil.rmtree(run)
            walls = {}
        walls["load_1m_before"] = load_1m()
        walls["train_rc"], walls["train_s"] = run_logged(train, log, env=env)
        walls["load_1m_after"] = load_1m()
        run.mkdir(parents=True, exist_ok=True)  # a run that failed before its first line has no folder
        walls_file.write_text(json.dumps(walls))
    metrics = run / "metrics.jsonl"
    rows = [r for r in read_jsonl(metrics) if "event" not in r] if metrics.exists() else []
    record: dict = {"steps_done": len({r["step"] for r in rows}),
                    "per_step": {k: [r.get(k) for r in rows] for k in per_step}}
    results = None
    state = run / "checkpoint" / "trainer_state.json"
    if walls["train_rc"] == 0 and state.exists():
        record["checkpoint_step"] = json.loads(state.read_text())["step"]
        if not (run / "eval" / "results.json").exists():
            walls["eval_rc"], walls["eval_s"] = run_logged(
                [*evaluate, "--model", str(run / "checkpoint"), "--output", str(run / "eval")], log, env=env)
            walls_file.write_text(json.dumps(walls))
        if (run / "eval" / "results.json").exists():
            results = json.loads((run / "eval" / "results.json").read_text())
            record["heldout"] = {k: results["overall"]["success_rate"][k] for k in ("estimate", "low", "high")}
    record |= walls
    record["compared"] = "heldout" in record and record.get("checkpoint_step") == steps - 1
    return record, results
