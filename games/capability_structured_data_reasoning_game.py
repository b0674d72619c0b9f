"""Capability game `structured_data_reasoning`: read the right value out of nested tool output.

Each request is on a delivered order whose answer sits inside a JSON record among look-alike entries:
  return               return the named item(s) of an order that holds `n_distractor_items` other items:
                       the item ids come from `items`, the refund goes to the `payment_method_id` of the
                       order's `payment_history` (the customer owns `min_payment_methods` or more methods,
                       usually paid with one that is not their first), the refund amount is the sum of
                       the named items' prices;
  return_to_gift_card  the same, but the customer wants the refund on their gift card: its id is in
                       `payment_methods` of get_user_details;
  exchange             exchange the named item for the variant with a given option (e.g. the blue one):
                       the product id comes from the order's item, the new item id from the product's
                       `variants`; the price difference is paid with / refunded to the original method.

Surface (`storefront`, see games/_storefront/): the request is the target's own allowed return
or exchange, drawn by its `RequestBuilder` at the target's relative weights of the two kinds, so the
refund target (the order's payment method, which `other_payment_method_rate` makes another than the
customer's first, or their gift card at `gift_card_refund_rate`), the one or two returned items
(`two_items_rate`; `max_return_items=1` rules two out), the variants, id forms and openings are the
target's. The knobs then set the reading's need on top: the order holds `n_distractor_items` items
besides the named ones, and the customer owns `min_payment_methods` methods or more. `task_kinds` given
with a surface keeps the alone meaning of 'return_to_gift_card' (every refund to the gift card, and then
a plain 'return' none). Alone (no surface): the kinds above drawn uniformly.

One request per episode, as in the target (`requests_per_episode`, default 1; more stay a knob). The
decision the game turns on is where the money goes, so its decision classes are the refund (or charge)
targets the policy allows: `original_method` (the method in the order's `payment_history`: returns and
exchanges) and `gift_card` (a return the customer wants on their gift card, whose id is in
get_user_details). `gift_card_share` (default 0.5, a class prior, not a difficulty) keeps them level: the
target's own mix (a quarter of returns to the gift card, exchanges never) is 82/18, where always refunding
the original method would win most episodes it finishes. validate_game holds every skill-less policy to the
larger class's share + 0.05 at every knob value. Ablations: `first_payment_method` (the expert refunding or
charging the customer's first method, the storefront's `wrong_refund_method` flaw) wins only where the first
method is the right one; `first_items` (the order's first items instead of the named ones) only where they
are the named ones (`n_distractor_items=0`: every item of the order is named, so the reading of the items
decides nothing and the refund target alone decides success); `always_original_method` wins exactly the
original-method class. Measured over 200 seeds on the demo's surface (classes 0.53 / 0.47, limit 0.58):
0.34, 0.43 and 0.53; none wins an episode where its skill decides.

Expert (oracle): ask who the customer is, look them up, then per request read the order (and the user or
product record), confirm, write, then state the amount: 2 + 4 or 5 turns per request; with a surface up to
8 per request (an order search).

Reward (in [0, 1]; success = 1.0): per request, averaged over the episode's requests,
  0.6  action: the request's order ends as expected (right items, right new variant, right payment
       method): the item, variant and payment-method ids must be read, not guessed;
  0.4  communication, only on top of the action part: an honest reply after the write (no pasted tool
       output, no other amount) states the refund amount (return) or the price difference (exchange; the sign is not
       checked). Tools return the updated record, never the amount: it has to be added up;
  x 0  the whole episode when anything not asked for changed or the policy's procedure broke (a call before
       authentication, a write on an order not looked up, an id that was never shown, a write without a yes).

Difficulty (declared knobs, harder as they rise): `n_distractor_items` (look-alike items in the order)
and `min_payment_methods` (payment methods the refund target hides among).

Tools: the storefront's full toolkit, the target agent's own schemas (a tool the game has no use for is
still offered, as in the target; a write the plan does not make changes the database and voids the
action part).
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any

from benchmarks.storefront.config import StorefrontConfig
from benchmarks.storefront.db import Order, OrderItem, StoreDB, User, add_order, add_payment_method, generate_db
from benchmarks.storefront.tasks import RequestBuilder, SubRequest, descriptions_unique, draw_customer
from benchmarks.storefront.tools import StorefrontTools
from common.validation import InputError
from common.validation import check_choices, check_int, check_number
from games._storefront.config import StorefrontGameConfig, draw_kind, surface_kind_weights
from games._storefront.game import StorefrontCapabilityGame
from games._storefront.instances import MAX_DRAWS, Instance, PlannedCall, PlannedRequest, identity_sentence
from games._storefront.replies import money
from games._storefront.spec import storefront_game_spec
from game_registry import DifficultyKnob, register_game

CAPABILITY = "structured_data_reasoning"
GAME_NAME = f"capability_{CAPABILITY}"
TASK_KINDS = ("return", "return_to_gift_card", "exchange")
PAYMENT_SOURCES = ("credit_card", "paypal", "gift_card")
ACTION_WEIGHT, COMMUNICATION_WEIGHT = 0.6, 0.4
# The ablations (see the module docstring).
FIRST_METHOD, FIRST_ITEMS, ORIGINAL_METHOD = "first_payment_method", "first_items", "always_original_method"
REQUESTS_PER_EPISODE = 1  # the target's shape: one customer, one request
# The oracle's turns: ask identity and look the user up once, then per request the order, the user or product
# record, confirm, write, statement (alone). With a surface a request can take up to 8 (an order search); an
# instance whose plan does not fit is drawn again.
ORACLE_TURNS_PER_REQUEST = 5
MAX_STEPS = 12  # the demo target's turn limit (evaluate.max_steps): one request with look-ups to spare
MAX_TURNS = 20  # the registered cap on turns: room for requests_per_episode=3 (max_steps=20)
GIFT_CARD_SHARE = 0.5  # refunds to the gift card: the two decision classes level
SURFACE_KINDS = ("return", "exchange")  # the target's kinds where reading nested records applies (when allowed)

HINT = ("Hint: copy values from the tool output: the item_id of the named item, the item_id of the variant "
        "with the asked option, the payment_method_id from payment_history (the gift card id from "
        "get_user_details if asked). Add the returned items' prices and tell the amount.")


def add_payment_methods(rng: random.Random, db: StoreDB, user: User, minimum: int) -> None:
    """Give `user` payment methods until they own `minimum`; at most one gift card, so "refund it to my gift
    card" names exactly one method."""
    while len(user.payment_methods) < minimum:
        has_gift_card = any(p.source == "gift_card" for p in user.payment_methods)
        sources = [s for s in PAYMENT_SOURCES if s != "gift_card" or not has_gift_card]
        add_payment_method(rng, db, user, rng.choice(sources))


