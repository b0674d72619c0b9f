"""The four storefront capability games in games/ (Step 2's worked examples), reasoning-gym style.

Every game is reached through the registry (`get_game`), never by importing its module: discovery
imports game files under their own module names, and a second import would register the game twice.
"""
from __future__ import annotations

import json
import random
import string
import time
from typing import Any, Callable

import pytest

from game_registry import Action, GameSpec, get_game, list_games, parse_hermes_action, prompt_variant
from benchmarks.storefront.user_sim import NO_REPLY, YES_REPLIES
from games._storefront.instances import AUTH_QUESTION
from games._storefront.replies import mentions_amount, mentions_order_id, mentions_phrase
from pipeline.validate_game import validate
from game_registry import render_tool_call

GAMES = (
    "capability_precondition_verification",
    "capability_multi_step_task_completion",
    "capability_structured_data_reasoning",
    "capability_tool_calling_precision",
)
# Oracle turns with the default config (ask identity + look-up + per request look-ups, confirm, write, statement).
# Ask and look the user up once, then per request (three by default, one at a time) the look-ups, confirmation,
# write and statement; the multi-step game's two requests come in the opening.
MAX_ORACLE_TURNS = {GAMES[0]: 2 + 3 * 4, GAMES[1]: 10, GAMES[2]: 2 + 3 * 5, GAMES[3]: 2 + 3 * 4}

# A policy sees the game and returns the model's text for this turn (None: stop playing).
Policy = Callable[[Any], "str | None"]


def play(spec: GameSpec, game, seed: int, policy: Policy) -> list[str]:
    """Play one episode (as the trainer does: text -> extract_action -> step); return the texts."""
    game.reset(seed)
    texts = []
    while not game.done and len(texts) < spec.max_turns:
        text = policy(game)
        if text is None:
            break
        texts.append(text)
        game.step(spec.extract_action(text))
    return texts


def oracle(game) -> str:
    return game.oracle_response()


def do_nothing(game) -> str:
    return "I cannot help with that."


def replay(texts: list[str]) -> Policy:
    queue = list(texts)
    return lambda game: queue.pop(0) if queue else None


def reward_of(game) -> float:
    return game.get_summary()["reward"]


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=repr)


# --------------------------------------------------------------------------------------------------
# Registry, schemas, prompts
# --------------------------------------------------------------------------------------------------
def test_all_four_games_are_registered():
    names = list_games()
    for name in GAMES:
        assert name in names
        spec = get_game(name)
        assert spec.capability == name.removeprefix("capability_")
        assert spec.target == "storefront"
        assert spec.config_cls is not None and spec.hint_prompt


@pytest.mark.parametrize("name", GAMES)
def test_tool_schemas_are_the_targets_own_full_list(name):
    # The agent trained on the target sees the same tool list here; a subset made its habits (looking the
    # user's details up) unknown-tool errors and put a game out of reach of an agent that passes the target.
    target = [json.dumps(s, sort_keys=True) for s in get_game("storefront").make_env().get_tool_schemas()]
    game = get_game(name).make_env()
    before_reset = game.get_tool_schemas()
    game.reset(0)
    schemas = game.get_tool_schemas()
    assert schemas == before_reset
    assert [json.dumps(s, sort_keys=True) for s in schemas] == target


def with_extra_reads(game) -> str:
    """The oracle, plus the target's habit of reading the user's details right after authenticating."""
    text = game.oracle_response()
    user_id = game.instance.user.user_id
    if game.authenticated() and not game.successful_calls("get_user_details"):
        return render_tool_call("get_user_details", {"user_id": user_id})
    return text


@pytest.mark.parametrize("name", GAMES)
def test_a_read_the_game_does_not_need_costs_nothing(name):
    spec = get_game(name)
    for seed in range(20):
        game = spec.make_env()
        play(spec, game, seed, with_extra_reads)
        assert game.successful_calls("get_user_details") and reward_of(game) == 1.0


def unplanned_default_address_change(game) -> str:
    """The oracle, with an unasked default-address change (a write the game's plan never makes) first."""
    if game.authenticated() and not any(r.name == "modify_user_address" for r in game.state.tool_calls):
        address = dict(game.instance.user.address.to_dict(), address1="1 Elsewhere Rd")
        return render_tool_call("modify_user_address", {"user_id": game.instance.user.user_id, **address})
    return game.oracle_response()


