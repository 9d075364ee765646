"""One context configuration for run and eval: `agentrl eval --model RUN/checkpoint` builds the run's prompts."""

from __future__ import annotations

import pytest

import agentrl
from agentrl.chat.context import ChatContext
from agentrl.config import ConfigError, ContextConfig, EngineConfig, EnvConfig, RunConfig, apply_overrides, load_config
from agentrl.models import load_model
from agentrl.recipes.evaluate import EVAL_SEED_OFFSET, EvalConfig, eval_env, evaluate
from agentrl.recipes.train import train
from agentrl.records import load_trajectories

# Every context setting away from its default: tool observations, a recap, an explicit family, per-turn budgets
# (the second turn gets fewer tokens) and thinking off.
CONTEXT = {"observation_role": "tool", "recap_actions": 1, "chat_family": "qwen3",
           "max_new_tokens_by_turn": (6, 3), "enable_thinking": False}
ENV = {"mode": "multi", "max_turns": 3}  # wrong answers get feedback and another turn: multi-turn episodes


def _replay(tokenizer, family: str, context: ContextConfig, traj) -> list[tuple[int, ...]]:
    """The prompts `context` builds for the recorded replies and observations of `traj`."""
    kwargs = context.rollout_kwargs(family)
    system_prompt = agentrl.make(traj.env_id, **ENV).system_prompt
    ctx = ChatContext(tokenizer, system_prompt, kwargs["chat_kwargs"], **kwargs["context_options"])
    prompts = [tuple(ctx.first_prompt(traj.first_observation))]
    for prev in traj.turns[:-1]:
        prompts.append(tuple(ctx.next_prompt(prev.generated_ids, prev.observation)[0]))
    return prompts


def test_eval_of_a_run_builds_the_runs_prompts_byte_for_byte(tmp_path):
    cfg = apply_overrides(RunConfig(), {
        "model": "tiny-qwen3", "env.id": "math", "env.kwargs": ENV, "steps": 1, "output": str(tmp_path / "run"),
        "scheduler.prompts_per_step": 1, "scheduler.group_size": 2, "sampling.max_new_tokens": 6,
        "guard.enabled": False,
        **{f"context.{k}": v for k, v in CONTEXT.items()},
    })
    run = train(cfg, progress=False)

    results = evaluate(EvalConfig(model=str(run / "checkpoint"), env=_eval_env(kwargs=ENV), episodes=2,
                                  max_new_tokens=6, engine=EngineConfig(batch_size=4), output=str(tmp_path / "eval"),
                                  transcripts=0), progress=False)  # fmt: skip
    assert results["context"]["source"] == "training run (config.yaml)"
    assert {k: results["context"][k] for k in CONTEXT} == CONTEXT  # the context recorded with the run
    policy = load_model(str(run / "checkpoint"))
    trained = load_trajectories(run / "trajectories.jsonl")
    evaluated = load_trajectories(tmp_path / "eval" / "trajectories.jsonl")
    assert max(len(t.turns) for t in evaluated) >= 2  # the observation role and recap show from turn 2 on
    for traj in trained:  # the training context's own rendering reproduces what training saw ...
        assert _replay(policy.tokenizer, policy.family, cfg.context, traj) == [t.prompt_ids for t in traj.turns]
    for traj in evaluated:  # ... and what eval fed the model is byte-identical to it, turn after turn
        assert _replay(policy.tokenizer, policy.family, cfg.context, traj) == [t.prompt_ids for t in traj.turns]
        assert all(len(t.generated_ids) <= 3 for t in traj.turns[1:])  # the run's per-turn budget
    default = ContextConfig(observation_role="user")  # the defaults, with math's resolved observation role
    assert any(_replay(policy.tokenizer, policy.family, default, t) != [u.prompt_ids for u in t.turns]
               for t in evaluated)  # the settings matter: the default context builds other prompts

    # The run's env arguments too: with no --env-arg the checkpoint is evaluated on the env it trained on ...
    again = evaluate(EvalConfig(model=str(run / "checkpoint"), env=_eval_env(), episodes=1,
                                max_new_tokens=6, output=str(tmp_path / "eval2"), transcripts=0), progress=False)
    assert again["env"]["kwargs"] == ENV | {"split": "test"}  # the held-out split, as eval always chooses
    # ... and --env-arg still wins, key by key.
    override = evaluate(EvalConfig(model=str(run / "checkpoint"), env=_eval_env(kwargs={"max_turns": 2}), episodes=1,
                                   max_new_tokens=6, output=str(tmp_path / "eval3"), transcripts=0), progress=False)
    assert override["env"]["kwargs"] == ENV | {"max_turns": 2, "split": "test"}
    # ... and on another env nothing carries over (math's arguments would not even construct the phone).
    other = evaluate(EvalConfig(model=str(run / "checkpoint"), env=_eval_env(id="gui", max_turns=1), episodes=1,
                                max_new_tokens=2, output=str(tmp_path / "eval4"), transcripts=0), progress=False)
    assert other["env"]["kwargs"] == {}


def test_keys_of_the_old_layout_fail_with_their_new_place(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("rollout: {observation_role: tool, recap_actions: 2, group_size: 4}\n")
    with pytest.raises(ConfigError, match=r"^\S+old.yaml: rollout.group_size is now scheduler.group_size$"):
        load_config(path)
    path.write_text("rollout: {observation_role: tool}\n")
    with pytest.raises(ConfigError, match="rollout.observation_role is now context.observation_role"):
        load_config(path)
    path.write_text("context: {observation_role: tool, recap_actions: 2}\nscheduler: {group_size: 4}\n")
    cfg = load_config(path)
    assert (cfg.context.observation_role, cfg.context.recap_actions, cfg.scheduler.group_size) == ("tool", 2, 4)


def _eval_env(id="math", kwargs=None, max_turns=3) -> EnvConfig:
    """An eval's env section: math on the held-out seeds, 3 model calls, unless told otherwise."""
    env = eval_env(id, kwargs, max_turns=max_turns)
    assert env.seed_offset == EVAL_SEED_OFFSET
    return env
