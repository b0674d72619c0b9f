"""The storefront benchmark: DB, tools, tasks and their hidden capability record, the communication and
policy-procedure checks, the scripted customer, the game, the expert and the six flawed experts, results
files, the CLI and the model-backed agents."""
from __future__ import annotations

import json
import random
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, Callable

import pytest

from benchmarks.agents import ExpertAgent
from train.agents import HFAgent, VLLMAgent, parse_agent_spec, render_prompt
from benchmarks.results import load_results, make_simulation, pass_rates, write_results
from benchmarks.storefront import run as run_cli
from train import play as play_cli
from benchmarks.storefront.communication import (LegitValues, Replies, Reply, amounts_in, asserted_statuses, is_raw_dump,
                                                 order_ids_in, reply_tells_amount, reply_tells_status)
from benchmarks.storefront.db import IdFormat, StoreDB, db_hash, generate_db
from benchmarks.storefront.env import StorefrontConfig, StorefrontGame, tool_call_text
from benchmarks.storefront.flaws import FLAWS, FlawedExpertAgent, flawed_response
from benchmarks.storefront.policy import POLICY, policy_text
from benchmarks.storefront.tasks import CAPABILITIES, PLAIN_REASONS, Task, make_task
from benchmarks.storefront.tools import StorefrontTools
from benchmarks.storefront.user_sim import (NO_REPLY, REQUEST_KINDS, STOP, YES_REPLIES, Identity, UserRequest,
                                            UserSimulator)
from benchmarks.toolkit import dump_compact
from game_registry import get_game, parse_hermes_action
from common.validation import InputError

Responder = Callable[[StorefrontGame], str]
# What the written policy allows, per request kind (written out here, not imported, so that a change of
# the generator's tables shows up as a failing test).
ALLOWED_STATUS = {"cancel": "pending", "modify_order_address": "pending", "return": "delivered",
                  "exchange": "delivered"}
ALL_STATUSES = ("pending", "processed", "delivered", "cancelled", "return requested")


def play(game: StorefrontGame, seed: int, respond: Responder, trial: int = 0) -> dict[str, Any]:
    """Play one episode with `respond(game) -> text`; return the summary."""
    game.reset(seed, trial=trial)
    while not game.done:
        game.step(parse_hermes_action(respond(game)))
    return game.get_summary()


def expert(game: StorefrontGame) -> str:
    return game.oracle_response()


def say(game: StorefrontGame, text: str) -> str:
    """Send one assistant reply; return the customer's answer."""
    (message,) = game.step(parse_hermes_action(text)).observation_messages
    assert message["role"] == "user"
    return message["content"]


def forbidden(task: Task, sub) -> bool:
    """Whether the order's status in the task's DB forbids the request (read from the DB, not the plan)."""
    return sub.kind != "modify_user_address" and task.db.orders[sub.order_id].status != ALLOWED_STATUS[sub.kind]


def order_subs(task: Task) -> list:
    return [s for s in task.sub_requests if s.kind != "modify_user_address"]


# --------------------------------------------------------------------------------------------------
# Database and tools
# --------------------------------------------------------------------------------------------------
def test_generate_db_is_deterministic_and_roundtrips():
    first, second = generate_db(random.Random(7)), generate_db(random.Random(7))
    assert db_hash(first) == db_hash(second)
    assert db_hash(first) != db_hash(generate_db(random.Random(8)))
    assert db_hash(StoreDB.from_dict(json.loads(json.dumps(first.to_dict())))) == db_hash(first)
    clone = first.clone()
    assert clone == first and db_hash(clone) == db_hash(first)
    next(iter(clone.orders.values())).status = "changed"  # the clone is independent
    assert db_hash(clone) != db_hash(first)
    for order in first.orders.values():
        assert re.fullmatch(r"#W\d{7}", order.order_id)
        assert order.user_id in first.users and order.order_id in first.users[order.user_id].orders
        assert round(order.payment_history[0].amount * 100) % 10  # amounts print the same in JSON and 2-dp
    for user in first.users.values():
        assert all(re.fullmatch(r"(credit_card|gift_card|paypal)_\d{7}", p.id) for p in user.payment_methods)
        assert isinstance(user.address.zip, str) and len(user.address.zip) == 5
    with pytest.raises(ValueError, match="n_products"):
        generate_db(random.Random(0), n_products=50)


def test_short_ids_and_emails():
    config = StorefrontConfig(order_id_digits=3, item_id_digits=3, product_id_digits=3, user_id_digits=3,
                              payment_id_digits=3, short_emails=True)
    for seed in range(30):
        task = make_task(seed, config)
        db = task.db
        assert db.orders and all(re.fullmatch(r"#W\d{3}", oid) for oid in db.orders)
        assert all(re.fullmatch(r"\d{3}", v.item_id) for p in db.products.values() for v in p.variants)
        assert all(re.fullmatch(r"\d{3}", pid) for pid in db.products)
        for user in db.users.values():
            assert re.fullmatch(r"[a-z]+_[a-z]+_\d{3}", user.user_id)
            assert re.fullmatch(r"[a-z]+\d@x\.io", user.email), user.email
            assert all(re.fullmatch(r"[a-z_]+_\d{3}", p.id) for p in user.payment_methods)
        assert len({u.email for u in db.users.values()}) == len(db.users)  # emails identify users
    default = make_task(0)
    assert all(re.fullmatch(r"#W\d{7}", oid) for oid in default.db.orders)
    assert all(u.email.endswith("@example.com") for u in default.db.users.values())
    with pytest.raises(ValueError, match="order_digits"):
        IdFormat(order_digits=2)
    with pytest.raises(ValueError, match="short_emails"):
        IdFormat(short_emails="yes")


# A task whose only request is an allowed return (its order is delivered and known by id).
RETURN_ONLY = StorefrontConfig(request_counts=(1.0,), kind_weights={"return": 1.0}, forbidden_rate=0.0,
                               unknown_order_id_rate=0.0)


@pytest.fixture
def shop() -> tuple[StorefrontTools, Task, Any]:
    task = make_task(11, RETURN_ONLY)
    return StorefrontTools(task.db.clone()), task, task.user


def test_read_tools_return_compact_records(shop):
    tools, task, user = shop
    assert tools.call("find_user_id_by_email", {"email": user.email}) == user.user_id
    assert tools.call("find_user_id_by_name_zip", {"first_name": user.first_name.lower(), "last_name": user.last_name,
                                                   "zip": user.address.zip}) == user.user_id
    details = tools.call("get_user_details", {"user_id": user.user_id})
    assert details == dump_compact(json.loads(details))  # sorted keys, no whitespace between tokens
    assert json.loads(details)["orders"] == user.orders and json.loads(details)["address"] == user.address.text()
    order_id = task.sub_requests[0].order_id
    order = json.loads(tools.call("get_order_details", {"order_id": order_id}))
    assert order["status"] == "delivered" and order["payment_history"][0]["transaction_type"] == "payment"
    product_id = order["items"][0]["product_id"]
    assert json.loads(tools.call("get_product_details", {"product_id": product_id}))["product_id"] == product_id


@pytest.mark.parametrize("name, arguments, message", [
    ("find_user_id_by_email", {"email": "nobody@example.com"}, "no user with email"),
    ("find_user_id_by_name_zip", {"first_name": "No", "last_name": "Body", "zip": "00000"}, "no user named"),
    ("find_user_id_by_name_zip", {"first_name": "No", "last_name": "Body", "zip": 2134}, "must be a JSON string"),
    ("get_user_details", {"user_id": "nobody_1"}, "user 'nobody_1' not found"),
    ("get_order_details", {"order_id": "W0000000"}, "order 'W0000000' not found"),
    ("get_order_details", {"order_id": "ORDER", "extra": 1}, "unexpected argument"),
    ("get_product_details", {"product_id": "0"}, "product '0' not found"),
    ("cancel_pending_order", {"order_id": "#W0000000", "reason": "no longer needed"}, "not found"),
    ("cancel_pending_order", {"order_id": "ORDER", "reason": "changed my mind"}, "must be one of"),
    ("cancel_pending_order", {"order_id": "ORDER"}, "missing required argument"),
    ("return_delivered_order_items", {"order_id": "ORDER", "item_ids": ["000000"], "payment_method_id": "PM"},
     "item '000000' is not in order"),
    ("return_delivered_order_items", {"order_id": "ORDER", "item_ids": [], "payment_method_id": "PM"},
     "item_ids is empty"),
    ("return_delivered_order_items", {"order_id": "ORDER", "item_ids": "ITEM", "payment_method_id": "PM"},
     "must be a JSON array"),
    ("return_delivered_order_items", {"order_id": "ORDER", "item_ids": ["ITEM", "ITEM"], "payment_method_id": "PM"},
     "appears only 1 time"),
    ("return_delivered_order_items", {"order_id": "ORDER", "item_ids": ["ITEM"], "payment_method_id": "paypal_1"},
     "payment method 'paypal_1' not found for user"),
    ("exchange_delivered_order_items", {"order_id": "ORDER", "item_ids": ["ITEM"], "new_item_ids": ["999999"],
                                        "payment_method_id": "PM"}, "item '999999' not found"),
    ("exchange_delivered_order_items", {"order_id": "ORDER", "item_ids": ["ITEM"], "new_item_ids": [],
                                        "payment_method_id": "PM"}, "new_item_ids has 0 ids"),
    ("modify_user_address", {"user_id": "nobody", "address1": "a", "address2": "", "city": "c", "state": "s",
                             "country": "USA", "zip": "01234"}, "user 'nobody' not found"),
    ("modify_user_address", {"user_id": "USER", "address1": "a", "address2": "", "city": "c", "state": "s",
                             "country": "USA", "zip": 1234}, "must be a JSON string"),
    ("transfer_to_human_agents", {}, "missing required argument"),
])
def test_tools_refuse_bad_arguments_and_change_nothing(shop, name, arguments, message):
    tools, task, user = shop
    sub = task.sub_requests[0]
    order = task.db.orders[sub.order_id]
    values = {"ORDER": sub.order_id, "ITEM": order.items[0].item_id, "PM": user.payment_methods[0].id,
              "USER": user.user_id}
    arguments = json.loads(json.dumps(arguments))
    for key, value in arguments.items():
        if isinstance(value, str) and value in values:
            arguments[key] = values[value]
        elif isinstance(value, list):
            arguments[key] = [values.get(v, v) for v in value]
    before = db_hash(tools.db)
    with pytest.raises(ValueError, match=message):
        tools.call(name, arguments)
    assert db_hash(tools.db) == before  # a refused call changes nothing