@pytest.mark.parametrize("name", GAMES)
def test_a_write_the_plan_does_not_make_voids_the_action(name):
    spec = get_game(name)
    checked = 0
    for seed in range(40):
        game = spec.make_env()
        play(spec, game, seed, unplanned_default_address_change)
        if any(r.kind == "modify_user_address" for r in game.instance.requests):
            continue  # this instance asks for one: not unplanned
        assert game.successful_calls("modify_user_address"), seed
        assert reward_of(game) < 0.5, (seed, game.get_summary()["reward_parts"])
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("name", GAMES)
def test_system_prompt_is_the_target_policy_and_the_hint_is_appended(name):
    spec = get_game(name)
    target_spec = get_game("storefront")
    messages = spec.make_env().reset(3)
    assert messages[0] == {"role": "system", "content": target_spec.system_prompt}
    assert messages[1]["role"] == "user"
    hinted = prompt_variant(messages, spec, hinted=True)
    assert hinted[0]["content"].endswith(spec.hint_prompt) and len(spec.hint_prompt) < 300
    assert prompt_variant(messages, spec, hinted=False)[0]["content"] == messages[0]["content"]


# --------------------------------------------------------------------------------------------------
# Determinism and seeds
# --------------------------------------------------------------------------------------------------
def mixed_policy(rng: random.Random) -> Policy:
    """Sometimes the oracle, sometimes a random call of an offered tool, sometimes garbage."""
    def policy(game) -> str:
        roll = rng.random()
        if roll < 0.5:
            return game.oracle_response()
        if roll < 0.8:
            tool = rng.choice(game.get_tool_schemas())["function"]
            args = {key: rng.choice(["#W1234567", "x", "02134"]) for key in tool["parameters"]["properties"]}
            return render_tool_call(tool["name"], args)
        return "".join(rng.choice(string.printable) for _ in range(rng.randint(0, 40)))
    return policy


@pytest.mark.parametrize("name", GAMES)
def test_same_seed_same_episode(name):
    spec = get_game(name)
    for seed in range(15):
        first = spec.make_env()
        texts = play(spec, first, seed, mixed_policy(random.Random(seed)))
        second = spec.make_env()
        assert canonical(second.reset(seed)) == canonical(first.get_messages()[:2])
        play(spec, second, seed, replay(texts))
        assert canonical(second.get_messages()) == canonical(first.get_messages())
        assert canonical(second.get_summary()) == canonical(first.get_summary())
        # A reused instance starts over exactly.
        play(spec, first, seed, replay(texts))
        assert canonical(first.get_messages()) == canonical(second.get_messages())


@pytest.mark.parametrize("name", GAMES)
def test_seeds_give_different_instances(name):
    spec = get_game(name)
    game = spec.make_env()
    openings = {canonical(game.reset(seed)) for seed in range(40)}
    assert len(openings) == 40


# --------------------------------------------------------------------------------------------------
# Oracle, bounds, baselines
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", GAMES)
def test_oracle_solves_short_episodes(name):
    spec = get_game(name)
    wins, turns = 0, []
    for seed in range(100):
        game = spec.make_env()
        texts = play(spec, game, seed, oracle)
        summary = game.get_summary()
        wins += summary["success"] and summary["reward"] == 1.0
        turns.append(len(texts))
        assert game.done and summary["steps"] == len(texts)
    assert wins >= 99
    assert 2 <= min(turns) and max(turns) <= MAX_ORACLE_TURNS[name]


@pytest.mark.parametrize("name", GAMES)
def test_identity_in_opening_saves_the_identity_question(name):
    spec = get_game(name)
    for seed in range(20):
        game = spec.make(identity_in_opening=True)
        messages = game.reset(seed)
        assert game.instance.identity_reply in messages[1]["content"]
        texts = play(spec, game, seed, oracle)
        assert AUTH_QUESTION not in texts and reward_of(game) == 1.0


@pytest.mark.parametrize("name", GAMES)
def test_rewards_stay_in_bounds_and_doing_nothing_does_not_pay(name):
    spec = get_game(name)
    nothing = []
    for seed in range(60):
        game = spec.make_env()
        play(spec, game, seed, do_nothing)
        nothing.append(reward_of(game))
        play(spec, game, seed, mixed_policy(random.Random(1000 + seed)))
        reward = reward_of(game)
        assert isinstance(reward, float) and 0.0 <= reward <= 1.0
    assert all(0.0 <= r <= 1.0 for r in nothing)
    assert sum(nothing) / len(nothing) < 0.5


