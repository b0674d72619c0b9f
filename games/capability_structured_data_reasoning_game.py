"""Capability game `structured_data_reasoning`: read the right value out of nested tool output.

Each instance is one request on a delivered order whose answer sits inside a JSON record among
look-alike entries:
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

Expert (oracle): ask who the customer is, look them up, read the order (and the user or product
record), confirm, write, then state the amount. 6 or 7 turns.

Reward (in [0, 1]; success = 1.0):
  0.6  action: the final database equals the expected one (right items, right new variant, right
       payment method; any other write also breaks it) and the policy's procedure holds (no call before
       authentication, no write on an order not looked up, no id that was never shown: the item, variant
       and payment-method ids must be read, not guessed);
  0.4  communication, only on top of the action part: an honest reply after the write (no pasted tool
       output, no other amount) states the refund amount (return) or the price difference (exchange; the sign is not
       checked). Tools return the updated record, never the amount: it has to be added up.

Difficulty (declared knobs, harder as they rise): `n_distractor_items` (look-alike items in the order)
and `min_payment_methods` (payment methods the refund target hides among).

Tools: the storefront's full toolkit, the target agent's own schemas (a tool the game has no use for is
still offered, as in the target; a write the plan does not make changes the database and voids the
action part).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from benchmarks.storefront.db import add_order, add_payment_method, generate_db
from benchmarks.storefront.policy import POLICY
from game_registry import DifficultyKnob, GameSpec, register_game
from games._storefront_game_kit import (
    TARGET_BENCHMARK,
    Instance,
    PlannedCall,
    PlannedRequest,
    StorefrontCapabilityGame,
    StorefrontGameConfig,
    check_choices,
    check_fraction,
    check_int,
    identity_sentence,
    money,
)

CAPABILITY = "structured_data_reasoning"
GAME_NAME = f"capability_{CAPABILITY}"
TASK_KINDS = ("return", "return_to_gift_card", "exchange")
PAYMENT_SOURCES = ("credit_card", "paypal", "gift_card")
ACTION_WEIGHT, COMMUNICATION_WEIGHT = 0.6, 0.4
ORACLE_TURNS = 7  # ask identity, look the user up, order, user or product record, confirm, write, statement

HINT = ("Hint: copy values from the tool output: the item_id of the named item, the item_id of the variant "
        "with the asked option, the payment_method_id from payment_history (the gift card id from "
        "get_user_details if asked). Add the returned items' prices and tell the amount.")


@dataclass
class StructuredDataReasoningConfig(StorefrontGameConfig):
    """Difficulty knobs of the nested-value game."""

    task_kinds: tuple[str, ...] = TASK_KINDS  # drawn uniformly
    n_distractor_items: int = 1  # items of the order the customer does not ask about (0..4)
    max_return_items: int = 1  # a return names 1..max_return_items items (1..2)
    min_payment_methods: int = 2  # payment methods the customer owns at least (1..5)
    email_auth_rate: float = 0.75  # share of customers who identify by email (the rest by name and zip)
    max_steps: int = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        self.task_kinds = check_choices(owner, "task_kinds", self.task_kinds, TASK_KINDS)
        check_int(owner, "n_distractor_items", self.n_distractor_items, 0, 4)
        check_int(owner, "max_return_items", self.max_return_items, 1, 2)
        check_int(owner, "min_payment_methods", self.min_payment_methods, 1, 5)
        check_fraction(owner, "email_auth_rate", self.email_auth_rate)
        if "return_to_gift_card" in self.task_kinds and self.min_payment_methods < 2:
            raise ValueError(f"{owner}: task kind 'return_to_gift_card' needs a gift card besides the method the "
                             f"order was paid with; pass min_payment_methods=2 or more, or drop that kind")
        self.check_room(ORACLE_TURNS, "the oracle")


class StructuredDataReasoningGame(StorefrontCapabilityGame):
    """A return or exchange whose arguments and amount must be read from nested records."""

    game_name = GAME_NAME
    capability = CAPABILITY

    def __init__(self, config: StructuredDataReasoningConfig | None = None) -> None:
        super().__init__(config or StructuredDataReasoningConfig())

    def build_instance(self, rng: random.Random) -> Instance:
        config = self.config
        kind = rng.choice(config.task_kinds)
        n_named = rng.randint(1, config.max_return_items) if kind != "exchange" else 1
        n_items = n_named + config.n_distractor_items
        db = generate_db(rng, n_users=2, n_products=max(n_items, 3), min_orders=1, max_orders=1, ids=config.ids)
        user = next(iter(db.users.values()))
        auth = "email" if rng.random() < config.email_auth_rate else "name_zip"
        while len(user.payment_methods) < config.min_payment_methods:
            # At most one gift card: "refund it to my gift card" must name exactly one method.
            has_gift_card = any(p.source == "gift_card" for p in user.payment_methods)
            sources = [s for s in PAYMENT_SOURCES if s != "gift_card" or not has_gift_card]
            add_payment_method(rng, db, user, rng.choice(sources))
        if kind == "return_to_gift_card" and not any(p.source == "gift_card" for p in user.payment_methods):
            add_payment_method(rng, db, user, "gift_card")

        order = add_order(rng, db, user, "delivered", n_items=n_items)
        oid = order.order_id
        # Usually paid with a method other than the first one listed, so "the first method" is a wrong guess.
        payable = user.payment_methods
        if kind == "return_to_gift_card":  # the refund target must differ from the original method
            gift_card = rng.choice([p for p in payable if p.source == "gift_card"])
            payable = [p for p in payable if p.id != gift_card.id]
        method = rng.choice(payable[1:]) if len(payable) > 1 and rng.random() < 0.75 else payable[0]
        order.payment_history[0].payment_method_id = method.id
        look_up = PlannedCall("get_order_details", {"order_id": oid})
        info = {"order_id": oid, "paid_with": method.id, "n_items": n_items}

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
        identity = identity_sentence(user, auth)
        return Instance(db=db, user=user, auth=auth, opening=self.make_opening(rng, identity, [clause]),
                        requests=[PlannedRequest(kind, calls, statement, info)],
                        info={"n_payment_methods": len(user.payment_methods)}, identity_reply=identity)

    def score(self) -> dict[str, float]:
        request = self.instance.requests[0]
        action_ok = self.db == self.expected_db and not self.policy_violations()
        told = self.told().tells_amount(request.info["amount"], after=self.written(request))
        return {"action": ACTION_WEIGHT if action_ok else 0.0,
                "communication": COMMUNICATION_WEIGHT if action_ok and told else 0.0}


def make_game(config: StructuredDataReasoningConfig | None = None) -> StructuredDataReasoningGame:
    """A fresh game (default config when None)."""
    return StructuredDataReasoningGame(config)


register_game(GameSpec(
    name=GAME_NAME,
    make_env=make_game,
    system_prompt=POLICY,
    base_prompt="",
    hint_prompt=HINT,
    max_gen_tokens=160,  # as the target: the longest expert turn is ~110 tokens
    max_turns=StructuredDataReasoningConfig().max_steps,
    capability=CAPABILITY,
    config_cls=StructuredDataReasoningConfig,
    target=TARGET_BENCHMARK,
    difficulty_knobs=(DifficultyKnob("n_distractor_items", "increase", (0, 1, 2, 3, 4)),
                      DifficultyKnob("min_payment_methods", "increase", (2, 3, 4, 5))),
))
