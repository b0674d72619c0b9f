"""The storefront benchmark: DB, tools, tasks, user simulator, game, expert, flaws, results, agents, CLI."""
from __future__ import annotations

import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from benchmarks.agents import ExpertAgent, HFAgent, VLLMAgent, parse_agent_spec
from benchmarks.results import load_results, make_simulation, pass_rates, write_results
from benchmarks.storefront import run as run_cli
from benchmarks.storefront.db import StoreDB, db_hash, generate_db
from benchmarks.storefront.env import StorefrontConfig, StorefrontGame, mentions
from benchmarks.storefront.flaws import FLAW_FAMILY, FlawedExpertAgent, flawed_response
from benchmarks.storefront.policy import POLICY
from benchmarks.storefront.tasks import FAMILIES, family_for_seed, make_task
from benchmarks.storefront.tools import StorefrontTools
from benchmarks.storefront.user_sim import STOP
from benchmarks.tooling import dump_compact
from game_registry import get_game, parse_hermes_action
from pipeline._io import InputError

SEEDS_PER_FAMILY = 200


def game_for(family: str) -> StorefrontGame:
    return StorefrontGame(StorefrontConfig(families=(family,)))


def play(game: StorefrontGame, seed: int, respond) -> dict[str, Any]:
    """Play one episode with `respond(game) -> text`; return the summary."""
    game.reset(seed)
    while not game.done:
        game.step(parse_hermes_action(respond(game)))
    return game.get_summary()


def expert(game: StorefrontGame) -> str:
    return game.oracle_response()


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
        assert order.order_id.startswith("#W") and len(order.order_id) == 9
        assert order.user_id in first.users and order.order_id in first.users[order.user_id].orders
        assert round(order.payment_history[0].amount * 100) % 10  # amounts print the same in JSON and 2-dp
    for user in first.users.values():
        assert all(p.id.split("_")[-1].isdigit() and len(p.id.split("_")[-1]) == 7 for p in user.payment_methods)
        assert isinstance(user.address.zip, str) and len(user.address.zip) == 5
    with pytest.raises(ValueError, match="n_products"):
        generate_db(random.Random(0), n_products=50)


@pytest.fixture
def shop() -> tuple[StorefrontTools, Any, Any]:
    task = make_task(11, "nested_field")
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
    ("get_product_details", {"product_id": "0"}, "product '0' not found"),
    ("cancel_pending_order", {"order_id": "#W0000000", "reason": "no longer needed"}, "not found"),
    ("cancel_pending_order", {"order_id": "ORDER", "reason": "changed my mind"}, "must be one of"),
    ("return_delivered_order_items", {"order_id": "ORDER", "item_ids": ["000000"], "payment_method_id": "PM"},
     "item '000000' is not in order"),
    ("return_delivered_order_items", {"order_id": "ORDER", "item_ids": [], "payment_method_id": "PM"},
     "item_ids is empty"),
    ("return_delivered_order_items", {"order_id": "ORDER", "item_ids": "ITEM", "payment_method_id": "PM"},
     "must be a JSON array"),
    ("return_delivered_order_items", {"order_id": "ORDER", "item_ids": ["ITEM"], "payment_method_id": "paypal_1"},
     "payment method 'paypal_1' not found for user"),
    ("exchange_delivered_order_items", {"order_id": "ORDER", "item_ids": ["ITEM"], "new_item_ids": ["999999"],
                                        "payment_method_id": "PM"}, "item '999999' not found"),
    ("exchange_delivered_order_items", {"order_id": "ORDER", "item_ids": ["ITEM"], "new_item_ids": [],
                                        "payment_method_id": "PM"}, "new_item_ids has 0 ids"),
    ("modify_user_address", {"user_id": "nobody", "address1": "a", "address2": "", "city": "c", "state": "s",
                             "country": "USA", "zip": "01234"}, "user 'nobody' not found"),
])
def test_write_and_read_tools_refuse_bad_ids(shop, name, arguments, message):
    tools, task, user = shop
    sub = task.sub_requests[0]
    order = task.db.orders[sub.order_id]
    values = {"ORDER": sub.order_id, "ITEM": order.items[0].item_id, "PM": user.payment_methods[0].id}
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


