"""Flawed experts: the oracle with one realistic mistake each.

They serve two purposes: tests check that the benchmark catches each mistake (a benchmark that rewards
a broken agent measures nothing), and the CPU demo plants them in SFT demonstrations so the base model
has failures that capability training can fix. Because every task mixes needs, each flaw lowers the
pass rate of several request kinds.

    skip_status_check    (precondition_verification) looks the order up, then does what the user asked
                         whatever its status;
    forget_requests      (multi_step_task_completion) handles the first request, then asks "anything else?";
    wrong_refund_method  (structured_data_reasoning) refunds / charges the user's first payment method
                         instead of the one in the order's payment_history (or the gift card asked for);
    drop_hash            (tool_calling_precision) copies an order id as the user typed it (without '#'),
                         and gives up when the look-up fails;
    skip_confirmation    (explicit_confirmation, no capability game) changes things without asking first;
    no_order_search      (order_search, no capability game) asks for an order id the user does not know,
                         then gives up.

Each flaw only changes the expert where its mistake applies; elsewhere it is the expert.
"""
from __future__ import annotations

from typing import Any

from benchmarks.agents import Agent
from benchmarks.storefront.env import StorefrontGame
from benchmarks.storefront.tasks import Step, SubRequest
from game_registry import Game

FLAW_CAPABILITY = {"skip_status_check": "precondition_verification", "forget_requests": "multi_step_task_completion",
                   "wrong_refund_method": "structured_data_reasoning", "drop_hash": "tool_calling_precision",
                   "skip_confirmation": "explicit_confirmation", "no_order_search": "order_search"}
ASK_ORDER_ID = "Which order do you mean? Please give me the order id."


def _failed(game: StorefrontGame, name: str, **match: Any) -> bool:
    return any(not r.ok and r.name == name and all(r.arguments.get(k) == v for k, v in match.items())
               for r in game.state.tool_calls)


def _said(game: StorefrontGame, text: str) -> bool:
    return any(m["role"] == "assistant" and m.get("content") == text for m in game.state.messages)


def _skip_status_check(game: StorefrontGame, sub: SubRequest) -> str | None:
    if sub.allowed:
        return None
    # A forbidden request's plan holds only its look-ups; the flawed agent goes on as if it were allowed.
    return game.next_step(sub.steps + sub.requested) or sub.requested_statement


def _forget_requests(game: StorefrontGame, sub: SubRequest) -> str | None:
    if game.user.pointer >= 1:  # the first request is closed: the rest are forgotten
        return "Is there anything else I can help you with?"
    return None


def _swap_method(step: Step, old: str, new: str) -> Step:
    if step.is_confirm:
        return Step("confirm", text=step.text.replace(old, new))
    if step.arguments.get("payment_method_id") == old:
        return Step(step.name, {**step.arguments, "payment_method_id": new})
    return step


def _wrong_refund_method(game: StorefrontGame, sub: SubRequest) -> str | None:
    write = sub.write
    if not sub.allowed or sub.kind not in ("return", "exchange") or write is None:
        return None
    right, first = write.arguments["payment_method_id"], game.task.user.payment_methods[0].id
    steps = [_swap_method(s, right, first) for s in sub.steps]
    # After the write (or a refused one, e.g. a gift card too small) the flawed agent reports success anyway.
    return game.next_step(steps) or sub.statement.replace(right, first)


def _drop_hash(game: StorefrontGame, sub: SubRequest) -> str | None:
    ref = sub.user.order_ref
    if not ref or ref == sub.order_id:
        return None
    if _failed(game, "get_order_details", order_id=ref):
        return f"Sorry, I could not find order {ref}."
    steps = [Step(s.name, {**s.arguments, "order_id": ref}) if s.arguments.get("order_id") == sub.order_id else s
             for s in sub.steps]
    return game.next_step(steps) or sub.statement


def _skip_confirmation(game: StorefrontGame, sub: SubRequest) -> str | None:
    if not any(s.is_confirm for s in sub.steps):
        return None
    return game.next_step([s for s in sub.steps if not s.is_confirm]) or sub.statement


def _no_order_search(game: StorefrontGame, sub: SubRequest) -> str | None:
    if not sub.user.order_hint:
        return None
    if _said(game, ASK_ORDER_ID):
        return "Sorry, I need the order id to help with that."
    return ASK_ORDER_ID


_FLAWS = {"skip_status_check": _skip_status_check, "forget_requests": _forget_requests,
          "wrong_refund_method": _wrong_refund_method, "drop_hash": _drop_hash,
          "skip_confirmation": _skip_confirmation, "no_order_search": _no_order_search}
FLAWS = tuple(_FLAWS)


def flawed_response(game: StorefrontGame, flaw: str | tuple[str, ...]) -> str:
    """The flawed expert's next message in `game` (the expert's wherever the flaw does not apply).

    `flaw` may name several flaws: the first one that applies to the current step decides (an agent that
    lacks several capabilities)."""
    flaws = (flaw,) if isinstance(flaw, str) else tuple(flaw)
    unknown = [f for f in flaws if f not in _FLAWS]
    if unknown or not flaws:
        raise ValueError(f"unknown flaw {', '.join(unknown) or '(none given)'}; choose from {', '.join(_FLAWS)}")
    if game.task is None or game.done:
        raise RuntimeError("flawed_response() needs a running episode")
    sub = game.current
    if sub is not None and game.authenticated():
        for name in flaws:
            text = _FLAWS[name](game, sub)
            if text is not None:
                return text
    return game.oracle_response()


class FlawedExpertAgent(Agent):
    """An agent playing `flawed_response(game, flaw)` (`flaw`: one flaw's name or a tuple of them)."""

    def __init__(self, flaw: str | tuple[str, ...]) -> None:
        names = (flaw,) if isinstance(flaw, str) else tuple(flaw)
        if not names or any(f not in _FLAWS for f in names):
            raise ValueError(f"unknown flaw {flaw!r}; choose from {', '.join(_FLAWS)}")
        self.flaw = flaw if isinstance(flaw, str) else names
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
        return {"implementation": "FlawedExpertAgent",
                "flaw": self.flaw if isinstance(self.flaw, str) else list(self.flaw)}
