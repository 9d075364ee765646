r"""A tool-calling math agent written with the official `openai` client only, trained by agentrl as it is.

Nothing here imports agentrl: the agent gets a task and an OpenAI-compatible ``base_url`` and talks to the policy the
way it would talk to any chat-completions endpoint. It offers the model a ``calculator`` tool, runs the calls the
model makes, hands its answer to the env (``task.step``) and, when the env says the answer is wrong (math's
``mode=multi``), passes the feedback back as a user message and lets the model try again.

Train it, from the repository root (two CPU steps on a tiny random model, about 15 s: a smoke run, not a result;
vLLM's CPU build does not serve tiny-qwen3, so the HF engine is named rather than probed for):

    agentrl run --agent examples/math_tool_agent.py:run --env math --env-arg mode=multi --env-arg max_turns=3 \
        --model tiny-qwen3 --engine hf --steps 2 --prompts-per-step 2 --group-size 2 --max-new-tokens 16 \
        --output runs/agent-smoke

Serve a model and point it at the endpoint yourself (any OpenAI-compatible server works the same):

    agentrl serve --model smollm2-135m --port 8000
"""

from __future__ import annotations

import ast
import json
import operator

from openai import OpenAI

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / ** and parentheses.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
MAX_CALLS = 6  # model calls per episode, tool rounds included
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def calculate(expression: str) -> str:
    """The value of an arithmetic expression, or why it has none (what the tool answers the model)."""

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError("only numbers and + - * / ** ( ) are allowed")

    try:
        result = value(ast.parse(str(expression), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError) as e:
        return f"error: {e}"
    return str(int(result)) if float(result).is_integer() else f"{result:.6g}"


def _arguments(raw: str) -> dict:
    try:
        args = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return {}
    return args if isinstance(args, dict) else {}


def run(task, base_url: str) -> None:
    """Play one episode; the env scores it (the agent returns None)."""
    client = OpenAI(base_url=base_url, api_key=task.api_key)
    messages = [
        {"role": "system", "content": f"{task.system_prompt} You can use the calculator tool.".strip()},
        {"role": "user", "content": task.prompt},
    ]
    for _ in range(MAX_CALLS):
        reply = client.chat.completions.create(model=task.model, messages=messages, tools=[CALCULATOR])
        message = reply.choices[0].message
        messages.append(message)  # handed back as returned, as agents usually do
        if message.tool_calls:
            for call in message.tool_calls:
                expression = _arguments(call.function.arguments).get("expression", "")
                messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(expression)})
            continue
        outcome = task.step(message.content or "")
        if outcome.terminated or outcome.truncated:
            return None
        messages.append({"role": "user", "content": outcome.observation})
    if not task.done:  # out of calls without an answer the env accepted: the env scores an empty answer
        task.step("")
    return None
