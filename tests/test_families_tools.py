"""Tool-calling episodes end to end: an env that declares tools gets function-call actions parsed by the family's
parser and answers with tool messages; `agentrl check-template` reports parity, rewrites and the rule per family."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agentrl.chat.context import ChatContext
from agentrl.chat.families import FAMILIES, get_family
from agentrl.chat.parsers import ToolCall

SEARCH = {"type": "function", "function": {"name": "search", "description": "Search.", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}


class ToolEnv:
    """Asks for function calls (reset info "tools"); records the actions it receives; ends after two steps."""

    system_prompt = "Use the tools."
    received: list[str] = []

    def __new__(cls):
        from agentrl.envs.core import TextEnv

        class _Env(TextEnv):
            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                self.t = 0
                return "Find the capital of France.", {"tools": [SEARCH]}

            def step(self, action):
                ToolEnv.received.append(action)
                self.t += 1
                return f"Paris ({self.t})", 0.0, self.t >= 2, False, ({"success": True} if self.t >= 2 else {})

        return _Env()


class CallingEngine:
    """Replies with one Qwen3 tool call, as a model would write it."""

    policy_version = 0

    def __init__(self, tok):
        self.tok = tok

    def generate(self, prompts, params):
        from agentrl.engine.base import Generation

        text = ('<think>\nlook it up\n</think>\n\n<tool_call>\n{"name": "search", "arguments": {"q": "capital"}}\n'
                "</tool_call><|im_end|>")
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        return [Generation(tuple(ids), tuple(-0.1 for _ in ids), "stop") for _ in prompts]

    def update_weights(self, named_tensors, version):
        pass

    def metrics(self):
        return {}

    def clear_cache(self):
        pass


def test_rollout_sends_function_calls_and_tool_observations(qwen3_tokenizer):
    from agentrl.engine.base import SamplingParams
    from agentrl.engine.requests import BatchedRequests
    from agentrl.rollout.loop import run_rollout
    from agentrl.rollout.pool import EnvMaker, LocalPool

    ToolEnv.received = []
    engine = BatchedRequests(CallingEngine(qwen3_tokenizer))
    (traj,) = run_rollout(LocalPool(EnvMaker("tools", entry_point=ToolEnv), slots=1), "tools", [0], 1, engine,
                          qwen3_tokenizer, SamplingParams(), max_turns=3,
                          context_options={"family": "qwen3"}).trajectories
    assert ToolEnv.received == ['{"name": "search", "arguments": {"q": "capital"}}'] * 2
    prompt = qwen3_tokenizer.decode(traj.turns[1].prompt_ids)
    assert "# Tools" in prompt and "<tool_response>\nParis (1)\n</tool_response>" in prompt
    assert not traj.turns[1].new_segment  # reasoning before a tool response is kept: the prefix holds


@pytest.mark.parametrize("family", [n for n, f in FAMILIES.items() if f.max_tool_calls])
def test_each_parser_turns_its_families_reply_into_the_call_the_env_receives(qwen3_tokenizer, family):
    f = get_family(family)
    ctx = ChatContext(qwen3_tokenizer, "Use the tools.", {"thinking": True}, family=family)
    ctx.first_prompt("Find the capital of France.", {"tools": [SEARCH]})
    call = ToolCall("search", {"q": "capital", "n": 2})
    text = f.write_reply(ctx.messages, "think first" if f.reasons else "", "", [call], tools=[SEARCH],
                         **ctx.chat_kwargs)
    parsed = f.parse(f.strip_end(text), f.prefill_of(ctx.text))
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("search", {"q": "capital", "n": 2})]
    assert json.loads(ctx.action_from_reply(qwen3_tokenizer(text, add_special_tokens=False)["input_ids"])) == {
        "name": "search", "arguments": {"q": "capital", "n": 2}}
    if f.reasons and family not in ("smollm3",):
        assert parsed.reasoning == "think first"


def test_cli_check_template_reports_parity_rewrites_and_the_rule():
    out = subprocess.run([sys.executable, "-m", "agentrl.cli", "check-template", "--model", "tiny-qwen3"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "family: qwen3" in out.stdout
    assert "the tokenizer's own template vs the official qwen3 file: 6/6 conversations" in out.stdout
    assert "stated rewrite rule mispredicted: 0 turns" in out.stdout
    assert "split, at char" in out.stdout  # where history was rewritten, and why



@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_check_template_per_family_finds_no_rule_misses(qwen3_tokenizer, family):
    from agentrl.chat.roundtrip import check_family

    report = check_family(qwen3_tokenizer, family, chat_kwargs={"enable_thinking": True, "thinking": True})
    assert report.family == family and report.incremental_ok and report.rule_misses == 0
    assert report.parity is not None
