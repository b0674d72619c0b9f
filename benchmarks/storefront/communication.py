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
`Replies` applies this to an episode: a reply is *honest* when it is no dump and asserts no value outside
the task's legitimate ones (its amounts, its orders' statuses before and after, its order ids); a value
is told when an honest reply states it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from benchmarks.storefront.db import ORDER_STATUSES

_AMOUNT = re.compile(r"(?<![\w.])\$?-?\$?\d[\d,]*\.\d+|\$-?\d[\d,]*")
_DIGIT_RUN = re.compile(r"\d+")
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


def order_ids_in(text: str, known_ids: Iterable[str]) -> set[str]:
    """The known order ids whose digits appear in `text` as a whole number."""
    runs = set(_DIGIT_RUN.findall(text))
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
    """What a task may legitimately have the agent say (anything else of these kinds is a wrong assertion)."""

    amounts: list[float] = field(default_factory=list)
    statuses: set[str] = field(default_factory=set)
    order_ids: set[str] = field(default_factory=set)  # ids the agent may name
    known_order_ids: set[str] = field(default_factory=set)  # every order id in the store (to spot wrong ones)


class Replies:
    """The agent's replies to the customer, judged against the tool outputs it saw and the task's legit values.

    `replies` are (position, text) pairs, the position being the reply's index in the message log; each
    `tells_*` takes `after`, the position of the call the reply must report on (the write of a change, the
    look-up of a refused order): a question asked before the change ("I will cancel order #W1. Shall I
    proceed?") names the order but reports nothing.
    """

    def __init__(self, replies: list[tuple[int, str]], tool_outputs: list[str], legit: LegitValues) -> None:
        self.legit = legit
        candidates = [(i, r) for i, r in replies if not is_raw_dump(r, tool_outputs) and self._asserts_only_legit(r)]
        copied = _CopiedValues(copied_values(tool_outputs)) if candidates else None
        self.honest = [(i, r) for i, r in candidates if copied.count(r) < MAX_COPIED_VALUES]

    def _asserts_only_legit(self, reply: str) -> bool:
        legit = self.legit
        return (all(any(_same_amount(a, x) for x in legit.amounts) for a in amounts_in(reply))
                and asserted_statuses(reply) <= legit.statuses
                and order_ids_in(reply, legit.known_order_ids) <= legit.order_ids)

    def _after(self, after: int | None) -> list[str]:
        if after is None:  # the call to report on never happened: nothing can report on it
            return []
        return [r for i, r in self.honest if i > after]

    def tells_amount(self, amount: float, after: int | None = -1) -> bool:
        return any(any(_same_amount(a, abs(amount)) for a in amounts_in(r)) for r in self._after(after))

    def tells_status(self, status: str, after: int | None = -1, order_id: str = "") -> bool:
        """An honest reply after `after` asserts `status` (and names `order_id`, when given: with two refused
        orders of the same status, one reply must not count for both)."""
        return any(status in asserted_statuses(r) and (not order_id or order_id in order_ids_in(r, (order_id,)))
                   for r in self._after(after))

    def tells_order_id(self, order_id: str, after: int | None = -1) -> bool:
        return any(order_id in order_ids_in(r, (order_id,)) for r in self._after(after))

    def tells_phrase(self, pattern: re.Pattern[str], after: int | None = -1) -> bool:
        return any(pattern.search(r) for r in self._after(after))
