"""Reply matchers (does a reply tell this amount, this order id, this phrase) and the text helpers the games
share (addresses, money, the original payment method)."""
from __future__ import annotations

import functools
import random
import re

from benchmarks.storefront.db import CITIES, Address, Order, random_address

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
