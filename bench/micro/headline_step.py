"""The headline command's first-step rollout (`agentrl run --env webshop --runners 32`, SmolLM2-135M): full prefill
every turn (prefix reuse off, the old path) against prefix reuse (the new default), on the same slice of episodes.

Both modes play the same WebShop episodes (same seeds, same sampling seed, envs in-process so the env side is
identical) for the first `--turns` turns, in the same process one after the other; the machine's load average is
recorded with each timing, since the machine is shared. Reported per mode: tokens prefilled, tokens generated,
generate seconds, tokens/s, env steps/s, and the ratios. Then a projection of a whole first step (32 episodes x 15
turns, WebShop's budget) from a two-term cost model fitted to the two runs (seconds = a * prefilled tokens + b *
generated tokens + env seconds), with each episode's context growing by the per-turn growth measured here.

Run: python bench/micro/headline_step.py [--episodes 8] [--turns 4]. Writes docs/results/headline_step.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from agentrl.engine import BatchedRequests, HFEngine, SamplingParams
from agentrl.models import load_model
from agentrl.rollout.loop import run_rollout
from agentrl.rollout.pool import EnvMaker, LocalPool

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, write_json  # noqa: E402


def load() -> float:
    """The 1-minute load average as /proc/loadavg prints it (2 decimals; `bench.harness.load_1m` is the kernel's
    unrounded value), so this result's load fields stay comparable with its earlier runs."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def play(engine: HFEngine, policy, episodes: int, group: int, turns: int, max_new_tokens: int) -> dict:
    """Roll out `episodes` WebShop episodes for `turns` turns; return the counters of this mode."""
    sampling = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, seed=0)
    pool = LocalPool(EnvMaker("webshop", {}), slots=episodes)
    load_before, t0 = load(), time.perf_counter()
    result = run_rollout(pool, "webshop", list(range(episodes // group)), group, BatchedRequests(engine),
                         policy.tokenizer, sampling, max_turns=turns, context_options={"family_hint": policy.family})
    seconds = time.perf_counter() - t0
    pool.close()
    stats = result.stats
    prompts = [[len(t.prompt_ids) for t in traj.turns] for traj in result.trajectories]
    growth = [(p[-1] - p[0]) / (len(p) - 1) for p in prompts if len(p) > 1]
    return {"seconds": seconds, "generate_seconds": stats.generate_seconds, "env_seconds": stats.env_seconds,
            "env_steps": stats.env_steps, "generated_tokens": stats.generated_tokens,
            "prefilled_tokens": engine.prefill_tokens, "reused_tokens": engine.reused_tokens,
            "tokens_per_s": stats.generated_tokens / seconds, "env_steps_per_s": stats.env_steps / seconds,
            "first_prompt_tokens": sum(p[0] for p in prompts) / len(prompts),
            "context_growth_per_turn": sum(growth) / max(len(growth), 1),
            "load_before": load_before, "load_after": load(),
            "replies": [[t.generated_ids for t in traj.turns] for traj in result.trajectories]}


def project(old: dict, new: dict, episodes: int = 32, turns: int = 15) -> dict:
    """Seconds of a whole first-step rollout per mode, from a cost model fitted to the two measured runs."""
    per_prefill = (old["generate_seconds"] - new["generate_seconds"]) / max(
        old["prefilled_tokens"] - new["prefilled_tokens"], 1)
    per_generated = max(new["generate_seconds"] - per_prefill * new["prefilled_tokens"], 0.0) / new["generated_tokens"]
    if per_prefill <= 0:  # the prefill saving was lost in the noise (a tiny model, a busy machine): no projection
        return {"seconds_per_prefilled_token": per_prefill, "ratio": float("nan"),
                "old": {"minutes": float("nan")}, "new": {"minutes": float("nan")}}
    first, growth = new["first_prompt_tokens"], new["context_growth_per_turn"]
    prefill_old = episodes * sum(first + k * growth for k in range(turns))
    prefill_new = episodes * (first + (turns - 1) * growth)
    generated = episodes * turns * new["generated_tokens"] / max(new["env_steps"], 1)
    env = episodes * turns * new["env_seconds"] / max(new["env_steps"], 1)
    out = {"seconds_per_prefilled_token": per_prefill, "seconds_per_generated_token": per_generated}
    for name, prefill in (("old", prefill_old), ("new", prefill_new)):
        out[name] = {"prefilled_tokens": prefill, "minutes": (per_prefill * prefill + per_generated * generated + env)
                     / 60}
    out["ratio"] = out["old"]["minutes"] / out["new"]["minutes"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--group", type=int, default=4, help="episodes per task (the run's group_size is 8)")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=RESULTS / "headline_step.json")
    args = parser.parse_args()
    policy = load_model(args.model)
    runs = {}
    for mode, budget in (("old", 0), ("new", None)):
        extra = {} if budget is None else {"prefix_cache_bytes": budget}
        engine = HFEngine(policy.model, policy.tokenizer, batch_size=32, **extra)
        runs[mode] = play(engine, policy, args.episodes, args.group, args.turns, args.max_new_tokens)
        r = runs[mode]
        print(f"{mode}: {r['seconds']:.0f}s (generate {r['generate_seconds']:.0f}s), prefilled "
              f"{r['prefilled_tokens']} tokens (reused {r['reused_tokens']}), generated {r['generated_tokens']}, "
              f"{r['tokens_per_s']:.1f} tok/s, {r['env_steps_per_s']:.3f} env steps/s, load {r['load_before']:.1f} -> "
              f"{r['load_after']:.1f}", flush=True)
    old, new = runs["old"], runs["new"]
    same = old.pop("replies") == new.pop("replies")
    ratios = {"prefilled_tokens": old["prefilled_tokens"] / new["prefilled_tokens"],
              "generate_seconds": old["generate_seconds"] / new["generate_seconds"],
              "tokens_per_s": new["tokens_per_s"] / old["tokens_per_s"],
              "env_steps_per_s": new["env_steps_per_s"] / old["env_steps_per_s"]}
    projection = project(old, new)
    print(f"same replies in both modes: {same}")
    print("new vs old: " + ", ".join(f"{k} x{v:.2f}" for k, v in ratios.items()))
    print(f"projected first step (32 episodes x 15 turns, rollout only, this machine's load): old "
          f"{projection['old']['minutes']:.0f} min, new {projection['new']['minutes']:.0f} min "
          f"(x{projection['ratio']:.1f})")
    write_json(args.out, {"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs, "same_replies": same,
                          "ratios": ratios, "projection": projection})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
