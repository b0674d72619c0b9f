"""Shared machinery of the four storefront capability games in `games/` (not a game itself).

The games train skills for the built-in target benchmark `storefront`, so they keep its conversation
shape and only change what is asked:

- **Tools**: the storefront's full toolkit (`StorefrontTools`), so the tool list the model sees is the
  target's, byte for byte. An agent trained on the target calls tools a game has no use for (it looks the
  user's details up, say); offering only a game's subset turned those habits into unknown-tool errors and
  put a game out of reach of an agent that passes the same request in the target. A write the plan does
  not make changes the database, which every game's action part compares with the expected one.
- **System prompt**: the storefront's written policy (`benchmarks.storefront.policy.POLICY`), unchanged.
- **Conversation**: as in the target, the customer opens with the request(s) but not who they are
  (unless the config sets `identity_in_opening`); the expert asks `AUTH_QUESTION`, looks the user up, and
  for each request makes its look-ups and write, then a statement that closes it.
- **Customer**: the target's own scripted customer (`benchmarks.storefront.user_sim.UserSimulator`): the
  same question gets the same answer here and in the target ("which order do you mean?" gets the id).
  Its wording is seeded separately from the instance, so the instance stays the same.
- **Policy procedure**: as in the target (`benchmarks.storefront.compliance`), a write before
  authentication, a read before authentication, a write on an order not looked up, or a write with an id
  never seen voids the action part of the reward. Each planned write is preceded by a confirmation
  question (the policy asks for it); the games do not score it (no capability game trains it).
- **Telling**: replies are judged with the target's rules (`benchmarks.storefront.communication`): a
  value counts only in an honest reply (no pasted tool output, no list of copied values, no amount,
  status or order id outside the instance's legitimate ones).
- **Expected state**: an `Instance` carries the oracle's plan. Its write calls, applied with the same
  tools to a copy of the starting database, give the database the episode must end with; rewards
  compare against that copy rather than re-implementing the tools.
- **Oracle**: `oracle_response()` follows the plan from the current state (ask, authenticate, then the
  current request's first call not yet made successfully, with a confirmation question before a write,
  then its statement), as Hermes markup made by `train.chat_template.render_tool_call` or as plain text.

A game subclasses `StorefrontCapabilityGame` and implements `build_instance(rng)` (all randomness comes
from that `random.Random(seed)`) and `score()` (named reward parts that add up to the reward).
"""
from __future__ import annotations

import dataclasses
import functools
import random
import re
from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from benchmarks.storefront.communication import LegitValues, Replies
from benchmarks.storefront.compliance import just_confirmed, policy_violations
from benchmarks.storefront.db import CITIES, Address, IdFormat, Order, StoreDB, User, random_address
from benchmarks.storefront.policy import POLICY
from benchmarks.storefront.tools import StorefrontTools
from benchmarks.storefront.user_sim import REQUEST_KINDS, Identity, UserRequest, UserSimulator, is_question
from benchmarks.tooling import ToolCallRecord, ToolEnvGame
from game_registry import render_tool_call

TARGET_BENCHMARK = "storefront"
# The target's expert asks exactly this (benchmarks/storefront/env.py); the same words keep the two aligned.
AUTH_QUESTION = "Please give me your email, or your name and zip code."
GREETINGS = ("Hi.", "Hello!", "Hi there.", "")
CONFIRM_SUFFIX = " Shall I proceed?"
# Game request kinds that the customer speaks of as one of the target's kinds.
USER_KIND = {"return_to_gift_card": "return"}


# --------------------------------------------------------------------------------------------------
# Instances
# --------------------------------------------------------------------------------------------------
@dataclass
class PlannedCall:
    """One tool call of the oracle's plan."""

    name: str
    arguments: dict[str, Any]


