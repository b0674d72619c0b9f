"""The storefront database: users, products with variants, orders; seeded generation and hashing.

Shapes follow τ²-bench's retail domain (compactly): a user has an address, payment methods (credit
card, gift card with a balance, PayPal) and order ids; a product has variants (item ids with options,
price, availability); an order has items, a shipping address, a status and a payment history.

Every dataclass has `to_dict()` (the form the hash covers; empty optional fields are left out) and
`from_dict()`; users and orders also have `view()`, the shorter form tools show (address on one line). `StoreDB.clone()` is an explicit deep copy
(much faster than `copy.deepcopy` on dataclasses, and resets happen thousands of times per second).
Amounts are floats rounded to cents; generation avoids totals whose cents end in 0 so that JSON's
shortest form (45.37) is also the policy's two-decimal form.
"""
from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import random
from dataclasses import dataclass, field
from typing import Any, Sequence, TypeVar

from common.validation import InputError

T = TypeVar("T")

ORDER_STATUSES = ("pending", "processed", "delivered", "cancelled", "return requested", "exchange requested")
PAYMENT_SOURCES = ("credit_card", "gift_card", "paypal")


@dataclass
class Address:
    address1: str
    address2: str
    city: str
    state: str
    country: str
    zip: str

    def to_dict(self) -> dict[str, str]:
        return {"address1": self.address1, "address2": self.address2, "city": self.city, "state": self.state,
                "country": self.country, "zip": self.zip}

    def text(self) -> str:
        """One line, as tools show it and users write it: '12 Oak St, Apt 4, Boston, MA, USA, 02134'."""
        parts = (self.address1, self.address2, self.city, self.state, self.country, self.zip)
        return ", ".join(p for p in parts if p)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Address:
        return cls(**d)

    def clone(self) -> Address:
        return Address(self.address1, self.address2, self.city, self.state, self.country, self.zip)


@dataclass
class PaymentMethod:
    """`id` looks like `credit_card_4821937`; `last_four` for cards, `balance` for gift cards."""

    id: str
    source: str
    last_four: str = ""
    balance: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "source": self.source}
        if self.last_four:
            out["last_four"] = self.last_four
        if self.balance is not None:
            out["balance"] = self.balance
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PaymentMethod:
        return cls(id=d["id"], source=d["source"], last_four=d.get("last_four", ""), balance=d.get("balance"))

    def clone(self) -> PaymentMethod:
        return PaymentMethod(self.id, self.source, self.last_four, self.balance)


