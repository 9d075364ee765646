"""GUI env benchmark: steps/s per runner for each renderer, and memory for many runners in one process.

Baseline (measured in the same run): the fast renderer without screenshots, i.e. the state machine and text
observation alone. Every other row is reported as a ratio against it.

    python bench/micro/gui_throughput.py                 # full run (about a minute and a half on 2 cores)
    python bench/micro/gui_throughput.py --quick         # fewer steps

Results go to docs/results/gui_throughput.json.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

import psutil
from tqdm import tqdm

from agentrl.envs.gui import GuiEnv
from agentrl.envs.gui.render_browser import CHROMIUM, BrowserHost

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, write_json  # noqa: E402


def _pss(process: psutil.Process) -> int:
    # PSS splits shared pages between the processes that map them: summing Chromium's processes' RSS would count
    # its shared libraries once per process.
    info = process.memory_full_info()
    return getattr(info, "pss", info.rss)


def rss_mb() -> float:
    """Proportional memory (PSS) of this process and its children (Chromium's processes), in MiB."""
    me = psutil.Process()
    total = _pss(me)
    for child in me.children(recursive=True):
        try:
            total += _pss(child)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total / 2**20


def play(env: GuiEnv, steps: int, desc: str) -> float:
    """Run the expert for `steps` steps (resetting as episodes end); return steps per second."""
    seed = 0
    env.reset(seed=seed)
    start = time.perf_counter()
    for _ in tqdm(range(steps), desc=desc, leave=False):
        *_, terminated, truncated, _ = env.step(env.expert_action())
        if terminated or truncated:
            seed += 1
            env.reset(seed=seed)
    return steps / (time.perf_counter() - start)


def memory(n: int, make, desc: str) -> dict[str, float]:
    """Memory growth for `n` live runners, each reset and stepped a few times."""
    gc.collect()
    before = rss_mb()
    envs = [make() for _ in range(n)]
    for i, env in enumerate(tqdm(envs, desc=desc, leave=False)):
        env.reset(seed=i)
        for _ in range(3):
            env.step(env.expert_action())
    after = rss_mb()
    for env in envs:
        env.close()
    return {"runners": n, "pss_before_mib": round(before, 1), "pss_after_mib": round(after, 1),
            "per_runner_mib": round((after - before) / n, 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps, for a smoke run")
    args = parser.parse_args()
    fast_steps, browser_steps = (300, 40) if args.quick else (3000, 300)

    rows: dict[str, dict[str, float]] = {}
    base = play(GuiEnv(screenshots=False), fast_steps, "fast, no image")
    rows["fast_no_image"] = {"steps_per_s": base}
    rows["fast"] = {"steps_per_s": play(GuiEnv(), fast_steps, "fast")}
    mem = {"fast_32": memory(32, lambda: GuiEnv(), "32 fast runners")}

    has_browser = os.access(CHROMIUM, os.X_OK)
    if has_browser:
        host = BrowserHost()
        rows["browser_no_image"] = {
            "steps_per_s": play(GuiEnv(renderer="browser", shared=host, screenshots=False), browser_steps, "browser")
        }
        rows["browser"] = {"steps_per_s": play(GuiEnv(renderer="browser", shared=host), browser_steps, "browser+img")}
        host.close()
        host = BrowserHost()
        mem["browser_8"] = memory(8, lambda: GuiEnv(renderer="browser", shared=host), "8 browser runners")
        host.close()

    for row in rows.values():
        row["steps_per_s"] = round(row["steps_per_s"], 1)
        row["ratio_vs_baseline"] = round(row["steps_per_s"] / base, 4)
    print(f"{'renderer':<18}{'steps/s':>10}{'x baseline':>12}")
    for name, row in rows.items():
        print(f"{name:<18}{row['steps_per_s']:>10}{row['ratio_vs_baseline']:>12}")
    for name, m in mem.items():
        growth = f"{m['pss_before_mib']} -> {m['pss_after_mib']} MiB"
        print(f"memory {name}: {growth} ({m['per_runner_mib']} MiB per runner, PSS)")
    if not has_browser:
        print(f"browser rows skipped: no Chromium at {CHROMIUM}")

    out = write_json(RESULTS / "gui_throughput.json", {"throughput": rows, "memory": mem, "cpu_count": os.cpu_count()},
                     indent=2)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
