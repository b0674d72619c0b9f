"""Games drawn from the target's surface (issue 24, point 1): given the demo's storefront config, every
storefront capability game draws the target's request kinds at the target's weights, calls only tools the
target's expert calls, writes ids and names items the way the target's customers do, and judges the
confirmation rule as the target does. Its knobs still set difficulty there.

The surface is the demo's target: configs/storefront/cpu_demo.yaml with configs/demo.yaml's
`storefront_overrides` (cancel / return / exchange, one request per customer, fewer unknown ids), loaded
the way the demo loads it. Every game is reached through the registry (see test_capability_games.py).
"""
from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from benchmarks.storefront.policy import policy_text
from benchmarks.storefront.tasks import make_task
from benchmarks.storefront.tools import StorefrontTools
from benchmarks.storefront.user_sim import REQUEST_KINDS
from game_registry import get_game, render_tool_call
from benchmarks.storefront.config import surface_fields
from games._storefront.instances import AUTH_QUESTION
from demo.config import load_demo_config
from pipeline.validate_game import validate
from test_difficulty_knobs import (forgets_some_requests, guesses_items, guesses_payment_method, mutate_calls,
                                   trusts_eligibility_claims, zip_as_number)

REPO = Path(__file__).resolve().parent.parent
DEMO_SURFACE = load_demo_config(REPO / "configs" / "demo.yaml").storefront_config(REPO)
SURFACE = surface_fields(DEMO_SURFACE)
SEEDS = range(400)
# The target's kinds where each game's capability applies (the share test renormalises the target's weights
# over those the target draws): a status rule (precondition), a loosely written value (precision: any kind has
# an order id or an address), a nested record to read (structured: returns and exchanges), any request
# (multi-step).
APPLICABLE = {
    "capability_precondition_verification": ("cancel", "modify_order_address", "return", "exchange"),
    "capability_tool_calling_precision": REQUEST_KINDS,
    "capability_structured_data_reasoning": ("return", "exchange"),
    "capability_multi_step_task_completion": REQUEST_KINDS,
}
GAMES = tuple(APPLICABLE)
KIND_TOLERANCE = 0.05  # the bar: within 5 points of the target's weight
RATE_TOLERANCE = 0.06  # id forms and item counts: two samples of 400+ requests each


def surface_game(name: str, **overrides: Any):
    return get_game(name).make(storefront=SURFACE, **overrides)


def drawn_requests(name: str, seeds: range = SEEDS, **overrides: Any) -> list:
    """Every planned request of the game's instances over `seeds` (instances only: nothing is played)."""
    game = surface_game(name, **overrides)
    requests = []
    for seed in seeds:
        game.reset(seed)
        requests += game.instance.requests
    return requests


def target_requests(seeds: range = SEEDS) -> list:
    return [sub for seed in seeds for sub in make_task(seed, DEMO_SURFACE).sub_requests]


def play_oracle(spec, game, seed: int, policy=None) -> None:
    """Play one episode with `policy` (default: the oracle), as the trainer does."""
    game.reset(seed)
    turns = 0
    while not game.done and turns < spec.max_turns:
        game.step(spec.extract_action(policy(game) if policy else game.oracle_response()))
        turns += 1


# --------------------------------------------------------------------------------------------------
# Request kinds, tools, id forms and item counts are the target's
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", GAMES)
def test_each_game_draws_the_targets_request_kinds_at_its_weights(name):
    weights = {k: w for k, w in DEMO_SURFACE.kind_weights.items() if k in APPLICABLE[name] and w > 0}
    expected = {k: w / sum(weights.values()) for k, w in weights.items()}
    # The structured game levels its decision classes by default (gift_card_share 0.5); None: the target's mix.
    overrides = {"gift_card_share": None} if name == "capability_structured_data_reasoning" else {}
    counts = Counter(r.kind for r in drawn_requests(name, **overrides))
    shares = {k: n / sum(counts.values()) for k, n in counts.items()}
    assert set(shares) <= set(expected), f"{name} draws kinds the target never asks for: {shares}"
    for kind, share in expected.items():
        assert abs(shares.get(kind, 0.0) - share) <= KIND_TOLERANCE, (name, kind, shares, expected)


