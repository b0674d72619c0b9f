"""One skill decides success (issues 24 and 41): in each single-skill storefront game, the expert without the
game's skill and every constant policy win at most the largest decision class's share + PRIOR_MARGIN of seeds,
never where the skill matters, alone and on the demo's target surface.

An episode holds one request, as the target's do, so one decision (act or refuse; which write; which refund
method): a constant policy wins every episode its answer fits, and the class-prior rule (pipeline/probes.py)
bounds it by the class's share, which validate_game keeps at or below MAX_CLASS_SHARE. More requests per
episode stay a knob (`requests_per_episode`), brought up one at a time: the opening holds the first, the
customer's acknowledgement of a closed request brings the next in the words a one-request opening uses. The
ablations are the games' own (`GameSpec.ablations`): precondition always_act / always_refuse, precision
values_as_written, structured first_payment_method / first_items / always_original_method.
"""
from __future__ import annotations

import dataclasses

import pytest

from benchmarks.storefront.user_sim import STOP
from game_registry import get_game
from pipeline.probes import ABLATION_LIMIT, PRIOR_MARGIN, binomial_tail
from pipeline.validate_game import probe_check, validate
from test_game_surface import SURFACE

SINGLE_SKILL_GAMES = ("capability_precondition_verification", "capability_tool_calling_precision",
                      "capability_structured_data_reasoning")
SEEDS = 200  # the class-prior rule judges an ablation over 200 seeds or more
MORE_REQUESTS = {"requests_per_episode": 3, "max_steps": 20}  # the knob: three requests, room for their plans


def on(spec, **overrides):
    """`spec` whose games are built with `overrides` (as validate_game --game-overrides does)."""
    return dataclasses.replace(spec, make_env=lambda: spec.make(**overrides))


def ablation_rows(spec, seeds: int = SEEDS) -> dict:
    rows = probe_check(spec, seeds=seeds)["probes"]
    return {p.name: rows[p.name] for p in spec.ablations}


@pytest.mark.slow  # ~40 s for the six; the default suite's validator tests (test_game_surface.py, 40 seeds, and
# tests/test_class_prior.py) hold the same ablations to the same rule
@pytest.mark.parametrize("name", SINGLE_SKILL_GAMES)
@pytest.mark.parametrize("surface", [False, True], ids=["alone", "demo_surface"])
def test_no_ablation_wins_more_than_its_class_prior_nor_where_its_skill_matters(name, surface):
    spec = get_game(name)
    assert spec.ablations and spec.decision_classes, f"{name} declares no ablation or no decision classes"
    check = probe_check(on(spec, storefront=SURFACE) if surface else spec, seeds=SEEDS)
    assert check["oracle_success_rate"] == 1.0
    largest = max(check["class_shares"].values())
    assert largest <= 0.55 + 0.05  # the 500-instance check holds it to 0.55; 200 seeds wander a little
    for ablation in spec.ablations:
        row = check["probes"][ablation.name]
        assert row["origin"] == "ablation" and row["limit"] == pytest.approx(largest + PRIOR_MARGIN)
        assert row["applicable_seeds"] == SEEDS and row["status"] in ("PASS", "n/a"), (ablation.name, row)
        assert row["success_rate"] <= row["limit"] and row["wins_where_skill_matters"] == 0


def test_one_request_per_episode_lets_a_constant_policy_win_its_class_and_nothing_else():
    """With one request, always refusing wins exactly the forbidden seeds (its class) and always acting exactly
    the allowed ones: each at its class's share, under the class-prior limit, and neither where the check
    decides. The stricter 0.25 limit of a game without classes would fail both."""
    spec = get_game("capability_precondition_verification")
    check = probe_check(on(spec, storefront=SURFACE), seeds=SEEDS)
    shares = check["class_shares"]
    for name, won in (("always_refuse", "refuse"), ("always_act", "act")):
        row = check["probes"][name]
        assert row["success_rate"] == pytest.approx(shares[won]) and row["status"] == "PASS", row
        assert row["success_by_class"][won] == 1.0 and row["wins_where_skill_matters"] == 0
        assert row["success_rate"] > ABLATION_LIMIT


def test_the_ablated_expert_lacks_only_the_skill():
    """Each ablation differs from the oracle only where the skill is needed: on instances without the need it
    is the oracle (precondition: every request allowed; structured: each order paid with the first method)."""
    spec = get_game("capability_precondition_verification")
    rows = ablation_rows(on(spec, storefront=SURFACE, violating_fraction=0.0), seeds=20)
    assert rows["always_act"]["success_rate"] == 1.0 and rows["always_refuse"]["success_rate"] == 0.0
    spec = get_game("capability_structured_data_reasoning")
    outcomes = set()
    for seed in range(60):
        game = spec.make(storefront=SURFACE)
        game.reset(seed)
        while not game.done:
            game.step(spec.extract_action(game.ablated_response("first_payment_method")))
        first = game.instance.user.payment_methods[0].id
        needs_reading = any(r.info.get("refund_to", r.info["paid_with"]) != first for r in game.instance.requests)
        outcomes.add((needs_reading, game.get_summary()["success"]))
    assert outcomes == {(True, False), (False, True)}  # wins exactly where the first method is the right one