def test_tools_do_not_enforce_the_policy(shop):
    """Cancelling a delivered order works at the tool level: following the policy is the agent's job."""
    tools, task, _ = shop
    order_id = task.sub_requests[0].order_id
    assert tools.db.orders[order_id].status == "delivered"
    receipt = json.loads(tools.call("cancel_pending_order", {"order_id": order_id, "reason": "ordered by mistake"}))
    assert receipt["status"] == "cancelled"
    assert tools.db.orders[order_id].payment_history[-1].transaction_type == "refund"


def first_task(config: StorefrontConfig, kind: str, seeds: range = range(200)) -> Task:
    for seed in seeds:
        task = make_task(seed, config)
        if task.sub_requests[0].kind == kind:
            return task
    pytest.fail(f"no {kind} task in seeds {seeds}")


def test_write_tools_return_the_updated_record_without_computed_answers():
    """Writes answer with the order / user view after the change: no refund total, no price difference."""
    computed = ("refund_amount", "price_difference", "exchange_price_difference", "total")
    outputs = {}
    for kind in ("cancel", "modify_order_address", "return", "exchange", "modify_user_address"):
        config = StorefrontConfig(request_counts=(1.0,), kind_weights={kind: 1.0}, forbidden_rate=0.0)
        task = first_task(config, kind)
        (sub,) = task.sub_requests
        tools = StorefrontTools(task.db.clone())
        write = sub.write
        output = json.loads(tools.call(write.name, write.arguments))
        if kind == "modify_user_address":
            assert output == json.loads(dump_compact(tools.db.users[task.user_id].view()))
            assert output["address"] == sub.user.address.text()
        else:
            assert output == json.loads(dump_compact(tools.db.orders[sub.order_id].view()))
            assert output["status"] != task.db.orders[sub.order_id].status or kind == "modify_order_address"
        assert not set(computed) & set(output), (kind, sorted(output))
        outputs[kind] = output
    assert outputs["cancel"]["status"] == "cancelled"
    assert outputs["return"]["status"] == "return requested"
    assert outputs["exchange"]["status"] == "exchange requested"
    tools = StorefrontTools(make_task(0).db.clone())
    assert tools.call("transfer_to_human_agents", {"summary": "the user wants a person"}) == "Transfer successful"


def test_exchange_checks_product_and_gift_card_balance():
    config = StorefrontConfig(request_counts=(1.0,), kind_weights={"exchange": 1.0}, forbidden_rate=0.0)
    checked_balance = False
    for seed in range(100):
        task = make_task(seed, config)
        (sub,) = task.sub_requests
        if sub.kind != "exchange":
            continue
        tools = StorefrontTools(task.db.clone())
        order = tools.db.orders[sub.order_id]
        item = order.items[0]
        method = order.payment_history[0].payment_method_id
        other_product = next(p for p in tools.db.products.values() if p.product_id != item.product_id)
        with pytest.raises(ValueError, match="not a variant of item"):
            tools.call("exchange_delivered_order_items", {"order_id": order.order_id, "item_ids": [item.item_id],
                                                          "new_item_ids": [other_product.variants[0].item_id],
                                                          "payment_method_id": method})
        user = tools.db.users[order.user_id]
        gift = next((p for p in user.payment_methods if p.source == "gift_card"), None)
        dearer = [v for v in tools.db.products[item.product_id].variants if v.price > item.price and v.available]
        if gift is not None and dearer:
            gift.balance = 0.0
            before = db_hash(tools.db)
            with pytest.raises(ValueError, match="does not cover"):
                tools.call("exchange_delivered_order_items", {"order_id": order.order_id, "item_ids": [item.item_id],
                                                              "new_item_ids": [dearer[0].item_id],
                                                              "payment_method_id": gift.id})
            assert db_hash(tools.db) == before
            checked_balance = True
    assert checked_balance, "no exchange task in 100 seeds had a gift card and a dearer variant"


# --------------------------------------------------------------------------------------------------
# Tasks: determinism, the mix, the needs, the hidden capability record, the config
# --------------------------------------------------------------------------------------------------
def test_tasks_are_deterministic_per_seed_and_config():
    game_a, game_b = StorefrontGame(), StorefrontGame()
    for seed in range(40):
        random.seed(seed)  # the global random state plays no part
        a = make_task(seed)
        random.seed(seed + 1000)
        b = make_task(seed)
        assert db_hash(a.db) == db_hash(b.db)
        assert a.to_json() == b.to_json() and a.gold_actions == b.gold_actions
        assert a.capabilities == b.capabilities and a.identity == b.identity
        game_a.reset(seed)
        game_b.reset(seed, trial=1)  # the trial changes the wording, never the task
        assert game_a.gold_hash() == game_b.gold_hash() and game_a.task.to_json() == game_b.task.to_json()
    assert len({db_hash(make_task(seed).db) for seed in range(40)}) == 40
    never_forbidden = StorefrontConfig(forbidden_rate=0.0)
    assert sum(make_task(seed, never_forbidden).to_json() != make_task(seed).to_json() for seed in range(40)) >= 5
    with pytest.raises(ValueError, match="seed must be an int"):
        make_task("1")


def test_forbidden_rate_controls_refusals():
    never, always = StorefrontConfig(forbidden_rate=0.0), StorefrontConfig(forbidden_rate=1.0)
    n_order_requests = n_forbidden = 0
    for seed in range(200):
        task = make_task(seed, never)
        assert not any(forbidden(task, sub) for sub in task.sub_requests), seed
        task = make_task(seed, always)
        for sub in order_subs(task):
            status = task.db.orders[sub.order_id].status
            assert forbidden(task, sub), (seed, sub.kind, status)
            assert sub.tell_status == status in ALL_STATUSES and sub.write is None  # change nothing, tell the status
        task = make_task(seed)
        n_order_requests += len(order_subs(task))
        n_forbidden += sum(forbidden(task, sub) for sub in order_subs(task))
    assert 0.2 <= n_forbidden / n_order_requests <= 0.4  # the default rate is 0.3


def test_request_counts_and_kind_weights_shape_the_mix():
    three, one = StorefrontConfig(request_counts=(0, 0, 1)), StorefrontConfig(request_counts=(1,))
    restricted = StorefrontConfig(kind_weights={"cancel": 1.0, "return": 2.0})
    sizes, kinds = Counter(), Counter()
    for seed in range(200):
        assert len(make_task(seed, three).sub_requests) == 3, seed
        assert len(make_task(seed, one).sub_requests) == 1, seed
        task = make_task(seed)
        sizes[len(task.sub_requests)] += 1
        assert task.request_kinds.count("modify_user_address") <= 1  # one default address
        order_ids = [sub.order_id for sub in order_subs(task)]
        assert len(order_ids) == len(set(order_ids))  # requests never share an order
        kinds.update(make_task(seed, restricted).request_kinds)
    assert set(kinds) == {"cancel", "return"} and 1.5 <= kinds["return"] / kinds["cancel"] <= 2.5
    assert 0.35 <= sizes[1] / 200 <= 0.55 and 0.25 <= sizes[2] / 200 <= 0.45 and 0.1 <= sizes[3] / 200 <= 0.3
    as_text = StorefrontConfig(request_counts="0,0,1", kind_weights="cancel=1, return=2")
    assert as_text.request_counts == (0.0, 0.0, 1.0) and as_text.kind_weights == {"cancel": 1.0, "return": 2.0}


def test_exchange_only_mix_gives_only_exchanges():
    config = StorefrontConfig(kind_weights={"exchange": 1.0})
    kinds = Counter(kind for seed in range(100) for kind in make_task(seed, config).request_kinds)
    assert set(kinds) == {"exchange"}, kinds


def test_needs_follow_their_rates():
    none = dict(unknown_order_id_rate=0.0, loose_order_id_rate=0.0, paraphrase_rate=0.0, leading_zero_zip_rate=0.0,
                two_items_rate=0.0, gift_card_refund_rate=0.0, email_auth_rate=1.0)
    every = dict(unknown_order_id_rate=0.0, loose_order_id_rate=1.0, paraphrase_rate=1.0, leading_zero_zip_rate=1.0,
                 two_items_rate=1.0, email_auth_rate=0.0)
    plain = set(PLAIN_REASONS.values())
    seen = Counter()
    for name, rates in (("none", none), ("every", every)):
        config = StorefrontConfig(request_counts=(0, 0, 1), **rates)
        for seed in range(100):
            task = make_task(seed, config)
            opening = task.opening(random.Random(0))
            assert task.auth == ("email" if name == "none" else "name_zip")
            if name == "every":
                assert task.user.address.zip.startswith("0")  # the customer's own zip, for name+zip
            for sub in task.sub_requests:
                user = sub.user
                if sub.order_id:
                    assert not user.order_hint  # unknown_order_id_rate=0
                    if name == "none":
                        assert user.order_ref == sub.order_id and sub.order_id in opening
                    else:
                        assert user.order_ref in (sub.order_id[1:], sub.order_id[2:]), user.order_ref
                        assert f"order {user.order_ref}" in opening and sub.order_id not in opening
                if sub.kind == "cancel":
                    assert (user.reason_text in plain) == (name == "none"), user.reason_text
                    seen["cancel"] += 1
                if user.address is not None:
                    assert user.address.zip.startswith("0") == (name == "every"), user.address.zip
                    assert user.address.text() in opening
                    seen["address"] += 1
                if sub.kind == "return":
                    assert len(user.item_names) == (2 if name == "every" else 1)
                    seen["return"] += 1
                if sub.kind == "return" and not forbidden(task, sub) and name == "none":
                    order = task.db.orders[sub.order_id]  # refunds go back to the order's payment method
                    assert sub.write.arguments["payment_method_id"] == order.payment_history[0].payment_method_id
    assert min(seen.values()) >= 50, seen