def target_tools() -> set[str]:
    """Every tool the target's expert calls on the demo surface (its demonstrations are the expert's)."""
    return {action["name"] for seed in range(300) for action in make_task(seed, DEMO_SURFACE).gold_actions}


@pytest.mark.parametrize("name", GAMES)
def test_no_game_task_needs_a_tool_the_targets_expert_never_calls(name):
    allowed = target_tools()
    assert "modify_pending_order_address" not in allowed and "modify_user_address" not in allowed
    spec = get_game(name)
    called: set[str] = set()
    for seed in range(150):
        game = surface_game(name)
        play_oracle(spec, game, seed)
        called |= {record.name for record in game.state.tool_calls}
        assert game.get_summary()["success"], (name, seed, game.get_summary()["reward_parts"])
    assert called <= allowed, f"{name}'s oracle calls {sorted(called - allowed)}, which the target's expert never does"


def id_and_item_facts(requests: list, user_of, write_of) -> dict[str, float]:
    """Shares over order requests: ids written loosely (no '#W'), ids the customer does not know (the order
    search); and over returns with a write: two items named."""
    orders = [user_of(r) for r in requests if user_of(r).order_id]
    returns = [write_of(r) for r in requests if r.kind == "return" and write_of(r) is not None]
    return {"loose_id": sum(bool(u.order_ref) and not u.order_ref.startswith("#W") for u in orders) / len(orders),
            "unknown_id": sum(not u.order_ref for u in orders) / len(orders),
            "two_items": sum(len(w.arguments["item_ids"]) == 2 for w in returns) / len(returns)}


def planned_write(request):
    return next((c for c in request.calls if StorefrontTools.is_write(c.name)), None)


@pytest.mark.parametrize("name, overrides", [
    ("capability_precondition_verification", {}),
    ("capability_tool_calling_precision", {"looseness": 0}),  # level 0: the target's own rates
    ("capability_structured_data_reasoning", {"n_distractor_items": 0}),
    ("capability_multi_step_task_completion", {}),
])
def test_id_forms_and_item_counts_are_the_targets(name, overrides):
    target = id_and_item_facts(target_requests(), lambda s: s.user, lambda s: s.write)
    game = id_and_item_facts(drawn_requests(name, **overrides), lambda r: r.user, planned_write)
    assert target["loose_id"] > 0.2 and target["unknown_id"] > 0.03 and target["two_items"] > 0.15  # a real mix
    for fact, share in target.items():
        assert abs(game[fact] - share) <= RATE_TOLERANCE, (name, fact, game, target)


def test_structured_refund_targets_follow_the_targets_payment_mix():
    # The issue: gift-card returns were 36% of the game's tasks against 6.7% of the target's.
    def gift_share(requests: list) -> float:
        return sum("gift_card_refund" in r.needs for r in requests) / len(requests)

    target = gift_share([s for s in target_requests() if s.kind in ("return", "exchange") and s.allowed])
    game = [r.info for r in drawn_requests("capability_structured_data_reasoning", gift_card_share=None)]
    assert 0.03 < target < 0.3
    assert abs(sum("gift_card_refund" in i["needs"] for i in game) / len(game) - target) <= RATE_TOLERANCE


def test_structured_game_levels_its_refund_classes_by_default():
    # The target's mix is 82/18 original method / gift card (a constant "original method" would win most episodes
    # it finishes); the default gift_card_share draws the two decision classes level, redraws included.
    game = surface_game("capability_structured_data_reasoning")
    classes = []
    for seed in SEEDS:
        game.reset(seed)
        classes.append(game.decision_class())
    share = classes.count("gift_card") / len(classes)
    assert abs(share - 0.5) <= RATE_TOLERANCE, share
    assert set(classes) == {"gift_card", "original_method"}


def test_precision_looseness_sets_the_share_of_loosely_written_values():
    shares = []
    for level in (0, 1, 2):
        requests = drawn_requests("capability_tool_calling_precision", range(200), looseness=level)
        shares.append(id_and_item_facts(requests, lambda r: r.user, planned_write)["loose_id"])
    # Level 0 is the target's own rate (0.3), never less: the skill decides every level.
    assert 0.2 < shares[0] < 0.4 and 0.55 < shares[1] < 0.75 and shares[2] > 0.85, shares