@pytest.mark.parametrize("name", SINGLE_SKILL_GAMES)
def test_requests_come_one_at_a_time_each_as_a_one_request_opening(name):
    spec = get_game(name)
    for surface in (None, SURFACE):
        for seed in range(10):
            game = spec.make(storefront=surface, **MORE_REQUESTS)
            messages = game.reset(seed)
            instance = game.instance
            assert len(instance.requests) == 3 and len(instance.follow_ups) == 2
            opening = messages[-1]["content"]
            assert "Also, please" not in opening  # the target's one-request opening
            for follow_up in instance.follow_ups:
                assert follow_up.split(" want to ", 1)[1] not in opening  # brought up later, not up front
            replies = []
            while not game.done:  # the expert: each statement closes a request, the answer brings the next
                result = game.step(spec.extract_action(game.oracle_response()))
                replies.append(result.observation_messages[0]["content"] if result.observation_messages else "")
            brought_up = [r for r in replies if any(r.endswith(f) for f in instance.follow_ups)]
            assert len(brought_up) == 2 and STOP in replies[-1] and game.get_summary()["success"]


def test_the_customer_brings_up_nothing_before_the_request_is_closed():
    spec = get_game("capability_precondition_verification")
    game = spec.make(storefront=SURFACE, **MORE_REQUESTS)
    game.reset(3)
    follow_up = game.instance.follow_ups[0]
    while game.customer.pointer == 0:
        text = game.oracle_response()
        result = game.step(spec.extract_action(text))
        said = [m["content"] for m in result.observation_messages if m["role"] == "user"]
        assert all(follow_up not in s for s in said) or game.customer.pointer == 1, text
    assert game.get_messages()[-1]["content"].endswith(follow_up)


def test_requests_per_episode_is_checked():
    spec = get_game("capability_precondition_verification")
    for bad in (0, 5, 2.5, True):
        with pytest.raises(ValueError, match="requests_per_episode"):
            spec.make(requests_per_episode=bad)
    with pytest.raises(ValueError, match="max_steps"):
        spec.make(requests_per_episode=4, max_steps=12)
    with pytest.raises(ValueError, match="n_requests"):
        get_game("capability_multi_step_task_completion").make(requests_per_episode=2)


def test_a_few_seeds_above_the_limit_by_chance_warn_and_a_clear_excess_fails():
    """Without decision classes (the strict 0.25 limit): 3 of 10 seeds is what a 12.5% policy gets one time in
    eight: too few seeds to tell, WARN (the demo-fast profile validates on 10). 12 of 12 is no chance: FAIL.
    With classes, always refusing wins exactly its class on those seeds, under the class-prior limit."""
    assert abs(binomial_tail(3, 10, 0.25) - 0.474) < 0.001 and abs(binomial_tail(0, 5, 0.3) - 1.0) < 1e-9
    spec = get_game("capability_precondition_verification")
    classless = dataclasses.replace(spec, decision_classes=())
    # three requests: a constant refuser fits all three on a few seeds only
    row = ablation_rows(on(classless, storefront=SURFACE, **MORE_REQUESTS), seeds=10)["always_refuse"]
    assert 0.25 < row["success_rate"] <= 0.5 and row["status"] == "WARN", row
    report = validate(on(classless, storefront=SURFACE, **MORE_REQUESTS), seeds=10, fuzz_actions=0)
    assert report["passed"] and "run 40 seeds or more to judge it" in report["checks"]["probes"]["detail"]
    row = ablation_rows(on(classless, storefront=SURFACE, violating_fraction=1.0), seeds=12)["always_refuse"]
    assert row["success_rate"] == 1.0 and row["status"] == "FAIL", row
    row = ablation_rows(on(spec, storefront=SURFACE), seeds=10)["always_refuse"]
    assert row["status"] == "PASS" and row["limit"] == pytest.approx(max(row["seeds_by_class"].values()) / 10 + 0.05)


def _play(spec, game, policy) -> dict:
    for _ in range(spec.max_turns):
        if game.done:
            break
        game.step(spec.extract_action(policy(game)))
    return game.get_summary()


def test_partial_credit_never_pays_for_stopping():
    """tool_calling_precision: identifying the customer and then quitting scored 0.2, more than 147 of 169 failed
    attempts on the demo's surface (each failed call costs 0.1), so GRPO groups without a success taught quitting.
    Identification now pays once a write was attempted: stopping scores 0, never above trying."""
    spec = get_game("capability_tool_calling_precision")
    for seed in range(20):
        game = spec.make(storefront=SURFACE)
        game.reset(seed)
        quit_reward = _play(spec, game, lambda g: g.oracle_response() if not g.authenticated() else
                            "I'm sorry, I can't help with that. Goodbye.")["reward"]
        game = spec.make(storefront=SURFACE)
        game.reset(seed)
        tried = _play(spec, game, lambda g: g.oracle_response() if not g.authenticated() else
                      g.ablated_response("values_as_written"))
        assert quit_reward == 0.0, seed
        assert tried["reward"] >= quit_reward, (seed, tried["reward_parts"])

