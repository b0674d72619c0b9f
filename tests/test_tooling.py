"""benchmarks/toolkit.py and tool_env_game.py: schema derivation, strict argument validation, and the ToolEnvGame loop."""
from __future__ import annotations

import json
from typing import Any, Literal, Optional

import pytest

from benchmarks.toolkit import Toolkit, parse_docstring, tool, tool_schema

from benchmarks.tool_env_game import FORMAT_ERROR_TEMPLATE, ToolEnvGame
from game_registry import parse_hermes_action


class DemoTools(Toolkit):
    """A toolkit exercising every supported parameter type."""

    @tool
    def lookup(self, name: str, count: int, ratio: float, flag: bool, tags: list[str],
               mode: Literal["fast", "slow"], note: Optional[str] = None, limit: int | None = None) -> dict:
        """Look something up.

        Second paragraph: not part of the description.

        Args:
            name: The name, such as
                'alpha' (continued line).
            count (int): How many.
            ratio: A ratio.
            flag: A flag.
            tags: Some tags.
            mode: The speed.
            note: An optional note.
            limit: An optional limit.

        Returns:
            A dict.
        """
        return {"name": name, "count": count, "ratio": ratio, "flag": flag, "tags": tags, "mode": mode,
                "note": note, "limit": limit}

    @tool(write=True)
    def store(self, key: str, values: dict[str, int]) -> str:
        """Store values under a key.

        Args:
            key: Where to store.
            values: What to store.
        """
        self.db[key] = values
        return "stored"

    @tool
    def explode(self) -> str:
        """Raise a bug (not a ValueError)."""
        raise KeyError("bug")

    @tool
    def refuse(self, order_id: str) -> str:
        """Refuse like a database would.

        Args:
            order_id: Any id.
        """
        raise ValueError(f"order {order_id!r} not found")

    def helper(self) -> int:  # not a tool
        return 1


GOOD = {"name": "a", "count": 2, "ratio": 0.5, "flag": True, "tags": ["x"], "mode": "fast"}


def test_schema_from_hints_and_docstring():
    schema = tool_schema(DemoTools.lookup)
    assert schema["type"] == "function"
    fn = schema["function"]
    assert fn["name"] == "lookup"
    assert fn["description"] == "Look something up."
    params = fn["parameters"]
    assert params["type"] == "object"
    assert params["required"] == ["name", "count", "ratio", "flag", "tags", "mode"]
    props = params["properties"]
    assert props["name"] == {"type": "string", "description": "The name, such as 'alpha' (continued line)."}
    assert props["count"]["type"] == "integer" and props["count"]["description"] == "How many."
    assert props["ratio"]["type"] == "number"
    assert props["flag"]["type"] == "boolean"
    assert props["tags"]["type"] == "array" and props["tags"]["items"] == {"type": "string"}
    assert props["mode"]["type"] == "string" and props["mode"]["enum"] == ["fast", "slow"]
    assert props["note"]["type"] == "string" and props["limit"]["type"] == "integer"
    store = tool_schema(DemoTools.store)["function"]["parameters"]["properties"]["values"]
    assert store == {"type": "object", "additionalProperties": {"type": "integer"}, "description": "What to store."}


def test_toolkit_lists_tools_in_order_and_marks_writes():
    assert DemoTools.tool_names() == ["lookup", "store", "explode", "refuse"]
    assert [s["function"]["name"] for s in DemoTools(db={}).schemas()] == DemoTools.tool_names()
    assert DemoTools.is_write("store") and not DemoTools.is_write("lookup")
    with pytest.raises(ValueError, match="unknown tool 'helper'"):
        DemoTools.is_write("helper")


def test_parse_docstring_sections():
    description, args = parse_docstring("""Do a thing
    in two lines.

    Args:
        a: First.
        b (list[str]): Second,
            wrapped.
    Raises:
        ValueError: never.
    """)
    assert description == "Do a thing in two lines."
    assert args == {"a": "First.", "b": "Second, wrapped."}


def test_call_returns_compact_sorted_json_and_plain_strings():
    tools = DemoTools(db={})
    out = tools.call("lookup", {**GOOD, "note": None})
    assert out == json.dumps(json.loads(out), separators=(",", ":"), sort_keys=True)
    assert " " not in out and json.loads(out)["count"] == 2
    assert tools.call("store", {"key": "k", "values": {"a": 1}}) == "stored"
    assert tools.db == {"k": {"a": 1}}
    assert json.loads(tools.call("lookup", {**GOOD, "ratio": 3}))["ratio"] == 3  # JSON ints are numbers


