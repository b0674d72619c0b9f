"""Storefront tasks: one seeded customer per seed with one to three requests whose needs overlap.

A task holds the initial database, the customer (who they are, what they know and say), one
`SubRequest` per request with the expert's plan (look-ups, confirmation, write, closing statement) and
what the agent must tell (a refused order's status; after a change: the amount of a return or exchange,
the order id of a cancel or address change, "default address" for the default address), and a hidden record of the capabilities it exercises. Success is judged
on state, as in τ²-bench: the gold writes replayed on a fresh copy of the initial DB must give the
agent's final DB, every value to tell must be told (benchmarks/storefront/communication.py), and no
write may break the policy's procedure (benchmarks/storefront/compliance.py).

Per request, drawn independently with the rates of `StorefrontConfig`:
  kind          cancel | modify_order_address | return | exchange | modify_user_address
  forbidden     the order's status forbids the request: change nothing, tell the status
  unknown id    the customer does not know the order id: search their orders for the named item
  loose id      the id is written without '#' (or '#W')
  paraphrase    a cancel reason in other words than the enum
  zero zip      a new address with a leading-zero zip
  two items     a return of two items at once
  refund target a return refunded to the order's payment method (often not the customer's first) or
                to their gift card; an exchange paid with the original method
plus, per customer: one to three requests, email or name+zip (with a leading-zero zip sometimes).

Hidden capability record (`Task.capabilities`, for the demo's ground truth only: no agent or labeler
sees it; it is never written into results files):
  precondition_verification   a request whose order status forbids it
  multi_step_task_completion  two or more requests
  structured_data_reasoning   an allowed return or exchange (refund target, variant id, amount to add up)
  tool_calling_precision      a loose id, a paraphrased reason, a leading-zero zip, a two-item return
  order_search                a request whose order id the customer does not know   (no capability game)
  explicit_confirmation       any allowed change while the policy asks for a yes    (no capability game)
"""
from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass, field
from typing import Any

from benchmarks.storefront.config import StorefrontConfig
from benchmarks.storefront.db import (CITIES, Address, Order, OrderItem, StoreDB, User, add_order,
                                      add_payment_method, generate_db, random_address, set_order_status)
from benchmarks.storefront.tools import StorefrontTools
from benchmarks.storefront.user_sim import REQUEST_KINDS, Identity, UserRequest

PRECONDITION = "precondition_verification"
MULTI_STEP = "multi_step_task_completion"
STRUCTURED = "structured_data_reasoning"
PRECISION = "tool_calling_precision"
ORDER_SEARCH = "order_search"
CONFIRMATION = "explicit_confirmation"
CAPABILITIES = (PRECONDITION, MULTI_STEP, STRUCTURED, PRECISION, ORDER_SEARCH, CONFIRMATION)
HELD_OUT_CAPABILITIES = (ORDER_SEARCH, CONFIRMATION)  # needs that no capability game trains

ALLOWED_STATUS = {"cancel": "pending", "modify_order_address": "pending", "return": "delivered",
                  "exchange": "delivered"}
FORBIDDEN_STATUSES = {"cancel": ("processed", "delivered", "cancelled", "return requested"),
                      "modify_order_address": ("processed", "delivered", "cancelled"),
                      "return": ("pending", "processed", "cancelled", "return requested"),
                      "exchange": ("pending", "processed", "cancelled", "return requested")}
CANNOT = {"cancel": "it cannot be cancelled", "modify_order_address": "its address cannot be changed",
          "return": "it cannot be returned", "exchange": "it cannot be exchanged"}
PLAIN_REASONS = {"no longer needed": "I no longer need it.", "ordered by mistake": "I ordered it by mistake."}
PARAPHRASED_REASONS = {
    "no longer needed": ("I don't need it anymore.", "Turns out I have no use for it.", "I changed my mind, I don't need it."),
    "ordered by mistake": ("I bought it by accident.", "I clicked buy by mistake.", "That order was an accident."),
}
ZERO_ZIP_CITIES = tuple(c for c in CITIES if c[2].startswith("0"))  # where an int zip would lose a digit
GREETINGS = ("Hi.", "Hello!", "Hey,", "Hi there.", "")
CONFIRM_SUFFIX = " Shall I proceed?"


def format_amount(value: float) -> str:
    """Money as the policy writes it: two decimals, no sign, no currency symbol (e.g. '123.45')."""
    return f"{abs(value):.2f}"