# Two games run with `-m slow`; test_game_surface validates those two on the surface by default.
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in (
    "capability_precondition_verification", "capability_multi_step_task_completion") else n for n in GAMES])
def test_pipeline_validator_passes(name):
    report = validate(get_game(name), seeds=40, fuzz_actions=300)
    assert report["passed"], report["failures"]


# --------------------------------------------------------------------------------------------------
# Policies that ignore the capability lose on the instances that need it
# --------------------------------------------------------------------------------------------------
class ActWithoutLooking:
    """Precondition: authenticate, then cancel straight away (never reads the status), then confirm."""

    def __call__(self, game) -> str:
        text = game.oracle_response()
        oid = game.instance.requests[0].info["order_id"]
        if "get_order_details" not in text and "cancel_pending_order" not in text:
            return text  # the identity question and the user look-up
        if not any(r.name == "cancel_pending_order" for r in game.state.tool_calls):
            return render_tool_call("cancel_pending_order", {"order_id": oid, "reason": "no longer needed"})
        return f"Order {oid} is cancelled."


class RefuseWithoutLooking:
    """Precondition: authenticate, then refuse without reading the order."""

    def __call__(self, game) -> str:
        text = game.oracle_response()
        if "get_order_details" in text or game.authenticated():
            return "Sorry, I cannot change that order."
        return text


def test_precondition_acting_without_looking_fails_everywhere():
    spec = get_game(GAMES[0])
    forbidden, allowed = [], []
    for seed in range(80):
        game = spec.make(request_kinds=("cancel",))
        play(spec, game, seed, ActWithoutLooking())
        request = game.instance.requests[0]
        (allowed if request.info["allowed"] else forbidden).append(reward_of(game))
    assert len(forbidden) >= 20 and len(allowed) >= 20
    assert max(forbidden) == 0.0  # wrote when not allowed: no action credit, nothing right to tell
    # The same calls on a pending order change the right thing, but the policy says look first: no credit.
    assert max(allowed) == 0.0


def test_precondition_refusing_without_looking_earns_nothing():
    # Doing nothing leaves a forbidden instance's database right; without the look-up it must not pay,
    # or a policy that never checks out-earns an honest attempt that slips.
    spec = get_game(GAMES[0])
    rewards = {True: set(), False: set()}
    for seed in range(80):
        game = spec.make_env()
        play(spec, game, seed, RefuseWithoutLooking())
        rewards[game.instance.requests[0].info["allowed"]].add(reward_of(game))
    assert rewards[False] == {0.0}
    assert rewards[True] == {0.0}


def test_precondition_looking_then_refusing_without_telling_earns_the_action_part():
    spec = get_game(GAMES[0])
    seen = 0
    for seed in range(40):
        game = spec.make(violating_fraction=1.0)  # every request forbidden

        def look_then_stop(game) -> str | None:
            text = game.oracle_response()
            return "Sorry, I cannot change that order." if game.looked_up_order(
                game.current_request.info["order_id"]) else text

        play(spec, game, seed, look_then_stop)
        assert not any(r.info["allowed"] for r in game.instance.requests)
        assert reward_of(game) == 0.6  # looked, changed nothing, never said the status
        seen += 1
    assert seen == 40


def test_multi_step_stopping_after_the_first_request_gets_half():
    spec = get_game(GAMES[1])

    def stop_early(game) -> str:
        if game.customer.pointer >= 1:
            return "You're welcome, goodbye."
        return game.oracle_response()

    for seed in range(40):
        game = spec.make(n_requests=2)
        play(spec, game, seed, stop_early)
        assert game.done and reward_of(game) == 0.5


def test_multi_step_an_unrequested_write_voids_the_reward():
    spec = get_game(GAMES[1])
    for seed in range(20):
        game = spec.make_env()
        game.reset(seed)
        extra = next(oid for oid in game.db.orders if oid not in {r.info.get("order_id")
                                                                  for r in game.instance.requests})
        texts = []
        while not game.done:
            text = game.oracle_response()
            if not texts:  # an unasked cancel of another order first
                text = render_tool_call("cancel_pending_order", {"order_id": extra, "reason": "no longer needed"})
            texts.append(text)
            game.step(spec.extract_action(text))
        assert reward_of(game) == 0.0


