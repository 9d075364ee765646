"""Context building (token-in/token-out) and the trajectory -> sample builder."""

import pytest

from agentrl.chat.context import ChatContext, strip_thinking
from agentrl.chat.samples import trajectory_to_samples
from agentrl.records import Trajectory, Turn, load_trajectories, save_trajectories


def turn(prompt, gen, obs="o", reward=0.0, new_segment=False):
    return Turn(tuple(prompt), tuple(gen), tuple(-0.1 * (i + 1) for i in range(len(gen))), "a", obs, reward,
                new_segment=new_segment)


def traj(turns):
    return Trajectory("math", 0, 3, tuple(turns), "first", sum(t.reward for t in turns), True, True, False, 2)


def test_prefix_consistent_turns_merge_with_exact_mask():
    t1 = turn([1, 2, 3], [4, 5])
    t2 = turn([1, 2, 3, 4, 5, 6, 7], [8])
    (s,) = trajectory_to_samples(traj([t1, t2]), advantage=0.5)
    assert s.input_ids == (1, 2, 3, 4, 5, 6, 7, 8)
    assert s.loss_mask == (0, 0, 0, 1, 1, 0, 0, 1)
    assert s.rollout_logprobs == (0, 0, 0, -0.1, -0.2, 0, 0, -0.1)
    assert s.advantage == 0.5 and s.group_id == 3 and s.policy_version == 2


def test_broken_prefix_splits_and_per_turn_option():
    t1 = turn([1, 2, 3], [4, 5])
    t2 = turn([1, 2, 9, 6], [8], new_segment=True)  # history rewritten: token 3..5 replaced
    t3 = turn([1, 2, 9, 6, 8, 7], [10])
    samples = trajectory_to_samples(traj([t1, t2, t3]), advantage=-1.0)
    assert [s.input_ids for s in samples] == [(1, 2, 3, 4, 5), (1, 2, 9, 6, 8, 7, 10)]
    assert samples[1].loss_mask == (0, 0, 0, 0, 1, 0, 1)
    per_turn = trajectory_to_samples(traj([t1, t2, t3]), advantage=-1.0, per_turn=True)
    assert len(per_turn) == 3 and all(s.advantage == -1.0 for s in per_turn)


def test_per_turn_advantages_reach_their_turns_tokens():
    t1 = turn([1, 2, 3], [4, 5])
    t2 = turn([1, 2, 3, 4, 5, 6, 7], [8])
    (s,) = trajectory_to_samples(traj([t1, t2]), advantage=[0.75, -0.25])  # e.g. GiGPO: one per turn
    assert s.token_advantages == (0, 0, 0, 0.75, 0.75, 0, 0, -0.25) and s.advantage == 0.75
    (same,) = trajectory_to_samples(traj([t1, t2]), advantage=[0.5, 0.5])
    assert same.token_advantages is None and same.advantage == 0.5  # equal turns: the plain scalar form
    split = trajectory_to_samples(traj([t1, t2]), advantage=[0.75, -0.25], per_turn=True)
    assert [(x.advantage, x.token_advantages) for x in split] == [(0.75, None), (-0.25, None)]
    with pytest.raises(ValueError, match="3 advantages for a trajectory of 2 turns"):
        trajectory_to_samples(traj([t1, t2]), advantage=[1.0, 2.0, 3.0])


def test_turn_validates_lengths():
    with pytest.raises(ValueError, match="one logprob per generated token"):
        Turn((1,), (2, 3), (0.0,), "a", "o", 0.0)


def test_trajectories_roundtrip_jsonl(tmp_path):
    import numpy as np

    t = Turn((1, 2), (3,), (-0.5,), "a", "o", 1.0, routed_experts=np.arange(12, dtype=np.uint8).reshape(2, 3, 2))
    tr = traj([t])
    save_trajectories([tr, tr], tmp_path / "t.jsonl")
    back = load_trajectories(tmp_path / "t.jsonl")
    assert back == [tr, tr]
    assert back[0].turns[0].routed_experts.dtype == np.uint8
    good = (tmp_path / "t.jsonl").read_text()
    (tmp_path / "cut.jsonl").write_text(good + good[:50])  # killed mid-write: the last line has no newline
    with pytest.warns(UserWarning, match="truncated last line"):
        assert load_trajectories(tmp_path / "cut.jsonl") == [tr, tr]
    (tmp_path / "bad.jsonl").write_text('{"env_id": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_trajectories(tmp_path / "bad.jsonl")


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_context_grows_token_in_token_out(qwen3_tokenizer):
    tok = qwen3_tokenizer
    ctx = ChatContext(tok, "sys", {"chat_template": CHATML})
    p1 = ctx.first_prompt("What is 1+1?")
    # Ids that re-tokenizing the decoded text would NOT give back: "2" split oddly is kept verbatim.
    gen = tok("The answer", add_special_tokens=False)["input_ids"] + tok(" is 2", add_special_tokens=False)["input_ids"]
    gen += [tok.convert_tokens_to_ids("<|im_end|>")]
    p2, new_segment = ctx.next_prompt(gen, "Correct.")
    assert not new_segment
    assert p2[: len(p1) + len(gen)] == p1 + gen
    full = tok.apply_chat_template(ctx.messages, tokenize=False, add_generation_prompt=True, chat_template=CHATML)
    assert tok.decode(p2) == full


def test_qwen3_non_thinking_drops_its_empty_think_block(qwen3_tokenizer):
    # With enable_thinking=False the generation prompt carries an empty <think></think> that the official template
    # does not re-render for earlier turns: every turn's context is a rewrite, so samples must split.
    tok = qwen3_tokenizer
    ctx = ChatContext(tok, "sys", {"enable_thinking": False})
    p1 = ctx.first_prompt("What is 1+1?")
    assert "<think>\n\n</think>" in tok.decode(p1)
    p2, new_segment = ctx.next_prompt(tok("2<|im_end|>", add_special_tokens=False)["input_ids"], "Correct.")
    assert new_segment
    assert tok.decode(p2) == tok.apply_chat_template(ctx.messages, tokenize=False, add_generation_prompt=True,
                                                     enable_thinking=False)


def test_context_splits_when_qwen3_drops_thinking(qwen3_tokenizer):
    tok = qwen3_tokenizer
    ctx = ChatContext(tok, "")
    ctx.first_prompt("q1")
    gen = tok("<think>\nhmm\n</think>\n\nA1<|im_end|>", add_special_tokens=False)["input_ids"]
    p2, new_segment = ctx.next_prompt(gen, "q2")
    # Qwen3 drops the <think> span of assistant turns before the last user message: the prefix breaks.
    assert new_segment
    assert "hmm" not in tok.decode(p2) and "A1" in tok.decode(p2)


def test_strip_thinking():
    assert strip_thinking("<think>x</think>\n\n answer ") == "answer"
    assert strip_thinking(" plain ") == "plain"
