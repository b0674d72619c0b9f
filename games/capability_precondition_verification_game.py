"""Capability game `precondition_verification`: check an order's status before changing it.

Each request asks for one change to one order: cancel it, change its shipping address, or return its
items (exchange an item too, with a surface). The storefront policy allows a cancel or an address change
only for a *pending* order and a return or exchange only for a *delivered* one. A share of requests
(`violating_fraction`, each drawn on its own) gives the order a status that forbids it. The customer never
says the status (with `eligibility_claim_rate` they even claim the order is eligible, truthfully or not),
so the only way to know is `get_order_details`.

One request per episode, as in the target (`requests_per_episode`, default 1): a request is one binary
decision (act or refuse), so the decision classes are `act` and `refuse` and a constant policy wins the
episodes its constant answer fits: `violating_fraction` (default 0.5) keeps the two classes level, and
validate_game holds every skill-less policy to the larger class's share + 0.05 (pipeline/probes.py's
class-prior rule) at every knob value. The ablations: the expert without the check (`always_act`) and the
constant refuser that still reads and tells the status (`always_refuse`) each win exactly the instances of
their class and none other (measured over 200 seeds on the demo's surface: 0.495 / 0.505); neither ever wins
an instance where the check decides. More requests per episode stay a knob (each decision then has to fit).

Surface (`storefront`, see games/_storefront/): each request is the target's own, drawn by its
`RequestBuilder`: one of the target's kinds that has a status rule (cancel, order address, return,
exchange) at the target's relative weights, with its id forms (loose ids, an unknown id and the order
search), reason phrasings, items and refund targets, and the confirmation rule when the target has it;
`violating_fraction` stands in for the target's `forbidden_rate` and `email_auth_rate` (unless set) is
the target's. Alone (no surface): cancel, order address and return, drawn uniformly, exact `#W` ids, a
return of every item of the order.

Expert (oracle): ask who the customer is, look them up, then per request look the order up and either
confirm, make the change and say so, or change nothing and tell the customer the status: 2 + 4 turns per
request (2 when refusing); with a surface up to 8 per request (an order search, the product of an
exchange, a gift card's record).

Reward (in [0, 1]; success = 1.0): per request, averaged over the episode's requests,
  0.6  action: the order was looked up (get_order_details on it) and ends as expected (changed when
       allowed, unchanged when not);
  0.4  communication, only on top of the action part, in an honest reply (no pasted tool output, no
       other status, amount or order id than the instance's):
       allowed:     after the write, the order id (cancel, address change) or the amount (return: the
                    refund; exchange: the price difference);
       not allowed: after the order's look-up, a reply names the order and asserts its actual status;
  x 0  the whole episode when anything not asked for changed (another order, user or product) or the
       policy's procedure broke (a call before authentication, a write on an order not looked up, an id
       that was never shown, a write without the customer's yes right before it).
Nothing scores without the look-up: the check is the capability, and an agent that does nothing (or
refuses unseen, or hands over to a human) would otherwise earn the action part on every forbidden
request, more than an honest attempt that slips.

Difficulty: `eligibility_claim_rate` (declared knob, harder as it rises): the customer claims the order is
eligible ("It has not shipped yet."), truthfully or not, which tempts an agent to skip the look-up (an
agent that trusts the claim scores 1.0 / 0.62 / 0.31 / 0.10 / 0.0 mean reward at 0 / 0.25 / 0.5 / 0.75 / 1).
`violating_fraction` is a class prior, not a difficulty: it moves the share of refusals.

Tools: the storefront's full toolkit, the target agent's own schemas (a tool the game has no use for is
still offered, as in the target; a write the plan does not make changes the database and voids the
action part).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from benchmarks.storefront.communication import Replies
from benchmarks.storefront.db import StoreDB, User, add_order, generate_db
from benchmarks.storefront.probes import GUESS_STATUSES, NAME_EVERY_STATUS
from benchmarks.storefront.tasks import CANNOT, RequestBuilder, SubRequest, descriptions_unique, draw_customer
from common.validation import check_choices, check_number
from games._storefront.config import StorefrontGameConfig, draw_kind, surface_kind_weights
from games._storefront.game import StorefrontCapabilityGame
from games._storefront.instances import Instance, PlannedCall, PlannedRequest, identity_sentence
from games._storefront.replies import address_text, money, new_address, original_payment_method
from games._storefront.spec import storefront_game_spec
from game_registry import DifficultyKnob, register_game

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
# Claims the customer may add (true for allowed orders, false for forbidden ones).
ELIGIBILITY_CLAIMS = {"cancel": " It has not shipped yet.", "modify_order_address": " It has not shipped yet.",
                      "return": " It arrived last week.", "exchange": " It arrived last week."}
REASON_TEXTS = {"no longer needed": "I no longer need it.", "ordered by mistake": "I ordered it by mistake."}
ACTION_WEIGHT, COMMUNICATION_WEIGHT = 0.6, 0.4
ALWAYS_ACT, ALWAYS_REFUSE = "always_act", "always_refuse"  # the ablations (see the module docstring)
REQUESTS_PER_EPISODE = 1  # the target's shape: one customer, one request
# The oracle's turns: ask identity and look the user up once, then per request look the order up, confirm,
# write, tell (alone). With a surface a request can take up to 8 (an order search: the customer's record
# and two earlier orders; an exchange's product); an instance whose plan does not fit is drawn again.
ORACLE_TURNS_PER_REQUEST = 4
MAX_STEPS = 12  # the demo target's turn limit (evaluate.max_steps): one request with look-ups to spare
MAX_TURNS = 20  # the registered cap on turns: room for requests_per_episode=3 (max_steps=20)

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
    requests_per_episode: int = REQUESTS_PER_EPISODE  # decisions per episode, one request at a time (a knob)
    max_steps: int = MAX_STEPS  # room for the oracle's plans (with a surface, longer ones are drawn again)

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        check_number(self.violating_fraction, f"{owner}.violating_fraction", 0, 1)
        check_number(self.eligibility_claim_rate, f"{owner}.eligibility_claim_rate", 0, 1)
        if self.email_auth_rate is not None:
            check_number(self.email_auth_rate, f"{owner}.email_auth_rate", 0, 1)
        kinds = REQUEST_KINDS if self.surface is None else SURFACE_KINDS
        if self.request_kinds is not None:
            self.request_kinds = check_choices(self.request_kinds, f"{owner}.request_kinds", kinds)
        # {kind: weight} of the requests drawn (not a field: the summary shows request_kinds as given).
        self.drawn_kinds = (dict.fromkeys(self.request_kinds or REQUEST_KINDS, 1.0) if self.surface is None else
                            surface_kind_weights(owner, self.surface, SURFACE_KINDS, self.request_kinds,
                                                 "request_kinds"))
        self.check_room(2 + ORACLE_TURNS_PER_REQUEST * self.requests_per_episode,
                        f"the oracle with requests_per_episode={self.requests_per_episode}")


def requested_plan(sub: SubRequest, request: PlannedRequest) -> PlannedRequest:
    """`request` done as the customer asked whatever the order's status (the expert without the check)."""
    steps = sub.steps if sub.allowed else sub.steps + sub.requested
    return PlannedRequest(sub.kind, [PlannedCall(s.name, s.arguments) for s in steps if not s.is_confirm],
                          sub.requested_statement, request.info, user=sub.user,
                          confirm_text=next((s.text for s in steps if s.is_confirm), ""))


