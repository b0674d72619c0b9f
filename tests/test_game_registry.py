"""game_registry: action parsing, GameSpec validation, registration, discovery, --list."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import game_registry
from game_registry import GameImportError, GameSpec, parse_hermes_action, prompt_variant, register_game

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "text, kind, detail",
    [
        ("Your order is cancelled.", "reply", "Your order is cancelled."),
        ('<tool_call>\n{"name": "get_order_details", "arguments": {"order_id": "#W1"}}\n</tool_call>',
         "tool_call", [("get_order_details", {"order_id": "#W1"})]),
        ('Let me look. <tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>'
         '<tool_call>{"name": "b", "arguments": {}}</tool_call>', "tool_call", [("a", {"x": 1}), ("b", {})]),
        ('<tool_call>{"name": "a"}</tool_call>', "tool_call", [("a", {})]),
        ("", "malformed", "empty response"),
        ("   \n", "malformed", "empty response"),
        ('<tool_call>{"name": "a", "arguments": {}}', "malformed", "unbalanced"),
        ('</tool_call> oops', "malformed", "unbalanced"),
        ("<tool_call>{not json}</tool_call>", "malformed", "not valid JSON"),
        ('<tool_call>["a"]</tool_call>', "malformed", 'string "name"'),
        ('<tool_call>{"name": 3}</tool_call>', "malformed", 'string "name"'),
        ('<tool_call>{"name": "a", "arguments": [1]}</tool_call>', "malformed", "must be a JSON object"),
        ('<tool_call>{"name": "a", "arguments": "nope"}</tool_call>', "malformed", "not valid JSON"),
        ("<tool_call>" + "[" * 5000 + "]" * 5000 + "</tool_call>", "malformed", "nested too deeply"),
    ],
)
def test_parse_hermes_action(text, kind, detail):
    action = parse_hermes_action(text)
    assert action.kind == kind
    if kind == "reply":
        assert action.content == detail
    elif kind == "tool_call":
        assert [(c.name, c.arguments) for c in action.tool_calls] == detail
    else:
        assert detail in action.error


def test_parse_never_raises_on_non_text():
    assert parse_hermes_action(None).kind == "malformed"  # type: ignore[arg-type]


def test_action_to_message_shapes():
    call = parse_hermes_action('<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>')
    call.tool_calls[0].id = "call_0_0"
    assert call.to_message() == {"role": "assistant", "content": None,
                                 "tool_calls": [{"id": "call_0_0", "name": "a", "arguments": {"x": 1}}]}
    assert parse_hermes_action("{oops").to_message() == {"role": "assistant", "content": "{oops"}


def _spec(**overrides):
    values = {"name": "toy_game", "make_env": lambda config=None: None}
    values.update(overrides)
    return GameSpec(**values)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"name": "Bad Name"}, "snake_case"),
        ({"name": ""}, "snake_case"),
        ({"make_env": "not callable"}, "make_env must be callable"),
        ({"extract_action": None}, "extract_action must be callable"),
        ({"hint_prompt": 3}, "hint_prompt must be a string"),
        ({"max_turns": 0}, "max_turns must be a positive int"),
        ({"max_gen_tokens": True}, "max_gen_tokens must be a positive int"),
        ({"config_cls": "Config"}, "config_cls must be a class"),
    ],
)
def test_gamespec_rejects_bad_fields(overrides, message):
    with pytest.raises(ValueError, match=message):
        _spec(**overrides)


def test_register_rejects_duplicates_and_wrong_types(monkeypatch):
    monkeypatch.setattr(game_registry, "_REGISTRY", {})
    register_game(_spec())
    with pytest.raises(ValueError, match="already registered"):
        register_game(_spec())
    with pytest.raises(ValueError, match="expects a GameSpec"):
        register_game({"name": "x"})  # type: ignore[arg-type]


def test_spec_make_passes_overrides_only_with_a_config_class():
    from dataclasses import dataclass

    @dataclass
    class Config:
        level: int = 1

    spec = _spec(make_env=lambda config=None: config, config_cls=Config)
    assert spec.make(level=3) == Config(3)
    with pytest.raises(ValueError, match="no config_cls"):
        _spec().make(level=3)


def test_prompt_variant_appends_base_or_hint_to_the_system_message():
    spec = _spec(base_prompt="Be brief.", hint_prompt="Hint: look first.")
    messages = [{"role": "system", "content": "Policy."}, {"role": "user", "content": "hi"}]
    assert prompt_variant(messages, spec, hinted=False)[0]["content"] == "Policy.\n\nBe brief."
    assert prompt_variant(messages, spec, hinted=True)[0]["content"] == "Policy.\n\nHint: look first."
    assert messages[0]["content"] == "Policy."  # the input is not modified
    with pytest.raises(ValueError, match="system prompt"):
        prompt_variant(messages[1:], spec, hinted=False)


def test_discovery_names_the_file_of_a_broken_game(monkeypatch, tmp_path):
    game_registry.list_games()  # discovered first: built-in modules register once per process, so a discovery
    # undone below would leave them out of every later lookup (storefront missing from the next test that asks)
    (tmp_path / "capability_broken_game.py").write_text("import does_not_exist_anywhere\n")
    monkeypatch.setenv("TRACE_GAMES_DIRS", str(tmp_path))
    monkeypatch.setattr(game_registry, "_DISCOVERED", False)
    monkeypatch.setattr(game_registry, "_LOADED_FILES", set(game_registry._LOADED_FILES))
    monkeypatch.setattr(game_registry, "_REGISTRY", dict(game_registry._REGISTRY))
    with pytest.raises(GameImportError, match="capability_broken_game.py.*does_not_exist_anywhere"):
        game_registry.list_games()


def test_unknown_game_lists_the_known_ones():
    with pytest.raises(KeyError, match="registered games: .*capability_precondition_verification"):
        game_registry.get_game("capability_nothing_like_this")


def test_list_cli_shows_the_shipped_games():
    result = subprocess.run([sys.executable, "game_registry.py", "--list"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for name in ("storefront", "capability_precondition_verification", "capability_multi_step_task_completion",
                 "capability_structured_data_reasoning", "capability_tool_calling_precision"):
        assert name in result.stdout
