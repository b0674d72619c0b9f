"""Declared difficulty knobs are difficulty: a partial-skill policy's score falls as each knob rises.

A knob is declared on the GameSpec (`difficulty_knobs`) with its hard direction and candidate values
(easy to hard). For each declared knob this file holds a policy that has the capability only in part
(it trusts the customer's claims, forgets some requests, guesses among look-alike entries, fixes only the
easy formats). Its mean reward over the same seeds (what GRPO sees; an episode holds several requests, so
success, which needs every one, is small for any partial skill) must not rise from one value to the next
(beyond sampling noise) and must fall clearly from the easiest to the hardest value. A knob that is a class prior
(a share of refusals, say) fails this: always-act drops while do-nothing rises, and neither is partial skill.
A knob declared without a partial-skill policy here fails the test, so every new knob gets one.
"""
from __future__ import annotations

import random
from typing import Any, Callable

import pytest

from benchmarks.storefront.tools import StorefrontTools
from game_registry import get_game, parse_hermes_action
from game_registry import render_tool_call

SEEDS = range(160)
NOISE = 0.06  # allowed rise between neighbouring values (different instances per value, same seeds)
MIN_DROP = 0.12  # easiest minus hardest mean reward

Policy = Callable[[Any], "str | None"]


def success_rate(name: str, overrides: dict[str, Any], policy: Policy) -> float:
    return played(name, overrides, policy)[0]


def mean_reward(name: str, overrides: dict[str, Any], policy: Policy) -> float:
    return played(name, overrides, policy)[1]


def played(name: str, overrides: dict[str, Any], policy: Policy) -> tuple[float, float]:
    """(success rate, mean reward) of `policy` over SEEDS."""
    spec = get_game(name)
    wins = reward = 0.0
    for seed in SEEDS:
        game = spec.make(**overrides)
        game.reset(seed)
        turns = 0
        while not game.done and turns < spec.max_turns:
            text = policy(game)
            if text is None:
                break
            game.step(spec.extract_action(text))
            turns += 1
        summary = game.get_summary()
        wins += summary["success"]
        reward += summary["reward"]
    return wins / len(SEEDS), reward / len(SEEDS)


def mutate_calls(game, mutate: Callable[[Any, str, dict], dict]) -> str:
    """The oracle's next text, with a tool call's arguments passed through `mutate`."""
    text = game.oracle_response()
    action = parse_hermes_action(text)
    if action.kind != "tool_call":
        return text
    call = action.tool_calls[0]
    return render_tool_call(call.name, mutate(game, call.name, dict(call.arguments)))


def episode_rng(game, salt: int) -> random.Random:
    return random.Random(game.seed * 1009 + salt)


# ---- precondition_verification ------------------------------------------------------------------
def trusts_eligibility_claims(game) -> str:
    """Checks the status, except when the customer says the order is eligible: then acts (or, when the
    request was not allowed, reports it done) without looking."""
    request = game.current_request if game.authenticated() else None
    if request is None or not request.info["eligibility_claim"]:
        return game.oracle_response()
    writes = [c for c in request.calls if StorefrontTools.is_write(c.name)]  # a plan may read more than the order
    if not writes:
        return "Done, your request is handled."
    write = writes[0]
    if any(r.ok and r.name == write.name for r in game.state.tool_calls):
        return "Done, your request is handled."
    if game._just_confirmed(request.confirmation):
        return render_tool_call(write.name, write.arguments)
    return request.confirmation


# ---- multi_step_task_completion -----------------------------------------------------------------
def forgets_some_requests(game) -> str:
    """Handles the first request; each later one is forgotten with probability 0.4."""
    pointer = game.customer.pointer
    if pointer >= 1 and episode_rng(game, pointer).random() < 0.4:
        return "Is there anything else I can help you with?"
    return game.oracle_response()


# ---- structured_data_reasoning ------------------------------------------------------------------
def guesses_items(game) -> str:
    """Reads the order, then picks the item(s) at random among the order's items."""
    def mutate(game, name: str, arguments: dict) -> dict:
        if name not in ("return_delivered_order_items", "exchange_delivered_order_items"):
            return arguments
        order = game.db.orders[arguments["order_id"]]
        rng = episode_rng(game, 1)
        chosen = rng.sample([i.item_id for i in order.items], len(arguments["item_ids"]))
        return {**arguments, "item_ids": chosen}
    return mutate_calls(game, mutate)


def guesses_payment_method(game) -> str:
    """Picks the refund / payment method at random among the customer's methods."""
    def mutate(game, name: str, arguments: dict) -> dict:
        if "payment_method_id" not in arguments:
            return arguments
        methods = [p.id for p in game.instance.user.payment_methods]
        return {**arguments, "payment_method_id": episode_rng(game, 2).choice(methods)}
    return mutate_calls(game, mutate)


