"""The capability games and the storefront share one scripted customer: the same question gets the same
answer in both (a game that trained against another customer would teach habits the target punishes)."""
from __future__ import annotations

import pytest

from benchmarks.storefront.env import StorefrontGame
from benchmarks.storefront.user_sim import NO_REPLY, YES_REPLIES, UserSimulator
from game_registry import get_game, list_games, parse_hermes_action

CAPABILITY_GAMES = [name for name in list_games() if get_game(name).capability]


def order_answers(ref: str) -> set[str]:
    return {f"It's {ref}.", f"The order id is {ref}."}


@pytest.mark.parametrize("name", CAPABILITY_GAMES)
def test_games_use_the_storefront_customer(name):
    game = get_game(name).make_env()
    game.reset(0)
    assert type(game.customer) is UserSimulator


@pytest.mark.parametrize("name", CAPABILITY_GAMES)
def test_which_order_gets_the_id_in_games_as_in_the_storefront(name):
    spec = get_game(name)
    asked = 0
    for seed in range(30):
        game = spec.make_env()
        game.reset(seed)
        request = game.customer.current
        if not request.order_id:
            continue
        result = game.step(spec.extract_action("Which order do you mean?"))
        assert not result.done  # the old game customer closed the request and left
        assert result.observation_messages[0]["content"] in order_answers(request.order_ref), seed
        asked += 1
    assert asked >= 10


def test_which_order_gets_the_id_in_the_storefront():
    game = StorefrontGame()
    asked = 0
    for seed in range(40):
        game.reset(seed)
        request = game.user.current
        if not request.order_id or not request.order_ref:
            continue
        result = game.step(parse_hermes_action("Which order do you mean?"))
        assert not result.done
        assert result.observation_messages[0]["content"] in order_answers(request.order_ref), seed
        asked += 1
    assert asked >= 10


def test_confirmations_follow_the_targets_rules_in_a_game():
    """Before, the game customer said yes to any confirmation; the target's says yes only about the current
    request (its kind word and order id) and no otherwise."""
    game = get_game("capability_precondition_verification").make_env()
    game.reset(3)
    game.step(parse_hermes_action(game.oracle_response()))  # who are you?
    answer = game.step(parse_hermes_action(game.instance.requests[0].confirmation)).observation_messages[0]
    assert answer["content"] in YES_REPLIES
    answer = game.step(parse_hermes_action("Should I cancel order #W0000000 instead?")).observation_messages[0]
    assert answer["content"] == NO_REPLY
