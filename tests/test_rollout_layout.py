"""Default observation role: the env's hint where the template needs it to keep the token prefix."""

import pytest

import agentrl
from agentrl.config import ConfigError, ContextConfig
from agentrl.rollout_layout import keeps_prefix, resolve_observation_role


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
