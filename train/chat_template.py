"""The chat template every TRACE tiny model ships with, plus the helpers that must agree with it.

The template is Qwen3-style (``<|im_start|>role\\n...<|im_end|>\\n`` turns, tools listed in the system turn
inside ``<tools></tools>``, calls written as ``<tool_call>\\n{json}\\n</tool_call>``, tool results grouped into
one ``user`` turn of ``<tool_response>`` blocks) but has no ``<think>`` handling, so it is *append-only*:
rendering a conversation and then rendering it again with one more assistant turn gives the first render as
an exact prefix. Multi-turn RL depends on that (the tokens the policy generated are the tokens it is trained
on). Each assistant turn's generated part (content, tool calls, ``<|im_end|>``) sits inside
``{% generation %}`` so ``apply_chat_template(..., return_assistant_tokens_mask=True)`` marks it.

Tool-call arguments given as a dict are written with ``tojson`` (``json.dumps`` with ``", "``/``": "``
separators, non-ASCII kept); arguments given as a string are written verbatim, exactly as a model produced
them. ``render_tool_call`` produces the same bytes, so demonstrations and parsers can share the format.

Adding one more ``tool`` message right after a rendered ``tool`` message is NOT append-only (the grouped
``user`` turn closes after the last tool message); give all results of one step together.
"""

from __future__ import annotations

from typing import Any

# The tool-call format lives with its parser in the game protocol (environments must not import train/);
# the template below writes the same bytes, and tests check that it does.
from game_registry import render_tool_call  # noqa: F401  (re-exported: the format's helpers live together)

# Literal pieces of the format, shared with the tokenizer builder (these become single tokens).
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
# Added but not "special": decode(skip_special_tokens=True) keeps them, so parsers still see tool calls.
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<tools>", "</tools>")

# Text between an assistant's content and its first call, and between consecutive calls.
TOOL_CALL_SEPARATOR = "\n"
# What `add_generation_prompt=True` appends: the model generates right after it.
GENERATION_PROMPT = IM_START + "assistant\n"

# Jinja notes: transformers compiles templates with trim_blocks/lstrip_blocks, and every tag below also uses
# `-` whitespace control, so the only text emitted is what the `{{ '...' }}` expressions write. That keeps
# the output byte-exact and independent of how this file is indented.
_TEMPLATE_SKELETON = r"""
{#- TRACE tiny-model chat template (Qwen3-style, no think blocks, append-only). -#}
{%- macro render_content(content) -%}
    {%- if content is none or content is undefined -%}
    {%- elif content is string -%}
        {{- content -}}
    {%- elif content is mapping -%}
        {{- content | tojson -}}
    {%- elif content is iterable -%}
        {%- for part in content -%}
            {%- if part is string -%}
                {{- part -}}
            {%- elif part is mapping and part.text is defined and part.text is string -%}
                {{- part.text -}}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{- content | string -}}
    {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(first=0) -%}
{%- if messages and messages[0].role == 'system' -%}
    {%- set ns.first = 1 -%}
{%- endif -%}
{%- if tools or ns.first == 1 -%}
    {{- '<|im_start|>system\n' -}}
    {%- if ns.first == 1 -%}
        {{- render_content(messages[0].content) -}}
        {%- if tools -%}
            {{- '\n\n' -}}
        {%- endif -%}
    {%- endif -%}
@@TOOLS_BLOCK@@    {%- endif -%}
    {{- '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages[ns.first:] -%}
    {%- if message.role == 'assistant' -%}
        {{- '<|im_start|>assistant\n' -}}
        {%- generation -%}
            {%- set text = render_content(message.content) -%}
            {{- text -}}
            {%- if message.tool_calls is defined and message.tool_calls is not none -%}
                {%- for call in message.tool_calls -%}
                    {%- if call.function is defined and call.function is mapping -%}
                        {%- set fn = call.function -%}
                    {%- else -%}
                        {%- set fn = call -%}
                    {%- endif -%}
                    {%- if fn.name is not defined or fn.name is not string -%}
                        {{- raise_exception('every tool call needs a string "name"') -}}
                    {%- endif -%}
                    {%- if text or not loop.first -%}
                        {{- '\n' -}}
                    {%- endif -%}
                    {{- '<tool_call>\n{"name": ' -}}
                    {{- fn.name | tojson -}}
                    {{- ', "arguments": ' -}}
                    {%- if fn.arguments is string -%}
                        {{- fn.arguments -}}
                    {%- elif fn.arguments is mapping -%}
                        {{- fn.arguments | tojson -}}
                    {%- elif fn.arguments is not defined or fn.arguments is none -%}
                        {{- '{}' -}}
                    {%- else -%}
                        {{- raise_exception('tool-call "arguments" must be an object or a JSON string') -}}
                    {%- endif -%}
                    {{- '}\n</tool_call>' -}}
                {%- endfor -%}
            {%- endif -%}
            {{- '<|im_end|>' -}}
        {%- endgeneration -%}
        {{- '\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or loop.previtem.role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\n<tool_response>\n' -}}
        {{- render_content(message.content) -}}
        {{- '\n</tool_response>' -}}
        {%- if loop.last or loop.nextitem.role != 'tool' -%}
            {{- '<|im_end|>\n' -}}
        {%- endif -%}
    {%- else -%}
        {{- '<|im_start|>' + message.role + '\n' -}}
        {{- render_content(message.content) -}}
        {{- '<|im_end|>\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
""".strip()

