"""The objective options in the training loop: options built once, Dr.GRPO's divisor, GiGPO, training-step records."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import agentrl.recipes.setup as setup_mod
import agentrl.training.step as step_mod
from agentrl.chat.samples import trajectory_to_samples
from agentrl.config import (
    AdvantageConfig,
    ConfigError,
    LossConfig,
    OptimConfig,
    RunConfig,
    TrainerConfig,
    apply_overrides,
)
from agentrl.models import load_model
from agentrl.objective import CollapseGuard
from agentrl.recipes.train import train
from agentrl.records import Sample, Trajectory, Turn, load_trajectories
from agentrl.training.microbatch import collate
from agentrl.training.reference import ReferencePolicy
from agentrl.training.routing_replay import DenseRouting
from agentrl.training.single import SingleProcessBackend
from agentrl.training.step import TrainingStep, as_trained, build_loss_options, kl_penalty_per_trajectory, unmasked


def _cfg(tmp_path, **overrides) -> RunConfig:
    base = {"model": "tiny-qwen3", "env.id": "math", "env.kwargs": {"mode": "multi", "max_turns": 2}, "steps": 1,
            "output": str(tmp_path / "run"), "scheduler.prompts_per_step": 2, "scheduler.group_size": 2,
            "sampling.max_new_tokens": 6, "guard.enabled": False}
    return apply_overrides(RunConfig(), base | overrides)


def test_dr_grpo_divisor_is_the_configured_response_length(tmp_path):
    cfg = _cfg(tmp_path, **{"loss.name": "dr_grpo", "context.max_new_tokens_by_turn": (6, 12)})
    assert build_loss_options(cfg.loss, 12).loss_scale_factor == 12.0  # the largest per-turn budget
    assert build_loss_options(_cfg(tmp_path, **{"loss.name": "dr_grpo"}).loss, 6).loss_scale_factor == 6.0
    explicit = _cfg(tmp_path, **{"loss.name": "dr_grpo", "loss.options": {"loss_scale_factor": 100.0}})
    assert build_loss_options(explicit.loss, 6).loss_scale_factor == 100.0
    assert build_loss_options(_cfg(tmp_path).loss, 6).loss_scale_factor is None  # MiniRL has no constant divisor


def _traj(version: int, group: int) -> Trajectory:
    turn = Turn((1,), (2,), (-0.1,), "a", "o", 1.0)
    return Trajectory("math", group, group, (turn,), "q", 1.0, True, True, False, policy_version=version)


def test_as_trained_records_the_step_and_keeps_groups_of_versions_apart():
    # An async step may train on rollouts of versions 3 and 4, both numbering their groups from 0.
    trained = as_trained([_traj(3, 0), _traj(3, 0), _traj(4, 0), _traj(4, 1)], step=5)
    assert [t.group_id for t in trained] == [0, 0, 1, 2]
    assert {t.train_step for t in trained} == {5}
    assert [t.policy_version for t in trained] == [3, 3, 4, 4]


def test_as_trained_keeps_groups_of_one_version_and_id_apart_by_task():
    # Async mode: a step that lost a group takes one of the next step's, of the same version, numbered from 0 too.
    other_task = replace(_traj(3, 0), seed=7)
    trained = as_trained([_traj(3, 0), _traj(3, 0), other_task, other_task, _traj(3, 1)], step=4)
    assert [t.group_id for t in trained] == [0, 0, 1, 1, 2]
    assert [t.seed for t in trained] == [0, 0, 7, 7, 1]


def test_stale_turns_pay_the_kl_reward_penalty_and_leave_only_the_loss(tmp_path):
    """Partial rollouts: the stale mask is the loss's; the KL reward penalty counts every generated token."""
    loss = LossConfig(kl_reward_coef=0.5, per_turn_samples=True, options={"kl_coef": 0.1})
    reference = load_model("tiny-qwen3").model.eval()
    step = TrainingStep(backend=SingleProcessBackend(load_model("tiny-qwen3"), lr=1e-3, betas=(0.9, 0.999),
                                                     weight_decay=0.0),
                        routing=DenseRouting(), loss=loss, advantage=AdvantageConfig(), optim=OptimConfig(),
                        trainer=TrainerConfig(), per_turn_budget=8, pad_id=0, shuffle=torch.Generator(), out=tmp_path,
                        reference=ReferencePolicy(reference, 0))
    first = Turn((1, 2), (3, 4), (-0.5, -3.0), "a", "o", 0.0, stale=True)  # one sample per turn: this one all stale
    second = Turn((1, 2, 3, 4, 5), (6,), (-0.2,), "b", "o", 1.0)
    stale = Trajectory("math", 0, 0, (first, second), "q", 1.0, True, True, False)
    fresh = replace(unmasked(stale), total_return=0.0)  # the group's other episode (mixed rewards)
    both = [stale, unmasked(stale)]

    layout = [s for t in both for s in trajectory_to_samples(unmasked(t), 0.0, per_turn=True)]
    penalty = kl_penalty_per_trajectory(both, step.reference_logprobs(layout), loss)
    assert float(penalty[0]) == float(penalty[1]) and float(penalty[0]) != 0.0  # as if no turn were stale

    batch = step.make_samples([stale, fresh])
    # The stale episode trains its second turn alone; the fresh one both turns.
    assert [s.input_ids for s in batch.samples] == [(1, 2, 3, 4, 5, 6), (1, 2, 3, 4), (1, 2, 3, 4, 5, 6)]
    assert [s.loss_mask for s in batch.samples] == [(0, 0, 0, 0, 0, 1), (0, 0, 1, 1), (0, 0, 0, 0, 0, 1)]
    with torch.no_grad():  # the loss's reference log-probs follow the training samples
        for i, s in enumerate(batch.samples):
            logits = reference(torch.tensor([s.input_ids])).logits[0, :-1].float()
            want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(s.input_ids[1:])[:, None])[:, 0]
            trained = torch.tensor(s.loss_mask[1:], dtype=torch.bool)
            torch.testing.assert_close(batch.ref_logp[i][trained], want[trained], atol=1e-4, rtol=1e-4)
    assert batch.metrics["kl_reward_penalty_mean"] == pytest.approx(float(penalty[0]))  # both pay the same
    # Both episodes acted from "q", then "o", with the same per-turn rewards: every step shared, none mixed.
    assert (batch.metrics["step_groups_shared_frac"], batch.metrics["step_groups_mixed_frac"]) == (1.0, 0.0)


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
    {"advantage.name": "gigpo", "advantage.gamma": 0.9},
])  # fmt: skip
def test_runs_train_with_the_new_options(tmp_path, overrides):
    out = train(_cfg(tmp_path, **overrides), progress=False)
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert row["step"] == 0 and row["loss"] is not None
    assert {t.train_step for t in load_trajectories(out / "trajectories.jsonl")} == {0}


