"""common/chat_render.py: tools rendered Hermes-style by the project when a chat template cannot render them.

The tiny model's tokenizer is used twice: with its own template (which renders tools natively) and with a
plain ChatML template like SmolLM2's (no `tools`, content concatenated with '+'). Both must give the same
bytes, so a model sees one tool format whichever template it ships.
"""
from __future__ import annotations

import copy

import pytest

from common.chat_render import render_messages, template_renders_tools, to_hermes_messages
from game_registry import parse_hermes_action

# SmolLM2-135M-Instruct's own template (from its GGUF): ChatML, no tools, a default system turn.
PLAIN_CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

TOOLS = [{"type": "function", "function": {"name": "get_order", "description": "Look up an order.",
          "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}}]
CONVERSATION = [
    {"role": "system", "content": "You are a store agent."},
    {"role": "user", "content": "Where is order #W12? Café order."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "get_order", "arguments": {"order_id": "#W12"}}}]},
    {"role": "tool", "content": '{"status": "shipped"}'},
    {"role": "assistant", "content": "Checking both.", "tool_calls": [
        {"type": "function", "function": {"name": "get_order", "arguments": '{"order_id": "#W1"}'}},
        {"type": "function", "function": {"name": "get_order", "arguments": {"order_id": "#W2"}}}]},
    {"role": "tool", "content": "not found"},
    {"role": "tool", "content": '{"status": "pending"}'},
    {"role": "assistant", "content": "It has shipped."},
    {"role": "user", "content": "Thanks."},
]


@pytest.fixture()
def tokenizers(tiny_model_dir):
    from transformers import AutoTokenizer

    native = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    plain = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    plain.chat_template = PLAIN_CHATML
    return native, plain


def test_the_probe_tells_a_tool_template_from_plain_chatml(tokenizers):
    native, plain = tokenizers
    assert template_renders_tools(native)
    assert not template_renders_tools(plain)


@pytest.mark.parametrize("n_messages", [2, 3, 4, 7, 8, len(CONVERSATION)])
@pytest.mark.parametrize("generation_prompt", [False, True])
def test_fallback_over_plain_chatml_writes_the_native_template_bytes(tokenizers, n_messages, generation_prompt):
    native, plain = tokenizers
    messages = copy.deepcopy(CONVERSATION[:n_messages])
    expected = render_messages(native, messages, TOOLS, add_generation_prompt=generation_prompt)
    assert render_messages(plain, messages, TOOLS, add_generation_prompt=generation_prompt) == expected
    assert messages == CONVERSATION[:n_messages]  # the caller's messages are not modified


def test_fallback_text_parses_back_to_the_calls(tokenizers):
    _, plain = tokenizers
    turns = to_hermes_messages(CONVERSATION, TOOLS)
    assert [t["role"] for t in turns] == ["system", "user", "assistant", "user", "assistant", "user", "assistant", "user"]
    assert turns[0]["content"].startswith("You are a store agent.\n\n# Tools") and '"get_order"' in turns[0]["content"]
    assert turns[5]["content"] == ("<tool_response>\nnot found\n</tool_response>\n"
                                   '<tool_response>\n{"status": "pending"}\n</tool_response>')
    action = parse_hermes_action(turns[4]["content"])
    assert action.kind == "tool_call" and [c.arguments for c in action.tool_calls] == [{"order_id": "#W1"}, {"order_id": "#W2"}]


def test_without_a_system_turn_the_tools_make_one_and_without_tools_the_template_default_stays(tokenizers):
    _, plain = tokenizers
    with_tools = render_messages(plain, [{"role": "user", "content": "hi"}], TOOLS, add_generation_prompt=True)
    assert with_tools.startswith("<|im_start|>system\n# Tools") and "SmolLM" not in with_tools
    without = render_messages(plain, [{"role": "user", "content": "hi"}], None, add_generation_prompt=True)
    assert without.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_a_tokenizer_without_a_template_fails_with_the_fix(tokenizers):
    _, plain = tokenizers
    plain.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        render_messages(plain, CONVERSATION, TOOLS, add_generation_prompt=True)
