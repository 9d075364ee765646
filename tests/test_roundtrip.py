"""Token round-trip checks: canonical ids pass, injected drift is detected and classified; check-template reports."""

import json
import subprocess
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.chat.roundtrip import BUILTIN_CONVERSATIONS, check_conversations, check_roundtrip, load_conversations

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def enc(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_canonical_and_drifted_replies(qwen3_tokenizer):
    tok = qwen3_tokenizer
    prompt = enc(tok, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert check_roundtrip(tok, prompt, enc(tok, "hello world<|im_end|>")).matches
    merge = enc(tok, "hello") + enc(tok, " ") + enc(tok, "world<|im_end|>")
    assert check_roundtrip(tok, prompt, merge).drift == "merge"
    newline = enc(tok, "hi\n") + enc(tok, "\n<|im_end|>")
    result = check_roundtrip(tok, prompt, newline)
    assert result.drift == "end_whitespace" and result.first_mismatch == 1
    lone = [tok.convert_tokens_to_ids("Ã")] + enc(tok, "<|im_end|>")  # the first byte of a 2-byte character, alone
    assert check_roundtrip(tok, prompt, lone).drift == "split_utf8"


@SETTINGS
@given(text=st.text(alphabet="ab cé\n你", min_size=1, max_size=12), cuts=st.lists(st.integers(1, 11), max_size=3))
def test_injected_drift_is_detected(qwen3_tokenizer, text, cuts):
    # Tokenizing pieces separately gives valid but possibly non-canonical ids: drift iff they differ from canonical.
    tok = qwen3_tokenizer
    prompt = enc(tok, "<|im_start|>assistant\n")
    bounds = sorted({c for c in cuts if c < len(text)})
    pieces = [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)])]
    generated = [i for p in pieces for i in enc(tok, p)] + enc(tok, "<|im_end|>")
    canonical = enc(tok, "<|im_start|>assistant\n" + text + "<|im_end|>")
    result = check_roundtrip(tok, prompt, generated)
    assert result.matches == (prompt + generated == canonical)
    if not result.matches:
        assert result.drift in ("merge", "end_whitespace")


def test_check_conversations_reports_splits_and_reasons(qwen3_tokenizer):
    report = check_conversations(qwen3_tokenizer, BUILTIN_CONVERSATIONS)
    assert report.family == "qwen3" and report.incremental_ok
    assert report.prefix_breaks == 1 and "<think>" in report.lines()[-1]
    chatml = check_conversations(qwen3_tokenizer, BUILTIN_CONVERSATIONS, family="chatml")
    assert chatml.prefix_preserving and chatml.drift_rate == 0.0
    off = check_conversations(qwen3_tokenizer, BUILTIN_CONVERSATIONS, chat_kwargs={"enable_thinking": False})
    assert off.prefix_breaks == 5


def test_trajectory_files_are_checked_with_real_ids(qwen3_tokenizer, tmp_path):
    tok = qwen3_tokenizer
    p1 = enc(tok, "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n")
    g1 = enc(tok, "a") + enc(tok, "b<|im_end|>")  # "ab" is one token: drift
    p2 = p1 + g1 + enc(tok, "\n<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n")
    g2 = enc(tok, "fine<|im_end|>")
    turns = [{"prompt_ids": p1, "generated_ids": g1, "observation": "q2"},
             {"prompt_ids": p2, "generated_ids": g2, "observation": "end"}]
    path = tmp_path / "trajectories.jsonl"
    path.write_text(json.dumps({"turns": turns, "first_observation": "q"}) + "\n")
    report = check_conversations(tok, load_conversations(path))
    assert [t.drift for t in report.turns] == ["merge", ""] and report.prefix_preserving


def test_cli_check_template(tmp_path):
    conv = tmp_path / "c.json"
    conv.write_text(json.dumps([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                                {"role": "user", "content": "q2"}, {"role": "assistant", "content": "b"}]))
    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "check-template", "--model", "tiny-qwen3",
                          "--conversations", str(conv), "--family", "chatml"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "family: chatml" in out.stdout and "prefix-preserving: yes" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "agentrl.cli", "check-template", "--model", "tiny-qwen3",
                          "--conversations", str(tmp_path / "missing.json")], capture_output=True, text=True)
    assert bad.returncode == 2 and "not found" in bad.stderr


class EchoEnv:
    """Three-turn env: any action is fine; the episode ends after the third."""

    system_prompt = "Act."

    def __new__(cls):
        from agentrl.envs.core import TextEnv

        class _Env(TextEnv):
            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                self.t = 0
                return "start", {}

            def step(self, action):
                self.t += 1
                done = self.t >= 3
                return f"obs {self.t}", 0.0, done, False, ({"success": True} if done else {})

        return _Env()


class ScriptedEngine:
    """Replies "hello world" with a non-canonical split on odd calls; records the budgets it was given."""

    policy_version = 0

    def __init__(self, tok):
        self.tok, self.calls, self.budgets = tok, 0, []

    def generate(self, prompts, params):
        from agentrl.engine.base import Generation

        self.budgets.append(params.max_new_tokens)
        self.calls += 1
        text = ["hel", "lo world"] if self.calls % 2 else ["hello world"]
        ids = [i for piece in text for i in enc(self.tok, piece)] + enc(self.tok, "<|im_end|>")
        return [Generation(tuple(ids), tuple(-0.1 for _ in ids), "stop") for _ in prompts]

    def update_weights(self, named_tensors, version):
        pass

    def metrics(self):
        return {}

    def clear_cache(self):
        pass


def test_rollout_records_drift_and_uses_context_options(qwen3_tokenizer):
    from agentrl.engine.base import SamplingParams
    from agentrl.engine.requests import BatchedRequests
    from agentrl.rollout.loop import run_rollout
    from agentrl.rollout.pool import EnvMaker, LocalPool

    engine = ScriptedEngine(qwen3_tokenizer)
    (traj,) = run_rollout(LocalPool(EnvMaker("echo", entry_point=EchoEnv), slots=1), "echo", [0], 1,
                          BatchedRequests(engine), qwen3_tokenizer, SamplingParams(), max_turns=3,
                          context_options={"family": "chatml", "recap_actions": 1},
                          max_new_tokens_by_turn=(32, 8)).trajectories
    assert [t.roundtrip_drift for t in traj.turns] == ["merge", "", "merge"]
    assert engine.budgets == [32, 8, 8]
    assert not any(t.new_segment for t in traj.turns)
    assert "Your last 1 action(s):\n2. hello world" in qwen3_tokenizer.decode(traj.turns[2].prompt_ids)