def test_unknown_order_ids_name_an_item_held_by_exactly_one_order():
    config = StorefrontConfig(unknown_order_id_rate=1.0, request_counts=(0, 0, 1))
    described = 0
    for seed in range(150):
        task = make_task(seed, config)
        opening = task.opening(random.Random(0))
        for sub in order_subs(task):
            if not sub.user.order_hint:  # no item of the order is unique among the customer's orders
                continue
            described += 1
            match = re.fullmatch(r"the one with the (\w+)", sub.user.order_hint)
            assert match, sub.user.order_hint
            name = match.group(1)
            holders = [oid for oid in task.user.orders if any(i.name == name for i in task.db.orders[oid].items)]
            assert holders == [sub.order_id], (seed, name, holders)
            assert sub.user.order_ref == "" and sub.order_id.removeprefix("#W") not in opening
            assert f"my order with the {name}" in opening
            # The expert reads the customer's orders to find it, and only then looks the order up.
            names = [step.name for step in sub.steps]
            assert names[0] == "get_user_details"
            looked = [s.arguments["order_id"] for s in sub.steps if s.name == "get_order_details"]
            assert looked[-1] == sub.order_id and set(looked) <= set(task.user.orders)
    assert described >= 200


def expected_capabilities(task: Task, require_confirmation: bool = True) -> set[str]:
    """The capability record as the tasks.py docstring defines it, worked out from the task's facts."""
    caps = set()
    if len(task.sub_requests) >= 2:
        caps.add("multi_step_task_completion")
    if task.auth == "name_zip" and task.user.address.zip.startswith("0"):
        caps.add("tool_calling_precision")
    for sub in task.sub_requests:
        user, refused = sub.user, forbidden(task, sub)
        if refused:
            caps.add("precondition_verification")
        if sub.kind in ("return", "exchange") and not refused:
            caps.add("structured_data_reasoning")
        if user.order_hint:
            caps.add("order_search")
        if user.order_ref and user.order_ref != sub.order_id:
            caps.add("tool_calling_precision")
        if not refused:
            if (sub.kind == "cancel" and user.reason_text not in PLAIN_REASONS.values()
                    or user.address is not None and user.address.zip.startswith("0")
                    or sub.kind == "return" and len(user.item_names) == 2):
                caps.add("tool_calling_precision")
            if require_confirmation:
                caps.add("explicit_confirmation")
    return caps


@pytest.mark.parametrize("require_confirmation", [True, False])
def test_hidden_capability_record_matches_the_drawn_needs(require_confirmation):
    config = StorefrontConfig(require_confirmation=require_confirmation)
    counts = Counter()
    for seed in range(300):
        task = make_task(seed, config)
        assert set(task.capabilities) == expected_capabilities(task, require_confirmation), seed
        assert task.capabilities == sorted(set(task.capabilities))
        counts.update(task.capabilities)
    expected = set(CAPABILITIES) - (set() if require_confirmation else {"explicit_confirmation"})
    assert set(counts) == expected  # every capability is exercised by some task
    assert all(counts[c] >= 30 for c in expected), counts


@pytest.mark.parametrize("kwargs, field", [
    ({"forbidden_rate": 1.5}, "forbidden_rate"), ({"email_auth_rate": -0.1}, "email_auth_rate"),
    ({"paraphrase_rate": True}, "paraphrase_rate"), ({"two_items_rate": "0.3"}, "two_items_rate"),
    ({"request_counts": (0, 0, 0)}, "request_counts"), ({"request_counts": (1, 1, 1, 1)}, "request_counts"),
    ({"request_counts": (float("nan"),)}, "request_counts"), ({"kind_weights": {"refund": 1.0}}, "kind_weights"),
    ({"kind_weights": {"cancel": -1.0}}, "kind_weights"), ({"kind_weights": {}}, "kind_weights"),
    ({"kind_weights": "cancel=x"}, "kind_weights"), ({"kind_weights": "cancel"}, "kind_weights"),
    ({"require_confirmation": "yes"}, "require_confirmation"), ({"short_emails": 1}, "short_emails"),
    ({"max_steps": 0}, "max_steps"), ({"max_user_turns": 0}, "max_user_turns"), ({"n_users": 0}, "n_users"),
    ({"max_errors": -1}, "max_errors"), ({"n_products": 2}, "n_products"), ({"n_products": 13}, "n_products"),
])
def test_config_rejects_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"StorefrontConfig\.{field}\b"):
        StorefrontConfig(**kwargs)


@pytest.mark.parametrize("kwargs, field", [
    ({"order_id_digits": 2}, "order_id_digits"), ({"payment_id_digits": 10}, "payment_id_digits"),
    ({"request_counts": "1,x"}, "request_counts"), ({"n_users": 101}, "n_users"),
])
def test_config_rejects_bad_ids_counts_and_store_sizes_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"StorefrontConfig\.{field}\b"):
        StorefrontConfig(**kwargs)


# --------------------------------------------------------------------------------------------------
# The expert and the six flawed experts
# --------------------------------------------------------------------------------------------------
def test_expert_solves_every_task_in_every_trial():
    game = StorefrontGame()
    turns = []
    for seed in range(300):
        for trial in range(3):
            summary = play(game, seed, expert, trial)
            assert summary["reward"] == 1.0, (seed, trial, summary)
            assert summary["reward_breakdown"] == {"DB": 1.0, "COMMUNICATE": 1.0, "POLICY": 1.0}
            assert summary["termination_reason"] == "user_stop"
            assert summary["tool_errors"] == 0 and summary["format_errors"] == 0
            assert all(check["action_match"] for check in summary["action_checks"])
            assert game.get_messages()[-1]["content"].endswith(STOP)
            turns.append(summary["steps"])
    assert max(turns) <= game.max_steps - 5  # headroom below the turn limit


@pytest.mark.parametrize("overrides", [
    {"order_id_digits": 3, "item_id_digits": 3, "product_id_digits": 3, "user_id_digits": 3, "payment_id_digits": 3,
     "short_emails": True},
    {"require_confirmation": False},
    {"forbidden_rate": 1.0, "request_counts": (0, 0, 1)},
    {"unknown_order_id_rate": 1.0, "loose_order_id_rate": 1.0, "paraphrase_rate": 1.0, "leading_zero_zip_rate": 1.0,
     "two_items_rate": 1.0, "gift_card_refund_rate": 1.0, "other_payment_method_rate": 1.0, "email_auth_rate": 0.0,
     "forbidden_rate": 0.0, "request_counts": (0, 0, 1)},
    {"n_users": 1, "n_products": 3},
], ids=["short_ids", "no_confirmation", "all_forbidden", "every_need", "tiny_store"])
def test_expert_solves_other_configs(overrides):
    game = StorefrontGame(StorefrontConfig(**overrides))
    for seed in range(100):
        summary = play(game, seed, expert, trial=seed % 3)
        assert summary["reward"] == 1.0, (overrides, seed, summary)


def refund_goes_elsewhere(task: Task) -> bool:
    """An allowed return / exchange whose refund or charge target is not the customer's first payment method."""
    first = task.user.payment_methods[0].id
    return any(sub.kind in ("return", "exchange") and not forbidden(task, sub)
               and sub.write.arguments["payment_method_id"] != first for sub in task.sub_requests)


# Where each flaw must fail (worked out from the task's facts) and which reward part must catch it.
FLAW_FAILS: dict[str, tuple[Callable[[Task], bool], str | None]] = {
    # Not always the DB: returning again the items of a "return requested" order to the same method is a no-op.
    "skip_status_check": (lambda task: any(forbidden(task, sub) for sub in task.sub_requests), None),
    "forget_requests": (lambda task: len(task.sub_requests) >= 2, None),
    "wrong_refund_method": (refund_goes_elsewhere, "DB"),
    "drop_hash": (lambda task: any(sub.user.order_ref not in ("", sub.order_id) for sub in task.sub_requests), None),
    "skip_confirmation": (lambda task: any(not forbidden(task, sub) for sub in task.sub_requests), "POLICY"),
    "no_order_search": (lambda task: any(sub.user.order_hint for sub in task.sub_requests), None),
}


def shared_refusal_status(task: Task) -> bool:
    """Two refused requests whose orders have the same status (see test_each_refusal_is_told_for_its_own_order)."""
    statuses = [task.db.orders[sub.order_id].status for sub in task.sub_requests if forbidden(task, sub)]
    return len(statuses) != len(set(statuses))


def test_every_flaw_has_a_prediction():
    assert set(FLAWS) == set(FLAW_FAILS)