@dataclass
class User:
    user_id: str
    first_name: str
    last_name: str
    email: str
    address: Address
    payment_methods: list[PaymentMethod]
    orders: list[str]  # order ids, oldest first

    def to_dict(self) -> dict[str, Any]:
        return {"user_id": self.user_id, "name": f"{self.first_name} {self.last_name}", "email": self.email,
                "address": self.address.to_dict(), "payment_methods": [p.to_dict() for p in self.payment_methods],
                "orders": list(self.orders)}

    def view(self) -> dict[str, Any]:
        """What `get_user_details` shows: `to_dict()` with the address on one line (shorter)."""
        return {**self.to_dict(), "address": self.address.text()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> User:
        first, last = d["name"].split(" ", 1)
        return cls(user_id=d["user_id"], first_name=first, last_name=last, email=d["email"],
                   address=Address.from_dict(d["address"]),
                   payment_methods=[PaymentMethod.from_dict(p) for p in d["payment_methods"]],
                   orders=list(d["orders"]))

    def clone(self) -> User:
        return User(self.user_id, self.first_name, self.last_name, self.email, self.address.clone(),
                    [p.clone() for p in self.payment_methods], list(self.orders))

    def payment_method(self, payment_method_id: str) -> PaymentMethod | None:
        for method in self.payment_methods:
            if method.id == payment_method_id:
                return method
        return None


@dataclass
class Variant:
    item_id: str
    options: dict[str, str]
    price: float
    available: bool

    def to_dict(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "options": dict(self.options), "price": self.price,
                "available": self.available}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Variant:
        return cls(item_id=d["item_id"], options=dict(d["options"]), price=d["price"], available=d["available"])

    def clone(self) -> Variant:
        return Variant(self.item_id, dict(self.options), self.price, self.available)


@dataclass
class Product:
    product_id: str
    name: str
    variants: list[Variant]

    def to_dict(self) -> dict[str, Any]:
        return {"product_id": self.product_id, "name": self.name, "variants": [v.to_dict() for v in self.variants]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Product:
        return cls(product_id=d["product_id"], name=d["name"], variants=[Variant.from_dict(v) for v in d["variants"]])

    def clone(self) -> Product:
        return Product(self.product_id, self.name, [v.clone() for v in self.variants])

    def variant(self, item_id: str) -> Variant | None:
        for variant in self.variants:
            if variant.item_id == item_id:
                return variant
        return None


@dataclass
class OrderItem:
    item_id: str
    product_id: str
    name: str  # the product's name
    options: dict[str, str]
    price: float

    def to_dict(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "product_id": self.product_id, "name": self.name,
                "options": dict(self.options), "price": self.price}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OrderItem:
        return cls(item_id=d["item_id"], product_id=d["product_id"], name=d["name"], options=dict(d["options"]),
                   price=d["price"])

    def clone(self) -> OrderItem:
        return OrderItem(self.item_id, self.product_id, self.name, dict(self.options), self.price)


@dataclass
class Payment:
    payment_method_id: str
    amount: float
    transaction_type: str  # "payment" | "refund"

    def to_dict(self) -> dict[str, Any]:
        return {"payment_method_id": self.payment_method_id, "amount": self.amount,
                "transaction_type": self.transaction_type}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Payment:
        return cls(**d)

    def clone(self) -> Payment:
        return Payment(self.payment_method_id, self.amount, self.transaction_type)


@dataclass
class Order:
    """`order_id` looks like `#W4821937`. The optional fields record requested cancels/returns/exchanges."""

    order_id: str
    user_id: str
    status: str
    items: list[OrderItem]
    address: Address
    payment_history: list[Payment]
    cancel_reason: str = ""
    return_items: list[str] = field(default_factory=list)
    return_payment_method_id: str = ""
    exchange_items: list[str] = field(default_factory=list)
    exchange_new_items: list[str] = field(default_factory=list)
    exchange_payment_method_id: str = ""
    exchange_price_difference: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "order_id": self.order_id, "user_id": self.user_id, "status": self.status,
            "items": [i.to_dict() for i in self.items], "address": self.address.to_dict(),
            "payment_history": [p.to_dict() for p in self.payment_history],
        }
        for key in ("cancel_reason", "return_items", "return_payment_method_id", "exchange_items",
                    "exchange_new_items", "exchange_payment_method_id"):
            value = getattr(self, key)
            if value:
                out[key] = list(value) if isinstance(value, list) else value
        if self.exchange_price_difference is not None:
            out["exchange_price_difference"] = self.exchange_price_difference
        return out

    def view(self) -> dict[str, Any]:
        """What `get_order_details` shows: `to_dict()` with the address on one line (shorter), without the
        stored price difference of an exchange (a computed answer: the agent works it out from prices)."""
        out = {**self.to_dict(), "address": self.address.text()}
        out.pop("exchange_price_difference", None)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Order:
        return cls(order_id=d["order_id"], user_id=d["user_id"], status=d["status"],
                   items=[OrderItem.from_dict(i) for i in d["items"]], address=Address.from_dict(d["address"]),
                   payment_history=[Payment.from_dict(p) for p in d["payment_history"]],
                   cancel_reason=d.get("cancel_reason", ""), return_items=list(d.get("return_items", [])),
                   return_payment_method_id=d.get("return_payment_method_id", ""),
                   exchange_items=list(d.get("exchange_items", [])),
                   exchange_new_items=list(d.get("exchange_new_items", [])),
                   exchange_payment_method_id=d.get("exchange_payment_method_id", ""),
                   exchange_price_difference=d.get("exchange_price_difference"))

    def clone(self) -> Order:
        return Order(self.order_id, self.user_id, self.status, [i.clone() for i in self.items], self.address.clone(),
                     [p.clone() for p in self.payment_history], self.cancel_reason, list(self.return_items),
                     self.return_payment_method_id, list(self.exchange_items), list(self.exchange_new_items),
                     self.exchange_payment_method_id, self.exchange_price_difference)

    @property
    def total(self) -> float:
        return round(sum(i.price for i in self.items), 2)


@dataclass(frozen=True)
class IdFormat:
    """How long generated ids are (digits after the prefix) and how emails look.

    The defaults are τ²-bench-like; the CPU demo shortens them, since a 2M-parameter model copies each
    digit as one token (`../shared/design/CPU-DEMO-SIZING.md`: shorter ids made copying 3-4x easier).
    """

    order_digits: int = 7  # '#W' + digits
    item_digits: int = 6
    product_digits: int = 4
    user_digits: int = 4  # 'first_last_' + digits
    payment_digits: int = 7  # 'credit_card_' + digits
    short_emails: bool = False  # 'mia9@x.io' instead of 'mia.chen12@example.com'

    def __post_init__(self) -> None:
        for name in ("order_digits", "item_digits", "product_digits", "user_digits", "payment_digits"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 3 <= value <= 9:
                raise InputError(f"IdFormat.{name} must be an int in 3..9 (3 digits leave 900 ids), got {value!r}")
        if not isinstance(self.short_emails, bool):
            raise InputError(f"IdFormat.short_emails must be True or False, got {self.short_emails!r}")


@dataclass
class StoreDB:
    users: dict[str, User]  # by user_id
    products: dict[str, Product]  # by product_id
    orders: dict[str, Order]  # by order_id
    ids: IdFormat = field(default_factory=IdFormat)  # how new ids are made (not part of the hash)

    def to_dict(self) -> dict[str, Any]:
        return {"users": {k: v.to_dict() for k, v in self.users.items()},
                "products": {k: v.to_dict() for k, v in self.products.items()},
                "orders": {k: v.to_dict() for k, v in self.orders.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StoreDB:
        return cls(users={k: User.from_dict(v) for k, v in d["users"].items()},
                   products={k: Product.from_dict(v) for k, v in d["products"].items()},
                   orders={k: Order.from_dict(v) for k, v in d["orders"].items()})

    def clone(self) -> StoreDB:
        """An independent deep copy."""
        return StoreDB(users={k: v.clone() for k, v in self.users.items()},
                       products={k: v.clone() for k, v in self.products.items()},
                       orders={k: v.clone() for k, v in self.orders.items()}, ids=self.ids)

    def find_item(self, item_id: str) -> tuple[Product, Variant] | None:
        for product in self.products.values():
            variant = product.variant(item_id)
            if variant is not None:
                return product, variant
        return None


def db_hash(db: StoreDB) -> str:
    """sha256 of the canonical JSON of the database (sorted keys, no whitespace)."""
    text = json.dumps(db.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------------
FIRST_NAMES = ("mia", "noah", "ava", "liam", "emma", "omar", "yara", "ivan", "lena", "raj", "sofia", "chen",
               "ana", "ben", "zoe", "kai", "nora", "leo", "maya", "eli", "ruth", "sam", "ida", "tom")
LAST_NAMES = ("chen", "garcia", "smith", "kim", "patel", "silva", "novak", "brown", "ito", "lopez", "moreau",
              "khan", "nguyen", "berg", "ortiz", "young", "rossi", "ali", "weber", "clark")
# (city, state, zip prefix): New England prefixes start with 0, so zips must stay strings.
CITIES = (("Boston", "MA", "021"), ("Newark", "NJ", "071"), ("Hartford", "CT", "061"), ("Portland", "ME", "041"),
          ("Providence", "RI", "029"), ("Austin", "TX", "733"), ("Denver", "CO", "802"), ("Seattle", "WA", "981"),
          ("Chicago", "IL", "606"), ("Miami", "FL", "331"), ("Phoenix", "AZ", "850"), ("Dayton", "OH", "454"))
STREETS = ("Oak St", "Elm St", "Pine Ave", "Maple Rd", "Cedar Ln", "Lake Dr", "Hill St", "Park Ave", "Main St")
UNIT_KINDS = ("Apt", "Suite", "Unit")
# product name -> (option name, possible values)
CATALOG = (("lamp", "color", ("red", "blue", "white", "black")), ("mug", "size", ("small", "medium", "large")),
           ("backpack", "color", ("green", "gray", "black", "navy")), ("kettle", "color", ("silver", "black", "red")),
           ("shirt", "size", ("S", "M", "L", "XL")), ("headphones", "color", ("black", "white", "blue")),
           ("bottle", "size", ("small", "medium", "large")), ("jacket", "size", ("S", "M", "L")),
           ("chair", "color", ("gray", "brown", "black")), ("watch", "color", ("gold", "silver", "black")),
           ("tent", "size", ("2p", "4p", "6p")), ("scarf", "color", ("red", "green", "blue")))
# "exchange requested" only arises from the exchange tool.
ORDER_STATUS_WEIGHTS = (("pending", 4), ("processed", 2), ("delivered", 4), ("cancelled", 1), ("return requested", 1))


# Fast draws: `random.randint`/`choice` cost several Python calls each, and a reset draws ~150 numbers.
def _int(rng: random.Random, low: int, high: int) -> int:
    """Uniform integer in [low, high]."""
    return low + int(rng.random() * (high - low + 1))


def _pick(rng: random.Random, options: Sequence[T]) -> T:
    """Uniform element of a non-empty sequence."""
    return options[int(rng.random() * len(options))]


def _sample(rng: random.Random, options: Sequence[T], k: int) -> list[T]:
    """k distinct elements in random order (a partial Fisher-Yates shuffle)."""
    pool = list(options)
    n = len(pool)
    for i in range(k):
        j = i + int(rng.random() * (n - i))
        pool[i], pool[j] = pool[j], pool[i]
    return pool[:k]


def _weighted(rng: random.Random, options: Sequence[T], cum_weights: Sequence[float]) -> T:
    """An element drawn with the given cumulative weights."""
    return options[bisect.bisect_right(cum_weights, rng.random() * cum_weights[-1])]


_CENTS = tuple(c for c in range(1, 100) if c % 10)


def random_price(rng: random.Random) -> float:
    """A price whose cents do not end in 0 (so JSON and two-decimal forms agree)."""
    return round(_int(rng, 9, 299) + _pick(rng, _CENTS) / 100, 2)


def random_address(rng: random.Random, with_unit: bool | None = None) -> Address:
    """A US address; `with_unit` forces (True) or forbids (False) an address2 line; None: random."""
    city, state, prefix = _pick(rng, CITIES)
    if with_unit is None:
        with_unit = rng.random() < 0.5
    address2 = f"{_pick(rng, UNIT_KINDS)} {_int(rng, 1, 40)}" if with_unit else ""
    return Address(address1=f"{_int(rng, 1, 999)} {_pick(rng, STREETS)}", address2=address2, city=city,
                   state=state, country="USA", zip=f"{prefix}{_int(rng, 0, 99):02d}")


def _unique_digits(rng: random.Random, used: set[str], n_digits: int) -> str:
    while True:
        value = str(_int(rng, 10 ** (n_digits - 1), 10 ** n_digits - 1))
        if value not in used:
            used.add(value)
            return value


def generate_db(rng: random.Random, n_users: int = 5, n_products: int = 6, min_orders: int = 1,
                max_orders: int = 3, max_items_per_order: int = 2, ids: IdFormat | None = None) -> StoreDB:
    """A random store from `rng` (a `random.Random(seed)`): the same rng state gives the same DB."""
    if not 1 <= n_users <= 100:
        raise ValueError(f"n_users must be in 1..100, got {n_users}")
    if not 2 <= n_products <= len(CATALOG):
        raise ValueError(f"n_products must be in 2..{len(CATALOG)} (the catalog size), got {n_products}")
    if not 1 <= min_orders <= max_orders:
        raise ValueError(f"need 1 <= min_orders <= max_orders, got {min_orders}, {max_orders}")
    if not 1 <= max_items_per_order <= n_products:
        raise ValueError(f"max_items_per_order must be in 1..n_products, got {max_items_per_order}")
    ids = ids or IdFormat()
    used: set[str] = set()

    products: dict[str, Product] = {}
    for name, option, values in _sample(rng, CATALOG, n_products):
        chosen = _sample(rng, values, _int(rng, 2, len(values)))
        variants = [Variant(item_id=_unique_digits(rng, used, ids.item_digits), options={option: value}, price=random_price(rng),
                            available=rng.random() < 0.8) for value in chosen]
        product_id = _unique_digits(rng, used, ids.product_digits)
        products[product_id] = Product(product_id=product_id, name=name, variants=variants)

    users: dict[str, User] = {}
    name_pairs: list[tuple[str, str]] = []
    while len(name_pairs) < n_users:  # distinct (first, last) pairs, so name+zip look-ups are unambiguous
        pair = (_pick(rng, FIRST_NAMES), _pick(rng, LAST_NAMES))
        if pair not in name_pairs:
            name_pairs.append(pair)
    for first, last in name_pairs:
        user_id = f"{first}_{last}_{_unique_digits(rng, used, ids.user_digits)}"
        methods = [_new_payment_method(rng, used, source, ids)
                   for source in _sample(rng, PAYMENT_SOURCES, _int(rng, 1, 3))]
        email = ""
        while not email or any(u.email == email for u in users.values()):  # emails identify users: unique
            email = (f"{first}{_int(rng, 1, 9)}@x.io" if ids.short_emails
                     else f"{first}.{last}{_int(rng, 10, 99)}@example.com")
        users[user_id] = User(user_id=user_id, first_name=first.capitalize(), last_name=last.capitalize(),
                              email=email, address=random_address(rng),
                              payment_methods=methods, orders=[])

    orders: dict[str, Order] = {}
    statuses, weights = zip(*ORDER_STATUS_WEIGHTS)
    cum_weights = list(itertools.accumulate(weights))
    for user in users.values():
        for _ in range(_int(rng, min_orders, max_orders)):
            order = _random_order(rng, used, user, products, max_items_per_order,
                                  status=_weighted(rng, statuses, cum_weights), order_digits=ids.order_digits)
            orders[order.order_id] = order
            user.orders.append(order.order_id)
    return StoreDB(users=users, products=products, orders=orders, ids=ids)


def _random_order(rng: random.Random, used: set[str], user: User, products: dict[str, Product],
                  max_items: int, status: str, n_items: int | None = None, order_digits: int = 7) -> Order:
    n_items = n_items or _int(rng, 1, max_items)
    product_list = list(products.values())
    while True:  # redraw until the total's cents do not end in 0 (see the module docstring)
        chosen = _sample(rng, product_list, n_items)
        items = []
        for product in chosen:
            variant = _pick(rng, product.variants)
            items.append(OrderItem(variant.item_id, product.product_id, product.name, dict(variant.options),
                                   variant.price))
        total = round(sum(i.price for i in items), 2)
        if round(total * 100) % 10:
            break
    method = _pick(rng, user.payment_methods)
    order = Order(order_id=f"#W{_unique_digits(rng, used, order_digits)}", user_id=user.user_id, status="pending",
                  items=items, address=user.address.clone(), payment_history=[Payment(method.id, total, "payment")])
    set_order_status(order, status, rng)
    return order


def set_order_status(order: Order, status: str, rng: random.Random) -> None:
    """Give `order` this status with consistent side fields (refund entry, cancel reason, return request).

    The payment history is reset to its payments (refunds dropped) before the status is applied.
    """
    if status not in ORDER_STATUSES:
        raise ValueError(f"unknown order status {status!r}; known: {', '.join(ORDER_STATUSES)}")
    order.status = status
    order.payment_history = [p for p in order.payment_history if p.transaction_type == "payment"]
    order.cancel_reason, order.return_items, order.return_payment_method_id = "", [], ""
    order.exchange_items, order.exchange_new_items, order.exchange_payment_method_id = [], [], ""
    order.exchange_price_difference = None
    first_payment = order.payment_history[0].payment_method_id
    if status == "cancelled":
        order.cancel_reason = _pick(rng, ("no longer needed", "ordered by mistake"))
        order.payment_history += [Payment(p.payment_method_id, p.amount, "refund") for p in order.payment_history]
    elif status == "return requested":
        order.return_items = sorted(i.item_id for i in order.items)
        order.return_payment_method_id = first_payment
    elif status == "exchange requested":
        raise ValueError("'exchange requested' only arises from the exchange tool; it cannot be generated")


def used_ids(db: StoreDB) -> set[str]:
    """Every numeric id part in use (item, product, user, payment method, order), to keep new ids unique."""
    used = set(db.products)
    for product in db.products.values():
        used.update(v.item_id for v in product.variants)
    for user in db.users.values():
        used.add(user.user_id.rsplit("_", 1)[1])
        used.update(p.id.rsplit("_", 1)[1] for p in user.payment_methods)
    used.update(order_id.removeprefix("#W") for order_id in db.orders)
    return used


def add_order(rng: random.Random, db: StoreDB, user: User, status: str, n_items: int | None = None) -> Order:
    """Add a random order of `user` with `status` (and `n_items` distinct products, random if None)."""
    if n_items is not None and not 1 <= n_items <= len(db.products):
        raise ValueError(f"n_items must be in 1..{len(db.products)}, got {n_items}")
    order = _random_order(rng, used_ids(db), user, db.products, max_items=2, status=status, n_items=n_items,
                          order_digits=db.ids.order_digits)
    db.orders[order.order_id] = order
    user.orders.append(order.order_id)
    return order


def add_payment_method(rng: random.Random, db: StoreDB, user: User, source: str) -> PaymentMethod:
    """Give `user` a new payment method of `source` (credit_card, gift_card or paypal)."""
    if source not in PAYMENT_SOURCES:
        raise ValueError(f"unknown payment source {source!r}; known: {', '.join(PAYMENT_SOURCES)}")
    method = _new_payment_method(rng, used_ids(db), source, db.ids)
    user.payment_methods.append(method)
    return method


def _new_payment_method(rng: random.Random, used: set[str], source: str, ids: IdFormat) -> PaymentMethod:
    method_id = f"{source}_{_unique_digits(rng, used, ids.payment_digits)}"
    if source == "credit_card":
        return PaymentMethod(method_id, source, last_four=f"{_int(rng, 0, 9999):04d}")
    if source == "gift_card":
        return PaymentMethod(method_id, source, balance=random_price(rng))
    return PaymentMethod(method_id, source)
