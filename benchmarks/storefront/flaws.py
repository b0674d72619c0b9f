"""Flawed experts: the oracle with one realistic mistake each, one per task family.

They serve two purposes: tests check that each family catches its mistake (a benchmark that rewards a
broken agent measures nothing), and the CPU demo plants them in SFT demonstrations so the base model
has failures that capability training can fix.

    skip_status_check    (precondition) writes what the user asked without looking the order up first,
                         so non-pending orders get cancelled / re-addressed;
    forget_requests      (compound) handles the first request, then asks "anything else?";
    wrong_refund_method  (nested_field) refunds to the user's first payment method instead of the one
                         in the order's payment_history;
    drop_hash            (arg_format) copies the order id as the user typed it (without '#'), and gives
                         up when the look-up fails.

Each flaw only changes the expert where its mistake applies; elsewhere it is the expert.
"""
from __future__ import annotations

from typing import Any

from benchmarks.agents import Agent
from benchmarks.storefront.env import StorefrontGame, tool_call_text
from benchmarks.storefront.tasks import SubRequest, address_arguments
from game_registry import Game

FLAW_FAMILY = {"skip_status_check": "precondition", "forget_requests": "compound",
               "wrong_refund_method": "nested_field", "drop_hash": "arg_format"}


def _succeeded(game: StorefrontGame, name: str, **match: Any) -> bool:
    """Whether a successful call of `name` whose arguments include `match` was made."""
    return any(r.ok and r.name == name and all(r.arguments.get(k) == v for k, v in match.items())
               for r in game.state.tool_calls)


def _failed(game: StorefrontGame, name: str, **match: Any) -> bool:
    return any(not r.ok and r.name == name and all(r.arguments.get(k) == v for k, v in match.items())
               for r in game.state.tool_calls)


def _authenticated(game: StorefrontGame) -> bool:
    return any(r.ok and r.name.startswith("find_user_id") and r.output == game.task.user_id
               for r in game.state.tool_calls)


def _skip_status_check(game: StorefrontGame, sub: SubRequest) -> str | None:
    if sub.kind == "cancel":
        if _succeeded(game, "cancel_pending_order", order_id=sub.order_id):
            return f"Order {sub.order_id} is cancelled."
        return tool_call_text("cancel_pending_order", {"order_id": sub.order_id, "reason": sub.reason})
    if sub.kind == "modify_order_address":
        if _succeeded(game, "modify_pending_order_address", order_id=sub.order_id):
            return f"The address of order {sub.order_id} is updated."
        return tool_call_text("modify_pending_order_address",
                              {"order_id": sub.order_id, **address_arguments(sub.address)})
    return None


def _forget_requests(game: StorefrontGame, sub: SubRequest) -> str | None:
    if game.user.pointer >= 1:  # the first request is closed: the rest are forgotten
        return "Is there anything else I can help you with?"
    return None


def _wrong_refund_method(game: StorefrontGame, sub: SubRequest) -> str | None:
    if sub.kind not in ("return", "exchange"):
        return None
    write = sub.gold[-1]
    # After the write (or a refused one, e.g. a gift card too small) the flawed agent reports success anyway.
    if _succeeded(game, write["name"], order_id=sub.order_id) or _failed(game, write["name"], order_id=sub.order_id):
        return sub.statement
    done = {(r.name, str(sorted(r.arguments.items()))) for r in game.state.tool_calls if r.ok}
    for action in sub.gold[:-1]:  # the look-ups stay right
        if (action["name"], str(sorted(action["arguments"].items()))) not in done:
            return None
    first_method = game.task.user.payment_methods[0].id
    return tool_call_text(write["name"], {**write["arguments"], "payment_method_id": first_method})


def _drop_hash(game: StorefrontGame, sub: SubRequest) -> str | None:
    if not sub.order_ref or sub.order_ref == sub.order_id:
        return None
    if _failed(game, "get_order_details", order_id=sub.order_ref):
        return f"Sorry, I could not find order {sub.order_ref}."
    text = game.oracle_response()
    return text.replace(f'"{sub.order_id}"', f'"{sub.order_ref}"')


_FLAWS = {"skip_status_check": _skip_status_check, "forget_requests": _forget_requests,
          "wrong_refund_method": _wrong_refund_method, "drop_hash": _drop_hash}


def flawed_response(game: StorefrontGame, flaw: str) -> str:
    """The flawed expert's next message in `game` (the expert's wherever the flaw does not apply)."""
    if flaw not in _FLAWS:
        raise ValueError(f"unknown flaw {flaw!r}; choose from {', '.join(_FLAWS)}")
    if game.task is None or game.done:
        raise RuntimeError("flawed_response() needs a running episode")
    sub = game.user.current
    if sub is not None and _authenticated(game):
        text = _FLAWS[flaw](game, sub)
        if text is not None:
            return text
    return game.oracle_response()


class FlawedExpertAgent(Agent):
    """An agent playing `flawed_response(game, flaw)`."""

    def __init__(self, flaw: str) -> None:
        if flaw not in _FLAWS:
            raise ValueError(f"unknown flaw {flaw!r}; choose from {', '.join(_FLAWS)}")
        self.flaw = flaw
        self._game: StorefrontGame | None = None

    def begin_episode(self, game: Game, seed: int | None = None) -> None:
        if not isinstance(game, StorefrontGame):
            raise ValueError(f"FlawedExpertAgent plays the storefront game, got {type(game).__name__}")
        self._game = game

    def respond(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
        if self._game is None:
            raise RuntimeError("FlawedExpertAgent.respond() before begin_episode(game)")
        return flawed_response(self._game, self.flaw)

    def describe(self) -> dict[str, Any]:
        return {"implementation": "FlawedExpertAgent", "flaw": self.flaw}
