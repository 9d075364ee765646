"""Peak memory and seconds of one training step (pi_old pass + forward/backward), full-logits path vs chunked path.

Each measurement runs in a fresh subprocess (peak RSS = ru_maxrss of that process) under an address-space limit, so
an old-path run that would exhaust the machine fails cleanly and is reported as "over the limit".

Models: random-init 2-layer Qwen3 bodies (hidden 64) with a 49,152 (SmolLM2) and a 151,669 (Qwen) vocabulary, so the
vocabulary is what differs; the answer (loss) part of each sample is a quarter of the context, as in a multi-turn
sample whose prompt and observations do not carry loss. Also: the estimate of `agentrl.training.memory` beside each
measurement.

Second part (``--envs``): `agentrl run --env X --model tiny-qwen3 --steps 1` for every built-in env with its default
settings, peak RSS of the whole run (rollout and training in one process).

    python bench/micro/train_memory.py                 # contexts 1k / 4k / 16k, both vocabularies, both paths
    python bench/micro/train_memory.py --envs          # the built-in envs' default one-step runs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, agentrl_command, load_1m, read_jsonl, write_json  # noqa: E402

STEP = textwrap.dedent("""
    import json, resource, sys, time, torch
    limit = int(float(sys.argv[4]) * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from agentrl.records import Sample
    from agentrl.training.logprobs import full_logprobs, token_logprobs
    from agentrl.training.memory import estimate_train_memory
    from agentrl.training.microbatch import collate
    path, vocab, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(cfg)
    answer = n // 4
    ids = torch.randint(0, vocab, (n,)).tolist()
    mb = collate([Sample(tuple(ids), tuple([0] * (n - answer) + [1] * answer), tuple([0.0] * n), 1.0, 0)], 0)
    fn = token_logprobs if path == "chunked" else full_logprobs
    est = estimate_train_memory(cfg, sum(p.numel() for p in model.parameters()), dtype_bytes=4, tokens=n,
                                gradient_checkpointing=False, engine_copy=False)
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            fn(model, mb, with_entropy=True)          # pi_old pass with entropy
        logp, _ = fn(model, mb)                       # update pass
        logp.sum().backward()
    except (MemoryError, RuntimeError) as e:
        print(json.dumps({"oom": True, "error": str(e)[:120]}))
        sys.exit(0)
    print(json.dumps({"oom": False, "seconds": time.perf_counter() - t0,
                      "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                      "estimate_gb": est.total / 2**30}))
""")


def step_table(contexts: list[int], vocabs: list[int], limit_gb: float, repeats: int) -> list[dict]:
    rows = []
    for vocab in vocabs:
        for n in contexts:
            for path in ("full", "chunked"):
                best = None
                for _ in range(repeats):
                    res = subprocess.run([sys.executable, "-c", STEP, path, str(vocab), str(n), str(limit_gb)],
                                         capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="2"))
                    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
                    if not lines:
                        raise RuntimeError(res.stderr[-2000:])
                    r = json.loads(lines[-1])
                    if r["oom"] or best is None or r["seconds"] < best["seconds"]:
                        best = r
                    if r["oom"]:
                        break
                row = {"vocab": vocab, "tokens": n, "path": path, **best, "load": load_1m()}
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def env_runs(limit_gb: float) -> list[dict]:
    rows = []
    for env in ("math", "alfworld", "webshop", "gui"):
        with tempfile.TemporaryDirectory() as tmp:
            cmd = ["/usr/bin/time", "-v", *agentrl_command("run", "--env", env, "--model", "tiny-qwen3", "--steps", "1",
                                                           "--output", f"{tmp}/run")]
            t0 = time.perf_counter()
            res = subprocess.run(cmd, capture_output=True, text=True)
            peak_kb = next((int(ln.split()[-1]) for ln in res.stderr.splitlines() if "Maximum resident" in ln), 0)
            metrics = Path(tmp, "run", "metrics.jsonl")
            m = read_jsonl(metrics)[-1] if metrics.exists() else {}
            row = {"env": env, "ok": res.returncode == 0, "peak_gb": peak_kb / 2**20,
                   "seconds": time.perf_counter() - t0, "samples": m.get("samples"),
                   "micro_batches": m.get("micro_batches"), "padding_waste": m.get("padding_waste"),
                   "load": load_1m()}
            if res.returncode != 0:
                row["error"] = res.stderr[-600:]
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--vocabs", type=int, nargs="+", default=[49152, 151669])
    ap.add_argument("--limit-gb", type=float, default=16.0, help="address-space limit per measurement")
    ap.add_argument("--repeats", type=int, default=2, help="timings: best of this many")
    ap.add_argument("--envs", action="store_true", help="run the built-in envs' one-step default runs instead")
    args = ap.parse_args()
    if args.envs:
        rows = env_runs(args.limit_gb)
        write_json(RESULTS / "train_memory_envs.json", rows)
        return
    rows = step_table(args.contexts, args.vocabs, args.limit_gb, args.repeats)
    write_json(RESULTS / "train_memory.json", rows)
    header = f"{'vocab':>7} {'tokens':>6} | {'full GB':>8} {'s':>6} | {'chunked GB':>10} {'s':>6} | {'est GB':>6}"
    print(f"\n{header} | ratio s")
    for vocab in args.vocabs:
        for n in args.contexts:
            full = next(r for r in rows if r["vocab"] == vocab and r["tokens"] == n and r["path"] == "full")
            new = next(r for r in rows if r["vocab"] == vocab and r["tokens"] == n and r["path"] == "chunked")
            f_gb = "over" if full["oom"] else f"{full['peak_gb']:.2f}"
            f_s = "-" if full["oom"] else f"{full['seconds']:.2f}"
            ratio = "-" if full["oom"] or new["oom"] else f"{new['seconds'] / full['seconds']:.2f}"
            print(f"{vocab:>7} {n:>6} | {f_gb:>8} {f_s:>6} | {new.get('peak_gb', 0):>10.2f} "
                  f"{new.get('seconds', 0):>6.2f} | {new.get('estimate_gb', 0):>6.2f} | {ratio}")


if __name__ == "__main__":
    main()
