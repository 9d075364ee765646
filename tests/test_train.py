"""The training loop in-process, on a toy env where a random tiny model gets varied rewards."""

from __future__ import annotations

import json

import pytest
import torch

import agentrl
from agentrl.config import ConfigError, RunConfig, apply_overrides, load_config
from agentrl.recipes.train import TrainingError, train


class ParityEnv(agentrl.TextEnv):
    """Reward 1 when the reply has an even number of characters (a random model gets it half the time)."""

    system_prompt = "Reply with anything."

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return f"Task {seed}: say something.", {"task_type": "parity"}

    def step(self, action):
        ok = len(action) % 2 == 0
        return "done", float(ok), True, False, {"success": ok}

    def expert_action(self):
        return "ab"


agentrl.register("parity-test", entry_point=ParityEnv)


def tiny_config(tmp_path, **overrides) -> RunConfig:
    base = {
        "model": "tiny-qwen3", "env.id": "parity-test", "env.kwargs": {}, "steps": 2, "output": str(tmp_path / "run"),
        "scheduler.prompts_per_step": 2, "scheduler.group_size": 4, "sampling.max_new_tokens": 6,
        "optim.lr": 1e-3, "guard.enabled": False,
    }
    return apply_overrides(RunConfig(), base | overrides)


def test_training_moves_weights_and_logs_metrics(tmp_path):
    cfg = tiny_config(tmp_path)
    out = train(cfg, progress=False)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    assert any(r["grad_norm"] > 0 for r in rows), "varied rewards must give a nonzero gradient"
    # On-policy with the same model for rollout and training: mu == pi_old up to float noise.
    assert all(abs(r["kl_k3"]) < 1e-4 and abs(r["is_weight_mean"] - 1) < 1e-3 for r in rows)
    from safetensors.torch import load_file

    from agentrl.models import load_model

    init = load_model("tiny-qwen3").model.state_dict()
    trained = load_file(out / "checkpoint" / "model.safetensors")
    assert any(not torch.equal(init[k], trained[k]) for k in trained if k in init)


class ExpertOnlyEnv(ParityEnv):
    """Only the expert's exact reply scores (it keeps the env contract, checked over every registered env); a tiny
    random model never writes it, so every group is uniform and dynamic sampling leaves every episode out."""

    def step(self, action):
        ok = action == self.expert_action()
        return "done", float(ok), True, False, {"success": ok}

    def expert_action(self):
        return "the expert's exact reply"


agentrl.register("expert-only-test", entry_point=ExpertOnlyEnv)


def test_a_step_without_update_still_logs_its_rollout(tmp_path):
    # Found in the phone GUI RL run: steps where every group failed alike wrote no metrics row, so the success curve
    # (and learn_multiturn's figures) left out exactly the worst steps.
    cfg = tiny_config(tmp_path, **{"env.id": "expert-only-test", "loss.dynamic_sampling": True, "steps": 3})
    out = train(cfg, progress=False)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        assert r["update_skipped"] == 1.0 and r["samples"] == 0 and r["uninformative_frac"] == 1.0
        assert r["success_rate"] == 0.0 and r["turns_mean"] == 1.0 and r["rollout_seconds"] > 0
        assert "entropy" not in r and "grad_norm" not in r  # nothing trained: a gap in the curves, not a zero
    # The run still ends with its checkpoint (it said so and held none: an eval of RUN/checkpoint failed), the
    # initial weights at the last step.
    from safetensors.torch import load_file

    from agentrl.models import load_model

    assert json.loads((out / "checkpoint" / "trainer_state.json").read_text())["step"] == 2
    init = load_model("tiny-qwen3").model.state_dict()
    saved = load_file(out / "checkpoint" / "model.safetensors")
    assert all(torch.equal(init[k], saved[k]) for k in saved if k in init)
    trained = [json.loads(line) for line in (train(tiny_config(tmp_path / "b"), progress=False) / "metrics.jsonl")
               .read_text().splitlines()]  # fmt: skip
    assert all(r["update_skipped"] == 0.0 for r in trained)


def test_async_steps_without_update_do_not_stall_the_producer(tmp_path):
    # Found in review: async mode advanced the trainer's version only after an update, so two steps in a row
    # without one (every group left out) left the producer waiting on the staleness bound and the trainer on it.
    cfg = tiny_config(tmp_path, **{"env.id": "expert-only-test", "loss.dynamic_sampling": True, "steps": 4,
                                   "scheduler.async_rollout": True})
    out = train(cfg, progress=False)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and all(r["update_skipped"] == 1.0 for r in rows)


class OddTasksAlikeEnv(ParityEnv):
    """Odd task seeds pay every reply alike (their groups have no variance); even ones pay by the reply's length
    modulo 5 (five levels: a group of 4 replies of random lengths is almost never alike)."""

    def reset(self, *, seed=None, options=None):
        self._odd = seed is not None and seed % 2 == 1
        return super().reset(seed=seed, options=options)

    def step(self, action):
        reward = 1.0 if self._odd else (len(action) % 5) / 4
        return "done", reward, True, False, {"success": reward == 1.0}

    def expert_action(self):
        return "abcd"  # 4 characters: reward 1 on every task (the env contract, checked over every registered env)


