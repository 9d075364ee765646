"""Routing Replay in a run (issue 45 item 3): does replaying the experts keep an off-policy MoE run stable?

    python bench/studies/routing_replay_run.py              # the study (not yet declared: a pilot comes first)
    python bench/studies/routing_replay_run.py --smoke      # 2 steps per arm, seed 0, 4 held-out tasks, scratch folder
    python bench/studies/routing_replay_run.py --plot-only  # redraw the figure from the JSON

The seed papers' claim [Zheng et al. 2025, §3.2]: in an MoE policy trained off-policy, a parameter update sends some
tokens to other experts, the token's log-probability jumps, the staleness ratio pi_theta / pi_old and the
training-inference ratio pi_old / mu grow, and training degrades; fixing the experts (Routing Replay, R2 or R3:
agentrl/training/routing_replay.py) keeps it stable. Each arm here is `agentrl run` as a user types it, on
``tiny-qwen3-moe`` (random-init 2-layer Qwen3-MoE, 8 experts top-2, the real Qwen3 tokenizer), the HF engine (it
records the experts it chose, which R3 replays), the trainer's defaults otherwise, and one ``loss.routing_replay``:

- ``none``: the router routes live in every pass; the pi_old pass records its experts only to measure how often they
  agree with the ones the rollout engine chose (``router_agreement``).
- ``r2``: the updates replay the experts the training router chose in the pi_old pass.
- ``r3``: the pi_old pass and the updates replay the experts the rollout engine chose.

Off-policy on purpose: ``--sync-every 4`` (the engine gets new weights every 4 steps: samples up to 3 steps old) and
``--optim.n-minibatches 4`` (4 optimizer updates per rollout batch: every update after the first trains pi_theta away
from pi_old), at a learning rate high enough that the task is learnt inside the run (``--lr``, default 1e-2). The
pilot (seed 0, arm none, 48 steps) chose it: at 1e-3 the train reward stayed at 0.51-0.57 for 32 steps (a random
model's logits are near zero: its distribution over 151k tokens is almost uniform, entropy 11.92) though the router
already moved (agreement with the engine 0.09-0.22 right after a sync); at 1e-2 it rose from step ~28 and reached 1.0
by step ~44; at 3e-2 by step ~24. No pilot arm degraded.

The task is bench/studies/token_band_env.py (a single-turn env named by file, as a user names their own): reward =
the share of the reply's tokens whose id lies in the lower half of the vocabulary, 16 new tokens a reply. A random
model starts near 0.5 and learning moves it; success is reward >= 0.9. Math would give a random model reward 0 forever.

Per step the JSON keeps, from each run's metrics.jsonl: train reward and success, ``router_agreement`` (none and r2:
the share of (token, layer) expert sets on which the rollout engine and the pi_old pass agree; R3 logs None, its
passes replay the engine's experts so they agree by construction), ``kl_k3`` (KL(mu || pi_old) over every sample:
staleness included), ``mismatch_kl_k3`` (the same over the samples drawn with the current weights alone: steps 0, 4,
8, ...), the gradient norm, the entropy, the clip fraction, the IS weights' max and truncated share, and step seconds.

Every checkpoint is then evaluated on ``--episodes`` held-out tasks (`agentrl eval` with the same env: task seeds from
1,000,000, one episode each, 16 new tokens), sampling as in training (temperature 1, no top-p or top-k: the trained
distribution itself) unless ``--eval-sampling official`` (the model's generation_config, Qwen3's T 0.6 / top-k 20).
The score of a held-out task is its episode's reward. Each replay arm is compared with ``none`` (and r3 with r2) across
training runs: `agentrl.passk.run_level_bootstrap_difference` (runs drawn with replacement, then held-out tasks drawn
with replacement, the same tasks for both arms), paired by seed (the primary: arms of one seed share their tasks and
sampler seed) and unpaired beside it. The run seed varies the sampler and torch's draws; the built-in model's initial
weights are the same in every run (``tiny-qwen3-moe`` is always initialised from seed 0), as are the training tasks.

Runs go seed by seed (every arm of seed 0, then seed 1, ...), so a stopped study keeps the arms balanced; a finished
run (one that wrote ``walls.json``) or eval is never redone, and the JSON is rewritten after every arm. A run the
collapse guard stops (it is on, as shipped, unless ``--no-guard``) counts as finished: its record says so, and its
last healthy checkpoint is evaluated. Writes docs/results/routing_replay_run.json and .png; run folders go to
runs/routing_replay_run/seed<S>/<arm> (with ``<arm>.log`` beside each).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import (  # noqa: E402
    RESULTS,
    ROOT,
    agentrl_command,
    command_line,
    compare_runs,
    held_out_by_run,
    load_1m,
    plot_seed_curves,
    read_jsonl,
    run_logged,
    write_json,
)

ENV = "bench/studies/token_band_env.py:TokenBandEnv"
"""The env as a user names a file of their own (relative to the repository root, where every command runs)."""
ARMS = ["none", "r2", "r3"]
PER_STEP = ("reward_mean", "success_rate", "router_agreement", "router_agreement_live_vs_replayed", "kl_k3",
            "mismatch_kl_k3", "grad_norm", "entropy",
            "clip_frac", "is_weight_max", "correction_truncated_frac", "staleness_mean", "response_tokens_mean",
            "step_seconds", "rollout_seconds")
CURVES = (("reward_mean", "train reward"), ("router_agreement", "router agreement (engine vs pi_old)"),
          ("router_agreement_live_vs_replayed", "router agreement (live vs replayed, r2/r3)"),
          ("kl_k3", "KL(mu || pi_old), k3, all samples"), ("mismatch_kl_k3", "KL(mu || pi_old), k3, fresh samples"),
          ("grad_norm", "gradient norm"), ("entropy", "entropy"), ("clip_frac", "clip fraction"))
COLORS = {"none": "C3", "r2": "C1", "r3": "C0"}
EVAL_SAMPLING = {"train": ["--temperature", "1", "--top-p", "1", "--top-k", "0"], "official": []}
GUARD_STOP = "collapse guard stopped the run"
LAST_STEPS = 5  # the train reward a run ends at: the mean over its last steps


def run_arm(arm: str, seed: int, args: argparse.Namespace, folder: Path) -> dict:
    """Train one arm of one seed (unless it finished before) and evaluate its checkpoint (unless done); its record.

    Exit codes and wall seconds go to ``<run>/walls.json``, so a second call rebuilds the record without running.
    """
    run, log = folder / arm, folder / f"{arm}.log"
    walls_file = run / "walls.json"
    walls = json.loads(walls_file.read_text()) if walls_file.exists() else {}
    env = os.environ | {"TOKENIZERS_PARALLELISM": "false"}
    if "train_rc" not in walls:  # never started, or stopped before it ended: start it afresh
        walls["train_rc"], walls["train_s"] = run_logged(agentrl_command(
            "run", "--env", ENV, "--model", args.model, "--engine", "hf", "--seed", str(seed),
            "--steps", str(args.steps), "--sync-every", str(args.sync_every),
            "--optim.n-minibatches", str(args.minibatches), "--lr", str(args.lr),
            "--max-new-tokens", str(args.max_new_tokens), "--loss.routing-replay", arm,
            *([] if args.guard else ["--guard.no-enabled"]), "--output", str(run), "--overwrite"), log, env=env)
        stop = [line for line in log.read_text().splitlines() if GUARD_STOP in line]
        walls["guard_stop"] = stop[-1].strip() if stop and walls["train_rc"] else None
        run.mkdir(parents=True, exist_ok=True)  # a run that failed before its first line has no folder
        walls_file.write_text(json.dumps(walls))
    rows = read_jsonl(run / "metrics.jsonl") if (run / "metrics.jsonl").exists() else []
    record: dict = {"arm": arm, "seed": seed, "steps_done": len(rows),
                    "per_step": {k: [r.get(k) for r in rows] for k in PER_STEP}}
    rewards = record["per_step"]["reward_mean"][-LAST_STEPS:]
    if rewards:
        record["train_reward_last_steps"] = statistics.fmean(rewards)
    state = run / "checkpoint" / "trainer_state.json"
    if state.exists():  # a stopped run is evaluated at its last checkpoint, which may be before its last step
        record["checkpoint_step"] = json.loads(state.read_text())["step"]
        if not (run / "eval" / "results.json").exists():
            walls["eval_rc"], walls["eval_s"] = run_logged(agentrl_command(
                "eval", "--env", ENV, "--model", str(run / "checkpoint"), "--engine", "hf",
                "--episodes", str(args.episodes), "--max-new-tokens", str(args.max_new_tokens), "--max-turns", "1",
                *EVAL_SAMPLING[args.eval_sampling], "--output", str(run / "eval")), log, env=env)
            walls_file.write_text(json.dumps(walls))
        if (run / "eval" / "results.json").exists():
            res = json.loads((run / "eval" / "results.json").read_text())
            record["heldout"] = {"reward_mean": res["overall"]["reward_mean"],
                                 "success_rate": res["overall"]["success_rate"], "sampling": res["sampling"]}
    return record | walls


def compare(records: list[dict], runs: Path, seeds: list[int]) -> dict:
    """r2 and r3 against none, and r3 against r2: held-out reward across the training runs both arms evaluated."""
    by_arm = held_out_by_run(runs, records, "reward")
    out = {}
    for arm, base in (("r2", "none"), ("r3", "none"), ("r3", "r2")):
        comparison = compare_runs(by_arm, arm, base, seeds)
        if comparison is not None:
            out[f"{arm} - {base}"] = comparison
    return out


def _mean_of_steps(per_step: dict[str, list]):
    """`key` -> the mean of a run's per-step values of `key` over the steps that logged one (None: none did)."""

    def mean_of(key: str) -> float | None:
        values = [v for v in per_step[key] if v is not None]
        return statistics.fmean(values) if values else None

    return mean_of


