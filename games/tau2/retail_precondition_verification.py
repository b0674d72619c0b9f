"""Capability game `precondition_verification` on τ²-bench's real retail domain (`tau2_retail_precondition_verification`):
look an order's status up before cancelling it.

Each episode is one customer of the real retail database asking to cancel one of their real orders, with a reason
(the two the retail policy allows). The retail policy lets the agent cancel only a *pending* order; a share of
instances (`refuse_share`, the class prior) picks an order that is processed, delivered or already cancelled
instead. The customer never says the status (with `status_claim_rate` they claim "It hasn't shipped yet.",
truthfully or not), so the only way to know is `get_order_details`.

One decision per episode, two classes: `act` (confirm, cancel, tell it is cancelled) and `refuse` (tell the
status, change nothing). The ablations: `always_act` (the expert that never reads the status: it confirms and
cancels whatever the order) and `always_refuse` (looks up and tells the status, never cancels); each wins exactly
its class's instances, so validate_game's class-prior rule holds them to the larger class's share + 0.05, and
neither can win where the check decides. Trying the cancel and reading the environment's refusal is no way
around the check: a write the environment refuses breaks the policy's procedure (games/tau2/kit.py; the probe
`write_then_read_the_error` plays it).

Expert (oracle): ask who the customer is, look them up, look the order up, then either confirm, cancel and say it
is cancelled (6 turns) or tell the status and that it cannot be cancelled (4 turns).

Reward (games/tau2/kit.py): 0.6 when the database ends as expected (the order cancelled with the customer's reason,
or nothing changed) and the order was looked up, +0.4 when a statement after the cancel (or after the look-up,
when refusing) names the order and asserts its status (cancelled, or the status it has); 0 on any breach of the
procedure. Success is 1.0.

Difficulty: `status_claim_rate` (harder as it rises): the customer's claim that the order has not shipped tempts
an agent to skip the look-up. `refuse_share` is a class prior, not a difficulty. Tools, prompt and policy: the
target `tau2_retail`'s, unchanged.
"""
from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Any

from game_registry import DifficultyKnob, Game, Policy, Probe, register_game
from games.tau2.kit import Instance, KitGameConfig, RetailCapabilityGame, domain_world, kit_game_spec, retail_customer

CAPABILITY = "precondition_verification"
FORBIDDING_STATUSES = ("processed", "delivered", "cancelled")  # the real database's statuses other than pending
REASONS = {"no longer needed": "I no longer need it.", "ordered by mistake": "I ordered it by mistake."}
ALWAYS_ACT, ALWAYS_REFUSE = "always_act", "always_refuse"
HINT = ("Before cancelling an order, look it up with get_order_details and check its status: the policy allows "
        "cancelling a pending order only. If it is not pending, tell the customer its status and change nothing.")


@dataclass
class RetailPreconditionConfig(KitGameConfig):
    """`refuse_share`: the share of instances whose order may not be cancelled (a class prior; 0.5 keeps the
    classes level). `status_claim_rate`: how often the customer claims the order has not shipped (difficulty).
    `email_auth_rate`: how often the customer identifies by email rather than name and zip. The episode limits:
    KitGameConfig's."""

    refuse_share: float = 0.5
    status_claim_rate: float = 0.0
    email_auth_rate: float = 0.5


@functools.lru_cache(maxsize=None)
def orders_by_status() -> dict[str, tuple[str, ...]]:
    """The real database's order ids by status (sorted: draws do not depend on the database's order)."""
    by_status: dict[str, list[str]] = {}
    for order_id, order in sorted(domain_world("retail").db.orders.items()):
        by_status.setdefault(order.status, []).append(order_id)
    return {status: tuple(ids) for status, ids in by_status.items()}


class RetailPreconditionGame(RetailCapabilityGame):
    """See the module docstring."""

    ABLATIONS = {ALWAYS_ACT: "cancels without reading the order's status",
                 ALWAYS_REFUSE: "looks the order up and tells its status but never cancels"}

    def __init__(self, config: RetailPreconditionConfig | None = None) -> None:
        super().__init__(config or RetailPreconditionConfig())

    def draw(self, rng: random.Random) -> Instance:
        config = self.config
        refuse = rng.random() < config.refuse_share
        status = rng.choice(FORBIDDING_STATUSES) if refuse else "pending"
        order_id = rng.choice(orders_by_status()[status])
        auth = "email" if rng.random() < config.email_auth_rate else "name_zip"
        customer = retail_customer(self.world.db.orders[order_id].user_id, auth)
        reason = rng.choice(sorted(REASONS))
        claim = " It hasn't shipped yet." if rng.random() < config.status_claim_rate else ""
        return Instance(
            customer=customer, record_id=order_id, fact=status, action="cancel",
            opening=f"Hi! I'd like to cancel my order {order_id}. {REASONS[reason]}{claim}",
            decision_class="refuse" if refuse else "act",
            request_writes=(("cancel_pending_order", {"order_id": order_id, "reason": reason}),),
            confirm=(f"Do you confirm that I cancel order {order_id} with the reason '{reason}'? Please answer yes "
                     "to proceed."),
            report=f"Your order {order_id} is now cancelled.",
            refusal=(f"I'm sorry, but order {order_id} is {status}, so it cannot be cancelled: only pending orders "
                     "can be."),
            done_fact="cancelled")

    def ablation_decision(self, name: str) -> str:
        return "act" if name == ALWAYS_ACT else "refuse"


def _write_then_read_the_error(oracle_texts: list[str]) -> Policy | None:
    """The expert that tries the cancel on every order and, when the environment refuses it, tells the status the
    error implies: the check skipped, the environment used as the check. n/a where the expert cancels (there the
    script is the expert's)."""
    if any("cancel_pending_order" in text for text in oracle_texts):
        return None

    def policy(turn: int, game: Game, rng: Any) -> str:
        refused = any(r.name == "cancel_pending_order" and not r.ok for r in game.state.tool_calls)
        return game.instance.refusal if refused else game.ablated_response(ALWAYS_ACT)
    return policy


WRITE_THEN_READ_THE_ERROR = Probe("write_then_read_the_error", "tries the cancel, then tells the status the "
                                  "environment's refusal implies", _write_then_read_the_error)


SPEC = register_game(kit_game_spec(
    RetailPreconditionGame, RetailPreconditionConfig, CAPABILITY, hint=HINT,
    difficulty_knobs=(DifficultyKnob("status_claim_rate", "increase", (0.0, 0.5, 1.0)),),
    probes=(WRITE_THEN_READ_THE_ERROR,)))
