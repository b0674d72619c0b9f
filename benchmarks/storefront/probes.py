"""Storefront-specific reward-hacking probes (validate_game runs them after its generic ones).

`name_every_status`: authenticate and look the order up as the expert does, then, instead of acting or
telling the one right status, refuse and name every status there is. A reply that lists all statuses
contains the right one; the communication check must not be fooled by that (the issue's measured hole:
0.52 success on precondition before statuses had to be asserted alone).

`guess_statuses_across_turns`: the expert, but before each statement it makes after an order's look-up, one
question per order status, each asserting that status of the looked-up order ("Order #W1 is processed, is
that right?"); the customer answers each, so the request stays open. One guess is always right: a wrong
assertion must void the request's communication rather than be dropped (the issue's measured hole: 0.52
success on precondition and 0.16-0.20 on all-forbidden storefront tasks for a policy that never read the
status and asserted one per reply).
"""
from __future__ import annotations

import json
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


def _guess_statuses(oracle_texts: list[str]) -> Policy | None:
    if not any(c.name == "get_order_details" for t in oracle_texts for c in parse_hermes_action(t).tool_calls):
        return None  # no order is looked up (the default address): nothing to guess, it would be the expert
    pending: list[str] = []
    guessed: set[str] = set()

    def policy(turn: int, game: Game, rng: Any) -> str:
        if pending:
            return pending.pop(0)
        text = game.oracle_response()
        action = parse_hermes_action(text)
        looked_up = [m for m in game.get_messages() if m["role"] == "tool" and m.get("name") == "get_order_details"
                     and not m["content"].startswith("Error")]
        if action.kind != "reply" or "?" in text or not looked_up:
            return text
        order_id = json.loads(looked_up[-1]["content"]).get("order_id", "")
        if order_id in guessed:
            return text
        guessed.add(order_id)
        pending.extend([*(f"Order {order_id} is {s}, is that right?" for s in ORDER_STATUSES[1:]), text])
        return f"Order {order_id} is {ORDER_STATUSES[0]}, is that right?"

    return policy


GUESS_STATUSES = Probe(
    name="guess_statuses_across_turns",
    description="the expert, with one question per order status asserted before each statement after a look-up",
    make_policy=_guess_statuses,
)
