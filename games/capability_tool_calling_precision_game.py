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

Requests: cancel an order, change an order's shipping address, return two named items of an order (a list
of two ids read from the order), change the default address (at most once per episode).

One request per episode, as in the target (`requests_per_episode`, default 1; more stay a knob). The
decision classes are the write the request needs, one per request kind (which tool, with which argument
forms): on the demo's surface cancels are the largest class (0.46 of instances), so no policy that always
makes the same kind of call may win more than 0.51 (validate_game's class-prior rule). The ablation
`values_as_written` (the expert copying values as the customer wrote them: the id as typed, the reason in
their words, a zip as a number keeps it, one item id per return) wins only where the customer happened to
write every value exactly (measured over 200 seeds on the demo's surface: 0.07), never where a value needed
rewriting.

Surface (`storefront`, see games/_storefront/): the request is the target's own, drawn by its
`RequestBuilder` from every kind the target draws (a loose id applies to all of them) at the target's
relative weights, always allowed, so its openings, reasons, addresses, items, refund targets, unknown ids
(with the order search) and confirmation rule are the target's. `looseness` then sets the share of the
target's precision needs, each drawn per request: 0 the target's own rates (loose ids, paraphrased reasons,
leading-zero zips, two-item returns), 1 halfway from those to every need, 2 every one of them. No level
goes below the target's rates: with none, the expert without the skill would win (a level where the skill
decides nothing is no difficulty setting). `name_zip_rate` stands in for the target's share of name+zip
customers (their zip with a leading zero at the level's rate). The table above is the game alone.

Expert (oracle): ask who the customer is, look them up, then per request look the order up, confirm, write,
say so (2 + 4 turns per request; 3 for the default address; with a surface up to 8 per request: an order
search, an exchange's product).

Reward (in [0, 1]; success = 1.0), mostly on exactness:
  0.5  write, averaged over the requests: the request's order (or the customer's address) ends as expected
       (the write made with exactly the right values);
  0.2  identification: a user look-up returned the customer's id (first/last name split, zip a string), paid
       once a write was attempted (partial credit pays for progress on the request, never for stopping: an
       agent that identified the customer and then quit scored more than one that tried and missed once);
  0.3  confirmation, averaged over the requests, only with the request's write: an honest reply after the
       write gives the order id (cancel, order address), the amount (return: the refund; exchange: the price
       difference) or the words "default address" (default-address change);
 -0.1  per tool call that failed (wrong id format, wrong type, not found, a second call in one turn):
       first-time exactness is the skill;
  no write or confirmation credit when anything not asked for changed or the policy's procedure broke (a
  call before authentication, a write on an order not looked up, an id never shown, a write without a yes).

Difficulty (declared knobs, harder as they rise): `looseness` (how far the customer's writing is from the
arguments) and `name_zip_rate` (customers who identify by name and a leading-zero zip, not by email).

Tools: the storefront's full toolkit, the target agent's own schemas (a tool the game has no use for is
still offered, as in the target; a write the plan does not make changes the database and voids the
action part).
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from benchmarks.storefront.db import Address, StoreDB, User, add_order, generate_db
from benchmarks.storefront.tasks import RequestBuilder, descriptions_unique, draw_customer
from benchmarks.storefront.tools import StorefrontTools
from benchmarks.storefront.user_sim import REQUEST_KINDS as SURFACE_KINDS  # a loose id applies to every kind
from common.validation import check_choices, check_int, check_number
from games._storefront.config import StorefrontGameConfig, draw_kind, surface_kind_weights
from games._storefront.game import StorefrontCapabilityGame
from games._storefront.instances import Instance, PlannedCall, PlannedRequest, identity_sentence
from games._storefront.replies import address_text, money, new_address, original_payment_method
from games._storefront.spec import storefront_game_spec
from game_registry import DifficultyKnob, register_game

CAPABILITY = "tool_calling_precision"
GAME_NAME = f"capability_{CAPABILITY}"
TASK_KINDS = ("cancel", "modify_order_address", "return", "modify_user_address")
MAX_LOOSENESS = 2
REASON_TEXTS = {  # cancel reason -> how the customer says it at looseness 1, then the paraphrases of level 2
    "no longer needed": ("I no longer need it.", ("I don't need it anymore.", "Turns out I have no use for it.")),
    "ordered by mistake": ("I ordered it by mistake.", ("I bought it by accident.", "That order was an accident.")),
}
WRITE_WEIGHT, IDENTIFY_WEIGHT, CONFIRM_WEIGHT, FAILED_CALL_PENALTY = 0.5, 0.2, 0.3, 0.1
AS_WRITTEN = "values_as_written"  # the ablation (see the module docstring)
REQUESTS_PER_EPISODE = 1  # the target's shape: one customer, one request
# The oracle's turns: ask identity and look the user up once, then per request look the order up, confirm,
# write, tell (alone). With a surface a request can take up to 8 (an order search, an exchange's product); an
# instance whose plan does not fit is drawn again.
ORACLE_TURNS_PER_REQUEST = 4
MAX_STEPS = 12  # the demo target's turn limit (evaluate.max_steps): one request with look-ups to spare
MAX_TURNS = 20  # the registered cap on turns: room for requests_per_episode=3 (max_steps=20)
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
    requests_per_episode: int = REQUESTS_PER_EPISODE  # requests per episode, one at a time
    max_steps: int = MAX_STEPS  # room for the oracle's plans (with a surface, longer ones are drawn again)

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        check_int(self.looseness, f"{owner}.looseness", 0, MAX_LOOSENESS)
        kinds = TASK_KINDS if self.surface is None else SURFACE_KINDS
        if self.task_kinds is not None:
            self.task_kinds = check_choices(self.task_kinds, f"{owner}.task_kinds", kinds)
        check_number(self.name_zip_rate, f"{owner}.name_zip_rate", 0, 1)
        # {kind: weight} of the requests drawn (not a field: the summary shows task_kinds as given).
        self.drawn_kinds = (dict.fromkeys(self.task_kinds or TASK_KINDS, 1.0) if self.surface is None else
                            surface_kind_weights(owner, self.surface, SURFACE_KINDS, self.task_kinds, "task_kinds"))
        self.check_room(2 + ORACLE_TURNS_PER_REQUEST * self.requests_per_episode,
                        f"the oracle with requests_per_episode={self.requests_per_episode}")

    def looseness_rates(self) -> dict[str, float]:
        """The surface's precision-need rates at this `looseness`: 0 the target's, 1 halfway to all, 2 all."""
        return {name: (rate, (rate + 1.0) / 2, 1.0)[self.looseness]
                for name, rate in ((name, getattr(self.surface, name)) for name in PRECISION_RATES)}


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


def as_written_call(call: PlannedCall, request: PlannedRequest) -> PlannedCall:
    """`call` with each value copied as the customer wrote it: the order id as typed, the cancel reason in
    their words, a zip as a number would keep it (no leading zero), one item id of a multi-item return."""
    arguments = dict(call.arguments)
    user = request.user
    if user.order_ref and arguments.get("order_id") == user.order_id:
        arguments["order_id"] = user.order_ref
    if "reason" in arguments and user.reason_text:
        arguments["reason"] = user.reason_text
    if str(arguments.get("zip", "")).startswith("0"):
        arguments["zip"] = arguments["zip"].lstrip("0")
    if call.name == "return_delivered_order_items" and len(arguments["item_ids"]) > 1:
        arguments["item_ids"] = arguments["item_ids"][:1]
    return PlannedCall(call.name, arguments)


def as_written_plan(request: PlannedRequest) -> PlannedRequest:
    """`request`'s plan with every call's values as the customer wrote them (the expert without precision)."""
    return dataclasses.replace(request, calls=[as_written_call(c, request) for c in request.calls], ablated={})


def as_written_auth(instance: Instance, last_name_first: bool) -> PlannedCall:
    """The user look-up with the zip as a number keeps it, and the names in the order the customer gave them."""
    call = instance.auth_call
    if call.name != "find_user_id_by_name_zip":
        return call
    arguments = {**call.arguments, "zip": call.arguments["zip"].lstrip("0")}
    if last_name_first:
        arguments.update(first_name=call.arguments["last_name"], last_name=call.arguments["first_name"])
    return PlannedCall(call.name, arguments)


class ToolCallingPrecisionGame(StorefrontCapabilityGame):
    """`requests_per_episode` allowed requests, one at a time, whose arguments the customer writes loosely."""

    game_name = GAME_NAME
    capability = CAPABILITY
    ABLATIONS = {AS_WRITTEN: "copies values as the customer wrote them (order id as typed, reason in their words, "
                             "zip as a number, one item id per return)"}
    DECISION_CLASSES = tuple(dict.fromkeys((*TASK_KINDS, *SURFACE_KINDS)))  # the write a request needs, by kind

    def request_class(self, request: PlannedRequest) -> str:
        """The request's kind: which write tool it needs, with that kind's argument forms."""
        return request.kind

    def __init__(self, config: ToolCallingPrecisionConfig | None = None) -> None:
        super().__init__(config or ToolCallingPrecisionConfig())
        config = self.config
        # The target's rates: every request allowed, the level's precision needs, the game's name+zip share.
        self.rates = None if config.surface is None else config.surface_rates(
            forbidden_rate=0.0, email_auth_rate=1.0 - config.name_zip_rate, **config.looseness_rates())

    def _draw_from_surface(self, rng: random.Random) -> Instance | None:
        """Allowed target requests, their values written as loosely as the level's rates draw (None when an
        order description reads ambiguously, as the target redraws)."""
        customer = draw_customer(rng, self.rates)
        builder = RequestBuilder(rng, self.rates, customer.db, customer.user)
        kinds: list[str] = []
        for _ in range(self.config.requests_per_episode):  # the default address at most once, as the target
            kinds.append(draw_kind(rng, {k: w for k, w in self.config.drawn_kinds.items()
                                         if k != "modify_user_address" or k not in kinds}))
        subs = [builder.build(kind) for kind in kinds]
        if not descriptions_unique(customer.db, customer.user, subs):
            return None
        instance = self.surface_instance(rng, customer, subs, {"looseness": self.config.looseness},
                                         ablated=lambda sub, request: {AS_WRITTEN: as_written_plan(request)})
        instance.ablated_auth = {AS_WRITTEN: as_written_auth(instance, last_name_first=False)}
        return instance

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
        kinds: list[str] = []
        for _ in range(config.requests_per_episode):  # the default address at most once
            kinds.append(rng.choice([k for k in config.drawn_kinds if k != "modify_user_address" or k not in kinds]))
        requests, clauses = [], []
        for kind in kinds:
            request, clause = self._alone_request(rng, db, user, kind)
            request.ablated = {AS_WRITTEN: as_written_plan(request)}
            requests.append(request)
            clauses.append(clause)
        identity = loose_identity(user, auth, level)
        opening, follow_ups = self.make_messages(rng, identity, clauses)
        instance = Instance(db=db, user=user, auth=auth, opening=opening, requests=requests, follow_ups=follow_ups,
                            info={"looseness": level}, identity_reply=identity)
        instance.ablated_auth = {AS_WRITTEN: as_written_auth(instance, last_name_first=level >= 2)}
        return instance

    def _alone_request(self, rng: random.Random, db: StoreDB, user: User, kind: str) -> tuple[PlannedRequest, str]:
        """One request of the game alone (on a fresh order of `user` unless it is the default address), and
        the customer's clause for it."""
        level = self.config.looseness
        zero_zips = level >= 1
        if kind == "modify_user_address":
            address = new_address(rng, user.address, leading_zero_zip=zero_zips)
            calls = [PlannedCall("modify_user_address", {"user_id": user.user_id, **address.to_dict()})]
            return (PlannedRequest(kind, calls, "Your default address is updated.", {"user_id": user.user_id}),
                    f"update my default address to {loose_address(address, level)}.")
        order = add_order(rng, db, user, "delivered" if kind == "return" else "pending",
                          n_items=2 if kind == "return" else None)
        oid = order.order_id
        ref = order_reference(oid, level)
        calls = [PlannedCall("get_order_details", {"order_id": oid})]
        info = {"order_id": oid, "order_ref": ref}
        reason_text = ""
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
        request.user.reason_text = reason_text
        return request, clause

    def attempted_write(self) -> bool:
        """Whether the agent called a write tool at all (whether or not the call went through)."""
        return any(StorefrontTools.is_write(record.name) for record in self.state.tool_calls)

    def score(self) -> dict[str, float]:
        """Each request's write and report (module docstring), averaged, plus the user look-up once a write was
        attempted, less the failed calls; no write or report credit when anything not asked for changed or the
        procedure broke."""
        requests = self.instance.requests
        if self.nothing_else_changed() and not self.policy_violations():
            replies = self.told()
            done = [self.request_done(r) for r in requests]
            parts = self.mean_parts([{"write": WRITE_WEIGHT if d else 0.0,
                                      "confirm": CONFIRM_WEIGHT if d and self.request_reported(r, replies) else 0.0}
                                     for r, d in zip(requests, done)])
        else:
            parts = {"write": 0.0, "confirm": 0.0}
        identified = self.authenticated() and self.attempted_write()
        return {"write": parts["write"], "identify": IDENTIFY_WEIGHT if identified else 0.0,
                "confirm": parts["confirm"], "failed_calls": -FAILED_CALL_PENALTY * self.failed_call_count()}



register_game(storefront_game_spec(
    ToolCallingPrecisionGame, ToolCallingPrecisionConfig, CAPABILITY, hint=HINT,
    max_turns=MAX_TURNS,
    difficulty_knobs=(DifficultyKnob("looseness", "increase", (0, 1, 2)),
                      DifficultyKnob("name_zip_rate", "increase", (0.0, 0.5, 1.0))),
))
