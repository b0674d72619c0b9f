"""The scenario game: tools, reward, oracle, probes, registration, the trainer on it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from game_registry import REPO_ROOT, parse_hermes_action
from swebench import game as game_module
from swebench.game import ScenarioGameConfig, SemanticLogicGameConfig
from swebench.generators import generate_one
from swebench.scenario import Scenario, save_scenarios
from pipeline.validate_game import probe_check, validate
from game_registry import render_tool_call


CAPABILITIES = ("semantic_logic_precision", "deep_call_graph_traversal")


def make_spec(capability: str):
    """These tests are of the tools interface (the bash interface, the default: test_swebench_bash_interface.py)."""
    return game_module.make_spec(capability, interface="tools")


def call(name: str, **arguments) -> str:
    return render_tool_call(name, arguments)


def play(game, texts: list[str]) -> list[str]:
    spec = make_spec(game.config.capability)
    out = []
    for text in texts:
        result = game.step(spec.extract_action(text))
        out.append(result.observation_messages[0]["content"])
    return out


@pytest.fixture()
def semantic_game():
    game = make_spec("semantic_logic_precision").make_env()
    game.reset(2)
    return game


# --------------------------------------------------------------------------------------------------
# validate_game: oracle 100%, no-op 0, every probe loses
# --------------------------------------------------------------------------------------------------
@pytest.mark.slow  # ~6 s: validate_game over the semantic game's scenarios
def test_validate_game_passes_on_the_semantic_game():
    report = validate(make_spec("semantic_logic_precision"), seeds=3, fuzz_actions=40)
    checks = report["checks"]
    assert report["passed"], {k: c["detail"] for k, c in checks.items() if c["status"] == "FAIL"}
    assert checks["oracle"]["success_rate"] == 1.0
    assert checks["baselines"]["do_nothing_mean_reward"] == 0.0
    probes = checks["probes"]["probes"]
    for name in ("edit_the_test", "delete_the_failing_test", "hard_code_the_example", "submit_without_changes",
                 "act_without_lookups", "refuse_blindly"):
        assert probes[name]["applicable_seeds"] == 3 and probes[name]["success_rate"] == 0.0, name


@pytest.mark.slow
def test_validate_game_passes_on_the_deep_call_graph_game():
    report = validate(make_spec("deep_call_graph_traversal"), seeds=10, fuzz_actions=200)
    assert report["passed"], report["failures"]


def test_probes_catch_a_game_that_ignores_hidden_tests(monkeypatch):
    """Break the grader (hidden tests dropped): hard-coding the issue's example must now win, and fail the check."""
    monkeypatch.setattr(Scenario, "hidden_test_files", lambda self: [])
    check = probe_check(make_spec("semantic_logic_precision"), seeds=2)
    assert check["status"] == "FAIL"
    assert check["probes"]["hard_code_the_example"]["success_rate"] == 1.0


# --------------------------------------------------------------------------------------------------
# Tools and reward
# --------------------------------------------------------------------------------------------------
def test_the_tools_refuse_what_the_rules_forbid(semantic_game):
    ws = semantic_game.workspace
    source = next(p for p in sorted(ws.files) if p not in ws.scenario.test_files and p.endswith(".py")
                  and "__init__" not in p)
    test_path = ws.scenario.test_files[0]
    first_line = ws.files[source].splitlines()[0]
    out = play(semantic_game, [
        call("replace_in_file", path=source, old=first_line, new="# x"),
        call("view_file", path=test_path),
        call("replace_in_file", path=test_path, old="assert", new="assert True or"),
        call("view_file", path=source, start_line=2, end_line=3),
        call("replace_in_file", path=source, old="self", new="me"),
        call("view_file", path="pkg/nowhere.py"),
        call("search", pattern="def "),
    ])
    assert "view" in out[0] and "before editing" in out[0]
    assert "read-only" in out[2]
    assert out[3].startswith(f"{source} (lines 2-3 of ")
    assert "occurs" in out[4] and "exactly once" in out[4]
    assert "no file 'pkg/nowhere.py'" in out[5]
    assert f"{source}:" in out[6]
    assert semantic_game.workspace.files == {p: ws.scenario.files[p] for p in ws.files}  # nothing changed
    assert not semantic_game.done


def test_run_tests_reports_and_is_limited():
    game = game_module.ScenarioGame(SemanticLogicGameConfig(max_test_runs=2, interface="tools"))
    game.reset(5)
    scenario = game.workspace.scenario
    out = play(game, [call("run_tests"), call("run_tests", test=scenario.target_test), call("run_tests")])
    assert "1 failed" in out[0] and f"FAILED {scenario.target_test}" in out[0]
    assert out[1].startswith("0 passed, 1 failed")
    assert "may be called 2 times" in out[2]
    hidden = scenario.hidden_test_files()[0]
    assert hidden not in json.dumps(game.get_messages())  # hidden tests are never shown


def test_submit_ends_the_episode_with_the_grade(semantic_game):
    spec = make_spec("semantic_logic_precision")
    while not semantic_game.done:
        semantic_game.step(spec.extract_action(semantic_game.oracle_response()))
    summary = semantic_game.get_summary()
    assert summary["reward"] == 1.0 and summary["success"] and summary["termination_reason"] == "submitted"
    assert summary["grade"]["hidden_passed"] == summary["grade"]["hidden_total"] >= 1