def test_reference_kl_in_loss_and_reward_and_entropy_bonus_in_the_loop(tmp_path):
    out = train(_cfg(tmp_path, **{"loss.options": {"kl_coef": 0.1, "kl_estimator": "k3", "entropy_coef": 0.01},
                                  "loss.kl_reward_coef": 0.05}), progress=False)
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    # The frozen copy, parameters and buffers, in the dtype the trainer computes in (bf16 where native).
    compute = getattr(torch, json.loads((out / "plan.json").read_text())["trainer"]["compute_dtype"])
    reference = load_model("tiny-qwen3", dtype=compute).model
    assert row["ref_model_bytes"] == sum(t.numel() * t.element_size()
                                         for t in (*reference.parameters(), *reference.buffers()))
    assert row["ref_kl"] == pytest.approx(0.0, abs=1e-6)  # one on-policy update: pi_theta = pi_ref
    assert abs(row["kl_reward_penalty_mean"]) < 1e-3  # 0.05 * sum_t k1(mu, pi_ref): the engine samples pi_ref itself
    assert row["policy_entropy"] == pytest.approx(row["entropy"], rel=1e-4)  # the bonus's entropy is pi_old's


def test_no_reference_unless_asked_and_bypass_mode(tmp_path):
    out = train(_cfg(tmp_path, **{"loss.bypass": True}), progress=False)
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert "ref_model_bytes" not in row and "ref_kl" not in row
    assert row["kl_k3"] == 0.0 and row["is_weight_mean"] == 1.0  # pi_old = mu: no ratio, no mismatch to measure
    assert row["entropy"] > 0  # from the update pass: no pi_old pass ran


def test_the_update_pass_stands_for_pi_old_with_one_minibatch(tmp_path, monkeypatch):
    """``old_policy_pass: auto`` skips the recompute pass and trains exactly as ``on`` does: same metrics, weights."""
    from safetensors.torch import load_file

    from agentrl.training.single import SingleProcessBackend

    scored = []
    real_score = SingleProcessBackend.score
    monkeypatch.setattr(SingleProcessBackend, "score", lambda self, requests: scored.append(len(requests))
                        or real_score(self, requests))
    rows, weights = {}, {}
    for mode in ("auto", "on"):
        scored.clear()
        from test_train import tiny_config  # its parity env gives varied rewards: a real gradient

        # No per-token record: its own small scoring pass (token_values.jsonl) would count as a pi_old pass here.
        cfg = tiny_config(tmp_path / mode, steps=1, **{"loss.old_policy_pass": mode, "optim.lr": 1e-2,
                                                       "token_values_per_step": 0})
        out = train(cfg, progress=False)
        assert bool(scored) == (mode == "on")  # auto: no pi_old pass ran
        rows[mode] = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
        weights[mode] = load_file(out / "checkpoint" / "model.safetensors")
    assert rows["auto"]["reward_mean"] == rows["on"]["reward_mean"]  # the same rollout
    for key in ("loss", "kl_k3", "is_weight_mean", "entropy", "grad_norm", "ratio_max"):
        assert rows["auto"][key] == pytest.approx(rows["on"][key], rel=1e-5, abs=1e-7), key
    init = load_model("tiny-qwen3").model.state_dict()
    assert any(not torch.equal(weights["on"][k], init[k]) for k in weights["on"])  # lr 1e-2 moved them
    for name, w in weights["on"].items():
        torch.testing.assert_close(weights["auto"][name], w, rtol=0, atol=1e-6, msg=name)