@pytest.mark.parametrize("name, arguments, message", [
    ("nope", {}, "unknown tool 'nope'; available tools: lookup, store, explode, refuse"),
    ("lookup", ["a"], "must be a JSON object, got array"),
    ("lookup", {k: v for k, v in GOOD.items() if k != "count"}, "missing required argument(s) 'count'"),
    ("lookup", {**GOOD, "extra": 1}, "unexpected argument(s) 'extra'; it takes: name, count"),
    ("lookup", {**GOOD, "count": "12"}, "argument 'count' of tool 'lookup' must be a JSON integer, got string \"12\""),
    ("lookup", {**GOOD, "count": True}, "must be a JSON integer, got boolean"),
    ("lookup", {**GOOD, "count": 1.5}, "must be a JSON integer, got number"),
    ("lookup", {**GOOD, "ratio": "0.5"}, "must be a JSON number, got string"),
    ("lookup", {**GOOD, "flag": 1}, "must be a JSON boolean, got integer"),
    ("lookup", {**GOOD, "name": 7}, "must be a JSON string, got integer"),
    ("lookup", {**GOOD, "tags": "x"}, "must be a JSON array, got string"),
    ("lookup", {**GOOD, "tags": ["x", 3]}, r"argument 'tags' of tool 'lookup'\[1\] must be a JSON string"),
    ("lookup", {**GOOD, "mode": "medium"}, 'must be one of "fast", "slow", got "medium"'),
    ("lookup", {**GOOD, "note": 5}, "must be a JSON string, got integer"),
    ("lookup", {**GOOD, "name": None}, "must be a JSON string, got null"),
    ("store", {"key": "k", "values": {"a": "1"}}, "must be a JSON integer"),
])
def test_call_rejects_bad_arguments_without_coercion(name: str, arguments: Any, message: str):
    tools = DemoTools(db={})
    with pytest.raises(ValueError) as err:
        tools.call(name, arguments)
    if message.startswith("argument 'tags'"):
        assert err.match(message)
    else:
        assert message in str(err.value)
    assert tools.db == {}  # nothing ran


def test_bad_tool_definitions_fail_at_class_creation():
    with pytest.raises(TypeError, match="not described"):
        class MissingDoc(Toolkit):
            @tool
            def f(self, x: str) -> str:
                """Do f."""
                return x

    with pytest.raises(TypeError, match="unsupported parameter type"):
        class BadType(Toolkit):
            @tool
            def f(self, x: set) -> str:
                """Do f.

                Args:
                    x: A set.
                """
                return ""

    with pytest.raises(TypeError, match="no type hint"):
        class NoHint(Toolkit):
            @tool
            def f(self, x) -> str:
                """Do f.

                Args:
                    x: Something.
                """
                return ""

    with pytest.raises(TypeError, match="description"):
        class NoDescription(Toolkit):
            @tool
            def f(self) -> str:
                return ""


# --------------------------------------------------------------------------------------------------
# ToolEnvGame
# --------------------------------------------------------------------------------------------------
class EchoGame(ToolEnvGame):
    """Minimal game: the user stops when the agent says 'bye'."""

    def reset(self, seed: int) -> list[dict[str, Any]]:
        return self.start_episode(DemoTools(db={}), [{"role": "user", "content": f"hello {seed}"}])

    def get_system_prompt(self) -> str:
        return "Be helpful."

    def respond_to_user(self, text: str) -> tuple[str | None, bool]:
        if "bye" in text:
            return "###STOP###", True
        return "go on", False

    def get_summary(self) -> dict[str, Any]:
        return {"reward": 1.0 if "k" in self.toolkit.db else 0.0, "steps": self.state.turns,
                "success": "k" in self.toolkit.db}

    def oracle_response(self) -> str:
        return "bye"


def call_text(*calls: tuple[str, dict]) -> str:
    return "".join(f'<tool_call>{json.dumps({"name": n, "arguments": a})}</tool_call>' for n, a in calls)


def test_step_runs_tools_with_ids_and_error_messages():
    game = EchoGame(max_steps=10, max_errors=1, max_calls_per_turn=3)
    messages = game.reset(3)
    assert messages == [{"role": "system", "content": "Be helpful."}, {"role": "user", "content": "hello 3"}]
    result = game.step(parse_hermes_action(call_text(("store", {"key": "k", "values": {}}), ("refuse", {"order_id": "x"}),
                                                     ("store", {"key": 1, "values": {}}))))
    assert not result.done and result.reward == 0.0
    assert [m["tool_call_id"] for m in result.observation_messages] == ["call_0_0", "call_0_1", "call_0_2"]
    assert result.observation_messages[0] == {"role": "tool", "tool_call_id": "call_0_0", "name": "store",
                                              "content": "stored"}
    assert result.observation_messages[1]["content"] == "Error: order 'x' not found"
    assert result.observation_messages[2]["content"].startswith("Error: argument 'key' of tool 'store' must be")
    log = game.get_messages()
    assert log[2]["role"] == "assistant" and [c["id"] for c in log[2]["tool_calls"]] == ["call_0_0", "call_0_1",
                                                                                          "call_0_2"]
    assert [r.ok for r in game.state.tool_calls] == [True, False, False]
    second = game.step(parse_hermes_action(call_text(("refuse", {"order_id": "y"}))))
    assert second.observation_messages[0]["tool_call_id"] == "call_1_0"
    final = game.step(parse_hermes_action("ok, bye"))
    assert final.done and final.reward == 1.0 and game.termination_reason == "user_stop"
    assert final.observation_messages == [{"role": "user", "content": "###STOP###"}]
    with pytest.raises(RuntimeError, match="episode is over"):
        game.step(parse_hermes_action("again"))


