"""Step 2's checkers must not pass a broken game or overwrite their inputs: validate_game, calibrate_environment
and recalibrate on the toy games of tests/toy_games.py (each case once failed: a report written over the game's own
file, a missing target file or an oracle that loses at another knob value passing, a crash without a report, a band
flag without effect, rollouts trusted under the wrong knob value)."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import toy_games as toy
from game_registry import DifficultyKnob, GameSpec, Probe
from pipeline import calibrate_environment, recalibrate, validate_game

# -- helpers ------------------------------------------------------------------------------------------------------
GAME_FILE = '''"""A toy game whose make_env lives in its own file, as a capability_*_game.py does."""
import toy_games


def make_env(config=None):
    return toy_games.VaultGame(config)
'''


def own_file_game(tmp_path: Path, name: str) -> tuple[Path, GameSpec]:
    """(the game file, a spec whose make_env is defined there), imported the way game_registry imports game files."""
    path = tmp_path / f"capability_{name}_game.py"
    path.write_text(GAME_FILE)
    module_spec = importlib.util.spec_from_file_location(f"step2_{name}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return path, dataclasses.replace(toy.make_spec(name=name), make_env=module.make_env)


def target_file(tmp_path: Path) -> Path:
    path = tmp_path / "target_tools.json"
    path.write_text(json.dumps(toy.TARGET_TOOL_SCHEMAS))
    return path


def rollouts(tmp_path: Path, name: str, successes: int, info: dict, total: int = 10) -> str:
    """A τ²-bench results file with `successes` of `total` samples succeeding (groups of 2) and this `info`."""
    sims = [{"id": f"{name}-{i}", "task_id": i // 2, "sample_idx": i % 2,
             "reward_info": {"reward": 1.0 if i < successes else 0.0}} for i in range(total)]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"info": info, "tasks": [], "simulations": sims}))
    return str(path)


class ParityClassVault(toy.VaultGame):
    """Declares decision classes (the parity of the asked items' total), so validate_game runs class_prior."""

    def get_summary(self):
        summary = super().get_summary()
        summary["decision_class"] = ("even", "odd")[sum(self.items[i] for i in self.asked) % 2]
        return summary


ALWAYS_ZERO = Probe("always_submit_zero", "constant",
                    lambda texts: (lambda turn, game, rng: toy.tool_call_text("submit_total", {"total": 0})))


def class_prior_spec(game_cls: type) -> GameSpec:
    return toy.make_spec(game_cls, decision_classes=("even", "odd"), ablations=(ALWAYS_ZERO,),
                         difficulty_knobs=(DifficultyKnob("n_keys", "increase", (1, 3)),))


# -- finding 1: --json-output over the game's own files ----------------------------------------------------------
def test_validate_game_refuses_a_report_over_the_game_or_its_target(tmp_path, monkeypatch, capsys):
    game_file, spec = own_file_game(tmp_path, "own_file_vault")
    target = target_file(tmp_path)
    toy.register_temporarily(monkeypatch, dataclasses.replace(spec, target=str(target)))
    for path in (game_file, target):
        before = path.read_text()
        code = validate_game.main([spec.name, "--seeds", "2", "--fuzz-actions", "0", "--no-progress",
                                   "--json-output", str(path)])
        assert code == 2, path
        err = capsys.readouterr().err
        assert f"--json-output {path} is also the game's" in err and "write --json-output elsewhere" in err
        assert path.read_text() == before


def test_recalibrate_refuses_a_decision_over_the_game_file(tmp_path, monkeypatch, capsys):
    game_file, spec = own_file_game(tmp_path, "own_file_recal")
    toy.register_temporarily(monkeypatch, spec)
    before = game_file.read_text()
    code = recalibrate.main(["--game", spec.name, "--knob", "n_keys", "--rollouts",
                             f"2={rollouts(tmp_path, 'k2', 4, {})}", "--json-output", str(game_file)])
    assert code == 2
    assert "is also the game's source file" in capsys.readouterr().err
    assert game_file.read_text() == before


# -- finding 2: a target file that does not exist ----------------------------------------------------------------
def test_missing_target_file_fails_tool_schemas(tmp_path):
    for target in (str(tmp_path / "absent.json"), "configs/no_such_folder/tools"):
        report = validate_game.validate(toy.make_spec(target=target), seeds=5, fuzz_actions=0)
        check = report["checks"]["tool_schemas"]
        assert check["status"] == "FAIL" and not report["passed"], target
        assert f"target file {target} not found" in check["detail"] and "fix GameSpec.target" in check["detail"]


def test_unknown_target_benchmark_name_still_warns():
    report = validate_game.validate(toy.make_spec(target="no_such_benchmark"), seeds=5, fuzz_actions=0)
    assert report["checks"]["tool_schemas"]["status"] == "WARN" and report["passed"]


# -- findings 3 and 4: class_prior at other knob values ----------------------------------------------------------
class LosesAtThreeKeysVault(ParityClassVault):
    """The oracle adds one to the total once n_keys >= 3: the game cannot be won at that knob value."""

    def _oracle_total(self):
        return super()._oracle_total() + (self.config.n_keys >= 3)


def test_class_prior_fails_when_the_oracle_loses_at_another_knob_value():
    report = validate_game.validate(class_prior_spec(LosesAtThreeKeysVault), seeds=10, fuzz_actions=0,
                                    class_instances=40)
    assert report["checks"]["oracle"]["status"] == "PASS"  # as configured (n_keys=2) the oracle wins
    prior = report["checks"]["class_prior"]
    assert prior["status"] == "FAIL" and not report["passed"]
    assert "n_keys=3: oracle reward 1.0 on 0/10 seeds" in prior["detail"]
    assert "n_keys=1: oracle" not in prior["detail"]


class ToolsAfterResetVault(ParityClassVault):
    """Knows its write tools only once an instance is drawn (validate_game allows per-instance tool lists)."""

    def reset(self, seed):
        self._drawn = True
        return super().reset(seed)

    def write_tool_names(self):
        if not getattr(self, "_drawn", False):
            raise RuntimeError("call reset() first")
        return super().write_tool_names()


def test_class_prior_asks_tool_facts_of_a_reset_instance():
    report = validate_game.validate(class_prior_spec(ToolsAfterResetVault), seeds=10, fuzz_actions=0,
                                    class_instances=40)
    prior = report["checks"]["class_prior"]
    assert "call reset() first" not in prior["detail"]
    assert {row["setting"] for row in prior["settings"] if row["ablations"]} == {"n_keys=1", "n_keys=3"}


class NoToolFactsVault(ParityClassVault):
    """Its write_tool_names always raises: a game bug class_prior must report, not crash on."""

    def write_tool_names(self):
        raise RuntimeError("write tools unknown")


def test_class_prior_reports_a_game_that_raises_for_its_tool_facts():
    report = validate_game.validate(class_prior_spec(NoToolFactsVault), seeds=5, fuzz_actions=0, class_instances=40)
    prior = report["checks"]["class_prior"]
    assert prior["status"] == "FAIL"
    assert "n_keys=1: a fresh game raised while asked for its tool facts: RuntimeError: write tools unknown" in \
        prior["detail"]


# -- finding 5: --max-frac-constant alone ------------------------------------------------------------------------
# 3 groups: one informative, two constant (frac_constant 2/3, frac_informative 1/3); mean and success rate 0.5.
HAND = {"a": [0, 1, 0, 1], "b": [0, 0, 0, 0], "c": [1, 1, 1, 1]}
WIDE = ["--max-frac-all-success", "1", "--max-frac-all-zero", "1"]  # only the constant/informative pair decides


def hand_rollouts(tmp_path: Path) -> str:
    sims = [{"id": f"{t}-{i}", "task_id": t, "sample_idx": i, "reward_info": {"reward": float(r)}}
            for t, rewards in HAND.items() for i, r in enumerate(rewards)]
    path = tmp_path / "hand.json"
    path.write_text(json.dumps({"info": {}, "tasks": [], "simulations": sims}))
    return str(path)


def test_either_side_of_the_constant_informative_limit_works_alone(tmp_path, capsys):
    path = hand_rollouts(tmp_path)
    assert calibrate_environment.main([path, *WIDE]) == 1  # the default 0.5 limit
    assert calibrate_environment.main([path, *WIDE, "--max-frac-constant", "0.7"]) == 0
    assert calibrate_environment.main([path, *WIDE, "--min-informative-groups", "0.3"]) == 0
    assert calibrate_environment.main([path, *WIDE, "--max-frac-constant", "0.6"]) == 1
    out = capsys.readouterr().out
    assert "frac_informative = 0.3333 is below the minimum 0.4 (--min-frac-informative)" in out
    bands = calibrate_environment.Bands(max_frac_constant=0.7)
    assert bands.min_frac_informative == 1.0 - 0.7


def test_a_contradictory_constant_informative_pair_is_refused(tmp_path, capsys):
    out = tmp_path / "cal.json"
    assert calibrate_environment.main([hand_rollouts(tmp_path), "--max-frac-constant", "0.7",
                                       "--min-frac-informative", "0.5", "--json-output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "max_frac_constant (0.7) and min_frac_informative (0.5) disagree" in err and "give only one" in err
    assert not out.exists()
    assert calibrate_environment.main([hand_rollouts(tmp_path), *WIDE, "--max-frac-constant", "0.7",
                                       "--min-frac-informative", "0.3"]) == 0  # the same limit twice


# -- finding 6: rollouts recorded at another knob value ----------------------------------------------------------
def test_recalibrate_refuses_rollouts_recorded_at_another_knob_value(tmp_path, monkeypatch, capsys):
    toy.register_temporarily(monkeypatch, toy.make_spec(name="toy_vault_recorded"))
    game = ["--game", "toy_vault_recorded", "--knob", "n_keys", "--rollouts"]
    hard = rollouts(tmp_path, "hard", 1, {"game": "toy_vault_recorded", "game_overrides": {"n_keys": 8}})
    easy = rollouts(tmp_path, "easy", 9, {"game": "toy_vault_recorded", "game_overrides": {"n_keys": 1}})
    out = tmp_path / "decision.json"
    assert recalibrate.main([*game, f"1={hard}", f"8={easy}", "--json-output", str(out)]) == 2  # labels swapped
    assert (f"{hard}: rollouts played with n_keys=8 (info.game_overrides), but --rollouts gives them as n_keys=1; "
            f"pass them as 8={hard}") in capsys.readouterr().err
    assert not out.exists()
    default = rollouts(tmp_path, "default", 5, {"game": "toy_vault_recorded", "game_overrides": {}})
    assert recalibrate.main([*game, f"3={default}"]) == 2  # no override: played at VaultConfig's n_keys=2
    assert "n_keys=2 (the config's default" in capsys.readouterr().err
    assert recalibrate.main([*game, f"1={easy}", f"8={hard}", f"2={default}"]) == 0  # labelled right: decided
    assert "IN_BAND: use 2" in capsys.readouterr().out


def test_recalibrate_words_a_disagreement_as_the_declared_direction(tmp_path, monkeypatch, capsys):
    toy.register_temporarily(monkeypatch, toy.make_spec(name="toy_vault_direction"))
    # n_keys is declared harder as it increases; these (unrecorded) files say the opposite. No --harder given.
    assert recalibrate.main(["--game", "toy_vault_direction", "--knob", "n_keys", "--rollouts",
                             f"1={rollouts(tmp_path, 'k1', 1, {})}", f"8={rollouts(tmp_path, 'k8', 9, {})}"]) == 0
    out = capsys.readouterr().out
    assert ("WARN  the declared direction (harder as the knob increases) disagrees with the measurements, which get "
            "harder as it decreases") in out
    assert "--harder" not in out
