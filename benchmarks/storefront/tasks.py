"""Storefront tasks: one seeded scenario per seed, in four families that each exercise one capability.

A task holds the initial database, the user's scenario (what they ask in the opening message, what
they know, what they say when asked), the gold actions (tool name + arguments, look-ups included) and
`communicate_info` (values the agent must tell the user). Success is judged on state, as in τ²-bench:
the gold write actions replayed on a fresh copy of the initial DB must give the same `db_hash` as the
agent's final DB, and every communicate value must appear in some assistant reply (a refused request's
status only counts once its order was looked up; see StorefrontGame.get_summary).

Families:
  precondition  cancel / change-address request on an order that is pending (then do it) or not (then
                change nothing and tell the user the status);
  compound      two or three requests in the opening message (cancel, change an order's address, change
                the default address); all must be done;
  nested_field  return or exchange of a delivered order: the refund method is the one in the order's
                payment_history (or the user's gift card, found in the user's details, when asked); tell
                the refund amount (return) or the price difference (exchange);
  arg_format    exact arguments: the user writes the order id without '#', paraphrases the cancel reason,
                has a zip with a leading zero, returns two items at once.

`make_task(seed)` picks the family from the seed; `make_task(seed, family)` gives the same task as the
seed-chosen one when the families agree, since each family draws from its own `Random(f"...{family}")`.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from benchmarks.storefront.db import (CITIES, Address, Order, StoreDB, User, add_order, add_payment_method,
                                      generate_db, random_address, set_order_status)

FAMILIES = ("precondition", "compound", "nested_field", "arg_format")
REQUEST_KINDS = ("cancel", "modify_order_address", "return", "exchange", "modify_user_address")

# How users phrase a cancel reason -> the tool's enum value. Plain phrasings are used outside arg_format.
PLAIN_REASONS = {"no longer needed": "I no longer need it.", "ordered by mistake": "I ordered it by mistake."}
PARAPHRASED_REASONS = {
    "no longer needed": ("I don't need it anymore.", "Turns out I have no use for it.", "I changed my mind, I don't need it."),
    "ordered by mistake": ("I bought it by accident.", "I clicked buy by mistake.", "That order was an accident."),
}
ZERO_ZIP_CITIES = tuple(c for c in CITIES if c[2].startswith("0"))  # where an int zip would lose a digit
GREETINGS = ("Hi.", "Hello!", "Hey,", "Hi there.", "")


def format_amount(value: float) -> str:
    """Money as the policy writes it: two decimals, no sign, no currency symbol (e.g. '123.45')."""
    return f"{abs(value):.2f}"


def address_text(address: Address) -> str:
    """How users write an address: comma-separated in the order of the tool's arguments."""
    return address.text()


def address_arguments(address: Address) -> dict[str, str]:
    return address.to_dict()


@dataclass
class SubRequest:
    """One thing the user wants. `gold` lists the expert's tool calls for it, look-ups first."""

    kind: str  # one of REQUEST_KINDS
    clause: str  # how the user asks for it in the opening message
    gold: list[dict[str, Any]]  # [{"name", "arguments"}]
    allowed: bool = True  # False: the policy forbids it (the right move is to change nothing)
    order_id: str = ""  # canonical, with '#'
    order_ref: str = ""  # as the user writes it (maybe without '#')
    status: str = ""  # the order's status at the start
    reason: str = ""  # the cancel reason's enum value
    reason_text: str = ""  # how the user phrases it
    address: Address | None = None
    item_names: list[str] = field(default_factory=list)
    refund_answer: str = ""  # what the user says when asked where the money goes
    communicate: list[str] = field(default_factory=list)
    statement: str = ""  # the expert's closing message for this request


