"""SFT warm starts of the multi-turn recipes: training time by trainer precision and packing (issue 39's SFT goal).

Runs ``agentrl sft --config configs/<recipe>-sft.yaml`` for one epoch (no evaluation, no validation) in three trainer
variants, interleaved round by round so that a change in the machine's load hits every variant alike:

* ``float32, padded``: ``--compute-dtype float32 --trainer.no-packing`` (the trainer before issue 39 without the
  recipes' bfloat16 setting);
* ``bfloat16 masters, padded``: ``--trainer.no-packing`` (the recipes set bfloat16 compute; since issue 39 it is
  float32 master weights with one bfloat16 copy per step, which the trainer bench measured at autocast's speed:
  1.83x against autocast's 1.8x; autocast itself, the recipes' setting before issue 39, is gone);
* ``bfloat16 masters, packed``: the recipe as shipped (the default since issue 39).

The time is the training loop's (``train_seconds`` in the run's summary.json: optimizer steps only; the expert
demonstrations are generated before it and are the same in every variant), and the training tokens per second
from its metrics.jsonl. Writes ``docs/results/sft_speed.json`` (or ``--out``).

    python bench/micro/sft_speed.py --recipes gui alfworld --repeats 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, ROOT, agentrl_command, command_line, load_1m, read_jsonl, run_logged, write_json  # noqa: E402

VARIANTS: dict[str, list[str]] = {
    "float32, padded": ["--compute-dtype", "float32", "--trainer.no-packing"],
    "bfloat16 masters, padded": ["--trainer.no-packing"],
    "bfloat16 masters, packed (default)": [],
}


def run_variant(recipe: str, flags: list[str], folder: Path) -> dict:
    """One SFT run of `recipe` with `flags`; its training seconds, steps and tokens."""
    out = folder / "run"
    cmd = agentrl_command("sft", "--config", str(ROOT / "configs" / f"{recipe}-sft.yaml"), "--epochs", "1",
                          "--eval-episodes", "0", "--val-demos", "0", "--output", str(out), "--overwrite", *flags)
    code, wall = run_logged(cmd, folder / "log.txt")
    if code != 0:  # the log's folder is temporary: its tail goes into the message
        tail = (folder / "log.txt").read_text(errors="replace")[-3000:]
        raise SystemExit(f"{' '.join(cmd)} failed ({code}); the end of its log:\n{tail}")
    summary = json.loads((out / "summary.json").read_text())
    rows = read_jsonl(out / "metrics.jsonl")
    tokens = sum(r["tokens"] for r in rows)
    return {"train_seconds": summary["train_seconds"], "steps": summary["steps"], "tokens": tokens,
            "loss_tokens": sum(r["loss_tokens"] for r in rows), "tokens_per_s": tokens / summary["train_seconds"],
            "final_loss": rows[-1]["loss"], "wall_seconds": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", nargs="+", default=["gui", "alfworld"], help="configs/<recipe>-sft.yaml")
    parser.add_argument("--repeats", type=int, default=2, help="rounds; each runs every variant once")
    parser.add_argument("--out", type=Path, default=RESULTS / "sft_speed.json")
    args = parser.parse_args()
    results: dict = {"command": command_line(__file__), "created": time.strftime("%Y-%m-%d %H:%M:%S"),
                     "load_1m_at_start": load_1m(), "recipes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in args.recipes:
            rounds: dict[str, list[dict]] = {name: [] for name in VARIANTS}
            for r in range(args.repeats):
                for v, (name, flags) in enumerate(VARIANTS.items()):
                    folder = Path(tmp) / recipe / f"round{r}-variant{v}"
                    folder.mkdir(parents=True)
                    got = run_variant(recipe, flags, folder)
                    rounds[name].append(got)
                    print(f"{recipe} round {r} {name}: {got['train_seconds']:.1f} s, {got['tokens_per_s']:.0f} "
                          f"tokens/s, loss {got['final_loss']:.4f}", flush=True)
            base = statistics.median(x["train_seconds"] for x in rounds["float32, padded"])
            results["recipes"][recipe] = {
                name: {"median_train_seconds": statistics.median(x["train_seconds"] for x in runs),
                       "speedup_vs_float32_padded": base / statistics.median(x["train_seconds"] for x in runs),
                       "rounds": runs}
                for name, runs in rounds.items()}
            write_json(args.out, results)
    results["load_1m_at_end"] = load_1m()
    write_json(args.out, results)
    for recipe, by in results["recipes"].items():
        for name, got in by.items():
            print(f"{recipe:9s} {name:36s} {got['median_train_seconds']:7.1f} s  "
                  f"{got['speedup_vs_float32_padded']:.2f}x")


if __name__ == "__main__":
    main()