# How the system turn lists the tools. "full": every JSON schema (Qwen3's wording); "compact": one line per
# tool, `name(arg, ...)`, required arguments first, descriptions and types dropped. (Each block opens the
# `if tools` that the skeleton closes.) The tiny CPU-demo model
# sees the same tools and calls either way; compact saves ~1,300 of a storefront episode's ~1,900 tokens.
_FULL_TOOLS_BLOCK = r"""
    {%- if tools -%}
        {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
        {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
        {%- for tool in tools -%}
            {{- '\n' -}}
            {{- tool | tojson -}}
        {%- endfor -%}
        {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments ' -}}
        {{- 'within <tool_call></tool_call> XML tags:\n<tool_call>\n' -}}
        {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' -}}
""".strip("\n")
_COMPACT_TOOLS_BLOCK = r"""
    {%- if tools -%}
        {{- '# Tools\n<tools>' -}}
        {%- for tool in tools -%}
            {%- set fn = tool.function if tool.function is defined and tool.function is mapping else tool -%}
            {%- set params = fn.parameters if fn.parameters is defined and fn.parameters is mapping else {} -%}
            {%- set props = params.properties if params.properties is defined and params.properties is mapping else {} -%}
            {%- set required = params.required if params.required is defined and params.required is iterable else [] -%}
            {{- '\n' + fn.name + '(' -}}
            {%- set ns2 = namespace(names=[]) -%}
            {%- for name in required if name in props -%}
                {%- set ns2.names = ns2.names + [name] -%}
            {%- endfor -%}
            {%- for name in props if name not in required -%}
                {%- set ns2.names = ns2.names + [name] -%}
            {%- endfor -%}
            {{- ns2.names | join(', ') -}}
            {{- ')' -}}
        {%- endfor -%}
        {{- '\n</tools>\nCall a tool with <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' -}}
""".strip("\n")
TOOLS_VIEWS = ("full", "compact")


def chat_template(tools_view: str = "full") -> str:
    """The template with the tools listed `tools_view`-style (see TOOLS_VIEWS)."""
    if tools_view not in TOOLS_VIEWS:
        raise ValueError(f"tools_view must be one of {', '.join(TOOLS_VIEWS)}, got {tools_view!r}")
    block = _FULL_TOOLS_BLOCK if tools_view == "full" else _COMPACT_TOOLS_BLOCK
    return _TEMPLATE_SKELETON.replace("@@TOOLS_BLOCK@@", block + "\n")


CHAT_TEMPLATE = chat_template("full")


def render_chat(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = False,
    tools_view: str = "full",
) -> str:
    """Render `messages` (and optional tool schemas) with `chat_template(tools_view)`, without a tokenizer.

    Gives the same string as `tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)` for a
    tokenizer carrying CHAT_TEMPLATE (keys whose value is None are dropped first, as transformers does).
    """
    # Imported here so importing the template constant does not pull in transformers.
    from transformers.utils.chat_template_utils import render_jinja_template

    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError("messages must be a list of dicts like {'role': 'user', 'content': '...'}")
    cleaned = [{key: value for key, value in message.items() if value is not None} for message in messages]
    rendered, _ = render_jinja_template(
        conversations=[cleaned],
        tools=tools or None,
        chat_template=chat_template(tools_view),
        add_generation_prompt=add_generation_prompt,
    )
    return rendered[0]
