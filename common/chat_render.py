"""One way to turn (messages, tool schemas) into a prompt string for any tokenizer: its own chat template, with
tools rendered by the project (Hermes style) when that template cannot render them.

Many real chat templates (SmolLM2's plain ChatML among them) take no `tools` argument, drop `tool_calls` and
write a `tool` turn as an unknown role, or fail on an assistant message whose content is None. For those,
`render_messages` rewrites the conversation into plain text turns first and lets the model's own template
frame them:

- tool schemas go at the end of the system turn, in `<tools></tools>` (one JSON schema a line) with the
  instruction to answer in `<tool_call>` blocks (a system turn is created when there is none);
- an assistant turn's tool calls become its text: `content + "\\n" + "\\n".join(render_tool_call(...))`;
- consecutive `tool` results become one `user` turn of `<tool_response>` blocks.

These are the same bytes train/chat_template.py's template writes natively (tests check it), so a model sees
one format whichever template it ships, and game_registry.parse_hermes_action reads its answers. Every agent
(train/agents.py), the trainer (train/episodes.py's ChatTokenizer) and the gate server render with it.

Lives in common/ because environments (benchmarks/) must not import train/.
"""
from __future__ import annotations

import json
from typing import Any

from game_registry import render_tool_call

# The text around the tool schemas in the system turn (train/chat_template.py's template writes the same).
TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)

# Sentinels of the probe render: a template renders tools natively only if all three reach its output.
_PROBE_SCHEMA, _PROBE_CALL, _PROBE_RESULT = "trace_probe_schema_fn", "trace_probe_called_fn", "trace_probe_result_text"
_PROBE_MESSAGES = [
    {"role": "system", "content": "probe"},
    {"role": "user", "content": "probe"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"type": "function", "function": {"name": _PROBE_CALL, "arguments": {"x": 1}}}]},
    {"role": "tool", "content": _PROBE_RESULT},
]
_PROBE_TOOLS = [{"type": "function", "function": {
    "name": _PROBE_SCHEMA, "description": "probe", "parameters": {"type": "object", "properties": {}}}}]

# chat template source -> renders tools natively (the answer depends on the template text only).
_NATIVE_CACHE: dict[str, bool] = {}


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's own chat template renders tool schemas, tool calls and tool results.

    Decided by rendering a probe conversation once per template: a template that raises on it, or whose
    output lacks the probe's schema name, call name or result text, does not.
    """
    from jinja2 import TemplateError

    key = repr(tokenizer.chat_template)
    if key not in _NATIVE_CACHE:
        try:
            text = tokenizer.apply_chat_template(_PROBE_MESSAGES, tools=_PROBE_TOOLS, tokenize=False)
        except (TemplateError, TypeError, ValueError, KeyError):  # e.g. '+' on None content, unknown role
            _NATIVE_CACHE[key] = False
        else:
            _NATIVE_CACHE[key] = isinstance(text, str) and all(s in text for s in (_PROBE_SCHEMA, _PROBE_CALL, _PROBE_RESULT))
    return _NATIVE_CACHE[key]


def content_text(content: Any) -> str:
    """A message's content as text: strings as is, None as "", a list of parts joined, a dict as JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        return json.dumps(content, ensure_ascii=False)
    if isinstance(content, (list, tuple)):
        return "".join(part if isinstance(part, str) else str(part["text"])
                       for part in content if isinstance(part, str) or (isinstance(part, dict) and "text" in part))
    return str(content)


def tools_system_text(tools: list[dict[str, Any]]) -> str:
    """The `<tools>` block the system turn ends with."""
    return TOOLS_HEADER + "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools) + TOOLS_FOOTER


def assistant_text(message: dict[str, Any]) -> str:
    """An assistant turn's full text: its content, then each tool call as a `<tool_call>` block."""
    text = content_text(message.get("content"))
    parts = [text] if text else []
    for call in message.get("tool_calls") or []:
        function = call["function"] if isinstance(call.get("function"), dict) else call
        arguments = function.get("arguments")
        parts.append(render_tool_call(function.get("name"), {} if arguments is None else arguments))
    return "\n".join(parts)


def to_hermes_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, str]]:
    """`messages` rewritten as plain {role, content} text turns with tools, calls and results in Hermes style."""
    out: list[dict[str, str]] = []
    rest = messages
    if messages and messages[0].get("role") == "system":
        system = content_text(messages[0].get("content"))
        rest = messages[1:]
    else:
        system = None
    if tools:
        system = (system + "\n\n" if system is not None else "") + tools_system_text(tools)
    if system is not None:
        out.append({"role": "system", "content": system})
    index = 0
    while index < len(rest):
        message = rest[index]
        role = message.get("role")
        if role == "tool":  # consecutive results share one user turn, as Qwen/Hermes templates group them
            blocks = []
            while index < len(rest) and rest[index].get("role") == "tool":
                blocks.append("<tool_response>\n" + content_text(rest[index].get("content")) + "\n</tool_response>")
                index += 1
            out.append({"role": "user", "content": "\n".join(blocks)})
            continue
        if role == "assistant":
            out.append({"role": "assistant", "content": assistant_text(message)})
        else:
            out.append({"role": str(role), "content": content_text(message.get("content"))})
        index += 1
    return out


def render_messages(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                    *, add_generation_prompt: bool) -> str:
    """The prompt text of `messages` (+ tool schemas) under the tokenizer's chat template.

    Templates that render tools natively get the messages as they are (None-valued keys dropped, as some
    templates need); the others get `to_hermes_messages(messages, tools)` and no `tools` argument.
    """
    if not tokenizer.chat_template:
        raise ValueError("the tokenizer has no chat template; set one (tokenizer.chat_template = ...) or use a "
                         "model folder whose tokenizer_config.json / chat_template.jinja has one")
    if template_renders_tools(tokenizer):
        cleaned = [{k: v for k, v in m.items() if v is not None} for m in messages]
        return tokenizer.apply_chat_template(cleaned, tools=tools or None, tokenize=False,
                                             add_generation_prompt=add_generation_prompt)
    return tokenizer.apply_chat_template(to_hermes_messages(messages, tools), tokenize=False,
                                         add_generation_prompt=add_generation_prompt)