def test_tools_do_not_enforce_the_policy():
    """Cancelling a delivered order works at the tool level: following the policy is the agent's job."""
    task = make_task(11, "nested_field")
    tools = StorefrontTools(task.db.clone())
    order_id = task.sub_requests[0].order_id
    assert tools.db.orders[order_id].status == "delivered"
    receipt = json.loads(tools.call("cancel_pending_order", {"order_id": order_id, "reason": "ordered by mistake"}))
    assert receipt["status"] == "cancelled" and tools.db.orders[order_id].payment_history[-1].transaction_type == "refund"


def test_exchange_checks_product_and_gift_card_balance():
    for seed in range(200):
        task = make_task(seed, "nested_field")
        if task.sub_requests[0].kind == "exchange":
            break
    else:
        pytest.fail("no exchange task in 200 nested_field seeds")
    tools = StorefrontTools(task.db.clone())
    order = tools.db.orders[task.sub_requests[0].order_id]
    item = order.items[0]
    other_product = next(p for p in tools.db.products.values() if p.product_id != item.product_id)
    with pytest.raises(ValueError, match="not a variant of item"):
        tools.call("exchange_delivered_order_items", {"order_id": order.order_id, "item_ids": [item.item_id],
                                                      "new_item_ids": [other_product.variants[0].item_id],
                                                      "payment_method_id": order.payment_history[0].payment_method_id})
    user = tools.db.users[order.user_id]
    gift = next((p for p in user.payment_methods if p.source == "gift_card"), None)
    if gift is not None:
        gift.balance = 0.0
        dearer = [v for v in tools.db.products[item.product_id].variants if v.price > item.price and v.available]
        if dearer:
            with pytest.raises(ValueError, match="does not cover"):
                tools.call("exchange_delivered_order_items", {"order_id": order.order_id, "item_ids": [item.item_id],
                                                              "new_item_ids": [dearer[0].item_id],
                                                              "payment_method_id": gift.id})


# --------------------------------------------------------------------------------------------------
# Tasks and determinism
# --------------------------------------------------------------------------------------------------
def test_tasks_are_deterministic_per_seed():
    for seed in range(40):
        a, b = make_task(seed), make_task(seed)
        assert a.family == family_for_seed(seed)
        assert db_hash(a.db) == db_hash(b.db) and a.opening == b.opening and a.gold_actions == b.gold_actions
        c = make_task(seed, a.family)  # naming the seed's own family gives the same task
        assert db_hash(c.db) == db_hash(a.db) and c.to_json() == a.to_json()
    assert make_task(1, "compound").opening != make_task(2, "compound").opening
    assert {family_for_seed(s) for s in range(100)} == set(FAMILIES)
    with pytest.raises(ValueError, match="unknown storefront family"):
        make_task(0, "nope")


def test_same_seed_gives_same_conversation():
    for seed in range(20):
        game = StorefrontGame()
        play(game, seed, expert)
        first = game.get_messages()
        play(game, seed, expert)
        assert game.get_messages() == first
        other = StorefrontGame()
        play(other, seed, expert)
        assert other.get_messages() == first


def test_family_shapes():
    for seed in range(60):
        pre = make_task(seed, "precondition")
        (sub,) = pre.sub_requests
        assert sub.kind in ("cancel", "modify_order_address")
        assert sub.allowed == (sub.status == "pending")
        assert bool(sub.communicate) == (not sub.allowed)
        writes = [a for a in pre.gold_actions if StorefrontTools.is_write(a["name"])]
        assert len(writes) == (1 if sub.allowed else 0)
        comp = make_task(seed, "compound")
        assert 2 <= len(comp.sub_requests) <= 3 and all(s.allowed for s in comp.sub_requests)
        ids = [s.order_id for s in comp.sub_requests if s.order_id]
        assert len(ids) == len(set(ids))
        nested = make_task(seed, "nested_field")
        (sub,) = nested.sub_requests
        assert sub.kind in ("return", "exchange") and len(sub.communicate) == 1
        assert any(a["name"] == "get_order_details" for a in sub.gold)
        fmt = make_task(seed, "arg_format")
        (sub,) = fmt.sub_requests
        if sub.order_id:
            assert sub.order_ref == sub.order_id.removeprefix("#") and sub.order_ref in fmt.opening
        if fmt.auth == "name_zip":
            assert fmt.user.address.zip.startswith("0")