def reading_facts(order: Order, sub: SubRequest) -> dict[str, Any]:
    """What a surface request's summary records, as the game alone does: the order's size, the method it was
    paid with, and the write's refund target (return) or new item (exchange)."""
    write = sub.write.arguments
    facts: dict[str, Any] = {"paid_with": order.payment_history[0].payment_method_id, "n_items": len(order.items)}
    if sub.kind == "exchange":
        facts["new_item_id"] = write["new_item_ids"][0]
    else:
        facts["refund_to"] = write["payment_method_id"]
    return facts


@dataclass
class StructuredDataReasoningConfig(StorefrontGameConfig):
    """Difficulty knobs of the nested-value game."""

    # Requests drawn. None: alone, TASK_KINDS uniformly; with a surface, its returns and exchanges at its weights.
    task_kinds: tuple[str, ...] | None = None
    n_distractor_items: int = 1  # items of the order the customer does not ask about (0..4)
    # A return names 1..max_return_items items (1..2). None: alone 1; with a surface, two at its two_items_rate.
    max_return_items: int | None = None
    min_payment_methods: int = 2  # payment methods the customer owns at least (1..5)
    # Share of customers who identify by email (the rest by name and zip). None: the surface's, alone 0.75.
    email_auth_rate: float | None = None
    # Share of requests refunded to the customer's gift card (kind 'return_to_gift_card'); the rest are drawn
    # from the other kinds and go to the order's own method. A class prior (see the module docstring), not a
    # difficulty. None: the kinds as drawn (alone: `task_kinds` uniformly; with a surface, the target's mix).
    gift_card_share: float | None = GIFT_CARD_SHARE
    requests_per_episode: int = REQUESTS_PER_EPISODE  # requests per episode, one at a time (a knob)
    max_steps: int = MAX_STEPS  # room for the oracle's plans (with a surface, longer ones are drawn again)

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        if self.task_kinds is not None:
            self.task_kinds = check_choices(self.task_kinds, f"{owner}.task_kinds", TASK_KINDS)
        check_int(self.n_distractor_items, f"{owner}.n_distractor_items", 0, 4)
        if self.max_return_items is not None:
            check_int(self.max_return_items, f"{owner}.max_return_items", 1, 2)
        check_int(self.min_payment_methods, f"{owner}.min_payment_methods", 1, 5)
        if self.email_auth_rate is not None:
            check_number(self.email_auth_rate, f"{owner}.email_auth_rate", 0, 1)
        # {kind: weight} of the requests drawn (not a field: the summary shows task_kinds as given).
        self.drawn_kinds = (dict.fromkeys(self.task_kinds or TASK_KINDS, 1.0) if self.surface is None else
                            surface_kind_weights(owner, self.surface, SURFACE_KINDS, self.task_kinds, "task_kinds"))
        if self.gift_card_share is not None:
            check_number(self.gift_card_share, f"{owner}.gift_card_share", 0, 1)
            self.drawn_kinds = self._with_gift_card_share(owner)
        if "return_to_gift_card" in self.drawn_kinds and self.min_payment_methods < 2:
            raise InputError(f"{owner}: task kind 'return_to_gift_card' needs a gift card besides the method the "
                             f"order was paid with; pass min_payment_methods=2 or more, or drop that kind")
        if self.surface is not None:
            self._check_store_size(owner)
        self.check_room(2 + ORACLE_TURNS_PER_REQUEST * self.requests_per_episode,
                        f"the oracle with requests_per_episode={self.requests_per_episode}")

    def _with_gift_card_share(self, owner: str) -> dict[str, float]:
        """`drawn_kinds` reweighted so that 'return_to_gift_card' is `gift_card_share` of the requests and the
        other kinds share the rest at their own relative weights."""
        share = self.gift_card_share
        others = {k: w for k, w in self.drawn_kinds.items() if k != "return_to_gift_card"}
        chosen = self.task_kinds or ()
        if share > 0 and self.task_kinds is not None and not {"return", "return_to_gift_card"} & set(chosen):
            raise ValueError(f"{owner}: gift_card_share={share} needs returns but task_kinds={list(chosen)}; add "
                             f"'return_to_gift_card' to task_kinds or pass gift_card_share=0 (or None)")
        if share < 1 and not others:
            raise ValueError(f"{owner}: gift_card_share={share} leaves {1 - share:.2f} of requests to kinds other than "
                             f"'return_to_gift_card', but task_kinds has none; pass gift_card_share=1.0 (or None)")
        total = sum(others.values())
        weights = {k: (1 - share) * w / total for k, w in others.items()} if others else {}
        if share > 0:
            weights["return_to_gift_card"] = share
        return {k: w for k, w in weights.items() if w > 0}

    def _check_store_size(self, owner: str) -> None:
        """The surface's store must hold an order of the named items plus the distractors (distinct products)."""
        needed = (1 if self.max_return_items == 1 else 2) + self.n_distractor_items
        if self.surface.n_products < needed:
            raise InputError(f"{owner}: n_distractor_items={self.n_distractor_items} needs orders of {needed} distinct "
                             f"products but the storefront has n_products={self.surface.n_products}; lower "
                             f"n_distractor_items or give the storefront n_products={needed}")

    def surface_rates(self, kind: str) -> StorefrontConfig:
        """The surface's rates for one kind of request: always allowed, two-item returns unless ruled out, every
        refund to the gift card for 'return_to_gift_card' (and none for a 'return' drawn beside it)."""
        gift_card = self.surface.gift_card_refund_rate
        if kind == "return_to_gift_card":
            gift_card = 1.0
        elif "return_to_gift_card" in self.drawn_kinds:
            gift_card = 0.0
        two_items = 0.0 if self.max_return_items == 1 else self.surface.two_items_rate
        return super().surface_rates(forbidden_rate=0.0, gift_card_refund_rate=gift_card, two_items_rate=two_items,
                                     email_auth_rate=self.email_share(self.email_auth_rate))


