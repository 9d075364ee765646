"""`agentrl inspect RUN_DIR`: what the rollouts of a training run looked like, step by step.

Before reaching for a trick (a new loss, a clip, a filter), look at the rollout distributions: is the reward moving,
are groups all-equal (zero advantage, no learning signal), are responses growing until they hit the token cap, did
a step shift the distribution abruptly? This reads ``trajectories.jsonl`` (one line per episode, written by the
trainer) and ``metrics.jsonl`` (entropy, KL), prints one row per step and, on request, plots the distributions.

Shifts between consecutive steps are two-sample Kolmogorov-Smirnov statistics (the largest gap between the two
empirical CDFs, 0 = same distribution, 1 = disjoint): scale-free, so reward and length shifts read the same way.

The file is streamed line by line and only a few numbers per episode are kept, so runs whose trajectories take
gigabytes (every prompt's token ids are saved) inspect in constant memory per episode.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["EpisodeStats", "StepSummary", "InspectError", "read_episode_stats", "summarize_steps", "ks_statistic",
           "inspect_run", "plot_shifts"]


PLOT_FORMATS = (".png", ".pdf", ".svg", ".jpg", ".jpeg")
"""File endings `--plot` accepts (matplotlib picks the format from them)."""


class InspectError(ValueError):
    """The folder is not a run folder, or a saved file is malformed; the message names the file and line."""


@dataclass(frozen=True)
class EpisodeStats:
    """The few numbers kept per saved episode.

    Attributes:
        step: the trainer step whose update used it (the key of metrics.jsonl); runs saved before trajectories
            recorded it fall back to the policy version, which equals it only for lockstep on-policy runs.
        policy_version: the trainer step whose weights sampled it (step - policy_version = staleness).
        group_id: its group within the step (episodes of one task).
        reward: total return.
        success: the env's verdict.
        turns: model calls.
        tokens: generated tokens over all turns.
        truncated: a budget ran out.
        length_cut: some turn hit ``max_new_tokens``.
        neg_logprob: mean -log mu over generated tokens (a cheap entropy proxy; NaN without tokens).
    """

    step: int
    policy_version: int
    group_id: int
    reward: float
    success: bool
    turns: int
    tokens: int
    truncated: bool
    length_cut: bool
    neg_logprob: float


@dataclass(frozen=True)
class StepSummary:
    """One row of the inspect table.

    Attributes:
        step: trainer step.
        episodes: episodes saved for it.
        success_rate: fraction of successes.
        reward_mean: mean return.
        reward_std: standard deviation of returns.
        reward_p10: 10th percentile of returns.
        reward_p50: median return.
        reward_p90: 90th percentile of returns.
        zero_signal_groups: fraction of groups whose episodes all got the same return (zero advantage).
        tokens_mean: mean generated tokens per episode.
        tokens_p90: 90th percentile of generated tokens.
        turns_mean: mean model calls per episode.
        truncated_frac: fraction of episodes cut by a budget.
        length_cut_frac: fraction of episodes with a turn cut at ``max_new_tokens``.
        neg_logprob: mean -log mu per generated token.
        reward_shift: KS statistic of returns against the previous step shown (NaN for the first).
        tokens_shift: KS statistic of generated tokens against the previous step shown.
        entropy: the trainer's entropy for the step (metrics.jsonl), NaN if absent.
        kl_k3: the trainer's KL(mu || pi_old) k3 estimate, NaN if absent.
    """

    step: int
    episodes: int
    success_rate: float
    reward_mean: float
    reward_std: float
    reward_p10: float
    reward_p50: float
    reward_p90: float
    zero_signal_groups: float
    tokens_mean: float
    tokens_p90: float
    turns_mean: float
    truncated_frac: float
    length_cut_frac: float
    neg_logprob: float
    reward_shift: float
    tokens_shift: float
    entropy: float = float("nan")
    kl_k3: float = float("nan")


def _episode_stats(d: dict[str, Any]) -> EpisodeStats:
    turns = d["turns"]
    logprobs = [lp for t in turns for lp in t["rollout_logprobs"]]
    tokens = sum(len(t["generated_ids"]) for t in turns)
    return EpisodeStats(
        step=int(d["train_step"] if d.get("train_step") is not None else d.get("policy_version", 0)),
        policy_version=int(d.get("policy_version", 0)), group_id=int(d["group_id"]), reward=float(d["total_return"]),
        success=bool(d["success"]), turns=len(turns), tokens=tokens, truncated=bool(d["truncated"]),
        length_cut=any(t.get("finish_reason") == "length" for t in turns),
        neg_logprob=-float(np.mean(logprobs)) if logprobs else float("nan"),
    )


def read_episode_stats(path: str | Path) -> Iterator[EpisodeStats]:
    """Stream `EpisodeStats` from a trajectories.jsonl; a malformed line raises `InspectError` naming it."""
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield _episode_stats(json.loads(line))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise InspectError(f"{path}:{lineno}: not a saved trajectory ({type(e).__name__}: {e})") from None


def ks_statistic(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs of `a` and `b`."""
    x, y = np.sort(np.asarray(a, dtype=float)), np.sort(np.asarray(b, dtype=float))
    if len(x) == 0 or len(y) == 0:
        return float("nan")
    grid = np.concatenate([x, y])  # the gap is largest at one of the observed values
    cdf_x = np.searchsorted(x, grid, side="right") / len(x)
    cdf_y = np.searchsorted(y, grid, side="right") / len(y)
    return float(np.max(np.abs(cdf_x - cdf_y)))