def test_task_json_has_tau2_shape():
    entry = make_task(3).to_json()
    assert entry["id"] == make_task(3).task_id
    assert entry["evaluation_criteria"]["reward_basis"] == ["DB", "COMMUNICATE"]
    assert all({"name", "arguments", "action_id"} <= set(a) for a in entry["evaluation_criteria"]["actions"])
    assert entry["user_scenario"]["instructions"]["reason_for_call"] == make_task(3).opening
    json.dumps(entry)


# --------------------------------------------------------------------------------------------------
# The expert and the flaws
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_expert_solves_every_family(family):
    game = game_for(family)
    turns = []
    for seed in range(SEEDS_PER_FAMILY):
        summary = play(game, seed, expert)
        assert summary["reward"] == 1.0, (family, seed, summary)
        assert summary["termination_reason"] == "user_stop" and summary["tool_errors"] == 0
        assert all(check["action_match"] for check in summary["action_checks"])
        assert game.get_messages()[-1]["content"].endswith(STOP)
        turns.append(summary["steps"])
    assert max(turns) <= game.max_steps - 2  # headroom below the turn limit
    assert 3 <= sum(turns) / len(turns) <= 9


@pytest.mark.parametrize("flaw, family", sorted(FLAW_FAMILY.items()))
def test_each_flaw_fails_its_family(flaw, family):
    game = game_for(family)
    rewards = []
    for seed in range(SEEDS_PER_FAMILY):
        summary = play(game, seed, lambda g: flawed_response(g, flaw))
        rewards.append(summary["reward"])
        task = game.task
        sub = task.sub_requests[0]
        if flaw == "skip_status_check":
            assert summary["reward"] == (1.0 if sub.allowed else 0.0), seed  # exactly the non-pending ones fail
        elif flaw == "forget_requests":
            assert summary["reward"] == 0.0
        elif flaw == "wrong_refund_method":
            right = sub.gold[-1]["arguments"]["payment_method_id"]
            wrong = task.user.payment_methods[0].id
            assert summary["reward"] == (1.0 if right == wrong else 0.0), seed
            assert summary["reward_breakdown"]["COMMUNICATE"] == 1.0  # the DB check is what catches it
        elif flaw == "drop_hash":
            assert summary["reward"] == (0.0 if sub.order_id else 1.0), seed
    failure_rate = 1 - sum(rewards) / len(rewards)
    assert failure_rate >= 0.3, (flaw, failure_rate)


@pytest.mark.parametrize("flaw", sorted(FLAW_FAMILY))
def test_flaws_leave_other_families_mostly_alone(flaw):
    for family in FAMILIES:
        if family == FLAW_FAMILY[flaw]:
            continue
        game = game_for(family)
        rewards = [play(game, seed, lambda g: flawed_response(g, flaw))["reward"] for seed in range(60)]
        # arg_format's two-item returns also need the payment_history method, so that flaw overlaps a little.
        floor = 0.75 if (flaw, family) == ("wrong_refund_method", "arg_format") else 1.0
        assert sum(rewards) / len(rewards) >= floor, (flaw, family)


def test_silent_agent_fails_the_communicate_check():
    """Doing the right write but never telling the refund amount scores 0 on nested_field."""
    game = game_for("nested_field")

    def silent(g: StorefrontGame) -> str:
        text = g.oracle_response()
        return "Done." if text == g.user.current.statement else text

    for seed in range(30):
        summary = play(game, seed, silent)
        assert summary["db_check"]["db_match"] and summary["reward"] == 0.0
        assert summary["reward_breakdown"] == {"DB": 1.0, "COMMUNICATE": 0.0}


def test_listing_every_status_without_looking_does_not_pass_refused_requests():
    """A reply naming every status, with no tool call at all, used to pass every forbidden precondition task."""
    game = game_for("precondition")
    dump = "Sorry, I cannot: the order is pending, processed, delivered, cancelled or return requested."
    forbidden = 0
    for seed in range(60):
        summary = play(game, seed, lambda g: dump)
        assert summary["reward"] == 0.0, f"seed {seed}: the status dump scored {summary['reward']}"
        forbidden += not game.task.sub_requests[0].allowed
        assert play(game, seed, expert)["reward"] == 1.0  # looking the order up first still communicates it
    assert forbidden >= 15