@dataclass
class PlannedRequest:
    """One thing the customer asked for: the expert's calls (look-ups first) and closing statement."""

    kind: str
    calls: list[PlannedCall]
    statement: str  # closes the request; no question markers (the customer would answer it)
    info: dict[str, Any] = field(default_factory=dict)  # JSON-ready facts used by `score` and the summary
    user: UserRequest | None = None  # what the customer knows and says (default: from kind and info)

    def __post_init__(self) -> None:
        if is_question(self.statement):
            raise ValueError(f"planned statement {self.statement!r} reads as a question to the scripted customer")
        if self.user is None:
            kind = USER_KIND.get(self.kind, self.kind)
            if kind not in REQUEST_KINDS:
                raise ValueError(f"PlannedRequest kind {self.kind!r}: pass user=UserRequest(...) with one of "
                                 f"{', '.join(REQUEST_KINDS)}")
            order_id = self.info.get("order_id", "")
            self.user = UserRequest(kind=kind, order_id=order_id, order_ref=self.info.get("order_ref", order_id))

    @property
    def confirmation(self) -> str:
        """The question the expert asks before this request's write (names the kind and the order id)."""
        user = self.user
        what = {"cancel": "cancel", "modify_order_address": "change the shipping address of",
                "return": "return items of", "exchange": "exchange an item of"}.get(user.kind)
        text = f"I will {what} order {user.order_id}." if what else "I will update your default address."
        return text + CONFIRM_SUFFIX


@dataclass
class Instance:
    """One generated episode."""

    db: StoreDB
    user: User  # the customer (a user of `db`)
    auth: str  # "email" or "name_zip": how the customer identifies themselves
    opening: str  # the customer's first message
    requests: list[PlannedRequest]
    info: dict[str, Any] = field(default_factory=dict)  # JSON-ready difficulty draws for the summary
    identity_reply: str = ""  # what the customer says when asked who they are (default from `auth`)

    def __post_init__(self) -> None:
        if self.auth not in ("email", "name_zip"):
            raise ValueError(f"Instance.auth must be 'email' or 'name_zip', got {self.auth!r}")
        if not self.requests:
            raise ValueError("an instance needs at least one request")

    @property
    def identity(self) -> Identity:
        user = self.user
        return Identity(first_name=user.first_name, last_name=user.last_name, email=user.email,
                        zip=user.address.zip, auth=self.auth)

    @property
    def auth_call(self) -> PlannedCall:
        user = self.user
        if self.auth == "email":
            return PlannedCall("find_user_id_by_email", {"email": user.email})
        return PlannedCall("find_user_id_by_name_zip",
                           {"first_name": user.first_name, "last_name": user.last_name, "zip": user.address.zip})

    def write_calls(self) -> list[PlannedCall]:
        return [c for r in self.requests for c in r.calls if StorefrontTools.is_write(c.name)]


def identity_sentence(user: User, auth: str) -> str:
    """How the customer says who they are (the target customer's first wording)."""
    return Identity(first_name=user.first_name, last_name=user.last_name, email=user.email, zip=user.address.zip,
                    auth=auth).sentences()[0]


def apply_calls(db: StoreDB, calls: list[PlannedCall]) -> StoreDB:
    """A copy of `db` after running the write calls among `calls` with the storefront's tools.

    A planned write that the tools refuse is a bug in the game's generator: the ValueError is re-raised
    naming the call.
    """
    copy = db.clone()
    tools = StorefrontTools(copy)
    for call in calls:
        if StorefrontTools.is_write(call.name):
            try:
                tools.call(call.name, call.arguments)
            except ValueError as err:
                raise ValueError(f"generated instance is inconsistent: planned call {call.name}"
                                 f"({call.arguments}) fails: {err}") from err
    return copy


def opening_message(rng: random.Random, clauses: list[str], identity: str = "") -> str:
    """'<greeting> [identity] I want to <clause 1> Also, please <clause 2> ...' (the target's shape)."""
    parts = [rng.choice(GREETINGS), identity, f"I want to {clauses[0]}", *(f"Also, please {c}" for c in clauses[1:])]
    return " ".join(p for p in parts if p)


# --------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------
def check_int(owner: str, name: str, value: Any, low: int, high: int) -> None:
    """Raise ValueError unless `low <= value <= high` (an int, not a bool), naming the fix."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{owner}.{name} must be an int in {low}..{high}, got {value!r}; "
                         f"pass e.g. {name}={min(max(low, 1), high)}")


def check_fraction(owner: str, name: str, value: Any) -> None:
    """Raise ValueError unless `value` is a number in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{owner}.{name} must be a number in [0, 1], got {value!r}; pass e.g. {name}=0.5")


