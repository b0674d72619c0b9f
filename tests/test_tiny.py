"""Tests for the tiny-model builder (train/tiny.py) and the chat template (train/chat_template.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from jinja2.exceptions import TemplateError
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from train.chat_template import (
    GENERATION_PROMPT,
    SPECIAL_TOKENS,
    TOOL_TOKENS,
    render_chat,
    render_tool_call,
)
from train.tiny import BUILD_INFO_FILE, TinyModelConfig, build_tiny_model, main

REPO_ROOT = Path(__file__).resolve().parents[1]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order_details",
            "description": "Get the status and details of an order.",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
]

# A conversation exercising every message shape: system, user, assistant with no content and two calls
# (nested OpenAI form and flat tau2 form), two consecutive tool results, assistant with text and a call.
CONVERSATION = [
    {"role": "system", "content": "You are a retail agent."},
    {"role": "user", "content": "Where is order #W2378156? Also what is 17 * 23?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_order_details", "arguments": {"order_id": "#W2378156"}},
            },
            {"id": "c2", "name": "calculate", "arguments": {"expression": "17 * 23"}, "requestor": "assistant"},
        ],
    },
    {"role": "tool", "id": "c1", "content": '{"order_id": "#W2378156", "status": "delivered"}'},
    {"role": "tool", "id": "c2", "content": "391"},
    {
        "role": "assistant",
        "content": "Let me double-check the total.",
        "tool_calls": [
            {"type": "function", "function": {"name": "calculate", "arguments": '{"expression": "391 + 0"}'}}
        ],
    },
    {"role": "tool", "content": "391"},
    {"role": "assistant", "content": "Your order was delivered, and 17 × 23 = 391."},
]


def _assistant_generated_text(message: dict) -> str:
    """What the model is expected to generate for one assistant message (template contract)."""
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call)
        calls.append(render_tool_call(function["name"], function["arguments"]))
    content = message.get("content") or ""
    body = content + ("\n" if content and calls else "") + "\n".join(calls)
    return body + "<|im_end|>"


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


# ----------------------------------------------------------------------------------------- CLI + offline


@pytest.mark.slow  # ~9 s: two subprocesses; the session fixture builds the same model in-process
def test_cli_builds_a_model_that_loads_offline(tiny_model_dir, tmp_path):
    """`python -m train.tiny` in a subprocess, then an offline load + forward pass in another one.

    Built with the same sizes and seed as the session fixture (built in this process), so the files must
    match exactly: that is the cross-process determinism check.
    """
    info = json.loads((tiny_model_dir / BUILD_INFO_FILE).read_text())["config"]
    out = tmp_path / "cli_model"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    command = [
        sys.executable,
        "-m",
        "train.tiny",
        "--out",
        str(out),
        "--vocab",
        str(info["vocab_size"]),
        "--hidden",
        str(info["hidden_size"]),
        "--layers",
        str(info["num_layers"]),
        "--heads",
        str(info["num_heads"]),
        "--seed",
        str(info["seed"]),
    ]
    built = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    assert built.stdout.strip() == str(out)
    for name in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        BUILD_INFO_FILE,
    ):
        assert (out / name).is_file(), name
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "staging folder left behind"

    loader = (
        "import json, sys, torch\n"
        "from transformers import AutoTokenizer, AutoModelForCausalLM\n"
        "tok = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "model = AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
        "batch = tok(['hello world', 'a longer piece of text here'], return_tensors='pt', padding=True)\n"
        "logits = model(**batch).logits\n"
        "print(json.dumps({'cls': type(model).__name__, 'dtype': str(model.dtype), 'shape': list(logits.shape),\n"
        "  'vocab': len(tok), 'finite': bool(torch.isfinite(logits).all()), 'eos': tok.eos_token,\n"
        "  'tied': model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()}))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", loader, str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert loaded.returncode == 0, loaded.stderr
    report = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert report["cls"] == "Qwen3ForCausalLM"
    assert report["dtype"] == "torch.float32"
    assert report["shape"][0] == 2 and report["shape"][2] == report["vocab"]
    assert report["finite"] and report["tied"] and report["eos"] == "<|im_end|>"

    # Same inputs, different process -> byte-identical tokenizer and identical weights.
    assert (out / "tokenizer.json").read_bytes() == (tiny_model_dir / "tokenizer.json").read_bytes()
    ours, theirs = load_file(out / "model.safetensors"), load_file(tiny_model_dir / "model.safetensors")
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)


def test_cli_corpus_files_jsonl_and_text(tmp_path):
    chat = {
        "messages": [
            {"role": "user", "content": "quokkaburger please"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"type": "function", "function": {"name": "order_quokkaburger", "arguments": {"count": 2}}}
                ],
            },
            {"role": "tool", "content": "quokkaburger ordered"},
            {"role": "assistant", "content": "Your quokkaburger is on its way."},
        ],
        "tools": [{"type": "function", "function": {"name": "order_quokkaburger", "parameters": {"type": "object"}}}],
    }
    chats = tmp_path / "chats.jsonl"
    chats.write_text("\n".join(json.dumps(chat) for _ in range(5)) + "\n")
    notes = tmp_path / "notes.txt"
    notes.write_text("The wombatcopter flies over the quokkaburger stand. " * 5)
    out = tmp_path / "model"
    code = main(
        [
            "--out",
            str(out),
            "--corpus",
            str(chats),
            str(notes),
            "--vocab",
            "1024",
            "--hidden",
            "32",
            "--layers",
            "1",
            "--heads",
            "2",
        ]
    )
    assert code == 0
    info = json.loads((out / BUILD_INFO_FILE).read_text())
    assert [f["kind"] for f in info["corpus"]["files"]] == ["chats", "text"]
    tok = AutoTokenizer.from_pretrained(out)
    # Tiny corpus: BPE runs out of repeated pairs long before 1024 (that is allowed).
    assert len(tok) < 1024 and info["tokenizer_vocab_size"] == len(tok)
    # Words frequent only in these files became single tokens, so the files were really used...
    assert len(tok.encode(" quokkaburger")) == 1
    assert len(tok.encode(" wombatcopter")) == 1
    # ...and the rendered chat format was learned too (role header with its newline).
    assert len(tok.encode("assistant\n")) <= 2


def test_cli_rejects_bad_input_and_writes_nothing(tmp_path, capsys):
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{not json\n')
    out = tmp_path / "model"
    assert main(["--out", str(out), "--corpus", str(broken)]) == 2
    assert "broken.jsonl" in capsys.readouterr().err
    assert not out.exists()

    no_messages = tmp_path / "no_messages.jsonl"
    no_messages.write_text('{"text": "hi"}\n')
    assert main(["--out", str(out), "--corpus", str(no_messages)]) == 2
    assert "messages" in capsys.readouterr().err

    bad_arguments = tmp_path / "bad_arguments.jsonl"
    bad_arguments.write_text(
        json.dumps({"messages": [{"role": "assistant", "tool_calls": [{"name": "f", "arguments": [1]}]}]})
    )
    assert main(["--out", str(out), "--corpus", str(bad_arguments)]) == 2
    assert "bad_arguments.jsonl: record 1" in capsys.readouterr().err

    assert main(["--out", str(out), "--corpus", str(tmp_path / "missing.txt")]) == 2
    assert "missing.txt" in capsys.readouterr().err

    assert main(["--out", str(out), "--hidden", "100", "--heads", "3"]) == 2
    assert "divisible" in capsys.readouterr().err

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("not a model")
    assert main(["--out", str(foreign), "--vocab", "300", "--hidden", "16", "--layers", "1", "--heads", "2"]) == 2
    assert "not built by train.tiny" in capsys.readouterr().err
    assert sorted(p.name for p in foreign.iterdir()) == ["keep.txt"]
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "bad_arguments.jsonl",
        "broken.jsonl",
        "foreign",
        "no_messages.jsonl",
    ]


def test_config_validation_messages():
    with pytest.raises(ValueError, match="minimum"):
        TinyModelConfig(vocab_size=100)
    with pytest.raises(ValueError, match="even"):
        TinyModelConfig(hidden_size=36, num_heads=4)  # head_dim 9
    with pytest.raises(ValueError, match="num_kv_heads"):
        TinyModelConfig(num_heads=4, num_kv_heads=3)
    config = TinyModelConfig()
    assert (config.hidden_size, config.intermediate_size, config.num_layers, config.vocab_size) == (192, 576, 4, 1024)
    assert config.head_dim * config.num_heads == config.hidden_size


# ----------------------------------------------------------------------------------------- determinism


def test_same_seed_same_files_other_seed_other_weights(tmp_path):
    sizes = {"vocab_size": 320, "hidden_size": 16, "num_layers": 1, "num_heads": 2}
    first = build_tiny_model(tmp_path / "a", seed=3, **sizes)
    first_tokenizer = (first / "tokenizer.json").read_bytes()
    first_weights = load_file(first / "model.safetensors")
    # Rebuilding into the same folder replaces the earlier build.
    again = build_tiny_model(tmp_path / "a", seed=3, **sizes)
    other = build_tiny_model(tmp_path / "b", seed=4, **sizes)
    assert (again / "tokenizer.json").read_bytes() == first_tokenizer
    again_weights, other_weights = load_file(again / "model.safetensors"), load_file(other / "model.safetensors")
    assert all(torch.equal(first_weights[k], again_weights[k]) for k in first_weights)
    # The seed changes only the weights: the built-in corpus (hence the tokenizer) is fixed.
    assert (other / "tokenizer.json").read_bytes() == first_tokenizer
    assert not torch.equal(first_weights["model.embed_tokens.weight"], other_weights["model.embed_tokens.weight"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


# ----------------------------------------------------------------------------------------- tokenizer


def test_vocab_and_chat_tokens(tok, tiny_model_dir):
    target = json.loads((tiny_model_dir / BUILD_INFO_FILE).read_text())["config"]["vocab_size"]
    assert 300 <= len(tok) <= target
    vocab = tok.get_vocab()
    for token in SPECIAL_TOKENS + TOOL_TOKENS:
        assert token in vocab
        assert tok.encode(token) == [vocab[token]], f"{token} is not a single token"
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    text = '<|im_start|>assistant\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>'
    kept = tok.decode(tok.encode(text), skip_special_tokens=True)
    assert kept == 'assistant\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    # Common JSON / tool-call pieces were learned as merges, not left as single bytes.
    call = '{"name": "calculate", "arguments": {"expression": "2 + 2"}}'
    assert len(tok.encode(call)) < len(call) / 2

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.vocab_size == len(tok)
    assert model.generation_config.eos_token_id == vocab["<|im_end|>"]
    assert model.generation_config.pad_token_id == vocab["<|endoftext|>"]


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world! The order #W2378156 costs $391.50.",
        '{"user_id": "james_lee_6136", "items": [1, 22, 333]}\n\tindented  double  spaces  ',
        "Zürich → 東京 ✈️ naïve café — ½ 🙂\r\nend",
        "\x00\x01 control bytes and trailing newline\n",
    ],
)
def test_round_trip_is_lossless(tok, text):
    ids = tok.encode(text)
    assert tok.unk_token_id is None or tok.unk_token_id not in ids
    assert tok.decode(ids) == text


# ----------------------------------------------------------------------------------------- chat template


def test_tokenizer_template_matches_render_chat(tok):
    assert tok.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False) == render_chat(CONVERSATION, TOOLS)


def test_tools_and_tool_calls_render_in_the_documented_format():
    text = render_chat(CONVERSATION, TOOLS)
    system_turn = text.split("<|im_end|>")[0]
    assert system_turn.startswith("<|im_start|>system\nYou are a retail agent.\n\n")
    schema_block = system_turn.split("<tools>\n")[1].split("\n</tools>")[0]
    assert [json.loads(line) for line in schema_block.split("\n")] == TOOLS
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' in system_turn

    # Nested and flat call forms give the same text; string arguments are kept verbatim.
    first_turn = (
        "<|im_start|>assistant\n"
        + render_tool_call("get_order_details", {"order_id": "#W2378156"})
        + "\n"
        + render_tool_call("calculate", {"expression": "17 * 23"})
        + "<|im_end|>\n"
    )
    assert first_turn in text
    assert (
        'Let me double-check the total.\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "391 + 0"}}'
        "\n</tool_call><|im_end|>"
    ) in text
    # The two consecutive tool results form ONE user turn.
    assert (
        '<|im_start|>user\n<tool_response>\n{"order_id": "#W2378156", "status": "delivered"}\n</tool_response>'
        "\n<tool_response>\n391\n</tool_response><|im_end|>\n"
    ) in text
    assert text.count("<|im_start|>user") == 3
    assert "<think>" not in text
    assert render_chat(CONVERSATION[1:2], add_generation_prompt=True).endswith(GENERATION_PROMPT)
    # Without tools and without a system message there is no system turn.
    assert render_chat(CONVERSATION[1:2]).startswith("<|im_start|>user\n")


def test_render_tool_call_matches_json_and_rejects_bad_arguments():
    text = render_tool_call("book", {"city": "Zürich", "n": [1, 2], "ok": True})
    assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>")
    payload = json.loads(text[len("<tool_call>\n") : -len("\n</tool_call>")])
    assert payload == {"name": "book", "arguments": {"city": "Zürich", "n": [1, 2], "ok": True}}
    assert "Zürich" in text  # non-ASCII kept, like the template's tojson
    with pytest.raises(ValueError, match="dict or a JSON string"):
        render_tool_call("book", [1, 2])
    with pytest.raises(ValueError, match="name"):
        render_tool_call("", {})
    # The template refuses the same malformed calls instead of writing something the model never saw.
    with pytest.raises(TemplateError, match="arguments"):
        render_chat([{"role": "assistant", "tool_calls": [{"name": "f", "arguments": [1, 2]}]}])
    with pytest.raises(TemplateError, match="name"):
        render_chat([{"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}])
    no_arguments = render_chat([{"role": "assistant", "tool_calls": [{"name": "f"}]}])
    assert render_tool_call("f", {}) + "<|im_end|>" in no_arguments


def test_rendering_is_append_only_at_text_and_token_level(tok):
    """Each prefix of the conversation ending before an assistant turn, rendered with the generation prompt,
    is an exact prefix of the full render, as text and as token ids."""
    full_text = render_chat(CONVERSATION, TOOLS)
    full_ids = tok.encode(full_text)
    checked = 0
    for cut, message in enumerate(CONVERSATION):
        if message["role"] != "assistant":
            continue
        prompt = render_chat(CONVERSATION[:cut], TOOLS, add_generation_prompt=True)
        with_turn = render_chat(CONVERSATION[: cut + 1], TOOLS)
        assert with_turn == prompt + _assistant_generated_text(message) + "\n"
        assert full_text.startswith(with_turn)
        prompt_ids = tok.encode(prompt)
        assert full_ids[: len(prompt_ids)] == prompt_ids
        # Prompt tokens + separately encoded generation == encoding of the whole turn (what RL trains on).
        generated_ids = tok.encode(_assistant_generated_text(message))
        assert tok.encode(with_turn)[: len(prompt_ids) + len(generated_ids)] == prompt_ids + generated_ids
        checked += 1
    assert checked == 3


def test_assistant_mask_covers_exactly_the_assistant_tokens(tok):
    out = tok.apply_chat_template(
        CONVERSATION, tools=TOOLS, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = out["input_ids"], out["assistant_masks"]
    assert len(ids) == len(mask) and set(mask) == {0, 1}
    # Split the ids into maximal runs of equal mask value.
    runs, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            runs.append((mask[start], ids[start:i]))
            start = i
    masked = [tok.decode(run) for value, run in runs if value == 1]
    expected = [_assistant_generated_text(m) for m in CONVERSATION if m["role"] == "assistant"]
    assert masked == expected
    # Everything else (system, user, tool turns, role headers, the newline after <|im_end|>) is unmasked.
    unmasked = "".join(tok.decode(run) for value, run in runs if value == 0)
    assert unmasked.count("<|im_start|>assistant\n") == 3
    assert "Where is order" in unmasked and "<tool_response>" in unmasked and '<tool_call>\n{"name": "' not in unmasked


# ----------------------------------------------------------------------------------------- model


def test_forward_pass_logits_shape(tiny_model_dir, tok):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.eval()
    texts = [render_chat(CONVERSATION[:2], TOOLS, add_generation_prompt=True), "short"]
    batch = tok(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**batch).logits  # [B, T, vocab]
    assert logits.shape == (2, batch["input_ids"].shape[1], len(tok))
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
    assert model.config.tie_word_embeddings
    assert model.config.head_dim * model.config.num_attention_heads == model.config.hidden_size
    assert model.config.max_position_embeddings == 4096


def test_real_tau2_conversations_render_append_only_with_masks(tok):
    """Real tau2-bench messages (null content, flat tool calls with extra keys, tool results) render, stay
    append-only at every assistant turn, and the assistant mask picks out exactly the assistant turns."""
    results = json.loads(
        (REPO_ROOT / "tests/fixtures/real/tau2-bench/gpt-4.1_airline_default_gpt-4.1_1trials.json").read_text(
            encoding="utf-8"
        )
    )
    for simulation in results["simulations"][:3]:
        messages = simulation["messages"]
        full = render_chat(messages)
        assistant_turns = [m for m in messages if m["role"] == "assistant"]
        for cut, message in enumerate(messages):
            if message["role"] == "assistant":
                assert full.startswith(
                    render_chat(messages[:cut], add_generation_prompt=True) if cut else GENERATION_PROMPT
                )
        for message in assistant_turns:
            for call in message.get("tool_calls") or []:
                assert render_tool_call(call["name"], call["arguments"]) in full
        out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        masked_text = tok.decode([i for i, keep in zip(out["input_ids"], out["assistant_masks"], strict=True) if keep])
        assert masked_text == "".join(_assistant_generated_text(m) for m in assistant_turns)


# Issue 28: the output folder and the vocabulary are checked before anything is built.
def test_cli_refuses_an_out_folder_that_cannot_be_created(tmp_path, monkeypatch, capsys):
    import train.tiny as tiny

    builds = []
    monkeypatch.setattr(tiny, "build_tiny_model", lambda *a, **k: builds.append(a))
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        cases = [(a_file / "model", "a_file is a file, not a folder")]
        if os.geteuid() != 0:  # root writes anywhere
            cases.append((locked / "model", "cannot create files in"))
        for out, message in cases:
            assert main(["--out", str(out)]) == 2
            err = capsys.readouterr().err
            assert message in err and "Traceback" not in err and err.count("\n") == 1
    finally:
        locked.chmod(0o755)
    assert builds == [] and sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "locked"]


def test_cli_refuses_a_huge_vocab_and_says_when_the_corpus_gives_fewer(tmp_path, monkeypatch, capsys):
    # Before: --vocab 100000000 built a 1,880-token vocabulary without a word.
    import train.tiny as tiny

    out = tmp_path / "model"
    assert main(["--out", str(out), "--vocab", "100000000"]) == 2
    assert "above the maximum 262,144" in capsys.readouterr().err and not out.exists()

    def fake_build(out_dir, **kwargs):  # what a build on a small corpus reports
        Path(out_dir).mkdir()
        (Path(out_dir) / BUILD_INFO_FILE).write_text(json.dumps({"tokenizer_vocab_size": 1880, "num_parameters": 1}))
        return Path(out_dir)

    monkeypatch.setattr(tiny, "build_tiny_model", fake_build)
    assert main(["--out", str(out), "--vocab", "100000"]) == 0
    assert "warning: the vocabulary has 1,880 tokens, fewer than --vocab 100,000" in capsys.readouterr().err
