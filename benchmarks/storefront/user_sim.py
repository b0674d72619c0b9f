"""The scripted storefront customer (no LLM), shared by the storefront benchmark and its capability games.

The customer opens with every request (the opening message is built by the caller), then answers each
assistant reply by keyword rules:
  - a question (a '?' or "please give/provide/...") that asks for confirmation gets a yes only when it
    names the one pending action and its order: the current request's kind word (and no other request
    kind's: "cancel, return or exchange?" offers several actions), its order id's digits, and no other
    order of the customer's (nor any other '#W' id). A question offering several actions or orders gets a
    clarifying answer restating the one thing the customer wants; one about something else gets "no";
  - a question about email / name / zip reveals who they are (email, or name and zip); this wins over
    the confirmation rule ("Could you confirm your email?") unless the customer has already said who they
    are and the question is about the current request;
  - "which order?" / "order id?" gets the id as the customer writes it, or, when they do not know it, a
    description of the order ("the one with the lamp"); for the default address, that it is about no order;
  - questions about the reason, address, refund method or items get the current request's value;
  - anything else is a statement: it closes the current request. The customer then acknowledges briefly
    without repeating the remaining requests (keeping track of them is the agent's job), or, after the
    last one, says goodbye with the stop token `###STOP###`. A customer given `follow_ups` (one message per
    request after the first) opened with the first request only: the acknowledgement then brings up the
    next request in its own words ("Thanks. I also want to cancel order #W1."), so each request arrives the
    way a one-request opening does (the capability games put several decisions in an episode this way).
The customer also stops after `max_turns` replies.

Wording varies with the rng the caller passes (the benchmark seeds it with the task and the trial, so
repeated trials of one task are worded differently); the facts never do. The same rng state and the same
assistant messages always give the same conversation.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from benchmarks.storefront.db import Address

STOP = "###STOP###"
ACKS = ("Thanks.", "Great, thanks.", "OK, thank you.")
GOODBYES = ("Thanks, that's all.", "Great, that's everything.", "Perfect, thank you.")
GIVE_UP = "I have to go now."
YES_REPLIES = ("Yes, please.", "Yes, go ahead.", "Yes.")
NO_REPLY = "No, that is not what I asked for."
QUESTION_MARKERS = ("?", "please provide", "please give", "please tell", "please share", "please send",
                    "could you", "can you", "may i have")
CONFIRM_MARKERS = ("confirm", "shall i", "should i", "do you want me", "would you like me", "proceed",
                   "is that correct", "is that right", "ok to ", "okay to ")
AUTH_WORDS = ("email", "zip", "name", "verify", "authenticate", "identity")
KIND_WORDS = {"cancel": ("cancel",), "modify_order_address": ("address",), "return": ("return", "refund"),
              "exchange": ("exchange",), "modify_user_address": ("address",)}
REQUEST_KINDS = tuple(KIND_WORDS)
# The actions a confirmation question can name: one group of words each (an order's or the default address
# change is the same word).
ACTION_WORD_GROUPS = tuple(dict.fromkeys(KIND_WORDS.values()))
CLARIFY_WHAT = {"cancel": "cancel", "modify_order_address": "change the shipping address of", "return": "return items of",
                "exchange": "exchange an item of", "modify_user_address": "update my default address"}
_WHOLE_NUMBER = re.compile(r"(?<![\d.])\d+(?!\d|\.\d)")
_W_ID = re.compile(r"(?<![a-z0-9_])#?w(\d+)")  # an order id written with its W, in lowered text


def is_question(text: str) -> bool:
    """Whether the customer reads `text` as a question (rather than a statement that closes a request)."""
    lowered = text.lower()
    return any(marker in lowered for marker in QUESTION_MARKERS)


@dataclass
class Identity:
    """Who the customer is and how they identify themselves ("email", or "name_zip" when they forgot it)."""

    first_name: str
    last_name: str
    email: str
    zip: str
    auth: str

    def __post_init__(self) -> None:
        if self.auth not in ("email", "name_zip"):
            raise ValueError(f"Identity.auth must be 'email' or 'name_zip', got {self.auth!r}")

    def sentences(self) -> tuple[str, ...]:
        """The ways the customer says who they are (the order of what they reveal varies)."""
        if self.auth == "email":
            return (f"My email is {self.email}.", f"Sure, my email is {self.email}.", f"It's {self.email}.")
        name = f"{self.first_name} {self.last_name}"
        return (f"I don't remember my email. I'm {name}, zip code {self.zip}.",
                f"I forgot my email. My zip code is {self.zip} and my name is {name}.",
                f"I don't know my email. Name: {name}, zip: {self.zip}.")


@dataclass
class UserRequest:
    """What the customer knows and says about one request."""

    kind: str  # one of REQUEST_KINDS
    order_id: str = ""  # canonical ('#W...'); empty for the default address
    order_ref: str = ""  # how the customer writes the id; empty when they do not know it
    order_hint: str = ""  # how they describe an order whose id they do not know ("the one with the lamp")
    reason_text: str = ""
    address: Address | None = None
    refund_answer: str = ""
    item_names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.kind not in KIND_WORDS:
            raise ValueError(f"UserRequest.kind must be one of {', '.join(KIND_WORDS)}, got {self.kind!r}")


class UserSimulator:
    """The customer of one episode. `respond(text)` -> (message, done). See the module docstring."""

    def __init__(self, identity: Identity, requests: list[UserRequest], rng: random.Random, max_turns: int = 10,
                 identity_reply: str = "", revealed_identity: bool = False, own_order_ids: tuple[str, ...] = (),
                 follow_ups: tuple[str, ...] = ()) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if not requests:
            raise ValueError("the customer needs at least one request")
        if follow_ups and len(follow_ups) != len(requests) - 1:
            raise ValueError(f"follow_ups must hold one message per request after the first ({len(requests) - 1}), "
                             f"got {len(follow_ups)}; pass () when the opening names every request")
        self.follow_ups = tuple(follow_ups)
        self.identity = identity
        self.requests = requests
        self.rng = rng
        self.max_turns = max_turns
        self.identity_reply = identity_reply or rng.choice(identity.sentences())
        self.pointer = 0  # index of the request being handled
        self.turns = 0  # replies given
        self.revealed_identity = revealed_identity
        self.stopped = False
        # The digits of every order the customer has (their requests' and `own_order_ids`): a confirmation
        # question naming another one is about several orders.
        self.order_digits = {oid.removeprefix("#").removeprefix("W")
                             for oid in (*own_order_ids, *(r.order_id for r in requests)) if oid}

    @property
    def current(self) -> UserRequest | None:
        return self.requests[self.pointer] if self.pointer < len(self.requests) else None

    def respond(self, text: str) -> tuple[str, bool]:
        """Answer one assistant reply."""
        if self.stopped:
            raise RuntimeError("the user has already ended the conversation")
        self.turns += 1
        lowered = text.lower()
        answer = self._answer_question(lowered) if is_question(lowered) else None
        if answer is None:  # a statement: the current request is over
            self.pointer += 1
            if self.current is None:
                return self._stop(self.rng.choice(GOODBYES))
            answer = self.rng.choice(ACKS)
            if self.follow_ups:
                answer = f"{answer} {self.follow_ups[self.pointer - 1]}"
        if self.turns >= self.max_turns:
            return self._stop(GIVE_UP)
        return answer, False

    def _stop(self, text: str) -> tuple[str, bool]:
        self.stopped = True
        return f"{text} {STOP}", True

    def _answer_question(self, lowered: str) -> str | None:
        request = self.current
        if request is None:
            return None
        asks_identity = any(w in lowered for w in AUTH_WORDS)
        if any(m in lowered for m in CONFIRM_MARKERS):
            about = self._about(request, lowered)
            # "Could you confirm your email?" asks who the user is, not for a go-ahead: identity wins unless
            # the user has already said who they are and the question is about the current request.
            if not asks_identity or (self.revealed_identity and about):
                if not about:
                    return NO_REPLY
                return self.rng.choice(YES_REPLIES) if self._names_one_action(request, lowered) else self._clarify(request)
        if asks_identity:
            self.revealed_identity = True
            return self.identity_reply
        if "order id" in lowered or "order number" in lowered or "which order" in lowered:
            if not request.order_id:
                return "This one is not about an order: it is my default address."
            if request.order_ref:
                return self.rng.choice((f"It's {request.order_ref}.", f"The order id is {request.order_ref}."))
            return f"I don't remember the order number. It's {request.order_hint}."
        if request.reason_text and ("reason" in lowered or "why" in lowered):
            return request.reason_text
        if request.address is not None and "address" in lowered:
            return f"The new address is {request.address.text()}."
        if request.refund_answer and ("payment" in lowered or "refund" in lowered):
            return request.refund_answer
        if request.item_names and ("item" in lowered or "product" in lowered or "which" in lowered):
            return f"The {' and the '.join(request.item_names)}."
        return None  # a question we have nothing for ("anything else?") counts as a statement

    def _names_one_action(self, request: UserRequest, lowered: str) -> bool:
        """Whether a question about `request` names no other action and no other order (a blanket "shall I
        cancel, return or exchange order X?" offers several things; a yes to it would approve none)."""
        if sum(any(word in lowered for word in group) for group in ACTION_WORD_GROUPS) != 1:
            return False
        own = request.order_id.removeprefix("#W")
        # Whole numbers (not an amount's parts), leaving out those of the request's own address ("360 Cedar Ln"
        # is no reference to order #W360).
        runs = set(_WHOLE_NUMBER.findall(lowered)) - (set(_WHOLE_NUMBER.findall(request.address.text()))
                                                      if request.address else set())
        other_orders = (self.order_digits - {own}) & runs
        other_w_ids = {d for d in _W_ID.findall(lowered) if d != own}
        return not other_orders and not other_w_ids

    def _clarify(self, request: UserRequest) -> str:
        """What the customer says to a question offering several actions or orders: the one thing they want."""
        if not request.order_id:
            return "I only asked you to update my default address."
        words = f"order {request.order_ref}" if request.order_ref else request.order_hint.replace("the one", "my order", 1)
        return f"I only asked you to {CLARIFY_WHAT[request.kind]} {words}."

    @staticmethod
    def _about(request: UserRequest, lowered: str) -> bool:
        """Whether a confirmation question is about this request: its kind word, and its order id's digits
        (for the default address, which has no order, a question about an order is about something else)."""
        if not any(word in lowered for word in KIND_WORDS[request.kind]):
            return False
        if not request.order_id:
            return "order" not in lowered
        return request.order_id.removeprefix("#W") in lowered
