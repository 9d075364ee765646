"""The headline command near the engine's bound (issue 39, item 5): vLLM CPU settings, measured as a user types them.

Each variant runs ``agentrl run --env webshop --runners 32 --steps 1 --output RUN`` in its own process (the command
as typed, plus the variant's flags and environment variables), interleaved A B C A B C ... over `--repeats` rounds
so that a change in the machine's load hits every variant alike. Read back from each run's metrics.jsonl, plan.json,
config.yaml and trajectories.jsonl:

* ``wall_s``: process start to exit (imports, Ray, the model, the engine's start, the step, the checkpoint);
  ``step_seconds`` and ``rollout_seconds`` (metrics.jsonl, `agentrl.recipes.train.step_metrics`);
* ``tokens_per_s``: generated tokens / rollout seconds (`agentrl.rollout.loop.RolloutStats.metrics`);
  ``engine_busy_frac``: the step's share spent in the engine's ``poll``; ``engine_tok_per_s``: generated tokens /
  those engine seconds (the engine's own rate; it pays for prefills too, so it is a floor of its decode rate);
* ``prefix_cache_hit_rate`` and ``prefilled_tokens`` (prompt tokens the engine computed: prompt - cached);
* ``mean_requests_in_engine``: the summed per-turn request seconds / rollout seconds (Little's law: the mean batch
  the engine decoded, of the 32 episodes in flight); ``mean_decode_context``: the mean context of the generated
  tokens (what each decode step reads from the KV cache per request);
* ``mismatch_kl_k3``: the sampler-trainer mismatch (a KV cache in FP8 changes the sampler);
* the load average before and after (the machine may be shared).

Two derived figures per run:

* ``block_size_what_if``: the prompt tokens the engine would prefill at each KV block size, replaying the run's own
  requests (turn by turn, episodes in file order) against an unbounded prefix cache that, as vLLM's does, caches the
  whole blocks of every computed token (prompt + reply but its last token) and hits whole blocks only, always
  computing a prompt's last token. ``replay_check`` sets the replay at the block size the run used beside the count
  the engine measured: the replay has no eviction and no same-step misses, so it may read a little low.
* ``decode_bound``: with the triad bandwidth of docs/results/limits.json (`bench/micro/limits.py`, run it first), the
  decode tokens/s the memory allows at the run's mean batch B and context C: B x bandwidth / (weight bytes + B x C x
  KV bytes per token), the weights at the engine's dtype, the KV at the engine's dtype or 1 byte in FP8; beside it
  ``engine_tok_per_s / bound``.

Variants (`--variants`; the default is the first four, which the research in the bench's report recommends first):

    baseline   today's defaults
    block32    --engine.vllm.block-size 32: prefix hits land every 32 tokens instead of 128
    compiled   --engine.vllm.no-enforce-eager: vLLM's compiled CPU path (Dynamo + Inductor)
    fp8kv      --engine.vllm.kv-cache-dtype fp8_e4m3: half the KV bytes per decode step
    ...        block64, omp1, passive, jemalloc, actors1, tokens8k (see VARIANTS); `--custom NAME='FLAGS ENV=V'`
               adds a combination, e.g. --custom "b32c=--engine.vllm.block-size 32 --engine.vllm.no-enforce-eager"

Results: docs/results/engine_tuning.json (rewritten after every run, so an interrupted bench keeps what it measured).
Checkpoints are deleted after each run is read (1.6 GB each for SmolLM2-135M with its AdamW state) unless
`--keep-checkpoints`.

    python bench/micro/engine_tuning.py [--variants baseline block32 compiled fp8kv] [--repeats 2]
    python bench/micro/engine_tuning.py --smoke --out /tmp/engine_tuning.json   # tiny model, HF engine, math: < 1 min
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import (  # noqa: E402
    RESULTS,
    ROOT,
    agentrl_command,
    command_line,
    load_1m,
    read_jsonl,
    repo_relative,
    write_json,
)

HEADLINE = ("run", "--env", "webshop", "--runners", "32", "--steps", "1")
"""The headline command as typed (after ``agentrl``); each run adds ``--output RUN --overwrite`` and its flags."""
SMOKE = ("run", "--env", "math", "--model", "tiny-qwen3", "--engine", "hf", "--steps", "1",
         "--scheduler.prompts-per-step", "2", "--scheduler.group-size", "2", "--sampling.max-new-tokens", "8")
"""`--smoke`: the same pipeline on a tiny model, the HF engine and the in-process math env (seconds)."""

BLOCK_SIZES = (16, 32, 64, 128, 256)
"""Block sizes of the prefill replay (``block_size_what_if``)."""
CPU_DEFAULT_BLOCK = 128
"""vLLM's KV block size on its CPU build when ``engine.vllm.block_size`` is 0 (`vllm.platforms.cpu`)."""
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
SPEED_ENV = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "LD_PRELOAD", "MALLOC_ARENA_MAX", "VLLM_CPU_KVCACHE_SPACE",
             "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU")
