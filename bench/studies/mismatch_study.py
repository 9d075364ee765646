"""The mismatch study (issue 32 item 3): a bfloat16 vLLM sampler against the float32 trainer, on the main job.

    python bench/studies/mismatch_study.py                            # the declared arms (docs/experiments/issue32.md)
    python bench/studies/mismatch_study.py --arms minirl_tis@1 --steps 2 --episodes 8     # a smoke test

Each arm is the README's first command (`agentrl run --env math`, configs/math-smollm2.yaml: SmolLM2-135M-Instruct,
20 steps of 4 tasks x 8 episodes, lr 2e-5) with the vLLM engine sampling in bfloat16 (`--engine vllm --engine-dtype
bfloat16`; the trainer stays float32), one objective and one `sync_every`:

- ``minirl_tis``: MiniRL as shipped (token-level truncated IS on pi_old / mu at C = 5, one-sided clip, token sums);
- ``minirl_nois``: the same without the training-inference correction (``loss.options.correction: none``);
- ``grpo``: length-normalised GRPO (the registered ``grpo`` loss: PPO clip 0.2, token mean per response, no IS) with
  its std-normalised advantages (``advantage.name grpo``);

``@1`` is on-policy (the engine gets the new weights every step), ``@4`` refreshes them every 4 steps (samples up to
3 steps old). Every checkpoint is then evaluated on the 64 held-out tasks of main_job_seeds.py (task seeds from
1,000,000, sampler seed 0, `agentrl eval` defaults, HF engine in float32: the protocol of the seed study), and each
arm is compared with ``minirl_tis`` at the same `sync_every` by the paired bootstrap on those tasks.

Per step the JSON keeps the mismatch KL(mu || pi_old) (k1, k3), the IS weight statistics (mean, max, ESS, the share
of weights truncated), the clip fractions, the gradient norm, the entropy, train success and step seconds. Writes
docs/results/mismatch_study.json and .png; run folders go to runs/mismatch_study/<arm>.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[2]))  # the repository root, for bench.harness
from bench.harness import RESULTS, ROOT, agentrl_command, command_line, read_jsonl, run_logged, write_json  # noqa: E402

OBJECTIVES = {
    "minirl_tis": [],
    "minirl_nois": ["--loss.options", "{correction: none}"],
    "grpo": ["--loss.name", "grpo", "--advantage.estimator", "grpo"],
}
PER_STEP = ("success_rate", "reward_mean", "entropy", "grad_norm", "kl_k1", "kl_k3", "is_weight_mean", "is_weight_max",
            "is_ess", "correction_truncated_frac", "clip_frac", "clip_frac_low", "clip_frac_high", "ppo_kl",
            "ratio_max", "staleness_mean", "response_tokens_mean", "step_seconds", "rollout_seconds")


def _sh(cmd: list[str], log: Path) -> tuple[int, float]:
    """Run `cmd` with its output appended to `log`; return its exit code and wall seconds."""
    return run_logged(cmd, log, env=os.environ | {"TOKENIZERS_PARALLELISM": "false"})


def run_arm(arm: str, args: argparse.Namespace, runs: Path, log: Path) -> dict:
    """Train one arm (unless its checkpoint exists) and evaluate it (unless done); its per-step metrics and eval.

    Wall times go to ``<run>/walls.json``, so a second call rebuilds the arm's record without running anything.
    """
    objective, sync = arm.split("@")
    run = runs / arm
    agentrl = agentrl_command()
    walls_file = run / "walls.json"
    walls = json.loads(walls_file.read_text()) if walls_file.exists() else {}
    if not (run / "checkpoint").is_dir():
        walls["train_rc"], walls["train_s"] = _sh(agentrl + [
            "run", "--env", "math", "--seed", str(args.seed), "--steps", str(args.steps), "--engine", "vllm",
            "--engine-dtype", args.engine_dtype, "--sync-every", sync, *OBJECTIVES[objective],
            *(["--lr", str(args.lr)] if args.lr else []), "--output", str(run), "--overwrite"], log)
        run.mkdir(parents=True, exist_ok=True)  # a run that failed before its first line has no folder
        walls_file.write_text(json.dumps(walls))
    rows = read_jsonl(run / "metrics.jsonl") if (run / "metrics.jsonl").exists() else []
    out: dict = {"arm": arm, "objective": objective, "sync_every": int(sync), "steps_done": len(rows),
                 "per_step": {k: [r.get(k) for r in rows] for k in PER_STEP}}
    state = run / "checkpoint" / "trainer_state.json"
    if state.exists():  # a stopped arm is evaluated at its last checkpoint, which may be before its last step
        out["checkpoint_step"] = json.loads(state.read_text())["step"]
        if not (run / "eval" / "results.json").exists() and not args.no_eval:
            walls["eval_rc"], walls["eval_s"] = _sh(agentrl + [
                "eval", "--env", "math", "--model", str(run / "checkpoint"), "--episodes", str(args.episodes),
                "--engine", "hf", "--output", str(run / "eval")], log)
            walls_file.write_text(json.dumps(walls))
        if (run / "eval" / "results.json").exists():
            res = json.loads((run / "eval" / "results.json").read_text())
            out["heldout"] = {k: res["overall"]["success_rate"][k] for k in ("estimate", "low", "high")}
    return out | walls


def float32_reference(arm: dict) -> dict | None:
    """The seed study's five float32-sampler runs (docs/results/main_job_seeds.json) over this arm's trained steps.

    A step's tasks do not depend on the run seed, so each seed's train success over steps 0..n-1 is on the same
    tasks as this arm's: per seed its mean, beside the arm's. Descriptive (different samplers, different engines).
    """
    path = RESULTS / "main_job_seeds.json"
    n = arm.get("checkpoint_step", arm["steps_done"] - 1) + 1
    if not path.exists() or n <= 0:
        return None
    seeds = json.loads(path.read_text())["seeds"]
    return {"steps": n, "arm_train_success_mean": statistics.fmean(arm["per_step"]["success_rate"][:n]),
            "float32_seeds_train_success_mean": {s["seed"]: statistics.fmean(s["train_success"][:n]) for s in seeds},
            "float32_seeds_heldout_after_20_steps": {s["seed"]: s["heldout_agentrl_eval"]["estimate"] for s in seeds}}


def main() -> None:
    from agentrl.passk import bootstrap_pass_at_k_difference, task_counts
    from agentrl.recipes.evaluate import load_results

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", default=["minirl_tis@1", "minirl_tis@4", "minirl_nois@4", "grpo@4"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.0, help="0: the recipe's (2e-5)")
    parser.add_argument("--engine-dtype", default="bfloat16")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--runs", default="runs/mismatch_study")
    parser.add_argument("--out", default=str(RESULTS / "mismatch_study.json"))
    parser.add_argument("--plot-only", action="store_true")
    parser.add_argument("--no-eval", action="store_true", help="record the arms without evaluating any checkpoint")
    args = parser.parse_args()
    out = Path(args.out)
    if args.plot_only:
        plot(json.loads(out.read_text()), out.with_suffix(".png"))
        return
    runs = ROOT / args.runs
    runs.mkdir(parents=True, exist_ok=True)
    arms = []
    for arm in args.arms:  # the JSON is rewritten after every arm: a stopped study keeps what it finished
        arms.append(run_arm(arm, args, runs, runs / "log.txt"))
        arms[-1]["float32_reference"] = float32_reference(arms[-1])
        print(f"{arm}: steps {arms[-1]['steps_done']}, held-out {arms[-1].get('heldout')}, "
              f"train {arms[-1].get('train_s', 0):.0f} s, eval {arms[-1].get('eval_s', 0):.0f} s", flush=True)
        comparisons = {}
        for a in arms:
            base = next((b for b in arms
                         if b["objective"] == "minirl_tis" and b["sync_every"] == a["sync_every"]), None)
            if base is None or base is a or "heldout" not in a or "heldout" not in base:
                continue
            ea = load_results(runs / a["arm"] / "eval")["episodes"]
            eb = load_results(runs / base["arm"] / "eval")["episodes"]
            d = bootstrap_pass_at_k_difference(task_counts(ea), task_counts(eb), 1, paired=True)
            comparisons[f"{a['arm']} - {base['arm']}"] = d.to_dict() | {"significant": d.excludes_zero}
        result = {"command": command_line(__file__), "steps": args.steps,
                  "seed": args.seed, "engine_dtype": args.engine_dtype, "episodes": args.episodes,
                  "arms": arms, "paired_vs_minirl_tis": comparisons,
                  "runs": os.path.relpath(runs, ROOT)}
        write_json(out, result)
    plot(result, out.with_suffix(".png"))
    print(json.dumps(comparisons, indent=1))


def plot(result: dict, path: Path) -> None:
    """Per step: train success (beside the float32 seeds), mismatch KL, gradient norm, entropy, clip fraction, and
    the share of IS weights truncated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (("success_rate", "train success"), ("kl_k3", "KL(mu || pi_old), k3"), ("grad_norm", "gradient norm"),
              ("entropy", "entropy"), ("clip_frac", "clip fraction"), ("correction_truncated_frac", "IS truncated"))
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5))
    reference = RESULTS / "main_job_seeds.json"
    if reference.exists():  # the float32-sampler seeds of the seed study, on the same tasks step by step
        for i, s in enumerate(json.loads(reference.read_text())["seeds"]):
            axes.flat[0].plot(range(len(s["train_success"])), s["train_success"], color="gray", lw=0.8, alpha=0.6,
                              label="float32 sampler, seeds 0-4 (HF)" if i == 0 else None)
    for ax, (key, title) in zip(axes.flat, panels):
        for a in result["arms"]:
            ys = [float("nan") if v is None else v for v in a["per_step"][key]]
            ax.plot(range(len(ys)), ys, marker="o", ms=2, label=a["arm"],
                    ls="-" if a["sync_every"] == 1 else "--")
        ax.set(title=title, xlabel="step")
        if key == "kl_k3":
            ax.set_yscale("log")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"main job, vLLM {result['engine_dtype']} sampler, float32 trainer, seed {result['seed']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