# --------------------------------------------------------------------------------------------------
# The confirmation rule is the target's
# --------------------------------------------------------------------------------------------------
def writes_without_asking(game) -> str:
    """The oracle, but a write goes out where the oracle would first ask for confirmation."""
    text = game.oracle_response()
    request = game.current_request
    if request is not None and text == request.confirmation:
        write = next(c for c in request.calls if StorefrontTools.is_write(c.name))
        return render_tool_call(write.name, write.arguments)
    return text


@pytest.mark.parametrize("name", GAMES)
def test_with_required_confirmation_a_write_without_a_yes_is_a_violation(name):
    spec = get_game(name)
    checked = 0
    for seed in range(30):
        game = surface_game(name, **({"violating_fraction": 0.0} if "precondition" in name else {}))
        play_oracle(spec, game, seed, writes_without_asking)
        if not game.successful_calls(planned_write(game.instance.requests[0]).name):
            continue
        assert any("explicit yes" in v for v in game.policy_violations()), (name, seed)
        assert not game.get_summary()["success"]
        checked += 1
    assert checked >= 25


@pytest.mark.parametrize("name", GAMES)
def test_a_surface_without_the_rule_neither_asks_nor_states_it(name):
    spec = get_game(name)
    surface = {**SURFACE, "require_confirmation": False}
    for seed in range(20):
        game = get_game(name).make(storefront=surface)
        messages = game.reset(seed)
        assert messages[0]["content"] == policy_text(require_confirmation=False)
        play_oracle(spec, game, seed)
        texts = [m.get("content") or "" for m in game.get_messages() if m["role"] == "assistant"]
        assert not any("Shall I proceed?" in t for t in texts) and game.get_summary()["success"], (name, seed)


# --------------------------------------------------------------------------------------------------
# The games stay valid and their knobs stay difficulty on the surface
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow)  # ~2 s each; the other two stay
                                  if n in ("capability_structured_data_reasoning", "capability_tool_calling_precision")
                                  else n for n in GAMES])
def test_surface_games_pass_the_validator(name):
    spec = get_game(name)
    on_surface = dataclasses.replace(spec, make_env=lambda: spec.make(storefront=SURFACE))
    report = validate(on_surface, seeds=40, fuzz_actions=200)
    assert report["passed"], report["failures"]


@pytest.mark.parametrize("name", GAMES)
def test_identity_in_opening_on_the_surface_saves_the_identity_question(name):
    spec = get_game(name)
    for seed in range(20):
        game = surface_game(name, identity_in_opening=True)
        messages = game.reset(seed)
        assert game.instance.identity_reply in messages[1]["content"]
        play_oracle(spec, game, seed)
        texts = [m.get("content") for m in game.get_messages() if m["role"] == "assistant"]
        assert AUTH_QUESTION not in texts and game.get_summary()["success"], (name, seed)


def copies_ids_as_written(game) -> str:
    """Precision in part: the order id as the customer wrote it (a missing '#W' stays missing)."""
    def mutate(game, name: str, arguments: dict) -> dict:
        ref = game.current_request.info.get("order_ref") if game.authenticated() else None
        return {**arguments, "order_id": ref} if ref and "order_id" in arguments else arguments
    return mutate_calls(game, mutate)


KNOB_SEEDS = range(160)  # as test_difficulty_knobs.py
SURFACE_PARTIAL_SKILL = {
    ("capability_precondition_verification", "eligibility_claim_rate"): trusts_eligibility_claims,
    ("capability_multi_step_task_completion", "n_requests"): forgets_some_requests,
    ("capability_structured_data_reasoning", "n_distractor_items"): guesses_items,
    ("capability_structured_data_reasoning", "min_payment_methods"): guesses_payment_method,
    ("capability_tool_calling_precision", "looseness"): copies_ids_as_written,
    ("capability_tool_calling_precision", "name_zip_rate"): zip_as_number,
}