def test_get_messages_is_a_copy():
    game = EchoGame()
    game.reset(0)
    game.step(parse_hermes_action(call_text(("store", {"key": "k", "values": {}}))))
    copy = game.get_messages()
    copy[2]["tool_calls"][0]["arguments"]["key"] = "changed"
    copy.append({"role": "user", "content": "x"})
    assert game.get_messages()[2]["tool_calls"][0]["arguments"]["key"] == "k"
    assert len(game.get_messages()) == 4


def test_non_value_errors_propagate():
    game = EchoGame()
    game.reset(0)
    with pytest.raises(KeyError):
        game.step(parse_hermes_action(call_text(("explode", {}))))


def test_format_errors_count_toward_max_errors():
    game = EchoGame(max_steps=10, max_errors=1)
    game.reset(0)
    first = game.step(parse_hermes_action("<tool_call>{not json</tool_call>"))
    assert not first.done
    assert first.observation_messages[0]["role"] == "user"
    assert first.observation_messages[0]["content"].startswith("[format error] tool call is not valid JSON")
    assert first.observation_messages[0]["content"].endswith(
        "Call a tool with <tool_call>{...}</tool_call> or reply in plain text.")
    assert game.get_messages()[2] == {"role": "assistant", "content": "<tool_call>{not json</tool_call>"}
    second = game.step(parse_hermes_action("<tool_call>"))
    assert second.done and game.termination_reason == "too_many_errors" and second.reward == 0.0
    assert FORMAT_ERROR_TEMPLATE.format(why="x").startswith("[format error] x.")


def test_episode_ends_at_max_steps():
    game = EchoGame(max_steps=2, max_errors=5)
    game.reset(0)
    assert not game.step(parse_hermes_action("hi")).done
    result = game.step(parse_hermes_action("hi again"))
    assert result.done and game.termination_reason == "max_steps"


def test_invalid_game_limits_are_rejected():
    with pytest.raises(ValueError, match="max_steps"):
        EchoGame(max_steps=0)
    with pytest.raises(ValueError, match="max_errors"):
        EchoGame(max_errors=-1)
    with pytest.raises(RuntimeError, match="reset"):
        EchoGame().step(parse_hermes_action("hi"))


def test_one_call_per_turn_extra_calls_are_not_executed():
    game = EchoGame(max_steps=10)  # the default: one call per turn, as the written policies say
    game.reset(0)
    result = game.step(parse_hermes_action(call_text(("refuse", {"order_id": "x"}),
                                                     ("store", {"key": "k", "values": {}}))))
    assert result.observation_messages[0]["content"] == "Error: order 'x' not found"
    assert result.observation_messages[1]["content"].startswith("Error: not executed: the policy allows 1 tool call")
    assert "k" not in game.toolkit.db  # the second call did not run
    assert [r.ok for r in game.state.tool_calls] == [False, False]


def test_long_observations_and_turns_are_capped():
    game = EchoGame(max_steps=10, max_observation_chars=100, max_turn_chars=5000)
    game.reset(0)
    result = game.step(parse_hermes_action(call_text(("refuse", {"order_id": "A" * 3000}))))
    content = result.observation_messages[0]["content"]
    assert content.startswith("Error: order 'AAA") and content.endswith("characters]") and len(content) < 140
    result = game.step(parse_hermes_action("b" * 6000))
    assert game.state.format_errors == 1 and "6000 characters long" in result.observation_messages[0]["content"]
    assert len(game.get_messages()[-2]["content"]) < 5100


class HandOffTools(Toolkit):
    @tool(ends_episode=True)
    def transfer(self, summary: str) -> str:
        """Hand the user to a person.

        Args:
            summary: What happened.
        """
        return "Transfer successful"

    @tool(auth=True)
    def whoami(self, email: str) -> str:
        """Find a user.

        Args:
            email: Email.
        """
        return "u1"


class HandOffGame(EchoGame):
    toolkit_class = HandOffTools

    def reset(self, seed: int) -> list[dict[str, Any]]:
        return self.start_episode(HandOffTools({}), [{"role": "user", "content": "hi"}])

    def get_summary(self) -> dict[str, Any]:
        return {"reward": 0.0, "steps": self.state.turns, "success": False}


def test_a_successful_transfer_ends_the_episode():
    game = HandOffGame()
    game.reset(0)
    assert game.auth_tool_names() == frozenset({"whoami"}) and game.write_tool_names() == frozenset()
    result = game.step(parse_hermes_action(call_text(("transfer", {"summary": 1}))))  # a failed call does not
    assert not result.done
    result = game.step(parse_hermes_action(call_text(("transfer", {"summary": "x"}))))
    assert result.done and game.termination_reason == "transfer"
