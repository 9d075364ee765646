"""The code env's tools: declarations every tool-calling family renders, calls each family's parser reads back, and the
plain-text forms for templates without tools and for people."""

from __future__ import annotations

import json

import pytest

from agentrl.chat.context import ChatContext
from agentrl.chat.families import FAMILIES, get_family
from agentrl.chat.parsers import ToolCall as ParsedCall
from agentrl.envs.code.tools import (
    TOOL_NAMES,
    TOOLS,
    ToolCall,
    ToolCallError,
    parse_action,
    tool_call_json,
    tool_call_text,
)

CODE = 'def f(xs):\n    """Sum of "quoted" things."""\n    return sum(x for x in xs if x % 2 == 0)  # even\n'
CALLS = [
    ("run_python", {"code": "import solution\nprint(solution.f([1, 2, 3, 4]))"}),
    ("run_shell", {"command": "ls -la && echo 'done' | tr a-z A-Z"}),
    ("write_file", {"path": "solution.py", "content": CODE}),
    ("read_file", {"path": "solution.py"}),
    ("submit", {}),
]
TOOL_FAMILIES = [n for n, f in FAMILIES.items() if f.max_tool_calls]


@pytest.mark.parametrize("name,args", CALLS)
def test_json_and_text_forms_parse_to_the_same_call(name, args):
    want = ToolCall.make(name, args)
    assert parse_action(tool_call_json(name, **args)) == want
    assert parse_action(tool_call_text(name, **args)) == want


def test_openai_wire_form_with_string_arguments():
    action = json.dumps({"name": "run_shell", "arguments": json.dumps({"command": "echo hi"})})
    assert parse_action(action) == ToolCall.make("run_shell", {"command": "echo hi"})


@pytest.mark.parametrize("reply,needle", [
    ("", "empty reply"),
    ("I think the answer is 4.", "no tool call found"),
    ('{"name": "rm_rf", "arguments": {}}', "unknown tool"),
    ('{"name": "write_file", "arguments": {"path": "a.py"}}', "needs the argument(s) content"),
    ('{"name": "run_shell", "arguments": {"command": 3}}', "must be strings"),
    ('{"name": "run_shell", "arguments": "{not json"}', "not valid JSON"),
    ("write_file a.py\nno block here", "followed by the file's content"),
    ('{"name": "run_shell", "arguments": {"command": "ls\\u0000"}}', "NUL"),
    ('{"name": "read_file", "arguments": {"path": " "}}', "path is empty"),
    ("```ruby\nputs 1\n```", "neither Python nor shell"),
])
def test_replies_that_are_no_call_say_what_to_write(reply, needle):
    with pytest.raises(ToolCallError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        parse_action(reply)


def test_arguments_named_like_python_keywords_of_make_are_not_a_crash():
    call = parse_action('{"name": "run_python", "arguments": {"code": "print(1)", "name": "x", "cls": "y"}}')
    assert call == ToolCall.make("run_python", {"code": "print(1)"})


def test_content_holding_a_fence_round_trips_in_the_text_form():
    content = 'doc = """\n```python\nx = 1\n```\n"""\n'
    text = tool_call_text("write_file", path="README.py", content=content)
    assert text.startswith("write_file README.py\n````\n")
    assert parse_action(text) == ToolCall.make("write_file", {"path": "README.py", "content": content})


def test_prose_around_a_block_and_a_trailing_submit_line():
    assert parse_action("Let me check.\n```python\nprint(1)\n```\nThen I'll look.").name == "run_python"
    assert parse_action("All done.\nsubmit").name == "submit"
    assert parse_action("write_file `sol/a.py`\n```python\nx = 1\n```").arguments["path"] == "sol/a.py"


@pytest.mark.parametrize("family", TOOL_FAMILIES)
def test_every_tool_family_renders_the_tools_and_its_parser_reads_each_call_back(qwen3_tokenizer, family):
    """A scripted episode's calls, written in the family's own syntax, reach the env as the calls the expert made."""
    f = get_family(family)
    ctx = ChatContext(qwen3_tokenizer, "You are a programming agent.", {"thinking": True}, family=family)
    ctx.first_prompt("Write f in solution.py.", {"tools": [dict(t) for t in TOOLS]})
    declared = [name for name in TOOL_NAMES if name in ctx.text]
    # DeepSeek's official templates parse calls but never render declarations; the env's system prompt names the
    # tools in words, which is what those models get.
    assert declared == ([] if family.startswith("deepseek") else list(TOOL_NAMES)), family
    for name, args in CALLS:
        text = f.write_reply(ctx.messages, "", "", [ParsedCall(name, dict(args))], tools=ctx.tools, **ctx.chat_kwargs)
        ids = qwen3_tokenizer(text, add_special_tokens=False)["input_ids"]
        action = ctx.action_from_reply(ids)
        assert parse_action(action) == ToolCall.make(name, args), f"{family}: {name} did not round-trip"


@pytest.mark.parametrize("reply", [
    '{"name": ' + "[" * 30000 + "]" * 30000 + "}",  # nested past the JSON decoder's recursion limit
    '{"name": "run_shell", "arguments": "' + "[" * 30000 + '"}',
    "```" * 33000,  # a run of backticks: tried once as a fence, not once per length and position (it hung before)
    "x ```\n" * 16000,
    "\n" * 99_000 + "x",  # blank lines: the line patterns were quadratic in them
    " \n" * 49_000 + "x",
    "a" * 100_001,
])
def test_hostile_replies_are_refused_as_replies_not_crashes_or_hangs(reply):
    with pytest.raises(ToolCallError):
        parse_action(reply)