@pytest.mark.parametrize("flaw", FLAWS)
def test_each_flaw_fails_exactly_where_its_mistake_applies(flaw):
    """Over 300 tasks a flaw fails exactly the tasks its mistake touches (the expert passes them all), and so
    lowers the pass rate of at least two request kinds (a task counts under each kind it holds)."""
    should_fail, caught_by = FLAW_FAILS[flaw]
    game = StorefrontGame()
    n, passed = Counter(), Counter()
    failures = 0
    for seed in range(300):
        summary = play(game, seed, lambda g: flawed_response(g, flaw))
        task = game.task
        fails = should_fail(task)
        assert summary["reward"] == (0.0 if fails else 1.0), (flaw, seed, task.request_kinds, summary)
        if fails and caught_by:
            assert summary["reward_breakdown"][caught_by] == 0.0, (flaw, seed, summary["reward_breakdown"])
            if caught_by == "POLICY":  # the confirmation is the only thing missing
                assert summary["reward_breakdown"]["DB"] == summary["reward_breakdown"]["COMMUNICATE"] == 1.0
        failures += fails
        for kind in set(task.request_kinds):
            n[kind] += 1
            passed[kind] += not fails
    lowered = [kind for kind in n if passed[kind] < n[kind]]
    assert failures >= 15 and len(lowered) >= 2, (flaw, failures, lowered)


def tell_only_the_first_refusal(game: StorefrontGame) -> str:
    """The expert, except that it closes the second request without its statement (it still looks the order up)."""
    text = game.oracle_response()
    if game.authenticated() and game.user.pointer == 1 and text == game.current.statement:
        return "Is there anything else I can help you with?"
    return text


def test_a_refusal_that_is_never_told_fails():
    game = StorefrontGame(StorefrontConfig(forbidden_rate=1.0, request_counts=(0, 1), kind_weights={"cancel": 1.0}))
    checked = 0
    for seed in range(100):
        summary = play(game, seed, tell_only_the_first_refusal)
        if not shared_refusal_status(game.task):
            assert summary["reward"] == 0.0 and summary["reward_breakdown"]["COMMUNICATE"] == 0.0, seed
            checked += 1
    assert checked >= 50


def test_each_refusal_is_told_for_its_own_order():
    game = StorefrontGame(StorefrontConfig(forbidden_rate=1.0, request_counts=(0, 1), kind_weights={"cancel": 1.0}))
    shared = 0
    for seed in range(100):
        summary = play(game, seed, tell_only_the_first_refusal)
        if shared_refusal_status(game.task):
            shared += 1
            assert summary["reward"] == 0.0, (seed, [s.status for s in game.task.sub_requests])
    assert shared >= 10
    assert play(StorefrontGame(), 219, lambda g: flawed_response(g, "forget_requests"))["reward"] == 0.0


def test_flawed_agent_rejects_unknown_flaws():
    with pytest.raises(ValueError, match="unknown flaw"):
        FlawedExpertAgent("nope")
    agent = FlawedExpertAgent("drop_hash")
    assert agent.describe() == {"implementation": "FlawedExpertAgent", "flaw": "drop_hash"}
    with pytest.raises(RuntimeError, match="begin_episode"):
        agent.respond([], [])


# --------------------------------------------------------------------------------------------------
# Communication: what counts as telling the customer a value
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, statuses", [
    ("Order #W1 is delivered, so it cannot be cancelled.", {"delivered"}),
    ("The order is pending, processed, delivered.", {"pending", "processed", "delivered"}),
    ("pending, processed, delivered", {"pending", "processed", "delivered"}),
    ("Only pending orders can be cancelled.", set()),
    ("It cannot be returned because it is not delivered; it is processed.", {"processed"}),
    ("The order was canceled.", {"cancelled"}),
    ("Order #W1 is return requested, so it can't be returned again.", {"return requested"}),
    ("The status is Delivered.", {"delivered"}),
    ("Your parcel is undelivered.", set()),
    ("The order is no longer pending: it is cancelled.", {"cancelled"}),
])
def test_asserted_statuses(text, statuses):
    assert asserted_statuses(text) == statuses


def test_amounts_and_order_ids_in_text():
    assert amounts_in("You get 45.37 back.") == [45.37]
    assert amounts_in("Refund $45.3, fee $12, order 1234567, zip 02134.") == [45.3, 12.0]  # ids and zips are no amounts
    assert amounts_in("The difference is -12.34 (1,234.50 before).") == [12.34, 1234.5]
    assert amounts_in("Version v1.2.3 and order #W1234567.") == []
    known = ["#W1234567", "#W7654321", "#W2345678"]
    assert order_ids_in("Orders #W1234567 and 7654321, not 12345678.", known) == {"#W1234567", "#W7654321"}
    assert order_ids_in("Item 234567 and zip 02345.", known) == set()


def test_one_honest_reply_tells_a_value_only_when_it_asserts_no_other():
    assert reply_tells_amount("You will get 45.37 back to paypal_1234567.", 45.37)
    assert reply_tells_amount("You pay $12.3 more.", -12.30)  # sign ignored
    assert not reply_tells_amount("You will get 45.73 back.", 45.37)
    many = "The refund is one of 12.34, 45.37, 99.99 or 101.01."
    assert not reply_tells_amount(many, 45.37)  # listing amounts, one of them right, tells nothing
    legit = LegitValues(order_amounts={"#W1": [45.37]}, order_ids={"#W1"}, known_order_ids={"#W1"})
    assert not Replies([Reply(0, many, "#W1")], [], legit).tells_amount(45.37)
    two = "You get 45.37 back for the lamp and pay 12.34 more for the mug."
    assert not reply_tells_amount(two, 45.37) and reply_tells_amount(two, 45.37, allowed=[12.34])
    assert reply_tells_status("Order #W1 is delivered, so it cannot be cancelled.", "delivered")
    assert not reply_tells_status("It is pending, processed, delivered or cancelled.", "delivered")
    assert not reply_tells_status("Only pending orders can be cancelled.", "pending")
    # Only after the call it reports on, and naming the order when asked to.
    legit = LegitValues(order_statuses={"#W1234567": {"delivered"}}, order_ids={"#W1234567"},
                        known_order_ids={"#W1234567"})
    replies = Replies([Reply(3, "Order #W1234567 is delivered.", "#W1234567")], [], legit)
    assert replies.tells_status("delivered", after=2, order_id="#W1234567")
    assert not replies.tells_status("delivered", after=3) and not replies.tells_status("delivered", after=None)
    assert not replies.tells_status("delivered", order_id="#W7654321")


def test_a_wrong_assertion_voids_the_request_it_is_about():
    """Guessing across turns never pays: a reply asserting a wrong status or amount costs the request its
    communication credit, even when another reply tells the right value (the issue's measured hole)."""
    legit = LegitValues(order_statuses={"#W1": {"delivered"}, "#W2": {"pending", "cancelled"}},
                        order_amounts={"#W2": [45.37]}, order_ids={"#W1", "#W2"}, known_order_ids={"#W1", "#W2", "#W9"})
    right = Reply(5, "Order #W1 is delivered, so it cannot be cancelled.", "#W1")
    assert not Replies([right], [], legit).voided("#W1")
    for wrong in (Reply(4, "Is it processed?", "#W1"),  # a question asserting a guess: about the request it is on
                  Reply(4, "Order #W1 is pending.", "#W2"),  # names the order, whatever request the customer is on
                  Reply(4, "Order #W2 is delivered.", "#W1"),  # delivered is #W1's status, not #W2's: voids both
                  Reply(4, "You will get 12.34 back.", "#W1"),  # an amount that is no amount of this request
                  Reply(4, "Order #W9 is delivered.", "#W1")):  # an order that is not the customer's
        replies = Replies([wrong, right], [], legit)
        assert replies.voided("#W1"), wrong
        assert replies.tells_status("delivered", after=0, order_id="#W1")  # the right report still tells ...
    # ... and a wrong reply about another request, sent while the customer was on it, leaves #W1 alone.
    replies = Replies([Reply(4, "You will get 45.00 back.", "#W2"), right], [], legit)
    assert replies.voided("#W2") and not replies.voided("#W1")
    # The request's own values are no wrong assertion: before and after the write, the amount to tell.
    replies = Replies([Reply(1, "Order #W2 is pending.", "#W2"), Reply(3, "It is cancelled; 45.37 back.", "#W2")],
                      [], legit)
    assert not replies.voided("#W2") and replies.tells_amount(45.37, after=2)


def test_only_a_statement_the_customer_read_reports():
    """A question the customer answered (the order named in a confirmation, "is it delivered?") reports nothing."""
    legit = LegitValues(order_statuses={"#W1": {"delivered"}}, order_ids={"#W1"}, known_order_ids={"#W1"})
    asked = Reply(3, "Order #W1 is delivered. Is there anything else about it?", "#W1", question=True)
    assert not Replies([asked], [], legit).tells_status("delivered", order_id="#W1")
    assert Replies([Reply(3, asked.text, "#W1")], [], legit).tells_status("delivered", order_id="#W1")


def looked_up_order(seed: int = 3) -> tuple[str, str]:
    """(get_order_details output, order address) for an order of task `seed`."""
    task = make_task(seed)
    order = task.db.orders[task.user.orders[0]]
    output = StorefrontTools(task.db.clone()).call("get_order_details", {"order_id": order.order_id})
    return output, order.address.text()


def test_raw_dumps_tell_nothing():
    output, address = looked_up_order()
    assert is_raw_dump(output, [output])  # the pasted output of get_order_details
    assert is_raw_dump(f"Here you go: {output[:80]}", [])  # JSON keys alone make a dump
    status = json.loads(output)["status"]
    oid = json.loads(output)["order_id"]
    legit = LegitValues(order_statuses={oid: {status}}, order_ids={oid}, known_order_ids={oid})
    assert not Replies([Reply(0, output, oid)], [output], legit).tells_status(status)
    honest = (f"Your order is {status}. It ships to {address}; if that is not right, tell me the new address "
              "and I will look at what can be done for you today.")
    assert len(honest) >= 120 and address in output
    assert not is_raw_dump(honest, [output])  # quoting an address from the output is not a dump
    assert Replies([Reply(0, honest, oid)], [output], legit).tells_status(status)
    # A copied run of 120+ characters counts wherever it starts, even from an output with no JSON keys.
    plain = " ".join(f"line {i} of a long plain tool output" for i in range(20))
    rng = random.Random(0)
    for _ in range(50):
        start = rng.randrange(0, len(plain) - 130)
        copied = f"{'x' * rng.randrange(0, 70)} {plain[start:start + 120]} done."
        assert is_raw_dump(copied, [plain]), start
        assert not is_raw_dump(copied, ["another output " * 20])