def test_db_match_agrees_with_db_hash():
    for flaw in [None, *FLAW_FAMILY]:
        for seed in range(30):
            game = StorefrontGame()
            play(game, seed, expert if flaw is None else (lambda g, f=flaw: flawed_response(g, f)))
            assert game.db_match() == (db_hash(game.toolkit.db) == game.gold_hash())


def test_mentions_matches_whole_amounts_and_words():
    assert mentions("123.45", ["You get 123.45 back."]) and mentions("12.34", ["difference -12.34"])
    assert not mentions("23.45", ["You get 123.45 back."]) and not mentions("123.45", ["123.456"])
    assert mentions("delivered", ["It is Delivered."]) and not mentions("delivered", ["undelivered"])
    assert mentions("return requested", ["status: return requested"])


# --------------------------------------------------------------------------------------------------
# The game loop: errors, malformed actions, the user
# --------------------------------------------------------------------------------------------------
def test_tool_errors_become_tool_messages_and_the_episode_goes_on():
    game = StorefrontGame()
    game.reset(5)
    result = game.step(parse_hermes_action(
        '<tool_call>{"name": "get_order_details", "arguments": {"order_id": "W1"}}</tool_call>'
        '<tool_call>{"name": "get_order_details", "arguments": {"order_id": 1}}</tool_call>'
        '<tool_call>{"name": "refund_everything", "arguments": {}}</tool_call>'))
    contents = [m["content"] for m in result.observation_messages]
    assert contents[0] == "Error: order 'W1' not found"
    assert contents[1].startswith("Error: argument 'order_id' of tool 'get_order_details' must be a JSON string")
    assert contents[2].startswith("Error: unknown tool 'refund_everything'; available tools: find_user_id_by_email")
    assert not result.done and game.get_summary()["tool_errors"] == 3
    summary = play(game, 5, expert)  # the expert still solves it after a fresh reset
    assert summary["reward"] == 1.0


GARBAGE = [
    "", "   ", "<tool_call>", "</tool_call>", "<tool_call>{}</tool_call>", "<tool_call>[1, 2]</tool_call>",
    '<tool_call>{"name": "cancel_pending_order", "arguments": "not json"}</tool_call>',
    '<tool_call>{"name": "cancel_pending_order", "arguments": [1]}</tool_call>',
    '<tool_call>{"name": "cancel_pending_order", "arguments": {"order_id": null, "reason": 3}}</tool_call>',
    '<tool_call>{"name": 5}</tool_call>', "<tool_call>{'name': 'x'}</tool_call>", "\x00\x01", "?" * 500,
    '<tool_call>{"name": "modify_user_address", "arguments": {"user_id": "x", "zip": 2134}}</tool_call>',
    "Could you confirm you want me to cancel it?", "What is your email?", "Which order id?", "Why?",
]


def test_malformed_and_random_actions_never_raise():
    rng = random.Random(0)
    for seed in range(150):
        game = StorefrontGame()
        game.reset(seed)
        while not game.done:
            text = rng.choice(GARBAGE) if rng.random() < 0.6 else game.oracle_response()
            result = game.step(parse_hermes_action(text))
            assert 0.0 <= result.reward <= 1.0
        summary = game.get_summary()
        assert 0.0 <= summary["reward"] <= 1.0
        assert summary["termination_reason"] in ("user_stop", "max_steps", "too_many_errors")


def test_format_error_message_and_limit():
    game = StorefrontGame(StorefrontConfig(max_errors=1))
    game.reset(0)
    first = game.step(parse_hermes_action("<tool_call>{oops</tool_call>"))
    assert first.observation_messages[0]["role"] == "user"
    assert first.observation_messages[0]["content"].startswith("[format error] tool call is not valid JSON")
    second = game.step(parse_hermes_action(""))
    assert second.done and game.termination_reason == "too_many_errors" and second.reward == 0.0


