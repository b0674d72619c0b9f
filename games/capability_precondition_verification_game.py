"""Capability game `precondition_verification`: check an order's status before changing it.

The customer asks for one change to one order: cancel it, change its shipping address, or return its
items (exchange an item too, with a surface). The storefront policy allows a cancel or an address change
only for a *pending* order and a return or exchange only for a *delivered* one. A share of instances
(`violating_fraction`) gives the order a status that forbids the request. The opening never says the
status (with `eligibility_claim_rate` the customer even claims the order is eligible, truthfully or not),
so the only way to know is `get_order_details`.

Surface (`storefront`, see games/_storefront_game_kit.py): the request is the target's own, drawn by its
`RequestBuilder`: one of the target's kinds that has a status rule (cancel, order address, return,
exchange) at the target's relative weights, with its id forms (loose ids, an unknown id and the order
search), reason phrasings, items and refund targets, and the confirmation rule when the target has it;
`violating_fraction` stands in for the target's `forbidden_rate` and `email_auth_rate` (unless set) is
the target's. Alone (no surface): cancel, order address and return, drawn uniformly, exact `#W` ids, a
return of every item of the order.

Expert (oracle): ask who the customer is, look them up, look the order up, then either confirm, make
the change and say so, or change nothing and tell the customer the status. 6 turns (4 when refusing);
with a surface up to 10 (an order search, the product of an exchange, a gift card's record).

Reward (in [0, 1]; success = 1.0):
  0.6  action: the order was looked up (get_order_details on it), the final database equals the expected
       one (the write made when allowed; no write at all when not allowed; any other write also breaks it)
       and the policy's procedure holds (no call before authentication, no write on an order not looked
       up, no id that was never shown);
  0.4  communication, only on top of the action part, in an honest reply (no pasted tool output, no
       other status, amount or order id than the instance's):
       allowed:     after the write, the order id (cancel, address change) or the amount (return: the
                    refund; exchange: the price difference);
       not allowed: after the order's look-up, a reply names the order and asserts its actual status.
Nothing scores without the look-up: the check is the capability, and an agent that does nothing (or
refuses unseen, or hands over to a human) would otherwise earn the action part on every forbidden
instance, more than an honest attempt that slips.

Difficulty: `eligibility_claim_rate` (declared knob, harder as it rises): the customer claims the order is
eligible ("It has not shipped yet."), truthfully or not, which tempts an agent to skip the look-up.
`violating_fraction` is a class prior, not a difficulty: it moves the share of refusals.

Tools: the storefront's full toolkit, the target agent's own schemas (a tool the game has no use for is
still offered, as in the target; a write the plan does not make changes the database and voids the
action part).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from benchmarks.storefront.db import add_order, generate_db
from benchmarks.storefront.policy import POLICY
from benchmarks.storefront.probes import GUESS_STATUSES, NAME_EVERY_STATUS
from benchmarks.storefront.tasks import RequestBuilder, draw_customer
from game_registry import DifficultyKnob, GameSpec, register_game
from games._storefront_game_kit import (
    TARGET_BENCHMARK,
    Instance,
    PlannedCall,
    PlannedRequest,
    StorefrontCapabilityGame,
    StorefrontGameConfig,
    address_text,
    check_choices,
    check_fraction,
    draw_kind,
    identity_sentence,
    money,
    new_address,
    original_payment_method,
    surface_kind_weights,
)

CAPABILITY = "precondition_verification"
GAME_NAME = f"capability_{CAPABILITY}"
REQUEST_KINDS = ("cancel", "modify_order_address", "return")
SURFACE_KINDS = ("cancel", "modify_order_address", "return", "exchange")  # the target's kinds with a status rule
ALLOWED_STATUS = {"cancel": "pending", "modify_order_address": "pending", "return": "delivered"}
# Statuses an order can be generated with ("exchange requested" only arises from the exchange tool).
FORBIDDEN_STATUSES = {
    "cancel": ("processed", "delivered", "cancelled", "return requested"),
    "modify_order_address": ("processed", "delivered", "cancelled", "return requested"),
    "return": ("pending", "processed", "cancelled", "return requested"),
}
CANNOT = {"cancel": "it cannot be cancelled", "modify_order_address": "its address cannot be changed",
          "return": "it cannot be returned"}
# Claims the customer may add (true for allowed orders, false for forbidden ones).
ELIGIBILITY_CLAIMS = {"cancel": " It has not shipped yet.", "modify_order_address": " It has not shipped yet.",
                      "return": " It arrived last week.", "exchange": " It arrived last week."}
REASON_TEXTS = {"no longer needed": "I no longer need it.", "ordered by mistake": "I ordered it by mistake."}
ACTION_WEIGHT, COMMUNICATION_WEIGHT = 0.6, 0.4
ORACLE_TURNS = 6  # ask identity, look the user up, look the order up, confirm, write, tell
# With a surface: ask, user, the customer's record and two earlier orders (order search), order, product, confirm,
# write, tell.
SURFACE_ORACLE_TURNS = 10

HINT = ("Hint: call get_order_details first and read status. Cancel or change the address only if it is "
        "'pending'; return only if 'delivered'. Otherwise change nothing and tell the user the status.")


@dataclass
class PreconditionVerificationConfig(StorefrontGameConfig):
    """Difficulty knobs of the precondition game."""

    violating_fraction: float = 0.5  # share of instances whose order status forbids the request
    # Requests drawn. None: alone, REQUEST_KINDS uniformly; with a surface, its kinds in SURFACE_KINDS at its weights.
    request_kinds: tuple[str, ...] | None = None
    eligibility_claim_rate: float = 0.25  # share of openings where the customer claims the order is eligible
    # Share of customers who identify by email (the rest by name and zip). None: the surface's, alone 0.75.
    email_auth_rate: float | None = None
    max_steps: int = SURFACE_ORACLE_TURNS  # room for the oracle on a surface's longest plan

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        check_fraction(owner, "violating_fraction", self.violating_fraction)
        check_fraction(owner, "eligibility_claim_rate", self.eligibility_claim_rate)
        if self.email_auth_rate is not None:
            check_fraction(owner, "email_auth_rate", self.email_auth_rate)
        kinds = REQUEST_KINDS if self.surface is None else SURFACE_KINDS
        if self.request_kinds is not None:
            self.request_kinds = check_choices(owner, "request_kinds", self.request_kinds, kinds)
        # {kind: weight} of the requests drawn (not a field: the summary shows request_kinds as given).
        self.drawn_kinds = (dict.fromkeys(self.request_kinds or REQUEST_KINDS, 1.0) if self.surface is None else
                            surface_kind_weights(owner, self.surface, SURFACE_KINDS, self.request_kinds,
                                                 "request_kinds"))
        self.check_room(ORACLE_TURNS if self.surface is None else SURFACE_ORACLE_TURNS, "the oracle")


class PreconditionVerificationGame(StorefrontCapabilityGame):
    """One request on one order whose status may forbid it."""

    game_name = GAME_NAME
    capability = CAPABILITY

    def __init__(self, config: PreconditionVerificationConfig | None = None) -> None:
        super().__init__(config or PreconditionVerificationConfig())
        config = self.config
        # The target's rates, with the game's share of forbidden requests and of email customers.
        self.rates = None if config.surface is None else config.surface_rates(
            forbidden_rate=config.violating_fraction, email_auth_rate=config.email_share(config.email_auth_rate))

    def _draw_from_surface(self, rng: random.Random) -> Instance:
        """One target request of a kind with a status rule, forbidden at `violating_fraction`, maybe with a claim."""
        customer = draw_customer(rng, self.rates)
        kind = draw_kind(rng, self.config.drawn_kinds)
        sub = RequestBuilder(rng, self.rates, customer.db, customer.user).build(kind)
        claim = rng.random() < self.config.eligibility_claim_rate
        clause = sub.clause + (ELIGIBILITY_CLAIMS[kind] if claim else "")
        return self.surface_instance(rng, customer, [sub], {"eligibility_claim": claim}, [clause])

    def _build_alone(self, rng: random.Random) -> Instance:
        """The game's own instance (no surface): a fresh store, an exact id, the request's plain words."""
        config = self.config
        db = generate_db(rng, n_users=2, n_products=4, min_orders=1, max_orders=1, ids=config.ids)
        user = next(iter(db.users.values()))
        auth = "email" if rng.random() < config.email_share(config.email_auth_rate) else "name_zip"
        kind = rng.choice(tuple(config.drawn_kinds))
        allowed = rng.random() >= config.violating_fraction
        status = ALLOWED_STATUS[kind] if allowed else rng.choice(FORBIDDEN_STATUSES[kind])
        order = add_order(rng, db, user, status)
        oid = order.order_id
        look_up = PlannedCall("get_order_details", {"order_id": oid})
        info = {"order_id": oid, "status": status, "allowed": allowed}

        if kind == "cancel":
            reason = rng.choice(tuple(REASON_TEXTS))
            clause = f"cancel order {oid}. {REASON_TEXTS[reason]}"
            write = PlannedCall("cancel_pending_order", {"order_id": oid, "reason": reason})
            done_statement = f"Order {oid} is cancelled."
        elif kind == "modify_order_address":
            address = new_address(rng, order.address)
            clause = f"change the shipping address of order {oid} to {address_text(address)}."
            write = PlannedCall("modify_pending_order_address", {"order_id": oid, **address.to_dict()})
            done_statement = f"The address of order {oid} is updated."
        else:
            method = original_payment_method(order)
            clause = f"return the {' and the '.join(i.name for i in order.items)} from order {oid}."
            write = PlannedCall("return_delivered_order_items", {
                "order_id": oid, "item_ids": [i.item_id for i in order.items], "payment_method_id": method})
            info["amount"] = order.total
            done_statement = f"The return is requested. You will get {money(order.total)} back to {method}."
        claim = rng.random() < config.eligibility_claim_rate
        if claim:
            clause += ELIGIBILITY_CLAIMS[kind]
        if allowed:
            request = PlannedRequest(kind, [look_up, write], done_statement, info)
        else:
            request = PlannedRequest(kind, [look_up], f"Order {oid} is {status}, so {CANNOT[kind]}.", info)
        identity = identity_sentence(user, auth)
        return Instance(db=db, user=user, auth=auth, opening=self.make_opening(rng, identity, [clause]),
                        requests=[request], info={"eligibility_claim": claim}, identity_reply=identity)

    def score(self) -> dict[str, float]:
        request = self.instance.requests[0]
        info = request.info
        action_ok = (self.looked_up_order(info["order_id"]) and self.db == self.expected_db
                     and not self.policy_violations())
        replies = self.told()
        if not info["allowed"]:  # report what the look-up showed
            told = replies.tells_status(info["status"], order_id=info["order_id"],
                                        after=self.call_position("get_order_details", order_id=info["order_id"]))
        elif "amount" in info:  # a return or exchange: report what the write did
            told = replies.tells_amount(info["amount"], after=self.written(request))
        else:
            told = replies.tells_order_id(info["order_id"], after=self.written(request))
        told = told and not replies.voided(info["order_id"])  # a wrong status or amount asserted costs
        return {"action": ACTION_WEIGHT if action_ok else 0.0,
                "communication": COMMUNICATION_WEIGHT if action_ok and told else 0.0}


def make_game(config: PreconditionVerificationConfig | None = None) -> PreconditionVerificationGame:
    """A fresh game (default config when None)."""
    return PreconditionVerificationGame(config)


register_game(GameSpec(
    name=GAME_NAME,
    make_env=make_game,
    system_prompt=POLICY,
    base_prompt="",
    hint_prompt=HINT,
    max_gen_tokens=160,  # as the target: the longest expert turn (an address change) is ~110 tokens
    max_turns=PreconditionVerificationConfig().max_steps,
    capability=CAPABILITY,
    config_cls=PreconditionVerificationConfig,
    target=TARGET_BENCHMARK,
    difficulty_knobs=(DifficultyKnob("eligibility_claim_rate", "increase", (0.0, 0.25, 0.5, 0.75, 1.0)),),
    probes=(NAME_EVERY_STATUS, GUESS_STATUSES),
))