def first_entry_guess(game, name: str, arguments: dict) -> dict:
    """Structured data: take the first entry of each list instead of the one asked for."""
    db = game.db
    order = db.orders[arguments["order_id"]]
    arguments["payment_method_id"] = game.instance.user.payment_methods[0].id
    if name == "exchange_delivered_order_items":
        product = db.products[order.items[0].product_id]
        arguments["item_ids"] = [order.items[0].item_id]
        arguments["new_item_ids"] = [next(v.item_id for v in product.variants if v.item_id != order.items[0].item_id)]
    else:
        arguments["item_ids"] = [order.items[0].item_id]
    return arguments


def customer_words(game, name: str, arguments: dict) -> dict:
    """Precision: copy values as the customer wrote them (order id as written, zip as a number, reason words)."""
    info = game.instance.requests[0].info
    if "order_id" in arguments:
        arguments["order_id"] = info["order_ref"]
    if "zip" in arguments:
        arguments["zip"] = int(arguments["zip"])
    if "reason" in arguments:
        arguments["reason"] = "I no longer need it"
    return arguments


def mutating_oracle(mutate: Callable[[Any, str, dict], dict], tools: tuple[str, ...]) -> Policy:
    """The oracle, with the arguments of calls to `tools` passed through `mutate`."""
    def policy(game) -> str:
        text = game.oracle_response()
        action = parse_hermes_action(text)
        if action.kind != "tool_call" or action.tool_calls[0].name not in tools:
            return text
        call = action.tool_calls[0]
        return render_tool_call(call.name, mutate(game, call.name, dict(call.arguments)))
    return policy


def test_structured_first_entry_guess_fails_where_the_entry_matters():
    spec = get_game(GAMES[2])
    policy = mutating_oracle(first_entry_guess, ("return_delivered_order_items", "exchange_delivered_order_items"))
    changed = 0
    for seed in range(100):
        right = spec.make_env()
        right_texts = play(spec, right, seed, oracle)
        guess = spec.make_env()
        guess_texts = play(spec, guess, seed, policy)
        if guess_texts != right_texts:  # the guess differs from the right value: the instance needs the skill
            changed += 1
            assert reward_of(guess) < 1.0
    assert changed >= 60


def test_precision_customer_words_fail_and_errors_cost():
    spec = get_game(GAMES[3])
    policy = mutating_oracle(customer_words, tuple(t["function"]["name"] for t in spec.make_env().get_tool_schemas()))
    for seed in range(60):
        game = spec.make(looseness=1)
        play(spec, game, seed, policy)
        assert reward_of(game) < 1.0
        assert game.get_summary()["failed_tool_calls"] >= 1
    # One failed call before the right one costs exactly the penalty.
    game = spec.make(task_kinds=("cancel",))
    game.reset(0)
    game.step(spec.extract_action(game.oracle_response()))  # the identity question
    game.step(spec.extract_action(render_tool_call("get_order_details", {"order_id": "1"})))
    while not game.done:
        game.step(spec.extract_action(game.oracle_response()))
    assert reward_of(game) == pytest.approx(0.9)


# --------------------------------------------------------------------------------------------------
# Robustness
# --------------------------------------------------------------------------------------------------
def fuzz_text(rng: random.Random, tools: list[dict]) -> str:
    """A random model output: garbage, broken markup, wrong types, unknown tools, huge or odd values."""
    tool = rng.choice(tools)["function"]
    properties = list(tool["parameters"]["properties"])
    odd_values = [None, 7, -1.5, True, [], ["x", 1], {"a": []}, "", "A" * 20000, "😀\x00", "#W0000000"]
    kind = rng.randrange(8)
    if kind == 0:
        return "".join(rng.choice(string.printable) for _ in range(rng.randint(0, 200)))
    if kind == 1:
        return rng.choice(["<tool_call>", "</tool_call>", "<tool_call>[1]</tool_call>", "<tool_call>{}</tool_call>",
                           '<tool_call>{"name": "x", "arguments": "[" }</tool_call>', "   "])
    if kind == 2:
        return render_tool_call(rng.choice(["nope", tool["name"].upper(), "modify_user_address_x"]), {})
    if kind == 3:
        return render_tool_call(tool["name"], {k: rng.choice(odd_values) for k in properties})
    if kind == 4:
        return render_tool_call(tool["name"], {})
    if kind == 5:
        return render_tool_call(tool["name"], {**{k: "x" for k in properties}, "extra": 1})
    if kind == 6:
        return "Shall I proceed? What is your email? " * rng.randint(1, 3000)
    return "".join(render_tool_call(tool["name"], {k: rng.choice(odd_values) for k in properties})
                   for _ in range(rng.randint(2, 4)))