def address_text(address: Address) -> str:
    """How users write an address: comma-separated in the order of the tool's arguments."""
    return address.text()


def address_arguments(address: Address) -> dict[str, str]:
    return address.to_dict()


def call_key(name: str, arguments: dict[str, Any]) -> tuple[str, str]:
    """(name, canonical JSON of the arguments): equal for the same call however its keys were ordered."""
    return name, json.dumps(arguments, sort_keys=True, ensure_ascii=False)


@dataclass
class Step:
    """One step of the expert's plan for a request: a tool call, or (name "confirm") a confirmation question."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    text: str = ""  # the question, for a confirm step

    @property
    def is_confirm(self) -> bool:
        return self.name == "confirm"

    @functools.cached_property
    def key(self) -> tuple[str, str]:
        """(name, canonical JSON arguments): how the game recognises the call among those made."""
        return call_key(self.name, self.arguments)

    def as_action(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}


@dataclass
class SubRequest:
    """One thing the customer wants: what they say and know (`user`), the expert's plan and what to tell."""

    kind: str  # one of REQUEST_KINDS
    clause: str  # how the customer asks for it in the opening message
    user: UserRequest
    steps: list[Step]  # the expert's plan: look-ups, then (if allowed) confirm + write
    statement: str  # the expert's closing message
    allowed: bool = True  # False: the policy forbids it (change nothing, tell the status)
    status: str = ""  # the order's status at the start
    requested: list[Step] = field(default_factory=list)  # the steps after the look-up were it allowed
    requested_statement: str = ""  # the closing statement were it allowed
    tell_status: str = ""  # forbidden: the status to tell (after a look-up)
    tell_amount: float | None = None  # return: refund; exchange: price difference (sign ignored)
    tell_order_id: bool = False  # an allowed cancel / address change: report it naming the order
    tell_phrase: str = ""  # the default address: report it with these words
    needs: list[str] = field(default_factory=list)  # which of the drawn needs apply (for reports)
    capabilities: list[str] = field(default_factory=list)  # hidden ground truth

    @property
    def order_id(self) -> str:
        return self.user.order_id

    @property
    def write(self) -> Step | None:
        writes = [s for s in self.steps if not s.is_confirm and StorefrontTools.is_write(s.name)]
        return writes[0] if writes else None

    @property
    def gold(self) -> list[dict[str, Any]]:
        """The expert's tool calls for this request (look-ups then write), as {"name", "arguments"}."""
        return [s.as_action() for s in self.steps if not s.is_confirm]


@dataclass
class Task:
    task_id: str
    seed: int
    db: StoreDB  # initial state (never modified: the game works on a clone)
    user_id: str
    identity: Identity
    sub_requests: list[SubRequest]  # in canonical order (an episode may present them in another)
    capabilities: list[str]  # hidden ground truth (see the module docstring)

    @property
    def auth(self) -> str:
        return self.identity.auth

    @property
    def user(self) -> User:
        return self.db.users[self.user_id]

    @property
    def request_kinds(self) -> list[str]:
        return [s.kind for s in self.sub_requests]

    @property
    def auth_action(self) -> dict[str, Any]:
        user = self.user
        if self.auth == "email":
            return {"name": "find_user_id_by_email", "arguments": {"email": user.email}}
        return {"name": "find_user_id_by_name_zip",
                "arguments": {"first_name": user.first_name, "last_name": user.last_name, "zip": user.address.zip}}

    @property
    def gold_actions(self) -> list[dict[str, Any]]:
        """All expert tool calls, in canonical order: authentication, then each request's look-ups and write."""
        return [self.auth_action, *(action for sub in self.sub_requests for action in sub.gold)]

    @property
    def communicate_info(self) -> list[str]:
        out = []
        for sub in self.sub_requests:
            if sub.tell_status:
                out.append(sub.tell_status)
            if sub.tell_amount is not None:
                out.append(format_amount(sub.tell_amount))
            if sub.tell_order_id:
                out.append(sub.order_id)
            if sub.tell_phrase:
                out.append(sub.tell_phrase)
        return out

    def opening(self, rng: random.Random, order: list[int] | None = None) -> str:
        """The customer's first message: a greeting and every request (in `order`, default canonical)."""
        subs = [self.sub_requests[i] for i in (order or range(len(self.sub_requests)))]
        parts = [rng.choice(GREETINGS), f"I want to {subs[0].clause}", *(f"Also, please {s.clause}" for s in subs[1:])]
        return " ".join(p for p in parts if p)

    def to_json(self) -> dict[str, Any]:
        """The task as a τ²-bench-style task entry (the DB is regenerated from the seed, not stored; the
        hidden capability record is left out on purpose)."""
        identity = self.identity
        known = (f"Your email is {identity.email}." if self.auth == "email" else
                 f"You are {identity.first_name} {identity.last_name}, zip code {identity.zip}.")
        return {
            "id": self.task_id,
            "seed": self.seed,
            "request_kinds": self.request_kinds,
            "description": {"purpose": f"storefront task with {len(self.sub_requests)} request(s)"},
            "user_scenario": {"instructions": {
                "domain": "storefront",
                "reason_for_call": self.opening(random.Random(0)),
                "known_info": known,
                "unknown_info": "You do not remember your email." if self.auth != "email" else "",
                "task_instructions": "; ".join(f"{s.clause}" for s in self.sub_requests),
            }},
            "evaluation_criteria": {
                "actions": [{"action_id": f"{self.task_id}_{i}", "requestor": "assistant", **a}
                            for i, a in enumerate(self.gold_actions)],
                "communicate_info": self.communicate_info,
                "reward_basis": ["DB", "COMMUNICATE", "POLICY"],
            },
        }


