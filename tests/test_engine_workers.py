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


def test_engine_replicas_take_their_reserved_placement_bundles(tiny_qwen3):
    """`--gpus-per-engine`: each replica runs in its own bundle of the run's placement group, with its own GPU.

    Ray's GPUs here are logical (this machine has none): Ray schedules and assigns them exactly as on a GPU node,
    while the HF engine inside computes on the CPU.
    """
    from agentrl.engine import EngineRequest, SamplingParams
    from agentrl.engine.factory import EngineSpec
    from agentrl.engine.launch import build_engines
    from agentrl.training.placement import Placement, PlacementPlan

    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    try:
        placement = Placement(PlacementPlan(trainers=0, engines=2, gpus_per_engine=1.0))
        engines = build_engines(EngineSpec(kind="hf", batch_size=4), tiny_qwen3, replicas=2, placement=placement)
        try:
            where = ray.get([a.where.remote() for a in engines._actors])
            assert {w["placement_group"] for w in where} == {placement.group.id.hex()}
            assert sorted(len(w["gpu_ids"]) for w in where) == [1, 1]
            assert where[0]["gpu_ids"] != where[1]["gpu_ids"]
            engines.sleep()  # colocated layout: around each training step; the HF replicas have nothing to free
            engines.wake_up()
            ids = tuple(tiny_qwen3.tokenizer("hello")["input_ids"])
            for i in range(4):
                engines.submit(EngineRequest(i, ids, SamplingParams(max_new_tokens=3, seed=i), session=i))
            results = []
            while len(results) < 4:
                results += engines.poll(timeout=1.0)
            assert sorted(engines.served) == [2, 2]
        finally:
            engines.close()
        placement.close()
    finally:
        ray.shutdown()