def test_user_reveals_info_and_answers_confirmations():
    task_seed = next(s for s in range(100) if make_task(s, "precondition").auth == "name_zip")
    game = game_for("precondition")
    game.reset(task_seed)
    task = game.task
    sub = task.sub_requests[0]
    reply = game.step(parse_hermes_action("Could you tell me your email?")).observation_messages[0]["content"]
    assert "don't remember my email" in reply and task.user.address.zip in reply and task.user.first_name in reply
    reply = game.step(parse_hermes_action("Which order id is it?")).observation_messages[0]["content"]
    assert sub.order_ref in reply
    verb = "cancel" if sub.kind == "cancel" else "change the address of"
    digits = sub.order_id.removeprefix("#W")
    yes = game.step(parse_hermes_action(f"Shall I {verb} order #W{digits}?")).observation_messages[0]["content"]
    assert yes.startswith("Yes")
    no = game.step(parse_hermes_action("Shall I return order #W0000001?")).observation_messages[0]["content"]
    assert no.startswith("No")
    assert not game.done
    final = game.step(parse_hermes_action("All done."))
    assert final.done and final.observation_messages[0]["content"].endswith(STOP)
    assert game.get_summary()["termination_reason"] == "user_stop"


def test_user_answers_confirm_your_email_with_their_identity():
    # "Could you confirm your email?" is how many agents ask who the user is; it used to get "No, that is
    # not what I asked for." (the confirmation rule won), so such an agent could never authenticate.
    game = game_for("precondition")
    seed = next(s for s in range(100) if make_task(s, "precondition").auth == "email")
    game.reset(seed)
    sub = game.task.sub_requests[0]
    reply = game.step(parse_hermes_action("Could you please confirm your email address?"))
    assert reply.observation_messages[0]["content"] == f"My email is {game.task.user.email}."
    assert game.user.revealed_auth
    # Once the user is known, a confirmation about the current request is still a confirmation.
    verb = "cancel" if sub.kind == "cancel" else "change the address of"
    digits = sub.order_id.removeprefix("#W")
    yes = game.step(parse_hermes_action(f"Shall I {verb} order #W{digits} for your email account?"))
    assert yes.observation_messages[0]["content"] == "Yes, please."
    no = game.step(parse_hermes_action("Should I return order #W0000001?"))
    assert no.observation_messages[0]["content"].startswith("No")


def test_user_gives_up_after_max_turns():
    game = StorefrontGame(StorefrontConfig(max_user_turns=3, max_steps=20))
    game.reset(1)
    for _ in range(2):
        assert not game.step(parse_hermes_action("What is your email?")).done
    last = game.step(parse_hermes_action("What is your email?"))
    assert last.done and last.observation_messages[0]["content"].endswith(STOP)


def test_rewards_are_floats_in_unit_interval_before_and_after():
    game = StorefrontGame()
    game.reset(4)
    early = game.get_summary()
    assert isinstance(early["reward"], float) and 0.0 <= early["reward"] <= 1.0 and early["steps"] == 0
    play(game, 4, expert)
    assert game.get_summary()["reward"] == 1.0


def test_config_validation_and_registry():
    with pytest.raises(ValueError, match="families"):
        StorefrontConfig(families=("nope",))
    with pytest.raises(ValueError, match="max_steps"):
        StorefrontConfig(max_steps=0)
    assert StorefrontConfig(families="precondition, compound").families == ("precondition", "compound")
    spec = get_game("storefront")
    assert spec.capability == "" and spec.target == "" and spec.system_prompt == POLICY
    assert len(POLICY) <= 600
    game = spec.make(families=("compound",))
    assert len(game.get_tool_schemas()) == 11  # schemas are available before reset
    game.reset(0)
    assert game.task.family == "compound"
    assert [s["function"]["name"] for s in game.get_tool_schemas()] == StorefrontTools.tool_names()


def test_env_step_rate():
    """Oracle-driven episodes (reset + steps + scoring); the target on a quiet 2-core machine is >= 5,000/s.
    The floor here is low because CI machines are shared; bench/env_step.py reports the real figure."""
    game = StorefrontGame()
    steps, start = 0, time.perf_counter()
    for seed in range(300):
        game.reset(seed)
        while not game.done:
            game.step(parse_hermes_action(game.oracle_response()))
            steps += 1
        game.get_summary()
    rate = steps / (time.perf_counter() - start)
    print(f"storefront expert: {rate:.0f} env steps/s")
    assert rate >= 500