def test_no_submit_scores_zero_even_when_fixed():
    spec = make_spec("semantic_logic_precision")
    game = spec.make(max_steps=3)
    game.reset(4)
    for _ in range(3):
        text = game.oracle_response()
        if "submit" in text or "run_tests" in text:
            text = "I think it is fixed now."
        game.step(spec.extract_action(text))
    assert game.done and game.get_summary()["reward"] == 0.0 and not game.get_summary()["submitted"]


def test_partial_credit_is_configurable(tmp_path):
    """Fix the bug but break `is_century` (one regression test): 0 by default, partial credit when configured."""
    path = tmp_path / "leap.json"
    scenario = generate_one("semantic_logic_precision", 2, template="leap_years")
    save_scenarios(path, [scenario])
    spec = make_spec("semantic_logic_precision")
    rewards = {}
    for credit in (0.0, 0.5):
        game = spec.make(scenarios_path=str(path), partial_credit=credit)
        game.reset(0)
        core = next(p for p in game.workspace.files if p.endswith("calendar.py"))
        play(game, [game.oracle_response()])  # view
        play(game, [game.oracle_response()])  # the fix
        play(game, [call("replace_in_file", path=core, old="return year % 100 == 0", new="return year % 100 == 1"),
                    call("submit")])
        summary = game.get_summary()
        assert summary["grade"]["target"] == "passed" and summary["termination_reason"] == "submitted"
        rewards[credit] = summary["reward"]
        regressions = summary["grade"]["regression_total"]
    assert rewards[0.0] == 0.0
    assert rewards[0.5] == pytest.approx(0.5 * (regressions - 1) / regressions)


def test_config_validates_with_the_fix(tmp_path):
    with pytest.raises(ValueError, match="capability must be one of"):
        ScenarioGameConfig(capability="nope")
    with pytest.raises(ValueError, match="is not a file; generate one with"):
        ScenarioGameConfig(scenarios_path=str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="partial_credit"):
        ScenarioGameConfig(partial_credit=2)
    with pytest.raises(ValueError, match="mutation_rounds must be within 0..5"):
        ScenarioGameConfig(mutation_rounds=9)
    with pytest.raises(ValueError, match="max_steps"):
        ScenarioGameConfig(max_steps=True)


def test_scenarios_file_mode_plays_seed_mod_n(tmp_path):
    path = tmp_path / "set.json"
    scenarios = [generate_one("semantic_logic_precision", s) for s in (11, 12, 13)]
    save_scenarios(path, scenarios)
    spec = make_spec("semantic_logic_precision")
    ids = []
    for seed in (0, 1, 2, 3, 4):
        game = spec.make(scenarios_path=str(path))
        game.reset(seed)
        ids.append(game.workspace.scenario.id)
    assert ids == [s.id for s in scenarios] + [scenarios[0].id, scenarios[1].id]


def test_spec_shape():
    for capability in CAPABILITIES:
        spec = make_spec(capability)
        assert spec.name == f"capability_{capability}" and spec.capability == capability
        game = spec.make_env()
        assert game.write_tool_names() == {"replace_in_file", "submit"} and game.auth_tool_names() == frozenset()
        assert [s["function"]["name"] for s in game.get_tool_schemas()] == [
            "view_file", "search", "replace_in_file", "run_tests", "submit"]
        assert spec.difficulty_knob("mutation_rounds") is not None
        assert parse_hermes_action(game.reset(1) and game.oracle_response()).kind == "tool_call"


# --------------------------------------------------------------------------------------------------
# Registration: validate_game and the GRPO trainer, unchanged, through TRACE_GAMES_DIRS
# --------------------------------------------------------------------------------------------------
def _env() -> dict[str, str]:
    return {**os.environ, "TRACE_GAMES_DIRS": str(REPO_ROOT / "swebench" / "games"), "PYTHONPATH": str(REPO_ROOT)}


@pytest.mark.slow
def test_validate_game_cli_finds_the_registered_games():
    for capability in CAPABILITIES:
        done = subprocess.run([sys.executable, "-m", "pipeline.validate_game", f"capability_{capability}", "--seeds",
                               "3", "--fuzz-actions", "30", "--no-progress"], env=_env(), cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        assert "RESULT: PASS" in done.stdout


@pytest.mark.slow
def test_the_grpo_trainer_trains_on_the_scenario_game(tiny_model_dir, tmp_path):
    out = tmp_path / "adapter"
    done = subprocess.run([sys.executable, "-m", "train", "--game", "capability_semantic_logic_precision", "--model",
                           str(tiny_model_dir), "--output_dir", str(out), "--iterations", "1", "--groups_per_iteration",
                           "2", "--group_size", "2", "--lora_r", "2", "--max_episode_tokens", "3000",
                           "--micro_batch_size", "2", "--game_overrides", "{max_steps: 3, max_test_runs: 1}"],
                          env=_env(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "adapter_model.safetensors").is_file()
    rollouts = json.loads(next((out / "rollouts").glob("iter_*.json")).read_text())["simulations"]
    assert len(rollouts) == 4 and all("scenario_id" in s["reward_info"] for s in rollouts)