"""Variables that change the runs' speed: those the bench inherits are recorded (every variant gets them)."""


@dataclass(frozen=True)
class Variant:
    """One arm of the bench: config flags added to the command, environment variables set for its process.

    Attributes:
        name: the arm's name in the results.
        flags: extra ``agentrl run`` arguments.
        env: environment variables for the run's process (and, through it, Ray's and vLLM's).
        why: what the arm tests (one line, copied into the results).
    """

    name: str
    flags: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    why: str = ""


def _jemalloc() -> str:
    """Ray's bundled jemalloc (vLLM's CPU guide preloads tcmalloc, which this machine lacks); empty if absent."""
    import importlib.util

    spec = importlib.util.find_spec("ray")  # finds the package without importing it
    path = Path(spec.origin).parent / "core" / "libjemalloc.so" if spec and spec.origin else None
    return str(path) if path is not None and path.exists() else ""


VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("baseline", why="today's defaults"),
    Variant("block32", ("--engine.vllm.block-size", "32"),
            why="prefix hits land every 32 tokens (vLLM CPU default 128): fewer tokens re-prefilled per turn"),
    Variant("compiled", ("--engine.vllm.no-enforce-eager",),
            why="vLLM's compiled CPU path (Dynamo trace once + Inductor) instead of eager: fewer per-op overheads "
                "per step, a compile at start (in wall_s)"),
    Variant("fp8kv", ("--engine.vllm.kv-cache-dtype", "fp8_e4m3"),
            why="KV cache in FP8: half the bytes each decode step reads per request (changes the sampler: "
                "see mismatch_kl_k3)"),
    Variant("block64", ("--engine.vllm.block-size", "64"), why="prefix hits every 64 tokens"),
    Variant("omp1", env={"OMP_NUM_THREADS": "1"},
            why="one OpenMP thread in the driver (engine and trainer): a core left to the env runners and Ray; "
                "compare rollout_seconds (the trainer is slower too)"),
    Variant("passive", env={"OMP_WAIT_POLICY": "PASSIVE"},
            why="idle OpenMP threads sleep instead of spinning, leaving the core to the env runners"),
    Variant("jemalloc", env={"LD_PRELOAD": _jemalloc()} if _jemalloc() else {},
            why="jemalloc preloaded (vLLM's CPU guide preloads a fast allocator; the in-process engine gets none)"
                + ("" if _jemalloc() else "; not found here: the same as baseline")),
    Variant("actors1", ("--runners.actors", "1"), why="the 32 envs in one runner process instead of one per core"),
    Variant("tokens8k", ("--engine.vllm.max-num-batched-tokens", "8192"),
            why="twice the tokens per engine step (bigger prefill batches, fewer steps)"),
)}
DEFAULT_VARIANTS = ("baseline", "block32", "compiled", "fp8kv")
SMOKE_VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("baseline", why="the smoke command as it is"),
    Variant("smoke_alt", ("--engine.batch-size", "2"), {"OMP_NUM_THREADS": "1"},
            why="a flag and an environment variable, to exercise both paths"),
)}


