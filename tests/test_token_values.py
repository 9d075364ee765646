"""token_values.jsonl: the per-token record `agentrl view` colours tokens by, from tiny real runs and hand values."""

from __future__ import annotations

import json
import math

import pytest
import torch

import agentrl
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
from agentrl.objective import policy_loss
from agentrl.recipes.train import train
from agentrl.records import Sample, Trajectory, load_trajectories
from agentrl.training.logprobs import token_logprobs
from agentrl.training.microbatch import collate
from agentrl.training.routing_replay import DenseRouting
from agentrl.training.single import SingleProcessBackend
from agentrl.training.step import OldPolicy, StepSamples, TrainingStep
from agentrl.training.token_values import TOKEN_VALUES, choose_samples, token_values

ARRAYS = ("loss_mask", "sampler_logprob", "trainer_logprob", "is_weight", "is_masked", "advantage", "entropy")
PER_STEP = 3


class TwoTurnParityEnv(agentrl.TextEnv):
    """Two turns; reward 1 when the second reply has an even number of characters (a random model: half the time)."""

    system_prompt = "Reply with anything."

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.turn = 0
        return f"Task {seed}: say something.", {"task_type": "parity"}

    def step(self, action):
        self.turn += 1
        if self.turn == 1:
            return "Once more.", 0.0, False, False, {}
        ok = len(action) % 2 == 0
        return "done", float(ok), True, False, {"success": ok}

    def expert_action(self):
        return "ab"


agentrl.register("two-turn-parity-test", entry_point=TwoTurnParityEnv)


def _config(tmp_path, **overrides) -> RunConfig:
    base = {
        "model": "tiny-qwen3", "env.id": "two-turn-parity-test", "env.kwargs": {}, "steps": 2,
        "output": str(tmp_path / "run"), "scheduler.prompts_per_step": 2, "scheduler.group_size": 4,
        "sampling.max_new_tokens": 6, "optim.lr": 1e-3, "guard.enabled": False, "loss.per_turn_samples": True,
        "token_values_per_step": PER_STEP,
        # rho = 1 to 1e-3 below needs the sampler and the trainer to round alike: float32 (in bfloat16 the HF
        # engine's token-by-token decode and the trainer's one pass differ by bf16 rounding, ~1e-2 in log-prob).
        "trainer.compute_dtype": "float32",
    }
    return apply_overrides(RunConfig(), base | overrides)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A two-step run: 8 two-turn episodes a step, each trained as one sample per turn (16 samples a step)."""
    return train(_config(tmp_path_factory.mktemp("tv")), progress=False)


def _lines(run) -> list[dict]:
    return [json.loads(line) for line in (run / TOKEN_VALUES).read_text().splitlines()]


def _trained_sample(run, line: dict) -> Sample:
    """The sample a line records, rebuilt from trajectories.jsonl through the keys the viewer joins on."""
    group = [t for t in load_trajectories(run / "trajectories.jsonl")
             if t.train_step == line["step"] and t.group_id == line["group_id"]]
    return trajectory_to_samples(group[line["episode"]], 0.0, per_turn=True)[line["sample"]]


def _close(recorded: float, exact: float) -> bool:
    """Equal up to the file's 4 significant digits (and float32 noise)."""
    return math.isclose(recorded, exact, rel_tol=6e-4, abs_tol=1e-6)


def test_each_step_records_the_configured_samples_aligned_with_their_tokens(run):
    lines = _lines(run)
    assert [line["step"] for line in lines] == [0] * PER_STEP + [1] * PER_STEP
    assert {line["sample"] for line in lines} <= {0, 1} and len({(line["step"], line["group_id"], line["episode"],
                                                                line["sample"]) for line in lines}) == len(lines)
    for line in lines:
        n = len(line["token_ids"])
        assert all(len(line[k]) == n for k in ARRAYS), {k: len(line[k]) for k in ARRAYS}
        on = [m == 1 for m in line["loss_mask"]]
        for key in ("sampler_logprob", "trainer_logprob", "is_weight", "advantage", "entropy"):
            assert [v is not None for v in line[key]] == on, key  # a value exactly on the loss tokens
        # On-policy with the same weights for rollout and training: rho = 1, nothing truncated.
        assert not any(line["is_masked"]) and all(abs(w - 1) < 1e-3 for w in line["is_weight"] if w is not None)
        assert line["correction"] == "tis" and line["policy_version"] == line["step"]


