"""pipeline/validate_game.py on a correct toy game and on toy games that each break one rule."""
from __future__ import annotations

import json
import math

import pytest

import toy_games as toy
from game_registry import Action, parse_hermes_action
from pipeline.validate_game import main, reward_problem, validate

SEEDS = 40  # enough for every check; keeps each validation well under a second


def test_default_parser_survives_pathological_nesting():
    action = parse_hermes_action("<tool_call>" + "[" * 5000 + "]" * 5000 + "</tool_call>")
    assert action.kind == "malformed"


def failed(report: dict) -> set[str]:
    return {name for name, check in report["checks"].items() if check["status"] == "FAIL"}


@pytest.fixture
def target_file(tmp_path):
    path = tmp_path / "target_tools.json"
    path.write_text(json.dumps(toy.TARGET_TOOL_SCHEMAS))
    return str(path)


def test_good_game_passes(target_file):
    report = validate(toy.make_spec(target=target_file), seeds=SEEDS, fuzz_actions=400)
    assert failed(report) == set(), report["failures"]
    assert report["passed"] and report["failures"] == [] and report["warnings"] == []
    checks = report["checks"]
    assert set(checks) == {"oracle", "baselines", "probes", "determinism", "fuzz", "rewards", "protocol",
                           "tool_schemas"}
    assert checks["oracle"]["success_rate"] == 1.0
    assert checks["baselines"]["do_nothing_mean_reward"] == 0.0
    assert checks["baselines"]["random_tool_mean_reward"] < 0.5
    assert checks["determinism"]["distinct_initial_share"] == 1.0


@pytest.mark.parametrize(
    "game_cls, expected",
    [
        (toy.NondeterministicVault, {"determinism"}),
        (toy.SeedBlindVault, {"determinism"}),
        (toy.OutOfBoundsVault, {"rewards"}),
        (toy.WrongOracleVault, {"oracle"}),
        (toy.GenerousVault, {"baselines", "probes"}),  # do_nothing wins too
        (toy.AnyTotalVault, {"baselines", "probes"}),  # the right total without lookups wins too
        (toy.RenamedToolVault, {"tool_schemas"}),
        (toy.BadSummaryVault, {"protocol"}),
    ],
)
def test_broken_game_fails_the_right_check(game_cls, expected, target_file):
    report = validate(toy.make_spec(game_cls, target=target_file), seeds=SEEDS, fuzz_actions=0)
    assert failed(report) == expected, report["failures"]
    assert not report["passed"]
    assert [f.split(":")[0] for f in report["failures"]] == sorted(expected, key=list(report["checks"]).index)


def test_details_say_what_broke(target_file):
    nondeterministic = validate(toy.make_spec(toy.NondeterministicVault), seeds=10, fuzz_actions=0)
    assert "initial messages differ" in nondeterministic["checks"]["determinism"]["detail"]
    blind = validate(toy.make_spec(toy.SeedBlindVault), seeds=10, fuzz_actions=0)
    assert blind["checks"]["determinism"]["distinct_initial_share"] == pytest.approx(0.1)
    bounds = validate(toy.make_spec(toy.OutOfBoundsVault), seeds=10, fuzz_actions=0)
    assert "-0.1 is outside [0, 1]" in bounds["checks"]["rewards"]["detail"]
    renamed = validate(toy.make_spec(toy.RenamedToolVault, target=target_file), seeds=5, fuzz_actions=0)
    assert "'submit_sum' is not in the target" in renamed["checks"]["tool_schemas"]["detail"]
    generous = validate(toy.make_spec(toy.GenerousVault), seeds=10, fuzz_actions=0)
    assert generous["checks"]["baselines"]["do_nothing_mean_reward"] == 1.0
    any_total = validate(toy.make_spec(toy.AnyTotalVault), seeds=20, fuzz_actions=0)["checks"]["baselines"]
    assert any_total["random_tool_mean_reward"] >= 0.5 and any_total["do_nothing_mean_reward"] == 0.0


def test_game_that_raises_on_garbage_fails_fuzz():
    report = validate(toy.make_spec(toy.FragileVault), seeds=SEEDS, fuzz_actions=300)
    fuzz = report["checks"]["fuzz"]
    assert fuzz["status"] == "FAIL" and fuzz["step_errors"] > 0
    assert "IndexError" in fuzz["detail"]


def test_extract_action_that_raises_fails_fuzz():
    def fragile_parser(text: str) -> Action:
        if len(text) > 10_000:
            raise MemoryError("too long")  # a parser bug the fuzz's 100k-character inputs must expose
        return parse_hermes_action(text)

    report = validate(toy.make_spec(extract_action=fragile_parser), seeds=SEEDS, fuzz_actions=300)
    fuzz = report["checks"]["fuzz"]
    assert fuzz["status"] == "FAIL" and fuzz["extract_errors"] > 0
    assert "MemoryError" in fuzz["detail"]


def test_tool_schema_differing_from_target_fails(tmp_path):
    schemas = json.loads(json.dumps(toy.TARGET_TOOL_SCHEMAS))
    schemas[0]["function"]["description"] = "Something else."
    path = tmp_path / "target.json"
    path.write_text(json.dumps(schemas))
    report = validate(toy.make_spec(target=str(path)), seeds=5, fuzz_actions=0)
    assert "'lookup_item' differs" in report["checks"]["tool_schemas"]["detail"]


