"""Default observation role: the env's hint where the template needs it to keep the token prefix."""

import pytest

import agentrl
from agentrl.chat.layout import keeps_prefix, resolve_observation_role
from agentrl.config import ConfigError, ContextConfig


def test_qwen3_keeps_the_prefix_with_tool_observations_only(qwen3_tokenizer):
    assert not keeps_prefix(qwen3_tokenizer, "user", family="qwen3")
    assert keeps_prefix(qwen3_tokenizer, "tool", family="qwen3")
    assert keeps_prefix(qwen3_tokenizer, "user", family="chatml")


@pytest.mark.parametrize("env", ["alfworld", "webshop", "gui"])
def test_multi_turn_envs_default_to_one_sample_per_episode(env, qwen3_tokenizer):
    cls = agentrl.spec(env).load()
    role, why = resolve_observation_role("auto", cls, qwen3_tokenizer, family="qwen3")
    assert role == "tool" and "keep the prefix" in why
    assert resolve_observation_role("auto", cls, qwen3_tokenizer, family="chatml")[0] == "user"  # already merged
    assert resolve_observation_role("user", cls, qwen3_tokenizer, family="qwen3") == ("user", "set in the config")


def test_math_feedback_stays_a_user_message(qwen3_tokenizer):
    assert resolve_observation_role("auto", agentrl.spec("math").load(), qwen3_tokenizer, family="qwen3")[0] == "user"


def test_auto_is_the_config_default_and_a_bad_role_names_the_choices():
    assert ContextConfig().observation_role == "auto"
    with pytest.raises(ConfigError, match="one of user, tool, or auto"):
        ContextConfig(observation_role="robot")


def _play(tokenizer, history, role, thinking, turns=4):
    """Play `turns` turns of a Qwen3 conversation with fixed replies; return the context and each step's path."""
    from agentrl.chat.context import ChatContext

    ctx = ChatContext(tokenizer, "S", {"enable_thinking": thinking}, family="qwen3", observation_role=role,
                      history=history)
    ids = ctx.first_prompt("goal")
    paths, prompts = [], [ids]
    for turn in range(turns):
        body = f"go {turn}<|im_end|>" if turn % 2 == 0 else f"look {turn}"  # odd turns: cut at the token budget
        reply = tokenizer(body, add_special_tokens=False)["input_ids"]
        ids, new_segment = ctx.next_prompt(reply, f"obs {turn}")
        paths.append(ctx.last_step.path)
        assert not new_segment or history == "template"
        prompts.append(ids)
    return ctx, paths, prompts


@pytest.mark.parametrize("role", ["user", "tool"])
def test_qwen3_thinking_off_as_sampled_history_keeps_one_sample(qwen3_tokenizer, role):
    # The official render drops every earlier turn's empty <think></think>: each turn is a new segment.
    _, paths, _ = _play(qwen3_tokenizer, "template", role, thinking=False)
    assert "rewrite" in paths
    ctx, paths, prompts = _play(qwen3_tokenizer, "as_sampled", role, thinking=False)
    assert "rewrite" not in paths and "as_sampled" in paths
    assert "<think>" in ctx.last_step.reason  # says what the official rendering would have changed
    for before, after in zip(prompts, prompts[1:]):
        assert after[: len(before)] == before  # every prompt extends the previous one token for token
    # What follows the last reply is what the official template renders after it: the observation's turn and the
    # generation prompt, byte for byte.
    official = ctx.family.render(ctx.messages, add_generation_prompt=True, enable_thinking=False)
    tail = official[official.rfind("look 3") + len("look 3"):]
    assert ctx.text.endswith(tail) and tail.startswith("<|im_end|>") and tail.endswith("<think>\n\n</think>\n\n")
    assert ctx.text.count("<think>\n\n</think>\n\n") == 5  # each sampled turn's empty span is still there


def test_as_sampled_changes_nothing_where_the_template_keeps_the_prefix(qwen3_tokenizer):
    _, paths_t, prompts_t = _play(qwen3_tokenizer, "template", "tool", thinking=True)
    _, paths_s, prompts_s = _play(qwen3_tokenizer, "as_sampled", "tool", thinking=True)
    assert prompts_t == prompts_s and paths_t == paths_s and "as_sampled" not in paths_s


def test_a_bad_history_mode_names_the_choices():
    with pytest.raises(ConfigError, match="template .* or as_sampled"):
        ContextConfig(history="verbatim")