@pytest.mark.parametrize("name", GAMES)
def test_fuzzed_actions_never_raise(name):
    spec = get_game(name)
    rng = random.Random(7)
    game = spec.make_env()
    seed, actions = 0, 0
    while actions < 600:
        game.reset(seed)
        tools = game.get_tool_schemas()
        turns = 0
        while not game.done and turns < spec.max_turns:
            action = spec.extract_action(fuzz_text(rng, tools))
            assert isinstance(action, Action)
            result = game.step(action)
            assert 0.0 <= result.reward <= 1.0
            turns += 1
            actions += 1
        summary = game.get_summary()
        assert 0.0 <= summary["reward"] <= 1.0 and isinstance(summary["success"], bool)
        seed += 1


@pytest.mark.parametrize("name", GAMES)
def test_step_is_cheap(name):
    spec = get_game(name)
    steps, seconds = 0, 0.0
    for seed in range(300):
        game = spec.make_env()
        game.reset(seed)
        while not game.done:
            action = spec.extract_action(game.oracle_response())
            start = time.perf_counter()
            game.step(action)
            seconds += time.perf_counter() - start
            steps += 1
    assert steps / seconds >= 5000, f"{steps / seconds:.0f} steps/s"


# --------------------------------------------------------------------------------------------------
# Knobs and configs
# --------------------------------------------------------------------------------------------------
def instance_facts(name: str, seeds: range = range(40), **overrides) -> list[dict]:
    spec = get_game(name)
    facts = []
    for seed in seeds:
        game = spec.make(**overrides)
        game.reset(seed)
        facts.append({**game.get_summary()["instance"], "opening": game.get_messages()[1]["content"]})
    return facts


def test_knob_violating_fraction():
    statuses_all = [f["requests"][0] for f in instance_facts(GAMES[0], violating_fraction=1.0)]
    statuses_none = [f["requests"][0] for f in instance_facts(GAMES[0], violating_fraction=0.0)]
    assert not any(r["allowed"] for r in statuses_all)
    assert all(r["allowed"] for r in statuses_none)
    claims = instance_facts(GAMES[0], eligibility_claim_rate=1.0)
    assert all(r["eligibility_claim"] for f in claims for r in f["requests"])


def test_knob_number_of_requests():
    for n in (1, 2, 3, 4):
        facts = instance_facts(GAMES[1], n_requests=n, request_kinds=("cancel", "return"))
        assert all(len(f["requests"]) == n for f in facts)
        assert all(f["opening"].count("Also, please") == n - 1 for f in facts)


def test_knob_distractor_items_and_payment_methods():
    few = instance_facts(GAMES[2], n_distractor_items=0, min_payment_methods=2)
    many = instance_facts(GAMES[2], n_distractor_items=4, min_payment_methods=4, max_return_items=2)
    assert {f["requests"][0]["n_items"] for f in few} == {1}
    assert {f["requests"][0]["n_items"] for f in many} <= {5, 6} and any(f["requests"][0]["n_items"] == 6 for f in many)
    assert min(f["n_payment_methods"] for f in many) >= 4


def test_structured_gift_card_refund_names_exactly_one_gift_card():
    # "Please refund it to my gift card" is only answerable when the customer owns one gift card; with two,
    # the expected target was a coin flip (regression: extra payment methods could add a second gift card).
    spec = get_game(GAMES[2])
    for seed in range(300):
        game = spec.make(task_kinds=("return_to_gift_card",), min_payment_methods=3, gift_card_share=1.0)
        game.reset(seed)
        gift_cards = [p.id for p in game.instance.user.payment_methods if p.source == "gift_card"]
        assert len(gift_cards) == 1, f"seed {seed}: the customer owns gift cards {gift_cards}"
        assert game.instance.requests[0].info["refund_to"] == gift_cards[0]


