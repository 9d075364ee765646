"""Rollout scenarios shared by the engine-actor tests (HF actors and vLLM actors play the same ones)."""

from __future__ import annotations


def rollout_killing_replica_0(pool, tokenizer):
    """Play 3 ALFWorld tasks x 2 episodes x 3 turns over `pool`, killing replica 0 once while it has turns in flight.

    Returns:
        (the rollout result, whether the kill happened).
    """
    import ray

    from agentrl.engine import SamplingParams
    from agentrl.rollout.loop import run_rollout
    from agentrl.rollout.pool import EnvMaker, LocalPool

    killed = []

    def kill_once(stats):
        # Both replicas have answered, and replica 0 has turns in flight: kill it now.
        if min(pool.served) > 0 and pool.in_flight_on(0) and not killed:
            killed.append(True)
            ray.kill(pool.actor_handle(0), no_restart=False)

    env_pool = LocalPool(EnvMaker("alfworld"), slots=1 << 10)
    result = run_rollout(env_pool, "alfworld", [0, 1, 2], 2, pool, tokenizer,
                         SamplingParams(max_new_tokens=6, seed=1), max_turns=3, on_progress=kill_once)
    return result, bool(killed)
