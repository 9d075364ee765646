"""Pipeline busy fraction of sync intervals and async staleness bounds, in a discrete-event simulation.

The setup mirrors the practitioners' WebShop report (16 runners; 8 accelerators roll out, 2 train): `--slots`
episodes run at once on the rollout side; the trainer takes `--batch` finished episodes per step. An episode is a
sequence of turns, each a generation followed by an env step, with long-tailed latencies:

* turns per episode: 1 + a geometric draw (mean `--turns`), capped at 15;
* generation per turn: lognormal tokens (median 120, sigma 0.9, capped at 1024) at `--decode-tok-s`;
* env step: lognormal seconds (median `--env-median`, sigma 1.2): most steps are fast, a few take ten times longer;
* with ``--trajectories run/trajectories.jsonl``, every latency is measured instead: the number of turns is drawn
  from the run's episode lengths, and each turn's (generation, env) seconds pair from the run's turns
  (`Turn.generate_seconds`: the turn's share of its batched engine call; `Turn.env_seconds`: `env.step` in the
  runner). The distributions' quantiles are printed and saved with the results. An untrained model plays every
  episode to the turn cap, so ``--turns-from model`` keeps the measured per-turn latencies but draws the number of
  turns from the long-tailed model above. For example, from a multi-turn ALFWorld run with four Ray runners:

      agentrl run --env alfworld --model tiny-qwen3 --max-turns 8 --steps 1 --runners 4 --output runs/alf
      python bench/micro/pool_pipeline.py --trajectories runs/alf/trajectories.jsonl

Modes: ``sync k`` rolls out k batches with fixed weights (slots refill as episodes end, so tails overlap within the
round), the trainer trains each batch as soon as it is complete, and the rollout side waits for the k-th update
and the weight sync before the next round. ``async s`` keeps the slots busy all the time but starts an episode of
batch b only when the trainer has finished step b - s (so samples are at most s versions old); weights sync after
every update.

Busy fraction = occupancy of the rollout slots by episodes that were trained on (slot time of episodes evicted as
too stale counts as idle), over the whole run: rollout is the bottleneck the pipeline exists to keep busy (the
trainer is sized to keep up: `--train-fraction`). The device-weighted figure (8 x rollout + 2 x trainer) / 10 is
reported beside it. The baseline for the ratios is sync 1 in the same run, for each batch size (episodes per step;
more episodes per step give a long-tailed episode more time before it is too stale). Results go to
docs/results/pool_pipeline.json (pool_pipeline_measured_turns_from_*.json with ``--trajectories``).

    python bench/micro/pool_pipeline.py [--steps 200] [--seeds 3] [--batch 32 64 128]
"""

from __future__ import annotations

import argparse
import heapq
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, write_json  # noqa: E402


@dataclass(frozen=True)
class Outcome:
    """One simulated run."""

    device_weighted: float
    rollout_occupancy: float
    trainer_occupancy: float
    staleness_mean: float
    staleness_max: int
    seconds: float


@dataclass(frozen=True)
class MeasuredLatencies:
    """Per-turn latencies of a real run: episode lengths, and (generation, env) seconds of every turn."""

    episode_turns: np.ndarray  # [episodes]
    generate_seconds: np.ndarray  # [turns]
    env_seconds: np.ndarray  # [turns]

    @classmethod
    def load(cls, path: Path) -> MeasuredLatencies:
        """Read a run's trajectories.jsonl; fails with a clear message when it holds no turns."""
        from agentrl.records import load_trajectories

        if not path.exists():
            raise SystemExit(f"--trajectories {path}: no such file (a run folder's trajectories.jsonl)")
        episodes = [e for e in load_trajectories(path) if e.turns]
        if not episodes:
            raise SystemExit(f"--trajectories {path}: no episode with a turn in it")
        turns = [t for e in episodes for t in e.turns]
        return cls(np.array([len(e.turns) for e in episodes]), np.array([t.generate_seconds for t in turns]),
                   np.array([t.env_seconds for t in turns]))

    def summary(self) -> dict[str, dict[str, float]]:
        """Mean and quantiles of each distribution, for the printout and the results file."""
        def describe(x: np.ndarray) -> dict[str, float]:
            q = np.quantile(x, [0.5, 0.9, 0.99])
            return {"n": int(len(x)), "mean": float(x.mean()), "p50": float(q[0]), "p90": float(q[1]),
                    "p99": float(q[2]), "max": float(x.max())}

        return {"turns_per_episode": describe(self.episode_turns), "generate_seconds": describe(self.generate_seconds),
                "env_seconds": describe(self.env_seconds)}


