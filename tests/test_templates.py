"""Chat-template families: the Qwen3 rendering equals the official template, and incremental context building
equals the full rendering for every family, with splits exactly where the family's policy rewrites history."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.chat.context import ChatContext, detect_family, recap_text
from agentrl.chat.families import FAMILIES, UnknownFamilyError, get_family
from agentrl.chat.samples import trajectory_to_samples
from agentrl.records import Trajectory, Turn

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Text with the characters templates care about: newlines, think tags, tool-response wrappers, non-ASCII.
words = st.sampled_from(["a", "b c", "\n", "\n\n", " ", "<think>", "</think>", "<tool_response>", "</tool_response>",
                         "café", "你好", "x=1", "{", "}"])
text = st.lists(words, max_size=6).map("".join)
tool_call = st.fixed_dictionaries({"function": st.fixed_dictionaries(
    {"name": st.sampled_from(["search", "click"]),
     "arguments": st.one_of(st.dictionaries(st.sampled_from(["q", "n"]), st.integers(0, 9) | text, max_size=2),
                            st.just('{"q": "raw"}'))})})
message = st.one_of(
    st.fixed_dictionaries({"role": st.just("user"), "content": text}),
    st.fixed_dictionaries({"role": st.just("tool"), "content": text}),
    st.fixed_dictionaries({"role": st.just("system"), "content": text}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": text},
                          optional={"reasoning_content": st.one_of(st.none(), text),
                                    "tool_calls": st.lists(tool_call, min_size=1, max_size=2)}),
)
tools = st.one_of(st.none(), st.just([{"type": "function", "function": {"name": "search", "parameters": {}}}]))


@SETTINGS
@given(first=st.one_of(st.none(), text), rest=st.lists(message, min_size=1, max_size=7), tools=tools,
       thinking=st.sampled_from([None, True, False]), gen=st.booleans())
def test_qwen3_rendering_equals_the_official_template(qwen3_tokenizer, first, rest, tools, thinking, gen):
    messages = ([{"role": "system", "content": first}] if first is not None else []) + rest
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    official = qwen3_tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen,
                                                   **kwargs)
    ours = get_family("qwen3").render(messages, tools=tools, add_generation_prompt=gen, **kwargs)
    assert ours == official


def test_families_are_registered_and_detected(qwen3_tokenizer):
    assert {"qwen3", "qwen2.5", "chatml", "deepseek-r1", "kimi-k2-thinking", "gpt-oss", "glm-4.6"} <= set(FAMILIES)
    assert get_family("kimi-k2").name == "kimi-k2-thinking"
    assert detect_family(qwen3_tokenizer) == "qwen3"
    assert detect_family(qwen3_tokenizer, {"enable_thinking": False}) == "qwen3"
    with pytest.raises(UnknownFamilyError, match="known: chatml"):
        get_family("llama9")
    with pytest.raises(ValueError, match="needs a string 'content'"):
        get_family("chatml").render([{"role": "user", "content": None}])


def test_chatml_matches_smollm2_default_system_prompt():
    text = get_family("chatml").render([{"role": "user", "content": "hi"}])
    system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    assert text == (f"<|im_start|>system\n{system}<|im_end|>\n"
                    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


# (reasoning, answer, ends with the end-of-turn token)
reply = st.tuples(st.one_of(st.just(""), text.map(lambda r: f"<think>\n{r}\n</think>\n\n")), text, st.booleans())


def _episode(tok, family, replies, observation_role, chat_kwargs=None, recap=0):
    """Play an episode with scripted replies; return (context, trajectory)."""
    ctx = ChatContext(tok, "Solve it.", chat_kwargs, family=family, recap_actions=recap, verify=True)
    end = ctx.family.end_of_turn[0]
    prompt = ctx.first_prompt("the task")
    turns = []
    for k, (thought, answer, ends) in enumerate(replies):
        gen = tok(thought + answer + (end if ends else ""), add_special_tokens=False)["input_ids"] or [0]
        turn_role = observation_role if isinstance(observation_role, str) else observation_role[k]
        next_prompt, new_segment = ctx.next_prompt(gen, f"observation {k}", role=turn_role)
        turns.append((prompt, gen))
        prompt = next_prompt
    records = []
    for i, (p, g) in enumerate(turns):
        seg = i > 0 and not p[: len(turns[i - 1][0]) + len(turns[i - 1][1])] == turns[i - 1][0] + turns[i - 1][1]
        records.append(Turn(tuple(p), tuple(g), tuple(-0.5 for _ in g), "a", "o", 0.0, new_segment=seg))
    return ctx, Trajectory("t", 0, 0, tuple(records), "the task", 0.0, True, True, False)


@SETTINGS
@given(family=st.sampled_from(sorted(FAMILIES)), replies=st.lists(reply, min_size=1, max_size=5),
       roles=st.lists(st.sampled_from(["user", "tool"]), min_size=5, max_size=5), recap=st.integers(0, 2))
def test_incremental_context_equals_full_rendering_and_samples_match(qwen3_tokenizer, family, replies, roles, recap):
    tok = qwen3_tokenizer
    ctx, traj = _episode(tok, family, replies, roles, recap=recap)  # verify=True raises on any disagreement
    assert ctx.text == ctx.family.render(ctx.messages, **ctx.chat_kwargs)
    samples = trajectory_to_samples(traj, advantage=1.0)
    # Loss mask is 1 exactly on generated tokens, in order, with their logprobs.
    masked = [t for s in samples for t, m in zip(s.input_ids, s.loss_mask) if m]
    assert masked == [t for turn in traj.turns for t in turn.generated_ids]
    assert all(lp == -0.5 for s in samples for lp, m in zip(s.rollout_logprobs, s.loss_mask) if m)
    assert all(lp == 0 for s in samples for lp, m in zip(s.rollout_logprobs, s.loss_mask) if not m)
    # Each turn's context (prompt + reply) is a prefix of exactly the sample that trains it.
    remaining = list(traj.turns)
    for s in samples:
        while remaining:
            t = remaining[0]
            seen = t.prompt_ids + t.generated_ids
            if s.input_ids[: len(seen)] != seen:
                break
            remaining.pop(0)
    assert not remaining
    assert len(samples) == 1 + sum(t.new_segment for t in traj.turns)


def test_qwen3_thinking_splits_on_user_turns_but_not_tool_turns(qwen3_tokenizer):
    replies = [("<think>\nplan\n</think>\n\n", f"act {k}", True) for k in range(4)]
    _, user_traj = _episode(qwen3_tokenizer, "qwen3", replies, "user")
    assert len(trajectory_to_samples(user_traj, 0.0)) == 4  # every earlier <think> is dropped: every turn splits
    ctx, tool_traj = _episode(qwen3_tokenizer, "qwen3", replies, "tool")
    assert len(trajectory_to_samples(tool_traj, 0.0)) == 1  # reasoning after the last query is kept
    assert ctx.last_step.path == "delta"


def test_qwen3_thinking_off_splits_every_turn(qwen3_tokenizer):
    replies = [("", f"act {k}", True) for k in range(3)]
    ctx, traj = _episode(qwen3_tokenizer, "qwen3", replies, "user", chat_kwargs={"enable_thinking": False})
    assert len(trajectory_to_samples(traj, 0.0)) == 3
    assert "<think>" in ctx.last_step.reason


def test_prefix_preserving_families_never_split_and_take_the_delta_path(qwen3_tokenizer):
    replies = [("", f"act {k}", True) for k in range(5)]
    for family in ("chatml", "qwen2.5"):
        ctx, traj = _episode(qwen3_tokenizer, family, replies, "user")
        assert len(trajectory_to_samples(traj, 0.0)) == 1
        assert ctx.last_step.path == "delta"


def test_kimi_keeps_reasoning_while_calling_tools_and_drops_it_after_an_answer(qwen3_tokenizer):
    call = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.search:0<|tool_call_argument_begin|>"
            '{"q": "x"}<|tool_call_end|><|tool_calls_section_end|>')
    replies = [("<think>hm</think>", call, True)] * 2 + [("<think>ok</think>", "done", True)]
    ctx, traj = _episode(qwen3_tokenizer, "kimi-k2-thinking", replies, "tool")
    assert [t.new_segment for t in traj.turns] == [False, False, False]
    assert ctx.last_step.new_segment  # the answer without a tool call rewrote the chain's reasoning
    assert ctx.text.count("<think></think>") == 3
    assert ctx.messages[3]["tool_call_id"] == "functions.search:0"  # a tool result names the call it answers
    assert "## Return of functions.search:0\n" in ctx.text


def test_deepseek_r1_drops_reasoning_from_history(qwen3_tokenizer):
    ctx, traj = _episode(qwen3_tokenizer, "deepseek-r1", [("why\n</think>\n\n", "42", True)], "user")
    assert ctx.last_step.new_segment and "why" not in ctx.text


def test_recap_repeats_goal_and_last_actions():
    assert recap_text("find key", ["look", "go north", "take key"], 2).endswith(
        "Your goal: find key\nYour last 2 action(s):\n2. go north\n3. take key")
    with pytest.raises(ValueError, match="observation_role"):
        ChatContext(None, family="chatml", observation_role="env")


def test_qwen3_new_query_rewrites_older_reasoning_even_when_the_last_reply_had_none(qwen3_tokenizer):
    # Reasoning two turns back (kept while observations were tool responses) is dropped once a real user message
    # arrives, although the latest reply had no reasoning: only the policy, not the anchor, can see this.
    replies = [("<think>\nplan\n</think>\n\n", "call", True), ("", "call again", True), ("", "done", True)]
    ctx, traj = _episode(qwen3_tokenizer, "qwen3", replies, ["tool", "tool", "user"])
    assert ctx.last_step.new_segment and ctx.last_step.path == "rewrite"
    assert "plan" not in ctx.text
    assert [t.new_segment for t in traj.turns] == [False, False, False]
