"""The storefront policy's procedural rules, checked on a finished episode (shared with the capability games).

The tools do not enforce the written policy; the reward does. A successful write breaks the policy when:
  - no user look-up had returned the customer's user id before it ("authenticate first"); reads are held
    to this too: any successful non-authentication call before authentication is a violation (showing an
    unauthenticated caller an order's status is what the rule forbids);
  - it names an order that no earlier successful `get_order_details` showed ("look an order up before
    changing it");
  - one of its ids (an argument called `*_id` or `*_ids`) appeared nowhere earlier in the conversation,
    neither in a customer message nor in a tool output: the value was guessed (or replayed), not read;
  - with `require_confirmation`, the customer's last message before it is not an explicit yes ("get an
    explicit yes before any change").
A write that breaks any rule voids the episode's action reward (the caller decides how). Failed calls
change nothing and are not judged here.
"""
from __future__ import annotations

import re
from typing import Any, Iterable

from benchmarks.tool_env_game import ToolCallRecord

_TOKEN = re.compile(r"[A-Za-z0-9_#@.\-]+")
FREE_TOOLS = ("transfer_to_human_agents",)  # allowed at any time, before authentication too
AFFIRMATIVE = re.compile(r"^\W*yes\b", re.IGNORECASE)


def _tokens(text: str) -> set[str]:
    return {t.rstrip(".") for t in _TOKEN.findall(text)}


def _ids(arguments: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in arguments.items():
        if key.endswith("_id") and isinstance(value, str):
            out.append(value)
        elif key.endswith("_ids") and isinstance(value, list):
            out.extend(v for v in value if isinstance(v, str))
    return out


def policy_violations(messages: list[dict[str, Any]], records: Iterable[ToolCallRecord], user_id: str, *,
                      write_tools: frozenset[str], auth_tools: frozenset[str],
                      require_confirmation: bool) -> list[str]:
    """Why the episode's successful writes break the policy (empty when none does); see the module docstring."""
    by_id = {r.call_id: r for r in records}
    seen: set[str] = set()
    looked_up: set[str] = set()
    authenticated = False
    last_user = ""
    problems: list[str] = []
    for message in messages:
        role = message.get("role")
        content = message.get("content") or ""
        if role == "user":
            seen |= _tokens(content)
            last_user = content
        elif role == "tool":
            seen |= _tokens(content)
        elif role == "assistant":
            for call in message.get("tool_calls") or ():
                record = by_id.get(call.get("id"))
                if record is None or not record.ok:
                    continue
                if record.name in auth_tools:
                    authenticated = authenticated or record.output == user_id
                    continue
                if not authenticated and record.name not in write_tools and record.name not in FREE_TOOLS:
                    problems.append(f"{record.name} (turn {record.turn}) before the user was authenticated")
                if record.name == "get_order_details":
                    looked_up.add(record.arguments.get("order_id"))
                elif record.name in write_tools:
                    problems += _write_problems(record, authenticated, looked_up, seen, last_user,
                                                require_confirmation)
                    last_user = ""  # one yes covers one change
    return problems


def _write_problems(record: ToolCallRecord, authenticated: bool, looked_up: set[str], seen: set[str],
                    last_user: str, require_confirmation: bool) -> list[str]:
    where = f"{record.name} (turn {record.turn})"
    problems = []
    if not authenticated:
        problems.append(f"{where} before the user was authenticated")
    order_id = record.arguments.get("order_id")
    if isinstance(order_id, str) and order_id not in looked_up:
        problems.append(f"{where} changes order {order_id} without looking it up first")
    unseen = [value for value in _ids(record.arguments) if value not in seen]
    if unseen:
        problems.append(f"{where} uses id(s) {unseen} that appeared nowhere earlier in the conversation")
    if require_confirmation and not AFFIRMATIVE.search(last_user):
        problems.append(f"{where} without the user's explicit yes right before it")
    return problems


def just_confirmed(messages: list[dict[str, Any]], question: str) -> bool:
    """Whether the agent's last reply was `question` and the user's answer to it was an explicit yes."""
    return (len(messages) >= 2 and messages[-1]["role"] == "user" and bool(AFFIRMATIVE.search(messages[-1]["content"]))
            and messages[-2]["role"] == "assistant" and messages[-2].get("content") == question)
