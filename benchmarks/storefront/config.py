"""StorefrontConfig: the task mix, id lengths and episode limits of the storefront benchmark.

Every task is a customer with one to three requests. Each request draws its kind and, independently,
the needs that make it hard (a forbidden order status, a refund that must go where payment_history says,
an id written without '#', an order whose id the customer does not know, ...), so a deficit in one skill
lowers the pass rate of many request kinds and every kind depends on several skills, as in τ²-bench.
The defaults are meant to be realistic; the CPU demo shrinks ids and requests to fit a 2M-parameter model.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from benchmarks.storefront.db import IdFormat
from benchmarks.storefront.user_sim import REQUEST_KINDS
from common.validation import InputError

RATE_FIELDS = ("forbidden_rate", "unknown_order_id_rate", "loose_order_id_rate", "paraphrase_rate",
               "leading_zero_zip_rate", "two_items_rate", "gift_card_refund_rate", "other_payment_method_rate",
               "email_auth_rate")
DEFAULT_KIND_WEIGHTS = {"cancel": 0.3, "modify_order_address": 0.2, "return": 0.25, "exchange": 0.1,
                        "modify_user_address": 0.15}


def _parse_weights(value: Any, owner: str) -> dict[str, float]:
    """{kind: weight} from a dict or 'cancel=0.3,return=0.2' (a CLI / YAML override)."""
    if isinstance(value, str):
        pairs = [p.split("=", 1) for p in value.split(",") if p.strip()]
        if any(len(p) != 2 for p in pairs):
            raise InputError(f"{owner}.kind_weights: write KIND=WEIGHT pairs separated by commas, got {value!r}")
        try:
            value = {k.strip(): float(v) for k, v in pairs}
        except ValueError:
            raise InputError(f"{owner}.kind_weights: weights must be numbers, got {value!r}") from None
    if not isinstance(value, dict) or not value:
        raise InputError(f"{owner}.kind_weights must be a non-empty {{kind: weight}} mapping, got {value!r}")
    unknown = [k for k in value if k not in REQUEST_KINDS]
    bad = [k for k, w in value.items() if isinstance(w, bool) or not isinstance(w, (int, float))
           or not math.isfinite(w) or w < 0]
    if unknown or bad or not sum(value.values()) > 0:
        raise InputError(f"{owner}.kind_weights: kinds must come from {', '.join(REQUEST_KINDS)} with finite weights "
                         f">= 0 and a positive sum; got {value!r}")
    return {k: float(w) for k, w in value.items()}


@dataclass
class StorefrontConfig:
    """Knobs of the storefront benchmark (all episodes of one game object share them)."""

    # How many requests a customer has: probabilities of 1, 2, 3 requests.
    request_counts: tuple[float, ...] = (0.45, 0.35, 0.20)
    kind_weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_KIND_WEIGHTS))
    # Needs, each drawn independently per request (or per customer) where it can apply:
    forbidden_rate: float = 0.3  # the order's status forbids the request (the agent must refuse and say why)
    unknown_order_id_rate: float = 0.15  # the customer does not know the order id (search their orders)
    loose_order_id_rate: float = 0.3  # the customer writes the id without '#' (or without '#W')
    paraphrase_rate: float = 0.4  # a cancel reason in other words than the tool's enum
    leading_zero_zip_rate: float = 0.3  # a new address (or the customer's, with name+zip) has a zip like 02134
    two_items_rate: float = 0.3  # a return names two items
    gift_card_refund_rate: float = 0.25  # the refund goes to the customer's gift card (found in their details)
    other_payment_method_rate: float = 0.75  # the order was paid with another method than the customer's first
    email_auth_rate: float = 0.6  # the customer identifies by email (else by name and zip)
    require_confirmation: bool = True  # the policy asks for an explicit yes before any change
    # Size of the store and ids.
    n_users: int = 3
    n_products: int = 6
    order_id_digits: int = 7
    item_id_digits: int = 6
    product_id_digits: int = 4
    user_id_digits: int = 4
    payment_id_digits: int = 7
    short_emails: bool = False
    # Episode limits.
    max_steps: int = 30  # assistant turns (three requests with a search need ~25)
    max_errors: int = 3  # format errors tolerated (one more ends the episode)
    max_user_turns: int = 16  # customer replies before they give up

    def __post_init__(self) -> None:
        owner = type(self).__name__
        counts = self.request_counts
        if isinstance(counts, str):
            try:
                counts = tuple(float(x) for x in counts.split(",") if x.strip())
            except ValueError:
                raise InputError(f"{owner}.request_counts must be comma-separated numbers (weights of 1, 2, 3 "
                                 f"requests), got {self.request_counts!r}; e.g. request_counts=0.5,0.3,0.2") from None
        counts = tuple(counts)
        if (not 1 <= len(counts) <= 3 or any(isinstance(c, bool) or not isinstance(c, (int, float))
                                               or not math.isfinite(c) or c < 0 for c in counts) or sum(counts) <= 0):
            raise InputError(f"{owner}.request_counts must be 1-3 finite weights >= 0 (for 1, 2, 3 requests) with a "
                             f"positive sum, got {self.request_counts!r}; e.g. request_counts=(0.5, 0.3, 0.2)")
        self.request_counts = tuple(float(c) for c in counts)
        self.kind_weights = _parse_weights(self.kind_weights, owner)
        for name in RATE_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise InputError(f"{owner}.{name} must be a number in [0, 1], got {value!r}; e.g. {name}=0.3")
        for name in ("require_confirmation", "short_emails"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"{owner}.{name} must be True or False, got {getattr(self, name)!r}")
        for name in ("max_steps", "max_user_turns"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"{owner}.{name} must be a positive int, got {value!r}")
        if not isinstance(self.n_users, int) or isinstance(self.n_users, bool) or not 1 <= self.n_users <= 100:
            raise InputError(f"{owner}.n_users must be an int in 1..100, got {self.n_users!r}; e.g. n_users=3")
        for name in ("order_id_digits", "item_id_digits", "product_id_digits", "user_id_digits", "payment_id_digits"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 3 <= value <= 9:
                raise InputError(f"{owner}.{name} must be an int in 3..9 (3 digits leave 900 ids), got {value!r}; "
                                 f"e.g. {name}=3 for the CPU demo")
        if not isinstance(self.max_errors, int) or isinstance(self.max_errors, bool) or self.max_errors < 0:
            raise InputError(f"{owner}.max_errors must be an int >= 0, got {self.max_errors!r}")
        if not isinstance(self.n_products, int) or not 3 <= self.n_products <= 12:
            raise InputError(f"{owner}.n_products must be in 3..12 (the catalog), got {self.n_products!r}")

    @property
    def ids(self) -> IdFormat:
        return IdFormat(order_digits=self.order_id_digits, item_digits=self.item_id_digits,
                        product_digits=self.product_id_digits, user_digits=self.user_id_digits,
                        payment_digits=self.payment_id_digits, short_emails=self.short_emails)


def surface_fields(config: StorefrontConfig) -> dict[str, Any]:
    """Every field of `config`, JSON-ready (lists, not tuples): how a surface is passed to a game and saved
    with its results, so a saved and reloaded surface compares equal to the one a game holds."""
    return json.loads(json.dumps(dataclasses.asdict(config)))
