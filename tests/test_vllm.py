"""The real vLLM engine (CPU build) on a tiny real-shape Qwen3 (head_dim 64, real tokenizer), in this process."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import pytest
import torch

from agentrl.engine.vllm import vllm_available

_MISSING = vllm_available()
pytestmark = pytest.mark.skipif(_MISSING is not None, reason=f"vLLM is not installed or not usable here "
                                f"({_MISSING}); install it with the README's vLLM command")

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="module")
def policy():
    from agentrl.models import load_model

    return load_model("tiny-qwen3-h64")


@pytest.fixture(scope="module")
def folder(policy, tmp_path_factory):
    from agentrl.engine.factory import model_files, write_model_files

    path = write_model_files(model_files(policy))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def engine(folder):
    import bm25s  # noqa: F401  (loads numba and llvmlite, as WebShop does: vLLM's start-up module scan must survive)

    from agentrl.engine.vllm import VLLMEngine

    eng = VLLMEngine(folder, dtype="float32", max_model_len=2048, kv_cache_gib=0.5)
    yield eng
    eng.close()


def chat(tok, text):
    rendered = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                       add_generation_prompt=True)
    return tok(rendered)["input_ids"]


def test_logprobs_agree_with_the_trainers_fp32_recompute(engine, policy):
    from agentrl.engine import SamplingParams
    from agentrl.records import Sample
    from agentrl.training.logprobs import token_logprobs
    from agentrl.training.microbatch import collate

    tok = policy.tokenizer
    prompts = [chat(tok, "add 2 and 3"), chat(tok, "a longer prompt about the weather in a few words")]
    gens = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=16, seed=5))
    samples = []
    for p, g in zip(prompts, gens):
        assert len(g.token_ids) == len(g.logprobs) > 0 and g.finish_reason in ("stop", "length")
        ids = list(p) + list(g.token_ids)
        samples.append(Sample(input_ids=tuple(ids), loss_mask=tuple([0] * len(p) + [1] * len(g.token_ids)),
                              rollout_logprobs=tuple([0.0] * len(p) + list(g.logprobs)), advantage=0.0,
                              group_id=0, policy_version=0))
    mb = collate(samples, pad_id=tok.pad_token_id)
    with torch.no_grad():
        pi, _ = token_logprobs(policy.model, mb)  # [n, T]
    mask = mb.loss_mask.bool()
    mu = mb.rollout_logp[mask]
    pi = pi[mask]
    log_ratio = pi - mu
    k3 = (log_ratio.exp() - 1 - log_ratio).mean()  # KL(mu || pi) estimate
    assert torch.allclose(mu, pi, atol=2e-4), (mu - pi).abs().max()
    assert float(k3) < 1e-7


def test_update_weights_changes_samples_and_restoring_restores_them(engine, policy):
    from agentrl.engine import SamplingParams

    prompts = [chat(policy.tokenizer, "hello there")]
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=11)
    before = engine.generate(prompts, params)[0]
    assert engine.generate(prompts, params)[0] == before  # same seed, same sample (and prefix cache on)
    original = {k: v.clone() for k, v in policy.model.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    noisy = {k: v + 0.5 * torch.randn(v.shape, generator=gen) for k, v in original.items()}
    engine.update_weights(noisy.items(), version=1)
    after = engine.generate(prompts, params)[0]
    assert engine.policy_version == 1
    assert after.logprobs != before.logprobs  # the cached prefix of the old weights was dropped too
    engine.update_weights(original.items(), version=2)
    restored = engine.generate(prompts, params)[0]
    assert restored.token_ids == before.token_ids
    assert max(abs(a - b) for a, b in zip(restored.logprobs, before.logprobs)) < 1e-5


def test_stop_strings_seeds_and_finish_reasons(engine, policy):
    from agentrl.engine import SamplingParams

    tok = policy.tokenizer
    p = [chat(tok, "x")]
    greedy = engine.generate(p, SamplingParams(temperature=0, max_new_tokens=20))[0]
    assert greedy.finish_reason == "length" and len(greedy.token_ids) == 20
    text = tok.decode(greedy.token_ids)
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    stopped = engine.generate(p, SamplingParams(temperature=0, max_new_tokens=20, stop=(stop,)))[0]
    assert stopped.finish_reason == "stop" and stop in tok.decode(stopped.token_ids)
    assert stop not in tok.decode(stopped.token_ids[:-1])
    a, b = (engine.generate(p, SamplingParams(max_new_tokens=10, seed=s))[0] for s in (1, 2))
    assert a != b and engine.generate(p, SamplingParams(max_new_tokens=10, seed=1))[0] == a


def test_every_sampling_field_maps_and_an_unknown_one_is_rejected_by_name():
    from agentrl.engine import EngineError, SamplingParams
    from agentrl.engine.vllm import vllm_sampling_params

    ours = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, min_p=0.05, max_new_tokens=7, stop=("\n",), seed=3,
                          repetition_penalty=1.1, presence_penalty=0.2, frequency_penalty=0.3)
    theirs = vllm_sampling_params(ours, stop_token_ids=[9])
    assert (theirs.temperature, theirs.top_p, theirs.top_k, theirs.min_p, theirs.max_tokens) == (0.7, 0.9, 20, 0.05, 7)
    assert (theirs.stop, theirs.seed, theirs.repetition_penalty) == (["\n"], 3, 1.1)
    assert (theirs.presence_penalty, theirs.frequency_penalty, theirs.logprobs) == (0.2, 0.3, 0)
    assert theirs.include_stop_str_in_output and 9 in theirs.stop_token_ids

    @dataclasses.dataclass(frozen=True)
    class WithBeams(SamplingParams):
        beam_width: int = 4

    with pytest.raises(EngineError, match="beam_width"):
        vllm_sampling_params(WithBeams())


def test_rollout_tags_versions_and_prefix_cache_hits_every_later_turn(engine, policy):
    """A multi-turn rollout through the scheduler: each turn its own request, versions tagged, cached prefixes hit."""
    from agentrl.engine import SamplingParams
    from agentrl.rollout.scheduler import RolloutScheduler

    sched = RolloutScheduler(
        "alfworld", {}, _Unclosed(engine), lambda: policy.model.state_dict().items(), policy.tokenizer,
        seeds_for_step=lambda s: [s, 100 + s], sampling_for_step=lambda s: SamplingParams(max_new_tokens=8, seed=s),
        group_size=2, rollout_kwargs={"max_turns": 3}, start_step=3)
    try:
        result = sched.rollout(4)  # lockstep: the weights are synced as version 4 first
    finally:
        sched.close()
    assert len(result.trajectories) == 4 and all(t.policy_version == 4 for t in result.trajectories)
    assert all(len(t.turns) == 3 for t in result.trajectories)
    metrics = result.stats.metrics()
    assert metrics["weight_sync_seconds"] > 0
    # Turns 2 and 3 re-send the whole episode: at least the first turn's prompt blocks come from the cache.
    assert metrics["prefix_cache_hit_rate"] > 0.4, metrics


class _Unclosed:
    """The module's engine, lent to a scheduler that would close it."""

    def __init__(self, engine):
        self.engine = engine

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def close(self):
        pass


