"""Engines as Ray actors (`EngineActorPool`) with the HF engine: replicas, load spreading, weights, restarts."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def pool(tiny_qwen3):
    from agentrl.engine.factory import EngineSpec, model_files
    from agentrl.engine.workers import EngineActorPool

    actors = EngineActorPool(EngineSpec(kind="hf", batch_size=8), model_files(tiny_qwen3), replicas=2, version=0)
    yield actors
    actors.close()


def test_two_replicas_serve_one_rollout_and_a_killed_one_is_restarted(pool, tiny_qwen3):
    """Episodes spread over both replicas; replica 0 dies mid-rollout; its turns re-run, no group is lost."""
    from engine_scenarios import rollout_killing_replica_0

    weights = {k: v.clone() for k, v in tiny_qwen3.model.state_dict().items()}
    pool.update_weights(weights.items(), version=2)
    result, killed = rollout_killing_replica_0(pool, tiny_qwen3.tokenizer)
    assert killed and pool.restarts == 1 and pool.resubmitted > 0
    assert len(result.trajectories) == 6 and result.stats.dropped_groups == 0
    assert all(len(t.turns) == 3 and t.policy_version == 2 for t in result.trajectories)


def test_sync_after_restart_gives_the_current_version(pool, tiny_qwen3):
    from agentrl.engine import EngineRequest, SamplingParams

    pool.update_weights(tiny_qwen3.model.state_dict().items(), version=5)
    tok = tiny_qwen3.tokenizer
    ids = tuple(tok("hello")["input_ids"])
    for i in range(4):
        pool.submit(EngineRequest(100 + i, ids, SamplingParams(max_new_tokens=3, seed=i), session=1000 + i))
    results = []
    while len(results) < 4:
        results += pool.poll(timeout=1.0)
    assert {r.policy_version for r in results} == {5}
    metrics = pool.metrics()
    assert metrics["engine_restarts"] == float(pool.restarts)
