"""Skill-less policies that won the storefront and its capability games before their holes were closed by rule.

Each policy below is one the issue measured winning (guessing across turns, blanket confirmation, a report the
customer never read); each now scores 0 success on every seed, because of a rule about the skill, not a check
for the trick: a wrong assertion voids the request it is about, only a statement the customer received is a
report, and the customer confirms only a question naming the one pending action and its order.
The legitimate counterpart of each policy (the expert) still succeeds on the same seeds.
"""
from __future__ import annotations

from typing import Any, Callable

import pytest

from benchmarks.storefront.config import StorefrontConfig
from benchmarks.storefront.db import ORDER_STATUSES
from benchmarks.storefront.env import StorefrontGame
from game_registry import get_game, parse_hermes_action

SEEDS = range(40)
KINDS = {"cancel": 0.3, "return": 0.25, "exchange": 0.1}  # the CPU demo's target mix


def play(game: Any, policy: Callable[[Any], str], max_turns: int = 40) -> dict[str, Any]:
    """Play `policy(game) -> text` until the episode ends; the final summary."""
    for _ in range(max_turns):
        if game.done:
            break
        game.step(parse_hermes_action(policy(game)))
    return game.get_summary()


def is_write(game: Any, text: str) -> bool:
    action = parse_hermes_action(text)
    return action.kind == "tool_call" and any(c.name in game.write_tool_names() for c in action.tool_calls)


def is_call(text: str) -> bool:
    return parse_hermes_action(text).kind == "tool_call"


def looked_up_orders(game: Any) -> list[str]:
    return [r.arguments["order_id"] for r in game.state.tool_calls if r.ok and r.name == "get_order_details"]


class GuessStatuses:
    """Make the oracle's calls but never read them: after the look-up, one question-reply per status, each
    asserting another status of the order ("Order #W1 is processed, is that right?"), then a statement
    that says nothing. The customer answers each question, so the request stays open across the guesses."""

    def __init__(self) -> None:
        self.guesses: list[str] = []

    def __call__(self, game: Any) -> str:
        text = game.oracle_response()
        if (is_call(text) and not is_write(game, text)) or not looked_up_orders(game):
            return text
        if is_write(game, text):  # an agent that never reads the status cannot know it may act: it does not
            text = "OK."
        if not self.guesses:
            order_id = looked_up_orders(game)[-1]
            self.guesses = [f"Order {order_id} is {status}, is that right?" for status in ORDER_STATUSES]
            self.guesses.append("I have noted your request.")
        return self.guesses.pop(0)


class GuessAmounts:
    """The oracle up to its write, then instead of the arithmetic one question-reply per candidate amount
    (every price seen, and every sum and difference of two), the right one among them, then a statement
    that states no amount."""

    def __init__(self) -> None:
        self.guesses: list[str] | None = None

    def __call__(self, game: Any) -> str:
        written = any(r.ok and r.name in game.write_tool_names() for r in game.state.tool_calls)
        if not written:
            return game.oracle_response()
        if self.guesses is None:
            from pipeline.probes import observed_numbers
            numbers = observed_numbers(game)
            candidates = {f"{x:.2f}" for x in numbers}
            candidates |= {f"{abs(a - b):.2f}" for a in numbers for b in numbers} | {f"{a + b:.2f}" for a in numbers
                                                                                    for b in numbers}
            self.guesses = [f"That makes {c}, is that right?" for c in sorted(candidates, key=float)]
            self.guesses.append("Your request is done.")
        return self.guesses.pop(0) if self.guesses else "Your request is done."


def blanket_confirmation(game: Any) -> str:
    """The oracle, but every confirmation question is one fixed question naming every action."""
    text = game.oracle_response()
    if "Shall I proceed?" in text:
        order_ids = looked_up_orders(game)
        return ("Shall I proceed with the cancel, return, exchange or address change for order "
                f"{order_ids[-1] if order_ids else ''}?")
    return text


class ReportInMalformedTurn:
    """The oracle, but each closing statement is sent inside a turn the parser rejects (an unbalanced
    </tool_call>), then a statement that says nothing: the customer only ever got a format error."""

    def __init__(self) -> None:
        self.sent: set[str] = set()

    def __call__(self, game: Any) -> str:
        text = game.oracle_response()
        if is_call(text) or "?" in text or text.startswith("Please give"):
            return text
        if text not in self.sent:
            self.sent.add(text)
            return f"{text}\n</tool_call>"
        return "Done."


class ReportAsQuestion:
    """The oracle, but each closing statement becomes a question naming the same values."""

    def __call__(self, game: Any) -> str:
        text = game.oracle_response()
        if is_call(text) or "?" in text or text.startswith("Please give"):
            return text
        return f"{text} Is there anything else I can do about it?"


def storefront(**overrides: Any) -> StorefrontGame:
    fields = dict(request_counts=(1.0,), kind_weights=KINDS, unknown_order_id_rate=0.0, order_id_digits=3,
                  item_id_digits=3, product_id_digits=3, user_id_digits=3, payment_id_digits=3, short_emails=True)
    return StorefrontGame(StorefrontConfig(**{**fields, **overrides}))


