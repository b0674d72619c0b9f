"""The storefront's tools: what the agent can read and change.

Tools check only what the database itself would (ids exist, an item belongs to the order, a payment
method belongs to the order's user, a gift card covers a charge) and raise ValueError otherwise. They
do NOT enforce the written policy: `cancel_pending_order` will cancel a delivered order. Following
the policy (checking the status first) is the agent's job, and that is what the tasks test.

Outputs are compact: look-ups return the record; writes return the updated record, as in τ²-bench, and
never a computed answer (no refund total, no price difference: stating an amount takes reading prices and
adding them up). A successful `transfer_to_human_agents` ends the episode.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Literal

from benchmarks.storefront.db import Address, Order, Payment, PaymentMethod, StoreDB, User
from benchmarks.toolkit import Toolkit, tool

CANCEL_REASONS = ("no longer needed", "ordered by mistake")


class StorefrontTools(Toolkit):
    """Tools over a `StoreDB` (changed in place by the write tools)."""

    db: StoreDB

    # ---- helpers (not tools) ---------------------------------------------------------------------
    def _order(self, order_id: str) -> Order:
        order = self.db.orders.get(order_id)
        if order is None:
            raise ValueError(f"order {order_id!r} not found")
        return order

    def _user(self, user_id: str) -> User:
        user = self.db.users.get(user_id)
        if user is None:
            raise ValueError(f"user {user_id!r} not found")
        return user

    def _check_items_in_order(self, order: Order, item_ids: list[str]) -> None:
        if not item_ids:
            raise ValueError("item_ids is empty; give at least one item id")
        have = Counter(i.item_id for i in order.items)
        for item_id, count in Counter(item_ids).items():
            if have[item_id] < count:
                raise ValueError(f"item {item_id!r} is not in order {order.order_id}"
                                 if not have[item_id] else f"item {item_id!r} appears only {have[item_id]} time(s) "
                                                           f"in order {order.order_id}")

    def _user_payment_method(self, order: Order, payment_method_id: str) -> PaymentMethod:
        method = self._user(order.user_id).payment_method(payment_method_id)
        if method is None:
            raise ValueError(f"payment method {payment_method_id!r} not found for user {order.user_id}")
        return method

    # ---- read tools ------------------------------------------------------------------------------
    @tool(auth=True)
    def find_user_id_by_email(self, email: str) -> str:
        """Find a user id by email.

        Args:
            email: The user's email.
        """
        for user in self.db.users.values():
            if user.email == email:
                return user.user_id
        raise ValueError(f"no user with email {email!r}")

    @tool(auth=True)
    def find_user_id_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:
        """Find a user id by name and zip code.

        Args:
            first_name: First name.
            last_name: Last name.
            zip: Zip code (a string).
        """
        for user in self.db.users.values():
            if (user.first_name.lower() == first_name.lower() and user.last_name.lower() == last_name.lower()
                    and user.address.zip == zip):
                return user.user_id
        raise ValueError(f"no user named {first_name} {last_name} with zip {zip!r}")

    @tool
    def get_user_details(self, user_id: str) -> dict[str, Any]:
        """Get a user's details: address, payment methods, order ids.

        Args:
            user_id: The user id.
        """
        return self._user(user_id).view()

    @tool
    def get_order_details(self, order_id: str) -> dict[str, Any]:
        """Get an order's status, items, address and payment history.

        Args:
            order_id: The order id, like '#W4821937'.
        """
        return self._order(order_id).view()

    @tool
    def get_product_details(self, product_id: str) -> dict[str, Any]:
        """Get a product's variants: item id, options, price, availability.

        Args:
            product_id: The product id.
        """
        product = self.db.products.get(product_id)
        if product is None:
            raise ValueError(f"product {product_id!r} not found")
        return product.to_dict()

    # ---- write tools -----------------------------------------------------------------------------
    @tool(write=True)
    def cancel_pending_order(self, order_id: str, reason: Literal["no longer needed", "ordered by mistake"]
                             ) -> dict[str, Any]:
        """Cancel a pending order; payments are refunded to their methods.

        Args:
            order_id: The order id.
            reason: Why the user cancels.
        """
        order = self._order(order_id)
        refunds = [p for p in order.payment_history if p.transaction_type == "payment"]
        user = self._user(order.user_id)
        for payment in refunds:
            order.payment_history.append(Payment(payment.payment_method_id, payment.amount, "refund"))
            method = user.payment_method(payment.payment_method_id)
            if method is not None and method.balance is not None:  # gift cards get their money back at once
                method.balance = round(method.balance + payment.amount, 2)
        order.status = "cancelled"
        order.cancel_reason = reason
        return order.view()

    @tool(write=True)
    def modify_pending_order_address(self, order_id: str, address1: str, address2: str, city: str, state: str,
                                     country: str, zip: str) -> dict[str, Any]:
        """Change the shipping address of a pending order.

        Args:
            order_id: The order id.
            address1: Street line.
            address2: Second line ('' if none).
            city: City.
            state: State code.
            country: Country.
            zip: Zip code (a string).
        """
        order = self._order(order_id)
        order.address = Address(address1, address2, city, state, country, zip)
        return order.view()

    @tool(write=True)
    def return_delivered_order_items(self, order_id: str, item_ids: list[str], payment_method_id: str
                                     ) -> dict[str, Any]:
        """Return items of a delivered order.

        Args:
            order_id: The order id.
            item_ids: The item ids to return.
            payment_method_id: The payment method that gets the refund.
        """
        order = self._order(order_id)
        self._check_items_in_order(order, item_ids)
        self._user_payment_method(order, payment_method_id)
        order.status = "return requested"
        order.return_items = sorted(item_ids)
        order.return_payment_method_id = payment_method_id
        return order.view()

    @tool(write=True)
    def exchange_delivered_order_items(self, order_id: str, item_ids: list[str], new_item_ids: list[str],
                                       payment_method_id: str) -> dict[str, Any]:
        """Exchange items of a delivered order for other variants of the same products.

        Args:
            order_id: The order id.
            item_ids: The item ids to exchange.
            new_item_ids: The new item ids, in the same order.
            payment_method_id: Pays or gets the price difference.
        """
        order = self._order(order_id)
        self._check_items_in_order(order, item_ids)
        if len(new_item_ids) != len(item_ids):
            raise ValueError(f"new_item_ids has {len(new_item_ids)} ids but item_ids has {len(item_ids)}")
        old_by_id = {i.item_id: i for i in order.items}
        difference = 0.0
        for old_id, new_id in zip(item_ids, new_item_ids):
            found = self.db.find_item(new_id)
            if found is None:
                raise ValueError(f"item {new_id!r} not found")
            product, variant = found
            if product.product_id != old_by_id[old_id].product_id:
                raise ValueError(f"item {new_id!r} is a {product.name}, not a variant of item {old_id!r} "
                                 f"({old_by_id[old_id].name})")
            if not variant.available:
                raise ValueError(f"item {new_id!r} is not available")
            difference += variant.price - old_by_id[old_id].price
        difference = round(difference, 2)
        method = self._user_payment_method(order, payment_method_id)
        if method.balance is not None and difference > method.balance:
            raise ValueError(f"gift card {payment_method_id} balance {method.balance:.2f} does not cover "
                             f"the price difference {difference:.2f}")
        order.status = "exchange requested"
        order.exchange_items = sorted(item_ids)
        order.exchange_new_items = sorted(new_item_ids)
        order.exchange_payment_method_id = payment_method_id
        order.exchange_price_difference = difference
        return order.view()

    @tool(write=True)
    def modify_user_address(self, user_id: str, address1: str, address2: str, city: str, state: str,
                            country: str, zip: str) -> dict[str, Any]:
        """Change a user's default address.

        Args:
            user_id: The user id.
            address1: Street line.
            address2: Second line ('' if none).
            city: City.
            state: State code.
            country: Country.
            zip: Zip code (a string).
        """
        user = self._user(user_id)
        user.address = Address(address1, address2, city, state, country, zip)
        return user.view()

    @tool(ends_episode=True)
    def transfer_to_human_agents(self, summary: str) -> str:
        """Transfer the user to a human agent.

        Args:
            summary: A short summary of the issue.
        """
        return "Transfer successful"