def test_samples_without_advantage_skip_their_passes_and_the_update_is_unchanged(tmp_path, monkeypatch):
    from safetensors.torch import load_file
    from test_train import tiny_config  # the parity env: some groups score alike (advantage 0), others do not

    rows, weights = {}, {}
    for mode in ("skip", "all"):
        if mode == "all":
            monkeypatch.setattr(step_mod, "gradient_members", lambda samples, members: members)
        cfg = tiny_config(tmp_path / mode, steps=2, **{"optim.lr": 1e-2, "scheduler.group_size": 2,
                                                       "scheduler.prompts_per_step": 6, "trainer.micro_batch_size": 1})
        out = train(cfg, progress=False)
        rows[mode] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        weights[mode] = load_file(out / "checkpoint" / "model.safetensors")
    skipped = [r["samples_without_gradient"] for r in rows["skip"]]
    assert any(skipped) and all(n < r["samples"] for n, r in zip(skipped, rows["skip"]))
    assert [r["samples_without_gradient"] for r in rows["all"]] == [0, 0]
    # One sample per micro-batch: the update ran exactly the samples that carry gradient.
    assert all(r["update_micro_batches"] == r["samples"] - r["samples_without_gradient"] for r in rows["skip"])
    for a, b in zip(rows["skip"], rows["all"]):
        assert a["reward_mean"] == b["reward_mean"] and a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    for name, w in weights["all"].items():  # the sum over micro-batches only regroups: float noise
        torch.testing.assert_close(weights["skip"][name], w, rtol=0, atol=1e-6, msg=name)


def test_a_batch_without_any_advantage_keeps_one_sample_for_the_optimizer_step():
    from agentrl.training.step import carries_gradient, gradient_members

    def sample(n: int, advantage: float, token_advantages=None) -> Sample:
        return Sample((1,) * n, (0,) + (1,) * (n - 1), (0.0,) * n, advantage, 0, token_advantages=token_advantages)

    flat = [sample(5, 0.0), sample(3, 0.0), sample(4, 0.0)]
    assert gradient_members(flat, [0, 1, 2]) == [1]  # the shortest: AdamW still steps on zero gradients
    mixed = [sample(5, 0.0), sample(3, 0.5), sample(4, 0.0, token_advantages=(9.0, 0, 0, 0))]
    assert not carries_gradient(mixed[2])  # its only nonzero advantage sits on a prompt token
    assert gradient_members(mixed, [0, 1, 2]) == [1]


def test_the_recompute_pass_runs_where_the_update_pass_is_not_pi_old(tmp_path):
    from agentrl.config import LossConfig, OptimConfig
    from agentrl.training.routing_replay import DenseRouting, LiveRouting, R2Routing, R3Routing
    from agentrl.training.step import bypass_old_policy, choose_old_policy, score_old_policy, update_is_old_policy

    one, two = OptimConfig(), OptimConfig(n_minibatches=2)
    assert choose_old_policy(LossConfig(), one, DenseRouting()) is update_is_old_policy
    assert choose_old_policy(LossConfig(), one, R3Routing()) is update_is_old_policy  # engine routes in both passes
    assert choose_old_policy(LossConfig(), two, DenseRouting()) is score_old_policy  # later steps move
    assert choose_old_policy(LossConfig(), one, LiveRouting()) is score_old_policy  # measures router agreement on it
    assert choose_old_policy(LossConfig(routing_replay="r2"), one, R2Routing()) is score_old_policy  # replays routes
    assert choose_old_policy(LossConfig(old_policy_pass="on"), one, DenseRouting()) is score_old_policy
    assert choose_old_policy(LossConfig(bypass=True), one, DenseRouting()) is bypass_old_policy
    with pytest.raises(ConfigError, match="loss.old_policy_pass must be auto or on"):
        LossConfig(old_policy_pass="off")