@dataclass
class Task:
    task_id: str
    seed: int
    family: str
    db: StoreDB  # initial state (never modified: the game works on a clone)
    user_id: str
    auth: str  # "email" or "name_zip": what the user can give to be authenticated
    sub_requests: list[SubRequest]
    opening: str

    @property
    def user(self) -> User:
        return self.db.users[self.user_id]

    @property
    def auth_action(self) -> dict[str, Any]:
        user = self.user
        if self.auth == "email":
            return {"name": "find_user_id_by_email", "arguments": {"email": user.email}}
        return {"name": "find_user_id_by_name_zip",
                "arguments": {"first_name": user.first_name, "last_name": user.last_name, "zip": user.address.zip}}

    @property
    def gold_actions(self) -> list[dict[str, Any]]:
        """All expert tool calls, in order: authentication, then each request's look-ups and write."""
        return [self.auth_action, *(action for sub in self.sub_requests for action in sub.gold)]

    @property
    def communicate_info(self) -> list[str]:
        return [value for sub in self.sub_requests for value in sub.communicate]

    def to_json(self) -> dict[str, Any]:
        """The task as a τ²-bench-style task entry (the DB is regenerated from the seed, not stored)."""
        user = self.user
        known = (f"Your email is {user.email}." if self.auth == "email" else
                 f"You are {user.first_name} {user.last_name}, zip code {user.address.zip}.")
        return {
            "id": self.task_id,
            "seed": self.seed,
            "family": self.family,
            "description": {"purpose": f"storefront {self.family} task"},
            "user_scenario": {"instructions": {
                "domain": "storefront",
                "reason_for_call": self.opening,
                "known_info": known,
                "unknown_info": "You do not remember your email." if self.auth != "email" else "",
                "task_instructions": "; ".join(f"{s.kind} {s.order_id}".strip() for s in self.sub_requests),
            }},
            "evaluation_criteria": {
                "actions": [{"action_id": f"{self.task_id}_{i}", "requestor": "assistant", **a}
                            for i, a in enumerate(self.gold_actions)],
                "communicate_info": self.communicate_info,
                "reward_basis": ["DB", "COMMUNICATE"],
            },
        }


# --------------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------------
def family_for_seed(seed: int, families: tuple[str, ...] = FAMILIES) -> str:
    """The family a seed maps to when none is given (uniform over `families`)."""
    if not families:
        raise ValueError("families is empty; give at least one of " + ", ".join(FAMILIES))
    return families[random.Random(f"storefront-family:{seed}").randrange(len(families))]


def _user_orders(db: StoreDB, user: User, rng: random.Random, n: int, n_items: int | None = None) -> list[Order]:
    """`n` distinct orders of `user` (new ones added when needed), in random order."""
    orders = [db.orders[o] for o in user.orders
              if n_items is None or len(db.orders[o].items) == n_items]
    rng.shuffle(orders)
    while len(orders) < n:
        orders.append(add_order(rng, db, user, status="pending", n_items=n_items))
    return orders[:n]


def _look_up(order: Order) -> dict[str, Any]:
    return {"name": "get_order_details", "arguments": {"order_id": order.order_id}}


def _order_ref(order: Order, with_hash: bool) -> str:
    return order.order_id if with_hash else order.order_id.removeprefix("#")


def _new_address(rng: random.Random, leading_zero_zip: bool = False) -> Address:
    if leading_zero_zip:
        city, state, prefix = rng.choice(ZERO_ZIP_CITIES)
        base = random_address(rng, with_unit=True)
        return Address(base.address1, base.address2, city, state, "USA", f"{prefix}{rng.randint(0, 99):02d}")
    return random_address(rng, with_unit=True)


def _cancel(rng: random.Random, order: Order, allowed_status: str, hash_in_ref: bool, paraphrase: bool
            ) -> SubRequest:
    reason = rng.choice(("no longer needed", "ordered by mistake"))
    reason_text = rng.choice(PARAPHRASED_REASONS[reason]) if paraphrase else PLAIN_REASONS[reason]
    set_order_status(order, allowed_status, rng)
    ref = _order_ref(order, hash_in_ref)
    allowed = allowed_status == "pending"
    gold = [_look_up(order)]
    if allowed:
        gold.append({"name": "cancel_pending_order", "arguments": {"order_id": order.order_id, "reason": reason}})
        statement = f"Order {order.order_id} is cancelled."
    else:
        statement = f"Order {order.order_id} is {allowed_status}, so it cannot be cancelled."
    return SubRequest(kind="cancel", clause=f"cancel order {ref}. {reason_text}", gold=gold, allowed=allowed,
                      order_id=order.order_id, order_ref=ref, status=allowed_status, reason=reason,
                      reason_text=reason_text,
                      communicate=[] if allowed else [allowed_status], statement=statement)


def _modify_order_address(rng: random.Random, order: Order, status: str, hash_in_ref: bool,
                          leading_zero_zip: bool = False) -> SubRequest:
    set_order_status(order, status, rng)
    address = _new_address(rng, leading_zero_zip)
    ref = _order_ref(order, hash_in_ref)
    allowed = status == "pending"
    gold = [_look_up(order)]
    if allowed:
        gold.append({"name": "modify_pending_order_address",
                     "arguments": {"order_id": order.order_id, **address_arguments(address)}})
        statement = f"The address of order {order.order_id} is updated."
    else:
        statement = f"Order {order.order_id} is {status}, so its address cannot be changed."
    return SubRequest(kind="modify_order_address",
                      clause=f"change the shipping address of order {ref} to {address_text(address)}.", gold=gold,
                      allowed=allowed, order_id=order.order_id, order_ref=ref, status=status, address=address,
                      communicate=[] if allowed else [status], statement=statement)