def _read_metrics(path: Path) -> dict[int, dict[str, Any]]:
    if not path.exists():
        return {}
    out = {}
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out[int(row["step"])] = row
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise InspectError(f"{path}:{lineno}: not a metrics line ({type(e).__name__}: {e})") from None
    return out


def _nan_if_none(x: Any) -> float:
    return float("nan") if x is None else float(x)


def summarize_steps(episodes: Sequence[EpisodeStats], metrics: dict[int, dict[str, Any]] | None = None,
                    every: int = 1) -> list[StepSummary]:
    """One `StepSummary` per step (every `every`-th step, the last always included), shifts against the previous row.

    Args:
        episodes: per-episode stats, any order.
        metrics: the trainer's metrics.jsonl rows by step (for entropy and KL), optional.
        every: keep every N-th step.
    """
    if every < 1:
        raise InspectError(f"--every must be >= 1, got {every}")
    by_step: dict[int, list[EpisodeStats]] = {}
    for e in episodes:
        by_step.setdefault(e.step, []).append(e)
    steps = sorted(by_step)
    shown = [s for i, s in enumerate(steps) if i % every == 0 or s == steps[-1]]
    metrics = metrics or {}
    rows: list[StepSummary] = []
    prev: list[EpisodeStats] | None = None
    for step in shown:
        eps = by_step[step]
        rewards = np.array([e.reward for e in eps])
        tokens = np.array([e.tokens for e in eps], dtype=float)
        groups: dict[tuple[int, int], list[float]] = {}
        for e in eps:  # group ids restart with every rollout: a step may train on rollouts of several versions
            groups.setdefault((e.policy_version, e.group_id), []).append(e.reward)
        flat = sum(1 for g in groups.values() if len(g) > 1 and max(g) == min(g))
        multi = sum(1 for g in groups.values() if len(g) > 1)
        m = metrics.get(step, {})
        rows.append(StepSummary(
            step=step, episodes=len(eps), success_rate=float(np.mean([e.success for e in eps])),
            reward_mean=float(rewards.mean()), reward_std=float(rewards.std()),
            reward_p10=float(np.quantile(rewards, 0.1)), reward_p50=float(np.median(rewards)),
            reward_p90=float(np.quantile(rewards, 0.9)),
            zero_signal_groups=flat / multi if multi else float("nan"),
            tokens_mean=float(tokens.mean()), tokens_p90=float(np.quantile(tokens, 0.9)),
            turns_mean=float(np.mean([e.turns for e in eps])),
            truncated_frac=float(np.mean([e.truncated for e in eps])),
            length_cut_frac=float(np.mean([e.length_cut for e in eps])),
            neg_logprob=float(np.nanmean([e.neg_logprob for e in eps])) if any(e.tokens for e in eps)
            else float("nan"),
            reward_shift=ks_statistic([e.reward for e in prev], rewards) if prev else float("nan"),
            tokens_shift=ks_statistic([e.tokens for e in prev], tokens) if prev else float("nan"),
            entropy=_nan_if_none(m.get("entropy")), kl_k3=_nan_if_none(m.get("kl_k3")),
        ))
        prev = eps
    return rows


