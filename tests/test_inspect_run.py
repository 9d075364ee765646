"""`agentrl inspect`: per-step rollout distributions from a run folder (synthetic trajectories, hand-checked)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from agentrl.recipes.inspect_run import InspectError, inspect_run, ks_statistic, read_episode_stats, summarize_steps
from agentrl.records import Trajectory, Turn, save_trajectories


def traj(step, group, reward, tokens, finish="stop"):
    turn = Turn(prompt_ids=(1, 2), generated_ids=tuple(range(tokens)), rollout_logprobs=(-0.5,) * tokens,
                action="a", observation="o", reward=reward, finish_reason=finish)
    return Trajectory(env_id="math", seed=group, group_id=group, turns=(turn,), first_observation="q",
                      total_return=reward, success=reward == 1.0, terminated=True, truncated=False,
                      policy_version=step)


@pytest.fixture
def run_dir(tmp_path):
    # step 0: both groups flat (all 0); step 1: group 0 mixed, group 1 flat; step 2: all solved, longer replies.
    steps = {0: [(0, 0.0, 4), (0, 0.0, 4), (1, 0.0, 4), (1, 0.0, 4)],
             1: [(0, 1.0, 4), (0, 0.0, 4), (1, 0.0, 4), (1, 0.0, 4)],
             2: [(0, 1.0, 8, "length"), (0, 1.0, 8), (1, 1.0, 8), (1, 1.0, 8)]}
    for step, eps in steps.items():
        save_trajectories([traj(step, *e) for e in eps], tmp_path / "trajectories.jsonl")
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps({"step": s, "entropy": 1.0 - 0.1 * s, "kl_k3": 1e-4})
                                                      for s in steps) + "\n")
    return tmp_path


def test_ks_statistic_hand_values():
    assert ks_statistic([0, 0, 1, 1], [1, 1, 1, 1]) == 0.5
    assert ks_statistic([1, 2, 3], [1, 2, 3]) == 0.0
    assert ks_statistic([0, 0], [5, 5]) == 1.0


def test_per_step_summary_matches_hand_counts(run_dir):
    rows = inspect_run(run_dir, plot=run_dir / "shift.png")
    assert [r.step for r in rows] == [0, 1, 2]
    r0, r1, r2 = rows
    assert (r0.success_rate, r1.success_rate, r2.success_rate) == (0.0, 0.25, 1.0)
    assert (r0.zero_signal_groups, r1.zero_signal_groups, r2.zero_signal_groups) == (1.0, 0.5, 1.0)
    assert math.isnan(r0.reward_shift) and r1.reward_shift == 0.25 and r2.reward_shift == 0.75
    assert r1.tokens_shift == 0.0 and r2.tokens_shift == 1.0
    assert r2.length_cut_frac == 0.25 and r2.tokens_mean == 8 and r0.neg_logprob == pytest.approx(0.5)
    assert r2.entropy == pytest.approx(0.8) and r0.kl_k3 == 1e-4
    assert (run_dir / "shift.png").stat().st_size > 10_000


def test_every_keeps_the_last_step(run_dir):
    episodes = list(read_episode_stats(run_dir / "trajectories.jsonl"))
    assert [r.step for r in summarize_steps(episodes, every=2)] == [0, 2]
    assert [r.step for r in summarize_steps(episodes, every=5)] == [0, 2]


def test_bad_folders_and_lines_are_named(tmp_path, run_dir):
    with pytest.raises(InspectError, match="trajectories.jsonl not found"):
        inspect_run(tmp_path / "missing")
    with open(run_dir / "trajectories.jsonl", "a") as f:
        f.write('{"not": "a trajectory"}\n')
    with pytest.raises(InspectError, match=r"trajectories.jsonl:13: not a saved trajectory"):
        inspect_run(run_dir)


def test_cli_inspect(run_dir):
    from typer.testing import CliRunner

    from agentrl.cli.main import app

    out = CliRunner().invoke(app, ["inspect", str(run_dir)])
    assert out.exit_code == 0, out.output
    assert "flat grp" in out.stdout
    missing = CliRunner().invoke(app, ["inspect", str(run_dir / "nope")])
    assert missing.exit_code == 2 and "not found" in missing.stderr


def test_steps_come_from_the_training_step_not_the_policy_version(tmp_path):
    # sync_every = 2: steps 0 and 1 train on rollouts of version 0, steps 2 and 3 on version 2. Each step has its own
    # metrics row (entropy 0.9, 0.8, 0.7, 0.6); the rows must not merge, and each joins its own metrics.
    for step in range(4):
        version = step - step % 2
        reward = float(step % 2)
        eps = [replace(traj(version, g, reward if i else 0.0, 4), train_step=step) for g in (0, 1) for i in (0, 1)]
        save_trajectories(eps, tmp_path / "trajectories.jsonl")
    rows = summarize_steps(list(read_episode_stats(tmp_path / "trajectories.jsonl")),
                           {s: {"entropy": 0.9 - 0.1 * s} for s in range(4)})
    assert [r.step for r in rows] == [0, 1, 2, 3]
    assert [r.episodes for r in rows] == [4, 4, 4, 4]
    assert [r.entropy for r in rows] == pytest.approx([0.9, 0.8, 0.7, 0.6])
    assert [r.zero_signal_groups for r in rows] == [1.0, 0.0, 1.0, 0.0]


def test_async_step_keeps_groups_of_different_versions_apart(tmp_path):
    # One training step on two rollouts (versions 3 and 4) whose group ids both start at 0: four groups, not two.
    eps = [replace(traj(v, 0, r, 4), train_step=4) for v, r in ((3, 0.0), (3, 0.0), (4, 1.0), (4, 1.0))]
    rows = summarize_steps(_stats(tmp_path, eps))
    assert rows[0].zero_signal_groups == 1.0  # both groups flat; merged they would look mixed (0.0)


def _stats(tmp_path, trajectories):
    save_trajectories(trajectories, tmp_path / "t.jsonl", append=False)
    return list(read_episode_stats(tmp_path / "t.jsonl"))
