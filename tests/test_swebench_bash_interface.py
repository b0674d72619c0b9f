"""The scenario game's bash interface (issue 26 point 3): mini-swe-agent's action format, one sandboxed shell
command per turn, graded by the same grader as the tools interface."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from game_registry import REPO_ROOT
from swebench.game import (SUBMIT_COMMAND, ScenarioGame, ScenarioGameConfig, SemanticLogicGameConfig,
                                    DeepCallGraphGameConfig, bash_turn, make_spec)
from pipeline.validate_game import validate


def new_game(seed: int = 2, config: ScenarioGameConfig | None = None) -> ScenarioGame:
    game = ScenarioGame(config or SemanticLogicGameConfig(command_timeout_s=20))
    game.reset(seed)
    return game


def say(game: ScenarioGame, text: str) -> str:
    """One assistant turn, parsed as the trainer parses it; returns the observation."""
    result = game.step(make_spec(game.config.capability).extract_action(text))
    assert len(result.observation_messages) == 1 and result.observation_messages[0]["role"] == "user"
    return result.observation_messages[0]["content"]


def run(game: ScenarioGame, command: str) -> str:
    return say(game, bash_turn("test step", command))


def play_oracle(game: ScenarioGame) -> None:
    while not game.done:
        say(game, game.oracle_response())


def test_bash_is_the_default_and_looks_like_mini_swe_agent():
    assert ScenarioGameConfig().interface == "bash"
    assert make_spec("semantic_logic_precision").system_prompt.startswith("You are a helpful assistant")
    game = new_game()
    messages = game.get_messages()
    assert "exactly ONE bash code block" in messages[0]["content"]
    assert "<pr_description>" in messages[1]["content"] and SUBMIT_COMMAND in messages[1]["content"]
    assert game.get_tool_schemas() == []  # plain text, no tool schemas, as mini-swe-agent sends
    assert run(game, "echo hello && exit 3") == "<returncode>3</returncode>\n<output>\nhello\n</output>"
    with pytest.raises(ValueError, match="interface must be 'bash'"):
        ScenarioGameConfig(interface="json")


@pytest.mark.parametrize("config_cls, seed", [(SemanticLogicGameConfig, 2), (DeepCallGraphGameConfig, 1)])
def test_the_oracle_scores_one(config_cls, seed):
    game = new_game(seed, config_cls(command_timeout_s=20))
    play_oracle(game)
    summary = game.get_summary()
    assert summary["reward"] == 1.0 and summary["success"] and summary["termination_reason"] == "submitted"
    assert summary["interface"] == "bash" and summary["commands"] >= 3


def test_a_submit_without_changes_scores_zero():
    game = new_game()
    observation = run(game, SUBMIT_COMMAND)
    assert game.done and observation.startswith("Submitted. Reward 0")
    assert game.get_summary()["reward"] == 0.0


def test_editing_a_test_then_submitting_scores_zero():
    game = new_game()
    scenario = game.workspace.scenario
    path, _, name = scenario.target_test.partition("::")
    # make the failing test return at once, and plant a conftest.py that passes every test, then submit in
    # the same command (the marker is the first line of the output)
    conftest = ("import pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
                "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n")
    command = (f"echo {SUBMIT_COMMAND.split()[-1]} && sed -i 's/^def {name}():/def {name}():\\n    return/' {path} "
               f"&& cat > conftest.py <<'EOF'\n{conftest}EOF\n")
    observation = run(game, command.rstrip("\n"))
    assert game.done and game.workspace.files["conftest.py"] == conftest
    assert "    return" in game.workspace.files[path]  # the edit happened in the agent's tree ...
    assert observation.startswith("Submitted. Reward 0")  # ... and the grader used the pristine tests
    assert game.get_summary()["reward"] == 0.0


def test_malformed_turns_get_a_format_error_and_run_nothing():
    game = new_game(config=SemanticLogicGameConfig(max_errors=2))
    none = say(game, "THOUGHT: I will just think about it.")
    assert "EXACTLY ONE action in triple backticks, found 0 actions" in none
    two = say(game, bash_turn("two at once", "ls") + "\n\n```bash\ntouch pwned.txt\n```")
    assert "found 2 actions" in two and "pwned.txt" not in game.workspace.files
    assert game.workspace.commands == 0 and game.get_summary()["format_errors"] == 2 and not game.done
    say(game, "```python\nprint(1)\n```")
    assert game.done and game.get_summary()["termination_reason"] == "too_many_errors"
    assert game.get_summary()["reward"] == 0.0


def test_long_output_is_cut_to_its_head_and_tail():
    game = new_game(config=SemanticLogicGameConfig(command_output_chars=1000, command_timeout_s=20))
    observation = run(game, "python3 -c \"print('a' * 3000 + 'b' * 3000)\"")
    assert "<warning>" in observation and "<output_head>" in observation and "<output_tail>" in observation
    assert "5001 characters elided" in observation and len(observation) < 2000
    head = observation.split("<output_head>\n", 1)[1].split("\n</output_head>")[0]
    tail = observation.split("<output_tail>\n", 1)[1].split("\n</output_tail>")[0]
    assert head == "a" * 500 and tail == "b" * 499 + "\n"


def test_a_command_past_its_time_is_killed():
    game = new_game(config=SemanticLogicGameConfig(command_timeout_s=1.0))
    started = time.perf_counter()
    observation = run(game, "echo started && sleep 30")
    assert time.perf_counter() - started < 20
    assert "timed out and has been killed" in observation and "started" in observation
    assert not game.done  # the episode goes on


def test_the_tree_persists_between_commands_without_the_hidden_tests():
    game = new_game()
    scenario = game.workspace.scenario
    first = run(game, "pwd && echo 'print(41 + 1)' > repro.py && find . -type f | sort")
    assert "./repro.py" in first
    assert all(path not in first for path in scenario.hidden_test_files())
    second = run(game, "pwd && python3 repro.py")
    assert first.split("<output>\n", 1)[1].splitlines()[0] == second.split("<output>\n", 1)[1].splitlines()[0]
    assert "42" in second and game.workspace.files["repro.py"] == "print(41 + 1)\n"


def test_the_older_submit_marker_submits_too():
    game = new_game()
    assert run(game, "echo MINI_SWE_AGENT_FINAL_OUTPUT").startswith("Submitted. Reward 0")
    game = new_game()
    observation = run(game, f"echo first && {SUBMIT_COMMAND}")  # the marker must be the FIRST line
    assert not game.done and observation.startswith("<returncode>0</returncode>")


@pytest.mark.slow  # ~7 s; test_swebench_game.test_validate_game_passes_on_the_semantic_game is the fast one
def test_validate_game_passes_in_bash_mode():
    report = validate(make_spec("semantic_logic_precision"), seeds=2, fuzz_actions=20)
    checks = report["checks"]
    assert report["passed"], {k: c["detail"] for k, c in checks.items() if c["status"] == "FAIL"}
    assert checks["oracle"]["success_rate"] == 1.0
    assert checks["baselines"]["do_nothing_mean_reward"] == 0.0
    probes = checks["probes"]["probes"]
    for name in ("edit_the_test", "delete_the_failing_test", "hard_code_the_example", "submit_without_changes"):
        assert probes[name]["applicable_seeds"] == 2 and probes[name]["success_rate"] == 0.0, name


def test_phase5_trains_in_the_bash_format_by_default():
    script = REPO_ROOT / "swebench" / "qwen3.6_self_trace" / "phase5_train.py"
    done = subprocess.run([sys.executable, str(script), "--capability", "semantic_logic_precision", "--model", "m",
                           "--dry-run"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    overrides = json.loads(done.stdout.split("--game_overrides ", 1)[1].split(" --", 1)[0].strip("'"))
    assert overrides["interface"] == "bash"
    tools = subprocess.run([sys.executable, str(script), "--capability", "semantic_logic_precision", "--model", "m",
                            "--interface", "tools", "--dry-run"], cwd=REPO_ROOT, capture_output=True, text=True,
                           timeout=120)
    assert '"interface": "tools"' in tools.stdout
