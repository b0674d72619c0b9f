"""AST mutations keep the oracle fixing the bug; the calibration loop mutates A/B/C/A/B and resumes."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from game_registry import REPO_ROOT
from swebench.calibrate import CalibrationConfig, calibrate
from swebench.generators import generate_one
from swebench.game import make_spec
from swebench.mutations import PRIMITIVES, ROUND_ORDER, SCHEDULES, apply_primitives, buggy_functions, \
    mutate_round, mutate_rounds, _pair_of
from swebench.sandbox import SandboxConfig
from swebench.scenario import Scenario, load_scenarios
from swebench.selftest import self_test_many

SANDBOX = SandboxConfig(timeout_s=20)
ISSUE_TEXT_PRIMITIVES = ("misleading_symptom",)


def source_changes(before: Scenario, after: Scenario) -> list[str]:
    return sorted(p for p in set(before.files) | set(after.files) if before.files.get(p) != after.files.get(p))


@pytest.mark.parametrize("name", sorted(PRIMITIVES))
def test_each_primitive_changes_the_code_but_not_the_tests(name):
    applied = 0
    for capability, seed in (("semantic_logic_precision", 1), ("semantic_logic_precision", 6),
                             ("deep_call_graph_traversal", 2)):
        scenario = generate_one(capability, seed)
        mutated = apply_primitives(scenario, (name,), "t")
        record = mutated.metadata["mutations"][-1]
        if record["skipped"]:
            continue
        applied += 1
        changed = source_changes(scenario, mutated)
        assert all(mutated.files[p] == scenario.files[p] for p in scenario.all_test_files())
        assert mutated.target_test == scenario.target_test
        if name in ISSUE_TEXT_PRIMITIVES:  # rewrites the issue, not the code
            assert changed == [] and mutated.problem_statement != scenario.problem_statement
            continue
        assert changed and not set(changed) & set(scenario.all_test_files()), name
        assert mutated.problem_statement == scenario.problem_statement
        for path in mutated.files:
            ast.parse(mutated.files[path])
        if name in ("extend_call_graph", "wrap_in_class_hierarchy"):  # the bug itself moves
            assert mutated.oracle_patch != scenario.oracle_patch
    assert applied >= 2, f"{name} applied to fewer than two of the sample scenarios"


def test_mutations_are_deterministic_and_follow_the_schedule():
    scenario = generate_one("deep_call_graph_traversal", 5)
    once, again = mutate_rounds(scenario, 5), mutate_rounds(scenario, 5)
    assert once.to_dict() == again.to_dict()
    assert [m["strategy"] for m in once.metadata["mutations"]] == list(ROUND_ORDER)
    first = once.metadata["mutations"][0]
    assert [a["name"] for a in first["applied"]] == list(SCHEDULES["deep_call_graph_traversal"]["A"])
    with pytest.raises(ValueError, match="round_index must be within 0..4"):
        mutate_round(scenario, 5)
    with pytest.raises(ValueError, match="unknown mutation"):
        apply_primitives(scenario, ("shuffle_lines",), "t")


def test_extend_and_wrap_move_the_bug_deeper():
    scenario = generate_one("deep_call_graph_traversal", 9, call_depth=3)
    before = {path for path, _ in buggy_functions(_pair_of(scenario))}
    extended = apply_primitives(scenario, ("extend_call_graph",), "t")
    moved = {path for path, _ in buggy_functions(_pair_of(extended))}
    assert moved != before and len(extended.files) == len(scenario.files) + 1
    wrapped = apply_primitives(scenario, ("wrap_in_class_hierarchy",), "t")
    assert "class " in wrapped.fixed_files()[next(iter(before))]


@pytest.mark.slow  # ~6 s of sandboxed pytest runs
def test_mutated_scenarios_pass_the_self_test():
    """Every primitive alone and five A/B/C/A/B rounds: the oracle still fixes it, the target still fails."""
    scenarios = []
    for capability, seed in (("semantic_logic_precision", 3), ("deep_call_graph_traversal", 4)):
        base = generate_one(capability, seed)
        scenarios += [apply_primitives(base, (name,), "t") for name in sorted(PRIMITIVES)]
        scenarios.append(mutate_rounds(base, 5))
    results = self_test_many(scenarios, SANDBOX, workers=2, progress=False)
    failures = [(s.id, s.metadata["mutations"][-1]["strategy"], r.reason) for s, r in zip(scenarios, results)
                if not r.ok]
    assert failures == []


@pytest.mark.slow
@pytest.mark.parametrize("capability", ["semantic_logic_precision", "deep_call_graph_traversal"])
def test_many_mutated_scenarios_pass_the_self_test(capability):
    scenarios = [mutate_rounds(generate_one(capability, seed), 1 + seed % 5) for seed in range(30)]
    results = self_test_many(scenarios, SANDBOX, workers=2, progress=False)
    assert [(s.id, r.reason) for s, r in zip(scenarios, results) if not r.ok] == []


def test_the_game_plays_mutated_scenarios():
    spec = make_spec("deep_call_graph_traversal")
    game = spec.make(mutation_rounds=3)
    game.reset(8)
    assert len(game.workspace.scenario.metadata["mutations"]) == 3
    while not game.done:
        game.step(spec.extract_action(game.oracle_response()))
    assert game.get_summary()["reward"] == 1.0


# --------------------------------------------------------------------------------------------------
# Calibration loop
# --------------------------------------------------------------------------------------------------
class ScriptedModel:
    """Success rates by scenario: seed 0 is hard at once, seed 1 after one mutation, seed 2 never."""

    def __init__(self, fail_at_round: int | None = None):
        self.calls: list[int] = []
        self.fail_at_round = fail_at_round

    def __call__(self, scenarios_file: Path, count: int, round_index: int) -> list[float]:
        if round_index == self.fail_at_round:
            raise KeyboardInterrupt("interrupted")
        self.calls.append(round_index)
        scenarios = load_scenarios(scenarios_file)
        assert len(scenarios) == count
        rates = []
        for scenario in scenarios:
            mutations = len(scenario.metadata["mutations"])
            rates.append({0: 0.2, 1: 1.0 if mutations < 1 else 0.4}.get(scenario.seed, 0.9))
        return rates


def test_calibration_accepts_mutates_and_rejects(tmp_path):
    config = CalibrationConfig("semantic_logic_precision", target=2, candidates=3, samples=10, rounds=2,
                               sandbox=SANDBOX)
    model = ScriptedModel()
    state = calibrate(config, model, tmp_path, log=lambda _: None)
    accepted = {s["id"]: len(s["metadata"]["mutations"]) for s in state["accepted"]}
    assert accepted == {"semantic_logic_precision_0000": 0, "semantic_logic_precision_0001": 1}
    assert model.calls == [0, 1]  # stopped once the target was reached
    report = json.loads((tmp_path / "calibration.json").read_text())
    assert report["errors"] == [] and report["metrics"]["success_rate_per_round"]["semantic_logic_precision_0001"] == [1.0, 0.4]
    assert "mutate with A" in (tmp_path / "calibration_log.md").read_text()


@pytest.mark.slow  # ~3 s: calibration run twice (resume)
def test_calibration_gives_up_after_the_last_round_and_resumes(tmp_path):
    config = CalibrationConfig("semantic_logic_precision", target=3, candidates=3, samples=10, rounds=2,
                               sandbox=SANDBOX)
    with pytest.raises(KeyboardInterrupt):
        calibrate(config, ScriptedModel(fail_at_round=1), tmp_path, log=lambda _: None)
    resumed_model = ScriptedModel()
    state = calibrate(config, resumed_model, tmp_path, log=lambda _: None)
    assert resumed_model.calls == [1, 2]  # round 0 was done before the interruption
    assert "still too easy after 2 mutation rounds" in state["rejected"]["semantic_logic_precision_0002"]
    assert len(state["accepted"]) == 2
    report = json.loads((tmp_path / "calibration.json").read_text())
    assert report["errors"] == ["only 2 of 3 scenarios accepted (success rate <= 0.5)"]
    other = CalibrationConfig("semantic_logic_precision", target=3, candidates=4, sandbox=SANDBOX)
    with pytest.raises(Exception, match="written with other settings"):
        calibrate(other, ScriptedModel(), tmp_path, log=lambda _: None)


def test_calibration_config_validates():
    with pytest.raises(ValueError, match="candidates .* must be >= target"):
        CalibrationConfig("semantic_logic_precision", target=5, candidates=2)
    with pytest.raises(ValueError, match="rounds must be <= 5"):
        CalibrationConfig("semantic_logic_precision", rounds=6)
    with pytest.raises(ValueError, match="capability must be one of"):
        CalibrationConfig("nope")


@pytest.mark.slow
def test_calibrate_cli_with_the_tiny_model(tiny_model_dir, tmp_path):
    out = tmp_path / "accepted.json"
    done = subprocess.run([sys.executable, "-m", "swebench.calibrate", "--capability",
                           "semantic_logic_precision", "--model", str(tiny_model_dir), "--target", "2", "--candidates",
                           "2", "--samples", "2", "--max-episode-tokens", "3000", "--work-dir", str(tmp_path / "work"),
                           "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(load_scenarios(out)) == 2  # a random tiny model solves nothing: accepted at round 0
    assert (tmp_path / "work" / "round_0_rollouts.json").is_file()
    bad = subprocess.run([sys.executable, "-m", "swebench.calibrate", "--capability",
                          "semantic_logic_precision", "--model", str(tmp_path / "missing"), "--work-dir",
                          str(tmp_path / "w2"), "--out", str(tmp_path / "o.json")], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert bad.returncode == 2 and "cannot load model" in bad.stderr
