"""The config's walk through the code: which modules a command's config (or one of its sections) is handed to.

Not a speed benchmark: a measure of how the code reads (issue 40). A *stay* is a run of consecutive calls, in one
module, of functions that receive a config object (an instance of a class named ``*Config`` defined in agentrl; the
envs' own configs left out) as an argument; a *room* is a module; a *return* is a stay in a module already left
before. Recording starts at the first call into the start module (the recipe). It traces calls, so it counts where
the config goes when the command runs, not the definitions a reader follows.

Usage (runs the command in-process; the JSON goes to stderr, after the command's own output):

    python bench/micro/config_walk.py agentrl/recipes/train.py -- run --env math --model tiny-qwen3 --steps 1 \
        --group-size 2 --prompts-per-step 1 --max-new-tokens 8 --output runs/walk --overwrite
"""
import json
import os
import sys
import threading
from collections import Counter
from pathlib import Path

import agentrl

ROOT = Path(agentrl.__file__).resolve().parent.parent
PKG_DIRS = [str(ROOT / d) + os.sep for d in ("agentrl", "envs", "templates")]
seq: list[str] = []
state = {"on": False}
START = sys.argv[1]


def is_config(value) -> bool:
    t = type(value)
    return (t.__name__.endswith("Config") and t.__module__.startswith("agentrl")
            and not t.__module__.startswith("agentrl.envs"))


def prof(frame, event, arg):
    if event != "call":
        return
    fn = frame.f_code.co_filename
    if not any(fn.startswith(d) for d in PKG_DIRS) or os.sep + "envs" + os.sep in fn:
        return
    mod = os.path.relpath(fn, ROOT)
    if not state["on"]:
        if mod != START:
            return
        state["on"] = True
    code = frame.f_code
    n = code.co_argcount + code.co_kwonlyargcount
    loc = frame.f_locals
    for name in code.co_varnames[:n]:
        if name != "self" and is_config(loc.get(name)):
            if not seq or seq[-1] != mod:
                seq.append(mod)
            return


def report():
    seen, returns, entries = set(), 0, Counter()
    for mod in seq:
        entries[mod] += 1
        returns += mod in seen
        seen.add(mod)
    json.dump({"start": START, "stays": len(seq), "rooms": len(seen), "returns": returns,
               "returns_outside_start": sum(1 for i, m in enumerate(seq) if m in seq[:i] and m != START),
               "entered": entries.most_common(), "sequence": seq}, sys.stderr, indent=1)


if __name__ == "__main__":
    args = sys.argv[sys.argv.index("--") + 1:]
    try:
        from agentrl.cli.main import main
    except ImportError:
        from agentrl.cli import main
    sys.argv = ["agentrl", *args]
    sys.setprofile(prof)
    threading.setprofile(prof)
    try:
        main()
    except SystemExit:
        pass
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
        report()