def with_final_statements(transform: Callable[[StorefrontGame, Any, str], str]) -> Responder:
    """The expert, except that each closing statement of a request with a value to tell goes through
    `transform(game, request, statement)`."""

    def respond(game: StorefrontGame) -> str:
        text = game.oracle_response()
        sub = game.current
        if (game.authenticated() and sub is not None and text == sub.statement
                and (sub.tell_status or sub.tell_amount is not None)):
            return transform(game, sub, text)
        return text

    return respond


def paste_last_output(game: StorefrontGame, sub, text: str) -> str:
    return next(m["content"] for m in reversed(game.get_messages()) if m["role"] == "tool")


def add_every_status(game: StorefrontGame, sub, text: str) -> str:
    return f"{text} Possible statuses: {', '.join(ALL_STATUSES)}." if sub.tell_status else text


def add_amounts(game: StorefrontGame, sub, text: str) -> str:
    if sub.tell_amount is None:
        return text
    legit = [abs(s.tell_amount) for s in game.task.sub_requests if s.tell_amount is not None]
    extra = [x for x in (abs(sub.tell_amount) + 1.11, abs(sub.tell_amount) * 2 + 0.37, 9.99)
             if all(abs(x - y) > 0.005 for y in legit)]
    return text + " Other options were " + " and ".join(f"{x:.2f}" for x in extra) + "."


@pytest.mark.parametrize("transform, targets", [
    (None, None),
    (paste_last_output, lambda sub: sub.tell_status or sub.tell_amount is not None),
    (add_every_status, lambda sub: bool(sub.tell_status)),
    (add_amounts, lambda sub: sub.tell_amount is not None),
], ids=["unchanged", "pasted_output", "every_status", "extra_amounts"])
def test_final_statement_must_tell_the_value_honestly(transform, targets):
    game = StorefrontGame()
    spoiled = 0
    for seed in range(150):
        respond = expert if transform is None else with_final_statements(transform)
        summary = play(game, seed, respond)
        touched = targets is not None and any(targets(sub) for sub in game.task.sub_requests)
        if touched:
            assert summary["reward"] == 0.0, (seed, summary["communicate_checks"])
            assert summary["reward_breakdown"] == {"DB": 1.0, "COMMUNICATE": 0.0, "POLICY": 1.0}
            spoiled += 1
        else:
            assert summary["reward"] == 1.0, (seed, summary["communicate_checks"])
    assert transform is None or spoiled >= 30


def test_a_refusal_counts_only_after_the_order_was_looked_up():
    """Saying the right status without looking the order up (e.g. a guess) does not pass."""
    game = StorefrontGame(StorefrontConfig(forbidden_rate=1.0, request_counts=(1,), unknown_order_id_rate=0.0,
                                           kind_weights={"cancel": 1.0, "return": 1.0}))

    def no_look_up(g: StorefrontGame) -> str:
        if not g.authenticated():
            return g.oracle_response()
        return g.current.statement

    for seed in range(40):
        summary = play(game, seed, no_look_up)
        assert summary["reward"] == 0.0 and summary["communicate_checks"][0]["met"] is False, seed
        assert play(game, seed, expert)["reward"] == 1.0


# --------------------------------------------------------------------------------------------------
# Compliance: the policy's procedure, checked end to end
# --------------------------------------------------------------------------------------------------
def plan_agent(*, authenticate: bool = True, look_up: bool = True, confirm: bool = True,
               user_details: bool = True) -> Responder:
    """The expert's plan with parts left out: authentication, the order look-up, the confirmation question, or
    the get_user_details read."""

    def keep(step, sub) -> bool:
        if step.is_confirm:
            return confirm
        if step.name == "get_order_details" and step.arguments["order_id"] == sub.order_id:
            return look_up
        if step.name == "get_user_details":
            return user_details
        return True

    def respond(game: StorefrontGame) -> str:
        if authenticate and not game.authenticated():
            return game.oracle_response()  # asks who the customer is, then looks them up
        sub = game.current
        return game.next_step([step for step in sub.steps if keep(step, sub)]) or sub.statement

    return respond


# Every request allowed (so the DB and COMMUNICATE parts pass whatever the procedure) and every order id known
# (no search, which would look up other requests' orders on the way).
ALLOWED_ONLY = StorefrontConfig(forbidden_rate=0.0, unknown_order_id_rate=0.0)


def writes_of(game: StorefrontGame) -> list[str]:
    return [r.name for r in game.state.tool_calls if r.ok and StorefrontTools.is_write(r.name)]


@pytest.mark.parametrize("left_out, rule", [
    ({"authenticate": False}, "before the user was authenticated"),
    ({"look_up": False}, "without looking it up first"),
    ({"confirm": False}, "without the user's explicit yes right before it"),
], ids=["no_auth", "no_look_up", "no_confirmation"])
def test_each_procedure_rule_voids_the_reward(left_out, rule):
    game = StorefrontGame(ALLOWED_ONLY)
    broken = 0
    for seed in range(100):
        summary = play(game, seed, plan_agent(**left_out))
        writes = writes_of(game)
        gold_writes = [a["name"] for a in game.task.gold_actions if StorefrontTools.is_write(a["name"])]
        assert sorted(writes) == sorted(gold_writes)
        if "look_up" in left_out:  # only writes on an order need a look-up (a default address has none)
            writes = [w for w in writes if w != "modify_user_address"]
        violations = summary["policy_checks"]["violations"]
        on_writes = [v for v in violations if rule in v and v.split(" ", 1)[0] in StorefrontTools.write_tools()]
        assert len(on_writes) == len(writes), (seed, violations)  # one per write (reads before auth add their own)
        assert all(re.match(r"\w+ \(turn \d+\) ", v) for v in violations), violations
        if writes:
            assert summary["reward"] == 0.0, seed
            assert summary["reward_breakdown"] == {"DB": 1.0, "COMMUNICATE": 1.0, "POLICY": 0.0}, seed
            broken += 1
        else:
            assert summary["reward"] == 1.0, seed
    assert broken >= 70


def test_a_write_with_an_id_never_shown_voids_the_reward():
    """Refunding to the customer's gift card without reading their details: the id is right (it is theirs, the DB
    matches the gold) but it was guessed, so the write breaks the policy."""
    config = StorefrontConfig(request_counts=(1,), kind_weights={"return": 1.0}, forbidden_rate=0.0,
                              unknown_order_id_rate=0.0, gift_card_refund_rate=1.0)
    game = StorefrontGame(config)
    checked = 0
    for seed in range(60):
        task = make_task(seed, config)
        (sub,) = task.sub_requests
        method = sub.write.arguments["payment_method_id"]
        order = task.db.orders[sub.order_id]
        if not method.startswith("gift_card_") or method in {p.payment_method_id for p in order.payment_history}:
            continue
        assert task.user.payment_method(method) is not None  # the customer's own gift card
        summary = play(game, seed, plan_agent(user_details=False))
        assert summary["reward_breakdown"] == {"DB": 1.0, "COMMUNICATE": 1.0, "POLICY": 0.0}, seed
        (violation,) = summary["policy_checks"]["violations"]
        assert violation.startswith("return_delivered_order_items (turn ")
        assert violation.endswith(f"uses id(s) {[method]!r} that appeared nowhere earlier in the conversation")
        assert play(game, seed, plan_agent())["reward"] == 1.0  # with the read, the same write is fine
        checked += 1
    assert checked >= 20


def test_without_required_confirmation_the_rule_and_its_check_go():
    strict = StorefrontGame(ALLOWED_ONLY)
    lax = StorefrontGame(StorefrontConfig(forbidden_rate=0.0, unknown_order_id_rate=0.0, require_confirmation=False))
    rule = "explicit yes"
    assert rule in strict.get_system_prompt() and rule not in lax.get_system_prompt()
    assert rule in policy_text(True) and rule not in policy_text(False) and policy_text(True) == POLICY
    for seed in range(60):
        assert play(strict, seed, plan_agent(confirm=False))["reward"] == 0.0
        summary = play(lax, seed, plan_agent(confirm=False))
        assert summary["reward"] == 1.0 and summary["policy_checks"]["violations"] == [], seed
        assert lax.get_messages()[1]["role"] == "user"  # the system prompt comes first
        assert lax.get_messages()[0]["content"] == policy_text(False)


def test_one_yes_covers_one_change():
    """Two writes after a single yes: the second breaks the rule."""
    game = StorefrontGame(StorefrontConfig(forbidden_rate=0.0, request_counts=(0, 1),
                                           kind_weights={"cancel": 1.0}, unknown_order_id_rate=0.0))
    for seed in range(20):
        game.reset(seed)
        task = game.task
        while not game.authenticated():
            game.step(parse_hermes_action(game.oracle_response()))
        for sub in game.subs:
            game.step(parse_hermes_action(tool_call_text("get_order_details", {"order_id": sub.order_id})))
        first, second = (sub.write for sub in game.subs)
        current = game.current.write  # the customer confirms the request they are on, one order at a time
        answer = say(game, f"I will cancel order {current.arguments['order_id']}. Shall I proceed with the cancel?")
        assert answer.startswith("Yes"), answer
        for write in (current, second if current is first else first):
            game.step(parse_hermes_action(tool_call_text(write.name, write.arguments)))
        violations = game.policy_violations()
        assert len(violations) == 1 and violations[0].startswith("cancel_pending_order")
        assert violations[0].endswith("without the user's explicit yes right before it"), (task.task_id, violations)