def test_bad_models_are_refused_with_the_cause_and_the_fix(tmp_path, tiny_qwen3):
    from agentrl.engine import EngineError
    from agentrl.engine.vllm import check_servable

    config = tiny_qwen3.model.config.to_dict() | {"architectures": ["Qwen3ForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(EngineError, match="head_dim 16.*tiny-qwen3-h64"):
        check_servable(tmp_path, kv_cache_gib=0.5)
    (tmp_path / "config.json").write_text('{"architectures": ["NoSuchForCausalLM"], "hidden_size": 128}')
    with pytest.raises(EngineError, match="NoSuchForCausalLM.*--engine hf"):
        check_servable(tmp_path, kv_cache_gib=0.5)


def test_colocated_sleep_mode_is_refused_on_the_cpu_build_with_the_fix(folder):
    from agentrl.engine import EngineError
    from agentrl.engine.vllm import VLLMEngine

    with pytest.raises(EngineError, match="sleep mode needs a GPU build.*--colocate"):
        VLLMEngine(folder, sleep_mode=True)


def test_too_little_memory_is_refused_before_starting(folder):
    from agentrl.engine import EngineError
    from agentrl.engine.vllm import check_servable

    with pytest.raises(EngineError, match="too little memory.*engine.kv_cache_gib"):
        check_servable(folder, kv_cache_gib=100_000)


def test_auto_engine_is_vllm_where_it_serves_the_model_and_hf_otherwise(tiny_qwen3, policy, monkeypatch):
    from agentrl.engine import choose_engine
    from agentrl.engine import vllm as vllm_module

    assert choose_engine("auto", policy.model, "tiny-qwen3-h64")[0] == "vllm"
    kind, why = choose_engine("auto", tiny_qwen3.model, "tiny-qwen3")
    assert kind == "hf" and "head_dim 16" in why
    assert choose_engine("vllm", tiny_qwen3.model, "tiny-qwen3") == ("vllm", "")  # asked by name: refused later
    assert choose_engine("hf", policy.model, "tiny-qwen3-h64") == ("hf", "")
    monkeypatch.setattr(vllm_module, "vllm_available", lambda: "ImportError: torchvision built for CUDA")
    kind, why = choose_engine("auto", policy.model, "tiny-qwen3-h64")
    assert kind == "hf" and "torchvision" in why


def test_agentrl_run_with_the_vllm_engine_end_to_end(tmp_path):
    """The default engine (auto) is vLLM here; the run says so and records it in config.yaml."""
    import subprocess
    import sys

    import yaml

    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "run", "--env", "math", "--model", "tiny-qwen3-h64",
         "--steps", "2", "--group-size", "2", "--prompts-per-step", "2", "--max-new-tokens", "12", "--output",
         str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The plan table says the choice once, with its reason; config.yaml and plan.json keep it.
    # vLLM samples in bfloat16 by default against the float32 trainer (docs/results.md, the mismatch study).
    assert "engine    vllm x1, bfloat16 (vLLM imports here and serves tiny-qwen3-h64)" in proc.stdout
    assert yaml.safe_load((out / "config.yaml").read_text())["engine"]["kind"] == "vllm"
    assert json.loads((out / "plan.json").read_text())["engine"]["kind"] == "vllm"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    # A bfloat16 sampler against the float32 trainer: a small mismatch, not float noise (main job: about 2e-3).
    assert rows[1]["weight_sync_seconds"] > 0 and all(0 < r["kl_k3"] < 5e-2 for r in rows)
    versions = {json.loads(line)["policy_version"] for line in (out / "trajectories.jsonl").read_text().splitlines()}
    assert versions == {0, 1}


@pytest.mark.slow  # ~27 s; async staleness runs in the default run in tests/test_pool_async.py
def test_agentrl_run_with_async_vllm_rollouts_trains_on_at_most_one_version_old_samples(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "run", "--env", "math", "--model", "tiny-qwen3-h64", "--engine", "vllm",
         "--async", "--max-staleness", "1", "--steps", "3", "--group-size", "2", "--prompts-per-step", "2",
         "--max-new-tokens", "12", "--output", str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    trajectories = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    lags = [t["train_step"] - t["policy_version"] for t in trajectories]
    assert len(trajectories) == 3 * 4 and set(lags) <= {0, 1}
    # The producer ran ahead: some step trained on episodes the previous version sampled.
    assert 1 in lags, lags
    # A sync is booked to the rollout it landed during: the producer's step-2 rollout waited for the first one.
    assert sum(r["weight_sync_seconds"] for r in rows) > 0


def test_agentrl_run_refuses_a_head_dim_the_cpu_build_cannot_serve(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "run", "--env", "math", "--model", "tiny-qwen3", "--engine", "vllm",
         "--steps", "1", "--output", str(tmp_path / "run")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1 and "head_dim 16" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "trajectories.jsonl").exists()  # refused before any rollout


@pytest.mark.slow
def test_two_vllm_replicas_serve_one_rollout_and_a_killed_one_is_restarted(policy):
    """The `tests/test_engine_workers.py` scenario with real vLLM engine actors (slow: three engine starts)."""
    from engine_scenarios import rollout_killing_replica_0

    from agentrl.engine.factory import EngineSpec, model_files
    from agentrl.engine.workers import EngineActorPool

    pool = EngineActorPool(EngineSpec(kind="vllm", kv_cache_gib=0.5, max_model_len=4096), model_files(policy),
                           replicas=2, version=0)
    try:
        pool.update_weights(policy.model.state_dict().items(), version=3)
        result, killed = rollout_killing_replica_0(pool, policy.tokenizer)
        assert killed and pool.restarts == 1 and pool.resubmitted > 0
        assert len(result.trajectories) == 6 and result.stats.dropped_groups == 0
        assert all(len(t.turns) == 3 and t.policy_version == 3 for t in result.trajectories)
        assert pool.metrics()["prefix_cache_hit_rate"] > 0.3
    finally:
        pool.close()


def test_moe_routes_are_refused_on_the_cpu_build_with_the_fix(folder):
    from vllm.platforms import current_platform

    from agentrl.engine import EngineError
    from agentrl.engine.vllm import VLLMEngine

    if not current_platform.is_cpu():
        pytest.skip("the GPU build returns routed experts")
    with pytest.raises(EngineError, match="routed experts.*--engine hf"):
        VLLMEngine(folder, capture_routes=True, kv_cache_gib=0.5)


def test_agentrl_eval_with_the_vllm_engine(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "eval"
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "eval", "--env", "math", "--model", "tiny-qwen3-h64",  # auto: vLLM
         "--episodes", "3", "--max-new-tokens", "8", "--max-turns", "2", "--output", str(out)],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["engine"] == {"kind": "vllm", "dtype": "model", "engines": 1} and results["overall"]["episodes"] == 3
    for line in (out / "trajectories.jsonl").read_text().splitlines():
        for turn in json.loads(line)["turns"]:
            assert 0 < len(turn["generated_ids"]) == len(turn["rollout_logprobs"]) <= 8


def test_seeded_prompts_beyond_one_steps_token_budget(engine):
    # 8 x 1,000-token prompts exceed one scheduler step's 4,096 tokens. With chunked prefill, vLLM's CPU build
    # rewound the seeded generator of a part-prefilled prompt and died ("CPU Generator does not use offset") on the
    # headline command's first turn.
    from agentrl.engine import SamplingParams

    prompts = [[(i * 7 + j) % 1000 + 10 for j in range(1000)] for i in range(8)]
    params = SamplingParams(temperature=1.0, max_new_tokens=4, seed=3)
    first = engine.generate(prompts, params)
    assert [len(g.token_ids) for g in first] == [4] * 8
    assert [g.token_ids for g in engine.generate(prompts, params)] == [g.token_ids for g in first]