def test_the_record_joins_its_episode_and_matches_what_was_trained(run):
    lines = _lines(run)
    metrics = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics] == [0, 1]
    for line in lines:
        sample = _trained_sample(run, line)
        assert line["token_ids"] == list(sample.input_ids)
        assert line["loss_mask"] == list(sample.loss_mask)
        for recorded, mu, m in zip(line["sampler_logprob"], sample.rollout_logprobs, sample.loss_mask):
            assert m == 0 or _close(recorded, mu)
    # Samples that carry a gradient come first: the record shows advantages the update used, not only zeros.
    assert any(a not in (None, 0.0) for line in lines for a in line["advantage"])


def test_trainer_logprobs_and_entropy_equal_a_recomputation_with_the_initial_weights(run):
    policy = load_model("tiny-qwen3")  # step 0's pi_old: the seeded random init the run started from
    step0 = [line for line in _lines(run) if line["step"] == 0]
    samples = [_trained_sample(run, line) for line in step0]
    with torch.no_grad():
        logp, entropy = token_logprobs(policy.model, collate(samples, policy.tokenizer.pad_token_id),
                                       with_entropy=True)
    _check_trainer_values(step0, logp, entropy)


def _check_trainer_values(lines: list[dict], logp: torch.Tensor, entropy: torch.Tensor) -> None:
    for row, line in enumerate(lines):
        for t, m in enumerate(line["loss_mask"][1:]):  # position t scores token t + 1
            if m:
                assert _close(line["trainer_logprob"][t + 1], float(logp[row, t]))
                assert _close(line["entropy"][t + 1], float(entropy[row, t]))


@pytest.mark.slow
def test_two_fsdp_trainer_workers_write_the_same_record(tmp_path):
    # The pass runs through `TrainingBackend.score`, so the workers' shards score the chosen samples; the rollout is
    # the one-process run's (same seed, same initial weights), so the lines must match it.
    single = train(_config(tmp_path / "single", steps=1), progress=False)
    sharded = train(_config(tmp_path / "fsdp", steps=1, **{"trainer.workers": 2, "trainer.memory_limit_gb": 4}),
                    progress=False)
    a, b = _lines(single), _lines(sharded)
    assert len(a) == len(b) == PER_STEP
    for x, y in zip(a, b):
        assert {k: x[k] for k in ("group_id", "episode", "sample", "token_ids", "loss_mask", "sampler_logprob",
                                  "is_masked", "advantage")} == {
            k: y[k] for k in ("group_id", "episode", "sample", "token_ids", "loss_mask", "sampler_logprob",
                              "is_masked", "advantage")}
        for key in ("trainer_logprob", "entropy", "is_weight"):
            assert all(u is v is None or _close(u, v) for u, v in zip(x[key], y[key])), key


def test_file_size_is_bounded_by_the_setting(run):
    text = (run / TOKEN_VALUES).read_text()
    tokens = sum(len(line["token_ids"]) for line in _lines(run))
    assert len(text.encode()) / tokens < 60  # bytes a token: 25 short samples here; see README for real shapes


def test_zero_writes_nothing_and_a_negative_count_is_a_config_error(tmp_path):
    cfg = apply_overrides(RunConfig(), {
        "model": "tiny-qwen3", "env.id": "math", "steps": 1, "output": str(tmp_path / "run"),
        "scheduler.prompts_per_step": 1, "scheduler.group_size": 2, "sampling.max_new_tokens": 4,
        "guard.enabled": False, "token_values_per_step": 0,
    })
    out = train(cfg, progress=False)
    assert (out / "metrics.jsonl").exists() and not (out / TOKEN_VALUES).exists()
    with pytest.raises(ConfigError, match="token_values_per_step must be >= 0"):
        apply_overrides(RunConfig(), {"token_values_per_step": -1})


def _sample(group: int, advantage: float) -> Sample:
    return Sample((10, 11, 12, 13, 14, 15), (0, 0, 1, 1, 1, 1), (0.0, 0.0, -1.0, -2.0, -0.5, -3.0), advantage, group)


# pi_old of the hand samples per position (position t scores token t + 1): log rho = 0, 1, -1, 0.2 on the loss tokens,
# so rho = 1, e = 2.718, 1 / e = 0.368, 1.221.
HAND_OLD = torch.tensor([0.0, -1.0, -1.0, -1.5, -2.8])
RHO = [1.0, math.e, 1 / math.e, math.exp(0.2)]


