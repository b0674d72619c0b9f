"""pass^k (τ²-bench's metric) in benchmarks/results.py and in the storefront run's results and table."""
from __future__ import annotations

import json
import random

import pytest

from benchmarks.results import pass_hat_k
from benchmarks.storefront import run as run_cli


def sims_of(tasks: dict[str, list[float | None]], **extra_by_task) -> list[dict]:
    """One simulation per reward (None: unscored) of each task, in a shuffled order."""
    sims = [
        {"id": f"{task_id}-{trial}", "task_id": task_id, "trial": trial,
         "reward_info": None if reward is None else {"reward": reward}, **extra_by_task.get(task_id, {})}
        for task_id, rewards in tasks.items() for trial, reward in enumerate(rewards)
    ]
    random.Random(0).shuffle(sims)  # pass^k depends on counts only, not on the order of the trials
    return sims


def test_hand_computed_example():
    # a: 4 of 4 pass; b: 2 of 4 (0.99 is not a pass at threshold 1.0); c: 0 of 4. a's fifth trial is unscored.
    #   pass^1 = (4/4 + 2/4 + 0/4) / 3                          = 1.5 / 3 = 0.5
    #   pass^2 = (C(4,2)/C(4,2) + C(2,2)/C(4,2) + 0) / 3 = (1 + 1/6) / 3 = 7/18
    #   pass^3 = (1 + C(2,3)=0 + 0) / 3                         = 1/3
    #   pass^4 = (1 + 0 + 0) / 3                                = 1/3
    sims = sims_of({"a": [1.0, 1.0, 1.0, 1.0, None], "b": [1.0, 0.0, 0.99, 1.0], "c": [0.0, 0.5, 0.0, 0.0]})
    result = pass_hat_k(sims, 4)
    assert list(result) == ["all"]
    assert result["all"]["n_tasks"] == 3
    assert result["all"]["pass_hat_k"] == pytest.approx({1: 0.5, 2: 7 / 18, 3: 1 / 3, 4: 1 / 3})
    assert result["all"]["n_tasks_at_k"] == {1: 3, 2: 3, 3: 3, 4: 3}


def test_a_task_with_fewer_trials_than_k_drops_out_of_that_k():
    # a: 4 of 4 pass; b: 1 of 2.  pass^1 = (1 + 1/2) / 2 = 0.75;  pass^2 = (1 + 0) / 2 = 0.5;
    # pass^3, pass^4: only a has that many trials -> 1.0;  pass^5: no task has 5 trials -> absent.
    result = pass_hat_k(sims_of({"a": [1.0] * 4, "b": [0.0, 1.0], "unscored": [None, None]}), 5)["all"]
    assert result["pass_hat_k"] == pytest.approx({1: 0.75, 2: 0.5, 3: 1.0, 4: 1.0})
    assert result["n_tasks_at_k"] == {1: 2, 2: 2, 3: 1, 4: 1}
    assert result["n_tasks"] == 2  # a task without a scored trial is not counted at all


def test_a_task_counts_under_every_kind_it_holds():
    # t1 holds cancel + return, 2/2 pass; t2 cancel (twice), 0/2; t3 return + exchange, 1/2; t4 one more kind.
    #   cancel:   t1, t2 -> pass^1 (1 + 0)/2 = 0.5,    pass^2 (1 + 0)/2 = 0.5
    #   return:   t1, t3 -> pass^1 (1 + 1/2)/2 = 0.75, pass^2 (1 + 0)/2 = 0.5
    #   exchange: t3     -> pass^1 0.5,                pass^2 0
    #   modify_user_address (t4 alone): 1/2 -> 0.5, 0
    sims = sims_of(
        {"t1": [1.0, 1.0], "t2": [0.0, 0.0], "t3": [0.0, 1.0], "t4": [1.0, 0.0]},
        t1={"request_kinds": ["cancel", "return"]}, t2={"request_kinds": ["cancel", "cancel"]},
        t3={"request_kinds": ["return", "exchange"]}, t4={"request_kinds": ["modify_user_address"]},
    )
    result = pass_hat_k(sims, 2, groups=run_cli.request_kinds)
    assert list(result) == ["cancel", "exchange", "modify_user_address", "return"]
    assert {kind: group["n_tasks"] for kind, group in result.items()} == {
        "cancel": 2, "modify_user_address": 1, "exchange": 1, "return": 2}
    assert result["cancel"]["pass_hat_k"] == pytest.approx({1: 0.5, 2: 0.5})
    assert result["return"]["pass_hat_k"] == pytest.approx({1: 0.75, 2: 0.5})
    assert result["exchange"]["pass_hat_k"] == pytest.approx({1: 0.5, 2: 0.0})
    assert result["modify_user_address"]["pass_hat_k"] == pytest.approx({1: 0.5, 2: 0.0})
    overall = run_cli.pass_hat_k_by_kind(sims, 2)["all"]
    assert overall["n_tasks"] == 4 and overall["pass_hat_k"] == pytest.approx({1: 0.5, 2: 0.25})