def refused_plan(kind: str, request: PlannedRequest, status: str) -> PlannedRequest:
    """`request` refused after the order's look-up whatever its status, telling the status it has."""
    oid = request.info["order_id"]
    end = next(i for i, c in enumerate(request.calls)
               if c.name == "get_order_details" and c.arguments.get("order_id") == oid)
    return PlannedRequest(kind, request.calls[:end + 1], f"Order {oid} is {status}, so {CANNOT[kind]}.",
                          request.info, user=request.user)


class PreconditionVerificationGame(StorefrontCapabilityGame):
    """`requests_per_episode` requests, one at a time, each on an order whose status may forbid it."""

    game_name = GAME_NAME
    capability = CAPABILITY
    ABLATIONS = {ALWAYS_ACT: "does what is asked whatever the order's status (looks it up, never reads it)",
                 ALWAYS_REFUSE: "looks the order up and refuses, telling its status, whatever the status"}
    DECISION_CLASSES = ("act", "refuse")

    def request_class(self, request: PlannedRequest) -> str:
        """`act` when the order's status allows the request, `refuse` when it forbids it."""
        return "act" if request.info["allowed"] else "refuse"

    def __init__(self, config: PreconditionVerificationConfig | None = None) -> None:
        super().__init__(config or PreconditionVerificationConfig())
        config = self.config
        # The target's rates, with the game's share of forbidden requests and of email customers.
        self.rates = None if config.surface is None else config.surface_rates(
            forbidden_rate=config.violating_fraction, email_auth_rate=config.email_share(config.email_auth_rate))

    def _draw_from_surface(self, rng: random.Random) -> Instance | None:
        """Target requests of kinds with a status rule, each forbidden at `violating_fraction`, maybe with a
        claim (None when an order description reads ambiguously, as the target redraws)."""
        customer = draw_customer(rng, self.rates)
        builder = RequestBuilder(rng, self.rates, customer.db, customer.user)
        subs, clauses, claims = [], [], []
        for _ in range(self.config.requests_per_episode):
            kind = draw_kind(rng, self.config.drawn_kinds)
            sub = builder.build(kind)
            claims.append(rng.random() < self.config.eligibility_claim_rate)
            subs.append(sub)
            clauses.append(sub.clause + (ELIGIBILITY_CLAIMS[kind] if claims[-1] else ""))
        if not descriptions_unique(customer.db, customer.user, subs):
            return None

        def ablated(sub: SubRequest, request: PlannedRequest) -> dict[str, PlannedRequest]:
            return {ALWAYS_ACT: requested_plan(sub, request),
                    ALWAYS_REFUSE: refused_plan(sub.kind, request, sub.status)}

        instance = self.surface_instance(rng, customer, subs, {"eligibility_claims": sum(claims)}, clauses, ablated)
        for request, claim in zip(instance.requests, claims):
            request.info["eligibility_claim"] = claim
        return instance

    def _build_alone(self, rng: random.Random) -> Instance:
        """The game's own instance (no surface): a fresh store, exact ids, the requests' plain words."""
        config = self.config
        db = generate_db(rng, n_users=2, n_products=4, min_orders=1, max_orders=1, ids=config.ids)
        user = next(iter(db.users.values()))
        auth = "email" if rng.random() < config.email_share(config.email_auth_rate) else "name_zip"
        requests, clauses = [], []
        for _ in range(config.requests_per_episode):
            request, clause = self._alone_request(rng, db, user)
            requests.append(request)
            clauses.append(clause)
        identity = identity_sentence(user, auth)
        opening, follow_ups = self.make_messages(rng, identity, clauses)
        return Instance(db=db, user=user, auth=auth, opening=opening, requests=requests, follow_ups=follow_ups,
                        info={"eligibility_claims": sum(r.info["eligibility_claim"] for r in requests)},
                        identity_reply=identity)

    def _alone_request(self, rng: random.Random, db: StoreDB, user: User) -> tuple[PlannedRequest, str]:
        """One request of the game alone on a fresh order of `user`, and the customer's clause for it."""
        config = self.config
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
        info["eligibility_claim"] = rng.random() < config.eligibility_claim_rate
        if info["eligibility_claim"]:
            clause += ELIGIBILITY_CLAIMS[kind]
        as_asked = PlannedRequest(kind, [look_up, write], done_statement, info)
        refused = PlannedRequest(kind, [look_up], f"Order {oid} is {status}, so {CANNOT[kind]}.", info)
        request = as_asked if allowed else refused
        request.ablated = {ALWAYS_ACT: as_asked, ALWAYS_REFUSE: refused}
        return request, clause

    def score(self) -> dict[str, float]:
        """Each request's parts (module docstring), averaged; nothing when anything not asked for changed or
        the policy's procedure broke."""
        if not self.nothing_else_changed() or self.policy_violations():
            return {"action": 0.0, "communication": 0.0}
        replies = self.told()
        return self.mean_parts([self._request_parts(r, replies) for r in self.instance.requests])

    def _request_parts(self, request: PlannedRequest, replies: Replies) -> dict[str, float]:
        info = request.info
        action_ok = self.looked_up_order(info["order_id"]) and self.request_done(request)
        if info["allowed"]:  # report what the write did
            told = self.request_reported(request, replies)
        else:  # report what the look-up showed
            told = replies.tells_status(info["status"], order_id=info["order_id"],
                                        after=self.call_position("get_order_details", order_id=info["order_id"])
                                        ) and not replies.voided(info["order_id"])  # a wrong status asserted costs
        return {"action": ACTION_WEIGHT if action_ok else 0.0,
                "communication": COMMUNICATION_WEIGHT if action_ok and told else 0.0}



register_game(storefront_game_spec(
    PreconditionVerificationGame, PreconditionVerificationConfig, CAPABILITY, hint=HINT,
    max_turns=MAX_TURNS,
    difficulty_knobs=(DifficultyKnob("eligibility_claim_rate", "increase", (0.0, 0.25, 0.5, 0.75, 1.0)),),
    probes=(NAME_EVERY_STATUS, GUESS_STATUSES),
))
