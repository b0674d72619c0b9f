"""What an evaluation records decides what it may be mixed with, and what it sends decides what it measures:
`python -m train.play` (benchmarks/storefront/run.py), `python -m benchmarks.tau2_run` and
`python -m train.collect_rollouts` keep in their journal what the results depend on (the weights behind a model
folder, the model a vLLM server samples with), leave no journal behind a run that played nothing, refuse input that
would be dropped silently (a --kinds the config gives no weight) or that no retry fixes (a vLLM server refusing the
key or the model), and the vllm: agent samples as the hf: agent and the trainer's rollouts do (a seed per episode
and turn, neutral top_p/top_k/penalties)."""
from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import types
from argparse import Namespace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from benchmarks.agents import Agent, ExpertAgent
from benchmarks.results import load_results
from fake_openai_server import send_json
from benchmarks.results_journal import ResultsJournal, agent_settings, kept_on_interrupt
from benchmarks.storefront import run as storefront_run
from common.validation import InputError


def journal_of(out: Path) -> Path:
    return Path(f"{out}.partial.jsonl")


# ----------------------------------------------------------------------------------------------
# A stand-in OpenAI-compatible server: records every request, answers `status` to completions
# ----------------------------------------------------------------------------------------------

class StandIn:
    """GET /v1/models lists `served`; POST /v1/completions answers `status` (200: a short reply)."""

    def __init__(self, status: int = 200, models_status: int = 200, served: str = "served-model",
                 owned_by: str = "vllm") -> None:
        self.requests: list[dict[str, Any]] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, code: int, body: dict[str, Any]) -> None:
                send_json(self, code, body)

            def do_GET(self) -> None:  # noqa: N802 - http.server's protocol
                if models_status != 200:
                    return self._answer(models_status, {"error": {"message": "refused", "type": "invalid_request"}})
                self._answer(200, {"object": "list", "data": [{"id": served, "object": "model",
                                                                "owned_by": owned_by}]})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stand_in.requests.append(body)
                if status != 200:
                    message = "Incorrect API key provided" if status in (401, 403) else "The model does not exist."
                    return self._answer(status, {"error": {"message": message, "type": "invalid_request_error"}})
                self._answer(200, {"id": "c", "object": "text_completion", "created": 0, "model": served,
                                   "choices": [{"index": 0, "text": "Goodbye.", "finish_reason": "stop",
                                                "logprobs": None}],
                                   "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "StandIn":
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


# ----------------------------------------------------------------------------------------------
# 1. The weights behind an hf: agent's folders are part of the run's settings
# ----------------------------------------------------------------------------------------------

def test_train_play_refuses_to_continue_with_other_weights_at_the_same_path(tiny_model_dir, tmp_path, monkeypatch,
                                                                            capsys):
    from train import agents
    from train.play import main

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    out = tmp_path / "r.json"
    argv = ["--agent", f"hf:{model}", "--tasks", "2", "--max-new-tokens", "2", "--out", str(out), "--no-progress"]
    begin = agents.HFAgent.begin_episode
    episodes = []

    def stop_at_the_second(self, game, seed=None):
        episodes.append(seed)
        if len(episodes) == 2:
            raise KeyboardInterrupt
        begin(self, game, seed)

    monkeypatch.setattr(agents.HFAgent, "begin_episode", stop_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        main(argv)
    assert journal_of(out).exists()  # one episode kept
    weights = model / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # trained again
    capsys.readouterr()
    assert main(argv) == 2  # not continued: its episodes would mix two models' results
    err = capsys.readouterr().err
    assert "holds a run with other settings (agent differ)" in err and "Traceback" not in err, err
    settings = json.loads(journal_of(out).read_text().splitlines()[0])["settings"]
    assert settings["agent"]["fingerprints"]["model"] and settings["agent"]["fingerprints"]["adapter"] is None


# ----------------------------------------------------------------------------------------------
# 2. collect_rollouts on vLLM: the served model is part of the settings and the results
# ----------------------------------------------------------------------------------------------

def test_collect_rollouts_on_vllm_refuses_another_served_model(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from common.cli import Interrupted
    import train.collect_rollouts as cr

    calls = []

    def played(spec, chunk, backend, chat, **kwargs):
        calls.append(len(chunk))
        if stop_at and len(calls) == stop_at:
            raise KeyboardInterrupt
        return [(request, backend.served_model) for request in chunk]

    def simulation(episode):
        request, served = episode
        return {"id": f"{request.seed}-{request.sample_idx}", "task_id": str(request.seed),
                "sample_idx": request.sample_idx, "trial": 0, "messages": [], "termination_reason": "user_stop",
                "reward_info": {"reward": 1.0, "served": served}}

    monkeypatch.setattr(cr, "run_episodes", played)
    monkeypatch.setattr(cr, "episode_to_simulation", simulation)
    monkeypatch.setattr(cr, "ROLLOUT_BATCH_SIZE", 1)  # a batch per episode: the run stops between two
    monkeypatch.setenv("VLLM_BASE_URLS", "http://127.0.0.1:9")  # never asked: the episodes are the stand-in's
    out = tmp_path / "rollouts.json"
    argv = ["--game", "storefront", "--model", str(tiny_model_dir), "--seeds", "2", "--samples", "1",
            "--out", str(out)]
    monkeypatch.setenv("VLLM_MODEL", "model-A")
    stop_at = 2
    with pytest.raises(Interrupted):
        cr.main(argv)
    assert journal_of(out).exists()
    monkeypatch.setenv("VLLM_MODEL", "model-B")  # another model behind the same server and names
    capsys.readouterr()
    assert cr.main(argv) == 2
    err = capsys.readouterr().err
    assert "holds a run with other settings" in err and "served_model" in err and "vllm_model" in err, err
    monkeypatch.setenv("VLLM_MODEL", "model-A")
    stop_at = 0
    assert cr.main(argv) == 0
    info = load_results(out)["info"]
    assert (info["sampled_by"], info["vllm_model"], info["served_model"]) == ("vllm", "model-A", "model-A")


# ----------------------------------------------------------------------------------------------
# 3. --kinds cannot name a kind the config leaves out
# ----------------------------------------------------------------------------------------------

def test_kinds_the_config_gives_no_weight_are_refused(tmp_path, capsys):
    config = tmp_path / "mix.yaml"
    config.write_text("kind_weights: {cancel: 0.3, return: 0.25, exchange: 0.1, modify_user_address: 0}\n")
    for kinds, missing in (("cancel,modify_order_address", "modify_order_address"),
                           ("modify_user_address", "modify_user_address")):
        out = tmp_path / "never.json"
        code = storefront_run.main(["--agent", "expert", "--tasks", "2", "--config", str(config), "--kinds", kinds,
                                    "--out", str(out), "--no-progress"])
        err = capsys.readouterr().err
        assert code == 2 and f"{missing} has no weight in {config}" in err, err
        assert "whose kinds are cancel, return, exchange" in err and len(err.strip().splitlines()) == 1
        assert not out.exists() and not journal_of(out).exists()


def test_results_list_the_kinds_that_were_played(tmp_path):
    out = tmp_path / "k.json"
    assert storefront_run.main(["--agent", "expert", "--tasks", "2", "--kinds", "return,cancel", "--out", str(out),
                                "--no-progress"]) == 0
    info = load_results(out)["info"]
    assert info["kinds"] == list(info["config"]["kind_weights"]) == ["cancel", "return"]


# ----------------------------------------------------------------------------------------------
# 4. A vLLM server refusing the key or the model: one line, exit 2, no journal left
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("status, fix", [(401, "$AGENT_KEY (--api-key-env)"), (403, "$AGENT_KEY (--api-key-env)"),
                                         (404, "pass --model with a name listed at")])
def test_a_refused_key_or_model_is_one_line_and_leaves_no_journal(tiny_model_dir, tmp_path, monkeypatch, capsys,
                                                                  status, fix):
    from common.cli import exit_code
    from train.play import main

    monkeypatch.setenv("AGENT_KEY", "sk-not-valid-here")
    out = tmp_path / "r.json"
    with StandIn(status=status) as server:
        code = exit_code(main, ["--agent", f"vllm:{server.url}", "--tokenizer", str(tiny_model_dir), "--model",
                                "wrong-name", "--api-key-env", "AGENT_KEY", "--tasks", "2", "--out", str(out),
                                "--no-progress"])
        assert len(server.requests) == 1  # the first request, not retried
    err = capsys.readouterr().err
    assert code == 2 and f"HTTP {status}" in err and fix in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "sk-not-valid-here" not in err
    assert not out.exists() and not journal_of(out).exists()


def test_a_refused_key_while_listing_models_names_the_missing_key(tiny_model_dir):
    from train.agents import VLLMAgent

    with StandIn(models_status=401) as server:
        with pytest.raises(InputError, match="HTTP 401.*the server wants a key: .* --api-key-env NAME"):
            VLLMAgent(server.url, None, tiny_model_dir, timeout_s=5.0, max_retries=0)


# ----------------------------------------------------------------------------------------------
# 5. The vllm: agent samples with a seed per episode and turn, and neutral sampling knobs
# ----------------------------------------------------------------------------------------------

NEUTRAL = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
           "frequency_penalty": 0.0}  # what train/vllm_backend.py sends with every rollout (written out: the test
# must fail if those values change without this agent following)


def test_the_vllm_agent_sends_a_seed_per_episode_and_turn_and_neutral_sampling(tiny_model_dir):
    from benchmarks.storefront.env import StorefrontGame
    from train.agents import VLLMAgent

    game = StorefrontGame()
    messages = game.reset(0)
    tools = game.get_tool_schemas()
    with StandIn() as server:
        agent = VLLMAgent(server.url, "served-model", tiny_model_dir, temperature=1.0, timeout_s=5.0)
        for seed in (7, 7, 8):
            agent.begin_episode(game, seed=seed)
            agent.respond(messages, tools)
            agent.respond(messages, tools)
        seeds = [request.get("seed") for request in server.requests]
        assert all({k: request.get(k) for k in NEUTRAL} == NEUTRAL for request in server.requests), server.requests
    assert None not in seeds and seeds[:2] == seeds[2:4]  # the same episode seed: the same draws
    assert len(set(seeds[:2])) == 2 and not set(seeds[4:]) & set(seeds[:2])  # turns and episodes differ


def test_another_openai_compatible_host_gets_only_the_standard_sampling_fields(tiny_model_dir):
    from benchmarks.storefront.env import StorefrontGame
    from train.agents import VLLMAgent

    game = StorefrontGame()
    messages = game.reset(0)
    with StandIn(owned_by="some-host") as server:
        agent = VLLMAgent(server.url, "served-model", tiny_model_dir, temperature=1.0, timeout_s=5.0)
        agent.begin_episode(game, seed=3)
        agent.respond(messages, game.get_tool_schemas())
        [request] = server.requests
    assert not set(NEUTRAL) & set(request) and request["seed"] is not None


# ----------------------------------------------------------------------------------------------
# 6. A run interrupted before its first episode leaves no journal that would block the corrected command
# ----------------------------------------------------------------------------------------------

def test_storefront_run_interrupted_before_its_first_episode_leaves_no_journal(tmp_path, monkeypatch):
    out = tmp_path / "r.json"

    def interrupted(self, game, seed=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(ExpertAgent, "begin_episode", interrupted)
    with pytest.raises(KeyboardInterrupt, match="0 scored episodes"):
        storefront_run.main(["--agent", "expert", "--tasks", "3", "--out", str(out), "--no-progress"])
    assert not journal_of(out).exists()
    monkeypatch.undo()
    assert storefront_run.main(["--agent", "expert", "--tasks", "2", "--out", str(out), "--no-progress"]) == 0


class _Refused(Agent):
    """An agent whose server refuses it at the first request, or a Ctrl-C before the first episode."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def begin_episode(self, game, seed=None) -> None:
        raise self.error

    def respond(self, messages, tools) -> str:  # pragma: no cover - never reached
        raise AssertionError

    def describe(self) -> dict[str, Any]:
        return {"implementation": "Refused", "base_url": "http://somewhere/v1"}


@pytest.mark.parametrize("error", [KeyboardInterrupt(), InputError("the server refused the key")])
def test_tau2_run_that_played_nothing_leaves_no_journal(tmp_path, monkeypatch, capsys, error):
    """benchmarks.tau2_run's journal, with τ²-bench's package stood in for (the runner's own code runs)."""
    from benchmarks import tau2_run

    class Tau2Game:
        def __init__(self, domain, config):
            self.domain = types.SimpleNamespace(name=domain)

        def reset(self, index, trial=0):
            pass

    fake = types.ModuleType("benchmarks.tau2_game")
    fake.Tau2Config = lambda **fields: Namespace(**fields)
    fake.Tau2Game = Tau2Game
    fake.split_tasks = lambda domain, split: [object()] * 3
    monkeypatch.setitem(sys.modules, "benchmarks.tau2_game", fake)
    monkeypatch.setattr(tau2_run, "require_tau2", lambda: None)
    monkeypatch.setattr(tau2_run, "check_customer_server", lambda url: None)
    out = tmp_path / "t.json"
    argv = ["--domain", "retail", "--agent", "x", "--user-base-url", "http://127.0.0.1:9/v1", "--user-model", "u",
            "--out", str(out), "--no-progress"]
    if isinstance(error, KeyboardInterrupt):
        with pytest.raises(KeyboardInterrupt, match="0 scored episodes"):
            tau2_run.main(argv, make_agent=lambda args: _Refused(error))
    else:
        assert tau2_run.main(argv, make_agent=lambda args: _Refused(error)) == 2
        assert "the server refused the key" in capsys.readouterr().err
    assert not journal_of(out).exists() and not out.exists()


def test_kept_on_interrupt_keeps_a_journal_that_recorded_anything(tmp_path):
    for record in ("add", "server_error", "mark", None):
        out = tmp_path / f"{record}.json"
        with ResultsJournal(out, {"a": 1}) as journal, kept_on_interrupt(journal, "episodes"):
            if record == "add":
                journal.add((0, 0), {"task_id": "0"}, {})
            elif record == "server_error":
                journal.server_error((0, 0), "HTTP 503")
            elif record == "mark":
                journal.mark("m", 1)
        assert journal_of(out).exists() == (record is not None), record


def test_journal_agent_settings_leave_out_only_where_the_server_listens():
    assert agent_settings(_Refused(KeyboardInterrupt())) == {"implementation": "Refused"}


# ----------------------------------------------------------------------------------------------
# 7. The report's pass-vs-rollouts plot names the evaluation's temperature
# ----------------------------------------------------------------------------------------------

def test_pass_vs_rollouts_titles_name_the_evaluation_temperature(tmp_path, monkeypatch):
    from demo import report_plots

    titles: list[list[str]] = []
    monkeypatch.setattr(report_plots, "save_figure",
                        lambda figure, path: titles.append([axis.get_title() for axis in figure.axes]) or path)
    points = {"base": (0, {"greedy": (0.2, 0.01), "sampled": (0.1, 0.02)}),
              "TRACE": (64, {"greedy": (0.5, 0.03), "sampled": (0.4, 0.05)})}
    report_plots.plot_pass_vs_rollouts(points, tmp_path / "a.png", "T=0.7")
    report_plots.plot_pass_vs_rollouts(points, tmp_path / "b.png")
    assert titles == [["pass^1, greedy", "pass^1, T=0.7"], ["pass^1, greedy", "pass^1, sampled"]]