def success_rate(make_game: Callable[[], Any], make_policy: Callable[[], Callable[[Any], str]],
                 seeds: range = SEEDS) -> float:
    wins = 0
    for seed in seeds:
        game = make_game()
        game.reset(seed)
        wins += play(game, make_policy())["success"]
    return wins / len(seeds)


def test_the_expert_still_wins_every_game_the_attacks_play():
    def oracle() -> Callable[[Any], str]:
        return lambda game: game.oracle_response()

    assert success_rate(lambda: storefront(forbidden_rate=1.0), oracle) == 1.0
    assert success_rate(lambda: storefront(forbidden_rate=0.0), oracle) == 1.0
    # Every request kind, up to three per customer, 3-digit ids: a street number or an amount whose digits are
    # another order's id ("360 Cedar Ln" beside order #W360) is no reference to that order, for the customer
    # confirming a change or for the judge of what was told.
    every_kind = lambda: storefront(kind_weights=StorefrontConfig().kind_weights, request_counts=(0.6, 0.3, 0.1),
                                    unknown_order_id_rate=0.15)
    assert success_rate(every_kind, oracle, seeds=range(300)) == 1.0
    for name, overrides in (("capability_tool_calling_precision", {"looseness": 2}),
                            ("capability_multi_step_task_completion", {"n_requests": 4})):
        spec = get_game(name)
        make = lambda: spec.make_env(spec.config_cls(storefront="configs/storefront/cpu_demo.yaml", **overrides))
        assert success_rate(make, oracle, seeds=range(120)) == 1.0, name
    for name in ("capability_precondition_verification", "capability_structured_data_reasoning"):
        assert success_rate(get_game(name).make_env, oracle) == 1.0, name


@pytest.mark.parametrize("make_game", [
    pytest.param(lambda: storefront(forbidden_rate=1.0), id="storefront_all_forbidden"),
    pytest.param(lambda: get_game("capability_precondition_verification").make_env(
        get_game("capability_precondition_verification").config_cls(violating_fraction=1.0)), id="precondition_forbidden"),
])
def test_statuses_guessed_across_turns_never_win(make_game):
    """Issue 24: asserting a different status in each of several question-replies won every forbidden task
    (the right guess counted, the wrong ones were dropped without penalty)."""
    assert success_rate(make_game, GuessStatuses) == 0.0


@pytest.mark.parametrize("make_game", [
    pytest.param(lambda: storefront(forbidden_rate=0.0, kind_weights={"return": 0.25, "exchange": 0.1}),
                 id="storefront_amounts"),
    pytest.param(lambda: get_game("capability_structured_data_reasoning").make_env(), id="structured"),
])
def test_amounts_guessed_across_turns_never_win(make_game):
    """Issue 24: the oracle with its arithmetic replaced by one candidate amount per reply scored 0.70 on
    the structured game and 0.88 on storefront tasks with an amount to tell."""
    assert success_rate(make_game, GuessAmounts) == 0.0


def test_one_question_offering_every_action_gets_no_yes():
    """Issue 24: one fixed question naming every action passed the confirmation rule on every task."""
    game = storefront(forbidden_rate=0.0)
    assert success_rate(lambda: game, lambda: blanket_confirmation) == 0.0
    game.reset(0)
    while not game.done and "Shall I proceed?" not in game.oracle_response():
        game.step(parse_hermes_action(game.oracle_response()))
    answer = game.step(parse_hermes_action(blanket_confirmation(game))).observation_messages[0]["content"]
    assert answer.startswith("I only asked you to"), answer  # a clarifying answer, not a yes or a no


def test_a_question_naming_another_order_of_the_customers_gets_no_yes():
    game = storefront(forbidden_rate=0.0, request_counts=(0.0, 1.0), kind_weights={"cancel": 1.0})
    for seed in range(10):
        game.reset(seed)
        while "Shall I proceed?" not in game.oracle_response():
            game.step(parse_hermes_action(game.oracle_response()))
        asked = game.oracle_response()
        other = next(s.order_id for s in game.subs if s is not game.current)
        both = asked.replace(game.current.order_id, f"{game.current.order_id} and order {other}")
        answer = game.step(parse_hermes_action(both)).observation_messages[0]["content"]
        assert answer.startswith("I only asked you to"), (seed, both, answer)
        answer = game.step(parse_hermes_action(asked)).observation_messages[0]["content"]
        assert answer.startswith("Yes"), (seed, asked, answer)  # the question about the one order gets its yes


@pytest.mark.parametrize("make_policy", [ReportInMalformedTurn, ReportAsQuestion], ids=["malformed", "question"])
@pytest.mark.parametrize("make_game", [
    pytest.param(lambda: storefront(), id="storefront"),
    pytest.param(lambda: get_game("capability_precondition_verification").make_env(), id="precondition"),
    pytest.param(lambda: get_game("capability_structured_data_reasoning").make_env(), id="structured"),
    pytest.param(lambda: get_game("capability_tool_calling_precision").make_env(), id="tool_calling"),
])
def test_a_report_the_customer_never_read_as_one_tells_nothing(make_game, make_policy):
    """Issue 24: the closing statement inside an unbalanced </tool_call> turn counted as told, though the
    customer only got a format error; a question naming the order after a write counted as the report."""
    assert success_rate(make_game, make_policy, seeds=range(20)) == 0.0