def _modify_user_address(rng: random.Random, user: User, leading_zero_zip: bool = False) -> SubRequest:
    address = _new_address(rng, leading_zero_zip)
    gold = [{"name": "modify_user_address", "arguments": {"user_id": user.user_id, **address_arguments(address)}}]
    return SubRequest(kind="modify_user_address", clause=f"update my default address to {address_text(address)}.",
                      gold=gold, address=address, statement="Your default address is updated.")


def _return(rng: random.Random, db: StoreDB, user: User, order: Order, item_indices: list[int],
            hash_in_ref: bool, to_gift_card: bool) -> SubRequest:
    """Return the given items of `order` (made delivered); refund to its original method or the gift card."""
    set_order_status(order, "delivered", rng)
    items = [order.items[i] for i in item_indices]
    ref = _order_ref(order, hash_in_ref)
    gold = [_look_up(order)]
    if to_gift_card:
        target = next(p.id for p in user.payment_methods if p.source == "gift_card")
        gold.append({"name": "get_user_details", "arguments": {"user_id": user.user_id}})
        refund_answer = "To my gift card, please."
    else:
        target = order.payment_history[0].payment_method_id
        refund_answer = "To the original payment method."
    gold.append({"name": "return_delivered_order_items",
                 "arguments": {"order_id": order.order_id, "item_ids": [i.item_id for i in items],
                               "payment_method_id": target}})
    amount = format_amount(sum(i.price for i in items))
    names = [i.name for i in items]
    clause = f"return the {' and the '.join(names)} from order {ref}."
    if to_gift_card:
        clause += " Please refund it to my gift card."
    return SubRequest(kind="return", clause=clause, gold=gold, order_id=order.order_id, order_ref=ref,
                      status="delivered", item_names=names, refund_answer=refund_answer, communicate=[amount],
                      statement=f"The return is requested. You will get {amount} back to {target}.")


def _exchange(rng: random.Random, db: StoreDB, order: Order, hash_in_ref: bool) -> SubRequest | None:
    """Exchange one item of `order` for another variant; None if no variant gives a clean price difference."""
    set_order_status(order, "delivered", rng)
    item = rng.choice(order.items)
    product = db.products[item.product_id]
    method = order.payment_history[0].payment_method_id
    balance = db.users[order.user_id].payment_method(method).balance  # None unless a gift card
    candidates = [v for v in product.variants if v.item_id != item.item_id
                  and round(abs(v.price - item.price) * 100) % 10  # a clean two-decimal difference
                  and (balance is None or v.price - item.price <= balance)]  # a gift card must cover it
    if not candidates:
        return None
    new = rng.choice(candidates)
    new.available = True  # the request must be possible
    (option, value), = new.options.items()
    difference = round(new.price - item.price, 2)
    ref = _order_ref(order, hash_in_ref)
    gold = [_look_up(order), {"name": "get_product_details", "arguments": {"product_id": product.product_id}},
            {"name": "exchange_delivered_order_items",
             "arguments": {"order_id": order.order_id, "item_ids": [item.item_id], "new_item_ids": [new.item_id],
                           "payment_method_id": method}}]
    amount = format_amount(difference)
    direction = f"you pay {amount} more with {method}" if difference > 0 else f"you get {amount} back to {method}"
    return SubRequest(kind="exchange", clause=f"exchange the {item.name} from order {ref} for the {value} one.",
                      gold=gold, order_id=order.order_id, order_ref=ref, status="delivered", item_names=[item.name],
                      refund_answer="The original payment method.", communicate=[amount],
                      statement=f"The exchange is requested; {direction}.")


# --------------------------------------------------------------------------------------------------
# Families
# --------------------------------------------------------------------------------------------------
NOT_PENDING = {"cancel": ("processed", "delivered", "cancelled", "return requested"),
               "modify_order_address": ("processed", "delivered", "cancelled")}


def _precondition(rng: random.Random, db: StoreDB, user: User) -> list[SubRequest]:
    (order,) = _user_orders(db, user, rng, 1)
    kind = "cancel" if rng.random() < 0.6 else "modify_order_address"
    status = "pending" if rng.random() < 0.5 else rng.choice(NOT_PENDING[kind])
    if kind == "cancel":
        return [_cancel(rng, order, status, hash_in_ref=True, paraphrase=False)]
    return [_modify_order_address(rng, order, status, hash_in_ref=True)]