def test_bypass_with_r2_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="loss.bypass must be false with routing_replay r2"):
        _cfg(tmp_path, **{"loss.bypass": True, "loss.routing_replay": "r2"})


def test_collapse_at_a_save_step_rolls_back_weights_and_optimizer_to_the_last_good_step(tmp_path, monkeypatch):
    # save_every 2: step 1 is saved (healthy). Step 3 is a save step too, and the injected collapse hits it: it must
    # not be saved, and the rollback must restore step 1's weights and AdamW moments together.
    saved: dict[int, tuple[dict, dict]] = {}
    restored: list[tuple[int, dict, dict]] = []
    real_save, real_restore, real_update = setup_mod.Run.save, setup_mod.restore_checkpoint, CollapseGuard.update

    def snapshot(backend) -> tuple[dict, dict]:  # the single-process backend's live module and AdamW
        return copy.deepcopy(backend.model.state_dict()), copy.deepcopy(backend.optimizer.state_dict())

    def save(self, step):
        saved[step] = snapshot(self.backend)
        return real_save(self, step)

    def restore(out, backend):
        step = real_restore(out, backend)
        restored.append((step, *snapshot(backend)))
        return step

    def update(self, metrics, step=None):
        return real_update(self, metrics | ({"entropy": 0.0} if step == 3 else {}), step=step)

    monkeypatch.setattr(setup_mod.Run, "save", save)
    monkeypatch.setattr(setup_mod, "restore_checkpoint", restore)
    monkeypatch.setattr(CollapseGuard, "update", update)
    cfg = _cfg(tmp_path, steps=4, save_every=2, **{
        "env.kwargs": {}, "optim.lr": 1e-2, "guard.enabled": True, "guard.action": "rollback", "guard.patience": 1,
        "guard.entropy_min": 1e-6, "guard.k3_max": 1e9})
    train(cfg, progress=False)
    assert sorted(saved) == [1]  # step 3 was due but unhealthy
    (step, weights, optim), = restored
    assert step == 1
    good_weights, good_optim = saved[1]
    assert all(torch.equal(weights[k], good_weights[k]) for k in good_weights)
    assert optim["state"].keys() == good_optim["state"].keys()
    for k, state in good_optim["state"].items():
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(optim["state"][k][name], state[name]), (k, name)
    ckpt_state = json.loads((tmp_path / "run" / "checkpoint" / "trainer_state.json").read_text())
    assert ckpt_state["step"] == 1


def _episode(group: int, reward: float, reply: int, finish: str) -> Trajectory:
    turn = Turn((1,), tuple(range(reply)), tuple([-0.1] * reply), "a", "o", reward, finish_reason=finish)
    return Trajectory("math", group, group, (turn,), "q", reward, reward > 0, True, False)


def test_overlong_filter_penalty_and_dynamic_sampling():
    from agentrl.config import LossConfig, OverlongConfig
    from agentrl.training.step import overlong_and_dynamic_sampling

    eps = [_episode(0, 1.0, 8, "length"), _episode(0, 0.0, 3, "stop"),  # group 0: one reply cut at the budget
           _episode(1, 1.0, 2, "stop"), _episode(1, 1.0, 4, "stop")]  # group 1: all rewards equal
    extra = {}
    trajs, keep = overlong_and_dynamic_sampling(eps, LossConfig(overlong=OverlongConfig(mode="filter")), 8, extra)
    assert keep == [False, True, True, True] and [t.total_return for t in trajs] == [1.0, 0.0, 1.0, 1.0]
    assert extra["overlong_frac"] == 0.25
    # penalize: budget 8, cache 4 -> lengths past 4 pay (len - 4) / 4: 8 -> -1.0, 4 -> 0, 3 and 2 -> 0
    trajs, keep = overlong_and_dynamic_sampling(
        eps, LossConfig(overlong=OverlongConfig(mode="penalize", cache_length=4)), 8, {})
    assert keep == [True] * 4 and [t.total_return for t in trajs] == [0.0, 0.0, 1.0, 1.0]
    extra = {}
    trajs, keep = overlong_and_dynamic_sampling(eps, LossConfig(dynamic_sampling=True), 8, extra)
    assert keep == [True, True, False, False] and extra["uninformative_frac"] == 0.5
    from agentrl.config import RunConfig, apply_overrides

    # One definition of the section: the config's, which `apply_overlong` reads (no copy in the objective).
    package = Path(__file__).resolve().parents[1] / "agentrl"
    defined = [p.name for p in package.rglob("*.py") if "class OverlongConfig" in p.read_text()]
    assert defined == ["config.py"]
    with pytest.raises(ConfigError, match="loss.overlong: unknown overlong mode 'cut'"):
        apply_overrides(RunConfig(), {"loss.overlong.mode": "cut"})
