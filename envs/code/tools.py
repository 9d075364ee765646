"""The code env's tools: their JSON-schema declarations, and how a reply becomes one tool call.

A reply reaches the env as text. Families whose chat template declares tools give the env their first function call as
``{"name": ..., "arguments": {...}}`` JSON (`agentrl.chat.context.ChatContext.action_from_reply`). Models without tool
support in their template (SmolLM2's ChatML), and people at `agentrl play`, write the same calls as plain text instead:

    ```python                      -> run_python(code=...)
    print(2 + 2)
    ```

    ```bash                        -> run_shell(command=...)
    ls -la
    ```

    write_file solution.py         -> write_file(path="solution.py", content=...)
    ```python
    def f(x): ...
    ```

    read_file solution.py          -> read_file(path="solution.py")
    submit                         -> submit()

Both forms are parsed here into one `ToolCall`; anything else is a `ToolCallError` whose message tells the agent what
it may write (the env returns it as the observation: an unparseable reply never raises).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

__all__ = ["TOOLS", "TOOL_NAMES", "ToolCall", "ToolCallError", "parse_action", "tool_call_json", "tool_call_text",
           "ACTION_HELP"]


def _tool(name: str, description: str, properties: dict[str, Any], required: tuple[str, ...]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": list(required)}}}


TOOLS: tuple[dict[str, Any], ...] = (
    _tool("run_python", "Run a Python 3 program in the workspace and show its exit code, stdout and stderr.",
          {"code": {"type": "string", "description": "The program's source code."}}, ("code",)),
    _tool("run_shell", "Run a shell command (sh) in the workspace and show its exit code, stdout and stderr.",
          {"command": {"type": "string", "description": "The command line."}}, ("command",)),
    _tool("write_file", "Write a text file in the workspace (folders are created), replacing what was there.",
          {"path": {"type": "string", "description": "Path relative to the workspace, e.g. solution.py."},
           "content": {"type": "string", "description": "The whole new content of the file."}}, ("path", "content")),
    _tool("read_file", "Show a text file of the workspace.",
          {"path": {"type": "string", "description": "Path relative to the workspace."}}, ("path",)),
    _tool("submit", "Submit the workspace for grading by the hidden tests. Ends the episode.", {}, ()),
)
"""The tools, as OpenAI-style function declarations (what `info["tools"]` carries at reset)."""

TOOL_NAMES = tuple(t["function"]["name"] for t in TOOLS)
_ARGS = MappingProxyType({t["function"]["name"]: tuple(t["function"]["parameters"]["required"]) for t in TOOLS})

ACTION_HELP = (
    "Call one tool per reply: run_python(code), run_shell(command), write_file(path, content), read_file(path) or "
    "submit(). As a function call, or as text: a ```python``` block runs Python, a ```bash``` block runs a shell "
    "command, 'write_file PATH' followed by a ``` block writes a file, 'read_file PATH' shows one, 'submit' ends the "
    "episode and grades solution.py with the hidden tests."
)
"""What the agent is told when a reply is not a tool call."""


class ToolCallError(ValueError):
    """A reply that is not a tool call; the message says what was wrong and what to write instead."""


@dataclass(frozen=True)
class ToolCall:
    """One call: a tool name from `TOOL_NAMES` and its string arguments."""

    name: str
    arguments: MappingProxyType

    @classmethod
    def make(cls, name: str, arguments: Mapping[str, Any] | None = None) -> ToolCall:
        """A call whose arguments are checked against the tool's declaration (unknown arguments are dropped)."""
        arguments = dict(arguments or {})
        if name not in TOOL_NAMES:
            raise ToolCallError(f"unknown tool {name[:40]!r}. {ACTION_HELP}")
        missing = [a for a in _ARGS[name] if a not in arguments]
        if missing:
            raise ToolCallError(f"{name} needs the argument(s) {', '.join(missing)}. {ACTION_HELP}")
        bad = [a for a in _ARGS[name] if not isinstance(arguments[a], str)]
        if bad:
            raise ToolCallError(f"{name}: argument(s) {', '.join(bad)} must be strings")
        if any("\x00" in arguments[a] for a in _ARGS[name]):
            raise ToolCallError(f"{name}: arguments cannot contain NUL characters")
        if "path" in _ARGS[name] and not arguments["path"].strip():
            raise ToolCallError(f"{name}: path is empty; give a path relative to the workspace, e.g. solution.py")
        return cls(name, MappingProxyType({k: v for k, v in arguments.items() if k in _ARGS[name]}))


# A fence of three or more backticks, closed by the same number: content holding ``` is written with a longer one.
# Opening fences start a line and are a whole run of backticks, so a line of many backticks is tried once, not once
# per length and position (a hostile reply of 90,000 backticks took minutes before).
_FENCE = re.compile(r"^(?P<fence>`{3,})(?!`)(?P<lang>[A-Za-z0-9_+-]*)[^\n]*\n(?P<body>.*?)(?P=fence)(?!`)",
                    re.DOTALL | re.MULTILINE)
