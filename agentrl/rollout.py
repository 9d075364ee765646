"""The agent loop: drive an inference engine against envs and return `Trajectory` records.

Episodes run side by side and every turn is one batched engine call over all episodes still running, so the
engine sees batches of `prompts_per_step * group_size` prompts at the first turn. Token-in/token-out: the ids the engine
generated go into the next turn's context verbatim (see `agentrl.context`), never re-tokenized from text.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from agentrl.context import ChatContext
from agentrl.core import TextEnv
from agentrl.engine.base import InferenceEngine, SamplingParams
from agentrl.records import Trajectory, Turn

__all__ = ["collect_trajectories", "Episode"]


@dataclass
class Episode:
    """Mutable state of one running episode (internal to the loop; frozen into a `Trajectory` at the end)."""

    env: TextEnv
    seed: int
    group_id: int
    context: ChatContext
    prompt: list[int]
    first_observation: str
    task_type: str = ""
    turns: list[Turn] = field(default_factory=list)
    new_segment: bool = False
    done: bool = False
    success: bool = False
    terminated: bool = False
    truncated: bool = False


def collect_trajectories(
    make_env: Callable[[], TextEnv],
    env_id: str,
    seeds: Sequence[int],
    group_size: int,
    engine: InferenceEngine,
    tokenizer,
    sampling: SamplingParams,
    *,
    max_turns: int = 1,
    max_context_tokens: int = 4096,
    policy_version: int = 0,
    chat_kwargs: dict | None = None,
    on_turn: Callable[[int, int], None] | None = None,
) -> list[Trajectory]:
    """Play `group_size` episodes for each seed and return them, grouped (group i = seeds[i]).

    Args:
        make_env: creates one env instance.
        env_id: recorded in each trajectory.
        seeds: one task per seed.
        group_size: episodes per seed (a group).
        engine: samples the model's replies.
        tokenizer: renders contexts with its chat template.
        sampling: sampling settings; `sampling.seed` (if set) is varied per turn so that runs are reproducible.
        max_turns: model calls per episode; an episode still running after that is truncated.
        max_context_tokens: an episode whose next prompt would be longer is truncated.
        policy_version: recorded in each trajectory.
        chat_kwargs: chat-template variables (e.g. ``{"enable_thinking": False}``).
        on_turn: called after each batched turn with (episodes finished, episodes in all), for progress bars.
    """
    episodes: list[Episode] = []
    for group_id, seed in enumerate(seeds):
        for _ in range(group_size):
            env = make_env()
            obs, info = env.reset(seed=int(seed))
            ctx = ChatContext(tokenizer, env.system_prompt, chat_kwargs)
            episodes.append(Episode(env, int(seed), group_id, ctx, ctx.first_prompt(obs), obs,
                                    task_type=str(info.get("task_type", ""))))

    for turn_index in range(max_turns):
        running = [ep for ep in episodes if not ep.done]
        if not running:
            break
        params = sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + 7919 * turn_index)
        start = time.perf_counter()
        generations = engine.generate([ep.prompt for ep in running], params)
        per_episode_seconds = (time.perf_counter() - start) / len(running)
        for ep, gen in zip(running, generations):
            action = ChatContext.action_text(tokenizer, gen.token_ids)
            t0 = time.perf_counter()
            obs, reward, terminated, truncated, info = ep.env.step(action)
            env_seconds = time.perf_counter() - t0
            ep.turns.append(Turn(
                prompt_ids=tuple(ep.prompt), generated_ids=tuple(gen.token_ids),
                rollout_logprobs=tuple(gen.logprobs), action=action, observation=obs, reward=float(reward),
                finish_reason=gen.finish_reason, new_segment=ep.new_segment,
                generate_seconds=per_episode_seconds, env_seconds=env_seconds, routed_experts=gen.routed_experts,
            ))
            if terminated or truncated:
                ep.done, ep.terminated, ep.truncated = True, bool(terminated), bool(truncated)
                ep.success = bool(info.get("success", False))
                continue
            if turn_index + 1 == max_turns:
                ep.done, ep.truncated = True, True
                continue
            ep.prompt, ep.new_segment = ep.context.next_prompt(gen.token_ids, obs)
            if len(ep.prompt) > max_context_tokens:
                ep.done, ep.truncated = True, True
        if on_turn is not None:
            on_turn(sum(ep.done for ep in episodes), len(episodes))

    for ep in episodes:
        ep.env.close()
    return [
        Trajectory(
            env_id=env_id, seed=ep.seed, group_id=ep.group_id, turns=tuple(ep.turns),
            first_observation=ep.first_observation, total_return=sum(t.reward for t in ep.turns),
            success=ep.success, terminated=ep.terminated, truncated=ep.truncated or not ep.done,
            policy_version=policy_version, task_type=ep.task_type,
        )
        for ep in episodes
    ]