def test_bad_arguments():
    sims = sims_of({"a": [1.0]})
    with pytest.raises(ValueError, match="k_max must be an int >= 1, got 0"):
        pass_hat_k(sims, 0)
    with pytest.raises(TypeError, match="got the string 'cancel'"):
        pass_hat_k(sims, 1, groups=lambda sim: "cancel")


def test_storefront_run_reports_pass_hat_k(tmp_path, capsys):
    out = tmp_path / "results.json"
    assert run_cli.main(["--agent", "expert", "--tasks", "8", "--trials", "3", "--seed", "1", "--out", str(out),
                         "--no-progress"]) == 0
    info = json.loads(out.read_text())["info"]
    assert info["pass_hat_k"]["all"] == {"n_tasks": 8, "1": 1.0, "2": 1.0, "3": 1.0}
    results = json.loads(out.read_text())
    by_kind: dict[str, set] = {}
    for sim in results["simulations"]:
        for kind in sim["request_kinds"]:
            by_kind.setdefault(kind, set()).add(sim["task_id"])
    assert {kind: group["n_tasks"] for kind, group in info["pass_hat_k"].items()} == {
        "all": 8, **{kind: len(tasks) for kind, tasks in by_kind.items()}}
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-3:] == ["pass^1", "pass^2", "pass^3"]
    assert lines[-2].split() == ["all", "24", "24", "1.000", "1.000", "1.000", "1.000"]


def test_storefront_pass_hat_1_matches_the_pass_rate_of_a_flawed_agent(tmp_path, capsys):
    # With equal trials per task, pass^1 is the pass rate: two computations that must agree, on an agent
    # that fails some tasks (the flawed expert ignores the status of forbidden requests).
    out = tmp_path / "results.json"
    assert run_cli.main(["--agent", "flawed:skip_status_check", "--tasks", "16", "--trials", "2", "--out", str(out),
                         "--no-progress"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:-1]}
    info = json.loads(out.read_text())["info"]["pass_hat_k"]
    assert info["all"]["1"] < 1.0
    for label, row in rows.items():
        assert float(row[3]) == pytest.approx(info[label]["1"], abs=5e-4), label
        assert float(row[4]) == pytest.approx(info[label]["1"], abs=5e-4), label
        assert float(row[5]) == pytest.approx(info[label]["2"], abs=5e-4), label


def test_table_has_a_column_per_k():
    # return: 1 of 2 -> pass^1 0.5, pass^2 0;  cancel: 2 of 2 -> 1, 1;  all: pass^1 0.75, pass^2 0.5.
    # pass^3: no task has 3 trials -> "-".
    sims = sims_of({"t1": [1.0, 0.0], "t2": [1.0, 1.0]}, t1={"request_kinds": ["return"]},
                   t2={"request_kinds": ["cancel"]})
    table = run_cli.format_table(sims, run_cli.pass_hat_k_by_kind(sims, 3), 3)
    assert [line.split() for line in table.splitlines()] == [
        ["kind", "passed", "n", "pass", "rate", "pass^1", "pass^2", "pass^3"],
        ["cancel", "2", "2", "1.000", "1.000", "1.000", "-"],
        ["return", "1", "2", "0.500", "0.500", "0.000", "-"],
        ["all", "3", "4", "0.750", "0.750", "0.500", "-"],
    ]
