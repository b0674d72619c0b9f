"""Shared machinery of the four storefront capability games in `games/` (not a game itself).

The games train skills for the built-in target benchmark `storefront`, so they keep its conversation
shape and only change what is asked:

- **Tools**: the storefront's full toolkit (`StorefrontTools`), so the tool list the model sees is the
  target's, byte for byte. An agent trained on the target calls tools a game has no use for (it looks the
  user's details up, say); offering only a game's subset turned those habits into unknown-tool errors and
  put a game out of reach of an agent that passes the same request in the target. A write the plan does
  not make changes the database, which every game's action part compares with the expected one.
- **System prompt**: the storefront's written policy (`benchmarks.storefront.policy.POLICY`), unchanged.
- **Conversation**: as in the target, the customer opens with a request but not who they are (unless the
  config sets `identity_in_opening`); the expert asks `AUTH_QUESTION`, looks the user up, and for each
  request makes its look-ups and write, then a statement that closes it. An episode holds one request, as
  the target's do (`requests_per_episode` > 1 brings further ones up one at a time through
  `Instance.follow_ups`: the customer's acknowledgement of a closed request brings the next, "Thanks. I also
  want to ..."); a game whose skill is keeping track of requests (`reveals_all_at_once`) puts them all in the
  opening instead.
- **Decision classes**: a game that declares `DECISION_CLASSES` says which one each request is in
  (`request_class`); the summary carries the episode's (`decision_class`), which skill each ablation would
  have needed on this instance (`skill_matters`: its writes leave another database than the oracle's) and the
  first mistake of an unsuccessful episode (`first_mistake`), for validate_game's class-prior rule and Step 2.
- **Ablations**: each game declares `ABLATIONS` (the expert without its skill, constant policies); a
  request's plan carries the ablated plans (`PlannedRequest.ablated`), `ablated_response(name)` plays
  them, and `ablation_probes` turns them into `GameSpec.ablations`, which validate_game holds to the
  largest decision class's share + pipeline.probes.PRIOR_MARGIN (ABLATION_LIMIT for a game without classes).
- **Customer**: the target's own scripted customer (`benchmarks.storefront.user_sim.UserSimulator`): the
  same question gets the same answer here and in the target ("which order do you mean?" gets the id).
  Its wording is seeded separately from the instance, so the instance stays the same.
- **Policy procedure**: as in the target (`benchmarks.storefront.compliance`), a write before
  authentication, a read before authentication, a write on an order not looked up, or a write with an id
  never seen voids the action part of the reward. Each planned write is preceded by a confirmation
  question (the policy asks for it), and a write without the customer's yes right before it breaks the
  policy, as in the target (unless a surface's policy has no such rule: then the expert does not ask).
- **Telling**: replies are judged with the target's rules (`benchmarks.storefront.communication`): a
  value counts only in an honest reply (no pasted tool output, no list of copied values, no amount,
  status or order id outside the instance's legitimate ones).
- **Expected state**: an `Instance` carries the oracle's plan. Its write calls, applied with the same
  tools to a copy of the starting database, give the database the episode must end with; rewards
  compare against that copy rather than re-implementing the tools.
- **Oracle**: `oracle_response()` follows the plan from the current state (ask, authenticate, then the
  current request's first call not yet made successfully, with a confirmation question before a write,
  then its statement), as Hermes markup made by `train.chat_template.render_tool_call` or as plain text.
- **Surface** (`StorefrontGameConfig.storefront`): the target's `StorefrontConfig`, as a storefront YAML
  (`configs/storefront/cpu_demo.yaml`) or a mapping of its fields (with an optional `file` key naming the
  YAML they override). With it, a game draws its tasks the target's way: the store and customer with
  `benchmarks.storefront.tasks.draw_customer` and each request with the target's own `RequestBuilder`, so
  the openings, id forms (loose and unknown ids, with the order search), reason phrasings, item counts,
  payment-method mix, confirmation questions and plans are the target's; the request kinds are the
  target's kinds where the game's capability applies, at the target's relative weights
  (`surface_kind_weights`). A game's own knob then sets the capability's need on top of that surface. When
  the surface asks for confirmation, a write without the customer's yes right before it breaks the policy
  here too; when it does not, the expert does not ask and the system prompt is the target's policy without
  the rule. The config field holds the resolved surface (every StorefrontConfig field, JSON-ready), so it
  is saved with any result that saves the game's config. Without a surface (None, the default) each game
  keeps its own defaults, described in its module docstring (the game run alone).

A game subclasses `StorefrontCapabilityGame` and implements `_build_alone(rng)` (its own instance) and
`_draw_from_surface(rng)` (one drawn from the target's surface; `build_instance` picks between them, and
all randomness comes from that `random.Random(seed)`) and `score()` (named reward parts that add up to the
reward; `request_done`, `request_reported`, `nothing_else_changed` and `mean_parts` score per request).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
import re
from abc import abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from benchmarks.storefront.communication import LegitValues, Replies, Reply
from benchmarks.storefront.compliance import just_confirmed, policy_violations
from benchmarks.storefront.config import StorefrontConfig, surface_fields
from benchmarks.storefront.db import CITIES, Address, IdFormat, Order, StoreDB, User, random_address
from benchmarks.storefront.policy import POLICY, policy_text
from benchmarks.storefront.tasks import GREETINGS as TARGET_GREETINGS
from benchmarks.storefront.tasks import Customer, SubRequest
from benchmarks.storefront.tools import StorefrontTools
from benchmarks.storefront.user_sim import REQUEST_KINDS, Identity, UserRequest, UserSimulator, is_question
from benchmarks.tool_env_game import ToolCallRecord, ToolEnvGame
from common.paths import REPO_ROOT
from common.io import InputError, load_yaml_mapping
from game_registry import DifficultyKnob, Game, GameSpec, Policy, Probe, render_tool_call

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
    confirm_text: str = ""  # the confirmation question (default: one naming the kind and the order id)
    # The plan of an expert without one skill ({ablation name: plan}; see `ablated_response`): e.g. the
    # request done as asked when its order's status forbids it. A name left out plays this plan.
    ablated: dict[str, PlannedRequest] = field(default_factory=dict)

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
        """The question the expert asks before this request's write (names the kind and the order id); a
        request drawn from the target's surface asks the target expert's own question."""
        if self.confirm_text:
            return self.confirm_text
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
    # What the customer says to bring up each request after the first, once the one before is closed (empty:
    # the opening names every request).
    follow_ups: list[str] = field(default_factory=list)
    # The user look-up of an expert without one skill ({ablation name: call}; default `auth_call`).
    ablated_auth: dict[str, PlannedCall] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.auth not in ("email", "name_zip"):
            raise ValueError(f"Instance.auth must be 'email' or 'name_zip', got {self.auth!r}")
        if not self.requests:
            raise ValueError("an instance needs at least one request")
        if self.follow_ups and len(self.follow_ups) != len(self.requests) - 1:
            raise ValueError(f"Instance.follow_ups needs one message per request after the first "
                             f"({len(self.requests) - 1}), got {len(self.follow_ups)}")

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


def apply_calls(db: StoreDB, calls: list[PlannedCall], strict: bool = True) -> StoreDB:
    """A copy of `db` after running the write calls among `calls` with the storefront's tools.

    `strict`: a planned write that the tools refuse is a bug in the game's generator, and the ValueError is
    re-raised naming the call. Not strict (an ablated plan, `skill_matters`): a refused write changes nothing,
    as in an episode.
    """
    copy = db.clone()
    tools = StorefrontTools(copy)
    for call in calls:
        if StorefrontTools.is_write(call.name):
            try:
                tools.call(call.name, call.arguments)
            except ValueError as err:
                if strict:
                    raise ValueError(f"generated instance is inconsistent: planned call {call.name}"
                                     f"({call.arguments}) fails: {err}") from err
    return copy


def opening_message(rng: random.Random, clauses: list[str], identity: str = "",
                    greetings: tuple[str, ...] = GREETINGS) -> str:
    """'<greeting> [identity] I want to <clause 1> Also, please <clause 2> ...' (the target's shape)."""
    parts = [rng.choice(greetings), identity, f"I want to {clauses[0]}", *(f"Also, please {c}" for c in clauses[1:])]
    return " ".join(p for p in parts if p)


FOLLOW_UP_LEADS = ("I also want to", "One more thing: I want to", "Also, I want to")


def follow_up_message(rng: random.Random, clause: str) -> str:
    """How the customer brings up a further request once the last one is closed: 'I also want to <clause>'
    (the target's opening without its greeting; the customer has said who they are)."""
    return f"{rng.choice(FOLLOW_UP_LEADS)} {clause}"


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


SHORT_IDS = IdFormat(order_digits=3, item_digits=3, product_digits=3, user_digits=3, payment_digits=3,
                     short_emails=True)
MAX_EPISODE_REQUESTS = 4
SURFACE_FILE_KEY = "file"  # in a `storefront` mapping: the storefront YAML its other keys override
ALONE_EMAIL_AUTH_RATE = 0.75  # share of customers who identify by email in a game run alone


@functools.lru_cache(maxsize=16)
def _read_surface_file(path: str, mtime_ns: int) -> tuple[tuple[str, Any], ...]:
    """The YAML mapping at `path` (cached per modification time: a game config is built per episode)."""
    return tuple(load_yaml_mapping(path).items())


def _surface_file_fields(owner: str, value: Any) -> dict[str, Any]:
    """The StorefrontConfig fields in the storefront YAML `value` (relative to the working directory, else
    to the repository root)."""
    if not isinstance(value, (str, os.PathLike)) or not str(value).strip():
        raise ValueError(f"{owner}.storefront: {SURFACE_FILE_KEY} must be a path to a storefront YAML, got {value!r}; "
                         f"e.g. configs/storefront/cpu_demo.yaml")
    path = Path(value)
    if not path.is_absolute() and not path.exists() and (REPO_ROOT / path).exists():
        path = REPO_ROOT / path
    if not path.is_file():
        raise ValueError(f"{owner}.storefront: no storefront YAML at {str(value)!r} (looked in the working directory "
                         f"and in {REPO_ROOT}); pass an existing file, e.g. configs/storefront/cpu_demo.yaml")
    try:
        # Nested values are shared with the cache: StorefrontConfig copies them, nothing here changes them.
        return dict(_read_surface_file(str(path.resolve()), path.stat().st_mtime_ns))
    except InputError as err:
        raise ValueError(f"{owner}.storefront: {err}") from None


def resolve_surface(owner: str, value: Any) -> tuple[dict[str, Any], StorefrontConfig]:
    """(JSON-ready fields, StorefrontConfig) of a `storefront` setting: a YAML path, or a mapping of
    StorefrontConfig fields with an optional `file` key naming the YAML they override. Raises ValueError
    naming the fix."""
    if isinstance(value, dict):
        fields = dict(value)
        file = fields.pop(SURFACE_FILE_KEY, None)
        fields = {**(_surface_file_fields(owner, file) if file is not None else {}), **fields}
    elif isinstance(value, (str, os.PathLike)):
        fields = _surface_file_fields(owner, value)
    else:
        raise ValueError(f"{owner}.storefront must be a path to a storefront YAML or a mapping of StorefrontConfig "
                         f"fields, got {value!r}; e.g. storefront=configs/storefront/cpu_demo.yaml")
    known = {f.name for f in dataclasses.fields(StorefrontConfig)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ValueError(f"{owner}.storefront: {', '.join(map(str, unknown))} not StorefrontConfig fields; fields: "
                         f"{', '.join(sorted(known))} (and {SURFACE_FILE_KEY}: a YAML the others override)")
    try:
        config = StorefrontConfig(**fields)
    except ValueError as err:
        raise ValueError(f"{owner}.storefront: {err}") from None
    return surface_fields(config), config


def surface_kind_weights(owner: str, surface: StorefrontConfig, applicable: tuple[str, ...],
                         chosen: tuple[str, ...] | None, field_name: str) -> dict[str, float]:
    """{kind: weight} a game draws from `surface`: the target's weights of the kinds in `applicable` (where
    the game's capability applies) that the target draws, so the game's mix is the target's renormalised.

    `chosen` (the game's kinds field, when the config sets it) departs from that on purpose: its kinds the
    target draws keep the target's weights and the others get their mean weight (1 when none is drawn).
    A game kind the customer speaks of as a target kind ('return_to_gift_card') takes that kind's weight.
    Raises ValueError when the target draws none of the applicable kinds."""
    def weight(kind: str) -> float:
        return surface.kind_weights.get(USER_KIND.get(kind, kind), 0.0)

    if chosen is None:
        weights = {kind: weight(kind) for kind in applicable if weight(kind) > 0}
        if not weights:
            raise ValueError(f"{owner}: the target storefront draws none of the request kinds this game trains "
                             f"({', '.join(applicable)}; its kind_weights are {surface.kind_weights}); give the "
                             f"storefront a positive weight for one of them, or pass {field_name}=[...] to train "
                             f"kinds the target does not use")
        return weights
    drawn = [weight(kind) for kind in chosen if weight(kind) > 0]
    fill = sum(drawn) / len(drawn) if drawn else 1.0
    return {kind: weight(kind) or fill for kind in chosen}


def draw_kind(rng: random.Random, weights: dict[str, float]) -> str:
    """One request kind at its weight."""
    return rng.choices(tuple(weights), weights=tuple(weights.values()))[0]


@dataclass
class StorefrontGameConfig:
    """Episode settings shared by the four games (each game's config adds its difficulty knobs)."""

    max_steps: int = 8  # assistant turns before the episode is cut off
    max_errors: int = 3  # malformed outputs tolerated; one more ends the episode
    identity_in_opening: bool = False  # True: the customer says who they are up front (one turn shorter)
    # True: ids and emails as in configs/storefront/cpu_demo.yaml (3-digit ids, emails like mia9@x.io), so a
    # game trains the skill on the same id format as a CPU-demo target. With a `storefront` the ids are its
    # own (short_ids=True then checks that they are short).
    short_ids: bool = False
    # The target's surface (see the module docstring): a storefront YAML such as configs/storefront/cpu_demo.yaml,
    # or a mapping of StorefrontConfig fields (optionally with `file`: the YAML they override). Resolved in
    # place to every field, JSON-ready. None: the game's own defaults (the game run alone).
    storefront: str | dict[str, Any] | None = None
    # Requests per episode, each one decision of the game's skill, brought up one at a time: the opening
    # holds the first, the customer's acknowledgement of a closed request brings the next, so each reads as
    # the target's one-request opening. One (the target's shape) by default: a constant policy then wins
    # every episode its constant answer fits, which validate_game's class-prior rule bounds by the largest
    # decision class's share + 0.05 (pipeline/probes.py); more requests stay a knob, never the way honesty is kept.
    requests_per_episode: int = 1

    def __post_init__(self) -> None:
        owner = type(self).__name__
        check_int(owner, "max_steps", self.max_steps, 1, 64)
        check_int(owner, "max_errors", self.max_errors, 0, 64)
        check_int(owner, "requests_per_episode", self.requests_per_episode, 1, MAX_EPISODE_REQUESTS)
        for name in ("identity_in_opening", "short_ids"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{owner}.{name} must be True or False, got {getattr(self, name)!r}")
        # The target's StorefrontConfig (None without a surface); not a field, so summaries show `storefront`.
        self.surface: StorefrontConfig | None = None
        if self.storefront is not None:
            self.storefront, self.surface = resolve_surface(owner, self.storefront)
            if self.short_ids and self.surface.ids != SHORT_IDS:
                raise ValueError(f"{owner}: short_ids=True but the storefront's ids are not short "
                                 f"({self.surface.ids}); drop short_ids (a storefront sets the ids) or give it "
                                 f"3-digit ids and short_emails")

    @property
    def ids(self) -> IdFormat:
        """How the game's database makes ids (the surface's, else `short_ids`)."""
        if self.surface is not None:
            return self.surface.ids
        return SHORT_IDS if self.short_ids else IdFormat()

    def email_share(self, email_auth_rate: float | None) -> float:
        """A game's `email_auth_rate` when set, else the surface's, else ALONE_EMAIL_AUTH_RATE."""
        if email_auth_rate is not None:
            return email_auth_rate
        return ALONE_EMAIL_AUTH_RATE if self.surface is None else self.surface.email_auth_rate

    @property
    def asks_confirmation(self) -> bool:
        """Whether the expert asks before each write, and a write without the customer's yes right before it
        breaks the policy: always, as in the target, unless the surface's policy has no such rule (without a
        surface too: a game that paid writes without a yes would pay a blanket "shall I cancel, return or
        exchange?")."""
        return self.surface is None or self.surface.require_confirmation

    def surface_rates(self, **rates: Any) -> StorefrontConfig:
        """The surface with some of its rates replaced by the game's (its knob sets the capability's need)."""
        if self.surface is None:
            raise RuntimeError(f"{type(self).__name__}: surface_rates() needs a storefront")
        return dataclasses.replace(self.surface, **rates)

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
# Requests drawn from the target's surface
# --------------------------------------------------------------------------------------------------
MAX_DRAWS = 20  # redraws (same stream) of a surface instance whose plan does not fit or reads ambiguously


def planned_request(sub: SubRequest, user_id: str) -> PlannedRequest:
    """A target request (`RequestBuilder.build`) as a game's plan: its calls (order search, look-ups, write),
    statement and confirmation question, and the facts `score` and the summary read (the order, how the
    customer wrote its id, its status, whether it is allowed, the amount to tell, the drawn needs)."""
    info: dict[str, Any] = {"needs": list(sub.needs)}
    if sub.order_id:
        info.update(order_id=sub.order_id, order_ref=sub.user.order_ref, status=sub.status, allowed=sub.allowed)
    else:
        info["user_id"] = user_id
    if sub.tell_amount is not None:
        info["amount"] = sub.tell_amount
    calls = [PlannedCall(step.name, step.arguments) for step in sub.steps if not step.is_confirm]
    confirm = next((step.text for step in sub.steps if step.is_confirm), "")
    return PlannedRequest(sub.kind, calls, sub.statement, info, user=sub.user, confirm_text=confirm)


def oracle_turns(instance: Instance, asks_confirmation: bool, identity_in_opening: bool) -> int:
    """The turns the oracle takes on `instance`: the identity question (unless the opening says who the
    customer is), the user look-up, then per request each call not made before, a confirmation before each
    write when it asks, and the statement."""
    made: set[str] = set()
    turns = 1 if identity_in_opening else 2
    for request in instance.requests:
        for call in request.calls:
            key = json.dumps([call.name, call.arguments], sort_keys=True)
            if key not in made:
                made.add(key)
                turns += 2 if asks_confirmation and StorefrontTools.is_write(call.name) else 1
        turns += 1
    return turns


# --------------------------------------------------------------------------------------------------
# The game base class
# --------------------------------------------------------------------------------------------------
class StorefrontCapabilityGame(ToolEnvGame):
    """A storefront episode built by `build_instance`, scored by `score`, solved by the planned oracle."""

    game_name: ClassVar[str] = ""
    capability: ClassVar[str] = ""
    toolkit_class: ClassVar[type[StorefrontTools]] = StorefrontTools
    # True: the opening names every request (the multi-step game: remembering them is its skill); False: one
    # request at a time (`requests_per_episode`, see StorefrontGameConfig).
    reveals_all_at_once: ClassVar[bool] = False

    def __init__(self, config: StorefrontGameConfig) -> None:
        super().__init__(max_steps=config.max_steps, max_errors=config.max_errors)
        self.config = config
        # The knobs for summaries, gathered once (dataclasses.asdict per summary is slow); values are
        # immutable (numbers, bools, strings, tuples; the resolved `storefront` mapping is never changed), so a
        # shallow copy per summary is safe.
        self.config_summary = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
        self.seed: int | None = None
        self.instance: Instance | None = None
        self.customer: UserSimulator | None = None
        self.start_db: StoreDB | None = None  # the database as generated (for "nothing else changed")
        self.expected_db: StoreDB | None = None  # the starting database after the oracle's writes
        self._replies: list[Reply] = []  # every reply the customer received, with the request it was on
        self._skill_matters: dict[str, bool] = {}

    # ---- for subclasses -------------------------------------------------------------------------
    def build_instance(self, rng: random.Random) -> Instance:
        """Generate one episode from `rng` (the only source of randomness): the game's own instance without a
        surface, else one drawn from the target's surface (drawn again until the oracle's plan fits)."""
        if self.config.surface is None:
            return self._build_alone(rng)
        return self.fitting_instance(rng, self._draw_from_surface)

    @abstractmethod
    def _build_alone(self, rng: random.Random) -> Instance:
        """The game's own instance (no surface)."""

    @abstractmethod
    def _draw_from_surface(self, rng: random.Random) -> Instance | None:
        """An instance of the target's requests (None when its order descriptions read ambiguously)."""

    @abstractmethod
    def score(self) -> dict[str, float]:
        """Named reward parts (already weighted; penalties negative); the reward is their sum clipped to [0, 1]."""

    def make_opening(self, rng: random.Random, identity: str, clauses: list[str]) -> str:
        """The customer's first message; it says who they are (`identity`) only with `identity_in_opening`.
        With a surface it opens with the target customer's greetings."""
        greetings = GREETINGS if self.config.surface is None else TARGET_GREETINGS
        return opening_message(rng, clauses, identity if self.config.identity_in_opening else "", greetings)

    # ---- helpers for drawing from the target's surface ---------------------------------------------
    def make_messages(self, rng: random.Random, identity: str, clauses: list[str]) -> tuple[str, list[str]]:
        """(opening, follow-ups) of an episode whose requests read `clauses`: every clause in the opening when
        the game `reveals_all_at_once`, else the first in the opening and one follow-up per later one."""
        if self.reveals_all_at_once:
            return self.make_opening(rng, identity, clauses), []
        return (self.make_opening(rng, identity, clauses[:1]),
                [follow_up_message(rng, clause) for clause in clauses[1:]])

    def surface_instance(self, rng: random.Random, customer: Customer, subs: list[SubRequest],
                         info: dict[str, Any], clauses: list[str] | None = None,
                         ablated: Callable[[SubRequest, PlannedRequest], dict[str, PlannedRequest]] | None = None,
                         ) -> Instance:
        """An instance of the target's requests `subs` for `customer`: their plans (with the plans
        `ablated(sub, plan)` gives), the target's opening and follow-ups (the requests' own clauses unless
        `clauses` is given) and one of the target customer's identity sentences."""
        user = customer.user
        identity = rng.choice(Identity(first_name=user.first_name, last_name=user.last_name, email=user.email,
                                       zip=user.address.zip, auth=customer.auth).sentences())
        requests = [planned_request(sub, user.user_id) for sub in subs]
        if ablated is not None:
            for sub, request in zip(subs, requests):
                request.ablated = ablated(sub, request)
        opening, follow_ups = self.make_messages(rng, identity, clauses or [sub.clause for sub in subs])
        return Instance(db=customer.db, user=user, auth=customer.auth, opening=opening, requests=requests,
                        info={**info, "zero_zip_auth": customer.zero_zip_auth}, identity_reply=identity,
                        follow_ups=follow_ups)

    def fitting_instance(self, rng: random.Random, draw: Callable[[random.Random], Instance | None]) -> Instance:
        """`draw(rng)` (an Instance, or None when its order descriptions read ambiguously), drawn again from
        the same stream until the oracle's plan fits in `max_steps`: an order search looks up every earlier
        order, and a customer rarely has many. Raises RuntimeError after MAX_DRAWS draws, naming the fix."""
        config = self.config
        for _ in range(MAX_DRAWS):
            instance = draw(rng)
            if instance is not None and oracle_turns(instance, config.asks_confirmation,
                                                     config.identity_in_opening) <= config.max_steps:
                return instance
        raise RuntimeError(f"{self.game_name}: no instance in {MAX_DRAWS} draws fits max_steps={config.max_steps} "
                           f"with an unambiguous opening; raise max_steps")

    # ---- decision classes and ablations (validate_game's class-prior rule) ----------------------------
    # The classes of the decision a request turns on (`GameSpec.decision_classes`); `request_class` says which a
    # request is in. Empty: the game declares none (validate_game then holds its ablations to ABLATION_LIMIT).
    DECISION_CLASSES: ClassVar[tuple[str, ...]] = ()

    def request_class(self, request: PlannedRequest) -> str:
        """The decision class of one planned request (a game that declares DECISION_CLASSES implements it)."""
        raise NotImplementedError(f"{self.game_name}: declares DECISION_CLASSES but no request_class()")

    def decision_class(self) -> str | None:
        """The episode's decision class: its requests' classes joined with '+' (one request: its class); None
        before reset or for a game that declares no classes."""
        if not self.DECISION_CLASSES or self.instance is None:
            return None
        return "+".join(self.request_class(r) for r in self.instance.requests)

    def skill_matters(self) -> dict[str, bool]:
        """{ablation: whether the expert without that skill would leave another database than the oracle, or
        identify the customer with other arguments, on this instance}: where it would not (a one-item order for
        `first_items`, an order paid with the first method for `first_payment_method`, a forbidden order for
        `always_refuse`), the skill decides nothing and the ablation may win; everywhere else it must fail
        (validate_game). Compared by the state the plans' writes leave (a write the tools refuse changes
        nothing), as success is: two plans that differ only in words or in the order of a list are the same."""
        return self._skill_matters  # {} before the first reset

    def _ablations_that_matter(self) -> dict[str, bool]:
        """`skill_matters` computed (in reset, before any write: a plan's user look-up names the live user's
        address)."""
        instance = self.instance
        start, oracle_state = self.start_db, self.expected_db  # as generated, and after the oracle's writes
        auth = (instance.auth_call.name, instance.auth_call.arguments)
        out = {}
        for name in self.ABLATIONS:
            ablated_auth = instance.ablated_auth.get(name, instance.auth_call)
            calls = [c for r in instance.requests for c in r.ablated.get(name, r).calls]
            out[name] = ((ablated_auth.name, ablated_auth.arguments) != auth
                         or apply_calls(start, calls, strict=False) != oracle_state)
        return out

    def first_mistake(self, reward: float | None = None) -> str | None:
        """What went wrong first in an episode that did not succeed (None when it did, or before reset), in
        classes that count across games (Step 2's report of a game this agent cannot win):

          malformed_turn            a turn the parser rejected
          unknown_tool              a call of a tool the storefront does not have
          failed_lookup:<tool>      a read the tools refused (usually a value copied wrong: an id, an email)
          wrong_value:<arguments>   the planned write's tool with other values (e.g. wrong_value:item_ids)
          wrong_tool                a write of another tool than the planned one
          write_where_plan_refuses  a write where the expert changes nothing (e.g. a status ignored)
          ran_out_of_turns / no_action / transferred   a planned call never made (the write, or the look-up
                                    a refusal rests on: cut off, customer left, handed over)
          policy_broken             every planned call made, but the procedure broke (a write without a yes)
          not_reported              the database as expected, the outcome not told honestly
        Extra successful reads are not mistakes. Calls are compared with the oracle's plan, in turn order.
        `reward`: the episode's, when the caller has it (else scored here)."""
        if self.instance is None:
            return None
        if reward is None:
            reward = min(1.0, max(0.0, sum(self.score().values())))
        if reward >= 1.0:
            return None
        instance, state = self.instance, self.state
        plan = [instance.auth_call, *(c for r in instance.requests for c in r.calls)]
        planned = [(c.name, c.arguments) for c in plan]
        planned_writes = [c for c in plan if StorefrontTools.is_write(c.name)]
        events = sorted([(r.turn, 1, r) for r in state.tool_calls] + [(t, 0, None) for t in state.format_error_turns],
                        key=lambda e: (e[0], e[1]))
        names = set(StorefrontTools.tool_names())
        for _, _, record in events:
            if record is None:
                return "malformed_turn"
            if record.name not in names:
                return "unknown_tool"
            if (record.name, record.arguments) in planned:
                continue
            if StorefrontTools.is_write(record.name):
                same = [c for c in planned_writes if c.name == record.name]
                if not planned_writes:
                    return "write_where_plan_refuses"
                if not same:
                    return "wrong_tool"
                args = record.arguments if isinstance(record.arguments, dict) else {}
                differing = sorted(k for k in set(args) | set(same[0].arguments)
                                   if args.get(k) != same[0].arguments.get(k))
                return "wrong_value:" + ",".join(differing)
            if not record.ok:
                return f"failed_lookup:{record.name}"
        made = [(r.name, r.arguments) for r in state.tool_calls if r.ok]
        if any(call not in made for call in planned):
            return {"max_steps": "ran_out_of_turns", "transfer": "transferred",
                    "too_many_errors": "malformed_turn"}.get(state.termination_reason, "no_action")
        if self.policy_violations():
            return "policy_broken"
        return "not_reported"

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
        ids that were shown, and a yes right before each write unless the surface's policy has no such rule)."""
        return policy_violations(self.state.messages, self.state.tool_calls, self.instance.user.user_id,
                                 write_tools=StorefrontTools.write_tools(), auth_tools=StorefrontTools.auth_tools(),
                                 require_confirmation=self.config.asks_confirmation)

    def legit_values(self) -> LegitValues:
        """What the agent may say: the instance's amounts, the statuses of its requests' orders (before and
        after the expected writes) and the ids of the customer's orders."""
        requested = [r for r in self.instance.requests if r.info.get("order_id")]
        return LegitValues(
            order_statuses={r.info["order_id"]: {self._start_statuses[r.info["order_id"]],
                                                 self.expected_db.orders[r.info["order_id"]].status} for r in requested},
            order_amounts={r.info["order_id"]: [abs(r.info["amount"])] for r in requested if "amount" in r.info},
            order_ids=set(self.instance.user.orders), known_order_ids=set(self.db.orders),
            address_numbers=LegitValues.numbers_of(r.user.address.text() for r in self.instance.requests
                                                   if r.user.address))

    def told(self) -> Replies:
        """The replies judged by the target's rules (see the module docstring): ask it what was told, after
        which call (`written(request)`, `call_position(...)`)."""
        tool_outputs = [m["content"] for m in self.state.messages if m["role"] == "tool"]
        return Replies(self._replies, tool_outputs, self.legit_values())

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
        """True when every order outside `order_ids` and every product is as generated."""
        start, live = self.start_db, self.db
        return (all(live.orders[oid] == order for oid, order in start.orders.items() if oid not in order_ids)
                and live.products == start.products)

    def nothing_else_changed(self) -> bool:
        """True when nothing outside the requests' targets changed: no other order, product or user, and the
        customer's address only when a request changes it (their gift-card balances move with refunds, which
        each request's order records)."""
        requests = self.instance.requests
        customer_id = self.instance.user.user_id
        if not self.orders_unchanged_except({r.info["order_id"] for r in requests if "order_id" in r.info}):
            return False
        for user_id, start_user in self.start_db.users.items():
            live_user = self.db.users[user_id]
            if user_id != customer_id:
                if live_user != start_user:
                    return False
            elif live_user.address != start_user.address and not any(r.kind == "modify_user_address"
                                                                      for r in requests):
                return False
        return True

    def request_done(self, request: PlannedRequest) -> bool:
        """Whether the request's target is in its expected state: its order equals the expected order (unchanged
        when refusing is right); for the default address, the customer's address equals the expected one."""
        if "order_id" not in request.info:
            user_id = request.info["user_id"]
            return self.db.users[user_id].address == self.expected_db.users[user_id].address
        order_id = request.info["order_id"]
        return self.db.orders[order_id] == self.expected_db.orders[order_id]

    def request_reported(self, request: PlannedRequest, replies: Replies) -> bool:
        """Whether an honest reply after the request's write reported its outcome (the order id of a cancel or
        address change, the amount of a return or exchange, the words "default address"), and no reply
        asserted a wrong value about it."""
        if replies.voided(request.info.get("order_id", "")):
            return False
        after = self.written(request)
        if request.kind == "modify_user_address":
            return replies.tells_phrase(phrase_pattern("default address"), after=after)
        if "amount" in request.info:  # a return or exchange
            return replies.tells_amount(request.info["amount"], after=after)
        return replies.tells_order_id(request.info["order_id"], after=after)

    @staticmethod
    def mean_parts(per_request: list[dict[str, float]]) -> dict[str, float]:
        """Each named part averaged over the requests (each request carries the same weights)."""
        return {name: sum(parts[name] for parts in per_request) / len(per_request) for name in per_request[0]}

    # ---- Game protocol --------------------------------------------------------------------------
    def reset(self, seed: int) -> list[dict[str, Any]]:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"{self.game_name}: seed must be an int, got {seed!r}")
        instance = self.build_instance(random.Random(seed))
        self.seed, self.instance = seed, instance
        self.start_db = instance.db.clone()  # ~0.1 ms: for "nothing else changed"
        self.expected_db = apply_calls(instance.db, instance.write_calls())
        # Replies the customer gives before leaving: identity, a confirmation and a statement per request, slack.
        self.customer = UserSimulator(instance.identity, [r.user for r in instance.requests],
                                      random.Random(f"{self.game_name}-user:{seed}"),
                                      max_turns=2 * len(instance.requests) + 4, identity_reply=instance.identity_reply,
                                      revealed_identity=self.config.identity_in_opening,
                                      own_order_ids=tuple(instance.user.orders), follow_ups=tuple(instance.follow_ups))
        self._replies = []
        self._skill_matters = self._ablations_that_matter()
        # The orders' statuses as generated (the live database is the instance's: a write changes it).
        self._start_statuses = {oid: order.status for oid, order in instance.db.orders.items()}
        return self.start_episode(self.toolkit_class(instance.db), [{"role": "user", "content": instance.opening}])

    def get_system_prompt(self) -> str:
        """The target's policy (without the confirmation rule when the surface's policy has none)."""
        return POLICY if self.config.asks_confirmation else policy_text(require_confirmation=False)

    def respond_to_user(self, text: str) -> tuple[str | None, bool]:
        current = self.current_request
        answer = self.customer.respond(text)
        self._replies.append(Reply(len(self.state.messages) - 1, text, current.info.get("order_id", "") if current else "",
                                   is_question(text)))
        return answer

    def oracle_response(self) -> str:
        """The expert's next message: ask who the customer is, authenticate, then the current request's
        first call not yet made successfully, then its closing statement."""
        return self._plan_response(None)

    def ablated_response(self, ablation: str) -> str:
        """The next message of the expert without one skill: the oracle, following each request's
        `ablated[ablation]` plan where it has one (the ablations a game declares are its `ABLATIONS`)."""
        if ablation not in self.ABLATIONS:
            raise ValueError(f"{self.game_name}: unknown ablation {ablation!r}; this game declares "
                             f"{', '.join(self.ABLATIONS) or 'none'}")
        return self._plan_response(ablation)

    # {ablation name: what the expert lacks}; each game declares its own (validate_game holds them to a limit).
    ABLATIONS: ClassVar[dict[str, str]] = {}

    def _plan_response(self, ablation: str | None) -> str:
        if self.instance is None or self.state.done:
            raise RuntimeError(f"{self.game_name}: oracle_response() needs a running episode (reset first)")
        if not self.authenticated():
            if not self.customer.revealed_identity:
                return AUTH_QUESTION
            call = self.instance.ablated_auth.get(ablation, self.instance.auth_call)
            return render_tool_call(call.name, call.arguments)
        request = self.current_request
        if request is None:  # every request is closed: the customer has left
            raise RuntimeError(f"{self.game_name}: no request left to handle")
        if ablation is not None:
            request = request.ablated.get(ablation, request)
        made = [(r.name, r.arguments) for r in self.state.tool_calls if r.ok]
        for call in request.calls:
            if (call.name, call.arguments) not in made:
                if (StorefrontTools.is_write(call.name) and self.config.asks_confirmation
                        and not self._just_confirmed(request.confirmation)):
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
                "decision_class": self.decision_class(), "skill_matters": self.skill_matters(),
                "first_mistake": self.first_mistake(reward),
                "tool_calls": len(self.state.tool_calls), "failed_tool_calls": self.failed_call_count(),
                "format_errors": self.state.format_errors, "termination_reason": self.state.termination_reason}


def ablation_probes(ablations: dict[str, str]) -> tuple[Probe, ...]:
    """A probe per ablation a game declares ({name: what the expert lacks}): the policy plays
    `game.ablated_response(name)` (register them as `GameSpec.ablations`; validate_game holds each to
    pipeline.probes.ABLATION_LIMIT)."""
    def make_policy(name: str) -> Callable[[list[str]], Policy]:
        def policy_for_seed(oracle_texts: list[str]) -> Policy:
            def policy(turn: int, game: Game, rng: Any) -> str:
                return game.ablated_response(name)
            return policy
        return policy_for_seed

    return tuple(Probe(name=name, description=f"the expert that {lacks}", make_policy=make_policy(name))
                 for name, lacks in ablations.items())


# As the target: the longest expert turn (an address change) is ~110 tokens.
MAX_GEN_TOKENS = 160


def storefront_game_spec(game_class: type, config_class: type, capability: str, *, hint: str, max_turns: int,
                         difficulty_knobs: tuple[DifficultyKnob, ...], probes: tuple[Probe, ...] = ()) -> GameSpec:
    """The GameSpec of a storefront capability game (what every game file registers): named
    `capability_<capability>`, the storefront's written policy as its system prompt (a game may still write
    its own per config: `policy`), no base prompt, `hint` as the hint prompt, the target's turn length, the
    ablations and decision classes the game class declares (`ABLATIONS`, `DECISION_CLASSES`)."""
    return GameSpec(
        name=f"capability_{capability}",
        make_env=game_class,  # game_class(config), config None for the defaults
        system_prompt=POLICY,
        base_prompt="",
        hint_prompt=hint,
        max_gen_tokens=MAX_GEN_TOKENS,
        max_turns=max_turns,
        capability=capability,
        config_cls=config_class,
        target=TARGET_BENCHMARK,
        difficulty_knobs=difficulty_knobs,
        probes=probes,
        ablations=ablation_probes(game_class.ABLATIONS),
        decision_classes=game_class.DECISION_CLASSES,
    )