def _compound(rng: random.Random, db: StoreDB, user: User) -> list[SubRequest]:
    n = 2 if rng.random() < 0.75 else 3
    kinds = [rng.choice(("cancel", "modify_order_address")) for _ in range(n)]
    if rng.random() < 0.5:
        kinds[rng.randrange(n)] = "modify_user_address"
    orders = iter(_user_orders(db, user, rng, sum(k != "modify_user_address" for k in kinds)))
    subs = []
    for kind in kinds:
        if kind == "cancel":
            subs.append(_cancel(rng, next(orders), "pending", hash_in_ref=True, paraphrase=False))
        elif kind == "modify_order_address":
            subs.append(_modify_order_address(rng, next(orders), "pending", hash_in_ref=True))
        else:
            subs.append(_modify_user_address(rng, user))
    return subs


def _nested_field(rng: random.Random, db: StoreDB, user: User) -> list[SubRequest]:
    if len(user.payment_methods) < 2:  # a second method makes the refund target a real choice
        sources = [s for s in ("credit_card", "paypal", "gift_card")
                   if s not in {p.source for p in user.payment_methods}]
        add_payment_method(rng, db, user, rng.choice(sources))
    (order,) = _user_orders(db, user, rng, 1)
    # Usually pay with a method other than the user's first one, so "the first card" is a wrong guess.
    others = user.payment_methods[1:]
    method = rng.choice(others) if rng.random() < 0.75 else user.payment_methods[0]
    order.payment_history[0].payment_method_id = method.id
    if rng.random() < 0.35:
        exchange = _exchange(rng, db, order, hash_in_ref=True)
        if exchange is not None:
            return [exchange]
    has_gift_card = any(p.source == "gift_card" and p.id != method.id for p in user.payment_methods)
    to_gift_card = has_gift_card and rng.random() < 0.25
    index = rng.randrange(len(order.items))
    return [_return(rng, db, user, order, [index], hash_in_ref=True, to_gift_card=to_gift_card)]


def _arg_format(rng: random.Random, db: StoreDB, user: User) -> list[SubRequest]:
    kind = rng.choice(("cancel", "modify_order_address", "return_two", "modify_user_address"))
    if kind == "cancel":
        (order,) = _user_orders(db, user, rng, 1)
        return [_cancel(rng, order, "pending", hash_in_ref=False, paraphrase=True)]
    if kind == "modify_order_address":
        (order,) = _user_orders(db, user, rng, 1)
        return [_modify_order_address(rng, order, "pending", hash_in_ref=False, leading_zero_zip=True)]
    if kind == "return_two":
        (order,) = _user_orders(db, user, rng, 1, n_items=2)
        return [_return(rng, db, user, order, [0, 1], hash_in_ref=False, to_gift_card=False)]
    return [_modify_user_address(rng, user, leading_zero_zip=True)]


_BUILDERS = {"precondition": _precondition, "compound": _compound, "nested_field": _nested_field,
             "arg_format": _arg_format}


def _opening(rng: random.Random, subs: list[SubRequest]) -> str:
    greeting = rng.choice(GREETINGS)
    first = f"I want to {subs[0].clause}"
    rest = [f"Also, please {s.clause}" for s in subs[1:]]
    return " ".join(p for p in (greeting, first, *rest) if p)


def make_task(seed: int, family: str | None = None, n_users: int = 3, n_products: int = 6) -> Task:
    """The task of `seed` (family chosen from the seed when None). Deterministic in its arguments."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed must be an int, got {seed!r}")
    family = family or family_for_seed(seed)
    if family not in _BUILDERS:
        raise ValueError(f"unknown storefront family {family!r}; choose from {', '.join(FAMILIES)}")
    rng = random.Random(f"storefront:{seed}:{family}")
    # Two orders at most per user: other users' orders are never seen, and the task adds what it needs.
    db = generate_db(rng, n_users=n_users, n_products=n_products, max_orders=2)
    user = rng.choice(list(db.users.values()))
    auth_by_email = rng.random() < (0.5 if family == "arg_format" else 0.75)
    if family == "arg_format" and not auth_by_email and not user.address.zip.startswith("0"):
        # name+zip look-ups in arg_format use a leading-zero zip (an int would lose it).
        user.address = _new_address(rng, leading_zero_zip=True)
    subs = _BUILDERS[family](rng, db, user)
    return Task(task_id=f"{family}_{seed}", seed=seed, family=family, db=db, user_id=user.user_id,
                auth="email" if auth_by_email else "name_zip", sub_requests=subs, opening=_opening(rng, subs))