class EpisodeSampler:
    """Draws episode durations (seconds) from the parametric long-tailed model or from a real run's turns."""

    def __init__(self, rng: np.random.Generator, turns: float, decode_tok_s: float, env_median: float,
                 measured: MeasuredLatencies | None = None, measured_turns: bool = True):
        self.rng, self.turns, self.decode, self.env_median = rng, turns, decode_tok_s, env_median
        self.measured, self.measured_turns = measured, measured_turns

    def _turns(self) -> int:
        return min(15, 1 + self.rng.geometric(1 / self.turns) - 1) or 1

    def __call__(self) -> float:
        if self.measured is not None:
            m = self.measured
            n = int(m.episode_turns[self.rng.integers(len(m.episode_turns))]) if self.measured_turns else self._turns()
            # A turn's generation and env seconds are drawn together: a long reply may well mean a slow step.
            picks = self.rng.integers(len(m.generate_seconds), size=n)
            return float(m.generate_seconds[picks].sum() + m.env_seconds[picks].sum())
        n = self._turns()
        tokens = np.minimum(1024, self.rng.lognormal(np.log(120), 0.9, n))
        env = self.rng.lognormal(np.log(self.env_median), 1.2, n)
        return float(tokens.sum() / self.decode + env.sum())


def simulate_async(s: int, *, slots: int, batch: int, steps: int, train_s: float, sync_s: float,
                   sample: EpisodeSampler) -> Outcome:
    """Async mode as `agentrl.rollout.scheduler` runs it: slots never wait for a batch boundary.

    An episode starts whenever a slot is free and fewer than (s + 1) batches are in flight or waiting; it records
    the engine's version at its start. Finished episodes wait in the freshness buffer; the trainer takes the
    `batch` freshest as soon as there are enough, evicting (and wasting) any more than `s` versions old. Weights
    sync after every update.
    """
    t, trained = 0.0, 0
    free, launched, consumed = slots, 0, 0
    events: list[tuple[float, int, int]] = []  # (end time, seq, version at start)
    durations: dict[int, float] = {}
    buffer: list[tuple[int, int]] = []  # (version, seq) of finished episodes
    seq = 0
    useful_busy = trainer_busy = 0.0
    train_until: float | None = None
    staleness: list[int] = []
    while trained < steps:
        while free and launched - consumed < (s + 1) * batch:
            duration = sample()
            heapq.heappush(events, (t + duration, seq, trained))
            durations[seq] = duration
            seq += 1
            free -= 1
            launched += 1
        if train_until is None:
            fresh = [e for e in buffer if trained - e[0] <= s]
            consumed += len(buffer) - len(fresh)  # evicted: their slot time was wasted
            buffer = fresh
            if len(buffer) >= batch:
                buffer.sort(key=lambda e: (-e[0], e[1]))  # freshest first
                taken, buffer = buffer[:batch], buffer[batch:]
                consumed += batch
                staleness.append(trained - min(v for v, _ in taken))
                useful_busy += sum(durations.pop(i) for _, i in taken)
                train_until = t + train_s + sync_s
                trainer_busy += train_s + sync_s
                heapq.heappush(events, (train_until, -1, -1))
        end, i, version = heapq.heappop(events)
        t = end
        if i == -1:
            trained += 1
            train_until = None
        else:
            free += 1
            buffer.append((version, i))
    rollout_occ = useful_busy / (slots * t)
    trainer_occ = trainer_busy / t
    return Outcome((8 * rollout_occ + 2 * trainer_occ) / 10, rollout_occ, trainer_occ,
                   float(np.mean(staleness)), int(max(staleness)), t)


