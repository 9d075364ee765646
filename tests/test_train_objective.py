"""The objective options in the training loop: options built once, Dr.GRPO's divisor, GiGPO, training-step records."""

from __future__ import annotations

import json

import pytest
import torch

from agentrl.config import RunConfig, apply_overrides
from agentrl.records import Sample, Trajectory, Turn, load_trajectories
from agentrl.train import as_trained, build_loss_options, train
from agentrl.training.microbatch import collate


def _cfg(tmp_path, **overrides) -> RunConfig:
    base = {"model": "tiny-qwen3", "env.id": "math", "env.kwargs": {"mode": "multi", "max_turns": 2}, "steps": 1,
            "output": str(tmp_path / "run"), "rollout.prompts_per_step": 2, "rollout.group_size": 2,
            "rollout.max_new_tokens": 6, "guard.enabled": False}
    return apply_overrides(RunConfig(), base | overrides)


def test_dr_grpo_divisor_is_the_configured_response_length(tmp_path):
    cfg = _cfg(tmp_path, **{"loss.name": "dr_grpo", "context.max_new_tokens_by_turn": (6, 12)})
    assert build_loss_options(cfg).loss_scale_factor == 12.0  # the largest per-turn budget
    assert build_loss_options(_cfg(tmp_path, **{"loss.name": "dr_grpo"})).loss_scale_factor == 6.0
    explicit = _cfg(tmp_path, **{"loss.name": "dr_grpo", "loss.options": {"loss_scale_factor": 100.0}})
    assert build_loss_options(explicit).loss_scale_factor == 100.0
    assert build_loss_options(_cfg(tmp_path)).loss_scale_factor is None  # MiniRL has no constant divisor


def _traj(version: int, group: int) -> Trajectory:
    turn = Turn((1,), (2,), (-0.1,), "a", "o", 1.0)
    return Trajectory("math", group, group, (turn,), "q", 1.0, True, True, False, policy_version=version)


def test_as_trained_records_the_step_and_keeps_groups_of_versions_apart():
    # An async step may train on rollouts of versions 3 and 4, both numbering their groups from 0.
    trained = as_trained([_traj(3, 0), _traj(3, 0), _traj(4, 0), _traj(4, 1)], step=5)
    assert [t.group_id for t in trained] == [0, 0, 1, 2]
    assert {t.train_step for t in trained} == {5}
    assert [t.policy_version for t in trained] == [3, 3, 4, 4]


def test_collate_spreads_per_turn_advantages_over_tokens():
    plain = Sample((1, 2, 3), (0, 1, 1), (0.0, -0.1, -0.2), 0.5, 0)
    per_turn = Sample((1, 2, 3, 4), (0, 1, 0, 1), (0.0, -0.1, 0.0, -0.3), 0.7, 0,
                      token_advantages=(0.0, 0.7, 0.0, -0.2))
    mb = collate([plain, per_turn], pad_id=0)
    # Position t predicts token t + 1: the advantages shift by one like the mask.
    torch.testing.assert_close(mb.advantages, torch.tensor([[0.5, 0.5, 0.0], [0.7, 0.0, -0.2]]))  # 0 on padding
    assert collate([plain], pad_id=0).advantages.tolist() == [0.5]


@pytest.mark.parametrize("overrides", [
    {"loss.name": "dr_grpo"},
    {"loss.advantage": "gigpo", "loss.advantage_options": {"gamma": 0.9}},
])  # fmt: skip
def test_runs_train_with_the_new_options(tmp_path, overrides):
    out = train(_cfg(tmp_path, **overrides), progress=False)
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert row["step"] == 0 and row["loss"] is not None
    assert {t.train_step for t in load_trajectories(out / "trajectories.jsonl")} == {0}
