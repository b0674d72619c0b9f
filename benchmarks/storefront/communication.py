"""What the agent told the customer, checked strictly (shared by the storefront and its capability games).

A value counts as told only when one reply states it and that same reply asserts no other value of the
same kind, and the reply is not raw tool output:

  - amounts: numbers with a decimal point or a '$' ('45.30', '$45.3', '-45.30'; sign ignored). A reply
    listing many numbers, one of them right, tells nothing. Integers without '$' are ids, zips, counts;
  - statuses: the order statuses a reply *asserts*. An occurrence right after "be", "been", "not",
    "only", "no longer" or "cannot" is not an assertion ("it cannot be cancelled", "only pending orders
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

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from benchmarks.storefront.db import ORDER_STATUSES

_AMOUNT = re.compile(r"(?<![\w.])\$?-?\$?\d[\d,]*\.\d+|\$-?\d[\d,]*")
_DIGIT_RUN = re.compile(r"\d+")
_JSON_KEY = re.compile(r'"[A-Za-z_][\w ]*"\s*:')
_NOT_ASSERTED_AFTER = ("be", "been", "not", "only", "longer", "cannot", "can't")
_STATUS_SPELLINGS = {"cancelled": r"cancel{1,2}ed"}
_STATUS_PATTERNS = {
    status: re.compile(r"(?:(\b[\w']+)\s+)?\b" + r"\s+".join(_STATUS_SPELLINGS.get(w, re.escape(w)) for w in status.split())
                       + r"\b", re.IGNORECASE)
    for status in ORDER_STATUSES
}
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
    found = set()
    for status, pattern in _STATUS_PATTERNS.items():
        for match in pattern.finditer(text):
            before = (match.group(1) or "").lower()
            if before not in _NOT_ASSERTED_AFTER:
                found.add(status)
                break
    # "return requested" contains no other status word, but "requested" alone is not a status: nothing to undo.
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


def reply_tells_order_id(reply: str, order_id: str, known_ids: Iterable[str], allowed: Iterable[str] = ()) -> bool:
    """The reply names `order_id` and no other known order id outside `allowed`."""
    named = order_ids_in(reply, known_ids)
    return order_id in named and named <= {order_id, *allowed}


def _leaves(value: Any, out: set[str]) -> None:
    if isinstance(value, dict):
        for item in value.values():
            _leaves(item, out)
    elif isinstance(value, list):
        for item in value:
            _leaves(item, out)
    elif isinstance(value, str) and len(value.strip()) >= 3:
        out.add(value.strip())
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out.add(f"{value:.2f}" if isinstance(value, float) else str(value))


def copied_values(tool_outputs: Iterable[str]) -> set[str]:
    """The JSON leaf values (strings of 3+ characters, numbers) of the tool outputs that parse as JSON."""
    out: set[str] = set()
    for text in tool_outputs:
        if text[:1] in "{[":
            try:
                _leaves(json.loads(text), out)
            except json.JSONDecodeError:  # a cut or non-JSON output holds no leaves to count
                continue
    return out


_TOKEN = re.compile(r"[A-Za-z0-9_#@.\-]+")


def count_copied(text: str, values: set[str]) -> int:
    """How many distinct `values` appear in `text` (single-token values as tokens, others as substrings)."""
    tokens = {t.rstrip(".") for t in _TOKEN.findall(text)}
    amounts = {f"{a:.2f}" for a in amounts_in(text)}
    lowered = text.lower()
    count = 0
    for value in values:
        if value in tokens or value in amounts or (" " in value and value.lower() in lowered):
            count += 1
    return count


@dataclass
class LegitValues:
    """What a task may legitimately have the agent say (anything else of these kinds is a wrong assertion)."""

    amounts: list[float] = field(default_factory=list)
    statuses: set[str] = field(default_factory=set)
    order_ids: set[str] = field(default_factory=set)  # ids the agent may name
    known_order_ids: set[str] = field(default_factory=set)  # every order id in the store (to spot wrong ones)


class Replies:
    """The agent's replies to the customer, judged against the tool outputs it saw and the task's legit values."""

    def __init__(self, replies: list[str], tool_outputs: list[str], legit: LegitValues) -> None:
        self.legit = legit
        values = copied_values(tool_outputs)
        self.honest = [r for r in replies if not is_raw_dump(r, tool_outputs)
                       and count_copied(r, values) < MAX_COPIED_VALUES and self._asserts_only_legit(r)]

    def _asserts_only_legit(self, reply: str) -> bool:
        legit = self.legit
        return (all(any(_same_amount(a, x) for x in legit.amounts) for a in amounts_in(reply))
                and asserted_statuses(reply) <= legit.statuses
                and order_ids_in(reply, legit.known_order_ids) <= legit.order_ids)

    def tells_amount(self, amount: float) -> bool:
        return any(any(_same_amount(a, abs(amount)) for a in amounts_in(r)) for r in self.honest)

    def tells_status(self, status: str) -> bool:
        return any(status in asserted_statuses(r) for r in self.honest)

    def tells_order_id(self, order_id: str) -> bool:
        return any(order_id in order_ids_in(r, (order_id,)) for r in self.honest)

    def tells_phrase(self, pattern: re.Pattern[str]) -> bool:
        return any(pattern.search(r) for r in self.honest)