@pytest.mark.parametrize("options, weights, masked", [
    ({"correction": "tis", "is_cap": 2.0}, [1.0, 2.0, RHO[2], RHO[3]], [False, True, False, False]),
    ({"correction": "icepop", "icepop_low": 0.5, "icepop_high": 5.0}, [1.0, RHO[1], 0.0, RHO[3]],
     [False, False, True, False]),
    # Sequence level: the product e^0.2 lies in the band, so every token keeps the sequence's weight ...
    ({"correction": "mis", "mis_level": "sequence", "mis_low": 0.5, "mis_high": 2.0}, [RHO[3]] * 4, [False] * 4),
    # ... and a geometric-mean rejection band (e^0.05 is outside it) drops the whole sample.
    ({"correction": "mis", "mis_level": "sequence", "mis_low": 0.5, "mis_high": 2.0, "rejection": "geometric",
      "rejection_low": 0.999, "rejection_high": 1.001}, [0.0] * 4, [True] * 4),
])  # fmt: skip
def test_is_weight_and_is_masked_follow_the_correction_rule_on_hand_values(tmp_path, options, weights, masked):
    step = _step(tmp_path, LossConfig(name="minirl", options=options, old_policy_pass="on"))
    samples = [_sample(0, 1.0), _sample(1, -0.5)]
    old = OldPolicy({0: HAND_OLD, 1: HAND_OLD}, None, [[0, 1]])
    records = token_values(step, _batch(samples), old, _trajectories(), step_index=7, count=2)
    assert [(r.step, r.group_id, r.episode, r.sample) for r in records] == [(7, 0, 0, 0), (7, 1, 0, 0)]
    for record in records:
        assert record.is_masked == [False, False, *masked]
        assert all(math.isclose(r, w, rel_tol=6e-4, abs_tol=1e-9) for r, w in zip(record.is_weight[2:], weights))
        assert record.is_weight[:2] == [None, None]
        # The step ran a pi_old pass: the trainer log-prob recorded is the one the loss read.
        assert record.trainer_logprob == [None, None, -1.0, -1.0, -1.5, -2.8]
    assert records[1].advantage == [None, None, -0.5, -0.5, -0.5, -0.5]
    # The loss itself, on the same tensors, masks and truncates exactly the recorded tokens.
    mb = collate(samples, 0)
    old_logp = torch.stack([HAND_OLD, HAND_OLD])  # [2, T]
    _, metrics = policy_loss("minirl", old_logp.clone(), old_logp, mb.rollout_logp, mb.advantages, mb.loss_mask,
                             **options)
    flagged = metrics["correction_masked_frac"] + metrics["correction_truncated_frac"]
    assert flagged == pytest.approx(sum(masked) / len(masked))


def test_bypass_records_the_trainers_logprobs_and_a_weight_of_one(tmp_path):
    step = _step(tmp_path, LossConfig(name="minirl", options={"correction": "tis", "is_cap": 2.0}, bypass=True))
    samples = [_sample(0, 1.0)]
    mu = torch.tensor(samples[0].rollout_logprobs[1:])
    records = token_values(step, _batch(samples), OldPolicy({0: mu}, None, [[0]]), _trajectories()[:1], 0, 1)
    (record,) = records
    assert record.is_weight[2:] == [1.0] * 4 and not any(record.is_masked)  # pi_old = mu: rho = 1
    policy = load_model("tiny-qwen3")
    with torch.no_grad():
        logp, _ = token_logprobs(policy.model, collate(samples, 0))
    assert all(_close(r, float(x)) for r, x in zip(record.trainer_logprob[2:], logp[0, 1:]))  # not mu: the trainer's


def test_choose_samples_prefers_samples_with_a_gradient_spread_over_the_step():
    samples = [_sample(i // 2, float(i % 2)) for i in range(8)]  # odd indices carry a gradient
    assert choose_samples(samples, 2) == [1, 5]
    assert choose_samples(samples, 5) == [0, 1, 3, 5, 7]  # all four with a gradient, then one without
    assert choose_samples(samples, 20) == list(range(8))
    assert choose_samples(samples, 0) == []


def _step(tmp_path, loss: LossConfig) -> TrainingStep:
    backend = SingleProcessBackend(load_model("tiny-qwen3"), lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0)
    return TrainingStep(backend=backend, routing=DenseRouting(), loss=loss, advantage=AdvantageConfig(),
                        optim=OptimConfig(), trainer=TrainerConfig(), per_turn_budget=8, pad_id=0,
                        shuffle=torch.Generator(), out=tmp_path)


def _batch(samples: list[Sample]) -> StepSamples:
    return StepSamples(samples, torch.zeros(len(samples)), {}, {}, [(i, 0) for i in range(len(samples))])


def _trajectories() -> list[Trajectory]:
    return [Trajectory("x", 0, g, (), "", 0.0, False, True, False) for g in (0, 1)]