SLOW_SURFACE_KNOBS = {("capability_structured_data_reasoning", "n_distractor_items"),  # ~2 s; each game keeps one
                      ("capability_tool_calling_precision", "name_zip_rate")}


@pytest.mark.parametrize("name, knob_name", [pytest.param(*key, marks=pytest.mark.slow) if key in SLOW_SURFACE_KNOBS
                                             else key for key in SURFACE_PARTIAL_SKILL])
def test_knobs_stay_difficulty_on_the_surface(name, knob_name):
    """As test_difficulty_knobs.py, on the surface: a partial skill's mean reward falls as the knob rises."""
    spec = get_game(name)
    assert knob_name in {k.name for k in spec.difficulty_knobs}
    knob = spec.difficulty_knob(knob_name)
    rates = []
    for value in knob.values:
        reward = 0.0
        for seed in KNOB_SEEDS:
            game = surface_game(name, **{knob_name: value})
            play_oracle(spec, game, seed, SURFACE_PARTIAL_SKILL[(name, knob_name)])
            reward += game.get_summary()["reward"]
        rates.append(reward / len(KNOB_SEEDS))
    shown = dict(zip(knob.values, rates))
    assert all(harder <= easier + 0.08 for easier, harder in zip(rates, rates[1:])), (name, knob_name, shown)
    assert rates[0] - rates[-1] >= 0.12, (name, knob_name, shown)


# --------------------------------------------------------------------------------------------------
# How a surface is given, resolved and recorded
# --------------------------------------------------------------------------------------------------
def test_a_surface_is_a_yaml_path_or_a_mapping_and_resolves_to_every_field():
    from_path = get_game(GAMES[0]).make(storefront="configs/storefront/cpu_demo.yaml").config
    assert from_path.surface.order_id_digits == 3 and from_path.surface.kind_weights["modify_user_address"] > 0
    overrides = {"unknown_order_id_rate": 0.1, "request_counts": [1.0],
                 "kind_weights": {"cancel": 0.3, "return": 0.25, "exchange": 0.1}}
    from_file_and_overrides = get_game(GAMES[0]).make(
        storefront={"file": "configs/storefront/cpu_demo.yaml", **overrides}).config
    assert from_file_and_overrides.storefront == SURFACE  # the demo's surface, however it was given
    # Resolved in place to JSON-ready fields: saved and reloaded (the demo's calibration result), it is the same.
    assert json.loads(json.dumps(from_file_and_overrides.storefront)) == from_file_and_overrides.storefront
    again = get_game(GAMES[0]).make(storefront=json.loads(json.dumps(SURFACE))).config
    assert again.surface == DEMO_SURFACE
    game = surface_game(GAMES[0])
    game.reset(5)
    summary = game.get_summary()
    assert summary["config"]["storefront"] == SURFACE and summary["seed"] == 5
    json.dumps(summary)


@pytest.mark.parametrize("storefront, message", [
    ("configs/storefront/no_such.yaml", "no storefront YAML"),
    ({"no_such_field": 1}, "not StorefrontConfig fields"),
    ({"forbidden_rate": 2}, "forbidden_rate"),
    ({"kind_weights": {"modify_user_address": 1.0}}, "draws none of the request kinds"),
    (7, "a path to a storefront YAML or a mapping"),
])
def test_a_bad_surface_raises_naming_the_fix(storefront, message):
    with pytest.raises(ValueError, match=message):
        get_game(GAMES[0]).make(storefront=storefront)


def test_short_ids_is_a_shorthand_that_a_surface_must_agree_with():
    assert get_game(GAMES[0]).make(short_ids=True, storefront=SURFACE).config.ids == DEMO_SURFACE.ids
    with pytest.raises(ValueError, match="short_ids"):
        get_game(GAMES[0]).make(short_ids=True, storefront={})  # the default storefront's 7-digit ids


def test_a_kind_the_target_does_not_use_is_drawn_only_when_the_config_says_so():
    requests = drawn_requests("capability_precondition_verification", range(100),
                              request_kinds=("cancel", "modify_order_address"))
    kinds = Counter(r.kind for r in requests)
    assert set(kinds) == {"cancel", "modify_order_address"} and kinds["modify_order_address"] > 20
