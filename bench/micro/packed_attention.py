"""Packed attention on a CPU: SDPA's flash kernel against explicit matmuls for batched short segments (issue 39's
"next lever": `agentrl.training.packing.MATMUL_ATTENTION_MAX_LEN`).

A packed micro-batch whose samples have similar lengths attends as one right-padded batch `[n, heads, Tmax, d]`
(`agentrl.training.packing`); there it runs either transformers' SDPA function (``sdpa``: torch's CPU flash kernel,
causal) or `_matmul_attention` (``matmul``: scores, causal mask, float32 softmax, weighted sum, as explicit matmuls),
chosen by ``MATMUL_ATTENTION_MAX_LEN`` (0: off, the default). This script switches that constant and measures, in one
process at `--threads` torch threads (default: the machine's cores):

* ``layer``: the packed attention function itself (`_packed_sdpa`, the gather into the padded batch and the unpadding
  included), forward + backward (`torch.autograd.grad` of a fixed output gradient), for one attention layer shaped
  like SmolLM2-135M's (9 query heads on 3 kv heads, head size 64), per dtype of `--dtypes` and per ``n x T`` of
  `--grid` (n segments of T tokens each). The two paths alternate (sdpa, matmul, sdpa, ...) for `--repeats` rounds
  after one warm-up call each; the best round of each is kept. Beside the milliseconds: ``speedup`` (sdpa / matmul)
  and ``scores_mib`` (the float32 probabilities the matmul path keeps for the backward, n x heads x T^2 x 4 bytes, one
  layer; the flash kernel keeps n x heads x T log-sum-exps).
* ``model``: one packed micro-batch's forward + backward of the policy loss through the trainer's own
  `SingleProcessBackend.accumulate` (per dtype: float32, or bfloat16 compute on float32 master weights as
  ``trainer.compute_dtype`` sets it), `--model` (SmolLM2-135M-Instruct) on `--samples` random-token samples of
  lengths drawn uniformly in `--lengths` (the main job: 32 samples of ~120 tokens, 40% of them in the loss), with
  the threshold off and at `--max-len`, alternating, best of `--model-repeats` after a warm-up each.
  ``logp_max_abs_diff``: how far the two paths' log-probs of the same batch lie apart (forward only).

The load average is recorded at the start and the end (read the numbers as ratios on a shared machine). Results:
docs/results/packed_attention.json (`--out`); ``--smoke`` runs tiny sizes on tiny-qwen3 in seconds and writes
nothing unless `--out` is given.

    python bench/micro/packed_attention.py [--dtypes bfloat16 float32] [--grid 32x64 32x128 16x256 8x512]
    python bench/micro/packed_attention.py --smoke --threads 1
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from limits import cpu_info  # noqa: E402  (a sibling script, not a package)

from bench.harness import RESULTS, command_line, load_1m, time_repeats, write_json  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64
"""SmolLM2-135M's attention: 9 query heads sharing 3 kv heads, head size 64."""

ON = 10**9
"""The threshold that sends every batched segment to the matmul path, whatever its length (the ``layer`` part)."""


def say(text: str) -> None:
    """A progress line (stdout, flushed)."""
    print(f"[packed_attention {time.strftime('%H:%M:%S')}] {text}", flush=True)


@functools.cache
def packing():
    """`agentrl.training.packing`, imported once (its threshold is what the variants switch)."""
    import agentrl.training.packing as module

    return module


@contextmanager
def threshold(bound: int) -> Iterator[None]:
    """`MATMUL_ATTENTION_MAX_LEN` set to `bound` inside, restored after."""
    mod = packing()
    before = mod.MATMUL_ATTENTION_MAX_LEN
    mod.MATMUL_ATTENTION_MAX_LEN = bound
    try:
        yield
    finally:
        mod.MATMUL_ATTENTION_MAX_LEN = before


def best_alternating(variants: dict[str, tuple[int, Callable[[], object]]], repeats: int) -> dict[str, float]:
    """Best seconds of each variant's call, the variants alternating round by round after one warm-up call each.

    `variants` maps a name to (the threshold it runs at, the call).
    """
    times: dict[str, list[float]] = {name: [] for name in variants}
    for rounds in (None, *range(repeats)):  # None: the warm-up, not timed
        for name, (bound, fn) in variants.items():
            with threshold(bound):
                seconds = time_repeats(fn, 1)
            if rounds is not None:
                times[name] += seconds
    return {name: min(t) for name, t in times.items()}