def plot_shifts(rows: Sequence[StepSummary], episodes: Sequence[EpisodeStats], path: str | Path) -> Path:
    """A 2x2 PNG: return and length distributions per step (box plots), signal and shift curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r.step for r in rows]
    by_step = {s: [e for e in episodes if e.step == s] for s in steps}
    fig, axes = plt.subplots(2, 2, figsize=(12, 7))
    (ax_r, ax_t), (ax_s, ax_k) = axes
    ax_r.boxplot([[e.reward for e in by_step[s]] for s in steps], positions=steps, widths=0.6, showmeans=True)
    ax_r.set_title("episode return per step")
    ax_t.boxplot([[e.tokens for e in by_step[s]] for s in steps], positions=steps, widths=0.6, showmeans=True)
    ax_t.set_title("generated tokens per episode")
    ax_s.plot(steps, [r.success_rate for r in rows], marker="o", label="success rate")
    ax_s.plot(steps, [r.zero_signal_groups for r in rows], marker="s", label="groups with zero advantage")
    ax_s.plot(steps, [r.length_cut_frac for r in rows], marker="^", label="episodes cut at max_new_tokens")
    ax_s.set_ylim(-0.02, 1.02)
    ax_s.set_title("learning signal")
    ax_s.legend(fontsize=8)
    ax_k.plot(steps, [r.reward_shift for r in rows], marker="o", label="return")
    ax_k.plot(steps, [r.tokens_shift for r in rows], marker="s", label="length")
    ax_k.set_ylim(-0.02, 1.02)
    ax_k.set_title("shift from the previous step (KS statistic)")
    ax_k.legend(fontsize=8)
    for ax in axes.ravel():
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _fmt(x: float, spec: str = ".2f") -> str:
    return "-" if x != x else format(x, spec)  # NaN != NaN


def print_steps(rows: Sequence[StepSummary], console=None, title: str = "") -> None:
    """The per-step table (rich)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=title or None, title_justify="left")
    columns = [("step", "d"), ("eps", "d"), ("success", ".2f"), ("return", ".3f"), ("p10/p50/p90", ""),
               ("flat grp", ".2f"), ("tokens", ".1f"), ("tok p90", ".0f"), ("turns", ".1f"), ("cut", ".2f"),
               ("trunc", ".2f"), ("-logmu", ".3f"), ("entropy", ".3f"), ("kl_k3", ".1e"), ("Δret", ".2f"),
               ("Δlen", ".2f")]
    for name, _ in columns:
        table.add_column(name, justify="right")
    for r in rows:
        values = [r.step, r.episodes, r.success_rate, r.reward_mean,
                  f"{r.reward_p10:.2f}/{r.reward_p50:.2f}/{r.reward_p90:.2f}", r.zero_signal_groups, r.tokens_mean,
                  r.tokens_p90, r.turns_mean, r.length_cut_frac, r.truncated_frac, r.neg_logprob, r.entropy, r.kl_k3,
                  r.reward_shift, r.tokens_shift]
        table.add_row(*[v if isinstance(v, str) else _fmt(v, spec) for v, (_, spec) in zip(values, columns)])
    console.print(table)
    console.print("flat grp: groups whose episodes all got the same return (zero advantage); cut: a turn hit "
                  "max_new_tokens; -logmu: mean negative log-prob of sampled tokens; Δ: KS shift from the row above.")


def inspect_run(run_dir: str | Path, *, plot: str | Path | None = None, every: int = 1,
                console=None) -> list[StepSummary]:
    """Print the per-step summary of a run folder (and write the plot when `plot` is given); return the rows.

    Raises:
        InspectError: no trajectories.jsonl in `run_dir`, or a malformed line (named).
    """
    from rich.console import Console

    console = console or Console()
    run = Path(run_dir)
    if run.is_file():  # `agentrl inspect runs/x/trajectories.jsonl` means its folder
        run = run.parent
    if plot is not None:  # check before the (possibly long) read, so a typo costs nothing
        plot = Path(plot)
        if plot.suffix.lower() not in PLOT_FORMATS:
            raise InspectError(f"--plot {plot}: the file name must end in {', '.join(PLOT_FORMATS)}")
        if not plot.parent.is_dir():
            raise InspectError(f"--plot {plot}: the folder {plot.parent} does not exist")
    path = run / "trajectories.jsonl"
    if not path.exists():
        hint = " (the run was started with save_trajectories: false?)" if (run / "metrics.jsonl").exists() else ""
        raise InspectError(f"{path} not found{hint}; `agentrl inspect` needs a folder written by `agentrl run`")
    episodes = list(read_episode_stats(path))
    if not episodes:
        raise InspectError(f"{path} holds no trajectories")
    rows = summarize_steps(episodes, _read_metrics(run / "metrics.jsonl"), every=every)
    sampling = run / "sampling.json"
    note = ""
    if sampling.exists():
        s = json.loads(sampling.read_text())
        note = f" — sampled at temperature {s.get('temperature')}, top_p {s.get('top_p')}, top_k {s.get('top_k')}"
    print_steps(rows, console, title=f"{run}: {len(episodes)} episodes over {len(rows)} steps shown{note}")
    if plot is not None:
        console.print(f"distribution shifts plotted in {plot_shifts(rows, episodes, plot)}")
    return rows
