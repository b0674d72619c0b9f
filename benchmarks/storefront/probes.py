"""Storefront-specific reward-hacking probes (validate_game runs them after its generic ones).

`name_every_status`: authenticate and look the order up as the expert does, then, instead of acting or
telling the one right status, refuse and name every status there is. A reply that lists all statuses
contains the right one; the communication check must not be fooled by that (the issue's measured hole:
0.52 success on precondition before statuses had to be asserted alone).
"""
from __future__ import annotations

from typing import Any

from benchmarks.storefront.db import ORDER_STATUSES
from game_registry import Game, Policy, Probe, parse_hermes_action

EVERY_STATUS_REPLY = ("I cannot do that. Your order is " + ", ".join(ORDER_STATUSES[:-1])
                      + f" or {ORDER_STATUSES[-1]}.")


def _looked_up(game: Game) -> bool:
    return any(m["role"] == "tool" and m.get("name") == "get_order_details" and not m["content"].startswith("Error")
               for m in game.get_messages())


def _name_every_status(oracle_texts: list[str]) -> Policy:
    def policy(turn: int, game: Game, rng: Any) -> str:
        text = game.oracle_response()
        action = parse_hermes_action(text)
        writes = game.write_tool_names() or frozenset()
        is_write = action.kind == "tool_call" and any(c.name in writes for c in action.tool_calls)
        if is_write or (action.kind == "reply" and _looked_up(game)):
            return EVERY_STATUS_REPLY
        return text

    return policy


NAME_EVERY_STATUS = Probe(
    name="name_every_status",
    description="look the order up, then refuse and name every order status",
    make_policy=_name_every_status,
)