# ---- tool_calling_precision ---------------------------------------------------------------------
def fixes_only_easy_formats(game) -> str:
    """Adds a missing '#' and maps a reason that quotes the enum, but passes a bare-digit id or a
    paraphrased reason as written, and reads a "last name first" name in the usual order."""
    request = game.current_request if game.authenticated() else None

    def mutate(game, name: str, arguments: dict) -> dict:
        ref = request.info.get("order_ref", "") if request else ""
        if "order_id" in arguments and ref:
            arguments["order_id"] = "#" + ref if ref.startswith("W") else ref
        if "reason" in arguments and arguments["reason"] not in request.user.reason_text:
            arguments["reason"] = request.user.reason_text
        if name == "find_user_id_by_name_zip" and "last name first" in game.instance.identity_reply:
            arguments["first_name"], arguments["last_name"] = arguments["last_name"], arguments["first_name"]
        return arguments
    return mutate_calls(game, mutate)


def zip_as_number(game) -> str:
    """Writes the zip code as a number (a leading zero is lost, and the tool wants a string)."""
    def mutate(game, name: str, arguments: dict) -> dict:
        if name == "find_user_id_by_name_zip":
            arguments["zip"] = int(arguments["zip"])
        return arguments
    return mutate_calls(game, mutate)


PARTIAL_SKILL = {
    ("capability_precondition_verification", "eligibility_claim_rate"): trusts_eligibility_claims,
    ("capability_multi_step_task_completion", "n_requests"): forgets_some_requests,
    ("capability_structured_data_reasoning", "n_distractor_items"): guesses_items,
    ("capability_structured_data_reasoning", "min_payment_methods"): guesses_payment_method,
    ("capability_tool_calling_precision", "looseness"): fixes_only_easy_formats,
    ("capability_tool_calling_precision", "name_zip_rate"): zip_as_number,
}
DECLARED = [(name, knob.name) for name in sorted({n for n, _ in PARTIAL_SKILL})
            for knob in get_game(name).difficulty_knobs]


def test_every_capability_game_declares_knobs_and_each_has_a_partial_skill_policy():
    from game_registry import list_games
    games = [n for n in list_games() if get_game(n).capability]
    for name in games:
        spec = get_game(name)
        assert spec.difficulty_knobs, f"{name} declares no difficulty knob"
        for knob in spec.difficulty_knobs:
            assert (name, knob.name) in PARTIAL_SKILL, f"{name}.{knob.name} has no partial-skill policy in this test"
            assert len(knob.values) >= 2, f"{name}.{knob.name} declares fewer than two values"


# structured data's second knob (~1.5 s) runs with `-m slow`; test_game_surface keeps it on the surface
@pytest.mark.parametrize("name, knob_name", [pytest.param(*key, marks=pytest.mark.slow)
                                             if key == ("capability_structured_data_reasoning", "min_payment_methods")
                                             else key for key in DECLARED])
def test_partial_skill_score_falls_as_the_knob_gets_harder(name, knob_name):
    knob = get_game(name).difficulty_knob(knob_name)
    values = knob.values if knob.harder == "increase" else tuple(reversed(knob.values))
    rates = [mean_reward(name, {knob_name: value}, PARTIAL_SKILL[(name, knob_name)]) for value in values]
    shown = ", ".join(f"{v}: {r:.2f}" for v, r in zip(values, rates))
    for easier, harder in zip(rates, rates[1:]):
        assert harder <= easier + NOISE, f"{name}.{knob_name} score rose: {shown}"
    assert rates[0] - rates[-1] >= MIN_DROP, f"{name}.{knob_name} barely changes the score: {shown}"


def test_a_class_prior_is_not_a_difficulty_knob():
    """violating_fraction moves always-act and do-nothing in opposite directions: not declared, and rightly."""
    name = "capability_precondition_verification"
    assert get_game(name).difficulty_knob("violating_fraction") is None

    def refuse(game) -> str:
        request = game.current_request
        if not game.authenticated() or not game.looked_up_order(request.info["order_id"]):
            return game.oracle_response()
        return f"Order {request.info['order_id']} is {game.db.orders[request.info['order_id']].status}, so I cannot do it."

    low, high = (success_rate(name, {"violating_fraction": v, "eligibility_claim_rate": 0.0}, refuse)
                 for v in (0.2, 0.8))
    assert high > low + 0.3  # a refuse-everything policy gets *better* as the "knob" rises