def test_knob_looseness_changes_how_order_ids_are_written():
    exact = instance_facts(GAMES[3], looseness=0, task_kinds=("cancel",))
    loose = instance_facts(GAMES[3], looseness=2, task_kinds=("cancel",))
    assert all(f["requests"][0]["order_ref"].startswith("#W") for f in exact)
    assert all(f["requests"][0]["order_ref"].isdigit() for f in loose)
    assert all("no longer needed" in f["opening"] or "ordered by mistake" in f["opening"] for f in exact)


@pytest.mark.parametrize("name, overrides, field", [
    (GAMES[0], {"violating_fraction": 1.5}, "violating_fraction"),
    (GAMES[0], {"request_kinds": ("fly",)}, "request_kinds"),
    (GAMES[0], {"max_steps": 3}, "max_steps"),
    (GAMES[1], {"n_requests": 5}, "n_requests"),
    (GAMES[1], {"n_requests": 3, "max_steps": 9}, "max_steps"),
    (GAMES[1], {"n_requests": 2, "request_kinds": ("modify_user_address",)}, "n_requests=1"),
    (GAMES[2], {"n_distractor_items": -1}, "n_distractor_items"),
    (GAMES[2], {"min_payment_methods": 1}, "min_payment_methods"),
    (GAMES[3], {"looseness": 3}, "looseness"),
    (GAMES[3], {"name_zip_rate": "high"}, "name_zip_rate"),
    (GAMES[3], {"identity_in_opening": "yes"}, "identity_in_opening"),
])
def test_bad_config_raises(name, overrides, field):
    with pytest.raises(ValueError, match=field):
        get_game(name).make(**overrides)


@pytest.mark.parametrize("name", GAMES)
def test_summary_records_seed_and_knobs(name):
    game = get_game(name).make_env()
    assert game.get_summary()["reward"] == 0.0  # valid before the first reset
    game.reset(11)
    summary = game.get_summary()
    assert summary["seed"] == 11 and summary["capability"] == name.removeprefix("capability_")
    # The game ends itself at its config's max_steps; the registered max_turns is a cap at least that large.
    assert summary["config"]["max_steps"] <= get_game(name).max_turns
    assert summary["instance"]["requests"] and not summary["success"]
    if get_game(name).decision_classes:
        assert summary["decision_class"] in get_game(name).decision_classes
        assert set(summary["skill_matters"]) == set(game.ABLATIONS) and summary["first_mistake"] == "no_action"
    json.dumps(summary)


# --------------------------------------------------------------------------------------------------
# Scripted customer and reply matchers
# --------------------------------------------------------------------------------------------------
def test_scripted_customer_answers_identity_and_confirmation_questions():
    spec = get_game(GAMES[0])
    game = spec.make(requests_per_episode=3, max_steps=14)  # more requests than the default one: a knob
    game.reset(5)
    result = game.step(spec.extract_action(AUTH_QUESTION))
    assert result.observation_messages[0]["content"] == game.instance.identity_reply and not result.done
    result = game.step(spec.extract_action("Shall I proceed with that?"))  # about no request: a no
    assert result.observation_messages[0]["content"] == NO_REPLY and not result.done
    result = game.step(spec.extract_action(game.instance.requests[0].confirmation))
    assert result.observation_messages[0]["content"] in YES_REPLIES and not result.done
    result = game.step(spec.extract_action("All done."))  # closes the first request: the customer brings the next
    assert result.observation_messages[0]["content"].endswith(game.instance.follow_ups[0]) and not result.done
    for _ in game.instance.follow_ups:
        result = game.step(spec.extract_action("All done."))
    assert result.done and "###STOP###" in result.observation_messages[0]["content"]


def test_reply_matchers():
    assert mentions_amount("You get $45.30 back.", 45.3) and mentions_amount("refund: 1,045.37", 1045.37)
    assert mentions_amount("difference -12.34", -12.34) and mentions_amount("you pay 12.34", -12.34)
    assert not mentions_amount("1045.30 or 45.31", 45.3) and not mentions_amount("order W45", 45.0)
    assert mentions_order_id("Order #W1234567 is cancelled.", "#W1234567")
    assert mentions_order_id("order 1234567", "#W1234567") and not mentions_order_id("#W12345678", "#W1234567")
    assert mentions_phrase("It is Return  Requested.", "return requested")
    assert mentions_phrase("it was canceled", "cancelled") and not mentions_phrase("undelivered", "delivered")