def test_target_by_registered_name(monkeypatch):
    target_spec = toy.make_spec(toy.VaultGame, name="toy_vault_target")
    toy.register_temporarily(monkeypatch, target_spec)
    assert validate(toy.make_spec(target="toy_vault_target"), seeds=5, fuzz_actions=0)["checks"]["tool_schemas"][
        "status"] == "PASS"
    renamed = validate(toy.make_spec(toy.RenamedToolVault, target="toy_vault_target"), seeds=5, fuzz_actions=0)
    assert renamed["checks"]["tool_schemas"]["status"] == "FAIL"


def test_missing_target_is_a_warning():
    # No target, or a benchmark name not registered here; a target *file* that is missing fails instead
    # (test_step2_reliability.py).
    for target in ("", "no_such_benchmark"):
        report = validate(toy.make_spec(target=target), seeds=5, fuzz_actions=0)
        assert report["checks"]["tool_schemas"]["status"] == "WARN"
        assert report["passed"] and len(report["warnings"]) == 1


def test_reward_problem():
    assert reward_problem(0.0) is None and reward_problem(1.0) is None and reward_problem(0.25) is None
    for bad in (True, False, None, 1, math.nan, math.inf, -0.01, 1.01, "1.0"):
        assert reward_problem(bad) is not None, bad


def test_cli(monkeypatch, tmp_path, capsys):
    toy.register_temporarily(monkeypatch, toy.make_spec(name="toy_vault_cli"))
    out = tmp_path / "validate.json"
    code = main(["toy_vault_cli", "--seeds", "10", "--fuzz-actions", "0", "--json-output", str(out), "--no-progress"])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["game"] == "toy_vault_cli" and report["passed"]
    stdout = capsys.readouterr().out
    assert "PASS  oracle" in stdout and "RESULT: PASS" in stdout

    toy.register_temporarily(monkeypatch, toy.make_spec(toy.WrongOracleVault, name="toy_vault_cli_bad"))
    assert main(["toy_vault_cli_bad", "--seeds", "10", "--fuzz-actions", "0", "--no-progress"]) == 1
    assert "FAIL  oracle" in capsys.readouterr().out

    missing = tmp_path / "nothing.json"
    assert main(["no_such_game", "--json-output", str(missing)]) == 2
    assert "unknown game 'no_such_game'" in capsys.readouterr().err
    assert main(["toy_vault_cli", "--seeds", "0", "--json-output", str(missing)]) == 2
    assert not missing.exists()


def test_cli_validates_the_game_with_its_overrides(tmp_path, capsys):
    """--game-overrides builds every episode's game with those config fields (the surface Step 2 trains on);
    a field the game's config rejects exits 2 before any episode."""
    out = tmp_path / "validate.json"
    surface = '{"storefront": "configs/storefront/cpu_demo.yaml", "violating_fraction": 1.0}'
    assert main(["capability_precondition_verification", "--seeds", "12", "--fuzz-actions", "0", "--no-progress",
                 "--json-output", str(out), "--game-overrides", surface]) == 1
    report = json.loads(out.read_text())
    probes = report["checks"]["probes"]["probes"]
    # Every request was refused (violating_fraction 1.0): no write, so no confirmation question to probe, and
    # the constant refuser is the oracle on every seed (its skill never matters: n/a); the game fails on its
    # classes instead (refusing needs no skill at this setting: one class holds every instance).
    assert probes["blanket_confirmation"]["applicable_seeds"] == 0
    assert probes["always_refuse"]["success_rate"] == 1.0 and probes["always_refuse"]["status"] == "n/a"
    assert [name for name, row in probes.items() if row["status"] == "FAIL"] == []
    prior = report["checks"]["class_prior"]
    assert prior["status"] == "FAIL" and "refuse 1.00" in prior["detail"]
    for bad in ('{"violating_fraction": 2}', '{"no_such_field": 1}', "[1]", "{not json"):
        missing = tmp_path / "nothing.json"
        assert main(["capability_precondition_verification", "--game-overrides", bad, "--json-output",
                     str(missing)]) == 2, bad
        assert "--game-overrides" in capsys.readouterr().err and not missing.exists()


class CrashOnWinVault(toy.VaultGame):
    """Raises when the oracle submits the right total on seed 0: a crash, not an unwinnable seed."""

    def reset(self, seed):
        self._seed = seed
        return super().reset(seed)

    def _run_tool(self, name, arguments):
        if name == "submit_total" and self._seed == 0 and arguments.get("total") == self._oracle_total():
            raise RuntimeError("boom on the winning move")
        return super()._run_tool(name, arguments)


def test_oracle_that_raises_fails_even_within_the_success_tolerance():
    # 39/40 wins clears oracle_min_success=0.9; the crash on seed 0 must still fail the check.
    report = validate(toy.make_spec(CrashOnWinVault), seeds=SEEDS, fuzz_actions=0, oracle_min_success=0.9)
    assert report["checks"]["oracle"]["success_rate"] == pytest.approx(39 / 40)
    assert report["checks"]["oracle"]["status"] == "FAIL"
    assert "boom on the winning move" in report["checks"]["oracle"]["detail"]