# --------------------------------------------------------------------------------------------------
# One tool call per turn; a transfer ends the episode
# --------------------------------------------------------------------------------------------------
def test_the_experts_calls_in_one_turn_score_zero():
    """The expert's tool calls made one per turn then its statements pass; the same calls in one turn do not
    (only the first runs; the others get an error and change nothing)."""
    game = StorefrontGame(StorefrontConfig(require_confirmation=False))
    for seed in range(60):
        for batched in (False, True):
            game.reset(seed)
            calls = [tool_call_text(a["name"], a["arguments"]) for a in game.task.gold_actions]
            for text in (["".join(calls)] if batched else calls):
                result = game.step(parse_hermes_action(text))
            for sub in game.subs:
                game.step(parse_hermes_action(sub.statement))
            summary = game.get_summary()
            assert game.done and summary["termination_reason"] == "user_stop"
            if batched:
                assert summary["reward"] == 0.0, seed
                assert summary["tool_errors"] == len(calls) - 1 and len(result.observation_messages) == len(calls)
                assert all(m["content"].startswith("Error: not executed") for m in result.observation_messages[1:])
            else:
                assert summary["reward"] == 1.0 and summary["tool_errors"] == 0, (seed, summary)


def test_transfer_to_a_human_ends_the_episode():
    game = StorefrontGame()
    for seed in range(10):
        game.reset(seed)
        game.step(parse_hermes_action(game.oracle_response()))  # asks who the customer is
        result = game.step(parse_hermes_action(tool_call_text("transfer_to_human_agents", {"summary": "help"})))
        assert result.done and result.reward == 0.0
        assert game.termination_reason == "transfer" and game.get_summary()["termination_reason"] == "transfer"
        assert result.observation_messages[0]["content"] == "Transfer successful"
        with pytest.raises(RuntimeError, match="episode is over"):
            game.step(parse_hermes_action("Hello?"))
    game.reset(0)  # a failed transfer (bad arguments) does not end it
    assert not game.step(parse_hermes_action(tool_call_text("transfer_to_human_agents", {"summary": 1}))).done


# --------------------------------------------------------------------------------------------------
# The scripted customer
# --------------------------------------------------------------------------------------------------
def confirm_text(sub) -> str:
    """The expert's confirmation question for a request (also for a refused one: what it would have asked)."""
    return next(step.text for step in sub.requested if step.is_confirm)


def test_user_simulator_answers_by_rule():
    identity = Identity("Mia", "Chen", "mia.chen12@example.com", "02134", "email")
    cancel = UserRequest(kind="cancel", order_id="#W1234567", order_ref="W1234567",
                         reason_text="I bought it by accident.")
    give_back = UserRequest(kind="return", order_id="#W7654321", order_hint="the one with the lamp",
                            refund_answer="To my gift card, please.", item_names=["lamp"])
    user = UserSimulator(identity, [cancel, give_back], random.Random(0), max_turns=20)
    assert user.respond("Could you confirm your email?") == (user.identity_reply, False)
    assert user.identity_reply in identity.sentences() and identity.email in user.identity_reply
    assert user.revealed_identity
    assert user.respond("Which order do you mean?")[0] in ("It's W1234567.", "The order id is W1234567.")
    assert user.respond("What is the reason for the cancellation?")[0] == "I bought it by accident."
    assert user.respond("Shall I cancel order #W1234567?")[0] in YES_REPLIES
    assert user.respond("Shall I cancel order #W7654321?")[0] == NO_REPLY  # another order
    assert user.respond("Shall I return order #W1234567?")[0] == NO_REPLY  # another kind of request
    assert user.pointer == 0  # questions do not move on
    assert user.respond("Order #W1234567 is cancelled.")[0] in ("Thanks.", "Great, thanks.", "OK, thank you.")
    assert user.pointer == 1
    answer = user.respond("Which order do you mean?")[0]
    assert answer == "I don't remember the order number. It's the one with the lamp."
    assert user.respond("Which payment method should get the refund?")[0] == "To my gift card, please."
    assert user.respond("Which item is it?")[0] == "The lamp."
    assert user.respond("Shall I return the lamp from order #W7654321?")[0] in YES_REPLIES
    text, done = user.respond("The return is requested.")
    assert done and text.endswith(STOP) and user.stopped
    with pytest.raises(RuntimeError, match="already ended"):
        user.respond("Anything else?")
    name_zip = Identity("Mia", "Chen", "mia.chen12@example.com", "02134", "name_zip")
    assert all("Mia Chen" in s and "02134" in s and "email" in s and "@" not in s for s in name_zip.sentences())
    with pytest.raises(ValueError, match="auth"):
        Identity("Mia", "Chen", "m@x.io", "02134", "phone")
    with pytest.raises(ValueError, match="kind"):
        UserRequest(kind="refund")
    with pytest.raises(ValueError, match="at least one request"):
        UserSimulator(identity, [], random.Random(0))


def test_the_same_question_gets_the_same_kind_of_answer():
    game = StorefrontGame()
    asked_other = 0
    for seed in range(80):
        for trial in range(2):
            game.reset(seed, trial=trial)
            identity, sub = game.task.identity, game.current
            answer = say(game, "Could you confirm your email?")
            assert answer in identity.sentences(), (seed, trial, answer)
            assert (identity.email in answer) == (identity.auth == "email") and (identity.zip in answer) != (
                identity.auth == "email")
            if sub.order_id:
                answer = say(game, "Which order do you mean?")
                ref = sub.user.order_ref
                if ref:
                    assert answer in (f"It's {ref}.", f"The order id is {ref}."), (seed, answer)
                else:
                    assert answer == f"I don't remember the order number. It's {sub.user.order_hint}.", (seed, answer)
            assert say(game, confirm_text(sub)) in YES_REPLIES, (seed, trial)
            for other in game.subs[1:]:
                if (sub.kind, other.kind) == ("modify_user_address", "modify_order_address"):
                    continue  # a known bug: test_a_question_about_another_orders_address_gets_a_no
                assert say(game, confirm_text(other)) == NO_REPLY, (seed, trial, sub.kind, other.kind)
                asked_other += 1
            assert game.user.pointer == 0 and not game.done
    assert asked_other >= 60


def test_a_question_about_another_orders_address_gets_a_no():
    game = StorefrontGame()
    game.reset(75, trial=0)
    current, other = game.subs[0], game.subs[1]
    assert (current.kind, other.kind) == ("modify_user_address", "modify_order_address")
    say(game, "Could you confirm your email?")
    assert say(game, confirm_text(other)) == NO_REPLY


def test_trials_vary_the_wording_not_the_task():
    game = StorefrontGame()
    n_seeds, varied_openings, varied_identities, reordered = 30, 0, 0, 0
    for seed in range(n_seeds):
        openings, identities, orders, tasks, gold = set(), set(), set(), set(), set()
        for trial in range(4):
            messages = game.reset(seed, trial=trial)
            assert messages[0]["role"] == "system" and messages[1]["role"] == "user"
            opening = messages[1]["content"]
            assert all(sub.clause in opening for sub in game.subs)
            positions = [opening.index(sub.clause) for sub in game.subs]
            assert positions == sorted(positions)  # listed in the episode's order
            openings.add(opening)
            identities.add(say(game, "What is your email?"))
            orders.add(tuple(sub.kind + sub.order_id for sub in game.subs))
            tasks.add(json.dumps(game.task.to_json(), sort_keys=True))
            gold.add(game.gold_hash())
        assert len(tasks) == 1 and len(gold) == 1, seed  # the same task and the same gold DB in every trial
        assert len({(o, i) for o in openings for i in identities}) >= 2, seed
        varied_openings += len(openings) >= 2
        varied_identities += len(identities) >= 2
        reordered += len(orders) >= 2
    assert varied_openings >= 0.8 * n_seeds and varied_identities >= 0.8 * n_seeds
    assert reordered >= 5  # customers with several requests list them in another order in some trials


def test_same_seed_and_trial_give_the_same_conversation():
    differs = 0
    for seed in range(15):
        game = StorefrontGame()
        play(game, seed, expert, trial=1)
        first = game.get_messages()
        play(game, seed, expert, trial=1)
        assert game.get_messages() == first
        other = StorefrontGame()
        play(other, seed, expert, trial=1)
        assert other.get_messages() == first
        play(other, seed, expert, trial=2)
        differs += other.get_messages() != first
    assert differs >= 12


def test_user_gives_up_after_max_turns():
    game = StorefrontGame(StorefrontConfig(max_user_turns=3, max_steps=20))
    game.reset(1)
    for _ in range(2):
        assert not game.step(parse_hermes_action("What is your email?")).done
    last = game.step(parse_hermes_action("What is your email?"))
    assert last.done and last.observation_messages[0]["content"].endswith(STOP)
    assert game.termination_reason == "user_stop" and last.reward == 0.0


# --------------------------------------------------------------------------------------------------
# The game loop: errors, malformed actions, limits, registry
# --------------------------------------------------------------------------------------------------
def test_tool_errors_become_tool_messages_and_the_episode_goes_on():
    game = StorefrontGame()
    game.reset(5)
    contents = []
    for text in ('<tool_call>{"name": "get_order_details", "arguments": {"order_id": "W1"}}</tool_call>',
                 '<tool_call>{"name": "get_order_details", "arguments": {"order_id": 1}}</tool_call>',
                 '<tool_call>{"name": "refund_everything", "arguments": {}}</tool_call>'):
        result = game.step(parse_hermes_action(text))
        contents += [m["content"] for m in result.observation_messages]
        assert not result.done
    assert contents[0] == "Error: order 'W1' not found"
    assert contents[1].startswith("Error: argument 'order_id' of tool 'get_order_details' must be a JSON string")
    assert contents[2].startswith("Error: unknown tool 'refund_everything'; available tools: find_user_id_by_email")
    assert game.get_summary()["tool_errors"] == 3
    assert play(game, 5, expert)["reward"] == 1.0  # the expert still solves it after a fresh reset


