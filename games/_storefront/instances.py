"""What one storefront game episode is: the oracle's plan (`PlannedCall`, `PlannedRequest`), the episode
(`Instance`), the customer's messages, and a target request turned into a plan (`planned_request`). See
games/_storefront/__init__.py for how the games use them."""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from benchmarks.storefront.db import StoreDB, User
from benchmarks.storefront.tasks import SubRequest
from benchmarks.storefront.tools import StorefrontTools
from benchmarks.storefront.user_sim import REQUEST_KINDS, Identity, UserRequest, is_question

# The target's expert asks exactly this (benchmarks/storefront/env.py); the same words keep the two aligned.
AUTH_QUESTION = "Please give me your email, or your name and zip code."
GREETINGS = ("Hi.", "Hello!", "Hi there.", "")
CONFIRM_SUFFIX = " Shall I proceed?"
# Game request kinds that the customer speaks of as one of the target's kinds.
USER_KIND = {"return_to_gift_card": "return"}


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