def parse_custom(text: str) -> Variant:
    """A ``NAME=ARGS`` variant: ARGS are shell words, ``UPPER_CASE=value`` words environment variables, the rest flags.

    Raises:
        ValueError: no name, or no flag and no variable.
    """
    name, sep, rest = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"--custom wants NAME='FLAGS ENV=VALUE', got {text!r}")
    flags, env = [], {}
    for word in shlex.split(rest):
        key, eq, value = word.partition("=")
        if eq and key.isupper() and not key.startswith("-"):
            env[key] = value
        else:
            flags.append(word)
    if not flags and not env:
        raise ValueError(f"--custom {name}: no flags and no environment variables")
    return Variant(name.strip(), tuple(flags), env, why="custom: " + rest.strip())


def schedule(names: Sequence[str], repeats: int) -> list[tuple[int, str]]:
    """(round, variant) in run order: every variant once per round, rounds one after the other (A B A B)."""
    return [(r, name) for r in range(repeats) for name in names]


# -- what a run left behind ------------------------------------------------------------------------------------------


def read_trajectories(path: Path) -> list[dict]:
    """The run's trajectories as plain dicts (turns with prompt_ids, generated_ids, generate_seconds)."""
    return read_jsonl(path) if path.exists() else []


def _requests(trajectories: list[dict]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, generated ids) of every engine request, turn by turn, episodes in file order within a turn."""
    order = []
    for e, traj in enumerate(trajectories):
        for t, turn in enumerate(traj["turns"]):
            order.append((t, e, turn["prompt_ids"], turn["generated_ids"]))
    order.sort(key=lambda x: (x[0], x[1]))
    return [(p, g) for _, _, p, g in order]


def _block_keys(tokens: Sequence[int], block: int) -> list[int]:
    """Chained keys of the whole blocks of `tokens` (a block's key names its content and everything before it)."""
    keys, key = [], 0
    for i in range(len(tokens) // block):
        key = hash((key, tuple(tokens[i * block:(i + 1) * block])))
        keys.append(key)
    return keys


def prefill_what_if(trajectories: list[dict], block_sizes: Iterable[int] = BLOCK_SIZES) -> dict[int, dict]:
    """Prompt tokens prefilled at each block size, replaying the run's requests against an unbounded prefix cache.

    vLLM's prefix cache (V1) keeps the whole blocks of every computed token, prompt and reply alike (the reply's last
    token is sampled, never computed), hits whole blocks only, and always computes a prompt's last token.

    Returns:
        block size -> ``{"prompt_tokens", "prefilled_tokens", "hit_rate"}``.
    """
    requests = _requests(trajectories)
    out = {}
    for block in block_sizes:
        cached: set[int] = set()
        prompt_total = prefilled = 0
        for prompt, generated in requests:
            keys = _block_keys(prompt, block)[:(len(prompt) - 1) // block]  # the last prompt token is always computed
            hit = 0
            while hit < len(keys) and keys[hit] in cached:
                hit += 1
            prompt_total += len(prompt)
            prefilled += len(prompt) - hit * block
            cached.update(_block_keys(list(prompt) + list(generated[:-1]), block))
        out[block] = {"prompt_tokens": prompt_total, "prefilled_tokens": prefilled,
                      "hit_rate": round(1 - prefilled / prompt_total, 4) if prompt_total else None}
    return out


def rollout_shape(trajectories: list[dict], rollout_seconds: float) -> dict:
    """Episodes, turns, generated tokens, mean requests in the engine (Little's law) and mean decode context."""
    turns = [turn for traj in trajectories for turn in traj["turns"]]
    generated = sum(len(t["generated_ids"]) for t in turns)
    # The contexts a reply's tokens are decoded at: p, p + 1, ..., p + g - 1 for a prompt of p and g new tokens.
    context_sum = sum(len(t["generated_ids"]) * len(t["prompt_ids"])
                      + len(t["generated_ids"]) * (len(t["generated_ids"]) - 1) / 2 for t in turns)
    in_engine = sum(t.get("generate_seconds") or 0.0 for t in turns)
    return {"episodes": len(trajectories), "turns": len(turns), "generated_tokens": generated,
            "prompt_tokens": sum(len(t["prompt_ids"]) for t in turns),
            "mean_requests_in_engine": round(in_engine / rollout_seconds, 2) if rollout_seconds > 0 else None,
            "mean_decode_context": round(context_sum / generated, 1) if generated else None}


def safetensors_params(path: Path) -> int:
    """Parameters stored in a safetensors file, read from its header alone."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")


def model_geometry(run: Path, engine_dtype: str, kv_cache_dtype: str) -> dict | None:
    """Weight bytes at the engine's dtype and KV bytes per token, from the run's checkpoint; None without one."""
    folder = run / "checkpoint"
    config_path, weights = folder / "config.json", sorted(folder.glob("*.safetensors"))
    if not config_path.exists() or not weights:
        return None
    config = json.loads(config_path.read_text())
    config = config.get("text_config", config)
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    weight_bytes = DTYPE_BYTES.get(engine_dtype, 4)
    kv_bytes = 1 if kv_cache_dtype.startswith("fp8") else weight_bytes
    params = sum(safetensors_params(p) for p in weights)
    return {"params": params, "weight_bytes": params * weight_bytes,
            "kv_bytes_per_token": 2 * config["num_hidden_layers"] * kv_heads * head_dim * kv_bytes}


def decode_bound(geometry: dict | None, batch: float | None, context: float | None, triad_gbs: float | None,
                 achieved: float | None) -> dict | None:
    """Decode tokens/s the memory bandwidth allows at batch `batch` and context `context`, and `achieved` against it.

    Each decode step reads every weight once and each request's KV cache: B x bandwidth / (W + B x C x kv).
    """
    if not (geometry and batch and context and triad_gbs):
        return None
    step_bytes = geometry["weight_bytes"] + batch * context * geometry["kv_bytes_per_token"]
    bound = batch * triad_gbs * 1e9 / step_bytes
    return {"triad_gbs": triad_gbs, "batch": batch, "context": context, "step_bytes": round(step_bytes),
            "kv_share_of_step_bytes": round(1 - geometry["weight_bytes"] / step_bytes, 3),
            "bound_tok_per_s": round(bound, 1),
            "of_bound": round(achieved / bound, 3) if achieved else None}


def triad_bandwidth(path: Path) -> float | None:
    """The triad GB/s bench/micro/limits.py measured on this machine, or None when it has not been run."""
    if not path.exists():
        return None
    return (json.loads(path.read_text()).get("bandwidth") or {}).get("triad_gbs")


def read_run(run: Path, wall_s: float, triad_gbs: float | None) -> dict:
    """The numbers of one finished run (see the module docstring)."""
    rows = read_jsonl(run / "metrics.jsonl")
    m = next(r for r in reversed(rows) if "step_seconds" in r)
    plan = json.loads((run / "plan.json").read_text())
    engine_cfg = (yaml.safe_load((run / "config.yaml").read_text()) or {}).get("engine", {})
    trajectories = read_trajectories(run / "trajectories.jsonl")
    shape = rollout_shape(trajectories, m["rollout_seconds"])
    engine_seconds = m.get("engine_busy_frac", 0.0) * m["step_seconds"]
    engine_rate = shape["generated_tokens"] / engine_seconds if engine_seconds > 0 else None
    prompt, cached = m.get("prefix_prompt_tokens"), m.get("prefix_cached_tokens")
    vllm_cfg = engine_cfg.get("vllm") or {}
    used_block = vllm_cfg.get("block_size") or CPU_DEFAULT_BLOCK
    what_if = prefill_what_if(trajectories, sorted({*BLOCK_SIZES, used_block}))
    measured_prefill = prompt - cached if prompt is not None and cached is not None else None
    engine_plan = plan.get("engine", {})
    geometry = model_geometry(run, engine_plan.get("dtype", "float32"), vllm_cfg.get("kv_cache_dtype", "auto"))
    return {
        "wall_s": round(wall_s, 1),
        **{k: m.get(k) for k in ("step_seconds", "rollout_seconds", "tokens_per_s", "engine_busy_frac",
                                 "prefix_cache_hit_rate", "env_steps_per_s", "mismatch_kl_k3", "weight_sync_seconds",
                                 "success_rate")},
        "engine_tok_per_s": round(engine_rate, 1) if engine_rate else None,
        "prefix_prompt_tokens": prompt, "prefilled_tokens": measured_prefill,
        **shape,
        "plan": {"engine": engine_plan.get("kind"), "engine_dtype": engine_plan.get("dtype"),
                 "kv_cache_gib": engine_plan.get("kv_cache_gib"), "kv_note": engine_plan.get("kv_note")},
        "engine_config": engine_cfg,
        "block_size_what_if": {str(b): v for b, v in what_if.items()},
        "replay_check": {"block_size": used_block, "measured_prefilled": measured_prefill,
                         "replayed_prefilled": what_if[used_block]["prefilled_tokens"]},
        "geometry": geometry,
        "decode_bound": decode_bound(geometry, shape["mean_requests_in_engine"], shape["mean_decode_context"],
                                     triad_gbs, engine_rate),
    }


# -- running ---------------------------------------------------------------------------------------------------------


def agentrl_argv() -> list[str]:
    """The ``agentrl`` console script of this interpreter's environment (as a user types it), else ``-m``."""
    script = Path(sys.executable).parent / "agentrl"
    return [str(script)] if script.exists() else agentrl_command()


def one_run(variant: Variant, command: Sequence[str], run: Path, timeout: float, triad_gbs: float | None,
            keep_checkpoint: bool) -> dict:
    """Run `command` with `variant` into `run`; its numbers, or its exit status and the end of its output."""
    argv = [*agentrl_argv(), *command, "--output", str(run), "--overwrite", *variant.flags]
    env = os.environ | variant.env
    before, t0 = load_1m(), time.perf_counter()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
        code, tail = proc.returncode, (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired as e:
        code, tail = 124, f"timed out after {timeout:.0f} s: {(e.stderr or b'')[-2000:]!r}"
    wall = time.perf_counter() - t0
    shown = [a.replace(f"{ROOT}/", "") for a in argv]  # no machine paths in git
    row: dict[str, Any] = {"variant": variant.name, "argv": shown, "env": variant.env, "returncode": code,
                           "load_before": round(before, 2), "load_after": round(load_1m(), 2)}
    if code == 0:
        try:
            row |= read_run(run, wall, triad_gbs)
        except (OSError, KeyError, StopIteration, ValueError) as e:  # a run that ended without its files
            row |= {"returncode": -1, "error": f"could not read {run}: {type(e).__name__}: {e}"}
    else:
        row |= {"wall_s": round(wall, 1), "error": tail}
    if not keep_checkpoint:
        shutil.rmtree(run / "checkpoint", ignore_errors=True)
    row["run"] = repo_relative(run)  # no machine paths in git
    return row


SUMMARY_KEYS = ("wall_s", "step_seconds", "rollout_seconds", "tokens_per_s", "engine_tok_per_s", "engine_busy_frac",
                "prefix_cache_hit_rate", "prefilled_tokens", "mean_requests_in_engine", "mean_decode_context",
                "mismatch_kl_k3")


def summarize(runs: list[dict], names: Sequence[str]) -> dict:
    """Per variant: the median of each number over its successful runs, and the ratios against the first variant."""
    out: dict[str, dict] = {}
    for name in names:
        ok = [r for r in runs if r["variant"] == name and r["returncode"] == 0]
        row: dict[str, Any] = {"runs": len(ok), "failed": sum(r["variant"] == name for r in runs) - len(ok)}
        for key in SUMMARY_KEYS:
            values = [r[key] for r in ok if isinstance(r.get(key), (int, float))]
            row[key] = round(statistics.median(values), 4) if values else None
        bounds = [r["decode_bound"]["of_bound"] for r in ok if r.get("decode_bound") and r["decode_bound"]["of_bound"]]
        row["of_bound"] = round(statistics.median(bounds), 3) if bounds else None
        out[name] = row
    base = out.get(names[0]) if names else None
    for name, row in out.items():
        if base is None or name == names[0]:
            continue
        # Seconds: baseline / variant (> 1 is faster); rates: variant / baseline (> 1 is faster).
        row["speedup_vs_" + names[0]] = {
            **{k: _ratio(base[k], row[k]) for k in ("wall_s", "step_seconds", "rollout_seconds")},
            **{k: _ratio(row[k], base[k]) for k in ("tokens_per_s", "engine_tok_per_s")},
        }
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The bench's arguments (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", nargs="+", default=None, help=f"of {', '.join(VARIANTS)} and --custom names")
    ap.add_argument("--custom", action="append", default=[], metavar="NAME=ARGS",
                    help="a variant of your own: NAME='--flag value ENV_VAR=value ...' (repeatable)")
    ap.add_argument("--repeats", type=int, default=1, help="rounds; variants interleave A B A B")
    ap.add_argument("--work", default=str(ROOT / "runs" / "engine_tuning"), help="where the runs are written")
    ap.add_argument("--out", default=str(RESULTS / "engine_tuning.json"))
    ap.add_argument("--limits", default=str(RESULTS / "limits.json"), help="limits.py's results (bandwidth)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one run may take")
    ap.add_argument("--keep-checkpoints", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="tiny model, HF engine, math: checks the bench in seconds")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    """Run every variant `--repeats` times, interleaved; write the results after each run."""
    args = parse_args(argv)
    catalogue = dict(SMOKE_VARIANTS if args.smoke else VARIANTS)
    for text in args.custom:
        v = parse_custom(text)
        catalogue[v.name] = v
    names = args.variants or ([*SMOKE_VARIANTS] if args.smoke else
                              [*DEFAULT_VARIANTS, *(parse_custom(t).name for t in args.custom)])
    unknown = [n for n in names if n not in catalogue]
    if unknown:
        raise SystemExit(f"unknown variant {unknown[0]!r}: known are {', '.join(catalogue)}")
    command = SMOKE if args.smoke else HEADLINE
    triad = triad_bandwidth(Path(args.limits))
    if triad is None:
        print(f"no bandwidth in {args.limits}: decode_bound left out (run bench/micro/limits.py first)", flush=True)
    inherited = {k: os.environ[k] for k in SPEED_ENV if k in os.environ}
    if inherited and not args.smoke:
        print(f"note: every run inherits {inherited} (unset them to measure the defaults)", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "command": command_line(__file__, argv or sys.argv[1:], quote=True),
        "headline": "agentrl " + " ".join(command),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(), "triad_gbs": triad,
        "inherited_env": inherited,
        "variants": {n: {"flags": list(catalogue[n].flags), "env": catalogue[n].env, "why": catalogue[n].why}
                     for n in names},
        "runs": [],
    }
    for r, name in schedule(names, args.repeats):
        run = Path(args.work) / f"{name}_{r}"
        row = one_run(catalogue[name], command, run, args.timeout, triad, args.keep_checkpoints) | {"round": r}
        result["runs"].append(row)
        shown = {k: row.get(k) for k in ("variant", "round", "returncode", "wall_s", "step_seconds",
                                         "rollout_seconds", "tokens_per_s", "engine_busy_frac",
                                         "prefix_cache_hit_rate", "load_before")}
        print(json.dumps(shown), flush=True)
        if row["returncode"] != 0:
            print(row.get("error", "")[-1500:], flush=True)
        result["summary"] = summarize(result["runs"], names)
        write_json(out, result)
    for name, row in result["summary"].items():
        print(name, json.dumps(row), flush=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
