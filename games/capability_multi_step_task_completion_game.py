"""Capability game `multi_step_task_completion`: finish every request of a compound message.

The customer's opening lists `n_requests` independent requests (cancel an order, change an order's
shipping address, change the default address, return an order's items), every one of them allowed by
the policy. As in the target benchmark, each statement the agent makes closes the current request and
the customer only answers "Thanks." without repeating what is left: keeping track of the remaining
requests is the agent's job. The customer leaves after the last statement.

Surface (`storefront`, see games/_storefront/): the requests are the target's own, drawn by its
`RequestBuilder` from every kind the target draws (the default address at most once) at the target's
relative weights, all allowed, with the target's id forms (loose and unknown ids, with the order search),
reasons, addresses, items, refund targets and confirmation rule; `n_requests` stands in for the target's
request counts and `email_auth_rate` (unless set) is the target's. Alone (no surface): `request_kinds`
drawn uniformly (default: cancel, order address, default address), exact ids, every item returned.

Expert (oracle): ask who the customer is, look them up, then per request: look the order up, confirm,
write, state the result. 2 + 4 per order request + 3 per default-address request turns (10 for two
order requests); with a surface one more per exchange (the product) or gift-card refund (the customer's
record, once), and up to 3 for an order search.

Reward (in [0, 1]; success = 1.0), split evenly over the n requests:
  0.6 / n  per request whose target is in the expected state (its order equals the expected order;
           for the default address, the customer's address equals the expected one);
  0.4 / n  per request done AND reported after its write in an honest reply (no pasted tool output, no
           value outside the instance's): order id (cancel, order address change), amount (return: the
           refund; exchange: the price difference), the words "default address" (default-address change);
  x 0      when anything not asked for changed (another order, another user, the products, or the
           customer's address when no default-address change was asked), or when the policy's procedure
           was broken (a call before authentication, a write on an order not looked up, an id never shown).
Stopping after the first of two requests scores 0.5.

Difficulty: `n_requests` (declared knob, harder as it rises).

Tools: the storefront's full toolkit, the target agent's own schemas (a tool the game has no use for is
still offered, as in the target; a write the plan does not make changes the database and voids the
action part).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from benchmarks.storefront.db import add_order, generate_db
from benchmarks.storefront.tasks import RequestBuilder, descriptions_unique, draw_customer
from benchmarks.storefront.user_sim import REQUEST_KINDS as SURFACE_KINDS  # every kind can be one of several
from common.validation import InputError
from common.validation import check_choices, check_int, check_number
from games._storefront.config import StorefrontGameConfig, draw_kind, surface_kind_weights
from games._storefront.game import StorefrontCapabilityGame
from games._storefront.instances import Instance, PlannedCall, PlannedRequest, identity_sentence
from games._storefront.replies import address_text, money, new_address, original_payment_method
from games._storefront.spec import storefront_game_spec
from game_registry import DifficultyKnob, register_game

CAPABILITY = "multi_step_task_completion"
GAME_NAME = f"capability_{CAPABILITY}"
REQUEST_KINDS = ("cancel", "modify_order_address", "modify_user_address", "return")
DEFAULT_REQUEST_KINDS = ("cancel", "modify_order_address", "modify_user_address")  # the target's compound mix
ORDER_STATUS = {"cancel": "pending", "modify_order_address": "pending", "return": "delivered"}
REASON_TEXTS = {"no longer needed": "I no longer need it.", "ordered by mistake": "I ordered it by mistake."}
MAX_REQUESTS = 4
SEARCH_TURNS = 3  # with a surface, an order search: the customer's record and the two orders they start with
ACTION_WEIGHT, COMMUNICATION_WEIGHT = 0.6, 0.4

HINT = ("Hint: the user asked for several things. Handle them one by one (look up, act, tell the result) and "
        "after each 'Thanks.' go on with the next request until every one is done.")


@dataclass
class MultiStepTaskCompletionConfig(StorefrontGameConfig):
    """Difficulty knobs of the compound-request game."""

    n_requests: int = 2  # requests in the opening message (1..4)
    # Drawn with replacement, the default address once. None: alone, DEFAULT_REQUEST_KINDS uniformly; with a
    # surface, the kinds it draws at its weights.
    request_kinds: tuple[str, ...] | None = None
    # Share of customers who identify by email (the rest by name and zip). None: the surface's, alone 0.75.
    email_auth_rate: float | None = None
    max_steps: int = 25  # room for four requests drawn from a surface (see oracle_room)

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        check_int(self.n_requests, f"{owner}.n_requests", 1, MAX_REQUESTS)
        if self.requests_per_episode != 1:
            raise InputError(f"{owner}: this game's requests all come in the opening (n_requests sets how many); "
                             f"drop requests_per_episode={self.requests_per_episode} and pass n_requests instead")
        if self.email_auth_rate is not None:
            check_number(self.email_auth_rate, f"{owner}.email_auth_rate", 0, 1)
        kinds = REQUEST_KINDS if self.surface is None else SURFACE_KINDS
        if self.request_kinds is not None:
            self.request_kinds = check_choices(self.request_kinds, f"{owner}.request_kinds", kinds)
        # {kind: weight} of the requests drawn (not a field: the summary shows request_kinds as given).
        self.drawn_kinds = (dict.fromkeys(self.request_kinds or DEFAULT_REQUEST_KINDS, 1.0) if self.surface is None
                            else surface_kind_weights(owner, self.surface, SURFACE_KINDS, self.request_kinds,
                                                      "request_kinds"))
        if tuple(self.drawn_kinds) == ("modify_user_address",) and self.n_requests > 1:
            raise InputError(f"{owner}: the default address can be changed once per episode, so request_kinds="
                             f"('modify_user_address',) allows only n_requests=1; add an order request kind")
        self.check_room(self.oracle_room(), f"the oracle with n_requests={self.n_requests}")

    def oracle_room(self) -> int:
        """The oracle's longest plan: ask, user look-up, then per request look-up, confirm, write, statement
        (with a surface, one more for a product or the customer's record, and an order search once)."""
        if self.surface is None:
            return 2 + 4 * self.n_requests
        return 2 + 5 * self.n_requests + SEARCH_TURNS


class MultiStepTaskCompletionGame(StorefrontCapabilityGame):
    """Several allowed requests in one opening message; all must be done."""

    game_name = GAME_NAME
    capability = CAPABILITY
    reveals_all_at_once = True  # the opening lists every request: keeping track of them is the skill

    def __init__(self, config: MultiStepTaskCompletionConfig | None = None) -> None:
        super().__init__(config or MultiStepTaskCompletionConfig())
        config = self.config
        # The target's rates, every request allowed, with the game's share of email customers.
        self.rates = None if config.surface is None else config.surface_rates(
            forbidden_rate=0.0, email_auth_rate=config.email_share(config.email_auth_rate))

    def _draw_from_surface(self, rng: random.Random) -> Instance | None:
        """`n_requests` allowed target requests (None when a later order holds the item an earlier request
        described its order by, as the target redraws)."""
        customer = draw_customer(rng, self.rates)
        kinds: list[str] = []
        for _ in range(self.config.n_requests):
            pool = {k: w for k, w in self.config.drawn_kinds.items() if k != "modify_user_address" or k not in kinds}
            kinds.append(draw_kind(rng, pool))
        builder = RequestBuilder(rng, self.rates, customer.db, customer.user)
        subs = [builder.build(kind) for kind in kinds]
        if not descriptions_unique(customer.db, customer.user, subs):
            return None
        return self.surface_instance(rng, customer, subs, {"n_requests": len(subs)})

    def _build_alone(self, rng: random.Random) -> Instance:
        """The game's own instance (no surface): a fresh store, exact ids, the requests' plain words."""
        config = self.config
        db = generate_db(rng, n_users=2, n_products=4, min_orders=1, max_orders=1, ids=config.ids)
        user = next(iter(db.users.values()))
        auth = "email" if rng.random() < config.email_share(config.email_auth_rate) else "name_zip"
        kinds: list[str] = []
        for _ in range(config.n_requests):
            choices = [k for k in config.drawn_kinds if k != "modify_user_address" or k not in kinds]
            kinds.append(rng.choice(choices))

        requests, clauses = [], []
        for kind in kinds:
            if kind == "modify_user_address":
                address = new_address(rng, user.address)
                clauses.append(f"update my default address to {address_text(address)}.")
                write = PlannedCall("modify_user_address", {"user_id": user.user_id, **address.to_dict()})
                requests.append(PlannedRequest(kind, [write], "Your default address is updated.",
                                               {"user_id": user.user_id}))
                continue
            order = add_order(rng, db, user, ORDER_STATUS[kind])
            oid = order.order_id
            look_up = PlannedCall("get_order_details", {"order_id": oid})
            info = {"order_id": oid}
            if kind == "cancel":
                reason = rng.choice(tuple(REASON_TEXTS))
                clauses.append(f"cancel order {oid}. {REASON_TEXTS[reason]}")
                write = PlannedCall("cancel_pending_order", {"order_id": oid, "reason": reason})
                statement = f"Order {oid} is cancelled."
            elif kind == "modify_order_address":
                address = new_address(rng, order.address)
                clauses.append(f"change the shipping address of order {oid} to {address_text(address)}.")
                write = PlannedCall("modify_pending_order_address", {"order_id": oid, **address.to_dict()})
                statement = f"The address of order {oid} is updated."
            else:
                method = original_payment_method(order)
                clauses.append(f"return the {' and the '.join(i.name for i in order.items)} from order {oid}.")
                write = PlannedCall("return_delivered_order_items", {
                    "order_id": oid, "item_ids": [i.item_id for i in order.items], "payment_method_id": method})
                info["amount"] = order.total
                statement = f"The return is requested. You will get {money(order.total)} back to {method}."
            requests.append(PlannedRequest(kind, [look_up, write], statement, info))
        identity = identity_sentence(user, auth)
        return Instance(db=db, user=user, auth=auth, opening=self.make_opening(rng, identity, clauses),
                        requests=requests, info={"n_requests": len(requests)}, identity_reply=identity)

    def score(self) -> dict[str, float]:
        requests = self.instance.requests
        if not self.nothing_else_changed() or self.policy_violations():
            return {"action": 0.0, "communication": 0.0}
        replies = self.told()
        done = [self.request_done(r) for r in requests]
        told = [d and self.request_reported(r, replies) for r, d in zip(requests, done)]
        n = len(requests)
        return {"action": ACTION_WEIGHT * sum(done) / n, "communication": COMMUNICATION_WEIGHT * sum(told) / n}



register_game(storefront_game_spec(
    MultiStepTaskCompletionGame, MultiStepTaskCompletionConfig, CAPABILITY, hint=HINT,
    max_turns=MultiStepTaskCompletionConfig().max_steps,
    difficulty_knobs=(DifficultyKnob("n_requests", "increase", (1, 2, 3, 4)),),
))