MAX_ACTION_CHARS = 100_000
"""The longest reply parsed; longer ones are refused (a served env's client decides the length, not a model)."""
# Blanks, not \s, around the words: \s matches newlines, and a reply of many blank lines made these patterns quadratic.
_PATH_LINE = re.compile(r"^[ \t]*(write_file|read_file)[ \t]+[`'\"]?([^\s`'\"]+)[`'\"]?[ \t]*$", re.MULTILINE)
_PYTHON_LANGS = ("python", "py", "python3", "")
_SHELL_LANGS = ("bash", "sh", "shell", "console")


def _from_json(text: str) -> ToolCall | None:
    start = text.find("{")
    if start < 0:
        return None
    try:
        value, _ = json.JSONDecoder().raw_decode(text[start:])
    except (json.JSONDecodeError, RecursionError):  # deep nesting is no call either
        return None
    if not isinstance(value, dict) or "name" not in value:
        return None
    args = value.get("arguments", value.get("parameters", {}))
    if isinstance(args, str):  # OpenAI's wire form: arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except (json.JSONDecodeError, RecursionError) as e:
            reason = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply"
            raise ToolCallError(f"the arguments of {str(value['name'])[:40]!r} are not valid JSON ({reason})") from None
    if not isinstance(args, dict):
        raise ToolCallError(f"arguments must be an object of strings, got {type(args).__name__}")
    return ToolCall.make(str(value["name"]), {str(k): v for k, v in args.items()})


def _from_text(text: str) -> ToolCall | None:
    path_line = _PATH_LINE.search(text)
    fence = _FENCE.search(text)
    if path_line and path_line.group(1) == "write_file":
        after = _FENCE.search(text, path_line.end())
        if after is None:
            raise ToolCallError("write_file PATH must be followed by the file's content in a ``` block")
        return ToolCall.make("write_file", {"path": path_line.group(2), "content": after.group("body")})
    if path_line and path_line.group(1) == "read_file" and (fence is None or path_line.start() < fence.start()):
        return ToolCall.make("read_file", {"path": path_line.group(2)})
    if fence is not None:
        lang = fence.group("lang").lower()
        body = fence.group("body")
        body = body[:-1] if body.endswith("\n") else body  # the newline before the closing fence is the fence's
        if lang in _PYTHON_LANGS:
            return ToolCall.make("run_python", {"code": body})
        if lang in _SHELL_LANGS:
            return ToolCall.make("run_shell", {"command": body})
        raise ToolCallError(f"a ```{lang[:20]} block is neither Python nor shell. {ACTION_HELP}")
    if re.fullmatch(r"\s*(submit(\(\))?\.?)\s*", text, flags=re.IGNORECASE) or re.search(
            r"^[ \t]*submit(\(\))?[ \t]*$", text, flags=re.MULTILINE):
        return ToolCall.make("submit")
    return None


def parse_action(action: str) -> ToolCall:
    """The tool call a reply makes: function-call JSON first, then the plain-text forms (module docstring).

    Raises:
        ToolCallError: the reply is no tool call; the message is meant for the agent.
    """
    if not isinstance(action, str) or not action.strip():
        raise ToolCallError(f"empty reply. {ACTION_HELP}")
    if len(action) > MAX_ACTION_CHARS:
        raise ToolCallError(f"the reply has {len(action)} characters; at most {MAX_ACTION_CHARS} are read")
    stripped = action.strip()
    call = _from_json(stripped) if stripped.startswith("{") else None
    if call is None:
        call = _from_text(action)
    if call is None:
        call = _from_json(stripped)
    if call is None:
        raise ToolCallError(f"no tool call found. {ACTION_HELP}")
    return call


def tool_call_json(name: str, **arguments: str) -> str:
    """A call as the function-call JSON a tool-calling family's parser gives the env."""
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)


def _fence_for(text: str) -> str:
    """Three backticks, or one more than the longest run of backticks in `text`."""
    runs = [len(m) for m in re.findall(r"`{3,}", text)]
    return "`" * (max(runs) + 1 if runs else 3)


def tool_call_text(name: str, **arguments: str) -> str:
    """A call in the plain-text form (for templates without tools, and for people)."""
    if name == "run_python":
        fence = _fence_for(arguments["code"])
        return f"{fence}python\n{arguments['code']}\n{fence}"
    if name == "run_shell":
        fence = _fence_for(arguments["command"])
        return f"{fence}bash\n{arguments['command']}\n{fence}"
    if name == "write_file":  # a file's content keeps its last newline, and gets one if it had none
        content = arguments["content"]
        fence = _fence_for(content)
        ending = "" if content.endswith("\n") else "\n"
        return f"write_file {arguments['path']}\n{fence}\n{content}{ending}{fence}"
    if name == "read_file":
        return f"read_file {arguments['path']}"
    if name == "submit":
        return "submit"
    raise ToolCallError(f"unknown tool {name!r}")
