"""Mismatch lab: the paper's stability findings in miniature, on CPU, with tiny random Qwen3-MoE models.

(a) Training-inference correction [Zheng et al. 2025, §3, §4.3]. The inference engine mu holds the policy's weights
    rounded to FP8 (e4m3 / e5m2, per-row scale), bf16 or fp16; training is float32. Compared: MiniRL with no
    correction ("wo_train-infer-is"), token TIS (C=5), IcePop (band 0.5..5) and seq-MIS (band 0.5..2).
    (a1) `is_runs`: on-policy training runs over several seeds, logging KL(mu || pi_old) (k3), entropy, reward and
         the fraction of IS weights truncated / masked.
    (a2) `exact_gradient`: the exact gradient error of each correction against the exact on-policy gradient, by
         enumerating every response (V=16, R=4), across weight formats; plus the cosine of single sampled batches.
(b) Routing Replay (`replay_runs`): router agreement and KL(mu || pi_theta) with no replay, R2 and R3 at N = 1, 2, 4
    mini-batch updates per rollout, with a perturbed inference router.

Run: python bench/studies/stability/mismatch_lab.py ; writes docs/results/stability/{*.png, results.json, table.md}.
Defaults: about 3 CPU-minutes on one thread (3.0 min user, 6.8 min wall on a 2-core box shared at load ~5).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from exact_gradient import gradient_bias  # noqa: E402
from is_runs import TrainSetup, train_run  # noqa: E402
from lab_models import CORRECTIONS_COMPARED, PROMPT_LEN, WEIGHT_FORMATS, chain_reward, quantized_copy, tiny_moe  # noqa: E402
from replay_runs import replay_run  # noqa: E402
from tqdm import tqdm  # noqa: E402

sys.path.append(str(Path(__file__).resolve().parents[3]))  # the repository root, for bench.harness
from bench.harness import RESULTS, write_json  # noqa: E402

OUT = RESULTS / "stability"
LABELS = {"none": "no correction", "tis": "token TIS (C=5)", "icepop": "IcePop [0.5, 5]", "seq_mis": "seq-MIS [0.5, 2]",
          "seq_is": "seq IS (unbiased ref.)"}  # fmt: skip
COLORS = {"none": "tab:red", "tis": "tab:blue", "icepop": "tab:green", "seq_mis": "tab:orange", "seq_is": "tab:gray"}
EXACT_VOCAB, EXACT_RESPONSE_LEN = 16, 4


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="a1,a2,b", help="comma list of parts to run: a1, a2, b")
    parser.add_argument("--steps", type=int, default=120, help="(a1) training steps per run")
    parser.add_argument("--seeds", type=int, default=3, help="(a1) seeds per correction")
    parser.add_argument("--lr", type=float, default=1e-3, help="(a1) Adam learning rate")
    parser.add_argument("--train-formats", default="fp8_e4m3", help="(a1) comma list of inference weight formats")
    parser.add_argument("--exact-formats", default="fp16,bf16,fp8_e4m3,fp8_e5m2", help="(a2) comma list of formats")
    parser.add_argument("--exact-seeds", type=int, default=3, help="(a2) model inits per format")
    parser.add_argument("--exact-prompts", type=int, default=4, help="(a2) prompts enumerated (16^4 responses each)")
    parser.add_argument("--batches", type=int, default=32, help="(a2) sampled batches per correction")
    parser.add_argument("--group", type=int, default=16, help="(a2) responses per prompt in a sampled batch")
    parser.add_argument("--rollouts", type=int, default=6, help="(b) rollout batches per configuration")
    parser.add_argument("--replay-lr", type=float, default=1e-2, help="(b) Adam learning rate")
    parser.add_argument("--router-noise", type=float, default=0.1, help="(b) std of the inference router noise")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--replot", action="store_true", help="only redraw plots and table from results.json")
    args = parser.parse_args()
    for name in args.train_formats.split(",") + args.exact_formats.split(","):
        if name not in WEIGHT_FORMATS:
            parser.error(f"unknown weight format {name!r}; choose from {', '.join(WEIGHT_FORMATS)}")
    unknown = set(args.parts.split(",")) - {"a1", "a2", "b"}
    if unknown:
        parser.error(f"unknown part(s) {', '.join(sorted(unknown))}; choose from a1, a2, b")
    return args


# -- (a1) -----------------------------------------------------------------------------------------------------------


def run_a1(args: argparse.Namespace) -> dict[str, dict[str, list[dict[str, list[float]]]]]:
    """Per format, per correction, one history per seed."""
    runs = [(f, c, args.seed + s) for f in args.train_formats.split(",") for c in CORRECTIONS_COMPARED
            for s in range(args.seeds)]  # fmt: skip
    out: dict[str, dict[str, list[dict[str, list[float]]]]] = {}
    for fmt, corr, seed in tqdm(runs, desc="(a1) training runs"):
        setup = TrainSetup(weight_format=fmt, steps=args.steps, lr=args.lr)
        out.setdefault(fmt, {}).setdefault(corr, []).append(train_run(setup, corr, seed))
    return out


def summarize_a1(histories: list[dict[str, list[float]]], tail: int = 20, head: int = 20) -> dict[str, tuple]:
    """Mean and std over seeds of per-run summaries."""

    def per_seed(fn) -> tuple[float, float]:
        values = [v for v in map(fn, histories) if v == v]  # runs that never reach a level give NaN: left out
        return (statistics.fmean(values), statistics.pstdev(values)) if values else (float("nan"), float("nan"))

    def steps_to(h: dict[str, list[float]], level: float = 0.8, window: int = 5) -> float:
        r = h["reward"]
        for i in range(len(r) - window + 1):
            if statistics.fmean(r[i : i + window]) >= level:
                return float(i + window)
        return float("nan")

    return {
        "k3_first": per_seed(lambda h: statistics.fmean(h["kl_k3"][:head])),
        "k3_all": per_seed(lambda h: statistics.fmean(h["kl_k3"])),
        "entropy_last": per_seed(lambda h: statistics.fmean(h["entropy"][-tail:])),
        "reward_last": per_seed(lambda h: statistics.fmean(h["reward"][-tail:])),
        "steps_to_0.8": per_seed(steps_to),
        "truncated": per_seed(lambda h: statistics.fmean(h["correction_truncated_frac"])),
        "masked": per_seed(lambda h: statistics.fmean(h["correction_masked_frac"])),
        "masked_first": per_seed(lambda h: statistics.fmean(h["correction_masked_frac"][:head])),
        "reached_0.8": (float(sum(steps_to(h) == steps_to(h) for h in histories)), float(len(histories))),
    }


def plot_a1(a1: dict, path: Path) -> None:
    keys = [("kl_k3", "KL(mu||pi_old), k3"), ("entropy", "entropy (nats)"), ("reward", "reward (chain task)"),
            ("dropped", "IS weights truncated (TIS) / masked")]  # fmt: skip
    fig, axes = plt.subplots(len(a1), 4, figsize=(17, 3.6 * len(a1)), squeeze=False)
    for row, (fmt, by_corr) in zip(axes, a1.items()):
        for corr, hists in by_corr.items():
            for ax, (key, title) in zip(row, keys):
                if key == "dropped":
                    series = [[a + b for a, b in zip(h["correction_truncated_frac"], h["correction_masked_frac"])]
                              for h in hists]  # fmt: skip
                else:
                    series = [h[key] for h in hists]
                data = torch.tensor(series)  # [seeds, steps]
                steps = range(data.shape[1])
                ax.plot(steps, data.mean(0), color=COLORS[corr], label=LABELS[corr], lw=1.2)
                ax.fill_between(steps, data.min(0).values, data.max(0).values, color=COLORS[corr], alpha=0.12)
                ax.set_title(f"{title} [{fmt}]", fontsize=10)
                ax.set_xlabel("step")
        row[0].set_yscale("log")
        row[0].legend(fontsize=8)
    fig.suptitle("(a1) MiniRL on-policy, float32 training vs low-precision inference weights; "
                 "mean over seeds, band = min..max")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- (a2) -----------------------------------------------------------------------------------------------------------


def run_a2(args: argparse.Namespace) -> dict[str, list[dict]]:
    """Per format, one record per model seed: exact mismatch and per-correction gradient error."""
    cases = [(f, args.seed + s) for f in args.exact_formats.split(",") for s in range(args.exact_seeds)]
    out: dict[str, list[dict]] = {}
    for fmt, seed in tqdm(cases, desc="(a2) exact gradients"):
        model = tiny_moe(seed, vocab=EXACT_VOCAB, embed_std=1.0, head_std=TrainSetup.head_std)
        mu = quantized_copy(model, fmt)
        prompts = torch.randint(0, EXACT_VOCAB, (args.exact_prompts, PROMPT_LEN),
                                generator=torch.Generator().manual_seed(seed))  # fmt: skip
        mismatch, biases = gradient_bias(model, mu, prompts, EXACT_VOCAB, EXACT_RESPONSE_LEN, chain_reward,
                                         args.group, args.batches, batch_seed=seed)  # fmt: skip
        corrections = {k: asdict(v) for k, v in biases.items()}
        out.setdefault(fmt, []).append({**mismatch, "seed": seed, "corrections": corrections})
    return out


def plot_a2(a2: dict, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    names = list(next(iter(a2.values()))[0]["corrections"])
    for name in names:
        xs, ys, yerr, cs, cerr = [], [], [], [], []
        for records in a2.values():
            xs.append(statistics.fmean(r["kl_k3"] for r in records))
            bias = [r["corrections"][name]["relative_bias"] for r in records]
            cos = [r["corrections"][name]["batch_cosine_mean"] for r in records]
            ys.append(statistics.fmean(bias))
            yerr.append(statistics.pstdev(bias))
            cs.append(statistics.fmean(cos))
            cerr.append(statistics.pstdev(cos))
        order = sorted(range(len(xs)), key=xs.__getitem__)
        pick = lambda v, order=order: [v[i] for i in order]  # noqa: E731
        if name != "seq_is":  # its bias is ~1e-7 (float error): off a log axis
            axes[0].errorbar(pick(xs), pick(ys), yerr=pick(yerr), marker="o", color=COLORS[name], label=LABELS[name],
                             capsize=3)  # fmt: skip
        axes[1].errorbar(pick(xs), pick(cs), yerr=pick(cerr), marker="o", color=COLORS[name], label=LABELS[name],
                         capsize=3)  # fmt: skip
    for fmt, records in a2.items():  # name each mismatch level at its no-correction point
        x = statistics.fmean(r["kl_k3"] for r in records)
        y = statistics.fmean(r["corrections"]["none"]["relative_bias"] for r in records)
        axes[0].annotate(fmt, (x, y), textcoords="offset points", xytext=(-10, 8), fontsize=8)
    axes[0].set(xscale="log", yscale="log", xlabel="exact KL(mu||pi) per token (k3)",
                title="exact gradient error ||E[g] - g*|| / ||g*||")  # fmt: skip
    axes[1].set(xscale="log", xlabel="exact KL(mu||pi) per token (k3)",
                title="cosine(one sampled batch's gradient, g*)")  # fmt: skip
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=8)
    fig.suptitle("(a2) gradient vs the exact on-policy gradient g*, all 16^4 responses enumerated; "
                 "bars = std over inits")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- (b) ------------------------------------------------------------------------------------------------------------


def run_b(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    configs = [(m, n) for n in (1, 2, 4) for m in ("none", "R2", "R3")]
    return {f"{m}/N={n}": replay_run(m, n, args.rollouts, args.replay_lr, args.seed, args.router_noise)
            for m, n in tqdm(configs, desc="(b) routing replay")}  # fmt: skip


def plot_b(replay: dict, router_noise: float, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    width = 0.25
    for j, mode in enumerate(("none", "R2", "R3")):
        xs = [i + (j - 1) * width for i in range(3)]
        axes[0].bar(xs, [replay[f"{mode}/N={n}"]["router_agreement"] for n in (1, 2, 4)], width, label=mode)
        axes[1].bar(xs, [replay[f"{mode}/N={n}"]["mismatch_kl_k3"] for n in (1, 2, 4)], width, label=mode)
    for ax, title in zip(axes, ("router agreement (update vs rollout)", "KL(mu||pi_theta) k3 per update")):
        ax.set_xticks(range(3), ["N=1", "N=2", "N=4"])
        ax.set_title(title)
    axes[0].set_ylim(0.5, 1.01)
    axes[0].legend()
    fig.suptitle(f"(b) perturbed inference router (noise std {router_noise}), tiny Qwen3-MoE")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- tables ---------------------------------------------------------------------------------------------------------


def pm(mean_std: tuple[float, float], fmt: str) -> str:
    mean, std = mean_std
    return f"{mean:{fmt}} ± {std:{fmt}}"


def tables(results: dict, args: argparse.Namespace) -> str:
    lines = []
    if "a1" in results:
        lines += [f"### (a1) on-policy MiniRL training, {args.seeds} seeds × {args.steps} steps "
                  "(mean ± std over seeds)",
                  "", "| inference | correction | KL k3, first 20 steps | KL k3, whole run | truncated | masked "
                  "(first 20 steps) | steps to reward 0.8 (seeds that got there) | reward, last 20 "
                  "| entropy, last 20 |",
                  "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for fmt, by_corr in results["a1"].items():
            for corr, hists in by_corr.items():
                s = summarize_a1(hists)
                lines.append(f"| {fmt} | {LABELS[corr]} | {pm(s['k3_first'], '.2e')} | {pm(s['k3_all'], '.2e')} | "
                             f"{pm(s['truncated'], '.4f')} | {pm(s['masked'], '.4f')} ({s['masked_first'][0]:.4f}) | "
                             f"{pm(s['steps_to_0.8'], '.0f')} ({s['reached_0.8'][0]:.0f}/{s['reached_0.8'][1]:.0f}) | "
                             f"{pm(s['reward_last'], '.3f')} | "
                             f"{pm(s['entropy_last'], '.3f')} |")  # fmt: skip
        lines.append("")
    if "a2" in results:
        names = list(next(iter(results["a2"].values()))[0]["corrections"])
        lines += [f"### (a2) exact gradient error vs the exact on-policy gradient ({args.exact_seeds} inits; "
                  f"relative bias ||E[g]-g*||/||g*||, mean ± std; in brackets: mean cosine of one {args.group}"
                  f"×{args.exact_prompts}-response batch with g*)", "",
                  "| inference | exact KL k3 / token | " + " | ".join(LABELS[n] for n in names) + " |",
                  "|---|---|" + "---|" * len(names)]  # fmt: skip
        for fmt, records in results["a2"].items():
            k3 = statistics.fmean(r["kl_k3"] for r in records)
            cells = []
            for n in names:
                bias = [r["corrections"][n]["relative_bias"] for r in records]
                cos = statistics.fmean(r["corrections"][n]["batch_cosine_mean"] for r in records)
                cells.append(f"{statistics.fmean(bias):.3f} ± {statistics.pstdev(bias):.3f} ({cos:.3f})")
            lines.append(f"| {fmt} | {k3:.2e} | " + " | ".join(cells) + " |")
        lines.append("")
    if "b" in results:
        replay = results["b"]
        lines += [f"### (b) Routing Replay, perturbed inference router (std {args.router_noise}), {args.rollouts} "
                  "rollouts", "", "| config | router agreement | KL(mu‖pi_theta) k3 | × vs no replay "
                  "| first-mini-batch KL | staleness k1 |", "|---|---|---|---|---|---|"]  # fmt: skip
        for key, r in replay.items():
            base = replay[f"none/N={key.split('=')[1]}"]["mismatch_kl_k3"]
            lines.append(f"| {key} | {r['router_agreement']:.3f} | {r['mismatch_kl_k3']:.2e} | "
                         f"{r['mismatch_kl_k3'] / base:.2f} | {r['first_minibatch_kl_k3']:.2e} | "
                         f"{r['staleness_kl_k1']:.2e} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)  # the lab shares the CPU; tiny models gain nothing from more threads
    OUT.mkdir(parents=True, exist_ok=True)
    results, seconds = {}, {}
    if args.replot:
        if not (OUT / "results.json").exists():
            raise SystemExit(f"--replot: no {OUT / 'results.json'} yet; run the lab once without it")
        saved = json.loads((OUT / "results.json").read_text())
        args = argparse.Namespace(**saved["args"])
        results = {part: saved[part] for part in ("a1", "a2", "b") if part in saved}
        seconds = saved["seconds"]
    for part, runner in (("a1", run_a1), ("a2", run_a2), ("b", run_b)):
        if part in args.parts.split(",") and part not in results:
            t0 = time.time()
            results[part] = runner(args)
            seconds[part] = round(time.time() - t0, 1)
    if "a1" in results:
        plot_a1(results["a1"], OUT / "is_training.png")
    if "a2" in results:
        plot_a2(results["a2"], OUT / "gradient_bias.png")
    if "b" in results:
        plot_b(results["b"], args.router_noise, OUT / "routing_replay.png")
    table = tables(results, args)
    (OUT / "table.md").write_text(table)
    write_json(OUT / "results.json", {"args": vars(args), "seconds": seconds, **results})
    print(table)
    print(f"seconds per part: {seconds}; plots, table.md and results.json in {OUT}")


if __name__ == "__main__":
    main()