class ReadingBuilder(RequestBuilder):
    """The target's request builder with orders that hold `distractors` items besides the ones named."""

    def __init__(self, rng: random.Random, config: StorefrontConfig, db: StoreDB, user: User,
                 distractors: int) -> None:
        super().__init__(rng, config, db, user)
        self.distractors = distractors

    def order_for(self, status: str, n_items: int | None = None) -> Order:
        return super().order_for(status, (n_items or 1) + self.distractors)

    def returned_items(self, order: Order, two_items: bool) -> list[OrderItem]:
        """Two items at random (not the whole order) for a two-item return, else one."""
        return self.rng.sample(order.items, 2) if two_items else [self.rng.choice(order.items)]


def refund_plan(request: PlannedRequest, method: str) -> PlannedRequest:
    """`request` with its refund or charge on payment method `method` (in its write, statement and question)."""
    write = next(c for c in request.calls if StorefrontTools.is_write(c.name))
    right = write.arguments["payment_method_id"]
    calls = [PlannedCall(c.name, {**c.arguments, "payment_method_id": method}) if c is write else c
             for c in request.calls]
    return dataclasses.replace(request, calls=calls, statement=request.statement.replace(right, method),
                               confirm_text=request.confirmation.replace(right, method), ablated={})


def first_method_plan(request: PlannedRequest, user: User) -> PlannedRequest:
    """`request` with the refund or charge on the customer's first payment method, whatever the order was paid
    with (the expert that does not read payment_history: the storefront's `wrong_refund_method` flaw)."""
    return refund_plan(request, user.payment_methods[0].id)