# --------------------------------------------------------------------------------------------------
# Results files, the CLI and the summarizer
# --------------------------------------------------------------------------------------------------
def test_results_roundtrip_through_summarize(tmp_path: Path):
    from pipeline._summarize import main as summarize_main

    expert_sims, tasks = run_cli.run_benchmark(ExpertAgent(), 8, seed=3, progress=False)
    flawed_sims, _ = run_cli.run_benchmark(FlawedExpertAgent("skip_status_check"), 8, seed=4,
                                           families=("precondition",), progress=False)
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


def test_cli_expert_run_and_bad_input(tmp_path: Path, capsys):
    out = tmp_path / "r.json"
    assert run_cli.main(["--agent", "expert", "--tasks", "8", "--seed", "2", "--out", str(out), "--trials", "2",
                         "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "all                  16    16      1.000" in printed
    data = load_results(out)
    assert len(data["simulations"]) == 16 and len(data["tasks"]) == 8
    assert {s["family"] for s in data["simulations"]} == set(FAMILIES)
    assert {s["trial"] for s in data["simulations"]} == {0, 1}
    assert data["info"]["environment_info"]["policy"] == POLICY
    for argv, message in [
        (["--families", "precondition,nope"], "unknown family nope"),
        (["--tasks", "0"], "--tasks must be >= 1"),
        (["--agent", "robot"], "bad agent spec"),
        (["--agent", f"hf:{tmp_path / 'missing'}"], "not found"),
        (["--agent", "vllm:http://localhost:1"], "tokenizer"),
        (["--agent", "flawed:nope"], "unknown flaw"),
    ]:
        bad_out = tmp_path / "bad.json"
        args = {"--agent": "expert", "--tasks": "4", "--out": str(bad_out)}
        args.update(dict(zip(argv[::2], argv[1::2])))
        assert run_cli.main([x for kv in args.items() for x in kv] + ["--no-progress"]) == 2
        assert message in capsys.readouterr().err
        assert not bad_out.exists()


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
    assert all(sim["reward_info"]["reward"] == 1.0 for sim in sims)


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
    assert run_cli.main(["--agent", f"hf:{tiny_model_dir}", "--tasks", "2", "--out", str(out), "--no-progress",
                         "--max-new-tokens", "16", "--temperature", "1.0"]) == 0
    sims = load_results(out)["simulations"]
    assert len(sims) == 2 and all(0.0 <= s["reward_info"]["reward"] <= 1.0 for s in sims)


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

    def log_message(self, *args: Any) -> None:
        pass


def test_vllm_agent_retries_5xx_then_fails_loudly(tiny_model_dir: Path):
    server = HTTPServer(("127.0.0.1", 0), _FlakyCompletions)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        delays: list[float] = []
        _FlakyCompletions.failures, _FlakyCompletions.seen = 2, []
        agent = VLLMAgent(url, "tiny", tiny_model_dir, timeout_s=10.0, sleep=delays.append)
        game = StorefrontGame()
        messages = game.reset(0)
        assert agent.respond(messages, game.get_tool_schemas()) == "Hello there."
        assert delays == [1.0, 2.0] and len(_FlakyCompletions.seen) == 3
        request = _FlakyCompletions.seen[-1]
        assert request["prompt"].endswith("<|im_start|>assistant\n") and POLICY.splitlines()[0] in request["prompt"]
        assert "<|im_end|>" in request["stop"]
        _FlakyCompletions.failures, _FlakyCompletions.seen = 100, []
        with pytest.raises(RuntimeError, match="failed after 6 attempts"):
            agent.respond(messages, game.get_tool_schemas())
    finally:
        server.shutdown()
        server.server_close()
    dead = VLLMAgent(url, "tiny", tiny_model_dir, timeout_s=2.0, sleep=lambda s: None)  # nothing listens now
    with pytest.raises(RuntimeError, match="failed after 6 attempts: (APIConnectionError|APITimeoutError)"):
        dead.respond([{"role": "user", "content": "hi"}], [])
