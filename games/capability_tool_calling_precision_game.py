"""Capability game `tool_calling_precision`: turn loosely written values into exact tool arguments.

The customer writes values the way people do and the tools want them exactly: order ids with '#W',
cancel reasons as the enum's words, zip codes as strings (here with a leading zero, which an integer
would lose), first and last name as separate arguments, item ids as a list of strings, an address split
into its six fields. Tools are strict (no coercion), so a loose value is an error message or a miss.
`looseness` sets how far the customer's writing is from the argument:

  looseness    order id        cancel reason                 name (name+zip look-up)   address
  0            '#W1234567'     "The reason: no longer        'Mia Chen'                 '12 Oak St, Apt 4, Boston,
                               needed."                                                 MA, USA, 02134'
  1            'W1234567'      "I no longer need it."        'Mia Chen'                 same; zips start with 0
  2            '1234567'       a paraphrase ("I don't need   'Chen, Mia (last name      '12 Oak St Apt 4, Boston MA
                               it anymore.")                 first)'                    02134, USA'

Requests (one per instance): cancel an order, change an order's shipping address, return two named items
of an order (a list of two ids read from the order), change the default address.

Surface (`storefront`, see games/_storefront_game_kit.py): the request is the target's own, drawn by its
`RequestBuilder` from every kind the target draws (a loose id applies to all of them) at the target's
relative weights, always allowed, so its openings, reasons, addresses, items, refund targets, unknown ids
(with the order search) and confirmation rule are the target's. `looseness` then sets the share of the
target's precision needs, each drawn per request: 0 none (ids with '#W', plain reasons, no leading-zero
zip, one returned item), 1 the target's own rates (loose ids, paraphrased reasons, leading-zero zips,
two-item returns), 2 every one of them. `name_zip_rate` stands in for the target's share of name+zip
customers (their zip with a leading zero at the level's rate). The table above is the game alone.

Expert (oracle): ask who the customer is, look them up, look the order up, confirm, write, say so (6
turns; 4 for the default address; with a surface up to 10: an order search, an exchange's product).

Reward (in [0, 1]; success = 1.0), mostly on exactness:
  0.5  write: the final database equals the expected one (the write made with exactly the right values;
       any other write breaks it) and the policy's procedure holds (no call before authentication, no
       write on an order not looked up, no id that was never shown);
  0.2  identification: a user look-up returned the customer's id (first/last name split, zip a string);
  0.3  confirmation, only with the write part: an honest reply after the write gives the order id (cancel, order address),
       the amount (return: the refund; exchange: the price difference) or the words "default address"
       (default-address change);
 -0.1  per tool call that failed (wrong id format, wrong type, not found, a second call in one turn):
       first-time exactness is the skill.

Difficulty (declared knobs, harder as they rise): `looseness` (how far the customer's writing is from the
arguments) and `name_zip_rate` (customers who identify by name and a leading-zero zip, not by email).

Tools: the storefront's full toolkit, the target agent's own schemas (a tool the game has no use for is
still offered, as in the target; a write the plan does not make changes the database and voids the
action part).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from benchmarks.storefront.db import Address, User, add_order, generate_db
from benchmarks.storefront.policy import POLICY
from benchmarks.storefront.tasks import RequestBuilder, draw_customer
from benchmarks.storefront.user_sim import REQUEST_KINDS as SURFACE_KINDS  # a loose id applies to every kind
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
    check_int,
    draw_kind,
    identity_sentence,
    phrase_pattern,
    money,
    new_address,
    original_payment_method,
    surface_kind_weights,
)

CAPABILITY = "tool_calling_precision"
GAME_NAME = f"capability_{CAPABILITY}"
TASK_KINDS = ("cancel", "modify_order_address", "return", "modify_user_address")
MAX_LOOSENESS = 2
REASON_TEXTS = {  # cancel reason -> how the customer says it at looseness 1, then the paraphrases of level 2
    "no longer needed": ("I no longer need it.", ("I don't need it anymore.", "Turns out I have no use for it.")),
    "ordered by mistake": ("I ordered it by mistake.", ("I bought it by accident.", "That order was an accident.")),
}
WRITE_WEIGHT, IDENTIFY_WEIGHT, CONFIRM_WEIGHT, FAILED_CALL_PENALTY = 0.5, 0.2, 0.3, 0.1
ORACLE_TURNS = 6  # ask identity, look the user up, look the order up, confirm, write, tell
# With a surface: ask, user, the customer's record and two earlier orders (order search), order, product, confirm,
# write, tell.
SURFACE_ORACLE_TURNS = 10
# The target's rates of the needs `looseness` sets (with a surface), and how each level sets them.
PRECISION_RATES = ("loose_order_id_rate", "paraphrase_rate", "leading_zero_zip_rate", "two_items_rate")

HINT = ("Hint: write arguments exactly: order_id as '#W' plus the digits, zip as a string keeping leading "
        "zeros, first_name and last_name separately, item_ids as a list of strings, address in six fields, "
        "reason exactly 'no longer needed' or 'ordered by mistake'.")


@dataclass
class ToolCallingPrecisionConfig(StorefrontGameConfig):
    """Difficulty knobs of the exact-arguments game."""

    looseness: int = 1  # how loosely the customer writes values (0 exact .. 2 loosest; see the module docstring)
    # Requests drawn. None: alone, TASK_KINDS uniformly; with a surface, the kinds it draws at its weights.
    task_kinds: tuple[str, ...] | None = None
    name_zip_rate: float = 0.75  # share of customers who identify by name and zip (the rest by email)
    max_steps: int = SURFACE_ORACLE_TURNS  # room for the oracle on a surface's longest plan

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        check_int(owner, "looseness", self.looseness, 0, MAX_LOOSENESS)
        kinds = TASK_KINDS if self.surface is None else SURFACE_KINDS
        if self.task_kinds is not None:
            self.task_kinds = check_choices(owner, "task_kinds", self.task_kinds, kinds)
        check_fraction(owner, "name_zip_rate", self.name_zip_rate)
        # {kind: weight} of the requests drawn (not a field: the summary shows task_kinds as given).
        self.drawn_kinds = (dict.fromkeys(self.task_kinds or TASK_KINDS, 1.0) if self.surface is None else
                            surface_kind_weights(owner, self.surface, SURFACE_KINDS, self.task_kinds, "task_kinds"))
        self.check_room(ORACLE_TURNS if self.surface is None else SURFACE_ORACLE_TURNS, "the oracle")

    def looseness_rates(self) -> dict[str, float]:
        """The surface's precision-need rates at this `looseness`: 0 none, 1 the target's, 2 all."""
        return {name: (0.0, getattr(self.surface, name), 1.0)[self.looseness] for name in PRECISION_RATES}


def order_reference(order_id: str, looseness: int) -> str:
    """How the customer writes an order id: '#W1234567', 'W1234567' or '1234567'."""
    return (order_id, order_id.removeprefix("#"), order_id.removeprefix("#W"))[looseness]


def loose_address(address: Address, looseness: int) -> str:
    """An address as the customer writes it (level 2 runs the street lines together, drops the commas)."""
    if looseness < 2:
        return address_text(address)
    street = f"{address.address1} {address.address2}".strip()
    return f"{street}, {address.city} {address.state} {address.zip}, {address.country}"


def loose_identity(user: User, auth: str, looseness: int) -> str:
    """What the customer answers when asked who they are."""
    if auth == "name_zip" and looseness >= 2:
        return (f"I don't remember my email. My name is {user.last_name}, {user.first_name} (last name first), "
                f"zip code {user.address.zip}.")
    return identity_sentence(user, auth)


class ToolCallingPrecisionGame(StorefrontCapabilityGame):
    """One allowed request whose arguments the customer writes loosely."""

    game_name = GAME_NAME
    capability = CAPABILITY

    def __init__(self, config: ToolCallingPrecisionConfig | None = None) -> None:
        super().__init__(config or ToolCallingPrecisionConfig())
        config = self.config
        # The target's rates: every request allowed, the level's precision needs, the game's name+zip share.
        self.rates = None if config.surface is None else config.surface_rates(
            forbidden_rate=0.0, email_auth_rate=1.0 - config.name_zip_rate, **config.looseness_rates())

    def _draw_from_surface(self, rng: random.Random) -> Instance:
        """One allowed target request, its values written as loosely as the level's rates draw."""
        customer = draw_customer(rng, self.rates)
        kind = draw_kind(rng, self.config.drawn_kinds)
        sub = RequestBuilder(rng, self.rates, customer.db, customer.user).build(kind)
        return self.surface_instance(rng, customer, [sub], {"looseness": self.config.looseness})

    def _build_alone(self, rng: random.Random) -> Instance:
        """The game's own instance (no surface): the table of the module docstring."""
        config = self.config
        level = config.looseness
        zero_zips = level >= 1  # zips with a leading zero: a number instead of a string loses it
        db = generate_db(rng, n_users=2, n_products=4, min_orders=1, max_orders=1, ids=config.ids)
        user = next(iter(db.users.values()))
        auth = "name_zip" if rng.random() < config.name_zip_rate else "email"
        if auth == "name_zip" and zero_zips and not user.address.zip.startswith("0"):
            user.address = new_address(rng, user.address, leading_zero_zip=True)
        kind = rng.choice(tuple(config.drawn_kinds))

        if kind == "modify_user_address":
            address = new_address(rng, user.address, leading_zero_zip=zero_zips)
            clause = f"update my default address to {loose_address(address, level)}."
            calls = [PlannedCall("modify_user_address", {"user_id": user.user_id, **address.to_dict()})]
            request = PlannedRequest(kind, calls, "Your default address is updated.", {"user_id": user.user_id})
        else:
            order = add_order(rng, db, user, "delivered" if kind == "return" else "pending",
                              n_items=2 if kind == "return" else None)
            oid = order.order_id
            ref = order_reference(oid, level)
            calls = [PlannedCall("get_order_details", {"order_id": oid})]
            info = {"order_id": oid, "order_ref": ref}
            if kind == "cancel":
                reason = rng.choice(tuple(REASON_TEXTS))
                plain, paraphrases = REASON_TEXTS[reason]
                reason_text = (f"The reason: {reason}.", plain, rng.choice(paraphrases))[level]
                clause = f"cancel order {ref}. {reason_text}"
                calls.append(PlannedCall("cancel_pending_order", {"order_id": oid, "reason": reason}))
                statement = f"Order {oid} is cancelled."
            elif kind == "modify_order_address":
                address = new_address(rng, order.address, leading_zero_zip=zero_zips)
                clause = f"change the shipping address of order {ref} to {loose_address(address, level)}."
                calls.append(PlannedCall("modify_pending_order_address", {"order_id": oid, **address.to_dict()}))
                statement = f"The address of order {oid} is updated."
            else:
                method = original_payment_method(order)
                clause = f"return the {order.items[0].name} and the {order.items[1].name} from order {ref}."
                calls.append(PlannedCall("return_delivered_order_items", {
                    "order_id": oid, "item_ids": [i.item_id for i in order.items], "payment_method_id": method}))
                info["amount"] = order.total
                statement = f"The return is requested. You will get {money(order.total)} back to {method}."
            request = PlannedRequest(kind, calls, statement, info)
        identity = loose_identity(user, auth, level)
        return Instance(db=db, user=user, auth=auth, opening=self.make_opening(rng, identity, [clause]),
                        requests=[request], info={"looseness": level}, identity_reply=identity)

    def score(self) -> dict[str, float]:
        request = self.instance.requests[0]
        write_ok = self.db == self.expected_db and not self.policy_violations()
        replies, after = self.told(), self.written(request)
        if request.kind == "modify_user_address":
            told = replies.tells_phrase(phrase_pattern("default address"), after=after)
        elif "amount" in request.info:  # a return or exchange
            told = replies.tells_amount(request.info["amount"], after=after)
        else:
            told = replies.tells_order_id(request.info["order_id"], after=after)
        told = told and not replies.voided(request.info.get("order_id", ""))  # a wrong assertion costs
        return {"write": WRITE_WEIGHT if write_ok else 0.0,
                "identify": IDENTIFY_WEIGHT if self.authenticated() else 0.0,
                "confirm": CONFIRM_WEIGHT if write_ok and told else 0.0,
                "failed_calls": -FAILED_CALL_PENALTY * self.failed_call_count()}


def make_game(config: ToolCallingPrecisionConfig | None = None) -> ToolCallingPrecisionGame:
    """A fresh game (default config when None)."""
    return ToolCallingPrecisionGame(config)


register_game(GameSpec(
    name=GAME_NAME,
    make_env=make_game,
    system_prompt=POLICY,
    base_prompt="",
    hint_prompt=HINT,
    max_gen_tokens=160,  # as the target: the longest expert turn (an address change) is ~110 tokens
    max_turns=ToolCallingPrecisionConfig().max_steps,
    capability=CAPABILITY,
    config_cls=ToolCallingPrecisionConfig,
    target=TARGET_BENCHMARK,
    difficulty_knobs=(DifficultyKnob("looseness", "increase", (0, 1, 2)),
                      DifficultyKnob("name_zip_rate", "increase", (0.0, 0.5, 1.0))),
))