def simulate(mode: str, k: int, *, slots: int, batch: int, steps: int, train_s: float, sync_s: float,
             sample: EpisodeSampler) -> Outcome:
    """Run `steps` training steps in `mode` ("sync" with interval k, or "async" with staleness bound k)."""
    t, trained, engine_version = 0.0, 0, 0
    free, next_ep, total = slots, 0, steps * batch
    done_in_batch = [0] * steps
    oldest_version = [10**9] * steps
    events: list[tuple[float, int, str, int, int]] = []
    seq = 0
    slot_busy = trainer_busy = 0.0
    trainer_free = True
    staleness: list[int] = []

    def allowed(b: int) -> bool:
        if mode == "sync":
            return (b // k) * k <= trained and engine_version == (b // k) * k
        return b - trained <= k

    while trained < steps:
        while free and next_ep < total and allowed(next_ep // batch):
            b = next_ep // batch
            duration = sample()
            heapq.heappush(events, (t + duration, seq, "episode", b, engine_version))
            seq += 1
            oldest_version[b] = min(oldest_version[b], engine_version)
            slot_busy += duration
            free -= 1
            next_ep += 1
        if trainer_free and trained < steps and done_in_batch[trained] == batch:
            sync_now = mode == "async" or (trained + 1) % k == 0
            cost = train_s + (sync_s if sync_now else 0.0)
            heapq.heappush(events, (t + cost, seq, "train", trained, 0))
            seq += 1
            trainer_busy += cost
            trainer_free = False
        t, _, kind, b, version = heapq.heappop(events)
        if kind == "episode":
            free += 1
            done_in_batch[b] += 1
        else:
            staleness.append(trained - oldest_version[trained])
            trained += 1
            trainer_free = True
            if mode == "async" or trained % k == 0:
                engine_version = trained
    rollout_occ = slot_busy / (slots * t)
    trainer_occ = trainer_busy / t
    return Outcome((8 * rollout_occ + 2 * trainer_occ) / 10, rollout_occ, trainer_occ,
                   float(np.mean(staleness)), int(max(staleness)), t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--batch", type=int, nargs="+", default=[32, 64, 128], help="episodes per training step")
    parser.add_argument("--turns", type=float, default=6.0)
    parser.add_argument("--decode-tok-s", type=float, default=60.0, help="per-episode decode speed")
    parser.add_argument("--env-median", type=float, default=0.3, help="median env step seconds")
    parser.add_argument("--train-fraction", type=float, default=0.5,
                        help="train seconds per step / mean rollout seconds per batch at full occupancy")
    parser.add_argument("--trajectories", type=Path, default=None, help="a run's trajectories.jsonl")
    parser.add_argument("--turns-from", choices=["run", "model"], default="run",
                        help="with --trajectories: turns per episode from the run, or from the long-tailed model")
    args = parser.parse_args()

    measured = MeasuredLatencies.load(args.trajectories) if args.trajectories else None
    if measured is not None:
        for name, d in measured.summary().items():
            print(f"measured {name}: n={d['n']} mean {d['mean']:.4g} p50 {d['p50']:.4g} p90 {d['p90']:.4g} "
                  f"p99 {d['p99']:.4g} max {d['max']:.4g}")
    measured_turns = args.turns_from == "run"
    probe = EpisodeSampler(np.random.default_rng(0), args.turns, args.decode_tok_s, args.env_median, measured,
                           measured_turns)
    mean_episode = float(np.mean([probe() for _ in range(20_000)]))
    modes = [("sync", 1), ("sync", 5), ("sync", 10), ("sync", 20), ("async", 1), ("async", 2)]
    tables = {}
    print(f"mean episode {mean_episode:.1f}s; practitioners (GPU utilization): sync 1/5/10/20 = 62/72/81/85%")
    for batch in args.batch:
        train_s = args.train_fraction * mean_episode * batch / args.slots
        sync_s = 0.05 * train_s
        rows = {}
        for mode, k in modes:
            run = simulate if mode == "sync" else (lambda _, k, **kw: simulate_async(k, **kw))
            outs = [run(mode, k, slots=args.slots, batch=batch, steps=args.steps, train_s=train_s, sync_s=sync_s,
                        sample=EpisodeSampler(np.random.default_rng(seed), args.turns, args.decode_tok_s,
                                              args.env_median, measured, measured_turns))
                    for seed in range(args.seeds)]
            rows[f"{mode} {k}"] = {
                "busy": float(np.mean([o.rollout_occupancy for o in outs])),
                "device_weighted": float(np.mean([o.device_weighted for o in outs])),
                "trainer_occupancy": float(np.mean([o.trainer_occupancy for o in outs])),
                "staleness_mean": float(np.mean([o.staleness_mean for o in outs])),
                "staleness_max": max(o.staleness_max for o in outs),
                "seconds_per_step": float(np.mean([o.seconds for o in outs])) / args.steps,
            }
        base = rows["sync 1"]
        for row in rows.values():
            row["busy_vs_sync1"] = row["busy"] / base["busy"]
            row["speed_vs_sync1"] = base["seconds_per_step"] / row["seconds_per_step"]
        tables[str(batch)] = {"train_s": train_s, "sync_s": sync_s, "modes": rows}
        print(f"batch {batch} episodes/step, {args.slots} slots, train {train_s:.1f}s/step:")
        for name, row in rows.items():
            print(f"  {name:>8}: busy {100 * row['busy']:5.1f}% ({row['busy_vs_sync1']:.2f}x sync 1), device-weighted "
                  f"{100 * row['device_weighted']:5.1f}%, staleness mean {row['staleness_mean']:.2f} "
                  f"max {row['staleness_max']}, {row['speed_vs_sync1']:.2f}x steps/s")
    settings = vars(args) | {"trajectories": str(args.trajectories) if args.trajectories else None,
                             "mean_episode_s": mean_episode,
                             "measured": measured.summary() if measured is not None else None}
    name = "pool_pipeline.json" if measured is None else f"pool_pipeline_measured_turns_from_{args.turns_from}.json"
    write_json(RESULTS / name, {"settings": settings, "batches": tables})

if __name__ == "__main__":
    main()