GARBAGE = [
    "", "   ", "<tool_call>", "</tool_call>", "<tool_call>{}</tool_call>", "<tool_call>[1, 2]</tool_call>",
    '<tool_call>{"name": "cancel_pending_order", "arguments": "not json"}</tool_call>',
    '<tool_call>{"name": "cancel_pending_order", "arguments": [1]}</tool_call>',
    '<tool_call>{"name": "cancel_pending_order", "arguments": {"order_id": null, "reason": 3}}</tool_call>',
    '<tool_call>{"name": 5}</tool_call>', "<tool_call>{'name': 'x'}</tool_call>", "\x00\x01", "?" * 500,
    '<tool_call>{"name": "modify_user_address", "arguments": {"user_id": "x", "zip": 2134}}</tool_call>',
    "Could you confirm you want me to cancel it?", "What is your email?", "Which order id?", "Why?", "x" * 5000,
]


def test_malformed_and_random_actions_never_raise():
    rng = random.Random(0)
    game = StorefrontGame()
    for seed in range(100):
        game.reset(seed, trial=seed % 3)
        while not game.done:
            text = rng.choice(GARBAGE) if rng.random() < 0.6 else game.oracle_response()
            result = game.step(parse_hermes_action(text))
            assert 0.0 <= result.reward <= 1.0
        summary = game.get_summary()
        assert summary["reward"] in (0.0, 1.0)
        assert summary["termination_reason"] in ("user_stop", "max_steps", "too_many_errors")
        assert all(len(m["content"] or "") <= 4100 for m in game.get_messages())  # long turns are cut


def test_format_error_message_and_limit():
    game = StorefrontGame(StorefrontConfig(max_errors=1))
    game.reset(0)
    first = game.step(parse_hermes_action("<tool_call>{oops</tool_call>"))
    assert first.observation_messages[0]["role"] == "user"
    assert first.observation_messages[0]["content"].startswith("[format error] tool call is not valid JSON")
    second = game.step(parse_hermes_action(""))
    assert second.done and game.termination_reason == "too_many_errors" and second.reward == 0.0
    with pytest.raises(RuntimeError, match="episode is over"):
        game.step(parse_hermes_action("Hello."))


def test_max_steps_ends_the_episode():
    game = StorefrontGame(StorefrontConfig(max_steps=3, max_user_turns=16))
    game.reset(2)
    for _ in range(3):
        result = game.step(parse_hermes_action(tool_call_text("get_user_details", {"user_id": "x"})))
    assert result.done and game.termination_reason == "max_steps" and result.reward == 0.0


def test_rewards_are_floats_in_unit_interval_before_and_after():
    game = StorefrontGame()
    game.reset(4)
    early = game.get_summary()
    assert isinstance(early["reward"], float) and early["steps"] == 0
    assert early["reward"] == 0.0  # nothing done yet: every task has a write or a value to tell
    play(game, 4, expert)
    assert game.get_summary()["reward"] == 1.0
    with pytest.raises(RuntimeError, match="reset"):
        StorefrontGame().get_summary()
    with pytest.raises(ValueError, match="trial"):
        game.reset(4, trial=-1)


def test_db_match_agrees_with_db_hash():
    game = StorefrontGame()
    for flaw in [None, *FLAWS]:
        for seed in range(25):
            play(game, seed, expert if flaw is None else (lambda g, f=flaw: flawed_response(g, f)))
            assert game.db_match() == (db_hash(game.toolkit.db) == game.gold_hash())


def test_registry_entry():
    spec = get_game("storefront")
    assert spec.capability == "" and spec.target == "" and spec.system_prompt == POLICY
    assert len(POLICY) <= 800  # short: the CPU demo's 2M-parameter model has to learn it
    game = spec.make(request_counts=(0.0, 1.0), kind_weights={"cancel": 1.0})
    assert len(game.get_tool_schemas()) == 11  # schemas are available before reset
    game.reset(0)
    assert game.task.request_kinds == ["cancel", "cancel"]
    assert [s["function"]["name"] for s in game.get_tool_schemas()] == StorefrontTools.tool_names()
    assert StorefrontTools.write_tools() == {"cancel_pending_order", "modify_pending_order_address",
                                             "return_delivered_order_items", "exchange_delivered_order_items",
                                             "modify_user_address"}
    assert StorefrontTools.auth_tools() == {"find_user_id_by_email", "find_user_id_by_name_zip"}


# --------------------------------------------------------------------------------------------------
# Results files, the CLI and the summarizer
# --------------------------------------------------------------------------------------------------
def test_results_roundtrip_through_summarize(tmp_path: Path):
    from pipeline.summarize import main as summarize_main

    expert_sims, tasks = run_cli.run_benchmark(ExpertAgent(), 8, seed=3, progress=False)
    flawed_sims, _ = run_cli.run_benchmark(FlawedExpertAgent("forget_requests"), 8, seed=3, progress=False)
    for sim in flawed_sims:  # distinct ids within one file
        sim["id"] = "flawed-" + sim["id"]
    sims = expert_sims + flawed_sims
    path = write_results(tmp_path / "results.json", sims, tasks, {"benchmark": "storefront"})
    data = load_results(path)
    assert data["simulations"] == json.loads(json.dumps(sims)) and data["info"] == {"benchmark": "storefront"}
    expected_passed = sum(s["reward_info"]["reward"] == 1.0 for s in sims)
    assert 8 < expected_passed < 16  # the flawed agent failed some
    out = tmp_path / "summary.jsonl"
    assert summarize_main([str(path), "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 16 and sum(r["passed"] for r in records) == expected_passed
    assert all(r["n_turns"] >= 3 for r in records)


def test_results_reader_accepts_real_tau2_and_rejects_bad_files(tmp_path: Path):
    real = Path(__file__).parent / "fixtures/real/tau2-bench/gpt-4.1_retail_defautl_gpt-4.1_1trials.json"
    data = load_results(real)
    assert pass_rates(data["simulations"])["all"]["passed"] == 34
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"simulations": [{"task_id": "1", "messages": [], "reward_info": {"reward": "1"}}]}))
    with pytest.raises(InputError, match="bad.json.*reward"):
        load_results(bad)
    bad.write_text("[]")
    with pytest.raises(InputError, match="simulations"):
        load_results(bad)
    with pytest.raises(ValueError, match="reward"):
        make_simulation(task_id="t", messages=[], reward_info={"reward": 1.5}, termination_reason="x")
    with pytest.raises(ValueError, match="duplicate"):
        sim = make_simulation(task_id="t", messages=[], reward_info={"reward": 1.0}, termination_reason="x")
        write_results(tmp_path / "dup.json", [sim, sim])
    assert not (tmp_path / "dup.json").exists()