def original_method_plan(request: PlannedRequest, paid_with: str) -> PlannedRequest:
    """`request` with the refund on the method the order was paid with even when the customer asked for their gift
    card (the constant decision 'always the original method')."""
    return refund_plan(request, paid_with)


def first_items_plan(request: PlannedRequest, order: Order) -> PlannedRequest:
    """`request` with the order's first items in place of the named ones (the expert that does not find the
    named item among the others)."""
    write = next(c for c in request.calls if StorefrontTools.is_write(c.name))
    named = write.arguments["item_ids"]
    first = [i.item_id for i in order.items[:len(named)]]
    calls = [PlannedCall(c.name, {**c.arguments, "item_ids": first}) if c is write else c for c in request.calls]
    return dataclasses.replace(request, calls=calls, ablated={})


class StructuredDataReasoningGame(StorefrontCapabilityGame):
    """`requests_per_episode` returns or exchanges, one at a time, whose arguments and amounts must be read
    from nested records."""

    game_name = GAME_NAME
    capability = CAPABILITY
    ABLATIONS = {FIRST_METHOD: "refunds or charges the customer's first payment method (does not read the "
                               "order's payment_history)",
                 FIRST_ITEMS: "returns or exchanges the order's first items (does not find the named ones)",
                 ORIGINAL_METHOD: "refunds the method the order was paid with, even when the customer asks for "
                                  "their gift card (a constant refund decision)"}
    DECISION_CLASSES = ("original_method", "gift_card")

    def request_class(self, request: PlannedRequest) -> str:
        """`gift_card` when the refund goes to the customer's gift card rather than the method the order was paid
        with, else `original_method` (every exchange, and returns refunded where the order was paid)."""
        refund_to = request.info.get("refund_to")
        return "gift_card" if refund_to is not None and refund_to != request.info["paid_with"] else "original_method"

    def __init__(self, config: StructuredDataReasoningConfig | None = None) -> None:
        super().__init__(config or StructuredDataReasoningConfig())
        config = self.config
        self.rates = (None if config.surface is None else
                      {kind: config.surface_rates(kind) for kind in config.drawn_kinds})

    def _draw_from_surface(self, rng: random.Random) -> Instance | None:
        """Allowed target returns or exchanges among the knobs' distractor items and payment methods. The kinds
        (so the decision classes) are drawn first and kept while the customer and orders are drawn again: a
        'return_to_gift_card' of a customer who paid with their only gift card, or an order description that reads
        ambiguously, is drawn again with the same kinds, so redraws do not tilt the classes' shares (None after
        MAX_DRAWS such draws)."""
        config = self.config
        kinds = [draw_kind(rng, config.drawn_kinds) for _ in range(config.requests_per_episode)]
        for _ in range(MAX_DRAWS):
            drawn = self._draw_customer_for(rng, kinds)
            if drawn is not None:
                customer, subs = drawn
                break
        else:
            return None
        orders = customer.db.orders
        instance = self.surface_instance(
            rng, customer, subs, {"n_payment_methods": len(customer.user.payment_methods)},
            ablated=lambda sub, request: {
                FIRST_METHOD: first_method_plan(request, customer.user),
                FIRST_ITEMS: first_items_plan(request, orders[sub.order_id]),
                ORIGINAL_METHOD: original_method_plan(request, orders[sub.order_id].payment_history[0].payment_method_id)})
        for request, sub in zip(instance.requests, subs):
            request.info.update(reading_facts(orders[sub.order_id], sub))
        return instance

    def _draw_customer_for(self, rng: random.Random, kinds: list[str]) -> tuple[Any, list[SubRequest]] | None:
        """(customer, one target request per kind), or None when a kind could not be met (see _draw_from_surface)."""
        customer = draw_customer(rng, self.rates[kinds[0]])  # the customer's rates are the same for every kind
        add_payment_methods(rng, customer.db, customer.user, self.config.min_payment_methods)
        subs = []
        for kind in kinds:
            builder = ReadingBuilder(rng, self.rates[kind], customer.db, customer.user, self.config.n_distractor_items)
            sub = builder.build("exchange" if kind == "exchange" else "return")
            if kind == "return_to_gift_card" and "gift_card_refund" not in sub.needs:
                return None
            subs.append(sub)
        if not descriptions_unique(customer.db, customer.user, subs):
            return None
        return customer, subs

    def _build_alone(self, rng: random.Random) -> Instance:
        """The game's own instance (no surface): the kinds of the module docstring, exact ids."""
        config = self.config
        kinds = [draw_kind(rng, config.drawn_kinds) for _ in range(config.requests_per_episode)]
        n_items = (config.max_return_items or 1) + config.n_distractor_items
        db = generate_db(rng, n_users=2, n_products=max(n_items, 3), min_orders=1, max_orders=1, ids=config.ids)
        user = next(iter(db.users.values()))
        auth = "email" if rng.random() < config.email_share(config.email_auth_rate) else "name_zip"
        add_payment_methods(rng, db, user, config.min_payment_methods)
        if "return_to_gift_card" in kinds and not any(p.source == "gift_card" for p in user.payment_methods):
            add_payment_method(rng, db, user, "gift_card")
        requests, clauses = [], []
        for kind in kinds:
            request, clause, order = self._alone_request(rng, db, user, kind)
            request.ablated = {FIRST_METHOD: first_method_plan(request, user),
                               FIRST_ITEMS: first_items_plan(request, order),
                               ORIGINAL_METHOD: original_method_plan(request, request.info["paid_with"])}
            requests.append(request)
            clauses.append(clause)
        identity = identity_sentence(user, auth)
        opening, follow_ups = self.make_messages(rng, identity, clauses)
        return Instance(db=db, user=user, auth=auth, opening=opening, requests=requests, follow_ups=follow_ups,
                        info={"n_payment_methods": len(user.payment_methods)}, identity_reply=identity)

    def _alone_request(self, rng: random.Random, db: StoreDB, user: User,
                       kind: str) -> tuple[PlannedRequest, str, Order]:
        """One request of the game alone on a fresh order of `user`: its plan, the customer's clause, the order."""
        config = self.config
        n_named = rng.randint(1, config.max_return_items or 1) if kind != "exchange" else 1
        order = add_order(rng, db, user, "delivered", n_items=n_named + config.n_distractor_items)
        oid = order.order_id
        # Usually paid with a method other than the first one listed, so "the first method" is a wrong guess.
        payable = user.payment_methods
        if kind == "return_to_gift_card":  # the refund target must differ from the original method
            gift_card = rng.choice([p for p in payable if p.source == "gift_card"])
            payable = [p for p in payable if p.id != gift_card.id]
        method = rng.choice(payable[1:]) if len(payable) > 1 and rng.random() < 0.75 else payable[0]
        order.payment_history[0].payment_method_id = method.id
        look_up = PlannedCall("get_order_details", {"order_id": oid})
        info = {"order_id": oid, "paid_with": method.id, "n_items": len(order.items)}

        if kind == "exchange":
            item = rng.choice(order.items)
            product = db.products[item.product_id]
            new = rng.choice([v for v in product.variants if v.item_id != item.item_id])
            new.available = True  # the request must be possible
            difference = round(new.price - item.price, 2)
            if method.balance is not None and difference > method.balance:  # a gift card must cover it
                method.balance = round(difference + method.balance, 2)
            value = next(iter(new.options.values()))
            clause = f"exchange the {item.name} from order {oid} for the {value} one."
            calls = [look_up, PlannedCall("get_product_details", {"product_id": product.product_id}),
                     PlannedCall("exchange_delivered_order_items", {
                         "order_id": oid, "item_ids": [item.item_id], "new_item_ids": [new.item_id],
                         "payment_method_id": method.id})]
            if difference > 0:
                statement = f"The exchange is requested; you pay {money(difference)} more with {method.id}."
            else:
                statement = f"The exchange is requested; you get {money(difference)} back to {method.id}."
            info.update(amount=difference, new_item_id=new.item_id, n_variants=len(product.variants))
        else:
            named = rng.sample(order.items, n_named)
            amount = round(sum(i.price for i in named), 2)
            clause = f"return the {' and the '.join(i.name for i in named)} from order {oid}."
            calls = [look_up]
            target = method.id
            if kind == "return_to_gift_card":
                clause += " Please refund it to my gift card."
                calls.append(PlannedCall("get_user_details", {"user_id": user.user_id}))
                target = gift_card.id
            calls.append(PlannedCall("return_delivered_order_items", {
                "order_id": oid, "item_ids": [i.item_id for i in named], "payment_method_id": target}))
            statement = f"The return is requested. You will get {money(amount)} back to {target}."
            info.update(amount=amount, refund_to=target)
        return PlannedRequest(kind, calls, statement, info), clause, order

    def score(self) -> dict[str, float]:
        """Each request's parts (module docstring), averaged; nothing when anything not asked for changed or
        the policy's procedure broke."""
        if not self.nothing_else_changed() or self.policy_violations():
            return {"action": 0.0, "communication": 0.0}
        replies = self.told()
        done = [self.request_done(r) for r in self.instance.requests]
        return self.mean_parts([{"action": ACTION_WEIGHT if d else 0.0,
                                 "communication": COMMUNICATION_WEIGHT if d and self.request_reported(r, replies)
                                 else 0.0} for r, d in zip(self.instance.requests, done)])



register_game(storefront_game_spec(
    StructuredDataReasoningGame, StructuredDataReasoningConfig, CAPABILITY, hint=HINT,
    max_turns=MAX_TURNS,
    difficulty_knobs=(DifficultyKnob("n_distractor_items", "increase", (0, 1, 2, 3, 4)),
                      DifficultyKnob("min_payment_methods", "increase", (2, 3, 4, 5))),
))