def summarize(records: list[dict]) -> dict:
    """Per arm and seed: held-out reward and success, the train reward the run ends at and its mean over every step
    (how fast the run learnt), the first step whose train success reached 0.5, its mean router agreement and mismatch
    KL, its largest gradient norm, whether the guard stopped it; per value, the mean over seeds (over the seeds that
    have one)."""
    out: dict[str, dict] = {}
    for r in records:
        mean_of = _mean_of_steps(r["per_step"])
        grad = [v for v in r["per_step"]["grad_norm"] if v is not None]
        row = {"heldout_reward": r["heldout"]["reward_mean"]["estimate"] if "heldout" in r else None,
               "heldout_success": r["heldout"]["success_rate"]["estimate"] if "heldout" in r else None,
               "train_reward_last_steps": r.get("train_reward_last_steps"),
               "train_reward_mean_all_steps": mean_of("reward_mean"),
               "first_step_success_half": next((i for i, v in enumerate(r["per_step"]["success_rate"])
                                                if v is not None and v >= 0.5), None),
               "router_agreement_mean": mean_of("router_agreement"), "kl_k3_mean": mean_of("kl_k3"),
               "mismatch_kl_k3_mean": mean_of("mismatch_kl_k3"), "grad_norm_max": max(grad) if grad else None,
               "steps_done": r["steps_done"], "guard_stop": r.get("guard_stop")}
        out.setdefault(r["arm"], {"per_seed": {}})["per_seed"][r["seed"]] = row
    for arm in out.values():
        seeds = list(arm["per_seed"].values())
        arm["mean_over_seeds"] = {}
        for key in ("heldout_reward", "heldout_success", "train_reward_last_steps", "train_reward_mean_all_steps",
                    "first_step_success_half", "router_agreement_mean",
                    "kl_k3_mean", "mismatch_kl_k3_mean", "grad_norm_max"):
            values = [s[key] for s in seeds if s[key] is not None]
            arm["mean_over_seeds"][key] = statistics.fmean(values) if values else None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", default=ARMS, choices=ARMS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--sync-every", type=int, default=4)
    parser.add_argument("--minibatches", type=int, default=4, help="optim.n_minibatches: updates per rollout batch")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--model", default="tiny-qwen3-moe")
    parser.add_argument("--episodes", type=int, default=64, help="held-out tasks (one episode each)")
    parser.add_argument("--eval-sampling", choices=sorted(EVAL_SAMPLING), default="train",
                        help="train: temperature 1, no top-p / top-k; official: the model's generation_config")
    parser.add_argument("--no-guard", dest="guard", action="store_false", help="turn the collapse guard off")
    parser.add_argument("--runs", default=None, help="default: runs/routing_replay_run (smoke: ..._smoke)")
    parser.add_argument("--out", default=None,
                        help="default: docs/results/routing_replay_run.json (smoke: into the smoke's runs folder)")
    parser.add_argument("--smoke", action="store_true",
                        help="2 steps per arm, 4 held-out tasks, seed 0 (unless given), into a scratch folder")
    parser.add_argument("--plot-only", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.episodes = 2, 4
        if args.seeds == [0, 1, 2]:
            args.seeds = [0]
    runs = ROOT / (args.runs or ("runs/routing_replay_run_smoke" if args.smoke else "runs/routing_replay_run"))
    out = Path(args.out) if args.out else (runs / "routing_replay_run.json" if args.smoke
                                           else RESULTS / "routing_replay_run.json")
    if args.plot_only:
        plot(json.loads(out.read_text()), out.with_suffix(".png"))
        return
    runs.mkdir(parents=True, exist_ok=True)
    records: list[dict] = []
    load_at_start = load_1m()
    setting = {"model": args.model, "env": ENV, "engine": "hf", "steps": args.steps, "lr": args.lr,
               "sync_every": args.sync_every, "n_minibatches": args.minibatches,
               "max_new_tokens": args.max_new_tokens, "guard": args.guard, "episodes": args.episodes,
               "eval_sampling": args.eval_sampling}
    for seed in args.seeds:  # the JSON is rewritten after every run: a stopped study keeps what it finished
        folder = runs / f"seed{seed}"
        folder.mkdir(exist_ok=True)
        for arm in args.arms:
            record = run_arm(arm, seed, args, folder)
            records.append(record)
            step_s = [v for v in record["per_step"]["step_seconds"] if v is not None]
            print(f"seed {seed} {arm}: steps {record['steps_done']}, train reward (last {LAST_STEPS}) "
                  f"{record.get('train_reward_last_steps')}, held-out {record.get('heldout', {}).get('reward_mean')}, "
                  f"train {record.get('train_s', 0):.0f} s (step {statistics.median(step_s) if step_s else 0:.1f} s "
                  f"median), eval {record.get('eval_s', 0):.0f} s", flush=True)
            if record.get("train_rc") or record.get("eval_rc"):
                print(f"  exit codes: train {record.get('train_rc')}, eval {record.get('eval_rc')}; "
                      f"{record.get('guard_stop') or 'see ' + os.path.relpath(folder / f'{arm}.log', ROOT)}",
                      flush=True)
            result = {"command": command_line(__file__), "seeds": args.seeds, "arms": args.arms, **setting,
                      "load_1m_at_start": load_at_start, "load_1m_now": load_1m(),
                      "runs": os.path.relpath(runs, ROOT), "records": records, "summary": summarize(records),
                      "vs": compare(records, runs, args.seeds)}
            write_json(out, result)
    plot(result, out.with_suffix(".png"))
    print(json.dumps(result["vs"], indent=1))


def plot(result: dict, path: Path) -> None:
    """Per step, a line per arm and seed (colour: arm, line style: seed): train reward, router agreement, the two KLs,
    gradient norm, entropy, clip fraction; and the held-out reward of every run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 3, figsize=(15, 11))  # the curves, then the held-out panel last
    plot_seed_curves(axes.flat, result["records"], CURVES, COLORS)
    ax = axes.flat[-1]
    arms = [a for a in COLORS if any(r["arm"] == a for r in result["records"])]
    for i, arm in enumerate(arms):
        values = [r["heldout"]["reward_mean"]["estimate"] for r in result["records"]
                  if r["arm"] == arm and "heldout" in r]
        ax.scatter([i] * len(values), values, color=COLORS[arm])
        if values:
            ax.hlines(statistics.fmean(values), i - 0.25, i + 0.25, color=COLORS[arm])
    ax.set_xticks(range(len(arms)), arms)
    ax.set(title=f"held-out reward per run ({result['episodes']} tasks)", ylim=(0, 1))
    axes.flat[0].legend(fontsize=6)
    fig.suptitle(f"{result['model']}, token-band task, sync_every {result['sync_every']}, "
                 f"{result['n_minibatches']} mini-batches, lr {result['lr']}, {result['steps']} steps, "
                 f"seeds {result['seeds']}: every run's curve")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
