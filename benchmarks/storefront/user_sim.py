"""A scripted, deterministic storefront customer (no LLM).

The user opens with every request (the task's opening message), then answers each assistant reply by
keyword rules:
  - a question (a '?' or "please give/provide/...") that asks for confirmation gets "yes" when it is
    about the current request (its kind word and its order id), "no" otherwise;
  - a question about email / name / zip reveals what the user knows (email, or name and zip); this
    wins over the confirmation rule ("Could you confirm your email?") unless the user has already
    said who they are and the question is about the current request;
  - questions about the order id, reason, address, refund method or items get the current request's
    value;
  - anything else is a statement: it closes the current request. The user then acknowledges briefly
    without repeating the remaining requests (keeping track of all of them is the agent's job), or,
    after the last one, says goodbye with the stop token `###STOP###`.
The user also stops after `max_turns` replies. Utterances are chosen with the episode's rng, so the
same seed and the same assistant messages always give the same conversation.
"""
from __future__ import annotations

import random

from benchmarks.storefront.tasks import SubRequest, Task, address_text

STOP = "###STOP###"
ACKS = ("Thanks.", "Great, thanks.", "OK, thank you.")
GOODBYES = ("Thanks, that's all.", "Great, that's everything.", "Perfect, thank you.")
QUESTION_MARKERS = ("?", "please provide", "please give", "please tell", "please share", "please send",
                    "could you", "can you", "may i have")
CONFIRM_MARKERS = ("confirm", "shall i", "should i", "do you want", "would you like me", "proceed",
                   "is that correct", "is that right", "ok to ", "okay to ")
AUTH_WORDS = ("email", "zip", "name", "verify", "authenticate", "identity")
KIND_WORDS = {"cancel": ("cancel",), "modify_order_address": ("address",), "return": ("return", "refund"),
              "exchange": ("exchange",), "modify_user_address": ("address",)}


class UserSimulator:
    """The customer of one episode. `respond(text)` -> (message, done)."""

    def __init__(self, task: Task, rng: random.Random, max_turns: int = 8) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.task = task
        self.rng = rng
        self.max_turns = max_turns
        self.pointer = 0  # index of the request being handled
        self.turns = 0  # replies given
        self.revealed_auth = False
        self.stopped = False

    @property
    def current(self) -> SubRequest | None:
        subs = self.task.sub_requests
        return subs[self.pointer] if self.pointer < len(subs) else None

    def respond(self, text: str) -> tuple[str, bool]:
        """Answer one assistant reply."""
        if self.stopped:
            raise RuntimeError("the user has already ended the conversation")
        self.turns += 1
        lowered = text.lower()
        answer = self._answer_question(lowered) if any(m in lowered for m in QUESTION_MARKERS) else None
        if answer is None:  # a statement: the current request is over
            self.pointer += 1
            if self.current is None:
                return self._stop(self.rng.choice(GOODBYES))
            answer = self.rng.choice(ACKS)
        if self.turns >= self.max_turns:
            return self._stop("I have to go now.")
        return answer, False

    def _stop(self, text: str) -> tuple[str, bool]:
        self.stopped = True
        return f"{text} {STOP}", True

    def _answer_question(self, lowered: str) -> str | None:
        sub = self.current
        if sub is None:
            return None
        asks_identity = any(w in lowered for w in AUTH_WORDS)
        if any(m in lowered for m in CONFIRM_MARKERS):
            about = self._about(sub, lowered)
            # "Could you confirm your email?" asks who the user is, not for a go-ahead: identity wins unless
            # the user has already said who they are and the question is about the current request.
            if not asks_identity or (self.revealed_auth and about):
                return "Yes, please." if about else "No, that is not what I asked for."
        if asks_identity:
            self.revealed_auth = True
            user = self.task.user
            if self.task.auth == "email":
                return f"My email is {user.email}."
            return f"I don't remember my email. I'm {user.first_name} {user.last_name}, zip code {user.address.zip}."
        if sub.order_ref and ("order id" in lowered or "order number" in lowered or "which order" in lowered):
            return f"It's {sub.order_ref}."
        if sub.reason_text and ("reason" in lowered or "why" in lowered):
            return sub.reason_text
        if sub.address is not None and "address" in lowered:
            return f"The new address is {address_text(sub.address)}."
        if sub.refund_answer and ("payment" in lowered or "refund" in lowered):
            return sub.refund_answer
        if sub.item_names and ("item" in lowered or "product" in lowered or "which" in lowered):
            return f"The {' and the '.join(sub.item_names)}."
        return None  # a question we have nothing for ("anything else?") counts as a statement

    @staticmethod
    def _about(sub: SubRequest, lowered: str) -> bool:
        """Whether a confirmation question is about this request (kind word, and its order id if any)."""
        if not any(word in lowered for word in KIND_WORDS[sub.kind]):
            return False
        return not sub.order_id or sub.order_id.removeprefix("#W") in lowered  # the id's digits