# --------------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------------
def _look_up(order: Order) -> Step:
    return Step("get_order_details", {"order_id": order.order_id})


def _new_address(rng: random.Random, old: Address | None, leading_zero_zip: bool) -> Address:
    while True:
        address = random_address(rng, with_unit=True)
        if leading_zero_zip:
            city, state, prefix = rng.choice(ZERO_ZIP_CITIES)
            address = Address(address.address1, address.address2, city, state, "USA",
                              f"{prefix}{rng.randint(0, 99):02d}")
        elif address.zip.startswith("0"):
            continue  # a leading-zero zip is a need of its own; draw it only when asked for
        if old is None or address.to_dict() != old.to_dict():
            return address


def _confirm(text: str) -> Step:
    return Step("confirm", text=text + CONFIRM_SUFFIX)


class RequestBuilder:
    """Builds one task's requests from the config's rates (all randomness from `rng`).

    Public because the storefront capability games (games/_storefront/) draw their requests
    with it from the target's config, so their openings, id forms, reasons and plans are the target's.
    """

    def __init__(self, rng: random.Random, config: StorefrontConfig, db: StoreDB, user: User) -> None:
        self.rng, self.config, self.db, self.user = rng, config, db, user
        self.used_orders: set[str] = set()

    def chance(self, rate: float) -> bool:
        return self.rng.random() < rate

    def order_for(self, status: str, n_items: int | None = None) -> Order:
        """A fresh order of the customer with `status` (one per request, so requests never share an order)."""
        order = add_order(self.rng, self.db, self.user, status, n_items=n_items)
        self.used_orders.add(order.order_id)
        return order

    def reference(self, order: Order, needs: list[str]) -> tuple[str, str, list[Step]]:
        """(how the customer writes the id, how they describe the order, search steps) for `order`."""
        if self.chance(self.config.unknown_order_id_rate):
            hint = self._unique_item_hint(order)
            if hint:
                needs.append("unknown_id")
                position = self.user.orders.index(order.order_id)
                search = [Step("get_user_details", {"user_id": self.user.user_id})]
                search += [Step("get_order_details", {"order_id": oid}) for oid in self.user.orders[:position]]
                return "", hint, search
        if self.chance(self.config.loose_order_id_rate):
            needs.append("loose_id")
            return order.order_id.removeprefix("#" if self.rng.random() < 0.5 else "#W"), "", []
        return order.order_id, "", []

    def _unique_item_hint(self, order: Order) -> str:
        """'the one with the lamp' for a product that no other order of the customer holds, else ''."""
        others = {i.name for oid in self.user.orders if oid != order.order_id for i in self.db.orders[oid].items}
        names = [i.name for i in order.items if i.name not in others]
        return f"the one with the {self.rng.choice(names)}" if names else ""

    def refund_target(self, order: Order, needs: list[str]) -> tuple[str, str]:
        """(payment method id, what the customer says when asked) for a return of `order`."""
        user = self.user
        if self.chance(self.config.gift_card_refund_rate):
            paid = order.payment_history[0].payment_method_id
            cards = [p for p in user.payment_methods if p.source == "gift_card" and p.id != paid]
            if not cards and not any(p.source == "gift_card" for p in user.payment_methods):
                cards = [add_payment_method(self.rng, self.db, user, "gift_card")]
            if cards:
                needs.append("gift_card_refund")
                return cards[0].id, "To my gift card, please."
        return order.payment_history[0].payment_method_id, "To the original payment method."

    def pay_with(self, order: Order) -> None:
        """Pay `order` with another method than the customer's first, at `other_payment_method_rate`."""
        user = self.user
        if len(user.payment_methods) < 2 and self.chance(self.config.other_payment_method_rate):
            taken = {p.source for p in user.payment_methods}
            add_payment_method(self.rng, self.db, user, self.rng.choice([s for s in ("credit_card", "paypal",
                                                                                      "gift_card") if s not in taken]))
        others = user.payment_methods[1:]
        method = (self.rng.choice(others) if others and self.chance(self.config.other_payment_method_rate)
                  else user.payment_methods[0])
        for payment in order.payment_history:
            payment.payment_method_id = method.id

    # ---- one builder per kind -------------------------------------------------------------------
    def build(self, kind: str, attempt: int = 0) -> SubRequest:
        if kind == "modify_user_address":
            return self._modify_user_address()
        allowed = not self.chance(self.config.forbidden_rate)
        status = ALLOWED_STATUS[kind] if allowed else self.rng.choice(FORBIDDEN_STATUSES[kind])
        needs = [] if allowed else ["forbidden"]
        two_items = kind == "return" and self.chance(self.config.two_items_rate)
        order = self.order_for("pending", n_items=2 if two_items else None)
        if kind in ("return", "exchange"):
            self.pay_with(order)
        set_order_status(order, status, self.rng)
        ref, hint, search = self.reference(order, needs)
        user_request = UserRequest(kind=kind, order_id=order.order_id, order_ref=ref, order_hint=hint)
        words = f"order {ref}" if ref else hint.replace("the one", "my order", 1)
        look_up = [*search, _look_up(order)]
        sub = getattr(self, f"_{kind}")(order, words, user_request, needs, two_items)
        if sub is None:  # no variant of the order's items gives a clean exchange: draw another order
            if attempt < 20:
                return self.build(kind, attempt + 1)
            raise RuntimeError("could not draw an exchangeable order in 20 tries; the catalog has too few variants")
        sub.steps = look_up + sub.requested
        sub.requested_statement = sub.statement
        sub.status = status
        sub.tell_order_id = kind in ("cancel", "modify_order_address")
        if not allowed:
            sub.allowed = False
            sub.steps = look_up
            sub.tell_status = status
            sub.tell_amount = None
            sub.tell_order_id = False
            sub.statement = f"Order {order.order_id} is {status}, so {CANNOT[kind]}."
        sub.needs = needs
        return sub

    def _cancel(self, order: Order, words: str, user_request: UserRequest, needs: list[str], _: bool) -> SubRequest:
        reason = self.rng.choice(tuple(PLAIN_REASONS))
        if self.chance(self.config.paraphrase_rate):
            needs.append("paraphrase")
            reason_text = self.rng.choice(PARAPHRASED_REASONS[reason])
        else:
            reason_text = PLAIN_REASONS[reason]
        user_request.reason_text = reason_text
        oid = order.order_id
        requested = [_confirm(f"I will cancel order {oid} (reason: {reason})."),
                     Step("cancel_pending_order", {"order_id": oid, "reason": reason})]
        return SubRequest(kind="cancel", clause=f"cancel {words}. {reason_text}", user=user_request, steps=[],
                          statement=f"Order {oid} is cancelled.", requested=requested)

    def _modify_order_address(self, order: Order, words: str, user_request: UserRequest, needs: list[str],
                              _: bool) -> SubRequest:
        zero = self.chance(self.config.leading_zero_zip_rate)
        if zero:
            needs.append("zero_zip")
        address = _new_address(self.rng, order.address, zero)
        user_request.address = address
        oid = order.order_id
        requested = [_confirm(f"I will change the shipping address of order {oid} to {address.text()}."),
                     Step("modify_pending_order_address", {"order_id": oid, **address_arguments(address)})]
        return SubRequest(kind="modify_order_address", clause=f"change the shipping address of {words} to "
                          f"{address.text()}.", user=user_request, steps=[],
                          statement=f"The address of order {oid} is updated.", requested=requested)

    def returned_items(self, order: Order, two_items: bool) -> list[OrderItem]:
        """The items a return names: both items of a two-item order, else one at random. A game whose
        orders hold more items than the customer names overrides this."""
        return list(order.items) if two_items else [self.rng.choice(order.items)]

    def _return(self, order: Order, words: str, user_request: UserRequest, needs: list[str],
                two_items: bool) -> SubRequest:
        items = self.returned_items(order, two_items)
        if two_items:
            needs.append("two_items")
        target, refund_answer = self.refund_target(order, needs)
        user_request.item_names = [i.name for i in items]
        user_request.refund_answer = refund_answer
        oid = order.order_id
        amount = round(sum(i.price for i in items), 2)
        names = " and the ".join(i.name for i in items)
        requested = []
        if "gift_card_refund" in needs:
            requested.append(Step("get_user_details", {"user_id": self.user.user_id}))
        requested += [_confirm(f"I will return the {names} from order {oid} with the refund to {target}."),
                      Step("return_delivered_order_items", {"order_id": oid, "item_ids": [i.item_id for i in items],
                                                            "payment_method_id": target})]
        clause = f"return the {names} from {words}."
        if "gift_card_refund" in needs:
            clause += " Please refund it to my gift card."
        return SubRequest(kind="return", clause=clause, user=user_request, steps=[], requested=requested,
                          statement=f"The return is requested. You will get {format_amount(amount)} back to {target}.",
                          tell_amount=amount)

    def _exchange(self, order: Order, words: str, user_request: UserRequest, needs: list[str],
                  _: bool) -> SubRequest | None:
        item = self.rng.choice(order.items)
        product = self.db.products[item.product_id]
        method_id = order.payment_history[0].payment_method_id
        balance = self.user.payment_method(method_id).balance  # None unless a gift card
        candidates = [v for v in product.variants if v.item_id != item.item_id
                      and round(abs(v.price - item.price) * 100) % 10  # a clean two-decimal difference
                      and (balance is None or v.price - item.price <= balance)]  # a gift card must cover it
        if not candidates:
            return None
        new = self.rng.choice(candidates)
        new.available = True  # the request must be possible
        (_, value), = new.options.items()
        difference = round(new.price - item.price, 2)
        user_request.item_names = [item.name]
        user_request.refund_answer = "The original payment method."
        oid = order.order_id
        requested = [Step("get_product_details", {"product_id": product.product_id}),
                     _confirm(f"I will exchange the {item.name} from order {oid} for item {new.item_id}, "
                              f"with the price difference on {method_id}."),
                     Step("exchange_delivered_order_items", {"order_id": oid, "item_ids": [item.item_id],
                                                             "new_item_ids": [new.item_id],
                                                             "payment_method_id": method_id})]
        direction = (f"you pay {format_amount(difference)} more with {method_id}" if difference > 0
                     else f"you get {format_amount(difference)} back to {method_id}")
        return SubRequest(kind="exchange", clause=f"exchange the {item.name} from {words} for the {value} one.",
                          user=user_request, steps=[], requested=requested,
                          statement=f"The exchange is requested; {direction}.", tell_amount=difference)

    def _modify_user_address(self) -> SubRequest:
        needs = []
        zero = self.chance(self.config.leading_zero_zip_rate)
        if zero:
            needs.append("zero_zip")
        address = _new_address(self.rng, self.user.address, zero)
        steps = [_confirm(f"I will update your default address to {address.text()}."),
                 Step("modify_user_address", {"user_id": self.user.user_id, **address_arguments(address)})]
        return SubRequest(kind="modify_user_address", clause=f"update my default address to {address.text()}.",
                          user=UserRequest(kind="modify_user_address", address=address), steps=steps,
                          requested=steps[:], statement="Your default address is updated.", needs=needs,
                          tell_phrase="default address")


