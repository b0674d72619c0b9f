"""What the agent told the customer, checked strictly (shared by the storefront and its capability games).

A value counts as told only when one reply states it and that same reply asserts no other value of the
same kind, and the reply is not raw tool output:

  - amounts: numbers with a decimal point or a '$' ('45.30', '$45.3', '-45.30'; sign ignored). A reply
    listing many numbers, one of them right, tells nothing. Integers without '$' are ids, zips, counts;
  - statuses: the order statuses a reply *asserts*. An occurrence right after "be", "been", "not",
    "only", "no longer", "cannot", "isn't", "wasn't" or "never" is not an assertion ("it cannot be cancelled", "only pending orders
    can ..."), so the expert's "Order #W1 is delivered, so it cannot be cancelled." asserts "delivered"
    alone, while "pending, processed, delivered, ..." asserts all of them;
  - order ids: the digits of a known order id as a whole number ('#W' optional);
  - a raw dump: a reply holding JSON keys (`"status":`), 120+ characters copied verbatim from a tool
    output, or `MAX_COPIED_VALUES` or more distinct values copied from tool outputs (ids, names,
    statuses, prices: a de-JSONed dump) tells nothing at all (pasting observations is not telling).
`Replies` applies this to an episode. Three rules keep a policy without the skill from scoring by spreading
guesses over turns, by asking instead of telling, or by hiding a report where the customer never read it:
  - only a *report* can tell: a reply the customer received (a malformed turn only earned a format
    error) that is no question (`user_sim.is_question`: "Is it delivered?", a confirmation question
    naming the order, "Order #W1 is cancelled. Can you confirm?" all leave the outcome unreported);
  - a report tells a value when it is honest: no dump, and every amount, status and order id it asserts
    is legitimate for what it refers to (the orders it names, else the order of the request the customer
    was on): that order's statuses before and after the expected writes, that request's amount to tell,
    the customer's own order ids;
  - a *wrong assertion* (any delivered reply, question or statement, not a dump, asserting a value that is
    not legitimate for what it refers to) voids the communication credit of every request it refers to and
    of the request the customer was on: a wrong guess costs, so guessing across turns never pays.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable

from benchmarks.storefront.db import ORDER_STATUSES

_AMOUNT = re.compile(r"(?<![\w.])\$?-?\$?\d[\d,]*\.\d+|\$-?\d[\d,]*")
_DIGIT_RUN = re.compile(r"(?<![\d.])\d+(?!\d|\.\d)")  # a whole number, not part of an amount like 123.45
_JSON_KEY = re.compile(r'"[A-Za-z_][\w ]*"\s*:')
_NOT_ASSERTED_AFTER = ("be", "been", "not", "only", "longer", "cannot", "can't", "isn't", "wasn't", "never")
_STATUS_WORDS = {"pending": "pending", "processed": "processed", "delivered": "delivered",
                 "cancelled": "cancel{1,2}ed", "return requested": r"return\s+requested",
                 "exchange requested": r"exchange\s+requested"}
# One pass over the text: the word before a status (to tell assertions from "cannot be cancelled") and the status.
_STATUS = re.compile(r"(?:\b([\w']+)\s+)?\b(" + "|".join(f"(?P<s{i}>{p})" for i, p in enumerate(_STATUS_WORDS.values()))
                     + r")\b", re.IGNORECASE)
_STATUS_NAMES = tuple(_STATUS_WORDS)
_STATUS_STEMS = ("pending", "processed", "deliver", "cancel", "requested")
if set(_STATUS_NAMES) != set(ORDER_STATUSES):
    raise RuntimeError("communication.py must list every order status of db.ORDER_STATUSES")
MAX_COPIED_VALUES = 6  # the expert's longest reply (a return confirmation) copies 4
VERBATIM_CHARS = 120  # a copied run this long from a tool output makes a reply a raw dump (an address is ~45)


def amounts_in(text: str) -> list[float]:
    """Every amount stated in `text` (absolute values)."""
    out = []
    for match in _AMOUNT.finditer(text):
        try:
            out.append(abs(float(match.group(0).replace("$", "").replace(",", ""))))
        except ValueError:  # "1,,.2" and the like: not a number after all
            continue
    return out


def asserted_statuses(text: str) -> set[str]:
    """The order statuses `text` asserts (see the module docstring for what is not an assertion)."""
    lowered = text.lower()
    if not any(stem in lowered for stem in _STATUS_STEMS):
        return set()
    found = set()
    for match in _STATUS.finditer(text):
        if (match.group(1) or "").lower() in _NOT_ASSERTED_AFTER:
            continue
        index = next(i for i in range(len(_STATUS_NAMES)) if match.group(f"s{i}") is not None)
        found.add(_STATUS_NAMES[index])
    return found


def order_ids_in(text: str, known_ids: Iterable[str], ignore: Iterable[str] = ()) -> set[str]:
    """The known order ids whose digits appear in `text` as a whole number (not one of the numbers in `ignore`,
    e.g. the street number and zip of an address the task writes: with 3-digit ids, "360 Cedar Ln" is no
    reference to order #W360)."""
    runs = set(_DIGIT_RUN.findall(text)) - set(ignore)
    return {oid for oid in known_ids if oid.removeprefix("#").removeprefix("W") in runs}


def is_raw_dump(text: str, tool_outputs: Iterable[str]) -> bool:
    """Whether a reply is (or holds) raw tool output: JSON keys, or VERBATIM_CHARS+ characters copied from an output."""
    if _JSON_KEY.search(text):
        return True
    if len(text) < VERBATIM_CHARS:
        return False
    # Windows of VERBATIM_CHARS // 2 characters every VERBATIM_CHARS // 2: a copied run of VERBATIM_CHARS or
    # more characters fully contains at least one of them.
    size = VERBATIM_CHARS // 2
    windows = [text[i:i + size] for i in range(0, len(text) - size + 1, size)]
    outputs = [o for o in tool_outputs if len(o) >= size]
    return any(window in output for window in windows for output in outputs)


def _same_amount(a: float, b: float) -> bool:
    return abs(a - b) < 0.005


def reply_tells_amount(reply: str, amount: float, allowed: Iterable[float] = ()) -> bool:
    """The reply states `amount` and no amount outside {amount} ∪ `allowed`."""
    stated = amounts_in(reply)
    legit = [abs(amount), *(abs(a) for a in allowed)]
    return (any(_same_amount(s, abs(amount)) for s in stated)
            and all(any(_same_amount(s, x) for x in legit) for s in stated))


def reply_tells_status(reply: str, status: str) -> bool:
    """The reply asserts `status` and no other status."""
    return asserted_statuses(reply) == {status}


_STRING_VALUE = re.compile(r'(?<=[:\[,])"((?:[^"\\]|\\.)*)"(?!:)')  # a string after ':' '[' ',' and not a key
_NUMBER_VALUE = re.compile(r'(?<=[:\[,])\s*(-?\d+(?:\.\d+)?)(?=\s*[,\]}])')


def copied_values(tool_outputs: Iterable[str]) -> set[str]:
    """The leaf values of the JSON tool outputs: strings of 3+ characters and numbers (floats as 0.00)."""
    out: set[str] = set()
    for text in tool_outputs:
        if text[:1] not in "{[":
            continue
        out.update(v.strip() for v in _STRING_VALUE.findall(text) if len(v.strip()) >= 3)
        for number in _NUMBER_VALUE.findall(text):
            out.add(f"{float(number):.2f}" if "." in number else number)
    return out


_TOKEN = re.compile(r"[A-Za-z0-9_#@.\-]+")


class _CopiedValues:
    """`values` split for fast counting: one-token values by set intersection, the rest by substring."""

    def __init__(self, values: set[str]) -> None:
        self.single = {v for v in values if _TOKEN.fullmatch(v)}
        self.multi = [v.lower() for v in values if v not in self.single]

    def count(self, text: str) -> int:
        found = {t.rstrip(".") for t in _TOKEN.findall(text)} & self.single
        found |= {f"{a:.2f}" for a in amounts_in(text)} & self.single
        lowered = text.lower()
        return len(found) + sum(1 for v in self.multi if v in lowered)


@dataclass
class LegitValues:
    """What a task may legitimately have the agent say (anything else of these kinds is a wrong assertion).

    `order_statuses` / `order_amounts` give, per order the task's requests are about, its statuses (before
    and after the expected writes) and the amount to tell about it; `order_ids` are the ids the agent may
    name (the customer's orders), `known_order_ids` every order id in the store (to spot wrong ones).
    """

    order_statuses: dict[str, set[str]] = field(default_factory=dict)
    order_amounts: dict[str, list[float]] = field(default_factory=dict)
    order_ids: set[str] = field(default_factory=set)
    known_order_ids: set[str] = field(default_factory=set)
    address_numbers: set[str] = field(default_factory=set)  # numbers of the task's addresses: no order references

    @staticmethod
    def numbers_of(texts: Iterable[str]) -> set[str]:
        """The whole numbers in `texts` (for `address_numbers`)."""
        return {run for text in texts for run in _DIGIT_RUN.findall(text)}


@dataclass(frozen=True)
class Reply:
    """One plain reply the customer received.

    `order_id`: the order of the request the customer was on when they got it ("" when that request is
    about no order, or every request was closed); `question`: it reads as a question (it reports nothing).
    """

    position: int  # index in the message log
    text: str
    order_id: str = ""
    question: bool = False


class Replies:
    """The agent's replies to the customer, judged against the tool outputs it saw and the task's legit values.

    Each `tells_*` takes `after`, the position of the call the reply must report on (the write of a change,
    the look-up of a refused order): a reply sent before it reports nothing. `voided(order_id)` says whether
    a wrong assertion cost that request its communication credit (see the module docstring).
    """

    def __init__(self, replies: list[Reply], tool_outputs: list[str], legit: LegitValues) -> None:
        self.legit = legit
        judged = [(r, self._asserts_only_legit(r)) for r in replies if not is_raw_dump(r.text, tool_outputs)]
        self.wrong = [r for r, legit_only in judged if not legit_only]
        candidates = [r for r, legit_only in judged if legit_only and not r.question]
        copied = _CopiedValues(copied_values(tool_outputs)) if candidates else None
        self.reports = [r for r in candidates if copied.count(r.text) < MAX_COPIED_VALUES]
        self._voided = {order_id for r in self.wrong for order_id in (*self.refers_to(r), r.order_id)}

    def refers_to(self, reply: Reply) -> set[str]:
        """The orders a reply is about: the customer's orders it names, else the order of the request the
        customer was on (an empty set when that request is about no order)."""
        named = order_ids_in(reply.text, self.legit.known_order_ids, self.legit.address_numbers)
        return named or ({reply.order_id} if reply.order_id else set())

    def _asserts_only_legit(self, reply: Reply) -> bool:
        legit, text = self.legit, reply.text
        named = order_ids_in(text, legit.known_order_ids, legit.address_numbers)
        if not named <= legit.order_ids:
            return False
        refers = named or ({reply.order_id} if reply.order_id else set())
        statuses = set().union(*(legit.order_statuses.get(o, set()) for o in refers))
        amounts = [a for o in refers for a in legit.order_amounts.get(o, ())]
        return (asserted_statuses(text) <= statuses
                and all(any(_same_amount(a, x) for x in amounts) for a in amounts_in(text)))

    def voided(self, order_id: str) -> bool:
        """Whether a wrong assertion referred to this request's order (or was sent while the customer was on
        it; "" stands for a request about no order)."""
        return order_id in self._voided

    def _after(self, after: int | None) -> list[str]:
        if after is None:  # the call to report on never happened: nothing can report on it
            return []
        return [r.text for r in self.reports if r.position > after]

    def tells_amount(self, amount: float, after: int | None = -1) -> bool:
        return any(any(_same_amount(a, abs(amount)) for a in amounts_in(r)) for r in self._after(after))

    def tells_status(self, status: str, after: int | None = -1, order_id: str = "") -> bool:
        """A report after `after` asserts `status` (and names `order_id`, when given: with two refused
        orders of the same status, one reply must not count for both)."""
        return any(status in asserted_statuses(r) and (not order_id or order_id in order_ids_in(r, (order_id,)))
                   for r in self._after(after))

    def tells_order_id(self, order_id: str, after: int | None = -1) -> bool:
        return any(order_id in order_ids_in(r, (order_id,)) for r in self._after(after))

    def tells_phrase(self, pattern: re.Pattern[str], after: int | None = -1) -> bool:
        return any(pattern.search(r) for r in self._after(after))