agentrl.register("odd-tasks-alike-test", entry_point=OddTasksAlikeEnv)


def test_fewer_groups_than_minibatches_train_in_fewer_minibatches(tmp_path, caplog):
    # A pilot crashed mid-run with "4 groups cannot fill 8 mini-batches" (a traceback): the start now refuses such a
    # setting, and when groups are dropped (dynamic sampling, failures) the step trains the groups it has.
    with pytest.raises(ConfigError, match=r"optim.n_minibatches.*<= scheduler.prompts_per_step \(2\)"):
        tiny_config(tmp_path / "bad", **{"optim.n_minibatches": 3})
    cfg = tiny_config(tmp_path, **{"env.id": "odd-tasks-alike-test", "loss.dynamic_sampling": True,
                                   "optim.n_minibatches": 2, "steps": 1})
    with caplog.at_level("WARNING", logger="agentrl.training.step"):
        out = train(cfg, progress=False)
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["samples"] == 4 and row["grad_norm"] > 0  # the even task's group of 4, in one mini-batch
    assert "1 groups left for 2 mini-batches; this step trains 1" in caplog.text


def test_non_finite_loss_stops_and_saves_the_batch(tmp_path, monkeypatch):
    import agentrl.training.step as train_module

    real = train_module.policy_loss

    def nan_loss(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        return loss * float("nan"), metrics

    monkeypatch.setattr(train_module, "policy_loss", nan_loss)
    with pytest.raises(TrainingError, match="non-finite loss") as err:
        train(tiny_config(tmp_path, steps=1), progress=False)
    saved = list((tmp_path / "run").glob("bad_batch_step0.pt"))
    assert saved and str(saved[0]) in str(err.value)
    batch = torch.load(saved[0], weights_only=False)
    assert batch["samples"] and "logp" in batch


def test_collapse_guard_stops_with_a_reason(tmp_path):
    cfg = tiny_config(tmp_path, **{"guard.enabled": True, "guard.entropy_min": 1e9, "guard.patience": 2, "steps": 4})
    with pytest.raises(TrainingError, match="collapse guard stopped the run at step 1"):
        train(cfg, progress=False)


def test_config_files_and_errors(tmp_path):
    from conftest import ROOT

    from agentrl.recipes.sft import load_sft_config

    for path in (ROOT / "configs").glob("*.yaml"):  # every shipped config is valid (SFT recipes have their own)
        (load_sft_config if path.stem.endswith("-sft") else load_config)(path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("loss:\n  nmae: grpo\n")
    with pytest.raises(ConfigError, match="unknown config key loss.'nmae'"):
        load_config(bad)
    bad.write_text("steps: many\n")
    with pytest.raises(ConfigError, match="steps: expected int"):
        load_config(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize("mode", ["none", "r2", "r3"])
def test_moe_routing_replay_modes_train(tmp_path, mode):
    cfg = tiny_config(tmp_path, model="tiny-qwen3-moe", steps=1, **{"loss.routing_replay": mode,
                                                                     "optim.n_minibatches": 2})
    out = train(cfg, progress=False)
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["grad_norm"] > 0
    if mode == "r3":
        # pi_old is computed with the rollout's experts: train and inference agree up to float noise.
        assert abs(row["kl_k3"]) < 1e-4
        assert row["router_agreement"] is None
    else:
        assert 0.9 <= row["router_agreement"] <= 1.0  # same weights, same experts, up to near-ties
    # The update passes' live router against the experts they replay (r3: the rollout's, r2: pi_old's). The first
    # mini-batch runs on the weights those experts were chosen with (all agree, up to near-ties); the second one AdamW
    # step later, which on this random-init router moves about a third of the pairs (0.84 over the step, seen here).
    if mode == "none":
        assert row["router_agreement_live_vs_replayed"] is None
    else:
        assert 0.5 <= row["router_agreement_live_vs_replayed"] <= 1.0
    trajs = (out / "trajectories.jsonl").read_text()
    assert '"routed_experts": {"shape"' in trajs and '"dtype": "uint8"' in trajs


def test_routing_replay_on_a_dense_model_is_a_clear_error(tmp_path):
    with pytest.raises(TrainingError, match="needs an MoE model"):
        train(tiny_config(tmp_path, **{"loss.routing_replay": "r3"}), progress=False)


def test_smollm2_checkpoint_saves_and_reloads(tmp_path):
    # SmolLM2 comes from a GGUF file: its dequantized weights must save as a normal checkpoint and load back.
    from agentrl.models import load_model
    from agentrl.training.checkpoint import TrainerState, save_checkpoint
    from agentrl.training.single import SingleProcessBackend

    policy = load_model("smollm2-135m")
    backend = SingleProcessBackend(policy, lr=1e-5, betas=(0.9, 0.999), weight_decay=0.0)
    ckpt = save_checkpoint(tmp_path, backend, policy, TrainerState(step=0))
    again = load_model(str(ckpt))
    assert again.family == "chatml"
    a, b = policy.model.state_dict(), again.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    text = again.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                               add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