class Layer(torch.nn.Module):
    """What transformers' SDPA function reads of an attention layer: its kv grouping and causality."""

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def layer_row(n: int, T: int, dtype: torch.dtype, repeats: int) -> dict:
    """Forward + backward of one packed attention layer over n segments of T tokens, sdpa against matmul."""
    L = n * T
    g = torch.Generator().manual_seed(0)
    # As a decoder layer hands them over: projections [1, L, heads x d] viewed as [1, heads, L, d] (not contiguous).
    q_lin, k_lin, v_lin = (torch.randn(1, L, h * HEAD_DIM, generator=g).to(dtype).requires_grad_()
                           for h in (HEADS, KV_HEADS, KV_HEADS))
    grad = torch.randn(1, L, HEADS, HEAD_DIM, generator=g).to(dtype)
    bounds = torch.arange(0, L + 1, T)
    layer = Layer(HEADS // KV_HEADS)

    def step():
        q, k, v = (x.view(1, L, -1, HEAD_DIM).transpose(1, 2) for x in (q_lin, k_lin, v_lin))
        out, _ = packing()._packed_sdpa(layer, q, k, v, None, scaling=HEAD_DIM**-0.5, cu_seq_lens_q=bounds)
        return torch.autograd.grad(out, (q_lin, k_lin, v_lin), grad)

    best = best_alternating({"sdpa": (0, step), "matmul": (ON, step)}, repeats)
    row = {"n": n, "T": T, "sdpa_ms": round(1e3 * best["sdpa"], 2), "matmul_ms": round(1e3 * best["matmul"], 2),
           "speedup": round(best["sdpa"] / best["matmul"], 2), "scores_mib": round(n * HEADS * T * T * 4 / 2**20, 1)}
    say(f"layer {str(dtype).removeprefix('torch.')} {n}x{T}: sdpa {row['sdpa_ms']} ms, matmul {row['matmul_ms']} ms "
        f"({row['speedup']}x), scores {row['scores_mib']} MiB")
    return row


def model_part(args: argparse.Namespace, dtype: torch.dtype) -> dict:
    """One packed micro-batch's forward + backward through the trainer's backend, threshold off and on."""
    from agentrl.models import load_model
    from agentrl.objective import policy_loss
    from agentrl.records import Sample
    from agentrl.training.backend import PolicyObjective, ScoreRequest, UpdateRequest
    from agentrl.training.microbatch import collate
    from agentrl.training.single import SingleProcessBackend

    policy = load_model(args.model)
    # As `trainer.compute_dtype` runs it: bfloat16 compute weights over float32 masters (float32: the model as is).
    backend = SingleProcessBackend(policy, lr=1e-5, betas=(0.9, 0.999), weight_decay=0.0,
                                   compute_dtype=None if dtype == torch.float32 else dtype)
    g = torch.Generator().manual_seed(0)
    low, high = args.lengths
    samples = []
    for i in range(args.samples):
        n = int(torch.randint(low, high + 1, (1,), generator=g))
        ids = torch.randint(0, policy.model.config.vocab_size, (n,), generator=g).tolist()
        agent = max(1, round(0.4 * n))  # the main job: ~64 generated tokens of ~150
        samples.append(Sample(tuple(ids), (0,) * (n - agent) + (1,) * agent,
                              (0.0,) * (n - agent) + tuple((-torch.rand(agent, generator=g) * 3).tolist()),
                              1.0 if i % 2 == 0 else -1.0, i // 2))
    mb = collate(samples, 0, packed=True)
    objective = PolicyObjective(functools.partial(policy_loss, "minirl"), len(samples),
                                sum(s.num_loss_tokens for s in samples), with_entropy=True, entropy_grad=False)
    old = mb.rollout_logp + 0.05 * mb.loss_mask  # pi_old != mu, so the ratios are not all 1

    def update():
        backend.model.zero_grad(set_to_none=True)
        backend.accumulate([UpdateRequest(mb, old)], objective)

    logp = {}
    for bound in (0, args.max_len):  # forward only, before any update: both paths score the same weights
        with threshold(bound):
            logp[bound] = backend.score([ScoreRequest(mb)])[0].logp
    best = best_alternating({"off": (0, update), "on": (args.max_len, update)}, args.model_repeats)
    tokens = int(mb.attention_mask.sum())
    lengths = [len(s.input_ids) for s in samples]
    mod = packing()
    # Whether the row takes the batched branch at all, and the matmul path when on (else "on" times SDPA again).
    batched = len(lengths) * max(lengths) ** 2 <= mod.BATCH_SEGMENTS_WASTE * sum(t * t for t in lengths)
    row = {"model": args.model, "samples": len(samples), "tokens": tokens, "longest": max(lengths),
           "batched": batched, "on_takes_matmul": batched and max(lengths) <= args.max_len,
           "max_len_on": args.max_len, "off_s": round(best["off"], 3), "on_s": round(best["on"], 3),
           "off_tok_per_s": round(tokens / best["off"], 1), "on_tok_per_s": round(tokens / best["on"], 1),
           "speedup": round(best["off"] / best["on"], 3),
           "logp_max_abs_diff": float((logp[0] - logp[args.max_len]).abs().max())}
    say(f"model {str(dtype).removeprefix('torch.')}: {tokens} tokens, off {row['off_s']} s, on {row['on_s']} s "
        f"({row['speedup']}x), log-probs apart by {row['logp_max_abs_diff']:.2e}")
    if not row["on_takes_matmul"]:
        say("warning: this batch never reaches the matmul path ('on' timed SDPA again): see batched / --max-len")
    return row


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    ap.add_argument("--grid", nargs="+", default=["32x64", "32x128", "16x256", "8x512"],
                    help="segments x tokens of the layer part")
    ap.add_argument("--repeats", type=int, default=5, help="alternating rounds of the layer part (after a warm-up)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--samples", type=int, default=32, help="samples in the model part's packed micro-batch")
    ap.add_argument("--lengths", type=int, nargs=2, default=[90, 160], metavar=("MIN", "MAX"),
                    help="the model part's sample lengths, uniform in [MIN, MAX]")
    ap.add_argument("--max-len", type=int, default=256, help="MATMUL_ATTENTION_MAX_LEN of the model part's 'on'")
    ap.add_argument("--model-repeats", type=int, default=3, help="alternating rounds of the model part")
    ap.add_argument("--skip-model", action="store_true")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: the cores)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes on tiny-qwen3: checks the script in seconds, measures nothing, writes nothing "
                         "unless --out is given")
    ap.add_argument("--out", default=None, help="the result file (default: docs/results/packed_attention.json, "
                                                "none in --smoke)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.grid, args.repeats = ["2x16", "2x32"], 2
        args.model, args.samples, args.lengths, args.model_repeats = "tiny-qwen3", 4, [10, 30], 2
    if args.out is None and not args.smoke:
        args.out = str(RESULTS / "packed_attention.json")
    return args


def main(argv: list[str] | None = None) -> None:
    """Run both parts and write the JSON (see the module docstring)."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    result: dict = {"command": command_line(__file__, argv), "smoke": args.smoke, "cpu": cpu_info(),
                    "date": time.strftime("%Y-%m-%d %H:%M:%S"), "load_1m_start": round(load_1m(), 2),
                    "shape": {"heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM}, "layer": {}, "model": {}}
    say(f"{result['cpu']['model']}, {result['cpu']['cores']} cores, torch threads {torch.get_num_threads()}")
    started = time.perf_counter()
    for name in args.dtypes:
        dtype = getattr(torch, name)
        result["layer"][name] = [layer_row(*map(int, cell.split("x")), dtype, args.repeats) for cell in args.grid]
    if not args.skip_model:
        for name in args.dtypes:
            result["model"][name] = model_part(args, getattr(torch, name))
    result["load_1m_end"] = round(load_1m(), 2)
    result["seconds"] = round(time.perf_counter() - started, 1)
    if args.out:
        write_json(Path(args.out), result)
        say(f"wrote {args.out}")


if __name__ == "__main__":
    main()