def _capabilities(sub: SubRequest, require_confirmation: bool) -> list[str]:
    caps = []
    if not sub.allowed:
        caps.append(PRECONDITION)
    if sub.allowed and sub.kind in ("return", "exchange"):
        caps.append(STRUCTURED)
    if "loose_id" in sub.needs or (sub.allowed and any(n in sub.needs for n in ("paraphrase", "zero_zip",
                                                                              "two_items"))):
        caps.append(PRECISION)
    if "unknown_id" in sub.needs:
        caps.append(ORDER_SEARCH)
    if sub.allowed and require_confirmation:
        caps.append(CONFIRMATION)
    return caps


def make_task(seed: int, config: StorefrontConfig | None = None) -> Task:
    """The task of `seed` under `config` (default config when None). Deterministic in its arguments."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed must be an int, got {seed!r}")
    config = config or StorefrontConfig()
    rng = random.Random(f"storefront:{seed}")
    for _ in range(20):  # redraw (same stream) in the rare case an order description became ambiguous
        task = _draw_task(rng, seed, config)
        if descriptions_unique(task.db, task.user, task.sub_requests):
            return task
    raise RuntimeError(f"storefront seed {seed}: could not draw a task whose order descriptions are unambiguous")


def descriptions_unique(db: StoreDB, user: User, subs: list[SubRequest]) -> bool:
    """Whether each order the customer describes by an item holds the only such item among their orders
    (a later request's order can hold the item an earlier description named)."""
    for sub in subs:
        if sub.user.order_hint:
            name = sub.user.order_hint.removeprefix("the one with the ")
            holders = [oid for oid in user.orders if any(i.name == name for i in db.orders[oid].items)]
            if holders != [sub.order_id]:
                return False
    return True


@dataclass
class Customer:
    """A task's store and the customer drawn in it, with how they identify themselves."""

    db: StoreDB
    user: User
    auth: str  # "email" or "name_zip"
    zero_zip_auth: bool  # they identify by name and a zip with a leading zero


def draw_customer(rng: random.Random, config: StorefrontConfig) -> Customer:
    """The store and customer of a task under `config` (its size, ids, email / name+zip and zip rates).
    Shared with the storefront capability games, which draw their customers the target's way."""
    db = generate_db(rng, n_users=config.n_users, n_products=config.n_products, max_orders=2, ids=config.ids)
    user = rng.choice(list(db.users.values()))
    auth = "email" if rng.random() < config.email_auth_rate else "name_zip"
    zero_zip_auth = auth == "name_zip" and rng.random() < config.leading_zero_zip_rate
    if zero_zip_auth and not user.address.zip.startswith("0"):
        user.address = _new_address(rng, user.address, leading_zero_zip=True)
    elif auth == "name_zip" and not zero_zip_auth and user.address.zip.startswith("0"):
        user.address = _new_address(rng, user.address, leading_zero_zip=False)
    return Customer(db, user, auth, zero_zip_auth)


def _draw_task(rng: random.Random, seed: int, config: StorefrontConfig) -> Task:
    customer = draw_customer(rng, config)
    db, user, auth, zero_zip_auth = customer.db, customer.user, customer.auth, customer.zero_zip_auth
    n_requests = rng.choices(range(1, len(config.request_counts) + 1), weights=config.request_counts)[0]
    kinds_pool = [k for k in REQUEST_KINDS if config.kind_weights.get(k, 0) > 0]
    kinds: list[str] = []
    for _ in range(n_requests):
        pool = [k for k in kinds_pool if k != "modify_user_address" or k not in kinds]  # the default address once
        if not pool:
            break
        kinds.append(rng.choices(pool, weights=[config.kind_weights[k] for k in pool])[0])
    builder = RequestBuilder(rng, config, db, user)
    subs = [builder.build(kind) for kind in kinds]
    capabilities = sorted({c for sub in subs for c in _capabilities(sub, config.require_confirmation)}
                          | ({MULTI_STEP} if len(subs) >= 2 else set())
                          | ({PRECISION} if zero_zip_auth else set()))
    for sub in subs:
        sub.capabilities = _capabilities(sub, config.require_confirmation)
    if not config.require_confirmation:
        for sub in subs:
            sub.steps = [s for s in sub.steps if not s.is_confirm]
            sub.requested = [s for s in sub.requested if not s.is_confirm]
    identity = Identity(first_name=user.first_name, last_name=user.last_name, email=user.email,
                        zip=user.address.zip, auth=auth)
    return Task(task_id=f"storefront_{seed}", seed=seed, db=db, user_id=user.user_id, identity=identity,
                sub_requests=subs, capabilities=capabilities)