def test_cli_expert_run_writes_request_kinds_and_passes_everything(tmp_path: Path, capsys):
    out = tmp_path / "r.json"
    assert run_cli.main(["--agent", "expert", "--tasks", "20", "--seed", "2", "--out", str(out), "--trials", "2",
                         "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"^all\s+40\s+40\s+1\.000\s+1\.000\s+1\.000$", printed, re.MULTILINE), printed
    data = load_results(out)
    sims = data["simulations"]
    assert len(sims) == 40 and len(data["tasks"]) == 20
    assert all(s["reward_info"]["reward"] == 1.0 for s in sims)
    for sim in sims:
        assert sim["request_kinds"] and set(sim["request_kinds"]) <= set(REQUEST_KINDS)
        assert sim["request_kinds"] == sim["reward_info"]["request_kinds"]
    tasks = {t["id"]: t for t in data["tasks"]}
    assert all(tasks[s["task_id"]]["request_kinds"] == s["request_kinds"] for s in sims)
    assert {s["trial"] for s in sims} == {0, 1}
    assert {len(s["request_kinds"]) for s in sims} == {1, 2, 3}  # 20 tasks of the default mix
    for kind in REQUEST_KINDS:  # every kind gets its own pass-rate line
        assert re.search(rf"^{kind}\s+\d+\s+\d+\s+1\.000\s+1\.000\s+1\.000$", printed, re.MULTILINE), kind
    assert data["info"]["environment_info"]["policy"] == POLICY
    assert data["info"]["kinds"] == list(StorefrontConfig().kind_weights)


def test_hidden_capability_record_stays_out_of_task_json_and_results_files(tmp_path: Path):
    words = [*CAPABILITIES, "capabilit"]
    for seed in range(50):
        task = make_task(seed)
        assert task.capabilities  # there is a record ...
        text = json.dumps(task.to_json())
        assert not any(w in text for w in words), (seed, [w for w in words if w in text])  # ... but not here
    for agent in ("expert", "flawed:forget_requests"):
        out = tmp_path / f"{agent.replace(':', '_')}.json"
        assert run_cli.main(["--agent", agent, "--tasks", "12", "--trials", "2", "--out", str(out),
                             "--no-progress"]) == 0
        text = out.read_text()
        assert not any(w in text for w in words), [w for w in words if w in text]


def test_cli_kinds_restricts_the_mix(tmp_path: Path):
    out = tmp_path / "k.json"
    assert run_cli.main(["--agent", "expert", "--tasks", "15", "--kinds", "cancel,modify_user_address",
                         "--out", str(out), "--no-progress"]) == 0
    data = load_results(out)
    seen = {k for s in data["simulations"] for k in s["request_kinds"]}
    assert seen == {"cancel", "modify_user_address"}
    assert data["info"]["kinds"] == ["cancel", "modify_user_address"]
    assert all(s["reward_info"]["reward"] == 1.0 for s in data["simulations"])


def test_cli_bad_input(tmp_path: Path, capsys):
    for argv, message in [
        (["--kinds", "cancel,nope"], "unknown request kind nope"),
        (["--kinds", ","], "(none given)"),
        (["--tasks", "0"], "--tasks must be >= 1"),
        (["--trials", "0"], "--trials must be >= 1"),
        (["--temperature", "-1"], "--temperature"),
        (["--temperature", "nan"], "--temperature"),
        (["--agent", "robot"], "bad agent spec"),
        (["--agent", f"hf:{tmp_path / 'missing'}"], "not found"),
        (["--agent", "vllm:http://localhost:1"], "tokenizer"),
        (["--agent", "flawed:nope"], "unknown flaw"),
    ]:
        bad_out = tmp_path / "bad.json"
        args = {"--agent": "expert", "--tasks": "4", "--out": str(bad_out)}
        args.update(dict(zip(argv[::2], argv[1::2])))
        assert play_cli.main([x for kv in args.items() for x in kv] + ["--no-progress"]) == 2, argv
        assert message in capsys.readouterr().err, argv
        assert not bad_out.exists()
    # the environment's own CLI loads no models: it points to train.play for a model agent
    assert run_cli.main(["--agent", f"hf:{tmp_path}", "--tasks", "1", "--out", str(tmp_path / "r.json")]) == 2
    assert "python -m train.play" in capsys.readouterr().err


class SeedRecorder(ExpertAgent):
    """The expert, noting the seed each episode's sampling would use."""

    def __init__(self) -> None:
        super().__init__()
        self.seeds: list[int | None] = []

    def begin_episode(self, game, seed=None) -> None:
        super().begin_episode(game, seed)
        self.seeds.append(seed)


def test_trials_of_a_task_sample_with_different_seeds():
    # With --trials K and temperature > 0, one agent seed for every trial replayed trial 0 K times.
    agent = SeedRecorder()
    sims, _ = run_cli.run_benchmark(agent, 3, seed=5, trials=3, progress=False)
    assert len(agent.seeds) == 9
    for task in range(3):
        trial_seeds = agent.seeds[3 * task:3 * task + 3]
        assert len(set(trial_seeds)) == 3, f"task {task}: trials sampled with seeds {trial_seeds}"
        assert trial_seeds[0] == sims[3 * task]["seed"]  # trial 0 keeps the task's seed
        assert [s["trial"] for s in sims[3 * task:3 * task + 3]] == [0, 1, 2]
    assert all(sim["reward_info"]["reward"] == 1.0 for sim in sims)


def test_kind_pass_rates_count_a_task_under_each_of_its_kinds():
    sims = [{"task_id": "a", "request_kinds": ["cancel", "return"], "reward_info": {"reward": 1.0}},
            {"task_id": "b", "request_kinds": ["cancel", "cancel"], "reward_info": {"reward": 0.0}},
            {"task_id": "c", "request_kinds": ["exchange"], "reward_info": {"reward": 0.0}}]
    hat = run_cli.pass_hat_k_by_kind(sims, 1)
    rows = {line.split()[0]: line.split()[1:3] for line in run_cli.format_table(sims, hat, 1).splitlines()[1:]}
    assert rows["cancel"] == ["1", "2"]  # a task holding two cancels counts once
    assert rows["return"] == ["1", "1"] and rows["exchange"] == ["0", "1"] and rows["all"] == ["1", "3"]


# --------------------------------------------------------------------------------------------------
# Model-backed agents
# --------------------------------------------------------------------------------------------------
def test_hf_agent_plays_with_the_tiny_model(tiny_model_dir: Path, tmp_path: Path):
    agent = parse_agent_spec(f"hf:{tiny_model_dir}", max_new_tokens=24)
    assert isinstance(agent, HFAgent)
    game = StorefrontGame()
    messages = game.reset(0)
    agent.begin_episode(game, seed=0)
    text = agent.respond(messages, game.get_tool_schemas())
    assert isinstance(text, str) and "<|im_end|>" not in text
    assert agent.respond(messages, game.get_tool_schemas()) == text  # greedy is deterministic
    # With a (fresh, zero-effect) LoRA adapter: loaded through PEFT, same greedy text as the base model.
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj", "v_proj"])).save_pretrained(tmp_path / "lora")
    adapted = parse_agent_spec(f"hf:{tiny_model_dir}:{tmp_path / 'lora'}", max_new_tokens=24)
    assert isinstance(adapted.model, PeftModel)
    assert adapted.respond(messages, game.get_tool_schemas()) == text  # LoRA B starts at zero
    out = tmp_path / "hf.json"
    assert play_cli.main(["--agent", f"hf:{tiny_model_dir}", "--tasks", "2", "--out", str(out), "--no-progress",
                         "--max-new-tokens", "16", "--temperature", "1.0"]) == 0
    sims = load_results(out)["simulations"]
    assert len(sims) == 2 and all(0.0 <= s["reward_info"]["reward"] <= 1.0 for s in sims)


def test_an_hf_agent_out_of_context_ends_the_episode_where_it_is(tiny_model_dir: Path):
    from benchmarks.agents import ContextFull
    from benchmarks.storefront.run import play_episode

    agent = parse_agent_spec(f"hf:{tiny_model_dir}", max_new_tokens=24)
    game = StorefrontGame()
    messages = game.reset(0)
    prompt_tokens = len(agent.prompt_ids(render_prompt(agent.tokenizer, messages, game.get_tool_schemas())))
    agent.max_positions = prompt_tokens + 3  # room for three new tokens: generation stops there, not past it
    text = agent.respond(messages, game.get_tool_schemas())
    assert len(agent.tokenizer(text, add_special_tokens=False)["input_ids"]) <= 3
    agent.max_positions = prompt_tokens  # no room: positions past the model's context are not its trained ones
    with pytest.raises(ContextFull, match=f"the conversation is {prompt_tokens} tokens"):
        agent.respond(messages, game.get_tool_schemas())
    messages, summary = play_episode(game, agent, seed=0)  # the runner ends the episode there and scores it
    assert summary["termination_reason"] == "context_full" and summary["steps"] == 0 and summary["reward"] == 0.0


class _FlakyCompletions(BaseHTTPRequestHandler):
    """A stand-in vLLM server: the first `failures` completion requests get HTTP 500."""

    failures = 2
    seen: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server API)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        if len(type(self).seen) <= type(self).failures:
            self.send_response(500)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error": {"message": "boom"}}')
            return
        answer = {"id": "c", "object": "text_completion", "created": 0, "model": body["model"],
                  "choices": [{"index": 0, "text": "Hello there.", "finish_reason": "stop", "logprobs": None}]}
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(answer).encode())

    def do_GET(self) -> None:  # noqa: N802 (http.server API): the served models, listed once by the agent
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"object": "list", "data": [{"id": "tiny", "owned_by": "vllm"}]}).encode())

    def log_message(self, *args: Any) -> None:
        pass


def test_vllm_agent_retries_5xx_then_fails_loudly(tiny_model_dir: Path):
    server = HTTPServer(("127.0.0.1", 0), _FlakyCompletions)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        delays: list[float] = []
        _FlakyCompletions.failures, _FlakyCompletions.seen = 2, []
        agent = VLLMAgent(url, "tiny", tiny_model_dir, timeout_s=10.0, sleep=delays.append)
        game = StorefrontGame()
        messages = game.reset(0)
        assert agent.respond(messages, game.get_tool_schemas()) == "Hello there."
        # bounded exponential backoff with full jitter: wait k is drawn from [0, 1 s x 2^k]
        assert len(delays) == 2 and 0 <= delays[0] <= 1.0 and 0 <= delays[1] <= 2.0 and len(_FlakyCompletions.seen) == 3
        request = _FlakyCompletions.seen[-1]
        assert request["prompt"].endswith("<|im_start|>assistant\n") and POLICY.splitlines()[0] in request["prompt"]
        assert "<|im_end|>" in request["stop"]
        _FlakyCompletions.failures, _FlakyCompletions.seen = 100, []
        with pytest.raises(RuntimeError, match="failed after 6 attempts"):
            agent.respond(messages, game.get_tool_schemas())
    finally:
        server.shutdown()
        server.server_close()
    # Nothing listens now: the agent lists the served models first, so it fails before any episode.
    with pytest.raises(RuntimeError, match="list models failed after 6 attempts: (APIConnection|APITimeout)Error"):
        VLLMAgent(url, "tiny", tiny_model_dir, timeout_s=2.0, sleep=lambda s: None)


def test_cli_config_files_set_the_mix_and_are_saved_with_the_results(tmp_path: Path, capsys):
    repo = Path(__file__).resolve().parents[1]
    default = run_cli.load_config(str(repo / "configs/storefront/default.yaml"))
    assert default == StorefrontConfig()  # the shipped YAML is the dataclass's defaults, spelled out
    out = tmp_path / "demo.json"
    assert run_cli.main(["--agent", "expert", "--tasks", "12", "--config", str(repo / "configs/storefront/cpu_demo.yaml"),
                         "--out", str(out), "--no-progress"]) == 0
    data = load_results(out)
    assert data["info"]["config"]["order_id_digits"] == 3 and data["info"]["config"]["short_emails"] is True
    assert all(re.fullmatch(r"#W\d{3}", t["evaluation_criteria"]["actions"][1]["arguments"].get("order_id", "#W000"))
               for t in data["tasks"] if len(t["evaluation_criteria"]["actions"]) > 1)
    assert all(s["reward_info"]["reward"] == 1.0 for s in data["simulations"])
    for text, message in [("forbiden_rate: 0.2\n", "forbiden_rate is not a field of StorefrontConfig"),
                          ("forbidden_rate: 2\n", "StorefrontConfig.forbidden_rate must be a number in [0, 1]"),
                          ("- a\n", "mapping")]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        assert run_cli.main(["--agent", "expert", "--tasks", "2", "--config", str(bad), "--out",
                             str(tmp_path / "never.json"), "--no-progress"]) == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "never.json").exists()