def check_choices(owner: str, name: str, value: Any, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """`value` as a tuple of distinct names from `allowed` (at least one; a comma-separated string is split)."""
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{owner}.{name} must be a list of names from {list(allowed)}, got {value!r}")
    values = tuple(value)
    bad = [v for v in values if v not in allowed]
    if not values or bad or len(set(values)) != len(values):
        raise ValueError(f"{owner}.{name} must be a non-empty list of distinct names from {list(allowed)}, "
                         f"got {list(values)!r}")
    return values


@dataclass
class StorefrontGameConfig:
    """Episode settings shared by the four games (each game's config adds its difficulty knobs)."""

    max_steps: int = 8  # assistant turns before the episode is cut off
    max_errors: int = 3  # malformed outputs tolerated; one more ends the episode
    identity_in_opening: bool = False  # True: the customer says who they are up front (one turn shorter)
    # True: ids and emails as in configs/storefront/cpu_demo.yaml (3-digit ids, emails like mia9@x.io), so a
    # game trains the skill on the same id format as a CPU-demo target.
    short_ids: bool = False

    def __post_init__(self) -> None:
        owner = type(self).__name__
        check_int(owner, "max_steps", self.max_steps, 1, 64)
        check_int(owner, "max_errors", self.max_errors, 0, 64)
        for name in ("identity_in_opening", "short_ids"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{owner}.{name} must be True or False, got {getattr(self, name)!r}")

    @property
    def ids(self) -> IdFormat:
        """How the game's database makes ids (`short_ids`)."""
        if not self.short_ids:
            return IdFormat()
        return IdFormat(order_digits=3, item_digits=3, product_digits=3, user_digits=3, payment_digits=3,
                        short_emails=True)

    def check_room(self, oracle_turns: int, what: str) -> None:
        """Raise ValueError when `max_steps` leaves the oracle no room for `oracle_turns` turns."""
        if self.max_steps < oracle_turns:
            raise ValueError(f"{type(self).__name__}.max_steps={self.max_steps} is too small: {what} needs "
                             f"{oracle_turns} turns; pass max_steps={oracle_turns} or more")


# --------------------------------------------------------------------------------------------------
# Reply matchers and text helpers
# --------------------------------------------------------------------------------------------------
# A number not glued to a word or to another number's dot: "45.37", "$1,045.37", "-12.5" (not the digits of W1234).
_NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?")
_DIGIT_RUN = re.compile(r"\d+")
_SPELLINGS = {"cancelled": "cancel{1,2}ed"}


def mentions_amount(text: str, amount: float) -> bool:
    """True when `text` contains a number equal to `amount` (or its negative) to the cent."""
    target = abs(amount)
    for match in _NUMBER.finditer(text):
        try:
            value = float(match.group(0).replace(",", ""))
        except ValueError:  # "1,," and the like: not a number after all
            continue
        if abs(abs(value) - target) < 0.005:
            return True
    return False


def mentions_order_id(text: str, order_id: str) -> bool:
    """True when `text` contains the order id's digits as a whole number ('#W' prefix optional)."""
    digits = order_id.removeprefix("#").removeprefix("W")
    # Comparing whole digit runs avoids compiling a pattern per order id (ids are unique, caches would miss).
    return any(run == digits for run in _DIGIT_RUN.findall(text))


@functools.lru_cache(maxsize=256)
def phrase_pattern(phrase: str) -> re.Pattern[str]:
    """The pattern `mentions_phrase` uses: whole words, any case, any spacing ('canceled' = 'cancelled')."""
    words = [_SPELLINGS.get(word, re.escape(word)) for word in phrase.lower().split()]
    return re.compile(r"\b" + r"\s+".join(words) + r"\b", re.IGNORECASE)


def mentions_phrase(text: str, phrase: str) -> bool:
    """True when `text` contains `phrase` as whole words, any case, any spacing ('canceled' = 'cancelled')."""
    return phrase_pattern(phrase).search(text) is not None


def address_text(address: Address) -> str:
    """'12 Oak St, Apt 4, Boston, MA, USA, 02134' (no empty second line), as customers write it."""
    parts = [address.address1, address.address2, address.city, address.state, address.country, address.zip]
    return ", ".join(p for p in parts if p)


def new_address(rng: random.Random, old: Address | None = None, leading_zero_zip: bool = False) -> Address:
    """A random address with a unit line, different from `old`; optionally in a city whose zip starts with 0."""
    while True:
        address = random_address(rng, with_unit=True)
        if leading_zero_zip:
            city, state, prefix = rng.choice([c for c in CITIES if c[2].startswith("0")])
            address = Address(address.address1, address.address2, city, state, "USA",
                              f"{prefix}{rng.randint(0, 99):02d}")
        if old is None or address.to_dict() != old.to_dict():
            return address


def original_payment_method(order: Order) -> str:
    """The payment method id of the order's first 'payment' entry (where the policy sends refunds)."""
    for payment in order.payment_history:
        if payment.transaction_type == "payment":
            return payment.payment_method_id
    raise ValueError(f"order {order.order_id} has no payment entry")


def money(amount: float) -> str:
    """Amounts the way the policy writes them: 123.45 (no sign)."""
    return f"{abs(amount):.2f}"


# --------------------------------------------------------------------------------------------------
# The game base class
# --------------------------------------------------------------------------------------------------
class StorefrontCapabilityGame(ToolEnvGame):
    """A storefront episode built by `build_instance`, scored by `score`, solved by the planned oracle."""

    game_name: ClassVar[str] = ""
    capability: ClassVar[str] = ""
    toolkit_class: ClassVar[type[StorefrontTools]] = StorefrontTools
    # Keep a copy of the generated database for "nothing else changed" checks (a clone costs ~0.1 ms a reset).
    keeps_start_db: ClassVar[bool] = False

    def __init__(self, config: StorefrontGameConfig) -> None:
        super().__init__(max_steps=config.max_steps, max_errors=config.max_errors)
        self.config = config
        # The knobs for summaries, gathered once (dataclasses.asdict per summary is slow); values are
        # immutable (numbers, bools, strings, tuples), so a shallow copy per summary is safe.
        self.config_summary = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
        self.seed: int | None = None
        self.instance: Instance | None = None
        self.customer: UserSimulator | None = None
        self.start_db: StoreDB | None = None  # the database as generated (with `keeps_start_db`)
        self.expected_db: StoreDB | None = None  # the starting database after the oracle's writes

    # ---- for subclasses -------------------------------------------------------------------------
    @abstractmethod
    def build_instance(self, rng: random.Random) -> Instance:
        """Generate one episode from `rng` (the only source of randomness)."""

    @abstractmethod
    def score(self) -> dict[str, float]:
        """Named reward parts (already weighted; penalties negative); the reward is their sum clipped to [0, 1]."""

    def make_opening(self, rng: random.Random, identity: str, clauses: list[str]) -> str:
        """The customer's first message; it says who they are (`identity`) only with `identity_in_opening`."""
        return opening_message(rng, clauses, identity if self.config.identity_in_opening else "")

    # ---- helpers for scoring --------------------------------------------------------------------
    @property
    def db(self) -> StoreDB:
        """The episode's live database."""
        if self.toolkit is None:
            raise RuntimeError(f"{type(self).__name__}: call reset() first")
        return self.toolkit.db

    def successful_calls(self, name: str) -> list[ToolCallRecord]:
        """Calls of tool `name` that ran without error."""
        return [record for record in self.state.tool_calls if record.ok and record.name == name]

    def looked_up_order(self, order_id: str) -> bool:
        """True once get_order_details succeeded on `order_id` (so its status was shown to the agent)."""
        return any(r.arguments.get("order_id") == order_id for r in self.successful_calls("get_order_details"))

    def authenticated(self) -> bool:
        """True once a user look-up returned the customer's user id."""
        user_id, auth_tools = self.instance.user.user_id, StorefrontTools.auth_tools()
        return any(r.ok and r.name in auth_tools and r.output == user_id for r in self.state.tool_calls)

    def policy_violations(self) -> list[str]:
        """The target policy's procedure (authenticate first, look orders up before changing them, use only
        ids that were shown); confirmation is not scored by the capability games."""
        return policy_violations(self.state.messages, self.state.tool_calls, self.instance.user.user_id,
                                 write_tools=StorefrontTools.write_tools(), auth_tools=StorefrontTools.auth_tools(),
                                 require_confirmation=False)

    def legit_values(self) -> LegitValues:
        """What the agent may say: the instance's amounts, the statuses of its requests' orders (before and
        after the expected writes) and the ids of the customer's orders."""
        orders = self.instance.user.orders
        requested = [r.info["order_id"] for r in self.instance.requests if "order_id" in r.info]
        statuses = {db.orders[oid].status for db in (self.instance.db, self.expected_db) for oid in requested}
        amounts = [abs(r.info["amount"]) for r in self.instance.requests if "amount" in r.info]
        return LegitValues(amounts=amounts, statuses=statuses, order_ids=set(orders),
                           known_order_ids=set(self.db.orders))

    def told(self) -> Replies:
        """The replies judged by the target's rules (see the module docstring): ask it what was told, after
        which call (`written(request)`, `call_position(...)`)."""
        tool_outputs = [m["content"] for m in self.state.messages if m["role"] == "tool"]
        return Replies(self.reply_positions(), tool_outputs, self.legit_values())

    def written(self, request: PlannedRequest) -> int | None:
        """Message index of the request's planned write when it succeeded on its target (None if not)."""
        write = next((c for c in request.calls if StorefrontTools.is_write(c.name)), None)
        if write is None:
            return None
        target = {k: write.arguments[k] for k in ("order_id", "user_id") if k in write.arguments}
        return self.call_position(write.name, **target)

    @property
    def current_request(self) -> PlannedRequest | None:
        pointer = self.customer.pointer
        requests = self.instance.requests
        return requests[pointer] if pointer < len(requests) else None

    def failed_call_count(self) -> int:
        return sum(1 for record in self.state.tool_calls if not record.ok)

    def orders_unchanged_except(self, order_ids: set[str]) -> bool:
        """True when every order outside `order_ids` and every product is as generated (needs `keeps_start_db`)."""
        if self.start_db is None:
            raise RuntimeError(f"{type(self).__name__}: set keeps_start_db = True to compare with the start database")
        start, live = self.start_db, self.db
        return (all(live.orders[oid] == order for oid, order in start.orders.items() if oid not in order_ids)
                and live.products == start.products)

    # ---- Game protocol --------------------------------------------------------------------------
    def reset(self, seed: int) -> list[dict[str, Any]]:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"{self.game_name}: seed must be an int, got {seed!r}")
        instance = self.build_instance(random.Random(seed))
        self.seed, self.instance = seed, instance
        self.start_db = instance.db.clone() if self.keeps_start_db else None
        self.expected_db = apply_calls(instance.db, instance.write_calls())
        # Replies the customer gives before leaving: identity, a confirmation and a statement per request, slack.
        self.customer = UserSimulator(instance.identity, [r.user for r in instance.requests],
                                      random.Random(f"{self.game_name}-user:{seed}"),
                                      max_turns=2 * len(instance.requests) + 4, identity_reply=instance.identity_reply,
                                      revealed_identity=self.config.identity_in_opening)
        return self.start_episode(self.toolkit_class(instance.db), [{"role": "user", "content": instance.opening}])

    def get_system_prompt(self) -> str:
        return POLICY

    def respond_to_user(self, text: str) -> tuple[str | None, bool]:
        return self.customer.respond(text)

    def oracle_response(self) -> str:
        """The expert's next message: ask who the customer is, authenticate, then the current request's
        first call not yet made successfully, then its closing statement."""
        if self.instance is None or self.state.done:
            raise RuntimeError(f"{self.game_name}: oracle_response() needs a running episode (reset first)")
        if not self.authenticated():
            if not self.customer.revealed_identity:
                return AUTH_QUESTION
            call = self.instance.auth_call
            return render_tool_call(call.name, call.arguments)
        request = self.current_request
        if request is None:  # every request is closed: the customer has left
            raise RuntimeError(f"{self.game_name}: no request left to handle")
        made = [(r.name, r.arguments) for r in self.state.tool_calls if r.ok]
        for call in request.calls:
            if (call.name, call.arguments) not in made:
                if StorefrontTools.is_write(call.name) and not self._just_confirmed(request.confirmation):
                    return request.confirmation
                return render_tool_call(call.name, call.arguments)
        return request.statement

    def _just_confirmed(self, question: str) -> bool:
        """Whether the agent's last reply was `question` and the customer answered yes."""
        return just_confirmed(self.state.messages, question)

    def get_summary(self) -> dict[str, Any]:
        base = {"game": self.game_name, "capability": self.capability, "seed": self.seed,
                "config": dict(self.config_summary)}
        if self.instance is None:
            return {"reward": 0.0, "steps": 0, "success": False, **base}
        parts = self.score()
        reward = round(min(1.0, max(0.0, sum(parts.values()))), 6)
        return {"reward": reward, "steps": self.state.turns, "success": reward == 1.0, **base,
                "instance": {**self.instance.info, "requests": [{"kind": r.kind, **r.info}
                                                                for r in self.instance.requests]},
                "reward_parts": {name: round(value, 6) for name, value in parts.items()},
                "tool_calls": len(self.state.tool_calls), "failed_tool_calls": self.failed_call_count(),
                "format_errors": self.state.format_errors, "termination_reason": self.state.termination_reason}
